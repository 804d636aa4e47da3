#!/usr/bin/env python3
"""A lease's checks before its pipeline (benchmarks/lease/gpu_lease.sh), seconds in all: the versions that decide
whether the carried wheels work on the image, the pipeline's own bounds on them (--no-deps installs check none), a
datasets save/load round trip, and the run bit of workflow/scripts/precswitch. Each failure is one line naming what
to carry or fix; exit 3 when any failed (`snakemake -n` follows in the script)."""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHOWN = ["torch", "transformers", "huggingface-hub", "tokenizers", "numpy", "pyarrow", "fsspec", "packaging",
         "datasets", "snakemake", "jsonschema", "pandas"]
CHECKED = {"datasets": (), "snakemake": ("reports",), "transformers": ()}  # whose requirements must hold here


def version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def unmet(name: str, extras=()) -> list[str]:
    """'carry X' lines for each requirement of installed ``name`` that this environment does not satisfy."""
    from packaging.requirements import Requirement

    out = []
    for r in md.distribution(name).requires or []:
        req = Requirement(r)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in ("",) + tuple(extras)):
            continue
        have = version(req.name)
        if have is None or not req.specifier.contains(have, prereleases=True):
            out.append(f"lease: {name} {version(name)} needs {req}, the image has {have or 'none'}: "
                       f"carry a wheel of {req.name} that satisfies it (benchmarks/lease/wheels.py)")
    return out


def main() -> int:
    print("python", platform.python_version(), "|", " ".join(f"{n} {version(n)}" for n in SHOWN))
    try:
        import torch

        print("torch cuda", torch.version.cuda, "available", torch.cuda.is_available(),
              torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
    except Exception as e:  # noqa: BLE001 - one line, whatever broke
        print(f"lease: import torch failed ({type(e).__name__}: {e}): the image's torch is broken")
        return 3
    bad = [f"lease: {n} does not import: carry it (benchmarks/lease/wheels.py download, carry .whl)"
           for n in CHECKED if version(n) is None]
    for n, extras in CHECKED.items():
        bad += unmet(n, extras) if version(n) else []
    try:
        import datasets

        datasets.disable_progress_bars()
        with tempfile.TemporaryDirectory() as tmp:
            datasets.Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]}).save_to_disk(tmp)
            back = datasets.load_from_disk(tmp)
            assert back["label"] == [0, 1] and back["text"] == ["a", "b"], back
    except Exception as e:  # noqa: BLE001
        bad.append(f"lease: datasets save/load round trip failed ({type(e).__name__}: {e}): "
                   f"carry what it names (benchmarks/lease/wheels.py)")
    run = ROOT / "workflow" / "scripts" / "precswitch"
    if not os.access(run, os.X_OK):
        bad.append(f"lease: {run.relative_to(ROOT)} is not executable (its run bit did not travel): chmod +x it "
                   f"before the pipeline")
    for line in bad:
        print(line)
    return 3 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
