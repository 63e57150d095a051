"""Deterministic and small Monte Carlo tests of the reference rejection sampler and of
logits_to_probs (hand-computed cases, layout, invalid input, greedy, reproducibility, errors)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from specviz.sampling import (
    KIND_ACCEPTED,
    KIND_BONUS,
    KIND_PAD,
    KIND_RECOVERED,
    SamplerNoise,
    draw_noise,
    logits_to_probs,
    rejection_sample,
    validate_sampling_params,
)

METHODS_WITH_NOISE = ["standard", "block", "synthetic"]
RATES = [0.9, 0.8, 0.7, 0.6]


def rows(x: list, n: int) -> torch.Tensor:
    """A float32 tensor holding the nested list ``x`` repeated over ``n`` rows."""
    t = torch.tensor(x, dtype=torch.float32)
    return t.expand(n, *t.shape).contiguous()


def freq(tokens: torch.Tensor, V: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=V).double() / tokens.numel()


def run(p, q, ids, method="standard", seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    kw.setdefault("synthetic_rates", RATES if method == "synthetic" else None)
    return rejection_sample(p, q, ids, method=method, generator=g, **kw)


# ------------------------------------------------------------------------ hand-computed residual


def test_hand_computed_residual():
    """p = [.6, .3, .1], q = [.1, .2, .7] -> r = normalize(max(p - q, 0)) = [5/6, 1/6, 0]."""
    n = 200_000
    p = rows([[0.6, 0.3, 0.1], [1.0, 0.0, 0.0]], n)
    q = rows([[0.1, 0.2, 0.7]], n)
    ids = torch.full((n, 1), 2)  # x_1 = 2: accepted with probability p/q = 1/7
    out = run(p, q, ids)
    assert out.residual_mass[0, 0].item() == pytest.approx(0.6, abs=1e-6)
    assert out.accept_prob[0, 0].item() == pytest.approx(1 / 7, rel=1e-6)
    assert out.num_accepted.double().mean().item() == pytest.approx(1 / 7, abs=0.005)
    recovered = out.output_token_ids[:, 0][out.token_kind[:, 0] == KIND_RECOVERED]
    f = freq(recovered, 3)
    assert f[2].item() == 0.0
    assert f[0].item() == pytest.approx(5 / 6, abs=0.005)
    assert f[1].item() == pytest.approx(1 / 6, abs=0.005)


def test_exponential_race_is_exact_and_zero_weight_never_wins():
    """token = argmax_x w(x) / E(x) over w = max(p - q, 0) = [.5, .1, 0]; a zero weight loses even
    against a tiny E(x)."""
    p = torch.tensor([[[0.6, 0.3, 0.1], [1.0, 0.0, 0.0]]])
    q = torch.tensor([[[0.1, 0.2, 0.7]]])
    ids = torch.tensor([[2]])
    u = torch.tensor([[0.99]], dtype=torch.float64)  # 0.99 > 1/7: rejected
    w1 = (torch.tensor(0.3) - torch.tensor(0.2)).item()  # float32 weight of token 1
    tie = [0.5, w1, 1.0]  # both scores exactly 1.0 -> lowest index
    cases = [([1.0, 1.0, 1.0], 0), ([10.0, 1.0, 1e-30], 1), ([1.0, 1.0, 0.0], 0), (tie, 0), ([0.6, w1, 1.0], 1)]
    for e, want in cases:
        noise = SamplerNoise(u=u, exp=torch.tensor([e]))
        out = rejection_sample(p, q, ids, noise=noise)
        assert out.output_token_ids.tolist() == [[want, -1]], e
        assert out.token_kind.tolist() == [[KIND_RECOVERED, KIND_PAD]]


def test_one_hot_residual_is_p_without_the_draft_token():
    n = 100_000
    p = rows([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]], n)
    out = run(p, None, torch.full((n, 1), 0))  # x_1 = 0 accepted with p(0) = 0.5
    assert out.q_draft[0, 0].item() == 1.0
    assert out.residual_mass[0, 0].item() == pytest.approx(0.5, abs=1e-7)
    recovered = out.output_token_ids[:, 0][out.token_kind[:, 0] == KIND_RECOVERED]
    f = freq(recovered, 3)
    assert f[0].item() == 0.0
    assert f[1].item() == pytest.approx(0.6, abs=0.01)
    assert out.num_accepted.double().mean().item() == pytest.approx(0.5, abs=0.01)


def test_zero_residual_falls_back_to_p():
    """p == q and q(x) == 0 (a finite row): rejected, max(p - q, 0) == 0, so the token comes from p."""
    n = 20_000
    p = rows([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]], n)
    q = rows([[0.5, 0.5, 0.0]], n)
    out = run(p, q, torch.full((n, 1), 2))
    assert out.num_accepted.sum().item() == 0
    assert out.residual_mass[0, 0].item() == 0.0
    f = freq(out.output_token_ids[:, 0], 3)
    assert f[0].item() == pytest.approx(0.5, abs=0.02)
    assert f[2].item() == 0.0


def test_accept_rule_compares_float64_u_with_float32_ratio():
    """accept iff u <= p/q, the ratio computed in float32 and upcast: u equal to the ratio accepts,
    the next float64 above it rejects."""
    p = torch.tensor([[[0.3, 0.7], [1.0, 0.0]]])
    q = torch.tensor([[[0.9, 0.1]]])
    ratio = (torch.tensor(0.3) / torch.tensor(0.9)).double()  # float32 division, then upcast
    exp = torch.ones(1, 2)
    for u, accepted in ((ratio, True), (torch.nextafter(ratio, torch.tensor(2.0, dtype=torch.float64)), False)):
        out = rejection_sample(p, q, torch.tensor([[0]]), noise=SamplerNoise(u=u.reshape(1, 1), exp=exp))
        assert bool(out.accepted[0, 0]) is accepted
        assert out.accept_prob[0, 0].item() == ratio.float().item()


# --------------------------------------------------------------------------------- layout


@pytest.mark.parametrize("method", ["greedy", "standard", "block", "synthetic"])
@pytest.mark.parametrize("full_q", [True, False])
def test_all_accepted_emits_bonus_from_next_position(method, full_q):
    K, V, n = 3, 5, 2000
    ids = torch.tensor([[1, 3, 0]]).expand(n, K)
    target = torch.zeros(K + 1, V)
    target[torch.arange(K), ids[0]] = 1.0  # p_i one-hot at x_i: always accepted (p/q >= 1)
    target[K] = torch.tensor([0.0, 0.2, 0.0, 0.0, 0.8])
    q = target[:K].expand(n, K, V) if full_q else None
    out = run(target.expand(n, K + 1, V), q, ids, method=method, synthetic_rates=[1.0, 1.0, 1.0])
    assert out.num_accepted.tolist() == [K] * n
    assert (out.output_token_ids[:, :K] == ids).all()
    assert (out.token_kind[:, :K] == KIND_ACCEPTED).all() and (out.token_kind[:, K] == KIND_BONUS).all()
    bonus = out.output_token_ids[:, K]
    assert set(bonus.unique().tolist()) <= {1, 4}
    if method == "greedy":
        assert (bonus == 4).all()
    else:
        assert freq(bonus, V)[4].item() == pytest.approx(0.8, abs=0.03)


def test_synthetic_rates_must_be_given_for_synthetic_only():
    p = torch.full((1, 2, 4), 0.25)
    with pytest.raises(ValueError, match="synthetic_rates"):
        rejection_sample(p, None, torch.tensor([[0]]), method="synthetic")


@pytest.mark.parametrize("method", ["standard", "block"])
def test_no_draft_is_a_plain_sample_from_p(method):
    """k' = 0 (all -1, or K = 0): the bonus token is a plain sample from p_1, exactly the race on p."""
    n, V = 50_000, 4
    p1 = [0.1, 0.2, 0.3, 0.4]
    for K in (0, 2):
        p = rows([p1] * (K + 1), n)
        ids = torch.full((n, K), -1)
        noise = draw_noise(n, K, V, generator=torch.Generator().manual_seed(K))
        out = rejection_sample(p, None, ids, method=method, noise=noise)
        assert out.num_draft.eq(0).all() and out.num_accepted.eq(0).all()
        assert (out.token_kind[:, 0] == KIND_BONUS).all() and (out.output_token_ids[:, 1:] == -1).all()
        assert torch.equal(out.output_token_ids[:, 0], (p[:, 0] / noise.exp).argmax(dim=1))
        assert torch.allclose(freq(out.output_token_ids[:, 0], V), torch.tensor(p1, dtype=torch.float64), atol=0.01)


