"""Paying a decoder's one-time costs before its first real request, so that no request's timings carry them.

:func:`warm_up` runs a tiny request of method none (allocations, the first call of every module), captures the
pooled target runner's CUDA graphs for every verify width and tree bucket, each registered method's own needs
(``Method.warm_up`` with a :class:`WarmUp`: a draft model's graphs, a head's taps and runner, a kernel's
compilation), and the verifier's graph pair for every :func:`warm_up_specs`; then freezes the heap it built
(``gc.freeze()``: a full collection after torch.compile took 0.25-0.5 s inside a timed request on the H200; vLLM
freezes its start-up heap the same way). Settings outside these still capture on first use, and the engine excludes
that capture from the step's times.

The work comes in short units (one request, one graph, one verifier pair). Given a :class:`Gate`, :func:`warm_up`
runs on a background thread beside the app's requests: each unit waits until no request is in flight, and a request
that arrives waits for at most the unit in progress, so the app accepts a run as soon as its models are loaded and
the warm-up uses the time between runs (what a run needs before its graphs are captured it captures itself, outside
its timings).
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from . import methods
from .compiled_graphs import capture_shape
from .compile_stage import artifact_path, compile_stage, load_artifacts, save_artifacts, start_compiling
from .config import MAX_SPECULATIVE_TOKENS, VERIFY_METHODS
from .pools import device_lock
from .verify import StepVerifier, VerifySpec, graph_key

WARM_UP_GRAPH_HEADROOM = 32  # verifier graph pairs kept beyond the warm-up's (other rates, top-k / top-p on, ...)


class Gate:
    """Orders a background warm-up's units after the app's requests (one instance per decoder).

    ``with gate.request():`` around a request's use of the decoder; ``with gate.unit():`` around one unit of warm-up
    work. A unit starts only while no request is in flight (and holds the device lock of ``device``, if set, so no
    other thread's CUDA work runs during a capture); a request waits only for the unit in progress. Units nest in
    their own thread. With no request ever registered (a warm-up in the foreground) a unit never waits.
    """

    def __init__(self, device: torch.device | None = None):
        self.device = device
        self._cond = threading.Condition()
        self._requests = 0
        self._owner: int | None = None  # the thread running a unit
        self._depth = 0

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        with self._cond:
            self._requests += 1  # registered first: no new unit starts while this one waits
            while self._owner is not None and self._owner != threading.get_ident():
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._requests -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def unit(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._owner != me:
                while self._requests > 0 or self._owner is not None:
                    self._cond.wait()
                self._owner = me
            self._depth += 1
        try:
            with device_lock(self.device) if self.device is not None else contextlib.nullcontext():
                yield
        finally:
            with self._cond:
                self._depth -= 1
                if self._depth == 0:
                    self._owner = None
                    self._cond.notify_all()

    @property
    def busy(self) -> bool:
        """Whether a request is in flight now."""
        with self._cond:
            return self._requests > 0


@dataclass
class WarmUp:
    """What a method's ``warm_up`` gets: the decoder, a short prompt's ids, the largest k the app reaches
    (``k_max``), ``say`` for progress lines, and ``method_name`` (the method being warmed). Work a method does
    outside :meth:`request` and :meth:`runner` goes inside ``with warm.unit():``."""

    decoder: Any
    prompt: list[int]
    k_max: int
    say: Callable[[str], None]
    method_name: str = ""
    gate: Gate = field(default_factory=Gate)

    def unit(self) -> contextlib.AbstractContextManager[None]:
        """One unit of warm-up work (see :class:`Gate`)."""
        return self.gate.unit()

    def request(self, method: str, **settings: Any) -> None:
        """One short request (its first calls, its pooled objects' graphs), as one unit."""
        with self.unit():
            self.decoder.generate(self.prompt, method=method, **settings)

    def runner(self, model: torch.nn.Module, widths: Sequence[int], taps: tuple[str, ...] = (),
               trees: bool = False) -> int:
        """Capture the pooled runner of ``model``'s graphs for every forward width in ``widths`` with ``taps`` (one
        graph per (width, taps)) and, with ``trees``, one tree forward per tree-size bucket, one graph per unit;
        returns the number captured (0 for a runner without graphs)."""
        dec = self.decoder
        with self.unit(), dec.pool.lease(id(model), lambda: dec.make_runner(model)) as runner:
            if not getattr(runner, "cuda_graphs", False):
                return 0
            buckets = tuple(getattr(runner, "tree_buckets", None) or ()) if trees else ()
            room = getattr(runner, "max_cache_len", 0) - len(self.prompt)
        shapes = [(n, False) for n in widths] + [(b, True) for b in buckets if b <= room]
        for n, tree in shapes:
            with self.unit(), dec.pool.lease(id(model), lambda: dec.make_runner(model)) as runner:
                try:
                    capture_shape(runner, self.prompt, n, taps, tree)
                finally:
                    runner.reset()
        self.say(f"warm-up: {len(shapes)} forward graphs of {type(model).__name__}")
        return len(shapes)

    def head_method(self, name: str, trees: bool) -> int:
        """A request of method ``name``, then the target's forwards with the feature taps its proposer declared."""
        self.request(name, num_speculative_tokens=2, max_new_tokens=4)
        taps = tuple(getattr(self.decoder.current_proposer, "taps", ()))
        return self.runner(self.decoder.target_model, range(1, self.k_max + 2), taps=taps, trees=trees)


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
            progress: Callable[[str], None] | None = None, gate: Gate | None = None,
            method_names: Sequence[str] | None = None, compile: bool | None = None) -> dict[str, float]:
    """See the module docstring. ``method_names``: warm only these methods' drafters (None: every method whose
    models are loaded); the target's widths and the verifiers are warmed either way. ``compile``: False skips the
    compile stage; otherwise it runs when ``decoder.compile_status.mode`` is "auto" (:mod:`specviz.compile_stage`): with
    a compile cache read
    back it runs right after the target's graphs (cache hits), else last; the cache is written after it. In the
    foreground (``gate`` None) the caller holds the device lock throughout (:meth:`specviz.engine.SpecDecoder.warm_up`);
    with ``gate`` each unit waits for the requests registered with it
    and takes the device lock itself (:class:`specviz.ui.cache.DecoderCache` runs it so on a background thread).

    Returns {"seconds": wall time, "capture_s": time spent capturing graphs, "graphs": graphs captured, "compiled":
    graphs that run compiled after the compile stage (0 without one)}."""
    t0, c0 = time.perf_counter(), decoder.pooled_capture_s()
    status = decoder.compile_status
    compiling = status.mode == "auto" and compile is not False
    cache = artifact_path([m for m in (decoder.target_model, decoder.draft_model) if m is not None], decoder.device) \
        if status.mode != "off" and decoder.device.type == "cuda" else None
    say = progress or (lambda line: None)
    prompt = decoder.encode("def f(x):\n    return")
    k_max = min(int(max_speculative_tokens), MAX_SPECULATIVE_TOKENS)
    warm = WarmUp(decoder, prompt, k_max, say, gate=gate or Gate())
    if cache is not None and status.artifacts == "none":
        with warm.unit():  # before this warm-up compiles anything, and beside no request that might
            status.artifacts = load_artifacts(cache)
    say("warm-up: first requests")
    warm.request("none", max_new_tokens=3)
    early = compiling and status.artifacts == "loaded"  # cache hits: capture the target's graphs compiled at once
    if early:
        start_compiling(warm)
    captured = warm.runner(decoder.target_model, range(1, k_max + 2), trees=True)
    recompiled = compile_stage(warm) if early else 0
    for method in methods.all_methods():
        wanted = method_names is None or method.name in method_names
        if wanted and method.warm_up is not None and method.missing(decoder) is None:
            warm.method_name = method.name
            say(f"warm-up: method {method.name}")
            captured += method.warm_up(warm)
    captured += _warm_verifiers(warm, warm_up_specs(decoder.vocab_size, k_max, verify_methods, temperatures,
                                                    tuple(synthetic_rates)))
    if compiling:
        recompiled += compile_stage(warm)
    if cache is not None and (status.done or status.mode == "on") and status.artifacts != "loaded" \
            and not status.artifacts.endswith("compiling process"):
        with warm.unit():  # a file read back is kept as it is (what it lacks is in Inductor's on-disk caches)
            status.artifacts = save_artifacts(cache)
    with warm.unit():
        gc.collect()
        gc.freeze()
    say("warm-up: done")
    return {"seconds": time.perf_counter() - t0, "capture_s": decoder.pooled_capture_s() - c0,
            "graphs": float(captured), "compiled": float(status.done if compiling else recompiled)}


def _warm_verifiers(warm: WarmUp, specs: list[VerifySpec]) -> int:
    """The verifier's graph pair for every spec, one spec per unit; 0 for a verifier without graphs."""
    dec = warm.decoder
    make = lambda: StepVerifier(dec.device)  # noqa: E731
    with warm.unit(), dec.pool.lease("verifier", make) as verifier:
        if not verifier.cuda_graphs:
            return 0
        # room for every captured pair plus requests' own: without it the least recently used warm-up captures
        # were dropped again
        planned = len({graph_key(spec) for spec in specs})
        verifier.max_graphs = max(getattr(verifier, "max_graphs", 0), planned + WARM_UP_GRAPH_HEADROOM)
    generator = torch.Generator(device=dec.device).manual_seed(0)
    for n, spec in enumerate(specs, 1):
        with warm.unit(), dec.pool.lease("verifier", make) as verifier:
            _warm_verifier(verifier, spec, generator, dec.device)
        warm.say(f"warm-up: verifier graphs {n}/{len(specs)}")
    return len(specs)


def _warm_verifier(verifier: StepVerifier, spec: VerifySpec, generator: torch.Generator, device: torch.device) -> None:
    """One verification of random inputs with ``spec`` (captures its graphs on first use)."""
    logits = torch.randn(spec.k + 1, spec.vocab, device=device)  # [k'+1, V]
    q = torch.softmax(torch.randn(spec.k, spec.vocab, device=device), -1) if spec.full_q else None
    x = torch.randint(spec.vocab, (spec.k,), device=device)  # [k']
    _, _, _, detail = verifier.run(spec, logits, q, x, generator)
    if detail is not None:
        detail.result()
