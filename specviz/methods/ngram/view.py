"""The n-gram (prompt lookup) view of one step: where the draft was copied from.

Left: the context the proposer searched (prompt + tokens committed before the step), with the
final n tokens (the suffix looked up), every earlier occurrence of that n-gram, and the tokens
copied as the draft after the chosen (earliest) occurrence highlighted. Right: the trie of
continuations after all occurrences, with counts; the path the draft took is drawn bold.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from specviz.trace import Step, Trace

from specviz.methods.ngram.options import PATTERN
from specviz.viz.common import as_trace, context_before, label, quoted, quoted_tokens, small_lines, token_text
from specviz.viz.residual import message_figure

MAX_CHILDREN = 4  # trie branches shown per node (most frequent first); the rest are summed
ROOT_TOKENS = 4  # tokens of the matched n-gram written under the trie's root
MAX_DEPTH = 6
CONTEXT_AROUND = 24  # context tokens shown on each side of a highlighted token; the rest is elided (…)
STYLE = {
    PATTERN: "background:#c4b5fd;color:#2e1065;outline:1px solid #7c3aed",
    "occurrence": "background:#fde68a;color:#78350f",
    "chosen": "background:#fbbf24;color:#451a03;outline:2px solid #b45309",
    "draft": "background:#bae6fd;color:#0c4a6e;text-decoration:underline",
}


def _no_match_text(trace: Trace, step: Step) -> str:
    tried = ", ".join(f"n={t['n']}: {t['occurrences']}" for t in step.match.get("tried", []))
    if not tried and "prompt_lookup_max" in step.match:
        tried = f"n = {step.match['prompt_lookup_max']} down to {step.match['prompt_lookup_min']}: none"
    return (f"Step {step.index}: no earlier occurrence of the context's last n tokens "
            f"(occurrences tried {tried or '—'}), so nothing was drafted and the target decoded one token.")


def _roles(step: Step, ctx_len: int) -> dict[int, str]:
    m = step.match
    n, roles = int(m.get("n", 0)), {}
    for start in m.get("occurrences", []):
        for j in range(start, min(start + n, ctx_len)):
            roles[j] = "occurrence"
    first = int(m.get("match_position", -1))
    for j in range(first, first + n):
        roles[j] = "chosen"
    for j in range(first + n, min(first + n + len(step.draft_token_ids), ctx_len)):
        roles.setdefault(j, "draft")
    for j in range(int(m.get("suffix_start", ctx_len)), ctx_len):
        roles[j] = PATTERN
    return roles


def match_context_html(trace: Trace | dict[str, Any], step: int) -> str:
    """HTML of the context at ``step`` with the match highlighted (see module docstring).

    Spans carry ``data-role`` = suffix | occurrence | chosen | draft. Returns an explanatory
    paragraph instead when the step has no n-gram match.
    Raises:
        specviz.trace.TraceFormatError: ``trace`` is a malformed dict.
        IndexError: ``step`` is not a step of the trace.
    """
    trace = as_trace(trace)
    st = trace.steps[step]
    if not st.match.get("n"):
        return (f'<div class="sv-match-empty" style="padding:12px;color:#374151">'
                f'{html.escape(_no_match_text(trace, st))}</div>')
    ctx = context_before(trace, step)
    roles = _roles(st, len(ctx))
    shown = _shown_positions(roles, len(ctx))
    parts, prev, piece = [], -1, ""
    for j in shown:
        if j != prev + 1:  # elided context: the excerpt before ends with "…", the next starts on its own line
            gap = "… " if prev < 0 or piece.endswith("\n") else " …\n… "
            parts.append(f'<span style="color:#9ca3af">{gap}</span>')
        prev = j
        piece = html.escape(token_text(trace, ctx[j])).replace("\n", "↵\n")
        role = roles.get(j)
        if role:
            parts.append(f'<span data-role="{role}" data-index="{j}" style="{STYLE[role]};border-radius:2px" '
                         f'title="{role} (context position {j})">{piece}</span>')
        else:
            parts.append(piece)
    m = st.match
    occurrences = (("occurrence", f"earlier occurrences ({len(m['occurrences'])})"),) if m.get("kind") != "ngram_gpu" else ()
    legend = " ".join(f'<span style="{STYLE[r]};padding:0 4px">{name}</span>' for r, name in (
        (PATTERN, f"last {m['n']} token(s): looked up"), *occurrences,
        ("chosen", "earliest occurrence (used)"), ("draft", f"copied as the draft ({len(st.draft_token_ids)})")))
    if m.get("kind") == "ngram_gpu":
        legend += ("<div style='font-size:12px;color:#4b5563;margin-top:4px'>ngram_gpu: the device matcher returns "
                   "only the occurrence it used; method 'ngram' also lists every occurrence and their continuations."
                   "</div>")
    box = ("font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px;line-height:1.8;white-space:pre-wrap;"
           "word-break:break-word;border:1px solid #d1d5db;border-radius:8px;padding:8px;max-height:360px;"
           "overflow-y:auto")
    # classes: the presentation layout's type reaches them (assets/css/lesson.css)
    return (f'<div class="sv-match"><div class="sv-match-legend" style="font-size:13px;margin-bottom:6px">{legend}'
            f'</div><div class="sv-match-text" style="{box}">{"".join(parts)}</div></div>')


def _shown_positions(roles: dict[int, str], length: int) -> list[int]:
    """Context positions within CONTEXT_AROUND tokens of a highlighted one (ascending)."""
    keep: set[int] = set()
    for j in roles:
        keep.update(range(max(0, j - CONTEXT_AROUND), min(length, j + CONTEXT_AROUND + 1)))
    return sorted(keep)


def _prune(nodes: list[dict[str, Any]], depth: int, path: list[int] | None) -> list[dict[str, Any]]:
    """Keep the MAX_CHILDREN most frequent branches per node (plus the drafted path's) and
    MAX_DEPTH levels; the rest become one '+N more' node carrying their summed count."""
    if depth >= MAX_DEPTH:
        return []
    want = path[0] if path else None
    keep = [n for i, n in enumerate(nodes) if i < MAX_CHILDREN or n["token_id"] == want]
    kept = [dict(n, children=_prune(n.get("children", []), depth + 1, path[1:] if n["token_id"] == want else None))
            for n in keep]
    rest = [n for n in nodes if all(n is not k for k in keep)]
    if rest:
        kept.append({"token_id": None, "count": sum(n["count"] for n in rest), "children": [], "more": len(rest)})
    return kept


def _layout(nodes: list[dict[str, Any]], depth: int, path: list[int] | None, out: list[dict[str, Any]],
            parent: int, next_row: list[int]) -> None:
    """Depth-first placement: leaves get consecutive rows, a parent sits at its first child's row."""
    for node in nodes:
        on_path = path is not None and bool(path) and node["token_id"] == path[0]
        me = len(out)
        out.append({"node": node, "depth": depth, "row": next_row[0], "parent": parent, "on_path": on_path})
        if node["children"]:
            _layout(node["children"], depth + 1, path[1:] if on_path else None, out, me, next_row)
        else:
            next_row[0] += 1


def trie_placement(step: Step) -> list[dict[str, Any]]:
    """The pruned continuation trie of ``step.match`` placed for drawing: one dict per node with
    node (token_id, count), depth (1 = first token after the suffix), row, parent (index or -1)
    and on_path (the node is on the drafted continuation)."""
    out: list[dict[str, Any]] = []
    draft = list(step.draft_token_ids)
    _layout(_prune(step.match.get("trie", []), 0, draft), 1, draft, out, -1, [0])
    return out


def trie_figure(trace: Trace | dict[str, Any], step: int) -> go.Figure:
    """Plotly tree of the continuations after the matched n-gram at ``step`` with their counts.

    Nodes on the drafted path are drawn large and blue; a '+N more' node sums pruned branches.
    Returns an empty-state figure for steps without an n-gram match.
    Raises:
        specviz.trace.TraceFormatError: ``trace`` is a malformed dict.
        IndexError: ``step`` is not a step of the trace.
    """
    trace = as_trace(trace)
    st = trace.steps[step]
    if st.match.get("kind") == "ngram_gpu" and st.match.get("n"):
        return message_figure(f"step {st.index}: ngram_gpu matched n = {st.match['n']} at context position "
                              f"{st.match['match_position']}; the device matcher builds no continuation trie "
                              "(method 'ngram' draws it)", height=160)
    if not st.match.get("n") or not st.match.get("trie"):
        return message_figure(f"step {st.index}: no n-gram match to draw", height=160)
    nodes = trie_placement(st)
    # the looked-up n-gram token by token, as the lesson's chapter names it (glued together, 'nn' '.' 'Module' '):'
    # read ".Module):"); its last ROOT_TOKENS tokens, "…" before them when there are more
    pattern = st.match[PATTERN]
    suffix = ("…" if len(pattern) > ROOT_TOKENS else "") + "".join(
        f"‘{label(trace, t, 12 if len(pattern) == 1 else 7)}’" for t in pattern[-ROOT_TOKENS:])
    ex, ey, px, py = [], [], [], []
    for nd in nodes:
        x0, y0 = (0, 0) if nd["parent"] < 0 else (nodes[nd["parent"]]["depth"], nodes[nd["parent"]]["row"])
        xs, ys = (px, py) if nd["on_path"] and (nd["parent"] < 0 or nodes[nd["parent"]]["on_path"]) else (ex, ey)
        xs += [x0, nd["depth"], None]
        ys += [y0, nd["row"], None]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line={"color": "#cbd5e1", "width": 1.5}, hoverinfo="skip",
                             showlegend=False))
    fig.add_trace(go.Scatter(x=px, y=py, mode="lines", line={"color": "#0284c7", "width": 4}, hoverinfo="skip",
                             name="the drafted continuation", showlegend=False))  # named in the title instead
    texts = [(f"+{nd['node']['more']} more ({nd['node']['count']})" if nd["node"]["token_id"] is None
              else f"{label(trace, nd['node']['token_id'], 7)} ×{nd['node']['count']}") for nd in nodes]
    fig.add_trace(go.Scatter(
        x=[0] + [nd["depth"] for nd in nodes], y=[0] + [nd["row"] for nd in nodes], mode="markers+text",
        # the root's label runs to the right: centred on the left edge, its first tokens were cut off
        text=[suffix] + texts, textposition=["bottom right"] + ["top center"] * len(nodes),
        textfont={"family": "monospace", "size": 11},
        marker={"size": [16] + [14 if nd["on_path"] else 9 for nd in nodes],
                "color": ["#7c3aed"] + ["#0284c7" if nd["on_path"] else "#94a3b8" for nd in nodes]},
        hovertext=[f"matched suffix ({st.match['n']} token(s))"] + [
            (f"token {quoted(trace, nd['node']['token_id'])}: follows {nd['node']['count']} occurrence(s)"
             if nd["node"]["token_id"] is not None else "pruned branches") for nd in nodes],
        hoverinfo="text", showlegend=False))
    rows = max([nd["row"] for nd in nodes] + [0]) + 1
    fig.update_layout(
        height=min(170 + 50 * rows, 700), plot_bgcolor="#ffffff", margin={"l": 20, "r": 20, "t": 96, "b": 40},
        title={"text": f"what followed the {len(st.match['occurrences'])} earlier occurrence(s)<br>of the last "
                       f"{st.match['n']} token(s)<br>" + small_lines(
                           ["×count = how many occurrences continue this way;",
                            "purple dot = the looked-up suffix; blue = the drafted continuation"]),
               "font": {"size": 13}},
        xaxis={"title": "tokens after the match", "dtick": 1, "range": [-0.6, max(nd["depth"] for nd in nodes) + 0.6]},
        yaxis={"visible": False, "range": [rows - 0.5, -0.8]},
        legend={"orientation": "h", "y": -0.02, "x": 1.0, "xanchor": "right", "yanchor": "top"},
    )
    return fig


