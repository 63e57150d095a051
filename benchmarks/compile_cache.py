"""What compiling the static runner costs per launch, and what PyTorch's caches save (CUDA; bundled target, bf16).

Each phase runs in a new process with its own Inductor / Triton cache directories:

* ``cold``: empty caches. ``StaticRunner(compile=True)`` compiles and captures every chain width 1..K+1 and every
  tree bucket (plain and with the EAGLE-3 taps), one graph at a time; then ``torch.compiler.save_cache_artifacts()``
  writes the "mega-cache" to a file;
* ``warm``: the same directories (a second launch on the same machine: on-disk FX-graph, AOTAutograd and Triton
  caches);
* ``artifacts``: empty directories, ``torch.compiler.load_cache_artifacts()`` of the cold phase's file first (what
  shipping the artifacts for a model would give a fresh machine);
* ``background``: empty caches; a thread compiles a second runner (no CUDA graphs: compile + eager runs only) while
  the main thread replays the uncompiled width-1 graph of another runner; prints the replays' latency before and
  during the compile and whether every replay's logits stayed equal (a check of compiling beside served requests).

Every phase also times a width-1 forward (what method none runs per token) of a second runner instance made after
the first one's compile (dynamo re-traces per instance; Inductor's cache should hit), and the compiled against the
uncompiled replay. Prints one JSON line per phase and a summary table; ``--out`` writes them as JSON.

    python3 benchmarks/compile_cache.py --out $OUT/compile_cache.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _timed_forwards(runner, prompt, n_iter: int = 200) -> float:
    """Median ms of one width-1 forward (graph replay + logits copy) after a prefill of ``prompt``."""
    import torch

    runner.reset()
    runner.forward(torch.tensor(prompt))
    base = runner.seq_len
    tok = torch.tensor(prompt[-1:])
    times = []
    for _ in range(n_iter):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        runner.forward(tok)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        runner.truncate(base)
    return statistics.median(times)


def child(phase: str, k_max: int, artifacts: str) -> dict:
    import torch

    from specviz import SpecDecoder
    from specviz.static_runner import StaticRunner
    from specviz.compiled_graphs import capture_shape as _capture

    t_start = time.perf_counter()
    out: dict = {"phase": phase, "torch": torch.__version__, "device": torch.cuda.get_device_name()}
    if phase == "artifacts":
        t0 = time.perf_counter()
        info = torch.compiler.load_cache_artifacts(Path(artifacts).read_bytes())
        out["load_artifacts_s"] = round(time.perf_counter() - t0, 3)
        out["loaded"] = str(info)[:300] if info is not None else None
    dec = SpecDecoder.from_pretrained(device="cuda")
    model = dec.target_model
    prompt = dec.encode("def f(x):\n    return")
    out["load_s"] = round(time.perf_counter() - t_start, 2)
    eager = StaticRunner(model, 512, compile=False)
    if phase == "background":
        return _background(out, eager, StaticRunner(model, 512, compile=True, cuda_graphs=False), prompt, k_max)
    if phase in ("swap", "swap_warm"):
        return _swap(out, eager, prompt, k_max)
    shapes = [(n, tree, taps) for taps in ((), ("eagle3",)) for tree in (False, True)
              for n in ((8, 16, 32, 65) if tree else range(1, k_max + 2))]
    graphs = []
    for label, runner in (("first", StaticRunner(model, 512, compile=True)),
                          ("second", StaticRunner(model, 512, compile=True))):
        t_all = time.perf_counter()
        per = []
        for n, tree, taps in shapes:
            t0 = time.perf_counter()
            try:
                _capture(runner, prompt, n, _taps(runner, taps), tree)
            except Exception as exc:  # noqa: BLE001 - a probe reports what failed and goes on
                per.append({"n": n, "tree": tree, "taps": bool(taps), "error": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            per.append({"n": n, "tree": tree, "taps": bool(taps), "s": round(time.perf_counter() - t0, 3)})
            _progress(f"{label} runner", per[-1])
            runner.reset()
        graphs.append({"runner": label, "total_s": round(time.perf_counter() - t_all, 2), "compiled": runner.compiled,
                       "per_graph": per})
    out["graphs"] = graphs
    _capture(eager, prompt, 1, (), False)
    out["width1_ms"] = {"uncompiled": round(_timed_forwards(eager, prompt), 4),
                        "compiled": round(_timed_forwards(runner, prompt), 4)}
    if phase == "cold":
        t0 = time.perf_counter()
        saved = torch.compiler.save_cache_artifacts()
        out["save_artifacts_s"] = round(time.perf_counter() - t0, 3)
        if saved is not None:
            blob, info = saved
            Path(artifacts).write_bytes(blob)
            out["artifacts_bytes"] = len(blob)
            out["artifacts_info"] = str(info)[:300]
    out["phase_s"] = round(time.perf_counter() - t_start, 2)
    return out


def _progress(what: str, row: dict) -> None:
    """One graph done, on stderr at once: a phase cut off by its timeout still shows what each graph cost."""
    print(f"PROGRESS {what} {json.dumps(row)}", file=sys.stderr, flush=True)


def _taps(runner, names: tuple[str, ...]) -> tuple[str, ...]:
    """EAGLE-3's three tap names for this target (low, mid, high layers) when asked, else ()."""
    if not names:
        return ()
    n = runner.model.config.num_hidden_layers
    return tuple(dict.fromkeys(("layer_output:0", f"layer_output:{max(n // 2 - 1, 0)}", "final_norm")))


