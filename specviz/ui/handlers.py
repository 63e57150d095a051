"""Event handlers: session state + control values in, views out. The layout wires them up.

Session state (one ``gr.State`` per browser session) is a dict: ``trace`` (the last trace's
dict, or None), ``baseline`` (its method-none comparison, measured beside it by
:func:`specviz.speedup.measure_speedup`, or None), ``no_baseline`` (why there is none, shown in
the speedup panel) and ``suffix_cache`` (this session's
:class:`~specviz.methods.suffix.proposer.GlobalSuffixCache` of earlier outputs for method suffix).
Nothing else is shared between sessions except the lazily loaded models
(:class:`~specviz.ui.cache.DecoderCache`).
User mistakes (bad settings, a bad upload) show a message in the progress line (and a
``gr.Warning`` toast) while every other output is skipped, so the views stay as they were; the
app stays up. Only Export, whose single output is the download list, raises ``gr.Error``.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Generator, Iterator

import gradio as gr

from specviz.methods.suffix.proposer import GlobalSuffixCache
from specviz.speedup import DEFAULT_BUDGET_S, DEFAULT_PAIRS, DEFAULT_SEGMENT_TOKENS, measure_speedup  # noqa: F401
from specviz.trace import MAX_TRACE_BYTES, Trace, TraceFormatError
from specviz.viz import figure_png, figures, report_html, run_summary

from .cache import DecoderCache, StopSignals, device_in_use
from .settings import (
    MAX_UI_NEW_TOKENS,
    MAX_UI_PAIRS,
    MAX_UI_SPECULATIVE_TOKENS,
    check_k,
    check_prompt,
    check_slider_bounds,
    clamped_k_note,
    engine_settings,
    ignored_tree_note,
    tree_depth_note,
    tree_settings,
)
from .views import all_views, default_selection, empty_views, selection_views, streaming_views
from .worker import BackgroundRun

UPDATES_PER_SECOND = 4  # streaming redraws at most this often
NO_COMPARE = ("Not compared with method none: tick “compare with method none” (advanced settings) and run to "
              "measure the speedup beside the run.")
STOPPED = ("This run was stopped, so its comparison with method none was not made (it is measured beside a run "
           "after the run ends, never taken from an earlier run). Run it to the end to measure the speedup.")
IS_NONE = "This run is method none itself: plain decoding, the baseline the other methods are compared with."
REPLAYED = "This uploaded trace carries no comparison with method none."


def new_state() -> dict[str, Any]:
    """A fresh session state (gr.State deep-copies it per session: each gets its own suffix cache)."""
    return {"trace": None, "baseline": None, "no_baseline": None, "suffix_cache": GlobalSuffixCache()}


def _suffix_cache(state: dict[str, Any]) -> GlobalSuffixCache:
    """The session's suffix cache (created if the state predates it)."""
    if not isinstance(state.get("suffix_cache"), GlobalSuffixCache):
        state["suffix_cache"] = GlobalSuffixCache()
    return state["suffix_cache"]


def _trace_of(state: dict[str, Any] | None) -> Trace | None:
    data = (state or {}).get("trace")
    return Trace.from_dict(data) if data else None


def _sliders(trace: Trace, step: int, position: int) -> tuple[Any, Any]:
    n = len(trace.steps)
    k = len(trace.steps[step].draft_token_ids) if n else 0
    return (gr.Slider(minimum=0, maximum=max(n - 1, 1), value=step, step=1, interactive=n > 1),
            gr.Slider(minimum=1, maximum=max(k + 1, 2), value=position, step=1, interactive=k > 0))


STALE_NOTE = "the views below are unchanged (from before this click)"
# the progress line's first words after Run, before the first step is drawn: the run handler's first update, before
# any model work (not set by a js listener on the click: a click Gradio drops while the previous run's events finish
# would leave "starting" on screen with no run behind it)
STARTING = ("**starting** · the prompt's prefill and the first step; the run's views are drawn from step 1 on (the "
            "views below are the previous run's until then)…")
LOADING = "**loading** · the models load and warm up once (on a GPU: CUDA-graph capture, tens of seconds)…"


