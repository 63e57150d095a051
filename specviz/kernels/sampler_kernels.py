"""The Triton kernels of the batched rejection sampler (:mod:`specviz.kernels.rejection_sampler` launches them and
says what each computes): the per-(row, vocabulary block) pass, block verification's decide and race, and the
finalize that takes the exact decisions and writes every output field."""


from __future__ import annotations


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
