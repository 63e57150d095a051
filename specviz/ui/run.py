"""The Run and Stop buttons: a :class:`RunRequest` in, :class:`~specviz.ui.outputs.RunOutputs` out, streamed.

A run streams the request's views while it decodes (on a background thread) and draws everything when the generation
ends ("done"). Then, if asked, :func:`measure` (the next event, chained by the layout; ``/measure`` for API clients)
measures the speedup over method none beside it (:func:`specviz.speedup.measure_speedup`) and redraws only the
statistics and the speedup panel: the run's views and lesson never wait for it. Bad input, a load failure or a refused
run ends with the message in the progress line (never raises gr.Error out of :func:`run`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Generator, Iterator, Sequence

import gradio as gr

from specviz import methods
from specviz.speedup import DEFAULT_PAIRS, DEFAULT_SEGMENT_TOKENS, measure_speedup
from specviz.trace import Trace

from .cache import DecoderCache, StopSignals
from .outputs import (IS_NONE, MEASURE_STOPPED, MEASURING, NO_COMPARE, NO_PAIRS, STOPPED, RunOutputs, full_outputs,
                      md_text, message_outputs, method_state, new_state, num_tokens, trace_of)
from .settings import (AUTO_VERIFY, MAX_UI_NEW_TOKENS, MAX_UI_PAIRS, check_k, check_prompt, check_slider_bounds,
                       clamped_k_note, clamped_max_new_note, engine_settings, ignored_tree_note, tree_depth_note,
                       tree_settings)
from .views import empty_views, speedup_views, streaming_views
from .worker import BackgroundRun, run_pool

UPDATES_PER_SECOND = 4  # streaming redraws at most this often
_PENDING: dict[str, tuple] = {}  # session -> the finished run's measurement to make: (decoder, prompt, settings, ...)
_PENDING_LOCK = threading.Lock()
MAX_PENDING = 256
# the progress line's first words after Run, before the first step is drawn: the run handler's first update, before
# any model work (not set by a js listener on the click: a click Gradio drops while the previous run's events finish
# would leave "starting" on screen with no run behind it)
STARTING = ("**starting** · the prompt's prefill and the first step; the run's views are drawn from step 1 on (the "
            "views below are the previous run's until then)…")
LOADING = "**loading** · the models load and warm up once (on a GPU: CUDA-graph capture, tens of seconds)…"


def option_controls() -> tuple[str, ...]:
    """The methods' own controls (their options' field names), each once, in registration order: the Run event's
    inputs after :class:`RunRequest`'s fields."""
    return tuple(dict.fromkeys(f.name for m in methods.all_methods() for f in methods.option_fields(m.options)))


@dataclass
class RunRequest:
    """The Run button's inputs: the controls in this field order, then :func:`option_controls`' values (``options``).

    eagle_tree / tree_branches / static_tree: the draft-tree controls (EAGLE-2's "top_k, depth, total_tokens",
    branches per node, vLLM's static tree); k_typed / max_new_typed: what was last typed into k's / max new tokens'
    box ("" after a drag), so a value the browser clamped is named in the progress line."""

    prompt: Any = ""
    method: str = methods.BUILTIN[0]
    num_speculative_tokens: Any = 5
    verify: str = AUTO_VERIFY
    temperature: Any = 0.0
    top_k: Any = 0
    top_p: Any = 1.0
    max_new_tokens: Any = 96
    seed: Any = 0
    synthetic_rates: str = ""
    compare: bool = True
    pairs: Any = DEFAULT_PAIRS
    eagle_tree: str = ""
    tree_branches: Any = 0
    static_tree: str = ""
    k_typed: Any = ""
    max_new_typed: Any = ""
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name != "options")

    @classmethod
    def from_values(cls, values: Sequence[Any]) -> "RunRequest":
        """The request from the Run event's values (its fields, then the option controls; missing ones default)."""
        names = cls.fields()
        return cls(**dict(zip(names, values)), options=dict(zip(option_controls(), values[len(names):])))

    def values(self) -> tuple[Any, ...]:
        """The Run event's values for this request (:meth:`from_values`' inverse): its fields, then the option
        controls (one it does not set: the control's starting value), e.g. for ``/run`` through gradio_client."""
        start: dict[str, Any] = {}
        for m in methods.all_methods():
            for f in methods.option_fields(m.options):
                start.setdefault(f.name, f.metadata["ui"])
        return (*(getattr(self, n) for n in self.fields()), *(self.options.get(n, start[n]) for n in option_controls()))

    def notes(self) -> str:
        """What the run changes or ignores of the controls (a clamped k or max new tokens, an EAGLE-2 tree deeper than
        k, a tree control the method does not read), "; "-joined; "" for none."""
        m = self.method
        notes = (clamped_k_note(self.num_speculative_tokens, self.k_typed),
                 clamped_max_new_note(self.max_new_tokens, self.max_new_typed),
                 tree_depth_note(m, self.num_speculative_tokens, self.eagle_tree, self.static_tree),
                 ignored_tree_note(m, self.eagle_tree, self.tree_branches, self.static_tree))
        return "; ".join(n for n in notes if n)

    def settings(self) -> tuple[str, dict[str, Any]]:
        """(the prompt, the engine's generate() keywords). Raises ValueError saying what to change."""
        check_k(self.num_speculative_tokens)
        check_slider_bounds(self.max_new_tokens, 1, MAX_UI_NEW_TOKENS)
        check_slider_bounds(self.pairs, 0, MAX_UI_PAIRS)
        text = check_prompt(self.prompt)
        settings = engine_settings(self.method, self.num_speculative_tokens, self.verify, self.temperature,
                                   self.top_k, self.top_p, self.max_new_tokens, self.seed, self.options,
                                   self.synthetic_rates)
        settings.update(tree_settings(self.method, self.eagle_tree, self.tree_branches, self.static_tree))
        return text, settings


