"""The speculative decoding loop (batch size 1), read top to bottom.

    prefill(prompt[:-1]); proposer.observe(prefill's features)
    repeat until EOS or max_new_tokens:
        draft  = proposer.propose(context, k_step)          # x_1..x_k', q
        logits = target.forward([last, x_1..x_k'])           # p_1..p_{k'+1} (+ feature taps): one forward
        out    = rejection_sample(p, q, x, method=verify)    # accepted + recovered/bonus
        commit accepted + 1 tokens; proposer.observe(outcome); target.truncate(len(context) - 1)

p, the sampler and the step's trace record run in :class:`~specviz.verify_step.StepVerifier`
(CUDA graphs on a GPU); the step waits for the GPU once, for its tokens, and publishes its
events during the next step's target forward.

``method="none"`` is plain autoregressive decoding through the same loop (k' = 0 every step,
the sampler then just draws the bonus token from p), so it is the baseline every chart compares
against. Sources: Leviathan et al. 2023 (Alg. 1), Chen et al. 2023, vLLM ``v1/spec_decode``.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from . import events as ev
from . import methods
from . import tree as tree_mod
from .models import (ASSETS_MODELS, DEFAULT_DRAFT, DEFAULT_TARGET, ModelLoadError, check_vocab_rows, load_model,
                     load_tokenizer, resolve_device, resolve_dtype, source_info, tokenizer_mismatch)
from .proposers import StepContext
from .proposers.base import Draft, Outcome, Proposer
from .proposers.ngram_gpu import NgramGPUProposer
from .proposers.suffix import GlobalSuffixCache
from .record import host_record, tree_record
from .runner import EagerRunner, ModelRunner
from .static_runner import StaticRunner, capture_notes
from .sampling import validate_sampling_params
from .trace import Recorder, Trace
from .verify_step import StepVerifier, VerifySpec, graph_key

METHODS = methods.names()  # the registry's names (specviz/methods.py), in registration order
DEFAULT_HEADS = {"eagle": ASSETS_MODELS / "specviz-eagle", "eagle3": ASSETS_MODELS / "specviz-eagle3",
                 "dflash": ASSETS_MODELS / "specviz-dflash", "medusa": ASSETS_MODELS / "specviz-medusa",
                 "mtp": ASSETS_MODELS / "specviz-mtp"}
RUNNERS = ("auto", "eager", "static")
VERIFY_METHODS = ("greedy", "standard", "block", "synthetic", "typical")  # typical: lossy (sampling/typical.py)
MAX_SPECULATIVE_TOKENS = 32
WARM_UP_GRAPH_HEADROOM = 32  # verifier graph pairs kept beyond the warm-up's (other rates, top-k / top-p on, ...)

_DEVICE_LOCKS: dict[str, threading.RLock] = {}
_DEVICE_LOCKS_GUARD = threading.Lock()


def device_lock(device: torch.device) -> "threading.RLock | contextlib.nullcontext[None]":
    """The process-wide lock that serialises GPU work of every decoder on one CUDA device, step by step
    (a no-op context on the CPU, where concurrent requests simply share the cores).

    Why: CUDA-graph capture (the static runner's, the EAGLE head runner's, the verifier's) is invalidated
    by another thread's CUDA calls during the capture ("operation failed due to a previous error during
    capture", measured on the H200 with 8 concurrent app sessions, 2026-12-01). A request holds the lock
    for one step's work at a time and releases it between steps, so concurrent requests interleave step by
    step and none waits for another's whole run; :meth:`SpecDecoder.warm_up` holds it throughout.
    Reentrant: ``warm_up`` runs requests inside its own hold."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    key = str(torch.device(device.type, device.index if device.index is not None else torch.cuda.current_device()))
    with _DEVICE_LOCKS_GUARD:
        return _DEVICE_LOCKS.setdefault(key, threading.RLock())


@dataclass(frozen=True)
class GenerationConfig:
    """Validated settings of one request (see :meth:`SpecDecoder.generate` for meanings)."""

    method: str = "ngram"
    num_speculative_tokens: int = 5
    verify: str = "greedy"
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    max_new_tokens: int = 64
    seed: int = 0
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    synthetic_rates: tuple[float, ...] | None = None
    sampler_backend: str = "auto"  # "auto": Triton kernels on CUDA, the PyTorch reference elsewhere
    detailed_trace: bool = True
    typical_acceptance_sampler_posterior_threshold: float = 0.09  # verify="typical" (lossy): epsilon
    typical_acceptance_sampler_posterior_alpha: float = 0.3  # verify="typical" (lossy): delta
    speculative_token_tree: str | None = None  # vLLM's static tree, e.g. "[(0,), (1,), (0, 0)]"; None = a chain of k
    eagle_tree_top_k: int | None = None  # eagle / eagle3: EAGLE-2's dynamic tree (proposers/eagle_tree.py)
    eagle_tree_depth: int | None = None
    eagle_tree_total_tokens: int | None = None
    ngram_tree_branches: int | None = None  # ngram: a tree of up to this many continuations per node
    suffix_tree_branches: int | None = None  # suffix: likewise from the suffix tree


def _fail(message: str) -> None:
    raise ValueError(message)


def validate_config(cfg: GenerationConfig, decoder: "SpecDecoder | None" = None) -> None:
    """Raise ValueError (saying what to change) for settings the engine cannot run (with
    ``decoder``: also for a method it cannot run, e.g. a missing draft model or head)."""
    method = methods.get(cfg.method)  # ValueError for an unknown method
    if cfg.verify not in VERIFY_METHODS:
        _fail(f"unknown verification {cfg.verify!r}; choose one of {', '.join(VERIFY_METHODS)}")
    if cfg.method != "none" and not 1 <= cfg.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
        _fail(f"num_speculative_tokens must be between 1 and {MAX_SPECULATIVE_TOKENS}, got {cfg.num_speculative_tokens}")
    if cfg.max_new_tokens < 1:
        _fail(f"max_new_tokens must be >= 1, got {cfg.max_new_tokens}")
    validate_sampling_params(cfg.temperature, cfg.top_k, cfg.top_p)
    methods.check_tree_settings(cfg)  # draft-tree settings: the method's own, valid
    if cfg.sampler_backend not in ("reference", "triton"):
        _fail(f"unknown sampler_backend {cfg.sampler_backend!r}; choose auto, reference or triton")
    if cfg.verify == "greedy" and cfg.temperature > 0:
        _fail("verify='greedy' needs temperature 0; use verify='standard' or 'block' to sample, or set temperature=0")
    if cfg.verify == "typical":  # Medusa's rule: lossy, not distribution-preserving
        from .sampling.typical import LOSSY_NOTE, check_typical_params

        check_typical_params(cfg.typical_acceptance_sampler_posterior_threshold,
                             cfg.typical_acceptance_sampler_posterior_alpha)
        if cfg.sampler_backend == "triton":
            _fail(f"verify='typical' ({LOSSY_NOTE}) runs on the reference sampler only; use sampler_backend='auto' "
                  "or 'reference'")
    if cfg.verify == "synthetic":
        _check_synthetic_rates(cfg.synthetic_rates, cfg.num_speculative_tokens if cfg.method != "none" else 0)
    if cfg.speculative_token_tree is not None:
        _check_tree(cfg, method)
    missing = method.missing(decoder) if decoder is not None else None
    if missing:
        _fail(missing)


def _check_tree(cfg: GenerationConfig, method: "methods.Method") -> None:
    """speculative_token_tree: a method that drafts static trees, a tree no deeper than k, and a
    verification that exists for trees (greedy, or standard: rule A / B, methods.md 1.4)."""
    if methods.TREE not in method.settings:
        takes = [m for m in methods.names() if methods.TREE in methods.get(m).settings]
        _fail(f"method {cfg.method!r} does not draft static trees; speculative_token_tree works with "
              f"{', '.join(takes) or 'no method yet'} (or leave it out for a chain of k)")
    if not isinstance(cfg.speculative_token_tree, str):
        _fail("speculative_token_tree must be a string like \"[(0,), (1,), (0, 0)]\" (vLLM's format)")
    paths = tree_mod.parse_choices(cfg.speculative_token_tree)  # ValueError: malformed / too many nodes
    depth = max(len(p) for p in paths)
    if depth > cfg.num_speculative_tokens:
        _fail(f"speculative_token_tree is {depth} deep but num_speculative_tokens is {cfg.num_speculative_tokens}; "
              f"set num_speculative_tokens >= {depth} (it caps the drafts on one path)")
    if cfg.verify in ("block", "synthetic", "typical"):
        _fail(f"verify={cfg.verify!r} is chain-only; a speculative_token_tree needs verify='standard' (lossless "
              "rule A for its top-k children) or 'greedy' at temperature 0")


def _check_synthetic_rates(rates: tuple[float, ...] | None, k: int) -> None:
    """verify="synthetic" (vLLM's benchmarking mode, not lossless): rates a_1..a_k are the
    unconditional per-position acceptance rates, a_i = P(at least i drafts accepted); each in
    [0, 1], non-increasing, one per draft position (k = num_speculative_tokens; extras ignored)."""
    what = ("synthetic_rates are the unconditional per-position acceptance rates a_1 >= a_2 >= ... "
            "(a_i = the fraction of steps that accept at least i drafts): each must lie in [0, 1], they must be "
            f"non-increasing, and num_speculative_tokens k = {k} needs {k} of them (one per draft position)")
    if not rates:
        _fail(f"verify='synthetic' needs synthetic_rates, e.g. [0.8, 0.6, 0.4] for k = 3; {what}")
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
        _fail(f"invalid synthetic_rates [{shown}] ({'; '.join(problems)}): {what}")


class SpecDecoder:
    """Speculative decoding over HF causal LMs, recording a :class:`~specviz.trace.Trace`.

    Build with :meth:`from_pretrained`. Every request gets its own runners (KV caches), so one
    decoder may serve several threads at once; ``target_runner`` and ``current_proposer`` are
    the most recent request's, kept for inspection.

    ``draft_tokenizer``: the draft's own tokenizer (from_pretrained loads it from the draft's
    directory); it must equal the target's (:func:`specviz.models.tokenizer_mismatch`), or
    ValueError says what differs. The models' vocabulary rows may differ by padding beyond the
    tokenizer (draft q is then cut or zero-padded to the target's V). None: the draft is taken
    to share ``tokenizer``.
    """

    def __init__(self, target_model: torch.nn.Module, tokenizer: Any, draft_model: torch.nn.Module | None = None,
                 runner_factory: Callable[[torch.nn.Module], ModelRunner] = EagerRunner,
                 names: dict[str, str] | None = None, draft_tokenizer: Any = None,
                 heads: dict[str, torch.nn.Module] | None = None, head_errors: dict[str, str] | None = None):
        self.target_model, self.tokenizer, self.draft_model = target_model, tokenizer, draft_model
        self.heads = dict(heads or {})  # {"eagle" | "eagle3": head attached to target_model} (specviz.heads)
        self.head_errors = dict(head_errors or {})  # {kind: why its head is not loaded}, for the error message
        self.device = next(target_model.parameters()).device
        self.runner_factory = runner_factory
        self.target_runner: ModelRunner | None = None
        self.names = names or {}
        self.vocab_size = int(target_model.get_output_embeddings().weight.shape[0])
        if draft_model is not None:
            problem = tokenizer_mismatch(tokenizer, draft_tokenizer) if draft_tokenizer is not None else None
            if problem:
                raise ValueError(problem)
            draft_vocab = int(draft_model.get_output_embeddings().weight.shape[0])
            if draft_vocab != self.vocab_size:
                check_vocab_rows(self.vocab_size, draft_vocab, len(tokenizer))
        self.eos_token_ids = _eos_ids(target_model, tokenizer)
        self.max_length = int(getattr(target_model.config, "max_position_embeddings", 0) or 0)
        self.current_proposer: Proposer | None = None
        self.step_verifier: StepVerifier | None = None
        self._free_runners: dict[int, list[ModelRunner]] = {}  # reused across requests (graphs, caches)
        self._pool_lock = threading.Lock()
        # method "suffix": outputs of earlier requests, one tree per engine as vLLM keeps it; the app
        # passes each browser session its own (generate(..., suffix_cache=...)), see SuffixProposer
        self.suffix_cache = GlobalSuffixCache()

    @classmethod
    def from_pretrained(cls, target: str | None = None, draft: str | None = None,
                        device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
                        runner: str = "auto", max_cache_len: int = 4096,
                        heads: dict[str, str] | None = None, compile: bool | None = None) -> "SpecDecoder":
        """Load target (and optional draft) from a local directory, a ``.gguf`` file (or a directory holding
        one), a preset ("smollm2") or a hub id: safetensors or GGUF through transformers, never remote code
        (:func:`specviz.models.load_model`); the trace's config records each model's source file and, for GGUF,
        its quantisation type (``model_sources``).

        target None -> the bundled demo target (and, if ``draft`` is None too, the bundled
        draft, and the bundled EAGLE heads ``assets/models/specviz-eagle`` / ``specviz-eagle3``
        when present; ``specviz-dflash`` likewise). heads: {"eagle" | "eagle3" | "dflash": head directory}
        (:func:`specviz.heads.load_head`, :func:`specviz.heads.dflash.load_dflash`: config.json + safetensors),
        loaded onto the target; a method whose head is absent raises
        ValueError when asked for. device None -> CUDA if available else CPU; dtype None -> bf16
        on CUDA, fp32 on CPU.
        runner: "eager" (DynamicCache, :class:`~specviz.runner.EagerRunner`), "static"
        (pre-allocated cache of ``max_cache_len`` tokens, CUDA graphs on CUDA:
        :class:`~specviz.static_runner.StaticRunner`) or "auto" (static on CUDA, eager on CPU).
        compile: the static runners' ``torch.compile`` of small forwards (None: the runner's
        default, ``specviz.static_runner.COMPILE_DEFAULT``); ignored by the eager runner.
        Raises :class:`specviz.models.ModelLoadError` (a ValueError) if a model cannot be loaded, and
        :class:`specviz.attention.UnsupportedModelError` (a ValueError naming the family and the reason) for a
        family the runners cannot decode exactly, before any decoding."""
        if runner not in RUNNERS:
            raise ValueError(f"unknown runner {runner!r}; choose one of {', '.join(RUNNERS)}")
        if target is None:
            target = DEFAULT_TARGET
            draft = DEFAULT_DRAFT if draft is None and DEFAULT_DRAFT.exists() else draft
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        target_model = load_model(target, dev, dt)
        tokenizer = load_tokenizer(target)
        draft_model = load_model(draft, dev, dt) if draft is not None else None
        draft_tokenizer = load_tokenizer(draft) if draft is not None else None
        names = {"target": str(target), "draft": str(draft) if draft is not None else "",
                 "dtype": str(dt).split(".")[-1], "model_sources": {"target": source_info(target),
                                   **({"draft": source_info(draft)} if draft is not None else {})}}
        bundled = {k: d for k, d in DEFAULT_HEADS.items() if target == DEFAULT_TARGET and heads is None and d.exists()}
        loaded, head_errors = _load_heads({**bundled, **(heads or {})}, target_model, explicit=set(heads or ()))
        for kind, d in DEFAULT_HEADS.items():
            if kind not in loaded and kind not in head_errors:
                head_errors[kind] = (f"{d} is not there yet" if target == DEFAULT_TARGET and heads is None
                                     else "none was given in heads=")
        names.update({f"{kind}_head": str(d) for kind, d in {**bundled, **(heads or {})}.items() if kind in loaded})
        factory = EagerRunner
        if runner == "static" or (runner == "auto" and dev.type == "cuda"):
            limit = int(getattr(target_model.config, "max_position_embeddings", max_cache_len) or max_cache_len)
            factory = functools.partial(StaticRunner, max_cache_len=min(limit, max_cache_len), compile=compile)
        return cls(target_model, tokenizer, draft_model, runner_factory=factory, names=names,
                   draft_tokenizer=draft_tokenizer, heads=loaded, head_errors=head_errors)

    def _acquire_runner(self, model: torch.nn.Module) -> ModelRunner:
        return self._acquire(id(model), lambda: self.runner_factory(model))

    def _release_runner(self, model: torch.nn.Module, runner: ModelRunner | None) -> None:
        self._release(id(model), runner)

    def _acquire(self, key: Any, make: Callable[[], Any]) -> Any:
        """A pooled per-request object (runner with its cache and graphs, step verifier)."""
        with self._pool_lock:
            free = self._free_runners.setdefault(key, [])
            obj = free.pop() if free else None
        return obj if obj is not None else make()

    def _release(self, key: Any, obj: Any) -> None:
        if obj is not None:
            with self._pool_lock:
                self._free_runners.setdefault(key, []).append(obj)

    def warm_up(self, max_speculative_tokens: int = MAX_SPECULATIVE_TOKENS,
                verify_methods: Sequence[str] = VERIFY_METHODS, temperatures: Sequence[float] = (0.8, 1.0),
                synthetic_rates: Sequence[float] = (0.8, 0.6, 0.4, 0.3, 0.2),
                progress: Callable[[str], None] | None = None) -> dict[str, float]:
        """Pay the one-time costs before the first real request, so that no request's timings carry them.

        Always: two tiny requests (method none, and draft_model if there is a draft): allocations,
        the first call of every module. Where the runners / verifier capture CUDA graphs (CUDA):
        the pooled target runner's graphs for every verify width 1..max_speculative_tokens + 1,
        the drafter's 1- and 2-token graphs, each EAGLE head's draft-step and first-pass graphs
        (:mod:`specviz.heads.runner`), the verifier's graph pair for every
        :func:`warm_up_specs` (k' = 0..max_speculative_tokens x verify method x one-hot / full q,
        at temperature 0 and each of ``temperatures``; ``synthetic_rates`` for verify
        synthetic), and the n-gram matcher kernel (Triton compilation); then the heap so far is frozen
        (``gc.freeze()``: no later full garbage collection walks it). Settings outside those
        (another temperature, top-k / top-p, other rates) still capture on first use; the engine
        then excludes the capture from that step's times (``timings_ms["capture"]``).

        Args:
            progress: called with a short line ("verifier graphs 12/170") as the work proceeds.
        Returns:
            {"seconds": wall time, "capture_s": time spent capturing graphs, "graphs": graphs captured}.
        """
        with device_lock(self.device):  # no other thread's CUDA work may run while graphs are captured
            return self._warm_up(max_speculative_tokens, verify_methods, temperatures, synthetic_rates, progress)

    def _warm_up(self, max_speculative_tokens: int, verify_methods: Sequence[str], temperatures: Sequence[float],
                 synthetic_rates: Sequence[float], progress: Callable[[str], None] | None) -> dict[str, float]:
        t0, c0 = time.perf_counter(), self._pooled_capture_s()
        say = progress or (lambda line: None)
        prompt = self.encode("def f(x):\n    return")
        say("warm-up: first requests")
        self.generate(prompt, method="none", max_new_tokens=3)
        if self.draft_model is not None:
            self.generate(prompt, method="draft_model", num_speculative_tokens=2, max_new_tokens=4)
        k_max = min(int(max_speculative_tokens), MAX_SPECULATIVE_TOKENS)
        captured = self._warm_runner(self.target_model, prompt, range(1, k_max + 2), say, trees=True)
        for kind in self.heads:  # eagle / eagle3: the target's forwards that also return the head's taps
            self.generate(prompt, method=kind, num_speculative_tokens=2, max_new_tokens=4)
            from .proposers.eagle import head_taps

            head_cfg = self.heads[kind].config
            captured += self._warm_runner(self.target_model, prompt, range(1, k_max + 2), say,
                                          taps=head_cfg.taps if kind == "dflash" else head_taps(head_cfg),
                                          trees="speculative_token_tree" in methods.get(kind).settings)
            if kind in ("eagle", "eagle3"):
                captured += methods.warm_head_runner(self, self.heads[kind], k_max + 1)  # the head's own graphs
                from .proposers.eagle_tree import DEFAULT_DEPTH, DEFAULT_TOP_K, DEFAULT_TOTAL_TOKENS

                # the default EAGLE-2 tree's draft graph (one per number of levels; a request's last steps have fewer)
                self.generate(prompt, method=kind, num_speculative_tokens=DEFAULT_DEPTH + 1, max_new_tokens=24,
                              eagle_tree_top_k=DEFAULT_TOP_K, eagle_tree_depth=DEFAULT_DEPTH,
                              eagle_tree_total_tokens=DEFAULT_TOTAL_TOKENS)
        if self.draft_model is not None:
            captured += self._warm_runner(self.draft_model, prompt, (1, 2), say)
        verifier = self._acquire("verifier", lambda: StepVerifier(self.device))
        try:
            if verifier.cuda_graphs:
                specs = warm_up_specs(self.vocab_size, k_max, verify_methods, temperatures, tuple(synthetic_rates),
                                      backend="triton")
                # room for every captured pair plus requests' own: the plan's 106 keys (k <= 12) overflowed the
                # default bound of 64 and the least recently used warm-up captures were dropped again
                planned = len({graph_key(spec) for spec in specs})
                verifier.max_graphs = max(getattr(verifier, "max_graphs", 0), planned + WARM_UP_GRAPH_HEADROOM)
                generator = torch.Generator(device=self.device).manual_seed(0)
                for n, spec in enumerate(specs, 1):
                    self._warm_verifier(verifier, spec, generator)
                    say(f"warm-up: verifier graphs {n}/{len(specs)}")
                captured += len(specs)
        finally:
            self._release("verifier", verifier)
        if self.device.type == "cuda":  # the matcher kernel compiles on its first call
            NgramGPUProposer(2, 4, k_max, backend="triton", device=self.device).propose(prompt * 3, k_max)
        # the warm-up's heap (modules, graphs, compiled code) moves to the collector's permanent generation: a full
        # collection then skips it (after torch.compile one took 0.25-0.5 s inside a request on the H200, 2026-12-02;
        # vLLM freezes its start-up heap the same way)
        gc.collect()
        gc.freeze()
        say("warm-up: done")
        return {"seconds": time.perf_counter() - t0, "capture_s": self._pooled_capture_s() - c0,
                "graphs": float(captured)}

    def _pooled_capture_s(self) -> float:
        with self._pool_lock:
            return _capture_s(*(obj for objs in self._free_runners.values() for obj in objs))

    def _warm_runner(self, model: torch.nn.Module, prompt: list[int], widths: Sequence[int],
                     say: Callable[[str], None], taps: tuple[str, ...] = (), trees: bool = False) -> int:
        """Capture the pooled runner's graphs for every forward width in ``widths`` (no-op without graphs),
        with the feature ``taps`` a proposer declares (one graph per (width, taps)); ``trees``: also one tree
        forward per tree-size bucket of the runner (``StaticRunner.tree_buckets``)."""
        runner = self._acquire_runner(model)
        try:
            if not getattr(runner, "cuda_graphs", False):
                return 0
            runner.reset()
            runner.forward(torch.tensor(prompt, dtype=torch.long))  # eager prefill: graphs need a filled cache
            base = runner.seq_len
            for n in widths:
                runner.forward_features(torch.tensor(prompt[-1:] * n, dtype=torch.long), taps)
                runner.truncate(base)
            buckets = tuple(getattr(runner, "tree_buckets", None) or ()) if trees else ()
            for b in buckets:  # tree forwards: one graph per size bucket (b rows = the root + b - 1 nodes)
                if base + b <= getattr(runner, "max_cache_len", 0):
                    runner.forward_features(torch.tensor(prompt[-1:] * b, dtype=torch.long), taps,
                                            parents=[-1] * (b - 1))
                    runner.truncate(base)
            say(f"warm-up: {len(widths) + len(buckets)} forward graphs of {type(model).__name__}")
            return len(widths) + len(buckets)
        finally:
            runner.reset()
            self._release_runner(model, runner)

    def _warm_verifier(self, verifier: StepVerifier, spec: VerifySpec, generator: torch.Generator) -> None:
        """One verification of random inputs with ``spec`` (captures its graphs on first use)."""
        logits = torch.randn(spec.k + 1, spec.vocab, device=self.device)  # [k'+1, V]
        q = torch.softmax(torch.randn(spec.k, spec.vocab, device=self.device), -1) if spec.full_q else None
        x = torch.randint(spec.vocab, (spec.k,), device=self.device)  # [k']
        _, _, _, detail = verifier.run(spec, logits, q, x, generator)
        if detail is not None:
            detail.result()

    # ---- inputs ----------------------------------------------------------------------------
    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Prompt text or token ids -> ids. Raises ValueError on an empty or invalid prompt."""
        if isinstance(prompt, str):
            if not prompt.strip():
                _fail("the prompt is empty: type some text (or pass a list of token ids)")
            ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        else:
            ids = [int(t) for t in prompt]
            if any(t < 0 or t >= self.vocab_size for t in ids):
                _fail(f"prompt token ids must be in [0, {self.vocab_size})")
        if not ids:
            _fail("the prompt is empty: type some text (or pass a list of token ids)")
        return ids

    def make_proposer(self, cfg: GenerationConfig, **extras: Any) -> Proposer | None:
        """The request's proposer, from the method registry (:mod:`specviz.methods`); ``extras``:
        per-request objects a factory may use (e.g. ``suffix_cache``)."""
        return methods.get(cfg.method).make(self, cfg, extras)

    # ---- the loop --------------------------------------------------------------------------
    def generate(self, prompt: str | Sequence[int], **settings: Any) -> Trace:
        """Run one request and return its :class:`Trace`.

        Settings (keywords): method (:data:`METHODS`: "none" | "ngram" | "ngram_gpu" | "suffix" | "draft_model" |
        "eagle" | "eagle3" | "dflash" | "medusa" | "mtp"), num_speculative_tokens
        (k, 1..32; with a tree: the most drafts on one path), speculative_token_tree (vLLM's static
        tree string, e.g. "[(0,), (1,), (0, 0)]": rank paths of the draft's top candidates, at most
        :data:`specviz.tree.MAX_TREE_NODES` nodes; methods whose registry settings list it), verify ("greedy" |
        "standard" | "block" | "synthetic" | "typical" (lossy); default greedy at
        temperature 0, else standard), temperature (>= 0; 0 = greedy), top_k (None/0 = off), top_p
        (in (0, 1]), max_new_tokens (>= 1), seed, prompt_lookup_min/max (ngram), synthetic_rates,
        sampler_backend ("auto": Triton on CUDA, reference elsewhere), detailed_trace, bus (an
        :class:`~specviz.events.EventBus` to publish on, e.g. with your own subscribers), suffix_cache
        (method suffix: the :class:`~specviz.proposers.suffix.GlobalSuffixCache` of earlier outputs
        to draft from and add this output to; default the decoder's own, shared by its requests).
        Raises ValueError on invalid settings or prompt."""
        trace = None
        for trace in self._iter(prompt, settings.pop("bus", None), False, settings):  # texts decoded once, at the end
            pass
        return trace

    def iter_generate(self, prompt: str | Sequence[int], bus: ev.EventBus | None = None,
                      **settings: Any) -> Iterator[Trace]:
        """Like :meth:`generate`, but yields the partial trace after every step (for streaming
        views); closing the iterator stops the request cleanly (stop_reason "stopped").

        Events: a step's DraftProposed / StepVerified / TokensCommitted are published two steps later,
        while that step's target forward runs (see ``_step``), and always before GenerationFinished;
        here they are flushed before every yield, so each yielded trace holds every finished step.

        The same Trace object is yielded each time and grows in place (copy it to keep a
        snapshot); its metrics are filled when the request ends. ``wall_time_s`` then includes
        the time the caller spent between steps; ``metrics["time_ms"]`` holds the engine's own
        draft / verify / sample time."""
        yield from self._iter(prompt, bus, True, settings)

    def _iter(self, prompt: str | Sequence[int], bus: ev.EventBus | None, stream_texts: bool,
              settings: dict[str, Any]) -> Iterator[Trace]:
        """The request behind generate / iter_generate; ``stream_texts``: fill the trace's texts
        (and publish every finished step) before each yield."""
        if settings.get("verify") is None:
            settings["verify"] = "greedy" if settings.get("temperature", 0.0) == 0 else "standard"
        if settings.get("sampler_backend", "auto") == "auto":
            cuda = self.device.type == "cuda" and settings["verify"] != "typical"  # typical: reference only
            settings["sampler_backend"] = "triton" if cuda else "reference"
        if settings.get("synthetic_rates") is not None:
            settings["synthetic_rates"] = tuple(float(a) for a in settings["synthetic_rates"])
        suffix_cache = settings.pop("suffix_cache", None)
        try:
            cfg = GenerationConfig(**settings)
        except TypeError as exc:
            raise ValueError(f"unknown generate() setting: {exc}") from None
        validate_config(cfg, self)
        ids = self.encode(prompt)
        if self.max_length and len(ids) + cfg.max_new_tokens > self.max_length:
            _fail(f"prompt ({len(ids)} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the model's "
                  f"context of {self.max_length} tokens; shorten the prompt or lower max_new_tokens")
        bus = bus or ev.EventBus()
        recorder = Recorder(bus)
        try:
            yield from self._run(ids, cfg, bus, recorder, stream_texts, suffix_cache)
        finally:
            recorder.close()

    def _run(self, ids: list[int], cfg: GenerationConfig, bus: ev.EventBus, recorder: Recorder,
             stream_texts: bool = True, suffix_cache: GlobalSuffixCache | None = None) -> Iterator[Trace]:
        """The request's loop; its GPU work runs under :func:`device_lock`, one step at a time (released at
        every yield)."""
        lock = device_lock(self.device)
        start = time.perf_counter()
        lock.__enter__()
        try:
            yield from self._run_locked(ids, cfg, bus, recorder, stream_texts, suffix_cache, lock, start)
        finally:
            lock.__exit__(None, None, None)
        yield recorder.trace  # the finished trace, outside the lock

    def _run_locked(self, ids: list[int], cfg: GenerationConfig, bus: ev.EventBus, recorder: Recorder,
                    stream_texts: bool, suffix_cache: GlobalSuffixCache | None, lock: Any,
                    start: float) -> Iterator[Trace]:
        bus.publish(ev.GenerationStarted(config=self._describe(cfg, ids), prompt_token_ids=list(ids)))
        generator = torch.Generator(device=self.device).manual_seed(cfg.seed)
        ctx = StepContext(temperature=cfg.temperature, generator=generator, top_k=cfg.top_k, top_p=cfg.top_p)
        proposer = self.current_proposer = self.make_proposer(cfg, suffix_cache=suffix_cache)
        if proposer is not None:
            proposer.reset()
        runner = self.target_runner = self._acquire_runner(self.target_model)
        verifier = self.step_verifier = self._acquire("verifier", lambda: StepVerifier(self.device))
        runner.reset()
        ctx.target_runner = runner  # read-only for proposers (mtp reads its KV cache: runner.layer_kv)
        passes = 0
        taps = proposer.taps if proposer is not None else ()  # target features the proposer declared
        if len(ids) > 1:
            prefill = runner.forward_features(torch.tensor(ids[:-1], dtype=torch.long), taps)
            passes += 1
            if proposer is not None:  # features f_0..f_{n-1}, each with the token after it
                proposer.observe(Outcome(0, [], 0, ids[1:], prefill.features))
        last = torch.tensor([ids[-1]], dtype=torch.long).to(self.device)  # [1]: later steps keep it on the device
        generated: list[int] = []
        stop_reason = "stopped"
        step = 0
        pending: list[_Publication] = []  # steps whose events are not published yet (see _step)
        try:
            while True:
                committed, hit_eos, last, publication = self._step(step, ids, last, len(generated), cfg, runner,
                                                                   verifier, proposer, ctx, bus, pending)
                pending.append(publication)
                passes += 1
                ids.extend(committed)
                generated.extend(committed)
                runner.truncate(len(ids) - 1)
                step += 1
                if hit_eos or len(generated) >= cfg.max_new_tokens:
                    stop_reason = "eos" if hit_eos else "max_new_tokens"
                    break
                if stream_texts:  # a streamed trace is whole at every yield
                    _publish_all(pending)
                    self._add_texts(recorder.trace, generated)
                lock.__exit__(None, None, None)  # between steps other requests' steps may run
                try:
                    yield recorder.trace
                finally:
                    lock.__enter__()
        finally:
            _publish_all(pending)
            finish = methods.get(cfg.method).finish  # the method's clean-up (pooled runner, global cache)
            if finish is not None and proposer is not None:
                finish(self, proposer, generated)
            self._release_runner(self.target_model, runner)
            self._release("verifier", verifier)
            bus.publish(ev.GenerationFinished(stop_reason=stop_reason, output_token_ids=generated,
                                              wall_time_s=time.perf_counter() - start, target_forward_passes=passes))
            self._add_texts(recorder.trace, generated)

    def _step(self, step: int, ids: list[int], last: torch.Tensor, num_generated: int, cfg: GenerationConfig,
              runner: ModelRunner, verifier: StepVerifier, proposer: Proposer | None, ctx: StepContext,
              bus: ev.EventBus, pending: "list[_Publication]") -> tuple[list[int], bool, torch.Tensor, "_Publication"]:
        """One verification step. ``last``: the last committed token, int64 [1] on the device;
        ``pending``: the earlier steps' unpublished events (oldest first). While the GPU computes this
        step's target forward, every one but the newest is published (the newest is published during the
        next step, when its detailed record has long been copied: steps are published two steps late; the
        caller flushes the rest). Returns (committed tokens, whether EOS was committed, the next step's
        ``last``, this step's :class:`_Publication`).

        Nothing here waits for the GPU except the verifier's one device-to-host copy of the
        step's tokens (proposers that work on the host, such as ngram, read ``ids``). Nothing of the trace
        is queued between that copy and the next step's draft, when the GPU would wait for it: a chain's and
        a tree's detail are queued with the verifier's graphs, on a side stream behind them (a tree's
        verification is queued right behind its forward; its walk's result, the next input and the kept rows,
        also stays on the device, so the commit and the next step need no host-to-device copy)."""
        remaining = cfg.max_new_tokens - num_generated
        captured = functools.partial(_capture_s, runner, verifier, getattr(proposer, "runner", None))
        c0, t0 = captured(), time.perf_counter()
        k_step = min(cfg.num_speculative_tokens, remaining - 1)  # never draft past max_new_tokens
        if proposer is not None and k_step > 0:
            draft = proposer.propose(ids, k_step, ctx)
        else:
            draft = Draft(token_ids=torch.empty(0, dtype=torch.long), details={"kind": cfg.method})
        x = draft.token_ids.to(self.device, non_blocking=True)  # [k'] int64; host drafts come pinned: no wait
        is_tree = not draft.is_chain  # a tree: 1 + N rows, ancestor mask
        t1, c1 = time.perf_counter(), captured()
        fed = torch.cat([last, x.clamp(min=0)])  # a device-side draft's -1 padding (ngram_gpu) is fed as token 0
        forward = runner.forward_features(fed, proposer.taps if proposer is not None else (),
                                          parents=draft.forward_parents if is_tree else None)
        logits = forward.logits  # [k'+1, V]: p_1..p_{k'+1} in one forward (+ the proposer's feature taps)
        t2, c2 = time.perf_counter(), captured()
        q = draft.probs.to(self.device, torch.float32) if draft.probs is not None else None  # [k', V] or None
        spec = VerifySpec(k=int(x.numel()), vocab=self.vocab_size, verify=cfg.verify, temperature=cfg.temperature,
                          top_k=cfg.top_k, top_p=cfg.top_p, full_q=q is not None, detailed=cfg.detailed_trace,
                          synthetic_rates=cfg.synthetic_rates, backend=cfg.sampler_backend,
                          typical=(cfg.typical_acceptance_sampler_posterior_threshold,
                                   cfg.typical_acceptance_sampler_posterior_alpha) if cfg.verify == "typical" else None)
        if is_tree:  # the tree verifier queued right behind its forward (device parents: before their host copy)
            queued = verifier.queue_tree(spec, logits, q, x, draft.forward_parents, draft.tree_rule, ctx.generator)
        tree = list(draft.parents) if is_tree else None  # (a device-drafted tree's host copy: read now)
        t2a = time.perf_counter()
        while len(pending) > 1:  # earlier steps' events, while the GPU computes this step's forward: all but the
            pending.pop(0)()  # newest are published (their detail ran behind an earlier verification: no wait)
        t2b = time.perf_counter()
        if tree is None:
            core, next_last, backend, detail = verifier.run(spec, logits, q, x, ctx.generator)  # the one wait
            draft_ids = [int(t) for t in core["draft"]]
            while draft_ids and draft_ids[-1] == -1:  # padding past k' (the sampler's k' is its first -1)
                draft_ids.pop()
            acc = int(core["num_accepted"][0])
            emitted = [int(t) for t in core["output"][: acc + 1]]
            rows = None  # the committed rows are the first ones
        else:  # the tree verifier's walk (its one wait), then the accepted path's K/V compacted into place
            tree_out = queued.verify.finish(tree)
            emitted, acc = tree_out.output_token_ids, len(tree_out.path)
            draft_ids = emitted[:acc]  # the accepted path's tokens, in path order
            next_last = queued.next_input.clone()  # the walk's result on the device too: no host-to-device copy
            rows = queued.kept_rows  # [1 + N]: the root, the path's rows, padding
            runner.commit(tree_out.path, rows=rows[1:1 + acc])
        t3, c3 = time.perf_counter(), captured()
        committed, hit_eos = _truncate(emitted, remaining, self.eos_token_ids)
        if proposer is not None:  # the features at the committed positions (path rows), still on the device
            n_c = len(committed)
            proposer.observe(Outcome(len(ids) - 1, draft_ids, acc, committed,
                                     {tap: f[:n_c] if rows is None else f.index_select(0, rows[:n_c])
                                      for tap, f in forward.features.items()}))
        t4, c4 = time.perf_counter(), captured()
        # one-time CUDA-graph capture (and the compilation inside it) is not the step's cost: excluded. The
        # proposer's observe (its bookkeeping of what was committed) is drafting work: counted in draft_ms, so
        # that method none, which has none, is not compared against a time that leaves it out.
        timings = dict(draft_ms=(t1 - t0 - (c1 - c0) + t4 - t3 - (c4 - c3)) * 1e3, verify_ms=(t2 - t1 - (c2 - c1)) * 1e3,
                       sample_ms=(t2a - t2 + t3 - t2b - (c3 - c2)) * 1e3, capture_ms=(c4 - c0) * 1e3)

        def publish() -> None:
            bus.publish(ev.DraftProposed(step=step, proposer=proposer.name if proposer else "none",
                                         token_ids=draft_ids if tree is None else tree_out.token_ids,
                                         details=draft.details, draft_ms=timings["draft_ms"]))
            if tree is not None:
                record = tree_record(tree_out, tree_out.token_ids, tree, draft.scores, draft.tree_rule, cfg.verify,
                                     queued.detail)
            elif detail is not None:
                record = host_record({**core, **detail.result()}, draft_ids, cfg.verify, backend)
            else:
                record = _brief_record(emitted, acc, len(draft_ids))
            bus.publish(ev.StepVerified(step=step, record=record, verify_ms=timings["verify_ms"],
                                        sample_ms=timings["sample_ms"], capture_ms=timings["capture_ms"]))
            bus.publish(ev.TokensCommitted(step=step, token_ids=committed,
                                           num_generated=num_generated + len(committed)))

        return committed, hit_eos, next_last, _Publication(publish)

    # ---- bookkeeping -----------------------------------------------------------------------
    def _describe(self, cfg: GenerationConfig, ids: list[int]) -> dict[str, Any]:
        d = asdict(cfg)
        d["synthetic_rates"] = list(cfg.synthetic_rates) if cfg.synthetic_rates else None
        d.update(target=self.names.get("target", type(self.target_model).__name__),
                 draft=self.names.get("draft", ""), device=str(self.device),
                 dtype=self.names.get("dtype", str(next(self.target_model.parameters()).dtype).split(".")[-1]),
                 runner=getattr(self.runner_factory, "func", self.runner_factory).__name__,
                 compile=bool(getattr(self.runner_factory, "keywords", {}).get("compile")), prompt_length=len(ids),
                 vocab_size=self.vocab_size)
        if "model_sources" in self.names:  # file format, GGUF file and quantisation type (from_pretrained)
            d["model_sources"] = self.names["model_sources"]
        notes = [n for m in (self.target_model, self.draft_model) if m is not None for n in capture_notes(m)]
        if notes:  # CUDA-graph captures that failed in this process (those forwards run eagerly): the speedup panel
            d["graph_notes"] = notes
        describe = methods.get(cfg.method).describe
        d.update(describe(cfg) if describe is not None else {})
        if cfg.verify == "typical":
            from .sampling.typical import LOSSY_NOTE

            d["verify_note"] = LOSSY_NOTE
        if cfg.method in self.heads:  # which head drafted, and which target features it read
            head_cfg = self.heads[cfg.method].config
            d["head"] = {"path": self.names.get(f"{cfg.method}_head", ""), "kind": head_cfg.kind,
                         "aux_layer_ids": list(getattr(head_cfg, "aux_layer_ids", ()))}
            if head_cfg.kind == "dflash":
                d["head"].update(target_layer_ids=list(head_cfg.target_layer_ids), block_size=head_cfg.block_size,
                                 num_layers=head_cfg.num_layers, mask_token_id=head_cfg.mask_token_id)
        return d

    def _add_texts(self, trace: Trace | None, generated: list[int]) -> None:
        """Fill the trace's text fields: ``prompt_text``, ``text`` (the output so far) and
        ``token_texts`` for every id the trace mentions (decoding only ids not seen before), so
        partial traces streamed by :meth:`iter_generate` are as readable as the final one."""
        if trace is None:
            return
        tok, texts = self.tokenizer, trace.token_texts
        if not trace.prompt_text:
            trace.prompt_text = tok.decode(trace.prompt_token_ids, skip_special_tokens=True)
        trace.text = tok.decode(generated, skip_special_tokens=True)
        ids = set(trace.prompt_token_ids) if not texts else set()
        ids.update(generated[-64:] if texts else generated)
        for s in trace.steps[-1:] if texts else trace.steps:
            ids.update(s.draft_token_ids)
            ids.update(n.token_id for n in s.nodes)  # a tree's nodes off the row (the tree view names them)
            ids.update(_match_ids(s.match))  # tokens a proposer's details name (Medusa candidates, DFlash top tokens)
            ids.update(int(t) for pos in s.positions for top in (pos.p_top, pos.q_top, pos.residual_top) for t, _ in top)
            ids.update(int(t) for t, _ in s.emitted.top)
        for t in sorted(i for i in ids if str(i) not in texts):
            texts[str(t)] = tok.decode([t])


def _match_ids(obj: Any) -> Iterator[int]:
    """Token ids named in a step's draft details (``Step.match``): values of keys ending in ``token_id`` /
    ``token_ids`` and the ids of ``candidates`` lists ([[id, prob], ...]), at any depth."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key.endswith("token_id") and isinstance(value, int) and value >= 0:
                yield value
            elif key.endswith("token_ids") and isinstance(value, list):
                yield from (int(t) for t in value if isinstance(t, int) and t >= 0)
            elif key == "candidates" and isinstance(value, list):
                yield from (int(c[0]) for c in value if isinstance(c, (list, tuple)) and c and isinstance(c[0], int))
            else:
                yield from _match_ids(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from _match_ids(item)


class _Publication:
    """One step's events: calling it publishes them (once; later calls do nothing). Its detailed record (a
    chain's or a tree's) was queued on the device with its verification, so publishing reads a finished copy."""

    def __init__(self, publish: Callable[[], None]):
        self._publish: Callable[[], None] | None = publish

    def __call__(self) -> None:
        fn, self._publish = self._publish, None
        if fn is not None:
            fn()


def _publish_all(pending: "list[_Publication]") -> None:
    """Publish ``pending`` in order and empty it."""
    for publication in pending:
        publication()
    pending.clear()


def _load_heads(dirs: dict[str, Any], target_model: torch.nn.Module,
                explicit: set[str]) -> tuple[dict[str, torch.nn.Module], dict[str, str]]:
    """Load each head directory onto the target. A head asked for explicitly (``explicit``) that
    fails raises :class:`ModelLoadError`; a bundled one that fails is left out, its reason kept."""
    from .heads import load_head
    from .heads.dflash import load_dflash

    loaded, errors = {}, {}
    for kind, directory in dirs.items():
        if kind not in DEFAULT_HEADS:
            raise ValueError(f"unknown head kind {kind!r} in heads=; use one of {', '.join(DEFAULT_HEADS)}")
        try:
            head = (load_dflash if kind == "dflash" else load_head)(directory, target_model)
            if head.config.kind != kind:
                raise ValueError(f"the head in {directory} is an {head.config.kind!r} head, not {kind!r}")
            loaded[kind] = head
        except ValueError as exc:
            if kind in explicit:
                raise ModelLoadError(f"could not load the {kind} head {str(directory)!r}: {exc}") from exc
            errors[kind] = f"the bundled head {directory} does not load: {exc}"
    return loaded, errors


def warm_up_specs(vocab: int, max_speculative_tokens: int, verify_methods: Sequence[str] = VERIFY_METHODS,
                  temperatures: Sequence[float] = (0.8, 1.0),
                  synthetic_rates: tuple[float, ...] = (0.8, 0.6, 0.4, 0.3, 0.2),
                  backend: str = "triton") -> list[VerifySpec]:
    """The verifier specs a request can reach with k <= ``max_speculative_tokens``: every k' in
    0..max, each verify method, one-hot q (ngram, suffix, greedy draft) and, when sampling, full q
    (draft_model at T > 0); greedy at temperature 0 only, the others at 0 and at ``temperatures``
    (top-k / top-p off). Detailed records (the app's setting)."""
    specs = []
    from .sampling.reference import METHODS as CAPTURED  # what the verifier's graphs run (typical: eager only)

    for verify in verify_methods:
        if verify not in CAPTURED:
            continue
        for temp in (0.0,) if verify == "greedy" else (0.0, *temperatures):
            for full_q in (False,) if temp == 0 else (False, True):
                for k in range(max_speculative_tokens + 1):
                    if verify == "synthetic" and k > len(synthetic_rates):
                        break  # more drafts than rates: the request is refused before verification
                    specs.append(VerifySpec(k=k, vocab=vocab, verify=verify, temperature=float(temp), top_k=None,
                                            top_p=None, full_q=full_q and k > 0, detailed=True,
                                            synthetic_rates=synthetic_rates if verify == "synthetic" else None,
                                            backend=backend))
    return list(dict.fromkeys(specs))


def _capture_s(*objects: Any) -> float:
    """Seconds the runners / verifier spent capturing CUDA graphs so far (their ``capture_s``)."""
    return sum(float(getattr(o, "capture_s", 0.0)) for o in objects if o is not None)


def _truncate(emitted: list[int], remaining: int, eos_ids: set[int]) -> tuple[list[int], bool]:
    """Cut the step's tokens at max_new_tokens and just after the first EOS."""
    out = emitted[:remaining]
    for i, t in enumerate(out):
        if t in eos_ids:
            return out[: i + 1], True
    return out, False


def _brief_record(emitted: list[int], acc: int, k: int) -> dict[str, Any]:
    kind = "target" if k == 0 else ("bonus" if acc == k else "recovered")
    return {"num_accepted": acc, "output_token_ids": emitted, "positions": [],
            "emitted": {"position": acc + 1, "token_id": emitted[-1], "kind": kind, "p": None, "top": []}}


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else list(eos))
    if not ids and getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
