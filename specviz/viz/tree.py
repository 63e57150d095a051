"""The draft-tree view: one step's draft tree drawn as a tree.

Reads the trace only (version 2, ``specviz.trace``): a step's ``nodes`` (id, parent, depth,
token_id, p, q, u, fate, score), ``accepted_path`` (node ids from the root's child down) and
``tree_rule``; a step without nodes (a version-1 step still in memory) is read as the chain it is.
Layout: depth left to right (the root, the last committed token, at depth 0), one row per leaf,
a parent centred on its children; node order = the order the verifier visits siblings.

Each node is a text box: the token, then ``p`` (the target's probability of the token at its
parent), ``q`` (the draft's, 1 for deterministic children) or, for top-k children (q one-hot),
``c`` = exp(score), the draft's confidence in the path (EAGLE-2: the product of the head's
probabilities along it; n-gram / suffix trees: the share of matches that continue so). Two numbers
for one top-k child are both right and are both named in its hover and detail panel: the q the
verifier used, 1 (one-hot: the child was chosen deterministically, rule A of docs/design/methods.md 1.4), and
the draft's confidence in it, its softmax at the parent (exp(score - parent's score)), the number
the EAGLE panel shows. A line under the tree names the rule this step was verified with. Colours:
the accepted path green, rejected nodes grey, unvisited nodes dimmed, the step's own token
(recovered / bonus) in its stream colour, attached to the last accepted node.
"""

from __future__ import annotations

import html
import math
import re
import textwrap
from typing import Any

import plotly.graph_objects as go

from specviz import methods
from specviz.trace import Step, Trace

from .common import FATE_STYLE, as_trace, context_before, emitted_fate, fate_label, fmt_prob, label, quoted, short_prob
from .residual import P_COLOUR, Q_COLOUR, WRAP, message_figure
from .tree_short import add_short, box_px
from .tree_layout import (EMITTED, ROOT, ViewNode, _children, node_for_position, position_for_node,  # noqa: F401
                          row_rejected, step_tree, tree_layout)

CONFIDENCE_COLOUR = "#a78bfa"  # the draft's confidence bar of the node panel (not a q the verifier used)

# (fill, text, border) per node fate; the emitted token uses the stream's colours (FATE_STYLE)
NODE_STYLE: dict[str, tuple[str, str, str]] = {
    "accepted": (FATE_STYLE["accepted"][0], FATE_STYLE["accepted"][1], "#15803d"),
    "rejected": ("#d1d5db", "#1f2937", "#6b7280"),
    "unvisited": ("#f9fafb", "#9ca3af", "#e5e7eb"),
    "root": ("#ffffff", "#111827", "#111827"),
}
NODE_LEGEND = {
    "accepted": "accepted (the committed path)",
    "rejected": "rejected (the target tested it and said no)",
    "unvisited": "unvisited (an ancestor or an earlier sibling decided first)",
}
EDGE_STYLE = {"accepted": ("#15803d", 3.0, "solid"), "rejected": ("#9ca3af", 1.5, "solid"),
              "unvisited": ("#d1d5db", 1.0, "dot")}
SELECTED_BORDER = "#2563eb"
TOKEN_CHARS = 9  # token text per box (then …)
COLUMN_PX = 104  # horizontal room per depth column the box text is sized for
MIN_WIDTH = 860  # px: the rule's one-line caption fits, also at the presentation layout's 1.45x text
MARGIN_B = 10  # px under the plot area, the legend's rows aside
LEGEND_PX = 60  # px under the plot area for the two legend rows (the presentation layout's 1.45x text included)
RULE_LINE_PX = 24  # px above the plot area for the rule's line (room for the presentation layout's 1.45x text)
BOX_FONT, NUM_FONT = 11, 9  # px: a two-line box's token line and its numbers' line


def _num(x: float | None) -> str:
    return short_prob(x)


def _confidence(n: ViewNode) -> float | None:
    return math.exp(n.score) if n.score is not None and math.isfinite(n.score) else None


