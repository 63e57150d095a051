"""Benchmark the Triton kernels against their PyTorch references on a GPU.

Usage: python3 benchmarks/bench_kernels.py RESULTS_DIR [--commit SHA] [--budget-s 300] [--quick]

Measures, side by side in one run (medians of ``triton.testing.do_bench``, which flushes L2
between repeats):
* the device copy bandwidth (a 2 GiB device-to-device copy, bytes read + written / time);
* the rejection sampler, full q, for B x K x V x dtype in {1,8,64,256} x {1,4,8} x
  {32000,128256,151936} x {fp32,bf16}, methods standard, block and greedy: reference vs Triton,
  the bytes the sampler must read per second (see ``must_read_bytes``) against the copy
  bandwidth, and block / standard; plus one-hot q, synthetic and the one-pass block kernel
  (``block_one_pass``: block_two_pass=False, the design before the two-pass one) at the goal shape;
* the n-gram matcher for B x L in {1,64,256} x {1024,8192,32768}: reference vs Triton.
Every Triton result is also checked against the reference (token ids must be equal).
Triton calls are also timed as CUDA-graph replays (GPU time without host overhead) and on the
host alone. Writes RESULTS_DIR/bench_kernels{TAG}.json and .md (date, device, commit).
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
from triton.testing import do_bench, do_bench_cudagraph

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.kernels.ngram_matcher import ngram_match_triton  # noqa: E402
from specviz.kernels.rejection_sampler import rejection_sample_triton  # noqa: E402
from specviz.methods.ngram_gpu.proposer import ngram_match_reference  # noqa: E402
from specviz.sampling import draw_noise, rejection_sample  # noqa: E402

DEVICE = "cuda"  # a smoke test may point this at "cpu" under TRITON_INTERPRET=1
GOAL = (64, 4, 128256)  # B, K, V of the goals
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
RATES = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]


def median_ms(fn, heavy: bool = False) -> float:
    """Median time of fn() in ms; fewer repeats for slow reference calls."""
    return float(do_bench(fn, warmup=5 if heavy else 10, rep=40 if heavy else 60, return_mode="median"))


def graph_ms(fn) -> float | None:
    """Median GPU time of fn() replayed from a CUDA graph (no host launch overhead, no L2 flush);
    None if fn cannot be captured."""
    try:
        return float(do_bench_cudagraph(fn, rep=20, return_mode="median"))
    except Exception:
        return None


def host_us(fn, n: int = 50) -> float:
    """Host (CPU) time per call in microseconds: n calls back to back, then one synchronize."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


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


def same_outputs(ref, tri) -> bool:
    """Every field equal (exact), residual mass and block rho / h to float32 rounding of a sum."""
    exact = ("output_token_ids", "num_accepted", "num_draft", "token_kind", "accepted", "u", "p_draft", "q_draft", "accept_prob")
    ok = all(torch.equal(getattr(ref, f), getattr(tri, f)) for f in exact)
    close = [(ref.residual_mass, tri.residual_mass)]
    if ref.block is not None:
        ok &= torch.equal(ref.block.P, tri.block.P) and torch.equal(ref.block.tau, tri.block.tau)
        close += [(ref.block.rho, tri.block.rho), (ref.block.h, tri.block.h)]
    return bool(ok and all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in close))


