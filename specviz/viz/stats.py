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

from specviz.trace import TOKENS_PER_FORWARD_FORMULA, RunMetrics, Trace

from .common import as_trace, metrics_of
from .speed import measured_html, run_vs_segments_html

TIME_COLOURS = {"draft": "#f97316", "verify": "#2563eb", "sample": "#16a34a"}
# the geometry of the figure when a lesson's chapter shows it in the presentation layout (specviz/ui/lesson.py
# svStatsFit, which makes it the height left below the chapter panel): font sizes (px) of the text, the panel
# titles and the legend; px above the top row (its titles), under each row (tick labels and axis title), above the
# second row (its titles) and for the legend's rows; the two columns' x domains (wide apart: the time panel's bar
# names sit left of its plot); the trace whose text label is left out there (its rows are too low for a label above
# the star: the legend entry and the chapter carry the number)
PRESENT_FIT = {"font": 13, "titles": 15, "legend": 13, "top_px": 26, "axis_px": 44, "title_px": 24,
               "legend_px": 88, "columns": [[0.0, 0.42], [0.6, 1.0]], "min_row_px": 60, "unlabel": "measured"}


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
        Rate("draft_acceptance_rate", "draft acceptance rate", m.draft_acceptance_rate if drafted > 0 else None,
             "accepted / drafted tokens", f"{accepted} / {drafted}" if drafted > 0 else "no drafts",
             tree_note or "drafts after a rejection count as not accepted"),
        *tree_rates,
        Rate("alpha", "a", m.alpha, "accepted / verified positions",
             f"{accepted} / {verified}" if verified else "no drafts",
             "a position is verified when every draft before it was accepted; the theory curve in section 4 uses a"),
    ]


def _tree_rates(trace: Trace, m: RunMetrics) -> tuple[str | None, list[Rate]]:
    """For a run with tree drafts: (what the draft acceptance rate means there, [the per-depth
    acceptance]: specviz.trace's depth_acceptance_rate = accepted / depths drafted, which for a chain
    is its draft acceptance rate). (None, []) for chain runs."""
    steps = [s for s in trace.steps if s.nodes]
    if not any(n.parent != n.id - 1 for s in steps for n in s.nodes):
        return None, []
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
                         hovertemplate="position %{x}: %{y:.3f}<extra>P(accepted ≥ i)</extra>"), row=1, col=2)
    fig.add_trace(go.Scatter(x=pos, y=m.conditional_acceptance_rate, mode="lines+markers",
                             name="P(accept i | accepted i−1)", line={"color": "#f97316"}), row=1, col=2)
    fig.update_xaxes(title_text="draft position i", dtick=1, row=1, col=2)
    fig.update_yaxes(range=[0, 1.05], row=1, col=2)
    if not m.num_drafts:  # method none: no acceptance to show, say so instead of flat charts
        for col in (1, 2):
            fig.add_annotation(text="not applicable (no drafts)", showarrow=False, font={"size": 14, "color": "#6b7280"},
                               xref="x domain" if col == 1 else "x2 domain", yref="y domain" if col == 1 else "y2 domain",
                               x=0.5, y=0.5, name="no-drafts")
    _theory_panel(fig, m, k)
    _time_panel(fig, m.summary(), baseline)
    for i, title in enumerate(fig.layout.annotations[:4]):  # make_subplots' titles, named for the fit
        title.name = f"subplot-title-{i}"
    fig.update_layout(height=620, plot_bgcolor="#ffffff", barmode="stack", margin={"l": 60, "r": 20, "t": 40, "b": 60},
                      legend={"orientation": "h", "y": -0.17, "font": {"size": 11}}, meta={"stats_fit": PRESENT_FIT})
    return fig


