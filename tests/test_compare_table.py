"""The Compare tab's table on a projector: one line per configuration (short names and headers, the time split as
"0.4·25.9·1.4", flags as icons, c_i as tiny bars; what a cell leaves out in its hover), the same numbers as the
report's table, the ✓ in a font that draws it as a check, and the k sweep of a single k drawn per configuration."""

from __future__ import annotations

import html
import re

import pytest

from test_compare import _comparison, _none_trace, _trace, _step, trace_a, trace_b

from specviz.compare import RunConfig, table
from specviz.viz.compare import TABLE_COLUMNS, _conditional, table_rows
from specviz.viz.compare_table import (APP_COLUMN_WIDTHS, APP_HEADERS, HTML_COLUMNS, app_columns, app_formulas,
                                       app_table_rows, short_badge, table_legend)
from specviz.viz.ksweep import ksweep_figure

TABLE_PX, CHAR_PX, HEADER_CHAR_PX, PAD_PX = 1214, 8.5, 7.3, 20  # the app's table at 1280 px: 14 px cells, 12 px heads


def _text(cell, column: str = "") -> str:
    """What a cell shows: its HTML without the tags, a number as the table formats it (in ``column``)."""
    if isinstance(cell, str):
        return re.sub(r"<[^>]+>", "", cell)
    return "" if cell is None else str(cell) if isinstance(cell, int) else f"{cell:.{1 if column == 'tokens/s' else 2}f}"


def _hover(cell: str) -> str:
    return " ".join(re.findall(r"title='([^']*)'", cell))


def _rows():
    spec = [trace_a(), trace_b()]
    none = [_none_trace([5, 6, 7, 8, 9, 1, 4, 7]), _none_trace([9])]
    return table(_comparison(spec, none))


def test_every_cell_fits_its_column_on_one_line_and_keeps_the_reports_numbers():
    rows = _rows()
    app, report = app_table_rows(rows), table_rows(rows)
    assert [r[0] for r in app] == ["none", "ngram"]  # k=3, greedy and T=0 are every row's: the legend says so
    assert "k = 3, greedy verification, T = 0" in table_legend(rows)
    for a, full in zip(app, report):  # the numbers are the report's, rounded alike
        assert [a[i] for i, c in enumerate(TABLE_COLUMNS) if c not in HTML_COLUMNS][1:] == \
               [full[i] for i, c in enumerate(TABLE_COLUMNS) if c not in HTML_COLUMNS][1:]
    ngram = dict(zip(TABLE_COLUMNS, app[1]))
    assert _text(ngram["ms/step: draft / verify / sample"]) == "1.0·10.0·1.0"
    assert "draft 1.0 / verify 10.0 / sample 1.0" in _hover(ngram["ms/step: draft / verify / sample"])
    bars = ngram["c_i (Wilson 95%, n), i = 1..k"]
    assert bars.count("<i ") == len(rows[1]["conditional"]) == 3 and _conditional(rows[1]) in _hover(bars)
    assert _text(ngram["lossless"]) == "✓ equal (2/2)" and "<span class='sv-glyph'>✓</span>" in ngram["lossless"]
    for row in app:  # each cell's text fits its column at 14 px, each header its own at 12 px
        for cell, width, head, column in zip(row, APP_COLUMN_WIDTHS, app_columns(), TABLE_COLUMNS):
            room = float(width[:-1]) / 100 * TABLE_PX - PAD_PX
            assert len(_text(cell, column).strip()) * CHAR_PX <= room, (cell, width)
            assert len(head) * HEADER_CHAR_PX <= room, (head, width)
    tips = app_formulas()
    assert all(tips.get(h) for h in app_columns()) and tips["tok/fwd"].startswith("tokens / forward: ")