def _second_line(n: ViewNode, rule: str) -> str:
    """'p 0.43 · c 0.62' for top-k children (q one-hot), else 'p 0.43 · q 0.51'; 'not tested' for a node the walk
    never reached (its p exists, the tree forward computed it, but no acceptance test read it)."""
    if n.fate == "unvisited":
        return "not tested"
    if rule == "topk" and _confidence(n) is not None:
        return f"p {_num(n.p)} · c {_num(_confidence(n))}"
    if rule == "typical":  # the rule reads p alone: a q here would be a number no test used
        return f"p {_num(n.p)}"
    return f"p {_num(n.p)} · q {_num(n.q)}"


TEST_LINE = {  # a hover's test line for the rules that draw no uniform
    "greedy": "accepted iff it is the target's argmax (no uniform is drawn)",
    "typical": "accepted iff p(x) > min(ε, δ·exp(−H(p))) (no uniform is drawn; lossy)",
}

RULE_CAPTION = {  # one line under the tree: the step's rule (docs/design/methods.md 1.4), <= 92 chars
    "greedy": "Verified greedily: at each depth the child equal to the target's argmax is accepted.",
    "topk": "Verified by rule A (top-k, q one-hot): accept c w.p. p(c) / (1 − p(its rejected siblings)).",
    "sampled": "Verified by rule B (children sampled from q; SpecInfer): accept c iff u ≤ r(c)/q(c).",
    "standard": "Verified by standard rejection sampling (a chain): accept x iff u ≤ min(1, p(x)/q(x)).",
    "block": "Verified by block verification (a chain; Sun et al. 2024): accept up to the last η_i ≤ h_i.",
    "typical": "Verified by typical acceptance (lossy): accept x while p(x) > min(ε, δ·exp(−H(p))).",
    "synthetic": "Verified synthetically (not lossless): position i accepted with the given rate a_i.",
}


def step_rule(trace: Trace, st: Step) -> str:
    """The key of :data:`RULE_CAPTION` for ``st``: "greedy" (the request's verify), the tree's rule
    ("topk" = rule A, "sampled" = rule B), or for a chain the request's verification."""
    _, _, rule = step_tree(st)
    verify = str(trace.config.get("verify", ""))
    if verify == "greedy":
        return "greedy"
    if rule != "chain":
        return rule
    return verify if verify in RULE_CAPTION else "standard"


def draft_confidence(n: ViewNode, by_id: dict[int, ViewNode]) -> float | None:
    """The draft's own probability of ``n``'s token at its parent: exp(score - the parent's score)
    (a root child: exp(score)); scores are cumulative log-confidences (specviz.proposer.Draft.scores).
    None when the node or its parent has no score."""
    parent = by_id.get(n.parent)
    base = 0.0 if n.parent < 0 else (parent.score if parent is not None else None)
    if n.score is None or base is None or not math.isfinite(n.score) or not math.isfinite(base):
        return None
    return math.exp(n.score - base)


def confidence_source(st: Step) -> str:
    """What the draft confidence of ``st``'s nodes is (e.g. "head softmax"): the proposer's method's registry text."""
    kind = st.match.get("kind") if isinstance(st.match.get("kind"), str) else st.proposer
    return methods.get(kind).texts.confidence if kind in methods.names() else "exp of the draft score's step"


def q_text(n: ViewNode, rule: str) -> str:
    """The q the verifier used for ``n``, named, e.g. 'q (as verified) = 1, one-hot: deterministic top-k child'."""
    if rule == "topk":
        return "q (as verified) = 1, one-hot: deterministic top-k child"
    if rule == "typical":
        return "q: not read (typical acceptance tests p alone)"
    if rule == "sampled":
        return f"q (as verified) = {fmt_prob(n.q)}: the draft's probability (children sampled from q)"
    one_hot = n.q is not None and n.q >= 1.0
    return f"q (as verified) = {fmt_prob(n.q)}" + (", one-hot: a deterministic draft" if one_hot else
                                                   ": the draft's probability")


def confidence_text(n: ViewNode, by_id: dict[int, ViewNode], st: Step) -> str | None:
    """The named draft confidence of ``n`` at its parent (its own step, not the path's product c), e.g. 'draft
    confidence at its parent (head softmax) = 0.7'; for a top-k child without scores (Medusa) that it was not
    recorded; else None."""
    conf = draft_confidence(n, by_id)
    if conf is None:
        return "draft confidence: not recorded (this proposer gives no draft scores)" if st.tree_rule == "topk" \
            else None
    return f"draft confidence at its parent ({confidence_source(st)}) = {fmt_prob(conf)}"