def bench_sampler_case(B, K, V, dtype_name, full, methods, copy_GBps) -> list[dict]:
    dtype = DTYPES[dtype_name]
    recs = []
    for label in methods:  # "block_one_pass": block with the one-pass kernel (block_two_pass=False)
        method = "block" if label == "block_one_pass" else label
        variant = {"block_two_pass": False} if label == "block_one_pass" else {}
        p, q, ids, noise = make_sampler_inputs(B, K, V, dtype, full, method)
        rates = RATES[:K] if method == "synthetic" else None
        kw = dict(method=method, noise=noise, synthetic_rates=rates)
        ref = rejection_sample(p, q, ids, backend="reference", **kw)
        tri = rejection_sample_triton(p, q, ids, **kw, **variant)
        match = same_outputs(ref, tri)
        heavy = B * (K + 1) * V > 2e7
        t_ref = median_ms(lambda: rejection_sample(p, q, ids, backend="reference", **kw), heavy=heavy)
        call = lambda: rejection_sample_triton(p, q, ids, **kw, **variant)  # noqa: E731
        t_tri, t_graph, t_host = median_ms(call), graph_ms(call), host_us(call)
        nbytes = must_read_bytes(ref, V, p.element_size(), q.element_size() if full else 0, full, method)
        gbps = nbytes / t_tri / 1e6
        recs.append(
            dict(B=B, K=K, V=V, dtype=dtype_name, q="full" if full else "onehot", method=label,
                 ref_ms=t_ref, triton_ms=t_tri, speedup=t_ref / t_tri, must_read_bytes=nbytes,
                 triton_GBps=gbps, frac_copy_bw=gbps / copy_GBps, match_reference=match,
                 triton_graph_ms=t_graph, host_us=t_host,
                 frac_copy_bw_graph=None if t_graph is None else nbytes / t_graph / 1e6 / copy_GBps,
                 mean_accepted=float(ref.num_accepted.float().mean()))
        )  # fmt: skip
        del p, q, ids, noise, ref, tri
    return recs


def sweep_launch_configs(copy_GBps: float) -> list[dict]:
    """GPU time (graph replay) of the pass kernel's block size / warps at the goal shape."""
    B, K, V = GOAL
    recs = []
    for d in DTYPES:
        for method in ("standard", "block"):
            p, q, ids, noise = make_sampler_inputs(B, K, V, DTYPES[d], True, method)
            ref = rejection_sample(p, q, ids, method=method, noise=noise)
            nbytes = must_read_bytes(ref, V, p.element_size(), q.element_size(), True, method)
            for bv, nw in ((2048, 4), (4096, 4), (4096, 8), (8192, 8), (8192, 16)):
                call = lambda: rejection_sample_triton(p, q, ids, method=method, noise=noise, block_v=bv, num_warps=nw)  # noqa: E731
                tri = call()
                ok = bool(torch.equal(tri.output_token_ids, ref.output_token_ids))
                t = graph_ms(call)
                recs.append(dict(dtype=d, method=method, block_v=bv, num_warps=nw, triton_graph_ms=t, match_reference=ok,
                                 frac_copy_bw_graph=None if t is None else nbytes / t / 1e6 / copy_GBps))  # fmt: skip
            del p, q, ids, noise
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
    t_graph = graph_ms(lambda: ngram_match_triton(ids, lengths, **kw))
    return dict(B=B, L=L, ref_ms=t_ref, triton_ms=t_tri, speedup=t_ref / t_tri, match_reference=match,
                triton_graph_ms=t_graph, **kw)  # fmt: skip


