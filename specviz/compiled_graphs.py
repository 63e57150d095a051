"""A static runner's CUDA graphs recaptured through torch.compile one at a time, behind served ones (a mixin of
:class:`~specviz.static_runner.StaticRunner`).

A runner built uncompiled serves its graphs at once; :meth:`CompiledGraphs.enable_compile` switches compile on, and
:meth:`CompiledGraphs.recompile` replaces one captured graph (a chain width or a tree bucket, with its taps) by the
same forward compiled (inductor) and captured again. The old graph serves until the new one is captured; a compile
or capture that fails leaves the old one in place. Which graphs a request replayed compiled is counted
(:attr:`CompiledGraphs.replays`), so a trace says which runner measured it (:func:`compiled_label`).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch


class CompiledGraphs:
    """Uses the runner's ``_graphs``, ``_compiled``, ``_compiled_tree``, ``_model_out``, ``_tree_model_out``,
    ``model``, ``cuda_graphs``, ``reset``, ``forward`` and ``forward_features``."""

    _graphs: dict
    _compiled: Any
    _compiled_tree: Any

    def _init_compiled_graphs(self) -> None:
        self._compiled_keys: set = set()  # graph keys captured with the compiled forward
        self.replays = [0, 0]  # graph replays so far: [compiled, uncompiled]
        self._compile_gave_up = False  # a compile failed: never switched on again

    def enable_compile(self, backend: str = "inductor") -> bool:
        """Compile from now on: later captures and :meth:`recompile` use the compiled forwards (the graphs captured
        so far keep serving). Returns whether compile is on (False after a compile failure on this runner)."""
        if self._compiled is None and not self._compile_gave_up:
            raise_recompile_limit()
            self._compiled = torch.compile(self._model_out, backend=backend, dynamic=None)
            self._compiled_tree = torch.compile(self._tree_model_out, backend=backend, dynamic=None)
        return self._compiled is not None

    def compiled_keys(self) -> list:
        """Keys of the captured graphs that run the compiled forward."""
        return [key for key, entry in self._graphs.items() if entry is not None and key in self._compiled_keys]

    def uncompiled_keys(self) -> list:
        """Keys of the captured graphs that run the uncompiled forward (failed captures excluded)."""
        return [key for key, entry in self._graphs.items() if entry is not None and key not in self._compiled_keys]

    def recompile(self, key: tuple, prompt: Sequence[int]) -> bool:
        """Capture graph ``key`` again with the compiled forward (after an eager prefill of ``prompt``, as the warm-up
        captures) and swap it in. Returns whether the graph now runs compiled; on a compile or capture failure
        (logged by the capture) the old graph stays. Call with no request using this runner (a warm-up unit)."""
        if key in self._compiled_keys or not self.enable_compile():
            return key in self._compiled_keys
        old = self._graphs.pop(key, None)
        try:
            capture_key(self, prompt, key)
        finally:
            if self._graphs.get(key) is None or key not in self._compiled_keys:
                if old is not None:
                    self._graphs[key] = old  # keep serving the uncompiled graph
            self.reset()
        return key in self._compiled_keys

    def _note_capture(self, key: tuple, compiled: bool) -> None:
        """A capture of ``key`` succeeded: remember whether it runs the compiled forward."""
        if compiled:
            self._compiled_keys.add(key)
        else:
            self._compiled_keys.discard(key)

    def _count_replay(self, key: tuple) -> None:
        self.replays[0 if key in self._compiled_keys else 1] += 1


def runner_kind(label: str) -> str:
    """A :func:`compiled_label` without its counts ("compiled", "uncompiled", "partly compiled"): two requests on one
    runner whose graphs are partly compiled replay different shares of them, which is not a change of runner."""
    return str(label).split(" (")[0]


def compiled_label(before: Sequence[int], after: Sequence[int]) -> str | None:
    """Which graphs a request replayed, from a runner's :attr:`CompiledGraphs.replays` before and after it:
    "compiled", "uncompiled", "partly compiled (c of n forwards)", or None when it replayed no graph (eager)."""
    compiled, uncompiled = after[0] - before[0], after[1] - before[1]
    if compiled + uncompiled == 0:
        return None
    if uncompiled == 0:
        return "compiled"
    if compiled == 0:
        return "uncompiled"
    return f"partly compiled ({compiled} of {compiled + uncompiled} forwards)"


def capture_key(runner, prompt: Sequence[int], key: tuple) -> None:
    """:func:`capture_shape` of a graph key: (n, taps) a chain width, ("tree", n, taps) a tree bucket."""
    tree = key[0] == "tree"
    n, taps = (key[1], key[2]) if tree else (key[0], key[1])
    capture_shape(runner, list(prompt), n, taps, tree)


def capture_shape(runner, prompt: list[int], n: int, taps: tuple[str, ...], tree: bool) -> None:
    """One forward of ``n`` rows after an eager prefill of ``prompt`` (graphs need a filled cache): a chain's verify
    width, or with ``tree`` a tree forward of that size bucket (the root + n - 1 nodes)."""
    runner.reset()
    runner.forward(torch.tensor(prompt, dtype=torch.long))
    base = runner.seq_len
    rows = torch.tensor(prompt[-1:] * n, dtype=torch.long)
    runner.forward_features(rows, taps, parents=[-1] * (n - 1)) if tree else runner.forward_features(rows, taps)
    runner.truncate(base)


def raise_recompile_limit(at_least: int = 256) -> None:
    """Dynamo keeps compiled entries per code object (8 by default): every runner instance (target,
    drafter, pooled copies) x width kind (1 / dynamic) x hidden states on / off adds entries for the
    one ``_model_out``; past the limit dynamo silently runs eagerly (256: 8 entries per instance, the app's
    concurrent sessions each leasing their own target and draft runners). A process-wide setting, only raised."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(int(getattr(config, name)), at_least))
