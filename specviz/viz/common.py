"""Shared helpers of the figures: trace access, token fates, colours, token display.

Every view is a pure function of a :class:`~specviz.trace.Trace` (or its dict, see
:func:`as_trace`). Which tokens came from the draft is read from the trace's steps
(``draft_token_ids``, ``num_accepted``, ``committed_token_ids``, ``emitted``), never re-derived
from decoded text.

Fates (one per drafted position or emitted token), names as in docs/design/algorithms.md:

* ``accepted``: a draft token the target accepted (committed to the output).
* ``rejected``: the first draft token the target rejected (not in the output).
* ``unused``: a draft token after the rejected one; never verified (standard) or discarded
  (block), not in the output.
* ``recovered``: the step's own token drawn from the residual distribution at the rejected slot.
* ``bonus``: the step's own token drawn from p_{k'+1} after every draft token was accepted.
* ``target``: the token of a step that drafted nothing (plain decoding).
* ``cut``: accepted/emitted by the sampler but dropped because the request stopped (EOS or
  max_new_tokens) inside the step.
"""

from __future__ import annotations

import html
import re
import textwrap
from dataclasses import dataclass
from typing import Any

from specviz.trace import RunMetrics, Step, Trace

FATES = ("accepted", "stop", "rejected", "unused", "recovered", "bonus", "target", "cut")

# (background, text colour, legend label). Colour-blind-safe-ish: blue/orange/green are distinct.
FATE_STYLE: dict[str, tuple[str, str, str]] = {
    "accepted": ("#b7e4c7", "#1b4332", "accepted draft token"),
    # the EOS draft a request stopped at: accepted by the verifier, counted as its step's own token (metrics.counted)
    "stop": ("#d9f99d", "#365314", "accepted draft the request stopped at (its step's own token)"),
    "rejected": ("#f4a6a6", "#7f1d1d", "rejected draft token"),
    "unused": ("#f3f4f6", "#9ca3af", "draft token after the rejection (unused)"),
    "recovered": ("#fcd581", "#7c4a03", "recovered token (from the residual)"),
    "bonus": ("#9ecbff", "#0b3d91", "bonus token (every draft on its row accepted)"),
    "target": ("#dde3ea", "#111827", "target token (no draft this step)"),
    "cut": ("#ffffff", "#9ca3af", "dropped at the stop (EOS / max tokens)"),
}

# px at a figure's top kept free for Plotly's toolbar (drawn at the top right on hover): titles start below it, where
# the toolbar covered the Compare tab's panel titles
MODEBAR_PX = 28


def fate_label(fate: str, trace: Trace | None = None) -> str:
    """The legend label of ``fate``; under greedy verification (temperature 0) the token after a
    rejection is the target's argmax, not a draw from the residual, and under typical acceptance a draw from p itself;
    each is labelled so."""
    if fate == "recovered" and trace is not None and trace.config.get("verify") == "greedy":
        return "recovered token (the target's argmax)"
    if fate == "recovered" and trace is not None and trace.config.get("verify") == "typical":
        return "the step's own token (drawn from p: typical has no residual)"
    return FATE_STYLE[fate][2]


def residual_prob(step: Step) -> float | None:
    """r(y) of a step's recovered token y: its probability in the distribution it was drawn from
    (``emitted.top``); None for other kinds or when y is outside the recorded top entries."""
    if step.emitted.kind != "recovered":
        return None
    return next((float(v) for t, v in step.emitted.top if int(t) == step.emitted.token_id), None)


def as_trace(trace: Trace | dict[str, Any]) -> Trace:
    """A :class:`Trace` from a Trace or its dict (validated by ``Trace.from_dict``).

    Raises:
        specviz.trace.TraceFormatError: the dict is not a well-formed trace.
    """
    return trace if isinstance(trace, Trace) else Trace.from_dict(trace)


def metrics_of(trace: Trace) -> RunMetrics:
    """The trace's :class:`~specviz.trace.RunMetrics`, from its steps (finished, streaming, stopped or uploaded
    alike: a stored ``trace.metrics`` is never read back, so every view counts by the one definition)."""
    return RunMetrics.of(trace)


