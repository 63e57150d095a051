#!/usr/bin/env bash
# Session 5, final device call E (carry .gpu-wheels/a): install bundle a, then the GPU tests of what changed since
# call D (MTP graphs, tree host reads, concurrency, EAGLE / heads static == eager, tree graphs). Usage: bash scripts/gpu_s5_e.sh COMMIT
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; L=$OUT/logs; mkdir -p "$L"
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/gpu-site .gpu-wheels/a/*.whl > "$L/pip_a.log" 2>&1
echo "[pip a] exit $?"
NOVIEW="not view and not figure and not html and not lesson and not interpreter and not triton_backend_equals_reference"
timeout ${T_TESTS:-150} python3 -m pytest -v -p no:cacheprovider --tb=short -rfEs tests/test_gpu_concurrency.py tests/test_gpu_syncs.py \
  tests/test_mtp.py tests/test_dflash.py tests/test_medusa.py tests/test_eagle.py tests/test_eagle_tree.py tests/test_tree_runners.py \
  tests/test_head_runner.py -k "($NOVIEW) and (gpu or cuda or graph or sync or concurrent or tree_step)" > "$L/t_final.log" 2>&1
echo "[t_final] exit $? $(grep -c ' PASSED' $L/t_final.log) passed $(grep -cE ' FAILED| ERROR' $L/t_final.log) failed"
grep -E "FAILED|ERROR|host reads per step" "$L/t_final.log" | head -12
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
