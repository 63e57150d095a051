"""The figure functions (specviz.viz) on real traces from tiny models and on hand-made traces:
the drawn data must match the trace (cell counts, fates, histogram sums, the test bars)."""

from __future__ import annotations

import dataclasses
import html
import json
import math
import re

import pytest

from specviz.engine import METHODS
from specviz.loading import bundled_heads
from specviz.trace import Emitted, Position, RunMetrics, Step, Trace, compute_metrics
from specviz.trace.metrics import counted
from specviz.viz.common import fmt_prob
from specviz.methods.ngram.view import match_context_html, trie_figure, trie_placement
from specviz.viz.source import source_figure, source_html
from specviz.viz import (
    FATES,
    estimated_alpha,
    expected_tokens_per_step,
    figures,
    grid_cells,
    report_html,
    residual_figure,
    run_summary,
    speedup_html,
    step_costs,
    stats_figure,
    step_grid_figure,
    token_events,
    token_stream_html,
)

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n"
MAX_NEW = 20
RUNS = {
    **{f"{m}-greedy": {"method": m} for m in METHODS if m not in bundled_heads()},  # head methods: their own test files
    "draft_model-standard": {"method": "draft_model", "verify": "standard", "temperature": 1.0},
    "draft_model-block": {"method": "draft_model", "verify": "block", "temperature": 1.0},
    "ngram-standard": {"method": "ngram", "verify": "standard", "temperature": 0.9},
}


@pytest.fixture(scope="module")
def traces(decoders):
    dec = decoders["llama"]
    out = {}
    for name, kw in RUNS.items():
        lookup = {"prompt_lookup_min": 1, "prompt_lookup_max": 3} if kw["method"] == "ngram" else {}
        out[name] = dec.generate(PROMPT, num_speculative_tokens=4, max_new_tokens=MAX_NEW, seed=3, **lookup, **kw)
    return out


@pytest.fixture(scope="module")
def self_trace(self_decoders):
    """draft == target, greedy: every draft token accepted, every step ends with a bonus token."""
    return self_decoders["llama"].generate(PROMPT, method="draft_model", num_speculative_tokens=3, max_new_tokens=12)


def title_text(fig) -> str:
    """The residual figure's caption (the annotation named "caption") as plain text without tags."""
    text = next(a.text for a in fig.layout.annotations if a.name == "caption")
    return " ".join(re.sub(r"<[^>]+>", " ", text).split())


def _pos(i, tok, accepted, p=0.5, q=1.0, u=0.3):
    return Position(index=i, token_id=tok, p=p, q=q, u=u, accept_prob=min(1.0, p / q), accepted=accepted,
                    residual_mass=0.5, p_top=[[tok, p], [99, 0.2]], q_top=[[tok, q]], residual_top=[[99, 1.0]])


def handmade() -> Trace:
    """Three steps: 2 of 3 accepted + recovered; nothing drafted; 3 of 3 accepted but cut to 2 by the stop."""
    steps = [
        Step(0, "ngram", [10, 11, 12], 2, Emitted(3, 20, "recovered", 0.4, [[20, 0.6]]),
             [_pos(1, 10, True), _pos(2, 11, True), _pos(3, 12, False, u=0.9)], [10, 11, 20],
             match={"kind": "ngram", "n": 1, "suffix": [5], "suffix_start": 3, "occurrences": [0], "match_position": 0,
                    "tried": [{"n": 1, "occurrences": 1}], "trie": [{"token_id": 6, "count": 1, "children": []}]}),
        Step(1, "ngram", [], 0, Emitted(1, 21, "target", 0.9, [[21, 0.9]]), [], [21],
             match={"kind": "ngram", "n": 0, "tried": [{"n": 1, "occurrences": 0}], "trie": []}),
        Step(2, "ngram", [30, 31, 32], 3, Emitted(4, 33, "bonus", 0.7, [[33, 0.7]]),
             [_pos(1, 30, True), _pos(2, 31, True), _pos(3, 32, True)], [30, 31]),
    ]
    for st in steps:
        st.timings_ms = {"draft": 100.0, "verify": 350.0, "sample": 50.0}
    texts = {str(t): f"t{t}" for t in (5, 6, 10, 11, 12, 20, 21, 30, 31, 32, 33, 99)}
    return Trace(config={"method": "ngram", "num_speculative_tokens": 3, "verify": "standard"},
                 prompt_token_ids=[5, 6, 7, 5], prompt_text="t5t6t7t5", steps=steps,
                 output_token_ids=[10, 11, 20, 21, 30, 31], token_texts=texts,
                 metrics=compute_metrics(steps, 3), target_forward_passes=4, wall_time_s=1.0, tokens_per_second=6.0,
                 stop_reason="max_new_tokens")


def test_handmade_fates_in_grid_and_stream():
    tr = handmade()
    z, text, _ = grid_cells(tr)
    f = [[FATES[int(v)] if not math.isnan(v) else None for v in row] for row in z]
    assert f[0] == ["accepted", "accepted", "rejected", "recovered"]
    assert f[1] == [None, None, None, "target"]
    # the request stopped at x2: x2 is the step's own token as every statistic counts it; x3 and the bonus dropped
    assert f[2] == ["accepted", "stop", "cut", "cut"]
    # the grid's green cells = the statistic's accepted drafts
    assert sum(row.count("accepted") for row in f) == RunMetrics.of(tr).num_accepted_tokens == 3
    assert text[0][:3] == ["t10", "t11", "t12"] and text[0][3] == "t20"
    page = token_stream_html(tr)
    fates = re.findall(r'data-fate="(\w+)"', page)
    assert fates == ["accepted", "accepted", "rejected", "recovered", "target", "accepted", "stop"]
    assert "the request stopped at" in page  # the legend names the stop fate when a step was cut
    shown = [int(t) for t, fate in zip(re.findall(r'data-token="(\d+)"', page), fates) if fate != "rejected"]
    assert shown == tr.output_token_ids


