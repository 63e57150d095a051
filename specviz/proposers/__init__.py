"""Proposers: every speculative method behind one protocol (:class:`Proposer`)."""

from .base import Draft, NoFeedback, Outcome, Proposer, StepContext
from .draft_model import DraftModelProposer
from .ngram import NgramProposer, resolve_lookup_bounds
from .suffix import GlobalSuffixCache, SuffixConfig, SuffixProposer

__all__ = ["Draft", "DraftModelProposer", "GlobalSuffixCache", "NgramProposer", "NoFeedback", "Outcome", "Proposer",
           "StepContext",
           "SuffixConfig", "SuffixProposer", "resolve_lookup_bounds"]
