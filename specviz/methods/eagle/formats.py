"""EAGLE-1/2 and EAGLE-3 heads as the field publishes them, normalised into specviz's
:class:`~specviz.methods.eagle.head.EagleHead` / :class:`~specviz.methods.eagle.head.Eagle3Head`.

Sources (read for the layouts; the code here is specviz's own):

* EAGLE-1/2, SafeAILab/EAGLE ``eagle/model/cnets1.py`` (``Model``, ``LlamaDecoderLayer`` with no
  ``input_layernorm`` on layer 0), ``ea_model.py`` (``"bias"`` absent = an fc bias).
* EAGLE-3, SafeAILab ``eagle/model/cnets.py`` (``midlayer``, ``fc`` [H, 3H], own ``norm`` and
  ``lm_head`` over ``draft_vocab_size`` rows, ``d2t`` offsets: target id = i + d2t[i]; taps: the
  inputs of layers {2, N//2, N-3} in layer order, ``modeling_llama_kv.py``); RoPE: :func:`safeailab_rope`;
  head_dim = the config's ``head_dim`` if any (EAGLE-3 ``cnets.py``), else hidden_size // heads (``cnets1.py``).
* SpecForge ``specforge/modeling/draft/llama3_eagle.py`` (``LlamaForCausalLMEagle3``: optional
  ``fc_norm`` per tap, ``norm_output`` = norm before the LM head, default True; ``head_dim`` honoured)
  and ``algorithms/model_providers.py`` (``eagle_config.eagle_aux_hidden_state_layer_ids`` name the
  OUTPUT of layer i, default [1, N//2-1, N-4]; SGLang adds 1 when capturing).
* vllm-project/speculators ``models/eagle3/{config,core,model_definitions}.py``
  (``transformer_layer_config``, ``layers.0.*``, ``norm_before_residual`` / ``norm_before_fc`` /
  ``fc_norm`` / ``norm_output`` with pydantic defaults False; ``eagle_aux_hidden_state_layer_ids``
  as vLLM reads them: the input of layer i, default [2, N//2, N-3]); d2t / t2d only when V_d < V.

Taps are normalised to specviz's convention: id l = HF ``hidden_states[l]`` = the INPUT of target
layer l (what vLLM and SafeAILab capture), sorted ascending (engines concatenate in layer order).
"""

from __future__ import annotations

import torch

from .config import EAGLE1, EAGLE3, HeadConfig
from .head import build_head
from specviz.heads.formats.common import (drop_target_copies, fill, finish, load_tensors, require, rope_parameters,
                                         safeailab_rope, shared_embedding)
from specviz.heads.formats.detect import Checkpoint
from specviz.heads.formats.export import rope_fields

SOURCES = {"eagle-safeailab": "SafeAILab/EAGLE (cnets1.py)", "eagle3-safeailab": "SafeAILab/EAGLE (cnets.py)",
           "eagle3-specforge": "sgl-project/SpecForge (LlamaForCausalLMEagle3)",
           "eagle3-speculators": "vllm-project/speculators (Eagle3DraftModel)"}
TAP_CONVENTIONS = {"eagle3-safeailab": "SafeAILab's fixed taps {2, N//2, N-3}",
                   "eagle3-specforge": "eagle_config ids name layer outputs: output of layer i = input of layer i + 1",
                   "eagle3-speculators": "eagle_aux_hidden_state_layer_ids name layer inputs, as vLLM reads them"}


