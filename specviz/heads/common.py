"""What every draft head shares: a JSON config, the target's frozen embedding and LM head, fp32 RoPE.

- :class:`JsonConfig`: ``to_json`` / ``from_dict`` / ``from_json`` of a head's dataclass config
  (config.json, with a ``format`` tag; unknown or missing keys raise ValueError).
- :class:`SharedTargetMixin`: ``attach(target)`` shares the target's input embedding and LM head
  (frozen, never saved with the head: vLLM's heads do the same), ``embed_tokens`` / ``lm_head``.
- :class:`Fp32RopeMixin`: RoPE frequencies that stay float32 when a head is cast to bf16.
  transformers keeps a bf16 Llama's ``rotary_emb.inv_freq`` in float32, but ``Module.to(torch.bfloat16)``
  on a head converts its own rotary buffers, and a bf16 ``inv_freq`` rotates position 1000 by up to
  ~4 rad off the angle the head was trained with (the target's).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

FORMAT = "specviz-head-v1"  # the format tag of specviz's own head configs


class JsonConfig:
    """Mixed into a head's ``@dataclass`` config: FORMAT (the ``format`` tag of its config.json) and
    LABEL (the head's name in error messages)."""

    FORMAT: ClassVar[str] = FORMAT
    LABEL: ClassVar[str] = "head"

    def to_json(self) -> str:
        return json.dumps({"format": self.FORMAT, **dataclasses.asdict(self)}, indent=1)

    @classmethod
    def from_dict(cls, data: dict):
        """The config from config.json's fields (``format`` already removed). Raises ValueError for
        unknown or missing keys."""
        names = {f.name for f in dataclasses.fields(cls)}
        if set(data) - names:
            raise ValueError(f"unknown keys in {cls.LABEL} config.json: {sorted(set(data) - names)}")
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING and f.name not in data]
        if required:  # named as config.json spells them, not as a constructor's TypeError does
            raise ValueError(f"{cls.LABEL} config.json lacks {', '.join(required)}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"bad {cls.LABEL} config.json: {exc}") from exc

    @classmethod
    def from_json(cls, text: str):
        """Parse config.json. Raises ValueError for another format or unknown / missing keys."""
        data = json.loads(text)
        if data.pop("format", None) != cls.FORMAT:
            raise ValueError(f"config.json is not a {cls.FORMAT} {cls.LABEL} config")
        return cls.from_dict(data)


class FinalFeatureConfig:
    """A head config whose head reads only the target's final-norm feature f_t: no aux layer taps (the engine's
    trace config reads ``aux_layer_ids`` for every head) and the one tap ``final``
    (:mod:`specviz.methods.eagle.extract`'s names)."""

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        return ()

    @property
    def taps(self) -> tuple[str, ...]:
        return ("final",)


class SharedTargetMixin:
    """``attach(target)``: share the target's input embedding and LM head, frozen (never saved with the
    head). Subclasses set ``check_target`` = their (head config, target config) check (ValueError on a mismatch)."""

    _shared: tuple[nn.Module, nn.Module] | None = None
    check_target: ClassVar[Any]  # staticmethod(check(head_config, target_config))

    def attach(self, target):
        """Share ``target``'s embedding and LM head (frozen). Raises ValueError if the head's config
        does not match the target."""
        self._check_target(target.config)
        emb, lm = target.get_input_embeddings(), target.get_output_embeddings()
        for p in (*emb.parameters(), *lm.parameters()):
            p.requires_grad_(False)
        self._shared = (emb, lm)
        return self

    def _check_target(self, target_config) -> None:
        type(self).check_target(self.config, target_config)

    @property
    def dtype(self) -> torch.dtype:
        """The head's own weights' dtype."""
        return next(self.parameters()).dtype

    @property
    def embed_tokens(self) -> nn.Module:
        return self._require_shared()[0]

    @property
    def lm_head(self) -> nn.Module:
        return self._require_shared()[1]

    def _require_shared(self) -> tuple[nn.Module, nn.Module]:
        if self._shared is None:
            raise ValueError(f"{type(self).__name__} has no target attached: build it with a target or call "
                             "head.attach(target)")
        return self._shared


class Fp32RopeMixin:
    """``_apply`` (behind .to / .cuda / .bfloat16 ...) restores every ``*inv_freq`` buffer of the head's rotary
    module (``rotary_emb.inv_freq`` and ``original_inv_freq``; Gemma 4's per-type ``<type>_inv_freq``) as float32 on
    the new device. ``ROPE_MODULE``: the rotary module's path in the head. Call :meth:`keep_rope_fp32` right after it
    is built."""

    ROPE_MODULE: ClassVar[str] = "rotary_emb"

    def keep_rope_fp32(self) -> None:
        """Remember the fp32 frequencies (not buffers: .to() keeps them fp32)."""
        rot = self.get_submodule(self.ROPE_MODULE)
        self._inv_freq32 = {name: buf.detach().clone().float() for name, buf in rot.named_buffers(recurse=False)
                            if name.endswith("inv_freq")}

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        rot = self.get_submodule(self.ROPE_MODULE)
        for name, freq in self._inv_freq32.items():
            self._inv_freq32[name] = freq = freq.to(getattr(rot, name).device, torch.float32)
            setattr(rot, name, freq)
        return self


def soft_cross_entropy(logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """-sum_x softmax(target_logits)(x) * log_softmax(logits)(x). [..., V] each -> float32 [...]."""
    p = torch.softmax(target_logits.float(), dim=-1)
    return F.cross_entropy(logits.float().flatten(0, -2), p.flatten(0, -2), reduction="none").view(logits.shape[:-1])


def load_weights(head: torch.nn.Module, f: Path, target: Any, dtype: torch.dtype | None) -> Any:
    """Load the safetensors file ``f`` into ``head`` (every tensor its state dict has, of its shape, nothing else),
    move it to the target's device in ``dtype`` (default the target's), attach it to ``target`` and return it in eval
    mode. Raises ValueError naming the missing, unexpected and wrongly shaped tensors."""
    if not f.is_file():
        raise ValueError(f"no head weights at {f} (specviz loads safetensors only)")
    state = load_file(str(f))
    own = head.state_dict()
    missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    bad = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or extra or bad:
        raise ValueError(f"{f} does not match its config: missing {missing}, unexpected {extra}, wrong shapes {bad}")
    head.load_state_dict(state)
    param = next(target.parameters())
    head.to(device=param.device, dtype=dtype or param.dtype)
    return head.attach(target).eval()
