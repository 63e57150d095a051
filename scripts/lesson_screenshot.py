"""Retake the README's lesson screenshot: the presentation layout at 1280x720 on the bundled demo
models, a lesson on the first example with verify=standard (draft_model, T = 0.8), at the chapter
about the first recovered token and its residual. Needs Debian's /usr/bin/chromium; run from the
repo root:

    .venv/bin/python scripts/lesson_screenshot.py [EXAMPLE_INDEX]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from playwright.sync_api import sync_playwright  # noqa: E402

from specviz.ui import build_app, launch_options  # noqa: E402

OUT = ROOT / "assets" / "screenshots" / "lesson_present.png"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def main() -> None:
    examples = json.loads((ROOT / "assets/examples/prompts.json").read_text())["examples"]
    pick = int(sys.argv[1]) if len(sys.argv) > 1 else next(
        i for i, e in enumerate(examples) if e["settings"].get("verify") == "standard")
    demo = build_app(present=True)
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=7878, **launch_options())
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(profile, executable_path="/usr/bin/chromium", headless=True,
                                                   args=ARGS, viewport={"width": 1280, "height": 720})
        page = ctx.new_page()
        page.goto(url)
        page.wait_for_selector("#sv-run")
        page.get_by_label("Example prompts").click()
        page.get_by_role("option").nth(pick).click()
        page.wait_for_timeout(1500)
        page.click("#sv-run")
        page.wait_for_function("() => document.querySelector('#sv-progress').innerText.includes('done ·')",
                               timeout=300_000)
        page.click("#sv-lesson-start")
        page.wait_for_selector(".sv-chapter")
        for _ in range(60):  # to the first recovered token's chapter
            if "recovered token" in page.locator(".sv-chapter-title").inner_text():
                break
            index = page.locator(".sv-chapter").get_attribute("data-index")
            page.locator("body").press("ArrowRight")
            page.wait_for_function(f"() => document.querySelector('.sv-chapter').dataset.index !== '{index}'")
        page.wait_for_timeout(2000)
        page.screenshot(path=str(OUT))
        ctx.close()
    demo.close()
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
