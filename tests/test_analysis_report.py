"""Plots and verdict: files exist, explicit outputs, verdict text carries the classifications."""

import itertools
import json
from pathlib import Path

import pandas as pd
import pytest

from plot_helpers import fake_study, figures

from precswitch.analysis.aggregate import aggregate
from precswitch.analysis.fakes import write_fake_study
from precswitch.analysis.plots import PLOT_NAMES, make_plots
from precswitch.analysis.stats import load_settings, run_stats
from precswitch.analysis.verdict import render, write_verdict
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


def test_verdict_text(study, tmp_path):
    root, _, stats = study
    text = write_verdict(root / "results" / "stats.json", tmp_path / "verdict.md")
    assert (tmp_path / "verdict.md").read_text() == text
    assert text.startswith("# ")
    head = text.split("## Answer")[0]
    assert "If BERT is pre-trained in low precision" in head
    for needle in ("`cpu`", "2.13.0+cpu", "5.24.0", "`0000000`", "memory measured as `cpu_peak_rss` in `warm`-started"):
        assert needle in head
    answer = text.split("## Answer")[1].split("## Per schedule")[0]
    assert "After amp_fp16 pre-training, fine-tuning in fp32 instead of amp_fp16 raises accuracy" in answer
    assert "Pre-training in amp_fp16 instead of fp32" in answer and "Pre-training in amp_bf16 instead of fp32" in answer
    # a failed run is a finding: the answer names it, not only the per-schedule paragraph
    assert "; `fp16-fp16` failed in 1 of 8 seeds (1 diverged)." in answer, answer
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
    # mixed and pure 16 bits are told apart: the question says so, the study's stage-1 precisions are named
    assert "mixed precision (amp_fp16, amp_bf16" in head and "pure 16-bit training (pure_fp16, pure_bf16" in head
    assert ("**Stage 1 ran in:** `fp32`: fp32 throughout, TF32 off; `amp_bf16`, `amp_fp16`: mixed precision "
            "(fp32 master weights, fp16/bf16 compute). No stage 1 kept its weights in 16 bits") in head
    # sentences start with a capital; the label is not repeated by the phrase after it
    import re

    assert not re.search(r"(?<!e\.g)(?<!i\.e)\. [a-z]", per), re.findall(r".{30}\. [a-z].{20}", per)
    assert "is inconclusive" not in per and "is equivalent to" not in per


def test_stage1_kinds_names_what_low_precision_meant():
    from precswitch.analysis.verdict import _stage1_kinds, precision_kind

    assert precision_kind("amp_fp16-to-fp32-at80").startswith("mixed precision")
    assert precision_kind("pure_bf16_kahan").startswith("pure 16 bits") and precision_kind("tf32").startswith("fp32 w")
    both = _stage1_kinds(["pure_bf16", "fp32", "amp_bf16"])
    assert both == ("**Stage 1 ran in:** `fp32`: fp32 throughout, TF32 off; `amp_bf16`: mixed precision (fp32 master "
                    "weights, bf16 compute); `pure_bf16`: pure 16 bits (weights, gradients and optimizer state "
                    "in bf16).")
    assert _stage1_kinds(["fp32", "pure_fp16"]).endswith("No stage 1 used mixed precision (`amp_fp16`, `amp_bf16`).")
    assert _stage1_kinds([]) == ""


