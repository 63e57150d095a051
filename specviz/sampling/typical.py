"""Medusa's typical acceptance: a LOSSY verification rule (not distribution-preserving).

Source: Cai et al. 2024 (Medusa, arXiv 2401.10774) section 2.3.1; FasterDecoding/Medusa
``medusa/model/utils.py::evaluate_posterior(sampling="typical", fast=True)``; vLLM V0's
``TypicalAcceptanceSampler`` (``--spec-decoding-acceptance-method typical_acceptance_sampler``).
docs/design/methods.md 5.3. The paper: "we do not insist on an exact correspondence between the output and
language model distribution". vLLM V1 dropped it; specviz ships it as ``verify="typical"``,
labelled "not distribution-preserving" wherever it is offered, like verify="synthetic".

Rule, for draft x_i at position i with the processed target distribution p_i (temperature, top-k,
top-p applied, as for every rule):

    accept x_i  iff  p_i(x_i) > min(epsilon, delta * exp(-H(p_i))),   H(p) = -sum_x p(x) log p(x)

drafts are accepted up to the first failure (Medusa's ``cumprod``). q is never read: the rule only
asks whether the target finds the draft plausible. The step's own token (at the first failure, or
the bonus after k' accepted drafts) is drawn from p at that position (the exponential race over the
step's noise; at temperature 0 p is one-hot, so typical acceptance equals greedy verification).
Why it is lossy: a draft with p_i(x_i) above the threshold is kept with probability 1 instead of
p_i(x_i), so tokens the draft proposes are over-represented (tests/test_medusa.py measures it).
Defaults as ``medusa_generate``: epsilon (``posterior_threshold``) 0.09, delta (``posterior_alpha``) 0.3.
"""

from __future__ import annotations

import math

import torch

from specviz.sampling.types import KIND_ACCEPTED, KIND_BONUS, KIND_RECOVERED, RejectionOutput, SamplerNoise

LOSSY_NOTE = "typical acceptance (Medusa): lossy, not distribution-preserving"
DEFAULT_EPSILON = 0.09  # Medusa posterior_threshold; vLLM V0 typical_acceptance_sampler_posterior_threshold
DEFAULT_DELTA = 0.3  # Medusa posterior_alpha; vLLM V0 typical_acceptance_sampler_posterior_alpha


def check_typical_params(epsilon: float, delta: float) -> None:
    """Raise ValueError unless 0 < epsilon <= 1 and 0 < delta (finite)."""
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and 0 < epsilon <= 1):
        raise ValueError(f"{LOSSY_NOTE}: posterior_threshold epsilon must be in (0, 1], got {epsilon!r}")
    if not (isinstance(delta, (int, float)) and math.isfinite(delta) and delta > 0):
        raise ValueError(f"{LOSSY_NOTE}: posterior_alpha delta must be > 0, got {delta!r}")


def typical_threshold(p: torch.Tensor, epsilon: float, delta: float) -> torch.Tensor:
    """min(epsilon, delta * exp(-H(p))) per row: p float [..., V] (rows sum to 1) -> float32 [...]."""
    pf = p.float()
    entropy = -(pf * torch.log(pf.clamp_min(1e-30))).sum(dim=-1)  # 0 log 0 = 0
    return torch.clamp(delta * torch.exp(-entropy), max=epsilon)


def typical_sample(target_probs: torch.Tensor, draft_token_ids: torch.Tensor, epsilon: float = DEFAULT_EPSILON,
                   delta: float = DEFAULT_DELTA, noise: SamplerNoise | None = None) -> RejectionOutput:
    """Typical acceptance of drafts x_1..x_k' per row (LOSSY; see the module docstring).

    target_probs float [B, K+1, V] p_1..p_{K+1}; draft_token_ids int [B, K] padded with -1 (ids outside
    [0, V) are never accepted); noise: its ``exp`` [B, V] draws the emitted token (None: argmax p).
    Returns a :class:`RejectionOutput` with method "typical": accept_prob holds the rule's 1/0 at
    every slot < k', u is 0 (no uniforms are compared), q_draft is 1, residual_mass is 1 - p_i(x_i).
    Raises ValueError for bad shapes or parameters."""
    check_typical_params(epsilon, delta)
    if target_probs.dim() != 3 or draft_token_ids.shape != (target_probs.shape[0], target_probs.shape[1] - 1):
        raise ValueError(f"typical_sample: target_probs must be [B, K+1, V] and draft_token_ids [B, K]; got "
                         f"{list(target_probs.shape)}, {list(draft_token_ids.shape)}")
    B, K1, V = target_probs.shape
    K, device = K1 - 1, target_probs.device
    ids = draft_token_ids.long()
    slot = torch.arange(K, device=device)[None, :]
    is_pad = ids == -1
    num_draft = torch.where(is_pad.any(dim=1), is_pad.int().argmax(dim=1), K).long() if K else ids.new_zeros(B)
    in_draft = slot < num_draft[:, None]  # [B, K]
    ok_id = in_draft & (ids >= 0) & (ids < V)
    p = target_probs[:, :K].float()  # [B, K, V]
    p_x = torch.where(ok_id, p.gather(2, ids.clamp(0, V - 1)[..., None])[..., 0], 0.0)  # [B, K]
    passed = ok_id & (p_x > typical_threshold(p, epsilon, delta))  # [B, K]
    num_accepted = passed.long().cumprod(dim=1).sum(dim=1) if K else ids.new_zeros(B)
    accepted = slot < num_accepted[:, None]
    rows = torch.arange(B, device=device)
    p_emit = target_probs[rows, num_accepted].float()  # [B, V]: p at the emitted slot
    if noise is None:
        token = p_emit.argmax(dim=1)
    else:
        token = (p_emit / noise.exp).masked_fill_(p_emit == 0, -1.0).argmax(dim=1)
    out_ids = torch.full((B, K + 1), -1, dtype=torch.long, device=device)
    out_ids[:, :K] = torch.where(accepted, ids, -1)
    out_ids[rows, num_accepted] = token
    is_bonus = num_accepted == num_draft
    kind = torch.zeros(B, K + 1, dtype=torch.int8, device=device)
    kind[:, :K] = accepted.to(torch.int8) * KIND_ACCEPTED
    kind[rows, num_accepted] = torch.where(is_bonus, KIND_BONUS, KIND_RECOVERED).to(torch.int8)
    emitted = {}  # the weights the emitted token was drawn from: p itself (never all zero), where the type has them
    if "emit_weights" in RejectionOutput.__dataclass_fields__:
        emitted = dict(emit_weights=p_emit, emit_fallback=torch.zeros(B, dtype=torch.bool, device=device))
    return RejectionOutput(
        output_token_ids=out_ids, num_accepted=num_accepted, num_draft=num_draft, token_kind=kind,
        u=torch.zeros(B, K, dtype=torch.float64, device=device), p_draft=p_x, q_draft=ok_id.float(),
        accept_prob=passed.float(), accepted=accepted, residual_mass=torch.where(in_draft, 1.0 - p_x, 0.0),
        method="typical", backend="reference", **emitted)
