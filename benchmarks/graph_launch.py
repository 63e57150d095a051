"""What a CUDA-graph replay costs the host, by the graph's kernel count: does the step's idle GPU time scale with nodes?

Method none's step on the Llama-3.1-8B shape spends 1.24 ms outside its 6.74 ms forward replay, the 1B shape 0.57 ms
outside 1.68 ms, about 1.6-1.7 µs per kernel of the forward's graph (732 and 364 kernels; results/gpu). This script
separates the candidates, side by side in one process, for graphs of N small kernels (N in ``--nodes``):

* ``launch_us``: host time of ``graph.replay()`` alone (perf_counter around the call, no wait), median;
* ``gpu_us``: GPU time of one replay (CUDA events), median;
* ``step_us``: a step as the engine runs it: replay, a non-blocking 8-byte device-to-host copy, an event wait; wall
  time per step, median; ``idle_us`` = step_us - gpu_us, the time per step the GPU waits for the host.

If ``launch_us`` and ``idle_us`` grow with N at about 1.6 µs per node, the launch is what the step waits for; if
``idle_us`` stays flat, look elsewhere (the engine's host work between steps). Each kernel reads and writes a
[``--width``] bf16 vector (``x.add_(1)``), so the GPU work per node is small and the launch dominates.

    python benchmarks/graph_launch.py --nodes 64,364,732,1724 --repeats 200 --out $OUT/graph_launch.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def measure(nodes: int, width: int, repeats: int) -> dict:
    """The three medians (µs) for one graph of ``nodes`` kernels."""
    import torch

    x = torch.zeros(width, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(nodes):
            x.add_(1)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(nodes):
            x.add_(1)
    host = torch.empty(4, dtype=torch.bfloat16, pin_memory=True)
    for _ in range(5):  # the first replays upload the graph
        graph.replay()
    torch.cuda.synchronize()
    launch, gpu, step = [], [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        launch.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end) * 1e-3)
    done = torch.cuda.Event()
    for _ in range(repeats):
        t0 = time.perf_counter()
        graph.replay()
        host.copy_(x[:4], non_blocking=True)
        done.record()
        done.synchronize()
        step.append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e6 for k, v in (("launch_us", launch), ("gpu_us", gpu), ("step_us", step))}
    return {"nodes": nodes, **med, "idle_us": med["step_us"] - med["gpu_us"]}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="64,364,732,1724", help="comma-separated kernel counts")
    ap.add_argument("--width", type=int, default=4096, help="elements each kernel reads and writes")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out", default=None, help="a JSON file for the rows")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("graph_launch.py needs CUDA: nothing measured")
        return []
    rows = [measure(int(n), args.width, args.repeats) for n in args.nodes.split(",")]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print(f"{'nodes':>6} {'launch µs':>10} {'GPU µs':>8} {'step µs':>8} {'idle µs':>8} {'idle/node µs':>13}")
    for r in rows:
        print(f"{r['nodes']:>6} {r['launch_us']:>10.1f} {r['gpu_us']:>8.1f} {r['step_us']:>8.1f} {r['idle_us']:>8.1f} "
              f"{r['idle_us'] / r['nodes']:>13.2f}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
