"""A Gemma-4-style MTP ("assistant") head, trained by specviz (no public recipe): docs/design/methods.md 7.

Sources: vLLM ``v1/spec_decode/gemma4.py`` (``Gemma4Proposer``, ``constant_draft_positions = True``)
and ``model_executor/models/gemma4_mtp.py``; HF ``gemma4_assistant``. What is kept from Gemma 4:
the draft layer has **no K/V projections**: its queries attend over the **target's own KV cache** of
one layer (``kv_layer``, default the last; our target has only full attention, so every draft layer
maps to it, the ``kv_sharing_target_layer_name`` rule), every draft step runs at the **same
position** t (the last committed position), and the chain flows only through the fed-back hidden
state and the input token. No draft KV cache exists. What is ours (the target is a 17 M Llama, and
the head must stay ~1 MB): the target's frozen embedding and LM head are shared (Gemma's assistant
has its own lm_head), RMSNorms on both inputs before the pre-projection (as EAGLE-3), and Llama's
1/sqrt(head_dim) attention scaling (our target has no k_norm; Gemma's 1.0 relies on its q/k norms).

One step (all rows in parallel)::

    x       = pre_projection(cat(norm_e(emb(token)), norm_h(h_in)))    [2d] -> [d_draft]
    q       = RoPE(q_proj(input_layernorm(x)), position t)             [Hq, hd], Hq = the target's heads
    x       = x + o_proj(softmax(q K_l^T / sqrt(hd)) V_l)              K_l, V_l: target layer kv_layer, keys <= t
    x       = x + mlp(post_attention_layernorm(x))
    h_out   = post_projection(norm(x))                                 [d_draft] -> [d]: fed back as h_in
    logits  = W_lm h_out                                               the target's frozen LM head

Step 1 reads (f_t, x_{t+1}) (f_t = the target's final-norm feature at t, x_{t+1} = the root); step
m >= 2 reads (h_out of step m-1, d_{m-1}); step m predicts x_{t+1+m}. Training (docs/design/methods.md 7.4):
S steps unrolled at the constant position t with the data tokens, loss sum_s 0.8^s soft CE against
the target's distribution of x_{t+2+s} (:func:`mtp_loss`). No gradio / plotly here.
"""

from __future__ import annotations

from typing import ClassVar
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, LlamaConfig
from transformers.models.llama.modeling_llama import (LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding,
                                                      apply_rotary_pos_emb)

from specviz.attention import FULL
from specviz.heads.common import FinalFeatureConfig, Fp32RopeMixin, JsonConfig, SharedTargetMixin, soft_cross_entropy



@dataclass(frozen=True)
class MtpConfig(FinalFeatureConfig, JsonConfig):
    """Shape of an MTP head. Sizes are the target's unless they say draft.

    kind: "mtp". hidden_size: d. vocab_size: V. target_num_hidden_layers: L.
    kv_layer: the target layer whose cached K/V the queries read (0 <= kv_layer < L; default L - 1).
    num_attention_heads: Hq query heads; num_key_value_heads / head_dim: the target's KV layout.
    draft_hidden_size: d_draft, the head's own width. intermediate_size: its SwiGLU width.
    rms_norm_eps, rope_parameters, max_position_embeddings: the target's (queries use its RoPE).
    """

    LABEL: ClassVar[str] = "mtp"

    kind: str
    hidden_size: int
    vocab_size: int
    target_num_hidden_layers: int
    kv_layer: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    draft_hidden_size: int = 192
    intermediate_size: int = 512
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 1024
    rope_parameters: dict = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})

    def __post_init__(self):
        if self.kind != "mtp":
            raise ValueError(f"an MtpConfig has kind 'mtp', got {self.kind!r}")
        if not 0 <= self.kv_layer < self.target_num_hidden_layers:
            raise ValueError(f"mtp kv_layer {self.kv_layer} must be in [0, {self.target_num_hidden_layers})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"mtp: {self.num_attention_heads} query heads do not divide into "
                             f"{self.num_key_value_heads} KV heads")

    def rope_config(self) -> LlamaConfig:
        """A LlamaConfig with the target's RoPE and head_dim (for LlamaRotaryEmbedding)."""
        return LlamaConfig(hidden_size=self.num_attention_heads * self.head_dim, num_attention_heads=self.num_attention_heads,
                           head_dim=self.head_dim, max_position_embeddings=self.max_position_embeddings,
                           rope_parameters=dict(self.rope_parameters))

