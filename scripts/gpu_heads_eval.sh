#!/usr/bin/env bash
# One device call: train the heads registered in specviz/train/heads.py on the bundled target (in the background)
# while the bundled family's goal numbers are evaluated on the GPU (fp32, static runner), then bring both back.
# Writes $OUT/heads.tar (OUT/specviz-eagle*/ + logs), $OUT/eval_v2.json, $OUT/heads.log, $OUT/eval.log.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
HEADS=/tmp/specviz-heads
mkdir -p "$OUT" "$HEADS"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
(timeout "${HEADS_TIMEOUT_S:-430}" python3 -m specviz.train.heads --target assets/models/specviz-target --out "$HEADS" \
   --time-budget-s "${HEAD_BUDGET_S:-150}" > "$HEADS/heads.log" 2>&1; echo "heads exit $?" >> "$HEADS/heads.log") &
HP=$!
timeout "${EVAL_TIMEOUT_S:-400}" python3 -m specviz.train.evaluate --models assets/models --out "$OUT/eval_v2.json" \
  --prompts results/train/v2/heldout_prompts.json --device cuda --dtype float32 --k 4 --spec-tokens 64 \
  --max-new-tokens 256 > "$OUT/eval.log" 2>&1
echo "eval exit $?"; tail -c 3000 "$OUT/eval.log"
wait $HP
cp "$HEADS/heads.log" "$OUT/heads.log"; tail -c 3000 "$OUT/heads.log"
(cd "$HEADS" && tar cf - .) > "$OUT/heads.tar"
ls -la "$OUT"
