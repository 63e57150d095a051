"""``python -m specviz compare``: the comparison runner from the command line.

Writes ``DIR/compare.csv`` (one row per configuration), ``DIR/compare.json`` (every trace; loads with
``specviz.compare.load_comparison``) and ``DIR/compare.html`` (offline report; needs plotly, skipped without it).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from specviz import methods

from .model import Prompt, RunConfig, expand_configs, new_comparison
from .run import iter_comparison
from .stats import spread_text, table, table_csv

PROMPT_SET = Path(__file__).resolve().parents[2] / "assets" / "examples" / "compare_prompts.json"


def _list(text: str | None, cast: type, what: str) -> list[Any]:
    """'1,2,4' -> [1, 2, 4]; '0-4' -> [0..4] (integers only). Raises ValueError naming ``what``."""
    if text is None:
        return [None]
    try:
        out: list[Any] = []
        for part in str(text).split(","):
            part = part.strip()
            if cast is int and "-" in part[1:]:
                lo, hi = (int(v) for v in part.split("-", 1))
                if hi < lo:
                    raise ValueError(f"{what}: the range {part!r} runs backwards; write it low-high, e.g. {hi}-{lo}")
                out.extend(range(lo, hi + 1))
            elif part:
                out.append(cast(part))
        if not out:
            raise ValueError
        return out
    except ValueError as exc:
        if "runs backwards" in str(exc):
            raise
        form = "ints or ranges (e.g. 1,2,4 or 0-4)" if cast is int else f"{cast.__name__}s (e.g. 1,2,4)"
        raise ValueError(f"{what} must be comma-separated {form}, got {text!r}") from None


def load_prompt_set(name: str, path: Path = PROMPT_SET) -> list[Prompt]:
    """Prompts of a bundled category ("code completion", "repetitive code", "docstrings / English",
    or "all") or of a JSON file {"prompts": [{"name", "category", "text"}]}. Raises ValueError."""
    source = Path(name) if name.endswith(".json") else path
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
        prompts = [Prompt(str(p["name"]), str(p["text"]), str(p.get("category", ""))) for p in data["prompts"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"cannot read prompts from {source}: {exc}") from None
    if source is path and name != "all":
        prompts = [p for p in prompts if p.category == name]
        if not prompts:
            cats = sorted({p.category for p in json.loads(path.read_text())["prompts"]})
            raise ValueError(f"no bundled prompt category {name!r}; choose 'all' or one of {cats}")
    return prompts


def configs_from_args(args: Any) -> list[RunConfig]:
    """methods x k (or the k sweep) x verify x temperature as chains, plus the ``--trees`` rows
    (:func:`specviz.compare.expand_configs`)."""
    chosen = [m.strip() for m in str(args.methods).split(",") if m.strip()]
    ks = _list(args.k_sweep or args.num_speculative_tokens, int, "-k / --k-sweep")
    verifies = _list(args.verify, str, "--verify")
    if "synthetic" in (verifies or ()):  # its rates are a speed study's input, not a comparison's
        raise ValueError("--verify synthetic needs acceptance rates, which a comparison does not take: run it with "
                         "specviz generate --verify synthetic --synthetic-rates ...")
    temps = _list(args.temperature, float, "--temperature")
    trees = [t.strip() for t in str(getattr(args, "trees", None) or "").split(";") if t.strip()]
    options = {f.name: getattr(args, f.name, None) for m in methods.all_methods() for f in methods.option_fields(m.options)}
    return expand_configs(chosen, ks, verifies, temps, trees, options)


def compare_main(args: Any) -> int:
    from specviz.cli_args import heads_from_args
    from specviz.compare.run import fitting
    from specviz.engine import SpecDecoder

    try:
        prompts = [Prompt(f"prompt {i + 1}", p) for i, p in enumerate(args.prompt or [])]
        if args.prompt_set:
            prompts += load_prompt_set(args.prompt_set)
        comparison = new_comparison(configs_from_args(args), prompts, _list(args.seeds, int, "--seeds"),
                                    args.max_new_tokens)
        heads = heads_from_args(args)
        compile = {"on": True, "off": False, "background": "background"}.get(getattr(args, "compile", None))
        decoder = SpecDecoder.from_pretrained(args.target, args.draft, device=args.device, dtype=args.dtype,
                                              heads=heads or None, compile=compile)
        kept, left = fitting(decoder, comparison.prompts, args.max_new_tokens)
        if left:  # a target of your own may have a shorter context than the bundled prompt sets need
            print("skipped: " + "; ".join(left), file=sys.stderr)
            comparison = dataclasses.replace(comparison, prompts=kept)
        if getattr(args, "fp32_logits", False):
            from specviz.precision import use_fp32_logits

            use_fp32_logits(decoder)
        # only what this comparison runs: every method's graphs take minutes on a GPU (iter_comparison then runs
        # each configuration once more, untimed, for what a warm-up cannot foresee)
        cfgs = [c.resolved() for c in comparison.configs]
        decoder.warm_up(max(c.num_speculative_tokens for c in cfgs), sorted({c.verify for c in cfgs}),
                        sorted({c.temperature for c in cfgs if c.temperature > 0}) or (0.8,),
                        method_names=sorted({c.method for c in cfgs}))
        total = len(comparison.configs) * len(comparison.prompts) * len(comparison.seeds)
        for r in iter_comparison(decoder, comparison):
            print(f"[{len(comparison.runs)}/{total}] {comparison.configs[r.config].label} · "
                  f"{comparison.prompts[r.prompt].name} · seed {r.seed}: "
                  f"{len(r.trace.output_token_ids)} tokens in {r.wall_s:.2f} s", file=sys.stderr)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    csv_text = table_csv(comparison)
    (out / "compare.csv").write_text(csv_text, encoding="utf-8")
    (out / "compare.json").write_text(comparison.to_json(), encoding="utf-8")
    written = ["compare.csv", "compare.json"]
    try:
        from specviz.viz.compare import report_html
    except ImportError:
        print("plotly is not installed: compare.html skipped", file=sys.stderr)
    else:
        (out / "compare.html").write_text(report_html(comparison), encoding="utf-8")
        written.append("compare.html")
    print(terminal_table(table(comparison)))
    print(f"wrote {', '.join(str(out / w) for w in written)}")
    return 0


TERMINAL_KEY = ("tok/fwd tokens per target forward · AL mean acceptance length (vLLM: 1 + accepted / drafting steps) · "
                "accept draft acceptance rate · speedup tokens/s over method none's (median; range lowest–highest over "
                "prompts and seeds, n) · ms d/v/s per step: draft / verify / sample · ⚠ the timed runs held a one-time "
                "cost or mixed compiled and uncompiled graphs · the CSV, JSON and HTML report hold the rest (c_i, the "
                "model's speedup, per-run traces)")


def terminal_table(rows: list[dict[str, Any]]) -> str:
    """The comparison for a terminal: one aligned line per configuration, the columns that rank methods, and a key
    (the CSV beside it has every column, unaligned). ``rows``: :func:`specviz.compare.table`."""
    def num(x: Any, fmt: str) -> str:
        return "–" if x is None else format(float(x), fmt)

    header = ["configuration", "tok/fwd", "AL", "accept", "tok/s", "speedup", "range (n)", "ms d/v/s", "lossless"]
    lines = []
    for row in rows:
        ms, mark = row["ms_per_step"], (row.get("timing") or {}).get("mark", "")
        spread = spread_text(row.get("speedup_spread")) or "–"
        lines.append([row["label"], num(row["tokens_per_target_forward"], ".2f"),
                      num(row["acceptance_length"].get("vllm"), ".2f"), num(row["draft_acceptance_rate"], ".2f"),
                      num(row["tokens_per_s"], ".1f"), num(row["speedup"], ".2f"), spread,
                      f"{ms['draft']:.1f}/{ms['verify']:.1f}/{ms['sample']:.1f}" + (f" {mark}" if mark else ""),
                      row["lossless"]["badge"]])
    widths = [max(len(str(r[i])) for r in [header, *lines]) for i in range(len(header))]
    text = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *lines]]
    heads = [f"head of {row['label']}: {row['head']}" for row in rows if row.get("head")]  # which drafter ran
    return "\n".join([*text, *heads, "", TERMINAL_KEY])