def test_verdict_reports_missing_seeds(tmp_path):
    paths = write_fake_study(tmp_path / "s", seeds=[1, 2, 3])
    paths = [p for p in paths if "finetune/fp16-fp32/seed2" not in str(p)]
    aggregate(paths, tmp_path / "t")
    run_stats(tmp_path / "t" / "runs.csv", tmp_path / "t" / "schedules.csv", load_settings(bootstrap_resamples=0),
              tmp_path / "t")
    text = write_verdict(tmp_path / "t" / "stats.json", tmp_path / "verdict.md")
    para = [p for p in text.split("\n\n") if p.startswith("**fp16-fp32**")][0]
    assert "no result at all for seed(s) 2" in para
    # the Answer says it too, in each sentence about fp16-fp32 (its "2 paired seeds" would otherwise be unexplained)
    answer = text.split("## Answer")[1].split("## Per schedule")[0]
    about = [s for s in answer.split(". ") if "`fp16-fp32` −" in s]
    assert about and all("`fp16-fp32` has no result for seed(s) 2 (see its paragraph)" in s for s in about), answer
    assert "`fp32-fp32` has no result" not in answer


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


# ---------------------------------------------------------------------------- audit fixes
REPO = Path(__file__).resolve().parents[1]


def _small_study(tmp_path, seeds=(1, 2, 3), mutate=None, **kw):
    """Fake study → aggregate → stats; ``mutate(metrics_dict, path)`` edits each metrics.json first."""
    return fake_study(tmp_path, seeds, mutate, bootstrap_resamples=200, **kw)


def _answer(text: str) -> list[str]:
    return text.split("## Answer")[1].split("## Per schedule")[0].split("\n\n")[1].split(". ")


def _row(stats, family, a, b, metric):
    return next(r for r in stats["deltas"] if (r["family"], r["a"], r["b"], r["metric"]) == (family, a, b, metric))


def test_shared_stage1_contrast_reports_stage2_time_and_memory(tmp_path):
    from precswitch.analysis.verdict import _ratio

    out, stats = _small_study(tmp_path)
    text = write_verdict(out / "stats.json", tmp_path / "verdict.md")
    answer = text.split("## Answer")[1].split("## Per schedule")[0]
    shared = next(s for s in answer.split(". ") if "fine-tuning in fp32 instead of amp_fp16" in s)
    t2 = _row(stats, "named", "fp16-fp32", "fp16-fp16", "stage2_train_seconds")
    m2 = _row(stats, "named", "fp16-fp32", "fp16-fp16", "stage2_peak_memory_bytes")
    # the stage-2 ratios of deltas.csv (family named), said to be stage 2, never the totals
    assert f"{_ratio(t2)} the stage-2 (fine-tuning) training time" in shared
    assert f"{_ratio(m2)} the stage-2 peak memory" in shared
    assert "same stage-1 runs" in shared and "total training time" not in shared
    deltas = pd.read_csv(out / "deltas.csv")
    d = deltas[(deltas["family"] == "named") & (deltas["a"] == "fp16-fp32") & (deltas["b"] == "fp16-fp16")
               & (deltas["metric"] == "stage2_train_seconds")].iloc[0]
    assert d["mean"] == pytest.approx(t2["mean"])
    # contrasts whose stage 1 differs keep the totals
    other = next(s for s in answer.split(". ") if "Pre-training in amp_fp16 instead of fp32" in s)
    tt = _row(stats, "named", "fp16-fp32", "fp32-fp32", "total_train_seconds")
    assert f"{_ratio(tt)} the total training time" in other and "stage-2" not in other


def test_no_stage1_contrast_reports_stage2(tmp_path):
    sched = {"fp32-fp32": ("fp32", "fp32"), "ft-fp32": (None, "fp32"), "ft-fp16": (None, "amp_fp16")}
    paths = write_fake_study(tmp_path / "s", schedules=sched, seeds=[1, 2, 3])
    aggregate(paths, tmp_path / "t")
    run_stats(tmp_path / "t" / "runs.csv", tmp_path / "t" / "schedules.csv",
              load_settings(bootstrap_resamples=0, contrasts=[["ft-fp16", "ft-fp32"], ["ft-fp32", "fp32-fp32"]]),
              tmp_path / "t")
    text = write_verdict(tmp_path / "t" / "stats.json", tmp_path / "verdict.md")
    answer = text.split("## Answer")[1].split("## Per schedule")[0]
    assert answer.count("the stage-2 (fine-tuning) training time") == 2
    assert "`ft-fp16` and `ft-fp32` have no stage 1" in answer and "`ft-fp32` has no stage 1" in answer
    assert "total training time" not in answer


