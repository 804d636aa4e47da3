"""The finished runs a rerun would replace, kept under <results_dir>/previous/ (Snakemake deletes a job's old
outputs when it starts it again)."""

from __future__ import annotations

import os
import shutil


def _link_or_copy(src, dst):
    """Hard-link a large file (a checkpoint's weights: no copy, no space until the rerun replaces the original;
    the engine writes every file anew, never in place), copy a small one."""
    if os.path.getsize(src) > (1 << 20):
        try:
            os.link(src, dst)
            return dst
        except OSError:  # another filesystem, or links not allowed: copy
            pass
    return shutil.copy2(src, dst)


def keep_previous_runs(runs: list, results_dir: str, previous_dir: str) -> list[str]:
    """Snakemake deletes a job's old outputs when it starts it again (its params, code or inputs changed, or
    -R), so a rerun that then fails would leave the finished run gone. Of ``runs``, (metrics.json, log files)
    of each training job that will run, keep each finished one (its run dir, less resume/, and its logs) under
    ``previous_dir`` at its path relative to ``results_dir``, the latest previous version of each. Returns the
    kept run dirs (relative)."""
    kept = []
    for metrics, logs in runs:
        if not os.path.isfile(metrics):
            continue  # nothing finished to lose: a new run, or an interrupted one (resume/ stays put)
        run_dir = os.path.dirname(metrics)
        rel = os.path.relpath(run_dir, results_dir)
        dst = os.path.join(previous_dir, rel)
        tmp = f"{dst}.incoming"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(run_dir, tmp, copy_function=_link_or_copy, ignore=shutil.ignore_patterns("resume"))
        for log in logs:
            if os.path.isfile(log):
                shutil.copy2(log, os.path.join(tmp, os.path.basename(log)))
        shutil.rmtree(dst, ignore_errors=True)
        os.replace(tmp, dst)
        kept.append(rel)
    return kept

