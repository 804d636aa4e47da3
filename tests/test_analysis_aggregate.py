"""Aggregation: metrics.json files → runs and schedules tables (docs/contracts.md)."""

import json
import math

import pandas as pd
import pytest

from precswitch.analysis.aggregate import SCHEDULE_COLUMNS, aggregate, read_table
from precswitch.analysis.fakes import write_fake_study, write_stage
from precswitch.errors import PrecswitchError


def test_row_counts_and_join(tmp_path):
    paths = write_fake_study(tmp_path / "study", seeds=[1, 2, 3])
    runs, sched = aggregate(paths, tmp_path / "out")
    # 3 stage-1 precisions (fp32, amp_fp16, amp_bf16) x 3 seeds + 4 schedules x 3 seeds
    assert len(runs) == 9 + 12
    assert runs["run_id"].is_unique
    assert len(sched) == 12
    assert list(sched.columns[: len(SCHEDULE_COLUMNS)]) == SCHEDULE_COLUMNS
    assert not sched.duplicated(["schedule", "seed"]).any()
    for name in ("runs.csv", "runs.parquet", "schedules.csv", "schedules.parquet"):
        assert (tmp_path / "out" / name).is_file()
    row = sched[(sched["schedule"] == "fp16-fp32") & (sched["seed"] == 2)].iloc[0]
    assert row["stage1_precision"] == "amp_fp16" and row["stage2_precision"] == "fp32"
    pre = runs[runs["run_id"] == "pretrain-amp_fp16-seed2"].iloc[0]
    fin = runs[runs["run_id"] == "finetune-fp16-fp32-seed2"].iloc[0]
    assert row["stage1_run_id"] == pre["run_id"]
    assert row["stage1_train_seconds"] == pytest.approx(pre["train_seconds"])
    assert row["stage2_train_seconds"] == pytest.approx(fin["train_seconds"])
    assert row["total_train_seconds"] == pytest.approx(pre["train_seconds"] + fin["train_seconds"])
    assert row["stage1_mlm_accuracy"] == pytest.approx(pre["mlm_accuracy"])
    assert row["accuracy"] == pytest.approx(fin["accuracy"])
    # the same stage-1 run feeds both fp16 schedules
    shared = sched[(sched["stage1_run_id"] == "pretrain-amp_fp16-seed2")]
    assert set(shared["schedule"]) == {"fp16-fp32", "fp16-fp16"}
    # tables read back identically from CSV and parquet, text stays text
    for t in ("runs", "schedules"):
        a = read_table(tmp_path / "out" / f"{t}.csv")
        b = read_table(tmp_path / "out" / f"{t}.parquet")
        assert len(a) == len(b) and list(a.columns) == list(b.columns)
    r = read_table(tmp_path / "out" / "runs.csv")
    assert r["git_commit"].iloc[0] == "0000000"  # not the number 0
    assert "grad_norm_max" in r.columns and "metrics_path" in r.columns


def test_finetune_only_schedule_has_empty_stage1(tmp_path):
    paths = write_fake_study(tmp_path / "s", schedules={"fp32-fp32": ("fp32", "fp32"), "ft-only": (None, "fp32")},
                             seeds=[1, 2])
    _, sched = aggregate(paths, tmp_path / "out")
    ft = sched[sched["schedule"] == "ft-only"]
    assert len(ft) == 2
    assert ft["stage1_train_seconds"].isna().all()
    assert ft["stage1_status"].isna().all()
    assert ft["stage1_precision"].isna().all()
    assert (ft["total_train_seconds"] == ft["stage2_train_seconds"]).all()
    assert ft["status"].eq("ok").all()


def test_duplicate_paths_and_identical_copies_are_collapsed(tmp_path):
    paths = write_fake_study(tmp_path / "s", seeds=[1])
    copy = tmp_path / "copy" / "metrics.json"
    copy.parent.mkdir()
    copy.write_text(paths[0].read_text())
    runs, _ = aggregate(paths + paths[:2] + [copy], tmp_path / "out")
    assert len(runs) == len(paths)


def test_conflicting_run_id_is_an_error(tmp_path):
    paths = write_fake_study(tmp_path / "s", seeds=[1])
    other = json.loads(paths[0].read_text())
    other["train_seconds"] = 1.0
    p = tmp_path / "other" / "metrics.json"
    p.parent.mkdir()
    p.write_text(json.dumps(other))
    with pytest.raises(PrecswitchError, match="run_id"):
        aggregate(paths + [p], tmp_path / "out")
    assert not (tmp_path / "out" / "runs.csv").exists()


def test_diverged_stage1_propagates_status(tmp_path):
    paths = write_fake_study(tmp_path / "s", seeds=[1, 2], diverged={("amp_fp16", 2)})
    _, sched = aggregate(paths, tmp_path / "out")
    row = sched[(sched["schedule"] == "fp16-fp32") & (sched["seed"] == 2)].iloc[0]
    assert row["stage1_status"] == "diverged"
    assert row["status"] == "diverged"  # worst of the two stages
    ok = sched[(sched["schedule"] == "fp16-fp32") & (sched["seed"] == 1)].iloc[0]
    assert ok["status"] == "ok"


def test_missing_init_run_leaves_stage1_empty(tmp_path, capsys):
    p = write_stage(tmp_path / "ft", run_id="ft-1", stage="finetune", precision="fp32", seed=1, schedule="x-fp32",
                    init_run_id="pretrain-gone", init_precision="amp_bf16",
                    metrics={"accuracy": 0.8, "f1": 0.8, "mcc": 0.5, "majority_accuracy": 0.5})
    _, sched = aggregate([p], tmp_path / "out")
    assert sched.iloc[0]["stage1_precision"] == "amp_bf16"
    assert math.isnan(sched.iloc[0]["stage1_train_seconds"])
    assert "pretrain-gone" in capsys.readouterr().err


