#!/usr/bin/env python3
"""A lease's time arithmetic: the predicted wall time of benchmarks/lease/gpu_lease.sh on one H200, counted with
every fixed cost, against ONE device command (600 s), which must keep at least 25% spare.

  python benchmarks/lease/lease_time.py [--compile] [--config config/gpu-lease.yaml]   # exit 1 when it does not fit
  python benchmarks/lease/lease_time.py limit LEFT KEEP   # a step's timeout (gpu_lease.sh); 0: skip the step

Training jobs: benchmarks/gpu_hours.py's slowest estimate (H200 step times of benchmarks/lease/h200/, scaled to the
lease's shapes, an upper estimate; 25 s fixed per stage-1 job, 18 s per stage-2 job: process, imports, CUDA and
model set-up, evaluation, checkpoint, Snakemake's dispatch). The rest (FIXED) is the lease's own: wheels and
preflight as the CPU rehearsal measured them (benchmarks/lease/rehearse.sh; docs/gpu.md), rounded up; the data,
analysis and report jobs at a CPU job's cost each."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
COMMAND_S = 600  # the device tool's limit on one command
BUDGET_S = 570  # LEASE_BUDGET_S: the command less 30 s for the tool's kill margin and the last tar
SPARE = 0.25
COMPILE_S = 30  # a stage-1 job's cold compile (CUDA graphs), and the compile preflight's own limit
#: seconds outside the training jobs (see the module docstring), in the order the lease spends them
FIXED = {"wheels": 15, "preflight and snakemake -n": 20, "synth, tokenizer, prepare x2": 40,
         "aggregate, stats, plots, verdict": 40, "report": 15, "tar twice": 5}
MEASURED = [p for p in sorted((ROOT / "benchmarks" / "lease" / "h200").glob("run*_*.json")) if "gpu_check" in p.name or "prof_eager" in p.name]


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


def predict(config: Path, compile_stage1: bool = False, job_s: tuple[float, float] = (25.0, 18.0)) -> dict:
    """{'parts': {name: seconds}, 'total': seconds, 'spare': fraction of COMMAND_S left}."""
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
    return {"parts": parts, "total": total, "spare": 1 - total / COMMAND_S}


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
    p.add_argument("--stage1-job-s", type=float, default=25.0, help="fixed seconds per stage-1 job (gpu_hours.py)")
    p.add_argument("--stage2-job-s", type=float, default=18.0, help="fixed seconds per stage-2 job (gpu_hours.py)")
    a = p.parse_args(argv)
    got = predict(a.config, a.compile, (a.stage1_job_s, a.stage2_job_s))
    for name, s in got["parts"].items():
        print(f"  {name:40s} {s:6.0f} s")
    ok = got["spare"] >= SPARE
    print(f"predicted {got['total']:.0f} s of one {COMMAND_S} s command: {got['spare']:.0%} spare "
          f"({'fits' if ok else 'does NOT fit'}: {SPARE:.0%} required)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
