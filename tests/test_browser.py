"""Headless Chromium drives the real app (tiny models): run, views rendered, step selection,
Stop, replay; screenshots are kept in ``screenshots-tmp/`` (git-ignored; CI can upload it).

Needs /usr/bin/chromium (``apt-get install -y chromium``); never downloads a browser.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import CHROMIUM, SHOTS, chromium, open_page, progress, set_box

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing: install it with `apt-get install -y chromium`", allow_module_level=True)
playwright = pytest.importorskip("playwright.sync_api")

from test_app import app_url, endless_app_url  # noqa: E402,F401  (the tiny-model and the endless apps: fixtures)

PROMPT = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n"
RUN_TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    yield from chromium(tmp_path_factory, 1400, 1000)


def _wait_progress(page, marker: str, timeout=RUN_TIMEOUT_MS) -> None:
    try:
        page.wait_for_function("m => document.querySelector('#sv-progress').innerText.includes(m)", arg=marker,
                               timeout=timeout)
    except playwright.TimeoutError:
        pytest.fail(f"no {marker!r} in the progress line within {timeout / 1000:.0f} s; it shows {progress(page)!r}")


def _caption_starts(text: str, start: str) -> bool:
    """The residual caption ``text`` is about ``start`` (e.g. "step 3"): its first line, or the line
    under the heading (the question asked about the decision, ending in "?")."""
    return text.startswith(start) or f"?{start}," in text or f"?{start}:" in text


def _wait_caption(page, start: str) -> None:
    """Wait until a text of the residual view (its caption) starts with ``start``, or has the line
    "``start``, position ..." under the caption's heading (the question asked about the decision)."""
    page.wait_for_function("s => [...document.querySelectorAll('#sv-residual .annotation-text')]"
                           ".some(a => a.textContent.startsWith(s) || a.textContent.includes('?' + s + ',') || a.textContent.includes('?' + s + ':'))",
                           arg=start, timeout=20_000)


def _run(page, method: str, max_new: int = 24) -> None:
    page.locator("#sv-prompt textarea").fill(PROMPT)
    page.get_by_label(method, exact=True).check()
    set_box(page, "number input for max new tokens", max_new)
    page.click("#sv-run")
    _wait_progress(page, "done ·")


def test_run_renders_every_view_and_keeps_a_screenshot(browser, app_url):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page, errors = open_page(browser, app_url)
    _run(page, "ngram")
    assert page.locator("#sv-stream .sv-tok").count() >= 24
    for view in ("sv-grid", "sv-residual", "sv-trie", "sv-stats"):
        page.wait_for_selector(f"#{view} .js-plotly-plot", timeout=10_000)
        assert page.locator(f"#{view} .js-plotly-plot .main-svg").count() >= 1, view
    assert page.locator("#sv-grid .heatmaplayer").count() == 1
    assert page.locator("#sv-match [data-role]").count() + page.locator("#sv-match .sv-match-empty").count() >= 1
    _wait_progress(page, "speedup measured")  # the comparison, chained after the run, streams in afterwards
    assert "Measured beside this run" in page.locator("#sv-speedup").inner_text()
    page.screenshot(path=str(SHOTS / "browser_run_full.png"), full_page=True)
    page.locator("#sv-stream").screenshot(path=str(SHOTS / "browser_stream.png"))
    assert (SHOTS / "browser_run_full.png").stat().st_size > 10_000
    assert not errors, errors
    page.close()


def test_choosing_a_step_redraws_the_residual_view(browser, app_url):
    page, errors = open_page(browser, app_url)
    _run(page, "draft_model")
    before = page.locator("#sv-residual .annotation-text").all_text_contents()
    page.locator("#sv-step input[type=range]").fill("2")
    _wait_caption(page, "step 2")
    after = page.locator("#sv-residual .annotation-text").all_text_contents()
    assert after != before
    assert page.locator("#sv-stream [data-step='2']").first.evaluate("e => getComputedStyle(e).outlineStyle") == "solid"
    page.locator("#sv-residual").screenshot(path=str(SHOTS / "browser_residual_step2.png"))
    # clicking a token in the stream selects its step and its position in the step
    token = page.locator("#sv-stream [data-step='1']").first
    slot = token.get_attribute("data-slot")
    token.click()
    _wait_caption(page, "step 1")
    assert page.locator("#sv-step input[type=range]").input_value() == "1"
    assert page.locator("#sv-position input[type=range]").input_value() == slot
    # clicking a cell of the step grid selects that step and draft position
    page.wait_for_selector("#sv-grid .js-plotly-plot .heatmaplayer")
    page.locator("#sv-grid").scroll_into_view_if_needed()
    xy = page.evaluate("""() => {
        const gd = document.querySelector('#sv-grid .js-plotly-plot');
        const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, r = gd.getBoundingClientRect();
        return [r.left + xa._offset + xa.l2p(0), r.top + ya._offset + ya.l2p(3)];
    }""")
    page.mouse.click(*xy)
    _wait_caption(page, "step 3")
    assert page.locator("#sv-step input[type=range]").input_value() == "3"
    assert page.locator("#sv-position input[type=range]").input_value() == "1"
    assert not page.locator("#sv-pick").is_visible()
    assert not errors, errors
    page.close()


