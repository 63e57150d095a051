"""Triton kernels of specviz (GPU side of the rejection sampler and the n-gram matcher).

Modules (import them explicitly; each imports triton when it is imported):

* :mod:`specviz.kernels.rejection_sampler` - batched greedy / standard / block / synthetic verification,
  held equal to :mod:`specviz.sampling.reference`.
* :mod:`specviz.kernels.ngram_matcher` - batched prompt-lookup n-gram matcher, held equal to its
  reference ``ngram_match_reference``.
* :mod:`specviz.kernels.compile_check` - compiles every kernel for sm_90 on a CPU machine.

This file imports nothing, so ``import specviz.sampling`` never pulls in triton.
"""
