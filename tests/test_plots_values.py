"""What each plot draws, checked against hand-built tables (mutation audit of analysis/plots.py).

Every expected number (means, t intervals, SDs, MiB, percentages, maxima) is computed here from the input
tables with numpy/scipy, not taken from precswitch; the plots are read back from the matplotlib artists
(point offsets, line data, bar heights, error bars, tick and legend texts, titles)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from precswitch.analysis import plots
from precswitch.analysis.plots import FAILED_RUN_LABEL, FP16_MAX


@pytest.fixture
def mpl():
    plt, sns = plots._setup()
    yield plt, sns
    plt.close("all")


def _t_ci(values, alpha):
    """(mean, low, high) of the (1 − alpha) t interval, by hand."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    half = stats.t.ppf(1 - alpha / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean(), x.mean() - half, x.mean() + half


def _points(ax):
    """[(x, y, colour hex)] of every scatter point in the axes."""
    from matplotlib.collections import PathCollection

    out = []
    for c in ax.collections:
        offs = c.get_offsets()
        if not isinstance(c, PathCollection) or len(offs) == 0:
            continue
        fc = c.get_facecolors()
        for k, (x, y) in enumerate(np.asarray(offs, dtype=float)):
            if np.isfinite(x) and np.isfinite(y):
                out.append((float(x), float(y), to_hex(fc[k if len(fc) > 1 else 0])))
    return out


def _by_column(points, names):
    """{column name: sorted y values} of scatter points (x rounded to its column)."""
    col = {n: [] for n in names}
    for x, y, _ in points:
        col[names[round(x)]].append(round(y, 9))
    return {k: sorted(v) for k, v in col.items()}


def _errorbars(ax):
    """[(x, mean, low, high)] of the error bars (ax.errorbar) in the axes."""
    from matplotlib.container import ErrorbarContainer

    out = []
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer):
            data_line, _, bars = c.lines
            (x,), (y,) = data_line.get_xdata(), data_line.get_ydata()
            (seg,) = bars[0].get_segments()
            out.append((float(x), float(y), float(min(seg[:, 1])), float(max(seg[:, 1]))))
    return sorted(out)


def _failed_notes(ax):
    return {round(t.xy[0], 6): t.get_text() for t in ax.texts if t.get_text().endswith(" failed")}


# ---------------------------------------------------------------------------- accuracy
def _accuracy_table():
    rows = []
    acc = {"zz-base": [0.80, 0.82, 0.87], "a-one": [0.70, 0.76, 0.52], "m-two": [0.90, 0.91, 0.93]}
    for s, vals in acc.items():
        for seed, a in enumerate(vals, 1):
            rows.append({"schedule": s, "seed": seed, "status": "ok", "accuracy": a})
    # failed rows: a skipped one (its stage 1 failed; stage 2 still produced an accuracy), a diverged one
    # without accuracy, and a diverged one whose accuracy is finite: none of them is data
    rows += [{"schedule": "a-one", "seed": 4, "status": "skipped", "accuracy": 0.99},
             {"schedule": "a-one", "seed": 5, "status": "diverged", "accuracy": math.nan},
             {"schedule": "m-two", "seed": 4, "status": "diverged", "accuracy": 0.99}]
    df = pd.DataFrame(rows)
    df["majority_accuracy"] = 0.55
    return df


def test_accuracy_points_means_and_t_intervals_per_schedule(mpl):
    """Percent axis, baseline first, every used seed's dot (degenerate ones red), the mean and the (1 − alpha)
    t CI of the settings' alpha over the used runs, the majority line at its percentage, failures counted."""
    alpha = 0.1
    df = _accuracy_table()
    fig = plots.plot_accuracy(df, {"baseline": "zz-base", "settings": {"alpha": alpha}}, *mpl)
    ax = fig.axes[0]
    names = ["zz-base", "a-one", "m-two"]
    assert [t.get_text() for t in ax.get_xticklabels()] == names
    assert "(%)" in ax.get_ylabel()
    pts = _points(ax)
    assert _by_column(pts, names) == {"zz-base": [80.0, 82.0, 87.0], "a-one": [52.0, 70.0, 76.0],
                                      "m-two": [90.0, 91.0, 93.0]}
    # 52% ≤ 55% majority: degenerate, red; every other dot blue
    assert {round(y): c for _, y, c in pts if c == to_hex("tab:red")} == {52: to_hex("tab:red")}
    assert all(c == to_hex("tab:blue") for _, y, c in pts if round(y) != 52)
    bars = _errorbars(ax)
    assert len(bars) == 3
    for i, (x, m, lo, hi) in enumerate(bars):
        exp = _t_ci([100 * a for a in df.loc[(df["schedule"] == names[i]) & (df["status"] == "ok"), "accuracy"]],
                    alpha)
        assert x == pytest.approx(i + 0.3)
        assert (m, lo, hi) == pytest.approx(exp, rel=1e-9)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "mean, 90% t CI" in labels
    (maj,) = [ln for ln in ax.get_lines() if ln.get_label() == "majority-class accuracy"]
    assert list(maj.get_ydata()) == pytest.approx([55.0, 55.0])
    # a-one: the skipped and the diverged seed; m-two: the diverged seed (with an accuracy)
    assert _failed_notes(ax) == {1.0: "2 failed", 2.0: "1 failed"}


# ---------------------------------------------------------------------------- forest
def _delta(family, a, b, mean, lo, hi, cls, metric="accuracy", n=8, blo=None, bhi=None):
    return {"family": family, "a": a, "b": b, "metric": metric, "kind": "difference", "n_pairs": n, "mean": mean,
            "ci_low": lo, "ci_high": hi, "boot_low": blo, "boot_high": bhi, "classification": cls}


def test_forest_rows_bars_colours_and_band(mpl):
    """One row per accuracy contrast, top to bottom in the table's order (a named contrast repeating a
    vs-baseline one shown once; other metrics and families not drawn): the dot at the mean, the thick bar the
    t CI, the thin bar the bootstrap CI, coloured by classification; the band is ±margin of the settings."""
    deltas = [  # a time row first: the plot must pick the accuracy rows, not each pair's first row
        _delta("vs_baseline", "a-one", "zz-base", 0.9, 0.8, 1.0, "better", metric="stage2_train_seconds"),
        _delta("vs_baseline", "a-one", "zz-base", -3.0, -4.5, -1.5, "worse", blo=-4.2, bhi=-1.8),
        _delta("vs_baseline", "m-two", "zz-base", 2.0, 1.0, 3.0, "better", n=5),
        _delta("vs_baseline", "q-three", "zz-base", 0.1, -0.3, 0.4, "equivalent", blo=-0.2, bhi=0.3),
        _delta("named", "a-one", "zz-base", -3.0, -4.5, -1.5, "worse", blo=-4.2, bhi=-1.8),
        _delta("named", "m-two", "a-one", 5.0, -1.0, 11.0, "inconclusive", blo=-0.5, bhi=10.0),
        _delta("stage1", "amp_fp16", "fp32", 0.5, 0.1, 0.9, "worse", metric="mlm_accuracy"),
    ]
    stats = {"deltas": deltas, "settings": {"margin": 0.5, "alpha": 0.1}, "bootstrap_min_pairs": 8}
    fig = plots.plot_forest(stats, *mpl)
    ax = fig.axes[0]
    expect = [("a-one vs zz-base", -3.0, (-4.5, -1.5), (-4.2, -1.8), "tab:red", "worse"),
              ("m-two vs zz-base", 2.0, (1.0, 3.0), None, "tab:blue", "better"),
              ("q-three vs zz-base", 0.1, (-0.3, 0.4), (-0.2, 0.3), "tab:green", "equivalent"),
              ("m-two vs a-one", 5.0, (-1.0, 11.0), (-0.5, 10.0), "0.35", "inconclusive")]
    ticks = sorted(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels())), reverse=True)
    assert len(ticks) == len(expect)  # top to bottom
    lines = ax.get_lines()
    for (y, label), (name, mean, ci, boot, colour, cls) in zip(ticks, expect):
        assert label.startswith(name + " ") and cls in label and (f"n={5 if cls == 'better' else 8}") in label
        dots = [ln for ln in lines if ln.get_marker() == "o" and list(ln.get_ydata()) == [y]]
        assert len(dots) == 1 and list(dots[0].get_xdata()) == pytest.approx([mean]), name
        assert to_hex(dots[0].get_color()) == to_hex(colour), name
        thick = [ln for ln in lines if list(ln.get_ydata()) == [y, y]]
        assert len(thick) == 1 and list(thick[0].get_xdata()) == pytest.approx(list(ci)), name
        assert to_hex(thick[0].get_color()) == to_hex(colour)
        thin = [ln for ln in lines if list(ln.get_ydata()) == pytest.approx([y - 0.18, y - 0.18])]
        if boot is None:
            assert not thin, name
        else:
            assert len(thin) == 1 and list(thin[0].get_xdata()) == pytest.approx(list(boot)), name
    (band,) = [p for p in ax.patches if p.get_label().startswith("equivalence band")]
    x0, x1 = band.get_x(), band.get_x() + band.get_width()
    assert (x0, x1) == pytest.approx((-0.5, 0.5))
    assert band.get_label() == "equivalence band ±0.5 points"
    assert "90% t CI" in ax.get_title() and "bootstrap CI where ≥ 8 pairs" in ax.get_title()
    assert "percentage points" in ax.get_xlabel()


