"""Headless Chromium, the presentation layout at 1280x720 (tiny models): a block-verification lesson's chapters
about the block test (P_i, h_i, η_i) and τ show the residual figure's lowest rows, where those numbers are drawn;
the figure is taller than the room below the pinned chapter panel, and its top-aligned placement left them below
the fold. Screenshots go to ``screenshots-tmp/`` (git-ignored)."""

from __future__ import annotations

import pytest
from helpers import SHOTS

pytest.importorskip("gradio_client")
from test_app import app_url  # noqa: E402,F401  (the tiny-model app fixture)
from test_lesson_app import _open, _run, browser, pages  # noqa: E402,F401  (fixtures and the page helpers)

# the residual figure's texts that carry the block test (η_i's marker label, the P_i / h_i / η_i row's ticks and
# labels) outside the viewport below the pinned chapter panel
BLOCK_TEXT_AWAY_JS = """() => {
  const panel = document.getElementById('sv-lesson'), gd = document.querySelector('#sv-residual .js-plotly-plot');
  const top = panel.getBoundingClientRect().bottom, out = [];
  const texts = [...gd.querySelectorAll('.main-svg text, .main-svg .annotation-text')]
    .filter((t) => /η|h_|P_/.test(t.textContent) && t.getBoundingClientRect().width > 0);
  if (!texts.length) return ['no block-test text in the residual figure'];
  for (const t of texts) {
    const r = t.getBoundingClientRect();
    if (r.top < top - 1 || r.bottom > innerHeight + 1)
      out.push(`${t.textContent.slice(0, 30)} [${Math.round(r.top)}..${Math.round(r.bottom)} in ` +
               `${Math.round(top)}..${innerHeight}]`);
  }
  return out;
}"""


def test_block_chapters_show_the_block_rows_at_1280x720(browser, app_url, pages):
    page, errors = _open(browser, app_url + "?present=1", pages=pages)
    page.wait_for_function("document.querySelector('#sv-lesson-brief input').checked", timeout=20_000)
    _run(page, "draft_model", "block", 1.0, max_new=2)
    page.click("#sv-lesson-start")
    page.wait_for_selector(".sv-chapter")
    count, checked, away = int(page.locator(".sv-chapter").get_attribute("data-count")), 0, []
    for n in range(1, count):
        page.locator("body").press("ArrowRight")
        page.wait_for_function(f"document.querySelector('.sv-chapter').dataset.index === '{n}'", timeout=20_000)
        chapter = page.evaluate("(() => { const c = document.querySelector('.sv-chapter'); "
                                "return {anchor: c.dataset.anchor, text: c.innerText}; })()")
        if "Block test at position" not in chapter["text"] and "the last position i with η_i" not in chapter["text"]:
            continue
        assert chapter["anchor"] == "bottom", chapter
        checked += 1
        try:  # the script places the view 250, 900, 1800 and 3000 ms after a chapter is shown
            page.wait_for_function(f"() => ({BLOCK_TEXT_AWAY_JS})().length === 0", timeout=4_000)
        except Exception:  # noqa: BLE001  (the assertion below reports where the texts are)
            pass
        found = page.evaluate(BLOCK_TEXT_AWAY_JS)
        if found:
            page.screenshot(path=str(SHOTS / f"lesson-block-present-{n}.png"))
            away.append((n, found))
    assert checked >= 2, f"{checked} block-test chapter(s) in {count}"
    assert away == [], away
    assert not errors, errors
