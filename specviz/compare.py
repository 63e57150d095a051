"""Method comparison: many configurations x prompts x seeds on one loaded decoder, pooled metrics.

A :class:`Comparison` is plain data: the configurations (method x k x verification x temperature),
the prompts, the seeds and one :class:`RunResult` (a :class:`~specviz.trace.Trace` plus its wall
time) per run. :func:`iter_comparison` runs them one after another on a loaded
:class:`~specviz.engine.SpecDecoder`, interleaved (prompt, seed, then every configuration, method
none first), yielding as each run finishes. Method none always runs in the same comparison, at every
temperature used: speedups are never computed from a cached or estimated baseline.

Pooled metrics (:func:`pooled_row`): the steps of every run of a configuration are pooled and passed
to :func:`specviz.trace.compute_metrics` (metric definitions live there only; pooling steps = summing
vLLM's counters over requests). On top of those counts this module adds statistics, not metrics:
Wilson intervals of the conditional per-position rates, the speedup over method none measured in the
same comparison, the speedup Leviathan et al.'s cost model predicts from the measured step costs, and
the losslessness check. Imports no gradio or plotly.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Sequence

from .speedup import spread
from .trace import (ACCEPTANCE_LENGTH_CONVENTIONS, Step, Trace, TraceFormatError, acceptance_length,
                    compute_metrics, load_json_capped)

COMPARISON_FORMAT = "specviz-comparison"
COMPARISON_VERSION = 1
MAX_COMPARISON_BYTES = 64 * 1024 * 1024  # imports above this are refused
MAX_RUNS = 2000
RULES = ("greedy", "standard", "block")  # verification rules of the "same draft, every rule" view


class ComparisonFormatError(TraceFormatError):
    """Raised when JSON is not a valid specviz comparison (the message says which field)."""


@dataclass(frozen=True)
class RunConfig:
    """One row of the comparison: a method and its verification settings.

    method: a name in ``specviz.engine.METHODS``; num_speculative_tokens: k (1..32); verify: "greedy" |
    "standard" | "block" | "synthetic" (resolved: greedy at temperature 0, else standard, when None);
    temperature: >= 0; prompt_lookup_min/max: methods ngram / ngram_gpu (None = vLLM's defaults);
    tree: the draft tree, "" for a chain, else one string in :func:`specviz.methods.draft_tree_settings`'s
    forms ("4, 6, 32" EAGLE-2, "[(0,), (1,), (0, 0)]" a static tree, "2" branches per node)."""

    method: str
    num_speculative_tokens: int = 5
    verify: str | None = None
    temperature: float = 0.0
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    tree: str = ""

    def resolved(self) -> "RunConfig":
        """The same configuration with ``verify`` filled in (the engine's default) and method none's
        k set to 1 (it drafts nothing), so equal runs have equal configurations."""
        verify = self.verify or ("greedy" if self.temperature == 0 else "standard")
        k = 1 if self.method == "none" else int(self.num_speculative_tokens)
        lookup = self.method in ("ngram", "ngram_gpu")
        tree = " ".join(str(self.tree or "").split()) if self.method != "none" else ""
        return RunConfig(self.method, k, verify, float(self.temperature),
                         self.prompt_lookup_min if lookup else None, self.prompt_lookup_max if lookup else None, tree)

    @property
    def is_tree(self) -> bool:
        return bool(str(self.tree or "").strip())

    @property
    def tree_label(self) -> str:
        """"" for a chain; "tree 4,6,32" (EAGLE-2), "static tree [(0,),(1,),(0,0)]" (the tree itself when it is short,
        else "static tree (9 nodes, depth 4, #1a2b)" with 4 hex digits of its spec's SHA-1: different trees get
        different labels unless those digits collide), "tree 2 branches"."""
        spec = str(self.tree or "").strip()
        if not spec:
            return ""
        if spec.startswith("["):
            from .tree import parse_choices

            try:
                paths = parse_choices(spec)
            except ValueError:
                return "static tree (invalid)"
            compact = "".join(spec.split())
            if len(compact) <= 32:  # the tree itself: two trees of one size stay apart in every view
                return f"static tree {compact}"
            digest = hashlib.sha1(compact.encode()).hexdigest()[:4]
            return f"static tree ({len(paths)} nodes, depth {max(len(p) for p in paths)}, #{digest})"
        if spec.isdigit():
            return f"tree {spec} branches"
        from .methods import eagle_tree_settings

        try:
            return "tree " + ",".join(str(v) for v in eagle_tree_settings(spec).values())
        except ValueError:
            return "tree (invalid)"

    @property
    def label(self) -> str:
        """Short name, e.g. ``ngram k=5 greedy T=0``, ``eagle3 tree 4,6,32 k=7 greedy T=0``."""
        if self.method == "none":
            return f"none T={self.temperature:g}"
        tree = f" {self.tree_label}" if self.is_tree else ""
        return f"{self.method}{tree} k={self.num_speculative_tokens} {self.verify} T={self.temperature:g}"

    def settings(self, seed: int, max_new_tokens: int) -> dict[str, Any]:
        """Keywords for ``SpecDecoder.generate``. Raises ValueError for a tree the method does not take."""
        from .methods import draft_tree_settings

        out = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens, "verify": self.verify,
               "temperature": self.temperature, "seed": int(seed), "max_new_tokens": int(max_new_tokens)}
        if self.method in ("ngram", "ngram_gpu"):
            out.update(prompt_lookup_min=self.prompt_lookup_min, prompt_lookup_max=self.prompt_lookup_max)
        out.update(draft_tree_settings(self.method, self.tree))
        return out


@dataclass(frozen=True)
class Prompt:
    """A prompt of the comparison: name, category (e.g. "code completion"), text."""

    name: str
    text: str
    category: str = ""


@dataclass
class RunResult:
    """One finished run: indices into the comparison's configs and prompts, the seed, the trace and
    ``wall_s``, the seconds measured around the whole request (prefill included)."""

    config: int
    prompt: int
    seed: int
    trace: Trace
    wall_s: float


@dataclass
class Comparison:
    """Configurations x prompts x seeds -> runs. ``machine``: where it ran (device, torch, date)."""

    configs: list[RunConfig]
    prompts: list[Prompt]
    seeds: list[int]
    max_new_tokens: int
    runs: list[RunResult] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)

    def runs_of(self, config: int) -> list[RunResult]:
        return [r for r in self.runs if r.config == config]

    def find(self, config: int, prompt: int, seed: int) -> RunResult | None:
        return next((r for r in self.runs if (r.config, r.prompt, r.seed) == (config, prompt, seed)), None)

    def baseline_of(self, config: int) -> int | None:
        """Index of the method-none configuration at the same temperature (None if absent)."""
        t = self.configs[config].temperature
        return next((i for i, c in enumerate(self.configs) if c.method == "none" and c.temperature == t), None)

    # ---- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"format": COMPARISON_FORMAT, "version": COMPARISON_VERSION,
                "configs": [asdict(c) for c in self.configs], "prompts": [asdict(p) for p in self.prompts],
                "seeds": list(self.seeds), "max_new_tokens": self.max_new_tokens, "machine": dict(self.machine),
                "runs": [{"config": r.config, "prompt": r.prompt, "seed": r.seed, "wall_s": r.wall_s,
                          "trace": r.trace.to_dict()} for r in self.runs]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=False)

    @classmethod
    def from_json(cls, text: str | bytes, max_bytes: int = MAX_COMPARISON_BYTES) -> "Comparison":
        """Parse and validate a comparison as data (nothing is executed). Raises
        :class:`ComparisonFormatError` (a ValueError) naming the bad field, also for input over
        ``max_bytes``."""
        return cls.from_dict(load_json_capped(text, max_bytes, "comparison", ComparisonFormatError))

    @classmethod
    def from_dict(cls, data: Any) -> "Comparison":
        from ._compare_io import comparison_from_dict

        return comparison_from_dict(data)


# ---- building and running ----------------------------------------------------------------
def with_baselines(configs: Sequence[RunConfig]) -> list[RunConfig]:
    """The resolved configurations, duplicates dropped, with a method-none configuration added
    (first) for every temperature that has none."""
    out: list[RunConfig] = []
    for c in (c.resolved() for c in configs):
        if c not in out:
            out.append(c)
    for t in sorted({c.temperature for c in out}, reverse=True):
        if not any(c.method == "none" and c.temperature == t for c in out):
            out.insert(0, RunConfig("none", 1, "greedy" if t == 0 else "standard", t))
    return out


def expand_configs(methods: Sequence[str], ks: Sequence[int], verifies: Sequence[str | None],
                   temperatures: Sequence[float], trees: Sequence[str] = (),
                   lookup: tuple[int | None, int | None] = (None, None)) -> list[RunConfig]:
    """The configurations of a comparison: methods x k x verification x temperature as chains, then for every
    tree in ``trees`` (:func:`specviz.methods.draft_tree_settings`'s forms; "" and "chain" are skipped) each
    chosen method that takes that form x verification x temperature, at k = the tree's depth (EAGLE-2: depth + 1;
    a static tree: its longest path) or, for branches per node (ngram, suffix), x every k. Trees get no row for
    block or synthetic verification (chain-only). ``lookup``: prompt_lookup_min / max for the n-gram methods.
    Raises ValueError for a tree that none of the methods takes, or that is invalid."""
    from .methods import draft_tree_depth, draft_tree_settings

    out = [RunConfig(m, k, v, t, *lookup) for m in methods for k in ks for v in verifies for t in temperatures]
    for spec in trees:
        spec = str(spec or "").strip()
        if spec.lower() in ("", "chain"):
            continue
        taken, why = [], []
        for m in methods:
            try:
                depth = draft_tree_depth(draft_tree_settings(m, spec))
            except ValueError as exc:
                why.append(str(exc))
                continue
            taken.append(m)
            out += [RunConfig(m, k, v, t, *lookup, spec) for k in ([depth] if depth else ks)
                    for v in verifies if v not in ("block", "synthetic") for t in temperatures]
        if not taken:
            # a method that takes this form but could not read it (e.g. "4,6" for eagle3) says so first
            why.sort(key=lambda w: "applies to" in w)
            raise ValueError(f"no chosen method takes the tree {spec!r}: {why[0] if why else 'choose a method'}")
        if all(v in ("block", "synthetic") for v in verifies):
            raise ValueError(f"the tree {spec!r} has no verification to run with: block and synthetic are chain-only; "
                             "add auto, greedy or standard")
    return out


def new_comparison(configs: Sequence[RunConfig], prompts: Sequence[Prompt | str], seeds: Sequence[int],
                   max_new_tokens: int = 64) -> Comparison:
    """A comparison with nothing run yet. Raises ValueError on no configurations / prompts / seeds,
    an unknown method or verification, a bad k or temperature, or more than MAX_RUNS runs."""
    from .engine import MAX_SPECULATIVE_TOKENS, METHODS, VERIFY_METHODS

    prompts = [p if isinstance(p, Prompt) else Prompt(f"prompt {i + 1}", str(p)) for i, p in enumerate(prompts)]
    if not configs or not prompts or not seeds:
        raise ValueError("a comparison needs at least one configuration, one prompt and one seed")
    for c in configs:
        if c.method not in METHODS:
            raise ValueError(f"unknown method {c.method!r}; choose from {', '.join(METHODS)}")
        if c.verify is not None and c.verify not in VERIFY_METHODS:
            raise ValueError(f"unknown verification {c.verify!r}; choose from {', '.join(VERIFY_METHODS)}")
        if not 1 <= int(c.num_speculative_tokens) <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be in 1..{MAX_SPECULATIVE_TOKENS}, got {c.num_speculative_tokens}")
        if not (isinstance(c.temperature, (int, float)) and c.temperature >= 0 and math.isfinite(c.temperature)):
            raise ValueError(f"temperature must be a number >= 0, got {c.temperature!r}")
        if c.is_tree:
            c.settings(0, max_new_tokens)  # a tree the method does not take: ValueError now, not mid-run
            if (c.verify or "") in ("block", "synthetic"):
                raise ValueError(f"{c.label}: verify={c.verify!r} is chain-only; a draft tree is verified with "
                                 "greedy (T = 0) or standard")
    if any(not p.text.strip() for p in prompts):
        raise ValueError("a prompt is empty: type some text or remove it")
    full = with_baselines(configs)
    seeds = sorted({int(s) for s in seeds})
    if len(full) * len(prompts) * len(seeds) > MAX_RUNS:
        raise ValueError(f"{len(full)} configurations x {len(prompts)} prompts x {len(seeds)} seeds is more than "
                         f"{MAX_RUNS} runs; use fewer")
    return Comparison(list(full), list(prompts), seeds, int(max_new_tokens))


def plan(comparison: Comparison) -> list[tuple[int, int, int]]:
    """(config, prompt, seed) in running order: per prompt and seed, every configuration (method none
    first), so slow drift of the machine's speed affects every configuration alike."""
    order = sorted(range(len(comparison.configs)), key=lambda i: comparison.configs[i].method != "none")
    return [(c, p, s) for p in range(len(comparison.prompts)) for s in comparison.seeds for c in order]


def iter_comparison(decoder: Any, comparison: Comparison, stop: threading.Event | None = None) -> Iterator[RunResult]:
    """Run every (config, prompt, seed) of :func:`plan` not yet in ``comparison.runs`` on ``decoder``
    (a loaded SpecDecoder), appending each result to ``comparison.runs`` and yielding it. A set
    ``stop`` ends the comparison after the current run. Each run starts from :func:`fresh_request_state`: no
    figure depends on what ran before (suffix's tree of earlier outputs is empty). Raises ValueError for settings or prompts the
    engine refuses, naming the configuration, prompt and seed (the runs before it are kept)."""
    import torch

    if not comparison.machine:
        comparison.machine = {"device": str(decoder.device), "torch": torch.__version__,
                              "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    done = {(r.config, r.prompt, r.seed) for r in comparison.runs}
    for c, p, s in plan(comparison):
        if (c, p, s) in done:
            continue
        if stop is not None and stop.is_set():
            return
        t0 = time.perf_counter()
        try:
            trace = decoder.generate(comparison.prompts[p].text, **comparison.configs[c].settings(s, comparison.max_new_tokens),
                                     **fresh_request_state(comparison.configs[c].method))
        except ValueError as exc:
            raise ValueError(f"{comparison.configs[c].label} on prompt {p + 1} ({comparison.prompts[p].name!r}), "
                             f"seed {s}: {exc}") from None
        result = RunResult(c, p, s, trace, time.perf_counter() - t0)
        comparison.runs.append(result)
        yield result


def fresh_request_state(method: str) -> dict[str, Any]:
    """The per-request state a comparison run starts from: a method that drafts from earlier requests' outputs
    (suffix's global tree) gets an empty one, so no row depends on what ran before it, in this comparison or on
    this server (the decoder's own tree and a browser session's are never read)."""
    if method == "suffix":
        from .proposers.suffix import GlobalSuffixCache

        return {"suffix_cache": GlobalSuffixCache()}
    return {}


def run_comparison(decoder: Any, comparison: Comparison) -> Comparison:
    """Run the whole comparison (see :func:`iter_comparison`) and return it."""
    for _ in iter_comparison(decoder, comparison):
        pass
    return comparison


# ---- statistics on pooled metrics ---------------------------------------------------------
def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (scipy.stats.binomtest(...).proportion_ci,
    method "wilson"). (0, 1) when n = 0 (nothing observed)."""
    if n <= 0:
        return 0.0, 1.0
    from scipy.stats import binomtest

    ci = binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def pooled_metrics(traces: Sequence[Trace], num_speculative_tokens: int) -> dict[str, Any]:
    """trace.py's metrics over the steps of every trace pooled (vLLM's counters summed over requests:
    step-weighted, not a mean of per-request means)."""
    steps: list[Step] = [s for t in traces for s in t.steps]
    return compute_metrics(steps, num_speculative_tokens)


def tokens_per_target_forward(m: dict[str, Any]) -> float:
    """Tokens per target forward (verification steps; the prefill is not counted), read from trace.py's
    metrics by name ("tokens_per_target_forward" where defined, else its equal "tokens_per_step")."""
    return float(m.get("tokens_per_target_forward", m.get("tokens_per_step", 0.0)))


def decode_seconds(m: dict[str, Any]) -> float:
    """Engine time of the decode loop (draft + verify + sample), seconds; prefill excluded."""
    return sum(float(v) for v in m.get("time_ms", {}).values()) / 1e3


def predicted_speedup(m: dict[str, Any], base_ms_per_step: float) -> float | None:
    """Speedup Leviathan et al. 2023's cost model predicts from this configuration's measured
    acceptance and drafting cost: E[tokens per step] / (1 + t_draft / t_step(none)), where
    E = (1 - g) + g (1 - a^(k+1)) / (1 - a), g = draft coverage, a = accepted / verified positions,
    k = mean draft length of drafting steps, t_draft = measured draft ms per step. It assumes, as the
    paper does, that verifying k+1 tokens costs one plain step and the sampler is free; the gap to the
    measured speedup is what those assumptions miss (see the time split). None without drafts."""
    steps, drafts = m["num_steps"], m["num_drafts"]
    if not steps or not drafts or base_ms_per_step <= 0:
        return None
    a = m["num_accepted_tokens"] / max(sum(m["offered_per_position"]), 1)
    k = m["num_draft_tokens"] / drafts
    g = drafts / steps
    per_draft = k + 1 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)
    t_draft = m["time_ms"].get("draft", 0.0) / steps
    return ((1 - g) + g * per_draft) / (1 + t_draft / base_ms_per_step)


def time_split(m: dict[str, Any]) -> dict[str, float]:
    """Milliseconds per verification step: draft, verify (target forward), sample (sampler + record)."""
    n = m["num_steps"] or 1
    return {part: float(m["time_ms"].get(part, 0.0)) / n for part in ("draft", "verify", "sample")}


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
    m = pooled_metrics([trace], 1)
    dec = decode_seconds(m)
    return m["num_generated_tokens"] / dec if dec > 0 else 0.0


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
    tokens = m["num_generated_tokens"]
    dec = decode_seconds(m)
    base = comparison.baseline_of(config)
    bm = pooled_metrics([r.trace for r in comparison.runs_of(base)], 1) if base is not None else None
    base_tps = bm["num_generated_tokens"] / decode_seconds(bm) if bm and decode_seconds(bm) > 0 else 0.0
    base_ms = 1e3 * decode_seconds(bm) / bm["num_steps"] if bm and bm["num_steps"] else 0.0
    tps = tokens / dec if dec > 0 else 0.0
    split = time_split(m)
    n_cond = m["offered_per_position"] if cfg.method != "none" else []
    conditional = [{"rate": a / n if n else None, "n": n, "low": wilson_interval(a, n)[0], "high": wilson_interval(a, n)[1]}
                   for a, n in zip(m["accepted_per_position"], n_cond)]
    wall = sum(r.wall_s for r in runs)
    ratios = run_ratios(comparison, runs, base)
    return {
        "label": cfg.label, "method": cfg.method, "k": cfg.num_speculative_tokens, "tree": cfg.tree,
        "tree_label": cfg.tree_label,
        "verify": cfg.verify,
        "temperature": cfg.temperature, "runs": len(runs), "tokens": tokens, "steps": m["num_steps"],
        "num_drafts": m["num_drafts"], "num_draft_tokens": m["num_draft_tokens"],
        "num_accepted_tokens": m["num_accepted_tokens"],
        "tokens_per_target_forward": tokens_per_target_forward(m),
        "mean_acceptance_length": m["mean_acceptance_length"] if m["num_drafts"] else None,
        "acceptance_length": {c: acceptance_length(m, c) for c in ACCEPTANCE_LENGTH_CONVENTIONS},
        "draft_coverage": m["draft_coverage"], "draft_acceptance_rate": m["draft_acceptance_rate"] if m["num_draft_tokens"] else None,
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


# ---- the same draft, every rule -----------------------------------------------------------
def same_draft_rules(trace: Trace) -> dict[str, list[int | None]]:
    """How many draft tokens of each recorded step greedy, standard and block verification accept
    on the SAME drafts and the SAME uniforms (the trace's u_i; block's eta_i = u_i), computed from the
    recorded p_i(x_i), q_i(x_i) and argmax p_i (algorithms.md; the rules of
    ``specviz/sampling/reference.py``):

    * greedy: the longest prefix with x_i = argmax p_i;
    * standard: the longest prefix with u_i <= min(1, p_i(x_i) / q_i(x_i));
    * block: tau = the last i with u_i <= h_i. h needs sum_x max(P_i p_{i+1}(x) - q_{i+1}(x), 0):
      closed form for one-hot drafts (ngram, suffix, greedy draft model); for full q only the block
      run's own recorded h is available, so block is None for full-q steps of other rules.

    Each step keeps the recorded run's context: this is a per-step replay of one draft stream, not
    three full decodes. Steps without a draft give 0 for every rule. Needs a detailed trace of a
    run at temperature > 0 verified with standard or block (greedy runs record no uniforms:
    standard and block are then None). Returns {rule: [accepted per step]}."""
    out: dict[str, list[int | None]] = {rule: [] for rule in RULES}
    for s in trace.steps:
        for rule in RULES:
            out[rule].append(_rule_accepts(s, rule, trace.config))
    return out


def _rule_accepts(step: Step, rule: str, config: dict[str, Any]) -> int | None:
    pos = step.positions
    if not step.draft_token_ids:
        return 0
    if len(pos) != len(step.draft_token_ids):
        return None  # a brief trace (detailed_trace=False) has no per-position data
    if rule == "greedy":
        n = 0
        for x, p in zip(step.draft_token_ids, pos):
            if not p.p_top or int(p.p_top[0][0]) != x:
                break
            n += 1
        return n
    if config.get("verify") == "greedy":
        return None  # no uniforms were drawn
    if rule == "standard":
        n = 0
        for p in pos:
            if p.u > p.accept_prob:
                break
            n += 1
        return n
    h = _block_h(step)
    if h is None:
        return None
    return max([i + 1 for i, (p, hi) in enumerate(zip(pos, h)) if p.u <= hi], default=0)


def _block_h(step: Step) -> list[float] | None:
    """Block verification's h_1..h_k' for ``step``: recorded when the step was block-verified, else
    the one-hot closed form (q_i(x_i) = 1 at every position), else None."""
    if step.block and step.block.get("h"):
        return [float(v) for v in step.block["h"][: len(step.positions)]]
    if any(p.q != 1.0 for p in step.positions):
        return None
    P, out = 1.0, []
    Ps = []
    for p in step.positions:
        P = min(1.0, P * p.p) if P > 0 else 0.0
        Ps.append(P)
    for i, P in enumerate(Ps):
        if i == len(Ps) - 1:
            out.append(P)
            continue
        rho = P * (1.0 - step.positions[i + 1].p)
        denom = rho + 1.0 - P
        out.append(1.0 if denom == 0 else rho / denom)
    return out
