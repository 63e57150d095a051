"""The target's LM head in float32: logits without the 16-bit model's last rounding.

In a bf16 model the logits are bf16: 8 significant bits, so two tokens closer than about 0.4 % of their logit
(one ulp) are tied, and a verify forward of k + 1 rows and a 1-row forward, whose GEMMs sum in different orders,
can round them apart either way (the near-ties of :mod:`specviz.compare.lossless`). :func:`use_fp32_logits` makes
the head a float32 GEMM of the bf16 hidden state against a float32 copy of the head's weight: the logits keep 24
bits, so ties at the logits' own rounding disappear. The hidden state stays bf16, so forwards of different widths
can still differ slightly and a real near-tie can still flip (more rarely): the badge's bound stays the model's
dtype's.

Cost: a float32 copy of the head's weight (V x H x 4 bytes: 113 MB for SmolLM2-135M's 49152 x 576, 2.1 GB for an
8B model's 128256 x 4096) and a float32 GEMM of the head per forward in place of a bf16 one (on a GPU the head's
weight read doubles: at batch 1 a memory-bound GEMM, so roughly twice the head's share of a step). Measured on the
CPU: results/compare/fp32_logits.md.
"""

from __future__ import annotations

from typing import Any

import torch


class Fp32Head(torch.nn.Module):
    """A linear LM head computed in float32: logits [..., V] float32 = hidden.float() @ weight32.T (+ bias).

    ``weight`` stays the original parameter (what the decoder and the heads that share the target's head read:
    its shape and dtype); ``weight32`` is its float32 copy, a buffer (moved with the model, never trained)."""

    def __init__(self, head: torch.nn.Linear):
        super().__init__()
        self.weight = head.weight
        self.bias = head.bias
        self.register_buffer("weight32", head.weight.detach().float(), persistent=False)
        self.register_buffer("bias32", None if head.bias is None else head.bias.detach().float(), persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(hidden.float(), self.weight32, self.bias32)


def use_fp32_logits(decoder: Any) -> None:
    """Compute ``decoder``'s target LM head in float32 (:class:`Fp32Head`); the trace's config records
    ``logits_dtype`` "float32". Call it before the first request: captured CUDA graphs would keep the old head.
    Nothing to do for a float32 model. Raises ValueError after a request ran (pooled runners exist) or for a head
    that is not a plain linear layer."""
    model = decoder.target_model
    head = model.get_output_embeddings()
    if isinstance(head, Fp32Head) or head.weight.dtype == torch.float32:
        decoder.names["logits_dtype"] = "float32"
        return
    if decoder.pool.objects():
        raise ValueError("use_fp32_logits must come before the first request (its CUDA graphs hold the 16-bit head)")
    if type(head) is not torch.nn.Linear:
        raise ValueError(f"the target's LM head is a {type(head).__name__}, not a linear layer: it cannot be "
                         "computed in float32 here")
    model.set_output_embeddings(Fp32Head(head))
    decoder.names["logits_dtype"] = "float32"
