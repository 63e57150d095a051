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
forwards. Sliding-window layers (Gemma 2/3/4, GPT-OSS, Mistral with a window, ...) get full-length
cache layers and their window through the mask (:mod:`specviz.attention` says why), so a rollback is
exact across the window boundary; unsupported layouts raise at construction. A static-cache /
CUDA-graph runner (the fast GPU path) implements the same three methods, so proposers, sampler and
trace never change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch
from transformers import DynamicCache

from .attention import attention_layout, dynamic_cache, layer_masks, mask_for  # noqa: F401 - mask_for re-exported
from .transfer import to_device
from .tree import ancestor_mask_device, depths, is_chain, validate_parents

FINAL_NORM = "final_norm"  # f_t: output of the final RMSNorm (EAGLE-1, Medusa; docs/design/methods.md section 0)


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

    def forward_features(self, token_ids: torch.Tensor, taps: Sequence[str] = (),
                         parents: Sequence[int] | None = None) -> ForwardOutput:
        """Like :meth:`forward`, also returning the hidden states named in ``taps`` (see
        :func:`hidden_state_index`) from the same forward. Raises ValueError for a bad tap.

        parents: None (a chain: causal positions) or a draft tree's N parents
        (:mod:`specviz.tree`); then ``token_ids`` is [1 + N] = the last committed token + the N
        nodes, row 1 + i at position ``seq_len + depth[i]``, attending to every cached key and its
        own ancestors (:func:`tree_attention`). A chain given as parents takes the causal path."""

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` cached tokens (rollback after a rejection)."""

    def commit(self, kept: Sequence[int], rows: torch.Tensor | None = None) -> None:
        """After a (tree) forward: keep its first row (the last committed token) and the nodes
        ``kept`` (the accepted path, root child first), compacted into place: node c_m's K/V
        (slot start + 1 + c_m) -> slot start + 1 + m; length start + 1 + len(kept). ``rows``: the
        same nodes' forward rows 1 + c_m, int64 [len(kept)] already on the device (the tree verifier's
        kept rows), so no index is copied from the host; they must equal ``kept`` (not checked)."""


def tree_attention(parents: Sequence[int]) -> torch.Tensor:
    """bool [1 + N, 1 + N] attention among a tree forward's rows (row 0 = the root, the last
    committed token; row 1 + i = node i): ``M[a, b]`` iff b is a or an ancestor of a, so
    column 0 is all True (docs/design/methods.md 1.3; Medusa ``generate_medusa_buffers``, vLLM
    ``tree_attn._prepare_tree_attn_bias``). Built from the parents in one pass."""
    parents = validate_parents(parents)
    n = len(parents)
    m = torch.eye(n + 1, dtype=torch.bool)
    m[:, 0] = True
    for i, p in enumerate(parents):
        m[i + 1] |= m[p + 1]
    return m


def tree_attention_device(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`tree_attention` and the nodes' depths from parents int64 [N] on the device, by device ops only
    (pointer doubling: ceil(log2 N) boolean matrix products), for a tree drafted on the device whose host
    copy has not been read yet. Returns (mask bool [1 + N, 1 + N], depth int64 [N], 1 = a root child)."""
    N = int(parents.numel())
    anc = ancestor_mask_device(parents)  # [N, N]: ancestors and itself
    mask = torch.ones(N + 1, N + 1, dtype=torch.bool, device=parents.device).tril()
    mask[1:, 1:] = anc
    mask[0, 1:] = False
    return mask, anc.sum(dim=1)


def tree_positions(parents: Sequence[int], start: int) -> torch.Tensor:
    """int64 [1 + N]: ``start`` for the root row, ``start + depth[i]`` for node i."""
    return torch.tensor([start, *(start + d for d in depths(parents))], dtype=torch.long)


def as_tree(parents: Sequence[int] | None, n_rows: int) -> list[int] | None:
    """``parents`` validated against a forward of ``n_rows`` tokens (1 + N), or None for a chain
    (None given, or parents i - 1: the causal fast path). Raises ValueError on a size mismatch."""
    if parents is None:
        return None
    if isinstance(parents, torch.Tensor):  # drafted on the device (its host copy not read yet): a tree
        if parents.dim() != 1 or parents.numel() + 1 != n_rows:
            raise ValueError(f"a tree forward takes 1 + N tokens; parents on the device have shape "
                             f"{list(parents.shape)} for {n_rows} tokens")
        return parents
    parents = validate_parents(parents)
    if len(parents) + 1 != n_rows:
        raise ValueError(f"a tree forward takes 1 + N tokens (the last committed token + {len(parents)} nodes), "
                         f"got {n_rows}")
    return None if is_chain(parents) else parents


def compact_layers(layers: Sequence, start: int, kept: Sequence[int], rows: torch.Tensor | None = None) -> None:
    """Copy K/V of slots ``start + 1 + kept[m]`` to ``start + 1 + m`` in every cache layer
    (``keys`` / ``values`` [1, H, L, D]); sources are gathered first (src >= dst, overlaps safe).
    Node c_m of the accepted path has depth m, so it was rotated at position start + m already:
    no re-rotation (EAGLE / Medusa ``update_inference_inputs``). ``rows``: 1 + kept on the device
    (int64 [len(kept)]), else the indices are queued from the host."""
    if list(kept) == list(range(len(kept))):
        return  # already in place (a chain, or the first children)
    device = layers[0].keys.device
    copy_slots(layers, kept_slots(start, kept, rows, device),
               torch.arange(start + 1, start + 1 + len(kept), dtype=torch.long, device=device))


def kept_slots(start: int, kept: Sequence[int], rows: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """int64 [len(kept)] on ``device``: the cache slots start + 1 + kept[m] of a commit's nodes, from their forward
    rows (``rows`` = 1 + kept, on the device: one add, no host copy) or queued from the host list."""
    if rows is not None:
        return rows.to(device) + start
    return to_device(torch.tensor([start + 1 + int(c) for c in kept], dtype=torch.long), device)  # queued, no wait


def copy_slots(layers: Sequence, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy slots ``src`` to ``dst`` (int64 [L] on the device) in every layer's ``keys`` / ``values``
    [1, H, S, D]; sources are gathered first (so src >= dst may overlap). Replayable (device ops only)."""
    for layer in layers:
        for t in (layer.keys, layer.values):
            t.index_copy_(2, dst, t.index_select(2, src))


class EagerRunner:
    """An HF causal LM with a DynamicCache, one eager forward per call.

    model: a transformers ``*ForCausalLM`` in eval mode. The cache is cropped with
    ``DynamicCache.crop(-n_removed)``, which works on transformers 5.17 and later; its sliding-window
    layers are full-length (:func:`specviz.attention.dynamic_cache`), so crop never meets a discarded entry.
    Raises :class:`specviz.attention.UnsupportedModelError` (a ValueError) for a layout it cannot roll back.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.layout = attention_layout(model.config)
        self.device = next(model.parameters()).device
        self.cache: DynamicCache | None = None
        self.seq_len = 0
        self.last_start = 0  # seq_len before the last forward (commit's reference)

    def reset(self) -> None:
        self.cache = dynamic_cache(self.model)
        self.seq_len = 0
        self.last_start = 0

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.forward_features(token_ids).logits

    @torch.inference_mode()
    def forward_features(self, token_ids: torch.Tensor, taps: Sequence[str] = (),
                         parents: Sequence[int] | None = None) -> ForwardOutput:
        taps = check_taps(taps, self.model)
        if self.cache is None:
            self.reset()
        ids = token_ids.to(self.device).view(1, -1)  # [1, n]
        if isinstance(parents, torch.Tensor):  # a tree drafted on the device: the reference reads it here
            parents = [int(v) for v in parents.tolist()]
        tree = as_tree(parents, ids.shape[1])
        kw = {}
        if tree is not None:  # all cached keys + the ancestor mask (and each layer's window); positions start + depth
            n = self.seq_len
            allowed = torch.cat([torch.ones(len(tree) + 1, n, dtype=torch.bool), tree_attention(tree)], dim=1)
            q_pos = tree_positions(tree, n)  # [1 + N]
            k_pos = torch.cat([torch.arange(n), q_pos])  # [n + 1 + N]: cached keys, then the tree's rows
            allowed, q_pos, k_pos = (t.to(self.device) for t in (allowed, q_pos, k_pos))
            kw = dict(attention_mask=layer_masks(allowed, q_pos, k_pos, self.layout, self.model),
                      position_ids=q_pos[None])
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, output_hidden_states=bool(taps),
                         **kw)
        self.last_start = self.seq_len
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

    @torch.inference_mode()
    def commit(self, kept: Sequence[int], rows: torch.Tensor | None = None) -> None:
        length = self.last_start + 1 + len(kept)
        if length > self.seq_len:
            raise ValueError(f"commit keeps {len(kept)} nodes after a forward of {self.seq_len - self.last_start} tokens")
        compact_layers(self.cache.layers, self.last_start, kept, rows)
        self.truncate(length)

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
