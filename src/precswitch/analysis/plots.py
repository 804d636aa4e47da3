"""Plots (seaborn on the matplotlib Agg backend); each plot is written as PNG and/or SVG.

Plot names (file stem → what it shows; captions in workflow/report/<name>.rst):

* ``accuracy``     fine-tuned accuracy per schedule: every seed's point, mean and 95% t CI
* ``forest``       paired accuracy deltas (points) vs the baseline and for the named contrasts, with the
                   ±margin equivalence band
* ``time_memory``  training-loop time and peak memory per stage and precision
* ``loss_curves``  training loss over steps, mean ± SD over seeds: stage 1 by stage-1 precision,
                   stage 2 by schedule
* ``loss_scale``   dynamic loss-scale traces of the fp16 runs, skipped steps marked
* ``stage1``       stage-1 eval metrics (MLM loss, masked-token accuracy) per stage-1 precision
* ``switch_point`` accuracy and the swept stage's training time vs the switch point of each
                   switch-point sweep (mean and 95% t CI over seeds, one line per sweep)
* ``overflow``     max |activation| per layer of the stage-1 runs with activation telemetry, per
                   stage-1 precision, against the fp16 limit 65504 (log scale)

A plot with nothing to show (no sweep, no telemetry, no fp16 run) is still written, with a note, so the
workflow's outputs do not depend on the config.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from pathlib import Path
from typing import Any, Iterable

from ..errors import PrecswitchError
from .fmt import conf_level

FP16_MAX = 65504.0
FORMATS = ("png", "svg")
FP16_PRECISIONS = ("amp_fp16", "pure_fp16")


def _setup():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    plt.rcParams["svg.hashsalt"] = "precswitch"  # reproducible SVG ids
    return plt, sns


def _schedule_order(schedules, baseline: str | None) -> list[str]:
    names = sorted(schedules["schedule"].dropna().unique())
    if baseline in names:
        names.remove(baseline)
        names.insert(0, baseline)
    return names


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=11, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


# --------------------------------------------------------------------------------------------------
# Line styles: series whose curves coincide must all stay visible (issue: one line hid two others)
# --------------------------------------------------------------------------------------------------
#: per series, in draw order: a dash pattern and a marker of its own, so that two series drawn on top
#: of each other are told apart without their colour; the data are never offset
_DASHES = ("-", "--", ":", "-.", (0, (6, 1.5, 1, 1.5, 1, 1.5)), (0, (9, 2.5)), (0, (1, 2.5)),
           (0, (4, 1, 1, 1)))
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
OVERLAP_NOTE = "lines overlap: curves coincide"
#: curves whose means differ by at most this fraction of the plotted y range at every shared x coincide
COINCIDE_FRACTION = 0.01
FAILED_RUN_LABEL = "failed run (not in the mean)"
#: more legend entries than this go right of the axes instead of over the curves
LEGEND_INSIDE_MAX = 5


def _rotate_long_ticks(ax, names: list[str], inches_per_tick: float) -> None:
    """Slant the x tick labels when the longest would not fit its slot (long schedule names overlapped)."""
    longest = max((len(str(n)) for n in names), default=0)
    if longest * 0.085 > inches_per_tick:  # ~0.085 in per character at the tick font size
        for t in ax.get_xticklabels():
            t.set_rotation(30)
            t.set_ha("right")
            t.set_rotation_mode("anchor")


#: more levels than the default palette's 10 colours get evenly spaced "husl" hues (else colours repeat)
PALETTE_MAX = 10


def _colors(n: int) -> list:
    """``n`` distinct colours: seaborn's default palette, or "husl" hues beyond PALETTE_MAX."""
    import seaborn as sns

    return sns.color_palette("husl" if n > PALETTE_MAX else None, n_colors=max(1, n))


def _palette(levels: list[str]) -> dict[str, Any]:
    """One colour per level (a precision or a schedule), seaborn's default palette in ``levels`` order
    (distinct "husl" hues when there are more levels than it has colours)."""
    return dict(zip(levels, _colors(len(levels))))


def _category_axis(ax, order: list[str], failed: dict | None = None, dodge: list[str] | None = None) -> None:
    """Keep every level of ``order`` as a column of the categorical x axis and write "k failed" over it.

    seaborn only spans the levels that have points: a level without any (all its runs failed) at either end
    of ``order`` lost its column, and its "k failed" note landed outside the axes (PNGs 15 000 px wide with
    ``bbox_inches="tight"``). ``failed``: {level: count} or, with ``dodge`` (the hue order of a dodged
    plot), {(level, hue level): count}, each written over its own dodged position.
    """
    ax.set_xticks(range(len(order)), [str(o) for o in order])
    ax.set_xlim(-0.5, len(order) - 0.5)
    if any(int(v) for v in (failed or {}).values()):  # headroom: the notes sit above the data, not on it
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, hi + 0.12 * (hi - lo))
    for (key, nf) in (failed or {}).items():
        nf = int(nf)
        if not nf:
            continue
        level, hue = key if dodge else (key, None)
        if level not in order or (dodge and hue not in dodge):
            continue
        x = order.index(level)
        if dodge:
            x += -0.4 + 0.8 / len(dodge) * (dodge.index(hue) + 0.5)
        ax.annotate(f"{nf} failed", (x, 0.96), xycoords=("data", "axes fraction"), ha="center", va="top",
                    color="tab:red", fontsize=9 if not dodge else 8, zorder=5)


