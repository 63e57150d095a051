"""Fused decoder layers for Llama-style targets on CUDA: one q|k|v and one gate|up matrix-vector product per layer and
the elementwise work in four Triton kernels (:mod:`specviz.kernels.fused_decode`), without torch.compile.

gpt-fast (pytorch-labs, ``model.py``) runs Llama with a fused ``wqkv`` and torch.compile; vLLM fuses q|k|v and
gate|up (``QKVParallelLinear``, ``MergedColumnParallelLinear``) and calls fused RMSNorm / rotary / SiLU-and-multiply
kernels. Here transformers' own model stays in charge (its embedding, rotary embedding, mask, static cache, attention
interface, final norm and LM head, its hidden-state capture for feature taps): :func:`fuse_decoder_layers` only
swaps each decoder layer's class for a subclass with :func:`_fused_forward` and re-lays its weights so that the q, k
and v (and gate and up) weights are row blocks of one tensor. The module's parameters become views of those blocks,
so memory does not grow, ``state_dict`` and ``load_state_dict`` keep working, and transformers' own forward still runs
on the same storage. A layer runs transformers' forward (the fallback) under torch.compile's tracing (Inductor fuses
the elementwise work itself but keeps five GEMVs), in training, with autograd through the weights, under autocast,
when attention weights are asked for, on tensors not on CUDA, and once its views were replaced (a ``.to()``; a later
:func:`fuse_decoder_layers` fuses again). :func:`unfuse_decoder_layers` undoes the class swap.

Families: ``model_type`` in :data:`FAMILIES` (Llama, Mistral and Qwen2 share Llama's layer: pre-norm RMSNorm,
rotary over the whole head, SiLU MLP) with transformers' own layer classes and plain ``nn.Linear`` fp16 / bf16 /
fp32 projections, every layer with full attention. Anything else (sliding windows, q/k norms, partial rotary, other
activations, quantised or custom projections) keeps transformers' layer and :func:`fuse_decoder_layers` says why.

Numerics: the same operations, rounded where transformers rounds; what differs is how cuBLAS splits a wider GEMV,
the fp32 reduction order inside the norm and Triton's fp32 ``rsqrt`` / ``exp`` (a few fp32 ulps before rounding to
the model's dtype), so logits can differ from transformers' forward in the last bits (as compiled graphs do).
Greedy speculative decoding and method none run through the same fused layers, so their outputs stay equal token for
token in fp32 (tests/test_fused_layers.py).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
from torch import nn

from .attention import attention_layout

FAMILIES = ("llama", "mistral", "qwen2")
FUSED_ENV = "SPECVIZ_FUSED"  # "off": fuse_decoder_layers unfuses instead (the default runner keeps transformers')
ALLOW_CPU = False  # tests: run the fused kernels on CPU tensors too (Triton's interpreter, TRITON_INTERPRET=1)


@dataclass
class _Fused:
    """A layer's fused weights: wqkv [(Hq + 2 Hk) * D, H] (rows q | k | v), bqkv or None, wgu [2 I, H] (gate | up),
    bgu or None; head counts and head_dim; the layer's transformers class (whose forward is the fallback), its
    family's eager attention, the q/k/v and gate/up modules and the data pointers of their weights and biases when
    those were made views."""

    wqkv: torch.Tensor
    bqkv: torch.Tensor | None
    wgu: torch.Tensor
    bgu: torch.Tensor | None
    q_heads: int
    kv_heads: int
    head_dim: int
    hf_class: type
    eager_attention: object
    mods: tuple[nn.Linear, ...]  # q, k, v, gate, up: children of the layer's own children (no reference cycle)
    views: tuple[int, ...]

    def intact(self, layer: nn.Module) -> bool:
        """Whether every q/k/v and gate/up module, weight and bias is still the view made at fusing time (a ``.to()``,
        an assigning ``load_state_dict`` or a replaced weight or module breaks that). Reads ``_parameters`` and
        ``_modules`` directly: this runs at every eager forward of every layer."""
        return _linears(layer) == self.mods and _pointers(self.mods) == self.views

    def runs_on(self, layer: nn.Module, x: torch.Tensor, kwargs: dict) -> bool:
        """Whether this forward takes the fused path: inference only (not training, no autograd through the weights,
        no autocast, no attention weights asked for), not while torch.compile traces, on CUDA (or ALLOW_CPU), with
        the fused views intact."""
        if torch.compiler.is_compiling() or not (x.is_cuda or ALLOW_CPU) or x.device != self.wqkv.device:
            return False
        attentions = kwargs.get("output_attentions", getattr(layer.self_attn.config, "output_attentions", False))
        if layer.training or attentions or torch.is_autocast_enabled(x.device.type):
            return False
        if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in layer.parameters())):
            return False
        return self.intact(layer)


def _linears(layer: nn.Module) -> tuple[nn.Linear, ...]:
    """q, k, v, gate, up of a layer, read from ``_modules`` (no ``nn.Module.__getattr__``: a hot path)."""
    attn, mlp = layer._modules["self_attn"]._modules, layer._modules["mlp"]._modules
    return attn["q_proj"], attn["k_proj"], attn["v_proj"], mlp["gate_proj"], mlp["up_proj"]


def _pointers(mods: tuple[nn.Linear, ...]) -> tuple[int, ...]:
    out = []
    for m in mods:
        for name in ("weight", "bias"):
            t = m._parameters.get(name)
            out.append(t.data_ptr() if t is not None else 0)
    return tuple(out)


def _fused_apply(self, fn, recurse=True):
    """``nn.Module._apply`` (``.to()``, ``.half()``...), then the fused state dropped if the views were replaced: its
    tensors would otherwise keep the old copy of the q/k/v and gate/up weights alive."""
    fused = self.__dict__["_specviz_fused"]
    out = fused.hf_class._apply(self, fn, recurse)
    if not fused.intact(self):
        unfuse_layer(self)
    return out


def _fused_reduce_ex(self, protocol):
    """Pickle and deepcopy as transformers' class, without the fused state (the generated class has no importable
    name; the copy is unfused and a later fuse re-lays it)."""
    state = {k: v for k, v in self.__dict__.items() if k != "_specviz_fused"}
    return _rebuild_layer, (self.__dict__["_specviz_fused"].hf_class, state)


def _rebuild_layer(cls: type, state: dict) -> nn.Module:
    layer = cls.__new__(cls)
    layer.__setstate__(state)
    return layer


_FUSED_CLASSES: dict[type, type] = {}


def _fused_class(cls: type) -> type:
    """A subclass of transformers' decoder-layer class ``cls`` whose forward is :func:`_fused_forward` (a class
    swap rather than a bound method on the instance, which would keep the layer alive in a reference cycle)."""
    if cls not in _FUSED_CLASSES:
        _FUSED_CLASSES[cls] = type(f"Fused{cls.__name__}", (cls,), {"forward": _fused_forward, "_apply": _fused_apply,
                                                                   "__reduce_ex__": _fused_reduce_ex,
                                                                   "__module__": __name__})
    return _FUSED_CLASSES[cls]


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
    quantizer = getattr(model, "hf_quantizer", None)
    # GGUF is dequantised on load (unless a GGUF matmul kernel keeps it packed: GgufLinear, refused below)
    if quantizer is not None and not type(quantizer).__name__.startswith("Gguf"):
        return f"quantised weights ({type(quantizer).__name__})"
    for layer in layers:
        cls = layer._specviz_fused.hf_class if hasattr(layer, "_specviz_fused") else type(layer)
        if not cls.__module__.startswith(tuple(f"transformers.models.{f}." for f in FAMILIES)):
            return f"decoder layer class {cls.__module__}.{cls.__name__} is not transformers' own"
        if "forward" in layer.__dict__ or hasattr(layer, "_hf_hook"):  # accelerate's hooks set the instance's forward
            return "decoder layers carry forward hooks of their own (accelerate device maps)"
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        lins = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")] + \
            [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if attn is None or mlp is None or not all(type(m) is nn.Linear for m in lins):
            return f"layer {getattr(attn, 'layer_idx', '?')} is not laid out as Llama's (plain nn.Linear projections)"
        if not all(m.weight.dtype.is_floating_point and m.weight.dtype.itemsize >= 2 for m in lins):
            return "projection weights are not fp16 / bf16 / fp32"
        for norm in (getattr(layer, "input_layernorm", None), getattr(layer, "post_attention_layernorm", None)):
            if not type(norm).__name__.endswith("RMSNorm") or not hasattr(norm, "variance_epsilon"):
                return f"layer norm {type(norm).__name__}, not Llama's RMSNorm"
        if getattr(attn, "sliding_window", None) or hasattr(attn, "q_norm"):
            return "sliding window or q/k norms in attention"
        if len({m.bias is None for m in lins[:3]}) > 1 or len({m.bias is None for m in lins[4:6]}) > 1:
            return "q/k/v (or gate/up) projections disagree on biases"
    rot = getattr(model.model, "rotary_emb", None)
    inv = getattr(rot, "inv_freq", None)
    head_dim = layers[0].self_attn.head_dim
    if inv is None or inv.numel() * 2 != head_dim:
        return "rotary embedding not over the whole head"
    return None


def _adjacent(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """The rows of ``tensors`` as one tensor without a copy when they already lie back to back in one storage (a
    layer fused before and unfused: captured CUDA graphs of other runners still read that storage), else None."""
    first = tensors[0]
    offset, storage = first.storage_offset(), first.untyped_storage().data_ptr()
    for t in tensors:
        if t.untyped_storage().data_ptr() != storage or t.storage_offset() != offset or not t.is_contiguous() \
                or t.dtype != first.dtype or t.shape[1:] != first.shape[1:]:
            return None
        offset += t.numel()
    rows = sum(t.shape[0] for t in tensors)
    return first.detach().as_strided((rows, *first.shape[1:]), first.stride(), first.storage_offset())


def _stack(mods: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The Linear layers' weights (and biases) as one tensor by rows, each module's parameters made views of it
    (reused when they already are); returns (weight, bias or None)."""
    weights = [m.weight.detach() for m in mods]
    weight = _adjacent(weights)
    weight = torch.cat(weights) if weight is None else weight
    bias = None
    if mods[0].bias is not None:
        biases = [m.bias.detach() for m in mods]
        bias = _adjacent(biases)
        bias = torch.cat(biases) if bias is None else bias
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
    else why not (nothing is changed then). ``SPECVIZ_FUSED=off`` unfuses instead. Fusing a layer whose weights
    are not yet one tensor allocates it and frees the separate ones: CUDA graphs captured before over this model
    (other runners') must not replay after that, so fuse before capturing, as :class:`StaticRunner` does."""
    if os.environ.get(FUSED_ENV, "").lower() in ("off", "0", "false"):
        unfuse_decoder_layers(model)
        return f"{FUSED_ENV}=off"
    reason = why_not_fusable(model)
    if reason is not None:
        return reason
    relaid = False
    for layer in model.model.layers:
        old = getattr(layer, "_specviz_fused", None)
        if old is not None and old.intact(layer):
            continue
        hf_class = old.hf_class if old is not None else type(layer)
        unfuse_layer(layer)
        del old  # its tensors (a stale copy after a .to()) go now, before the cache is emptied
        attn, mlp = layer.self_attn, layer.mlp
        # inference_mode(False): fused inside inference mode, the new parameters would be inference tensors for good
        with torch.inference_mode(False), torch.no_grad():
            wqkv, bqkv = _stack([attn.q_proj, attn.k_proj, attn.v_proj])
            wgu, bgu = _stack([mlp.gate_proj, mlp.up_proj])
        head_dim = attn.head_dim
        eager = getattr(sys.modules[hf_class.__module__], "eager_attention_forward")
        mods = _linears(layer)
        layer._specviz_fused = _Fused(wqkv, bqkv, wgu, bgu, attn.q_proj.weight.shape[0] // head_dim,
                                      attn.k_proj.weight.shape[0] // head_dim, head_dim, hf_class, eager, mods,
                                      _pointers(mods))
        layer.__class__ = _fused_class(hf_class)
        relaid = True
    if relaid and model.model.layers[0]._specviz_fused.wqkv.is_cuda:
        torch.cuda.empty_cache()  # the replaced per-projection blocks: free memory is what the precompile child sizes
    return None


def unfuse_layer(layer: nn.Module) -> None:
    """Give one layer transformers' class back and drop its fused state (its parameters stay views of one tensor,
    which transformers' forward reads as it reads any parameter)."""
    fused = layer.__dict__.pop("_specviz_fused", None)
    if fused is not None:
        layer.__class__ = fused.hf_class


def unfuse_decoder_layers(model: nn.Module) -> None:
    """:func:`unfuse_layer` on every decoder layer of ``model``; a no-op on a model never fused."""
    for layer in getattr(getattr(model, "model", None), "layers", None) or ():
        unfuse_layer(layer)


def is_fused(model: nn.Module) -> bool:
    """Whether ``model``'s layers run fused (:func:`fuse_decoder_layers`, views intact) on CUDA inputs."""
    layers = getattr(getattr(model, "model", None), "layers", None) or ()
    return bool(layers) and all(getattr(layer, "_specviz_fused", None) is not None and
                                layer._specviz_fused.intact(layer) for layer in layers)


def _fused_forward(self, hidden_states: torch.Tensor, attention_mask=None, position_ids=None, past_key_values=None,
                   use_cache: bool | None = False, position_embeddings=None, **kwargs) -> torch.Tensor:
    """A Llama decoder layer (transformers' ``LlamaDecoderLayer.forward`` contract: hidden_states [B, n, H] in,
    the same shape out) with fused projections and kernels."""
    from .kernels.fused_decode import rms_norm, rope_, silu_mul

    f: _Fused = self._specviz_fused
    cos, sin = position_embeddings if position_embeddings is not None else (None, None)  # [B or 1, n, D] each
    if cos is None or cos.dtype != hidden_states.dtype or not f.runs_on(self, hidden_states, kwargs):
        return f.hf_class.forward(self, hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                                  past_key_values=past_key_values, use_cache=use_cache,
                                  position_embeddings=position_embeddings, **kwargs)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    attn = self.self_attn
    shape = hidden_states.shape
    x = hidden_states.reshape(-1, shape[-1])  # [T, H]
    h, _ = rms_norm(x, self.input_layernorm.weight, self.input_layernorm.variance_epsilon)
    qkv = nn.functional.linear(h, f.wqkv, f.bqkv)  # [T, (Hq + 2 Hk) * D]
    rows = (*shape[:-1], f.head_dim)  # a batch's rows share the tables when the model made the positions
    rope_(qkv, cos.expand(rows).reshape(-1, f.head_dim), sin.expand(rows).reshape(-1, f.head_dim),
          f.q_heads + f.kv_heads, f.head_dim)
    hq, hk = f.q_heads * f.head_dim, f.kv_heads * f.head_dim
    heads = (*shape[:-1], -1, f.head_dim)
    q = qkv[:, :hq].view(heads).transpose(1, 2)  # [B, Hq, n, D]
    k = qkv[:, hq:hq + hk].view(heads).transpose(1, 2)
    v = qkv[:, hq + hk:].view(heads).transpose(1, 2)
    if past_key_values is not None:
        k, v = past_key_values.update(k, v, attn.layer_idx)
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation, f.eager_attention)
    out, _ = interface(attn, q, k, v, attention_mask, dropout=0.0, scaling=attn.scaling, position_ids=position_ids,
                       **kwargs)  # as transformers' layer passes it (flash attention reads packed sequences from it)
    o = attn.o_proj(out.reshape(x.shape[0], -1))  # [T, H]
    h, x = rms_norm(o, self.post_attention_layernorm.weight, self.post_attention_layernorm.variance_epsilon,
                    residual=x)
    act = silu_mul(nn.functional.linear(h, f.wgu, f.bgu))  # [T, I]
    return (x + self.mlp.down_proj(act)).view(shape)
