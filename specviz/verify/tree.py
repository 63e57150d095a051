"""A tree step's verification (greedy, rule A "topk", SpecInfer's rule B "sampled"; :mod:`specviz.sampling.tree`):
queued right behind the tree's target forward without a host wait, as CUDA graphs on CUDA for greedy and rule A."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specviz.record import PendingTreeDetail, tree_detail_rows
from specviz.sampling import logits_to_probs
from specviz.sampling.tree import (QueuedTreeVerify, TreeDecisions, _check, device_path, draw_tree_noise,
                                   pack_decisions, parent_rows, queue_verify_tree, tree_decisions)
from specviz.sampling.types import SamplerNoise
from specviz.transfer import HostCopy, pinned
from specviz.tree import validate_parents

from .spec import SamplingTensors, VerifySpec, graph_key, probs_from_tensors, write_inputs


def tree_rule_for(verify: str, tree_rule: str) -> str:
    """The tree verifier's rule for a request's ``verify`` and a draft's ``tree_rule``: greedy ->
    "greedy"; standard -> the draft's rule ("topk": rule A, "sampled": SpecInfer rule B).
    Raises ValueError for block (chain-only) and synthetic (per-chain-position rates)."""
    if verify == "greedy":
        return "greedy"
    if verify == "standard":
        if tree_rule not in ("topk", "sampled"):
            raise ValueError(f"a tree draft's tree_rule must be 'topk' or 'sampled', got {tree_rule!r}")
        return tree_rule
    if verify == "block":
        raise ValueError("verify='block' is chain-only (Sun et al. define block verification for one draft path); "
                         "a tree draft needs verify='standard' (or 'greedy' at temperature 0), or use a chain "
                         "(no speculative_token_tree)")
    raise ValueError(f"verify={verify!r} is not available for tree drafts (its rates are per chain position); use "
                     "verify='standard' or 'greedy', or a chain")


def tree_unit(key: VerifySpec, rule: str, logits: torch.Tensor, x: torch.Tensor, parents: torch.Tensor,
              noise: SamplerNoise | None, settings: SamplingTensors):
    """A tree verification's device work, as :meth:`StepVerifier.queue_tree` captures it (greedy / rule A):
    logits [1 + N, V], x int64 [N], parents int64 [N] (device), noise for (1, N, V) or None (greedy), the
    sampling values in ``settings`` (``key`` a :func:`graph_key`). Returns (p float32 [1 + N, V], the parent
    rows int64 [N], the :class:`~specviz.sampling.tree.TreeDecisions`, the packed decisions float64 [8N + 2],
    the next step's first input int64 [1], the kept rows int64 [1 + N]: :func:`~specviz.sampling.tree.device_path`)."""
    p = probs_from_tensors(logits, key, settings)
    rows = parent_rows(parents, int(x.numel()), p.device)
    d: TreeDecisions = tree_decisions(p, x, rows, rule, noise)
    next_input, kept = device_path(d.passed, rows, d.emit)
    return p, rows, d, pack_decisions(d, x), next_input, kept


@dataclass
class QueuedTreeStep:
    """A tree step's verification, queued (:meth:`StepVerifier.queue_tree`); device tensors valid until the
    verifier's next call.

    verify:     :class:`~specviz.sampling.tree.QueuedTreeVerify`: ``finish(parents)`` reads the one host copy
                and walks (the step's one wait).
    next_input: int64 [1] (device) the emitted token, the next step's first input (no host wait).
    kept_rows:  int64 [1 + N] (device) 0 (the root), then 1 + each accepted node in path order, then padding:
                the forward rows the commit keeps (:meth:`specviz.static_runner.StaticRunner.commit`) and whose
                features the proposer observes.
    detail:     the step's :class:`~specviz.record.PendingTreeDetail` (None unless ``spec.detailed``).
    backend:    "graph" (captured) or "eager".
    """

    verify: QueuedTreeVerify
    next_input: torch.Tensor
    kept_rows: torch.Tensor
    detail: PendingTreeDetail | None
    backend: str


@dataclass
class _TreeGraphs:
    core: torch.cuda.CUDAGraph
    logits: torch.Tensor
    x: torch.Tensor
    parents: torch.Tensor
    noise: SamplerNoise | None
    settings: SamplingTensors
    p: torch.Tensor
    rows: torch.Tensor
    decisions: TreeDecisions
    flat: torch.Tensor
    next_input: torch.Tensor
    kept: torch.Tensor
    host: torch.Tensor  # pinned float64, the packed decisions
    core_done: torch.cuda.Event
    detail: torch.cuda.CUDAGraph | None = None
    detail_flat: torch.Tensor | None = None
    n_top: int = 0




class TreeVerification:
    """:class:`~specviz.verify.verifier.StepVerifier`'s tree half (the verifier's shared replay helpers are its)."""

    @torch.inference_mode()
    def queue_tree(self, spec: VerifySpec, logits: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor,
                   parents: list[int] | torch.Tensor, tree_rule: str,
                   generator: torch.Generator | None) -> "QueuedTreeStep":
        """Queue a tree step's verification without a host wait (the engine queues it right behind the tree's
        target forward). logits: [1 + N, V] from the tree forward; q: [N, V] or None; x: int64 [N]; parents: a
        host list, or int64 [N] on the device (an EAGLE-2 tree, read before its host copy is).

        Greedy and rule A ("topk") on CUDA with the Triton backend run as CUDA graphs captured once per
        (N, rule, processors on) (:func:`tree_unit`: p, every node's decision, the walk's result on the device,
        the one host copy; the detail, :func:`~specviz.record.tree_detail_rows`, as a second graph on the side
        stream, as a chain's); rule B ("sampled", a host loop over the nodes), the CPU and the reference
        backend run the same functions eagerly. Noise: ``draw_noise(1, N, V)`` from ``generator`` (none for
        greedy), drawn eagerly in both, so both consume the generator alike. Returns a
        :class:`QueuedTreeStep` whose device tensors stay valid until this verifier's next call. Raises
        ValueError as :func:`tree_rule_for`, for shapes that do not match, or invalid host parents."""
        rule = tree_rule_for(spec.verify, tree_rule)
        N = int(x.numel())
        noise = None if rule == "greedy" else draw_tree_noise(N, spec.vocab, generator, self.device)
        if not (self.cuda_graphs and spec.backend == "triton" and rule != "sampled" and N > 0):
            p = logits_to_probs(logits, spec.temperature, spec.top_k, spec.top_p)  # [1 + N, V] float32
            sampled_q = q if rule == "sampled" else None
            queued = queue_verify_tree(p, x, parents, sampled_q, rule=rule, noise=noise)
            d = queued.decisions
            next_input, kept = device_path(d.passed, queued.rows, d.emit)
            detail = None
            if spec.detailed:
                flat, n_top = tree_detail_rows(p, sampled_q, x.long(), queued.rows, d.weights, d.emit)
                detail = PendingTreeDetail(HostCopy(flat), n_top, sampled_q is not None)
            return QueuedTreeStep(queued, next_input, kept, detail, "eager")
        host_parents = None if isinstance(parents, torch.Tensor) else validate_parents(parents)
        if host_parents is not None and len(host_parents) != N:
            raise ValueError(f"parents has {len(host_parents)} nodes; the draft has {N}")
        _check(logits, x, N, None, rule)
        main = self._before_replay()
        dev_parents = parents if host_parents is None else None
        if dev_parents is None:  # one pinned host-to-device copy of a static / n-gram tree's parents
            dev_parents = pinned(torch.tensor(host_parents, dtype=torch.long)).to(self.device, non_blocking=True)
        g = self._lookup(("tree", graph_key(spec), rule),
                         lambda key: self._capture_tree(key, spec, rule, logits, x, dev_parents, noise))
        write_inputs(g, spec, logits, x, noise)
        g.parents.copy_(dev_parents)
        copy = self._replay_units(g, main)
        detail = None if copy is None else PendingTreeDetail(copy, g.n_top, False)  # read when published
        queued = QueuedTreeVerify(N, rule, g.decisions, HostCopy.queued(g.host, g.core_done), host_parents, g.rows)
        return QueuedTreeStep(queued, g.next_input, g.kept, detail, "graph")

    def _capture_tree(self, key, spec: VerifySpec, rule: str, logits: torch.Tensor, x: torch.Tensor,
                      parents: torch.Tensor, noise: SamplerNoise | None) -> "_TreeGraphs":
        """Warm up (outside the capture) and capture one tree verification for ``key`` (its sampling values read
        from its SamplingTensors), then, for a detailed spec, the detail graph over the core's outputs."""
        t0 = time.perf_counter()
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        s_logits, s_x, s_parents = logits.float().clone(), x.long().clone(), parents.long().clone()
        s_noise = None if noise is None else SamplerNoise(u=noise.u.clone(), exp=noise.exp.clone())
        settings = SamplingTensors.empty(self.device)
        settings.write(spec)
        tkey = key[1]
        main = torch.cuda.current_stream(self.device)
        warm = torch.cuda.Stream(self.device)
        warm.wait_stream(main)
        with torch.cuda.stream(warm):
            for _ in range(2):
                tree_unit(tkey, rule, s_logits, s_x, s_parents, s_noise, settings)
        main.wait_stream(warm)
        core = torch.cuda.CUDAGraph()
        with torch.cuda.graph(core, pool=self._pool):
            p, rows, d, flat, next_input, kept = tree_unit(tkey, rule, s_logits, s_x, s_parents, s_noise, settings)
        self._pool = core.pool()
        g = _TreeGraphs(core, s_logits, s_x, s_parents, s_noise, settings, p, rows, d, flat, next_input, kept,
                        torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True), torch.cuda.Event())
        if spec.detailed:
            core.replay()
            warm.wait_stream(main)
            with torch.cuda.stream(warm):
                for _ in range(2):
                    tree_detail_rows(p, None, s_x, rows, d.weights, d.emit)
            main.wait_stream(warm)
            g.detail = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g.detail, pool=self._pool):
                g.detail_flat, g.n_top = tree_detail_rows(p, None, s_x, rows, d.weights, d.emit)
        torch.cuda.synchronize(self.device)
        self.capture_s += time.perf_counter() - t0
        return g