def test_flags_are_icons_with_the_detail_in_their_hover():
    spec = [_none_trace([1, 2], ms=(0.0, 5.0, 0.0)), _none_trace([1, 2], ms=(0.0, 10.0, 0.0))]
    none = [_none_trace([1, 2], ms=(0.0, 10.0, 0.0)), _none_trace([1, 2], ms=(0.0, 10.0, 0.0))]
    rows = table(_comparison(spec, none))
    rows[1]["timing"] = {"mark": "⚠ 2 slow step(s)", "detail": "2 step(s) took over 10x the row's median step"}
    cells = dict(zip(TABLE_COLUMNS, app_table_rows(rows)[1]))
    speedup_range = cells["speedup range (n)"]
    assert _text(speedup_range) == "1.00–2.00 ⚠" and "1.00–2.00 (n 2) noisy" in _hover(speedup_range)
    time = cells["ms/step: draft / verify / sample"]
    assert _text(time) == "0.0·7.5·0.0 ⚠" and "2 step(s) took over 10x" in _hover(time)
    one = table(_comparison(spec[:1], none[:1]))
    assert _text(app_table_rows(one)[1][TABLE_COLUMNS.index("speedup range (n)")]) == "n 1 ⚠"


def test_long_badges_are_cut_with_the_whole_badge_in_the_hover():
    near = "≈ equal: bf16 near-tie at token 12 (gap 0.0039 / 0.0078)"
    assert short_badge(near) == "≈ near-tie"
    assert short_badge("≈ χ² per position p=0.34 (12 seeds)") == "≈ χ² p=0.34"
    assert short_badge("✗ χ² per position p=0.0012 (12 seeds)") == "✗ χ² p=0.0012"
    assert short_badge("not enough samples (3 seeds; run ≥ 10)") == "few seeds"
    assert short_badge("not lossless (synthetic) · ≈ χ² per position p=0.5 (10 seeds)") == "✗ synthetic"
    assert short_badge("✓ equal (3/3)") == "✓ equal (3/3)" and short_badge("baseline") == "baseline"


def test_names_keep_what_differs_between_rows():
    rows = _rows()
    rows[1] = dict(rows[1], verify="standard", temperature=0.8)
    rows.append(dict(rows[1], k=5, tree_label="tree 2 branches", verify="block"))
    assert [r[0] for r in app_table_rows(rows)] == ["none T=0", "ngram k=3 standard T=0.8",
                                                    "ngram tree 2 branches k=5 block T=0.8"]
    assert not table_legend(rows).startswith("**Every row")


def test_the_legend_says_speedups_compare_only_within_one_comparison():
    rows = _rows()
    cpu = table_legend(rows, {"device": "cpu"}, 3)
    assert "timed 3× per prompt and seed" in cpu and "compare them only within one comparison" in cpu
    assert "within one comparison" not in table_legend(rows, {"device": "cuda:0"}, 3)
    assert table_legend([]) == ""
    assert set(APP_HEADERS) <= set(TABLE_COLUMNS)


def _row(method: str, k: int, speedup: float = 1.1) -> dict:
    return {"method": method, "verify": "greedy", "temperature": 0.0, "k": k, "label": f"{method} k={k}",
            "acceptance_length": {"vllm": 1.5, "per_forward": 1.4, "drafts_only": 0.5}, "speedup": speedup,
            "conditional": [{"n": 10}] * k, "num_accepted_tokens": 5, "steps": 20, "num_drafts": 10}


def test_a_single_k_is_drawn_per_configuration_not_spread_around_k():
    """All methods at k = 5 spread nine markers over ±0.8 around k = 5 (a dodge), read as different k values. With a
    single k both panels put the configurations on a categorical axis, the theory a dash at each chain."""
    methods = ("ngram", "ngram_gpu", "suffix", "draft_model")
    fig = ksweep_figure([_row(m, 5) for m in methods])
    assert fig.layout.xaxis.type == fig.layout.xaxis2.type == "category"
    assert "at k = 5" in fig.layout.annotations[0].text
    measured = [d for d in fig.data if d.showlegend is not False]
    assert [list(d.x) for d in measured] == [[m] for m in methods]
    theory = [d for d in fig.data if d.name.startswith("theory")]
    assert len(theory) == len(methods) and all(d.marker.symbol == "line-ew" for d in theory)
    sweep = ksweep_figure([_row(m, k) for m in methods for k in (2, 4)])  # several k: the sweep as before
    assert sweep.layout.xaxis.type != "category"
    assert all(abs(x - k) < 0.5 for d in sweep.data if d.customdata is not None for x, k in zip(d.x, d.customdata))