def _message_outputs(message: str, state: dict[str, Any] | None = None, note: str = STALE_NOTE) -> tuple[Any, ...]:
    """Outputs of run / stop / replay that show ``message`` in the progress line (and as a toast)
    and leave every view, both sliders and (unless given) the session state as they are. ``note``
    (appended to the progress line) says what the views show, so nobody mistakes them for a result."""
    gr.Warning(message)
    return (f"**error** · {md_text(message)} · _{note}_", *([gr.skip()] * 10), gr.skip() if state is None else state)


def md_text(message: str) -> str:
    """``message`` for a Markdown line: HTML escaped, so an error quoting Python's "(<unknown>, line 1)" is shown,
    not taken for a tag that swallows the rest of the line."""
    return html.escape(str(message), quote=False)


def _full_outputs(progress: str, trace: Trace, state: dict[str, Any]) -> tuple[Any, ...]:
    s, i = default_selection(trace)
    return (progress, *all_views(trace, s, i, state.get("baseline"), state.get("no_baseline"),
                                 bool(state.get("streamed"))),
            *_sliders(trace, s, i), state)


def _num_tokens(trace: Trace) -> int:
    return sum(len(s.committed_token_ids) for s in trace.steps)


def _progress(trace: Trace, max_new: int, t0: float) -> str:
    elapsed = time.perf_counter() - t0
    return f"**running** · step {len(trace.steps)}, {_num_tokens(trace)}/{max_new} tokens, {elapsed:.1f} s"


def _is_oom(exc: BaseException) -> bool:
    try:
        import torch

        return isinstance(exc, torch.cuda.OutOfMemoryError)
    except (ImportError, AttributeError):
        return type(exc).__name__ == "OutOfMemoryError"


def _free_gpu() -> None:
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def _stream(decoder: Any, prompt: str, settings: dict[str, Any], state: dict[str, Any],
            stop_flag: threading.Event) -> Iterator[tuple[Any, ...]]:
    """Decode one request on a background thread, yielding views at most UPDATES_PER_SECOND
    times a second; leaves the final trace in ``state``. ``stop_flag`` set -> the run ends after
    its current step (stop_reason "stopped"); so does abandoning this generator (a cancelled
    event). Raises gr.Error for settings the engine refuses and for a GPU out of memory."""
    t0, shown, first = time.perf_counter(), -1, True
    run = BackgroundRun(decoder, prompt, settings, stop_flag)
    try:
        while not run.finished.wait(1.0 / UPDATES_PER_SECOND):
            snap = run.snapshot()
            if snap is None or len(snap.steps) == shown:
                continue
            shown = len(snap.steps)
            state["trace"] = snap.to_dict()
            yield _streaming_outputs(snap, _progress(snap, settings["max_new_tokens"], t0), state, first)
            first = False
    finally:
        if not run.finished.is_set():  # the event was cancelled or closed: end the decode too
            stop_flag.set()
    _raise_for(run.error)
    state["trace"] = run.result().to_dict()


def _raise_for(error: BaseException | None) -> None:
    """Turn a run's exception into a message for the user (or re-raise an unexpected one)."""
    if error is None:
        return
    if isinstance(error, ValueError):  # settings / prompt the engine refuses
        raise gr.Error(str(error)) from None
    if _is_oom(error):
        _free_gpu()
        raise gr.Error("the GPU ran out of memory: lower max_new_tokens or num_speculative_tokens, "
                       "or use a smaller model; the app is still running") from None
    raise error


def _streaming_outputs(trace: Trace, progress: str, state: dict[str, Any], clear: bool) -> tuple[Any, ...]:
    """Views redrawn while a run streams (stream, summary, grid, stats). ``clear``: the first
    update also replaces the detail views of the previous run by a placeholder."""
    stream, summary, grid, stats = streaming_views(trace)
    wait = empty_views("Running: this view is drawn when the run ends (or when you press Stop).")
    residual, match, trie, speedup = (wait.residual, wait.match, wait.trie, wait.speedup) if clear else (gr.skip(),) * 4
    return (progress, stream, summary, grid, residual, match, trie, stats, speedup, gr.skip(), gr.skip(), state)


