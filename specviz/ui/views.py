"""Trace -> every view the app shows, in one fixed order (the layout wires outputs in this order).

Pure functions of data: no gradio, no model. The handlers wrap them.
"""

from __future__ import annotations

from typing import Any

from specviz.trace import Trace
from specviz.viz import (
    clamp_selection,
    match_context_html,
    message_figure,
    residual_figure,
    run_summary,
    speedup_html,
    stats_figure,
    step_grid_figure,
    token_stream_html,
    trie_figure,
)
from specviz.viz.common import block_rescued, metrics_of
from specviz.viz.speed import capture_note

# outputs of a full redraw, in order
VIEW_NAMES = ("stream", "summary", "grid", "residual", "match", "trie", "stats", "speedup")


def default_selection(trace: Trace) -> tuple[int, int]:
    """The step/position to show first: the first step with a rejection, else the first step
    with a draft, else step 0; position = that step's decision slot (num_accepted + 1)."""
    steps = trace.steps
    pick = next((s for s in steps if s.num_accepted < len(s.draft_token_ids)), None)
    pick = pick or next((s for s in steps if s.draft_token_ids), None) or (steps[0] if steps else None)
    if pick is None:
        return 0, 1
    return pick.index, pick.num_accepted + 1


def summary_markdown(trace: Trace) -> str:
    """Headline numbers of a (possibly partial) trace as Markdown."""
    if not trace.steps:
        return "_No steps yet._"
    m = metrics_of(trace)
    cfg = trace.config
    if m["num_drafts"]:
        accept = (f"**mean acceptance length {m['mean_acceptance_length']:.2f}** tokens per drafting step · "
                  f"draft acceptance rate {m['draft_acceptance_rate']:.2f} (accepted / drafted tokens)")
    else:  # method none (or no step drafted): there is nothing to accept
        accept = "**mean acceptance length: not applicable (no drafts)** · draft acceptance rate: not applicable"
    head = (f"{accept} · {m['num_generated_tokens']} tokens in "
            f"{m['num_steps']} steps ({m['tokens_per_step']:.2f} tokens per target forward)")
    rescued = [(st.index, block_rescued(st)) for st in trace.steps if block_rescued(st)]
    if rescued:
        where = ", ".join(f"step {i} (+{n})" for i, n in rescued[:8]) + (" …" if len(rescued) > 8 else "")
        head += (f"  \n★ Block verification accepted {sum(n for _, n in rescued)} draft token(s) that token-wise "
                 f"verification would have rejected with the same uniforms: {where}. Click a ★ cell in the step "
                 "grid to see why.")
    drafted = sum(1 for st in trace.steps if st.draft_token_ids)
    if cfg.get("method") in ("ngram", "ngram_gpu") and trace.stop_reason and drafted < 0.3 * len(trace.steps):
        head += (f"  \nPrompt lookup found a match at only {drafted} of {len(trace.steps)} steps: it copies drafts "
                 "from earlier text, so it needs text that repeats itself (a longer prompt, code that reuses its "
                 "names, or a lower prompt_lookup_min).")
    tail = (f"method `{cfg.get('method')}` · k = {cfg.get('num_speculative_tokens')} · verify `{cfg.get('verify')}` · "
            f"T = {cfg.get('temperature')} · target forwards {trace.target_forward_passes or '…'} · "
            f"stop: {trace.stop_reason or 'running'}")
    return head + "  \n" + tail


def empty_views(message: str = "Press Run, or upload a trace JSON.") -> tuple[Any, ...]:
    """Placeholders for every view (same order as VIEW_NAMES)."""
    html = f"<div style='color:#6b7280;padding:12px'>{message}</div>"
    return (html, "", message_figure(message), message_figure(message), html, message_figure(message, 200),
            message_figure(message), "")


def all_views(trace: Trace, step: int | None, position: int | None,
              baseline: dict[str, Any] | None, no_baseline: str | None = None) -> tuple[Any, ...]:
    """Every view of ``trace`` at (step, position) (clamped), in VIEW_NAMES order. ``baseline``:
    the method-none comparison; ``no_baseline``: without one, what the speedup panel says instead."""
    if not trace.steps:
        return empty_views("The run produced no steps.")
    s, i = clamp_selection(trace, step, position)
    return (token_stream_html(trace, s), summary_markdown(trace), step_grid_figure(trace, s, i),
            residual_figure(trace, s, i), match_context_html(trace, s), trie_figure(trace, s),
            stats_figure(trace, baseline),
            speedup_html(run_summary(trace), baseline, no_baseline) + capture_note(metrics_of(trace).get("capture_ms", 0.0)))


def streaming_views(trace: Trace) -> tuple[Any, ...]:
    """(stream, summary, grid, stats) of a partial trace: what a streamed update redraws."""
    if not trace.steps:
        e = empty_views("Running…")
        return e[0], e[1], e[2], e[6]
    last = len(trace.steps) - 1
    return (token_stream_html(trace, last), summary_markdown(trace), step_grid_figure(trace, last, None),
            stats_figure(trace, None))


def selection_views(trace: Trace, step: int | None, position: int | None) -> tuple[Any, ...]:
    """(stream, grid, residual, match, trie) at the selection: what a step/position change redraws."""
    if not trace.steps:
        e = empty_views()
        return e[0], e[2], e[3], e[4], e[5]
    s, i = clamp_selection(trace, step, position)
    return (token_stream_html(trace, s), step_grid_figure(trace, s, i), residual_figure(trace, s, i),
            match_context_html(trace, s), trie_figure(trace, s))
