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
    """Files with a `slow` test (the end-to-end studies, minutes each) run first, then the other files largest
    first: with `--dist loadfile` the workers hand out files in this order, so the long ones start at once, side
    by side, and the short files fill the gaps at the end, instead of one long file (test_workflow.py's dry runs:
    ~50 s) starting last on a worker while the other sits idle."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    # stable sort on a per-file key: the tests of a file keep their order
    items.sort(key=lambda item: (item.path not in slow, -item.path.stat().st_size))
