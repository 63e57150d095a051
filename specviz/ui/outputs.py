"""What every handler returns, and the session state they share.

Session state (one ``gr.State`` per browser session) is a dict: ``trace`` (the last trace's dict, or None),
``baseline`` (its method-none comparison, measured beside it by :func:`specviz.speedup.measure_speedup`, or None),
``no_baseline`` (why there is none, shown in the speedup panel) and ``states`` ({method: the session's own state of
each method that keeps one across requests}, e.g. suffix's tree of earlier outputs: ``Method.request_state``).
Nothing else is shared between sessions except the lazily loaded models (:class:`~specviz.ui.cache.DecoderCache`).
User mistakes show a message in the progress line (and a ``gr.Warning`` toast) while every other output is
skipped, so the views stay as they were; the app stays up.
"""

from __future__ import annotations

import html
import os
from collections import namedtuple
from typing import Any

import gradio as gr

from specviz import methods
from specviz.trace import Trace

from .views import Views, all_views, default_selection

NO_COMPARE = ("Not compared with method none: tick “compare with method none” (advanced settings) and run to "
              "measure the speedup beside the run.")
STOPPED = ("This run was stopped, so its comparison with method none was not made (it is measured beside a run "
           "after the run ends, never taken from an earlier run). Run it to the end to measure the speedup.")
MEASURING = ("Measuring the speedup over method none beside this run (interleaved segments of both methods, "
             "after the run): the result appears here when it is done. Stop ends it.")
NO_PAIRS = ("Not compared with method none: comparison pairs is 0 (advanced settings). Raise it to measure the "
            "speedup beside the run.")
MEASURE_STOPPED = "The comparison with method none was stopped before it finished: Run again to measure it."
IS_NONE = "This run is method none itself: plain decoding, the baseline the other methods are compared with."
REPLAYED = "This uploaded trace carries no comparison with method none."
STALE_NOTE = "the views below are unchanged (from before this click)"


class RunOutputs(namedtuple("RunOutputs", ("progress", *Views._fields, "step", "position", "state"))):
    """The outputs of Run, Stop and an upload, in the layout's order: the progress line, every view
    (:class:`~specviz.ui.views.Views`' fields), both sliders (step, position) and the session state (``gr.skip()``
    where unchanged)."""

    __slots__ = ()

    @classmethod
    def only(cls, progress: Any, state: Any = None) -> "RunOutputs":
        """A progress line (and the state, when given); every other output unchanged."""
        skip = gr.skip()
        return cls(progress, *([skip] * (len(cls._fields) - 2)), skip if state is None else state)


def new_state() -> dict[str, Any]:
    """A fresh session state (gr.State deep-copies it per session: each gets its own method states)."""
    return {"trace": None, "baseline": None, "no_baseline": None,
            "states": {m.name: m.request_state() for m in methods.all_methods() if m.request_state is not None}}


def method_state(state: dict[str, Any], method: str) -> Any:
    """The session's own state of ``method`` (made if the session predates it); None for a method that keeps none."""
    spec = methods.get(method) if method in methods.names() else None
    if spec is None or spec.request_state is None:
        return None
    states = state.setdefault("states", {})
    if states.get(method) is None:
        states[method] = spec.request_state()
    return states[method]


def trace_of(state: dict[str, Any] | None) -> Trace | None:
    data = (state or {}).get("trace")
    return Trace.from_dict(data) if data else None


def sliders(trace: Trace, step: int, position: int) -> tuple[Any, Any]:
    n = len(trace.steps)
    k = len(trace.steps[step].draft_token_ids) if n else 0
    return (gr.Slider(minimum=0, maximum=max(n - 1, 1), value=step, step=1, interactive=n > 1),
            gr.Slider(minimum=1, maximum=max(k + 1, 2), value=position, step=1, interactive=k > 0))


def message_outputs(message: str, state: dict[str, Any] | None = None, note: str = STALE_NOTE) -> RunOutputs:
    """Outputs that show ``message`` in the progress line (and as a toast) and leave every view, both sliders and
    (unless given) the session state as they are. ``note`` (appended to the progress line) says what the views
    show, so nobody mistakes them for a result."""
    gr.Warning(message)
    return RunOutputs.only(f"**error** · {md_text(message)} · _{note}_", state)


def md_text(message: str) -> str:
    """``message`` for a Markdown line: HTML escaped, so an error quoting Python's "(<unknown>, line 1)" is shown,
    not taken for a tag that swallows the rest of the line."""
    return html.escape(str(message), quote=False)


def full_outputs(progress: str, trace: Trace, state: dict[str, Any]) -> RunOutputs:
    s, i = default_selection(trace)
    views = all_views(trace, s, i, state.get("baseline"), state.get("no_baseline"), bool(state.get("streamed")))
    return RunOutputs(progress, *views, *sliders(trace, s, i), state)


def num_tokens(trace: Trace) -> int:
    return sum(len(s.committed_token_ids) for s in trace.steps)


def number(value: Any, default: int) -> float:
    """``value`` as a finite float, else ``default`` (a slider's box may send anything)."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return default
    return f if f == f and abs(f) != float("inf") else default


def upload_bytes(path: str | None, max_bytes: int, what: str) -> bytes:
    """The bytes of an uploaded file (gradio's temporary ``path``), read only if at most ``max_bytes``. Raises
    ValueError with the message the progress line shows: no file, or too large for ``what`` (e.g. "traces")."""
    if not path:
        raise ValueError("no file received")
    size = os.path.getsize(path)
    if size > max_bytes:
        raise ValueError(f"the file is {size / 2**20:.1f} MB; {what} up to {max_bytes // 2**20} MB are accepted")
    with open(path, "rb") as f:
        return f.read()
