#!/usr/bin/env bash
# One device call: train the model family (python -m specviz.train) on the GPU machine and bring it back.
# Usage (on the GPU machine, from the repo root): bash scripts/gpu_train.sh [extra args for specviz.train]
# Writes $OUT/train.tar.part-aa, -ab, ... (the whole output dir, split into 15 MB parts) and $OUT/train.log.
# Unpack here with: cat DIR/train.tar.part-* | tar xf - -C /tmp/v2
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
OUT=${OUT:-/tmp/out}
WORK=/tmp/specviz-train
mkdir -p "$OUT" "$WORK"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, tokenizers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)"
git log -1 --format='commit %H %cd' 2>/dev/null || true
timeout "${TRAIN_TIMEOUT_S:-560}" python3 -m specviz.train --out "$WORK" --preset "${PRESET:-demo}" --compile "$@" 2>&1 | tee "$OUT/train.log"
echo "train exit ${PIPESTATUS[0]}"
(cd "$WORK" && tar cf - .) | split -b 15M - "$OUT/train.tar.part-"
ls -la "$OUT"
