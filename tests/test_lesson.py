"""Lesson chapters (specviz.viz.lesson): written from the trace's own numbers, for every method and
verification rule, and a generic text for a method the lesson does not know."""

from __future__ import annotations

import html as html_lib
import re

import pytest

from specviz.trace import Emitted, Position, Step, Trace, compute_metrics
from specviz.viz.common import fmt_prob, quoted
from specviz.viz.lesson import FOCUS_VIEWS, chapter_html, chapter_of_step, lesson_chapters

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n"


@pytest.fixture(scope="module")
def traces(decoders):
    dec = decoders["llama"]
    runs = {
        "ngram_greedy": dict(method="ngram", temperature=0.0, prompt_lookup_min=1, prompt_lookup_max=3),
        "dm_standard": dict(method="draft_model", verify="standard", temperature=1.0),
        "dm_block": dict(method="draft_model", verify="block", temperature=1.0),
        "dm_greedy": dict(method="draft_model", temperature=0.0),
        "suffix": dict(method="suffix", temperature=0.0),
        "ngram_gpu": dict(method="ngram_gpu", temperature=0.0, prompt_lookup_min=1, prompt_lookup_max=3),
        "synthetic": dict(method="draft_model", verify="synthetic", temperature=1.0, synthetic_rates=[0.9, 0.5, 0.3]),
        "none": dict(method="none", temperature=0.0),
        "typical": dict(method="draft_model", verify="typical", temperature=1.0),
    }
    return {name: dec.generate(PROMPT, num_speculative_tokens=3, max_new_tokens=14, seed=3, **kw)
            for name, kw in runs.items()}


def plain(text: str) -> str:
    return re.sub(r"<[^>]+>", "", text)


def test_every_method_and_rule_gives_a_full_lesson(traces):
    for name, trace in traces.items():
        chapters = lesson_chapters(trace)
        assert chapters[0].kind == "intro" and chapters[-1].kind == "stats", name
        assert all(c.focus in FOCUS_VIEWS for c in chapters), name
        for st in trace.steps:  # every step has a draft, an outcome and a commit chapter, in that order
            kinds = [c.kind for c in chapters if c.step == st.index and c.kind != "intro"]
            assert kinds[0] == "draft" and kinds[-2:] == ["outcome", "commit"], (name, kinds)
            tests = [c for c in chapters if c.step == st.index and c.kind == "test"]
            want = len(st.draft_token_ids) if trace.config["verify"] == "block" else min(st.num_accepted + 1,
                                                                                          len(st.draft_token_ids))
            if trace.config["verify"] == "greedy" and st.num_accepted > 1:  # the accepted positions share a chapter
                want -= st.num_accepted - 1
            assert len(tests) == want, (name, st.index)
        html = chapter_html(chapters, len(chapters) + 5)  # clamped to the last chapter
        assert f"data-index='{len(chapters) - 1}'" in html and "data-focus='sv-stats'" in html


def test_standard_test_and_residual_texts_carry_the_trace_numbers(traces):
    trace = traces["dm_standard"]
    chapters = lesson_chapters(trace)
    rejected = [(st, st.positions[st.num_accepted]) for st in trace.steps if st.num_accepted < len(st.draft_token_ids)]
    assert rejected, "the tiny random models should reject some draft token"
    st, pos = rejected[0]
    test = next(c for c in chapters if c.kind == "test" and c.step == st.index and c.position == pos.index)
    want = (f"u = {fmt_prob(pos.u)} > min(1, p/q) = min(1, {fmt_prob(pos.p)} / {fmt_prob(pos.q)}) = "
            f"{fmt_prob(pos.accept_prob)}, so {quoted(trace, pos.token_id)} is rejected")
    assert want in test.text
    out = next(c for c in chapters if c.kind == "outcome" and c.step == st.index)
    r = dict((int(t), v) for t, v in st.emitted.top).get(st.emitted.token_id)
    y = quoted(trace, st.emitted.token_id)
    assert (f"r({y}) = {fmt_prob(r)}" if r is not None else f"r({y}) outside") in out.text
    assert f"p({y}) = {fmt_prob(st.emitted.p)}" in out.text and f"Z = Σ max(p − q, 0) = {fmt_prob(pos.residual_mass)}" in out.text
    assert out.focus == "residual" and out.position == st.num_accepted + 1
    stats = plain(chapters[-1].text)
    assert "(one run at T = 1.0: another seed gives other numbers)" in stats  # one draw, said where it is read
    assert "one run at T" not in plain(lesson_chapters(traces["dm_greedy"])[-1].text)
    m = trace.metrics
    assert (f"1 + {m['num_accepted_tokens']} / {m['num_drafts']} = {m['num_drafting_step_tokens']} / {m['num_drafts']}"
            f" = {m['mean_acceptance_length']:.2f}") in stats
    assert f"{m['num_accepted_tokens']} / {m['num_draft_tokens']} = {m['draft_acceptance_rate']:.2f}" in stats


