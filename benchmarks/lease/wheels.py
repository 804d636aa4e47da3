#!/usr/bin/env python3
"""The wheels a GPU lease carries: every package the pipeline needs that the GPU machine's image lacks.

The lock (wheels.lock.json) is a resolution for the GPU machine: Python 3.12, the image's versions (IMAGE_PINS,
from the device tool's KINDS.md; the pipeline-relevant ones it does not list are ASSUMED and marked so), and
ROOTS (snakemake with its report extra, datasets, jsonschema). pip resolves ROOTS under those pins; what it would
add beyond the image's packages (gpu_image_packages.txt) is locked with each wheel's file, size and requirements,
so tests/test_bench_lease.py re-checks the resolution offline.

  python benchmarks/lease/wheels.py list       # what a lease installs (name, version, MiB) and the total
  python benchmarks/lease/wheels.py lock       # re-resolve (run with a Python 3.12 holding the image's versions:
                                               # benchmarks/lease/rehearse.sh), download into .whl/, rewrite the lock
  python benchmarks/lease/wheels.py download   # fetch exactly the locked wheels into .whl/ (pip, network)

The wheels are for cp312 manylinux x86-64, fetched with --no-deps --only-binary (the device tool's README.md);
benchmarks/lease/gpu_lease.sh installs .whl/*.whl into /tmp/site there, offline, with --no-deps.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
IMAGE = HERE / "gpu_image_packages.txt"
LOCK = HERE / "wheels.lock.json"
WHEELS = ROOT / ".whl"
ROOTS = ["snakemake[reports]==9.27.1", "datasets==5.2.0", "jsonschema==4.26.0"]
PY = "3.12"
#: the image's versions: KINDS.md's pip list (known) and what the lock assumes for the rest the pipeline touches
IMAGE_PINS = {"torch": "2.11.0", "transformers": "5.17.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2",
              "tokenizers": "0.23.2", "safetensors": "0.8.0", "accelerate": "1.15.0"}
#: the image has these at versions nobody recorded; datasets bounds pyarrow (>=24) and fsspec (<=2026.9.0),
#: snakemake bounds packaging (<26): the small two are carried (they then shadow the image's), pyarrow (~45 MiB)
#: cannot be, so its version is assumed at datasets' floor and the lease prints and checks the real one first
OVERRIDE = {"fsspec": "2026.9.0", "packaging": "25.0"}
ASSUMED = {"pyarrow": "24.0.0"}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64"]
CARRY_LIMIT = 64 * 2**20  # the device tool's working tree plus carried paths
#: the markers of the GPU machine (Python 3.12.3, Linux x86-64)
ENV = {"python_version": PY, "python_full_version": PY + ".3", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython",
       "platform_python_implementation": "CPython"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages(path: Path = IMAGE) -> set[str]:
    return {norm(line.strip()) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")}


def read_lock(path: Path = LOCK) -> dict:
    return json.loads(path.read_text())


def unmet(lock: dict) -> list[str]:
    """Each requirement of a locked wheel (and of a root's extras) that the lock plus the image's pinned and
    assumed versions leave unmet for Python 3.12 on Linux: 'wheel: requirement (have X)', or '(missing)' for a
    package neither locked nor in the image."""
    from packaging.requirements import Requirement

    have = {**lock["image"], **{w["name"]: w["version"] for w in lock["wheels"]}}
    image = image_packages()
    extras = {norm(Requirement(r).name): Requirement(r).extras for r in lock["roots"]}
    out = []
    for w in lock["wheels"]:
        for r in w["requires"]:
            req = Requirement(r)
            wanted = ("",) + tuple(extras.get(w["name"], ()))
            if req.marker and not any(req.marker.evaluate({**ENV, "extra": e}) for e in wanted):
                continue
            name = norm(req.name)
            if name in have:
                if not req.specifier.contains(have[name], prereleases=True):
                    out.append(f"{w['name']}: {r} (have {have[name]})")
            elif name not in image:
                out.append(f"{w['name']}: {r} (missing)")
    return out


def image_needs(lock: dict | None = None) -> list[str]:
    """The image's packages that the locked wheels require (for Python 3.12 on Linux), by name: what a stand-in for
    the image must hold (benchmarks/lease/rehearse.sh)."""
    from packaging.requirements import Requirement

    lock = lock or read_lock()
    locked = {w["name"] for w in lock["wheels"]}
    names = {norm(Requirement(r).name) for w in lock["wheels"] for r in w["requires"]
             if not Requirement(r).marker or Requirement(r).marker.evaluate({**ENV, "extra": ""})}
    return sorted(names & image_packages() - locked)


def _resolve() -> list[dict]:
    """pip's resolution of ROOTS under the image's versions, for this interpreter (must be 3.12): the report's
    packages that the image lacks, each {name, version, requires}."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" != PY:
        raise SystemExit(f"wheels.py lock: run it with Python {PY} (the GPU machine's), not {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory() as tmp:
        pins = Path(tmp) / "image.txt"
        pins.write_text("".join(f"{n}=={v}\n" for n, v in {**IMAGE_PINS, **ASSUMED, **OVERRIDE}.items()))
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                        "--report", str(report), "-c", str(pins), *ROOTS],
                       check=True)
        got = json.loads(report.read_text())["install"]
    image = image_packages()
    return [{"name": norm(p["metadata"]["name"]), "version": p["metadata"]["version"],
             "requires": p["metadata"].get("requires_dist", [])}
            for p in got if norm(p["metadata"]["name"]) not in image or norm(p["metadata"]["name"]) in OVERRIDE]


def _pip_download(reqs: list[str], dest: Path) -> None:
    """Each requirement's cp312 wheel; a package published only as a source archive (connection-pool) is built
    into a wheel here, which must then be pure Python (``-none-any``)."""
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
        wheels = sorted(_resolve(), key=lambda w: w["name"])
        WHEELS.mkdir(exist_ok=True)
        _pip_download([f"{w['name']}=={w['version']}" for w in wheels], WHEELS)
        for w in wheels:
            path = _wheel_of(w["name"], w["version"], WHEELS)
            w.update(wheel=path.name, bytes=path.stat().st_size)
        lock = {"python": PY, "roots": ROOTS, "image": {**IMAGE_PINS, **ASSUMED}, "assumed": sorted(ASSUMED), "override": sorted(OVERRIDE),
                "wheels": wheels}
        LOCK.write_text(json.dumps(lock, indent=1) + "\n")
        cmd = "list"
    elif cmd == "download":
        WHEELS.mkdir(exist_ok=True)
        rows = read_lock()["wheels"]
        fetch = [w for w in rows  # only what is missing or not the locked file
                 if not (WHEELS / w["wheel"]).is_file() or (WHEELS / w["wheel"]).stat().st_size != w["bytes"]]
        _pip_download([f"{w['name']}=={w['version']}" for w in fetch], WHEELS)
        for w in rows:
            if (WHEELS / w["wheel"]).stat().st_size != w["bytes"]:
                raise SystemExit(f"wheels.py: {w['wheel']} is not the locked wheel ({w['bytes']} bytes)")
        cmd = "list"
    if cmd == "list":
        rows = read_lock()["wheels"]
        for w in rows:
            print(f"{w['name']:40s} {w['version']:12s} {w['bytes'] / 2**20:6.2f} MiB")
        print(f"{len(rows)} wheels, {sum(w['bytes'] for w in rows) / 2**20:.1f} MiB")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
