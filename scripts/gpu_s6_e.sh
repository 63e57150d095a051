#!/usr/bin/env bash
# Session 6, device call E (carry .gpu-wheels/b, right after D): install bundle b, then the app on CUDA through
# gradio_client (the examples and the key settings, first and second run, the lesson), the comparison timing and the
# Compare tab's preset, 8 concurrent sessions and the 200-run soak (RSS, CUDA memory, graph captures, threads).
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False
OUT=${OUT:-/tmp/out}; L=$OUT/logs; mkdir -p "$L"
python3 -m pip install -q --no-index --no-deps --no-compile --target /root/gpu-site .gpu-wheels/b/*.whl > "$L/pip_b.log" 2>&1
echo "[pip b] exit $?"
export PYTHONPATH=/root/gpu-site
ONLY="MLP class,Decoder layer,RMSNorm forward, draft model sampling (block,Plain,eagle3 greedy,eagle3 chain k=6,dflash,mtp,medusa greedy,eagle3 EAGLE-2 tree 4,eagle EAGLE-2,draft_model static,medusa static"
timeout ${T_APP:-500} python3 scripts/gpu_app_check.py --out "$OUT/app/app_gpu.json" --only "$ONLY" --compare --soak 200 > "$L/app.log" 2>&1
echo "[app] exit $?"; cat "$OUT/app/app_gpu.md" 2>/dev/null || tail -n 30 "$L/app.log"
grep -E '^\{"(configurations|preset|sessions|runs|soak_runs)' "$L/app.log" | cut -c1-400 | tail -14
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
