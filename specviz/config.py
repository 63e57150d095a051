"""A request's settings: :class:`GenerationConfig`, built and checked from generate()'s keywords in one place.

The keywords are vLLM's names where vLLM has one (``num_speculative_tokens``, ``speculative_token_tree``,
``prompt_lookup_min``, ``typical_acceptance_sampler_posterior_threshold``...). :meth:`GenerationConfig.from_settings`
resolves the defaults (greedy verification at temperature 0, else standard; the Triton sampler on CUDA), nests the
keywords (sampling, verification, the method's own options, the draft tree) and raises ValueError saying what to
change for anything the engine cannot run; :meth:`GenerationConfig.flat` gives the keywords back (the trace's config).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from . import methods
from .sampling import validate_sampling_params
from .tree import DraftTree

VERIFY_METHODS = ("greedy", "standard", "block", "synthetic", "typical")  # typical: lossy (sampling/typical.py)
CHAIN_ONLY = ("block", "synthetic", "typical")  # verification rules defined for one draft path
SAMPLER_BACKENDS = ("reference", "triton")
MAX_SPECULATIVE_TOKENS = 32


@dataclass(frozen=True)
class Sampling:
    """temperature >= 0 (0 = greedy); top_k None = off; top_p in (0, 1] or None = off; seed of the request's
    generator (drafts, uniforms, recovered and bonus tokens all draw from it)."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0


@dataclass(frozen=True)
class Verification:
    """rule: one of :data:`VERIFY_METHODS`; backend: "reference" (PyTorch) or "triton"; synthetic_rates: the
    unconditional per-position acceptance rates of rule "synthetic"; typical_threshold / typical_alpha: rule
    "typical"'s epsilon and delta (vLLM's ``typical_acceptance_sampler_posterior_*``); detailed: record every
    position's top-20 distributions in the trace."""

    rule: str = "greedy"
    backend: str = "reference"
    synthetic_rates: tuple[float, ...] | None = None
    typical_threshold: float = 0.09
    typical_alpha: float = 0.3
    detailed: bool = True


# generate() keyword -> (part, field) for the nested parts
_KEYWORDS = {"temperature": ("sampling", "temperature"), "top_k": ("sampling", "top_k"), "top_p": ("sampling", "top_p"),
             "seed": ("sampling", "seed"), "verify": ("verification", "rule"),
             "sampler_backend": ("verification", "backend"), "synthetic_rates": ("verification", "synthetic_rates"),
             "typical_acceptance_sampler_posterior_threshold": ("verification", "typical_threshold"),
             "typical_acceptance_sampler_posterior_alpha": ("verification", "typical_alpha"),
             "detailed_trace": ("verification", "detailed")}


