"""The emitted token's weights are defined once, by the sampler.

The reference sampler returns the weights it raced the emitted token over (``emit_weights``,
``emit_fallback``); the trace record reads those (or, for the Triton kernels, recomputes them
with the same function, ``specviz.sampling.reference.emitted_weights``) and has no copy of its
own. A planted change of the sampler's weights therefore shows up in the record; a draft id
outside [0, V) is recorded without an error."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import specviz.sampling.reference as ref
from specviz.record import gather_core, gather_detail, host_record, pack, unpack
from specviz.sampling import rejection_sample

V, K = 16, 3
CASES = [(m, fq) for m in ("standard", "block", "synthetic") for fq in (True, False)] + [("greedy", False)]


def _inputs(seed, full_q, ids=None):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(K + 1, V, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(K, V, generator=g) * 2, -1) if full_q else None
    x = torch.tensor(ids) if ids is not None else torch.randint(V, (K,), generator=g)
    return g, p, q, x


def _sample(method, p, q, x, g):
    return rejection_sample(p[None], None if q is None else q[None], x[None], method=method, generator=g,
                            synthetic_rates=[0.7, 0.5, 0.3] if method == "synthetic" else None)


def _record(out, p, q, x, method):
    flat, layout = pack({**gather_core(out, x), **gather_detail(out, p, q, x)})
    return host_record(unpack(flat.tolist(), layout), x.tolist(), method, out.backend)


@pytest.mark.parametrize("method, full_q", CASES)
@pytest.mark.parametrize("ids", [None, [V + 2, 1, 2], [3, -4, 5]])
def test_record_reads_the_samplers_weights(method, full_q, ids):
    for seed in range(6):
        g, p, q, x = _inputs(seed, full_q, ids)
        out = _sample(method, p, q, x, g)
        assert out.emit_weights.shape == (1, V) and out.emit_fallback.shape == (1,)
        token = int(out.output_token_ids[0, out.num_accepted[0]])
        assert out.emit_weights[0, token] > 0  # the token came from these weights
        rec = _record(out, p, q, x, method)
        w = out.emit_weights[0] / out.emit_weights[0].sum()
        top = torch.topk(w, min(20, V))
        got = rec["emitted"]["top"]
        want = [[int(i), float(v)] for v, i in zip(top.values, top.indices) if v > 0]
        assert [t for t, _ in got] == [t for t, _ in want]
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)
        # the kernels' path (no emit_weights returned): the same function recomputes the same weights
        bare = dataclasses.replace(out, emit_weights=None, emit_fallback=None)
        w2, zero2 = ref.emitted_weights(bare, p[None], None if q is None else q[None], x[None])
        assert torch.equal(w2, out.emit_weights) and torch.equal(zero2, out.emit_fallback)


def test_a_planted_change_of_the_samplers_weights_reaches_the_record(monkeypatch):
    """Before the fix the record computed the residual itself, so it disagreed with a sampler that
    drew from other weights; now there is one definition and both follow it."""
    def only_token_7(p_all, q_all, ids, j, is_bonus, valid, scale, method):
        w = torch.zeros(p_all.shape[0], p_all.shape[-1])
        w[:, 7] = 1.0
        return w, torch.zeros(p_all.shape[0], dtype=torch.bool)

    monkeypatch.setattr(ref, "emission_weights", only_token_7)
    g, p, q, x = _inputs(0, True, [V + 2, 1, 2])  # first draft invalid: rejected, recovered token drawn
    out = _sample("standard", p, q, x, g)
    assert int(out.output_token_ids[0, 0]) == 7
    rec = _record(out, p, q, x, "standard")
    assert rec["emitted"]["top"] == [[7, 1.0]] and rec["emitted"]["token_id"] == 7


@pytest.mark.gpu
@pytest.mark.parametrize("method, full_q", CASES)
def test_triton_record_equals_reference_record(method, full_q):
    for seed in range(4):
        g, p, q, x = _inputs(seed, full_q, [V + 2, 1, 2] if seed == 0 else None)
        p, x = p.cuda(), x.cuda()
        q = None if q is None else q.cuda()
        noise = ref.draw_noise(1, K, V, generator=torch.Generator("cuda").manual_seed(seed), device="cuda")
        kw = dict(method=method, noise=noise, synthetic_rates=[0.7, 0.5, 0.3] if method == "synthetic" else None)
        qb = None if q is None else q[None]
        a = rejection_sample(p[None], qb, x[None], backend="reference", **kw)
        b = rejection_sample(p[None], qb, x[None], backend="triton", **kw)
        ra, rb = _record(a, p, q, x, method), _record(b, p, q, x, method)
        assert ra["emitted"]["token_id"] == rb["emitted"]["token_id"]
        assert [t for t, _ in ra["emitted"]["top"]] == [t for t, _ in rb["emitted"]["top"]]
