"""Figures of a comparison (:mod:`specviz.compare`): the table, aligned token strips, the same draft
under every rule, the k sweep, and an offline HTML report. Pure functions of plain data; plotly only.

Every number comes from :func:`specviz.compare.table` (metrics from specviz/trace/metrics.py); fates from
:mod:`specviz.viz.common`.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from specviz.compare import BASELINE_TIMINGS, RULES, Comparison, same_draft_rules, table
from specviz.compare.stats import spread_text as _spread
from specviz.trace import ACCEPTANCE_LENGTH_CONVENTIONS, Trace
from specviz.trace.metrics import convention_label

from .common import MODEBAR_PX
from .compare_strips import prompt_label, scrub_html, strip_cells, strips_figure  # noqa: F401 (re-exported)
from .ksweep import configuration_styles, ksweep_figure, method_style  # noqa: F401 (re-exported)

TABLE_COLUMNS = ("configuration", "runs", "tokens / forward", "AL (vLLM)", "coverage", "accept rate", "tokens/s",
                 "speedup", "speedup range (n)", "speedup (model)", "ms/step: draft / verify / sample",
                 "c_i (Wilson 95%, n), i = 1..k", "lossless")
AL_COLUMN = TABLE_COLUMNS.index("AL (vLLM)")  # its header and values follow the convention switch
TIME_COLUMN = TABLE_COLUMNS.index("ms/step: draft / verify / sample")  # ends with the row's timing mark, if any
# each header's formula, shown on hover (the table view and the HTML report)
COLUMN_FORMULAS = {
    "configuration": "method [draft tree] k=num_speculative_tokens verification T=temperature (a tree's k: the most "
                     "drafts one path holds, an EAGLE-2 tree's depth + 1, a static tree's longest path)",
    "runs": "runs pooled into the row = prompts × seeds",
    "tokens / forward": "tokens per target forward = generated tokens / verification steps (prefill not counted; "
                        "steps without a draft count). vllm#24344: seq-normalized AL",
    **{label: f"{label} = {formula}. {who}" for label, formula, who in ACCEPTANCE_LENGTH_CONVENTIONS.values()},
    "coverage": "draft coverage = drafts / verification steps (share of steps that had a draft)",
    "accept rate": "draft acceptance rate = accepted draft tokens / drafted tokens (vLLM, SGLang, AIPerf); a tree "
                   "drafts every node, so its rate is per node drafted (low by design: one path is kept)",
    "tokens/s": "generated tokens / decode time (draft + verify + sample; prefill excluded), this machine",
    "speedup": "measured: tokens/s ÷ tokens/s of method none at the same temperature, run in this comparison (method "
               "none timed several times per prompt and seed, the median timing kept); compare speedups only within "
               "one comparison",
    "speedup range (n)": "per prompt and seed: tokens/s ÷ method none's on the same prompt and seed; the lowest–"
                         "highest of those ratios and n. 'noisy': their middle half (quartile to quartile) spans more "
                         "than a quarter of the median, so the speedup is not readable on this machine now (n 1: one "
                         "run each, no spread to check it by). Method none's row: each of its timings ÷ the median "
                         "one of its prompt and seed",
    "speedup (model)": "Leviathan et al.: ((1-g) + g (1 - a^(k+1))/(1 - a)) / (1 + t_draft / t_none), "
                       "g = coverage, a = accepted / verified positions; a chain's model: empty for a tree",
    "ms/step: draft / verify / sample": "milliseconds per verification step: drafting (the proposer's propose and "
                                        "observe), the target's verify forward, sampler + record; ⚠ capture: a "
                                        "timed step captured a graph or compiled a kernel (kept out of the times), "
                                        "⚠ slow step: a step over 10x the median (a one-time cost in the times)",
    "c_i (Wilson 95%, n), i = 1..k": "c_i = accepted at position i / steps that verified position i "
                                     "(= P(accept i | accepted 1..i-1)), Wilson 95 % interval, n = steps that verified i",
    "lossless": "T = 0: output = method none's token for token (runs equal / runs); ≈ near-tie: the only "
                "difference is two tokens whose logits lie within 4 ulps of the 16-bit dtype (rounding, not a bug). "
                "T > 0: chi-square test per "
                "output position of the tokens over the seeds against method none's, Bonferroni-adjusted p "
                "(needs ≥ 10 seeds)",
}

TABLE_HELP = """**How each column is computed** (pooled over every prompt and seed of the row: counts are summed
over requests, then divided, as vLLM sums its counters; definitions in `specviz/trace/metrics.py`):