@dataclass(frozen=True)
class GenerationConfig:
    """Validated settings of one request (:meth:`specviz.engine.SpecDecoder.generate` lists the keywords).

    method: a registered method name; num_speculative_tokens: k (1..32), with a tree the most drafts on one path;
    max_new_tokens >= 1; options: the method's own settings (its ``Method.options`` dataclass, or None);
    tree: a :class:`~specviz.tree.DraftTree`, or None for a chain; async_scheduling: method none only, queue
    step i + 1's target forward (fed the sampled token on the device) before step i's wait (vLLM's
    ``async_scheduling``; default on CUDA), so the host's work overlaps the GPU's (with the Triton sampler, CUDA's
    default: the reference sampler copies its tokens to the host before the look-ahead is queued). No look-ahead into
    a static cache's last slot.
    """

    method: str = methods.BUILTIN[0]  # generate()'s default method
    num_speculative_tokens: int = 5
    max_new_tokens: int = 64
    sampling: Sampling = Sampling()
    verification: Verification = Verification()
    options: Any = None
    tree: DraftTree | None = None
    async_scheduling: bool = False

    @classmethod
    def from_settings(cls, cuda: bool = False, **settings: Any) -> "GenerationConfig":
        """Build a config from generate()'s keywords; ``cuda``: the decoder runs on CUDA (the default sampler
        backend is then Triton). Keywords naming another registered method's options are ignored. Raises
        ValueError for an unknown keyword or anything :func:`check` refuses."""
        s = dict(settings)
        method = s.pop("method", cls.method)
        spec = methods.get(method)  # ValueError for an unknown method
        tree = DraftTree.from_settings(s, method, methods.names())
        own = {f.name for f in fields(spec.options)} if spec.options is not None else set()
        options = spec.options(**{k: s.pop(k) for k in list(s) if k in own}) if spec.options is not None else None
        for name in methods.option_names() - own:  # another method's settings: not this request's business
            s.pop(name, None)
        parts: dict[str, dict[str, Any]] = {"sampling": {}, "verification": {}}
        for key in [k for k in s if k in _KEYWORDS]:
            part, name = _KEYWORDS[key]
            parts[part][name] = s.pop(key)
        top = {k: s.pop(k) for k in ("num_speculative_tokens", "max_new_tokens") if k in s}
        top["async_scheduling"] = s.pop("async_scheduling", None)
        if top["async_scheduling"] is None:  # default: on CUDA, for the method it exists for
            top["async_scheduling"] = cuda and method == "none"
        if s:
            raise ValueError(f"unknown generate() setting(s): {', '.join(sorted(s))}")
        sampling = Sampling(**parts["sampling"])
        ver = parts["verification"]
        if ver.get("rule") is None:
            ver["rule"] = "greedy" if sampling.temperature == 0 else "standard"
        if ver.get("backend", "auto") == "auto":
            ver["backend"] = "triton" if cuda and ver["rule"] != "typical" else "reference"  # typical: reference only
        if ver.get("synthetic_rates") is not None:
            ver["synthetic_rates"] = tuple(float(a) for a in ver["synthetic_rates"])
        cfg = cls(method=method, sampling=sampling, verification=Verification(**ver), options=options, tree=tree,
                  **top)
        check(cfg)
        return cfg

    # shorthands the loop and the proposers read
    @property
    def temperature(self) -> float:
        return self.sampling.temperature

    @property
    def verify(self) -> str:
        return self.verification.rule

    def flat(self) -> dict[str, Any]:
        """generate()'s keywords for this config (the trace's config): every core keyword, the method's own options
        and the tree's keywords (the trace of a chain names no tree)."""
        out: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens,
                               "max_new_tokens": self.max_new_tokens, "async_scheduling": self.async_scheduling}
        for key, (part, name) in _KEYWORDS.items():
            out[key] = getattr(getattr(self, part), name)
        out["synthetic_rates"] = list(self.verification.synthetic_rates) if self.verification.synthetic_rates else None
        if self.options is not None:
            out.update(asdict(self.options))
        out["speculative_token_tree"] = None
        if self.tree is not None:
            out.update(self.tree.settings(self.method))
        return out


def check(cfg: GenerationConfig) -> None:
    """Raise ValueError (saying what to change) for settings the engine cannot run. The method's needs (a draft
    model, a head) are checked by the decoder (``Method.missing``)."""
    method, v, s = methods.get(cfg.method), cfg.verification, cfg.sampling
    if v.rule not in VERIFY_METHODS:
        raise ValueError(f"unknown verification {v.rule!r}; choose one of {', '.join(VERIFY_METHODS)}")
    k = cfg.num_speculative_tokens
    if cfg.method != "none" and not (isinstance(k, int) and 1 <= k <= MAX_SPECULATIVE_TOKENS):
        raise ValueError(f"num_speculative_tokens must be between 1 and {MAX_SPECULATIVE_TOKENS}, got {k}")
    if not isinstance(cfg.async_scheduling, bool):
        raise ValueError(f"async_scheduling must be True, False or None (the default), got {cfg.async_scheduling!r}")
    if cfg.async_scheduling and cfg.method != "none":  # a draft's length depends on the last step's acceptance
        raise ValueError(f"async_scheduling runs method 'none' only; method {cfg.method!r} needs the step's accepted "
                         "tokens on the host before it drafts: leave async_scheduling unset for it")
    if not (isinstance(cfg.max_new_tokens, int) and cfg.max_new_tokens >= 1):
        raise ValueError(f"max_new_tokens must be >= 1, got {cfg.max_new_tokens}")
    validate_sampling_params(s.temperature, s.top_k, s.top_p)
    if v.backend not in SAMPLER_BACKENDS:
        raise ValueError(f"unknown sampler_backend {v.backend!r}; choose auto, reference or triton")
    if v.rule == "greedy" and s.temperature > 0:
        raise ValueError("verify='greedy' needs temperature 0; use verify='standard' or 'block' to sample, or set "
                         "temperature=0")
    if v.rule == "typical":  # Medusa's rule: lossy, not distribution-preserving
        from .sampling.typical import LOSSY_NOTE, check_typical_params

        check_typical_params(v.typical_threshold, v.typical_alpha)
        if v.backend == "triton":
            raise ValueError(f"verify='typical' ({LOSSY_NOTE}) runs on the reference sampler only; use "
                             "sampler_backend='auto' or 'reference'")
    if v.rule == "synthetic":
        check_synthetic_rates(v.synthetic_rates, k if cfg.method != "none" else 0)
    if cfg.tree is not None:
        _check_tree(cfg, method)


