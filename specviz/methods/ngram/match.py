"""The batched n-gram match's contract and its PyTorch reference, shared by the proposer
(:mod:`specviz.methods.ngram_gpu.proposer`) and the Triton kernel (``kernels.ngram_matcher``), which both
import this module (it imports neither of them).

Semantics are vLLM's (``vllm/v1/spec_decode/ngram_proposer.py`` and the batched
``ngram_proposer_gpu.py``): see :mod:`specviz.methods.ngram_gpu.proposer`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class NgramMatch(NamedTuple):
    """Result of a batched n-gram match (all int64, on the input's device).

    draft_token_ids: [B, k] the tokens following the match, -1 padded.
    num_draft:       [B]    number of valid drafts per row (0 if no match).
    ngram_len:       [B]    the n that matched (0 = no match).
    match_position:  [B]    start index of the matched occurrence in the context (-1 = none).
    """

    draft_token_ids: torch.Tensor
    num_draft: torch.Tensor
    ngram_len: torch.Tensor
    match_position: torch.Tensor


def check_ngram_args(
    token_ids: torch.Tensor,
    lengths: torch.Tensor,
    prompt_lookup_min: int,
    prompt_lookup_max: int,
    k: int,
    validate_lengths: bool = True,
) -> None:
    """Validate the arguments shared by the reference and the Triton matcher.

    Raises ValueError for a non-2-D or non-integer ``token_ids``, ``lengths`` not of shape [B] or
    (when ``validate_lengths``; this reads ``lengths`` on the host, a device sync) outside [0, L],
    ``prompt_lookup_min < 1``, ``min > max`` or ``k < 0``.
    """
    if token_ids.dim() != 2 or token_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"token_ids must be int32/int64 [B, L], got {token_ids.dtype} {tuple(token_ids.shape)}")
    if lengths.shape != (token_ids.shape[0],):
        raise ValueError(f"lengths must have shape [B]={token_ids.shape[0]}, got {tuple(lengths.shape)}")
    if validate_lengths and lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > token_ids.shape[1]):
        raise ValueError("lengths must lie in [0, L]")
    if prompt_lookup_min < 1 or prompt_lookup_min > prompt_lookup_max:
        raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {prompt_lookup_min}, {prompt_lookup_max}")
    if k < 0:
        raise ValueError(f"num_speculative_tokens must be >= 0, got {k}")


def _first_match_per_n(token_ids: torch.Tensor, lengths: torch.Tensor, n_min: int, n_max: int) -> torch.Tensor:
    """Earliest valid occurrence start of each row's last n tokens, for n = n_min..n_max.

    token_ids [B, L], lengths [B] int64 -> int64 [B, n_max - n_min + 1], -1 where none.
    """
    B, L = token_ids.shape
    device = token_ids.device
    first = torch.full((B, n_max - n_min + 1), -1, dtype=torch.int64, device=device)
    for col, n in enumerate(range(n_min, n_max + 1)):
        if n >= L:  # an occurrence must end before the suffix starts: needs n + 1 <= L
            continue
        windows = token_ids.unfold(1, n, 1)  # [B, W = L - n + 1, n]
        suffix_idx = (lengths - n).unsqueeze(1) + torch.arange(n, device=device)  # [B, n]
        suffix = torch.gather(token_ids, 1, suffix_idx.clamp(0, L - 1))  # [B, n]
        match = (windows == suffix.unsqueeze(1)).all(dim=-1)  # [B, W]
        start = torch.arange(windows.shape[1], device=device)  # [W]
        match &= start.unsqueeze(0) <= (lengths - n - 1).unsqueeze(1)
        pos = match.to(torch.int8).argmax(dim=1)  # first True (argmax returns the first maximum)
        first[:, col] = torch.where(match.any(dim=1), pos, -1)
    return first


def ngram_match_reference(
    token_ids: torch.Tensor,
    lengths: torch.Tensor,
    *,
    prompt_lookup_min: int,
    prompt_lookup_max: int,
    num_speculative_tokens: int,
    validate_lengths: bool = True,
) -> NgramMatch:
    """Batched n-gram match, plain PyTorch (the reference of ``kernels.ngram_matcher``).

    Args:
        token_ids: int32/int64 [B, L] contexts (prompt + generated), padded past ``lengths``.
        lengths: int [B] valid length of each row, 0 <= lengths <= L.
        prompt_lookup_min, prompt_lookup_max: the n-gram lengths tried (1 <= min <= max).
        num_speculative_tokens: k, the most drafts per row.
        validate_lengths: check 0 <= lengths <= L on the host (a device sync; benchmarks skip it).
            Unchecked out-of-range lengths give unspecified results.

    Returns:
        :class:`NgramMatch` (int64 tensors on ``token_ids.device``).

    Raises:
        ValueError: see :func:`check_ngram_args`.

    Source: vLLM ``v1/spec_decode/ngram_proposer_gpu.py`` (unfold + first-match argmax).
    """
    k = num_speculative_tokens
    check_ngram_args(token_ids, lengths, prompt_lookup_min, prompt_lookup_max, k, validate_lengths)
    B, L = token_ids.shape
    device = token_ids.device
    lengths = lengths.to(device=device, dtype=torch.int64)
    first = _first_match_per_n(token_ids, lengths, prompt_lookup_min, prompt_lookup_max)  # [B, N]
    num_n = first.shape[1]
    # longest n with a match: the last column with first >= 0
    col = num_n - 1 - (first >= 0).to(torch.int8).flip(1).argmax(dim=1)  # [B]
    pos = first.gather(1, col.unsqueeze(1)).squeeze(1)  # [B]
    matched = pos >= 0
    ngram_len = torch.where(matched, col + prompt_lookup_min, 0)
    draft_start = pos + ngram_len  # first token after the occurrence, <= length - 1 when matched
    num_draft = torch.where(matched, (lengths - draft_start).clamp(0, k), 0)  # [B]
    offs = torch.arange(k, device=device)  # [k]
    idx = (draft_start.unsqueeze(1) + offs).clamp(0, max(L - 1, 0))  # [B, k]
    draft = torch.gather(token_ids, 1, idx).to(torch.int64) if L > 0 else torch.zeros(B, k, dtype=torch.int64, device=device)
    draft = torch.where(offs.unsqueeze(0) < num_draft.unsqueeze(1), draft, -1)
    return NgramMatch(draft, num_draft, ngram_len, torch.where(matched, pos, -1))
