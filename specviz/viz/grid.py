"""The step grid: verification steps (rows) x draft positions (columns), one cell per token.

Columns x1..xk hold the draft tokens, coloured by the target's decision (accepted, rejected,
unused after the rejection); the last column holds the step's own token (recovered from the
residual, bonus after a full accept, or a plain target token when nothing was drafted). The
token text is written in every cell; hovering shows p, q, u and min(1, p/q).
"""

from __future__ import annotations

import html
import math
import textwrap
from typing import Any

import plotly.graph_objects as go

from specviz.trace import Step, Trace

from .lesson_decision import own_token_source, test_sentence
from .source import draft_limit

from .common import (
    FATE_STYLE,
    FATES,
    as_trace,
    emitted_fate,
    fate_label,
    fmt_prob,
    position_fate,
    quoted,
    residual_prob,
    stopped_in_drafts,
    token_text,
    tokenwise_accepted,
    visible,
)

VISIBLE_ROWS = 22  # rows shown at once; pan/zoom the y axis for the rest
PLOT_PX = 400  # the grid's plot area at the narrowest page the app supports (1024 px: a 472 px figure)
CHAR_EM = 0.62  # width of a monospace character, in units of the font size (DejaVu Sans Mono: 0.602)
ROW_PX = 26
MIN_HEIGHT = 340  # a run of few steps still leaves room for the legend below the grid (it wraps at 1024 px)


def _colorscale() -> list[list[Any]]:
    """Stepwise colour scale: category c in FATES occupies [c/n, (c+1)/n]."""
    n, scale = len(FATES), []
    for c, fate in enumerate(FATES):
        colour = FATE_STYLE[fate][0]
        scale += [[c / n, colour], [(c + 1) / n, colour]]
    return scale


def cell_font(ncol: int) -> tuple[int, int]:
    """(font size px, characters per cell) so that a cell's text fits its column when the grid of
    ``ncol`` columns is drawn in :data:`PLOT_PX` pixels (wider pages only add room); longer tokens
    are cut with "…" and shown whole on hover; columns too narrow for two characters get none (0)."""
    pitch = PLOT_PX / max(ncol, 1) - 6  # the column minus the gap and a margin
    size = 11 if pitch >= 60 else (10 if pitch >= 30 else 8)
    chars = int(pitch / (CHAR_EM * size))
    return size, min(chars, 12) if chars >= 2 else 0


def cell_label(trace: Trace, token_id: int, width: int) -> str:
    """A grid cell's text: :func:`~specviz.viz.common.visible` (runs of 4+ spaces as ␣×n, as every view writes
    them), cut to ``width`` characters."""
    if width <= 0:
        return ""
    s = visible(token_text(trace, token_id))
    return html.escape(s if len(s) <= width else s[: width - 1] + "…", quote=False)


def _draft_cell(trace: Trace, step: Step, i: int, width: int = 10) -> tuple[int, str, str]:
    fate = position_fate(step, i)
    tok = step.draft_token_ids[i - 1]
    pos = step.positions[i - 1] if i <= len(step.positions) else None
    tokenwise = tokenwise_accepted(step)
    rescued = tokenwise is not None and tokenwise < i <= step.num_accepted
    hover = f"step {step.index}, draft position {i}: {fate}<br>token {quoted(trace, tok)} (id {tok})"
    if pos is not None and fate == "unused":  # after the first rejection: no verdict, only its numbers
        hover += (f"<br>never tested (a token before it was rejected)<br>p(x) = {fmt_prob(pos.p)}, "
                  f"q(x) = {fmt_prob(pos.q)}")
    elif pos is not None:  # the run's own rule, with its numbers (greedy, standard, block, typical, synthetic, trees)
        hover += "<br>" + "<br>".join(textwrap.wrap(test_sentence(trace, step, pos), 90))  # already HTML-escaped
    if fate == "stop":
        hover += ("<br>accepted, and the request stops at it: every statistic counts it as the step's own token"
                  " (1 + accepted drafts), not as an accepted draft; the bonus token was dropped")
    if rescued:
        hover += (f"<br>★ accepted by block verification (τ = {step.num_accepted}); token-wise verification "
                  f"would have stopped after {tokenwise}")
    text = cell_label(trace, tok, width - rescued)
    return FATES.index(fate), ("★" + text if rescued else text), hover


