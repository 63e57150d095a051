"""Gemma-4-style MTP (``mtp``): a head with Q-only attention over the target's own KV cache, drafting
every step at the same position (methods.md 7; vLLM ``v1/spec_decode/gemma4.py``,
``constant_draft_positions = True``: "All draft steps predict from the same position (the last
target-model position)"). The head is :class:`specviz.heads.mtp.MtpHead`, trained by specviz (no
public recipe).

With committed tokens x_0..x_n (x_n = the root) the target runner's cache holds positions 0..n-1
(:mod:`specviz.runner`'s convention), which is exactly what the draft may attend to; t = n-1::

    step 1:      (f_t, x_n)        at position t -> logits of d_1, h_1
    step m >= 2: (h_{m-1}, d_{m-1}) at position t -> logits of d_m, h_m

Every step reads target layer ``kv_layer``'s K/V for positions 0..t through
``context.target_runner.layer_kv`` (views: nothing is copied or written), so drafting writes no
KV anywhere: the target cache length is unchanged and the head holds no cache, so nothing but the
target's cache is ever rolled back. q: one-hot (argmax) at temperature 0, else
``logits_to_probs(head logits, T, top_k, top_p)`` with d_m ~ q (``Draft.probs``), so standard and
block verification stay lossless.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..runner import FINAL_NORM
from ..sampling import logits_to_probs
from .base import Draft, Outcome, StepContext

LABEL = "Gemma-4-style MTP head, trained by specviz (no public recipe)"


class MtpProposer:
    """Chain drafting with an MTP head at a constant position.

    Args:
        head: an :class:`~specviz.heads.mtp.MtpHead` attached to the target (same device / dtype).
        num_speculative_tokens: k >= 1.
    Raises:
        ValueError: k < 1. RuntimeError from propose: no target runner in the step context, a cache
            whose length is not the committed length, or a skipped outcome.
    """

    name = "mtp"
    taps = (FINAL_NORM,)

    def __init__(self, head: torch.nn.Module, num_speculative_tokens: int = 4):
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.head = head
        self.kv_layer = int(head.config.kv_layer)
        self.num_speculative_tokens = int(num_speculative_tokens)
        self.reset()

    def reset(self) -> None:
        self.known = 0  # committed positions whose feature was observed
        self._feature: torch.Tensor | None = None  # f_{known-1} [d]
        self._pending: tuple[dict[str, Any], torch.Tensor] | None = None

    def observe(self, outcome: Outcome) -> None:
        """Keep the target feature at the last committed position; fill the last chain's confidences."""
        if outcome.start != self.known:
            raise RuntimeError(f"mtp: an outcome starts at position {outcome.start}, but features are known up to "
                               f"{self.known}; every target forward must be observed")
        c = len(outcome.committed_token_ids)
        if c:
            self._feature = outcome.features[FINAL_NORM][c - 1]
            self.known += c
        if self._pending is not None:
            details, conf = self._pending
            fed = [details["root_token_id"], *outcome.draft_token_ids]
            for step, (top, drafted) in zip(details["steps"], conf.tolist()):
                step["head_top_prob"], step["draft_prob"] = float(top), float(drafted)
                step["input_token_id"] = int(fed[step["step"] - 1])
            self._pending = None

    @torch.inference_mode()
    def propose(self, token_ids: Sequence[int], num_tokens: int | None = None,
                context: StepContext | None = None) -> Draft:
        k = self.num_speculative_tokens if num_tokens is None else min(num_tokens, self.num_speculative_tokens)
        ctx = context or StepContext()
        n = len(token_ids) - 1
        if self.known != n:
            raise RuntimeError(f"mtp: the context has {n} committed positions but features of {self.known} were "
                               "observed; call observe() after every target forward")
        if k <= 0 or n == 0 or self._feature is None:
            return Draft(token_ids=torch.empty(0, dtype=torch.long), details={"kind": self.name})
        keys, values = self._target_kv(ctx, n)  # [kv, n, hd] each: positions 0..n-1 = 0..t
        dev = self._feature.device
        t = torch.full((1, 1), n - 1, dtype=torch.long, device=dev)  # the constant draft position
        h = self._feature.view(1, 1, -1)
        tok = torch.tensor([[int(token_ids[n])]], dtype=torch.long, device=dev)  # the root x_n
        drafts, probs, conf = [], [], []
        for _ in range(k):
            h, logits = self.head(h, tok, t, keys[None], values[None])  # [1, 1, d], [1, 1, V]
            x, q = _draw(logits[0, 0], ctx)
            dist = q if q is not None else torch.softmax(logits[0, 0], dim=-1)
            conf.append(torch.stack([dist.max(), dist[x[0]]]))
            drafts.append(x)
            if q is not None:
                probs.append(q)
            tok = x.view(1, 1)
        details = self._describe(n, int(token_ids[n]), k, ctx)
        self._pending = (details, torch.stack(conf))
        return Draft(token_ids=torch.cat(drafts), probs=torch.stack(probs) if probs else None, details=details)

    def _target_kv(self, ctx: StepContext, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        runner = ctx.target_runner
        if runner is None or not hasattr(runner, "layer_kv"):
            raise RuntimeError("mtp reads the target's KV cache: the step context needs target_runner (a runner "
                               "with layer_kv), which SpecDecoder sets")
        if runner.seq_len != n:
            raise RuntimeError(f"mtp: the target cache holds {runner.seq_len} positions, expected the {n} committed "
                               "before the root")
        return runner.layer_kv(self.kv_layer)

    def _describe(self, n: int, root: int, k: int, ctx: StepContext) -> dict[str, Any]:
        """Plain data for the trace and :mod:`specviz.viz.mtp`: per step (1-based) the position it ran at,
        what it read (target layer ``kv_layer``'s K/V at positions 0..n-1, the fed hidden state, the input
        token) and its confidence (q of the head's top token and of the drafted one; filled by observe)."""
        steps = [{"step": m, "position": n - 1, "hidden": "target f_t" if m == 1 else f"head h_{m - 1}",
                  "attended_positions": [0, n - 1]} for m in range(1, k + 1)]
        return {"kind": self.name, "label": LABEL, "greedy": ctx.temperature <= 0, "root_position": n,
                "root_token_id": root, "kv_layer": self.kv_layer, "taps": list(self.taps), "steps": steps}


def _draw(logits: torch.Tensor, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits float32 [V] -> (token int64 [1], q float32 [V] or None for a one-hot argmax draft)."""
    if ctx.temperature > 0:
        q = logits_to_probs(logits, ctx.temperature, ctx.top_k, ctx.top_p)
        return torch.multinomial(q, 1, generator=ctx.generator), q
    return logits.argmax(dim=-1, keepdim=True), None
