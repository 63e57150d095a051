"""Rank candidate example prompts by how visible their residual distributions are, so the
teaching examples show a residual with more than one bar (the bundled models are often nearly
certain, p close to 1). Re-run it after the models change; run from the repo root:

    .venv/bin/python scripts/select_examples.py [--target DIR --draft DIR] [--out ranking.json]

For every candidate (prompt x settings) it decodes once with the given models on the CPU and,
at every rejected position of a sampled run, reads Z = sum max(p - q, 0) and the residual's top
entries (trace positions' residual_mass / residual_top). Score = the number of rejections whose
residual has visible mass: Z >= MIN_Z and a second entry >= MIN_SECOND (a single bar teaches
nothing). Prints the ranking (best first) as JSON; the picks go into assets/examples/prompts.json
by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz import SpecDecoder  # noqa: E402
from specviz.trace import Trace  # noqa: E402

MIN_Z, MIN_SECOND = 0.05, 0.1
SETTINGS = (
    {"method": "draft_model", "num_speculative_tokens": 4, "verify": "standard", "temperature": 1.0},
    {"method": "draft_model", "num_speculative_tokens": 4, "verify": "block", "temperature": 1.0},
    {"method": "draft_model", "num_speculative_tokens": 4, "verify": "standard", "temperature": 0.8},
)
EXTRA_PROMPTS = (
    "def forward(self, hidden_states, attention_mask=None):\n        residual = hidden_states\n",
    "    def __init__(self, config):\n        super().__init__()\n        self.config = config\n",
    "class LlamaRotaryEmbedding(nn.Module):\n    def __init__(self, config, device=None):\n",
    "def rotate_half(x):\n    \"\"\"Rotates half the hidden dims of the input.\"\"\"\n",
    "    if attention_mask is not None:\n",
    "        logger.warning_once(\n",
)


def residual_rows(trace: Trace) -> list[dict]:
    """One row per rejected position: step, Z and the residual's top 3 [token text, r]."""
    rows = []
    for st in trace.steps:
        if st.num_accepted < len(st.draft_token_ids) and st.num_accepted < len(st.positions):
            pos = st.positions[st.num_accepted]
            top = [[trace.token_texts.get(str(int(t)), str(t)), round(float(r), 4)] for t, r in pos.residual_top[:3]]
            rows.append({"step": st.index, "Z": round(pos.residual_mass, 4), "top": top})
    return rows


def visible(row: dict) -> bool:
    return row["Z"] >= MIN_Z and len(row["top"]) > 1 and row["top"][1][1] >= MIN_SECOND


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default=None, help="also write the ranking to this JSON file")
    args = ap.parse_args(argv)
    examples = json.loads((ROOT / "assets/examples/prompts.json").read_text(encoding="utf-8"))["examples"]
    prompts = [e["prompt"] for e in examples] + list(EXTRA_PROMPTS)
    dec = SpecDecoder.from_pretrained(args.target, args.draft, device="cpu", dtype="float32")
    ranking = []
    for prompt in dict.fromkeys(prompts):
        for settings in SETTINGS:
            trace = dec.generate(prompt, max_new_tokens=args.max_new_tokens, seed=0, **settings)
            rows = residual_rows(trace)
            ranking.append({"score": sum(map(visible, rows)), "rejections": len(rows), "settings": settings,
                            "prompt": prompt, "mean_acceptance_length": round(trace.metrics["mean_acceptance_length"], 2),
                            "visible": [r for r in rows if visible(r)][:4]})
            print(f"score {ranking[-1]['score']:2d} / {len(rows):2d} rejections  {settings['verify']:8s} "
                  f"T={settings['temperature']}  {prompt[:60]!r}", file=sys.stderr)
    ranking.sort(key=lambda r: (-r["score"], -r["rejections"]))
    text = json.dumps(ranking, indent=1, ensure_ascii=False)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
