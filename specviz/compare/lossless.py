"""Is a configuration lossless? Its outputs against method none's runs of the same prompts and seeds.

Temperature 0: the outputs must be equal token for token; where a run differs, :func:`near_tie` reads the target's
top-2 logits both decoders recorded at the first differing position (``Step.logit_top2``) and tells a rounding
flip of a near-tie from a bug. Temperature > 0: a chi-square homogeneity test per prompt and output position
(:func:`distribution_test`). Plain data in, plain data out; imports no torch.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from specviz.trace import Trace

from .model import Comparison, RunResult


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
        out["detail"] += _divergence_note(pairs)
    if synthetic:
        out = {**out, "ok": False, "badge": f"not lossless (synthetic) · {out['badge']}",
               "detail": "synthetic verification forces acceptance rates (speed studies only). " + out["detail"]}
    return out


def _equality_check(pairs: list[tuple[RunResult, RunResult]]) -> dict[str, Any]:
    """T = 0: equal outputs, or differences that are all :func:`near_tie` flips ("≈", ok True, near_tie True), or
    a difference that is not ("✗", ok False)."""
    diffs = [(r, b, _first_difference(r.trace.output_token_ids, b.trace.output_token_ids)) for r, b in pairs]
    diffs = [(r, b, i, near_tie(r.trace, b.trace, i)) for r, b, i in diffs if i is not None]
    n = len(pairs)
    if not diffs:
        return {"badge": f"✓ equal ({n}/{n})",
                "detail": f"output equals method none's token for token in all {n} runs", "ok": True}
    bugs = [(r, i, tie) for r, _, i, tie in diffs if not tie["near_tie"]]
    if bugs:
        r, i, tie = bugs[0]
        return {"badge": f"✗ differs ({len(bugs)}/{n})",
                "detail": f"{len(bugs)} of {n} runs differ from method none where rounding cannot explain it (first: "
                          f"prompt {r.prompt + 1}, seed {r.seed}, at output token {i + 1}: {tie['why']})",
                "ok": False, "near_tie": False}
    r, _, i, tie = diffs[0]
    more = f", {len(diffs) - 1} more run(s) likewise" if len(diffs) > 1 else ""
    return {"badge": f"≈ equal: {SHORT_DTYPE.get(tie['dtype'], tie['dtype'])} near-tie at token {i + 1} (gap {_g(tie['gap'][0])} / {_g(tie['gap'][1])})",
            "detail": f"{len(diffs)} of {n} runs differ from method none only at a near-tie of the target's top-2 logits "
                      f"(first: prompt {r.prompt + 1}, seed {r.seed}, output token {i + 1}: {tie['why']}{more}). "
                      + TIE_EXPLANATION, "ok": True, "near_tie": True}


def _divergence_note(pairs: list[tuple[RunResult, RunResult]]) -> str:
    """T > 0: how many runs' outputs differ from method none's run of the same seed, and how many of those first
    differ at a :func:`near_tie` (where even greedy decoding could flip). Differing is expected here: the drafts
    change which random numbers decide each token, so only the distributions are compared."""
    diffs = [(r, b, _first_difference(r.trace.output_token_ids, b.trace.output_token_ids)) for r, b in pairs]
    diffs = [(r, b, i) for r, b, i in diffs if i is not None]
    if not diffs:
        return f". All {len(pairs)} runs equal method none's run of the same seed"
    ties = sum(near_tie(r.trace, b.trace, i)["near_tie"] for r, b, i in diffs)
    return (f". {len(diffs)} of {len(pairs)} runs differ from method none's run of the same seed (expected at T > 0: "
            f"the drafts change which random numbers decide each token); {ties} of them first differ at a near-tie "
            f"of the target's top-2 logits")


def _g(gap: float) -> str:
    return f"{gap:.3g}"


NEAR_TIE_ULPS = 4  # the largest top-2 gap a rounding flip explains, in ulps of the logits' magnitude (near_tie)
SIGNIFICAND_BITS = {"bfloat16": 8, "float16": 11}  # of the 16-bit dtypes whose forwards may round differently
SHORT_DTYPE = {"bfloat16": "bf16", "float16": "fp16"}
TIE_EXPLANATION = ("Greedy verification is lossless in exact arithmetic; in 16-bit floats a verify forward of k + 1 "
                   "rows and a 1-row forward run different GEMM kernels, which sum in a different order, so the "
                   "target's logits differ by a few ulps and two tokens whose logits are that close can swap. After "
                   "that token the two outputs continue from different prefixes.")


def tie_bound(logit: float, dtype: str) -> float | None:
    """The largest top-2 logit gap a rounding difference between two forwards of ``dtype`` explains:
    NEAR_TIE_ULPS ulps of ``dtype`` at max(|logit|, 1) (ulp(x) = 2^(floor(log2 x) - (significand bits - 1)); bf16:
    0.125 at 16 <= |x| < 32, so the bound is 0.5 there). Why 4: each decoder rounds each of the two logits to
    ``dtype`` once (up to 1 ulp apart between decoders, 2 on their gap), and the hidden state both logits are
    computed from is itself a 16-bit result of differently ordered reductions, contributing at least as much again.
    None for float32 and any other dtype: there the two decoders must agree exactly (a difference is a bug)."""
    bits = SIGNIFICAND_BITS.get(str(dtype).replace("torch.", ""))
    if bits is None:
        return None
    exponent = math.frexp(max(abs(float(logit)), 1.0))[1] - 1  # floor(log2 |logit|)
    return NEAR_TIE_ULPS * 2.0 ** (exponent - (bits - 1))


def logit_top2_of(trace: Trace) -> list[list[float]] | None:
    """The trace's ``Step.logit_top2`` rows concatenated, one per output token (None when a step lacks them)."""
    rows = [r for s in trace.steps for r in s.logit_top2]
    return rows if len(rows) == len(trace.output_token_ids) and rows else None


