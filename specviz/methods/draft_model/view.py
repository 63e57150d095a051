"""Where a draft model's tokens came from: at each drafted position, the drafted token x_i, its
draft probability q_i(x_i), the draft's own top candidates (q_top, recorded by the sampler) and
the target's p_i(x_i). Greedy drafting (temperature 0) takes q's argmax; otherwise x_i is
sampled from q = softmax(logits / T) (specviz/methods/draft_model/proposer.py)."""

from __future__ import annotations

from specviz.trace import Step, Trace

from specviz.viz.common import as_trace, fmt_prob, quoted, quoted_tokens, token_code, top_pairs
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
            token_code(trace, int(t), "font-weight:bold;background:#fed7aa" if int(t) == pos.token_id else "")
            + f"&nbsp;{fmt_prob(float(q))}" for t, q in pos.q_top[:TOP])
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


def panel_figure(trace, step: int):
    st = as_trace(trace).steps[step]
    return message_figure(f"step {st.index}: the draft model's candidates and q for each drafted position are "
                          "in the table at left", height=160)


def draft_why(trace: Trace, st: Step) -> str | None:
    """The lesson's sentences: the draft model ran once per drafted position."""
    m, k = st.match or {}, len(st.draft_token_ids)
    how = "took its argmax (greedy drafting at temperature 0)" if m.get("greedy") else \
        "sampled from q = softmax(logits / T)"
    per = [f"x{i} = {quoted(trace, pos.token_id)} with q = {fmt_prob(pos.q)} (its top candidates: "
           f"{top_pairs(trace, pos.q_top)})" for i, pos in enumerate(st.positions[:k], start=1)]
    return (f"The draft model ran {k} forward(s), one per token, and at each position {how}: "
            + ("; ".join(per) or quoted_tokens(trace, st.draft_token_ids)) + ".")