# ---------------------------------------------------------------------------- time_memory
MIB = 2**20


def _bars(ax):
    """{(x centre rounded, height)} of the bars in the axes."""
    out = []
    for p in ax.patches:
        h = p.get_height()
        if p.get_width() > 0 and np.isfinite(h) and h != 0:
            out.append((round(p.get_x() + p.get_width() / 2, 6), h))
    return sorted(out)


def test_time_memory_bar_heights_are_means_in_seconds_and_mib(mpl):
    """Bars: the mean per precision (fp32 first) and stage (stage 1 left, stage 2 right) over finished runs;
    memory in MiB (2^20 bytes), labelled with its kind; a failed run and a finished stage-2 run of a failed
    schedule are left out and counted over their own stage."""
    rows = []

    def add(rid, stage, prec, secs, mib, status="ok"):
        rows.append({"run_id": rid, "stage": stage, "precision": prec, "status": status, "train_seconds": secs,
                     "peak_memory_bytes": mib * MIB, "memory_kind": "cpu_peak_rss"})

    for k, (s, m) in enumerate([(10, 100), (11, 110), (30, 150)], 1):  # mean 17 s, median 11 s
        add(f"pre-fp32-{k}", "pretrain", "fp32", s, m)
    for k, (s, m) in enumerate([(5, 50), (6, 60), (7, 70)], 1):
        add(f"pre-bf16-{k}", "pretrain", "amp_bf16", s, m)
    add("pre-bf16-4", "pretrain", "amp_bf16", 1000, 5000, status="diverged")
    for k, (s, m) in enumerate([(2, 200), (3, 210), (4, 220)], 1):
        add(f"ft-a-{k}", "finetune", "fp32", s, m)
    for k, (s, m) in enumerate([(1, 30), (1, 30), (4, 60)], 1):
        add(f"ft-c-{k}", "finetune", "amp_bf16", s, m)
    add("ft-b-1", "finetune", "fp32", 500, 9000)  # finished, but its schedule's stage 1 failed
    runs = pd.DataFrame(rows)
    schedules = pd.DataFrame({"schedule": ["a", "b"], "stage2_run_id": ["ft-a-1", "ft-b-1"],
                              "status": ["ok", "skipped"], "stage2_status": ["ok", "ok"]})
    fig = plots.plot_time_memory(runs, *mpl, schedules)
    t_ax, m_ax = fig.axes[:2]
    ok = runs[(runs["status"] == "ok") & (runs["run_id"] != "ft-b-1")]
    for ax, col, scale in ((t_ax, "train_seconds", 1.0), (m_ax, "peak_memory_bytes", 1 / MIB)):
        assert [t.get_text() for t in ax.get_xticklabels()] == ["fp32", "amp_bf16"]
        expected = []
        for i, prec in enumerate(["fp32", "amp_bf16"]):
            for dx, stage in ((-0.2, "pretrain"), (0.2, "finetune")):
                v = ok.loc[(ok["precision"] == prec) & (ok["stage"] == stage), col] * scale
                expected.append((round(i + dx, 6), pytest.approx(float(np.mean(v)), rel=1e-9)))
        assert _bars(ax) == expected, col
        assert len(_points(ax)) == len(ok)
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["stage 1 (pre-train)", "stage 2 (fine-tune)"]
        assert _failed_notes(ax) == {0.2: "1 failed", 0.8: "1 failed"}
    assert t_ax.get_ylabel() == "training-loop time (s)"
    assert m_ax.get_ylabel() == "peak memory (MiB, cpu_peak_rss)"


# ---------------------------------------------------------------------------- loss_curves
def _steps(rows):
    st = pd.DataFrame(rows, columns=["stage", "precision", "schedule", "run_id", "seed", "status", "step", "loss"])
    st["regular"] = True
    return st


def _curve(ax, label):
    (ln,) = [ln for ln in ax.get_lines() if ln.get_label() == label]
    return ln


def _band(ax, colour):
    """{x: (low, high)} of the fill_between band drawn in ``colour``."""
    for c in ax.collections:
        fc = c.get_facecolor()
        if len(fc) and to_hex(fc[0]) == to_hex(colour) and c.get_paths():
            v = c.get_paths()[0].vertices
            out = {}
            for x, y in v:
                lo, hi = out.get(round(x, 6), (math.inf, -math.inf))
                out[round(x, 6)] = (min(lo, y), max(hi, y))
            return out
    raise AssertionError(f"no band in {colour}")


def test_loss_curves_mean_and_sd_band_over_finished_seeds(mpl):
    """Each curve is the per-step mean over the finished seeds (a non-finite loss left out, a diverged run's
    loss never averaged in), its band ± the sample SD; the diverged runs are dotted lines ending in × at their
    last finite loss; the stage-1 legend names the schedules whose stage 1 each precision is."""
    rows = []
    pre = {("fp32", 1): [6.0, 5.0, 4.0, 3.0], ("fp32", 2): [6.4, 5.4, 4.6, 3.2], ("fp32", 3): [6.2, math.inf, 4.1, 3.9],
           ("amp_fp16", 1): [6.0, 5.5, 4.5, 3.5], ("amp_fp16", 2): [6.6, 5.1, 4.9, 3.3]}
    for (p, s), losses in pre.items():
        rows += [("pretrain", p, None, f"pre-{p}-{s}", s, "ok", i, v) for i, v in enumerate(losses, 1)]
    rows += [("pretrain", "amp_fp16", None, "pre-amp_fp16-3", 3, "diverged", i, v)
             for i, v in enumerate([9.0, 12.0, math.nan], 1)]
    fin = {("s-a", 1): [1.0, 0.8, 0.6], ("s-a", 2): [1.2, 0.7, 0.5], ("s-a", 3): [0.9, 0.9, 0.7],
           ("s-b", 1): [1.1, 1.0, 0.9], ("s-b", 2): [1.3, 0.8, 0.4], ("s-b", 3): [1.0, 0.6, 0.5]}
    for (sch, s), losses in fin.items():
        rows += [("finetune", "fp32", sch, f"ft-{sch}-{s}", s, "ok", i, v) for i, v in enumerate(losses, 1)]
    rows += [("finetune", "fp32", "s-a", "ft-s-a-4", 4, "diverged", i, v) for i, v in enumerate([1.0, 5.0], 1)]
    steps = _steps(rows)
    schedules = pd.DataFrame({"schedule": ["s-a", "s-b"], "stage1_precision": ["fp32", "amp_fp16"],
                              "stage2_precision": ["fp32", "fp32"], "status": ["ok", "ok"]})
    fig = plots.plot_loss_curves(None, schedules, steps, {"baseline": "s-a"}, *mpl)
    ax1, ax2 = fig.axes[:2]

    def check(ax, label, series):
        """series: {seed: losses}; the expected mean and mean ± SD, finite values only, per step."""
        ln = _curve(ax, label)
        arr = np.array(list(series.values()), dtype=float)
        arr[~np.isfinite(arr)] = np.nan
        mean = np.nanmean(arr, axis=0)
        sd = np.nanstd(arr, axis=0, ddof=1)
        assert list(ln.get_xdata()) == list(range(1, arr.shape[1] + 1)), label
        assert list(ln.get_ydata()) == pytest.approx(list(mean), rel=1e-9), label
        band = _band(ax, ln.get_color())
        assert [band[x] for x in sorted(band)] == [pytest.approx((m - d, m + d), rel=1e-9)
                                                   for m, d in zip(mean, sd)], label

    check(ax1, "fp32 (s-a)", {s: v for (p, s), v in pre.items() if p == "fp32"})
    check(ax1, "amp_fp16 (s-b)", {s: v for (p, s), v in pre.items() if p == "amp_fp16"})
    check(ax2, "s-a", {s: v for (sch, s), v in fin.items() if sch == "s-a"})
    check(ax2, "s-b", {s: v for (sch, s), v in fin.items() if sch == "s-b"})
    for ax, last in ((ax1, 2), (ax2, 2)):  # the × on the last finite loss of the failed run
        bad = _curve(ax, FAILED_RUN_LABEL)
        (k,) = bad.get_markevery()
        assert bad.get_xdata()[k] == last and bad.get_marker() == "x"
    assert [lab for lab in (t.get_text() for t in ax2.get_legend().get_texts())][:2] == ["s-a", "s-b"]
    assert ax1.get_ylabel() == "training loss (nats/token)" and ax2.get_xlabel() == "optimizer step"


