"""Suffix decoding proposer.

Sources: Oliaro et al., "SuffixDecoding: Extreme Speculative Decoding for Emerging AI
Applications" (arXiv 2411.04975); Snowflake Arctic Inference's suffix tree; vLLM
``v1/spec_decode/suffix_decoding.py``. Semantics as docs/design/algorithms.md:

* a suffix tree of the request's own tokens (prompt + output so far) and a global tree of the
  outputs of earlier requests (at most ``max_cached_requests``, oldest evicted first);
* for match length m = 1, 2, ... walk the last m context tokens from the root (stop at the first
  m that is absent or at ``max_depth``); from the matched node grow a draft by following the most
  frequent child, keeping prob *= child.count / node.count, and stop when prob < min_token_prob or
  the budget min(k, floor(m * max_spec_factor + max_spec_offset)) is spent;
* score = sum of the running probs; the best score wins (ties: the longer m), across both trees.

With ``tree_branches`` set (generate's ``suffix_tree_branches``) the winning match node grows a
tree instead of one path (:mod:`specviz.ranked_tree`: up to that many children per node,
most frequent first, each kept while its path probability >= min_token_prob, depth <= the match's
budget), as the suffix-decoding paper's speculation tree.

Both trees are depth-limited suffix tries: a node at depth d stands for a token string s of
length d and counts the positions where s occurs. Appending a token extends the last
``max_depth`` suffixes, O(max_depth) per token.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from copy import deepcopy
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from specviz.transfer import pinned
from specviz.proposer import Draft, NoFeedback, StepContext
from specviz.ranked_tree import check_branches, ranked_tree


@dataclass(frozen=True)
class SuffixConfig:
    """Arctic Inference / vLLM defaults."""

    max_depth: int = 24
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    max_cached_requests: int = 10000


@dataclass
class _Node:
    count: int = 0
    children: dict[int, "_Node"] = field(default_factory=dict)


class SuffixTrie:
    """Depth-limited suffix trie over one or more token sequences (counts are occurrences)."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = _Node()

    def add(self, tokens: Sequence[int], sign: int = 1) -> None:
        """Count (sign=+1) or un-count (sign=-1) every substring of ``tokens`` up to max_depth."""
        for start in range(len(tokens)):
            node = self.root
            for tok in tokens[start : start + self.max_depth]:
                node = node.children.setdefault(tok, _Node())
                node.count += sign
        if sign < 0:
            self._prune(self.root)

    def _prune(self, node: _Node) -> None:
        for tok in [t for t, c in node.children.items() if c.count <= 0]:
            del node.children[tok]
        for child in node.children.values():
            self._prune(child)

    def find(self, pattern: Sequence[int]) -> _Node | None:
        node = self.root
        for tok in pattern:
            node = node.children.get(tok)
            if node is None:
                return None
        return node


class _IncrementalTrie(SuffixTrie):
    """A request's own trie, grown one token at a time (keeps the active suffix nodes)."""

    def __init__(self, max_depth: int):
        super().__init__(max_depth)
        self.tokens: list[int] = []
        self._active: list[_Node] = []  # nodes of the last (up to max_depth - 1) suffixes

    def append(self, tok: int) -> None:
        nodes = [self.root] + self._active
        new_active = []
        for node in nodes:
            child = node.children.setdefault(tok, _Node())
            child.count += 1
            new_active.append(child)
        self._active = new_active[: self.max_depth - 1]
        self.tokens.append(tok)


class GlobalSuffixCache:
    """The global tree: outputs of the last ``max_cached_requests`` requests (thread-safe).

    Whose requests: vLLM keeps one per engine (``v1/spec_decode/suffix_decoding.py``), i.e. per
    server, which suits a server whose users send similar requests. :class:`~specviz.SpecDecoder`
    keeps one too (``decoder.request_state("suffix")``), but the app gives every browser session its own:
    there the engine is shared by everyone who opens the page, so a shared tree would make the
    same prompt draft differently (mean acceptance length 1.28 on a fresh server, 4.27 later)
    depending on what strangers ran before, and a comparison could not start from a known state.

    Args:
        config: :class:`SuffixConfig`; frozen: drafts from its tree but ignores
            :meth:`add_request` (see :meth:`snapshot`).
    """

    def __init__(self, config: SuffixConfig = SuffixConfig(), frozen: bool = False):
        self.config = config
        self.trie = SuffixTrie(config.max_depth)
        self._requests: OrderedDict[int, list[int]] = OrderedDict()
        self._next_id = 0
        self.frozen = frozen
        self.lock = threading.Lock()

    def snapshot(self) -> "GlobalSuffixCache":
        """A frozen copy of the cache as it is now: repeated runs drafting from it (the app's
        speedup measurement) see the same earlier outputs and neither learn from each other
        nor change this cache."""
        with self.lock:
            copy = GlobalSuffixCache(self.config, frozen=True)
            copy.trie, copy._requests = deepcopy(self.trie), OrderedDict(self._requests)
            copy._next_id = self._next_id
        return copy

    def __deepcopy__(self, memo: dict) -> "GlobalSuffixCache":
        """A live (not frozen) copy with its own lock: gr.State deep-copies its initial value
        per browser session, which gives every session its own empty cache."""
        copy = self.snapshot()
        copy.frozen = self.frozen
        return copy

    def clear(self) -> None:
        """Forget every earlier output (the app's "reset" button: a known starting state)."""
        with self.lock:
            self.trie = SuffixTrie(self.config.max_depth)
            self._requests.clear()

    def add_request(self, output_ids: Sequence[int]) -> None:
        """Add one finished request's output to the tree (evicting the oldest beyond
        ``max_cached_requests``); a frozen cache ignores it."""
        if not output_ids or self.frozen:
            return
        with self.lock:
            self.trie.add(output_ids)
            self._requests[self._next_id] = list(output_ids)
            self._next_id += 1
            while len(self._requests) > self.config.max_cached_requests:
                _, old = self._requests.popitem(last=False)
                self.trie.add(old, sign=-1)

    def __len__(self) -> int:
        return len(self._requests)