def _mini_stats(deltas, **extra):
    """A hand-made stats.json: one schedule against the baseline, the rows given."""
    info = {"stage1_precision": "amp_fp16", "stage2_precision": "fp32", "n_runs": 3, "n_used": 3,
            "n_failed": 0, "n_degenerate": 0, "seeds": [1, 2, 3], "accuracy_points": {"n": 3, "mean": 80.0}}
    base = dict(info, stage1_precision="fp32")
    stats = {"question": "Q?", "settings": {"margin": 1.0, "alpha": 0.05, "power": 0.8, "bootstrap_resamples": 0},
             "baseline": "fp32-fp32", "provenance": {"device": ["cpu"]},
             "schedules": {"fp32-fp32": base, "fp16-fp32": info}, "named_contrasts": [], "missing_contrasts": [],
             "deltas": deltas, "stage1_relation": {"fp16-fp32 vs fp32-fp32": "different"}}
    stats.update(extra)
    return stats


def _ratio_row(metric, mean, lo, hi, p_holm, cls, family="vs_baseline", a="fp16-fp32", b="fp32-fp32"):
    return {"family": family, "a": a, "b": b, "metric": metric, "kind": "ratio", "n_pairs": 3, "mean": mean,
            "ci_low": lo, "ci_high": hi, "p_holm": p_holm, "classification": cls}


def test_labels_name_unadjusted_ci_and_holm_p():
    rows = [_ratio_row("stage1_train_seconds", 1.19, 1.05, 1.35, 0.081, "inconclusive"),
            _ratio_row("stage2_train_seconds", 0.91, 0.32, 2.57, 1.0, "inconclusive"),
            _ratio_row("stage1_peak_memory_bytes", 1.12, 1.11, 1.14, 0.0016, "worse")]
    text = render(_mini_stats(rows))
    para = next(p for p in text.split("\n\n") if p.startswith("**fp16-fp32**"))
    # the CI excludes ×1 but Holm does not: the text says both, so nothing contradicts
    assert ("stage 1 ×1.19 [1.05, 1.35] (not significant after Holm, p 0.081; only the unadjusted CI "
            "excludes ×1)") in para
    assert "stage 2 ×0.91 [0.32, 2.57] (not significant after Holm, p 1.000)" in para
    assert "stage 1 ×1.12 [1.11, 1.14] (12% more memory, Holm p 0.002)" in para
    assert "geometric-mean ratio [unadjusted 95% CI]" in para
    assert "unadjusted 95% t CIs" in text.split("## Answer")[0]


def test_ratio_gets_decimals_when_two_would_hide_the_interval():
    from precswitch.analysis.verdict import _ratio

    assert _ratio({"mean": 0.96923, "ci_low": 0.96686, "ci_high": 0.97162}) == "×0.969 [0.967, 0.972]"
    assert _ratio({"mean": 1.19, "ci_low": 1.05, "ci_high": 1.35}) == "×1.19 [1.05, 1.35]"
    assert _ratio({"mean": 1.0, "ci_low": 1.0, "ci_high": 1.0}) == "×1.00 [1.00, 1.00]"


def _stage1_rows(mean, lo, hi, p_holm, cls):
    return [{"family": "stage1", "a": "amp_fp16", "b": "fp32", "metric": "eval_loss", "kind": "difference",
             "n_pairs": 3, "mean": mean, "ci_low": lo, "ci_high": hi, "p_holm": p_holm, "classification": cls}]


