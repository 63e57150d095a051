"""Model runners: the only code that calls a model's forward and owns its KV cache.

Cache convention (shared by the target and any model-based drafter): the cache holds every
committed token except the last one, which is fed as the first input of the next forward.
A verification step therefore runs one forward over ``[last_token, x_1, ..., x_k']`` and gets
the k'+1 target distributions p_1..p_{k'+1} at once; afterwards :meth:`truncate` drops the
rejected drafts' entries.

:class:`EagerRunner` uses transformers' :class:`~transformers.DynamicCache` and plain eager
forwards. A static-cache / CUDA-graph runner (the fast GPU path) implements the same three
methods, so proposers, sampler and trace never change.
"""

from __future__ import annotations

from typing import Protocol

import torch
from transformers import DynamicCache


class ModelRunner(Protocol):
    """What the engine needs from a model. ``seq_len``: tokens currently in the cache."""

    seq_len: int

    def reset(self) -> None:
        """Drop the cache (a new request starts)."""

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Append ``token_ids`` (int64 [n], n >= 1) to the cache and return float32 logits [n, V]
        for those positions."""

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens (rollback after a rejection)."""


class EagerRunner:
    """An HF causal LM with a DynamicCache, one eager forward per call.

    model: a transformers ``*ForCausalLM`` in eval mode. The cache is cropped with
    ``DynamicCache.crop(-n_removed)``, which works on transformers 5.17 and later.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.device = next(model.parameters()).device
        self.cache: DynamicCache | None = None
        self.seq_len = 0

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.seq_len = 0

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.cache is None:
            self.reset()
        ids = token_ids.to(self.device).view(1, -1)  # [1, n]
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True)
        self.seq_len += ids.shape[1]
        return out.logits[0].float()  # [n, V]

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.seq_len:
            raise ValueError(f"cannot truncate a cache of {self.seq_len} tokens to {length}")
        if length < self.seq_len:
            self.cache.crop(length - self.seq_len)
            self.seq_len = length

    def cached_keys(self) -> list[torch.Tensor]:
        """The cached key tensors, one [1, H, seq_len, D] per layer (for tests)."""
        return [layer.keys for layer in self.cache.layers]
