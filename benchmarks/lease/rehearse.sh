#!/usr/bin/env bash
# The lease's dress rehearsal on this CPU, mirroring the rental (docs/gpu.md, "The rehearsal"):
#   1. a Python 3.12 venv holding the GPU image's versions (benchmarks/lease/wheels.py IMAGE_PINS and ASSUMED;
#      torch 2.11.0 is PyPI's CUDA build, which imports without a GPU; the rest of what the pipeline imports at
#      pip's choice), WITHOUT the carried packages;
#   2. .whl/ from the lock (--lock: re-resolve it first, in that venv), and the carry's size;
#   3. gpu_lease.sh --cpu-smoke as the lease runs it: a fresh --target site, PYTHONPATH, OUT with its limits;
#      once eager, once with stage 1 compiled and SDPA (LEASE_COMPILE=on), once cut off mid-study (the tar);
#   then a summary: versions, install time, carry size, wall times, what came back.
#   nice -n 15 bash benchmarks/lease/rehearse.sh [--lock]      # ~15 min on 2 loaded cores, ~5 GB of venv
set -euo pipefail
cd "$(dirname "$0")/../.."
PY312=${PY312:-/root/.pyenv/versions/3.12.1/bin/python}
VENV=${REHEARSAL_VENV:-.venv312}
WORK=${REHEARSAL_DIR:-rehearsal}
rm -rf "$WORK" && mkdir -p "$WORK"
[[ -x $VENV/bin/python ]] || "$PY312" -m venv "$VENV"
"$VENV/bin/pip" install -q packaging  # the image has it; wheels.py reads the lock's requirements with it
# the image's pinned versions, and every other image package the carry or the pipeline imports (pip's choice)
image=$("$VENV/bin/python" -c "
import sys; sys.path.insert(0, 'benchmarks/lease'); import wheels
print(' '.join(f'{n}=={v}' for n, v in {**wheels.IMAGE_PINS, **wheels.ASSUMED}.items()), *wheels.image_needs())")
"$VENV/bin/pip" install -q $image scipy statsmodels scikit-learn matplotlib seaborn pygments
for carried in snakemake datasets jsonschema; do
  "$VENV/bin/python" -c "import $carried" 2>/dev/null && { echo "rehearse: $VENV has $carried: the image has not"; exit 2; }
done
[[ ${1:-} == --lock ]] && "$VENV/bin/python" benchmarks/lease/wheels.py lock
"$VENV/bin/python" benchmarks/lease/wheels.py download > "$WORK/wheels.txt"
tracked=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s}')
whl=$(du -cb .whl/*.whl | tail -1 | cut -f1)
echo "carry: .whl $((whl / 1024)) KiB + tracked files $((tracked / 1024)) KiB = $(( (whl + tracked) / 1048576 )) MiB of 64" \
  | tee "$WORK/carry.txt"

lease() {  # NAME, then env settings: one lease from a bare site, as on a fresh machine
  local name=$1; shift
  rm -rf results/gpu-lease-smoke "$WORK/site-$name"
  local t=$SECONDS
  env OUT="$WORK/$name" PYTHON="$VENV/bin/python" PRECSWITCH_SITE="$WORK/site-$name" LEASE_COMMIT="$(git rev-parse HEAD)" \
    PATH="$PWD/$VENV/bin:$PATH" "$@" bash benchmarks/lease/gpu_lease.sh --cpu-smoke > /dev/null 2>&1 || true
  echo "$name: wall $((SECONDS - t)) s, exit $(grep -o 'pipeline exit [0-9]*' "$WORK/$name/lease.log" | head -1)"
  ls -l "$WORK/$name" | awk 'NR > 1 {print "  ", $5, $9}'
  # each job's wall seconds (its Snakemake benchmark file), and their sums by kind: training, data, analysis
  find results/gpu-lease-smoke/benchmarks -name '*.tsv' 2>/dev/null | sort | while read -r f; do
    echo "${f#results/gpu-lease-smoke/benchmarks/} $(tail -1 "$f" | cut -f1)"; done > "$WORK/$name/jobs.txt"
  awk '{split($1, a, "/"); k = (a[1] == "pretrain" || a[1] == "finetune") ? "training" : a[1]; n[k]++; s[k] += $2}
       END {for (k in n) printf "  %s: %d jobs, %.1f s\n", k, n[k], s[k]}' "$WORK/$name/jobs.txt"
}
# REHEARSAL_RUNS picks (a subset of) the three runs
for run in ${REHEARSAL_RUNS:-eager compiled cut}; do
  case $run in
    eager) lease eager LEASE_BUDGET_S=1500 ;;
    compiled) lease compiled LEASE_BUDGET_S=1500 LEASE_COMPILE=on ;;
    cut) lease cut LEASE_BUDGET_S=120  # past the preflight (~40-90 s here), cut inside the pipeline
         tar -tzvf "$WORK/cut/results.tar.gz" | awk '{n++; s+=$3} END {print "cut: results.tar.gz holds", n, "entries,", s, "bytes"}' ;;
  esac
  grep -h '^python \|^# wheels at\|^# preflight\|stage 1:\|pipeline exit\|results.tar.gz\|^# report at' "$WORK/$run/lease.log"
done | tee "$WORK/summary.txt"
