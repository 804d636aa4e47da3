#!/usr/bin/env bash
# Second GPU check (~4 minutes on one H200): where a BERT-base step's time goes. device_check.sh
# found every 16-bit mode at 23-45 ms per batch-32 step on an H200, fp32 GPU-bound at 55 ms: this
# measures the host's cost per eager op, profiles kernels / GPU time / host syncs per step, tries
# CUDA graphs (torch.compile mode reduce-overhead) and a larger batch, and times BERT-small (stage-1 and
# stage-2 shapes of config/bert-small-scratch.yaml). Writes 8 files (the device tool brings back 8) to
# $OUT (or ./gpu-results).
#   bash benchmarks/device_profile.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
t0=$SECONDS
GC=(python3 -W ignore benchmarks/gpu_check.py)
# 1. eager, batch 32: host cost per op, kernels and GPU time per step (~40 s)
timeout -k 5 90 "${GC[@]}" --compile off --precisions amp_bf16,pure_bf16,fp32 --steps 30 --profile-steps 3 \
  --out "$OUT/prof_eager.json" 2>&1 | tee "$OUT/prof_eager.txt"
echo "# eager profile done at $((SECONDS - t0)) s"
# 2. CUDA graphs: torch.compile mode reduce-overhead, batch 32 (~90 s, compilation included)
timeout -k 5 110 "${GC[@]}" --compile only --compile-mode reduce-overhead --precisions amp_bf16,fp32 --steps 30 \
  --profile-steps 3 --budget-seconds 95 --out "$OUT/prof_cudagraphs.json" 2>&1 | tee "$OUT/prof_cudagraphs.txt"
echo "# cudagraphs done at $((SECONDS - t0)) s"
# 3. eager, batch 256: the same model with 8x the work per launch (~30 s)
left=$((170 - (SECONDS - t0)))
(( left > 25 )) && timeout -k 5 "$left" "${GC[@]}" --compile off --precisions amp_bf16,fp32 --batch 256 --steps 10 --warmup 3 \
  --profile-steps 2 --out "$OUT/prof_b256.json" 2>&1 | tee "$OUT/prof_b256.txt"
# 4. BERT-small (config/bert-small-scratch.yaml): its stage-1 and stage-2 shapes, eager, for
#    benchmarks/gpu_hours.py (~60 s)
left=$((235 - (SECONDS - t0)))
(( left > 25 )) && timeout -k 5 "$left" "${GC[@]}" --small --mlm --batch 128 --compile off --steps 20 \
  --precisions fp32,tf32,amp_fp16,amp_bf16,pure_fp16,pure_bf16 --out "$OUT/small_mlm_b128.json" 2>&1
left=$((255 - (SECONDS - t0)))
(( left > 15 )) && timeout -k 5 "$left" "${GC[@]}" --small --compile off --steps 20 \
  --precisions fp32,tf32,amp_fp16,amp_bf16 --out "$OUT/small_classify_b32.json" 2>&1
echo "# device_profile done in $((SECONDS - t0)) s"