# ---------------------------------------------------------------------------- loss_scale
def test_loss_scale_traces_of_fp16_specs_on_a_log2_axis(mpl):
    """A switched fp16 stage 1 (spec amp_fp16-to-fp32-at80, shown in the precision column as make_plots passes it,
    with scales_loss from its structure columns) is an fp16 run: its traces are drawn, one per seed in numeric
    seed order (2 before 10), on a log2 axis, with its skipped steps marked at their scale; a bf16 run (no loss
    scale) is not."""
    rows = []
    for seed, scales in ((10, [65536.0, 32768.0, 32768.0]), (2, [65536.0, 65536.0, 16384.0])):
        for i, sc in enumerate(scales, 1):
            skipped = int(i > 1 and sc < scales[i - 2])
            rows.append({"stage": "pretrain", "precision": "amp_fp16-to-fp32-at80", "schedule": None,
                         "run_id": f"pre-sw-{seed}", "seed": seed, "status": "ok", "step": i, "loss": 5.0,
                         "loss_scale": sc, "skipped": skipped, "regular": True, "scales_loss": True})
    rows += [{"stage": "pretrain", "precision": "amp_bf16", "schedule": None, "run_id": "pre-bf16-1", "seed": 1,
              "status": "ok", "step": i, "loss": 5.0, "loss_scale": math.nan, "skipped": 0, "regular": True,
              "scales_loss": False}
             for i in (1, 2, 3)]
    fig = plots.plot_loss_scale(pd.DataFrame(rows), *mpl)
    assert len(fig.axes) == 1
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.yaxis.get_transform().base == 2
    traces = [ln for ln in ax.get_lines() if ln.get_label().startswith("amp_fp16-to-fp32-at80 seed")]
    assert [ln.get_label() for ln in traces] == ["amp_fp16-to-fp32-at80 seed 2", "amp_fp16-to-fp32-at80 seed 10"]
    assert [list(ln.get_ydata()) for ln in traces] == [[65536.0, 65536.0, 16384.0], [65536.0, 32768.0, 32768.0]]
    (skips,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("skipped step")]
    assert sorted(zip(skips.get_xdata(), skips.get_ydata())) == [(2, 32768.0), (3, 16384.0)]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert not any("bf16" in t for t in labels)


# ---------------------------------------------------------------------------- stage1
def test_stage1_panels_points_and_t_intervals(mpl):
    """Left the eval loss, right the masked-token accuracy in %; the baseline precision first; dots are the
    finished runs, the diamond and bar their mean and (1 − alpha) t CI; a skipped run counts as failed."""
    alpha = 0.1
    rows = []
    vals = {"fp32": [(2.0, 0.30), (2.1, 0.32), (2.5, 0.37)], "amp_bf16": [(2.2, 0.29), (2.2, 0.31), (2.3, 0.36)]}
    for p, v in vals.items():
        for s, (loss, acc) in enumerate(v, 1):
            rows.append({"stage": "pretrain", "precision": p, "seed": s, "status": "ok", "eval_loss": loss,
                         "mlm_accuracy": acc})
    rows.append({"stage": "pretrain", "precision": "amp_bf16", "seed": 4, "status": "skipped", "eval_loss": 9.0,
                 "mlm_accuracy": 0.9})
    rows.append({"stage": "finetune", "precision": "fp32", "seed": 1, "status": "ok", "eval_loss": 0.4,
                 "mlm_accuracy": math.nan})
    fig = plots.plot_stage1(pd.DataFrame(rows), {"stage1_baseline_precision": "fp32", "settings": {"alpha": alpha}},
                            *mpl)
    names = ["fp32", "amp_bf16"]
    for ax, k, scale, word in ((fig.axes[0], 0, 1, "eval loss"), (fig.axes[1], 1, 100, "accuracy (%)")):
        assert word in ax.get_ylabel()
        assert [t.get_text() for t in ax.get_xticklabels()] == names
        assert _by_column(_points(ax), names) == {p: sorted(round(v[k] * scale, 9) for v in vals[p]) for p in names}
        bars = _errorbars(ax)
        for i, (x, m, lo, hi) in enumerate(bars):
            assert x == pytest.approx(i + 0.25)
            assert (m, lo, hi) == pytest.approx(_t_ci([v[k] * scale for v in vals[names[i]]], alpha), rel=1e-9)
        assert len(bars) == 2
        assert _failed_notes(ax) == {1.0: "1 failed"}
    assert "90% t CI" in fig._suptitle.get_text()


# ---------------------------------------------------------------------------- switch_point
def test_switch_point_means_cis_and_swept_stage_time(mpl):
    """x in % of the swept stage's steps; lines join the means over the finished seeds, bars are their t CI;
    the time panel shows the swept stage's (here stage 1) training-loop time; a failed run is left out."""
    alpha = 0.1
    acc = {0.0: [0.80, 0.81, 0.83], 0.5: [0.70, 0.71, 0.80], 1.0: [0.60, 0.64, 0.65]}
    t1 = {0.0: [100.0, 110.0, 130.0], 0.5: [80.0, 81.0, 95.0], 1.0: [50.0, 52.0, 60.0]}
    rows = [{"schedule": "base", "seed": 1, "status": "ok", "accuracy": 0.9, "sweep": None, "sweep_at": None,
             "sweep_stage": None, "stage1_train_seconds": 1.0, "stage2_train_seconds": 1.0}]
    for at in acc:
        for s in range(3):
            rows.append({"schedule": f"sw-at{int(at * 100)}", "seed": s + 1, "status": "ok", "accuracy": acc[at][s],
                         "sweep": "sw", "sweep_at": at, "sweep_stage": "pretrain",
                         "stage1_train_seconds": t1[at][s], "stage2_train_seconds": 7.0})
    rows.append({"schedule": "sw-at50", "seed": 4, "status": "diverged", "accuracy": math.nan, "sweep": "sw",
                 "sweep_at": 0.5, "sweep_stage": "pretrain", "stage1_train_seconds": 999.0,
                 "stage2_train_seconds": 7.0})
    df = pd.DataFrame(rows)
    df["majority_accuracy"] = 0.5
    fig = plots.plot_switch_point(df, {"settings": {"alpha": alpha}}, *mpl)
    for ax, table, scale in ((fig.axes[0], acc, 100), (fig.axes[1], t1, 1)):
        (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "sw"]
        assert list(line.get_xdata()) == [0.0, 50.0, 100.0]
        ci = [_t_ci([v * scale for v in table[at]], alpha) for at in (0.0, 0.5, 1.0)]
        assert list(line.get_ydata()) == pytest.approx([c[0] for c in ci], rel=1e-9)
        bars = sorted((ln.get_xdata()[0], *ln.get_ydata()) for ln in ax.get_lines()
                      if len(ln.get_xdata()) == 2 and ln.get_xdata()[0] == ln.get_xdata()[1])
        assert bars == [(x, pytest.approx(c[1], rel=1e-9), pytest.approx(c[2], rel=1e-9))
                        for x, c in zip((0.0, 50.0, 100.0), ci)]
        assert sorted(round(y, 9) for _, y, _ in _points(ax)) == sorted(
            round(v * scale, 9) for at in table for v in table[at])
    assert fig.axes[1].get_ylabel() == "stage-1 training-loop time (s)"
    assert fig.axes[0].get_ylabel() == "fine-tuned accuracy (%)"


# ---------------------------------------------------------------------------- overflow
LAYERS = ["bert.embeddings.LayerNorm", "bert.encoder.layer.2.output.dense", "bert.encoder.layer.10.output.dense"]


