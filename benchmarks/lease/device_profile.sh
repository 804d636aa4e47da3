#!/usr/bin/env bash
# Second GPU check, after device_check.sh (~4 minutes on one H200; both fit one 15-minute lease).
# The first H200 run (2026-11-30, benchmarks/lease/h200/run2_*, made by this script at commit 8e61fb0)
# profiled BERT-base steps: eager 16-bit steps are host-bound, CUDA graphs lift amp_bf16 from 41 to
# 97 steps/s. device_check.sh now profiles every row itself; this script measures what is still open:
#   1. BERT-small's step times at config/bert-small-scratch.yaml's shapes (for benchmarks/gpu_hours.py);
#   2. the MFU target: amp_bf16 BERT-base classification with CUDA graphs reached 24.6% at batch 32
#      (GPU busy 95%); at batch 64 and 128, profiled, with the GPU time split by kernel kind (matmul,
#      attention, optimizer, layer norm, ...): at which batch the 35% is reached, and where the rest goes;
#   3. the study's own engine at BERT-base's size (seq 128, masked LM, eager) in every stage-1
#      precision of config/bert-base-mrpc.yaml, one fresh process each: its step times against
#      gpu_check's, which gpu_hours.py uses.
# Writes small_mlm_b128.json, small_classify_b32.json, mfu_b64.json, mfu_b128.json, engine_base.txt,
# engine_base_metrics.json to $OUT (or ./gpu-results), within BUDGET seconds (default 280; give it what the
# device lease has left after device_check.sh, less a minute: step 3 runs only if time is left).
#   BUDGET=240 bash benchmarks/lease/device_profile.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
BUDGET=${BUDGET:-280}
t0=$SECONDS
# its own device call, in a fresh shell: the engine (step 3) needs datasets from .whl/ as device_check.sh did
source benchmarks/lease/_device_env.sh
GC=(python3 -W ignore benchmarks/gpu_check.py)
# 1. BERT-small, eager (~60 s)
timeout -k 5 45 "${GC[@]}" --small --mlm --batch 128 --compile off --steps 20 \
  --precisions fp32,tf32,amp_fp16,amp_bf16,pure_fp16,pure_bf16 --out "$OUT/small_mlm_b128.json" 2>&1
timeout -k 5 30 "${GC[@]}" --small --compile off --steps 20 \
  --precisions fp32,tf32,amp_fp16,amp_bf16 --out "$OUT/small_classify_b32.json" 2>&1
echo "# BERT-small done at $((SECONDS - t0)) s"
# 2. amp_bf16 with CUDA graphs at larger batches, profiled (~45 s each, most of it a cold compile at a new
#    batch size; a killed process writes no JSON, so the limit is generous)
for b in 64 128; do
  timeout -k 5 90 "${GC[@]}" --batch "$b" --compile only --precisions amp_bf16 --steps 30 --profile-steps 3 \
    --out "$OUT/mfu_b$b.json" 2>&1
done
echo "# MFU sweep done at $((SECONDS - t0)) s"
# 3. the engine at BERT-base's size, eager, every stage-1 precision of bert-base-mrpc (~150 s)
left=$((BUDGET - (SECONDS - t0)))
(( left > 60 )) && timeout -k 5 "$left" python3 benchmarks/precision_throughput.py --device cuda --model base \
  --max-length 128 --repeats 1 --steps 60 --warmup 10 --objectives mlm \
  --precisions fp32,tf32,amp_fp16,amp_bf16,pure_fp16,pure_bf16 --metrics-out "$OUT/engine_base_metrics.json" 2>&1 \
  | tee "$OUT/engine_base.txt"
echo "# device_profile done in $((SECONDS - t0)) s"
