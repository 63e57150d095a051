"""specviz web app: ``python app.py`` (or the console script ``specviz app``) serves http://127.0.0.1:7860.

The UI is built at import (``demo``); models load at launch on a background thread (or at the
first Run with --no-warm-up), never at import.
Options: --host (default 127.0.0.1), --port (7860), --share, --target DIR, --draft DIR, --device,
--no-warm-up, --present (the presentation layout; or ?present=1). With no --target the bundled demo models in assets/models/ are used.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from specviz.ui import build_app  # noqa: E402
from specviz.ui.launch import main, parse_args  # noqa: E402,F401  (parse_args: the options, for tests)

demo = build_app()

if __name__ == "__main__":
    sys.exit(main(prog="python app.py"))
