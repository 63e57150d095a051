#!/usr/bin/env bash
# Session 5, device call C (no wheels needed): bench_shapes with and without compile (issue 13's roofline and
# synthetic goals) and the inductor tests. Usage: bash scripts/gpu_s5_c.sh COMMIT
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; COMMIT=${1:-unknown}; L=$OUT/logs; mkdir -p "$L"
timeout ${T_SHAPES:-330} python3 benchmarks/bench_shapes.py --out "$OUT/shapes" --quick --only 1b,8b,none,spec --compile both \
  --commit "$COMMIT" > "$L/shapes.log" 2>&1
echo "[shapes] exit $?"; grep -E "tok/s|roofline|compile|%" "$L/shapes.log" | tail -n 30
timeout 120 python3 -m pytest -v -p no:cacheprovider --tb=short tests/test_compile.py -k inductor > "$L/t3_inductor.log" 2>&1
echo "[t3_inductor] exit $?"; tail -n 4 "$L/t3_inductor.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
