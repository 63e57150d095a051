"""Training the Gemma-4-style MTP head on a frozen target (:func:`specviz.train.heads.train_kind` runs the loop).

No public recipe (docs/design/methods.md 7.4; the design is specviz's): S = ``ttt_steps`` steps unrolled at the
constant position t, queries over the frozen target's layer ``kv_layer`` K/V (default the last), data tokens fed, loss sum_s 0.8^s soft
CE against the target's distribution of x_{t+2+s} (:func:`specviz.methods.mtp.head.mtp_loss`).
"""

from __future__ import annotations

import torch

from specviz.train.heads import HeadKind, HeadTrainConfig, TargetOutputs, train_kind

from .head import MtpHead, mtp_agreement, mtp_config_from_target, mtp_loss, target_layer_kv

DEFAULT = HeadTrainConfig(steps=4000, warmup_steps=100, eval_every=500, ttt_steps=4, fit_to_budget=True)


def _new_head(target, cfg: HeadTrainConfig):
    config = mtp_config_from_target(target.config)
    return config, MtpHead(config)


def _features(target, inputs: torch.Tensor, head_cfg) -> TargetOutputs:
    return TargetOutputs(*target_layer_kv(target, inputs, head_cfg.kv_layer))


def _flops(c, cfg: HeadTrainConfig, seq_len: int) -> float:
    """S x (its layer x3 + the LM head x2 + attention over ~T/2 keys x3)."""
    d, V = c.hidden_size, c.vocab_size
    dd, ff, hq = 192, 512, c.num_attention_heads * (getattr(c, "head_dim", None) or d // c.num_attention_heads)
    own = 2 * (2 * d * dd + 2 * dd * hq + 3 * dd * ff + dd * d)
    attn = 2 * 2 * hq * 512  # q.K and a.V over ~T/2 = 512 keys
    return float(cfg.ttt_steps * (3 * (own + attn) + 2 * 2 * d * V))


KIND = HeadKind("mtp", DEFAULT, _new_head, _features,
                loss=lambda head, tf, batch, cfg, gen, train: mtp_loss(head, tf.final, tf.logits, tf.keys, tf.values,
                                                                       batch, cfg.ttt_steps, cfg.decay),
                agreement=lambda head, tf, batch, cfg: mtp_agreement(head, tf.final, tf.logits, tf.keys, tf.values,
                                                                     batch, cfg.ttt_steps),
                flops=_flops, steps=lambda head, cfg: cfg.ttt_steps)


def train_mtp(target, train_windows, heldout_windows, device, out_dir, time_budget_s=None, config=None) -> dict:
    """The MTP head; saves out_dir/specviz-mtp/."""
    return train_kind(KIND, target, train_windows, heldout_windows, device, out_dir, time_budget_s, config)
