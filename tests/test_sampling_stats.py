"""Statistical tests of losslessness: every emitted position is distributed as the target p.

vLLM's check (tests/v1/spec_decode/test_rejection_sampler_utils.py, docs/design/algorithms.md "Correctness
tests"): fixed p_i and q_i per position, many trials, a chi-square test of the tokens emitted at
each output position (among the rows that emitted it) against p_i, bins with expected count < 5
merged. A position passes when its chi-square p-value (scipy.stats) exceeds ALPHA / m, m = the
positions x cases of the test (Bonferroni; tests/stats_helpers.py), so a correct sampler fails a
test with probability <= ALPHA = 1e-3. (The old bound chi2 < df + 10 sqrt(2 df) let recovered
tokens from max(p - 0.9 q, 0) and over-acceptance u <= r^0.9 pass; both negative controls below
must fail at the threshold and sample size used.)

V = 2048 here (not 4096) to keep the whole grid at about half a minute on 2 CPU cores; trials per
configuration = 10 * V = 20480 rows, run in chunks of 2048 rows to bound memory.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from specviz.sampling import KIND_RECOVERED, SamplerNoise, draw_noise, logits_to_probs, rejection_sample
from stats_helpers import chi_square as chi_square_pvalue
from stats_helpers import threshold

V = 2048
TRIALS = 10 * V
CHUNK = 2048
MIN_ROWS = 1000
HEAD_MASS = 0.8  # the last position must be reached often enough for the test to mean something


def make_case(K: int, temperature: float, seed: int):
    """Fixed per-position target p [K+1, V], draft q [K, V] and the distribution d [K, V] the draft
    ids of one-hot (deterministic) drafts are chosen from.

    Target logits: a random tail (N(0, 4)) plus one head token whose logit is set so that after the
    temperature the head holds HEAD_MASS of p; acceptance then stays high enough at every position
    for K = 5. Draft logits = target logits + N(0, 0.5); temperature applied to both sides.
    """
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(K + 1, V, generator=g) * 2.0  # [K+1, V]
    head = torch.randint(0, V, (K + 1,), generator=g)  # [K+1]
    rows = torch.arange(K + 1)
    logits[rows, head] = -math.inf
    tail_mass = torch.logsumexp(logits / temperature, dim=1)  # [K+1] log sum_tail exp(z / T)
    logits[rows, head] = temperature * (tail_mass + math.log(HEAD_MASS / (1 - HEAD_MASS)))
    draft_logits = logits[:K] + torch.randn(K, V, generator=g) * 0.7
    p = logits_to_probs(logits, temperature)
    q = logits_to_probs(draft_logits, temperature)
    d = torch.full((K, V), 0.1 / V)
    d[rows[:K], head[:K]] += 0.9
    return p, q, d


def run_chunks(p, q, d, method, full_q: bool, seed: int, trials: int = TRIALS, chunk: int = CHUNK,
               u_power: float = 1.0):
    """Run the sampler on ``trials`` rows in chunks; yields RejectionOutputs. ``u_power`` != 1
    (negative controls only): the sampler gets u^(1/u_power), i.e. accepts iff u <= r^u_power."""
    K, V = q.shape
    g = torch.Generator().manual_seed(seed)
    for start in range(0, trials, chunk):
        n = min(chunk, trials - start)
        source = q if full_q else d
        ids = torch.multinomial(source, n, replacement=True, generator=g).T.contiguous()  # [n, K]
        draft_probs = q.expand(n, K, V) if full_q else None
        noise = draw_noise(n, K, V, generator=g)
        if u_power != 1.0:
            noise = SamplerNoise(u=noise.u ** (1.0 / u_power), exp=noise.exp)
        yield rejection_sample(p.expand(n, K + 1, V), draft_probs, ids, method=method, noise=noise)


def position_counts(outputs, K: int, V: int, tamper=None) -> np.ndarray:
    """[K+1, V] counts of the tokens emitted at each output position (rows with num_accepted >= i).
    ``tamper(out) -> output_token_ids`` replaces the tokens (negative controls only)."""
    counts = np.zeros((K + 1, V), dtype=np.int64)
    for out in outputs:
        tokens = out.output_token_ids if tamper is None else tamper(out)
        for i in range(K + 1):
            emitted = out.num_accepted >= i  # [n]
            counts[i] += torch.bincount(tokens[emitted, i], minlength=V).numpy()
    return counts


# Bonferroni families: every position of every case of one parametrized test
GRID_TESTS = sum(K + 1 for K in (1, 3, 5)) * 2 * 2 * 2  # K x temperature x q kind x method
SMALL_TESTS = (4 + 1) * 2 * 2  # SMALL_K + 1 positions x q kind x method


def failing_positions(counts: np.ndarray, p: torch.Tensor, num_tests: int) -> list[str]:
    """The positions whose chi-square p-value is <= ALPHA / num_tests, with their statistics."""
    failed, limit = [], threshold(num_tests)
    for i in range(counts.shape[0]):
        stat, df, pval = chi_square_pvalue(counts[i], p[i].double().numpy())
        if not pval > limit:
            failed.append(f"position {i}: chi2 {stat:.1f} (df {df}, n {counts[i].sum()}), p-value {pval:.2e} "
                          f"<= {limit:.1e}")
    return failed


def assert_matches_target(counts: np.ndarray, p: torch.Tensor, num_tests: int) -> None:
    for i in range(counts.shape[0]):
        assert counts[i].sum() >= MIN_ROWS, f"position {i} emitted by only {counts[i].sum()} rows"
    failed = failing_positions(counts, p, num_tests)
    assert not failed, "; ".join(failed)


@pytest.mark.parametrize("K", [1, 3, 5])
@pytest.mark.parametrize("temperature", [0.6, 1.0])
@pytest.mark.parametrize("full_q", [True, False], ids=["full_q", "one_hot_q"])
@pytest.mark.parametrize("method", ["standard", "block"])
def test_emitted_tokens_follow_target(method, full_q, temperature, K):
    seed = 1000 * K + int(temperature * 10) + (0 if full_q else 7)
    p, q, d = make_case(K, temperature, seed)
    counts = position_counts(run_chunks(p, q, d, method, full_q, seed + 1), K, V)
    assert_matches_target(counts, p, GRID_TESTS)


# A small vocabulary with p and q far apart: block verification's own residual
# max(P_tau p - q, 0) matters a lot here, and 200k trials over 6 tokens give the test great power.
SMALL_V, SMALL_K, SMALL_TRIALS = 6, 4, 200_000


def small_case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(SMALL_K + 1, SMALL_V, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(SMALL_K, SMALL_V, generator=g) * 1.5, -1)
    d = p[:SMALL_K] ** 3 / (p[:SMALL_K] ** 3).sum(-1, keepdim=True)  # one-hot drafts favour p's mode
    return p, q, d


@pytest.mark.parametrize("full_q", [True, False], ids=["full_q", "one_hot_q"])
@pytest.mark.parametrize("method", ["standard", "block"])
def test_emitted_tokens_follow_target_small_vocab(method, full_q):
    p, q, d = small_case()
    outputs = run_chunks(p, q, d, method, full_q, seed=3, trials=SMALL_TRIALS, chunk=50_000)
    assert_matches_target(position_counts(outputs, SMALL_K, SMALL_V), p, SMALL_TESTS)


def _redraw(out, weights_of_rows, where):
    """Replace the emitted token of the rows in ``where`` [n] by a draw from weights [m, V]."""
    tokens = out.output_token_ids.clone()
    rows = torch.arange(tokens.shape[0])[where]
    slot = out.num_accepted[where]
    draw = torch.multinomial(weights_of_rows, 1, generator=torch.Generator().manual_seed(5))[:, 0]
    tokens[rows, slot] = draw
    return tokens


@pytest.mark.parametrize("method", ["standard", "block"])
def test_negative_control_no_residual_correction_fails(method):
    """The chi-square test has teeth: the same accept decisions with recovered tokens drawn from p
    instead of the residual distribution must fail it (grid configuration, K = 3, T = 1)."""
    K, temperature, seed = 3, 1.0, 77
    p, q, d = make_case(K, temperature, seed)

    def tamper(out):
        rec = out.token_kind[torch.arange(out.num_accepted.shape[0]), out.num_accepted] == KIND_RECOVERED
        return _redraw(out, p[out.num_accepted[rec]], rec)

    counts = position_counts(run_chunks(p, q, d, method, True, seed), K, V, tamper=tamper)
    assert failing_positions(counts, p, GRID_TESTS), "a sampler without the residual correction passed"


def test_block_negative_control_standard_residual_fails():
    """Block verification needs its own residual max(P_tau p - q, 0) for tau > 0: emitting from the
    standard residual max(p - q, 0) there instead must fail the chi-square test."""
    p, q, d = small_case()

    def tamper(out):
        tau = out.num_accepted
        wrong = (out.token_kind[torch.arange(tau.shape[0]), tau] == KIND_RECOVERED) & (tau > 0)
        return _redraw(out, (p[tau[wrong]] - q[tau[wrong]]).clamp_min(0), wrong)

    outputs = run_chunks(p, q, d, "block", True, seed=3, trials=SMALL_TRIALS, chunk=50_000)
    assert failing_positions(position_counts(outputs, SMALL_K, SMALL_V, tamper=tamper), p, SMALL_TESTS)


@pytest.mark.parametrize("method", ["standard", "block"])
def test_negative_control_weakened_residual_fails(method):
    """Recovered tokens drawn from max(p - 0.9 q, 0) instead of max(p - q, 0) (block: from
    max(P_tau p - 0.9 q, 0)) must fail, at the small-vocabulary test's sample size and threshold."""
    p, q, d = small_case()

    def tamper(out):
        tau = out.num_accepted
        rec = out.token_kind[torch.arange(tau.shape[0]), tau] == KIND_RECOVERED
        scale = torch.ones(int(rec.sum()), 1)
        if method == "block":
            P0 = torch.cat([torch.ones(tau.shape[0], 1), out.block.P], 1)  # P_0..P_K
            scale = P0.gather(1, tau[:, None])[rec]
        return _redraw(out, (scale * p[tau[rec]] - 0.9 * q[tau[rec]]).clamp_min(0), rec)

    outputs = run_chunks(p, q, d, method, True, seed=3, trials=SMALL_TRIALS, chunk=50_000)
    counts = position_counts(outputs, SMALL_K, SMALL_V, tamper=tamper)
    assert failing_positions(counts, p, SMALL_TESTS), "recovered tokens from max(p - 0.9 q, 0) passed"


@pytest.mark.parametrize("method", ["standard", "block"])
def test_negative_control_over_acceptance_fails(method):
    """Accepting iff u <= r^0.9 (block: eta <= h^0.9), i.e. a little too often, must fail at the
    small-vocabulary test's sample size and threshold (full q)."""
    p, q, d = small_case()
    outputs = run_chunks(p, q, d, method, True, seed=3, trials=SMALL_TRIALS, chunk=50_000, u_power=0.9)
    counts = position_counts(outputs, SMALL_K, SMALL_V)
    assert failing_positions(counts, p, SMALL_TESTS), "over-acceptance u <= r^0.9 passed"
