"""Mean acceptance length of EAGLE chains and EAGLE-2 trees on the held-out prompts, per setting (greedy; any device).

Why (issue 15): on the H200 a tree step's cost hardly depends on its node count below the tree-size bucket it is
padded to (``specviz.static_runner.TREE_BUCKETS``; the forward is launch-bound), so which top_k / depth / total_tokens
to ship is a question of acceptance length per draft level; this prints it beside the chains', pooled over prompts
(vLLM's definition, :func:`specviz.train.evaluate.pooled`), and checks each output against plain greedy decoding.

    python benchmarks/tree_sweep.py [--method eagle3] [--prompts 16] [--max-new 64] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHAINS = (4, 5, 6, 7)
TREES = ((4, 5, 24), (4, 5, 32), (4, 6, 32), (4, 4, 32), (6, 5, 32), (8, 5, 32), (8, 6, 32), (4, 3, 16), (8, 4, 32))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", default="eagle3", choices=("eagle", "eagle3"))
    ap.add_argument("--prompts", type=int, default=16, help="held-out prompts used (the first N)")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    a = ap.parse_args()
    from specviz import SpecDecoder
    from specviz.train.evaluate import load_prompts, pooled
    from specviz.train.head_eval import DEFAULT_PROMPTS

    dec = SpecDecoder.from_pretrained(device=a.device)
    prompts = [p for split, p in load_prompts(str(DEFAULT_PROMPTS)) if split == "heldout"][: a.prompts]
    room = (dec.max_length or 10**9) - a.max_new - 40
    encoded = [dec.encode(p.text)[-room:] for p in prompts]
    plain = [dec.generate(ids, method="none", max_new_tokens=a.max_new).output_token_ids for ids in encoded]
    settings = [(f"chain k={k}", dict(num_speculative_tokens=k)) for k in CHAINS]
    settings += [(f"tree {t}x{d}x{n}", dict(num_speculative_tokens=d + 1, eagle_tree_top_k=t, eagle_tree_depth=d,
                                             eagle_tree_total_tokens=n)) for t, d, n in TREES]
    print(f"{a.method}, {len(prompts)} held-out prompts, {a.max_new} new tokens, greedy, {dec.device}")
    rows = []
    for name, kw in settings:
        t0 = time.perf_counter()
        traces = [dec.generate(ids, method=a.method, max_new_tokens=a.max_new, **kw) for ids in encoded]
        m = pooled([{a.method: {**t.metrics, "wall_s": 0.0}} for t in traces], a.method)
        differ = sum(t.output_token_ids != want for t, want in zip(traces, plain))
        rows.append({"setting": name, **kw, "mean_acceptance_length": m["mean_acceptance_length"],
                     "outputs_differ": differ, "wall_s": time.perf_counter() - t0})
        print(f"{name:18s} mean acceptance length {m['mean_acceptance_length']:.3f}  outputs differing from plain "
              f"greedy: {differ}/{len(traces)}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"method": a.method, "prompts": len(prompts), "max_new_tokens": a.max_new,
                                           "device": str(dec.device), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
