"""Medusa heads as published, normalised into specviz's :class:`~specviz.methods.medusa.head.MedusaHead`.

Sources (read for the layouts; the code here is specviz's own):

* FasterDecoding/Medusa ``medusa/model/medusa_model.py`` (Medusa-1: head h = ``Sequential(ResBlock x L,
  Linear(H, V, bias=False))``, saved as ``{h}.{l}.linear.{weight,bias}`` and its own LM head
  ``{h}.{L}.weight``; ``ResBlock`` = x + SiLU(Linear(x)), with bias). Its loader forces 5 heads ("TODO:
  fix the uploaded config"), so the head count is read from the keys, not ``medusa_num_heads``.
* FasterDecoding/Medusa after "Creating medusa2" (``medusa_model_legacy.py``, ``train_legacy.py``): the
  heads are ResBlocks only, saved to ``medusa_lm_head.safetensors``; logits = the base model's LM head.
* vLLM ``model_executor/models/medusa.py`` and ``transformers_utils/configs/medusa.py`` (removed in
  vLLM 0.34): ``blocks.{h}.layers.{l}.weight`` (+ bias iff ``medusa_fc_bias``, default False),
  ``lm_heads.{h}.weight`` or one ``lm_head`` (``original_lm_head``), ``token_map`` (absolute target ids
  of a truncated vocabulary, used iff ``truncated_vocab_size < vocab_size``; LM head rows are cut to it
  when the file holds the full vocabulary), prefix ``medusa_heads.`` stripped.
* FasterDecoding/Medusa's full-model checkpoints ("Medusa-2": ``MedusaModelABC`` subclasses the base model):
  the Medusa-1 keys under ``medusa_head.`` inside the model's (possibly sharded) safetensors; only they are read.

Every layout reads the target's final-norm hidden state at the last committed position (specviz's
Medusa feature).
"""

from __future__ import annotations

import re

import torch

from specviz.methods.medusa.head import MedusaConfig, MedusaHead
from specviz.heads.formats.common import fill, finish, load_tensors, require
from specviz.heads.formats.detect import Checkpoint

MEDUSA1_BLOCK = re.compile(r"^(\d+)\.(\d+)\.linear\.(weight|bias)$")
MEDUSA1_HEAD = re.compile(r"^(\d+)\.(\d+)\.weight$")
VLLM_MEDUSA = re.compile(r"^(?:medusa_heads\.)?blocks\.(\d+)\.layers\.(\d+)\.(weight|bias)$")
SOURCES = {"medusa1-fasterdecoding": "FasterDecoding/Medusa (Medusa-1 heads, own LM heads)",
           "medusa2-fasterdecoding": "FasterDecoding/Medusa (medusa2 heads, the target's LM head)",
           "medusa-vllm": "vLLM (model_executor/models/medusa.py)"}
VLLM_LM = re.compile(r"^lm_heads\.(\d+)\.weight$")
IN_MODEL = "medusa_head."  # the attribute MedusaModelABC keeps its heads under, in a full model's state dict


def in_model(keys) -> bool:
    """Whether the heads sit inside a full model's weights (keys under ``medusa_head.``)."""
    return any(k.startswith(IN_MODEL) for k in keys)


def token_map_ids(token_map, truncated: int):
    """vLLM's ``token_map`` holds ABSOLUTE target ids: row i of a truncated LM head scores target id
    token_map[i] (``compute_logits``: ``logits[..., token_map] = truncated logits``). int64 [V_trunc]."""
    return token_map.long()


