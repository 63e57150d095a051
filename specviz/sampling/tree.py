"""The PyTorch reference tree verifier: greedy, rule A (deterministic children), rule B (sampled children).

A draft tree (:mod:`specviz.tree`): N nodes, ``parents[i] < i`` (-1 = the root, the last committed
token x_n, already a target sample and always kept). One target forward gave p at the root and
at every node: row 0 = p at the root, row 1 + i = p after node i (both after the request's
processing). Children of a node are visited in node order, fixed before any target randomness
is drawn (docs/design/methods.md 1.4, 3.4: EAGLE-2 sorts ``retrieve_indices``; static trees by child rank).

Rules (docs/design/methods.md 1.4; docs/design/algorithms.md for the names):

* ``"greedy"`` (T = 0): at node u, y = argmax p_u; go to the child holding y, else emit y and
  stop (SpecInfer ``VerifyGreedy``; EAGLE / Medusa ``evaluate_posterior``; SGLang
  ``verify_tree_greedy``). Equals plain greedy decoding.
* ``"topk"``, rule A (deterministic children: top-k, static trees, EAGLE-2; q is one-hot):
  sequential form of EAGLE ``utils.py::evaluate_posterior``: r = p_u; for each child c in order
  draw U; accept if U <= r(tok_c), else set r(tok_c) = 0 and renormalise. No child accepted: emit
  y ~ r (p_u with every child's token removed, renormalised). At a leaf: the bonus y ~ p_u. Since
  the children before c were all rejected when c is tested, r(tok_c) = p_u(tok_c) /
  (1 - sum of p_u over the earlier siblings' distinct tokens): computed in that closed form for
  every node at once (an earlier duplicate of tok_c makes r(tok_c) = 0).
* ``"sampled"``, rule B (children drawn i.i.d. from q_u, ``q[i]`` = the distribution node i was
  drawn from): SpecInfer multi-step speculative sampling (arXiv 2305.09781, Alg. 2
  ``VerifyStochastic``, Theorem 4.2): r = p_u; for each child s in order draw U; accept if
  U <= r(x_s) / q_s(x_s); else r = norm(max(r - q_s, 0)). No child accepted: emit y ~ r.
  (SpecInfer takes the children in random order; i.i.d. children are exchangeable, so node
  order is equally lossless.) Using the draft softmax as q for top-k children is NOT lossless
  (tests/test_tree_sampling.py shows the chi-square failing).

Every node's test is computed as if it were reached (its parent on the path, its earlier siblings
rejected: exactly the state in which the sequential walk tests it), and the emitted token's race
is run at every row; one host read, then a walk down the tree picks the path. Only the tested
nodes' uniforms are compared: a node is "accepted", "rejected" (tested, failed) or "unvisited".

Noise: :func:`~specviz.sampling.types.draw_noise` (1, N, V): u[0, i] is node i's uniform
(float64), exp[0] the exponential race's E for the one emitted token (argmax w / E over w > 0,
ties to the lowest index), exactly as the chain sampler. If the weights sum to 0, w = p_u.

Block verification is chain-only (Sun et al. 2024 define it for one path); synthetic rates are
per chain position: both refused here with a ValueError.

No Triton kernel: at batch 1 with N <= 64 nodes the work is a scatter and one race over [1 + N, V]
(65 x 8192 for the bundled target), a few kernel launches; the chain kernels exist because of the
batched [B, K, V] layout, which trees here do not have. Rule B's residual chain is a loop over the
nodes (3 small ops each, no host sync). The one host sync is the walk's read of the decisions. On CUDA the
engine's :meth:`specviz.verify.tree.TreeVerification.queue_tree` captures greedy and rule A (:func:`tree_decisions`,
fixed shapes, no host read; the walk's result too, :func:`device_path`) as one CUDA graph per tree size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from specviz.sampling.types import SamplerNoise, draw_noise
from specviz.transfer import HostCopy, to_device
from specviz.tree import ancestor_mask_device, validate_parents
from specviz.tree import children as tree_children

RULES = ("greedy", "topk", "sampled")
FATES = ("accepted", "rejected", "unvisited")


@dataclass
class TreeVerifyOutput:
    """What :func:`verify_tree` decided. Host values unless marked (device).

    path:             accepted nodes, root child first (the committed drafts).
    token_id:         the emitted token (recovered or bonus).
    kind:             "recovered" (some child of the last path node was rejected) or "bonus" (it is a leaf).
    output_token_ids: path tokens + token_id (len(path) + 1).
    fate:             N strings in FATES.
    tested:           N bools: the node's test ran (accepted or rejected).
    emit_node:        the node the token was emitted after (-1: the root).
    p:                float32 [N] (device) p at the node's parent of the node's token (0 for an id outside [0, V)).
    q:                float32 [N] (device) q_i(tok_i): 1 for one-hot (greedy, topk), the sampled q otherwise.
    u:                float64 [N] (device) the uniforms (0 for greedy).
    accept_prob:      float32 [N] (device) the node's acceptance probability when tested: rule A r(tok_c),
                      rule B min(1, r(x_s) / q_s(x_s)), greedy 1 / 0 (token == argmax p at the parent).
    emit_weights:     float32 [V] (device) the (unnormalised) weights the emitted token was drawn from:
                      the residual after the last node's children were rejected, p at a leaf (bonus),
                      p when the residual summed to 0; greedy: p at the last node (its argmax was taken).
    emit_fallback:    the residual summed to 0, so the token was drawn from p.
    rule:             the rule that ran.
    """

    path: list[int]
    token_id: int
    kind: str
    output_token_ids: list[int]
    fate: list[str]
    tested: list[bool]
    emit_node: int
    p: torch.Tensor
    q: torch.Tensor
    u: torch.Tensor
    accept_prob: torch.Tensor
    emit_weights: torch.Tensor
    emit_fallback: bool
    rule: str
    token_ids: list[int]  # the N node tokens (host, from the same copy)
    host: dict[str, list[float]]  # p, q, u, accept_prob as host lists (same copy)


def draw_tree_noise(num_nodes: int, vocab_size: int, generator: torch.Generator | None = None,
                    device: torch.device | str | None = None) -> SamplerNoise:
    """Noise for one tree: u float64 [1, N] (one per node), exp float32 [1, V] (the race)."""
    return draw_noise(1, num_nodes, vocab_size, generator=generator, device=device)


def verify_tree(target_probs: torch.Tensor, token_ids: torch.Tensor, parents: list[int],
                draft_probs: torch.Tensor | None = None, *, rule: str = "topk",
                noise: SamplerNoise | None = None, generator: torch.Generator | None = None) -> TreeVerifyOutput:
    """Verify one draft tree against the target; emit the accepted path + 1 token.

    target_probs: float [1 + N, V]: row 0 = p at the root, row 1 + i = p after node i (processed).
    token_ids:    int [N] node tokens (an id outside [0, V) is never accepted).
    parents:      N ints, -1 <= parents[i] < i.
    draft_probs:  float [N, V], rule "sampled" only: q_i, the distribution node i was drawn from.
    rule:         "greedy" | "topk" | "sampled" (module docstring).
    noise:        SamplerNoise for (1, N, V), or None: drawn from ``generator`` (greedy draws none).
    Returns a :class:`TreeVerifyOutput`. Raises ValueError for an unknown rule, shapes that do
    not match, draft_probs missing for "sampled" (or given for another rule), a non-finite q row.
    (:func:`queue_verify_tree` then :meth:`QueuedTreeVerify.finish`.)
    """
    return queue_verify_tree(target_probs, token_ids, parents, draft_probs, rule=rule, noise=noise,
                             generator=generator).finish()


@dataclass
class QueuedTreeVerify:
    """:func:`verify_tree`'s device work, queued: every node's decision and every row's emitted token are
    computed and their host copy is on its way (:class:`~specviz.transfer.HostCopy`); :meth:`finish` reads it
    (the one wait) and walks the tree. Tensors as in :class:`TreeVerifyOutput` (device)."""

    num_nodes: int
    rule: str
    decisions: TreeDecisions  # the device tensors behind ``copy``
    copy: HostCopy  # pack_decisions: [passed N | emitted 1 + N | empty 1 + N | ids N | p_x, q_x, u, acc N each]
    parents: list[int] | None  # the validated host parents it was queued with; None: queued from device parents
    rows: torch.Tensor  # int64 [N] the nodes' parent rows (device)

    def finish(self, parents: Sequence[int] | None = None) -> TreeVerifyOutput:
        """Walk the tree. ``parents``: for a tree queued from device parents, their host copy (validated here:
        ValueError when invalid or not N long); a tree queued with host parents walks those (the argument, if
        given, is the same tree)."""
        if self.parents is None:
            if parents is None:
                raise ValueError("this tree was queued from device parents: finish() needs their host copy")
            parents = validate_parents(parents)
            if len(parents) != self.num_nodes:
                raise ValueError(f"parents has {len(parents)} nodes; the queued verification has {self.num_nodes}")
        return _walk(self.parents if self.parents is not None else parents, self)


def queue_verify_tree(target_probs: torch.Tensor, token_ids: torch.Tensor, parents: list[int] | torch.Tensor,
                      draft_probs: torch.Tensor | None = None, *, rule: str = "topk",
                      noise: SamplerNoise | None = None,
                      generator: torch.Generator | None = None) -> QueuedTreeVerify:
    """:func:`verify_tree`'s device half, without a host wait: ``parents`` a host list or int64 [N] on the
    device (a tree drafted there, EAGLE-2: the verification is queued before the tree's host copy is read;
    rule "sampled" reads device parents to the host, its residual chain is built per node). Other arguments
    and errors as :func:`verify_tree` (a host ``parents`` is validated here, device ones in ``finish``)."""
    if isinstance(parents, torch.Tensor):
        N = int(parents.numel())
        if rule == "sampled":
            parents = parents.tolist()  # rule B's residual chain follows the parents on the host
    else:
        parents = validate_parents(parents)
        N = len(parents)
    V = _check(target_probs, token_ids, N, draft_probs, rule)
    p = target_probs.float()
    ids = token_ids.long().to(p.device)
    rows = parent_rows(parents, N, p.device)
    if rule != "greedy" and noise is None:
        noise = draw_tree_noise(N, V, generator, p.device)
    d = tree_decisions(p, ids, rows, rule, noise, None if draft_probs is None else draft_probs.float().to(p.device),
                       parents if rule == "sampled" else None)
    return QueuedTreeVerify(N, rule, d, HostCopy(pack_decisions(d, ids)),
                            None if isinstance(parents, torch.Tensor) else parents, rows)


def parent_rows(parents: Sequence[int] | torch.Tensor, N: int, device: torch.device) -> torch.Tensor:
    """int64 [N] on ``device``: node i's parent row in the forward (parents[i] + 1; row 0 = the root). Device
    parents are clamped to 0..N, so an invalid tree is refused by the walk (ValueError), never an out-of-range
    read; a host list is queued in one pinned copy."""
    if isinstance(parents, torch.Tensor):
        return (parents.long().to(device) + 1).clamp(0, N)
    return to_device(torch.tensor([u + 1 for u in parents], dtype=torch.long), device)


@dataclass
class TreeDecisions:
    """Every node's test and every row's emitted token (device tensors; N nodes, V tokens).

    passed: bool [N] the node's test passes (if reached); emit: int64 [1 + N] the token row r would emit;
    empty: bool [1 + N] row r's residual summed to 0 (drawn from p); p_x / q_x / u / acc: [N] as
    :class:`TreeVerifyOutput`'s p, q, u, accept_prob; weights: float32 [1 + N, V] each row's emit weights."""

    passed: torch.Tensor
    emit: torch.Tensor
    empty: torch.Tensor
    p_x: torch.Tensor
    q_x: torch.Tensor
    u: torch.Tensor
    acc: torch.Tensor
    weights: torch.Tensor


def tree_decisions(p: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor, rule: str, noise: SamplerNoise | None,
                   q: torch.Tensor | None = None, parents: list[int] | None = None) -> TreeDecisions:
    """The tree verifier's device work (module docstring): p float32 [1 + N, V]; ids int64 [N] (an id outside
    [0, V) is never accepted); rows int64 [N] (:func:`parent_rows`); noise for (1, N, V) (None for greedy);
    rule "sampled" also q [N, V] and the host ``parents``. Greedy and "topk" are fixed-shape device ops with no
    host read (:class:`specviz.verify.StepVerifier` captures them in a CUDA graph); "sampled" loops over
    the nodes on the host. Inputs are not checked here (:func:`queue_verify_tree` does)."""
    N, V = int(ids.numel()), int(p.shape[1])
    ok_id = (ids >= 0) & (ids < V)  # [N]
    safe = torch.where(ok_id, ids, torch.zeros_like(ids))
    p_x = torch.where(ok_id, p[rows, safe], 0.0) if N else p.new_zeros(0)  # [N]
    u = noise.u[0] if rule != "greedy" else torch.zeros(N, dtype=torch.float64, device=p.device)
    if rule == "greedy":
        argmax = p.argmax(dim=-1)  # [1 + N]
        acc = (ok_id & (ids == argmax[rows])).float() if N else p.new_zeros(0)
        return TreeDecisions(acc > 0, argmax, torch.zeros(N + 1, dtype=torch.bool, device=p.device), p_x,
                             torch.ones_like(p_x), u, acc, p)
    if rule == "topk":
        acc, weights = _rule_a(p, safe, ok_id, rows, N)
        q_x = torch.ones_like(p_x)
    else:
        acc, weights, q_x = _rule_b(p, q, safe, ok_id, parents)
    weights, emit, empty = _race(weights, p, noise.exp[0])
    return TreeDecisions(u <= acc.double(), emit, empty, p_x, q_x, u, acc, weights)


def pack_decisions(d: TreeDecisions, ids: torch.Tensor) -> torch.Tensor:
    """float64 [8N + 2], the one device-to-host copy the walk reads: [passed N | emitted 1 + N | empty 1 + N |
    ids N | p_x, q_x, u, acc N each] (ids exact in float64)."""
    return torch.cat([d.passed.double(), d.emit.double(), d.empty.double(), ids.double(), d.p_x.double(),
                      d.q_x.double(), d.u.double(), d.acc.double()])


def device_path(passed: torch.Tensor, rows: torch.Tensor, emit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The walk's result by device ops only (no host read; inside the verifier's CUDA graph), for the engine's
    next step: (the emitted token int64 [1], the kept rows int64 [1 + N]: 0 (the root), then 1 + each accepted
    node in path order, then N as padding). A node is on the path iff it and each of its ancestors is the first
    passing child of its parent (children in node order), as :func:`_walk` finds it; the path is in node order
    since parents precede children. passed bool [N], rows int64 [N] (:func:`parent_rows`), emit int64 [1 + N]."""
    N = int(passed.numel())
    if N == 0:
        return emit[:1].clone(), torch.zeros(1, dtype=torch.long, device=emit.device)
    idx = torch.arange(N, device=passed.device)
    earlier = torch.ones(N, N, dtype=torch.bool, device=passed.device).tril(-1) & (rows[:, None] == rows[None, :])
    first = passed & ~(earlier & passed[None, :]).any(dim=1)  # passes, and no earlier sibling does
    on_path = ~(ancestor_mask_device(rows - 1) & ~first[None, :]).any(dim=1)  # [N]
    last = torch.where(on_path, idx, -1).max()  # the deepest accepted node, -1: none
    token = emit.gather(0, (last + 1).reshape(1))
    kept = torch.where(on_path, idx + 1, N).sort().values  # path rows in node order, then padding N
    return token, torch.cat([torch.zeros(1, dtype=torch.long, device=passed.device), kept])