def run(cache: DecoderCache, signals: StopSignals, state: dict[str, Any] | None, prompt: str, method: str,
        num_speculative_tokens: Any, verify: str, temperature: Any, top_k: Any, top_p: Any, max_new_tokens: Any,
        seed: Any, prompt_lookup_min: Any, prompt_lookup_max: Any, synthetic_rates: str, compare: bool,
        pairs: Any = DEFAULT_PAIRS, eagle_tree: str = "", tree_branches: Any = 0, static_tree: str = "",
        request: gr.Request = None, k_typed: Any = "") -> Iterator[tuple[Any, ...]]:
    """The Run button: stream the request's views, then (if ``compare``) measure the speedup over
    method "none" beside the run (``pairs`` interleaved pairs of short segments), then draw
    everything. ``k_typed``: what was last typed into the k slider's box ("" after a drag; the
    page's script fills it): typed outside 1..12, the browser has clamped it, and every progress
    line of the run says so (:func:`~specviz.ui.settings.clamped_k_note`).
    Bad input, a load failure or a refused run ends with the message in the progress
    line (never raises gr.Error): before any update the other outputs are skipped; after one (an
    error mid-run, e.g. the GPU out of memory) the session's previous trace is drawn again and
    stays in the state, so it can still be exported."""
    streamed = False
    notes = [n for n in (clamped_k_note(num_speculative_tokens, k_typed),
                         tree_depth_note(method, num_speculative_tokens, eagle_tree, static_tree),
                         ignored_tree_note(method, eagle_tree, tree_branches, static_tree)) if n]
    note = "; ".join(notes)
    if note:
        gr.Warning(note)
    try:
        for out in _run(cache, signals, state, prompt, method, num_speculative_tokens, verify, temperature, top_k,
                        top_p, max_new_tokens, seed, prompt_lookup_min, prompt_lookup_max, synthetic_rates, compare,
                        pairs, request, eagle_tree, tree_branches, static_tree):
            streamed = streamed or isinstance(out[-1], dict)  # an update that changed the session's trace
            yield (f"{out[0]} · **{note}**", *out[1:]) if note and isinstance(out[0], str) else out
    except gr.Error as exc:
        previous = dict(state or new_state())
        old = _trace_of(previous)
        if not streamed or old is None:
            yield _message_outputs(exc.message, previous if streamed else None)
            return
        gr.Warning(exc.message)
        yield _full_outputs(f"**error** · {md_text(exc.message)} · _the views below show your previous run (the session "
                            "keeps it: Export still saves it)_", old, previous)


def _run(cache: DecoderCache, signals: StopSignals, state: dict[str, Any] | None, prompt: str, method: str,
         num_speculative_tokens: Any, verify: str, temperature: Any, top_k: Any, top_p: Any, max_new_tokens: Any,
         seed: Any, prompt_lookup_min: Any, prompt_lookup_max: Any, synthetic_rates: str, compare: bool,
         pairs: Any = DEFAULT_PAIRS, request: gr.Request = None, eagle_tree: str = "",
         tree_branches: Any = 0, static_tree: str = "") -> Iterator[tuple[Any, ...]]:
    """:func:`run`'s body; raises gr.Error for the user's mistakes."""
    state = dict(state or new_state())
    try:
        check_k(num_speculative_tokens)
        check_slider_bounds(max_new_tokens, 1, MAX_UI_NEW_TOKENS)
        check_slider_bounds(pairs, 1, MAX_UI_PAIRS)
        text = check_prompt(prompt)
        settings = engine_settings(method, num_speculative_tokens, verify, temperature, top_k, top_p,
                                   max_new_tokens, seed, prompt_lookup_min, prompt_lookup_max, synthetic_rates)
        settings.update(tree_settings(method, eagle_tree, tree_branches, static_tree))
    except ValueError as exc:
        raise gr.Error(str(exc)) from None
    session = _session(request)
    flag = signals.start(session)  # Stop works from here on, also while the models load
    try:
        decoder, extra = yield from _load_and_stream(cache, text, method, settings, compare, state, flag)
    finally:
        signals.finish(session, flag)
    trace = Trace.from_dict(state["trace"])
    if trace.stop_reason == "stopped":
        yield _full_outputs(f"**stopped** · after {len(trace.steps)} steps, {_num_tokens(trace)} tokens", trace, state)
        return
    state["no_baseline"] = IS_NONE if method == "none" else NO_COMPARE
    if compare and method != "none":
        yield from _measure(decoder, text, settings, extra, int(float(pairs)), state)
    done = (f"**done** · {len(trace.output_token_ids)} tokens in {len(trace.steps)} steps, {trace.wall_time_s:.1f} s "
            f"(stop: {trace.stop_reason})")
    yield _full_outputs(done, trace, state)


