"""The speculative decoding loop (batch size 1), read top to bottom.

    prefill(prompt[:-1]); proposer.observe(prefill's features)
    repeat until EOS or max_new_tokens:
        draft    = proposer.propose(context, k_step)          # x_1..x_k' (a chain) or N tree nodes, q
        logits   = target.forward([last, draft])              # p for every row (+ feature taps): one forward
        verified = verifier.queue(logits, draft).result()     # accepted + recovered/bonus: the step's one wait
        commit accepted + 1 tokens; proposer.observe(outcome); target.truncate(len(context) - 1)

A chain is the tree whose parents are i - 1: one verifier, one :class:`~specviz.verify.Verified`, one trace step
for both. The step's events are published during the next step's target forward. ``method="none"`` is plain
autoregressive decoding through the same loop (k' = 0, the sampler draws the bonus token from p), the baseline every
chart compares against; with ``async_scheduling`` (its default on CUDA) step i + 1's forward, fed step i's token on
the device, is queued before step i's wait, so the host's launch and bookkeeping overlap the GPU's forward.
Settings: :mod:`specviz.config`; loading: :mod:`specviz.loading`; methods: :mod:`specviz.methods`; warm-up:
:mod:`specviz.warmup`. Sources: Leviathan et al. 2023 (Alg. 1), Chen et al. 2023,
vLLM ``v1/spec_decode``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Sequence

import torch

from . import events as ev
from . import methods
from .config import MAX_SPECULATIVE_TOKENS, VERIFY_METHODS, GenerationConfig
from .compile_stage import CompileStatus, initial_status
from .compiled_graphs import compiled_label
from .describe import add_texts, describe_request
from .loading import load_parts, runner_options
from .methods.base import Build
from .models import check_draft, eos_token_ids
from .pools import Pool, device_lock
from .proposer import Draft, Outcome, Proposer, StepContext
from .runner import EagerRunner, ForwardOutput, ModelRunner
from .timing import StepTimer, capture_seconds
from .trace import Recorder, Trace
from .verify import StepVerifier, VerifySpec

__all__ = ["GenerationConfig", "MAX_SPECULATIVE_TOKENS", "METHODS", "SpecDecoder", "VERIFY_METHODS"]
METHODS = methods.names()  # the built-in methods at import; methods.names() also lists ones registered later


class SpecDecoder:
    """Speculative decoding over HF causal LMs, recording a :class:`~specviz.trace.Trace`.

    Build with :meth:`from_pretrained`. Every request leases its own runners (KV caches) from ``pool``, so one
    decoder may serve several threads at once; ``target_runner``, ``step_verifier`` and ``current_proposer`` are the
    most recent request's, kept for inspection. ``draft_tokenizer``: the draft's own tokenizer, which must equal the target's
    (:func:`specviz.models.tokenizer_mismatch`; ValueError says what differs); the models' vocabulary rows may differ
    by padding beyond the tokenizer (draft q is then cut or zero-padded to the target's V).
    """

    def __init__(self, target_model: torch.nn.Module, tokenizer: Any, draft_model: torch.nn.Module | None = None,
                 runner_factory: Callable[[torch.nn.Module], ModelRunner] = EagerRunner,
                 names: dict[str, str] | None = None, draft_tokenizer: Any = None,
                 heads: dict[str, torch.nn.Module] | None = None, head_errors: dict[str, str] | None = None,
                 compile_status: CompileStatus | None = None):
        self.target_model, self.tokenizer, self.draft_model = target_model, tokenizer, draft_model
        self.heads = dict(heads or {})  # {method: its head, attached to target_model}
        self.head_errors = dict(head_errors or {})  # {method: why it has no head}, for the error message
        self.device = next(target_model.parameters()).device
        self.runner_factory, self.names = runner_factory, names or {}
        opts = runner_options(runner_factory)  # compile None on CUDA with the static runner: the warm-up compiles
        self.compile_status = compile_status or initial_status(opts.get("compile"), self.device, opts["static"])
        self.vocab_size = int(target_model.get_output_embeddings().weight.shape[0])
        check_draft(draft_model, tokenizer, draft_tokenizer, self.vocab_size)
        self.eos_token_ids = eos_token_ids(target_model, tokenizer)
        self.max_length = int(getattr(target_model.config, "max_position_embeddings", 0) or 0)
        self.pool = Pool()  # runners, verifiers, head runners: reused across requests
        self.target_runner: ModelRunner | None = None
        self.step_verifier: StepVerifier | None = None
        self.current_proposer: Proposer | None = None
        self._request_states: dict[str, Any] = {}

    @classmethod
    def from_pretrained(cls, target: str | None = None, draft: str | None = None,
                        device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
                        runner: str = "auto", max_cache_len: int = 4096,
                        heads: dict[str, str] | None = None, compile: bool | str | None = None) -> "SpecDecoder":
        """Load target (and optional draft) from a local directory, a ``.gguf`` file (or a directory holding one), a
        preset ("smollm2") or a hub id: safetensors or GGUF through transformers, never remote code
        (:func:`specviz.models.load_model`); the trace's config records each model's source (``model_sources``).

        target None -> the bundled demo target, with the bundled draft (if ``draft`` is None too) and the bundled
        heads of every method that has one (``assets/models``). heads: {method: head directory}, each loaded by its
        method's loader onto the target (on the bundled target it replaces that method's bundled head only); a
        method whose head is absent raises ValueError when asked for. device None -> CUDA if available else CPU;
        dtype None -> bf16 on CUDA, fp32 on CPU. runner: "eager" (DynamicCache), "static" (a pre-allocated cache
        of ``max_cache_len`` tokens, CUDA graphs on CUDA) or "auto" (static on CUDA). compile: the static runners'
        ``torch.compile`` of small forwards: True from the start, False never, "background" on CUDA by the warm-up's
        compile stage behind the uncompiled graphs (:mod:`specviz.compile_stage`; ``compile_status``), None: the
        default (:data:`specviz.compile_stage.BACKGROUND_DEFAULT`). ValueError for another value.
        Raises :class:`specviz.models.ModelLoadError` (a ValueError) if a model or a given head cannot be loaded, and
        :class:`specviz.attention.UnsupportedModelError` (a ValueError naming the family and why) for a family the
        runners cannot decode exactly."""
        return cls(**load_parts(target, draft, device, dtype, runner, max_cache_len, heads, compile))

    @property
    def runner_options(self) -> dict[str, Any]:
        """What every request's runner is (:func:`specviz.loading.runner_options`): static or eager, its cache
        length, compiled or not; methods that build runners of their own match it."""
        return runner_options(self.runner_factory)

    def make_runner(self, model: torch.nn.Module) -> ModelRunner:
        """A new runner of ``model``; once the compile stage has started it compiles its own captures."""
        runner = self.runner_factory(model)
        if self.compile_status.mode == "auto" and self.compile_status.active and hasattr(runner, "enable_compile"):
            runner.enable_compile()
        return runner

    def request_state(self, method: str) -> Any:
        """The decoder's own state of ``method`` kept across requests (``Method.request_state``), made on first use."""
        if method not in self._request_states:
            self._request_states[method] = methods.get(method).request_state()
        return self._request_states[method]

    def pooled_capture_s(self) -> float:
        """Seconds the pooled runners and verifiers spent capturing CUDA graphs."""
        return capture_seconds(*self.pool.objects())

    def warm_up(self, max_speculative_tokens: int = MAX_SPECULATIVE_TOKENS, verify_methods: Sequence[str] = VERIFY_METHODS,
                temperatures: Sequence[float] = (0.8, 1.0), synthetic_rates: Sequence[float] = (0.8, 0.6, 0.4, 0.3, 0.2),
                progress: Callable[[str], None] | None = None,
                method_names: Sequence[str] | None = None, compile: bool | None = None) -> dict[str, float]:
        """Pay the one-time costs before the first real request (:func:`specviz.warmup.warm_up`; ``method_names``:
        only these methods' drafters; ``compile``: run the compile stage, None: when ``compile_status.mode`` is
        "auto"), holding the device lock throughout. Returns {"seconds", "capture_s", "graphs", "compiled"}."""
        from .warmup import warm_up

        with device_lock(self.device):  # no other thread's CUDA work may run while graphs are captured
            return warm_up(self, max_speculative_tokens, verify_methods, temperatures, synthetic_rates, progress,
                           method_names=method_names, compile=compile)

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Prompt text or token ids -> ids. Raises ValueError on an empty or invalid prompt."""
        if isinstance(prompt, str):
            # verbose=False: no tokenizer warning for a prompt over model_max_length (generate refuses it, with why)
            ids = self.tokenizer(prompt, add_special_tokens=True, verbose=False)["input_ids"] if prompt.strip() else []
        else:
            ids = [int(t) for t in prompt]
            if any(t < 0 or t >= self.vocab_size for t in ids):
                raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
        if not ids:
            raise ValueError("the prompt is empty: type some text (or pass a list of token ids)")
        return ids

    def make_proposer(self, cfg: GenerationConfig, build: Build | None = None) -> Proposer | None:
        """The request's proposer, made by its method (:mod:`specviz.methods`) with ``build``'s leases."""
        return methods.get(cfg.method).make(build if build is not None else Build(self, cfg))

    # ---- the loop --------------------------------------------------------------------------
    def generate(self, prompt: str | Sequence[int], **settings: Any) -> Trace:
        """Run one request and return its :class:`Trace`.

        Settings (keywords, :mod:`specviz.config`): method (a name of :func:`specviz.methods.names`),
        num_speculative_tokens (k, 1..32; with a tree the most drafts on one path), verify ("greedy" | "standard" |
        "block" | "synthetic" | "typical" (lossy); default greedy at temperature 0, else standard), temperature,
        top_k, top_p, max_new_tokens, seed, synthetic_rates, sampler_backend ("auto": Triton on CUDA),
        detailed_trace, typical_acceptance_sampler_posterior_threshold / _alpha, a draft tree
        (speculative_token_tree, eagle_tree_top_k / _depth / _total_tokens, <method>_tree_branches), the method's own
        options (e.g. prompt_lookup_min / max); bus (an :class:`~specviz.events.EventBus` to publish on);
        request_state (the method's state kept across requests, e.g. suffix's tree of earlier outputs; default the
        decoder's own). Raises ValueError on invalid settings or prompt."""
        trace = None
        for trace in self._iter(prompt, settings.pop("bus", None), False, settings):  # texts decoded once, at the end
            pass
        return trace

    def iter_generate(self, prompt: str | Sequence[int], bus: ev.EventBus | None = None,
                      **settings: Any) -> Iterator[Trace]:
        """Like :meth:`generate`, but yields the partial trace after every step (the same Trace object, growing in
        place: copy it to keep a snapshot); closing the iterator stops the request cleanly (stop_reason "stopped").
        Each yielded trace holds every finished step and its texts. ``wall_time_s`` includes the caller's time
        between steps; ``metrics["time_ms"]`` holds the engine's own draft / verify / sample time."""
        yield from self._iter(prompt, bus, True, settings)

    def _iter(self, prompt: str | Sequence[int], bus: ev.EventBus | None, stream_texts: bool,
              settings: dict[str, Any]) -> Iterator[Trace]:
        state = settings.pop("request_state", None)
        cfg = GenerationConfig.from_settings(cuda=self.device.type == "cuda", **settings)
        missing = methods.get(cfg.method).missing(self)
        if missing:
            raise ValueError(missing)
        ids = self.encode(prompt)
        if self.max_length and len(ids) + cfg.max_new_tokens > self.max_length:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the "
                             f"model's context of {self.max_length} tokens; shorten the prompt or lower max_new_tokens")
        bus = bus or ev.EventBus()
        recorder = Recorder(bus)
        lock, start = device_lock(self.device), time.perf_counter()
        try:
            with lock:  # released at every yield: other requests' steps may run between this one's
                yield from self._run(ids, cfg, bus, recorder, stream_texts, Build(self, cfg, state), lock, start)
            yield recorder.trace  # the finished trace, outside the lock
        finally:
            recorder.close()

    def _run(self, ids: list[int], cfg: GenerationConfig, bus: ev.EventBus, recorder: Recorder, stream_texts: bool,
             build: Build, lock: Any, start: float) -> Iterator[Trace]:
        bus.publish(ev.GenerationStarted(config=describe_request(self, cfg, ids), prompt_token_ids=list(ids)))
        ctx = StepContext(temperature=cfg.temperature, generator=torch.Generator(device=self.device).manual_seed(
            cfg.sampling.seed), top_k=cfg.sampling.top_k, top_p=cfg.sampling.top_p)
        generated: list[int] = []
        pending: list[ev.Publication] = []  # steps whose events are not published yet (see _step)
        stop_reason, passes, step = "stopped", 0, 0
        runner, replays = None, None
        try:
            proposer = self.current_proposer = self.make_proposer(cfg, build=build)
            if proposer is not None:
                proposer.reset()
            runner = self.target_runner = build.lease(id(self.target_model), lambda: self.make_runner(self.target_model))
            replays = list(getattr(runner, "replays", ()))  # which graphs this request replays: compiled or not
            verifier = self.step_verifier = build.lease("verifier", lambda: StepVerifier(self.device))
            runner.reset()
            ctx.target_runner = runner  # read-only for proposers (mtp reads its KV cache: runner.layer_kv)
            taps = proposer.taps if proposer is not None else ()  # target features the proposer declared
            if len(ids) > 1:
                prefill = runner.forward_features(torch.tensor(ids[:-1], dtype=torch.long), taps)
                passes += 1
                if proposer is not None:  # features f_0..f_{n-1}, each with the token after it
                    proposer.observe(Outcome(0, [], 0, ids[1:], prefill.features))
            last = torch.tensor([ids[-1]], dtype=torch.long).to(self.device)  # [1]: later steps keep it on the device
            ahead = None  # async scheduling: the next step's target forward, already queued
            while True:
                committed, hit_eos, last, publication, ahead = self._step(step, ids, last, len(generated), cfg, runner,
                                                                          verifier, proposer, ctx, bus, pending, ahead)
                pending.append(publication)
                passes += 1
                ids.extend(committed)
                generated.extend(committed)
                runner.truncate(len(ids) - (0 if ahead is not None else 1))  # a queued forward holds the newest token
                step += 1
                if hit_eos or len(generated) >= cfg.max_new_tokens:
                    stop_reason = "eos" if hit_eos else "max_new_tokens"
                    break
                if stream_texts:  # a streamed trace is whole at every yield, its clock too (a Stop keeps it)
                    ev.publish_all(pending)
                    add_texts(self.tokenizer, recorder.trace, generated)
                    recorder.trace.wall_time_s, recorder.trace.target_forward_passes = time.perf_counter() - start, passes
                lock.__exit__(None, None, None)  # between steps other requests' steps may run
                try:
                    yield recorder.trace
                finally:
                    lock.__enter__()
        finally:
            ev.publish_all(pending)
            label = compiled_label(replays, runner.replays) if replays else None  # read before the lease goes back
            build.finish(generated)  # the method's finish (suffix: this output joins its tree), then every lease back
            bus.publish(ev.GenerationFinished(stop_reason=stop_reason, output_token_ids=generated,
                                              wall_time_s=time.perf_counter() - start, target_forward_passes=passes,
                                              config={**({"runner_compiled": label} if label else {}),
                                                      # compiled graphs trace transformers' layers
                                                      "runner_fused": bool(getattr(runner, "fused", False))
                                                      and not (label or "").startswith(("compiled", "partly"))}))
            add_texts(self.tokenizer, recorder.trace, generated)

    def _step(self, step: int, ids: list[int], last: torch.Tensor, num_generated: int, cfg: GenerationConfig,
              runner: ModelRunner, verifier: StepVerifier, proposer: Proposer | None, ctx: StepContext,
              bus: ev.EventBus, pending: "list[ev.Publication]", ahead: "ForwardOutput | None" = None
              ) -> tuple[list[int], bool, torch.Tensor, ev.Publication, "ForwardOutput | None"]:
        """One verification step. ``last``: the last committed token, int64 [1] on the device; ``pending``: earlier
        steps' unpublished events (oldest first), all but the newest published while the GPU computes this step's
        forward (the newest's detailed record is still being copied: steps are published two steps late); ``ahead``:
        this step's target forward when the last step queued it (async scheduling, method none). Returns (committed
        tokens, whether EOS was committed, the next step's ``last``, this step's publication, the next step's forward
        if this step queued it: with async scheduling whenever a next step may come; after an EOS it goes unused).

        Nothing here waits for the GPU except the verifier's one device-to-host copy of the step's tokens
        (``result()``); the next input, a tree's kept rows and the detailed record stay on the device or are copied
        behind the verification, so the commit and the next step need no host-to-device copy."""
        remaining = cfg.max_new_tokens - num_generated
        timer = StepTimer(lambda: capture_seconds(runner, verifier, proposer, getattr(proposer, "runner", None)))
        k_step = min(cfg.num_speculative_tokens, remaining - 1)  # never draft past max_new_tokens
        if proposer is not None and k_step > 0:
            draft = proposer.propose(ids, k_step, ctx)
        else:
            draft = Draft(token_ids=torch.empty(0, dtype=torch.long), details={"kind": cfg.method})
        x = draft.token_ids.to(self.device, non_blocking=True)  # [k'] int64; host drafts come pinned: no wait
        timer.lap("draft")
        if ahead is not None:
            forward = ahead
        else:
            fed = torch.cat([last, x.clamp(min=0)]) if x.numel() else last  # ngram_gpu's -1 padding is fed as 0
            forward = runner.forward_features(fed, proposer.taps if proposer is not None else (),
                                              parents=None if draft.is_chain else draft.forward_parents)
        timer.lap("verify")  # logits [1 + k', V]: p for every row in one forward (+ the proposer's feature taps)
        q = draft.probs.to(self.device, torch.float32) if draft.probs is not None else None  # [k', V] or None
        v = cfg.verification
        spec = VerifySpec(k=int(x.numel()), vocab=self.vocab_size, verify=v.rule, temperature=cfg.temperature,
                          top_k=cfg.sampling.top_k, top_p=cfg.sampling.top_p, full_q=q is not None,
                          detailed=v.detailed, synthetic_rates=v.synthetic_rates, backend=v.backend,
                          typical=(v.typical_threshold, v.typical_alpha) if v.rule == "typical" else None)
        queued = verifier.queue(spec, forward.logits, q, x, draft, ctx.generator)  # right behind the forward
        timer.lap("sample")
        nxt = None
        room = getattr(runner, "max_cache_len", None)  # a static cache holds its last slot for a step, not a look-ahead
        if cfg.async_scheduling and proposer is None and remaining > 1 and (room is None or len(ids) < room):
            nxt = runner.forward_features(queued.next_input)
            timer.lap("verify")
        while len(pending) > 1:  # earlier steps' events while the GPU works (their detail was copied long ago)
            pending.pop(0)()
        timer.lap(None)
        verified = queued.result()  # the step's one wait
        if verified.kept_rows is not None:  # a tree: the accepted path's K/V compacted into place
            runner.commit(verified.path, rows=verified.kept_rows[1:1 + verified.num_accepted])
        timer.lap("sample")
        committed, hit_eos = _truncate(verified.emitted, remaining, self.eos_token_ids)
        if proposer is not None:  # the features at the committed positions (a tree: the path's rows), on the device
            n_c, rows = len(committed), verified.kept_rows
            proposer.observe(Outcome(len(ids) - 1, verified.draft_ids, verified.num_accepted, committed,
                                     {tap: f[:n_c] if rows is None else f.index_select(0, rows[:n_c])
                                      for tap, f in forward.features.items()}))
        timer.lap("draft")  # observing what was committed is drafting work (method none has none)
        timings = timer.timings()

        def publish() -> None:
            bus.publish(ev.DraftProposed(step=step, proposer=proposer.name if proposer else "none",
                                         token_ids=verified.token_ids, details=draft.details,
                                         draft_ms=timings["draft_ms"]))
            bus.publish(ev.StepVerified(step=step, record=verified.record(), verify_ms=timings["verify_ms"],
                                        sample_ms=timings["sample_ms"], capture_ms=timings["capture_ms"]))
            bus.publish(ev.TokensCommitted(step=step, token_ids=committed, num_generated=num_generated + len(committed)))

        return committed, hit_eos, verified.next_input, ev.Publication(publish), nxt


def _truncate(emitted: list[int], remaining: int, eos_ids: set[int]) -> tuple[list[int], bool]:
    """Cut the step's tokens at max_new_tokens and just after the first EOS."""
    out = emitted[:remaining]
    for i, t in enumerate(out):
        if t in eos_ids:
            return out[: i + 1], True
    return out, False
