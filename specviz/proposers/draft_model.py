"""Draft-model proposer: a small causal LM with the target's tokenizer drafts k tokens.

Sources: Leviathan et al. 2023; Chen et al. 2023; vLLM ``v1/spec_decode/draft_model.py``; HF
``assistant_model`` (``generation/candidate_generator.py``).

q: greedy drafting (temperature 0) takes argmax, so q is one-hot and ``Draft.probs`` is None;
otherwise x_i ~ q_i = softmax(draft_logits_i / T) (temperature only, algorithms.md) and
``Draft.probs`` holds q_i exactly.

KV cache: the drafter's runner follows the committed tokens exactly. Each call compares the
tokens in its cache with ``token_ids`` and truncates to their common prefix (rollback after a
rejection), then feeds the committed tokens it has not seen (catch-up: after a full accept the
last draft token and the bonus token), then drafts.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..runner import EagerRunner, ModelRunner
from .base import Draft, NoFeedback, StepContext


class DraftModelProposer(NoFeedback):
    """Args:
        runner: a :class:`~specviz.runner.ModelRunner` over the draft model (e.g. EagerRunner).
        num_speculative_tokens: k >= 1.
    Raises:
        ValueError: k < 1.
    """

    name = "draft_model"

    def __init__(self, runner: ModelRunner, num_speculative_tokens: int = 5):
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.runner = runner
        self.num_speculative_tokens = int(num_speculative_tokens)
        self._cached: list[int] = []
        self._pending: torch.Tensor | None = None  # draft tokens fed last step, still on the device

    @classmethod
    def from_model(cls, model: torch.nn.Module, num_speculative_tokens: int = 5) -> "DraftModelProposer":
        return cls(EagerRunner(model), num_speculative_tokens)

    @property
    def cached_ids(self) -> list[int]:
        """The tokens whose keys/values are in the drafter's cache, in order."""
        if self._pending is not None:  # read lazily: by now the step's one D2H copy has synced
            self._cached.extend(self._pending.tolist())
            self._pending = None
        return self._cached

    def reset(self) -> None:
        self.runner.reset()
        self._cached, self._pending = [], None

    def _sync_cache(self, token_ids: list[int]) -> torch.Tensor:
        """Roll the cache back to the longest prefix it shares with ``token_ids`` (keeping at
        least one token to feed), feed the rest, return the logits [V] after the last token."""
        cached = self.cached_ids
        common = 0
        limit = min(len(cached), len(token_ids) - 1)
        while common < limit and cached[common] == token_ids[common]:
            common += 1
        self.runner.truncate(common)
        self._cached = list(token_ids)
        feed = torch.tensor(token_ids[common:], dtype=torch.long)
        return self.runner.forward(feed)[-1]

    def propose(self, token_ids: Sequence[int], num_tokens: int | None = None,
                context: StepContext | None = None) -> Draft:
        k = self.num_speculative_tokens if num_tokens is None else min(num_tokens, self.num_speculative_tokens)
        ctx = context or StepContext()
        if k <= 0:
            return Draft(token_ids=torch.empty(0, dtype=torch.long), details={"kind": "draft_model"})
        logits = self._sync_cache(list(token_ids))  # [V]
        tokens, probs = [], []
        for i in range(k):
            if ctx.temperature > 0:
                q = torch.softmax(logits / ctx.temperature, dim=-1)  # [V] float32
                x = torch.multinomial(q, 1, generator=ctx.generator)  # [1]
                probs.append(q)
            else:
                x = logits.argmax(dim=-1, keepdim=True)  # [1]
            tokens.append(x)
            if i + 1 < k:  # the last draft token is fed at the next step, only if accepted
                logits = self.runner.forward(x)[-1]
        draft = torch.cat(tokens)  # [k]
        self._pending = draft[:-1]
        return Draft(
            token_ids=draft,
            probs=torch.stack(probs) if probs else None,  # [k, V] or None (one-hot)
            details={"kind": "draft_model", "greedy": ctx.temperature <= 0},
        )
