"""Held-out mean acceptance length of trained heads through the engine, next to the draft model's.

For each fixed held-out prompt (a recipe's ``heldout_prompts.json``, split "heldout";
:func:`specviz.train.evaluate.load_prompts`), greedy speculative decoding with :class:`specviz.SpecDecoder`:
every head method given, and the draft model's method when a draft is given, at the same k and number of new
tokens. Counters are summed over prompts (vLLM's pooled definition: mean acceptance length =
1 + accepted / drafting steps, :func:`specviz.train.evaluate.pooled`). Greedy decoding is lossless,
so every method must return method none's tokens: ``outputs_differ`` counts the prompts where one
does not (expected 0 in fp32; bf16 on a GPU may flip near-ties, docs/design/methods.md 11.1).
A head whose method names a static tree to try (``HeadSpec.eval_tree``, e.g. Medusa's) is also run with it.
"""

from __future__ import annotations

import time
from pathlib import Path

from specviz import methods
from specviz.train.evaluate import COUNTERS, load_prompts, pooled

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "results" / "train" / "v2" / "heldout_prompts.json"
DEFAULT_DRAFT = Path(__file__).resolve().parents[2] / "assets" / "models" / "specviz-draft"


def _runs(heads: dict[str, str], draft: bool) -> list[tuple[str, str, dict]]:
    """(row name, method, extra generate settings) for every run of a prompt: each head's method, its static tree
    too where it has one to try (``HeadSpec.eval_tree``), and every method that runs the draft model when there is
    one."""
    runs = [(kind, kind, {}) for kind in heads]
    for kind in heads:
        tree = methods.get(kind).head.eval_tree
        if tree:
            runs.append((f"{kind}_tree", kind, {"speculative_token_tree": tree}))
    if draft:
        runs += [(m.name, m.name, {}) for m in methods.all_methods() if m.needs_draft]
    return runs


def heldout_acceptance(target: str, heads: dict[str, str], draft: str | None = None,
                       prompts_file: str | None = None, k: int = 4, max_new_tokens: int = 64, limit: int | None = 40,
                       device: str | None = None, dtype: str | None = None) -> dict:
    """Pooled greedy metrics per method on the held-out prompts (see the module docstring).

    heads: {kind: head dir}; draft: draft model dir (None: no draft_model row). Prompts longer than
    the target's context minus ``max_new_tokens + k + 1`` keep their last tokens. Returns a JSON-able
    dict: settings, {row: pooled metrics}, outputs_differ, wall_s."""
    from specviz import SpecDecoder

    t0 = time.time()
    dec = SpecDecoder.from_pretrained(target, draft, device=device, dtype=dtype, heads=heads)
    prompts = [p for split, p in load_prompts(str(prompts_file or DEFAULT_PROMPTS)) if split == "heldout"][:limit]
    room = (dec.max_length or 10**9) - max_new_tokens - k - 1
    runs = _runs(heads, draft is not None)
    rows, differ = [], 0
    for p in prompts:
        ids = dec.encode(p.text)[-room:]
        want = dec.generate(ids, method="none", max_new_tokens=max_new_tokens).output_token_ids
        row = {}
        for name, method, extra in runs:
            s0 = time.time()
            tr = dec.generate(ids, method=method, num_speculative_tokens=k, max_new_tokens=max_new_tokens, **extra)
            row[name] = {c: tr.metrics[c] for c in COUNTERS}
            row[name]["mean_acceptance_length"] = tr.metrics["mean_acceptance_length"]
            row[name]["wall_s"] = round(time.time() - s0, 3)
            differ += tr.output_token_ids != want
        rows.append(row)
    out = {name: pooled(rows, name) for name, _, _ in runs} if rows else {}
    return {"settings": {"k": k, "max_new_tokens": max_new_tokens, "prompts": len(rows), "temperature": 0.0,
                         "device": str(dec.device), "dtype": dec.names.get("dtype", ""), "split": "heldout"},
            "methods": out, "outputs_differ": int(differ), "wall_s": round(time.time() - t0, 2)}


def summary_line(result: dict) -> str:
    """One line: 'held-out mean acceptance length (greedy, k=4, 40 prompts x 64 tokens): medusa 2.31 | draft_model 3.19'."""
    s = result["settings"]
    parts = [f"{name} {m['mean_acceptance_length']:.2f}" for name, m in result["methods"].items()]
    return (f"held-out mean acceptance length (greedy, k={s['k']}, {s['prompts']} prompts x {s['max_new_tokens']} "
            f"tokens, {s['device']} {s['dtype']}): " + " | ".join(parts)
            + f"; outputs differing from method none: {result['outputs_differ']}")
