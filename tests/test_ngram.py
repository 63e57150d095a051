"""N-gram proposer: docs/design/algorithms.md's golden cases, vLLM's defaults, and the trie-view details."""

from __future__ import annotations

import pytest

from specviz.methods.ngram.options import resolve_lookup_bounds
from specviz.methods.ngram.proposer import NgramProposer

GOLDEN = [
    ([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4], (3, 4, 2), [1, 2]),
    ([1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3], (3, 3, 2), [100, 1]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], (1, 1, 2), [6, 2]),
    ([1, 2, 3, 4, 5], (2, 3, 3), []),
]


@pytest.mark.parametrize("tokens,params,expected", GOLDEN)
def test_golden(tokens, params, expected):
    lo, hi, k = params
    draft = NgramProposer(lo, hi, k).propose(tokens)
    assert draft.token_ids.tolist() == expected
    assert draft.probs is None


def test_defaults_follow_vllm():
    assert resolve_lookup_bounds(None, None) == (5, 5)
    assert resolve_lookup_bounds(2, None) == (2, 2)
    assert resolve_lookup_bounds(None, 4) == (4, 4)
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        resolve_lookup_bounds(4, 2)
    with pytest.raises(ValueError, match=">= 1"):
        resolve_lookup_bounds(0, 3)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        NgramProposer(1, 2, 0)


def test_longest_n_wins_over_earlier_shorter_match():
    # last 3 = [7, 8, 9]: n=3 matches at 4 (-> 50); n=1 would match 9 at 2 (-> 40) earlier
    tokens = [1, 9, 40, 3, 7, 8, 9, 50, 60, 7, 8, 9]
    draft = NgramProposer(1, 3, 2).propose(tokens)
    assert draft.token_ids.tolist() == [50, 60]
    assert draft.details["n"] == 3 and draft.details["match_position"] == 4


def test_partial_draft_runs_into_suffix():
    # the only earlier occurrence of [5, 5] is at 0; its continuation is the suffix itself
    tokens = [5, 5, 5]
    draft = NgramProposer(2, 2, 4).propose(tokens)
    assert draft.token_ids.tolist() == [5]  # context ends: fewer than k tokens
    assert draft.details["occurrences"] == [0]


def test_final_suffix_is_not_a_match():
    assert NgramProposer(3, 3, 2).propose([1, 2, 3]).token_ids.tolist() == []
    assert NgramProposer(1, 1, 2).propose([4]).token_ids.tolist() == []


def test_num_tokens_caps_the_draft():
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert NgramProposer(2, 2, 5).propose(tokens).token_ids.tolist() == [3, 4, 5, 6, 1]
    assert NgramProposer(2, 2, 5).propose(tokens, num_tokens=2).token_ids.tolist() == [3, 4]


def test_match_details_for_trie_view():
    tokens = [1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 100, 1, 2, 3]
    draft = NgramProposer(2, 4, 2).propose(tokens)
    d = draft.details
    # n=4 ([100, 1, 2, 3]) matches once, at 3: the longest n wins
    assert d["n"] == 4 and d["suffix"] == [100, 1, 2, 3] and d["occurrences"] == [3]
    assert draft.token_ids.tolist() == [200, 1]
    d = NgramProposer(2, 3, 2).propose(tokens).details
    # n=3 ([1, 2, 3]) occurs at 0, 4 and 8 (the final suffix at 12 is excluded)
    assert d["n"] == 3 and d["occurrences"] == [0, 4, 8] and d["match_position"] == 0
    assert d["tried"] == [{"n": 3, "occurrences": 3}]
    # continuations: after 0 -> 100, after 4 -> 200, after 8 -> 100; most frequent first
    assert [(c["token_id"], c["count"]) for c in d["trie"]] == [(100, 2), (200, 1)]
    assert [(c["token_id"], c["count"]) for c in d["trie"][0]["children"]] == [(1, 2)]


def test_no_match_details():
    d = NgramProposer(2, 3, 2).propose([1, 2, 3, 4]).details
    assert d["n"] == 0 and d["occurrences"] == [] and d["match_position"] == -1
    assert [t["n"] for t in d["tried"]] == [3, 2]
