"""Compiled behind served graphs on CUDA, meant to be paid once per machine: the compile stage and the caches.

A decoder loaded with ``compile="background"`` (and with the default ``compile=None`` when :data:`BACKGROUND_DEFAULT`
is on) on CUDA starts with uncompiled CUDA graphs, so it serves at once. Its warm-up then recaptures the target's and
the draft model's graphs through torch.compile (inductor), one graph per warm-up unit
(:meth:`specviz.compiled_graphs.CompiledGraphs.recompile`): in the app each unit runs between requests
(:class:`specviz.warmup.Gate`), so a run waits for at most the graph being compiled and its timings never include a
compile. Once the stage has started, a runner made later (another concurrent session's) and a shape captured for the
first time compile inside their request (kept out of its timings like any capture, but the run waits). Each trace's
config says which graphs it replayed (``runner_compiled``). EAGLE heads' runners stay uncompiled unless
``compile=True``. Where the GPU has room, Inductor's compiles run first in a child process
(:mod:`specviz.precompile`) and each unit recompiles from the caches it filled.

Compiling is meant to be paid once per machine: Inductor's on-disk caches (FX graphs, AOTAutograd, Triton kernels)
persist between launches, and after the stage :func:`torch.compiler.save_cache_artifacts` ("mega-cache") is written to
``$SPECVIZ_COMPILE_CACHE`` (default ``~/.cache/specviz/torch-compile``; "off" disables it) under a key of the torch
version, the GPU and the models' configs; the next load reads it back with :func:`torch.compiler.load_cache_artifacts`
before anything compiles, and its warm-up compiles the target's graphs first (expected to hit the caches; not yet
measured) instead of last. The file is PyTorch's own cache format, holding compiled code like Inductor's cache
directory: it is written and read only under the user's own cache directory, never taken from an upload.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

from . import precompile
from .compile_artifacts import CACHE_ENV, artifact_path, load_artifacts, save_artifacts  # noqa: F401 (re-exported)
from .compiled_graphs import CompiledGraphs

log = logging.getLogger(__name__)
CHILD_GRAPH_TIMEOUT_S = 900.0  # a child stuck this long on one graph: the parent compiles that graph itself
PRECOMPILE_ENV = "SPECVIZ_PRECOMPILE"  # "off": compile in-process only (no child process, :mod:`specviz.precompile`)
# whether compile=None means "background" on CUDA: off, as the first graph of each compiled forward holds its swap
# for 3-16 s or more, which a run that arrives waits for (results/gpu), though compiled graphs decode about 1.6x faster
BACKGROUND_DEFAULT = False
COMPILE_CHOICES = (True, False, None, "background")


@dataclass
class CompileStatus:
    """What compile does for a decoder. ``mode``: "on" (``compile=True``: compiled from the start), "off"
    (``compile=False``, or no CUDA graphs: the CPU), "auto" (the warm-up's compile stage). ``state``: "pending"
    (auto, before the stage), "compiling", "done", "failed" (no graph compiled), "off". ``done`` / ``total``: graphs
    recompiled / to recompile; ``seconds``: the stage's wall time; ``artifacts``: the cache file's fate ("loaded",
    "saved", "saved by the compiling process", "none", "off", or an error); ``where``: where Inductor compiles
    ("in-process", or "in a child process": :mod:`specviz.precompile`)."""

    mode: str = "off"
    state: str = "off"
    done: int = 0
    total: int = 0
    failed: int = 0
    seconds: float = 0.0
    artifacts: str = "none"
    where: str = "in-process"

    @property
    def active(self) -> bool:
        """Whether new runners should compile their captures (the stage has started)."""
        return self.state in ("compiling", "done")

    def line(self) -> str:
        """One line for the status bar and the speedup panel's note."""
        if self.state == "compiling":
            return (f"compiling the forwards {self.where}: {self.done}/{self.total} graphs "
                    "(runs replay the uncompiled graphs until their compiled ones are in)")
        if self.state == "pending":
            return "torch.compile: after the warm-up (runs replay uncompiled graphs until then)"
        if self.state == "done":
            return f"torch.compile: {self.done} graphs compiled in {self.seconds:.0f} s (cache: {self.artifacts})"
        return f"torch.compile: {self.state}"


def initial_status(compile: bool | str | None, device: torch.device, static: bool) -> CompileStatus:
    """The status a decoder starts with: ``compile`` True -> "on"; "background" (or None with
    :data:`BACKGROUND_DEFAULT`) on CUDA with the static runner -> "auto" (pending); anything else "off".
    Raises ValueError for a value outside :data:`COMPILE_CHOICES`."""
    runner_compile(compile)  # validates
    if compile is True:  # the eager runner (the CPU's default) has nothing to compile
        return CompileStatus(mode="on", state="done") if static else CompileStatus()
    background = compile == "background" or (compile is None and BACKGROUND_DEFAULT)
    if background and device.type == "cuda" and static:
        return CompileStatus(mode="auto", state="pending")
    return CompileStatus()


def runner_compile(compile: bool | str | None) -> bool | None:
    """What the static runners get for ``compile``: "background" starts them uncompiled (the stage compiles them).
    Raises ValueError for a value outside :data:`COMPILE_CHOICES`."""
    if compile not in COMPILE_CHOICES:
        raise ValueError(f"compile must be True, False, None or 'background', got {compile!r}")
    return None if compile == "background" else compile


def compiled_runners(decoder: Any) -> list[CompiledGraphs]:
    """The pooled runners of the target and the draft model that can be recompiled (free ones: call inside a unit)."""
    models = [m for m in (decoder.target_model, decoder.draft_model) if m is not None]
    return [r for m in models for r in decoder.pool.free(id(m)) if isinstance(r, CompiledGraphs) and r.cuda_graphs]


def start_compiling(warm: Any) -> None:
    """Switch compile on for the pooled target and draft runners and for runners made from now on, without
    recompiling anything yet: their next captures compile (the warm-up calls it before the target's graphs when a
    compile cache was read back, so those graphs are captured compiled once instead of twice)."""
    status: CompileStatus = warm.decoder.compile_status
    if status.mode != "auto":
        return
    with warm.unit():
        _enable(warm.decoder)


def _enable(decoder: Any) -> list[CompiledGraphs]:
    """Compile on for the pooled runners (call inside a unit); the stage is "compiling" from now on. Returns the
    runners on which it is on (a runner whose compile failed before stays off)."""
    decoder.compile_status.state = "compiling"
    return [r for r in compiled_runners(decoder) if r.enable_compile()]


def compile_stage(warm: Any) -> int:
    """Recompile every uncompiled graph of the decoder's pooled target and draft runners, one graph per unit of
    ``warm`` (:class:`specviz.warmup.WarmUp`), progress in ``decoder.compile_status`` (``done``: graphs that run
    compiled, ``failed``: graphs left uncompiled) and ``warm.say``. Runners made later compile their own captures
    (:meth:`specviz.engine.SpecDecoder.make_runner`). Returns graphs recompiled. Run it again after more graphs were
    captured (a method's runners): it picks up what is left."""
    status: CompileStatus = warm.decoder.compile_status
    if status.mode != "auto":
        return 0
    t0 = time.perf_counter() - status.seconds
    with warm.unit():
        work = [(r, key) for r in _enable(warm.decoder) for key in r.uncompiled_keys()]
        status.total = _compiled_count(warm.decoder) + len(work)
    child = _child(warm, work)
    recompiled = 0
    for runner, key in work:
        if child is not None:  # waited outside any unit: runs go on meanwhile
            role = precompile.role_of(warm.decoder, runner)
            # False: compiled here after all; only a child still silent on this graph after the timeout is stopped
            if not child.wait_for(role, key, timeout=CHILD_GRAPH_TIMEOUT_S) and not child.reported(role, key) \
                    and child.stuck:
                log.warning("specviz: the compiling process spent %.0f s on one graph; compiling in-process "
                            "instead", CHILD_GRAPH_TIMEOUT_S)
                child.stop()
                child = None
                status.where = "in-process"
        with warm.unit():  # the counts read the pooled runners: no request may hold one meanwhile
            status.done = _compiled_count(warm.decoder)
            warm.say(f"warm-up: {status.line()}")
            try:
                recompiled += int(runner.recompile(key, warm.prompt))
            except Exception as exc:  # noqa: BLE001 - one graph's failure (its old graph stays) must not end the stage
                model = type(getattr(runner, "model", runner)).__name__
                log.warning("specviz: compiling graph %s of %s failed: %s: %s", key, model, type(exc).__name__, exc)
    with warm.unit():
        status.done = _compiled_count(warm.decoder)
        status.failed = sum(len(r.uncompiled_keys()) for r in compiled_runners(warm.decoder))
    if child is not None:
        fate = child.finish()
        status.artifacts = f"{fate} by the compiling process" if fate == "saved" else status.artifacts
        if child.error:
            log.warning("specviz: the compiling process failed (%s); its graphs compiled in-process", child.error)
            status.where = "in-process"
    status.seconds = time.perf_counter() - t0
    status.state = "done" if status.done or not status.failed else "failed"
    return recompiled


def _child(warm: Any, work: list) -> Any:
    """A child process that compiles ``work``'s graphs first (:mod:`specviz.precompile`), or None: off
    (``$SPECVIZ_PRECOMPILE`` = "off"), nothing to compile, caches read back (their hits are quick in-process), or no
    room on the GPU for the child's copy of the models."""
    dec = warm.decoder
    if os.environ.get(PRECOMPILE_ENV, "").lower() == "off" or dec.compile_status.artifacts == "loaded":
        return None
    child = precompile.start(dec, work, warm.prompt)
    if child is not None:
        dec.compile_status.where = "in a child process"
    return child


def _compiled_count(decoder: Any) -> int:
    return sum(len(r.compiled_keys()) for r in compiled_runners(decoder))