def test_stage1_tiny_loss_difference_in_significant_digits_and_negligible():
    extra = {"stage1_baseline_precision": "fp32", "stage1_summary": {"fp32": {"eval_loss": {"n": 3, "mean": 2.152}}}}
    text = render(_mini_stats(_stage1_rows(-6.634e-5, -1.0205e-4, -3.064e-5, 0.031, "better"), **extra))
    line = next(ln for ln in text.splitlines() if ln.startswith("- **amp_fp16**"))
    assert "−0.000" not in line
    assert "eval loss −6.6e−5 nats [−1.0e−4, −3.1e−5]" in line
    assert "−0.0031% of fp32's 2.15 nats" in line
    assert "better, Holm p 0.031 — negligible: the whole CI is within ±0.1% of the loss" in line
    # a difference of 2% of the loss is reported, not called negligible
    text = render(_mini_stats(_stage1_rows(0.043, 0.03, 0.056, 0.01, "worse"), **extra))
    line = next(ln for ln in text.splitlines() if ln.startswith("- **amp_fp16**"))
    assert "eval loss +0.043 nats [+0.030, +0.056]" in line and "+2.0% of fp32's 2.15 nats" in line
    assert "negligible" not in line
    # older stats.json without stage1_summary: no relative size, still significant digits
    text = render(_mini_stats(_stage1_rows(-6.634e-5, -1.0205e-4, -3.064e-5, 0.031, "better"),
                              stage1_baseline_precision="fp32"))
    assert "eval loss −6.6e−5 nats" in text and "negligible:" not in text


def test_stage1_numbers_agree_between_verdict_summary_and_deltas(tmp_path):
    def tiny(m, p):  # amp_fp16 stage 1: the fp32 loss of the same seed minus ~7e-5
        if m["stage"] == "pretrain":
            m["eval_loss"] = 2.0 + 0.001 * m["seed"] - (6.6e-5 + 1e-5 * (m["seed"] % 2)
                                                        if m["precision"] == "amp_fp16" else 0.0)

    out, _ = _small_study(tmp_path, seeds=range(1, 6), mutate=tiny)
    text = write_verdict(out / "stats.json", tmp_path / "verdict.md")
    md = (out / "summary.md").read_text()
    from precswitch.analysis.stats import fmt_triple

    d = pd.read_csv(out / "deltas.csv")
    el = d[(d["family"] == "stage1") & (d["a"] == "amp_fp16") & (d["metric"] == "eval_loss")].iloc[0]
    m, lo, hi = fmt_triple(el["mean"], el["ci_low"], el["ci_high"])
    assert "e−5" in m
    assert f"eval loss {m} nats [{lo}, {hi}]" in text
    row = next(ln for ln in md.splitlines() if ln.startswith("| amp_fp16 |") and "Holm" in ln)
    assert f"{m} [{lo}, {hi}]" in row and "negligible" in row
    assert "negligible" in next(ln for ln in text.splitlines() if ln.startswith("- **amp_fp16**"))


def test_bootstrap_left_out_below_min_pairs_verdict_and_forest(tmp_path):
    out, stats = _small_study(tmp_path)
    assert all(r["boot_low"] is None for r in stats["deltas"])
    text = write_verdict(out / "stats.json", tmp_path / "verdict.md")
    assert "bootstrap CI" not in text.split("## Caveats")[0]
    assert "Bootstrap CIs are only computed from 8 paired seeds on" in text.split("## Caveats")[1]
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


def test_holds_for_has_no_per_run_config_hash(study, tmp_path):
    root, _, stats = study
    text = write_verdict(root / "results" / "stats.json", tmp_path / "verdict.md")
    head = text.split("## Answer")[0]
    assert "config hash" not in head and "distinct values" not in head and "cafe1234" not in head
    assert "config_hash" not in stats["provenance"]


def _load_mutator(over: set[str]):
    def mutate(m, p):
        m["cpu_count"] = 2
        m["load_avg_1m_start"] = 3.2 if m["run_id"] in over else 0.9
        # 2.2 on 2 cores: the study's own 2 jobs plus a little background, not oversubscription
        m["load_avg_1m_end"] = None if m["run_id"] in over else 2.2
    return mutate


