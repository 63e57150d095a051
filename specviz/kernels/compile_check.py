"""Compile every kernel configuration for sm_90 without a GPU (``triton.compile`` + ASTSource).

The interpreter accepts code the real compiler rejects (non-constexpr globals, some type mixes),
so CI also compiles each kernel for Hopper. Run ``python -m specviz.kernels.compile_check`` (with
TRITON_INTERPRET unset or 0): prints one JSON object per line, {"kernel", "config", "ok",
"error", "shared", "ptx_fma", "ptx_div_rn", "ptx_div_approx"} (counts of fused multiply-adds, IEEE
and approximate fp32 divisions in the PTX: exactness against PyTorch needs no fma from ``a * b - c``
and IEEE quotients), and exits non-zero if any configuration failed to compile. tests/test_kernels_compile.py runs it in a subprocess.
"""

from __future__ import annotations

import json
import sys
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from specviz.kernels import fused_decode, ngram_matcher, rejection_sampler
from specviz.kernels.sampler_helpers import METHOD_CODES

TARGET = GPUTarget("cuda", 90, 32)


def _sampler_configs():
    """(kernel, signature, constexprs, options, label) for the sampler kernels."""
    for method, code in METHOD_CODES.items():
        for full in (True, False):
            for dtype in ("fp32", "bf16"):
                if dtype == "bf16" and method not in ("standard", "block"):
                    continue  # the dtype only changes the loads: two methods suffice
                K, bv = 4, 4096
                const = dict(K=K, K_P2=4, METHOD=code, FULL_Q=full, BLOCK_V=bv)
                common = {
                    "p_ptr": f"*{dtype}", "q_ptr": f"*{dtype}", "ids_ptr": "*i64", "u_ptr": "*fp64",
                    "e_ptr": "*fp32", "rate_ptr": "*fp64", "pf_ptr": "*fp32", "pi_ptr": "*i32",
                }  # fmt: skip
                scalars = {"B": "i32", "V": "i32", "NB": "i32"}
                label = f"{method}/{'full' if full else 'onehot'}/{dtype}"
                two = method == "block" and full
                const_p = const | {"TWO_PASS": two}
                sig_p = {**common, **scalars, **{k: "constexpr" for k in const_p}}
                yield rejection_sampler._sampler_pass_kernel, sig_p, const_p, {"num_warps": 8}, label
                if two:  # the two-pass block kernels
                    dec = {"tau_ptr": "*i32", "scale_ptr": "*fp32"}
                    c2 = {"K": K, "K_P2": 4}
                    sig_d = {k: common[k] for k in ("p_ptr", "q_ptr", "ids_ptr", "u_ptr", "pf_ptr", "pi_ptr")}
                    sig_d = {**sig_d, **dec, **scalars, **{k: "constexpr" for k in c2}}
                    yield rejection_sampler._block_decide_kernel, sig_d, c2, {"num_warps": 4}, label
                    sig_r = {k: common[k] for k in ("p_ptr", "q_ptr", "ids_ptr", "e_ptr")}
                    sig_r = {**sig_r, **dec, "pf_ptr": "*fp32", "pi_ptr": "*i32", **scalars,
                             **{k: "constexpr" for k in (*c2, "BLOCK_V")}}
                    yield rejection_sampler._block_race_kernel, sig_r, c2 | {"BLOCK_V": bv}, {"num_warps": 8}, label
                outs = {
                    "out_ids_ptr": "*i64", "out_kind_ptr": "*i8", "out_nacc_ptr": "*i64", "out_ndraft_ptr": "*i64",
                    "out_px_ptr": "*fp32", "out_qx_ptr": "*fp32", "out_ap_ptr": "*fp32", "out_acc_ptr": "*u8",
                    "out_z_ptr": "*fp32", "out_P_ptr": "*fp32", "out_rho_ptr": "*fp32", "out_h_ptr": "*fp32",
                }  # fmt: skip
                const_f = {k: v for k, v in const.items() if k != "BLOCK_V"} | {"K1_P2": 8}
                sig_f = {**common, **outs, **scalars, **{k: "constexpr" for k in const_f}}
                yield rejection_sampler._sampler_finalize_kernel, sig_f, const_f, {"num_warps": 4}, label