def test_brief_trace_without_positions_still_draws(decoders):
    tr = decoders["llama"].generate(PROMPT, method="ngram", num_speculative_tokens=3, max_new_tokens=12,
                                    prompt_lookup_min=1, detailed_trace=False)
    st = next(s for s in tr.steps if s.draft_token_ids)
    assert st.positions == []
    fig = residual_figure(tr, st.index, 1)
    assert "detailed_trace=False" in fig.layout.annotations[0].text
    page = token_stream_html(tr)
    shown = [int(t) for t, f in zip(re.findall(r'data-token="(\d+)"', page), re.findall(r'data-fate="(\w+)"', page))
             if f != "rejected"]
    assert shown == tr.output_token_ids
    assert len(grid_cells(tr)[0]) == len(tr.steps)


def test_handmade_stats_and_alpha():
    tr = handmade()
    fig = stats_figure(tr)
    hist = fig.data[0]
    # from committed tokens: step 2's sampler accepted 3, but the stop kept 2 (x3 and the bonus cut); its last kept
    # token counts as the step's own (accepted = committed - 1 = 1, vLLM's count), so every drafting step is 1 + accepted
    assert list(hist.y) == tr.metrics["acceptance_histogram"] == [0, 1, 1, 0]
    # verified positions: step 0 -> 3 (2 accepted + the rejected one), step 2 -> 1 (x2, its own token, and x3
    # discarded at the stop); accepted 2 + 1
    assert estimated_alpha(tr) == pytest.approx(3 / 4)
    assert expected_tokens_per_step(0.0, 4) == 1.0 and expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)
    summary = run_summary(tr)
    assert summary["tokens"] == 6 and summary["steps"] == 3 and summary["tokens_per_forward"] == 2.0
    assert summary["decode_s"] == pytest.approx(1.5)  # 3 steps x (100 + 350 + 50) ms
    assert summary["decode_tokens_per_second"] == pytest.approx(4.0)
    # a method-none baseline: 6 one-token steps of 100 ms each
    base = dict(method="none", tokens=6, steps=6, target_forward_passes=7, tokens_per_forward=1.0,
                time_ms={"draft": 0.0, "verify": 600.0, "sample": 0.0}, decode_s=0.6, decode_tokens_per_second=10.0)
    costs = step_costs(summary, base)  # per step: 100 + 350 + 50 ms = 1.0 + 3.5 + 0.5 plain steps
    assert costs == pytest.approx({"draft": 1.0, "verify": 3.5, "sample": 0.5, "total": 5.0})
    table = speedup_html(summary, base)
    text = " ".join(re.sub(r"<[^>]+>", " ", table).split())
    assert "2.00× tokens per target forward" in text and "Measured on this machine: 0.40× tokens/s" in text
    assert "2.00 / 5.00 = 0.40×" in text and "speculation loses" in text
    fast = speedup_html(summary, dict(base, time_ms={"draft": 0.0, "verify": 6000.0, "sample": 0.0}, decode_s=6.0,
                                      decode_tokens_per_second=1.0))
    assert "4.00× tokens/s" in fast and "speculation loses" not in fast


def test_handmade_residual_bars():
    tr = handmade()
    fig = residual_figure(tr, 0, 3)  # the rejected position
    bars = {b.name: b for b in fig.data if b.type == "bar" and b.orientation != "h"}
    assert set(bars) == {"target p", "draft q", "residual max(p−q,0)/Z"}
    ids = [c[1] for c in bars["target p"].customdata]
    assert ids[0] == 12 or 12 in ids
    assert bars["target p"].y[ids.index(12)] == pytest.approx(0.5)
    assert bars["draft q"].y[ids.index(12)] == pytest.approx(1.0)
    assert bars["residual max(p−q,0)/Z"].y[ids.index(99)] == pytest.approx(1.0)
    threshold = [b for b in fig.data if b.type == "bar" and b.orientation == "h" and b.name][0]
    u_marker = [d for d in fig.data if d.type == "scatter" and d.name == "u (the uniform drawn)"][0]
    assert threshold.x[0] == pytest.approx(0.5) and u_marker.x[0] == pytest.approx(0.9)
    assert "u = 0.9 > min(1, p/q) = 0.5: rejected" in title_text(fig)


def test_a_position_after_the_first_rejection_says_it_was_never_tested():
    """Token-wise rules stop at the first rejection: a later position's u was drawn but never compared, so its
    panel must not call it rejected (a u below min(1, p/q) = 1 once read "u = 0.5884 > min(1, p/q) = 1: rejected")."""
    tr = handmade()
    st = tr.steps[0]
    st.draft_token_ids.append(13)  # a 4th draft after the rejected 3rd, whose test would have passed
    st.positions.append(_pos(4, 13, False, p=0.4, q=0.2, u=0.59))
    fig = residual_figure(tr, 0, 4)
    text = title_text(fig)
    assert "was unused" in text and "never tested: draft x3 before it was rejected" in text, text
    assert "had it been tested: u = 0.59 ≤ min(1, p/q) = 1, it would have passed" in text, text
    assert not re.search(r"min\(1, p/q\) = [0-9.]+: rejected", text), text  # no verdict for a test that never ran
    u_marker = [d for d in fig.data if d.type == "scatter" and d.name == "u (the uniform drawn)"][0]
    assert u_marker.marker.color == "#9ca3af" and "never compared" in u_marker.text[0]
    residual = [b.name for b in fig.data if b.type == "bar" and b.orientation != "h" and "residual" in b.name]
    assert residual == ["residual max(p−q,0)/Z (not drawn from here)"]
    # trial 4: drawn at full height like the one sampled; an outline says "shown, not drawn from"
    hollow = next(b for b in fig.data if b.type == "bar" and b.name == residual[0])
    assert hollow.marker.color == "rgba(255,255,255,0)" and hollow.marker.line.color == "#16a34a"
    drawn = residual_figure(tr, 0, 3)  # the rejected position: its residual is where the recovered token came from
    solid = next(b for b in drawn.data if b.type == "bar" and (b.name or "").startswith("residual"))
    assert "not drawn" not in solid.name and solid.marker.color == "#16a34a"
    st.positions[3] = _pos(4, 13, False, p=0.1, q=0.5, u=0.59)  # a test that would have failed says so
    assert "u = 0.59 > min(1, p/q) = 0.2, it would have failed" in title_text(residual_figure(tr, 0, 4))
    tr.config["verify"] = "greedy"
    assert "greedy: never tested: draft x3 before it was rejected" in title_text(residual_figure(tr, 0, 4))


