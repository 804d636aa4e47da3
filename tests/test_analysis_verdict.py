"""The verdict: the answer first (headline table), numbers for people, title by design, honest seeds and memory.

Tests read cells of the tables, labels and numbers, not sentences."""


import numpy as np
import pytest

from precswitch.analysis import fmt
from precswitch.analysis.aggregate import aggregate
from precswitch.analysis.fakes import write_fake_study
from precswitch.analysis.paired import paired_contrast
from precswitch.analysis.settings import load_settings
from precswitch.analysis.memory import tensor_bytes_per_parameter
from precswitch.analysis.cli import run_stats
from precswitch.analysis.verdict import UNEXPLAINED, render, write_verdict


def _study(tmp_path, settings=None, **kw):
    kw.setdefault("seeds", range(1, 6))
    paths = write_fake_study(tmp_path / "s", **kw)
    aggregate(paths, tmp_path / "t")
    settings = load_settings(bootstrap_resamples=0, **(settings or {}))
    stats = run_stats(tmp_path / "t" / "runs.csv", tmp_path / "t" / "schedules.csv", settings, tmp_path / "t")
    return stats, write_verdict(tmp_path / "t" / "stats.json", tmp_path / "t" / "verdict.md")


def _table(text: str, heading: str) -> list[list[str]]:
    """The rows (cells stripped) of the first table under ``## heading``."""
    lines = text.split(f"## {heading}", 1)[1].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = lines[start:end]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in rows[2:]]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return _study(tmp_path_factory.mktemp("v"), effects={"fp16-fp16": -2.5})


# ---------------------------------------------------------------------------- the answer first
def test_the_headline_table_comes_first_and_names_the_contrasts_first(study):
    stats, text = study
    lines = text.splitlines()
    first_table = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    assert len(" ".join(lines[:first_table]).split()) < 40  # title, scale and a heading
    rows = _table(text, "Answer")
    named = [f"`{a}` vs `{b}`" for a, b in stats["named_contrasts"]]
    assert [r[0] for r in rows[:len(named)]] == named
    assert [r[0] for r in rows[len(named):]] == ["`fp16-fp16` vs `fp32-fp32`"]  # the rest vs the baseline


def test_a_headline_row_carries_the_rows_numbers_and_label(study):
    stats, text = study
    r = next(d for d in stats["deltas"] if (d["family"], d["a"], d["metric"]) == ("vs_baseline", "fp16-fp16",
                                                                                   "accuracy"))
    row = next(x for x in _table(text, "Answer") if x[0] == "`fp16-fp16` vs `fp32-fp32`")
    assert row[1] == f"{fmt.diff(r['mean'])} [{fmt.diff(r['ci_low'])}, {fmt.diff(r['ci_high'])}]"
    assert row[2] == r["classification"] == "worse" and row[3] == str(r["n_pairs"])
    t = next(d for d in stats["deltas"] if (d["family"], d["a"], d["metric"]) == ("vs_baseline", "fp16-fp16",
                                                                                   "total_train_seconds"))
    assert row[4] == fmt.ratio_ci(t) and row[5] == ("faster" if t["mean"] < 1 else "slower")


def test_a_cpu_memory_difference_the_tensors_cannot_explain_is_not_saved(study):
    """The fakes' amp stage 1s use 10% more RSS, significant, but amp keeps the same 16 bytes a parameter as fp32:
    the runtime's footprint, never 'saved'."""
    stats, text = study
    rows = _table(text, "Answer")
    assert all(r[7] in (UNEXPLAINED, "n.s.") for r in rows)
    assert UNEXPLAINED in {r[7] for r in rows}
    mem = {(r[0], int(r[1])): r for r in _table(text, "Memory")}
    i = stats["schedules"]["fp32-fp32"]
    assert mem[("`fp32-fp32`", 1)][3:5] == [fmt.mib(i["stage1_peak_memory_bytes"]), fmt.mib(i["stage1_tensor_bytes"])]
    assert i["stage1_tensor_bytes"] == 1_013_890 * 16  # the fakes' MLM parameter count, fp32 weights+grads+2 moments


