#!/usr/bin/env bash
# One device call (session 4, call 4): the CUDA-only tests file group by file group, verbose (a timeout still shows
# which tests passed), then bench_e2e on the static runner for every method with a bundled drafter, then bench_taps.
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}
COMMIT=${1:-unknown}
mkdir -p "$OUT"
NOVIEW="not view and not figure and not html and not lesson and not interpreter and not triton_backend_equals_reference"
t() {  # t NAME SECONDS FILES... -- K
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m pytest -v -p no:cacheprovider --tb=short -rfEs "$@" > "$OUT/$name.log" 2>&1
  echo "[$name] exit $?" >> "$OUT/$name.log"; grep -cE "PASSED|FAILED|ERROR|SKIPPED" "$OUT/$name.log"; tail -n 3 "$OUT/$name.log"
}
t t1_graphs 110 tests/test_head_runner.py tests/test_gpu_syncs.py tests/test_tree_runners.py -k "($NOVIEW) and (gpu or cuda or graph or sync)"
t t2_heads 70 tests/test_dflash.py tests/test_medusa.py tests/test_mtp.py tests/test_eagle.py tests/test_runners.py tests/test_taps.py \
  tests/test_record_emitted.py -k "($NOVIEW) and (gpu or cuda or graph or triton)"
t t3_inductor 90 tests/test_compile.py -k "inductor"
timeout 150 python3 benchmarks/bench_e2e.py --out "$OUT/e2e" --repeats 2 --max-new 128 --no-big --runners static \
  --methods none,ngram,ngram_gpu,draft_model,eagle,eagle3,dflash,medusa,mtp --commit "$COMMIT" > "$OUT/bench_e2e.log" 2>&1
echo "[bench_e2e] exit $?" >> "$OUT/bench_e2e.log"; grep -E "tok/s|exit" "$OUT/bench_e2e.log" | tail -30
timeout 45 python3 benchmarks/bench_taps.py --out "$OUT/taps" --rounds 200 --commit "$COMMIT" > "$OUT/bench_taps.log" 2>&1
echo "[bench_taps] exit $?" >> "$OUT/bench_taps.log"; tail -n 8 "$OUT/bench_taps.log"
