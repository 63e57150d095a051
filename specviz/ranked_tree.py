"""A draft tree from ranked continuations (multi-candidate n-gram and suffix drafts).

Where a proposer knows several continuations with counts (the n-gram matcher's continuation trie,
a suffix-tree node's children) it can draft a tree of them instead of one chain: every node keeps
its ``branches`` most frequent children (ties: the order the proposer lists them), each child's
score is the log of the path's empirical probability (parent's probability * child count / parent
count; natural log, as EAGLE-2's cumulative log-confidence in ``Draft.scores``), and nodes
are taken best score first (a priority queue) until ``max_nodes``. A child never scores above its
parent and is queued only once its parent is taken, so parents come before children
(``parents[i] < i``, :mod:`specviz.tree`). Children are deterministic: q is one-hot and the tree's
rule is "topk" (docs/design/methods.md 1.4 rule A). Same idea as the suffix-decoding paper's speculation tree
(Oliaro et al., arXiv 2411.04975, section 4.2), with its per-node count ratios.
"""

from __future__ import annotations

import heapq
import math
from typing import Any, Callable, Iterable

from .tree import MAX_TREE_NODES, check_branches  # noqa: F401 (proposers import it here)

Expand = Callable[[Any], Iterable[tuple[int, float, Any]]]  # node -> (token, P(child | node), child) best first


def ranked_tree(root: Any, expand: Expand, branches: int, max_depth: int, max_nodes: int = MAX_TREE_NODES,
                min_score: float = 0.0) -> tuple[list[int], list[int], list[float]]:
    """Best-first tree below ``root`` (excluded). expand(node): its children as (token, conditional
    probability, child node), best first; the first ``branches`` are kept. A node enters if its
    depth <= max_depth and its score (product of conditional probabilities) >= min_score.
    Returns (tokens [N], parents [N] (-1 = root), scores [N] = log path probability), N <= max_nodes."""
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    queue: list[tuple[float, int, int, int, Any, int]] = []  # (-score, order, parent, token, node, depth)
    order = 0

    def push(parent: int, node: Any, score: float, depth: int) -> None:
        nonlocal order
        if depth >= max_depth:
            return
        for tok, prob, child in list(expand(node))[:branches]:
            s = score * prob
            if s >= min_score and s > 0:
                heapq.heappush(queue, (-s, order, parent, int(tok), child, depth + 1))
                order += 1

    push(-1, root, 1.0, 0)
    while queue and len(tokens) < max_nodes:
        neg, _, parent, tok, node, depth = heapq.heappop(queue)
        tokens.append(tok)
        parents.append(parent)
        scores.append(math.log(-neg))
        push(len(tokens) - 1, node, -neg, depth)
    return tokens, parents, scores
