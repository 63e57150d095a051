"""The one proposer protocol every speculative method implements.

A proposer turns the committed context into a draft of at most ``num_tokens`` tokens. Its life
in one request:

    reset()
    observe(prefill outcome)              # the prompt's target features (if it declared taps)
    repeat: propose(context, k) -> Draft  # x_1..x_k', q
            observe(outcome)              # what the target verified and committed, with features

A proposer that keeps state (a KV cache, a suffix tree) may also reconcile it with ``token_ids``
itself (n-gram and draft_model ignore :meth:`Proposer.observe`); feature-based drafters (EAGLE,
EAGLE-3; Medusa and DFlash later) get the target's hidden states only through it, from the taps
they declare in ``taps`` (names in :mod:`specviz.runner`). Modelled on transformers'
``CandidateGenerator`` (``get_candidates`` / ``update_candidate_strategy``) and vLLM's
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
    target_runner: the request's target :class:`~specviz.runner.ModelRunner` (set by the engine),
                  read-only for proposers: mtp reads the target's KV cache through ``layer_kv``.
    """

    temperature: float = 0.0
    generator: torch.Generator | None = None
    top_k: int | None = None
    top_p: float | None = None
    target_hidden: torch.Tensor | None = None
    target_runner: Any = None


@dataclass
class Draft:
    """A proposal for one verification step.

    token_ids: int64 [k'] the draft tokens x_1..x_k' (k' may be 0: no proposal this step); for a
               tree, node i's token (k' = N nodes). A chain may come padded with -1 after its k'
               tokens (a device-side proposer whose k' is not known on the host: ngram_gpu on
               CUDA); the engine feeds the padding to the target as token 0 and the sampler takes
               k' = the index of the first -1 (docs/design/algorithms.md layout).
    probs:     float32 [k', V] q_i, the exact distributions x_i was drawn from, or None when the
               proposer is deterministic (q is one-hot at x_i).
    details:   plain-data (JSON-able) description of how the draft was made, e.g. the n-gram match
               for the trie view; recorded verbatim in the trace.
    parents:   None for a chain (node i's parent is i - 1), else a tree (:mod:`specviz.tree`):
               list of N ints, ``-1 <= parents[i] < i`` (-1 = the root, the last committed token).
    scores:    None, or N floats: each node's draft score (EAGLE-2: cumulative log-confidence),
               shown in the tree view.
    tree_rule: how a tree's children were made, which decides the lossless rule (docs/design/methods.md 1.4):
               "topk" (deterministic children, q one-hot: rule A) or "sampled" (i.i.d. draws
               from the parent's q, ``probs[i]`` = that q: SpecInfer's rule B).
    device_parents: None, or the same parents as int64 [N] on the device, for a tree drafted there
               (EAGLE-2): the engine then queues the tree forward (its mask built on the device)
               before ``parents`` (a :class:`~specviz.transfer.LazyHostList` whose copy is on its way)
               is read, so the GPU goes from drafting to verifying without waiting for the host.
    """

    token_ids: torch.Tensor
    probs: torch.Tensor | None = None
    details: dict[str, Any] = field(default_factory=dict)
    parents: list[int] | None = None
    scores: list[float] | None = None
    tree_rule: str = "topk"
    device_parents: torch.Tensor | None = None

    @property
    def is_chain(self) -> bool:
        """True when the draft is a chain (no parents given, or parents i - 1). A tree with ``device_parents``
        is verified as a tree without reading its parents here."""
        from .tree import is_chain

        if self.device_parents is not None:
            return False
        return self.parents is None or is_chain(self.parents)

    @property
    def forward_parents(self) -> torch.Tensor | list[int] | None:
        """The parents the target's tree forward takes: ``device_parents`` when the tree was drafted on the
        device (its host copy is then read after the forward is queued), else the host list."""
        if self.device_parents is not None:
            return self.device_parents
        return None if self.parents is None else list(self.parents)

    def __len__(self) -> int:
        return int(self.token_ids.numel())


@dataclass
class Outcome:
    """What one target forward verified and committed, told to the proposer by ``observe``.

    Row i of every feature is the target's hidden state at position ``start + i``, and
    ``committed_token_ids[i]`` is the token at position ``start + i + 1``: exactly the
    (feature at j, token at j + 1) pairs EAGLE's head consumes (docs/design/methods.md 1.1).

    start:               int, position of the first feature row (the forward's first input).
    draft_token_ids:     list[int] x_1..x_k' verified by this forward ([] after the prefill).
    num_accepted:        int, accepted draft tokens (0 after the prefill).
    committed_token_ids: list[int], c tokens: the accepted drafts and the recovered/bonus token
                         (after the prefill: the prompt's tokens after the first).
    features:            {tap name: [c, d] tensor on the device, the model's dtype} for every
                         tap the proposer declared, at the committed positions only.

    After a tree draft the outcome is the accepted path's: draft_token_ids = the path's tokens (root
    child first), num_accepted = its length, features = the tree forward's rows of the root and the
    path nodes, in path order (the node rows were computed at positions start + depth, so row i is
    again the feature at position start + i).
    """

    start: int
    draft_token_ids: list[int]
    num_accepted: int
    committed_token_ids: list[int]
    features: dict[str, torch.Tensor] = field(default_factory=dict)


class NoFeedback:
    """Defaults for proposers that need no target features and ignore outcomes (n-gram, suffix,
    draft_model): no taps, and :meth:`observe` does nothing."""

    taps: tuple[str, ...] = ()

    def observe(self, outcome: Outcome) -> None:
        """Ignore the outcome (the proposer reconciles its state from ``token_ids`` in propose)."""


def keep_last_feature(proposer: Any, outcome: Outcome, tap: str) -> None:
    """For proposers that draft from the target's feature at the last committed position (Medusa, MTP): check that
    ``outcome`` continues where ``proposer.known`` (committed positions observed) ends, then keep that feature row
    (``proposer._feature``, [d]) and advance ``known``. Raises RuntimeError if a target forward was not observed."""
    if outcome.start != proposer.known:
        raise RuntimeError(f"{proposer.name}: an outcome starts at position {outcome.start}, but features are known up "
                           f"to {proposer.known}; every target forward must be observed")
    c = len(outcome.committed_token_ids)
    if c:
        proposer._feature = outcome.features[tap][c - 1]
        proposer.known += c


@runtime_checkable
class Proposer(Protocol):
    """What the engine needs from a speculative method.

    name: the method name as vLLM's ``v1/spec_decode`` names it (ngram, draft_model, ...).
    num_speculative_tokens: k, the most tokens one step may draft.
    taps: the target feature taps it needs from every target forward (() for none).
    """

    name: str
    num_speculative_tokens: int
    taps: tuple[str, ...]

    def reset(self) -> None:
        """Forget any per-request state (called before each new request)."""

    def propose(
        self, token_ids: Sequence[int], num_tokens: int | None = None, context: StepContext | None = None
    ) -> Draft:
        """Draft at most ``min(num_tokens, num_speculative_tokens)`` tokens continuing ``token_ids``
        (prompt + every committed token so far)."""

    def observe(self, outcome: Outcome) -> None:
        """Called after the prefill and after every verification step (see :class:`Outcome`)."""
