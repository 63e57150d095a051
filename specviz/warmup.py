"""Paying a decoder's one-time costs before its first real request, so that no request's timings carry them.

:func:`warm_up` runs a tiny request of method none (allocations, the first call of every module), captures the
pooled target runner's CUDA graphs for every verify width and tree bucket, each registered method's own needs
(``Method.warm_up`` with a :class:`WarmUp`: a draft model's graphs, a head's taps and runner, a kernel's
compilation), and the verifier's graph pair for every :func:`warm_up_specs`; then freezes the heap it built
(``gc.freeze()``: a full collection after torch.compile took 0.25-0.5 s inside a timed request on the H200; vLLM
freezes its start-up heap the same way). Settings outside these still capture on first use, and the engine excludes
that capture from the step's times.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from . import methods
from .config import MAX_SPECULATIVE_TOKENS, VERIFY_METHODS
from .verify import StepVerifier, VerifySpec, graph_key

WARM_UP_GRAPH_HEADROOM = 32  # verifier graph pairs kept beyond the warm-up's (other rates, top-k / top-p on, ...)


@dataclass
class WarmUp:
    """What a method's ``warm_up`` gets: the decoder, a short prompt's ids, the largest k the app reaches
    (``k_max``), ``say`` for progress lines, and ``method_name`` (the method being warmed)."""

    decoder: Any
    prompt: list[int]
    k_max: int
    say: Callable[[str], None]
    method_name: str = ""

    def request(self, method: str, **settings: Any) -> None:
        """One short request (its first calls, its pooled objects' graphs)."""
        self.decoder.generate(self.prompt, method=method, **settings)

    def runner(self, model: torch.nn.Module, widths: Sequence[int], taps: tuple[str, ...] = (),
               trees: bool = False) -> int:
        """Capture the pooled runner of ``model``'s graphs for every forward width in ``widths`` with ``taps`` (one
        graph per (width, taps)) and, with ``trees``, one tree forward per tree-size bucket; returns the number
        captured (0 for a runner without graphs)."""
        dec = self.decoder
        with dec.pool.lease(id(model), lambda: dec.make_runner(model)) as runner:
            try:
                return _capture_widths(runner, self.prompt, widths, taps, trees, model, self.say)
            finally:
                runner.reset()

    def head_method(self, name: str, trees: bool) -> int:
        """A request of method ``name``, then the target's forwards with the feature taps its proposer declared."""
        self.request(name, num_speculative_tokens=2, max_new_tokens=4)
        taps = tuple(getattr(self.decoder.current_proposer, "taps", ()))
        return self.runner(self.decoder.target_model, range(1, self.k_max + 2), taps=taps, trees=trees)


def _capture_widths(runner, prompt: list[int], widths: Sequence[int], taps: tuple[str, ...], trees: bool,
                    model: torch.nn.Module, say: Callable[[str], None]) -> int:
    if not getattr(runner, "cuda_graphs", False):
        return 0
    runner.reset()
    runner.forward(torch.tensor(prompt, dtype=torch.long))  # eager prefill: graphs need a filled cache
    base = runner.seq_len
    for n in widths:
        runner.forward_features(torch.tensor(prompt[-1:] * n, dtype=torch.long), taps)
        runner.truncate(base)
    buckets = tuple(getattr(runner, "tree_buckets", None) or ()) if trees else ()
    for b in buckets:  # tree forwards: one graph per size bucket (b rows = the root + b - 1 nodes)
        if base + b <= getattr(runner, "max_cache_len", 0):
            runner.forward_features(torch.tensor(prompt[-1:] * b, dtype=torch.long), taps, parents=[-1] * (b - 1))
            runner.truncate(base)
    say(f"warm-up: {len(widths) + len(buckets)} forward graphs of {type(model).__name__}")
    return len(widths) + len(buckets)


def warm_up_specs(vocab: int, max_speculative_tokens: int, verify_methods: Sequence[str] = VERIFY_METHODS,
                  temperatures: Sequence[float] = (0.8, 1.0),
                  synthetic_rates: tuple[float, ...] = (0.8, 0.6, 0.4, 0.3, 0.2),
                  backend: str = "triton") -> list[VerifySpec]:
    """The verifier specs a request can reach with k <= ``max_speculative_tokens``: every k' in 0..max, each verify
    method, one-hot q (ngram, suffix, greedy draft) and, when sampling, full q (a sampled draft); greedy at
    temperature 0 only, the others at 0 and at ``temperatures`` (top-k / top-p off). Detailed records (the app's)."""
    from .sampling.reference import METHODS as CAPTURED  # what the verifier's graphs run (typical: eager only)

    specs = []
    for verify in verify_methods:
        if verify not in CAPTURED:
            continue
        for temp in (0.0,) if verify == "greedy" else (0.0, *temperatures):
            for full_q in (False,) if temp == 0 else (False, True):
                for k in range(max_speculative_tokens + 1):
                    if verify == "synthetic" and k > len(synthetic_rates):
                        break  # more drafts than rates: the request is refused before verification
                    specs.append(VerifySpec(k=k, vocab=vocab, verify=verify, temperature=float(temp), top_k=None,
                                            top_p=None, full_q=full_q and k > 0, detailed=True,
                                            synthetic_rates=synthetic_rates if verify == "synthetic" else None,
                                            backend=backend))
    return list(dict.fromkeys(specs))


def warm_up(decoder: Any, max_speculative_tokens: int = MAX_SPECULATIVE_TOKENS,
            verify_methods: Sequence[str] = VERIFY_METHODS, temperatures: Sequence[float] = (0.8, 1.0),
            synthetic_rates: Sequence[float] = (0.8, 0.6, 0.4, 0.3, 0.2),
            progress: Callable[[str], None] | None = None) -> dict[str, float]:
    """See the module docstring; :meth:`specviz.engine.SpecDecoder.warm_up` calls it under the device lock.

    Returns {"seconds": wall time, "capture_s": time spent capturing graphs, "graphs": graphs captured}."""
    t0, c0 = time.perf_counter(), decoder.pooled_capture_s()
    say = progress or (lambda line: None)
    prompt = decoder.encode("def f(x):\n    return")
    k_max = min(int(max_speculative_tokens), MAX_SPECULATIVE_TOKENS)
    warm = WarmUp(decoder, prompt, k_max, say)
    say("warm-up: first requests")
    warm.request("none", max_new_tokens=3)
    captured = warm.runner(decoder.target_model, range(1, k_max + 2), trees=True)
    for method in methods.all_methods():
        if method.warm_up is not None and method.missing(decoder) is None:
            warm.method_name = method.name
            captured += method.warm_up(warm)
    with decoder.pool.lease("verifier", lambda: StepVerifier(decoder.device)) as verifier:
        if verifier.cuda_graphs:
            specs = warm_up_specs(decoder.vocab_size, k_max, verify_methods, temperatures, tuple(synthetic_rates))
            # room for every captured pair plus requests' own: without it the least recently used warm-up captures
            # were dropped again
            planned = len({graph_key(spec) for spec in specs})
            verifier.max_graphs = max(getattr(verifier, "max_graphs", 0), planned + WARM_UP_GRAPH_HEADROOM)
            generator = torch.Generator(device=decoder.device).manual_seed(0)
            for n, spec in enumerate(specs, 1):
                _warm_verifier(verifier, spec, generator, decoder.device)
                say(f"warm-up: verifier graphs {n}/{len(specs)}")
            captured += len(specs)
    gc.collect()
    gc.freeze()
    say("warm-up: done")
    return {"seconds": time.perf_counter() - t0, "capture_s": decoder.pooled_capture_s() - c0,
            "graphs": float(captured)}


def _warm_verifier(verifier: StepVerifier, spec: VerifySpec, generator: torch.Generator, device: torch.device) -> None:
    """One verification of random inputs with ``spec`` (captures its graphs on first use)."""
    logits = torch.randn(spec.k + 1, spec.vocab, device=device)  # [k'+1, V]
    q = torch.softmax(torch.randn(spec.k, spec.vocab, device=device), -1) if spec.full_q else None
    x = torch.randint(spec.vocab, (spec.k,), device=device)  # [k']
    _, _, _, detail = verifier.run(spec, logits, q, x, generator)
    if detail is not None:
        detail.result()
