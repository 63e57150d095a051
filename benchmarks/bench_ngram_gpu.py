"""ngram_gpu's drafting cost per step over several prompt lengths in ONE process: first request against later ones.

What it shows: whether anything in the ngram_gpu path is paid per request or per step that should be paid once (a
Triton compile per context length, k or (prompt_lookup_min, max), a rebuilt buffer, a host sync). Two parts:

* kernel: ``ngram_match_triton`` alone on contexts of several lengths, k and n ranges, in that order: the first
  call of each shape and the median of the later calls (synchronised), and how many variants Triton compiled;
* decode: the bundled models, method ngram_gpu (k' read on the host, the verifier's width k' + 1), its
  padded variant ("ngram_gpu padded": k' kept on the device, k + 1 rows verified at every step) and ngram,
  interleaved over ``--rounds``, on prompts of several lengths (a code prompt repeated) and on a bundled prompt
  set (steps without a match too, where the padded variant still verifies k + 1 rows): draft ms per step (median
  and max over the steps of the request, from the trace), the capture / compile ms the engine kept out of the step
  times, tokens/s, and each variant's share of ngram's tokens/s.

With one compiled variant per device the first request of each new length costs what the later ones do (only the
process's very first call compiles). ``--warm-up`` runs ``SpecDecoder.warm_up()`` first, as the app does.

    python3 benchmarks/bench_ngram_gpu.py                     # on the H200
    python3 benchmarks/bench_ngram_gpu.py --warm-up --skip-kernel --lengths 300 --out $OUT/bench_ngram_gpu.json
    python3 benchmarks/bench_ngram_gpu.py --skip-decode --lengths 20,300   # kernel part only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CODE = ("class LlamaMLP(nn.Module):\n    def __init__(self, config):\n        super().__init__()\n"
        "        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)\n"
        "        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)\n")


def compiled_variants() -> int:
    """Variants Triton holds compiled for both matcher kernels (-1 where this Triton does not say)."""
    from specviz.kernels import ngram_matcher as nm

    total = 0
    for kernel in (nm._ngram_first_end_kernel, nm._ngram_finalize_kernel):
        caches = getattr(kernel, "device_caches", None)
        if caches is None:
            return -1
        total += sum(len(entry[0]) for entry in caches.values())
    return total


def kernel_part(lengths: list[int], device: torch.device, repeats: int) -> list[dict]:
    from specviz.kernels.ngram_matcher import ngram_match_triton

    rows, g = [], torch.Generator().manual_seed(0)
    for L in lengths:
        for k, lo, hi in ((5, 2, 4), (3, 2, 4), (1, 2, 4), (5, 5, 5)):
            ctx = torch.randint(0, 50, (1, L), generator=g).to(device)
            lengths_t = torch.full((1,), L, dtype=torch.int64, device=device)
            times = []
            for _ in range(repeats + 1):
                torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                ngram_match_triton(ctx, lengths_t, prompt_lookup_min=lo, prompt_lookup_max=hi,
                                   num_speculative_tokens=k, validate_lengths=False)
                torch.cuda.synchronize(device)
                times.append((time.perf_counter() - t0) * 1e3)
            rows.append({"L": L, "k": k, "min": lo, "max": hi, "first_ms": times[0],
                         "later_median_ms": statistics.median(times[1:]), "variants": compiled_variants()})
            print(f"kernel L={L:5d} k={k} n={lo}..{hi}: first {times[0]:8.3f} ms, later median "
                  f"{rows[-1]['later_median_ms']:.3f} ms, compiled variants {rows[-1]['variants']}", flush=True)
    return rows


@contextlib.contextmanager
def _padded(on: bool):
    """While ``on``: ngram_gpu's padded variant ("ngram_gpu padded", ``PAD_ON_CUDA``): k' stays on the device and the
    verifier runs k + 1 rows on every step; the default reads k' on the host and verifies k' + 1 rows (1 on a step
    without a match), as ngram does."""
    import specviz.methods.ngram_gpu as ngram_gpu

    before = ngram_gpu.PAD_ON_CUDA
    ngram_gpu.PAD_ON_CUDA = on
    try:
        yield
    finally:
        ngram_gpu.PAD_ON_CUDA = before


def decode_part(lengths: list[int], max_new_tokens: int, warm: bool, prompt_set: str, rounds: int) -> list[dict]:
    """Decode rows: ngram_gpu (k' read on the host, the default), ngram_gpu padded (k' on the device) and ngram, the
    three interleaved ``rounds`` times (drift hits all alike); tokens/s from the step times, one-time costs kept out."""
    from specviz import SpecDecoder
    from specviz.compare.cli import load_prompt_set
    from specviz.kernels import ngram_matcher as nm

    dec = SpecDecoder.from_pretrained()
    if warm:  # what these rows need only: the target's widths, greedy verifiers, both drafters
        report = dec.warm_up(verify_methods=("greedy",), temperatures=(), synthetic_rates=(),
                             method_names=("ngram", "ngram_gpu"))
        print(f"warm-up: {report}", flush=True)
    unit = dec.encode(CODE)
    prompts = [(f"repeated L={L}", (unit * (L // len(unit) + 1))[:L]) for L in lengths]
    prompts += [(p.name, dec.encode(p.text)) for p in (load_prompt_set(prompt_set) if prompt_set else [])]
    rows = []
    for name, prompt in prompts:
        for rnd in range(rounds):
            for method in ("ngram_gpu", "ngram_gpu padded", "ngram"):
                c0 = nm.compile_seconds
                with _padded(method.endswith("padded")):
                    tr = dec.generate(prompt, method=method.split()[0], num_speculative_tokens=5, temperature=0.0,
                                      max_new_tokens=max_new_tokens)
                draft = [s.timings_ms.get("draft", 0.0) for s in tr.steps]
                dec_s = sum(tr.metrics["time_ms"].values()) / 1e3
                rows.append({"prompt": name, "L": len(prompt), "round": rnd, "method": method, "steps": len(tr.steps),
                             "draft_ms_median": statistics.median(draft), "draft_ms_max": max(draft),
                             "draft_ms_mean": statistics.fmean(draft), "capture_ms": tr.metrics.get("capture_ms", 0.0),
                             "compile_s_this_request": nm.compile_seconds - c0,
                             "tokens_per_s": len(tr.output_token_ids) / dec_s if dec_s else 0.0,
                             "tokens_per_step": len(tr.output_token_ids) / max(len(tr.steps), 1),
                             "variants": compiled_variants()})
                r = rows[-1]
                print(f"decode {name[:22]:22s} L={r['L']:5d} r{rnd} {method:15s}: draft ms/step median "
                      f"{r['draft_ms_median']:.3f} mean {r['draft_ms_mean']:.3f} max {r['draft_ms_max']:.2f} | "
                      f"kept out: capture {r['capture_ms']:.1f} ms "
                      f"(compile {1e3 * r['compile_s_this_request']:.1f} ms) | "
                      f"{r['tokens_per_step']:.2f} tok/step {r['tokens_per_s']:.0f} tok/s", flush=True)
    print("\nmedian tokens/s over rounds, and each ngram_gpu variant's share of ngram's (target: >= 90 %)")
    for name, _ in prompts:
        med = {m: statistics.median(r["tokens_per_s"] for r in rows if r["prompt"] == name and r["method"] == m)
               for m in ("ngram_gpu", "ngram_gpu padded", "ngram")}
        print(f"  {name[:30]:30s} ngram {med['ngram']:6.0f} | ngram_gpu {med['ngram_gpu']:6.0f} "
              f"({100 * med['ngram_gpu'] / med['ngram']:.0f} %) | padded {med['ngram_gpu padded']:6.0f} "
              f"({100 * med['ngram_gpu padded'] / med['ngram']:.0f} %)")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="24,100,300,700,1500", help="prompt / context lengths in tokens")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=20, help="later kernel calls per shape")
    ap.add_argument("--warm-up", action="store_true", help="SpecDecoder.warm_up() before the decode part")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--skip-kernel", action="store_true")
    ap.add_argument("--prompt-set", default="repetitive code", help="bundled prompt category for the decode rows too "
                    "('' for none)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the decode rows")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs CUDA (ngram_gpu runs the PyTorch reference on the CPU)")
    lengths = [int(v) for v in args.lengths.split(",")]
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "kernel": [] if args.skip_kernel else kernel_part(lengths, torch.device("cuda"), args.repeats)}
    if not args.skip_decode:
        out["decode"] = decode_part(lengths, args.max_new_tokens, args.warm_up, args.prompt_set, args.rounds)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