def test_probability_axis_has_no_ticks_past_the_tallest_bar():
    """q one-hot (1.0) leaves headroom above the bars for the marks' labels, but the axis never reads 1.2 or 1.4."""
    from specviz.viz.residual import prob_ticks

    fig = residual_figure(handmade(), 0, 3)
    ticks = list(fig.layout.yaxis.tickvals)
    assert max(ticks) == pytest.approx(1.0) and fig.layout.yaxis.range[1] > 1.1  # headroom kept, no tick in it
    for top in (0.05, 0.1, 0.33, 0.5, 0.8, 1.0):
        t = prob_ticks(top)
        assert t[0] == 0 and max(t) <= top + 1e-9 and 3 <= len(t) <= 6 and max(t) >= top / 2


def test_grid_and_stream_match_real_traces(traces):
    for name, tr in traces.items():
        z, text, hover = grid_cells(tr)
        assert len(z) == len(tr.steps), name
        for row, st in zip(z, tr.steps):
            drafted = [v for v in row[:-1] if not math.isnan(v)]
            assert len(drafted) == len(st.draft_token_ids), name
            n_acc = sum(1 for v in drafted if FATES[int(v)] == "accepted")
            assert n_acc == counted(st)[0], name  # green cells = the accepted drafts every statistic counts
            rejected = sum(1 for v in drafted if FATES[int(v)] == "rejected")
            assert rejected == int(st.num_accepted < len(st.draft_token_ids))
        fig = step_grid_figure(tr, 0, 1)
        assert len(fig.data[0].z) == len(tr.steps)
        starred = any(t.startswith("★") for row in text for t in row)  # the legend names ★ where a cell has it
        assert starred == any(d.name == "★ kept by block verification only" for d in fig.data), name
        page = token_stream_html(tr)
        fates = re.findall(r'data-fate="(\w+)"', page)
        toks = [int(t) for t in re.findall(r'data-token="(\d+)"', page)]
        assert [t for t, f in zip(toks, fates) if f != "rejected"] == tr.output_token_ids, name
        assert fates.count("rejected") == sum(1 for s in tr.steps if s.num_accepted < len(s.draft_token_ids))
        if tr.config["method"] == "none":
            assert set(fates) == {"target"}


def test_stats_match_metrics(traces):
    for name, tr in traces.items():
        fig = stats_figure(tr)
        m = tr.metrics
        assert list(fig.data[0].y) == m["acceptance_histogram"], name
        assert sum(fig.data[0].y) == m["num_drafts"]
        assert list(fig.data[1].y) == pytest.approx(m["acceptance_rate_per_position"])
        measured = [d for d in fig.data if (d.name or "").startswith("this run: a = ")]
        if m["num_drafts"]:
            assert measured[0].y[0] == pytest.approx(m["mean_acceptance_length"])
        else:
            assert not measured
        times = {d.name: d.x[0] for d in fig.data if d.name in ("draft", "verify", "sample")}
        assert times == pytest.approx(m["time_ms"])


def test_residual_view_uses_the_positions_numbers(traces):
    tr = traces["draft_model-standard"]
    st = next(s for s in tr.steps if s.num_accepted < len(s.draft_token_ids))
    i = st.num_accepted + 1
    pos = st.positions[i - 1]
    fig = residual_figure(tr, st.index, i)
    bars = {b.name: b for b in fig.data if b.type == "bar" and b.orientation != "h"}
    ids = [c[1] for c in bars["target p"].customdata]
    assert pos.token_id in ids and st.emitted.token_id in ids  # drafted and recovered tokens are drawn
    j = ids.index(pos.token_id)
    assert bars["target p"].y[j] == pytest.approx(pos.p) and bars["draft q"].y[j] == pytest.approx(pos.q)
    residual = dict((int(t), v) for t, v in pos.residual_top)
    for t, y in zip(ids, bars["residual max(p−q,0)/Z"].y):
        assert y == pytest.approx(residual.get(t, 0.0))
    texts = " ".join(a.text for a in fig.layout.annotations)
    assert f"drafted x{i}" in texts and "recovered" in texts


def test_grid_legend_names_the_block_star_when_a_cell_has_it(traces):
    """A step whose drafts block verification kept past where token-wise verification stops gets ★ cells, and the
    legend then names ★; a run without one has no such entry."""
    import copy

    from specviz.viz.grid import grid_cells, step_grid_figure

    star = "★ kept by block verification only"
    trace = copy.deepcopy(traces["draft_model-block"])
    assert star not in [d.name for d in step_grid_figure(trace).data] or any(
        t.startswith("★") for row in grid_cells(trace)[1] for t in row)
    st = next(s for s in trace.steps if s.block and s.num_accepted >= 1)
    st.block["eta"][0], st.positions[0].accept_prob = 0.5, 0.1  # token-wise: η_1 = 0.5 > 0.1, it keeps nothing
    assert any(t.startswith("★") for t in grid_cells(trace)[1][st.index])
    assert star in [d.name for d in step_grid_figure(trace).data]


