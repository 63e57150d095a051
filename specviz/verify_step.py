"""Everything a verification step does after the target's forward, as one unit.

    p       = logits_to_probs(logits)                      # [k'+1, V] float32
    out     = rejection_sample(p, q, x, noise)             # accepted + recovered/bonus
    record  = gather_step(out, p, q, x) packed to float64  # the trace's step record, on the device
    next_in = out.output_token_ids[num_accepted]           # the next step's first input, on the device

:class:`StepVerifier` runs that unit eagerly (CPU, or the reference sampler), or, on CUDA with the
Triton sampler, as a CUDA graph captured once per :class:`VerifySpec` (draft length k' and the
request's sampling settings) and replayed every step. Either way the packed record reaches the
host in one device-to-host copy (on CUDA: a non-blocking copy into a pinned buffer, then one wait
on an event), which is the step's only synchronisation with the GPU.

The noise (uniforms u and the exponential race's E) is drawn eagerly from the request's generator
before the replay, exactly as :func:`~specviz.sampling.types.draw_noise` draws it, so the captured
and the eager unit consume the generator identically and return bit-identical records.
Design after gpt-fast (static buffers + graph replay) and vLLM ``v1/sample/rejection_sampler.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .record import Layout, gather_step, pack, unpack
from .sampling import logits_to_probs, rejection_sample
from .sampling.types import RejectionOutput, SamplerNoise, draw_noise


@dataclass(frozen=True)
class VerifySpec:
    """What fixes a step's computation (one CUDA graph each).

    k: draft length k' of this step (>= 0); vocab: V; verify: "greedy" | "standard" | "block" |
    "synthetic"; temperature / top_k / top_p: as :func:`~specviz.sampling.logits_to_probs`;
    full_q: the draft came with probabilities q [k', V] (False: one-hot q at the draft ids);
    detailed: gather the full record (top-20s, residuals) or only tokens and counts;
    synthetic_rates: unconditional rates for verify "synthetic"; backend: "reference" | "triton".
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


def _compute(spec: VerifySpec, logits: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor,
             noise: SamplerNoise | None) -> tuple[torch.Tensor, Layout, torch.Tensor, RejectionOutput]:
    """The unit itself. logits: [k'+1, V] float; q: float32 [k', V] or None; x: int64 [k'];
    noise: SamplerNoise for [1, k', V] or None (greedy). Returns (packed record float64 [n],
    its layout, next input token int64 [1], the sampler's output), all on logits' device."""
    p = logits_to_probs(logits, spec.temperature, spec.top_k, spec.top_p)  # [k'+1, V] float32
    if spec.backend == "triton":  # arguments were validated by the eager first call (see StepVerifier)
        from kernels.rejection_sampler import rejection_sample_triton

        out = rejection_sample_triton(p[None], None if q is None else q[None], x[None], method=spec.verify,
                                      noise=noise, synthetic_rates=spec.synthetic_rates)
    else:
        out = rejection_sample(p[None], None if q is None else q[None], x[None], method=spec.verify,
                               noise=noise, synthetic_rates=spec.synthetic_rates, backend=spec.backend)
    flat, layout = pack(gather_step(out, p, q, x, detailed=spec.detailed))
    next_input = out.output_token_ids[0].gather(0, out.num_accepted[:1].clamp(max=spec.k))  # [1]
    return flat, layout, next_input, out


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor
    q: torch.Tensor | None
    x: torch.Tensor
    noise: SamplerNoise | None
    flat: torch.Tensor
    layout: Layout
    next_input: torch.Tensor
    host: torch.Tensor  # pinned float64 [n]
    done: torch.cuda.Event


class StepVerifier:
    """Runs :func:`_compute` for one request at a time (pool one per target runner).

    Args:
        device: where logits live.
        cuda_graphs: capture one CUDA graph per :class:`VerifySpec` (default: on CUDA, used only
            with backend "triton"; the reference sampler synchronises with the host).
    Attributes:
        graph_events: set to a list to collect (start, end) CUDA events around every replay.
    """

    def __init__(self, device: torch.device, cuda_graphs: bool | None = None):
        self.device = torch.device(device)
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        self._graphs: dict[VerifySpec, _Graph] = {}
        self._pool = None
        self.graph_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] | None = None

    @torch.inference_mode()
    def run(self, spec: VerifySpec, logits: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor,
            generator: torch.Generator | None) -> tuple[dict[str, list], torch.Tensor, str]:
        """Verify one step. logits: [k'+1, V] float32 on ``device``; q: [k', V] or None; x: int64 [k'].

        Returns (the step record as nested host lists, see :func:`specviz.record.unpack`; the next
        step's first input token, int64 [1] on the device; the sampler backend that ran).
        Raises ValueError for invalid sampler inputs (from the sampler's validation)."""
        noise = None if spec.verify == "greedy" else draw_noise(1, spec.k, spec.vocab, generator=generator,
                                                                device=self.device)
        if not (self.cuda_graphs and spec.backend == "triton"):
            flat, layout, next_input, out = _compute(spec, logits, q, x, noise)
            return unpack(flat.cpu().tolist(), layout), next_input, out.backend
        g = self._graphs.get(spec)
        if g is None:
            g = self._graphs[spec] = self._capture(spec, logits, q, x, noise)
        g.logits.copy_(logits)
        g.x.copy_(x)
        if g.q is not None:
            g.q.copy_(q)
        if g.noise is not None:
            g.noise.u.copy_(noise.u)
            g.noise.exp.copy_(noise.exp)
        if self.graph_events is not None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.graph.replay()
            end.record()
            self.graph_events.append((start, end))
        else:
            g.graph.replay()
        g.host.copy_(g.flat, non_blocking=True)  # the step's one device-to-host copy
        g.done.record()
        g.done.synchronize()
        return unpack(g.host.tolist(), g.layout), g.next_input.clone(), "triton"

    def _capture(self, spec, logits, q, x, noise) -> _Graph:
        """Validate through the public sampler once (eagerly), warm up (Triton compiles), capture."""
        rejection_sample(logits_to_probs(logits, spec.temperature, spec.top_k, spec.top_p)[None],
                         None if q is None else q[None], x[None], method=spec.verify, noise=noise,
                         synthetic_rates=spec.synthetic_rates, backend="triton")
        s_logits, s_x = logits.clone(), x.clone()
        s_q = None if q is None else q.clone()
        s_noise = None if noise is None else SamplerNoise(u=noise.u.clone(), exp=noise.exp.clone())
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                _compute(spec, s_logits, s_q, s_x, s_noise)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            flat, layout, next_input, _ = _compute(spec, s_logits, s_q, s_x, s_noise)
        self._pool = graph.pool()
        host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        return _Graph(graph, s_logits, s_q, s_x, s_noise, flat, layout, next_input, host, torch.cuda.Event())
