"""Event handlers the layout wires: the selection (step / position / a clicked cell), examples, the method's own
session state, section 3's texts, and :class:`SessionHandlers` (the model cache and stop signals bound to Run and
Stop). Run and Stop: :mod:`specviz.ui.run`; upload, refill and export: :mod:`specviz.ui.replay`; outputs and the
session state: :mod:`specviz.ui.outputs`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import gradio as gr

from specviz import methods
from specviz.speedup import DEFAULT_BUDGET_S, DEFAULT_PAIRS, DEFAULT_SEGMENT_TOKENS  # noqa: F401 (the layout's)
from specviz.trace import Trace
from specviz.viz import explain
from specviz.viz.grid import cell_selection

from .cache import DecoderCache, StopSignals, device_in_use
from .outputs import RunOutputs, method_state, new_state, number, sliders, trace_of
from .replay import export, export_stem, replay, replay_fields, replay_settings  # noqa: F401 (wired by the layout)
from .run import measure, option_controls, run, stop
from .settings import AUTO_VERIFY
from .views import selection_views


def select_step(state: dict[str, Any] | None, step: Any) -> tuple[Any, ...]:
    """The step slider: move the position to the step's decision slot and redraw the selection
    views. A step out of range (typed into the slider's box) is clamped, and the step slider is
    set to the clamped value (last output; gr.skip() when the value was in range)."""
    trace = trace_of(state)
    if trace is None or not trace.steps:
        return (gr.skip(), *selection_views(Trace(config={}, prompt_token_ids=[]), None, None), gr.skip())
    asked = number(step, 0)
    s = min(max(int(asked), 0), len(trace.steps) - 1)
    i = trace.steps[s].num_accepted + 1
    fix = gr.skip() if s == asked else sliders(trace, s, i)[0]
    return (sliders(trace, s, i)[1], *selection_views(trace, s, i), fix)


def select_position(state: dict[str, Any] | None, step: Any, position: Any) -> tuple[Any, ...]:
    """The position slider: redraw the selection views (step and position clamped to the trace)."""
    trace = trace_of(state) or Trace(config={}, prompt_token_ids=[])
    return selection_views(trace, int(number(step, 0)), int(number(position, 1)))


def select_cell(state: dict[str, Any] | None, cell: Any) -> tuple[Any, ...]:
    """A click on a step-grid cell, sent by the page's script as "row,column[,nonce]": select
    that step and position (:func:`specviz.viz.grid.cell_selection`), move both sliders there
    and redraw the selection views. Anything unreadable changes nothing."""
    trace = trace_of(state)
    parts = str(cell or "").split(",")
    if trace is None or not trace.steps or len(parts) < 2:
        return (gr.skip(),) * 7
    s, i = cell_selection(trace, int(number(parts[0], 0)), int(number(parts[1], 0)))
    step_slider, position_slider = sliders(trace, s, i)
    return (step_slider, position_slider, *selection_views(trace, s, i))


def load_examples(path: str | Path) -> list[dict[str, Any]]:
    """Example prompts from a JSON file {"examples": [{"name", "prompt", "settings"}]} (missing -> [])."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return []
    return [e for e in data.get("examples", []) if isinstance(e, dict) and "name" in e and "prompt" in e]


CORE_EXAMPLE_FIELDS = ("method", "num_speculative_tokens", "verify", "temperature", "max_new_tokens")
# an example sets or clears these: a tree left from an earlier pick would be ignored by the next method, with a warning
TREE_FIELD_DEFAULTS = {"eagle_tree": "", "tree_branches": 0, "static_tree": ""}


def example_fields() -> tuple[str, ...]:
    """The controls an example sets, in :func:`load_example`'s order: the core settings, the methods' own option
    controls, then the draft-tree fields."""
    return (*CORE_EXAMPLE_FIELDS, *option_controls(), *TREE_FIELD_DEFAULTS)


def load_example(examples: list[dict[str, Any]], name: str) -> tuple[Any, ...]:
    """The example's prompt, its settings in :func:`example_fields`' order, then the progress line (its ``note``, if
    any). Settings it leaves unset are gr.skip(), except the draft-tree fields, which it clears. No choice (the
    dropdown closed without a pick: None or "") or an unknown name changes nothing."""
    ex = next((e for e in examples if e["name"] == name), None) if name else None
    if ex is None:
        if name:
            gr.Warning(f"unknown example {name!r}")
        return (gr.skip(),) * (2 + len(example_fields()))
    st = dict(ex.get("settings", {}))
    if st.get("verify") == "greedy" and not st.get("temperature"):  # auto: raising T then samples, not an error
        st["verify"] = AUTO_VERIFY
    values = (st[f] if f in st else TREE_FIELD_DEFAULTS.get(f, gr.skip()) for f in example_fields())
    note = f" {ex['note']}" if ex.get("note") else ""
    return (ex["prompt"], *values, f"Example loaded: press Run.{note}")


class SessionHandlers:
    """The app's model cache and stop signals bound to the handlers that need them.

    Bound methods rather than ``functools.partial``: Gradio reads the ``gr.Request`` annotation
    from the signature's type hints (which a partial does not expose) to pass the caller's
    session, and Stop must reach only that session's run.
    """

    def __init__(self, cache: DecoderCache, signals: StopSignals):
        self.cache, self.signals = cache, signals

    def run(self, state: dict[str, Any] | None, request: gr.Request = None, *values: Any) -> Iterator[RunOutputs]:
        """See :func:`specviz.ui.run.run` (``values``: a :class:`~specviz.ui.run.RunRequest`'s). The request comes
        second: Gradio passes a ``gr.Request`` only to positional parameters before ``*values``."""
        with self.cache.in_use():  # the background warm-up waits until this run has ended
            yield from run(self.cache, self.signals, state, *values, request=request)

    def measure(self, state: dict[str, Any] | None, request: gr.Request = None) -> Iterator[RunOutputs]:
        """See :func:`specviz.ui.run.measure`: the comparison with method none after this session's run."""
        with self.cache.in_use():  # nor may it run beside the timed segments
            yield from measure(self.signals, state, request)

    def stop(self, state: dict[str, Any] | None, request: gr.Request = None) -> RunOutputs:
        """See :func:`stop`."""
        return stop(self.signals, state, request)

    def warm_up_status(self) -> tuple[str, Any]:
        """The line under the header while the models load and warm up (polled by a timer, which
        this turns off once nothing is happening), and the warm-up's cost once done."""
        status = self.cache.status
        if status == "loading the models":
            return "**loading the models** · a Run pressed now starts once they are loaded", gr.Timer(active=True)
        if status:
            cuda = device_in_use(self.cache.device).startswith("cuda")
            work = "CUDA-graph capture, kernel compilation" if cuda else "the first requests' set-up"
            return (f"**ready** · warming up between runs: {status.removeprefix('warm-up: ')} · one-time work "
                    f"({work}); a run now pays what it needs itself, outside its timings", gr.Timer(active=True))
        if self.cache.warm_up_error:
            return (f"warm-up failed ({self.cache.warm_up_error[:200]}); runs capture what they need on first use",
                    gr.Timer(active=False))
        r = self.cache.warm_up_report
        done = (f"warmed up in {r['seconds']:.1f} s ({int(r['graphs'])} CUDA graphs captured, {r['capture_s']:.1f} s)"
                if r and r.get("graphs") else (f"warmed up in {r['seconds']:.1f} s" if r else ""))
        compiled = self.cache.compile_status()
        if done and compiled is not None and compiled.mode == "auto":
            done += f" · {compiled.line()}"
        return done, gr.Timer(active=False)




def state_status(state: dict[str, Any] | None, method: str) -> str:
    """The line under the method about its session state (``Method.state_note``): "" for a method that keeps none."""
    spec = methods.get(method) if method in methods.names() else None
    if spec is None or spec.state_note is None:
        return ""
    return spec.state_note(method_state(dict(state or new_state()), method))


def state_row(method: str) -> Any:
    """The method-state line and its reset button show only while a method that keeps state is chosen."""
    return gr.Row(visible=method in methods.names() and methods.get(method).request_state is not None)


def reset_state(state: dict[str, Any] | None, method: str) -> tuple[str, dict[str, Any]]:
    """The reset button: forget the chosen method's session state (a known start, e.g. before a comparison)."""
    state = dict(state or new_state())
    own = method_state(state, method)
    if own is not None:
        own.clear()
    return state_status(state, method), state


def source_texts(state: dict[str, Any] | None) -> tuple[str, str]:
    """Section 3's heading and text, named for the method of the session's trace (the generic ones
    before any run): :func:`specviz.viz.explain.source_heading` / ``source_explain``."""
    trace = (state or {}).get("trace") or {}
    method = str((trace.get("config") or {}).get("method") or "") or None
    return explain.source_heading(method), explain.source_explain(method)

