"""benchmarks/same_results.py: two studies' tables are the same when every compared cell is, whatever their
clocks and memory say; one differing loss (or a missing row, unless --partial) makes them different."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "same_results.py"


def _study(root: Path, loss: float, seconds: float, rows: int = 2) -> Path:
    root.mkdir()
    pd.DataFrame({"run_id": [f"r{i}" for i in range(rows)], "eval_loss": [loss + i for i in range(rows)],
                  "eval_masked_tokens": [2757] * rows, "train_seconds": [seconds] * rows,
                  "peak_memory_bytes": [seconds * 1e6] * rows}).to_csv(root / "runs.csv", index=False)
    pd.DataFrame({"schedule": ["a"], "seed": [1], "accuracy": [0.5], "total_train_seconds": [seconds]}).to_csv(
        root / "schedules.csv", index=False)
    return root


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_times_and_memory_are_left_out_and_a_loss_is_compared_bit_for_bit(tmp_path):
    before = _study(tmp_path / "before", 2.078, 90.0)
    assert _run(before, _study(tmp_path / "slower", 2.078, 400.0)).returncode == 0
    r = _run(before, _study(tmp_path / "other", 2.0780000000000003, 90.0))
    assert r.returncode == 1 and "DIFFERS r0 eval_loss" in r.stdout


def test_a_missing_row_fails_unless_partial(tmp_path):
    before = _study(tmp_path / "before", 2.078, 90.0)
    fewer = _study(tmp_path / "fewer", 2.078, 90.0, rows=1)
    assert _run(before, fewer).returncode == 1
    assert _run(before, fewer, "--partial").returncode == 0
