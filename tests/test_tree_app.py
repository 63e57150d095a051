"""The draft-tree panel's handlers (specviz/ui/tree.py) on a session state holding a trace: the
panel follows the selected position, a click on a path node (or the step's own token) moves the
position, a click on a node off the path shows its p / q in the residual panel."""

from __future__ import annotations

import gradio as gr

from specviz.trace import Emitted, Position, Step, Trace
from specviz.ui import tree as tree_ui
from specviz.viz import tree as tv


def _pos(i, tok, p, accepted):
    return Position(index=i, token_id=tok, p=p, q=1.0, u=0.5, accept_prob=p, accepted=accepted, residual_mass=1 - p,
                    p_top=[[tok, p]], q_top=[[tok, 1.0]])


def _state():
    """A chain step (3 drafts, 1 accepted): path [0], node 1 rejected, node 2 unvisited."""
    st = Step(index=0, proposer="ngram", draft_token_ids=[10, 13, 16], num_accepted=1,
              emitted=Emitted(position=2, token_id=18, kind="recovered", p=0.4, top=[[18, 0.5]]),
              positions=[_pos(1, 10, 0.9, True), _pos(2, 13, 0.1, False), _pos(3, 16, 0.3, False)],
              committed_token_ids=[10, 18])
    tr = Trace(config={"method": "ngram", "verify": "standard", "num_speculative_tokens": 3, "temperature": 1.0},
               prompt_token_ids=[1, 2, 3], steps=[st], output_token_ids=[10, 18],
               token_texts={str(t): f"t{t}" for t in range(30)})
    return {"trace": tr.to_dict()}


def _outlined(fig):
    return [a.name for a in fig.layout.annotations if a.bordercolor == tv.SELECTED_BORDER]


def test_panel_follows_position():
    fig = tree_ui.tree_panel(_state(), 0, 1)
    assert fig.layout.meta["accepted_path"] == [0] and _outlined(fig) == ["node 0"]
    assert _outlined(tree_ui.tree_panel(_state(), 0, 2)) == [f"node {tv.EMITTED}"]  # the recovered token's slot
    assert tree_ui.tree_panel({}, 0, 1).layout.meta is None  # no trace: the placeholder


def test_click_on_path_node_moves_position():
    out = tree_ui.select_tree_node(_state(), 0, "0,123")
    assert len(out) == 8 and out[0] == gr.skip()  # the step stays
    assert out[1].value == 1  # the position slider moves to the node's slot
    assert _outlined(out[7]) == ["node 0"]
    own = tree_ui.select_tree_node(_state(), 0, f"{tv.EMITTED},5")
    assert own[1].value == 2


def test_chain_nodes_open_their_grid_column():
    """In a chain every node has its position's panel (rejected and unused drafts too)."""
    rejected = tree_ui.select_tree_node(_state(), 0, "1,9")
    unused = tree_ui.select_tree_node(_state(), 0, "2,9")
    assert rejected[1].value == 2 and unused[1].value == 3
    assert _outlined(unused[7]) == ["node 2"]


def test_click_off_path_shows_node_panel(monkeypatch):
    """A tree node off the accepted path: its own p / q panel, the sliders kept. (The hand-built
    trace-v2 tree is handed over directly: the session state's JSON round trip is trace v2's.)"""
    from test_tree_view import tree_trace

    monkeypatch.setattr(tree_ui, "trace_of", lambda state: tree_trace())
    out = tree_ui.select_tree_node({"trace": "x"}, 0, "2,9")  # node 2: rejected, off the path [0, 3]
    caption = next(a.text for a in out[4].layout.annotations if a.name == "caption")
    assert "node 2" in caption and "rejected" in caption
    assert _outlined(out[7]) == ["node 2"]
    assert all(o == gr.skip() for o in (out[0], out[1], out[2], out[3], out[5], out[6]))
    on_path = tree_ui.select_tree_node({"trace": "x"}, 0, "3,9")
    assert on_path[1].value == 2 and _outlined(on_path[7]) == ["node 3"]


def test_unreadable_click_changes_nothing():
    for pick in ("", "x,1", "99,1", None):
        assert all(o == gr.skip() for o in tree_ui.select_tree_node(_state(), 0, pick))


