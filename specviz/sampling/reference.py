"""The PyTorch reference rejection sampler: verify a batch of drafts against the target.

Sources. greedy and standard: Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", Alg. 1; Chen et al. 2023, "Accelerating LLM decoding with speculative
sampling"; batched layout and noise handling as vLLM ``v1/sample/rejection_sampler.py``.
block: Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025
(arXiv 2403.10444), as in vLLM PR 46781. synthetic: vLLM's ``rejection_sample_method="synthetic"``.
docs/design/algorithms.md fixes every rule used here.

Shapes: B rows, K draft slots, V vocabulary; k' = a row's draft length (index of its first -1).
Positions are 1-based in the comments (x_1..x_k', p_1..p_{k'+1}) and 0-based in the code.

Invalid input (the Triton kernel copies this rule): a draft id outside [0, V) that is not the -1
padding, or a full-q row holding a non-finite value, makes that position's q the zero vector:
never accepted (q_i(x_i) = 0), residual = p_i, block P_i = 0. Such positions still count in k'.

Emission: the single recovered/bonus token of a row is argmax_x score(x), score(x) = w(x) / E(x)
for w(x) > 0 and -1 where w(x) == 0 (a zero-weight token never wins, even if E(x) == 0), with
E = noise.exp (exponential race; ties -> lowest index as torch.argmax). If sum(w) == 0 exactly,
w = p at that position.

Per-slot fields (slots past k' are 0 / False in every one): p_draft = p_i(x_i) for an id in
[0, V) (kept when only the q row is non-finite); q_draft = q_i(x_i) after the zeroing above (1 for
one-hot q); accept_prob = min(1, p/q) (0 where q_i(x_i) == 0), the conditional rate for synthetic,
and for greedy 1.0 where x_i == argmax p_i (evaluated at every slot < k', also after the first
mismatch); residual_mass = sum_x max(p_i - q_i, 0) in float32, one-hot q: 1 - p_draft.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specviz.sampling.types import (KIND_ACCEPTED, KIND_BONUS, KIND_RECOVERED, METHODS, BlockDetails, RejectionOutput,
                                    SamplerNoise, draw_noise)
from specviz.sampling.rates import conditional_rates as _conditional_rates

BACKENDS = ("reference", "triton")
_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64)


def rejection_sample(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    *,
    method: str = "standard",
    generator: torch.Generator | None = None,
    synthetic_rates: Sequence[float] | torch.Tensor | None = None,
    noise: SamplerNoise | None = None,
    backend: str = "reference",
) -> RejectionOutput:
    """Verify drafts x_1..x_k' of every row against the target; emit accepted + 1 tokens per row.

    target_probs:    float32/bf16/fp16 [B, K+1, V] p_1..p_{K+1} (computed in float32).
    draft_probs:     float [B, K, V] q_i, or None: q one-hot at the draft ids (deterministic proposer).
    draft_token_ids: int [B, K] x_i, padded with -1 (a row's k' = index of its first -1).
    method:          "greedy" | "standard" | "block" | "synthetic" (docs/design/algorithms.md, Verification methods).
    generator:       seeds the noise when ``noise`` is None (greedy draws no noise).
    synthetic_rates: method "synthetic" only: unconditional rates a_1 >= a_2 >= ... in [0, 1], length >= K
                     (sequence or 1-D tensor); position i is accepted iff u_i < a_i / a_{i-1} (a_0 = 1).
    noise:           SamplerNoise (u float64 [B, K], exp float32 [B, V]); drawn with
                     ``draw_noise(B, K, V, generator=generator)`` when None.
    backend:         "reference" (this module) or "triton" (``specviz.kernels.rejection_sampler``, imported lazily).

    Returns a RejectionOutput (every field filled; see specviz.sampling.types). Inputs are never modified.
    Raises ValueError for an unknown method/backend, wrong shapes/dtypes/devices, or missing/invalid
    synthetic rates.
    """
    _check_choice("method", method, METHODS)
    _check_choice("backend", backend, BACKENDS)
    B, K, V = _check_inputs(target_probs, draft_probs, draft_token_ids)
    rates = _conditional_rates(synthetic_rates, K, target_probs.device) if method == "synthetic" else None
    if noise is None and method != "greedy":
        noise = draw_noise(B, K, V, generator=generator, device=target_probs.device)
    if noise is not None:
        _check_noise(noise, B, K, V, target_probs.device)
    if backend == "triton":
        from specviz.kernels.rejection_sampler import rejection_sample_triton

        return rejection_sample_triton(
            target_probs, draft_probs, draft_token_ids, method=method, noise=noise, synthetic_rates=synthetic_rates
        )
    return _reference(target_probs, draft_probs, draft_token_ids, method, noise, rates)


# ----------------------------------------------------------------------------------- validation


def _check_choice(what: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; valid choices: {', '.join(choices)}")


def _check_inputs(target_probs, draft_probs, draft_token_ids) -> tuple[int, int, int]:
    """Validate shapes/dtypes/devices; return (B, K, V)."""
    if not isinstance(target_probs, torch.Tensor) or target_probs.dim() != 3 or not target_probs.is_floating_point():
        raise ValueError(f"target_probs must be a float tensor of shape [B, K+1, V], got {_describe(target_probs)}")
    B, K1, V = target_probs.shape
    K = K1 - 1
    if K < 0 or V < 1:
        raise ValueError(f"target_probs must have shape [B, K+1, V] with K+1 >= 1 and V >= 1, got {list(target_probs.shape)}")
    if not isinstance(draft_token_ids, torch.Tensor) or draft_token_ids.dtype not in _INT_DTYPES:
        raise ValueError(f"draft_token_ids must be an integer tensor of shape [B, K] = [{B}, {K}], got {_describe(draft_token_ids)}")
    if tuple(draft_token_ids.shape) != (B, K):
        raise ValueError(
            f"draft_token_ids must have shape [B, K] = [{B}, {K}] (target_probs is [B, K+1, V] = "
            f"{list(target_probs.shape)}), got {list(draft_token_ids.shape)}"
        )
    if draft_probs is not None:
        if not isinstance(draft_probs, torch.Tensor) or not draft_probs.is_floating_point():
            raise ValueError(f"draft_probs must be None or a float tensor [B, K, V] = [{B}, {K}, {V}], got {_describe(draft_probs)}")
        if tuple(draft_probs.shape) != (B, K, V):
            raise ValueError(f"draft_probs must have shape [B, K, V] = [{B}, {K}, {V}], got {list(draft_probs.shape)}")
    for name, t in (("draft_token_ids", draft_token_ids), ("draft_probs", draft_probs)):
        if t is not None and t.device != target_probs.device:
            raise ValueError(f"{name} is on {t.device}, expected target_probs' device {target_probs.device}")
    return B, K, V


def _check_noise(noise: SamplerNoise, B: int, K: int, V: int, device: torch.device) -> None:
    for name, t, shape, dtype in (("u", noise.u, (B, K), torch.float64), ("exp", noise.exp, (B, V), torch.float32)):
        if tuple(t.shape) != shape or t.dtype != dtype or t.device != device:
            raise ValueError(
                f"noise.{name} must be {dtype} of shape {list(shape)} on {device}, "
                f"got {t.dtype} {list(t.shape)} on {t.device}"
            )


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"{x.dtype} tensor of shape {list(x.shape)}"
    return type(x).__name__


# ------------------------------------------------------------------------------------ the math


def _gather(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x [B, V], idx int64 [B] -> x[b, idx[b]] [B]."""
    return x.gather(1, idx[:, None]).squeeze(1)


