#!/usr/bin/env bash
# Every GPU check in one command of at most ~9 minutes on one H200 (docs/gpu.md, "Running all GPU
# checks in one go"). Writes to $OUT (or ./gpu-results): env.txt, gpu_check.{json,txt}
# (classification steps, eager + compiled rows while the time budget lasts), gpu_check_mlm.{json,txt}
# (masked-LM steps, eager), engine_cuda.txt (the study's own engine on CUDA at BERT-base's size, one
# fresh process per run, eager and compiled: synchronized clocks, CUDA peak memory, NVML energy in
# metrics.json) and engine_cuda_metrics.json. JSON files are rewritten after every row, so a cut-off run keeps its rows.
# Needs python3 with CUDA torch and transformers; on a machine without pip access, wheels in .whl/
# (benchmarks/lease/device_wheels.sh, fetched elsewhere) add datasets (the engine's data) and torchao (fp8).
#   bash benchmarks/lease/device_check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
# the clock starts here: the 520 s budget covers the wheel install and the version probes too
# (each imports torch), so the whole script stays inside a 600 s command limit
t0=$SECONDS
source benchmarks/lease/_device_env.sh
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'transformers', transformers.__version__)"
  python3 -c "import datasets; print('datasets', datasets.__version__)" || true
  python3 -c "import torchao; print('torchao', torchao.__version__)" || true
} 2>&1 | tee "$OUT/env.txt"

# 1. BERT-base classification steps, every precision: eager rows, then compiled rows (CUDA graphs) while
#    200 s last; each row profiled for 3 more steps (kernels, GPU time, host syncs per step)
timeout -k 10 330 python3 benchmarks/gpu_check.py --profile-steps 3 --out "$OUT/gpu_check.json" --budget-seconds 200 2>&1 | tee "$OUT/gpu_check.txt"
echo "# gpu_check done at $((SECONDS - t0)) s"
# 2. BERT-base masked-LM steps (stage 1), eager only
timeout -k 10 100 python3 benchmarks/gpu_check.py --mlm --compile off --profile-steps 3 --out "$OUT/gpu_check_mlm.json" 2>&1 | tee "$OUT/gpu_check_mlm.txt"
echo "# gpu_check --mlm done at $((SECONDS - t0)) s"
# 3. the study's engine on CUDA at BERT-base's size (masked LM, seq 128; one process per run), eager
#    against compile: reduce-overhead (CUDA graphs), amp_bf16 first (its compiled row is the one that
#    matters: the engine's compiled path has never run on a GPU), then fp32, while time is left
left=$((520 - 10 - (SECONDS - t0)))  # 10: the kill grace of timeout -k
if (( left > 60 )); then
  timeout -k 10 "$left" python3 benchmarks/precision_throughput.py --device cuda --model base --max-length 128 \
    --repeats 1 --steps 80 --warmup 30 --objectives mlm --precisions amp_bf16,fp32 --compile off,reduce-overhead \
    --metrics-out "$OUT/engine_cuda_metrics.json" 2>&1 | tee "$OUT/engine_cuda.txt"
fi
echo "# device_check done in $((SECONDS - t0)) s"
