#!/usr/bin/env bash
# The GPU lease run: ONE command of at most 9 minutes on one H100/H200 (docs/gpu.md, "A lease run"):
#   1. installs the carried wheels (.whl/, from benchmarks/lease/wheels.py: snakemake, datasets, jsonschema and
#      what they need that the GPU image lacks) into /tmp/site, offline;
#   2. runs the real pipeline, `snakemake --cores all --configfile config/gpu-lease.yaml` (synthetic data made by
#      the pipeline itself: nothing to download), then its HTML report;
#   3. a short benchmarks/gpu_check.py (BERT-small step times, eager) and benchmarks/job_overhead.py (a job's fixed
#      cost by piece), while time is left;
#   4. tars what it made into $OUT (the device tool brings back at most 8 files, 16 MiB each, 2 folders deep):
#      lease.log (all it printed), results.tar.gz (verdict, report HTML, tables, plots, metrics, logs; no
#      checkpoints), gpu_check_mlm.json, gpu_check.json, job_overhead.json.
# Each step runs under `timeout`, inside LEASE_BUDGET_S (default 530 s) in all.
#   bash benchmarks/lease/gpu_lease.sh               # on the GPU machine, OUT set by the device tool
#   bash benchmarks/lease/gpu_lease.sh --cpu-smoke   # the same steps on a CPU, model and steps scaled down (CI)
set -uo pipefail
cd "$(dirname "$0")/../.."
SMOKE=0
[[ ${1:-} == --cpu-smoke ]] && SMOKE=1
OUT=${OUT:-lease-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/lease.log") 2>&1
t0=$SECONDS
BUDGET=${LEASE_BUDGET_S:-530}
left() { echo $((BUDGET - (SECONDS - t0))); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY=${PYTHON:-python3}
CONFIGS=(config/gpu-lease.yaml)
RESULTS=results/gpu-lease
if (( SMOKE )); then
  CONFIGS+=(benchmarks/lease/cpu-smoke.yaml)
  RESULTS=results/gpu-lease-smoke
fi
echo "# lease: $(date -u +%FT%TZ) smoke=$SMOKE budget=${BUDGET}s configs=${CONFIGS[*]}"

# 1. carried wheels (a warm machine keeps /tmp/site: install once)
SITE=${PRECSWITCH_SITE:-/tmp/site}
if compgen -G ".whl/*.whl" > /dev/null && [[ ! -f $SITE/.precswitch-wheels ]]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    && touch "$SITE/.precswitch-wheels"
fi
[[ -d $SITE ]] && export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import snakemake, datasets, jsonschema, pygments" ; then
  echo "lease: the pipeline's packages do not import: run 'python benchmarks/lease/wheels.py download' and carry .whl"
  exit 3
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>/dev/null || echo "# no nvidia-smi"
"$PY" -c "import torch, transformers, snakemake, datasets; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'snakemake', snakemake.__version__, 'datasets', datasets.__version__)"
echo "# wheels and versions at $((SECONDS - t0)) s"

# 2. the pipeline, then its report; what is left after it goes to the checks (at least 90 s kept for them)
# ONE --configfile with every file: a second --configfile would replace the first, not merge over it
SMK=("$PY" -m snakemake --cores all --rerun-incomplete --configfile "${CONFIGS[@]}")
timeout -k 10 $(( $(left) - 90 )) "${SMK[@]}"
rc=$?
echo "# pipeline exit $rc at $((SECONDS - t0)) s"
timeout -k 5 60 "${SMK[@]}" --report "$RESULTS/report.html" || echo "# report failed"
echo "# report at $((SECONDS - t0)) s"

# 3. the GPU check (BERT-small steps, eager) and a job's fixed cost by piece, while time is left
# (BERT-small at config/bert-small-scratch.yaml's shapes: its stage-1 masked LM at batch 128, its stage-2
# classification at batch 32; eager, for benchmarks/gpu_hours.py without --extrapolate)
if (( ! SMOKE && $(left) > 100 )); then
  timeout -k 5 50 "$PY" benchmarks/gpu_check.py --small --mlm --batch 128 --compile off --steps 20 \
    --precisions fp32,tf32,amp_fp16,amp_bf16,pure_fp16,pure_bf16 --out "$OUT/gpu_check_mlm.json" || echo "# gpu_check --mlm: exit $?"
fi
if (( ! SMOKE && $(left) > 70 )); then
  timeout -k 5 35 "$PY" benchmarks/gpu_check.py --small --compile off --steps 20 --precisions fp32,tf32,amp_fp16,amp_bf16 \
    --out "$OUT/gpu_check.json" || echo "# gpu_check: exit $?"
fi
if (( $(left) > 40 )); then
  # at the lease study's own settings (its model, device and compile): its configs merged as the workflow merges them
  MERGED=$(mktemp --suffix .yaml)
  "$PY" - "${CONFIGS[@]}" > "$MERGED" <<'PYEOF'
import sys, yaml
from snakemake.utils import update_config
cfg = yaml.safe_load(open("config/config.yaml"))
for path in sys.argv[1:]:
    c = yaml.safe_load(open(path))
    update_config(cfg, c)
    cfg["schedules"] = c.get("schedules", cfg["schedules"])
print(yaml.safe_dump(cfg))
PYEOF
  timeout -k 5 $(( $(left) - 15 )) "$PY" benchmarks/job_overhead.py --config "$MERGED" --repeats 1 \
    --steps $(( SMOKE ? 2 : 30 )) --json-out "$OUT/job_overhead.json" || echo "# job_overhead: exit $?"
fi

# 4. everything the study made but its checkpoints, in one file
tar -czf "$OUT/results.tar.gz" --exclude='*/checkpoint' --exclude='*/checkpoint/*' "$RESULTS" 2>/dev/null
ls -la "$OUT"
echo "# lease done in $((SECONDS - t0)) s (pipeline exit $rc)"
exit $rc
