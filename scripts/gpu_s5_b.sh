#!/usr/bin/env bash
# Session 5, device call B (carry .gpu-wheels/b, right after call A on the same warm machine): install bundle b, then
# the app on CUDA through gradio_client (every example and method, chains and trees, first and second run, the
# lesson; issues 12, 13, 15, 16, 17), and the 200-run soak with CUDA memory (issue 10). Usage: bash scripts/gpu_s5_b.sh COMMIT
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
OUT=${OUT:-/tmp/out}; COMMIT=${1:-unknown}; L=$OUT/logs; mkdir -p "$L"
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/gpu-site .gpu-wheels/b/*.whl > "$L/pip_b.log" 2>&1
echo "[pip b] exit $?"
export PYTHONPATH=/root/gpu-site
timeout ${T_APP:-300} python3 scripts/gpu_app_check.py --out "$OUT/app/app_gpu.json" > "$L/app.log" 2>&1
echo "[app] exit $?"; cat "$OUT/app/app_gpu.md" 2>/dev/null || tail -n 20 "$L/app.log"
timeout ${T_SOAK:-240} python3 benchmarks/load_app.py --device cuda --soak 200 --out "$OUT/soak.json" > "$L/soak.log" 2>&1
echo "[soak] exit $?"; tail -n 12 "$L/soak.log"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