def test_greedy_names_the_argmax_and_no_residual(traces):
    checked = 0
    for name in ("ngram_greedy", "dm_greedy"):
        trace = traces[name]
        chapters = lesson_chapters(trace)
        for st in trace.steps:
            if st.num_accepted < len(st.draft_token_ids):
                pos = st.positions[st.num_accepted]
                best = max(pos.p_top, key=lambda tv: tv[1])[0]
                test = next(c for c in chapters if c.kind == "test" and c.step == st.index and c.position == pos.index)
                assert (f"The target's argmax at position {pos.index} is {quoted(trace, int(best))}, not "
                        f"{quoted(trace, pos.token_id)}") in test.text
                out = next(c for c in chapters if c.kind == "outcome" and c.step == st.index)
                assert "argmax" in out.text and "residual distribution" not in out.text
                checked += 1
    assert checked, "the tiny random models should reject some greedy draft"


def test_block_chapters_give_P_h_eta_and_tau(traces):
    trace = traces["dm_block"]
    chapters = lesson_chapters(trace)
    st = trace.steps[0]
    b = st.block
    for i in range(1, len(st.draft_token_ids) + 1):
        c = next(c for c in chapters if c.kind == "test" and c.step == 0 and c.position == i)
        assert f"P_{i} = {fmt_prob(b['P'][i - 1])}" in c.text and f"h_{i} = {fmt_prob(b['h'][i - 1])}" in c.text
        assert f"η_{i} = {fmt_prob(b['eta'][i - 1])}" in c.text
    tau = next(c for c in chapters if c.kind == "block" and c.step == 0)
    tau_said = f"τ = {b['tau']}: the last position i with η_i ≤ h_i, so the first {b['tau']} draft token(s) are"
    assert tau_said + " accepted" in tau.text


def test_block_chapter_compares_token_wise_only_where_token_wise_would_reach(traces):
    """The new-user report: "Token-wise it would be η_4 <= min(1, p/q) = 1" at a position token-wise verification
    never reaches (an earlier η failed its min(1, p/q)). Such a chapter now names the position token-wise stops at."""
    import copy

    trace = copy.deepcopy(traces["dm_block"])
    st = next(s for s in trace.steps if s.block and len(s.draft_token_ids) >= 2)
    st.block["eta"][0] = 0.9
    st.positions[0].accept_prob = 0.1  # token-wise: η_1 = 0.9 > 0.1, it stops at position 1
    chapters = [c for c in lesson_chapters(trace) if c.kind == "test" and c.step == st.index]
    second = next(c for c in chapters if c.position == 2)
    assert "would have stopped at position 1" in second.text and "never tested position 2" in second.text
    assert "Token-wise it would be" not in second.text
    first = next(c for c in chapters if c.position == 1)
    assert "Token-wise it would be η_1 > min(1, p/q)" in first.text  # position 1 is always tested token-wise


