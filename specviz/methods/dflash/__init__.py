"""Method dflash: a DFlash block drafter (z-lab, arXiv 2602.06036): one non-causal forward over [root, MASK, ...,
MASK] with the target's fused features drafts up to block size - 1 tokens."""

from __future__ import annotations

from specviz.methods.base import HeadSpec, Method, Texts


def _make(build):
    """On the static runner the drafter's pooled static runner (a CUDA graph on CUDA); else the eager one."""
    from .proposer import DFlashProposer

    dec = build.decoder
    head = dec.heads["dflash"]
    runner = None
    if dec.runner_options["static"]:
        from specviz.methods.dflash.runner import StaticDFlashRunner

        runner = build.lease(("dflash", id(head)), lambda: StaticDFlashRunner(head))
    return DFlashProposer(head, build.config.num_speculative_tokens, runner=runner)




def _describe(head) -> dict:
    c = head.config
    return {"aux_layer_ids": [], "target_layer_ids": list(c.target_layer_ids), "block_size": c.block_size,
            "num_layers": c.num_layers, "mask_token_id": c.mask_token_id}


METHOD = Method(
    "dflash", "DFlash block drafter: one forward drafts B-1 tokens from fused target features", make=_make,
    texts=Texts("the DFlash block",
                "DFlash drafts a whole block in one forward (at most block size − 1 tokens): the cards show the root "
                "token and each MASK slot of the block (the token it predicts for its own position, its confidence), "
                "coloured by what the target then did with it; slots past k were computed but not handed to the "
                "target.",
                "method dflash (a block drafter: one forward over [root, MASK, ..., MASK] drafts the whole block)",
                confidence="drafter softmax"),
    style=("#bcbd22", "hexagon"),
    head=HeadSpec("a DFlash block drafter", bundled="specviz-dflash", describe=_describe,
                  trainer=f"{__name__}.train:train_dflash", module=f"{__name__}.head", formats=f"{__name__}.formats",
                  eval_k=7,  # block size - 1 drafts: its held-out acceptance run's k
                  max_drafts=lambda head: (head.config.block_size - 1,
                                           f"one block of B = {head.config.block_size} drafts B - 1")),
    warm_up=lambda warm: warm.head_method("dflash", trees=False), view="specviz.methods.dflash.view")
