"""Draft trees against chains on held-out prompts: tokens/s and mean acceptance length, side by side in one run.

The tree speed goal is "H200, warm: tree eagle3 >= 1.2x the tokens/s of chain eagle3". bench_e2e.py measures
it on one demo prompt; this script measures it on the held-out prompts the bundled models were not trained on
(``results/train/v2/heldout_prompts.json``, split ``heldout``), so the acceptance lengths behind the ratio are the
ones a user's code gets rather than one prompt's.

    python benchmarks/bench_trees.py --out results/tree/bench_h200.json                 # on the GPU machine
    python benchmarks/bench_trees.py --device cpu --prompts 2 --rounds 1 --max-new 16  # a quick check anywhere

Per runner (``--runners``: static, static+compile): one decoder, every setting's prompts run once untimed (the
first requests capture the CUDA graphs and, compiled, compile), ``gc.freeze()`` as ``SpecDecoder.warm_up`` does,
then ``--rounds`` rounds; each round runs every (setting, trace on / off) over all prompts, round-robin, so a slow
phase of the host hits every row of that round. A row's tokens/s = its committed tokens / its median round time;
"paired" ratios are the median over rounds of the within-round ratio. Greedy; every output is checked against
method none's (plain greedy decoding through the same runner) token for token. MAL = committed tokens of drafting
steps / drafting steps (trace.py); in bf16 an output may leave plain greedy decoding at a near-tie (the wider
verify forward sums in another order): the row gives, per such prompt, the first differing index and the target's
top-2 logit gap there (bench_e2e.first_difference). ``gc_ms``: the collector's time in the timed rounds (bench_e2e.GcTimer).

Settings (``--methods``, bench_e2e.parse_method's format): ``eagle3`` (chain, k = 5), ``eagle3+k7`` (chain, k = 7),
``eagle3+tree4x5x24`` (EAGLE-2 tree: top_k 4, depth 5, 24 total tokens; k = depth + 1).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_e2e import GcTimer, _sync, first_difference, parse_method  # noqa: E402

from specviz import SpecDecoder  # noqa: E402
from specviz.train.evaluate import load_prompts  # noqa: E402

DEFAULT_METHODS = "eagle3,eagle3+k7,eagle3+tree4x5x24,eagle3+tree4x6x32"


def run_runner(label: str, prompts: list[str], methods: list[tuple], a, device: str) -> dict:
    """Every setting's rows for one runner (see the module docstring). Returns {"rows": [...], "ratios": {...}}."""
    longest = max(len(p) for p in prompts)  # characters >= tokens: a safe cache bound
    dec = SpecDecoder.from_pretrained(device=device, runner="static", compile=label == "static+compile",
                                      max_cache_len=longest + a.max_new + 64)
    dev = dec.device
    kws = {}
    for method, k, extra, name in methods:
        for detailed in (True, False):
            kws[name, detailed] = dict(method=method, num_speculative_tokens=k, max_new_tokens=a.max_new,
                                       detailed_trace=detailed, **extra)
    t0 = time.perf_counter()
    reference = [dec.generate(p, method="none", max_new_tokens=a.max_new).output_token_ids for p in prompts]
    for kw in kws.values():  # untimed: graph captures (and compilation) happen in the first requests
        for p in prompts:
            dec.generate(p, **kw)
    warm_s = time.perf_counter() - t0
    print(f"{label}: first requests (capture{', compilation' if label.endswith('compile') else ''}) "
          f"took {warm_s:.1f} s", flush=True)
    gc.collect()
    gc.freeze()
    times = {key: [] for key in kws}
    gc_s = {key: 0.0 for key in kws}
    last = {}
    for _ in range(a.rounds):
        for key, kw in kws.items():
            with GcTimer() as collected:
                _sync(dev)
                t = time.perf_counter()
                traces = [dec.generate(p, **kw) for p in prompts]
                _sync(dev)
            times[key].append(time.perf_counter() - t)
            gc_s[key] += collected.seconds
            last[key] = traces
    rows = []
    for (name, detailed), traces in last.items():
        tokens = sum(len(tr.output_token_ids) for tr in traces)
        drafting = [st for tr in traces for st in tr.steps if st.draft_token_ids or st.nodes]
        committed = sum(len(st.committed_token_ids) for st in drafting)
        steps = sum(len(tr.steps) for tr in traces)
        sec = statistics.median(times[name, detailed])
        equal = [tr.output_token_ids == ref for tr, ref in zip(traces, reference)]
        rows.append({"runner": label, "setting": name, "k": kws[name, detailed]["num_speculative_tokens"],
                     "trace": detailed, "compiled": bool(getattr(dec.target_runner, "compiled", False)),
                     "tok_s": tokens / sec, "ms_per_step": 1e3 * sec / steps, "tokens": tokens, "steps": steps,
                     "mean_acceptance_length": committed / max(len(drafting), 1),
                     "round_s": [round(t, 4) for t in times[name, detailed]], "gc_ms": round(gc_s[name, detailed] * 1e3, 2),
                     "equal_to_greedy": all(equal),
                     # bf16: where an output first leaves plain greedy decoding, and the target's top-2 logit gap there
                     "first_differences": {i: first_difference(dec.target_model, dec.encode(prompts[i]),
                                                               traces[i].output_token_ids, reference[i])
                                           for i, e in enumerate(equal) if not e}})
        r = rows[-1]
        print(f"{label:<15} {name:<20} k={r['k']} trace={'on ' if detailed else 'off'} {r['tok_s']:8.1f} tok/s "
              f"{r['ms_per_step']:6.2f} ms/step  MAL {r['mean_acceptance_length']:.2f}  gc {r['gc_ms']:.1f} ms  "
              f"equal={r['equal_to_greedy']}" + "".join(
                  f" [prompt {i}: first at {d['index']}, gap {d['top2_logit_gap']:.3f}]"
                  for i, d in r["first_differences"].items()), flush=True)
    ratios = {}
    chains = [m[3] for m in methods if "tree" not in m[3]]
    trees = [m[3] for m in methods if "tree" in m[3]]
    tokens = {(r["setting"], r["trace"]): r["tokens"] for r in rows}
    for tree in trees:
        for chain in chains:
            for detailed in (True, False):
                speed = {s: [tokens[s, detailed] / t for t in times[s, detailed]] for s in (tree, chain)}
                med = statistics.median(speed[tree]) / statistics.median(speed[chain])
                paired = statistics.median(a_ / b_ for a_, b_ in zip(speed[tree], speed[chain]))
                key = f"{tree} / {chain}, trace {'on' if detailed else 'off'}"
                ratios[key] = {"median": round(med, 4), "paired": round(paired, 4)}
                print(f"{label:<15} {key:<48} {med:5.2f}x (paired {paired:.2f}x)", flush=True)
    del dec
    gc.unfreeze()
    gc.collect()
    return {"rows": rows, "ratios": ratios, "warm_s": round(warm_s, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None, help="JSON file for the rows and ratios")
    ap.add_argument("--prompts", type=int, default=8, help="the first N prompts of the held-out split")
    ap.add_argument("--prompt-file", default=str(ROOT / "results/train/v2/heldout_prompts.json"))
    ap.add_argument("--split", default="heldout")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--methods", default=DEFAULT_METHODS)
    ap.add_argument("--runners", default="static,static+compile")
    ap.add_argument("--commit", default=None, help="commit to record (the GPU machine's copy has no .git)")
    a = ap.parse_args()
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    prompts = [p.text for s, p in load_prompts(a.prompt_file) if s == a.split][: a.prompts]
    if not prompts:
        raise SystemExit(f"no prompts of split {a.split!r} in {a.prompt_file}")
    methods = [parse_method(m.strip()) for m in a.methods.split(",") if m.strip()]
    runners = [r.strip() for r in a.runners.split(",") if r.strip()]
    bad = [r for r in runners if r not in ("static", "static+compile")]
    if bad:
        raise SystemExit(f"unknown runner(s) {bad}: use static and/or static+compile")
    print(f"device {device} ({torch.cuda.get_device_name() if device == 'cuda' else platform.processor() or 'cpu'}), "
          f"{len(prompts)} prompts of {a.split}, {a.max_new} new tokens, {a.rounds} rounds", flush=True)
    result = {"what": "benchmarks/bench_trees.py", "argv": sys.argv[1:], "commit": a.commit,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": device,
              "device_name": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
              "torch": torch.__version__, "prompts": len(prompts), "split": a.split, "max_new_tokens": a.max_new,
              "runners": {}}
    for label in runners:
        result["runners"][label] = run_runner(label, prompts, methods, a, device)
        if a.out:  # after each runner: a timeout keeps what finished
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
