"""Saving and loading heads: ``DIR/config.json`` (:class:`HeadConfig`) + ``DIR/model.safetensors``
(bf16 by default). The target's embedding and LM head are never in the file; ``load_head`` attaches
the given target's. Safetensors only: nothing is unpickled."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specviz.heads.config import HeadConfig, check_matches_target
from specviz.heads.modules import build_head

CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"


def save_head(head, directory: str | os.PathLike, dtype: torch.dtype = torch.bfloat16) -> list[str]:
    """Write config.json and model.safetensors (the head's own parameters only, cast to ``dtype``)
    into ``directory`` (created). Returns the file names written."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(path / WEIGHTS_NAME), metadata={"format": "pt", "kind": head.config.kind})
    (path / CONFIG_NAME).write_text(head.config.to_json())
    return [CONFIG_NAME, WEIGHTS_NAME]


def load_config(directory: str | os.PathLike) -> HeadConfig:
    """The head config in ``directory``. Raises ValueError if config.json is missing or malformed."""
    f = Path(directory) / CONFIG_NAME
    if not f.is_file():
        raise ValueError(f"no head config at {f}; a head directory holds {CONFIG_NAME} and {WEIGHTS_NAME}")
    return HeadConfig.from_json(f.read_text())


def load_head(directory: str | os.PathLike, target, dtype: torch.dtype | None = None):
    """Load the head in ``directory`` onto ``target`` (sharing its embedding and LM head), on the
    target's device, in ``dtype`` (default: the target's dtype), in eval mode.
    Raises ValueError if the config does not match the target (hidden size, vocab, layer count,
    aux layer ids out of range) or the weights do not match the config."""
    cfg = load_config(directory)
    check_matches_target(cfg, target.config)
    f = Path(directory) / WEIGHTS_NAME
    if not f.is_file():
        raise ValueError(f"no head weights at {f} (specviz loads safetensors only)")
    head = build_head(cfg)
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
