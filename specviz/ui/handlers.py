"""Event handlers: session state + control values in, views out. The layout wires them up.

Session state (one ``gr.State`` per browser session) is a dict: ``trace`` (the last trace's
dict, or None), ``baselines`` ({baseline_key: run_summary} of method "none" runs) and
``baseline`` (the summary matching the current trace, or None). Nothing else is shared between
sessions except the lazily loaded models (:class:`~specviz.ui.cache.DecoderCache`).
User mistakes (bad settings, a bad upload) show a message in the progress line (and a
``gr.Warning`` toast) while every other output is skipped, so the views stay as they were; the
app stays up. Only Export, whose single output is the download list, raises ``gr.Error``.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import gradio as gr

from specviz.trace import MAX_TRACE_BYTES, Trace, TraceFormatError
from specviz.viz import figure_png, figures, report_html, run_summary

from .cache import DecoderCache, StopSignals
from .settings import (
    MAX_UI_NEW_TOKENS,
    MAX_UI_SPECULATIVE_TOKENS,
    baseline_key,
    baseline_settings,
    check_prompt,
    check_slider_bounds,
    engine_settings,
)
from .views import all_views, default_selection, empty_views, selection_views, streaming_views
from .worker import BackgroundRun

UPDATES_PER_SECOND = 4  # streaming redraws at most this often
MAX_BASELINES = 8  # per session


def new_state() -> dict[str, Any]:
    """A fresh session state."""
    return {"trace": None, "baselines": {}, "baseline": None}


def _trace_of(state: dict[str, Any] | None) -> Trace | None:
    data = (state or {}).get("trace")
    return Trace.from_dict(data) if data else None


def _sliders(trace: Trace, step: int, position: int) -> tuple[Any, Any]:
    n = len(trace.steps)
    k = len(trace.steps[step].draft_token_ids) if n else 0
    return (gr.Slider(minimum=0, maximum=max(n - 1, 1), value=step, step=1, interactive=n > 1),
            gr.Slider(minimum=1, maximum=max(k + 1, 2), value=position, step=1, interactive=k > 0))


STALE_NOTE = "the views below are unchanged (from before this click)"


def _message_outputs(message: str, state: dict[str, Any] | None = None, note: str = STALE_NOTE) -> tuple[Any, ...]:
    """Outputs of run / stop / replay that show ``message`` in the progress line (and as a toast)
    and leave every view, both sliders and (unless given) the session state as they are. ``note``
    (appended to the progress line) says what the views show, so nobody mistakes them for a result."""
    gr.Warning(message)
    return (f"**error** · {message} · _{note}_", *([gr.skip()] * 10), gr.skip() if state is None else state)


def _full_outputs(progress: str, trace: Trace, state: dict[str, Any]) -> tuple[Any, ...]:
    s, i = default_selection(trace)
    return (progress, *all_views(trace, s, i, state.get("baseline")), *_sliders(trace, s, i), state)


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
        request: gr.Request = None) -> Iterator[tuple[Any, ...]]:
    """The Run button: stream the request's views, then (if ``compare``) run or reuse the
    method "none" baseline, then draw everything. Bad input, a load failure or a refused run ends
    with the message in the progress line and the other outputs skipped (never raises gr.Error)."""
    last = None
    try:
        for last in _run(cache, signals, state, prompt, method, num_speculative_tokens, verify, temperature, top_k,
                         top_p, max_new_tokens, seed, prompt_lookup_min, prompt_lookup_max, synthetic_rates, compare,
                         request):
            yield last
    except gr.Error as exc:
        # the views keep what they show; the state keeps the last trace drawn (if any update was)
        yield _message_outputs(exc.message, None if last is None else last[-1],
                               STALE_NOTE if last is None else "the views below show this run up to the error")


def _run(cache: DecoderCache, signals: StopSignals, state: dict[str, Any] | None, prompt: str, method: str,
         num_speculative_tokens: Any, verify: str, temperature: Any, top_k: Any, top_p: Any, max_new_tokens: Any,
         seed: Any, prompt_lookup_min: Any, prompt_lookup_max: Any, synthetic_rates: str, compare: bool,
         request: gr.Request = None) -> Iterator[tuple[Any, ...]]:
    """:func:`run`'s body; raises gr.Error for the user's mistakes."""
    state = dict(state or new_state(), baselines=dict((state or {}).get("baselines", {})))
    try:
        check_slider_bounds(num_speculative_tokens, 1, MAX_UI_SPECULATIVE_TOKENS)
        check_slider_bounds(max_new_tokens, 1, MAX_UI_NEW_TOKENS)
        text = check_prompt(prompt)
        settings = engine_settings(method, num_speculative_tokens, verify, temperature, top_k, top_p,
                                   max_new_tokens, seed, prompt_lookup_min, prompt_lookup_max, synthetic_rates)
        decoder = cache.get()
    except ValueError as exc:
        raise gr.Error(str(exc)) from None
    state["baseline"] = None
    session = _session(request)
    flag = signals.start(session)
    try:
        yield from _stream(decoder, text, settings, state, flag)
    finally:
        signals.finish(session, flag)
    trace = Trace.from_dict(state["trace"])
    if trace.stop_reason == "stopped":
        yield _full_outputs(f"**stopped** · after {len(trace.steps)} steps, {_num_tokens(trace)} tokens", trace, state)
        return
    key = baseline_key(text, settings)
    if method == "none":
        state["baselines"][key] = run_summary(trace)
    elif compare and key not in state["baselines"]:
        yield (f"**baseline** · done ({trace.stop_reason}); now running method none on the same prompt "
               "for the speedup…",
               *([gr.skip()] * 10), state)
        try:
            base = decoder.generate(text, **baseline_settings(settings))
        except Exception as exc:
            if _is_oom(exc):
                _free_gpu()
            raise gr.Error(f"the baseline run failed: {exc}") from None
        state["baselines"][key] = run_summary(base)
    while len(state["baselines"]) > MAX_BASELINES:
        state["baselines"].pop(next(iter(state["baselines"])))
    state["baseline"] = state["baselines"].get(key)
    done = (f"**done** · {len(trace.output_token_ids)} tokens in {len(trace.steps)} steps, {trace.wall_time_s:.1f} s "
            f"(stop: {trace.stop_reason})")
    yield _full_outputs(done, trace, state)


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "default"


def stop(signals: StopSignals, state: dict[str, Any] | None, request: gr.Request = None) -> tuple[Any, ...]:
    """The Stop button: end this session's run after its current step (the browser also cancels
    the run event) and draw the partial trace kept in state."""
    running = signals.stop(_session(request))
    trace = _trace_of(state)
    # a cancelled run may have unregistered already; its trace in state is then still partial
    if trace is None or (not running and trace.stop_reason):
        return ("Nothing is running.", *([gr.skip()] * 10), state or new_state())
    if not trace.stop_reason:
        trace.stop_reason = "stopped"
        # a partial snapshot has no output list yet: the committed tokens so far (replay checks this)
        trace.output_token_ids = [t for st in trace.steps for t in st.committed_token_ids]
        state = dict(state, trace=trace.to_dict(), baseline=None)
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
    return {**{k: summary[k] for k in _SUMMARY_NUMBERS}, "time_ms": dict(times), "method": "none"}


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
    state.update(trace=trace.to_dict(), baseline=baseline, replayed=True)
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
    stem = export_stem(trace)
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


def export_stem(trace: Trace) -> str:
    """File name stem of an export, e.g. ``specviz-draft_model-k4-block-T0.8-seed0``, so that the
    downloads of runs being compared do not overwrite each other."""
    cfg = trace.config
    parts = [str(cfg.get("method", "run")), f"k{cfg.get('num_speculative_tokens', '')}", str(cfg.get("verify", "")),
             f"T{cfg.get('temperature', '')}", f"seed{cfg.get('seed', '')}"]
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
            prompt_lookup_max: Any, synthetic_rates: str, compare: bool,
            request: gr.Request = None) -> Iterator[tuple[Any, ...]]:
        """See :func:`run`."""
        yield from run(self.cache, self.signals, state, prompt, method, num_speculative_tokens, verify, temperature,
                       top_k, top_p, max_new_tokens, seed, prompt_lookup_min, prompt_lookup_max, synthetic_rates,
                       compare, request)

    def stop(self, state: dict[str, Any] | None, request: gr.Request = None) -> tuple[Any, ...]:
        """See :func:`stop`."""
        return stop(self.signals, state, request)
