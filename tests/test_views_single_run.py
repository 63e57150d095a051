"""What a fresh user found unclear in the single-run views (issues 10, 17), as unit tests of the
handlers and figure functions on real traces of the bundled models (CPU): the k range and a
clamped k, Medusa's min(k, heads), grid cells that fit their column, section 3 named for the
method that ran, and a speedup table that shows the numbers its headline is computed from.
The browser side (what the page shows at 1024 and 1400 px) is tests/test_browser_single_run.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specviz.ui.handlers import source_texts
from specviz.ui.settings import MAX_UI_SPECULATIVE_TOKENS, check_k, clamped_k_note
from specviz.viz import explain
from specviz.viz.grid import CHAR_EM, PLOT_PX, cell_font, cell_label, grid_cells, step_grid_figure
from specviz.methods.medusa.view import medusa_html
from specviz.viz.source import draft_limit, draft_limit_note
from specviz.viz.speed import speedup_html
from specviz.viz.stats import run_summary
from specviz.ui.views import summary_markdown

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n"


@pytest.fixture(scope="module")
def bundled():
    from specviz import SpecDecoder

    return SpecDecoder.from_pretrained(device="cpu")  # the bundled demo models and heads


@pytest.fixture(scope="module")
def medusa5(bundled):
    return bundled.generate(PROMPT, method="medusa", num_speculative_tokens=5, max_new_tokens=16)


def test_k_outside_the_app_range_is_refused_naming_both_ranges():
    for bad in (0, 13, 40):
        with pytest.raises(ValueError, match=rf"k\) = {bad} is outside this app: 1-12; the engine itself .* 1-32"):
            check_k(bad)
    check_k(1), check_k(MAX_UI_SPECULATIVE_TOKENS)
    from specviz.engine import MAX_SPECULATIVE_TOKENS
    from specviz.ui.settings import ENGINE_MAX_SPECULATIVE_TOKENS

    assert ENGINE_MAX_SPECULATIVE_TOKENS == MAX_SPECULATIVE_TOKENS  # the range the message states is the engine's


def test_a_typed_k_clamped_by_the_browser_gets_a_note():
    assert clamped_k_note(12, "40") == "k = 40 is outside 1-12: ran k = 12"
    assert clamped_k_note(1, "-3") == "k = -3 is outside 1-12: ran k = 1"
    assert clamped_k_note(5, "40") == ""  # the slider moved since (a drag, an example): no stale note
    assert clamped_k_note(7, "7") == "" and clamped_k_note(12, "") == "" and clamped_k_note(12, "x") == ""


def test_max_new_tokens_above_the_cap_gets_a_note():
    """max new tokens typed above the app's cap is clamped by the slider (like k): the run says so, in the same words
    as k's note, and RunRequest.notes() carries it to the progress line."""
    from specviz.ui.run import RunRequest
    from specviz.ui.settings import MAX_UI_NEW_TOKENS, clamped_max_new_note

    cap = MAX_UI_NEW_TOKENS
    assert clamped_max_new_note(cap, "100000") == f"max new tokens = 100000 is outside 1-{cap} (the app's cap): ran {cap}"
    assert clamped_max_new_note(1, "0") == f"max new tokens = 0 is outside 1-{cap} (the app's cap): ran 1"
    assert clamped_max_new_note(64, "100000") == ""  # the slider moved since: no stale note
    assert clamped_max_new_note(64, "64") == "" and clamped_max_new_note(cap, "") == ""
    req = RunRequest(max_new_tokens=cap, max_new_typed="100000", num_speculative_tokens=12, k_typed="40")
    assert req.notes() == (f"k = 40 is outside 1-12: ran k = 12; max new tokens = 100000 is outside 1-{cap} (the "
                           f"app's cap): ran {cap}")
    assert RunRequest.from_values(req.values()).max_new_typed == "100000"


def test_medusa_at_k5_says_it_drafts_min_k_heads(medusa5):
    assert max(len(s.draft_token_ids) for s in medusa5.steps) == 4  # the bundled head file has 4 heads
    assert draft_limit(medusa5)[0] == 4
    note = draft_limit_note(medusa5)
    assert "Medusa drafts min(k, number of heads) = 4" in note and "column x5 of the step grid stays empty" in note
    assert note in summary_markdown(medusa5)
    grid = step_grid_figure(medusa5, 0, 1)
    said = [a for a in grid.layout.annotations if a.name == "draft limit"]
    assert len(said) == 1 and "4 heads" in said[0].text and said[0].x == 4  # along column x5 (0-based 4)
    step = next(s.index for s in medusa5.steps if s.draft_token_ids)
    assert "k = 5, but this head file has 4 heads" in medusa_html(medusa5, step)


