"""Start the web app: ``specviz app`` (the console script) or ``python app.py``, same options.

Options: --host (default 127.0.0.1), --port (7860), --share, --target / --draft (a model directory, a .gguf
file or a preset such as smollm2: :func:`specviz.models.resolve_source`), --head METHOD=DIR (or
--<method>-head DIR), --device,
--no-warm-up, --compile / --compile-background / --no-compile (CUDA: torch.compile every forward from the start,
or the target's and draft's graphs after the warm-up, swapped in between runs, or never; see docs/gpu.md), --present.
With no --target the bundled demo models in assets/models/ are used. A --head is checked before the server
starts (its layout, then its fit to the target: a head that would fail every run is refused). At launch the
models load and warm up on a background thread (on CUDA: every CUDA graph the UI's settings reach),
with a progress line in the page, so that no run pays one-time costs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..cli_args import add_head_arguments, heads_from_args
from ..models import PRESETS

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


def parser(prog: str = "specviz app") -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description="specviz: run speculative decoding and see what happened inside")
    ap.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=7860)
    ap.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    ap.add_argument("--target", default=None, help="target model: a directory (safetensors), a .gguf file, or a preset "
                    f"({', '.join(PRESETS)}; default: bundled demo target)")
    ap.add_argument("--draft", default=None, help="draft model, like --target (default: the bundled demo draft with the "
                    "bundled target; none with --target, so method draft_model is unavailable)")
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: CUDA when available)")
    add_head_arguments(ap)
    ap.add_argument("--no-warm-up", action="store_true",
                    help="load the models at the first Run instead of at launch")
    comp = ap.add_mutually_exclusive_group()
    comp.add_argument("--compile", action="store_true", default=None,
                      help="CUDA: run the target's, drafter's and EAGLE heads' forwards through torch.compile "
                      "(inductor) "
                      "inside their CUDA graphs from the start: the warm-up compiles before it captures (minutes on a "
                      "machine that has not compiled these models before)")
    comp.add_argument("--compile-background", dest="compile", action="store_const", const="background",
                      help="CUDA: serve uncompiled graphs at once and, after the warm-up, compile the target's and "
                      "draft's graphs one at a time between runs, each swapped in when ready; cached for the next "
                      "launch")
    comp.add_argument("--no-compile", dest="compile", action="store_false",
                      help="CUDA: never compile (uncompiled CUDA graphs only)")
    ap.set_defaults(compile=None)
    ap.add_argument("--present", action="store_true",
                    help="presentation layout: large type, Run and the lesson chapter above the fold (or ?present=1)")
    return ap


def parse_args(argv: list[str] | None = None, prog: str = "specviz app") -> argparse.Namespace:
    """The app's options; exits (code 2) with a message for a model directory that does not exist."""
    ap = parser(prog)
    args = ap.parse_args(argv)
    try:
        args.heads = heads_from_args(args) or None
        for method, directory in (args.heads or {}).items():  # the files' layout now; their fit to the target at load
            _check_head(method, directory)
    except ValueError as exc:
        ap.error(str(exc))
    for flag in ("target", "draft"):
        value = getattr(args, flag)
        if value in PRESETS:
            continue
        path = Path(value).expanduser() if value else None
        if value and _looks_local(value) and not (path.is_dir() or (path.is_file() and path.suffix == ".gguf")):
            ap.error(f"--{flag} {value}: no such directory or .gguf file (give a model directory with config.json, "
                     f"*.safetensors and tokenizer files, a .gguf file, or a preset: {', '.join(PRESETS)})")
    return args


def _check_head(method: str, directory: str) -> None:
    """A ``--head`` whose files do not load would fail every run of the app, whatever its method: raises ValueError
    (the loader's message) for a missing directory, unreadable or pickled weights, an unknown layout or a head of
    another method."""
    from specviz import methods
    from specviz.heads.formats import detect, kind_of, read_checkpoint

    if methods.get(method).head.load is not None:  # the method reads its own directories: its load checks them
        return
    ckpt = read_checkpoint(directory)
    layout = detect(ckpt)
    owner = kind_of(layout) or ckpt.config.get("kind")
    if owner is not None and owner != method:
        raise ValueError(f"--head {method}={directory}: it holds the head of method {owner!r} ({layout} layout), "
                         f"not of {method!r}")


def _looks_local(value: str) -> bool:
    """A path rather than a hub id ("org/name"): absolute, relative with ./ or ~, or not org/name."""
    return value.startswith(("/", ".", "~")) or value.count("/") != 1 or Path(value).exists()


def main(argv: list[str] | None = None, prog: str = "specviz app") -> int:
    """Parse the options, start the warm-up, serve the app (blocks until stopped)."""
    from .cache import DecoderCache
    from .layout import build_app, launch_options

    args = parse_args(argv, prog)
    cache = DecoderCache(args.target, args.draft, args.device, compile=args.compile, heads=args.heads)
    if args.heads:  # a head that does not fit the target would fail every run: load before serving, refuse it now
        from specviz.models import ModelLoadError

        try:
            cache.get(warm=False)  # the warm-up follows as without --head: at launch, or at the first run
        except (ModelLoadError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if not args.no_warm_up:
        cache.start_warm_up()
    demo = build_app(args.target, args.draft, args.device, cache=cache, present=args.present)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, **launch_options())
    return 0
