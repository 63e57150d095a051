"""A pre-allocated (static) KV cache runner; rollback is moving a position. Optional CUDA graphs.

Design follows gpt-fast (pytorch-labs, ``generate.py``): the cache is allocated once; rejecting
drafts does not copy or free anything, it only moves the write position back, and the stale
entries beyond it are hidden by the causal mask until they are overwritten. The cache is
transformers' own :class:`~transformers.StaticCache` fed to the model's own modules (no model
re-implementation): each layer keeps its write position in a device tensor
(``cumulative_length``), from which the model derives positions and the causal mask on the
device, so a captured forward needs no host input but the token ids.

With ``cuda_graphs=True`` (CUDA only) every forward of n <= ``max_graph_tokens`` tokens after the
prefill replays a CUDA graph captured for that n (one graph per verify width k'+1 in use, and one
for the drafter's single-token steps). Prefill runs eagerly.

Compiled forwards (``compile=True``; issue 13 point 4): every forward after the prefill of n <=
``max_graph_tokens`` tokens (graph-captured or not) runs ``torch.compile(backend)`` of the same
function (the mask and transformers' own modules: no re-implementation), in inductor's default
mode, and on CUDA that compiled forward is what the runner's own CUDA graph captures (inductor's
``reduce-overhead`` mode is not used: it keeps its own graphs, which HF's static cache on top of
ours made fail with "accessing tensor output of CUDAGraphs that has been overwritten", issue 13).
What is compiled is :meth:`StaticRunner._model_out` (mask + model call, hidden states on or off)
and, for tree forwards, :meth:`StaticRunner._tree_model_out` (the ancestor mask from the parents +
model call; a failure there turns compile off for trees only);
which taps are picked stays outside, so all tap sets share its graphs. Dynamo compiles n = 1
statically and, at the next width, one graph with a dynamic n for every n >= 2 (its automatic
dynamic shapes; seen on the CPU: 2 graphs for widths 1..5 without hidden states); the prefill never
runs compiled (transformers marks the cache's tensors static there). With hidden states on,
transformers 5.17's output-capturing hooks break dynamo's graph on their first call (their
installation takes a lock; seen on the CPU: 4 graphs instead of 2): still correct, and the pieces
are captured in the same CUDA graph. If compiling or running
the compiled forward raises, the runner logs one warning, restores the cache position and runs
eagerly from then on; a capture that fails likewise logs and leaves that width eager. The default
is off (:data:`COMPILE_DEFAULT`): on the CPU machine only the code path is tested (backends
"eager" / "aot_eager", tests/test_compile.py); whether inductor is faster and equal to eager on the
H200 is measured there (benchmarks/bench_shapes.py / bench_e2e.py, with and without compile side
by side) before it is turned on.

Tree forwards (``parents``): the ancestor mask and the positions n + depth are built on the device
from the parents and the write position (:func:`specviz.runner.tree_attention_device`, pointer
doubling), so a tree forward can be captured whole: with CUDA graphs, 1 + N rows are padded to a
tree-size bucket (:data:`TREE_BUCKETS`; padding nodes are root children that no real node descends
from: they attend to the root and themselves, their logits are dropped and their cache slots lie past
the tree) and one graph per (bucket, taps) builds the mask and runs the model, replayed with the ids
and parents copied into static buffers (a host tree's parents: one queued copy; a tree drafted on the
device, EAGLE-2: a device copy, no host value at all); ``tree_buckets=None`` runs trees eagerly. After
verification :meth:`StaticRunner.commit` moves the accepted path's K/V into place: every layer's K and V
live in one tensor (:meth:`StaticRunner._stack_kv`), so that is one gather and one index copy for all
layers. Tested on the H200 (tests/test_tree_runners.py, tests/test_eagle_tree.py).

Feature taps (:meth:`StaticRunner.forward_features`): the requested hidden states come from the
same forward (transformers' ``output_hidden_states``, see :mod:`specviz.runner`); under CUDA graphs
they are static buffers captured inside the graph (one graph per (n, taps)), cloned on the
device after each replay, so no host sync is added.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Sequence

import torch

from .attention import (attention_layout, experts_implementation, graph_experts_implementation, layer_masks,
                        static_cache)
from .graphs import CapturedGraphs, capture, replay
from .runner import (ForwardOutput, _layer_kv, as_tree, check_taps, compact_layers, kept_slots, pick_features,
                     tree_attention_device)
from .transfer import to_device

TREE_BUCKETS = (8, 16, 32, 65)  # tree forwards (1 + N rows) are padded to one of these under CUDA graphs
log = logging.getLogger(__name__)
COMPILE_DEFAULT = False  # compile=None means this (see the module docstring: off until measured on the H200)


class StaticRunner(CapturedGraphs):
    """Args:
        model: a transformers ``*ForCausalLM`` in eval mode: full-attention and sliding-window layers (each
            cache layer full-length, the window applied by the mask: :mod:`specviz.attention`). MoE experts
            are captured with :func:`specviz.attention.graph_experts_implementation`'s choice.
        max_cache_len: tokens the cache holds (prompt + generated + k); forwards past it raise.
        cuda_graphs: capture/replay CUDA graphs for small forwards (default: on CUDA devices).
        max_graph_tokens: largest n captured (default 33 = MAX_SPECULATIVE_TOKENS + 1).
        compile: run forwards of n <= max_graph_tokens after the prefill through ``torch.compile``
            (default :data:`COMPILE_DEFAULT`); ``compile_backend``: its backend ("inductor"; the CPU
            tests use "eager" / "aot_eager"). ``compiled`` says whether it is (still) in use.
        tree_buckets: row counts tree forwards are padded to (default :data:`TREE_BUCKETS` with CUDA
            graphs, None = no padding, eager); padding is exact on any device (tests use it on the CPU).
    Raises:
        ValueError: a forward would overflow the cache; truncate to an invalid length.
        specviz.attention.UnsupportedModelError: (a ValueError) a layout that cannot be rolled back or masked.
    """

    def __init__(self, model: torch.nn.Module, max_cache_len: int, cuda_graphs: bool | None = None,
                 max_graph_tokens: int = 33, compile: bool | None = None, compile_backend: str = "inductor",
                 tree_buckets: Sequence[int] | None | str = "auto"):
        self.model = model
        self.layout = attention_layout(model.config)  # UnsupportedModelError (a ValueError) before any forward
        self.device = next(model.parameters()).device
        self.max_cache_len = int(max_cache_len)
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        self.max_graph_tokens = max_graph_tokens
        self.tree_buckets = (TREE_BUCKETS if self.cuda_graphs else None) if tree_buckets == "auto" else tree_buckets
        self.cache = static_cache(model, self.max_cache_len)  # sliding layers full-length: the mask applies the window
        # MoE experts inside captures: an implementation without host reads (None: the model's own is capturable)
        self.graph_experts = graph_experts_implementation(model) if self.cuda_graphs else None
        self.capture_failures: list[str] = []  # one line per distinct failure cause (capture_notes() collects them)
        self.seq_len = 0
        self.last_start = 0  # seq_len before the last forward (commit's reference)
        # (n, taps) -> (graph, static ids [1, n], static logits [1, n, V], static features {tap: [n, d]}); None: failed
        self._graphs: dict[tuple[int, tuple[str, ...]], tuple] = {}
        self._pool = None
        self.graph_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] | None = None  # set to [] to time replays
        self.capture_s = 0.0  # seconds spent in _capture so far (the engine excludes it from step times)
        self._kv: torch.Tensor | None = None  # [2 * layers, H, max_cache_len, D]: every layer's K and V (_stack_kv)
        self._kv_checked = False  # _stack_kv ran (after the first forward)
        self._compiled = self._compiled_tree = None
        if COMPILE_DEFAULT if compile is None else bool(compile):
            _raise_recompile_limit()
            self._compiled = torch.compile(self._model_out, backend=compile_backend, dynamic=None)
            self._compiled_tree = torch.compile(self._tree_model_out, backend=compile_backend, dynamic=None)

    @property
    def compiled(self) -> bool:
        """Whether small forwards run compiled (False when off, or after a compile failure)."""
        return self._compiled is not None

    # ---- ModelRunner interface ---------------------------------------------------------------
    def reset(self) -> None:
        self.truncate(0)

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.seq_len:
            raise ValueError(f"cannot truncate a cache of {self.seq_len} tokens to {length}")
        if length != self.seq_len or length == 0:  # every draft accepted: nothing to roll back
            self._set_position(length)
        self.seq_len = length

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.forward_features(token_ids).logits

    @torch.inference_mode()
    def forward_features(self, token_ids: torch.Tensor, taps: Sequence[str] = (),
                         parents: Sequence[int] | None = None) -> ForwardOutput:
        """See :class:`specviz.runner.ModelRunner`. A tree (``parents`` not a chain: a host list, or int64 [N]
        on the device) is padded to a tree-size bucket and replayed from that bucket's graph (eagerly without
        graphs or past the largest bucket), with the ancestor mask and positions seq_len + depth."""
        taps = check_taps(taps, self.model)
        n = int(token_ids.numel())
        if self.seq_len + n > self.max_cache_len:
            raise ValueError(f"the static KV cache holds {self.max_cache_len} tokens; "
                             f"{self.seq_len} + {n} do not fit (shorten the prompt or max_new_tokens)")
        ids = to_device(token_ids, self.device).view(1, n)  # [1, n]; a host input is queued, no wait
        self.last_start = self.seq_len
        tree = as_tree(parents, n)
        if tree is not None:
            logits, features = self._tree_forward(ids, taps, tree)
            self.seq_len += n
            if not self._kv_checked:
                self._stack_kv()
            return ForwardOutput(logits, features)
        entry = None
        if self.cuda_graphs and self.seq_len > 0 and n <= self.max_graph_tokens:
            entry = self._graphs[(n, taps)] if (n, taps) in self._graphs else self._capture(n, ids, taps)
        if entry is not None:  # None: no graphs here, or this width's capture failed (logged): eager
            graph, static_ids, static_logits, static_features = entry
            static_ids.copy_(ids)
            self._replay(graph)
            logits = static_logits[0].to(torch.float32, copy=True)  # [n, V]; the buffer is reused
            features = {tap: h.clone() for tap, h in static_features.items()}  # [n, d] each; reused too
        else:
            small = self.seq_len > 0 and n <= self.max_graph_tokens
            logits, features = self._small(ids, taps) if small else self._eager(ids, taps)
            logits = logits[0].float()
        self.seq_len += n
        if not self._kv_checked:
            self._stack_kv()
        return ForwardOutput(logits, features)

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder layer ``layer``'s cached (keys, values) for positions < seq_len, each [kv_heads,
        seq_len, head_dim] views of the static cache (see :meth:`specviz.runner.EagerRunner.layer_kv`)."""
        return _layer_kv(self.cache, layer, self.seq_len, self.model)

    # ---- internals -----------------------------------------------------------------------------
    def _replay(self, graph: torch.cuda.CUDAGraph) -> None:
        replay(graph, self.graph_events)  # timed between CUDA events when graph_events is a list (benchmarks)

    def _eager(self, ids: torch.Tensor, taps: tuple[str, ...] = (),
               model_out=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One causal forward of ids [1, n]: (logits [1, n, V], {tap: [n, d]}) in the model's dtype.
        ``model_out``: the compiled :meth:`_model_out` (default: the eager one)."""
        logits, hidden_states = (model_out or self._model_out)(ids, bool(taps))
        return logits, self._pick(hidden_states, taps)

    def _pick(self, hidden_states: tuple, taps: tuple[str, ...]) -> dict[str, torch.Tensor]:
        return pick_features(hidden_states, taps, self.model.config.num_hidden_layers) if taps else {}

    def _compile_failed(self, exc: Exception, what: str) -> None:
        """A compiled forward raised: log it once and restore the write position (a failed compiled forward
        may have advanced some layers); the caller switches that compiled function off and reruns eagerly."""
        log.warning("specviz: torch.compile of %s's %s failed, running it eagerly: %s",
                    type(self.model).__name__, what, compile_error_text(exc))
        self._set_position(self.seq_len)

    def _model_out(self, ids: torch.Tensor, hidden: bool):
        """The mask and the model call: (logits [1, n, V], transformers' hidden_states tuple, or () when
        not ``hidden``). What ``compile=True`` compiles: which taps are picked stays outside, so every tap
        set shares the compiled graphs (2 per width kind: hidden states on / off)."""
        mask = self._causal_mask(ids.shape[1])
        out = self.model(input_ids=ids, attention_mask=mask, past_key_values=self.cache, use_cache=True,
                         output_hidden_states=hidden)
        return out.logits, (tuple(out.hidden_states) if hidden else ())

    def _small(self, ids: torch.Tensor, taps: tuple[str, ...] = ()):
        """A forward after the prefill: compiled when on, else eager. A compile or run failure is logged once, the
        position restored (a failed compiled forward may have advanced some layers) and the forward
        rerun eagerly; compile stays off for this runner."""
        if self._compiled is None:
            return self._eager(ids, taps)
        try:
            return self._eager(ids, taps, model_out=self._compiled)
        except Exception as exc:  # noqa: BLE001 - compile problems must not fail the request
            self._compile_failed(exc, "forward")
            self._compiled = None
            return self._eager(ids, taps)

    def _causal_mask(self, n: int):
        """4D mask [1, 1, n, max_cache_len] built on the device from the cache's write position:
        query i (at position pos + i) sees keys 0..pos + i, never the stale entries past them; with
        sliding-window layers, {layer_type: mask} or the windowed mask (:func:`specviz.attention.layer_masks`).
        Passing it ready-made keeps transformers from deciding on the host (a sync, which a CUDA
        graph capture forbids) whether the mask can be skipped."""
        layer = self.cache.layers[0]
        # Before the first forward the cache is unallocated and the position is 0. The explicit mask
        # is used then too: the model's own causal mask picks another attention kernel, whose
        # rounding would make a runner's first request differ (in the last bits) from later ones.
        pos = layer.cumulative_length if getattr(layer, "is_initialized", False) else 0
        kv = torch.arange(self.max_cache_len, device=self.device)  # [max_cache_len]: slot = position
        q_pos = pos + torch.arange(n, device=self.device)  # [n]
        allowed = kv[None, :] <= q_pos[:, None]  # [n, max_cache_len]
        return layer_masks(allowed, q_pos, kv, self.layout, self.model)  # sliding layers: also q - k < window

    def _position(self):
        """The write position: layer 0's device counter, or 0 before the first forward."""
        layer = self.cache.layers[0]
        return layer.cumulative_length if getattr(layer, "is_initialized", False) else 0

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
        GPU time per tree step on the H200, 2026-12-02). Runs before any graph is captured (captures need a
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

    @torch.inference_mode()  # on CUDA the positions are inference tensors (made in the first forward)
    def _set_position(self, length: int) -> None:
        """Set every layer's write position (0-dim int64 device tensors) to ``length``: two
        multi-tensor launches however many layers there are."""
        positions = [layer.cumulative_length for layer in self.cache.layers if getattr(layer, "is_initialized", False)]
        if positions:
            torch._foreach_zero_(positions)
            torch._foreach_add_(positions, length)

    def _capture(self, n: int, ids: torch.Tensor, taps: tuple[str, ...] = ()):
        """Capture one forward of n tokens at the current position (the cache is initialised by the
        eager prefill), with its feature taps as static outputs. Warm-up runs write stale entries
        past seq_len, then the position is restored."""
        t0 = time.perf_counter()
        try:
            for attempt in ("compiled", "eager") if self._compiled is not None else ("eager",):
                try:
                    with experts_implementation(self.model, self.graph_experts):
                        return self._capture_once(n, ids, taps)
                except Exception as exc:  # noqa: BLE001 - a failed capture must not fail the request
                    self._set_position(self.seq_len)
                    if attempt == "compiled":
                        log.warning("specviz: CUDA graph capture of the compiled %s forward (%d tokens) failed; "
                                    "compile is off for this runner from now on: %s: %s",
                                    type(self.model).__name__, n, type(exc).__name__, exc)
                    else:
                        self._capture_failed(f"{n}-token forward", exc)
                    self._compiled = None
            self._graphs[(n, taps)] = None
            return None
        finally:
            self.capture_s += time.perf_counter() - t0

    def _capture_failed(self, what: str, exc: Exception) -> None:
        """Record a failed capture (that forward then runs eagerly: correct, slower): logged once per model and
        cause in this process, kept in ``capture_failures`` and :func:`capture_notes` for the speedup panel."""
        cause = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        notes = _CAPTURE_NOTES.setdefault(self.model, {})
        if cause not in notes:
            notes[cause] = (f"CUDA-graph capture of {type(self.model).__name__}'s forwards failed ({cause}); "
                            "those forwards run eagerly: correct, but slower than with graphs")
            log.warning("specviz: %s (first seen on the %s)", notes[cause], what)
        else:
            log.debug("specviz: CUDA graph capture of the %s failed again: %s", what, cause)
        if notes[cause] not in self.capture_failures:
            self.capture_failures.append(notes[cause])

    def _capture_once(self, n: int, ids: torch.Tensor, taps: tuple[str, ...]):
        static_ids = ids.clone()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up outside capture (allocator, lazy init, autotuning, compilation)
                self._small(static_ids, taps)
                self._set_position(self.seq_len)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            static_logits, static_features = self._eager(static_ids, taps, model_out=self._compiled)
        self._pool = graph.pool()
        self._set_position(self.seq_len)  # capture records but does not run the position update
        self._graphs[(n, taps)] = (graph, static_ids, static_logits, static_features)
        torch.cuda.synchronize(self.device)
        return self._graphs[(n, taps)]


_CAPTURE_NOTES: "weakref.WeakKeyDictionary[torch.nn.Module, dict[str, str]]" = weakref.WeakKeyDictionary()


def capture_notes(model: torch.nn.Module) -> list[str]:
    """One line per distinct reason a CUDA-graph capture of ``model``'s forwards failed in this process (those
    forwards ran eagerly), for the speedup panel's notes; [] when every capture succeeded (or none ran)."""
    return list(_CAPTURE_NOTES.get(model, {}).values())


def compile_error_text(exc: BaseException) -> str:
    """One line for a compile failure's log: the backend's own error (dynamo wraps it in
    ``BackendCompilerFailed``, whose first line names only the backend), type and first line."""
    inner = getattr(exc, "inner_exception", None) or exc
    text = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {text[0] if text else ''}"


def _raise_recompile_limit(at_least: int = 64) -> None:
    """Dynamo keeps compiled entries per code object (8 by default): every runner instance (target,
    drafter, pooled copies) x width kind (1 / dynamic) x hidden states on / off adds entries for the
    one ``_model_out``; past the limit dynamo silently runs eagerly. A process-wide setting, only raised."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(int(getattr(config, name)), at_least))

