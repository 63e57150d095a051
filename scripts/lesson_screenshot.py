"""Retake the README's lesson screenshot: the presentation layout at 1280x720 on the bundled demo
models, a lesson on the first example with verify=standard (draft_model, T = 0.8), at the chapter
about the first recovered token and its residual; with --stats, docs/lesson_present_stats.png at the last chapter
(the run's statistics). Needs Debian's /usr/bin/chromium; run from the repo root:

    .venv/bin/python scripts/lesson_screenshot.py [--stats] [EXAMPLE_INDEX]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from app_page import app_page, run_to_done  # noqa: E402

from specviz.ui import build_app  # noqa: E402

OUT = ROOT / "assets" / "screenshots" / "lesson_present.png"
STATS_OUT = ROOT / "docs" / "lesson_present_stats.png"


def main() -> None:
    examples = json.loads((ROOT / "assets/examples/prompts.json").read_text())["examples"]
    args = [a for a in sys.argv[1:] if a != "--stats"]
    stats = "--stats" in sys.argv[1:]
    out = STATS_OUT if stats else OUT
    pick = int(args[0]) if args else next(
        i for i, e in enumerate(examples) if e["settings"].get("verify") == "standard")
    with app_page(build_app(present=True), 7878, 1280, 720) as page:
        page.get_by_label("Example prompts").click()
        page.get_by_role("option").nth(pick).click()
        page.wait_for_timeout(1500)
        run_to_done(page, 300_000)
        page.click("#sv-lesson-start")
        page.wait_for_selector(".sv-chapter")
        for _ in range(200):  # to the first recovered token's chapter (--stats: the last chapter)
            done = (page.locator(".sv-chapter").get_attribute("data-focus") == "sv-stats" if stats else
                    "recovered token" in page.locator(".sv-chapter-title").inner_text())
            if done:
                break
            index = page.locator(".sv-chapter").get_attribute("data-index")
            page.locator("body").press("ArrowRight")
            page.wait_for_function(f"() => document.querySelector('.sv-chapter').dataset.index !== '{index}'")
        page.wait_for_timeout(2000)
        page.screenshot(path=str(out))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
