"""vLLM's spec-decode metrics over a trace's steps, counted from committed tokens (definitions in
:mod:`specviz.trace`'s docstring), and the acceptance-length conventions engines report."""

from __future__ import annotations

from typing import Any

from .schema import Step


TOKENS_PER_FORWARD_FORMULA = ("generated tokens / verification steps (one target forward each; the prefill "
                              "forward emits no token and is not counted)")


def tokens_per_target_forward(num_tokens: int, num_steps: int) -> float:
    """Tokens per target forward = committed tokens / verification steps (0.0 with no steps).

    Every verification step is one target forward over [last token, x_1..x_k'] and commits
    1..k'+1 tokens; the prefill forward (over prompt[:-1]) commits none and is NOT counted, so
    plain decoding (method "none") scores exactly 1.0 and ``Trace.target_forward_passes`` =
    steps + 1. vLLM (vllm-project/vllm#24344) calls output tokens / verification steps the
    "seq-normalized acceptance length". The hardware-independent speedup over method none is the
    ratio of this number."""
    return num_tokens / num_steps if num_steps else 0.0


def compute_metrics(steps: list[Step], num_speculative_tokens: int) -> dict[str, Any]:
    """vLLM's spec-decode metrics over ``steps``, from committed tokens (see module docstring)."""
    k = max([num_speculative_tokens, *(s.draft_depth for s in steps)] or [0])
    drafting = [s for s in steps if s.draft_token_ids or s.nodes]
    num_drafts = len(drafting)
    num_draft_tokens = sum(s.num_drafted for s in drafting)
    discarded = sum(s.num_drafts_discarded for s in drafting)
    acc = [s.num_accepted_committed for s in drafting]
    # positions (depths) drafted and not discarded: a chain's k' - discarded
    verified = [s.draft_depth if s.emitted_committed else s.num_accepted_committed for s in drafting]
    num_accepted = sum(acc)
    per_pos = [sum(1 for a in acc if a >= i + 1) for i in range(k)]
    hist = [sum(1 for a in acc if a == j) for j in range(k + 1)]
    offered = [sum(1 for a, n in zip(acc, verified) if n >= i + 1 and a >= i) for i in range(k)]
    reached = [sum(1 for n in verified if n >= i + 1) for i in range(k)]  # drafted_per_depth
    generated = sum(len(s.committed_token_ids) for s in steps)
    drafting_tokens = sum(len(s.committed_token_ids) for s in drafting)
    return {
        "num_steps": len(steps),
        "num_drafts": num_drafts,
        "num_draft_tokens": num_draft_tokens,
        "num_discarded_draft_tokens": discarded,
        "num_accepted_tokens": num_accepted,
        "num_generated_tokens": generated,
        "mean_acceptance_length": drafting_tokens / num_drafts if num_drafts else 1.0,
        "draft_acceptance_rate": num_accepted / (num_draft_tokens - discarded) if num_draft_tokens > discarded else 0.0,
        "accepted_per_position": per_pos,
        "acceptance_rate_per_position": [c / num_drafts if num_drafts else 0.0 for c in per_pos],
        "conditional_acceptance_rate": [a / o if o else 0.0 for a, o in zip(per_pos, offered)],
        "offered_per_position": offered,
        "drafted_per_depth": reached,
        "acceptance_rate_per_depth": [a / d if d else 0.0 for a, d in zip(per_pos, reached)],
        "depth_acceptance_rate": num_accepted / sum(reached) if sum(reached) else 0.0,
        "draft_coverage": num_drafts / len(steps) if steps else 0.0,
        "acceptance_histogram": hist,
        "tokens_per_step": tokens_per_target_forward(generated, len(steps)),
        "tokens_per_target_forward": tokens_per_target_forward(generated, len(steps)),
        "time_ms": {
            key: sum(s.timings_ms.get(key, 0.0) for s in steps) for key in ("draft", "verify", "sample")
        },
        "capture_ms": sum(s.timings_ms.get("capture", 0.0) for s in steps),  # excluded from time_ms
    }


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


def acceptance_length(m: dict[str, Any], convention: str = "vllm") -> float | None:
    """Mean acceptance length of :func:`compute_metrics`' ``m`` under ``convention`` (a key of
    ACCEPTANCE_LENGTH_CONVENTIONS): "vllm" = committed tokens of drafting steps / drafts (1 + accepted /
    drafts when no step was cut by a stop), "per_forward" = tokens / verification steps, "drafts_only"
    = vLLM's minus 1. None when the convention divides by drafts and nothing was drafted, or by steps and
    there were none. Raises ValueError for an unknown convention."""
    if convention not in ACCEPTANCE_LENGTH_CONVENTIONS:
        raise ValueError(f"unknown acceptance-length convention {convention!r}; choose from "
                         f"{', '.join(ACCEPTANCE_LENGTH_CONVENTIONS)}")
    if convention == "per_forward":
        return float(m["tokens_per_target_forward"]) if m["num_steps"] else None
    if not m["num_drafts"]:
        return None
    return float(m["mean_acceptance_length"]) - (1.0 if convention == "drafts_only" else 0.0)

