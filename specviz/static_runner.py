"""A pre-allocated (static) KV cache runner; rollback is moving a position. Optional CUDA graphs and torch.compile.

Design follows gpt-fast (pytorch-labs, ``generate.py``): the cache (transformers' own
:class:`~transformers.StaticCache`, fed to the model's own modules) is allocated once; rejecting drafts moves the
write position back and the stale entries are hidden by the mask until overwritten. Each layer keeps its write
position in a device tensor, so a captured forward needs no host input but the token ids.

CUDA graphs (``cuda_graphs=True``, CUDA only): every forward of n <= ``max_graph_tokens`` tokens after the prefill
replays a graph captured for that (n, taps). A prefill of up to ``prefill_buckets[-1]`` tokens is padded to the next
bucket and replayed too (run eagerly, a short prefill is bound by the host's kernel launches, not by the GPU): the
padding rows come after the prompt, so causal attention keeps them out of its rows, and their cache entries lie past
the position, hidden and later overwritten. A runner's first prefill runs eagerly once to allocate the cache, then
takes the same padded path as every later one. Feature taps are static buffers captured inside the graph and cloned
on the device after each replay (no host sync). A capture that fails logs once, is noted for the speedup panel
(:func:`capture_notes`) and leaves that width eager (a prefill bucket's too, unpadded).

torch.compile (``compile=True``, default :data:`COMPILE_DEFAULT`): :meth:`StaticRunner._model_out` (mask + model
call) and the tree forward's :meth:`~specviz.static_tree.StaticTreeForwards._tree_model_out` run compiled in
inductor's default mode, and on CUDA that compiled forward is what the runner's own graph captures (inductor's
``reduce-overhead`` keeps graphs of its own, which fail on top of HF's static cache). A compile or run failure logs
one warning, restores the position and runs eagerly from then on. See docs/gpu.md.

Tree forwards and the commit of an accepted path: :mod:`specviz.static_tree`.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Sequence

import torch

from .compiled_graphs import CompiledGraphs, raise_recompile_limit
from .attention import (attention_layout, experts_implementation, graph_experts_implementation, layer_masks,
                        static_cache)
from .fused_layers import fuse_decoder_layers, is_fused, unfuse_decoder_layers
from .graphs import CapturedGraphs, replay
from .runner import ForwardOutput, _layer_kv, as_tree, check_taps, pick_features
from .static_tree import TREE_BUCKETS, StaticTreeForwards
from .transfer import to_device

log = logging.getLogger(__name__)
COMPILE_DEFAULT = False  # compile=None means this (see the module docstring: off until measured on the H200)


class StaticRunner(StaticTreeForwards, CompiledGraphs, CapturedGraphs):
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
        fused: fuse the model's decoder layers (:func:`specviz.fused_layers.fuse_decoder_layers`, in place on
            ``model``; default: on CUDA); False unfuses them (in place too). ``fused`` says whether they are
            (compiled forwards trace transformers' layers all the same); ``fuse_note`` why not, when asked.
    Raises:
        ValueError: a forward would overflow the cache; truncate to an invalid length.
        specviz.attention.UnsupportedModelError: (a ValueError) a layout that cannot be rolled back or masked.
    """

    def __init__(self, model: torch.nn.Module, max_cache_len: int, cuda_graphs: bool | None = None,
                 max_graph_tokens: int = 33, compile: bool | None = None, compile_backend: str = "inductor",
                 tree_buckets: Sequence[int] | None | str = "auto", fused: bool | None = None):
        self.model = model
        self.layout = attention_layout(model.config)  # UnsupportedModelError (a ValueError) before any forward
        self.device = next(model.parameters()).device
        self.fuse_note = None
        if self.device.type == "cuda" if fused is None else fused:
            self.fuse_note = fuse_decoder_layers(model)  # None: fused; else why not (the layers stay transformers')
        elif fused is False:
            unfuse_decoder_layers(model)  # shared model: other runners' eager forwards too (not their captured graphs)
        self.fused = is_fused(model)
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
        # row counts a prefill is padded to, to replay a graph (None: eager prefills)
        self.prefill_buckets = prefill_buckets(self.max_graph_tokens) if self.cuda_graphs else None
        self._kv: torch.Tensor | None = None  # [2 * layers, H, max_cache_len, D]: every layer's K and V (_stack_kv)
        self._kv_checked = False  # _stack_kv ran (after the first forward)
        self._compiled = self._compiled_tree = None
        self._init_compiled_graphs()  # compile can also be switched on later: enable_compile, recompile
        if COMPILE_DEFAULT if compile is None else bool(compile):
            raise_recompile_limit()
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
        rows, width = n, self._prefill_width(n)
        if width is not None and self.cuda_graphs and self._graphs.get((width, taps), ()) is None:
            width = None  # that bucket's capture failed: an eager prefill gains nothing from padding
        if width is not None:
            if not self._kv_checked:  # transformers allocates the cache in the first forward: run it, then replay
                self._eager(ids, taps)
                self._stack_kv()
                self._set_position(0)
            ids, n = torch.cat([ids, ids[:, -1:].expand(1, width - rows)], dim=1), width  # [1, width]
        entry = None
        if self.cuda_graphs and (self.seq_len > 0 or width is not None) and n <= self.max_graph_tokens:
            entry = self._graphs[(n, taps)] if (n, taps) in self._graphs else self._capture(n, ids, taps)
        if entry is not None:  # None: no graphs here, or this width's capture failed (logged): eager
            graph, static_ids, static_logits, static_features = entry
            static_ids.copy_(ids)
            self._replay(graph)
            self._count_replay((n, taps))
            logits = static_logits[0, :rows].to(torch.float32, copy=True)  # [rows, V]; the buffer is reused
            features = {tap: h[:rows].clone() for tap, h in static_features.items()}  # [rows, d] each; reused too
        else:
            small = (self.seq_len > 0 or width is not None) and n <= self.max_graph_tokens
            logits, features = self._small(ids, taps) if small else self._eager(ids, taps)
            logits = logits[0, :rows].float()
            features = {tap: h[:rows] for tap, h in features.items()}
        self.seq_len += rows
        if width is not None:
            self._set_position(rows)  # the padding's entries lie past it
        if not self._kv_checked:
            self._stack_kv()
        return ForwardOutput(logits, features)

    def _prefill_width(self, n: int) -> int | None:
        """The row count a prefill of ``n`` tokens is padded to, or None (not a prefill, no buckets, too long, or the
        padding would not fit the cache)."""
        if self.seq_len or not self.prefill_buckets or n > self.prefill_buckets[-1]:
            return None
        width = next(b for b in self.prefill_buckets if b >= n)
        return width if width <= self.max_cache_len else None

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
        self._compile_gave_up = True
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
                        self._compile_gave_up = True
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
        self._note_capture((n, taps), self._compiled is not None)
        torch.cuda.synchronize(self.device)
        return self._graphs[(n, taps)]


def prefill_buckets(max_graph_tokens: int) -> tuple[int, ...]:
    """The row counts prefills are padded to: 8, 16, then ``max_graph_tokens`` (a verify width's graph too)."""
    return tuple(b for b in (8, 16) if b < max_graph_tokens) + (max_graph_tokens,)


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
