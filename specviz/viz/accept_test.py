"""The residual view's accept-test panels: one position's test as a bar [0, threshold] with the uniform marked
(token-wise rules, synthetic, typical, tree rules A and B) and block verification's P_i, h_i and eta_i per
position (Sun et al. 2024, "Block verification accelerates speculative decoding"). Each draws into a row of the
residual figure (:mod:`specviz.viz.residual`) and returns the sentence that explains it."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from specviz.trace import Position, Step

from .common import fmt_prob, small_lines, tokenwise_accepted

B_COLOUR = "#9333ea"  # block verification's P_i line (and the block residual's bars)
# the block panel's min(1, p/q) dashes: the colour and the word its axis caption names them by
RATIO_COLOUR, RATIO_COLOUR_WORD = "#6b7280", "grey"
CAPTION_EM = 0.786  # the axis captions: 11 px of an axis title's 14 (1.2x the layout's font), 16 px of its 20 presented


TREE_TEST_NAME = {  # the acceptance probability a tree node is tested against (specviz/sampling/tree.py)
    "topk": "r(x)",  # rule A: p renormalised after the earlier siblings' tokens were removed; q one-hot
    "sampled": "min(1, r(x)/q(x))",  # rule B (SpecInfer): r = the residual after the earlier siblings
}
TREE_TEST_NOTE = {
    "topk": "tree rule A (top-k children, q one-hot): r = p with the tokens of the siblings rejected before "
            "this one removed, renormalised",
    "sampled": "tree rule B (sampled children, SpecInfer): r = the residual left after the siblings rejected before "
               "this one",
}


def _never_tested(first: int) -> str:
    return f"never tested: draft x{first} before it was rejected, so the step discarded this draft"


def gauge(fig: go.Figure, verify: str, pos: Position, block: dict[str, Any] | None, row: int | None,
           tree_rule: str | None = None, typical: tuple[Any, Any] = ("ε", "δ"), unused_after: int | None = None) -> str:
    """The accept test of one position as a bar [0, threshold] with a marker at u (in ``row``;
    greedy verification has no random test and draws nothing). ``tree_rule``: the step's tree rule
    ("topk" / "sampled") when the position is a tree node. ``unused_after``: for a position after the step's
    first rejection, that rejected position (token-wise rules stop there: this position's test never ran; its u,
    drawn with the others, is shown grey with what the test would have said). Returns a sentence."""
    if verify == "greedy" or row is None:
        if unused_after is not None:
            return f"greedy: {_never_tested(unused_after)}"
        return ("greedy: x is accepted iff it is the target's argmax (p is one-hot at temperature 0): "
                + ("x is the argmax, accepted" if pos.accepted else "x is not the argmax, rejected"))
    if verify == "typical":  # Medusa's rule: no uniform is compared (specviz/sampling/typical.py)
        if unused_after is not None:
            return f"typical acceptance (lossy, not distribution-preserving): {_never_tested(unused_after)}"
        return (f"typical acceptance (lossy, not distribution-preserving): x is accepted iff p(x) > min(ε, δ·exp(−H(p))) "
                f"(ε = {typical[0]}, δ = {typical[1]}, H = the entropy of p); p(x) = {fmt_prob(pos.p)}: "
                + ("above it, accepted" if pos.accepted else "not above it, rejected") + "; q is not read")
    if verify == "block" and block:
        i = pos.index - 1
        thr, u, name = block["h"][i], block["eta"][i], f"h_{pos.index}"
        verdict = "passes" if u <= thr else "fails"
        cmp = "≤" if u <= thr else ">"
        sentence = f"block: η_{pos.index} = {fmt_prob(u)} {cmp} h_{pos.index} = {fmt_prob(thr)}: {verdict}"
    else:
        thr, u = pos.accept_prob, pos.u
        name = "a_i / a_(i-1)" if verify == "synthetic" else TREE_TEST_NAME.get(tree_rule or "", "min(1, p/q)")
        prefix = "synthetic (lossy, fixed rates): " if verify == "synthetic" else ""
        if unused_after is not None:  # the test never ran: say what it would have said with the u drawn here
            would = u <= thr
            sentence = (f"{prefix}{_never_tested(unused_after)}; had it been tested: u = {fmt_prob(u)} "
                        f"{'≤' if would else '>'} {name} = {fmt_prob(thr)}, it would have "
                        + ("passed" if would else "failed"))
            verdict = "unused"
        else:
            sentence = (prefix + f"u = {fmt_prob(u)} {'≤' if pos.accepted else '>'} {name} = {fmt_prob(thr)}: "
                        + ("accepted" if pos.accepted else "rejected"))
            verdict = "accepted" if pos.accepted else "rejected"
    sym = f"η_{pos.index}" if verify == "block" and block else "u"
    # both bars share an offsetgroup so they overlap (the figure's bars are otherwise grouped)
    fig.add_trace(go.Bar(x=[1.0], y=[""], orientation="h", marker_color="#fee2e2", showlegend=False,
                         hoverinfo="skip", width=0.5, offsetgroup="gauge"), row=row, col=1)
    fig.add_trace(go.Bar(x=[thr], y=[""], orientation="h", marker_color="#86efac", width=0.5, offsetgroup="gauge",
                         name=f"accept region: {sym} ≤ {name}", showlegend=False, hovertemplate=f"{name} = %{{x:.4f}}<extra></extra>"),
                  row=row, col=1)
    ok = verdict in ("accepted", "passes")
    colour = "#9ca3af" if verdict == "unused" else "#15803d" if ok else "#dc2626"
    fig.add_trace(go.Scatter(x=[u], y=[""], mode="markers+text",
                             text=[f"{sym} = {fmt_prob(u)}" + (" (never compared)" if verdict == "unused" else "")],
                             textposition="middle left" if u > 0.6 else "middle right", cliponaxis=False,
                             marker={"symbol": "diamond", "size": 16, "color": colour,
                                     "line": {"width": 1, "color": "#111827"}},
                             name=f"{sym} (the uniform drawn)", showlegend=False, hovertemplate=f"{sym} = %{{x:.4f}}<extra></extra>"),
                  row=row, col=1)
    # in a relative size under the layout's font, which the presentation layout scales (a title_font size it skips)
    fig.update_xaxes(range=[0, 1.02], row=row, col=1, title_standoff=4, title_text=small_lines(
        [f"{sym} ~ Uniform(0, 1): green = pass ({sym} ≤ {name}), red = fail; τ = the last pass"
         if sym != "u" else f"u ~ Uniform(0, 1): green = accept (u ≤ {name}), red = reject"], CAPTION_EM))
    fig.update_yaxes(showticklabels=False, row=row, col=1)
    return sentence


def block_panel(fig: go.Figure, step: Step, row: int) -> str:
    """Block verification's numbers per draft position, each series named where it is drawn (no
    legend entries): bars h_i (values under the bars), a purple line P_i, grey dashes min(1, p_i/q_i),
    diamonds η_i."""
    b = step.block
    k = len(step.draft_token_ids)
    x = [f"x{i}" for i in range(1, k + 1)]
    ratio = [pos.accept_prob for pos in step.positions[:k]]
    passes = [e <= h for e, h in zip(b["eta"][:k], b["h"][:k])]
    # h_i is written under its bar, in the tick label: inside the bar the η diamond and the dashes covered it
    fig.add_trace(go.Bar(x=x, y=b["h"][:k], name="h_i", marker_color="#99f6e4", showlegend=False, width=0.6,
                         hovertemplate="h_%{x} = %{y:.4f}: the probability to accept the block up to here<extra></extra>"),
                  row=row, col=1)
    fig.add_trace(go.Scatter(x=x, y=b["P"][:k], mode="lines+markers", name="P_i", showlegend=False,
                             line={"color": B_COLOUR, "width": 2}, marker={"size": 7},
                             hovertemplate="P_%{x} = %{y:.4f}: how well the first i tokens match<extra></extra>"),
                  row=row, col=1)
    fig.add_trace(go.Scatter(x=x, y=ratio, mode="markers", name="min(1, p/q)", showlegend=False,
                             marker={"symbol": "line-ew-open", "size": 22, "color": RATIO_COLOUR,  # open symbols
                                     "line": {"width": 3, "color": RATIO_COLOUR}},  # stroke in marker.color
                             hovertemplate="min(1, p/q) = %{y:.4f}: the token-wise test<extra></extra>"), row=row, col=1)
    fig.add_trace(go.Scatter(x=x, y=b["eta"][:k], mode="markers", name="η_i", showlegend=False,
                             marker={"symbol": "diamond", "size": 13, "line": {"width": 1, "color": "#111827"},
                                     "color": ["#15803d" if ok else "#dc2626" for ok in passes]},
                             hovertemplate="η_%{x} = %{y:.4f} (the uniform; passes if ≤ h_i)<extra></extra>"),
                  row=row, col=1)
    tau = int(b.get("tau", step.num_accepted))
    tokenwise = tokenwise_accepted(step)
    fig.update_yaxes(range=[0, 1.05], title_text="block test", row=row, col=1)
    # one short line: a longer one overran the half-width figure, a second pushed the rows below a lesson's chapter
    fig.update_xaxes(title_text=small_lines([f"teal bar h_i · purple P_i · {RATIO_COLOUR_WORD} dash min(1, p/q) · "
                                             "◆ η_i: green passes"], CAPTION_EM), title_standoff=2,
                     tickvals=x, ticktext=[f"{xi}<br>h={fmt_prob(v)}" for xi, v in zip(x, b["h"][:k])], row=row, col=1)
    return (f"block: τ = last i with η_i ≤ h_i = {tau} → {tau} token(s) accepted. With these same uniforms "
            f"token-wise verification (η_i ≤ min(1, p_i/q_i)) would have accepted {tokenwise}; block verification "
            "accepts at least as many on average, not on every draw")
