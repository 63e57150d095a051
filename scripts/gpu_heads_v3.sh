#!/usr/bin/env bash
# One device call (issue 16): train the Medusa, MTP and DFlash heads on the bundled target, three processes side by
# side on the one GPU (each builds the demo preset's windows itself, trains for HEAD_BUDGET_S, then runs its
# held-out greedy acceptance through the engine next to draft_model's), and bring back the heads and the logs.
# Writes $OUT/heads_v3.tar (OUT/<kind>/specviz-<kind>/ + logs + heads_acceptance.json) and $OUT/<kind>.log.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
WORK=/tmp/specviz-heads-v3
BUDGET=${HEAD_BUDGET_S:-180}
mkdir -p "$OUT" "$WORK"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
pids=()
for kind in medusa mtp dflash; do
  mkdir -p "$WORK/$kind"
  (timeout "${HEADS_TIMEOUT_S:-520}" python3 -m specviz.train.heads --kinds "$kind" --target assets/models/specviz-target \
     --out "$WORK/$kind" --time-budget-s "$BUDGET" --device cuda > "$WORK/$kind/train.log" 2>&1
   echo "$kind exit $?" >> "$WORK/$kind/train.log") &
  pids+=($!)
done
wait "${pids[@]}"
for kind in medusa mtp dflash; do
  cp "$WORK/$kind/train.log" "$OUT/$kind.log"
  echo "== $kind"; tail -c 1500 "$WORK/$kind/train.log"
done
(cd "$WORK" && tar cf - .) > "$OUT/heads_v3.tar"
ls -la "$OUT"
