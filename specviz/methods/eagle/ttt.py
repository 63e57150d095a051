"""EAGLE-3's training-time test (TTT): the head unrolled over S draft steps on a whole window at once.

Source: EAGLE ``eagle/traineagle3/cnets.py::Model.forward`` (``cache_hidden``, length 7) and
docs/design/methods.md 4.3. Row t of step s stands for draft step s of a chain whose last committed feature is
at position t: its input is (step s-1's pre-norm output at row t, x_{t+1+s}), at RoPE position t+s,
and it predicts x_{t+2+s}. Step 0 reads the target features (EAGLE-3: through fc).

Attention at step s (keys of all steps 0..s concatenated along the key axis, [T, (s+1)T]):
the query of row t sees the step-0 keys of rows <= t (causal; K/V from target features) and, for
each earlier step i = 1..s, only the step-i key of the same row t (a diagonal). This is exactly what
the chain sees at inference: the committed prefix (positions <= t) plus its own draft keys at
positions t+1..t+s (checked by tests/test_heads.py against running the head as a chain).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def ttt_mask(T: int, step: int, device=None) -> torch.Tensor:
    """Attention mask of TTT step ``step`` (0-based) over T rows: bool [1, 1, T, (step + 1) * T],
    True = attend. Block 0 causal, blocks 1..step diagonal."""
    rows = torch.arange(T, device=device)
    causal = rows[None, :] <= rows[:, None]  # [T, T]
    eye = rows[None, :] == rows[:, None]  # [T, T]
    return torch.cat([causal] + [eye] * step, dim=1)[None, None]


def iter_unroll(head, features: torch.Tensor, input_ids: torch.Tensor, position_ids: torch.Tensor, steps: int):
    """Run ``steps`` TTT steps, yielding (hidden [B, T, d], logits float32 [B, T, V]) per step.

    features [B, T, F]: target features of rows t (f_t, or the EAGLE-3 taps); input_ids int64
    [B, T + steps]: row t of step s reads input_ids[:, t + s], so pass x_{1..T+steps} (the tokens
    after each feature; pad the end with any id: rows whose label lies past the window are the
    caller's to drop); position_ids int64 [B, T] (the features' positions, usually arange(T)).
    Step s's logits at row t predict x_{t+2+s}. Works for EAGLE-1 too (its later steps read its own
    output feature). Raises ValueError for inconsistent shapes."""
    B, T = features.shape[:2]
    if input_ids.shape != (B, T + steps) or position_ids.shape != (B, T):
        raise ValueError(f"unroll: input_ids must be [B, T + steps] = {(B, T + steps)} and position_ids "
                         f"[B, T] = {(B, T)}; got {tuple(input_ids.shape)}, {tuple(position_ids.shape)}")
    cache, hidden = DynamicCache(), features
    for s in range(steps):
        mask = ttt_mask(T, s, features.device)
        hidden, logits = head(hidden, input_ids[:, s : s + T], position_ids + s, cache,
                              from_target=(s == 0), attention_mask=mask)
        yield hidden, logits


def unroll(head, features, input_ids, position_ids, steps: int) -> list:
    """:func:`iter_unroll` as a list of ``steps`` (hidden, logits) pairs."""
    return list(iter_unroll(head, features, input_ids, position_ids, steps))
