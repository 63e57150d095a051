"""Batched n-gram matcher: golden cases (docs/design/algorithms.md), reference == brute force, and
Triton (specviz/kernels/ngram_matcher.py) == reference on random contexts; the proposer wrapper.

Devices as in tests/test_kernels_sampler.py: "cpu" runs the Triton kernels under the interpreter
in a child pytest (TRITON_INTERPRET=1), "cuda" runs them compiled when a GPU is present.
"""

from __future__ import annotations

import random

import pytest
import torch

from kernel_testing import DEVICES, interpreter_subprocess
from specviz.proposer import Proposer
from specviz.methods.ngram_gpu.proposer import NgramGPUProposer, ngram_match_reference, resolve_lookup_bounds

GOLDEN = [  # (context, min, max, k) -> draft
    ([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4], 3, 4, 2, [1, 2]),
    ([1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3], 3, 3, 2, [100, 1]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 1, 1, 2, [6, 2]),
    ([1, 2, 3, 4, 5, 6], 1, 3, 4, []),  # no match
    ([1, 2, 3, 4, 2, 3], 2, 3, 4, [4, 2, 3]),  # vLLM's docstring example: partial draft into the suffix
    ([7, 7, 7], 1, 2, 5, [7]),  # the continuation runs into the suffix itself
    ([5], 1, 1, 3, []),  # too short
]


def test_interpreter_subprocess():
    """Run this file's "cpu" cases under the interpreter in a child process."""
    interpreter_subprocess(__file__)


def _brute_force(ctx: list[int], n_min: int, n_max: int, k: int) -> tuple[list[int], int, int]:
    """(draft, n, start): the longest n with an earlier occurrence, its earliest start."""
    L = len(ctx)
    for n in range(n_max, n_min - 1, -1):
        for s in range(0, L - n):  # starts 0..L-n-1: never the suffix itself
            if ctx[s : s + n] == ctx[L - n :]:
                return ctx[s + n : s + n + k], n, s
    return [], 0, -1


def _batch(contexts: list[list[int]], pad: int = 0, dtype=torch.int64, device="cpu"):
    L = max([len(c) for c in contexts] + [1])
    ids = torch.full((len(contexts), L), pad, dtype=dtype)
    for i, c in enumerate(contexts):
        ids[i, : len(c)] = torch.tensor(c, dtype=dtype)
    return ids.to(device), torch.tensor([len(c) for c in contexts], device=device)


def _check(match, expected):
    """expected: list of (draft, n, start) per row."""
    for row, (draft, n, start) in enumerate(expected):
        got = match.draft_token_ids[row].tolist()
        k = len(got)
        assert got == draft + [-1] * (k - len(draft)), (row, got, draft)
        assert int(match.num_draft[row]) == len(draft)
        assert int(match.ngram_len[row]) == n and int(match.match_position[row]) == start, row