def load_medusa(ckpt: Checkpoint, layout: str, target, dtype=None) -> MedusaHead:
    """Load a ``medusa1-fasterdecoding`` / ``medusa2-fasterdecoding`` / ``medusa-vllm`` head onto ``target``
    (its device, ``dtype`` default the target's, eval mode), ``head.source`` saying where it came from.
    Raises ValueError when the keys are inconsistent (a head without its blocks or LM head, a truncated
    vocabulary without ``token_map``) or the heads do not fit the target."""
    inside = in_model(ckpt.shapes)
    state = {k.removeprefix(IN_MODEL) if inside else k.removeprefix("medusa_heads."): v
             for k, v in load_tensors(ckpt, IN_MODEL if inside else "").items()}
    where, tc = str(ckpt.directory), target.config
    if layout == "medusa-vllm":
        cfg, rename, source = _vllm(ckpt.config, state, where, tc)
    else:
        cfg, rename, source = _fasterdecoding(ckpt.config, layout, state, where, tc)
    if inside:
        source["embedded"] = f"the heads under '{IN_MODEL}' in a full model's weights (the rest not read)"
    head = MedusaHead(cfg)
    fill(head, state, rename, where)
    return finish(head, target, dtype, {"format": layout, "source": SOURCES[layout], "path": where,
                                        "num_heads": cfg.num_heads, "num_layers": cfg.num_layers,
                                        "lm_heads": cfg.lm_heads, "fc_bias": cfg.fc_bias, **source})


def _count(matches, where: str, what: str) -> tuple[int, int]:
    """(heads, layers) from (head, layer) index pairs, which must cover 0..K-1 x 0..L-1."""
    pairs = {(int(h), int(l)) for h, l in matches}
    heads, layers = {h for h, _ in pairs}, {l for _, l in pairs}
    K, L = max(heads) + 1, max(layers) + 1
    require(pairs == {(h, l) for h in range(K) for l in range(L)}, where,
            f"{what}: blocks {sorted(pairs)} do not cover heads 0..{K - 1} x layers 0..{L - 1}")
    return K, L


def _fasterdecoding(cfg: dict, layout: str, state: dict, where: str, tc):
    blocks = [MEDUSA1_BLOCK.match(k) for k in state]
    K, L = _count([(m[1], m[2]) for m in blocks if m and m[3] == "weight"], where, "Medusa ResBlocks")
    H = state["0.0.linear.weight"].shape[0]
    require(all(f"{h}.{l}.linear.bias" in state for h in range(K) for l in range(L)), where,
            "FasterDecoding's ResBlocks have biases: some are missing")
    own = layout == "medusa1-fasterdecoding"
    if own:
        heads = {int(m[1]): int(m[2]) for m in map(MEDUSA1_HEAD.match, state) if m}
        require(heads == {h: L for h in range(K)}, where,
                f"Medusa-1 keeps head h's LM head at '{{h}}.{L}.weight' for every head 0..{K - 1}; found {heads}")
        rows = state[f"0.{L}.weight"].shape[0]
        require(rows == tc.vocab_size, where, f"the heads' LM heads score {rows} tokens, the target's vocabulary has "
                f"{tc.vocab_size}: the heads were made for a target with another tokenizer. Use a head trained for "
                "this target (specviz train heads --target DIR).")
    cfg_out = MedusaConfig(kind="medusa", hidden_size=H, vocab_size=tc.vocab_size,
                           target_num_hidden_layers=tc.num_hidden_layers, num_heads=K, num_layers=L, fc_bias=True,
                           lm_heads="per_head" if own else "target")

    def rename(key: str) -> str | None:
        m = MEDUSA1_BLOCK.match(key)
        if m:
            return f"blocks.{m[1]}.{m[2]}.linear.{m[3]}"
        m = MEDUSA1_HEAD.match(key)
        return f"own_lm_heads.{m[1]}.weight" if m else key

    return cfg_out, rename, {"config_num_heads": cfg.get("medusa_num_heads"),
                             "lm_head": "one per head (the file's)" if own else "the target's"}


