"""DFlash views: the block as one drafter forward produced it, slot by slot, then what the target kept.

Reads only the trace: a step's ``match`` holds the block details that
:class:`specviz.methods.dflash.proposer.DFlashProposer` records (root token and position, block size B,
the MASK id, the target layers fused, the context positions added this step, and per mask slot
i = 1..B-1 its position, the slot's top token and its probability ("confidence"), the token it
drew, whether it was handed to the target); ``num_accepted`` / ``emitted`` / ``committed_token_ids``
say what the target kept. Method: Chen, Liang, Liu 2026 (arXiv 2602.06036); docs/design/methods.md 6.1.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from specviz.trace import Step, Trace

from specviz.viz.common import (FATE_STYLE, as_trace, emitted_fate, fate_label, fmt_prob, metrics_of, position_fate,
                                nothing_drafted, quoted, quoted_tokens, token_text, visible)
from specviz.viz.head_source import head_source_html
from specviz.viz.residual import message_figure

NOT_DRAFTED = ("#ffffff", "#9ca3af", "not handed to the target (k' < B - 1)")


def _fate(step: Step, slot: dict[str, Any]) -> str:
    """What the target did with mask slot i: a position fate, or "not drafted" (i > k')."""
    i = int(slot["slot"])
    return position_fate(step, i) if i <= len(step.draft_token_ids) else "not drafted"


def _style(fate: str) -> tuple[str, str, str]:
    return NOT_DRAFTED if fate == "not drafted" else FATE_STYLE[fate]


def _short(trace: Trace, token_id: int) -> str:
    """A token's visible text (:func:`~specviz.viz.common.visible`: runs of more than 3 spaces as ␣×n)."""
    return visible(token_text(trace, int(token_id)))


def _tok(trace: Trace, token_id: Any) -> str:
    if token_id is None:
        return "—"
    return f"<code>{html.escape(_short(trace, token_id))}</code>"


def _drawn(slot: dict[str, Any]) -> tuple[int, float]:
    """(the slot's draft token, q of it): the token drawn from the slot (the argmax at T = 0), which the target
    verified; the top token only when the slot recorded no draw."""
    token = slot.get("token_id", slot.get("top_token_id"))
    prob = slot.get("draft_prob") if token != slot.get("top_token_id") else slot.get("top_prob")
    return token, float(prob if prob is not None else slot.get("top_prob") or 0.0)


def _slot_cell(trace: Trace, step: Step, slot: dict[str, Any], selected: bool, greedy: bool) -> str:
    """One mask slot: position, the token it drew (the draft the target verified) with q of it as a bar, the slot's
    top token and confidence beneath when the draw (T > 0) was not the top, and the target's decision."""
    fate = _fate(step, slot)
    bg, fg, _ = _style(fate)
    border = "2px solid #0b3d91" if selected else ("1px dashed #9ca3af" if fate == "not drafted" else "1px solid #d1d5db")
    head = (f"<div data-slot='{slot['slot']}' data-fate='{fate}' style='min-width:74px;max-width:110px;padding:4px 6px;"
            f"border:{border};border-radius:6px;background:{bg};color:{fg};font-size:12px'>"
            f"<div style='font-size:11px'>slot {slot['slot']} · pos {slot['position']}</div>")
    conf = slot.get("top_prob")
    if conf is None:  # numbers not filled (the step was never observed)
        return f"{head}<div style='font-size:11px;font-weight:bold'>{fate}</div></div>"
    token, q = _drawn(slot)
    bar = (f"<div style='height:5px;background:#e5e7eb;border-radius:2px'><div style='height:5px;width:"
           f"{100 * q:.0f}%;background:#2563eb;border-radius:2px'></div></div>")
    top = ""
    if not greedy and token != slot.get("top_token_id"):  # sampled: the draw is the draft, the top only beside it
        top = f"<div style='font-size:11px'>top {_tok(trace, slot.get('top_token_id'))} ({conf:.2f})</div>"
    return (f"{head}<div style='overflow:hidden;text-overflow:ellipsis;white-space:nowrap'>"
            f"{_tok(trace, token)}</div>{bar}<div style='font-size:11px'>{'conf' if greedy else 'q'} {q:.2f}</div>"
            f"{top}<div style='font-size:11px;font-weight:bold'>{fate}</div></div>")


def _kept_text(trace: Trace, step: Step) -> str:
    k, acc = len(step.draft_token_ids), step.num_accepted_committed
    fate = emitted_fate(step)
    own = "" if fate == "cut" else f" and added its own {fate_label(fate, trace)} {html.escape(quoted(trace, step.emitted.token_id))}"
    return (f"Then the target verified the {k} drafted slot{'s' * (k != 1)} in one forward: it kept {acc} "
            f"(accepted){own}, so this step committed {len(step.committed_token_ids)} token"
            f"{'s' * (len(step.committed_token_ids) != 1)}.")


def _context_text(ctx: dict[str, Any]) -> str:
    """Which context positions the drafter added (from target features) in this step's forward."""
    start, length = ctx.get("start", 0), ctx.get("length", 0)
    if not length:
        return ""
    if start == 0:
        return " (all read in this forward: the prompt)"
    where = f"position {start}" if length == 1 else f"positions {start}..{start + length - 1}"
    return f" ({where}, just committed, added in this forward)"


def dflash_html(trace: Trace | dict[str, Any], step: int, position: int | None = None) -> str:
    """HTML of one DFlash step: the root cell and the B-1 mask slots of the block (each slot's top
    token, confidence bar and the target's decision; slots beyond k' marked "not drafted"), then
    what the target kept. ``position`` (1-based slot) is outlined. Steps without a block get a note.
    Raises IndexError if ``step`` is not a step of the trace."""
    trace = as_trace(trace)
    st = trace.steps[step]
    m = st.match
    if m.get("kind") != "dflash" or not m.get("slots"):
        return nothing_drafted(st.index, "DFlash")
    greedy = bool(m.get("greedy"))
    layers = ", ".join(str(x) for x in m.get("target_layer_ids", []))
    ctx = m.get("context", {})
    added = _context_text(ctx)
    conf = ("the softmax of the slot's logits at its top token, which is its draft" if greedy else
            "q, the slot's sampling distribution, at the token it drew (its draft; the slot's top token beside it "
            "when the draw was another)")
    note = (f"<p style='font-size:13px;color:#374151'>DFlash filled the block [root, MASK × {m['block_size'] - 1}] in "
            f"<b>one</b> forward: every slot attends to every other slot and to the target's fused features (outputs "
            f"of layers {layers}) at positions 0..{m['root_position'] - 1}{added}. Slot i predicts the token at "
            f"position {m['root_position']} + i. Each bar is {conf}; the first "
            f"{m['num_drafted']} slot{'s' * (m['num_drafted'] != 1)} went to the target.</p>")
    root = (f"<div data-slot='0' style='min-width:60px;padding:4px 6px;border:1px solid #d1d5db;border-radius:6px;"
            f"background:#dde3ea;font-size:12px'><div style='font-size:11px'>root · pos {m['root_position']}</div>"
            f"{_tok(trace, m.get('root_token_id'))}<div style='font-size:11px'>committed</div></div>")
    cells = [_slot_cell(trace, st, s, position == s["slot"], greedy) for s in m["slots"]]
    note += head_source_html(trace)  # the loaded head's layout and source (heads.formats)
    return (f"<div class='sv-match sv-dflash'>{note}<div style='display:flex;flex-wrap:wrap;gap:4px'>{root}"
            f"{''.join(cells)}</div><p style='font-size:13px;color:#374151'>{_kept_text(trace, st)}</p></div>")


def dflash_figure(trace: Trace | dict[str, Any], step: int) -> go.Figure:
    """The selected step's block: each mask slot's draft token (bars of q of it, one trace per target decision,
    labelled with the token drawn, which at T = 0 is the top token), beside the run's share of blocks that kept
    >= i drafts (vLLM's unconditional per-position acceptance, from :mod:`specviz.trace`)."""
    trace = as_trace(trace)
    st = trace.steps[step]
    slots = [s for s in st.match.get("slots", []) if s.get("top_prob") is not None]
    if st.match.get("kind") != "dflash" or not slots:
        return message_figure("no DFlash block at this step", height=160)
    fates = [_fate(st, s) for s in slots]
    fig = go.Figure()
    for fate in dict.fromkeys(fates):  # one bar trace per decision, so the legend names the colours
        mine = [(s, *_drawn(s)) for s, f in zip(slots, fates) if f == fate]
        fig.add_trace(go.Bar(
            x=[s["slot"] for s, _, _ in mine], y=[q for _, _, q in mine], name=fate,
            marker={"color": _style(fate)[0], "line": {"color": "#374151", "width": 1}}, hoverinfo="text",
            hovertext=[f"slot {s['slot']} (position {s['position']}): drew {quoted(trace, token)}, q {q:.2f}"
                       + ("" if token == s["top_token_id"] else
                          f" (top {quoted(trace, s['top_token_id'])}, {s['top_prob']:.2f})") + f", {fate}"
                       for s, token, q in mine]))
    rates = metrics_of(trace).acceptance_rate_per_position[: st.match["block_size"] - 1]  # k > B - 1: never past it
    if rates:
        fig.add_trace(go.Scatter(x=list(range(1, len(rates) + 1)), y=rates, mode="lines+markers",
                                 name="run: blocks keeping ≥ i", line={"color": "#16a34a"}))
    # each slot's draft token under its slot number, not above the bar, where the run's rate line would cover it
    ticks = [f"{s['slot']}<br>{html.escape(_short(trace, _drawn(s)[0])[:6], quote=False)}" for s in slots]
    # the axis's meaning in the title and the legend anchored under the tick labels: an axis title there collided
    # with a legend that wraps in a half-page panel (the presentation layout's larger type)
    fig.update_layout(height=390, margin={"l": 50, "r": 20, "t": 60, "b": 150}, plot_bgcolor="#ffffff",
                      title={"text": f"step {st.index}: the block from one forward<br>mask slot i predicts position "
                                     "root + i; its draft token under it", "font": {"size": 13}},
                      xaxis={"tickvals": [s["slot"] for s in slots], "ticktext": ticks},
                      yaxis={"range": [0, 1.15], "title": "q(draft token) / rate"},
                      legend={"orientation": "h", "y": -0.36, "yanchor": "top", "x": 0}, barmode="overlay")
    return fig


# ---- the view contract (specviz.methods.base) ------------------------------------------------------------------
panel_html, panel_figure = dflash_html, dflash_figure


def draft_limit(trace: Trace) -> tuple[int, str, str] | None:
    """DFlash drafts at most block size - 1 tokens (one block; a larger k drafts that many): (that number, a short
    reason, the reason in full) when it is below k, read from the block size the steps recorded; else None."""
    k = int(trace.config.get("num_speculative_tokens") or 0)
    for st in trace.steps:
        m = st.match or {}
        if m.get("block_size"):
            n = int(m["block_size"]) - 1
            return (n, f"DFlash: block size − 1 = {n}", f"DFlash drafts at most block size − 1 = {n} tokens (one block "
                    f"of {n + 1})") if n < k else None
    return None


def draft_why(trace: Trace, st: Step) -> str | None:
    """The lesson's sentences: one forward over the block drafted every slot."""
    m, k = st.match or {}, len(st.draft_token_ids)
    if not m.get("slots"):
        return None
    slots = [(s, *_drawn(s)) for s in m["slots"] if s.get("drafted") and s.get("top_prob") is not None]
    word = "confidence" if m.get("greedy") else "q"  # sampled: q of the token drawn, not of the slot's top token
    per = "; ".join(f"slot {s['slot']} → {quoted(trace, token)} ({word} {fmt_prob(q)})" for s, token, q in slots)
    return (f"DFlash ran <b>one</b> forward over the block [{quoted(trace, m['root_token_id'])}, MASK × "
            f"{m['block_size'] - 1}] at positions {m['root_position']}..{m['root_position'] + m['block_size'] - 1}: "
            "every slot saw every other slot and the target's own features of the committed text, and each "
            f"MASK slot predicted the token at its position. The first {k} became the draft: "
            + (per or quoted_tokens(trace, st.draft_token_ids)) + ".")
