"""Method mtp's proposer: a head with Q-only attention over the target's own KV cache drafts every step of a round
at one constant position (docs/design/methods.md 7; vLLM ``v1/spec_decode/gemma4.py``, ``constant_draft_positions =
True``; transformers ``SinglePositionMultiTokenCandidateGenerator``). Two heads speak the same small interface
(``kv_layers``, ``draft_position``, ``draft``, ``reads``, ``one_hot_draft``, ``label``):
:class:`specviz.methods.mtp.head.MtpHead` (trained by specviz, no public recipe) and
:class:`specviz.methods.mtp.assistant.Gemma4AssistantHead` (Gemma 4's published assistant on a Gemma 4 target).

With committed tokens x_0..x_n (x_n = the root) the target runner's cache holds positions 0..n-1
(:mod:`specviz.runner`'s convention), which is exactly what the draft may attend to::

    step 1:      (f_{n-1}, x_n)     at position P -> logits of d_1, h_1
    step m >= 2: (h_{m-1}, d_{m-1}) at position P -> logits of d_m, h_m

P = ``head.draft_position(n)``: n - 1 for specviz's head (vLLM's reading), n for Gemma 4's assistant (transformers'
``input_ids.shape[1] - 1``). Every step reads the K/V of the target layers ``head.kv_layers`` ({layer type: layer})
for positions 0..n-1 through ``context.target_runner.layer_kv`` (views: nothing is copied or written), so drafting
writes no KV anywhere and nothing but the target's cache is ever rolled back. f_{n-1} is the target's final-norm
hidden state at the last committed position (tap ``final_norm``, transformers' ``hidden_states[-1]``).

q: one-hot (argmax) at temperature 0, and at every temperature for a head with ``one_hot_draft`` (Gemma 4's
assistant: its centroid-masked logits are no distribution outside the chosen clusters, and both public drivers
draft its argmax); else ``logits_to_probs(head logits, T, top_k, top_p)`` with d_m ~ q (``Draft.probs``). Either way
standard and block verification stay lossless.

Argmax drafting on the static runner with CUDA graphs (:class:`MtpDraftGraphs`): the k steps run as one captured
graph per (cache buffers, k), reading the static cache's whole layers (keys at slots >= n hidden by masks built
inside the graph from the position buffer), so a step's drafting is one replay and no host read. Sampled drafting
and the eager runner run the loop eagerly.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import torch

from specviz.graphs import CapturedGraphs, capture
from specviz.runner import FINAL_NORM
from specviz.sampling import logits_to_probs
from specviz.transfer import HostCopy, to_device
from specviz.proposer import Draft, Outcome, StepContext, keep_last_feature

log = logging.getLogger(__name__)
LABEL = "MTP head"  # a head without its own label (test stubs)


class MtpProposer:
    """Chain drafting with an MTP head at a constant position.

    Args:
        head: an MTP head attached to the target (same device / dtype; the module docstring's interface).
        num_speculative_tokens: k >= 1.
    Raises:
        ValueError: k < 1. RuntimeError from propose: no target runner in the step context, a cache
            whose length is not the committed length, or a skipped outcome.
    """

    name = "mtp"
    taps = (FINAL_NORM,)

    def __init__(self, head: torch.nn.Module, num_speculative_tokens: int = 4,
                 graphs: "MtpDraftGraphs | None" = None):
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.head = head
        self.runner = graphs  # the pooled graphs (the engine reads runner.capture_s to exclude capture time)
        self.kv_layers = dict(head.kv_layers)
        self.one_hot = bool(getattr(head, "one_hot_draft", False))
        self.num_speculative_tokens = int(num_speculative_tokens)
        self.reset()

    def reset(self) -> None:
        self.known = 0  # committed positions whose feature was observed
        self._feature: torch.Tensor | None = None  # f_{known-1} [d]
        self._pending: tuple[dict[str, Any], HostCopy] | None = None

    def observe(self, outcome: Outcome) -> None:
        """Keep the target feature at the last committed position; fill the last chain's confidences."""
        keep_last_feature(self, outcome, FINAL_NORM)
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
        kv = self._target_kv(ctx, n)  # {layer type: ([1, kv, n, hd], [1, kv, n, hd])}: positions 0..n-1
        dev = self._feature.device
        tok = to_device(torch.tensor([[int(token_ids[n])]], dtype=torch.long), dev)  # the root x_n; no host wait
        argmax = ctx.temperature <= 0 or self.one_hot
        details = self._describe(n, int(token_ids[n]), k, argmax)
        if self.runner is not None and argmax and self.runner.usable(ctx.target_runner):
            drafts, conf = self.runner.draft(self.head, ctx.target_runner, self._feature, tok, n, k)
            self._pending = (details, HostCopy(conf))  # queued now (the graph reuses conf), read by observe
            return Draft(token_ids=drafts, probs=None, details=details)
        pos = torch.full((1, 1), self.head.draft_position(n), dtype=torch.long, device=dev)  # constant in the round
        h = self._feature.view(1, 1, -1)
        drafts, probs, conf = [], [], []
        for _ in range(k):
            h, logits = self.head.draft(h, tok, pos, kv)  # [1, 1, d], [1, 1, V]
            x, q = _draw(logits[0, 0], ctx, argmax)
            dist = q if q is not None else torch.softmax(logits[0, 0], dim=-1)
            conf.append(torch.stack([dist.max(), dist[x[0]]]))
            drafts.append(x)
            if q is not None:
                probs.append(q)
            tok = x.view(1, 1)
        self._pending = (details, HostCopy(torch.stack(conf)))
        return Draft(token_ids=torch.cat(drafts), probs=torch.stack(probs) if probs else None, details=details)

    def _target_kv(self, ctx: StepContext, n: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        runner = ctx.target_runner
        if runner is None or not hasattr(runner, "layer_kv"):
            raise RuntimeError("mtp reads the target's KV cache: the step context needs target_runner (a runner "
                               "with layer_kv), which SpecDecoder sets")
        if runner.seq_len != n:
            raise RuntimeError(f"mtp: the target cache holds {runner.seq_len} positions, expected the {n} committed "
                               "before the root")
        return {kind: tuple(t[None] for t in runner.layer_kv(layer)) for kind, layer in self.kv_layers.items()}

    def _describe(self, n: int, root: int, k: int, argmax: bool) -> dict[str, Any]:
        """Plain data for the trace and :mod:`specviz.methods.mtp.view`: what the round read (``kv_reads``: per layer
        type the target layer and the key positions, of the n cached 0..n-1), how q was made, and per step
        (1-based) its position, the fed hidden state, the input token and its confidence (q of the head's top token
        and of the drafted one; filled by observe)."""
        pos = int(self.head.draft_position(n))
        steps = [{"step": m, "position": pos, "hidden": "target f_t" if m == 1 else f"head h_{m - 1}",
                  "attended_positions": [0, n - 1]} for m in range(1, k + 1)]
        c = self.head.config
        vocab, real = getattr(c, "vocab_size", None), getattr(c, "real_logits", None)
        return {"kind": self.name, "label": getattr(self.head, "label", LABEL), "greedy": argmax,
                "one_hot_draft": self.one_hot, "root_position": n, "root_token_id": root,
                "kv_layer": next(iter(self.kv_layers.values())), "kv_reads": self.head.reads(n),
                "real_logits": real if real is not None and real != vocab else None, "vocab_size": vocab,
                "taps": list(self.taps), "steps": steps}


def _draw(logits: torch.Tensor, ctx: StepContext, argmax: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits float32 [V] -> (token int64 [1], q float32 [V] or None for a one-hot argmax draft)."""
    if not argmax:
        q = logits_to_probs(logits, ctx.temperature, ctx.top_k, ctx.top_p)
        return torch.multinomial(q, 1, generator=ctx.generator), q
    return logits.argmax(dim=-1, keepdim=True), None


class MtpDraftGraphs(CapturedGraphs):
    """Argmax MTP chains as CUDA graphs, one per (target cache buffers, k): the static runner's K/V buffers of the
    head's ``kv_layers`` are read whole ([1, kv, max_cache_len, hd]; keys at slots >= n are masked inside the
    graph), the inputs (f_{n-1}, the root token, the draft position) are copied into static buffers, and one replay
    drafts k tokens with their confidences. Pooled by the decoder (one per MTP head), like the EAGLE head runner,
    so graphs survive requests. A failed capture is logged once and that k drafts eagerly.

    Attributes: capture_s (seconds spent capturing; the engine excludes it from step times), replays.
    """

    def __init__(self):
        self._graphs: dict[tuple, tuple | None] = {}
        self.capture_s = 0.0
        self.replays = 0

    @staticmethod
    def usable(runner: Any) -> bool:
        """Graphs need the static runner's persistent cache, on CUDA with graphs on."""
        return bool(getattr(runner, "cuda_graphs", False)) and hasattr(runner, "cache") \
            and hasattr(runner, "max_cache_len") and runner.seq_len > 0

    @torch.inference_mode()
    def draft(self, head: torch.nn.Module, runner: Any, feature: torch.Tensor, tok: torch.Tensor,
              n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Argmax drafts int64 [k] and confidences float32 [k, 2] (q of the top token, of the drafted one = equal
        under argmax) for the root ``tok`` [1, 1] with feature f_{n-1} [d], n = the cached length."""
        kv = {kind: (runner.cache.layers[layer].keys, runner.cache.layers[layer].values)  # the whole static buffers
              for kind, layer in head.kv_layers.items()}
        key = (tuple(t.data_ptr() for pair in kv.values() for t in pair), k)
        if key not in self._graphs:
            self._graphs[key] = self._capture(head, kv, feature, k)
        entry = self._graphs[key]
        if entry is None:
            return _eager_chain(head, kv, feature, tok, head.draft_position(n), k)
        graph, (h_buf, tok_buf, pos_buf), out = entry
        h_buf.copy_(feature.view(1, 1, -1))
        tok_buf.copy_(tok)
        pos_buf.fill_(head.draft_position(n))
        graph.replay()
        self.replays += 1
        return out[0].clone(), out[1].clone()

    def _capture(self, head, kv, feature, k):
        t0 = time.perf_counter()
        dev = feature.device
        h_buf = torch.zeros(1, 1, feature.shape[-1], dtype=feature.dtype, device=dev)
        tok_buf = torch.zeros(1, 1, dtype=torch.long, device=dev)
        pos_buf = torch.zeros(1, 1, dtype=torch.long, device=dev)
        try:
            graph, out = capture(lambda: _graph_body(head, kv, h_buf, tok_buf, pos_buf, k), dev)
            return graph, (h_buf, tok_buf, pos_buf), out
        except Exception as exc:  # noqa: BLE001 - a failed capture must not fail the request
            log.warning("specviz: CUDA graph capture of the MTP chain (k = %d) failed; it drafts eagerly: %s: %s",
                        k, type(exc).__name__, exc)
            return None
        finally:
            self.capture_s += time.perf_counter() - t0


def _graph_body(head, kv, h_buf, tok_buf, pos_buf, k):
    """k argmax MTP steps from the static buffers (capturable: no host value): (drafts [k], conf [k, 2])."""
    h, tok, drafts, conf = h_buf, tok_buf, [], []
    for _ in range(k):
        h, logits = head.draft(h, tok, pos_buf, kv)  # the masks (slot < n, windows) are built from pos_buf inside
        row = logits[0, 0]
        x = row.argmax(dim=-1, keepdim=True)  # [1]
        top = torch.softmax(row, dim=-1).max().reshape(1)
        conf.append(torch.cat([top, top]))  # one-hot q: the drafted token is the top token
        drafts.append(x)
        tok = x.view(1, 1)
    return torch.cat(drafts), torch.stack(conf)


def _eager_chain(head, kv, feature, tok, pos, k):
    """The same chain without a graph (a failed capture), over the whole buffers with the same masks."""
    pos_buf = torch.full((1, 1), pos, dtype=torch.long, device=feature.device)
    return _graph_body(head, kv, feature.view(1, 1, -1), tok, pos_buf, k)
