"""What fixes a verification's computation (:class:`VerifySpec`, one pair of CUDA graphs per :func:`graph_key`) and
the sampling values the captured graphs read from device tensors (:class:`SamplingTensors`), so one graph serves
every temperature, top-p and top-k."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch


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



def write_inputs(g, spec: VerifySpec, logits: torch.Tensor, x: torch.Tensor, noise) -> None:
    """Copy a step's inputs into a captured chain or tree graph's static buffers (its settings, logits, draft
    tokens and, when it has them, the noise); the caller copies what only one kind has (q, parents)."""
    g.settings.write(spec)
    g.logits.copy_(logits)
    g.x.copy_(x)
    if g.noise is not None:
        g.noise.u.copy_(noise.u)
        g.noise.exp.copy_(noise.exp)

