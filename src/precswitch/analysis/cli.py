"""Sub-commands ``aggregate``, ``stats``, ``plots``, ``verdict`` (heavy imports inside the handlers).

    precswitch aggregate --metrics FILE... [--steps FILE...] --out-dir DIR
        → DIR/runs.csv|parquet, DIR/schedules.csv|parquet, DIR/steps.csv|parquet, DIR/activations.csv
    precswitch stats --runs runs.csv --schedules schedules.csv [--settings FILE.json|yaml]
                     [--baseline NAME] [--margin POINTS] [--alpha A] [--bootstrap-resamples N] [--seed S]
                     (--out-dir DIR | --summary-csv F --summary-md F --deltas-csv F --stats-json F)
        → summary.csv, summary.md, deltas.csv, stats.json
    precswitch plots --runs runs.csv --schedules schedules.csv --stats stats.json
                     [--steps steps.csv] [--activations activations.csv] (--out-dir DIR | --out FILE.png|svg ...)
        → <plot>.png/.svg for plot in accuracy, forest, time_memory, loss_curves, loss_scale, stage1,
          switch_point, overflow
    precswitch verdict --stats stats.json [--sequential sequential.json] --out verdict.md [--front report_front.rst]
    precswitch look --design JSON --look K --metrics FILE... --out lookK.json
        → one look of a sequential study: decisions so far, the seeds each schedule runs next
    precswitch sequential --design JSON --schedules schedules.csv --csv sequential.csv --json sequential.json
        → every comparison's path (sequential.csv) and the seeds and seconds saved (sequential.json)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

#: Columns every table of `precswitch aggregate` has, by option: a runs table (one row per stage run) and a
#: schedules table (one row per schedule and seed) are told apart by them.
TABLE_COLUMNS = {"--runs": ("run_id", "stage", "seed"), "--schedules": ("schedule", "seed", "stage2_precision")}
#: Keys every stats.json of `precswitch stats` has.
STATS_KEYS = ("settings", "baseline", "schedules", "deltas")


def _error(msg: str):
    from ..errors import PrecswitchError

    return PrecswitchError(msg)


def _check_table(path: str, option: str) -> None:
    """``path`` (when it exists: a missing one is named by the command) is the table ``option`` asks for. The two
    tables swapped, or any other file, gave numbers without the stage-1 analysis (exit 0), or a traceback."""
    p = Path(path)
    if not p.is_file():
        return
    try:
        if p.suffix == ".parquet":
            import pyarrow.parquet as pq

            columns = set(pq.read_schema(p).names)
        else:
            import pandas as pd

            columns = set(pd.read_csv(p, nrows=0).columns)
    except Exception as e:  # noqa: BLE001 - whatever the reader says: the file is no table
        raise _error(f"{option} {p}: not a table (CSV or parquet) that precswitch aggregate wrote: "
                     f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}") from None
    missing = [c for c in TABLE_COLUMNS[option] if c not in columns]
    if missing:
        what = "runs table (runs.csv|parquet)" if option == "--runs" else "schedules table (schedules.csv|parquet)"
        raise _error(f"{option} {p}: not a {what} of precswitch aggregate: it has no column(s) {', '.join(missing)}")


def _check_stats(path: str) -> None:
    """``path`` (when it exists: a missing one is named by the command) is a stats.json of ``precswitch stats``:
    a JSON list ended in a traceback (exit 1) and ``{}`` gave an empty verdict and plots (exit 0)."""
    import json

    p = Path(path)
    if not p.is_file():
        return
    try:
        stats = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _error(f"stats file {p} is not valid JSON: {e}") from None
    missing = [k for k in STATS_KEYS if k not in stats] if isinstance(stats, dict) else None
    if missing is None or missing:
        got = f"it has no key(s) {', '.join(missing)}" if missing else f"got a JSON {type(stats).__name__}"
        raise _error(f"stats file {p} is not a stats.json of precswitch stats ({got})")


def _check_outputs(files=(), dirs=()) -> None:
    """Each output file (option, path) can be written: it is not a directory and no folder above it is a file;
    each output directory is not a file. These ended in a traceback (exit 1), aggregate's after runs.csv and
    runs.parquet were written."""
    for option, path, is_dir in [(o, p, True) for o, p in dirs] + [(o, p, False) for o, p in files]:
        if path is None:
            continue
        p = Path(path)
        if p.exists() and p.is_dir() != is_dir:
            raise _error(f"{option} {p}: is a {'directory' if p.is_dir() else 'file'}, not a "
                         f"{'directory' if is_dir else 'file'}")
        for up in p.parents:
            if up.exists():
                if not up.is_dir():
                    raise _error(f"{option} {p}: {up} is a file, not a directory")
                break


def _aggregate(args: argparse.Namespace) -> int:
    from .aggregate import aggregate

    out = Path(args.out_dir)
    _check_outputs([("--out-dir", out / f"{t}.{x}") for t in ("runs", "schedules", "steps") for x in ("csv", "parquet")]
                   + [("--out-dir", out / "activations.csv")], [("--out-dir", out)])
    runs, schedules = aggregate(args.metrics, args.out_dir, steps_paths=args.steps)
    print(f"precswitch aggregate: {len(runs)} runs, {len(schedules)} (schedule, seed) rows → {args.out_dir}",
          file=sys.stderr)
    return 0


def run_stats(runs_path, schedules_path, settings: dict, out_dir=None, *, summary_csv=None,
              summary_md=None, deltas_csv=None, stats_json=None) -> dict:
    """Read the tables, compute, write summary.csv/.md, deltas.csv, stats.json (atomically)."""

    from ..errors import PrecswitchError
    from ..io import atomic_write_json, atomic_write_text
    from .aggregate import read_table
    from .stats import compute
    from .summary_md import render_summary_md

    for p in (runs_path, schedules_path):
        if not Path(p).is_file():
            raise PrecswitchError(f"input table not found: {p}")
    runs, schedules = read_table(runs_path), read_table(schedules_path)
    if schedules.empty:
        raise PrecswitchError(f"{schedules_path} has no rows (no finetune runs were aggregated)")
    summary, deltas, stats = compute(runs, schedules, settings)
    out_dir = Path(out_dir) if out_dir is not None else None

    def target(explicit, name):
        if explicit is not None:
            return Path(explicit)
        if out_dir is None:
            raise PrecswitchError(f"no output path for {name}: give --out-dir or the explicit option")
        return out_dir / name

    atomic_write_text(target(summary_csv, "summary.csv"), summary.to_csv(index=False))
    atomic_write_text(target(summary_md, "summary.md"),
                      render_summary_md(summary, settings, deltas, stats.get("stage1_baseline_precision")))
    atomic_write_text(target(deltas_csv, "deltas.csv"), deltas.to_csv(index=False))
    atomic_write_json(target(stats_json, "stats.json"), stats)
    return stats


def _stats(args: argparse.Namespace) -> int:
    from ..errors import PrecswitchError
    from .settings import load_settings

    explicit = [args.summary_csv, args.summary_md, args.deltas_csv, args.stats_json]
    if args.out_dir is None and any(e is None for e in explicit):
        raise PrecswitchError("stats: give --out-dir DIR, or all of --summary-csv --summary-md --deltas-csv --stats-json")
    _check_table(args.runs, "--runs")
    _check_table(args.schedules, "--schedules")
    out = Path(args.out_dir) if args.out_dir is not None else None
    _check_outputs([(f"--{name.replace('.', '-')}", e) if e is not None else ("--out-dir", out / name)
                    for e, name in zip(explicit, ("summary.csv", "summary.md", "deltas.csv", "stats.json"))],
                   [("--out-dir", out)])
    settings = load_settings(args.settings, baseline=args.baseline, margin=args.margin, alpha=args.alpha,
                             bootstrap_resamples=args.bootstrap_resamples, seed=args.seed)
    stats = run_stats(args.runs, args.schedules, settings, args.out_dir, summary_csv=args.summary_csv,
                      summary_md=args.summary_md, deltas_csv=args.deltas_csv, stats_json=args.stats_json)
    metric = "test_accuracy" if stats.get("split") == "test" else "accuracy"  # the split the verdict reports
    cls = {k: v for k, v in ((r["a"], r["classification"]) for r in stats["deltas"]
                             if r["family"] == "vs_baseline" and r["metric"] == metric)}
    print(f"precswitch stats: vs {stats['baseline']} ({stats.get('split', 'dev')} split): "
          + (", ".join(f"{k} {v}" for k, v in cls.items()) or "no other schedules"), file=sys.stderr)
    return 0


def _plots(args: argparse.Namespace) -> int:
    from .plots import make_plots

    _check_table(args.runs, "--runs")
    _check_table(args.schedules, "--schedules")
    _check_stats(args.stats)
    _check_outputs([("--out", f) for f in args.out or ()], [("--out-dir", args.out_dir)])
    written = make_plots(args.runs, args.schedules, args.stats, out_dir=args.out_dir, outputs=args.out,
                         steps_path=args.steps, activations_path=args.activations)
    print(f"precswitch plots: wrote {len(written)} files", file=sys.stderr)
    return 0


def _verdict(args: argparse.Namespace) -> int:
    from .verdict import write_verdict

    _check_stats(args.stats)
    _check_outputs([("--out", args.out), ("--front", args.front)])
    write_verdict(args.stats, args.out, args.front, sequential_path=args.sequential)
    print(f"precswitch verdict: wrote {args.out}" + (f" and {args.front}" if args.front else ""), file=sys.stderr)
    return 0


def _design(text: str) -> dict:
    import json

    try:
        design = json.loads(text)
    except json.JSONDecodeError as e:
        raise _error(f"--design: not JSON: {e}") from None
    missing = [k for k in ("start", "step", "max_seeds", "alpha", "margin", "seeds", "comparisons") if k not in design]
    if missing:
        raise _error(f"--design: no key(s) {', '.join(missing)} (precswitch.study.sequential_design writes it)")
    return design


def _look(args: argparse.Namespace) -> int:
    from ..io import atomic_write_json
    from .aggregate import load_runs
    from .sequential import look

    design = _design(args.design)
    _check_outputs([("--out", args.out)])
    runs = load_runs(args.metrics)
    finetune = runs[runs["stage"] == "finetune"]
    if finetune.empty:
        raise _error("look: no stage-2 (finetune) metrics among --metrics")
    try:
        result = look(finetune, design, args.look)
    except ValueError as e:
        raise _error(str(e)) from None
    atomic_write_json(args.out, result)
    print(f"precswitch look {args.look}: {result['seeds']} seeds; "
          + ", ".join(f"{r['a']} vs {r['b']} {r['decision']}" for r in result["comparisons"])
          + ("; done" if result["done"] else f"; next: {', '.join(result['next'])}"), file=sys.stderr)
    return 0


def _sequential(args: argparse.Namespace) -> int:
    from ..io import atomic_write_json
    from .aggregate import read_table, write_table
    from .sequential import savings, sequential_table

    design = _design(args.design)
    _check_table(args.schedules, "--schedules")
    _check_outputs([("--csv", args.csv), ("--json", args.json)])
    schedules = read_table(args.schedules)
    table = sequential_table(schedules, design)
    summary = savings(schedules, table, design)
    write_table(table, args.csv)
    atomic_write_json(args.json, summary)
    print(f"precswitch sequential: {len(table)} looks of {len(design['comparisons'])} comparisons → {args.csv}",
          file=sys.stderr)
    return 0


def _design_parser(subparsers, name: str, help: str, description: str):
    """A sequential-study command: it reads the study's design (precswitch.study.sequential_design) as JSON."""
    p = subparsers.add_parser(name, help=help, description=description)
    p.add_argument("--design", required=True, metavar="JSON", help="precswitch.study.sequential_design as JSON")
    return p