def test_brief_step_chapter_names_a_block_rescue(traces):
    """A lecturer's report: the brief walk told a later block step as "4 of 4 accepted" and never said that block
    verification kept tokens token-wise verification would have thrown away. Its one chapter now says so (★ in the
    grid); a step where both agree says nothing of it."""
    import copy

    from specviz.viz.lesson import brief_chapter

    trace = copy.deepcopy(traces["dm_block"])
    st = next(s for s in trace.steps if s.block and s.num_accepted >= 1 and s.emitted_committed)
    n = st.num_accepted
    st.block["eta"][0] = 0.5
    st.positions[0].accept_prob = 0.1  # token-wise: η_1 = 0.5 > 0.1, it keeps nothing
    assert f"Block verification kept {n} token(s) here (★ in the grid)" in brief_chapter(trace, st).text
    for i in range(n):  # token-wise keeps what block keeps
        st.positions[i].accept_prob, st.block["eta"][i] = 1.0, 0.5
    assert "Block verification kept" not in brief_chapter(trace, st).text


def test_method_specific_draft_texts(traces):
    ngram = traces["ngram_greedy"]
    st = next(s for s in ngram.steps if s.draft_token_ids)
    c = next(c for c in lesson_chapters(ngram) if c.kind == "draft" and c.step == st.index)
    assert f"n = {st.match['n']}" in c.text and f"context position {st.match['match_position']}" in c.text
    dm = traces["dm_standard"]
    st = dm.steps[0]
    c = next(c for c in lesson_chapters(dm) if c.kind == "draft" and c.step == 0)
    top = st.positions[0].q_top[0]
    assert f"x1 = {quoted(dm, st.positions[0].token_id)} with q = {fmt_prob(st.positions[0].q)}" in c.text
    assert f"{quoted(dm, int(top[0]))} {fmt_prob(top[1])}" in c.text
    suffix = traces["suffix"]
    st = next((s for s in suffix.steps if s.match.get("chosen")), None)
    if st is not None:
        c = next(c for c in lesson_chapters(suffix) if c.kind == "draft" and c.step == st.index)
        assert f"m = {st.match['chosen']['match_length']}" in c.text and "suffix tree" in c.text
    syn = lesson_chapters(traces["synthetic"])
    assert "NOT lossless" in syn[0].text and any("not lossless" in c.text for c in syn if c.kind == "test")
    none = lesson_chapters(traces["none"])
    assert "never drafts" in none[1].text and not any(c.kind == "test" for c in none)


def _hand_trace(method: str) -> Trace:
    pos = [Position(1, 5, 0.5, 0.8, 0.93, 0.625, False, 0.3, [[6, 0.5], [5, 0.5]], [[5, 0.8]], [[6, 1.0]])]
    st = Step(0, method, [5], 0, Emitted(1, 6, "recovered", 0.5, [[6, 1.0]]), pos, [6], match={"kind": method})
    cfg = {"method": method, "verify": "standard", "num_speculative_tokens": 1, "temperature": 1.0}
    t = Trace(cfg, [1, 2], steps=[st], output_token_ids=[6], token_texts={"5": "x", "6": "y"})
    t.metrics = compute_metrics(t.steps, 1)
    return t


def test_unknown_method_falls_back_to_generic_text():
    trace = _hand_trace("eagle3")
    chapters = lesson_chapters(trace)
    draft = next(c for c in chapters if c.kind == "draft")
    assert "The proposer eagle3 drafted 1 token(s): ‘x’ (q(x1) = 0.8)." == draft.text and draft.focus == "grid"
    test = next(c for c in chapters if c.kind == "test")
    assert "u = 0.93 > min(1, p/q) = min(1, 0.5 / 0.8) = 0.625, so ‘x’ is rejected." == test.text
    out = next(c for c in chapters if c.kind == "outcome")
    assert "r(‘y’) = 1" in out.text and "Z = Σ max(p − q, 0) = 0.3" in out.text
    assert "eagle3" in chapters[0].text


