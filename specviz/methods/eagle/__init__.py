"""Method eagle: an EAGLE-1 head drafts from the target's own final hidden state (Li et al. 2024, arXiv 2401.15077),
as a chain, an EAGLE-2 dynamic tree (arXiv 2406.16858) or a static tree. Method eagle3 is built on it."""

from __future__ import annotations

from specviz.methods.base import HeadSpec, Method, Texts

HOW = ("The head is a small network that reads the target's own hidden states: the table lists, per draft token, the "
       "row that predicted it (the target's feature at the last committed position with the root token for draft 1, "
       "the head's own output with the previous draft after that), the head's confidence and what the target did; "
       "the plot compares acceptance by position with the head's confidence.")


def head_runner(decoder, head):
    """A runner for ``head`` (specviz/methods/eagle/runner.py): static cache + CUDA graphs when the target runs on the
    static runner (its ``max_cache_len`` slots; compiled when the target's runner is), else the eager reference."""
    from specviz.methods.eagle.runner import make_head_runner

    opts = decoder.runner_options
    max_len = opts["max_cache_len"] if opts["static"] else None
    return make_head_runner(head, max_len, **{k: opts[k] for k in ("compile", "compile_backend") if k in opts})


def make_eagle(build):
    """A chain, EAGLE-2 or static-tree proposer for the request's method (eagle or eagle3), on a pooled head runner."""
    from .proposer import EagleProposer
    from .tree import EagleTreeProposer

    dec, cfg = build.decoder, build.config
    head = dec.heads[cfg.method]
    runner = build.lease(("head", id(head)), lambda: head_runner(dec, head))  # returned exactly once, also on error
    tree = cfg.tree
    if tree is None:
        return EagleProposer(head, cfg.num_speculative_tokens, runner=runner)
    if tree.form == "dynamic":
        return EagleTreeProposer(head, dynamic=tree.dynamic, runner=runner)
    return EagleTreeProposer(head, choices=list(tree.paths), runner=runner)


def warm_up_eagle(warm) -> int:
    """The target's forwards with the head's taps (chains and static trees), the head runner's own graphs, and the
    default EAGLE-2 tree's draft graphs."""
    from specviz.tree import DEFAULT_DEPTH, DEFAULT_TOP_K, DEFAULT_TOTAL_TOKENS

    name = warm.method_name
    head = warm.decoder.heads[name]
    captured = warm.head_method(name, trees=True)
    with warm.unit(), warm.decoder.pool.lease(("head", id(head)), lambda: head_runner(warm.decoder, head)) as runner:
        captured += runner.warm_up(warm.k_max + 1)
    warm.request(name, num_speculative_tokens=DEFAULT_DEPTH + 1, max_new_tokens=24, eagle_tree_top_k=DEFAULT_TOP_K,
                 eagle_tree_depth=DEFAULT_DEPTH, eagle_tree_total_tokens=DEFAULT_TOTAL_TOKENS)
    return captured


def describe_head(head) -> dict:
    return {"aux_layer_ids": list(getattr(head.config, "aux_layer_ids", ()))}


def eagle_method(name: str, summary: str, source: str, lesson: str, style: tuple[str, str], what: str,
                 trainer: str) -> Method:
    """A method of the EAGLE family: the proposers, trees, warm-up, formats and views of this folder, with its own
    head (``what``, bundled as assets/models/specviz-NAME, trained by ``train:TRAINER``)."""
    return Method(
        name, summary, make=make_eagle, texts=Texts(source, HOW, lesson, confidence="head softmax"), style=style,
        tree_forms=("static", "dynamic"),
        head=HeadSpec(what, bundled=f"specviz-{name}", describe=describe_head, trainer=f"{__name__}.train:{trainer}",
                      module=f"{__name__}.head", formats=f"{__name__}.formats"),
        warm_up=warm_up_eagle, view=f"{__name__}.view")


METHOD = eagle_method("eagle", "EAGLE-1 head on the target's final hidden state", "the EAGLE head",
                      "method eagle (EAGLE: a small head drafts from the target's own final hidden state)",
                      ("#d62728", "triangle-down"), "an EAGLE head", "train_eagle")