def _theory_panel(fig: go.Figure, m: RunMetrics, k: int) -> None:
    grid = [i / 50 for i in range(51)]
    kk = max(k, 1)
    fig.add_trace(go.Scatter(x=grid, y=[expected_tokens_per_step(a, kk) for a in grid], mode="lines",
                             name=f"theory (1 − a^(k+1))/(1 − a), k = {kk}", line={"color": "#6b7280", "dash": "dash"}),
                  row=2, col=1)
    alpha = m.alpha
    if alpha is not None:
        fig.add_trace(go.Scatter(x=[alpha], y=[m.mean_acceptance_length], mode="markers+text",
                                 text=[f"measured: {m.mean_acceptance_length:.2f}"],
                                 textposition="top left" if alpha > 0.5 else "top right",  # inside the panel
                                 marker={"size": 13, "color": "#dc2626", "symbol": "star"}, cliponaxis=False,
                                 meta=PRESENT_FIT["unlabel"],
                                 name=f"this run: a = {alpha:.2f} (accepted / verified positions, not / drafted), "
                                      f"{m.mean_acceptance_length:.2f} tokens per drafting step"),
                      row=2, col=1)
    fig.add_trace(go.Scatter(x=[0, 1], y=[1, 1], mode="lines", line={"color": "#111827", "width": 1},
                             name="plain decoding: 1 token per forward"), row=2, col=1)
    fig.update_xaxes(title_text="acceptance rate a (= accepted / verified positions)", range=[0, 1], row=2, col=1)
    top = max(kk + 1, m.mean_acceptance_length)  # the theory's end (a = 1) or the star
    # headroom above the highest point for the "measured" label, which is drawn above the star
    fig.update_yaxes(title_text="tokens per drafting step", range=[0.5, 1.2 * top], row=2, col=1)


def _time_panel(fig: go.Figure, run: dict[str, Any], baseline: dict[str, Any] | None) -> None:
    meas = (baseline or {}).get("measurement")
    # the bars are named by their method only (the names stand between the columns); the title says what was timed
    own = run["method"] if run["method"] != "none" else "this run"  # two bars named alike would share a row
    bars = [(own, run)] + ([("none", baseline)] if baseline else [])
    title = "time split (ms): this run" + (" and method none" if baseline else "")
    if meas:  # equal workloads: the segments measured side by side
        bars = [(own, meas["method_summary"]), ("none", baseline)]
        title = f"time split (ms) of {meas['n']} segments each"
    fig.layout.annotations[3].text = title
    last = list(TIME_COLOURS)[-1]
    for part, colour in TIME_COLOURS.items():
        totals = [f"{sum(b['time_ms'].values()):.0f} ms" if part == last else "" for _, b in bars]
        fig.add_trace(go.Bar(y=[name for name, _ in bars], x=[b["time_ms"].get(part, 0.0) for _, b in bars],
                             orientation="h", name=part, marker_color=colour, text=totals, textposition="outside",
                             cliponaxis=False, hovertemplate=f"{part}: %{{x:.1f}} ms<extra></extra>"), row=2, col=2)
    longest = max([sum(b["time_ms"].values()) for _, b in bars] + [1.0])
    # room on the right for the "N ms" totals written outside the bars
    fig.update_xaxes(title_text="ms: draft · verify (target forward) · sample", range=[0, longest * 1.22], row=2, col=2)


SPEEDUP_ROWS = (("generated tokens", "tokens", "{:d}"),
                ("target forwards (incl. prefill)", "target_forward_passes", "{:d}"),
                ("verification steps (target forwards after the prefill)", "steps", "{:d}"),
                ("tokens per target forward = tokens / verification steps", "tokens_per_forward", "{:.2f}"),
                ("decode time (s): draft + verify + sample", "decode_s", "{:.2f}"),
                ("tokens / s over the decode time", "decode_tokens_per_second", "{:.1f}"),
                ("wall time (s)", "wall_time_s", "{:.2f}"))
# the wall-time row's label: what the engine's wall clock (the whole request) includes, by where the trace came from
WALL_TIME_STREAMED = "wall time (s) of the whole request, incl. prefill and the app's redraws between steps"
WALL_TIME_RECORDED = "wall time (s) of the whole request, as recorded (incl. prefill)"
PAIR_RATIO_HELP = ("Each interleaved pair times one segment of this method and one of method none on the same "
                   "request; its ratio is (segment tokens / decode time of this method) ÷ (the same for method none). "
                   "The headline is the median of these ratios (one disturbed pair cannot move it); the pooled "
                   "ratio divides all segments' tokens / s instead. The whole run's own tokens / s is not part of "
                   "the comparison: it ran at another time, with the app redrawing between steps.")
