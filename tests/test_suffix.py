"""Suffix decoding proposer (docs/design/algorithms.md; Arctic Inference / vLLM suffix_decoding.py)."""

from __future__ import annotations

import pytest

from specviz.methods.suffix.proposer import GlobalSuffixCache, SuffixConfig, SuffixProposer, SuffixTrie, _IncrementalTrie


def test_incremental_trie_equals_batch_trie():
    seq = [1, 2, 3, 1, 2, 4, 1, 2, 3, 5, 5, 5, 1]
    inc, batch = _IncrementalTrie(4), SuffixTrie(4)
    for t in seq:
        inc.append(t)
    batch.add(seq)

    def dump(node, prefix=()):
        out = {prefix: node.count} if prefix else {}
        for tok, child in node.children.items():
            out.update(dump(child, prefix + (tok,)))
        return out

    assert dump(inc.root) == dump(batch.root)
    assert batch.find([1, 2]).count == 3 and batch.find([1, 2, 3]).count == 2
    assert batch.find([5, 5, 5, 1, 9]) is None


def test_draft_follows_most_frequent_continuation():
    # after [1, 2]: 3 twice, 4 once (+ the final suffix itself, which has no continuation)
    ctx = [1, 2, 3, 9, 1, 2, 4, 8, 1, 2, 3, 9, 7, 1, 2]
    d = SuffixProposer(4).propose(ctx)
    chosen = d.details["chosen"]
    assert d.token_ids.tolist()[:1] == [3]
    assert d.probs is None
    # m = 2: node [1, 2] seen 4 times, child 3 seen twice -> prob 2/4 = 0.5; then [.., 3] -> 9 (2/2)
    m2 = next(c for c in d.details["candidates"] if c["source"] == "local" and c["match_length"] == 2)
    assert m2["draft"] == [3, 9] and m2["probs"] == pytest.approx([0.5, 0.5])
    assert chosen["score"] == max(c["score"] for c in d.details["candidates"])


def test_budget_and_min_prob():
    ctx = [5, 6, 7, 8, 9, 5, 6]
    cfg = SuffixConfig(max_spec_factor=1.0, min_token_prob=0.1)
    cands = SuffixProposer(8, config=cfg).propose(ctx).details["candidates"]
    by_m = {c["match_length"]: c for c in cands if c["source"] == "local"}
    assert len(by_m[1]["draft"]) <= 1 and len(by_m[2]["draft"]) <= 2  # budget floor(m * factor)
    high = SuffixProposer(8, config=SuffixConfig(min_token_prob=0.9)).propose(ctx)
    assert high.token_ids.tolist() == []  # 1/2 < 0.9: nothing is confident enough


def test_global_cache_drafts_from_earlier_outputs_and_evicts():
    cache = GlobalSuffixCache(SuffixConfig(max_cached_requests=2))
    prop = SuffixProposer(3, global_cache=cache)
    prop.finish([40, 41, 42, 43])
    d = SuffixProposer(3, global_cache=cache).propose([7, 40, 41])
    assert d.token_ids.tolist() == [42, 43]
    assert d.details["chosen"]["source"] == "global"
    prop.finish([1, 1])
    prop.finish([2, 2])  # evicts the first request
    assert len(cache) == 2
    assert SuffixProposer(3, global_cache=cache).propose([7, 40, 41]).token_ids.tolist() == []


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "no-reset"])
def test_a_new_request_drafts_from_its_own_tokens_only(reset):
    """The local tree holds the current request's tokens: after [1, 2, 3, 1, 2], a request [5, 1, 2] (not an
    extension of it, with or without reset()) finds no earlier "1, 2" to continue; a stale tree would draft 3."""
    prop = SuffixProposer(3)
    assert prop.propose([1, 2, 3, 1, 2]).token_ids.tolist()[:1] == [3]  # the tree is used within a request
    if reset:
        prop.reset()
    assert prop.propose([5, 1, 2]).token_ids.tolist() == []


def test_tree_figure_counts_tokens_after_the_match_from_one():
    """The x axis is titled "tokens after the match": a candidate's first drafted token sits at x = 1 and its match
    node left of it at 0 (the match at 1 and the first token at 2 read as one token too many)."""
    from specviz.methods.suffix.view import suffix_tree_figure
    from specviz.trace import Emitted, Step, Trace, compute_metrics

    long = {"source": "local", "match_length": 3, "draft": [10, 11, 12], "probs": [0.9, 0.8, 0.5], "score": 2.2}
    short = {"source": "global", "match_length": 1, "draft": [13], "probs": [0.4], "score": 0.4}
    st = Step(0, "suffix", [10, 11, 12], 3, Emitted(4, 14, "bonus", 0.7, [[14, 0.7]]), [], [10, 11, 12, 14],
              match={"kind": "suffix", "candidates": [long, short], "chosen": long})
    tr = Trace(config={"method": "suffix", "num_speculative_tokens": 3, "verify": "greedy"}, prompt_token_ids=[1],
               prompt_text="t1", steps=[st], output_token_ids=[10, 11, 12, 14],
               token_texts={str(t): f"t{t}" for t in range(1, 15)}, metrics=compute_metrics([st], 3))
    fig = suffix_tree_figure(tr, st)
    nodes = fig.data[-1]
    at = {text.split()[0]: x for x, text in zip(nodes.x, nodes.text)}
    assert at["m=3"] == 0 and at["m=1"] == 0 and at["context"] < 0
    assert [x for x, text in zip(nodes.x, nodes.text) if text.startswith(("t10", "t11", "t12"))] == [1, 2, 3]
    assert at["t13"] == 1  # every candidate's first token at 1, whatever its match length
    assert fig.layout.xaxis.title.text == "tokens after the match" and list(fig.layout.xaxis.tickvals) == [1, 2, 3]
    lo, hi = fig.layout.xaxis.range
    assert lo < at["context"] and hi > 3
    assert "px" not in fig.layout.title.text  # its explanation lines in em: they grow with the presentation layout
