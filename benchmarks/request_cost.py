"""Where a request's fixed cost goes: method none on a Llama-shaped random target, one process, batch 1.

A request costs a fixed part (setup, the prefill, the trace) plus a part per token; ``bench_shapes.py`` prints both
from two lengths. This script splits the fixed part, medians of ``--repeats`` after a warm-up, all ms:

* ``request_1``: the wall time of ``generate(max_new_tokens=1)`` (setup + prefill + one step + the trace);
* ``prefill``: the target runner's prefill forward alone (the prompt less its last token), eager, synchronised;
* ``step``: one further 1-token forward of that runner (a CUDA-graph replay), synchronised;
* the host's hottest functions over ``--profile`` calls of ``generate(max_new_tokens=1)`` (cProfile, cumulative).

    python benchmarks/request_cost.py --shape 8b --prompt-len 32 --out $OUT/request_cost.json
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import json
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_shapes import DRY_SHAPES, SHAPES, IdTokenizer, build, median_wall, sync  # noqa: E402
from specviz import SpecDecoder  # noqa: E402
from specviz.static_runner import StaticRunner  # noqa: E402


def measure(shape: str, prompt_len: int, repeats: int, profile_calls: int, device: torch.device) -> dict:
    cfg = (DRY_SHAPES if shape == "dry" else SHAPES)[shape]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = build(cfg, device, dtype, 0)
    dec = SpecDecoder(target, IdTokenizer(), None,
                      runner_factory=functools.partial(StaticRunner, max_cache_len=prompt_len + 64))
    prompt = torch.randint(0, cfg["vocab_size"], (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    one = functools.partial(dec.generate, prompt, method="none", max_new_tokens=1)
    request_1, _ = median_wall(one, device, repeats)
    runner = dec.pool.free(id(target))[0]
    ids = torch.tensor(prompt[:-1], device=device)

    def prefill():
        runner.reset()
        return runner.forward_features(ids)

    def step():
        runner.truncate(prompt_len - 1)
        return runner.forward_features(ids[-1:])

    prefill_s, _ = median_wall(prefill, device, repeats)
    step_s, _ = median_wall(step, device, repeats)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(profile_calls):
        one()
        sync(device)
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)
    return {"shape": shape, "prompt_len": prompt_len, "device": str(device), "request_1_ms": 1e3 * request_1,
            "prefill_ms": 1e3 * prefill_s, "step_ms": 1e3 * step_s, "profile_calls": profile_calls,
            "profile": text.getvalue()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="8b", help="8b, 1b or dry (tiny, any device)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", type=int, default=5, help="generate calls under cProfile")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    res = measure(args.shape, args.prompt_len, args.repeats, args.profile, device)
    print(f"{args.shape}, prompt {args.prompt_len}, {device}: request of 1 token {res['request_1_ms']:.2f} ms; "
          f"prefill forward {res['prefill_ms']:.2f} ms; one 1-token forward {res['step_ms']:.2f} ms")
    print(res["profile"])
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
