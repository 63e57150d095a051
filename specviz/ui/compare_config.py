"""The Compare tab's inputs: its presets (assets/examples/compare_presets.json), the registered methods, the
prompts (the bundled set by category and the app's examples) and the configurations the controls describe."""


from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gradio as gr

from specviz import methods as registry
from specviz.compare import (
    Prompt,
    RunConfig,
    expand_configs,
)


ROOT = Path(__file__).resolve().parents[2]
COMPARE_PROMPTS = ROOT / "assets" / "examples" / "compare_prompts.json"
EXAMPLES = ROOT / "assets" / "examples" / "prompts.json"
VERIFY_CHOICES = ("auto", "greedy", "standard", "block")
MAX_NEW_TOKENS = 256
PRESETS_PATH = ROOT / "assets" / "examples" / "compare_presets.json"


def load_presets(path: Path = PRESETS_PATH) -> dict[str, dict[str, Any]]:
    """The Compare tab's presets ({name: {"methods", "ks", "verify", "temperatures", "trees"?}}; {} when unreadable)."""
    try:
        return dict(json.loads(path.read_text(encoding="utf-8"))["presets"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}


PRESETS = load_presets()


def methods() -> list[str]:
    """Speculative methods the registry has (so new ones appear), method none left out (it always runs)."""
    return [m for m in registry.names() if m != "none"]


def runnable(decoder: Any, chosen: list[str]) -> tuple[list[str], list[str]]:
    """(the chosen methods the loaded decoder can run, "method (why not)" for the others): e.g. eagle
    without a trained head for this target is left out and the progress line says so."""
    keep, skipped = [], []
    for m in chosen:
        why = registry.get(m).missing(decoder) if m in registry.names() else None
        (skipped.append(f"{m} ({why})") if why else keep.append(m))
    return keep, skipped


def prompt_choices() -> list[tuple[str, str]]:
    """(label, key) of the bundled comparison prompts ("set:i") and the app's examples ("ex:i")."""
    out = []
    for i, p in enumerate(_read(COMPARE_PROMPTS, "prompts")):
        out.append((f"{p.get('category', '')} · {p['name']}", f"set:{i}"))
    for i, e in enumerate(_read(EXAMPLES, "examples")):
        out.append((f"example · {e['name']}", f"ex:{i}"))
    return out


def _read(path: Path, key: str) -> list[dict[str, Any]]:
    try:
        return [p for p in json.loads(path.read_text(encoding="utf-8"))[key] if "name" in p]
    except (OSError, ValueError, KeyError):
        return []


def _prompts(keys: list[str] | None, own: str | None) -> list[Prompt]:
    bundled, examples = _read(COMPARE_PROMPTS, "prompts"), _read(EXAMPLES, "examples")
    out = []
    for key in keys or []:
        kind, _, idx = str(key).partition(":")
        if kind == "set" and idx.isdigit() and int(idx) < len(bundled):
            p = bundled[int(idx)]
            out.append(Prompt(p["name"], p["text"], p.get("category", "")))
        elif kind == "ex" and idx.isdigit() and int(idx) < len(examples):
            e = examples[int(idx)]
            out.append(Prompt(e["name"], e["prompt"], "example"))
        else:
            raise ValueError(f"unknown prompt {key!r}")
    if own and own.strip():
        out.append(Prompt("your prompt", own, "your own"))
    if not out:
        raise ValueError("choose at least one prompt (or type your own)")
    return out


def _numbers(text: Any, cast: type, what: str) -> list[Any]:
    from specviz.compare.cli import _list

    values = _list(str(text or "").strip() or None, cast, what)
    if values == [None]:
        raise ValueError(f"{what} is empty: type e.g. {'5' if cast is int else '0'}")
    return values


def build_configs(chosen: list[str] | None, ks: Any, verifies: list[str] | None, temperatures: Any,
                  trees: Any = "") -> list[RunConfig]:
    """Checkbox and text values -> configurations (methods x k x verification x temperature as chains, plus
    the ';'-separated ``trees`` for the methods that take each, :func:`specviz.compare.expand_configs`; "auto"
    verification = greedy at T = 0, else standard). Methods with options of their own run them at the app's starting
    values (prompt lookup 2..4, as the examples).
    Raises ValueError with what to change."""
    if not chosen:
        raise ValueError("choose at least one method")
    known = methods()
    unknown = [m for m in chosen if m not in known]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {known}")
    k_values = _numbers(ks, int, "k")
    temps = _numbers(temperatures, float, "temperatures")
    rules = [None if v == "auto" else v for v in (verifies or ["auto"])]
    specs = [t.strip() for t in str(trees or "").split(";") if t.strip()]
    options = {f.name: f.metadata["ui"] for m in registry.all_methods() for f in registry.option_fields(m.options)}
    return expand_configs(chosen, k_values, rules, temps, specs, options)


def apply_preset(name: str) -> tuple[Any, ...]:
    """A preset's methods, k values, verifications, temperatures and draft trees (gr.skip() for an unknown name)."""
    p = PRESETS.get(name)
    if p is None:
        return (gr.skip(),) * 5
    chosen = methods() if p["methods"] == "all" else [m for m in p["methods"] if m in methods()]
    return chosen, p["ks"], p["verify"], p["temperatures"], p.get("trees", "")
