"""A static runner's tree forwards and the commit of an accepted path (a mixin of
:class:`~specviz.static_runner.StaticRunner`).

The ancestor mask and the positions n + depth are built on the device from the parents and the write position
(:func:`specviz.runner.tree_attention_device`, pointer doubling), so a tree forward can be captured whole: with CUDA
graphs, 1 + N rows are padded to a tree-size bucket (:data:`TREE_BUCKETS`; padding nodes are root children that no
real node descends from: they attend to the root and themselves, their logits are dropped and their cache slots lie
past the tree) and one graph per (bucket, taps) builds the mask and runs the model, replayed with the ids and parents
copied into static buffers (a host tree's parents: one queued copy; a tree drafted on the device, EAGLE-2: a device
copy, no host value at all). After verification :meth:`StaticTreeForwards.commit` moves the accepted path's K/V into
place: every layer's K and V live in one tensor (:meth:`StaticTreeForwards._stack_kv`), so that is one gather and one
index copy for all layers.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from .attention import experts_implementation, layer_masks
from .graphs import capture
from .runner import compact_layers, kept_slots, tree_attention_device
from .transfer import to_device

TREE_BUCKETS = (8, 16, 32, 65)  # tree forwards (1 + N rows) are padded to one of these under CUDA graphs


class StaticTreeForwards:
    """Tree forwards over the runner's static cache; uses the runner's ``model``, ``cache``, ``layout``, ``device``,
    ``max_cache_len``, ``seq_len``, ``last_start``, ``tree_buckets``, ``cuda_graphs``, ``_graphs``, ``_pool``,
    ``_kv``, ``capture_s``, ``graph_experts`` and its ``_position``, ``_pick``, ``_replay``, ``_set_position``,
    ``truncate``, ``_compile_failed``, ``_capture_failed``, ``_note_capture`` and ``_count_replay``."""

    def _tree_mask(self, tree_mask: torch.Tensor, depth: torch.Tensor):
        """(4D mask [1, 1, R, max_cache_len] or {layer_type: mask}, position_ids [1, R]) built on the device from
        the write position pos: row a sees every key < pos and tree slot pos + b where ``tree_mask[a, b]``;
        row a's position is pos + depth[a]; a sliding layer's row also drops keys whose position (slot < pos:
        the slot; tree slot pos + b: pos + depth[b]) is a window or more behind it. No host value, so it
        can be captured in a CUDA graph."""
        R = tree_mask.shape[0]
        pos = self._position()
        kv = torch.arange(self.max_cache_len, device=self.device)  # [L]
        col = kv - pos  # [L]: tree slot of each key, < 0 before the tree
        in_tree = (col >= 0) & (col < R)
        tm = tree_mask.index_select(1, col.clamp(0, R - 1))  # [R, L]
        allowed = (kv < pos)[None, :] | (in_tree[None, :] & tm)
        q_pos = pos + depth  # [R]
        k_pos = torch.where(in_tree, pos + depth.index_select(0, col.clamp(0, R - 1)), kv)  # [L]
        return layer_masks(allowed, q_pos, k_pos, self.layout, self.model), q_pos[None]

    def _tree_buffers(self, rows: int) -> dict[str, torch.Tensor]:
        """Inputs of a tree forward of ``rows`` rows: ids int64 [1, rows], parents int64 [rows - 1] (-1 = the
        root; padding nodes are root children no real node descends from)."""
        return {"ids": torch.zeros(1, rows, dtype=torch.long, device=self.device),
                "parents": torch.full((rows - 1,), -1, dtype=torch.long, device=self.device)}

    def _fill_tree(self, inputs: dict[str, torch.Tensor], ids: torch.Tensor, tree) -> None:
        """Copy a tree's 1 + N ids and N parents (a host list, or int64 [N] on the device) into ``inputs``;
        rows past 1 + N are padding (their ids are whatever the buffer holds, their parents -1)."""
        n = ids.shape[1]
        inputs["ids"][:, :n].copy_(ids)
        par = inputs["parents"]
        if isinstance(tree, torch.Tensor):  # drafted on the device: no host copy at all
            par[: n - 1].copy_(tree)
            if par.numel() > n - 1:
                par[n - 1:].fill_(-1)
        else:  # a host tree: one queued copy of the padded list (pinned, no wait)
            host = torch.full((par.numel(),), -1, dtype=torch.long)
            host[: n - 1] = torch.tensor(tree, dtype=torch.long)
            par.copy_(to_device(host, self.device))

    def _tree_body(self, inputs: dict[str, torch.Tensor], taps: tuple[str, ...]):
        """The replayable tree forward: :meth:`_tree_model_out` (compiled when on; a compile or run failure is
        logged once, the position restored and the forward rerun eagerly, compile off for this runner's trees),
        then the taps picked. Returns (logits [1, rows, V] in the model's dtype, {tap: [rows, d]})."""
        args = (inputs["ids"], inputs["parents"], bool(taps))
        if self._compiled_tree is not None:
            try:
                logits, states = self._compiled_tree(*args)
                return logits, self._pick(states, taps)
            except Exception as exc:  # noqa: BLE001 - compile problems must not fail the request
                self._compile_failed(exc, "tree forward")
                self._compiled_tree = None
        logits, states = self._tree_model_out(*args)
        return logits, self._pick(states, taps)

    def _tree_model_out(self, ids: torch.Tensor, parents: torch.Tensor, hidden: bool):
        """The tree forward's mask and model call (what ``compile=True`` compiles for trees): ancestor mask
        and depths from ``parents`` int64 [rows - 1] by device ops (:func:`specviz.runner.tree_attention_device`),
        the 4D mask and positions n + depth (:meth:`_tree_mask`), then the model on ids [1, rows]. Returns
        (logits [1, rows, V], transformers' hidden_states tuple, or () when not ``hidden``)."""
        tree_mask, depth = tree_attention_device(parents)
        depth = torch.cat([depth.new_zeros(1), depth])  # [rows]: the root row at depth 0
        mask, position_ids = self._tree_mask(tree_mask, depth)
        out = self.model(input_ids=ids, attention_mask=mask, past_key_values=self.cache, use_cache=True,
                         output_hidden_states=hidden, position_ids=position_ids)
        return out.logits, (tuple(out.hidden_states) if hidden else ())

    def _tree_forward(self, ids: torch.Tensor, taps: tuple[str, ...], tree):
        """(float32 logits [1 + N, V], {tap: [1 + N, d]}) of a tree forward; padded to a bucket (and
        replayed from a CUDA graph when on) if ``tree_buckets`` is set and a bucket fits. ``tree``: the
        parents, a host list or int64 [N] on the device. The mask is built inside the graph: per step the
        host queues the ids' and parents' copies and one replay."""
        n = ids.shape[1]
        bucket = next((b for b in (self.tree_buckets or ()) if b >= n), None)
        fits = bucket is not None and self.seq_len + bucket <= self.max_cache_len
        rows = bucket if fits else n  # no bucket fits: unpadded and eager
        key = ("tree", rows, taps)
        graphed = fits and self.cuda_graphs and self.seq_len > 0
        entry = self._graphs.get(key) if graphed else None
        inputs = entry[1] if entry is not None else self._tree_buffers(rows)
        self._fill_tree(inputs, ids, tree)
        if graphed and key not in self._graphs:
            entry = self._capture_tree(key, inputs, taps)
        if entry is None:
            logits, features = self._tree_body(inputs, taps)
            logits, features = logits[0, :n].float(), {t: h[:n] for t, h in features.items()}
        else:
            graph, _, s_logits, s_features = entry
            self._replay(graph)
            self._count_replay(key)
            logits, features = s_logits[0, :n].to(torch.float32, copy=True), {t: h[:n].clone() for t, h in s_features.items()}
        self._set_position(self.seq_len + n)  # the padding rows' slots are not part of the cache
        return logits, features

    def _capture_tree(self, key, inputs, taps):
        """Capture one padded tree forward (:func:`specviz.graphs.capture`, the runner's pool), its ids and
        parents in static buffers; the warm-up runs and the capture leave the write position where it was.
        A failed capture is logged and remembered as None: that bucket then runs eagerly."""
        t0 = time.perf_counter()
        try:
            with experts_implementation(self.model, self.graph_experts):
                graph, (s_logits, s_features) = capture(lambda: self._tree_body(inputs, taps), self.device, self._pool,
                                                        reset=lambda: self._set_position(self.seq_len))
            self._pool = graph.pool()
            self._graphs[key] = (graph, inputs, s_logits, s_features)
            self._note_capture(key, self._compiled_tree is not None)
        except Exception as exc:  # noqa: BLE001 - a failed capture must not fail the request
            self._set_position(self.seq_len)
            self._capture_failed(f"tree forward ({key[1]} rows)", exc)
            self._graphs[key] = None
        self.capture_s += time.perf_counter() - t0
        return self._graphs[key]

    @torch.inference_mode()
    def commit(self, kept: Sequence[int], rows: torch.Tensor | None = None) -> None:
        """See :class:`specviz.runner.ModelRunner`: compact the accepted path's K/V, then set the length."""
        length = self.last_start + 1 + len(kept)
        if length > self.seq_len:
            raise ValueError(f"commit keeps {len(kept)} nodes after a forward of {self.seq_len - self.last_start} tokens")
        layers = [layer for layer in self.cache.layers if getattr(layer, "is_initialized", False)]
        if layers and list(kept) != list(range(len(kept))):  # else already in place (a chain, the first children)
            if self._kv is not None:  # every layer's K and V in one tensor: one gather, one scatter
                start = self.last_start + 1
                src = kept_slots(self.last_start, kept, rows, self.device)
                dst = torch.arange(start, start + len(kept), device=self.device)
                self._kv.index_copy_(2, dst, self._kv.index_select(2, src))  # sources gathered first (src >= dst)
            else:
                compact_layers(layers, self.last_start, kept, rows)
        self.truncate(length)

    def _stack_kv(self) -> None:
        """After the first forward (transformers' lazy allocation of the static cache) move every layer's keys and
        values into ONE tensor [2 * layers, H, max_cache_len, D] (``self._kv``) and make each layer's ``keys`` /
        ``values`` [1, H, max_cache_len, D] a view of it, so that :meth:`commit` compacts all layers with two kernels
        (a gather and an index copy) instead of two per layer and tensor (80 on the 20-layer demo target: 0.23 ms of
        GPU time per tree step on the H200). Runs before any graph is captured (captures need a
        prefilled cache), so graphs record the views' addresses. Left as is (per-layer compaction) when the layers
        differ in shape, dtype or device, or some are not allocated."""
        self._kv_checked = True
        layers = self.cache.layers
        if not layers or not all(getattr(layer, "is_initialized", False) for layer in layers):
            return
        tensors = [t for layer in layers for t in (layer.keys, layer.values)]
        first = tensors[0]
        if any(t.shape != first.shape or t.dtype != first.dtype or t.device != first.device or t.shape[0] != 1
               for t in tensors):
            return
        kv = torch.cat(tensors)  # [2 * layers, H, max_cache_len, D]
        for i, layer in enumerate(layers):
            layer.keys, layer.values = kv[2 * i:2 * i + 1], kv[2 * i + 1:2 * i + 2]
            torch._dynamo.mark_static_address(layer.keys)  # as transformers' lazy_initialization does
            torch._dynamo.mark_static_address(layer.values)
        self._kv = kv
