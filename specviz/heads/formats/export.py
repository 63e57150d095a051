"""Write a specviz head in the layout the field loads (the inverse of the loaders in this package), so a
head trained here runs in the engines too:

=========  ======================  =====================================================================
eagle      ``eagle-safeailab``      SafeAILab/EAGLE ``cnets1.py`` (vLLM ``llama_eagle.py`` loads it as well)
eagle3     ``eagle3-speculators``   vllm-project/speculators ``eagle3`` (vLLM's ``--speculative-config``)
medusa     ``medusa2-fasterdecoding`` (the target's LM head) or ``medusa1-fasterdecoding`` (own LM heads)
dflash     ``dflash-zlab``          z-lab/dflash ``DFlashDraftModel`` (vLLM / SGLang ``DFlashDraftModel``)
=========  ======================  =====================================================================

Weights are written as safetensors only (never a pickle: the FasterDecoding loaders that expect
``medusa_lm_head.pt`` need their own conversion). What a layout cannot express raises ValueError
instead of writing a file that would run differently: e.g. Medusa ResBlocks that differ within a head
(FasterDecoding repeats one module ``medusa_num_layers`` times), EAGLE-3 per-tap norms with repeated taps,
an EAGLE-1 head whose head_dim is not hidden_size // heads (SafeAILab computes it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

LAYOUT_OF_KIND = {"eagle": "eagle-safeailab", "eagle3": "eagle3-speculators", "medusa": "medusa-fasterdecoding",
                  "dflash": "dflash-zlab"}


def save_published(head, directory: str | os.PathLike, dtype: torch.dtype = torch.bfloat16,
                   verifier: str | None = None) -> dict:
    """Write ``head`` (attached to its target) to ``directory`` in its kind's published layout (see the module
    docstring), floating tensors in ``dtype``. ``verifier``: the target's name or path, recorded where the
    layout has a field for it. Returns {"layout", "files"}. Raises ValueError for a kind without a published
    layout (mtp) or a head the layout cannot express exactly."""
    kind = head.config.kind
    writers = {"eagle": _eagle1, "eagle3": _eagle3, "medusa": _medusa, "dflash": _dflash}
    if kind not in writers:
        raise ValueError(f"a {kind!r} head has no published layout to write (specviz's own format only)")
    layout, config, tensors, name = writers[kind](head, verifier)
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    cast = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous().clone()
            for k, v in tensors.items()}
    save_file(cast, str(path / name), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return {"layout": layout, "files": ["config.json", name]}


def save_published_beside(head, out_dir: str | os.PathLike, name: str, verifier: str | None = None) -> dict:
    """The training recipe's second copy: ``head`` in its published layout at ``out_dir/published/name/``
    (bf16). Returns the log entry {"dir", "layout", "files"}, or {"not_written": why} when the kind has no
    published layout or the layout cannot express this head (the specviz-format copy is then the only one)."""
    path = Path(out_dir) / "published" / name
    try:
        return {"dir": str(path), **save_published(head, path, verifier=verifier)}
    except ValueError as exc:
        return {"not_written": str(exc)}


def _rope_fields(rope: dict) -> dict:
    """rope_theta (+ rope_scaling for a scaled RoPE), as transformers 4.x configs and the engines read them."""
    out = {"rope_theta": float(rope.get("rope_theta", 10000.0))}
    extra = {k: v for k, v in rope.items() if k not in ("rope_type", "rope_theta")}
    if rope.get("rope_type", "default") != "default":
        out["rope_scaling"] = {"rope_type": rope["rope_type"], "type": rope["rope_type"], **extra}
    return out


def _eagle1(head, verifier):
    c = head.config
    if c.head_dim * c.num_attention_heads != c.hidden_size or c.o_bias:
        raise ValueError("SafeAILab's EAGLE-1 layout computes head_dim = hidden_size // heads and has no o_proj bias; "
                         f"this head has head_dim {c.head_dim} x {c.num_attention_heads} heads, o_bias {c.o_bias}")
    layer = head.layer.state_dict()
    tensors = {"fc.weight": head.fc.weight, **({"fc.bias": head.fc.bias} if c.fc_bias else {}),
               **{f"layers.0.{k}": v for k, v in layer.items() if not k.startswith("input_layernorm")}}
    if c.own_embedding:
        tensors["embed_tokens.weight"] = head.own_embed.weight
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c.hidden_size,
              "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
              "num_key_value_heads": c.num_key_value_heads, "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps,
              "hidden_act": "silu", "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size,
              "tie_word_embeddings": False, "bias": c.fc_bias, **({"qkv_bias": True} if c.qkv_bias else {}),
              **_rope_fields(c.rope_parameters)}
    return "eagle-safeailab", config, tensors, "model.safetensors"


def _eagle3(head, verifier):
    c = head.config
    if not c.norm_logits:
        raise ValueError("the speculators layout always applies norm before the LM head (norm_logits=False cannot "
                         "be written)")
    if c.qkv_bias != c.o_bias:
        raise ValueError("the speculators layout has one attention_bias for q/k/v/o; this head has "
                         f"qkv_bias={c.qkv_bias}, o_bias={c.o_bias}")
    taps, fc = _sorted_taps(head)
    tensors = {"fc.weight": fc, "norm.weight": head.norm.weight,
               **{f"layers.0.{k}": v for k, v in head.layer.state_dict().items()}}
    if c.fc_norm:
        tensors.update({f"fc_norm.{i}.weight": n.weight for i, n in enumerate(head.fc_norm)})
    if c.norm_before_fc:
        tensors["input_norm.weight"] = head.input_norm.weight
    if c.own_embedding:
        tensors["embed_tokens.weight"] = head.own_embed.weight
    if head.own_lm_head is not None:
        tensors["lm_head.weight"] = head.own_lm_head.weight
        draft_vocab = c.draft_vocab_size
        if head.draft_to_target is not None:  # back to SafeAILab's offsets, plus the target-side mask
            ids = head.draft_to_target.detach().cpu()
            tensors["d2t"] = ids - torch.arange(ids.shape[0])
            t2d = torch.zeros(c.vocab_size, dtype=torch.bool)
            t2d[ids] = True
            tensors["t2d"] = t2d
    else:  # specviz's trained heads read the target's LM head: the layout needs the head's own copy
        tensors["lm_head.weight"] = head.lm_head.weight
        draft_vocab = c.vocab_size
    layer_cfg = {"model_type": "llama", "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
                 "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
                 "head_dim": c.head_dim, "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps, "hidden_act": "silu",
                 "vocab_size": c.vocab_size, "max_position_embeddings": c.max_position_embeddings,
                 "attention_bias": c.qkv_bias, **_rope_fields(c.rope_parameters)}
    config = {"architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3",
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
                                     "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]}},
              "transformer_layer_config": layer_cfg, "draft_vocab_size": draft_vocab,
              # every flag written, so no reader falls back to a default (vLLM's bridge defaults one to True)
              "norm_before_residual": c.norm_before_residual, "norm_before_fc": c.norm_before_fc,
              "fc_norm": c.fc_norm, "norm_output": c.feed_normed, "target_hidden_size": None,
              "eagle_aux_hidden_state_layer_ids": taps}
    return "eagle3-speculators", config, tensors, "model.safetensors"


def _sorted_taps(head) -> tuple[list[int], torch.Tensor]:
    """(taps sorted and each once, fc weight with its input blocks to match). Engines concatenate the taps in
    layer order and read each once (vLLM sorts and deduplicates them); fc's column blocks are permuted, and the
    blocks of a repeated tap summed (W_a x + W_b x = (W_a + W_b) x), which is exact unless norms sit between."""
    c, w = head.config, head.fc.weight.detach()
    taps, d = list(c.aux_layer_ids), c.hidden_size
    unique = sorted(set(taps))
    if unique == taps:
        return taps, w
    if c.fc_norm or c.norm_before_fc:
        raise ValueError(f"taps {taps} are not in layer order or repeat, and per-tap norms forbid merging fc's blocks")
    blocks = {t: torch.zeros_like(w[:, :d]) for t in unique}
    for i, t in enumerate(taps):
        blocks[t] = blocks[t] + w[:, i * d:(i + 1) * d]
    return unique, torch.cat([blocks[t] for t in unique], dim=1)


def _medusa(head, verifier):
    c = head.config
    if not c.fc_bias or c.lm_heads == "shared" or c.head_vocab_size is not None:
        raise ValueError("FasterDecoding's Medusa layout has biased ResBlocks and either the target's LM head or one "
                         f"full-vocabulary LM head per head; this head has fc_bias={c.fc_bias}, lm_heads={c.lm_heads!r}, "
                         f"head_vocab_size={c.head_vocab_size}")
    tensors = {}
    for h, block in enumerate(head.blocks):
        first = block[0].linear
        for l, res in enumerate(block):
            if not (torch.equal(res.linear.weight, first.weight) and torch.equal(res.linear.bias, first.bias)):
                raise ValueError(f"head {h}'s ResBlocks differ, but FasterDecoding repeats ONE ResBlock "
                                 f"medusa_num_layers times ([ResBlock(H)] * L): the layout cannot express this head")
            tensors[f"{h}.{l}.linear.weight"], tensors[f"{h}.{l}.linear.bias"] = res.linear.weight, res.linear.bias
        if c.lm_heads == "per_head":
            tensors[f"{h}.{c.num_layers}.weight"] = head.own_lm_heads[h].weight
    config = {"medusa_num_heads": c.num_heads, "medusa_num_layers": c.num_layers, "base_model_name_or_path": verifier,
              **({"version": "2"} if c.lm_heads == "target" else {})}
    layout = "medusa2-fasterdecoding" if c.lm_heads == "target" else "medusa1-fasterdecoding"
    return layout, config, tensors, "medusa_lm_head.safetensors"


def _dflash(head, verifier):
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
              "dflash_config": {"mask_token_id": c.mask_token_id, "target_layer_ids": list(c.target_layer_ids)},
              **_rope_fields(c.rope_parameters)}
    return "dflash-zlab", config, tensors, "model.safetensors"
