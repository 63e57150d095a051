"""ngram_gpu with ``pad=True`` (the engine's on CUDA when ``PAD_ON_CUDA`` is set): the draft stays
padded to k with -1 on the device, the target verifies k + 1 positions, the sampler takes k' from
the first -1, and the match details are filled by observe after the step's wait. On the CPU
(reference matcher and sampler) the run must equal the unpadded one: tokens, drafts, acceptances,
fates and match details (greedy), and records that never show the padding (sampling)."""

from __future__ import annotations

import pytest
import torch

from specviz import SpecDecoder
from specviz.proposer import Outcome
from specviz.methods.ngram_gpu.proposer import NgramGPUProposer

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a"
LOOKUP = dict(prompt_lookup_min=1, prompt_lookup_max=3)


@pytest.fixture(scope="module")
def decoder(tiny_dirs):
    target, _ = tiny_dirs["llama"]
    return SpecDecoder.from_pretrained(target, device="cpu", dtype="float32")


def _run(dec, pad: bool, prompt=PROMPT, **kw):
    make = dec.make_proposer

    def padded(cfg, **extras):
        return NgramGPUProposer(cfg.options.prompt_lookup_min, cfg.options.prompt_lookup_max, cfg.num_speculative_tokens,
                                pad=pad)

    dec.make_proposer = padded
    try:
        return dec.generate(prompt, method="ngram_gpu", num_speculative_tokens=4, max_new_tokens=40, **LOOKUP, **kw)
    finally:
        dec.make_proposer = make


def test_padded_greedy_run_equals_the_unpadded_one(decoder):
    want, got = _run(decoder, False), _run(decoder, True)
    plain = decoder.generate(PROMPT, method="none", max_new_tokens=40)
    assert got.output_token_ids == want.output_token_ids == plain.output_token_ids
    assert len(got.steps) == len(want.steps)
    short = 0
    for g, w in zip(got.steps, want.steps):
        assert g.draft_token_ids == w.draft_token_ids and -1 not in g.draft_token_ids
        assert (g.num_accepted, g.emitted.kind, g.emitted.token_id) == (w.num_accepted, w.emitted.kind, w.emitted.token_id)
        assert [p.token_id for p in g.positions] == [p.token_id for p in w.positions]
        assert g.match == w.match  # filled by observe, after the step's wait
        short += len(w.draft_token_ids) < 4
    assert short > 0  # some steps drafted fewer than k tokens (the padding was exercised)
    assert any(not s.draft_token_ids for s in got.steps)  # k' = 0: all padding, the target's own token
    assert got.metrics["mean_acceptance_length"] == want.metrics["mean_acceptance_length"]


@pytest.mark.parametrize("verify", ("standard", "block", "synthetic"))
def test_padded_sampled_records_hide_the_padding(decoder, verify):
    """T > 0: the noise of padded slots is drawn too, so the trajectory differs from the unpadded run;
    every record still describes only the k' real drafts, and a step that accepts all k' < k ends with a
    bonus from p_{k'+1} (synthetic rates 1: every real draft accepted, the padding never)."""
    extra = dict(synthetic_rates=[1.0] * 4) if verify == "synthetic" else {}
    # the last token (44) occurs once before, 2 tokens from the end: the first draft is [45, 44], k' = 2 < k
    prompt = [40, 41, 42, 43, 44, 45, 44] if verify == "synthetic" else PROMPT
    tr = _run(decoder, True, prompt, verify=verify, temperature=1.0, seed=3, **extra)
    full = 0
    for s in tr.steps:
        k = len(s.draft_token_ids)
        assert -1 not in s.draft_token_ids and len(s.positions) == k and s.num_accepted <= k
        assert s.emitted.kind == ("target" if k == 0 else "bonus" if s.num_accepted == k else "recovered")
        if verify == "block" and k:
            assert all(len(v) == k for name, v in s.block.items() if name != "tau")
        full += 0 < k == s.num_accepted < 4
        if k:  # filled in by observe (steps with no room to draft have the engine's own details)
            assert s.match["n"] >= 1 and s.match["occurrences"] == [s.match["match_position"]]
    assert full > 0 or verify != "synthetic"


def test_propose_keeps_k_prime_on_the_device_until_observe():
    p = NgramGPUProposer(3, 3, 4, pad=True)
    ctx = [1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3]
    d = p.propose(ctx, 4)
    assert d.token_ids.tolist() == [100, 1, 2, 3] and d.details == {"kind": "ngram_gpu", "backend": "reference"}
    p.observe(Outcome(len(ctx) - 1, [100, 1, 2, 3], 4, [100, 1, 2, 3, 7]))
    assert (d.details["n"], d.details["match_position"], d.details["suffix"]) == (3, 0, [1, 2, 3])
    none = p.propose([9, 8, 7, 6], 3)
    assert none.token_ids.tolist() == [-1, -1, -1]  # no match: k' = 0, all padding
    p.observe(Outcome(3, [], 0, [5]))
    assert none.details["n"] == 0 and none.details["occurrences"] == [] and none.details["suffix_start"] == 4
    assert NgramGPUProposer(3, 3, 4).propose(ctx, 2).token_ids.tolist() == [100, 1]  # pad=False: cut on the host
