"""Method suffix: suffix decoding (Oliaro et al. 2024; Arctic Inference; vLLM ``v1/spec_decode/suffix_decoding.py``).
Drafts follow suffix trees of this request and of earlier requests' outputs (the request state: one tree per browser
session in the app, an empty one for every comparison run, the decoder's own through the Python API)."""

from __future__ import annotations

from specviz.methods.base import Method, Texts


CANDIDATE = {"source": str, "match_length": int, "node_count": int, "draft": [int], "probs": [float], "counts": [int],
             "score": float}
DETAILS = {"candidates": [CANDIDATE], "chosen": (CANDIDATE, None), "cached_requests": int,
           "config": {str: (float, bool, str, None)}}


def _new_cache():
    from .proposer import GlobalSuffixCache

    return GlobalSuffixCache()


def _make(build):
    from .proposer import SuffixProposer

    cfg = build.config
    cache = build.state if build.state is not None else build.decoder.request_state("suffix")
    proposer = SuffixProposer(cfg.num_speculative_tokens, global_cache=cache,
                              tree_branches=cfg.tree.branches if cfg.tree is not None else None)
    build.on_finish(proposer.finish)  # this output joins the tree of earlier outputs
    return proposer


def _state_note(cache) -> str:
    n = len(cache) if cache is not None else 0
    return (f"Method suffix drafts from this request and from this session's earlier outputs: the tree holds **{n}** "
            f"earlier output{'s' if n != 1 else ''} (other browser sessions have their own).")


METHOD = Method(
    "suffix", "suffix decoding: suffix trees of this request and of earlier outputs", make=_make,
    texts=Texts("the suffix tree (suffix decoding)",
                "Suffix decoding keeps a suffix tree of this request and of this session's earlier outputs; the panel "
                "shows its candidate matches, and the longest-scoring continuation becomes the draft.",
                "method suffix (suffix decoding: drafts follow a suffix tree of this request and of earlier outputs)",
                confidence="share of matches"),
    style=("#ff7f0e", "diamond"), tree_forms=("branches",), request_state=_new_cache, state_note=_state_note,
    view="specviz.methods.suffix.view", details_schema=DETAILS)
