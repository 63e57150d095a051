"""Where one decode token's GPU time goes, against the weight roofline (Llama shapes, random bf16, batch 1).

For each shape (random weights built from a LlamaConfig, as in ``bench_shapes.py``), after a 32-token prefill:

* the weight roofline: bytes a 1-token forward reads / the measured device-to-device copy bandwidth;
* the GPU time of one CUDA-graph replay of the static runner's 1-token forward (what method none runs per token),
  uncompiled, and with ``--compile`` the ``StaticRunner(compile=True)`` forward (inductor inside the graph);
* that replay's kernels by kind (torch.profiler, CUDA activity): GEMM/GEMV, attention, norm, rotary, cache writes,
  other elementwise; count, ms and share, and the top kernels by time;
* the GEMV floor: every ``nn.Linear`` of the model, in model order, run alone as ``torch.nn.functional.linear`` on one
  row inside one CUDA graph (each weight read once per replay, so no weight sits in L2 between uses), timed by
  replays; per weight shape its time and achieved bandwidth. The floor is what the forward would cost if only its
  matrix-vector products ran at cuBLAS's own speed: roofline -> floor is the GEMVs' own shortfall, floor -> forward
  is everything else (attention over the static cache, norms, rotary, the many small kernels between GEMVs).

Writes OUT/roofline.json and OUT/roofline.md (date, device, commit). ``--dry-run``: tiny shapes on the CPU (the code
path only: no graphs, no profiler), for CI.

    python3 benchmarks/roofline.py --out $OUT --shapes 8b,1b --compile 8b --commit abc1234
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_shapes import DRY_SHAPES, PROMPT_LEN, SHAPES, build, copy_bandwidth, weight_bytes_per_token  # noqa: E402

from specviz.static_runner import StaticRunner  # noqa: E402

# kernel name fragments -> kind (first match wins; inductor names its fused kernels after the ops they fuse)
KINDS = (
    ("attention", ("flash", "fmha", "attention", "attn", "sdpa", "softmax", "_efficient")),
    ("gemm/gemv", ("gemm", "gemv", "cutlass", "xmma", "nvjet", "cublas", "splitk", "_mm_", "tem_fused", "addmm", "bmm")),
    ("norm", ("rsqrt", "rms", "norm", "mean")),
    ("rotary", ("rope", "rotary", "cos", "sin")),
    ("cache write", ("index_put", "index_copy", "scatter")),
)


def kind_of(name: str) -> str:
    """The kind of a CUDA kernel from its name (:data:`KINDS`), else "other elementwise"."""
    low = name.lower()
    return next((kind for kind, parts in KINDS if any(p in low for p in parts)), "other elementwise")


def kernel_breakdown(fn, device: torch.device, top: int = 10) -> dict | None:
    """Kernels of one call of ``fn`` by kind: {kind: {"count", "ms"}}, total ms, and the ``top`` kernels by time
    (name, count, ms). None off CUDA; {"error"} if the profiler fails (the benchmark goes on)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    try:
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and not e.name.startswith(("Memcpy", "Memset"))]
    except Exception as exc:  # noqa: BLE001 - a profiler problem must not lose the other figures
        return {"error": f"{type(exc).__name__}: {exc}"}
    kinds: dict[str, dict] = defaultdict(lambda: {"count": 0, "ms": 0.0})
    names: dict[str, dict] = defaultdict(lambda: {"count": 0, "ms": 0.0})
    for e in kernels:
        ms = e.time_range.elapsed_us() / 1e3
        for bucket in (kinds[kind_of(e.name)], names[e.name[:90]]):
            bucket["count"] += 1
            bucket["ms"] += ms
    total = sum(v["ms"] for v in kinds.values())
    ranked = sorted(names.items(), key=lambda kv: -kv[1]["ms"])[:top]
    return {"total_ms": total, "kernels": len(kernels), "kinds": dict(kinds),
            "top": [{"name": n, **v} for n, v in ranked]}


def replay_ms(graph: "torch.cuda.CUDAGraph", repeats: int) -> float:
    """Median GPU ms of one replay of ``graph`` (CUDA events around each replay)."""
    times = []
    for _ in range(repeats + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times[2:])


