"""@triton.jit helpers shared by the two rejection-sampler kernels (specviz/kernels/rejection_sampler.py).

Every helper mirrors one step of the PyTorch reference (specviz/sampling/reference.py); the
comment on each names the reference function it copies. Vectors "over slots" have K_P2 lanes,
lane t = draft slot t (0-based), lanes >= K are padding. Arithmetic is float32 except the
acceptance comparisons, which upcast to float64 as the reference does; every quotient that
decides anything uses IEEE division (``tl.math.div_rn``) and kernels are launched with
``enable_fp_fusion=False`` so ``a * b - c`` rounds twice, as two PyTorch ops do.
"""

from __future__ import annotations

import triton
import triton.language as tl

GREEDY = tl.constexpr(0)
STANDARD = tl.constexpr(1)
BLOCK = tl.constexpr(2)
SYNTHETIC = tl.constexpr(3)
METHOD_CODES = {"greedy": 0, "standard": 1, "block": 2, "synthetic": 3}

# planes of the float32 partial buffer [NUM_F, B, K+1, NB]
F_SQ = tl.constexpr(0)  # sum max(p - q_sel, 0)          (residual mass, q row finite)
F_SP = tl.constexpr(1)  # sum p                          (residual mass, q row non-finite)
F_RQ = tl.constexpr(2)  # sum max(P p - q_sel, 0)        (block rho, q row finite)
F_RP = tl.constexpr(3)  # sum max(P p, 0)                (block rho, q row non-finite)
F_RACE = tl.constexpr(4)  # max of the race score w / E
F_GREEDY = tl.constexpr(5)  # max of p
NUM_F = 6
# planes of the int32 partial buffer [NUM_I, B, K+1, NB]
I_NONFINITE = tl.constexpr(0)  # count of non-finite q values
I_RACE = tl.constexpr(1)  # argmax of the race score (vocab index)
I_GREEDY = tl.constexpr(2)  # argmax of p
NUM_I = 3
_CHUNK = tl.constexpr(64)  # vocab-block partials reduced per step in the finalize kernel


@triton.jit
def pick(vec, slot, t):
    """vec[t] of a vector over slots (exact: one term plus zeros)."""
    return tl.sum(tl.where(slot == t, vec, 0), axis=0)


@triton.jit
def draft_scalars(
    ids_ptr, p_ptr, q_ptr, b, V, K: tl.constexpr, K_P2: tl.constexpr, FULL_Q: tl.constexpr
):
    """Per-slot quantities that need no whole-vocab pass (reference ``_position`` / ``_scan``).

    Returns slot [K_P2], x int64 (draft ids, -1 past K), kd (k' = index of the first -1),
    in_draft, id_ok (slot < k' and 0 <= x < V), p_x = p_t(x_t) (0 where not id_ok),
    q_x = q_t(x_t) as gathered (full q; 1/0 for one-hot), ratio = p_x / q_x (0 where q_x <= 0).
    p/q rows are contiguous [B, K+1, V] / [B, K, V].
    """
    slot = tl.arange(0, K_P2)
    x = tl.load(ids_ptr + b * K + slot, mask=slot < K, other=-1).to(tl.int64)
    kd = tl.min(tl.where(x == -1, slot, K), axis=0)
    in_draft = slot < kd
    id_ok = in_draft & (x >= 0) & (x < V)
    xs = tl.where(id_ok, x, 0)
    row = b.to(tl.int64) * (K + 1) + slot
    p_x = tl.load(p_ptr + row * V + xs, mask=id_ok, other=0.0).to(tl.float32)
    if FULL_Q:
        q_x = tl.load(q_ptr + (b.to(tl.int64) * K + slot) * V + xs, mask=id_ok, other=0.0).to(tl.float32)
    else:
        q_x = id_ok.to(tl.float32)
    ratio = tl.where(q_x > 0, tl.math.div_rn(p_x, tl.where(q_x > 0, q_x, 1.0)), 0.0)
    return slot, x, kd, in_draft, id_ok, p_x, q_x, ratio


