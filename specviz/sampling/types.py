"""Data passed into and out of the rejection sampler (the contract shared by the PyTorch
reference in :mod:`specviz.sampling.reference` and the Triton kernels in ``specviz/kernels/``).

Shapes use B = batch (rows), K = max draft length, V = vocabulary size. A row's actual draft
length k' is the index of its first ``-1`` in ``draft_token_ids`` (K if none).

Token kinds (vLLM ``v1/sample/rejection_sampler.py`` vocabulary):

* accepted  - a draft token x_i that verification kept;
* recovered - drawn from the residual distribution at the first rejected position;
* bonus     - drawn from p_{k'+1} when all k' drafts were accepted (with k' = 0 this is simply
  a sample from the target, i.e. a plain decoding step).

Every row emits ``num_accepted + 1`` tokens; the rest of ``output_token_ids`` is ``-1``.

Randomness never comes from inside the math: it is drawn up front into :class:`SamplerNoise`
(by :func:`draw_noise`, from a seeded ``torch.Generator``) so that a step can be replayed and
the Triton and reference paths compared exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Values of RejectionOutput.token_kind
KIND_PAD = 0
KIND_ACCEPTED = 1
KIND_RECOVERED = 2
KIND_BONUS = 3
KIND_NAMES = {KIND_PAD: "pad", KIND_ACCEPTED: "accepted", KIND_RECOVERED: "recovered", KIND_BONUS: "bonus"}

METHODS = ("greedy", "standard", "block", "synthetic")


@dataclass(frozen=True)
class SamplerNoise:
    """Pre-drawn noise for one call of the sampler.

    u:   float64 [B, K]. Uniform(0, 1). Standard / synthetic: the acceptance test of position i
         (accept iff u_i <= p/q). Block: eta_i of Sun et al. (accept the block up to the last i with
         eta_i <= h_i). Drawn in float64 as vLLM does.
    exp: float32 [B, V]. Exp(1) noise for the one token each row emits (recovered or bonus):
         token = argmax_x w(x) / exp(x) over non-negative weights w (the exponential race; samples
         proportionally to w, so residuals need not be normalised). Ties: lowest index.
    """

    u: torch.Tensor  # [B, K] float64
    exp: torch.Tensor  # [B, V] float32


def draw_noise(
    batch_size: int,
    num_positions: int,
    vocab_size: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> SamplerNoise:
    """Draw :class:`SamplerNoise` for ``batch_size`` rows, ``num_positions`` (= K) draft
    positions and a vocabulary of ``vocab_size`` from ``generator`` (on ``device``)."""
    u = torch.rand(batch_size, num_positions, dtype=torch.float64, generator=generator, device=device)
    exp = torch.empty(batch_size, vocab_size, dtype=torch.float32, device=device)
    exp.exponential_(generator=generator)
    return SamplerNoise(u=u, exp=exp)


@dataclass
class BlockDetails:
    """What block verification (Sun et al. 2024) computed, per row.

    P:   float32 [B, K]  P_i = min(1, P_{i-1} p_i(x_i) / q_i(x_i)), P_0 = 1 (0 past k').
    rho: float32 [B, K]  rho_i = sum_x max(P_i p_{i+1}(x) - q_{i+1}(x), 0) for i < k' (0 elsewhere).
    h:   float32 [B, K]  h_i = rho_i / (rho_i + 1 - P_i) (1 if the denominator is 0) for i < k';
                         h_k' = P_k'. 0 past k'.
    eta: float64 [B, K]  the uniforms compared with h (same tensor as noise.u).
    tau: int64   [B]     the last i (1-based) with eta_i <= h_i, 0 if none = num_accepted.
    """

    P: torch.Tensor
    rho: torch.Tensor
    h: torch.Tensor
    eta: torch.Tensor
    tau: torch.Tensor


@dataclass
class RejectionOutput:
    """Result of :func:`specviz.sampling.rejection_sample`. All tensors on the input's device.

    output_token_ids: int64   [B, K+1] accepted drafts, then the recovered/bonus token, then -1.
    num_accepted:     int64   [B]      accepted draft tokens per row (0..k').
    num_draft:        int64   [B]      k' per row (drafts before the first -1).
    token_kind:       int8    [B, K+1] KIND_* of each output slot.
    u:                float64 [B, K]   uniforms used (standard/synthetic: u_i; block: eta_i; greedy: 0).
    p_draft:          float32 [B, K]   p_i(x_i), 0 for padding or invalid ids.
    q_draft:          float32 [B, K]   q_i(x_i) (1 for one-hot q), 0 for padding or invalid ids.
    accept_prob:      float32 [B, K]   min(1, p_i(x_i) / q_i(x_i)) (0 when q_i(x_i) = 0 or invalid);
                                       synthetic: the conditional rate a_i / a_{i-1}; greedy: 1 or 0.
    accepted:         bool    [B, K]   position i accepted (False past k' and after the first rejection;
                                       block: i <= tau).
    residual_mass:    float32 [B, K]   Z_i = sum_x max(p_i(x) - q_i(x), 0) (one-hot q: 1 - p_i(x_i)).
    method, backend:  which verification rule ran, and "reference" or "triton".
    block:            BlockDetails for method "block", else None.
    emit_weights:     float32 [B, V] the weights the emitted token was drawn from (after the sum-0
                      fallback to p; greedy: p at the slot), or None (the Triton kernels: get them with
                      ``specviz.sampling.reference.emitted_weights``, the same definition).
    emit_fallback:    bool [B] those weights summed to 0 and p was used, or None with emit_weights.
    """

    output_token_ids: torch.Tensor
    num_accepted: torch.Tensor
    num_draft: torch.Tensor
    token_kind: torch.Tensor
    u: torch.Tensor
    p_draft: torch.Tensor
    q_draft: torch.Tensor
    accept_prob: torch.Tensor
    accepted: torch.Tensor
    residual_mass: torch.Tensor
    method: str
    backend: str
    block: BlockDetails | None = None
    emit_weights: torch.Tensor | None = None
    emit_fallback: torch.Tensor | None = None
