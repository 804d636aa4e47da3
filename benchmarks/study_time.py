#!/usr/bin/env python
"""Wall time of the embedded default study, cold, as a new user meets it (issue 33: under 10 minutes on a
2-core AVX2-only CPU, under 5 where a bf16 fast path exists).

Clones the repository at HEAD into a fresh temporary directory (no results, no caches of this checkout),
runs `snakemake --cores all` there (data, tokenizer, both stages, tables, plots, verdict) and then
`snakemake --report results/report.html`, and prints the wall time of each, the total, and a per-rule
split summed from Snakemake's `benchmark:` files (results/benchmarks/**.tsv: one per job; with 2 job
slots the jobs' seconds add up to about twice the wall time of the training part). It also prints the
CPU's 16-bit fast paths (precswitch.fast_paths) and the load average before and after: on a shared
machine the wall time measures the load as much as the study.

  .venv/bin/python benchmarks/study_time.py            # the default study, cold, --cores all
  .venv/bin/python benchmarks/study_time.py --keep     # ... and keep the clone (its path is printed)
  .venv/bin/python benchmarks/study_time.py --fast-path-proxy   # the same jobs, every 16-bit stage at fp32's cost

--fast-path-proxy times the study a CPU with a 16-bit fast path would run, on a CPU without one: the same
schedules, seeds, stages and job graph, but every stage whose precision is not fp32 runs in fp32 under its
own name (an adam_eps a hair off the recipe's, so the stage-1 runs stay distinct and shared as before). On
the AMX CPU every 16-bit precision ran at fp32's speed or faster (amp_bf16 1.3x, amp_fp16 1.05x:
../shared/FACTS.md), so this is an upper bound on the study's wall time there. Its accuracies mean nothing.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def rule_of(tsv: Path, bench_dir: Path) -> str:
    """The group a benchmark file belongs to: `data/<rule>` (tokenizer, prepare-pretrain, ...) or the first
    directory under benchmarks/ (pretrain, finetune, analysis, ...)."""
    rel = tsv.relative_to(bench_dir)
    return f"data/{rel.stem}" if rel.parts[0] == "data" else rel.parts[0]


def per_rule(bench_dir: Path) -> dict[str, tuple[int, float]]:
    """{group: (jobs, seconds summed)} from the study's benchmark files."""
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for tsv in sorted(bench_dir.rglob("*.tsv")):
        with open(tsv, newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        if rows:
            g = out[rule_of(tsv, bench_dir)]
            g[0] += 1
            g[1] += float(rows[-1]["s"])
    return {k: (n, s) for k, (n, s) in out.items()}


def fast_path_proxy(config: dict) -> dict:
    """The schedules of ``config`` with every stage not in fp32 run in fp32 at its own adam_eps (the stage's
    times 1.01, 1.02, ... one per stage and precision), so each keeps its own, shared stage-1 runs."""
    from precswitch.specs import stage_spec

    eps_step: dict = {}  # (stage, precision) -> k: adam_eps x (1 + k/100)
    out: dict = {}
    for name, stages in config["schedules"].items():
        out[name] = {}
        for stage, spec in stages.items():
            precision = stage_spec(spec)["precision"]
            if precision == "fp32":
                out[name][stage] = spec
                continue
            k = eps_step.setdefault((stage, precision), len(eps_step) + 1)
            eps = round(config["train"][stage]["adam_eps"] * (1 + k / 100), 12)
            out[name][stage] = {"precision": "fp32", "overrides": {"adam_eps": eps}}
    return {"schedules": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=str(ROOT), help="repository to clone at HEAD (default: this one)")
    ap.add_argument("--cores", default="all", help="snakemake --cores (default: all)")
    ap.add_argument("--keep", action="store_true", help="keep the clone and its results")
    ap.add_argument("--no-report", action="store_true", help="skip `snakemake --report`")
    ap.add_argument("--fast-path-proxy", action="store_true",
                    help="run every 16-bit stage in fp32 (its own run): the wall time on a CPU with a fast path")
    args = ap.parse_args(argv)

    snakemake = shutil.which("snakemake", path=str(Path(sys.executable).parent)) or "snakemake"
    work = Path(tempfile.mkdtemp(prefix="precswitch-study-time-"))
    clone = work / "precswitch"
    subprocess.run(["git", "clone", "--quiet", args.repo, str(clone)], check=True)
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    # the clone's own package, not an installed (editable) one of another checkout
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(clone / "src"),
                                                                    os.environ.get("PYTHONPATH")]))}
    sys.path.insert(0, str(clone / "src"))
    from precswitch.fast_paths import cpu_fast_paths, study_time_note  # noqa: E402  (the clone's)
    import yaml  # noqa: E402

    config = yaml.safe_load((clone / "config" / "config.yaml").read_text())
    note = study_time_note(config)
    extra = []
    if args.fast_path_proxy:
        (clone / "proxy.yaml").write_text(yaml.safe_dump(fast_path_proxy(config)))
        extra = ["--configfile", "config/config.yaml", "proxy.yaml"]
        note = "fast-path proxy: every 16-bit stage runs in fp32 under its own name (accuracies mean nothing)"
    print(f"commit {head}; clone {clone}; cpus {os.cpu_count()}; 16-bit fast paths {cpu_fast_paths()}")
    print(note or "this CPU has a fast path for every 16-bit precision of the default study")
    load0 = os.getloadavg()
    steps = [("study", [snakemake, "--cores", args.cores, *extra])]
    if not args.no_report:
        steps.append(("report", [snakemake, "--cores", args.cores, *extra, "--report", "results/report.html"]))
    walls = {}
    for name, cmd in steps:
        t0 = time.perf_counter()
        with open(work / f"{name}.log", "w") as log:
            rc = subprocess.run(cmd, cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        walls[name] = time.perf_counter() - t0
        if rc:
            print(f"{name} failed (exit {rc}): see {work / (name + '.log')}")
            return 1
    load1 = os.getloadavg()
    total = sum(walls.values())
    print(f"wall: {' + '.join(f'{k} {v:.0f} s' for k, v in walls.items())} = {total:.0f} s ({total / 60:.1f} min)")
    print(f"load average (1/5/15 min) before {load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f}, "
          f"after {load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f} on {os.cpu_count()} CPUs")
    print("| rule | jobs | job seconds (summed) |\n| --- | --- | --- |")
    for rule, (n, s) in sorted(per_rule(clone / "results" / "benchmarks").items(), key=lambda kv: -kv[1][1]):
        print(f"| {rule} | {n} | {s:.1f} |")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
