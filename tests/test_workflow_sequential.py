"""Sequential seeds in the workflow (config key `sequential`, workflow/rules/sequential.smk): the config's
checks, the design study.plan makes of it, what each look decides and asks for, and (slow) one sequential
study end to end whose looks grow the DAG through Snakemake checkpoints."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from precswitch import study
from precswitch.analysis import sequential as sq
from precswitch.study import ConfigError

THREE = {"base": {"pretrain": "fp32", "finetune": "fp32"}, "x": {"pretrain": "fp32", "finetune": "amp_bf16"},
         "y": {"finetune": "fp32"}}


def _plan(**over):
    cfg = {"schedules": THREE, "analysis": {"baseline": "base", "contrasts": []}, **over}
    return study.plan(study.validate(cfg))


# ---------------------------------------------------------------------------------------------- config
def test_sequential_is_off_by_default_and_the_seeds_list_is_the_design():
    p = _plan(seeds=[4, 2])
    assert p.sequential is None and p.seeds == [4, 2]


def test_the_seeds_are_the_list_first_then_the_integers_after_its_largest():
    p = _plan(seeds=[7, 2], sequential={"start": 2, "max_seeds": 5})
    assert p.seeds == [7, 2, 8, 9, 10]
    assert p.sequential["seeds"] == [7, 2, 8, 9, 10]
    # defaults filled by the schema; margin and power from analysis
    assert (p.sequential["start"], p.sequential["step"], p.sequential["alpha"]) == (2, 1, 0.05)
    assert (p.sequential["margin"], p.sequential["power"]) == (1.0, 0.8)
    # a longer list than max_seeds: its first max_seeds values
    assert _plan(seeds=[1, 2, 3, 4], sequential={"start": 2, "max_seeds": 3}).seeds == [1, 2, 3]


def test_comparisons_are_each_schedule_vs_the_baseline_then_the_contrasts_not_among_them():
    p = study.plan(study.validate({"schedules": THREE, "sequential": {},
                                   "analysis": {"baseline": "base", "contrasts": [["x", "y"], ["base", "x"]]}}))
    assert p.sequential["comparisons"] == [["x", "base"], ["y", "base"], ["x", "y"]]
    assert p.sequential["stage1"] == {"base": "fp32", "x": "fp32", "y": None}


@pytest.mark.parametrize("value, key", [
    ({"start": 1}, "sequential.start"),
    ({"start": 5, "max_seeds": 4}, "sequential.max_seeds"),
    ({"step": 0}, "sequential.step"),
    ({"alpha": 1.0}, "sequential.alpha"),
    ({"maximum": 8}, "sequential"),
    ([3, 10], "sequential"),
])
def test_a_bad_sequential_setting_names_its_key(value, key):
    with pytest.raises(ConfigError) as e:
        study.check({"schedules": THREE, "analysis": {"baseline": "base", "contrasts": []}, "sequential": value})
    assert e.value.key == key


def test_a_sequential_study_needs_two_schedules():
    with pytest.raises(ConfigError) as e:
        study.check({"schedules": {"base": THREE["base"]}, "analysis": {"baseline": "base", "contrasts": []},
                     "sequential": {}})
    assert e.value.key == "sequential"


# --------------------------------------------------------------------------------------------- planning
def _rows(acc: dict) -> pd.DataFrame:
    """schedules rows from {schedule: [accuracy per seed of the design, in order]} (None: a failed run)."""
    seeds = [7, 2, 8, 9, 10, 11]
    return pd.DataFrame([{"schedule": s, "seed": seeds[i], "status": "ok" if a is not None else "diverged",
                          "accuracy": a, "eval_examples": 2000} for s, accs in acc.items() for i, a in enumerate(accs)])


DESIGN = {"start": 2, "step": 2, "max_seeds": 6, "alpha": 0.6, "margin": 1.0, "power": 0.8,
          "seeds": [7, 2, 8, 9, 10, 11], "comparisons": [["x", "base"], ["y", "base"], ["x", "y"]],
          "schedules": ["base", "x", "y"], "stage1": {"base": "fp32", "x": "fp32", "y": None}}


def test_a_look_gives_new_seeds_to_both_schedules_of_each_open_comparison_only():
    # x - base: +20 and +22 points (different); y - base: 0 and 0 (identical); x - y: different
    acc = {"base": [0.50, 0.60], "x": [0.70, 0.82], "y": [0.50, 0.60]}
    look = sq.look(_rows(acc), DESIGN, 0)
    assert [r["decision"] for r in look["comparisons"]] == ["different", "identical", "different"]
    assert look["next"] == {} and look["done"]
    # y - base now spread around 0 (open); x - base still different: only y and base run on,
    # with the same seed numbers (the design's next two: 8 and 9), so every pair stays paired
    acc["y"] = [0.45, 0.66]
    look = sq.look(_rows(acc), DESIGN, 0)
    decisions = {(r["a"], r["b"]): r["decision"] for r in look["comparisons"]}
    assert decisions == {("x", "base"): "different", ("y", "base"): "continue", ("x", "y"): "different"}
    assert look["next"] == {"base": [8, 9], "y": [8, 9]} and not look["done"]
    assert look["seeds"] == 2


def test_a_settled_comparison_keeps_its_look_while_its_schedules_run_on():
    # look 1 at 4 seeds: x vs base settled at look 0; base ran seeds 8, 9 for y's comparison
    acc = {"base": [0.50, 0.60, 0.55, 0.52], "x": [0.70, 0.82], "y": [0.45, 0.66, 0.40, 0.70]}
    look = sq.look(_rows(acc), DESIGN, 1)
    xb = next(r for r in look["comparisons"] if r["a"] == "x" and r["b"] == "base")
    assert (xb["look"], xb["seeds"], xb["decision"]) == (0, 2, "different")
    yb = next(r for r in look["comparisons"] if r["a"] == "y")
    assert (yb["look"], yb["seeds"], yb["decision"]) == (1, 4, "continue")
    assert look["next"] == {"base": [10, 11], "y": [10, 11]}


def test_failed_runs_keep_a_comparison_open_until_max_seeds_then_inconclusive():
    acc = {"base": [0.5] * 6, "x": [0.5] * 6, "y": [None] * 6}
    look = sq.look(_rows(acc), DESIGN, 2)
    yb = next(r for r in look["comparisons"] if r["a"] == "y" and r["b"] == "base")
    assert (yb["seeds"], yb["n"], yb["decision"]) == (6, 0, "inconclusive")
    assert look["done"]


def test_a_look_refuses_data_missing_for_an_open_comparison():
    acc = {"base": [0.50, 0.60], "x": [0.70, 0.82], "y": [0.45, 0.66]}
    with pytest.raises(ValueError, match="look 1"):
        sq.look(_rows(acc), DESIGN, 1)


def test_sequential_table_and_savings():
    acc = {"base": [0.50, 0.60, 0.55, 0.52], "x": [0.70, 0.82], "y": [0.45, 0.66, 0.40, 0.70]}
    rows = _rows(acc)
    rows["stage1_train_seconds"] = rows["schedule"].map({"base": 10.0, "x": 10.0, "y": math.nan})
    rows["stage1_run_id"] = [f"s1-{s}" if s != "y" else None for s in rows["seed"]]
    rows["stage2_train_seconds"] = rows["schedule"].map({"base": 2.0, "x": 3.0, "y": 4.0})
    table = sq.sequential_table(rows, DESIGN)
    assert list(table.columns) == sq.TABLE_COLUMNS
    assert table.groupby("comparison")["look"].max().to_dict() == {
        "x vs base": 0, "y vs base": 1, "x vs y": 0}
    s = sq.savings(rows, table, DESIGN)
    assert s["seeds_per_schedule"] == {"base": 4, "x": 2, "y": 4}
    # spent: stage 1 once per seed (4 runs of 10 s), stage 2 of every run
    assert s["train_seconds"] == pytest.approx(4 * 10 + 4 * 2 + 2 * 3 + 4 * 4)
    xb = s["comparisons"][0]
    d = (100 * (rows[rows.schedule == "x"].accuracy.values - rows[rows.schedule == "base"].accuracy.values[:2]))
    sd = float(pd.Series(d).std())
    # the fixed design of the same power, sized for what the comparison concluded
    expected = {"different": sq.fixed_seeds(xb["mean"], sd, 0.8, 0.6),
                "equivalent": sq.fixed_equivalence_seeds(xb["mean"], sd, DESIGN["margin"], 0.8, 0.6)}.get(
        xb["decision"], sq.fixed_seeds(1.0, sd, 0.8, 0.6))
    assert xb["fixed_seeds"] == (None if expected is None else max(2, expected))
    # one seed of x vs base: stage 2 of x and base, their shared stage 1 once
    assert xb["seconds_saved"] == pytest.approx(xb["seeds_saved"] * (2 + 3 + 10))
    assert s["max_train_seconds"] == pytest.approx(6 * (2 + 3 + 4 + 10))


# ------------------------------------------------------------------------------------------- end to end
def _jobs(log: str, rule: str) -> int:
    import re

    return len(re.findall(rf"^(?:local)?(?:rule|checkpoint) {rule}:$", log, re.M))


@pytest.mark.slow
def test_a_sequential_study_grows_its_runs_look_by_look_and_resumes_without_retraining(tmp_path):
    """tests/configs/sequential.yaml over tiny.yaml: scratch-fp32 vs fp32-fp32 settles at look 0, fp32-tf32
    (skipped on a CPU: no pairs) runs to max_seeds. The study is stopped after look 0 (as if killed) and run
    again: it resumes from the look file, the third seed goes to fp32-fp32 and fp32-tf32 only, no run trains
    twice, and a rerun after completion has nothing to do."""
    from workflow_helpers import CONFIGS, snakemake

    configs = ["--configfile", CONFIGS / "tiny.yaml", CONFIGS / "sequential.yaml"]
    results = tmp_path / "results"
    first = snakemake(tmp_path, "results/sequential/look0.json", "--cores", "2", *configs, timeout=900, check=True)
    runs = sorted(results.glob("runs/*/*/seed*/metrics.json"))
    before = {p: p.stat().st_mtime_ns for p in [*runs, results / "sequential" / "look0.json"]}
    look0 = json.loads((results / "sequential" / "look0.json").read_text())
    assert {(r["a"], r["decision"]) for r in look0["comparisons"]} == {
        ("scratch-fp32", "identical"), ("fp32-tf32", "continue")}
    assert look0["next"] == {"fp32-fp32": [3], "fp32-tf32": [3]}

    second = snakemake(tmp_path, "--cores", "2", *configs, timeout=900, check=True)
    assert {p: p.stat().st_mtime_ns for p in before} == before  # nothing finished was redone
    schedules = pd.read_csv(results / "schedules.csv")
    assert sorted(zip(schedules["schedule"], schedules["seed"])) == sorted(
        [(s, seed) for s in ("fp32-fp32", "fp32-tf32") for seed in (1, 2, 3)] + [("scratch-fp32", 1), ("scratch-fp32", 2)])
    # every run trained once over the two invocations: 8 stage-2 runs, 3 shared stage-1 runs
    log = first.stderr + second.stderr
    assert (_jobs(log, "finetune"), _jobs(log, "pretrain"), _jobs(log, "look")) == (8, 3, 2)
    table = pd.read_csv(results / "sequential.csv")
    assert list(table.columns) == sq.TABLE_COLUMNS
    assert table[["comparison", "look", "seeds", "decision"]].values.tolist() == [
        ["scratch-fp32 vs fp32-fp32", 0, 2, "identical"],
        ["fp32-tf32 vs fp32-fp32", 0, 2, "continue"],
        ["fp32-tf32 vs fp32-fp32", 1, 3, "inconclusive"]]
    assert json.loads((results / "sequential" / "look1.json").read_text())["done"]
    assert "## Sequential seeds" in (results / "verdict.md").read_text()
    again = snakemake(tmp_path, "-n", "--cores", "2", *configs, timeout=300, check=True)
    assert "Nothing to be done" in again.stdout + again.stderr


def test_verdict_section_gives_each_comparison_its_seeds_stop_and_savings():
    from precswitch.analysis.verdict import _sequential

    assert _sequential(None) == ""
    seq = {"alpha": 0.05, "margin": 1.0, "power": 0.8, "max_seeds": 8, "train_seconds": 7200.0,
           "fixed_seeds": 10, "fixed_train_seconds": 18000.0, "max_train_seconds": 14400.0,
           "seeds_per_schedule": {"base": 8, "x": 5, "y": 8},
           "comparisons": [
               {"a": "x", "b": "base", "decision": "different", "seeds": 5, "mean": 2.5, "lo": 0.4, "hi": 4.6,
                "fixed_seeds": 10, "seeds_saved": 5, "seconds_saved": 5400.0},
               {"a": "y", "b": "base", "decision": "inconclusive", "seeds": 8, "mean": None, "lo": None,
                "hi": None, "fixed_seeds": None, "seeds_saved": None, "seconds_saved": None}]}
    text = _sequential(seq)
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| `")]
    assert [r[1].split("**")[1] for r in rows] == ["different", "inconclusive"]
    assert [r[2] for r in rows] == ["5", "8"]
    assert "+2.50 [+0.40, +4.60]" in rows[0][3] and rows[1][3] == "no pairs"
    assert (rows[0][5], rows[0][6].rstrip(" |")) == ("5", "1.50 h")
    assert "`x` 5" in text and "5.00 h" in text  # fixed design of the same power: 18000 s
