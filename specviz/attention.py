"""Which attention layouts the runners support, and each layer's window applied by the mask.

Speculative decoding rolls the KV cache back after every rejection. transformers' sliding-window
cache layers (``DynamicSlidingWindowLayer``, ``StaticSlidingWindowLayer``) keep only the last
``sliding_window`` positions and overwrite (or roll) older ones, so a rollback across the window
boundary would need entries they already discarded: ``DynamicCache.crop`` raises ("`crop` was called,
but the current layer does not track past states, and the sliding window size was already reached"), and
the static layer's ring buffer no longer matches a moved write position (a 64 vs 512 size mismatch).

Choice: every attention layer gets a *full-length* cache layer (transformers' own ``DynamicLayer`` /
``StaticLayer``) and each layer's window is applied by the attention mask instead, the way transformers'
own ``sliding_window_overlay`` defines it (query at position i sees keys at positions j with
i - sliding_window < j <= i). Why this and not "keep enough past" (``activate_past_recording``, or a
ring of window + k slots): with full-length layers a rollback is what it is for full attention (crop,
or moving the static write position), a tree forward's ancestor mask and the window combine into one
mask per layer type, the static mask stays a pure function of the device write position (so CUDA graphs
capture it), and the K/V compaction after a tree commit is the same copy for every layer. The cost is
memory: sliding layers hold the whole context instead of the window (for Gemma 3's five sliding layers per
full one, up to 6x the KV of the windowed cache once the context is much longer than the window; the same
KV as a full-attention model of that size).

How the mask reaches each layer (:class:`AttentionLayout`): models whose config lists ``layer_types``
(Gemma 2/3/4, GPT-OSS, Cohere2, Qwen2/3 and SmolLM3 with a window) take ``{layer_type: 4D mask}`` and
give each layer its type's mask; models with one ``sliding_window`` for every layer and no
``layer_types`` (Mistral, Mixtral, Phi-3, Qwen3-MoE) take one mask, the windowed one. A model with
neither keeps the plain causal mask.

Refused (:class:`UnsupportedModelError`, a ValueError naming the family and the reason, raised when the
model is loaded): layer types whose cache is not positional K/V (``linear_attention``, ``conv``,
``hybrid``, ``hybrid_sliding``, ``moe``/``mlp`` placeholders: recurrent states such as Qwen3-Next's,
LFM2's or Mamba's cannot be rolled back by moving a position; likewise :data:`RECURRENT_FAMILIES` and
configs without attention heads), ``chunked_attention`` (Llama 4:
block-local masks are not implemented here), sparse-indexer layers (DeepSeek V3.2's), and bidirectional
configurations (``use_bidirectional_attention``: embedding models, not causal LMs).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

FULL, SLIDING = "full_attention", "sliding_attention"
SUPPORTED_LAYER_TYPES = (FULL, SLIDING)
REFUSED_LAYER_TYPES = {
    "linear_attention": "its linear-attention layers keep a recurrent state, which cannot be rolled back to an "
                        "earlier position after a rejected draft",
    "conv": "its convolution layers keep a recurrent state, which cannot be rolled back after a rejected draft",
    "hybrid": "its hybrid layers keep a recurrent state, which cannot be rolled back after a rejected draft",
    "hybrid_sliding": "its hybrid layers keep a recurrent state, which cannot be rolled back after a rejected draft",
    "moe": "it mixes layers without a K/V cache (recurrent or MLP-only) into the cache layout",
    "mlp": "it mixes layers without a K/V cache (recurrent or MLP-only) into the cache layout",
    "chunked_attention": "its chunked (block-local) attention layers are not supported by specviz's masks",
    "deepseek_sparse_attention": "its sparse-indexer attention layers are not supported by specviz's runners",
    "qwen_sparse_attention": "its sparse-indexer attention layers are not supported by specviz's runners",
}


# families whose recurrent blocks their config does not list as layer types (transformers 5.17)
RECURRENT_FAMILIES = {"rwkv": "RWKV", "recurrent_gemma": "RecurrentGemma (Griffin)", "xlstm": "xLSTM"}


class UnsupportedModelError(ValueError):
    """A model family the runners cannot decode exactly; the message names the family and the reason."""


@dataclass(frozen=True)
class AttentionLayout:
    """How a model's attention layers see the cache.

    family:       the config's ``model_type`` ("gemma2", "mistral", ...), for messages.
    layer_types:  one entry per decoder layer ("full_attention" | "sliding_attention").
    window:       the sliding window W (a query at position i sees keys at positions > i - W), or None.
    per_type:     True: the model takes ``{layer_type: mask}``; False: one mask for every layer.
    """

    family: str
    layer_types: tuple[str, ...]
    window: int | None
    per_type: bool

    @property
    def sliding(self) -> bool:
        """Whether some layer attends within a window (its mask then differs from the causal one)."""
        return self.window is not None and SLIDING in self.layer_types


def attention_layout(config) -> AttentionLayout:
    """The :class:`AttentionLayout` of a transformers config (its text config for multimodal ones).

    Layer types come from the config as transformers' caches read them
    (``transformers.cache_utils.get_layer_types_and_kwargs``: ``layer_types``, else all sliding when
    ``sliding_window`` is set, else all full). Raises :class:`UnsupportedModelError` for a layer type
    the runners cannot roll back or mask (see the module docstring)."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    text = config.get_text_config(decoder=True)
    family = str(getattr(text, "model_type", "") or type(text).__name__)
    explicit = getattr(text, "layer_types", None)
    if explicit is None and getattr(text, "sliding_window", None) is None \
            and getattr(text, "attention_chunk_size", None) is None:
        types = (FULL,) * int(text.num_hidden_layers)
    else:
        types = tuple(explicit) if explicit is not None else tuple(get_layer_types_and_kwargs(text)[0])
    if family in RECURRENT_FAMILIES or not hasattr(text, "num_attention_heads"):
        raise UnsupportedModelError(
            f"model family {family!r} cannot be decoded by specviz: its recurrent blocks keep a state, which cannot "
            "be rolled back to an earlier position after a rejected draft")
    for kind in dict.fromkeys(types):
        if kind not in SUPPORTED_LAYER_TYPES:
            reason = REFUSED_LAYER_TYPES.get(kind, f"its {kind!r} layers are not supported by specviz's runners")
            raise UnsupportedModelError(
                f"model family {family!r} cannot be decoded by specviz: {reason}. Supported: decoder-only models "
                f"whose layers are {' or '.join(SUPPORTED_LAYER_TYPES)} (Llama, Qwen, Mistral, Gemma 2/3/4, GPT-OSS, "
                "...)")
    if getattr(text, "use_bidirectional_attention", None) in (True, "all"):  # EmbeddingGemma-style encoders
        raise UnsupportedModelError(f"model family {family!r} is configured with bidirectional attention "
                                    "(use_bidirectional_attention): it is not a causal LM that can be decoded")
    window = getattr(text, "sliding_window", None) if SLIDING in types else None
    if SLIDING in types and (not isinstance(window, int) or window < 1):
        raise UnsupportedModelError(f"model family {family!r} has sliding-window layers but sliding_window = "
                                    f"{window!r}; set it to a positive integer in config.json")
    return AttentionLayout(family=family, layer_types=types, window=window, per_type=explicit is not None)