def test_block_panel_shows_P_h_eta(traces):
    tr = traces["draft_model-block"]
    st = next(s for s in tr.steps if s.draft_token_ids)
    fig = residual_figure(tr, st.index, st.num_accepted + 1)
    by_name = {d.name: d for d in fig.data if d.name}
    k = len(st.draft_token_ids)
    assert list(by_name["P_i"].y) == pytest.approx(st.block["P"][:k])
    assert list(by_name["h_i"].y) == pytest.approx(st.block["h"][:k])
    assert list(by_name["η_i"].y) == pytest.approx(st.block["eta"][:k])
    # readable at a glance: the block series are named where drawn, the legend keeps <= 4 entries
    assert sum(1 for d in fig.data if d.name and d.showlegend is not False) <= 4
    assert not any(by_name[n].showlegend is not False for n in ("P_i", "h_i", "η_i", "min(1, p/q)"))
    if st.num_accepted < k:  # the recovered token's block residual is defined in the caption
        assert "the block residual the recovered token was drawn from" in title_text(fig)
    assert f"τ = last i with η_i ≤ h_i = {st.num_accepted} → {st.num_accepted} token(s) accepted" in title_text(fig)
    # the caption's colour word is the colour the dashes are drawn in (open symbols stroke in
    # marker.color, so an unset one took plotly's pink default)
    from specviz.viz.accept_test import RATIO_COLOUR

    ratio = by_name["min(1, p/q)"].marker
    assert ratio.color == ratio.line.color == RATIO_COLOUR == {"grey": "#6b7280"}[title_word(fig)]
    # h_i is in the tick labels under the bars, not inside the bars under the η diamonds
    block_axis = fig.layout[f"xaxis{by_name['h_i'].xaxis[1:]}"]
    assert list(block_axis.ticktext) == [f"x{i}<br>h={fmt_prob(h)}" for i, h in enumerate(st.block["h"][:k], 1)]
    assert not by_name["h_i"].text
    # the legend's top sits below the block panel's two-line tick labels and caption (~55 px)
    plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    assert -fig.layout.legend.y * plot_px >= 55 and fig.layout.margin.b >= -fig.layout.legend.y * plot_px + 30


def title_word(fig) -> str:
    """The colour word the block panel's axis caption gives the min(1, p/q) dashes."""
    caption = next(a.title.text for a in (fig.layout[k] for k in fig.layout if k.startswith("xaxis"))
                   if a.title.text and "min(1, p/q)" in a.title.text)
    return re.search(r"(\w+) dash min\(1, p/q\)", caption).group(1)


def test_bonus_slot_with_self_draft(self_trace):
    st = self_trace.steps[0]
    k = len(st.draft_token_ids)
    assert st.num_accepted == k and st.emitted.kind == "bonus"
    fig = residual_figure(self_trace, 0, k + 1)
    assert [d.name for d in fig.data if d.type == "bar"][0] == f"target p_{k + 1} (bonus slot)"
    assert "bonus" in " ".join(a.text for a in fig.layout.annotations)
    assert "free bonus token" in title_text(fig)
    z, _, _ = grid_cells(self_trace)
    assert FATES[int(z[0][-1])] == "bonus"


def test_ngram_match_and_trie(traces):
    tr = traces["ngram-greedy"]
    matched = [s for s in tr.steps if s.match.get("n")]
    assert matched, "the repetitive prompt must give n-gram matches"
    st = matched[0]
    page = match_context_html(tr, st.index)
    roles = re.findall(r'data-role="(\w+)"', page)
    assert roles.count("suffix") == st.match["n"]
    assert roles.count("chosen") == st.match["n"]
    placed = trie_placement(st)
    assert sum(nd["node"]["count"] for nd in placed if nd["depth"] == 1) == len(st.match["occurrences"])
    path = [nd["node"]["token_id"] for nd in placed if nd["on_path"]]
    assert path == st.draft_token_ids[: len(path)] and len(path) == min(len(st.draft_token_ids), 6)
    fig = trie_figure(tr, st.index)
    assert len(fig.data[-1].x) == len(placed) + 1  # the suffix root + every node
    # the root names the looked-up n-gram token by token, as the lesson's chapter does ('nn' '.' 'Module' '):' was
    # drawn ".Module):", its last three tokens glued together)
    from specviz.viz.common import label

    pattern = st.match["suffix"]
    want = ("…" if len(pattern) > 4 else "") + "".join(
        f"‘{label(tr, t, 12 if len(pattern) == 1 else 7)}’" for t in pattern[-4:])
    assert fig.data[-1].text[0] == want and want.count("‘") == min(len(pattern), 4)
    other = traces["draft_model-standard"]  # section 3 shows the draft model's own candidates
    st = next(s for s in other.steps if s.draft_token_ids)
    table = html.unescape(source_html(other, st.index))  # the draft model's own view, found by its method
    assert table.count("<tr data-position=") == len(st.draft_token_ids)
    assert f"<td>{fmt_prob(st.positions[0].q)}</td>" in table
    # beside it the same candidates drawn: a bar chart a drafted position, the drafted token's bar orange
    from specviz.methods.draft_model.view import DRAFTED_COLOUR, TOP

    fig = source_figure(other, st.index)
    bars = [d for d in fig.data if d.type == "bar"]
    assert len(bars) == len(st.positions)
    for bar, pos in zip(bars, st.positions):
        top = [(int(t), float(q)) for t, q in pos.q_top[:TOP]][::-1]
        assert list(bar.x) == [q for _, q in top]
        assert [c == DRAFTED_COLOUR for c in bar.marker.color] == [t == pos.token_id for t, _ in top]


def test_suffix_candidates_table(traces):
    tr = traces["suffix-greedy"]
    drafted = [s for s in tr.steps if s.draft_token_ids]
    if not drafted:
        pytest.skip("the tiny model's suffix run drafted nothing")
    st = drafted[0]
    page = source_html(tr, st.index)  # suffix decoding's own view, found by its method
    assert "sv-suffix" in page
    rows = re.findall(r"<tr style='([^']*)'>", page)
    assert rows.count("font-weight:bold;background:#bae6fd") == 1  # exactly the chosen candidate is bold
    assert len(rows) == sum(1 for c in st.match["candidates"] if c["draft"])


def test_partial_trace_renders(decoders):
    it = decoders["llama"].iter_generate(PROMPT, method="ngram", num_speculative_tokens=3, max_new_tokens=12,
                                         prompt_lookup_min=1)
    partial = Trace.from_json(next(it).to_json())  # a snapshot: closing the run finishes the live trace
    it.close()
    assert partial.metrics == {}
    fig = stats_figure(partial)
    assert sum(fig.data[0].y) == sum(1 for s in partial.steps if s.draft_token_ids)
    assert "<" in token_stream_html(partial)  # texts not filled yet: ids shown as <id>


