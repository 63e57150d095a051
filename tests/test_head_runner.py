"""The EAGLE / EAGLE-3 head runners (specviz/methods/eagle/runner.py): the static runner (per-slot cache,
padded first-pass buckets, CUDA graphs on CUDA) drafts exactly what the eager reference
(DynamicCache, the head's own forward) drafts, and its cache of committed positions equals a
from-scratch recompute (docs/design/methods.md 1.2). Tiny random Llama targets and random heads, fp32."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import DynamicCache

from specviz.methods.eagle.head import build_head
from specviz.methods.eagle.config import head_config_from_target
from specviz.methods.eagle.runner import BUCKETS, EagerHeadRunner, StaticHeadRunner, make_head_runner
from specviz.proposer import Outcome, StepContext
from specviz.methods.eagle.proposer import EagleProposer
from specviz.runner import hidden_state_index
from tiny_models import build_model

K = 4
PLAN = (1, 3, 5, 2, 4, 1, 5, 5, 3)  # tokens committed per step (1..k+1): widths 1, 2, 3 -> 4, 5 -> 8 padded
PROMPT = 40  # the prefill's first pass: 39 rows, wider than every bucket (exact width, eager)
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one intra-op thread


def _setup(kind: str, device: str):
    target = build_model("llama", seed=3, layers=4, hidden=32).to(device)
    torch.manual_seed(7)
    head = build_head(head_config_from_target(target.config, kind), target).to(device).eval()
    torch.manual_seed(0)
    ids = torch.randint(2, target.config.vocab_size, (PROMPT + sum(PLAN),)).tolist()  # prompt + committed tokens
    with torch.no_grad():
        hs = target(input_ids=torch.tensor([ids], device=device), output_hidden_states=True).hidden_states
    L = target.config.num_hidden_layers
    taps = EagleProposer(head, K).taps
    feats = {t: hs[hidden_state_index(t, L)][0] for t in taps}  # {tap: [N, d]}
    return target, head, ids, feats


def _drive(head, runner, ids, feats, temperature: float, check_cache=None):
    """Run one request's chain drafting over PLAN; returns [(draft ids, q or None, confidence)] per step."""
    prop = EagleProposer(head, K, runner=runner)
    prop.reset()
    n = PROMPT
    prop.observe(Outcome(0, [], 0, ids[1:n], {t: f[: n - 1] for t, f in feats.items()}))
    gen = torch.Generator(device=feats[prop.taps[0]].device).manual_seed(5)
    ctx = StepContext(temperature=temperature, generator=gen, top_k=40 if temperature else None)
    out = []
    for c in PLAN:
        draft = prop.propose(ids[:n], K, ctx)
        out.append((draft.token_ids.tolist(), draft.probs, prop._confidence.clone()))
        if check_cache is not None:
            check_cache(prop, ids)
        prop.observe(Outcome(n - 1, draft.token_ids.tolist(), c - 1, ids[n:n + c],
                             {t: f[n - 1:n - 1 + c] for t, f in feats.items()}))
        n += c
    return out


