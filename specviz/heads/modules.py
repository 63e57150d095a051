"""EAGLE-1 and EAGLE-3 draft heads as small ``nn.Module``s built from transformers' Llama modules.

Both heads are one decoder layer that reads (feature, token) pairs and share the target's
embedding and LM head, **frozen and not saved** in the head file (``head.embed_tokens`` /
``head.lm_head`` are the target's own modules, kept outside the head's parameters and state_dict).

EAGLE-1 (``EagleHead``; methods.md 2.2, EAGLE ``cnets1.py::Model``, vLLM ``llama_eagle.py``)::

    x   = fc(cat(emb(x_{j+1}), f_j))                 fc: Linear(2d, d, bias=True), embedding first
    h   = LlamaDecoderLayer(x) without input_layernorm (post_attention_layernorm kept), no final norm
    logits = W_lm(h)                                 the target's LM head on the UN-normed output
    h is fed back as the next feature.

EAGLE-3 (``Eagle3Head``; methods.md 4.1, EAGLE ``cnets.py``, vLLM ``llama_eagle3.py``)::

    first pass (target features): h_in = fc(cat(a^(l1)_j, a^(l2)_j, a^(l3)_j))   fc: Linear(3d, d, bias=False)
    later steps (own output):     h_in = the previous step's pre-norm output (no fc)
    x   = cat(input_layernorm(emb(x_{j+1})), hidden_norm(h_in))                   [2d] -> q/k/v
    h   = h_in + attn(x);  h = h + mlp(post_attention_layernorm(h))
    logits = W_lm(norm(h))     own final norm, the TARGET's frozen LM head (the published head
                               trains its own lm_head; specviz shares the target's to stay within the
                               8 MB budget for both heads: a project decision, say so in the card)
    h (pre-norm) is fed back.

Step API (the proposer drives it; identical for both heads)::

    hidden, logits = head(features, input_ids, position_ids, cache, from_target=..., attention_mask=None)

    features     float [B, T, F] or [T, F]. from_target=True: target features of the committed
                 positions j (F = head.config.feature_size: d for eagle = final-norm f_j, 3d for
                 eagle3 = taps concatenated in aux_layer_ids order). from_target=False: the head's
                 own fed-back ``hidden`` (F = d). EAGLE-3 applies fc only when from_target=True.
    input_ids    int64 [B, T] or [T]: the token AFTER each feature, x_{j+1} (methods.md 1.1).
    position_ids int64 [B, T] or [T]: the feature's position j (draft step m >= 2 of a chain from
                 committed length n runs at position n+m-2).
    cache        a transformers ``DynamicCache``, or None: no cache, plain causal attention over the
                 T rows (row i sees rows <= i, whatever the positions; SDPA ``is_causal``). With a
                 cache, slot i must hold position i: call with position_ids starting at
                 ``cache.get_seq_length()``; roll back to a committed length Lc with
                 :func:`crop_cache` (``DynamicCache.crop(-n)``). Any object with transformers'
                 ``update(k, v, layer_idx) -> (keys, values)`` and ``get_seq_length()`` works (e.g.
                 a preallocated per-position cache for CUDA graphs); if its ``update`` returns S
                 key slots other than cached + T, pass ``attention_mask`` for those S slots.
    attention_mask bool [B or 1, 1, T, S] (True = attend), S = cached + T keys; default with a
                 cache: key slot s is visible iff s <= the query's position. The training-time
                 test passes its own.
    returns      hidden float [B, T, d] (the head's dtype; fed back as the next feature) and
                 logits float32 [B, T, V] (predicting x_{j+2}); the leading B is dropped for 2-D inputs.

Dtypes: the head runs in its own parameter dtype (fp32 on CPU, bf16 on CUDA); features and the
shared embedding output are cast to it; logits are returned in float32. Shape errors raise ValueError.
No host syncs: the default mask is built with tensor ops from position_ids.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

from specviz.heads.config import HeadConfig, check_matches_target
from specviz.heads.common import Fp32RopeMixin, SharedTargetMixin


def crop_cache(cache, length: int) -> None:
    """Roll a DynamicCache back to ``length`` positions (no-op if it is not longer)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def position_mask(position_ids: torch.Tensor, num_keys: int) -> torch.Tensor:
    """Default attention mask: query at position p sees key slots 0..p.
    position_ids int64 [B, T] -> bool [B, 1, T, num_keys]."""
    slots = torch.arange(num_keys, device=position_ids.device)
    return (slots[None, None, None, :] <= position_ids[:, None, :, None])


