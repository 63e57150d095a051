"""Triton batched rejection sampler: greedy, standard, block and synthetic verification.

Same contract and results as the PyTorch reference :mod:`specviz.sampling.reference` (read its
docstring and docs/algorithms.md "Verification methods"): token ids, counts, kinds and flags are
equal exactly; residual_mass and the block rho / h are sums over the vocabulary taken in another
order, so they agree to float32 rounding of a sum. Sources: Leviathan et al. 2023 Alg. 1 and
Chen et al. 2023 (standard), Sun et al. 2024 arXiv 2403.10444 / vLLM PR 46781 (block), vLLM
``v1/sample/rejection_sampler.py`` (batched layout, exponential-race resampling, synthetic).

Design (two launches, four for block with full q; no atomics, deterministic):

1. ``_sampler_pass_kernel``, grid (B, NB = cdiv(V, BLOCK_V)): one program per (row, vocab
   block). Each recomputes the per-slot scalars (k', p_t(x_t), q_t(x_t), ratios, block P chain)
   from K gathers, then walks only the rows that can matter and writes per-block partials:
   - full q, slots t < k': count of non-finite q, sum max(p - q, 0), sum p (residual mass);
   - block, full q: sum max(P p - q, 0) and sum P p (rho). Two-pass (the default): nothing else
     here; ``_block_decide_kernel`` (grid (B,)) then takes tau and P_tau from the sums and
     ``_block_race_kernel`` (grid (B, NB)) races row tau only. One-pass (``block_two_pass=False``):
     a race candidate for every row 0..k' in this kernel (tau is not known before rho is);
   - standard / synthetic: the race only at the row where the speculative decision (assuming
     every q row finite) stops; one-hot q: that is the only row read at all;
   - block, one-hot q: rho is closed form, so tau and the one race row are known up front;
   - greedy: argmax of p at rows 0..k'.
   The race score is w / E with E = noise.exp (exponential race, argmax with lowest index).
2. ``_sampler_finalize_kernel``, grid (B,): reduces the partials, takes the exact decisions
   (with the real non-finite flags), writes every output field. If a non-finite q row changed
   the decision, or the emitted row's weights are all zero (sum(w) == 0 -> w = p), it redoes the
   race for that row in a loop over the vocabulary (a rare slow path, exact).

Bytes read (B rows, fp32 p and q): full q: k' rows of p and q per row (residual masses), plus
the bonus row p_{k'+1} where it can be emitted, plus E; one-hot: one row of p and E (standard,
block, synthetic) or k'+1 rows of p (greedy).

Limits: probabilities must be non-negative (as probabilities are); K and the method are
compile-time constants (one compilation each). Tested on: the CPU interpreter (TRITON_INTERPRET=1,
tests/test_kernels_sampler.py), sm_90 compilation on CPU (tests/test_kernels_compile.py), and one
NVIDIA H200 (sm_90, torch 2.11 + triton 3.6, 2026-11-30): the same equality tests with compiled
kernels passed; speed in results/kernels/README.md (at B=64, K=4, V=128256 fp32 the standard
sampler reads at 0.72 of copy bandwidth in GPU time; block costs 2.2x standard there).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from specviz.kernels.sampler_helpers import (
    BLOCK,
    F_GREEDY,
    F_RACE,
    F_RP,
    F_RQ,
    F_SP,
    F_SQ,
    GREEDY,
    I_GREEDY,
    I_NONFINITE,
    I_RACE,
    METHOD_CODES,
    NUM_F,
    NUM_I,
    STANDARD,
    block_chain,
    block_full_rho,
    block_tau,
    draft_scalars,
    first_fail,
    pick,
    race_row_loop,
    race_score,
    race_weights,
    reduce_row_argmax,
    sum_rows,
)
from specviz.sampling.rates import conditional_rates
from specviz.sampling.types import BlockDetails, RejectionOutput, SamplerNoise

_SLOW_BLOCK = tl.constexpr(1024)  # vocabulary chunk of the (rare) whole-row race loop


@triton.jit
def _speculative_decision(
    slot, kd, in_draft, id_ok, p_x, q_x, ratio, u_ptr, rate_ptr, b,
    K: tl.constexpr, K_P2: tl.constexpr, METHOD: tl.constexpr,
):  # fmt: skip
    """Emission row assuming every q row is finite (exact for one-hot q), plus the block P0
    chain. Returns (j, P0)."""
    u = tl.load(u_ptr + b * K + slot, mask=slot < K, other=2.0)
    ok = id_ok & (q_x > 0)
    P, P0, rho1 = block_chain(slot, kd, ok, ratio, p_x, K, K_P2)
    if METHOD == BLOCK:
        h, j = block_tau(P, rho1, u, slot, kd, in_draft)
    elif METHOD == STANDARD:
        j = first_fail((ok & (u <= ratio.to(tl.float64))).to(tl.int32), slot, kd, in_draft)
    else:  # SYNTHETIC
        c = tl.load(rate_ptr + slot, mask=slot < K, other=0.0)
        j = first_fail((id_ok & (u < c)).to(tl.int32), slot, kd, in_draft)
    return j, P0


@triton.jit
def _sampler_pass_kernel(
    p_ptr,  # [B, K+1, V] float32/bf16 target probs (contiguous)
    q_ptr,  # [B, K, V] float draft probs (full q) or a dummy (one-hot)
    ids_ptr,  # [B, K] int draft ids, -1 padded
    u_ptr,  # [B, K] float64 uniforms (dummy for greedy)
    e_ptr,  # [B, V] float32 Exp(1) noise (dummy for greedy)
    rate_ptr,  # [K] float64 conditional synthetic rates (dummy otherwise)
    pf_ptr,  # [NUM_F, B, K+1, NB] float32 partials (out)
    pi_ptr,  # [NUM_I, B, K+1, NB] int32 partials (out)
    B, V, NB,
    K: tl.constexpr, K_P2: tl.constexpr, METHOD: tl.constexpr, FULL_Q: tl.constexpr,
    BLOCK_V: tl.constexpr, TWO_PASS: tl.constexpr = False,
):  # fmt: skip
    b = tl.program_id(0)
    vb = tl.program_id(1)
    slot, x, kd, in_draft, id_ok, p_x, q_x, ratio = draft_scalars(ids_ptr, p_ptr, q_ptr, b, V, K, K_P2, FULL_Q)
    offs = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = offs < V
    P0 = tl.zeros([K_P2], dtype=tl.float32)
    if METHOD == GREEDY:
        j = kd
        t_lo = 0
        t_hi = kd + 1
        e = tl.full([BLOCK_V], 1.0, tl.float32)
    else:
        j, P0 = _speculative_decision(slot, kd, in_draft, id_ok, p_x, q_x, ratio, u_ptr, rate_ptr, b, K, K_P2, METHOD)
        if TWO_PASS:  # sums only: no race here, no noise read
            e = tl.full([BLOCK_V], 1.0, tl.float32)
        else:
            e = tl.load(e_ptr + b.to(tl.int64) * V + offs, mask=vmask, other=1.0)
        if FULL_Q:
            t_lo = 0
            t_hi = tl.maximum(kd, j + 1)
            if METHOD == BLOCK:
                t_hi = kd + 1
                if TWO_PASS:  # the bonus row only matters to the race, which runs on row tau later
                    t_hi = kd
        else:
            t_lo = j
            t_hi = j + 1
    NP = B * (K + 1) * NB  # elements per partial plane
    for t in range(t_lo, t_hi):
        out = (b * (K + 1) + t) * NB + vb
        p = tl.load(p_ptr + (b.to(tl.int64) * (K + 1) + t) * V + offs, mask=vmask, other=0.0).to(tl.float32)
        in_t = t < kd
        idok_t = pick(id_ok.to(tl.int32), slot, t) > 0
        x_t = pick(x, slot, t)
        if FULL_Q:
            q = tl.load(q_ptr + (b.to(tl.int64) * K + t) * V + offs, mask=vmask & in_t, other=0.0).to(tl.float32)
            if in_t:
                bad = (q != q) | (tl.abs(q) == float("inf"))
                tl.store(pi_ptr + I_NONFINITE * NP + out, tl.sum(bad.to(tl.int32), axis=0))
                tl.store(pf_ptr + F_SQ * NP + out, tl.sum(tl.maximum(p - tl.where(idok_t, q, 0.0), 0.0), axis=0))
                tl.store(pf_ptr + F_SP * NP + out, tl.sum(p, axis=0))
        else:
            q = p
        if METHOD == GREEDY:
            g, gi = tl.max(tl.where(vmask, p, -float("inf")), axis=0, return_indices=True)
            tl.store(pf_ptr + F_GREEDY * NP + out, g)
            tl.store(pi_ptr + I_GREEDY * NP + out, vb * BLOCK_V + gi)
        else:
            if (t == j) | (METHOD == 2):  # block: every row is a candidate
                scale = 1.0
                if METHOD == BLOCK:
                    scale = tl.where(in_t, pick(P0, slot, t), 1.0)
                w = race_weights(p, q, offs, scale, in_t & idok_t, x_t, FULL_Q)
                if not TWO_PASS:
                    s, si = tl.max(race_score(w, e), axis=0, return_indices=True)
                    tl.store(pf_ptr + F_RACE * NP + out, s)
                    tl.store(pi_ptr + I_RACE * NP + out, vb * BLOCK_V + si)
                if METHOD == BLOCK:
                    if FULL_Q:
                        tl.store(pf_ptr + F_RQ * NP + out, tl.sum(w, axis=0))
                        tl.store(pf_ptr + F_RP * NP + out, tl.sum(tl.maximum(scale * p, 0.0), axis=0))


@triton.jit
def _block_decide_kernel(
    p_ptr, q_ptr, ids_ptr, u_ptr, pf_ptr, pi_ptr,
    tau_ptr,  # [B] int32 out: tau (the emitted slot)
    scale_ptr,  # [B] float32 out: P_tau (1 when tau = k': the bonus row)
    B, V, NB,
    K: tl.constexpr, K_P2: tl.constexpr,
):  # fmt: skip
    """Two-pass block verification, full q, between the sums pass and the race: tau and P_tau per
    row, from the sums, with the finalize kernel's exact rules (non-finite q rows included)."""
    b = tl.program_id(0)
    NP = B * (K + 1) * NB
    slot, x, kd, in_draft, id_ok, p_x, q_x, ratio = draft_scalars(ids_ptr, p_ptr, q_ptr, b, V, K, K_P2, True)
    nonfinite = sum_rows(pf_ptr, pi_ptr, b, NB, NP, kd, slot, K, I_NONFINITE, True)
    valid = id_ok & (nonfinite == 0)
    q_x = tl.where(valid, q_x, 0.0)
    ratio = tl.where(valid, ratio, 0.0)
    u = tl.load(u_ptr + b * K + slot, mask=slot < K, other=0.0)
    P, P0, rho1 = block_chain(slot, kd, valid & (q_x > 0), ratio, p_x, K, K_P2)
    rho = block_full_rho(pf_ptr, pi_ptr, b, NB, NP, kd, slot, valid, P, K, K_P2)
    h, j = block_tau(P, rho, u, slot, kd, in_draft)
    tl.store(tau_ptr + b, j.to(tl.int32))
    tl.store(scale_ptr + b, tl.where(j == kd, 1.0, pick(P0, slot, j)))


