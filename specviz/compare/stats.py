"""Statistics on a comparison's pooled metrics: the steps of every run of a configuration are pooled and passed to
:meth:`specviz.trace.RunMetrics.pooled` (metric definitions live there only; pooling steps = summing vLLM's counters
over requests). On top of those counts: Wilson intervals of the conditional per-position rates, the speedup over
method none measured in the same comparison, the speedup Leviathan et al.'s cost model predicts from the measured
step costs, and the losslessness check (greedy: equal outputs; T > 0: a chi-square homogeneity test per position)."""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from specviz.compiled_graphs import runner_kind
from specviz.speedup import NOISY_IQR, spread
from specviz.trace import ACCEPTANCE_LENGTH_CONVENTIONS, RunMetrics, Trace

from .lossless import TIE_EXPLANATION, losslessness
from .model import Comparison, RunResult


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (scipy.stats.binomtest(...).proportion_ci,
    method "wilson"). (0, 1) when n = 0 (nothing observed)."""
    if n <= 0:
        return 0.0, 1.0
    from scipy.stats import binomtest

    ci = binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def pooled_metrics(traces: Sequence[Trace], num_speculative_tokens: int) -> RunMetrics:
    """:meth:`specviz.trace.RunMetrics.pooled` over every trace (vLLM's counters summed over requests:
    step-weighted, not a mean of per-request means)."""
    return RunMetrics.pooled(traces, num_speculative_tokens)


def predicted_speedup(m: RunMetrics, base_ms_per_step: float) -> float | None:
    """Speedup Leviathan et al. 2023's cost model predicts from this configuration's measured
    acceptance and drafting cost: E[tokens per step] / (1 + t_draft / t_step(none)), where
    E = (1 - g) + g (1 - a^(k+1)) / (1 - a), g = draft coverage, a = accepted / verified positions,
    k = mean draft length of drafting steps, t_draft = measured draft ms per step. It assumes, as the
    paper does, that verifying k+1 tokens costs one plain step and the sampler is free; the gap to the
    measured speedup is what those assumptions miss (see the time split). None without drafts."""
    steps, drafts = m.num_steps, m.num_drafts
    if not steps or not drafts or base_ms_per_step <= 0:
        return None
    a = m.num_accepted_tokens / max(sum(m.offered_per_position), 1)
    k = m.num_draft_tokens / drafts
    g = drafts / steps
    per_draft = k + 1 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)
    t_draft = m.time_ms.get("draft", 0.0) / steps
    return ((1 - g) + g * per_draft) / (1 + t_draft / base_ms_per_step)


def time_split(m: RunMetrics) -> dict[str, float]:
    """Milliseconds per verification step: draft, verify (target forward), sample (sampler + record)."""
    n = m.num_steps or 1
    return {part: float(m.time_ms.get(part, 0.0)) / n for part in ("draft", "verify", "sample")}


# ---- one-time costs inside the timings ------------------------------------------------------
SLOW_STEP_FACTOR = 10.0  # a step this many times the row's median step ...
SLOW_STEP_MIN_MS = 20.0  # ... and this many ms above it is marked: a compile or capture nobody reported


CELL_TIPS = {  # what a table cell holding the key means (the app's hover on the badge and the timing mark)
    "near-tie": "≈: the outputs differ only where the target's two best tokens are a near-tie. " + TIE_EXPLANATION,
    "✗ differs": "✗: a run's output differs from method none's where rounding cannot explain it (float32, a gap "
                 "above 4 ulps of the 16-bit dtype, or a token that was not the target's argmax): a bug to look for",
    "⚠ capture": "a timed step captured a CUDA graph or compiled a kernel (its seconds are kept out of the step "
                 "times; the comparison's warm-up did not reach that shape)",
    "runners differ": "this row's runs replayed compiled and uncompiled CUDA graphs (torch.compile swapped in "
                      "part way): its times mix two runners",
    "slow step": "a timed step took over 10x the row's median step: a one-time cost nobody reported (a compile, a "
                 "capture); it is inside the times and the speedup",
}


def timing_check(runs: Sequence[RunResult]) -> dict[str, Any]:
    """Does a row's timing contain a one-time cost? Two signs, read from its runs' steps:

    * capture: steps whose ``timings_ms["capture"]`` is set: the runners, verifier or proposer reported capturing a
      CUDA graph or compiling a kernel (:mod:`specviz.timing`); the engine kept those seconds out of the step times,
      but the first use fell inside a timed run (the comparison's warm-up did not cover it);
    * slow steps: a step whose draft + verify + sample time is over SLOW_STEP_FACTOR times the row's median step
      and SLOW_STEP_MIN_MS above it: a one-time cost nobody reported (an unreported compile, a capture), which IS in
      the step times and the speedup.

    * runners: runs that replayed compiled and others uncompiled CUDA graphs (``config.runner_compiled``).

    Returns {"capture_ms", "capture_steps", "slow_steps": [(prompt, seed, step, ms)], "mark": "" or a short mark for
    the time-split cell, "detail": a sentence ("" when clean)}."""
    steps = [(r, st, sum(st.timings_ms.get(b, 0.0) for b in ("draft", "verify", "sample")))
             for r in runs for st in r.trace.steps]
    captured = [(r, st) for r, st, _ in steps if st.timings_ms.get("capture", 0.0) > 0]
    capture_ms = sum(st.timings_ms["capture"] for _, st in captured)
    median = statistics.median([ms for _, _, ms in steps]) if steps else 0.0
    slow = [(r.prompt + 1, r.seed, st.index, ms) for r, st, ms in steps
            if ms > SLOW_STEP_FACTOR * median and ms > median + SLOW_STEP_MIN_MS]
    marks, details = [], []
    if captured:
        marks.append("⚠ capture")
        details.append(f"{len(captured)} step(s) captured CUDA graphs or compiled a kernel ({capture_ms:.0f} ms, kept "
                       "out of the step times: the first use was not warmed)")
    if slow:
        p, seed, i, ms = max(slow, key=lambda t: t[3])
        marks.append(f"⚠ {len(slow)} slow step(s)")
        details.append(f"{len(slow)} step(s) took over {SLOW_STEP_FACTOR:g}x the row's median step of {median:.2f} ms "
                       f"(slowest: prompt {p}, seed {seed}, step {i}, {ms:.0f} ms): likely a one-time cost that no one "
                       "reported, and it is in the step times and the speedup")
    runners = sorted({runner_kind(r.trace.config["runner_compiled"]) for r in runs
                      if r.trace.config.get("runner_compiled")})
    if len(runners) > 1:
        marks.append("⚠ runners differ")
        details.append(f"its runs replayed {' and '.join(runners)} CUDA graphs: the times mix two runners")
    return {"capture_ms": capture_ms, "capture_steps": len(captured), "slow_steps": slow, "mark": " ".join(marks),
            "detail": "; ".join(details)}


# ---- the table ----------------------------------------------------------------------------
def run_ratios(comparison: Comparison, runs: list[RunResult], base: int | None) -> list[float]:
    """Per (prompt, seed): this run's decode tokens/s ÷ method none's on the same prompt and seed (its median timing,
    :func:`~specviz.compare.model.plan`), in run order; [] without a baseline. Method none's own row:
    :func:`baseline_ratios` where it was timed more than once."""
    return [r for _, r in prompt_ratios(comparison, runs, base)]


def prompt_ratios(comparison: Comparison, runs: list[RunResult], base: int | None) -> list[tuple[int, float]]:
    """:func:`run_ratios` with each ratio's prompt index: [(prompt, ratio)]."""
    if base is None:
        return []
    if runs and runs[0].config == base and any(r.timings for r in runs):
        return [(-1, x) for x in baseline_ratios(runs)]
    base_runs = {(r.prompt, r.seed): r for r in comparison.runs_of(base)}
    out = []
    for r in runs:
        b = base_runs.get((r.prompt, r.seed))
        if b is None:
            continue
        mine, theirs = decode_rate(r.trace), decode_rate(b.trace)
        if mine > 0 and theirs > 0:
            out.append((r.prompt, mine / theirs))
    return out


def speedup_spread(comparison: Comparison, runs: list[RunResult], base: int | None) -> dict[str, Any] | None:
    """:func:`specviz.speedup.spread` of a drafting row's per-(prompt, seed) ratios, its ``noisy`` judged on the
    machine's noise alone, not on how the prompts differ (a repetitive prompt's 2x beside a docstring's 0.9x is a
    finding about the prompts; a lecturer read both as "noisy"). Noise: the spread of method none's own timings of one
    request (each ÷ that request's median timing) and of this row's repeats of one prompt (seeds at T = 0 decode the
    same request again; each ÷ the prompt's median; at T > 0 a seed is another request and is not counted); noisy
    when its whole range exceeds NOISY_IQR. Without either (none timed once, one seed at T = 0) the spread cannot be
    told apart and the old rule (all ratios) stays, with ``noise_known`` False. Adds noise, noise_n, noise_known,
    by_prompt [[prompt, median ratio, n]] and tpf_by_prompt [[prompt, tokens per target forward]] (pooled over the
    prompt's runs). On a steady machine, prompts whose median speedups differ by more than the noise allows
    (:func:`prompt_gap`) while their tokens per forward differ by less than half as much are called noisy, with
    ``unexplained`` = (speedup gap, tokens-per-forward gap): the timing moved between prompts, not the acceptance (two
    identical comparisons flagged a prompt effect in one and not the other)."""
    pairs = prompt_ratios(comparison, runs, base)
    if not pairs:
        return None
    s = spread([x for _, x in pairs])
    if runs and runs[0].config == base:  # method none's own row: its spread is the noise
        return {**s, "noise": None, "noise_n": s["n"], "noise_known": True, "by_prompt": []}
    by: dict[int, list[float]] = {}
    for p, x in pairs:
        by.setdefault(p, []).append(x)
    medians = {p: statistics.median(xs) for p, xs in by.items()}
    same_request = not comparison.configs[runs[0].config].temperature  # at T > 0 each seed is another request
    rel = [x / medians[p] for p, x in pairs if same_request and len(by[p]) > 1 and medians[p] > 0]
    rel += baseline_ratios([r for r in comparison.runs_of(base) if r.timings])
    tpf = {p: prompt_tpf([r for r in runs if r.prompt == p]) for p in sorted(by)}
    out = {**s, "by_prompt": [[p, medians[p], len(by[p])] for p in sorted(by)], "noise_n": len(rel),
           "tpf_by_prompt": [[p, tpf[p]] for p in sorted(by)]}
    if len(rel) < 2:
        return {**out, "noise": None, "noise_known": False}
    # the whole range, not the middle half: one request's timings 0.80-1.12 of their median is no steady machine, and
    # two identical comparisons then ranked the methods differently
    noise = max(rel) - min(rel)
    speed_gap, tpf_gap = prompt_gap(list(medians.values())), prompt_gap(list(tpf.values()))
    if noise <= NOISY_IQR and speed_gap > max(NOISY_IQR, 2 * noise) and tpf_gap < speed_gap / 2:
        return {**out, "noise": noise, "noise_known": True, "noisy": True, "unexplained": [speed_gap, tpf_gap]}
    return {**out, "noise": noise, "noise_known": True, "noisy": noise > NOISY_IQR}


def prompt_gap(values: list[float]) -> float:
    """(highest - lowest) / the median of per-prompt values (0.0 for fewer than two or a median of 0)."""
    if len(values) < 2:
        return 0.0
    mid = sorted(values)[len(values) // 2]
    return (max(values) - min(values)) / mid if mid > 0 else 0.0


def prompt_tpf(runs: list[RunResult]) -> float:
    """Tokens per target forward pooled over ``runs`` (committed tokens / verification steps; 0.0 without steps)."""
    return pooled_metrics([r.trace for r in runs], 1).tokens_per_target_forward


def baseline_ratios(runs: list[RunResult]) -> list[float]:
    """Every timing of method none's runs ÷ the run's kept (median) timing, in decode tokens/s: how far method none's
    speed moved between its timings of one prompt and seed while the comparison ran (1.0 for a run timed once)."""
    out = []
    for r in runs:
        kept = decode_rate(r.trace)
        out += [t / kept for t in r.timings] if r.timings and kept > 0 else [1.0]
    return out


def decode_rate(trace: Trace) -> float:
    """Tokens / decode time of one run, as :func:`pooled_row` pools them (0 without decode time)."""
    return pooled_metrics([trace], 1).decode_tokens_per_second


def pooled_row(comparison: Comparison, config: int) -> dict[str, Any]:
    """One row of the table: the configuration's pooled metrics and statistics (plain data).

    Keys: label, method, k, tree (the draft tree's spec, "" for a chain), tree_label, verify, temperature, runs, tokens, steps, tokens_per_target_forward,
    mean_acceptance_length (vLLM: 1 + accepted / drafts), acceptance_length ({convention: value} for
    every key of trace.ACCEPTANCE_LENGTH_CONVENTIONS), draft_coverage (drafts / steps),
    draft_acceptance_rate, conditional (per position: {rate, n, low, high}, Wilson 95 %),
    tokens_per_s (tokens / decode time), e2e_tokens_per_s (tokens / wall time incl. prefill),
    speedup (measured, over method none at the same temperature in this comparison),
    speedup_spread (:func:`speedup_spread`: median, low, high, n, noisy (the machine's noise), noise, by_prompt;
    None without a baseline),
    predicted_speedup (:func:`predicted_speedup`; None for a tree: its model is a chain's), ms_per_step {draft, verify, sample},
    step_cost (ms per step / method none's ms per step), timing (:func:`timing_check`: one-time costs inside the
    timed runs), lossless (:func:`~specviz.compare.lossless.losslessness`), head (:func:`head_of`),
    head_bundled (whether that head is the bundled one; None in traces that do not say)."""
    cfg = comparison.configs[config]
    runs = comparison.runs_of(config)
    m = pooled_metrics([r.trace for r in runs], cfg.num_speculative_tokens)
    tokens = m.num_generated_tokens
    base = comparison.baseline_of(config)
    bm = pooled_metrics([r.trace for r in comparison.runs_of(base)], 1) if base is not None else None
    base_tps = bm.decode_tokens_per_second if bm else 0.0
    base_ms = 1e3 * bm.decode_s / bm.num_steps if bm and bm.num_steps else 0.0
    tps = m.decode_tokens_per_second
    split = time_split(m)
    n_cond = m.offered_per_position if cfg.method != "none" else []
    conditional = [{"rate": a / n if n else None, "n": n, "low": wilson_interval(a, n)[0], "high": wilson_interval(a, n)[1]}
                   for a, n in zip(m.accepted_per_position, n_cond)]
    wall = sum(r.wall_s for r in runs)
    head = head_record(runs)
    return {
        "label": cfg.label, "method": cfg.method, "k": cfg.num_speculative_tokens, "tree": cfg.tree,
        "tree_label": cfg.tree_label,
        "verify": cfg.verify,
        "temperature": cfg.temperature, "runs": len(runs), "tokens": tokens, "steps": m.num_steps,
        "num_drafts": m.num_drafts, "num_draft_tokens": m.num_draft_tokens,
        "num_accepted_tokens": m.num_accepted_tokens,
        "tokens_per_target_forward": m.tokens_per_target_forward,
        "mean_acceptance_length": m.mean_acceptance_length if m.num_drafts else None,
        "acceptance_length": {c: m.acceptance_length(c) for c in ACCEPTANCE_LENGTH_CONVENTIONS},
        "draft_coverage": m.draft_coverage, "draft_acceptance_rate": m.draft_acceptance_rate if m.num_draft_tokens else None,
        "conditional": conditional, "tokens_per_s": tps, "e2e_tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "speedup": tps / base_tps if base_tps > 0 and runs else None,
        "speedup_spread": speedup_spread(comparison, runs, base),
        # the cost model is a chain's (one path of k drafts, i.i.d. acceptance): none for a tree's row
        "predicted_speedup": predicted_speedup(m, base_ms) if cfg.method != "none" and not cfg.is_tree else None,
        "ms_per_step": split,
        "step_cost": {k: v / base_ms for k, v in split.items()} if base_ms > 0 else {},
        "timing": timing_check(runs),
        "lossless": losslessness(comparison, config),
        "head": head_of(head), "head_bundled": head.get("bundled"),
    }


def spread_text(s: dict[str, Any] | None) -> str | None:
    """A row's ``speedup_spread`` in words: "0.92–1.61 (n 5)", with "noisy" when the ratios' middle half spans more
    than a quarter of their median; "n 1: one sample, unchecked"; None without one."""
    if not s or not s.get("n"):
        return None
    if s["n"] == 1:
        return "n 1: one sample, unchecked"
    return f"{s['low']:.2f}–{s['high']:.2f} (n {s['n']})" + (" noisy" if s.get("noisy") else "")


def head_record(runs: list) -> dict:
    """The head the runs drafted with: the first trace's ``config["head"]`` record ({} for a method without one, or a
    malformed record in an imported comparison)."""
    return next((h for r in runs if isinstance(h := r.trace.config.get("head"), dict)), {})


def head_of(rec: dict) -> str:
    """"layout path" of a :func:`head_record`, "" without one: a ``--head`` replaces the bundled head, and the table
    must say which one ran."""
    return " ".join(str(rec[k]) for k in ("format", "path") if rec.get(k))


def table(comparison: Comparison) -> list[dict[str, Any]]:
    """:func:`pooled_row` for every configuration that has finished runs, in configuration order."""
    return [pooled_row(comparison, i) for i in range(len(comparison.configs)) if comparison.runs_of(i)]


CSV_COLUMNS = ("label", "method", "k", "tree", "verify", "temperature", "runs", "tokens", "steps", "tokens_per_target_forward",
               "mean_acceptance_length", "draft_coverage", "draft_acceptance_rate", "conditional_acceptance",
               "tokens_per_s", "e2e_tokens_per_s", "speedup", "speedup_low", "speedup_high", "speedup_n",
               "predicted_speedup", "draft_ms_per_step",
               "verify_ms_per_step", "sample_ms_per_step", "timing_mark", "lossless", "head")


def _csv_cell(row: dict[str, Any], col: str) -> Any:
    if col == "conditional_acceptance":
        return " ".join(f"{c['rate']:.3f}[{c['low']:.3f},{c['high']:.3f}]n={c['n']}" if c["rate"] is not None
                        else f"-n={c['n']}" for c in row["conditional"])
    if col.endswith("_ms_per_step"):
        return f"{row['ms_per_step'][col.split('_')[0]]:.3f}"
    if col == "lossless":
        return row["lossless"]["badge"]
    if col == "timing_mark":
        return row["timing"]["mark"]
    if col in ("speedup_low", "speedup_high", "speedup_n"):  # the per-(prompt, seed) ratios' spread
        value = (row.get("speedup_spread") or {}).get(col.split("_")[1])
        return f"{value:.6g}" if isinstance(value, float) else ("" if value is None else value)
    value = row[col]
    return f"{value:.6g}" if isinstance(value, float) else ("" if value is None else value)


def table_csv(comparison: Comparison) -> str:
    """The table as CSV text, one row per configuration (conditional acceptance as
    ``rate[low,high]n=N`` per position, Wilson 95 %)."""
    import csv
    import io

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in table(comparison):
        writer.writerow([_csv_cell(row, c) for c in CSV_COLUMNS])
    return buf.getvalue()


