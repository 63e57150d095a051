"""Method ngram: prompt lookup (vLLM ``v1/spec_decode/ngram_proposer.py``; Saxena 2023). Drafts are copied from
earlier text after an occurrence of the context's last n tokens; no model runs."""

from __future__ import annotations

from specviz.methods.base import Method, Texts

from .options import LOOKUP_DETAILS, LookupOptions

LOOKUP_HOW = (
    "Prompt lookup needs no model: it takes the last n tokens of the context (purple), finds their earlier "
    "occurrences (yellow; the earliest one is used, outlined) and copies the tokens that followed it (blue, "
    "underlined) as the draft. It tries n from prompt_lookup_max down to prompt_lookup_min and uses the longest n that "
    "matches. The tree shows every continuation after all occurrences with how many occurrences continue that way; "
    "the blue path is the drafted continuation. Repetitive text (code, quoted passages) gives long matches and long "
    "accepted runs.")


def _make(build):
    from .proposer import NgramProposer

    cfg = build.config
    tree = cfg.tree
    return NgramProposer(cfg.options.prompt_lookup_min, cfg.options.prompt_lookup_max, cfg.num_speculative_tokens,
                         tree_branches=tree.branches if tree is not None else None)


METHOD = Method(
    "ngram", "prompt lookup: drafts copied from earlier text (no model)", make=_make,
    texts=Texts("n-gram lookup (prompt lookup)", LOOKUP_HOW,
                "method ngram (prompt lookup: drafts are copied from earlier text, no model)",
                confidence="share of matches"),
    style=("#1f77b4", "circle"), options=LookupOptions, tree_forms=("branches",),
    describe=lambda cfg: cfg.options.resolved(), details_schema=LOOKUP_DETAILS, view="specviz.methods.ngram.view")
