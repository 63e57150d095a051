"""Gemma 4's MTP assistant (transformers ``Gemma4AssistantForCausalLM``, ``model_type "gemma4_assistant"``) as a
head of method mtp on a Gemma 4 target: specviz's own draft step over transformers' own layer modules.

Sources read (the driving here is specviz's own): transformers 5.17 ``models/gemma4_assistant/`` (the module and its
config), ``models/gemma4/modeling_gemma4.py`` (``store_full_length_kv``: the target hands the K/V of the last
non-KV-shared layer of each layer type to the assistant as ``shared_kv_states``; ``Gemma4TextScaledWordEmbedding``)
and ``generation/candidate_generator.py`` (``SinglePositionMultiTokenCandidateGenerator``: how transformers drives
it). The weights live in transformers' own ``Gemma4AssistantForCausalLM`` (its Q-only decoder layers, norms,
projections and centroids; a well-kept library's model class); the step below, the masks, the K/V hand-off from
specviz's target runner and the centroid logits are specviz's, with no host read (CUDA-graph capturable).

One draft step (committed x_0..x_n; the target cache holds positions 0..n-1; H_t = the target's hidden size)::

    e      = embed_target(tok) (already x sqrt(H_t): Gemma4TextScaledWordEmbedding)        [H_t]
    x      = pre_projection(cat(e, h_in))                                                  [2 H_t] -> [H]
    x      = Gemma 4 layers at the constant position n (RoPE of the query only), each layer's queries over the
             target's K/V of type(layer): the last non-KV-shared target layer of that type, keys 0..n-1
             (full attention), or the last W + 1 of them (sliding: transformers' bidirectional window
             |q - k| <= W, flipped to look back over the shared keys)
    x      = norm(x);  h_out = post_projection(x)  (fed back as the next step's h_in)          [H] -> [H_t]
    logits = lm_head(x) (tied to the assistant's own embedding), or centroid-masked: only the tokens of the
             ``centroid_intermediate_top_k`` clusters with the largest ``centroids(x)`` get real logits

Step 1 reads (f_{n-1}, x_n): the target's final-norm hidden state at the last committed position and the root;
step m >= 2 reads (h_out of step m - 1, d_{m-1}). The position stays n (``input_ids.shape[1] - 1`` in transformers)
for every step of a round. Masked-out tokens get -inf (transformers fills min(real logits) - 1, read on the host with
``.item()``); the argmax is the same. Drafts are always the argmax (both public drivers draft greedily), and q is
one-hot at every temperature (``Draft.probs`` None), so standard and block verification stay lossless even though
the centroid-masked logits are no distribution outside the chosen clusters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from specviz.attention import FULL, SLIDING, mask_for
from specviz.heads.common import Fp32RopeMixin, SharedTargetMixin

MODEL_TYPE = "gemma4_assistant"
GEMMA4_TARGETS = ("gemma4_text", "gemma4")  # model_type of Gemma4ForCausalLM / of Gemma4ForConditionalGeneration


@dataclass(frozen=True)
class AssistantConfig:
    """What specviz reads of a loaded assistant (the transformers config is ``head.hf_config``).

    kind: "mtp". kv_layers: {layer type: the target layer whose cached K/V the assistant's layers of that type read}.
    layer_types: the assistant's own layers' types. sliding_window: W of the assistant's sliding layers.
    use_ordered_embeddings, num_centroids, centroid_intermediate_top_k: the centroid-masked logits.
    backbone_hidden_size: H_t; hidden_size: H; vocab_size: V.
    """

    kind: str
    kv_layers: dict[str, int]
    layer_types: tuple[str, ...]
    sliding_window: int | None
    backbone_hidden_size: int
    hidden_size: int
    vocab_size: int
    use_ordered_embeddings: bool = False
    num_centroids: int = 0
    centroid_intermediate_top_k: int = 0
    aux_layer_ids: tuple[int, ...] = ()
    taps: tuple[str, ...] = field(default=("final",))

    @property
    def real_logits(self) -> int:
        """How many tokens get a real logit per step (V without ordered embeddings)."""
        if not self.use_ordered_embeddings:
            return self.vocab_size
        return self.centroid_intermediate_top_k * (self.vocab_size // self.num_centroids)

    @classmethod
    def from_hf(cls, hf_config, kv_layers: dict[str, int]) -> "AssistantConfig":
        """From transformers' ``Gemma4AssistantConfig`` and the target layers its layer types read."""
        text = hf_config.text_config
        return cls(kind="mtp", kv_layers=dict(kv_layers), layer_types=tuple(text.layer_types),
                   sliding_window=getattr(text, "sliding_window", None) if SLIDING in text.layer_types else None,
                   backbone_hidden_size=int(hf_config.backbone_hidden_size), hidden_size=int(text.hidden_size),
                   vocab_size=int(text.vocab_size), use_ordered_embeddings=bool(hf_config.use_ordered_embeddings),
                   num_centroids=int(hf_config.num_centroids),
                   centroid_intermediate_top_k=int(hf_config.centroid_intermediate_top_k))


def target_text_config(target_config):
    """The decoder config of a transformers target config (its text config for a multimodal one)."""
    return target_config.get_text_config(decoder=True) if hasattr(target_config, "get_text_config") else target_config


def kv_source_layers(target_config) -> dict[str, int]:
    """{layer type: the last non-KV-shared layer of that type} of a Gemma 4 target: the layers whose attention sets
    ``store_full_length_kv`` in transformers (the K/V the target hands over as ``shared_kv_states``)."""
    text = target_text_config(target_config)
    types = list(text.layer_types)
    first_shared = len(types) - int(getattr(text, "num_kv_shared_layers", 0) or 0)
    return {kind: max(i for i in range(first_shared) if types[i] == kind) for kind in dict.fromkeys(types[:first_shared])}


def layer_cache_layout(config, layer: int) -> tuple[int, int]:
    """(num_key_value_heads, head_dim) of a Gemma 4 text config's layer ``layer`` (full layers: global_head_dim)."""
    per = config.per_layer_config[layer]
    return int(per.num_key_value_heads), int(per.head_dim)


def check_assistant_matches(cfg: AssistantConfig, target_config, hf_config=None) -> None:
    """Raise ValueError (saying what differs) unless the assistant can read this target's cache: a Gemma 4 target, the
    backbone width and vocabulary of the target, and for every layer type the assistant uses a non-KV-shared target
    layer of that type whose num_key_value_heads and head_dim (global_head_dim for full attention) are the
    assistant's. ``hf_config``: the assistant's transformers config (needed for the per-type cache layout)."""
    text = target_text_config(target_config)
    family = getattr(text, "model_type", type(text).__name__)
    if family not in GEMMA4_TARGETS:
        raise ValueError(f"a {MODEL_TYPE} head (Gemma 4's MTP assistant) drafts only for a Gemma 4 target: it has no "
                         f"K/V projections and reads the target's own cached K/V; the target is {family!r}")
    problems = [f"{name} {mine} != the target's {theirs}" for name, mine, theirs in (
        ("backbone_hidden_size", cfg.backbone_hidden_size, text.hidden_size),
        ("vocab_size", cfg.vocab_size, text.vocab_size)) if mine != theirs]
    sources = kv_source_layers(text)
    for kind in dict.fromkeys(cfg.layer_types):
        if kind not in sources:
            problems.append(f"layer_types: the assistant has {kind} layers but the target has no non-KV-shared "
                            f"{kind} layer (target layer_types {list(text.layer_types)})")
            continue
        if hf_config is None:
            continue
        mine = layer_cache_layout(hf_config.text_config, cfg.layer_types.index(kind))
        theirs = layer_cache_layout(text, sources[kind])
        dim = "global_head_dim" if kind == FULL else "head_dim"
        for what, a, b in (("num_key_value_heads", mine[0], theirs[0]), (dim, mine[1], theirs[1])):
            if a != b:
                problems.append(f"{kind} {what} {a} != target layer {sources[kind]}'s {b}")
    if problems:
        raise ValueError(f"the {MODEL_TYPE} head does not fit the target's cache layout: " + "; ".join(problems))


class Gemma4AssistantHead(SharedTargetMixin, Fp32RopeMixin, nn.Module):
    """The assistant on a Gemma 4 target (the module docstring says what one step does).

    ``h_out, logits = head.draft(h_in, token_ids, position_ids, kv)``

    h_in          float [1, 1, H_t]: the target's final-norm f_{n-1} (step 1) or the previous step's h_out.
    token_ids     int64 [1, 1]: the root x_n (step 1), then the previous draft.
    position_ids  int64 [1, 1]: the constant query position n (= the cached length), on the device.
    kv            {layer type: (keys, values)}, each [1, kv_heads, S, head_dim] (S >= n; slots >= n are masked):
                  the target cache layers ``config.kv_layers``; keys carry the target's RoPE and k_norm.
    returns       h_out [1, 1, H_t] (head dtype) and logits float32 [1, 1, V] (-inf outside the chosen clusters).

    Attributes: hf_config (the transformers ``Gemma4AssistantConfig``), model (transformers'
    ``Gemma4AssistantForCausalLM`` holding the weights), source (set by the loader).
    """

    label = "Gemma 4's MTP assistant (transformers Gemma4AssistantForCausalLM)"
    one_hot_draft = True  # argmax drafts, q one-hot at every temperature (module docstring)
    ROPE_MODULE = "model.model.rotary_emb"

    def __init__(self, hf_config, kv_layers: dict[str, int]):
        super().__init__()
        from transformers import Gemma4AssistantForCausalLM

        self.hf_config = hf_config
        self.config = AssistantConfig.from_hf(hf_config, kv_layers)
        self.model = Gemma4AssistantForCausalLM(hf_config)
        self.keep_rope_fp32()
        self.source: dict[str, Any] = {}

    def _check_target(self, target_config) -> None:  # SharedTargetMixin's check, with the per-type cache layout
        check_assistant_matches(self.config, target_config, self.hf_config)

    @property
    def kv_layers(self) -> dict[str, int]:
        return self.config.kv_layers

    def draft_position(self, cached: int) -> int:
        """The constant query position of a round whose target cache holds ``cached`` positions: the root's, n."""
        return cached

    def reads(self, cached: int) -> list[dict]:
        """What one round reads of a cache of ``cached`` positions: [{type, layer, positions [lo, hi]}] per layer type
        (sliding: the last W + 1 keys)."""
        lo = {SLIDING: max(0, cached - 1 - (self.config.sliding_window or 0))}
        return [{"type": kind, "layer": layer, "positions": [lo.get(kind, 0), cached - 1]}
                for kind, layer in self.config.kv_layers.items()]

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The target's input embedding of ``token_ids`` [1, 1] -> [1, 1, H_t]: Gemma 4's scaled embedding (x sqrt(H_t))."""
        return self.embed_tokens(token_ids)

    def draft(self, h_in, token_ids, position_ids, kv):
        a = self.model
        dt = self.dtype
        x = a.pre_projection(torch.cat([self.embed(token_ids).to(dt), h_in.to(dt)], dim=-1))  # [1, 1, H]
        masks = {kind: mask_for(self._visible(kind, position_ids, keys.shape[2]), a.model)
                 for kind, (keys, _) in kv.items()}
        shared = {kind: (keys.to(dt), values.to(dt)) for kind, (keys, values) in kv.items()}
        rope = {kind: a.model.rotary_emb(x, position_ids, kind) for kind in dict.fromkeys(self.config.layer_types)}
        for kind, layer in zip(self.config.layer_types, a.model.layers):
            x = layer(x, None, shared_kv_states=shared, position_embeddings=rope[kind], attention_mask=masks[kind],
                      position_ids=position_ids)
        x = a.model.norm(x)
        return a.post_projection(x), self._logits(x).float()

    def _visible(self, kind: str, position_ids: torch.Tensor, slots: int) -> torch.Tensor:
        """bool [1, slots]: the cached keys a query at position n sees: 0..n-1, and for sliding layers the last W + 1
        of them (transformers' bidirectional window |q - k| <= W over the handed-over keys, flipped to look back)."""
        pos = position_ids.reshape(1, 1)
        slot = torch.arange(slots, device=pos.device)[None, :]
        seen = slot < pos
        if kind == SLIDING:
            seen = seen & (slot >= pos - 1 - self.config.sliding_window)
        return seen

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        """[1, 1, H] -> logits [1, 1, V] from the assistant's own (tied) LM head; with ordered embeddings only the
        tokens of the top-k centroids get real logits, the rest -inf (device ops only: topk, gather, scatter)."""
        a = self.model
        if not self.config.use_ordered_embeddings:
            return a.lm_head(x)
        emb = a.masked_embedding
        top = torch.topk(emb.centroids(x), k=emb.centroid_intermediate_top_k, dim=-1).indices  # [1, 1, top_k]
        clusters = emb.token_ordering.long().view(emb.num_centroids, emb.vocab_size_per_centroid)
        tokens = clusters[top].reshape(*x.shape[:-1], -1)  # [1, 1, top_k * V / C]: target token ids
        real = (x.unsqueeze(-2) @ a.lm_head.weight[tokens].transpose(-1, -2)).squeeze(-2)  # [1, 1, top_k * V / C]
        out = torch.full((*x.shape[:-1], self.config.vocab_size), float("-inf"), dtype=real.dtype, device=x.device)
        return out.scatter(-1, tokens, real)
