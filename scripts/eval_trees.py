"""Mean acceptance length of EAGLE chains against EAGLE-2 dynamic trees on the held-out prompts (greedy,
fp32), with a check that every output equals method none's token for token. One JSON line per setting.

    python scripts/eval_trees.py --prompts results/train/v2/heldout_prompts.json --split heldout --limit 40 \
        --out results/tree/heldout_cpu.jsonl

MAL = committed tokens of drafting steps / drafting steps (vLLM's mean acceptance length, trace.py).
wall_s is the whole setting's time on this machine (noisy when it is shared; not a speed claim).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TREE_4_5_24 = {"eagle_tree_top_k": 4, "eagle_tree_depth": 5, "eagle_tree_total_tokens": 24}
SETTINGS = [("eagle3", 5, {}), ("eagle3", 6, {}), ("eagle3", 7, {}), ("eagle3", 6, TREE_4_5_24),
            ("eagle3", 6, {"eagle_tree_top_k": 8, "eagle_tree_depth": 5, "eagle_tree_total_tokens": 33}),
            ("eagle3", 7, {"eagle_tree_top_k": 4, "eagle_tree_depth": 6, "eagle_tree_total_tokens": 32}),
            ("eagle", 6, {}), ("eagle", 6, TREE_4_5_24)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default=str(ROOT / "results/train/v2/heldout_prompts.json"))
    ap.add_argument("--split", default="heldout")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import torch

    from specviz import SpecDecoder
    from specviz.train.evaluate import load_prompts

    torch.set_num_threads(1)
    dec = SpecDecoder.from_pretrained(device=a.device, dtype="float32")
    prompts = [p for s, p in load_prompts(a.prompts) if s == a.split][: a.limit]
    base = [dec.generate(p.text, method="none", max_new_tokens=a.max_new_tokens).output_token_ids for p in prompts]
    with open(a.out, "w", encoding="utf-8") as out:
        for method, k, tree in SETTINGS:
            t0, drafts, tokens, equal = time.time(), 0, 0, True
            for p, b in zip(prompts, base):
                tr = dec.generate(p.text, method=method, num_speculative_tokens=k, max_new_tokens=a.max_new_tokens,
                                  **tree)
                equal &= tr.output_token_ids == b
                steps = [st for st in tr.steps if st.draft_token_ids or st.nodes]
                drafts += len(steps)
                tokens += sum(len(st.committed_token_ids) for st in steps)
            row = {"method": method, "k": k, "tree": tree or None, "split": a.split, "prompts": len(prompts),
                   "max_new_tokens": a.max_new_tokens, "device": a.device, "dtype": "float32",
                   "mean_acceptance_length": round(tokens / max(drafts, 1), 3), "equal_to_greedy": equal,
                   "wall_s": round(time.time() - t0, 1), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
