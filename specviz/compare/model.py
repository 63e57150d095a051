"""A comparison as plain data: configurations (method x k x verification x temperature x draft tree, with the
method's own options), prompts, seeds and one :class:`RunResult` (a :class:`~specviz.trace.Trace` plus its wall
time) per run; building one (:func:`new_comparison`, :func:`expand_configs`) and its running order (:func:`plan`).
Method none always runs in the same comparison, at every temperature used: speedups are never computed from a
cached or estimated baseline. Imports no gradio or plotly."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from specviz import methods
from specviz.config import CHAIN_ONLY, MAX_SPECULATIVE_TOKENS, VERIFY_METHODS, tree_refusal
from specviz.trace import Trace, TraceFormatError
from specviz.tree import DraftTree

COMPARISON_FORMAT = "specviz-comparison"
COMPARISON_VERSION = 1
MAX_COMPARISON_BYTES = 64 * 1024 * 1024  # imports above this are refused
MAX_RUNS = 2000


class ComparisonFormatError(TraceFormatError):
    """Raised when JSON is not a valid specviz comparison (the message says which field)."""


def method_options(method: str, options: dict[str, Any] | Sequence[tuple[str, Any]] | None) -> tuple[tuple[str, Any], ...]:
    """The entries of ``options`` that ``method`` takes (its ``Method.options`` fields), sorted: a configuration keeps
    only its own method's settings, so equal runs have equal configurations."""
    own = {f.name for f in methods.option_fields(methods.get(method).options)} if method in methods.names() else set()
    return tuple(sorted((k, v) for k, v in dict(options or {}).items() if k in own and v is not None))


@dataclass(frozen=True)
class RunConfig:
    """One row of the comparison: a method and its verification settings.

    method: a registered method name; num_speculative_tokens: k (1..32); verify: one of
    :data:`specviz.config.VERIFY_METHODS` (resolved: greedy at temperature 0, else standard, when None);
    temperature: >= 0; options: the method's own settings as sorted (name, value) pairs (e.g. prompt lookup's
    bounds); tree: the draft tree, "" for a chain, else one string of :meth:`specviz.tree.DraftTree.parse`'s forms
    ("4, 6, 32" EAGLE-2, "[(0,), (1,), (0, 0)]" a static tree, "2" branches per node)."""

    method: str
    num_speculative_tokens: int = 5
    verify: str | None = None
    temperature: float = 0.0
    options: tuple[tuple[str, Any], ...] = ()
    tree: str = ""

    def resolved(self) -> "RunConfig":
        """The same configuration with ``verify`` filled in (the engine's default), method none's k set to 1 (it
        drafts nothing) and only the method's own options, so equal runs have equal configurations."""
        verify = self.verify or ("greedy" if self.temperature == 0 else "standard")
        k = 1 if self.method == "none" else int(self.num_speculative_tokens)
        tree = " ".join(str(self.tree or "").split()) if self.method != "none" else ""
        return RunConfig(self.method, k, verify, float(self.temperature), method_options(self.method, self.options),
                         tree)

    @property
    def is_tree(self) -> bool:
        return bool(str(self.tree or "").strip())

    @property
    def draft_tree(self) -> DraftTree | None:
        """The parsed tree (None for a chain). Raises ValueError for an invalid one."""
        return DraftTree.parse(self.tree)

    @property
    def tree_label(self) -> str:
        """"" for a chain, else :attr:`specviz.tree.DraftTree.label` ("static tree (invalid)" / "tree (invalid)" for a
        tree that does not parse)."""
        if not self.is_tree:
            return ""
        try:
            return self.draft_tree.label
        except ValueError:
            return "static tree (invalid)" if str(self.tree).strip().startswith("[") else "tree (invalid)"

    @property
    def label(self) -> str:
        """Short name, e.g. ``ngram k=5 greedy T=0``, ``eagle3 tree 4,6,32 k=7 greedy T=0``."""
        if self.method == "none":
            return f"none T={self.temperature:g}"
        tree = f" {self.tree_label}" if self.is_tree else ""
        return f"{self.method}{tree} k={self.num_speculative_tokens} {self.verify} T={self.temperature:g}"

    def settings(self, seed: int, max_new_tokens: int) -> dict[str, Any]:
        """Keywords for ``SpecDecoder.generate``. Raises ValueError for a tree the method does not take."""
        out = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens, "verify": self.verify,
               "temperature": self.temperature, "seed": int(seed), "max_new_tokens": int(max_new_tokens),
               **dict(self.options)}
        tree = self.draft_tree
        if tree is not None:
            refusal = tree_refusal(self.method, tree.form)
            if refusal:
                raise ValueError(refusal)
            out.update(tree.settings(self.method))
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
    ``wall_s``, the seconds measured around the whole request (prefill included). ``timings``: the decode tokens/s
    of every timing of this request in running order when it was timed more than once (method none:
    :attr:`Comparison.baseline_timings`), the trace and ``wall_s`` being the median timing's; [] when timed once."""

    config: int
    prompt: int
    seed: int
    trace: Trace
    wall_s: float
    timings: list[float] = field(default_factory=list)


