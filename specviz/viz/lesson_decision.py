"""The lesson's chapters on one decision: the acceptance test of each drafted position (u against min(1, p/q), or
the target's argmax), and the token the step drew itself (recovered from the residual, or the bonus)."""


from __future__ import annotations

import html
import re
from dataclasses import replace

from specviz.trace import Position, Step, Trace

from .lesson_base import DECISION_VIEW, Chapter, _rejected_before, _row_node, _toks, _top, _verify, is_tree
from .common import fmt_prob, quoted, tokenwise_accepted


# ---- 3. the acceptance test -----------------------------------------------------------------
GREEDY_TREE_WALK = ("Greedy verification walks the tree from the root and tests each node's children in their order "
                    "(the draft's ranking): at T = 0 the target's p is one-hot, so a child that is not the target's "
                    "argmax is rejected and the first child that is the argmax is accepted; the walk goes on below "
                    "it. The children after it, and every node below a rejected child, are never tested.")


def _rejected_siblings(st: Step, node) -> list[int]:
    """Token ids of the siblings of ``node`` tested and rejected before it (children are tested in node order)."""
    return [n.token_id for n in st.nodes if n.parent == node.parent and n.id < node.id and n.fate == "rejected"]


def _tried_before(trace: Trace, st: Step, node) -> str:
    """" Tested and rejected before it: 'a' 'b'." for the siblings of ``node`` rejected before it, else ""."""
    before = _rejected_siblings(st, node)
    return f" Tested and rejected before it: {_toks(trace, before)}." if before else ""


def _argmax(pos: Position) -> int | None:
    return int(max(pos.p_top, key=lambda tv: tv[1])[0]) if pos.p_top else None


def test_sentence(trace: Trace, st: Step, pos: Position) -> str:
    """The acceptance test of one drafted position, with the trace's numbers."""
    verify, x = _verify(trace), quoted(trace, pos.token_id)
    i = pos.index
    if verify == "greedy" and is_tree(st):  # the walk down the tree: children tested in their order
        node = _row_node(st, i)
        tried = _tried_before(trace, st, node) if node is not None else ""
        if pos.accepted:
            below = ("the walk goes on below it" if node is not None and any(n.parent == node.id for n in st.nodes)
                     else "it is a leaf, so the walk ends here")
            return (f"At depth {i} the target's argmax is {x} (p = {fmt_prob(pos.p)}).{tried} The child {x} equals it "
                    f"and is accepted; {below}.")
        best = quoted(trace, _argmax(pos)) if _argmax(pos) is not None else "another token"
        if not tried:  # a single child: "the last child ... too" read as if siblings had been drawn
            return (f"At depth {i} the target's argmax is {best}; the only child there, {x}, is not it and is "
                    "rejected, so the walk stops.")
        return (f"At depth {i} the target's argmax is {best}; no child there is {best}.{tried} {x}, the last child, "
                "is rejected too, so the walk stops.")
    if verify == "greedy":
        top = _argmax(pos)
        if pos.accepted:
            return f"The target's argmax at position {i} is {x} (p = {fmt_prob(pos.p)}), the draft token: {x} is accepted."
        best = quoted(trace, top) if top is not None else "another token"
        return f"The target's argmax at position {i} is {best}, not {x}: {x} is rejected."
    if verify == "block" and st.block:
        b, j = st.block, i - 1
        eta, h = b["eta"][j], b["h"][j]
        ok = eta <= h
        # token-wise verification with the same uniforms tests position i only if every earlier position passed
        stop = next((m + 1 for m, earlier in enumerate(st.positions[:j])
                     if earlier.accept_prob is not None and b["eta"][m] > earlier.accept_prob), None)
        tokenwise = (f"Token-wise verification with the same uniforms would have stopped at position {stop} "
                     f"(η_{stop} > min(1, p/q) there) and never tested position {i}." if stop is not None else
                     f"Token-wise it would be η_{i} {'≤' if eta <= pos.accept_prob else '>'} min(1, p/q) = "
                     f"{fmt_prob(pos.accept_prob)}.")
        return (f"Block test at position {i}: P_{i} = {fmt_prob(b['P'][j])} (how well the first {i} token(s) match), "
                f"h_{i} = {fmt_prob(h)} (the probability to accept the block up to {i}); η_{i} = {fmt_prob(eta)} "
                f"{'≤' if ok else '>'} h_{i}, so position {i} {'passes' if ok else 'fails'}. {tokenwise}")
    if verify == "typical":  # Medusa's rule: p(x) against an entropy-scaled threshold, no uniform draw
        eps = trace.config.get("typical_acceptance_sampler_posterior_threshold", "ε")
        delta = trace.config.get("typical_acceptance_sampler_posterior_alpha", "δ")
        return (f"Typical acceptance (Medusa; lossy, not distribution-preserving): {x} is accepted iff "
                f"p({x}) = {fmt_prob(pos.p)} > min(ε, δ·exp(−H(p_{i}))) with ε = {eps}, δ = {delta}; it was "
                f"{'accepted' if pos.accepted else 'rejected'}. No uniform draw is compared, and the output does not "
                "follow the target's distribution.")
    if verify == "synthetic":
        rate = f"a_{i}" if i == 1 else f"a_{i} / a_{i - 1}"
        return (f"u = {fmt_prob(pos.u)} {'≤' if pos.accepted else '>'} {rate} = {fmt_prob(pos.accept_prob)}, "
                f"so {x} is {'accepted' if pos.accepted else 'rejected'}. Synthetic: the given rate decides, not p "
                f"and q, so this run is not lossless.")
    node = _row_node(st, i) if is_tree(st) and verify == "standard" else None
    if node is not None:
        before = _rejected_before(st, node)
        sib = (f" {before} sibling(s) tested before it at the same node were rejected." if before else "")
        verdict = f"so {x} is {'accepted' if pos.accepted else 'rejected'}."
        if st.tree_rule == "sampled":
            return (f"Rule B (SpecInfer; children sampled from q) at depth {i}: u = {fmt_prob(pos.u)} "
                    f"{'≤' if pos.accepted else '>'} min(1, r(x)/q(x)) = {fmt_prob(pos.accept_prob)}, r = the target's p "
                    f"at the parent after the earlier siblings' residual steps; p(x) = {fmt_prob(pos.p)}, q(x) = "
                    f"{fmt_prob(pos.q)}, {verdict}{sib}")
        return (f"Rule A (top-k children, q one-hot) at depth {i}: u = {fmt_prob(pos.u)} "
                f"{'≤' if pos.accepted else '>'} r(x) = {fmt_prob(pos.accept_prob)}, r = the target's p at the parent "
                f"with the siblings rejected before x removed and renormalised (p(x) = {fmt_prob(pos.p)}), "
                f"{verdict}{sib}")
    onehot = " (q is one-hot: the proposer is deterministic, so the test is u ≤ p(x))" if pos.q >= 1.0 else ""
    return (f"u = {fmt_prob(pos.u)} {'≤' if pos.accepted else '>'} min(1, p/q) = min(1, {fmt_prob(pos.p)} / "
            f"{fmt_prob(pos.q)}) = {fmt_prob(pos.accept_prob)}, so {x} is "
            f"{'accepted' if pos.accepted else 'rejected'}{onehot}.")


