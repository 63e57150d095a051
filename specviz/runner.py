"""Model runners: the only code that calls a model's forward and owns its KV cache.

Cache convention (shared by the target and any model-based drafter): the cache holds every
committed token except the last one, which is fed as the first input of the next forward.
A verification step therefore runs one forward over ``[last_token, x_1, ..., x_k']`` and gets
the k'+1 target distributions p_1..p_{k'+1} at once; afterwards :meth:`truncate` drops the
rejected drafts' entries.

Feature taps: :meth:`forward_features` also returns, from the same forward, the hidden states a
proposer declared (EAGLE: the final-norm output f_t; EAGLE-3: inputs of chosen decoder layers;
DFlash: layer outputs), kept on the device in the model's dtype. They come from transformers'
own ``output_hidden_states`` (a thread-safe hook per decoder layer, no re-implementation):
in transformers 5.17 ``hidden_states`` has L + 1 entries, entry l < L is the input of decoder
layer l (0 = the embeddings) and the last entry is the final norm's output (``last_hidden_state``,
what the LM head multiplies), not the last layer's un-normed output (checked by
tests/test_taps.py). Tap names and their entries are in :func:`hidden_state_index`.

:class:`EagerRunner` uses transformers' :class:`~transformers.DynamicCache` and plain eager
forwards. A static-cache / CUDA-graph runner (the fast GPU path) implements the same three
methods, so proposers, sampler and trace never change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch
from transformers import DynamicCache

FINAL_NORM = "final_norm"  # f_t: output of the final RMSNorm (EAGLE-1, Medusa; methods.md section 0)


def layer_input(layer: int) -> str:
    """Tap name of the input of decoder layer ``layer`` (a^(l)_t, the residual stream; EAGLE-3)."""
    return f"layer_input:{int(layer)}"


def layer_output(layer: int) -> str:
    """Tap name of the output of decoder layer ``layer`` (DFlash; = the input of layer + 1)."""
    return f"layer_output:{int(layer)}"


def hidden_state_index(tap: str, num_layers: int) -> int:
    """The entry of transformers' ``hidden_states`` tuple (L + 1 entries) that holds ``tap``.

    "final_norm" -> L (post-norm, tied to ``last_hidden_state`` by transformers 5.17);
    "layer_input:l" -> l for 0 <= l < L; "layer_output:l" -> l + 1 for 0 <= l < L - 1.
    Raises ValueError for an unknown tap, a layer out of range, or the last layer's output
    (transformers replaces that entry by the post-norm state: use "final_norm" or a hook)."""
    kind, _, num = tap.partition(":")
    if tap == FINAL_NORM:
        return num_layers
    if kind in ("layer_input", "layer_output") and num.lstrip("-").isdigit():
        layer = int(num)
        top = num_layers if kind == "layer_input" else num_layers - 1
        if 0 <= layer < top:
            return layer if kind == "layer_input" else layer + 1
        raise ValueError(f"tap {tap!r}: layer must be in 0..{top - 1} for a model of {num_layers} layers"
                         + ("; the last layer's un-normed output is not tapped, use 'final_norm'" if
                            kind == "layer_output" and layer == num_layers - 1 else ""))
    raise ValueError(f"unknown feature tap {tap!r}; use 'final_norm', 'layer_input:<l>' or 'layer_output:<l>'")


def check_taps(taps: Sequence[str], model: torch.nn.Module) -> tuple[str, ...]:
    """``taps`` as a tuple, each validated against ``model``'s layer count (see :func:`hidden_state_index`)."""
    num_layers = int(model.config.num_hidden_layers)
    for tap in taps:
        hidden_state_index(tap, num_layers)
    return tuple(taps)


@dataclass
class ForwardOutput:
    """One forward's results, all on the model's device (no host copy).

    logits:   float32 [n, V], the logits of the n fed positions.
    features: {tap name: [n, d] in the model's dtype} for every requested tap, rows in the order fed.
    """

    logits: torch.Tensor
    features: dict[str, torch.Tensor] = field(default_factory=dict)


def pick_features(hidden_states: Sequence[torch.Tensor], taps: Sequence[str],
                  num_layers: int) -> dict[str, torch.Tensor]:
    """{tap: hidden_states[index][0]} ([n, d] each) from a batch-1 ``hidden_states`` tuple."""
    return {tap: hidden_states[hidden_state_index(tap, num_layers)][0] for tap in taps}


class ModelRunner(Protocol):
    """What the engine needs from a model. ``seq_len``: tokens currently in the cache."""

    seq_len: int

    def reset(self) -> None:
        """Drop the cache (a new request starts)."""

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Append ``token_ids`` (int64 [n], n >= 1) to the cache and return float32 logits [n, V]
        for those positions (= ``forward_features(token_ids).logits``)."""

    def forward_features(self, token_ids: torch.Tensor, taps: Sequence[str] = ()) -> ForwardOutput:
        """Like :meth:`forward`, also returning the hidden states named in ``taps`` (see
        :func:`hidden_state_index`) from the same forward. Raises ValueError for a bad tap."""

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens (rollback after a rejection)."""


class EagerRunner:
    """An HF causal LM with a DynamicCache, one eager forward per call.

    model: a transformers ``*ForCausalLM`` in eval mode. The cache is cropped with
    ``DynamicCache.crop(-n_removed)``, which works on transformers 5.17 and later.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.device = next(model.parameters()).device
        self.cache: DynamicCache | None = None
        self.seq_len = 0

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.seq_len = 0

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.forward_features(token_ids).logits

    @torch.inference_mode()
    def forward_features(self, token_ids: torch.Tensor, taps: Sequence[str] = ()) -> ForwardOutput:
        taps = check_taps(taps, self.model)
        if self.cache is None:
            self.reset()
        ids = token_ids.to(self.device).view(1, -1)  # [1, n]
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, output_hidden_states=bool(taps))
        self.seq_len += ids.shape[1]
        features = pick_features(out.hidden_states, taps, self.model.config.num_hidden_layers) if taps else {}
        return ForwardOutput(out.logits[0].float(), features)  # logits [n, V]

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.seq_len:
            raise ValueError(f"cannot truncate a cache of {self.seq_len} tokens to {length}")
        if length < self.seq_len:
            self.cache.crop(length - self.seq_len)
            self.seq_len = length

    def layer_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder layer ``layer``'s cached (keys, values), each [kv_heads, seq_len, head_dim] views of
        the cache (keys with RoPE applied), for proposers that read the target's cache (mtp). Never write to them."""
        return _layer_kv(self.cache, layer, self.seq_len, self.model)

    def cached_keys(self) -> list[torch.Tensor]:
        """The cached key tensors, one [1, H, seq_len, D] per layer (for tests)."""
        return [layer.keys for layer in self.cache.layers]


def _layer_kv(cache, layer: int, seq_len: int, model) -> tuple[torch.Tensor, torch.Tensor]:
    """(keys, values) [kv_heads, seq_len, head_dim] of a transformers cache's layer (batch row 0).
    Raises ValueError for a layer out of range or an empty cache."""
    num_layers = int(model.config.num_hidden_layers)
    if not 0 <= layer < num_layers:
        raise ValueError(f"layer_kv: layer must be in 0..{num_layers - 1}, got {layer}")
    if cache is None or seq_len == 0 or not getattr(cache.layers[layer], "is_initialized", True):
        raise ValueError("layer_kv: the cache is empty (run a forward first)")
    lay = cache.layers[layer]
    return lay.keys[0, :, :seq_len], lay.values[0, :, :seq_len]
