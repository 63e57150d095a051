"""Where a step's draft came from: each method's own view (its ``view`` module, :mod:`specviz.methods.base` gives
the contract), looked up in the method registry by the trace's method. A method without a view, or a trace of a
method this installation does not know, gets a note instead. Pure functions of the trace (no model, no gradio).
"""

from __future__ import annotations

import html
import importlib
from types import ModuleType
from typing import Any

import plotly.graph_objects as go

from specviz import methods
from specviz.trace import Trace

from .common import as_trace
from .residual import message_figure


def view_module(trace: Trace) -> ModuleType | None:
    """The view module of the trace's method (None for method none, an unknown method or one without a view)."""
    name = str(trace.config.get("method", ""))
    if name not in methods.names() or not methods.get(name).view:
        return None
    return importlib.import_module(methods.get(name).view)


def hook(trace: Trace, name: str) -> Any:
    """The view module's function ``name`` for the trace's method, or None."""
    module = view_module(trace)
    return getattr(module, name, None) if module is not None else None


def _no_view_text(trace: Trace, step: int) -> str:
    name = str(trace.config.get("method", ""))
    if name == "none":
        return methods.NONE.texts.how
    return f"Step {trace.steps[step].index}: method {name!r} records no view of its drafts."


def source_html(trace: Trace | dict[str, Any], step: int, position: int | None = None) -> str:
    """The left panel of "where the draft came from" at ``step`` (``position`` highlighted where the view has one).
    Raises IndexError if ``step`` is not a step of the trace."""
    trace = as_trace(trace)
    module = view_module(trace)
    if module is None:
        trace.steps[step]  # IndexError for a step the trace does not have
        return (f'<div class="sv-match-empty" style="padding:12px;color:#374151">'
                f'{html.escape(_no_view_text(trace, step))}</div>')
    return module.panel_html(trace, step, position)


def source_figure(trace: Trace | dict[str, Any], step: int) -> go.Figure:
    """The right panel of "where the draft came from" at ``step``."""
    trace = as_trace(trace)
    if not trace.steps:
        return message_figure("no steps", height=160)
    module = view_module(trace)
    if module is None:
        return message_figure(f"step {trace.steps[step].index}: nothing drafted to draw", height=160)
    return module.panel_figure(trace, step)


def source_note(trace: Trace) -> str:
    """The method's hint for the run summary ("" for none), then :func:`draft_limit_note`'s line."""
    note = hook(trace, "note")
    return "\n\n".join(n for n in ((note(trace) if note else ""), draft_limit_note(trace)) if n)


def draft_limit(trace: Trace) -> tuple[int, str, str] | None:
    """(most draft tokens per step, a short reason, the reason in full) for a method whose proposer drafts fewer than
    k = num_speculative_tokens by design (its view's ``draft_limit``), else None."""
    limit = hook(trace, "draft_limit")
    return limit(trace) if limit is not None else None


def draft_limit_note(trace: Trace) -> str:
    """One line for the run summary when :func:`draft_limit` applies ("" otherwise): why columns x(n+1)..xk of the
    step grid stay empty."""
    limit = draft_limit(trace)
    if limit is None:
        return ""
    n, _, why = limit
    k = int(trace.config["num_speculative_tokens"])
    cols = f"x{n + 1}" if n + 1 == k else f"x{n + 1}–x{k}"
    return f"k = {k}, but {why}, so column{'s' if n + 1 < k else ''} {cols} of the step grid stay{'s' if n + 1 == k else ''} empty."
