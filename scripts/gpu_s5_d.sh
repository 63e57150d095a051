#!/usr/bin/env bash
# Session 5, device call D (no wheels): the new GPU tests (concurrent requests during capture, tree host reads,
# tree graphs, EAGLE static == eager), the tree step's time split beside the chain's (scripts/profile_tree_step.py),
# and bench_e2e chains beside trees. Usage: bash scripts/gpu_s5_d.sh COMMIT
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; COMMIT=${1:-unknown}; L=$OUT/logs; mkdir -p "$L"
NOVIEW="not view and not figure and not html and not lesson and not interpreter and not triton_backend_equals_reference"
timeout 150 python3 -m pytest -v -p no:cacheprovider --tb=short -rfEs tests/test_gpu_concurrency.py tests/test_gpu_syncs.py \
  tests/test_tree_runners.py tests/test_eagle_tree.py tests/test_eagle.py -k "($NOVIEW) and (gpu or cuda or graph or sync or concurrent or tree_step)" > "$L/t_new.log" 2>&1
echo "[t_new] exit $? $(grep -c ' PASSED' $L/t_new.log) passed $(grep -cE ' FAILED| ERROR' $L/t_new.log) failed"; grep -E "FAILED|ERROR|host reads per step|Error" "$L/t_new.log" | head -12
timeout 120 python3 scripts/profile_tree_step.py --profile > "$L/profile.log" 2>&1
echo "[profile] exit $?"; grep "ms/step" "$L/profile.log"
timeout 150 python3 benchmarks/bench_e2e.py --out "$OUT/e2e" --repeats 3 --max-new 128 --no-big --runners static \
  --methods none,eagle3,eagle3+tree4x5x24,eagle3+tree4x3x12,eagle,eagle+tree4x5x24,draft_model,draft_model+choices,medusa,medusa+choices,dflash \
  --commit "$COMMIT" > "$L/bench_e2e.log" 2>&1
echo "[bench_e2e] exit $?"; grep -E "tok/s" "$L/bench_e2e.log" | grep -v "^hf" | tail -24
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
