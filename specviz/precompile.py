"""Inductor's compiles paid in a child process, so that the app's runs do not wait for them.

The compile stage (:mod:`specviz.compile_stage`) recaptures each served graph compiled inside a warm-up unit, and a
run that arrives waits for the unit in progress. From empty caches one graph's torch.compile (Dynamo, AOTAutograd,
Inductor's code generation, Triton's kernel builds) is CPU work of up to tens of seconds. :func:`start` moves that work
out: ``python -m specviz.precompile`` (its spec as JSON on stdin) loads its own copy of the decoder's models (the same
sources, dtype, device and static cache length), captures the same graphs compiled in the same order, and prints one
line per graph. It shares the parent's on-disk Inductor / Triton caches (the same environment), so the parent's own
recompile of a graph, once the child has compiled it, is meant to hit them: the unit a run may wait for shrinks to a
Dynamo trace, cache loads and a CUDA-graph capture (measured on an H100 with the bundled models: still 3-16 s or more
for the first graph of each compiled forward, the others well under a second; ``results/gpu/``). The child then writes
the mega-cache file (:func:`specviz.compile_artifacts.save_artifacts`).

Used only when the GPU has room for a second copy of the models (:func:`room_for_child`); otherwise, and whenever the
child fails, the parent compiles in-process as before. The child caps Inductor's compile workers at the host's cores
minus two (its own threads are not capped). Every child is killed at the app's normal exit; after a kill of the app it
stops at its next graph, once it sees its parent gone.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import torch

log = logging.getLogger(__name__)
PREFIX = "PRECOMPILED "
LIVE: list = []  # the running Child objects started here (stop_all; an ended child removes itself)
HEADROOM = 1.5  # free GPU memory needed: this times the models' weights (the child's cache and workspace besides)


def graph_key(key: tuple) -> list:
    """A runner's graph key as JSON: (n, taps) -> [n, [taps]]; ("tree", n, taps) -> ["tree", n, [taps]]."""
    return ["tree", int(key[1]), list(key[2])] if key[0] == "tree" else [int(key[0]), list(key[1])]


def key_of(item: Sequence) -> tuple:
    """The inverse of :func:`graph_key`."""
    return ("tree", int(item[1]), tuple(item[2])) if item[0] == "tree" else (int(item[0]), tuple(item[1]))


def room_for_child(models: Sequence[torch.nn.Module], device: torch.device) -> bool:
    """Whether ``device`` has free memory for another copy of ``models`` (CUDA only)."""
    if device.type != "cuda":
        return False
    weights = sum(p.numel() * p.element_size() for m in models for p in m.parameters())
    free, _ = torch.cuda.mem_get_info(device)
    return free > HEADROOM * weights + (1 << 30)


def spec_of(decoder: Any, work: Sequence[tuple[Any, tuple]], prompt: Sequence[int], artifacts: Path | None) -> dict:
    """What the child needs: the models' sources and dtype, the device, the static cache length, the warm-up prompt's
    ids and the graphs ({"role": "target" | "draft", "key": :func:`graph_key`}) in ``work``'s order, each once."""
    graphs: list[dict] = []
    for runner, key in work:
        item = {"role": role_of(decoder, runner), "key": graph_key(key)}
        if item not in graphs:
            graphs.append(item)
    names = decoder.names
    return {"target": names["target"], "draft": names.get("draft", ""), "dtype": names["dtype"],
            "device": str(decoder.device), "max_cache_len": int(decoder.runner_options["max_cache_len"]),
            "prompt": [int(t) for t in prompt], "graphs": graphs, "artifacts": str(artifacts) if artifacts else "",
            "parent": os.getpid()}


