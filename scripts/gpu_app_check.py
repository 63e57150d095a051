"""The app on a GPU: launch app.py's Blocks on CUDA with the bundled models, drive every
bundled example and every method / verification mode twice through gradio_client (first and second run of each
setting in one fresh app process), and record what the speedup panel reports (the side-by-side measurement in
the exported trace's ``metrics.baseline_none``) plus tokens per target forward and capture time.

    PYTHONPATH=/root/gpu-site python3 scripts/gpu_app_check.py --out $OUT/app_gpu.json

Writes the JSON and a markdown table beside it (``.md``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

STATIC_TREE = "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 0, 0, 0)]"
EXTRA = [  # (name, method, verify, temperature, k, rates): what the examples do not cover
    ("eagle3 greedy", "eagle3", "greedy", 0.0, 4, ""),
    ("eagle greedy", "eagle", "greedy", 0.0, 4, ""),
    ("eagle3 standard T=0.8", "eagle3", "standard", 0.8, 4, ""),
    ("ngram_gpu greedy", "ngram_gpu", "greedy", 0.0, 5, ""),
    ("suffix greedy", "suffix", "greedy", 0.0, 5, ""),
    ("draft_model block T=1", "draft_model", "block", 1.0, 4, ""),
    ("draft_model synthetic (not lossless)", "draft_model", "synthetic", 0.0, 4, "0.9, 0.8, 0.7, 0.6"),
    ("dflash greedy", "dflash", "greedy", 0.0, 7, ""),
    ("medusa greedy", "medusa", "greedy", 0.0, 4, ""),
    ("mtp greedy", "mtp", "greedy", 0.0, 4, ""),
    ("medusa typical T=1 (not distribution-preserving)", "medusa", "typical", 1.0, 4, ""),
    ("eagle3 chain k=6 (beside its tree)", "eagle3", "greedy", 0.0, 6, ""),
    ("eagle3 EAGLE-2 tree 4,5,24", "eagle3", "greedy", 0.0, 6, "", ("4, 5, 24", 0, "")),
    ("eagle3 EAGLE-2 tree 4,6,32", "eagle3", "greedy", 0.0, 7, "", ("4, 6, 32", 0, "")),
    ("eagle3 EAGLE-2 tree 8,5,32 standard T=0.8", "eagle3", "standard", 0.8, 6, "", ("8, 5, 32", 0, "")),
    ("eagle EAGLE-2 tree 4,5,24", "eagle", "greedy", 0.0, 6, "", ("4, 5, 24", 0, "")),
    ("draft_model static tree", "draft_model", "greedy", 0.0, 5, "", ("", 0, STATIC_TREE)),
    ("medusa static tree", "medusa", "greedy", 0.0, 4, "", ("", 0, STATIC_TREE)),
    ("ngram tree, 2 branches", "ngram", "greedy", 0.0, 5, "", ("", 2, "")),
]


def run_args(prompt: str, method: str, verify: str, temp: float, k: int, max_new: int, lo: int, hi: int, seed: int,
             rates: str, tree: tuple | None) -> tuple:
    """The /run endpoint's inputs for one case (a RunRequest's values): top-k and top-p off, measured beside method
    none (3 pairs); ``tree``: (EAGLE-2 tree, branches per node, static tree) or None for a chain."""
    from specviz.ui.run import RunRequest

    eagle_tree, branches, static_tree = tree or ("", 0, "")
    return RunRequest(prompt=prompt, method=method, num_speculative_tokens=k, verify=verify, temperature=temp, top_k=0,
                      top_p=1.0, max_new_tokens=max_new, seed=seed, synthetic_rates=rates, compare=True, pairs=3,
                      eagle_tree=eagle_tree, tree_branches=branches, static_tree=static_tree,
                      options={"prompt_lookup_min": lo, "prompt_lookup_max": hi}).values()


def compare_timing(dec) -> dict:
    """The comparison's speed goal on this app's warm decoder: results/compare/measure.py's 6 configurations x 5 prompts x 64
    new tokens, wall time (the decoder is loaded and warmed up already)."""
    import importlib.util

    from specviz.compare import iter_comparison, new_comparison
    from specviz.compare.cli import load_prompt_set

    spec = importlib.util.spec_from_file_location("measure", ROOT / "results/compare/measure.py")
    measure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(measure)
    prompts = load_prompt_set("all")
    prompts = [prompts[i] for i in (0, 1, 3, 4, 6)]
    c = new_comparison(measure.CONFIGS, prompts, [0], 64)
    t0 = time.perf_counter()
    runs = list(iter_comparison(dec, c))
    return {"configurations": len(c.configs), "prompts": len(c.prompts), "runs": len(runs),
            "tokens": sum(len(r.trace.output_token_ids) for r in runs), "wall_s": round(time.perf_counter() - t0, 2)}


def compare_tab(client, own: str) -> dict:
    """The Compare tab as a lecturer uses it: preset "all methods, greedy, k=5" on their own prompt, 64 tokens, one
    click (the /compare_preset then /compare API calls), timed; the table's rows with their speedups."""
    t0 = time.perf_counter()
    chosen, ks, verify, temps, trees = client.predict("all methods, greedy, k=5", api_name="/compare_preset")
    out = client.predict(chosen, ks, verify, temps, [], own, "0", 64, "vllm", trees, api_name="/compare")
    wall = time.perf_counter() - t0
    table = out[1] if isinstance(out[1], dict) else {}
    return {"preset": "all methods, greedy, k=5", "methods": chosen, "progress": str(out[0])[:200],
            "wall_s": round(wall, 2), "headers": table.get("headers"), "rows": table.get("data")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--limit", type=int, default=None, help="only the first N cases (a quick check)")
    ap.add_argument("--soak", type=int, default=0, help="then the load checks of benchmarks/load_app.py on this app: "
                    "8 concurrent sessions and N consecutive runs (RSS and CUDA memory)")
    ap.add_argument("--compare", action="store_true", help="then time results/compare/measure.py's comparison "
                    "(6 configurations x 5 prompts x 64 tokens) on the app's warm decoder")
    ap.add_argument("--only", default=None, help="only cases whose name contains one of these comma-separated words")
    a = ap.parse_args()
    from gradio_client import Client

    import load_app

    t0 = time.time()
    demo, url = load_app.launch(None, None, a.device)
    launch_s = time.time() - t0
    client = Client(url, verbose=False)
    examples = json.loads((ROOT / "assets/examples/prompts.json").read_text())["examples"]
    cases = []
    for ex in examples:
        st = ex["settings"]
        cases.append((ex["name"], ex["prompt"], st["method"], st.get("verify", "greedy"), st.get("temperature", 0.0),
                      st.get("num_speculative_tokens", 4), st.get("max_new_tokens", a.max_new_tokens),
                      st.get("prompt_lookup_min", 2), st.get("prompt_lookup_max", 4), st.get("seed", 0), "", None))
    prompt = examples[1]["prompt"] if len(examples) > 1 else examples[0]["prompt"]
    for name, method, verify, temp, k, rates, *tree in EXTRA:
        cases.append((name, prompt, method, verify, temp, k, a.max_new_tokens, 2, 4, 0, rates, tree[0] if tree else None))
    rows = []
    if a.only:
        cases = [c for c in cases if any(w in c[0] for w in a.only.split(","))]
    for name, prompt, method, verify, temp, k, max_new, lo, hi, seed, rates, tree in cases[: a.limit]:
        for attempt in (1, 2):
            args = run_args(prompt, method, verify, temp, k, max_new, lo, hi, seed, rates, tree)
            t = time.time()
            try:
                out = client.predict(*args, api_name="/run")
                client.predict(api_name="/measure")  # the speedup over none, measured after the run (its own event)
                files = client.predict(0, 0, api_name="/export")
                trace_file = next(f for f in (files if isinstance(files, list) else [files])
                                  if str(f).endswith(".json"))
                tr = json.loads(Path(trace_file).read_text())
                m = tr["metrics"]
                meas = (m.get("baseline_none") or {}).get("measurement") or {}
                row = {"case": name, "run": attempt, "method": method, "verify": verify, "temperature": temp, "k": k,
                       "tokens": m.get("num_generated_tokens"),
                       "tokens_per_target_forward": m.get("tokens_per_target_forward"),
                       "mean_acceptance_length": m.get("mean_acceptance_length"), "capture_ms": m.get("capture_ms"),
                       "speedup_median": meas.get("median"), "speedup_low": meas.get("low"),
                       "speedup_high": meas.get("high"), "speedup_n": meas.get("n"), "noisy": meas.get("noisy"),
                       "tree_nodes_max": max((len(st.get("nodes") or []) for st in tr.get("steps", [])), default=0),
                       "progress": str(out[0])[:200], "wall_s": round(time.time() - t, 2)}
                if attempt == 2 and (tree or name.startswith("Decoder layer")):  # the lesson on this trace
                    t1 = time.time()
                    lesson = [str(client.predict(api_name="/lesson_start"))[:160]]
                    lesson += [str(client.predict(api_name="/lesson_next"))[:160] for _ in range(5)]
                    row["lesson"] = {"chapters_seen": len(lesson), "first": lesson[0], "last": lesson[-1],
                                     "seconds": round(time.time() - t1, 2)}
            except Exception as exc:  # noqa: BLE001  (record and go on: one failing case must not end the check)
                row = {"case": name, "run": attempt, "method": method, "verify": verify, "error": repr(exc)[:300],
                       "wall_s": round(time.time() - t, 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "device": a.device,
           "launch_and_warm_up_s": round(launch_s, 1), "rows": rows}
    if a.compare:
        res["compare"] = compare_timing(demo.specviz_cache.get())
        print(json.dumps(res["compare"]), flush=True)
        res["compare_tab"] = compare_tab(client, prompt)
        print(json.dumps(res["compare_tab"]), flush=True)
    if a.soak:
        try:
            res["concurrent"] = load_app.concurrent_sessions(url)
            print(json.dumps(res["concurrent"]), flush=True)
        except AssertionError as exc:
            res["concurrent"] = {"error": str(exc)[:300]}
            print("concurrent sessions FAILED:", exc, flush=True)
        soaked = load_app.soak(url, a.soak, report_every=25)
        res["soak"] = {k: v for k, v in soaked.items() if k != "rss_mb"}
        print(json.dumps(res["soak"]), flush=True)
    try:
        import torch

        res["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        pass
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    lines = ["| case | run | tokens/forward | MAL | speedup (median, range, n) | capture ms |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['run']} | error: {r['error'][:80]} | | | |")
            continue
        sp = (f"{r['speedup_median']:.2f}x ({r['speedup_low']:.2f}-{r['speedup_high']:.2f}, n={r['speedup_n']})"
              if r["speedup_median"] else "none")
        lines.append(f"| {r['case']} | {r['run']} | {r['tokens_per_target_forward']:.2f} | "
                     f"{r['mean_acceptance_length']:.2f} | {sp} | {r['capture_ms']:.0f} |")
    Path(a.out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    demo.close()


if __name__ == "__main__":
    main()