@triton.jit
def block_chain(slot, kd, ok, ratio, p_x, K: tl.constexpr, K_P2: tl.constexpr):
    """P_t = min(1, P_{t-1} * ratio_t) where ok_t and P_{t-1} > 0, else 0 (reference ``_block_P``).

    ok [K_P2]: the slot is usable (valid and q_x > 0). Returns P [K_P2] (P after slot t),
    P0 [K_P2] (P before slot t, P0[0] = 1) and the one-hot rho [K_P2]: rho[t-1] =
    P_{t} (1 - p_x[t]) for 1 <= t < k' (reference ``_block_rho``, one-hot branch).
    """
    P = tl.zeros([K_P2], dtype=tl.float32)
    P0 = tl.zeros([K_P2], dtype=tl.float32)
    rho = tl.zeros([K_P2], dtype=tl.float32)
    P_prev = tl.full([], 1.0, tl.float32)
    for t in tl.static_range(K):
        sel = slot == t
        if t > 0:
            r1 = tl.where(t < kd, P_prev * (1.0 - pick(p_x, slot, t)), 0.0)
            rho = tl.where(slot == t - 1, r1, rho)
        P0 = tl.where(sel, P_prev, P0)
        keep = (pick(ok.to(tl.int32), slot, t) > 0) & (P_prev > 0)
        P_prev = tl.where(keep, tl.minimum(P_prev * pick(ratio, slot, t), 1.0), 0.0)
        P = tl.where(sel, P_prev, P)
    return P, P0, rho


@triton.jit
def block_tau(P, rho, u, slot, kd, in_draft):
    """h_t = rho_t / (rho_t + (1 - P_t)) (1 if the denominator is 0) for t < k'-1, h_{k'-1} = P_{k'-1},
    0 past k'; tau = the last 1-based slot with eta <= h (0 if none) (reference ``_block_tau``)."""
    denom = rho + (1.0 - P)
    h_mid = tl.where(denom == 0, 1.0, tl.math.div_rn(rho, tl.where(denom == 0, 1.0, denom)))
    h = tl.where(slot == kd - 1, P, tl.where(in_draft, h_mid, 0.0))
    passed = (u <= h.to(tl.float64)) & in_draft
    tau = tl.max(tl.where(passed, slot + 1, 0), axis=0)
    return h, tau


@triton.jit
def first_fail(ok, slot, kd, in_draft):
    """Index of the first in-draft slot that is not ok, k' if none (= number accepted)."""
    return tl.min(tl.where(in_draft & (ok == 0), slot, kd), axis=0)


@triton.jit
def race_weights(p, q, offs, scale, use_q, x_t, FULL_Q: tl.constexpr):
    """Weights w of the exponential race at one row (reference ``_emit``): full q
    max(scale * p - q, 0) with q zeroed unless use_q; one-hot: p with x_t zeroed if use_q."""
    if FULL_Q:
        w = tl.maximum(scale * p - tl.where(use_q, q, 0.0), 0.0)
    else:
        w = tl.where(use_q & (offs == x_t), 0.0, p)
    return w


@triton.jit
def race_score(w, e):
    """w / E where w > 0, -1 elsewhere (a zero weight never wins)."""
    return tl.where(w > 0, tl.math.div_rn(w, e), -1.0)


@triton.jit
def race_row_loop(p_row, q_row, e_row, V, scale, use_q, x_t, USE_W: tl.constexpr, FULL_Q: tl.constexpr, BLOCK_V: tl.constexpr):
    """Slow path: the race over a whole row in one program (loops over the vocabulary).

    USE_W: race over the weights of :func:`race_weights`; else over p itself (the sum(w) == 0
    fallback). Returns (best score, its lowest index). Used only when the pass-1 candidate does
    not apply (a non-finite q row changed the decision, or all weights were zero).
    """
    best = tl.full([], -float("inf"), tl.float32)
    best_i = tl.full([], 0, tl.int32)
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + tl.arange(0, BLOCK_V)
        m = offs < V
        p = tl.load(p_row + offs, mask=m, other=0.0).to(tl.float32)
        e = tl.load(e_row + offs, mask=m, other=1.0)
        if USE_W:
            if FULL_Q:
                q = tl.load(q_row + offs, mask=m & use_q, other=0.0).to(tl.float32)
            else:
                q = p
            w = race_weights(p, q, offs, scale, use_q, x_t, FULL_Q)
        else:
            w = p
        s = tl.where(m, race_score(w, e), -float("inf"))
        s_max, s_i = tl.max(s, axis=0, return_indices=True, return_indices_tie_break_left=True)
        better = s_max > best  # strict: an earlier block keeps ties (lowest index)
        best_i = tl.where(better, v0 + s_i, best_i)
        best = tl.where(better, s_max, best)
    return best, best_i


