"""The one proposer protocol every speculative method implements.

A proposer turns the committed context into a draft of at most ``num_tokens`` tokens. The
engine calls :meth:`Proposer.reset` once per request and :meth:`Proposer.propose` once per
verification step; a proposer that keeps state (a KV cache, a suffix tree) reconciles it with
``token_ids`` itself, so rollback after a rejection and catch-up after a full accept need no
extra call. Modelled on transformers' ``CandidateGenerator.get_candidates`` and vLLM's
``v1/spec_decode`` proposers, with one signature for all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, runtime_checkable

import torch


@dataclass
class StepContext:
    """Extra per-step inputs some proposers need (all optional).

    temperature:  float, the sampling temperature of the request (0 = greedy). Model-based
                  proposers draw from the request's processed distribution
                  ``logits_to_probs(logits, temperature, top_k, top_p)`` when > 0, argmax otherwise.
    top_k, top_p: the request's top-k / top-p (None = off), applied to the draft's q as to p.
    generator:    torch.Generator for any randomness the proposer uses (seeded per request).
    target_hidden: float [T, H] target hidden states of the last verified positions (EAGLE,
                  Medusa, DFlash); None for proposers that do not need them.
    """

    temperature: float = 0.0
    generator: torch.Generator | None = None
    top_k: int | None = None
    top_p: float | None = None
    target_hidden: torch.Tensor | None = None


@dataclass
class Draft:
    """A proposal for one verification step.

    token_ids: int64 [k'] the draft tokens x_1..x_k' (k' may be 0: no proposal this step).
    probs:     float32 [k', V] q_i, the exact distributions x_i was drawn from, or None when the
               proposer is deterministic (q is one-hot at x_i).
    details:   plain-data (JSON-able) description of how the draft was made, e.g. the n-gram match
               for the trie view; recorded verbatim in the trace.
    """

    token_ids: torch.Tensor
    probs: torch.Tensor | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.token_ids.numel())


@runtime_checkable
class Proposer(Protocol):
    """What the engine needs from a speculative method.

    name: the method name as vLLM's ``v1/spec_decode`` names it ("ngram", "draft_model", ...).
    num_speculative_tokens: k, the most tokens one step may draft.
    """

    name: str
    num_speculative_tokens: int

    def reset(self) -> None:
        """Forget any per-request state (called before each new request)."""

    def propose(
        self, token_ids: Sequence[int], num_tokens: int | None = None, context: StepContext | None = None
    ) -> Draft:
        """Draft at most ``min(num_tokens, num_speculative_tokens)`` tokens continuing ``token_ids``
        (prompt + every committed token so far)."""