def test_stop_ends_a_long_run(browser, endless_app_url):
    page, errors = open_page(browser, endless_app_url)
    page.locator("#sv-prompt textarea").fill("for i in range(10):\n")
    page.get_by_label("draft_model", exact=True).check()
    set_box(page, "number input for max new tokens", 400)
    set_box(page, "number input for num_speculative_tokens (k)", 12)  # 13 forwards per token: a long run
    page.click("#sv-run")
    _wait_progress(page, "running ·", timeout=60_000)
    _wait_caption(page, "Running: this view is drawn when the run ends")  # no stale views of an earlier run
    # a DOM click, without Playwright's actionability wait: on a loaded 2-core machine the page redrawing the
    # running views kept that wait from finishing within 30 s (seen twice while other jobs ran)
    page.locator("#sv-stop").dispatch_event("click")
    _wait_progress(page, "stopped ·", timeout=60_000)
    page.wait_for_timeout(1500)  # a cancelled run must not overwrite the stopped view
    assert "stopped ·" in progress(page)
    assert 0 < page.locator("#sv-stream .sv-tok").count()
    assert not errors, errors
    page.close()


def test_empty_prompt_shows_an_error_and_the_app_stays_up(browser, app_url):
    page, errors = open_page(browser, app_url)
    page.locator("#sv-prompt textarea").fill("   ")
    page.click("#sv-run")
    page.get_by_text("the prompt is empty").first.wait_for(timeout=20_000)
    _run(page, "none", max_new=8)
    assert page.locator("#sv-stream .sv-target").count() == 8
    page.close()


def _no_error_badges(page) -> None:
    for view in ("sv-prompt", "sv-stream", "sv-grid", "sv-residual", "sv-match", "sv-trie", "sv-stats", "sv-step",
                 "sv-position"):
        assert "Error" not in page.locator(f"#{view}").inner_text(), view


def test_a_fast_drag_of_the_step_slider_ends_on_the_last_value(browser, app_url):
    page, errors = open_page(browser, app_url)
    _run(page, "draft_model", max_new=32)
    last = int(page.locator("#sv-step input[type=range]").get_attribute("max"))
    assert last >= 3
    # a drag: many input events in a row, faster than the server answers
    page.locator("#sv-step input[type=range]").evaluate(
        """async (el, last) => { for (let v = 1; v <= last; v++) { el.value = v;
                            el.dispatchEvent(new Event('input', {bubbles: true}));
                            await new Promise(r => setTimeout(r, 25)); } }""", last)
    _wait_caption(page, f"step {last}")
    page.wait_for_timeout(1500)  # no older event lands afterwards
    texts = page.locator("#sv-residual .annotation-text").all_text_contents()
    assert any(_caption_starts(t, f"step {last}") for t in texts)
    assert page.locator("#sv-step input[type=range]").input_value() == str(last)
    _no_error_badges(page)
    assert not errors, errors
    page.close()


def test_a_typed_out_of_range_step_is_clamped(browser, app_url):
    page, errors = open_page(browser, app_url)
    _run(page, "draft_model")
    last = int(page.locator("#sv-step input[type=range]").get_attribute("max"))
    set_box(page, "number input for step", 999)
    _wait_caption(page, f"step {last}")
    page.wait_for_function("v => document.querySelector('#sv-step input[type=range]').value === v", arg=str(last),
                           timeout=10_000)
    _no_error_badges(page)
    assert not errors, errors
    page.close()


def test_closing_the_example_dropdown_keeps_the_prompt(browser, app_url):
    page, errors = open_page(browser, app_url)
    before = page.locator("#sv-prompt textarea").input_value()
    assert before
    box = page.get_by_label("Example prompts")
    box.click()
    box.press("Escape")
    page.locator("#sv-progress").click()  # click away
    page.wait_for_timeout(1500)
    assert page.locator("#sv-prompt textarea").input_value() == before
    _no_error_badges(page)
    assert not errors, errors
    page.close()


def test_a_bad_setting_shows_the_message_and_keeps_the_views(browser, app_url):
    page, errors = open_page(browser, app_url)
    _run(page, "ngram", max_new=8)
    tokens = page.locator("#sv-stream .sv-tok").count()
    set_box(page, "number input for max new tokens", 9999)  # the box clamps to 512: more than the tiny context
    page.click("#sv-run")
    _wait_progress(page, "exceeds the model's context", timeout=30_000)
    # the line is the error alone once the event has ended (Gradio's pending timer sits before it until then)
    page.wait_for_function("document.querySelector('#sv-progress').innerText.trim().startsWith('error ·')",
                           timeout=10_000)
    assert progress(page).strip().startswith("error ·")
    page.wait_for_timeout(500)
    assert page.locator("#sv-stream .sv-tok").count() == tokens
    _no_error_badges(page)
    assert not errors, errors
    page.close()
