"""EAGLE / EAGLE-3 views: what fed the head at each draft position, and how acceptance falls off.

Reads only the trace: a step's ``match`` holds the chain details that
:class:`specviz.methods.eagle.proposer.EagleProposer` records (for draft i: the position its row ran at,
the feature (the target's at position n-1 for i = 1, else the head's own output), the token fed
(the root for i = 1, else d_{i-1}), the head's q of its top token and of d_i), and
``num_accepted`` says how far the target accepted. Pairing as docs/design/methods.md 1.1.
"""

from __future__ import annotations

import html
from typing import Any, Sequence

import plotly.graph_objects as go

from specviz import methods
from specviz.methods.eagle.config import EAGLE3, KINDS
from specviz.trace import Step, Trace

from specviz.viz.common import (ONE_HOT_NOTE, as_trace, fmt_prob, metrics_of, nothing_drafted, quoted, token_code,
                                verified_q, verified_q_cell)
from specviz.viz.head_source import head_source_html
from specviz.viz.residual import message_figure

# compact cells: seven columns in the half-page panel, 447 px wide at a 1024 px window
CELL = "style='padding:2px 4px;text-align:left'"
FATE_COLOUR = {"accepted": "#16a34a", "rejected": "#dc2626", "not verified": "#9ca3af"}


def _fate(step: Step, i: int) -> str:
    """What the target did with draft i (1-based)."""
    if i <= step.num_accepted:
        return "accepted"
    return "rejected" if i == step.num_accepted + 1 else "not verified"


def _feature_text(match: dict[str, Any], pos: dict[str, Any]) -> str:
    """Short name of the feature that fed the head's row (the table's note explains the names)."""
    if pos["feature"] != "target":
        return f"head h @ {pos['feature_position']}"
    if match.get("kind") == EAGLE3:
        layers = ",".join(str(x) for x in match.get("aux_layer_ids", []))
        return f"target layers {layers} @ {pos['feature_position']}"
    return f"target f @ {pos['feature_position']}"


def _code(trace: Trace, token_id: Any) -> str:
    return token_code(trace, token_id)


def eagle_html(trace: Trace | dict[str, Any], step: int, position: int | None = None) -> str:
    """HTML table of one EAGLE step: per draft position i, the head's input row (position, feature,
    token), the drafted token, the head's confidence (its probability of its top token), the q the verifier used
    (:func:`~specviz.viz.common.verified_q`: 1 for an argmax draft, verified as one-hot) and the target's decision. ``position`` (1-based) is highlighted. Steps of other methods get a short note.
    Raises IndexError if ``step`` is not a step of the trace."""
    trace = as_trace(trace)
    st = trace.steps[step]
    m = st.match
    if m.get("tree") in ("dynamic", "static"):  # a tree step: how it was drafted (the tree view draws it)
        return tree_source_html(trace, step)
    if not m.get("positions"):
        return nothing_drafted(st.index, "the head")
    q_name = "q" if not m.get("greedy") else "softmax(head logits)"
    one_hot = any(verified_q(st, i) == 1.0 for i in range(1, len(st.draft_token_ids) + 1))
    rows = []
    for pos, tok in zip(m["positions"], st.draft_token_ids):
        i = pos["draft_index"]
        fate = _fate(st, i)
        top = pos.get("head_top_prob")
        conf = f"{top:.2f}" if top is not None else "—"
        prob = verified_q_cell(verified_q(st, i))  # the q of the decision panel and the tree, not the head's
        style = "background:#e0f2fe;font-weight:bold" if position == i else ""
        cells = (str(i), _code(trace, tok), f"<span style='color:{FATE_COLOUR[fate]}'>{fate}</span>", conf, prob,
                 html.escape(_feature_text(m, pos)), _code(trace, pos.get("input_token_id")))
        rows.append(f"<tr data-draft-index='{i}' style='{style}'>" + "".join(f"<td {CELL}>{c}</td>" for c in cells)
                    + "</tr>")
    note = (f"<p style='font-size:13px;color:#374151'>{'EAGLE-3' if m['kind'] == EAGLE3 else 'EAGLE'} drafts a "
            f"chain from the root token at position {m['root_position']}. Draft 1: the target's "
            f"{_feature_name(m)} at the last committed position with the root token; draft i > 1: the head's own "
            f"output h with draft i-1. Confidence = {q_name} of the head's top token. {_first_pass_text(m)}"
            + (f" {ONE_HOT_NOTE}" if one_hot else "") + "</p>")
    head = "<tr>" + "".join(f"<th {CELL}>{h}</th>" for h in ("i", "drafted", "target", "confidence", "q (as verified)",
                                                              "feature fed @ position", "token fed")) + "</tr>"
    # wraps inside the half-page panel (at 1024 px it scrolled sideways, hiding the last columns)
    note += head_source_html(trace)  # the loaded head's layout and source (heads.formats)
    return (f"<div class='sv-match sv-eagle'>{note}<table style='font-size:12px;border-collapse:collapse;"
            f"width:100%' cellpadding='3'>{head}{''.join(rows)}</table></div>")


def _feature_name(match: dict[str, Any]) -> str:
    if match.get("kind") == EAGLE3:
        layers = ", ".join(str(x) for x in match.get("aux_layer_ids", []))
        return f"inputs of layers {layers} (fused by the head's fc)"
    return "final-norm hidden state f"


def _first_pass_text(match: dict[str, Any]) -> str:
    """Which committed positions the head (re)computed from target features before drafting."""
    first = match.get("first_pass", {})
    start, length = first.get("start", 0), first.get("length", 0)
    if not length:
        return ""
    if start == 0:
        return f"First the head read the prompt's features (positions 0..{length - 1})."
    return (f"First the head re-read positions {start}..{start + length - 1} (just committed) from the target's "
            "features, replacing what its own draft steps had written there (vllm#14649).")


