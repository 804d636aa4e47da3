#!/usr/bin/env python3
"""A lease's time arithmetic: the predicted wall time of benchmarks/lease/gpu_lease.sh on one H100/H200, counted with
every fixed cost, against ONE device command (600 s), which must keep at least 25% spare.

  python benchmarks/lease/lease_time.py [--compile] [--config config/gpu-lease.yaml]   # exit 1 when it does not fit
  python benchmarks/lease/lease_time.py limit LEFT KEEP   # a step's timeout (gpu_lease.sh); 0: skip the step

A training job = its steps + a fixed cost. Steps: benchmarks/gpu_hours.py's slowest estimate (the H200's step
times of benchmarks/lease/h200/, scaled to the lease's shapes: an upper estimate). Fixed cost: MEASURED on the H200,
job_fixed_s(): the median gap between the starts of 12 back-to-back engine processes there (run 1: python start,
CUDA torch imports, CUDA set-up, data, model, evaluation, checkpoint, metrics, exit) less each one's training
seconds, plus SIZE_ALLOWANCE_S for what BERT-small adds to that tiny engine (a larger model to build, write and
read, 4,000 evaluation examples; each well under a second on a GPU) and Snakemake's own time between jobs
(0.06 s a job on the CPU: 21 jobs of the tiny study, `--cores 1`, elapsed 154.9 s against 153.8 s of job
benchmarks). The rest (FIXED) is the lease's own, as the CPU rehearsal measured it on 2 cores (docs/gpu.md, "The
rehearsal"), rounded up: the rental's 16 cores are not slower."""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.util
import json
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
COMMAND_S = 600  # the device tool's limit on one command
BUDGET_S = 570  # LEASE_BUDGET_S: the command less 30 s for the tool's kill margin and the last tar
SPARE = 0.25
COMPILE_S = 30  # a stage-1 job's cold compile (CUDA graphs), and the compile preflight's own limit
#: seconds outside the training jobs, in the order the lease spends them (the CPU rehearsal's, rounded up)
FIXED = {"wheels": 15, "preflight": 15, "snakemake -n": 10,
         "synth, tokenizer, prepare x2 (side by side)": 15, "aggregate, stats, plots, verdict": 15, "report": 10,
         "tar twice": 5}
SIZE_ALLOWANCE_S = 2.0  # per job: BERT-small's build, checkpoint and evaluation beyond the tiny engine's; dispatch
ENGINE_PROCESSES = ROOT / "benchmarks" / "lease" / "h200" / "run1_engine_cuda_metrics.json"
MEASURED = [p for p in sorted((ROOT / "benchmarks" / "lease" / "h200").glob("run*_*.json")) if "gpu_check" in p.name or "prof_eager" in p.name]


def job_fixed_s(path: Path = ENGINE_PROCESSES) -> float:
    """A training job's seconds outside its steps on the GPU: the H200's measured per-process cost (the median gap
    between consecutive engine processes' starts, less the earlier one's train_seconds) + SIZE_ALLOWANCE_S."""
    runs = json.loads(Path(path).read_text())
    starts = [datetime.datetime.fromisoformat(r["started_at"]) for r in runs]
    gaps = [(b - a).total_seconds() - r["train_seconds"] for a, b, r in zip(starts, starts[1:], runs)]
    return statistics.median(gaps) + SIZE_ALLOWANCE_S


def _gpu_hours():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # gpu_hours imports gpu_check (op counts) from beside it
    spec = importlib.util.spec_from_file_location("gpu_hours", ROOT / "benchmarks" / "gpu_hours.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.lru_cache
def _jobs(config: Path, job_s: tuple[float, float]) -> tuple:
    """gpu_hours' jobs of ``config`` (slowest estimate), once per process: the op counts take seconds of CPU."""
    gh = _gpu_hours()
    cfg = gh.study_config(config)
    args = SimpleNamespace(step_overhead_ms=2.0, stage1_job_s=job_s[0], stage2_job_s=job_s[1], pretrain_rows=None,
                           finetune_rows=int(cfg["data"]["synthetic"]["n_train"]), shape=None)
    est = gh.estimate(cfg, gh.load_measurements(MEASURED), args, gh.load_references(MEASURED))
    if est["missing"]:
        raise SystemExit(f"lease_time: no H200 step time for {est['missing']}")
    return tuple((j["stage"], j["seeds"], j["run_s"][1]) for j in est["jobs"])


def predict(config: Path, compile_stage1: bool = False, job_s: tuple[float, float] | None = None) -> dict:
    """{'parts': {name: seconds}, 'total': seconds, 'spare': fraction of COMMAND_S left}; ``job_s``: the fixed
    seconds of a stage-1 and a stage-2 job (default: job_fixed_s() for both)."""
    job_s = (job_fixed_s(),) * 2 if job_s is None else job_s
    jobs_all = _jobs(Path(config), tuple(job_s))
    parts = dict(FIXED)
    for stage in ("pretrain", "finetune"):
        jobs = [(seeds, run_s) for st, seeds, run_s in jobs_all if st == stage]
        n = sum(seeds for seeds, _ in jobs)
        parts[f"{stage}: {n} jobs"] = sum(seeds * run_s for seeds, run_s in jobs)
        if stage == "pretrain" and compile_stage1:
            parts["compile preflight"] = COMPILE_S
            parts[f"pretrain: {n} cold compiles"] = COMPILE_S * n
    total = sum(parts.values())
    return {"parts": parts, "total": total, "spare": 1 - total / COMMAND_S, "job_s": job_s}


def step_limit(left: int, keep: int, floor: int = 10) -> int:
    """Seconds a step may take when ``left`` remain and ``keep`` must stay for what follows; 0 (skip the step)
    under ``floor``: never `timeout 0`, which means no limit at all."""
    s = left - keep
    return s if s >= floor else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["limit"]:  # gpu_lease.sh: `lease_time.py limit LEFT KEEP` prints step_limit's seconds
        print(step_limit(int(argv[1]), int(argv[2])))
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, default=ROOT / "config" / "gpu-lease.yaml")
    p.add_argument("--compile", action="store_true", help="stage 1 compiled (after a passed compile preflight)")
    p.add_argument("--job-s", type=float, nargs=2, metavar=("STAGE1", "STAGE2"),
                   help="fixed seconds of a stage-1 and a stage-2 job (default: measured on the H200, job_fixed_s)")
    a = p.parse_args(argv)
    got = predict(a.config, a.compile, a.job_s)
    print(f"  a training job's fixed cost: {got['job_s'][0]:.1f} s stage 1, {got['job_s'][1]:.1f} s stage 2")
    for name, s in got["parts"].items():
        print(f"  {name:46s} {s:6.0f} s")
    ok = got["spare"] >= SPARE
    print(f"predicted {got['total']:.0f} s of one {COMMAND_S} s command: {got['spare']:.0%} spare "
          f"({'fits' if ok else 'does NOT fit'}: {SPARE:.0%} required)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
