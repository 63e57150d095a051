"""Benchmark the Triton kernels against their PyTorch references on a GPU.

Usage: python3 benchmarks/bench_kernels.py RESULTS_DIR [--commit SHA] [--budget-s 300] [--quick]

Measures, side by side in one run (medians of ``triton.testing.do_bench``, which flushes L2
between repeats):
* the device copy bandwidth (a 2 GiB device-to-device copy, bytes read + written / time);
* the rejection sampler, full q, for B x K x V x dtype in {1,8,64,256} x {1,4,8} x
  {32000,128256,151936} x {fp32,bf16}, methods standard, block and greedy: reference vs Triton,
  the bytes the sampler must read per second (see ``must_read_bytes``) against the copy
  bandwidth, and block / standard; plus one-hot q and synthetic at the goal shape;
* the n-gram matcher for B x L in {1,64,256} x {1024,8192,32768}: reference vs Triton.
Every Triton result is also checked against the reference (token ids must be equal).
Writes RESULTS_DIR/bench_kernels.json and RESULTS_DIR/bench_kernels.md (date, device, commit).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels.ngram_matcher import ngram_match_triton  # noqa: E402
from kernels.rejection_sampler import rejection_sample_triton  # noqa: E402
from specviz.proposers.ngram_gpu import ngram_match_reference  # noqa: E402
from specviz.sampling import draw_noise, rejection_sample  # noqa: E402

DEVICE = "cuda"  # a smoke test may point this at "cpu" under TRITON_INTERPRET=1
GOAL = (64, 4, 128256)  # B, K, V of the goals
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
RATES = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]


def median_ms(fn, heavy: bool = False) -> float:
    """Median time of fn() in ms; fewer repeats for slow reference calls."""
    return float(do_bench(fn, warmup=5 if heavy else 10, rep=40 if heavy else 60, return_mode="median"))


def copy_bandwidth() -> dict:
    """Device-to-device copy of 2 GiB: (bytes read + bytes written) / median time."""
    src = torch.randn(2**29 if DEVICE == "cuda" else 2**20, device=DEVICE)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    nbytes = src.numel() * src.element_size()
    del src, dst
    return {"bytes": nbytes, "ms": ms, "copy_GBps": 2 * nbytes / ms / 1e6}


def make_sampler_inputs(B, K, V, dtype, full, method, seed=0):
    """p [B, K+1, V] (dtype), q [B, K, V] (dtype) or None, ids int64 [B, K], noise (cuda)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    logits = torch.randn(B, K + 1, V, device=DEVICE, generator=g) * 3
    p = torch.softmax(logits, -1)
    q = None
    if full:
        q = torch.softmax(logits[:, :K] + 0.5 * torch.randn(B, K, V, device=DEVICE, generator=g), -1)
    if method == "greedy":
        ids = p[:, :K].argmax(-1)
    else:
        src = q if full else p[:, :K]
        ids = torch.multinomial(src.reshape(-1, V), 1, generator=g).reshape(B, K)
    noise = draw_noise(B, K, V, generator=g, device=DEVICE)
    del logits
    return p.to(dtype), (q.to(dtype) if full else None), ids, noise


def must_read_bytes(out, V: int, p_bytes: int, q_bytes: int, full: bool, method: str) -> int:
    """Lower bound of the bytes any implementation must read, given the outcome.

    full q: every drafted row of p and q (the residual mass Z_i and the finiteness of q are
    reported for every draft), plus p_{k'+1} when the bonus is emitted, plus the Exp noise row
    (not for greedy). one-hot q: greedy reads p rows up to the emitted one; the others read the
    emitted row of p and the noise row (Z_i = 1 - p_i(x_i) needs no pass).
    """
    kd = out.num_draft.long()
    bonus = (out.num_accepted == out.num_draft).long()
    B = kd.numel()
    noise = 0 if method == "greedy" else B * V * 4
    if full:
        rows = int(kd.sum()) * V * (p_bytes + q_bytes) + int(bonus.sum()) * V * p_bytes
        return rows + noise
    if method == "greedy":
        return int((out.num_accepted + 1).sum()) * V * p_bytes
    return B * V * p_bytes + noise


