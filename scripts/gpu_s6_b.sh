#!/usr/bin/env bash
# Session 6, device call B (no wheels): the GPU tests of the device-side EAGLE-2 tree (one CUDA graph per tree),
# the deferred tree record and the shared capture helper; then the tree step's phase split and bench_e2e chains
# beside trees (issue 15). Usage: bash scripts/gpu_s6_b.sh COMMIT
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; COMMIT=${1:-unknown}; L=$OUT/logs; mkdir -p "$L"
NOVIEW="not view and not figure and not html and not lesson and not interpreter and not triton_backend_equals_reference"
timeout 200 python3 -m pytest -v -p no:cacheprovider --tb=short -rfEs tests/test_gpu_syncs.py tests/test_eagle_tree.py \
  tests/test_head_runner.py tests/test_tree_runners.py tests/test_gpu_concurrency.py tests/test_eagle.py \
  -k "($NOVIEW) and (gpu or cuda or graph or sync or concurrent or tree_step or static_head_runner)" > "$L/t_b.log" 2>&1
echo "[t_b] exit $? $(grep -c ' PASSED' $L/t_b.log) passed $(grep -cE ' FAILED| ERROR' $L/t_b.log) failed"
grep -E "FAILED|ERROR|host reads per step" "$L/t_b.log" | head -12
timeout 90 python3 scripts/profile_tree_step.py > "$L/profile.log" 2>&1
echo "[profile] exit $?"; grep "ms/step" "$L/profile.log"
timeout 150 python3 benchmarks/bench_e2e.py --out "$OUT/e2e" --repeats 3 --max-new 128 --no-big --runners static \
  --methods none,eagle3,eagle3+tree4x5x24,eagle,eagle+tree4x5x24,draft_model+choices --commit "$COMMIT" > "$L/bench_e2e.log" 2>&1
echo "[bench_e2e] exit $?"; grep -E "tok/s" "$L/bench_e2e.log" | grep -v "^hf" | tail -12
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