def test_chapter_of_step_jumps_to_the_steps_first_chapter(traces):
    trace = traces["dm_standard"]
    chapters = lesson_chapters(trace)
    n = chapter_of_step(chapters, 2)
    assert chapters[n].step == 2 and chapters[n].kind == "draft" and chapters[n - 1].step == 1
    assert chapters[chapter_of_step(chapters, 999)].step == len(trace.steps) - 1
    assert chapters[chapter_of_step(chapters, -4)].step == 0
    assert lesson_chapters(Trace({"method": "ngram"}, [1]))[0].kind == "intro"  # no steps: the intro only


def test_views_a_lecturer_found_unclear(traces):
    """Decision headings per decision, no residual legend at temperature 0, r(x) on hover."""
    from specviz.viz import residual_figure, step_grid_figure, token_stream_html
    from specviz.viz.residual import decision_heading

    greedy, standard = traces["dm_greedy"], traces["dm_standard"]
    stream = html_lib.unescape(token_stream_html(greedy))
    assert "recovered token (from the residual)" not in stream
    assert "recovered token (the target's argmax)" in stream
    names = {d.name for d in step_grid_figure(greedy).data}
    assert "recovered token (from the residual)" not in names
    st = next(s for s in greedy.steps if s.num_accepted < len(s.draft_token_ids))
    fig = residual_figure(greedy, st.index, st.num_accepted + 1)
    assert not any(d.name and d.name.startswith("residual") for d in fig.data)
    assert decision_heading(greedy, st, st.num_accepted + 1).startswith("Why was ") and "rejected" in \
        decision_heading(greedy, st, st.num_accepted + 1)
    if st.num_accepted:
        assert decision_heading(greedy, st, 1).endswith("accepted?")
    full = next((s for s in standard.steps if s.num_accepted == len(s.draft_token_ids) and s.draft_token_ids), None)
    if full is not None:
        assert decision_heading(standard, full, len(full.draft_token_ids) + 1).startswith("Where did the bonus token")
    rec = next(s for s in standard.steps if s.emitted.kind == "recovered")
    html = token_stream_html(standard)
    assert "r(x) = " in html and "recovered token (from the residual)" in html
    r = dict((int(t), v) for t, v in rec.emitted.top).get(rec.emitted.token_id)
    assert f"r(x) = {fmt_prob(r)}" in html


def test_typical_acceptance_is_taught_as_its_own_lossy_rule(traces):
    """verify="typical" (Medusa): the acceptance text gives p(x) against min(eps, delta exp(-H)), says lossy, and
    never quotes the standard test's u <= min(1, p/q) (a fresh user found the standard text there)."""
    from specviz.viz.lesson import test_sentence

    tr = traces["typical"]
    texts = [test_sentence(tr, st, pos) for st in tr.steps for pos in st.positions]
    assert texts
    for t in texts:
        assert "Typical acceptance" in t and "not distribution-preserving" in t and "min(1, p/q)" not in t
        assert "ε = 0.09" in t and "δ = 0.3" in t

    from specviz.viz.lesson import lesson_chapters

    chapters = lesson_chapters(tr)
    assert any("NOT distribution-preserving" in c.text for c in chapters)
    assert not any("residual" in c.title for c in chapters)


