"""specviz web app: ``python app.py`` serves http://127.0.0.1:7860.

The UI is built at import (``demo``); models load on the first Run, never at import.
Options: --host (default 127.0.0.1), --port (7860), --share, --target DIR, --draft DIR, --device,
--present (the presentation layout).
With no --target the bundled demo models in assets/models/ are used.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from specviz.ui import build_app, launch_options  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="specviz: run speculative decoding and see what happened inside")
    ap.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=7860)
    ap.add_argument("--share", action="store_true", help="also open a public gradio.live link")
    ap.add_argument("--target", default=None, help="target model directory (default: bundled demo target)")
    ap.add_argument("--draft", default=None, help="draft model directory (default: bundled demo draft)")
    ap.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: CUDA when available)")
    ap.add_argument("--present", action="store_true",
                    help="presentation layout: large type, Run and the lesson chapter above the fold (or ?present=1)")
    args = ap.parse_args(argv)
    for flag in ("target", "draft"):
        value = getattr(args, flag)
        if value and _looks_local(value) and not Path(value).expanduser().is_dir():
            ap.error(f"--{flag} {value}: no such directory (give a model directory with config.json, "
                     "*.safetensors and tokenizer files)")
    return args


def _looks_local(value: str) -> bool:
    """A path rather than a hub id ("org/name"): absolute, relative with ./ or ~, or not org/name."""
    return value.startswith(("/", ".", "~")) or value.count("/") != 1 or Path(value).exists()


demo = build_app()

if __name__ == "__main__":
    args = parse_args()
    if args.target or args.draft or args.device or args.present:
        demo = build_app(args.target, args.draft, args.device, present=args.present)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, **launch_options())