# ---- the view contract (specviz.methods.base) ------------------------------------------------------------------
LESSON_FOCUS = "match"


def panel_html(trace: Trace, step: int, position: int | None = None) -> str:
    return match_context_html(trace, step)


panel_figure = trie_figure


def note(trace: Trace) -> str:
    """Prompt lookup drafted at fewer than 30% of the steps of a finished run: say what helps."""
    drafted = sum(1 for st in trace.steps if st.draft_token_ids)
    if not trace.stop_reason or drafted >= 0.3 * len(trace.steps):
        return ""
    return (f"Prompt lookup found a match at only {drafted} of {len(trace.steps)} steps: it copies drafts "
            "from earlier text, so it needs text that repeats itself (a longer prompt, code that reuses its "
            "names, or a lower prompt_lookup_min).")


def draft_why(trace: Trace, st: Step) -> str | None:
    """The lesson's sentences on why these tokens were drafted."""
    m, k = st.match or {}, len(st.draft_token_ids)
    if not m.get("n"):
        return None
    occ = m.get("occurrences") or [m.get("match_position")]
    return (f"The last n = {m['n']} token(s) of the context, {quoted_tokens(trace, m.get(PATTERN, []))}, occur earlier "
            f"({len(occ)} occurrence(s); the earliest, at context position {m.get('match_position')}, is used). "
            f"The {k} token(s) that followed it are copied as the draft: {quoted_tokens(trace, st.draft_token_ids)}. "
            "No model ran.")


def no_draft_why(trace: Trace, st: Step) -> str:
    tried = ", ".join(f"n = {t['n']}: {t['occurrences']}" for t in (st.match or {}).get("tried", []))
    return ("No earlier occurrence of the context's last n tokens" + (f" (occurrences tried {tried})" if tried else "")
            + ", so nothing was drafted and the target decodes one token, as plain decoding would.")
