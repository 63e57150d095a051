"""Where the host time of an EAGLE tree step goes on the GPU, beside the chain's (issue 15): per step, the wall time,
the GPU's busy time (the union of its kernel intervals) and kernel count, then the host's CPU time by source line
(torch.profiler, stacks grouped to the specviz frames). Prints text only.

    python scripts/profile_tree_timeline.py [--max-new 64]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def busy_ms(events) -> tuple[float, int]:
    """(union of the CUDA kernels' intervals in ms, kernel count) of a profiler's events."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA"))
    total, end = 0.0, -1.0
    for s, t in spans:
        if s > end:
            total += t - s
            end = t
        elif t > end:
            total += t - end
            end = t
    return total / 1e3, len(spans)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-new", type=int, default=64)
    a = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench_e2e import DEMO_PROMPT
    from specviz import SpecDecoder

    dec = SpecDecoder.from_pretrained(device="cuda", runner="static")
    settings = {"chain k=5": dict(method="eagle3", num_speculative_tokens=5),
                "tree 4x5x24": dict(method="eagle3", num_speculative_tokens=6, eagle_tree_top_k=4, eagle_tree_depth=5,
                                    eagle_tree_total_tokens=24)}
    for name, kw in settings.items():
        for _ in range(2):
            dec.generate(DEMO_PROMPT, max_new_tokens=a.max_new, **kw)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
            t0 = time.perf_counter()
            tr = dec.generate(DEMO_PROMPT, max_new_tokens=a.max_new, **kw)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        steps = len(tr.steps)
        busy, kernels = busy_ms(prof.events())
        print(f"== {name}: {steps} steps, wall {wall * 1e3 / steps:.2f} ms/step (profiled), GPU busy "
              f"{busy / steps:.2f} ms/step, {kernels / steps:.0f} kernels/step, tau "
              f"{tr.metrics['mean_acceptance_length']:.2f}", flush=True)
        by_line: dict[str, float] = defaultdict(float)
        for e in prof.events():
            if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA"):
                continue
            frames = [f for f in (e.stack or []) if "specviz" in f]
            if frames and e.self_cpu_time_total:
                by_line[frames[0].split("specviz/")[-1]] += e.self_cpu_time_total
        for line, us in sorted(by_line.items(), key=lambda kv: -kv[1])[:28]:
            print(f"  {us / 1e3 / steps:6.3f} ms/step  {line}")


if __name__ == "__main__":
    main()
