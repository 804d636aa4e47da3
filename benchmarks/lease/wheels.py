#!/usr/bin/env python3
"""The wheels a GPU lease carries: every package the pipeline needs that the GPU machine's image lacks.

The pipeline (snakemake with its report, the engine's datasets, the schema's jsonschema) needs ROOTS and what
they require; the GPU image already has the packages in gpu_image_packages.txt (copied from the device tool's
KINDS.md). What is left, at the versions of THIS environment (the one CI tests), is locked in wheels.lock with
each wheel's file name and size, so a test checks the carry without network.

  python benchmarks/lease/wheels.py list       # what a lease installs (name, version, MiB) and the total
  python benchmarks/lease/wheels.py lock       # recompute from this env, download into .whl/, rewrite wheels.lock
  python benchmarks/lease/wheels.py download   # fetch exactly the locked wheels into .whl/ (pip, network)

The wheels are for the GPU machine's Python (cp312, manylinux x86-64), fetched with --no-deps --only-binary (the
device tool's README.md); benchmarks/lease/gpu_lease.sh installs .whl/*.whl into /tmp/site there, offline.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
IMAGE = HERE / "gpu_image_packages.txt"
LOCK = HERE / "wheels.lock"
WHEELS = ROOT / ".whl"
#: what the lease's pipeline imports beyond torch/transformers: the workflow (and its --report), the engine's data
ROOTS = {"snakemake": ("reports",), "datasets": (), "jsonschema": ()}
#: the GPU machine's Python (KINDS.md: 3.12.3)
PY = "3.12"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
#: what the device tool carries at most (the checkout's tracked files plus the carried .whl/)
CARRY_LIMIT = 64 * 2**20


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages(path: Path = IMAGE) -> set[str]:
    return {norm(line.strip()) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}


def needed(requires, image: set[str], roots=ROOTS, env=None) -> dict[str, str]:
    """{name: version} of the packages ``roots`` need, transitively, that ``image`` lacks. ``requires(name)``:
    (version, [requirement strings]) of an installed package, or None if not installed. Requirements are read for
    the GPU machine's Python (``env``: marker environment); a package the image has is not walked into (its own
    needs are the image's)."""
    from packaging.requirements import Requirement

    env = env or {"python_version": PY, "python_full_version": PY + ".3", "sys_platform": "linux",
                  "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                  "implementation_name": "cpython", "platform_python_implementation": "CPython"}
    out: dict[str, str] = {}
    todo = [(norm(r), tuple(ex)) for r, ex in roots.items()]
    seen = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen or name in image:
            continue
        seen.add((name, extras))
        got = requires(name)
        if got is None:
            raise SystemExit(f"wheels.py: {name} is not installed in this environment: install the pipeline "
                             f"(pip install -e '.[dev]') before locking")
        out[name], reqs = got
        for r in reqs:
            req = Requirement(r)
            if req.marker and not any(req.marker.evaluate({**env, "extra": e}) for e in ("",) + extras):
                continue
            todo.append((norm(req.name), tuple(sorted(req.extras))))
    return out


def installed(name: str):
    import importlib.metadata as md

    try:
        d = md.distribution(name)
    except md.PackageNotFoundError:
        return None
    return d.version, list(d.requires or [])


def read_lock(path: Path = LOCK) -> list[tuple[str, str, str, int]]:
    """(name, version, wheel file, bytes) per locked wheel."""
    rows = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version, wheel, size = line.split()
            rows.append((name, version, wheel, int(size)))
    return rows


def _pip_download(reqs: list[str], dest: Path) -> None:
    """Each requirement's wheel for the GPU machine; a package published only as a source archive (connection-pool)
    is built into a wheel here, which must then be pure Python (``-none-any``)."""
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    for req in reqs:
        got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                              "--python-version", PY, "--implementation", "cp", *plat, "-d", str(dest), req],
                             capture_output=True, text=True)
        if got.returncode != 0:
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), req], check=True)
            name, version = req.split("==")
            if not _wheel_of(name, version, dest).name.endswith("-none-any.whl"):
                raise SystemExit(f"wheels.py: {req} has no wheel for cp{PY} and its build here is not pure Python")


def _wheel_of(name: str, version: str, dest: Path) -> Path:
    stem = "[-_.]".join(re.escape(part) for part in norm(name).split("-"))
    pat = re.compile(rf"^{stem}-{re.escape(version)}-", re.I)
    hits = [p for p in dest.glob("*.whl") if pat.match(p.name)]
    if len(hits) != 1:
        raise SystemExit(f"wheels.py: expected one wheel of {name}=={version} in {dest}, found {[p.name for p in hits]}")
    return hits[0]


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "list"
    if cmd == "lock":
        want = needed(installed, image_packages())
        WHEELS.mkdir(exist_ok=True)
        _pip_download([f"{n}=={v}" for n, v in sorted(want.items())], WHEELS)
        lines = ["# benchmarks/lease/wheels.py lock: the wheels a GPU lease carries (name version wheel bytes)"]
        for n, v in sorted(want.items()):
            w = _wheel_of(n, v, WHEELS)
            lines.append(f"{n} {v} {w.name} {w.stat().st_size}")
        LOCK.write_text("\n".join(lines) + "\n")
        cmd = "list"
    elif cmd == "download":
        WHEELS.mkdir(exist_ok=True)
        _pip_download([f"{n}=={v}" for n, v, _, _ in read_lock()], WHEELS)
        for n, v, w, size in read_lock():
            if (WHEELS / w).stat().st_size != size:
                raise SystemExit(f"wheels.py: {w} is not the locked wheel ({size} bytes)")
        cmd = "list"
    if cmd == "list":
        rows = read_lock()
        for n, v, w, size in rows:
            print(f"{n:40s} {v:12s} {size / 2**20:6.2f} MiB")
        print(f"{len(rows)} wheels, {sum(r[3] for r in rows) / 2**20:.1f} MiB")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
