"""Headless Chromium drives the Compare tab (tiny models): preset, run, table, strips, scrubber, open a
run in the single-run views. Screenshots go to ``screenshots-tmp/`` (git-ignored)."""

from __future__ import annotations

import pytest
from test_browser import CHROMIUM, SHOTS, app_url, browser  # noqa: F401  (fixtures)

pytest.importorskip("playwright.sync_api")
assert CHROMIUM

TIMEOUT_MS = 180_000


def test_compare_tab_runs_and_draws_every_view(browser, app_url):  # noqa: F811
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(app_url)
    page.get_by_role("tab", name="Compare").click()
    page.wait_for_selector("#sv-compare-run")
    page.get_by_label("number input for max new tokens").last.fill("16")
    page.get_by_label("number input for max new tokens").last.press("Enter")
    prompts = page.get_by_label("prompts (bundled set by category, and the examples)")
    for _ in range(3):  # the bundled prompts are longer than the tiny models' context: use our own
        prompts.press("Backspace")
    page.get_by_label("your own prompt (optional)").fill("def add(a, b):\n    return a + b\n\ndef add(")
    page.click("#sv-compare-run")
    page.wait_for_function("() => document.querySelector('#sv-compare-progress').innerText.includes('done ·')",
                           timeout=TIMEOUT_MS)
    progress = page.locator("#sv-compare-progress").inner_text()
    n_methods = len(page.locator("#sv-compare-tab input[type=checkbox]").all()) - 4  # minus the 4 verify boxes
    methods = page.locator("#sv-compare-tab fieldset").first.locator("label").all_inner_texts()
    assert len(methods) == n_methods
    # methods the loaded models cannot run (eagle / eagle3 without a head for the tiny target) are skipped,
    # and the progress line says so; every other offered method has its row
    skipped = progress.split("skipped:", 1)[1] if "skipped:" in progress else ""
    methods = [m for m in methods if f"{m.strip()} (" not in skipped]
    assert methods and ("eagle (" in skipped) == ("eagle" in [m.strip() for m in
                                                              page.locator("#sv-compare-tab fieldset").first.locator("label").all_inner_texts()])
    n_methods = len(methods)
    text = page.locator("#sv-compare-table").inner_text()
    for label in ["none", *(m.strip() for m in methods)]:  # k = 5, greedy, T = 0: every row's, in the legend
        assert label in text.split(), (label, progress, text[:400])
    assert "Every row: k = 5, greedy verification, T = 0." in page.locator("#sv-compare-legend").inner_text()
    # one line per configuration: every row as tall as the shortest; the ✓ drawn by a font whose ✓ is a check
    heights = page.evaluate("() => [...document.querySelectorAll('#sv-compare-table .virtual-row')]"
                            ".map(r => r.getBoundingClientRect().height)")
    assert len(heights) == n_methods + 1 and max(heights) <= min(heights) + 2, heights
    glyph = page.evaluate("() => getComputedStyle(document.querySelector('#sv-compare-table .sv-glyph')).fontFamily")
    assert glyph.startswith('"DejaVu Sans"'), glyph
    page.wait_for_selector("#sv-compare-strips .js-plotly-plot")
    labels = page.locator("#sv-compare-strips .ytick text").all_text_contents()
    assert "none T=0" in labels and len(labels) == n_methods + 1, labels
    assert "output position 1" in page.locator("#sv-compare-scrub").inner_text()
    page.locator("#sv-compare-strips").scroll_into_view_if_needed()  # mouse clicks need it in the viewport
    box = page.locator("#sv-compare-strips .nsewdrag").first.bounding_box()  # click row 2, output position 3
    n_rows, n_cols = n_methods + 1, 16
    page.mouse.click(box["x"] + box["width"] * 2.5 / n_cols, box["y"] + box["height"] * 1.5 / n_rows)
    page.wait_for_function("() => document.querySelector('#sv-compare-scrub').innerText.includes('output position 3')",
                           timeout=30_000)
    # every header carries its formula on hover; the convention switch renames the AL column
    tips = page.evaluate("() => Object.fromEntries([...document.querySelectorAll('#sv-compare-table th')]"
                         ".map(th => [th.innerText.trim(), th.title]))")
    assert "1 + accepted / drafts" in tips.get("AL (vLLM)", ""), tips
    assert all(tips.get(h) for h in ("tok/fwd", "cov.", "accept", "range", "ms d·v·s", "c_i", "lossless")), tips
    assert tips["ms d·v·s"].startswith("ms/step: draft / verify / sample: "), tips
    page.get_by_label("AL (per forward) = tokens / verification steps").check()
    page.wait_for_function("() => [...document.querySelectorAll('#sv-compare-table th')]"
                           ".some(th => th.innerText.trim() === 'AL (per forward)' && th.title.includes('every step'))",
                           timeout=30_000)
    page.get_by_label("AL (vLLM) = 1 + accepted / drafts").check()
    page.wait_for_function("() => [...document.querySelectorAll('#sv-compare-table th')]"
                           ".some(th => th.innerText.trim() === 'AL (vLLM)')", timeout=30_000)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#sv-compare-tab").screenshot(path=str(SHOTS / "compare_tab.png"))
    page.click("#sv-compare-open")
    page.wait_for_function("() => document.querySelector('#sv-progress').innerText.includes('from the comparison')",
                           timeout=30_000)
    assert page.locator("#sv-stream").is_visible()
    assert not errors, errors
    page.close()


def test_presentation_layout_brings_the_results_up_after_a_comparison(browser, app_url):  # noqa: F811
    """?present=1 at 1280x720: the controls fill the screen, so when the comparison is done the results table is
    scrolled to the top (a lecturer would otherwise scroll in front of the class)."""
    page = browser.new_page()
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(app_url + "?present=1")
    page.get_by_role("tab", name="Compare").click()
    page.wait_for_selector("#sv-compare-run")
    page.get_by_label("number input for max new tokens").last.fill("4")
    page.get_by_label("number input for max new tokens").last.press("Enter")
    prompts = page.get_by_label("prompts (bundled set by category, and the examples)")
    for _ in range(3):
        prompts.press("Backspace")
    page.get_by_label("your own prompt (optional)").fill("def add(a, b):\n    return a + b\n\ndef add(")
    assert page.evaluate("document.getElementById('sv-compare-table').getBoundingClientRect().top") > 720
    page.get_by_label("k (comma-separated)").fill("two")  # refused: its message is brought into view instead
    page.click("#sv-compare-run")
    page.wait_for_function("() => document.querySelector('#sv-compare-progress').innerText.includes('k must be')",
                           timeout=TIMEOUT_MS)
    page.wait_for_timeout(500)
    assert page.evaluate("document.getElementById('sv-compare-table').getBoundingClientRect().top") > 720
    assert 0 <= page.evaluate("document.getElementById('sv-compare-progress').getBoundingClientRect().top") < 700
    page.get_by_label("k (comma-separated)").fill("5")
    page.click("#sv-compare-run")
    page.wait_for_function("() => document.querySelector('#sv-compare-progress').innerText.includes('done ·')",
                           timeout=TIMEOUT_MS)
    page.wait_for_function("() => Math.abs(document.getElementById('sv-compare-table').getBoundingClientRect().top)"
                           " < 40", timeout=10_000)
    page.screenshot(path=str(SHOTS / "compare_present_results.png"))
    page.close()
