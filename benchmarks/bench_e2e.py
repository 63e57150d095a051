"""End-to-end decoding speed, side by side in one process: HF generate vs specviz.

Rows: HF generate (plain), HF assisted (assistant_model), HF prompt lookup
(prompt_lookup_num_tokens), and specviz methods (``--methods``: none / ngram / ngram_gpu / suffix /
draft_model / eagle / eagle3; the bundled EAGLE heads with the bundled target) with the runners of
``--runners``: eager, static (CUDA graphs) and static+compile (the static runner with
``compile=True``: torch.compile'd forwards inside its graphs), each with the detailed trace on and
off. Reports medians over repeats of tokens/s and wall ms per verification step, the mean
acceptance length, whether the greedy output equals HF's plain greedy output token for token, and
for every static+compile row its tokens/s over the same row without compile (measured in the same
run; the first request of a compiled decoder, which compiles, is a warm-up and not timed).

    python benchmarks/bench_e2e.py --out results/e2e            # on the GPU machine
    python benchmarks/bench_e2e.py --device cpu --smoke         # a quick check anywhere

Models: the bundled demo target/draft, and (unless --smoke) a randomly initialised ~0.9 B Llama
used with itself as draft (an all-accept upper bound) and with ngram on a repetitive prompt.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz import SpecDecoder  # noqa: E402
from specviz.loading import bundled_heads  # noqa: E402
from specviz.models import DEFAULT_DRAFT, DEFAULT_TARGET  # noqa: E402

RUNNERS = ("eager", "static", "static+compile")

# The demo models' greedy continuation of this prompt runs 256+ tokens before any EOS (checked on
# CPU); the first H200 run used "import os\nimport sys\n\ndef main():\n", whose greedy
# continuation is EOS at once, so with EOS disabled it measured text past the end of a document.
# The v1 prompt ended with a bare newline; the v2 family's greedy continuation of it is EOS at once (an H200
# run gave every row 1 token), so the prompt now ends at a token boundary as the app's examples do.
DEMO_PROMPT = ("class LlamaDecoderLayer(nn.Module):\n    def __init__(self, config, layer_idx):\n"
               "        super().__init__()\n        self.hidden_size = config.hidden_size\n"
               "        self.self_attn = LlamaAttention(config=config, layer_idx=layer_idx)\n"
               "        self.mlp = LlamaMLP(config)\n\n"
               "    def forward(self, hidden_states, attention_mask=None, position_ids=None):")
REPETITIVE = "def f(x):\n    return x + 1\n\n" * 12 + "def f(x):\n"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats, warm=True):
    """Median wall seconds of fn() over repeats (after one warm-up unless ``warm`` is False), and its last result."""
    out = fn() if warm else None
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


class GcTimer:
    """The garbage collector's collections (per generation) and their seconds while installed (``gc.callbacks``):
    ``with GcTimer() as g: ...``."""

    def __init__(self):
        self.count, self.seconds, self._t0 = [0, 0, 0], 0.0, None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0
            self.count[info["generation"]] += 1
            self._t0 = None

    def __enter__(self) -> "GcTimer":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)


def hf_rows(dec, draft_model, prompt, max_new, repeats):
    model, device = dec.target_model, dec.device
    ids = torch.tensor([dec.encode(prompt)], device=device)
    base = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                pad_token_id=dec.tokenizer.pad_token_id or 0)  # stops at EOS, like specviz
    variants = {"hf plain": {}, "hf prompt_lookup (10)": {"prompt_lookup_num_tokens": 10}}
    if draft_model is not None:
        variants["hf assistant_model"] = {"assistant_model": draft_model}
    rows, reference = [], None
    for name, extra in variants.items():
        sec, out = timed(lambda: model.generate(ids, **base, **extra), device, repeats)
        tokens = out[0, ids.shape[1]:].tolist()
        reference = reference or tokens
        rows.append({"name": name, "tok_s": len(tokens) / sec, "ms_per_step": None, "tokens": len(tokens),
                     "mean_acceptance_length": None, "equal_to_hf_greedy": tokens == reference,
                     "first_difference": first_difference(model, ids, tokens, reference)})
        print_row(rows[-1])
    return rows, reference


def first_difference(model, prompt_ids, tokens: list[int], reference: list[int]) -> dict | None:
    """Where ``tokens`` first differs from the HF greedy ``reference``, and the margin there: the
    gap between the two largest target logits after the common prefix, from one eager forward in
    the model's dtype (a gap of a few bf16 ulps is a near-tie that batched verification may break
    the other way; docs/design/algorithms.md). None if equal."""
    if tokens == reference:
        return None
    i = next((j for j, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))
    prompt = prompt_ids.view(-1).tolist() if torch.is_tensor(prompt_ids) else list(prompt_ids)
    device = next(model.parameters()).device
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + reference[:i]], device=device)).logits[0, -1]
    top = torch.topk(logits.float(), 2).values.tolist()
    return {"index": i, "ours": tokens[i] if i < len(tokens) else None,
            "hf": reference[i] if i < len(reference) else None, "top2_logit_gap": top[0] - top[1]}


def print_row(r: dict) -> None:
    step = "" if r["ms_per_step"] is None else f"{r['ms_per_step']:7.2f} ms/step"
    if r.get("graph_gpu_ms_per_step") is not None:
        step += f" (graphs {r['graph_gpu_ms_per_step']:.2f} GPU ms)"
    tau = r["mean_acceptance_length"] or float("nan")
    diff = r.get("first_difference")
    eq = "True" if diff is None else f"False (first at {diff['index']}, top-2 logit gap {diff['top2_logit_gap']:.4f})"
    print(f"{r['name']:<48} {r['tok_s']:9.1f} tok/s {step:>16}  tau={tau:.2f}  equal={eq}", flush=True)


def graph_gpu_ms(dec) -> float | None:
    """GPU time (ms) of every CUDA-graph replay of the last request: the target's and the drafter's
    forwards (StaticRunner) and the captured verification step (StepVerifier: probs, sampler,
    record), from the CUDA events recorded around each replay; None when nothing was captured."""
    objs = [dec.target_runner, dec.step_verifier]
    if hasattr(dec.current_proposer, "runner"):
        objs.append(dec.current_proposer.runner)
    events = [e for r in objs for e in (getattr(r, "graph_events", None) or [])]
    if not events:
        return None
    torch.cuda.synchronize()
    return sum(start.elapsed_time(end) for start, end in events)


def _set_timers(dec, armed: bool) -> None:
    """Arm (a fresh event list each) or disarm the CUDA-event timers of every pooled runner and verifier."""
    for r in dec.pool.objects():  # the free ones: between requests, that is every one
        if hasattr(r, "graph_events"):
            r.graph_events = [] if armed else None


def parse_method(spec: str) -> tuple[str, int, dict, str]:
    """``--methods`` entry -> (method, k, extra settings, row label). ``eagle3`` is a chain of k = 5;
    ``eagle3+tree4x5x24`` an EAGLE-2 dynamic tree (top_k 4, depth 5, 24 nodes; k = depth + 1);
    ``draft_model+choices`` a static ``speculative_token_tree`` (``STATIC_TREE``); ``eagle3+k7`` a chain of k = 7."""
    method, _, variant = spec.partition("+")
    if not variant:
        return method, 1 if method == "none" else 5, {}, method
    if variant[:1] == "k" and variant[1:].isdigit():
        return method, int(variant[1:]), {}, spec
    if variant.startswith("tree"):
        top_k, depth, total = (int(x) for x in variant[len("tree"):].split("x"))
        return method, depth + 1, {"eagle_tree_top_k": top_k, "eagle_tree_depth": depth,
                                   "eagle_tree_total_tokens": total}, spec
    if variant == "choices":
        return method, 5, {"speculative_token_tree": STATIC_TREE}, spec
    raise SystemExit(f"unknown method variant {spec!r}: use METHOD, METHOD+treeKxDxN or METHOD+choices")


# A static tree of 12 nodes, depth 4: two children at the root and below the first child, chains under the best.
STATIC_TREE = str([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0),
                   (0, 0, 0, 0), (0, 0, 0, 1), (0, 1, 0, 0)])


def specviz_rows(dec, prompt, max_new, repeats, reference, methods, label):
    """Two rows per method (detailed trace on, off), timed INTERLEAVED: after one warm-up run of each, ``repeats``
    rounds, each running every method's pair (on, off) back to back, so all rows see the same machine state (a
    phase of a slower host hits every row of a round, not one row's runs). Each row's tok/s is from its median
    time; the trace-on row also carries ``tracing_cost_paired`` = 1 - the median of the pairs' off/on time ratios.
    ``gc_ms``: the garbage collector's time during the row's timed runs (:class:`GcTimer`)."""
    kws = {}
    for method, k, extra, name in methods:  # HF and specviz both stop at EOS: outputs are compared whole
        for detailed in (True, False):
            kw = dict(method=method, num_speculative_tokens=k, max_new_tokens=max_new, detailed_trace=detailed, **extra)
            if method in ("ngram", "ngram_gpu"):
                kw.update(prompt_lookup_min=2, prompt_lookup_max=4)
            kws[name, detailed] = kw
            dec.generate(prompt, **kw)  # warm-up
    times = {key: [] for key in kws}
    gc_s = {key: 0.0 for key in kws}
    traces = {}
    for _ in range(repeats):
        for key in kws:
            with GcTimer() as collected:
                sec, traces[key] = timed(lambda: dec.generate(prompt, **kws[key]), dec.device, 1, warm=False)
            times[key].append(sec)
            gc_s[key] += collected.seconds
    rows = []
    for method, k, extra, name in methods:
        ratios = [off / on for on, off in zip(times[name, True], times[name, False])]
        for detailed in (True, False):
            key = (name, detailed)
            trace, sec = traces[key], statistics.median(times[key])
            steps = len(trace.steps)
            gpu = None
            if dec.device.type == "cuda" and label.startswith("static"):
                _set_timers(dec, True)
                trace = dec.generate(prompt, **kws[key])  # one more run with CUDA events around the graphs
                gpu = graph_gpu_ms(dec)
                _set_timers(dec, False)
            rows.append({"name": f"specviz {label} {name} k={k} trace={'on' if detailed else 'off'}",
                         "runner": label, "method": name, "k": k, "trace": detailed,
                         "compiled": bool(getattr(dec.target_runner, "compiled", False)),
                         "tok_s": len(trace.output_token_ids) / sec, "ms_per_step": 1e3 * sec / steps,
                         "times_s": [round(t, 5) for t in times[key]], "gc_ms": round(gc_s[key] * 1e3, 2),
                         "graph_gpu_ms_per_step": None if gpu is None else gpu / len(trace.steps),
                         "tokens": len(trace.output_token_ids),
                         "mean_acceptance_length": trace.metrics["mean_acceptance_length"],
                         "equal_to_hf_greedy": trace.output_token_ids == reference,
                         "first_difference": first_difference(dec.target_model, dec.encode(prompt),
                                                              trace.output_token_ids, reference)})
            if detailed:
                rows[-1]["tracing_cost_paired"] = 1 - statistics.median(ratios)
            print_row(rows[-1])
    return rows


def run_suite(title, target, draft, device, prompt, max_new, repeats, methods, runners=RUNNERS, save=None):
    """HF rows, then every runner's rows; ``save(partial suite)`` after each block (a timeout keeps them)."""
    print(f"\n## {title}", flush=True)
    heads = ({k: str(v) for k, v in bundled_heads().items() if v.exists()}
             if Path(target).resolve() == DEFAULT_TARGET.resolve() else None)
    methods = [m for m in methods if m[0] in ("none", "ngram", "ngram_gpu", "suffix", "draft_model")
               or m[0] in (heads or {})]  # a method whose head is not bundled: no row
    eager = SpecDecoder.from_pretrained(target, draft, device=device, runner="eager", heads=heads)
    rows, reference = hf_rows(eager, eager.draft_model, prompt, max_new, repeats)
    if "eager" in runners:
        rows += specviz_rows(eager, prompt, max_new, repeats, reference, methods, "eager")
    for label in (r for r in runners if r.startswith("static")):
        compiled = label == "static+compile"
        static = SpecDecoder.from_pretrained(target, draft, device=device, runner="static", heads=heads,
                                             max_cache_len=len(eager.encode(prompt)) + max_new + 64, compile=compiled)
        t0 = time.perf_counter()
        for method, k, extra, _ in methods:  # not timed: the first request of each method compiles (and captures)
            static.generate(prompt, method=method, num_speculative_tokens=k, max_new_tokens=16, **extra)
        print(f"{label}: first requests (compilation, capture) took {time.perf_counter() - t0:.1f} s", flush=True)
        gc.collect()
        gc.freeze()  # as SpecDecoder.warm_up does: no full collection walks the compiled decoder's heap in a timed run
        rows += specviz_rows(static, prompt, max_new, repeats, reference, methods, label)
        if save is not None:
            save({"title": title, "rows": rows, "partial": True})
        del static
    assisted = next((r["tok_s"] for r in rows if r["name"] == "hf assistant_model"), None)
    by = {r["name"]: r for r in rows}
    for r in rows:
        r["vs_hf_assistant"] = r["tok_s"] / assisted if assisted else None
        plain = by.get(r["name"].replace("specviz static+compile ", "specviz static ", 1))
        if r.get("runner") == "static+compile" and plain is not None:
            r["compile_speedup"] = r["tok_s"] / plain["tok_s"]  # the same row without compile, same run
            print(f"{r['name']}: {r['compile_speedup']:.2f}x the tokens/s without compile "
                  f"(compile {'on' if r['compiled'] else 'FELL BACK to eager'})", flush=True)
    return {"title": title, "rows": rows}


