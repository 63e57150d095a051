"""Proposers used directly, without reset() between requests: a new context
that happens to share a token with the previous one is not its continuation."""

from __future__ import annotations

import pytest

from specviz.methods.ngram_gpu.proposer import NgramGPUProposer

REQUEST_A = [5, 20, 21, 22, 30, 31, 9]
# B's 7th token equals A's last token (the old check compared only that one), and B's last token 5
# occurs in A but nowhere earlier in B: a continuation of A would draft A's 20, 21, 22
REQUEST_B = [40, 41, 42, 43, 44, 45, 9, 5]


def _draft(p, ids):
    d = p.propose(ids)
    return d.token_ids.tolist(), d.details


def test_ngram_gpu_never_drafts_from_a_previous_request():
    reused = NgramGPUProposer(1, 3, 3)
    _draft(reused, REQUEST_A)
    got, details = _draft(reused, REQUEST_B)
    want, want_details = _draft(NgramGPUProposer(1, 3, 3), REQUEST_B)
    assert want == [] and got == want
    assert details == want_details


@pytest.mark.parametrize("second", ([5, 20, 21, 22, 30, 31, 9, 5, 20], [5, 20, 21], [1, 5, 20, 21, 22, 30, 31, 9, 5]))
def test_ngram_gpu_reuse_equals_a_fresh_proposer(second):
    """A true continuation (first case) reuses the buffer; a shorter or shifted context is
    rewritten; every draft equals a fresh proposer's."""
    reused = NgramGPUProposer(1, 3, 3)
    _draft(reused, REQUEST_A)
    assert _draft(reused, second) == _draft(NgramGPUProposer(1, 3, 3), second)