def test_tree_controls_to_settings():
    import pytest

    from specviz.ui.settings import tree_settings

    assert tree_settings("eagle3", "4, 5, 24", 0) == {"eagle_tree_top_k": 4, "eagle_tree_depth": 5,
                                                      "eagle_tree_total_tokens": 24}
    assert tree_settings("eagle", "", 3) == {} and tree_settings("ngram", "4,5,24", 0) == {}
    assert tree_settings("suffix", "", 3) == {"suffix_tree_branches": 3}
    assert tree_settings("draft_model", "1,2,3", 2) == {}
    with pytest.raises(ValueError, match="three integers"):
        tree_settings("eagle3", "4, 5", 0)
    with pytest.raises(ValueError, match="tree branches"):
        tree_settings("ngram", "", 100)


def test_a_tree_deeper_than_k_is_noted_with_the_k_that_fits_it():
    from specviz.ui.settings import tree_depth_note

    note = tree_depth_note("eagle3", 5, "4, 6, 32")
    assert "reaches depth 7, but k = 5 caps it" in note and "set k = 7" in note
    assert tree_depth_note("eagle3", 7, "4,6,32") == "" and tree_depth_note("eagle", 12, "4, 6, 32") == ""
    assert tree_depth_note("ngram", 2, "4,6,32") == "" and tree_depth_note("eagle3", 5, "") == ""
    assert tree_depth_note("eagle3", 5, "4, 6") == ""  # bad text: the run reports it, not the note
    assert tree_depth_note("eagle3", 5, "4, 6, 32", "[(0,), (0, 0)]") == ""  # the static tree replaces it


def test_a_tree_control_the_method_does_not_read_is_noted():
    from specviz.ui.settings import ignored_tree_note

    tree = "[(0,), (1,), (0, 0)]"
    assert ignored_tree_note("draft_model", "4, x", 0) == "draft_model ignores the EAGLE-2 tree (eagle, eagle3 only): it ran a chain"
    assert ignored_tree_note("draft_model", "4,6,32", 0, tree) == "draft_model ignores the EAGLE-2 tree (eagle, eagle3 only)"
    assert ignored_tree_note("eagle3", "4,6,32", 0, tree) == "eagle3 ignores the EAGLE-2 tree (the static tree replaces it)"
    assert "ngram ignores the static tree (draft_model, eagle, eagle3, medusa only)" in ignored_tree_note("ngram", "", 2, tree)
    assert "ignores the tree branches per node (ngram, suffix only): it ran a chain" in ignored_tree_note("eagle", "", 3)
    assert ignored_tree_note("eagle3", "4,6,32", 0) == ignored_tree_note("suffix", "", 2) == ignored_tree_note("none", "", 0) == ""


def test_static_tree_control():
    from specviz.ui.settings import tree_settings

    tree = "[(0,), (1,), (0, 0)]"
    assert tree_settings("eagle3", "4, 5, 24", 0, tree) == {"speculative_token_tree": tree}
    assert tree_settings("draft_model", "", 0, f" {tree} ") == {"speculative_token_tree": tree}
    assert tree_settings("ngram", "", 2, tree) == {"ngram_tree_branches": 2}  # ngram takes no static tree


from test_app import app_url  # noqa: E402,F401  (the tiny-model app fixture)
from test_lesson_app import browser, pages  # noqa: E402,F401  (headless Chromium, pages closed after a test)
from helpers import fill_until_kept, progress  # noqa: E402


# ---- the browser: a static tree of the draft model (tiny models), at 1024 px and in the presentation layout ----
STATIC_TREE = "[(0,), (1,), (0, 0), (0, 1), (1, 0)]"
TREE_TEXT_JS = """() => { const gd = document.querySelector('#sv-tree .js-plotly-plot');
    const rule = (gd.layout.annotations || []).find((a) => a.name === 'rule');
    const marks = gd.data.find((d) => d.name === 'nodes');
    return {rule: rule ? rule.text : null, hovers: marks ? marks.hovertext : [],
            summary: document.querySelector('#sv-summary').innerText}; }"""


