"""Llama-shaped targets on the GPU, side by side in one process.

For random bf16 targets shaped like Llama-3.2-1B and Llama-3.1-8B (built from a LlamaConfig, random
weights, no download) with a random 68M-class draft (2 layers x 512, tied embeddings, the target's
128256-token vocabulary), batch 1, a random 32-token prompt:

* HF ``generate`` (greedy; DynamicCache, and ``cache_implementation="static"``) and specviz method none, tracing on and off: tokens/s and the
  fraction of the HBM roofline, i.e. tok/s over (measured copy bandwidth / weight bytes per token).
  Weight bytes per token = 2 bytes x every parameter a 1-token forward reads: all of them except the
  input embedding table when it is not tied to the LM head (a lookup reads one row of it).
  The copy bandwidth is measured here: a 2 GiB device-to-device copy, (read + written bytes) / median.
* specviz draft_model with verify="synthetic", k = 4, i.i.d. acceptance a in {0.6, 0.8, 0.9}
  (unconditional rates a^i): speedup over method none, against the speedup the measured step costs
  predict: E(a) x t_none / (k t_draft(1) + t_target(k+1) + t_sync - t_target(1)), where
  E(a) = (1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023), t_* the median GPU time of one CUDA-graph
  replay of the static runner's forward of that many tokens, t_none the wall time per step of method none
  (async scheduling, its default on CUDA) and t_sync that of method none with ``async_scheduling=False``
  (so the last two terms are a synchronous step's cost outside the target's forward: a drafting step waits
  for its tokens). Method none is also shown synchronous, beside the default, with the ratio.
* the kernel count and kernel time of one eager 1-token forward and of one graph replay
  (torch.profiler, CUDA activity), both through the fused decoder layers the default runner left the target with.
* specviz method none with transformers' own decoder layers (``StaticRunner(fused=False)``) beside the default
  (fused) runner.
* with ``--compile both`` (the default): the same target and draft again with the static runner's
  ``compile=True`` (torch.compile'd forwards, inductor, inside the runner's CUDA graphs), method none
  (trace on) and draft_model synthetic a = 0.8, beside the uncompiled rows: tokens/s, the ratio to the
  uncompiled row, the 1-token graph replay's GPU time and kernel count, the time of the first
  (compiling, not timed) requests, and whether compile stayed on (a failure falls back to eager).

Medians of ``--repeats`` timed runs after one warm-up. Writes OUT/bench_shapes.json and
OUT/bench_shapes.md (date, device, commit). Sized to finish in about 5 minutes on one H200
(``--quick``: about 2); ``--dry-run`` runs tiny shapes on the CPU in seconds (CI).

    python3 benchmarks/bench_shapes.py --out $OUT --quick --commit abc1234
    python3 benchmarks/bench_shapes.py --out /tmp/x --dry-run
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz import SpecDecoder  # noqa: E402
from specviz.static_runner import StaticRunner  # noqa: E402

LLAMA = dict(vocab_size=128256, num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
             max_position_embeddings=4096, rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=None)
SHAPES = {  # name: target config, as the published Llama configs (head_dim 64 / 128)
    "1b": dict(LLAMA, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, tie_word_embeddings=True),
    "8b": dict(LLAMA, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, tie_word_embeddings=False),
}
DRAFT = dict(LLAMA, hidden_size=512, intermediate_size=2048, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=8, tie_word_embeddings=True)  # about 74 M parameters with 128256 tokens
DRY = dict(vocab_size=512, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
           bos_token_id=None, eos_token_id=None)
DRY_SHAPES = {"dry": dict(DRY, hidden_size=64, intermediate_size=128, num_hidden_layers=2, tie_word_embeddings=False)}
DRY_DRAFT = dict(DRY, hidden_size=32, intermediate_size=64, num_hidden_layers=1, tie_word_embeddings=True)
ACCEPTANCE = (0.6, 0.8, 0.9)
K = 4
PROMPT_LEN = 32


class IdTokenizer:
    """The few tokenizer methods SpecDecoder uses, for models without a tokenizer: ids print as <id>."""

    eos_token_id = None
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(f"<{int(i)}>" for i in ids)


def build(cfg: dict, device: torch.device, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """A LlamaForCausalLM with random weights, built directly on ``device`` in ``dtype``."""
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(LlamaConfig(**cfg))
    finally:
        torch.set_default_dtype(default)
    model.generation_config.eos_token_id = None
    return model.eval()


def weight_bytes_per_token(model: torch.nn.Module) -> int:
    """Bytes of the parameters a 1-token forward reads (the input embedding only if tied to the head)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if emb.data_ptr() != head.data_ptr():
        total -= emb.numel() * emb.element_size()
    return total


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_wall(fn, device, repeats: int) -> tuple[float, object]:
    """Median wall seconds of fn() over ``repeats`` (after one warm-up call) and the last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def copy_bandwidth(device: torch.device, dry: bool) -> float:
    """GB/s of a device-to-device copy (2 GiB on CUDA), read + written bytes over the median time."""
    src = torch.randn(2**18 if dry else 2**29, device=device)
    dst = torch.empty_like(src)
    seconds, _ = median_wall(lambda: dst.copy_(src), device, 5 if dry else 20)
    gbps = 2 * src.numel() * src.element_size() / seconds / 1e9
    del src, dst
    return gbps


def forward_gpu_ms(runner: StaticRunner, n: int, repeats: int) -> float | None:
    """Median GPU ms of one CUDA-graph replay of the runner's n-token forward (None without graphs).
    Each forward is rolled back, so the cache position never moves."""
    if not runner.cuda_graphs or runner.seq_len == 0:
        return None
    base = runner.seq_len
    ids = torch.zeros(n, dtype=torch.long, device=runner.device)
    runner.graph_events = []
    for _ in range(repeats + 2):
        runner.forward(ids)
        runner.truncate(base)
    events, runner.graph_events = runner.graph_events[2:], None
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def kernel_profile(fn, device: torch.device) -> dict | None:
    """Kernel count and summed kernel time (ms) of one call of fn (torch.profiler; memcpy and memset
    not counted); None on the CPU, {"error": ...} if profiling fails (the benchmark goes on)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    try:
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and not e.name.startswith(("Memcpy", "Memset"))]
        return {"kernels": len(kernels), "kernel_ms": sum(e.time_range.elapsed_us() for e in kernels) / 1e3}
    except Exception as exc:  # noqa: BLE001 - a profiler problem must not lose the timings
        return {"error": f"{type(exc).__name__}: {exc}"}


