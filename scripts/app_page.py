"""The screenshot scripts' shared steps: serve an app's Blocks on 127.0.0.1, open it in Debian's headless
/usr/bin/chromium (Playwright, no browser download), run the Run button to its end."""

from __future__ import annotations

import contextlib
import sys
import tempfile
from typing import Iterator

from playwright.sync_api import sync_playwright

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def arg(name: str, default: str) -> str:
    """The command line's value after ``name``, else ``default``."""
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


@contextlib.contextmanager
def app_page(demo, port: int, width: int, height: int) -> Iterator:
    """A Playwright page on ``demo`` (a gradio Blocks) served at 127.0.0.1:``port``, its Run button rendered;
    the browser and the server are closed afterwards."""
    from specviz.ui import launch_options

    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, **launch_options())
    try:
        with tempfile.TemporaryDirectory() as profile, sync_playwright() as p:
            ctx = p.chromium.launch_persistent_context(profile, executable_path="/usr/bin/chromium", headless=True,
                                                       args=ARGS, viewport={"width": width, "height": height})
            page = ctx.new_page()
            page.goto(url)
            page.wait_for_selector("#sv-run")
            yield page
            ctx.close()
    finally:
        demo.close()


def run_to_done(page, timeout_ms: int) -> None:
    """Press Run and wait until the progress line says done."""
    page.click("#sv-run")
    page.wait_for_function("() => document.querySelector('#sv-progress').innerText.includes('done ·')",
                           timeout=timeout_ms)
