"""Shared by the plot tests: draw the study's figures without saving them."""

from __future__ import annotations


def figures(monkeypatch, out, names):
    """make_plots on a study dir; return {plot name: its Figure}, drawn (not saved)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from precswitch.analysis import plots

    figs = {}
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.setdefault(path.stem, fig))
    plots.make_plots(out / "runs.csv", out / "schedules.csv", out / "stats.json",
                     outputs=[out / "p" / f"{n}.png" for n in names])
    for fig in figs.values():
        FigureCanvasAgg(fig).draw()  # pyplot's close left the figure a bare canvas
    return figs
