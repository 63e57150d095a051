"""The trace: plain data recorded from engine events, the single source of every view.

A :class:`Trace` holds the request's settings, one :class:`Step` per verification step and
the totals. It round-trips through JSON (:meth:`Trace.to_json` / :meth:`Trace.from_json`);
loading validates the data's shape and types and never executes anything, so an uploaded
trace is safe to view.

Metric definitions follow vLLM (``v1/spec_decode/metrics.py``) and algorithms.md, counted
from what was **committed**, not from what the sampler decided: when the request stops (EOS or
max_new_tokens) inside a step, the sampler's later accepted drafts and its emitted token are
dropped (:attr:`Step.num_accepted` keeps the sampler's decision; :attr:`Step.committed_token_ids`
what was kept; :attr:`Step.num_accepted_committed`, :attr:`Step.emitted_committed` and
:attr:`Step.num_drafts_discarded` derive the rest), and every metric counts only what was kept.
vLLM's scheduler counts the sampler's decision instead (``len(generated_token_ids) - 1``).

* num_drafts: steps whose proposer drafted k' > 0 tokens; num_draft_tokens: sum of k'.
* num_discarded_draft_tokens: drafts after the stop of a step cut by EOS / max_new_tokens
  (neither accepted nor rejected: the output ended before them).
* num_accepted_tokens: committed accepted drafts (sum of num_accepted_committed).
* mean_acceptance_length = committed tokens of drafting steps / num_drafts
  (= 1 + num_accepted_tokens / num_drafts when no step was cut; 1.0 with no drafts).
* draft_acceptance_rate = num_accepted_tokens / (num_draft_tokens - num_discarded_draft_tokens).
* accepted_per_position[i] = #drafting steps that committed >= i+1 accepted drafts (vLLM's
  counts); acceptance_rate_per_position[i] = that / num_drafts (unconditional);
  conditional_acceptance_rate[i] = P(accept i+1 | accepted i) = accepted_per_position[i] /
  offered_per_position[i], where offered_per_position[i] = #drafting steps whose position i+1 was
  drafted, not discarded, and reached (accepted >= i).
* drafted_per_depth[i] = #drafting steps whose draft reached depth (position) i+1, not discarded;
  acceptance_rate_per_depth[i] = accepted_per_position[i] / drafted_per_depth[i];
  depth_acceptance_rate = num_accepted_tokens / sum(drafted_per_depth) (accepted / depths drafted).
  A chain's depths are its draft tokens, so there it equals draft_acceptance_rate; a tree drafts N
  nodes per step of which at most its depth can be accepted, so its draft_acceptance_rate (per node)
  is not comparable with a chain's, and this is.
* draft_coverage = num_drafts / num_steps (share of steps that had a draft; vllm#24344).
* acceptance_histogram[j] = #drafting steps with exactly j committed accepted drafts.
* tokens_per_step = tokens_per_target_forward = committed tokens / verification steps
  (:func:`tokens_per_target_forward`; the one definition every view and label uses).

Trees (version 2): a step's ``nodes`` hold every drafted node (a chain's too, parents i - 1),
``accepted_path`` the accepted node ids; ``draft_token_ids`` and ``positions`` are the step's
*row*: the accepted path, then the last child tested at the node the step stopped at (rejected),
so the per-position views read a tree step like a chain. For a tree, "drafted" counts every node
(num_draft_tokens), "accepted" the accepted path (num_accepted = its length), "position i" is
depth i, and a node is discarded when the stop came before its depth (every node deeper than the
committed accepted drafts). For a chain these are the definitions above.
"""

from __future__ import annotations

import json
import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from . import events as ev

