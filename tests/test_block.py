"""Block verification (Sun et al., ICLR 2025, arXiv 2403.10444): hand-computed P / rho / h / tau,
the toy example of docs/design/algorithms.md by Monte Carlo, and E[accepted] >= standard."""

from __future__ import annotations

import pytest
import torch

from specviz.sampling import KIND_ACCEPTED, KIND_BONUS, KIND_PAD, KIND_RECOVERED, SamplerNoise, draw_noise, rejection_sample

# p_1..p_3 and q_1, q_2 of the hand example, V = 3, drafts x_1 = 0, x_2 = 1:
# P_1 = min(1, .3/.6) = .5; rho_1 = sum max(.5 p_2 - q_2, 0) = .2; h_1 = .2 / (.2 + .5) = 2/7;
# P_2 = min(1, .5 * .35/.3) = 7/12; h_2 = P_2 = 7/12.
# Block residual after x_1: max(.5 p_2 - q_2, 0) = [.2, 0, 0]; the standard one would be [.5, .05, 0].
P_HAND = torch.tensor([[[0.3, 0.2, 0.5], [0.6, 0.35, 0.05], [0.0, 0.0, 1.0]]])
Q_HAND = torch.tensor([[[0.6, 0.2, 0.2], [0.1, 0.3, 0.6]]])
X_HAND = torch.tensor([[0, 1]])


EXP_HAND = torch.tensor([[100.0, 1e-6, 1.0]])  # favours token 1 whenever its weight is > 0


def _with_u(u):
    return SamplerNoise(u=torch.tensor([u], dtype=torch.float64), exp=EXP_HAND)


def test_hand_computed_block_quantities():
    out = rejection_sample(P_HAND, Q_HAND, X_HAND, method="block", noise=_with_u([0.2, 0.9]))
    torch.testing.assert_close(out.block.P, torch.tensor([[0.5, 7 / 12]]))
    torch.testing.assert_close(out.block.rho, torch.tensor([[0.2, 0.0]]))
    torch.testing.assert_close(out.block.h, torch.tensor([[2 / 7, 7 / 12]]))
    assert out.block.eta is out.u


@pytest.mark.parametrize(
    "eta, tau, tokens, kinds",
    [
        # eta_1 <= h_1 only: accept x_1, emit from max(P_1 p_2 - q_2, 0) = [.2, 0, 0] -> 0
        ([0.2, 0.9], 1, [0, 0, -1], [KIND_ACCEPTED, KIND_RECOVERED, KIND_PAD]),
        # eta_2 <= h_2: no early stop, the later pass accepts the whole block; bonus from p_3 -> 2
        ([0.9, 0.2], 2, [0, 1, 2], [KIND_ACCEPTED, KIND_ACCEPTED, KIND_BONUS]),
        # nothing passes: tau = 0, the standard residual max(p_1 - q_1, 0) = [0, 0, .3] -> 2
        ([0.9, 0.9], 0, [2, -1, -1], [KIND_RECOVERED, KIND_PAD, KIND_PAD]),
    ],
)
def test_hand_computed_block_decisions(eta, tau, tokens, kinds):
    out = rejection_sample(P_HAND, Q_HAND, X_HAND, method="block", noise=_with_u(eta))
    assert out.block.tau.tolist() == [tau] and out.num_accepted.tolist() == [tau]
    assert out.output_token_ids.tolist() == [tokens]
    assert out.token_kind.tolist() == [kinds]


def test_standard_stops_where_block_continues():
    """Same noise as the second block case: standard rejects x_1 (u_1 = .9 > .5) and emits from
    max(p_1 - q_1, 0) -> 2; block accepts both drafts. With u = (.2, .9) standard accepts both
    (p_2(1) / q_2(1) > 1) where block stopped after x_1."""
    out = rejection_sample(P_HAND, Q_HAND, X_HAND, method="standard", noise=_with_u([0.9, 0.2]))
    assert out.output_token_ids.tolist() == [[2, -1, -1]]
    out = rejection_sample(P_HAND, Q_HAND, X_HAND, method="standard", noise=_with_u([0.2, 0.9]))
    assert out.output_token_ids.tolist() == [[0, 1, 2]]


def test_hand_computed_one_hot_block():
    """One-hot q: P_1 = p_1(0) = .3; rho_1 = P_1 (1 - p_2(1)) = .195; h_1 = .195 / (.195 + .7);
    P_2 = .3 * .35 = .105 = h_2. tau = 1 emits from p_2 with x_2 zeroed = [.6, 0, .05]."""
    out = rejection_sample(P_HAND, None, X_HAND, method="block", noise=_with_u([0.2, 0.9]))
    torch.testing.assert_close(out.block.P, torch.tensor([[0.3, 0.105]]))
    torch.testing.assert_close(out.block.rho, torch.tensor([[0.195, 0.0]]))
    torch.testing.assert_close(out.block.h, torch.tensor([[0.195 / 0.895, 0.105]]))
    assert out.output_token_ids.tolist() == [[0, 2, -1]]  # x_2 = 1 has weight 0 despite its tiny E
    noise = SamplerNoise(u=torch.tensor([[0.2, 0.9]], dtype=torch.float64), exp=torch.ones(1, 3))
    out = rejection_sample(P_HAND, None, X_HAND, method="block", noise=noise)
    assert out.output_token_ids.tolist() == [[0, 0, -1]]