def run(cache: DecoderCache, signals: StopSignals, state: dict[str, Any] | None, *values: Any,
        request: gr.Request = None) -> Iterator[RunOutputs]:
    """The Run button (``values``: :meth:`RunRequest.from_values`). After an error mid-run (e.g. the GPU out of
    memory) the session's previous trace is drawn again and stays in the state, so it can still be exported."""
    req = RunRequest.from_values(values)
    streamed, note = False, req.notes()
    if note:
        gr.Warning(note)
    try:
        for out in _run(cache, signals, state, req, request):
            streamed = streamed or isinstance(out.state, dict)  # an update that changed the session's trace
            yield out._replace(progress=f"{out.progress} · **{note}**") if note and isinstance(out.progress, str) else out
    except gr.Error as exc:
        previous = dict(state or new_state())
        old = trace_of(previous)
        if not streamed or old is None:
            yield message_outputs(exc.message, previous if streamed else None)
            return
        gr.Warning(exc.message)
        yield full_outputs(f"**error** · {md_text(exc.message)} · _the views below show your previous run (the session "
                           "keeps it: Export still saves it)_", old, previous)


def _run(cache: DecoderCache, signals: StopSignals, state: dict[str, Any] | None, req: RunRequest,
         request: gr.Request | None) -> Iterator[RunOutputs]:
    """:func:`run`'s body; raises gr.Error for the user's mistakes."""
    state = dict(state or new_state())
    try:
        text, settings = req.settings()
    except ValueError as exc:
        raise gr.Error(str(exc)) from None
    session = _session(request)
    flag = signals.start(session)  # Stop works from here on, also while the models load
    try:
        decoder, extra = yield from _load_and_stream(cache, text, req.method, settings, req.compare, state, flag)
    finally:
        signals.finish(session, flag)
    trace = Trace.from_dict(state["trace"])
    if trace.stop_reason == "stopped":
        yield full_outputs(f"**stopped** · after {len(trace.steps)} steps, {num_tokens(trace)} tokens", trace, state)
        return
    pairs = int(float(req.pairs))
    measuring = req.compare and req.method != "none" and pairs > 0
    state["no_baseline"] = (IS_NONE if req.method == "none" else MEASURING if measuring else
                            NO_PAIRS if req.compare else NO_COMPARE)
    if measuring:  # made by measure(), the next event, once these views are drawn
        with _PENDING_LOCK:
            while len(_PENDING) >= MAX_PENDING:  # API clients that never ask for theirs: the oldest go
                _PENDING.pop(next(iter(_PENDING)))
            _PENDING[session] = (decoder, text, settings, extra, pairs, num_tokens(trace), req.notes())
    yield full_outputs(_done(trace) + (" · measuring the speedup over method none…" if measuring else ""), trace, state)


