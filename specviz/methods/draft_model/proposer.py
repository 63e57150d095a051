"""Draft-model proposer: a small causal LM with the target's tokenizer drafts k tokens.

Sources: Leviathan et al. 2023; Chen et al. 2023; vLLM ``v1/spec_decode/draft_model.py``; HF
``assistant_model`` (``generation/candidate_generator.py``).

q: greedy drafting (temperature 0) takes argmax, so q is one-hot and ``Draft.probs`` is None;
otherwise q_i = ``logits_to_probs(draft_logits_i, T, top_k, top_p)``, the request's full
processing (as vLLM's draft-model proposer applies the request's sampling metadata), x_i ~ q_i,
and ``Draft.probs`` holds q_i exactly. With top-k / top-p on the target side only, the draft
would keep proposing tokens outside p's support and an identical draft would lose most of its
acceptance.

KV cache: the drafter's runner follows the committed tokens exactly. Each call compares the
tokens in its cache with ``token_ids`` and truncates to their common prefix (rollback after a
rejection), then feeds the committed tokens it has not seen (catch-up: after a full accept the
last draft token and the bonus token), then drafts.

Static trees (``speculative_token_tree``, vLLM's setting): node (r_1, .., r_d) is the r_d-th most
likely token of the draft's q at its parent (top-k children, deterministic, so q is one-hot and
the target verifies with rule A at T > 0: :mod:`specviz.sampling.tree`). Level d is expanded by
one tree forward of the drafter over the root and every node above depth d (ancestor mask,
positions n + depth; the shallower nodes are recomputed rather than kept, so the drafter's cache
never holds a scratch slot after :meth:`propose` returns: it keeps the committed tokens only).
Cost: one drafter forward per level of 1 + (nodes above that level) rows.

No host waits (one wait per engine step, the verifier's): the catch-up tokens go to the device from
pinned memory, the draft tokens kept in the cache come back to the host by a non-blocking copy that
the next call reads (complete by then: the engine's verification waited after it), and sampled
drafts use the exponential race that ``torch.multinomial(q, 1)`` runs, without its host-side checks.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specviz import tree as T
from specviz.runner import EagerRunner, ModelRunner
from specviz.sampling import logits_to_probs
from specviz.transfer import to_device
from specviz.proposer import Draft, NoFeedback, StepContext


def _sample(q: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """x ~ q for q float32 [V] -> int64 [1], without a host wait. The exponential race
    argmax(q / E), E ~ Exp(1), exactly as ``torch.multinomial(q, 1)`` computes it (PyTorch
    ``aten/src/ATen/native/Distributions.cpp``, the one-sample path): same generator draws, same
    token, minus multinomial's validity checks (two host reads of the device per call)."""
    e = torch.empty_like(q).exponential_(generator=generator)  # [V]
    return (q / e).argmax(dim=-1, keepdim=True)


