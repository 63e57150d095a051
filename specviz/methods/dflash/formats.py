"""DFlash drafters as z-lab publishes them, normalised into specviz's :class:`~specviz.methods.dflash.head.DFlashHead`.

Source (read for the layout; the code here is specviz's own): z-lab/dflash ``dflash/model.py``
(``DFlashDraftModel`` on ``Qwen3Config``: Qwen3 layers whose attention takes Q from the block and K/V
from cat(context, block), q/k RMSNorms per head, non-causal; ``fc`` [H, len(ids) x H] without bias,
``hidden_norm``, ``norm``; the target's embedding and LM head; ``dflash_config.target_layer_ids``
name the OUTPUT of layer i, read as ``hidden_states[i + 1]`` (``extract_context_feature``), default
``build_target_layer_ids(num_target_layers, num_hidden_layers)``; ``dflash_config.mask_token_id``;
``block_size`` at the top level, or inside ``dflash_config`` in newer checkpoints (speculators'
DFlash converter)). Every DFlash field is read as z-lab's ``_draft_value`` reads it: ``dflash_config``
first, then the top level, then the default (``block_size`` 16; ``input_embedding_scale`` and
``output_multiplier`` 1.0; no ``final_logit_softcapping``). specviz's DFlash config uses the same
"output of layer i" convention, so the ids carry over unchanged. Sliding-window and causal draft
layers (other DFlash families) and DFlash2 (dynamic convolutions, a candidate selector) are refused.
"""

from __future__ import annotations

import re

from .head import DFlashConfig, DFlashHead
from specviz.heads.formats.common import drop_target_copies, fill, finish, load_tensors, require
from specviz.heads.formats.detect import Checkpoint
from specviz.heads.formats.export import rope_fields

LAYER_ATTN = re.compile(r"^layers\.(\d+)\.self_attn\.(.+)$")
# z-lab's optional block-embedding scale and logit transforms, with its defaults (off)
SCALES = {"input_embedding_scale": 1.0, "output_multiplier": 1.0, "final_logit_softcapping": None}


def zlab_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's ``build_target_layer_ids`` exactly (no clamping): [N // 2] for one draft layer, else
    round(1 + i (N - 4) / (L_d - 1)) for i < L_d."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [int(round(1 + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


ZLAB_DEFAULT_BLOCK_SIZE = 16  # DFlashDraftModel: _draft_value(config, "block_size", 16)


def draft_value(raw: dict, name: str, default=None):
    """z-lab's ``_draft_value``: ``dflash_config[name]``, else the top-level field, else ``default``."""
    return (raw.get("dflash_config") or {}).get(name, raw.get(name, default))


def target_layer_ids(raw: dict, num_draft_layers: int, num_target_layers: int) -> tuple[list[int], list[int] | None]:
    """(ids in specviz's convention, the ids as the file gives them or None). z-lab's ids already name layer
    outputs (read as ``hidden_states[i + 1]``), specviz's DFlash convention too: they carry over unchanged.
    Read from ``dflash_config``, else the top level; absent: z-lab's earlier default from ``num_target_layers``
    (else the target's layer count)."""
    given = draft_value(raw, "target_layer_ids")
    if given:
        return list(given), list(given)
    return zlab_target_layer_ids(int(raw.get("num_target_layers", num_target_layers)), num_draft_layers), None