def test_report_and_dict_input(traces):
    tr = traces["ngram-standard"]
    as_dict = json.loads(tr.to_json())
    assert token_stream_html(as_dict) == token_stream_html(tr)
    figs = figures(as_dict)
    assert set(figs) == {"grid", "residual", "trie", "stats"}
    page = report_html(tr)
    for heading in ("Token stream", "Step grid", "Residual view", "Where the draft came from: n-gram lookup (prompt "
                    "lookup)", "Run statistics"):
        assert f"<h2>{heading}</h2>" in page
    assert page.count("Plotly.newPlot") == 4
    # the app's summary block is in the offline report too: mean acceptance length, acceptance rate, a
    m = tr.metrics
    plain = re.sub(r"<[^>]+>", "", page)
    assert "mean acceptance length = 1 + accepted / drafting steps = " in plain
    assert f"= 1 + {m['num_accepted_tokens']} / {m['num_drafts']} = " in plain
    assert f"= {m['mean_acceptance_length']:.2f}" in plain and "draft acceptance rate = " in plain
    assert "a = accepted / verified positions = " in plain
    assert len(token_events(tr)) == len(tr.output_token_ids) + sum(
        1 for s in tr.steps if s.num_accepted < len(s.draft_token_ids))


def test_method_none_says_acceptance_is_not_applicable(traces):
    from specviz.ui.views import summary_markdown

    none, ngram = traces["none-greedy"], traces["ngram-greedy"]
    assert "mean acceptance length: not applicable (no drafts)" in summary_markdown(none)
    assert "draft acceptance rate: not applicable (no drafts)" in summary_markdown(none)
    assert "**1.00 tokens per target forward**" in summary_markdown(none)  # the headline is still defined
    assert "mean acceptance length **" not in summary_markdown(none)  # no made-up 1.00 acceptance length
    texts = [a.text for a in stats_figure(none).layout.annotations if a.name == "no-drafts"]
    assert texts == ["not applicable (no drafts)"] * 2
    assert not [a for a in stats_figure(ngram).layout.annotations if a.name == "no-drafts"]
    assert "not applicable" not in summary_markdown(ngram)


def test_the_four_rates_are_one_defined_set_with_a_headline(traces):
    from specviz.ui.views import summary_markdown
    from specviz.viz.stats import estimated_alpha, rate_set

    tr = traces["ngram-greedy"]
    m = tr.metrics
    rates = rate_set(tr)
    assert [r.key for r in rates] == ["tokens_per_forward", "mean_acceptance_length", "draft_acceptance_rate", "alpha"]
    assert rates[0].value == pytest.approx(m["tokens_per_target_forward"])
    assert rates[1].value == pytest.approx(m["mean_acceptance_length"])
    assert rates[2].value == pytest.approx(m["draft_acceptance_rate"])
    assert rates[3].value == pytest.approx(estimated_alpha(tr))
    for r in rates:  # each formula's numbers give its value (every form of it, where it shows two)
        for form in r.numbers.split(" = "):
            num, den = form.replace("1 + ", "").split(" / ")
            assert (1 if form.startswith("1 + ") else 0) + int(num) / int(den) == pytest.approx(r.value), r
    text = summary_markdown(tr)
    head, *lines = text.split("\n")
    assert head.startswith(f"**{rates[0].value:.2f} tokens per target forward** = generated tokens / verification")
    assert [ln.split(" **")[0] for ln in lines[:3]] == ["- mean acceptance length", "- draft acceptance rate", "- a"]
    assert ("= 1 + accepted / drafting steps = committed tokens of drafting steps / drafting steps = 1 + " in lines[0]
            and "accepted / verified positions" in lines[2])


def test_suffix_trie_panel_draws_the_candidates_as_a_tree(traces):
    from specviz.viz.common import label
    from specviz.methods.suffix.view import suffix_branches

    tr = traces["suffix-greedy"]
    drafted = [s for s in tr.steps if s.draft_token_ids and s.match.get("chosen")]
    if not drafted:
        pytest.skip("the tiny model's suffix run drafted nothing")
    st = drafted[0]
    fig = source_figure(tr, st.index)
    assert fig.layout.title.text.startswith("suffix decoding:") and "no n-gram match" not in fig.layout.title.text
    nodes = [d for d in fig.data if d.mode == "markers+text"][0]
    branches = suffix_branches(st)
    assert sum(b["chosen"] for b in branches) == 1
    chosen = st.match["chosen"]
    for t, p in zip(chosen["draft"], chosen["probs"]):  # the drafted branch, token by token with its probability
        assert f"{label(tr, t, 7)} {p:.2f}" in nodes.text
    assert list(st.draft_token_ids) == list(chosen["draft"])[: len(st.draft_token_ids)]


def test_report_grid_hint_does_not_mention_sliders(traces):
    page = report_html(traces["ngram-standard"])
    hint = page.split("<h2>Step grid</h2>", 1)[1].split("</p>", 1)[0]
    assert "One row per verification step" in hint and "slider" not in hint.lower()
    assert "Hover a cell" in hint


def test_ngram_gpu_match_view(decoders):
    """Method ngram_gpu drafts exactly what ngram drafts; its match view marks the suffix and the
    occurrence used, and says why there is no trie."""
    dec = decoders["llama"]
    kw = dict(num_speculative_tokens=4, max_new_tokens=MAX_NEW, prompt_lookup_min=1, prompt_lookup_max=3)
    cpu, gpu = dec.generate(PROMPT, method="ngram", **kw), dec.generate(PROMPT, method="ngram_gpu", **kw)
    assert [s.draft_token_ids for s in gpu.steps] == [s.draft_token_ids for s in cpu.steps]
    assert [s.match.get("match_position") for s in gpu.steps] == [s.match.get("match_position") for s in cpu.steps]
    st = next(s for s in gpu.steps if s.match.get("n"))
    assert st.proposer == "ngram_gpu" and st.match["occurrences"] == [st.match["match_position"]]
    page = match_context_html(gpu, st.index)
    roles = re.findall(r'data-role="(\w+)"', page)
    assert roles.count("suffix") == st.match["n"] and roles.count("chosen") == st.match["n"]
    assert "returns only the occurrence it used" in page
    assert "builds no continuation trie" in trie_figure(gpu, st.index).layout.annotations[0].text
    empty = next((s for s in gpu.steps if not s.match.get("n")), None)
    if empty is not None:
        assert "no earlier occurrence" in match_context_html(gpu, empty.index)