TRACE_VERSION = 2  # 2: steps have tree nodes; version-1 traces load (chain nodes built from positions)
READABLE_VERSIONS = (1, 2)
FATES = ("accepted", "rejected", "unvisited")
TREE_RULES = ("chain", "topk", "sampled")
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
    plain decoding step). position: 1-based slot in the step; p: its target probability (None:
    not recorded, a ``detailed_trace=False`` run); top: up to 20 [token_id, prob] of the distribution it was drawn from.

    residual_empty: a recovered token whose residual max(p_j - q_j, 0) was empty (Z_j = 0), so
    the sampler drew it from p_j instead (algorithms.md: "If Z == 0 numerically, fall back to
    p_i"); it may then equal the rejected draft. Z_j = 0 means p_j <= q_j everywhere, i.e.
    p_j = q_j (one-hot q: p_j one-hot at the draft), where standard and block verification accept
    with probability 1 up to rounding; only verify="synthetic", whose rejections are forced
    whatever p says, meets it in practice. The token then is what plain decoding from the
    target would draw at that position."""

    position: int
    token_id: int
    kind: str
    p: float | None  # None: not recorded (detailed_trace=False)
    top: list[list[float]] = field(default_factory=list)
    residual_empty: bool = False


@dataclass
class TreeNode:
    """One drafted node of a step (a chain's node i: parent i - 1, depth i + 1).

    id: node index (0-based, node order); parent: -1 (the root, the last committed token) or an
    earlier node; depth: 1 for a root child; token_id: the node's token; p: the target's
    probability of the token at its parent; q: the draft's (1.0 for one-hot q); u: the uniform it
    was compared with (None: none drawn or never tested); fate: "accepted" | "rejected" |
    "unvisited" (never tested: an ancestor or an earlier sibling decided first); score: the
    proposer's draft score (EAGLE-2: cumulative log-confidence), or None; accept_prob: the
    acceptance probability its test used (rule A r(c), rule B / chain min(1, p/q), greedy 1/0),
    None when not tested or not recorded (an addition to the shared contract, optional)."""

    id: int
    parent: int
    depth: int
    token_id: int
    p: float | None
    q: float | None
    u: float | None
    fate: str
    score: float | None = None
    accept_prob: float | None = None


@dataclass
class Step:
    """One verification step (one target forward over the k'+1 verify positions, or 1 + N tree rows).

    For a tree step ``draft_token_ids`` / ``positions`` are the row (accepted path + the last
    rejected child), ``nodes`` the whole tree (module docstring)."""

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
    nodes: list[TreeNode] = field(default_factory=list)
    accepted_path: list[int] = field(default_factory=list)
    tree_rule: str = "chain"

    @property
    def num_drafted(self) -> int:
        """Draft tokens this step proposed: every tree node (a chain: k')."""
        return len(self.nodes) if self.nodes else len(self.draft_token_ids)

    @property
    def is_tree(self) -> bool:
        """The step drafted a tree that is not a chain (some node's parent is not the node before it). A
        version-2 chain step has nodes too (parents i - 1): test this, not ``nodes``."""
        return any(n.parent != n.id - 1 for n in self.nodes)

    @property
    def draft_depth(self) -> int:
        """The deepest drafted position (a chain: k')."""
        return max((n.depth for n in self.nodes), default=0) if self.nodes else len(self.draft_token_ids)

    # What was committed, derived from num_accepted (the sampler's decision) and
    # committed_token_ids (what the stop kept: a prefix of accepted drafts + emitted token).
    @property
    def num_accepted_committed(self) -> int:
        """Accepted drafts that reached the output: min(num_accepted, len(committed_token_ids))."""
        return min(self.num_accepted, len(self.committed_token_ids))

    @property
    def emitted_committed(self) -> bool:
        """The step's own (recovered / bonus / target) token reached the output."""
        return len(self.committed_token_ids) > self.num_accepted

    @property
    def num_drafts_discarded(self) -> int:
        """Drafts after the stop (EOS / max_new_tokens) inside this step: 0 unless the step was cut
        (then every node deeper than the committed accepted drafts; a chain: k' - those)."""
        if self.emitted_committed:
            return 0
        if not self.nodes:
            return len(self.draft_token_ids) - self.num_accepted_committed
        return sum(1 for n in self.nodes if n.depth > self.num_accepted_committed)


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
        return cls.from_dict(load_json_capped(text, max_bytes, "trace", TraceFormatError))

    @classmethod
    def from_dict(cls, data: Any) -> "Trace":
        obj = _check_obj(data, "trace")
        version = obj.get("version")
        if version not in READABLE_VERSIONS or isinstance(version, bool):
            raise TraceFormatError(f"trace.version must be one of {READABLE_VERSIONS}, got {version!r}")
        kw = _take(obj, cls, "trace", nested={"steps"})
        kw["steps"] = [_step_from_dict(s, i, version)
                       for i, s in enumerate(_check_list(obj.get("steps", []), "trace.steps"))]
        kw["version"] = TRACE_VERSION  # a version-1 trace is upgraded (chain nodes built)
        _check_int_list(kw["prompt_token_ids"], "trace.prompt_token_ids")
        _check_int_list(kw["output_token_ids"], "trace.output_token_ids")
        _check(kw["config"], CONFIG_SCHEMA, "trace.config")
        _check(kw.get("metrics", {}), METRICS_SCHEMA, "trace.metrics")
        _check(kw.get("token_texts", {}), {str: str}, "trace.token_texts")
        _check_vocab(kw)
        return cls(**kw)


# ---- validation helpers (data only; nothing is ever executed) ----------------------------
def _check_vocab(kw: dict) -> None:
    """A trace whose config names its vocabulary (``vocab_size``, every trace the engine writes) holds only token ids
    in [0, vocab_size): the prompt, the output, each step's committed and emitted tokens. Raises TraceFormatError."""
    vocab = kw["config"].get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab <= 0:
        return
    seqs = [("trace.prompt_token_ids", kw["prompt_token_ids"]), ("trace.output_token_ids", kw["output_token_ids"])]
    for i, st in enumerate(kw["steps"]):
        seqs += [(f"trace.steps[{i}].committed_token_ids", st.committed_token_ids),
                 (f"trace.steps[{i}].emitted.token_id", [st.emitted.token_id])]
    for where, ids in seqs:
        bad = next((t for t in ids if isinstance(t, int) and not 0 <= t < vocab), None)
        if bad is not None:
            raise TraceFormatError(f"{where} holds token id {bad}, outside the trace's vocabulary of {vocab} "
                                   f"(config.vocab_size)")


def load_json_capped(text: str | bytes, max_bytes: int, what: str, error: type[ValueError]) -> Any:
    """``json.loads(text)`` for an upload: raises ``error`` if ``text`` is over ``max_bytes`` or not JSON
    (the message names ``what``: "trace", "comparison"). Plain data only: nothing is executed."""
    if len(text) > max_bytes:
        raise error(f"{what} is {len(text)} bytes; the limit is {max_bytes}")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"not valid JSON: {exc}") from None


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


def _step_from_dict(data: Any, i: int, version: int = TRACE_VERSION) -> Step:
    where = f"trace.steps[{i}]"
    obj = _check_obj(data, where)
    kw = _take(obj, Step, where, nested={"emitted", "positions", "nodes"})
    kw["emitted"] = Emitted(**_take(_check_obj(obj.get("emitted"), f"{where}.emitted"), Emitted, f"{where}.emitted"))
    kw["positions"] = [
        Position(**_take(_check_obj(p, f"{where}.positions[{j}]"), Position, f"{where}.positions[{j}]"))
        for j, p in enumerate(_check_list(obj.get("positions", []), f"{where}.positions"))
    ]
    _check_int_list(kw["draft_token_ids"], f"{where}.draft_token_ids")
    _check_int_list(kw["committed_token_ids"], f"{where}.committed_token_ids")
    for name, schema in (("match", MATCH_SCHEMA), ("block", BLOCK_SCHEMA), ("timings_ms", {str: float})):
        if kw.get(name) is not None:
            _check(kw[name], schema, f"{where}.{name}")
    _check(kw["emitted"].top, [TOP_PAIR], f"{where}.emitted.top")
    for j, pos in enumerate(kw["positions"]):
        for name in ("p_top", "q_top", "residual_top"):
            _check(getattr(pos, name), [TOP_PAIR], f"{where}.positions[{j}].{name}")
    if version == 1 or "nodes" not in obj:
        kw["nodes"] = chain_nodes(kw["draft_token_ids"], kw["num_accepted"], kw["positions"])
        kw["accepted_path"], kw["tree_rule"] = list(range(min(kw["num_accepted"], len(kw["draft_token_ids"])))), "chain"
    else:
        kw["nodes"] = [TreeNode(**_take(_check_obj(n, f"{where}.nodes[{j}]"), TreeNode, f"{where}.nodes[{j}]"))
                       for j, n in enumerate(_check_list(obj.get("nodes"), f"{where}.nodes"))]
        _check_int_list(kw.get("accepted_path", []), f"{where}.accepted_path")
        _check_tree(kw, where)
    return Step(**kw)


def _check_tree(kw: dict, where: str) -> None:
    """The nodes form a tree (ids 0..N-1, parent < id, depth = parent's + 1, known fates), the
    accepted path is a root-to-node path of accepted nodes, num_accepted is its length."""
    nodes = kw["nodes"]
    for j, n in enumerate(nodes):
        at = f"{where}.nodes[{j}]"
        if n.id != j:
            raise TraceFormatError(f"{at}.id is {n.id}; nodes must be numbered 0, 1, 2, ... in order")
        if not -1 <= n.parent < j:
            raise TraceFormatError(f"{at}.parent is {n.parent}; it must be -1 (the root) or an earlier node")
        if n.depth != (1 if n.parent < 0 else nodes[n.parent].depth + 1):
            raise TraceFormatError(f"{at}.depth is {n.depth}; it must be its parent's depth + 1")
        if n.fate not in FATES:
            raise TraceFormatError(f"{at}.fate must be one of {', '.join(FATES)}, got {n.fate!r}")
    path = kw.get("accepted_path", [])
    if kw.get("tree_rule", "chain") not in TREE_RULES:
        raise TraceFormatError(f"{where}.tree_rule must be one of {', '.join(TREE_RULES)}, got {kw['tree_rule']!r}")
    parent = -1
    for c in path:
        if not 0 <= c < len(nodes) or nodes[c].parent != parent or nodes[c].fate != "accepted":
            raise TraceFormatError(f"{where}.accepted_path {path} is not a path of accepted nodes from the root")
        parent = c
    if nodes and kw["num_accepted"] != len(path):
        raise TraceFormatError(f"{where}.num_accepted is {kw['num_accepted']} but the accepted path has {len(path)} nodes")


def chain_nodes(draft_token_ids: list[int], num_accepted: int, positions: list[Position],
                greedy: bool = False) -> list[TreeNode]:
    """The nodes of a chain step (node i: parent i - 1, depth i + 1) from its positions (p, q, u
    None where the step has no per-position record); fates: accepted below num_accepted, the
    next one rejected, the rest unvisited (block verification compares every eta, but only the
    first position after the accepted block decides). ``greedy``: no uniforms (u None)."""
    nodes = []
    for i, tok in enumerate(draft_token_ids):
        pos = positions[i] if i < len(positions) else None
        fate = "accepted" if i < num_accepted else ("rejected" if i == num_accepted else "unvisited")
        tested = fate != "unvisited"
        nodes.append(TreeNode(id=i, parent=i - 1, depth=i + 1, token_id=int(tok),
                              p=pos.p if pos else None, q=pos.q if pos else None,
                              u=pos.u if pos and tested and not greedy else None, fate=fate,
                              accept_prob=pos.accept_prob if pos and tested else None))
    return nodes


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
TRIE_NODE: dict[str, Any] = {"token_id": int, "count": int}
TRIE_NODE["children"] = [TRIE_NODE]
SUFFIX_CANDIDATE = {"source": str, "match_length": int, "node_count": int, "draft": [int], "probs": [float],
                    "counts": [int], "score": float}
MATCH_SCHEMA = {
    "kind": str, "backend": str, "greedy": bool,
    # ngram / ngram_gpu (prompt lookup)
    "n": int, "suffix": [int], "suffix_start": int, "occurrences": [int], "match_position": int,
    "tried": [{"n": int, "occurrences": int}], "trie": [TRIE_NODE], "prompt_lookup_min": int,
    "prompt_lookup_max": int,
    # suffix decoding
    "candidates": [SUFFIX_CANDIDATE], "chosen": (SUFFIX_CANDIDATE, None), "cached_requests": int,
    "config": {str: (float, bool, str, None)},
    # draft trees: EAGLE (proposers/eagle_tree.py), ranked n-gram / suffix trees (ranked_tree.py)
    "tree": str, "top_k": int, "depth": int, "total_tokens": int, "levels": int, "num_candidates": int,
    "choices": [[int]], "root_position": int, "tree_branches": int,
}
BLOCK_SCHEMA = {"P": [float], "rho": [float], "h": [float], "eta": [float], "tau": int}
_OPT_INT, _OPT_NUM, _OPT_STR = (int, None), (float, None), (str, None)
CONFIG_SCHEMA = {
    "method": str, "num_speculative_tokens": int, "verify": str, "temperature": float, "top_k": _OPT_INT,
    "top_p": _OPT_NUM, "max_new_tokens": int, "seed": int, "prompt_lookup_min": _OPT_INT,
    "prompt_lookup_max": _OPT_INT, "synthetic_rates": ([float], None), "sampler_backend": str,
    "detailed_trace": bool, "target": _OPT_STR, "draft": _OPT_STR, "device": _OPT_STR, "dtype": _OPT_STR,
    "runner": _OPT_STR, "compile": (bool, None), "prompt_length": int, "vocab_size": int, "speculative_token_tree": _OPT_STR,
    "graph_notes": [str],
}
METRICS_SCHEMA = {
    **{key: int for key in ("num_steps", "num_drafts", "num_draft_tokens", "num_discarded_draft_tokens",
                            "num_accepted_tokens", "num_generated_tokens")},
    **{key: float for key in ("mean_acceptance_length", "draft_acceptance_rate", "tokens_per_step",
                              "tokens_per_target_forward")},
    "accepted_per_position": [int], "acceptance_rate_per_position": [float],
    "conditional_acceptance_rate": [float], "acceptance_histogram": [int], "time_ms": {str: float},
    "drafted_per_depth": [int], "acceptance_rate_per_depth": [float], "depth_acceptance_rate": float,
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
    try:
        _check(value, schema, "")
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


def _check(value: Any, schema: Any, where: str) -> None:
    """Raise TraceFormatError (naming the field) unless ``value`` matches ``schema``."""
    if isinstance(schema, list):
        for i, item in enumerate(_check_list(value, where)):
            _check(item, schema[0], f"{where}[{i}]")
    elif isinstance(schema, dict) and set(schema) == {str}:
        for key, item in _check_obj(value, where).items():
            _check(item, schema[str], f"{where}.{key}")
    elif isinstance(schema, dict):
        obj = _check_obj(value, where)
        for key, sub in schema.items():
            if key in obj:
                _check(obj[key], sub, f"{where}.{key}")
    elif not _matches(value, schema):
        raise TraceFormatError(f"{where} must be {_describe_schema(schema)}, got {json.dumps(value)[:60]}")


# ---- metrics -----------------------------------------------------------------------------
TOKENS_PER_FORWARD_FORMULA = ("generated tokens / verification steps (one target forward each; the prefill "
                              "forward emits no token and is not counted)")


def tokens_per_target_forward(num_tokens: int, num_steps: int) -> float:
    """Tokens per target forward = committed tokens / verification steps (0.0 with no steps).

    Every verification step is one target forward over [last token, x_1..x_k'] and commits
    1..k'+1 tokens; the prefill forward (over prompt[:-1]) commits none and is NOT counted, so
    plain decoding (method "none") scores exactly 1.0 and ``Trace.target_forward_passes`` =
    steps + 1. vLLM (vllm-project/vllm#24344) calls output tokens / verification steps the
    "seq-normalized acceptance length". The hardware-independent speedup over method none is the
    ratio of this number."""
    return num_tokens / num_steps if num_steps else 0.0


def compute_metrics(steps: list[Step], num_speculative_tokens: int) -> dict[str, Any]:
    """vLLM's spec-decode metrics over ``steps``, from committed tokens (see module docstring)."""
    k = max([num_speculative_tokens, *(s.draft_depth for s in steps)] or [0])
    drafting = [s for s in steps if s.draft_token_ids or s.nodes]
    num_drafts = len(drafting)
    num_draft_tokens = sum(s.num_drafted for s in drafting)
    discarded = sum(s.num_drafts_discarded for s in drafting)
    acc = [s.num_accepted_committed for s in drafting]
    # positions (depths) drafted and not discarded: a chain's k' - discarded
    verified = [s.draft_depth if s.emitted_committed else s.num_accepted_committed for s in drafting]
    num_accepted = sum(acc)
    per_pos = [sum(1 for a in acc if a >= i + 1) for i in range(k)]
    hist = [sum(1 for a in acc if a == j) for j in range(k + 1)]
    offered = [sum(1 for a, n in zip(acc, verified) if n >= i + 1 and a >= i) for i in range(k)]
    reached = [sum(1 for n in verified if n >= i + 1) for i in range(k)]  # drafted_per_depth
    generated = sum(len(s.committed_token_ids) for s in steps)
    drafting_tokens = sum(len(s.committed_token_ids) for s in drafting)
    return {
        "num_steps": len(steps),
        "num_drafts": num_drafts,
        "num_draft_tokens": num_draft_tokens,
        "num_discarded_draft_tokens": discarded,
        "num_accepted_tokens": num_accepted,
        "num_generated_tokens": generated,
        "mean_acceptance_length": drafting_tokens / num_drafts if num_drafts else 1.0,
        "draft_acceptance_rate": num_accepted / (num_draft_tokens - discarded) if num_draft_tokens > discarded else 0.0,
        "accepted_per_position": per_pos,
        "acceptance_rate_per_position": [c / num_drafts if num_drafts else 0.0 for c in per_pos],
        "conditional_acceptance_rate": [a / o if o else 0.0 for a, o in zip(per_pos, offered)],
        "offered_per_position": offered,
        "drafted_per_depth": reached,
        "acceptance_rate_per_depth": [a / d if d else 0.0 for a, d in zip(per_pos, reached)],
        "depth_acceptance_rate": num_accepted / sum(reached) if sum(reached) else 0.0,
        "draft_coverage": num_drafts / len(steps) if steps else 0.0,
        "acceptance_histogram": hist,
        "tokens_per_step": tokens_per_target_forward(generated, len(steps)),
        "tokens_per_target_forward": tokens_per_target_forward(generated, len(steps)),
        "time_ms": {
            key: sum(s.timings_ms.get(key, 0.0) for s in steps) for key in ("draft", "verify", "sample")
        },
        "capture_ms": sum(s.timings_ms.get("capture", 0.0) for s in steps),  # excluded from time_ms
    }


# Mean acceptance length as engines report it (dashboard.md section 6; vllm#24344, EAGLE#146): key ->
# (short label, formula, who uses it). Every view that offers a convention switch reads this table.
ACCEPTANCE_LENGTH_CONVENTIONS = {
    "vllm": ("AL (vLLM)", "1 + accepted / drafts",
             "vLLM (v1/spec_decode/metrics.py), vllm bench, llama.cpp#24536, AIPerf: only steps that had a draft "
             "count; the emitted (recovered or bonus) token is included"),
    "per_forward": ("AL (per forward)", "tokens / verification steps",
                    "SGLang (completion_tokens / verify_ct), EAGLE's tau (new_tokens / steps), Spec-Bench's MAT, "
                    "vllm#24344's seq-normalized AL: every step counts, a step without a draft adds 1"),
    "drafts_only": ("AL − 1 (drafts only)", "accepted / drafts",
                    "accepted draft tokens per drafting step, the emitted token not counted (= vLLM's AL − 1; the "
                    "count TensorRT-LLM's forced-acceptance setting takes, per InferenceX)"),
}


def acceptance_length(m: dict[str, Any], convention: str = "vllm") -> float | None:
    """Mean acceptance length of :func:`compute_metrics`' ``m`` under ``convention`` (a key of
    ACCEPTANCE_LENGTH_CONVENTIONS): "vllm" = committed tokens of drafting steps / drafts (1 + accepted /
    drafts when no step was cut by a stop), "per_forward" = tokens / verification steps, "drafts_only"
    = vLLM's minus 1. None when the convention divides by drafts and nothing was drafted, or by steps and
    there were none. Raises ValueError for an unknown convention."""
    if convention not in ACCEPTANCE_LENGTH_CONVENTIONS:
        raise ValueError(f"unknown acceptance-length convention {convention!r}; choose from "
                         f"{', '.join(ACCEPTANCE_LENGTH_CONVENTIONS)}")
    if convention == "per_forward":
        return float(m["tokens_per_target_forward"]) if m["num_steps"] else None
    if not m["num_drafts"]:
        return None
    return float(m["mean_acceptance_length"]) - (1.0 if convention == "drafts_only" else 0.0)


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
        row = list(draft.token_ids) if "row" not in rec else [rec["nodes"][c]["token_id"] for c in rec["row"]]
        self.trace.steps.append(
            Step(
                index=e.step,
                proposer=draft.proposer,
                draft_token_ids=row,
                num_accepted=rec["num_accepted"],
                emitted=Emitted(**rec["emitted"]),
                positions=[Position(**p) for p in rec["positions"]],
                committed_token_ids=list(e.token_ids),
                match=draft.details,
                block=rec.get("block"),
                timings_ms={"draft": draft.draft_ms, "verify": verified.verify_ms, "sample": verified.sample_ms,
                            **({"capture": verified.capture_ms} if verified.capture_ms else {})},
                sampler_backend=rec.get("backend", "reference"),
                **self._tree_fields(rec, row),
            )
        )

    def _tree_fields(self, rec: dict[str, Any], draft_ids: list[int]) -> dict[str, Any]:
        """nodes / accepted_path / tree_rule of a step: from a tree record, else the chain's."""
        if "nodes" in rec:
            return {"nodes": [TreeNode(**n) for n in rec["nodes"]], "accepted_path": list(rec["accepted_path"]),
                    "tree_rule": rec["tree_rule"]}
        positions = [Position(**p) for p in rec["positions"]]
        greedy = self.trace.config.get("verify") == "greedy"
        acc = rec["num_accepted"]
        return {"nodes": chain_nodes(list(draft_ids), acc, positions, greedy),
                "accepted_path": list(range(min(acc, len(draft_ids)))), "tree_rule": "chain"}

    def _on_finished(self, e: ev.GenerationFinished) -> None:
        t = self.trace
        t.output_token_ids = list(e.output_token_ids)
        t.wall_time_s = e.wall_time_s
        t.target_forward_passes = e.target_forward_passes
        t.stop_reason = e.stop_reason
        t.tokens_per_second = len(t.output_token_ids) / e.wall_time_s if e.wall_time_s > 0 else 0.0
        t.metrics = compute_metrics(t.steps, int(t.config.get("num_speculative_tokens", 0)))