def _hover(trace: Trace, st: Step, n: ViewNode, rule: str, by_id: dict[int, ViewNode], verified_by: str = "") -> str:
    conf, path_conf = confidence_text(n, by_id, st), _confidence(n) if n.depth > 1 else None  # depth 1: c = conf
    lines = [f"node {n.id} · depth {n.depth} · {quoted(trace, n.token_id)} · {n.fate}",
             f"p = {fmt_prob(n.p)} (target, at its parent" + ("; computed by the tree forward, never tested)"
                                                             if n.fate == "unvisited" else ")"), q_text(n, rule),
             *([conf + (f" · path confidence c = exp(score) = {fmt_prob(path_conf)}" if path_conf is not None
                        else "")] if conf else []),
             TEST_LINE.get(verified_by, f"u = {fmt_prob(n.u)} · accept prob. = {fmt_prob(n.accept_prob)}")]
    return "<br>".join(lines) + "<br><i>click: its p / q panel</i>"


def _title(trace: Trace, st: Step, nodes: list[ViewNode], path: list[int], rule: str) -> str:
    kind = st.match.get("tree") if isinstance(st.match.get("tree"), str) else None
    what = {"dynamic": "EAGLE-2 dynamic tree", "static": "static tree"}.get(kind or "", "draft tree")
    if rule == "chain":
        what = "draft chain"
    own = fate_label(emitted_fate(st), trace).split(" (")[0]  # typical: "the step's own token", not "recovered"
    return (f"<b>step {st.index}: {what} of {len(nodes)} node(s), {len(path)} accepted</b> · then the {own} "
            f"{quoted(trace, st.emitted.token_id)}")


def _legend(fig: go.Figure, rule: str, own: str, greedy: bool = False, trace: Trace | None = None) -> None:
    """Legend entries (marker-only traces) defining every colour, and a line defining p / q / c."""
    for fate, text in NODE_LEGEND.items():
        fill, _, border = NODE_STYLE[fate]
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=text, hoverinfo="skip",
                                 marker={"symbol": "square", "size": 13, "color": fill, "line": {"color": border,
                                                                                                  "width": 2}}))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=fate_label(own, trace), hoverinfo="skip",
                             marker={"symbol": "square", "size": 13, "color": FATE_STYLE[own][0]}))
    how = ("greedy: the target's argmax decides, neither q nor the draft's confidence" if greedy else
           "top-k children: verified with q one-hot = 1, not with the draft's confidence")
    c_text = (f"c = exp(score): the draft's confidence in the path<br>({how}; hover a node for both)"
              if rule == "topk" else "q is not read (typical acceptance tests p alone)" if rule == "typical"
              else "q = the draft's probability of the token")
    fig.add_annotation(text=f"p = the target's probability of the token at its parent · {c_text}", x=0, y=1,
                       xref="paper", yref="paper", xanchor="left", yanchor="bottom", yshift=4 + RULE_LINE_PX,
                       showarrow=False,
                       font={"size": 11, "color": "#374151"}, align="left", name="definitions")


