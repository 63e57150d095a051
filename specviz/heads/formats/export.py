"""Write a specviz head in the layout the field loads (the inverse of the loaders), so a head trained here runs in the
engines too: each method's formats module writes its own (``write(head, verifier) -> (layout, config.json dict,
tensors, file name)``): EAGLE-1 as SafeAILab's ``cnets1.py``, EAGLE-3 as vllm-project/speculators, Medusa as
FasterDecoding's, DFlash as z-lab's ``DFlashDraftModel``.

Weights are written as safetensors only (never a pickle: the FasterDecoding loaders that expect
``medusa_lm_head.pt`` need their own conversion). What a layout cannot express raises ValueError
instead of writing a file that would run differently: e.g. Medusa ResBlocks that differ within a head
(FasterDecoding repeats one module ``medusa_num_layers`` times), EAGLE-3 per-tap norms with repeated taps,
an EAGLE-1 head whose head_dim is not hidden_size // heads (SafeAILab computes it).
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from specviz import methods

def save_published(head, directory: str | os.PathLike, dtype: torch.dtype = torch.bfloat16,
                   verifier: str | None = None) -> dict:
    """Write ``head`` (attached to its target) to ``directory`` in its method's published layout, floating tensors in
    ``dtype``. ``verifier``: the target's name or path, recorded where the layout has a field for it. Returns
    {"layout", "files"}. Raises ValueError for a method without a published layout or a head the layout cannot
    express exactly."""
    kind = head.config.kind
    spec = methods.get(kind).head if kind in methods.names() else None
    writer = getattr(importlib.import_module(spec.formats), "write", None) if spec is not None and spec.formats else None
    if writer is None:
        raise ValueError(f"a {kind!r} head has no published layout to write (specviz's own format only)")
    layout, config, tensors, name = writer(head, verifier)
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    cast = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous().clone()
            for k, v in tensors.items()}
    save_file(cast, str(path / name), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return {"layout": layout, "files": ["config.json", name]}


def save_published_beside(head, out_dir: str | os.PathLike, name: str, verifier: str | None = None) -> dict:
    """The training recipe's second copy: ``head`` in its published layout at ``out_dir/published/name/``
    (bf16). Returns the log entry {"dir", "layout", "files"}, or {"not_written": why} when the method has no
    published layout or the layout cannot express this head (the specviz-format copy is then the only one)."""
    path = Path(out_dir) / "published" / name
    try:
        return {"dir": str(path), **save_published(head, path, verifier=verifier)}
    except ValueError as exc:
        return {"not_written": str(exc)}


def rope_fields(rope: dict) -> dict:
    """rope_theta (+ rope_scaling for a scaled RoPE), as transformers 4.x configs and the engines read them."""
    out = {"rope_theta": float(rope.get("rope_theta", 10000.0))}
    extra = {k: v for k, v in rope.items() if k not in ("rope_type", "rope_theta")}
    if rope.get("rope_type", "default") != "default":
        out["rope_scaling"] = {"rope_type": rope["rope_type"], "type": rope["rope_type"], **extra}
    return out
