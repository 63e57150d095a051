"""One place per speculative method: the registry the engine, CLI and UI read.

Each method is its own proposer module (``specviz/proposers/``) plus one :func:`register` call
here, naming: the factory that builds its proposer for a request, what it needs from the decoder
(a draft model, a head) and the message when that is missing, the generate() settings it takes
beyond k and sampling, the extra config it records in the trace, its clean-up after a request,
and the ``kind`` of the details its drafts record (``Draft.details``, the trace's ``step.match``),
which the view registry (:mod:`specviz.viz.source`) draws. The target feature taps a method needs
are declared by its proposer (``Proposer.taps``: a head's taps depend on its config).
Method names are vLLM's (``--speculative-config method=...``). No gradio / plotly here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from .proposers import DraftModelProposer, NgramProposer, resolve_lookup_bounds
from .proposers.base import Proposer
from .proposers.ngram_gpu import NgramGPUProposer
from .proposers.suffix import SuffixProposer

if TYPE_CHECKING:
    from .engine import GenerationConfig, SpecDecoder


@dataclass(frozen=True)
class Method:
    """One speculative method.

    name:     vLLM's method name.
    summary:  one line for help texts (CLI, the UI's method radio).
    make:     (decoder, config, extras) -> the request's proposer (None: method "none"); extras:
              per-request objects the caller passed (e.g. ``{"suffix_cache": ...}``).
    missing:  (decoder) -> why this decoder cannot run the method (what to pass), or None.
    settings: GenerationConfig fields the method reads besides k and sampling (the UI sends them).
    describe: (config) -> extra trace config (e.g. resolved lookup bounds), or None.
    finish:   (decoder, proposer, generated ids) -> None, clean-up after a request (return a
              pooled runner, update a global cache), or None.
    details:  the ``kind`` its drafts record in ``Draft.details`` (drawn by the view of that name).
    """

    name: str
    summary: str
    make: Callable[["SpecDecoder", "GenerationConfig", dict[str, Any]], Proposer | None]
    missing: Callable[["SpecDecoder"], str | None] = lambda decoder: None
    settings: tuple[str, ...] = ()
    describe: Callable[["GenerationConfig"], dict[str, Any]] | None = None
    finish: Callable[["SpecDecoder", Proposer, list[int]], None] | None = None
    details: str = ""


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` to the registry (a later registration of the same name replaces it)."""
    METHODS[method.name] = method
    return method


def get(name: str) -> Method:
    """The registered method ``name``. Raises ValueError naming the registered ones."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(METHODS)}")
    return METHODS[name]


def names() -> tuple[str, ...]:
    """Registered method names, in registration order."""
    return tuple(METHODS)


# ---- the methods ---------------------------------------------------------------------------------
LOOKUP = ("prompt_lookup_min", "prompt_lookup_max")


def _lookup_bounds(cfg: "GenerationConfig") -> dict[str, Any]:
    lo, hi = resolve_lookup_bounds(cfg.prompt_lookup_min, cfg.prompt_lookup_max)
    return {"prompt_lookup_min": lo, "prompt_lookup_max": hi}


def _make_draft_model(dec: "SpecDecoder", cfg: "GenerationConfig", extras: dict[str, Any]) -> Proposer:
    return DraftModelProposer(dec._acquire_runner(dec.draft_model), cfg.num_speculative_tokens,
                              vocab_size=dec.vocab_size, tree=cfg.speculative_token_tree)


def _release_draft_runner(dec: "SpecDecoder", proposer: Proposer, generated: list[int]) -> None:
    dec._release_runner(dec.draft_model, proposer.runner)


def _needs_draft(dec: "SpecDecoder") -> str | None:
    if dec.draft_model is None:
        return "method 'draft_model' needs a draft model: pass draft=... to SpecDecoder.from_pretrained"
    return None


def _needs_head(kind: str) -> Callable[["SpecDecoder"], str | None]:
    def missing(dec: "SpecDecoder") -> str | None:
        if kind in dec.heads:
            return None
        why = dec.head_errors.get(kind) or "no head was loaded"
        what = {"eagle3": "an EAGLE-3", "medusa": "a Medusa", "mtp": "a Gemma-4-style MTP"}.get(kind, "an EAGLE")
        return (f"method {kind!r} needs {what} head for this target ({why}); "
                f"pass heads={{'{kind}': DIR}} to SpecDecoder.from_pretrained (CLI: --{kind}-head DIR), or train one "
                "with the heads recipe")
    return missing


def _make_eagle(dec: "SpecDecoder", cfg: "GenerationConfig", extras: dict[str, Any]) -> Proposer:
    from .proposers.eagle import EagleProposer  # imports transformers' Llama modules: only when asked for
    from .proposers.eagle_tree import EagleTreeProposer, tree_settings

    head = dec.heads[cfg.method]
    dynamic, choices = tree_settings(cfg)  # EAGLE-2 knobs, a static speculative_token_tree, or a chain
    runner = acquire_head_runner(dec, head)  # static slot cache + graphs on the static runner (trees: tree_level)
    try:
        if dynamic is not None or choices is not None:
            proposer = EagleTreeProposer(head, dynamic=dynamic, choices=choices, runner=runner)
        else:
            proposer = EagleProposer(head, cfg.num_speculative_tokens, runner=runner)
    except Exception:  # e.g. invalid choices: the runner goes back to the pool
        dec._release(("head", id(head)), runner)
        raise
    proposer.pooled_runner = True  # finish returns exactly this runner to the pool
    return proposer


def acquire_head_runner(dec: "SpecDecoder", head):
    """The decoder's pooled runner for ``head`` (specviz/heads/runner.py): static cache + CUDA graphs
    when the target runs on the static runner (its ``max_cache_len`` slots; compiled when the target's
    runner is, same backend), else the eager reference."""
    from .heads.runner import make_head_runner
    from .static_runner import StaticRunner

    factory = dec.runner_factory
    static = getattr(factory, "func", factory) is StaticRunner
    keywords = getattr(factory, "keywords", {})
    max_len = keywords.get("max_cache_len", 4096) if static else None
    compile_args = {k: keywords[k] for k in ("compile", "compile_backend") if k in keywords}  # as the target's
    return dec._acquire(("head", id(head)), lambda: make_head_runner(head, max_len, **compile_args))


def warm_head_runner(dec: "SpecDecoder", head, max_width: int) -> int:
    """Capture the pooled head runner's graphs (draft step, first passes up to ``max_width`` rows);
    returns the number captured (0 without graphs). For :meth:`SpecDecoder.warm_up`."""
    runner = acquire_head_runner(dec, head)
    try:
        return runner.warm_up(max_width)
    finally:
        dec._release(("head", id(head)), runner)


def _release_head_runner(dec: "SpecDecoder", proposer: Proposer, generated: list[int]) -> None:
    """Return the request's pooled head runner, and only that one (a tree proposer once returned its own eager
    runner into the pool, and later chain requests drafted eagerly: H200, 2026-12-01, eagle3 chain 9.7 ms per
    step after tree requests in the same decoder, 4.3 ms without)."""
    if getattr(proposer, "pooled_runner", False):
        dec._release(("head", id(proposer.head)), proposer.runner)


EAGLE_TREE = ("eagle_tree_top_k", "eagle_tree_depth", "eagle_tree_total_tokens")


register(Method("none", "plain decoding (the baseline)", lambda dec, cfg, extras: None, details="none"))
register(Method("ngram", "prompt lookup", settings=(*LOOKUP, "ngram_tree_branches"), describe=_lookup_bounds,
                details="ngram",
                make=lambda dec, cfg, extras: NgramProposer(cfg.prompt_lookup_min, cfg.prompt_lookup_max,
                                                    cfg.num_speculative_tokens, tree_branches=cfg.ngram_tree_branches)))
register(Method("ngram_gpu", "prompt lookup on the device (Triton matcher on CUDA)", settings=LOOKUP,
                describe=_lookup_bounds, details="ngram_gpu",
                make=lambda dec, cfg, extras: NgramGPUProposer(
                    cfg.prompt_lookup_min, cfg.prompt_lookup_max, cfg.num_speculative_tokens,
                    backend="triton" if dec.device.type == "cuda" else "reference", device=dec.device,
                    pad=dec.device.type == "cuda")))  # k' stays on the device: one wait per step
def _suffix_cache(dec: "SpecDecoder", extras: dict[str, Any]):
    """The request's global suffix cache: the caller's (the app passes each session its own), else the decoder's."""
    cache = extras.get("suffix_cache")
    return dec.suffix_cache if cache is None else cache


