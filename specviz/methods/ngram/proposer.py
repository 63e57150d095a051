"""N-gram proposer (prompt lookup decoding).

Source: vLLM ``v1/spec_decode/ngram_proposer.py``; A. Saxena, "Prompt Lookup Decoding" (2023).
Semantics (docs/design/algorithms.md): search the context (prompt + generated) for an earlier occurrence of
its own last n tokens, n from ``prompt_lookup_max`` down to ``prompt_lookup_min``. The longest n
that matches wins; among equal n the earliest occurrence wins; the draft is the tokens that
follow it, at most k, possibly fewer (the continuation may run into the final suffix itself).
The final suffix is not a match of itself.

Beyond the draft, :meth:`NgramProposer.propose` records the match details the trie view draws:
the n tried and how many occurrences each had, the matched n, every occurrence position of
the matched n-gram, and the trie of continuations after those occurrences with their counts.

With ``tree_branches`` set (generate's ``ngram_tree_branches``) the draft is a tree of those
continuations instead (:mod:`specviz.ranked_tree`: up to that many children per node,
most frequent first, score = the share of occurrences that continue so; depth <= k), whose
first-ranked path need not be the chain's earliest occurrence.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from specviz.methods.ngram.options import PATTERN, resolve_lookup_bounds
from specviz.transfer import pinned
from specviz.proposer import Draft, NoFeedback, StepContext
from specviz.ranked_tree import check_branches, ranked_tree

TRIE_MAX_DEPTH = 8  # continuation depth kept in the trie view (>= usual k)


def find_occurrences(context: np.ndarray, n: int) -> np.ndarray:
    """Start positions (ascending) of every earlier occurrence of ``context[-n:]`` in
    ``context`` (int64 [L]), excluding the final suffix itself. Empty if none or L <= n."""
    L = context.shape[0]
    if L <= n:
        return np.empty(0, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(context[:-1], n)  # [L - n, n]
    return np.flatnonzero((windows == context[-n:]).all(axis=1))


def continuation_trie(context: np.ndarray, starts: np.ndarray, n: int, depth: int) -> list[dict[str, Any]]:
    """Trie of the (up to ``depth``) tokens following each occurrence start + n.

    Returns the root's children: [{"token_id", "count", "children": [...]}], most frequent first
    (ties: the token seen earliest in the context first)."""
    paths = [context[s + n : s + n + depth].tolist() for s in starts]

    def build(seqs: list[list[int]]) -> list[dict[str, Any]]:
        order: dict[int, list[list[int]]] = {}
        for seq in seqs:
            if seq:
                order.setdefault(seq[0], []).append(seq[1:])
        nodes = [{"token_id": tok, "count": len(rest), "children": build(rest)} for tok, rest in order.items()]
        return sorted(nodes, key=lambda node: -node["count"])  # stable: first-seen order on ties

    return build(paths)


class NgramProposer(NoFeedback):
    """Prompt-lookup proposer; deterministic, so ``Draft.probs`` is None (q is one-hot).

    Args:
        prompt_lookup_min / prompt_lookup_max: n-gram sizes searched (vLLM defaults, see
            :func:`resolve_lookup_bounds`).
        num_speculative_tokens: k, the most tokens drafted per step (>= 1); a tree's depth.
        tree_branches: None (a chain) or the children kept per tree node (>= 1).
    Raises:
        ValueError: bounds out of order or < 1, k < 1, tree_branches < 1.
    """

    name = "ngram"

    def __init__(self, prompt_lookup_min: int | None = None, prompt_lookup_max: int | None = None,
                 num_speculative_tokens: int = 5, tree_branches: int | None = None):
        self.tree_branches = check_branches(tree_branches, "ngram_tree_branches")
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.prompt_lookup_min, self.prompt_lookup_max = resolve_lookup_bounds(prompt_lookup_min, prompt_lookup_max)
        self.num_speculative_tokens = int(num_speculative_tokens)

    def reset(self) -> None:  # stateless
        pass

    def propose(self, token_ids: Sequence[int], num_tokens: int | None = None,
                context: StepContext | None = None) -> Draft:
        k = self.num_speculative_tokens if num_tokens is None else min(num_tokens, self.num_speculative_tokens)
        ctx = np.asarray(list(token_ids), dtype=np.int64)
        tried: list[dict[str, int]] = []
        for n in range(self.prompt_lookup_max, self.prompt_lookup_min - 1, -1):
            starts = find_occurrences(ctx, n)
            tried.append({"n": n, "occurrences": int(starts.size)})
            if starts.size:
                first = int(starts[0])
                draft = ctx[first + n : first + n + max(k, 0)]
                details = {
                    "kind": "ngram",
                    "n": n,
                    PATTERN: ctx[-n:].tolist(),
                    "suffix_start": int(ctx.size - n),
                    "occurrences": starts.tolist(),
                    "match_position": first,
                    "tried": tried,
                    "trie": continuation_trie(ctx, starts, n, max(TRIE_MAX_DEPTH, k)),
                    "prompt_lookup_min": self.prompt_lookup_min,
                    "prompt_lookup_max": self.prompt_lookup_max,
                }
                if self.tree_branches is not None:
                    return self._tree(details, int(starts.size), k)
                ids = pinned(torch.as_tensor(draft, dtype=torch.long))  # pinned: the engine's copy does not wait
                return Draft(token_ids=ids, probs=None, details=details)
        details = {"kind": "ngram", "n": 0, PATTERN: [], "suffix_start": int(ctx.size), "occurrences": [],
                   "match_position": -1, "tried": tried, "trie": [],
                   "prompt_lookup_min": self.prompt_lookup_min, "prompt_lookup_max": self.prompt_lookup_max}
        return Draft(token_ids=torch.empty(0, dtype=torch.long), probs=None, details=details)

    def _tree(self, details: dict[str, Any], occurrences: int, k: int) -> Draft:
        """The continuation trie's best branches as a draft tree (depth <= k)."""
        root = {"count": occurrences, "children": details["trie"]}
        tokens, parents, scores = ranked_tree(
            root, lambda node: [(c["token_id"], c["count"] / node["count"], c) for c in node["children"]],
            self.tree_branches, k)
        details["tree_branches"] = self.tree_branches
        ids = pinned(torch.as_tensor(tokens, dtype=torch.long))
        return Draft(token_ids=ids, probs=None, details=details, parents=parents, scores=scores, tree_rule="topk")
