"""repeat_last's proposer: x_i = context[L - lag + ((i - 1) mod lag)] for i = 1..k (L = the context length)."""

from __future__ import annotations

from typing import Sequence

import torch

from specviz.proposer import Draft, NoFeedback, StepContext


class RepeatProposer(NoFeedback):
    """Deterministic (``Draft.probs`` None: q one-hot). Raises ValueError for lag < 1 or k < 1."""

    name = "repeat_last"

    def __init__(self, repeat_lag: int, num_speculative_tokens: int):
        if repeat_lag < 1 or num_speculative_tokens < 1:
            raise ValueError(f"repeat_lag and k must be >= 1, got {repeat_lag} and {num_speculative_tokens}")
        self.repeat_lag, self.num_speculative_tokens = int(repeat_lag), int(num_speculative_tokens)

    def reset(self) -> None:  # stateless
        pass

    def propose(self, token_ids: Sequence[int], num_tokens: int | None = None,
                context: StepContext | None = None) -> Draft:
        k = self.num_speculative_tokens if num_tokens is None else min(num_tokens, self.num_speculative_tokens)
        ids = list(token_ids)
        lag = min(self.repeat_lag, len(ids))
        sources = [len(ids) - lag + (i % lag) for i in range(max(k, 0))]
        draft = torch.tensor([ids[s] for s in sources], dtype=torch.long)
        return Draft(token_ids=draft, details={"repeat_lag": lag, "copied_from": sources})