def test_a_tree_step_is_taught_as_a_tree():
    """A hand-built EAGLE-2 tree step (tests/test_tree_view.py: 8 nodes, 3 deep, path 0 -> 3, then node 7 tested
    and rejected after its sibling 6): the draft and forward chapters name the tree and highlight the draft-tree
    view; each test of the row is rule A with u against r(x) (not min(1, p/q)) and counts the siblings rejected
    before; the recovered token comes from rule A's residual."""
    from test_tree_view import tree_trace

    tr = tree_trace()
    st = tr.steps[0]
    st.positions.append(Position(3, 17, 0.01, 1.0, 0.7, 0.0102, False, 0.97, [[16, 0.5]], [[17, 1.0]], [[18, 0.5]]))
    tr.metrics = compute_metrics(tr.steps, 3)
    chapters = lesson_chapters(tr)
    by_kind = {}
    for c in chapters:
        by_kind.setdefault(c.kind, []).append(c)
    assert "verified by rule A" in plain(by_kind["intro"][0].text)
    draft, forward = by_kind["draft"][0], by_kind["forward"][0]
    assert "a tree of 8 nodes" in draft.title and draft.focus == "tree" and "3 deep" in plain(draft.text)
    assert "one-hot" in plain(draft.text) and "EAGLE-2's dynamic tree" in plain(draft.text)
    assert "all 8 nodes" in forward.title and forward.focus == "tree" and "ancestors" in plain(forward.text)
    tests = [plain(c.text) for c in by_kind["test"]]
    assert len(tests) == 3 and all(t.startswith("Rule A") and "min(1, p/q)" not in t for t in tests)
    assert f"u = {fmt_prob(0.7)} > r(x) = {fmt_prob(0.0102)}" in tests[2] and "1 sibling(s)" in tests[2]
    assert "1 sibling(s)" in tests[1] and "sibling(s) tested" not in tests[0]  # node 3 after node 2; node 0 first
    assert "residual distribution of rule A" in plain(by_kind["outcome"][0].text)
    assert all(c.focus in FOCUS_VIEWS for c in chapters)
    assert "caps every path" not in plain(draft.text)  # its depth setting 2 drafted 2 levels: not capped
    # an EAGLE-2 tree whose depth setting reaches deeper than k (a lecturer's "4, 6, 32" at k = 6 read "6 deep")
    st.match = {**st.match, "depth": 4, "levels": 2}
    capped = next(c for c in lesson_chapters(tr) if c.kind == "draft")
    assert "depth setting 4 would draft 5 deep" in plain(capped.text)
    assert "k = 3 caps every path at 3 drafts: set k = 5 for the whole tree." in plain(capped.text)


def test_a_brief_lesson_tells_the_first_steps_in_full_then_one_chapter_a_step(traces):
    """The new-user report: an 11-step run is a 91-chapter lesson. lesson_chapters(full_steps=2) keeps the first two
    steps' chapters and gives every later step one chapter that says what was drafted and committed."""
    from specviz.viz.lesson import lesson_chapters

    trace = traces["dm_block"]
    assert len(trace.steps) > 3
    full, brief = lesson_chapters(trace), lesson_chapters(trace, full_steps=2)
    head = [c for c in full if c.kind == "intro" or (c.step is not None and c.step < 2 and c.kind != "stats")]
    assert brief[: len(head)] == head  # the first two steps as in the full lesson
    later = brief[len(head):-1]
    assert [c.step for c in later] == [st.index for st in trace.steps[2:]] and {c.kind for c in later} == {"step"}
    for c, st in zip(later, trace.steps[2:]):
        assert (f"{st.num_accepted} of {st.num_drafted} draft token(s) accepted" if st.num_drafted
                else "nothing drafted, 1 target token") in c.title
        assert f"commits {len(st.committed_token_ids)} token(s)" in c.text
    assert brief[-1].kind == "stats" and len(brief) < len(full)


def test_forward_chapter_compares_one_steps_time_with_forwards_of_its_kind(traces):
    """One step's forward time is a single sample: the chapter gives the range and median of the run's forwards of
    the same kind (chain drafts here; steps without a draft are other forwards), and where they lie more than
    SPREAD times apart says that the machine, not the method, made them differ (warm-up when the slowest is among
    the first steps, else other work), so that 37.8 ms against a median of 137.3 ms does not read as a faster step."""
    import copy
    import statistics

    from specviz.viz.lesson import SPREAD, forward_chapter

    tr = copy.deepcopy(traces["dm_greedy"])
    drafting = [s for s in tr.steps if s.draft_token_ids]
    assert len(drafting) > 3
    for n, s in enumerate(drafting):  # close together: no note
        s.timings_ms["verify"] = 20.0 + n
    text = plain(forward_chapter(tr, drafting[0]).text)
    times = [s.timings_ms["verify"] for s in drafting]
    assert "This forward took 20.0 ms live" in text and "quote the speedup panel's times" in text
    assert (f"; the run's {len(times)} forwards over a chain of drafts took {min(times):.1f}–{max(times):.1f} ms "
            f"(median {statistics.median(times):.1f} ms).") in text
    assert "machine, not" not in text
    drafting[-1].timings_ms["verify"] = SPREAD * 20.0 * 5  # a late step slowed by other work
    text = plain(forward_chapter(tr, drafting[0]).text)
    assert "Times this far apart come from the machine (a one-time cost or other work), not the method" in text
    drafting[-1].timings_ms["verify"], drafting[0].timings_ms["verify"] = 21.0, 400.0  # the first step: warm-up
    text = plain(forward_chapter(tr, drafting[1]).text)
    assert "(warm-up in the first steps)" in text and "400.0 ms" in text


