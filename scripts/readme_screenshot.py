"""Retake the README's overview screenshot: the app on the bundled demo models after the first
example prompt (n-gram, greedy); with ``--compare``, the Compare tab's screenshot instead: the preset
"all methods, greedy, k=5" on the bundled prompts the tab starts with, 64 new tokens (``--preset NAME``: another
preset; ``--shot PATH``: where the png goes; ``--element ID``: only that element, e.g. sv-compare-ksweep;
``--present``: the presentation layout at 1280x720). Needs Debian's /usr/bin/chromium; run from the repo root:

    .venv/bin/python scripts/readme_screenshot.py [--compare [--prompts N] [--preset NAME] [--shot PATH] [--element ID]
                                                  [--present]]
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

from app_page import app_page, arg, run_to_done  # noqa: E402

from specviz.ui import build_app  # noqa: E402

OUT = ROOT / "assets" / "screenshots" / "app_ngram_overview.png"
COMPARE_OUT = ROOT / "assets" / "screenshots" / "compare_tab.png"



def compare(page) -> None:
    """The Compare tab after a preset ("all methods, greedy, k=5" unless --preset; the table, strips and k sweep)."""
    page.get_by_role("tab", name="Compare").click()
    page.wait_for_selector("#sv-compare-run")
    page.get_by_label("Presets").click()
    page.get_by_role("option", name=arg("--preset", "all methods, greedy, k=5"), exact=True).click()
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
    shot = arg("--shot", str(COMPARE_OUT))
    page.locator(f"#{arg('--element', 'sv-compare-tab')}").screenshot(path=shot)
    print(page.locator("#sv-compare-progress").inner_text())
    print(f"wrote {shot}")


def main() -> None:
    example = json.loads((ROOT / "assets/examples/prompts.json").read_text())["examples"][0]
    present = "--present" in sys.argv[1:]
    with app_page(build_app(present=present), 7879, *((1280, 720) if present else (1400, 1000))) as page:
        if "--compare" in sys.argv[1:]:
            compare(page)
            return
        page.locator("#sv-prompt textarea").fill(example["prompt"])
        page.get_by_label(example["settings"]["method"], exact=True).check()
        run_to_done(page, 180_000)
        page.evaluate("window.scrollTo(0, 0)")
        page.wait_for_timeout(1500)
        page.screenshot(path=str(OUT))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