def test_a_single_k_pads_its_configurations_and_names_their_markers():
    """With one k ("same draft, every rule") the first and last configuration sat on the plot's edges, the last
    marker half clipped, and nothing said what the marker shapes meant: half a category of room at each end, and a
    legend (under the slanted names) with each configuration's marker, named as on the axis."""
    from specviz.viz.ksweep import ONE_K_LEGEND_PX

    rows = [dict(_row("draft_model", 4), verify=v, temperature=1.0) for v in ("standard", "block")]
    fig = ksweep_figure(rows)
    assert list(fig.layout.xaxis.range) == list(fig.layout.xaxis2.range) == [-0.5, 1.5]
    assert fig.layout.showlegend is not False
    legend = [d for d in fig.data if d.showlegend is not False]
    assert [(d.name, d.mode) for d in legend] == [("draft_model standard", "markers"), ("draft_model block", "markers")]
    assert len({d.marker.symbol for d in legend}) == 2  # the shapes it explains differ
    assert fig.layout.legend.yref == "container" and fig.layout.legend.y == 0 and fig.layout.margin.b == ONE_K_LEGEND_PX
    sweep = ksweep_figure([dict(r, k=k) for r in rows for k in (2, 4)])  # several k: a k axis, autoranged
    assert sweep.layout.xaxis.range is None and sweep.layout.legend.yref is None


def test_measured_speedups_carry_the_tables_range_as_bars():
    """Each measured speedup is drawn with a bar from the lowest to the highest per-(prompt, seed) ratio (the
    table's range column), its hover says n and the noisy flag (a lecturer saw bare points rank ngram over ngram_gpu,
    which draft the same tokens, while the table flagged both ⚠ noisy); a row without a spread draws no bar."""
    from specviz.speedup import spread
    from specviz.viz.ksweep import FADED, SINGLE_NOTE, SPEEDUP_TITLE

    quiet, noisy = _row("ngram", 5, 1.3), _row("ngram_gpu", 5, 1.2)
    quiet["speedup_spread"], noisy["speedup_spread"] = spread([1.25, 1.3, 1.35]), spread([0.95, 1.2, 1.85])
    fig = ksweep_figure([quiet, noisy, _row("suffix", 5, 1.1)])
    assert fig.layout.annotations[1].text == SPEEDUP_TITLE.format("")
    q, n, bare = [d for d in fig.data if d.xaxis == "x2"]  # one speedup trace per configuration, in order
    assert list(q.error_y.array) == pytest.approx([0.05]) and list(q.error_y.arrayminus) == pytest.approx([0.05])
    assert list(n.error_y.array) == pytest.approx([0.65]) and list(n.error_y.arrayminus) == pytest.approx([0.25])
    assert "noisy" in n.text[0] and "n 3" in n.text[0] and "noisy" not in q.text[0]
    assert bare.error_y.array is None and bare.text[0] == " (no range)"
    assert not [a for a in fig.layout.annotations if a.name == "single-sample"] and q.mode != "markers"
    # a noisy point is faded like a single sample (trial 6: on a projector nobody hovers), a quiet one is not
    assert list(n.marker.opacity) == [FADED] and list(q.marker.opacity) == [1.0]
    assert "faded, unjoined: noisy" in [a.text for a in fig.layout.annotations if a.name == "overlap-note"][0]
    # trial 8: a solid line joined faded points and read as a ranking; a series with an unreadable point is not joined
    sweep = [dict(_row("ngram", k, 1.3), speedup_spread=spread(r)) for k, r in ((3, [1.25, 1.3, 1.35]),
                                                                              (5, [0.95, 1.2, 1.85]))]
    sweep += [dict(_row("suffix", k, 1.2), speedup_spread=spread([1.15, 1.2, 1.25])) for k in (3, 5)]
    joined = {d.name.split()[0]: d.mode for d in ksweep_figure(sweep).data if d.xaxis == "x2"}
    assert joined == {"ngram": "markers", "suffix": "lines+markers"}
    # one prompt and one seed: every point is one sample; drawn faded, without the lines that read as a ranking
    # (a lecturer saw clean lines order three methods within the baseline's own spread)
    one = [dict(_row(m, k, 1.0 + k / 10), speedup_spread=spread([1.0 + k / 10])) for m in ("ngram", "suffix")
           for k in (1, 3)]
    fig = ksweep_figure(one)
    speed = [d for d in fig.data if d.xaxis == "x2"]
    assert len(speed) == 2 and all(d.mode == "markers" and list(d.marker.opacity) == [FADED, FADED] for d in speed)
    assert all("n = 1" in t for d in speed for t in d.text)
    assert [a.text for a in fig.layout.annotations if a.name == "single-sample"] == [f"faded: {SINGLE_NOTE}"]