def test_oversubscribed_cpu_caveat(tmp_path):
    over = {"pretrain-fp32-seed1", "finetune-fp16-fp32-seed2"}
    out, stats = _small_study(tmp_path, mutate=_load_mutator(over))
    runs = pd.read_csv(out / "runs.csv")
    assert {"load_avg_1m_start", "load_avg_1m_end", "cpu_count"} <= set(runs.columns)
    assert stats["load"]["n_oversubscribed"] == 2 and stats["load"]["n_runs_checked"] == len(runs)
    text = write_verdict(out / "stats.json", tmp_path / "verdict.md")
    cav = text.split("## Caveats")[1]
    assert f"oversubscribed during 2 of {len(runs)} CPU runs" in cav
    assert "time and throughput ratios are unreliable" in cav and "exceeded the CPU count (2" in cav
    # the Answer quotes time ratios: it says there that they are unreliable, not only in the Caveats
    answer = text.split("## Answer")[1].split("## Per schedule")[0]
    assert f"Timings: 2 of {len(runs)} runs ran on an oversubscribed machine" in answer


def test_no_load_caveat_when_idle_or_not_recorded(tmp_path):
    out, stats = _small_study(tmp_path / "a", mutate=_load_mutator(set()))
    assert stats["load"]["n_oversubscribed"] == 0
    assert "oversubscribed" not in write_verdict(out / "stats.json", tmp_path / "a.md")
    out, stats = _small_study(tmp_path / "b")  # metrics.json from before the load averages
    assert stats["load"] is None
    assert "oversubscribed" not in write_verdict(out / "stats.json", tmp_path / "b.md")
    # an old stats.json without the key at all renders too
    s = json.loads((out / "stats.json").read_text())
    del s["load"]
    assert "oversubscribed" not in render(s)


def test_gpu_timings_caveat_names_eager_pytorch(tmp_path):
    """On a GPU, time ratios of eager steps are the host's as much as the chip's: the verdict says which
    the runs were, and says nothing of it on a CPU or when the step was compiled."""
    def on_gpu(compile_mode):
        def mutate(m, p):
            m.update(device="cuda:0", device_name="NVIDIA H200", cuda_version="13.0")
            if compile_mode is not None:
                m["compile"] = compile_mode
        return mutate

    out, stats = _small_study(tmp_path / "a", mutate=on_gpu(None))  # runs from before the compile key
    text = write_verdict(out / "stats.json", tmp_path / "a.md")
    assert "Timings on a GPU are of eager PyTorch" in text.split("## Caveats")[1]
    out, stats = _small_study(tmp_path / "b", mutate=on_gpu("off"))
    assert stats["provenance"]["compile"] == ["off"]
    text = write_verdict(out / "stats.json", tmp_path / "b.md")
    assert "training step compiled: `off`" in text.split("## Answer")[0]
    assert "Timings on a GPU are of eager PyTorch" in text
    assert "Small scale: a tiny BERT" in text  # no model size recorded (older runs): the default's caveat
    out, _ = _small_study(tmp_path / "c", mutate=lambda m, p: (on_gpu("reduce-overhead")(m, p),
                                                              m.update(model_parameters=108_311_810)))
    text = write_verdict(out / "stats.json", tmp_path / "c.md")
    assert "eager PyTorch" not in text and "training step compiled: `reduce-overhead`" in text
    assert "Small scale" not in text and "model 108.3M parameters" in text  # a BERT-base study is not tiny
    from precswitch.analysis.verdict import _param_span

    assert _param_span(["108311810", "108900000.0"]) == "108.3M-108.9M" and _param_span(["510000", "520000"]) == "0.5M"
    out, _ = _small_study(tmp_path / "d", mutate=lambda m, p: m.update(compile="off"))  # a CPU study
    assert "Timings on a GPU" not in write_verdict(out / "stats.json", tmp_path / "d.md")