def _own_cell(trace: Trace, step: Step, width: int = 10) -> tuple[int, str, str]:
    fate = emitted_fate(step)
    tok = step.emitted.token_id
    slot = step.num_accepted + 1
    dropped = " (dropped at the stop)" if fate == "cut" else ""
    kind = own_token_source(trace, step) if step.emitted.kind == "recovered" else f"{step.emitted.kind} token"
    hover = (f"step {step.index}, slot {slot}: {kind}{dropped}"
             f"<br>token {quoted(trace, tok)} (id {tok})<br>p(x) = "
             f"{fmt_prob(step.emitted.p) if step.emitted.p is not None else 'not recorded'}")
    if step.emitted.residual_empty:
        hover += "<br>residual empty (Z = 0): drawn from p instead, so it may equal the rejected draft"
    if step.emitted.kind == "recovered" and trace.config.get("verify") not in ("greedy", "typical"):
        hover += f", r(x) = {fmt_prob(residual_prob(step))} (the residual it was drawn from)"
    return FATES.index(fate), cell_label(trace, tok, width), hover


def grid_width(trace: Trace) -> int:
    """K: the draft columns of the grid (the widest draft, at least num_speculative_tokens
    unless the method is none); column K (0-based) holds each step's own token."""
    return max([int(trace.config.get("num_speculative_tokens", 0) or 0)] * (trace.config.get("method") != "none")
               + [len(s.draft_token_ids) for s in trace.steps] + [0])


def cell_selection(trace: Trace, row: int, column: int) -> tuple[int, int]:
    """(step, position) selected by a click on grid cell (row, column), both 0-based: a draft
    column -> that draft position (past the step's draft: its own token's slot), the last
    column -> the step's own token (slot num_accepted + 1). Clamped to the trace."""
    step = trace.steps[min(max(int(row), 0), len(trace.steps) - 1)]
    k = len(step.draft_token_ids)
    column = max(int(column), 0)
    position = column + 1 if column < min(k, grid_width(trace)) else step.num_accepted + 1
    return step.index, position


def grid_cells(trace: Trace | dict[str, Any]) -> tuple[list[list[float]], list[list[str]], list[list[str]]]:
    """(z, text, hover) matrices [num_steps][K + 1]: z = index into FATES (NaN = no cell),
    K = the widest draft of the run (at least num_speculative_tokens)."""
    trace = as_trace(trace)
    k = grid_width(trace)
    width = cell_font(k + 1)[1]
    z, text, hover = [], [], []
    for step in trace.steps:
        zr, tr, hr = [math.nan] * (k + 1), [""] * (k + 1), [""] * (k + 1)
        for i in range(1, len(step.draft_token_ids) + 1):
            zr[i - 1], tr[i - 1], hr[i - 1] = _draft_cell(trace, step, i, width)
        zr[k], tr[k], hr[k] = _own_cell(trace, step, width)
        z.append(zr), text.append(tr), hover.append(hr)
    return z, text, hover