class Child:
    """A running ``python -m specviz.precompile``: :meth:`wait_for` blocks until it has compiled a graph."""

    def __init__(self, spec: dict, env: dict | None = None, command: Sequence[str] | None = None):
        self.done: dict[tuple[str, tuple], bool] = {}
        self.artifacts = ""
        self.error = ""
        self._cond = threading.Condition()
        self._ended = False
        env = dict(os.environ if env is None else env)
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(max(1, (os.cpu_count() or 2) - 2)))
        self.proc = subprocess.Popen(list(command or [sys.executable, "-m", "specviz.precompile"]),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env)
        self.proc.stdin.write(json.dumps(spec))
        self.proc.stdin.close()
        self._stderr: list[str] = []
        self._drained = threading.Thread(target=self._drain, daemon=True)
        self._drained.start()
        threading.Thread(target=self._read, daemon=True).start()
        LIVE.append(self)

    def _read(self) -> None:
        for line in self.proc.stdout:
            if not line.startswith(PREFIX):
                continue
            row = json.loads(line[len(PREFIX):])
            with self._cond:
                if "artifacts" in row:
                    self.artifacts = row["artifacts"]
                else:
                    self.done[(row["role"], key_of(row["key"]))] = bool(row["ok"])
                self._cond.notify_all()
        code = self.proc.wait()
        if self in LIVE:
            LIVE.remove(self)
        self._drained.join(5.0)  # the last stderr lines say why it failed
        with self._cond:
            self._ended = True
            if code:
                self.error = f"exit {code}: " + " | ".join(self._stderr[-3:])
            self._cond.notify_all()

    def _drain(self) -> None:
        for line in self.proc.stderr:  # kept short: the last lines say why a child failed
            self._stderr = (self._stderr + [line.strip()[:300]])[-20:]

    def wait_for(self, role: str, key: tuple, timeout: float | None = None) -> bool:
        """Block until the child has compiled (``role``, ``key``) or has ended; True if it compiled it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while (role, key) not in self.done and not self._ended:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return self.done.get((role, key), False)

    def reported(self, role: str, key: tuple) -> bool:
        """Whether the child has said anything about (``role``, ``key``): compiled it, or failed it."""
        with self._cond:
            return (role, key) in self.done

    @property
    def stuck(self) -> bool:
        """Still running after a :meth:`wait_for` that timed out (not ended, not failed)."""
        with self._cond:
            return not self._ended

    def finish(self, timeout: float = 60.0) -> str:
        """Wait for the child to end (it writes the mega-cache last); kill it after ``timeout`` s. Returns the
        artifacts' fate as the child said it ("saved", "none", "off", "error: ...") or "" if it said nothing."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        with self._cond:
            self._cond.wait_for(lambda: self._ended, 5.0)
            return self.artifacts

    def stop(self) -> None:
        """Kill the child (the parent is shutting down or gave up on it)."""
        if self.proc.poll() is None:
            self.proc.kill()


def stop_all() -> None:
    """Kill every compiling process this process started: at exit, and before an exit that skips atexit
    (``os._exit``)."""
    for child in list(LIVE):
        child.stop()


atexit.register(stop_all)  # an app that exits takes its compiling processes with it


def role_of(decoder: Any, runner: Any) -> str:
    """Which of the decoder's models a pooled runner runs: "target" or "draft"."""
    return "target" if getattr(runner, "model", None) is decoder.target_model else "draft"


def start(decoder: Any, work: Sequence[tuple[Any, tuple]], prompt: Sequence[int]) -> Child | None:
    """A child compiling ``work``'s graphs (then writing the mega-cache file of these models), or None when there is
    nothing to compile, no CUDA device, no room on it for the child's models, or the child cannot start (logged)."""
    from .compile_artifacts import artifact_path

    models = [m for m in (decoder.target_model, decoder.draft_model) if m is not None]
    device = getattr(decoder, "device", torch.device("cpu"))
    if not work or not room_for_child(models, device):
        return None
    try:
        return Child(spec_of(decoder, work, prompt, artifact_path(models, device)))
    except Exception as exc:  # noqa: BLE001 - no child (no model sources to reload, no process): compile in-process
        log.warning("specviz: compiling in a child process did not start (%s: %s); compiling in-process",
                    type(exc).__name__, exc)
        return None


def _compile_graphs(spec: dict, backend: str = "inductor") -> None:
    """The child: load the models, capture each graph of ``spec`` compiled, one line per graph on stdout."""
    from .compile_artifacts import save_artifacts
    from .compiled_graphs import capture_key
    from .models import load_model
    from .static_runner import StaticRunner

    device, dtype = torch.device(spec["device"]), getattr(torch, spec["dtype"])
    roles = {g["role"] for g in spec["graphs"]}
    runners = {role: StaticRunner(load_model(spec[role], device, dtype), spec["max_cache_len"], compile=True,
                                  compile_backend=backend) for role in sorted(roles)}
    for g in spec["graphs"]:
        if os.getppid() != spec.get("parent", os.getppid()):
            return  # the app is gone: stop compiling for nobody
        runner, key = runners[g["role"]], key_of(g["key"])
        t0 = time.perf_counter()
        try:
            capture_key(runner, spec["prompt"], key)
            ok = key in runner.compiled_keys() if runner.cuda_graphs else runner.compiled
        except Exception as exc:  # noqa: BLE001 - the parent compiles this graph itself
            print(f"{type(exc).__name__}: {exc}"[:300], file=sys.stderr, flush=True)
            ok = False
        finally:
            runner.reset()
        row = {"role": g["role"], "key": g["key"], "ok": bool(ok), "s": round(time.perf_counter() - t0, 3)}
        print(PREFIX + json.dumps(row), flush=True)
    fate = save_artifacts(Path(spec["artifacts"])) if spec.get("artifacts") else "off"
    print(PREFIX + json.dumps({"artifacts": fate}), flush=True)


def main() -> None:
    """``python -m specviz.precompile`` reads its spec (:func:`spec_of`) as JSON on stdin."""
    spec = json.loads(sys.stdin.read())
    _compile_graphs(spec, backend=spec.get("backend", "inductor"))


if __name__ == "__main__":
    main()