def slope(dec, prompt: list[int], max_new: int, device, repeats: int) -> dict:
    """Method none (trace on) at ``max_new`` and 2 x ``max_new`` tokens: the marginal wall time per token (the
    decode loop alone) and the fixed cost per request (prefill, setup, trace), both ms, medians of ``repeats``."""
    walls = {}
    for n in (max_new, 2 * max_new):
        sec, trace = median_wall(lambda: dec.generate(prompt, method="none", max_new_tokens=n), device, repeats)
        walls[len(trace.output_token_ids)] = sec
    (n1, t1), (n2, t2) = sorted(walls.items())
    per_token = (t2 - t1) / (n2 - n1)
    return {"per_token_ms": 1e3 * per_token, "fixed_ms": 1e3 * (t1 - n1 * per_token), "tokens": [n1, n2]}


def expected_tokens(a: float, k: int) -> float:
    """(1 - a^(k+1)) / (1 - a): tokens per step with i.i.d. acceptance a (Leviathan et al. 2023)."""
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def run_shape(name: str, cfg: dict, draft_cfg: dict, device, dtype, args, copy_gbps: float) -> dict:
    print(f"\n## {name}: building random target and draft", flush=True)
    t0 = time.perf_counter()
    target, draft = build(cfg, device, dtype, 0), build(draft_cfg, device, dtype, 1)
    max_new = args.max_new
    cache = PROMPT_LEN + 2 * max_new + 2 * K + 8  # method none also runs 2 x max_new (the per-token slope)
    dec = SpecDecoder(target, IdTokenizer(), draft, runner_factory=functools.partial(StaticRunner, max_cache_len=cache),
                      names={"target": f"random llama {name}", "draft": "random 74M", "dtype": str(dtype)})
    prompt = torch.randint(0, cfg["vocab_size"], (PROMPT_LEN,), generator=torch.Generator().manual_seed(0)).tolist()
    params = sum(p.numel() for p in target.parameters())
    wbytes = weight_bytes_per_token(target)
    roofline = copy_gbps * 1e9 / wbytes
    res = {"shape": name, "config": {k: v for k, v in cfg.items()}, "target_parameters": params,
           "draft_parameters": sum(p.numel() for p in draft.parameters()), "weight_bytes_per_token": wbytes,
           "roofline_tok_s": roofline, "max_new_tokens": max_new, "build_s": time.perf_counter() - t0, "rows": []}
    print(f"target {params / 1e9:.2f} B parameters, {wbytes / 1e9:.2f} GB per token -> roofline {roofline:.0f} tok/s",
          flush=True)

    def row(label: str, seconds: float, tokens: int, **extra) -> dict:
        r = {"name": label, "tok_s": tokens / seconds, "frac_roofline": tokens / seconds / roofline, **extra}
        res["rows"].append(r)
        print(f"{label:<44} {r['tok_s']:9.1f} tok/s  {100 * r['frac_roofline']:5.1f}% of roofline", flush=True)
        return r

    ids = torch.tensor([prompt], device=device)
    if "hf" in args.parts:
        hf = functools.partial(target.generate, ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=max_new, min_new_tokens=max_new, pad_token_id=0)
        sec, out = median_wall(hf, device, args.repeats)
        row("hf generate", sec, out.shape[1] - ids.shape[1])
        hf_static = functools.partial(hf, cache_implementation="static")  # HF's own StaticCache path
        sec, out = median_wall(hf_static, device, args.repeats)
        row("hf generate static cache", sec, out.shape[1] - ids.shape[1])
    if device.type == "cuda":  # before any default runner: those fuse the target's layers in place
        plain = SpecDecoder(target, IdTokenizer(), None, runner_factory=functools.partial(
            StaticRunner, max_cache_len=cache, fused=False))
        kw = dict(method="none", max_new_tokens=max_new, detailed_trace=True)
        sec, trace = median_wall(lambda: plain.generate(prompt, **kw), device, args.repeats)
        row("specviz none, transformers' layers, trace=on", sec, len(trace.output_token_ids))
        del plain
    none_rows = {}
    for detailed in (True, False):
        kw = dict(method="none", max_new_tokens=max_new, detailed_trace=detailed)
        sec, trace = median_wall(lambda: dec.generate(prompt, **kw), device, args.repeats)
        none_rows[detailed] = row(f"specviz none trace={'on' if detailed else 'off'}", sec,
                                  len(trace.output_token_ids), ms_per_step=1e3 * sec / len(trace.steps))
    res["tracing_cost_none"] = 1 - none_rows[True]["tok_s"] / none_rows[False]["tok_s"]
    kw = dict(method="none", max_new_tokens=max_new, detailed_trace=True, async_scheduling=False)
    sec, trace = median_wall(lambda: dec.generate(prompt, **kw), device, args.repeats)
    sync_row = row("specviz none trace=on async_scheduling=off", sec, len(trace.output_token_ids),
                   ms_per_step=1e3 * sec / len(trace.steps))
    sync_row["async_speedup"] = none_rows[True]["tok_s"] / sync_row["tok_s"]
    res["none_slope"] = slope(dec, prompt, max_new, device, args.repeats)
    row(f"specviz none trace=on, per-token slope ({max_new} -> {2 * max_new} tokens)",
        res["none_slope"]["per_token_ms"] * 1e-3, 1)
    t_none_ms = none_rows[True]["ms_per_step"]
    runner = dec.pool.free(id(target))[0]
    drafter = None
    if "spec" in args.parts:
        for a in ACCEPTANCE:
            rates = [a ** i for i in range(1, K + 1)]
            kw = dict(method="draft_model", verify="synthetic", synthetic_rates=rates, num_speculative_tokens=K,
                      max_new_tokens=max_new, temperature=args.temperature, detailed_trace=True)
            sec, trace = median_wall(lambda: dec.generate(prompt, **kw), device, args.repeats)
            r = row(f"specviz draft_model synthetic a={a} k={K} trace=on", sec, len(trace.output_token_ids),
                    ms_per_step=1e3 * sec / len(trace.steps),
                    mean_acceptance_length=trace.metrics["mean_acceptance_length"], expected_tokens=expected_tokens(a, K))
            r["speedup_vs_none"] = r["tok_s"] / none_rows[True]["tok_s"]
        drafter = dec.pool.free(id(draft))[0]
    reps = max(5, 4 * args.repeats)
    costs = {"target_1": forward_gpu_ms(runner, 1, reps), "target_k1": forward_gpu_ms(runner, K + 1, reps),
             "draft_1": forward_gpu_ms(drafter, 1, reps) if drafter is not None else None, "none_step_wall": t_none_ms}
    res["step_costs_ms"] = costs
    if None not in costs.values():
        overhead = sync_row["ms_per_step"] - costs["target_1"]  # a drafting step waits for its tokens: synchronous
        spec_step = K * costs["draft_1"] + costs["target_k1"] + overhead
        for r in res["rows"]:
            if "expected_tokens" in r:
                r["predicted_speedup"] = r["expected_tokens"] * t_none_ms / spec_step
    one = torch.tensor([[prompt[-1]]], device=device)
    res["profile_eager_forward"] = kernel_profile(lambda: target(input_ids=one), device)
    if runner.cuda_graphs:
        res["profile_graph_forward"] = kernel_profile(lambda: (runner.forward(one[0]), runner.truncate(runner.seq_len - 1)), device)
    print(f"step costs (GPU ms): {costs}; profiles: {res['profile_eager_forward']}, {res.get('profile_graph_forward')}",
          flush=True)
    del dec, runner, drafter
    if args.compile == "both":
        if getattr(args, "save_partial", None):
            args.save_partial(res)  # a timeout during compilation keeps the uncompiled rows
        res["compiled"] = compiled_part(target, draft, prompt, cache, device, args, row, res, none_rows[True])
    del target, draft
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def compiled_part(target, draft, prompt: list[int], cache: int, device, args, row, res: dict, none_on: dict) -> dict:
    """Method none (trace on) and draft_model synthetic a = 0.8 with ``StaticRunner(compile=True)``,
    after the uncompiled rows of the same models; adds rows (ratios to the uncompiled ones) and returns
    the compiled runner's facts. The first requests (compilation and capture) are timed apart."""
    backend = "eager" if args.dry_run else "inductor"  # --dry-run: only the code path, in seconds
    factory = functools.partial(StaticRunner, max_cache_len=cache, compile=True, compile_backend=backend)
    dec = SpecDecoder(target, IdTokenizer(), draft, runner_factory=factory, names={"target": "compiled"})
    rates = [0.8 ** i for i in range(1, K + 1)]
    spec = dict(method="draft_model", verify="synthetic", synthetic_rates=rates, num_speculative_tokens=K,
                temperature=args.temperature, detailed_trace=True)
    t0 = time.perf_counter()
    dec.generate(prompt, method="none", max_new_tokens=8)
    if "spec" in args.parts:
        dec.generate(prompt, max_new_tokens=4 * (K + 1), **spec)
    out = {"backend": backend, "first_requests_s": time.perf_counter() - t0}
    print(f"compiled: first requests (compilation + capture) {out['first_requests_s']:.1f} s", flush=True)
    sec, trace = median_wall(lambda: dec.generate(prompt, method="none", max_new_tokens=args.max_new), device,
                             args.repeats)
    r = row("specviz none trace=on compile=on", sec, len(trace.output_token_ids), ms_per_step=1e3 * sec / len(trace.steps))
    r["speedup_vs_uncompiled"] = r["tok_s"] / none_on["tok_s"]
    runner = dec.pool.free(id(target))[0]
    if "spec" in args.parts:
        sec, trace = median_wall(lambda: dec.generate(prompt, max_new_tokens=args.max_new, **spec), device, args.repeats)
        r2 = row(f"specviz draft_model synthetic a=0.8 k={K} trace=on compile=on", sec, len(trace.output_token_ids),
                 ms_per_step=1e3 * sec / len(trace.steps), mean_acceptance_length=trace.metrics["mean_acceptance_length"],
                 expected_tokens=expected_tokens(0.8, K))
        r2["speedup_vs_none"] = r2["tok_s"] / r["tok_s"]  # over compiled method none
        plain = next((x for x in res["rows"] if x["name"] == f"specviz draft_model synthetic a=0.8 k={K} trace=on"), None)
        r2["speedup_vs_uncompiled"] = r2["tok_s"] / plain["tok_s"] if plain else None
        out["drafter_compiled"] = dec.pool.free(id(draft))[0].compiled
    out["target_compiled"] = runner.compiled  # False: compile failed and fell back to eager (see the log)
    out["target_1_ms"] = forward_gpu_ms(runner, 1, max(5, 4 * args.repeats))
    if runner.cuda_graphs:
        one = torch.tensor([prompt[-1]], device=device)
        out["profile_graph_forward"] = kernel_profile(lambda: (runner.forward(one), runner.truncate(runner.seq_len - 1)),
                                                      device)
    print(f"compiled: {out}", flush=True)
    del dec, runner
    return out


