"""Statistics on a comparison's pooled metrics: the steps of every run of a configuration are pooled and passed to
:meth:`specviz.trace.RunMetrics.pooled` (metric definitions live there only; pooling steps = summing vLLM's counters
over requests). On top of those counts: Wilson intervals of the conditional per-position rates, the speedup over
method none measured in the same comparison, the speedup Leviathan et al.'s cost model predicts from the measured
step costs, and the losslessness check (greedy: equal outputs; T > 0: a chi-square homogeneity test per position)."""

from __future__ import annotations

import math
from typing import Any, Sequence

from specviz.speedup import spread
from specviz.trace import ACCEPTANCE_LENGTH_CONVENTIONS, RunMetrics, Trace

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


# ---- losslessness -------------------------------------------------------------------------
MIN_SEEDS = 10  # runs per prompt and arm below which the T > 0 check says "not enough samples"
MIN_EXPECTED = 5.0  # chi-square cells: tokens expected fewer times than this are merged (Cochran's rule)
ALPHA = 0.01  # the T > 0 check flags a row when its Bonferroni-adjusted p-value is below this
ENDED = -1  # the "token" of a run that stopped (EOS / max_new_tokens) before an output position


def losslessness(comparison: Comparison, config: int) -> dict[str, Any]:
    """The row's losslessness check, against method none's runs of the same prompts and seeds.

    Temperature 0: every run's output must equal method none's token for token ("equal" counts
    runs). Temperature > 0: :func:`distribution_test` (a two-sample chi-square test per prompt and
    output position of this row's tokens over the seeds against method none's, Bonferroni over the
    positions tested). verify "synthetic" is not lossless by design; the test is still run and
    reported. A passing test never proves losslessness: it finds biases large enough to show in the
    seeds run.

    Returns {"badge": short text, "detail": sentence, "ok": True/False/None (None: not checked),
    "test": :func:`distribution_test`'s dict at T > 0, else absent}."""
    cfg = comparison.configs[config]
    if cfg.method == "none":
        return {"badge": "baseline", "detail": "method none is the reference", "ok": None}
    base = comparison.baseline_of(config)
    pairs = [(r, comparison.find(base, r.prompt, r.seed)) for r in comparison.runs_of(config)] if base is not None else []
    pairs = [(r, b) for r, b in pairs if b is not None]
    synthetic = cfg.verify == "synthetic"
    if not pairs:
        if synthetic:
            return {"badge": "not lossless (synthetic)", "detail": "synthetic verification forces acceptance rates; "
                    "it is for speed studies and changes the output", "ok": False}
        return {"badge": "not checked", "detail": "no method-none run of the same prompts and seeds", "ok": None}
    if cfg.temperature == 0:
        out = _equality_check(pairs)
    else:
        out = _distribution_badge(distribution_test(pairs))
    if synthetic:
        out = {**out, "ok": False, "badge": f"not lossless (synthetic) · {out['badge']}",
               "detail": "synthetic verification forces acceptance rates (speed studies only). " + out["detail"]}
    return out


