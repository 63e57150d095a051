#!/usr/bin/env bash
# Everything the GPU machine should check, in ONE device call of at most 10 minutes (issues 12, 13):
#   1. the new GPU tests first: the EAGLE head runner's CUDA graphs == eager (test_head_runner), inductor
#      forwards inside the static runner's graphs == eager (test_compile), one wait per step for every
#      method incl. eagle / eagle3 (test_gpu_syncs), eagle / eagle3 static + graphs == eager (test_eagle);
#   2. bench_e2e on the bundled models: none, ngram, draft_model, eagle, eagle3 on the static runner with
#      and without compile (static, static+compile), side by side (compile ratios per row);
#   3. bench_shapes --quick on the Llama-3.1-8B shape, method none with and without compile (roofline fraction;
#      HF and the synthetic draft_model rows are left out for time: drop ",none" from --only for them);
#   4. the older GPU tests (runners, taps, verifier cache, kernels, import layering), if budget is given;
#   5. bench_kernels --quick, if budget is given (earlier runs: results/kernels/README.md).
# Each part runs under its own `timeout`, so a hang costs only that part's budget (default sum: 570 s; set
# T_TESTS, T_E2E, T_SHAPES, T_OLD, T_KERNELS to change them; 0 skips a part). Compilation dominates parts 1-3
# (inductor compiles each model's forward for width 1 and for a dynamic width, with hidden states on and off);
# its time is printed ("first requests ... took") and kept out of the timed rows.
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
T_TESTS=${T_TESTS:-200} T_E2E=${T_E2E:-230} T_SHAPES=${T_SHAPES:-140} T_OLD=${T_OLD:-0} T_KERNELS=${T_KERNELS:-0}

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

part() {  # part NAME SECONDS COMMAND...: run under a timeout, log to WORK/NAME.log (0 seconds: skipped)
  local name=$1 limit=$2
  shift 2
  if [ "$limit" -le 0 ]; then echo "[$name] skipped (budget 0)"; return; fi
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  echo "[$name] exit code $rc after $((SECONDS - t0)) s (limit $limit s; 124 = timed out)" | tee -a "$WORK/$name.log"
  pack
}

part 1_new_gpu_tests "$T_TESTS" $PY -m pytest -q -p no:cacheprovider -rs \
  tests/test_head_runner.py tests/test_compile.py::test_inductor_graphs_equal_eager_on_gpu tests/test_gpu_syncs.py \
  tests/test_eagle.py::test_static_graphs_equal_eager_on_gpu --junitxml="$WORK/new_tests.xml" -s
part 2_bench_e2e "$T_E2E" $PY benchmarks/bench_e2e.py --out "$WORK/e2e" --repeats 2 --max-new 128 --no-big \
  --methods none,ngram,draft_model,eagle,eagle3 --runners static,static+compile --commit "$COMMIT"
part 3_bench_shapes "$T_SHAPES" $PY benchmarks/bench_shapes.py --out "$WORK/shapes" --quick --only 8b,none \
  --compile both --commit "$COMMIT"
part 4_old_gpu_tests "$T_OLD" $PY -m pytest -q -p no:cacheprovider -rs \
  tests/test_taps.py tests/test_heads.py tests/test_import_layers.py tests/test_verifier_cache.py \
  tests/test_kernels_block_two_pass.py tests/test_runners.py \
  tests/test_kernels_compile.py tests/test_transformers_import.py tests/test_kernels_ngram.py tests/test_kernels_sampler.py \
  -k "not triton_backend_equals_reference and not interpreter" --junitxml="$WORK/old_tests.xml" -s
part 5_bench_kernels "$T_KERNELS" $PY benchmarks/bench_kernels.py "$WORK/kernels" --quick --budget-s 40 --commit "$COMMIT"
pack
rm -rf "$WORK"
ls -la "$OUT"