def test_overflow_peaks_per_layer_in_forward_order_against_65504(mpl):
    """Per stage-1 precision, the largest |activation| over steps and seeds per layer, in the layers' forward
    order (layer.2 before layer.10), on a log axis, against fp16's 65504; the title counts the precisions
    (not the layers) that exceed it."""
    peaks = {("fp32", 1): [10.0, 100.0, 1000.0], ("fp32", 2): [20.0, 50.0, 3000.0],
             ("amp_bf16", 1): [1e5, 7e4, 10.0], ("amp_bf16", 2): [5.0, 8e4, 20.0]}
    rows = [{"step": st, "layer": layer, "max_abs": v / (1 + st), "spec": p, "seed": s, "status": "ok"}
            for (p, s), vals in peaks.items() for st in (0, 1) for layer, v in zip(LAYERS, vals)]
    fig = plots.plot_overflow(pd.DataFrame(rows), *mpl)
    ax = fig.axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert len(ticks) == 3 and "embeddings" in ticks[0] and "layer.2." in ticks[1] and "layer.10." in ticks[2]
    for p in ("fp32", "amp_bf16"):
        (ln,) = [ln for ln in ax.get_lines() if ln.get_label() == p]
        exp = np.max([peaks[(p, 1)], peaks[(p, 2)]], axis=0)  # step 0 is each seed's largest
        assert list(ln.get_xdata()) == [0, 1, 2] and list(ln.get_ydata()) == pytest.approx(list(exp))
    (limit,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("fp16 max")]
    assert list(limit.get_ydata()) == [FP16_MAX, FP16_MAX] and FP16_MAX == 65504.0
    assert ax.get_yscale() == "log"
    assert "1 precision(s) exceed it" in ax.get_title()


def test_stage1_activations_keep_a_switched_stage1_apart(tmp_path):
    """A stage 1 that switched precision (spec amp_fp16-to-fp32-at80) is its own group, not amp_fp16's; a row
    without a spec falls back to its precision."""
    pd.DataFrame([{"run_id": r, "stage": "pretrain", "precision": "amp_fp16", "switch_to": to, "spec": spec,
                   "seed": 1, "status": "ok", "layer": "l0", "max_abs": 1.5}
                  for r, to, spec in (("a", "fp32", "amp_fp16-to-fp32-at80"), ("b", None, None))]
                 ).to_csv(tmp_path / "activations.csv", index=False)
    acts = plots.stage1_activations(tmp_path / "activations.csv")
    assert sorted(acts["spec"]) == ["amp_fp16", "amp_fp16-to-fp32-at80"]


# ---------------------------------------------------------------------------- helpers
def test_coinciding_uses_one_percent_of_the_range_everywhere_and_log_on_log_axes():
    x = [0, 1, 2]
    s = lambda v: pd.Series(v, index=x)  # noqa: E731
    # 0.5 apart on a 1..3.5 range (tolerance 0.025): apart, though equal at x 0 and 1
    assert plots._coinciding({"a": s([1.0, 2.0, 3.0]), "b": s([1.0, 2.0, 3.5])}) == []
    assert plots._coinciding({"a": s([1.0, 2.0, 3.0]), "b": s([1.0, 2.0, 3.02])}) == [["a", "b"]]
    # 1 vs 1.5 is 0.18 decades apart on a 2-decade log axis: apart there, though 0.5 of 99 on a linear one
    a, b = s([1.0, 10.0, 100.0]), s([1.5, 10.0, 100.0])
    assert plots._coinciding({"a": a, "b": b}, log=True) == []
    assert plots._coinciding({"a": a, "b": b}) == [["a", "b"]]


def test_overlap_note_names_seeds_of_one_group_once_only():
    assert " ".join(plots._overlap_note(["amp_fp16 seed 1", "amp_fp16 seed 2"]).split()) == \
        "lines overlap: curves coincide (amp_fp16 seeds 1, 2)"
    assert " ".join(plots._overlap_note(["amp_fp16 seed 1", "pure_fp16 seed 1"]).split()) == \
        "lines overlap: curves coincide (amp_fp16 seed 1, pure_fp16 seed 1)"


def test_series_style_gives_each_series_its_own_dash_marker_and_a_thinner_line():
    styles = [plots._series_style(i, 4, 40) for i in range(4)]
    assert len({str(s["ls"]) for s in styles}) == 4  # a dash pattern of its own, not only a marker
    assert len({s["marker"] for s in styles}) == 4
    widths = [s["lw"] for s in styles]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == 4  # later (upper) lines thinner
    assert [s["zorder"] for s in styles] == sorted(s["zorder"] for s in styles)


def test_make_plots_groups_a_switched_stage_by_its_spec(tmp_path, monkeypatch):
    """runs.csv's ``spec`` names a stage that switched precision (amp_fp16-to-fp32-at80): make_plots shows it as
    its own group, apart from the plain amp_fp16 runs, with its own bar."""
    from plot_helpers import figures

    rows = [{"run_id": f"pre-{tag}-{s}", "stage": "pretrain", "precision": p, "spec": spec, "status": "ok", "seed": s,
             "train_seconds": secs + s, "peak_memory_bytes": 100 * MIB}
            for tag, p, spec, secs in (("fp32", "fp32", None, 10), ("a", "amp_fp16", None, 20),
                                       ("sw", "amp_fp16", "amp_fp16-to-fp32-at80", 40))
            for s in (1, 2)]
    pd.DataFrame(rows).to_csv(tmp_path / "runs.csv", index=False)
    pd.DataFrame({"schedule": ["x"], "seed": [1], "status": ["ok"], "accuracy": [0.8]}).to_csv(
        tmp_path / "schedules.csv", index=False)
    (tmp_path / "stats.json").write_text(json.dumps({"baseline": "x", "settings": {"alpha": 0.05}}))
    ax = figures(monkeypatch, tmp_path, ["time_memory"])["time_memory"].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fp32", "amp_fp16", "amp_fp16-to-fp32-at80"]
    # one hue level (stage 1 only): each bar centred on its column, the mean of seeds 1 and 2
    assert _bars(ax) == [(0.0, pytest.approx(11.5)), (1.0, pytest.approx(21.5)), (2.0, pytest.approx(41.5))]


def test_loss_scale_draws_a_stage_that_switches_into_fp16(mpl):
    """A stage may switch *into* fp16 (fp32 → amp_fp16, both keep fp32 weights): the engine makes a loss scaler
    at the switch and logs its scale from then on. The plot kept only specs whose *first* precision is fp16,
    so such a run (precision fp32, switch_to amp_fp16, e.g. a switch-point sweep towards fp16) vanished, and
    with no other fp16 run the panel said "no fp16 runs with a loss scale"."""
    rows = [{"stage": "finetune", "precision": "fp32", "switch_to": "amp_fp16", "schedule": "ft-sw-at50",
             "run_id": "ft-sw-1", "seed": 1, "status": "ok", "step": i, "loss": 1.0, "loss_scale": sc,
             "skipped": int(i == 4), "regular": True}
            for i, sc in enumerate([math.nan, math.nan, 65536.0, 32768.0], 1)]
    fig = plots.plot_loss_scale(pd.DataFrame(rows), *mpl)
    ax = fig.axes[0]
    (trace,) = [ln for ln in ax.get_lines() if ln.get_label() == "ft-sw-at50 seed 1"]
    assert list(zip(trace.get_xdata(), trace.get_ydata())) == [(3, 65536.0), (4, 32768.0)]
    (skips,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("skipped step")]
    assert list(zip(skips.get_xdata(), skips.get_ydata())) == [(4, 32768.0)]
    assert "Stage 2" in ax.get_title() and not any("no fp16 runs" in t.get_text() for t in ax.texts)


def test_time_memory_stage_colours_are_fixed_per_stage(mpl):
    """The caption says blue is stage 1 and orange stage 2. The colours came from the stages present, so a
    study without any stage 1 (every schedule fine-tunes from scratch) drew its stage-2 bars and dots blue."""
    import seaborn as sns

    blue, orange = (to_hex(c) for c in sns.color_palette(n_colors=2))

    def colours(stages):
        runs = pd.DataFrame([{"run_id": f"{st}-{s}", "stage": st, "precision": "fp32", "status": "ok",
                              "train_seconds": 1.0 + s, "peak_memory_bytes": MIB} for st in stages for s in (1, 2)])
        ax = plots.plot_time_memory(runs, *mpl).axes[0]
        leg = ax.get_legend()
        legend = {t.get_text(): to_hex(h.get_facecolor()) for t, h in zip(leg.get_texts(), leg.legend_handles)}
        bars = {round(p.get_x() + p.get_width() / 2, 6): to_hex(p.get_facecolor()) for p in ax.patches}
        return legend, bars, {round(x, 1): c for x, _, c in _points(ax)}

    legend, bars, dots = colours(("pretrain", "finetune"))
    assert list(legend) == ["stage 1 (pre-train)", "stage 2 (fine-tune)"]
    assert {x: c for x, c in dots.items()} == {-0.2: blue, 0.2: orange}  # the dots in the palette's own colours
    legend2, bars2, dots2 = colours(("finetune",))
    assert legend2 == {"stage 2 (fine-tune)": legend["stage 2 (fine-tune)"]}  # stage 2 keeps its colour
    assert set(bars2.values()) == {bars[0.2]} and set(dots2.values()) == {orange}


