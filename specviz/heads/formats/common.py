"""What every published-layout loader shares: reading the tensors, renaming them into a specviz head,
the head's own RoPE, the target's embedding when the file's copy equals it, and finishing the head
(device, dtype, attach, its ``source`` record). Safetensors only: nothing is unpickled here."""

from __future__ import annotations

from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from .detect import Checkpoint

DEFAULT_ROPE_THETA = 10000.0  # SafeAILab's LlamaRotaryEmbedding base when config.json has no rope_theta


def load_tensors(ckpt: Checkpoint, prefix: str = "") -> dict[str, torch.Tensor]:
    """The checkpoint's safetensors tensors (CPU) whose names start with ``prefix`` (all when empty), the prefix
    kept; only those are read, so a head inside a full model's shards does not load the model. Raises ValueError
    on a name that two files hold."""
    state: dict[str, torch.Tensor] = {}
    came_from: dict[str, str] = {}
    for f in ckpt.files:
        if prefix:
            with safe_open(str(f), framework="pt") as handle:
                part = {k: handle.get_tensor(k) for k in handle.keys() if k.startswith(prefix)}
        else:
            part = load_file(str(f))
        twice = sorted(set(part) & set(state))
        if twice:
            raise ValueError(f"{ckpt.directory}: tensors {twice[:4]} are in both {came_from[twice[0]]} and {f.name}: "
                             "two copies of the weights (e.g. one written by specviz convert beside the shipped "
                             "safetensors); delete one of the two files")
        state.update(part)
        came_from.update(dict.fromkeys(part, f.name))
    return state


def rope_parameters(cfg: dict, default_theta: float = DEFAULT_ROPE_THETA) -> dict:
    """transformers' ``rope_parameters`` from a head's own config.json (never the target's: an EAGLE-3
    head for Llama-3.1 runs RoPE at base 10000 while its target uses 500000).

    ``rope_parameters`` (transformers 5) is taken as is; else ``rope_theta`` (absent: ``default_theta``)
    with ``rope_scaling`` ({"type" or "rope_type": ..., "factor": ...}) when given."""
    given = cfg.get("rope_parameters")
    if isinstance(given, dict) and "rope_theta" in given:
        return dict(given)
    params = {"rope_type": "default", "rope_theta": float(cfg.get("rope_theta", default_theta))}
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type", scaling.get("type"))
        params.update({k: v for k, v in scaling.items() if k not in ("type", "rope_type")}, rope_type=kind)
    return params


def safeailab_rope(cfg: dict, where: str) -> dict:
    """The RoPE a SafeAILab head runs (``cnets[1].py`` ``_init_rope``): ``rope_theta`` (absent: 10000) unscaled;
    linear / dynamic ``rope_scaling`` at base 10000 (built without ``base=``). ValueError for other scalings."""
    rope = rope_parameters(cfg)
    require(rope["rope_type"] in ("default", "linear", "dynamic"), where,
            f"SafeAILab heads know RoPE scaling linear / dynamic only, got {rope['rope_type']!r}")
    if rope["rope_type"] != "default":
        rope["rope_theta"] = 10000.0
    return rope


def shared_embedding(state: dict[str, torch.Tensor], name: str, target) -> tuple[bool, str]:
    """Whether the head needs its own embedding: the file's ``name`` tensor, if any, against the target's
    input embedding (vLLM ``_should_share``: a copy equal to the target's is shared, not kept).
    Returns (own, what) with ``what`` for the head's source record; pops ``name`` from ``state`` when shared.
    Raises ValueError when the file's embedding has another shape than the target's."""
    if name not in state:
        return False, "the target's (not in the file)"
    emb = target.get_input_embeddings().weight
    mine = state[name]
    if tuple(mine.shape) != tuple(emb.shape):
        raise ValueError(f"the head's {name} is {tuple(mine.shape)}, the target's embedding {tuple(emb.shape)}: "
                         "the head was made for another target")
    if same_weights(mine, emb):
        del state[name]
        return False, "the target's (the file's copy equals it)"
    return True, "the head's own (the file's copy differs from the target's)"


