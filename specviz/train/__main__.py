"""``specviz train --out DIR [--preset demo|smoke] [--seed N] [--device cuda|cpu] [--time-budget-s S] [--compile]
[--steps N] [--draft-steps N] [--no-heads]``: run the training recipe (see :mod:`specviz.train.recipe`);
``specviz train heads ...``: train heads for a target of your own (:mod:`specviz.train.heads_cli`)."""

from __future__ import annotations

import argparse
import json
import sys

from specviz.train.configs import PRESETS


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["heads"]:
        from specviz.train.heads_cli import main as heads_main

        return heads_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m specviz.train", description=__doc__)
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--preset", default="demo", choices=sorted(PRESETS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, choices=["cuda", "cpu"])
    ap.add_argument("--time-budget-s", type=float, default=None, help="stop training after S seconds")
    ap.add_argument("--compile", action="store_true", help="torch.compile both models for training")
    ap.add_argument("--steps", type=int, default=None, help="fix the target's step count (reproduce a logged plan)")
    ap.add_argument("--draft-steps", type=int, default=None, help="fix the draft's step count")
    ap.add_argument("--no-heads", action="store_true", help="skip the heads registered in specviz.train.heads")
    args = ap.parse_args(argv)
    from specviz.train.recipe import run

    log = run(args.out, args.preset, args.seed, args.device, args.time_budget_s, args.compile, args.steps,
              args.draft_steps, heads=not args.no_heads)
    last = log["heldout"][-1] if log["heldout"] else {}
    print(json.dumps({"steps": log["steps"], "tokens_seen": log["tokens_seen"], "heldout": last,
                      "final_heldout": log.get("final_heldout"), "phases_s": log["phases_s"],
                      "stopped_early": log["stopped_early"]}))
    return log


if __name__ == "__main__":
    main()