def test_overflow_draws_an_activation_that_already_overflowed(mpl):
    """Telemetry records max_abs = inf for an output that already overflowed (telemetry.py). A log axis drops
    inf without a word: the worst layer of the run was a gap in its line, and inf made every pair of curves
    'coincide' (the legend said 'lines overlap' of curves 10 vs 12 and 100 vs inf apart). The inf peak is now
    drawn at a ceiling above every finite value and 65504, marked and labelled, and the curves differ."""
    rows = [{"step": 0, "layer": layer, "max_abs": v, "spec": spec, "seed": 1, "status": "ok"}
            for spec, vals in (("fp32", [10.0, 100.0, 1e5]), ("pure_fp16", [12.0, math.inf, 900.0]))
            for layer, v in zip(LAYERS, vals)]
    ax = plots.plot_overflow(pd.DataFrame(rows), *mpl).axes[0]
    (fp16,) = [ln for ln in ax.get_lines() if ln.get_label() == "pure_fp16"]
    y = list(fp16.get_ydata())
    assert y[0] == 12.0 and y[2] == 900.0
    assert np.isfinite(y[1]) and y[1] > 1e5 and y[1] > FP16_MAX  # above everything finite, on the axes
    assert ax.get_ylim()[1] >= y[1]
    (mark,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("inf")]
    assert list(zip(mark.get_xdata(), mark.get_ydata())) == [(1, y[1])]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("inf") for t in legend)
    assert not any(t.startswith("lines overlap") for t in legend)
    assert "2 precision(s) exceed it" in ax.get_title()


# ---------------------------------------------------------------------------- mutation audit 2
def test_forest_without_bootstrap_names_only_the_t_interval_and_says_why(mpl):
    """Below stats' bootstrap minimum no bootstrap CI exists: the title names the t interval alone (not a thin
    bootstrap bar that is not drawn), a note under the axes says why, and the x axis says which way the
    difference goes (A − B: a positive delta means the first-named schedule is better)."""
    deltas = [_delta("vs_baseline", "a-one", "zz-base", 1.5, 0.5, 2.5, "better", n=3),
              _delta("vs_baseline", "m-two", "zz-base", -0.2, -0.4, 0.1, "equivalent", n=3)]
    stats = {"deltas": deltas, "settings": {"margin": 0.5, "alpha": 0.05}, "bootstrap_min_pairs": 8}
    fig = plots.plot_forest(stats, *mpl)
    ax = fig.axes[0]
    assert ax.get_title() == "Accuracy deltas, paired by seed (bars: 95% t CI)"
    assert [t.get_text() for t in fig.texts] == ["no bootstrap CI below 8 paired seeds (too few distinct resamples)"]
    assert ax.get_xlabel() == "paired accuracy difference A − B (percentage points)"
    (dot,) = [ln for ln in ax.get_lines() if ln.get_marker() == "o" and ln.get_xdata()[0] > 0]
    label = dict(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels())))[dot.get_ydata()[0]]
    assert label.startswith("a-one vs zz-base") and "better" in label  # A = a-one, B = the baseline


def test_time_memory_titles_sit_over_their_own_panels(mpl):
    """Titles and labels per panel; the memory label names the kind of the drawn runs only (a failed run's
    other kind is not drawn)."""
    runs = pd.DataFrame([{"run_id": f"r{s}", "stage": "pretrain", "precision": "fp32", "status": "ok",
                          "train_seconds": 3.0 * s, "peak_memory_bytes": 5 * s * MIB, "memory_kind": "cpu_peak_rss"}
                         for s in (1, 2)]
                        + [{"run_id": "r3", "stage": "pretrain", "precision": "fp32", "status": "diverged",
                            "train_seconds": 1.0, "peak_memory_bytes": MIB, "memory_kind": "cuda_max_allocated"}])
    t_ax, m_ax = plots.plot_time_memory(runs, *mpl).axes[:2]
    assert (t_ax.get_title(), t_ax.get_ylabel()) == ("Training time per stage and precision", "training-loop time (s)")
    assert (m_ax.get_title(), m_ax.get_ylabel()) == ("Peak memory per stage and precision",
                                                     "peak memory (MiB, cpu_peak_rss)")
    assert t_ax.get_xlabel() == m_ax.get_xlabel() == "precision of the stage"  # each stage's own, not stage 1's
    assert _bars(t_ax) == [(0.0, pytest.approx(4.5))] and _bars(m_ax) == [(0.0, pytest.approx(7.5))]


def test_loss_curves_leave_out_the_extra_row_of_a_skipped_step(mpl):
    """With log_every 2 the runs share steps 1, 3, 5; one run's skipped step 2 adds a row (regular False) that
    only it has: a 'mean over seeds' there would be that one run's loss, so it is not drawn."""
    rows = [("pretrain", "fp32", None, f"pre-{s}", s, "ok", i, v) for s, vals in ((1, [6.0, 4.0, 3.0]),
                                                                               (2, [7.0, 5.0, 2.0]))
            for i, v in zip((1, 3, 5), vals)]
    st = _steps(rows + [("pretrain", "fp32", None, "pre-1", 1, "ok", 2, 9.0)])
    st["regular"] = st["step"] != 2
    sched = pd.DataFrame({"schedule": ["a"], "stage1_precision": ["fp32"]})
    ax = plots.plot_loss_curves(pd.DataFrame(), sched, st, {"baseline": "a"}, *mpl).axes[0]
    (ln,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("fp32")]
    assert list(ln.get_xdata()) == [1, 3, 5] and list(ln.get_ydata()) == pytest.approx([6.5, 4.5, 2.5])


def test_switch_point_two_sweeps_each_from_its_own_runs(mpl):
    """Two sweeps (one of stage 1, one of stage 2) at the same switch points: each line's means, CI bars and
    seed dots come from its own sweep's runs and are drawn in its own colour; the time panel takes each sweep's
    own swept stage, and its y label names both stages."""
    alpha = 0.05
    acc = {"s1": {0.0: [0.80, 0.82], 1.0: [0.60, 0.66]}, "s2": {0.0: [0.50, 0.56], 1.0: [0.90, 0.94]}}
    rows = []
    for sw, stage in (("s1", "pretrain"), ("s2", "finetune")):
        for at, vals in acc[sw].items():
            for s, a in enumerate(vals, 1):
                rows.append({"schedule": f"{sw}-at{int(at * 100)}", "seed": s, "status": "ok", "accuracy": a,
                             "sweep": sw, "sweep_at": at, "sweep_stage": stage, "majority_accuracy": 0.5,
                             "stage1_train_seconds": 100 * a, "stage2_train_seconds": 10 * a})
    # finished without an accuracy (no_eval): not used by the statistics, so neither its time nor a dot
    rows.append({**rows[0], "seed": 3, "accuracy": math.nan, "stage1_train_seconds": 9999.0})
    fig = plots.plot_switch_point(pd.DataFrame(rows), {"settings": {"alpha": alpha}}, *mpl)
    colours = {}
    for ax, scale in ((fig.axes[0], {"s1": 100, "s2": 100}), (fig.axes[1], {"s1": 100, "s2": 10})):
        for sw in ("s1", "s2"):
            (line,) = [ln for ln in ax.get_lines() if ln.get_label() == sw]
            colours.setdefault(sw, to_hex(line.get_color()))
            assert to_hex(line.get_color()) == colours[sw]
            ci = [_t_ci([v * scale[sw] for v in acc[sw][at]], alpha) for at in (0.0, 1.0)]
            assert list(line.get_xdata()) == [0.0, 100.0]
            assert list(line.get_ydata()) == pytest.approx([c[0] for c in ci], rel=1e-9)
            bars = sorted((ln.get_xdata()[0], *ln.get_ydata()) for ln in ax.get_lines()
                          if len(ln.get_xdata()) == 2 and ln.get_xdata()[0] == ln.get_xdata()[1]
                          and to_hex(ln.get_color()) == colours[sw])
            assert bars == [(x, pytest.approx(c[1], rel=1e-9), pytest.approx(c[2], rel=1e-9))
                            for x, c in zip((0.0, 100.0), ci)]
            dots = sorted(round(y, 9) for _, y, c in _points(ax) if c == colours[sw])
            assert dots == sorted(round(v * scale[sw], 9) for at in acc[sw] for v in acc[sw][at])
    assert colours["s1"] != colours["s2"]
    assert fig.axes[1].get_ylabel() == "stage-1/2 training-loop time (s)"


