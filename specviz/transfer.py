"""Host-to-device copies that do not make the host wait for the GPU.

A plain ``tensor.to("cuda")`` from pageable host memory copies synchronously (the host waits until
the GPU's queue has reached the copy); from pinned memory with ``non_blocking=True`` it is queued
like a kernel. The engine's step therefore stages small host inputs (draft tokens, the drafter's
catch-up tokens, new context tokens) in pinned memory; PyTorch's caching host allocator keeps a
staging buffer alive until the copy that reads it has run (vLLM and gpt-fast stage inputs the same way).
"""

from __future__ import annotations

import torch


def pinned(t: torch.Tensor) -> torch.Tensor:
    """``t`` in pinned host memory when CUDA is available (a copy), else ``t`` itself. t: a CPU tensor."""
    return t.pin_memory() if torch.cuda.is_available() and not t.is_cuda and not t.is_pinned() else t


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``, queued without a host wait: a host tensor bound for CUDA is staged in
    pinned memory and copied with ``non_blocking=True``. Any shape and dtype; returns ``t`` itself
    when it is already there."""
    device = torch.device(device)
    if device.type != "cuda" or t.is_cuda:
        return t.to(device)
    return pinned(t).to(device, non_blocking=True)
