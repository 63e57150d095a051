"""Saving and loading heads: ``DIR/config.json`` (:class:`HeadConfig`) + ``DIR/model.safetensors``
(bf16 by default). The target's embedding and LM head are never in the file; ``load_head`` attaches
the given target's. Safetensors only: nothing is unpickled."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specviz.heads.config import FORMAT, HEAD_DIRS, HeadConfig, check_matches_target
from specviz.heads.modules import build_head

CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"
ASSETS_MODELS = Path(__file__).resolve().parent.parent.parent / "assets" / "models"


def default_head_dir(kind: str) -> Path:
    """Where the bundled head of ``kind`` lives: assets/models/specviz-eagle or specviz-eagle3
    (it may not exist yet: the heads are trained by ``python -m specviz.train.heads``)."""
    if kind not in HEAD_DIRS:
        raise ValueError(f"unknown head kind {kind!r}; use one of {sorted(HEAD_DIRS)}")
    return ASSETS_MODELS / HEAD_DIRS[kind]


def save_head(head, directory: str | os.PathLike, dtype: torch.dtype = torch.bfloat16) -> list[str]:
    """Write config.json and model.safetensors (the head's own parameters only, cast to ``dtype``)
    into ``directory`` (created). Returns the file names written."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()  # id maps stay int64
             for k, v in head.state_dict().items()}
    save_file(state, str(path / WEIGHTS_NAME), metadata={"format": "pt", "kind": head.config.kind})
    (path / CONFIG_NAME).write_text(head.config.to_json())
    return [CONFIG_NAME, WEIGHTS_NAME]


def _own_kinds() -> dict:
    """Head kinds with their own config class: {kind: (config class, head class, target check)}."""
    from specviz.heads.medusa import MedusaConfig, MedusaHead, check_medusa_matches
    from specviz.heads.mtp import MtpConfig, MtpHead, check_mtp_matches

    return {"medusa": (MedusaConfig, MedusaHead, check_medusa_matches), "mtp": (MtpConfig, MtpHead, check_mtp_matches)}


def load_config(directory: str | os.PathLike):
    """The head config in ``directory`` (a :class:`HeadConfig`, or the medusa / mtp kinds' own).
    Raises ValueError if config.json is missing or malformed."""
    f = Path(directory) / CONFIG_NAME
    if not f.is_file():
        raise ValueError(f"no head config at {f}; a head directory holds {CONFIG_NAME} and {WEIGHTS_NAME}")
    text = f.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{f} is not valid JSON: {exc}") from None
    own = _own_kinds().get(data.get("kind") if isinstance(data, dict) else None)
    if own is None:
        return HeadConfig.from_json(text)
    if data.pop("format", None) != FORMAT:
        raise ValueError(f"config.json is not a {FORMAT} head config")
    return own[0].from_dict(data)


def load_head(directory: str | os.PathLike, target, dtype: torch.dtype | None = None):
    """Load the head in ``directory`` onto ``target`` (sharing its embedding and LM head), on the
    target's device, in ``dtype`` (default: the target's dtype), in eval mode.
    Raises ValueError if the config does not match the target (hidden size, vocab, layer count,
    aux layer ids out of range) or the weights do not match the config."""
    cfg = load_config(directory)
    own = _own_kinds().get(cfg.kind)
    (own[2] if own else check_matches_target)(cfg, target.config)
    f = Path(directory) / WEIGHTS_NAME
    if not f.is_file():
        raise ValueError(f"no head weights at {f} (specviz loads safetensors only)")
    head = own[1](cfg) if own else build_head(cfg)
    state = load_file(str(f))
    own = head.state_dict()
    missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    bad = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or extra or bad:
        raise ValueError(f"{f} does not match its config: missing {missing}, unexpected {extra}, "
                         f"wrong shapes {bad}")
    head.load_state_dict(state)
    param = next(target.parameters())
    head.to(device=param.device, dtype=dtype or param.dtype)
    return head.attach(target).eval()
