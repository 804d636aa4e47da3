"""Shared by the analysis and plot tests: a fake study's tables, and its figures drawn without saving."""

from __future__ import annotations


def figures(monkeypatch, out, names):
    """make_plots on a study dir (its steps and activations tables where it has them); return {plot name: its
    Figure}, drawn (not saved)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from precswitch.analysis import plots

    figs = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.setdefault(path.stem, fig))
    tables = {f"{t}_path": out / f"{t}.csv" for t in ("steps", "activations") if (out / f"{t}.csv").is_file()}
    plots.make_plots(out / "runs.csv", out / "schedules.csv", out / "stats.json",
                     outputs=[out / "p" / f"{n}.png" for n in names], **tables)
    for fig in figs.values():
        FigureCanvasAgg(fig).draw()  # pyplot's close left the figure a bare canvas
    return figs


def fake_study(tmp_path, seeds=(1, 2, 3), mutate=None, bootstrap_resamples=0, **kw):
    """Fake study → aggregate → stats in tmp_path/t; ``mutate(metrics_dict, path)`` edits each metrics.json
    first. Returns (the tables' dir, the stats dict)."""
    import json

    from precswitch.analysis.aggregate import aggregate
    from precswitch.analysis.fakes import write_fake_study
    from precswitch.analysis.settings import load_settings
    from precswitch.analysis.cli import run_stats

    paths = write_fake_study(tmp_path / "s", seeds=list(seeds), **kw)
    if mutate is not None:
        for p in paths:
            m = json.loads(p.read_text())
            mutate(m, p)
            p.write_text(json.dumps(m))
    out = tmp_path / "t"
    aggregate(paths, out, [p.parent / "steps.csv" for p in paths])
    stats = run_stats(out / "runs.csv", out / "schedules.csv",
                      load_settings(bootstrap_resamples=bootstrap_resamples), out)
    return out, stats
