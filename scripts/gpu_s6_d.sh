#!/usr/bin/env bash
# Session 6, device call D (carry .gpu-wheels/a; call E follows at once): install bundle a, the GPU tests of what
# changed (device-drafted trees, their forward without a host read, the deferred record, the capture helper, the
# sync counts, concurrency), the tree step's phase split and bench_e2e chains beside trees. Usage: bash ... COMMIT
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; COMMIT=${1:-unknown}; L=$OUT/logs; mkdir -p "$L"
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/gpu-site .gpu-wheels/a/*.whl > "$L/pip_a.log" 2>&1
echo "[pip a] exit $?"
NOVIEW="not view and not figure and not html and not lesson and not interpreter and not triton_backend_equals_reference"
timeout 200 python3 -m pytest -v -p no:cacheprovider --tb=short -rfEs tests/test_gpu_syncs.py tests/test_eagle_tree.py \
  tests/test_head_runner.py tests/test_tree_runners.py tests/test_tree_engine.py tests/test_gpu_concurrency.py tests/test_eagle.py \
  tests/test_mtp.py tests/test_dflash.py tests/test_medusa.py \
  -k "($NOVIEW) and (gpu or cuda or graph or sync or concurrent or tree_step or static_head_runner or wait)" > "$L/t_d.log" 2>&1
echo "[t_d] exit $? $(grep -c ' PASSED' $L/t_d.log) passed $(grep -cE ' FAILED| ERROR' $L/t_d.log) failed"
grep -E "^E  |FAILED|host reads per step" "$L/t_d.log" | cut -c1-700 | head -14
timeout 80 python3 scripts/profile_tree_step.py > "$L/profile.log" 2>&1
echo "[profile] exit $?"; grep "ms/step" "$L/profile.log"
timeout 120 python3 benchmarks/bench_e2e.py --out "$OUT/e2e" --repeats 3 --max-new 128 --no-big --runners static \
  --methods none,eagle3,eagle3+tree4x5x24,eagle,eagle+tree4x5x24,draft_model+choices --commit "$COMMIT" > "$L/bench_e2e.log" 2>&1
echo "[bench_e2e] exit $?"; grep -E "tok/s" "$L/bench_e2e.log" | grep -v "^hf" | tail -12
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
