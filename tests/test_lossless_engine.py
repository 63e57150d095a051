"""Engine-level losslessness of every proposer that samples.

Tiny random models over V = 16 tokens: the exact distribution of the first generated tokens
under plain sampling from the target (temperature, top-k, top-p applied) is enumerated from the
target (V and V^2 contexts), then compared by chi-square with the tokens the engine emitted at
positions 1..3 over many seeds. A second test checks, per proposer, that the q it reports is
the distribution its draft tokens were drawn from. Add a proposer by one ``PROPOSERS`` entry:
a function (target dir, draft dir) -> (SpecDecoder, method name).

Planted bug these tests catch (checked by hand): drafting from
softmax(logits / T) while reporting q = softmax(logits / 2T)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import small_vocab
from specviz import SpecDecoder
from specviz.proposer import StepContext
from specviz.sampling import logits_to_probs
from stats_helpers import chi_square, threshold

torch.set_num_threads(1)  # tiny models: threads only contend on a shared CPU

V = 16
PROMPT = [3, 7, 1]
POSITIONS = 3  # first generated positions tested (k = 2: the whole first step)
K = 2
SEEDS = 150  # requests per case
# (temperature, top_k, top_p)
SETTINGS = [(0.7, None, None), (1.0, None, None), (0.7, 6, 0.9), (1.0, None, 0.6)]
VERIFY = ("standard", "block")
NUM_TESTS = len(SETTINGS) * len(VERIFY) * POSITIONS  # the Bonferroni family (one parametrized test)


def _draft_model(target, draft):
    return SpecDecoder.from_pretrained(target, draft, device="cpu", dtype="float32"), "draft_model"


def _padded_draft_model(target, draft):
    """The same draft with 4 padding vocabulary rows beyond the tokenizer (cut to the target's V)."""
    padded = draft.parent / "draft_padded"
    if not padded.exists():
        small_vocab.save(padded, V, seed=0, init=0.15, noise=0.2, pad_rows=4)
    return _draft_model(target, padded)


# EAGLE / Medusa / MTP: one entry each
PROPOSERS = {"draft_model": _draft_model, "draft_model_padded": _padded_draft_model}


@pytest.fixture(scope="module")
def small_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("small_vocab")
    # target p max ~0.5 at T = 0.7; the draft (the target, perturbed) accepts ~0.8 of its tokens
    return (small_vocab.save(root / "target", V, seed=0, init=0.15),
            small_vocab.save(root / "draft", V, seed=0, init=0.15, noise=0.2))


@pytest.fixture(scope="module", params=sorted(PROPOSERS))
def decoder(request, small_dirs):
    dec, method = PROPOSERS[request.param](*small_dirs)
    return dec, method


@torch.inference_mode()
def exact_marginals(model, prompt, settings, n: int) -> np.ndarray:
    """[n, V] marginal distribution of generated tokens 1..n under plain sampling from ``model``
    with the request's processing, by enumerating all V^(n-1) continuations."""
    out, joint = [], torch.ones(1, dtype=torch.float64)  # joint over the enumerated prefixes
    prefixes = torch.tensor([prompt])  # [R, L]
    for _ in range(n):
        logits = model(input_ids=prefixes).logits[:, -1].float()  # [R, V]
        p = logits_to_probs(logits, *settings).double()  # [R, V]
        out.append((joint[:, None] * p).sum(0).numpy())
        joint = (joint[:, None] * p).reshape(-1)  # [R * V]
        prefixes = torch.cat([prefixes.repeat_interleave(V, 0), torch.arange(V).repeat(prefixes.shape[0])[:, None]], 1)
    return np.stack(out)


def emitted_counts(dec, method, verify, settings, seeds) -> np.ndarray:
    T, top_k, top_p = settings
    counts = np.zeros((POSITIONS, V), dtype=np.int64)
    for seed in seeds:
        trace = dec.generate(PROMPT, method=method, verify=verify, temperature=T, top_k=top_k, top_p=top_p,
                             num_speculative_tokens=K, max_new_tokens=POSITIONS, seed=seed, detailed_trace=False)
        for i, t in enumerate(trace.output_token_ids[:POSITIONS]):
            counts[i, t] += 1
    return counts


@pytest.mark.parametrize("verify", VERIFY)
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "T{}-k{}-p{}".format(*s))
def test_emitted_tokens_follow_the_processed_target(decoder, verify, settings):
    dec, method = decoder
    want = exact_marginals(dec.target_model, PROMPT, settings, POSITIONS)
    counts = emitted_counts(dec, method, verify, settings, range(SEEDS))
    assert (counts.sum(1) == SEEDS).all()
    for i in range(POSITIONS):
        stat, df, pval = chi_square(counts[i], want[i])
        assert pval > threshold(NUM_TESTS), (f"position {i + 1}: chi2 {stat:.1f} (df {df}), p-value {pval:.2e}; "
                                             f"counts {counts[i].tolist()} vs expected {np.round(want[i] * SEEDS, 1).tolist()}")


