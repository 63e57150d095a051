#!/usr/bin/env bash
# Session 6, device call F (no wheels): the soak's requests on the engine, each on a new thread (the app's Run handler
# until now) beside each through the app's run pool (specviz/ui/worker.py now): two processes side by side, RSS every
# 20 runs (issue 10).
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
RUNS=${RUNS:-160}
(timeout 200 python3 scripts/rss_probe.py --runs "$RUNS" --via thread > "$OUT/rss_thread.log" 2>&1) &
(timeout 200 python3 scripts/rss_probe.py --runs "$RUNS" --via pool > "$OUT/rss_pool.log" 2>&1) &
wait
grep -h '^{' "$OUT/rss_thread.log" "$OUT/rss_pool.log"
tail -n 3 "$OUT/rss_pool.log" | grep -v '^{' | cut -c1-300
