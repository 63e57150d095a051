#!/usr/bin/env bash
# Everything the GPU machine should check, in ONE device call of at most 10 minutes (issue 13):
#   1. the CUDA tests: runners (static runner + CUDA graphs == eager), the Triton kernels (compiled),
#      the verifier's graph cache, one wait per step (sync-debug count), import layering;
#   2. bench_shapes --quick (Llama-3.2-1B / 3.1-8B shapes vs the HBM roofline, synthetic speedups);
#   3. bench_kernels --quick (sampler at B=64, K=4, V=128256; n-gram matcher);
#   4. bench_e2e, short (bundled demo models: HF vs specviz).
# Each part runs under its own `timeout`, so a hang costs only that part's budget (sum: 570 s; set
# T_TESTS, T_SHAPES, T_KERNELS, T_E2E to change them). Tests run newest first (a timeout cuts the
# kernel tests, which earlier runs passed: results/kernels/README.md).
# Usage, from the repository root on the CUDA machine (the device copy has no .git: pass the commit):
#   bash benchmarks/run_gpu_suite.sh "$OUT" "$(git rev-parse --short HEAD)"
# Writes at most 3 files to OUT (the device returns at most 8, no deeper than OUT/a/b/file):
#   OUT/summary.md       the end of every part's log and its exit code (read this first)
#   OUT/gpu_suite.tgz    every log, JSON and markdown table (tar xzf gpu_suite.tgz)
#   OUT/env.txt          date, GPU, driver, versions
# The H200 has python 3.12, torch 2.11+cu130, numpy 2.5.2 and no gradio/plotly: only test files that
# need neither are collected, and test_engine_with_triton_backend_equals_reference is deselected
# (triton's interpreter fails there with numpy 2.5.2; CI runs it).
set -uo pipefail
OUT=${1:?usage: run_gpu_suite.sh OUT_DIR [COMMIT]}
COMMIT=${2:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
WORK=$(mktemp -d /tmp/specviz-gpu-suite.XXXXXX)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
unset TRITON_INTERPRET
PY=${PYTHON:-python3}
T_TESTS=${T_TESTS:-230} T_SHAPES=${T_SHAPES:-150} T_KERNELS=${T_KERNELS:-100} T_E2E=${T_E2E:-90}

{
  date -u
  echo "commit $COMMIT"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total --format=csv
  $PY -c "import sys, torch, triton, numpy, transformers; print(sys.version); print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'transformers', transformers.__version__)"
} > "$OUT/env.txt" 2>&1

pack() {  # after every part, so a later hang still returns what finished
  tar czf "$OUT/gpu_suite.tgz" -C "$WORK" . 2>/dev/null
  {
    echo "# GPU suite, commit $COMMIT"
    echo
    for log in "$WORK"/*.log; do
      [ -e "$log" ] || continue
      echo "## $(basename "$log")"
      echo '```'
      tail -n 40 "$log"
      echo '```'
    done
  } > "$OUT/summary.md"
}

part() {  # part NAME SECONDS COMMAND...: run under a timeout, log to WORK/NAME.log
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  echo "[$name] exit code $rc after $((SECONDS - t0)) s (limit $limit s; 124 = timed out)" | tee -a "$WORK/$name.log"
  pack
}

part 1_tests "$T_TESTS" $PY -m pytest -q -p no:cacheprovider -rs \
  tests/test_taps.py tests/test_eagle.py tests/test_heads.py \
  tests/test_import_layers.py tests/test_verifier_cache.py tests/test_gpu_syncs.py tests/test_kernels_block_two_pass.py \
  tests/test_runners.py \
  tests/test_kernels_compile.py tests/test_transformers_import.py tests/test_kernels_ngram.py tests/test_kernels_sampler.py \
  -k "not triton_backend_equals_reference and not interpreter" --junitxml="$WORK/tests.xml" -s
part 2_bench_shapes "$T_SHAPES" $PY benchmarks/bench_shapes.py --out "$WORK/shapes" --quick --commit "$COMMIT"
part 3_bench_kernels "$T_KERNELS" $PY benchmarks/bench_kernels.py "$WORK/kernels" --quick --budget-s 40 --commit "$COMMIT"
part 4_bench_e2e "$T_E2E" $PY benchmarks/bench_e2e.py --out "$WORK/e2e" --repeats 2 --max-new 128 --no-big \
  --methods none,ngram,ngram_gpu,draft_model --commit "$COMMIT"
pack
rm -rf "$WORK"
ls -la "$OUT"