def _vllm(cfg: dict, state: dict, where: str, tc):
    named = {_vllm_key(k): v for k, v in cfg.items()}  # vLLM's MedusaConfig.from_pretrained renames num*heads / num*layers
    blocks = [VLLM_MEDUSA.match(k) for k in state]
    K, L = _count([(m[1], m[2]) for m in blocks if m and m[3] == "weight"], where, "vLLM Medusa blocks")
    H = state["blocks.0.layers.0.weight"].shape[0]
    bias = bool(cfg.get("medusa_fc_bias", False))
    has_bias = any(m and m[3] == "bias" for m in blocks)
    require(has_bias == bias, where, f"medusa_fc_bias={bias} but the file {'has' if has_bias else 'has no'} "
                                     "block biases")
    vocab = int(cfg.get("vocab_size", tc.vocab_size))
    truncated = int(cfg.get("truncated_vocab_size") or vocab)
    token_map = state.pop("token_map", None)
    note = {"vocab_size": vocab, "truncated_vocab_size": truncated}
    if truncated < vocab:
        require(token_map is not None and tuple(token_map.shape) == (truncated,), where,
                f"truncated_vocab_size {truncated} < vocab_size {vocab} needs token_map [{truncated}]")
        require(bool(((token_map >= 0) & (token_map < vocab)).all()) and token_map.unique().numel() == truncated,
                where, f"token_map must hold {truncated} distinct target ids in [0, {vocab})")
        state["token_map"] = token_map_ids(token_map, truncated)
        note["token_map"] = "absolute target ids"
        note["token_map_examples"] = [[i, int(token_map[i])] for i in range(min(6, truncated))]
    if cfg.get("original_lm_head", False):
        name = "lm_head.weight" if "lm_head.weight" in state else "lm_heads.0.weight"
        require(name in state, where, "original_lm_head needs lm_head.weight (or lm_heads.0.weight)")
        lms, mode = {0: state.pop(name)}, "shared"
        for k in [k for k in state if VLLM_LM.match(k)]:
            del state[k]  # vLLM reads only the first
    else:
        lms = {int(m[1]): state.pop(m[0]) for m in [VLLM_LM.match(k) for k in list(state)] if m}
        require(set(lms) == set(range(K)), where, f"lm_heads.{{h}}.weight for heads 0..{K - 1}, found {sorted(lms)}")
        mode = "per_head"
    for h, w in lms.items():
        rows, file_name = int(w.shape[0]), name if mode == "shared" else f"lm_heads.{h}.weight"
        if rows not in (vocab, truncated):  # checked here: past this point the error would name specviz's keys
            hint = (f"; the rows match token_map's {token_map.numel()}: config.json probably lacks "
                    f"truncated_vocab_size = {token_map.numel()}" if token_map is not None
                    and rows == token_map.numel() else "")
            raise ValueError(f"{where}: {file_name} has {rows} rows, but vocab_size is {vocab}"
                             + (f" and truncated_vocab_size {truncated}" if truncated < vocab else "") + hint)
        if truncated < vocab and w.shape[0] > truncated:
            w = w[state["token_map"]]  # vLLM cuts a full-vocabulary LM head to the token map's rows
        state[f"own_lm_heads.{h}.weight"] = w
    cfg_out = MedusaConfig(kind="medusa", hidden_size=H, vocab_size=vocab, target_num_hidden_layers=tc.num_hidden_layers,
                           num_heads=K, num_layers=L, fc_bias=bias, lm_heads=mode,
                           head_vocab_size=truncated if truncated < vocab else None)

    def rename(key: str) -> str | None:
        m = VLLM_MEDUSA.match(key)
        return f"blocks.{m[1]}.{m[2]}.linear.{m[3]}" if m else key

    return cfg_out, rename, {"config_num_heads": named.get("num_heads"),
                             "lm_head": "one for all heads (the file's)" if mode == "shared" else
                             "one per head (the file's)", **note}


def _vllm_key(key: str) -> str:
    if "num" in key and "heads" in key:
        return "num_heads"
    if "num" in key and "layers" in key:
        return "num_hidden_layers"
    return key


# ---- the formats contract (specviz.heads.formats) ---------------------------------------------------------------
LAYOUTS = ("medusa1-fasterdecoding", "medusa2-fasterdecoding", "medusa-vllm")
KIND_OF = {layout: "medusa" for layout in LAYOUTS}


