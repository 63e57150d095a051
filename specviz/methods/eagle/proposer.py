"""EAGLE-1 (``eagle``) and EAGLE-3 (``eagle3``) chain drafting from the target's own features.

Sources: Li et al. 2024 (EAGLE, arXiv 2401.15077), Li et al. 2025 (EAGLE-3, arXiv 2503.01840);
vLLM ``v1/spec_decode/eagle.py`` / ``llm_base_proposer.py`` (chain drafting, method names);
the heads are :mod:`specviz.heads` (one decoder layer over (feature, token) pairs).

Pairing and positions (docs/design/methods.md 1.1). The context is x_0..x_n; x_n, the root, is the token the
target emitted last and has not run yet. The head's cache holds, for every committed position
j < n, K/V computed from the pair (target feature g_j, token x_{j+1}) at position j, where g_j is
the final-norm output f_j (EAGLE-1) or the inputs of the head's aux layers, concatenated
(EAGLE-3). A chain of k drafts is then::

    first pass  rows (g_j, x_{j+1}) at positions j = Lc..n-1  -> logits of d_1, hidden h
    step m >= 2 (h, d_{m-1}) at position n+m-2                -> logits of d_m, hidden h

Draft KV after a partial accept (docs/design/methods.md 1.2, vllm#14649): the K/V that draft steps wrote
(positions >= n, computed from the head's own features) are provisional. After verification the
engine's :meth:`EagleProposer.observe` hands over the target features of the positions just
committed; the next :meth:`EagleProposer.propose` crops the head's cache back to the committed
length Lc and recomputes those slots from them (the first pass above), so every slot j < Lc
holds K/V from target features only.

q: at temperature 0 the draft is the argmax of the head's logits and q is one-hot
(``Draft.probs`` None). Otherwise q_i = ``logits_to_probs(head_logits_i, T, top_k, top_p)`` (the
request's processing, the same as p's) and d_i ~ q_i; ``Draft.probs`` holds q_i, so standard and
block verification stay lossless.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from specviz.methods.eagle.runner import EagerHeadRunner
from specviz.runner import FINAL_NORM, layer_input
from specviz.sampling import logits_to_probs
from specviz.transfer import HostCopy, to_device
from specviz.proposer import Draft, Outcome, StepContext
from specviz.methods.draft_model.proposer import _sample


def head_taps(config) -> tuple[str, ...]:
    """The target feature taps a head reads (runner tap names, in the order they are concatenated): the inputs of
    its ``aux_layer_ids`` (EAGLE-3), or the final-norm output f_t when it has none (EAGLE-1)."""
    aux = tuple(getattr(config, "aux_layer_ids", ()) or ())
    return tuple(layer_input(layer) for layer in aux) if aux else (FINAL_NORM,)


class EagleProposer:
    """Chain drafting with an EAGLE-1 or EAGLE-3 head (``name`` = the head's kind).

    Args:
        head: a :mod:`specviz.heads` head (``EagleHead`` / ``Eagle3Head``) attached to the target,
            on the target's device, in eval mode; called as
            ``hidden, logits = head(features, input_ids, position_ids, cache, from_target=...)``.
        num_speculative_tokens: k >= 1.
        runner: a head runner (:mod:`specviz.methods.eagle.runner`) that runs the head's first passes and
            draft steps and owns its KV cache; default :class:`~specviz.methods.eagle.runner.EagerHeadRunner`
            (a DynamicCache). The engine gives a pooled ``StaticHeadRunner`` (static cache, CUDA
            graphs on CUDA) when the target runs on the static runner.
    Raises:
        ValueError: k < 1; RuntimeError from propose/observe if the engine skipped an outcome (the
            (feature, token) pairing would be wrong).
    """

    def __init__(self, head: torch.nn.Module, num_speculative_tokens: int = 5, runner=None):
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.head = head
        self.runner = runner if runner is not None else EagerHeadRunner(head)  # specviz.methods.eagle.runner
        self.name = str(head.config.kind)
        self.taps = head_taps(head.config)
        self.num_speculative_tokens = int(num_speculative_tokens)
        self.reset()

    def reset(self) -> None:
        self.runner.reset()  # the head's K/V (self.cache); slot i = position i
        self.committed = 0  # Lc: slots computed from target features
        self._pending: list[torch.Tensor] = []  # target features [c, F] of committed pairs not yet run
        self._pending_ids: list[int] = []  # the token after each pending feature row
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None  # (hidden [1, d], logits [V]) at Lc - 1
        self._details: dict[str, Any] | None = None  # the last draft's details, completed by observe
        self._confidence: torch.Tensor | None = None  # [k', 2] q of the head's top token, q of the draft
        self._confidence_host: HostCopy | None = None  # its copy to the host, queued

    @property
    def cache(self):
        """The head's KV cache (the runner's: a DynamicCache, or a SlotCache for the static runner)."""
        return self.runner.cache

    # ---- the engine's two calls ------------------------------------------------------------------
    def observe(self, outcome: Outcome) -> None:
        """Queue the committed (target feature, next token) pairs for the next first pass, and fill
        the last draft's confidence numbers (the step's one host wait has passed by now)."""
        if outcome.start != self.committed + len(self._pending_ids):
            raise RuntimeError(f"{self.name}: an outcome starts at position {outcome.start}, but the head has "
                               f"pairs up to {self.committed + len(self._pending_ids)}; every target forward must "
                               "be observed")
        c = len(outcome.committed_token_ids)
        if c:
            feats = torch.cat([outcome.features[tap][:c] for tap in self.taps], dim=-1)  # [c, F]
            self._pending.append(feats)
            self._pending_ids.extend(int(t) for t in outcome.committed_token_ids)
        if self._details is not None and self._confidence is not None:
            fed = [self._details["root_token_id"], *outcome.draft_token_ids]  # token fed with draft i's input
            for pos, (top, drafted) in zip(self._details["positions"], self._confidence_host.tolist()):
                pos["head_top_prob"], pos["draft_prob"] = float(top), float(drafted)
                pos["input_token_id"] = int(fed[pos["draft_index"] - 1])
        self._details = self._confidence = self._confidence_host = None

    @torch.inference_mode()
    def propose(self, token_ids: Sequence[int], num_tokens: int | None = None,
                context: StepContext | None = None) -> Draft:
        k = self.num_speculative_tokens if num_tokens is None else min(num_tokens, self.num_speculative_tokens)
        ctx = context or StepContext()
        n = len(token_ids) - 1  # position of the root x_n
        known = self.committed + len(self._pending_ids)
        if known != n:
            raise RuntimeError(f"{self.name}: the context has {n} committed pairs but the head was told of {known}; "
                               "call observe() after every target forward")
        if k <= 0 or n == 0:  # nothing to draft from yet (a one-token prompt)
            return Draft(token_ids=torch.empty(0, dtype=torch.long), details={"kind": self.name})
        first = self._first_pass()
        hidden, logits = self._last
        tokens, probs, conf = [], [], []
        for m in range(1, k + 1):
            x, q = self._draw(logits, ctx)  # x: int64 [1]; q: float32 [V] or None
            tokens.append(x)
            conf.append(self._confidence_of(logits, q, x))
            if q is not None:
                probs.append(q)
            if m < k:  # (h, d_m) at position n+m-1 -> logits of d_{m+1}; d_k is never fed
                hidden, logits = self.runner.step(hidden, x, n + m - 1)  # [1, d], [V]
        draft = torch.cat(tokens)  # [k]
        self._confidence = torch.stack(conf)  # [k, 2], read in observe
        self._confidence_host = HostCopy(self._confidence)  # queued behind this step's work: observe reads it unwaited
        self._details = self._describe(n, int(token_ids[n]), k, first, ctx)
        return Draft(token_ids=draft, probs=torch.stack(probs) if probs else None, details=self._details)

    # ---- internals -------------------------------------------------------------------------------
    def _first_pass(self) -> dict[str, int]:
        """Drop the provisional draft K/V (slots >= Lc) and run the head on the pending committed
        pairs (target features) at positions Lc..; returns {"start", "length"} of that pass."""
        self.runner.truncate(self.committed)
        start, c = self.committed, len(self._pending_ids)
        if c:
            feats = torch.cat(self._pending, dim=0)  # [c, F]
            ids = to_device(torch.tensor(self._pending_ids, dtype=torch.long), feats.device)  # [c]; queued, no wait
            self._last = self.runner.first_pass(feats, ids, start)  # rows at positions start..: [1, d], [V]
            self.committed += c
            self._pending, self._pending_ids = [], []
        return {"start": start, "length": c}

    @staticmethod
    def _draw(logits: torch.Tensor, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits float32 [V] -> (draft token int64 [1], q float32 [V] or None for one-hot)."""
        if ctx.temperature > 0:
            q = logits_to_probs(logits, ctx.temperature, ctx.top_k, ctx.top_p)  # [V]
            return _sample(q, ctx.generator), q  # torch.multinomial(q, 1)'s draws, without its host waits
        return logits.argmax(dim=-1, keepdim=True), None

    @staticmethod
    def _confidence_of(logits: torch.Tensor, q: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
        """[2]: the head's probability of its top token and of the drafted one, in q (T > 0) or, for
        greedy drafts (q one-hot), in softmax(head logits)."""
        dist = q if q is not None else torch.softmax(logits.float(), dim=-1)  # [V]
        return torch.stack([dist.max(), dist.gather(0, x)[0]])  # gather: no host read of x

    def _describe(self, n: int, root: int, k: int, first: dict[str, int], ctx: StepContext) -> dict[str, Any]:
        """Plain-data details of the chain (recorded in the trace as the step's ``match``). Per draft
        i (1-based): the row that predicted it ran at ``input_position`` with the feature of
        ``feature_position`` (from the target for i = 1, else the head's own output there) and the
        token ``input_token_id`` (the root x_n for i = 1, else d_{i-1}); ``head_top_prob`` /
        ``draft_prob``: q of the head's top token and of d_i (softmax of the head's logits for
        greedy drafts). The token ids and probabilities are filled by observe. ``first_pass``: the
        committed positions whose head K/V were (re)computed from target features this step."""
        positions = [{"draft_index": 1, "feature": "target", "feature_position": n - 1, "input_position": n - 1}]
        for i in range(2, k + 1):
            positions.append({"draft_index": i, "feature": "head", "feature_position": n + i - 3,
                              "input_position": n + i - 2})
        return {"kind": self.name, "greedy": ctx.temperature <= 0, "root_position": n, "root_token_id": root,
                "taps": list(self.taps), "aux_layer_ids": list(self.head.config.aux_layer_ids), "first_pass": first,
                "positions": positions}
