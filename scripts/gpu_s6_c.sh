#!/usr/bin/env bash
# Session 6, device call C (no wheels): the tree GPU tests again (fixed test set-up; where a tree step's extra host
# read comes from), then the host-time profile of a tree step beside the chain's (scripts/profile_tree_timeline.py).
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; L=$OUT/logs; mkdir -p "$L"
timeout 120 python3 -m pytest -v -p no:cacheprovider --tb=short -rfEs tests/test_gpu_syncs.py tests/test_eagle_tree.py \
  -k "tree_step or static_head_runner or bundled_eagle3_tree" > "$L/t_c.log" 2>&1
echo "[t_c] exit $? $(grep -c ' PASSED' $L/t_c.log) passed $(grep -cE ' FAILED| ERROR' $L/t_c.log) failed"
grep -E "^E  |host reads per step" "$L/t_c.log" | cut -c1-1500 | head -12
timeout 150 python3 scripts/profile_tree_timeline.py > "$L/timeline.log" 2>&1
echo "[timeline] exit $?"; cat "$L/timeline.log" | grep -v Warning | head -80
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
