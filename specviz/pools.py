"""Objects a decoder reuses across requests: runners with their KV caches and CUDA graphs, step verifiers, head runners.

Making one is expensive (a static cache, captured graphs), so a request leases one for its duration and gives it
back, exactly once, for the next request; concurrent requests lease different ones. Keys name what is pooled (the
model's id for its runner, ``("head", id(head))``, ``"verifier"``, ...).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import torch

_DEVICE_LOCKS: dict[str, threading.RLock] = {}
_DEVICE_LOCKS_GUARD = threading.Lock()


def device_lock(device: torch.device) -> "threading.RLock | contextlib.nullcontext[None]":
    """The process-wide lock that serialises GPU work of every decoder on one CUDA device, step by step (a no-op
    context on the CPU, where concurrent requests simply share the cores).

    Why: CUDA-graph capture (the static runner's, a head runner's, the verifier's) is invalidated by another thread's
    CUDA calls during the capture ("operation failed due to a previous error during capture", seen with 8 concurrent
    app sessions on the H200). A request holds the lock for one step's work at a time and releases it between steps,
    so concurrent requests interleave step by step and none waits for another's whole run; the warm-up holds it
    throughout. Reentrant: the warm-up runs requests inside its own hold."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    key = str(torch.device(device.type, device.index if device.index is not None else torch.cuda.current_device()))
    with _DEVICE_LOCKS_GUARD:
        return _DEVICE_LOCKS.setdefault(key, threading.RLock())


class Pool:
    """Free objects by key (thread-safe)."""

    def __init__(self):
        self._free: dict[Any, list[Any]] = {}
        self._lock = threading.Lock()

    def acquire(self, key: Any, make: Callable[[], Any]) -> Any:
        """A free object for ``key``, or a new one from ``make()``. Give it back with :meth:`release`."""
        with self._lock:
            free = self._free.setdefault(key, [])
            obj = free.pop() if free else None
        return obj if obj is not None else make()

    def release(self, key: Any, obj: Any) -> None:
        """Put ``obj`` back under ``key`` (None is ignored)."""
        if obj is not None:
            with self._lock:
                self._free.setdefault(key, []).append(obj)

    @contextlib.contextmanager
    def lease(self, key: Any, make: Callable[[], Any]) -> Iterator[Any]:
        """``with pool.lease(key, make) as obj``: acquired on entry, released exactly once on exit (also on error)."""
        obj = self.acquire(key, make)
        try:
            yield obj
        finally:
            self.release(key, obj)

    def free(self, key: Any) -> list[Any]:
        """The free objects under ``key`` now (a copy, oldest first)."""
        with self._lock:
            return list(self._free.get(key, []))

    def replace(self, key: Any, objects: list[Any]) -> None:
        """Make ``objects`` the free objects under ``key`` (a test's or a benchmark's own, e.g. a verifier without
        graphs)."""
        with self._lock:
            self._free[key] = list(objects)

    def clear(self) -> None:
        """Forget every free object (each is made again on its next lease)."""
        with self._lock:
            self._free.clear()

    def objects(self) -> list[Any]:
        """Every free object (for totals such as the seconds spent capturing graphs)."""
        with self._lock:
            return [obj for objs in self._free.values() for obj in objs]
