"""Fault injection on the whole grid: kill -9 the running snakemake (and its jobs) in the middle of the grid; the
rerun is refused until the stale lock is removed (`--unlock`, as the README says), then runs only the unfinished
jobs: every finished output is byte-identical with an unchanged mtime."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from workflow_helpers import CONFIGS, SNAKEFILE, snakemake

pytestmark = pytest.mark.slow


def _one_seed(tmp_path: Path, finetune_steps: int | None = None) -> list[Path]:
    """tests/configs/tiny.yaml with one seed (6 stage runs): enough of a grid to kill mid-way.
    ``finetune_steps``: longer fine-tuning (a tiny one takes ~0.3 s warm: the rest of the grid can end
    within a second of the second finished run)."""
    extra = tmp_path.parent / f"{tmp_path.name}-one-seed.yaml"
    more = f"train:\n  finetune:\n    steps: {finetune_steps}\n" if finetune_steps else ""
    extra.write_text("seeds: [1]\n" + more)
    return [CONFIGS / "tiny.yaml", extra]


def _start(workdir: Path, cfg: list[Path]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "-d", str(workdir), "--cores", "2",
           "--configfile", *map(str, cfg)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # own process group: kill -9 takes its jobs too


def _wait(pred, proc: subprocess.Popen, timeout: float, what: str) -> None:
    t = time.time()
    while not pred():
        if proc.poll() is not None:
            raise AssertionError(f"snakemake ended before {what}:\n{proc.stdout.read()[-4000:]}")
        if time.time() - t > timeout:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _incomplete(workdir: Path) -> set[Path]:
    """Outputs Snakemake still marks incomplete (a job it started and never saw finish).

    Markers are files under .snakemake/incomplete named by the url-safe base64 of the output path,
    split into path segments ('@' marks a continued segment).
    """
    root = workdir / ".snakemake" / "incomplete"
    out = set()
    for f in root.rglob("*") if root.exists() else []:
        if f.is_file() and f.name != "migration_underway":
            b64 = "".join(part.lstrip("@") for part in f.relative_to(root).parts)
            name = base64.urlsafe_b64decode(b64).decode()
            out.add((workdir / name).resolve())
    return out


def _finished(workdir: Path) -> dict[Path, tuple[bytes, int]]:
    """metrics.json of every stage run that Snakemake saw finish."""
    runs = workdir / "results" / "runs"
    if not runs.exists():
        return {}
    skip = _incomplete(workdir)
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in runs.rglob("metrics.json") if p.resolve() not in skip}


def test_kill_grid_midway_then_rerun_only_unfinished(tmp_path):
    cfg = _one_seed(tmp_path, finetune_steps=300)
    p = _start(tmp_path, cfg)
    # mid-grid: at least two stage runs are finished, the study is not
    _wait(lambda: len(_finished(tmp_path)) >= 2, p, 600, "two finished stage runs")
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    before = _finished(tmp_path)
    assert len(before) < 6, "killed too late: every stage run had already finished (the test's window missed)"
    assert not (tmp_path / "results" / "runs.csv").exists()

    # the stale lock refuses a rerun, clearly
    r = snakemake(tmp_path, "--cores", "2", "--configfile", *cfg, timeout=120)
    assert r.returncode != 0 and "LockException" in (r.stdout + r.stderr)
    snakemake(tmp_path, "--unlock", "--configfile", *cfg, timeout=120, check=True)

    r = snakemake(tmp_path, "--cores", "2", "--configfile", *cfg, timeout=1200, check=True)
    assert (tmp_path / "results" / "runs.csv").exists()
    after = _finished(tmp_path)
    for path, (data, mtime) in before.items():
        assert after[path] == (data, mtime), f"{path} was rerun or changed"
    assert len(after) > len(before)
    for path in before:  # none of the finished jobs was run again
        stage_dir = path.parent.relative_to(tmp_path)
        assert f"output: {stage_dir}/metrics.json" not in r.stdout + r.stderr