# ---- the conventions a planted-mistake test may replace ------------------------------------------------
def default_taps(num_layers: int) -> list[int]:
    """SafeAILab / vLLM / speculators default EAGLE-3 taps: inputs of layers {2, N//2, N-3}, each once, in
    layer order (``modeling_llama_kv.py`` appends inside its layer loop)."""
    return sorted({2, num_layers // 2, num_layers - 3})


def eagle3_taps(layout: str, cfg: dict, num_layers: int) -> tuple[list[int], list[int] | None]:
    """(taps in specviz's convention, the ids as the file gives them or None) for an EAGLE-3 config.
    SpecForge's nested ``eagle_config.eagle_aux_hidden_state_layer_ids`` name layer outputs (+1); the
    speculators' top-level ids are layer inputs (as is); SafeAILab has none (the default)."""
    if layout == "eagle3-specforge":
        given = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        return (sorted(i + 1 for i in given), list(given)) if given else (default_taps(num_layers), None)
    if layout == "eagle3-speculators":
        given = cfg.get("eagle_aux_hidden_state_layer_ids")
        return (sorted(given), list(given)) if given else (default_taps(num_layers), None)
    return default_taps(num_layers), None


def draft_to_target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """EAGLE-3's d2t holds OFFSETS (SafeAILab ``traineagle3/cnets.py``: d2t[i] = used_tokens[i] - i): draft
    row i drafts target id i + d2t[i]. int64 [V_d] -> int64 [V_d]."""
    return torch.arange(d2t.shape[0], dtype=torch.long) + d2t.long()


def norm_flags(layout: str, cfg: dict) -> dict[str, bool]:
    """EAGLE-3's norm flags, each read explicitly with its source's default: SafeAILab has none (norm before
    the LM head, pre-norm h fed back); SpecForge ``fc_norm`` (False) and ``norm_output`` (True: ``norm``
    before the LM head); speculators ``norm_before_residual``, ``norm_before_fc``, ``fc_norm``,
    ``norm_output`` (all False; norm_output = feed the normed h back). vLLM's speculators bridge defaults
    ``norm_before_residual`` to True when absent; the trainer that wrote the file used False."""
    flags = dict(norm_before_residual=False, fc_norm=False, norm_before_fc=False, norm_logits=True, feed_normed=False)
    if layout == "eagle3-specforge":
        flags.update(fc_norm=bool(cfg.get("fc_norm", False)), norm_logits=bool(cfg.get("norm_output", True)))
    elif layout == "eagle3-speculators":
        flags.update(norm_before_residual=bool(cfg.get("norm_before_residual", False)),
                     norm_before_fc=bool(cfg.get("norm_before_fc", False)), fc_norm=bool(cfg.get("fc_norm", False)),
                     feed_normed=bool(cfg.get("norm_output", False)))
    return flags


# ---- loaders -------------------------------------------------------------------------------------------
def load_eagle(ckpt: Checkpoint, layout: str, target, dtype=None):
    """Load an ``eagle-safeailab`` or ``eagle3-*`` head from ``ckpt`` onto ``target`` (on its device, in
    ``dtype``, default the target's; eval mode), ``head.source`` saying where it came from.
    Raises ValueError: the layout's fields or tensors are inconsistent, a feature specviz's heads lack
    (several decoder layers, qwen3 q/k norms, a head narrower than the target), or the head does not
    fit the target (hidden size, vocabulary, taps out of range)."""
    state = load_tensors(ckpt)
    build = _eagle1 if layout == "eagle-safeailab" else _eagle3
    cfg, rename, source = build(ckpt, layout, target, state)
    head = build_head(cfg)
    fill(head, state, rename, str(ckpt.directory))
    return finish(head, target, dtype, {"format": layout, "source": SOURCES[layout], "path": str(ckpt.directory),
                                        **source})


def _layers(keys, prefix: str = "layers.") -> set[int]:
    return {int(k[len(prefix):].split(".", 1)[0]) for k in keys if k.startswith(prefix)}


def _eagle1(ckpt: Checkpoint, layout: str, target, state: dict):
    cfg, where, tc = ckpt.config, str(ckpt.directory), target.config
    H = ckpt.shape("fc.weight")[0]
    require(ckpt.shape("fc.weight")[1] == 2 * H, where, f"EAGLE-1's fc is [H, 2H], got {ckpt.shape('fc.weight')}")
    require(_layers(state) == {0}, where, f"specviz runs one-layer EAGLE heads; this one has layers "
                                          f"{sorted(_layers(state))}")
    heads = int(cfg.get("num_attention_heads", tc.num_attention_heads))
    head_dim = H // heads  # cnets1.py: head_dim is never read from the config
    require(ckpt.shape("layers.0.self_attn.q_proj.weight")[0] == heads * head_dim, where,
            f"q_proj rows {ckpt.shape('layers.0.self_attn.q_proj.weight')[0]} != heads {heads} x hidden/heads")
    fc_bias = ckpt.has("fc.bias")
    if "bias" in cfg:  # ea_model.py: config "bias" decides; absent = True
        require(bool(cfg["bias"]) == fc_bias, where, f"config.json says bias={cfg['bias']} but the file "
                                                     f"{'has' if fc_bias else 'has no'} fc.bias")
    qkv_bias = bool(cfg.get("qkv_bias", False))
    require(ckpt.has("layers.0.self_attn.q_proj.bias") == qkv_bias, where,
            f"config.json says qkv_bias={qkv_bias} but the file {'has' if not qkv_bias else 'has no'} q/k/v biases")
    own_embed, embed_what = shared_embedding(state, "embed_tokens.weight", target)
    copies = drop_target_copies(state, target, where, lm_head="lm_head.weight")  # it drafts with the target's
    rope = safeailab_rope(cfg, where)
    head_cfg = HeadConfig(
        kind=EAGLE1, hidden_size=H, vocab_size=int(cfg.get("vocab_size", tc.vocab_size)), num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads), head_dim=head_dim,
        intermediate_size=ckpt.shape("layers.0.mlp.gate_proj.weight")[0],
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", tc.max_position_embeddings)),
        target_num_hidden_layers=tc.num_hidden_layers, fc_bias=fc_bias, rope_parameters=rope,
        own_embedding=own_embed, qkv_bias=qkv_bias)
    _check_act(cfg, where)

    def rename(key: str) -> str | None:
        if key == "embed_tokens.weight":
            return "own_embed.weight"
        if key.startswith("fc."):
            return key
        if key == "layers.0.input_layernorm.weight" or "rotary_emb" in key:
            return None  # cnets1.py never builds layer 0's input norm; RoPE is recomputed
        return "layer." + key[len("layers.0."):] if key.startswith("layers.0.") else key

    return head_cfg, rename, {"fc_bias": fc_bias, "embedding": embed_what, "rope_theta": rope["rope_theta"],
                              "feature": "the target's final-norm hidden state", **copies}


def _eagle3(ckpt: Checkpoint, layout: str, target, state: dict):
    cfg, where, tc = ckpt.config, str(ckpt.directory), target.config
    N = tc.num_hidden_layers
    speculators = layout == "eagle3-speculators"
    if speculators:
        tl = _layer_config(cfg.get("transformer_layer_config") or {}, where)
        prefix = "layers.0."
        require(_layers(state) == {0}, where, f"specviz runs one-layer EAGLE-3 heads; this one has layers "
                                              f"{sorted(_layers(state))}")
        H, heads, kv, head_dim = tl.hidden_size, tl.num_attention_heads, tl.num_key_value_heads, tl.head_dim
        eps, rope, vocab = float(tl.rms_norm_eps), dict(tl.rope_parameters), int(tl.vocab_size)
        max_pos = int(tl.max_position_embeddings)
        require(not getattr(tl, "mlp_bias", False), where, "MLP biases are not supported")
        qkv_bias = o_bias = bool(getattr(tl, "attention_bias", False))
        draft_vocab = int(cfg.get("draft_vocab_size", 32000))
    else:
        prefix = "midlayer."
        require(int(cfg.get("num_hidden_layers", 1)) == 1, where, "EAGLE-3's midlayer is one layer")
        H = int(cfg["hidden_size"]) if "hidden_size" in cfg else ckpt.shape("fc.weight")[0]
        heads = int(cfg.get("num_attention_heads", tc.num_attention_heads))
        kv = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or H // heads)  # SpecForge and the EAGLE-3 cnets.py honour head_dim
        eps = float(cfg.get("rms_norm_eps", 1e-6))
        rope = safeailab_rope(cfg, where) if layout == "eagle3-safeailab" else rope_parameters(cfg)
        vocab, max_pos = int(cfg.get("vocab_size", tc.vocab_size)), int(cfg.get("max_position_embeddings", 2048))
        qkv_bias = o_bias = False  # cnets.py / llama3_eagle.py: no attention biases
        draft_vocab = int(cfg.get("draft_vocab_size") or ckpt.shape("lm_head.weight")[0])
    _check_act(cfg.get("transformer_layer_config", cfg) if speculators else cfg, where)
    require(ckpt.shape(prefix + "self_attn.q_proj.weight") == (heads * head_dim, 2 * H), where,
            f"{prefix}self_attn.q_proj is {ckpt.shape(prefix + 'self_attn.q_proj.weight')}, the config says "
            f"[{heads} x {head_dim}, 2 x {H}]")
    require(not ckpt.has(prefix + "self_attn.q_norm.weight"), where,
            "q/k norms in the EAGLE-3 layer (qwen3 layers) are not supported yet")
    target_hidden = cfg.get("target_hidden_size") or H
    require(target_hidden == tc.hidden_size, where,
            f"this head was trained for a target of hidden size {target_hidden}, the target's is {tc.hidden_size}. "
            "Use a head trained for this target (specviz train heads --target DIR).")
    require(H == target_hidden, where,
            f"the head's layer is {H} wide and its target {target_hidden}: specviz's EAGLE-3 head works in the "
            "target's width (a narrower draft layer is not supported yet)")
    taps, taps_in_file = eagle3_taps(layout, cfg, N)
    require(len(set(taps)) == len(taps), where, f"the taps {taps} name one target layer twice")
    require(ckpt.shape("fc.weight")[1] == len(taps) * H, where,
            f"fc reads {ckpt.shape('fc.weight')[1]} features but the taps {taps} give {len(taps)} x {H}")
    require(min(taps) >= 0, where, f"taps {taps}: a layer id below 0")
    require(max(taps) < N, where,
            f"taps {taps} (inputs of those layers) must lie in [0, {N}): the last layer's un-normed output "
            f"(tap {N}) is not available (transformers ties hidden_states[{N}] to the final norm)")
    require(ckpt.shape("lm_head.weight") == (draft_vocab, H), where,
            f"lm_head is {ckpt.shape('lm_head.weight')}, want [draft_vocab_size={draft_vocab}, {H}]"
            + ("" if "draft_vocab_size" in cfg else " (no draft_vocab_size in config.json: the format's default; "
               "add the key with the lm_head's row count)"))
    require(vocab == tc.vocab_size, where, f"the head's vocab_size {vocab} != the target's {tc.vocab_size}: the head "
            "was made for a target with another tokenizer. Use a head trained for this target (specviz train heads "
            "--target DIR).")
    flags = norm_flags(layout, cfg)
    for tensor, flag in (("input_norm.weight", "norm_before_fc"), ("fc_norm.0.weight", "fc_norm")):
        fix = ("SafeAILab's cnets.py has no such norm" if layout == "eagle3-safeailab" else
               f'set "{flag}": {str(not flags[flag]).lower()} in config.json')
        require(ckpt.has(tensor) == flags[flag], where, f"the file {'has' if ckpt.has(tensor) else 'has no'} "
                f"{tensor} but {flag} is {flags[flag]}: {fix}")
    vocab_note = _vocab_map(state, draft_vocab, vocab, where)
    own_embed, embed_what = shared_embedding(state, "embed_tokens.weight", target)
    head_cfg = HeadConfig(
        kind=EAGLE3, hidden_size=H, vocab_size=vocab, num_attention_heads=heads, num_key_value_heads=kv,
        head_dim=head_dim, intermediate_size=ckpt.shape(prefix + "mlp.gate_proj.weight")[0], rms_norm_eps=eps,
        max_position_embeddings=max_pos, target_num_hidden_layers=N, aux_layer_ids=tuple(taps), fc_bias=False,
        rope_parameters=rope, draft_vocab_size=draft_vocab, own_embedding=own_embed, qkv_bias=qkv_bias,
        o_bias=o_bias, **flags)

    def rename(key: str) -> str | None:
        if key.startswith(prefix):
            return None if "rotary_emb" in key else "layer." + key[len(prefix):]
        if key in ("d2t", "t2d") or key.startswith("verifier_"):
            return None  # d2t became draft_to_target; t2d is checked; verifier_* are training-only
        return {"lm_head.weight": "own_lm_head.weight", "embed_tokens.weight": "own_embed.weight"}.get(key, key)

    source = {"taps": taps, "taps_in_file": taps_in_file, "tap_convention": TAP_CONVENTIONS[layout],
              "embedding": embed_what, "rope_theta": rope.get("rope_theta"), **flags, **vocab_note}
    return head_cfg, rename, source


def _vocab_map(state: dict, draft_vocab: int, vocab: int, where: str) -> dict:
    """Turn the file's ``d2t`` offsets into the head's ``draft_to_target`` ids (in ``state``), checked against
    ``t2d``; returns the vocabulary fields of the head's source record."""
    d2t, t2d = state.get("d2t"), state.get("t2d")
    note = {"vocab_size": vocab, "draft_vocab_size": draft_vocab}
    if draft_vocab == vocab:  # SafeAILab deletes d2t / t2d then; vLLM builds no map
        require(d2t is None or not d2t.any(), where, "a full-vocabulary head with a non-zero d2t: engines disagree "
                                                     "on it (SafeAILab ignores it, SGLang applies it)")
        note["draft_to_target"] = "identity (draft vocabulary = target vocabulary)"
        return note
    require(d2t is not None and tuple(d2t.shape) == (draft_vocab,), where,
            f"a draft vocabulary of {draft_vocab} < {vocab} needs d2t [{draft_vocab}] (got "
            f"{None if d2t is None else tuple(d2t.shape)}): without it draft ids would be read as target ids")
    ids = draft_to_target_ids(d2t)
    absolute = bool(((d2t >= 0) & (d2t < vocab)).all()) and d2t.unique().numel() == draft_vocab
    require(bool(((ids >= 0) & (ids < vocab)).all()), where, f"d2t maps draft ids outside [0, {vocab})" + (
        ": d2t holds offsets (target id = draft id + d2t[draft id]); this one looks like absolute target ids"
        if absolute else ""))
    require(ids.unique().numel() == draft_vocab, where, "d2t maps two draft ids to one target id")
    if t2d is not None:
        require(tuple(t2d.shape) == (vocab,) and int(t2d.sum()) == draft_vocab and bool(t2d.bool()[ids].all()), where,
                "t2d does not mark exactly the target ids that d2t maps to")
    state["draft_to_target"] = ids
    note["draft_to_target"] = "target id = draft id + d2t[draft id] (offsets)"
    note["d2t_examples"] = [[i, int(ids[i])] for i in range(min(6, draft_vocab))]
    return note


def _layer_config(tl: dict, where: str):
    """speculators' ``transformer_layer_config`` with transformers' defaults filled in (it is saved as a
    diff against them: ``to_diff_dict``). Only llama layers are supported."""
    from transformers import AutoConfig

    require(bool(tl), where, "config.json has no transformer_layer_config (speculators writes the draft layer's "
                             "config there: model_type, hidden_size, heads, ...)")
    require("model_type" in tl, where, "transformer_layer_config has no model_type (speculators writes 'llama' for "
                                       "a Llama draft layer); without it speculators would build a Qwen3 layer")
    model_type = tl["model_type"]
    require(model_type == "llama", where, f"transformer_layer_config of model_type {model_type!r}: specviz runs "
                                          "llama EAGLE-3 layers only (qwen3's q/k norms are not supported yet)")
    return AutoConfig.for_model(model_type, **{k: v for k, v in tl.items() if k != "model_type"})


def _check_act(cfg: dict, where: str) -> None:
    require(cfg.get("hidden_act", "silu") == "silu", where, f"hidden_act {cfg.get('hidden_act')!r}: only silu")


# ---- the formats contract (specviz.heads.formats) ---------------------------------------------------------------
LAYOUTS = ("eagle-safeailab", "eagle3-safeailab", "eagle3-specforge", "eagle3-speculators")
KIND_OF = {"eagle-safeailab": EAGLE1, **{layout: EAGLE3 for layout in LAYOUTS[1:]}}


def detect(ckpt: Checkpoint) -> str | None:
    """The EAGLE layout of ``ckpt``, None when it is none of them. Raises ValueError for a speculators checkpoint of
    another algorithm."""
    cfg, keys = ckpt.config, set(ckpt.shapes)
    if "speculators_model_type" in cfg:
        if cfg["speculators_model_type"] == EAGLE3:
            return "eagle3-speculators"
        raise ValueError(f"{ckpt.directory}: a speculators checkpoint of type {cfg['speculators_model_type']!r}; "
                         "specviz loads the speculators layout for EAGLE-3 only")
    if any(k.startswith("midlayer.") for k in keys):
        specforge = ("eagle_config" in cfg or "fc_norm" in cfg or "norm_output" in cfg
                     or any(k.startswith("fc_norm.") for k in keys))
        return "eagle3-specforge" if specforge else "eagle3-safeailab"
    dflash = "dflash_config" in cfg or any("hidden_norm" in k or ".k_norm." in k for k in keys)  # z-lab's markers
    if "fc.weight" in keys and any(k.startswith("layers.0.") for k in keys) and not dflash:
        return "eagle-safeailab"
    return None


load = load_eagle


def write(head, verifier):
    """(layout, config, tensors, file name) of an EAGLE-1 head as SafeAILab's, an EAGLE-3 head as speculators'."""
    return (_write_eagle3 if head.config.kind == EAGLE3 else _write_eagle1)(head, verifier)


def _write_eagle1(head, verifier):
    c, rope = head.config, head.config.rope_parameters
    odd_rope = rope.get("rope_type", "default") != "default" and (rope.get("rope_type") not in ("linear", "dynamic")
                                                                   or float(rope["rope_theta"]) != 10000.0)
    if c.head_dim * c.num_attention_heads != c.hidden_size or c.o_bias or odd_rope:  # safeailab_rope reads it back
        raise ValueError("SafeAILab's EAGLE-1 layout computes head_dim = hidden_size // heads, has no o_proj bias and "
                         "scales RoPE (linear / dynamic only) at base 10000; this head has head_dim "
                         f"{c.head_dim} x {c.num_attention_heads} heads, o_bias {c.o_bias}, RoPE {rope}")
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
              **rope_fields(c.rope_parameters)}
    return "eagle-safeailab", config, tensors, "model.safetensors"


def _write_eagle3(head, verifier):
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
                 "attention_bias": c.qkv_bias, **rope_fields(c.rope_parameters)}
    config = {"architectures": ["Eagle3DraftModel"], "speculators_model_type": EAGLE3,
              "speculators_config": {"algorithm": EAGLE3, "default_proposal_method": "greedy",
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