def _render_rst(name: str, config: dict) -> str:
    import types

    import jinja2

    # as snakemake.report renders captions and the front page
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string((REPO / "workflow" / "report" / name).read_text()).render(
        snakemake=types.SimpleNamespace(config=config))


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


def test_wilcoxon_caveat_counts_pairs_not_runs(tmp_path):
    """6 finished runs in each schedule but 5 pairs (different seeds diverged): the signed-rank caveat names the pair."""
    _, stats = _small_study(tmp_path, seeds=range(1, 8), diverged={("fp16-fp32", 1), ("fp32-fp32", 2)},
                            schedules={"fp32-fp32": ("fp32", "fp32"), "fp16-fp32": ("amp_fp16", "fp32")})
    assert _row(stats, "vs_baseline", "fp16-fp32", "fp32-fp32", "accuracy")["n_pairs"] == 5
    caveat = next(line for line in render(stats).splitlines() if "signed-rank" in line)
    assert "fp16-fp32 vs fp32-fp32" in caveat
    _, stats = _small_study(tmp_path / "all", seeds=range(1, 7),
                            schedules={"fp32-fp32": ("fp32", "fp32"), "fp16-fp32": ("amp_fp16", "fp32")})
    assert "signed-rank" not in render(stats)


def test_verdict_answers_against_the_baseline_without_contrasts(tmp_path):
    """analysis.contrasts: [] (tests/configs/real-files.yaml): the Answer compares each schedule with the
    baseline instead of 'None of the configured contrasts could be computed'; one seed is 'fewer than 2
    paired seeds', not 'too few finished seeds' (every run finished)."""
    sched = {"fp32-fp32": ("fp32", "fp32"), "bf16-fp32": ("amp_bf16", "fp32")}
    for seeds, needle in (([1, 2, 3], "Pre-training in amp_bf16 instead of fp32 (fine-tuning in fp32 both times) "),
                          ([1], "cannot be judged (fewer than 2 paired seeds with results)")):
        out = tmp_path / f"t{len(seeds)}"
        paths = write_fake_study(tmp_path / f"s{len(seeds)}", schedules=sched, seeds=seeds)
        aggregate(paths, out)
        run_stats(out / "runs.csv", out / "schedules.csv", load_settings(bootstrap_resamples=0, contrasts=[]), out)
        text = write_verdict(out / "stats.json", out / "verdict.md")
        answer = text.split("## Answer")[1].split("## Per schedule")[0]
        assert "None of the configured contrasts" not in answer and "`bf16-fp32` − `fp32-fp32`" in answer, answer
        assert needle in answer and "finished seeds" not in text, answer


def test_counts_agree_in_number():
    from precswitch.analysis.verdict import _acc_phrase

    assert _acc_phrase({"mean": 0.5, "n_pairs": 1}, 1.0, 95).endswith("+0.50 points, 1 paired seed")
    assert _acc_phrase({"mean": 0.5, "n_pairs": 3}, 1.0, 95).endswith(", 3 paired seeds")


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