def dynamic_cache(model: torch.nn.Module):
    """A transformers ``DynamicCache`` for ``model`` whose sliding-window layers are replaced by full-length
    ``DynamicLayer`` s (see the module docstring), so that a rollback by ``crop`` is exact."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    cache = DynamicCache(config=model.config)
    cache.layers = [DynamicLayer() if isinstance(layer, DynamicSlidingWindowLayer) else layer for layer in cache.layers]
    return cache


def static_cache(model: torch.nn.Module, max_cache_len: int):
    """A transformers ``StaticCache`` of ``max_cache_len`` slots in every layer: sliding-window layers are
    replaced by full-length ``StaticLayer`` s (see the module docstring)."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

    cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    cache.layers = [StaticLayer(max_cache_len=max_cache_len) if isinstance(layer, StaticSlidingWindowLayer) else layer
                    for layer in cache.layers]
    return cache


def mask_for(allowed: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    """bool allowed [n, kv] -> the 4D mask [1, 1, n, kv] transformers takes as given: bool for
    sdpa, additive (0 / dtype min) for eager attention."""
    if model.config._attn_implementation == "sdpa":
        return allowed[None, None]
    neg = torch.finfo(model.dtype).min
    return torch.zeros(allowed.shape, dtype=model.dtype, device=allowed.device).masked_fill_(~allowed, neg)[None, None]


def layer_masks(allowed: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, layout: AttentionLayout,
                model: torch.nn.Module):
    """The ``attention_mask`` argument for a forward whose full-attention visibility is ``allowed``.

    allowed: bool [n, kv] (causal, or a tree's ancestors; stale slots False). q_pos: int64 [n], the
    queries' positions; k_pos: int64 [kv], the keys' positions (slots past the tree are masked by ``allowed``
    whatever they hold). Sliding layers also need q_pos - k_pos < window (transformers'
    ``sliding_window_overlay``). Returns a 4D mask [1, 1, n, kv] (no sliding layer: the causal one; every
    layer sliding and one mask per model: the windowed one) or ``{layer_type: 4D mask}``. Device ops only."""
    if not layout.sliding:
        return mask_for(allowed, model)
    windowed = allowed & ((q_pos[:, None] - k_pos[None, :]) < layout.window)  # [n, kv]
    if not layout.per_type:
        return mask_for(windowed, model)
    return {FULL: mask_for(allowed, model), SLIDING: mask_for(windowed, model)}


# ---- mixture-of-experts layers under CUDA graphs -----------------------------------------------

def graph_experts_implementation(model: torch.nn.Module) -> str | None:
    """The experts implementation a CUDA-graph capture of ``model``'s small forwards must use, or None
    (no change: not an MoE model using transformers' experts interface, not on CUDA, or already capturable).

    transformers 5.17 dispatches MoE experts (``@use_experts_implementation``: Qwen3-MoE, Mixtral, OLMoE,
    GPT-OSS, Gemma 4's MoE ...) to ``config._experts_implementation``, by default "grouped_mm"
    (``integrations/moe.py: grouped_mm_experts_forward``), which calls ``torch.nn.functional.grouped_mm``
    with the per-expert offsets on the device. PyTorch's CUDA kernel takes its CUTLASS fast path only for
    bfloat16 inputs on sm90 / sm100; otherwise it falls back to ``at::native::_grouped_mm_fallback``
    (``aten/src/ATen/native/GroupedMMUtils.h``), whose first line is ``offs.cpu()``: a device-to-host copy,
    which a capture refuses ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the
    CPU tensor is pinned"; seen with fp32 Qwen3-MoE on the H200). The original per-expert loop ("eager")
    is no better: ``nonzero()`` and ``if expert_idx == ...`` read device values on the host. So outside
    the fast path the captured forwards use "batched_mm" (``batched_mm_experts_forward``: each token's
    top-k expert weights gathered by index, one ``bmm``; no host reads, no data-dependent shapes), which
    computes the same function. It gathers n x top_k expert matrices per layer, so it is used only inside
    captures (n <= the runner's ``max_graph_tokens``); the eager prefill keeps the model's own choice."""
    impl = getattr(model.config, "_experts_implementation", None)
    if impl is None or not type(model)._can_set_experts_implementation():
        return None
    device = next(model.parameters()).device
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return experts_for_graphs(impl, model.dtype, device.type, capability)


def experts_for_graphs(impl: str, dtype: torch.dtype, device_type: str,
                       capability: tuple[int, int] | None) -> str | None:
    """The rule of :func:`graph_experts_implementation`: "batched_mm" for a CUDA capture unless ``impl`` is
    already capturable ("batched_mm", or "grouped_mm" on its bfloat16 sm90 / sm100 CUTLASS path); None on
    other devices (no capture)."""
    if device_type != "cuda" or impl == "batched_mm":
        return None
    if impl == "grouped_mm" and dtype == torch.bfloat16 and capability is not None and capability[0] in (9, 10):
        return None  # the CUTLASS grouped GEMM: offsets read on the device
    return "batched_mm"


@contextlib.contextmanager
def experts_implementation(model: torch.nn.Module, impl: str | None) -> Iterator[None]:
    """Run the body with ``model``'s experts dispatched to ``impl`` (transformers'
    ``set_experts_implementation``), restoring the previous choice after; ``impl`` None: no change."""
    if impl is None:
        yield
        return
    before = model.get_experts_implementation()
    model.set_experts_implementation(impl)
    try:
        yield
    finally:
        model.set_experts_implementation(before)
