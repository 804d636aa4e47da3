"""What each plot draws, checked against hand-built tables (mutation audit of analysis/plots.py).

Every expected number (means, t intervals, SDs, MiB, percentages, maxima) is computed here from the input
tables with numpy/scipy, not taken from precswitch; the plots are read back from the matplotlib artists
(point offsets, line data, bar heights, error bars, tick and legend texts, titles)."""

from __future__ import annotations

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


def _t_ci(values, alpha, logit=False):
    """(mean, low, high) of the (1 − alpha) t interval, by hand; ``logit``: of percentages, on the logit scale."""
    from scipy import stats

    x = np.asarray(values, dtype=float)
    y = np.log(x / (100 - x)) if logit else x
    half = stats.t.ppf(1 - alpha / 2, len(y) - 1) * y.std(ddof=1) / math.sqrt(len(y))
    lo, hi = y.mean() - half, y.mean() + half
    if logit:
        lo, hi = 100 / (1 + math.exp(-lo)), 100 / (1 + math.exp(-hi))
    return x.mean(), lo, hi


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
    t CI on the logit scale (inside 0-100%) of the settings' alpha over the used runs, the majority line at its percentage, failures counted."""
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
                    alpha, logit=True)
        assert x == pytest.approx(i + 0.3)
        assert (m, lo, hi) == pytest.approx(exp, rel=1e-9)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "mean, 90% CI (logit scale)" in labels
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


# ---------------------------------------------------------------------------- helpers
# ---------------------------------------------------------------------------- mutation audit 2
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


# ---------------------------------------------------------------------------- mutation audit 4
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

