"""Verification of drafts (rejection sampling) and the logits processing before it.

rejection_sample: greedy / standard / block / synthetic verification (PyTorch reference, or the
Triton kernels with ``backend="triton"``). logits_to_probs: temperature / top-k / top-p -> float32
probabilities, applied identically to target and draft logits.
"""

from specviz.sampling.processing import logits_to_probs, validate_sampling_params
from specviz.sampling.reference import BACKENDS, rejection_sample
from specviz.sampling.types import (KIND_ACCEPTED, KIND_BONUS, KIND_NAMES, KIND_PAD, KIND_RECOVERED, METHODS,
                                    BlockDetails, RejectionOutput, SamplerNoise, draw_noise)

__all__ = [
    "BACKENDS",
    "KIND_ACCEPTED",
    "KIND_BONUS",
    "KIND_NAMES",
    "KIND_PAD",
    "KIND_RECOVERED",
    "METHODS",
    "BlockDetails",
    "RejectionOutput",
    "SamplerNoise",
    "draw_noise",
    "logits_to_probs",
    "rejection_sample",
    "validate_sampling_params",
]
