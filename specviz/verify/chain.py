"""A chain step's verification, in two units (run eagerly, or as two CUDA graphs on CUDA with the Triton sampler).

    core:   p       = logits_to_probs(logits)                     # [k'+1, V] float32
            out     = rejection_sample(p, q, x, noise)            # accepted + recovered/bonus
            tokens  = output ids, num_accepted, draft ids         # what the engine needs to go on
            next_in = out.output_token_ids[num_accepted]          # next step's first input, on the device
    detail: the rest of the trace's step record (top-20s of p, q, residuals, emitted distribution,
            per-position decisions, block P/rho/h/eta), gathered and packed on the device

The graphs are captured once per :func:`~specviz.verify.spec.graph_key` (draft length k', rule, q kind, which
processors are on). On CUDA the core's packed tokens come back in one non-blocking copy into pinned memory followed
by one event wait: the step's only synchronisation with the GPU. The detail graph and its copy run on a side stream
behind the core, overlapping the next step's drafting and target forward. The noise (uniforms u and the exponential
race's E) is drawn eagerly from the request's generator before the replay, exactly as
:func:`~specviz.sampling.types.draw_noise` draws it, so the captured and the eager units consume the generator
identically and return bit-identical records. Design after gpt-fast (static buffers + graph replay) and vLLM
``v1/sample/rejection_sampler.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from specviz.record import Layout, gather_core, gather_detail, pack, unpack
from specviz.sampling import logits_to_probs, rejection_sample
from specviz.sampling.types import RejectionOutput, SamplerNoise, draw_noise
from specviz.transfer import HostCopy

from .spec import SamplingTensors, VerifySpec, graph_key, probs_from_tensors, write_inputs


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
        from specviz.sampling.typical import typical_sample

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
    """The detail record of one step, possibly still being computed and copied on the GPU: ``copy`` a
    :class:`~specviz.transfer.HostCopy` of the packed record (this step's own buffer: read it any time)."""

    def __init__(self, layout: Layout, copy: HostCopy):
        self._layout, self._copy = layout, copy
        self._value: dict[str, list] | None = None

    def result(self) -> dict[str, list]:
        """Wait for the copy (if it has not finished) and return the record as nested host lists (see
        :func:`specviz.record.unpack`)."""
        if self._value is None:
            self._value, self._copy = unpack(self._copy.tolist(), self._layout), None  # the pinned buffer goes back
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
    keep: tuple = ()  # the core's outputs the detail graph reads (sampler output, p)



@dataclass
class QueuedChain:
    """A chain step's verification, queued: :meth:`core` waits for its tokens (the step's one wait) and returns them
    as host lists ("output" [k'+1], "num_accepted" [1], "draft" [k']); ``next_input`` int64 [1] (device);
    ``backend`` the sampler that ran; ``detail`` the :class:`PendingDetail` (None unless the spec is detailed).
    Read :meth:`core` before the verifier's next call (a graph's host buffer is reused)."""

    next_input: torch.Tensor
    backend: str
    detail: "PendingDetail | None"
    _core: dict[str, list] | None = None
    _graphs: "_Graphs | None" = None

    def core(self) -> dict[str, list]:
        if self._core is None:
            self._graphs.core_done.synchronize()  # the step's one wait on the GPU
            self._core = unpack(self._graphs.host.tolist(), self._graphs.layout)
        return self._core


class ChainVerification:
    """:class:`~specviz.verify.verifier.StepVerifier`'s chain half (the verifier's shared replay helpers are its)."""

    @torch.inference_mode()
    def queue_chain(self, spec: VerifySpec, logits: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor,
                    generator: torch.Generator | None) -> QueuedChain:
        """Queue one chain step. logits: [k'+1, V] float32 on ``device``; q: [k', V] or None; x: int64 [k'].
        Raises ValueError for invalid sampler inputs (from the sampler's validation)."""
        noise = None if spec.verify == "greedy" else draw_noise(1, spec.k, spec.vocab, generator=generator,
                                                                device=self.device)
        if not (self.cuda_graphs and spec.backend == "triton"):
            settings = None  # Triton on CUDA: the graphs' processing, so both paths give equal records
            if spec.backend == "triton" and self.device.type == "cuda":
                settings = SamplingTensors.empty(self.device)
                settings.write(spec)
            key = graph_key(spec) if settings is not None else spec
            flat, layout, next_input, out, p = _core(key, logits, q, x, noise, settings)
            detail = None
            if spec.detailed:
                dflat, dlayout = pack(gather_detail(out, p, q, x))
                detail = PendingDetail(dlayout, HostCopy.queued(dflat.cpu(), None))
            return QueuedChain(next_input, out.backend, detail, _core=unpack(flat.cpu().tolist(), layout))
        main = self._before_replay()
        g = self._lookup(spec, lambda key: self._capture(key, spec, logits, q, x, noise))
        write_inputs(g, spec, logits, x, noise)
        if g.q is not None:
            g.q.copy_(q)
        copy = self._replay_units(g, main)
        detail = None if copy is None else PendingDetail(g.detail_layout, copy)  # read when published
        return QueuedChain(g.next_input.clone(), "triton", detail, _graphs=g)

    def run(self, spec: VerifySpec, logits: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor,
            generator: torch.Generator | None) -> tuple[dict[str, list], torch.Tensor, str, "PendingDetail | None"]:
        """:meth:`queue_chain` and its wait: (the core record as host lists, the next input int64 [1] on the device,
        the sampler backend that ran, the detail record or None, readable any time)."""
        queued = self.queue_chain(spec, logits, q, x, generator)
        return queued.core(), queued.next_input, queued.backend, queued.detail

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
            g.keep = (out, p)
        torch.cuda.synchronize(self.device)
        self.capture_s += time.perf_counter() - t0
        return g


