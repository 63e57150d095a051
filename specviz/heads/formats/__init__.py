"""Heads in the layouts the field publishes, recognised from their files and normalised once at load.

:func:`load_head_dir` is the one entry (``SpecDecoder.from_pretrained(target, heads={method: DIR})``,
the CLI's ``--<method>-head DIR``): it reads config.json and the safetensors headers, names the layout
(:func:`~specviz.heads.formats.detect.detect`: by tensor names and config fields, never by
``architectures``), and builds specviz's own head module from it (tap ids in specviz's convention, norm
flags read with each source's default, EAGLE-3's draft vocabulary as target ids), so every proposer
sees one head shape. ``head.source`` records the layout for the trace and the views.

Weights are read from safetensors only. A directory with only ``.bin`` / ``.pt`` files gets an error
that says to run ``specviz convert DIR`` (:mod:`specviz.heads.formats.convert`, the only place that
reads a pickle, with ``torch.load(weights_only=True)``).
"""

from __future__ import annotations

import os

import torch

import importlib

from specviz import methods

from .detect import Checkpoint, detect, kind_of, layouts, read_checkpoint

__all__ = ["load_head_dir", "detect", "read_checkpoint", "Checkpoint", "layouts", "kind_of", "layout_of"]


def layout_of(directory: str | os.PathLike) -> str:
    """The layout name of the head in ``directory`` (see :func:`layouts`). Raises ValueError as
    :func:`~specviz.heads.formats.detect.detect`."""
    return detect(read_checkpoint(directory))


def load_head_dir(directory: str | os.PathLike, target, kind: str | None = None, dtype: torch.dtype | None = None):
    """Load the head in ``directory`` onto ``target`` (sharing its embedding and LM head), on the target's
    device, in ``dtype`` (default the target's), eval mode; ``head.source`` = {"format": layout, ...}.

    kind: the method the head is for (a registered method with a head); a head of another kind raises. Raises
    ValueError: unknown layout (naming what was found and the known layouts), only pickled weights (run ``specviz
    convert DIR``), inconsistent files, or a head that does not fit the target."""
    ckpt = read_checkpoint(directory)
    layout = detect(ckpt)
    if layout in layouts()[:2]:  # specviz's own formats: the method's own loader, by the kind asked for or written
        head = _load_own(ckpt, layout, target, dtype, kind)
    else:
        owner = kind_of(layout)
        if kind is not None and owner != kind:
            raise ValueError(f"{directory} holds the head of method {owner!r} ({layout} layout), not of {kind!r}")
        try:
            head = importlib.import_module(methods.get(owner).head.formats).load(ckpt, layout, target, dtype)
        except ValueError as exc:
            if ckpt.config or (ckpt.directory / "config.json").exists():
                raise
            raise ValueError(f"{exc} (there is no config.json in {directory}: the {layout} sizes it does not give "
                             "were taken from the target's config; put the head's own config.json beside its weights)"
                             ) from exc
    if kind is not None and head.config.kind != kind:
        raise ValueError(f"the head in {directory} is an {head.config.kind!r} head ({layout} layout), not {kind!r}")
    return head


def _load_own(ckpt: Checkpoint, layout: str, target, dtype, kind: str | None):
    """specviz's own formats, through the method's head module (``load_own``) or the shared specviz-head-v1 loader
    (:func:`specviz.heads.io.load_head`); their own errors say when the file is of another format."""
    from ..io import load_head

    name = kind if kind is not None else ckpt.config.get("kind")
    spec = methods.get(name).head if isinstance(name, str) and name in methods.names() else None
    own = getattr(importlib.import_module(spec.module), "load_own", None) if spec is not None and spec.module else None
    head = own(ckpt.directory, target, dtype) if own is not None else load_head(ckpt.directory, target, dtype)
    head.source = {"format": layout, "source": "specviz", "path": str(ckpt.directory)}
    return head
