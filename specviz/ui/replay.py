"""Uploading a trace (replay: every view redrawn without any model), refilling the controls from it, and exporting
the session's trace (JSON, an offline HTML report, PNGs when kaleido is installed). An upload is read as data,
size-capped and validated (:mod:`specviz.trace.validate`), never executed."""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import gradio as gr

from specviz import methods
from specviz.config import VERIFY_METHODS
from specviz.trace import MAX_TRACE_BYTES, Trace, TraceFormatError
from specviz.trace.validate import BASELINE_KEY, check_baseline, check_consistency
from specviz.viz import figure_png, figures, report_html

from .outputs import (IS_NONE, REPLAYED, RunOutputs, full_outputs, message_outputs, new_state, trace_of,
                      upload_bytes)
from .run import option_controls
from .settings import MAX_UI_NEW_TOKENS, MAX_UI_SPECULATIVE_TOKENS


NOT_A_TRACE = "this is not a specviz trace"
DAMAGED_TRACE = "this specviz trace was edited or damaged, so it is not drawn"


def looks_like_a_trace(data: str | bytes) -> bool:
    """A JSON object with a trace's top-level keys (version, config, steps): a refusal then means an edited or damaged
    trace, not some other file."""
    try:
        obj = json.loads(data)
    except ValueError:
        return False
    return isinstance(obj, dict) and {"version", "config", "steps"} <= set(obj)


def replay(state: dict[str, Any] | None, path: str | None) -> RunOutputs:
    """Upload: read a trace JSON (size-capped, validated as data and for consistency, never
    executed) and draw it. A refused file leaves the views as they were, with the reason in the
    progress line."""
    state = dict(state or new_state())
    try:
        data = upload_bytes(path, MAX_TRACE_BYTES, "traces")
    except ValueError as exc:
        return message_outputs(str(exc))
    try:
        trace = Trace.from_json(data)
        check_consistency(trace)
        baseline = check_baseline(trace.metrics.pop(BASELINE_KEY, None))
    except TraceFormatError as exc:
        return message_outputs(f"{DAMAGED_TRACE if looks_like_a_trace(data) else NOT_A_TRACE}: {exc}")
    state.update(trace=trace.to_dict(), baseline=baseline, replayed=True, streamed=False,
                 no_baseline=IS_NONE if trace.config.get("method") == "none" else REPLAYED)
    cfg = trace.config
    return full_outputs(f"**replay** · an uploaded trace: method {cfg.get('method')}, {len(trace.steps)} steps, "
                         f"{len(trace.output_token_ids)} tokens (no model needed)", trace, state)


CORE_REPLAY_FIELDS = ("prompt", "method", "num_speculative_tokens", "verify", "temperature", "top_k", "top_p",
                      "max_new_tokens", "seed")


def replay_fields() -> tuple[str, ...]:
    """The controls :func:`replay_settings` refills, in its order: the core ones, the methods' own option controls
    (:func:`specviz.ui.run.option_controls`), then the example dropdown."""
    return (*CORE_REPLAY_FIELDS, *option_controls(), "example")


def replay_settings(state: dict[str, Any] | None) -> tuple[Any, ...]:
    """After a successful replay: the trace's prompt and settings for the controls, in
    :func:`replay_fields` order, then the session state, so that Run repeats the request live. A
    setting the controls cannot show (an unknown method, k above the slider's cap, a
    model-specific value) is left as it was (gr.skip()); after a refused upload nothing changes."""
    if not (state or {}).get("replayed"):
        return (gr.skip(),) * (len(replay_fields()) + 1)
    state = {**state, "replayed": False}
    trace = trace_of(state)
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
        method if method in methods.names() else gr.skip(),
        num("num_speculative_tokens", 1, MAX_UI_SPECULATIVE_TOKENS, int),
        verify if verify in VERIFY_METHODS else gr.skip(),
        num("temperature", 0, 100),
        0 if cfg.get("top_k") is None else num("top_k", 0, 10**7, int),
        1.0 if cfg.get("top_p") is None else num("top_p", 0.01, 1.0),
        num("max_new_tokens", 1, MAX_UI_NEW_TOKENS, int),
        num("seed", 0, 2**31 - 1, int),
        *(num(f.name, f.metadata["lo"] or 0, f.metadata["hi"] or 10**7, int) for f in _option_fields()),
        None,  # the example dropdown: the controls now hold the trace's settings, not an example's
        state,
    )


def _option_fields() -> list[Any]:
    """The option controls' fields (their ranges), in :func:`option_controls` order."""
    by_name = {f.name: f for m in methods.all_methods() for f in methods.option_fields(m.options)}
    return [by_name[name] for name in option_controls()]


def export(state: dict[str, Any] | None, step: Any, position: Any) -> list[str]:
    """Files to download: trace.json, report.html (every view, opens offline) and, when kaleido
    is installed, one PNG per figure. Raises gr.Error when there is no trace yet."""
    trace = trace_of(state)
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