def test_a_memory_saving_the_tensors_explain_is_saved():
    """On CUDA the memory is the device's, so a significant drop is the precision's; on a CPU it counts when the
    tensor bytes differ in its direction by a material share of the process peak."""
    from precswitch.analysis.verdict import _View, memory_label

    base = {"stage2_tensor_bytes": 16e6, "stage2_peak_memory_bytes": 100e6, "n_used": 3}
    stats = {"baseline": "b", "provenance": {"device": ["cpu"], "memory_kind": ["cpu_peak_rss"]},
             "schedules": {"a": {**base, "stage2_tensor_bytes": 8e6}, "b": base}}
    r = {"mean": 0.9, "classification": "better"}
    assert memory_label(_View(stats), r, "a", "b", stage2=True) == "saved"  # 8 MB of 100 MB: material
    stats["schedules"]["a"]["stage2_tensor_bytes"] = 15e6
    assert memory_label(_View(stats), r, "a", "b", stage2=True) == UNEXPLAINED
    stats["provenance"] = {"device": ["cuda:0"], "memory_kind": ["cuda_max_allocated"]}
    assert memory_label(_View(stats), r, "a", "b", stage2=True) == "saved"
    assert memory_label(_View(stats), {**r, "classification": "inconclusive"}, "a", "b", True) == "n.s."


def test_tensor_bytes_per_parameter_follow_the_catalog():
    assert [tensor_bytes_per_parameter(p) for p in ("fp32", "amp_bf16", "pure_fp16", "pure_bf16_kahan")] == [
        16, 16, 8, 10]


def test_the_report_front_has_the_verdicts_title_and_headline_table_in_rest(study):
    """report_front.rst (the report's landing page) carries the same title and headline cells as verdict.md, and
    docutils renders it without a warning."""
    import csv

    from docutils.core import publish_parts

    from precswitch.analysis.verdict import render_front

    stats, text = study
    front = render_front(stats)
    publish_parts(front, writer="html", settings_overrides={"halt_level": 2, "report_level": 2})
    lines = front.splitlines()
    assert "# " + lines[2] == text.splitlines()[0] and set(lines[3]) == {"="}
    cells = list(csv.reader(ln.strip() for ln in lines if ln.startswith('   "')))
    header = text.split("## Answer")[1].splitlines()[2]
    assert cells[0] == [c.strip() for c in header.strip("|").split("|")]
    assert cells[1:] == _table(text, "Answer")
    html = publish_parts(front, writer="html")["html_body"]
    assert "<table" in html and 'class="headline' in html and "fp16-fp16" in html and "`" not in html


# ---------------------------------------------------------------------------- title follows the design
@pytest.mark.parametrize("schedules, starts", [
    ({"fp32-fp32": ("fp32", "fp32"), "bf16-fp32": ("amp_bf16", "fp32")}, "# Pre-training precision"),
    ({"fp32-fp32": ("fp32", "fp32"), "fp32-bf16": ("fp32", "amp_bf16")}, "# Fine-tuning precision"),
    ({"fp32-fp32": ("fp32", "fp32"), "bf16-bf16": ("amp_bf16", "amp_bf16")}, "# Pre-training and fine-tuning"),
])
def test_the_title_follows_which_stage_varies(tmp_path, schedules, starts):
    _, text = _study(tmp_path, schedules=schedules, seeds=range(1, 3), settings={"contrasts": []})
    assert text.startswith(starts)
    if "and fine-tuning" not in starts:  # the stage that does not vary is named
        assert "fp32" in text.splitlines()[0]


def test_only_the_baseline_has_nothing_to_compare(tmp_path):
    _, text = _study(tmp_path, schedules={"fp32-fp32": ("fp32", "fp32")}, seeds=[1], settings={"contrasts": []})
    assert text.startswith("# One schedule") and "## Answer" not in text


# ---------------------------------------------------------------------------- seeds needed, said for what they are
def test_seeds_needed_for_the_observed_effect_and_for_the_margin_are_apart(study):
    stats, text = study
    header = text.split("## Accuracy tests")[1].splitlines()[2]
    assert "seeds: observed Δ" in header and "seeds: 1-point Δ" in header
    row = next(x for x in _table(text, "Accuracy tests") if x[0] == "`fp16-fp16` vs `fp32-fp32`")
    d = next(r for r in stats["deltas"] if (r["family"], r["a"], r["metric"]) == ("vs_baseline", "fp16-fp16",
                                                                                   "accuracy"))
    assert row[9] == str(int(d["seeds_needed_observed"])) and row[10] == str(int(d["seeds_needed"]))
    # a 2.5-point effect needs fewer seeds than a 1-point one: the observed effect was settled with 5
    assert d["seeds_needed_observed"] <= 5 < d["seeds_needed"]


