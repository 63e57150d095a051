"""Checking a trace's plain data as data (nothing is ever executed): types field by field, and schemas of the nested
fields every view reads, so that a malformed upload fails here with the field named, never inside a figure. A
method's own step details (``Step.match``) are checked against its registry entry's ``details_schema``."""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, dataclass, fields
from typing import Any

from specviz import methods


class TraceFormatError(ValueError):
    """Raised when JSON is not a valid specviz trace (the message says which field)."""


def load_json_capped(text: str | bytes, max_bytes: int, what: str, error: type[ValueError]) -> Any:
    """``json.loads(text)`` for an upload: raises ``error`` if ``text`` is over ``max_bytes`` or not JSON
    (the message names ``what``: "trace", "comparison"). Plain data only: nothing is executed."""
    if len(text) > max_bytes:
        raise error(f"{what} is {len(text)} bytes; the limit is {max_bytes}")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"not valid JSON: {exc}") from None
    except RecursionError:  # json's parser recurses per nesting level; no trace nests more than a few levels
        raise error(f"not a {what}: its JSON nests too deeply to read") from None


_TYPES = {"int": int, "float": (int, float), "str": str, "bool": bool, "dict": dict, "list": list}


def check_obj(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise TraceFormatError(f"{where} must be an object, got {type(value).__name__}")
    return value


def check_list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise TraceFormatError(f"{where} must be a list, got {type(value).__name__}")
    return value


def check_int_list(value: Any, where: str) -> None:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in check_list(value, where)):
        raise TraceFormatError(f"{where} must be a list of integers")


def _expected_type(annotation: str):
    base = annotation.split("[")[0].split(" |")[0].strip()
    return _TYPES.get(base)


def take(obj: dict, klass: type, where: str, nested: set[str] = frozenset()) -> dict:
    """Copy the dataclass fields of ``klass`` out of ``obj``, type-checking the simple ones."""
    out = {}
    for f in fields(klass):
        if f.name in nested:
            continue
        if f.name not in obj:
            if f.default is not MISSING or f.default_factory is not MISSING:  # optional field
                continue
            raise TraceFormatError(f"{where}.{f.name} is missing")
        value, want = obj[f.name], _expected_type(str(f.type))
        optional = "None" in str(f.type)
        if want is not None and not (value is None and optional):
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise TraceFormatError(f"{where}.{f.name} must be {str(f.type)}, got {type(value).__name__}")
            if isinstance(value, float) and not math.isfinite(value):
                raise TraceFormatError(f"{where}.{f.name} must be finite")
        out[f.name] = value
    return out



# ---- the schema of the nested plain-data fields ---------------------------------------------
# A schema is a type (int / float = any finite number / str / bool), a list [item schema], a
# dict {str: value schema} (any keys), a dict of named keys (all optional; other keys must be
# plain JSON and are not read by any view), a tuple of alternatives, or None (JSON null).
# Every key a view reads is listed, so a malformed upload fails here, not in a figure.
@dataclass(frozen=True)
class _Pred:
    """A schema given by a test function and its description."""

    test: Any
    text: str


TOP_PAIR = _Pred(lambda v: isinstance(v, list) and len(v) == 2 and _is_int(v[0]) and _is_num(v[1]),
                 "a [token_id, prob] pair")
TOP2_ROW = _Pred(lambda v: isinstance(v, list) and len(v) == 4 and _is_int(v[0]) and _is_num(v[1]) and _is_int(v[2])
                 and _is_num(v[3]), "a [top-1 id, logit, top-2 id, logit] row")
BASE_MATCH_SCHEMA = {  # keys any method's step details may carry; a method's own are its ``details_schema``
    "kind": str, "backend": str, "greedy": bool,
    # draft trees: EAGLE-2 and static trees, ranked n-gram / suffix trees (specviz/ranked_tree.py)
    "tree": str, "top_k": int, "depth": int, "total_tokens": int, "levels": int, "num_candidates": int,
    "choices": [[int]], "root_position": int, "tree_branches": int,
}


def match_schema(match: Any) -> dict[str, Any]:
    """The schema of a step's details: the base keys plus the own keys of the method named by its ``kind``."""
    kind = match.get("kind") if isinstance(match, dict) else None
    own = methods.get(kind).details_schema if isinstance(kind, str) and kind in methods.names() else {}
    return {**BASE_MATCH_SCHEMA, **own}