def bench_sampler_case(B, K, V, dtype_name, full, methods, copy_GBps) -> list[dict]:
    dtype = DTYPES[dtype_name]
    recs = []
    for method in methods:
        p, q, ids, noise = make_sampler_inputs(B, K, V, dtype, full, method)
        rates = RATES[:K] if method == "synthetic" else None
        kw = dict(method=method, noise=noise, synthetic_rates=rates)
        ref = rejection_sample(p, q, ids, backend="reference", **kw)
        tri = rejection_sample_triton(p, q, ids, **kw)
        match = bool(torch.equal(ref.output_token_ids, tri.output_token_ids)) and bool(
            torch.equal(ref.token_kind, tri.token_kind)
        )
        heavy = B * (K + 1) * V > 2e7
        t_ref = median_ms(lambda: rejection_sample(p, q, ids, backend="reference", **kw), heavy=heavy)
        t_tri = median_ms(lambda: rejection_sample_triton(p, q, ids, **kw))
        nbytes = must_read_bytes(ref, V, p.element_size(), q.element_size() if full else 0, full, method)
        gbps = nbytes / t_tri / 1e6
        recs.append(
            dict(B=B, K=K, V=V, dtype=dtype_name, q="full" if full else "onehot", method=method,
                 ref_ms=t_ref, triton_ms=t_tri, speedup=t_ref / t_tri, must_read_bytes=nbytes,
                 triton_GBps=gbps, frac_copy_bw=gbps / copy_GBps, match_reference=match,
                 mean_accepted=float(ref.num_accepted.float().mean()))
        )  # fmt: skip
        del p, q, ids, noise, ref, tri
    return recs