def _f(x, nd=1, pct=False) -> str:
    if x is None:
        return ""
    return f"{100 * x:.{nd}f}%" if pct else f"{x:.{nd}f}"


def render(result: dict) -> str:
    out = ["# Llama-shaped targets: specviz vs HF generate vs the HBM roofline", "",
           f"- date (UTC): {result['date_utc']}; device: {result['device']}; torch {result['torch']}; "
           f"commit {result['commit']}",
           f"- measured copy bandwidth: {result['copy_GBps']:.0f} GB/s; batch 1, bf16, random weights, "
           f"{result['max_new_tokens']} new tokens, median of {result['repeats']} runs",
           "- roofline = copy bandwidth / weight bytes per token; predicted = speedup the measured step costs "
           "predict (see the script's docstring)", ""]
    for s in result["shapes"]:
        c = s["step_costs_ms"]
        out += [f"## {s['shape']}: {s['target_parameters'] / 1e9:.2f} B target, {s['draft_parameters'] / 1e6:.0f} M draft, "
                f"roofline {s['roofline_tok_s']:.0f} tok/s", "",
                "| row | tok/s | % of roofline | ms/step | mean acceptance length | speedup vs none | predicted "
                "| compiled / uncompiled |",
                "|---|---|---|---|---|---|---|---|"]
        for r in s["rows"]:
            out.append(f"| {r['name']} | {r['tok_s']:.1f} | {_f(r['frac_roofline'], 1, True)} | {_f(r.get('ms_per_step'), 2)} | "
                       f"{_f(r.get('mean_acceptance_length'), 2)} | {_f(r.get('speedup_vs_none'), 2)} | "
                       f"{_f(r.get('predicted_speedup'), 2)} | {_f(r.get('speedup_vs_uncompiled'), 2)} |")
        out += ["", f"Tracing cost (method none): {_f(s['tracing_cost_none'], 1, True)}. Step costs, GPU ms per "
                f"graph replay: target 1 token {_f(c['target_1'], 3)}, target {K + 1} tokens {_f(c['target_k1'], 3)}, "
                f"draft 1 token {_f(c['draft_1'], 3)}; method none wall per step {_f(c['none_step_wall'], 3)} ms."]
        if s.get("none_slope"):
            out.append(f"Method none per request: {_f(s['none_slope']['fixed_ms'], 1)} ms fixed (prefill, setup, "
                       "trace) "
                       f"+ {_f(s['none_slope']['per_token_ms'], 3)} ms per token (the slope row).")
        sync = next((r for r in s["rows"] if "async_speedup" in r), None)
        if sync:
            out.append(f"Async scheduling (method none's default on CUDA) over the synchronous loop: "
                       f"{_f(sync['async_speedup'], 2)}x.")
        for label, key in (("eager 1-token forward", "profile_eager_forward"), ("graph replay", "profile_graph_forward")):
            p = s.get(key)
            if p and "error" in p:
                out.append(f"Kernels, {label}: profiler failed ({p['error']}).")
            elif p:
                out.append(f"Kernels, {label}: {p['kernels']} kernels, {p['kernel_ms']:.3f} ms of kernel time.")
        comp = s.get("compiled")
        if comp:
            prof = comp.get("profile_graph_forward") or {}
            out.append(f"Compiled ({comp['backend']}): first requests {comp['first_requests_s']:.1f} s (compilation + "
                       f"capture, not timed); compile stayed on: target {comp['target_compiled']}, drafter "
                       f"{comp.get('drafter_compiled')}; target 1-token graph replay {_f(comp['target_1_ms'], 3)} GPU ms"
                       + (f", {prof['kernels']} kernels, {prof['kernel_ms']:.3f} ms of kernel time" if "kernels" in prof
                          else "") + ".")
        out.append("")
    out.append(f"Total: {result['total_s']:.0f} s")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true", help="fewer repeats and tokens (about 2 minutes on an H200)")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (CI: checks the script runs)")
    ap.add_argument("--only", default=None, help="comma-separated shapes (1b, 8b) and/or parts (hf, none, spec)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--max-new", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=0.0, help="drafting temperature of the synthetic rows")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--compile", choices=("off", "both"), default="both",
                    help="both: also the rows with the static runner's compile=True, beside the uncompiled ones")
    args = ap.parse_args(argv)
    t_start = time.time()
    only = set(args.only.split(",")) if args.only else set()
    shapes = DRY_SHAPES if args.dry_run else {k: v for k, v in SHAPES.items() if not (only & set(SHAPES)) or k in only}
    args.parts = {p for p in ("hf", "none", "spec") if not (only & {"hf", "none", "spec"}) or p in only} | {"none"}
    args.repeats = args.repeats or (1 if args.dry_run else 2 if args.quick else 3)
    args.max_new = args.max_new or (8 if args.dry_run else 64 if args.quick else 128)
    device = torch.device("cpu" if args.dry_run else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_shapes.py needs a CUDA GPU (or --dry-run)")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                           cwd=Path(__file__).parent).stdout.strip() or "unknown"
    result = {"date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"), "commit": commit,
              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "max_new_tokens": args.max_new, "repeats": args.repeats, "shapes": []}
    result["copy_GBps"] = copy_bandwidth(device, args.dry_run)
    print(f"copy bandwidth {result['copy_GBps']:.0f} GB/s", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    args.save_partial = lambda res: (args.out / "bench_shapes.json").write_text(
        json.dumps({**result, "shapes": result["shapes"] + [res], "partial": True}, indent=1))
    draft_cfg = DRY_DRAFT if args.dry_run else DRAFT
    for name, cfg in shapes.items():
        result["shapes"].append(run_shape(name, cfg, draft_cfg, device, dtype, args, result["copy_GBps"]))
        result["total_s"] = time.time() - t_start
        (args.out / "bench_shapes.json").write_text(json.dumps(result, indent=1))  # after every shape
    result["total_s"] = time.time() - t_start
    (args.out / "bench_shapes.json").write_text(json.dumps(result, indent=1))
    md = render(result)
    (args.out / "bench_shapes.md").write_text(md)
    print(md, flush=True)
    return result


if __name__ == "__main__":
    main()