def mtp_config_from_target(target_config, kv_layer: int | None = None, draft_hidden_size: int = 192,
                           intermediate_size: int = 512) -> MtpConfig:
    """The MTP config for a transformers Llama-like target config (kv_layer default: the last layer)."""
    c = target_config
    L = c.num_hidden_layers
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    rope = dict(getattr(c, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0})
    return MtpConfig(kind="mtp", hidden_size=c.hidden_size, vocab_size=c.vocab_size, target_num_hidden_layers=L,
                     kv_layer=L - 1 if kv_layer is None else int(kv_layer), num_attention_heads=c.num_attention_heads,
                     num_key_value_heads=getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
                     head_dim=head_dim, draft_hidden_size=draft_hidden_size, intermediate_size=intermediate_size,
                     rms_norm_eps=c.rms_norm_eps, max_position_embeddings=c.max_position_embeddings,
                     rope_parameters=rope)


def check_mtp_matches(cfg: MtpConfig, target_config) -> None:
    """Raise ValueError (saying what differs) unless the head can read this target's KV cache."""
    c = target_config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    problems = [f"{name} {mine} != target's {theirs}" for name, mine, theirs in (
        ("hidden size", cfg.hidden_size, c.hidden_size), ("vocab size", cfg.vocab_size, c.vocab_size),
        ("layer count", cfg.target_num_hidden_layers, c.num_hidden_layers), ("KV heads", cfg.num_key_value_heads, kv),
        ("head_dim", cfg.head_dim, head_dim)) if mine != theirs]
    if problems:
        raise ValueError("mtp head does not match the target: " + "; ".join(problems)
                         + ". Use a head trained for this target (specviz train heads --target DIR).")


class OneLayerReads:
    """The draft interface of :mod:`specviz.methods.mtp.proposer` for a head called as ``head(h_in, token_ids,
    position_ids, keys, values)`` over one target layer ``config.kv_layer`` at position n - 1 (vLLM's reading:
    the fed hidden state's position), drafting from q = softmax(logits) at T > 0."""

    label = "Gemma-4-style MTP head, trained by specviz (no public recipe)"
    one_hot_draft = False

    @property
    def kv_layers(self) -> dict[str, int]:
        """{layer type: target layer}: the one layer the head reads."""
        return {FULL: int(self.config.kv_layer)}

    def draft_position(self, cached: int) -> int:
        """The constant query position t = cached - 1, the last committed position."""
        return cached - 1

    def draft(self, h_in, token_ids, position_ids, kv):
        """One step over kv = {type: (keys, values)} [1, kv, S, hd] (slots > t masked by the head's default mask)."""
        (keys, values), = kv.values()
        return self(h_in, token_ids, position_ids, keys, values)

    def reads(self, cached: int) -> list[dict]:
        """What one round reads of a cache of ``cached`` positions: [{type, layer, positions [lo, hi]}]."""
        return [{"type": FULL, "layer": int(self.config.kv_layer), "positions": [0, cached - 1]}]


