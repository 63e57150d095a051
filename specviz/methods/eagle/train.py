"""Training EAGLE-1 and EAGLE-3 heads on a frozen target (:func:`specviz.train.heads.train_kind` runs the loop).

EAGLE-1 (Li et al. 2024, arXiv 2401.15077): SmoothL1(f_hat_{t+1}, f_{t+1}) + 0.1 soft CE against softmax(W_lm
f_{t+1}), uniform feature noise. EAGLE-3 (Li et al. 2025, arXiv 2503.01840): training-time test over ``ttt_steps``
unrolled steps, soft labels from the target, weights 0.8^s. Losses and the label alignment:
:mod:`specviz.methods.eagle.losses`.

Default sizes: on the v2 target (d=256, 20 layers, GQA 4/2, SwiGLU 704, V=8192, T=1024; ~44 MFLOP per token forward)
EAGLE-1's fwd+bwd adds ~15 MFLOP per token, EAGLE-3 with S = 5 steps ~160 MFLOP; at ~100 TFLOP/s a step takes
~19 / ~53 ms, so 6000 / 2400 steps take ~2 minutes each on the H200 (estimates from :attr:`HeadKind.flops`).
"""

from __future__ import annotations

import torch

from specviz.train.heads import HeadKind, HeadTrainConfig, layer_flops, train_kind

from .config import EAGLE1, EAGLE3, head_config_from_target
from .features import target_features
from .head import build_head
from .losses import agreement, eagle1_loss, eagle3_loss

CONFIGS = {EAGLE1: HeadTrainConfig(), EAGLE3: HeadTrainConfig(steps=2400, warmup_steps=100, eval_every=600)}
DEFAULT = CONFIGS[EAGLE1]


def _new_head(kind: str):
    def new(target, cfg: HeadTrainConfig):
        head_cfg = head_config_from_target(target.config, kind, cfg.aux_layer_ids)
        return head_cfg, build_head(head_cfg)
    return new


def _features(target, inputs: torch.Tensor, head_cfg):
    return target_features(target, inputs, head_cfg, with_logits=True)


def _eagle1_flops(c, cfg: HeadTrainConfig, seq_len: int) -> float:
    """fc, one layer, the V-way LM head (x3, the frozen LM head's weight gradient skipped: x2)."""
    d = c.hidden_size
    return float(3 * (2 * 2 * d * d + layer_flops(c) + 2 * seq_len * d) + 2 * 2 * d * c.vocab_size)


def _eagle3_flops(c, cfg: HeadTrainConfig, seq_len: int) -> float:
    """S unrolled steps of a layer with 2d-wide q/k/v and the LM head, dense masked attention over (s+1)T keys."""
    d, S = c.hidden_size, cfg.ttt_steps
    kv = c.num_key_value_heads * (getattr(c, "head_dim", None) or d // c.num_attention_heads)
    layer3 = layer_flops(c) + 2 * (d * d + 2 * d * kv)
    lm = 2 * d * c.vocab_size
    return float(3 * 2 * 3 * d * d + S * (3 * layer3 + 2 * lm) + sum(3 * 4 * (s + 1) * seq_len * d for s in range(S)))


EAGLE1_KIND = HeadKind(
    EAGLE1, CONFIGS[EAGLE1], _new_head(EAGLE1), _features,
    loss=lambda head, tf, batch, cfg, gen, train: eagle1_loss(head, tf, batch, cfg.reg_weight, cfg.cls_weight,
                                                              cfg.noise if train else 0.0, gen),
    agreement=lambda head, tf, batch, cfg: agreement(head, tf, batch, cfg.ttt_steps), flops=_eagle1_flops,
    compile=True)  # EAGLE-3 runs eagerly: its DynamicCache is Python state
EAGLE3_KIND = HeadKind(
    EAGLE3, CONFIGS[EAGLE3], _new_head(EAGLE3), _features,
    loss=lambda head, tf, batch, cfg, gen, train: eagle3_loss(head, tf, batch, cfg.ttt_steps, cfg.decay),
    agreement=lambda head, tf, batch, cfg: agreement(head, tf, batch, cfg.ttt_steps), flops=_eagle3_flops,
    steps=lambda head, cfg: cfg.ttt_steps)


KINDS = {EAGLE1: EAGLE1_KIND, EAGLE3: EAGLE3_KIND}


def train_eagle(target, train_windows, heldout_windows, device, out_dir, time_budget_s=None, config=None) -> dict:
    """An EAGLE-1 head; saves out_dir/specviz-eagle/ (and SafeAILab's layout under out_dir/published/)."""
    return train_kind(EAGLE1_KIND, target, train_windows, heldout_windows, device, out_dir, time_budget_s, config)


def train_eagle3(target, train_windows, heldout_windows, device, out_dir, time_budget_s=None, config=None) -> dict:
    """An EAGLE-3 head; saves out_dir/specviz-eagle3/ (and the speculators layout under out_dir/published/)."""
    return train_kind(EAGLE3_KIND, target, train_windows, heldout_windows, device, out_dir, time_budget_s, config)


def eagle_batch(final: torch.Tensor, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """EAGLE training pairs. final: [B, T, D]; input_ids: int64 [B, T]. Returns (all length T-2):
    features [B, T-2, D] = f_t; next_ids [B, T-2] = x_{t+1} (the token paired with f_t);
    target_features [B, T-2, D] = f_{t+1}; target_ids [B, T-2] = x_{t+2}."""
    return {
        "features": final[:, :-2],
        "next_ids": input_ids[:, 1:-1],
        "target_features": final[:, 1:-1],
        "target_ids": input_ids[:, 2:],
    }
