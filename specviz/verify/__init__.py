"""Verification after the target's forward: :class:`~specviz.verify.verifier.StepVerifier` (one ``queue`` for chains
and trees), :class:`~specviz.verify.spec.VerifySpec` and the chain and tree units behind them."""

from .spec import SamplingTensors, VerifySpec, graph_key, probs_from_tensors
from .verifier import QueuedStep, StepVerifier, Verified

__all__ = ["QueuedStep", "SamplingTensors", "StepVerifier", "Verified", "VerifySpec", "graph_key",
           "probs_from_tensors"]
