"""Batched n-gram (prompt lookup) matcher: the PyTorch reference and a proposer that uses it.

Semantics are vLLM's (``vllm/v1/spec_decode/ngram_proposer.py`` and the batched
``ngram_proposer_gpu.py``; Saxena's prompt lookup decoding): for each row, look for an earlier
occurrence of the row's own last n tokens, n from ``prompt_lookup_max`` down to
``prompt_lookup_min``. The longest n with a match wins; among occurrences of that n the
earliest wins; the final suffix itself is not a match (an occurrence must start at or before
``length - n - 1``, so at least one token follows it). The draft is the up to k tokens that
follow the occurrence, fewer if the context ends first (the continuation may run into the
suffix itself).

:func:`ngram_match_reference` is plain vectorised PyTorch (any device);
``kernels.ngram_matcher.ngram_match_triton`` has the same signature and is held equal to it by
tests/test_kernels_ngram.py. :class:`NgramGPUProposer` wraps either behind the one proposer
protocol of :mod:`specviz.proposers.base`.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from specviz.proposers.base import Draft, NoFeedback, StepContext

BACKENDS = ("reference", "triton")


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


def resolve_lookup_bounds(prompt_lookup_min: int | None, prompt_lookup_max: int | None) -> tuple[int, int]:
    """vLLM's defaults: neither bound -> both 5; one given -> the other copies it.

    Raises ValueError if min > max or min < 1.
    """
    if prompt_lookup_min is None and prompt_lookup_max is None:
        prompt_lookup_min = prompt_lookup_max = 5
    elif prompt_lookup_min is None:
        prompt_lookup_min = prompt_lookup_max
    elif prompt_lookup_max is None:
        prompt_lookup_max = prompt_lookup_min
    if prompt_lookup_min < 1 or prompt_lookup_min > prompt_lookup_max:
        raise ValueError(
            f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {prompt_lookup_min}, {prompt_lookup_max}"
        )
    return prompt_lookup_min, prompt_lookup_max


class NgramGPUProposer(NoFeedback):
    """Prompt-lookup proposer on the device: method "ngram_gpu" (vLLM's name for its GPU n-gram proposer).

    Implements :class:`specviz.proposers.base.Proposer` (name "ngram_gpu"). The context lives in a
    device buffer that grows by the newly committed tokens each step (a few-token host-to-device
    copy); the batched matcher (reference PyTorch or the Triton kernel) runs on it, and one small
    device-to-host copy returns the draft length and the match. Drafts equal :class:`NgramProposer`'s
    (same rules, tests/test_kernels_ngram.py). q is one-hot, so ``Draft.probs`` is None.

    ``Draft.details``: kind "ngram_gpu", backend, n (0 = no match), match_position (-1 = none),
    suffix (the last n tokens), suffix_start, occurrences ([match_position]: the matcher reports
    only the earliest occurrence, the one used, not all of them nor their continuation trie),
    prompt_lookup_min/max.

    Args:
        prompt_lookup_min, prompt_lookup_max: n-gram lengths tried (vLLM defaults, see
            :func:`resolve_lookup_bounds`).
        num_speculative_tokens: k.
        backend: "reference" (PyTorch) or "triton" (``kernels.ngram_matcher``; needs CUDA, or
            TRITON_INTERPRET=1 set before triton is imported to run on CPU).
        device: where the context buffer lives; default "cuda" for triton when available,
            else "cpu".

    Raises:
        ValueError: bad bounds, k < 0 or an unknown backend.
    """

    name = "ngram_gpu"

    def __init__(
        self,
        prompt_lookup_min: int | None = None,
        prompt_lookup_max: int | None = None,
        num_speculative_tokens: int = 5,
        backend: str = "reference",
        device: str | torch.device | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens must be >= 0, got {num_speculative_tokens}")
        self.prompt_lookup_min, self.prompt_lookup_max = resolve_lookup_bounds(prompt_lookup_min, prompt_lookup_max)
        self.num_speculative_tokens = num_speculative_tokens
        self.backend = backend
        if device is None:
            device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.reset()

    def reset(self) -> None:
        """Forget the request's context (the device buffer is kept for reuse)."""
        self._len = 0
        self._last = -1
        if not hasattr(self, "_buf"):
            self._buf = torch.empty(0, dtype=torch.int64, device=self.device)

    def match_batch(self, token_ids: torch.Tensor, lengths: torch.Tensor, num_tokens: int | None = None,
                    validate_lengths: bool = True) -> NgramMatch:
        """Match a batch: token_ids int [B, L], lengths [B] -> :class:`NgramMatch` with k columns."""
        k = self.num_speculative_tokens if num_tokens is None else min(num_tokens, self.num_speculative_tokens)
        fn = ngram_match_reference
        if self.backend == "triton":
            from kernels.ngram_matcher import ngram_match_triton

            fn = ngram_match_triton
        return fn(
            token_ids,
            lengths,
            prompt_lookup_min=self.prompt_lookup_min,
            prompt_lookup_max=self.prompt_lookup_max,
            num_speculative_tokens=max(k, 0),
            validate_lengths=validate_lengths,
        )

    def _context(self, token_ids: Sequence[int]) -> torch.Tensor:
        """The device context [1, L]: appends only the tokens not yet in the buffer (the engine's
        context only grows within a request; anything else is rewritten whole)."""
        L = len(token_ids)
        if L < self._len or (self._len and int(token_ids[self._len - 1]) != self._last):
            self._len = 0  # not a continuation of what the buffer holds
        if L > self._buf.numel():
            grown = torch.empty(max(2 * self._buf.numel(), L, 256), dtype=torch.int64, device=self.device)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown
        if L > self._len:
            self._buf[self._len : L] = torch.as_tensor([int(t) for t in token_ids[self._len :]], dtype=torch.int64)
        self._len, self._last = L, (int(token_ids[-1]) if L else -1)
        return self._buf[:L].view(1, L)

    def propose(
        self, token_ids: Sequence[int], num_tokens: int | None = None, context: StepContext | None = None
    ) -> Draft:
        """Draft up to min(num_tokens, k) tokens continuing ``token_ids`` (one row). The draft
        tensor stays on the proposer's device."""
        ctx = self._context(token_ids)  # [1, L]
        L = ctx.shape[1]
        lengths = torch.full((1,), L, dtype=torch.int64, device=self.device)  # [1], no host copy
        m = self.match_batch(ctx, lengths, num_tokens, validate_lengths=False)
        head = torch.cat([m.num_draft, m.ngram_len, m.match_position]).tolist()  # the one device-to-host copy
        n_draft, n, pos = (int(v) for v in head)
        details = {
            "kind": "ngram_gpu", "backend": self.backend, "n": n, "match_position": pos,
            "suffix": [int(t) for t in token_ids[L - n :]] if n else [], "suffix_start": L - n if n else L,
            "occurrences": [pos] if n else [],
            "prompt_lookup_min": self.prompt_lookup_min, "prompt_lookup_max": self.prompt_lookup_max,
        }
        return Draft(token_ids=m.draft_token_ids[0, :n_draft], probs=None, details=details)