@pytest.mark.parametrize("method", ["greedy", "standard", "block", "synthetic"])
def test_minus_one_padding_ends_the_draft(method):
    """ids [x_1, -1, x_3]: k' = 1; x_3 is ignored even though the target would accept it."""
    n, V = 1000, 4
    target = torch.zeros(4, V)
    target[0, 2] = target[1, 0] = target[2, 3] = target[3, 1] = 1.0
    ids = torch.tensor([[2, -1, 3]]).expand(n, 3)
    out = run(target.expand(n, 4, V), None, ids, method=method, synthetic_rates=[1.0, 1.0, 1.0])
    assert out.num_draft.eq(1).all() and out.num_accepted.eq(1).all()
    assert out.output_token_ids[0].tolist() == [2, 0, -1, -1]
    assert out.token_kind[0].tolist() == [KIND_ACCEPTED, KIND_BONUS, KIND_PAD, KIND_PAD]
    assert not out.accepted[:, 1:].any()
    for field in (out.p_draft, out.q_draft, out.accept_prob, out.residual_mass):
        assert (field[:, 1:] == 0).all()


# ------------------------------------------------------------------------------ invalid input


def _p_two_way(n):
    """p_1 = [.5, .5, 0, 0] (x_1 invalid: residual = p_1 -> tokens 0 and 1), p_2 = one-hot 3."""
    return rows([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]], n)


