"""The Medusa (``medusa``) and Gemma-4-style MTP (``mtp``) kinds of the head trainer
(:mod:`specviz.train.heads`): how each builds its head, gets its target features, scores a batch and
measures held-out agreement. Everything else (optimiser, schedule, time budget, saving) is shared.

* medusa (methods.md 5.4 and 12; soft labels, decision Q4): K = 4 heads on the final-norm f_t, loss
  sum_i 0.8^i soft CE of head i at row t against the target's distribution at t+1+i
  (:func:`specviz.heads.medusa.medusa_loss`).
* mtp (methods.md 7.4; no public recipe: the design is specviz's): S = ``ttt_steps`` steps unrolled at
  the constant position t, queries over the frozen target's layer ``kv_layer`` K/V (default the
  last), data tokens fed, loss sum_s 0.8^s soft CE against the target's distribution of x_{t+2+s}
  (:func:`specviz.heads.mtp.mtp_loss`).

Features are computed online per batch from the frozen target (bf16 autocast on CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.heads.medusa import MedusaHead, medusa_agreement, medusa_config_from_target, medusa_loss
from specviz.heads.mtp import MtpHead, mtp_agreement, mtp_config_from_target, mtp_loss, target_layer_kv

KINDS = ("medusa", "mtp")


@dataclass
class KVFeatures:
    """One frozen-target forward over a window: final [B, T, d] f_t, logits float32 [B, T, V] z_t
    (predicting x_{t+1}), and (mtp only) layer ``kv_layer``'s keys / values [B, kv, T, hd]."""

    final: torch.Tensor
    logits: torch.Tensor
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None


def new_head(kind: str, target, cfg):
    """(config, freshly initialised head, not yet on the device) for ``kind``."""
    if kind == "medusa":
        config = medusa_config_from_target(target.config, num_layers=cfg.head_layers or 1)
        return config, MedusaHead(config)
    config = mtp_config_from_target(target.config)
    return config, MtpHead(config)


def features(target, inputs: torch.Tensor, head_cfg) -> KVFeatures:
    """The frozen target on inputs int64 [B, T] (call under no_grad / autocast)."""
    if head_cfg.kind == "mtp":
        return KVFeatures(*target_layer_kv(target, inputs, head_cfg.kv_layer))
    final = target.model(input_ids=inputs, use_cache=False).last_hidden_state
    return KVFeatures(final, target.lm_head(final).float())


def loss(kind: str, head, tf: KVFeatures, batch: torch.Tensor, cfg):
    """(loss, stats) of one batch (batch int64 [B, T+1], tf from batch[:, :T])."""
    if kind == "medusa":
        return medusa_loss(head, tf.final, tf.logits, cfg.decay)
    return mtp_loss(head, tf.final, tf.logits, tf.keys, tf.values, batch, cfg.ttt_steps, cfg.decay)


def agreement(kind: str, head, tf: KVFeatures, batch: torch.Tensor, cfg) -> dict[str, torch.Tensor]:
    """Held-out {"top1", "chain", "ce"} per head (medusa) or per unrolled step (mtp)."""
    if kind == "medusa":
        return medusa_agreement(head, tf.final, tf.logits)
    return mtp_agreement(head, tf.final, tf.logits, tf.keys, tf.values, batch, cfg.ttt_steps)


def decay_steps(kind: str, head, cfg) -> int:
    """How many weighted CE terms the objective has (K heads, or S unrolled steps)."""
    return head.config.num_heads if kind == "medusa" else cfg.ttt_steps


def flops_per_token(kind: str, target_config, cfg) -> float:
    """Rough head fwd+bwd FLOPs per token (the frozen LM head counted x2: no weight gradient).
    medusa: K x (ResBlock d^2 x3 + LM head x2); mtp: S x (its layer x3 + LM head x2 + attention
    over ~T/2 keys x3)."""
    c = target_config
    d, V = c.hidden_size, c.vocab_size
    lm = 2 * d * V
    if kind == "medusa":
        return float(4 * (3 * 2 * d * d + 2 * lm))
    dd, ff, hq = 192, 512, c.num_attention_heads * (getattr(c, "head_dim", None) or d // c.num_attention_heads)
    own = 2 * (2 * d * dd + 2 * dd * hq + 3 * dd * ff + dd * d)
    attn = 2 * 2 * hq * 512  # q.K and a.V over ~T/2 = 512 keys
    return float(cfg.ttt_steps * (3 * (own + attn) + 2 * lm))
