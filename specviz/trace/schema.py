"""The trace: plain data recorded from engine events, the single source of every view.

A :class:`Trace` holds the request's settings, one :class:`Step` per verification step and
the totals. It round-trips through JSON (:meth:`Trace.to_json` / :meth:`Trace.from_json`);
loading validates the data's shape and types and never executes anything, so an uploaded
trace is safe to view.

Metric definitions (:class:`specviz.trace.RunMetrics`, the one place they are computed) follow vLLM
(``v1/spec_decode/metrics.py``) and docs/design/algorithms.md, counted from what was **committed**, not from what
the sampler decided: when the request stops at an EOS inside a step, the sampler's later accepted drafts and its
emitted token are dropped (:attr:`Step.num_accepted` keeps the sampler's decision; :attr:`Step.committed_token_ids`
what was kept). vLLM counts a step's accepted drafts as its output tokens - 1 (``len(generated_token_ids) - 1``,
the sampler's tokens); specviz takes the same count over the committed tokens, so every drafting step counts
1 + accepted tokens: a step cut by the stop counts its last committed token (the EOS) as its one token of its own
(:func:`specviz.trace.metrics.counted`). max_new_tokens never cuts a step (k' <= remaining - 1).

* num_drafts: steps whose proposer drafted k' > 0 tokens; num_draft_tokens: sum of k'.
* num_discarded_draft_tokens: drafts of a step cut by the stop from the stop's position on
  (neither accepted nor rejected: the output ended there).
* num_accepted_tokens: sum over drafting steps of (committed tokens - 1).
* mean_acceptance_length = 1 + num_accepted_tokens / num_drafts
  = committed tokens of drafting steps / num_drafts (for every run; 1.0 with no drafts).
* draft_acceptance_rate = num_accepted_tokens / (num_draft_tokens - num_discarded_draft_tokens).
* accepted_per_position[i] = #drafting steps that counted >= i+1 accepted drafts (vLLM's
  counts); acceptance_rate_per_position[i] = that / num_drafts (unconditional);
  conditional_acceptance_rate[i] = P(accept i+1 | accepted i) = accepted_per_position[i] /
  offered_per_position[i], where offered_per_position[i] = #drafting steps whose position i+1 was
  drafted, not discarded, and reached (accepted >= i); a tree path that ended at a leaf (bonus token)
  offered nothing past it (:func:`specviz.trace.metrics.tested_depth`).
* drafted_per_depth[i] = #drafting steps whose draft reached depth (position) i+1, not discarded;
  acceptance_rate_per_depth[i] = accepted_per_position[i] / drafted_per_depth[i];
  depth_acceptance_rate = num_accepted_tokens / sum(drafted_per_depth) (accepted / depths drafted).
  A chain's depths are its draft tokens, so there it equals draft_acceptance_rate; a tree drafts N
  nodes per step of which at most its depth can be accepted, so its draft_acceptance_rate (per node)
  is not comparable with a chain's, and this is.
* draft_coverage = num_drafts / num_steps (share of steps that had a draft; vllm#24344).
* acceptance_histogram[j] = #drafting steps with exactly j counted accepted drafts.
* tokens_per_step = tokens_per_target_forward = committed tokens / verification steps
  (:func:`tokens_per_target_forward`; the one definition every view and label uses).

Trees (version 2): a step's ``nodes`` hold every drafted node (a chain's too, parents i - 1),
``accepted_path`` the accepted node ids; ``draft_token_ids`` and ``positions`` are the step's
*row*: the accepted path, then the last child tested at the node the step stopped at (rejected),
so the per-position views read a tree step like a chain. For a tree, "drafted" counts every node
(num_draft_tokens), "accepted" the accepted path (num_accepted = its length), "position i" is
depth i, and a node is discarded when the stop came at or before its depth (every node deeper than the
counted accepted drafts). For a chain these are the definitions above.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .validate import (BLOCK_SCHEMA, METRICS_SCHEMA, TOP2_ROW, TOP_PAIR, TraceFormatError, check, check_int_list, check_list,
                       check_metric_rates, check_obj, check_step_probabilities, config_schema, load_json_capped,
                       match_schema, take)

TRACE_VERSION = 2  # 2: steps have tree nodes; version-1 traces load (chain nodes built from positions)
READABLE_VERSIONS = (1, 2)
FATES = ("accepted", "rejected", "unvisited")
TREE_RULES = ("chain", "topk", "sampled")
MAX_TRACE_BYTES = 32 * 1024 * 1024  # uploads above this are refused


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
    the sampler drew it from p_j instead (docs/design/algorithms.md: "If Z == 0 numerically, fall back to
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
    rejected child), ``nodes`` the whole tree (module docstring). ``logit_top2``: per committed token, the
    target's two largest logits where it was decided, [top-1 id, logit, top-2 id, logit] (the model's own
    rounding; empty when not recorded: a brief trace, or one written before it existed); the losslessness
    check reads it (:mod:`specviz.compare.lossless`)."""

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
    logit_top2: list[list[float]] = field(default_factory=list)

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
        obj = check_obj(data, "trace")
        version = obj.get("version")
        if version not in READABLE_VERSIONS or isinstance(version, bool):
            raise TraceFormatError(f"trace.version must be one of {READABLE_VERSIONS}, got {version!r}")
        kw = take(obj, cls, "trace", nested={"steps"})
        kw["steps"] = [_step_from_dict(s, i, version)
                       for i, s in enumerate(check_list(obj.get("steps", []), "trace.steps"))]
        kw["version"] = TRACE_VERSION  # a version-1 trace is upgraded (chain nodes built)
        check_int_list(kw["prompt_token_ids"], "trace.prompt_token_ids")
        check_int_list(kw["output_token_ids"], "trace.output_token_ids")
        check(kw["config"], config_schema(), "trace.config")
        check(kw.get("metrics", {}), METRICS_SCHEMA, "trace.metrics")
        check_metric_rates(kw.get("metrics", {}))
        check(kw.get("token_texts", {}), {str: str}, "trace.token_texts")
        _check_vocab(kw)
        return cls(**kw)




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