def _swap(out: dict, runner, prompt, k_max: int) -> dict:
    """Uncompiled graphs captured, then each recompiled in place (what the warm-up's compile stage does)."""
    import torch

    from specviz.compiled_graphs import capture_shape as _capture

    for n in range(1, k_max + 2):
        _capture(runner, prompt, n, (), False)
    for b in (8, 16, 32, 65):
        _capture(runner, prompt, b, (), True)
    runner.reset()
    runner.forward(torch.tensor(prompt))
    before = {n: runner.forward(torch.tensor(prompt[-1:] * n)).clone() for n in (1, 3)}
    runner.reset()
    per = []
    for key in runner.uncompiled_keys():
        t0 = time.perf_counter()
        ok = runner.recompile(key, prompt)
        per.append({"key": str(key), "ok": ok, "s": round(time.perf_counter() - t0, 3)})
        _progress("recompiled", per[-1])
    runner.reset()
    runner.forward(torch.tensor(prompt))
    diffs = {}
    for n in (1, 3):
        after = runner.forward(torch.tensor(prompt[-1:] * n))
        diffs[n] = {"max_abs_logit_diff": float((after - before[n]).abs().max()),
                    "argmax_equal": bool(torch.equal(after.argmax(-1), before[n].argmax(-1)))}
        runner.truncate(len(prompt))
    out.update({"recompiled": per, "total_s": round(sum(p["s"] for p in per), 2), "after_vs_before": diffs,
                "uncompiled_left": [str(k) for k in runner.uncompiled_keys()], "replays": runner.replays})
    return out


