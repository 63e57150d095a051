"""DFlash block drafter (``dflash``): fused target features injected into every layer's keys and values,
one bidirectional forward over ``[root, MASK x (B-1)]`` drafts B - 1 tokens.

Source: Chen, Liang, Liu, "DFlash" (arXiv 2602.06036, 2026), z-lab/dflash ``dflash/model.py``
(``Qwen3DFlashAttention``, ``build_target_layer_ids``, ``extract_context_feature``, ``dflash_generate``);
vLLM mainline ``v1/spec_decode/dflash.py`` (``num_speculative_tokens = B - 1``); docs/design/methods.md 6.1.

Architecture (per draft layer; d, heads, KV heads, head_dim and SwiGLU width are the target's)::

    c_j  = hidden_norm(fc(cat(a^(id+1)_j for id in target_layer_ids)))   context feature, j < s
           (a^(id+1) = HF hidden_states[id + 1] = the OUTPUT of target layer id; fc has no bias)
    x    = input_layernorm(h)                                            h: block hidden [Q, d]
    q    = rope(q_norm(q_proj(x)))                                       queries: block slots only
    K, V = cat(rope(k_norm(k_proj(c))), rope(k_norm(k_proj(x)))), cat(v_proj(c), v_proj(x))
    h    = h + o_proj(attn(q, K, V))      non-causal: a slot sees every context key and every slot
    h    = h + mlp(post_attention_layernorm(h))
    logits = W_lm(norm(h))                the target's frozen LM head; h_0 = the target's frozen embedding

The same fused context c feeds K/V of every layer (each layer has its own k_proj / v_proj), so the
context K/V of a committed position never change: the proposer computes them once, from target
features, and keeps them (:class:`DFlashCache`); block K/V are never kept (docs/design/methods.md 6.1 step 4).

Mask token (a specviz choice): the bundled vocabulary has only bos = eos = 0 and pad = 1
(docs/design/methods.md 12), so MASK reuses the target's pad id 1 (``mask_token_id``). The proposer sets its
logit to -inf before drawing, so MASK is never drafted (asserted in tests/test_dflash.py).

Weights: the head's own parameters only (the embedding and LM head are the target's, not saved);
with the bundled target (d = 256, SwiGLU 704, GQA 4/2 x 64) and L_d = 2 layers, 2 taps:
~1.6 M parameters, ~3.2 MB in bf16.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

from specviz.runner import layer_output
from specviz.heads.common import Fp32RopeMixin, JsonConfig, SharedTargetMixin, load_weights

KIND = "dflash"
FORMAT = "specviz-dflash-v1"
HEAD_DIR = "specviz-dflash"  # under assets/models/
CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """z-lab ``build_target_layer_ids``: ``[L_t // 2]`` for one draft layer, else
    ``round(1 + i (L_t - 4) / (L_d - 1))`` for i < L_d (evenly from 1 to L_t - 3). Each id names
    the OUTPUT of target layer id. For targets of < 5 layers (tests only) ids are clamped into
    [0, L_t - 2] (the last layer's un-normed output is not tapped: :func:`specviz.runner.hidden_state_index`),
    a specviz rule. Raises ValueError for L_t < 2 or L_d < 1."""
    if num_target_layers < 2 or num_draft_layers < 1:
        raise ValueError(f"DFlash taps need a target of >= 2 layers and >= 1 draft layer, got L_t={num_target_layers}, "
                         f"L_d={num_draft_layers}")
    if num_draft_layers == 1:
        ids = [num_target_layers // 2]
    else:
        span = (num_target_layers - 4) / (num_draft_layers - 1)
        ids = [int(round(1 + i * span)) for i in range(num_draft_layers)]
    return tuple(min(max(i, 0), num_target_layers - 2) for i in ids)


@dataclass(frozen=True)
class DFlashConfig(JsonConfig):
    """Shape of a DFlash drafter (sizes are the target's unless stated).

    num_layers:       L_d, draft decoder layers.
    target_layer_ids: the target layers whose OUTPUTS are fused (each in [0, L_t - 2]).
    block_size:       B; a block is [root, MASK x (B - 1)], so a step drafts at most B - 1 tokens.
    mask_token_id:    MASK's token id (specviz: the target's pad id).
    attention_bias:   q/k/v/o projections with biases (Qwen3's ``attention_bias``; z-lab layout).
    input_embedding_scale, output_multiplier, final_logit_softcapping: z-lab's block embedding scale, logit
                      multiplier and tanh soft-cap (``dflash/model.py``: ``dflash_generate``, ``compute_logits``;
                      1.0, 1.0, None = off; a cap <= 0 is stored as None).
    """

    LABEL: ClassVar[str] = "DFlash"
    FORMAT: ClassVar[str] = FORMAT  # "specviz-dflash-v1"

    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    target_num_hidden_layers: int
    target_layer_ids: tuple[int, ...]
    num_layers: int = 2
    block_size: int = 8
    mask_token_id: int = 1
    rope_parameters: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    kind: str = KIND
    attention_bias: bool = False
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))
        if self.kind != KIND:
            raise ValueError(f"a DFlash config has kind {KIND!r}, got {self.kind!r}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (a root and at least one MASK slot), got {self.block_size}")
        if self.num_layers < 1 or not self.target_layer_ids:
            raise ValueError("a DFlash drafter needs >= 1 layer and >= 1 target layer id")
        for name in ("input_embedding_scale", "output_multiplier"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        cap = self.final_logit_softcapping
        if cap is not None and (isinstance(cap, bool) or not (isinstance(cap, (int, float)) and math.isfinite(cap))):
            raise ValueError(f"final_logit_softcapping must be a finite number or null, got {cap!r}")
        if cap is not None and cap <= 0:  # z-lab's compute_logits: a cap <= 0 is no cap
            object.__setattr__(self, "final_logit_softcapping", None)
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})")

    @property
    def num_speculative_tokens(self) -> int:
        """B - 1: the drafts one block yields (vLLM mainline's num_speculative_tokens)."""
        return self.block_size - 1

    @property
    def feature_size(self) -> int:
        """F = len(target_layer_ids) * d: width of the concatenated target features."""
        return self.hidden_size * len(self.target_layer_ids)

    @property
    def taps(self) -> tuple[str, ...]:
        """Runner tap names (:mod:`specviz.runner`), in concatenation order."""
        return tuple(layer_output(i) for i in self.target_layer_ids)

    def layer_config(self) -> LlamaConfig:
        cfg = LlamaConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                          intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
                          num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                          head_dim=self.head_dim, rms_norm_eps=self.rms_norm_eps,
                          max_position_embeddings=self.max_position_embeddings,
                          rope_parameters=dict(self.rope_parameters), attention_bias=False, mlp_bias=False)
        return cfg

def dflash_config_from_target(target_config, num_layers: int = 2, block_size: int = 8,
                              target_layer_ids: tuple[int, ...] | None = None,
                              mask_token_id: int | None = None) -> DFlashConfig:
    """The DFlash config for a transformers Llama-like target config. mask_token_id: default the
    target's ``pad_token_id``. Raises ValueError when there is none (pass one) or the config does
    not fit the target."""
    c = target_config
    if mask_token_id is None:
        mask_token_id = getattr(c, "pad_token_id", None)
        if mask_token_id is None:
            raise ValueError("the target has no pad_token_id to reuse as DFlash's MASK token: pass mask_token_id")
    L = c.num_hidden_layers
    ids = tuple(target_layer_ids) if target_layer_ids is not None else build_target_layer_ids(L, num_layers)
    cfg = DFlashConfig(
        hidden_size=c.hidden_size, vocab_size=c.vocab_size, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        intermediate_size=c.intermediate_size, rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings, target_num_hidden_layers=L, target_layer_ids=ids,
        num_layers=num_layers, block_size=block_size, mask_token_id=int(mask_token_id),
        rope_parameters=dict(getattr(c, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}))
    check_dflash_matches_target(cfg, target_config)
    return cfg


def check_dflash_matches_target(cfg: DFlashConfig, target_config) -> None:
    """Raise ValueError (saying what differs) unless the drafter can run on this target."""
    c, problems = target_config, []
    if cfg.hidden_size != c.hidden_size:
        problems.append(f"hidden size {cfg.hidden_size} != target's {c.hidden_size}")
    if cfg.vocab_size != c.vocab_size:
        problems.append(f"vocab size {cfg.vocab_size} != target's {c.vocab_size}")
    if cfg.target_num_hidden_layers != c.num_hidden_layers:
        problems.append(f"built for a target of {cfg.target_num_hidden_layers} layers, this one has {c.num_hidden_layers}")
    bad = [i for i in cfg.target_layer_ids if not 0 <= i <= c.num_hidden_layers - 2]
    if bad:
        last = c.num_hidden_layers - 1
        problems.append(f"target layer ids {bad} out of range [0, {last - 1}]"
                        + (f" (id {last}, the last layer, would read hidden_states[{last + 1}], which transformers "
                           "ties to the final norm's output, not the layer's)" if last in bad else ""))
    if problems:
        raise ValueError("dflash head does not match the target: " + "; ".join(problems)
                         + ". Use a head trained for this target (specviz train heads --target DIR --heads dflash).")


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, hd]; cos / sin [B, T, hd] (LlamaRotaryEmbedding) -> rotated x (neox layout, as Llama)."""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


class DFlashLayer(nn.Module):
    """One DFlash decoder layer (z-lab ``Qwen3DFlashDecoderLayer`` on Llama modules, with q/k norm)."""

    def __init__(self, cfg: DFlashConfig):
        super().__init__()
        d, hd, H, Hkv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.shape = (H, Hkv, hd)
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(d, H * hd, bias=bias)
        self.k_proj = nn.Linear(d, Hkv * hd, bias=bias)
        self.v_proj = nn.Linear(d, Hkv * hd, bias=bias)
        self.o_proj = nn.Linear(H * hd, d, bias=bias)
        self.q_norm = LlamaRMSNorm(hd, eps=cfg.rms_norm_eps)
        self.k_norm = LlamaRMSNorm(hd, eps=cfg.rms_norm_eps)
        self.input_layernorm = LlamaRMSNorm(d, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(d, eps=cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg.layer_config())

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, d] -> (k, v) [B, Hkv, T, hd] each: k normed per head and rotated."""
        B, T, _ = x.shape
        _, Hkv, hd = self.shape
        k = self.k_norm(self.k_proj(x).view(B, T, Hkv, hd)).transpose(1, 2)  # [B, Hkv, T, hd]
        v = self.v_proj(x).view(B, T, Hkv, hd).transpose(1, 2)  # [B, Hkv, T, hd]
        return _rope(k, cos, sin), v

    def forward(self, h, ctx_k, ctx_v, cos, sin, mask=None):
        """h [B, Q, d] block hidden; ctx_k / ctx_v [B, Hkv, S, hd]; cos / sin [B, Q, hd] of the block
        positions; mask bool [B or 1, 1, Q, S + Q] (True = attend) or None (all visible)."""
        B, Q, _ = h.shape
        H, Hkv, hd = self.shape
        x = self.input_layernorm(h)
        q = _rope(self.q_norm(self.q_proj(x).view(B, Q, H, hd)).transpose(1, 2), cos, sin)  # [B, H, Q, hd]
        k, v = self.kv(x, cos, sin)  # [B, Hkv, Q, hd]
        k = torch.cat([ctx_k, k], dim=2).repeat_interleave(H // Hkv, dim=1)  # [B, H, S + Q, hd]
        v = torch.cat([ctx_v, v], dim=2).repeat_interleave(H // Hkv, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, H, Q, hd], non-causal
        h = h + self.o_proj(a.transpose(1, 2).reshape(B, Q, H * hd))
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashCache:
    """The context K/V of committed positions, per draft layer: slot j = position j, from target
    features only (never written by a block). ``length``: positions held."""

    def __init__(self):
        self.keys: list[torch.Tensor] = []  # per layer [1, Hkv, length, hd]
        self.values: list[torch.Tensor] = []
        self.length = 0

    def append(self, kvs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if not self.keys:
            self.keys, self.values = [k for k, _ in kvs], [v for _, v in kvs]
        else:
            self.keys = [torch.cat([a, k], dim=2) for a, (k, _) in zip(self.keys, kvs)]
            self.values = [torch.cat([a, v], dim=2) for a, (_, v) in zip(self.values, kvs)]
        self.length += kvs[0][0].shape[2]


class DFlashHead(SharedTargetMixin, Fp32RopeMixin, nn.Module):
    """The drafter. One call = one forward (the "one-forward" property the proposer relies on)::

        logits = head(features, context_positions, block_ids, block_positions, cache=None, attention_mask=None)

    features          float [B, S, F] (or [S, F]): target features of the context positions
                      (F = config.feature_size; taps concatenated in target_layer_ids order). With a
                      cache: only the positions not yet in it (S may be 0).
    context_positions int64 [B, S] (or [S]): their positions (with a cache: cache.length, cache.length + 1, ..).
    block_ids         int64 [B, Q] (or [Q]): block tokens, e.g. [x_s, MASK x (B-1)] (or several blocks).
    block_positions   int64 [B, Q] (or [Q]): their positions (s .. s + B - 1).
    cache             :class:`DFlashCache` or None. Given: the new context K/V are appended to it and
                      the block attends to all cached context + every block slot (no mask).
    attention_mask    bool [B or 1, 1, Q, S + Q] (training: several blocks with strict < anchor context).
    returns           logits float32 [B, Q, V] (or [Q, V]); slot i of a block predicts the token at
                      its own position (docs/design/methods.md 1.1, "same-position"); slot 0 is the root's.

    Dtypes: runs in its parameter dtype; features / embeddings are cast to it. Raises ValueError
    for inconsistent shapes, or when no target is attached.
    """

    check_target = staticmethod(check_dflash_matches_target)

    def __init__(self, config: DFlashConfig, target=None):
        super().__init__()
        self.config = config
        d = config.hidden_size
        self.fc = nn.Linear(config.feature_size, d, bias=False)
        self.hidden_norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_layers))
        self.norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config.layer_config())
        self.keep_rope_fp32()
        self._shared: tuple[nn.Module, nn.Module] | None = None
        if target is not None:
            self.attach(target)



    def forward(self, features, context_positions, block_ids, block_positions, cache: DFlashCache | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        squeeze = block_ids.dim() == 1
        if squeeze:
            features, context_positions = features[None], context_positions[None]
            block_ids, block_positions = block_ids[None], block_positions[None]
        self._check(features, context_positions, block_ids, block_positions)
        new_kv = self.context_kv(features, context_positions)
        if cache is not None:
            if features.shape[1]:
                cache.append(new_kv)
            if not cache.keys:
                raise ValueError("DFlash head: an empty cache and no context features (nothing to draft from)")
            new_kv = list(zip(cache.keys, cache.values))
        logits = self.block_logits(block_ids, block_positions, new_kv, attention_mask)
        return logits[0] if squeeze else logits

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (k, v) [B, Hkv, S, hd] of the fused context c = hidden_norm(fc(features)):
        features [B, S, F], positions int64 [B, S]."""
        ctx = self.hidden_norm(self.fc(features.to(self.dtype)))  # [B, S, d]
        cos, sin = self.rotary_emb(ctx, positions)  # [B, S, hd]
        return [layer.kv(ctx, cos, sin) for layer in self.layers]

    def block_logits(self, block_ids: torch.Tensor, block_positions: torch.Tensor,
                     kvs: list[tuple[torch.Tensor, torch.Tensor]], attention_mask: torch.Tensor | None = None):
        """The block forward: block_ids / block_positions int64 [B, Q], kvs the context (k, v) per
        layer [B, Hkv, S, hd], mask bool [B or 1, 1, Q, S + Q] or None -> logits float32 [B, Q, V]."""
        c = self.config
        # raw rows, as z-lab's _raw_input_embeddings: never a target's own embedding scale (Gemma's sqrt(H))
        h = F.embedding(block_ids, self.embed_tokens.weight).to(self.dtype)  # [B, Q, d]
        if c.input_embedding_scale != 1.0:
            h = h * c.input_embedding_scale
        cos, sin = self.rotary_emb(h, block_positions)  # [B, Q, hd]
        for layer, (k, v) in zip(self.layers, kvs):
            h = layer(h, k, v, cos, sin, attention_mask)
        logits = self.lm_head(self.norm(h).to(self.lm_head.weight.dtype)).float()  # [B, Q, V]
        if c.output_multiplier != 1.0:
            logits = logits * c.output_multiplier
        cap = c.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _check(self, features, context_positions, block_ids, block_positions) -> None:
        F_ = self.config.feature_size
        if features.dim() != 3 or features.shape[-1] != F_:
            raise ValueError(f"dflash head: target features must be [B, S, {F_}] or [S, {F_}], got {tuple(features.shape)}")
        if context_positions.shape != features.shape[:2]:
            raise ValueError(f"context_positions {tuple(context_positions.shape)} must be {tuple(features.shape[:2])}")
        if block_positions.shape != block_ids.shape or block_ids.shape[0] != features.shape[0]:
            raise ValueError(f"block_ids {tuple(block_ids.shape)} and block_positions {tuple(block_positions.shape)} "
                             f"must be equal [B, Q] with B = {features.shape[0]}")


def save_dflash(head: DFlashHead, directory: str | os.PathLike, dtype: torch.dtype = torch.bfloat16) -> list[str]:
    """Write config.json and model.safetensors (the head's own parameters, cast to ``dtype``)."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()  # id maps stay int64
             for k, v in head.state_dict().items()}
    save_file(state, str(path / WEIGHTS_NAME), metadata={"format": "pt", "kind": KIND})
    (path / CONFIG_NAME).write_text(head.config.to_json())
    return [CONFIG_NAME, WEIGHTS_NAME]


def load_dflash(directory: str | os.PathLike, target, dtype: torch.dtype | None = None) -> DFlashHead:
    """Load a DFlash head onto ``target`` (sharing its embedding and LM head), on the target's
    device, in ``dtype`` (default the target's), eval mode. Safetensors only. Raises ValueError
    for a missing / malformed config, weights that do not match it, or a config that does not
    match the target."""
    path = Path(directory)
    if not (path / CONFIG_NAME).is_file():
        raise ValueError(f"no DFlash config at {path / CONFIG_NAME}")
    cfg = DFlashConfig.from_json((path / CONFIG_NAME).read_text())
    check_dflash_matches_target(cfg, target.config)
    return load_weights(DFlashHead(cfg), path / WEIGHTS_NAME, target, dtype)


load_own, save_own = load_dflash, save_dflash  # specviz-dflash-v1 (specviz.heads.formats, specviz.heads.io)
