"""Medusa (``medusa``): K heads on the target's final-norm feature at the last committed position.

Sources: Cai et al. 2024 (arXiv 2401.10774); vLLM ``v1/spec_decode/medusa.py`` (``MedusaProposer``:
argmax of every head, a chain); FasterDecoding/Medusa ``medusa/model/utils.py`` (static trees from
``medusa_choices``: a node's token is the r-th top candidate of head depth-1, all heads reading the
same feature, so the tree is a Cartesian product that does not condition on the parent).

With committed tokens x_0..x_n (x_n = the root, the target's last sample, not yet run) the feature
is f_{n-1} (the target's final-norm hidden state at position n-1, handed over by ``observe``); head
i predicts x_{n+1+i}::

    chain (default):  d_i = argmax head_{i-1}(f_{n-1}),   i = 1..min(k, K)
    tree:             node with path (r_1..r_d) = the r_d-th top candidate of head d-1,
                      paths from ``speculative_token_tree`` (vLLM's format) or Medusa choices

q is one-hot at every node (deterministic drafts, ``Draft.probs`` None), so standard / block
verification stay lossless at any temperature (a tree: rule A, ``tree_rule="topk"``, docs/design/methods.md 1.4).
``Draft.details`` records each head's top candidates and which ones formed the draft (the view:
:mod:`specviz.methods.medusa.view`).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from specviz.runner import FINAL_NORM
from specviz.transfer import HostCopy, to_device
from specviz.tree import choices_parents, depths, parse_choices
from specviz.methods.medusa import DEFAULT_TREE as DEFAULT_MEDUSA_TREE  # noqa: F401 (the held-out tree)
from specviz.proposer import Draft, Outcome, StepContext, keep_last_feature

MEDUSA_TOP_K = 10  # candidates per head a tree path may rank into (Medusa's TOPK placeholder)
SHOWN_CANDIDATES = 5  # top candidates per head recorded for the view (more if a tree ranks deeper)


class MedusaProposer:
    """Chain or static-tree drafting with a :class:`~specviz.methods.medusa.head.MedusaHead`.

    Args:
        head: Medusa heads attached to the target, on its device, eval mode; ``head(f)`` maps
            features [..., d] to logits float32 [K, ..., V].
        num_speculative_tokens: k >= 1; a chain drafts min(k, K) tokens (head i can only reach x_{n+1+i}).
        tree: None (chain), or a static tree: vLLM's ``speculative_token_tree`` string or a list of
            Medusa choice paths, at most K deep, ranks < :data:`MEDUSA_TOP_K`.
    Raises:
        ValueError: k < 1 or a malformed tree (from :func:`specviz.tree.parse_choices`); RuntimeError
            from propose if the engine skipped an outcome.
    """

    name = "medusa"
    taps = (FINAL_NORM,)

    def __init__(self, head: torch.nn.Module, num_speculative_tokens: int = 4,
                 tree: str | Sequence[Sequence[int]] | None = None):
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.head = head
        self.num_heads = int(head.config.num_heads)
        self.num_speculative_tokens = int(num_speculative_tokens)
        self.paths = None if tree is None else parse_choices(tree, max_depth=self.num_heads, max_rank=MEDUSA_TOP_K)
        self._indices: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self.reset()

    def reset(self) -> None:
        self.known = 0  # committed positions whose feature was observed
        self._feature: torch.Tensor | None = None  # f_{known-1} [d]
        self._pending: tuple[dict[str, Any], HostCopy, HostCopy] | None = None  # details to fill

    def observe(self, outcome: Outcome) -> None:
        """Keep the feature at the last committed position; fill the last draft's candidate lists."""
        keep_last_feature(self, outcome, FINAL_NORM)
        if self._pending is not None:
            details, probs, ids = self._pending
            for h, (ps, ts) in enumerate(zip(probs.tolist(), ids.tolist())):
                details["heads"][h]["candidates"] = [[int(t), float(p)] for t, p in zip(ts, ps)]
            self._pending = None

    @torch.inference_mode()
    def propose(self, token_ids: Sequence[int], num_tokens: int | None = None,
                context: StepContext | None = None) -> Draft:
        k = self.num_speculative_tokens if num_tokens is None else min(num_tokens, self.num_speculative_tokens)
        n = len(token_ids) - 1  # position of the root x_n
        if self.known != n:
            raise RuntimeError(f"medusa: the context has {n} committed positions but features of {self.known} were "
                               "observed; call observe() after every target forward")
        if k <= 0 or n == 0 or self._feature is None:
            return Draft(token_ids=torch.empty(0, dtype=torch.long), details={"kind": self.name})
        logits = self.head(self._feature[None])[:, 0]  # [K, V]: head i predicts x_{n+1+i}
        deepest_rank = max(max(p) for p in self.paths) if self.paths else 0
        ranks = max(SHOWN_CANDIDATES, deepest_rank + 1)
        probs, cand = torch.softmax(logits, dim=-1).topk(min(ranks, logits.shape[-1]), dim=-1)  # [K, R] each
        if self.paths is None:
            depth = min(k, self.num_heads)
            nodes = [(i, 0) for i in range(depth)]  # (head, rank)
            parents = None
        else:
            paths = [p for p in self.paths if len(p) <= k]  # near max_new_tokens: drop the deepest nodes
            nodes = [(len(p) - 1, p[-1]) for p in paths]
            parents = choices_parents(paths)
        heads_idx, rank_idx = self._node_index(nodes, cand.device)
        tokens = cand[heads_idx, rank_idx]  # [N] on the device, no host wait
        details = self._describe(n, int(token_ids[n]), nodes, parents, context)
        self._pending = (details, HostCopy(probs), HostCopy(cand))  # queued now, read by observe without a wait
        return Draft(token_ids=tokens, details=details, parents=parents, tree_rule="topk")

    def _node_index(self, nodes: list[tuple[int, int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(head, rank) int64 [N] each on ``device``, kept per node list: a chain or tree repeats its nodes every step,
        so the host builds and copies them once."""
        key = (tuple(nodes), str(device))
        if key not in self._indices:
            self._indices[key] = (to_device(torch.tensor([h for h, _ in nodes], dtype=torch.long), device),
                                  to_device(torch.tensor([r for _, r in nodes], dtype=torch.long), device))
        return self._indices[key]

    def _describe(self, n: int, root: int, nodes, parents, ctx: StepContext | None) -> dict[str, Any]:
        """Plain data for the trace (``step.match``) and :mod:`specviz.methods.medusa.view`: every head's top
        candidates [[token id, softmax prob], ...] (filled by observe), and per draft node the head and
        rank it came from (``nodes``, in ``Draft.token_ids`` order, with parent and depth). Head i's
        ``draft_position`` i + 1: it predicts x_{n+1+i}, the (i+1)-th token after the root x_n."""
        return {"kind": self.name, "greedy": ctx is None or ctx.temperature <= 0, "root_position": n,
                "root_token_id": root, "feature_position": n - 1, "taps": list(self.taps),
                "shape": "chain" if parents is None else "tree",
                "heads": [{"head": i, "draft_position": i + 1, "candidates": []} for i in range(self.num_heads)],
                "nodes": [{"head": h, "rank": r, "parent": j - 1 if parents is None else parents[j],
                           "depth": (j + 1) if parents is None else depths(parents)[j]}
                          for j, (h, r) in enumerate(nodes)]}