register(Method("suffix", "suffix decoding", details="suffix", settings=("suffix_tree_branches",),
                make=lambda dec, cfg, extras: SuffixProposer(cfg.num_speculative_tokens,
                                                             global_cache=_suffix_cache(dec, extras),
                                                             tree_branches=cfg.suffix_tree_branches),
                finish=lambda dec, proposer, generated: proposer.finish(generated)))
TREE = "speculative_token_tree"  # a method listing it in settings drafts static trees (vLLM's setting)
register(Method("draft_model", "a small draft model", make=_make_draft_model, missing=_needs_draft,
                finish=_release_draft_runner, details="draft_model", settings=(TREE,)))
register(Method("eagle", "EAGLE-1 head on the target's final hidden state", make=_make_eagle,
                missing=_needs_head("eagle"), settings=(*EAGLE_TREE, TREE), finish=_release_head_runner, details="eagle"))
register(Method("eagle3", "EAGLE-3 head on three target layers", make=_make_eagle,
                missing=_needs_head("eagle3"), settings=(*EAGLE_TREE, TREE), finish=_release_head_runner,
                details="eagle3"))


def _needs_dflash(dec: "SpecDecoder") -> str | None:
    if "dflash" in dec.heads:
        return None
    why = dec.head_errors.get("dflash") or "no head was loaded"
    return (f"method 'dflash' needs a DFlash block drafter for this target ({why}); pass heads={{'dflash': DIR}} to "
            "SpecDecoder.from_pretrained (CLI: --dflash-head DIR), or train one with python -m specviz.train.heads "
            "--kinds dflash")