class MtpHead(OneLayerReads, SharedTargetMixin, Fp32RopeMixin, nn.Module):
    """The MTP head (see the module docstring). The target's embedding and LM head are shared,
    frozen, and not saved.

    ``h_out, logits = head(h_in, token_ids, position_ids, keys, values, key_mask=None)``

    h_in         float [B, T, d]: the target's final-norm f_t (step 1) or the previous step's h_out.
    token_ids    int64 [B, T]: the token read with h_in (the root x_{t+1} at step 1, then d_{m-1}).
    position_ids int64 [B, T]: the constant query position t of each row (RoPE).
    keys, values float [B, kv_heads, S, head_dim]: target layer ``kv_layer``'s cached K (RoPE already
                 applied, as transformers caches it) and V for key positions 0..S-1.
    key_mask     bool [B or 1, 1, T, S] (True = attend), default: key s visible iff s <= the row's position.
    returns      h_out float [B, T, d] (head dtype) and logits float32 [B, T, V].
    Raises ValueError for inconsistent shapes.
    """

    check_target = staticmethod(check_mtp_matches)

    def __init__(self, config: MtpConfig, target=None):
        super().__init__()
        self.config = config
        d, dd, hd = config.hidden_size, config.draft_hidden_size, config.head_dim
        eps = config.rms_norm_eps
        self.norm_e, self.norm_h = LlamaRMSNorm(d, eps=eps), LlamaRMSNorm(d, eps=eps)
        self.pre_projection = nn.Linear(2 * d, dd, bias=False)
        self.input_layernorm = LlamaRMSNorm(dd, eps=eps)
        self.q_proj = nn.Linear(dd, config.num_attention_heads * hd, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * hd, dd, bias=False)
        self.post_attention_layernorm = LlamaRMSNorm(dd, eps=eps)
        self.mlp = LlamaMLP(LlamaConfig(hidden_size=dd, intermediate_size=config.intermediate_size, mlp_bias=False,
                                        hidden_act="silu", num_attention_heads=1, num_key_value_heads=1))
        self.norm = LlamaRMSNorm(dd, eps=eps)
        self.post_projection = nn.Linear(dd, d, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config.rope_config())
        self.keep_rope_fp32()  # a bf16 head keeps fp32 RoPE frequencies, as the target does
        self._shared: tuple[nn.Module, nn.Module] | None = None
        if target is not None:
            self.attach(target)



    def forward(self, h_in, token_ids, position_ids, keys, values, key_mask=None):
        B, T = token_ids.shape
        c = self.config
        if h_in.shape != (B, T, c.hidden_size) or position_ids.shape != (B, T):
            raise ValueError(f"mtp head: h_in must be [B, T, {c.hidden_size}] and position_ids [B, T] = {(B, T)}; "
                             f"got {tuple(h_in.shape)}, {tuple(position_ids.shape)}")
        if keys.dim() != 4 or keys.shape[1] != c.num_key_value_heads or keys.shape[3] != c.head_dim \
                or values.shape != keys.shape:
            raise ValueError(f"mtp head: keys / values must be [B, {c.num_key_value_heads}, S, {c.head_dim}], got "
                             f"{tuple(keys.shape)}, {tuple(values.shape)}")
        emb, lm = self._require_shared()
        dt = self.dtype
        x = self.pre_projection(torch.cat([self.norm_e(emb(token_ids).to(dt)), self.norm_h(h_in.to(dt))], dim=-1))
        x = x + self._attend(self.input_layernorm(x), position_ids, keys.to(dt), values.to(dt), key_mask)
        x = x + self.mlp(self.post_attention_layernorm(x))
        h_out = self.post_projection(self.norm(x))  # [B, T, d]
        return h_out, lm(h_out.to(lm.weight.dtype)).float()

    def _attend(self, x, position_ids, keys, values, key_mask):
        """Q-only attention of rows x [B, T, d_draft] over the target's K/V [B, kv, S, hd] -> [B, T, d_draft]."""
        B, T, _ = x.shape
        c = self.config
        q = self.q_proj(x).view(B, T, c.num_attention_heads, c.head_dim).transpose(1, 2)  # [B, Hq, T, hd]
        cos, sin = self.rotary_emb(q, position_ids)
        q, _ = apply_rotary_pos_emb(q, q, cos, sin)  # RoPE at the query's position t
        if key_mask is None:
            slots = torch.arange(keys.shape[2], device=x.device)
            key_mask = slots[None, None, None, :] <= position_ids[:, None, :, None]  # [B, 1, T, S]
        a = F.scaled_dot_product_attention(q, keys, values, attn_mask=key_mask, enable_gqa=True)  # [B, Hq, T, hd]
        return self.o_proj(a.transpose(1, 2).reshape(B, T, c.num_attention_heads * c.head_dim))


