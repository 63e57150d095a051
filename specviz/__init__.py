"""specviz: run speculative decoding on HF transformers models and see what happened inside.

Public API: :class:`SpecDecoder` (the engine), :class:`Trace` (the recorded run), :class:`EventBus`,
:mod:`specviz.methods` (the method registry), :func:`specviz.sampling.rejection_sample` (the sampler).
Names are imported on first use, so reading a trace (``specviz.trace``) loads neither torch nor transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"SpecDecoder": "engine", "GenerationConfig": "config", "METHODS": "engine", "VERIFY_METHODS": "config",
            "EventBus": "events", "Trace": "trace", "TraceFormatError": "trace"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specviz' has no attribute {name!r}")
    return getattr(importlib.import_module(f"specviz.{_EXPORTS[name]}"), name)
