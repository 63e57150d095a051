"""Method ngram_gpu: prompt lookup on the device (vLLM's GPU n-gram proposer): the same drafts as ngram, matched by
a Triton kernel on CUDA (the PyTorch reference elsewhere); the draft length k' is read on the host, so the target
verifies k' + 1 rows."""

from __future__ import annotations

from specviz.methods.base import Method, Texts
from specviz.methods.ngram import LOOKUP_HOW
from specviz.methods.ngram.options import LOOKUP_DETAILS, LookupOptions

# Padding the draft to k keeps k' on the device (no host wait) but verifies k + 1 rows on every step, also on the
# many steps without a match; at batch 1 the wider forward costs more than the one small read of k'
# (benchmarks/bench_ngram_gpu.py prints both beside ngram). True restores the padded, wait-free step.
PAD_ON_CUDA = False


def _make(build):
    from .proposer import NgramGPUProposer

    cfg, device = build.config, build.decoder.device
    cuda = device.type == "cuda"
    return NgramGPUProposer(cfg.options.prompt_lookup_min, cfg.options.prompt_lookup_max, cfg.num_speculative_tokens,
                            backend="triton" if cuda else "reference", device=device,
                            pad=cuda and PAD_ON_CUDA)


def _warm_up(warm) -> int:
    """The matcher kernel compiles on its first call (CUDA only)."""
    if warm.decoder.device.type != "cuda":
        return 0
    from .proposer import NgramGPUProposer

    with warm.unit():
        NgramGPUProposer(2, 4, warm.k_max, backend="triton", device=warm.decoder.device).propose(warm.prompt * 3,
                                                                                               warm.k_max)
    return 0


METHOD = Method(
    "ngram_gpu", "prompt lookup on the device (Triton matcher on CUDA)", make=_make,
    texts=Texts("n-gram lookup on the device (ngram_gpu)", LOOKUP_HOW,
                "method ngram_gpu (prompt lookup on the device: the same drafts as ngram)",
                confidence="share of matches"),
    style=("#17becf", "square"), options=LookupOptions, describe=lambda cfg: cfg.options.resolved(),
    warm_up=_warm_up, details_schema=LOOKUP_DETAILS, view="specviz.methods.ngram_gpu.view")
