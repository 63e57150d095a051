"""Run every bundled example (assets/examples/prompts.json) on the bundled models and print what it teaches:
tokens per target forward, mean acceptance length, drafting share, block-vs-standard stars, residual mass at
rejections. Usage: python scripts/check_examples.py [--seeds 0,1,2] [--extra FILE.json]"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def describe(trace) -> dict:
    m = trace.metrics
    rejected = [p for s in trace.steps for p in s.positions if not p.accepted]
    masses = sorted(p.residual_mass for p in rejected)
    return {
        "tokens": m["num_generated_tokens"], "steps": m["num_steps"],
        "tokens_per_step": round(m["tokens_per_step"], 2),
        "mal": round(m["mean_acceptance_length"], 2), "drafted": f"{m['num_drafts']}/{m['num_steps']}",
        "rejections": len(rejected),
        "median_residual_mass": round(masses[len(masses) // 2], 3) if masses else None,
        "text": trace.text[:120],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--extra", default=None, help="a JSON file of more candidates in the prompts.json format")
    a = ap.parse_args()
    from specviz import SpecDecoder

    dec = SpecDecoder.from_pretrained(device="cpu")
    examples = json.loads((ROOT / "assets/examples/prompts.json").read_text())["examples"]
    if a.extra:
        examples += json.loads(Path(a.extra).read_text())["examples"]
    for ex in examples:
        for seed in [int(s) for s in a.seeds.split(",")]:
            tr = dec.generate(ex["prompt"], seed=seed, **ex["settings"])
            print(json.dumps({"name": ex["name"], "seed": seed, **describe(tr)}), flush=True)


if __name__ == "__main__":
    main()
