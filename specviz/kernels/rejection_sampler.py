"""Triton batched rejection sampler: greedy, standard, block and synthetic verification.

Same contract and results as the PyTorch reference :mod:`specviz.sampling.reference` (read its
docstring and docs/design/algorithms.md "Verification methods"): token ids, counts, kinds and flags are
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
NVIDIA H200 (sm_90, torch 2.11 + triton 3.6): the same equality tests with compiled kernels passed;
speed in results/kernels/README.md (at B=64, K=4, V=128256 fp32 the standard
sampler reads at 0.72 of copy bandwidth in GPU time; block costs 2.2x standard there).
"""

from __future__ import annotations

import functools

import torch
import triton

from specviz.kernels.sampler_helpers import (
    METHOD_CODES,
    NUM_F,
    NUM_I,
)
from specviz.sampling.rates import conditional_rates
from specviz.sampling.types import BlockDetails, RejectionOutput, SamplerNoise

from specviz.kernels.sampler_kernels import (  # noqa: F401 (the kernels, also as this module's attributes)
    _block_decide_kernel,
    _block_race_kernel,
    _sampler_finalize_kernel,
    _sampler_pass_kernel,
)


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
