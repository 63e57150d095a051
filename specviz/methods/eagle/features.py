"""The target features a head consumes, from one target forward (transformers 5.17 semantics).

``hidden_states`` of ``LlamaModel(..., output_hidden_states=True)`` has L + 1 entries: entry l < L
is the **input** of decoder layer l (entry 0 = the embedding output), un-normed residual stream;
entry L is tied to ``last_hidden_state``, i.e. the output of the final RMSNorm (transformers'
``capture_outputs(tie_last_hidden_states=True)``; checked by tests/test_heads.py). So:

* f_t (EAGLE-1's feature, what the LM head multiplies) = ``last_hidden_state`` = ``hidden_states[L]``;
* EAGLE-3 tap l = ``hidden_states[l]`` with 0 <= l < L (vLLM's ``aux_hidden_states`` captured before
  running layer l; docs/design/methods.md 0 and 4.1). The pre-norm output of the last layer is not in the tuple.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.methods.eagle.config import EAGLE3, HeadConfig


@dataclass
class TargetFeatures:
    """One target forward, for a head.

    final:    [B, T, d] f_t after the final norm (target compute dtype).
    features: [B, T, F] what the head's first pass reads (F = config.feature_size): ``final`` for
              eagle, the aux taps concatenated in ``aux_layer_ids`` order for eagle3.
    logits:   [B, T, V] float32 target logits W_lm f_t (predicting x_{t+1}); None unless asked.
    """

    final: torch.Tensor
    features: torch.Tensor
    logits: torch.Tensor | None = None


def target_features(target, input_ids: torch.Tensor, config: HeadConfig, with_logits: bool = False,
                    attention_mask: torch.Tensor | None = None) -> TargetFeatures:
    """Run ``target.model`` once on input_ids int64 [B, T] and return the head's features.
    Call under ``torch.no_grad()`` (and autocast) as the caller wishes; nothing is synced to host."""
    need_taps = config.kind == EAGLE3
    out = target.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=need_taps,
                       use_cache=False)
    final = out.last_hidden_state
    feats = torch.cat([out.hidden_states[i] for i in config.aux_layer_ids], dim=-1) if need_taps else final
    logits = target.lm_head(final).float() if with_logits else None
    return TargetFeatures(final=final, features=feats, logits=logits)
