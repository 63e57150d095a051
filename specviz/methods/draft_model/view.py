"""Where a draft model's tokens came from: at each drafted position, the drafted token x_i, its
draft probability q_i(x_i), the draft's own top candidates (q_top, recorded by the sampler) and
the target's p_i(x_i). Greedy drafting (temperature 0) takes q's argmax; otherwise x_i is
sampled from q = softmax(logits / T) (specviz/methods/draft_model/proposer.py)."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.trace import Step, Trace

from specviz.viz.common import as_trace, fmt_prob, label, quoted, quoted_tokens, short_prob, token_code, top_pairs
from specviz.viz.residual import message_figure

TOP = 5  # candidates listed per position


def draft_candidates_html(trace: Trace, step: Step) -> str:
    """HTML table of ``step``'s drafted positions (see module docstring); rows carry
    ``data-position``. A step without per-position details gets a sentence instead."""
    if step.is_tree:  # a static tree: each child is the draft's candidate of its rank (top-k), whatever T is
        how = ("gave each tree node the draft's candidate of its rank at its parent (top-k children, verified "
               "with q one-hot); the row below is the step's path")
    elif (step.match or {}).get("greedy"):
        how = "took the draft's argmax (greedy drafting)"
    else:
        how = "sampled x_i from the draft's q = softmax(logits / T)"
    if not step.positions:
        return (f"<div class='sv-match-empty' style='padding:12px;color:#374151'>step {step.index}: the draft model "
                f"drafted {len(step.draft_token_ids)} token(s); this trace has no per-position details.</div>")
    rows = []
    for pos in step.positions:
        cands = " ".join(
            "<span class='sv-cand'>"
            + token_code(trace, int(t), "font-weight:bold;background:#fed7aa" if int(t) == pos.token_id else "")
            + f"&nbsp;{fmt_prob(float(q))}</span>" for t, q in pos.q_top[:TOP])
        rows.append(f"<tr data-position='{pos.index}'><td>x{pos.index}</td>"
                    f"<td>{token_code(trace, pos.token_id)}</td>"
                    f"<td>{fmt_prob(pos.q)}</td><td>{cands or '—'}</td><td>{fmt_prob(pos.p)}</td></tr>")
    head = ("<tr><th>i</th><th>drafted x_i</th><th>q(x_i)</th><th>the draft's top candidates (q)</th>"
            "<th>target p(x_i)</th></tr>")
    note = (f"<p style='font-size:13px;color:#374151'>Step {step.index}: the draft model ran once per position and "
            f"{how}; the drafted token is highlighted among its candidates.</p>")
    return (f"<div class='sv-match sv-draft-candidates'>{note}<table style='font-size:13px;border-collapse:collapse' "
            f"cellpadding='4'>{head}{''.join(rows)}</table></div>")


# ---- the view contract (specviz.methods.base) ------------------------------------------------------------------
LESSON_FOCUS = "match"


def panel_html(trace, step: int, position: int | None = None) -> str:
    trace = as_trace(trace)
    st = trace.steps[step]
    if st.draft_token_ids:
        return draft_candidates_html(trace, st)
    return (f"<div class='sv-match-empty' style='padding:12px;color:#374151'>Step {st.index}: nothing was drafted "
            "(the request's last step drafts no further than max_new_tokens), and the target decoded one token.</div>")


DRAFTED_COLOUR, OTHER_COLOUR = "#fb923c", "#cbd5e1"  # the drafted token's bar (the table's highlight), the others
PANEL_COLUMNS = 2  # drafted positions side by side
PANEL_ROW_PX = 125  # px per row of positions: TOP bars, their labels and the position's title (two rows fit below the
# presentation layout's chapter at 1280x720)


def candidates_figure(trace, step: int) -> go.Figure:
    """The draft's top candidates (q) at each drafted position of ``step``, one small bar chart a position (at most
    :data:`TOP` bars, the drafted token's bar orange, q printed on each bar) titled with the drafted token and its
    q: the table's candidates drawn. A message figure for a step without per-position details.
    Raises IndexError if ``step`` is not a step of the trace."""
    trace = as_trace(trace)
    st = trace.steps[step]
    if not st.positions or not any(pos.q_top for pos in st.positions):
        return message_figure(f"step {st.index}: no draft candidates recorded for this step", height=160)
    cols = min(PANEL_COLUMNS, len(st.positions))
    rows = -(-len(st.positions) // cols)
    titles = [f"x{pos.index} = {label(trace, pos.token_id)} (q {short_prob(pos.q)})" for pos in st.positions]
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.22,
                        vertical_spacing=0.5 / rows)
    for n, pos in enumerate(st.positions):
        top = [(int(t), float(q)) for t, q in pos.q_top[:TOP]][::-1]  # the most likely at the top
        fig.add_trace(go.Bar(
            x=[q for _, q in top], y=[f"{label(trace, t)} #{i}" for i, (t, _) in enumerate(top)], orientation="h",
            marker_color=[DRAFTED_COLOUR if t == pos.token_id else OTHER_COLOUR for t, _ in top],
            text=[short_prob(q) for _, q in top], textposition="outside", cliponaxis=False, showlegend=False,
            hovertext=[f"{quoted(trace, t)}: q = {fmt_prob(q)}" for t, q in top], hoverinfo="text"),
            row=n // cols + 1, col=n % cols + 1)
    fig.update_yaxes(tickmode="array", automargin=True)
    for axis in fig.layout:  # tick labels without the " #i" that keeps equal tokens apart
        if axis.startswith("yaxis"):
            ticks = [t for tr in fig.data if tr.yaxis == ("y" + axis[5:]) for t in tr.y]
            fig.layout[axis].update(tickvals=ticks, ticktext=[t.rsplit(" #", 1)[0] for t in ticks])
    fig.update_xaxes(range=[0, 1.3], showticklabels=False, showgrid=False)
    fig.update_annotations(font={"size": 12})  # the subplot titles
    fig.update_layout(
        title={"text": f"<b>step {st.index}: the draft's top candidates (q) at each drafted position</b>",
               "font": {"size": 13}, "x": 0, "xanchor": "left"},
        height=56 + PANEL_ROW_PX * rows, margin={"l": 10, "r": 10, "t": 56, "b": 6}, plot_bgcolor="#ffffff",
        bargap=0.25, font={"size": 11})
    return fig


panel_figure = candidates_figure  # the view contract (specviz.methods.base)


def draft_why(trace: Trace, st: Step) -> str | None:
    """The lesson's sentences: the draft model ran once per drafted position."""
    m, k = st.match or {}, len(st.draft_token_ids)
    how = "took its argmax (greedy drafting at temperature 0)" if m.get("greedy") else \
        "sampled from q = softmax(logits / T)"
    per = [f"x{i} = {quoted(trace, pos.token_id)} with q = {fmt_prob(pos.q)} (its top candidates: "
           f"{top_pairs(trace, pos.q_top)})" for i, pos in enumerate(st.positions[:k], start=1)]
    return (f"The draft model ran {k} forward(s), one per token, and at each position {how}: "
            + ("; ".join(per) or quoted_tokens(trace, st.draft_token_ids)) + ".")
