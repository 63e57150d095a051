"""Suffix decoding's view of one step: its candidates as a table (left) and drawn as a tree (right), like the
n-gram continuation trie.

The root is the end of the context. Each branch is one candidate (SuffixDecoding, Oliaro et al.
2024; specviz/methods/suffix/proposer.py): the last m context tokens matched in the local tree (this
request) or the global tree (earlier outputs), then the continuation the proposer followed,
each token with its count in the tree and its running probability. The chosen branch (the
highest score = sum of the running probabilities) is drawn bold and blue: it became the draft.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from specviz.trace import Step, Trace

from specviz.viz.common import as_trace, fmt_prob, label, quoted, small_lines, token_code
from specviz.viz.residual import message_figure

MAX_BRANCHES = 6  # candidates drawn (highest scores; the chosen one always)


def suffix_branches(step: Step) -> list[dict[str, Any]]:
    """The candidates drawn, best score first (the chosen one always included): dicts of the
    proposer's candidate fields plus ``chosen`` (bool)."""
    m = step.match or {}
    chosen = m.get("chosen") or {}
    cands = [c for c in m.get("candidates", []) if c.get("draft")]
    ranked = sorted(cands, key=lambda c: (-float(c.get("score", 0.0)), -int(c.get("match_length", 0))))
    keep = ranked[:MAX_BRANCHES]
    if chosen in cands and chosen not in keep:
        keep[-1] = chosen
    return [dict(c, chosen=c == chosen) for c in keep]


def suffix_tree_figure(trace: Trace, step: Step) -> go.Figure:
    """Plotly tree of ``step``'s suffix-decoding candidates (see module docstring).

    Args:
        trace: the trace (for token texts); step: a step whose match kind is "suffix" with at
            least one candidate continuation.
    Returns:
        A figure: x = tokens after the match (1 = a candidate's first drafted token, 0 = its match,
        -1 = the end of the context, both unticked), one row per candidate.
    """
    branches = suffix_branches(step)
    fig = go.Figure()
    # the context and the match sit left of 1, so x counts the tokens after the match (the axis's title)
    xs, ys, texts, hovers, colours, sizes = [-1], [0], ["context"], ["the end of the context"], ["#7c3aed"], [16]
    for row, c in enumerate(branches):
        colour, width = ("#0284c7", 4) if c["chosen"] else ("#cbd5e1", 1.5)
        chain_x = [-1, 0] + [1 + j for j in range(len(c["draft"]))]
        fig.add_trace(go.Scatter(x=chain_x, y=[0] + [row] * (len(chain_x) - 1), mode="lines", hoverinfo="skip",
                                 line={"color": colour, "width": width}, showlegend=False))
        xs.append(0), ys.append(row)
        texts.append(f"m={c['match_length']} {c['source']}")
        hovers.append(f"{c['source']} tree: the last {c['match_length']} context token(s) matched; "
                      f"score {c['score']:.2f}" + (" (chosen: the draft)" if c["chosen"] else ""))
        colours.append(colour), sizes.append(12)
        counts = c.get("counts") or [None] * len(c["draft"])
        for j, (t, p, n) in enumerate(zip(c["draft"], c["probs"], counts)):
            xs.append(1 + j), ys.append(row)
            texts.append(f"{label(trace, t, 7)} {p:.2f}")
            hovers.append(f"token {quoted(trace, t)}: running probability {p:.3f}"
                          + (f", seen {n}× after this match" if n is not None else ""))
            colours.append("#0284c7" if c["chosen"] else "#94a3b8"), sizes.append(14 if c["chosen"] else 9)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers+text", text=texts, textposition="top center",
                             textfont={"family": "monospace", "size": 11}, hovertext=hovers, hoverinfo="text",
                             marker={"size": sizes, "color": colours}, showlegend=False))
    rows = max(len(branches), 1)
    depth = max([len(c["draft"]) for c in branches] + [1])
    fig.update_layout(
        height=min(190 + 50 * rows, 560), plot_bgcolor="#ffffff", margin={"l": 20, "r": 20, "t": 96, "b": 40},
        title={"text": f"suffix decoding: {len(branches)} candidate(s) of "
                       f"{sum(1 for c in step.match.get('candidates', []) if c.get('draft'))}<br>"
                       + small_lines(["each branch: the last m tokens matched in a suffix tree",
                                      "(local = this request, global = earlier outputs), then its continuation",
                                      "with running probabilities; blue = the best score, the draft"]),
               "font": {"size": 13}},
        xaxis={"title": "tokens after the match", "tickvals": list(range(1, depth + 1)), "range": [-1.5, depth + 0.6]},
        yaxis={"visible": False, "range": [rows - 0.5, -0.8]},
    )
    return fig