def _run_static_tree(page, tree: str = STATIC_TREE, k: int = 3, max_new: int = 4) -> None:
    from test_lesson_app import PROMPT

    page.locator("#sv-prompt textarea").fill(PROMPT)
    page.get_by_label("draft_model", exact=True).check()
    for label, value in (("temperature", 1.0), ("number input for max new tokens", max_new),
                         ("number input for num_speculative_tokens (k)", k)):
        box = page.get_by_label(label, exact=True)
        box.fill(str(value))
        box.press("Enter")
    page.get_by_text("draft tree (instead of a chain)").click()
    # Tab commits the text (on a loaded machine a click can beat it)
    fill_until_kept(page.locator("#sv-static-tree textarea"), tree, commit="Tab")
    page.click("#sv-run")
    page.wait_for_function("document.querySelector('#sv-progress').innerText.includes('done ·')", timeout=120_000)
    # the run drafted trees (a chain, the symptom of a lost field, also draws in the tree view)
    try:
        page.wait_for_function("document.querySelector('#sv-summary').innerText.includes('per-depth acceptance')",
                               timeout=20_000)
    except Exception:  # noqa: BLE001 - say what went wrong, not only that a wait timed out
        raise AssertionError(("the static tree did not reach the run",
                              page.locator("#sv-summary").inner_text()[:300])) from None
    # the tree view redraws after the run's last output (the selected step's change event): wait for the figure of
    # the step the step slider selects, not whichever figure an earlier update drew (a race seen on a busy CPU)
    page.wait_for_function("() => { const gd = document.querySelector('#sv-tree .js-plotly-plot');"
                           " const box = document.querySelector('#sv-step input[type=number]');"
                           " return gd && box && (gd.layout.annotations || []).some((a) => a.name === 'rule')"
                           " && gd.layout.title && String(gd.layout.title.text).includes(`step ${box.value}:`); }",
                           timeout=20_000)


def test_tree_view_names_q_and_confidence_and_fits(browser, app_url, pages):
    """A draft_model static tree at T = 1 (rule A): the tree's rule line, both named numbers in a node's hover,
    the per-depth acceptance in the run summary; every text of the tree figure inside it at 1024 px and in the
    presentation layout (1.45x figure text) at 1280 px. Screenshots: screenshots-tmp/tree-*.png."""
    from test_lesson_app import FIT_JS, SHOTS, _open

    SHOTS.mkdir(parents=True, exist_ok=True)
    for url, width, height, name in ((app_url, 1024, 768, "tree-1024"), (app_url + "?present=1", 1280, 720,
                                                                         "tree-present-1280")):
        page, errors = _open(browser, url, width, height, pages)
        _run_static_tree(page)
        page.wait_for_timeout(800)
        seen = page.evaluate(TREE_TEXT_JS)
        assert seen["rule"] == tv.RULE_CAPTION["topk"], seen["rule"]
        nodes = [h for h in seen["hovers"] if h.startswith("node ")]
        assert nodes and all("q (as verified) = 1, one-hot: deterministic top-k child" in h for h in nodes)
        assert all("draft confidence at its parent (draft model softmax) = " in h for h in nodes), nodes
        assert "per-depth acceptance" in seen["summary"] and "per node drafted" in seen["summary"]
        page.locator("#sv-tree").scroll_into_view_if_needed()
        page.wait_for_timeout(400)
        page.locator("#sv-tree").screenshot(path=str(SHOTS / f"{name}.png"))
        cut = page.evaluate(FIT_JS, "#sv-tree")
        assert not cut, cut
        assert not errors, errors
        page.close()


# 12 children of the root and a chain of 6 under the first: 12-13 rows (as many as the EAGLE-2 tree 4, 5, 24 of the
# bundled eagle3 example has at most: 4-12 rows over its 16 steps), 6 deep, far taller than 1280x720 less the chapter
# panel
TALL_TREE = "[" + ", ".join(f"({r},)" for r in range(12)) + ", " + ", ".join(f"({', '.join(['0'] * d)})"
                                                                           for d in range(2, 7)) + "]"


# the node boxes whose bounding box meets the legend's (a legend drawn over the tree's lowest rows)
NODES_ON_LEGEND_JS = """() => { const gd = document.querySelector('#sv-tree .js-plotly-plot');
    const leg = gd.querySelector('.legend').getBoundingClientRect(), names = gd.layout.annotations.map((a) => a.name);
    return [...gd.querySelectorAll('.annotation[data-index]')].filter((g) => String(names[+g.dataset.index])
      .startsWith('node ')).map((g) => g.getBoundingClientRect()).filter((r) => r.bottom > leg.top && r.top < leg.bottom
      && r.right > leg.left && r.left < leg.right).length; }"""


