"""``specviz train heads --target DIR --out DIR [--heads eagle,eagle3] [--time-budget-s S] [--smoke] [--device
cuda|cpu] [--preset NAME]``: train heads for a target (:func:`specviz.train.heads.train_heads`) on the LM's own token
windows (:func:`head_windows`), then measure their held-out greedy mean acceptance length through the engine next to
the draft model's (:mod:`specviz.train.head_eval`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specviz import methods
from specviz.train import recipe
from specviz.train.heads import parse_overrides, train_heads, trainers


def head_windows(tokenizer, preset: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(train_windows, heldout_windows) int64 [W, T+1] (CPU) for head training: the same windows the LM
    trained on (:func:`specviz.train.recipe.head_windows`: the preset's corpus encoded with ``tokenizer``)."""
    return recipe.head_windows(tokenizer, preset)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="specviz train heads", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="target model directory (safetensors)")
    ap.add_argument("--out", required=True, help="output directory; heads go to OUT/specviz-eagle*/")
    ap.add_argument("--heads", "--kinds", dest="heads", default=None,
                    help="comma-separated methods (default: every method with a head trainer: "
                         + ", ".join(trainers()) + ")")
    ap.add_argument("--time-budget-s", type=float, default=None, help="per-head training time limit")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny run (smoke preset windows, SMOKE configs, one CPU thread); < 60 s on a tiny target")
    ap.add_argument("--preset", default=None, help="window preset (default: demo, or smoke with --smoke)")
    ap.add_argument("--device", default=None, choices=["cuda", "cpu"])
    ap.add_argument("--mal-prompts", type=int, default=20,
                    help="held-out prompts for the greedy mean acceptance length of a head whose natural k is its own "
                         "(HeadSpec.eval_k) against the draft model's (0 = skip)")
    ap.add_argument("--mal-prompts-file", default="results/train/v2/heldout_prompts.json")
    ap.add_argument("--mal-new-tokens", type=int, default=64)
    ap.add_argument("--no-eval", action="store_true", help="skip the held-out acceptance run through the engine")
    ap.add_argument("--eval-prompts", default=None, help="heldout_prompts.json (default results/train/v2/...)")
    ap.add_argument("--eval-limit", type=int, default=None, help="held-out prompts (default 40; --smoke: 2)")
    ap.add_argument("--eval-k", type=int, default=4, help="num_speculative_tokens of the acceptance run")
    ap.add_argument("--eval-tokens", type=int, default=None, help="new tokens per prompt (default 64; --smoke: 8)")
    ap.add_argument("--eval-dtype", default="float32", help="dtype of the acceptance run (float32: greedy is then "
                    "exactly plain greedy; bf16 may flip near-ties)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KIND.FIELD=VALUE",
                    help="replace a field of one head's training config, e.g. dflash.init_from_target=last, "
                         "medusa.head_layers=2 (repeatable)")
    ap.add_argument("--draft", default=None, help="draft model beside the heads (default: the bundled draft, when "
                    "the target is the bundled one)")
    args = ap.parse_args(argv)
    overrides = parse_overrides(args.overrides)
    from specviz.models import load_model, load_tokenizer, resolve_device

    device = resolve_device(args.device)
    if args.smoke and device.type == "cpu":
        torch.set_num_threads(1)  # tiny ops: intra-op threads only contend on a shared CPU
    target = load_model(args.target, device, torch.float32)  # fp32 master copy; bf16 autocast on CUDA
    tok = load_tokenizer(args.target)
    train_w, held_w = head_windows(tok, args.preset or ("smoke" if args.smoke else "demo"))
    names = [n.strip() for n in (args.heads or ",".join(trainers())).split(",") if n.strip()]
    logs = train_heads(target, train_w.to(device), held_w.to(device), device, args.out, args.time_budget_s,
                       names, smoke=args.smoke, overrides=overrides)
    summary = {n: {"steps": g["steps"], "train_s": g["train_s"], "stopped_early": g["stopped_early"],
                   "heldout": g["heldout"][-1], "bytes": g["saved"]["bytes"]} for n, g in logs.items()}
    print(json.dumps(summary))
    for name in (n for n in names if methods.get(n).head.eval_k and args.mal_prompts > 0):
        logs[name]["heldout_acceptance"] = _heldout_acceptance(args, name, logs[name], device)
    if not args.no_eval:
        logs["acceptance"] = _acceptance(args, logs, device)
    return logs


def _heldout_acceptance(args, name: str, log: dict, device) -> dict:
    """Greedy held-out mean acceptance length of a head whose natural k is not the CLI's (``HeadSpec.eval_k``: DFlash,
    B - 1 = 7) next to the draft model's at the same k (:mod:`specviz.train.head_eval`, fp32),
    printed and added to the head's train_log.json."""
    from specviz.train import head_eval

    res = head_eval.heldout_acceptance(args.target, {name: log["saved"]["dir"]}, _draft_for(args),
                                       args.mal_prompts_file, k=methods.get(name).head.eval_k,
                                       max_new_tokens=args.mal_new_tokens,
                                       limit=args.mal_prompts, device=device.type, dtype=args.eval_dtype)
    print(head_eval.summary_line(res))
    path = Path(log["saved"]["dir"]) / "train_log.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "heldout_acceptance": res}, indent=1))
    return res


def _draft_for(args) -> str | None:
    """--draft, or the bundled draft when the target is the bundled one (None: no draft_model row)."""
    from specviz.models import DEFAULT_TARGET
    from specviz.train import head_eval

    if args.draft is None and Path(args.target).resolve() == Path(DEFAULT_TARGET).resolve() \
            and head_eval.DEFAULT_DRAFT.exists():
        return str(head_eval.DEFAULT_DRAFT)
    return args.draft


def _acceptance(args, logs: dict, device) -> dict:
    """Held-out greedy mean acceptance length of the heads just trained, next to draft_model's
    (:mod:`specviz.train.head_eval`); printed as one line and saved to OUT/heads_acceptance.json."""
    from specviz.models import DEFAULT_TARGET
    from specviz.train import head_eval

    draft = _draft_for(args)
    bundled = Path(args.target).resolve() == Path(DEFAULT_TARGET).resolve()
    heads = {n: g["saved"]["dir"] for n, g in logs.items()}
    if bundled:  # the other bundled heads too, on the same prompts (the card's comparison columns)
        from specviz.loading import bundled_heads

        heads.update({n: str(d) for n, d in bundled_heads().items() if n not in heads and (d / "config.json").exists()})
    res = head_eval.heldout_acceptance(args.target, heads, draft, args.eval_prompts, k=args.eval_k,
                                       max_new_tokens=args.eval_tokens or (8 if args.smoke else 64),
                                       limit=args.eval_limit or (2 if args.smoke else 40), device=device.type,
                                       dtype=args.eval_dtype)
    print(head_eval.summary_line(res))
    (Path(args.out) / "heads_acceptance.json").write_text(json.dumps(res, indent=1))
    return res