def _check(target_probs, token_ids, N: int, draft_probs, rule) -> int:
    """Shapes and the rule; returns V."""
    if rule not in RULES:
        raise ValueError(f"unknown tree rule {rule!r}; choose one of {', '.join(RULES)} (block verification is "
                         "chain-only)")
    if not isinstance(target_probs, torch.Tensor) or target_probs.dim() != 2 or target_probs.shape[0] != N + 1:
        raise ValueError(f"target_probs must be [1 + N, V] = [{N + 1}, V] (root + {N} nodes), got "
                         f"{list(getattr(target_probs, 'shape', []))}")
    V = int(target_probs.shape[1])
    if not isinstance(token_ids, torch.Tensor) or tuple(token_ids.shape) != (N,) or token_ids.is_floating_point():
        raise ValueError(f"token_ids must be an integer tensor [N] = [{N}], got {getattr(token_ids, 'shape', None)}")
    if rule == "sampled":
        if draft_probs is None or tuple(draft_probs.shape) != (N, V):
            raise ValueError(f"rule 'sampled' (SpecInfer rule B) needs draft_probs [N, V] = [{N}, {V}], the q each "
                             f"node was drawn from, got {None if draft_probs is None else list(draft_probs.shape)}")
        if N and not bool(torch.isfinite(draft_probs).all()):
            raise ValueError("draft_probs hold a non-finite value")
    elif draft_probs is not None:
        raise ValueError(f"rule {rule!r} treats q as one-hot (deterministic children); draft_probs must be None "
                         "(give them with rule 'sampled' for children drawn from q)")
    return V