@pytest.mark.parametrize("method", METHODS_WITH_NOISE + ["greedy"])
@pytest.mark.parametrize("bad_id", [4, 99, -2])
@pytest.mark.parametrize("full_q", [True, False])
def test_out_of_range_ids_are_rejected_and_resampled_from_p(method, bad_id, full_q):
    n = 4000
    q = rows([[0.0, 1.0, 0.0, 0.0]], n) if full_q else None  # a real q would force residual token 0
    out = run(_p_two_way(n), q, torch.full((n, 1), bad_id), method=method, synthetic_rates=[1.0])
    assert out.num_draft.eq(1).all() and out.num_accepted.eq(0).all()
    assert (out.p_draft == 0).all() and (out.q_draft == 0).all() and (out.accept_prob == 0).all()
    tokens = out.output_token_ids[:, 0]
    assert set(tokens.unique().tolist()) == ({0} if method == "greedy" else {0, 1})
    assert (out.token_kind[:, 0] == KIND_RECOVERED).all()
    if method == "block":
        assert (out.block.P == 0).all()


@pytest.mark.parametrize("method", METHODS_WITH_NOISE)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_q_row_is_treated_as_zero(method, bad):
    """Slot 2's q row holds a non-finite value: never accepted, residual = p_2 (which may even emit
    x_2 itself); slot 1 is unaffected."""
    n = 4000
    p = rows([[0.0, 1.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]], n)
    q = rows([[0.0, 1.0, 0.0, 0.0], [0.0, 1.0, 0.0, bad]], n)
    ids = torch.tensor([[1, 1]]).expand(n, 2)
    out = run(p, q, ids, method=method, synthetic_rates=[1.0, 1.0])
    assert out.num_accepted.eq(1).all()
    assert (out.q_draft[:, 1] == 0).all() and (out.accept_prob[:, 1] == 0).all()
    assert (out.p_draft[:, 1] == 0.5).all()
    assert out.residual_mass[0, 1].item() == pytest.approx(1.0)
    assert set(out.output_token_ids[:, 1].unique().tolist()) == {0, 1}
    if method == "block":
        assert (out.block.P[:, 1] == 0).all() and (out.block.P[:, 0] == 1).all()