def _greedy_all_accepted(traces) -> Trace:
    """The greedy n-gram run with every step's drafts accepted (the tiny random models seldom accept two in a row),
    an accepted draft token = the target's argmax (p = 1 at T = 0)."""
    import copy

    trace = copy.deepcopy(traces["ngram_greedy"])
    for st in trace.steps:
        st.num_accepted = len(st.draft_token_ids)
        for pos in st.positions:
            pos.accepted, pos.p = True, 1.0
    return trace


def test_a_greedy_steps_accepted_positions_share_one_chapter_unless_every_position(traces):
    """A chapter per accepted greedy position showed the same p = 1 / q = 1 bars again and again (a 22-step lecture
    run: 126-164 chapters). They share one chapter, which highlights the step grid (the residual view has no residual
    to show for greedy); every_position=True gives each its own chapter back."""
    trace = _greedy_all_accepted(traces)
    st = next(s for s in trace.steps if len(s.draft_token_ids) >= 2)
    k = len(st.draft_token_ids)
    folded = [c for c in lesson_chapters(trace) if c.step == st.index and c.kind == "test"]
    assert len(folded) == 1, [c.title for c in folded]
    c = folded[0]
    assert c.focus == "grid" and c.position == k and f"positions 1–{k}" in c.title
    assert "p = 1 at each" in c.text and all(quoted(trace, t) in c.text for t in st.draft_token_ids)
    each = [c for c in lesson_chapters(trace, every_position=True) if c.step == st.index and c.kind == "test"]
    assert [c.position for c in each] == list(range(1, k + 1))
    assert len(lesson_chapters(trace, every_position=True)) > len(lesson_chapters(trace))
    brief = lesson_chapters(trace, full_steps=1)  # the brief form folds the later steps whole, as before
    assert [c.kind for c in brief if c.step == trace.steps[-1].index and c.kind != "intro"] == ["step"]


def test_the_chapter_panel_names_the_view_it_highlights(traces):
    """"highlighted: the residual view" only where a residual is drawn: greedy chapters (and a bonus token's) name the
    p and q view; a standard run's recovered token names the residual view."""
    for name in ("ngram_greedy", "dm_greedy"):
        for n, c in enumerate(lesson_chapters(traces[name])):
            shown = plain(chapter_html(lesson_chapters(traces[name]), n))
            assert "residual view" not in shown, (name, c.title)
            assert c.focus != "residual" or "highlighted: the p and q view" in shown, (name, c.title)
    dm = traces["dm_standard"]
    chapters = lesson_chapters(dm)
    recovered = [n for n, c in enumerate(chapters) if c.kind == "outcome" and "recovered token" in c.title]
    assert recovered and all("highlighted: the residual view" in chapter_html(chapters, n) for n in recovered)


