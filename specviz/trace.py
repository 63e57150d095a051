"""The trace: plain data recorded from engine events, the single source of every view.

A :class:`Trace` holds the request's settings, one :class:`Step` per verification step and
the totals. It round-trips through JSON (:meth:`Trace.to_json` / :meth:`Trace.from_json`);
loading validates the data's shape and types and never executes anything, so an uploaded
trace is safe to view.

Metric definitions follow vLLM (``v1/spec_decode/metrics.py``) and algorithms.md:

* num_drafts: steps whose proposer drafted k' > 0 tokens; num_draft_tokens: sum of k'.
* mean_acceptance_length = 1 + num_accepted_tokens / num_drafts (1.0 with no drafts).
* draft_acceptance_rate = num_accepted_tokens / num_draft_tokens.
* accepted_per_position[i] = #drafting steps that accepted >= i+1 tokens (vLLM's counts);
  acceptance_rate_per_position[i] = that / num_drafts (unconditional);
  conditional_acceptance_rate[i] = P(accept i+1 | accepted i) = accepted_per_position[i] /
  offered_per_position[i], where offered_per_position[i] = #drafting steps that drafted >= i+1
  tokens and accepted >= i (position i+1 was verified).
* draft_coverage = num_drafts / num_steps (share of steps that had a draft; vllm#24344).
* acceptance_histogram[j] = #drafting steps with exactly j accepted.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from . import events as ev

TRACE_VERSION = 1
MAX_TRACE_BYTES = 32 * 1024 * 1024  # uploads above this are refused


class TraceFormatError(ValueError):
    """Raised when JSON is not a valid specviz trace (the message says which field)."""


@dataclass
class Position:
    """One drafted position i (1-based) of a step.

    token_id: x_i; p: p_i(x_i); q: q_i(x_i) (1 for one-hot drafts); u: the uniform (block: eta_i);
    accept_prob: min(1, p/q); accepted: the decision; residual_mass: Z_i = sum max(p_i - q_i, 0);
    p_top / q_top / residual_top: up to 20 [token_id, probability] pairs, descending
    (residual_top normalised; empty when Z_i = 0).
    """

    index: int
    token_id: int
    p: float
    q: float
    u: float
    accept_prob: float
    accepted: bool
    residual_mass: float
    p_top: list[list[float]] = field(default_factory=list)
    q_top: list[list[float]] = field(default_factory=list)
    residual_top: list[list[float]] = field(default_factory=list)


@dataclass
class Emitted:
    """The token a step drew itself: kind "recovered" (from the residual at the first rejected
    position), "bonus" (from p_{k'+1} after a full accept) or "target" (a step with no draft, a
    plain decoding step). position: 1-based slot in the step; p: its target probability;
    top: up to 20 [token_id, prob] of the distribution it was drawn from."""

    position: int
    token_id: int
    kind: str
    p: float
    top: list[list[float]] = field(default_factory=list)


@dataclass
class Step:
    """One verification step (one target forward over the k'+1 verify positions)."""

    index: int
    proposer: str
    draft_token_ids: list[int]
    num_accepted: int
    emitted: Emitted
    positions: list[Position]
    committed_token_ids: list[int]
    match: dict[str, Any] = field(default_factory=dict)
    block: dict[str, Any] | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)
    sampler_backend: str = "reference"


@dataclass
class Trace:
    """A whole request: settings, steps, totals. See the module docstring for metrics."""

    config: dict[str, Any]
    prompt_token_ids: list[int]
    prompt_text: str = ""
    steps: list[Step] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    token_texts: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    target_forward_passes: int = 0
    wall_time_s: float = 0.0
    tokens_per_second: float = 0.0
    stop_reason: str = ""
    version: int = TRACE_VERSION

    # ---- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_json(cls, text: str | bytes, max_bytes: int = MAX_TRACE_BYTES) -> "Trace":
        """Parse and validate a trace. Raises :class:`TraceFormatError` (a ValueError) on
        anything that is not a well-formed trace, including input over ``max_bytes``."""
        if len(text) > max_bytes:
            raise TraceFormatError(f"trace is {len(text)} bytes; the limit is {max_bytes}")
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TraceFormatError(f"not valid JSON: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> "Trace":
        obj = _check_obj(data, "trace")
        if obj.get("version") != TRACE_VERSION:
            raise TraceFormatError(f"trace.version must be {TRACE_VERSION}, got {obj.get('version')!r}")
        kw = _take(obj, cls, "trace", nested={"steps"})
        kw["steps"] = [_step_from_dict(s, i) for i, s in enumerate(_check_list(obj.get("steps", []), "trace.steps"))]
        _check_int_list(kw["prompt_token_ids"], "trace.prompt_token_ids")
        _check_int_list(kw["output_token_ids"], "trace.output_token_ids")
        return cls(**kw)


# ---- validation helpers (data only; nothing is ever executed) ----------------------------
_TYPES = {"int": int, "float": (int, float), "str": str, "bool": bool, "dict": dict, "list": list}


def _check_obj(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise TraceFormatError(f"{where} must be an object, got {type(value).__name__}")
    return value


def _check_list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise TraceFormatError(f"{where} must be a list, got {type(value).__name__}")
    return value


def _check_int_list(value: Any, where: str) -> None:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in _check_list(value, where)):
        raise TraceFormatError(f"{where} must be a list of integers")


def _expected_type(annotation: str):
    base = annotation.split("[")[0].split(" |")[0].strip()
    return _TYPES.get(base)


def _take(obj: dict, klass: type, where: str, nested: set[str] = frozenset()) -> dict:
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


def _step_from_dict(data: Any, i: int) -> Step:
    where = f"trace.steps[{i}]"
    obj = _check_obj(data, where)
    kw = _take(obj, Step, where, nested={"emitted", "positions"})
    kw["emitted"] = Emitted(**_take(_check_obj(obj.get("emitted"), f"{where}.emitted"), Emitted, f"{where}.emitted"))
    kw["positions"] = [
        Position(**_take(_check_obj(p, f"{where}.positions[{j}]"), Position, f"{where}.positions[{j}]"))
        for j, p in enumerate(_check_list(obj.get("positions", []), f"{where}.positions"))
    ]
    _check_int_list(kw["draft_token_ids"], f"{where}.draft_token_ids")
    _check_int_list(kw["committed_token_ids"], f"{where}.committed_token_ids")
    return Step(**kw)


# ---- metrics -----------------------------------------------------------------------------
def compute_metrics(steps: list[Step], num_speculative_tokens: int) -> dict[str, Any]:
    """vLLM's spec-decode metrics over ``steps`` (see module docstring)."""
    k = max([num_speculative_tokens, *(len(s.draft_token_ids) for s in steps)] or [0])
    drafting = [s for s in steps if s.draft_token_ids]
    num_drafts = len(drafting)
    num_draft_tokens = sum(len(s.draft_token_ids) for s in drafting)
    num_accepted = sum(s.num_accepted for s in drafting)
    per_pos = [sum(1 for s in drafting if s.num_accepted >= i + 1) for i in range(k)]
    hist = [sum(1 for s in drafting if s.num_accepted == j) for j in range(k + 1)]
    offered = [sum(1 for s in drafting if len(s.draft_token_ids) >= i + 1 and s.num_accepted >= i) for i in range(k)]
    generated = sum(len(s.committed_token_ids) for s in steps)
    return {
        "num_steps": len(steps),
        "num_drafts": num_drafts,
        "num_draft_tokens": num_draft_tokens,
        "num_accepted_tokens": num_accepted,
        "num_generated_tokens": generated,
        "mean_acceptance_length": 1.0 + num_accepted / num_drafts if num_drafts else 1.0,
        "draft_acceptance_rate": num_accepted / num_draft_tokens if num_draft_tokens else 0.0,
        "accepted_per_position": per_pos,
        "acceptance_rate_per_position": [c / num_drafts if num_drafts else 0.0 for c in per_pos],
        "conditional_acceptance_rate": [a / o if o else 0.0 for a, o in zip(per_pos, offered)],
        "offered_per_position": offered,
        "draft_coverage": num_drafts / len(steps) if steps else 0.0,
        "acceptance_histogram": hist,
        "tokens_per_step": generated / len(steps) if steps else 0.0,
        "time_ms": {
            key: sum(s.timings_ms.get(key, 0.0) for s in steps) for key in ("draft", "verify", "sample")
        },
    }


# ---- the recorder: events -> Trace --------------------------------------------------------
class Recorder:
    """Subscribes to an :class:`~specviz.events.EventBus` and builds a :class:`Trace`."""

    def __init__(self, bus: ev.EventBus):
        self.trace: Trace | None = None
        self._draft: ev.DraftProposed | None = None
        self._pending: dict[str, Any] | None = None
        self._unsubscribe = [
            bus.subscribe(ev.GenerationStarted, self._on_start),
            bus.subscribe(ev.DraftProposed, self._on_draft),
            bus.subscribe(ev.StepVerified, self._on_verified),
            bus.subscribe(ev.TokensCommitted, self._on_committed),
            bus.subscribe(ev.GenerationFinished, self._on_finished),
        ]

    def close(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()

    def _on_start(self, e: ev.GenerationStarted) -> None:
        self.trace = Trace(config=dict(e.config), prompt_token_ids=list(e.prompt_token_ids))

    def _on_draft(self, e: ev.DraftProposed) -> None:
        self._draft = e

    def _on_verified(self, e: ev.StepVerified) -> None:
        self._pending = {"event": e}

    def _on_committed(self, e: ev.TokensCommitted) -> None:
        draft, verified = self._draft, self._pending["event"]
        rec = verified.record
        self.trace.steps.append(
            Step(
                index=e.step,
                proposer=draft.proposer,
                draft_token_ids=list(draft.token_ids),
                num_accepted=rec["num_accepted"],
                emitted=Emitted(**rec["emitted"]),
                positions=[Position(**p) for p in rec["positions"]],
                committed_token_ids=list(e.token_ids),
                match=draft.details,
                block=rec.get("block"),
                timings_ms={"draft": draft.draft_ms, "verify": verified.verify_ms, "sample": verified.sample_ms},
                sampler_backend=rec.get("backend", "reference"),
            )
        )

    def _on_finished(self, e: ev.GenerationFinished) -> None:
        t = self.trace
        t.output_token_ids = list(e.output_token_ids)
        t.wall_time_s = e.wall_time_s
        t.target_forward_passes = e.target_forward_passes
        t.stop_reason = e.stop_reason
        t.tokens_per_second = len(t.output_token_ids) / e.wall_time_s if e.wall_time_s > 0 else 0.0
        t.metrics = compute_metrics(t.steps, int(t.config.get("num_speculative_tokens", 0)))
