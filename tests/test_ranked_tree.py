"""Multi-candidate n-gram and suffix trees: the tree holds the continuations
with their counts, parents before children, distinct siblings, depth <= k, node cap, and the
chain is unchanged without the setting."""

from __future__ import annotations

import math

import pytest

from specviz import tree
from specviz.methods.ngram.proposer import NgramProposer
from specviz.ranked_tree import ranked_tree
from specviz.methods.suffix.proposer import SuffixConfig, SuffixProposer


def _shape(draft, max_depth):
    parents, toks = draft.parents, draft.token_ids.tolist()
    assert tree.validate_parents(parents) == parents and len(parents) == len(toks) == len(draft.scores)
    assert max(tree.depths(parents)) <= max_depth
    for kids in tree.children(parents):
        assert len({toks[c] for c in kids}) == len(kids)
    assert draft.probs is None and draft.tree_rule == "topk"


def _paths(draft):
    toks = draft.token_ids.tolist()
    return {tuple(toks[j] for j in tree.path_to(draft.parents, i)): math.exp(s) for i, s in enumerate(draft.scores)}


def test_ngram_tree_holds_every_continuation():
    # the suffix (1, 2) occurred 3 times before: followed by 3 4, 3 5, 6 7
    ctx = [1, 2, 3, 4, 9, 1, 2, 3, 5, 9, 1, 2, 6, 7, 9, 1, 2]
    chain = NgramProposer(2, 2, 3).propose(ctx)
    assert chain.parents is None and chain.token_ids.tolist() == [3, 4, 9]  # vLLM's earliest occurrence
    draft = NgramProposer(2, 2, 3, tree_branches=2).propose(ctx)
    _shape(draft, 3)
    paths = _paths(draft)
    assert paths[(3,)] == pytest.approx(2 / 3) and paths[(6,)] == pytest.approx(1 / 3)
    assert paths[(3, 4)] == pytest.approx(1 / 3) and paths[(3, 5)] == pytest.approx(1 / 3)
    assert paths[(3, 4, 9)] == pytest.approx(1 / 3) and (6, 7, 9) in paths
    assert len(paths) == 8  # 3, 6, 3-4, 3-5, 6-7 and three depth-3 nodes
    assert draft.token_ids.tolist()[0] == 3  # best first
    one = NgramProposer(2, 2, 3, tree_branches=1).propose(ctx)
    assert one.parents == [-1, 0, 1] and one.token_ids.tolist() == [3, 4, 9]  # the most frequent path
    assert max(tree.depths(NgramProposer(2, 2, 2, tree_branches=3).propose(ctx).parents)) == 2


def test_ngram_tree_respects_node_cap():
    ctx = []
    for t in range(100, 180):  # 80 different continuations of the suffix (7, 8)
        ctx += [7, 8, t]
    ctx += [7, 8]
    draft = NgramProposer(2, 2, 3, tree_branches=80).propose(ctx)
    assert len(draft) == tree.MAX_TREE_NODES
    _shape(draft, 3)


def test_suffix_tree_branches():
    cfg = SuffixConfig(min_token_prob=0.1)
    ctx = [1, 2, 3, 4, 9, 1, 2, 3, 5, 9, 1, 2, 6, 7, 9, 1, 2]
    chain = SuffixProposer(4, config=cfg).propose(ctx)
    draft = SuffixProposer(4, config=cfg, tree_branches=2).propose(ctx)
    assert chain.parents is None
    _shape(draft, 4)
    paths = _paths(draft)
    first = chain.token_ids.tolist()
    assert tuple(first[:1]) in paths  # the chain's first token is a root child of the tree
    assert all(math.exp(s) >= cfg.min_token_prob for s in draft.scores)
    assert len(draft) > len(chain)


def test_ranked_tree_best_first_and_closed():
    # a complete binary "trie": child c of node x has conditional prob 0.7 / 0.3
    def expand(node):
        return [(10 * node + 1, 0.7, 10 * node + 1), (10 * node + 2, 0.3, 10 * node + 2)]

    toks, parents, scores = ranked_tree(0, expand, 2, max_depth=3, max_nodes=6)
    assert len(toks) == 6 and tree.validate_parents(parents) == parents
    assert scores == sorted(scores, reverse=True) and scores[0] == pytest.approx(math.log(0.7))
    assert toks[:3] == [1, 11, 111]  # 0.7, 0.49, 0.343 before 0.3
    assert ranked_tree(0, expand, 2, max_depth=0) == ([], [], [])


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_invalid_branches(bad):
    with pytest.raises(ValueError, match="ngram_tree_branches"):
        NgramProposer(2, 2, 3, tree_branches=bad)
    with pytest.raises(ValueError, match="suffix_tree_branches"):
        SuffixProposer(3, tree_branches=bad)