def _all_finite(q: torch.Tensor) -> torch.Tensor:
    """q float32 [B, V] -> bool [B]: the row holds no NaN/inf (aminmax propagates NaN)."""
    low, high = torch.aminmax(q, dim=1)
    return (high < float("inf")) & (low > -float("inf"))


def _position(p_i, q_i, x_i, in_i, V):
    """Per-position quantities of one draft slot.

    p_i float32 [B, V]; q_i float32 [B, V] or None (one-hot); x_i int64 [B]; in_i bool [B] (slot < k').
    Returns valid [B] (the slot is a real, usable draft), p_x [B], q_x [B] (0 where not valid),
    q_eff [B, V] (q with the rows of invalid in-draft slots zeroed) or None, z [B] residual mass
    (0 past k').
    """
    id_ok = in_i & (x_i >= 0) & (x_i < V)
    x_safe = torch.where(id_ok, x_i, torch.zeros_like(x_i))
    p_x = torch.where(id_ok, _gather(p_i, x_safe), 0.0)
    if q_i is None:
        z = torch.where(in_i, 1.0 - p_x, 0.0)  # one-hot closed form; invalid id: 1 - 0
        return id_ok, p_x, id_ok.float(), None, z
    valid = id_ok & _all_finite(q_i)
    bad = in_i & ~valid
    q_eff = torch.where(bad[:, None], 0.0, q_i) if bool(bad.any()) else q_i  # [B, V], never written
    q_x = torch.where(valid, _gather(q_eff, x_safe), 0.0)
    z = torch.where(in_i, (p_i - q_eff).clamp_min_(0.0).sum(dim=1), 0.0)
    return valid, p_x, q_x, q_eff, z


