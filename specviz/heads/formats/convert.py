"""``specviz convert DIR``: pickled head weights (``.bin`` / ``.pt`` / ``.pth``, as the official SafeAILab
EAGLE heads and the Medusa-1 heads ship) to safetensors beside them.

This is the only place in specviz that reads a pickle, and it does so with
``torch.load(weights_only=True)``: the restricted unpickler that rebuilds tensors and plain containers
and refuses any other object (no code runs). The loaders themselves read safetensors only.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from .detect import PICKLE_SUFFIXES


def convert_dir(directory: str | os.PathLike, overwrite: bool = False) -> list[Path]:
    """Write ``<name>.safetensors`` beside every pickled weight file in ``directory``; returns the files
    written. Each file must hold a flat {name: tensor} state dict. Tensors that share storage
    (Medusa-1 repeats one ResBlock object under several names) are written as separate copies.
    Raises ValueError: no such directory, no pickled weights, safetensors weights there already (the loaders read
    those: a converted copy beside them would hold every tensor twice), an object that is not a state dict (or one the
    restricted unpickler refuses), or a target file that exists (unless ``overwrite``)."""
    path = Path(directory)
    if not path.is_dir():
        raise ValueError(f"{path} is not a directory" if path.exists() else f"{path} does not exist")
    files = sorted(p for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
    if not files:
        raise ValueError(f"no .bin / .pt / .pth weights in {path}")
    shipped = sorted(p.name for p in path.glob("*.safetensors") if p.with_suffix("") not in
                     {f.with_suffix("") for f in files})
    if shipped:
        raise ValueError(f"{path} already holds safetensors weights ({', '.join(shipped[:3])}), which specviz loads "
                         "as they are: nothing to convert")
    written = []
    for f in files:
        out = f.with_suffix(".safetensors")
        if out.exists() and not overwrite:
            raise ValueError(f"{out} exists already (overwrite=True, or --overwrite on the command line, replaces it)")
        try:
            state = torch.load(f, map_location="cpu", weights_only=True)  # tensors and containers only
        except Exception as exc:  # noqa: BLE001 - the restricted unpickler's refusals come as several types
            raise ValueError(f"{f} could not be read as plain tensors (torch.load weights_only=True): {exc}") from None
        if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                  for k, v in state.items()):
            raise ValueError(f"{f} is not a flat {{name: tensor}} state dict")
        save_file({k: v.detach().contiguous().clone() for k, v in state.items()}, str(out),
                  metadata={"format": "pt", "converted_from": f.name})
        written.append(out)
    return written