BLOCK_SCHEMA = {"P": [float], "rho": [float], "h": [float], "eta": [float], "tau": int}
_OPT_INT, _OPT_NUM, _OPT_STR = (int, None), (float, None), (str, None)
CONFIG_SCHEMA = {
    "method": str, "num_speculative_tokens": int, "verify": str, "temperature": float, "top_k": _OPT_INT,
    "top_p": _OPT_NUM, "max_new_tokens": int, "seed": int, "synthetic_rates": ([float], None), "sampler_backend": str,
    "detailed_trace": bool, "async_scheduling": (bool, None), "target": _OPT_STR, "draft": _OPT_STR,
    "device": _OPT_STR, "dtype": _OPT_STR,
    "runner": _OPT_STR, "compile": (bool, None), "runner_compiled": _OPT_STR, "runner_fused": (bool, None),
    "prompt_length": int,
    "vocab_size": int, "speculative_token_tree": _OPT_STR,
    "graph_notes": [str], "draft_note": _OPT_STR,
    **{name: _OPT_INT for name in ("eagle_tree_top_k", "eagle_tree_depth", "eagle_tree_total_tokens")},
}


def config_schema() -> dict[str, Any]:
    """:data:`CONFIG_SCHEMA` plus every registered method's options (integers, or null)."""
    return {**CONFIG_SCHEMA, **{name: _OPT_INT for name in methods.option_names()}}
