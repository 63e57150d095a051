"""Saving and loading heads in specviz's own format: ``DIR/config.json`` (the head's dataclass config, with its
``kind``: the method) + ``DIR/model.safetensors`` (bf16 by default). The target's embedding and LM head are never in
the file; ``load_head`` attaches the given target's. The method's head module (``HeadSpec.module``) gives its config
class, builder and target check (``SPECVIZ_FORMAT``). Safetensors only: nothing is unpickled."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

import importlib

from specviz import methods
from specviz.heads.common import FORMAT, load_weights

CONFIG_NAME, WEIGHTS_NAME = "config.json", "model.safetensors"
ASSETS_MODELS = Path(__file__).resolve().parent.parent.parent / "assets" / "models"


def default_head_dir(kind: str) -> Path:
    """Where the bundled head of method ``kind`` lives (assets/models/specviz-<...>; it may not exist yet: the heads
    are trained by ``specviz train heads``). Raises ValueError for a method without a bundled head."""
    spec = methods.get(kind).head if kind in methods.names() else None
    if spec is None or not spec.bundled:
        takers = sorted(m.name for m in methods.all_methods() if m.head is not None and m.head.bundled)
        raise ValueError(f"unknown head kind {kind!r}; use one of {takers}")
    return ASSETS_MODELS / spec.bundled


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


def save_any(head, directory: str | os.PathLike, dtype: torch.dtype = torch.bfloat16) -> list[str]:
    """Save ``head`` in specviz's own format for its method: the method's head module's ``save_own`` (a format of its
    own), else :func:`save_head`. Returns the file names written."""
    spec = methods.get(head.config.kind).head if head.config.kind in methods.names() else None
    module = importlib.import_module(spec.module) if spec is not None and spec.module else None
    return getattr(module, "save_own", save_head)(head, directory, dtype=dtype)


def specviz_format(kind: Any) -> tuple[Any, Any, Any]:
    """(config class, build(config) -> head, check(config, target config)) of method ``kind``'s head in specviz's own
    format. Raises ValueError for a kind that is not a registered method with a head in that format."""
    spec = methods.get(kind).head if isinstance(kind, str) and kind in methods.names() else None
    module = importlib.import_module(spec.module) if spec is not None and spec.module else None
    if module is None or not hasattr(module, "SPECVIZ_FORMAT"):
        takers = sorted(m.name for m in methods.all_methods() if m.head is not None and m.head.module)
        raise ValueError(f"config.json names head kind {kind!r}; specviz's format has heads of {', '.join(takers)}")
    return module.SPECVIZ_FORMAT


def load_config(directory: str | os.PathLike):
    """The head config in ``directory`` (its method's config class). Raises ValueError if config.json is missing or
    malformed, or names no known head kind."""
    f = Path(directory) / CONFIG_NAME
    if not f.is_file():
        raise ValueError(f"no head config at {f}; a head directory holds {CONFIG_NAME} and {WEIGHTS_NAME}")
    text = f.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{f} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"config.json is not a {FORMAT} head config")
    return specviz_format(data.get("kind"))[0].from_json(text)


def load_head(directory: str | os.PathLike, target, dtype: torch.dtype | None = None):
    """Load the head in ``directory`` onto ``target`` (sharing its embedding and LM head), on the
    target's device, in ``dtype`` (default: the target's dtype), in eval mode.
    Raises ValueError if the config does not match the target (hidden size, vocab, layer count,
    aux layer ids out of range) or the weights do not match the config."""
    cfg = load_config(directory)
    _, build, check = specviz_format(cfg.kind)
    check(cfg, target.config)
    return load_weights(build(cfg), Path(directory) / WEIGHTS_NAME, target, dtype)