def _load_and_stream(cache: DecoderCache, text: str, method: str, settings: dict[str, Any], compare: bool,
                     state: dict[str, Any], flag: threading.Event) -> Generator[tuple[Any, ...], None, tuple[Any, dict]]:
    """Load the models (once; a progress line meanwhile), then stream the run into ``state``.
    Returns (the decoder, the extra ``generate`` keywords for the measurement)."""
    # at once, before any model work: the previous run's "done · …" (or "Ready: …") must not stay on screen
    yield (LOADING if not cache.loaded() else STARTING, *([gr.skip()] * 10), gr.skip())
    try:
        decoder = cache.get()
    except ValueError as exc:
        raise gr.Error(str(exc)) from None
    extra: dict[str, Any] = {}
    if method == "suffix":  # the session's own tree; the measurement drafts from a frozen copy of it
        extra = {"suffix_cache": _suffix_cache(state).snapshot()}
        settings = dict(settings, suffix_cache=_suffix_cache(state))
    # what the speedup panel says if the run does not end normally (Stop)
    state.update(baseline=None, no_baseline=IS_NONE if method == "none" else (STOPPED if compare else NO_COMPARE),
                 streamed=True)  # the trace in state is this live run's (its wall time includes the app's redraws)
    yield from _stream(decoder, text, settings, state, flag)
    return decoder, extra


