"""Logits -> probabilities, exactly as plain sampling would see them.

The same processing must be applied to the target logits (p) and, for a sampling draft model,
to the draft logits (q) before any acceptance ratio is formed (docs/design/algorithms.md, "Processing
before any ratio"). The order and the tie rules follow Hugging Face transformers'
``generation/logits_process.py``: ``TemperatureLogitsWarper`` -> ``TopKLogitsWarper`` ->
``TopPLogitsWarper``, then a softmax (here always in float32).
"""

from __future__ import annotations

import math

import torch


def validate_sampling_params(temperature: float, top_k: int | None = None, top_p: float | None = None) -> None:
    """Check sampling parameters; raise ``ValueError`` saying what to change.

    temperature: finite float >= 0 (0 = greedy).
    top_k:       None or int >= 0 (0 / None = off).
    top_p:       None or float in (0, 1] (1.0 / None = off).
    """
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise ValueError(f"top_k must be None or an integer >= 0 (0 or None = off), got {top_k!r}")
    if top_p is not None:
        if not isinstance(top_p, (int, float)) or not (0.0 < top_p <= 1.0):
            raise ValueError(f"top_p must be None or a number in (0, 1] (1.0 or None = off), got {top_p!r}")


def _top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """HF TopKLogitsWarper: drop logits below the k-th largest (ties with it are kept).
    logits: float32 [..., V] -> float32 [..., V] with dropped entries set to -inf."""
    k = min(top_k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]  # [..., 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """HF TopPLogitsWarper: sort ascending, drop the tokens whose ascending cumulative probability
    is <= 1 - top_p, always keep the most likely token. logits: float32 [..., V]."""
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=False)  # [..., V]
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # [..., V] ascending cumulative mass
    remove_sorted = cum <= (1 - top_p)
    remove_sorted[..., -1:] = False  # min_tokens_to_keep = 1
    remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)  # back to vocabulary order
    return logits.masked_fill(remove, float("-inf"))


def logits_to_probs(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """Turn logits into the sampling distribution over the last dimension.

    logits: float (any dtype) [..., V]; never modified.
    Returns float32 [..., V] summing to 1 over the last dim.

    temperature == 0: one-hot at ``torch.argmax`` (greedy; ties -> lowest index).
    Otherwise logits / temperature, then top-k (keep the k largest, ties with the k-th kept),
    then top-p (keep the smallest set of most likely tokens whose mass >= top_p; at least one
    token), then softmax in float32. Order and tie rules as transformers'
    ``TemperatureLogitsWarper``, ``TopKLogitsWarper``, ``TopPLogitsWarper``.

    Raises ValueError for temperature < 0 (or not finite), top_k < 0, top_p outside (0, 1].
    """
    validate_sampling_params(temperature, top_k, top_p)
    x = logits.float()  # [..., V]
    if temperature == 0:
        one_hot = torch.zeros_like(x)
        return one_hot.scatter_(-1, x.argmax(dim=-1, keepdim=True), 1.0)
    x = x / temperature
    if top_k:
        x = _top_k_filter(x, top_k)
    if top_p is not None and top_p < 1.0:
        x = _top_p_filter(x, top_p)
    return torch.softmax(x, dim=-1)
