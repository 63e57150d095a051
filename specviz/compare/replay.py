"""The same draft, every rule: one recorded run's drafts and uniforms decided again by greedy, standard and block
verification (closed forms on the recorded p, q and u), so the rules can be compared on identical inputs."""

from __future__ import annotations

from typing import Any

from specviz.trace import Step, Trace

RULES = ("greedy", "standard", "block")  # verification rules of the "same draft, every rule" view


def same_draft_rules(trace: Trace) -> dict[str, list[int | None]]:
    """How many draft tokens of each recorded step greedy, standard and block verification accept
    on the SAME drafts and the SAME uniforms (the trace's u_i; block's eta_i = u_i), computed from the
    recorded p_i(x_i), q_i(x_i) and argmax p_i (docs/design/algorithms.md; the rules of
    ``specviz/sampling/reference.py``):

    * greedy: the longest prefix with x_i = argmax p_i;
    * standard: the longest prefix with u_i <= min(1, p_i(x_i) / q_i(x_i));
    * block: tau = the last i with u_i <= h_i. h needs sum_x max(P_i p_{i+1}(x) - q_{i+1}(x), 0):
      closed form for one-hot drafts (ngram, suffix, greedy draft model); for full q only the block
      run's own recorded h is available, so block is None for full-q steps of other rules.

    Each step keeps the recorded run's context: this is a per-step replay of one draft stream, not
    three full decodes. Steps without a draft give 0 for every rule. Needs a detailed trace of a
    run at temperature > 0 verified with standard or block (greedy runs record no uniforms:
    standard and block are then None). Returns {rule: [accepted per step]}."""
    out: dict[str, list[int | None]] = {rule: [] for rule in RULES}
    for s in trace.steps:
        for rule in RULES:
            out[rule].append(_rule_accepts(s, rule, trace.config))
    return out


def _rule_accepts(step: Step, rule: str, config: dict[str, Any]) -> int | None:
    pos = step.positions
    if not step.draft_token_ids:
        return 0
    if len(pos) != len(step.draft_token_ids):
        return None  # a brief trace (detailed_trace=False) has no per-position data
    if rule == "greedy":
        n = 0
        for x, p in zip(step.draft_token_ids, pos):
            if not p.p_top or int(p.p_top[0][0]) != x:
                break
            n += 1
        return n
    if config.get("verify") == "greedy":
        return None  # no uniforms were drawn
    if rule == "standard":
        n = 0
        for p in pos:
            if p.u > p.accept_prob:
                break
            n += 1
        return n
    h = _block_h(step)
    if h is None:
        return None
    return max([i + 1 for i, (p, hi) in enumerate(zip(pos, h)) if p.u <= hi], default=0)


def _block_h(step: Step) -> list[float] | None:
    """Block verification's h_1..h_k' for ``step``: recorded when the step was block-verified, else
    the one-hot closed form (q_i(x_i) = 1 at every position), else None."""
    if step.block and step.block.get("h"):
        return [float(v) for v in step.block["h"][: len(step.positions)]]
    if any(p.q != 1.0 for p in step.positions):
        return None
    P, out = 1.0, []
    Ps = []
    for p in step.positions:
        P = min(1.0, P * p.p) if P > 0 else 0.0
        Ps.append(P)
    for i, P in enumerate(Ps):
        if i == len(Ps) - 1:
            out.append(P)
            continue
        rho = P * (1.0 - step.positions[i + 1].p)
        denom = rho + 1.0 - P
        out.append(1.0 if denom == 0 else rho / denom)
    return out
