"""One CUDA-graph capture recipe for every runner (gpt-fast ``generate.py`` / vLLM ``CUDAGraphRunner``).

:func:`capture` runs the work ``warmup`` times on a side stream (so that lazy initialisation, cuBLAS
workspaces and the caching allocator's blocks exist before capture), then captures one more run into a
graph whose memory comes from ``pool`` (runners share one pool among their graphs). The work must be
replayable: only device ops on tensors that outlive the graph (static inputs filled before each replay),
no host reads, no shapes that depend on data.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, TypeVar

import torch

T = TypeVar("T")


def capture(fn: Callable[[], T], device: torch.device, pool: Any = None, warmup: int = 2,
            reset: Callable[[], None] | None = None) -> tuple[torch.cuda.CUDAGraph, T]:
    """(graph, the captured run's outputs) of ``fn`` on CUDA ``device``. ``pool``: a graph memory pool
    (``graph.pool()`` of an earlier capture) or None (a new one). ``reset``: run (eagerly, outside the
    graph) after each warm-up run and after the capture, to undo state ``fn`` advances on the device, e.g.
    a KV cache's write position (a capture records the work but does not run it). The outputs are the
    graph's static buffers: a replay overwrites them. Raises what the capture raises (callers log it and
    run ``fn`` eagerly instead)."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
            if reset is not None:
                reset()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = fn()
    if reset is not None:
        reset()
    torch.cuda.synchronize(device)
    return graph, outputs


def replay(graph: torch.cuda.CUDAGraph, events: list | None) -> None:
    """Replay ``graph``; when ``events`` is a list (a benchmark timing replays), between two CUDA timing events
    appended to it as (start, end)."""
    if events is None:
        graph.replay()
        return
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    events.append((start, end))


class CapturedGraphs:
    """What a runner that keeps CUDA graphs by shape key (``self._graphs``) shows of them: :attr:`graphs`."""

    _graphs: dict

    @property
    def graphs(self) -> "MappingProxyType[Any, Any]":
        """Read-only {shape key: captured graph and buffers}; a value None is a capture that failed (that shape then
        runs eagerly). Keys are each runner's own (e.g. ``("tree", n)`` for a tree forward of n nodes)."""
        return MappingProxyType(self._graphs)
