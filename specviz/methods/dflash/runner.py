"""Runners of the DFlash drafter: each step is one call, ``logits = runner.step(features, start, root)``.

features [c, F]: target features of the positions start .. start+c-1 (committed since the last
step); the block [root, MASK x (B-1)] then runs at positions n .. n+B-1 with n = start + c, over
the context K/V of every position < n. Returns logits float32 [B, V] (slot i predicts position n+i).

* :class:`EagerDFlashRunner`: the head's own forward over a growing :class:`DFlashCache` (the reference).
* :class:`StaticDFlashRunner`: the context K/V in preallocated buffers (slot j = position j, as the
  target's static cache); the step has static shapes: the c <= B new rows are written from a padded
  [B, F] buffer (rows past c land at positions >= n, hidden by the mask ``key < n`` and overwritten
  by the next step), and the block attends to all ``capacity`` key slots under that mask. On CUDA
  the step is one CUDA graph, captured on first use (eager fallback with a log line if capture
  fails); a prompt's first c > B rows are written eagerly. Same logits as the eager runner up to
  rounding (tests/test_dflash.py). Host inputs (start, c, root) are queued through pinned memory.
"""

from __future__ import annotations

import logging
import time

import torch

from specviz.transfer import to_device
from .head import DFlashCache, DFlashHead

log = logging.getLogger(__name__)


class EagerDFlashRunner:
    """The reference: ``head(features, positions, block, block_positions, cache)`` per step."""

    cuda_graphs = False
    capture_s = 0.0

    def __init__(self, head: DFlashHead):
        self.head = head
        self.reset()

    def reset(self) -> None:
        self.cache = DFlashCache()

    def step(self, features: torch.Tensor, start: int, root: int) -> torch.Tensor:
        cfg = self.head.config
        c, dev = features.shape[0], features.device
        block = torch.full((cfg.block_size,), cfg.mask_token_id, dtype=torch.long, device=dev)
        block[0] = root
        n = start + c
        return self.head(features, torch.arange(start, n, device=dev), block,
                         torch.arange(n, n + cfg.block_size, device=dev), self.cache)  # [B, V]


class StaticDFlashRunner:
    """Args: head (attached, on its device); max_len: positions the context can hold (default the
    head's max_position_embeddings); cuda_graphs: default on CUDA devices.
    Raises ValueError when a step would pass max_len."""

    def __init__(self, head: DFlashHead, max_len: int | None = None, cuda_graphs: bool | None = None):
        cfg = head.config
        self.head, self.B = head, cfg.block_size
        self.max_len = int(max_len or cfg.max_position_embeddings)
        self.capacity = self.max_len + 2 * self.B
        p = next(head.parameters())
        self.device, dt = p.device, p.dtype
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        shape = (1, cfg.num_key_value_heads, self.capacity, cfg.head_dim)
        self.keys = [torch.zeros(shape, device=self.device, dtype=dt) for _ in head.layers]
        self.values = [torch.zeros(shape, device=self.device, dtype=dt) for _ in head.layers]
        self.feats = torch.zeros(1, self.B, cfg.feature_size, device=self.device, dtype=dt)  # padded new rows
        self.scalars = torch.zeros(3, dtype=torch.long, device=self.device)  # start, c, root
        self.slots = torch.arange(self.capacity, device=self.device)  # [capacity]
        self.offsets = torch.arange(self.B, device=self.device)  # [B]
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None  # the graph's output [B, V]
        self.failed = False
        self.capture_s = 0.0

    def reset(self) -> None:
        """Nothing to clear: every slot < n is written by the request before the mask shows it."""

    @torch.inference_mode()
    def step(self, features: torch.Tensor, start: int, root: int) -> torch.Tensor:
        c = int(features.shape[0])
        if start + c > self.max_len:
            raise ValueError(f"the DFlash context holds {self.max_len} positions; {start} + {c} do not fit")
        if c > self.B:  # a prompt: write all but the last row eagerly, the last one in the step
            self._write(features[None, : c - 1], start)
            features, start, c = features[c - 1 :], start + c - 1, 1
        self.feats[0, :c].copy_(features)
        self.scalars.copy_(to_device(torch.tensor([start, c, root], dtype=torch.long), self.device))
        if self.cuda_graphs and not self.failed:
            if self.graph is None:
                self._capture()
            if self.graph is not None:
                self.graph.replay()
                return self.logits.clone()
        return self._step()

    def _write(self, feats: torch.Tensor, start) -> None:
        """Context K/V of feats [1, r, F] at positions start .. start+r-1 (start: int or a device scalar)."""
        pos = start + torch.arange(feats.shape[1], device=self.device)  # [r]
        for layer_k, layer_v, (k, v) in zip(self.keys, self.values, self.head.context_kv(feats, pos[None])):
            layer_k.index_copy_(2, pos, k)
            layer_v.index_copy_(2, pos, v)

    def _step(self) -> torch.Tensor:
        """The static-shape step on the current buffers: logits float32 [B, V]."""
        cfg = self.head.config
        start, count, root = self.scalars[0], self.scalars[1], self.scalars[2]
        self._write(self.feats, start)  # B rows; rows >= count land at positions >= n (masked, rewritten later)
        n = start + count
        block = torch.where(self.offsets == 0, root, cfg.mask_token_id)[None]  # [1, B]
        visible = (self.slots < n)[None, :].expand(self.B, -1)  # [B, capacity]: keys of positions < n
        mask = torch.cat([visible, torch.ones(self.B, self.B, dtype=torch.bool, device=self.device)], dim=1)
        kvs = list(zip(self.keys, self.values))
        return self.head.block_logits(block, (n + self.offsets)[None], kvs, mask[None, None])[0]  # [B, V]

    def _capture(self) -> None:
        """Capture :meth:`_step` (warm-up runs on a side stream first). Their writes land at
        positions >= start, which the replay rewrites. On failure: eager from now on, logged."""
        t0 = time.perf_counter()
        try:
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._step()
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.logits = self._step()
            self.graph = graph
        except RuntimeError as exc:  # capture is an optimisation: fall back to eager steps
            log.warning("DFlash drafter: CUDA graph capture failed (%s); running eagerly", exc)
            self.failed, self.graph = True, None
        torch.cuda.synchronize(self.device)
        self.capture_s += time.perf_counter() - t0