def test_a_tall_tree_fits_below_the_chapter_panel_in_the_presentation_layout(browser, app_url, pages):
    """?present=1 at 1280x720, a lesson's chapter about a tree step: every text of the tree figure (node boxes,
    title, definitions, rule line, legend) is inside the viewport and not under the pinned chapter panel; then the
    same tree at 1024x768 without the presentation layout keeps its two-line boxes and fits its figure.
    Screenshots: screenshots-tmp/tree-tall-*.png."""
    from test_lesson_app import FIT_JS, SHOTS, _open, under_panel

    SHOTS.mkdir(parents=True, exist_ok=True)
    page, errors = _open(browser, app_url + "?present=1", 1280, 720, pages)
    _run_static_tree(page, TALL_TREE, k=6)
    page.click("#sv-lesson-start")
    page.wait_for_selector(".sv-chapter")
    for n in range(1, 6):
        if page.evaluate("document.querySelector('.sv-chapter').dataset.focus") == "sv-tree":
            break
        page.locator("body").press("ArrowRight")
        page.wait_for_function(f"document.querySelector('.sv-chapter').dataset.index === '{n}'", timeout=20_000)
    assert page.evaluate("document.querySelector('.sv-chapter').dataset.focus") == "sv-tree"
    rows = page.evaluate("document.querySelector('#sv-tree .js-plotly-plot').layout.meta.tree_rows")
    assert rows >= 12, rows  # the tall tree: 12 rows of 40 px at 1.45x text do not fit under the panel
    away = under_panel(page, "#sv-tree")
    page.screenshot(path=str(SHOTS / "tree-tall-present-1280.png"))
    assert not away, away
    assert not page.evaluate(NODES_ON_LEGEND_JS), "node boxes drawn over the legend"
    texts = page.evaluate("[...document.querySelectorAll('#sv-tree .annotation-text')].map((t) => t.textContent)")
    assert tv.RULE_CAPTION["topk"] in texts and any(t.startswith("p = the target's probability") for t in texts)
    assert not errors, errors
    page.close()
    page, errors = _open(browser, app_url, 1024, 768, pages)
    _run_static_tree(page, TALL_TREE, k=6)
    page.locator("#sv-tree").scroll_into_view_if_needed()
    page.wait_for_timeout(400)
    page.locator("#sv-tree").screenshot(path=str(SHOTS / "tree-tall-1024.png"))
    assert not page.evaluate(FIT_JS, "#sv-tree")
    layout = page.evaluate("document.querySelector('#sv-tree .js-plotly-plot').layout")
    two_lines = [a["name"] for a in layout["annotations"] if a.get("name", "").startswith("node ") and "<br>" in a["text"]]
    # every drafted node (and the step's own token) keeps its p / c line outside the presentation layout
    assert len(two_lines) == layout["meta"]["tree_nodes"] + 1, (two_lines, layout["meta"])
    assert not errors, errors


# 31 nodes, 7 deep: a chain of rank-0 children, three siblings at every depth and a child under the root's three
# (the size of the EAGLE-2 tree 4, 6, 32 a lecturer found unreadable: up to 20 rows)
BIG_TREE = "[" + ", ".join(
    [str(tuple([0] * d)) for d in range(1, 8)] + [str(tuple([0] * (d - 1) + [r])) for d in range(1, 8) for r in (1, 2, 3)]
    + [str((r, 0)) for r in (1, 2, 3)]) + "]"
# the node boxes drawn: their font size (px) and whether they keep their numbers' line
BOX_SIZES_JS = """() => { const gd = document.querySelector('#sv-tree .js-plotly-plot');
    return gd.layout.annotations.filter((a) => String(a.name).startsWith('node ') && a.visible !== false)
      .map((a) => [a.font.size, a.name === 'node -1' || String(a.text).includes('<br>')]); }"""  # the root: one line
SHORT_NOTES_JS = """() => document.querySelector('#sv-tree .js-plotly-plot').layout.annotations
    .filter((a) => String(a.name).startsWith('more ') && a.visible).length"""