def _grow(node: _Node, budget: int, min_prob: float) -> tuple[list[int], list[float], list[int]]:
    """Follow the most frequent child (ties: the child seen first) while prob >= min_prob."""
    tokens, probs, counts, prob = [], [], [], 1.0
    while len(tokens) < budget and node.children and node.count > 0:
        tok, child = max(node.children.items(), key=lambda kv: kv[1].count)
        prob *= child.count / node.count
        if prob < min_prob:
            break
        tokens.append(tok)
        probs.append(prob)
        counts.append(child.count)
        node = child
    return tokens, probs, counts


def _best_match(trie: SuffixTrie, context: Sequence[int], k: int, cfg: SuffixConfig, source: str) -> list[dict]:
    """Every candidate draft from ``trie``: one per match length m that exists."""
    cands = []
    for m in range(1, min(cfg.max_depth, len(context)) + 1):
        node = trie.find(context[-m:])
        if node is None:
            break
        budget = min(k, math.floor(m * cfg.max_spec_factor + cfg.max_spec_offset))
        tokens, probs, counts = _grow(node, budget, cfg.min_token_prob)
        cands.append({"source": source, "match_length": m, "node_count": node.count, "draft": tokens,
                      "probs": probs, "counts": counts, "score": float(sum(probs))})
    return cands


class SuffixProposer(NoFeedback):
    """Suffix decoding; deterministic, so ``Draft.probs`` is None (q one-hot).

    Args:
        num_speculative_tokens: k >= 1.
        global_cache: the :class:`GlobalSuffixCache` of earlier outputs (None: a private one); the
            engine passes its own (one per decoder, as vLLM's per engine) or the request's
            (the app: one per browser session, see :class:`GlobalSuffixCache` for why).
        config: :class:`SuffixConfig`.
        tree_branches: None (a chain) or the children kept per tree node (>= 1).
    The request's output is added to the global cache by :meth:`finish` (the engine calls it when
    a request ends).
    """

    name = "suffix"

    def __init__(self, num_speculative_tokens: int = 5, global_cache: GlobalSuffixCache | None = None,
                 config: SuffixConfig = SuffixConfig(), tree_branches: int | None = None):
        self.tree_branches = check_branches(tree_branches, "suffix_tree_branches")
        if num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.num_speculative_tokens = int(num_speculative_tokens)
        self.config = config
        self.global_cache = global_cache if global_cache is not None else GlobalSuffixCache(config)
        self.reset()

    def reset(self) -> None:
        self.local = _IncrementalTrie(self.config.max_depth)

    def _sync(self, token_ids: Sequence[int]) -> None:
        if token_ids[: len(self.local.tokens)] != self.local.tokens:  # a different request: start over
            self.local = _IncrementalTrie(self.config.max_depth)
        for tok in token_ids[len(self.local.tokens):]:
            self.local.append(int(tok))

    def propose(self, token_ids: Sequence[int], num_tokens: int | None = None,
                context: StepContext | None = None) -> Draft:
        k = self.num_speculative_tokens if num_tokens is None else min(num_tokens, self.num_speculative_tokens)
        ids = [int(t) for t in token_ids]
        self._sync(ids)
        # node counts include the final suffix's own occurrence, which has no continuation yet,
        # so a pattern seen once before continues with prob 1/2 (Arctic Inference counts alike)
        cands = _best_match(self.local, ids, k, self.config, "local")
        with self.global_cache.lock:
            cands += _best_match(self.global_cache.trie, ids, k, self.config, "global")
        best = max(cands, key=lambda c: (c["score"], c["match_length"]), default=None)
        details = {"kind": "suffix", "candidates": cands, "chosen": best,
                   "cached_requests": len(self.global_cache), "config": self.config.__dict__}
        if self.tree_branches is not None and best:
            return self._tree(ids, best, details, k)
        tokens = best["draft"] if best else []
        ids = pinned(torch.tensor(tokens, dtype=torch.long))  # pinned: the engine's copy does not wait
        return Draft(token_ids=ids, probs=None, details=details)

    def _tree(self, context: list[int], best: dict, details: dict[str, Any], k: int) -> Draft:
        """A tree below the winning match's node (depth <= its budget, path prob >= min_token_prob)."""
        m, cfg = best["match_length"], self.config
        budget = min(k, math.floor(m * cfg.max_spec_factor + cfg.max_spec_offset))

        def expand(node: _Node):
            kids = sorted(node.children.items(), key=lambda kv: -kv[1].count)  # stable: first seen on ties
            return [(tok, child.count / node.count, child) for tok, child in kids] if node.count > 0 else []

        trie = self.local if best["source"] == "local" else self.global_cache.trie
        lock = self.global_cache.lock if best["source"] == "global" else threading.Lock()
        with lock:
            tokens, parents, scores = ranked_tree(trie.find(context[-m:]), expand, self.tree_branches, budget,
                                                  min_score=cfg.min_token_prob)
        details["tree_branches"] = self.tree_branches
        ids = pinned(torch.tensor(tokens, dtype=torch.long))
        return Draft(token_ids=ids, probs=None, details=details, parents=parents, scores=scores, tree_rule="topk")

    def finish(self, output_ids: Sequence[int]) -> None:
        """Add a finished request's output to the global tree."""
        self.global_cache.add_request(output_ids)