@triton.jit
def reduce_row_argmax(pf_ptr, pi_ptr, b, t, NB, NP, mask, K: tl.constexpr, F: tl.constexpr, I: tl.constexpr):
    """Second stage of an argmax: (max, lowest index) of row t from the per-block partials
    (blocks in chunks of _CHUNK; a later chunk wins only with a strictly larger value)."""
    row = (b * (K + 1) + t) * NB
    best = tl.full([], -float("inf"), tl.float32)
    best_blk = tl.full([], 0, tl.int32)
    for c0 in range(0, NB, _CHUNK):
        vbs = c0 + tl.arange(0, _CHUNK)
        vals = tl.load(pf_ptr + F * NP + row + vbs, mask=mask & (vbs < NB), other=-float("inf"))
        m, blk = tl.max(vals, axis=0, return_indices=True)
        better = m > best
        best_blk = tl.where(better, c0 + blk, best_blk)
        best = tl.where(better, m, best)
    idx = tl.load(pi_ptr + I * NP + row + best_blk, mask=mask, other=0)
    return best, idx


@triton.jit
def sum_rows(pf_ptr, pi_ptr, b, NB, NP, kd, slot, K: tl.constexpr, F: tl.constexpr, INT: tl.constexpr):
    """Vector over slots t < k' of the sum over blocks of plane F (int plane if INT)."""
    if INT:
        acc = tl.zeros(slot.shape, dtype=tl.int32)
    else:
        acc = tl.zeros(slot.shape, dtype=tl.float32)
    for t in tl.static_range(K):
        row = (b * (K + 1) + t) * NB
        if INT:
            v = tl.full([], 0, tl.int32)
        else:
            v = tl.full([], 0.0, tl.float32)
        for c0 in range(0, NB, _CHUNK):
            vbs = c0 + tl.arange(0, _CHUNK)
            m = (vbs < NB) & (t < kd)
            if INT:
                v += tl.sum(tl.load(pi_ptr + F * NP + row + vbs, mask=m, other=0), axis=0)
            else:
                v += tl.sum(tl.load(pf_ptr + F * NP + row + vbs, mask=m, other=0.0), axis=0)
        acc = tl.where(slot == t, v, acc)
    return acc


@triton.jit
def block_full_rho(pf_ptr, pi_ptr, b, NB, NP, kd, slot, valid, P, K: tl.constexpr, K_P2: tl.constexpr):
    """Block verification, full q: rho_{t-1} = sum_x max(P_{t} p_t - q_t, 0) for 1 <= t < k' from the
    pass kernel's partials (plane F_RQ; F_RP where the q row is not finite), 0 once P is 0
    (reference ``_block_rho``). valid, P: vectors over slots. Returns rho [K_P2]."""
    r_q = sum_rows(pf_ptr, pi_ptr, b, NB, NP, kd, slot, K, F_RQ, False)
    r_p = sum_rows(pf_ptr, pi_ptr, b, NB, NP, kd, slot, K, F_RP, False)
    rho = tl.zeros([K_P2], dtype=tl.float32)
    for t in tl.static_range(1, K):
        r_t = tl.where(pick(valid.to(tl.int32), slot, t) > 0, pick(r_q, slot, t), pick(r_p, slot, t))
        r_t = tl.where((t < kd) & (pick(P, slot, t - 1) > 0), r_t, 0.0)
        rho = tl.where(slot == t - 1, r_t, rho)
    return rho
