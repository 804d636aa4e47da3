"""Sub-commands ``aggregate``, ``stats``, ``plots``, ``verdict`` (heavy imports inside the handlers).

    precswitch aggregate --metrics FILE... --out-dir DIR
        → DIR/runs.csv, DIR/runs.parquet, DIR/schedules.csv, DIR/schedules.parquet
    precswitch stats --runs runs.csv --schedules schedules.csv [--settings FILE.json|yaml]
                     [--baseline NAME] [--margin POINTS] [--alpha A] [--bootstrap-resamples N] [--seed S]
                     (--out-dir DIR | --summary-csv F --summary-md F --deltas-csv F --stats-json F)
        → summary.csv, summary.md, deltas.csv, stats.json
    precswitch plots --runs runs.csv --schedules schedules.csv --stats stats.json
                     (--out-dir DIR | --out FILE.png|svg ...)
        → <plot>.png/.svg for plot in accuracy, forest, time_memory, loss_curves, loss_scale, stage1,
          switch_point, overflow
    precswitch verdict --stats stats.json --out verdict.md
"""

from __future__ import annotations

import argparse
import sys


def _aggregate(args: argparse.Namespace) -> int:
    from .aggregate import aggregate

    runs, schedules = aggregate(args.metrics, args.out_dir)
    print(f"precswitch aggregate: {len(runs)} runs, {len(schedules)} (schedule, seed) rows → {args.out_dir}",
          file=sys.stderr)
    return 0


def _stats(args: argparse.Namespace) -> int:
    from ..errors import PrecswitchError
    from .stats import load_settings, run_stats

    explicit = [args.summary_csv, args.summary_md, args.deltas_csv, args.stats_json]
    if args.out_dir is None and any(e is None for e in explicit):
        raise PrecswitchError("stats: give --out-dir DIR, or all of --summary-csv --summary-md --deltas-csv --stats-json")
    settings = load_settings(args.settings, baseline=args.baseline, margin=args.margin, alpha=args.alpha,
                             bootstrap_resamples=args.bootstrap_resamples, seed=args.seed)
    stats = run_stats(args.runs, args.schedules, settings, args.out_dir, summary_csv=args.summary_csv,
                      summary_md=args.summary_md, deltas_csv=args.deltas_csv, stats_json=args.stats_json)
    cls = {k: v for k, v in ((r["a"], r["classification"]) for r in stats["deltas"]
                             if r["family"] == "vs_baseline" and r["metric"] == "accuracy")}
    print(f"precswitch stats: vs {stats['baseline']}: "
          + (", ".join(f"{k} {v}" for k, v in cls.items()) or "no other schedules"), file=sys.stderr)
    return 0


def _plots(args: argparse.Namespace) -> int:
    from .plots import make_plots

    written = make_plots(args.runs, args.schedules, args.stats, out_dir=args.out_dir, outputs=args.out)
    print(f"precswitch plots: wrote {len(written)} files", file=sys.stderr)
    return 0


def _verdict(args: argparse.Namespace) -> int:
    from .verdict import write_verdict

    write_verdict(args.stats, args.out)
    print(f"precswitch verdict: wrote {args.out}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("aggregate", help="collect per-stage metrics.json into runs and schedules tables",
                              description="Writes DIR/runs.csv|parquet (one row per stage run) and "
                                          "DIR/schedules.csv|parquet (one row per schedule and seed).")
    p.add_argument("--metrics", nargs="+", required=True, metavar="FILE", help="metrics.json files (any order)")
    p.add_argument("--out-dir", required=True, metavar="DIR")
    p.set_defaults(func=_aggregate)

    p = subparsers.add_parser("stats", help="paired statistics: summary.csv/.md, deltas.csv, stats.json",
                              description="Per-schedule summaries and paired contrasts (by seed) vs a baseline "
                                          "and named contrasts. Settings: JSON/YAML (an 'analysis:' section is "
                                          "used if present); options below override it.")
    p.add_argument("--runs", required=True, metavar="CSV|PARQUET")
    p.add_argument("--schedules", required=True, metavar="CSV|PARQUET")
    p.add_argument("--settings", metavar="FILE", help="JSON/YAML: baseline, contrasts, margin, alpha, power, "
                                                      "bootstrap_resamples, seed")
    p.add_argument("--baseline", help="baseline schedule (default fp32-fp32)")
    p.add_argument("--margin", type=float, help="equivalence margin in accuracy points (default 1.0)")
    p.add_argument("--alpha", type=float, help="significance level (default 0.05)")
    p.add_argument("--bootstrap-resamples", type=int, help="bootstrap resamples (default 10000; 0 = none)")
    p.add_argument("--seed", type=int, help="bootstrap RNG seed (default 0)")
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
    p.add_argument("--out-dir", metavar="DIR")
    p.add_argument("--out", nargs="+", metavar="FILE")
    p.set_defaults(func=_plots)

    p = subparsers.add_parser("verdict", help="write verdict.md from stats.json")
    p.add_argument("--stats", required=True, metavar="JSON")
    p.add_argument("--out", required=True, metavar="FILE")
    p.set_defaults(func=_verdict)
