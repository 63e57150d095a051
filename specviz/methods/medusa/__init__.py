"""Method medusa: Medusa heads on the target's final hidden state (Cai et al. 2024; FasterDecoding/Medusa). Head i
guesses the token i + 1 after the root, so a chain drafts min(k, heads) tokens; a static tree ranks each head's
candidates (``speculative_token_tree``)."""

from __future__ import annotations

from specviz.methods.base import HeadSpec, Method, Texts


# the held-out evaluation's static tree: wide, not deep (results/train/heads-s6/medusa_trees_cpu_fp32.json)
DEFAULT_TREE = "[(0,), (1,), (2,), (3,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"


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
                  module=f"{__name__}.head", formats=f"{__name__}.formats", eval_tree=DEFAULT_TREE),
    warm_up=lambda warm: warm.head_method("medusa", trees=True), view="specviz.methods.medusa.view")
