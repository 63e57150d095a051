"""Export: one self-contained HTML report of a trace (every view), and PNGs where possible.

The report embeds plotly.js once (about 4.7 MB) so it opens offline. PNG export needs the
optional ``kaleido`` package (>= 1.0, which drives a local Chrome/Chromium); without it
:func:`figure_png` returns None and only HTML is exported.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

import plotly.graph_objects as go

from specviz.trace import Trace

from . import explain
from .common import as_trace
from .grid import step_grid_figure
from .source import source_figure, source_html
from .residual import clamp_selection, residual_figure
from .speed import speedup_html
from .stats import rate_set, rates_html, run_summary, stats_figure
from .stream import token_stream_html

SETTINGS_SHOWN = ("method", "num_speculative_tokens", "verify", "temperature", "top_k", "top_p", "max_new_tokens",
                  "seed", "prompt_lookup_min", "prompt_lookup_max", "target", "draft", "device", "dtype")


def figures(trace: Trace | dict[str, Any], step: int | None = None, position: int | None = None,
            baseline: dict[str, Any] | None = None) -> dict[str, go.Figure]:
    """Every Plotly view of ``trace`` at the selected (step, position): keys grid, residual,
    trie, stats. Raises TraceFormatError on a malformed dict; ValueError if the trace has no steps."""
    trace = as_trace(trace)
    if not trace.steps:
        raise ValueError("the trace has no steps to draw")
    s, i = clamp_selection(trace, step, position)
    return {"grid": step_grid_figure(trace, s, i), "residual": residual_figure(trace, s, i),
            "trie": source_figure(trace, s), "stats": stats_figure(trace, baseline)}


def settings_html(trace: Trace) -> str:
    """An HTML table of the run's main settings."""
    rows = "".join(f"<tr><td style='padding:2px 10px;color:#6b7280'>{k}</td>"
                   f"<td>{html.escape(json.dumps(trace.config.get(k)))}</td></tr>"
                   for k in SETTINGS_SHOWN if k in trace.config)
    return f"<table style='font-size:13px'>{rows}</table>"


def report_html(trace: Trace | dict[str, Any], step: int | None = None, position: int | None = None,
                baseline: dict[str, Any] | None = None) -> str:
    """A standalone HTML page with the settings, the token stream, every figure and its
    explanation, and the run's rates (:func:`~specviz.viz.stats.rates_html`) above the statistics. Raises
    TraceFormatError on a malformed dict; ValueError with no steps."""
    trace = as_trace(trace)
    figs = figures(trace, step, position, baseline)
    s, i = clamp_selection(trace, step, position)
    method = str(trace.config.get("method", "")) or None

    def fig_html(name: str, first: bool) -> str:
        return figs[name].to_html(full_html=False, include_plotlyjs=first, default_width="100%")

    def md(text: str) -> str:
        bold = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(text))
        text = re.sub(r"\*(.+?)\*", r"<i>\1</i>", bold)
        return f"<p style='max-width:60em;color:#374151'>{text}</p>"

    body = [
        "<h1>specviz trace report</h1>", settings_html(trace), md(explain.INTRO),
        "<h2>Token stream</h2>", md(explain.STREAM), token_stream_html(trace, s),
        "<h2>Step grid</h2>", md(explain.GRID_REPORT), fig_html("grid", True),
        "<h2>Residual view</h2>", md(explain.RESIDUAL), fig_html("residual", False),
        f"<h2>{html.escape(explain.source_heading(method).removeprefix('## 3 · '))}</h2>", md(explain.source_explain(method)),
        source_html(trace, s, i), fig_html("trie", False),
        # the app's summary block: tokens per target forward, mean acceptance length, draft acceptance rate, a
        "<h2>Run statistics</h2>", rates_html(rate_set(trace)), md(explain.STATS),
        speedup_html(run_summary(trace), baseline),
        fig_html("stats", False),
    ]
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>specviz report</title></head>"
            "<body style='font-family:system-ui,sans-serif;margin:24px'>" + "\n".join(body) + "</body></html>")


def figure_png(fig: go.Figure, width: int = 1000) -> bytes | None:
    """PNG bytes of ``fig`` via kaleido, or None if kaleido (or a browser for it) is missing."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return None
    try:
        return fig.to_image(format="png", width=width, height=fig.layout.height or 500)
    except Exception:  # kaleido present but no usable Chrome: fall back to HTML only
        return None
