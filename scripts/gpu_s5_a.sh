#!/usr/bin/env bash
# Session 5, device call A (carry .gpu-wheels/a): install bundle a of the gradio wheels (for call B), then the
# CUDA-only tests in verbose groups, bench_e2e on the static runner with chains beside trees (issue 15's tokens/s
# goal), and the comparison timing on CUDA (issue 14). Usage: bash scripts/gpu_s5_a.sh COMMIT
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; COMMIT=${1:-unknown}; L=$OUT/logs; mkdir -p "$L"
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/gpu-site .gpu-wheels/a/*.whl > "$L/pip_a.log" 2>&1
echo "[pip a] exit $?"
NOVIEW="not view and not figure and not html and not lesson and not interpreter and not triton_backend_equals_reference"
t() {  # t NAME SECONDS ARGS...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m pytest -v -p no:cacheprovider --tb=short -rfEs "$@" > "$L/$name.log" 2>&1
  echo "[$name] exit $?" >> "$L/$name.log"; echo "[$name] $(grep -cE ' PASSED' "$L/$name.log") passed, $(grep -cE ' FAILED| ERROR' "$L/$name.log") failed"; grep -E "FAILED|ERROR|exit" "$L/$name.log" | tail -n 6
}
t t1_graphs 120 tests/test_head_runner.py tests/test_gpu_syncs.py tests/test_tree_runners.py -k "($NOVIEW) and (gpu or cuda or graph or sync)"
t t2_heads 90 tests/test_dflash.py tests/test_medusa.py tests/test_mtp.py tests/test_eagle.py tests/test_runners.py tests/test_taps.py \
  tests/test_record_emitted.py tests/test_tree*.py -k "($NOVIEW) and (gpu or cuda or graph or triton)"
timeout 170 python3 benchmarks/bench_e2e.py --out "$OUT/e2e" --repeats 3 --max-new 128 --no-big --runners static \
  --methods none,eagle3,eagle3+tree4x5x24,eagle3+tree8x5x32,eagle3+tree4x4x16,eagle,eagle+tree4x5x24,draft_model,draft_model+choices,medusa,medusa+choices,dflash \
  --commit "$COMMIT" > "$L/bench_e2e.log" 2>&1
echo "[bench_e2e] exit $?"; grep -E "tok/s" "$L/bench_e2e.log" | grep -v "trace=off" | tail -30
timeout 90 python3 results/compare/measure.py --device cuda --out "$OUT/compare" > "$L/compare.log" 2>&1
echo "[compare] exit $?"; tail -n 8 "$L/compare.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$L/env.txt"; date -u >> "$L/env.txt"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
