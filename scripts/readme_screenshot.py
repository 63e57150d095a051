"""Retake the README's overview screenshot: the app on the bundled demo models after the first
example prompt (n-gram, greedy). Needs Debian's /usr/bin/chromium; run from the repo root:

    .venv/bin/python scripts/readme_screenshot.py
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

OUT = ROOT / "assets" / "screenshots" / "app_ngram_overview.png"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def main() -> None:
    example = json.loads((ROOT / "assets/examples/prompts.json").read_text())["examples"][0]
    demo = build_app()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=7879, **launch_options())
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(profile, executable_path="/usr/bin/chromium", headless=True,
                                                   args=ARGS, viewport={"width": 1400, "height": 1000})
        page = ctx.new_page()
        page.goto(url)
        page.wait_for_selector("#sv-run")
        page.locator("#sv-prompt textarea").fill(example["prompt"])
        page.get_by_label(example["settings"]["method"], exact=True).check()
        page.click("#sv-run")
        page.wait_for_function("() => document.querySelector('#sv-progress').innerText.includes('done ·')",
                               timeout=180_000)
        page.evaluate("window.scrollTo(0, 0)")
        page.wait_for_timeout(1500)
        page.screenshot(path=str(OUT))
        ctx.close()
    demo.close()
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
