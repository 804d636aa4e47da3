"""GPU checks of a real run, before any job starts (only they import torch)."""

from __future__ import annotations

from .checks import refuse_gpu_only
from .validate import ConfigError


def check_cuda_build(device: str) -> None:
    """A cluster run whose jobs use this interpreter's environment on GPU nodes: a CPU-only torch here fails
    every training job there, after its wait in the queue and its retries. A CUDA build is known without a GPU
    (torch.version.cuda)."""
    if not device.startswith("cuda"):
        return
    import sys

    import torch

    if torch.version.cuda is None and not getattr(torch.version, "hip", None):
        raise ConfigError(
            "device", f"{device}, but torch {torch.__version__} in {sys.prefix}, which the cluster jobs run, is a "
                      "CPU-only build: every training job would fail on its GPU node; install a CUDA build of torch "
                      "there (README, docs/slurm.md)")


def check_gpu(study, jobs: list, gpu_limit: int | None) -> str | None:
    """A local run's training jobs, ``jobs`` as (stage, name) with name the stage-1 run or the schedule: with
    device cuda they need a GPU torch can see; with device auto and none, they train on the CPU, which must run
    their precisions. Said before any job starts, instead of when the first training job fails. Returns a note
    when the gpu resource limit is not one training job per visible GPU."""
    config = study.config
    device = str(config["device"])
    if not (device.startswith("cuda") or device == "auto") or not jobs:
        return None
    import torch

    from ..gpu import gpu_limit_note

    if torch.cuda.is_available():
        return gpu_limit_note(gpu_limit, torch.cuda.device_count(), len(jobs), device)
    if device != "auto":
        raise ConfigError(
            "device", f"{config['device']}, but this machine has no CUDA GPU that torch {torch.__version__} can "
                      f"see, and {len(jobs)} training jobs would run here; run on a GPU machine, install a CUDA "
                      "build of torch (README), or set device: cpu")
    # auto without a GPU is cpu: refuse what a CPU cannot run, before any job
    where = f"device is auto and torch {torch.__version__} sees no CUDA GPU here"
    for stage, name in jobs:
        if stage == "pretrain":
            spec = study.stage1[name]
            schedule = next(n for n, st in study.schedules.items() if st.get("pretrain") == spec)
        else:
            schedule, spec = name, study.schedules[name]["finetune"]
        refuse_gpu_only(spec, config["train"][stage], f"schedules.{schedule}.{stage}", where, stage)
    return None