def random_llama(path: Path, device) -> Path:
    """A randomly initialised ~0.9 B Llama (saved once) sharing the demo tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if not (path / "config.json").exists():
        tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                          num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=2048,
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        torch.manual_seed(0)
        with torch.device(device):  # initialising 0.9 B parameters on the CPU takes a while
            LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
        tok.save_pretrained(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--no-big", action="store_true", help="skip the random 0.9B Llama")
    ap.add_argument("--only-big", action="store_true", help="only the random 0.9B Llama")
    ap.add_argument("--methods", default="none,ngram,draft_model", help="comma-separated specviz methods (k = 5)")
    ap.add_argument("--runners", default="eager,static,static+compile",
                    help=f"comma-separated specviz runners, of {', '.join(RUNNERS)}")
    ap.add_argument("--commit", default=None, help="commit to record (the GPU machine's copy has no .git)")
    ap.add_argument("--target", default=str(DEFAULT_TARGET))
    ap.add_argument("--draft", default=str(DEFAULT_DRAFT))
    args = ap.parse_args()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    max_new, repeats = (24, 1) if args.smoke else (args.max_new, args.repeats)
    methods = [parse_method(m) for m in args.methods.split(",")]
    runners = tuple(args.runners.split(","))
    if set(runners) - set(RUNNERS):
        sys.exit(f"unknown --runners {sorted(set(runners) - set(RUNNERS))}; choose from {', '.join(RUNNERS)}")
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                           text=True).stdout.strip()
    result = {"date": date.today().isoformat(), "commit": commit, "device": str(device),
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "max_new_tokens": max_new, "repeats": repeats, "suites": []}
    jobs = []
    if not args.only_big:
        jobs.append((f"target {args.target}, draft {args.draft}", args.target, args.draft, DEMO_PROMPT))
    if not args.smoke and not args.no_big:
        big = random_llama(Path("/tmp/specviz-llama-0.9b"), device)
        jobs.append(("random 0.9B Llama, draft = itself", big, big, REPETITIVE))
    for title, target, draft, prompt in jobs:
        def save(partial, done=list(result["suites"])):
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                (Path(args.out) / "bench_e2e.json").write_text(json.dumps({**result, "suites": done + [partial]}, indent=1))

        suite = run_suite(title, target, draft, device, prompt, max_new, repeats, methods, runners, save)
        suite["goals"] = goals(suite["rows"])
        short = [r["name"] for r in suite["rows"] if r.get("tokens") is not None and r["tokens"] < max_new]
        if short:  # e.g. EOS right after the prompt: per-step figures of a few tokens are not a decode benchmark
            suite["stopped_early"] = short
            print(f"WARNING: {len(short)} rows stopped before {max_new} tokens (EOS): {short[:3]}", flush=True)
        print(json.dumps(suite["goals"], indent=1), flush=True)
        result["suites"].append(suite)
        if args.out:  # after every suite, so a timeout keeps what finished
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / "bench_e2e.json").write_text(json.dumps(result, indent=1))
            print(f"wrote {out / 'bench_e2e.json'}", flush=True)


def goals(rows: list[dict]) -> dict:
    """The issue's three ratios, for every static-runner method: tokens/s with tracing on over HF
    assisted generation's, the cost of tracing (1 - on/off tokens/s), wall over GPU time per step."""
    by = {r["name"]: r for r in rows}
    assisted = by.get("hf assistant_model", {}).get("tok_s")
    out = {}
    for r in rows:
        if not str(r.get("runner", "")).startswith("static") or not r["trace"]:
            continue
        off = by[r["name"][: -len("on")] + "off"]
        key = r["name"][len("specviz "): -len(" trace=on")]  # e.g. "static ngram k=5", "static+compile none k=1"
        gpu_on, gpu_off = r.get("graph_gpu_ms_per_step"), off.get("graph_gpu_ms_per_step")
        out[key] = {
            "vs_hf_assistant_trace_on": None if not assisted else round(r["tok_s"] / assisted, 2),
            "tracing_cost": round(1 - r["tok_s"] / off["tok_s"], 3),
            "tracing_cost_paired": None if "tracing_cost_paired" not in r else round(r["tracing_cost_paired"], 3),
            "wall_over_gpu_trace_on": None if not gpu_on else round(r["ms_per_step"] / gpu_on, 2),
            "wall_over_gpu_trace_off": None if not gpu_off else round(off["ms_per_step"] / gpu_off, 2),
            "equal_to_hf_greedy": r["equal_to_hf_greedy"] and off["equal_to_hf_greedy"],
            "compile_speedup_trace_on": None if "compile_speedup" not in r else round(r["compile_speedup"], 2),
        }
        base = str(r["method"]).partition("+")[0]
        if "+tree" in str(r["method"]):  # a tree's tokens/s over its method's chains' (same runner)
            for trace_row, which in ((r, "on"), (off, "off")):
                chains = [c for c in rows if c.get("runner") == r["runner"] and c["trace"] == trace_row["trace"]
                          and str(c["method"]).partition("+")[0] == base and "+tree" not in str(c["method"])
                          and "+choices" not in str(c["method"])]
                if chains:
                    best = max(chains, key=lambda c: c["tok_s"])
                    out[key][f"tree_over_best_chain_trace_{which}"] = round(trace_row["tok_s"] / best["tok_s"], 3)
                    out[key][f"best_chain_trace_{which}"] = f"k={best['k']}"
                    out[key][f"tree_over_best_chain_paired_trace_{which}"] = _paired(trace_row, best)
                    k5 = next((c for c in chains if c["k"] == 5), None)
                    if k5 is not None:
                        out[key][f"tree_over_chain_k5_trace_{which}"] = round(trace_row["tok_s"] / k5["tok_s"], 3)
                        out[key][f"tree_over_chain_k5_paired_trace_{which}"] = _paired(trace_row, k5)
    return out


def _paired(a: dict, b: dict) -> float | None:
    """Median over the timing rounds of row a's tokens/s over row b's in the same round (specviz_rows times every
    row once per round), or None without per-run times."""
    ta, tb = a.get("times_s") or [], b.get("times_s") or []
    if not ta or len(ta) != len(tb):
        return None
    return round(statistics.median((a["tokens"] / x) / (b["tokens"] / y) for x, y in zip(ta, tb)), 3)


if __name__ == "__main__":
    main()
