"""What the hidden-state taps cost (goal: <= 3% of a plain step's time on the H200).

One process, the bundled target in the static runner (CUDA graphs on CUDA), batch 1: the median time of
a forward of ``width`` tokens (1 = a decode step of method none; 6 = a k = 5 verification) without taps,
with EAGLE-1's tap (the final norm's output) and with EAGLE-3's three layer inputs, interleaved round by
round so drift hits every variant alike. Each timed call is ``forward_features`` + ``truncate`` and ends with
a device synchronize (the features are cloned out of the graph's buffers, which is part of the cost).
Prints medians and ratios to the no-tap forward; ``--out`` writes bench_taps.json.

    python3 benchmarks/bench_taps.py --out $OUT --commit abc1234
    python3 benchmarks/bench_taps.py --device cpu --rounds 5        # a quick check anywhere
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.models import DEFAULT_TARGET, load_model  # noqa: E402
from specviz.runner import FINAL_NORM, layer_input  # noqa: E402
from specviz.static_runner import StaticRunner  # noqa: E402

VARIANTS = {"none": (), "eagle (final norm)": (FINAL_NORM,),
            "eagle3 (3 layer inputs)": tuple(layer_input(i) for i in (2, 10, 17))}


def timed_forward(runner: StaticRunner, ids: torch.Tensor, taps: tuple[str, ...], base: int) -> float:
    """Seconds for one forward of ``ids`` with ``taps`` from a cache of ``base`` tokens (synchronized)."""
    sync = torch.cuda.synchronize if ids.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = runner.forward_features(ids, taps)
    _ = out.logits, out.features
    sync()
    dt = time.perf_counter() - t0
    runner.truncate(base)
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--widths", default="1,6")
    ap.add_argument("--out", default=None)
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = load_model(DEFAULT_TARGET, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    runner = StaticRunner(model, max_cache_len=512)
    prompt = torch.randint(2, model.config.vocab_size, (200,))
    runner.forward(prompt)  # prefill (eager); later forwards replay graphs on CUDA
    base = runner.seq_len
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": args.commit,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "cuda_graphs": bool(runner.cuda_graphs), "context": base,
              "rounds": args.rounds, "rows": []}
    for width in (int(w) for w in args.widths.split(",")):
        ids = torch.randint(2, model.config.vocab_size, (width,), device=device)
        for taps in VARIANTS.values():  # capture / first call outside the timing
            for _ in range(3):
                timed_forward(runner, ids, taps, base)
        times = {name: [] for name in VARIANTS}
        for _ in range(args.rounds):
            for name, taps in VARIANTS.items():
                times[name].append(timed_forward(runner, ids, taps, base))
        plain = statistics.median(times["none"])
        for name, ts in times.items():
            med = statistics.median(ts)
            row = {"width": width, "taps": name, "median_ms": med * 1e3, "ratio_to_none": med / plain}
            result["rows"].append(row)
            print(f"width {width:2d}  {name:26s} {med * 1e3:8.4f} ms  x{med / plain:.3f}", flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_taps.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
