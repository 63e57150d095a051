"""The tree verifier's fixed-shape unit (a tree step's host work): what the step verifier captures as CUDA
graphs equals the PyTorch reference.

- :func:`specviz.sampling.tree.device_path` (the walk's result by device ops: the emitted token and the kept rows)
  equals the host walk of :meth:`QueuedTreeVerify.finish` on random trees, duplicate and out-of-range tokens included;
- :func:`specviz.verify.tree.tree_unit` (p from the sampling tensors, every node's decision, the packed decisions)
  equals :func:`specviz.sampling.tree.queue_verify_tree` over :func:`logits_to_probs`, for greedy and rule A with
  temperature, top-k and top-p;
- on CUDA, :meth:`StepVerifier.queue_tree` replayed from its graphs (device and host parents, detail included)
  equals the same verifier run eagerly, a detail read after the next step's replay included.
"""

from __future__ import annotations

import random

import pytest
import torch

from specviz import tree as T
from specviz.sampling import logits_to_probs
from specviz.sampling.tree import device_path, draw_tree_noise, queue_verify_tree
from specviz.verify import SamplingTensors, StepVerifier, VerifySpec, graph_key
from specviz.verify.tree import tree_unit

V = 16


def _random_tree(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(-1, i) for i in range(n)]


def _random_case(seed: int, n: int):
    rng = random.Random(seed)
    parents = _random_tree(rng, n)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n + 1, V, generator=g) * 3
    p = logits_to_probs(logits, 0.0)
    ids = []
    for i, par in enumerate(parents):  # mostly the parent's argmax (deep accepted paths), some duplicates and bad ids
        r = rng.random()
        ids.append(int(p[par + 1].argmax()) if r < 0.6 else (-1 if r < 0.65 else V if r < 0.7 else rng.randrange(V)))
    return parents, logits, torch.tensor(ids, dtype=torch.long), g


@pytest.mark.parametrize("rule", ["greedy", "topk"])
def test_device_path_equals_the_host_walk(rule):
    checked_deep = 0
    for seed in range(150):
        n = 1 + seed % 20
        parents, logits, ids, g = _random_case(seed, n)
        p = logits_to_probs(logits, 0.0 if rule == "greedy" else 0.7)
        noise = None if rule == "greedy" else draw_tree_noise(n, V, g)
        queued = queue_verify_tree(p, ids, parents, rule=rule, noise=noise)
        out = queued.finish()
        token, kept = device_path(queued.decisions.passed, queued.rows, queued.decisions.emit)
        assert int(token) == out.token_id, seed
        assert kept.tolist() == [0, *(1 + c for c in out.path)] + [n] * (n - len(out.path)), seed
        checked_deep += len(out.path) >= 2
    assert checked_deep >= 10  # the cases reach past the first level


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, None, None), (0.8, None, None), (1.0, 5, None),
                                                     (0.7, None, 0.9), (1.3, 4, 0.8)])
@pytest.mark.parametrize("device_parents", [False, True])
def test_tree_unit_equals_the_reference(temperature, top_k, top_p, device_parents):
    rule = "greedy" if temperature == 0 else "topk"
    for seed in range(20):
        n = 2 + seed % 12
        parents, logits, ids, g = _random_case(100 + seed, n)
        spec = VerifySpec(k=n, vocab=V, verify="greedy" if rule == "greedy" else "standard", temperature=temperature,
                          top_k=top_k, top_p=top_p, full_q=False, detailed=True, synthetic_rates=None,
                          backend="triton")
        noise = None if rule == "greedy" else draw_tree_noise(n, V, g)
        settings = SamplingTensors.empty(torch.device("cpu"))
        settings.write(spec)
        par = torch.tensor(parents)
        p, rows, d, flat, token, kept = tree_unit(graph_key(spec), rule, logits, ids, par, noise, settings)
        ref_p = logits_to_probs(logits, temperature, top_k, top_p)
        ref = queue_verify_tree(ref_p, ids, par if device_parents else parents, rule=rule, noise=noise)
        torch.testing.assert_close(p, ref_p, rtol=1e-6, atol=1e-7)
        # decisions, emitted tokens and ids exactly; p, q, u, the acceptance probabilities to float32 rounding (T > 0:
        # the graph scales by float32(1 / T), the reference divides; r = p / (1 - removed) amplifies the difference)
        torch.testing.assert_close(flat[:4 * n + 2], ref.copy._host[:4 * n + 2], rtol=0, atol=0)
        torch.testing.assert_close(flat[4 * n + 2:], ref.copy._host[4 * n + 2:], rtol=1e-4, atol=1e-7)
        out = ref.finish(parents)
        assert int(token) == out.token_id and kept.tolist()[: 1 + len(out.path)] == [0, *(1 + c for c in out.path)]


def _spec(n: int, temperature: float, detailed: bool = True) -> VerifySpec:
    return VerifySpec(k=n, vocab=V, verify="greedy" if temperature == 0 else "standard", temperature=temperature,
                      top_k=None, top_p=None, full_q=False, detailed=detailed, synthetic_rates=None, backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("device_parents", [False, True])
def test_tree_verifier_graphs_equal_eager_on_cuda(temperature, device_parents):
    """The captured tree verification (core and detail graphs) equals the eager one; the verifier replays the same
    graph for trees of one size and keeps a step's detail readable after the next step's replay."""
    cuda = torch.device("cuda")
    graphs, eager = StepVerifier(cuda), StepVerifier(cuda, cuda_graphs=False)
    assert graphs.cuda_graphs
    results = []
    for seed in range(6):
        n = 12 if seed < 4 else 7  # two sizes: graphs are captured per size and reused
        parents, logits, ids, _ = _random_case(300 + seed, n)
        logits, ids = logits.to(cuda), ids.to(cuda)
        par = torch.tensor(parents, device=cuda) if device_parents else parents
        spec = _spec(n, temperature)
        outs = []
        for verifier in (graphs, eager):
            gen = torch.Generator(device=cuda).manual_seed(seed)
            q = verifier.queue_tree(spec, logits, None, ids, par, "topk", gen)
            out = q.verify.finish(parents)
            outs.append((q, out, int(q.next_input), q.kept_rows.tolist()))
        (qg, og, tg, kg), (qe, oe, te, ke) = outs
        assert qg.backend == "graph" and qe.backend == "eager"
        assert (og.path, og.token_id, og.fate) == (oe.path, oe.token_id, oe.fate) and tg == te == og.token_id
        assert kg == ke
        results.append((qg.detail, qe.detail.result()))
    for pending, want in results:  # each graph detail was read before the next replay overwrote its buffer
        torch.testing.assert_close(torch.tensor(pending.result()), torch.tensor(want), rtol=1e-5, atol=1e-6)
    assert len([k for k in graphs.graphs if k[0] == "tree"]) == 2
