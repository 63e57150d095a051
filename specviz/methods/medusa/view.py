"""Medusa view: each head's top candidates at a step, which ones formed the draft, and the target's decision.

Reads only the trace: a step's ``match`` holds what :class:`specviz.methods.medusa.proposer.MedusaProposer`
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

from specviz.methods.eagle.view import CELL, FATE_COLOUR
from specviz.viz.common import as_trace, fmt_prob, label, nothing_drafted, quoted, token_text
from specviz.viz.head_source import head_source_html
from specviz.viz.residual import message_figure

CHOSEN = "#2563eb"
SYMBOL = {"accepted": "✓", "rejected": "✗", "not verified": "·"}
TOKEN_CHARS = 7  # characters of a candidate shown in the table


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
        return nothing_drafted(st.index, "the heads")
    chosen = _chosen(m)
    rows = []
    for h in m["heads"]:
        cells = [f"{h['head']} → x<sub>n+{h['draft_position']}</sub>"]
        for r, (tok, prob) in enumerate(h.get("candidates", [])):
            # short enough for a sixth of a half-page panel at 1024 px; the whole token on hover
            whole = html.escape(repr(token_text(trace, int(tok))), quote=True)
            text = f"<code title='{whole}'>{label(trace, int(tok), TOKEN_CHARS)}</code><br>{prob:.2f}"
            j = chosen.get((h["head"], r))
            if j is not None:
                fate = _node_fate(st, m, j)
                colour = FATE_COLOUR.get(fate, CHOSEN)
                text = (f"<span class='sv-medusa-chosen' title='{fate}' style='outline:2px solid {colour};"
                        f"padding:1px 3px;display:inline-block'>{text} {SYMBOL.get(fate, '')}</span>")
            cells.append(text)
        style = "background:#e0f2fe" if position is not None and position == h["draft_position"] else ""
        rows.append(f"<tr data-head='{h['head']}' style='{style}'>" + "".join(f"<td {CELL}>{c}</td>" for c in cells)
                    + "</tr>")
    ranks = max(len(h.get("candidates", [])) for h in m["heads"])
    head_row = "<tr>" + "".join(f"<th {CELL}>{t}</th>" for t in
                                ("head → predicts", *[f"top-{r + 1}" for r in range(ranks)])) + "</tr>"
    shape = ("a chain: the top-1 candidate of heads 0.." + str(len(st.draft_token_ids) - 1)
             if m.get("shape") != "tree" else f"a static tree of {len(st.nodes or m.get('nodes') or st.draft_token_ids)} "
                                              "nodes (Medusa choices)")
    note = (f"<p style='font-size:13px;color:#374151'>Medusa: every head reads the same target feature f at "
            f"position {m['feature_position']} (the last committed position; the root token at position "
            f"{m['root_position']} came from the target's own LM head). Head i predicts the token i + 1 after the "
            f"root. The draft is {shape}; outlined = drafted, in the colour of the target's decision (✓ accepted, ✗ rejected, "
            "· not verified). Probabilities: softmax of each head's logits.</p>")
    if len(m["heads"]) < int(trace.config.get("num_speculative_tokens") or 0) and m.get("shape") != "tree":
        n, k = len(m["heads"]), int(trace.config["num_speculative_tokens"])
        note += (f"<p class='sv-draft-limit' style='font-size:13px;color:#374151'>k = {k}, but this head file has "
                 f"{n} heads: a chain drafts min(k, {n}) = {n} tokens, so draft "
                 + (f"position {k} stays" if n + 1 == k else f"positions {n + 1}–{k} stay") + " empty.</p>")
    note += head_source_html(trace)  # the loaded head's layout and source (heads.formats)
    return (f"<div class='sv-match sv-medusa'>{note}<table style='font-size:13px;border-collapse:collapse;"
            f"width:100%;table-layout:fixed;overflow-wrap:anywhere' cellpadding='3'>{head_row}{''.join(rows)}"
            "</table></div>")


def medusa_figure(trace: Trace | dict[str, Any], step: int, height: int = 300) -> go.Figure:
    """Heatmap: one row per head (draft position n+1+i), one column per rank; colour = the head's softmax
    probability of that candidate, text = the token; the drafted candidates are outlined (one
    rectangle per draft node, in the target decision's colour for a chain)."""
    trace = as_trace(trace)
    st = trace.steps[step]
    m = st.match
    heads = m.get("heads", [])
    if m.get("kind") != "medusa" or not any(h.get("candidates") for h in heads):
        return message_figure("no Medusa draft at this step", height=160)
    ranks = max(len(h["candidates"]) for h in heads)
    z = [[c[1] for c in h["candidates"]] + [None] * (ranks - len(h["candidates"])) for h in heads]  # [K, R]
    text = [[label(trace, int(c[0]), 8) for c in h["candidates"]] + [""] * (ranks - len(h["candidates"])) for h in heads]
    ys = [f"head {h['head']} → n+{h['draft_position']}" for h in heads]
    xs = [f"top-{r + 1}" for r in range(ranks)]
    fig = go.Figure(go.Heatmap(z=z, x=xs, y=ys, text=text, texttemplate="%{text}", colorscale="Blues", zmin=0,
                               zmax=1, colorbar={"title": {"text": "prob"}, "thickness": 12},
                               hovertemplate="%{y}, %{x}: %{text} (%{z:.3f})<extra></extra>", name="candidates"))
    for j, n in enumerate(m.get("nodes", [])):
        colour = FATE_COLOUR.get(_node_fate(st, m, j), CHOSEN)
        fig.add_shape(type="rect", x0=n["rank"] - 0.5, x1=n["rank"] + 0.5, y0=n["head"] - 0.5, y1=n["head"] + 0.5,
                      line={"color": colour, "width": 3}, name=f"draft node {j}")
    fig.update_layout(height=height, margin={"l": 110, "r": 20, "t": 50, "b": 40}, plot_bgcolor="#ffffff",
                      title={"text": f"step {st.index}: each head's top candidates (outlined = drafted)",
                             "font": {"size": 13}},
                      yaxis={"autorange": "reversed"}, xaxis={"side": "bottom"})
    return fig


# ---- the view contract (specviz.methods.base) ------------------------------------------------------------------
panel_html, panel_figure = medusa_html, medusa_figure


def draft_why(trace: Trace, st: Step) -> str | None:
    """The lesson's sentences for a chain: one forward of every head on one target feature, head i's top candidate
    as draft i + 1."""
    m, k = st.match or {}, len(st.draft_token_ids)
    heads = (m.get("heads") or [])[:k]
    if m.get("kind") != "medusa" or m.get("shape") != "chain" or len(heads) < k or not k:
        return None
    per = "; ".join(f"x{i} = {quoted(trace, t)} from head {h['head']}"
                    + (f" (the head's probability {fmt_prob(h['candidates'][0][1])})" if h.get("candidates") else "")
                    for i, (h, t) in enumerate(zip(heads, st.draft_token_ids), start=1))
    root = m.get("root_position")
    return (f"The Medusa heads ran <b>once</b>, all on the target's final-norm feature at position "
            f"{m.get('feature_position')}: the root token" + (f" at position {root}" if root is not None else "")
            + " came from the target's own LM head there, and head i predicts the token i + 1 after the root, "
            "seeing neither the root nor the drafts before its own. Each head's top candidate became a draft"
            + (" (verified as a one-hot q = 1)" if trace.config.get("verify") in ("standard", "block") else "")
            + ": " + per + ".")


def draft_limit(trace: Trace) -> tuple[int, str, str] | None:
    """Medusa drafts min(k, number of heads) in a chain (head i predicts only the token i + 1 after the root;
    :mod:`specviz.methods.medusa.proposer`): (that number, a short reason, the reason in full) when it is below k,
    read from the heads the steps recorded; None for trees (their k is a depth) and for k within the heads."""
    k = int(trace.config.get("num_speculative_tokens") or 0)
    for st in trace.steps:
        m = st.match or {}
        if m.get("shape") == "tree":
            return None
        if m.get("heads"):
            n = len(m["heads"])
            return (n, f"Medusa: min(k, {n} heads)", f"Medusa drafts min(k, number of heads) = {n} tokens: this head "
                    f"file has {n} heads and head i predicts only the token i + 1 after the root") if n < k else None
    return None
