"""The measured part of the speedup panel: the method-none comparison made beside a run
(:func:`specviz.speedup.measure_speedup`), with its spread, and notes on what the timings exclude."""

from __future__ import annotations

import html
from typing import Any


def measured_html(measurement: dict[str, Any]) -> str:
    """One paragraph: the median tokens/s ratio over the interleaved segment pairs, its range and
    n, what the measurement cost, and a warning when the range is too wide to read.

    Args:
        measurement: ``baseline_none["measurement"]`` (keys pairs, segment_tokens, ratios, median,
            low, high, n, noisy, cost_s)."""
    m = measurement
    n, seg = int(m["n"]), int(m["segment_tokens"])
    what = (f"median of {n} interleaved pair{'s' if n != 1 else ''} of {seg}-token segments: this method and method "
            "none, in alternating order")
    spread = "one pair: no spread" if n < 2 else f"range {m['low']:.2f}–{m['high']:.2f}× over the {n} pairs"
    short = f" (the time budget ended it after {n} of {m['pairs']} pairs)" if n < int(m["pairs"]) else ""
    out = (f"<p><b>Measured beside this run: {m['median']:.2f}× tokens/s</b> ({what}; {spread}; the measurement "
           f"took {m['cost_s']:.1f} s{short}).</p>")
    if m["noisy"]:
        out += (f"<p style='color:#b45309'><b>Too noisy to read:</b> the pairs disagree by more than half the median "
                f"({m['low']:.2f}× to {m['high']:.2f}×); the machine was probably busy with something else. "
                "Run again when it is idle, or raise the comparison pairs (advanced settings).</p>")
    return out


def run_vs_segments_html(run: dict[str, Any], measurement: dict[str, Any]) -> str:
    """Why the run's own tokens/s differs from the timed segments', in words: what the segments time (the request's
    first ``segment_tokens`` tokens, decoded again ``n`` times per method) and what slowed the run itself.

    Args:
        run: the run's summary (:meth:`specviz.trace.RunMetrics.summary`); measurement: ``baseline_none["measurement"]``
            (keys n, segment_tokens, method_summary)."""
    seg, n = int(measurement["segment_tokens"]), int(measurement["n"])
    own, timed = run.get("decode_tokens_per_second", 0.0), measurement["method_summary"].get("decode_tokens_per_second", 0.0)
    return (f"<p style='font-size:13px' class='sv-run-vs-segments'><b>What the segments time:</b> the request's first "
            f"{seg} tokens (of the {run.get('tokens', 0)} this run generated), decoded again {n} time{'s' * (n != 1)} "
            f"with this method and {n} time{'s' * (n != 1)} with method none, back to back. <b>Why this run's own "
            f"rate ({own:.1f} tokens / s) differs from the segments' ({timed:.1f}):</b> the run recorded every step in "
            "full detail while the app drew its views between steps; it was the first run with these settings, so it "
            "paid one-time set-up costs the segments did not; and the machine may have been busy with other work "
            "while it ran. The segments meet the same conditions for both methods, so compare them with each other, "
            "not with the run.</p>")


def capture_note(capture_ms: float) -> str:
    """A note when one-time CUDA-graph capture (and the compilation inside it) ran during the run
    (excluded from its timings by the engine), else ""."""
    if not capture_ms:
        return ""
    return (f"<p style='font-size:13px;color:#6b7280'>This run captured CUDA graphs for settings not warmed up at "
            f"start ({capture_ms / 1e3:.2f} s, a one-time cost): that time is excluded from its timings and from the "
            "speedup.</p>")


def graph_notes_html(notes: list[str] | None) -> str:
    """The trace's ``config.graph_notes`` (CUDA-graph captures that failed, so those forwards ran eagerly and
    the tokens/s is lower than with graphs) as one note, else ""."""
    if not notes:
        return ""
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (f"<div style='font-size:13px;color:#b45309'>Not every forward ran from a CUDA graph (correct tokens, lower "
            f"tokens/s):<ul style='margin:2px 0 0 18px'>{items}</ul></div>")