@pytest.mark.parametrize("method", ["standard", "block"])
def test_finite_q_with_zero_mass_on_the_draft_is_rejected_with_real_residual(method):
    n = 2000
    p = rows([[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]], n)
    q = rows([[0.0, 0.8, 0.2, 0.0]], n)
    out = run(p, q, torch.full((n, 1), 0), method=method)
    assert out.num_accepted.eq(0).all() and (out.q_draft == 0).all() and (out.p_draft == 0.5).all()
    assert (out.output_token_ids[:, 0] == 0).all()  # max(p - q, 0) = [.5, 0, 0, 0]
    if method == "block":
        assert (out.block.P == 0).all()


@pytest.mark.parametrize("method", ["greedy", "standard", "block", "synthetic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("full_q", [True, False])
def test_inputs_are_never_modified(method, dtype, full_q):
    g = torch.Generator().manual_seed(3)
    B, K, V = 64, 3, 11
    p = torch.softmax(torch.randn(B, K + 1, V, generator=g), -1).to(dtype)
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1).to(dtype) if full_q else None
    if full_q:
        q[5, 1, 2] = math.nan
    ids = torch.randint(0, V, (B, K), generator=g)
    ids[0, 1], ids[1, 0], ids[2, 2] = -1, V + 1, -7
    noise = draw_noise(B, K, V, generator=g)
    before = [t.clone() for t in (p, ids, noise.u, noise.exp)] + ([q.clone()] if full_q else [])
    rejection_sample(p, q, ids, method=method, noise=noise, synthetic_rates=RATES)
    after = [p, ids, noise.u, noise.exp] + ([q] if full_q else [])
    for a, b in zip(after, before):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


# ------------------------------------------------------------------------------------ greedy


def _greedy_chain(p: torch.Tensor, ids: torch.Tensor) -> list[list[int]]:
    """Plain loop over rows: accept while x_i == argmax p_i, then emit argmax at the stop."""
    out = []
    for b in range(p.shape[0]):
        row = []
        for i in range(ids.shape[1] + 1):
            best = int(p[b, i].argmax())
            x = int(ids[b, i]) if i < ids.shape[1] else -1
            if x == -1 or x != best:
                row.append(best)
                break
            row.append(x)
        out.append(row + [-1] * (ids.shape[1] + 1 - len(row)))
    return out


@pytest.mark.parametrize("full_q", [True, False])
def test_greedy_equals_argmax_chain(full_q):
    g = torch.Generator().manual_seed(11)
    B, K, V = 300, 4, 7
    p = torch.softmax(torch.randn(B, K + 1, V, generator=g) * 2, -1)
    ids = p[:, :K].argmax(-1)  # the greedy chain ...
    corrupt = torch.rand(B, K, generator=g) < 0.25
    ids = torch.where(corrupt, torch.randint(0, V, (B, K), generator=g), ids)  # ... with some mismatches
    ids[:20, 2:] = -1
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1) if full_q else None
    out = rejection_sample(p, q, ids, method="greedy")
    assert out.output_token_ids.tolist() == _greedy_chain(p, ids)
    assert (out.u == 0).all() and out.u.dtype == torch.float64
    in_draft = torch.arange(K) < out.num_draft[:, None]
    match = (ids == p[:, :K].argmax(-1)) & in_draft  # per slot, also after the first mismatch
    assert torch.equal(out.accept_prob, match.float())


