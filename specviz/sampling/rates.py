"""Synthetic verification's rates (vLLM ``rejection_sample_method="synthetic"``): the one helper the
PyTorch reference (:mod:`specviz.sampling.reference`) and the Triton kernel
(``specviz.kernels.rejection_sampler``) share; it imports neither of them.
"""

from __future__ import annotations

import torch


def conditional_rates(rates, K: int, device: torch.device) -> torch.Tensor:
    """Unconditional rates a_1.. -> conditional a_i / a_{i-1} (a_0 = 1; 0 if a_{i-1} = 0), float64 [K]
    on ``device``. rates: a sequence or 1-D tensor of length >= K (validated on the host).
    Raises ValueError when missing, too short, outside [0, 1] or increasing."""
    if rates is None:
        raise ValueError("method 'synthetic' needs synthetic_rates: a_1 >= a_2 >= ... in [0, 1], length >= K")
    a = torch.as_tensor(rates, dtype=torch.float64).detach().cpu()
    if a.dim() != 1 or a.numel() < K:
        raise ValueError(f"synthetic_rates must be 1-D with length >= K = {K}, got shape {list(a.shape)}")
    a = a[:K]
    if not bool(torch.isfinite(a).all()) or bool((a < 0).any()) or bool((a > 1).any()):
        raise ValueError(f"synthetic_rates must lie in [0, 1], got {a.tolist()}")
    prev = torch.cat([torch.ones(1, dtype=torch.float64), a])[:K]  # [K] a_{i-1}, a_0 = 1
    if bool((a > prev).any()):
        raise ValueError(f"synthetic_rates must be non-increasing (a_1 >= a_2 >= ...), got {a.tolist()}")
    safe = torch.where(prev > 0, prev, torch.ones_like(prev))
    return torch.where(prev > 0, a / safe, torch.zeros_like(a)).to(device)
