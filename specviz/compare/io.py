"""Loading a saved comparison: JSON data checked field by field, nothing executed.

Every run's trace goes through :meth:`specviz.trace.Trace.from_dict`; indices, seeds and settings
are checked against the comparison's own lists, so an import can be drawn without any model.
"""

from __future__ import annotations

import math
from typing import Any

from specviz import methods
from specviz.config import VERIFY_METHODS
from specviz.trace import Trace, TraceFormatError, load_json_capped
from specviz.tree import BRANCHES_SUFFIX, DYNAMIC_SETTINGS, STATIC_SETTING, DraftTree

from .model import (COMPARISON_FORMAT, COMPARISON_VERSION, MAX_BASELINE_TIMINGS, MAX_COMPARISON_BYTES, MAX_RUNS,
                    Comparison, ComparisonFormatError, Prompt, RunConfig, RunResult, method_options)

LEGACY_OPTIONS = ("prompt_lookup_min", "prompt_lookup_max")  # a config's own fields before options existed


def _fail(message: str) -> None:
    raise ComparisonFormatError(message)


def _obj(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        _fail(f"{where} must be an object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str, most: int = MAX_RUNS) -> list:
    if not isinstance(value, list):
        _fail(f"{where} must be a list, got {type(value).__name__}")
    if len(value) > most:
        _fail(f"{where} has {len(value)} entries; at most {most} are accepted")
    return value


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        _fail(f"{where} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def _num(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        _fail(f"{where} must be a finite number >= 0, got {value!r}")
    return float(value)


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        _fail(f"{where} must be a string, got {type(value).__name__}")
    return value


def _config(data: Any, where: str) -> RunConfig:
    obj = _obj(data, where)
    method = _str(obj.get("method"), f"{where}.method")
    verify = _str(obj.get("verify"), f"{where}.verify")
    if verify not in VERIFY_METHODS:
        _fail(f"{where}.verify must be one of {', '.join(VERIFY_METHODS)}, got {verify!r}")
    options = _obj(obj.get("options", {}), f"{where}.options")
    options = {**{k: obj[k] for k in LEGACY_OPTIONS if obj.get(k) is not None}, **options}
    for key, value in options.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float, str))):
            _fail(f"{where}.options.{key} must be a number or a string, got {type(value).__name__}")
    tree = obj.get("tree", "")  # absent in comparisons saved before trees could be compared: a chain
    tree = "" if tree is None else _str(tree, f"{where}.tree")
    if len(tree) > 4000:
        _fail(f"{where}.tree is {len(tree)} characters long; a tree spec is at most 4000")
    # a method this build does not have can still be viewed (its options are kept as they were)
    own = method_options(method, options) if method in methods.names() else tuple(sorted(options.items()))
    return RunConfig(method, _int(obj.get("num_speculative_tokens"), f"{where}.num_speculative_tokens", 1, 32),
                     verify, _num(obj.get("temperature"), f"{where}.temperature"), own, tree)


def _tree_keys() -> set[str]:
    return {STATIC_SETTING, *DYNAMIC_SETTINGS, *(f"{m}{BRANCHES_SUFFIX}" for m in methods.names())}


