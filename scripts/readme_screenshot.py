"""Retake the README's overview screenshot: the app on the bundled demo models after the first
example prompt (n-gram, greedy); with ``--compare``, the Compare tab's screenshot instead: the preset
"all methods, greedy, k=5" on the bundled prompts the tab starts with, 64 new tokens (``--preset NAME``: another
preset; ``--shot PATH``: where the png goes; ``--element ID``: only that element, e.g. sv-compare-ksweep). Needs
Debian's /usr/bin/chromium; run from the repo root:

    .venv/bin/python scripts/readme_screenshot.py [--compare [--prompts N] [--preset NAME] [--shot PATH] [--element ID]]
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
COMPARE_OUT = ROOT / "assets" / "screenshots" / "compare_tab.png"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def _arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def compare(page) -> None:
    """The Compare tab after a preset ("all methods, greedy, k=5" unless --preset; the table, strips and k sweep)."""
    page.get_by_role("tab", name="Compare").click()
    page.wait_for_selector("#sv-compare-run")
    page.get_by_label("Presets").click()
    page.get_by_role("option", name=_arg("--preset", "all methods, greedy, k=5"), exact=True).click()
    page.wait_for_timeout(1000)
    keep = int(sys.argv[sys.argv.index("--prompts") + 1]) if "--prompts" in sys.argv else 3
    for _ in range(max(3 - keep, 0)):  # drop the last of the tab's 3 default prompts (a faster run on a busy CPU)
        page.get_by_label("prompts (bundled set by category, and the examples)").press("Backspace")
    page.click("#sv-compare-run")
    for _ in range(120):  # up to 10 minutes on a busy CPU; the progress line says how far it got
        progress = page.locator("#sv-compare-progress").inner_text()
        if "done ·" in progress or "error" in progress:
            break
        print(progress, flush=True)
        page.wait_for_timeout(5000)
    page.wait_for_timeout(2000)
    shot = _arg("--shot", str(COMPARE_OUT))
    page.locator(f"#{_arg('--element', 'sv-compare-tab')}").screenshot(path=shot)
    print(page.locator("#sv-compare-progress").inner_text())
    print(f"wrote {shot}")


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
        if "--compare" in sys.argv[1:]:
            compare(page)
            ctx.close()
            demo.close()
            return
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
