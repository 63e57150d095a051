"""A plain reference of chain drafting with a head on one sequence (docs/design/methods.md 1.1 and 2.1).

Not the engine's proposer (that is :mod:`specviz.methods.eagle.proposer`); this is the few-line definition the
tests and the trainer's held-out evaluation compare against. With committed tokens x_0..x_n
(x_n = the root, not yet run through the target) and target features g_0..g_{n-1}:

* first pass: rows j = 0..n-1 read (g_j, x_{j+1}) at position j; its last row gives the logits
  of x_{n+1} and the fed-back hidden \\hat h_{n-1};
* draft step m = 2..k: input (\\hat h of the previous step, d_{m-1}) at position n+m-2.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


@torch.no_grad()
def chain_logits(head, features: torch.Tensor, tokens: torch.Tensor, steps: int,
                 forced: torch.Tensor | None = None, cache=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft ``steps`` tokens greedily (or teacher-forced) from one sequence.

    features: [n, F] target features g_0..g_{n-1}; tokens: int64 [n + 1] = x_0..x_n.
    forced: int64 [steps - 1] tokens to feed at draft steps 2..steps instead of the argmax (the
    training-time test feeds the data tokens); None = greedy chain.
    cache: a DynamicCache holding the head's K/V of positions < some length (cropped to 0 here if
    None is given a fresh one). Returns (draft ids int64 [steps], logits float32 [steps, V])."""
    n = features.shape[0]
    if tokens.shape != (n + 1,):
        raise ValueError(f"tokens must be x_0..x_n = [{n + 1}] for {n} features, got {tuple(tokens.shape)}")
    cache = cache if cache is not None else DynamicCache()
    pos = torch.arange(n, device=features.device)
    hidden, logits = head(features, tokens[1:], pos, cache, from_target=True)  # [n, d], [n, V]
    h, out_logits = hidden[-1:], [logits[-1]]
    drafts = [logits[-1].argmax()]
    for m in range(1, steps):
        tok = forced[m - 1] if forced is not None else drafts[-1]
        h, lg = head(h, tok.view(1), torch.tensor([n + m - 1], device=features.device), cache, from_target=False)
        out_logits.append(lg[0])
        drafts.append(lg[0].argmax())
    return torch.stack(drafts), torch.stack(out_logits)