def test_a_31_node_tree_is_whole_and_readable_in_every_tree_chapter(browser, app_url, pages):
    """?present=1 at 1280x720, a 31-node tree 7 deep: at each chapter that highlights the tree (the draft and the
    forward), the whole figure is below the chapter panel and inside the viewport, in the short arrangement (the
    path, two siblings a depth, "+N more"), every drawn box at least PRESENT_MIN_LABEL_PX with its p / c line.
    Screenshots: screenshots-tmp/tree-big-present-*.png."""
    from test_lesson_app import SHOTS, _open, under_panel

    from specviz.ui.lesson_script import PRESENT_MIN_LABEL_PX

    assert BIG_TREE.count("(") == 31
    SHOTS.mkdir(parents=True, exist_ok=True)
    page, errors = _open(browser, app_url + "?present=1", 1280, 720, pages)
    _run_static_tree(page, BIG_TREE, k=7, max_new=12)  # a request's last steps draft no deeper than its tokens left
    page.click("#sv-lesson-start")
    page.wait_for_selector(".sv-chapter")
    seen = []
    for n in range(1, 5):
        page.locator("body").press("ArrowRight")
        page.wait_for_function(f"document.querySelector('.sv-chapter').dataset.index === '{n}'", timeout=20_000)
        if page.evaluate("document.querySelector('.sv-chapter').dataset.focus") != "sv-tree":
            continue
        away = under_panel(page, "#sv-tree", frame=True)
        page.screenshot(path=str(SHOTS / f"tree-big-present-{n}.png"))
        boxes = page.evaluate(BOX_SIZES_JS)
        seen.append(n)
        assert page.evaluate("document.querySelector('#sv-tree .js-plotly-plot').layout.meta.tree_nodes") == 31
        assert not away, (n, away)
        assert boxes and all(size >= PRESENT_MIN_LABEL_PX and two for size, two in boxes), (n, boxes)
        assert page.evaluate(SHORT_NOTES_JS) > 0, n
    assert len(seen) == 2, seen  # the draft and the forward chapters
    assert not errors, errors


# a figure's texts reaching past its Gradio block (which clips them: the time panel's "2405 ms" read "2405 m")
IN_BLOCK_JS = """(sel) => { const box = document.querySelector(sel).getBoundingClientRect();
    return [...document.querySelectorAll(sel + ' .main-svg text')].filter((t) => t.textContent.trim())
      .map((t) => [t.textContent, t.getBoundingClientRect()]).filter(([, r]) => r.width && (r.right > box.right - 2
      || r.left < box.left + 2)).map(([s, r]) => `${s} [${Math.round(r.left)}..${Math.round(r.right)}]`); }"""


def test_a_tree_runs_statistics_chapter_fits_below_the_chapter_panel(browser, app_url, pages):
    """?present=1 at 1280x720, the lesson's statistics chapter of a tree run (its rate set has a fifth rate, so the
    chapter panel is taller than a chain's): the statistics figure is below the panel and inside the viewport, in
    one row of four panels (PRESENT_FIT strip), no text over another, and no chain theory curve (a lecturer saw the
    figure run 360 px off the screen, axis titles over panel titles). Screenshot: lesson-present-tree-stats.png."""
    from layout_checks import OVERLAPS_JS
    from test_lesson_app import FIT_JS, SHOTS, _open, under_panel

    from specviz.viz.stats import PRESENT_FIT

    SHOTS.mkdir(parents=True, exist_ok=True)
    page, errors = _open(browser, app_url + "?present=1", 1280, 720, pages)
    page.wait_for_function("document.querySelector('#sv-lesson-brief input').checked", timeout=20_000)
    _run_static_tree(page, BIG_TREE, k=7, max_new=6)
    page.click("#sv-lesson-start")
    page.wait_for_selector(".sv-chapter")
    count = int(page.evaluate("document.querySelector('.sv-chapter').dataset.count"))
    for n in range(1, count):
        page.locator("body").press("ArrowRight")
        page.wait_for_function(f"document.querySelector('.sv-chapter').dataset.index === '{n}'", timeout=20_000)
    assert page.evaluate("document.querySelector('.sv-chapter').dataset.focus") == "sv-stats"
    text = page.locator(".sv-chapter").inner_text()
    assert "per-depth acceptance" in text, (text, progress(page))  # the tree's longer rate set
    away = under_panel(page, "#sv-stats", frame=True)
    page.screenshot(path=str(SHOTS / "lesson-present-tree-stats.png"))
    assert not away, away
    layout = page.evaluate("document.querySelector('#sv-stats .js-plotly-plot').layout")
    assert layout["xaxis4"]["domain"] == PRESENT_FIT["strip"]["columns"][3], layout["xaxis4"]["domain"]
    assert not page.evaluate(OVERLAPS_JS, "#sv-stats")
    assert not page.evaluate(FIT_JS, "#sv-stats")
    assert not page.evaluate(IN_BLOCK_JS, "#sv-stats")
    names = page.evaluate("document.querySelector('#sv-stats .js-plotly-plot').data.map((t) => t.name || '')")
    assert not any(n.startswith("theory") for n in names), names
    assert not errors, errors
