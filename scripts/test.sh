#!/usr/bin/env bash
# The test suite as .ci/run runs it (after scripts/setup.sh --browser): every test but the browser ones in two
# pytest-xdist workers taking whole files, then the browser tests (marked by tests/conftest.py) in one process, so
# that their page timings are not stretched by the other worker's load (two of them timed out once when they shared
# the 2 cores with another worker and a busy machine). Extra arguments go to both runs. Exit status: non-zero if
# either run failed (pytest's 5, "no test selected", counts as success).
set -uo pipefail
cd "$(dirname "$0")/.."
ok() { [ "$1" -eq 0 ] || [ "$1" -eq 5 ]; }
.venv/bin/python -m pytest -q -n 2 --dist loadfile -m "not browser" "$@"; a=$?
.venv/bin/python -m pytest -q -m browser "$@"; b=$?
ok $a && ok $b && exit 0
ok $a && exit $b
exit $a
