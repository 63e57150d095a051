"""The compile cache file ("mega-cache"): :func:`torch.compiler.save_cache_artifacts` of everything compiled, written
under ``$SPECVIZ_COMPILE_CACHE`` (default ``~/.cache/specviz/torch-compile``; "off" disables it) with a key of the torch
version, the GPU and the models' configs, and read back with :func:`torch.compiler.load_cache_artifacts` before
anything compiles (:mod:`specviz.compile_stage`, :mod:`specviz.precompile`). PyTorch's own cache format, holding
compiled code like Inductor's cache directory: written and read only under the user's own cache directory, never taken
from an upload."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)
CACHE_ENV = "SPECVIZ_COMPILE_CACHE"


def artifact_path(models: list[torch.nn.Module], device: torch.device) -> Path | None:
    """The mega-cache file for these models on this device and torch build, or None when disabled
    (``$SPECVIZ_COMPILE_CACHE`` = "off")."""
    root = os.environ.get(CACHE_ENV, "")
    if root.lower() == "off":
        return None
    root_path = Path(root) if root else Path.home() / ".cache" / "specviz" / "torch-compile"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    parts = [torch.__version__, name, *[(m.config.to_json_string(use_diff=False), str(next(m.parameters()).dtype))
                                        for m in models]]
    key = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return root_path / f"{key}.bin"


def load_artifacts(path: Path | None) -> str:
    """Read a mega-cache file into PyTorch's caches before anything compiles. Returns "loaded", "none" (no file),
    "off" (disabled) or "error: ..." (a bad or foreign file: logged, ignored; compiling then starts cold)."""
    if path is None:
        return "off"
    if not path.is_file():
        return "none"
    try:
        info = torch.compiler.load_cache_artifacts(path.read_bytes())
    except Exception as exc:  # noqa: BLE001 - a stale cache must not stop the load
        log.warning("specviz: compile cache %s not used: %s: %s", path, type(exc).__name__, exc)
        return f"error: {type(exc).__name__}"
    if info is None:  # torch logged why (a corrupt or foreign file)
        return "error: unreadable"
    return "loaded"


def save_artifacts(path: Path | None) -> str:
    """Write the mega-cache of everything compiled in this process to ``path`` (atomically). Returns "saved", "off",
    "none" (nothing to save) or "error: ..."."""
    if path is None:
        return "off"
    try:
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            return "none"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(saved[0])
        tmp.replace(path)
    except Exception as exc:  # noqa: BLE001 - an unwritable cache directory must not fail the warm-up
        log.warning("specviz: compile cache %s not written: %s: %s", path, type(exc).__name__, exc)
        return f"error: {type(exc).__name__}"
    return "saved"
