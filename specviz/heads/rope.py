"""RoPE frequencies that stay float32 when a head is cast to bf16.

transformers keeps a bf16 Llama's ``rotary_emb.inv_freq`` in float32, but ``Module.to(torch.bfloat16)``
on a head converts its own rotary buffers, and a bf16 ``inv_freq`` rotates position 1000 by up to
~4 rad off the angle the head was trained with (the target's). Heads that own a
``LlamaRotaryEmbedding`` as ``self.rotary_emb`` mix this in first and call :meth:`keep_rope_fp32`
after building it.
"""

from __future__ import annotations

import torch


class Fp32RopeMixin:
    """``_apply`` (behind .to / .cuda / .bfloat16 ...) restores ``rotary_emb.inv_freq`` (and
    ``original_inv_freq``) as float32 on the new device."""

    def keep_rope_fp32(self) -> None:
        """Remember the fp32 frequencies (call once, right after ``self.rotary_emb`` is built)."""
        self._inv_freq32 = self.rotary_emb.inv_freq.detach().clone().float()  # not a buffer: .to() keeps fp32

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        rot = self.rotary_emb
        self._inv_freq32 = self._inv_freq32.to(rot.inv_freq.device, torch.float32)
        rot.inv_freq = rot.original_inv_freq = self._inv_freq32
        return self