class _Head(SharedTargetMixin, Fp32RopeMixin, nn.Module):
    """What both heads share: the target's frozen embedding and LM head (not submodules), RoPE,
    input checks, the default mask. Subclasses define ``_first_hidden`` and ``_layer_out``."""

    def __init__(self, config: HeadConfig, target=None):
        super().__init__()
        self.config = config
        self.rotary_emb = LlamaRotaryEmbedding(config.layer_config())
        self.keep_rope_fp32()  # a bf16 head keeps fp32 RoPE frequencies, as the target does
        self._shared: tuple[nn.Module, nn.Module] | None = None
        if target is not None:
            self.attach(target)

    def _check_target(self, target_config) -> None:
        check_matches_target(self.config, target_config)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def forward(self, features, input_ids, position_ids, cache=None, *, from_target: bool,
                attention_mask: torch.Tensor | None = None):
        squeeze = features.dim() == 2
        if squeeze:
            features, input_ids, position_ids = features[None], input_ids[None], position_ids[None]
        self._check(features, input_ids, position_ids, from_target)
        dt = self.dtype
        h_in = self._first_hidden(features.to(dt), from_target)  # [B, T, d]
        emb = self.embed_tokens(input_ids).to(dt)  # [B, T, d]
        if attention_mask is None and cache is not None:
            attention_mask = position_mask(position_ids, cache.get_seq_length() + input_ids.shape[1])
        # cache None and no mask: plain causal attention over the T rows (SDPA is_causal / flash)
        pos_emb = self.rotary_emb(h_in, position_ids)
        hidden = self._layer_out(emb, h_in, attention_mask, pos_emb, position_ids, cache)  # [B, T, d]
        logits = self._logits(hidden).float()  # [B, T, V]
        return (hidden[0], logits[0]) if squeeze else (hidden, logits)

    def _check(self, features, input_ids, position_ids, from_target: bool) -> None:
        want = self.config.feature_size if from_target else self.config.hidden_size
        if features.dim() != 3 or features.shape[-1] != want:
            what = "target features" if from_target else "fed-back hidden states"
            raise ValueError(f"{self.config.kind} head: {what} must be [B, T, {want}] or [T, {want}], "
                             f"got {tuple(features.shape)}")
        if input_ids.shape != features.shape[:2] or position_ids.shape != features.shape[:2]:
            raise ValueError(f"input_ids {tuple(input_ids.shape)} and position_ids {tuple(position_ids.shape)} "
                             f"must both be {tuple(features.shape[:2])} (one token and position per feature row)")

    def _attn_kwargs(self, attention_mask, pos_emb, position_ids, cache) -> dict:
        return dict(attention_mask=attention_mask, position_embeddings=pos_emb, position_ids=position_ids,
                    past_key_values=cache, use_cache=cache is not None)


