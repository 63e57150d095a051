"""Where a request's fixed cost goes: method none on a Llama-shaped random target, one process, batch 1.

A request costs a fixed part (setup, the prefill, the trace) plus a part per token; ``bench_shapes.py`` prints both
from two lengths. This script splits the fixed part, medians of ``--repeats`` after a warm-up, all ms:

* ``request_1``: the wall time of ``generate(max_new_tokens=1)`` (setup + prefill + one step + the trace);
* ``prefill``: the target runner's prefill forward alone (the prompt less its last token), synchronised: eager
  (``prefill_eager``) and the runner's default (``prefill_graph``: padded to a bucket and replayed from a CUDA graph
  when the prompt is short enough, else eager too); ``request_1_eager``: the request with the eager prefill;
* ``step``: one further 1-token forward of that runner (a CUDA-graph replay), synchronised;
* the host's hottest functions over ``--profile`` calls of ``generate(max_new_tokens=1)`` (cProfile, cumulative); with
  ``--profile-tokens N`` over requests of N tokens instead, by own time (the decode loop's host work per step), then
  specviz's functions by cumulative time, and
  ``--synthetic`` for draft_model with verify="synthetic" (a = 0.8, k = 4, a 74 M draft) instead of method none.

    python benchmarks/request_cost.py --shape 8b --prompt-len 32 --out $OUT/request_cost.json

The profile runs the default runner (graph prefill when the prompt fits a bucket).
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

from bench_shapes import DRAFT, DRY_DRAFT, DRY_SHAPES, SHAPES, IdTokenizer, build, median_wall, sync  # noqa: E402
from specviz import SpecDecoder  # noqa: E402
from specviz.static_runner import StaticRunner  # noqa: E402


def measure(shape: str, prompt_len: int, repeats: int, profile_calls: int, device: torch.device,
            profile_tokens: int = 1, synthetic: bool = False) -> dict:
    cfg = (DRY_SHAPES if shape == "dry" else SHAPES)[shape]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = build(cfg, device, dtype, 0)
    draft = build(DRY_DRAFT if shape == "dry" else DRAFT, device, dtype, 1) if synthetic else None
    dec = SpecDecoder(target, IdTokenizer(), draft,
                      runner_factory=functools.partial(StaticRunner, max_cache_len=prompt_len + profile_tokens + 64))
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
    buckets, runner.prefill_buckets = runner.prefill_buckets, None
    prefill_eager_s, _ = median_wall(prefill, device, repeats)
    request_1_eager, _ = median_wall(one, device, repeats)
    runner.prefill_buckets = buckets
    step_s, _ = median_wall(step, device, repeats)
    spec = dict(method="draft_model", verify="synthetic", synthetic_rates=[0.8 ** i for i in range(1, 5)],
                num_speculative_tokens=4) if synthetic else dict(method="none")
    profiled = functools.partial(dec.generate, prompt, max_new_tokens=profile_tokens, **spec)
    profiled()  # captures of the widths it needs, outside the profile
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(profile_calls):
        profiled()
        sync(device)
    prof.disable()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("cumulative" if profile_tokens == 1 else "tottime").print_stats(25)
    if profile_tokens > 1:  # the decode loop: also specviz's own functions by cumulative time (where a wait sits)
        stats.sort_stats("cumulative").print_stats("specviz", 30)
    return {"shape": shape, "prompt_len": prompt_len, "device": str(device), "request_1_ms": 1e3 * request_1,
            "request_1_eager_ms": 1e3 * request_1_eager, "prefill_graph_ms": 1e3 * prefill_s,
            "prefill_eager_ms": 1e3 * prefill_eager_s, "step_ms": 1e3 * step_s, "profile_calls": profile_calls,
            "profile_tokens": profile_tokens, "profiled": spec["method"],
            "profile": text.getvalue()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="8b", help="8b, 1b or dry (tiny, any device)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", type=int, default=5, help="generate calls under cProfile")
    ap.add_argument("--profile-tokens", type=int, default=1, help="tokens per profiled request")
    ap.add_argument("--synthetic", action="store_true", help="profile draft_model synthetic a=0.8 k=4, not none")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    res = measure(args.shape, args.prompt_len, args.repeats, args.profile, device, args.profile_tokens,
                  args.synthetic)
    print(f"{args.shape}, prompt {args.prompt_len}, {device}: request of 1 token {res['request_1_ms']:.2f} ms "
          f"({res['request_1_eager_ms']:.2f} with an eager prefill); prefill forward {res['prefill_graph_ms']:.2f} ms "
          f"(default runner; eager {res['prefill_eager_ms']:.2f} ms); one 1-token forward {res['step_ms']:.2f} ms")
    print(res["profile"])
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
