"""Method draft_model: a small causal LM with the target's tokenizer drafts k tokens one after another (Leviathan et
al. 2023; vLLM ``v1/spec_decode/draft_model.py``), or a static tree of its ranked candidates."""

from __future__ import annotations

from specviz.methods.base import Method, Texts


def _make(build):
    from .proposer import DraftModelProposer

    dec, cfg = build.decoder, build.config
    runner = build.lease(id(dec.draft_model), lambda: dec.make_runner(dec.draft_model))
    tree = list(cfg.tree.paths) if cfg.tree is not None else None
    return DraftModelProposer(runner, cfg.num_speculative_tokens, vocab_size=dec.vocab_size, tree=tree)


def _warm_up(warm) -> int:
    """A first request (allocations, the first call of every module), then the drafter's 1- and 2-token graphs."""
    warm.request("draft_model", num_speculative_tokens=2, max_new_tokens=4)
    return warm.runner(warm.decoder.draft_model, (1, 2))


METHOD = Method(
    "draft_model", "a small draft model drafts token by token", make=_make,
    texts=Texts("the draft model",
                "A small causal LM drafts k tokens one after another. For each drafted position the panel lists the "
                "draft's own top candidates and q, the token it drafted (its argmax at temperature 0, else a sample "
                "from q) and the target's p of that token.",
                "method draft_model (a small language model drafts token by token)",
                confidence="draft model softmax"),
    style=("#9467bd", "triangle-up"), tree_forms=("static",), needs_draft=True, warm_up=_warm_up,
    view="specviz.methods.draft_model.view")