def test_positions_no_step_verified_are_hollow_bars_and_method_none_has_none():
    rows = table(_comparison([_trace([_step(0, [], 0, [5])])], [_none_trace([5])], RunConfig("ngram", 3, "greedy", 0.0)))
    none, ngram = (r[TABLE_COLUMNS.index("c_i (Wilson 95%, n), i = 1..k")] for r in app_table_rows(rows))
    assert none == "—"
    assert ngram.count("<i class='sv-ci-none'>") == 3 and "— (n0)" in _hover(ngram)


def test_the_k_sweep_counts_every_step_so_a_rarely_drafting_method_does_not_top_it():
    """A lecturer's k sweep ranked ngram first by vLLM's AL (4.45, counted over the 19 % of steps that drafted) over
    draft_model (3.29), while ngram gave 1.66 tokens per target forward against 3.25. The left panel now plots tokens
    per target forward whatever the table's convention; the hover gives the convention's AL and the coverage. The
    speedup panel says overlapping bars do not rank, and names a small n."""
    from specviz.speedup import spread
    from specviz.viz.ksweep import NOISY_NOTE, OVERLAP_NOTE

    ngram = dict(_row("ngram", 8, 1.4), acceptance_length={"vllm": 4.45, "per_forward": 1.66, "drafts_only": 3.45},
                 steps=100, num_drafts=19, speedup_spread=spread([0.9, 1.4, 1.9]))
    dm = dict(_row("draft_model", 8, 1.3), acceptance_length={"vllm": 3.29, "per_forward": 3.25, "drafts_only": 2.29},
              steps=100, num_drafts=98, speedup_spread=spread([0.9, 1.3, 1.5]))
    for convention in ("vllm", "drafts_only", "per_forward"):
        fig = ksweep_figure([ngram, dm, dict(ngram, k=5), dict(dm, k=5)], convention)
        left = {d.name.split()[0]: d for d in fig.data if d.xaxis == "x" and d.showlegend is not False}
        assert list(left["ngram"].y) == [1.66, 1.66] and list(left["draft_model"].y) == [3.25, 3.25]
        assert fig.layout.annotations[0].text.startswith("tokens per forward vs k")
        assert "drafted at 19% of steps" in left["ngram"].text[0]
    assert "AL (vLLM) 4.45" in ksweep_figure([ngram, dm], "vllm").data[0].text[0]
    notes = [a.text for a in fig.layout.annotations if a.name == "overlap-note"]
    # one clause a line (joined, the first line ran over the panel's ticks at 1280x720 in the presentation type)
    assert notes == [f"n = 3 per point (few)<br>{NOISY_NOTE}<br>{OVERLAP_NOTE}"]
    low, _ = fig.layout.yaxis.range  # tokens per forward read from plain decoding's 1 (the axis began at 1.5)
    assert low < 1.0
    none = dict(_row("none", 8, 1.0), speedup_spread=spread([1.0] * 9))  # not drawn: its n 9 is not the points'
    assert "n = 3 per point" in [a.text for a in ksweep_figure([none, ngram, dm]).layout.annotations
                                 if a.name == "overlap-note"][0]
    lo, hi = fig.layout.yaxis2.range  # every whisker inside the panel (trial 6: autorange cut the top ones), and 1x
    assert lo < 0.9 and hi > 1.9
    many = [dict(r, speedup_spread=spread([1.0, 1.1, 1.2, 1.3, 1.4, 1.5])) for r in (ngram, dm)]
    assert [a.text for a in ksweep_figure(many).layout.annotations if a.name == "overlap-note"] == [OVERLAP_NOTE]