def _run(data: Any, where: str, comparison: Comparison) -> RunResult:
    obj = _obj(data, where)
    c = _int(obj.get("config"), f"{where}.config", 0, len(comparison.configs) - 1)
    p = _int(obj.get("prompt"), f"{where}.prompt", 0, len(comparison.prompts) - 1)
    seed = _int(obj.get("seed"), f"{where}.seed", 0, 2**63 - 1)
    if seed not in comparison.seeds:
        _fail(f"{where}.seed {seed} is not one of the comparison's seeds")
    try:
        trace = Trace.from_dict(obj.get("trace"))
    except TraceFormatError as exc:
        _fail(f"{where}.trace: {exc}")
    cfg = comparison.configs[c]
    got = (trace.config.get("method"), trace.config.get("verify"), trace.config.get("temperature"))
    if got != (cfg.method, cfg.verify, cfg.temperature) or trace.config.get("seed") != seed:
        _fail(f"{where}.trace was run with method/verify/temperature/seed {got + (trace.config.get('seed'),)}, "
              f"not configuration {c} ({cfg.label}) at seed {seed}")
    try:  # a tree configuration's runs record its tree (a chain's none): compared as trees, not as text
        want = cfg.draft_tree
        got_tree = DraftTree.from_settings({k: v for k, v in trace.config.items() if k in _tree_keys()}, cfg.method,
                                           methods.names())
    except ValueError:
        want, got_tree = "invalid", None
    if got_tree != want:
        _fail(f"{where}.trace's draft-tree settings do not match configuration {c} ({cfg.label})")
    committed = [t for s in trace.steps for t in s.committed_token_ids]
    if committed != trace.output_token_ids:
        _fail(f"{where}.trace: output_token_ids disagree with the steps' committed tokens")
    timings = _list(obj.get("timings", []), f"{where}.timings", MAX_BASELINE_TIMINGS)
    timings = [_num(t, f"{where}.timings[{i}]") for i, t in enumerate(timings)]
    return RunResult(c, p, seed, trace, _num(obj.get("wall_s"), f"{where}.wall_s"), timings)


def load_comparison(text: str | bytes, max_bytes: int = MAX_COMPARISON_BYTES) -> Comparison:
    """Parse and validate a comparison as data (nothing is executed). Raises :class:`ComparisonFormatError` (a
    ValueError) naming the bad field, also for input over ``max_bytes``."""
    return comparison_from_dict(load_json_capped(text, max_bytes, "comparison", ComparisonFormatError))


def comparison_from_dict(data: Any) -> Comparison:
    """A :class:`Comparison` from its dict. Raises ComparisonFormatError naming the bad field."""
    obj = _obj(data, "comparison")
    if obj.get("format") != COMPARISON_FORMAT:
        _fail(f"comparison.format must be {COMPARISON_FORMAT!r} (is this a single-run trace?)")
    if obj.get("version") != COMPARISON_VERSION:
        _fail(f"comparison.version must be {COMPARISON_VERSION}, got {obj.get('version')!r}")
    configs = [_config(c, f"configs[{i}]") for i, c in enumerate(_list(obj.get("configs"), "configs", 200))]
    prompts = []
    for i, p in enumerate(_list(obj.get("prompts"), "prompts", 200)):
        po = _obj(p, f"prompts[{i}]")
        prompts.append(Prompt(_str(po.get("name"), f"prompts[{i}].name"), _str(po.get("text"), f"prompts[{i}].text"),
                              _str(po.get("category", ""), f"prompts[{i}].category")))
    seeds = [_int(s, f"seeds[{i}]", 0, 2**63 - 1) for i, s in enumerate(_list(obj.get("seeds"), "seeds", 1000))]
    if not configs or not prompts or not seeds:
        _fail("a comparison needs at least one configuration, prompt and seed")
    machine = _obj(obj.get("machine", {}), "machine")
    machine = {str(k): v for k, v in machine.items() if isinstance(v, (str, int, float)) and not isinstance(v, bool)}
    # comparisons saved before method none was timed more than once carry no baseline_timings: one timing
    timings = _int(obj.get("baseline_timings", 1), "baseline_timings", 1, MAX_BASELINE_TIMINGS)
    out = Comparison(configs, prompts, seeds, _int(obj.get("max_new_tokens"), "max_new_tokens", 1, 100_000),
                     machine=machine, baseline_timings=timings)
    seen = set()
    for i, r in enumerate(_list(obj.get("runs"), "runs")):
        run = _run(r, f"runs[{i}]", out)
        key = (run.config, run.prompt, run.seed)
        if key in seen:
            _fail(f"runs[{i}] repeats configuration {run.config}, prompt {run.prompt}, seed {run.seed}")
        seen.add(key)
        out.runs.append(run)
    return out
