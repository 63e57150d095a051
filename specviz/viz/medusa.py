"""Medusa view: each head's top candidates at a step, which ones formed the draft, and the target's decision.

Reads only the trace: a step's ``match`` holds what :class:`specviz.proposers.medusa.MedusaProposer`
records: per head i (predicting draft position i + 1 from the same feature f at position n-1) its
top candidates [[token id, softmax prob], ...], and per draft node the (head, rank) it was taken
from (a chain: rank 0 of heads 0..k'-1; a static tree: the choices' ranks). ``num_accepted`` says
how far the target accepted (for a chain, draft position i = head i-1).
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from specviz.trace import Step, Trace

from .common import as_trace, label, token_text
from .eagle import CELL, FATE_COLOUR
from .residual import message_figure

CHOSEN = "#2563eb"


def _chosen(match: dict[str, Any]) -> dict[tuple[int, int], int]:
    """{(head, rank): draft node index} of the candidates that formed the draft."""
    return {(n["head"], n["rank"]): j for j, n in enumerate(match.get("nodes", []))}


def _node_fate(step: Step, match: dict[str, Any], j: int) -> str:
    """The target's decision on draft node j (chains only; a tree node is shown as "in tree")."""
    if match.get("shape") == "tree":
        return "in tree"
    if j < step.num_accepted:
        return "accepted"
    return "rejected" if j == step.num_accepted else "not verified"


def medusa_html(trace: Trace | dict[str, Any], step: int, position: int | None = None) -> str:
    """HTML table of one Medusa step: a row per head (draft position i = head + 1), its top candidates
    with softmax probabilities, the drafted ones outlined and labelled with the target's decision.
    Raises IndexError if ``step`` is not a step of the trace."""
    trace = as_trace(trace)
    st = trace.steps[step]
    m = st.match
    if m.get("kind") != "medusa" or not m.get("heads") or not st.draft_token_ids:
        return (f'<div class="sv-match-empty" style="padding:12px;color:#374151">Step {st.index}: the heads drafted '
                "nothing (no target feature yet, or no room left before max_new_tokens).</div>")
    chosen = _chosen(m)
    rows = []
    for h in m["heads"]:
        cells = [f"head {h['head']}", f"x<sub>n+{h['draft_position']}</sub>"]
        for r, (tok, prob) in enumerate(h.get("candidates", [])):
            text = f"<code>{html.escape(repr(token_text(trace, int(tok))))}</code> {prob:.2f}"
            j = chosen.get((h["head"], r))
            if j is not None:
                fate = _node_fate(st, m, j)
                colour = FATE_COLOUR.get(fate, CHOSEN)
                text = (f"<span class='sv-medusa-chosen' style='outline:2px solid {CHOSEN};padding:1px 3px'>{text}"
                        f" <span style='color:{colour}'>{fate}</span></span>")
            cells.append(text)
        style = "background:#e0f2fe" if position is not None and position == h["draft_position"] else ""
        rows.append(f"<tr data-head='{h['head']}' style='{style}'>" + "".join(f"<td {CELL}>{c}</td>" for c in cells)
                    + "</tr>")
    ranks = max(len(h.get("candidates", [])) for h in m["heads"])
    head_row = "<tr>" + "".join(f"<th {CELL}>{t}</th>" for t in
                                ("head", "predicts", *[f"top-{r + 1}" for r in range(ranks)])) + "</tr>"
    shape = ("a chain: the top-1 candidate of heads 0.." + str(len(st.draft_token_ids) - 1)
             if m.get("shape") != "tree" else f"a static tree of {len(st.draft_token_ids)} nodes (Medusa choices)")
    note = (f"<p style='font-size:13px;color:#374151'>Medusa: every head reads the same target feature f at "
            f"position {m['feature_position']} (the last committed position; the root token at position "
            f"{m['root_position']} came from the target's own LM head). Head i predicts the token i + 1 after the "
            f"root. The draft is {shape}; outlined = drafted. Probabilities: softmax of each head's logits.</p>")
    return (f"<div class='sv-match sv-medusa'>{note}<div style='overflow-x:auto'><table style='font-size:13px;"
            f"border-collapse:collapse;white-space:nowrap' cellpadding='3'>{head_row}{''.join(rows)}</table></div></div>")


def medusa_figure(trace: Trace | dict[str, Any], step: int, height: int = 320) -> go.Figure:
    """Grouped bars: for each head its top candidates' softmax probabilities (x = rank), the drafted
    candidates outlined; hover names the token. One bar trace per head."""
    trace = as_trace(trace)
    st = trace.steps[step]
    m = st.match
    if m.get("kind") != "medusa" or not any(h.get("candidates") for h in m.get("heads", [])):
        return message_figure("no Medusa draft at this step", height=160)
    chosen = _chosen(m)
    fig = go.Figure()
    for h in m["heads"]:
        cand = h["candidates"]
        widths = [3 if (h["head"], r) in chosen else 0 for r in range(len(cand))]
        fig.add_trace(go.Bar(
            x=[f"top-{r + 1}" for r in range(len(cand))], y=[p for _, p in cand], name=f"head {h['head']} (x n+{h['draft_position']})",
            text=[label(trace, int(t), 8) for t, _ in cand], textposition="outside", cliponaxis=False,
            marker={"line": {"width": widths, "color": CHOSEN}},
            hovertemplate="%{text}: %{y:.3f}<extra>" + f"head {h['head']}" + "</extra>"))
    fig.update_layout(barmode="group", height=height, margin={"l": 50, "r": 20, "t": 50, "b": 40},
                      plot_bgcolor="#ffffff", uniformtext={"minsize": 8, "mode": "hide"},
                      title={"text": f"step {st.index}: each head's top candidates (outlined = drafted)",
                             "font": {"size": 13}},
                      yaxis={"range": [0, 1.15], "title": "softmax prob"}, legend={"orientation": "h", "y": -0.2})
    return fig