def _done(trace: Trace) -> str:
    n, steps = len(trace.output_token_ids), len(trace.steps)
    return (f"**done** · {n} token{'s' * (n != 1)} in {steps} step{'s' * (steps != 1)}, {trace.wall_time_s:.1f} s "
            f"(stop: {trace.stop_reason})")


def _load_and_stream(cache: DecoderCache, text: str, method: str, settings: dict[str, Any], compare: bool,
                     state: dict[str, Any], flag: threading.Event) -> Generator[RunOutputs, None, tuple[Any, dict]]:
    """Load the models (once; a progress line meanwhile), then stream the run into ``state``.
    Returns (the decoder, the extra ``generate`` keywords for the measurement)."""
    # at once, before any model work: the previous run's "done · …" (or "Ready: …") must not stay on screen
    yield RunOutputs.only(LOADING if not cache.loaded() else STARTING)
    try:
        decoder = cache.get()
    except ValueError as exc:
        raise gr.Error(str(exc)) from None
    extra: dict[str, Any] = {}
    own = method_state(state, method)
    if own is not None:  # the session's own state; the measurement drafts from a frozen copy of it
        extra = {"request_state": own.snapshot()}
        settings = dict(settings, request_state=own)
    # what the speedup panel says if the run does not end normally (Stop)
    state.update(baseline=None, no_baseline=IS_NONE if method == "none" else (STOPPED if compare else NO_COMPARE),
                 streamed=True)  # the trace in state is this live run's (its wall time includes the app's redraws)
    yield from _stream(decoder, text, settings, state, flag)
    return decoder, extra


def _stream(decoder: Any, prompt: str, settings: dict[str, Any], state: dict[str, Any],
            stop_flag: threading.Event) -> Iterator[RunOutputs]:
    """Decode one request on a background thread, yielding views at most UPDATES_PER_SECOND times a second; leaves
    the final trace in ``state``. ``stop_flag`` set -> the run ends after its current step (stop_reason "stopped");
    so does abandoning this generator (a cancelled event). Raises gr.Error for settings the engine refuses and for
    a GPU out of memory."""
    t0, shown, first = time.perf_counter(), -1, True
    run = BackgroundRun(decoder, prompt, settings, stop_flag)
    try:
        while not run.finished.wait(1.0 / UPDATES_PER_SECOND):
            snap = run.snapshot()
            if snap is None or len(snap.steps) == shown:
                continue
            shown = len(snap.steps)
            state["trace"], state["live"] = snap.to_dict(), True  # a partial trace: the lesson waits for the end
            yield _streaming_outputs(snap, _progress(snap, settings["max_new_tokens"], t0), state, first)
            first = False
    finally:
        if not run.finished.is_set():  # the event was cancelled or closed: end the decode too
            stop_flag.set()
    _raise_for(run.error)
    state["trace"], state["live"] = run.result().to_dict(), False


def _progress(trace: Trace, max_new: int, t0: float) -> str:
    elapsed = time.perf_counter() - t0
    return f"**running** · step {len(trace.steps)}, {num_tokens(trace)}/{max_new} tokens, {elapsed:.1f} s"


def _streaming_outputs(trace: Trace, progress: str, state: dict[str, Any], clear: bool) -> RunOutputs:
    """Views redrawn while a run streams (stream, summary, grid, stats). ``clear``: the first update also replaces
    the detail views of the previous run by a placeholder."""
    live = streaming_views(trace)
    wait = empty_views("Running: this view is drawn when the run ends (or when you press Stop).")
    skip = gr.skip()
    return RunOutputs(progress, live.stream, live.summary, live.grid, wait.residual if clear else skip,
                      wait.match if clear else skip, wait.trie if clear else skip, live.stats,
                      wait.speedup if clear else skip, skip, skip, state)


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


class _MeasureStopped(Exception):
    """Stop was pressed while the speedup was measured."""


