"""Where an EAGLE tree step's host time goes on the GPU, beside the chain's: the engine's own per-phase
times (draft, verify forward, sampler and record; medians over a warm request's steps), the garbage collector's
collections and time during the timed requests, and (``--cprofile``) one request under cProfile: the functions with
the most host time per step (their own time, and the cumulative time of the engine's phases). cProfile slows Python
calls (roughly 1.5-2x), so its figures rank the host's work, they do not time it; the wall times above them are
measured without it. Optionally a torch.profiler table of one request (``--profile``). Prints text only.

    python scripts/profile_tree_step.py [--device cuda] [--max-new 96] [--compile] [--cprofile 25]
        [--settings "eagle3 chain k=5,eagle3 tree 4x5x24"]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# cumulative host time per step of these functions (the engine's phases and the tree's own work)
# (queue: StepVerifier's, a chain's queue_chain or a tree's queue_tree under it; result: the step's wait, a tree's
# finish and walk under it)
PHASES = ("propose", "forward_features", "queue", "queue_chain", "queue_tree", "result", "finish", "commit", "observe",
          "tree_record", "add_texts", "publish", "truncate", "_step")


def _cprofile(dec, prompt: str, kw: dict, max_new: int, detailed: bool, top: int) -> None:
    prof = cProfile.Profile()
    prof.enable()
    tr = dec.generate(prompt, max_new_tokens=max_new, detailed_trace=detailed, **kw)
    prof.disable()
    n = len(tr.steps)
    stats = pstats.Stats(prof).stats  # {(file, line, name): (cc, nc, tottime, cumtime, callers)}

    def where(key):
        file, line, name = key
        short = file.split("/site-packages/")[-1].replace(str(ROOT) + "/", "")
        return f"{short}:{line}({name})" if file != "~" else name

    total = sum(v[2] for v in stats.values())
    print(f"  cProfile: {total / n * 1e3:.2f} ms of host time per step under the profiler ({n} steps); own time per step:")
    for key, v in sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]:
        print(f"    {v[2] / n * 1e6:8.0f} us  {v[1] / n:6.1f} calls  {where(key)}")
    cum = {}
    for key, v in stats.items():
        if key[2] in PHASES and "specviz" in key[0]:
            cum[key[2]] = max(cum.get(key[2], 0.0), v[3])
    print("  cumulative per step: " + "  ".join(f"{k} {cum[k] / n * 1e3:.2f}" for k in PHASES if k in cum) + " ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--compile", action="store_true", help="the static runners with compile=True")
    ap.add_argument("--settings", default="eagle3 chain k=5,eagle3 tree 4x5x24,eagle3 tree 4x3x12,draft_model static tree",
                    help="comma-separated names of benchmarks/host_ops.py SETTINGS")
    ap.add_argument("--repeats", type=int, default=3, help="timed requests per setting (median)")
    ap.add_argument("--cprofile", type=int, default=0, help="also one request under cProfile: this many functions")
    ap.add_argument("--profile", action="store_true", help="also a torch.profiler table per setting")
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench_e2e import DEMO_PROMPT, GcTimer
    from host_ops import SETTINGS
    from specviz import SpecDecoder

    dec = SpecDecoder.from_pretrained(device=a.device, runner="static", compile=a.compile or None)
    print(f"device {a.device}, compile {a.compile}, {a.max_new} tokens, median of {a.repeats} requests", flush=True)
    for name in [s.strip() for s in a.settings.split(",") if s.strip()]:
        kw = SETTINGS[name]
        for detailed in (True, False):
            t0 = time.perf_counter()
            for _ in range(2):
                dec.generate(DEMO_PROMPT, max_new_tokens=a.max_new, detailed_trace=detailed, **kw)
            warm_s = time.perf_counter() - t0
            walls, traces = [], []
            with GcTimer() as gct:
                for _ in range(a.repeats):
                    if a.device == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    tr = dec.generate(DEMO_PROMPT, max_new_tokens=a.max_new, detailed_trace=detailed, **kw)
                    walls.append((time.perf_counter() - t0) / len(tr.steps) * 1e3)
                    traces.append(tr)
            wall = statistics.median(walls)
            tr = traces[walls.index(wall)]
            ph = {k: statistics.median(s.timings_ms.get(k, 0.0) for s in tr.steps[1:]) for k in ("draft", "verify", "sample")}
            print(f"{name:26s} trace={'on ' if detailed else 'off'} wall {wall:6.2f} ms/step  "
                  + "  ".join(f"{k} {v:5.2f}" for k, v in ph.items())
                  + f"  tau {tr.metrics['mean_acceptance_length']:.2f}"
                  + f"  {len(tr.output_token_ids) / (wall * len(tr.steps) / 1e3):.0f} tok/s"
                  + f"  gc {gct.count} {gct.seconds * 1e3:.1f} ms in {a.repeats} requests  (warm-up {warm_s:.1f} s)",
                  flush=True)
            if a.cprofile:
                _cprofile(dec, DEMO_PROMPT, kw, a.max_new, detailed, a.cprofile)
        if a.profile:
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
            with profile(activities=acts) as prof:
                dec.generate(DEMO_PROMPT, max_new_tokens=32, **kw)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=40))


if __name__ == "__main__":
    main()
