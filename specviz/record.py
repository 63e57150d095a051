"""Turn one verification step's device tensors into the trace's plain-data step record.

The emitted token's distribution and the per-position residuals come from the sampler's own
definitions (:func:`specviz.sampling.reference.emitted_weights`, ``residual_weights``): the
record computes no sampling rule of its own.

:func:`gather_core` (the tokens the engine needs to go on) and :func:`gather_detail` (the
sampler's per-position decisions, top-20 of p, q, the residuals and the emitted token's
distribution) gather on the device; :func:`pack` puts each into one float64 vector, copied to the
host once (see :mod:`specviz.verify.chain`), where :func:`unpack` and :func:`host_record` turn it
into the trace's plain-data step record.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .sampling.reference import emitted_weights, residual_weights
from .sampling.types import KIND_NAMES, RejectionOutput

if TYPE_CHECKING:
    from .sampling.tree import TreeVerifyOutput
    from .transfer import HostCopy

TOP_N = 20


def _top(dist: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-n (values, ids) of non-negative weights dist [R, V], normalised per row."""
    total = dist.sum(dim=-1, keepdim=True)
    norm = torch.where(total > 0, dist / total.clamp_min(1e-30), torch.zeros_like(dist))
    vals, ids = torch.topk(norm, min(n, dist.shape[-1]), dim=-1)
    return vals, ids


def _row0(out: RejectionOutput) -> RejectionOutput:
    """``out`` restricted to row 0 (the engine verifies batch 1; the record reads row 0 only)."""
    if out.num_accepted.shape[0] == 1:
        return out
    from dataclasses import replace

    block = None if out.block is None else replace(out.block, P=out.block.P[:1])
    return replace(out, num_accepted=out.num_accepted[:1], num_draft=out.num_draft[:1], block=block,
                   emit_weights=None if out.emit_weights is None else out.emit_weights[:1],
                   emit_fallback=None if out.emit_fallback is None else out.emit_fallback[:1])


