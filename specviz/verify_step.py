"""Everything a verification step does after the target's forward, in two units.

    core:   p       = logits_to_probs(logits)                     # [k'+1, V] float32
            out     = rejection_sample(p, q, x, noise)            # accepted + recovered/bonus
            tokens  = output ids, num_accepted, draft ids         # what the engine needs to go on
            next_in = out.output_token_ids[num_accepted]          # next step's first input, on the device
    detail: the rest of the trace's step record (top-20s of p, q, residuals, emitted distribution,
            per-position decisions, block P/rho/h/eta), gathered and packed on the device

:class:`StepVerifier` runs both eagerly (CPU, or the reference sampler), or, on CUDA with the
Triton sampler, as two CUDA graphs captured once per :func:`graph_key` of a :class:`VerifySpec`
(draft length k', verification rule, q kind, which logits processors are on). The sampling values
themselves (1/temperature, top-p's cut, top-k's index) are device tensors the graphs read
(:class:`SamplingTensors`), so one graph serves every temperature, top-p and top-k; the cache keeps
at most ``max_graphs`` pairs (least recently used evicted: synthetic rates stay in the key). On CUDA the core's packed tokens come back in one non-blocking copy
into pinned memory followed by one event wait: the step's only synchronisation with the GPU. The
detail graph and its own copy run on a side stream behind the core, overlapping the next step's
drafting and target forward; it is collected (:meth:`PendingDetail.result`) by the verifier before its
next replay or by the engine when it publishes the step, while the GPU is busy, so tracing adds little to
the step time.

The noise (uniforms u and the exponential race's E) is drawn eagerly from the request's generator
before the replay, exactly as :func:`~specviz.sampling.types.draw_noise` draws it, so the captured
and the eager units consume the generator identically and return bit-identical records.
Design after gpt-fast (static buffers + graph replay) and vLLM ``v1/sample/rejection_sampler.py``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np
import torch

from .graphs import replay
from .record import Layout, PendingTreeDetail, gather_core, gather_detail, pack, tree_detail_rows, unpack
from .sampling import logits_to_probs, rejection_sample
from .sampling.tree import (QueuedTreeVerify, TreeDecisions, TreeVerifyOutput, _check, device_path, draw_tree_noise,
                            pack_decisions, parent_rows, queue_verify_tree, tree_decisions)
from .sampling.types import RejectionOutput, SamplerNoise, draw_noise
from .transfer import HostCopy, pinned
from .tree import validate_parents


@dataclass(frozen=True)
class VerifySpec:
    """What fixes a step's computation (one pair of CUDA graphs each).

    k: draft length k' of this step (>= 0); vocab: V; verify: "greedy" | "standard" | "block" |
    "synthetic"; temperature / top_k / top_p: as :func:`~specviz.sampling.logits_to_probs`;
    full_q: the draft came with probabilities q [k', V] (False: one-hot q at the draft ids);
    detailed: also gather the detail record; synthetic_rates: unconditional rates for verify
    "synthetic"; backend: "reference" | "triton".
    """

    k: int
    vocab: int
    verify: str
    temperature: float
    top_k: int | None
    top_p: float | None
    full_q: bool
    detailed: bool
    synthetic_rates: tuple[float, ...] | None
    backend: str
    typical: tuple[float, float] | None = None  # verify "typical" (lossy): (epsilon, delta), sampling/typical.py


def graph_key(spec: VerifySpec) -> VerifySpec:
    """The part of ``spec`` that fixes a captured graph: the sampling values are replaced by
    whether each processor is on (temperature > 0, top-k > 0, top-p < 1), since the graph reads
    the values from :class:`SamplingTensors`."""
    return replace(spec, temperature=float(spec.temperature > 0), top_k=1 if spec.top_k else None,
                   top_p=0.5 if spec.top_p is not None and spec.top_p < 1.0 else None)


@dataclass
class SamplingTensors:
    """A request's sampling values as device tensors, read by the captured graphs.

    inv_temperature: float32 [1], float32(1 / T) (T > 0); top_p_cut: float32 [1], float32(1 - top_p),
    HF TopPLogitsWarper's threshold on the ascending cumulative mass; top_k_index: int64 [1],
    min(top_k, V) - 1 (the k-th largest logit's rank).
    """

    inv_temperature: torch.Tensor
    top_p_cut: torch.Tensor
    top_k_index: torch.Tensor
    values: tuple | None = None  # last written (host), to skip unchanged writes

    @classmethod
    def empty(cls, device: torch.device) -> "SamplingTensors":
        f = torch.ones(2, dtype=torch.float32, device=device)
        return cls(f[0:1], f[1:2], torch.zeros(1, dtype=torch.int64, device=device))

    def write(self, spec: VerifySpec) -> None:
        """Set the values for ``spec`` (three fill kernels, no host wait; nothing if unchanged)."""
        values = (float(np.float32(1.0 / spec.temperature)) if spec.temperature > 0 else 1.0,
                  float(np.float32(1.0 - spec.top_p)) if spec.top_p is not None else 0.0,
                  min(spec.top_k, spec.vocab) - 1 if spec.top_k else 0)
        if values != self.values:
            self.inv_temperature.fill_(values[0])
            self.top_p_cut.fill_(values[1])
            self.top_k_index.fill_(values[2])
            self.values = values


def probs_from_tensors(logits: torch.Tensor, key: VerifySpec, s: SamplingTensors) -> torch.Tensor:
    """:func:`~specviz.sampling.logits_to_probs` with the values read from device tensors (so a CUDA
    graph captured once serves every value): logits [R, V] -> float32 [R, V]. ``key`` says which
    processors are on (:func:`graph_key`). Same order and tie rules as HF's warpers; temperature
    scales by the float32 reciprocal (as CUDA's division by a host scalar does), the k-th largest
    logit comes from a full descending sort instead of ``topk`` (the same value)."""
    x = logits.float()  # [R, V]
    if key.temperature == 0:
        return torch.zeros_like(x).scatter_(-1, x.argmax(dim=-1, keepdim=True), 1.0)
    x = x * s.inv_temperature
    if key.top_k:
        kth = x.sort(dim=-1, descending=True).values.gather(-1, s.top_k_index.expand(x.shape[0], 1))  # [R, 1]
        x = x.masked_fill(x < kth, float("-inf"))
    if key.top_p is not None:
        sorted_logits, sorted_idx = torch.sort(x, dim=-1, descending=False)  # [R, V]
        remove_sorted = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= s.top_p_cut
        remove_sorted[..., -1:] = False  # min_tokens_to_keep = 1
        x = x.masked_fill(remove_sorted.scatter(-1, sorted_idx, remove_sorted), float("-inf"))
    return torch.softmax(x, dim=-1)


def _core(spec: VerifySpec, logits: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor,
          noise: SamplerNoise | None, settings: SamplingTensors | None = None,
          ) -> tuple[torch.Tensor, Layout, torch.Tensor, RejectionOutput, torch.Tensor]:
    """logits: [k'+1, V] float; q: float32 [k', V] or None; x: int64 [k']; noise: SamplerNoise for
    [1, k', V] or None (greedy); settings: the sampling values as device tensors (``spec`` is then
    a :func:`graph_key`), or None (``spec``'s own values, :func:`logits_to_probs`). Returns (packed
    tokens float64 [2k'+2], layout, next input int64 [1], the sampler's output, p float32 [k'+1, V]),
    all on logits' device."""
    if settings is None:
        p = logits_to_probs(logits, spec.temperature, spec.top_k, spec.top_p)  # [k'+1, V] float32
    else:
        p = probs_from_tensors(logits, spec, settings)
    if spec.verify == "typical":  # Medusa's lossy rule (reference only; the engine never captures it)
        from .sampling.typical import typical_sample

        out = typical_sample(p[None], x[None], *spec.typical, noise=noise)
    elif spec.backend == "triton":  # arguments were validated by an eager call first (see _capture)
        from specviz.kernels.rejection_sampler import rejection_sample_triton

        out = rejection_sample_triton(p[None], None if q is None else q[None], x[None], method=spec.verify,
                                      noise=noise, synthetic_rates=spec.synthetic_rates)
    else:
        out = rejection_sample(p[None], None if q is None else q[None], x[None], method=spec.verify,
                               noise=noise, synthetic_rates=spec.synthetic_rates, backend=spec.backend)
    flat, layout = pack(gather_core(out, x))
    next_input = out.output_token_ids[0].gather(0, out.num_accepted[:1].clamp(max=spec.k))  # [1]
    return flat, layout, next_input, out, p


class PendingDetail:
    """The detail record of one step, possibly still being computed and copied on the GPU."""

    def __init__(self, layout: Layout, host: torch.Tensor | list[float], done: torch.cuda.Event | None = None):
        self._layout, self._host, self._done = layout, host, done
        self._value: dict[str, list] | None = None

    def result(self) -> dict[str, list]:
        """Wait for the copy (if any) and return the record as nested host lists (see
        :func:`specviz.record.unpack`). The verifier reads it itself before it reuses the buffer."""
        if self._value is None:
            if self._done is not None:
                self._done.synchronize()
            values = self._host if isinstance(self._host, list) else self._host.tolist()
            self._value = unpack(values, self._layout)
        return self._value


@dataclass
class _Graphs:
    core: torch.cuda.CUDAGraph
    logits: torch.Tensor
    q: torch.Tensor | None
    x: torch.Tensor
    noise: SamplerNoise | None
    flat: torch.Tensor
    layout: Layout
    next_input: torch.Tensor
    host: torch.Tensor  # pinned float64, the core's packed tokens
    core_done: torch.cuda.Event
    settings: SamplingTensors
    detail: torch.cuda.CUDAGraph | None = None
    detail_flat: torch.Tensor | None = None
    detail_layout: Layout = ()
    detail_host: torch.Tensor | None = None  # pinned float64
    keep: tuple = ()  # the core's outputs the detail graph reads (sampler output, p)


def _write_inputs(g, spec: VerifySpec, logits: torch.Tensor, x: torch.Tensor, noise) -> None:
    """Copy a step's inputs into a captured chain or tree graph's static buffers (its settings, logits, draft
    tokens and, when it has them, the noise); the caller copies what only one kind has (q, parents)."""
    g.settings.write(spec)
    g.logits.copy_(logits)
    g.x.copy_(x)
    if g.noise is not None:
        g.noise.u.copy_(noise.u)
        g.noise.exp.copy_(noise.exp)


class StepVerifier:
    """Verifies the steps of one request at a time (the engine pools one per target runner).

    Args:
        device: where logits live.
        cuda_graphs: capture the units as CUDA graphs (default: on CUDA; used only with backend
            "triton", since the reference sampler synchronises with the host).
        max_graphs: most captured (core, detail) pairs kept; the least recently used is dropped.
    Attributes:
        graph_events: set to a list to collect (start, end) CUDA events around every replay
            (core and detail; the detail's run on the side stream).
    """

    def __init__(self, device: torch.device, cuda_graphs: bool | None = None, max_graphs: int = 64):
        self.device = torch.device(device)
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        self.max_graphs = int(max_graphs)
        self._graphs: OrderedDict[VerifySpec, _Graphs] = OrderedDict()  # by graph_key, least recent first
        self._pool = None
        self._side: torch.cuda.Stream | None = None
        self._detail_done: torch.cuda.Event | None = None  # the last detail enqueued on the side stream
        self._pending: PendingDetail | None = None
        self.graph_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] | None = None
        self.capture_s = 0.0  # seconds spent in _capture so far (the engine excludes it from step times)

    @torch.inference_mode()
    def run(self, spec: VerifySpec, logits: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor,
            generator: torch.Generator | None) -> tuple[dict[str, list], torch.Tensor, str, PendingDetail | None]:
        """Verify one step. logits: [k'+1, V] float32 on ``device``; q: [k', V] or None; x: int64 [k'].

        Returns (the core record as host lists: "output" [k'+1], "num_accepted" [1], "draft" [k'];
        the next step's first input, int64 [1] on the device; the sampler backend that ran; the
        detail record, None unless ``spec.detailed``). Collect the PendingDetail before the next
        call. Raises ValueError for invalid sampler inputs (from the sampler's validation)."""
        noise = None if spec.verify == "greedy" else draw_noise(1, spec.k, spec.vocab, generator=generator,
                                                                device=self.device)
        if not (self.cuda_graphs and spec.backend == "triton"):
            settings = None  # Triton on CUDA: the graphs' processing, so both paths give equal records
            if spec.backend == "triton" and self.device.type == "cuda":
                settings = SamplingTensors.empty(self.device)
                settings.write(spec)
            key = graph_key(spec) if settings is not None else spec
            flat, layout, next_input, out, p = _core(key, logits, q, x, noise, settings)
            core = unpack(flat.cpu().tolist(), layout)
            detail = None
            if spec.detailed:
                dflat, dlayout = pack(gather_detail(out, p, q, x))
                detail = PendingDetail(dlayout, dflat.cpu().tolist())
            return core, next_input, out.backend, detail
        main = self._before_replay()
        g = self._lookup(spec, lambda key: self._capture(key, spec, logits, q, x, noise))
        _write_inputs(g, spec, logits, x, noise)
        if g.q is not None:
            g.q.copy_(q)
        done = self._replay_units(g, main)
        detail = None
        if done is not None:  # collected next step
            detail = self._pending = PendingDetail(g.detail_layout, g.detail_host, done)
        g.core_done.synchronize()  # the step's one wait on the GPU
        return unpack(g.host.tolist(), g.layout), g.next_input.clone(), "triton", detail

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
        _write_inputs(g, spec, logits, x, noise)
        g.parents.copy_(dev_parents)
        done = self._replay_units(g, main)
        detail = None
        if done is not None:  # read when the step is published
            detail = self._pending = PendingTreeDetail(HostCopy.queued(g.detail_host, done), g.n_top, False)
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
            g.detail_host = torch.empty(g.detail_flat.shape, dtype=torch.float64, pin_memory=True)
        torch.cuda.synchronize(self.device)
        self.capture_s += time.perf_counter() - t0
        return g

    def _before_replay(self) -> torch.cuda.Stream:
        """Before any replay (returns the current stream): the previous step's detail is read out of its pinned
        buffer (no wait once collected), and the main stream waits for the side stream's last detail (every
        graph shares one memory pool: two of them never overlap)."""
        main = torch.cuda.current_stream(self.device)
        if self._pending is not None:
            self._pending.result()
            self._pending = None
        if self._detail_done is not None:
            main.wait_event(self._detail_done)
        return main

    def _replay_units(self, g, main: torch.cuda.Stream) -> "torch.cuda.Event | None":
        """Replay ``g``'s core (a chain's :class:`_Graphs` or a tree's :class:`_TreeGraphs`) and queue its host
        copy; then its detail graph and copy on the side stream, behind the core. Returns the detail's event
        (None without a detail graph)."""
        self._replay(g.core)
        g.host.copy_(g.flat, non_blocking=True)
        g.core_done.record(main)
        if g.detail is None:
            return None
        with torch.cuda.stream(self._side):
            self._side.wait_event(g.core_done)
            self._replay(g.detail)
            g.detail_host.copy_(g.detail_flat, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._side)
        self._detail_done = done
        return done

    def _lookup(self, spec_or_key, capture):
        """The graphs for a chain's ``graph_key(spec)`` (given the spec) or a tree's key ``("tree", graph_key,
        rule)``, captured by ``capture(key)`` on a miss; keeps at most ``max_graphs`` (drops the least recently
        used: its memory returns to the shared pool)."""
        key = graph_key(spec_or_key) if isinstance(spec_or_key, VerifySpec) else spec_or_key
        g = self._graphs.get(key)
        if g is None:
            g = self._graphs[key] = capture(key)
            while len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        return g

    def _replay(self, graph: torch.cuda.CUDAGraph) -> None:
        replay(graph, self.graph_events)  # timed between CUDA events when graph_events is a list (benchmarks)

    def _capture(self, key, spec, logits, q, x, noise) -> _Graphs:
        """Validate through the public sampler once (eagerly, with ``spec``'s values), warm up
        (Triton compiles), capture the core for ``key`` (reading the values from its
        SamplingTensors); run it once so the detail's warm-up reads valid tokens; capture the detail."""
        t0 = time.perf_counter()
        rejection_sample(logits_to_probs(logits, spec.temperature, spec.top_k, spec.top_p)[None],
                         None if q is None else q[None], x[None], method=spec.verify, noise=noise,
                         synthetic_rates=spec.synthetic_rates, backend="triton")
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        s_logits, s_x = logits.clone(), x.clone()
        s_q = None if q is None else q.clone()
        s_noise = None if noise is None else SamplerNoise(u=noise.u.clone(), exp=noise.exp.clone())
        settings = SamplingTensors.empty(self.device)
        settings.write(spec)
        main = torch.cuda.current_stream(self.device)
        warm = torch.cuda.Stream(self.device)
        warm.wait_stream(main)
        with torch.cuda.stream(warm):
            for _ in range(2):  # allocator, lazy init, Triton compilation: outside the capture
                _core(key, s_logits, s_q, s_x, s_noise, settings)
        main.wait_stream(warm)
        core = torch.cuda.CUDAGraph()
        with torch.cuda.graph(core, pool=self._pool):
            flat, layout, next_input, out, p = _core(key, s_logits, s_q, s_x, s_noise, settings)
        self._pool = core.pool()
        g = _Graphs(core, s_logits, s_q, s_x, s_noise, flat, layout, next_input,
                    torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True), torch.cuda.Event(), settings)
        if key.detailed:
            core.replay()  # out and p now hold real values
            warm.wait_stream(main)
            with torch.cuda.stream(warm):
                for _ in range(2):
                    gather_detail(out, p, s_q, s_x)
            main.wait_stream(warm)
            g.detail = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g.detail, pool=self._pool):
                g.detail_flat, g.detail_layout = pack(gather_detail(out, p, s_q, s_x))
            g.detail_host = torch.empty(g.detail_flat.shape, dtype=torch.float64, pin_memory=True)
            g.keep = (out, p)
        torch.cuda.synchronize(self.device)
        self.capture_s += time.perf_counter() - t0
        return g


# ---- tree drafts ---------------------------------------------------------------------------------
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
    detail_host: torch.Tensor | None = None  # pinned float64
    n_top: int = 0


def verify_tree_step(spec: VerifySpec, logits: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor,
                     parents: list[int], tree_rule: str,
                     generator: torch.Generator | None) -> tuple[TreeVerifyOutput, torch.Tensor]:
    """Verify a tree draft eagerly (the PyTorch reference :func:`~specviz.sampling.tree.verify_tree`; no CUDA
    graph). logits: [1 + N, V] from the tree forward; q: [N, V] or None; x: int64 [N]. Returns (the verifier's
    output, p float32 [1 + N, V]). Noise: ``draw_noise(1, N, V)`` from ``generator`` (none for greedy), as
    :meth:`StepVerifier.queue_tree` draws it. Raises ValueError as :func:`tree_rule_for`."""
    rule = tree_rule_for(spec.verify, tree_rule)
    p = logits_to_probs(logits, spec.temperature, spec.top_k, spec.top_p)  # [1 + N, V] float32
    noise = None if rule == "greedy" else draw_noise(1, x.numel(), spec.vocab, generator=generator, device=p.device)
    return queue_verify_tree(p, x, parents, q if rule == "sampled" else None, rule=rule, noise=noise).finish(), p
