"""What the study says on the console besides errors: warnings from the config, the prepared data, --cores, and
the GPU limit of a study that uses a GPU."""

from __future__ import annotations

import json
import os

from .checks import STAGES


def warmup_notes(config: dict) -> list[str]:
    """Warnings for an epochs stage whose step count is known now to be at most its timing_warmup_steps (its rates
    would include the warm-up): the rows are known for a synthetic fine-tuning task (n_train) and bounded by
    max_train_rows. A steps stage with too few steps is refused by the checks; the rest the engine says."""
    notes = []
    for stage in STAGES:
        hp, source = config["train"][stage], config["data"][stage]
        if hp["epochs"] is None:
            continue
        rows = [source.get("max_train_rows")]
        if stage == "finetune" and source["kind"] == "synthetic":
            rows.append((config["data"].get("synthetic") or {}).get("n_train"))
        rows = [r for r in rows if r is not None]
        if not rows:
            continue
        steps = max(1, int(round(hp["epochs"] * (min(rows) // hp["batch_size"]))))
        if steps <= hp["timing_warmup_steps"]:
            notes.append(f"precswitch: warning: train.{stage}: epochs {hp['epochs']:g} of at most {min(rows)} rows "
                         f"at batch_size {hp['batch_size']} is at most {steps} step(s), not more than "
                         f"timing_warmup_steps {hp['timing_warmup_steps']}: the stage's steps/s will include the "
                         "warm-up; use more epochs or fewer timing_warmup_steps")
    return notes


def prepared_notes(meta_paths) -> list[str]:
    """Warnings for the console from the prepared datasets' meta.json (precswitch prepare): source rows dropped for
    an empty text or label cell, which the prepare log alone would hide."""
    notes = []
    for path in meta_paths:
        try:
            with open(path) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        n, read = meta.get("train_rows_dropped"), meta.get("train_rows_read")
        if n:
            notes.append(f"precswitch: warning: {n}{f' of {read}' if read else ''} training rows of "
                         f"{os.path.dirname(path)} were dropped for an empty text or label cell (the verdict's "
                         "caveats say it too)")
    return notes


def threads_note(threads: int, cores: int | None) -> str | None:
    """A training job pins torch to `threads` CPU threads (its hparams; results depend on it), but Snakemake
    scales a job's threads down to --cores: more threads than cores oversubscribes them."""
    if not cores or threads <= cores:
        return None
    return (
        f"precswitch: warning: threads {threads} is more than --cores {cores}: Snakemake gives each "
        f"training job {cores} core(s), but torch runs {threads} threads in it, so the timings are "
        f"oversubscribed; run with --cores {threads} or more, or set threads: {cores}")



def gpu_limit_line(limit: int, found: int) -> str:
    """The line a local run whose training jobs use a GPU says when it sets the gpu resource limit itself."""
    return (f"precswitch: gpu limit {limit} ({found} GPU(s) found by CUDA_VISIBLE_DEVICES / nvidia-smi -L; "
            "--resources gpu=K overrides)")