def _block_rho(P_prev, p_t, q_eff_t, p_x_t):
    """rho_{t-1} = sum_x max(P_{t-1} p_t(x) - q_t(x), 0), float32 [B].
    Full q: (P * p) - q, clamp at 0, summed over V. One-hot: P_{t-1} * (1 - p_t(x_t))."""
    if q_eff_t is None:
        return P_prev * (1.0 - p_x_t)
    return (P_prev[:, None] * p_t).sub_(q_eff_t).clamp_min_(0.0).sum(dim=1)


def _block_P(P_prev, ratio, ok):
    """P_t = min(1, P_{t-1} * (p_t(x_t) / q_t(x_t))) in float32, in this order: ratio = p / q (the same
    float32 ratio as accept_prob), then P_{t-1} * ratio, then min with 1. P_t = 0 where the slot is
    not usable (ok False: padding, invalid, q_t(x_t) == 0) or P_{t-1} == 0."""
    keep = ok & (P_prev > 0)
    return torch.where(keep, torch.clamp(P_prev * ratio, max=1.0), 0.0)


def _scan(p_all, q_all, ids, in_draft, method):
    """One pass over the K draft slots. Returns a dict of [B, K] tensors:
    valid (bool), p_x, q_x, ratio (= p_x / q_x, 0 where q_x == 0), z (residual mass),
    greedy_match (bool, greedy only), P and rho (float32, block only)."""
    B, K1, V = p_all.shape
    K = K1 - 1
    cols = {n: [] for n in ("valid", "p_x", "q_x", "ratio", "z", "greedy_match", "P", "rho")}
    P_prev = torch.ones(B, dtype=torch.float32, device=p_all.device)  # P_0 = 1
    for t in range(K):
        p_t = p_all[:, t].float()  # [B, V]
        q_t = None if q_all is None else q_all[:, t].float()
        valid, p_x, q_x, q_eff, z = _position(p_t, q_t, ids[:, t], in_draft[:, t], V)
        ratio = torch.where(q_x > 0, p_x / q_x, 0.0)
        for n, v in (("valid", valid), ("p_x", p_x), ("q_x", q_x), ("ratio", ratio), ("z", z)):
            cols[n].append(v)
        if method == "greedy":
            cols["greedy_match"].append(valid & (ids[:, t] == p_t.argmax(dim=1)))
        if method == "block":
            if t > 0:  # rho_{t} (1-based) needs P_t and slot t+1
                rho = _block_rho(P_prev, p_t, q_eff, p_x)
                cols["rho"].append(torch.where(in_draft[:, t], rho, 0.0))
            P_prev = _block_P(P_prev, ratio, valid & (q_x > 0))
            cols["P"].append(P_prev)
    out = {}
    for n, v in cols.items():
        if n == "rho" and method == "block":
            v = v + [torch.zeros(B, dtype=torch.float32, device=p_all.device)] * (K - len(v))
        out[n] = torch.stack(v, dim=1) if v else None
    if K == 0:
        empty = torch.zeros(B, 0, device=p_all.device)
        out.update({n: empty.bool() if n in ("valid", "greedy_match") else empty for n in cols})
    return out


def _block_tau(P, rho, eta, in_draft, num_draft):
    """h_i = rho_i / (rho_i + (1 - P_i)) for i < k' (1 where the denominator is 0), h_k' = P_k',
    0 past k'; tau = the last i with eta_i <= h_i (0 if none). Returns h float32 [B, K], tau int64 [B]."""
    B, K = P.shape
    denom = rho + (1.0 - P)
    safe = torch.where(denom == 0, torch.ones_like(denom), denom)
    h_mid = torch.where(denom == 0, 1.0, rho / safe)
    last = torch.arange(K, device=P.device)[None, :] == (num_draft - 1)[:, None]  # [B, K]
    h = torch.where(last, P, torch.where(in_draft, h_mid, 0.0))
    passed = (eta <= h.double()) & in_draft  # [B, K]
    slot = torch.arange(1, K + 1, device=P.device)[None, :]
    tau = (passed.long() * slot).amax(dim=1) if K > 0 else torch.zeros(B, dtype=torch.long, device=P.device)
    return h, tau