def _note(ax, text: str) -> None:
    """A grey note in the middle of axes that keep their columns (over a white patch, not the grid)."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=11, color="0.4",
            bbox={"facecolor": "white", "edgecolor": "none"})


def _failed_schedule_runs(schedules) -> set[str]:
    """run_ids of the stage-2 runs that finished (status ok) but whose schedule row failed (its stage 1
    diverged or was skipped): the statistics leave them out with their schedule, so the plots must too."""
    if schedules is None or "stage2_run_id" not in schedules or "status" not in schedules:
        return set()
    bad = schedules["status"].fillna("ok").astype(str) != "ok"
    if "stage2_status" in schedules:
        bad &= schedules["stage2_status"].fillna("ok").astype(str) == "ok"
    return {str(r) for r in schedules.loc[bad, "stage2_run_id"].dropna()}


def _series_style(i: int, n: int, n_points: int) -> dict[str, Any]:
    """Line keywords of series ``i`` of ``n`` (draw order) with ``n_points`` points.

    Each series gets its own dash pattern and marker; the line width shrinks with the draw order, so a
    later (upper) line is thinner than the ones below it and leaves them visible where curves coincide;
    markers sit on every ``n``-th or sparser data point, each series starting at another point, so the
    markers of coinciding curves do not cover each other either.
    """
    lw = 2.8 - 1.3 * i / (n - 1) if n > 1 else 2.0
    every = max(n, round(n_points / 8), 1)
    return {"ls": _DASHES[i % len(_DASHES)], "marker": _MARKERS[i % len(_MARKERS)], "lw": lw,
            "ms": 3.5 + 0.8 * lw, "markevery": (i % every, every), "zorder": 2 + 0.01 * i}


def _coinciding(curves: dict[str, Any], log: bool = False) -> list[list[str]]:
    """Groups (≥ 2 names) of curves ({name: y Series indexed by x}) that coincide on the plot.

    Two curves coincide when, at every x both have, their y differ by at most COINCIDE_FRACTION of the
    y range spanned by all curves (log10(y) on a log axis): drawn over each other, one would hide the other.
    """
    import numpy as np

    ys = {k: (np.log10(v.where(v > 0)) if log else v).dropna() for k, v in curves.items()}
    ys = {k: v for k, v in ys.items() if not v.empty}
    if len(ys) < 2:
        return []
    lo = min(float(v.min()) for v in ys.values())
    hi = max(float(v.max()) for v in ys.values())
    tol = COINCIDE_FRACTION * (hi - lo) if hi > lo else 1e-12
    names = list(ys)
    parent = {k: k for k in names}

    def root(k: str) -> str:
        while parent[k] != k:
            k = parent[k]
        return k

    for i, a in enumerate(names):
        for b in names[i + 1:]:
            common = ys[a].index.intersection(ys[b].index)
            if len(common) and float((ys[a][common] - ys[b][common]).abs().max()) <= tol:
                parent[root(b)] = root(a)
    groups: dict[str, list[str]] = {}
    for k in names:
        groups.setdefault(root(k), []).append(k)
    return [g for g in groups.values() if len(g) > 1]


def _styled_lines(ax, sns, data, x: str, y: str, key: str, levels: list[str], colors: dict[str, Any],
                  labels: dict[str, str] | None = None, **kw) -> dict[str, Any]:
    """One seaborn line per level of ``key`` (mean ± errorbar over its rows, as ``hue`` would draw it),
    each in its level's colour with its own dash pattern, marker and width; returns {label: mean y by x}."""
    labels = labels or {}
    means = {}
    present = [lv for lv in levels if (data[key] == lv).any()]
    for i, lv in enumerate(present):
        g = data[data[key] == lv]
        label = labels.get(lv, str(lv))
        style = _series_style(i, len(present), int(g[x].nunique()))
        sns.lineplot(data=g, x=x, y=y, color=colors[lv], label=label, ax=ax, **style, **kw)
        means[label] = g.groupby(x)[y].mean()
    return means


def _overlap_note(group: list[str]) -> str:
    """'lines overlap: curves coincide (a, b)', seeds of one precision/schedule named once, wrapped."""
    import re

    names = [g.split(" (")[0] for g in group]  # 'amp_fp16 (fp16-fp16, fp16-fp32)' → 'amp_fp16'
    runs = [re.fullmatch(r"(.+) seed (\S+)", n) for n in names]
    if all(runs) and len({m.group(1) for m in runs}) == 1:
        names = [f"{runs[0].group(1)} seeds {', '.join(m.group(2) for m in runs)}"]
    return textwrap.fill(f"{OVERLAP_NOTE} ({', '.join(names)})", 48)


