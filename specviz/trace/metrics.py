"""One definition of every run metric: :class:`RunMetrics`, counted from committed tokens (definitions in
:mod:`specviz.trace.schema`'s docstring), and the acceptance-length conventions engines report.

Every reader (the trace's stored ``metrics``, the CLI, the Run tab's statistics and speedup panel, the lesson,
Compare, the speedup measurement) builds a :class:`RunMetrics` with :meth:`RunMetrics.of` or
:meth:`RunMetrics.pooled` and reads its fields; none counts a metric its own way.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from .schema import Step, Trace


TOKENS_PER_FORWARD_FORMULA = ("generated tokens / verification steps (one target forward each; the prefill "
                              "forward emits no token and is not counted)")
TIME_PARTS = ("draft", "verify", "sample")
# the run summary's fields (RunMetrics.summary): what the speedup table and an export's baseline_none hold
SUMMARY_FIELDS = ("method", "tokens", "steps", "target_forward_passes", "tokens_per_forward", "time_ms", "decode_s",
                  "decode_tokens_per_second", "wall_time_s", "tokens_per_second")


def tokens_per_target_forward(num_tokens: int, num_steps: int) -> float:
    """Tokens per target forward = committed tokens / verification steps (0.0 with no steps).

    Every verification step is one target forward over [last token, x_1..x_k'] and commits
    1..k'+1 tokens; the prefill forward (over prompt[:-1]) commits none and is NOT counted, so
    plain decoding (method "none") scores exactly 1.0 and ``Trace.target_forward_passes`` =
    steps + 1. vLLM (vllm-project/vllm#24344) calls output tokens / verification steps the
    "seq-normalized acceptance length". The hardware-independent speedup over method none is the
    ratio of this number."""
    return num_tokens / num_steps if num_steps else 0.0


def counted(step: Step) -> tuple[int, int, int]:
    """(accepted, discarded, kept depth) of a drafting step as every metric counts them, from its committed tokens.

    accepted = committed tokens - 1: vLLM's count (``num_accepted = len(generated_token_ids) - 1``) over what was
    committed, so every drafting step counts 1 + accepted tokens. A step cut by the stop (EOS among its accepted
    drafts, so its recovered / bonus token was dropped) committed no token of its own: its last committed token (the
    EOS) is counted as the step's one token, not as an accepted draft, and the drafts from its depth on are
    discarded (neither accepted nor rejected). discarded: drafted nodes deeper than accepted in a cut step, else 0;
    kept depth: the deepest position still counted (the draft's depth, or accepted in a cut step)."""
    accepted = max(len(step.committed_token_ids) - 1, 0)
    if step.emitted_committed:
        return accepted, 0, step.draft_depth
    depths = [n.depth for n in step.nodes] or range(1, len(step.draft_token_ids) + 1)
    return accepted, sum(1 for d in depths if d > accepted), accepted


def tested_depth(step: Step) -> int:
    """The deepest position of a drafting step where the verifier tested a draft: accepted + 1 after a rejection,
    accepted when the accepted path ended at a leaf (the emitted token is a bonus: a tree path shorter than the
    tree's depth offered no child there) or when the stop cut the step (:func:`counted`)."""
    accepted, _, kept = counted(step)
    if step.emitted_committed and step.emitted.kind == "bonus":
        return accepted
    return min(accepted + 1, kept)


@dataclass(frozen=True)
class RunMetrics:
    """A run's (or pooled runs') metrics: vLLM's spec-decode counters from committed tokens, the rates built on
    them, and the totals the speedup panel compares. Built by :meth:`of` (one trace) or :meth:`pooled`.

    Counts (ints): num_steps (verification steps = target forwards after the prefill), num_drafts (steps that
    drafted), num_draft_tokens (drafted nodes), num_discarded_draft_tokens, num_accepted_tokens (:func:`counted`),
    num_generated_tokens (committed), num_drafting_step_tokens (committed tokens of drafting steps =
    num_drafts + num_accepted_tokens), num_verified_positions (per drafting step :func:`tested_depth`),
    num_cut_steps (steps cut by the stop), target_forward_passes (the prefill, when the prompt has more than one
    token, + one per step: the engine's count, also for a run stopped early).
    Rates: mean_acceptance_length (vLLM: 1 + accepted / drafts = committed tokens of drafting steps / drafts; 1.0
    without drafts), draft_acceptance_rate (accepted / (drafted - discarded)), alpha (accepted / verified positions,
    the i.i.d. estimate; None without drafts), tokens_per_target_forward, draft_coverage, the per-position lists
    (schema docstring) and acceptance_histogram.
    Time: time_ms {draft, verify, sample} (engine ms summed over steps; CUDA-graph capture excluded), capture_ms,
    decode_s (their sum, s), decode_tokens_per_second (tokens / decode_s), wall_time_s (the engine's clock of the
    whole request, prefill included; so far, for a run still streaming or stopped), tokens_per_second (tokens /
    wall_time_s)."""

    method: str = ""
    num_speculative_tokens: int = 0
    num_steps: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_discarded_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_generated_tokens: int = 0
    num_drafting_step_tokens: int = 0
    num_verified_positions: int = 0
    num_cut_steps: int = 0
    target_forward_passes: int = 0
    mean_acceptance_length: float = 1.0
    draft_acceptance_rate: float = 0.0
    alpha: float | None = None
    tokens_per_target_forward: float = 0.0
    draft_coverage: float = 0.0
    accepted_per_position: list[int] = field(default_factory=list)
    acceptance_rate_per_position: list[float] = field(default_factory=list)
    conditional_acceptance_rate: list[float] = field(default_factory=list)
    offered_per_position: list[int] = field(default_factory=list)
    drafted_per_depth: list[int] = field(default_factory=list)
    acceptance_rate_per_depth: list[float] = field(default_factory=list)
    depth_acceptance_rate: float = 0.0
    acceptance_histogram: list[int] = field(default_factory=lambda: [0])
    time_ms: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIME_PARTS, 0.0))
    capture_ms: float = 0.0
    decode_s: float = 0.0
    decode_tokens_per_second: float = 0.0
    wall_time_s: float = 0.0
    tokens_per_second: float = 0.0

    @classmethod
    def of(cls, trace: Trace) -> "RunMetrics":
        """The metrics of one trace (finished, streaming or stopped), always from its steps."""
        return cls.pooled([trace])

    @classmethod
    def pooled(cls, traces: Sequence[Trace], num_speculative_tokens: int | None = None) -> "RunMetrics":
        """The metrics of ``traces`` pooled: their steps' counters summed, as vLLM sums over requests (step-weighted,
        not a mean of per-request means), forwards and wall times summed. ``num_speculative_tokens``: the length of
        the per-position lists at least (default the first trace's k); method: the first trace's."""
        k = num_speculative_tokens
        if k is None:
            k = int(traces[0].config.get("num_speculative_tokens", 0) or 0) if traces else 0
        wall = sum(float(t.wall_time_s) for t in traces)
        forwards = sum(len(t.steps) + (len(t.prompt_token_ids) > 1) for t in traces)  # the engine's count, also mid-run
        return cls.from_steps([s for t in traces for s in t.steps], k, forwards, wall,
                              str(traces[0].config.get("method", "")) if traces else "")

    @classmethod
    def from_steps(cls, steps: Sequence[Step], num_speculative_tokens: int, target_forward_passes: int = 0,
                   wall_time_s: float = 0.0, method: str = "") -> "RunMetrics":
        """The metrics of ``steps`` (see the class docstring); the totals a trace adds are passed in."""
        drafting = [s for s in steps if s.draft_token_ids or s.nodes]
        k = max([num_speculative_tokens, *(s.draft_depth for s in steps)] or [0])
        rows = [counted(s) for s in drafting]
        acc = [a for a, _, _ in rows]
        kept = [d for _, _, d in rows]
        tested = [tested_depth(s) for s in drafting]
        drafts, accepted = len(drafting), sum(acc)
        draft_tokens, discarded = sum(s.num_drafted for s in drafting), sum(d for _, d, _ in rows)
        per_pos = [sum(1 for a in acc if a >= i + 1) for i in range(k)]
        offered = [sum(1 for t in tested if t >= i + 1) for i in range(k)]
        reached = [sum(1 for n in kept if n >= i + 1) for i in range(k)]
        verified = sum(tested)
        generated = sum(len(s.committed_token_ids) for s in steps)
        time_ms = {key: sum(float(s.timings_ms.get(key, 0.0)) for s in steps) for key in TIME_PARTS}
        decode_s = sum(time_ms.values()) / 1e3
        return cls(
            method=method, num_speculative_tokens=int(num_speculative_tokens), num_steps=len(steps),
            num_drafts=drafts, num_draft_tokens=draft_tokens, num_discarded_draft_tokens=discarded,
            num_accepted_tokens=accepted, num_generated_tokens=generated,
            num_drafting_step_tokens=sum(len(s.committed_token_ids) for s in drafting),
            num_verified_positions=verified, num_cut_steps=sum(1 for s in steps if not s.emitted_committed),
            target_forward_passes=int(target_forward_passes),
            mean_acceptance_length=1.0 + accepted / drafts if drafts else 1.0,
            draft_acceptance_rate=accepted / (draft_tokens - discarded) if draft_tokens > discarded else 0.0,
            alpha=accepted / verified if verified else None,
            tokens_per_target_forward=tokens_per_target_forward(generated, len(steps)),
            draft_coverage=drafts / len(steps) if steps else 0.0,
            accepted_per_position=per_pos,
            acceptance_rate_per_position=[c / drafts if drafts else 0.0 for c in per_pos],
            conditional_acceptance_rate=[a / o if o else 0.0 for a, o in zip(per_pos, offered)],
            offered_per_position=offered, drafted_per_depth=reached,
            acceptance_rate_per_depth=[a / d if d else 0.0 for a, d in zip(per_pos, reached)],
            depth_acceptance_rate=accepted / sum(reached) if sum(reached) else 0.0,
            acceptance_histogram=[sum(1 for a in acc if a == j) for j in range(k + 1)],
            time_ms=time_ms, capture_ms=sum(float(s.timings_ms.get("capture", 0.0)) for s in steps),
            decode_s=decode_s, decode_tokens_per_second=generated / decode_s if decode_s > 0 else 0.0,
            wall_time_s=float(wall_time_s), tokens_per_second=generated / wall_time_s if wall_time_s > 0 else 0.0)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``Trace.metrics`` (JSON): every field, plus ``tokens_per_step`` (the older name of
        tokens_per_target_forward, kept for traces' readers)."""
        return {**asdict(self), "tokens_per_step": self.tokens_per_target_forward}

    def summary(self) -> dict[str, Any]:
        """The run summary the speedup table compares and an export stores as ``baseline_none``
        (:data:`SUMMARY_FIELDS`; tokens = num_generated_tokens, steps = num_steps, tokens_per_forward =
        tokens_per_target_forward)."""
        return {"method": self.method, "tokens": self.num_generated_tokens, "steps": self.num_steps,
                "target_forward_passes": self.target_forward_passes,
                "tokens_per_forward": self.tokens_per_target_forward, "time_ms": dict(self.time_ms),
                "decode_s": self.decode_s, "decode_tokens_per_second": self.decode_tokens_per_second,
                "wall_time_s": self.wall_time_s, "tokens_per_second": self.tokens_per_second}

    def acceptance_length(self, convention: str = "vllm") -> float | None:
        """Mean acceptance length under ``convention`` (a key of :data:`ACCEPTANCE_LENGTH_CONVENTIONS`): "vllm" =
        1 + accepted / drafts, "per_forward" = tokens / verification steps, "drafts_only" = accepted / drafts.
        None when the convention divides by drafts and nothing was drafted, or by steps and there were none.
        Raises ValueError for an unknown convention."""
        convention_label(convention)  # ValueError for an unknown convention
        if convention == "per_forward":
            return self.tokens_per_target_forward if self.num_steps else None
        if not self.num_drafts:
            return None
        return self.mean_acceptance_length - (1.0 if convention == "drafts_only" else 0.0)


def compute_metrics(steps: list[Step], num_speculative_tokens: int) -> dict[str, Any]:
    """:meth:`RunMetrics.from_steps` of ``steps`` as plain data (:meth:`RunMetrics.to_dict`)."""
    return RunMetrics.from_steps(steps, num_speculative_tokens).to_dict()


# Mean acceptance length as engines report it (docs/design/dashboard.md section 6; vllm#24344, EAGLE#146): key ->
# (short label, formula, who uses it). Every view that offers a convention switch reads this table.
ACCEPTANCE_LENGTH_CONVENTIONS = {
    "vllm": ("AL (vLLM)", "1 + accepted / drafts",
             "vLLM (v1/spec_decode/metrics.py), vllm bench, llama.cpp#24536, AIPerf: only steps that had a draft "
             "count; the emitted (recovered or bonus) token is included"),
    "per_forward": ("AL (per forward)", "tokens / verification steps",
                    "SGLang (completion_tokens / verify_ct), EAGLE's tau (new_tokens / steps), Spec-Bench's MAT, "
                    "vllm#24344's seq-normalized AL: every step counts, a step without a draft adds 1"),
    "drafts_only": ("AL − 1 (drafts only)", "accepted / drafts",
                    "accepted draft tokens per drafting step, the emitted token not counted (= vLLM's AL − 1; the "
                    "count TensorRT-LLM's forced-acceptance setting takes, per InferenceX)"),
}


def convention_label(convention: str) -> str:
    """The column label of ``convention`` (a key of :data:`ACCEPTANCE_LENGTH_CONVENTIONS`, e.g. "AL (vLLM)").
    Raises ValueError for an unknown convention."""
    if convention not in ACCEPTANCE_LENGTH_CONVENTIONS:
        raise ValueError(f"unknown acceptance-length convention {convention!r}; choose from "
                         f"{', '.join(ACCEPTANCE_LENGTH_CONVENTIONS)}")
    return ACCEPTANCE_LENGTH_CONVENTIONS[convention][0]


def acceptance_length(m: RunMetrics, convention: str = "vllm") -> float | None:
    """:meth:`RunMetrics.acceptance_length` of ``m``. Raises ValueError for an unknown convention."""
    return m.acceptance_length(convention)
