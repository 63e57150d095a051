"""Run statistics: acceptance-length histogram, per-position acceptance, tokens per target
forward against the i.i.d. theory, the time split, and the speedup over method "none".

Definitions (docs/design/algorithms.md, vLLM): mean acceptance length = 1 + accepted / drafting steps;
per-position rate i = #steps that accepted >= i / drafting steps; the expected tokens per step
for i.i.d. acceptance a and k drafts is (1 - a^(k+1)) / (1 - a) (Leviathan et al. 2023). The
measured a is estimated as accepted / verified draft positions (a position is verified when every
draft before it was accepted), the maximum-likelihood estimate under the i.i.d. model.
"""

from __future__ import annotations

import html
from typing import Any, NamedTuple

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specviz.trace import RunMetrics, Trace

from .common import as_trace, metrics_of
from .speed import inconclusive

TIME_COLOURS = {"draft": "#f97316", "verify": "#2563eb", "sample": "#16a34a"}
# the geometry of the figure when a lesson's chapter shows it in the presentation layout (specviz/ui/lesson.py
# svStatsFit, which makes it the height left below the chapter panel): font sizes (px) of the text, the panel
# titles and the legend; px above the top row (its titles), under each row (tick labels and axis title), above the
# second row (its titles) and for the legend's rows; the two columns' x domains (wide apart: the time panel's bar
# names sit left of its plot); the trace whose text label is left out there (its rows are too low for a label above
# the star: the legend entry and the chapter carry the number); "strip": the four panels in one row, used when the
# figure is at least min_width px wide (a 1280 px projector: 2 x 2 rows of 60 px below a long chapter, one row of
# 200 px), with its own text sizes, each column's x domain and titles short enough for it (None: the panel's own), the
# time axis's range this much longer (its narrow column had no room for the "2405 ms" totals beside the bars)
PRESENT_FIT = {"font": 13, "titles": 15, "legend": 13, "top_px": 26, "axis_px": 44, "title_px": 24,
               "legend_px": 88, "columns": [[0.0, 0.42], [0.6, 1.0]], "min_row_px": 60, "unlabel": "measured",
               "strip": {"min_width": 1100, "font": 15, "titles": 17, "legend": 14, "time_range_scale": 1.3,
                         "columns": [[0.0, 0.2], [0.27, 0.47], [0.54, 0.74], [0.84, 1.0]],
                         "panel_titles": ["accepted drafts per step", "acceptance by position", "tokens per step vs a",
                                          "time split (ms)"],
                         "x_titles": ["accepted tokens in the step", "draft position i", "acceptance rate a", None]}}
