"""Triton kernels of specviz (GPU side of the rejection sampler and the n-gram matcher).

Modules (import them explicitly; each imports triton when it is imported):

* :mod:`kernels.rejection_sampler` - batched greedy / standard / block / synthetic verification,
  held equal to :mod:`specviz.sampling.reference`.
* :mod:`kernels.ngram_matcher` - batched prompt-lookup n-gram matcher, held equal to
  :func:`specviz.proposers.ngram_gpu.ngram_match_reference`.

This file must stay import-free and must not define ``__version__``: a top-level ``kernels``
package shadows the PyPI package of the same name, which transformers probes for
(``transformers.utils.is_kernels_available``) by importing it and reading its version. With no
version it reports "not available" and leaves us alone (tests/test_transformers_import.py).
"""