def _random_contexts(rng: random.Random, rows: int, max_len: int, vocab: int) -> list[list[int]]:
    out = []
    for _ in range(rows):
        L = rng.randint(0, max_len)
        ctx = [rng.randrange(vocab) for _ in range(L)]
        if L > 8 and rng.random() < 0.7:  # plant a repeat of the suffix
            n = rng.randint(1, min(6, L // 2))
            s = rng.randrange(0, L - 2 * n + 1)
            ctx[s : s + n] = ctx[L - n :]
        out.append(ctx)
    return out


@pytest.mark.parametrize("case", GOLDEN, ids=lambda c: str(c[1:]))
def test_reference_golden(case):
    ctx, n_min, n_max, k, draft = case
    m = ngram_match_reference(*_batch([ctx]), prompt_lookup_min=n_min, prompt_lookup_max=n_max, num_speculative_tokens=k)
    assert m.draft_token_ids[0, : len(draft)].tolist() == draft and int(m.num_draft[0]) == len(draft)
    assert (m.draft_token_ids[0, len(draft) :] == -1).all()


def test_reference_equals_brute_force():
    rng = random.Random(0)
    for n_min, n_max, k in [(1, 1, 3), (2, 4, 5), (3, 5, 2), (1, 6, 8)]:
        ctxs = _random_contexts(rng, 40, 60, 4)
        m = ngram_match_reference(*_batch(ctxs, pad=2), prompt_lookup_min=n_min, prompt_lookup_max=n_max, num_speculative_tokens=k)
        _check(m, [_brute_force(c, n_min, n_max, k) for c in ctxs])


@pytest.mark.parametrize("device", DEVICES)
def test_triton_golden(device):
    from specviz.kernels.ngram_matcher import ngram_match_triton

    for ctx, n_min, n_max, k, draft in GOLDEN:
        m = ngram_match_triton(
            *_batch([ctx], device=device), prompt_lookup_min=n_min, prompt_lookup_max=n_max, num_speculative_tokens=k
        )
        _check(m, [_brute_force(ctx, n_min, n_max, k)])
        assert m.draft_token_ids[0, : len(draft)].tolist() == draft


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=["i32", "i64"])
def test_triton_equals_reference(device, dtype):
    """Random batches (ragged lengths incl. 0, padding that collides with real tokens, a context
    longer than one kernel chunk), several n ranges and k."""
    from specviz.kernels.ngram_matcher import ngram_match_triton

    rng = random.Random(1)
    for n_min, n_max, k in [(1, 1, 3), (2, 4, 5), (3, 5, 2), (1, 6, 8), (5, 5, 0)]:
        ctxs = _random_contexts(rng, 12, 300, 5) + [list(range(9000))[::-1] + [8999, 8998, 8997, 8996, 8995]]
        ids, lengths = _batch(ctxs, pad=1, dtype=dtype, device=device)
        kw = dict(prompt_lookup_min=n_min, prompt_lookup_max=n_max, num_speculative_tokens=k)
        ref, tri = ngram_match_reference(ids, lengths, **kw), ngram_match_triton(ids, lengths, **kw)
        for a, b in zip(ref, tri):
            assert a.dtype == b.dtype == torch.int64 and torch.equal(a, b)
        _check(tri, [_brute_force(c, n_min, n_max, k) for c in ctxs])


@pytest.mark.parametrize("device", DEVICES)
def test_proposer_triton_backend(device):
    p = NgramGPUProposer(prompt_lookup_min=2, prompt_lookup_max=4, num_speculative_tokens=2, backend="triton", device=device)
    d = p.propose([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4])
    assert d.token_ids.tolist() == [1, 2]
    assert (d.details["backend"], d.details["n"], d.details["match_position"]) == ("triton", 4, 4)


def test_proposer_protocol_and_defaults():
    p = NgramGPUProposer()
    assert isinstance(p, Proposer) and p.name == "ngram_gpu" and p.num_speculative_tokens == 5
    assert (p.prompt_lookup_min, p.prompt_lookup_max) == (5, 5)
    assert resolve_lookup_bounds(3, None) == (3, 3) and resolve_lookup_bounds(None, 4) == (4, 4)
    with pytest.raises(ValueError):
        NgramGPUProposer(prompt_lookup_min=4, prompt_lookup_max=2)
    with pytest.raises(ValueError):
        NgramGPUProposer(backend="cuda-magic")
    q = NgramGPUProposer(prompt_lookup_min=3, prompt_lookup_max=3, num_speculative_tokens=4)
    d = q.propose([1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3], num_tokens=2)
    assert d.token_ids.dtype == torch.int64 and d.token_ids.tolist() == [100, 1] and d.probs is None
    assert d.details == {"kind": "ngram_gpu", "backend": "reference", "n": 3, "match_position": 0, "suffix": [1, 2, 3],
                         "suffix_start": 12, "occurrences": [0], "prompt_lookup_min": 3, "prompt_lookup_max": 3}
    none = q.propose([1, 2, 3, 4, 5])
    assert len(none) == 0 and none.details["n"] == 0 and none.details["match_position"] == -1
    assert none.details["occurrences"] == [] and none.details["suffix_start"] == 5


def test_proposer_device_context_follows_the_committed_tokens():
    """The device buffer grows by the new tokens only, and is rewritten when the context is not a
    continuation (a new request without reset, or a shorter context); drafts always equal a
    fresh proposer's and the CPU NgramProposer's."""
    from specviz.methods.ngram.proposer import NgramProposer

    rng = random.Random(3)
    p = NgramGPUProposer(prompt_lookup_min=1, prompt_lookup_max=3, num_speculative_tokens=4)
    cpu = NgramProposer(1, 3, 4)
    ctx = [rng.randrange(6) for _ in range(40)]
    for step in range(60):
        if step == 30:
            ctx = ctx[:25] + [7, 7, 7]  # rolled back and changed: not a continuation
        ctx = ctx + [rng.randrange(6) for _ in range(rng.randrange(1, 4))]
        got = p.propose(ctx)
        fresh = NgramGPUProposer(prompt_lookup_min=1, prompt_lookup_max=3, num_speculative_tokens=4).propose(ctx)
        want = cpu.propose(ctx)
        assert got.token_ids.tolist() == fresh.token_ids.tolist() == want.token_ids.tolist(), step
        assert got.details == fresh.details and got.details["match_position"] == want.details["match_position"]
    assert p._buf.numel() >= len(ctx)


def test_invalid_arguments():
    ids, lengths = _batch([[1, 2, 3]])
    with pytest.raises(ValueError):
        ngram_match_reference(ids, lengths + 5, prompt_lookup_min=1, prompt_lookup_max=2, num_speculative_tokens=2)
    with pytest.raises(ValueError):
        ngram_match_reference(ids.float(), lengths, prompt_lookup_min=1, prompt_lookup_max=2, num_speculative_tokens=2)
    with pytest.raises(ValueError):
        ngram_match_reference(ids, lengths, prompt_lookup_min=0, prompt_lookup_max=2, num_speculative_tokens=2)


def test_one_compiled_variant_serves_every_request():
    """On CUDA the kernels' compile-time constants depend on no context length, k or n range (so a new prompt length,
    k or (prompt_lookup_min, max) never compiles a new variant), and every integer argument that changes per request
    or step is excluded from Triton's integer specialisation (== 1, divisible by 16), which would otherwise compile a
    variant per value class."""
    from specviz.kernels import ngram_matcher as nm

    cuda = torch.device("cuda")
    constants = {tuple(sorted(nm.launch_constants(L, k, num_n, cuda).items()))
                 for L in (1, 2, 15, 16, 17, 100, 1023, 1024, 1025, 5000, 70000) for k in range(0, 33)
                 for num_n in range(1, nm.MAX_LOOKUP + 1)}
    assert len(constants) == 1, constants
    assert nm.launch_constants(100, 5, 4, torch.device("cpu"))["BLOCK_L"] == 128  # the interpreter's own choice
    for kernel in (nm._ngram_first_end_kernel, nm._ngram_finalize_kernel):
        ints = [p for p in kernel.params if not p.is_constexpr and not p.name.endswith("_ptr")]
        assert ints and all(p.do_not_specialize for p in ints), [(p.name, p.do_not_specialize) for p in ints]
