"""UI control values -> the engine's generate() settings, with messages a user can act on.

The engine validates everything again (and raises ValueError with its own message); this layer
only converts the widgets' values (sliders may send floats, empty boxes send None) and applies
the UI's own caps.
"""

from __future__ import annotations

import math
from typing import Any

from specviz import methods
from specviz.tree import DraftTree

MAX_UI_SPECULATIVE_TOKENS = 12  # the slider's cap (the engine allows up to 32: specviz.engine.MAX_SPECULATIVE_TOKENS)
ENGINE_MAX_SPECULATIVE_TOKENS = 32  # specviz.config.MAX_SPECULATIVE_TOKENS (not imported here: no torch at import)
K_RANGE = (f"this app: 1-{MAX_UI_SPECULATIVE_TOKENS}; the engine itself (Python API, CLI) takes "
           f"1-{ENGINE_MAX_SPECULATIVE_TOKENS}")
MAX_UI_NEW_TOKENS = 512
MAX_UI_PAIRS = 9  # the comparison's segment pairs (the slider's cap)
MAX_PROMPT_CHARS = 20_000
AUTO_VERIFY = "auto"


def _int(value: Any, name: str, lo: int, hi: int) -> int:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a whole number between {lo} and {hi}, got {value!r}") from None
    if not math.isfinite(f) or f != int(f) or not lo <= f <= hi:
        raise ValueError(f"{name} must be a whole number between {lo} and {hi}, got {value!r}")
    return int(f)


def check_slider_bounds(value: Any, lo: float, hi: float) -> None:
    """The bound check a gr.Slider makes (same message), for sliders whose box accepts any number
    (:class:`specviz.ui.widgets.LenientSlider`). Raises ValueError; non-numbers are left to
    :func:`engine_settings`."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return
    if f < lo:
        raise ValueError(f"Value {value} is less than minimum value {lo}.")
    if f > hi:
        raise ValueError(f"Value {value} is greater than maximum value {hi}.")


def check_k(value: Any) -> None:
    """num_speculative_tokens from the run event against the app's range 1..MAX_UI_SPECULATIVE_TOKENS.
    Raises ValueError naming both ranges (:data:`K_RANGE`); non-numbers are left to :func:`engine_settings`."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return
    if not 1 <= f <= MAX_UI_SPECULATIVE_TOKENS:
        raise ValueError(f"num_speculative_tokens (k) = {value} is outside {K_RANGE}: choose k in "
                         f"1-{MAX_UI_SPECULATIVE_TOKENS}")


def _clamped(sent: Any, typed: Any, lo: int, hi: int) -> int | None:
    """The value a slider sent when it clamped ``typed`` (its box's last typed text, "" after a drag) to lo..hi
    before the run event (Gradio's slider does it when the box loses focus); None when nothing was clamped or the
    slider moved since (a drag, an example)."""
    try:
        t, s = float(typed), float(sent)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(t) or lo <= t <= hi or s != min(max(t, lo), hi):
        return None
    return int(s)


def clamped_k_note(k: Any, typed: Any) -> str:
    """The note for a k typed into the slider's box outside 1..MAX_UI_SPECULATIVE_TOKENS: "k = 40 is outside 1-12:
    ran k = 12" when the slider clamped ``typed`` to ``k``; "" otherwise."""
    ran = _clamped(k, typed, 1, MAX_UI_SPECULATIVE_TOKENS)
    return "" if ran is None else f"k = {typed} is outside 1-{MAX_UI_SPECULATIVE_TOKENS}: ran k = {ran}"


def clamped_max_new_note(max_new: Any, typed: Any) -> str:
    """The note for max new tokens typed outside 1..MAX_UI_NEW_TOKENS (the app's cap; the API and CLI take any
    value the target's context holds): "max new tokens = 100000 is outside 1-512 (the app's cap): ran 512" when
    the slider clamped ``typed`` to ``max_new``; "" otherwise."""
    ran = _clamped(max_new, typed, 1, MAX_UI_NEW_TOKENS)
    return ("" if ran is None else
            f"max new tokens = {typed} is outside 1-{MAX_UI_NEW_TOKENS} (the app's cap): ran {ran}")


# the draft-tree controls: (form, what the note calls it)
TREE_CONTROLS = (("dynamic", "the EAGLE-2 tree"), ("branches", "the tree branches per node"), ("static", "the static tree"))


def _filled(eagle_tree: Any, tree_branches: Any, static_tree: Any) -> dict[str, Any]:
    """The tree controls that hold something: {form: its text or number}."""
    try:
        branches = int(float(tree_branches or 0))
    except (TypeError, ValueError):
        branches = 0  # the run reports a bad number
    out = {"dynamic": str(eagle_tree or "").strip(), "branches": branches, "static": str(static_tree or "").strip()}
    return {form: value for form, value in out.items() if value}


