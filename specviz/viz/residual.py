"""The residual view: why one draft token was accepted or rejected, and where the step's own
token came from.

For a chosen (step, position i): grouped bars of the target p_i, the draft q_i and the residual
r_i = max(p_i - q_i, 0) / Z_i over the most likely tokens, with the drafted token x_i and the
emitted recovered / bonus token marked; below, the test u_i <= min(1, p_i(x_i) / q_i(x_i)) as a
bar. For block verification a third panel shows P_i, h_i and eta_i for every position of the
step (Sun et al. 2024), next to min(1, p_i/q_i), so one can see where block verification keeps
tokens that token-wise verification with the same uniforms would have thrown away.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.trace import Step, Trace

from .accept_test import B_COLOUR, TREE_TEST_NAME, TREE_TEST_NOTE, block_panel, gauge
from .common import (FATE_STYLE, as_trace, emitted_fate, fmt_prob, label, position_fate, quoted, tokenwise_accepted,
                     wrap_units)

MAX_BARS = 10
WRAP = 64  # characters per caption line: fits a half-width figure at a 1024 px window
P_COLOUR, Q_COLOUR, R_COLOUR = "#2563eb", "#f97316", "#16a34a"
HOLLOW = "hollow:"  # a series colour with this prefix: outlined bars (the residual of a position not sampled)
BLOCK_LEGEND_PX = 62  # the legend's top, in pixels below the block panel (its two-line ticks and caption)
GAUGE_LEGEND_PX = 84  # the bottom margin under the u gauge: its ticks, its caption, then the legend (presented sizes)


def message_figure(text: str, height: int = 260) -> go.Figure:
    """An empty figure that only says ``text`` (used for empty states)."""
    fig = go.Figure()
    text = "<br>".join(w for line in text.split("\n") for w in (wrap_units(line, 58) or [""]))  # fits 1024 px
    fig.add_annotation(text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font={"size": 14, "color": "#374151"}, align="center")
    fig.update_layout(height=height, xaxis={"visible": False}, yaxis={"visible": False},
                      plot_bgcolor="#ffffff", margin={"l": 10, "r": 10, "t": 10, "b": 10})
    return fig


def clamp_selection(trace: Trace, step: int | None, position: int | None) -> tuple[int, int]:
    """A valid (step, position) for ``trace`` (which must have steps): step in [0, n), position in
    [1, k'+1]. ``position`` None -> the step's decision slot (num_accepted + 1)."""
    s = min(max(int(step or 0), 0), len(trace.steps) - 1)
    st = trace.steps[s]
    pos = st.num_accepted + 1 if position is None else int(position)
    return s, min(max(pos, 1), len(st.draft_token_ids) + 1)


def _bar_tokens(dists: list[dict[int, float]], must: list[int]) -> list[int]:
    score: dict[int, float] = {}
    for d in dists:
        for t, v in d.items():
            score[t] = max(score.get(t, 0.0), v)
    ranked = sorted(score, key=lambda t: -score[t])
    chosen = [t for t in must if t is not None]
    for t in ranked:
        if len(chosen) >= MAX_BARS:
            break
        if t not in chosen:
            chosen.append(t)
    return sorted(chosen, key=lambda t: -score.get(t, 0.0))


def _as_dict(top: list[list[float]]) -> dict[int, float]:
    return {int(t): float(v) for t, v in top}


def _bars(fig: go.Figure, trace: Trace, series: list[tuple[str, str, dict[int, float]]], must: list[int],
          marks: list[tuple[int, str, str]]) -> None:
    """Row 1: grouped bars of each (name, colour, dist) over the chosen tokens; marks = (token,
    text, colour) arrows above a token."""
    toks = _bar_tokens([d for _, _, d in series], must)
    x = list(range(len(toks)))
    for name, colour, dist in series:
        hollow = colour.startswith(HOLLOW)  # drawn as an outline: a distribution shown, not sampled
        c = colour.removeprefix(HOLLOW)
        marker = {"color": "rgba(255,255,255,0)", "line": {"color": c, "width": 2}} if hollow else {"color": c}
        fig.add_trace(go.Bar(x=x, y=[dist.get(t, 0.0) for t in toks], name=name, marker=marker,
                             customdata=[[quoted(trace, t), t] for t in toks],
                             hovertemplate=f"{name}<br>%{{customdata[0]}} (id %{{customdata[1]}})<br>"
                                           "%{y:.4f}<extra></extra>"), row=1, col=1)
    ticks = [label(trace, t, 12) for t in toks]
    # tell equal-looking tokens apart, in two bars' width
    ticks = [f"{label(trace, t, TICK_LINE)} #{t}" if ticks.count(s) > 1 else s for s, t in zip(ticks, toks)]
    # level labels, staggered on two lines when long: rotated, a long one ('<|endoftext|>') ran into its neighbour
    # and, at the presentation layout's size, into the test row below
    fig.update_xaxes(tickmode="array", tickvals=x, ticktext=bar_labels(ticks), tickangle=0,
                     tickfont={"size": 12}, row=1, col=1)
    top = max([max(d.get(t, 0.0) for t in toks) for _, _, d in series] + [0.05])
    # headroom above the tallest bar for the marks' labels, but no probability ticks past it (never "1.4")
    fig.update_yaxes(title_text="probability", range=[0, top * (1.22 + 0.16 * len(marks))], tickmode="array",
                     tickvals=prob_ticks(top), tickformat=".2~f", row=1, col=1)
    placed = [(toks.index(tok), text, colour) for tok, text, colour in marks if tok in toks]
    for (j, text, colour), (level, side) in zip(placed, mark_places([j for j, _, _ in placed], len(toks))):
        # arrow from a label at a fixed height per level (so labels never collide) down to the bar
        fig.add_annotation(x=j, y=max(d.get(toks[j], 0.0) for _, _, d in series), text=text, showarrow=True,
                           arrowhead=2, axref="x", ax=j, ayref="y", ay=top * (1.12 + 0.16 * level), xanchor=side,
                           font={"color": colour, "size": 12}, bgcolor="rgba(255,255,255,0.85)", row=1, col=1)


CLOSE_BARS = 3  # bars: two marks' labels this close may overlap each other's arrow (a label is ~2-3 bars wide)


def mark_places(columns: list[int], bars: int) -> list[tuple[int, str]]:
    """(level above the bars, the label's xanchor) for each mark at bar ``columns[n]`` of ``bars``: level n,
    centred; two marks within CLOSE_BARS of each other put the lower label beside its arrow on the side away from
    the other mark (towards the wider room), so the upper label's arrow never runs through it."""
    places = [(n, "center") for n in range(len(columns))]
    if len(columns) != 2 or abs(columns[0] - columns[1]) > CLOSE_BARS:
        return places
    left, right = (0, 1) if columns[0] <= columns[1] else (1, 0)
    if bars - 1 - columns[right] >= columns[left]:  # more room on the right: the right label reads rightwards
        places[right], places[left] = (0, "left"), (1, "center")
    else:
        places[left], places[right] = (0, "right"), (1, "center")
    return places


CAPTION_LINES = 4  # caption lines the figure's base height leaves room for
TICK_LINE = 6  # characters of a bar's label under one bar (ten bars share half a 1280 px page at 1.45x type)
TWO_LINE_GAP = 0.06  # more of the figure's height between the bars and the row below when a label takes two lines
# the bar labels' scale in the presentation layout (specviz/ui/lesson_script.py svScale; the rest of the text 1.45x):
# ten labels such as '↵␣×11' at 1.45x ran into each other across half a 1280 px screen
PRESENT_BAR_TICK_SCALE = 1.15


def bar_labels(labels: list[str]) -> list[str]:
    """The bar labels (HTML-escaped, from :func:`~specviz.viz.common.label`), each token whole on one line: when one
    is longer than TICK_LINE characters, every second label from the first moves down a line, so that each has two
    bars' width (a token broken inside, "␣for" / "ward", read as two tokens); the first and the last, beside the
    plot's ends, are cut to a bar and a half ("…")."""
    import html as html_lib

    raw = [html_lib.unescape(t) for t in labels]
    if all(len(t) <= TICK_LINE for t in raw):
        return list(labels)
    edge = TICK_LINE + TICK_LINE // 2  # the first and last label have a bar and a half: the plot ends beside them
    raw = [t[:edge - 1] + "…" if j in (0, len(raw) - 1) and len(t) > edge else t for j, t in enumerate(raw)]
    # the first label on the second line: on the first, a long one ran into the probability axis's "0"
    return [html_lib.escape(t, quote=False) if j % 2 else f"<br>{html_lib.escape(t, quote=False)}"
            for j, t in enumerate(raw)]


def prob_ticks(top: float) -> list[float]:
    """Tick values 0, s, 2s, ... <= ``top`` (a probability in (0, 1]) with at most 6 ticks, s a round step."""
    step = next(s for s in (0.01, 0.02, 0.05, 0.1, 0.2, 0.25) if top / s <= 5)
    return [round(i * step, 2) for i in range(int(top / step + 1e-9) + 1)]


def _title(trace: Trace, step: Step, i: int) -> str:
    k = len(step.draft_token_ids)
    if k == 0:
        return f"step {step.index}: nothing drafted; the target drew {quoted(trace, step.emitted.token_id)} from p"
    if i > k:
        return f"step {step.index}, slot {i} (after the last draft token): the bonus slot, p_{i}"
    fate = position_fate(step, i)
    said = "accepted; the request stopped there" if fate == "stop" else fate
    text = f"step {step.index}, position {i}: draft {quoted(trace, step.draft_token_ids[i - 1])} was {said}"
    if step.block and i <= step.num_accepted and i > (tokenwise_accepted(step) or 0):
        text += " (★ by block verification; token-wise would have rejected it)"
    if i == step.num_accepted + 1:
        greedy = trace.config.get("verify") == "greedy"
        kind = step.emitted.kind
        text += f"; {kind} token {quoted(trace, step.emitted.token_id)} {'the target’s argmax (greedy)' if greedy else 'drawn here'}"
    return text


def decision_heading(trace: Trace, step: Step, i: int) -> str:
    """The caption's heading for slot ``i`` of ``step``: one question per decision (accepted,
    rejected, unused, recovered, bonus, plain target token); a bonus token the stop dropped is said to be dropped."""
    k = len(step.draft_token_ids)
    own = quoted(trace, step.emitted.token_id)
    if k == 0:
        return f"Nothing drafted: where did {own} come from?"
    if i > k:
        dropped = "" if step.emitted_committed else " (dropped: the request stopped first)"
        return f"Where did the bonus token {own} come from?{dropped}"
    x, fate = quoted(trace, step.draft_token_ids[i - 1]), position_fate(step, i)
    if fate == "rejected":
        if trace.config.get("verify") == "greedy":
            return f"Why was {x} rejected, and why {own}?"
        if _forced_from_p(trace, step, i):
            return f"Synthetic verification rejected {x} at its fixed rate; {own} came from the target's p"
        return f"Why was {x} rejected, and where did the recovered {own} come from?"
    if fate == "unused":
        return f"Why was {x} never used?"
    if fate == "stop":
        return f"Why was {x} accepted? (The request stops at it: counted as the step's own token.)"
    return f"Why was {x} accepted?"


def _forced_from_p(trace: Trace, step: Step, i: int) -> bool:
    """Position ``i`` is where synthetic verification forced a rejection and the residual was empty (Z = 0), so the
    step's own token was drawn from p (:attr:`specviz.trace.Emitted.residual_empty`): no residual to show there."""
    return (trace.config.get("verify") == "synthetic" and i == step.num_accepted + 1
            and step.emitted.kind == "recovered" and step.emitted.residual_empty)


SYNTHETIC_FROM_P = ("Synthetic verification (lossy, for speed studies) accepts position i with the given rate a_i, "
                    "whatever p and q say; it rejected a draft the target would have accepted with probability 1. The "
                    "residual max(p − q, 0) is empty here (Z = 0: p ≤ q everywhere), so there was no residual to draw "
                    "from and the sampler drew the token from the target's p, as plain decoding would (it may equal "
                    "the rejected draft).")


def _subplots(gauge: bool, block: bool) -> tuple[go.Figure, int | None, int | None]:
    """Rows: bars, then the accept-test bar (``gauge``), then the block panel (``block``).
    Returns (figure, gauge row or None, block row or None)."""
    heights = [0.62] + ([0.12] if gauge else []) + ([0.26] if block else [])
    fig = make_subplots(rows=len(heights), cols=1, row_heights=heights, vertical_spacing=0.13)
    gauge_row = 2 if gauge else None
    block_row = len(heights) if block else None
    return fig, gauge_row, block_row


def residual_figure(trace: Trace | dict[str, Any], step: int | None = None, position: int | None = None) -> go.Figure:
    """Plotly figure explaining one (step, position); see the module docstring.

    Args:
        trace: a Trace or its dict.
        step: step index (clamped into range); position: 1-based slot, k'+1 = the bonus slot
            (clamped; None -> the step's decision slot num_accepted + 1).
    Returns:
        A figure: bars of p, q, residual (row 1); the accept test u vs min(1, p/q) (row 2, not
        for greedy verification); block P/h/eta for the whole step (last row, verify="block").
        Distributions come from the trace's top-20 lists; tokens outside a list are drawn as 0.
    Raises:
        specviz.trace.TraceFormatError: ``trace`` is a malformed dict.
    """
    trace = as_trace(trace)
    if not trace.steps:
        return message_figure("No steps yet: press Run (or upload a trace).")
    s, i = clamp_selection(trace, step, position)
    st = trace.steps[s]
    k = len(st.draft_token_ids)
    verify = str(trace.config.get("verify", ""))
    has_block = verify == "block" and bool(st.block) and k > 0 and len(st.positions) == k
    if i <= min(k, len(st.positions)):
        fig, block_row, lines = _drafted_position(trace, st, i, verify, has_block)
    elif i <= k:
        return message_figure(f"step {st.index}, position {i}: this trace was recorded without per-position "
                              "details (detailed_trace=False), so p, q and u are not available.")
    elif k == 0 or (i == k + 1 and st.num_accepted == k):
        fig, block_row, lines = _own_token(trace, st, has_block)
    else:
        return message_figure(f"step {st.index}, slot {i} (the bonus slot): not reached. Draft token "
                              f"{st.num_accepted + 1} was rejected, so the step drew a recovered token, not a bonus.")
    if has_block:
        lines.append(block_panel(fig, st, block_row))
    return _finish(fig, [decision_heading(trace, st, i), _title(trace, st, i), *lines], has_block)


def _own_mark(trace: Trace, st: Step) -> tuple[int, str, str]:
    fate = emitted_fate(st)
    return st.emitted.token_id, f"{fate}: {label(trace, st.emitted.token_id)}", FATE_STYLE[fate][1]


def _drafted_position(trace: Trace, st: Step, i: int, verify: str,
                      has_block: bool) -> tuple[go.Figure, int | None, list[str]]:
    """Draft position i: p, q, residual bars, the accept test; the emitted token if drawn here."""
    pos = st.positions[i - 1]
    fig, gauge_row, block_row = _subplots(verify != "greedy", has_block)
    p, q, r = _as_dict(pos.p_top), _as_dict(pos.q_top), _as_dict(pos.residual_top)
    p.setdefault(pos.token_id, pos.p)
    if verify != "typical":  # typical records q(x) = 1 (never read): the draft's own q_top is what is drawn
        q.setdefault(pos.token_id, pos.q)
    tree_rule = st.tree_rule if st.nodes and st.tree_rule in TREE_TEST_NAME else None
    series = [("target p", P_COLOUR, p), ("q (one-hot: top-k child)" if tree_rule == "topk" else "draft q", Q_COLOUR, q)]
    here = i == st.num_accepted + 1  # the step's own (recovered) token was drawn at this position
    from_p = _forced_from_p(trace, st, i)  # synthetic with Z = 0: drawn from p, there is no residual to show
    if verify not in ("greedy", "typical") and not from_p:  # greedy: the argmax; typical: a draw from p
        series.append(("residual r/Z (tree rule)" if tree_rule else "residual max(p−q,0)/Z", R_COLOUR, r))
        if not here:  # only the rejected position's residual is sampled
            series[-1] = (series[-1][0] + " (not drawn from here)", HOLLOW + R_COLOUR, r)
    marks = [(pos.token_id, f"drafted x{i}: {label(trace, pos.token_id)}", FATE_STYLE[position_fate(st, i)][1])]
    block_note = None
    if here:
        if verify == "block":
            series.append(("block residual (drawn from)", B_COLOUR, _as_dict(st.emitted.top)))
            block_note = ("purple bars: the block residual the recovered token was drawn from, "
                          "normalize(max(P_τ·p − q, 0)) at this position (Sun et al. 2024)")
        marks.append(_own_mark(trace, st))
    _bars(fig, trace, series, [pos.token_id, st.emitted.token_id if here else None], marks)
    typical = (trace.config.get("typical_acceptance_sampler_posterior_threshold", "ε"),
               trace.config.get("typical_acceptance_sampler_posterior_alpha", "δ"))
    unused = position_fate(st, i) == "unused" and not has_block  # block compares every η_i (τ = the last pass)
    test = gauge(fig, verify, pos, st.block if has_block else None, gauge_row, tree_rule, typical,
                  unused_after=st.num_accepted + 1 if unused else None)
    z = "Z = the residual's mass" if tree_rule else "Z = Σ max(p−q, 0)"
    if from_p:
        return fig, block_row, [test, SYNTHETIC_FROM_P]
    if verify not in ("greedy", "typical"):  # the rules with a residual
        test += f"  ·  {z} = {fmt_prob(pos.residual_mass)}"
    elif verify == "typical" and here:
        test += "  ·  the step's own token is drawn from p here (no residual)"
    note = TREE_TEST_NOTE[tree_rule] if tree_rule and verify != "greedy" else None
    return fig, block_row, [test, *filter(None, [note, block_note])]


def _own_token(trace: Trace, st: Step, has_block: bool) -> tuple[go.Figure, int | None, list[str]]:
    """A step without a draft, or the bonus slot after a full accept: the target's p and the token drawn."""
    k = len(st.draft_token_ids)
    fig, _, block_row = _subplots(False, has_block)
    name = "target p" if k == 0 else f"target p_{k + 1} (bonus slot)"
    _bars(fig, trace, [(name, P_COLOUR, _as_dict(st.emitted.top))], [st.emitted.token_id], [_own_mark(trace, st)])
    line = ("no draft: a plain decoding step, one token from p" if k == 0 else
            "every draft token was accepted, so the target's next distribution gives a free bonus token")
    return fig, block_row, [line]


def _finish(fig: go.Figure, lines: list[str], has_block: bool) -> go.Figure:
    """Caption above the plot (first line bold), layout."""
    gauge = not has_block and any(getattr(t, "offsetgroup", None) == "gauge" for t in fig.data)  # its axis title
    head = wrap_units(lines[0], WRAP - 12)
    small = [w for t in lines[1:] for w in wrap_units(t, WRAP)]
    caption = "<br>".join(f"<b>{w}</b>" for w in head) + "".join(
        f"<br><span style='font-size:12px;color:#374151'>{w}</span>" for w in small)
    fig.add_annotation(name="caption", text=caption, x=0, y=1, xref="paper", yref="paper", xanchor="left",
                       yanchor="bottom", yshift=10, showarrow=False, align="left",
                       font={"size": 14, "color": "#111827"})
    top = 26 + 19 * (len(head) + len(small))
    # a caption longer than CAPTION_LINES lines makes the figure taller instead of squashing the bars (their marks'
    # labels, at fixed heights above the bars, then ran into each other)
    height = (680 if has_block else 480) + max(0, top - (26 + 19 * CAPTION_LINES))
    bottom = BLOCK_LEGEND_PX + 40 if has_block else GAUGE_LEGEND_PX if gauge else 40  # legends below captions
    two_lines = "<br>" in "".join(fig.layout.xaxis.ticktext or ())
    if two_lines and len(fig.layout.yaxis.domain or ()) == 2 and fig.layout.yaxis.domain[0] > 0:
        # a second line of bar labels needs the room above the row below (it ran under the accept test's bar)
        lo, hi = fig.layout.yaxis.domain
        fig.layout.yaxis.domain = (lo + TWO_LINE_GAP, hi)
    legend_y = (-BLOCK_LEGEND_PX / max(height - top - bottom, 1) if has_block else
                -0.13 if two_lines else -0.06)  # under a second line of bar labels (it hid 'hidden')
    legend = {"orientation": "h", "y": legend_y, "yanchor": "top", "font": {"size": 11}}
    if gauge:  # pinned to the figure's bottom edge: a paper-relative offset ran into the gauge's caption once the
        legend.update(yref="container", y=0, yanchor="bottom")  # lesson fitted the figure to the room
    fig.update_layout(
        height=height, barmode="group", plot_bgcolor="#ffffff",
        margin={"l": 55, "r": 10, "t": top, "b": bottom},
        legend=legend,
        # the presentation layout, while a lesson's chapter (which says the rest) is pinned above: the caption's
        # bold question only, in a top margin this tall (specviz/ui/lesson.py svScale), so the bars keep the room
        meta={"caption_head": "<br>".join(f"<b>{w}</b>" for w in head), "caption_head_px": 26 + 19 * len(head),
              "tick_scale": {"xaxis": PRESENT_BAR_TICK_SCALE}},
    )
    return fig
