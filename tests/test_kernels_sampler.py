"""Triton rejection sampler (specviz/kernels/rejection_sampler.py) == PyTorch reference, on the same noise.

Every method x q kind x dtype, on small odd shapes with -1 padding, invalid ids, non-finite q
rows, q(x) == 0, exact ties and all-zero residuals. Token ids, counts, kinds, flags, p/q at the
draft and accept probabilities must be equal exactly; residual masses and the block rho / h are
vocabulary sums taken in another order, so they are compared to float32 rounding of a sum.

Devices: "cpu" runs the kernels under the Triton interpreter in a child pytest with
TRITON_INTERPRET=1 (tests/kernel_testing.py says why not in this process); "cuda" runs the compiled
kernels in-process when a GPU is present.
"""

from __future__ import annotations

import pytest
import torch

from kernel_testing import DEVICES, interpreter_subprocess
from specviz.sampling import draw_noise, rejection_sample

METHODS = ("greedy", "standard", "block", "synthetic")
RATES = [0.95, 0.9, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2]
EXACT = ("output_token_ids", "num_accepted", "num_draft", "token_kind", "accepted", "u", "p_draft", "q_draft", "accept_prob")


def test_interpreter_subprocess():
    """Run this file's "cpu" cases under the interpreter in a child process."""
    interpreter_subprocess(__file__)


def _triton():
    from specviz.kernels.rejection_sampler import rejection_sample_triton

    return rejection_sample_triton


def _make(B, K, V, full, dtype, method, scenario, seed=0):
    """target [B, K+1, V] (dtype), draft [B, K, V] fp32 or None, ids int64 [B, K], noise."""
    g = torch.Generator().manual_seed(seed)
    if scenario == "ties":  # integer logits: many exactly equal probabilities
        p = torch.softmax(torch.randint(0, 3, (B, K + 1, V), generator=g).float(), -1)
        q = torch.softmax(torch.randint(0, 3, (B, K, V), generator=g).float(), -1) if full else None
    else:
        logits = torch.randn(B, K + 1, V, generator=g) * (3 if full else 8)  # one-hot: peaked p, so p(x) is large
        p = torch.softmax(logits, -1)
        q = torch.softmax(logits[:, :K] + 0.4 * torch.randn(B, K, V, generator=g), -1) if full else None
    p = p.to(dtype)
    if method == "greedy":
        ids = p[:, :K].float().argmax(-1)
        if B > 0 and K > 2:
            ids[0, 2] = (ids[0, 2] + 1) % V  # a mismatch in row 0
    else:
        src = q if full else p[:, :K].float()
        ids = torch.multinomial(src.reshape(-1, V), 1, generator=g).reshape(B, K) if K else torch.zeros(B, 0).long()
    if scenario in ("invalid", "nonfinite") and K >= 4 and B >= 3:
        ids[1, 2:] = -1  # k' = 2
        ids[2, 1] = V + 3  # out of range
        ids[2, 3] = -7  # negative, not the padding
        if B >= 4:
            ids[3, :] = -1  # k' = 0
        if full:
            q[1, 0, ids[1, 0]] = 0.0  # finite row, q(x) == 0
    if scenario == "nonfinite" and full and K >= 2:
        q[0, 1, 5] = float("nan")
        q[2, 0, 7] = float("inf")
    if scenario == "zero_residual" and K >= 2:  # synthetic rejects slot 1, where w == 0
        if full:
            q[:, 1] = p[:, 1].float()
        else:
            p[:, 1] = torch.nn.functional.one_hot(ids[:, 1], V).to(dtype)
    noise = draw_noise(B, K, V, generator=g)
    if scenario == "ties":
        noise = type(noise)(u=noise.u, exp=torch.ones_like(noise.exp))
    return p, q, ids, noise


def _to(device, *xs):
    return [None if x is None else x.to(device) for x in xs]


