"""Gemma 4's MTP assistant as transformers ships it (``Gemma4AssistantForCausalLM``, ``model_type "gemma4_assistant"``),
loaded as an mtp head: :class:`~specviz.methods.mtp.assistant.Gemma4AssistantHead`.

Layout (transformers 5.17 ``models/gemma4_assistant/``; docs/design/drafter_formats.md 5): config.json with
``text_config`` (a ``gemma4_text`` config, every layer KV-shared), ``backbone_hidden_size`` (the target's width),
``use_ordered_embeddings``, ``num_centroids``, ``centroid_intermediate_top_k``; tensors ``model.embed_tokens``
(``lm_head`` tied to it, not written), ``model.layers.{i}.self_attn.{q_proj, q_norm, o_proj}`` (no K/V
projections), ``model.layers.{i}.mlp.*``, the four Gemma norms and ``layer_scalar`` per layer, ``model.norm``,
``pre_projection`` [H, 2 H_t], ``post_projection`` [H_t, H], and with ordered embeddings
``masked_embedding.centroids`` [C, H] and ``masked_embedding.token_ordering`` [V] (int64). The config is built by
transformers' own config class (no remote code); the weights are read from safetensors.

specviz's own mtp head (a one-layer head trained by specviz) has no published layout.
"""

from __future__ import annotations

import torch

from specviz.heads.formats.common import fill, load_tensors, require
from specviz.heads.formats.detect import Checkpoint

from .assistant import MODEL_TYPE, AssistantConfig, Gemma4AssistantHead, check_assistant_matches, kv_source_layers

LAYOUT = "gemma4-assistant"
LAYOUTS = (LAYOUT,)
KIND_OF = {LAYOUT: "mtp"}
SOURCE = "transformers Gemma4AssistantForCausalLM (gemma4_assistant), driven as SinglePositionMultiTokenCandidateGenerator"


def detect(ckpt: Checkpoint) -> str | None:
    """"gemma4-assistant" for a ``gemma4_assistant`` config or ``pre_projection`` / ``post_projection`` tensors."""
    keys = set(ckpt.shapes)
    if ckpt.config.get("model_type") == MODEL_TYPE or {"pre_projection.weight", "post_projection.weight"} <= keys:
        return LAYOUT
    return None


def assistant_config(raw: dict, where: str):
    """transformers' ``Gemma4AssistantConfig`` from config.json's fields, validated as transformers validates it.
    Raises ValueError for another model_type, a missing text_config or an architecture it refuses."""
    from transformers import Gemma4AssistantConfig

    require(raw.get("model_type", MODEL_TYPE) == MODEL_TYPE, where,
            f"model_type {raw.get('model_type')!r}: a Gemma 4 assistant is {MODEL_TYPE!r}")
    require(isinstance(raw.get("text_config"), dict), where, "config.json has no text_config (the assistant's layers)")
    try:
        cfg = Gemma4AssistantConfig(**{k: v for k, v in raw.items() if k not in ("model_type", "architectures")})
        cfg.validate_architecture()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: not a loadable {MODEL_TYPE} config: {exc}") from None
    return cfg


def load_gemma4_assistant(ckpt: Checkpoint, target, dtype=None) -> Gemma4AssistantHead:
    """Load the assistant onto ``target`` (a Gemma 4 model: its device, ``dtype`` default the target's, eval mode),
    ``head.source`` saying what was loaded and how it is driven. Raises ValueError for a config transformers refuses,
    weights that do not fit, or a target that is not Gemma 4 or whose cache layout differs (num_key_value_heads,
    head_dim, global_head_dim, layer_types)."""
    where = str(ckpt.directory)
    cfg = assistant_config(ckpt.config, where)
    check_assistant_matches(AssistantConfig.from_hf(cfg, {}), target.config, cfg)  # before building or reading
    kv_layers = {kind: layer for kind, layer in kv_source_layers(target.config).items()
                 if kind in cfg.text_config.layer_types}
    head = Gemma4AssistantHead(cfg, kv_layers)
    state = load_tensors(ckpt)
    tied = "lm_head.weight" not in state and bool(cfg.tie_word_embeddings)
    if tied and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]  # tied in transformers, written once
    fill(head.model, state, lambda key: key, where)
    param = next(target.parameters())
    head.to(device=param.device, dtype=dtype or param.dtype)
    c = head.config
    head.source = {
        "format": LAYOUT, "source": SOURCE, "path": where, "kv_layers": dict(c.kv_layers),
        "layer_types": list(c.layer_types), "sliding_window": c.sliding_window,
        "backbone_hidden_size": c.backbone_hidden_size, "hidden_size": c.hidden_size,
        "num_layers": len(c.layer_types), "lm_head": "the assistant's own, tied to its embedding" if tied else "its own",
        "embedding": "the target's, scaled by sqrt(backbone_hidden_size)", "draft_position": "constant: the root's",
        "use_ordered_embeddings": c.use_ordered_embeddings, "num_centroids": c.num_centroids if c.use_ordered_embeddings
        else 0, "centroid_intermediate_top_k": c.centroid_intermediate_top_k if c.use_ordered_embeddings else 0,
        "real_logits": c.real_logits, "q": "one-hot (argmax drafts at every temperature)"}
    return head.attach(target).eval()


def load(ckpt: Checkpoint, layout: str, target, dtype=None):
    return load_gemma4_assistant(ckpt, target, dtype)


def write(head, verifier):
    """(layout, config, tensors, file name) of a loaded Gemma 4 assistant, as transformers writes it (``lm_head``
    tied, left out). Raises ValueError for specviz's own mtp head: its one layer with Llama norms, shared LM head and
    1 / sqrt(head_dim) scaling is not expressible as a Gemma 4 assistant."""
    if not isinstance(head, Gemma4AssistantHead):
        raise ValueError("specviz's mtp head has no published layout (Gemma 4's assistant is another architecture: "
                         "Gemma layers, its own tied LM head); it is saved in specviz's format only")
    tensors = {k: v for k, v in head.model.state_dict().items() if k != "lm_head.weight"}
    if not head.hf_config.tie_word_embeddings:
        tensors["lm_head.weight"] = head.model.lm_head.weight
    config = {**head.hf_config.to_dict(), "architectures": ["Gemma4AssistantForCausalLM"], "model_type": MODEL_TYPE}
    return LAYOUT, config, {k: v.detach() for k, v in tensors.items() if isinstance(v, torch.Tensor)}, "model.safetensors"
