"""Method medusa: Medusa heads on the target's final hidden state (Cai et al. 2024; FasterDecoding/Medusa). Head i
guesses the token i + 1 after the root, so a chain drafts min(k, heads) tokens; a static tree ranks each head's
candidates (``speculative_token_tree``)."""

from __future__ import annotations

from specviz.methods.base import HeadSpec, Method, Texts


# 31 nodes (32 rows with the root: the static runner's 32 bucket) chosen from the bundled heads' measured
# acceptance by scripts/medusa_tree.py (Medusa section 3.3.2, on standard-library text); wide, not deep: head 0's
# top 1 is right 24 % of the time, its ranks 1-7 still add up (results/train/heads-v4/README.md)
DEFAULT_TREE = ("[(0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,), (0, 0), (0, 1), (0, 2), (0, 3), (0, 4), "
                "(0, 5), (0, 6), (0, 7), (1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (2, 0), (2, 1), (2, 2), "
                "(3, 0), (4, 0), (5, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0)]")


def _make(build):
    from .proposer import MedusaProposer

    cfg = build.config
    tree = list(cfg.tree.paths) if cfg.tree is not None else None
    return MedusaProposer(build.decoder.heads["medusa"], cfg.num_speculative_tokens, tree=tree)


METHOD = Method(
    "medusa", "Medusa heads on the target's final hidden state (a chain of min(k, heads) drafts, or a static tree)",
    make=_make,
    texts=Texts("the Medusa heads",
                "Every head reads the same target feature and head i guesses the token i + 1 after the root, so a "
                "chain drafts min(k, number of heads) tokens. The table and the heatmap show each head's top "
                "candidates, the drafted ones outlined in the colour of the target's decision.",
                "method medusa (Medusa heads: head i predicts the token i + 1 after the root from one target feature)",
                confidence="head softmax"),
    style=("#e377c2", "star"), tree_forms=("static",),
    head=HeadSpec("a Medusa head", bundled="specviz-medusa", trainer=f"{__name__}.train:train_medusa",
                  module=f"{__name__}.head", formats=f"{__name__}.formats", eval_tree=DEFAULT_TREE,
                  max_drafts=lambda head: (int(head.config.num_heads), "one token per Medusa head")),
    warm_up=lambda warm: warm.head_method("medusa", trees=True), view="specviz.methods.medusa.view")
