"""Mean acceptance length of every drafting method on the family's held-out prompts (greedy), pooled per split,
with a check that each method's output equals method none's token for token (lossless greedy).

    python scripts/eval_methods.py --prompts results/train/v2/heldout_prompts.json --device cuda --dtype float32 \
        --methods draft_model,eagle,eagle3,ngram,suffix -k 4,5 --max-new-tokens 64 --out results/train/v2/methods.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--methods", default="draft_model,eagle,eagle3,ngram")
    ap.add_argument("-k", default="4,5")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--out", required=True)
    ap.add_argument("--split", default=None, help="only this split of the prompts file (default: every split)")
    ap.add_argument("--head", action="append", default=[], metavar="METHOD=DIR",
                    help="this head replaces the method's bundled head (repeatable)")
    ap.add_argument("--tree", action="append", default=[], metavar="METHOD[=TREE]",
                    help="also measure METHOD with a static tree (default: the method's HeadSpec.eval_tree)")
    a = ap.parse_args()
    from specviz import SpecDecoder, methods
    from specviz.train.evaluate import load_prompts

    heads = dict(h.split("=", 1) for h in a.head) or None
    dec = SpecDecoder.from_pretrained(device=a.device, dtype=a.dtype, heads=heads)
    runs = [(m, None) for m in a.methods.split(",") if m]
    runs += [(t.split("=", 1)[0], t.split("=", 1)[1] if "=" in t else methods.get(t).head.eval_tree) for t in a.tree]
    prompts = load_prompts(a.prompts)
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": a.device, "dtype": a.dtype,
           "max_new_tokens": a.max_new_tokens, "heads": dec.names, "splits": {}}
    for split in sorted({s for s, _ in prompts if a.split in (None, s)}):
        chosen = [p for s, p in prompts if s == split][: a.limit]
        base = [list(dec.generate(p.text, method="none", max_new_tokens=a.max_new_tokens).output_token_ids)
                for p in chosen]
        out = {}
        for method, tree in runs:
            for k in [int(x) for x in a.k.split(",")]:
                acc = drafts = gen = steps = same = 0
                per_pos = None
                for p, ref in zip(chosen, base):
                    tr = dec.generate(p.text, method=method, num_speculative_tokens=k, max_new_tokens=a.max_new_tokens,
                                      **({"speculative_token_tree": tree} if tree else {}))
                    m = tr.metrics
                    acc += m["num_accepted_tokens"]
                    drafts += m["num_drafts"]
                    gen += m["num_generated_tokens"]
                    steps += m["num_steps"]
                    same += list(tr.output_token_ids) == ref
                    pp = m["accepted_per_position"]
                    per_pos = pp if per_pos is None else [x + y for x, y in zip(per_pos, pp)]
                row = {"mean_acceptance_length": 1 + acc / drafts if drafts else 1.0,
                       "tokens_per_target_forward": gen / steps if steps else 0.0, "num_drafts": drafts,
                       "num_steps": steps, "acceptance_rate_per_position": [c / drafts for c in per_pos] if drafts else [],
                       "outputs_equal_to_none": f"{same}/{len(chosen)}"}
                name = f"{method}{' tree' if tree else ''} k={k}"
                out[name] = row
                print(split, name, json.dumps({x: (round(v, 3) if isinstance(v, float) else v)
                                                   for x, v in row.items() if x != "acceptance_rate_per_position"}),
                      flush=True)
        res["splits"][split] = {"num_prompts": len(chosen), "methods": out}
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
