"""The issue-14 goal: 6 configurations x 5 prompts of 64 new tokens on the bundled models, timed.

    .venv/bin/python results/compare/measure.py [--device cpu] [--out DIR]

Prints wall time of the comparison (after loading and warm-up), this process's CPU time, and the
1-minute load average before and after (the CPU machine is shared: a load above 2 on 2 cores
stretches the wall time). Configurations: none, ngram, ngram_gpu, suffix, draft_model (k = 5,
greedy) and draft_model k = 3; prompts: the first five of a mix of the bundled categories.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specviz import SpecDecoder  # noqa: E402
from specviz.compare import RunConfig, iter_comparison, new_comparison, table_csv  # noqa: E402
from specviz.compare.cli import load_prompt_set  # noqa: E402

LOOKUP = (("prompt_lookup_max", 4), ("prompt_lookup_min", 2))
CONFIGS = [RunConfig("ngram", 5, None, 0.0, LOOKUP), RunConfig("ngram_gpu", 5, None, 0.0, LOOKUP),
           RunConfig("suffix", 5), RunConfig("draft_model", 5), RunConfig("draft_model", 3)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None, help="write compare.csv / compare.json here")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    prompts = load_prompt_set("all")
    prompts = [prompts[i] for i in (0, 1, 3, 4, 6)]
    dec = SpecDecoder.from_pretrained(device=args.device)
    dec.warm_up()
    c = new_comparison(CONFIGS, prompts, [0], 64)
    load0 = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    last = c0
    for r in iter_comparison(dec, c):
        now = time.process_time()
        print(f"{c.configs[r.config].label:28s} prompt {r.prompt + 1}: {len(r.trace.output_token_ids)} tokens "
              f"wall {r.wall_s:.2f} s, CPU {now - last:.2f} s, load {os.getloadavg()[0]:.1f}", flush=True)
        last = now
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"{len(c.configs)} configurations x {len(c.prompts)} prompts x 64 tokens: wall {wall:.1f} s, "
          f"process CPU {cpu:.1f} s, load average {load0:.1f} -> {os.getloadavg()[0]:.1f}, "
          f"device {dec.device}, torch threads {c.machine.get('threads')}")
    print(table_csv(c))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "compare.csv").write_text(table_csv(c))
        (Path(args.out) / "compare.json").write_text(c.to_json())


if __name__ == "__main__":
    main()
