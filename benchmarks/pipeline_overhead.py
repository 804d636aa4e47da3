#!/usr/bin/env python3
"""Pipeline overhead of a whole study: wall time vs the training + evaluation seconds the runs report.

Runs ``snakemake --cores N`` on this repository's Snakefile in a fresh directory (a temporary one,
or --workdir), then reads every run's metrics.json:

    useful    = sum over runs of (train_seconds + eval_seconds)
    slots     = training jobs that can run side by side: cores // threads (CPU), gpu limit (GPU)
    overhead  = wall - useful / slots           (as a share of wall)

so the overhead is everything that is not training or evaluation on a busy slot: Snakemake itself,
process start-up and imports, data generation, tokenizer training, tokenization, model set-up,
checkpoint writes, the analysis jobs, and slots left idle (by the DAG, or at the tail).

    .venv/bin/python benchmarks/pipeline_overhead.py                    # the embedded default study
    .venv/bin/python benchmarks/pipeline_overhead.py --configfile tests/configs/tiny.yaml --cores 2

Prints a human-readable breakdown and a final JSON line. The machine should be otherwise idle:
the load average before and after is printed, since other processes on the cores inflate both the
wall time and the run times.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import positive_int  # noqa: E402


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _benchmarks(results: Path) -> dict[str, float]:
    """Wall seconds of each Snakemake benchmark file, summed per group (data, pretrain, finetune, analysis)."""
    totals: dict[str, float] = {}
    for f in sorted((results / "benchmarks").rglob("*.tsv")):
        group = f.relative_to(results / "benchmarks").parts[0]
        with f.open() as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        if rows:
            totals[group] = totals.get(group, 0.0) + float(rows[-1]["s"])
    return totals


def study_config(configfile: str) -> dict:
    """The study's config as the Snakefile sees it: the file merged onto config/config.yaml (Snakemake's own
    recursive merge), validated (schema defaults filled in)."""
    from snakemake.utils import update_config, validate

    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    update_config(cfg, yaml.safe_load(Path(configfile).read_text()) or {})
    validate(cfg, str(ROOT / "workflow" / "schemas" / "config.schema.yaml"))
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configfile", default=str(ROOT / "config" / "config.yaml"))
    ap.add_argument("--cores", type=positive_int, default=os.cpu_count() or 1)
    ap.add_argument("--workdir", help="run here (must not hold a finished study); default: a temp dir")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--report", action="store_true", help="also time `snakemake --report`")
    args = ap.parse_args(argv)

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="precswitch-overhead-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(workdir),
           "--cores", str(args.cores), "--configfile", str(Path(args.configfile).resolve())]
    print("command:", " ".join(cmd), flush=True)
    print(f"load average before: {_load()}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    print(f"load average after:  {_load()}", flush=True)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-6000:], sep="\n", file=sys.stderr)
        print(f"snakemake failed ({proc.returncode}); workdir kept: {workdir}", file=sys.stderr)
        return 1

    cfg = study_config(args.configfile)
    results = workdir / cfg["results_dir"]  # the study's own (the GPU configs and frontier.yaml set one)
    metrics = [json.loads(p.read_text()) for p in sorted((results / "runs").rglob("metrics.json"))]
    train = sum(m.get("train_seconds") or 0.0 for m in metrics)
    evals = sum(m.get("eval_seconds") or 0.0 for m in metrics)
    setup = sum(m.get("setup_seconds") or 0.0 for m in metrics)
    ckpt = sum(m.get("checkpoint_seconds") or 0.0 for m in metrics)

    if cfg["device"] == "cpu":
        slots = max(1, args.cores // cfg["threads"])
    else:
        slots = 1  # profiles/default: gpu=1
    n_runs = len(metrics)
    slots = min(slots, n_runs) if n_runs else slots
    useful = (train + evals) / slots
    overhead = wall - useful
    bench = _benchmarks(results)
    # per training process: its job wall (Snakemake benchmark) minus the train+eval it reports =
    # interpreter start, imports, set-up, checkpoint writes, exit
    process = bench.get("pretrain", 0.0) + bench.get("finetune", 0.0) - (train + evals)

    report_seconds = None
    if args.report:
        t1 = time.perf_counter()
        subprocess.run([*cmd[:-4], "--configfile", str(Path(args.configfile).resolve()),
                        "--report", str(results / "report.html")], capture_output=True, text=True, check=True)
        report_seconds = time.perf_counter() - t1

    print(f"\nstudy: {args.configfile}  ({n_runs} training runs, {args.cores} cores, {slots} slots)")
    print(f"wall                       {wall:8.1f} s")
    print(f"train seconds (sum)        {train:8.1f} s")
    print(f"eval seconds (sum)         {evals:8.1f} s")
    print(f"(train+eval) / slots       {useful:8.1f} s")
    print(f"overhead                   {overhead:8.1f} s = {100 * overhead / wall:.1f}% of wall")
    print("  of which, summed over runs (divide by slots for wall):")
    print(f"  setup seconds (sum)      {setup:8.1f} s")
    print(f"  checkpoint seconds (sum) {ckpt:8.1f} s")
    print(f"  training processes beyond train+eval (sum)  {process:8.1f} s  -> {process / slots:.1f} s of wall")
    print(f"  rest: data + analysis jobs, Snakemake, idle slots  {overhead - process / slots:8.1f} s of wall")
    print(f"  job wall per group (Snakemake benchmarks, sum): "
          + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(bench.items())))
    if report_seconds is not None:
        print(f"snakemake --report         {report_seconds:8.1f} s (not in wall)")
    print(f"workdir: {workdir}" + ("" if args.keep or args.workdir else " (removed)"))
    print(json.dumps({
        "wall_seconds": round(wall, 2), "train_seconds": round(train, 2), "eval_seconds": round(evals, 2),
        "slots": slots, "runs": n_runs, "overhead_seconds": round(overhead, 2),
        "overhead_percent": round(100 * overhead / wall, 2), "setup_seconds_sum": round(setup, 2),
        "process_seconds_beyond_train_eval_sum": round(process, 2),
        "benchmark_seconds_by_group": {k: round(v, 2) for k, v in bench.items()},
        "report_seconds": None if report_seconds is None else round(report_seconds, 2),
    }))
    if not (args.keep or args.workdir):
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
