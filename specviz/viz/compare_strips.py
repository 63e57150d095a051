"""The comparison's aligned token strips: one row per configuration for a prompt and seed, each committed token
coloured by its fate, with a shared scrubber (a table of every row's token at one output position)."""


from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from specviz.compare import Comparison
from specviz.trace import Trace

from .common import FATE_STYLE, MODEBAR_PX, emitted_fate, quoted

STRIP_FATES = ("accepted", "recovered", "bonus", "target")  # fates a committed token can have
STRIP_TEXT_MAX = 40  # wider strips show colours only (tokens on hover and in the scrubber's table)
PROMPT_NAME_MAX = 40  # a prompt's name in a title or a heading: longer ones are cut at a word, with "…"


LEGEND_GAP_PX = 64  # px from the plot area's bottom to the legend: the ticks and the axis title at 1.45x


def prompt_label(comparison: Comparison, prompt: int, max_chars: int = PROMPT_NAME_MAX) -> str:
    """How a title names prompt ``prompt`` (0-based): 'prompt 2 “Projections repeated”' (the number, as in the
    prompt menu, then the name, cut to ``max_chars`` at a word with "…"); just "prompt 2" where the prompt has no
    name of its own (an unnamed prompt is called "prompt N" already). Plain text, not escaped."""
    number = f"prompt {prompt + 1}"
    name = " ".join(str(comparison.prompts[prompt].name or "").split()) if 0 <= prompt < len(comparison.prompts) else ""
    if not name or name.lower() == number:
        return number
    if len(name) > max_chars:
        cut = name[:max_chars - 1]
        name = (cut.rsplit(" ", 1)[0] if " " in cut[max_chars // 2:] else cut).rstrip(" ,;:·-") + "…"
    return f"{number} “{name}”"


def strip_cells(trace: Trace) -> list[dict[str, Any]]:
    """One cell per committed output token, in output order: token_id, fate (accepted / recovered /
    bonus / target), step, slot (1-based in the step), rejected (the rejected draft token a recovered
    token replaced, else None)."""
    cells = []
    for s in trace.steps:
        for j, tok in enumerate(s.committed_token_ids):
            own = j >= s.num_accepted
            fate = emitted_fate(s) if own else "accepted"
            rejected = s.draft_token_ids[s.num_accepted] if own and s.num_accepted < len(s.draft_token_ids) else None
            cells.append({"token_id": tok, "fate": fate if fate in STRIP_FATES else "target", "step": s.index,
                          "slot": j + 1, "rejected": rejected})
    return cells


def strips_figure(comparison: Comparison, prompt: int, seed: int, position: int | None = None,
                  width: int = 64) -> go.Figure:
    """One row per configuration, one column per output position (1..width), each cell coloured by
    the fate of the token committed there; a dark tick marks the first token of every step (where
    a target forward began); ``position`` (1-based) draws the shared scrubber's column."""
    rows = [(c.label, comparison.find(i, prompt, seed)) for i, c in enumerate(comparison.configs)]
    rows = [(name, r.trace) for name, r in rows if r is not None]
    fig = go.Figure()
    codes = {f: i for i, f in enumerate(STRIP_FATES)}
    z, text, hover, ticks_x, ticks_y = [], [], [], [], []
    n = max([len(strip_cells(t)) for _, t in rows] or [0])
    n = min(max(n, 1), width)
    for name, t in rows:
        cells = strip_cells(t)[:n]
        z.append([codes[c["fate"]] for c in cells] + [None] * (n - len(cells)))
        text.append([_cell_label(t, c) if n <= STRIP_TEXT_MAX else "" for c in cells] + [""] * (n - len(cells)))
        hover.append([_cell_hover(t, c, i + 1) for i, c in enumerate(cells)] + [""] * (n - len(cells)))
        for i, c in enumerate(cells):
            if c["slot"] == 1:
                ticks_x.append(i + 0.5)
                ticks_y.append(name)
    m = len(STRIP_FATES) - 1 or 1
    scale = []
    for i, f in enumerate(STRIP_FATES):
        scale += [[i / m - (0.5 / m if i else 0), FATE_STYLE[f][0]], [min(i / m + 0.5 / m, 1), FATE_STYLE[f][0]]]
    names = [name for name, _ in rows]
    fig.add_trace(go.Heatmap(z=z, x=list(range(1, n + 1)), y=names, text=text, texttemplate="%{text}",
                             textfont={"size": 10, "family": "monospace"}, hovertext=hover,
                             hovertemplate="%{hovertext}<extra></extra>", colorscale=scale, zmin=0, zmax=m,
                             showscale=False, xgap=1, ygap=3))
    fig.add_trace(go.Scatter(x=ticks_x, y=ticks_y, mode="markers", hoverinfo="skip", showlegend=False,
                             marker={"symbol": "line-ns", "size": 22, "line": {"width": 2, "color": "#111827"}}))
    for f in STRIP_FATES:  # legend entries
        label = {"recovered": "recovered (a draft token was rejected here)"}  # "target": the single-run views' words
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=label.get(f, FATE_STYLE[f][2]),
                                 marker={"size": 12, "symbol": "square", "color": FATE_STYLE[f][0]}))
    if position is not None and 1 <= position <= n:
        fig.add_vrect(x0=position - 0.5, x1=position + 0.5, line={"color": "#111827", "width": 2}, fillcolor="rgba(0,0,0,0)")
    # the legend sits LEGEND_GAP_PX under the plot area, below the ticks and the axis title at the presentation
    # layout's 1.45x type too (a fraction of the plot's height put it on the axis title there)
    top, bottom = 30 + MODEBAR_PX, LEGEND_GAP_PX + 44  # under the legend: room for two of its rows at 1.45x
    height = top + bottom + 40 + 40 * max(len(rows), 1)
    fig.update_layout(height=height, margin={"l": 10, "r": 10, "t": top, "b": bottom}, plot_bgcolor="#ffffff",
                      legend={"orientation": "h", "y": -LEGEND_GAP_PX / max(height - top - bottom, 1),
                              "yanchor": "top", "font": {"size": 11}},
                      title={"text": f"{html.escape(prompt_label(comparison, prompt))}, seed {seed}: each cell is one output token; a dark tick "
                                     "starts a target forward" + ("" if n <= STRIP_TEXT_MAX else " (tokens on hover)"),
                             "font": {"size": 13}, "yref": "paper", "y": 1, "yanchor": "bottom", "pad": {"b": 8}})
    fig.update_xaxes(title_text="output position", dtick=4 if n > 16 else 1, range=[0.5, n + 0.5])
    fig.update_yaxes(autorange="reversed", automargin=True)
    return fig


