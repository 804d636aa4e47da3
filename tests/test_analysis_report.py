"""Plots and the report: files exist, explicit outputs, captions render (the verdict: test_analysis_verdict.py)."""

import itertools
import json
from pathlib import Path

import pandas as pd
import pytest

from plot_helpers import fake_study

from precswitch.analysis.aggregate import aggregate
from precswitch.analysis.fakes import TWO_SCHEDULES, write_fake_study
from precswitch.analysis.plots import PLOT_NAMES, make_plots
from precswitch.analysis.settings import load_settings
from precswitch.analysis.cli import run_stats
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
    paths = write_fake_study(tmp_path / "s", seeds=[1, 2], schedules=TWO_SCHEDULES)
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
    assert ", ".join(f"{k} {v}" for k, v in acc.items()) in err.split("precswitch stats: vs fp32-fp32 (")[1]
    assert "fp16-fp16 worse" in err  # the accuracy label, not F1's (F1 is the same everywhere: not judged worse)


