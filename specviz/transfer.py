"""Host-to-device copies that do not make the host wait for the GPU.

A plain ``tensor.to("cuda")`` from pageable host memory copies synchronously (the host waits until
the GPU's queue has reached the copy); from pinned memory with ``non_blocking=True`` it is queued
like a kernel. The engine's step therefore stages small host inputs (draft tokens, the drafter's
catch-up tokens, new context tokens) in pinned memory; PyTorch's caching host allocator keeps a
staging buffer alive until the copy that reads it has run (vLLM and gpt-fast stage inputs the same way).
"""

from __future__ import annotations

from collections.abc import Sequence

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


class HostCopy:
    """A device tensor's values on their way to the host: queued now (into pinned memory, behind the work
    queued so far, with an event), read by :meth:`tolist`, which waits for that copy only, not for whatever
    was queued after it. On the CPU it is the tensor itself. t: any tensor (float64 keeps int ids exact)."""

    def __init__(self, t: torch.Tensor):
        if t.is_cuda:
            self._host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self._host.copy_(t, non_blocking=True)
            self._done: torch.cuda.Event | None = torch.cuda.Event()
            self._done.record()
        else:
            self._host, self._done = t, None
        self._list: list | None = None

    @classmethod
    def queued(cls, host: torch.Tensor, done: "torch.cuda.Event | None") -> "HostCopy":
        """A copy someone already queued into ``host`` (pinned memory, e.g. a CUDA graph's output buffer),
        complete when ``done`` has fired (None: ``host`` holds the values already)."""
        obj = cls.__new__(cls)
        obj._host, obj._done, obj._list = host, done, None
        return obj

    def tolist(self) -> list:
        """The values as (nested) Python lists; the first call waits for the copy if it has not finished (in the
        engine a copy queued while drafting has finished by the time the proposer observes the step: no wait)."""
        if self._list is None:
            if self._done is not None and not self._done.query():
                self._done.synchronize()
            self._list = self._host.tolist()
        return self._list


class LazyHostList(Sequence):
    """A read-only sequence whose items are ``convert(v)`` of one row of a :class:`HostCopy`, read on first
    use (len() of it is known without waiting: ``length``)."""

    def __init__(self, copy: HostCopy, row: int, length: int, convert=float):
        self._copy, self._row, self._len, self._convert = copy, row, int(length), convert
        self._items: list | None = None

    def _resolve(self) -> list:
        if self._items is None:
            self._items = [self._convert(v) for v in self._copy.tolist()[self._row]]
        return self._items

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i):
        return self._resolve()[i]

    def __iter__(self):
        return iter(self._resolve())

    def __eq__(self, other):
        if not isinstance(other, (list, tuple, LazyHostList)):
            return NotImplemented
        return list(self) == list(other)

    def __repr__(self) -> str:
        return f"LazyHostList({self._resolve() if self._items is not None else '<pending>'})"