def tree_figure(trace: Trace | dict[str, Any], step: int, selected: int | None = None) -> go.Figure:
    """The draft tree of ``step`` (clamped), ``selected`` node outlined (a node id, ``EMITTED`` or
    None). Box text is at most :data:`TOKEN_CHARS` token characters over one number line, sized for
    :data:`COLUMN_PX` per depth column (the figure's width is set to fit).
    Raises specviz.trace.TraceFormatError for a malformed trace dict."""
    trace = as_trace(trace)
    if not trace.steps:
        return message_figure("No steps yet: press Run (or upload a trace).", 200)
    st = trace.steps[min(max(int(step), 0), len(trace.steps) - 1)]
    nodes, path, rule = step_tree(st)
    verified_by = step_rule(trace, st)
    shown = "typical" if verified_by == "typical" else rule  # boxes, hovers, legend: typical never reads q
    if not nodes:
        return message_figure(f"step {st.index}: nothing was drafted (a plain decoding step).", 160)
    place = tree_layout(nodes, path)
    by_id = {n.id: n for n in nodes}
    ctx = context_before(trace, st.index)
    root = ViewNode(ROOT, ROOT, 0, ctx[-1] if ctx else 0, "root")
    own_fate = emitted_fate(st)
    emitted = ViewNode(EMITTED, path[-1] if path else ROOT, len(path) + 1, st.emitted.token_id, own_fate,
                       st.emitted.p)
    fig = go.Figure()
    _edges(fig, place, nodes, emitted)
    boxes = [root, *nodes, emitted]
    rows = max(y for _, y in place.values()) + 1
    compact = rows > 28  # big trees: one line per box
    for n in boxes:
        _box(fig, trace, n, place[n.id], shown, compact, selected == n.id)
    hovers = [_hover(trace, st, n, shown, by_id, verified_by) if n.id >= 0 else _root_hover(trace, n, st)
              for n in boxes]
    fig.add_trace(go.Scatter(
        x=[place[n.id][0] for n in boxes], y=[place[n.id][1] for n in boxes], mode="markers", name="nodes",
        showlegend=False, customdata=[[n.id] for n in boxes], hoverinfo="text", hovertext=hovers,
        marker={"size": 34, "color": "rgba(0,0,0,0)", "symbol": "square"}, meta="tree-full"))
    short = add_short(fig, nodes, path, emitted, boxes, hovers, _edges, place)
    _legend(fig, shown, own_fate, verified_by == "greedy", trace)
    columns = max(d for d, _ in place.values()) + 1
    defs = next(a.text for a in fig.layout.annotations if a.name == "definitions")
    row_px = 22 if compact else 40
    # the rule's line sits above the plot area, under the definitions (under the tree it met the legend once the
    # presentation layout enlarged the legend's text)
    fig.add_annotation(name="rule", text=RULE_CAPTION[verified_by], x=0, xref="paper", y=1, yref="paper",
                       xanchor="left", yanchor="bottom", yshift=4, showarrow=False, font={"size": 11, "color": "#374151"})
    fig.update_layout(
        title={"text": _title(trace, st, nodes, path, rule), "font": {"size": 13}, "x": 0, "xanchor": "left",
               "y": 1, "yref": "container", "yanchor": "top", "pad": {"l": 10, "t": 8}},  # above the two text lines
        width=max(MIN_WIDTH, COLUMN_PX * columns + 40), height=int(190 + RULE_LINE_PX + LEGEND_PX + row_px * rows),
        plot_bgcolor="#ffffff", margin={"l": 10, "r": 10, "t": 74 + RULE_LINE_PX, "b": MARGIN_B + LEGEND_PX},
        hovermode="closest",
        clickmode="event",
        xaxis={"visible": False, "range": [-0.55, columns - 0.45], "fixedrange": True},
        yaxis={"visible": False, "range": [rows - 0.5, -0.5], "fixedrange": True},
        legend={"orientation": "h", "y": -0.02, "yanchor": "top", "font": {"size": 11}},
        meta={"tree_nodes": len(nodes), "accepted_path": path, "tree_rule": rule, "verified_by": verified_by,
              # the geometry the presentation layout's fit reads (specviz/ui/lesson_script.py svTreeFit): rows of the
              # layout, the row pitch (px) and box font (px) the boxes are sized for, one-line boxes or not
              "tree_rows": int(rows), "tree_row_px": row_px, "tree_box_font": 10 if compact else BOX_FONT,
              "tree_compact": compact, "tree_columns": int(columns), "tree_column_px": COLUMN_PX,
              "tree_box_chars": TOKEN_CHARS,
              # the bottom margin without and with the legend's rows and the legend's longest entry (the fit may
              # move the legend beside the tree); the definitions' first line (the fit shows only it: the pinned
              # chapter and the rule line say the rest)
              "tree_margin_b": MARGIN_B, "tree_legend_px": LEGEND_PX,
              "tree_legend_chars": max(len(t.name) for t in fig.data if t.showlegend is not False and t.name),
              "tree_defs_head": defs.split("<br>")[0],
              # the short arrangement (tree_short.py) and the widest two-line box at 1x (px), for columns too
              # narrow for the boxes at the presentation size
              "tree_short": short, "tree_box_px": round(max(_box_px(trace, n, rule) for n in boxes), 1), "tree_num_font": NUM_FONT},
    )
    return fig


