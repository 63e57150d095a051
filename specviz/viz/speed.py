"""The speedup panel: the table of this run against method none (:func:`speedup_html`), the measured comparison made
beside a run (:func:`specviz.speedup.measure_speedup`) with its spread, and notes on what the timings exclude."""

from __future__ import annotations

import html
from typing import Any

from specviz.speedup import crosses_one, quartiles
from specviz.trace import TOKENS_PER_FORWARD_FORMULA


def measured_html(measurement: dict[str, Any]) -> str:
    """One paragraph: the median tokens/s ratio over the interleaved segment pairs (in bold), its range and
    n, what the measurement cost; when it is :func:`inconclusive` (fewer than :data:`MIN_PAIRS` pairs, a wide
    interquartile range, or a range that crosses 1x), the warning first and the median in plain type.

    Args:
        measurement: ``baseline_none["measurement"]`` (keys pairs, segment_tokens, ratios, median,
            low, high, n, noisy, cost_s)."""
    m = measurement
    n, seg = int(m["n"]), int(m["segment_tokens"])
    what = (f"one pair of {seg}-token segments: this method and method none" if n == 1 else
            f"median of {n} interleaved pairs of {seg}-token segments: this method and method none, in alternating "
            "order")
    spread = "one pair: no spread" if n < 2 else f"range {m['low']:.2f}–{m['high']:.2f}× over the {n} pairs"
    short = f" (the time budget ended it after {n} of {m['pairs']} pairs)" if n < int(m["pairs"]) else ""
    headline = f"Measured beside this run: {m['median']:.2f}× tokens/s"
    detail = f"({what}; {spread}; the measurement took {m['cost_s']:.1f} s{short})."
    if not inconclusive(m):  # a clean range is not a confidence interval: say how far a rerun may move
        return (f"<p><b>{headline}</b> {detail} A rerun of the same request can land outside this range: compare "
                "methods within one comparison (the Compare tab).</p>")
    # an inconclusive median is not a headline: the warning leads and the number stays in plain type (a room
    # remembers the bold number, not the warning beside it)
    if n < MIN_PAIRS:
        title = "Too few pairs to judge"
        why = (f"{'one pair shows no spread' if n == 1 else 'two pairs are too few'} to judge the machine's noise "
               "by, and two identical runs on one machine can differ by 2x")
        advice = (f"The time budget ended the measurement after {n} of {m['pairs']} pairs: fewer new tokens make each "
                  "pair shorter" if n < int(m["pairs"]) else
                  f"Raise the comparison pairs to {MIN_PAIRS} or more (advanced settings)")
    elif m["noisy"]:
        title = "Too noisy to read"
        q1, q3 = quartiles(m["ratios"])
        why = (f"the middle half of the pairs ({q1:.2f}× to {q3:.2f}×; all of them {m['low']:.2f}× to "
               f"{m['high']:.2f}×) spans more than a quarter of their median: other work on the machine, or a "
               "first-use cost, slowed some segments")
        advice = "Run again when the machine is idle"
    else:
        title = "Too noisy to read"
        why = (f"one pair ran slower than method none and another faster ({m['low']:.2f}× to {m['high']:.2f}×), so "
               "these pairs cannot tell whether this method is faster here")
        advice = "Run again when the machine is idle, or with more comparison pairs (advanced settings)"
    out = (f"<p style='color:#b45309' class='sv-noisy'><b>{title}:</b> {why}. {advice}; tokens per target forward "
           "above does not depend on the machine.</p>")
    return out + f"<p>{headline} {detail}</p>"


MIN_PAIRS = 3  # fewer pairs show too little of the machine's noise to read their median as a speedup


def inconclusive(m: dict[str, Any]) -> bool:
    """Whether a measurement (keys low, high, n, noisy) cannot be read as a speedup: fewer than :data:`MIN_PAIRS`
    pairs, pairs too spread to read (noisy: :func:`specviz.speedup.spread`), or one pair slower than method none and
    another faster (the range crosses 1x)."""
    return int(m["n"]) < MIN_PAIRS or bool(m["noisy"]) or crosses_one(m)