def own_token_source(trace: Trace, st: Step) -> str:
    """One line on where a step's recovered token came from, by verification rule (the hovers' wording of
    :func:`outcome_chapter`): the target's argmax (greedy), p itself (typical), the block residual, rule A's residual,
    or max(p - q, 0)/Z."""
    verify = _verify(trace)
    if verify == "greedy":
        return "recovered token: the target's argmax after the rejection (greedy verification)"
    if verify == "typical":
        return "the step's own token, drawn from the target's p itself (typical acceptance has no residual; lossy)"
    if verify == "block":
        return "recovered token, drawn from the block residual normalize(max(P_τ·p − q, 0))"
    if is_tree(st) and st.tree_rule == "topk":
        return "recovered token, drawn from rule A's residual: p with the children tested there removed, renormalised"
    if is_tree(st) and st.tree_rule == "sampled":
        return ("recovered token, drawn from rule B's residual: r ← normalize(max(r − q, 0)) once per rejected child "
                "there, starting from p")
    return "recovered token, drawn from the residual max(p - q, 0)/Z" + (
        " (synthetic verification: not lossless)" if verify == "synthetic" else "")


def _no_residual(trace: Trace, st: Step | None = None) -> str:
    """The name of the residual view in a chapter where no residual is drawn (greedy and typical verification draw
    none; ``st`` given: its outcome, a bonus token or a token without a draft), else "" (the view's own name)."""
    drawn = st is None or (st.num_accepted < len(st.draft_token_ids))
    return DECISION_VIEW if _verify(trace) in ("greedy", "typical") or not drawn else ""