def test_a_greedy_tree_steps_tests_walk_the_tree_in_the_draft_tree_view(decoders):
    """A lecturer's EAGLE-2 tree lesson highlighted the step grid with a chain's words ("positions 1–5") in its test
    chapters. A greedy tree step's tests now highlight the draft-tree view and tell the walk down the tree by depth;
    a stop short of a leaf names the depth where no child matched, and the nodes below stay unchecked."""
    tree = "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"
    tr = decoders["llama"].generate(PROMPT, method="draft_model", num_speculative_tokens=3, max_new_tokens=24,
                                    speculative_token_tree=tree)
    chapters = lesson_chapters(tr)
    trees = [st for st in tr.steps if st.is_tree and st.draft_token_ids]
    assert trees
    for st in trees:
        tests = [c for c in chapters if c.step == st.index and c.kind == "test"]
        outcome = next(c for c in chapters if c.step == st.index and c.kind == "outcome")
        assert tests and all(c.focus == "tree" and "position" not in c.title for c in tests), [c.title for c in tests]
        for c in tests:
            text = plain(c.text)
            assert "depth" in text and "draft token(s) after it" not in text, text
        if st.num_accepted > 1:
            assert "walks the tree from the root" in plain(tests[0].text)
        if st.num_accepted < len(st.draft_token_ids):
            assert outcome.focus == "tree" and f"no child matched at depth {st.num_accepted + 1}" in outcome.title
            assert "The nodes below it are never checked." in plain(tests[-1].text)
    assert any(st.num_accepted < len(st.draft_token_ids) for st in trees)  # the stop case ran


def test_the_forward_chapter_marks_the_p_no_test_reads(traces):
    """A lecturer read "p(x4) = 1, p(x5) = 1" beside a rejection at x3 as "p = 1, not accepted": the forward chapter
    now marks the positions past the first rejection as never tested (block verification tests every one)."""
    from specviz.viz.lesson import forward_chapter

    tr = traces["dm_greedy"]
    st = next(s for s in tr.steps if s.num_accepted + 1 < len(s.draft_token_ids))
    text = plain(forward_chapter(tr, st).text)
    k, tested = len(st.draft_token_ids), st.num_accepted + 1
    assert text.count("(never tested)") == k - tested and f"p(x{tested + 1}) = " in text
    assert f"p(x{tested}) = {fmt_prob(st.positions[tested - 1].p)}," in text or tested == k
    block = traces["dm_block"]
    assert all("never tested" not in plain(forward_chapter(block, s).text) for s in block.steps if s.draft_token_ids)


def test_a_greedy_tree_lesson_names_the_siblings_tested_and_rejected_before_the_path():
    """Trial 6: the lesson said "the nodes beside the path are never tested" while the tree view drew a higher-ranked
    sibling as rejected and a counted it. Children are tested in their order: the hand-built tree's path 0 -> 3 went
    through node 3 after its sibling node 2 (token 12) was tested and rejected; at depth 3 both children (16, 17)
    were rejected. The chapters say so; the last accepted node with children says the walk goes on."""
    from test_tree_view import SPEC, tree_trace

    tr = tree_trace()
    tr.config = {**tr.config, "verify": "greedy", "temperature": 0.0}
    st = tr.steps[0]
    st.positions.append(Position(3, 17, 0.0, 1.0, None, 0.0, False, 1.0, [[18, 1.0]], [[17, 1.0]], [[18, 1.0]]))
    tr.metrics = compute_metrics(tr.steps, 3)
    chapters = [c for c in lesson_chapters(tr, every_position=True) if c.step == 0]
    tests = [plain(c.text) for c in chapters if c.kind == "test"]
    assert len(tests) == 3 and all(c.focus == "tree" for c in chapters if c.kind == "test")
    assert "Tested and rejected before it" not in tests[0] and "walk goes on below it" in tests[0]
    assert "Tested and rejected before it: ‘t12’." in tests[1] and "walk goes on below it" in tests[1]
    assert "no child there is ‘t18’" in tests[2] and "Tested and rejected before it: ‘t16’." in tests[2]
    assert "‘t17’, the last child, is rejected too" in tests[2]
    # trial 8: a single child rejected read "the last child ... too" as if siblings had been drawn
    only = tree_trace(spec=[*SPEC[:6], (2, 16, None, None, "unvisited", -3.0), SPEC[7]])  # node 7 alone under 3
    only.config = tr.config
    only.steps[0].positions.append(st.positions[2])
    text = [plain(c.text) for c in lesson_chapters(only, every_position=True) if c.step == 0 and c.kind == "test"][2]
    assert "the only child there, ‘t17’, is not it and is rejected" in text and "last child" not in text
    folded = [plain(c.text) for c in lesson_chapters(tr) if c.step == 0 and c.kind == "test"][0]
    assert "tests each node's children in their order" in folded and "‘t12’ at depth 2" in folded


