"""Trace -> every view the app shows, as named tuples (:class:`Views`, :class:`StreamingViews`,
:class:`SelectionViews`): read a view by name (``views.match``) or unpack them in field order
(the layout wires its components in that order).

Pure functions of data: no gradio, no model. The handlers wrap them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from specviz.trace import Trace
from specviz.viz import (
    clamp_selection,
    message_figure,
    residual_figure,
    run_summary,
    speedup_html,
    stats_figure,
    step_grid_figure,
    token_stream_html,
)
from specviz.viz.common import block_rescued, metrics_of
from specviz.viz.stats import rate_set, rates_markdown
from specviz.viz.source import source_figure, source_html, source_note
from specviz.viz.speed import capture_note, graph_notes_html, runner_note



class Views(NamedTuple):
    """Every view of a full redraw (HTML / Markdown strings and Plotly figures). match / trie: the
    method's "where the draft came from" panels (:mod:`specviz.viz.source`)."""

    stream: Any
    summary: Any
    grid: Any
    residual: Any
    match: Any
    trie: Any
    stats: Any
    speedup: Any


class StreamingViews(NamedTuple):
    """What a streamed update of a running request redraws."""

    stream: Any
    summary: Any
    grid: Any
    stats: Any


class SelectionViews(NamedTuple):
    """What a change of the selected step / position redraws."""

    stream: Any
    grid: Any
    residual: Any
    match: Any
    trie: Any


VIEW_NAMES = Views._fields  # outputs of a full redraw, in order


def default_selection(trace: Trace) -> tuple[int, int]:
    """The step/position to show first: the first step with a rejection, else the first step
    with a draft, else step 0; position = that step's decision slot (num_accepted + 1)."""
    steps = trace.steps
    pick = next((s for s in steps if s.num_accepted < len(s.draft_token_ids)), None)
    pick = pick or next((s for s in steps if s.draft_token_ids), None) or (steps[0] if steps else None)
    if pick is None:
        return 0, 1
    return pick.index, pick.num_accepted + 1


LOSSY_NOTES = {  # modes whose output is NOT distributed as the target's (docs/design/algorithms.md 4; Medusa)
    "synthetic": ("**Lossy:** verify = synthetic accepts drafts at the fixed rates a_i given (vLLM's synthetic "
                  "acceptance, for benchmarking), not by comparing p and q: the output is not distributed as the "
                  "target's, and the rates above measure the setting, not the draft."),
    "typical": ("**Lossy:** typical acceptance (Medusa) accepts a draft while p(x) > min(ε, δ·exp(−H(p))): the output "
                "is not distributed as the target's."),
}


def summary_markdown(trace: Trace) -> str:
    """Headline numbers of a (possibly partial) trace as Markdown."""
    if not trace.steps:
        return "_No steps yet._"
    cfg = trace.config
    head = rates_markdown(rate_set(trace))  # the four rates: one headline, the others defined beneath
    rescued = [(st.index, block_rescued(st)) for st in trace.steps if block_rescued(st)]
    if rescued:
        where = ", ".join(f"step {i} (+{n})" for i, n in rescued[:8]) + (" …" if len(rescued) > 8 else "")
        head += (f"\n\n★ Block verification accepted {sum(n for _, n in rescued)} draft token(s) that token-wise "
                 f"verification would have rejected with the same uniforms: {where}. Click a ★ cell in the step "
                 "grid to see why.")
    note = source_note(trace)  # the method's own hint (viz/source.py), e.g. prompt lookup rarely matching
    if note:
        head += "\n\n" + note
    if cfg.get("verify") in LOSSY_NOTES:
        head += "\n\n" + LOSSY_NOTES[cfg["verify"]]
    tail = (f"method `{cfg.get('method')}` · k = {cfg.get('num_speculative_tokens')} · verify `{cfg.get('verify')}` · "
            f"T = {cfg.get('temperature')} · target forwards {metrics_of(trace).target_forward_passes} "
            f"(prefill included) · stop: {trace.stop_reason or 'running'}")
    return head + "\n\n" + tail


def empty_views(message: str = "Press Run, or upload a trace JSON.") -> Views:
    """Placeholders for every view."""
    html = f"<div style='color:#6b7280;padding:12px'>{message}</div>"
    return Views(stream=html, summary="", grid=message_figure(message), residual=message_figure(message), match=html,
                 trie=message_figure(message, 200), stats=message_figure(message), speedup="")


def all_views(trace: Trace, step: int | None, position: int | None,
              baseline: dict[str, Any] | None, no_baseline: str | None = None, streamed: bool = False) -> Views:
    """Every view of ``trace`` at (step, position) (clamped). ``baseline``: the method-none comparison;
    ``no_baseline``: without one, what the speedup panel says instead; ``streamed``: the trace was just streamed
    into the app (its wall time includes the redraws; :func:`~specviz.viz.speed.speedup_html`)."""
    if not trace.steps:
        return empty_views("The run produced no steps.")
    s, i = clamp_selection(trace, step, position)
    stats, speedup = speedup_views(trace, baseline, no_baseline, streamed)
    return Views(stream=token_stream_html(trace, s), summary=summary_markdown(trace),
                 grid=step_grid_figure(trace, s, i), residual=residual_figure(trace, s, i),
                 match=source_html(trace, s, i), trie=source_figure(trace, s), stats=stats, speedup=speedup)


def speedup_views(trace: Trace, baseline: dict[str, Any] | None, no_baseline: str | None = None,
                  streamed: bool = False) -> tuple[Any, str]:
    """(the statistics figure, the speedup panel's HTML) of ``trace`` against ``baseline``: the two views a
    comparison with method none, measured after the run, redraws when it streams in."""
    speedup = (speedup_html(run_summary(trace), baseline, no_baseline, streamed=streamed)
               + capture_note(metrics_of(trace).capture_ms)
               + graph_notes_html(trace.config.get("graph_notes"))
               + runner_note(trace.config.get("runner_compiled"), (baseline or {}).get("measurement")))
    return stats_figure(trace, baseline), speedup


def streaming_views(trace: Trace) -> StreamingViews:
    """The views of a partial trace that a streamed update redraws."""
    if not trace.steps:
        e = empty_views("Running…")
        return StreamingViews(e.stream, e.summary, e.grid, e.stats)
    last = len(trace.steps) - 1
    return StreamingViews(stream=token_stream_html(trace, last), summary=summary_markdown(trace),
                          grid=step_grid_figure(trace, last, None), stats=stats_figure(trace, None))


def selection_views(trace: Trace, step: int | None, position: int | None) -> SelectionViews:
    """The views at the selection (clamped) that a step/position change redraws."""
    if not trace.steps:
        e = empty_views()
        return SelectionViews(e.stream, e.grid, e.residual, e.match, e.trie)
    s, i = clamp_selection(trace, step, position)
    return SelectionViews(stream=token_stream_html(trace, s), grid=step_grid_figure(trace, s, i),
                          residual=residual_figure(trace, s, i), match=source_html(trace, s, i),
                          trie=source_figure(trace, s))