def fused_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The weights a fused forward multiplies (:mod:`specviz.fused_layers`): per layer q|k|v, o, gate|up, down, then
    the LM head; built by concatenation here (the model itself is left as it is)."""
    out = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        out += [torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]), a.o_proj.weight,
                torch.cat([m.gate_proj.weight, m.up_proj.weight]), m.down_proj.weight]
    return out + [model.lm_head.weight]


def gemv_floor(weights: list[torch.Tensor], device: torch.device, repeats: int) -> dict | None:
    """Every weight [out, in] of ``weights`` (model order) times one row, captured in one CUDA graph; the replay's
    median ms (the floor) and, per weight shape, its count, ms (one graph per shape, same method) and GB/s."""
    if device.type != "cuda":
        return None
    dtype = weights[0].dtype
    rows = {n: torch.randn(1, n, device=device, dtype=dtype) for n in {w.shape[1] for w in weights}}

    def captured(ws) -> "torch.cuda.CUDAGraph":
        run = lambda: [torch.nn.functional.linear(rows[w.shape[1]], w) for w in ws]  # noqa: E731
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.inference_mode():
            run()  # cuBLAS picks and allocates its workspace outside the capture
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g), torch.inference_mode():
            run()
        return g

    out = {"floor_ms": replay_ms(captured(weights), repeats), "count": len(weights), "shapes": []}
    by_shape = defaultdict(list)
    for w in weights:
        by_shape[tuple(w.shape)].append(w)
    for shape, ws in sorted(by_shape.items(), key=lambda kv: -kv[0][0] * kv[0][1] * len(kv[1])):
        ms = replay_ms(captured(ws), repeats)
        nbytes = sum(w.numel() * w.element_size() for w in ws)
        out["shapes"].append({"shape": list(shape), "count": len(ws), "ms": ms, "GBps": nbytes / ms / 1e6})
    return out


def runner_profile(model, device, compile: bool, repeats: int, dry: bool, fused: bool | None = None) -> dict:
    """The static runner's 1-token forward after a prefill: its replay's GPU ms and kernel breakdown. ``fused``:
    StaticRunner's argument (None: its default, fused on CUDA; fusing changes ``model`` in place)."""
    t0 = time.perf_counter()
    runner = StaticRunner(model, max_cache_len=PROMPT_LEN + 64, compile=compile,
                          compile_backend="eager" if dry else "inductor", fused=fused)
    prompt = torch.randint(0, model.config.vocab_size, (PROMPT_LEN,), generator=torch.Generator().manual_seed(0))
    runner.forward(prompt.to(device))
    one = prompt[-1:].to(device)

    def step():
        runner.forward(one)
        runner.truncate(PROMPT_LEN)

    step()  # the capture (and with compile=True the compilation) happens here, outside every figure below
    out = {"compile": compile, "compiled": runner.compiled, "fused": runner.fused, "setup_s": time.perf_counter() - t0}
    if device.type == "cuda" and runner.cuda_graphs:
        runner.graph_events = []
        for _ in range(repeats + 2):
            step()
        events, runner.graph_events = runner.graph_events[2:], None
        torch.cuda.synchronize()
        out["replay_ms"] = statistics.median(s.elapsed_time(e) for s, e in events)
        out["profile"] = kernel_breakdown(step, device)
    del runner
    return out


def run_shape(name: str, cfg: dict, device, dtype, args, copy_gbps: float) -> dict:
    print(f"\n## {name}", flush=True)
    model = build(cfg, device, dtype, 0)
    wbytes = weight_bytes_per_token(model)
    res = {"shape": name, "weight_bytes_per_token": wbytes, "roofline_ms": wbytes / (copy_gbps * 1e9) * 1e3,
           "gemv": gemv_floor([m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)], device,
                              args.repeats),
           "gemv_fused": gemv_floor(fused_weights(model), device, args.repeats), "runners": []}
    print(f"weights {wbytes / 1e9:.2f} GB/token -> roofline {res['roofline_ms']:.3f} ms/token; GEMV floor "
          f"{res['gemv'] and res['gemv']['floor_ms']}, fused {res['gemv_fused'] and res['gemv_fused']['floor_ms']}",
          flush=True)
    # transformers' layers first: the default runner fuses the model's layers in place
    variants = [(False, False), (False, None)] + ([(True, None)] if name in args.compile else [])
    for compile, fused in variants:
        r = runner_profile(model, device, compile, args.repeats, args.dry_run, fused)
        res["runners"].append(r)
        print(f"runner compile={compile} fused={r['fused']}: "
              f"{json.dumps({k: v for k, v in r.items() if k != 'profile'})}", flush=True)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def _pct(part: float | None, whole: float | None) -> str:
    return "–" if not part or not whole else f"{100 * part / whole:.0f}%"


