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
                              vocab_size=dec.vocab_size)


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
        return (f"method {kind!r} needs an {'EAGLE-3' if kind == 'eagle3' else 'EAGLE'} head for this target ({why}); "
                f"pass heads={{'{kind}': DIR}} to SpecDecoder.from_pretrained (CLI: --{kind}-head DIR), or train one "
                "with the heads recipe")
    return missing


def _make_eagle(dec: "SpecDecoder", cfg: "GenerationConfig", extras: dict[str, Any]) -> Proposer:
    from .proposers.eagle import EagleProposer  # imports transformers' Llama modules: only when asked for

    head = dec.heads[cfg.method]
    return EagleProposer(head, cfg.num_speculative_tokens, runner=acquire_head_runner(dec, head))


def acquire_head_runner(dec: "SpecDecoder", head):
    """The decoder's pooled runner for ``head`` (specviz/heads/runner.py): static cache + CUDA graphs
    when the target runs on the static runner (its ``max_cache_len`` slots), else the eager reference."""
    from .heads.runner import make_head_runner
    from .static_runner import StaticRunner

    factory = dec.runner_factory
    static = getattr(factory, "func", factory) is StaticRunner
    max_len = getattr(factory, "keywords", {}).get("max_cache_len", 4096) if static else None
    return dec._acquire(("head", id(head)), lambda: make_head_runner(head, max_len))


def warm_head_runner(dec: "SpecDecoder", head, max_width: int) -> int:
    """Capture the pooled head runner's graphs (draft step, first passes up to ``max_width`` rows);
    returns the number captured (0 without graphs). For :meth:`SpecDecoder.warm_up`."""
    runner = acquire_head_runner(dec, head)
    try:
        return runner.warm_up(max_width)
    finally:
        dec._release(("head", id(head)), runner)


def _release_head_runner(dec: "SpecDecoder", proposer: Proposer, generated: list[int]) -> None:
    dec._release(("head", id(proposer.head)), proposer.runner)


register(Method("none", "plain decoding (the baseline)", lambda dec, cfg, extras: None, details="none"))
register(Method("ngram", "prompt lookup", settings=LOOKUP, describe=_lookup_bounds, details="ngram",
                make=lambda dec, cfg, extras: NgramProposer(cfg.prompt_lookup_min, cfg.prompt_lookup_max,
                                                    cfg.num_speculative_tokens)))
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


register(Method("suffix", "suffix decoding", details="suffix",
                make=lambda dec, cfg, extras: SuffixProposer(cfg.num_speculative_tokens,
                                                             global_cache=_suffix_cache(dec, extras)),
                finish=lambda dec, proposer, generated: proposer.finish(generated)))
register(Method("draft_model", "a small draft model", make=_make_draft_model, missing=_needs_draft,
                finish=_release_draft_runner, details="draft_model"))
register(Method("eagle", "EAGLE-1 head on the target's final hidden state", make=_make_eagle,
                missing=_needs_head("eagle"), finish=_release_head_runner, details="eagle"))
register(Method("eagle3", "EAGLE-3 head on three target layers", make=_make_eagle,
                missing=_needs_head("eagle3"), finish=_release_head_runner, details="eagle3"))