def test_no_draft_limit_note_where_the_proposer_drafts_k(bundled, medusa5):
    mtp = bundled.generate(PROMPT, method="mtp", num_speculative_tokens=5, max_new_tokens=12)
    assert max(len(s.draft_token_ids) for s in mtp.steps) == 5
    four = bundled.generate(PROMPT, method="medusa", num_speculative_tokens=4, max_new_tokens=12)
    for tr in (mtp, four):
        assert draft_limit(tr) is None and draft_limit_note(tr) == ""
        assert not [a for a in step_grid_figure(tr, 0, 1).layout.annotations if a.name == "draft limit"]


def test_medusa_table_wraps_inside_its_panel(medusa5):
    step = next(s.index for s in medusa5.steps if s.draft_token_ids)
    page = medusa_html(medusa5, step)
    assert "nowrap" not in page and "table-layout:fixed" in page and "width:100%" in page
    shown = re.findall(r"<code title='[^']*'>([^<]*)</code>", page)
    assert shown and all(len(t.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")) <= 7 for t in shown)


def test_grid_cell_text_fits_its_column_at_the_narrowest_page(bundled):
    tr = bundled.generate(PROMPT, method="ngram", num_speculative_tokens=MAX_UI_SPECULATIVE_TOKENS,
                          max_new_tokens=32)
    for k in (1, 4, 5, 8, MAX_UI_SPECULATIVE_TOKENS, 32):
        size, chars = cell_font(k + 1)
        assert chars * CHAR_EM * size <= PLOT_PX / (k + 1) - 6, k
    _, text, _ = grid_cells(tr)
    size, chars = cell_font(len(text[0]))
    assert size < 11 and max(len(t.replace("&amp;", "&")) for row in text for t in row) <= chars
    tok = tr.output_token_ids[0]
    # indentation: ␣×8 (as every view writes it: visible()), not eight ␣ that fill the cell
    tr.token_texts[str(tok)] = "        self"
    assert cell_label(tr, tok, 7) == "␣×8self" and cell_label(tr, tok, 5) == "␣×8s…" and cell_label(tr, tok, 0) == ""


def test_section_three_is_named_for_the_method_that_ran(medusa5):
    from specviz.methods import names as method_names

    METHODS = method_names()

    for method in METHODS:
        heading, text = explain.source_heading(method), explain.source_explain(method)
        assert heading.startswith("## 3 · Where the draft came from: ")
        if method not in ("ngram", "ngram_gpu"):
            assert "n-gram" not in heading and "n-gram" not in text.split("**")[1], method
    names = {"draft_model": "draft model", "eagle": "EAGLE head", "medusa": "Medusa heads", "dflash": "DFlash block",
             "mtp": "MTP head", "suffix": "suffix tree", "ngram": "n-gram lookup"}
    for method, name in names.items():
        assert name in explain.source_heading(method) and name in explain.source_explain(method), method
    heading, text = source_texts({"trace": medusa5.to_dict()})
    assert heading.endswith("the Medusa heads") and text.startswith("**How did the Medusa heads make this draft?**")
    assert source_texts(None) == (explain.source_heading(None), explain.source_explain(None))
    from specviz.viz import report_html

    page = report_html(medusa5)  # the exported report names it too
    assert "<h2>Where the draft came from: the Medusa heads</h2>" in page and "N-gram match" not in page


def test_speedup_table_shows_what_the_headline_is_computed_from(bundled):
    from specviz.speedup import measure_speedup
    from specviz.viz.speed import inconclusive

    settings = {"method": "ngram", "num_speculative_tokens": 5, "max_new_tokens": 32}
    run = bundled.generate(PROMPT, **settings)
    base = measure_speedup(bundled, PROMPT, settings, pairs=3)
    meas = base["measurement"]
    page = speedup_html(run_summary(run), base)
    text = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    heads = re.findall(r"<th [^>]*>([^<]+)</th>", page)
    seg = f"{meas['n']} × its first {meas['segment_tokens']} tokens"
    assert heads == [f"ngram: {seg} (timed)", f"method none: {seg} (timed)",
                     "this run, whole (recorded and drawn; not timed against none)"]
    own = run_summary(run)["decode_tokens_per_second"]
    assert (f"What the segments time: the request's first {meas['segment_tokens']} tokens (of the "
            f"{len(run.output_token_ids)} this run generated), decoded again {meas['n']} times") in text
    assert f"this run's own rate ({own:.1f} tokens / s) is" in text.lower()  # lower, higher or close: its own test
    tps = re.search(r"tokens / s over the decode time</td>((?:<td[^>]*>[^<]*</td>){3})", page).group(1)
    shown = [float(x) for x in re.findall(r">([\d.]+)<", tps)]
    assert shown[:2] == [round(meas["method_summary"]["decode_tokens_per_second"], 1),
                         round(base["decode_tokens_per_second"], 1)]
    per_pair = ", ".join(f"{r:.2f}" for r in meas["ratios"])
    label = "(not a reading: see the warning)" if inconclusive(meas) else "(the headline)"  # a busy CPU: either
    assert f"per pair {per_pair} → median {meas['median']:.2f}× {label}" in text
    assert f"Measured beside this run: {meas['median']:.2f}× tokens/s" in text
    assert "pooled" in text and "The headline is the median of these ratios" in page  # defined in the hover
    # the time split under it: a measurement that is no reading is faded there too (trial 8: 14359 ms against 6741 ms
    # drawn plain under "Too noisy to read")
    from specviz.viz.stats import stats_figure

    for noisy in (False, True):
        forced = {**base, "measurement": {**meas, "noisy": noisy, "low": 1.1, "high": 1.3, "n": 3}}
        fig = stats_figure(run, forced)
        time_bars = [d for d in fig.data if d.type == "bar" and d.orientation == "h"]
        assert time_bars and all(d.opacity == (0.35 if noisy else 1.0) for d in time_bars)
        assert ("no reading" in fig.layout.annotations[3].text) == noisy
        # the lesson's one-row fit keeps only a short panel title: the x-axis title says it there (trial 9)
        from specviz.viz.stats import _time_panel

        assert ("no reading" in _time_panel(stats_figure(run), run_summary(run), forced)) == noisy


def test_measured_label_has_room_above_the_star_when_every_draft_is_accepted():
    from specviz import SpecDecoder
    from specviz.viz.stats import stats_figure

    target = str(Path(__file__).resolve().parent.parent / "assets" / "models" / "specviz-target")
    trace = SpecDecoder.from_pretrained(target, target, device="cpu").generate(
        PROMPT, method="draft_model", num_speculative_tokens=5, max_new_tokens=18)
    fig = stats_figure(trace)
    star = next(d for d in fig.data if (d.name or "").startswith("this run: a = "))
    assert star.y[0] == 6.0 and star.text[0] == "measured: 6.00" and star.cliponaxis is False
    low, high = fig.layout[star.yaxis.replace("y", "yaxis")].range
    assert low < 1 and high >= 1.2 * 6.0  # the label above the star lies inside the plot area


def test_every_bundled_compare_prompt_gives_the_target_something_to_continue(bundled):
    """A comparison prompt that ends in EOS at once adds a row of nothing (the new-user report: "Projections repeated"
    gave 1 token for every method). Each bundled prompt's greedy continuation runs past its first 4 tokens."""
    import json

    from specviz.compare.cli import PROMPT_SET

    data = json.loads(PROMPT_SET.read_text())
    for prompt in data if isinstance(data, list) else data["prompts"]:
        out = bundled.generate(prompt["text"], method="none", max_new_tokens=4)
        assert len(out.output_token_ids) == 4, (prompt["name"], out.stop_reason)


def test_a_noisy_measurement_leads_with_its_warning_not_a_bold_number():
    """A noisy median (pairs 0.70, 1.87, 1.96: a lecturer's EAGLE-3 run) is not a headline: the warning comes
    first and the median is in plain type, in the paragraph and in the table's pair row; a quiet one stays bold."""
    from specviz.speedup import spread
    from specviz.viz.speed import _pair_row, measured_html

    def measurement(ratios):
        return {**spread(ratios), "pairs": len(ratios), "segment_tokens": 32, "cost_s": 2.0, "ratios": ratios,
                "method_summary": {"decode_tokens_per_second": 10.0}, "none_decode_tokens_per_second": 8.0}

    noisy, quiet = measurement([0.70, 1.87, 1.96]), measurement([1.20, 1.22, 1.25])
    text = measured_html(noisy)
    assert noisy["noisy"] and text.index("Too noisy to read") < text.index("Measured beside this run: 1.87×")
    assert "<b>Measured beside" not in text and "<b>1.87×</b>" not in _pair_row(noisy)
    assert "<b>Measured beside this run: 1.22× tokens/s</b>" in measured_html(quiet)
    assert "Too noisy" not in measured_html(quiet) and "<b>1.22×</b>" in _pair_row(quiet)
    # a range across 1x (pairs 1.18, 1.28, 0.77: one pair slower than method none) is no speedup either, though not
    # "noisy" by its width (a lecturer read a bold 1.18x beside a pooled 1.02x)
    across = measurement([1.18, 1.28, 0.77])
    assert not across["noisy"] and "slower than method none" in measured_html(across)
    assert "<b>Measured beside" not in measured_html(across) and "<b>1.18×</b>" not in _pair_row(across)


def test_more_pairs_never_make_a_measurement_look_worse_and_one_pair_is_no_headline():
    """A lecturer's trial: nine consistent pairs (2.05x-3.62x, median 2.60x) read "Too noisy", because the range grows
    with the number of pairs, while one pair (no spread at all) was a bold headline. Now the noise rule reads the
    interquartile range, and fewer than 3 pairs lead with "too few pairs to judge"."""
    from specviz.speedup import spread
    from specviz.viz.speed import _pair_row, measured_html, run_vs_segments_html

    def measurement(ratios):
        return {**spread(ratios), "pairs": len(ratios), "segment_tokens": 32, "cost_s": 2.0, "ratios": ratios,
                "method_summary": {"decode_tokens_per_second": 10.0}, "none_decode_tokens_per_second": 4.0}

    nine = measurement([2.05, 2.30, 2.45, 2.55, 2.60, 2.62, 2.80, 3.10, 3.62])
    assert not nine["noisy"] and "<b>Measured beside this run: 2.60× tokens/s</b>" in measured_html(nine)
    assert "A rerun of the same request can land outside this range" in measured_html(nine)  # not a CI (trial 6)
    three = measurement([2.05, 2.60, 3.62])  # the same extremes over 3 pairs: the middle half is wide
    assert three["noisy"] and measured_html(three).startswith("<p style='color:#b45309' class='sv-noisy'><b>Too noisy")
    assert "the middle half of the pairs (2.33× to 3.11×; all of them 2.05× to 3.62×)" in measured_html(three)
    for ratios in ([2.56], [2.4, 2.7]):
        few = measurement(ratios)
        text = measured_html(few)
        assert text.index("Too few pairs to judge") < text.index("Measured beside this run")
        assert "<b>Measured beside" not in text and "(not a reading: see the warning)" in _pair_row(few)
    cut = measured_html({**measurement([2.4, 2.7]), "pairs": 3})  # trial 7: "raise the pairs to 3" with 3 set
    assert "The time budget ended the measurement after 2 of 3 pairs" in cut and "Raise the comparison" not in cut
    one = measured_html(measurement([2.56]))
    assert "one pair of 32-token segments" in one and "median of 1" not in one and "alternating" not in one
    why = run_vs_segments_html({"decode_tokens_per_second": 5.0, "tokens": 64}, nine)
    assert "it was the first run" not in why and "the first run of new settings also pays" in why
    timed = nine["method_summary"]["decode_tokens_per_second"]
    assert "is lower than the segments'" in why  # 5.0 against the segments' rate
    faster = run_vs_segments_html({"decode_tokens_per_second": timed * 1.5, "tokens": 64}, nine)
    assert "is higher than the segments'" in faster and "set-up costs" not in faster  # it gave slow-run reasons
    close = run_vs_segments_html({"decode_tokens_per_second": timed * 1.05, "tokens": 64}, nine)
    assert "is close to the segments'" in close and "Why" not in close