def test_summary_says_when_prompt_lookup_rarely_matched(decoders, traces):
    from specviz.ui.views import summary_markdown

    rare = decoders["llama"].generate("x = 1", method="ngram", num_speculative_tokens=4, max_new_tokens=12,
                                      prompt_lookup_min=5, prompt_lookup_max=5)
    drafted = sum(1 for s in rare.steps if s.draft_token_ids)
    assert drafted < 0.3 * len(rare.steps)
    assert f"found a match at only {drafted} of {len(rare.steps)} steps" in summary_markdown(rare)
    assert "found a match at only" not in summary_markdown(handmade())  # ngram, 2 of 3 steps drafted
    assert "found a match at only" not in summary_markdown(traces["draft_model-standard"])


def test_grid_cell_click_selects_step_and_position():
    from specviz.viz.grid import cell_selection, grid_width

    tr = handmade()  # K = 3; step 0: 2 of 3 accepted; step 1: nothing drafted; step 2: 3 of 3 accepted
    assert grid_width(tr) == 3
    assert cell_selection(tr, 0, 0) == (0, 1) and cell_selection(tr, 0, 2) == (0, 3)
    assert cell_selection(tr, 0, 3) == (0, 3)  # the step's own token: slot num_accepted + 1
    assert cell_selection(tr, 1, 0) == (1, 1) and cell_selection(tr, 1, 3) == (1, 1)  # no draft: its own token
    assert cell_selection(tr, 2, 3) == (2, 4)  # bonus slot k'+1
    assert cell_selection(tr, 99, -4) == (2, 1)  # clamped


def test_block_rescue_is_marked():
    """A block step that accepted drafts token-wise verification would have rejected (same uniforms):
    the grid stars them, the hover and the residual title say so, the summary lists the step."""
    from specviz.ui.views import summary_markdown
    from specviz.viz.common import block_rescued, tokenwise_accepted

    tr = handmade()
    st = tr.steps[0]  # 2 of 3 accepted; make it a block step whose token-wise test fails at position 2
    st.positions[0].accept_prob, st.positions[1].accept_prob = 0.8, 0.1
    st.block = {"P": [0.8, 0.3, 0.0], "rho": [0.5, 0.4, 0.0], "h": [0.9, 0.7, 0.0], "eta": [0.3, 0.6, 0.95], "tau": 2}
    assert tokenwise_accepted(st) == 1 and block_rescued(st) == 1
    assert tokenwise_accepted(tr.steps[2]) is None and block_rescued(tr.steps[2]) == 0
    z, text, hover = grid_cells(tr)
    assert text[0][1].startswith("★") and not text[0][0].startswith("★") and "token-wise" in hover[0][1]
    assert "★ Block verification accepted 1 draft token(s)" in summary_markdown(tr) and "step 0 (+1)" in summary_markdown(tr)
    assert "by block verification" in title_text(residual_figure(tr, 0, 2))
    assert "★" not in summary_markdown(handmade())


def test_stats_figure_names_its_panel_titles_for_the_presentation_fit(traces):
    """specviz/ui/lesson.py svStatsFit moves the four panel titles (by name) to the compact geometry of
    meta.stats_fit, whose rows must keep at least min_row_px at the 1280x720 room it was drawn for; its one-row
    arrangement (strip) gives each panel a column with titles short enough for it."""
    from specviz.viz.stats import PRESENT_FIT

    fig = stats_figure(next(iter(traces.values())))
    names = [a.name for a in fig.layout.annotations if (a.name or "").startswith("subplot-title-")]
    assert names == [f"subplot-title-{i}" for i in range(4)]
    f = fig.layout.meta["stats_fit"]
    assert {k: v for k, v in f.items() if k != "strip"} == {k: v for k, v in PRESENT_FIT.items() if k != "strip"}
    area = 380 - f["top_px"] - f["axis_px"] - f["legend_px"]  # about the room under a long statistics chapter
    assert (area - f["axis_px"] - f["title_px"]) / 2 >= f["min_row_px"]
    (a0, a1), (b0, b1) = f["columns"]
    assert 0 <= a0 < a1 < b0 < b1 <= 1
    strip = f["strip"]
    edges = [x for c in strip["columns"] for x in c]
    assert edges == sorted(edges) and edges[0] >= 0 and edges[-1] <= 1 and len(strip["columns"]) == 4
    # the trace's own time-axis title says what was timed (the whole run here: no baseline)
    assert strip["x_titles"][3] == "ms, the whole run"
    plot_px = strip["min_width"] - 80  # the figure's l + r margins
    for (c0, c1), title, axis in zip(strip["columns"], strip["panel_titles"], strip["x_titles"]):
        column = (c1 - c0) * plot_px + 60  # a title may reach into the gaps beside its column
        assert len(title) * 0.55 * strip["titles"] <= column, title  # about 0.55 em a character (Open Sans)
        assert len(axis) * 0.55 * strip["font"] <= column, axis


def test_stats_legend_is_grouped_by_panel_and_a_tree_draws_no_chain_curve(traces):
    """The legend's entries sit under their panel's group title (a lecturer could not tell which entry belonged to
    which panel); a tree run has no (1 - a^(k+1)) / (1 - a) curve (the i.i.d. chain model does not describe it),
    a note says so, and its star stays."""
    from specviz.viz.stats import LEGEND_GROUPS, TREE_NO_THEORY, is_tree_run

    chain = next(t for t in traces.values() if any(s.draft_token_ids for s in t.steps))
    fig = stats_figure(chain)
    shown = [t for t in fig.data if t.showlegend is not False]
    assert shown and all(t.legendgroup in LEGEND_GROUPS for t in shown)
    assert {t.legendgrouptitle.text for t in shown} == set(LEGEND_GROUPS.values())
    assert any((t.name or "").startswith("theory") for t in fig.data) and not is_tree_run(chain)
    from test_tree_view import tree_trace

    tree = tree_trace()
    assert is_tree_run(tree)
    fig = stats_figure(tree)
    assert not any((t.name or "").startswith("theory") for t in fig.data)
    assert [a.text for a in fig.layout.annotations if a.name == "tree-no-theory"] == [TREE_NO_THEORY]