def measure(signals: StopSignals, state: dict[str, Any] | None, request: gr.Request = None) -> Iterator[RunOutputs]:
    """The comparison with method none after a finished run (the event after Run): times interleaved segments of
    the run's request, each as long as the run's output at most (:data:`DEFAULT_SEGMENT_TOKENS` or fewer), and
    streams the statistics and the speedup panel in when done; Stop ends it. Nothing to measure (no comparison asked,
    a stopped or failed run): every output unchanged. A failure is said in the speedup panel; the run's views stay."""
    session = _session(request)
    with _PENDING_LOCK:
        job = _PENDING.pop(session, None)
    trace = trace_of(state)
    if job is None or trace is None:
        yield RunOutputs.only(gr.skip())
        return
    decoder, text, settings, extra, pairs, tokens, note = job
    note = f" · **{note}**" if note else ""  # the run's note (a clamped k ...) stays on the progress line
    state, flag = dict(state), signals.start(session)
    seg = max(1, min(settings["max_new_tokens"], DEFAULT_SEGMENT_TOKENS, tokens))  # never past where the run stopped
    try:
        yield from _measure(decoder, text, {k: v for k, v in settings.items() if k != "request_state"}, extra,
                            pairs, seg, state, flag, note)
    finally:
        signals.finish(session, flag)
    stats, speedup = speedup_views(trace, state.get("baseline"), state.get("no_baseline"), bool(state.get("streamed")))
    done = _done(trace) + (" · speedup measured" if state.get("baseline") else "") + note
    yield RunOutputs.only(done, state)._replace(stats=stats, speedup=speedup)


def _measure(decoder: Any, text: str, settings: dict[str, Any], extra: dict[str, Any], pairs: int, seg: int,
             state: dict[str, Any], flag: threading.Event, note: str = "") -> Iterator[RunOutputs]:
    """Measure the speedup into ``state["baseline"]`` on a pool thread, yielding its progress; if it fails or is
    stopped (``flag``), ``state["no_baseline"]`` says so."""
    done = [0, 2 * pairs]
    finished = threading.Event()
    out: dict[str, Any] = {}

    def progress(n: int, total: int) -> None:
        done[:] = [n, total]
        if flag.is_set():
            raise _MeasureStopped()

    def work() -> None:
        try:
            out["baseline"] = measure_speedup(decoder, text, settings, pairs=pairs, segment_tokens=seg,
                                              progress=progress, **extra)
        except Exception as exc:  # handed to the event's thread
            out["error"] = exc

    run_pool().submit(work, on_done=finished.set)
    try:
        while not finished.wait(1.0 / UPDATES_PER_SECOND):
            yield RunOutputs.only(f"**comparing** · the run is done and drawn; timing {pairs} pair(s) of {seg}-token "
                                  f"segments against method none, interleaved: segment {done[0]}/{done[1]}…{note}")
    finally:
        if not finished.is_set():  # the event was cancelled (a new Run): end the measurement too
            flag.set()
    exc = out.get("error")
    if exc is None:
        state["baseline"], state["no_baseline"] = out["baseline"], None
    elif isinstance(exc, _MeasureStopped):
        state["no_baseline"] = MEASURE_STOPPED
    else:  # the run itself succeeded: keep it, and say why there is no comparison
        if _is_oom(exc):
            _free_gpu()
        state["no_baseline"] = f"The comparison with method none failed: {exc}"


def _is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError)


def _free_gpu() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "default"


def stop(signals: StopSignals, state: dict[str, Any] | None, request: gr.Request = None) -> RunOutputs:
    """The Stop button: end this session's run after its current step (the browser also cancels the run event) and
    draw the partial trace kept in state."""
    running = signals.stop(_session(request))
    trace = trace_of(state)
    if running and trace is not None and trace.stop_reason and trace.stop_reason != "stopped":
        return RunOutputs.only("**stopping the comparison** · the run's views stay")  # measure() says the rest
    # a cancelled run may have unregistered already; its trace in state is then still partial
    if trace is None and running:  # still loading, or before its first step
        return RunOutputs.only("**stopping** · the run ends after its first step", state or new_state())
    if trace is None or (not running and trace.stop_reason):
        return RunOutputs.only("Nothing is running.", state or new_state())
    if not trace.stop_reason:
        trace.stop_reason = "stopped"
        # a partial snapshot has no output list yet: the committed tokens so far (replay checks this)
        trace.output_token_ids = [t for st in trace.steps for t in st.committed_token_ids]
        state = dict(state, trace=trace.to_dict(), baseline=None, live=False)  # no_baseline: set by the run
    return full_outputs(f"**stopped** · after {len(trace.steps)} steps, {num_tokens(trace)} tokens", trace, state)