def suffix_html(trace: Trace, st: Step) -> str:
    """Suffix decoding's candidates at one step as an HTML table: source tree (local = this
    request, global = earlier outputs), match length m, the greedy continuation with its running
    probabilities, and the score (their sum); the chosen one (highest score, ties: longer m) bold."""
    chosen = st.match.get("chosen") or {}
    rows = []
    for c in st.match["candidates"]:
        if not c.get("draft"):
            continue
        toks = " ".join(f"{token_code(trace, t)}&nbsp;{p:.2f}"
                        for t, p in zip(c["draft"], c["probs"]))
        style = "font-weight:bold;background:#bae6fd" if c == chosen else ""
        rows.append(f"<tr style='{style}'><td>{c['source']}</td><td>{c['match_length']}</td><td>{toks}</td>"
                    f"<td>{c['score']:.2f}</td></tr>")
    head = ("<tr><th>tree</th><th>match length m</th><th>continuation (token, running probability)</th>"
            "<th>score</th></tr>")
    note = ("<p style='font-size:13px;color:#374151'>Suffix decoding (method 'suffix') matches the last m tokens "
            "in a suffix tree of this request (local) and of earlier outputs (global), then follows the most frequent "
            "continuation while its running probability stays high; the highest score (the sum of the running "
            "probabilities) becomes the draft (bold).</p>")
    return (f"<div class='sv-match sv-suffix'>{note}<table style='font-size:13px;border-collapse:collapse' "
            f"cellpadding='4'>{head}{''.join(rows)}</table></div>")


# ---- the view contract (specviz.methods.base) ------------------------------------------------------------------
LESSON_FOCUS = "match"


def _drafted(step: Step) -> bool:
    """The step's draft came from a suffix-tree candidate with a continuation."""
    return any(c.get("draft") for c in (step.match or {}).get("candidates", []))


def panel_html(trace: Trace, step: int, position: int | None = None) -> str:
    trace = as_trace(trace)
    st = trace.steps[step]
    if _drafted(st):
        return suffix_html(trace, st)
    return (f'<div class="sv-match-empty" style="padding:12px;color:#374151">Step {st.index}: the context\'s last '
            f"tokens continue nowhere in this request's suffix tree or in the tree of earlier outputs "
            f"({html.escape(str((st.match or {}).get('cached_requests', 0)))} cached), so nothing was drafted and "
            "the target decoded one token.</div>")


def panel_figure(trace: Trace, step: int) -> go.Figure:
    trace = as_trace(trace)
    st = trace.steps[step]
    if _drafted(st):
        return suffix_tree_figure(trace, st)
    return message_figure(f"step {st.index}: no suffix-tree match to draw", height=160)


def draft_why(trace: Trace, st: Step) -> str | None:
    m = st.match or {}
    c = m.get("chosen")
    if not c:
        return None
    steps = ", ".join(f"{quoted(trace, t)} ({fmt_prob(p)})" for t, p in zip(c["draft"], c["probs"]))
    n_cands = sum(1 for x in m.get("candidates", []) if x.get("draft"))
    return (f"Suffix decoding matched the last m = {c['match_length']} token(s) in the {c['source']} suffix tree "
            f"({'this request' if c['source'] == 'local' else 'earlier outputs'}) and followed its most frequent "
            f"continuation (running probability in brackets): {steps}. Its score {fmt_prob(c['score'])} (the sum "
            f"of those probabilities) was the best of {n_cands} candidate(s), so it became the draft.")
