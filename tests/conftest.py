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


def pytest_collection_modifyitems(config, items):
    """Files with a `slow` test (the end-to-end studies, minutes each) run first: with `--dist loadfile`
    the workers hand out files in this order, so the long ones start at once, side by side, and the short
    files fill the gaps, instead of one long file starting last on a worker while the others sit idle."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: the order within each group is kept
