"""Plots and the report: files exist, explicit outputs, captions render (the verdict: test_analysis_verdict.py)."""

import itertools
import json
from pathlib import Path

import pandas as pd
import pytest

from plot_helpers import fake_study, figures

from precswitch.analysis.aggregate import aggregate
from precswitch.analysis.fakes import write_fake_study
from precswitch.analysis.plots import PLOT_NAMES, make_plots
from precswitch.analysis.settings import load_settings
from precswitch.analysis.stats import run_stats
from precswitch.cli import main
from precswitch.errors import PrecswitchError


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    paths = write_fake_study(root / "results", seeds=range(1, 9), effects={"fp16-fp16": -2.5}, sd=0.7,
                             diverged={("fp16-fp16", 4)}, degenerate={("bf16-fp32", 2)}, rng_seed=1)
    aggregate(paths, root / "results", [p.parent / "steps.csv" for p in paths])
    stats = run_stats(root / "results" / "runs.csv", root / "results" / "schedules.csv",
                      load_settings(bootstrap_resamples=200), root / "results")
    return root, paths, stats


def test_plots_all_files(study):
    root, _, _ = study
    out = root / "results" / "plots"
    written = make_plots(root / "results" / "runs.csv", root / "results" / "schedules.csv",
                         root / "results" / "stats.json", out_dir=out)
    assert len(written) == 2 * len(PLOT_NAMES)
    for name in PLOT_NAMES:
        for ext in ("png", "svg"):
            f = out / f"{name}.{ext}"
            assert f.is_file() and f.stat().st_size > 1000, f
    assert (out / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
    assert b"<svg" in (out / "forest.svg").read_bytes()[:2000]
    assert not list(out.glob(".*tmp*"))  # atomic writes leave no temporaries


def test_plots_explicit_outputs_and_bad_names(study, tmp_path):
    root, _, _ = study
    r = root / "results"
    outs = [tmp_path / "a" / "forest.svg", tmp_path / "b" / "loss_scale.png"]
    written = make_plots(r / "runs.csv", r / "schedules.csv", r / "stats.json", outputs=outs)
    assert sorted(written) == sorted(outs) and all(p.is_file() for p in outs)
    with pytest.raises(PrecswitchError, match="unknown plot name"):
        make_plots(r / "runs.csv", r / "schedules.csv", r / "stats.json", outputs=[tmp_path / "pie.png"])
    with pytest.raises(PrecswitchError, match="format"):
        make_plots(r / "runs.csv", r / "schedules.csv", r / "stats.json", outputs=[tmp_path / "forest.jpg"])


def test_plots_without_fp16_runs(tmp_path):
    paths = write_fake_study(tmp_path / "s", seeds=[1, 2],
                             schedules={"fp32-fp32": ("fp32", "fp32"), "bf16-fp32": ("amp_bf16", "fp32")})
    aggregate(paths, tmp_path / "t")
    run_stats(tmp_path / "t" / "runs.csv", tmp_path / "t" / "schedules.csv", load_settings(bootstrap_resamples=0),
              tmp_path / "t")
    written = make_plots(tmp_path / "t" / "runs.csv", tmp_path / "t" / "schedules.csv", tmp_path / "t" / "stats.json",
                         outputs=[tmp_path / "p" / "loss_scale.png", tmp_path / "p" / "loss_curves.png"])
    assert all(p.is_file() for p in written)








def test_cli_end_to_end(tmp_path, capsys):
    paths = write_fake_study(tmp_path / "results", seeds=range(1, 5))
    r = tmp_path / "results"
    assert main(["aggregate", "--metrics", *map(str, paths), "--out-dir", str(r)]) == 0
    cfg = tmp_path / "analysis.json"
    cfg.write_text('{"baseline": "fp32-fp32", "margin": 1.0, "bootstrap_resamples": 100}')
    assert main(["stats", "--runs", str(r / "runs.csv"), "--schedules", str(r / "schedules.csv"),
                 "--settings", str(cfg), "--out-dir", str(r)]) == 0
    assert main(["plots", "--runs", str(r / "runs.csv"), "--schedules", str(r / "schedules.csv"),
                 "--stats", str(r / "stats.json"), "--out", str(r / "plots" / "accuracy.png"),
                 str(r / "plots" / "accuracy.svg")]) == 0
    assert main(["verdict", "--stats", str(r / "stats.json"), "--out", str(r / "verdict.md")]) == 0
    for f in ("summary.csv", "summary.md", "deltas.csv", "stats.json", "verdict.md", "plots/accuracy.png",
              "plots/accuracy.svg"):
        assert (r / f).is_file(), f
    capsys.readouterr()
    rc = main(["stats", "--runs", str(r / "runs.csv"), "--schedules", str(r / "schedules.csv"),
               "--baseline", "fp64-fp64", "--out-dir", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 2 and "fp64-fp64" in err and "fp16-fp32" in err
    assert not (tmp_path / "x" / "stats.json").exists()




# ---------------------------------------------------------------------------- audit fixes
REPO = Path(__file__).resolve().parents[1]


def _small_study(tmp_path, seeds=(1, 2, 3), mutate=None, **kw):
    """Fake study → aggregate → stats; ``mutate(metrics_dict, path)`` edits each metrics.json first."""
    return fake_study(tmp_path, seeds, mutate, bootstrap_resamples=200, **kw)




def _row(stats, family, a, b, metric):
    return next(r for r in stats["deltas"] if (r["family"], r["a"], r["b"], r["metric"]) == (family, a, b, metric))






















def test_bootstrap_left_out_below_min_pairs_in_the_forest(tmp_path):
    out, stats = _small_study(tmp_path)
    assert all(r["boot_low"] is None for r in stats["deltas"])
    make_plots(out / "runs.csv", out / "schedules.csv", out / "stats.json", outputs=[tmp_path / "forest.svg"])
    svg = (tmp_path / "forest.svg").read_text()
    assert "no bootstrap CI below 8 paired seeds" in svg and "thin: bootstrap" not in svg


def test_bootstrap_drawn_from_min_pairs(study, tmp_path):
    root, _, stats = study  # 8 seeds (7 pairs where a seed diverged)
    acc = [r for r in stats["deltas"] if r["metric"] == "accuracy" and r["family"] == "vs_baseline"]
    assert {r["a"]: r["boot_low"] is not None for r in acc} == {"bf16-fp32": True, "fp16-fp32": True,
                                                                 "fp16-fp16": False}
    make_plots(root / "results" / "runs.csv", root / "results" / "schedules.csv", root / "results" / "stats.json",
               outputs=[tmp_path / "forest.svg"])
    svg = (tmp_path / "forest.svg").read_text()
    assert "bootstrap CI where" in svg and "no bootstrap CI below 8" in svg












def _render_rst(name: str, config: dict, files=()) -> str:
    import types

    import jinja2

    # as snakemake.report renders captions and the front page (files: the report's results, .target and .path)
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string((REPO / "workflow" / "report" / name).read_text()).render(
        snakemake=types.SimpleNamespace(config=config), files=list(files))


def _config(**analysis):
    import yaml
    from snakemake.utils import validate

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["analysis"].update(analysis)
    validate(cfg, str(REPO / "workflow" / "schemas" / "config.schema.yaml"), set_default=True)
    return cfg


def test_report_captions_render_and_match_the_rules():
    from docutils.core import publish_parts

    cfg = _config()
    for f in sorted((REPO / "workflow" / "report").glob("*.rst")):
        text = _render_rst(f.name, cfg)
        publish_parts(text, writer="html", settings_overrides={"halt_level": 2, "report_level": 2})
        assert "95.0%" not in text and "{{" not in text, f.name
    wf = " ".join(_render_rst("workflow.rst", cfg).split())
    assert "no change" not in wf.replace("*equivalent* (no change)", "")
    assert "*equivalent* when the difference is not significant and its whole 95% confidence interval lies within ±1 accuracy points" in wf
    assert "Holm-adjusted" in wf and "TOST" in wf and "*inconclusive*" in wf
    forest = " ".join(_render_rst("forest.rst", cfg).split())
    assert "at least 8 paired seeds" in forest and "unadjusted 95% t confidence interval" in forest
    assert "configuration hash" not in _render_rst("verdict.rst", cfg)
    # the confidence level follows analysis.alpha
    cfg90 = _config(alpha=0.1, margin=0.5)
    wf90 = " ".join(_render_rst("workflow.rst", cfg90).split())
    assert "90% confidence interval lies within ±0.5 accuracy points" in wf90 and "p < 0.1" in wf90
    for name in ("accuracy.rst", "forest.rst", "stage1.rst", "summary.rst", "switch_point.rst", "deltas.rst"):
        assert "90%" in _render_rst(name, cfg90) and "95%" not in _render_rst(name, cfg90), name
    # paths follow results_dir (the GPU and frontier studies write under results/<config name>)
    cfg["results_dir"] = "results/frontier"
    assert "``results/frontier/runs/pretrain/<precision>/seed<seed>``" in _render_rst("runs.rst", cfg)



def test_report_front_page_shows_the_answer_and_the_forest_plot_first(study, tmp_path):
    """With the verdict's report_front.rst beside verdict.md, workflow.rst opens with its title and headline table,
    then the forest plot embedded (a data URI: the report is one file), then the design prose."""
    import types

    from docutils.core import publish_parts

    from precswitch.analysis.verdict import title, write_verdict, _View

    root, _, stats = study
    r = root / "results"
    write_verdict(r / "stats.json", tmp_path / "verdict.md", tmp_path / "report_front.rst")
    make_plots(r / "runs.csv", r / "schedules.csv", r / "stats.json", outputs=[tmp_path / "forest.svg"])
    files = [types.SimpleNamespace(target=p.name, path=p) for p in (tmp_path / "verdict.md", tmp_path / "forest.svg")]
    links = "\n\n.. _Verdict: javascript:void(0)\n.. _forest.svg: javascript:void(0)\n"  # snakemake's rst_links
    html = publish_parts(_render_rst("workflow.rst", _config(), files) + links, writer="html",
                         settings_overrides={"halt_level": 2, "report_level": 2})["html_body"]
    heading, table, img, design = (html.find(x) for x in (
        title(_View(stats))[0], 'class="headline', '<div class="forest', "How this study was run"))
    assert -1 < heading < table < img < design, (heading, table, img, design)
    assert "fp16-fp16" in html[table:img] and "<svg" in html[img:design] and "No verdict yet" not in html
    # without a verdict (a report built before the analysis) the page says so and keeps the design
    bare = publish_parts(_render_rst("workflow.rst", _config()), writer="html",
                         settings_overrides={"halt_level": 2, "report_level": 2})["html_body"]
    assert "No verdict yet" in bare and "<table" not in bare and "How this study was run" in bare


def test_report_front_page_names_switched_stages_and_sweeps():
    """workflow.rst lists a switched stage and a stage's overrides in words (not as a Python dict) and every sweep
    of the config, whose schedules the verdict judges too."""
    from docutils.core import publish_parts

    cfg = _config()
    cfg["schedules"]["fp16x80-fp32"] = {"pretrain": {"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 0.8},
                                        "finetune": "fp32"}
    cfg["schedules"]["purefp16eps-fp32"] = {"pretrain": {"precision": "pure_fp16",
                                                         "overrides": {"lr": 5e-4, "adam_eps": 1e-4}},
                                            "finetune": "fp32"}
    cfg["sweeps"] = {"fp16-ft": {"pretrain": "amp_fp16", "finetune": {"precision": "amp_fp16", "switch_to": "fp32"},
                                 "switch_at": [0.0, 0.5, 1.0]}}
    text = _render_rst("workflow.rst", cfg)
    publish_parts(text, writer="html", settings_overrides={"halt_level": 2, "report_level": 2})
    wf = " ".join(text.split())
    assert "{'precision'" not in wf
    assert "``fp16x80-fp32``: pretrain = ``amp_fp16``, then ``fp32`` after 80% of the steps, finetune = ``fp32``" in wf
    assert "sweep ``fp16-ft`` (one schedule ``fp16-ft-at<100·F>`` per F in 0.0, 0.5, 1.0)" in wf
    assert ("``purefp16eps-fp32``: pretrain = ``pure_fp16`` with ``adam_eps`` 0.0001, ``lr`` 0.0005 (the stage's "
            "other settings as below), finetune = ``fp32``") in wf
    assert "``fp32-fp32``: pretrain = ``fp32``, finetune = ``fp32``" in wf
    assert "Data: stage 1 ``synthetic``, stage 2 ``synthetic``" in wf and "- pretrain: " in wf


def test_report_front_page_of_a_study_without_stage_1_lists_no_stage_1_settings():
    """Every schedule fine-tunes model.init: the front page listed stage-1 data and hyper-parameters that no job
    uses; it says there is no stage 1 instead, also where a sweep has none either."""
    from docutils.core import publish_parts

    cfg = _config()
    cfg["schedules"] = {"a": {"finetune": "fp32"}, "b": {"finetune": "amp_bf16"}}
    for sweeps in ({}, {"ft": {"finetune": {"precision": "amp_fp16", "switch_to": "fp32"}, "switch_at": [0.5]}}):
        cfg["sweeps"] = sweeps
        text = _render_rst("workflow.rst", cfg)
        publish_parts(text, writer="html", settings_overrides={"halt_level": 2, "report_level": 2})
        wf = " ".join(text.split())
        assert "Data: stage 2 ``synthetic``" in wf and "No schedule has a stage 1: each fine-tunes ``model.init``." in wf
        assert "stage 1 ``" not in wf and "- pretrain: " not in wf and "- finetune: " in wf
    cfg["sweeps"] = {"pre": {"pretrain": {"precision": "amp_bf16", "switch_to": "fp32"}, "finetune": "fp32",
                             "switch_at": [0.5]}}
    wf = " ".join(_render_rst("workflow.rst", cfg).split())
    assert "Data: stage 1 ``synthetic``" in wf and "- pretrain: " in wf  # the sweep's schedules have a stage 1








# ---------------------------------------------------------------------------- plot readability



def _series(ax):
    """Legend entries that name a series: (label, handle), without the overlap note and failed runs."""
    from precswitch.analysis.plots import FAILED_RUN_LABEL, OVERLAP_NOTE

    leg = ax.get_legend()
    return [(t.get_text(), h) for t, h in zip(leg.get_texts(), leg.legend_handles)
            if not t.get_text().startswith(OVERLAP_NOTE) and t.get_text() != FAILED_RUN_LABEL
            and not t.get_text().startswith("skipped step")]


def _assert_told_apart(ax):
    """Every legend entry's series is drawn in the legend's style, and no two series share a dash pattern
    and marker (so coinciding curves are told apart without colour); later lines are thinner."""
    from matplotlib.colors import to_hex

    entries = _series(ax)
    assert len(entries) >= 2
    styles = [(h.get_linestyle(), h.get_marker()) for _, h in entries]
    assert len(set(styles)) == len(styles), styles
    assert len({(to_hex(h.get_color()), s) for (_, h), s in zip(entries, styles)}) == len(entries)
    drawn = []
    for label, h in entries:
        lines = [ln for ln in ax.get_lines() if ln.get_label() == label]
        assert len(lines) == 1, label
        ln = lines[0]
        assert (to_hex(ln.get_color()), ln.get_linestyle(), ln.get_marker()) == (
            to_hex(h.get_color()), h.get_linestyle(), h.get_marker()), label
        drawn.append((ln.get_zorder(), ln.get_linewidth()))
    widths = [lw for _, lw in sorted(drawn)]
    assert all(a > b for a, b in itertools.pairwise(widths)), widths  # the upper line never covers the lower


def _legend_texts(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_loss_curves_coinciding_series_stay_visible(tmp_path, monkeypatch):
    """Stage 1: fp32, amp_fp16, amp_bf16 with the same loss log; stage 2: fp16-fp16 = fp16-fp32. Each series
    has its own dash pattern and marker, and the legend says which curves coincide."""
    import shutil

    paths = write_fake_study(tmp_path / "s", seeds=[1, 2, 3], rng_seed=3)
    runs = tmp_path / "s" / "runs"
    for s in (1, 2, 3):
        for p in ("amp_fp16", "amp_bf16"):
            shutil.copy(runs / "pretrain" / "fp32" / f"seed{s}" / "steps.csv", runs / "pretrain" / p / f"seed{s}")
        shutil.copy(runs / "finetune" / "fp16-fp32" / f"seed{s}" / "steps.csv", runs / "finetune" / "fp16-fp16" / f"seed{s}")
    out = tmp_path / "t"
    aggregate(paths, out, [p.parent / "steps.csv" for p in paths])
    run_stats(out / "runs.csv", out / "schedules.csv", load_settings(bootstrap_resamples=0), out)
    fig = figures(monkeypatch, out, ["loss_curves"])["loss_curves"]
    ax1, ax2 = fig.axes[:2]
    for ax in (ax1, ax2):
        _assert_told_apart(ax)
    assert [lab.split(" (")[0] for lab, _ in _series(ax1)] == ["amp_bf16", "amp_fp16", "fp32"]
    assert [lab for lab, _ in _series(ax2)] == ["fp32-fp32", "bf16-fp32", "fp16-fp16", "fp16-fp32"]
    assert " ".join(_legend_texts(ax1).pop().split()) == "lines overlap: curves coincide (amp_bf16, amp_fp16, fp32)"
    notes = [t for t in _legend_texts(ax2) if t.startswith("lines overlap")]
    assert [" ".join(t.split()) for t in notes] == ["lines overlap: curves coincide (fp16-fp16, fp16-fp32)"]


def test_loss_curves_failed_run_not_in_a_schedule_colour(study, monkeypatch):
    """The diverged fp16-fp16 run is drawn dark grey with its own legend entry, not red like fp16-fp32."""
    from matplotlib.colors import to_hex

    from precswitch.analysis.plots import FAILED_RUN_LABEL

    fig = figures(monkeypatch, study[0] / "results", ["loss_curves"])["loss_curves"]
    ax2 = fig.axes[1]
    colours = {to_hex(h.get_color()) for _, h in _series(ax2)}
    failed = [ln for ln in ax2.get_lines() if ln.get_label() == FAILED_RUN_LABEL]
    assert len(failed) == 1 and to_hex(failed[0].get_color()) not in colours | {to_hex("tab:red")}
    assert FAILED_RUN_LABEL in _legend_texts(ax2)
    assert not any(t.startswith("lines overlap") for t in _legend_texts(ax2))  # these curves differ


def test_loss_scale_identical_seeds_stay_visible(tmp_path, monkeypatch):
    """The fake fp16 runs all have the same loss-scale trace (halved at steps 1 and 2)."""
    out, _ = _small_study(tmp_path, schedules={"fp32-fp32": ("fp32", "fp32"), "fp16-fp16": ("amp_fp16", "amp_fp16")})
    fig = figures(monkeypatch, out, ["loss_scale"])["loss_scale"]
    for ax, name in zip(fig.axes, ("amp_fp16", "fp16-fp16")):
        _assert_told_apart(ax)
        assert [lab for lab, _ in _series(ax)] == [f"{name} seed {k}" for k in (1, 2, 3)]
        assert " ".join(_legend_texts(ax)[-1].split()) == f"lines overlap: curves coincide ({name} seeds 1, 2, 3)"


def test_forest_note_and_legend_below_the_axes(tmp_path, monkeypatch):
    """The 'no bootstrap CI' note used to sit inside the axes across the zero line, and the legend far
    below the axis label; both now sit right under the axis label, outside the data area."""
    out, _ = _small_study(tmp_path)
    fig = figures(monkeypatch, out, ["forest"])["forest"]
    ax = fig.axes[0]
    r = fig.canvas.get_renderer()
    assert not [t for t in ax.texts if "bootstrap" in t.get_text()]
    note = [t for t in fig.texts if t.get_text().startswith("no bootstrap CI below 3") or
            t.get_text().startswith("no bootstrap CI below 8")]
    assert len(note) == 1
    nb, data = note[0].get_window_extent(r), ax.get_window_extent(r)
    assert not nb.overlaps(data) and nb.y1 < data.y0
    deco = ax.get_tightbbox(r)  # data area + tick labels + axis label
    assert nb.y1 <= deco.y0 + 0.5
    (leg,) = fig.legends
    lb = leg.get_window_extent(r)
    gap_pt = (deco.y0 - lb.y1) * 72 / fig.dpi
    assert 0 <= gap_pt <= 10, gap_pt  # close under the axis label
    assert 0 <= (lb.y0 - nb.y1) * 72 / fig.dpi <= 10  # the note right under the legend


def test_long_schedule_names_do_not_overlap_on_the_accuracy_axis(tmp_path, monkeypatch):
    sched = {"fp32-fp32": ("fp32", "fp32")}
    sched.update({f"pretrain_fp16_to_fp32_switch@{k}": ("amp_fp16", "fp32") for k in (0, 25, 50, 75, 100)})
    out, _ = _small_study(tmp_path, schedules=sched)
    fig = figures(monkeypatch, out, ["accuracy"])["accuracy"]
    import math

    r = fig.canvas.get_renderer()
    labels = [t for t in fig.axes[0].get_xticklabels() if t.get_text()]
    assert len(labels) == 6
    angle = labels[0].get_rotation()
    if angle == 0:
        boxes = sorted((t.get_window_extent(r) for t in labels), key=lambda b: b.x0)
        assert not any(a.overlaps(b) for a, b in itertools.pairwise(boxes))
    else:  # parallel slanted labels: their bands must not overlap (axis-aligned boxes of slanted text do)
        step = abs(fig.axes[0].transData.transform((1, 0))[0] - fig.axes[0].transData.transform((0, 0))[0])
        height = labels[0].get_fontsize() * fig.dpi / 72
        assert step * math.sin(math.radians(angle)) > 1.2 * height
        assert all(t.get_rotation() == angle for t in labels)


def test_switch_point_and_overflow_labels_fit(tmp_path, monkeypatch):
    """switch_point: the two panels' x labels used to run into each other; overflow: its y label was taller
    than the axes (it stuck out above the title)."""
    sched = {"fp32-fp32": ("fp32", "fp32")}
    sched.update({f"sw@{k}": ("amp_fp16", "fp32") for k in (0, 50, 100)})

    def mutate(m, p):
        if m["stage"] == "finetune" and m["schedule"] != "fp32-fp32":
            m["tags"].update(sweep="fp16_to_fp32", sweep_at=int(m["schedule"].split("@")[1]) / 100,
                             sweep_stage="finetune")
        if m["stage"] == "pretrain":
            layers = [f"bert.encoder.layer.{i}.output.LayerNorm" for i in range(24)]
            m["activation_telemetry"] = {"every": 10, "layers": {x: {"max_abs": 10 ** (1 + i / 6)}
                                                                 for i, x in enumerate(layers)}}

    out, _ = _small_study(tmp_path, schedules=sched, mutate=mutate)
    figs = figures(monkeypatch, out, ["switch_point", "overflow"])
    r = figs["switch_point"].canvas.get_renderer()
    a, b = (ax.xaxis.label.get_window_extent(r) for ax in figs["switch_point"].axes[:2])
    assert not a.overlaps(b) and a.x1 < b.x0
    fig = figs["overflow"]
    ax = fig.axes[0]
    r = fig.canvas.get_renderer()
    assert ax.yaxis.label.get_window_extent(r).height <= ax.get_window_extent(r).height
    assert ax.yaxis.label.get_window_extent(r).y1 <= ax.title.get_window_extent(r).y0
    assert " ".join(_legend_texts(ax)[-1].split()) == "lines overlap: curves coincide (amp_fp16, fp32)"


def test_a_skipped_steps_extra_row_is_marked_but_not_averaged_into_the_loss_curves(tmp_path, monkeypatch):
    """The engine logs every log_every-th step plus every skipped step. The loss_scale plot marks the extra row's
    skip; the loss curves, averaged over seeds per step, use only the log grid the runs share (else one seed's
    extra row would be the whole 'mean' at its step)."""
    import numpy as np

    def thin_fp16_logs(m, p):
        if m["stage"] != "pretrain" or m["precision"] != "amp_fp16":
            return
        m["hparams"] = {**(m.get("hparams") or {}), "log_every": 5}
        st = pd.read_csv(p.parent / "steps.csv")
        st = st[((st["step"] - 1) % 5 == 0) | (st["step"] == st["step"].max())].copy()
        st["skipped"] = 0
        if m["seed"] == 2:  # a skip at step 4, between logged steps, with an outlying loss
            extra = st.iloc[[0]].assign(step=4, loss=99.0, skipped=1, loss_scale=1024.0)
            st = pd.concat([st, extra]).sort_values("step")
        st.to_csv(p.parent / "steps.csv", index=False)

    out, _ = _small_study(tmp_path, mutate=thin_fp16_logs,
                          schedules={"fp32-fp32": ("fp32", "fp32"), "fp16-fp16": ("amp_fp16", "amp_fp16")})
    from precswitch.analysis.aggregate import read_table

    steps = read_table(out / "steps.csv")
    fp16 = steps[(steps["stage"] == "pretrain") & (steps["precision"] == "amp_fp16")]
    assert sorted(fp16.loc[~fp16["regular"], "step"]) == [4]
    assert fp16.loc[fp16["regular"], "step"].drop_duplicates().sort_values().tolist() == [1, 6, 11, 16, 20]
    assert steps.loc[steps["precision"] == "fp32", "regular"].all()  # no log_every recorded: every row

    figs = figures(monkeypatch, out, ["loss_curves", "loss_scale"])
    lines = figs["loss_curves"].axes[0].get_lines()
    assert [1, 6, 11, 16, 20] in [list(ln.get_xdata()) for ln in lines]  # amp_fp16's mean: the grid only
    assert np.nanmax(np.concatenate([ln.get_ydata() for ln in lines])) < 99
    crosses = [ln for ln in figs["loss_scale"].axes[0].get_lines() if ln.get_label().startswith("skipped step")]
    assert len(crosses) == 1 and list(crosses[0].get_xdata()) == [4] and list(crosses[0].get_ydata()) == [1024.0]












def test_cli_stats_options_reach_the_settings_and_the_named_files(tmp_path, capsys):
    """--margin, --alpha, --bootstrap-resamples, --seed end up in stats.json's settings, and each explicit
    output option names the file that gets that table."""
    paths = write_fake_study(tmp_path / "s", seeds=range(1, 6), effects={"fp16-fp16": -5.0}, sd=0.3)
    for p in paths:  # the same F1 everywhere: its labels differ from accuracy's
        m = json.loads(p.read_text())
        if m["stage"] == "finetune":
            m["f1"] = 0.8
            p.write_text(json.dumps(m))
    t = tmp_path / "t"
    assert main(["aggregate", "--metrics", *map(str, paths), "--out-dir", str(t)]) == 0
    o = {k: tmp_path / "o" / k for k in ("summary.csv", "summary.md", "deltas.csv", "stats.json")}
    assert main(["stats", "--runs", str(t / "runs.csv"), "--schedules", str(t / "schedules.csv"),
                 "--margin", "0.5", "--alpha", "0.1", "--bootstrap-resamples", "0", "--seed", "3",
                 "--summary-csv", str(o["summary.csv"]), "--summary-md", str(o["summary.md"]),
                 "--deltas-csv", str(o["deltas.csv"]), "--stats-json", str(o["stats.json"])]) == 0
    stats = json.loads(o["stats.json"].read_text())
    s = stats["settings"]
    assert (s["margin"], s["alpha"], s["bootstrap_resamples"], s["seed"]) == (0.5, 0.1, 0, 3)
    assert {r["margin"] for r in stats["deltas"] if r["metric"] == "accuracy"} == {0.5}
    assert list(pd.read_csv(o["summary.csv"]).columns[:3]) == ["level", "group", "metric"]
    assert list(pd.read_csv(o["deltas.csv"]).columns[:2]) == ["family", "contrast"]
    assert o["summary.md"].read_text().startswith("# Summary per schedule") and "90% t CI" in o["summary.md"].read_text()
    err = capsys.readouterr().err
    acc = {r["a"]: r["classification"] for r in stats["deltas"]
           if r["family"] == "vs_baseline" and r["metric"] == "accuracy"}
    assert sorted(acc) == ["bf16-fp32", "fp16-fp16", "fp16-fp32"] and acc["fp16-fp16"] == "worse"
    assert "precswitch stats: vs fp32-fp32: " + ", ".join(f"{k} {v}" for k, v in acc.items()) in err
    assert "fp16-fp16 worse" in err  # the accuracy label, not F1's (F1 is the same everywhere: not judged worse)