def test_a_draft_shortened_by_max_new_tokens_says_so(traces):
    """Trial 6: the last step of a k = 5 run drafted 1 token and the chapter said only "drafts 1 token(s)"."""
    from specviz.viz.lesson import draft_chapter

    tr = traces["dm_greedy"]  # k = 3, 14 new tokens
    short = [s for s in tr.steps if 0 < len(s.draft_token_ids) < 3]
    assert short, [len(s.draft_token_ids) for s in tr.steps]
    st = short[-1]
    left = 14 - sum(len(s.committed_token_ids) for s in tr.steps[: st.index])
    text = plain(draft_chapter(tr, st).text)
    want = f"Only {left} token(s) were left before max new tokens = 14, so the step drafts {left - 1} instead of k = 3"
    assert want in text
    full = next(s for s in tr.steps if len(s.draft_token_ids) == 3)
    assert "were left before max new tokens" not in plain(draft_chapter(tr, full).text)


def test_a_run_still_streaming_is_not_taught_until_it_ends(traces):
    """Lesson pressed during a run: its chapters would change under the lecturer (the trace grows), so the panel
    says the run is still going; once the run has ended (finished, or Stop pressed) it is taught, and so is an
    uploaded trace, whatever its stop reason says."""
    from specviz.ui.lesson import lesson_next, lesson_start, lesson_tick

    trace = Trace.from_dict(traces["dm_greedy"].to_dict())
    trace.stop_reason = ""  # a snapshot streamed mid-run (specviz.ui.run._stream marks the state live)
    state = {"trace": trace.to_dict(), "live": True}
    for out in (lesson_start(state, None), lesson_next(state, None), lesson_tick(state, None)):
        assert f"still going ({len(trace.steps)} steps so far)" in out[0] and out[1]["index"] == -1
    for done in ({**state, "live": False}, {"trace": trace.to_dict()}):  # the run ended; an upload without a reason
        out = lesson_start(done, None)
        assert out[1]["index"] == 0 and "still going" not in out[0]


def test_a_step_left_with_one_token_blames_the_budget_not_the_proposer(traces):
    """A draft model always has a guess: a step that drafts nothing because max_new_tokens leaves room for its own
    token only says so, and does not claim the proposer had nothing to suggest."""
    from specviz.viz.lesson import draft_chapter

    seen = 0
    for trace in traces.values():
        done = 0
        for st in trace.steps:
            left = trace.config["max_new_tokens"] - done
            done += len(st.committed_token_ids)
            if st.draft_token_ids or left != 1 or trace.config["method"] == "none":
                continue
            text = draft_chapter(trace, st).text
            assert "Only 1 token was left before max new tokens" in text and "nothing to suggest" not in text
            seen += 1
    assert seen  # the fixture's runs end on such a step


def test_a_draft_cut_by_the_heads_reach_is_not_blamed_on_the_budget():
    """DFlash at k above block size - 1 drafts B - 1 every step: a step near the end that still drafts B - 1 is a
    full draft, not one that max_new_tokens shortened."""
    from specviz import SpecDecoder
    from specviz.viz.lesson import draft_chapter

    dec = SpecDecoder.from_pretrained(device="cpu", dtype="float32")  # the bundled target with its DFlash head
    B = dec.heads["dflash"].config.block_size
    for max_new in range(B, 4 * B):  # a run with a step that began with exactly B tokens left and drafted B - 1
        trace = dec.generate(PROMPT, method="dflash", num_speculative_tokens=B + 1, max_new_tokens=max_new)
        done = [sum(len(s.committed_token_ids) for s in trace.steps[:i]) for i in range(len(trace.steps))]
        near = [st for st, d in zip(trace.steps, done) if max_new - d == B and len(st.draft_token_ids) == B - 1]
        if near:
            break
    assert near, "no step began with exactly B tokens left"
    assert "were left before max new tokens" not in draft_chapter(trace, near[0]).text
