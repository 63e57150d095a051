"""Proposers: every speculative method behind one protocol (:class:`Proposer`)."""

from .base import Draft, Proposer, StepContext
from .draft_model import DraftModelProposer
from .ngram import NgramProposer, resolve_lookup_bounds

__all__ = ["Draft", "DraftModelProposer", "NgramProposer", "Proposer", "StepContext", "resolve_lookup_bounds"]