def test_a_row_without_an_acceptance_length_yet_draws():
    """Mid-comparison a row may have no acceptance length yet (None): the k sweep draws it without the hover's AL."""
    row = dict(_row("ngram", 3), acceptance_length={"vllm": None, "per_forward": None, "drafts_only": None})
    fig = ksweep_figure([row, _row("suffix", 3)], "vllm")
    assert fig.data[0].text[0] == "<br>drafted at 50% of steps"


def test_the_legend_spells_out_each_flag_and_its_rows():
    """Trial 7: the ⚠ texts were hover-only, which nobody reads on a projector. The line under the table names each
    flag the table shows, what it means and which rows carry it; a table without flags adds nothing."""
    spec = [_none_trace([1, 2], ms=(0.0, 5.0, 0.0)), _none_trace([1, 2], ms=(0.0, 10.0, 0.0))]
    none = [_none_trace([1, 2], ms=(0.0, 10.0, 0.0)), _none_trace([1, 2], ms=(0.0, 10.0, 0.0))]
    rows = table(_comparison(spec, none))
    rows[1]["timing"] = {"mark": "⚠ 2 slow step(s)", "detail": "2 step(s) took over 10x the row's median step"}
    legend = table_legend(rows)
    name = app_table_rows(rows)[1][0]
    assert f"**noisy** (the speedups spread too far to read on this machine now): {name}" in legend
    assert f"**slow step** (a timed step over 10x the median: a one-time cost inside the speedup): {name}" in legend
    assert "crosses 1×" not in legend
    assert "**Flags:**" not in table_legend([dict(r, speedup_spread=None, timing=None) for r in rows])


def test_a_range_across_one_is_flagged_and_faded_like_a_noisy_one():
    """Trial 7: ngram k=3 at 0.98–1.70 (not noisy by its middle half) looked readable in the table and the k sweep,
    and the next identical comparison put it elsewhere; the single-run panel already calls such a range no reading.
    A drafting row's range across 1x is flagged in the table and faded in the figure; method none's own is not."""
    from specviz.speedup import spread
    from specviz.viz.compare_table import range_cell
    from specviz.viz.ksweep import FADED

    across = dict(_row("ngram", 3, 1.3), speedup_spread=spread([0.9, 1.3, 1.4]))
    assert not across["speedup_spread"]["noisy"]
    assert "crosses 1×" in range_cell(across) and "⚠" in range_cell(across)
    above = dict(_row("suffix", 3, 1.3), speedup_spread=spread([1.2, 1.3, 1.4]))
    assert "⚠" not in range_cell(above)
    none = dict(_row("none", 1, 1.0), speedup_spread=spread([0.9, 1.0, 1.1]))
    assert "crosses" not in range_cell(none)
    fig = ksweep_figure([across, above])
    speed = {d.name.split()[0]: d for d in fig.data if d.xaxis == "x2"}
    assert list(speed["ngram"].marker.opacity) == [FADED] and list(speed["suffix"].marker.opacity) == [1.0]
    # its range bar faded too: a full-colour bar made a faded point look readable in the docs' screenshot
    assert speed["ngram"].error_y.color.endswith(f", {FADED})") and speed["suffix"].error_y.color is None