class EagleHead(_Head):
    """EAGLE-1 head: fc(cat(emb, f)) -> one LlamaDecoderLayer without input_layernorm -> the
    un-normed residual stream, fed to the target's LM head and back as the next feature.
    Parameters (d=256, SwiGLU 704): ~0.87 M. See the module docstring for the step API."""

    def __init__(self, config: HeadConfig, target=None):
        if config.kind != "eagle":
            raise ValueError(f"EagleHead needs a config of kind 'eagle', got {config.kind!r}")
        super().__init__(config, target)
        d = config.hidden_size
        self.fc = nn.Linear(2 * d, d, bias=config.fc_bias)
        self.layer = LlamaDecoderLayer(config.layer_config(), layer_idx=0)
        self.layer.input_layernorm = nn.Identity()  # EAGLE cnets1.py: layer 0 has no input_layernorm

    def _first_hidden(self, features, from_target):
        return features  # f_j from the target or the head's own output: both width d

    def _layer_out(self, emb, h_in, mask, pos_emb, position_ids, cache):
        x = self.fc(torch.cat([emb, h_in], dim=-1))  # [B, T, 2d] -> [B, T, d], embedding first
        return self.layer(x, **self._attn_kwargs(mask, pos_emb, position_ids, cache))

    def _logits(self, hidden):
        return self.lm_head(hidden.to(self.lm_head.weight.dtype))


class Eagle3Layer(nn.Module):
    """EAGLE-3's ``LlamaDecoderLayeremb`` (``midlayer``): q/k/v read cat(input_layernorm(emb),
    hidden_norm(h)) [2d]; the residual is the un-normed h. Built from transformers' LlamaAttention
    (its q/k/v projections widened to 2d inputs), LlamaMLP and LlamaRMSNorm."""

    def __init__(self, layer_config):
        super().__init__()
        d, hd = layer_config.hidden_size, layer_config.head_dim
        self.self_attn = LlamaAttention(layer_config, layer_idx=0)
        self.self_attn.q_proj = nn.Linear(2 * d, layer_config.num_attention_heads * hd, bias=False)
        self.self_attn.k_proj = nn.Linear(2 * d, layer_config.num_key_value_heads * hd, bias=False)
        self.self_attn.v_proj = nn.Linear(2 * d, layer_config.num_key_value_heads * hd, bias=False)
        self.mlp = LlamaMLP(layer_config)
        eps = layer_config.rms_norm_eps
        self.input_layernorm = LlamaRMSNorm(d, eps=eps)
        self.hidden_norm = LlamaRMSNorm(d, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(d, eps=eps)

    def forward(self, emb, h, **attn_kwargs):
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(h)], dim=-1)  # [B, T, 2d]
        attn_kwargs.pop("use_cache", None)
        a, _ = self.self_attn(hidden_states=x, **attn_kwargs)  # [B, T, d]
        h = h + a
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(_Head):
    """EAGLE-3 head: fc(cat of the target's aux layer inputs) on the first pass, one fused decoder
    layer, own final norm, the target's frozen LM head (not its own: see the module docstring).
    Parameters (d=256, SwiGLU 704): ~1.07 M. See the module docstring for the step API."""

    def __init__(self, config: HeadConfig, target=None):
        if config.kind != "eagle3":
            raise ValueError(f"Eagle3Head needs a config of kind 'eagle3', got {config.kind!r}")
        super().__init__(config, target)
        d = config.hidden_size
        self.fc = nn.Linear(config.feature_size, d, bias=config.fc_bias)
        self.layer = Eagle3Layer(config.layer_config())
        self.norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)

    def _first_hidden(self, features, from_target):
        return self.fc(features) if from_target else features  # fc only on target features

    def _layer_out(self, emb, h_in, mask, pos_emb, position_ids, cache):
        return self.layer(emb, h_in, **self._attn_kwargs(mask, pos_emb, position_ids, cache))

    def _logits(self, hidden):
        return self.lm_head(self.norm(hidden).to(self.lm_head.weight.dtype))


HEAD_CLASSES = {"eagle": EagleHead, "eagle3": Eagle3Head}


def build_head(config: HeadConfig, target=None) -> _Head:
    """A freshly initialised head of ``config.kind`` (torch's default nn.Linear init, RMSNorm
    weights 1). Attaches ``target`` (shares its embedding and LM head) if given."""
    return HEAD_CLASSES[config.kind](config, target)