def near_tie(run: Trace, base: Trace, i: int) -> dict[str, Any]:
    """Is the first difference of ``run``'s output from ``base``'s (method none's, same prompt and seed), at output
    token ``i`` (0-based), a rounding flip of a near-tie? Yes iff both traces recorded their top-2 logits there,
    in EACH the two tokens the decoders chose are its top-2, its own token its top-1 (or tied), and its top-2 gap
    is within :func:`tie_bound` of the models' dtype (config ``dtype``). A decoder that emitted a token that is not
    its own argmax, a token outside the top-2, a gap above the bound, float32 models, or traces without the logits:
    not a near-tie (the badge says ✗).

    Returns {"near_tie": bool, "gap": (run's gap, base's gap) or None, "bound": float or None, "dtype",
    "why": a sentence}."""
    dtype = str(run.config.get("dtype", ""))
    out = {"near_tie": False, "gap": None, "bound": None, "dtype": dtype}
    a, b = run.output_token_ids, base.output_token_ids
    if i >= len(a) or i >= len(b):
        return {**out, "why": "one output ended where the other went on"}
    tops = [logit_top2_of(run), logit_top2_of(base)]
    if tops[0] is None or tops[1] is None:
        return {**out, "why": "the traces hold no top-2 logits to check a near-tie with"}
    gaps, bound = [], None
    for mine, other, top in ((a[i], b[i], tops[0][i]), (b[i], a[i], tops[1][i])):
        t1, l1, t2, l2 = top
        gaps.append(l1 - l2)
        bound = max(bound or 0.0, tie_bound(max(abs(l1), abs(l2)), dtype) or 0.0)
        if {mine, other} != {int(t1), int(t2)} or (mine != int(t1) and l1 != l2):
            return {**out, "gap": tuple(gaps), "why": f"token {mine} was emitted where the target's top-2 were "
                    f"{int(t1)} ({l1:.4g}) and {int(t2)} ({l2:.4g}), the other decoder's token being {other}"}
    out.update(gap=tuple(gaps), bound=bound)
    if tie_bound(1.0, dtype) is None:
        return {**out, "why": f"{dtype or 'these'} logits must agree exactly between forwards (top-2 gaps "
                f"{_g(gaps[0])} / {_g(gaps[1])})"}
    if max(gaps) > bound:
        return {**out, "why": f"top-2 gaps {_g(gaps[0])} / {_g(gaps[1])} exceed {NEAR_TIE_ULPS} {dtype} ulps "
                f"({_g(bound)})"}
    return {**out, "near_tie": True, "why": f"tokens {a[i]} / {b[i]}, top-2 logit gap {_g(gaps[0])} here and "
            f"{_g(gaps[1])} in method none, within {NEAR_TIE_ULPS} {dtype} ulps ({_g(bound)})"}


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
