"""DFlash (``dflash``): one drafter forward per step fills a block ``[root, MASK x (B-1)]``.

Sources: Chen, Liang, Liu 2026 (DFlash, arXiv 2602.06036), z-lab/dflash ``dflash_generate``; vLLM
mainline ``v1/spec_decode/dflash.py`` (``DFlashProposer``: query tokens ``[next_token, mask x k]``
at positions ``seq_len .. seq_len + k``, ``causal=False``, argmax at the mask slots,
``num_speculative_tokens = B - 1``). The head is :class:`specviz.methods.dflash.head.DFlashHead`.

Per step, with committed context x_0..x_n (x_n = the root, not yet run by the target; position n):

    context K/V: the head's cache holds, for every committed position j < n, K/V of the fused
                 target features c_j (taps: outputs of ``target_layer_ids``). The features of the
                 positions committed last step arrive through :meth:`DFlashProposer.observe` and are
                 appended inside the same drafter forward as the block (never recomputed: context
                 K/V depend on target features only, so there is nothing provisional to roll back).
    block:       [x_n, MASK x (B-1)] at positions n .. n+B-1, bidirectional; slot i predicts x_{n+i}.
    drafts:      the first k' = min(k, B-1) mask slots. T = 0: argmax, q one-hot (``Draft.probs`` None).
                 T > 0: d_i ~ q_i = ``logits_to_probs(slot logits, T, top_k, top_p)`` and ``Draft.probs``
                 holds q_i, so standard / block verification stay lossless (q_i does not depend on
                 d_{<i}: every slot reads MASK, which is a valid special case of the chain rule).

MASK never becomes a draft: its logit is set to -inf before the argmax / q (so q(MASK) = 0; any q
keeps rejection sampling lossless). The block always runs at its trained size B, whatever k'.

No host waits on CUDA: d_i ~ q_i by the exponential race argmax(q_i / E), E ~ Exp(1) (what
``torch.multinomial`` computes, without its checks), and the per-slot numbers for the view go to
pinned host memory by a queued copy that :meth:`DFlashProposer.observe` reads after the step's wait.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from specviz.methods.dflash.runner import EagerDFlashRunner
from specviz.sampling import logits_to_probs
from specviz.proposer import Draft, Outcome, StepContext
from specviz.transfer import HostCopy


class DFlashProposer:
    """Block drafting with a DFlash head.

    Args:
        head: :class:`~specviz.methods.dflash.head.DFlashHead` attached to the target, on its device, eval mode.
        num_speculative_tokens: k >= 1 (default B-1, vLLM mainline); a k above B - 1 drafts B - 1.
        runner: runs the drafter's one forward per step and owns its context K/V
            (:mod:`specviz.methods.dflash.runner`); default an ``EagerDFlashRunner`` (a growing cache).
            The engine passes a pooled ``StaticDFlashRunner`` (static buffers, a CUDA graph on CUDA)
            when the target runs on the static runner.
    Raises:
        ValueError: k < 1. RuntimeError from propose/observe if an outcome was skipped.
    """

    name = "dflash"

    def __init__(self, head: torch.nn.Module, num_speculative_tokens: int | None = None, runner=None):
        cfg = head.config
        k = cfg.block_size - 1 if num_speculative_tokens is None else int(num_speculative_tokens)
        if k < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
        k = min(k, cfg.block_size - 1)  # one block drafts B - 1 (as Medusa drafts one per head); the trace says so
        self.head = head
        self.runner = runner if runner is not None else EagerDFlashRunner(head)
        self.taps = cfg.taps
        self.num_speculative_tokens = k
        self.forwards = 0  # drafter forwards so far (tests assert one per drafting step)
        self.reset()

    def reset(self) -> None:
        self.runner.reset()  # context K/V of positions 0 .. committed-1
        self.committed = 0  # positions whose context K/V the drafter holds
        self._pending: list[torch.Tensor] = []  # target features [c, F] of committed positions not yet in the cache
        self._pending_n = 0
        self._details: dict[str, Any] | None = None
        self._slots: torch.Tensor | None = None  # [B-1, 4] on device: top id, top prob, drafted id, q(drafted)
        self._slots_host: HostCopy | None = None  # its copy to the host, queued

    def observe(self, outcome: Outcome) -> None:
        """Queue the target features of the committed positions; fill the last block's per-slot numbers."""
        if outcome.start != self.committed + self._pending_n:
            raise RuntimeError(f"dflash: an outcome starts at position {outcome.start}, but the drafter has features "
                               f"up to {self.committed + self._pending_n}; every target forward must be observed")
        c = len(outcome.committed_token_ids)
        if c:
            self._pending.append(torch.cat([outcome.features[tap][:c] for tap in self.taps], dim=-1))  # [c, F]
            self._pending_n += c
        if self._details is not None and self._slots is not None:
            for slot, (top, top_p, tok, q) in zip(self._details["slots"], self._slots_host.tolist()):
                slot.update(top_token_id=int(top), top_prob=float(top_p), token_id=int(tok), draft_prob=float(q))
        self._details = self._slots = self._slots_host = None

    @torch.inference_mode()
    def propose(self, token_ids: Sequence[int], num_tokens: int | None = None,
                context: StepContext | None = None) -> Draft:
        k = self.num_speculative_tokens if num_tokens is None else min(num_tokens, self.num_speculative_tokens)
        ctx = context or StepContext()
        n = len(token_ids) - 1  # position of the root x_n
        if self.committed + self._pending_n != n:
            raise RuntimeError(f"dflash: the context has {n} committed positions but the drafter was told of "
                               f"{self.committed + self._pending_n}; call observe() after every target forward")
        if k <= 0 or n == 0:
            return Draft(token_ids=torch.empty(0, dtype=torch.long), details={"kind": self.name})
        logits, first = self._block_forward(n, int(token_ids[n]))  # [B, V]: the one drafter forward
        cfg = self.head.config
        slot_logits = logits[1:].clone()  # [B-1, V]: slots 1..B-1 predict x_{n+1} .. x_{n+B-1}
        slot_logits[:, cfg.mask_token_id] = float("-inf")  # MASK is never drafted
        if ctx.temperature > 0:
            q = logits_to_probs(slot_logits, ctx.temperature, ctx.top_k, ctx.top_p)  # [B-1, V]
            e = torch.empty_like(q).exponential_(generator=ctx.generator)  # [B-1, V]
            x = (q / e).argmax(dim=-1)  # [B-1]: x_i ~ q_i (the exponential race; no host wait, unlike multinomial)
        else:
            q, x = torch.softmax(slot_logits, dim=-1), slot_logits.argmax(dim=-1)  # q only for the view
        top_p, top = q.max(dim=-1)  # [B-1]
        self._slots = torch.stack([top.float(), top_p, x.float(), q.gather(1, x[:, None])[:, 0]], dim=1)  # [B-1, 4]
        self._slots_host = HostCopy(self._slots)  # queued behind this step's work: observe needs no wait
        self._details = self._describe(n, int(token_ids[n]), k, first, ctx)
        probs = q[:k] if ctx.temperature > 0 else None
        return Draft(token_ids=x[:k], probs=probs, details=self._details)

    @property
    def cache(self):
        """The eager runner's :class:`~specviz.methods.dflash.head.DFlashCache` (tests read it)."""
        return self.runner.cache

    def _block_forward(self, n: int, root: int) -> tuple[torch.Tensor, dict[str, int]]:
        """Append the pending context K/V and run the block [root, MASK x (B-1)] at positions n..n+B-1,
        in one drafter forward (one runner step). Returns (logits float32 [B, V], {"start", "length"} of the context added)."""
        cfg, start, c = self.head.config, self.committed, self._pending_n
        if c:
            feats = torch.cat(self._pending, dim=0)  # [c, F]
        else:  # not reached from the engine (every step commits >= 1 token), kept for direct callers
            param = next(self.head.parameters())
            feats = torch.empty(0, cfg.feature_size, device=param.device, dtype=param.dtype)
        logits = self.runner.step(feats, start, root)  # [B, V]: context rows appended, block at n = start + c
        self.forwards += 1
        self.committed += c
        self._pending, self._pending_n = [], 0
        return logits, {"start": start, "length": c}

    def _describe(self, n: int, root: int, k: int, first: dict[str, int], ctx: StepContext) -> dict[str, Any]:
        """Plain-data details of the block (the trace's ``step.match``). ``slots``: one per mask slot
        i = 1..B-1 at ``position`` n+i; ``drafted`` (i <= k': handed to the target). Filled by observe:
        ``top_token_id`` / ``top_prob`` (the slot's most likely token and its probability in q, or in
        softmax(slot logits) at T = 0) and ``token_id`` / ``draft_prob`` (the token the slot drew)."""
        cfg = self.head.config
        slots = [{"slot": i, "position": n + i, "drafted": i <= k} for i in range(1, cfg.block_size)]
        return {"kind": self.name, "greedy": ctx.temperature <= 0, "block_size": cfg.block_size,
                "mask_token_id": cfg.mask_token_id, "root_position": n, "root_token_id": root,
                "num_drafted": k, "context": first, "taps": list(self.taps),
                "target_layer_ids": list(cfg.target_layer_ids), "drafter_forwards": 1, "slots": slots}
