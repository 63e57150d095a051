"""The static head runner: a pre-allocated per-slot cache and, on CUDA, one captured graph per call kind and width
(:mod:`specviz.methods.eagle.runner` describes both runners and the contract they share)."""

from __future__ import annotations

import functools
import logging
import time

import torch

from specviz.graphs import CapturedGraphs, capture
from specviz.compiled_graphs import raise_recompile_limit
from specviz.static_runner import COMPILE_DEFAULT, compile_error_text

from .head import _Head, position_mask

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 33)  # first-pass widths captured: c committed pairs run as the smallest B >= c
TREE_SCRATCH = 128  # slots past max_len for a draft tree's nodes (never visible to chain rows: slot > position)


def _check_sees(sees: torch.Tensor, rows: int, min_cols: int, max_cols: int | None = None) -> None:
    """``sees`` must be a bool tensor [rows, S] with min_cols <= S (<= max_cols). Raises ValueError."""
    if not (isinstance(sees, torch.Tensor) and sees.dtype == torch.bool and sees.dim() == 2 and sees.shape[0] == rows
            and sees.shape[1] >= min_cols and (max_cols is None or sees.shape[1] <= max_cols)):
        raise ValueError(f"tree_level: sees must be a bool tensor [{rows}, S] with S >= {min_cols}"
                         + (f" and S <= {max_cols}" if max_cols else "") + f", got "
                         f"{getattr(sees, 'dtype', type(sees).__name__)} {list(getattr(sees, 'shape', []))}")