def load_dflash_zlab(ckpt: Checkpoint, target, dtype=None) -> DFlashHead:
    """Load a ``dflash-zlab`` drafter onto ``target`` (its device, ``dtype`` default the target's, eval mode),
    ``head.source`` saying where it came from (``block_size`` absent: z-lab's default 16). Raises ValueError
    for a DFlash2 drafter (before any tensor is read), a missing ``mask_token_id``, sliding / causal layers,
    unsupported activations or scales, weights that do not fit, or a drafter that does not fit the target
    (hidden size, vocabulary, taps)."""
    from transformers import AutoConfig

    raw, where, tc = ckpt.config, str(ckpt.directory), target.config
    require(not any(k.startswith("candidate_selector.") or re.search(r"\.(attention|mlp)_conv\.", k)
                    for k in ckpt.shapes), where,
            "a DFlash2 drafter (dynamic convolutions and a candidate selector) is not supported; specviz loads "
            "z-lab's DFlashDraftModel")
    model_type = raw.get("model_type", "qwen3")
    require(model_type in ("qwen3", "llama"), where, f"a z-lab DFlash drafter on {model_type!r} layers is not supported")
    qc = AutoConfig.for_model(model_type, **{k: v for k, v in raw.items() if k != "model_type"})  # Qwen3's defaults
    dcfg = raw.get("dflash_config") or {}
    layers = int(qc.num_hidden_layers)
    state = load_tensors(ckpt)
    copies = drop_target_copies(state, target, where, embedding="embed_tokens.weight", lm_head="lm_head.weight")
    found = {int(k.split(".")[1]) for k in state if k.startswith("layers.")}
    require(found == set(range(layers)), where, f"num_hidden_layers {layers} but the file has layers {sorted(found)}")
    require(all(t == "full_attention" for t in (getattr(qc, "layer_types", None) or ["full_attention"])), where,
            "sliding-window draft layers are not supported")
    require(not dcfg.get("causal", False) and not raw.get("is_causal", False), where,
            "causal DFlash drafters are not supported (z-lab's are non-causal)")
    require(getattr(qc, "hidden_act", "silu") == "silu", where, f"hidden_act {qc.hidden_act!r}: only silu")
    ids, ids_in_file = target_layer_ids(raw, layers, tc.num_hidden_layers)
    block_size = draft_value(raw, "block_size", ZLAB_DEFAULT_BLOCK_SIZE)
    require(isinstance(block_size, int) and block_size >= 2, where,
            f"block_size must be an integer >= 2 (a root and at least one MASK slot), got {block_size!r}")
    block_size_in = ("dflash_config" if "block_size" in dcfg else "top level" if "block_size" in raw
                     else f"default (z-lab's {ZLAB_DEFAULT_BLOCK_SIZE})")
    mask = draft_value(raw, "mask_token_id")
    require(mask is not None, where, "no dflash_config.mask_token_id: the drafter's MASK token is target-specific")
    H = int(qc.hidden_size)
    require(state["fc.weight"].shape[1] == len(ids) * H if "fc.weight" in state else False, where,
            f"fc must read {len(ids)} x {H} features (target_layer_ids {ids})")
    head_dim = int(getattr(qc, "head_dim", None) or H // qc.num_attention_heads)
    scales = {name: draft_value(raw, name, default) for name, default in SCALES.items()}
    cfg = DFlashConfig(
        hidden_size=H, vocab_size=int(qc.vocab_size), num_attention_heads=int(qc.num_attention_heads),
        num_key_value_heads=int(qc.num_key_value_heads or qc.num_attention_heads), head_dim=head_dim,
        intermediate_size=int(qc.intermediate_size), rms_norm_eps=float(qc.rms_norm_eps),
        max_position_embeddings=int(qc.max_position_embeddings), target_num_hidden_layers=tc.num_hidden_layers,
        target_layer_ids=tuple(ids), num_layers=layers, block_size=int(block_size), mask_token_id=int(mask),
        rope_parameters=dict(qc.rope_parameters), attention_bias=bool(getattr(qc, "attention_bias", False)),
        **scales)

    def rename(key: str) -> str | None:
        if "rotary_emb" in key:
            return None
        m = LAYER_ATTN.match(key)
        return f"layers.{m[1]}.{m[2]}" if m else key  # q/k/v/o and q/k norms sit on specviz's layer itself

    head = DFlashHead(cfg)
    fill(head, state, rename, where)
    return finish(head, target, dtype, {
        "format": "dflash-zlab", "source": "z-lab/dflash (DFlashDraftModel)", "path": where,
        "target_layer_ids": ids, "target_layer_ids_in_file": ids_in_file,
        "tap_convention": "output of layer i = HF hidden_states[i + 1] (z-lab's +1)",
        "block_size": int(block_size), "block_size_in": block_size_in,
        "mask_token_id": int(mask), "rope_theta": cfg.rope_parameters.get("rope_theta"), "causal": False,
        **{k: getattr(cfg, k) for k, v in SCALES.items() if getattr(cfg, k) != v}, **copies})


# ---- the formats contract (specviz.heads.formats) ---------------------------------------------------------------
LAYOUTS = ("dflash-zlab",)
KIND_OF = {"dflash-zlab": "dflash"}


def detect(ckpt: Checkpoint) -> str | None:
    """"dflash-zlab" for z-lab's DFlashDraftModel (Qwen3 layers with q/k norms, ``fc``, ``hidden_norm``; or its
    ``dflash_config`` field beside ``fc``, so a checkpoint missing one of those tensors is reported as missing it),
    else None."""
    keys = set(ckpt.shapes)
    marked = "dflash_config" in ckpt.config or ("hidden_norm.weight" in keys and any(".k_norm." in k for k in keys))
    return "dflash-zlab" if "fc.weight" in keys and marked else None


def load(ckpt: Checkpoint, layout: str, target, dtype=None):
    return load_dflash_zlab(ckpt, target, dtype)


def write(head, verifier):
    """(layout, config, tensors, file name) of ``head`` as z-lab's DFlashDraftModel."""
    c = head.config
    tensors = {"fc.weight": head.fc.weight, "hidden_norm.weight": head.hidden_norm.weight, "norm.weight": head.norm.weight}
    for i, layer in enumerate(head.layers):
        for k, v in layer.state_dict().items():
            attn = k.split(".")[0] in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
            tensors[f"layers.{i}.{'self_attn.' if attn else ''}{k}"] = v
    config = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": c.hidden_size,
              "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
              "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "num_hidden_layers": c.num_layers,
              "rms_norm_eps": c.rms_norm_eps, "hidden_act": "silu", "max_position_embeddings": c.max_position_embeddings,
              "vocab_size": c.vocab_size, "attention_bias": c.attention_bias, "tie_word_embeddings": False,
              "use_sliding_window": False, "layer_types": ["full_attention"] * c.num_layers,
              "num_target_layers": c.target_num_hidden_layers, "block_size": c.block_size,
              "dflash_config": {"mask_token_id": c.mask_token_id, "target_layer_ids": list(c.target_layer_ids),
                                **{k: getattr(c, k) for k, v in SCALES.items() if getattr(c, k) != v}},
              **rope_fields(c.rope_parameters)}
    return "dflash-zlab", config, tensors, "model.safetensors"
