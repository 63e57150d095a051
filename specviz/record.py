"""Turn one verification step's device tensors into the trace's plain-data step record.

:func:`gather_core` (the tokens the engine needs to go on) and :func:`gather_detail` (the
sampler's per-position decisions, top-20 of p, q, the residuals and the emitted token's
distribution) gather on the device; :func:`pack` puts each into one float64 vector, copied to the
host once (see :mod:`specviz.verify_step`), where :func:`unpack` and :func:`host_record` turn it
into the trace's plain-data step record.
"""

from __future__ import annotations

from typing import Any

import torch

from .sampling.types import KIND_NAMES, RejectionOutput

TOP_N = 20


def _top(dist: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-n (values, ids) of non-negative weights dist [R, V], normalised per row."""
    total = dist.sum(dim=-1, keepdim=True)
    norm = torch.where(total > 0, dist / total.clamp_min(1e-30), torch.zeros_like(dist))
    vals, ids = torch.topk(norm, min(n, dist.shape[-1]), dim=-1)
    return vals, ids


def _effective_q(p: torch.Tensor, q: torch.Tensor | None, ids: torch.Tensor) -> torch.Tensor:
    """q [k', V] as the sampler uses it (specviz.sampling.reference, "Invalid input"): one-hot at
    x_i for a deterministic draft; the zero vector at a position whose id is outside [0, V) or
    whose q row is not finite (never accepted, residual = p_i)."""
    k, V = ids.numel(), p.shape[-1]
    ok = (ids >= 0) & (ids < V)  # [k']
    safe = torch.where(ok, ids, torch.zeros_like(ids)).view(-1, 1)  # [k', 1]
    if q is None:
        return torch.zeros_like(p[:k]).scatter_(1, safe, ok.float().view(-1, 1))
    qf = q.float()
    ok = ok & torch.isfinite(qf).all(dim=-1)
    return torch.where(ok.view(-1, 1), qf, torch.zeros_like(qf))


def _residuals(p: torch.Tensor, q_eff: torch.Tensor) -> torch.Tensor:
    """Standard residual weights max(p_i - q_i, 0) for the k' drafted positions: [k', V]
    (one-hot q: p_i with x_i zeroed). q_eff: :func:`_effective_q`."""
    return (p[: q_eff.shape[0]] - q_eff).clamp_min(0.0)


def _emitted_weights(out: RejectionOutput, p: torch.Tensor, q_eff: torch.Tensor,
                     ids: torch.Tensor, resid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights [1, V] of the distribution the step's own token was drawn from, and whether the
    sampler fell back to p because they summed to 0 ([1] bool) (device only)."""
    k = ids.numel()
    if out.method == "block" and k > 0:
        prefix = torch.cat([torch.ones(1, device=p.device), out.block.P[0, : k - 1].float()])  # P_0..P_{k'-1}
        cand = (prefix.view(-1, 1) * p[:k] - q_eff).clamp_min(0.0)
    elif out.method == "greedy":
        cand = p[:k]
    else:
        cand = resid
    cand = torch.cat([cand, p[k : k + 1]])  # bonus slot: p_{k'+1}    [k'+1, V]
    zero = cand.sum(dim=-1, keepdim=True) == 0
    cand = torch.where(zero, p[: k + 1], cand)  # the sampler's fallback to p when Z == 0
    slot = out.num_accepted[:1].clamp(max=k)
    return cand.index_select(0, slot), zero[:, 0].index_select(0, slot)  # [1, V], [1] bool


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
    q_eff = _effective_q(p, q, ids)  # [k', V]
    resid = _residuals(p, q_eff)  # [k', V]
    groups = [("p_top", p[: k + 1]), ("residual_top", resid)]
    if q is not None:
        groups.append(("q_top", q.float()))
    emit_w, emit_empty = _emitted_weights(out, p, q_eff, ids, resid)
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
