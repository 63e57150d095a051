"""Lesson mode in the real app (tiny models, one launch shared by every test): the lesson_* api
names through gradio_client, and headless Chromium walking a lesson end to end for a greedy
n-gram run, a block run and (in the presentation layout at 1280x720, its large figure text inside each
figure) a standard draft_model run, keyboard only, and every figure text
inside its figure at 1024 px (n-gram, ngram_gpu, draft_model standard, block). Budget: 90 s for the file
on the 2-core CPU (each chapter is a server round trip and a redraw, about 1 s there). Screenshots go to
``screenshots-tmp/`` (git-ignored)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import CHROMIUM, SHOTS, chromium, fill_until_kept, open_page, set_box
from layout_checks import CLIPPED_JS, OVERLAPS_JS

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402
from test_app import app_url, run_args  # noqa: E402,F401  (app_url: the tiny-model app fixture)

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n"
# lesson outputs: chapter html, step slider, position slider, stream, grid, residual, match, trie
TEXT, STEP, POSITION = 0, 1, 2


def test_lesson_api_names_and_events(app_url):
    client = Client(app_url, verbose=False)
    names = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    for name in ("lesson_start", "lesson_next", "lesson_back", "lesson_goto", "lesson_play", "lesson_tick"):
        assert f"/{name}" in names, name
    before = client.predict(api_name="/lesson_start")
    assert "no run to explain yet" in before[TEXT]
    client.predict(*run_args(method="draft_model", verify="standard", temperature=1.0, max_new=10, compare=False),
                   api_name="/run")
    first = client.predict(api_name="/lesson_start")
    assert "data-index='0'" in first[TEXT] and "sv-chapter" in first[TEXT]
    second = client.predict(api_name="/lesson_next")
    assert "data-index='1'" in second[TEXT] and "Step 0: the proposer drafts" in second[TEXT]
    assert second[STEP]["value"] == 0 if isinstance(second[STEP], dict) else second[STEP] == 0
    back = client.predict(api_name="/lesson_back")
    assert "data-index='0'" in back[TEXT]
    jump = client.predict(2, api_name="/lesson_goto")
    assert "data-step='2'" in jump[TEXT] and "Step 2: the proposer drafts" in jump[TEXT]
    assert (jump[STEP]["value"] if isinstance(jump[STEP], dict) else jump[STEP]) == 2
    tick = client.predict(api_name="/lesson_tick")
    assert "data-step='2'" in tick[TEXT] and "one target forward" in tick[TEXT]
    below = client.predict(-1, api_name="/lesson_goto")  # out of range: clamped to the first step, no error
    assert "data-step='0'" in below[TEXT] and "Error" not in below[TEXT]


def test_the_brief_box_shortens_the_lesson_where_it_is(app_url):
    """The "brief" box (lesson_brief): a lesson being shown goes on in the short form at the step it was on (it
    once restarted at chapter 1: a new user on chapter 15 of 150 landed on 1 of 33), where steps after the first
    two are one chapter each; the setting stays for the next Lesson, and unticking gives the full lesson back."""
    import re

    client = Client(app_url, verbose=False)
    client.predict(*run_args(method="draft_model", verify="standard", temperature=1.0, max_new=16, compare=False),
                   api_name="/run")
    count = lambda out: int(re.search(r"data-count='(\d+)'", out[TEXT]).group(1))  # noqa: E731
    full = count(client.predict(api_name="/lesson_start"))
    brief = client.predict(True, api_name="/lesson_brief")
    assert "data-index='0'" in brief[TEXT] and count(brief) < full  # on the introduction: stays on it
    client.predict(False, api_name="/lesson_brief")
    on_step = client.predict(4, api_name="/lesson_goto")
    assert "data-step='4'" in on_step[TEXT]
    moved = client.predict(True, api_name="/lesson_brief")
    assert "data-step='4'" in moved[TEXT] and count(moved) < full, moved[TEXT][:200]
    jump = client.predict(3, api_name="/lesson_goto")
    assert "data-step='3'" in jump[TEXT] and "draft token(s) accepted" in jump[TEXT]  # one chapter for step 3
    again = client.predict(api_name="/lesson_start")
    assert count(again) == count(brief)
    assert count(client.predict(False, api_name="/lesson_brief")) == full


def test_the_presentation_layout_starts_brief():
    """app.py --present: the "brief" box ticked and the lesson state brief from the start (a lecture's lesson on a
    22-step run was 126-164 chapters long); the normal layout starts in full."""
    import gradio as gr

    from specviz.ui.lesson import lesson_panel
    from specviz.viz.lesson import BRIEF_FULL_STEPS

    with gr.Blocks():
        present, normal = lesson_panel(True), lesson_panel(False)
    assert present["brief"].value is True and present["state"].value["full_steps"] == BRIEF_FULL_STEPS
    assert normal["brief"].value is False and normal["state"].value["full_steps"] is None
    assert present["every"].value is False and present["state"].value["every_position"] is False


# ---- the browser -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: install it with `apt-get install -y chromium`")
    pytest.importorskip("playwright.sync_api")
    yield from chromium(tmp_path_factory, 1280, 720)


@pytest.fixture
def pages(browser):
    """Opened pages, closed after the test (an open Gradio page keeps polling and slows the next ones)."""
    opened: list = []
    yield opened
    for page in opened:
        page.close()


def _open(browser, url, width=1280, height=720, pages=None):
    return open_page(browser, url, {"width": width, "height": height}, pages)


def _run(page, method: str, verify: str = "auto", temperature: float = 0.0, max_new: int = 2) -> None:
    """One run of ``method`` with k = 3 (2 tokens: 2 steps of the tiny models, whose drafts are rejected early,
    so that a lesson's walk stays short: the browser tests of this file share a 90 s budget)."""
    page.locator("#sv-prompt textarea").fill(PROMPT)
    page.get_by_label(method, exact=True).check()
    for label, value in (("temperature", temperature), ("number input for max new tokens", max_new),
                         ("number input for num_speculative_tokens (k)", 3)):
        set_box(page, label, value)
    if method.startswith("ngram"):  # prompt lookup on single tokens: the tiny models' text rarely repeats longer runs
        page.get_by_text("n-gram (prompt lookup) settings").click()
        fill_until_kept(page.get_by_label("number input for prompt_lookup_min", exact=True), "1")
    if verify != "auto":
        page.get_by_label("Verification").click()
        page.get_by_role("option", name=verify, exact=True).click()
    page.click("#sv-run")
    page.wait_for_function("document.querySelector('#sv-progress').innerText.includes('done ·')", timeout=120_000)


def _chapter(page) -> dict:
    return page.evaluate("""() => { const c = document.querySelector('.sv-chapter');
        return c ? {...c.dataset, focused: [...document.querySelectorAll('.sv-focus')].map(e => e.id),
                    text: c.innerText} : null; }""")


def _walk(page, name: str, inside=None) -> list[dict]:
    """Lesson, then the right arrow until the last chapter; every chapter highlights its view (and, with
    ``inside``, a check run at every chapter, e.g. that the chapter is on screen)."""
    page.click("#sv-lesson-start")
    page.wait_for_selector(".sv-chapter")
    seen = [_chapter(page)]
    count = int(seen[0]["count"])
    for n in range(1, count):
        page.locator("body").press("ArrowRight")
        page.wait_for_function(f"document.querySelector('.sv-chapter').dataset.index === '{n}'", timeout=20_000)
        seen.append(_chapter(page))
        if inside is not None:
            inside(page)
        if seen[-1]["focus"] == "sv-residual" and seen[-2]["focus"] != "sv-residual":
            page.wait_for_timeout(400)
            page.screenshot(path=str(SHOTS / f"lesson-{name}-residual.png"))
    for c in seen:
        assert c["focused"] == [c["focus"]], c
    page.locator("body").press("ArrowLeft")
    page.wait_for_function(f"document.querySelector('.sv-chapter').dataset.index === '{count - 2}'", timeout=20_000)
    page.wait_for_timeout(400)
    page.screenshot(path=str(SHOTS / f"lesson-{name}-end.png"))
    return seen


def _selected_step(page) -> int:
    return int(page.locator("#sv-step input[type=number]").input_value())


def test_lesson_walks_a_greedy_ngram_run(browser, app_url, pages):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page, errors = _open(browser, app_url, 1024, 768, pages)
    _run(page, "ngram", max_new=3)
    _check_fit(page, "ngram-greedy")
    seen = _walk(page, "ngram-greedy")
    assert seen[-1]["focus"] == "sv-stats" and "mean acceptance length = 1 + accepted" in seen[-1]["text"], seen[-1]
    tests = [c for c in seen if "accepted" in c["text"].split("\n")[1] or "rejected" in c["text"].split("\n")[1]]
    assert any("argmax" in c["text"] for c in tests)
    page.fill("#sv-lesson-goto input", "1")
    page.press("#sv-lesson-goto input", "Enter")
    page.wait_for_function("document.querySelector('.sv-chapter').dataset.step === '1'", timeout=20_000)
    assert _selected_step(page) == 1
    assert not errors, errors
    page.close()
    page, errors = _open(browser, app_url, 1024, 768, pages)  # the ngram_gpu panel's texts fit at 1024 px too
    _run(page, "ngram_gpu")
    _check_fit(page, "ngram-gpu")
    assert not errors, errors


def test_jump_to_step_gives_the_arrow_keys_back(browser, app_url, pages):
    """After "jump to step" + Enter the number box lets go of the focus, so → / ← (sent to whatever
    has the focus, as a user's key presses are) move the lesson again; arrows typed in the prompt stay its own."""
    page, errors = _open(browser, app_url + "?present=1", pages=pages)
    _run(page, "ngram", max_new=3)
    page.click("#sv-lesson-start")
    page.wait_for_selector(".sv-chapter")
    page.fill("#sv-lesson-goto input", "1")
    page.press("#sv-lesson-goto input", "Enter")
    page.wait_for_function("document.querySelector('.sv-chapter').dataset.step === '1'", timeout=20_000)
    index = int(_chapter(page)["index"])
    page.wait_for_function("!document.activeElement || !document.activeElement.closest('#sv-lesson-goto')",
                           timeout=5_000)
    page.keyboard.press("ArrowRight")
    page.wait_for_function(f"document.querySelector('.sv-chapter').dataset.index === '{index + 1}'", timeout=20_000)
    page.keyboard.press("ArrowLeft")
    page.wait_for_function(f"document.querySelector('.sv-chapter').dataset.index === '{index}'", timeout=20_000)
    page.screenshot(path=str(SHOTS / "lesson-present-jump-then-arrows.png"))
    box = page.locator("#sv-prompt textarea")  # typing in the prompt: the arrows move its caret, not the lesson
    box.focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_timeout(600)
    assert int(_chapter(page)["index"]) == index
    assert page.evaluate("document.activeElement === document.querySelector('#sv-prompt textarea')")
    assert not errors, errors


def test_standard_draft_model_figures_fit_at_1024px(browser, app_url, pages):
    """(The lesson on a standard draft_model run is walked in the presentation layout's test below.)"""
    page, errors = _open(browser, app_url, 1024, 768, pages)
    _run(page, "draft_model", "standard", 1.0)
    _check_fit(page, "draft-model-standard")
    assert not errors, errors


def test_lesson_walks_a_block_run(browser, app_url, pages):
    page, errors = _open(browser, app_url, 1024, 768, pages)
    _run(page, "draft_model", "block", 1.0)
    _check_fit(page, "block")
    seen = _walk(page, "block")
    assert any("Block test at position" in c["text"] and "η_" in c["text"] for c in seen)
    assert any("τ = " in c["text"] for c in seen)
    assert not errors, errors


def _inside(page, selector: str) -> bool:
    box = page.locator(selector).first.bounding_box()
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= 720 and box["x"] + box["width"] <= 1280


def _chapter_on_screen(page) -> None:
    assert _inside(page, ".sv-chapter") and _inside(page, "#sv-lesson-next")


CHAPTER_PX = "() => parseFloat(getComputedStyle(document.querySelector('.sv-chapter-text')).fontSize)"


def _nothing_clipped_or_overlapping(page, seen: list) -> None:
    """At every chapter of the presentation layout: the chapter's text whole and in its large type (it was cut off
    under a max-height at 15 px: the body.sv-present rules lost to Gradio's prefixed ones), and in the views the
    chapter shows no text overlapping another text, a marker or a line (tests/layout_checks.py); findings appended
    to ``seen`` with the chapter's index."""
    index = page.evaluate("document.querySelector('.sv-chapter').dataset.index")
    focus = page.evaluate("document.querySelector('.sv-chapter').dataset.focus")
    page.wait_for_timeout(300)
    found = page.evaluate(CLIPPED_JS, ".sv-chapter-text")
    if page.evaluate(CHAPTER_PX) < 22:
        found.append(f"chapter text at {page.evaluate(CHAPTER_PX)} px")
    for view in ("#sv-residual", "#sv-grid") + (("#sv-stats",) if focus == "sv-stats" else ()):
        found += [f"{view}: {f}" for f in page.evaluate(OVERLAPS_JS, view)]
    if found:
        page.screenshot(path=str(SHOTS / f"lesson-present-overlap-{index}.png"))
        seen.append((index, found))


LEGEND_BOX_JS = """() => { const l = document.querySelector('#sv-residual .legend');
    if (!l) return null; const r = l.getBoundingClientRect();
    const gd = document.querySelector('#sv-residual .js-plotly-plot'), bars = gd.querySelector('.draglayer .xy .nsewdrag');
    const cap = [...gd.querySelectorAll('.annotation-text')].find((t) => t.closest('.annotation')
                                                                   && t.textContent.startsWith('Why'));
    return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, vw: innerWidth, vh: innerHeight,
            bars: bars ? bars.getBoundingClientRect().height : 0, figure: gd.getBoundingClientRect().height,
            caption: cap ? cap.textContent : null}; }"""
LEGEND_IN_VIEW = ("() => { const b = (%s)(); return b === null || (b.top >= 0 && b.left >= 0 && b.bottom <= b.vh "
                  "&& b.right <= b.vw); }" % LEGEND_BOX_JS)


def _residual_legend_box(page, seen: list) -> None:
    """At a chapter that highlights the residual view: once the page has scrolled to it (the lesson's script
    places the view below the chapter panel 250, 900, 1800 and 3000 ms after a chapter is shown), its legend's
    bounding box (None: a figure without a legend), appended to ``seen``."""
    if page.evaluate("document.querySelector('.sv-chapter').dataset.focus") != "sv-residual":
        return
    try:
        page.wait_for_function(LEGEND_IN_VIEW, timeout=4_000)
    except Exception:  # noqa: BLE001  (not inside: the assertion below reports where it is)
        pass
    seen.append(page.evaluate(LEGEND_BOX_JS))


def _stats_box(page, seen: list) -> None:
    """At a chapter that highlights the statistics: the figure's box and texts outside the viewport below the
    chapter panel (:func:`under_panel`), appended to ``seen``; a screenshot."""
    if page.evaluate("document.querySelector('.sv-chapter').dataset.focus") == "sv-stats":
        seen.append(under_panel(page, "#sv-stats", frame=True))
        page.screenshot(path=str(SHOTS / "lesson-present-1280x720-stats.png"))


GRID_TICK_PX = "() => parseFloat(getComputedStyle(document.querySelector('#sv-grid .ytick text')).fontSize)"


def test_presentation_layout_shows_run_and_the_chapter_at_1280x720(browser, app_url, pages):
    page, errors = _open(browser, app_url + "?present=1", pages=pages)
    assert page.evaluate("document.body.classList.contains('sv-present')")
    assert page.evaluate("window.scrollY") == 0 and _inside(page, "#sv-run") and _inside(page, "#sv-lesson-start")
    # ?present=1 ticks "brief" (a lecture's default) once the page has settled, through the box's own change event
    page.wait_for_function("document.querySelector('#sv-lesson-brief input').checked", timeout=20_000)
    _run(page, "draft_model", "standard", 1.0, max_new=5)
    # large type inside the figures too (specviz/ui/lesson.py PRESENT_FONT_SCALE), and every text still fits
    page.wait_for_function(f"() => ({GRID_TICK_PX})() >= 16", timeout=20_000)
    _check_fit(page, "present-1280")
    # the lesson on a standard draft_model run, end to end; the page scrolls to each chapter's view, and the
    # chapter and Next stay on screen at every chapter
    legends: list = []
    stats: list = []  # at the statistics chapter: what of the 2 x 2 figure is off screen or under the chapter panel
    clashes: list = []
    seen = _walk(page, "present-1280x720", inside=lambda pg: (_chapter_on_screen(pg), _residual_legend_box(pg, legends),
                                                               _stats_box(pg, stats),
                                                               _nothing_clipped_or_overlapping(pg, clashes)))
    assert stats == [[]], stats
    assert clashes == [], clashes
    # the chapter title in the full Bold face (app.css sv-bold): in gradio's SemiBold subset its first capital
    # came from another font ('A real run' drew a smaller 'A')
    family = page.evaluate("getComputedStyle(document.querySelector('.sv-chapter-title')).fontFamily")
    assert family.replace('"', "").startswith("sv-bold,"), family
    assert page.evaluate("[...document.fonts].some((f) => f.family === 'sv-bold' && f.status === 'loaded')")
    # the server told the lesson briefly (steps after the first two in one chapter each): unticking gives more chapters
    steps = {c["step"] for c in seen if c["step"]}
    if len(steps) > 2:
        page.locator("#sv-lesson-brief input").uncheck()
        page.wait_for_function(f"Number(document.querySelector('.sv-chapter').dataset.count) > {len(seen)}",
                               timeout=20_000)
    # the residual figure, legend included, fits the 1280x720 viewport below the chapter panel
    boxes = [b for b in legends if b is not None]
    assert boxes, legends
    for b in boxes:
        assert b["top"] >= 0 and b["left"] >= 0 and b["bottom"] <= b["vh"] and b["right"] <= b["vw"], b
        # the caption is its question only while the chapter (which says the rest) is pinned above: the bars keep
        # about 40 % of the figure (with the caption's four lines a new user read about 130 of 490 px off a screenshot)
        assert b["caption"] and b["caption"].startswith("Why") and "Z = " not in b["caption"], b
        assert b["bars"] >= 0.35 * b["figure"], b
    assert any("u = " in c["text"] and "min(1, p/q)" in c["text"] for c in seen)
    assert any(c["focus"] == "sv-match" and "its top candidates" in c["text"] for c in seen)
    assert any(c["focus"] == "sv-residual" for c in seen)
    assert not errors, errors


FIT_JS = """(sel) => {
  const out = [];
  for (const plot of document.querySelectorAll(sel + ' .js-plotly-plot')) {
    const frame = plot.getBoundingClientRect();
    for (const t of plot.querySelectorAll('.main-svg text, .main-svg .annotation-text')) {
      const r = t.getBoundingClientRect();
      if (!t.textContent.trim() || r.width === 0) continue;
      if (r.left < frame.left - 1 || r.right > frame.right + 1 || r.top < frame.top - 1 || r.bottom > frame.bottom + 1)
        out.push(`${t.textContent.slice(0, 60)} [${Math.round(r.left)}..${Math.round(r.right)} in ` +
                 `${Math.round(frame.left)}..${Math.round(frame.right)}]`);
    }
  }
  return out;
}"""


# a figure's texts (and, with frame = true, the figure's own box) that are not inside the viewport below the pinned
# chapter panel: what a class does not see without scrolling
UNDER_PANEL_JS = """([sel, frame]) => {
  const panel = document.getElementById('sv-lesson'), gd = document.querySelector(sel + ' .js-plotly-plot');
  if (!gd) return ['no figure'];
  const top = document.body.classList.contains('sv-lesson-on') && panel ? panel.getBoundingClientRect().bottom : 0;
  const out = [], away = (r) => r.top < top - 1 || r.bottom > innerHeight + 1 || r.left < -1 || r.right > innerWidth + 1;
  const where = (r) => `[${Math.round(r.top)}..${Math.round(r.bottom)} in ${Math.round(top)}..${innerHeight}]`;
  if (frame && away(gd.getBoundingClientRect())) out.push(`the figure ${where(gd.getBoundingClientRect())}`);
  for (const t of gd.querySelectorAll('.main-svg text, .main-svg .annotation-text')) {
    const r = t.getBoundingClientRect();
    if (t.textContent.trim() && r.width > 0 && away(r)) out.push(`${t.textContent.slice(0, 40)} ${where(r)}`);
  }
  return out;
}"""


def under_panel(page, selector: str, frame: bool = False) -> list[str]:
    """The texts of ``selector``'s figure outside the viewport or under the chapter panel (after up to 4 s: the
    lesson's script places and fits the view 250, 900, 1800 and 3000 ms after a chapter is shown)."""
    try:
        page.wait_for_function(f"(a) => ({UNDER_PANEL_JS})(a).length === 0", arg=[selector, frame], timeout=4_000)
    except Exception:  # noqa: BLE001  (not inside: the caller's assertion reports what is where)
        pass
    return page.evaluate(UNDER_PANEL_JS, [selector, frame])


def _check_fit(page, name: str) -> None:
    """Every text of the grid, residual, trie and stats figures lies inside its figure."""
    page.wait_for_timeout(800)
    cut = {view: page.evaluate(FIT_JS, f"#{view}") for view in ("sv-grid", "sv-residual", "sv-trie", "sv-stats")}
    page.screenshot(path=str(SHOTS / f"fit-1024-{name}.png"), full_page=True)
    assert not any(cut.values()), cut




def test_the_lesson_chapter_hides_on_the_compare_tab_and_comes_back(browser, app_url, pages):
    """Presentation layout, a lesson on: the pinned chapter (a third of a 720 px screen) is hidden while the Compare
    tab is shown, its top padding with it, and is back, at the same chapter, on the Single run tab."""
    page, errors = _open(browser, app_url + "?present=1", 1280, 720, pages)
    _run(page, "ngram", max_new=3)
    page.click("#sv-lesson-start")
    page.wait_for_selector(".sv-chapter")
    index = page.evaluate("document.querySelector('.sv-chapter').dataset.index")
    assert page.locator("#sv-lesson").first.is_visible()
    page.get_by_role("tab", name="Compare").click()
    page.wait_for_function("document.body.classList.contains('sv-lesson-away')", timeout=10_000)
    assert not page.locator("#sv-lesson").first.is_visible()
    assert page.evaluate("getComputedStyle(document.body).paddingTop") == "0px"
    page.get_by_role("tab", name="Single run").click()
    page.wait_for_function("!document.body.classList.contains('sv-lesson-away')", timeout=10_000)
    assert page.locator("#sv-lesson").first.is_visible()
    assert page.evaluate("document.querySelector('.sv-chapter').dataset.index") == index
    assert not errors, errors
