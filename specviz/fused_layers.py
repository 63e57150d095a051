"""Fused decoder layers for Llama-style targets on CUDA: one q|k|v and one gate|up matrix-vector product per layer and
the elementwise work in four Triton kernels (:mod:`specviz.kernels.fused_decode`), without torch.compile.

gpt-fast (pytorch-labs, ``model.py``) runs Llama with a fused ``wqkv`` and torch.compile; vLLM fuses q|k|v and
gate|up (``QKVParallelLinear``, ``MergedColumnParallelLinear``) and calls fused RMSNorm / rotary / SiLU-and-multiply
kernels. Here transformers' own model stays in charge (its embedding, rotary embedding, mask, static cache, attention
interface, final norm and LM head, its hidden-state capture for feature taps): :func:`fuse_decoder_layers` only
replaces each decoder layer's ``forward`` and re-lays its weights so that the q, k and v (and gate and up) weights
are row blocks of one tensor. The module's parameters become views of those blocks, so memory does not grow,
``state_dict`` and ``load_state_dict`` keep working, and transformers' own forward still runs on the same storage:
under torch.compile (which fuses by itself) and on tensors not on CUDA the layer runs transformers' forward.

Families: ``model_type`` in :data:`FAMILIES` (Llama, Mistral and Qwen2 share Llama's layer: pre-norm RMSNorm,
rotary over the whole head, SiLU MLP), every layer with full attention. Anything else (sliding windows, q/k norms,
partial rotary, other activations, fused projections of its own) keeps transformers' layer and
:func:`fuse_decoder_layers` says why.

Numerics: the same operations, rounded where transformers rounds; what differs is how cuBLAS splits a wider GEMV
and the fp32 reduction order inside the norm, so in bf16 logits can differ from transformers' forward in the last
bits (as compiled graphs do). Greedy speculative decoding and method none run through the same fused layers, so
their outputs stay equal token for token in fp32 (tests/test_fused_layers.py).
"""

from __future__ import annotations

import logging
import os
import sys
import types
from dataclasses import dataclass

import torch
from torch import nn

from .attention import attention_layout

log = logging.getLogger(__name__)
FAMILIES = ("llama", "mistral", "qwen2")
FUSED_ENV = "SPECVIZ_FUSED"  # "off": never fuse (StaticRunner's default then keeps transformers' layers)
ALLOW_CPU = False  # tests: run the fused kernels on CPU tensors too (Triton's interpreter, TRITON_INTERPRET=1)


@dataclass
class _Fused:
    """A layer's fused weights: wqkv [(Hq + 2 Hk) * D, H] (rows q | k | v), bqkv or None, wgu [2 I, H] (gate | up),
    bgu or None; head counts and head_dim; the layer's own class forward (transformers')."""

    wqkv: torch.Tensor
    bqkv: torch.Tensor | None
    wgu: torch.Tensor
    bgu: torch.Tensor | None
    q_heads: int
    kv_heads: int
    head_dim: int
    hf_forward: types.MethodType
    eager_attention: object

    def runs_on(self, layer: nn.Module, x: torch.Tensor) -> bool:
        """Whether this forward can take the fused path: not while torch.compile traces, on CUDA (or ALLOW_CPU),
        and with the module's parameters still the views of the fused tensors (a ``.to()`` replaces them)."""
        if torch.compiler.is_compiling() or not (x.is_cuda or ALLOW_CPU):
            return False
        return (layer.self_attn.q_proj.weight.data_ptr() == self.wqkv.data_ptr()
                and layer.mlp.gate_proj.weight.data_ptr() == self.wgu.data_ptr() and x.device == self.wqkv.device)