def ngram_inputs(B: int, L: int, seed: int = 0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    ids = torch.randint(0, 32000, (B, L), device=DEVICE, dtype=torch.int32, generator=g)
    ids[:, L // 3 : L // 3 + 16] = ids[:, L - 16 :]  # plant a repeat of the suffix
    return ids, torch.full((B,), L, device=DEVICE, dtype=torch.int64)


def bench_ngram(B: int, L: int, kw: dict) -> dict:
    ids, lengths = ngram_inputs(B, L)
    ref = ngram_match_reference(ids, lengths, **kw)
    tri = ngram_match_triton(ids, lengths, **kw)
    match = all(torch.equal(a, b) for a, b in zip(ref, tri))
    t_ref = median_ms(lambda: ngram_match_reference(ids, lengths, **kw), heavy=B * L > 2e6)
    t_tri = median_ms(lambda: ngram_match_triton(ids, lengths, **kw))
    return dict(B=B, L=L, ref_ms=t_ref, triton_ms=t_tri, speedup=t_ref / t_tri, match_reference=match, **kw)


def run(args) -> dict:
    """The whole benchmark; the JSON is rewritten after every shape, so a killed run keeps data."""
    t_start = time.time()
    args.results_dir.mkdir(parents=True, exist_ok=True)
    save = lambda: (args.results_dir / "bench_kernels.json").write_text(json.dumps(res, indent=1))  # noqa: E731
    res = {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    res.update(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, commit=args.commit)
    res["copy"] = copy_bandwidth()
    copy_GBps = res["copy"]["copy_GBps"]
    print(f"copy bandwidth {copy_GBps:.0f} GB/s", flush=True)
    shapes = [(b, k, v, d) for d in DTYPES for v in (128256, 32000, 151936) for b in (64, 1, 8, 256) for k in (4, 1, 8)]
    shapes.sort(key=lambda s: (s[:3] != GOAL, s[3]))  # goal shapes first
    if args.quick:
        shapes = [s for s in shapes if s[:3] == GOAL]
    res["sampler"], res["skipped_sampler"] = [], []
    for B, K, V, d in shapes:
        if time.time() - t_start > args.budget_s:
            res["skipped_sampler"].append([B, K, V, d])
            continue
        methods = ("standard", "block", "greedy")
        res["sampler"] += bench_sampler_case(B, K, V, d, True, methods, copy_GBps)
        if (B, K, V) == GOAL:
            res["sampler"] += bench_sampler_case(B, K, V, d, False, methods + ("synthetic",), copy_GBps)
            res["sampler"] += bench_sampler_case(B, K, V, d, True, ("synthetic",), copy_GBps)
        last = res["sampler"][-1]
        print(f"sampler B={B} K={K} V={V} {d}: {time.time() - t_start:.0f}s ({last['speedup']:.1f}x)", flush=True)
        torch.cuda.empty_cache()
        save()
    kw = dict(prompt_lookup_min=2, prompt_lookup_max=5, num_speculative_tokens=5, validate_lengths=False)
    res["ngram"] = [bench_ngram(B, L, kw) for B in (1, 64, 256) for L in (1024, 8192, 32768)]
    res["total_s"] = time.time() - t_start
    save()
    return res


def _f(x: float, nd: int = 3) -> str:
    return f"{x:.{nd}f}"


def _sampler_rows(recs: list[dict]) -> list[str]:
    """One markdown row per (B, K, V, dtype) of the full-q grid."""
    by = {}
    for r in recs:
        if r["q"] == "full" and r["method"] in ("standard", "block", "greedy"):
            by.setdefault((r["B"], r["K"], r["V"], r["dtype"]), {})[r["method"]] = r
    rows = []
    for (B, K, V, d), m in sorted(by.items()):
        s, b, g = m.get("standard"), m.get("block"), m.get("greedy")
        if not (s and b and g):
            continue
        ok = all(x["match_reference"] for x in (s, b, g))
        rows.append(
            f"| {B} | {K} | {V} | {d} | {_f(s['ref_ms'])} | {_f(s['triton_ms'])} | {_f(s['speedup'], 1)} | "
            f"{_f(s['frac_copy_bw'], 2)} | {_f(b['ref_ms'])} | {_f(b['triton_ms'])} | {_f(b['speedup'], 1)} | "
            f"{_f(b['frac_copy_bw'], 2)} | {_f(b['triton_ms'] / s['triton_ms'], 2)} | {_f(g['triton_ms'])} | "
            f"{_f(g['speedup'], 1)} | {'yes' if ok else 'NO'} |"
        )
    return rows


def render(res: dict) -> str:
    """Markdown summary of a benchmark result (goal shape first, then every shape)."""
    c = res["copy"]
    out = [
        "# Triton kernels vs PyTorch reference",
        "",
        f"- date (UTC): {res['date_utc']}",
        f"- device: {res['device']}; torch {res['torch']}, triton {res['triton']}",
        f"- commit: {res['commit']}",
        f"- measured copy bandwidth: {c['copy_GBps']:.0f} GB/s (2 GiB device-to-device copy, read + write bytes / median time)",
        "- times: medians of triton.testing.do_bench (L2 flushed between repeats), in ms, host launch overhead included",
        "- bw = bytes the sampler must read (lower bound, see must_read_bytes) / Triton time, as a fraction of the copy bandwidth",
        "",
        f"## Goal shape B, K, V = {GOAL} (goals: speedup >= 5, bw >= 0.5, block / standard <= 1.3)",
        "",
        "| q | dtype | method | ref ms | triton ms | speedup | bw | block/std | mean accepted | equal to reference |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    goal = [r for r in res["sampler"] if (r["B"], r["K"], r["V"]) == GOAL]
    std = {(r["q"], r["dtype"]): r["triton_ms"] for r in goal if r["method"] == "standard"}
    for r in goal:
        ratio = r["triton_ms"] / std[(r["q"], r["dtype"])] if r["method"] == "block" else None
        out.append(
            f"| {r['q']} | {r['dtype']} | {r['method']} | {_f(r['ref_ms'])} | {_f(r['triton_ms'])} | "
            f"{_f(r['speedup'], 1)} | {_f(r['frac_copy_bw'], 2)} | {'' if ratio is None else _f(ratio, 2)} | "
            f"{_f(r['mean_accepted'], 2)} | {'yes' if r['match_reference'] else 'NO'} |"
        )
    ng = {(r["B"], r["L"]): r for r in res["ngram"]}
    if (256, 8192) in ng:
        out += ["", f"N-gram matcher goal (B = 256, L = 8192, <= 0.5 ms): Triton {_f(ng[(256, 8192)]['triton_ms'], 4)} ms."]
    out += [
        "",
        "## Sampler, full q, every shape",
        "",
        "| B | K | V | dtype | std ref | std triton | std x | std bw | block ref | block triton | block x | block bw "
        "| block/std | greedy triton | greedy x | equal |",
        "|" + "---|" * 16,
        *_sampler_rows(res["sampler"]),
        "",
        "## N-gram matcher (prompt_lookup 2..5, k = 5, int32 contexts)",
        "",
        "| B | L | ref ms | triton ms | speedup | equal |",
        "|---|---|---|---|---|---|",
    ]
    for r in res["ngram"]:
        out.append(
            f"| {r['B']} | {r['L']} | {_f(r['ref_ms'])} | {_f(r['triton_ms'], 4)} | {_f(r['speedup'], 1)} | "
            f"{'yes' if r['match_reference'] else 'NO'} |"
        )
    if res["skipped_sampler"]:
        out += ["", f"Skipped (time budget): {res['skipped_sampler']}"]
    out += ["", f"Total benchmark time: {res['total_s']:.0f} s", ""]
    return "\n".join(out)


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results_dir", type=Path)
    ap.add_argument("--commit", default=None, help="git commit of the benchmarked tree (default: git rev-parse HEAD)")
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop starting new sampler shapes after this many seconds")
    ap.add_argument("--quick", action="store_true", help="only the goal shapes")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_kernels.py needs a CUDA GPU")
    args.commit = args.commit or _git_commit()
    res = run(args)
    md = render(res)
    (args.results_dir / "bench_kernels.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