def test_verdict_does_not_sell_warm_vs_cold_rss_as_memory_saved(tmp_path):
    """fp32's runs started cold (+120 MiB RSS), the rest warm: the verdict said '16% memory saved' for amp_bf16
    (really +10%). Now the memory ratios that would pair a cold with a warm run read 'not compared', the Answer
    and the Caveats say why, and no memory 'saved' claim is made for those comparisons."""
    paths = write_fake_study(tmp_path / "s", seeds=range(1, 6))
    for p in paths:
        m = json.loads(p.read_text())
        if m["run_id"].startswith(("pretrain-fp32-", "finetune-fp32-fp32-")):
            m.update(process_start="cold", peak_memory_bytes=m["peak_memory_bytes"] + 120 * 2**20)
            p.write_text(json.dumps(m))
    aggregate(paths, tmp_path / "t")
    stats = run_stats(tmp_path / "t" / "runs.csv", tmp_path / "t" / "schedules.csv",
                      load_settings(bootstrap_resamples=0), tmp_path / "t")
    text = render(stats)
    answer = text.split("## Answer", 1)[1].split("##", 1)[0]
    for sentence in answer.split(". "):  # a comparison with the cold fp32 baseline states no memory ratio
        if "− `fp32-fp32`" in sentence:
            assert "memory" not in sentence, sentence
    assert "Memory: the ratios above leave out every seed whose two runs were started differently" in answer
    para = next(ln for ln in text.splitlines() if ln.startswith("**bf16-fp32**"))
    assert "Peak memory: stage 1 not compared (in every seed with both runs, one was started warm, the other cold)" in para
    assert "started two ways (cold 10, warm 25)" in text
    # the named contrast of two warm schedules keeps its memory ratio
    assert "the stage-2 peak memory" in answer


def test_verdict_of_a_study_with_only_the_baseline_and_one_seed(tmp_path):
    """A one-schedule, one-seed study: the Answer says there is nothing to compare (not 'none of the configured
    contrasts could be computed'), no empty stage-1 section, and the counts read in the singular."""
    paths = write_fake_study(tmp_path / "s", seeds=[1], schedules={"fp32-fp32": ("fp32", "fp32")})
    aggregate(paths, tmp_path / "t")
    stats = run_stats(tmp_path / "t" / "runs.csv", tmp_path / "t" / "schedules.csv",
                      load_settings(bootstrap_resamples=0, contrasts=[]), tmp_path / "t")
    text = render(stats)
    assert "Only the baseline schedule `fp32-fp32` ran: there is nothing to compare it with" in text
    assert "could be computed" not in text and "## Stage 1 on its own" not in text
    assert "(1 run per schedule)" in text and "1 of 1 run used" in text


def test_equal_values_get_no_interval_below_the_sign_tests_minimum(tmp_path):
    """Three seeds with the very same accuracy printed '[95% CI 80.00, 80.00]': no t interval exists, and a
    point reads as an exact mean. As for paired differences, [v, v] is a 95% interval only from 6 values on."""
    import math

    from precswitch.analysis.stats import describe

    three, six = describe([80.0] * 3), describe([80.0] * 6)
    assert math.isnan(three["ci_low"]) and math.isnan(three["ci_high"]) and three["std"] == 0
    assert six["ci_low"] == six["ci_high"] == 80.0
    paths = write_fake_study(tmp_path / "s", seeds=[1, 2, 3], sd=0.0, seed_sd=0.0)
    aggregate(paths, tmp_path / "t")
    text = render(run_stats(tmp_path / "t" / "runs.csv", tmp_path / "t" / "schedules.csv",
                            load_settings(bootstrap_resamples=0), tmp_path / "t"))
    base = next(ln for ln in text.splitlines() if ln.startswith("**fp32-fp32**"))
    assert "accuracy 80.00%, seed SD 0.00 points" in base and "CI" not in base


def test_numeric_health_unknown_counters_are_not_reported_as_none(tmp_path):
    paths = write_fake_study(tmp_path / "s", seeds=[1, 2])
    for p in paths:
        m = json.loads(p.read_text())
        m.update(skipped_steps=None, nonfinite_losses=None)
        p.write_text(json.dumps(m))
    aggregate(paths, tmp_path / "t")
    text = render(run_stats(tmp_path / "t" / "runs.csv", tmp_path / "t" / "schedules.csv",
                            load_settings(bootstrap_resamples=0), tmp_path / "t"))
    assert "Numeric health: no failed runs; skipped steps and non-finite losses not recorded." in text
    assert "no skipped steps" not in text