ONE_HOT_NOTE = ("q (as verified) is the q the target's verification used: 1 for a deterministic draft (an argmax or "
                "a top-k pick), which the verifier treats as one-hot; the draft's probability of x_i when it sampled. "
                "Confidence is the drafter's own probability: how sure it was, not what the test used.")


def verified_q(st: Step, i: int) -> float | None:
    """q_i(x_i) the verifier used at 1-based draft position ``i`` of ``st`` (its recorded position): 1.0 for a
    deterministic draft verified as one-hot (n-gram, suffix, argmax heads and draft model, top-k tree children), the
    draft's probability when it sampled; None where the step kept no per-position record (detailed_trace=False)."""
    return float(st.positions[i - 1].q) if 0 < i <= len(st.positions) else None


def short_prob(x: float | None) -> str:
    """A probability in a box or cell: "0.43", "8e-04" below 0.01, "—" when unknown."""
    if x is None:
        return "—"
    return f"{x:.2f}" if x >= 0.01 or x == 0 else f"{x:.0e}"


def verified_q_cell(q: float | None) -> str:
    """A table cell for :func:`verified_q`: "1 (one-hot)", else :func:`short_prob` (as the chain view's boxes)."""
    return "1 (one-hot)" if q is not None and q >= 1.0 else short_prob(q)


def token_text(trace: Trace, token_id: int) -> str:
    """The decoded piece of ``token_id`` (``<id>`` when the trace has no text for it)."""
    return trace.token_texts.get(str(int(token_id)), f"<{int(token_id)}>")


def visible(piece: str) -> str:
    """A token piece with invisible characters made visible: newline -> ↵, tab -> →,
    leading/trailing spaces -> ␣, runs of more than 3 of them as ␣×n (indentation: "↵␣×7"); an empty
    piece -> ∅. Every view writes tokens this way (grid, stream, tree, residual, lesson, tables)."""
    if piece == "":
        return "∅"
    out = piece.replace("\n", "↵").replace("\t", "→").replace("\r", "␍")
    stripped = out.strip(" ")
    if stripped != out:
        lead = len(out) - len(out.lstrip(" "))
        trail = len(out) - len(out.rstrip(" "))
        out = "␣" * lead + stripped + "␣" * trail if stripped else "␣" * len(out)
    return re.sub(r"␣{4,}", lambda m: f"␣×{len(m.group())}", out)


def label(trace: Trace, token_id: int, width: int = 14) -> str:
    """Short visible label of a token for Plotly text (truncated to ``width`` chars, then
    HTML-escaped: Plotly renders a subset of HTML in titles, ticks and cell texts)."""
    s = visible(token_text(trace, token_id))
    return html.escape(s if len(s) <= width else s[: width - 1] + "…", quote=False)


def quoted(trace: Trace, token_id: int) -> str:
    """A token's text in quotes for Plotly hover texts and titles, on one line: invisible
    characters made visible (:func:`visible`; runs of more than 3 spaces as ␣×n), HTML-escaped."""
    return html.escape(f"‘{visible(token_text(trace, token_id))}’", quote=False)


LONG_TOKEN = 12  # characters: a table's token longer than this may wrap (a shorter one stays whole: no "␣hidde / n")


def token_code(trace: Trace, token_id: Any, style: str = "") -> str:
    """A token for the HTML tables (``<code>``; "—" for None): :func:`visible`'s text, HTML-escaped (a Python
    repr there showed "'\\n '" for a newline and 27 spaces, since HTML collapses the spaces), the raw piece's repr
    on hover."""
    if token_id is None:
        return "—"
    raw = html.escape(repr(token_text(trace, int(token_id))), quote=True)
    css = f" style='{style}'" if style else ""
    text = visible(token_text(trace, int(token_id)))
    long = " class='sv-long'" if len(text) > LONG_TOKEN else ""  # only a long token may break inside (app.css)
    return f"<code title='{raw}'{long}{css}>{html.escape(text, quote=False)}</code>"


