"""Plots on edge-case studies: schedules / stage-1 precisions whose runs all failed, stage-2 runs of failed
schedules, missing time/memory columns, many schedules with long names (audit findings F1, F6, F9.9, F9.12, F3)."""

import pytest

from plot_helpers import fake_study, figures

from precswitch.analysis.fakes import DEFAULT_SCHEDULES
from precswitch.analysis.plots import FAILED_RUN_LABEL, make_plots

SEEDS = (1, 2, 3)
#: the fake study's schedules in plot order: the baseline first, then sorted
ORDER = ["fp32-fp32", "bf16-fp32", "fp16-fp16", "fp16-fp32"]


def _study(tmp_path, mutate=None, seeds=SEEDS, **kw):
    """Fake study → aggregate → stats; ``mutate(metrics_dict, path)`` edits each metrics.json first."""
    return fake_study(tmp_path, seeds, mutate, **kw)[0]


def _ticks(ax):
    return [t.get_text() for t in ax.get_xticklabels()]


def _failed_notes(ax):
    """{x in data coordinates: text} of the "k failed" annotations."""
    return {t.xy[0]: t.get_text() for t in ax.texts if t.get_text().endswith(" failed")}


def _inside(fig, ax, artist, tol=1.0):
    r = fig.canvas.get_renderer()
    a, b = artist.get_window_extent(r), ax.get_window_extent(r)
    return a.x0 >= b.x0 - tol and a.x1 <= b.x1 + tol and a.y0 >= b.y0 - tol and a.y1 <= b.y1 + tol


def _all_columns(fig, ax, names, failed):
    """Every level of ``names`` keeps its column; ``failed``: {level: "k failed"} over its own column."""
    assert _ticks(ax) == names
    assert ax.get_xlim() == pytest.approx((-0.5, len(names) - 0.5))
    notes = _failed_notes(ax)
    assert {names[round(x)]: t for x, t in notes.items()} == failed
    for x in notes:
        assert abs(x - round(x)) < 0.45  # over its own column (dodged within it, if at all)
    for t in ax.texts:
        if t.get_text().endswith(" failed"):
            assert _inside(fig, ax, t), t.get_text()


def _png_size(path):
    import matplotlib.image as mpimg

    h, w = mpimg.imread(path).shape[:2]
    return w, h


# ---------------------------------------------------------------------------- F1: accuracy plot
F1_CASES = {
    # the baseline (always first) diverged in every seed
    "baseline": ({("fp32-fp32", s) for s in SEEDS}, {"fp32-fp32": "3 failed"}),
    # stage 1 amp_fp16 diverged in every seed: the last two schedules have no run at all
    "last": ({("amp_fp16", s) for s in SEEDS}, {"fp16-fp16": "3 failed", "fp16-fp32": "3 failed"}),
    # every schedule failed in every seed
    "all": ({(n, s) for n in DEFAULT_SCHEDULES for s in SEEDS}, {n: "3 failed" for n in ORDER}),
}


@pytest.mark.parametrize("case", list(F1_CASES))
def test_accuracy_keeps_the_column_of_a_schedule_without_usable_runs(tmp_path, monkeypatch, case):
    diverged, failed = F1_CASES[case]
    out = _study(tmp_path, diverged=diverged)
    # a normal-sized PNG (a real diverged study gave 15561 x 570 px)
    make_plots(out / "runs.csv", out / "schedules.csv", out / "stats.json", outputs=[tmp_path / "accuracy.png"])
    w, h = _png_size(tmp_path / "accuracy.png")
    assert 600 < w < 3000 and 300 < h < 1500, (w, h)
    fig = figures(monkeypatch, out, ["accuracy"])["accuracy"]
    ax = fig.axes[0]
    _all_columns(fig, ax, ORDER, failed)
    # the mean's legend entry sits on the first schedule that has a mean
    with_mean = [n for n in ORDER if n not in failed]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    if with_mean:
        assert "mean, 95% CI (logit scale)" in labels
        first = ORDER.index(with_mean[0])
        (cont,) = [c for c in ax.containers if c.get_label() == "mean, 95% CI (logit scale)"]
        assert cont.lines[0].get_xdata()[0] == pytest.approx(first + 0.3)
    else:
        assert "mean, 95% CI (logit scale)" not in labels
        assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] >= 100  # a percent axis, not a bare 0-1 one
        assert any(t.get_text() == "no schedule has a usable run" for t in ax.texts)