def _overflow_and_curve_colours(specs, mpl):
    """plot_overflow and loss_curves' stage-1 panel drawn for the stage-1 precisions `specs` (in that row order):
    the overflow axes, and each precision's (overflow colour, loss-curve colour)."""
    acts = pd.DataFrame([{"step": 0, "layer": layer, "max_abs": 10.0 * (k + 1) + j, "spec": p, "seed": 1,
                          "status": "ok"} for k, p in enumerate(specs) for j, layer in enumerate(LAYERS)])
    over = plots.plot_overflow(acts, *mpl).axes[0]
    st = _steps([("pretrain", p, None, f"pre-{p}", 1, "ok", i, 5.0 + k + i) for k, p in enumerate(specs)
                 for i in (1, 2)])
    sched = pd.DataFrame({"schedule": [f"{p}-x" for p in specs], "stage1_precision": specs})
    curves = plots.plot_loss_curves(pd.DataFrame(), sched, st, {}, *mpl).axes[0]
    colours = {}
    for p in specs:
        (a,) = [ln for ln in over.get_lines() if ln.get_label() == p]
        (b,) = [ln for ln in curves.get_lines() if ln.get_label().startswith(p + " (")]
        colours[p] = (to_hex(a.get_color()), to_hex(b.get_color()))
    return over, colours


def test_overflow_gives_each_stage1_precision_its_loss_curves_colour(mpl):
    """The same colour per stage-1 precision in overflow as in loss_curves' stage-1 panel."""
    specs = ["amp_bf16", "amp_fp16", "fp32"]
    over, colours = _overflow_and_curve_colours(specs, mpl)
    for p in specs:
        assert colours[p][0] == colours[p][1], p
    assert len({to_hex(ln.get_color()) for ln in over.get_lines() if ln.get_label() in specs}) == 3


def test_stage1_activations_are_stage1_rows_only(tmp_path):
    """The overflow plot is stage 1's: a fine-tuning run with telemetry is not mixed in under its precision."""
    pd.DataFrame([{"run_id": stage, "stage": stage, "precision": "amp_fp16", "spec": "amp_fp16", "seed": 1,
                   "status": "ok", "layer": "l0", "max_abs": 1.5 if stage == "pretrain" else 9e9}
                  for stage in ("pretrain", "finetune")]).to_csv(tmp_path / "activations.csv", index=False)
    assert plots.stage1_activations(tmp_path / "activations.csv")["max_abs"].tolist() == [1.5]


def test_make_plots_names_the_schedules_of_a_switched_stage1_by_its_spec(tmp_path, monkeypatch):
    """schedules.csv's stage1_spec groups the schedules under their stage-1 curve: 'amp_fp16-to-fp32-at80 (b)',
    not 'amp_fp16 (a, b)' beside an 'amp_fp16-to-fp32-at80 (no schedule)'."""
    from plot_helpers import figures

    rows = [{"run_id": f"pre-{tag}", "stage": "pretrain", "precision": "amp_fp16", "spec": spec, "seed": 1,
             "status": "ok"} for tag, spec in (("a", None), ("b", "amp_fp16-to-fp32-at80"))]
    pd.DataFrame(rows).to_csv(tmp_path / "runs.csv", index=False)
    pd.DataFrame([{**r, "step": i, "loss": loss, "regular": True} for r in rows for i, loss in ((1, 5.0), (2, 4.0))]
                 ).to_csv(tmp_path / "steps.csv", index=False)
    pd.DataFrame({"schedule": ["a", "b"], "seed": [1, 1], "status": ["ok", "ok"], "accuracy": [0.8, 0.8],
                  "stage1_precision": ["amp_fp16", "amp_fp16"], "stage1_spec": [None, "amp_fp16-to-fp32-at80"]}
                 ).to_csv(tmp_path / "schedules.csv", index=False)
    (tmp_path / "stats.json").write_text(json.dumps({"baseline": "a", "settings": {"alpha": 0.05}}))
    ax = figures(monkeypatch, tmp_path, ["loss_curves"])["loss_curves"].axes[0]
    labels = {" ".join(ln.get_label().split()) for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    assert labels == {"amp_fp16 (a)", "amp_fp16-to-fp32-at80 (b)"}


def test_coinciding_tolerance_is_a_fraction_of_the_range_not_of_the_largest_value():
    """Curves far from 0 (a loss near 100, 100..102.5 plotted): 0.5 apart is a fifth of the plotted range, clearly
    apart, though under 1% of the values themselves."""
    s = lambda v: pd.Series(v, index=[0, 1, 2])  # noqa: E731
    assert plots._coinciding({"a": s([100.0, 101.0, 102.0]), "b": s([100.0, 101.0, 102.5])}) == []
    assert plots._coinciding({"a": s([100.0, 101.0, 102.0]), "b": s([100.0, 101.0, 102.02])}) == [["a", "b"]]


def test_an_infinite_loss_of_a_finished_run_makes_no_curves_coincide(mpl):
    """A finished run may log a non-finite loss at a skipped step; left in, it made the plotted y range infinite
    and with it the coincidence tolerance: every pair of curves was announced as 'lines overlap'."""
    rows = [("pretrain", p, None, f"pre-{p}-{s}", s, "ok", i, base + i + (math.inf if (p, s, i) == ("fp32", 2, 2)
                                                                          else 0.0))
            for p, base in (("fp32", 1.0), ("amp_bf16", 5.0)) for s in (1, 2) for i in (1, 2, 3)]
    sched = pd.DataFrame({"schedule": ["a", "b"], "stage1_precision": ["fp32", "amp_bf16"]})
    ax = plots.plot_loss_curves(pd.DataFrame(), sched, _steps(rows), {"baseline": "a"}, *mpl).axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert not any(t.startswith("lines overlap") for t in legend), legend
    (fp32,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("fp32 (")]
    assert list(fp32.get_ydata()) == pytest.approx([2.0, 3.0, 4.0])  # step 2: seed 1 alone


def test_a_loss_scale_of_0_is_drawn_below_the_smallest_positive_scale_even_below_1(mpl):
    """GradScaler halves on every overflow, through values below 1 before it reaches 0: the 0 marker sits a factor
    4 under the smallest positive scale (here 0.125 → 0.03125), not at a fixed 1.0 among the real values."""
    rows = [{"stage": "pretrain", "precision": "pure_fp16", "schedule": None, "run_id": "pre-1", "seed": 1,
             "status": "ok", "step": i, "loss": 5.0, "loss_scale": sc, "skipped": int(i > 1), "regular": True}
            for i, sc in enumerate([4.0, 0.5, 0.125, 0.0, 0.0], 1)]
    ax = plots.plot_loss_scale(pd.DataFrame(rows), *mpl).axes[0]
    (zero,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("loss scale 0")]
    assert list(zip(zero.get_xdata(), zero.get_ydata())) == [(4, 0.03125), (5, 0.03125)]
    assert zero.get_label() == "loss scale 0 (drawn at 0.03125): underflowed"
    (trace,) = [ln for ln in ax.get_lines() if ln.get_label() == "pure_fp16 seed 1"]
    assert [y for y in trace.get_ydata() if y == y] == [4.0, 0.5, 0.125]


# ---------------------------------------------------------------------------- mutation audit 4
def test_accuracy_single_run_gets_a_diamond_without_bar_and_no_eval_counts_as_failed(mpl):
    """A schedule with one usable seed still shows its mean (the diamond at that value, no interval exists); a run
    that finished without an accuracy (no_eval) is no data point and is counted as failed over its column."""
    df = pd.DataFrame([{"schedule": "base", "seed": s, "status": "ok", "accuracy": a}
                       for s, a in ((1, 0.80), (2, 0.84))]
                      + [{"schedule": "one", "seed": 1, "status": "ok", "accuracy": 0.70},
                         {"schedule": "one", "seed": 2, "status": "ok", "accuracy": math.nan}])
    df["majority_accuracy"] = 0.5
    ax = plots.plot_accuracy(df, {"baseline": "base", "settings": {"alpha": 0.05}}, *mpl).axes[0]
    from matplotlib.container import ErrorbarContainer

    means = {}
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer):
            data_line, _, bars = c.lines
            means[round(float(data_line.get_xdata()[0]), 6)] = (float(data_line.get_ydata()[0]), len(bars))
    assert means[1.3] == (pytest.approx(70.0), 0)  # no bar: one value has no t interval
    assert means[0.3][0] == pytest.approx(82.0) and means[0.3][1] == 1
    assert _by_column(_points(ax), ["base", "one"]) == {"base": [80.0, 84.0], "one": [70.0]}
    assert _failed_notes(ax) == {1.0: "1 failed"}