def _measure(decoder: Any, text: str, settings: dict[str, Any], extra: dict[str, Any], pairs: int,
             state: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
    """Measure the speedup beside the run into ``state["baseline"]`` (a progress line first); if
    the measurement fails, ``state["no_baseline"]`` says why and the run's own views stay."""
    seg = min(settings["max_new_tokens"], DEFAULT_SEGMENT_TOKENS)
    yield (f"**comparing** · the run finished; now timing {pairs} pair(s) of {seg}-token segments against method none, "
           "interleaved…", *([gr.skip()] * 10), state)
    run_settings = {k: v for k, v in settings.items() if k != "suffix_cache"}
    try:
        state["baseline"] = measure_speedup(decoder, text, run_settings, pairs=pairs, **extra)
        state["no_baseline"] = None
    except Exception as exc:  # the run itself succeeded: keep it, and say why there is no comparison
        if _is_oom(exc):
            _free_gpu()
        state["no_baseline"] = f"The comparison with method none failed: {exc}"


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "default"


def stop(signals: StopSignals, state: dict[str, Any] | None, request: gr.Request = None) -> tuple[Any, ...]:
    """The Stop button: end this session's run after its current step (the browser also cancels
    the run event) and draw the partial trace kept in state."""
    running = signals.stop(_session(request))
    trace = _trace_of(state)
    # a cancelled run may have unregistered already; its trace in state is then still partial
    if trace is None and running:  # still loading, or before its first step
        return ("**stopping** · the run ends after its first step", *([gr.skip()] * 10), state or new_state())
    if trace is None or (not running and trace.stop_reason):
        return ("Nothing is running.", *([gr.skip()] * 10), state or new_state())
    if not trace.stop_reason:
        trace.stop_reason = "stopped"
        # a partial snapshot has no output list yet: the committed tokens so far (replay checks this)
        trace.output_token_ids = [t for st in trace.steps for t in st.committed_token_ids]
        state = dict(state, trace=trace.to_dict(), baseline=None)  # no_baseline: set by the run for this case
    return _full_outputs(f"**stopped** · after {len(trace.steps)} steps, {_num_tokens(trace)} tokens", trace, state)


def select_step(state: dict[str, Any] | None, step: Any) -> tuple[Any, ...]:
    """The step slider: move the position to the step's decision slot and redraw the selection
    views. A step out of range (typed into the slider's box) is clamped, and the step slider is
    set to the clamped value (last output; gr.skip() when the value was in range)."""
    trace = _trace_of(state)
    if trace is None or not trace.steps:
        return (gr.skip(), *selection_views(Trace(config={}, prompt_token_ids=[]), None, None), gr.skip())
    asked = _number(step, 0)
    s = min(max(int(asked), 0), len(trace.steps) - 1)
    i = trace.steps[s].num_accepted + 1
    fix = gr.skip() if s == asked else _sliders(trace, s, i)[0]
    return (_sliders(trace, s, i)[1], *selection_views(trace, s, i), fix)


def _number(value: Any, default: int) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return default
    return f if f == f and abs(f) != float("inf") else default


def select_position(state: dict[str, Any] | None, step: Any, position: Any) -> tuple[Any, ...]:
    """The position slider: redraw the selection views (step and position clamped to the trace)."""
    trace = _trace_of(state) or Trace(config={}, prompt_token_ids=[])
    return selection_views(trace, int(_number(step, 0)), int(_number(position, 1)))


def select_cell(state: dict[str, Any] | None, cell: Any) -> tuple[Any, ...]:
    """A click on a step-grid cell, sent by the page's script as "row,column[,nonce]": select
    that step and position (:func:`specviz.viz.grid.cell_selection`), move both sliders there
    and redraw the selection views. Anything unreadable changes nothing."""
    from specviz.viz.grid import cell_selection

    trace = _trace_of(state)
    parts = str(cell or "").split(",")
    if trace is None or not trace.steps or len(parts) < 2:
        return (gr.skip(),) * 7
    s, i = cell_selection(trace, int(_number(parts[0], 0)), int(_number(parts[1], 0)))
    step_slider, position_slider = _sliders(trace, s, i)
    return (step_slider, position_slider, *selection_views(trace, s, i))


def check_consistency(trace: Trace) -> None:
    """Refuse a trace whose parts disagree (``Trace.from_json`` checks only the types): step
    indices 0..n-1; per step, one position per draft token and num_accepted within the draft;
    output_token_ids equal to every step's committed tokens in order.
    Raises:
        TraceFormatError: what disagrees, with the step where it does.
    """
    for n, st in enumerate(trace.steps):
        where = f"steps[{n}]"
        if st.index != n:
            raise TraceFormatError(f"{where}.index is {st.index}; steps must be numbered 0, 1, 2, … in order")
        k = len(st.draft_token_ids)
        if len(st.positions) != k:
            raise TraceFormatError(f"{where} has {len(st.positions)} positions for {k} draft tokens")
        if not 0 <= st.num_accepted <= k:
            raise TraceFormatError(f"{where}.num_accepted is {st.num_accepted}; it must be between 0 and the "
                                   f"{k} draft tokens")
    committed = [t for st in trace.steps for t in st.committed_token_ids]
    if trace.output_token_ids != committed:
        raise TraceFormatError(f"output_token_ids has {len(trace.output_token_ids)} tokens but the steps commit "
                               f"{len(committed)} (or different ones): the trace is inconsistent")


BASELINE_KEY = "baseline_none"  # trace.metrics key of an exported run's method-none comparison
_SUMMARY_NUMBERS = ("tokens", "steps", "target_forward_passes", "tokens_per_forward", "decode_s",
                    "decode_tokens_per_second", "wall_time_s", "tokens_per_second")


def check_baseline(summary: Any) -> dict[str, Any] | None:
    """The method-none run summary stored in an uploaded trace (None if absent), checked as data:
    finite numbers >= 0 for every field the speedup table reads, time_ms a dict of such numbers.
    Raises:
        TraceFormatError: present but malformed."""
    if summary is None:
        return None
    where = f"metrics.{BASELINE_KEY}"
    if not isinstance(summary, dict):
        raise TraceFormatError(f"{where} must be an object (a method-none run summary)")

    def ok(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and 0 <= v < float("inf")

    bad = [k for k in _SUMMARY_NUMBERS if not ok(summary.get(k))]
    times = summary.get("time_ms")
    if not isinstance(times, dict) or not all(isinstance(k, str) and ok(v) for k, v in times.items()):
        bad.append("time_ms")
    if bad:
        raise TraceFormatError(f"{where} has missing or invalid fields: {', '.join(bad)}")
    out = {**{k: summary[k] for k in _SUMMARY_NUMBERS}, "time_ms": dict(times), "method": "none"}
    if summary.get("measurement") is not None:
        out["measurement"] = _check_measurement(summary["measurement"], f"{where}.measurement", ok)
    return out


def _check_measurement(m: Any, where: str, ok) -> dict[str, Any]:
    """The side-by-side measurement of an uploaded comparison (:func:`specviz.speedup.measure_speedup`)."""
    if not isinstance(m, dict):
        raise TraceFormatError(f"{where} must be an object")
    bad = [k for k in ("median", "low", "high", "cost_s") if not ok(m.get(k))]
    bad += [k for k in ("pairs", "segment_tokens", "n") if not (isinstance(m.get(k), int) and ok(m.get(k)))]
    ratios = m.get("ratios")
    if not isinstance(ratios, list) or not all(ok(r) for r in ratios) or len(ratios) != m.get("n"):
        bad.append("ratios")
    if not isinstance(m.get("noisy"), bool):
        bad.append("noisy")
    if bad:
        raise TraceFormatError(f"{where} has missing or invalid fields: {', '.join(bad)}")
    method = check_baseline({**m.get("method_summary", {}), "method": "none"}) if isinstance(
        m.get("method_summary"), dict) else None
    if method is None:
        raise TraceFormatError(f"{where}.method_summary must be an object (the method's segments pooled)")
    method.pop("method")
    return {**{k: m[k] for k in ("median", "low", "high", "cost_s", "pairs", "segment_tokens", "n", "noisy")},
            "ratios": list(ratios), "method_summary": method}


def replay(state: dict[str, Any] | None, path: str | None) -> tuple[Any, ...]:
    """Upload: read a trace JSON (size-capped, validated as data and for consistency, never
    executed) and draw it. A refused file leaves the views as they were, with the reason in the
    progress line."""
    state = dict(state or new_state())
    if not path:
        return _message_outputs("no file received")
    size = os.path.getsize(path)
    if size > MAX_TRACE_BYTES:
        return _message_outputs(f"the file is {size / 2**20:.1f} MB; traces up to {MAX_TRACE_BYTES // 2**20} MB "
                                "are accepted")
    try:
        trace = Trace.from_json(Path(path).read_bytes())
        check_consistency(trace)
        baseline = check_baseline(trace.metrics.pop(BASELINE_KEY, None))
    except TraceFormatError as exc:
        return _message_outputs(f"this is not a specviz trace: {exc}")
    state.update(trace=trace.to_dict(), baseline=baseline, replayed=True, streamed=False,
                 no_baseline=IS_NONE if trace.config.get("method") == "none" else REPLAYED)
    cfg = trace.config
    return _full_outputs(f"**replay** · an uploaded trace: method {cfg.get('method')}, {len(trace.steps)} steps, "
                         f"{len(trace.output_token_ids)} tokens (no model needed)", trace, state)


REPLAY_FIELDS = ("prompt", "method", "num_speculative_tokens", "verify", "temperature", "top_k", "top_p",
                 "max_new_tokens", "seed", "prompt_lookup_min", "prompt_lookup_max", "example")


def replay_settings(state: dict[str, Any] | None) -> tuple[Any, ...]:
    """After a successful replay: the trace's prompt and settings for the controls, in
    ``REPLAY_FIELDS`` order, then the session state, so that Run repeats the request live. A
    setting the controls cannot show (an unknown method, k above the slider's cap, a
    model-specific value) is left as it was (gr.skip()); after a refused upload nothing changes."""
    from specviz.engine import METHODS, VERIFY_METHODS

    if not (state or {}).get("replayed"):
        return (gr.skip(),) * (len(REPLAY_FIELDS) + 1)
    state = {**state, "replayed": False}
    trace = _trace_of(state)
    cfg = trace.config

    def num(name: str, lo: float, hi: float, cast=float) -> Any:
        value = cfg.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
            return gr.skip()
        return cast(value)

    method = cfg.get("method")
    verify = cfg.get("verify")
    return (
        trace.prompt_text or gr.skip(),
        method if method in METHODS else gr.skip(),
        num("num_speculative_tokens", 1, MAX_UI_SPECULATIVE_TOKENS, int),
        verify if verify in VERIFY_METHODS else gr.skip(),
        num("temperature", 0, 100),
        0 if cfg.get("top_k") is None else num("top_k", 0, 10**7, int),
        1.0 if cfg.get("top_p") is None else num("top_p", 0.01, 1.0),
        num("max_new_tokens", 1, MAX_UI_NEW_TOKENS, int),
        num("seed", 0, 2**31 - 1, int),
        num("prompt_lookup_min", 1, 8, int),
        num("prompt_lookup_max", 1, 8, int),
        None,  # the example dropdown: the controls now hold the trace's settings, not an example's
        state,
    )


def export(state: dict[str, Any] | None, step: Any, position: Any) -> list[str]:
    """Files to download: trace.json, report.html (every view, opens offline) and, when kaleido
    is installed, one PNG per figure. Raises gr.Error when there is no trace yet."""
    trace = _trace_of(state)
    if trace is None or not trace.steps:
        raise gr.Error("nothing to export yet: run a request or upload a trace first")
    out = Path(tempfile.mkdtemp(prefix="specviz-export-"))
    base = (state or {}).get("baseline")
    stem = export_stem(trace, time.gmtime())
    saved = Trace.from_dict(trace.to_dict())
    if base:  # the method-none run it was compared with travels with it (replay shows the speedup again)
        saved.metrics = {**saved.metrics, BASELINE_KEY: base}
    (out / f"{stem}.trace.json").write_text(saved.to_json(), encoding="utf-8")
    (out / f"{stem}.report.html").write_text(report_html(trace, int(step or 0), int(position or 1), base),
                                             encoding="utf-8")
    files = [str(out / f"{stem}.trace.json"), str(out / f"{stem}.report.html")]
    for name, fig in figures(trace, int(step or 0), int(position or 1), base).items():
        png = figure_png(fig)
        if png is not None:
            (out / f"{stem}.{name}.png").write_bytes(png)
            files.append(str(out / f"{stem}.{name}.png"))
    return files


def export_stem(trace: Trace, when: time.struct_time | None = None) -> str:
    """File name stem of an export, e.g. ``specviz-draft_model-k4-block-T0.8-seed0-p3f9a1c-20261201T101500Z``:
    the settings, a short hash of the prompt (p + 6 hex digits of its SHA-256) and the export time
    (UTC, ``when``; default now), so that the downloads of runs being compared (other settings,
    another prompt, or the same one again) do not overwrite each other."""
    cfg = trace.config
    prompt = trace.prompt_text or " ".join(map(str, trace.prompt_token_ids))
    digest = hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:6]
    parts = [str(cfg.get("method", "run")), f"k{cfg.get('num_speculative_tokens', '')}", str(cfg.get("verify", "")),
             f"T{cfg.get('temperature', '')}", f"seed{cfg.get('seed', '')}", f"p{digest}",
             time.strftime("%Y%m%dT%H%M%SZ", when or time.gmtime())]
    return "specviz-" + "-".join(re.sub(r"[^A-Za-z0-9_.]+", "", p) for p in parts if p)


def load_examples(path: str | Path) -> list[dict[str, Any]]:
    """Example prompts from a JSON file {"examples": [{"name", "prompt", "settings"}]} (missing -> [])."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return []
    return [e for e in data.get("examples", []) if isinstance(e, dict) and "name" in e and "prompt" in e]


EXAMPLE_FIELDS = ("method", "num_speculative_tokens", "verify", "temperature", "max_new_tokens",
                  "prompt_lookup_min", "prompt_lookup_max")


def load_example(examples: list[dict[str, Any]], name: str) -> tuple[Any, ...]:
    """The example's prompt and settings (gr.skip() for settings it leaves unset). No choice
    (the dropdown closed without a pick: None or "") or an unknown name changes nothing."""
    ex = next((e for e in examples if e["name"] == name), None) if name else None
    if ex is None:
        if name:
            gr.Warning(f"unknown example {name!r}")
        return (gr.skip(),) * (1 + len(EXAMPLE_FIELDS))
    st = ex.get("settings", {})
    return (ex["prompt"], *(st[f] if f in st else gr.skip() for f in EXAMPLE_FIELDS))


class SessionHandlers:
    """The app's model cache and stop signals bound to the handlers that need them.

    Bound methods rather than ``functools.partial``: Gradio reads the ``gr.Request`` annotation
    from the signature's type hints (which a partial does not expose) to pass the caller's
    session, and Stop must reach only that session's run.
    """

    def __init__(self, cache: DecoderCache, signals: StopSignals):
        self.cache, self.signals = cache, signals

    def run(self, state: dict[str, Any] | None, prompt: str, method: str, num_speculative_tokens: Any, verify: str,
            temperature: Any, top_k: Any, top_p: Any, max_new_tokens: Any, seed: Any, prompt_lookup_min: Any,
            prompt_lookup_max: Any, synthetic_rates: str, compare: bool, pairs: Any = DEFAULT_PAIRS,
            eagle_tree: str = "", tree_branches: Any = 0, static_tree: str = "", k_typed: str = "",
            request: gr.Request = None) -> Iterator[tuple[Any, ...]]:
        """See :func:`run`."""
        yield from run(self.cache, self.signals, state, prompt, method, num_speculative_tokens, verify, temperature,
                       top_k, top_p, max_new_tokens, seed, prompt_lookup_min, prompt_lookup_max, synthetic_rates,
                       compare, pairs, eagle_tree, tree_branches, static_tree, request, k_typed)

    def stop(self, state: dict[str, Any] | None, request: gr.Request = None) -> tuple[Any, ...]:
        """See :func:`stop`."""
        return stop(self.signals, state, request)

    def warm_up_status(self) -> tuple[str, Any]:
        """The line under the header while the models load and warm up (polled by a timer, which
        this turns off once nothing is happening), and the warm-up's cost once done."""
        if self.cache.status:
            cuda = device_in_use(self.cache.device).startswith("cuda")
            work = "CUDA-graph capture, kernel compilation" if cuda else "the first requests' set-up"
            return (f"**warming up** · {self.cache.status.removeprefix('warm-up: ')} · one-time work ({work}) "
                    "done now so that no run pays for it; a Run pressed meanwhile waits for it", gr.Timer(active=True))
        r = self.cache.warm_up_report
        done = (f"warmed up in {r['seconds']:.1f} s ({int(r['graphs'])} CUDA graphs captured, {r['capture_s']:.1f} s)"
                if r and r.get("graphs") else (f"warmed up in {r['seconds']:.1f} s" if r else ""))
        return done, gr.Timer(active=False)


def suffix_status(state: dict[str, Any] | None) -> str:
    """The line beside "Reset suffix cache": how many earlier outputs this session's tree holds."""
    n = len(state["suffix_cache"]) if isinstance((state or {}).get("suffix_cache"), GlobalSuffixCache) else 0
    return (f"Method suffix drafts from this request and from this session's earlier outputs: the tree holds **{n}** "
            f"earlier output{'s' if n != 1 else ''} (other browser sessions have their own).")


def suffix_row(method: str) -> Any:
    """The suffix cache's line and its reset button show only while method suffix is chosen (they are about it alone)."""
    return gr.Row(visible=method == "suffix")


def reset_suffix(state: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """The "Reset suffix cache" button: forget this session's earlier outputs (a known start for a comparison)."""
    state = dict(state or new_state())
    _suffix_cache(state).clear()
    return suffix_status(state), state


def source_texts(state: dict[str, Any] | None) -> tuple[str, str]:
    """Section 3's heading and text, named for the method of the session's trace (the generic ones
    before any run): :func:`specviz.viz.explain.source_heading` / ``source_explain``."""
    from specviz.viz import explain

    trace = (state or {}).get("trace") or {}
    method = str((trace.get("config") or {}).get("method") or "") or None
    return explain.source_heading(method), explain.source_explain(method)