def _assert_same(ref, tri):
    assert tri.backend == "triton" and tri.method == ref.method
    for name in EXACT:
        a, b = getattr(ref, name), getattr(tri, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), f"{name}:\nreference {a}\ntriton    {b}"
    torch.testing.assert_close(tri.residual_mass, ref.residual_mass, rtol=2e-6, atol=1e-6)
    assert (ref.block is None) == (tri.block is None)
    if ref.block is not None:
        assert torch.equal(ref.block.P, tri.block.P) and torch.equal(ref.block.tau, tri.block.tau)
        assert torch.equal(ref.block.eta, tri.block.eta)
        torch.testing.assert_close(tri.block.rho, ref.block.rho, rtol=2e-6, atol=1e-6)
        torch.testing.assert_close(tri.block.h, ref.block.h, rtol=1e-5, atol=1e-6)


def _run_case(device, method, full, dtype, scenario, shape=(4, 5, 1271), block_v=None, seed=0):
    B, K, V = shape
    p, q, ids, noise = _make(B, K, V, full, dtype, method, scenario, seed)
    p, q, ids = _to(device, p, q, ids)
    noise = type(noise)(u=noise.u.to(device), exp=noise.exp.to(device))
    rates = RATES[:K] if method == "synthetic" else None
    if method == "synthetic" and scenario == "zero_residual":
        rates = [1.0] + [0.0] * (K - 1)
    kw = dict(method=method, noise=noise, synthetic_rates=rates)
    ref = rejection_sample(p, q, ids, backend="reference", **kw)
    tri = _triton()(p, q, ids, block_v=block_v, **kw)
    _assert_same(ref, tri)
    return ref


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("full", [True, False], ids=["fullq", "onehot"])
@pytest.mark.parametrize("method", METHODS)
def test_matches_reference(device, method, full, dtype):
    """Random inputs with a high acceptance, padding and invalid ids; one vocab block and several."""
    accepted = 0
    for seed, block_v in ((0, None), (1, 256)):
        ref = _run_case(device, method, full, dtype, "invalid", block_v=block_v, seed=seed)
        accepted += int(ref.num_accepted.sum())
    assert accepted > 0, "inputs should accept some drafts, or the comparison is too easy"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
def test_nonfinite_q_rows(device, method):
    """Non-finite q rows: q is the zero vector there (the slow race path in the kernel)."""
    for seed in range(3):
        _run_case(device, method, True, torch.float32, "nonfinite", block_v=256, seed=seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("full", [True, False], ids=["fullq", "onehot"])
@pytest.mark.parametrize("method", METHODS)
def test_exact_ties(device, method, full):
    """Equal probabilities and E == 1 everywhere: every argmax must pick the lowest index, also
    across vocabulary blocks."""
    for block_v in (None, 128):
        _run_case(device, method, full, torch.float32, "ties", block_v=block_v)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("full", [True, False], ids=["fullq", "onehot"])
def test_zero_residual_falls_back_to_p(device, full):
    """synthetic rejects slot 2 where max(p - q, 0) == 0: the emitted token is drawn from p."""
    ref = _run_case(device, "synthetic", full, torch.float32, "zero_residual", shape=(3, 4, 700), block_v=128)
    assert bool((ref.num_accepted == 1).all()) and bool((ref.token_kind[:, 1] == 2).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1, 1, 1000), (2, 0, 517), (3, 8, 333)], ids=str)
@pytest.mark.parametrize("method", METHODS)
def test_shapes(device, method, shape):
    """K = 0 (no drafts: a plain sample), K = 1, K = 8 with both q kinds."""
    for full in (True, False):
        _run_case(device, method, full, torch.float32, "random", shape=shape)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", METHODS)
def test_public_entry_backend_triton(device, method):
    """specviz.sampling.rejection_sample(backend="triton") routes to the kernels."""
    p, q, ids, noise = _make(3, 5, 1271, True, torch.float32, method, "invalid")
    p, q, ids = _to(device, p, q, ids)
    noise = type(noise)(u=noise.u.to(device), exp=noise.exp.to(device))
    kw = dict(method=method, noise=noise, synthetic_rates=RATES[:5] if method == "synthetic" else None)
    _assert_same(rejection_sample(p, q, ids, **kw), rejection_sample(p, q, ids, backend="triton", **kw))