def why_not_fusable(model: nn.Module) -> str | None:
    """None when every decoder layer of ``model`` can be fused, else the reason (one line)."""
    cfg = model.config
    family = getattr(cfg, "model_type", "?")
    if family not in FAMILIES:
        return f"family {family!r} is not one of {', '.join(FAMILIES)}"
    if getattr(cfg, "hidden_act", None) != "silu":
        return f"activation {getattr(cfg, 'hidden_act', None)!r}, not silu"
    if attention_layout(cfg).sliding:
        return "sliding-window layers"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers:
        return "no model.layers"
    for layer in layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        names = ("q_proj", "k_proj", "v_proj", "o_proj")
        if attn is None or mlp is None or not all(isinstance(getattr(attn, n, None), nn.Linear) for n in names) \
                or not all(isinstance(getattr(mlp, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")):
            return f"layer {getattr(attn, 'layer_idx', '?')} is not laid out as Llama's"
        for norm in (getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)):
            if not type(norm).__name__.endswith("RMSNorm") or not hasattr(norm, "variance_epsilon"):
                return f"layer norm {type(norm).__name__}, not Llama's RMSNorm"
        if getattr(attn, "sliding_window", None) or hasattr(attn, "q_norm"):
            return "sliding window or q/k norms in attention"
        if (attn.q_proj.bias is None) != (attn.k_proj.bias is None) or (attn.k_proj.bias is None) != (
                attn.v_proj.bias is None) or (mlp.gate_proj.bias is None) != (mlp.up_proj.bias is None):
            return "q/k/v (or gate/up) projections disagree on biases"
    rot = getattr(model.model, "rotary_emb", None)
    inv = getattr(rot, "inv_freq", None)
    head_dim = layers[0].self_attn.head_dim
    if inv is None or inv.numel() * 2 != head_dim:
        return "rotary embedding not over the whole head"
    return None


def _stack(mods: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the Linear layers' weights (and biases) by rows and make each module's parameters views of the
    result; returns (weight, bias or None)."""
    weight = torch.cat([m.weight.detach() for m in mods])
    bias = torch.cat([m.bias.detach() for m in mods]) if mods[0].bias is not None else None
    start = 0
    for m in mods:
        rows = m.weight.shape[0]
        m.weight = nn.Parameter(weight[start:start + rows], requires_grad=m.weight.requires_grad)
        if bias is not None:
            m.bias = nn.Parameter(bias[start:start + rows], requires_grad=m.bias.requires_grad)
        start += rows
    return weight, bias


def fuse_decoder_layers(model: nn.Module) -> str | None:
    """Fuse every decoder layer of ``model`` (in place; idempotent). Returns None when fused (or already fused),
    else why not (nothing is changed then). Disabled by ``SPECVIZ_FUSED=off``."""
    if os.environ.get(FUSED_ENV, "").lower() in ("off", "0", "false"):
        return f"{FUSED_ENV}=off"
    reason = why_not_fusable(model)
    if reason is not None:
        return reason
    for layer in model.model.layers:
        if hasattr(layer, "_specviz_fused"):
            continue
        attn, mlp = layer.self_attn, layer.mlp
        with torch.no_grad():
            wqkv, bqkv = _stack([attn.q_proj, attn.k_proj, attn.v_proj])
            wgu, bgu = _stack([mlp.gate_proj, mlp.up_proj])
        head_dim = attn.head_dim
        eager = getattr(sys.modules[type(attn).__module__], "eager_attention_forward")
        layer._specviz_fused = _Fused(wqkv, bqkv, wgu, bgu, attn.q_proj.weight.shape[0] // head_dim,
                                      attn.k_proj.weight.shape[0] // head_dim, head_dim,
                                      types.MethodType(type(layer).forward, layer), eager)
        layer.forward = types.MethodType(_fused_forward, layer)
    return None


def is_fused(model: nn.Module) -> bool:
    """Whether :func:`fuse_decoder_layers` fused ``model``'s layers."""
    layers = getattr(getattr(model, "model", None), "layers", None) or ()
    return bool(layers) and all(hasattr(layer, "_specviz_fused") for layer in layers)


def _fused_forward(self, hidden_states: torch.Tensor, attention_mask=None, position_ids=None, past_key_values=None,
                   use_cache: bool | None = False, position_embeddings=None, **kwargs) -> torch.Tensor:
    """A Llama decoder layer (transformers' ``LlamaDecoderLayer.forward`` contract: hidden_states [B, n, H] in,
    the same shape out) with fused projections and kernels."""
    from .kernels.fused_decode import rms_norm, rope_, silu_mul

    f: _Fused = self._specviz_fused
    if not f.runs_on(self, hidden_states):
        return f.hf_forward(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                            past_key_values=past_key_values, use_cache=use_cache,
                            position_embeddings=position_embeddings, **kwargs)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    attn = self.self_attn
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])  # [T, H]
    h, _ = rms_norm(x, self.input_layernorm.weight, self.input_layernorm.variance_epsilon)
    qkv = nn.functional.linear(h, f.wqkv, f.bqkv)  # [T, (Hq + 2 Hk) * D]
    cos, sin = position_embeddings  # [B, n, D] each, the model's dtype
    rope_(qkv, cos.reshape(-1, f.head_dim), sin.reshape(-1, f.head_dim), f.q_heads + f.kv_heads, f.head_dim)
    hq, hk = f.q_heads * f.head_dim, f.kv_heads * f.head_dim
    heads = (*shape[:-1], -1, f.head_dim)
    q = qkv[:, :hq].view(heads).transpose(1, 2)  # [B, Hq, n, D]
    k = qkv[:, hq:hq + hk].view(heads).transpose(1, 2)
    v = qkv[:, hq + hk:].view(heads).transpose(1, 2)
    if past_key_values is not None:
        k, v = past_key_values.update(k, v, attn.layer_idx)
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, f.eager_attention)
    out, _ = interface(attn, q, k, v, attention_mask, dropout=0.0, scaling=attn.scaling, **kwargs)
    o = attn.o_proj(out.reshape(x.shape[0], -1))  # [T, H]
    h, x = rms_norm(o, self.post_attention_layernorm.weight, self.post_attention_layernorm.variance_epsilon,
                    residual=x)
    act = silu_mul(nn.functional.linear(h, f.wgu, f.bgu))  # [T, I]
    return (x + self.mlp.down_proj(act)).view(shape)