BASELINE_TIMINGS = 3  # method none's timings per prompt and seed, spread over the running order (median kept)
MAX_BASELINE_TIMINGS = 16


@dataclass
class Comparison:
    """Configurations x prompts x seeds -> runs. ``machine``: where it ran (device, torch, date).
    ``baseline_timings``: how often method none is timed per prompt and seed (:func:`plan`; 1 in comparisons
    saved before it was timed more than once)."""

    configs: list[RunConfig]
    prompts: list[Prompt]
    seeds: list[int]
    max_new_tokens: int
    runs: list[RunResult] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    baseline_timings: int = BASELINE_TIMINGS

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
                "configs": [_config_dict(c) for c in self.configs], "prompts": [asdict(p) for p in self.prompts],
                "seeds": list(self.seeds), "max_new_tokens": self.max_new_tokens, "machine": dict(self.machine),
                "baseline_timings": self.baseline_timings,
                "runs": [{"config": r.config, "prompt": r.prompt, "seed": r.seed, "wall_s": r.wall_s,
                          **({"timings": list(r.timings)} if r.timings else {}), "trace": r.trace.to_dict()}
                         for r in self.runs]}

    def to_json(self) -> str:
        """JSON text; :func:`specviz.compare.io.load_comparison` reads it back."""
        return json.dumps(self.to_dict(), allow_nan=False)


def _config_dict(c: RunConfig) -> dict[str, Any]:
    d = asdict(c)
    d["options"] = dict(c.options)
    return d


# ---- building ------------------------------------------------------------------------------
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


def expand_configs(chosen: Sequence[str], ks: Sequence[int], verifies: Sequence[str | None],
                   temperatures: Sequence[float], trees: Sequence[str] = (),
                   options: dict[str, Any] | None = None) -> list[RunConfig]:
    """The configurations of a comparison: methods x k x verification x temperature as chains, then for every tree
    in ``trees`` (:meth:`specviz.tree.DraftTree.parse`'s forms; "" and "chain" are skipped) each chosen method that
    drafts that form x verification x temperature, at k = the tree's depth (EAGLE-2: depth + 1; a static tree: its
    longest path) or, for branches per node, x every k. Trees get no row for chain-only verification. ``options``:
    settings of the methods' own (each configuration keeps its method's). Raises ValueError for a tree that none of
    the methods takes, or that is invalid."""
    out = [RunConfig(m, k, v, t, method_options(m, options)) for m in chosen for k in ks for v in verifies
           for t in temperatures]
    for spec in trees:
        spec = str(spec or "").strip()
        if spec.lower() in ("", "chain"):
            continue
        try:
            tree = DraftTree.parse(spec)
        except ValueError as exc:
            raise ValueError(f"the tree {spec!r} is not a draft tree: {exc}") from None
        taken = [m for m in chosen if tree_refusal(m, tree.form) is None]
        if not taken:
            raise ValueError(f"no chosen method takes the tree {spec!r}: "
                             f"{tree_refusal(chosen[0], tree.form) if chosen else 'choose a method'}")
        depth = tree.max_depth
        out += [RunConfig(m, k, v, t, method_options(m, options), spec) for m in taken
                for k in ([depth] if depth else ks) for v in verifies if v not in CHAIN_ONLY for t in temperatures]
        if all(v in CHAIN_ONLY for v in verifies):
            raise ValueError(f"the tree {spec!r} has no verification to run with: {', '.join(CHAIN_ONLY)} "
                             "are chain-only; add auto, greedy or standard")
    return out


