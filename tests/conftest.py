"""Suite-wide pytest settings."""

from __future__ import annotations

import os


def pytest_xdist_auto_num_workers(config):
    """`pytest -n auto`: one worker per usable CPU, at most 4. More gain little (the longest test file,
    which one worker runs alone, bounds the time) and each worker's end-to-end tests start their own
    Snakemake and torch processes."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, 4))