def emission_weights(p_all, q_all, ids, j, is_bonus, valid, scale, method):
    """The weights w [B, V] (float32, unnormalised) each row's one token is drawn from at slot j [B]
    (0-based; j == k' means bonus), and whether they summed to 0 so that w = p_j ([B] bool).

    Greedy: w = p_j (its argmax is taken). Bonus: w = p_j. Recovered, full q: w = max(scale * p_j -
    q_j, 0) (scale = P_tau for block, else 1; q_j zeroed where the slot is invalid); recovered,
    one-hot: p_j with x_j zeroed (valid slots). valid: bool [B, K] (usable draft slots: id in
    [0, V), finite q row). No host sync (the trace's record gathers it inside a CUDA graph). The
    sampler's race and the trace's emitted distribution both come from here.
    """
    B, K1, V = p_all.shape
    rows = torch.arange(B, device=p_all.device)
    p_j = p_all[rows, j].float()  # [B, V] (a copy)
    if method == "greedy" or K1 == 1:
        return p_j, torch.zeros(B, dtype=torch.bool, device=p_all.device)
    jc = j.clamp(max=K1 - 2)
    use_q = ~is_bonus & valid[rows, jc]  # [B] recovered rows with a usable q
    if q_all is None:
        x = torch.where(use_q, ids[rows, jc], torch.zeros_like(jc))[:, None]  # [B, 1]
        w = p_j.scatter(1, x, torch.where(use_q[:, None], 0.0, p_j.gather(1, x)))
    else:
        q_j = q_all[rows, jc].float().masked_fill_(~use_q[:, None], 0.0)  # [B, V]
        w = (p_j if method != "block" else scale[:, None] * p_j).sub(q_j).clamp_min_(0.0)
    zero = w.sum(dim=1) == 0  # [B]
    return torch.where(zero[:, None], p_j, w), zero


def usable_slots(p_all, q_all, ids, num_draft):
    """bool [B, K]: slot < k', draft id in [0, V) and (full q) a finite q row: the slots whose q the
    sampler uses ("Invalid input" in the module docstring). No host sync."""
    B, K1, V = p_all.shape
    slot = torch.arange(K1 - 1, device=p_all.device)[None, :]
    ok = (slot < num_draft[:, None]) & (ids >= 0) & (ids < V)
    if q_all is not None:
        ok = ok & torch.isfinite(q_all.float()).all(dim=-1)
    return ok


def residual_weights(p_all, q_all, ids, num_draft):
    """max(p_i - q_i, 0) [B, K, V] for every draft slot, q as the sampler uses it: one-hot at x_i,
    the zero vector at an unusable slot (:func:`usable_slots`; residual = p_i). No host sync."""
    B, K1, V = p_all.shape
    ok = usable_slots(p_all, q_all, ids, num_draft)  # [B, K]
    p = p_all[:, : K1 - 1].float()
    if q_all is None:
        safe = torch.where(ok, ids, torch.zeros_like(ids)).long()[..., None]  # [B, K, 1]
        q = torch.zeros_like(p).scatter_(2, safe, ok.float()[..., None])
    else:
        q = torch.where(ok[..., None], q_all.float(), 0.0)
    return (p - q).clamp_min(0.0)


def emitted_weights(out: RejectionOutput, p_all, q_all, ids):
    """:func:`emission_weights` of a finished verification (either backend): the reference sampler's
    own (``out.emit_weights``), else recomputed from ``out``'s decisions by the same function.
    p_all [B, K+1, V], q_all [B, K, V] or None, ids [B, K]. Returns (w [B, V], zero [B] bool)."""
    if out.emit_weights is not None:
        return out.emit_weights, out.emit_fallback
    B, K1, _ = p_all.shape
    is_bonus = out.num_accepted == out.num_draft
    scale = torch.ones(B, dtype=torch.float32, device=p_all.device)
    if out.block is not None and K1 > 1:
        P0 = torch.cat([torch.ones(B, 1, device=p_all.device), out.block.P.float()], dim=1)  # [B, K+1]
        scale = torch.where(is_bonus, 1.0, P0.gather(1, out.num_accepted[:, None]).squeeze(1))
    valid = usable_slots(p_all, q_all, ids.long(), out.num_draft)
    return emission_weights(p_all, q_all, ids.long(), out.num_accepted, is_bonus, valid, scale, out.method)