def _equality_check(pairs: list[tuple[RunResult, RunResult]]) -> dict[str, Any]:
    bad = [(r, _first_difference(r.trace.output_token_ids, b.trace.output_token_ids)) for r, b in pairs]
    bad = [(r, i) for r, i in bad if i is not None]
    if not bad:
        return {"badge": f"✓ equal ({len(pairs)}/{len(pairs)})",
                "detail": f"output equals method none's token for token in all {len(pairs)} runs", "ok": True}
    r, i = bad[0]
    return {"badge": f"✗ differs ({len(bad)}/{len(pairs)})",
            "detail": f"{len(bad)} of {len(pairs)} runs differ from method none (first: prompt {r.prompt + 1}, "
                      f"seed {r.seed}, at output token {i + 1})", "ok": False}


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def distribution_test(pairs: Sequence[tuple[RunResult, RunResult]]) -> dict[str, Any]:
    """Is this configuration's output distributed as method none's? ``pairs``: (run, method none's run
    of the same prompt and seed).

    Lossless verification makes the whole output sequence follow the target, so at every output
    position j the token (or "ended": the run stopped before j) has the same distribution under both
    methods. Per prompt with at least MIN_SEEDS seeds and per position j, the 2 x C table of counts
    (this row's runs, method none's runs) x (tokens seen at j) goes to scipy.stats.chi2_contingency
    (Pearson's chi-square test of homogeneity, no continuity correction); tokens expected fewer than
    MIN_EXPECTED times in a cell are merged into one column (folded into the smallest column if still too
    rare); positions left with one column carry no evidence and are not tested. The smallest p-value
    times the number of tables tested (Bonferroni, valid although positions of one run are dependent) is
    the row's p-value. The two arms are different runs, so they are independent samples; seeds shared
    between the arms do not make them paired.

    Returns {"status": "tested" | "not enough samples", "p": adjusted p-value or None, "min_p",
    "where": (prompt, position) of min_p (1-based position), "tables": tables tested, "prompts": prompts
    tested, "seeds": smallest seed count over tested prompts, "max_seeds": largest over all prompts}."""
    from scipy.stats import chi2_contingency

    by_prompt: dict[int, list[tuple[RunResult, RunResult]]] = {}
    for r, b in pairs:
        by_prompt.setdefault(r.prompt, []).append((r, b))
    results, tested_prompts, seeds = [], 0, []
    for prompt, group in sorted(by_prompt.items()):
        if len(group) < MIN_SEEDS:
            continue
        ours = [r.trace.output_token_ids for r, _ in group]
        theirs = [b.trace.output_token_ids for _, b in group]
        tables = 0
        for j in range(max(len(t) for t in ours + theirs)):
            table = _homogeneity_table([_at(t, j) for t in ours], [_at(t, j) for t in theirs])
            if table is None:
                continue
            stat = chi2_contingency(table, correction=False)
            results.append((float(stat.pvalue), prompt, j + 1))
            tables += 1
        tested_prompts += 1
        seeds.append(len(group))
    max_seeds = max((len(g) for g in by_prompt.values()), default=0)
    if not results:
        return {"status": "not enough samples", "p": None, "min_p": None, "where": None, "tables": 0,
                "prompts": tested_prompts, "seeds": min(seeds, default=max_seeds), "max_seeds": max_seeds}
    min_p, prompt, pos = min(results)
    return {"status": "tested", "p": min(1.0, min_p * len(results)), "min_p": min_p, "where": (prompt + 1, pos),
            "tables": len(results), "prompts": tested_prompts, "seeds": min(seeds), "max_seeds": max_seeds}


def _at(tokens: list[int], j: int) -> int:
    return tokens[j] if j < len(tokens) else ENDED


def _homogeneity_table(a: list[int], b: list[int]) -> list[list[int]] | None:
    """2 x C counts of ``a`` and ``b`` over their tokens, rare tokens merged so every expected cell
    count is >= MIN_EXPECTED; None when fewer than 2 columns remain (nothing to compare)."""
    n = len(a) + len(b)
    need = MIN_EXPECTED * n / min(len(a), len(b))  # a column total giving expected >= MIN_EXPECTED in both rows
    tokens = sorted(set(a) | set(b), key=lambda t: -(a.count(t) + b.count(t)))
    cols = [[a.count(t), b.count(t)] for t in tokens]
    keep = [c for c in cols if sum(c) >= need]
    rest = [sum(c[0] for c in cols if sum(c) < need), sum(c[1] for c in cols if sum(c) < need)]
    if sum(rest) >= need:
        keep.append(rest)
    elif sum(rest) and keep:
        keep[-1] = [keep[-1][0] + rest[0], keep[-1][1] + rest[1]]
    if len(keep) < 2:
        return None
    return [[c[0] for c in keep], [c[1] for c in keep]]


