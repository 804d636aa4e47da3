#!/usr/bin/env bash
# Wheels for a GPU machine without pip access that has CUDA torch, transformers, pandas,
# scikit-learn and nvidia-ml-py but lacks what the engine and the fp8 rows need (datasets, torchao).
# Run it, in the repository root, on a machine where pip reaches PyPI; copy the repository with .whl/
# to the GPU machine, where benchmarks/lease/device_check.sh installs them without any network.
#   bash benchmarks/lease/device_wheels.sh            # -> .whl/*.whl (ignored by git through info/exclude)
# Versions: datasets as pinned here; torchao 0.18 is the release built for torch 2.11
# (PY_VERSION: the GPU machine's python, default 3.12).
set -euo pipefail
cd "$(dirname "$0")/../.."
# keep .whl/ out of git, in the exclude file git itself reads (in a worktree .git is a file; outside git: nothing)
if exclude=$(git rev-parse --git-path info/exclude 2>/dev/null); then
  mkdir -p "$(dirname "$exclude")"
  grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
fi
PY=${PY_VERSION:-3.12}
plat=()
for n in 28 27 17; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for req in "datasets==${DATASETS_VERSION:-5.2.0}" "dill==${DILL_VERSION:-0.4.1}" \
           "multiprocess==${MULTIPROCESS_VERSION:-0.70.19}" "torchao==${TORCHAO_VERSION:-0.18.0}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
    "${plat[@]}" -d .whl "$req"
done
# fallback, installed by device_check.sh only if the machine's pyarrow is older than datasets needs
# (datasets 5.2 asks pyarrow >= 24, fsspec <= 2026.9.0; --no-deps checks neither). ~55 MB: .whl/
# stays under the device tool's 64 MiB carry limit with the repository.
for req in "pyarrow==${PYARROW_VERSION:-26.0.1}" "fsspec==${FSSPEC_VERSION:-2026.9.0}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
    "${plat[@]}" -d .whl/fallback "$req"
done
ls -la .whl .whl/fallback
du -sh .whl
