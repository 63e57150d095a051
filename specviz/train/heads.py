"""Where EAGLE and Medusa heads will be trained on the bundled target's hidden states.

A later issue trains the heads; this module fixes the data they train on so that the pairing is
exact and tested now:

* :func:`target_hidden_states` runs the frozen target and returns the features the heads consume:
  the final hidden state (after the last RMSNorm, i.e. exactly what the LM head multiplies) and,
  for EAGLE-3, chosen intermediate layers.
* :func:`eagle_batch` pairs the feature of position t with the token at t+1 (EAGLE, Li et al.
  2024, arXiv 2401.15077) and gives the regression target f_{t+1} and the token target x_{t+2}.
* :func:`medusa_labels` gives head i the token i+2 positions after position t (Medusa, Cai et al.
  2024, arXiv 2401.10774: the LM head predicts x_{t+1}, Medusa head i (0-based) x_{t+2+i}).

To add a head: write ``train_<name>(target, windows, device) -> dict`` that draws batches of
windows, calls :func:`target_hidden_states` under ``torch.no_grad()`` and the pairing helpers,
trains the head and returns its log; register it in ``HEAD_TRAINERS``. The recipe
(:func:`specviz.train.recipe.run`) calls :func:`train_heads` after the LM training, with the trained
target, and stores the returned logs under ``"heads"`` in train_log.json. Nothing is registered yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

IGNORE_INDEX = -100

HEAD_TRAINERS: dict[str, Callable[[torch.nn.Module, torch.Tensor, torch.device], dict]] = {}


@dataclass
class HiddenStates:
    """Target features for head training.

    final:  [B, T, D] hidden state after the final norm (logits = final @ lm_head.weight.T).
    layers: {layer index: [B, T, D]} outputs of the requested decoder layers (index 0 = the
            embeddings, i = output of decoder layer i, as in HF ``output_hidden_states``).
    """

    final: torch.Tensor
    layers: dict[int, torch.Tensor]


@torch.no_grad()
def target_hidden_states(target, input_ids: torch.Tensor, layers: Sequence[int] = ()) -> HiddenStates:
    """Run the target once. input_ids: int64 [B, T]. layers: indices into HF hidden_states
    (0 = embeddings .. num_hidden_layers; EAGLE-3 takes a low, a middle and a high one).
    Returns float tensors in the model's compute dtype. Raises IndexError for a bad layer index."""
    out = target.model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
    return HiddenStates(final=out.last_hidden_state, layers={i: out.hidden_states[i] for i in layers})


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


def train_heads(target, windows: torch.Tensor, device: torch.device) -> dict[str, dict]:
    """Train every registered head on the frozen target. windows: int64 [W, T+1] on device.
    Returns {head name: its log}; empty while HEAD_TRAINERS is empty."""
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    logs = {name: fn(target, windows, device) for name, fn in HEAD_TRAINERS.items()}
    for p in target.parameters():
        p.requires_grad_(True)
    return logs