def step_grid_figure(trace: Trace | dict[str, Any], selected_step: int | None = None,
                     selected_position: int | None = None) -> go.Figure:
    """Plotly heatmap of the steps (see module docstring).

    Args:
        trace: a Trace or its dict (partial traces are fine).
        selected_step / selected_position: the cell outlined (and scrolled into view);
            position is 1-based, k'+1 or more = the step's own token.
    Returns:
        A figure with one Heatmap trace (z values index :data:`FATES`) plus legend-only traces.
    Raises:
        specviz.trace.TraceFormatError: ``trace`` is a malformed dict.
    """
    trace = as_trace(trace)
    z, text, hover = grid_cells(trace)
    n = len(z)
    ncol = len(z[0]) if z else 1
    x_labels = [f"x{i}" for i in range(1, ncol)] + ["+1 token" if cell_font(ncol)[1] >= 8 else "+1"]
    centred = [[v + 0.5 for v in row] for row in z]  # category c -> c + 0.5, the middle of its colour band
    fig = go.Figure(go.Heatmap(
        z=centred, x=list(range(ncol)), y=list(range(n)), text=text, hovertext=hover, texttemplate="%{text}",
        textfont={"size": cell_font(ncol)[0], "family": "monospace"}, hovertemplate="%{hovertext}<extra></extra>",
        colorscale=_colorscale(), zmin=0, zmax=len(FATES), showscale=False, xgap=2, ygap=2,
    ))
    stopped = stopped_in_drafts(trace)
    for fate in FATES:
        if fate == "stop" and not stopped:  # only a run the stop cut inside a step's drafts has one
            continue
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=fate_label(fate, trace),
                                 marker={"size": 12, "symbol": "square", "color": FATE_STYLE[fate][0],
                                         "line": {"width": 1, "color": "#6b7280"}}))
    if any(t.startswith("★") for row in text for t in row):  # block verification kept what token-wise would not
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="★ kept by block verification only",
                                 marker={"size": 12, "symbol": "star", "color": "#111827"}))
    rows = min(max(n, 1), VISIBLE_ROWS)
    # the selected step a quarter down the window, which may run past the last step by up to half its rows: a late
    # step sat near the bottom, under the fold below a lesson's pinned chapter at 1280x720
    top = 0 if selected_step is None or n <= rows else max(0, min(selected_step - rows // 4, n - rows // 2))
    last = min(top + rows, n) - 1
    fig.update_layout(
        height=max(150 + ROW_PX * rows, MIN_HEIGHT), margin={"l": 60, "r": 10, "t": 40, "b": 40},
        # more steps than rows: which ones are shown (the view follows the selected step; dragging pans it)
        title={"text": f"{n} verification steps × draft positions" if n <= rows else
               f"steps {top}-{last} of {n} (drag to scroll) × draft positions", "font": {"size": 14}},
        xaxis={"tickmode": "array", "tickvals": list(range(ncol)), "ticktext": x_labels, "side": "top",
               "fixedrange": True},
        yaxis={"title": "step", "range": [top + rows - 0.5, top - 0.5], "dtick": 1 if rows <= 25 else 5},
        legend={"orientation": "h", "y": -0.02, "yanchor": "top", "font": {"size": 11}},
        plot_bgcolor="#ffffff", dragmode="pan",
    )
    _mark_unreachable(fig, trace, ncol - 1)
    if selected_step is not None and 0 <= selected_step < n:
        fig.add_shape(type="rect", x0=-0.5, x1=ncol - 0.5, y0=selected_step - 0.5, y1=selected_step + 0.5,
                      line={"color": "#111827", "width": 2})
        if selected_position is not None:
            col = min(selected_position, len(trace.steps[selected_step].draft_token_ids) + 1) - 1
            col = ncol - 1 if col >= len(trace.steps[selected_step].draft_token_ids) else col
            fig.add_shape(type="rect", x0=col - 0.5, x1=col + 0.5, y0=selected_step - 0.5, y1=selected_step + 0.5,
                          line={"color": "#111827", "width": 4})
    return fig


def _mark_unreachable(fig: go.Figure, trace: Trace, k: int) -> None:
    """Shade draft columns the proposer cannot fill by design (:func:`specviz.viz.source.draft_limit`,
    e.g. Medusa with fewer heads than k) and say why along them (hover: the full reason)."""
    limit = draft_limit(trace)
    if limit is None or limit[0] >= k:
        return
    n, short, why = limit
    fig.add_shape(type="rect", x0=n - 0.5, x1=k - 0.5, y0=0, y1=1, yref="paper", layer="below", line={"width": 0},
                  fillcolor="#f3f4f6")
    fig.add_annotation(x=(n + k - 1) / 2, y=0.5, yref="paper", textangle=-90, showarrow=False,
                       text=f"not drafted ({short})", hovertext=why,
                       font={"size": 11, "color": "#6b7280"}, name="draft limit")
