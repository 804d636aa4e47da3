"""Plots and verdict: files exist, explicit outputs, verdict text carries the classifications."""

import pytest

from precswitch.analysis.aggregate import aggregate
from precswitch.analysis.fakes import write_fake_study
from precswitch.analysis.plots import PLOT_NAMES, make_plots
from precswitch.analysis.stats import load_settings, run_stats
from precswitch.analysis.verdict import write_verdict
from precswitch.cli import main
from precswitch.errors import PrecswitchError


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    paths = write_fake_study(root / "results", seeds=range(1, 9), effects={"fp16-fp16": -2.5}, sd=0.7,
                             diverged={("fp16-fp16", 4)}, degenerate={("bf16-fp32", 2)}, rng_seed=1)
    aggregate(paths, root / "results")
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


def test_verdict_text(study, tmp_path):
    root, _, stats = study
    text = write_verdict(root / "results" / "stats.json", tmp_path / "verdict.md")
    assert (tmp_path / "verdict.md").read_text() == text
    assert text.startswith("# ")
    head = text.split("## Answer")[0]
    assert "If BERT is pre-trained in low precision" in head
    for needle in ("`cpu`", "2.13.0+cpu", "5.24.0", "`0000000`", "cafe1234", "memory measured as `cpu_peak_rss` in `warm`-started"):
        assert needle in head
    answer = text.split("## Answer")[1].split("## Per schedule")[0]
    assert "After amp_fp16 pre-training, fine-tuning in fp32 instead of amp_fp16 raises accuracy" in answer
    assert "Pre-training in amp_fp16 instead of fp32" in answer and "Pre-training in amp_bf16 instead of fp32" in answer
    per = text.split("## Per schedule")[1]
    fp16 = [p for p in per.split("\n\n") if p.startswith("**fp16-fp16**")][0]
    assert "**WORSE**" in fp16 and "seed 4: diverged" in fp16 and "1 failed run" in fp16
    bf16 = [p for p in per.split("\n\n") if p.startswith("**bf16-fp32**")][0]
    assert "degenerate" in bf16 and "seeds 2" in bf16
    # every non-baseline schedule gets exactly one classification label
    labels = ("**BETTER**", "**WORSE**", "**EQUIVALENT", "**INCONCLUSIVE**", "**NOT JUDGED")
    for p in per.split("\n\n"):
        if p.startswith("**") and not p.startswith("**fp32-fp32**"):
            assert sum(lab in p for lab in labels) == 1, p
    for p in per.split("\n\n"):
        if "**INCONCLUSIVE**" in p:
            assert "seeds would detect" in p
    assert "## Caveats" in text and "CPU" in text.split("## Caveats")[1]
    assert "How failures are counted" in text


def test_verdict_reports_missing_seeds(tmp_path):
    paths = write_fake_study(tmp_path / "s", seeds=[1, 2, 3])
    paths = [p for p in paths if "finetune/fp16-fp32/seed2" not in str(p)]
    aggregate(paths, tmp_path / "t")
    run_stats(tmp_path / "t" / "runs.csv", tmp_path / "t" / "schedules.csv", load_settings(bootstrap_resamples=0),
              tmp_path / "t")
    text = write_verdict(tmp_path / "t" / "stats.json", tmp_path / "verdict.md")
    para = [p for p in text.split("\n\n") if p.startswith("**fp16-fp32**")][0]
    assert "no result at all for seed(s) 2" in para


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


def test_verdict_all_degenerate_is_not_informative(tmp_path):
    sched = {"fp32-fp32": ("fp32", "fp32"), "fp16-fp32": ("amp_fp16", "fp32")}
    paths = write_fake_study(tmp_path / "s", schedules=sched, seeds=[1, 2, 3],
                             degenerate={(s, k) for s in sched for k in (1, 2, 3)})
    aggregate(paths, tmp_path / "t")
    run_stats(tmp_path / "t" / "runs.csv", tmp_path / "t" / "schedules.csv", load_settings(bootstrap_resamples=0),
              tmp_path / "t")
    text = write_verdict(tmp_path / "t" / "stats.json", tmp_path / "verdict.md")
    assert "NOT INFORMATIVE" in text and "the task was not learnt" in text.split("## Per schedule")[0]