@triton.jit
def _block_race_kernel(
    p_ptr, q_ptr, ids_ptr, e_ptr, tau_ptr, scale_ptr, pf_ptr, pi_ptr,
    B, V, NB,
    K: tl.constexpr, K_P2: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Two-pass block verification, full q: the exponential race on row tau only, grid (B, NB),
    writing the same per-block partials the one-pass kernel writes for that row."""
    b = tl.program_id(0)
    vb = tl.program_id(1)
    slot, x, kd, in_draft, id_ok, p_x, q_x, ratio = draft_scalars(ids_ptr, p_ptr, q_ptr, b, V, K, K_P2, True)
    j = tl.load(tau_ptr + b)
    scale = tl.load(scale_ptr + b)
    offs = vb * BLOCK_V + tl.arange(0, BLOCK_V)
    vmask = offs < V
    in_t = j < kd
    e = tl.load(e_ptr + b.to(tl.int64) * V + offs, mask=vmask, other=1.0)
    p = tl.load(p_ptr + (b.to(tl.int64) * (K + 1) + j) * V + offs, mask=vmask, other=0.0).to(tl.float32)
    q = tl.load(q_ptr + (b.to(tl.int64) * K + j) * V + offs, mask=vmask & in_t, other=0.0).to(tl.float32)
    w = race_weights(p, q, offs, scale, in_t & (pick(id_ok.to(tl.int32), slot, j) > 0), pick(x, slot, j), True)
    s, si = tl.max(race_score(w, e), axis=0, return_indices=True)
    out = (b * (K + 1) + j) * NB + vb
    NP = B * (K + 1) * NB
    tl.store(pf_ptr + F_RACE * NP + out, s)
    tl.store(pi_ptr + I_RACE * NP + out, vb * BLOCK_V + si)


@triton.jit
def _sampler_finalize_kernel(
    p_ptr, q_ptr, ids_ptr, u_ptr, e_ptr, rate_ptr, pf_ptr, pi_ptr,
    out_ids_ptr,  # [B, K+1] int64
    out_kind_ptr,  # [B, K+1] int8
    out_nacc_ptr,  # [B] int64
    out_ndraft_ptr,  # [B] int64
    out_px_ptr, out_qx_ptr, out_ap_ptr,  # [B, K] float32 p_draft, q_draft, accept_prob
    out_acc_ptr,  # [B, K] uint8 (bool view) accepted
    out_z_ptr,  # [B, K] float32 residual_mass
    out_P_ptr, out_rho_ptr, out_h_ptr,  # [B, K] float32 (block only)
    B, V, NB,
    K: tl.constexpr, K_P2: tl.constexpr, K1_P2: tl.constexpr, METHOD: tl.constexpr, FULL_Q: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    NP = B * (K + 1) * NB
    slot, x, kd, in_draft, id_ok, p_x, q_x, ratio = draft_scalars(ids_ptr, p_ptr, q_ptr, b, V, K, K_P2, FULL_Q)
    # ---- exact validity (reference _position): a non-finite full-q row makes q the zero vector
    fnf = K + 1  # first in-draft slot with a non-finite q row (K + 1 = none)
    if FULL_Q:
        nonfinite = sum_rows(pf_ptr, pi_ptr, b, NB, NP, kd, slot, K, I_NONFINITE, True)
        bad_row = in_draft & (nonfinite > 0)
        fnf = tl.min(tl.where(bad_row, slot, K + 1), axis=0)
        valid = id_ok & (nonfinite == 0)
        q_x = tl.where(valid, q_x, 0.0)
        ratio = tl.where(valid, ratio, 0.0)
        s_q = sum_rows(pf_ptr, pi_ptr, b, NB, NP, kd, slot, K, F_SQ, False)
        s_p = sum_rows(pf_ptr, pi_ptr, b, NB, NP, kd, slot, K, F_SP, False)
        z = tl.where(in_draft, tl.where(valid, s_q, s_p), 0.0)
    else:
        valid = id_ok
        z = tl.where(in_draft, 1.0 - p_x, 0.0)
    # ---- decisions
    u = tl.load(u_ptr + b * K + slot, mask=(slot < K) & (METHOD != GREEDY), other=0.0)
    ok_q = valid & (q_x > 0)
    accept_prob = tl.minimum(ratio, 1.0)
    scale = 1.0
    P, P0, rho = block_chain(slot, kd, ok_q, ratio, p_x, K, K_P2)
    if METHOD == GREEDY:
        gidx = tl.zeros([K_P2], dtype=tl.int32)
        for t in tl.static_range(K):
            g, gi = reduce_row_argmax(pf_ptr, pi_ptr, b, t, NB, NP, t < kd, K, F_GREEDY, I_GREEDY)
            gidx = tl.where(slot == t, gi, gidx)
        match = valid & (x == gidx.to(tl.int64))
        j = first_fail(match.to(tl.int32), slot, kd, in_draft)
        accept_prob = match.to(tl.float32)
    elif METHOD == BLOCK:
        if FULL_Q:  # rho_{t-1} = sum max(P_{t} p_t - q_t, 0) for 1 <= t < k'; 0 once P is 0
            rho = block_full_rho(pf_ptr, pi_ptr, b, NB, NP, kd, slot, valid, P, K, K_P2)
        h, j = block_tau(P, rho, u, slot, kd, in_draft)
        scale = tl.where(j == kd, 1.0, pick(P0, slot, j))
        tl.store(out_P_ptr + b * K + slot, P, mask=slot < K)
        tl.store(out_rho_ptr + b * K + slot, rho, mask=slot < K)
        tl.store(out_h_ptr + b * K + slot, h, mask=slot < K)
    elif METHOD == STANDARD:
        j = first_fail((ok_q & (u <= ratio.to(tl.float64))).to(tl.int32), slot, kd, in_draft)
    else:  # SYNTHETIC
        c = tl.load(rate_ptr + slot, mask=slot < K, other=0.0)
        j = first_fail((valid & (u < c)).to(tl.int32), slot, kd, in_draft)
        accept_prob = tl.where(valid, c.to(tl.float32), 0.0)
    # ---- the emitted token
    if METHOD == GREEDY:
        tok_v, token = reduce_row_argmax(pf_ptr, pi_ptr, b, j, NB, NP, j >= 0, K, F_GREEDY, I_GREEDY)
    else:
        best, token = reduce_row_argmax(pf_ptr, pi_ptr, b, j, NB, NP, fnf > j, K, F_RACE, I_RACE)
        p_row = p_ptr + (b.to(tl.int64) * (K + 1) + j) * V
        q_row = q_ptr + (b.to(tl.int64) * K + tl.minimum(j, K - 1)) * V
        e_row = e_ptr + b.to(tl.int64) * V
        use_q = (j < kd) & (pick(valid.to(tl.int32), slot, j) > 0)
        if fnf <= j:  # a non-finite q row changed the decision: redo the race at row j
            best, token = race_row_loop(p_row, q_row, e_row, V, scale, use_q, pick(x, slot, j), True, FULL_Q, _SLOW_BLOCK)
        if best < 0:  # every weight is 0: sum(w) == 0 -> race over p
            best, token = race_row_loop(p_row, q_row, e_row, V, scale, use_q, 0, False, FULL_Q, _SLOW_BLOCK)
    # ---- outputs
    o = tl.arange(0, K1_P2)
    xo = tl.load(ids_ptr + b * K + o, mask=o < K, other=-1).to(tl.int64)
    ids_out = tl.where(o < j, xo, tl.where(o == j, token.to(tl.int64), -1))
    kind = tl.where(o < j, 1, tl.where(o == j, tl.where(j == kd, 3, 2), 0)).to(tl.int8)
    tl.store(out_ids_ptr + b * (K + 1) + o, ids_out, mask=o < K + 1)
    tl.store(out_kind_ptr + b * (K + 1) + o, kind, mask=o < K + 1)
    tl.store(out_nacc_ptr + b, j.to(tl.int64))
    tl.store(out_ndraft_ptr + b, kd.to(tl.int64))
    sm = slot < K
    tl.store(out_px_ptr + b * K + slot, p_x, mask=sm)
    tl.store(out_qx_ptr + b * K + slot, q_x, mask=sm)
    tl.store(out_ap_ptr + b * K + slot, tl.where(in_draft, accept_prob, 0.0), mask=sm)
    tl.store(out_acc_ptr + b * K + slot, (slot < j).to(tl.uint8), mask=sm)
    tl.store(out_z_ptr + b * K + slot, z, mask=sm)


def _block_v(V: int, B: int, device: torch.device) -> int:
    """Vocabulary block per program. GPU: 4096 (1024 for small batches, to fill the SMs).
    Interpreter: the whole row up to 32768 (its cost grows with the number of programs)."""
    if device.type != "cuda":
        return min(32768, triton.next_power_of_2(V))
    return 4096 if B >= 16 else 1024


def _num_warps(block_v: int) -> int:
    return 8 if block_v >= 4096 else 4


def rejection_sample_triton(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    *,
    method: str,
    noise: SamplerNoise | None,
    synthetic_rates=None,
    block_v: int | None = None,
    num_warps: int | None = None,
    block_two_pass: bool = True,
) -> RejectionOutput:
    """Verify a batch of drafts with the Triton kernels (backend "triton" of
    :func:`specviz.sampling.rejection_sample`, which validates the arguments first).

    Args:
        target_probs: float32/bf16/fp16 [B, K+1, V] target distributions p_1..p_{K+1}.
        draft_probs: float [B, K, V] q, or None for one-hot q at the draft ids.
        draft_token_ids: int [B, K] draft ids, -1 padded (k' = index of the first -1).
        method: "greedy" | "standard" | "block" | "synthetic".
        noise: SamplerNoise (u float64 [B, K], exp float32 [B, V]); may be None for greedy.
        synthetic_rates: unconditional rates a_1 >= a_2 >= ... (method "synthetic").
        block_v: vocabulary block per program (power of two); default by device and batch.
        num_warps: warps per program of the pass kernel; default by block_v.
        block_two_pass: method "block" with full q: sums first, then the race on row tau only
            (two more launches, one race instead of k'+1); False: the one-pass kernel (races every
            row 0..k'). Both give the same result bit for bit.

    Returns:
        RejectionOutput with backend "triton", every field as the reference computes it.

    Raises:
        ValueError: unknown method, missing noise, or invalid synthetic rates.
    """
    if method not in METHOD_CODES:
        raise ValueError(f"unknown method {method!r}")
    B, K1, V = target_probs.shape
    K = K1 - 1
    device = target_probs.device
    if noise is None and method != "greedy":
        raise ValueError(f"method {method!r} needs noise (SamplerNoise)")
    p = target_probs.contiguous()
    q = draft_probs.contiguous() if draft_probs is not None else p
    ids = draft_token_ids.contiguous()
    greedy = method == "greedy"  # greedy draws no noise and reports u = 0, as the reference
    u = torch.zeros(B, K, dtype=torch.float64, device=device) if greedy else noise.u.contiguous()
    e = p if greedy else noise.exp.contiguous()  # greedy: a dummy, never read
    rates = _rates(method, synthetic_rates, K, device)
    bv = block_v or _block_v(V, B, device)
    nb = triton.cdiv(V, bv)
    pf = torch.empty(NUM_F, B, K + 1, nb, dtype=torch.float32, device=device)
    pi = torch.empty(NUM_I, B, K + 1, nb, dtype=torch.int32, device=device)
    out = _alloc_outputs(B, K, device)
    meta = dict(K=K, K_P2=triton.next_power_of_2(max(K, 1)), METHOD=METHOD_CODES[method], FULL_Q=draft_probs is not None)
    if B > 0:
        ins = (p, q, ids, u, e, rates)
        if K == 0:  # no null pointers into the launcher (only masked loads touch these)
            ins = tuple(_nonempty(t) for t in ins)
        two = block_two_pass and method == "block" and draft_probs is not None and K > 0
        warps = num_warps or _num_warps(bv)
        _sampler_pass_kernel[(B, nb)](
            *ins, pf, pi, B, V, nb, BLOCK_V=bv, TWO_PASS=two, num_warps=warps, enable_fp_fusion=False, **meta
        )
        if two:  # tau from the sums, then the race on row tau (results/kernels/README.md: the two-pass design)
            tau, scale = torch.empty(B, dtype=torch.int32, device=device), torch.empty(B, dtype=torch.float32, device=device)
            _block_decide_kernel[(B,)](p, q, ids, u, pf, pi, tau, scale, B, V, nb, K=K, K_P2=meta["K_P2"],
                                       num_warps=4, enable_fp_fusion=False)
            _block_race_kernel[(B, nb)](p, q, ids, e, tau, scale, pf, pi, B, V, nb, K=K, K_P2=meta["K_P2"],
                                        BLOCK_V=bv, num_warps=warps, enable_fp_fusion=False)
        _sampler_finalize_kernel[(B,)](
            *ins, pf, pi, *out.values(), B, V, nb, K1_P2=triton.next_power_of_2(K + 1),
            num_warps=4, enable_fp_fusion=False, **meta,
        )  # fmt: skip
    return _pack(out, method, u)


def _nonempty(t: torch.Tensor) -> torch.Tensor:
    """t, or a 1-element stand-in of its dtype when t is empty (only masked loads touch it)."""
    return t if t.numel() > 0 else torch.empty(1, dtype=t.dtype, device=t.device)


def _rates(method: str, synthetic_rates, K: int, device: torch.device) -> torch.Tensor:
    """Conditional synthetic rates float64 [K] (the reference's own host computation), or a dummy.
    Rates given as a list/tuple are cached per device (no host-to-device copy per call)."""
    if method != "synthetic":
        return torch.empty(1, dtype=torch.float64, device=device)
    if isinstance(synthetic_rates, (list, tuple)):
        return _cached_rates(tuple(float(a) for a in synthetic_rates), K, str(device))
    return conditional_rates(synthetic_rates, K, device).contiguous()


@functools.lru_cache(maxsize=64)
def _cached_rates(rates: tuple[float, ...], K: int, device: str) -> torch.Tensor:
    return conditional_rates(list(rates), K, torch.device(device)).contiguous()


def _alloc_outputs(B: int, K: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Output buffers in the finalize kernel's argument order, carved out of three allocations
    (host overhead). [B, K] buffers are views of [B, max(K, 1)] ones so that K = 0 passes no
    null pointer (their stores are all masked). Every element is written by the finalize kernel
    (P, rho, h for method "block" only)."""
    Kc = max(K, 1)
    i64 = torch.empty(B * (K + 3), dtype=torch.int64, device=device)
    f32 = torch.empty(7, B, Kc, dtype=torch.float32, device=device)[:, :, :K]
    i8 = torch.empty(B * (K + 1 + Kc), dtype=torch.int8, device=device)
    return {
        "output_token_ids": i64[: B * (K + 1)].view(B, K + 1),
        "token_kind": i8[: B * (K + 1)].view(B, K + 1),
        "num_accepted": i64[B * (K + 1) : B * (K + 2)],
        "num_draft": i64[B * (K + 2) :],
        "p_draft": f32[0],
        "q_draft": f32[1],
        "accept_prob": f32[2],
        "accepted": i8[B * (K + 1) :].view(B, Kc)[:, :K].view(torch.uint8),
        "residual_mass": f32[3],
        "P": f32[4],
        "rho": f32[5],
        "h": f32[6],
    }


def _pack(out: dict[str, torch.Tensor], method: str, u: torch.Tensor) -> RejectionOutput:
    block = None
    if method == "block":
        block = BlockDetails(P=out["P"], rho=out["rho"], h=out["h"], eta=u, tau=out["num_accepted"])
    return RejectionOutput(
        output_token_ids=out["output_token_ids"],
        num_accepted=out["num_accepted"],
        num_draft=out["num_draft"],
        token_kind=out["token_kind"],
        u=u,
        p_draft=out["p_draft"],
        q_draft=out["q_draft"],
        accept_prob=out["accept_prob"],
        accepted=out["accepted"].view(torch.bool),
        residual_mass=out["residual_mass"],
        method=method,
        backend="triton",
        block=block,
    )
