"""The token stream: the output as HTML spans coloured by each token's fate.

Rejected draft tokens stay visible, struck through, where they were proposed (right before the
recovered token that replaced them). Hovering a token shows its step, slot, p(x), the acceptance test of the run's
verification rule with its numbers (:func:`~specviz.viz.lesson_decision.test_sentence`) and where the step's own token
was drawn from. Styles are inline so the HTML looks the same inside the app and in an exported
file.
"""

from __future__ import annotations

import html
import textwrap
from typing import Any

from specviz.trace import Trace

from .lesson_decision import own_token_source, test_sentence
from .common import (FATE_STYLE, TokenEvent, as_trace, fate_label, fmt_prob, residual_prob, stopped_in_drafts,
                     token_events, token_text, visible)

PROMPT_CHARS = 240  # longer prompts show only their last PROMPT_CHARS characters (and at most PROMPT_LINES lines)
PROMPT_LINES = 4
HOVER_WIDTH = 90  # characters per line of a hover's acceptance test
LEGEND_FATES = ("accepted", "rejected", "recovered", "bonus", "target")

_BOX = ("font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:14px;line-height:1.9;"
        "white-space:pre-wrap;word-break:break-word;padding:10px;border:1px solid #d1d5db;border-radius:8px;"
        "background:#ffffff;color:#111827;max-height:420px;overflow-y:auto")


def _span_style(fate: str, first_of_step: bool, selected: bool) -> str:
    bg, fg, _ = FATE_STYLE[fate]
    style = f"background:{bg};color:{fg};border-radius:3px;padding:1px 0;"
    if fate == "rejected":
        style += "text-decoration:line-through;text-decoration-thickness:2px;"
    if first_of_step:
        style += "margin-left:4px;"
    if selected:
        style += "outline:2px solid #111827;"
    return style


def _title(ev: TokenEvent, trace: Trace) -> str:
    step = trace.steps[ev.step] if 0 <= ev.step < len(trace.steps) else None
    what = {
        "accepted": "accepted draft token",
        "stop": "accepted draft token; the request stops at it (counted as the step's own token)",
        "rejected": "rejected draft token (not in the output)",
        "recovered": own_token_source(trace, step) if step is not None else "recovered token",
        "bonus": "bonus token, drawn from p after every draft token was accepted",
        "target": "target token (this step drafted nothing)",
    }.get(ev.fate, ev.fate)
    verify = trace.config.get("verify")
    lines = [f"step {ev.step}, position {ev.slot}: {what}",
             f"token ‘{visible(token_text(trace, ev.token_id))}’ (id {ev.token_id})",
             f"p(x) = {fmt_prob(ev.p) if ev.p is not None else 'not recorded'}"]
    if ev.fate == "recovered" and verify not in ("greedy", "typical") and step is not None:
        lines[-1] += f"   r(x) = {fmt_prob(residual_prob(step))} (the residual it was drawn from)"
    pos = step.positions[ev.slot - 1] if step is not None and 0 < ev.slot <= len(step.positions) else None
    if ev.fate in ("accepted", "stop", "rejected") and pos is not None:  # the rule's own test, with its numbers
        lines += textwrap.wrap(html.unescape(test_sentence(trace, step, pos)), HOVER_WIDTH)  # plain text: escaped once
    if ev.unused_after:
        lines.append(f"{ev.unused_after} later draft token(s) of this step were thrown away")
    return "\n".join(lines)


def _piece_html(piece: str) -> str:
    """A token's text for the stream: the layout is kept (newlines break lines), newline and tab
    get a visible mark, and the spaces of a whitespace-only token (indentation) are drawn as faint
    dots, so an indentation token is a readable box rather than an empty one."""
    text = html.escape(piece).replace("\n", "↵\n").replace("\t", "→\t") or "∅"
    if piece and not piece.strip(" \n\t"):
        text = text.replace(" ", "<span style='opacity:0.45'>·</span>")
    return text


def legend_html(fates: tuple[str, ...] = LEGEND_FATES, trace: Trace | None = None) -> str:
    """A one-line colour legend for the token fates (labels as :func:`~specviz.viz.common.fate_label`
    gives them for ``trace``: at greedy verification the recovered token is the target's argmax)."""
    items = []
    for fate in fates:
        style = _span_style(fate, False, False) + "padding:1px 6px;"
        items.append(f'<span style="{style}">{html.escape(fate_label(fate, trace))}</span>')
    note = ('<span style="color:#64748b">tokens of one verification step touch; a gap separates steps</span>')
    return ('<div class="sv-legend" style="display:flex;flex-wrap:wrap;gap:6px;margin:4px 0 8px 0;'
            'font-size:13px">' + "".join(items) + note + "</div>")


def token_stream_html(trace: Trace | dict[str, Any], selected_step: int | None = None) -> str:
    """HTML of the prompt (muted) and the output, one ``<span class="sv-tok">`` per token.

    Args:
        trace: a Trace or its dict (a partial, streaming trace is fine; texts missing from
            ``token_texts`` show as ``<id>``).
        selected_step: step index whose tokens get an outline, or None.
    Returns:
        A self-contained HTML string (inline styles). Each token span carries ``data-step``,
        ``data-slot``, ``data-fate`` and ``data-token`` attributes and a hover ``title``.
    Raises:
        specviz.trace.TraceFormatError: ``trace`` is a malformed dict.
    """
    trace = as_trace(trace)
    prompt = trace.prompt_text or "".join(token_text(trace, t) for t in trace.prompt_token_ids)
    tail = "\n".join(prompt[-PROMPT_CHARS:].split("\n")[-PROMPT_LINES:])
    prompt = prompt if tail == prompt else "… " + tail
    parts = [f'<span class="sv-prompt" style="color:#6b7280" title="prompt">{html.escape(prompt)}</span>']
    last_step = None
    for ev in token_events(trace):
        first = ev.step != last_step
        last_step = ev.step
        style = _span_style(ev.fate, first, ev.step == selected_step)
        parts.append(
            f'<span class="sv-tok sv-{ev.fate}" data-step="{ev.step}" data-slot="{ev.slot}" data-fate="{ev.fate}" '
            f'data-token="{ev.token_id}" '
            f'style="{style}" title="{html.escape(_title(ev, trace), quote=True)}">'
            f"{_piece_html(token_text(trace, ev.token_id))}</span>"
        )
    if not trace.steps:
        parts.append('<span style="color:#9ca3af"> (no tokens yet)</span>')
    fates = LEGEND_FATES[:1] + ("stop",) * stopped_in_drafts(trace) + LEGEND_FATES[1:]
    return f'<div class="sv-stream">{legend_html(fates, trace=trace)}<div style="{_BOX}">{"".join(parts)}</div></div>'