CELL_STYLE = "padding:4px 10px;text-align:right"


def _columns(run: dict[str, Any], baseline: dict[str, Any] | None) -> list[tuple[str, str, dict[str, Any]]]:
    """(heading, hover, summary) per table column: with a side-by-side measurement the timed segments of
    both methods (what the headline is computed from), then the whole run; else the run and the baseline."""
    meas = (baseline or {}).get("measurement")
    if not meas:
        return [(f"this run: {run['method']}", "", run)] + ([("method none", "", baseline)] if baseline else [])
    seg = f"{meas['n']} × its first {meas['segment_tokens']} tokens"
    return [(f"{run['method']}: {seg} (timed)", PAIR_RATIO_HELP, meas["method_summary"]),
            (f"method none: {seg} (timed)", PAIR_RATIO_HELP, baseline),
            ("this run, whole (recorded and drawn; not timed against none)", PAIR_RATIO_HELP, run)]


def _pair_row(meas: dict[str, Any]) -> str:
    """The row the headline is computed from: each pair's tokens/s ratio, their median, the pooled ratio."""
    pooled = _ratio(meas["method_summary"].get("decode_tokens_per_second", 0.0),
                    meas.get("none_decode_tokens_per_second", 0.0))
    per_pair = ", ".join(f"{r:.2f}" for r in meas["ratios"])
    text = f"per pair {per_pair} → median <b>{meas['median']:.2f}×</b> (the headline)"
    if pooled:
        text += f"; pooled {pooled:.2f}×"
    return (f"<tr class='sv-pair-ratios' title='{html.escape(PAIR_RATIO_HELP)}'><td style='padding:4px 10px'>tokens / s "
            f"ratio, this method ÷ none</td><td colspan='2' style='{CELL_STYLE}'>{text}</td>"
            f"<td style='{CELL_STYLE};color:#9ca3af'>–</td></tr>")


def speedup_html(run: dict[str, Any], baseline: dict[str, Any] | None, missing: str | None = None,
                 streamed: bool = False) -> str:
    """HTML table comparing :func:`run_summary` of this run with the method "none" baseline.

    Tokens per target forward (tokens / verification steps) is the hardware-independent gain;
    tokens/s over the decode time (draft + verify + sample) is what this machine measured for
    the decoding itself (the app's streaming redraws between steps are not counted). Without a
    ``baseline`` the table has one column and the note ``missing`` (default: how to get one) says why.
    A baseline measured beside the run (``baseline["measurement"]``, :mod:`specviz.speedup`) is
    shown as the median ratio with its spread; the table then shows the numbers that headline is
    computed from: the timed segments of this method (``measurement["method_summary"]``) and of
    method none (``baseline``), a row of the per-pair tokens/s ratios with their median (the
    headline) and pooled ratio, and the whole run in a last column labelled as not timed against
    none (:data:`PAIR_RATIO_HELP`, also the columns' hover). ``streamed``: the run was just streamed into the app
    (which redrew its views between steps, inside the wall time: :data:`WALL_TIME_STREAMED`); else (an uploaded trace,
    the CLI's, a comparison's run, a report) the wall time is labelled as recorded (:data:`WALL_TIME_RECORDED`)."""
    cols = _columns(run, baseline)
    head = "".join(f"<th style='{CELL_STYLE}'" + (f" title='{html.escape(tip)}'" if tip else "")
                   + f">{html.escape(n)}</th>" for n, tip, _ in cols)
    body = ""
    wall = WALL_TIME_STREAMED if streamed else WALL_TIME_RECORDED  # what the whole request's clock includes
    for name, key, fmt in SPEEDUP_ROWS:
        name = wall if key == "wall_time_s" else name
        cells = "".join(f"<td style='{CELL_STYLE}'>{fmt.format(c.get(key, 0))}</td>" for _, _, c in cols)
        hover = f" title='{html.escape(TOKENS_PER_FORWARD_FORMULA)}'" if key == "tokens_per_forward" else ""
        body += f"<tr{hover}><td style='padding:4px 10px'>{name}</td>{cells}</tr>"
        if key == "decode_tokens_per_second" and (baseline or {}).get("measurement"):
            meas = dict(baseline["measurement"], none_decode_tokens_per_second=baseline.get("decode_tokens_per_second", 0.0))
            body += _pair_row(meas)
    note = ("<p style='color:#6b7280'>No method-none baseline for this trace: tick “compare with method none” "
            "(advanced settings) and run to measure the speedup.</p>")
    if missing:
        note = f"<p style='color:#6b7280'>{html.escape(missing)}</p>"
    if baseline:
        note = _speedup_note(run, baseline)
    return (f"<div class='sv-speedup'><table style='border-collapse:collapse;font-size:14px'>"
            f"<tr><th></th>{head}</tr>{body}</table>{note}</div>")