# ---------------------------------------------------------------------------- F6: stage1 and time_memory
def test_stage1_shows_a_precision_whose_runs_all_failed(tmp_path, monkeypatch):
    out = _study(tmp_path, diverged={("amp_fp16", s) for s in SEEDS} | {("amp_bf16", 2)})
    figs = figures(monkeypatch, out, ["stage1", "time_memory"])
    fig = figs["stage1"]
    for ax in fig.axes[:2]:
        _all_columns(fig, ax, ["fp32", "amp_bf16", "amp_fp16"], {"amp_bf16": "1 failed", "amp_fp16": "3 failed"})
    # time_memory: amp_fp16 keeps its column, "k failed" over the dodged position of each stage
    fig = figs["time_memory"]
    for ax in fig.axes[:2]:
        assert _ticks(ax) == ["fp32", "amp_bf16", "amp_fp16"]
        assert ax.get_xlim() == pytest.approx((-0.5, 2.5))
        notes = sorted(_failed_notes(ax).items())
        # stage 1: amp_bf16 seed 2 and amp_fp16 (all); stage 2: fp16-fp32 (fp32) and fp16-fp16 (amp_fp16)
        # skipped behind their stage 1, and bf16-fp32 seed 2 (fp32)
        assert [(round(x, 2), t) for x, t in notes] == [(0.2, "4 failed"), (0.8, "1 failed"), (1.8, "3 failed"),
                                                       (2.2, "3 failed")]
        for t in ax.texts:
            if t.get_text().endswith(" failed"):
                assert _inside(fig, ax, t)
    assert any(t.get_text().startswith("“k failed”: runs that failed") for t in fig.texts)


# ---------------------------------------------------------------------------- F9.9: runs of failed schedules
def _fp16_stage1_diverged_stage2_ok(m, p):
    """As in a real study whose amp_fp16 pre-training diverged: its stage-2 runs still finished (ok)."""
    if m["stage"] == "pretrain" and m["precision"] == "amp_fp16":
        m.update(status="diverged", status_reason="diverged (fake)", eval_loss=None, mlm_accuracy=None)


def test_stage2_runs_of_failed_schedules_are_not_drawn_as_data(tmp_path, monkeypatch):
    import pandas as pd

    out = _study(tmp_path, mutate=_fp16_stage1_diverged_stage2_ok)
    sched = pd.read_csv(out / "schedules.csv")
    assert set(sched.loc[sched["status"] != "ok", "schedule"]) == {"fp16-fp16", "fp16-fp32"}
    assert (sched["stage2_status"] == "ok").all()
    figs = figures(monkeypatch, out, ["loss_curves", "time_memory"])
    ax2 = figs["loss_curves"].axes[1]
    labels = [t.get_text() for t in ax2.get_legend().get_texts()]
    assert labels[:2] == ["fp32-fp32", "bf16-fp32"]
    assert FAILED_RUN_LABEL not in labels  # not drawn as failed runs either: the runs themselves finished
    assert not [ln for ln in ax2.get_lines() if ln.get_label().startswith("fp16-")]
    (note,) = [t for t in labels if t.startswith("not drawn")]
    assert " ".join(note.split()) == "not drawn: 6 run(s) of schedules that failed in stage 1 (fp16-fp16, fp16-fp32)"
    # time_memory: 3 fp32 + 3 amp_bf16 stage-1 runs, 6 of the 9 fp32 stage-2 runs (fp16-fp32's left out)
    fig = figs["time_memory"]
    for ax in fig.axes[:2]:
        assert sum(len(c.get_offsets()) for c in ax.collections) == 12
        assert sorted((round(x, 2), t) for x, t in _failed_notes(ax).items()) == [
            (0.2, "3 failed"), (1.8, "3 failed"), (2.2, "3 failed")]
    assert any("6 stage-2 run(s) that finished but whose stage 1 failed" in " ".join(t.get_text().split())
               for t in fig.texts)


# ---------------------------------------------------------------------------- F9.12: missing columns
# ---------------------------------------------------------------------------- F3: many schedules, long names