def _emit(p_all, q_all, ids, j, is_bonus, valid, scale, exp, method):
    """The one token each row emits at slot j [B]: greedy argmax p_j, else the exponential race over
    :func:`emission_weights`. Returns (token [B], weights [B, V], weights-were-zero [B])."""
    w, zero = emission_weights(p_all, q_all, ids, j, is_bonus, valid, scale, method)
    if method == "greedy":
        return w.argmax(dim=1), w, zero
    score = (w / exp).masked_fill_(w == 0, -1.0)  # [B, V]; zero weight never wins
    return score.argmax(dim=1), w, zero


def _reference(target_probs, draft_probs, draft_token_ids, method, noise, rates) -> RejectionOutput:
    B, K1, V = target_probs.shape
    K = K1 - 1
    device = target_probs.device
    ids = draft_token_ids.long()  # [B, K]
    slot = torch.arange(K, device=device)[None, :]  # [1, K]
    is_pad = ids == -1
    num_draft = torch.where(is_pad.any(dim=1), is_pad.int().argmax(dim=1), K).long() if K else ids.new_zeros(B)
    in_draft = slot < num_draft[:, None]  # [B, K]
    s = _scan(target_probs, draft_probs, ids, in_draft, method)
    accept_prob = s["ratio"].clamp(max=1.0)
    greedy = method == "greedy"  # greedy uses no noise: u reported as 0
    u = torch.zeros(B, K, dtype=torch.float64, device=device) if greedy else noise.u
    block, scale = None, torch.ones(B, dtype=torch.float32, device=device)
    if method == "block":
        h, num_accepted = _block_tau(s["P"], s["rho"], u, in_draft, num_draft)
        block = BlockDetails(P=s["P"], rho=s["rho"], h=h, eta=u, tau=num_accepted)
        P0 = torch.cat([torch.ones(B, 1, device=device), s["P"]], dim=1)  # [B, K+1] P_0..P_K
        scale = torch.where(num_accepted == num_draft, 1.0, P0.gather(1, num_accepted[:, None]).squeeze(1))
    else:
        if method == "greedy":
            ok = s["greedy_match"]
            accept_prob = ok.float()
        elif method == "synthetic":
            ok = s["valid"] & (u < rates[None, :])
            accept_prob = torch.where(s["valid"], rates.float()[None, :], 0.0)
        else:  # standard: u (float64) <= p/q (float32 ratio, upcast)
            ok = s["valid"] & (s["q_x"] > 0) & (u <= s["ratio"].double())
        num_accepted = ok.long().cumprod(dim=1).sum(dim=1) if K else ids.new_zeros(B)
    is_bonus = num_accepted == num_draft
    exp = None if greedy else noise.exp
    token, emit_w, emit_zero = _emit(target_probs, draft_probs, ids, num_accepted, is_bonus, s["valid"], scale, exp,
                                     method)
    accepted = slot < num_accepted[:, None]  # [B, K]
    return RejectionOutput(
        output_token_ids=_layout(ids, accepted, num_accepted, token),
        num_accepted=num_accepted,
        num_draft=num_draft,
        token_kind=_kinds(accepted, num_accepted, is_bonus),
        u=u,
        p_draft=s["p_x"],
        q_draft=s["q_x"],
        accept_prob=torch.where(in_draft, accept_prob, 0.0),
        accepted=accepted,
        residual_mass=s["z"],
        method=method,
        backend="reference",
        block=block,
        emit_weights=emit_w,
        emit_fallback=emit_zero,
    )


def _layout(ids, accepted, num_accepted, token) -> torch.Tensor:
    """[B, K+1] int64: accepted drafts, the emitted token at slot num_accepted, then -1."""
    B, K = ids.shape
    out = torch.full((B, K + 1), -1, dtype=torch.long, device=ids.device)
    out[:, :K] = torch.where(accepted, ids, -1)
    out[torch.arange(B, device=ids.device), num_accepted] = token
    return out


def _kinds(accepted, num_accepted, is_bonus) -> torch.Tensor:
    """[B, K+1] int8 KIND_* per output slot."""
    B, K = accepted.shape
    kind = torch.zeros(B, K + 1, dtype=torch.int8, device=accepted.device)
    kind[:, :K] = accepted.to(torch.int8) * KIND_ACCEPTED
    last = torch.where(is_bonus, KIND_BONUS, KIND_RECOVERED).to(torch.int8)
    kind[torch.arange(B, device=accepted.device), num_accepted] = last
    return kind
