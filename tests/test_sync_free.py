"""The host-wait-free pieces of a step keep results identical (CPU checks; the wait count itself is
tests/test_gpu_syncs.py, on a GPU)."""

from __future__ import annotations

import torch

from specviz.methods.draft_model.proposer import DraftModelProposer, _sample
from specviz.runner import EagerRunner
from specviz.transfer import pinned, to_device


def test_exponential_race_draws_what_multinomial_draws():
    """Same generator state -> same token, and the same generator state afterwards."""
    for seed in range(200):
        q = torch.softmax(torch.randn(3000, generator=torch.Generator().manual_seed(10_000 + seed)) * 3, -1)
        g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        want = [int(torch.multinomial(q, 1, generator=g1)) for _ in range(3)]
        got = [int(_sample(q, g2)) for _ in range(3)]
        assert got == want, seed
        assert torch.equal(g1.get_state(), g2.get_state())


def test_transfer_helpers_on_the_cpu():
    t = torch.arange(5)
    assert to_device(t, "cpu") is t
    assert torch.equal(pinned(t), t)


def test_draft_model_cache_follows_rollback_and_catch_up(tiny_dirs):
    """After a partial accept the drafter rolls back to the committed prefix; after a full accept it
    feeds the last draft and the bonus token: the cached ids always equal the committed context."""
    from specviz.models import load_model

    model = load_model(tiny_dirs["llama"][1], torch.device("cpu"), torch.float32)
    prop = DraftModelProposer(EagerRunner(model), num_speculative_tokens=4)
    prop.reset()
    ctx = list(range(10, 20))
    d = prop.propose(ctx).token_ids.tolist()
    assert prop.cached_ids == ctx + d[:-1] and prop.runner.seq_len == len(ctx) + 3
    ctx = ctx + d[:2] + [7]  # two accepted, then a recovered token
    d = prop.propose(ctx).token_ids.tolist()
    assert prop.cached_ids == ctx + d[:-1] and prop.runner.seq_len == len(ctx) + 3
    ctx = ctx + d + [9]  # all four accepted, then the bonus token
    prop.propose(ctx)
    assert prop.cached_ids[: len(ctx)] == ctx and prop.runner.seq_len == len(ctx) + 3