TREE_WORDS = {"static": ("static trees", "speculative_token_tree"), "dynamic": ("EAGLE-2 trees", "eagle_tree_*"),
              "branches": ("trees of ranked continuations", "<method>_tree_branches")}


def tree_refusal(method: str, form: str) -> str | None:
    """Why ``method`` cannot draft a tree of ``form`` (None when it can), naming the methods that do."""
    if form in methods.get(method).tree_forms:
        return None
    what, setting = TREE_WORDS[form]
    return (f"method {method!r} does not draft {what}: {setting} applies to method(s) "
            f"{', '.join(methods.taking(form)) or 'none'}, not {method!r} (or leave it out for a chain of k)")


def _check_tree(cfg: GenerationConfig, method: "methods.Method") -> None:
    """A tree form the method drafts, no deeper than k, and a verification that exists for trees."""
    tree = cfg.tree
    refusal = tree_refusal(cfg.method, tree.form)
    if refusal:
        raise ValueError(refusal)
    depth = tree.max_depth
    if tree.form == "static" and depth > cfg.num_speculative_tokens:
        raise ValueError(f"speculative_token_tree is {depth} deep but num_speculative_tokens is "
                         f"{cfg.num_speculative_tokens}; set num_speculative_tokens >= {depth} (it caps the drafts on "
                         "one path)")
    if cfg.verification.rule in CHAIN_ONLY:
        raise ValueError(f"verify={cfg.verification.rule!r} is chain-only; a draft tree needs verify='standard' "
                         "(lossless rule A for its top-k children) or 'greedy' at temperature 0")


def check_synthetic_rates(rates: tuple[float, ...] | None, k: int) -> None:
    """verify="synthetic" (vLLM's benchmarking mode, not lossless): rates a_1..a_k are the unconditional per-position
    acceptance rates, a_i = P(at least i drafts accepted); each in [0, 1], non-increasing, one per draft position
    (k = num_speculative_tokens; extras ignored). Raises ValueError saying what a rate is."""
    what = ("synthetic_rates are the unconditional per-position acceptance rates a_1 >= a_2 >= ... "
            "(a_i = the fraction of steps that accept at least i drafts): each must lie in [0, 1], they must be "
            f"non-increasing, and num_speculative_tokens k = {k} needs {k} of them (one per draft position)")
    if not rates:
        raise ValueError(f"verify='synthetic' needs synthetic_rates, e.g. [0.8, 0.6, 0.4] for k = 3; {what}")
    shown = ", ".join(f"{a:g}" for a in rates)
    problems = []
    if len(rates) < k:
        problems.append(f"{len(rates)} given")
    outside = [a for a in rates if not (math.isfinite(a) and 0.0 <= a <= 1.0)]
    if outside:
        problems.append(f"{', '.join(f'{a:g}' for a in outside)} outside [0, 1]")
    rises = [i + 2 for i in range(len(rates) - 1) if rates[i + 1] > rates[i]]
    if rises:
        problems.append(f"a_{rises[0]} > a_{rises[0] - 1}")
    if problems:
        raise ValueError(f"invalid synthetic_rates [{shown}] ({'; '.join(problems)}): {what}")