Q_SEEDS = 600
Q_SETTINGS = [(1.0, None, None), (0.7, 6, 0.9)]


def drafted(dec, method, settings, seeds):
    """Draft tokens [S, K] and reported q [S, K, V] of the proposer on PROMPT for each seed."""
    from specviz.config import GenerationConfig

    T, top_k, top_p = settings
    proposer = dec.make_proposer(GenerationConfig.from_settings(method=method, num_speculative_tokens=K, temperature=T,
                                                                top_k=top_k, top_p=top_p, verify="standard"))
    xs, qs = [], []
    for seed in seeds:
        proposer.reset()
        ctx = StepContext(temperature=T, top_k=top_k, top_p=top_p, generator=torch.Generator().manual_seed(seed))
        d = proposer.propose(PROMPT, K, ctx)
        assert d.probs is not None and tuple(d.probs.shape) == (K, V)
        xs.append(d.token_ids.tolist())
        qs.append(d.probs.double())
    return torch.tensor(xs), torch.stack(qs)


@pytest.mark.parametrize("settings", Q_SETTINGS, ids=lambda s: "T{}-k{}-p{}".format(*s))
def test_reported_q_is_what_the_draft_was_drawn_from(decoder, settings):
    """Given what the proposer reported, x_i ~ q_i: the expected count of token v at position i
    is sum over seeds of q_i(v) (exact conditionally on the earlier drafts)."""
    dec, method = decoder
    x, q = drafted(dec, method, settings, range(Q_SEEDS))
    assert torch.allclose(q.sum(-1), torch.ones(Q_SEEDS, K, dtype=torch.float64), atol=1e-5)
    assert bool((q.gather(2, x[..., None]) > 0).all()), "a draft token outside its reported q's support"
    for i in range(K):
        counts = np.bincount(x[:, i].numpy(), minlength=V)
        stat, df, pval = chi_square(counts, q[:, i].sum(0).numpy())
        assert pval > threshold(len(Q_SETTINGS) * K), f"position {i + 1}: chi2 {stat:.1f} (df {df}), p {pval:.2e}"


def test_draft_model_q_is_the_requests_processed_distribution(small_dirs):
    """draft_model: q_1 = logits_to_probs(draft logits, T, top_k, top_p), the request's full
    processing (not softmax(logits / T) alone)."""
    dec, method = _draft_model(*small_dirs)
    settings = (0.7, 6, 0.9)
    _, q = drafted(dec, method, settings, range(3))
    with torch.inference_mode():
        logits = dec.draft_model(input_ids=torch.tensor([PROMPT])).logits[0, -1]
    want = logits_to_probs(logits, *settings).double()
    for s in range(3):
        torch.testing.assert_close(q[s, 0], want, rtol=1e-4, atol=1e-6)
    assert int((want > 0).sum()) <= 6


def test_identical_draft_accepts_everything_with_top_p(self_decoders):
    """An identical draft under top-p = 0.6 is accepted (almost) always: q gets the request's
    processing, so q = p (up to float rounding between the draft's and the target's forwards).
    Drafting from softmax(logits / T) alone accepted 0.22-0.39 of the tokens."""
    dec = self_decoders["llama"]
    rates = []
    for seed in range(3):
        trace = dec.generate("def add(a, b):\n    return a", method="draft_model", temperature=1.0, top_p=0.6,
                             verify="standard", num_speculative_tokens=4, max_new_tokens=32, seed=seed)
        rates.append(trace.metrics["draft_acceptance_rate"])
    assert min(rates) >= 0.97, rates