def _background(out: dict, eager, compiled, prompt, k_max: int) -> dict:
    """Replays of ``eager``'s width-1 graph in this thread while another compiles ``compiled`` (no graphs)."""
    import torch

    from specviz.compiled_graphs import capture_shape as _capture

    _capture(eager, prompt, 1, (), False)
    eager.reset()
    eager.forward(torch.tensor(prompt))
    base = eager.seq_len
    tok = torch.tensor(prompt[-1:])
    ref = eager.forward(tok).clone()
    eager.truncate(base)
    lat: dict[str, list[float]] = {"before": [], "during": [], "after": []}
    state = {"phase": "before", "error": None, "compile_s": None, "unequal": 0}

    def compile_it() -> None:
        t0 = time.perf_counter()
        try:
            compiled.reset()
            compiled.forward(torch.tensor(prompt))
            for n in range(1, k_max + 2):
                compiled.forward(torch.tensor(prompt[-1:] * n))
                compiled.truncate(len(prompt))
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            state["error"] = f"{type(exc).__name__}: {exc}"[:400]
        state["compile_s"] = round(time.perf_counter() - t0, 2)
        state["phase"] = "after"

    end = None
    thread = threading.Thread(target=compile_it)
    t_begin = time.perf_counter()
    while True:
        if state["phase"] == "before" and time.perf_counter() - t_begin > 1.0:
            state["phase"] = "during"
            thread.start()
        if state["phase"] == "after" and end is None:
            end = time.perf_counter() + 1.0
        if end is not None and time.perf_counter() > end:
            break
        phase = state["phase"]
        t0 = time.perf_counter()
        logits = eager.forward(tok)
        torch.cuda.synchronize()
        lat[phase].append((time.perf_counter() - t0) * 1e3)
        state["unequal"] += int(not torch.equal(logits, ref))
        eager.truncate(base)
    thread.join()

    def summary(xs: list[float]) -> dict:
        xs = sorted(xs)
        return {"n": len(xs), "median_ms": round(statistics.median(xs), 4) if xs else None,
                "p99_ms": round(xs[int(0.99 * (len(xs) - 1))], 4) if xs else None,
                "max_ms": round(xs[-1], 2) if xs else None}

    out.update({"compile_s": state["compile_s"], "compile_error": state["error"], "unequal_replays": state["unequal"],
                "replays": {k: summary(v) for k, v in lat.items()}, "compiled_still": compiled.compiled})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phases", default="cold,warm,artifacts,background")
    ap.add_argument("--k-max", type=int, default=5)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per phase")
    ap.add_argument("--out", default=None)
    ap.add_argument("--work", default=None, help="cache directories and the artifacts file (default: a new temp dir)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--artifacts", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a.child, a.k_max, a.artifacts)), flush=True)
        return
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="specviz-compile-"))
    work.mkdir(parents=True, exist_ok=True)
    blob = work / "artifacts.bin"
    results = []
    for phase in a.phases.split(","):
        # swap then swap_warm: each graph's recompile from empty, then from the on-disk caches the first one filled
        cache = work / ("disk" if phase in ("cold", "warm", "swap", "swap_warm") else phase)
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"))
        t0 = time.perf_counter()
        try:
            # the child's stderr (its PROGRESS lines, one per graph) goes straight to ours: seen as it happens, kept
            # in the log whatever timeout ends the call
            proc = subprocess.run([sys.executable, __file__, "--child", phase, "--k-max", str(a.k_max), "--artifacts",
                                   str(blob)], env=env, stdout=subprocess.PIPE, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            results.append({"phase": phase, "error": f"timed out after {a.timeout} s (its PROGRESS lines are above)"})
            print(json.dumps(results[-1]), flush=True)
            continue
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        res = json.loads(lines[-1][7:]) if lines else {"phase": phase, "error": f"exit {proc.returncode}, no result "
                                                                                 "(its stderr is above)"}
        res["process_s"] = round(time.perf_counter() - t0, 2)
        results.append(res)
        print(json.dumps(res), flush=True)
        if a.out:  # after every phase: a call cut short keeps what it measured
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(results, indent=1))
    for r in results:
        tot = " / ".join(f"{g['runner']} {g['total_s']} s" for g in r.get("graphs", []))
        print(f"{r['phase']:>10}: process {r.get('process_s')} s, load {r.get('load_s')} s, graphs {tot}, "
              f"width-1 {r.get('width1_ms')}, artifacts {r.get('artifacts_bytes', r.get('load_artifacts_s'))}")


if __name__ == "__main__":
    main()
