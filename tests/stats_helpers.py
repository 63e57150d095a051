"""Chi-square goodness-of-fit with p-values (scipy.stats) for the losslessness tests.

A test family of m chi-square tests (positions x cases) passes at family-wise level ALPHA when
every p-value exceeds ALPHA / m (Bonferroni): a correct sampler then fails the whole family with
probability <= ALPHA; seeds are fixed, so every run is reproducible. Negative controls (planted
bugs) must fail at the same threshold and sample size."""

from __future__ import annotations

import numpy as np
import scipy.stats

ALPHA = 1e-3  # family-wise false-failure probability of one test


def chi_square(counts: np.ndarray, expected_probs: np.ndarray) -> tuple[float, int, float]:
    """(statistic, df, p-value) of observed ``counts`` [V] against ``expected_probs`` [V]
    (scaled to the counts' total). Bins with expected count < 5 are merged into one (itself merged
    into the smallest remaining bin if still < 5). A token observed where the expected
    probability is exactly 0 gives p-value 0 (an impossible token was emitted)."""
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(expected_probs, dtype=np.float64)
    n = counts.sum()
    if n == 0:
        return 0.0, 0, 1.0
    if (counts[probs <= 0] > 0).any():
        return float("inf"), 0, 0.0
    expected = n * probs / probs.sum()
    small = expected < 5
    obs, exp = list(counts[~small]), list(expected[~small])
    if small.any():
        o, e = counts[small].sum(), expected[small].sum()
        if e >= 5 or not exp:
            obs.append(o)
            exp.append(e)
        else:
            i = int(np.argmin(exp))
            obs[i] += o
            exp[i] += e
    if len(obs) < 2:
        return 0.0, 0, 1.0
    res = scipy.stats.chisquare(np.asarray(obs), np.asarray(exp))
    return float(res.statistic), len(obs) - 1, float(res.pvalue)


def threshold(num_tests: int, alpha: float = ALPHA) -> float:
    """Bonferroni: the per-test p-value threshold of a family of ``num_tests`` tests."""
    return alpha / max(num_tests, 1)


SMALL_VOCAB = 8


def save_small_word_target(root, seed: int = 4):
    """A 4-layer random Llama over V = 8 word tokens ``t0 .. t7`` (no EOS; flat enough that a few
    thousand samples reach every token), saved with its tokenizer to ``root/target`` (safetensors).
    For the per-position chi-square tests of the head methods. Returns the model (eval mode)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=SMALL_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, initializer_range=0.2,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    model.save_pretrained(root / "target", safe_serialization=True)
    names = [f"t{i}" for i in range(SMALL_VOCAB)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(names)}, unk_token=names[-1]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(root / "target")
    return model


def exact_marginals(dec, prompt: list[int], **sampling):
    """The target's distributions (float64 [SMALL_VOCAB] each) of the first and second generated tokens
    after ``prompt``, under ``sampling`` (temperature, top_k, top_p)."""
    import torch

    from specviz.sampling import logits_to_probs

    with torch.no_grad():
        p1 = logits_to_probs(dec.target_model(input_ids=torch.tensor([prompt])).logits[0, -1], **sampling).double()
        both = torch.tensor([prompt + [x] for x in range(SMALL_VOCAB)])  # [V, len + 1]
        p2_given = logits_to_probs(dec.target_model(input_ids=both).logits[:, -1], **sampling).double()  # [V, V]
    return p1, p1 @ p2_given


def chi2_pvalue(counts, p, trials: int) -> float:
    """Chi-square p-value of ``counts`` [V] (of ``trials`` runs) against ``p`` [V]: bins with an expected
    count < 5 merged into one (dropped if its probability is 0), ``p`` renormalised to the counts' total
    (it may be float32)."""
    import torch
    from scipy.stats import chisquare

    keep = p * trials >= 5
    observed = torch.cat([counts[keep], counts[~keep].sum()[None]])
    expected = torch.cat([p[keep], p[~keep].sum()[None]]) * trials
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    expected = expected * (observed.sum() / expected.sum())
    return float(chisquare(observed.numpy(), expected.numpy()).pvalue)


def first_two(dec, prompt: list[int], trials: int, method: str, **settings):
    """(counts [2, SMALL_VOCAB] float64, accepted): the first and second generated tokens of ``trials``
    runs of ``method`` seeded 0 .. trials-1 (3 new tokens each), and the first steps' accepted drafts summed."""
    import torch

    counts = torch.zeros(2, SMALL_VOCAB, dtype=torch.float64)
    accepted = 0
    for seed in range(trials):
        tr = dec.generate(prompt, method=method, max_new_tokens=3, seed=seed, detailed_trace=False, **settings)
        for i in range(2):
            counts[i, tr.output_token_ids[i]] += 1
        accepted += tr.steps[0].num_accepted
    return counts, accepted