def ignored_tree_note(method: str, eagle_tree: Any, tree_branches: Any, static_tree: Any = "") -> str:
    """The note for a draft-tree control ``method`` does not read (the boxes keep their text when the method
    changes, so this is a note, not an error): e.g. an EAGLE-2 tree typed while draft_model is chosen. ""
    when every filled control applies."""
    takes = _tree_forms(method)
    filled = _filled(eagle_tree, tree_branches, static_tree)
    ignored = []
    for form, name in TREE_CONTROLS:
        if form not in filled:
            continue
        if form not in takes:
            ignored.append(f"{name} ({', '.join(methods.taking(form))} only)")
        elif form == "dynamic" and "static" in filled and "static" in takes:
            ignored.append(f"{name} (the static tree replaces it)")
    if not ignored:
        return ""
    ran = "" if _reads_a_tree(method, eagle_tree, tree_branches, static_tree) else ": it ran a chain"
    return f"{method} ignores " + " and ".join(ignored) + ran


def _reads_a_tree(method: str, eagle_tree: Any, branches: Any, static_tree: Any) -> bool:
    """Whether the controls give ``method`` a tree it reads (:func:`tree_settings` is not empty), so it ran a tree,
    not a chain; text the run refuses counts as read (the run's error is what the user sees)."""
    try:
        return bool(tree_settings(method, eagle_tree, branches, static_tree))
    except ValueError:
        return True


def tree_depth_note(method: str, k: Any, eagle_tree: Any, static_tree: Any = "") -> str:
    """The note for an EAGLE-2 tree deeper than k: the engine drafts no deeper than num_speculative_tokens,
    so "4, 6, 32" (depth 7) at k = 5 runs a tree of depth 5. "" when the tree fits, or there is none, or a static
    tree replaces it (one deeper than k is refused by the engine with its own message)."""
    if "dynamic" not in _tree_forms(method) or not str(eagle_tree or "").strip() or str(static_tree or "").strip():
        return ""
    try:
        tree, k = DraftTree.parse(eagle_tree), int(float(k))
    except (TypeError, ValueError):
        return ""  # the run itself reports the bad input
    if tree is None or tree.form != "dynamic" or tree.max_depth <= k:
        return ""
    return (f"the EAGLE-2 tree {str(eagle_tree).strip()} reaches depth {tree.max_depth}, but k = {k} caps it: its "
            f"nodes stop at depth {k} (set k = {tree.max_depth} for the whole tree)")


RATES_HELP = ("synthetic rates are acceptance rates per draft position, a_1, a_2, …: a_i is the chance that a "
              "step accepts at least i draft tokens (unconditional, as vLLM counts it), so each lies in [0, 1] and "
              "they are non-increasing (a_1 ≥ a_2 ≥ …); give one per draft position")


def parse_rates(text: str | None, k: int | None = None) -> tuple[float, ...] | None:
    """'0.8, 0.6, 0.4' -> (0.8, 0.6, 0.4); blank -> None.

    Raises:
        ValueError: not numbers, a rate outside [0, 1], rates that increase, or fewer than ``k``
            (the message says what a rate is and how many are needed; rates after the k-th are
            ignored by the engine)."""
    if text is None or not str(text).strip():
        return None
    need = f" (k = {k}: at least {k}, e.g. {', '.join(f'{0.8 ** (i + 1):.2f}' for i in range(k))})" if k else ""
    try:
        rates = tuple(float(x) for x in str(text).replace(";", ",").split(",") if x.strip())
    except ValueError:
        raise ValueError(f"synthetic rates must be comma-separated numbers like 0.8, 0.6, 0.4; got {text!r}. "
                         f"{RATES_HELP}{need}") from None
    if not all(0.0 <= a <= 1.0 for a in rates):  # also NaN
        raise ValueError(f"synthetic rates must lie in [0, 1], got {text!r}: {RATES_HELP}{need}")
    if any(b > a for a, b in zip(rates, rates[1:])):
        raise ValueError(f"synthetic rates must be non-increasing, got {text!r}: {RATES_HELP}{need}")
    if k and len(rates) < k:
        raise ValueError(f"synthetic rates: {len(rates)} given for k = {k} draft positions: {RATES_HELP}{need}")
    return rates