def test_h_of_the_last_draft_is_P_and_padding_is_zero():
    g = torch.Generator().manual_seed(2)
    B, K, V = 64, 4, 6
    p = torch.softmax(torch.randn(B, K + 1, V, generator=g), -1)
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1)
    ids = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, K)
    k = torch.randint(0, K + 1, (B,), generator=g)
    ids[torch.arange(K)[None, :] >= k[:, None]] = -1
    out = rejection_sample(p, q, ids, method="block", generator=g)
    assert torch.equal(out.num_draft, k)
    rows = torch.arange(B)[k > 0]
    assert torch.equal(out.block.h[rows, k[rows] - 1], out.block.P[rows, k[rows] - 1])
    past = torch.arange(K)[None, :] >= k[:, None]
    for t in (out.block.P, out.block.h, out.block.rho):
        assert (t[past] == 0).all()
    eta_pass = (out.block.eta <= out.block.h.double()) & ~past
    last_pass = torch.where(eta_pass, torch.arange(1, K + 1), 0).amax(1)
    assert torch.equal(out.block.tau, last_pass)


def test_k1_block_equals_standard_exactly():
    g = torch.Generator().manual_seed(4)
    B, V = 5000, 17
    p = torch.softmax(torch.randn(B, 2, V, generator=g), -1)
    q = torch.softmax(torch.randn(B, 1, V, generator=g), -1)
    ids = torch.multinomial(q[:, 0], 1, generator=g)
    noise = draw_noise(B, 1, V, generator=g)
    a = rejection_sample(p, q, ids, method="standard", noise=noise)
    b = rejection_sample(p, q, ids, method="block", noise=noise)
    assert torch.equal(a.output_token_ids, b.output_token_ids)


@pytest.mark.parametrize("method", ["standard", "block"])
def test_one_hot_closed_forms_equal_full_q_formulas(method):
    """draft_probs=None must behave like an explicit one-hot q matrix."""
    g = torch.Generator().manual_seed(8)
    B, K, V = 4000, 3, 10
    p = torch.softmax(torch.randn(B, K + 1, V, generator=g) * 2, -1)
    ids = torch.randint(0, V, (B, K), generator=g)
    one_hot = torch.nn.functional.one_hot(ids, V).float()  # [B, K, V]
    noise = draw_noise(B, K, V, generator=g)
    a = rejection_sample(p, None, ids, method=method, noise=noise)
    b = rejection_sample(p, one_hot, ids, method=method, noise=noise)
    assert torch.equal(a.num_accepted, b.num_accepted)
    assert torch.equal(a.output_token_ids, b.output_token_ids)
    torch.testing.assert_close(a.residual_mass, b.residual_mass)
    if method == "block":
        for name in ("P", "rho", "h"):
            torch.testing.assert_close(getattr(a.block, name), getattr(b.block, name))


def _toy(n: int):
    """V = {a, b}, p = (1/3, 2/3), q = (2/3, 1/3) at every position, k = 2, drafts drawn from q."""
    g = torch.Generator().manual_seed(21)
    p = torch.tensor([1 / 3, 2 / 3]).expand(n, 3, 2)
    q = torch.tensor([2 / 3, 1 / 3]).expand(n, 2, 2)
    ids = (torch.rand(n, 2, generator=g) >= 2 / 3).long()  # a w.p. 2/3, b w.p. 1/3
    return p, q, ids, draw_noise(n, 2, 2, generator=g)


def test_toy_example_expected_accepted():
    """docs/design/algorithms.md: E[accepted] standard = 10/9, block = 11/9 (Monte Carlo, 10^6 steps:
    standard error about 0.001)."""
    p, q, ids, noise = _toy(1_000_000)
    standard = rejection_sample(p, q, ids, method="standard", noise=noise).num_accepted.double().mean().item()
    block = rejection_sample(p, q, ids, method="block", noise=noise).num_accepted.double().mean().item()
    assert standard == pytest.approx(10 / 9, abs=0.005)
    assert block == pytest.approx(11 / 9, abs=0.005)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("full_q", [True, False])
def test_block_accepts_at_least_as_many_as_standard(seed, full_q):
    """Sun et al. Thm: E[accepted] block >= standard for every p, q, k (same inputs and noise)."""
    g = torch.Generator().manual_seed(100 + seed)
    B, K, V = 50_000, 4, 8
    p = torch.softmax(torch.randn(K + 1, V, generator=g) * (1 + seed % 3), -1).expand(B, K + 1, V)
    q = torch.softmax(torch.randn(K, V, generator=g) * (1 + seed % 2), -1)
    ids = torch.multinomial(q, B, replacement=True, generator=g).T.contiguous()  # [B, K]
    q = q.expand(B, K, V) if full_q else None
    noise = draw_noise(B, K, V, generator=g)
    standard = rejection_sample(p, q, ids, method="standard", noise=noise).num_accepted.double().mean().item()
    block = rejection_sample(p, q, ids, method="block", noise=noise).num_accepted.double().mean().item()
    assert block >= standard - 0.01, (block, standard)