def test_prompts_that_differ_are_not_called_noise():
    """Trial 8: ngram's range 0.89–2.05 over three prompts stayed the same in four comparisons and read "⚠ noisy:
    not readable on this machine now"; it was a repetitive prompt against a docstring. Noise is judged on method none's
    repeated timings of one request: steady ones make the same spread a finding about the prompts (crossing 1x here,
    "varies by prompt" above it), spread ones keep "noisy"; with one timing per request the two cannot be told apart
    and the flag says so."""
    from specviz.compare import Comparison, Prompt, RunResult
    from specviz.viz.compare_table import flags_line, range_cell, row_flags, shared

    def ngram_trace(ms, steps):  # the output [5, 6, 7, 8] in `steps` steps (tokens per forward 4 / steps)
        cuts = {4: [1, 1, 1, 1], 3: [2, 1, 1], 2: [2, 2]}[steps]
        out, at = [], 0
        for i, n in enumerate(cuts):
            toks = [5, 6, 7, 8][at:at + n]
            out.append(_step(i, toks[:-1], n - 1, toks, ms=(0.0, ms, 0.0)))
            at += n
        return _trace(out)

    def comparison(none_timings, speed, steps=(4, 4, 4)):  # three prompts; none at 10 ms a step, ngram at ms_p a step
        c = Comparison([RunConfig("none", 1, "greedy", 0.0), RunConfig("ngram", 3, "greedy", 0.0)],
                       [Prompt(n, n) for n in "abc"], [0], 16)
        for p, (ms, n) in enumerate(zip(speed, steps)):
            base = _none_trace([5, 6, 7, 8], ms=(0.0, 10.0, 0.0))
            rate = 4 / 0.040
            c.runs.append(RunResult(0, p, 0, base, 1.0, [rate * t for t in none_timings]))
            c.runs.append(RunResult(1, p, 0, ngram_trace(ms * 4 / n, n), 1.0))
        return c

    steady = [0.99, 1.0, 1.01]
    across = table(comparison(steady, (10 / 0.9, 10 / 2.0, 10 / 1.4), steps=(4, 2, 3)))[1]  # 0.9x, 2.0x, 1.4x
    s = across["speedup_spread"]
    assert not s["noisy"] and s["noise_known"] and s["noise"] < 0.05
    assert [round(m, 2) for _, m, _ in s["by_prompt"]] == [0.9, 2.0, 1.4]
    assert row_flags(across) == ["crosses 1×"] and "noisy" not in range_cell(across)
    # the prompts' tokens per forward differ as their speedups do (1.33 / 2 / 1.33): a finding about the prompts
    above = table(comparison(steady, (10 / 1.3, 10 / 2.0, 10 / 1.6), steps=(3, 2, 3)))[1]
    assert row_flags(above) == ["varies by prompt"] and "by prompt: 1: 1.30, 2: 2.00, 3: 1.60" in range_cell(above)
    assert "ngram 1.30/2.00/1.60 (tok/fwd 1.33/2.00/1.33)" in flags_line([above], shared([above]))
    # the same gap with equal tokens per forward is the timing moving, not the prompts (a lecturer's identical
    # comparison did not show it again): noisy, and the cell says why
    timing = table(comparison(steady, (10 / 1.3, 10 / 2.0, 10 / 1.6)))[1]
    assert timing["speedup_spread"]["unexplained"] == pytest.approx([0.7 / 1.6, 0.0])
    assert row_flags(timing) == ["noisy"]
    assert "the timing moved, not the acceptance" in html.unescape(range_cell(timing))
    busy = table(comparison([0.6, 1.0, 1.5], (10 / 1.3, 10 / 2.0, 10 / 1.6)))[1]
    assert busy["speedup_spread"]["noisy"] and row_flags(busy) == ["noisy"]
    assert "method none's timings of one request ranged over" in html.unescape(range_cell(busy))
    # trial 9: none's timings 0.80-1.12 of their median (a middle half of 0.15) were called steady, and two identical
    # comparisons then ranked the methods differently; the whole range decides
    wobbly = table(comparison([0.8, 0.95, 1.0, 1.05, 1.12], (10 / 1.3, 10 / 2.0, 10 / 1.6)))[1]
    assert wobbly["speedup_spread"]["noisy"] and row_flags(wobbly) == ["noisy"]
    once = table(comparison([], (10 / 0.9, 10 / 2.0, 10 / 1.4)))[1]  # none timed once, one seed: cannot tell
    assert once["speedup_spread"]["noise_known"] is False and once["speedup_spread"]["noisy"]
    assert "cannot tell which" in range_cell(once)