def decision_slot(step: Step) -> int:
    """1-based slot of the step's own token: num_accepted + 1 (k'+1 means bonus)."""
    return step.num_accepted + 1


def position_fate(step: Step, i: int) -> str:
    """Fate of draft position ``i`` (1-based, i <= k') of ``step``: accepted, stop (the accepted draft the request
    stopped at, in a step the stop cut: every statistic counts it as the step's own token, not as an accepted draft;
    :func:`specviz.trace.metrics.counted`), cut (accepted, dropped after the stop), rejected or unused."""
    acc, kept = step.num_accepted, len(step.committed_token_ids)
    if i <= acc:
        if i == kept and not step.emitted_committed:
            return "stop"
        return "accepted" if i <= kept else "cut"
    return "rejected" if i == acc + 1 else "unused"


def stopped_in_drafts(trace: Trace) -> bool:
    """Whether the request stopped inside a step's accepted drafts, so that one draft has the fate "stop"
    (:func:`position_fate`); a step without drafts always commits its own token."""
    return any(st.draft_token_ids and not st.emitted_committed for st in trace.steps)


def emitted_fate(step: Step) -> str:
    """Fate of the step's own token: its kind, or ``cut`` if the stop dropped it."""
    if len(step.committed_token_ids) <= step.num_accepted:
        return "cut"
    return step.emitted.kind if step.emitted.kind in FATE_STYLE else "target"


def tokenwise_accepted(step: Step) -> int | None:
    """For a block-verification step: how many draft tokens token-wise (standard) verification
    would have accepted with the same uniforms (eta_i <= min(1, p_i/q_i), stopping at the first
    failure; docs/design/algorithms.md). None for other steps."""
    if not step.block or not step.positions:
        return None
    eta = step.block.get("eta", [])
    for i, pos in enumerate(step.positions):
        if i >= len(eta) or eta[i] > pos.accept_prob:
            return i
    return len(step.positions)


def block_rescued(step: Step) -> int:
    """Draft tokens block verification accepted beyond what token-wise verification would have
    (0 for other steps)."""
    tokenwise = tokenwise_accepted(step)
    return 0 if tokenwise is None else max(step.num_accepted - tokenwise, 0)


def context_before(trace: Trace, step_index: int) -> list[int]:
    """Token ids the proposer saw at step ``step_index``: the prompt + every token committed
    by earlier steps."""
    ids = list(trace.prompt_token_ids)
    for s in trace.steps[:step_index]:
        ids.extend(s.committed_token_ids)
    return ids


@dataclass(frozen=True)
class TokenEvent:
    """One token as the token stream shows it, in reading order.

    fate: see module docstring; step: step index; slot: 1-based position within the step;
    p / q: target / draft probability of the token at that slot (None where unknown);
    u: the uniform drawn for it (None for the step's own token);
    accept_prob: min(1, p/q) (None for the step's own token)."""

    token_id: int
    fate: str
    step: int
    slot: int
    p: float | None = None
    q: float | None = None
    u: float | None = None
    accept_prob: float | None = None
    unused_after: int = 0  # rejected token only: how many later draft tokens were thrown away


def token_events(trace: Trace) -> list[TokenEvent]:
    """Committed tokens plus each step's rejected draft token, in the order they were proposed.

    Per step: the accepted draft tokens, then the rejected draft token (if any, not part of the
    output), then the step's own token (recovered / bonus / target). Tokens the stop dropped
    (``cut``) are left out: the output never contained them."""
    events: list[TokenEvent] = []
    for step in trace.steps:
        committed = step.committed_token_ids
        for i in range(1, min(step.num_accepted, len(committed)) + 1):
            fate = position_fate(step, i)  # "stop" for the EOS draft a cut step ended at
            events.append(TokenEvent(committed[i - 1], fate, step.index, i, *_pqua(_position(step, i))))
        if step.num_accepted < len(step.draft_token_ids):
            pos = _position(step, step.num_accepted + 1)
            tok = step.draft_token_ids[step.num_accepted]
            left = len(step.draft_token_ids) - step.num_accepted - 1
            events.append(TokenEvent(tok, "rejected", step.index, step.num_accepted + 1,
                                     *(_pqua(pos)), unused_after=left))
        if len(committed) > step.num_accepted:
            events.append(TokenEvent(committed[step.num_accepted], emitted_fate(step), step.index,
                                     decision_slot(step), p=step.emitted.p))
    return events