def test_parameter_count_of_a_small_model_is_not_zero_millions():
    from precswitch.analysis.verdict import _param_span

    assert _param_span([22562]) == "22.6k"
    assert _param_span([108_310_272, 108_893_186]) == "108.3M-108.9M"


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


def _acc_row(cls, mean, lo, hi, p_holm, **kw):
    return {"family": "vs_baseline", "a": "fp16-fp32", "b": "fp32-fp32", "metric": "accuracy", "kind": "difference",
            "n_pairs": 3, "mean": mean, "ci_low": lo, "ci_high": hi, "p_holm": p_holm, "classification": cls,
            "margin": 1.0, **kw}


def _para(text, name="fp16-fp32"):
    return next(p for p in text.split("\n\n") if p.startswith(f"**{name}**"))


def test_verdict_paragraph_states_the_rows_numbers():
    """The per-schedule paragraph against hand-made rows: throughput up is 'more', down is 'less'; 'by less than
    the margin' only when the CI lies inside it; the detectable difference is the row's mde and the seeds needed
    are its seeds_needed and seeds_needed_equivalence."""
    up = _ratio_row("stage2_samples_per_second", 1.25, 1.2, 1.3, 0.004, "better")
    worse_small = _acc_row("worse", -0.4, -0.7, -0.1, 0.01, within_margin=True)
    para = _para(render(_mini_stats([worse_small, up])))
    assert "less accurate than fp32-fp32, though by less than the ±1 point margin" in para
    assert "Stage-2 throughput ×1.25 [1.20, 1.30] (25% more throughput, Holm p 0.004)" in para
    down = _ratio_row("stage2_samples_per_second", 0.8, 0.75, 0.85, 0.004, "worse")
    worse_big = _acc_row("worse", -2.4, -3.7, -1.1, 0.01, within_margin=False)
    para = _para(render(_mini_stats([worse_big, down])))
    assert "less accurate than fp32-fp32." in para and "by less than" not in para
    assert "Stage-2 throughput ×0.80 [0.75, 0.85] (20% less throughput, Holm p 0.004)" in para
    inc = _acc_row("inconclusive", 0.3, -0.9, 1.5, 0.6, sd=0.9, mde=1.7, seeds_needed=12, seeds_needed_equivalence=20)
    para = _para(render(_mini_stats([inc])))
    assert "with these seeds a difference of 1.70 points is detectable at 80% power after Holm" in para
    assert ("To resolve it: about 12 paired seeds would detect a 1-point difference with 80% power after Holm "
            "(observed paired SD 0.90 points); about 20 would put the CI inside ±1 point") in para


def test_verdict_names_a_stage1_shared_with_the_baseline_instead_of_a_ratio():
    rows = [_ratio_row("stage1_train_seconds", 1.0, 1.0, 1.0, 1.0, "inconclusive"),
            _ratio_row("stage1_peak_memory_bytes", 1.0, 1.0, 1.0, 1.0, "inconclusive"),
            _ratio_row("stage2_train_seconds", 0.7, 0.65, 0.75, 0.002, "better"),
            _ratio_row("stage2_peak_memory_bytes", 0.8, 0.75, 0.85, 0.002, "better")]
    stats = _mini_stats(rows, stage1_relation={"fp16-fp32 vs fp32-fp32": "shared"})
    para = _para(render(stats))
    assert "Training time vs baseline (geometric-mean ratio [unadjusted 95% CI], paired log-ratios): stage 1 shared " \
           "with the baseline (the same runs); stage 2 ×0.70 [0.65, 0.75] (30% time saved, Holm p 0.002)" in para
    assert "Peak memory: stage 2 ×0.80 [0.75, 0.85] (20% memory saved, Holm p 0.002)" in para
    assert "stage 1 ×1.00" not in para
    # the same rows with a stage 1 of its own: the stage-1 ratios are printed
    para = _para(render(_mini_stats(rows)))
    assert "stage 1 ×1.00 [1.00, 1.00]" in para and "shared with the baseline" not in para