def run(args) -> dict:
    """The whole benchmark; the JSON is rewritten after every shape, so a killed run keeps data."""
    t_start = time.time()
    args.results_dir.mkdir(parents=True, exist_ok=True)
    save = lambda: (args.results_dir / f"bench_kernels{args.tag}.json").write_text(json.dumps(res, indent=1))  # noqa: E731
    res = {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    res.update(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, commit=args.commit)
    res["copy"] = copy_bandwidth()
    copy_GBps = res["copy"]["copy_GBps"]
    print(f"copy bandwidth {copy_GBps:.0f} GB/s", flush=True)
    shapes = [(b, k, v, d) for d in DTYPES for v in (128256, 32000, 151936) for b in (64, 1, 8, 256) for k in (4, 1, 8)]
    shapes.sort(key=lambda s: (s[:3] != GOAL, s[3]))  # goal shapes first
    if args.quick:
        shapes = [(*GOAL, d) for d in DTYPES]
    res["sampler"], res["skipped_sampler"] = [], []
    for B, K, V, d in shapes:
        if time.time() - t_start > args.budget_s:
            res["skipped_sampler"].append([B, K, V, d])
            continue
        methods = ("standard", "block", "greedy")
        res["sampler"] += bench_sampler_case(B, K, V, d, True, methods, copy_GBps)
        if (B, K, V) == GOAL:
            res["sampler"] += bench_sampler_case(B, K, V, d, False, methods + ("synthetic",), copy_GBps)
            res["sampler"] += bench_sampler_case(B, K, V, d, True, ("synthetic", "block_one_pass"), copy_GBps)
        last = res["sampler"][-1]
        print(f"sampler B={B} K={K} V={V} {d}: {time.time() - t_start:.0f}s ({last['speedup']:.1f}x)", flush=True)
        torch.cuda.empty_cache()
        save()
    if args.quick:
        res["sweep"] = sweep_launch_configs(copy_GBps)
        save()
    kw = dict(prompt_lookup_min=2, prompt_lookup_max=5, num_speculative_tokens=5, validate_lengths=False)
    res["ngram"] = [bench_ngram(B, L, kw) for B in (1, 64, 256) for L in (1024, 8192, 32768)]
    res["total_s"] = time.time() - t_start
    save()
    return res


def _f(x: float, nd: int = 3) -> str:
    return f"{x:.{nd}f}"


def _opt(x: float | None, nd: int) -> str:
    return "" if x is None else f"{x:.{nd}f}"


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
        "- ms: medians of triton.testing.do_bench (L2 flushed between repeats), host launch overhead included",
        "- graph ms: median GPU time of the call replayed from a CUDA graph (no host overhead, no L2 flush)",
        "- host us: CPU time per call (50 calls back to back)",
        "- bw = bytes the sampler must read (lower bound, see must_read_bytes) / time, as a fraction of the copy bandwidth",
        "",
        f"## Goal shape B, K, V = {GOAL} (goals: speedup >= 5, bw >= 0.5, block / standard <= 1.3)",
        "",
        "| q | dtype | method | ref ms | triton ms | speedup | bw | block/std | graph ms | bw (graph) "
        "| block/std (graph) | host us | mean accepted | equal |",
        "|" + "---|" * 14,
    ]
    goal = [r for r in res["sampler"] if (r["B"], r["K"], r["V"]) == GOAL]
    std = {(r["q"], r["dtype"]): r for r in goal if r["method"] == "standard"}
    for r in goal:
        s0 = std[(r["q"], r["dtype"])] if r["method"] in ("block", "block_one_pass") else None
        ratio = None if s0 is None else r["triton_ms"] / s0["triton_ms"]
        g, g0 = r.get("triton_graph_ms"), None if s0 is None else s0.get("triton_graph_ms")
        gratio = g / g0 if (g and g0) else None
        out.append(
            f"| {r['q']} | {r['dtype']} | {r['method']} | {_f(r['ref_ms'])} | {_f(r['triton_ms'])} | "
            f"{_f(r['speedup'], 1)} | {_f(r['frac_copy_bw'], 2)} | {_opt(ratio, 2)} | {_opt(g, 4)} | "
            f"{_opt(r.get('frac_copy_bw_graph'), 2)} | {_opt(gratio, 2)} | {_opt(r.get('host_us'), 0)} | "
            f"{_f(r['mean_accepted'], 2)} | {'yes' if r['match_reference'] else 'NO'} |"
        )
    if res.get("sweep"):
        out += ["", "## Launch configurations at the goal shape, full q (GPU time from CUDA graph replay)", "",
                "| dtype | method | block_v | num_warps | graph ms | bw (graph) | equal |", "|---|---|---|---|---|---|---|"]
        for r in res["sweep"]:
            out.append(f"| {r['dtype']} | {r['method']} | {r['block_v']} | {r['num_warps']} | {_opt(r['triton_graph_ms'], 4)} | "
                       f"{_opt(r['frac_copy_bw_graph'], 2)} | {'yes' if r['match_reference'] else 'NO'} |")
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
        "| B | L | ref ms | triton ms | speedup | triton graph ms | equal |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in res["ngram"]:
        out.append(
            f"| {r['B']} | {r['L']} | {_f(r['ref_ms'])} | {_f(r['triton_ms'], 4)} | {_f(r['speedup'], 1)} | "
            f"{_opt(r.get('triton_graph_ms'), 4)} | {'yes' if r['match_reference'] else 'NO'} |"
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
    ap.add_argument("--quick", action="store_true", help="only the goal shapes, plus a launch-config sweep")
    ap.add_argument("--tag", default="", help="suffix of the output file names")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_kernels.py needs a CUDA GPU")
    args.commit = args.commit or _git_commit()
    res = run(args)
    md = render(res)
    (args.results_dir / f"bench_kernels{args.tag}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