def test_forest_defaults_partial_bootstrap_note_and_bottom_row_in_view(mpl):
    """Without settings the band is the documented default margin ±1 point and the bars 95% t CIs; when only some
    rows have a bootstrap CI the note under the axes says why the others have none; the lowest row's thin
    bootstrap bar (drawn below its dot) stays inside the axes."""
    deltas = [_delta("vs_baseline", "a-one", "zz-base", 0.5, 0.1, 0.9, "inconclusive", n=3),
              _delta("vs_baseline", "m-two", "zz-base", -2.0, -3.0, -1.0, "worse", n=9, blo=-2.8, bhi=-1.2)]
    fig = plots.plot_forest({"deltas": deltas, "bootstrap_min_pairs": 8}, *mpl)
    ax = fig.axes[0]
    (band,) = [p for p in ax.patches if p.get_label().startswith("equivalence band")]
    assert (band.get_x(), band.get_x() + band.get_width()) == pytest.approx((-1.0, 1.0))
    assert "95% t CI" in ax.get_title() and "bootstrap CI where ≥ 8 pairs" in ax.get_title()
    assert [t.get_text() for t in fig.texts] == ["no bootstrap CI below 8 paired seeds (too few distinct resamples)"]
    (thin,) = [ln for ln in ax.get_lines() if list(ln.get_xdata()) == pytest.approx([-2.8, -1.2])]
    lo, hi = ax.get_ylim()
    assert lo < thin.get_ydata()[0] < hi and min(ax.get_yticks()) == thin.get_ydata()[0] + 0.18


def test_loss_curves_stage1_legend_lists_baseline_first_and_a_skipped_run_is_not_averaged(mpl):
    """The stage-1 legend names the schedules sharing a precision in plot order (the baseline first, as on every
    axis); a stage-1 run that did not finish (status skipped, with a partial log) is a failed run, not data."""
    rows = [("pretrain", "fp32", None, f"pre-{s}", s, "ok", i, v) for s, vals in ((1, [6.0, 5.0]), (2, [7.0, 6.0]))
            for i, v in zip((1, 2), vals)]
    rows += [("pretrain", "fp32", None, "pre-3", 3, "skipped", 1, 50.0)]
    sched = pd.DataFrame({"schedule": ["a-other", "zz-base"], "stage1_precision": ["fp32", "fp32"]})
    ax = plots.plot_loss_curves(pd.DataFrame(), sched, _steps(rows), {"baseline": "zz-base"}, *mpl).axes[0]
    (curve,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("fp32 (")]
    assert " ".join(curve.get_label().split()) == "fp32 (zz-base, a-other)"
    assert list(curve.get_ydata()) == pytest.approx([6.5, 5.5])
    (bad,) = [ln for ln in ax.get_lines() if ln.get_label() == FAILED_RUN_LABEL]
    assert list(bad.get_ydata()) == [50.0]


def test_curves_coincide_by_their_drawn_means_not_medians(mpl):
    """The 'lines overlap' note compares the curves as drawn (means over seeds): seeds 1, 2, 9 and 1, 2, 3 have
    the same median but means 4 and 2, two lines far apart."""
    vals = {"fp32": [1.0, 2.0, 3.0], "amp_bf16": [1.0, 2.0, 9.0]}
    rows = [("pretrain", p, None, f"pre-{p}-{s}", s, "ok", i, v + 0.1 * i) for p, vs in vals.items()
            for s, v in enumerate(vs, 1) for i in (1, 2, 3)]
    sched = pd.DataFrame({"schedule": ["a", "b"], "stage1_precision": ["fp32", "amp_bf16"]})
    ax = plots.plot_loss_curves(pd.DataFrame(), sched, _steps(rows), {"baseline": "a"}, *mpl).axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert not any(t.startswith("lines overlap") for t in legend), legend


def test_overflow_exactly_65504_does_not_exceed_and_inf_sits_above_a_larger_finite_peak(mpl):
    """65504 is fp16's largest finite value: a peak of exactly 65504 does not exceed the range. An inf peak is
    drawn above every finite one, also a finite peak far above 4 × 65504 (1e7)."""
    rows = [{"step": 0, "layer": layer, "max_abs": v, "spec": "amp_bf16", "seed": 1, "status": "ok"}
            for layer, v in zip(LAYERS, [1.0, FP16_MAX, 2.0])]
    ax = plots.plot_overflow(pd.DataFrame(rows), *mpl).axes[0]
    assert ax.get_title().endswith("— none exceeds it")
    rows = [{"step": 0, "layer": layer, "max_abs": v, "spec": spec, "seed": 1, "status": "ok"}
            for spec, vals in (("fp32", [10.0, 1e7, 5.0]), ("pure_fp16", [12.0, 3.0, math.inf]))
            for layer, v in zip(LAYERS, vals)]
    ax = plots.plot_overflow(pd.DataFrame(rows), *mpl).axes[0]
    (mark,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("inf")]
    assert mark.get_ydata()[0] > 1e7 and ax.get_ylim()[1] >= mark.get_ydata()[0]


def test_plot_targets_dedupe_accept_upper_case_suffixes_and_missing_inputs_are_named(tmp_path):
    """A file named by --out and also in --out-dir is drawn once; 'accuracy.PNG' is a PNG; a missing input names
    the file and writes nothing."""
    from precswitch.errors import PrecswitchError

    d = tmp_path / "p"
    assert plots._targets(d, [d / "accuracy.png"])["accuracy"] == [d / "accuracy.png", d / "accuracy.svg"]
    assert plots._targets(None, [tmp_path / "accuracy.PNG"]) == {"accuracy": [tmp_path / "accuracy.PNG"]}
    for name in ("schedules.csv", "stats.json"):
        (tmp_path / name).write_text("x")
    with pytest.raises(PrecswitchError, match="plots input not found: .*runs.csv"):
        plots.make_plots(tmp_path / "runs.csv", tmp_path / "schedules.csv", tmp_path / "stats.json", out_dir=d)
    assert not d.exists()