def gather_core(out: RejectionOutput, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the engine needs to go on (row 0): output ids [k'+1], num_accepted [1], draft ids [k']."""
    k = ids.numel()
    return {"output": out.output_token_ids[0, : k + 1], "num_accepted": out.num_accepted[:1], "draft": ids}


def gather_detail(out: RejectionOutput, p: torch.Tensor, q: torch.Tensor | None,
                  ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The rest of the trace's step record (row 0), on the device: per-position decisions, the top-20
    of p, q, the residuals and the emitted token's distribution (all four in one batched top-k),
    block verification's P, rho, h, eta. p: float32 [k'+1, V]; q: [k', V] or None; ids: [k']."""
    k = ids.numel()
    parts = dict(
        kind=out.token_kind[0, : k + 1], u=out.u[0, :k], p=out.p_draft[0, :k], q=out.q_draft[0, :k],
        accept_prob=out.accept_prob[0, :k], accepted=out.accepted[0, :k], residual_mass=out.residual_mass[0, :k],
    )
    qb = None if q is None else q[None]
    # the sampler's own definitions (specviz.sampling.reference), never a copy here
    resid = residual_weights(p[None], qb, ids[None], out.num_draft[:1])[0]  # [k', V]
    groups = [("p_top", p[: k + 1]), ("residual_top", resid)]
    if q is not None:
        groups.append(("q_top", q.float()))
    emit_w, emit_empty = emitted_weights(_row0(out), p[None], qb, ids[None])  # [1, V], [1]
    groups.append(("emit_top", emit_w))
    vals, top_ids = _top(torch.cat([d for _, d in groups]), TOP_N)  # [rows, 20]
    row = 0
    for name, dist in groups:
        n = dist.shape[0]
        parts[name + "_v"], parts[name + "_i"] = vals[row : row + n], top_ids[row : row + n]
        row += n
    slot = out.num_accepted[:1].clamp(max=k)  # [1] on device: no sync
    parts["emit_p"] = p[slot, out.output_token_ids[0].gather(0, slot)]  # p_j(emitted token)
    parts["emit_empty"] = emit_empty  # [1] bool: the residual was empty, drawn from p
    if out.block is not None:
        for name in ("P", "rho", "h", "eta"):
            parts["block_" + name] = getattr(out.block, name)[0, :k]
    return parts


def queue_logit_top2(logits: torch.Tensor) -> "HostCopy":
    """The target's two largest logits of every row of a step's forward, with their token ids, on their way to the
    host behind the step's work (one top-k and one small copy; no wait). logits: [R, V] float32 (the model's own
    rounding kept: bf16 logits stay exact in float32). Read with :func:`logit_top2_rows`. The losslessness check
    reads them where a greedy run's output differs from method none's (:mod:`specviz.compare.lossless`)."""
    from .transfer import HostCopy

    vals, ids = logits.topk(2, dim=-1)  # [R, 2] each; equal logits come in either order
    # [R, 2, 2] -> [R, 4] = (id_1, logit_1, id_2, logit_2): one stack rather than a slice per column
    return HostCopy(torch.stack((ids.double(), vals.double()), dim=-1).view(-1, 4))


def logit_top2_rows(copy: "HostCopy", rows: list[int]) -> list[list[float]]:
    """[[top-1 id, its logit, top-2 id, its logit], ...] of the forward's ``rows`` (the rows that decided the step's
    tokens, in output order: a chain's 0..a, a tree's root and accepted nodes' rows)."""
    host = copy.tolist()
    return [[int(host[r][0]), host[r][1], int(host[r][2]), host[r][3]] for r in rows]


Layout = tuple[tuple[str, tuple[int, ...]], ...]


def pack(parts: dict[str, torch.Tensor]) -> tuple[torch.Tensor, Layout]:
    """Pack every tensor of ``parts`` into one float64 device vector (ids up to 2**53 stay exact),
    one concatenation per dtype (few kernel launches). Returns (flat [total] float64 on the
    parts' device, layout: (name, shape) in packed order)."""
    by_dtype: dict[torch.dtype, list[tuple[str, torch.Tensor]]] = {}
    for name, t in parts.items():
        by_dtype.setdefault(t.dtype, []).append((name, t))
    chunks, layout = [], []
    for items in by_dtype.values():
        cat = torch.cat([t.reshape(-1) for _, t in items])
        chunks.append(cat.to(torch.float64))
        layout += [(name, tuple(t.shape)) for name, t in items]
    return torch.cat(chunks), tuple(layout)


def unpack(values: list[float], layout: Layout) -> dict[str, list]:
    """Split a packed step (as a host list of floats) back into nested lists by ``layout``."""
    host, offset = {}, 0
    for name, shape in layout:
        n = 1
        for d in shape:
            n *= d
        chunk = values[offset : offset + n]
        offset += n
        if len(shape) == 2:
            chunk = [chunk[r * shape[1] : (r + 1) * shape[1]] for r in range(shape[0])]
        host[name] = chunk
    return host


def _pairs(vals: list[float], ids: list[float]) -> list[list[float]]:
    return [[int(i), v] for v, i in zip(vals, ids) if v > 0]


def host_record(h: dict[str, list], ids: list[int], method: str, backend: str) -> dict[str, Any]:
    """Plain-data step record from :func:`unpack` output (core and detail merged) (``detailed=True``)."""
    k = len(ids)
    acc = int(h["num_accepted"][0])
    output = [int(t) for t in h["output"]]
    positions = []
    for i in range(k):
        positions.append({
            "index": i + 1, "token_id": ids[i], "p": h["p"][i], "q": h["q"][i],
            "u": h["u"][i], "accept_prob": h["accept_prob"][i],
            "accepted": bool(h["accepted"][i]), "residual_mass": h["residual_mass"][i],
            "p_top": _pairs(h["p_top_v"][i], h["p_top_i"][i]),
            "q_top": _pairs(h["q_top_v"][i], h["q_top_i"][i]) if "q_top_v" in h else [[ids[i], 1.0]],
            "residual_top": _pairs(h["residual_top_v"][i], h["residual_top_i"][i]),
        })
    kind = KIND_NAMES[int(h["kind"][acc])]
    emitted_id = output[acc]
    record = {
        "num_accepted": acc,
        "output_token_ids": output[: acc + 1],
        "emitted": {
            "position": acc + 1, "token_id": emitted_id,
            "kind": "target" if k == 0 else kind,
            "p": h["emit_p"][0],
            "top": _pairs(h["emit_top_v"][0], h["emit_top_i"][0]),
            "residual_empty": kind == "recovered" and k > 0 and bool(h["emit_empty"][0]),
        },
        "positions": positions,
        "method": method,
        "backend": backend,
    }
    if "block_P" in h:
        record["block"] = {name: list(h["block_" + name])[:k] for name in ("P", "rho", "h", "eta")}  # not the padding
        record["block"]["tau"] = acc
    return record


# ---- tree steps ----------------------------------------------------------------------------------
def tree_row(out: "TreeVerifyOutput", parents: list[int]) -> list[int]:
    """The step's row (:mod:`specviz.trace`): the accepted path, then the last child tested at the
    node the step stopped at (rejected), if it has children."""
    last = [c for c in range(len(parents)) if parents[c] == out.emit_node and out.tested[c]]
    return out.path + last[-1:]


class PendingTreeDetail:
    """The detailed part of one tree step's record (:func:`tree_detail_rows`: every row's and node's top-20
    lists, residual masses, the emitted token's p), one flat float64 vector on its way to the host: ``copy`` a
    :class:`~specviz.transfer.HostCopy` (or any object with ``tolist()``); :meth:`result` reads it once (waiting
    for that copy only; the step verifier reads a chain's :class:`~specviz.verify.chain.PendingDetail` by the same
    name). n_top: entries per top list; has_q: q's top lists are packed too (rule "sampled")."""

    def __init__(self, copy: Any, n_top: int, has_q: bool):
        self.n_top, self.has_q = int(n_top), bool(has_q)
        self._copy = copy
        self._values: list[float] | None = None

    def result(self) -> list[float]:
        if self._values is None:
            self._values = self._copy.tolist()
        return self._values


def tree_detail_rows(p: torch.Tensor, q: torch.Tensor | None, ids: torch.Tensor, rows: torch.Tensor,
                     weights: torch.Tensor, emit: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The detailed record of a tree step for EVERY row and node, by fixed-shape device ops (no host read, so
    it is captured in the verifier's CUDA graph; the host picks the accepted path's rows later, in
    :func:`tree_record`). p: float32 [1 + N, V] (row 0 = root); q: [N, V] (rule "sampled") or None (one-hot);
    ids int64 [N]; rows int64 [N] the nodes' parent rows; weights float32 [1 + N, V] each row's emit weights
    (after the sum-0 fallback); emit int64 [1 + N] each row's emitted token.

    Lists (top-20 of the normalised rows, :func:`_top`): p at every row; every node's residual at its parent
    (max(p - q, 0); one-hot q: p with the node's token removed, as a chain position's); every row's emit
    weights (the emitted distribution, and a last rejected child's residual); q of every node (rule B). Then
    the nodes' residual masses [N], the weights' sums [1 + N] and p of each row's emitted token [1 + N].
    Returns (flat float64 [(3N + 2 (+ N)) * 2 * n_top + 3N + 2], n_top)."""
    V = int(p.shape[1])
    parent_p = p.index_select(0, rows)  # [N, V]
    if q is not None:
        resid = (parent_p - q.float()).clamp_min(0.0)
    else:
        ok = ((ids >= 0) & (ids < V))[:, None]
        safe = torch.where(ok[:, 0], ids, torch.zeros_like(ids))[:, None]
        resid = parent_p.scatter(1, safe, torch.where(ok, 0.0, parent_p.gather(1, safe)))
    groups = [p, resid, weights] + ([q.float()] if q is not None else [])
    vals, top_ids = _top(torch.cat(groups), TOP_N)  # [rows, n_top]
    emit_p = p.gather(1, emit.long()[:, None])[:, 0]  # [1 + N]
    flat = torch.cat([vals.double().reshape(-1), top_ids.double().reshape(-1), resid.sum(dim=-1).double(),
                      weights.sum(dim=-1).double(), emit_p.double()])
    return flat, int(vals.shape[1])


def tree_record(out: "TreeVerifyOutput", token_ids: list[int], parents: list[int], scores: list[float] | None,
                tree_rule: str, method: str, detail: PendingTreeDetail | None = None) -> dict[str, Any]:
    """Plain-data step record of a tree step (the keys of :func:`host_record`, plus ``nodes``,
    ``accepted_path`` and ``tree_rule``), from :func:`specviz.sampling.tree.verify_tree`'s output.

    ``detail`` (:class:`PendingTreeDetail` of :func:`tree_detail_rows`, queued with the verification) adds the
    positions and the top-20s;
    None records no positions or top-20s (the nodes' p, q, u are still recorded, from the verifier's own
    host copy: no device read here)."""
    N = len(parents)
    host = out.host
    greedy = out.rule == "greedy"
    nodes = [{"id": i, "parent": parents[i], "depth": 0, "token_id": token_ids[i], "p": host["p"][i],
              "q": host["q"][i], "u": host["u"][i] if out.tested[i] and not greedy else None, "fate": out.fate[i],
              "score": None if scores is None else float(scores[i]),
              "accept_prob": host["accept_prob"][i] if out.tested[i] else None} for i in range(N)]
    for n in nodes:
        n["depth"] = 1 if n["parent"] < 0 else nodes[n["parent"]]["depth"] + 1
    row = tree_row(out, parents)
    a = len(out.path)
    record = {
        "num_accepted": a, "output_token_ids": list(out.output_token_ids),
        "emitted": {"position": a + 1, "token_id": out.token_id, "kind": out.kind, "p": None, "top": [],
                    "residual_empty": out.kind == "recovered" and out.emit_fallback},
        "positions": [], "method": method, "backend": "reference",
        "nodes": nodes, "accepted_path": list(out.path), "tree_rule": tree_rule,
        "row": row,
    }
    if detail is None:
        return record
    n_top, h, has_q = detail.n_top, detail.result(), detail.has_q
    n_rows = 3 * N + 2 + (N if has_q else 0)  # p rows 0..N, node residuals, emit weights 0..N, q of nodes
    n_vals = n_rows * n_top
    mass, wsum, emit_p = h[2 * n_vals:2 * n_vals + N], h[2 * n_vals + N:2 * n_vals + 2 * N + 1], h[2 * n_vals + 2 * N + 1:]

    def top(r: int) -> list[list[float]]:
        return _pairs(h[r * n_top:(r + 1) * n_top], h[n_vals + r * n_top:n_vals + (r + 1) * n_top])

    emit_row = 2 * N + 1 + out.emit_node + 1
    record["emitted"]["p"], record["emitted"]["top"] = emit_p[out.emit_node + 1], top(emit_row)
    for m, c in enumerate(row):
        if m < a:  # accepted: its residual at the parent
            resid_top, resid_mass = top(N + 1 + c), mass[c]
        elif out.emit_fallback:  # the last rejected child, its residual empty (the token was drawn from p)
            resid_top, resid_mass = [], 0.0
        else:  # the last rejected child: the residual the emitted token came from
            resid_top, resid_mass = top(emit_row), wsum[out.emit_node + 1]
        record["positions"].append({
            "index": m + 1, "token_id": token_ids[c], "p": host["p"][c], "q": host["q"][c],
            "u": 0.0 if greedy else host["u"][c], "accept_prob": host["accept_prob"][c], "accepted": m < a,
            "residual_mass": resid_mass if not greedy else float(1.0 - host["p"][c]),
            "p_top": top(parents[c] + 1),
            "q_top": top(3 * N + 2 + c) if has_q else [[token_ids[c], 1.0]],
            "residual_top": resid_top,
        })
    return record