def detect(ckpt: Checkpoint) -> str | None:
    """The Medusa layout of ``ckpt``, None when it is none of them."""
    keys = set(ckpt.shapes)
    if in_model(keys):
        keys = {k.removeprefix(IN_MODEL) for k in keys if k.startswith(IN_MODEL)}
    if any(VLLM_MEDUSA.match(k) for k in keys):
        return "medusa-vllm"
    if any(MEDUSA1_BLOCK.match(k) for k in keys):
        return "medusa1-fasterdecoding" if any(MEDUSA1_HEAD.match(k) for k in keys) else "medusa2-fasterdecoding"
    if ckpt.config.get("medusa_num_layers") == 0 and keys and all(MEDUSA1_HEAD.match(k) for k in keys):
        raise ValueError(f"{ckpt.directory}: a FasterDecoding Medusa head with medusa_num_layers 0 (each head a "
                         "bare LM head, no ResBlock) is not supported: specviz's Medusa heads have at least one "
                         "ResBlock")
    return None


load = load_medusa


def write(head, verifier):
    """(layout, config, tensors, file name) of ``head`` as FasterDecoding writes Medusa heads, or as vLLM does when
    FasterDecoding's layout cannot express it (distinct ResBlocks in one head, no bias, a shared or truncated LM
    head)."""
    c = head.config
    same = (lambda r, f: torch.equal(r.linear.weight, f.linear.weight) and torch.equal(r.linear.bias, f.linear.bias))
    distinct = any(not same(r, b[0]) for b in head.blocks for r in b) if c.fc_bias else True
    if distinct or c.lm_heads == "shared" or c.head_vocab_size is not None:
        return _write_vllm(head, verifier)
    tensors = {}
    for h, block in enumerate(head.blocks):
        for l, res in enumerate(block):
            tensors[f"{h}.{l}.linear.weight"], tensors[f"{h}.{l}.linear.bias"] = res.linear.weight, res.linear.bias
        if c.lm_heads == "per_head":
            tensors[f"{h}.{c.num_layers}.weight"] = head.own_lm_heads[h].weight
    config = {"medusa_num_heads": c.num_heads, "medusa_num_layers": c.num_layers, "base_model_name_or_path": verifier,
              **({"version": "2"} if c.lm_heads == "target" else {})}
    layout = "medusa2-fasterdecoding" if c.lm_heads == "target" else "medusa1-fasterdecoding"
    return layout, config, tensors, "medusa_lm_head.safetensors"


def _write_vllm(head, verifier):
    """vLLM's layout (``blocks.{h}.layers.{l}``: each layer its own weights, which FasterDecoding's repeated ResBlock
    cannot hold). vLLM loads no LM head from elsewhere, so a head on the target's LM head carries a copy of it
    (``original_lm_head``)."""
    c = head.config
    tensors = {}
    for h, block in enumerate(head.blocks):
        for l, res in enumerate(block):
            tensors[f"blocks.{h}.layers.{l}.weight"] = res.linear.weight
            if c.fc_bias:
                tensors[f"blocks.{h}.layers.{l}.bias"] = res.linear.bias
    if c.lm_heads == "per_head":
        tensors.update({f"lm_heads.{h}.weight": head.own_lm_heads[h].weight for h in range(c.num_heads)})
    else:
        tensors["lm_head.weight"] = head.lm_head.weight if c.lm_heads == "target" else head.own_lm_heads[0].weight
    config = {"architectures": ["MedusaModel"], "model_type": "medusa", "hidden_size": c.hidden_size,
              "vocab_size": c.vocab_size, "num_heads": c.num_heads, "num_hidden_layers": c.num_layers,
              "medusa_fc_bias": c.fc_bias, "original_lm_head": c.lm_heads != "per_head",
              "truncated_vocab_size": c.head_vocab_size or c.vocab_size, "base_model_name_or_path": verifier}
    if c.head_vocab_size is not None:
        tensors["token_map"] = head.token_map
    return "medusa-vllm", config, tensors, "model.safetensors"