def _accepted_greedy(trace: Trace, st: Step, last: int) -> Chapter:
    """One chapter for a greedy step's accepted positions 1..``last`` (each test alike: the draft token is the
    target's argmax); it highlights the step grid, whose row shows them all, or for a tree the draft-tree view, whose
    accepted path does."""
    ps = [pos.p for pos in st.positions[:last]]
    p_text = ("At temperature 0 the target's p is one-hot: p = 1 at each." if all(p >= 1.0 for p in ps) else
              "The target's p of each: " + ", ".join(fmt_prob(p) for p in ps) + ".")
    if is_tree(st):
        rejected = [(d, _rejected_siblings(st, node)) for d in range(1, last + 1) if (node := _row_node(st, d))]
        named = "; ".join(f"{_toks(trace, ids)} at depth {d}" for d, ids in rejected if ids)
        # the tree draws the accepted path as its main line, so a sibling tested first sits below it there
        named = (f"Ranked before the accepted child, tested and rejected (drawn below the accepted path): {named}."
                 if named else "")
        text = (f"{GREEDY_TREE_WALK} Here a child was accepted at depths 1–{last}: "
                f"{_toks(trace, [pos.token_id for pos in st.positions[:last]])}, the accepted path. "
                + (f"{named} " if named else "Each was its node's first child, so no sibling was tested. ")
                + f"{p_text} The draft-tree view shows the path.")
        return Chapter("test", f"Step {st.index}, depths 1–{last}: the target's argmax found a child at each depth",
                       text, st.index, last, "tree")
    text = (f"Greedy verification at positions 1–{last}: each draft token is the target's argmax, so all {last} are "
            f"accepted: {_toks(trace, st.draft_token_ids[:last])}. {p_text} These tests look alike, so they share "
            "this chapter (the lesson's “every position” box tells them one by one); the step grid's row shows them.")
    return Chapter("test", f"Step {st.index}, positions 1–{last}: {last} draft tokens accepted (the target's argmax)",
                   text, st.index, last, "grid")


def test_chapters(trace: Trace, st: Step, every_position: bool = False) -> list[Chapter]:
    """One chapter per verified position (block: every position, then tau). Greedy verification's accepted
    positions share one chapter (:func:`_accepted_greedy`) when the step accepted more than one, unless
    ``every_position``."""
    k = len(st.draft_token_ids)
    if k and len(st.positions) < k:
        return [Chapter("test", f"Step {st.index}: the acceptance test", "This trace was recorded without "
                        "per-position details (detailed_trace=False): p, q and u are not available. "
                        f"{st.num_accepted} of {k} draft token(s) were accepted.", st.index, None, "grid")]
    block = _verify(trace) == "block" and bool(st.block)
    last = k if block else min(st.num_accepted + 1, k)
    fold = st.num_accepted if _verify(trace) == "greedy" and not every_position and st.num_accepted > 1 else 0
    out = [_accepted_greedy(trace, st, fold)] if fold else []
    for pos in st.positions[fold:last]:
        verdict = ("passes" if st.block["eta"][pos.index - 1] <= st.block["h"][pos.index - 1] else "fails") \
            if block else ("accepted" if pos.accepted else "rejected")
        text = test_sentence(trace, st, pos)
        if is_tree(st) and not pos.accepted:
            text += " The nodes below it are never checked."
        elif not block and not pos.accepted and pos.index < k:
            text += f" The {k - pos.index} draft token(s) after it are never checked."
        where = f"depth {pos.index}" if is_tree(st) else f"position {pos.index}"
        # a tree's tests walk its accepted path: the draft-tree view shows it (the residual view one row of it)
        view = ("tree", "") if is_tree(st) and _verify(trace) == "greedy" else ("residual", _no_residual(trace))
        out.append(Chapter("test", f"Step {st.index}, {where}: {quoted(trace, pos.token_id)} {verdict}",
                           text, st.index, pos.index, *view, anchor="bottom" if block else "top"))
    if block and k:
        tau, tokenwise = int(st.block.get("tau", st.num_accepted)), tokenwise_accepted(st)
        extra = (f" Block verification keeps {tau - tokenwise} token(s) (★ in the grid) that token-wise verification "
                 "would have thrown away with these same uniforms." if tokenwise is not None and tau > tokenwise else "")
        out.append(Chapter("block", f"Step {st.index}: τ = {tau}",
                           f"τ = {tau}: the last position i with η_i ≤ h_i, so the first {tau} draft token(s) are "
                           f"accepted. Token-wise verification (η_i ≤ min(1, p_i/q_i), stopping at the first failure) "
                           f"would have accepted {tokenwise}.{extra}", st.index, st.num_accepted + 1, "residual",
                           anchor="bottom"))
    return out


# ---- 4. the step's own token ----------------------------------------------------------------
def _prob_in(pairs: list[list[float]], token: int) -> float | None:
    return next((float(v) for t, v in pairs if int(t) == token), None)


def outcome_chapter(trace: Trace, st: Step) -> Chapter:
    """The step's own token: the recovered token and its residual, the bonus token, or the target's token without a
    draft. In a step the stop cut (:attr:`specviz.trace.Step.emitted_committed` False) the token was drawn, then
    dropped: the chapter says so, and never that the step yields it."""
    c = _outcome(trace, st)
    if st.emitted_committed:
        return c
    y, last = quoted(trace, st.emitted.token_id), quoted(trace, st.committed_token_ids[-1]) if st.committed_token_ids else ""
    cut = (f" But the request stopped ({html.escape(trace.stop_reason or 'stop')}) inside this step"
           + (f", at {last}" if last else "") + f", so {y} was dropped: it is not in the output.")
    return replace(c, title=f"{c.title}, dropped at the stop", text=re.sub(_YIELDS, "", c.text) + cut)