def _root_hover(trace: Trace, n: ViewNode, st: Step) -> str:
    if n.id == ROOT:
        return f"root: {quoted(trace, n.token_id)}, the last committed token (every node's ancestor)"
    return (f"the step's own token {quoted(trace, n.token_id)} ({n.fate}) · p = {fmt_prob(n.p)}"
            "<br><i>click: its p / residual panel</i>")


def _edges(fig: go.Figure, place, nodes: list[ViewNode], emitted: ViewNode, meta: str = "tree-full",
           visible: bool = True) -> None:
    """Parent -> child lines, one trace per child fate (the step's own token: its stream colour); the traces carry
    ``meta`` (which arrangement they draw) and ``visible``."""
    groups: dict[str, tuple[list, list]] = {}
    for n in [*nodes, emitted]:
        key = n.fate if n.fate in EDGE_STYLE else "own"
        xs, ys = groups.setdefault(key, ([], []))
        (x0, y0), (x1, y1) = place[n.parent], place[n.id]
        xs += [x0, (x0 + x1) / 2, (x0 + x1) / 2, x1, None]  # an elbow: across, down, across
        ys += [y0, y0, y1, y1, None]
    for key, (xs, ys) in groups.items():
        colour, width, dash = EDGE_STYLE.get(key, (FATE_STYLE[emitted.fate][1], 2.0, "solid"))
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                 line={"color": colour, "width": width, "dash": dash}, meta=meta, visible=visible))


def _box(fig: go.Figure, trace: Trace, n: ViewNode, xy: tuple[int, float], rule: str, compact: bool,
         selected: bool) -> None:
    """One node's text box (an annotation; clicks pass through to the invisible marker below)."""
    if n.id == ROOT:
        fill, colour, border = NODE_STYLE["root"]
    elif n.id == EMITTED:
        fill, colour = FATE_STYLE[n.fate][0], FATE_STYLE[n.fate][1]
        border = colour
    else:
        fill, colour, border = NODE_STYLE.get(n.fate, NODE_STYLE["unvisited"])
    lines = _box_lines(trace, n, rule)
    if compact:
        lines = lines[:1]
    text = "<b>" + lines[0] + "</b>" + "".join(f"<br><span style='font-size:{NUM_FONT}px'>{html.escape(t)}</span>"
                                               for t in lines[1:])
    fig.add_annotation(x=xy[0], y=xy[1], text=text, showarrow=False, bgcolor=fill, bordercolor=
                       SELECTED_BORDER if selected else border, borderwidth=3 if selected else 1.5, borderpad=2,
                       font={"size": 10 if compact else BOX_FONT, "color": colour, "family": "monospace"}, align="center",
                       name=f"node {n.id}")


def _box_lines(trace: Trace, n: ViewNode, rule: str) -> list[str]:
    """A node box's lines as plain text: the token, then its numbers (none for the root)."""
    if n.id == ROOT:
        return [f"root {label(trace, n.token_id, TOKEN_CHARS - 3)}"]
    return [label(trace, n.token_id, TOKEN_CHARS), f"p {_num(n.p)}" if n.id == EMITTED else _second_line(n, rule)]


def _box_px(trace: Trace, n: ViewNode, rule: str) -> float:
    """The width (px) of ``n``'s two-line box at the figure's own sizes."""
    lines = _box_lines(trace, n, rule)
    return box_px([(lines[0], BOX_FONT), *((t, NUM_FONT) for t in lines[1:])])


def box_text_chars(fig: go.Figure) -> int:
    """The longest line (in characters, markup stripped) of any node box of ``fig``."""
    longest = 0
    for a in fig.layout.annotations:
        if (a.name or "").startswith("node "):
            for line in re.split(r"<br>", a.text):
                longest = max(longest, len(html.unescape(re.sub(r"<[^>]+>", "", line))))
    return longest