def _distribution_badge(test: dict[str, Any]) -> dict[str, Any]:
    if test["status"] != "tested":
        seeds = test["max_seeds"]
        why = (f"{seeds} seed(s) per prompt; the test needs at least {MIN_SEEDS}" if seeds < MIN_SEEDS else
               f"at no output position did two tokens (or a token and an early stop) each occur often enough "
               f"(expected >= {MIN_EXPECTED:g} times) over the {seeds} seeds")
        return {"badge": f"not enough samples ({seeds} seeds; run ≥ {MIN_SEEDS})" if seeds < MIN_SEEDS
                else "not enough samples", "detail": f"distribution check not run: {why}", "ok": None, "test": test}
    ok = test["p"] >= ALPHA
    prompt, pos = test["where"]
    detail = (f"two-sample chi-square test of the output token at each position against method none's, over "
              f"{test['seeds']} seeds x {test['prompts']} prompt(s): {test['tables']} (prompt, position) tables "
              f"tested, smallest p = {test['min_p']:.3g} (prompt {prompt}, output token {pos}), "
              f"Bonferroni-adjusted p = {test['p']:.3g} ({'below' if not ok else 'not below'} {ALPHA:g}). "
              f"A pass does not prove losslessness: it finds biases large enough to show in {test['seeds']} seeds")
    return {"badge": f"{'≈' if ok else '✗'} χ² per position p={test['p']:.2g} ({test['seeds']} seeds)",
            "detail": detail, "ok": ok, "test": test}


# ---- the table ----------------------------------------------------------------------------
def run_ratios(comparison: Comparison, runs: list[RunResult], base: int | None) -> list[float]:
    """Per (prompt, seed): this run's decode tokens/s ÷ method none's on the same prompt and seed (run next to it,
    :func:`plan`). Their spread says how far one pooled ratio can be trusted on this machine; [] without a baseline."""
    if base is None:
        return []
    base_runs = {(r.prompt, r.seed): r for r in comparison.runs_of(base)}
    out = []
    for r in runs:
        b = base_runs.get((r.prompt, r.seed))
        if b is None:
            continue
        mine, theirs = _decode_rate(r.trace), _decode_rate(b.trace)
        if mine > 0 and theirs > 0:
            out.append(mine / theirs)
    return out


def _decode_rate(trace: Trace) -> float:
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
    speedup_spread (:func:`specviz.speedup.spread` of :func:`run_ratios`: median, low, high, n, noisy; None
    without a baseline),
    predicted_speedup (:func:`predicted_speedup`; None for a tree: its model is a chain's), ms_per_step {draft, verify, sample},
    step_cost (ms per step / method none's ms per step), lossless (:func:`losslessness`)."""
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
    ratios = run_ratios(comparison, runs, base)
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
        "speedup_spread": spread(ratios) if ratios else None,
        # the cost model is a chain's (one path of k drafts, i.i.d. acceptance): none for a tree's row
        "predicted_speedup": predicted_speedup(m, base_ms) if cfg.method != "none" and not cfg.is_tree else None,
        "ms_per_step": split,
        "step_cost": {k: v / base_ms for k, v in split.items()} if base_ms > 0 else {},
        "lossless": losslessness(comparison, config),
    }


def table(comparison: Comparison) -> list[dict[str, Any]]:
    """:func:`pooled_row` for every configuration that has finished runs, in configuration order."""
    return [pooled_row(comparison, i) for i in range(len(comparison.configs)) if comparison.runs_of(i)]


CSV_COLUMNS = ("label", "method", "k", "tree", "verify", "temperature", "runs", "tokens", "steps", "tokens_per_target_forward",
               "mean_acceptance_length", "draft_coverage", "draft_acceptance_rate", "conditional_acceptance",
               "tokens_per_s", "e2e_tokens_per_s", "speedup", "speedup_low", "speedup_high", "speedup_n",
               "predicted_speedup", "draft_ms_per_step",
               "verify_ms_per_step", "sample_ms_per_step", "lossless")


def _csv_cell(row: dict[str, Any], col: str) -> Any:
    if col == "conditional_acceptance":
        return " ".join(f"{c['rate']:.3f}[{c['low']:.3f},{c['high']:.3f}]n={c['n']}" if c["rate"] is not None
                        else f"-n={c['n']}" for c in row["conditional"])
    if col.endswith("_ms_per_step"):
        return f"{row['ms_per_step'][col.split('_')[0]]:.3f}"
    if col == "lossless":
        return row["lossless"]["badge"]
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