def step_costs(run: dict[str, Any], baseline: dict[str, Any]) -> dict[str, float]:
    """This run's time per verification step split into draft / verify / sample, in units of
    one step of the method-none ``baseline`` (both :func:`run_summary` dicts), and their sum
    "total". Then tokens/s speedup = (tokens per target forward ratio) / total, exactly."""
    unit = 1e3 * baseline["decode_s"] / baseline["steps"] if baseline.get("steps") and baseline.get("decode_s") else 0.0
    steps = run.get("steps") or 0
    parts = {k: (run["time_ms"].get(k, 0.0) / steps / unit if steps and unit else 0.0)
             for k in ("draft", "verify", "sample")}
    parts["total"] = sum(parts.values())
    return parts


def _speedup_note(run: dict[str, Any], baseline: dict[str, Any]) -> str:
    """Both speedups and why they differ on this machine, from the measured step costs."""
    fwd = _ratio(run["tokens_per_forward"], baseline["tokens_per_forward"])
    meas = baseline.get("measurement")
    seg = meas["method_summary"] if meas else run  # the cost split: from the segments measured side by side
    tps = _ratio(run.get("decode_tokens_per_second", 0.0), baseline.get("decode_tokens_per_second", 0.0))
    c = step_costs(seg, baseline)
    whole = " (this run, whole: a count, it needs no timing)" if meas else ""
    note = (f"<p><b>{fwd:.2f}× tokens per target forward</b> over method none{whole}: the speedup if a forward cost the "
            "same however many tokens it verifies and drafting were free (large targets on a GPU come close).</p>")
    note += (measured_html(meas) + run_vs_segments_html(run, meas) if meas else
             f"<p><b>Measured on this machine: {tps:.2f}× tokens/s</b> (one run of each, no spread recorded).</p>")
    fwd = _ratio(seg["tokens_per_forward"], baseline["tokens_per_forward"])
    if c["total"] > 0:
        note += (f"<p style='font-size:13px'>Why they differ: one step of this {'method' if meas else 'run'} costs <b>{c['total']:.2f}</b> "
                 f"steps of method none (drafting {c['draft']:.2f} + verify forward of up to k+1 tokens "
                 f"{c['verify']:.2f} + sampler and record {c['sample']:.2f}), and yields {fwd:.2f}× the tokens: "
                 f"{fwd:.2f} / {c['total']:.2f} = {fwd / c['total']:.2f}×{' (the segments pooled)' if meas else ''}.")
        headline, pooled = (meas["median"] if meas else tps), fwd / c["total"]
        if (headline < 1) != (pooled < 1):  # the median of the pairs and the pooled segments disagree
            note += (f" The headline ({headline:.2f}×, the median of the pairs) and the segments pooled "
                     f"({pooled:.2f}×) fall on different sides of 1×: on this machine, now, the difference between "
                     "speculation and method none is within the noise.")
        elif headline < 1:
            note += (" Here speculation loses: the drafting and the wider verify forward cost more than the target "
                     "forwards they save. That happens when the target is small (its forward is cheap, barely more "
                     "than the draft's) or runs on a CPU (where a forward's cost grows with the tokens it checks); "
                     "tokens per target forward is the number that carries over to a large target on a GPU.")
        note += "</p>"
    return note


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0