def new_comparison(configs: Sequence[RunConfig], prompts: Sequence[Prompt | str], seeds: Sequence[int],
                   max_new_tokens: int = 64, baseline_timings: int = BASELINE_TIMINGS) -> Comparison:
    """A comparison with nothing run yet (method none timed ``baseline_timings`` times per prompt and seed:
    :func:`plan`). Raises ValueError on no configurations / prompts / seeds,
    an unknown method or verification, a bad k or temperature, or more than MAX_RUNS runs."""
    prompts = [p if isinstance(p, Prompt) else Prompt(f"prompt {i + 1}", str(p)) for i, p in enumerate(prompts)]
    if not configs or not prompts or not seeds:
        raise ValueError("a comparison needs at least one configuration, one prompt and one seed")
    for c in configs:
        if c.method not in methods.names():
            raise ValueError(f"unknown method {c.method!r}; choose from {', '.join(methods.names())}")
        if c.verify is not None and c.verify not in VERIFY_METHODS:
            raise ValueError(f"unknown verification {c.verify!r}; choose from {', '.join(VERIFY_METHODS)}")
        if not 1 <= int(c.num_speculative_tokens) <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be in 1..{MAX_SPECULATIVE_TOKENS}, got {c.num_speculative_tokens}")
        if not (isinstance(c.temperature, (int, float)) and c.temperature >= 0 and math.isfinite(c.temperature)):
            raise ValueError(f"temperature must be a number >= 0, got {c.temperature!r}")
        if c.is_tree:
            c.settings(0, max_new_tokens)  # a tree the method does not take: ValueError now, not mid-run
            if (c.verify or "") in CHAIN_ONLY:
                raise ValueError(f"{c.label}: verify={c.verify!r} is chain-only; a draft tree is verified with "
                                 "greedy (T = 0) or standard")
    if any(not p.text.strip() for p in prompts):
        raise ValueError("a prompt is empty: type some text or remove it")
    full = with_baselines(configs)
    seeds = sorted({int(s) for s in seeds})
    if len(full) * len(prompts) * len(seeds) > MAX_RUNS:
        raise ValueError(f"{len(full)} configurations x {len(prompts)} prompts x {len(seeds)} seeds is more than "
                         f"{MAX_RUNS} runs; use fewer")
    if not 1 <= int(baseline_timings) <= MAX_BASELINE_TIMINGS:
        raise ValueError(f"baseline_timings must be in 1..{MAX_BASELINE_TIMINGS}, got {baseline_timings}")
    return Comparison(list(full), list(prompts), seeds, int(max_new_tokens), baseline_timings=int(baseline_timings))


def plan(comparison: Comparison) -> list[tuple[int, int, int]]:
    """(config, prompt, seed) in running order: per prompt and seed, every configuration once, method none first and
    again between even shares of the others and after them (``comparison.baseline_timings`` times in all, 1 when
    it is the only configuration): a busy spell of the machine during one timing of method none then moves its
    median, which every speedup of that prompt and seed is measured against, far less than it moved one timing. A
    (config, prompt, seed) repeats in the list once per timing."""
    nones = [i for i, c in enumerate(comparison.configs) if c.method == "none"]
    others = [i for i, c in enumerate(comparison.configs) if c.method != "none"]
    shares = max(int(comparison.baseline_timings), 1) - 1 if others else 0
    order = list(nones)
    for j in range(shares):  # the others in ``shares`` contiguous, nearly equal parts (fewer others: some empty)
        order += others[j * len(others) // shares:(j + 1) * len(others) // shares] + nones
    order += [] if shares else others
    return [(c, p, s) for p in range(len(comparison.prompts)) for s in comparison.seeds for c in order]


