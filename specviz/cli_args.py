"""Command-line arguments the CLI (``specviz generate``, ``specviz compare``) and the app (``specviz app``) share:
the heads to load."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from . import methods


def head_specs(values: list[str]) -> dict[str, str]:
    """``--head METHOD=DIR`` values -> {method: directory}. Raises ValueError for a value without "=",
    an empty side, or a method given twice."""
    heads: dict[str, str] = {}
    for value in values or ():
        method, sep, directory = str(value).partition("=")
        method, directory = method.strip(), directory.strip()
        if not sep or not method or not directory:
            raise ValueError(f"--head {value!r}: write METHOD=DIR, e.g. --head eagle3=/models/EAGLE3-LLaMA3.1-8B")
        if method in heads:
            raise ValueError(f"--head gives method {method!r} twice")
        heads[method] = directory
    return heads


def add_head_arguments(parser: argparse.ArgumentParser) -> None:
    """``--head METHOD=DIR`` (repeatable) and ``--<method>-head DIR`` for every registered method with a head."""
    parser.add_argument("--head", action="append", default=[], metavar="METHOD=DIR",
                        help="a head for METHOD, repeatable: specviz's format or a published layout (SafeAILab, "
                             "SpecForge, speculators, FasterDecoding, vLLM, z-lab), detected from the files; .bin / "
                             ".pt weights need `specviz convert DIR` first")
    for m in methods.all_methods():
        if m.head is not None:
            parser.add_argument(f"--{m.name.replace('_', '-')}-head", dest=f"head_{m.name}", default=None,
                                metavar="DIR", help=f"{m.head.what} directory (method {m.name})")


def heads_from_args(args: Any) -> dict[str, str]:
    """{method: directory} from ``--head METHOD=DIR`` and ``--<method>-head``. Raises ValueError for a malformed
    --head or a method without a head."""
    heads = {m.name: getattr(args, f"head_{m.name}") for m in methods.all_methods()
             if m.head is not None and getattr(args, f"head_{m.name}", None)}
    for name, directory in head_specs(getattr(args, "head", None) or []).items():
        if name not in methods.names() or methods.get(name).head is None:
            takers = ", ".join(m.name for m in methods.all_methods() if m.head is not None)
            raise ValueError(f"--head {name}={directory}: {name!r} is not a method with a head; use one of {takers}")
        same = name in heads and Path(heads[name]).resolve() == Path(directory).resolve()
        if name in heads and not same:  # one spelling must not silently win over the other
            raise ValueError(f"--head gives method {name!r} twice: --head {name}={directory} and "
                             f"--{name}-head {heads[name]}; give one")
        heads[name] = directory
    return heads