@pytest.mark.parametrize("method", ["greedy", "standard", "block"])
def test_draft_identical_to_target_is_always_accepted(method):
    g = torch.Generator().manual_seed(12)
    B, K, V = 500, 5, 9
    p = torch.softmax(torch.randn(B, K + 1, V, generator=g), -1)
    if method == "greedy":
        ids, q = p[:, :K].argmax(-1), None
    else:
        q = p[:, :K].clone()
        ids = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, K)
    out = rejection_sample(p, q, ids, method=method, generator=g)
    assert out.num_accepted.eq(K).all()


# ------------------------------------------------------------------------------- reproducibility


@pytest.mark.parametrize("method", METHODS_WITH_NOISE)
def test_seeded_reproducibility(method):
    g = torch.Generator().manual_seed(5)
    B, K, V = 256, 4, 13
    p = torch.softmax(torch.randn(B, K + 1, V, generator=g), -1)
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1)
    ids = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, K)
    a, b, c = (run(p, q, ids, method=method, seed=s) for s in (1, 1, 2))
    noise = draw_noise(B, K, V, generator=torch.Generator().manual_seed(1))
    d = rejection_sample(p, q, ids, method=method, noise=noise, synthetic_rates=RATES)
    for x in (b, d):
        assert torch.equal(a.output_token_ids, x.output_token_ids) and torch.equal(a.u, x.u)
    assert not torch.equal(a.output_token_ids, c.output_token_ids)


# ---------------------------------------------------------------------------- output contract


@pytest.mark.parametrize("method", ["greedy", "standard", "block", "synthetic"])
def test_output_fields_shapes_and_dtypes(method):
    g = torch.Generator().manual_seed(6)
    B, K, V = 8, 3, 10
    p = torch.softmax(torch.randn(B, K + 1, V, generator=g), -1).to(torch.bfloat16)
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1).half()
    ids = torch.randint(0, V, (B, K), generator=g, dtype=torch.int32)
    out = rejection_sample(p, q, ids, method=method, generator=g, synthetic_rates=RATES)
    want = {
        "output_token_ids": ((B, K + 1), torch.int64), "num_accepted": ((B,), torch.int64),
        "num_draft": ((B,), torch.int64), "token_kind": ((B, K + 1), torch.int8), "u": ((B, K), torch.float64),
        "p_draft": ((B, K), torch.float32), "q_draft": ((B, K), torch.float32),
        "accept_prob": ((B, K), torch.float32), "accepted": ((B, K), torch.bool),
        "residual_mass": ((B, K), torch.float32),
    }
    for name, (shape, dtype) in want.items():
        t = getattr(out, name)
        assert tuple(t.shape) == shape and t.dtype == dtype, name
    assert out.method == method and out.backend == "reference"
    assert (out.block is not None) == (method == "block")
    emitted = (out.output_token_ids != -1).sum(1)
    assert torch.equal(emitted, out.num_accepted + 1)
    assert torch.equal(out.accepted.sum(1), out.num_accepted)
    z = (p[:, :K].float() - q.float()).clamp_min(0).sum(-1)
    torch.testing.assert_close(out.residual_mass, z)


# ------------------------------------------------------------------------------------- errors