def _make_dflash(dec: "SpecDecoder", cfg: "GenerationConfig", extras: dict[str, Any]) -> Proposer:
    """The pooled static drafter runner (CUDA graph on CUDA) when the target runs on the static runner."""
    from .heads.dflash_runner import StaticDFlashRunner
    from .proposers.dflash import DFlashProposer
    from .static_runner import StaticRunner

    head = dec.heads["dflash"]
    static = getattr(dec.runner_factory, "func", dec.runner_factory) is StaticRunner
    runner = dec._acquire(("dflash", id(head)), lambda: StaticDFlashRunner(head)) if static else None
    return DFlashProposer(head, cfg.num_speculative_tokens, runner=runner)


def _release_dflash_runner(dec: "SpecDecoder", proposer: Proposer, generated: list[int]) -> None:
    from .heads.dflash_runner import StaticDFlashRunner

    if isinstance(proposer.runner, StaticDFlashRunner):
        dec._release(("dflash", id(proposer.head)), proposer.runner)


register(Method("dflash", "DFlash block drafter: one forward drafts B-1 tokens from fused target features",
                make=_make_dflash, missing=_needs_dflash, finish=_release_dflash_runner, details="dflash"))


def _make_medusa(dec: "SpecDecoder", cfg: "GenerationConfig", extras: dict[str, Any]) -> Proposer:
    from .proposers.medusa import MedusaProposer

    # a static tree once the engine verifies trees (tree-core's speculative_token_tree); else vLLM's chain
    return MedusaProposer(dec.heads["medusa"], cfg.num_speculative_tokens,
                          tree=getattr(cfg, "speculative_token_tree", None))


def _make_mtp(dec: "SpecDecoder", cfg: "GenerationConfig", extras: dict[str, Any]) -> Proposer:
    from .proposers.mtp import MtpDraftGraphs, MtpProposer

    head = dec.heads["mtp"]
    return MtpProposer(head, cfg.num_speculative_tokens, graphs=dec._acquire(("mtp", id(head)), MtpDraftGraphs))


def _release_mtp_graphs(dec: "SpecDecoder", proposer: Proposer, generated: list[int]) -> None:
    dec._release(("mtp", id(proposer.head)), proposer.runner)


register(Method("medusa", "Medusa heads on the target's final hidden state (a chain of min(k, heads) drafts, or a "
                "static tree: speculative_token_tree)", make=_make_medusa, missing=_needs_head("medusa"),
                details="medusa", settings=(TREE,)))
register(Method("mtp", "Gemma-4-style MTP head, trained by specviz (no public recipe): queries over the target's KV",
                make=_make_mtp, missing=_needs_head("mtp"), finish=_release_mtp_graphs, details="mtp"))