def run_vs_segments_html(run: dict[str, Any], measurement: dict[str, Any]) -> str:
    """Why the run's own tokens/s differs from the timed segments', in words: what the segments time (the request's
    first ``segment_tokens`` tokens, decoded again ``n`` times per method) and what slowed the run itself.

    Args:
        run: the run's summary (:meth:`specviz.trace.RunMetrics.summary`); measurement: ``baseline_none["measurement"]``
            (keys n, segment_tokens, method_summary)."""
    seg, n = int(measurement["segment_tokens"]), int(measurement["n"])
    own, timed = run.get("decode_tokens_per_second", 0.0), measurement["method_summary"].get("decode_tokens_per_second", 0.0)
    times = f"{n} time{'s' * (n != 1)}"
    head = (f"<p style='font-size:13px' class='sv-run-vs-segments'><b>What the segments time:</b> the request's first "
            f"{seg} tokens (of the {run.get('tokens', 0)} this run generated), decoded again {times} with this method "
            f"and {times} with method none, back to back. ")
    if timed and abs(own - timed) <= 0.1 * timed:
        why = (f"<b>This run's own rate ({own:.1f} tokens / s) is close to the segments' ({timed:.1f}).</b> ")
    elif own < timed:
        why = (f"<b>Why this run's own rate ({own:.1f} tokens / s) is lower than the segments' ({timed:.1f}):</b> the "
               "run recorded every step in full detail while the app drew its views between steps; the first run of "
               "new settings also pays one-time set-up costs the segments do not; and the machine may have been busy "
               "with other work while it ran. ")
    else:
        why = (f"<b>Why this run's own rate ({own:.1f} tokens / s) is higher than the segments' ({timed:.1f}):</b> the "
               f"segments cover only the first {seg} tokens, where the drafts may be accepted less often than later in "
               "the run, and the machine may have been busier while the segments ran. ")
    return (head + why + "The segments meet the same conditions for both methods, so compare them with each other, "
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


def runner_note(run_label: str | None, measurement: dict[str, Any] | None) -> str:
    """Which CUDA graphs the target's forwards replayed (the trace's ``config.runner_compiled``: "compiled" with
    torch.compile, "uncompiled", or partly) in this run and in the comparison's segments
    (``measurement["runner"]``: {"method", "none"}), so a speedup says which runner measured it; "" on the CPU and
    when every forward replayed uncompiled graphs (the default runner)."""
    parts = [f"this run: <b>{html.escape(run_label)}</b>"] if run_label else []
    seg = (measurement or {}).get("runner") or {}
    if {run_label, seg.get("method"), seg.get("none")} <= {None, "", "uncompiled"}:
        return ""  # the default runner throughout: nothing to tell apart
    if seg.get("method") or seg.get("none"):
        parts.append(f"the comparison's segments: this method {html.escape(str(seg.get('method')))}, "
                     f"method none {html.escape(str(seg.get('none')))}")
    if not parts:
        return ""
    differ = bool(seg) and seg.get("method") != seg.get("none")
    warn = (" <b>They differ</b>: the ratio mixes two runners; measure again once the compile stage is done."
            if differ else "")
    return (f"<p style='font-size:13px;color:{'#b45309' if differ else '#6b7280'}'>Target forwards (CUDA graphs): "
            f"{'; '.join(parts)}.{warn}</p>")


SPEEDUP_ROWS = (("generated tokens", "tokens", "{:d}"),
                ("target forwards (incl. prefill)", "target_forward_passes", "{:d}"),
                ("verification steps (target forwards after the prefill)", "steps", "{:d}"),
                ("tokens per target forward = tokens / verification steps", "tokens_per_forward", "{:.2f}"),
                ("decode time (s): draft + verify + sample", "decode_s", "{:.2f}"),
                ("tokens / s over the decode time", "decode_tokens_per_second", "{:.1f}"),
                ("wall time (s)", "wall_time_s", "{:.2f}"))
# the wall-time row's label: what the engine's wall clock (the whole request) includes, by where the trace came from
WALL_TIME_STREAMED = "wall time (s) of the whole request, incl. prefill and the app's redraws between steps"
WALL_TIME_RECORDED = "wall time (s) of the whole request, as recorded (incl. prefill)"
PAIR_RATIO_HELP = ("Each interleaved pair times one segment of this method and one of method none on the same "
                   "request; its ratio is (segment tokens / decode time of this method) ÷ (the same for method none). "
                   "The headline is the median of these ratios (one disturbed pair cannot move it); the pooled "
                   "ratio divides all segments' tokens / s instead. The whole run's own tokens / s is not part of "
                   "the comparison: it ran at another time, with the app redrawing between steps.")
CELL_STYLE = "padding:4px 10px;text-align:right"


def _columns(run: dict[str, Any], baseline: dict[str, Any] | None) -> list[tuple[str, str, dict[str, Any]]]:
    """(heading, hover, summary) per table column: with a side-by-side measurement the timed segments of
    both methods (what the headline is computed from), then the whole run; else the run and the baseline."""
    meas = (baseline or {}).get("measurement")
    if not meas:
        return [(f"this run: {run['method']}", "", run)] + ([("method none", "", baseline)] if baseline else [])
    seg = f"{meas['n']} × its first {meas['segment_tokens']} tokens"
    return [(f"{run['method']}: {seg} (timed)", PAIR_RATIO_HELP, meas["method_summary"]),
            (f"method none: {seg} (timed)", PAIR_RATIO_HELP, baseline),
            ("this run, whole (recorded and drawn; not timed against none)", PAIR_RATIO_HELP, run)]


def _pair_row(meas: dict[str, Any]) -> str:
    """The row the headline is computed from: each pair's tokens/s ratio, their median, the pooled ratio."""
    pooled = _ratio(meas["method_summary"].get("decode_tokens_per_second", 0.0),
                    meas.get("none_decode_tokens_per_second", 0.0))
    per_pair = ", ".join(f"{r:.2f}" for r in meas["ratios"])
    # an inconclusive measurement has no bold number
    if inconclusive(meas):
        text = f"per pair {per_pair} → median {meas['median']:.2f}× (not a reading: see the warning)"
    else:
        text = f"per pair {per_pair} → median <b>{meas['median']:.2f}×</b> (the headline)"
    if pooled:
        text += f"; pooled {pooled:.2f}×"
    return (f"<tr class='sv-pair-ratios' title='{html.escape(PAIR_RATIO_HELP)}'><td style='padding:4px 10px'>tokens / s "
            f"ratio, this method ÷ none</td><td colspan='2' style='{CELL_STYLE}'>{text}</td>"
            f"<td style='{CELL_STYLE};color:#9ca3af'>–</td></tr>")


def speedup_html(run: dict[str, Any], baseline: dict[str, Any] | None, missing: str | None = None,
                 streamed: bool = False) -> str:
    """HTML table comparing :func:`run_summary` of this run with the method "none" baseline.

    Tokens per target forward (tokens / verification steps) is the hardware-independent gain;
    tokens/s over the decode time (draft + verify + sample) is what this machine measured for
    the decoding itself (the app's streaming redraws between steps are not counted). Without a
    ``baseline`` the table has one column and the note ``missing`` (default: how to get one) says why.
    A baseline measured beside the run (``baseline["measurement"]``, :mod:`specviz.speedup`) is
    shown as the median ratio with its spread; the table then shows the numbers that headline is
    computed from: the timed segments of this method (``measurement["method_summary"]``) and of
    method none (``baseline``), a row of the per-pair tokens/s ratios with their median (the
    headline) and pooled ratio, and the whole run in a last column labelled as not timed against
    none (:data:`PAIR_RATIO_HELP`, also the columns' hover). ``streamed``: the run was just streamed into the app
    (which redrew its views between steps, inside the wall time: :data:`WALL_TIME_STREAMED`); else (an uploaded trace,
    the CLI's, a comparison's run, a report) the wall time is labelled as recorded (:data:`WALL_TIME_RECORDED`)."""
    cols = _columns(run, baseline)
    head = "".join(f"<th style='{CELL_STYLE}'" + (f" title='{html.escape(tip)}'" if tip else "")
                   + f">{html.escape(n)}</th>" for n, tip, _ in cols)
    body = ""
    wall = WALL_TIME_STREAMED if streamed else WALL_TIME_RECORDED  # what the whole request's clock includes
    for name, key, fmt in SPEEDUP_ROWS:
        name = wall if key == "wall_time_s" else name
        cells = "".join(f"<td style='{CELL_STYLE}'>{fmt.format(c.get(key, 0))}</td>" for _, _, c in cols)
        hover = f" title='{html.escape(TOKENS_PER_FORWARD_FORMULA)}'" if key == "tokens_per_forward" else ""
        body += f"<tr{hover}><td style='padding:4px 10px'>{name}</td>{cells}</tr>"
        if key == "decode_tokens_per_second" and (baseline or {}).get("measurement"):
            meas = dict(baseline["measurement"], none_decode_tokens_per_second=baseline.get("decode_tokens_per_second", 0.0))
            body += _pair_row(meas)
    note = ("<p style='color:#6b7280'>No method-none baseline for this trace: tick “compare with method none” "
            "(advanced settings) and run to measure the speedup.</p>")
    if missing:
        note = f"<p style='color:#6b7280'>{html.escape(missing)}</p>"
    if baseline:
        note = _speedup_note(run, baseline)
    return (f"<div class='sv-speedup'><table style='border-collapse:collapse;font-size:14px'>"
            f"<tr><th></th>{head}</tr>{body}</table>{note}</div>")


def step_costs(run: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float]:
    """This run's time per verification step split into draft / verify / sample, in units of
    one step of the method-none ``baseline`` (both :func:`run_summary` dicts), and their sum
    "total". Then tokens/s speedup = (tokens per target forward ratio) / total, exactly."""
    unit = 1e3 * baseline["decode_s"] / baseline["steps"] if baseline.get("steps") and baseline.get("decode_s") else 0.0
    steps = run.get("steps") or 0
    parts = {k: (run["time_ms"].get(k, 0.0) / steps / unit if steps and unit else 0.0)
             for k in ("draft", "verify", "sample")}
    parts["total"] = sum(parts.values())
    return parts


def _speedup_note(run: dict[str, Any], baseline: dict[str, Any]) -> str:
    """Both speedups and why they differ on this machine, from the measured step costs."""
    fwd = _ratio(run["tokens_per_forward"], baseline["tokens_per_forward"])
    meas = baseline.get("measurement")
    seg = meas["method_summary"] if meas else run  # the cost split: from the segments measured side by side
    tps = _ratio(run.get("decode_tokens_per_second", 0.0), baseline.get("decode_tokens_per_second", 0.0))
    c = step_costs(seg, baseline)
    whole = " (this run, whole: a count, it needs no timing)" if meas else ""
    note = (f"<p><b>{fwd:.2f}× tokens per target forward</b> over method none{whole}: the speedup if a forward cost the "
            "same however many tokens it verifies and drafting were free (large targets on a GPU come close).</p>")
    note += (measured_html(meas) + run_vs_segments_html(run, meas) if meas else
             f"<p><b>Measured on this machine: {tps:.2f}× tokens/s</b> (one run of each, no spread recorded).</p>")
    fwd = _ratio(seg["tokens_per_forward"], baseline["tokens_per_forward"])
    unreadable = bool(meas) and inconclusive(meas)
    if c["total"] > 0 and unreadable:  # the split of unreadable segments is no explanation: say only that
        note += (f"<p style='font-size:13px'>Why they differ: not readable from these segments. Their step costs "
                 f"(one step = {c['total']:.2f} steps of method none) come from the same timings the warning above "
                 "rejects; tokens per target forward is the number to read.</p>")
    elif c["total"] > 0:
        note += (f"<p style='font-size:13px'>Why they differ: one step of this {'method' if meas else 'run'} costs <b>{c['total']:.2f}</b> "
                 f"steps of method none (drafting {c['draft']:.2f} + verify forward of up to k+1 tokens "
                 f"{c['verify']:.2f} + sampler and record {c['sample']:.2f}), and yields {fwd:.2f}× the tokens: "
                 f"{fwd:.2f} / {c['total']:.2f} = {fwd / c['total']:.2f}×{' (the segments pooled)' if meas else ''}.")
        headline, pooled = (meas["median"] if meas else tps), fwd / c["total"]
        if (headline < 1) != (pooled < 1):  # the median of the pairs and the pooled segments disagree
            note += (f" The headline ({headline:.2f}×, the median of the pairs) and the segments pooled "
                     f"({pooled:.2f}×) fall on different sides of 1×: on this machine, now, the difference between "
                     "speculation and method none is within the noise.")
        elif headline < 1:
            note += (" Here speculation loses: the drafting and the wider verify forward cost more than the target "
                     "forwards they save. That happens when the target is small (its forward is cheap, barely more "
                     "than the draft's) or runs on a CPU (where a forward's cost grows with the tokens it checks); "
                     "tokens per target forward is the number that carries over to a large target on a GPU.")
        note += "</p>"
    return note


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0