def _rule_a(p, ids, ok_id, rows, N: int):
    """Rule A for every node at once: acc [N] = r(tok_c) given the earlier siblings rejected;
    weights [1 + N, V] = p at each row with every child's token removed (the residual)."""
    if N == 0:
        return p.new_zeros(0), p
    same_parent = rows[:, None] == rows[None, :]  # [N, N]
    earlier = torch.ones(N, N, dtype=torch.bool, device=p.device).tril(-1) & same_parent  # j < i, same parent
    dup = (earlier & (ids[:, None] == ids[None, :])).any(dim=1)  # an earlier sibling has this token
    p_x = torch.where(ok_id, p[rows, ids], 0.0)
    first = ok_id & ~dup  # each distinct token counted once
    # mass removed before node i: distinct valid tokens of earlier siblings
    removed = (earlier & first[None, :]).float() @ torch.where(first, p_x, 0.0)  # [N]
    left = 1.0 - removed
    acc = torch.where(first & (left > 0), p_x / left.clamp_min(1e-30), 0.0).clamp(max=1.0)
    children = torch.zeros_like(p).index_put_((rows, ids), ok_id.float(), accumulate=True)  # no boolean index: no sync
    return acc, torch.where(children > 0, 0.0, p)


def _rule_b(p, q, ids, ok_id, parents):
    """Rule B (SpecInfer MSS): acc [N] = min(1, r(x_s) / q_s(x_s)) with r the residual after the
    earlier siblings; weights [1 + N, V] = each row's residual after all its children; q_x [N]."""
    N = len(parents)
    r = [p[row] for row in range(N + 1)]  # current residual per parent row (never written in place)
    acc, q_x = [], []
    for i in range(N):
        row = parents[i] + 1
        qi = q[i]
        qx = torch.where(ok_id[i], qi[ids[i]], 0.0)
        rx = torch.where(ok_id[i], r[row][ids[i]], 0.0)
        acc.append(torch.where(qx > 0, (rx / qx.clamp_min(1e-30)).clamp(max=1.0), 0.0))
        q_x.append(qx)
        resid = (r[row] - qi).clamp_min(0.0)
        total = resid.sum()
        r[row] = torch.where(total > 0, resid / total.clamp_min(1e-30), p[row])  # Z = 0: r = q, never reached
    stack = (lambda xs: torch.stack(xs)) if N else (lambda xs: p.new_zeros(0))
    return stack(acc), torch.stack(r), stack(q_x)