def engine_settings(method: str, num_speculative_tokens: Any, verify: str | None, temperature: Any, top_k: Any,
                    top_p: Any, max_new_tokens: Any, seed: Any, options: dict[str, Any] | None = None,
                    synthetic_rates: str | None = None) -> dict[str, Any]:
    """Keyword settings for ``SpecDecoder.iter_generate``.

    verify "auto" (or None) -> the engine's default (greedy at temperature 0, else standard); top_k 0 -> off;
    top_p 1 -> off; ``options``: the methods' own controls by field name, of which the method's own are passed
    (whole numbers in the field's range); synthetic rates only for verify "synthetic".
    Raises:
        ValueError: a value outside the UI's ranges (num_speculative_tokens 1..12, max_new_tokens 1..512, an
            option outside its slider) or not a number.
    """
    try:
        temp = float(temperature)
    except (TypeError, ValueError):
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}") from None
    if not temp >= 0:  # also NaN
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temp:g}")
    k = _int(num_speculative_tokens, "num_speculative_tokens", 1, MAX_UI_SPECULATIVE_TOKENS)
    settings: dict[str, Any] = {
        "method": str(method),
        "num_speculative_tokens": k,
        "verify": None if verify in (None, "", AUTO_VERIFY) else str(verify),
        "temperature": temp,
        "top_k": _int(top_k or 0, "top_k", 0, 10**7) or None,
        "top_p": _top_p(top_p),
        "max_new_tokens": _int(max_new_tokens, "max_new_tokens", 1, MAX_UI_NEW_TOKENS),
        "seed": _int(seed, "seed", 0, 2**31 - 1),
    }
    for f in _option_fields(settings["method"]):
        value = (options or {}).get(f.name, f.metadata["ui"])
        settings[f.name] = _int(value, f.name, f.metadata["lo"] or 0, f.metadata["hi"] or 10**7)
    if settings["verify"] == "synthetic":
        settings["synthetic_rates"] = parse_rates(synthetic_rates, k)
    return settings


def tree_settings(method: str, eagle_tree: Any, tree_branches: Any, static_tree: Any = "") -> dict[str, Any]:
    """The draft-tree settings of the UI's "draft tree" controls for ``method``: a static tree (vLLM's
    ``speculative_token_tree`` string) for the methods that draft one; else EAGLE-2's "top_k, depth, total_tokens"
    (empty = a chain) for the methods that draft those, or the children kept per node (0 = a chain) for the methods
    that draft ranked continuations; controls the method does not read are ignored (:func:`ignored_tree_note`).
    Raises ValueError for text that is not three integers or an invalid tree (the engine checks the rest)."""
    takes = _tree_forms(method)
    if str(static_tree or "").strip() and "static" in takes:
        return {"speculative_token_tree": str(static_tree).strip()}
    if "dynamic" in takes and str(eagle_tree or "").strip():
        tree = DraftTree.parse(eagle_tree)
        if tree is None or tree.form != "dynamic":
            raise ValueError(f"EAGLE-2 tree: give top_k, depth, total_tokens as three integers like 4, 6, 32 "
                             f"(or leave it empty for a chain), got {eagle_tree!r}")
        return tree.settings(method)
    if "branches" in takes:
        branches = _int(tree_branches or 0, "tree branches", 0, 64)
        return DraftTree("branches", branches=branches).settings(method) if branches else {}
    return {}


def _tree_forms(method: str) -> tuple[str, ...]:
    """The tree forms a method drafts (() for an unknown one: the engine refuses it with its own message)."""
    return methods.get(method).tree_forms if method in methods.names() else ()


def _option_fields(method: str) -> tuple[Any, ...]:
    """The method's own controls (:func:`specviz.methods.option_fields`; () for an unknown method)."""
    return methods.option_fields(methods.get(method).options) if method in methods.names() else ()


def _top_p(top_p: Any) -> float | None:
    """top_p in (0, 1]; 1 (or empty) -> off. Raises ValueError otherwise."""
    if top_p is None:
        return None
    try:
        value = float(top_p)
    except (TypeError, ValueError):
        raise ValueError(f"top_p must be a number in (0, 1] (1 = off), got {top_p!r}") from None
    if not 0.0 < value <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1 = off), got {value:g}")
    return None if value == 1.0 else value


def check_prompt(prompt: Any) -> str:
    """The prompt as a string. Raises ValueError if empty or longer than MAX_PROMPT_CHARS."""
    text = "" if prompt is None else str(prompt)
    if not text.strip():
        raise ValueError("the prompt is empty: type some text or pick an example")
    if len(text) > MAX_PROMPT_CHARS:
        raise ValueError(f"the prompt has {len(text)} characters; the app accepts at most {MAX_PROMPT_CHARS}")
    return text
