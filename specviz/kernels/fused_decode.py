"""Triton kernels that fuse a Llama-style decoder layer's elementwise work: RMSNorm (with the residual add before
it), rotary embedding and SiLU-and-multiply. Used by :mod:`specviz.fused_layers` on CUDA.

Why: at batch 1 a decode token is a chain of small kernels. Uncompiled, transformers' Llama layer launches about 35
elementwise kernels (casts, powers, means, the rotary halves, adds) beside its 7 matrix-vector products, and on the
Llama-3.1-8B shape they cost about a fifth of the token's GPU time (results/gpu). These kernels do the same
arithmetic in 4 launches per layer without torch.compile, so the default runner needs no compile wait.

Each kernel rounds where transformers' PyTorch ops round (every intermediate that PyTorch stores in the model's
dtype is rounded to it here too) and is launched with ``enable_fp_fusion=False`` so ``a * b + c`` rounds twice, as
two PyTorch ops do. What still differs from PyTorch's kernels: the order of the fp32 sum of squares and the fp32
``rsqrt`` / ``exp`` implementations (Triton's ``exp`` is ``ex2.approx``: a few fp32 ulps before rounding to the
model's dtype; libdevice's exact ``exp`` has no interpreter version for the CPU tests); tests hold each kernel to
its PyTorch reference (:func:`rms_norm_reference`, :func:`rope_reference`, :func:`silu_mul_reference`, written from
transformers' ``modeling_llama.py``).

The number of rows is only the launch grid and row strides are kept out of Triton's integer specialisation, so one
compiled variant serves a model shape and dtype whatever the number of tokens; widths are compile-time constants.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_RUNTIME = ["x_stride", "r_stride", "y_stride", "res_stride", "qkv_stride", "cs_stride", "gu_stride", "out_stride"]


@triton.jit(do_not_specialize=_RUNTIME)
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, res_ptr, x_stride, r_stride, y_stride, res_stride, eps,
                     D: tl.constexpr, BLOCK: tl.constexpr, HAS_RES: tl.constexpr):
    """One row per program: [res = x + r (rounded to x's dtype)], y = w * dtype(x * rsqrt(mean(x^2) + eps))."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RES:  # transformers' `residual + hidden_states`, stored in the model's dtype before the norm reads it
        r = tl.load(r_ptr + row * r_stride + cols, mask=mask, other=0.0)
        x = (r.to(tl.float32) + x.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_ptr + row * res_stride + cols, x, mask=mask)
    xf = x.to(tl.float32)
    var = tl.sum(xf * xf, axis=0) * (1.0 / D)  # PyTorch's mean multiplies by 1 / D
    normed = (xf * tl.math.rsqrt(var + eps)).to(x_ptr.dtype.element_ty)  # `hidden_states.to(input_dtype)`
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    y = w.to(tl.float32) * normed.to(tl.float32)
    tl.store(y_ptr + row * y_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=_RUNTIME)
def _rope_kernel(qkv_ptr, cos_ptr, sin_ptr, qkv_stride, cs_stride, HALF: tl.constexpr, BLOCK: tl.constexpr):
    """In place, one (row, head) per program over q's and k's heads: x * cos + rotate_half(x) * sin, each product
    and the sum rounded to the dtype (transformers' ``apply_rotary_pos_emb``)."""
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    j = tl.arange(0, BLOCK)
    mask = j < HALF
    base = qkv_ptr + row * qkv_stride + head * (2 * HALF)
    x1 = tl.load(base + j, mask=mask, other=0.0)
    x2 = tl.load(base + HALF + j, mask=mask, other=0.0)
    c1 = tl.load(cos_ptr + row * cs_stride + j, mask=mask, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + row * cs_stride + HALF + j, mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + row * cs_stride + j, mask=mask, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + row * cs_stride + HALF + j, mask=mask, other=0.0).to(tl.float32)
    dt = qkv_ptr.dtype.element_ty
    a1 = (x1.to(tl.float32) * c1).to(dt).to(tl.float32)
    b1 = (-x2.to(tl.float32) * s1).to(dt).to(tl.float32)  # rotate_half: (-x2, x1)
    a2 = (x2.to(tl.float32) * c2).to(dt).to(tl.float32)
    b2 = (x1.to(tl.float32) * s2).to(dt).to(tl.float32)
    tl.store(base + j, (a1 + b1).to(dt), mask=mask)
    tl.store(base + HALF + j, (a2 + b2).to(dt), mask=mask)


@triton.jit(do_not_specialize=_RUNTIME)
def _silu_mul_kernel(gu_ptr, out_ptr, gu_stride, out_stride, I: tl.constexpr, BLOCK: tl.constexpr):
    """One (row, block of columns) per program: out = dtype(dtype(silu(gate)) * up), gate | up = the row's halves
    (transformers' ``act_fn(gate_proj(x)) * up_proj(x)``, SiLU as PyTorch's x / (1 + exp(-x)) in fp32)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    g = tl.load(gu_ptr + row * gu_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * gu_stride + I + cols, mask=mask, other=0.0).to(tl.float32)
    dt = out_ptr.dtype.element_ty
    act = tl.math.div_rn(g, 1.0 + tl.exp(-g)).to(dt).to(tl.float32)
    tl.store(out_ptr + row * out_stride + cols, (act * u).to(dt), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, width] without a copy; raises ValueError when the last dimension is not contiguous."""
    if x.stride(-1) != 1:
        raise ValueError("fused kernels need the last dimension contiguous")
    return x.reshape(-1, x.shape[-1])


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """RMSNorm of x [..., D] (bf16 / fp16 / fp32) with weight [D]: (y, None), or with ``residual`` (same shape as
    x) (y, residual + x), the norm then read from that rounded sum. y's dtype is PyTorch's promotion of weight's and
    x's (transformers' ``self.weight * hidden_states.to(input_dtype)``). Raises ValueError on mismatched widths."""
    d = x.shape[-1]
    if weight.shape != (d,) or weight.stride() != (1,) or (residual is not None and residual.shape != x.shape):
        raise ValueError(f"rms_norm: x {tuple(x.shape)}, weight {tuple(weight.shape)}, residual "
                         f"{None if residual is None else tuple(residual.shape)}")
    xr = _rows(x)
    y = torch.empty(xr.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    res = torch.empty_like(xr) if residual is not None else None
    rr = _rows(residual) if residual is not None else xr
    _rms_norm_kernel[(xr.shape[0],)](
        xr, rr, weight, y, res if res is not None else y, xr.stride(0), rr.stride(0), y.stride(0),
        (res if res is not None else y).stride(0), float(eps), D=d, BLOCK=triton.next_power_of_2(d),
        HAS_RES=residual is not None, num_warps=4 if d <= 4096 else 8, enable_fp_fusion=False)
    shape = x.shape
    return y.view(shape), (res.view(shape) if res is not None else None)


def rope_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotated_heads: int, head_dim: int) -> None:
    """Rotary embedding in place on the first ``rotated_heads`` heads of each row of qkv [T, W] (W >= rotated_heads
    * head_dim; q's heads then k's, as a fused q|k|v projection lays them out), with cos / sin [T, head_dim] in
    qkv's dtype (transformers' rotary embedding output, halves repeated). Raises ValueError on other shapes or
    dtypes."""
    if head_dim % 2 or cos.shape != (qkv.shape[0], head_dim) or sin.shape != cos.shape or cos.dtype != qkv.dtype \
            or sin.dtype != qkv.dtype or qkv.shape[1] < rotated_heads * head_dim or cos.stride(-1) != 1 \
            or sin.stride() != cos.stride():
        raise ValueError(f"rope_: qkv {tuple(qkv.shape)}, cos {tuple(cos.shape)}, sin {tuple(sin.shape)}, "
                         f"{rotated_heads} heads of {head_dim}")
    if qkv.stride(-1) != 1:
        raise ValueError("rope_: qkv's last dimension must be contiguous")
    half = head_dim // 2
    _rope_kernel[(qkv.shape[0], rotated_heads)](qkv, cos, sin, qkv.stride(0), cos.stride(0), HALF=half,
                                                 BLOCK=triton.next_power_of_2(half), num_warps=1,
                                                 enable_fp_fusion=False)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of gate_up [..., 2I] (gate = the first I columns): [..., I] in gate_up's dtype."""
    rows = _rows(gate_up)
    if rows.shape[1] % 2:
        raise ValueError(f"silu_mul: an odd width {rows.shape[1]} is not gate | up")
    inter = rows.shape[1] // 2
    out = torch.empty((rows.shape[0], inter), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(inter))
    _silu_mul_kernel[(rows.shape[0], triton.cdiv(inter, block))](rows, out, rows.stride(0), out.stride(0), I=inter,
                                                                   BLOCK=block, num_warps=4, enable_fp_fusion=False)
    return out.view(*gate_up.shape[:-1], inter)


# ---- references, written from transformers' modeling_llama.py (LlamaRMSNorm, apply_rotary_pos_emb, LlamaMLP) ----
def rms_norm_reference(x, weight, eps, residual=None):
    """transformers' ``residual + hidden_states`` then ``LlamaRMSNorm.forward``: (y, sum or None)."""
    if residual is not None:
        x = residual + x
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype), (x if residual is not None else None)


def rope_reference(x, cos, sin):
    """transformers' ``q * cos + rotate_half(q) * sin`` on x [..., D] with cos / sin broadcastable to it."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def silu_mul_reference(gate_up):
    """transformers' ``act_fn(gate) * up`` (SiLU) on gate_up [..., 2I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
