"""The speedup over method "none", measured beside a run: interleaved short segments, median of ratios.

A baseline timed once and cached is not a measurement of this run: the machine may have been busy
then (a baseline decoded while the CPU was shared read 47.7 s against 0.89 s, "53.84x"), and two
identical runs can differ by 2x. So the comparison is made after each run, from ``pairs`` pairs
of segments of the same request (the first ``segment_tokens`` new tokens): one with the run's
method, one with method "none", alternating the order (A B, B A, A B, ...) so that a drift of the
machine's speed cancels. Each pair gives one ratio of decode tokens/s (tokens / (draft + verify +
sample time), the engine's own per-step time, the proposer's observe counted in draft: no prefill, no
time between steps, and not the trace's recording: its event publication and the queueing of a tree step's
detailed record, which run in the next steps' overlap with the GPU); the headline
is the median ratio, shown with its range over the pairs; an interquartile range wider than ``NOISY_IQR`` of the
median is too noisy to read (the range grows with the number of pairs, so a rule on it flags more pairs more often;
with 3 pairs the IQR is half the range). Spec-Bench reports mean +- std over 3 runs; vLLM's
``benchmarks/sweep/tune_speculative_k.py`` uses the median and MAD of repeated runs.

Pure engine code (no UI imports); :mod:`specviz.ui.handlers` calls it and stores the result in the
trace's ``metrics["baseline_none"]`` (see :func:`comparison_summary`).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from .compiled_graphs import runner_kind
from .trace import RunMetrics, Trace

DEFAULT_PAIRS = 3
DEFAULT_SEGMENT_TOKENS = 32
DEFAULT_BUDGET_S = 20.0  # no new pair starts after this (the first pair always runs)
NOISY_IQR = 0.25  # interquartile range of the ratios / their median above this: "too noisy to read"
_SAMPLING = ("temperature", "top_k", "top_p", "max_new_tokens", "seed", "sampler_backend", "detailed_trace")


def summarize(traces: list[Trace]) -> dict[str, Any]:
    """:meth:`specviz.trace.RunMetrics.summary` of ``traces`` pooled (sums of tokens, steps, forwards and times):
    the same fields as :func:`specviz.viz.stats.run_summary` of one run."""
    return RunMetrics.pooled(traces).summary()


def _decode_rate(trace: Trace) -> float:
    return summarize([trace])["decode_tokens_per_second"]


def spread(ratios: list[float]) -> dict[str, Any]:
    """median, low (min), high (max), n and noisy (interquartile range / median > NOISY_IQR, quartiles
    interpolated between the ratios (``statistics.quantiles`` "inclusive"), or no ratio at all) of a list of
    ratios. One ratio is not noisy: it has no spread to judge (the views say so by its n)."""
    if not ratios:
        return {"median": 0.0, "low": 0.0, "high": 0.0, "n": 0, "noisy": True}
    med = statistics.median(ratios)
    q1, q3 = quartiles(ratios)
    return {"median": med, "low": min(ratios), "high": max(ratios), "n": len(ratios),
            "noisy": med <= 0 or (q3 - q1) / med > NOISY_IQR}


def quartiles(ratios: list[float]) -> tuple[float, float]:
    """(first, third) quartile of one or more ratios, interpolated between them (``statistics.quantiles``
    "inclusive"); one ratio is both."""
    if len(ratios) < 2:
        return ratios[0], ratios[0]
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return q1, q3


def crosses_one(s: dict[str, Any]) -> bool:
    """Whether a :func:`spread`'s ratios lie on both sides of 1x (some pairs or prompts slower than method none, others
    faster): such a median says nothing about which way the method goes."""
    return s.get("n", 0) >= 2 and s["low"] < 1.0 < s["high"]


def _runners(runs: dict[str, list[Trace]]) -> dict[str, str]:
    """{"method", "none"}: which graphs each side's segments replayed (their traces' ``runner_compiled``, joined when
    they differ); {} when no segment replayed a graph (the CPU)."""
    out = {side: " / ".join(dict.fromkeys(runner_kind(t.config["runner_compiled"]) for t in traces
                                          if t.config.get("runner_compiled")))
           for side, traces in runs.items()}
    return out if any(out.values()) else {}


def measure_speedup(decoder: Any, prompt: str, settings: dict[str, Any], pairs: int = DEFAULT_PAIRS,
                    segment_tokens: int = DEFAULT_SEGMENT_TOKENS, budget_s: float = DEFAULT_BUDGET_S,
                    progress: Callable[[int, int], None] | None = None, **extra: Any) -> dict[str, Any]:
    """Time ``settings``' method against method "none" beside each other (see the module docstring).

    Args:
        decoder: a :class:`~specviz.engine.SpecDecoder`.
        prompt: the run's prompt; settings: its ``generate`` keywords (method, k, verify, sampling).
        pairs: segment pairs (>= 1); segment_tokens: new tokens per segment (capped by the run's
            max_new_tokens); budget_s: no pair starts once this many seconds have passed (a busy
            machine then gets fewer pairs than asked, and ``n`` says how many ran).
        progress: called with (segments done, segments in all) after each segment.
        extra: more ``generate`` keywords for both methods (e.g. a frozen ``suffix_cache``, so that
            the segments neither learn from each other nor change the session's cache).
    Returns:
        the method-none summary pooled over its segments (:func:`summarize` fields) plus
        ``measurement``: {pairs, segment_tokens, ratios [pairs] (method tok/s / none tok/s, per
        pair), median, low, high, n, noisy, cost_s (seconds the measurement took),
        method_summary (the method's segments pooled)}.
    Raises:
        ValueError: pairs < 1 or segment_tokens < 1 (and whatever ``generate`` refuses).
    """
    if pairs < 1 or segment_tokens < 1:
        raise ValueError(f"pairs and segment_tokens must be >= 1, got {pairs} and {segment_tokens}")
    seg = dict(settings, max_new_tokens=min(int(settings.get("max_new_tokens", segment_tokens)), segment_tokens))
    # method none with the same sampling settings (with no drafts every verification rule samples from p)
    none = {key: seg[key] for key in _SAMPLING if key in seg}
    none.update(method="none", num_speculative_tokens=1, verify=None)
    t0 = time.perf_counter()
    runs: dict[str, list[Trace]] = {"method": [], "none": []}
    ratios = []
    for i in range(pairs):
        if i and time.perf_counter() - t0 > budget_s:
            break
        order = ("method", "none") if i % 2 == 0 else ("none", "method")
        pair = {}
        for j, which in enumerate(order):
            pair[which] = decoder.generate(prompt, **(seg if which == "method" else none), **extra)
            runs[which].append(pair[which])
            if progress is not None:
                progress(2 * i + j + 1, 2 * pairs)
        base = _decode_rate(pair["none"])
        ratios.append(_decode_rate(pair["method"]) / base if base > 0 else 0.0)
    summary = summarize(runs["none"])
    summary["measurement"] = {"pairs": pairs, "segment_tokens": seg["max_new_tokens"], "ratios": ratios,
                              **spread(ratios), "cost_s": time.perf_counter() - t0,
                              "method_summary": summarize(runs["method"]), "runner": _runners(runs)}
    return summary