def target_layer_kv(target, input_ids: torch.Tensor, layer: int):
    """One uncached target forward over input_ids int64 [B, T]; returns (final-norm features [B, T, d],
    logits float32 [B, T, V], keys [B, kv, T, hd], values [B, kv, T, hd]) of decoder layer ``layer``
    (keys with RoPE applied: exactly what the runners' KV caches hold). Call under no_grad."""
    cache = DynamicCache(config=target.config)
    out = target.model(input_ids=input_ids, past_key_values=cache, use_cache=True)
    final = out.last_hidden_state
    lay = cache.layers[layer]
    return final, target.lm_head(final).float(), lay.keys, lay.values


def mtp_unroll(head: MtpHead, final, keys, values, ids: torch.Tensor, steps: int):
    """Yield (s, logits [B, T, V]) for s = 0..steps-1: every row t drafts at the constant position t.
    final [B, T, d]: f_t; ids int64 [B, T+1] = x_0..x_T; row t of step s reads x_{t+1+s} (data tokens,
    padded past the window) and step s's logits predict x_{t+2+s}."""
    B, T = final.shape[:2]
    tok = torch.cat([ids[:, 1:], ids.new_zeros(B, steps)], dim=1)  # [B, T + steps]
    pos = torch.arange(T, device=ids.device).expand(B, T)
    slots = torch.arange(T, device=ids.device)
    mask = (slots[None, :] <= slots[:, None])[None, None]  # [1, 1, T, T] causal: keys <= t
    h = final
    for s in range(steps):
        h, logits = head(h, tok[:, s : s + T], pos, keys, values, mask)
        yield s, logits


def mtp_loss(head: MtpHead, final, target_logits, keys, values, ids, steps: int, decay: float = 0.8):
    """docs/design/methods.md 7.4: sum_s decay^s * mean soft CE of step s's rows t <= T-2-s against softmax(z_{t+1+s}).
    Returns (loss fp32 scalar, {"ce": [steps], "top1": [steps]} detached)."""
    T = final.shape[1]
    if steps > T - 1:
        raise ValueError(f"{steps} MTP steps need windows longer than {steps + 1} tokens, got T={T}")
    loss, ces, top1 = 0.0, [], []
    for s, logits in mtp_unroll(head, final, keys, values, ids, steps):
        lg, lab = logits[:, : T - 1 - s], target_logits[:, 1 + s :]
        ce = soft_cross_entropy(lg, lab).mean()
        loss = loss + decay**s * ce
        ces.append(ce.detach())
        top1.append((lg.argmax(-1) == lab.argmax(-1)).float().mean())
    return loss, {"ce": torch.stack(ces), "top1": torch.stack(top1)}


@torch.no_grad()
def mtp_agreement(head: MtpHead, final, target_logits, keys, values, ids, steps: int) -> dict[str, torch.Tensor]:
    """Held-out per-step agreement with the target's argmax (teacher-forced data tokens): top1, chain, ce."""
    T = final.shape[1]
    top1, chain, ces, agree_all = [], [], [], None
    for s, logits in mtp_unroll(head, final, keys, values, ids, steps):
        lg, lab = logits[:, : T - 1 - s], target_logits[:, 1 + s :]
        agree = lg.argmax(-1) == lab.argmax(-1)
        agree_all = agree if agree_all is None else agree_all[:, : T - 1 - s] & agree
        top1.append(agree.float().mean())
        chain.append(agree_all.float().mean())
        ces.append(soft_cross_entropy(lg, lab).mean())
    return {"top1": torch.stack(top1), "chain": torch.stack(chain), "ce": torch.stack(ces)}


SPECVIZ_FORMAT = (MtpConfig, MtpHead, check_mtp_matches)  # specviz-head-v1 (specviz.heads.io)