def test_invalid_arguments_raise_value_error():
    p = torch.full((2, 3, 4), 0.25)
    ids = torch.zeros(2, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="greedy, standard, block, synthetic"):
        rejection_sample(p, None, ids, method="typical")
    with pytest.raises(ValueError, match="reference, triton"):
        rejection_sample(p, None, ids, backend="cuda")
    with pytest.raises(ValueError, match=r"\[B, K\] = \[2, 2\]"):
        rejection_sample(p, None, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        rejection_sample(p, None, ids.float())
    with pytest.raises(ValueError, match=r"\[B, K, V\] = \[2, 2, 4\]"):
        rejection_sample(p, torch.full((2, 2, 5), 0.2), ids)
    with pytest.raises(ValueError, match=r"\[B, K\+1, V\]"):
        rejection_sample(p[0], None, ids)
    with pytest.raises(ValueError, match="noise.u"):
        rejection_sample(p, None, ids, noise=SamplerNoise(u=torch.rand(2, 2), exp=torch.ones(2, 4)))
    with pytest.raises(ValueError, match="noise.exp"):
        rejection_sample(p, None, ids, noise=SamplerNoise(u=torch.rand(2, 2).double(), exp=torch.ones(2, 3)))
    for rates, match in (([0.5], "length"), ([0.5, 1.5], r"\[0, 1\]"), ([0.5, 0.6], "non-increasing")):
        with pytest.raises(ValueError, match=match):
            rejection_sample(p, None, ids, method="synthetic", synthetic_rates=rates)


def test_importing_the_sampler_does_not_import_triton():
    code = "import sys, specviz.sampling; assert 'triton' not in sys.modules and 'specviz.kernels.rejection_sampler' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=str(_repo_root()))


def _repo_root():
    import pathlib

    return pathlib.Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------ logits_to_probs


def test_logits_to_probs_plain_temperature():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 50, generator=g).to(torch.bfloat16)
    for T in (0.5, 1.0, 2.0):
        want = torch.softmax(logits.float() / T, dim=-1)
        got = logits_to_probs(logits, T)
        assert got.dtype == torch.float32 and got.shape == logits.shape
        torch.testing.assert_close(got, want, rtol=0, atol=1e-7)


def test_logits_to_probs_temperature_zero_is_one_hot_argmax():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [-1.0, -2.0, -0.5, -3.0]])
    got = logits_to_probs(logits, 0.0)
    assert got.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]  # ties -> lowest index


def test_logits_to_probs_top_k_and_top_p_by_hand():
    logits = torch.log(torch.tensor([0.05, 0.5, 0.15, 0.3]))
    torch.testing.assert_close(logits_to_probs(logits, 1.0, top_k=2), torch.tensor([0, 0.625, 0, 0.375]))
    torch.testing.assert_close(logits_to_probs(logits, 1.0, top_p=0.75), torch.tensor([0, 0.625, 0, 0.375]))
    torch.testing.assert_close(logits_to_probs(logits, 1.0, top_p=0.1), torch.tensor([0.0, 1.0, 0.0, 0.0]))
    torch.testing.assert_close(logits_to_probs(logits, 1.0, top_k=0, top_p=1.0), torch.tensor([0.05, 0.5, 0.15, 0.3]))


def test_logits_to_probs_matches_transformers_warpers():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 300, generator=g) * 3
    for T, k, top_p in ((0.7, 20, 0.9), (1.3, 50, None), (1.0, None, 0.5), (0.6, 5, 0.99)):
        x = TemperatureLogitsWarper(T)(None, logits.clone())
        if k:
            x = TopKLogitsWarper(k)(None, x)
        if top_p is not None:
            x = TopPLogitsWarper(top_p)(None, x)
        torch.testing.assert_close(logits_to_probs(logits, T, k, top_p), torch.softmax(x, -1), rtol=0, atol=1e-7)


def test_sampling_params_validation():
    for kwargs, match in (
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": 1.0, "top_k": -1}, "top_k"),
        ({"temperature": 1.0, "top_p": 0.0}, r"top_p .*\(0, 1\]"),
        ({"temperature": 1.0, "top_p": 1.5}, "top_p"),
    ):
        with pytest.raises(ValueError, match=match):
            validate_sampling_params(**kwargs)
        with pytest.raises(ValueError, match=match):
            logits_to_probs(torch.zeros(3), **kwargs)
    validate_sampling_params(0.0, 0, 1.0)
    validate_sampling_params(0.8, 40, 0.95)