def _assert_same_drafts(want, got):
    for step, ((w_ids, w_q, w_conf), (g_ids, g_q, g_conf)) in enumerate(zip(want, got)):
        assert g_ids == w_ids, step
        assert (w_q is None) == (g_q is None)
        if w_q is not None:
            torch.testing.assert_close(g_q, w_q, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(g_conf, w_conf, rtol=1e-4, atol=1e-6)
    assert len(got) == len(PLAN)


@pytest.mark.parametrize("temperature", (0.0, 0.9), ids=("greedy", "sampled"))
@pytest.mark.parametrize("kind", ("eagle", "eagle3"))
def test_static_head_runner_drafts_equal_eager(kind, temperature):
    """CPU, no graphs: the static runner's path (slot cache, padded buckets, explicit mask) gives the
    eager reference's drafts, q and confidences at every step, greedy and sampled."""
    _, head, ids, feats = _setup(kind, "cpu")
    want = _drive(head, EagerHeadRunner(head), ids, feats, temperature)
    runner = StaticHeadRunner(head, max_len=96, cuda_graphs=False)
    got = _drive(head, runner, ids, feats, temperature)
    _assert_same_drafts(want, got)
    assert len({tuple(d) for d, _, _ in want}) > 1  # the drafts are not all the same


@pytest.mark.parametrize("kind", ("eagle", "eagle3"))
def test_static_head_cache_equals_a_recompute(kind):
    """After every first pass the slot cache's committed positions hold K/V from target features only
    (a fresh eager first pass over (g_j, x_{j+1}), j < Lc), whatever the padding and draft steps wrote."""
    _, head, ids, feats = _setup(kind, "cpu")
    checked = []

    def check(prop, ids):
        Lc = prop.committed
        g = torch.cat([feats[t][:Lc] for t in prop.taps], dim=-1)
        fresh = DynamicCache()
        with torch.no_grad():
            head(g, torch.tensor(ids[1:Lc + 1]), torch.arange(Lc), fresh, from_target=True)
        torch.testing.assert_close(prop.cache.keys[:, :, :Lc], fresh.layers[0].keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(prop.cache.values[:, :, :Lc], fresh.layers[0].values, rtol=1e-4, atol=1e-5)
        checked.append(Lc)

    _drive(head, StaticHeadRunner(head, max_len=96, cuda_graphs=False), ids, feats, 0.0, check)
    assert len(checked) == len(PLAN)


def test_make_head_runner_and_bad_input():
    """make_head_runner picks the static runner when given a length (its slot cache sized to it) and the eager one
    without; both draft the same."""
    _, head, ids, feats = _setup("eagle", "cpu")
    static, eager = make_head_runner(head, 96), make_head_runner(head, None)
    assert isinstance(static, StaticHeadRunner) and static.max_len == 96 and isinstance(eager, EagerHeadRunner)
    _assert_same_drafts(_drive(head, eager, ids, feats, 0.0), _drive(head, static, ids, feats, 0.0))
    assert isinstance(make_head_runner(torch.nn.Identity(), 64), EagerHeadRunner)  # a stub: the eager path
    with pytest.raises(ValueError, match="needs a specviz.heads head"):
        StaticHeadRunner(torch.nn.Identity(), 64)
    runner = StaticHeadRunner(head, max_len=16, cuda_graphs=False)
    with pytest.raises(ValueError, match="holds 16 positions"):
        runner.step(torch.zeros(1, 32), torch.zeros(1, dtype=torch.long), 16)


def test_failed_capture_falls_back_to_eager(caplog):
    """A capture that fails (here: CUDA graphs asked for on the CPU) logs one warning per call kind and
    width and runs that call eagerly: the drafts are still the reference's."""
    _, head, ids, feats = _setup("eagle3", "cpu")
    want = _drive(head, EagerHeadRunner(head), ids, feats, 0.0)
    runner = StaticHeadRunner(head, max_len=96, cuda_graphs=True)
    with caplog.at_level(logging.WARNING, logger="specviz.methods.eagle.runner"):
        got = _drive(head, runner, ids, feats, 0.0)
    _assert_same_drafts(want, got)
    failed = [r for r in caplog.records if "capture" in r.getMessage()]
    assert failed and len(failed) == len(runner.graphs) and runner.replays == 0
    assert all(entry is None for entry in runner.graphs.values())


@pytest.mark.parametrize("backend", ("eager", "aot_eager"))
@pytest.mark.parametrize("kind", ("eagle", "eagle3"))
def test_compiled_static_head_runner_drafts_equal_eager(kind, backend):
    """CPU, no graphs: with ``compile=True`` (dynamo's tracing of the head over the slot cache; "aot_eager" also
    functionalizes the cache's index_copy_ writes) the drafts, q and confidences are the eager reference's, and
    dynamo really compiled (no fallback)."""
    _, head, ids, feats = _setup(kind, "cpu")
    want = _drive(head, EagerHeadRunner(head), ids, feats, 0.9)
    torch._dynamo.reset()
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    runner = StaticHeadRunner(head, max_len=96, cuda_graphs=False, compile=True, compile_backend=backend)
    got = _drive(head, runner, ids, feats, 0.9)
    _assert_same_drafts(want, got)
    assert runner.compiled and torch._dynamo.utils.counters["stats"]["unique_graphs"] > frames


def test_failed_head_compile_falls_back_with_a_log_line(caplog):
    def broken(gm, example_inputs):
        raise RuntimeError("this backend cannot compile")

    _, head, ids, feats = _setup("eagle3", "cpu")
    want = _drive(head, EagerHeadRunner(head), ids, feats, 0.0)
    torch._dynamo.reset()
    runner = StaticHeadRunner(head, max_len=96, cuda_graphs=False, compile=True, compile_backend=broken)
    with caplog.at_level(logging.WARNING, logger="specviz.methods.eagle.runner"):
        got = _drive(head, runner, ids, feats, 0.0)
    _assert_same_drafts(want, got)
    failed = [r for r in caplog.records if "torch.compile" in r.getMessage()]
    assert len(failed) == 1 and "cannot compile" in failed[0].getMessage() and not runner.compiled


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ("eagle", "eagle3"))
def test_compiled_head_graphs_equal_eager_on_gpu(kind):
    """fp32 on CUDA, inductor inside the runner's graphs: the greedy drafts equal the eager reference's (q and
    confidences to fusion rounding), every capture succeeded and compile stayed on."""
    _, head, ids, feats = _setup(kind, "cuda")
    want = _drive(head, EagerHeadRunner(head), ids, feats, 0.0)
    runner = StaticHeadRunner(head, max_len=96, compile=True)
    got = _drive(head, runner, ids, feats, 0.0)
    for step, ((w_ids, _, w_conf), (g_ids, _, g_conf)) in enumerate(zip(want, got)):
        assert g_ids == w_ids, step
        torch.testing.assert_close(g_conf, w_conf, rtol=1e-3, atol=1e-5)
    assert len(got) == len(PLAN) and runner.compiled and runner.replays > 0
    assert all(entry is not None for entry in runner.graphs.values()), runner.graphs.keys()


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", (0.0, 0.9), ids=("greedy", "sampled"))
@pytest.mark.parametrize("kind", ("eagle", "eagle3"))
def test_head_graphs_equal_eager_on_gpu(kind, temperature):
    """fp32 on CUDA: with captured graphs (draft step + padded first-pass buckets) the drafts, q and
    confidences equal the eager reference's; the graphs really ran (no capture failed)."""
    _, head, ids, feats = _setup(kind, "cuda")
    want = _drive(head, EagerHeadRunner(head), ids, feats, temperature)
    runner = StaticHeadRunner(head, max_len=96)
    assert runner.cuda_graphs
    got = _drive(head, runner, ids, feats, temperature)
    _assert_same_drafts(want, got)
    assert all(entry is not None for entry in runner.graphs.values()), runner.graphs.keys()
    assert ("step", 1) in runner.graphs and {("first", b) for b in (1, 2, 4, 8)} <= set(runner.graphs)
    assert runner.replays >= len(PLAN) * K - 2  # every draft step and first pass but the prefill's
    got_again = _drive(head, runner, ids, feats, temperature)  # a second request on the same graphs
    _assert_same_drafts(want, got_again)


@pytest.mark.gpu
def test_warm_up_captures_every_bucket_on_gpu():
    _, head, _, _ = _setup("eagle3", "cuda")
    runner = StaticHeadRunner(head, max_len=96)
    n = runner.warm_up(K + 1)
    assert n == 1 + sum(b <= K + 1 for b in BUCKETS) == len(runner.graphs)
