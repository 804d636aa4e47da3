#!/usr/bin/env bash
# Wheels for a lent GPU machine that has CUDA torch, transformers, pandas, scikit-learn, nvidia-ml-py
# but lacks what the engine and the fp8 rows need (the H200 image of /work/.library/device/KINDS.md:
# no datasets, no torchao). Run here, in the repository root, where pip reaches PyPI; the device
# command (benchmarks/device_check.sh) installs them from .whl/ without any network.
#   bash benchmarks/device_wheels.sh            # -> .whl/*.whl (ignored by git through .git/info/exclude)
# Versions: datasets as pinned here; torchao 0.18 is the release built for torch 2.11 (the image's).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
PY=${PY_VERSION:-3.12}
plat=()
for n in 28 27 17; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for req in "datasets==${DATASETS_VERSION:-5.2.0}" "dill==${DILL_VERSION:-0.4.1}" \
           "multiprocess==${MULTIPROCESS_VERSION:-0.70.19}" "torchao==${TORCHAO_VERSION:-0.18.0}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
    "${plat[@]}" -d .whl "$req"
done
ls -la .whl
du -sh .whl