def _cell_label(trace: Trace, cell: dict[str, Any]) -> str:
    from .common import label

    return label(trace, cell["token_id"], width=3)


def _cell_hover(trace: Trace, cell: dict[str, Any], pos: int) -> str:
    line = f"output token {pos}: {quoted(trace, cell['token_id'])}<br>step {cell['step']}, slot {cell['slot']}: {cell['fate']}"
    if cell["rejected"] is not None:
        line += f"<br>replaced the rejected draft {quoted(trace, cell['rejected'])}"
    return line


def scrub_html(comparison: Comparison, prompt: int, seed: int, position: int) -> str:
    """What every configuration did at output ``position`` (1-based): the step that produced it, the
    fate, the token, and what that step drafted."""
    items = []
    for i, c in enumerate(comparison.configs):
        r = comparison.find(i, prompt, seed)
        if r is None:
            continue
        cells = strip_cells(r.trace)
        if not 1 <= position <= len(cells):
            items.append(f"<tr><td>{html.escape(c.label)}</td><td colspan=3 style='color:#6b7280'>ended before "
                         f"position {position}</td></tr>")
            continue
        cell = cells[position - 1]
        step = r.trace.steps[cell["step"]]
        drafted = " ".join(quoted(r.trace, t) for t in step.draft_token_ids) or "(nothing)"
        bg, fg, _ = FATE_STYLE[cell["fate"]]
        items.append(f"<tr><td style='padding:2px 8px'>{html.escape(c.label)}</td><td style='padding:2px 8px'>step "
                     f"{cell['step']}</td><td style='padding:2px 8px;background:{bg};color:{fg}'>{cell['fate']} "
                     f"{quoted(r.trace, cell['token_id'])}</td><td style='padding:2px 8px;font-size:12px'>drafted "
                     f"{drafted}; accepted {step.num_accepted}</td></tr>")
    return (f"<div class='sv-scrub'><b>output position {position}</b> · {html.escape(prompt_label(comparison, prompt))}, "
            f"seed {seed}<table style='font-size:13px;"
            f"border-collapse:collapse'>{''.join(items)}</table></div>")