def same_weights(mine: torch.Tensor, theirs: torch.Tensor) -> bool:
    """Whether a file's tensor ``mine`` is a copy of the target's ``theirs`` (same shape), compared on the target's
    device (no host copy of an LM head): exactly in one dtype; in the lower precision when the other holds it (a
    bf16 or fp16 copy of an fp32 weight, or the reverse); fp16 against bf16, where neither holds the other and both
    may be roundings of one fp32 weight, in fp32 within one bf16 rounding (relative 2^-7) or fp16's subnormal step."""
    theirs = theirs.detach()
    mine = mine.to(theirs.device)
    if mine.dtype == theirs.dtype:
        return torch.equal(mine, theirs)
    halves = {torch.float16, torch.bfloat16}
    if {mine.dtype, theirs.dtype} == halves:
        return torch.allclose(mine.float(), theirs.float(), rtol=2.0 ** -7, atol=2.0 ** -24)
    low = mine.dtype if torch.finfo(mine.dtype).bits < torch.finfo(theirs.dtype).bits else theirs.dtype
    return torch.equal(mine.to(low), theirs.to(low))


def drop_target_copies(state: dict[str, torch.Tensor], target, where: str, **names: str) -> dict[str, str]:
    """Drop the file's copies of the target's embedding / LM head that a head reads from the target (EAGLE-1 and
    DFlash use the target's): ``names`` maps "embedding" / "lm_head" to the file's tensor name. A copy equal to the
    target's (in the lower of the two precisions) is dropped, as vLLM shares it; one that differs is refused, since
    the published forward reads the target's. Returns {name: what} for the head's source record.
    Raises ValueError: a copy whose shape or values differ from the target's."""
    theirs = {"embedding": target.get_input_embeddings(), "lm_head": target.get_output_embeddings()}
    seen = {}
    for part, name in names.items():
        if name not in state:
            continue
        mine, ref = state[name], theirs[part].weight
        if tuple(mine.shape) != tuple(ref.shape) or not same_weights(mine, ref):
            raise ValueError(f"{where}: the file's {name} {tuple(mine.shape)} is not a copy of the target's {part} "
                             f"{tuple(ref.shape)}; this layout drafts with the target's {part}, so the head was made "
                             "for another target (or delete the tensor to use this target's)")
        del state[name]
        seen[name] = "the target's (the file's copy equals it)"
    return seen


def fill(module: nn.Module, state: dict[str, torch.Tensor], rename: Callable[[str], str | None],
         where: str) -> None:
    """Load ``state`` into ``module`` after renaming each key by ``rename`` (None: drop it). Every
    parameter and buffer of the module must be filled, with its exact shape. Raises ValueError
    naming the missing, unexpected and wrong-shaped keys (in the file's names where possible)."""
    mapped, source = {}, {}
    for key, value in state.items():
        new = rename(key)
        if new is None:
            continue
        mapped[new], source[new] = value, key
    own = module.state_dict()
    missing = sorted(_file_name(k, source) for k in set(own) - set(mapped))
    extra = sorted(source[k] for k in set(mapped) - set(own))
    bad = [f"{source[k]} {tuple(mapped[k].shape)} (want {tuple(own[k].shape)})" for k in own
           if k in mapped and tuple(mapped[k].shape) != tuple(own[k].shape)]
    if missing or extra or bad:
        raise ValueError(f"{where}: the weights do not fit the layout: missing {missing}, unexpected {extra}, "
                         f"wrong shapes {bad}")
    module.load_state_dict({k: v.to(own[k].dtype) if own[k].is_floating_point() else v for k, v in mapped.items()})


def _file_name(key: str, source: dict[str, str]) -> str:
    """A module key the file lacks, in the file's naming: the prefix the renaming replaced in the tensors the file
    has (``layer.`` <- ``midlayer.`` or ``layers.0.``), the longest one that fits ``key``; ``key`` itself if none."""
    parts, best = key.split("."), (-1, "")
    for new, old in source.items():
        a, b = new.split("."), old.split(".")
        common = 0
        while common < min(len(a), len(b)) and a[-1 - common] == b[-1 - common]:
            common += 1
        head_new, head_old = a[:len(a) - common], b[:len(b) - common]
        if parts[:len(head_new)] == head_new and len(head_new) > best[0] and len(head_new) < len(parts):
            best = (len(head_new), ".".join(head_old + parts[len(head_new):]))
    return best[1] or key


def finish(head: nn.Module, target, dtype: torch.dtype | None, source: dict) -> nn.Module:
    """Move ``head`` to the target's device and ``dtype`` (default the target's), attach the target
    (its embedding and LM head, shared), eval mode; record ``source`` as ``head.source``."""
    param = next(target.parameters())
    head.to(device=param.device, dtype=dtype or param.dtype)
    head.source = dict(source)
    return head.attach(target).eval()


def require(cond: bool, where: str, message: str) -> None:
    """Raise ValueError(f"{where}: {message}") unless ``cond``."""
    if not cond:
        raise ValueError(f"{where}: {message}")