def register(subparsers) -> None:
    p = subparsers.add_parser("aggregate", help="collect per-stage metrics.json and steps.csv into tables",
                              description="Writes DIR/runs.csv|parquet (one row per stage run), "
                                          "DIR/schedules.csv|parquet (one row per schedule and seed), "
                                          "DIR/steps.csv|parquet (every run's steps.csv rows) and "
                                          "DIR/activations.csv (per-layer activation telemetry).")
    p.add_argument("--metrics", nargs="+", required=True, metavar="FILE", help="metrics.json files (any order)")
    p.add_argument("--steps", nargs="+", metavar="FILE",
                   help="the runs' steps.csv files, each in its run's folder beside its metrics.json")
    p.add_argument("--out-dir", required=True, metavar="DIR")
    p.set_defaults(func=_aggregate)

    from ..schema import defaults as schema_defaults

    p = subparsers.add_parser("stats", help="paired statistics: summary.csv/.md, deltas.csv, stats.json",
                              description="Per-schedule summaries and paired contrasts (by seed) vs a baseline "
                                          "and named contrasts. Settings: JSON/YAML (an 'analysis:' section is "
                                          "used if present); options below override it.")
    p.add_argument("--runs", required=True, metavar="CSV|PARQUET")
    p.add_argument("--schedules", required=True, metavar="CSV|PARQUET")
    p.add_argument("--settings", metavar="FILE", help="JSON/YAML: baseline, contrasts, margin, alpha, power, "
                                                      "bootstrap_resamples, seed")
    d = schema_defaults("analysis")  # the study schema declares each default once
    p.add_argument("--baseline", help=f"baseline schedule (default {d['baseline']})")
    p.add_argument("--margin", type=float, help=f"equivalence margin in accuracy points (default {d['margin']})")
    p.add_argument("--alpha", type=float, help=f"significance level (default {d['alpha']})")
    p.add_argument("--bootstrap-resamples", type=int,
                   help=f"bootstrap resamples (default {d['bootstrap_resamples']}; 0 = none)")
    p.add_argument("--seed", type=int, help=f"bootstrap RNG seed (default {d['seed']})")
    p.add_argument("--out-dir", metavar="DIR", help="writes summary.csv, summary.md, deltas.csv, stats.json")
    p.add_argument("--summary-csv", metavar="FILE")
    p.add_argument("--summary-md", metavar="FILE")
    p.add_argument("--deltas-csv", metavar="FILE")
    p.add_argument("--stats-json", metavar="FILE")
    p.set_defaults(func=_stats)

    p = subparsers.add_parser("plots", help="PNG/SVG plots",
                              description="Plots: accuracy, forest, time_memory, loss_curves, loss_scale, stage1, "
                                          "switch_point, overflow. "
                                          "--out-dir writes all as PNG and SVG; --out writes exactly the given "
                                          "files (stem = plot name, suffix .png or .svg).")
    p.add_argument("--runs", required=True, metavar="CSV|PARQUET")
    p.add_argument("--schedules", required=True, metavar="CSV|PARQUET")
    p.add_argument("--stats", required=True, metavar="JSON")
    p.add_argument("--steps", metavar="CSV|PARQUET", help="steps table of precswitch aggregate (loss curves, "
                                                         "loss scale)")
    p.add_argument("--activations", metavar="CSV", help="activations table of precswitch aggregate (overflow)")
    p.add_argument("--out-dir", metavar="DIR")
    p.add_argument("--out", nargs="+", metavar="FILE")
    p.set_defaults(func=_plots)

    p = subparsers.add_parser("verdict", help="write verdict.md from stats.json")
    p.add_argument("--stats", required=True, metavar="JSON")
    p.add_argument("--sequential", metavar="JSON", help="sequential.json of precswitch sequential (a sequential "
                                                         "study): adds its section")
    p.add_argument("--out", required=True, metavar="FILE")
    p.add_argument("--front", metavar="FILE", help="also write the answer (title, headline table, sentences) as "
                                                   "reST for the report's landing page")
    p.set_defaults(func=_verdict)

    p = _design_parser(subparsers, "look", "one look of a sequential study (docs/sequential.md)",
                       "Decides every comparison of a sequential study from the stage-2 metrics so far and writes "
                       "the look's JSON: each comparison's estimate, interval and decision, and the seeds each "
                       "schedule runs next (none: done).")
    p.add_argument("--look", required=True, type=int, metavar="K", help="look index (0: after the start seeds)")
    p.add_argument("--metrics", nargs="+", required=True, metavar="FILE", help="the runs' metrics.json files")
    p.add_argument("--out", required=True, metavar="FILE")
    p.set_defaults(func=_look)

    p = _design_parser(subparsers, "sequential", "a sequential study's paths and savings",
                       "Writes the tidy path of every comparison (comparison, look, seeds, n, mean, lo, hi, "
                       "decision) and a JSON summary: seeds used, why each comparison stopped, seeds and training "
                       "seconds saved against the fixed design of the same power.")
    p.add_argument("--schedules", required=True, metavar="CSV|PARQUET")
    p.add_argument("--csv", required=True, metavar="FILE")
    p.add_argument("--json", required=True, metavar="FILE")
    p.set_defaults(func=_sequential)