TREE_SETTINGS = (*EAGLE_TREE, "ngram_tree_branches", "suffix_tree_branches")


def check_tree_settings(cfg: "GenerationConfig") -> None:
    """Raise ValueError for a draft-tree setting the request's method does not take, or an invalid
    one (checked before any model runs)."""
    method = get(cfg.method)
    for name in TREE_SETTINGS:
        if getattr(cfg, name, None) is not None and name not in method.settings:
            takers = ", ".join(m.name for m in METHODS.values() if name in m.settings)
            raise ValueError(f"{name} applies to method(s) {takers}, not {cfg.method!r}; unset it or change the method")
    if any(getattr(cfg, name, None) is not None for name in TREE_SETTINGS) and cfg.verify in ("block", "synthetic"):
        raise ValueError(f"verify={cfg.verify!r} is chain-only; a draft tree needs verify='standard' (lossless rule A "
                         "for its top-k children) or 'greedy' at temperature 0")
    if cfg.method in ("eagle", "eagle3"):
        from .proposers.eagle_tree import tree_settings

        tree_settings(cfg)
    from .proposers.ranked_tree import check_branches

    check_branches(cfg.ngram_tree_branches, "ngram_tree_branches")
    check_branches(cfg.suffix_tree_branches, "suffix_tree_branches")


def eagle_tree_settings(text: str) -> dict[str, int]:
    """EAGLE-2's knobs written "top_k, depth, total_tokens" (e.g. "4, 6, 32"; ";" also separates) -> the
    ``eagle_tree_*`` generate() settings. Raises ValueError for text that is not three integers (the
    engine checks their ranges)."""
    parts = [x.strip() for x in str(text).replace(";", ",").split(",")]
    if len(parts) != 3 or not all(x.isdigit() for x in parts):
        raise ValueError(f"EAGLE-2 tree: give top_k, depth, total_tokens as three integers like 4, 6, 32 "
                         f"(or leave it empty for a chain), got {text!r}")
    return dict(zip(EAGLE_TREE, map(int, parts)))


def draft_tree_settings(method: str, spec: str) -> dict[str, Any]:
    """A draft tree written as one string -> ``method``'s generate() settings (the comparison's tree
    column, ``specviz compare --trees``): "" = a chain ({}); "4, 6, 32" = EAGLE-2's top_k, depth,
    total_tokens (eagle, eagle3); "[(0,), (1,), (0, 0)]" = vLLM's ``speculative_token_tree`` (the methods
    that take it); "2" = the continuations kept per node (ngram, suffix: ``*_tree_branches``).
    Raises ValueError for text of none of these forms, or a form ``method`` does not take (the engine
    checks the tree itself)."""
    spec = str(spec or "").strip()
    if not spec:
        return {}
    takes = get(method).settings if method in METHODS else ()
    if spec.startswith("["):
        if TREE not in takes:
            raise ValueError(f"a static tree (speculative_token_tree) applies to "
                             f"{', '.join(m.name for m in METHODS.values() if TREE in m.settings)}, not {method!r}")
        return {TREE: spec}
    if spec.isdigit():
        name = f"{method}_tree_branches"
        if name not in takes:
            raise ValueError(f"a tree of {spec} branches per node applies to ngram and suffix, not {method!r}")
        return {name: int(spec)}
    if EAGLE_TREE[0] not in takes:
        raise ValueError(f"an EAGLE-2 tree ({spec!r}) applies to eagle and eagle3, not {method!r}; other trees: "
                         "\"[(0,), (1,), (0, 0)]\" (static) or a number of branches (ngram, suffix)")
    return eagle_tree_settings(spec)


def draft_tree_depth(settings: dict[str, Any]) -> int | None:
    """The most drafts one path of the tree ``settings`` describes can hold (its k): EAGLE-2's depth + 1 (with
    the engine's defaults for knobs left out), a static tree's longest path; None for a chain or a tree whose
    depth is k (ngram / suffix branches). Raises ValueError for an invalid static tree."""
    if TREE in settings:
        from .tree import parse_choices

        return max(len(p) for p in parse_choices(settings[TREE]))
    if any(name in settings for name in EAGLE_TREE):
        from .proposers.eagle_tree import DEFAULT_DEPTH

        return int(settings.get("eagle_tree_depth", DEFAULT_DEPTH)) + 1
    return None