- **tokens / forward** = generated tokens / verification steps (target forwards after the prefill; steps with
  no draft count). vllm#24344 calls it "seq-normalized AL"; it is what a fast target on a GPU turns into speed.
- **AL**, mean acceptance length, in the convention chosen above the table: **vLLM** = 1 + accepted / drafts, over
  steps that drafted (vLLM `metrics.py`, llama.cpp, AIPerf); it ignores steps with no draft, so n-gram and suffix look
  better here than in the column before. **per forward** = tokens / verification steps, every step counted (SGLang,
  EAGLE's τ, Spec-Bench). **drafts only** = accepted / drafts = vLLM's AL − 1. **coverage** = drafts / steps shows
  how many steps had a draft. Hover a column header for its formula.
- **accept rate** (draft acceptance rate) = accepted / drafted tokens. **c_i** = P(draft i accepted | drafts 1..i-1 accepted):
  accepted at i / steps that verified position i, with the Wilson 95 % interval and n.
- **tokens/s** = tokens / decode time (draft + verify + sample, prefill excluded), on this machine.
  **speedup** (measured) = tokens/s / tokens/s of method none at the same temperature, run in this comparison:
  for each prompt and seed every configuration runs once, one after another, and method none runs before them,
  between even shares of them and after them ({timings} timings), its median timing being the baseline, so one busy spell
  during one timing of method none does not move every row (the Run tab's panel instead times several short
  interleaved pairs with method none and takes their median). Speedups measured on a shared CPU move by about 15 %
  between identical comparisons: compare them only within one comparison;
  **speedup range (n)** = the lowest and highest of the per-(prompt, seed) ratios, and n. With n = 1 the speedup is
  one unchecked sample (add seeds or prompts before reading it), and "noisy" marks ratios whose middle half spans
  more than a quarter of their median (the machine was busy: not readable); method none's row gives the spread of
  its own timings around their median.
  **speedup (model)** = Leviathan et al.'s prediction from the measured acceptance a and drafting time:
  ((1-g) + g (1 - a^(k+1))/(1 - a)) / (1 + t_draft / t_none), g = coverage; it assumes a k+1-token verify forward
  costs one plain step and the sampler is free. The ms/step split shows where the difference goes.
- **lossless**: at temperature 0, output = method none's token for token (runs equal / runs). Where a run differs,
  the target's top-2 logits both runs recorded at the first difference decide: two tokens within 4 ulps of the 16-bit
  dtype swapped (a verify forward of k + 1 rows and a 1-row forward sum in different orders) reads "≈ equal: bf16
  near-tie at token i (gap here / in method none)" in grey; anything else, and any difference in float32, is ✗ in red.
  At T > 0, per prompt
  and output position, a chi-square test that the row's tokens over the seeds follow the same distribution as method
  none's (runs that stopped count as one more outcome; rare tokens merged), the smallest p-value times the number of
  positions tested (Bonferroni); ✗ below 0.01. It needs at least 10 seeds and, at some position, two outcomes
  that each occur about 5 times or more over the seeds ("not enough samples" otherwise, the reason in the hover);
  it finds
  only biases large enough to show in the seeds run, and never proves losslessness.
""".replace("{timings}", str(BASELINE_TIMINGS))


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "—" if x is None else format(x, spec)


def _conditional(row: dict[str, Any]) -> str:
    """c_1 … c_k as ``.92 (.85-.96, n40)``: rate, Wilson 95 % interval, steps that verified position i."""
    def p(x: float) -> str:
        return f"{x:.2f}".lstrip("0") if x < 1 else "1"

    return " · ".join(f"{p(c['rate'])} ({p(c['low'])}-{p(c['high'])}, n{c['n']})" if c["rate"] is not None
                      else "— (n0)" for c in row["conditional"]) or "—"


def conditional_compact(row: dict[str, Any]) -> str:
    """c_1 … c_k as their rates only, ``.92 .85 .70`` (— for a position no step verified)."""
    def p(x: float) -> str:
        return f"{x:.2f}".lstrip("0") if x < 1 else "1"

    return " ".join(p(c["rate"]) if c["rate"] is not None else "—" for c in row["conditional"]) or "—"


def table_columns(convention: str = "vllm") -> list[str]:
    """TABLE_COLUMNS with the acceptance-length column named for ``convention`` (a key of
    specviz.trace.ACCEPTANCE_LENGTH_CONVENTIONS; ValueError for another)."""
    cols = list(TABLE_COLUMNS)
    cols[AL_COLUMN] = convention_label(convention)
    return cols


def table_rows(rows: list[dict[str, Any]], convention: str = "vllm") -> list[list[Any]]:
    """The rows of the table view, in :func:`table_columns` order (the acceptance length in
    ``convention``): numbers stay numbers (so the column sorts), missing values are None."""
    table_columns(convention)  # checks the convention
    def r(x: Any, n: int = 2) -> Any:
        return None if x is None else round(float(x), n)

    out = []
    for row in rows:
        ms = row["ms_per_step"]
        out.append([row["label"], row["runs"], r(row["tokens_per_target_forward"]), r(row["acceptance_length"][convention]),
                    r(row["draft_coverage"]), r(row["draft_acceptance_rate"]), r(row["tokens_per_s"], 1),
                    r(row["speedup"]), _spread(row.get("speedup_spread")), r(row["predicted_speedup"]),
                    f"{ms['draft']:.1f} / {ms['verify']:.1f} / {ms['sample']:.1f}" + _timing_mark(row), _conditional(row),
                    row["lossless"]["badge"]])
    return out


def _timing_mark(row: dict[str, Any]) -> str:
    """" ⚠ capture" / " ⚠ 2 slow step(s)" after the time split when the row's timed runs held a one-time cost
    (:func:`specviz.compare.stats.timing_check`), else ""."""
    mark = (row.get("timing") or {}).get("mark", "")
    return f" {mark}" if mark else ""


def badge_color(lossless: dict[str, Any]) -> str:
    """The losslessness badge's text colour: red for a failed check (✗, synthetic), grey for a 16-bit near-tie
    (numerics, not a bug), "" (the table's own) otherwise."""
    if lossless.get("ok") is False:
        return "#c0392b"
    return "#6b7280" if lossless.get("near_tie") else ""


def table_html(rows: list[dict[str, Any]], convention: str = "vllm") -> str:
    """The table as static HTML (for the report), with each column's formula as a tooltip."""
    head = "".join(f"<th title='{html.escape(COLUMN_FORMULAS[c])}' style='padding:4px 8px;text-align:left'>"
                   f"{html.escape(c)}</th>" for c in table_columns(convention))
    body = ""
    for row, cells in zip(rows, table_rows(rows, convention)):
        color, timing = badge_color(row["lossless"]), (row.get("timing") or {}).get("detail", "")
        tds = "".join(f"<td style='padding:4px 8px{f';color:{color}' if j == len(cells) - 1 and color else ''}'"
                      f"{f' title={html.escape(timing, quote=True)!r}' if j == TIME_COLUMN and timing else ''}>"
                      f"{html.escape('—' if v is None else str(v))}</td>" for j, v in enumerate(cells))
        body += f"<tr title='{html.escape(row['lossless']['detail'])}'>{tds}</tr>"
    return f"<table style='border-collapse:collapse;font-size:13px'><tr>{head}</tr>{body}</table>"


# ---- the same draft, every rule ------------------------------------------------------------
# why block can equal standard at every step here while the table gives block the higher mean acceptance length
# (docs/design/algorithms.md, block verification; Sun et al. 2024; vLLM PR 46781); shown beside the figure
RULES_VS_TABLE = (
    "**Reading it beside the table.** This figure is *one* recorded run (one prompt, one seed: one draw at T > 0) "
    "decided again by each rule with the *same* uniforms; the table's block and standard rows are separate decodes, "
    "each the mean over its prompts and seeds. Block verification accepts at least as many tokens as standard *on "
    "average* (E[accepted] ≥ standard), not at every step: while the drafts have p ≥ q, P_i = 1 and h_i = 1, so "
    "block passes exactly where standard does, and block keeps more only at a step where a later position passes "
    "η_i ≤ h_i after an earlier one failed (★ in the single-run grid). So a row of equal counts here and a higher "
    "block AL in the table do not contradict each other; more seeds make the table's difference steadier.")
def rules_figure(trace: Trace) -> go.Figure:
    """Rows greedy / standard / block, one column per drafting step of ``trace``: how many of the
    step's recorded draft tokens each rule accepts with the step's recorded uniforms
    (:func:`specviz.compare.same_draft_rules`). Grey cells: the trace lacks what that rule needs."""
    decided = same_draft_rules(trace)
    steps = [s for s in trace.steps if s.draft_token_ids]
    cols = [s.index for s in steps]
    z, text, names = [], [], []
    for rule in RULES:
        vals = [decided[rule][i] for i in cols]
        z.append([None if v is None else v for v in vals])
        text.append(["n/a" if v is None else str(v) for v in vals])
        known = [v for v in vals if v is not None]
        mal = f"{1 + sum(known) / len(known):.2f}" if known and len(known) == len(vals) else "n/a"
        names.append(f"{rule}: mean acc. length {mal}")
    k = max([len(s.draft_token_ids) for s in steps] or [1])
    fig = go.Figure(go.Heatmap(z=z, x=[str(c) for c in cols], y=names, text=text, texttemplate="%{text}",
                               colorscale="Greens", zmin=0, zmax=k, xgap=1, ygap=3,
                               colorbar={"title": {"text": "accepted"}, "thickness": 12},
                               hovertemplate="step %{x}: %{text} of the draft accepted<extra>%{y}</extra>"))
    cfg = trace.config
    fig.update_layout(height=260 + MODEBAR_PX, margin={"l": 10, "r": 10, "t": 50 + MODEBAR_PX, "b": 40},
                      plot_bgcolor="#f3f4f6",
                      title={"text": f"one run's drafts and uniforms ({cfg.get('method')} k={cfg.get('num_speculative_tokens')}, "
                                     f"recorded with {cfg.get('verify')}, T={cfg.get('temperature')}, seed "
                                     f"{cfg.get('seed')}): accepted per step by each rule",
                             "font": {"size": 13}, "yref": "paper", "y": 1, "yanchor": "bottom", "pad": {"b": 8}})
    fig.update_xaxes(title_text="drafting step", type="category")
    fig.update_yaxes(automargin=True, autorange="reversed")
    return fig


def _sampled_q(trace: Trace) -> bool:
    """The run drafted from a distribution (some q below 1): its rules differ more than a one-hot draft's."""
    return any(p.q < 1.0 for s in trace.steps for p in s.positions)


def rules_source(comparison: Comparison) -> Trace | None:
    """The run "the same draft, every rule" replays: the first run at temperature > 0 verified with
    block (block's h is recorded), else standard, preferring a sampled draft (a draft model); None when there is none
    (greedy runs record no uniforms). Draft trees are left out: block verification and the replay are a chain's."""
    def rank(r) -> tuple:
        c = comparison.configs[r.config]
        return (c.temperature == 0 or c.verify not in ("block", "standard"), c.verify != "block",
                not _sampled_q(r.trace), r.prompt, r.seed)

    runs = [r for r in comparison.runs if comparison.configs[r.config].method != "none"
            and not comparison.configs[r.config].is_tree  # the rules replayed here are a chain's
            and comparison.configs[r.config].temperature > 0 and comparison.configs[r.config].verify in ("block", "standard")]
    best = min(runs, key=rank, default=None)
    return best.trace if best is not None else None


def report_html(comparison: Comparison, convention: str = "vllm") -> str:
    """A standalone HTML page (plotly.js embedded once, opens offline): settings, the table and its
    formulas (acceptance length in ``convention``), the token strips of every prompt at the first seed,
    the same draft under every rule and the k sweep."""
    rows = table(comparison)
    parts = [f"<h1>specviz comparison</h1><p>{len(comparison.runs)} runs: {len(comparison.configs)} configurations × "
             f"{len(comparison.prompts)} prompts × seeds {comparison.seeds}, {comparison.max_new_tokens} new tokens; "
             f"machine: {html.escape(', '.join(f'{k} {v}' for k, v in comparison.machine.items()))}</p>", table_html(rows, convention),
             "<div style='font-size:13px;max-width:1000px'>" + _md_to_html(TABLE_HELP) + "</div>"]
    figs = [strips_figure(comparison, p, comparison.seeds[0]) for p in range(len(comparison.prompts))]
    source = rules_source(comparison)
    if source is not None:
        figs.append(rules_figure(source))
    figs.append(ksweep_figure(rows, convention))
    for i, fig in enumerate(figs):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=i == 0, default_width="100%"))
    body = "\n".join(parts)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>specviz comparison</title></head>"
            f"<body style='font-family:system-ui,sans-serif;margin:20px'>{body}</body></html>")


def _md_to_html(text: str) -> str:
    """The table help's few Markdown constructs (paragraph, list items, **bold**, `code`) as HTML."""
    import re

    out = html.escape(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)
    out = re.sub(r"`(.+?)`", r"<code>\1</code>", out)
    out = re.sub(r"\n\s*- ", "<br>• ", out)
    return f"<p>{out}</p>"