def _race(weights, p, exp):
    """Exponential race per row: (weights after the sum-0 fallback [1 + N, V], token [1 + N],
    whether the row's weights summed to 0 [1 + N] bool)."""
    zero = weights.sum(dim=-1, keepdim=True) == 0
    w = torch.where(zero, p, weights)
    score = (w / exp[None, :]).masked_fill(w == 0, -1.0)
    return w, score.argmax(dim=-1), zero[:, 0]


def _walk(parents: list[int], queued: QueuedTreeVerify) -> TreeVerifyOutput:
    """Read the decisions once (the queued host copy) and walk from the root: the first passing child in node order."""
    N = len(parents)
    host = queued.copy.tolist()
    ok = [v > 0 for v in host[:N]]
    emit_host, empty_host = host[N : 2 * N + 1], [v > 0 for v in host[2 * N + 1 : 3 * N + 2]]
    tokens = [int(v) for v in host[3 * N + 2 : 4 * N + 2]]
    node_host = {name: host[4 * N + 2 + j * N : 4 * N + 2 + (j + 1) * N]
                 for j, name in enumerate(("p", "q", "u", "accept_prob"))}
    kids = tree_children(parents)
    fate, tested = ["unvisited"] * N, [False] * N
    path, node = [], -1
    while True:
        nxt = None
        for c in kids[node + 1]:
            tested[c] = True
            if ok[c]:
                fate[c], nxt = "accepted", c
                break
            fate[c] = "rejected"
        if nxt is None:
            break
        path.append(nxt)
        node = nxt
    token = int(emit_host[node + 1])
    d = queued.decisions
    w = d.weights[node + 1]
    fallback = bool(kids[node + 1]) and bool(empty_host[node + 1])
    return TreeVerifyOutput(path=path, token_id=token, kind="recovered" if kids[node + 1] else "bonus",
                            output_token_ids=[tokens[c] for c in path] + [token], fate=fate, tested=tested,
                            emit_node=node, p=d.p_x, q=d.q_x, u=d.u, accept_prob=d.acc,
                            emit_weights=w, emit_fallback=fallback, rule=queued.rule, token_ids=tokens, host=node_host)