def node_figure(trace: Trace | dict[str, Any], step: int, node: int) -> go.Figure:
    """p and q of one draft node off the accepted path (the full p / q / residual panel exists for
    the path's positions only: the trace keeps top-k distributions there), with what happened to it.
    Raises IndexError if ``node`` is not a node of the step."""
    trace = as_trace(trace)
    st = trace.steps[step]
    nodes, path, rule = step_tree(st)
    n = next((m for m in nodes if m.id == node), None)
    if n is None:
        raise IndexError(f"step {st.index} has no draft node {node}")
    fig = go.Figure()
    tok = label(trace, n.token_id)
    by_id = {m.id: m for m in nodes}
    conf = draft_confidence(n, by_id)
    path_c = _confidence(n) if conf is not None and n.depth > 1 else None  # the c its box shows: down the path
    bars = [("target p", n.p, P_COLOUR), ("q (as verified)", 1.0 if rule == "topk" else n.q, Q_COLOUR)]
    if conf is not None:
        bars.append(("conf. at parent", conf, CONFIDENCE_COLOUR))
    if path_c is not None:
        bars.append(("path conf. c", path_c, CONFIDENCE_COLOUR))
    for name, value, colour in bars:
        fig.add_trace(go.Bar(x=[name], y=[value or 0.0], marker_color=colour, name=name,
                             text=[_num(value)], textposition="outside", hoverinfo="skip"))
    if n.accept_prob is not None:
        fig.add_trace(go.Bar(x=["accept prob."], y=[n.accept_prob], marker_color="#6b7280", name="accept prob.",
                             text=[_num(n.accept_prob)], textposition="outside", hoverinfo="skip"))
    if n.u is not None:
        fig.add_hline(y=n.u, line={"color": "#111827", "dash": "dash", "width": 1.5},
                      annotation_text=f"u = {_num(n.u)}", annotation_position="top right")
    why = {
        "rejected": "rejected (the target tested it and said no)",
        "unvisited": "unvisited (never tested: an ancestor was rejected, or an earlier sibling accepted first)",
        "accepted": "accepted",
    }.get(n.fate, n.fate)
    rule_text = {
        "topk": "Top-k children (q one-hot): at its parent the target accepts child c with probability r(c), "
                "r = p with the earlier rejected siblings zeroed and renormalised (EAGLE / SGLang).",
        "sampled": "Children drawn i.i.d. from q: accept iff u ≤ p/q, else p := norm(max(p − q, 0)) and the next "
                   "sibling is tried (SpecInfer, docs/design/methods.md 1.4 B).",
        "chain": "A chain: accept iff u ≤ min(1, p/q) (standard verification).",
    }.get(rule, "")
    if step_rule(trace, st) == "greedy":
        rule_text = "Greedy verification: at its parent the target's argmax is accepted (u and q are not used)."
    named = "; ".join([q_text(n, rule), *filter(None, [confidence_text(n, by_id, st)]),
                       *([f"path confidence c = {fmt_prob(path_c)} (the product down the path, the tree's c)"]
                         if path_c is not None else [])]) + "."
    if step_rule(trace, st) == "greedy":
        named += " Greedy verification uses neither: the target's argmax decides."
    elif rule == "topk" and conf is not None:
        named += (" Both are right: the draft chose this child by rank (deterministically), so the lossless test "
                  "treats its q as one-hot; the confidence is how sure the draft was.")
    lines = [f"<b>step {st.index}, node {n.id} (depth {n.depth}): {quoted(trace, n.token_id)}</b>",
             *(f"<span style='font-size:11px'>{html.escape(w)}</span>" for w in textwrap.wrap(why, WRAP)),
             *(f"<span style='font-size:11px'>{html.escape(w)}</span>" for w in textwrap.wrap(named, WRAP)),
             *(f"<span style='font-size:11px'>{html.escape(w)}</span>" for w in textwrap.wrap(rule_text, WRAP))]
    fig.add_annotation(name="caption", text="<br>".join(lines), x=0, y=1, xref="paper", yref="paper",
                       xanchor="left", yanchor="bottom", yshift=10, showarrow=False, align="left",
                       font={"size": 13, "color": "#111827"})
    fig.update_layout(height=300 + 17 * len(lines), plot_bgcolor="#ffffff", showlegend=False, bargap=0.5,
                      margin={"l": 50, "r": 10, "t": 24 + 17 * len(lines), "b": 40},
                      yaxis={"range": [0, 1.12], "title": "probability"}, xaxis={"title": f"token {tok}"})
    return fig
