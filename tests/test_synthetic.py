"""Synthetic verification (benchmarking only): accept position i iff u_i < a_i / a_{i-1}, so the
unconditional per-position rate P(accepted >= i) equals the requested a_i."""

from __future__ import annotations

import pytest
import torch

from specviz.sampling import KIND_RECOVERED, rejection_sample


def _inputs(B: int, K: int, V: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(K + 1, V, generator=g), -1).expand(B, K + 1, V)
    q = torch.softmax(torch.randn(K, V, generator=g), -1)
    ids = torch.multinomial(q, B, replacement=True, generator=g).T.contiguous()  # [B, K]
    return p, q.expand(B, K, V), ids, g


@pytest.mark.parametrize("rates", [[0.9, 0.75, 0.5, 0.2], [0.6, 0.6, 0.3, 0.3], [1.0, 0.95, 0.9, 0.85, 0.8]])
def test_unconditional_rates_are_reproduced(rates):
    B, K, V = 100_000, len(rates), 16
    p, q, ids, g = _inputs(B, K, V, seed=len(rates))
    out = rejection_sample(p, q, ids, method="synthetic", generator=g, synthetic_rates=torch.tensor(rates))
    for i, a in enumerate(rates, start=1):
        rate = (out.num_accepted >= i).double().mean().item()
        assert abs(rate - a) < 0.01, f"P(accepted >= {i}) = {rate:.4f}, want {a}"


def test_conditional_rates_and_zero_rates():
    """a = (.6, 0, 0, and a longer tail that is ignored): conditional rates (.6, 0, 0); nothing past
    position 1 is ever accepted."""
    B, K, V = 20_000, 3, 8
    p, q, ids, g = _inputs(B, K, V, seed=9)
    out = rejection_sample(p, q, ids, method="synthetic", generator=g, synthetic_rates=[0.6, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(out.accept_prob[0], torch.tensor([0.6, 0.0, 0.0]))
    assert out.num_accepted.max().item() == 1
    assert (out.num_accepted >= 1).double().mean().item() == pytest.approx(0.6, abs=0.015)
    assert torch.equal(out.u[:, 0] < 0.6, out.accepted[:, 0])


def test_rejection_resamples_from_the_standard_residual():
    """p = [.6, .3, .1], q = [.1, .2, .7], x = 2, a_1 = 0.5: the recovered token follows
    r = [5/6, 1/6, 0] whatever the (synthetic) decision was."""
    n = 100_000
    p = torch.tensor([[0.6, 0.3, 0.1], [1.0, 0.0, 0.0]]).expand(n, 2, 3)
    q = torch.tensor([[0.1, 0.2, 0.7]]).expand(n, 1, 3)
    ids = torch.full((n, 1), 2)
    out = rejection_sample(p, q, ids, method="synthetic", synthetic_rates=[0.5], generator=torch.Generator().manual_seed(0))
    assert out.num_accepted.double().mean().item() == pytest.approx(0.5, abs=0.01)
    recovered = out.output_token_ids[:, 0][out.token_kind[:, 0] == KIND_RECOVERED]
    f = torch.bincount(recovered, minlength=3).double() / recovered.numel()
    assert f[2].item() == 0.0
    assert f[0].item() == pytest.approx(5 / 6, abs=0.01)