def test_a_figure_that_fails_to_save_leaves_the_old_file_and_no_partial_one(tmp_path, mpl):
    """Plots are written atomically: a savefig that fails half-way leaves an existing file as it was, a new path
    absent, and no temporary beside them."""
    plt, _ = mpl
    fig, _ = plt.subplots()

    def broken(target, **kw):
        with open(target, "wb") as f:
            f.write(b"\x89PNG half")
        raise OSError("disk full")

    fig.savefig = broken
    old = tmp_path / "accuracy.png"
    old.write_bytes(b"old figure")
    for path in (old, tmp_path / "forest.png"):
        with pytest.raises(OSError, match="disk full"):
            plots._save(fig, path)
    assert old.read_bytes() == b"old figure" and not (tmp_path / "forest.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["accuracy.png"]


def test_stage1_precision_colours_agree_whatever_order_the_runs_come_in(mpl):
    """Colours per stage-1 precision are fixed by the sorted precisions, not by the order of the rows: steps
    listing fp32 before amp_bf16 and activations sorted by precision give each its one colour in both plots."""
    specs = ["fp32", "amp_bf16"]
    _, colours = _overflow_and_curve_colours(specs, mpl)
    for p in specs:
        assert colours[p][0] == colours[p][1], p


def test_time_memory_a_schedule_without_status_does_not_leave_its_runs_out(mpl):
    """An empty schedule status reads as ok (as in the statistics): its stage-2 run is drawn, not counted failed."""
    runs = pd.DataFrame([{"run_id": f"ft-{s}", "stage": "finetune", "precision": "fp32", "status": "ok",
                          "train_seconds": 2.0 * s, "peak_memory_bytes": MIB} for s in (1, 2)])
    schedules = pd.DataFrame({"schedule": ["a", "a"], "stage2_run_id": ["ft-1", "ft-2"], "status": [math.nan, "ok"],
                              "stage2_status": ["ok", "ok"]})
    t_ax = plots.plot_time_memory(runs, *mpl, schedules).axes[0]
    assert _bars(t_ax) == [(0.0, pytest.approx(3.0))] and not _failed_notes(t_ax)


def test_accuracy_failed_note_sits_above_the_highest_dot(mpl):
    """'k failed' is written at the top of its column: the axes leave room for it, so it does not cover the
    column's highest seed."""
    accs = [0.60] * 10 + [0.95]  # the one high seed, not the mean's interval, tops the axis
    df = pd.DataFrame([{"schedule": "base", "seed": s, "status": "ok", "accuracy": a} for s, a in enumerate(accs, 1)]
                      + [{"schedule": "base", "seed": 12, "status": "diverged", "accuracy": math.nan}])
    df["majority_accuracy"] = 0.5
    fig = plots.plot_accuracy(df, {"baseline": "base"}, *mpl)
    ax = fig.axes[0]
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    (note,) = [t for t in ax.texts if t.get_text() == "1 failed"]
    top = max(ax.transData.transform((x, y))[1] for x, y, _ in _points(ax))
    assert top + 3 < note.get_window_extent(r).y0  # 3 px under the note, the dot's radius included


def test_saved_figures_are_130_dpi_pngs_and_byte_identical_when_saved_again(tmp_path, mpl):
    """PNGs at 130 dpi (docs/analysis.md); saving the same figure twice gives the same bytes in both formats
    (no date or software stamp, fixed SVG ids), so an unchanged plot does not show up as a changed output."""
    from PIL import Image

    plt, _ = mpl
    fig, ax = plt.subplots(figsize=(3, 2))
    ax.plot([1, 2, 3], [3, 1, 2], label="x")
    ax.legend()
    for ext in ("png", "svg"):
        a, b = tmp_path / f"a.{ext}", tmp_path / "again" / f"a.{ext}"
        plots._save(fig, a)
        plots._save(fig, b)
        assert a.read_bytes() == b.read_bytes(), ext
    assert b"<dc:date>" not in (tmp_path / "a.svg").read_bytes()
    with Image.open(tmp_path / "a.png") as im:
        assert im.info["dpi"] == pytest.approx((130, 130), abs=0.01)


def test_axis_labels_name_each_panels_quantity_and_unit(mpl):
    """Stage 2's loss is a classification cross-entropy (not stage 1's nats per masked token); the switch-point x axis
    says what its percent is of."""
    rows = [(stage, "fp32", sched, f"{stage}-{s}", s, "ok", i, 2.0 - 0.1 * i + s)
            for stage, sched in (("pretrain", None), ("finetune", "a")) for s in (1, 2) for i in (1, 2)]
    sched = pd.DataFrame({"schedule": ["a"], "stage1_precision": ["fp32"]})
    ax1, ax2 = plots.plot_loss_curves(pd.DataFrame(), sched, _steps(rows), {"baseline": "a"}, *mpl).axes[:2]
    assert (ax1.get_ylabel(), ax2.get_ylabel()) == ("training loss (nats/token)", "training loss (cross-entropy, nats)")
    df = pd.DataFrame([{"schedule": f"sw-at{int(at * 100)}", "seed": s, "status": "ok", "accuracy": 0.7 + 0.01 * s,
                        "majority_accuracy": 0.5, "sweep": "sw", "sweep_at": at, "sweep_stage": "finetune",
                        "stage2_train_seconds": 3.0 + s} for at in (0.0, 1.0) for s in (1, 2)])
    for ax in plots.plot_switch_point(df, {}, *mpl).axes[:2]:
        assert ax.get_xlabel() == "switch point\n(% of the swept stage's steps in its first precision)"


def test_overflow_draws_peaks_below_1_at_their_value(mpl):
    """Small activations (a peak of 0.25) are drawn where they are on the log axis, not lifted to 1."""
    rows = [{"step": 0, "layer": layer, "max_abs": v, "spec": "fp32", "seed": 1, "status": "ok"}
            for layer, v in zip(LAYERS, [0.25, 0.003, 40.0])]
    ax = plots.plot_overflow(pd.DataFrame(rows), *mpl).axes[0]
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "fp32"]
    assert list(line.get_ydata()) == pytest.approx([0.25, 0.003, 40.0])


def test_stage1_a_run_without_status_is_a_finished_run(mpl):
    """An empty status reads as ok, as in the statistics (stats.mark_outcomes): its point is drawn, not counted
    failed."""
    rows = [{"stage": "pretrain", "precision": "fp32", "seed": s, "status": st, "eval_loss": 2.0 + s,
             "mlm_accuracy": 0.3} for s, st in ((1, "ok"), (2, math.nan))]
    ax = plots.plot_stage1(pd.DataFrame(rows), {"stage1_baseline_precision": "fp32"}, *mpl).axes[0]
    assert _by_column(_points(ax), ["fp32"]) == {"fp32": [3.0, 4.0]} and not _failed_notes(ax)


def test_stage1_mean_diamond_is_drawn_even_without_an_interval(mpl):
    """The caption's diamond is the mean over the finished runs: a precision with one finished run (its others
    diverged) or with equal values (no t interval below the sign test's minimum) still gets its diamond, without a
    bar, as in the accuracy plot; before, such a column showed no mean at all."""
    rows = [{"stage": "pretrain", "precision": p, "seed": s, "status": st, "eval_loss": v, "mlm_accuracy": 0.3}
            for p, vals in (("fp32", [(2.0, "ok"), (2.2, "ok"), (2.3, "ok")]),
                            ("amp_fp16", [(2.5, "ok"), (9.0, "diverged"), (9.0, "diverged")]),
                            ("pure_bf16", [(2.4, "ok"), (2.4, "ok"), (2.4, "ok")]))
            for s, (v, st) in enumerate(vals, 1)]
    ax = plots.plot_stage1(pd.DataFrame(rows), {"stage1_baseline_precision": "fp32"}, *mpl).axes[0]
    from matplotlib.container import ErrorbarContainer

    diamonds = {}
    for c in ax.containers:
        if isinstance(c, ErrorbarContainer):
            data_line, _, bars = c.lines
            diamonds[round(float(data_line.get_xdata()[0]), 6)] = (float(data_line.get_ydata()[0]), len(bars))
    # columns: fp32 (baseline), amp_fp16, pure_bf16
    assert diamonds[0.25] == (pytest.approx(np.mean([2.0, 2.2, 2.3])), 1)
    assert diamonds[1.25] == (pytest.approx(2.5), 0)
    assert diamonds[2.25] == (pytest.approx(2.4), 0)
    assert _failed_notes(ax) == {1.0: "2 failed"}


def test_overflow_title_counts_diverged_runs_not_rows_and_names_three(mpl):
    """Five diverged stage-1 runs, each with several sampled layers and steps: the title counts runs (5), names the
    first three by precision and seed and says how many more."""
    rows = [{"step": st, "layer": layer, "max_abs": 5.0, "spec": spec, "seed": seed, "status": "diverged"}
            for spec, seed in (("amp_fp16", 1), ("amp_fp16", 2), ("pure_fp16", 1), ("pure_fp16", 3), ("pure_fp16", 4))
            for st in (0, 10) for layer in LAYERS]
    rows += [{"step": 0, "layer": layer, "max_abs": 4.0, "spec": "fp32", "seed": 1, "status": "ok"} for layer in LAYERS]
    title = plots.plot_overflow(pd.DataFrame(rows), *mpl).axes[0].get_title()
    assert title.split("\n")[1] == ("5 run(s) diverged (amp_fp16 seed 1, amp_fp16 seed 2, pure_fp16 seed 1, 2 more): "
                                    "the samples (every telemetry_every steps) may miss it")


def test_curves_exactly_one_percent_of_the_range_apart_coincide():
    """'at most COINCIDE_FRACTION of the range': 1 apart on a 0..100 range still coincides; curves without a shared
    x never do."""
    s = lambda v, x=(0, 1): pd.Series(v, index=list(x))  # noqa: E731
    assert plots._coinciding({"a": s([0.0, 100.0]), "b": s([1.0, 100.0])}) == [["a", "b"]]
    assert plots._coinciding({"a": s([0.0, 100.0]), "b": s([0.0, 100.0], x=(2, 3))}) == []
