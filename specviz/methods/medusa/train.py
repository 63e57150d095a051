"""Training Medusa heads on a frozen target (:func:`specviz.train.heads.train_kind` runs the loop).

Cai et al. 2024 (arXiv 2401.10774; docs/design/methods.md 5.4): K = 4 ResBlocks on the final-norm f_t over the
target's frozen LM head, loss sum_i 0.8^i soft CE of head i at row t against the target's distribution at t+1+i (soft labels, our choice:
:func:`specviz.methods.medusa.head.medusa_loss`). Features are computed online per batch from the frozen target.
"""

from __future__ import annotations

import torch

from specviz.train.heads import IGNORE_INDEX, HeadKind, HeadTrainConfig, TargetOutputs, train_kind

from .head import MedusaHead, medusa_agreement, medusa_config_from_target, medusa_loss

DEFAULT = HeadTrainConfig(steps=6000, warmup_steps=100, eval_every=750, fit_to_budget=True)


def _new_head(target, cfg: HeadTrainConfig):
    config = medusa_config_from_target(target.config, num_layers=cfg.head_layers or 1)
    return config, MedusaHead(config)


def _features(target, inputs: torch.Tensor, head_cfg) -> TargetOutputs:
    final = target.model(input_ids=inputs, use_cache=False).last_hidden_state
    return TargetOutputs(final, target.lm_head(final).float())


def _flops(c, cfg: HeadTrainConfig, seq_len: int) -> float:
    """K x (ResBlock d^2 x3 + the LM head x2: no weight gradient)."""
    d = c.hidden_size
    return float(4 * (3 * 2 * d * d + 2 * 2 * d * c.vocab_size))


KIND = HeadKind("medusa", DEFAULT, _new_head, _features,
                loss=lambda head, tf, batch, cfg, gen, train: medusa_loss(head, tf.final, tf.logits, cfg.decay),
                agreement=lambda head, tf, batch, cfg: medusa_agreement(head, tf.final, tf.logits), flops=_flops,
                steps=lambda head, cfg: head.config.num_heads)


def train_medusa(target, train_windows, heldout_windows, device, out_dir, time_budget_s=None, config=None) -> dict:
    """Medusa heads; saves out_dir/specviz-medusa/ (and FasterDecoding's layout under out_dir/published/)."""
    return train_kind(KIND, target, train_windows, heldout_windows, device, out_dir, time_budget_s, config)


def medusa_labels(input_ids: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Labels of Medusa heads. input_ids: int64 [B, T]. Returns int64 [num_heads, B, T] where
    [i, b, t] = input_ids[b, t + 2 + i], or IGNORE_INDEX past the end."""
    B, T = input_ids.shape
    out = torch.full((num_heads, B, T), IGNORE_INDEX, dtype=input_ids.dtype, device=input_ids.device)
    for i in range(num_heads):
        shift = i + 2
        if shift < T:
            out[i, :, : T - shift] = input_ids[:, shift:]
    return out
