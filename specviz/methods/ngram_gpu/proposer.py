"""Batched n-gram (prompt lookup) matcher: the PyTorch reference and a proposer that uses it.

Semantics are vLLM's (``vllm/v1/spec_decode/ngram_proposer.py`` and the batched
``ngram_proposer_gpu.py``; Saxena's prompt lookup decoding): for each row, look for an earlier
occurrence of the row's own last n tokens, n from ``prompt_lookup_max`` down to
``prompt_lookup_min``. The longest n with a match wins; among occurrences of that n the
earliest wins; the final suffix itself is not a match (an occurrence must start at or before
``length - n - 1``, so at least one token follows it). The draft is the up to k tokens that
follow the occurrence, fewer if the context ends first (the continuation may run into the
suffix itself).

:func:`~specviz.methods.ngram.match.ngram_match_reference` is plain vectorised PyTorch (any
device; it lives in :mod:`specviz.methods.ngram.match` with the result type, which the kernel
module imports too, so neither side imports the other at module level);
``kernels.ngram_matcher.ngram_match_triton`` has the same signature and is held equal to it by
tests/test_kernels_ngram.py. :class:`NgramGPUProposer` wraps either behind the one proposer
protocol of :mod:`specviz.proposer`.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specviz.proposer import Draft, NoFeedback, Outcome, StepContext
from specviz.methods.ngram.match import NgramMatch, check_ngram_args, ngram_match_reference
from specviz.methods.ngram.options import PATTERN, resolve_lookup_bounds
from specviz.transfer import pinned

__all__ = ["BACKENDS", "NgramGPUProposer", "NgramMatch", "check_ngram_args", "ngram_match_reference",
           "resolve_lookup_bounds"]

BACKENDS = ("reference", "triton")


class NgramGPUProposer(NoFeedback):
    """Prompt-lookup proposer on the device: method "ngram_gpu" (vLLM's name for its GPU n-gram proposer).

    Implements :class:`specviz.proposer.Proposer` (name "ngram_gpu"). The context lives in a
    device buffer that grows by the newly committed tokens each step (a few-token host-to-device
    copy); the batched matcher (reference PyTorch or the Triton kernel) runs on it, and one small
    device-to-host copy returns the draft length and the match. Drafts equal :class:`NgramProposer`'s
    (same rules, tests/test_kernels_ngram.py). q is one-hot, so ``Draft.probs`` is None.

    ``pad=True`` (the engine's choice on CUDA only when ``specviz.methods.ngram_gpu.PAD_ON_CUDA`` is set; at batch 1
    the exact width is faster): the draft length k' is never read on the host. The
    draft is the matcher's row of min(num_tokens, k) slots, -1 past k' (the sampler's padding:
    k' = the index of the first -1, slots past it never accepted, the recovered / bonus token drawn
    from p_{k'+1}; docs/design/algorithms.md layout), the target verifies all k + 1 positions (the padding
    fed as token 0, its logits unused), and the match details (n, match_position, suffix, ...) are
    copied to pinned host memory behind the step's work and filled into ``Draft.details`` by
    :meth:`observe`, after the verifier's wait. So the step waits for the GPU once. ``pad=False``
    (the default, and direct calls): the draft is cut to k' on the host (one device-to-host read).

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
        pad: bool = False,
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
        self.pad = bool(pad)
        self._late: tuple[dict, torch.Tensor, object, list[int]] | None = None  # pad=True: details to fill in observe
        self.reset()

    @property
    def capture_s(self) -> float:
        """Seconds the Triton matcher spent compiling in this process (its first launch per device and dtype;
        :data:`specviz.kernels.ngram_matcher.compile_seconds`): a one-time cost the engine keeps out of step times,
        as it does CUDA-graph capture (:mod:`specviz.timing`). 0 for the reference backend."""
        if self.backend != "triton":
            return 0.0
        from specviz.kernels import ngram_matcher

        return ngram_matcher.compile_seconds

    def reset(self) -> None:
        """Forget the request's context (the device buffer is kept for reuse)."""
        self._late = None
        self._len = 0
        self._host: list[int] = []  # the tokens in the buffer, on the host (to compare prefixes)
        if not hasattr(self, "_buf"):
            self._buf = torch.empty(0, dtype=torch.int64, device=self.device)

    def match_batch(self, token_ids: torch.Tensor, lengths: torch.Tensor, num_tokens: int | None = None,
                    validate_lengths: bool = True) -> NgramMatch:
        """Match a batch: token_ids int [B, L], lengths [B] -> :class:`NgramMatch` with k columns."""
        k = self.num_speculative_tokens if num_tokens is None else min(num_tokens, self.num_speculative_tokens)
        fn = ngram_match_reference
        if self.backend == "triton":
            from specviz.kernels.ngram_matcher import ngram_match_triton

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
        """The device context [1, L]: appends only the tokens not yet in the buffer when the
        buffer's tokens are a prefix of ``token_ids`` (compared in full, as SuffixProposer does:
        a new request that happens to share one token is not a continuation); anything else is
        rewritten whole."""
        # the engine's context is a list of ints: compared and copied at C speed, converted only otherwise
        plain = isinstance(token_ids, list) and (not token_ids or type(token_ids[-1]) is int)
        ids = list(token_ids) if plain else [int(t) for t in token_ids]
        L = len(ids)
        if L < self._len or ids[: self._len] != self._host:
            self._len, self._host = 0, []  # not a continuation of what the buffer holds
        if L > self._buf.numel():
            grown = torch.empty(max(2 * self._buf.numel(), L, 256), dtype=torch.int64, device=self.device)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown
        if L > self._len:  # from pinned memory: queued, no host wait
            new = pinned(torch.tensor(ids[self._len :], dtype=torch.int64))
            self._buf[self._len : L].copy_(new, non_blocking=True)
        self._len, self._host = L, ids
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
        head = torch.cat([m.num_draft, m.ngram_len, m.match_position])  # [3] on the device
        if self.pad:  # k' stays on the device; the details are read in observe, after the step's wait
            details = {"kind": "ngram_gpu", "backend": self.backend}
            self._late = (details, *_queued_to_host(head), self._host)  # _context's list of the ids: not copied again
            return Draft(token_ids=m.draft_token_ids[0], probs=None, details=details)  # [k], -1 past k'
        n_draft, n, pos = (int(v) for v in head.tolist())  # the one device-to-host copy
        details = self._details(list(token_ids), n, pos)
        return Draft(token_ids=m.draft_token_ids[0, :n_draft], probs=None, details=details)

    def observe(self, outcome: Outcome) -> None:
        """pad=True: fill the last draft's details from their queued host copy (complete by now: the
        engine calls this after the verifier's wait, which came after the copy)."""
        if self._late is None:
            return
        details, host, copied, token_ids = self._late
        self._late = None
        if copied is not None and not copied.query():  # only outside the engine's loop
            copied.synchronize()
        _, n, pos = (int(v) for v in host.tolist())
        details.update(self._details(token_ids, n, pos))

    def _details(self, token_ids: list[int], n: int, pos: int) -> dict:
        L = len(token_ids)
        return {
            "kind": "ngram_gpu", "backend": self.backend, "n": n, "match_position": pos,
            PATTERN: [int(t) for t in token_ids[L - n :]] if n else [], "suffix_start": L - n if n else L,
            "occurrences": [pos] if n else [],
            "prompt_lookup_min": self.prompt_lookup_min, "prompt_lookup_max": self.prompt_lookup_max,
        }


def _queued_to_host(t: torch.Tensor) -> tuple[torch.Tensor, object]:
    """(host copy of t, CUDA event recorded after the copy, or None on the CPU): a non-blocking copy
    into pinned memory on CUDA, read once the event has passed."""
    if not t.is_cuda:
        return t.clone(), None
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record(torch.cuda.current_stream(t.device))
    return host, copied