def test_a_flagged_rows_speedup_is_greyed_and_the_legend_says_why():
    """A speedup the table flags (one sample, noisy, across 1×, a capture, a slow step, mixed runners) is drawn grey so
    a projected table is not ranked by it; a steady row's speedup keeps the table's colour, as does "varies by prompt"
    (a finding about the prompts, not a doubt about the number)."""
    from specviz.speedup import spread
    from specviz.ui.compare_handlers import UNSURE_COLOR, _table
    from specviz.viz.compare_table import speedup_unsure

    rows = _rows()
    steady, across = (dict(rows[1], speedup_spread=spread(v)) for v in ([1.3, 1.4, 1.5], [0.9, 1.3, 1.4]))
    captured = dict(steady, timing={**(steady.get("timing") or {}), "mark": "⚠ capture"})
    assert [speedup_unsure(r) for r in (steady, across, captured)] == [False, True, True]
    html_out = _table([rows[0], steady, across, captured], "vllm").to_html()
    speed_col = app_columns().index(APP_HEADERS["speedup"])
    grey = {int(row) for selectors in re.findall(rf"([^{{}}]*)\{{\s*color: {UNSURE_COLOR}", html_out)
            for row, col in re.findall(r"_row(\d+)_col(\d+)", selectors) if int(col) == speed_col}
    assert grey == {2, 3}
    assert "A grey speedup carries a flag" in table_legend([steady, across])
    assert "grey speedup" not in table_legend([steady])


def test_the_legend_names_heads_that_are_not_the_bundled_ones():
    """A --head replaces a bundled head under the same method name: the line under the table says which one ran."""
    from specviz.models import ASSETS_MODELS

    rows = _rows()
    mine = dict(rows[1], head="eagle3-specforge /data/my-head")
    bundled = dict(rows[1], head=f"specviz-head-v1 {ASSETS_MODELS / 'specviz-eagle3'}")
    assert "**Heads given:**" in table_legend([rows[0], mine]) and "/data/my-head" in table_legend([rows[0], mine])
    assert "Heads given" not in table_legend([rows[0], bundled])
    # the trace's own record decides where it has one (a comparison imported from another checkout's paths)
    assert "Heads given" not in table_legend([rows[0], dict(mine, head_bundled=True)])
    assert "Heads given" in table_legend([rows[0], dict(bundled, head_bundled=False)])


def test_prompts_too_long_for_the_targets_context_are_skipped_and_named():
    """A target of your own may have a shorter context than a bundled prompt set needs: the Compare tab runs the
    prompts that fit and names the others (tokens + max new tokens against the context); none fitting is an error."""
    from types import SimpleNamespace

    from specviz.compare.model import Prompt
    from specviz.compare.run import fitting

    decoder = SimpleNamespace(max_length=12, encode=lambda text: text.split())
    prompts = [Prompt("short", "a b c"), Prompt("long", " ".join("x" * 10))]
    keep, left = fitting(decoder, prompts, 4)
    assert [p.name for p in keep] == ["short"]
    assert left == ["prompt 'long' (10 tokens + 4 new > the model's context of 12)"]
    with pytest.raises(ValueError, match="no prompt fits the model's context of 12 tokens with 10 new tokens"):
        fitting(decoder, prompts, 10)
    assert fitting(SimpleNamespace(max_length=None), prompts, 10) == (prompts, [])
