#!/usr/bin/env bash
# Session 6, device call A (no wheels). Three things side by side, then one quiet benchmark:
#  1. issue 16: four head-training variants, one process each on the one GPU (as session 4's heads-v3 call ran three),
#     each with the 180 s budget of the issue, then its held-out greedy acceptance through the engine;
#  2. meanwhile the GPU tests of what changed since session 5's call E (tree_level on both runners, the tree host-read
#     fix, warm-up graph bound);
#  3. after both: the tree step's phase split (scripts/profile_tree_step.py) and bench_e2e chains beside trees, on a
#     quiet GPU. Usage: bash scripts/gpu_s6_a.sh COMMIT
set -uo pipefail
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}; COMMIT=${1:-unknown}; L=$OUT/logs; mkdir -p "$L"
WORK=$OUT/heads; mkdir -p "$WORK"
BUDGET=${HEAD_BUDGET_S:-180}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
declare -A SETS=(
  [dflash_last2]="--kinds dflash --set dflash.init_from_target=last --no-eval"
  [dflash_last3]="--kinds dflash --set dflash.init_from_target=last --set dflash.num_layers=3 --no-eval"
  [dflash_first2]="--kinds dflash --set dflash.init_from_target=first --no-eval"
  [medusa_l2]="--kinds medusa --set medusa.head_layers=2"
)
pids=()
for name in "${!SETS[@]}"; do
  mkdir -p "$WORK/$name"
  (timeout "${HEADS_TIMEOUT_S:-340}" python3 -m specviz.train.heads ${SETS[$name]} --target assets/models/specviz-target \
     --out "$WORK/$name" --time-budget-s "$BUDGET" --device cuda > "$WORK/$name/train.log" 2>&1
   echo "$name exit $?" >> "$WORK/$name/train.log") &
  pids+=($!)
done
NOVIEW="not view and not figure and not html and not lesson and not interpreter and not triton_backend_equals_reference"
timeout 200 python3 -m pytest -v -p no:cacheprovider --tb=short -rfEs tests/test_gpu_concurrency.py tests/test_gpu_syncs.py \
  tests/test_mtp.py tests/test_dflash.py tests/test_medusa.py tests/test_eagle.py tests/test_eagle_tree.py tests/test_tree_runners.py \
  tests/test_head_runner.py tests/test_dflash_train.py -k "($NOVIEW) and (gpu or cuda or graph or sync or concurrent or tree_step)" > "$L/t_a.log" 2>&1
echo "[t_a] exit $? $(grep -c ' PASSED' $L/t_a.log) passed $(grep -cE ' FAILED| ERROR' $L/t_a.log) failed"
grep -E "FAILED|ERROR|host reads per step" "$L/t_a.log" | head -12
wait "${pids[@]}"
for name in "${!SETS[@]}"; do
  echo "== $name"; grep -E "held-out|exit|\"steps\"" "$WORK/$name/train.log" | tail -4 | cut -c1-400
  find "$WORK/$name" -name "*.safetensors" -size +1k | head -2
done
timeout 60 python3 scripts/profile_tree_step.py > "$L/profile.log" 2>&1
echo "[profile] exit $?"; grep "ms/step" "$L/profile.log"
timeout 120 python3 benchmarks/bench_e2e.py --out "$OUT/e2e" --repeats 3 --max-new 128 --no-big --runners static \
  --methods none,eagle3,eagle3+tree4x5x24,eagle,eagle+tree4x5x24,draft_model+choices --commit "$COMMIT" > "$L/bench_e2e.log" 2>&1
echo "[bench_e2e] exit $?"; grep -E "tok/s" "$L/bench_e2e.log" | grep -v "^hf" | tail -12
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$L"