def test_a_grid_longer_than_its_rows_says_which_steps_it_shows():
    """The grid shows VISIBLE_ROWS steps around the selected one; with more steps its title says which (a new user saw
    22 of 26 rows and no hint that others exist)."""
    from specviz.viz.grid import VISIBLE_ROWS, step_grid_figure

    tr = handmade()
    assert step_grid_figure(tr, 0, 1).layout.title.text == "3 verification steps × draft positions"
    tr.steps = [dataclasses.replace(tr.steps[1], index=i) for i in range(VISIBLE_ROWS + 8)]  # 30 one-token steps
    tr.output_token_ids = [t for s in tr.steps for t in s.committed_token_ids]
    title = step_grid_figure(tr, 20, 1).layout.title.text
    assert title == f"steps 15-29 of {VISIBLE_ROWS + 8} (drag to scroll) × draft positions", title
    # a late step in the upper half of the window, which runs past the last step (step 23 of 26 sat in row 19 of
    # 22, under the fold below a lesson's chapter panel at 1280x720, where 15 rows show)
    fig = step_grid_figure(tr, 27, 1)
    lo, hi = sorted(fig.layout.yaxis.range)
    assert 27 - lo <= VISIBLE_ROWS // 2 and hi - lo == VISIBLE_ROWS and "steps 19-29 of" in fig.layout.title.text
    assert step_grid_figure(tr, 2, 1).layout.title.text.startswith("steps 0-21 of")
    assert len(title) * 7.5 <= 480  # fits the grid's half of a 1024 px page at 14 px


def test_bar_labels_never_split_a_token():
    """Each bar label is its token whole ("␣for" / "ward" read as two tokens): short ones share one line; when one is
    longer than a bar, every second label from the first moves down a line, so each has two bars' width, and the
    first and last (a bar and a half beside the plot's ends: a long first one ran into the probability axis's "0")
    are cut with "…" past that."""
    from specviz.viz.residual import TICK_LINE, bar_labels

    assert bar_labels(["abc", "t1", "&lt;|x"]) == ["abc", "t1", "&lt;|x"]
    long = ["␣forward", "ibility", "x", "&lt;|endoftext|&gt;", "␣hidden"]
    assert bar_labels(long) == ["<br>␣forward", "ibility", "<br>x", "&lt;|endoftext|&gt;", "<br>␣hidden"]
    assert bar_labels(["&lt;|endoftext|&gt;", "a", "␣hidden_size"]) == ["<br>&lt;|endoft…", "a", "<br>␣hidden_…"]
    assert all(len(t) <= TICK_LINE for t in bar_labels(["x" * TICK_LINE] * 3))


def test_residual_captions_never_break_inside_a_formula_or_a_token():
    """The caption wraps only between units: "Z = Σ max(p−q, 0) = 0.3515" and "u = … > min(1, p/q) = …" stay on one
    line (the caption read "Z = Σ max(p−q," / "0) = 0.3515"); prose still wraps at its spaces."""
    from specviz.viz.common import wrap_units

    line = "u = 0.2741 > min(1, p/q) = 0.01956: rejected  ·  Z = Σ max(p−q, 0) = 0.3515"
    for width in (20, 40, 56, 64, 72):
        lines = wrap_units(line, width)
        assert " ".join(" ".join(lines).split()) == " ".join(line.split())
        assert any("Z = Σ max(p−q, 0) = 0.3515" in w for w in lines), (width, lines)
        assert any("u = 0.2741 > min(1, p/q) = 0.01956:" in w for w in lines), (width, lines)
    assert wrap_units("an accepted token (from the draft) then prose", 12) == [
        "an accepted", "token (from", "the draft)", "then prose"]
    assert wrap_units("normalize(max(P_τ·p − q, 0)) here", 10) == ["normalize(max(P_τ·p − q, 0))", "here"]
    # a quoted token with a bracket it never closes (code: ‘print(’) binds nothing after it
    assert wrap_units("Why was ‘print(’ rejected, and where did the recovered token come from?", 40) == [
        "Why was ‘print(’ rejected, and where did", "the recovered token come from?"]
    tr = handmade()
    tr.token_texts["12"] = " forwardibility"
    caption = next(a.text for a in residual_figure(tr, 0, 3).layout.annotations if a.name == "caption")
    lines = [re.sub(r"<[^>]+>", "", w) for w in caption.split("<br>")]
    assert "Z = Σ max(p−q, 0) = 0.5" in lines and any("‘␣forwardibility’" in w for w in lines)


def test_adjacent_drafted_and_recovered_labels_keep_clear_of_each_others_arrow():
    """When the rejected draft token's bar and the recovered token's bar are close, the lower label sits beside its
    arrow on the side away from the other mark, so the upper label's arrow does not run through it (the arrow of
    "recovered: ␣__" crossed "drafted x3: ␣forward"); far apart, both labels stay centred on their arrows."""
    from specviz.viz.residual import CLOSE_BARS, mark_places

    def marks(fig):
        return sorted((a for a in fig.layout.annotations if a.showarrow), key=lambda a: a.ay)

    tr = handmade()  # bars: t12 (drafted x3), t99, t20 (recovered)
    lower, upper = marks(residual_figure(tr, 0, 3))
    assert {lower.text.split(":")[0], upper.text.split(":")[0]} == {"drafted x3", "recovered"}
    assert lower.ay < upper.ay and lower.ax == lower.x and upper.ax == upper.x  # vertical arrows, two levels
    assert upper.xanchor == "center" and lower.xanchor == ("left" if lower.x > upper.x else "right")  # away
    assert mark_places([0, 1], 10) == [(1, "center"), (0, "left")]  # the recovered token first: rightwards
    assert mark_places([1, 0], 10) == [(0, "left"), (1, "center")]
    assert mark_places([9, 8], 10) == [(1, "center"), (0, "right")]  # no room on the right: leftwards
    assert mark_places([0, CLOSE_BARS + 1], 10) == [(0, "center"), (1, "center")]
    assert mark_places([4], 10) == [(0, "center")]