class SlotCache:
    """The head's KV cache as two pre-allocated tensors [1, H_kv, max_len, head_dim] (zeros at first).

    ``update(k, v, layer_idx)`` (transformers' cache call from ``LlamaAttention``) writes the rows at
    ``self.slots`` (int64 [T] on the device: the rows' positions, set by the runner before each
    call) and returns every slot; the caller passes a mask over all ``max_len`` slots."""

    def __init__(self, num_kv_heads: int, head_dim: int, max_len: int, dtype: torch.dtype, device: torch.device):
        shape = (1, num_kv_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.slots: torch.Tensor | None = None

    def update(self, key_states, value_states, layer_idx: int = 0, *args, **kwargs):
        """key_states / value_states [1, H_kv, T, head_dim] -> (keys, values) [1, H_kv, max_len, head_dim]."""
        self.keys.index_copy_(2, self.slots, key_states.to(self.keys.dtype))
        self.values.index_copy_(2, self.slots, value_states.to(self.values.dtype))
        return self.keys, self.values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The number of key slots :meth:`update` returns (all of them; the mask hides the unused ones)."""
        return self.max_len


class StaticHeadRunner(CapturedGraphs):
    """Static per-slot KV cache for a :mod:`specviz.heads` head, with CUDA graphs on CUDA (see the module docstring).

    Args:
        head: an ``EagleHead`` / ``Eagle3Head`` attached to its target, in eval mode.
        max_len: slots of the cache (positions 0..max_len-1; the target runner's ``max_cache_len`` suffices).
        cuda_graphs: capture/replay graphs (default: on CUDA devices).
        compile: run the head's calls through ``torch.compile`` (inside the graphs on CUDA; see the
            module docstring; default :data:`specviz.static_runner.COMPILE_DEFAULT`). ``compile_backend``:
            its backend ("inductor"; the CPU tests use "eager" / "aot_eager"). ``compiled`` says whether
            it is (still) in use.
    Raises:
        ValueError: not a specviz head; a call whose rows would run past ``max_len``.
    """

    def __init__(self, head: torch.nn.Module, max_len: int, cuda_graphs: bool | None = None,
                 compile: bool | None = None, compile_backend: str = "inductor"):
        if not isinstance(head, _Head):
            raise ValueError(f"StaticHeadRunner needs a specviz.heads head (EagleHead / Eagle3Head), got "
                             f"{type(head).__name__}; use EagerHeadRunner for other modules")
        self.head = head
        self.device = next(head.parameters()).device
        self.max_len = int(max_len)
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        cfg = head.config
        # positions 0..max_len-1 at their own slots, then TREE_SCRATCH slots for tree nodes (tree_level)
        self.cache = SlotCache(cfg.num_key_value_heads, cfg.head_dim, self.max_len + TREE_SCRATCH, head.dtype,
                               self.device)
        # (kind, width) -> (graph, {name: static input}, (static hidden [B, d], static logits [B, V])); None = failed
        self._graphs: dict[tuple[str, int], tuple | None] = {}
        self._pool = None
        self._arange = torch.arange(max(BUCKETS), device=self.device)
        self._scratch_rows = torch.arange(TREE_SCRATCH, device=self.device)
        self._slot_ids = torch.arange(self.cache.max_len, device=self.device)  # every slot, for the tree masks
        self.capture_s = 0.0  # seconds spent capturing so far (the engine excludes it from step times)
        self.replays = 0  # graph replays so far (tests check that the graph path ran)
        self._compiled: dict[str, object] | None = None  # name of the eager method -> its compiled version
        self._draft_fns: dict[tuple, object] = {}  # tree_draft key -> the first fn given for it (stable for dynamo)
        if COMPILE_DEFAULT if compile is None else bool(compile):
            raise_recompile_limit()
            self._compiled = {name: torch.compile(getattr(self, name), backend=compile_backend, dynamic=False)
                              for name in ("_forward", "_forward_tree", "_draft_body")}

    @property
    def compiled(self) -> bool:
        """Whether the head's calls run compiled (False when off, or after a compile failure)."""
        return self._compiled is not None

    def _call(self, name: str, *args):
        """``getattr(self, name)(*args)``, compiled when on; a compile or run failure is logged once, compile
        switched off for this runner and the call rerun eagerly (its K/V writes rewrite the same slots)."""
        if self._compiled is not None:
            try:
                return self._compiled[name](*args)
            except Exception as exc:  # noqa: BLE001 - compile problems must not fail the request
                log.warning("specviz: torch.compile of the %s head's %s failed, running it eagerly: %s",
                            self.head.config.kind, name, compile_error_text(exc))
                self._compiled = None
        return getattr(self, name)(*args)

    def reset(self) -> None:
        """Nothing to drop: every slot a request reads is written by that request first (its prefill's first pass)."""

    def truncate(self, length: int) -> None:
        """Nothing to do: slots >= ``length`` are hidden by the mask until a later row at their position rewrites them."""

    @torch.inference_mode()
    def first_pass(self, features: torch.Tensor, ids: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`EagerHeadRunner.first_pass`: features [c, F], ids int64 [c] at positions start.. ->
        (hidden [1, d], logits float32 [V]) of row c-1."""
        c = int(ids.shape[0])
        width = next((b for b in BUCKETS if b >= c), c)
        if width == c or start + width > self.max_len:
            width = c  # no padding (exact width; eager unless c is itself a captured width)
        self._check_room(start, width)
        hidden, logits = self._run("first", width, features, ids, start, c)
        return hidden[c - 1:c].clone(), logits[c - 1].clone()

    @torch.inference_mode()
    def step(self, hidden: torch.Tensor, token: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`EagerHeadRunner.step`: hidden [1, d], token int64 [1] at ``position`` ->
        (hidden [1, d], logits float32 [V])."""
        self._check_room(position, 1)
        out_hidden, logits = self._run("step", 1, hidden, token, position, 1)
        return out_hidden.clone(), logits[0].clone()

    tree_scratch = TREE_SCRATCH  # scratch rows a step's tree levels may write

    @torch.inference_mode()
    def tree_level(self, hidden: torch.Tensor, tokens: torch.Tensor, position: int, committed: int, first: int,
                   sees: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One level of a draft tree (EAGLE-2, docs/design/methods.md 1.3): R rows at the same ``position``, row r
        writing its K/V to scratch row ``first + r`` (slot ``max_len + first + r``) and attending the ``committed`` positions
        and the scratch rows that ``sees`` marks (bool [R, S], S <= TREE_SCRATCH: its ancestors and itself; on
        the head's device it is never read by the host). hidden [R, d] (each row's parent output), tokens int64
        [R] -> (hidden [R, d], logits float32 [R, V]), new tensors. One CUDA graph per R on CUDA (inputs copied
        into static buffers, no host wait).
        Raises ValueError when a scratch row is outside 0..TREE_SCRATCH-1 or ``sees`` has the wrong shape."""
        R = int(tokens.shape[0])
        if first < 0 or first + R > TREE_SCRATCH:
            raise ValueError(f"tree_level: scratch rows must be in 0..{TREE_SCRATCH - 1}, got {first}..{first + R - 1}")
        _check_sees(sees, R, first + R, TREE_SCRATCH)
        key = ("tree", R)
        entry = self._graphs.get(key) if self.cuda_graphs else None
        inputs = entry[1] if entry is not None else self._tree_inputs(R)
        inputs["hidden"].copy_(hidden)
        inputs["ids"].copy_(tokens)
        inputs["pos"].fill_(position)
        torch.add(self._scratch_rows[:R], self.max_len + first, out=inputs["slots"])  # no host-to-device copy
        inputs["mask"][0, 0].copy_(self._level_mask(R, committed, sees))
        if self.cuda_graphs and key not in self._graphs:
            entry = self._remember(key, lambda: self._call("_forward_tree", inputs), inputs, f"tree level ({R} rows)")
        if entry is None:
            out_hidden, logits = self._call("_forward_tree", inputs)
        else:
            entry[0].replay()
            self.replays += 1
            out_hidden, logits = entry[2]
        return out_hidden.clone(), logits.float().clone()

    def _tree_inputs(self, R: int) -> dict[str, torch.Tensor]:
        d = self.head.config.hidden_size
        return {"hidden": torch.zeros(R, d, dtype=self.head.dtype, device=self.device),
                "ids": torch.zeros(R, dtype=torch.long, device=self.device),
                "pos": torch.zeros(R, dtype=torch.long, device=self.device),
                "slots": torch.zeros(R, dtype=torch.long, device=self.device),
                "mask": torch.zeros(1, 1, R, self.cache.max_len, dtype=torch.bool, device=self.device)}

    def _level_mask(self, R: int, committed: int | torch.Tensor, sees: torch.Tensor) -> torch.Tensor:
        """bool [R, every slot] of one tree level, by device ops (``committed`` an int, or a 0-dim device tensor
        inside a captured draft): the committed slots 0..committed-1 and the scratch columns max_len + j that
        ``sees`` [R, S] marks."""
        mask = (self._slot_ids < committed).expand(R, -1).clone()
        mask[:, self.max_len:self.max_len + sees.shape[1]] = sees
        return mask

    def _forward_tree(self, inputs):
        self.cache.slots = inputs["slots"]
        return self.head(inputs["hidden"], inputs["ids"], inputs["pos"], self.cache, from_target=False,
                         attention_mask=inputs["mask"])

    def _remember(self, key: tuple, fn, inputs, what: str):
        """Capture ``fn`` (:func:`specviz.graphs.capture`, the runner's pool) and keep (graph, inputs, outputs)
        under ``key``; a failure is logged once and remembered as None (that call then runs eagerly). The time
        spent counts in ``capture_s``. Returns the entry."""
        t0 = time.perf_counter()
        try:
            graph, outputs = capture(fn, self.device, self._pool)
            self._pool = graph.pool()
            self._graphs[key] = (graph, inputs, outputs)
        except Exception as exc:  # noqa: BLE001 - a failed capture must not fail the request
            log.warning("specviz: CUDA graph capture of the %s head's %s failed, running it eagerly: %s: %s",
                        self.head.config.kind, what, type(exc).__name__, exc)
            self._graphs[key] = None
        self.capture_s += time.perf_counter() - t0
        return self._graphs[key]

    # ---- a whole draft tree as one graph ---------------------------------------------------------
    @torch.inference_mode()
    def tree_draft(self, key: tuple, fn, hidden: torch.Tensor, logits: torch.Tensor, position: int,
                   committed: int) -> torch.Tensor:
        """Run a tree drafter ``fn(hidden, logits, level) -> packed`` from the root row (hidden [1, d],
        logits float32 [V] of the first pass's last row), where ``level(i, first, h, tokens, sees) ->
        (hidden [R, d], logits float32 [R, V])`` is one tree level at position ``position + i`` writing scratch
        rows first..first+R-1 and attending the ``committed`` positions and the scratch rows ``sees`` marks
        (bool [R, S]). ``fn`` must be replayable (device ops only, shapes fixed by ``key``): on CUDA the
        whole draft is ONE graph per key (captured on first use), replayed with the root row, position and
        committed length copied into static buffers (no host wait). Returns a new tensor (``fn``'s output).
        Raises ValueError when the levels' scratch rows run past TREE_SCRATCH."""
        self._check_room(position, 1)
        entry = self._graphs.get(key) if self.cuda_graphs else None
        inputs = entry[1] if entry is not None else self._draft_inputs(hidden, logits)
        inputs["hidden"].copy_(hidden)
        inputs["logits"].copy_(logits)
        inputs["pos"].fill_(position)
        inputs["committed"].fill_(committed)
        fn = self._draft_fns.setdefault(key, fn)  # one fn object per key: what a compiled draft guards on
        run = lambda: self._call("_draft_body", fn, inputs)  # noqa: E731
        if self.cuda_graphs and key not in self._graphs:
            entry = self._remember(key, run, inputs, f"draft tree {key}")
        if entry is None:
            return run()
        entry[0].replay()
        self.replays += 1
        return entry[2].clone()

    def _draft_body(self, fn, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        """What :meth:`tree_draft` runs (and compiles, and captures): ``fn`` over the static root inputs."""
        return fn(inputs["hidden"], inputs["logits"], functools.partial(self._level_tensors, inputs))

    def _draft_inputs(self, hidden: torch.Tensor, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"hidden": torch.zeros_like(hidden, dtype=self.head.dtype, device=self.device),
                "logits": torch.zeros_like(logits, dtype=torch.float32, device=self.device),
                "pos": torch.zeros((), dtype=torch.long, device=self.device),
                "committed": torch.zeros((), dtype=torch.long, device=self.device)}

    def _level_tensors(self, inputs, i: int, first: int, hidden: torch.Tensor, tokens: torch.Tensor,
                       sees: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One tree level inside :meth:`tree_draft`: position and committed length read from the static
        buffers by device ops (so the level can be captured), the mask built on the device."""
        R = int(tokens.shape[0])
        if first + R > TREE_SCRATCH or sees.shape[1] > TREE_SCRATCH:
            raise ValueError(f"tree_draft: scratch rows {first}..{first + R - 1} run past {TREE_SCRATCH}")
        self.cache.slots = self._scratch_rows[first:first + R] + self.max_len
        pos = (inputs["pos"] + i).expand(R)
        mask = self._level_mask(R, inputs["committed"], sees)
        out, logits = self.head(hidden, tokens, pos, self.cache, from_target=False, attention_mask=mask[None, None])
        return out, logits.float()

    def warm_up(self, max_width: int) -> int:
        """Capture the draft-step graph and every first-pass bucket up to ``max_width`` rows (k + 1), at
        positions 0.. (the slots written are rewritten by the next request's prefill). Returns the
        number of graphs now captured (0 without graphs)."""
        if not self.cuda_graphs:
            return 0
        d, F = self.head.config.hidden_size, self.head.config.feature_size
        zeros = torch.zeros((), dtype=torch.long, device=self.device)
        self.step(torch.zeros(1, d, dtype=self.head.dtype, device=self.device), zeros.view(1), 0)
        for b in BUCKETS:
            if b <= max(1, max_width):
                self.first_pass(torch.zeros(b, F, dtype=self.head.dtype, device=self.device), zeros.repeat(b), 0)
        return sum(g is not None for g in self._graphs.values())

    # ---- internals ---------------------------------------------------------------------------
    def _check_room(self, start: int, width: int) -> None:
        if start < 0 or start + width > self.max_len:
            raise ValueError(f"the head's KV cache holds {self.max_len} positions; rows at {start}..{start + width - 1} "
                             "do not fit (shorten the prompt or max_new_tokens)")

    def _run(self, kind: str, width: int, features: torch.Tensor, ids: torch.Tensor, start: int, c: int):
        """The head on ``width`` rows (the first c real) at positions start..: graph replay when captured
        (or capturable now), else eager. Returns (hidden [width, d], logits [width, V]); graph outputs are
        the static buffers (the caller copies what it keeps before the next call)."""
        key = (kind, width)
        use_graph = self.cuda_graphs and (kind == "step" or width in BUCKETS)
        entry = self._graphs.get(key) if use_graph else None
        if use_graph and key not in self._graphs:
            entry = self._capture(key, features, ids, start, c)
        if entry is None:
            inputs = self._inputs(width)
            self._fill(inputs, features, ids, start, c)
            return self._call("_forward", kind, inputs)
        graph, inputs, outputs = entry
        self._fill(inputs, features, ids, start, c)
        graph.replay()
        self.replays += 1
        return outputs

    def _inputs(self, width: int) -> dict[str, torch.Tensor]:
        F = self.head.config.feature_size
        return {"features": torch.zeros(width, F, dtype=self.head.dtype, device=self.device),
                "ids": torch.zeros(width, dtype=torch.long, device=self.device),
                "pos": torch.zeros(width, dtype=torch.long, device=self.device)}

    def _fill(self, inputs: dict[str, torch.Tensor], features, ids, start: int, c: int) -> None:
        """Copy the c real rows into the (static) inputs; positions start..start+width-1 (padding rows too)."""
        inputs["features"][:c, : features.shape[-1]].copy_(features)  # a step's hidden [1, d]: the first d columns
        inputs["ids"][:c].copy_(ids)
        width = inputs["pos"].shape[0]
        if width <= self._arange.numel():
            torch.add(self._arange[:width], start, out=inputs["pos"])
        else:  # a wide first pass (the prefill's), never captured
            inputs["pos"].copy_(torch.arange(start, start + width, device=self.device))

    def _forward(self, kind: str, inputs: dict[str, torch.Tensor]):
        """One eager head forward over the slot cache (also what a graph captures)."""
        from_target = kind == "first"
        d = self.head.config.hidden_size
        feats = inputs["features"] if from_target else inputs["features"][:, :d]
        pos = inputs["pos"]
        self.cache.slots = pos
        mask = position_mask(pos[None], self.cache.max_len)  # [1, 1, width, slots]: slot s visible iff s <= position
        return self.head(feats, inputs["ids"], pos, self.cache, from_target=from_target, attention_mask=mask)

    def _capture(self, key: tuple[str, int], features, ids, start: int, c: int):
        """Capture one head forward of ``key``'s kind and width (:meth:`_remember`: two warm-up runs on a side
        stream, then the capture, into one memory pool shared by the runner's graphs). The warm-up runs write
        the call's own K/V at its own slots (idempotent)."""
        kind, width = key
        inputs = self._inputs(width)
        self._fill(inputs, features, ids, start, c)
        return self._remember(key, lambda: self._call("_forward", kind, inputs), inputs, f"{kind} call (width {width})")