def _confidence_by_position(trace: Trace) -> list[float]:
    """Mean head confidence (q of its top token) at each draft position over the run."""
    sums: dict[int, list[float]] = {}
    for st in trace.steps:
        for pos in st.match.get("positions", []):
            if pos.get("head_top_prob") is not None:
                sums.setdefault(pos["draft_index"], []).append(pos["head_top_prob"])
    return [sum(v) / len(v) for _, v in sorted(sums.items())]


def acceptance_by_position_figure(traces: Sequence[Trace | dict[str, Any]], height: int = 300) -> go.Figure:
    """Per-position acceptance rate (unconditional, vLLM's: share of drafting steps that accepted
    >= i tokens, from :mod:`specviz.trace`'s metrics) of several runs, e.g. eagle3 vs draft_model on
    the same prompt; for EAGLE runs also the head's mean confidence per position (dotted)."""
    fig = go.Figure()
    for tr in (as_trace(t) for t in traces):
        method = tr.config.get("method", "?")
        rates = metrics_of(tr).acceptance_rate_per_position
        fig.add_trace(go.Scatter(x=list(range(1, len(rates) + 1)), y=rates, mode="lines+markers",
                                 name=f"{method}: accepted >= i"))
        if method in KINDS:
            conf = _confidence_by_position(tr)
            fig.add_trace(go.Scatter(x=list(range(1, len(conf) + 1)), y=conf, mode="lines+markers",
                                     line={"dash": "dot"}, name=f"{method}: mean head confidence"))
    fig.update_layout(height=height, margin={"l": 50, "r": 20, "t": 50, "b": 40}, plot_bgcolor="#ffffff",
                      title={"text": "acceptance by draft position", "font": {"size": 13}},
                      xaxis={"title": "draft position i", "dtick": 1}, yaxis={"range": [0, 1.05], "title": "rate"},
                      legend={"orientation": "h", "y": -0.25})
    return fig


def eagle_figure(trace: Trace | dict[str, Any], step: int) -> go.Figure:
    """The run's per-position acceptance next to the head's mean confidence (compare other methods'
    runs with :func:`acceptance_by_position_figure`)."""
    trace = as_trace(trace)
    drafted = any(st.match.get("positions") or st.match.get("tree") not in (None, "none") for st in trace.steps)
    if not drafted:  # tree steps (EAGLE-2 / static) carry no chain positions: acceptance by depth still applies
        return message_figure("no EAGLE drafts in this run", height=160)
    fig = acceptance_by_position_figure([trace])
    fig.data = [tr for tr in fig.data if len(tr.y or ())]  # tree steps record no head confidence per position
    return fig


def tree_source_html(trace: Trace, step: int) -> str:
    """A short note on how an EAGLE tree step was drafted (for the method's source panel)."""
    st = trace.steps[step]
    m = st.match
    kind = str(m.get("kind", ""))
    head = methods.get(kind).texts.source if kind in methods.names() else "the head"
    if m.get("tree") == "dynamic":
        how = (f"EAGLE-2's dynamic tree: from the root token at position {m.get('root_position')}, every frontier "
               f"node took its top {m.get('top_k')} children by the head, scored by the path's cumulative "
               f"log-confidence; {m.get('levels')} head forward(s) after the root's expansion made "
               f"{m.get('num_candidates')} candidates, of which the best {len(st.nodes) or '…'} were kept "
               f"(total_tokens = {m.get('total_tokens')} with the root).")
    else:
        how = (f"a static tree of {len(m.get('choices', []))} path(s) (speculative_token_tree): the child of rank r "
               "of a node is the head's r-th most likely token there, one head forward per depth.")
    return (f"<div class='sv-match sv-eagle-tree' style='font-size:13px;color:#374151;padding:6px'>"
            f"{head[:1].upper()}{head[1:]} drafted "
            f"{html.escape(how)} Every node of a depth ran at one position, seeing the committed prefix and its own "
            "ancestors only; the head's tree K/V is dropped after the step (its cache keeps committed positions). "
            "A node's draft confidence (the head's softmax of its token at its parent, as the chain's conf. column) "
            "is not the q the verifier uses: top-k children are chosen by rank, not sampled, so the lossless test "
            "(rule A) treats their q as one-hot, q = 1 (greedy verification uses no q). The tree itself is drawn in "
            "the draft-tree view, with both numbers in each node's hover.</div>")


def draft_why(trace: Trace, st: Step) -> str | None:
    """The lesson's sentences: the head ran once per drafted token, on a feature and the token after it."""
    m, k = st.match or {}, len(st.draft_token_ids)
    rows = (m.get("positions") or [])[:k]
    if m.get("kind") not in KINDS or len(rows) < k or not k:
        return None
    name = "EAGLE-3" if m["kind"] == EAGLE3 else "EAGLE"
    per = "; ".join(f"x{i} = {quoted(trace, t)} from {html.escape(_feature_text(m, row))}"
                    + (f" (confidence {fmt_prob(row['draft_prob'])})" if row.get("draft_prob") is not None else "")
                    for i, (row, t) in enumerate(zip(rows, st.draft_token_ids), start=1))
    first = _feature_name(m).replace(" (fused", ", fused").rstrip(")")
    return (f"The {name} head ran {k} time(s), once per drafted token, each time on a feature and the token that "
            f"follows it. The first feature comes from the target ({first}), the later ones are the head's own "
            "output: " + per + ".")


panel_html, panel_figure = eagle_html, eagle_figure  # the view contract (specviz.methods.base)