def render(result: dict) -> str:
    out = [f"# Decode-token GPU time against the weight roofline ({result['date']}, {result['device']}, commit "
           f"{result['commit']})", "", f"Copy bandwidth {result['copy_GBps']:.0f} GB/s (read + write, 2 GiB "
           "device-to-device). Roofline = weight bytes per token / that bandwidth. One CUDA-graph replay of the static "
           "runner's 1-token forward after a 32-token prefill; the GEMV floor runs only the model's Linears "
           "(F.linear on one row, one graph).", ""]
    for s in result["shapes"]:
        g, roof = s["gemv"], s["roofline_ms"]
        out += [f"## {s['shape']}: {s['weight_bytes_per_token'] / 1e9:.2f} GB per token, roofline {roof:.3f} ms", ""]
        for what, g in (("transformers' Linears", g), ("fused weights (q|k|v, gate|up)", s.get("gemv_fused"))):
            if not g:
                continue
            out += [f"GEMV floor, {what}: {g['floor_ms']:.3f} ms for {g['count']} weights ({_pct(roof, g['floor_ms'])}"
                    " of roofline speed)", "", "| weight [out, in] | count | ms | GB/s |", "|---|---|---|---|"]
            out += [f"| {x['shape']} | {x['count']} | {x['ms']:.3f} | {x['GBps']:.0f} |" for x in g["shapes"]]
            out.append("")
        for r in s["runners"]:
            label = "compiled (Inductor traces transformers' layers)" if r["compile"] else (
                "uncompiled, fused layers" if r.get("fused") else "uncompiled, transformers' layers")
            if "replay_ms" not in r:
                out += [f"Runner {label}: no CUDA graphs (CPU)", ""]
                continue
            out += [f"### Runner {label}: replay {r['replay_ms']:.3f} ms = {_pct(roof, r['replay_ms'])} of roofline "
                    f"speed (setup {r['setup_s']:.0f} s, compiled: {r['compiled']})", ""]
            p = r.get("profile") or {}
            if "error" in p:
                out += [f"profiler failed: {p['error']}", ""]
                continue
            out += [f"{p['kernels']} kernels, {p['total_ms']:.3f} ms of kernel time", "",
                    "| kind | kernels | ms | share |", "|---|---|---|---|"]
            out += [f"| {k} | {v['count']} | {v['ms']:.3f} | {_pct(v['ms'], p['total_ms'])} |"
                    for k, v in sorted(p["kinds"].items(), key=lambda kv: -kv[1]["ms"])]
            out += ["", "| top kernel | calls | ms |", "|---|---|---|"]
            out += [f"| `{t['name']}` | {t['count']} | {t['ms']:.3f} |" for t in p["top"]]
            out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="8b,1b", help="comma-separated: 8b, 1b")
    ap.add_argument("--compile", default="", help="shapes to profile also with StaticRunner(compile=True)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU: the code path only")
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.dry_run or not torch.cuda.is_available() else "cuda")
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    shapes = DRY_SHAPES if args.dry_run else {n: SHAPES[n] for n in args.shapes.split(",")}
    args.compile = set(DRY_SHAPES) if args.dry_run and args.compile else set(filter(None, args.compile.split(",")))
    copy_gbps = copy_bandwidth(device, args.dry_run)
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "commit": args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                                       text=True).stdout.strip() or "unknown", "copy_GBps": copy_gbps, "shapes": []}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, cfg in shapes.items():
        result["shapes"].append(run_shape(name, cfg, device, dtype, args, copy_gbps))
        (out / "roofline.json").write_text(json.dumps(result, indent=1))  # a timeout keeps the shapes done
    (out / "roofline.md").write_text(render(result))
    print(render(result))
    return result


if __name__ == "__main__":
    main()
