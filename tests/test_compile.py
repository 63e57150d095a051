"""Compiled forwards in the static runner: the code path on the CPU.

On the CPU machine the compiled path runs with torch.compile's "eager" backend (dynamo's tracing of
transformers' modules over the static cache, our mask and taps) and "aot_eager" (also AOTAutograd's
functionalization of the cache's in-place writes and position update, where a compiled static cache
goes wrong if anything does); inductor's kernels and their CUDA-graph capture are checked on the
GPU (skipped here). Outputs must equal the uncompiled runner's; a compile failure must fall back
with a log line, never fail the request."""

from __future__ import annotations

import functools
import logging

import pytest
import torch

from specviz import SpecDecoder
from specviz.runner import FINAL_NORM, layer_input
from specviz.static_runner import StaticRunner
from tiny_models import build_model

TAPS = (FINAL_NORM, layer_input(1))
WIDTHS = (1, 3, 5, 1, 2, 4, 1)
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one intra-op thread


def _forwards(runner: StaticRunner, device: str = "cpu") -> list[torch.Tensor]:
    """A prefill and verify-like forwards of several widths with rollbacks; logits and taps of each."""
    g = torch.Generator().manual_seed(0)
    runner.reset()
    out = [runner.forward(torch.randint(2, 300, (9,), generator=g)).clone()]
    for i, n in enumerate(WIDTHS):
        ids = torch.randint(2, 300, (n,), generator=g)
        res = runner.forward_features(ids, TAPS if i % 2 else ())
        out += [res.logits.clone(), *(f.float().clone() for f in res.features.values())]
        runner.truncate(runner.seq_len - (n - 1) // 2)  # a partial accept keeps about half
    return out


@pytest.mark.parametrize("backend", ("eager", "aot_eager"))
def test_compiled_forwards_equal_uncompiled(backend):
    model = build_model("llama", seed=0, layers=2, hidden=64)
    want = _forwards(StaticRunner(model, max_cache_len=64, cuda_graphs=False))
    torch._dynamo.reset()
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    runner = StaticRunner(model, max_cache_len=64, cuda_graphs=False, compile=True, compile_backend=backend)
    got = _forwards(runner)
    assert runner.compiled  # no fallback happened
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > frames  # dynamo really compiled graphs
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_engine_with_compiled_runners_equals_plain_greedy(tiny_dirs):
    """draft_model and eagle3 (target taps through the compiled forward) greedy with compiled target and
    drafter runners ("aot_eager") give method none's tokens of the uncompiled decoder."""
    from specviz.methods.eagle.head import build_head
    from specviz.methods.eagle.config import head_config_from_target

    target, draft = tiny_dirs["llama"]
    plain = SpecDecoder.from_pretrained(target, draft, device="cpu", dtype="float32", runner="static")
    want = plain.generate("def add(a, b):", method="none", max_new_tokens=12).output_token_ids
    dec = SpecDecoder.from_pretrained(target, draft, device="cpu", dtype="float32", runner="static", compile=True)
    dec.runner_factory = functools.partial(dec.runner_factory, compile_backend="aot_eager")
    torch.manual_seed(0)
    dec.heads["eagle3"] = build_head(head_config_from_target(dec.target_model.config, "eagle3"), dec.target_model).eval()
    torch._dynamo.reset()
    got = dec.generate("def add(a, b):", method="draft_model", num_speculative_tokens=3, max_new_tokens=12)
    assert got.output_token_ids == want and got.config["compile"] is True  # the trace says the forwards compiled
    assert dec.target_runner.compiled and dec.current_proposer.runner.compiled
    got = dec.generate("def add(a, b):", method="eagle3", num_speculative_tokens=3, max_new_tokens=12)
    assert got.output_token_ids == want and dec.target_runner.compiled
    assert dec.current_proposer.runner.compiled  # the head runner compiles when the target's runner does
    got = dec.generate("def add(a, b):", method="eagle3", eagle_tree_top_k=2, eagle_tree_depth=2,
                       eagle_tree_total_tokens=6, max_new_tokens=12)  # tree draft + tree forward compiled
    assert got.output_token_ids == want and any(len(s.nodes) > 1 for s in got.steps)
    assert dec.current_proposer.runner.compiled and dec.target_runner._compiled_tree is not None


def test_failed_compile_falls_back_with_a_log_line(caplog):
    def broken(gm, example_inputs):
        raise RuntimeError("this backend cannot compile")

    model = build_model("llama", seed=0, layers=2, hidden=64)
    want = _forwards(StaticRunner(model, max_cache_len=64, cuda_graphs=False))
    torch._dynamo.reset()
    runner = StaticRunner(model, max_cache_len=64, cuda_graphs=False, compile=True, compile_backend=broken)
    with caplog.at_level(logging.WARNING, logger="specviz.static_runner"):
        got = _forwards(runner)
    assert not runner.compiled
    assert [r for r in caplog.records if "torch.compile" in r.getMessage()]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("taps", ((), TAPS), ids=("logits", "taps"))
def test_inductor_graphs_equal_eager_on_gpu(taps):
    """fp32 on CUDA: inductor-compiled forwards captured in the runner's CUDA graphs give the eager
    runner's logits and taps (the same forwards, widths and rollbacks), and compile stayed on."""
    model = build_model("llama", seed=0, layers=2, hidden=64).cuda()
    want = _forwards(StaticRunner(model, max_cache_len=64, cuda_graphs=False))
    runner = StaticRunner(model, max_cache_len=64, compile=True)
    got = _forwards(runner)
    got_again = _forwards(runner)  # replays of the captured graphs
    assert runner.compiled and runner.graphs and all(v is not None for v in runner.graphs.values())
    for g, w in zip(got + got_again, want + want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def _tree_forwards(runner: StaticRunner) -> list[torch.Tensor]:
    """A prefill, then three tree forwards (a host tree and a device tree) each followed by a commit of one path."""
    g = torch.Generator().manual_seed(1)
    runner.reset()
    out = [runner.forward(torch.randint(2, 300, (9,), generator=g)).clone()]
    trees = ([-1, -1, 0, 1, 1, 3], torch.tensor([-1, 0, 0, 2, -1, 4, 5], device=runner.device), [-1, 0, 1, 2])
    for parents, path in zip(trees, ([0, 2], [0, 2, 3], [0, 1, 2, 3])):
        n = len(parents)
        res = runner.forward_features(torch.randint(2, 300, (1 + n,), generator=g), TAPS, parents=parents)
        out += [res.logits.clone(), *(f.float().clone() for f in res.features.values())]
        runner.commit(path)
    return out


@pytest.mark.gpu
def test_inductor_tree_graphs_equal_eager_on_gpu():
    """fp32 on CUDA: the tree forward (ancestor mask from the parents + the model) compiled by inductor and
    captured per tree-size bucket gives the eager tree forward's logits and taps, commits included, and compile
    stayed on for trees."""
    model = build_model("llama", seed=0, layers=2, hidden=64).cuda()
    want = _tree_forwards(StaticRunner(model, max_cache_len=64, cuda_graphs=False))
    runner = StaticRunner(model, max_cache_len=64, compile=True)
    got = _tree_forwards(runner)
    got_again = _tree_forwards(runner)  # replays
    assert runner._compiled_tree is not None
    assert any(k[0] == "tree" for k in runner.graphs) and all(v is not None for v in runner.graphs.values())
    for g, w in zip(got + got_again, want + want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_tree_forwards_compiled_on_the_cpu_equal_uncompiled():
    """The same tree forwards and commits with the tree forward compiled ("aot_eager", padded to buckets)."""
    model = build_model("llama", seed=0, layers=2, hidden=64)
    want = _tree_forwards(StaticRunner(model, max_cache_len=64, cuda_graphs=False))
    torch._dynamo.reset()
    runner = StaticRunner(model, max_cache_len=64, cuda_graphs=False, compile=True, compile_backend="aot_eager",
                          tree_buckets=(8, 16))
    got = _tree_forwards(runner)
    assert runner._compiled_tree is not None
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
