"""Engine-level losslessness of static trees at T > 0 (rule A: top-k children, q one-hot).

As tests/test_lossless_engine.py does for chains: tiny random models over V = 16 tokens, the exact
distribution of generated tokens 1..3 under plain sampling from the processed target (enumerated),
against the tokens the engine emitted with ``speculative_token_tree`` over many seeds; chi-square
p-values, Bonferroni over settings x positions. This runs the whole tree path: the drafter's
level-by-level tree forwards, the target's tree forward, rule A, the KV commit of the accepted
path, and the next step from the compacted cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import small_vocab
from specviz import SpecDecoder
from stats_helpers import chi_square, threshold
from test_lossless_engine import PROMPT, V, exact_marginals

torch.set_num_threads(1)

TREE = "[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)]"
POSITIONS = 3  # the first step (depth 2 + 1 emitted) and the first token of the next
SEEDS = 150
SETTINGS = [(0.7, None, None), (1.0, 6, 0.9)]
NUM_TESTS = len(SETTINGS) * POSITIONS


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    root = tmp_path_factory.mktemp("small_vocab_tree")
    target = small_vocab.save(root / "target", V, seed=0, init=0.15)
    draft = small_vocab.save(root / "draft", V, seed=0, init=0.15, noise=0.2)
    return SpecDecoder.from_pretrained(target, draft, device="cpu", dtype="float32")


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "T{}-k{}-p{}".format(*s))
def test_tree_emitted_tokens_follow_the_processed_target(decoder, settings):
    T, top_k, top_p = settings
    want = exact_marginals(decoder.target_model, PROMPT, settings, POSITIONS)
    counts = np.zeros((POSITIONS, V), dtype=np.int64)
    deep = 0
    for seed in range(SEEDS):
        trace = decoder.generate(PROMPT, method="draft_model", speculative_token_tree=TREE, num_speculative_tokens=2,
                                 temperature=T, top_k=top_k, top_p=top_p, max_new_tokens=POSITIONS, seed=seed,
                                 detailed_trace=False)
        deep += trace.steps[0].num_accepted == 2
        for i, t in enumerate(trace.output_token_ids[:POSITIONS]):
            counts[i, t] += 1
    assert (counts.sum(1) == SEEDS).all()
    assert deep > SEEDS // 10  # the tree's second level is exercised
    for i in range(POSITIONS):
        stat, df, pval = chi_square(counts[i], want[i])
        assert pval > threshold(NUM_TESTS), (f"position {i + 1}: chi2 {stat:.1f} (df {df}), p-value {pval:.2e}; "
                                             f"counts {counts[i].tolist()} vs {np.round(want[i] * SEEDS, 1).tolist()}")