METRICS_SCHEMA = {
    **{key: int for key in ("num_steps", "num_drafts", "num_draft_tokens", "num_discarded_draft_tokens",
                            "num_accepted_tokens", "num_generated_tokens")},
    **{key: float for key in ("mean_acceptance_length", "draft_acceptance_rate", "tokens_per_step",
                              "tokens_per_target_forward")},
    "accepted_per_position": [int], "acceptance_rate_per_position": [float],
    "conditional_acceptance_rate": [float], "acceptance_histogram": [int], "time_ms": {str: float},
    "drafted_per_depth": [int], "acceptance_rate_per_depth": [float], "depth_acceptance_rate": float,
    "alpha": (float, None), "draft_coverage": (float, None),
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _matches(value: Any, schema: Any) -> bool:
    if schema is None:
        return value is None
    if schema is int:
        return _is_int(value)
    if schema is float:
        return _is_num(value)
    if schema in (str, bool):
        return isinstance(value, schema)
    if isinstance(schema, _Pred):
        return bool(schema.test(value))
    if isinstance(schema, tuple):
        return any(_matches(value, s) for s in schema)
    if not isinstance(schema, (list, dict)):
        raise TypeError(f"{schema!r} is not a trace schema: use int, float, str, bool, None, a tuple of choices, "
                        "[item schema] or {key: schema}")
    try:
        check(value, schema, "")
    except TraceFormatError:
        return False
    return True


def _describe_schema(schema: Any) -> str:
    if schema is None:
        return "null"
    if isinstance(schema, type):
        return {int: "an integer", float: "a finite number", str: "a string", bool: "true/false"}[schema]
    if isinstance(schema, _Pred):
        return schema.text
    if isinstance(schema, tuple):
        return " or ".join(_describe_schema(s) for s in schema)
    if isinstance(schema, list):
        return f"a list of {_describe_schema(schema[0])}"
    return "an object"


def check(value: Any, schema: Any, where: str) -> None:
    """Raise TraceFormatError (naming the field) unless ``value`` matches ``schema``."""
    if isinstance(schema, list):
        for i, item in enumerate(check_list(value, where)):
            check(item, schema[0], f"{where}[{i}]")
    elif isinstance(schema, dict) and set(schema) == {str}:
        for key, item in check_obj(value, where).items():
            check(item, schema[str], f"{where}.{key}")
    elif isinstance(schema, dict):
        obj = check_obj(value, where)
        for key, sub in schema.items():
            if key in obj:
                check(obj[key], sub, f"{where}.{key}")
    elif not _matches(value, schema):
        raise TraceFormatError(f"{where} must be {_describe_schema(schema)}, got {json.dumps(value)[:60]}")


# ---- ranges: probabilities are probabilities ------------------------------------------------------------------------
PROB_SLACK = 1e-4  # float32 softmax sums may exceed 1 by a few ulps; anything past this is not a probability
_POSITION_PROBS = ("p", "q", "u", "accept_prob", "residual_mass")
_NODE_PROBS = ("p", "q", "u", "accept_prob")
_METRIC_RATES = ("draft_acceptance_rate", "depth_acceptance_rate", "alpha", "draft_coverage")
_METRIC_RATE_LISTS = ("acceptance_rate_per_position", "conditional_acceptance_rate", "acceptance_rate_per_depth")


def check_probability(value: Any, where: str) -> None:
    """Raise TraceFormatError unless ``value`` (a finite number, or None: not recorded) lies in [0, 1]."""
    if value is not None and not -PROB_SLACK <= value <= 1 + PROB_SLACK:
        raise TraceFormatError(f"{where} is {value!r}; a probability must lie between 0 and 1")


def check_step_probabilities(step: Any, where: str) -> None:
    """Every probability a view draws from a parsed :class:`~specviz.trace.schema.Step` (p, q, u, min(1, p/q), Z,
    the top-20 lists, the emitted token's p, tree nodes' p / q / u, block verification's h and eta) in [0, 1].
    Raises:
        TraceFormatError: naming the first field out of range (a hand-edited trace, say)."""
    for j, pos in enumerate(step.positions):
        at = f"{where}.positions[{j}]"
        for name in _POSITION_PROBS:
            check_probability(getattr(pos, name), f"{at}.{name}")
        for name in ("p_top", "q_top", "residual_top"):
            for r, pair in enumerate(getattr(pos, name)):
                check_probability(pair[1], f"{at}.{name}[{r}][1]")
    check_probability(step.emitted.p, f"{where}.emitted.p")
    for r, pair in enumerate(step.emitted.top):
        check_probability(pair[1], f"{where}.emitted.top[{r}][1]")
    for j, node in enumerate(step.nodes):
        for name in _NODE_PROBS:
            check_probability(getattr(node, name), f"{where}.nodes[{j}].{name}")
    for name in ("h", "eta"):
        for r, v in enumerate((step.block or {}).get(name, [])):
            check_probability(v, f"{where}.block.{name}[{r}]")


def check_metric_rates(metrics: dict, where: str = "trace.metrics") -> None:
    """The rates among a trace's metrics (acceptance rates, a, coverage) in [0, 1]. Raises TraceFormatError."""
    for name in _METRIC_RATES:
        check_probability(metrics.get(name), f"{where}.{name}")
    for name in _METRIC_RATE_LISTS:
        for r, v in enumerate(metrics.get(name) or []):
            check_probability(v, f"{where}.{name}[{r}]")


# ---- a whole trace's consistency, and the method-none summary an export carries ------------------------------
def check_consistency(trace: Any) -> None:
    """Refuse a :class:`~specviz.trace.schema.Trace` whose parts disagree (``Trace.from_json`` checks only the types): step
    indices 0..n-1; per step, one position per draft token and num_accepted within the draft;
    output_token_ids equal to every step's committed tokens in order; every decision as its numbers say
    (:func:`check_decisions`).
    Raises:
        TraceFormatError: what disagrees, with the step where it does.
    """
    for n, st in enumerate(trace.steps):
        where = f"steps[{n}]"
        if st.index != n:
            raise TraceFormatError(f"{where}.index is {st.index}; steps must be numbered 0, 1, 2, … in order")
        k = len(st.draft_token_ids)
        if len(st.positions) != k:
            raise TraceFormatError(f"{where} has {len(st.positions)} positions for {k} draft tokens")
        if not 0 <= st.num_accepted <= k:
            raise TraceFormatError(f"{where}.num_accepted is {st.num_accepted}; it must be between 0 and the "
                                   f"{k} draft tokens")
    committed = [t for st in trace.steps for t in st.committed_token_ids]
    if trace.output_token_ids != committed:
        raise TraceFormatError(f"output_token_ids has {len(trace.output_token_ids)} tokens but the steps commit "
                               f"{len(committed)} (or different ones): the trace is inconsistent")
    verify = str(trace.config.get("verify", ""))
    for n, st in enumerate(trace.steps):
        check_decisions(st, verify, f"steps[{n}]")


# the rules whose recorded decision is u <= the acceptance probability (specviz/sampling: u <= min(1, p/q); synthetic
# u <= a_i / a_(i-1)); greedy and typical draw no uniform, block decides on eta and h (checked on its own)
_UNIFORM_RULES = ("standard", "synthetic")


def check_decisions(step: Any, verify: str, where: str) -> None:
    """Each recorded decision agrees with the numbers the views print beside it: a chain position tested under
    standard or synthetic verification (positions 1..num_accepted + 1) is accepted iff u <= accept_prob; a tree node
    accepted or rejected with its u and acceptance probability recorded, the same; a block-verified step accepts
    tau = the last i with eta_i <= h_i (Sun et al. 2024). Raises TraceFormatError naming the first disagreement (the
    app would print "u = 0.05 > 0.13: rejected")."""
    def test(u: float, thr: float, accepted: bool, at: str) -> None:
        if (u <= thr) != accepted:
            rel = "≤" if u <= thr else ">"
            raise TraceFormatError(f"{at} is {'accepted' if accepted else 'rejected'} but its u = {u:g} {rel} its "
                                   f"acceptance probability {thr:g}: the decision contradicts its own numbers")

    if step.is_tree:
        for j, node in enumerate(step.nodes):
            if node.fate in ("accepted", "rejected") and node.u is not None and node.accept_prob is not None:
                test(node.u, node.accept_prob, node.fate == "accepted", f"{where}.nodes[{j}]")
        return
    if verify in _UNIFORM_RULES:
        for j, pos in enumerate(step.positions[: step.num_accepted + 1]):
            test(pos.u, pos.accept_prob, pos.accepted, f"{where}.positions[{j}]")
    h, eta = (step.block or {}).get("h"), (step.block or {}).get("eta")
    if verify == "block" and h and eta:
        tau = max([i + 1 for i, (e, hi) in enumerate(zip(eta, h)) if e <= hi], default=0)
        if tau != step.num_accepted:
            raise TraceFormatError(f"{where}.num_accepted is {step.num_accepted} but block verification's last i with "
                                   f"eta_i <= h_i is {tau}: the decision contradicts its own numbers")


BASELINE_KEY = "baseline_none"  # trace.metrics key of an exported run's method-none comparison
_SUMMARY_NUMBERS = ("tokens", "steps", "target_forward_passes", "tokens_per_forward", "decode_s",
                    "decode_tokens_per_second", "wall_time_s", "tokens_per_second")


def check_baseline(summary: Any) -> dict[str, Any] | None:
    """The method-none run summary stored in an uploaded trace (None if absent), checked as data:
    finite numbers >= 0 for every field the speedup table reads, time_ms a dict of such numbers.
    Raises:
        TraceFormatError: present but malformed."""
    if summary is None:
        return None
    where = f"metrics.{BASELINE_KEY}"
    if not isinstance(summary, dict):
        raise TraceFormatError(f"{where} must be an object (a method-none run summary)")

    def ok(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and 0 <= v < float("inf")

    bad = [k for k in _SUMMARY_NUMBERS if not ok(summary.get(k))]
    times = summary.get("time_ms")
    if not isinstance(times, dict) or not all(isinstance(k, str) and ok(v) for k, v in times.items()):
        bad.append("time_ms")
    if bad:
        raise TraceFormatError(f"{where} has missing or invalid fields: {', '.join(bad)}")
    out = {**{k: summary[k] for k in _SUMMARY_NUMBERS}, "time_ms": dict(times), "method": "none"}
    if summary.get("measurement") is not None:
        out["measurement"] = _check_measurement(summary["measurement"], f"{where}.measurement", ok)
    return out


def _check_measurement(m: Any, where: str, ok) -> dict[str, Any]:
    """The side-by-side measurement of an uploaded comparison (:func:`specviz.speedup.measure_speedup`)."""
    if not isinstance(m, dict):
        raise TraceFormatError(f"{where} must be an object")
    bad = [k for k in ("median", "low", "high", "cost_s") if not ok(m.get(k))]
    bad += [k for k in ("pairs", "segment_tokens", "n") if not (isinstance(m.get(k), int) and ok(m.get(k)))]
    ratios = m.get("ratios")
    if not isinstance(ratios, list) or not all(ok(r) for r in ratios) or len(ratios) != m.get("n"):
        bad.append("ratios")
    if not isinstance(m.get("noisy"), bool):
        bad.append("noisy")
    if bad:
        raise TraceFormatError(f"{where} has missing or invalid fields: {', '.join(bad)}")
    method = check_baseline({**m.get("method_summary", {}), "method": "none"}) if isinstance(
        m.get("method_summary"), dict) else None
    if method is None:
        raise TraceFormatError(f"{where}.method_summary must be an object (the method's segments pooled)")
    method.pop("method")
    runner = m.get("runner") or {}  # which graphs each side replayed (strings; dropped when malformed)
    runner = {k: v for k, v in runner.items() if k in ("method", "none") and isinstance(v, str)} \
        if isinstance(runner, dict) else {}
    return {**{k: m[k] for k in ("median", "low", "high", "cost_s", "pairs", "segment_tokens", "n", "noisy")},
            "ratios": list(ratios), "method_summary": method, **({"runner": runner} if runner else {})}
