"""EAGLE-1 and EAGLE-3 draft heads as small ``nn.Module``s built from transformers' Llama modules.

Both heads are one decoder layer that reads (feature, token) pairs and share the target's
embedding and LM head, **frozen and not saved** in the head file (``head.embed_tokens`` /
``head.lm_head`` are the target's own modules, kept outside the head's parameters and state_dict).

EAGLE-1 (``EagleHead``; docs/design/methods.md 2.2, EAGLE ``cnets1.py::Model``, vLLM ``llama_eagle.py``)::

    x   = fc(cat(emb(x_{j+1}), f_j))                 fc: Linear(2d, d, bias=True), embedding first
    h   = LlamaDecoderLayer(x) without input_layernorm (post_attention_layernorm kept), no final norm
    logits = W_lm(h)                                 the target's LM head on the UN-normed output
    h is fed back as the next feature.

EAGLE-3 (``Eagle3Head``; docs/design/methods.md 4.1, EAGLE ``cnets.py``, vLLM ``llama_eagle3.py``)::

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
    input_ids    int64 [B, T] or [T]: the token AFTER each feature, x_{j+1} (docs/design/methods.md 1.1).
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

Published layouts (:mod:`specviz.heads.formats`) add options to both heads, set in the config
(:class:`~specviz.methods.eagle.config.HeadConfig`): attention biases, an own input embedding, and for
EAGLE-3 an own LM head over a reduced draft vocabulary (logits are scattered into the target's
vocabulary, -inf outside it: the proposers always see [V] logits and target token ids, as vLLM's
``compute_logits`` does), the norm flags ``fc_norm`` / ``norm_before_fc`` / ``norm_before_residual``
/ ``norm_logits`` / ``feed_normed``.

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

from specviz.methods.eagle.config import EAGLE1, EAGLE3, HeadConfig, check_matches_target
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

    check_target = staticmethod(check_matches_target)

    def __init__(self, config: HeadConfig, target=None):
        super().__init__()
        self.config = config
        self.rotary_emb = LlamaRotaryEmbedding(config.layer_config())
        self.keep_rope_fp32()  # a bf16 head keeps fp32 RoPE frequencies, as the target does
        self._shared: tuple[nn.Module, nn.Module] | None = None
        if config.own_embedding:  # a published head's embedding that differs from the target's
            self.own_embed = nn.Embedding(config.vocab_size, config.hidden_size)
        if target is not None:
            self.attach(target)


    @property
    def embed_tokens(self) -> nn.Module:
        """The input embedding: the head's own (``config.own_embedding``) or the target's, shared."""
        return self.own_embed if self.config.own_embedding else self._require_shared()[0]


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
        hidden, logits = self._outputs(hidden)  # fed-back hidden [B, T, d], logits [B, T, V]
        logits = logits.float()
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


def _with_biases(attn: nn.Module, config: HeadConfig) -> None:
    """Give ``attn``'s q/k/v (``config.qkv_bias``) and o (``config.o_bias``) projections biases, keeping
    their shapes (transformers' LlamaAttention only calls them, so a replaced Linear is used as is)."""
    for name, on in (("q_proj", config.qkv_bias), ("k_proj", config.qkv_bias), ("v_proj", config.qkv_bias),
                     ("o_proj", config.o_bias)):
        old = getattr(attn, name)
        if on and old.bias is None:
            setattr(attn, name, nn.Linear(old.in_features, old.out_features, bias=True))


class EagleHead(_Head):
    """EAGLE-1 head: fc(cat(emb, f)) -> one LlamaDecoderLayer without input_layernorm -> the
    un-normed residual stream, fed to the target's LM head and back as the next feature.
    Parameters (d=256, SwiGLU 704): ~0.87 M. See the module docstring for the step API."""

    def __init__(self, config: HeadConfig, target=None):
        if config.kind != EAGLE1:
            raise ValueError(f"EagleHead needs a config of kind 'eagle', got {config.kind!r}")
        super().__init__(config, target)
        d = config.hidden_size
        self.fc = nn.Linear(2 * d, d, bias=config.fc_bias)
        self.layer = LlamaDecoderLayer(config.layer_config(), layer_idx=0)
        self.layer.input_layernorm = nn.Identity()  # EAGLE cnets1.py: layer 0 has no input_layernorm
        _with_biases(self.layer.self_attn, config)

    def _first_hidden(self, features, from_target):
        return features  # f_j from the target or the head's own output: both width d

    def _layer_out(self, emb, h_in, mask, pos_emb, position_ids, cache):
        x = self.fc(torch.cat([emb, h_in], dim=-1))  # [B, T, 2d] -> [B, T, d], embedding first
        return self.layer(x, **self._attn_kwargs(mask, pos_emb, position_ids, cache))

    def _outputs(self, hidden):
        return hidden, self.lm_head(hidden.to(self.lm_head.weight.dtype))  # the un-normed h, as cnets1.py


class Eagle3Layer(nn.Module):
    """EAGLE-3's ``LlamaDecoderLayeremb`` (``midlayer``): q/k/v read cat(input_layernorm(emb),
    hidden_norm(h)) [2d]; the residual is the un-normed h (``norm_before_residual``: hidden_norm(h),
    speculators' ``Eagle3FirstLayerMixin``). Built from transformers' LlamaAttention (its q/k/v
    projections widened to 2d inputs), LlamaMLP and LlamaRMSNorm."""

    def __init__(self, layer_config, norm_before_residual: bool = False, qkv_bias: bool = False):
        super().__init__()
        d, hd = layer_config.hidden_size, layer_config.head_dim
        self.norm_before_residual = norm_before_residual
        self.self_attn = LlamaAttention(layer_config, layer_idx=0)
        self.self_attn.q_proj = nn.Linear(2 * d, layer_config.num_attention_heads * hd, bias=qkv_bias)
        self.self_attn.k_proj = nn.Linear(2 * d, layer_config.num_key_value_heads * hd, bias=qkv_bias)
        self.self_attn.v_proj = nn.Linear(2 * d, layer_config.num_key_value_heads * hd, bias=qkv_bias)
        self.mlp = LlamaMLP(layer_config)
        eps = layer_config.rms_norm_eps
        self.input_layernorm = LlamaRMSNorm(d, eps=eps)
        self.hidden_norm = LlamaRMSNorm(d, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(d, eps=eps)

    def forward(self, emb, h, **attn_kwargs):
        hn = self.hidden_norm(h)
        x = torch.cat([self.input_layernorm(emb), hn], dim=-1)  # [B, T, 2d]
        attn_kwargs.pop("use_cache", None)
        a, _ = self.self_attn(hidden_states=x, **attn_kwargs)  # [B, T, d]
        h = (hn if self.norm_before_residual else h) + a
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(_Head):
    """EAGLE-3 head: fc(cat of the target's aux layer inputs) on the first pass, one fused decoder
    layer, own final norm, the target's frozen LM head (specviz's trained heads: see the module
    docstring) or its own over ``config.draft_vocab_size`` rows (published heads; ``draft_to_target``
    int64 [V_d] maps a draft row to its target id when V_d < V).
    Parameters (d=256, SwiGLU 704): ~1.07 M. See the module docstring for the step API."""

    def __init__(self, config: HeadConfig, target=None):
        if config.kind != EAGLE3:
            raise ValueError(f"Eagle3Head needs a config of kind {EAGLE3!r}, got {config.kind!r}")
        super().__init__(config, target)
        d, taps = config.hidden_size, len(config.aux_layer_ids)
        self.fc = nn.Linear(config.feature_size, d, bias=config.fc_bias)
        if config.fc_norm:
            self.fc_norm = nn.ModuleList(LlamaRMSNorm(d, eps=config.rms_norm_eps) for _ in range(taps))
        if config.norm_before_fc:
            self.input_norm = LlamaRMSNorm(config.feature_size, eps=config.rms_norm_eps)
        self.layer = Eagle3Layer(config.layer_config(), config.norm_before_residual, config.qkv_bias)
        _with_biases(self.layer.self_attn, config)
        self.norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.own_lm_head = None if config.draft_vocab_size is None else nn.Linear(d, config.draft_vocab_size, bias=False)
        if config.draft_vocab_size is not None and config.draft_vocab_size < config.vocab_size:
            # draft row i -> target id; arange until a loader fills it (specviz.heads.formats)
            self.register_buffer("draft_to_target", torch.arange(config.draft_vocab_size))
        else:
            self.draft_to_target = None

    def _first_hidden(self, features, from_target):
        if not from_target:
            return features  # fc only on target features
        if self.config.norm_before_fc:
            features = self.input_norm(features)
        if self.config.fc_norm:  # [B, T, taps * d]: one norm per tap
            features = torch.cat([norm(c) for norm, c in zip(self.fc_norm, features.chunk(len(self.fc_norm), -1))], -1)
        return self.fc(features)

    def _layer_out(self, emb, h_in, mask, pos_emb, position_ids, cache):
        return self.layer(emb, h_in, **self._attn_kwargs(mask, pos_emb, position_ids, cache))

    def _outputs(self, hidden):
        cfg = self.config
        if cfg.feed_normed:  # speculators / vLLM norm_output: the normed h is fed back and read by the LM head
            hidden = self.norm(hidden)
            return hidden, self._lm(hidden)
        return hidden, self._lm(self.norm(hidden) if cfg.norm_logits else hidden)

    def _lm(self, x):
        """x [B, T, d] -> logits [B, T, V]: the target's LM head, or the own one scattered into the target's
        vocabulary (-inf outside the draft vocabulary; vLLM ``llama_eagle3.compute_logits``)."""
        if self.own_lm_head is None:
            return self.lm_head(x.to(self.lm_head.weight.dtype))
        z = self.own_lm_head(x)  # [B, T, V_d]
        if self.draft_to_target is None:
            return z
        full = z.new_full((*z.shape[:-1], self.config.vocab_size), float("-inf"))  # [B, T, V]
        return full.index_copy(z.dim() - 1, self.draft_to_target, z)


HEAD_CLASSES = {EAGLE1: EagleHead, EAGLE3: Eagle3Head}


def build_head(config: HeadConfig, target=None) -> _Head:
    """A freshly initialised head of ``config.kind`` (torch's default nn.Linear init, RMSNorm
    weights 1). Attaches ``target`` (shares its embedding and LM head) if given."""
    return HEAD_CLASSES[config.kind](config, target)


SPECVIZ_FORMAT = (HeadConfig, build_head, check_matches_target)  # specviz-head-v1 (specviz.heads.io)
