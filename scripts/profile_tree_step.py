"""Where an EAGLE tree step's time goes on the GPU, beside the chain's (issue 15): the engine's own per-phase
times (draft, verify forward, sampler and record; medians over a warm request's steps) and a torch.profiler table of
one request (CPU time by op, kernel count). Prints text only.

    python scripts/profile_tree_step.py [--device cuda] [--max-new 96]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--profile", action="store_true", help="also a torch.profiler table per setting")
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench_e2e import DEMO_PROMPT
    from host_ops import SETTINGS
    from specviz import SpecDecoder

    dec = SpecDecoder.from_pretrained(device=a.device, runner="static")
    settings = {name.replace("eagle3 ", ""): kw for name, kw in SETTINGS.items()}
    for name, kw in settings.items():
        for detailed in (True, False):
            for _ in range(2):
                dec.generate(DEMO_PROMPT, max_new_tokens=a.max_new, detailed_trace=detailed, **kw)
            if a.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            tr = dec.generate(DEMO_PROMPT, max_new_tokens=a.max_new, detailed_trace=detailed, **kw)
            wall = (time.perf_counter() - t0) / len(tr.steps) * 1e3
            ph = {k: statistics.median(s.timings_ms.get(k, 0.0) for s in tr.steps[1:]) for k in ("draft", "verify", "sample")}
            print(f"{name:26s} trace={'on ' if detailed else 'off'} wall {wall:6.2f} ms/step  "
                  + "  ".join(f"{k} {v:5.2f}" for k, v in ph.items())
                  + f"  tau {tr.metrics['mean_acceptance_length']:.2f}  {len(tr.output_token_ids) / (wall * len(tr.steps) / 1e3):.0f} tok/s",
                  flush=True)
        if a.profile:
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if a.device == "cuda" else [])
            with profile(activities=acts) as prof:
                dec.generate(DEMO_PROMPT, max_new_tokens=32, **kw)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=40))


if __name__ == "__main__":
    main()