def _position(step: Step, i: int):
    return step.positions[i - 1] if 0 < i <= len(step.positions) else None


def _pqua(pos) -> tuple[float | None, float | None, float | None, float | None]:
    if pos is None:
        return None, None, None, None
    return pos.p, pos.q, pos.u, pos.accept_prob


def fmt_prob(x: float | None) -> str:
    """Probability for hover text: 4 significant digits, '—' when unknown."""
    if x is None:
        return "—"
    return f"{x:.4g}"


def quoted_tokens(trace: Trace, ids: list[int]) -> str:
    """Token ids as quoted texts separated by spaces ("(none)" for no ids), for sentences."""
    return " ".join(quoted(trace, t) for t in ids) or "(none)"


def top_pairs(trace: Trace, pairs: list[list[float]], n: int = 3) -> str:
    """The first ``n`` [token id, probability] pairs as "'tok' 0.42, ..." ("—" for none), for sentences."""
    return ", ".join(f"{quoted(trace, int(t))} {fmt_prob(float(v))}" for t, v in pairs[:n]) or "—"


def nothing_drafted(step_index: int, who: str) -> str:
    """The "where the draft came from" panel of a step at which ``who`` (e.g. "the MTP head") drafted nothing."""
    return (f'<div class="sv-match-empty" style="padding:12px;color:#374151">Step {step_index}: {who} drafted '
            "nothing (no target feature yet, or no room left before max_new_tokens).</div>")


def small_lines(lines: list[str], share: float = 0.85) -> str:
    """``lines`` joined by "<br>", each in a span of ``share`` times its text's font size: a size relative to the
    title's or axis title's own, so it grows with the presentation layout's figure fonts (which leave a px size
    inside a title's text as it is)."""
    return "<br>".join(f"<span style='font-size:{share:g}em'>{w}</span>" for w in lines)


NBSP = "\u00a0"
BOUND_OPERATOR = re.compile(r" +([=<>≤≥~→+−×÷]) +")  # a binary operator holds its two operands on one line


def _bind_calls(text: str) -> str:
    """``text`` with the spaces inside a call's brackets ("max(p−q, 0)", "Uniform(0, 1)": an opening bracket right
    after a word character, closed later) made non-breaking; a bracket after a space opens prose, which may still
    break, and one never closed (a quoted token such as ‘print(’) binds nothing."""
    closes, stack = {}, []  # the index of each "(" -> its ")", for the brackets that close
    for j, ch in enumerate(text):
        if ch == "(":
            stack.append(j)
        elif ch == ")" and stack:
            closes[stack.pop()] = j
    bound = [False] * len(text)
    for j, end in closes.items():
        if j > 0 and (text[j - 1].isalnum() or text[j - 1] in "_)"):
            bound[j:end] = [True] * (end - j)
    return "".join(NBSP if ch == " " and bound[j] else ch for j, ch in enumerate(text))


def wrap_units(text: str, width: int) -> list[str]:
    """``text`` in lines of about ``width`` characters, broken only between units: a formula ("Z = Σ max(p−q, 0) =
    0.35", "u = 0.27 > min(1, p/q)") and a token stay on one line, even when that line runs past ``width``.
    Plotly breaks a text only at "<br>", so the lines come back with ordinary spaces."""
    bound = BOUND_OPERATOR.sub(lambda m: f"{NBSP}{m.group(1)}{NBSP}", _bind_calls(text)).replace("Σ ", "Σ" + NBSP)
    lines = textwrap.wrap(bound, width, break_long_words=False, break_on_hyphens=False)
    return [line.replace(NBSP, " ") for line in lines]