# the legend's groups, one per panel that has a legend: (legendgroup, its title)
LEGEND_GROUPS = {"position": "by draft position", "theory": "tokens per drafting step", "time": "time split"}
# three short lines: the panel is a quarter of the figure wide in the presentation layout's one-row fit
TREE_NO_THEORY = "a tree: the chain's curve<br>(1 − a^(k+1)) / (1 − a)<br>does not describe it"


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """(1 - a^(k+1)) / (1 - a): expected tokens per verification step for i.i.d. acceptance a
    in [0, 1] and k draft tokens (k + 1 at a = 1)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def estimated_alpha(trace: Trace | dict[str, Any]) -> float | None:
    """:attr:`specviz.trace.RunMetrics.alpha`: accepted / verified positions over drafting steps (None when nothing
    was drafted)."""
    return metrics_of(as_trace(trace)).alpha


def run_summary(trace: Trace | dict[str, Any]) -> dict[str, Any]:
    """:meth:`specviz.trace.RunMetrics.summary` of the trace: the totals the speedup table compares (method,
    tokens, steps, target_forward_passes incl. the prefill, tokens_per_forward, time_ms, decode_s: draft + verify +
    sample without the prefill or the caller's time between steps, decode_tokens_per_second, wall_time_s and
    tokens_per_second: the engine's clock, which includes all of that)."""
    return metrics_of(as_trace(trace)).summary()


class Rate(NamedTuple):
    """One number of a run's rate set: key, name, value (None: not applicable), formula (in words),
    numbers (the formula with this run's counts), note (what it leaves out or is used for)."""

    key: str
    name: str
    value: float | None
    formula: str
    numbers: str
    note: str


def rate_set(trace: Trace | dict[str, Any]) -> list[Rate]:
    """The run's four rates as one defined set, headline first: tokens per target forward (what one
    target forward produced; the speedup in forwards), then mean acceptance length (vLLM's: drafting
    steps only), draft acceptance rate (accepted / drafted) and a (accepted / verified positions, the
    i.i.d. estimate the theory curve (1 - a^(k+1)) / (1 - a) uses); for tree runs the draft acceptance
    rate says it is per node and the per-depth acceptance stands after it. Counts are committed tokens
    (specviz/trace/metrics.py); values None when nothing was drafted."""
    trace = as_trace(trace)
    m = metrics_of(trace)
    tokens, steps = m.num_generated_tokens, m.num_steps
    drafts, accepted = m.num_drafts, m.num_accepted_tokens
    drafted = m.num_draft_tokens - m.num_discarded_draft_tokens
    verified = m.num_verified_positions
    left_out = steps - drafts
    tree_note, tree_rates = _tree_rates(trace, m)
    al_note = "vLLM's definition" + (f"; the {left_out} step(s) without a draft are left out" if left_out else "")
    if m.num_cut_steps:  # the EOS inside a step's drafts: that step's last token counts as its own (metrics.counted)
        al_note += ("; the step the EOS ended counts its EOS as its own token, not as an accepted draft (vLLM: "
                    "accepted = a step's tokens − 1)")
    return [
        Rate("tokens_per_forward", "tokens per target forward", m.tokens_per_target_forward,
             "generated tokens / verification steps", f"{tokens} / {steps}",
             "plain decoding makes 1; the prefill is not counted"),
        Rate("mean_acceptance_length", "mean acceptance length", m.mean_acceptance_length if drafts else None,
             "1 + accepted / drafting steps = committed tokens of drafting steps / drafting steps",
             f"1 + {accepted} / {drafts} = {m.num_drafting_step_tokens} / {drafts}" if drafts else "no drafts",
             al_note),
        # a tree's name says "per node" itself: the presentation lesson hides the notes, and 0.16 read as a failure
        Rate("draft_acceptance_rate", "draft acceptance rate" + (" per node (alternatives count)" if tree_note else ""),
             m.draft_acceptance_rate if drafted > 0 else None,
             "accepted / drafted tokens", f"{accepted} / {drafted}" if drafted > 0 else "no drafts",
             (tree_note or "drafts after a rejection count as not accepted")
             + ("; the EOS draft the request stopped at and the drafts after it are not counted (the EOS is its "
                "step's own token)" if m.num_cut_steps else "")),
        *tree_rates,
        Rate("alpha", "a", m.alpha, "accepted / verified positions",
             f"{accepted} / {verified}" if verified else "no drafts",
             "a position is verified when every draft before it was accepted; the theory curve in section 4 uses a"),
    ]


def _tree_rates(trace: Trace, m: RunMetrics) -> tuple[str | None, list[Rate]]:
    """For a run with tree drafts: (what the draft acceptance rate means there, [the per-depth
    acceptance]: specviz.trace's depth_acceptance_rate = accepted / depths drafted, which for a chain
    is its draft acceptance rate). (None, []) for chain runs."""
    if not is_tree_run(trace):
        return None, []
    steps = [s for s in trace.steps if s.nodes]
    reached, per_depth = m.drafted_per_depth, m.accepted_per_position
    nodes = sum(len(s.nodes) for s in steps) / len(steps)
    by_depth = ", ".join(f"{d + 1}: {a}/{r}" for d, (a, r) in enumerate(zip(per_depth, reached)) if r)
    note = f"per node drafted: a tree drafts {nodes:.3g} nodes per step (mean), at most its depth can be accepted"
    return note, [Rate("depth_acceptance_rate", "per-depth acceptance",
                       m.depth_acceptance_rate if sum(reached) else None,
                       "accepted / Σ over depths d of the steps whose tree reached d",
                       f"{m.num_accepted_tokens} / {sum(reached)}",
                       f"the figure comparable with a chain's draft acceptance rate; by depth (accepted/reached) "
                       f"{by_depth}")]


def rates_markdown(rates: list[Rate]) -> str:
    """The rate set as Markdown: the headline in bold, the others as a defined list beneath."""
    head, *rest = rates
    out = f"**{head.value:.2f} {head.name}** = {head.formula} = {head.numbers} ({head.note})"
    for r in rest:
        value = "not applicable (no drafts)" if r.value is None else f"**{r.value:.2f}**"
        sep = ": " if r.value is None else " "
        out += f"\n- {r.name}{sep}{value}" + ("" if r.value is None else f" = {r.formula} = {r.numbers} · _{r.note}_")
    return out


def rates_html(rates: list[Rate]) -> str:
    """The rate set as HTML, each line "name = formula = numbers = value": the headline first, in
    larger type, the others as a list beneath (fixed strings and numbers only, escaped). The formula in words and
    the note are spans of their own (classes sv-rates-formula, sv-rates-note), which the presentation layout's
    lesson leaves out (assets/css/lesson.css)."""
    def line(r: Rate) -> str:
        if r.value is None:
            return f"{html.escape(r.name)}: not applicable (no drafts)"
        return (f"{html.escape(r.name)} = <span class='sv-rates-formula'>{html.escape(r.formula)} = </span>"
                f"{html.escape(r.numbers)} = <b>{r.value:.2f}</b>"
                f" <span class='sv-rates-note'>({html.escape(r.note)})</span>")

    head, *rest = rates
    items = "".join(f"<li>{line(r)}</li>" for r in rest)
    return f"<div class='sv-rates'><div class='sv-rates-head'>{line(head)}</div><ul>{items}</ul></div>"


def stats_figure(trace: Trace | dict[str, Any], baseline: dict[str, Any] | None = None) -> go.Figure:
    """A 2 x 2 figure: acceptance histogram, per-position acceptance rates, tokens per step vs
    the theoretical curve (with the measured point), time split (this run vs ``baseline``).

    Args:
        trace: a Trace or its dict (partial traces are fine: metrics are computed from steps).
        baseline: :func:`run_summary` of the method "none" run on the same prompt and settings.
    Raises:
        specviz.trace.TraceFormatError: ``trace`` is a malformed dict.
    """
    trace = as_trace(trace)
    m = metrics_of(trace)
    k = len(m.acceptance_histogram) - 1
    # the columns as far apart as PRESENT_FIT's: the time panel's bar names sit between them, at up to 1.45x size in
    # the presentation layout
    fig = make_subplots(rows=2, cols=2, vertical_spacing=0.2, horizontal_spacing=0.18, subplot_titles=(
        "accepted draft tokens per step (histogram)", "acceptance rate by draft position",
        "tokens per drafting step vs acceptance rate a", "time split (ms)"))
    fig.add_trace(go.Bar(x=list(range(k + 1)), y=m.acceptance_histogram, marker_color="#16a34a",
                         name="steps", showlegend=False, hovertemplate="%{y} step(s) accepted %{x}<extra></extra>"),
                  row=1, col=1)
    fig.update_xaxes(title_text="accepted tokens in the step", dtick=1, row=1, col=1)
    fig.update_yaxes(title_text="drafting steps", row=1, col=1)
    pos = list(range(1, k + 1))
    fig.add_trace(go.Bar(x=pos, y=m.acceptance_rate_per_position, name="P(accepted ≥ i)", marker_color="#2563eb",
                         hovertemplate="position %{x}: %{y:.3f}<extra>P(accepted ≥ i)</extra>", **_group("position")),
                  row=1, col=2)
    fig.add_trace(go.Scatter(x=pos, y=m.conditional_acceptance_rate, mode="lines+markers",
                             name="P(accept i | accepted i−1)", line={"color": "#f97316"}, **_group("position")),
                  row=1, col=2)
    fig.update_xaxes(title_text="draft position i", dtick=1, row=1, col=2)
    fig.update_yaxes(range=[0, 1.05], row=1, col=2)
    if not m.num_drafts:  # method none: no acceptance to show, say so instead of flat charts
        for col in (1, 2):
            fig.add_annotation(text="not applicable (no drafts)", showarrow=False, font={"size": 14, "color": "#6b7280"},
                               xref="x domain" if col == 1 else "x2 domain", yref="y domain" if col == 1 else "y2 domain",
                               x=0.5, y=0.5, name="no-drafts")
    _theory_panel(fig, m, k, is_tree_run(trace))
    time_axis = _time_panel(fig, m.summary(), baseline)
    for i, title in enumerate(fig.layout.annotations[:4]):  # make_subplots' titles, named for the fit
        title.name = f"subplot-title-{i}"
    strip = PRESENT_FIT["strip"]
    fit = {**PRESENT_FIT, "strip": {**strip, "x_titles": [*strip["x_titles"][:3], time_axis]}}
    # one legend, grouped by panel (each group titled): a flat list left the reader to match entries to panels
    fig.update_layout(height=620, plot_bgcolor="#ffffff", barmode="stack", margin={"l": 60, "r": 20, "t": 40, "b": 60},
                      legend={"orientation": "h", "y": -0.17, "font": {"size": 11}, "traceorder": "grouped",
                              "groupclick": "toggleitem"},
                      meta={"stats_fit": fit})
    return fig


def _group(name: str) -> dict[str, Any]:
    """A trace's legend group: :data:`LEGEND_GROUPS` names the panel it belongs to."""
    return {"legendgroup": name, "legendgrouptitle": {"text": LEGEND_GROUPS[name]}}


def is_tree_run(trace: Trace) -> bool:
    """True when a step drafted a tree, not a chain (:attr:`specviz.trace.Step.is_tree`)."""
    return any(s.is_tree for s in trace.steps)


def _theory_panel(fig: go.Figure, m: RunMetrics, k: int, tree: bool) -> None:
    """Tokens per drafting step against a: the i.i.d. chain curve (left out for a tree, which it does not describe:
    a note says so), the run's star and plain decoding's line."""
    kk = max(k, 1)
    if tree:
        fig.add_annotation(text=TREE_NO_THEORY, name="tree-no-theory", showarrow=False, xref="x3 domain",
                           yref="y3 domain", x=0.02, y=0.98, xanchor="left", yanchor="top",
                           font={"size": 12, "color": "#6b7280"})
    else:
        grid = [i / 50 for i in range(51)]
        fig.add_trace(go.Scatter(x=grid, y=[expected_tokens_per_step(a, kk) for a in grid], mode="lines",
                                 name=f"theory (1 − a^(k+1))/(1 − a), k = {kk}",
                                 line={"color": "#6b7280", "dash": "dash"}, **_group("theory")), row=2, col=1)
    alpha = m.alpha
    if alpha is not None:
        fig.add_trace(go.Scatter(x=[alpha], y=[m.mean_acceptance_length], mode="markers+text",
                                 text=[f"measured: {m.mean_acceptance_length:.2f}"],
                                 textposition="top left" if alpha > 0.5 else "top right",  # inside the panel
                                 marker={"size": 13, "color": "#dc2626", "symbol": "star"}, cliponaxis=False,
                                 meta=PRESENT_FIT["unlabel"], **_group("theory"),
                                 name=f"this run: a = {alpha:.2f}, {m.mean_acceptance_length:.2f} tokens per step"),
                      row=2, col=1)
    fig.add_trace(go.Scatter(x=[0, 1], y=[1, 1], mode="lines", line={"color": "#111827", "width": 1},
                             name="plain decoding: 1 token per forward", **_group("theory")), row=2, col=1)
    fig.update_xaxes(title_text="acceptance rate a (= accepted / verified positions)", range=[0, 1], row=2, col=1)
    top = max(kk + 1, m.mean_acceptance_length)  # the theory's end (a = 1) or the star
    # headroom above the highest point for the "measured" label, which is drawn above the star
    fig.update_yaxes(title_text="tokens per drafting step", range=[0.5, 1.2 * top], row=2, col=1)


def _time_panel(fig: go.Figure, run: dict[str, Any], baseline: dict[str, Any] | None) -> str:
    """The time split's stacked bars (this run, or its timed segments, and method none's); returns the short x-axis
    title for the one-row presentation fit (what was timed, which its short panel title leaves out)."""
    meas = (baseline or {}).get("measurement")
    # the bars are named by their method only (the names stand between the columns); the title says what was timed
    own = run["method"] if run["method"] != "none" else "this run"  # two bars named alike would share a row
    bars = [(own, run)] + ([("none", baseline)] if baseline else [])
    title = "time split (ms): this run" + (" and method none" if baseline else "")
    short = "ms, the whole run" + (" each" if baseline else "")
    unread = False
    if meas:  # equal workloads: the segments measured side by side
        bars = [(own, meas["method_summary"]), ("none", baseline)]
        seg = "segment" if meas["n"] == 1 else "segments"
        title = f"time split (ms) of {meas['n']} {seg} each"
        short = f"ms, {meas['n']} timed {seg} each"
        unread = inconclusive(meas)  # as the speedup panel: bars of a measurement that is no reading are faded
        if unread:  # as short as the usual titles: the panel is half (one-row fit: a quarter) of the figure's width
            title = f"time split of {meas['n']} {seg}: no reading"
            short = f"ms, {meas['n']} {seg}: no reading"
    fig.layout.annotations[3].text = title
    last = list(TIME_COLOURS)[-1]
    for part, colour in TIME_COLOURS.items():
        totals = [f"{sum(b['time_ms'].values()):.0f} ms" if part == last else "" for _, b in bars]
        fig.add_trace(go.Bar(y=[name for name, _ in bars], x=[b["time_ms"].get(part, 0.0) for _, b in bars],
                             orientation="h", name=part, marker_color=colour, text=totals, textposition="outside",
                             opacity=0.35 if unread else 1.0,
                             cliponaxis=False, hovertemplate=f"{part}: %{{x:.1f}} ms<extra></extra>",
                             **_group("time")), row=2, col=2)
    longest = max([sum(b["time_ms"].values()) for _, b in bars] + [1.0])
    # room on the right for the "N ms" totals written outside the bars
    fig.update_xaxes(title_text="ms: draft · verify (target forward) · sample", range=[0, longest * 1.22], row=2, col=2)
    return short
