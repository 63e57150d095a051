"""Suffix decoding's candidates at one step drawn as a tree, like the n-gram continuation trie.

The root is the end of the context. Each branch is one candidate (SuffixDecoding, Oliaro et al.
2024; specviz/proposers/suffix.py): the last m context tokens matched in the local tree (this
request) or the global tree (earlier outputs), then the continuation the proposer followed,
each token with its count in the tree and its running probability. The chosen branch (the
highest score = sum of the running probabilities) is drawn bold and blue: it became the draft.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from specviz.trace import Step, Trace

from .common import label, quoted

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
        A figure: x = tokens after the match (0 = the end of the context, 1 = the candidate's
        match), one row per candidate.
    """
    branches = suffix_branches(step)
    fig = go.Figure()
    xs, ys, texts, hovers, colours, sizes = [0], [0], ["context"], ["the end of the context"], ["#7c3aed"], [16]
    for row, c in enumerate(branches):
        colour, width = ("#0284c7", 4) if c["chosen"] else ("#cbd5e1", 1.5)
        chain_x = [0, 1] + [2 + j for j in range(len(c["draft"]))]
        fig.add_trace(go.Scatter(x=chain_x, y=[0] + [row] * (len(chain_x) - 1), mode="lines", hoverinfo="skip",
                                 line={"color": colour, "width": width}, showlegend=False))
        xs.append(1), ys.append(row)
        texts.append(f"m={c['match_length']} {c['source']}")
        hovers.append(f"{c['source']} tree: the last {c['match_length']} context token(s) matched; "
                      f"score {c['score']:.2f}" + (" (chosen: the draft)" if c["chosen"] else ""))
        colours.append(colour), sizes.append(12)
        counts = c.get("counts") or [None] * len(c["draft"])
        for j, (t, p, n) in enumerate(zip(c["draft"], c["probs"], counts)):
            xs.append(2 + j), ys.append(row)
            texts.append(f"{label(trace, t, 7)} {p:.2f}")
            hovers.append(f"token {quoted(trace, t)}: running probability {p:.3f}"
                          + (f", seen {n}× after this match" if n is not None else ""))
            colours.append("#0284c7" if c["chosen"] else "#94a3b8"), sizes.append(14 if c["chosen"] else 9)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers+text", text=texts, textposition="top center",
                             textfont={"family": "monospace", "size": 11}, hovertext=hovers, hoverinfo="text",
                             marker={"size": sizes, "color": colours}, showlegend=False))
    rows = max(len(branches), 1)
    depth = max([len(c["draft"]) for c in branches] + [1]) + 1
    fig.update_layout(
        height=min(190 + 50 * rows, 560), plot_bgcolor="#ffffff", margin={"l": 20, "r": 20, "t": 96, "b": 40},
        title={"text": f"suffix decoding: {len(branches)} candidate(s) of "
                       f"{sum(1 for c in step.match.get('candidates', []) if c.get('draft'))}<br>"
                       "<span style='font-size:11px'>each branch: the last m tokens matched in a suffix tree<br>"
                       "(local = this request, global = earlier outputs), then its continuation<br>"
                       "with running probabilities; blue = the best score, the draft</span>", "font": {"size": 13}},
        xaxis={"title": "tokens after the match", "dtick": 1, "range": [-0.5, depth + 0.6]},
        yaxis={"visible": False, "range": [rows - 0.5, -0.8]},
    )
    return fig