def _ngram_configs():
    const = dict(BLOCK_L=ngram_matcher.CUDA_BLOCK_L)
    ints = {"MIN_N": "i32", "MAX_N": "i32"}
    sig = {"tok_ptr": "*i64", "len_ptr": "*i64", "part_ptr": "*i32", "tok_stride": "i32", "NUM_CHUNKS": "i32", **ints}
    yield ngram_matcher._ngram_first_end_kernel, {**sig, **{k: "constexpr" for k in const}}, const, {"num_warps": 4}, "i64"
    const_f = dict(CHUNK_BLOCK=ngram_matcher.CHUNK_BLOCK, N_P2=ngram_matcher.MAX_LOOKUP, K_P2=ngram_matcher.MAX_DRAFT)
    sig_f = {
        "tok_ptr": "*i64", "len_ptr": "*i64", "part_ptr": "*i32", "draft_ptr": "*i64", "num_draft_ptr": "*i64",
        "ngram_len_ptr": "*i64", "pos_ptr": "*i64", "tok_stride": "i32", "NUM_CHUNKS": "i32", "K": "i32", **ints,
    }  # fmt: skip
    yield ngram_matcher._ngram_finalize_kernel, {**sig_f, **{k: "constexpr" for k in const_f}}, const_f, {"num_warps": 1}, "i64"


def _fused_configs():
    """The fused decoder-layer kernels at the Llama-3.1-8B shape (hidden 4096, head_dim 128, MLP 14336), bf16."""
    for res in (False, True):
        sig = {"x_ptr": "*bf16", "r_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "res_ptr": "*bf16",
               "x_stride": "i32", "r_stride": "i32", "y_stride": "i32", "res_stride": "i32", "eps": "fp32"}
        const = dict(D=4096, BLOCK=4096, HAS_RES=res)
        yield fused_decode._rms_norm_kernel, {**sig, **{k: "constexpr" for k in const}}, const, {"num_warps": 4}, \
            f"bf16/residual={res}"
    sig = {"qkv_ptr": "*bf16", "cos_ptr": "*bf16", "sin_ptr": "*bf16", "qkv_stride": "i32", "cs_stride": "i32"}
    const = dict(HALF=64, BLOCK=64)
    yield fused_decode._rope_kernel, {**sig, **{k: "constexpr" for k in const}}, const, {"num_warps": 1}, "bf16"
    sig = {"gu_ptr": "*bf16", "out_ptr": "*bf16", "gu_stride": "i32", "out_stride": "i32"}
    const = dict(I=14336, BLOCK=1024)
    yield fused_decode._silu_mul_kernel, {**sig, **{k: "constexpr" for k in const}}, const, {"num_warps": 4}, "bf16"


def compile_one(fn, signature, constexprs, options) -> dict:
    """Compile one kernel for sm_90; returns a JSON-able record (never raises)."""
    t0 = time.perf_counter()
    rec = {"kernel": fn.__name__}
    try:
        src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        k = triton.compile(src, target=TARGET, options={**options, "enable_fp_fusion": False})
        ptx = k.asm.get("ptx", "")
        rec.update(ok=True, shared=getattr(k.metadata, "shared", None), ptx_fma=ptx.count("fma.rn.f32"))
        rec.update(ptx_div_rn=ptx.count("div.rn.f32"), ptx_div_approx=ptx.count("div.full.f32") + ptx.count("div.approx.f32"))
    except Exception as e:  # report, do not stop: the test names the failing configuration
        rec.update(ok=False, error=f"{type(e).__name__}: {e}"[:2000])
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    return rec


def main() -> int:
    failed = 0
    for fn, sig, const, opts, label in [*_sampler_configs(), *_ngram_configs(), *_fused_configs()]:
        rec = compile_one(fn, sig, const, opts)
        rec["config"] = label
        failed += not rec["ok"]
        print(json.dumps(rec), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
