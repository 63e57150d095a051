"""Command line: ``specviz generate --method ngram --prompt "..." --trace out.json`` (or ``python -m specviz``).

Commands: ``generate`` (one request, printed by token fate), ``app`` (the web app, options as
``app.py``: see :mod:`specviz.ui.launch`), ``train`` (the demo-model recipe, options as
``python -m specviz.train``), ``convert DIR`` (a head's pickled ``.bin`` / ``.pt`` weights to
safetensors beside them: :mod:`specviz.heads.formats.convert`).

``generate`` prints the output with each token coloured by its fate (ANSI): accepted draft tokens
green, rejected draft tokens red and struck through where they were proposed, recovered tokens
yellow, bonus tokens cyan, plain target tokens uncoloured; then the metrics and a legend. Without
colours (``--no-color``, or stdout not a terminal) a rejected draft token is marked ``[-...-]``.
With ``--steps`` each verification step is printed as it happens, as text (stderr).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from . import methods
from .cli_args import add_head_arguments, heads_from_args
from .trace import RunMetrics, Trace
from .tree import DraftTree

STYLE = {"accepted": "\033[32m", "rejected": "\033[9;31m", "recovered": "\033[33m", "bonus": "\033[36m", "target": ""}
RESET = "\033[0m"
PLAIN_LEGEND = ("legend: [-x-] = a draft token the target rejected (not in the output; the token after it replaced "
                "it); accepted, recovered and bonus tokens are not marked without --color")


def colour_tokens(trace: Trace, colour: bool = True) -> str:
    """The generated text, token by token, styled by fate. Rejected drafts appear (struck
    through) before the recovered token that replaced them."""
    texts = trace.token_texts

    def piece(tok: int, fate: str) -> str:
        s = texts.get(str(tok), f"<{tok}>")
        return f"{STYLE[fate]}{s}{RESET}" if colour and STYLE[fate] else (f"[-{s}-]" if fate == "rejected" and not colour else s)

    out = []
    for step in trace.steps:
        committed = list(step.committed_token_ids)
        for pos in step.positions[: step.num_accepted]:
            if committed:
                out.append(piece(committed.pop(0), "accepted"))
        if step.num_accepted < len(step.draft_token_ids):
            out.append(piece(step.draft_token_ids[step.num_accepted], "rejected"))
        if committed:
            out.append(piece(committed.pop(0), step.emitted.kind))
    return "".join(out)


def format_metrics(trace: Trace) -> str:
    """The run's metrics as printed under the text; rates of what never happened (no step drafted, a position no
    draft reached) read n/a and –, not 0 or 1."""
    m = RunMetrics.of(trace)
    if not m.num_drafts:
        rates = "mean acceptance length n/a, draft acceptance rate n/a (no step drafted)"
    else:
        rates = (f"mean acceptance length {m.mean_acceptance_length:.3f}  "
                 f"draft acceptance rate {m.draft_acceptance_rate:.3f}"
                 + (f" (per node drafted)  per-depth acceptance {m.depth_acceptance_rate:.3f}"
                    if any(st.is_tree for st in trace.steps) else ""))
    lines = [
        f"steps {m.num_steps}  drafts {m.num_drafts}  draft tokens {m.num_draft_tokens}  "
        f"accepted {m.num_accepted_tokens}  generated {m.num_generated_tokens}",
        rates,
        "acceptance per position (share of drafting steps that accepted positions 1..k; – no draft reached it) "
        + (" ".join(f"{r:.2f}" if n else "–" for r, n in zip(m.acceptance_rate_per_position, m.drafted_per_depth))
           if m.num_drafts else "n/a"),
        "steps by drafts accepted (0, 1, .., k) " + " ".join(str(c) for c in m.acceptance_histogram),
        f"target forward passes {m.target_forward_passes}  {m.tokens_per_second:.1f} tok/s  "
        f"stop: {trace.stop_reason}",
    ]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="specviz", description="specviz: run speculative decoding and see what "
                                 "happened inside (commands: app, generate, compare, train, convert)")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("app", help="serve the web app (specviz app --help for its options)", add_help=False)
    sub.add_parser("train", help="train the demo models (specviz train --help for its options)", add_help=False)
    g = sub.add_parser("generate", help="run one request and print it coloured by token fate")
    g.add_argument("--target", default=None, help="target model: a dir (safetensors), a .gguf file, a preset (smollm2) "
                   "or a hub id (default: bundled demo target)")
    g.add_argument("--draft", default=None, help="draft model, like --target (method draft_model)")
    g.add_argument("--method", default=methods.BUILTIN[0], choices=_method_names(),
                   help=" | ".join(_method_names()) + " (a method with a head needs one: bundled with the demo target, or "
                   "--head METHOD=DIR)")
    add_head_arguments(g)
    g.add_argument("--prompt", required=True)
    g.add_argument("-k", "--num-speculative-tokens", type=int, default=5)
    g.add_argument("--verify", default=None, help="greedy | standard | block | synthetic | typical (typical: Medusa's "
                   "typical acceptance, lossy: not distribution-preserving)")
    g.add_argument("--speculative-token-tree", default=None,
                   help="a static draft tree in vLLM's format, e.g. \"[(0,), (1,), (0, 0)]\" (-k must be >= its depth)")
    g.add_argument("--synthetic-rates", default=None, help="comma-separated a_1,a_2,... for --verify synthetic")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--seed", type=int, default=0)
    add_option_arguments(g)
    g.add_argument("--tree", default=None,
                   help="a draft tree in one string: '4,6,32' (EAGLE-2 top_k,depth,total_tokens; "
                        f"{', '.join(methods.taking('dynamic'))}), '[(0,), (1,), (0, 0)]' (static; "
                        f"{', '.join(methods.taking('static'))}), '2' (branches per node; "
                        f"{', '.join(methods.taking('branches'))})")
    g.add_argument("--device", default=None)
    g.add_argument("--dtype", default=None)
    g.add_argument("--runner", default="auto", help="auto | eager | static (static = pre-allocated cache, CUDA graphs)")
    g.add_argument("--trace", default=None, help="write the trace JSON here")
    g.add_argument("--steps", action="store_true", help="print each verification step as it happens")
    g.add_argument("--no-color", action="store_true", help="plain text (the default when stdout is not a terminal)")
    g.add_argument("--color", action="store_true", help="ANSI colours even when stdout is not a terminal")
    _compare_parser(sub)
    return ap


def add_option_arguments(parser: argparse.ArgumentParser, app_defaults: bool = False) -> None:
    """One flag per field of every registered method's options (``--prompt-lookup-min``, ...), shared by methods that
    share a field; default None (the method's own default), or with ``app_defaults`` the app's starting values."""
    seen = set()
    for m in methods.all_methods():
        for f in methods.option_fields(m.options):
            if f.name not in seen:
                seen.add(f.name)
                parser.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=int,
                                    default=f.metadata["ui"] if app_defaults else None,
                                    help=f"{f.metadata['help']} (method {m.name})")


def option_settings(args: Any) -> dict[str, Any]:
    """The method-option flags given on the command line (generate() keywords)."""
    return {f.name: getattr(args, f.name) for m in methods.all_methods() for f in methods.option_fields(m.options)
            if getattr(args, f.name, None) is not None}


def tree_settings(args: Any, method: str) -> dict[str, Any]:
    """The generate() keywords of ``--tree`` / ``--speculative-token-tree``. Raises ValueError for an invalid tree."""
    out = {"speculative_token_tree": args.speculative_token_tree} if args.speculative_token_tree else {}
    if args.tree:
        out.update(DraftTree.parse(args.tree).settings(method))
    return out


def _method_names() -> tuple[str, ...]:
    return methods.names()


def step_printer(tokenizer: Any, out: Any = None) -> tuple[Any, Any]:
    """Handlers for DraftProposed and StepVerified that print each step as text, e.g.
    ``step 3: drafted 4 'x + y\n' · accepted 2 'x +' · recovered ' z'`` (to ``out``, default stderr)."""
    drafts: dict[int, list[int]] = {}

    def text(ids: list[int]) -> str:
        return repr(tokenizer.decode(ids)) if ids else "''"

    def on_draft(event: Any) -> None:
        drafts[event.step] = list(event.token_ids)

    def on_verified(event: Any) -> None:
        rec, draft = event.record, drafts.pop(event.step, [])
        acc, emitted, path = rec["num_accepted"], rec["emitted"], rec.get("accepted_path") or []
        if draft and rec.get("nodes"):  # a tree: the accepted tokens are its path's nodes, not its first nodes
            accepted = [draft[i] for i in path[:acc]]
            head = f"drafted a tree of {len(draft)} nodes · accepted {acc} along a path {text(accepted)} · "
        else:
            head = (f"drafted {len(draft)} {text(draft)} · accepted {acc} {text(draft[:acc])} · " if draft
                    else "no draft · ")
        head = f"step {event.step}: {head}"
        print(f"{head}{emitted['kind']} {text([emitted['token_id']])}", file=out or sys.stderr)

    return on_draft, on_verified
def _compare_parser(sub: Any) -> None:
    """``compare``: many configurations on the same prompts -> DIR/compare.csv, .json, .html."""
    v = sub.add_parser("convert", help="write safetensors beside a head's .bin / .pt weights (read with "
                       "torch.load(weights_only=True)), so that specviz can load it")
    v.add_argument("directory", help="the head directory")
    v.add_argument("--overwrite", action="store_true", help="replace existing .safetensors files")
    c = sub.add_parser("compare", help="run several methods on the same prompts; write CSV, JSON and an HTML report")
    c.add_argument("--target", default=None, help="target model: a dir, a .gguf file or a preset (smollm2; default: "
                   "bundled demo target)")
    c.add_argument("--draft", default=None, help="draft model, like --target (method draft_model)")
    add_head_arguments(c)
    c.add_argument("--methods", default=",".join(m.name for m in methods.all_methods() if m.name != "none" and m.head is None),
                   help="comma-separated methods (default: every method that needs no head; method none is always run "
                        "as the baseline)")
    c.add_argument("-k", "--num-speculative-tokens", default="5", help="k, or comma-separated values")
    c.add_argument("--k-sweep", default=None, help="comma-separated k values for every method (overrides -k)")
    c.add_argument("--verify", default=None, help="greedy | standard | block | typical, or comma-separated")
    c.add_argument("--temperature", default="0", help="temperature, or comma-separated values")
    c.add_argument("--trees", default=None,
                   help="draft trees compared beside the chains, ';'-separated: '4,6,32' (EAGLE-2 top_k,depth,"
                        "total_tokens; eagle, eagle3), '[(0,), (1,), (0, 0)]' (a static tree), '2' (branches per "
                        "node; ngram, suffix). Each runs for the methods that take it, at k = its depth")
    c.add_argument("--seeds", default="0", help="comma-separated seeds, or a range like 0-4")
    c.add_argument("--prompt", action="append", default=None, help="prompt text (repeatable)")
    c.add_argument("--prompt-set", default=None,
                   help="bundled prompt category (or 'all') from assets/examples/compare_prompts.json, or a JSON file")
    c.add_argument("--max-new-tokens", type=int, default=64)
    add_option_arguments(c, app_defaults=True)
    c.add_argument("--device", default=None)
    c.add_argument("--dtype", default=None)
    c.add_argument("--fp32-logits", action="store_true",
                   help="compute the target's LM head in float32 (no 16-bit rounding of the logits; specviz.precision)")
    c.add_argument("--compile", choices=("off", "on", "background"), default=None,
                   help="CUDA: torch.compile the static runners' forwards: 'on' from the start, 'background' in the "
                   "warm-up's compile stage before the timed runs (the target's and draft's graphs), 'off' never "
                   "(default: the library's)")
    c.add_argument("--out", required=True, help="directory for compare.csv, compare.json, compare.html")




def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["app"]:
        from .ui.launch import main as app_main

        return app_main(argv[1:])
    if argv[:1] == ["train"]:
        from .train.__main__ import main as train_main

        train_main(argv[1:])
        return 0
    args = _parser().parse_args(argv)
    if args.command == "compare":
        from .compare.cli import compare_main

        return compare_main(args)
    if args.command == "convert":
        from .heads.formats.convert import convert_dir

        try:
            for out in convert_dir(args.directory, overwrite=args.overwrite):
                print(f"wrote {out}")
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    from .engine import SpecDecoder
    from .events import DraftProposed, EventBus, StepVerified

    try:
        heads = heads_from_args(args)
        decoder = SpecDecoder.from_pretrained(args.target, args.draft, device=args.device, dtype=args.dtype,
                                              runner=args.runner, heads=heads or None)
        bus = EventBus()
        if args.steps:
            on_draft, on_verified = step_printer(decoder.tokenizer)
            bus.subscribe(DraftProposed, on_draft)
            bus.subscribe(StepVerified, on_verified)
        rates = [float(a) for a in args.synthetic_rates.split(",")] if args.synthetic_rates else None
        trace = decoder.generate(
            args.prompt, bus=bus, method=args.method, num_speculative_tokens=args.num_speculative_tokens,
            verify=args.verify, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            max_new_tokens=args.max_new_tokens, seed=args.seed, synthetic_rates=rates, **option_settings(args),
            **tree_settings(args, args.method),
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    head = decoder.heads.get(args.method)
    if head is not None:  # which drafter drafted: a --head replaces the bundled one
        src = getattr(head, "source", {}) or {}
        print(f"head: {args.method} from {src.get('path') or heads.get(args.method) or 'the bundled head'} "
              f"({src.get('format', 'specviz')} layout)", file=sys.stderr)
    if trace.config.get("draft_note"):
        print(f"note: {trace.config['draft_note']}", file=sys.stderr)
    print(trace.prompt_text, end="")
    colour = args.color or (not args.no_color and sys.stdout.isatty())  # no escape codes in files and pipes
    print(colour_tokens(trace, colour=colour))
    print()
    print(format_metrics(trace))
    if colour:
        print("legend: " + " ".join(f"{STYLE[k]}{k}{RESET}" if STYLE[k] else k for k in STYLE))
    else:
        print(PLAIN_LEGEND)
    if args.trace:
        with open(args.trace, "w", encoding="utf-8") as f:
            f.write(trace.to_json())
        print(f"trace written to {args.trace}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