_YIELDS = r" The step yields \d+ tokens from one target forward\."


def _outcome(trace: Trace, st: Step) -> Chapter:
    k, e, verify = len(st.draft_token_ids), st.emitted, _verify(trace)
    y, slot = quoted(trace, e.token_id), st.num_accepted + 1
    if k == 0:
        title, text = (f"Step {st.index}: the target's own token {y}",
                       f"With no draft, the target draws its next token from p: {y} (p = {fmt_prob(e.p)}).")
    elif st.num_accepted == k and is_tree(st):
        how = "its argmax" if verify == "greedy" else "a draw from it"
        title = f"Step {st.index}: the accepted path reached a leaf, bonus token {y}"
        text = (f"The path of {k} accepted node(s) ended at a leaf of the tree (no child left to test), so the target's "
                f"p after it, already computed by the same forward, gives a free <b>bonus token</b>: {how}, {y} "
                f"(p = {fmt_prob(e.p)}). The step yields {k + 1} tokens from one target forward.")
    elif st.num_accepted == k:
        how = "its argmax" if verify == "greedy" else "a draw from it"
        title = f"Step {st.index}: all {k} accepted, bonus token {y}"
        text = (f"Every draft token was accepted, so p_{k + 1}, already computed by the same forward, gives a free "
                f"<b>bonus token</b>: {how}, {y} (p = {fmt_prob(e.p)}). The step yields {k + 1} tokens from one "
                "target forward.")
    elif verify == "typical":
        title = f"Step {st.index}: {y}, drawn from p itself after the rejection (typical acceptance)"
        text = (f"Draft position {slot} failed the typical test, so the step draws its own token from the target's p_{slot} "
                f"itself, not from a residual: {y} (p = {fmt_prob(e.p)}). Typical acceptance is lossy: the output does "
                "not follow the target's distribution exactly.")
    elif verify == "greedy" and is_tree(st):
        title = f"Step {st.index}: no child matched at depth {slot}; the target's argmax {y} is the step's own token"
        text = (f"At depth {slot} no drafted child equals the target's argmax, so the walk stops and the step emits "
                f"the argmax itself: {y} (p = {fmt_prob(e.p)}). No residual is sampled: greedy verification has no "
                f"randomness. The step yields {st.num_accepted + 1} tokens from one target forward.")
        return Chapter("outcome", title, text, st.index, slot, "tree")
    elif verify == "greedy":
        title = f"Step {st.index}: the target's argmax {y} replaces the rejected token"
        text = (f"Draft position {slot} was rejected. At temperature 0 the step emits the target's argmax there "
                f"instead: {y} (p = {fmt_prob(e.p)}). No residual is sampled: greedy verification has no randomness.")
    else:
        pos = st.positions[slot - 1] if slot <= len(st.positions) else None
        r = _prob_in(e.top, e.token_id)
        if verify == "block" and st.block:
            P = ([1.0] + list(st.block.get("P", [])))[st.num_accepted]
            dist = (f"the <b>block residual</b> normalize(max(P_τ·p_{slot} − q_{slot}, 0)) with P_τ = P_{st.num_accepted}"
                    f" = {fmt_prob(P)}")
        elif is_tree(st) and st.tree_rule == "topk":
            dist = ("the <b>residual distribution</b> of rule A: the target's p at that node with every child tested "
                    "there (all rejected) removed, renormalised")
        else:
            z = f", Z = Σ max(p − q, 0) = {fmt_prob(pos.residual_mass)}" if pos is not None else ""
            dist = f"the <b>residual distribution</b> r = max(p_{slot} − q_{slot}, 0) / Z{z}"
        title = f"Step {st.index}: the recovered token {y}, drawn from the residual"
        r_text = f"r({y}) = {fmt_prob(r)}" if r is not None else f"r({y}) outside the residual's recorded top entries"
        text = (f"Draft position {slot} was rejected, so the step draws its own token from {dist}. It drew {y}: "
                f"{r_text}, p({y}) = {fmt_prob(e.p)}. The residual's top entries: {_top(trace, e.top)}. "
                + ("It holds p's mass outside the children already tried here; that is what makes the output follow "
                   "p." if is_tree(st) else
                   "It puts mass only where the target wants more than the draft offered; that is what makes the "
                   "output follow p.") + (" (Synthetic verification: not lossless.)" if verify == "synthetic" else ""))
    return Chapter("outcome", title, text, st.index, slot, "residual", _no_residual(trace, st))
