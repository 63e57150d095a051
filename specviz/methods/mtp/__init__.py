"""Method mtp: a multi-token-prediction head whose draft steps all run at one constant position and read the target's
own cached keys and values: Gemma 4's published MTP assistant on a Gemma 4 target (``formats``: transformers'
``gemma4_assistant`` layout), or specviz's own Gemma-4-style head (trained by specviz: no public recipe)."""

from __future__ import annotations

from specviz.methods.base import HeadSpec, Method, Texts


def _make(build):
    from .proposer import MtpDraftGraphs, MtpProposer

    head = build.decoder.heads["mtp"]
    graphs = build.lease(("mtp", id(head)), MtpDraftGraphs)
    return MtpProposer(head, build.config.num_speculative_tokens, graphs=graphs)


METHOD = Method(
    "mtp", "Gemma 4's MTP assistant, or a Gemma-4-style head trained by specviz: queries over the target's KV",
    make=_make,
    texts=Texts("the MTP head",
                "An MTP head (Gemma 4's published assistant, or specviz's own Gemma-4-style head): every draft step "
                "runs at the same position and reads the target's own cached keys and values; the table lists what "
                "each step read, the token it drafted and its confidence.",
                "method mtp (an MTP head: every draft step reads the target's own keys and values at one constant "
                "position)",
                confidence="head softmax"),
    style=("#2ca02c", "cross"),
    head=HeadSpec("a Gemma-4-style MTP head", bundled="specviz-mtp", trainer=f"{__name__}.train:train_mtp",
                  module=f"{__name__}.head", formats=f"{__name__}.formats"),
    warm_up=lambda warm: warm.head_method("mtp", trees=False), view="specviz.methods.mtp.view")
