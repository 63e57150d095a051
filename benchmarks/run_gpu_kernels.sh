#!/usr/bin/env bash
# One GPU run of the Triton kernel tests (compiled kernels) and the kernel benchmark.
# Usage, from the repository root on a CUDA machine:
#   bash benchmarks/run_gpu_kernels.sh OUT_DIR [COMMIT]
# Writes OUT_DIR/env.txt, test_kernels_gpu.txt, bench_log.txt, bench_kernels.json, bench_kernels.md.
set -uo pipefail
OUT=${1:?usage: run_gpu_kernels.sh OUT_DIR [COMMIT]}
COMMIT=${2:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
unset TRITON_INTERPRET
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,memory.total --format=csv
  python3 -c "import sys, torch, triton, numpy; print(sys.version); print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
} > "$OUT/env.txt" 2>&1
timeout "${TEST_TIMEOUT:-170}" python3 -m pytest tests/test_kernels_sampler.py tests/test_kernels_ngram.py \
  tests/test_kernels_compile.py tests/test_transformers_import.py -q -p no:cacheprovider -rs --durations=10 2>&1 |
  tee "$OUT/test_kernels_gpu.txt"
echo "pytest exit code: ${PIPESTATUS[0]}" | tee -a "$OUT/test_kernels_gpu.txt"
timeout "${BENCH_TIMEOUT:-230}" python3 benchmarks/bench_kernels.py "$OUT" --commit "$COMMIT" \
  --budget-s "${BENCH_BUDGET:-170}" 2>&1 | tee "$OUT/bench_log.txt"
echo "bench exit code: ${PIPESTATUS[0]}" | tee -a "$OUT/bench_log.txt"