# ---------------------------------------------------------------------------- numbers for people
def test_an_exact_tie_prints_0_00():
    r = paired_contrast([0.8, 0.7, 0.75], np.array([0.8, 0.7, 0.75]) + 1e-17, scale=100)
    assert fmt.diff(r["mean"]) == "0.00"
    assert fmt.diff(3.7e-15) == "0.00" and fmt.diff(-0.004) == "0.00" and fmt.diff(-0.005001) == "−0.01"
    assert fmt.diff(1.234) == "+1.23" and fmt.diff(-6.6e-5, "nats") == "0.000"


def test_ratios_keep_three_significant_digits():
    assert [fmt.ratio(x) for x in (0.87312, 1.0234, 12.345, 0.0456)] == ["0.873", "1.02", "12.3", "0.0456"]
    assert fmt.ratio_ci({"mean": 0.96923, "ci_low": 0.96686, "ci_high": 0.97162}) == "×0.969 [0.967, 0.972]"
    # an interval from two noisy seeds: its ends print as bounds, not as 0.000000154 and 20509845
    assert fmt.ratio_ci({"mean": 1.78, "ci_low": 1.54e-7, "ci_high": 2.05e7}) == "×1.78 [<0.001, >1000]"
    assert fmt.ratio(0.001) == "0.00100" and fmt.ratio(1000.0) == "1000"


def test_p_values_never_round_up_to_the_alpha_they_are_below():
    assert [fmt.fmt_p(v) for v in (0.0496, 0.0504, 0.0009, float("nan"))] == ["0.0496", "0.050", "< 0.001", "n/a"]


# ---------------------------------------------------------------------------- failures, caveats, stage 1
def test_failures_are_named_in_the_answer_and_listed(tmp_path):
    stats, text = _study(tmp_path, seeds=range(1, 4), diverged={("fp16-fp16", 2)},
                         degenerate={("bf16-fp32", 1)})
    answer = text.split("## Accuracy tests")[0]
    assert "`fp16-fp16` failed in 1 of 3 runs" in answer
    fails = text.split("## Failures")[1].split("## ")[0]
    assert "`fp16-fp16` seed 2: diverged" in fails and "`bf16-fp32`: degenerate" in fails
    sched = {r[0]: r for r in _table(text, "Schedules")}
    assert sched["`fp16-fp16`"][4:7] == ["2/3", "1", "0"] and sched["`bf16-fp32`"][6] == "1"


def test_missing_contrasts_and_oversubscription_are_said(study):
    stats, _ = study
    s = {**stats, "missing_contrasts": [["x", "y"]],
         "load": {"n_oversubscribed": 3, "n_runs_checked": 35, "cpu_count": [2], "max_load": 4.0, "threshold": 1.25}}
    text = render(s)
    assert "`x` vs `y`" in text.split("## Accuracy tests")[0]
    assert "3 of 35" in text.split("## Accuracy tests")[0] and "3 of 35" in text.split("## Caveats")[1]


def test_caveats_follow_the_provenance(study):
    stats, _ = study
    cav = render(stats).split("## Caveats")[1]
    assert "CPU" in cav and "Small scale" in cav
    gpu = {**stats, "provenance": {**stats["provenance"], "device": ["cuda:0"], "compile": ["off"],
                                   "model_parameters": ["108311810"], "torch_version": ["2.13", "2.12"]}}
    cav = render(gpu).split("## Caveats")[1]
    assert "eager PyTorch" in cav and "Small scale" not in cav and "torch_version" in cav


def test_stage1_rows_carry_labels_and_negligible(study):
    stats, _ = study
    s = dict(stats)
    s["deltas"] = [dict(r) for r in stats["deltas"]]
    el = next(r for r in s["deltas"] if r["family"] == "stage1" and r["metric"] == "eval_loss")
    el.update(mean=-6.6e-5, ci_low=-1.0e-4, ci_high=-3.1e-5, classification="better", p_holm=0.03)
    row = next(x for x in _table(render(s), "Stage 1 on its own") if x[0] == f"`{el['a']}` vs `{el['b']}`")
    assert row[2] == "0.000 [0.000, 0.000]" and row[3] == "better; negligible"


def test_the_verdict_reads_the_design_not_the_names(study):
    """Schedules renamed to say nothing keep their stages: the verdict takes them from stats.json's columns."""
    stats, _ = study
    s = dict(stats)
    s["schedules"] = {k: dict(v) for k, v in stats["schedules"].items()}
    s["schedules"]["fp16-fp16"].update(stage1_spec="pure_fp16-with-adam_eps0.0001", stage1_overrides={"adam_eps": 1e-4})
    row = next(x for x in _table(render(s), "Schedules") if x[0] == "`fp16-fp16`")
    assert row[1] == "pure_fp16-with-adam_eps0.0001" and row[3] == "stage 1: adam_eps 0.0001"
