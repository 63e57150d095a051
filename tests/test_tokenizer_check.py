"""The draft's tokenizer must be the target's; vocabulary rows may differ by
padding beyond the tokenizer (q is cut or zero-padded to the target's V)."""

from __future__ import annotations

import pytest
import torch

import small_vocab
from specviz import SpecDecoder
from specviz.models import tokenizer_mismatch

V = 16


def _load(target, draft):
    return SpecDecoder.from_pretrained(target, draft, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    names = [f"t{i}" for i in range(V)]
    swapped = list(names)
    swapped[3], swapped[5] = names[5], names[3]
    out = {
        "target": small_vocab.save(root / "target", V, seed=0, init=0.15),
        "other_tok": small_vocab.save(root / "other_tok", V, seed=0, init=0.15, names=swapped),
        "bigger_tok": small_vocab.save(root / "bigger_tok", V + 2, seed=0, init=0.15),
    }
    # the target itself with 4 padding rows (ids 16..19, beyond the tokenizer) whose logits win
    # any argmax / most of any softmax unless they are cut
    out["padded_self"] = small_vocab.save(root / "padded_self", V, seed=0, init=0.15, pad_rows=4)
    # a target with padding rows and a draft without them (q padded with zeros)
    out["padded_target"] = small_vocab.save(root / "padded_target", V + 4, seed=0, init=0.15, tokenizer_vocab=V)
    return out


def test_same_size_different_tokens_is_refused(dirs):
    with pytest.raises(ValueError) as info:
        _load(dirs["target"], dirs["other_tok"])
    msg = str(info.value)
    assert "tokenizer differs" in msg and "2 of the 16 shared ids" in msg
    assert "id 3: 't3' vs 't5'" in msg and "id 5: 't5' vs 't3'" in msg


def test_different_tokenizer_size_is_refused(dirs):
    with pytest.raises(ValueError, match="has 16 tokens, the draft's 18"):
        _load(dirs["target"], dirs["bigger_tok"])


def test_special_tokens_are_compared():
    import tiny_models

    a, b = tiny_models.build_tokenizer(), tiny_models.build_tokenizer()
    assert tokenizer_mismatch(a, b) is None
    b.eos_token = "<|pad|>"
    assert "eos_token_id is 0 in the target's tokenizer, 1 in the draft's" in tokenizer_mismatch(a, b)


def test_padded_identical_draft_is_greedy_equal(dirs):
    """Draft = the target with 4 padding rows that would win every argmax: cut to V, the draft
    accepts every token and the output equals plain greedy decoding."""
    dec = _load(dirs["target"], dirs["padded_self"])
    prompt = [3, 7, 1]
    plain = dec.generate(prompt, method="none", max_new_tokens=20).output_token_ids
    trace = dec.generate(prompt, method="draft_model", num_speculative_tokens=4, max_new_tokens=20)
    assert trace.output_token_ids == plain
    assert trace.metrics["draft_acceptance_rate"] == 1.0
    sampled = dec.generate(prompt, method="draft_model", temperature=1.0, num_speculative_tokens=4, max_new_tokens=20)
    assert all(0 <= t < V for s in sampled.steps for t in s.draft_token_ids)
    assert sampled.metrics["draft_acceptance_rate"] > 0.9


def test_draft_without_padding_rows_gets_zero_padded_q(dirs):
    dec = _load(dirs["padded_target"], dirs["target"])
    assert dec.vocab_size == V + 4
    proposer = dec.make_proposer(__import__("specviz.config", fromlist=["GenerationConfig"]).GenerationConfig.from_settings(
        method="draft_model", num_speculative_tokens=2, temperature=1.0, verify="standard"))
    from specviz.proposer import StepContext

    d = proposer.propose([3, 7, 1], 2, StepContext(temperature=1.0, generator=torch.Generator().manual_seed(0)))
    assert tuple(d.probs.shape) == (2, V + 4) and bool((d.probs[:, V:] == 0).all())
    assert torch.allclose(d.probs.sum(-1), torch.ones(2))