class DraftModelProposer(NoFeedback):
    """Args:
        runner: a :class:`~specviz.runner.ModelRunner` over the draft model (e.g. EagerRunner).
        num_speculative_tokens: k >= 1.
        vocab_size: the target's V, when the draft's vocabulary rows differ from it by padding
            beyond the shared tokenizer: draft logits are cut to V, or q padded with zeros to V
            (as vLLM pads the draft distribution), so padding rows are never drafted. None: the
            draft's own rows.
        tree: a static tree (``speculative_token_tree`` string or a list of paths, see
            :func:`specviz.tree.parse_choices`), or None for a chain of k.
    Raises:
        ValueError: k < 1, an invalid tree, or one deeper than k.
    """

    name = "draft_model"

    def __init__(self, runner: ModelRunner, num_speculative_tokens: int = 5, vocab_size: int | None = None,
                 tree: str | Sequence | None = None):
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.tree_paths = None if tree is None else T.parse_choices(tree, max_depth=num_speculative_tokens)
        self.runner = runner
        self.num_speculative_tokens = int(num_speculative_tokens)
        self.vocab_size = vocab_size
        self._cached: list[int] = []
        self._pending: torch.Tensor | None = None  # draft tokens fed last step, still on the device
        self._pending_host: tuple[torch.Tensor, torch.cuda.Event] | None = None  # their pinned copy, queued

    @classmethod
    def from_model(cls, model: torch.nn.Module, num_speculative_tokens: int = 5) -> "DraftModelProposer":
        return cls(EagerRunner(model), num_speculative_tokens)

    @property
    def cached_ids(self) -> list[int]:
        """The tokens whose keys/values are in the drafter's cache, in order."""
        if self._pending is not None:  # read lazily: in the engine the copy is complete by now
            if self._pending_host is not None:
                host, copied = self._pending_host
                if not copied.query():  # only when called outside the engine's loop
                    copied.synchronize()
                self._cached.extend(host.tolist())
            else:
                self._cached.extend(self._pending.tolist())
            self._pending, self._pending_host = None, None
        return self._cached

    def reset(self) -> None:
        self.runner.reset()
        self._cached, self._pending, self._pending_host = [], None, None

    def _sync_cache(self, token_ids: list[int]) -> torch.Tensor:
        """Roll the cache back to the longest prefix it shares with ``token_ids`` (keeping at
        least one token to feed), feed the rest, return the logits [V] after the last token."""
        cached = self.cached_ids
        common = 0
        limit = min(len(cached), len(token_ids) - 1)
        while common < limit and cached[common] == token_ids[common]:
            common += 1
        self.runner.truncate(common)
        self._cached = list(token_ids)
        feed = torch.tensor(token_ids[common:], dtype=torch.long)
        feed = to_device(feed, getattr(self.runner, "device", feed.device))  # [n]; queued, no wait
        return self.runner.forward(feed)[-1]

    def propose(self, token_ids: Sequence[int], num_tokens: int | None = None,
                context: StepContext | None = None) -> Draft:
        k = self.num_speculative_tokens if num_tokens is None else min(num_tokens, self.num_speculative_tokens)
        ctx = context or StepContext()
        if k <= 0:
            return Draft(token_ids=torch.empty(0, dtype=torch.long), details={"kind": "draft_model"})
        logits = self._sync_cache(list(token_ids))  # [V]
        if self.tree_paths is not None:
            return self._propose_tree(list(token_ids), k, logits, ctx)
        tokens, probs = [], []
        V = self.vocab_size or logits.shape[-1]
        for i in range(k):
            logits = logits[:V]  # [min(V_draft, V)]: padding rows beyond the target's V never drafted
            if ctx.temperature > 0:
                q = logits_to_probs(logits, ctx.temperature, ctx.top_k, ctx.top_p)  # [V_draft'] float32
                x = _sample(q, ctx.generator)  # [1]
                probs.append(torch.nn.functional.pad(q, (0, V - q.shape[-1])))  # [V]: zeros for missing rows
            else:
                x = logits.argmax(dim=-1, keepdim=True)  # [1]
            tokens.append(x)
            if i + 1 < k:  # the last draft token is fed at the next step, only if accepted
                logits = self.runner.forward(x)[-1]
        draft = torch.cat(tokens)  # [k]
        self._pending = draft[:-1]
        self._pending_host = None
        if draft.is_cuda and k > 1:  # back to the host behind this step's work, read next call
            host = torch.empty(k - 1, dtype=torch.long, pin_memory=True)
            host.copy_(self._pending, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(torch.cuda.current_stream(draft.device))
            self._pending_host = (host, copied)
        return Draft(
            token_ids=draft,
            probs=torch.stack(probs) if probs else None,  # [k, V] or None (one-hot)
            details={"kind": "draft_model", "greedy": ctx.temperature <= 0},
        )

    def _propose_tree(self, token_ids: list[int], k: int, root_logits: torch.Tensor, ctx: StepContext) -> Draft:
        """Expand the static tree (paths no deeper than k) level by level; see the module docstring."""
        paths = [p for p in self.tree_paths if len(p) <= k]
        parents = T.choices_parents(paths)
        depth = [len(p) for p in paths]
        V = self.vocab_size or root_logits.shape[-1]
        tokens = [0] * len(paths)
        scores = [0.0] * len(paths)
        row_logits = {-1: root_logits}  # node -> the draft's logits after it (-1: the root)
        n = len(token_ids) - 1  # committed tokens before the root
        for level in range(1, max(depth, default=0) + 1):
            if level > 1:  # one tree forward over the root and every node above this level
                above = [i for i in range(len(paths)) if depth[i] < level]
                self.runner.truncate(n)
                ids = torch.tensor([token_ids[-1], *(tokens[i] for i in above)], dtype=torch.long)
                out = self.runner.forward_features(to_device(ids, getattr(self.runner, "device", ids.device)),
                                                   parents=[parents[i] for i in above])
                row_logits = {node: out.logits[1 + j] for j, node in enumerate(above)}
            for i in (i for i in range(len(paths)) if depth[i] == level):
                tok, logq = self._ranked(row_logits[parents[i]][:V], ctx, paths[i][-1])
                tokens[i] = tok
                scores[i] = logq + (scores[parents[i]] if parents[i] >= 0 else 0.0)
        self.runner.truncate(n + 1)  # committed tokens and the root only: the scratch rows are dropped
        self._cached, self._pending, self._pending_host = list(token_ids), None, None
        return Draft(token_ids=torch.tensor(tokens, dtype=torch.long), probs=None, parents=parents, scores=scores,
                     tree_rule="topk",
                     details={"kind": "draft_model", "greedy": ctx.temperature <= 0, "tree": str(paths)})

    @staticmethod
    def _ranked(logits: torch.Tensor, ctx: StepContext, rank: int) -> tuple[int, float]:
        """(the rank-th most likely token of the draft's q, log q of it); q = the request's
        processing at T > 0, softmax(logits) at T = 0 (ranked by the logits: the greedy order)."""
        q = logits_to_probs(logits, ctx.temperature, ctx.top_k, ctx.top_p) if ctx.temperature > 0 else \
            torch.softmax(logits.float(), -1)
        order = torch.argsort(q if ctx.temperature > 0 else logits.float(), descending=True, stable=True)
        tok = int(order[rank])
        return tok, float(torch.log(q[tok]).clamp_min(-1e30))
