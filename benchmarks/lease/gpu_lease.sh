#!/usr/bin/env bash
# The GPU lease run: ONE device-tool command (600 s at most) on one H100/H200, the study first and whole:
#   1. installs the carried wheels (.whl/, benchmarks/lease/wheels.lock.json) into $PRECSWITCH_SITE, offline, once
#      per machine; 2. preflight (benchmarks/lease/preflight.py, `snakemake -n`): versions, the carry's bounds, a
#      datasets round trip, the run bit; any failure stops here, one line naming what to carry;
#   3. stage 1 compiled only if LEASE_COMPILE=on, or =auto and a 30 s compile preflight passed (default off: eager);
#   4. the pipeline (--keep-going; --nolock: a cut run leaves no lock for the next call) with the whole budget less
#      what the report and the tars need; its results are tarred at once
#      (no resume states, checkpoints or prepared data; checked under 16 MiB);
#   5. the report, then gpu_check and job_overhead only in what is left; the tar again at the end.
# $OUT gets at most 6 files (the tool brings back 8 of 16 MiB): lease.log, results.tar.gz, compile_preflight.json,
# gpu_check_mlm.json, gpu_check.json, job_overhead.json. The run's commit is LEASE_COMMIT (no .git travels).
#   LEASE_COMMIT=$(git rev-parse HEAD) OUT=... bash benchmarks/lease/gpu_lease.sh     # docs/gpu.md: the exact call
#   bash benchmarks/lease/gpu_lease.sh --cpu-smoke   # the same steps on a CPU, scaled down (rehearse.sh, tests)
# A second call on a still-warm machine resumes: installed wheels and results/ are kept, done jobs are not rerun.
set -uo pipefail
cd "$(dirname "$0")/../.."
SMOKE=0
[[ ${1:-} == --cpu-smoke ]] && SMOKE=1
OUT=${OUT:-lease-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/lease.log") 2>&1
t0=$SECONDS
BUDGET=${LEASE_BUDGET_S:-570}
left() { echo $((BUDGET - (SECONDS - t0))); }
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# bytecode: the carried wheels are compiled as they install, and a module without its .pyc gets one at its first
# import instead of being compiled again in each of the study's ~30 processes (this workplace's machines set
# PYTHONDONTWRITEBYTECODE=1: transformers' BERT then took 16.9 s to import, 5.1 s with bytecode)
unset PYTHONDONTWRITEBYTECODE
PY=${PYTHON:-python3}
# seconds a step may take keeping $1 back; 0 (skip it) under 10 s: never `timeout 0`, which means no limit
limit() { "$PY" benchmarks/lease/lease_time.py limit "$(left)" "$1"; }
CONFIGS=(config/gpu-lease.yaml)
RESULTS=results/gpu-lease
if (( SMOKE )); then CONFIGS+=(benchmarks/lease/cpu-smoke.yaml); RESULTS=results/gpu-lease-smoke; fi
mkdir -p "$RESULTS"
COMMIT=${LEASE_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
echo "$COMMIT" > "$RESULTS/lease-commit.txt"
export PRECSWITCH_GIT_COMMIT=$COMMIT  # every metrics.json's git_commit (precswitch.measure): no .git travels
echo "# lease: $(date -u +%FT%TZ) commit=$COMMIT smoke=$SMOKE budget=${BUDGET}s configs=${CONFIGS[*]}"

# the results without what is large or private to a run (resume states, checkpoints, prepared data), under 16 MiB
pack() {
  tar -czf "$OUT/results.tar.gz" --exclude="$RESULTS/data" --exclude="$RESULTS/previous" --exclude='*/checkpoint' \
    --exclude='*/resume' --exclude='*/resume.stale-*' --exclude='*.pt' --exclude='*.safetensors' "$RESULTS" 2>/dev/null
  local size; size=$(stat -c %s "$OUT/results.tar.gz")
  if (( size > 16 * 1024 * 1024 )); then
    echo "lease: results.tar.gz is $size bytes, over the 16 MiB a result file may have: packing without steps.csv"
    tar -czf "$OUT/results.tar.gz" --exclude="$RESULTS/data" --exclude="$RESULTS/previous" --exclude='*/checkpoint' \
      --exclude='*/resume' --exclude='*/resume.stale-*' --exclude='*.pt' --exclude='*.safetensors' \
      --exclude='steps.csv' "$RESULTS"; size=$(stat -c %s "$OUT/results.tar.gz")
  fi
  echo "# results.tar.gz $size bytes at $((SECONDS - t0)) s ($1)"
}

# 1. carried wheels (a warm machine keeps the site: install once)
SITE=${PRECSWITCH_SITE:-/tmp/site}
if compgen -G ".whl/*.whl" > /dev/null && [[ ! -f $SITE/.precswitch-wheels ]]; then
  "$PY" -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    && touch "$SITE/.precswitch-wheels"
fi
[[ -d $SITE ]] && export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
echo "# wheels at $((SECONDS - t0)) s"

# 2. preflight: fail fast, before any job
[[ -x workflow/scripts/precswitch ]] || chmod +x workflow/scripts/precswitch 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null || echo "# no nvidia-smi"
"$PY" benchmarks/lease/preflight.py || { echo "# lease stopped by its preflight at $((SECONDS - t0)) s"; exit 3; }
echo "# preflight.py at $((SECONDS - t0)) s"
SMK=("$PY" -m snakemake --cores all --keep-going --rerun-incomplete --nolock --configfile "${CONFIGS[@]}")
# 3. stage 1 eager unless compile is asked for and (auto) a 30 s compile preflight passed in this lease; the
#    decision is kept in results/ so that a resuming call runs the same config (a changed one reruns jobs)
OVERLAY=$RESULTS/lease-overlay.yaml
if [[ ! -f $OVERLAY ]]; then
  mode=${LEASE_COMPILE:-off}
  if [[ $mode == auto ]]; then
    dev=$( (( SMOKE )) && echo "--device cpu --quick" || echo "--small --mlm --batch 128")
    if timeout -k 5 30 "$PY" benchmarks/gpu_check.py $dev --compile only --steps 3 --warmup 2 --precisions amp_bf16 \
         --out "$OUT/compile_preflight.json" > /dev/null 2>&1; then mode=on; else mode=off; fi
    echo "# compile preflight: $( [[ $mode == on ]] && echo passed || echo 'failed or over 30 s: stage 1 eager')"
  fi
  if [[ $mode == on ]]; then
    printf 'train:\n  pretrain: {compile: reduce-overhead}\nmodel: {attn_implementation: sdpa}\n' > "$OVERLAY"
  else
    echo "{}" > "$OVERLAY"
  fi
fi
SMK+=("$OVERLAY")
echo "# stage 1: $(grep -q compile "$OVERLAY" && echo 'compiled (reduce-overhead), sdpa' || echo eager)"
"${SMK[@]}" -n -q > /dev/null 2>"$OUT/.dryrun" || { tail -5 "$OUT/.dryrun"; rm -f "$OUT/.dryrun"
  echo "lease: snakemake -n failed (above): carry what it names"; exit 3; }
rm -f "$OUT/.dryrun"
echo "# preflight passed at $((SECONDS - t0)) s"

# 4. the study, whole: everything left but what the report and the tars need (40 s)
t=$(limit 40)
rc=124
if (( t > 0 )); then
  timeout -k 10 "$t" "${SMK[@]}"
  rc=$?
fi
echo "# pipeline exit $rc at $((SECONDS - t0)) s (limit ${t} s)"
pack "after the pipeline"
t=$(limit 10)
if (( t > 0 )); then
  timeout -k 5 $(( t < 60 ? t : 60 )) "${SMK[@]}" --report "$RESULTS/report.html" > /dev/null 2>&1 \
    && echo "# report at $((SECONDS - t0)) s" || echo "# report failed or cut"
fi

# 5. the checks, only after a finished study and only in what is left
if (( rc == 0 && ! SMOKE )) && t=$(limit 60) && (( t > 0 )); then
  timeout -k 5 $(( t < 50 ? t : 50 )) "$PY" benchmarks/gpu_check.py --small --mlm --batch 128 --compile off --steps 20 \
    --precisions fp32,tf32,amp_fp16,amp_bf16,pure_fp16,pure_bf16 --out "$OUT/gpu_check_mlm.json" || echo "# gpu_check --mlm: exit $?"
fi
if (( rc == 0 && ! SMOKE )) && t=$(limit 45) && (( t > 0 )); then
  timeout -k 5 $(( t < 35 ? t : 35 )) "$PY" benchmarks/gpu_check.py --small --compile off --steps 20 \
    --precisions fp32,tf32,amp_fp16,amp_bf16 --out "$OUT/gpu_check.json" || echo "# gpu_check: exit $?"
fi
if (( rc == 0 )) && t=$(limit 15) && (( t > 0 )); then
  MERGED=$(mktemp --suffix .yaml)
  "$PY" - "${CONFIGS[@]}" "$OVERLAY" > "$MERGED" <<'PYEOF'
import sys, yaml
from snakemake.utils import update_config
cfg = yaml.safe_load(open("config/config.yaml"))
for path in sys.argv[1:]:
    update_config(cfg, yaml.safe_load(open(path)) or {})
print(yaml.safe_dump(cfg))
PYEOF
  timeout -k 5 "$t" "$PY" benchmarks/job_overhead.py --config "$MERGED" --repeats 1 \
    --steps $(( SMOKE ? 2 : 30 )) --json-out "$OUT/job_overhead.json" || echo "# job_overhead: exit $?"
fi
pack "at the end"
ls -la "$OUT"
echo "# lease done in $((SECONDS - t0)) s (pipeline exit $rc)"
exit $rc
