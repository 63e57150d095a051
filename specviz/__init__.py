"""specviz: run speculative decoding on HF transformers models and see what happened inside.

Public API: :class:`SpecDecoder` (the engine), :class:`Trace` (the recorded run),
:func:`specviz.sampling.rejection_sample` (the sampler), :mod:`specviz.proposers`.
"""

from .engine import METHODS, VERIFY_METHODS, GenerationConfig, SpecDecoder
from .events import EventBus
from .trace import Trace, TraceFormatError

__all__ = ["EventBus", "GenerationConfig", "METHODS", "SpecDecoder", "Trace", "TraceFormatError", "VERIFY_METHODS"]