def test_a_second_line_of_bar_labels_gets_room_below_the_bars():
    """A second line of bar labels (every second one, when '␣hidden' is longer than a bar) keeps clear of what lies
    below the bars: the legend (a greedy step, where it hid 'hidden') or the accept test's row (moved down by
    TWO_LINE_GAP); one-line labels keep the usual geometry. The labels grow less than the rest in the presentation
    layout (meta.tick_scale)."""
    from specviz.viz.residual import PRESENT_BAR_TICK_SCALE, TWO_LINE_GAP

    def figure(texts: dict[str, str], verify: str):
        tr = handmade()
        tr.token_texts.update(texts)
        tr.config = {**tr.config, "verify": verify}
        return residual_figure(tr, 0, 3)

    short, long = figure({}, "standard"), figure({"12": " hidden"}, "standard")
    assert "<br>" not in "".join(short.layout.xaxis.ticktext) and "<br>" in "".join(long.layout.xaxis.ticktext)
    assert "␣hidden" in [t.removeprefix("<br>") for t in long.layout.xaxis.ticktext]
    assert long.layout.yaxis.domain[0] == pytest.approx(short.layout.yaxis.domain[0] + TWO_LINE_GAP)
    assert long.layout.yaxis2.domain == short.layout.yaxis2.domain  # the accept test's row stays where it was
    assert long.layout.meta["tick_scale"] == {"xaxis": PRESENT_BAR_TICK_SCALE}
    greedy_short, greedy_long = figure({}, "greedy"), figure({"12": " hidden"}, "greedy")
    assert greedy_long.layout.legend.y < greedy_short.layout.legend.y


def _px_sizes_outside_annotations(fig) -> list[str]:
    """Inline px font sizes in the figure's title and axis titles: the presentation layout scales the fonts of the
    layout, titles, annotations and tick labels (specviz/ui/lesson_script.py svScale), not a px size inside those."""
    texts = [fig.layout.title.text or ""] + [ax.title.text or "" for ax in (fig.layout[k] for k in fig.layout
                                                                            if k.startswith(("xaxis", "yaxis")))]
    return [m for t in texts for m in re.findall(r"font-size:\s*[0-9.]+px", t)]


def test_small_figure_texts_grow_with_the_presentation_layout():
    """The accept test's caption under its bar, the block test's key and the n-gram trie's explanation lines stayed at
    11 px in the presentation layout: none has a size of its own that the layout's scaling skips (an axis title's
    font size, a px size in a title); each is a size relative to its title's font, which the scaling reaches. The
    block key is one line short enough for half a 1280 px screen at that size (a second line pushed the block rows
    below the fold under a lesson's chapter)."""
    from specviz.viz.accept_test import CAPTION_EM
    from specviz.viz.residual import residual_figure

    tr = handmade()
    fig = residual_figure(tr, 0, 3)
    gauge_axis = fig.layout.xaxis2
    assert gauge_axis.title.text.startswith("<span style='font-size:") and "u ~ Uniform(0, 1)" in gauge_axis.title.text
    assert gauge_axis.title.font.size is None and f"{CAPTION_EM:g}em" in gauge_axis.title.text
    assert _px_sizes_outside_annotations(fig) == []
    st = tr.steps[0]
    tr.config = {**tr.config, "verify": "block"}
    st.block = {"P": [1.0, 1.0, 0.1], "h": [1.0, 1.0, 0.05], "eta": [0.2, 0.3, 0.9], "tau": 2}
    block = residual_figure(tr, 0, 3)
    key = block.layout.xaxis3.title
    assert key.font.size is None and "teal bar h_i" in key.text and "◆ η_i" in key.text
    assert "<br>" not in key.text and len(re.sub(r"<[^>]+>", "", key.text)) <= 72
    assert _px_sizes_outside_annotations(block) == []
    trie = trie_figure(tr, 0)
    assert _px_sizes_outside_annotations(trie) == [] and "em'>×count = how many occurrences" in trie.layout.title.text


def test_the_ngram_match_box_takes_the_presentation_layouts_type():
    """The n-gram match's monospace context (13 px) and its legend have classes that lesson.css enlarges under
    body.sv-present, as are the methods' definitions under the method choice (gradio's 12 px info text)."""
    from specviz.ui.layout import LESSON_CSS_PATH

    page = match_context_html(handmade(), 0)
    assert 'class="sv-match-legend"' in page and 'class="sv-match-text"' in page
    css = LESSON_CSS_PATH.read_text()
    for selector in (".sv-match-text", ".sv-match-legend", "#sv-method .info-text"):
        rule = re.search(rf"body\.sv-present {re.escape(selector)} {{ font-size: (\d+)px !important; }}", css)
        assert rule and int(rule.group(1)) >= 16, selector


def test_head_source_names_a_bundled_head_by_its_repository_path():
    """The head's line names a bundled head from the repository root (a lecturer saw this machine's absolute path
    on the projector); a head of your own keeps the path it was loaded from."""
    from specviz.trace import Trace
    from specviz.viz.head_source import head_source_html

    rec = {"format": "eagle3-speculators", "source": "vllm-project/speculators",
           "path": "/home/someone/specviz/assets/models/specviz-eagle3"}
    tr = Trace({"head": rec}, [1], steps=[], output_token_ids=[], token_texts={})
    shown = head_source_html(tr)
    assert "from <code>assets/models/specviz-eagle3</code>" in shown and "/home/someone" not in shown
    for own in ("/data/heads/my-eagle3", "/data/assets/models/my-eagle3"):  # not a bundled head's directory
        rec["path"] = own
        assert f"from <code>{own}</code>" in head_source_html(tr)