def _legend(ax, coincide: list[list[str]], outside: bool = False, notes: Iterable[str] = (), **kw):
    """The axes legend, with a last handle-less entry per group of coinciding curves naming them, then one
    per ``notes``; ``outside``: right of the axes (many entries would cover the data)."""
    from matplotlib.lines import Line2D

    handles, labels = ax.get_legend_handles_labels()
    for text in [_overlap_note(group) for group in coincide] + list(notes):
        handles.append(Line2D([], [], ls="none"))
        labels.append(text)
    if outside:
        kw.update(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    return ax.legend(handles, labels, **kw)


# --------------------------------------------------------------------------------------------------
# Individual plots: each returns a matplotlib Figure
# --------------------------------------------------------------------------------------------------
def plot_accuracy(schedules, stats: dict, plt, sns):
    from .paired import describe_proportion
    from .stats import EXAMPLES_OF, mark_outcomes

    metric = stats.get("accuracy_metric", "accuracy")
    df = mark_outcomes(schedules)
    df["accuracy_pct"] = df[metric].astype(float) * 100
    order = _schedule_order(df, stats.get("baseline"))
    alpha = stats.get("settings", {}).get("alpha", 0.05)
    # slanted long names (see _rotate_long_ticks) take ~0.085 in per character times sin/cos 30°: the figure
    # grows by what they need beyond a short flat label, so the data axes keep their size (12 schedules with
    # 60-character names left a 0.5 in strip; slanted names need less room per column); many schedules put
    # the legend right of the axes, where it covers no seed
    longest = max((len(str(s)) for s in order), default=0)
    slanted = longest * 0.085 > 1.4
    outside = len(order) > LEGEND_INSIDE_MAX
    width = max(5.5, (1.1 if slanted else 1.4) * len(order) + 2) \
        + (max(0.0, 0.074 * longest - 1.5) if slanted else 0) + (2.8 if outside else 0)
    height = 4.5 + (max(0.0, 0.0425 * longest - 0.4) if slanted else 0)
    fig, ax = plt.subplots(figsize=(width, height))
    used = df[df["used"]]
    label_of = {"ok": "run (ok)", "degenerate": "degenerate (≤ majority class)"}
    sns.stripplot(data=used, x="schedule", y="accuracy_pct", hue=used["outcome"].map(label_of),
                  order=order, hue_order=list(label_of.values()), palette=["tab:blue", "tab:red"],
                  dodge=False, jitter=0.12, size=6, alpha=0.75, ax=ax, zorder=2)
    labelled = False  # the mean's legend entry goes on the first schedule that has a mean
    for i, s in enumerate(order):
        mine = used[used["schedule"] == s]
        ex = mine[EXAMPLES_OF[metric]].astype(float).max() if EXAMPLES_OF[metric] in mine else None
        d = {k: v if k == "n" else v * 100 for k, v in describe_proportion(mine[metric].astype(float), ex, alpha).items()}
        if d["n"]:
            lo, hi = d["ci_low"], d["ci_high"]
            yerr = [[d["mean"] - lo], [hi - d["mean"]]] if math.isfinite(lo) else None
            ax.errorbar(i + 0.3, d["mean"], yerr=yerr, fmt="D", color="black", capsize=5, ms=6, zorder=3,
                        label=None if labelled else f"mean, {conf_level(alpha)}% CI (logit scale)")
            labelled = True
    maj = df["majority_accuracy"].astype(float).dropna() if "majority_accuracy" in df else None
    if maj is not None and not maj.empty:
        ax.axhline(maj.median() * 100, color="0.5", ls=":", lw=1, label="majority-class accuracy")
    _category_axis(ax, order, {s: (~df.loc[df["schedule"] == s, "used"]).sum() for s in order})
    if used.empty:  # no schedule has a usable run: a percent axis and a note, not a bare 0-1 axis
        ax.set_ylim(0, 100)
        _note(ax, "no schedule has a usable run")
    _rotate_long_ticks(ax, order, 1.4)
    ax.set_xlabel("schedule (pre-train → fine-tune precision)")
    ax.set_ylabel(f"fine-tuned accuracy on the {'test' if metric == 'test_accuracy' else 'eval'} split (%)")
    ax.set_title("Accuracy per schedule (each dot = one seed)")
    if ax.get_legend_handles_labels()[0]:
        if outside:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
        else:
            ax.legend(fontsize=8, loc="best")
    elif ax.get_legend() is not None:
        ax.get_legend().remove()
    fig.tight_layout()
    return fig


def plot_forest(stats: dict, plt, sns):
    import pandas as pd

    d = pd.DataFrame(stats.get("deltas", []))
    margin = stats.get("settings", {}).get("margin", 1.0)
    alpha = stats.get("settings", {}).get("alpha", 0.05)
    if not d.empty:
        d = d[(d["metric"] == "accuracy") & d["family"].isin(["vs_baseline", "named"])]
        # a named contrast that repeats a vs-baseline one is shown once (vs-baseline row)
        d = d.drop_duplicates(["a", "b"], keep="first")
    n = max(1, len(d))
    if not d.empty:
        d = d.reset_index(drop=True)
        labels = [f"{r['a']} vs {r['b']}  (n={r['n_pairs']}, {r['classification']})" for r in d.to_dict("records")]
    else:
        labels = []
    # the y labels take ~0.07 in per character (9 pt): the figure widens with the longest, so that the data
    # keep ~4.5 in (long schedule names left ~1 in and x tick labels running into each other)
    longest = max((len(t) for t in labels), default=0)
    fig, ax = plt.subplots(figsize=(max(8.0, 5.0 + 0.07 * longest), 1.8 + 0.6 * n))
    if d.empty:
        _empty(ax, "no paired contrasts (one schedule only?)")
        return fig
    ys = list(range(len(d)))[::-1]
    ax.axvspan(-margin, margin, color="tab:green", alpha=0.12, label=f"equivalence band ±{margin:g} points")
    ax.axvline(0, color="0.3", lw=1)
    colors = {"better": "tab:blue", "worse": "tab:red", "equivalent": "tab:green"}

    def fin(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    n_boot = 0
    for y, r in zip(ys, d.to_dict("records")):
        c = colors.get(r.get("classification"), "0.35")
        m = r.get("mean")
        if not fin(m):
            continue
        lo, hi = r.get("ci_low"), r.get("ci_high")
        if fin(lo) and fin(hi):
            ax.plot([lo, hi], [y, y], color=c, lw=2.5, solid_capstyle="butt")
        # bootstrap CIs are null below stats.MIN_BOOTSTRAP_PAIRS pairs: nothing is drawn then
        blo, bhi = r.get("boot_low"), r.get("boot_high")
        if fin(blo) and fin(bhi):
            ax.plot([blo, bhi], [y - 0.18, y - 0.18], color=c, lw=1, alpha=0.7)
            n_boot += 1
        ax.plot([m], [y], "o", color=c, ms=7)
    ax.set_yticks(ys)
    ax.set_yticklabels(labels, fontsize=9)
    conf = conf_level(alpha)
    ax.set_ylim(-0.7, len(d) - 0.4)
    ax.set_xlabel("paired accuracy difference A − B (percentage points)")
    bmin = stats.get("bootstrap_min_pairs")
    if n_boot == len(d):
        title = f"thick: {conf}% t CI, thin: bootstrap CI"
    elif n_boot:
        title = f"thick: {conf}% t CI, thin: bootstrap CI where ≥ {bmin or '?'} pairs"
    else:
        title = f"bars: {conf}% t CI"
    ax.set_title(f"Accuracy deltas, paired by seed ({title})", fontsize=11)
    note = (f"no bootstrap CI below {bmin} paired seeds (too few distinct resamples)"
            if n_boot < len(d) and bmin else None)
    _below_axes(fig, ax, note)
    return fig


def _below_axes(fig, ax, note: str | None) -> None:
    """Lay out ``fig``, then put ax's legend (one row) and ``note`` right under its x-axis label.

    Both are figure artists outside the axes, so neither crosses the data (the note used to sit in the
    axes' lower right corner, across the zero line); ``bbox_inches="tight"`` keeps them in the file.
    """
    handles, labels = ax.get_legend_handles_labels()
    fig.tight_layout()
    renderer = fig.canvas.get_renderer() if hasattr(fig.canvas, "get_renderer") else fig._get_renderer()
    to_fig = fig.transFigure.inverted()
    pad = 4 / 72 / fig.get_figheight()  # 4 pt, in figure fraction
    x_mid = to_fig.transform(ax.get_window_extent(renderer).get_points()).mean(axis=0)[0]
    bottom = to_fig.transform(ax.get_tightbbox(renderer).get_points())[0][1]  # under tick labels + xlabel
    if handles:
        leg = fig.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(x_mid, bottom - pad),
                         bbox_transform=fig.transFigure, ncol=max(1, len(labels)), frameon=False,
                         borderaxespad=0.0)
        bottom = to_fig.transform(leg.get_window_extent(renderer).get_points())[0][1]
    if note:
        fig.text(x_mid, bottom - pad, note, ha="center", va="top", fontsize=7.5, color="0.4")


#: time_memory's columns: runs.csv column → (plotted column, scale, y label)
_TIME_MEMORY = {"train_seconds": ("train_s", 1.0, "training-loop time (s)"),
                "peak_memory_bytes": ("peak_mib", 1 / 2**20, "peak memory (MiB{kinds})")}


def plot_time_memory(runs, plt, sns, schedules=None):
    """Per precision (x) and stage (hue); every precision of the study keeps its column, with "k failed"
    over the stage whose runs failed; ``schedules``: stage-2 runs of schedules that failed as a whole (their
    stage 1 failed) are left out and counted with the failed ones, as the statistics leave them out."""
    df = runs.copy()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    if df.empty:
        for ax in axes:
            _empty(ax, "no runs")
        return fig
    df["stage_label"] = df["stage"].map({"pretrain": "stage 1 (pre-train)", "finetune": "stage 2 (fine-tune)"})
    df["precision"] = df["precision"].astype(str)
    ok = df["status"].fillna("ok") == "ok"
    of_failed = ok & (df["stage"] == "finetune") & df["run_id"].astype(str).isin(_failed_schedule_runs(schedules))
    left_out = ~ok | of_failed
    order = sorted(df["precision"].unique(), key=lambda p: (p != "fp32", p))
    hue_order = [h for h in ("stage 1 (pre-train)", "stage 2 (fine-tune)") if h in set(df["stage_label"])]
    # each stage its own colour (blue stage 1, orange stage 2, as the caption says), whichever stages ran
    palette = dict(zip(("stage 1 (pre-train)", "stage 2 (fine-tune)"), _colors(2)))
    failed = left_out.groupby([df["precision"], df["stage_label"]]).sum().to_dict()
    use = df[~left_out].copy()
    kinds = sorted({str(k) for k in use.get("memory_kind", []) if isinstance(k, str)})
    for ax, (src, (col, scale, ylabel)) in zip(axes, _TIME_MEMORY.items()):
        ylabel = ylabel.format(kinds=f", {', '.join(kinds)}" if kinds else "")
        values = use.get(src)  # a hand-made or older metrics.json may lack the column (stats skips it too)
        use[col] = values.astype(float) * scale if values is not None else math.nan
        if not use.empty and use[col].notna().any():
            sns.barplot(data=use, x="precision", y=col, hue="stage_label", order=order, hue_order=hue_order,
                        palette=palette, errorbar=None, alpha=0.45, ax=ax)
            sns.stripplot(data=use, x="precision", y=col, hue="stage_label", order=order, hue_order=hue_order,
                          palette=palette, dodge=True, jitter=0.1, size=4, ax=ax, legend=False)
            ax.legend(fontsize=8, title=None)
        else:
            ax.set_yticks([])
            why = ("no finished runs" if use.empty else
                   f"no {src} column in runs.csv" if values is None else f"no {src} recorded")
            _note(ax, why)
        _category_axis(ax, order, failed, dodge=hue_order)
        ax.set_xlabel("precision of the stage")
        ax.set_ylabel(ylabel)
    axes[0].set_title("Training time per stage and precision")
    axes[1].set_title("Peak memory per stage and precision")
    fig.tight_layout()
    if left_out.any():
        n_sched = int(of_failed.sum())
        note = "“k failed”: runs that failed (diverged, skipped, ...), not drawn"
        if n_sched:
            note += (f"; they include {n_sched} stage-2 run(s) that finished but whose stage 1 failed, "
                     "left out with their schedule as in the statistics")
        fig.text(0.5, 0.0, textwrap.fill(note, 140), ha="center", va="top", fontsize=8, color="0.4")
    return fig


def _failed_runs(ax, bad) -> None:
    """Failed runs' partial curves: thin dark dotted lines ending in ×, one legend entry for all.

    Not red: red is a schedule's colour in the stage-2 panel, and a failed run is no series of its own.
    """
    for k, (_, g) in enumerate(bad.sort_values("step").groupby("run_id", sort=True)):
        ax.plot(g["step"], g["loss"], ls=(0, (1, 1.5)), color="0.15", lw=1, marker="x", ms=5,
                markevery=[len(g) - 1], zorder=3, label=FAILED_RUN_LABEL if k == 0 else None)


def precision_order(precisions: Iterable[str]) -> list[str]:
    """Stage-1 precisions (specs) in the order that fixes their colours in every plot (sorted)."""
    return sorted({str(p) for p in precisions})


def plot_loss_curves(runs, schedules, steps, stats: dict, plt, sns):
    n_sched = schedules["schedule"].nunique()
    many = n_sched > LEGEND_INSIDE_MAX  # many schedules: legends right of the panels, not over the curves
    fig, axes = plt.subplots(1, 2, figsize=(12 + (6 if many else 0), 4.5))
    if steps.empty:
        for ax in axes:
            _empty(ax, "no steps.csv logs found")
        return fig
    st = steps.copy()
    st = st[st["loss"].map(lambda v: v is not None and math.isfinite(float(v)))]
    if "regular" in st:  # the log grid every run shares; a skipped step's extra row is the loss_scale plot's
        st = st[st["regular"].fillna(True).astype(bool)]
    order = _schedule_order(schedules, stats.get("baseline"))
    # stage 1: one curve per stage-1 precision, labelled with the schedules that share it
    pre = st[st["stage"] == "pretrain"].copy()
    ax = axes[0]
    if pre.empty:
        _empty(ax, "no stage-1 runs")
    else:
        users: dict[str, list[str]] = {}
        for s in order:
            p = schedules.loc[schedules["schedule"] == s, "stage1_precision"].dropna()
            if not p.empty:
                users.setdefault(p.iloc[0], []).append(s)
        pre["precision"] = pre["precision"].astype(str)
        precs = precision_order(pre["precision"])
        labels = {p: textwrap.fill(f"{p} ({', '.join(users.get(p, [])) or 'no schedule'})", 44,
                                   subsequent_indent="  ") for p in precs}
        ok = pre[pre["status"] == "ok"]
        means = _styled_lines(ax, sns, ok, "step", "loss", "precision", precs, _palette(precs), labels,
                              errorbar="sd") if not ok.empty else {}
        _failed_runs(ax, pre[pre["status"] != "ok"])
        ax.set_title("Stage 1: masked-LM training loss (mean ± SD over seeds)")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("training loss (nats/token)")
        _legend(ax, _coinciding(means), outside=many, fontsize=8, title="stage-1 precision (schedules)",
                title_fontsize=9)
    # stage 2: one curve per schedule
    ax = axes[1]
    fin = st[st["stage"] == "finetune"].copy()
    if fin.empty:
        _empty(ax, "no stage-2 runs")
    else:
        # a finished stage-2 run whose schedule failed (its stage 1 diverged or was skipped) is no data: the
        # statistics leave the schedule out, so it is not drawn (neither as a curve nor as a failed run)
        of_failed = (fin["status"] == "ok") & fin["run_id"].astype(str).isin(_failed_schedule_runs(schedules))
        left_out = fin[of_failed]
        fin = fin[~of_failed]
        ok = fin[fin["status"] == "ok"]
        present = [s for s in order if s in set(fin["schedule"])]
        means = _styled_lines(ax, sns, ok, "step", "loss", "schedule", present, _palette(present),
                              errorbar="sd") if not ok.empty else {}
        _failed_runs(ax, fin[fin["status"] != "ok"])
        notes = []
        if not left_out.empty:
            names = [s for s in order if s in set(left_out["schedule"])]
            notes.append(textwrap.fill(f"not drawn: {left_out['run_id'].nunique()} run(s) of schedules that failed "
                                       f"in stage 1 ({', '.join(names)})", 48))
        ax.set_title("Stage 2: fine-tuning loss (mean ± SD over seeds)")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("training loss (cross-entropy, nats)")
        if fin.empty:
            _empty(ax, "no stage-2 run to draw\n" + "\n".join(notes))
        else:
            _legend(ax, _coinciding(means), outside=many, notes=notes, fontsize=8, title="schedule",
                    title_fontsize=9)
    for ax in axes:
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
    fig.tight_layout()
    return fig


def _scales_loss(steps):
    """Per row of a steps table: its stage runs in fp16 in some part, its ``precision`` or the ``switch_to`` of
    an in-stage switch (fp32 → amp_fp16 makes its loss scaler at the switch and logs the scale from then on).
    make_plots computes it (column ``scales_loss``) before the precision column becomes the spec label."""
    if "scales_loss" in steps:
        return steps["scales_loss"].fillna(False).astype(bool)
    fp16 = steps["precision"].isin(FP16_PRECISIONS)
    if "switch_to" in steps:
        fp16 |= steps["switch_to"].isin(FP16_PRECISIONS)
    return fp16


def plot_loss_scale(steps, plt, sns):
    import pandas as pd

    st = steps.copy()
    if not st.empty and "loss_scale" in st:
        st = st[_scales_loss(st) & st["loss_scale"].notna()]
    else:
        st = st.iloc[0:0]
    stages = [s for s in ("pretrain", "finetune") if s in set(st.get("stage", []))]
    n_runs = max([st.loc[st["stage"] == s, "run_id"].nunique() for s in stages] or [0])
    width = 6 + (2.5 if n_runs > LEGEND_INSIDE_MAX else 0)  # room for a legend right of each panel
    fig, axes = plt.subplots(1, max(1, len(stages)), figsize=(width * max(1, len(stages)), 4.2), squeeze=False)
    axes = axes[0]
    if st.empty:
        _empty(axes[0], "no fp16 runs with a loss scale (amp_fp16 / pure_fp16)")
        return fig
    for ax, stage in zip(axes, stages):
        sub = st[st["stage"] == stage].copy()
        sub["group"] = sub.apply(
            lambda r: str(r["schedule"] if stage == "finetune" and isinstance(r["schedule"], str) else r["precision"]),
            axis=1)
        sub["run"] = sub.apply(lambda r: f"{r['group']} seed {r['seed']}", axis=1)
        # one colour, dash pattern and marker per run; runs ordered by group, then seed as a number
        runs_order = [k for _, k in sorted({((g, _seed_key(sd)), k) for g, sd, k in
                                            zip(sub["group"], sub["seed"], sub["run"])})]
        # a scale halved down to 0 (every step overflowing) has no place on a log axis, which drops it
        # silently: draw it at a floor below the smallest positive scale, marked and labelled
        positive = sub.loc[sub["loss_scale"] > 0, "loss_scale"]
        floor = float(positive.min()) / 4 if not positive.empty else 1.0
        zero = sub["loss_scale"] <= 0
        y = sub["loss_scale"].where(~zero, floor)
        means = _styled_lines(ax, sns, sub.assign(loss_scale=y.where(~zero)).sort_values("step"), "step",
                              "loss_scale", "run", runs_order, _palette(runs_order), drawstyle="steps-post",
                              errorbar=None)
        if zero.any():
            ax.plot(sub.loc[zero, "step"], y[zero], "v", color="black", ms=6, zorder=5,
                    label=f"loss scale 0 (drawn at {floor:g}): underflowed")
        sk = sub["skipped"].fillna(0).astype(float) > 0 if "skipped" in sub else pd.Series(False, index=sub.index)
        if sk.any():
            ax.plot(sub.loc[sk, "step"], y[sk], "x", color="tab:red", ms=7, mew=1.5, zorder=4,
                    label="skipped step (inf/NaN grads)")
        ax.set_yscale("log", base=2)
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("loss scale (log2 axis)")
        ax.set_title(f"{'Stage 1 (pre-train)' if stage == 'pretrain' else 'Stage 2 (fine-tune)'}: fp16 loss scale")
        _legend(ax, _coinciding(means, log=True), outside=len(runs_order) > LEGEND_INSIDE_MAX, fontsize=7)
    fig.tight_layout()
    return fig


def _seed_key(seed: Any) -> tuple:
    try:
        return (0, float(seed), "")
    except (TypeError, ValueError):
        return (1, 0.0, str(seed))


def plot_stage1(runs, stats: dict, plt, sns):
    from .stats import describe

    every = runs[runs["stage"] == "pretrain"].copy()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    if every.empty:
        for ax in axes:
            _empty(ax, "no stage-1 runs")
        return fig
    every["precision"] = every["precision"].astype(str)
    ok = every["status"].fillna("ok") == "ok"
    pre = every[ok].copy()
    alpha = stats.get("settings", {}).get("alpha", 0.05)
    base = stats.get("stage1_baseline_precision")
    # every stage-1 precision keeps its column: one whose runs all failed is the study's finding
    order = sorted(every["precision"].unique(), key=lambda p: (p != base, p))
    failed = (~ok).groupby(every["precision"]).sum().to_dict()
    pre["mlm_acc_pct"] = pre.get("mlm_accuracy").astype(float) * 100 if "mlm_accuracy" in pre else math.nan
    pre["eval_loss_f"] = pre["eval_loss"].astype(float) if "eval_loss" in pre else math.nan
    for ax, col, ylabel, title in ((axes[0], "eval_loss_f", "MLM eval loss (nats/token)", "Stage-1 eval loss"),
                                   (axes[1], "mlm_acc_pct", "masked-token accuracy (%)", "Stage-1 masked-token accuracy")):
        if pre.empty:  # every stage-1 run failed: the columns with their "k failed", no values
            ax.set_yticks([])
            _note(ax, "no finished stage-1 runs")
            _category_axis(ax, order, failed)
            ax.set_xlabel("stage-1 (pre-training) precision")
            ax.set_ylabel(ylabel)
            ax.set_title(title)
            continue
        if pre[col].notna().sum() == 0:
            _empty(ax, f"no {ylabel}")
            continue
        sns.stripplot(data=pre, x="precision", y=col, order=order, jitter=0.1, size=6, alpha=0.75, ax=ax)
        for i, p in enumerate(order):
            d = describe(pre.loc[pre["precision"] == p, col], alpha)
            if d["n"]:  # the mean of every precision with a finished run; its bar only where a t CI exists
                yerr = ([[d["mean"] - d["ci_low"]], [d["ci_high"] - d["mean"]]]
                        if math.isfinite(d["ci_low"]) else None)
                ax.errorbar(i + 0.25, d["mean"], yerr=yerr, fmt="D", color="black", capsize=5, ms=5)
        _category_axis(ax, order, failed)
        ax.set_xlabel("stage-1 (pre-training) precision")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    fig.suptitle(f"Stage 1 on its own, per precision (dots: seeds; ◆: mean and {conf_level(alpha)}% t CI)",
                 fontsize=11)
    fig.tight_layout()
    return fig


def plot_switch_point(schedules, stats: dict, plt, sns):
    """Accuracy and the swept stage's train time vs switch point, one line per sweep."""
    from .stats import describe, mark_outcomes

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    df = schedules.copy()
    if "sweep" not in df or df["sweep"].isna().all():
        for ax in axes:
            _empty(ax, "no sweep in this config\n(config key sweeps)")
        return fig
    df = mark_outcomes(df)
    df = df[df["sweep"].notna() & df["used"]].copy()
    alpha = stats.get("settings", {}).get("alpha", 0.05)
    conf = conf_level(alpha)
    df["x"] = df["sweep_at"].astype(float) * 100
    df["accuracy_pct"] = df["accuracy"].astype(float) * 100
    stage_of = df["sweep_stage"].map({"pretrain": 1, "finetune": 2}).fillna(2).astype(int)
    df["swept_seconds"] = [float(r.get(f"stage{k}_train_seconds", math.nan))
                           for k, (_, r) in zip(stage_of, df.iterrows())]
    stages = sorted(set(stage_of))
    panels = ((axes[0], "accuracy_pct", "fine-tuned accuracy (%)", "Accuracy vs switch point"),
              (axes[1], "swept_seconds",
               f"stage-{'/'.join(map(str, stages)) or 2} training-loop time (s)", "Swept stage's train time"))
    palette = _colors(df["sweep"].nunique())
    for ax, col, ylabel, title in panels:
        if df.empty:
            _empty(ax, "no finished sweep runs")
            continue
        n_sweeps = df["sweep"].nunique()
        for k, (color, (name, g)) in enumerate(zip(palette, df.groupby("sweep", sort=True))):
            pts = []
            for x, gx in g.groupby("x", sort=True):
                d = describe(gx[col], alpha)
                pts.append((x, d["mean"], d["ci_low"], d["ci_high"]))
            xs = [p[0] for p in pts]
            means = [p[1] for p in pts]
            style = _series_style(k, n_sweeps, len(xs))
            ax.plot(xs, means, color=color, label=str(name), ls=style["ls"], marker=style["marker"],
                    lw=style["lw"] * 0.7, ms=5, zorder=style["zorder"])
            for x, m, lo, hi in pts:
                if math.isfinite(lo) and math.isfinite(hi):
                    ax.plot([x, x], [lo, hi], color=color, lw=2, alpha=0.6)
            ax.scatter(g["x"], g[col], color=color, s=12, alpha=0.35)
        ax.set_xlabel("switch point\n(% of the swept stage's steps in its first precision)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.set_xlim(-5, 105)
        ax.legend(fontsize=8, title="sweep")
    fig.suptitle(f"Switch-point sweeps (lines: mean over seeds; bars: {conf}% t CI; dots: seeds)", fontsize=11)
    fig.tight_layout()
    return fig


def plot_overflow(acts, plt, sns):
    """Max |activation| per layer (over sampled steps and seeds) per stage-1 precision, log scale."""
    if acts.empty:
        fig, ax = plt.subplots(figsize=(8, 4))
        _empty(ax, "no activation telemetry\n(set train.pretrain.telemetry_every > 0)")
        return fig
    import numpy as np

    order = list(dict.fromkeys(acts["layer"]))  # module order of the first run (forward order)
    peak = acts.groupby(["spec", "layer"])["max_abs"].max().reset_index()
    # an output that already overflowed records max_abs inf, which a log axis drops without a word (and with
    # which every pair of curves "coincided"): drawn at a ceiling above every finite value, marked and labelled
    finite = peak.loc[np.isfinite(peak["max_abs"]), "max_abs"]
    ceiling = 4 * max(FP16_MAX, float(finite.max()) if not finite.empty else FP16_MAX)
    inf = np.isposinf(peak["max_abs"])
    peak["y"] = peak["max_abs"].where(~inf, ceiling)
    ticks = [str(x).replace("bert.encoder.", "").replace("bert.", "") for x in order]
    # the vertical layer names take ~0.055 in per character: the figure grows with them, so that the axes
    # keep their height (long names squeezed the axes below the height of the y label)
    longest = max((len(t) for t in ticks), default=0)
    fig, ax = plt.subplots(figsize=(max(8, 0.28 * len(order) + 3), max(5.0, 4.0 + 0.055 * longest)))
    pos = {layer: i for i, layer in enumerate(order)}
    peak["spec"] = peak["spec"].astype(str)
    specs = precision_order(peak["spec"])
    colors = _palette(specs)  # the same colour per stage-1 precision as in loss_curves
    for i, spec in enumerate(specs):
        g = peak[peak["spec"] == spec]
        g = g.assign(i=g["layer"].map(pos)).sort_values("i")
        style = _series_style(i, len(specs), len(g))
        style.update(lw=style["lw"] * 0.6, ms=style["ms"] * 0.7)
        ax.plot(g["i"], g["y"].clip(lower=1e-12), color=colors[spec], label=spec, **style)
    ax.axhline(FP16_MAX, color="tab:red", ls="--", lw=1.2, label="fp16 max 65504")
    if inf.any():
        ax.plot(peak.loc[inf, "layer"].map(pos), [ceiling] * int(inf.sum()), "^", color="black", ms=7, zorder=5,
                label=f"inf (drawn at {ceiling:g}): already overflowed")
    ax.set_yscale("log")
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels(ticks, rotation=90, fontsize=6)
    ax.set_ylabel("max |activation|\n(over sampled steps and seeds, log)")
    ax.set_xlabel("module output (Linear / LayerNorm, forward order)")
    over = peak[peak["max_abs"] > FP16_MAX]
    # telemetry samples every telemetry_every steps: a run can diverge between two samples, its sampled
    # maxima all finite and in range; "none exceeds it" alone would then read as "nothing went wrong"
    diverged = (acts.loc[acts["status"] == "diverged", ["spec", "seed"]].drop_duplicates()
                if "status" in acts else acts.iloc[0:0])
    title = "Stage 1: largest activations per layer vs the fp16 range" + (
        f" — {over['spec'].nunique()} precision(s) exceed it" if not over.empty else
        " — none exceeds it in the sampled steps" if not diverged.empty else " — none exceeds it")
    if not diverged.empty:
        named = [f"{sp} seed {sd}" for sp, sd in diverged.itertuples(index=False)]
        runs = ", ".join(named[:3]) + (f", {len(named) - 3} more" if len(named) > 3 else "")
        title += f"\n{len(diverged)} run(s) diverged ({runs}): the samples (every telemetry_every steps) may miss it"
    ax.set_title(title, fontsize=11 if diverged.empty else 10)
    curves = {spec: peak[peak["spec"] == spec].set_index(peak.loc[peak["spec"] == spec, "layer"].map(pos))["y"]
              for spec in specs}
    _legend(ax, _coinciding(curves, log=True), fontsize=8, title="stage-1 precision", title_fontsize=9)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------
def _targets(out_dir, outputs: Iterable[str | os.PathLike] | None) -> dict[str, list[Path]]:
    targets: dict[str, list[Path]] = {}
    if outputs:
        for o in outputs:
            p = Path(o)
            stem, ext = p.stem, p.suffix.lstrip(".").lower()
            if stem not in PLOT_NAMES:
                raise PrecswitchError(
                    f"plot output '{p}': unknown plot name '{stem}'; allowed: {', '.join(PLOT_NAMES)}")
            if ext not in FORMATS:
                raise PrecswitchError(f"plot output '{p}': format '{ext}' not allowed; allowed: png, svg")
            targets.setdefault(stem, []).append(p)
    if out_dir is not None:
        for name in PLOT_NAMES:
            for ext in FORMATS:
                p = Path(out_dir) / f"{name}.{ext}"
                if p not in targets.get(name, []):
                    targets.setdefault(name, []).append(p)
    if not targets:
        raise PrecswitchError("no plot outputs: give --out-dir DIR or --out FILE.png|svg ...")
    return targets


def _save(fig, path: Path) -> None:
    from ..io import atomic_path

    fmt = path.suffix.lstrip(".").lower()
    meta = {"Date": None} if fmt == "svg" else {"Software": None}
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, dpi=130, bbox_inches="tight", metadata=meta)


def _by_spec(table, col: str = "precision", spec: str = "spec"):
    """The table with ``col`` showing each stage by its spec (a stage that switched precision,
    amp_fp16-to-fp32-at80, or ran with overrides, is its own group), where the table has one."""
    if spec not in table:
        return table
    return table.assign(**{col: table[spec].where(table[spec].notna(), table[col])})


def make_plots(runs_path, schedules_path, stats_path, out_dir=None,
               outputs: Iterable[str | os.PathLike] | None = None, steps_path=None,
               activations_path=None) -> list[Path]:
    """Draw the requested plots from the tables of ``precswitch aggregate`` (runs, schedules and, for the
    curves and the overflow plot, steps and activations; a table not given draws as "nothing to show") and
    stats.json; return the written paths. Nothing in a run folder is read."""
    import pandas as pd

    given = [p for p in (runs_path, schedules_path, stats_path, steps_path, activations_path) if p is not None]
    for p in given:
        if not Path(p).is_file():
            raise PrecswitchError(f"plots input not found: {p}")
    targets = _targets(out_dir, outputs)
    from .aggregate import STEP_COLUMNS, STEP_RUN_COLUMNS
    from .aggregate import read_table

    runs = _by_spec(read_table(runs_path))
    schedules = _by_spec(read_table(schedules_path), "stage1_precision", "stage1_spec")
    with open(stats_path, encoding="utf-8") as f:
        stats = json.load(f)
    plt, sns = _setup()
    if steps_path is not None:
        steps = read_table(steps_path)
    else:
        steps = pd.DataFrame(columns=list(STEP_RUN_COLUMNS) + list(STEP_COLUMNS) + ["regular"])
    steps = _by_spec(steps.assign(scales_loss=_scales_loss(steps)))
    tables = Tables(runs, schedules, steps, stats, activations_path)
    written: list[Path] = []
    for name, draw in PLOTS.items():
        if name not in targets:
            continue
        fig = draw(tables, plt, sns)
        for path in targets[name]:
            _save(fig, path)
            written.append(path)
        plt.close(fig)
    return written


class Tables:
    """What the plots draw from: the aggregate tables and stats.json (activations read when a plot asks)."""

    def __init__(self, runs, schedules, steps, stats: dict, activations_path=None):
        self.runs, self.schedules, self.steps, self.stats = runs, schedules, steps, stats
        self.activations_path = activations_path


#: every plot by its file stem, in drawing order: a function of the tables (and matplotlib, seaborn)
PLOTS = {
    "accuracy": lambda t, plt, sns: plot_accuracy(t.schedules, t.stats, plt, sns),
    "forest": lambda t, plt, sns: plot_forest(t.stats, plt, sns),
    "time_memory": lambda t, plt, sns: plot_time_memory(t.runs, plt, sns, t.schedules),
    "loss_curves": lambda t, plt, sns: plot_loss_curves(t.runs, t.schedules, t.steps, t.stats, plt, sns),
    "loss_scale": lambda t, plt, sns: plot_loss_scale(t.steps, plt, sns),
    "stage1": lambda t, plt, sns: plot_stage1(t.runs, t.stats, plt, sns),
    "switch_point": lambda t, plt, sns: plot_switch_point(t.schedules, t.stats, plt, sns),
    "overflow": lambda t, plt, sns: plot_overflow(stage1_activations(t.activations_path), plt, sns),
}
PLOT_NAMES = tuple(PLOTS)


def stage1_activations(activations_path):
    """The stage-1 rows of an activations table (columns ``layer, max_abs, spec, seed, status``, ``spec``
    falling back to the precision), or an empty frame when no table is given."""
    import pandas as pd

    from .aggregate import read_table

    if activations_path is None:
        return pd.DataFrame(columns=["layer", "max_abs", "spec", "seed", "status"])
    acts = read_table(activations_path)
    acts = acts[acts["stage"] == "pretrain"] if "stage" in acts else acts
    spec = acts["spec"] if "spec" in acts else pd.Series(None, index=acts.index, dtype=object)
    if "precision" in acts:
        spec = spec.where(spec.notna(), acts["precision"])
    acts = acts.assign(spec=spec, max_abs=pd.to_numeric(acts["max_abs"], errors="coerce"))
    return acts.reset_index(drop=True)
