"""``python -m specviz ...``: see :mod:`specviz.cli`."""

import sys

from .cli import main

sys.exit(main())