def _step_from_dict(data: Any, i: int, version: int = TRACE_VERSION) -> Step:
    where = f"trace.steps[{i}]"
    obj = check_obj(data, where)
    kw = take(obj, Step, where, nested={"emitted", "positions", "nodes"})
    kw["emitted"] = Emitted(**take(check_obj(obj.get("emitted"), f"{where}.emitted"), Emitted, f"{where}.emitted"))
    kw["positions"] = [
        Position(**take(check_obj(p, f"{where}.positions[{j}]"), Position, f"{where}.positions[{j}]"))
        for j, p in enumerate(check_list(obj.get("positions", []), f"{where}.positions"))
    ]
    check_int_list(kw["draft_token_ids"], f"{where}.draft_token_ids")
    check_int_list(kw["committed_token_ids"], f"{where}.committed_token_ids")
    for name, schema in (("match", match_schema(kw.get("match"))), ("block", BLOCK_SCHEMA), ("timings_ms", {str: float})):
        if kw.get(name) is not None:
            check(kw[name], schema, f"{where}.{name}")
    check(kw["emitted"].top, [TOP_PAIR], f"{where}.emitted.top")
    check(kw.get("logit_top2", []), [TOP2_ROW], f"{where}.logit_top2")
    for j, pos in enumerate(kw["positions"]):
        for name in ("p_top", "q_top", "residual_top"):
            check(getattr(pos, name), [TOP_PAIR], f"{where}.positions[{j}].{name}")
    if version == 1 or "nodes" not in obj:
        kw["nodes"] = chain_nodes(kw["draft_token_ids"], kw["num_accepted"], kw["positions"])
        kw["accepted_path"], kw["tree_rule"] = list(range(min(kw["num_accepted"], len(kw["draft_token_ids"])))), "chain"
    else:
        kw["nodes"] = [TreeNode(**take(check_obj(n, f"{where}.nodes[{j}]"), TreeNode, f"{where}.nodes[{j}]"))
                       for j, n in enumerate(check_list(obj.get("nodes"), f"{where}.nodes"))]
        check_int_list(kw.get("accepted_path", []), f"{where}.accepted_path")
        _check_tree(kw, where)
    step = Step(**kw)
    check_step_probabilities(step, where)
    return step


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