def test_cli_aggregate(tmp_path, capsys):
    from precswitch.cli import main

    paths = write_fake_study(tmp_path / "s", seeds=[1, 2])
    rc = main(["aggregate", "--metrics", *map(str, paths), "--out-dir", str(tmp_path / "out")])
    assert rc == 0
    assert len(pd.read_csv(tmp_path / "out" / "schedules.csv")) == 8
    rc = main(["aggregate", "--metrics", str(tmp_path / "missing.json"), "--out-dir", str(tmp_path / "o2")])
    assert rc == 2
    assert "precswitch: error:" in capsys.readouterr().err


def test_schedule_names_that_look_missing_survive_the_csv(tmp_path):
    """The schema allows a schedule named `None`, `NA` or `nan`: read back from runs.csv/schedules.csv they
    stay those names (pandas would read them as missing and pool or drop the schedules); only an empty text
    cell is missing."""
    names = {"fp32-fp32": ("fp32", "fp32"), "None": (None, "fp32"), "NA": ("amp_bf16", "fp32"),
             "nan": ("amp_bf16", "amp_bf16")}
    aggregate(write_fake_study(tmp_path / "s", schedules=names, seeds=[1, 2]), tmp_path / "out")
    schedules = read_table(tmp_path / "out" / "schedules.csv")
    assert sorted(schedules["schedule"].value_counts().items()) == sorted((n, 2) for n in names)
    assert sorted(read_table(tmp_path / "out" / "schedules.parquet")["schedule"]) == sorted(schedules["schedule"])
    runs = read_table(tmp_path / "out" / "runs.csv")
    finetune = runs[runs["stage"] == "finetune"]
    assert set(finetune["schedule"]) == set(names)
    # an empty text cell is still missing: the finetune-only schedule's stage-1 columns
    row = schedules[schedules["schedule"] == "None"].iloc[0]
    assert row["stage1_precision"] is None and row["stage1_run_id"] is None


def test_schedule_row_takes_each_stage_from_its_own_run(tmp_path):
    """Every schedule row against the two runs it was built from: stage 1 is the run named by the finetune run's
    init_run_id (same seed, its precision), per-stage columns are copied from that stage, counters and time are
    summed over both stages and peak memory is the larger of the two."""
    paths = write_fake_study(tmp_path / "study", seeds=[1, 2, 3])
    runs, sched = aggregate(paths, tmp_path / "out")
    pre = runs[runs["stage"] == "pretrain"].set_index("run_id")
    fin = runs[runs["stage"] == "finetune"].set_index("run_id")
    for r in sched.to_dict("records"):
        p, f = pre.loc[r["stage1_run_id"]], fin.loc[r["stage2_run_id"]]
        assert r["stage1_run_id"] == f["init_run_id"] and p["seed"] == f["seed"] == r["seed"]
        assert (r["stage1_precision"], r["stage2_precision"]) == (p["precision"], f["precision"])
        for col in ("train_seconds", "samples_per_second", "tokens_per_second", "peak_memory_bytes",
                    "skipped_steps", "nonfinite_losses"):
            assert r[f"stage1_{col}"] == pytest.approx(p[col]), col
            assert r[f"stage2_{col}"] == pytest.approx(f[col]), col
        assert (r["stage1_eval_loss"], r["stage1_mlm_accuracy"]) == pytest.approx((p["eval_loss"], p["mlm_accuracy"]))
        assert r["total_train_seconds"] == pytest.approx(p["train_seconds"] + f["train_seconds"])
        assert r["skipped_steps"] == p["skipped_steps"] + f["skipped_steps"]
        assert r["nonfinite_losses"] == p["nonfinite_losses"] + f["nonfinite_losses"]
        assert r["peak_memory_bytes"] == max(p["peak_memory_bytes"], f["peak_memory_bytes"])
    # fakes: an amp_fp16 stage skips its first 2 steps (loss-scale overflow): 2 + 2 for fp16-fp16, 2 + 0 for fp16-fp32
    by = sched.set_index(["schedule", "seed"])
    assert by.loc[("fp16-fp16", 1), "skipped_steps"] == 4 and by.loc[("fp16-fp32", 1), "skipped_steps"] == 2
    # amp_bf16 pre-training takes 1.1x fp32's memory: it sets bf16-fp32's peak over both stages
    assert by.loc[("bf16-fp32", 1), "peak_memory_bytes"] == by.loc[("bf16-fp32", 1), "stage1_peak_memory_bytes"]
    assert by.loc[("bf16-fp32", 1), "peak_memory_bytes"] > by.loc[("bf16-fp32", 1), "stage2_peak_memory_bytes"]


def test_schedule_falls_back_to_tags_schedule(tmp_path):
    """metrics.json without a top-level schedule (older engine) names it in tags.schedule: the row keeps it."""
    p = write_stage(tmp_path / "ft", run_id="ft-1", stage="finetune", precision="fp32", seed=1, schedule=None,
                    metrics={"accuracy": 0.8, "f1": 0.8, "mcc": 0.5, "majority_accuracy": 0.5})
    m = json.loads(p.read_text())
    m["tags"] = {"schedule": "fp32-fp32", "sweep": "s1"}
    p.write_text(json.dumps(m))
    runs, sched = aggregate([p], tmp_path / "out")
    assert runs.iloc[0]["schedule"] == "fp32-fp32" and runs.iloc[0]["sweep"] == "s1"
    assert sched["schedule"].tolist() == ["fp32-fp32"] and sched.iloc[0]["sweep"] == "s1"
