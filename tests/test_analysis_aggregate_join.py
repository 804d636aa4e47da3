"""Aggregation edge cases: names of switched stages, which field wins, statuses, bad inputs, table types."""

import json
import math

import pandas as pd
import pytest

from precswitch.analysis.aggregate import aggregate, build_schedules, load_runs, spec_name
from precswitch.analysis.fakes import write_stage
from precswitch.errors import PrecswitchError

ACC = {"accuracy": 0.8, "f1": 0.8, "mcc": 0.5, "majority_accuracy": 0.5}


def _pre(root, precision="amp_fp16", seed=1, status="ok", **metrics):
    return write_stage(root / "pre" / precision / f"seed{seed}", run_id=f"pre-{precision}-{seed}", stage="pretrain",
                       precision=precision, seed=seed, status=status, metrics=metrics or None)


def _fin(root, schedule="s", precision="fp32", seed=1, status="ok", init_run_id=None, **metrics):
    return write_stage(root / "fin" / schedule / f"seed{seed}", run_id=f"fin-{schedule}-{seed}", stage="finetune",
                       precision=precision, seed=seed, status=status, schedule=schedule, init_run_id=init_run_id,
                       metrics={**ACC, **metrics})


def _edit(path, **kw):
    m = json.loads(path.read_text())
    m.update(kw)
    path.write_text(json.dumps(m))
    return path


def test_spec_name_matches_the_workflows_directory_names():
    """workflow/rules/common.smk names a switched stage `{precision}-to-{switch_to}-at{round(f * 100, 6):g}`:
    0.29 is 'at29' (29.000000000000004 % truncated would be 'at28'), 0.125 'at12.5'; without both switch keys the
    stage is its precision."""
    assert spec_name("amp_fp16", "fp32", 0.8) == "amp_fp16-to-fp32-at80"
    assert spec_name("amp_fp16", "fp32", 0.29) == "amp_fp16-to-fp32-at29"
    assert spec_name("amp_bf16", "fp32", 0.125) == "amp_bf16-to-fp32-at12.5"
    assert spec_name("amp_fp16", "fp32", None) == "amp_fp16"
    assert spec_name("amp_fp16", None, 0.5) == "amp_fp16"
    assert spec_name("amp_fp16", float("nan"), float("nan")) == "amp_fp16"


def test_top_level_fields_win_over_tags_and_hparams(tmp_path):
    """metrics.json's own schedule, sweep and init are the run's; tags/hparams only fill in missing ones."""
    p = _fin(tmp_path, schedule="real")
    _edit(p, sweep="top", init="/ckpt/top", tags={"schedule": "tagged", "sweep": "tag-sweep", "sweep_at": 0.5},
          hparams={"init": "/ckpt/hp"})
    runs = load_runs([p])
    row = runs.iloc[0]
    assert (row["schedule"], row["sweep"], row["init"], row["sweep_at"]) == ("real", "top", "/ckpt/top", 0.5)


@pytest.mark.parametrize("key", ["seed", "status"])
def test_a_metrics_file_without_seed_or_status_is_refused_naming_the_key(tmp_path, key):
    p = _fin(tmp_path)
    m = json.loads(p.read_text())
    del m[key]
    p.write_text(json.dumps(m))
    with pytest.raises(PrecswitchError, match=f"missing required key '{key}'"):
        load_runs([p])


def test_an_unknown_stage_and_no_input_are_refused(tmp_path):
    p = _edit(_fin(tmp_path), stage="eval")
    with pytest.raises(PrecswitchError, match="stage 'eval' is not one of pretrain, finetune"):
        load_runs([p])
    with pytest.raises(PrecswitchError, match="no metrics files given"):
        load_runs([])


def test_stage1_precision_and_spec_of_a_switched_and_a_missing_stage1(tmp_path, capsys):
    """stage1_precision is the stage-1 run's precision, stage1_spec its directory name (with the switch); a
    fine-tune-only row has neither, even when the finetune run names an init_precision."""
    pre = _pre(tmp_path, switch_to="fp32", switch_at=0.8)
    fin = _fin(tmp_path, schedule="sw", init_run_id="pre-amp_fp16-1")
    only = _edit(_fin(tmp_path, schedule="ft"), init_precision="amp_bf16")
    sched = build_schedules(load_runs([pre, fin, only])).set_index("schedule")
    assert sched.loc["sw", "stage1_precision"] == "amp_fp16"
    assert sched.loc["sw", "stage1_spec"] == "amp_fp16-to-fp32-at80"
    assert sched.loc["ft", "stage1_precision"] == "amp_bf16" and pd.isna(sched.loc["ft", "stage1_spec"])


def test_a_finetune_run_used_as_stage1_is_warned_about(tmp_path, capsys):
    first = _fin(tmp_path, schedule="a")
    second = _fin(tmp_path, schedule="b", init_run_id="fin-a-1")
    sched = build_schedules(load_runs([first, second])).set_index("schedule")
    assert sched.loc["b", "stage1_run_id"] == "fin-a-1"
    assert "run 'fin-a-1' (init of 'fin-b-1') is a finetune run, used as stage 1 anyway" in capsys.readouterr().err


def test_two_finetune_runs_of_one_schedule_and_seed_are_refused(tmp_path):
    """Two run_ids for (schedule s, seed 1) would both enter its pairs: an error naming both runs."""
    one = _fin(tmp_path)
    two = _edit(_fin(tmp_path / "again"), run_id="fin-s-1-rerun")
    with pytest.raises(PrecswitchError, match=r"more than one finetune run for the same \(schedule, seed\): "
                                              r"s seed 1 \(fin-s-1\), s seed 1 \(fin-s-1-rerun\)"):
        build_schedules(load_runs([one, two]))


def test_tables_do_not_depend_on_the_order_of_the_inputs(tmp_path):
    """--metrics in any order (the docs: 'any order') gives the same runs.csv and schedules.csv: stage-1 runs first,
    then by precision, seed and run_id; schedules by schedule and seed."""
    pres = [_pre(tmp_path, precision=p, seed=k) for p in ("fp32", "amp_fp16") for k in (2, 1)]
    fins = [_fin(tmp_path, schedule=s, seed=k, init_run_id=f"pre-fp32-{k}") for s in ("b", "a") for k in (2, 1)]
    runs, sched = aggregate(fins + pres, tmp_path / "x")
    assert list(runs["run_id"]) == ["pre-amp_fp16-1", "pre-amp_fp16-2", "pre-fp32-1", "pre-fp32-2",
                                    "fin-a-1", "fin-b-1", "fin-a-2", "fin-b-2"]
    assert list(zip(sched["schedule"], sched["seed"])) == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    aggregate(list(reversed(fins + pres)), tmp_path / "y")
    for t in ("runs", "schedules"):
        x = (tmp_path / "x" / f"{t}.csv").read_text()
        assert (tmp_path / "y" / f"{t}.csv").read_text() == x.replace(str(tmp_path / "x"), str(tmp_path / "y")), t


def test_a_skipped_stage2_without_init_run_id_finds_its_stage1_by_the_checkpoint_directory(tmp_path):
    """A stage skipped before loading its init records no init_run_id, only init (the checkpoint directory inside
    the stage-1 run's directory): the row still joins that stage 1, and the stage-1 columns are that run's."""
    pre = _pre(tmp_path, seed=1)
    fin = _edit(_fin(tmp_path, seed=1, status="skipped"), init=str(pre.parent / "checkpoint"), init_run_id=None)
    row = build_schedules(load_runs([pre, fin])).iloc[0]
    assert row["stage1_run_id"] == "pre-amp_fp16-1" and row["stage1_precision"] == "amp_fp16"
    assert row["status"] == "skipped" and row["stage1_status"] == "ok"


def test_counters_and_time_missing_in_both_stages_stay_missing_not_zero(tmp_path):
    """A stage pair that records no skipped steps, non-finite losses or train time (older or hand-made
    metrics.json) gets empty sums, not 0 (which the verdict would report as 'no skipped steps'); one stage's
    value alone is the sum."""
    pre = _pre(tmp_path)
    fin = _fin(tmp_path, init_run_id="pre-amp_fp16-1")
    for p in (pre, fin):
        m = json.loads(p.read_text())
        for k in ("skipped_steps", "nonfinite_losses", "train_seconds"):
            m.pop(k, None)
        p.write_text(json.dumps(m))
    row = build_schedules(load_runs([pre, fin])).iloc[0]
    assert all(math.isnan(row[k]) for k in ("skipped_steps", "nonfinite_losses", "total_train_seconds"))
    _edit(fin, skipped_steps=3, train_seconds=12.5)
    row = build_schedules(load_runs([pre, fin])).iloc[0]
    assert (row["skipped_steps"], row["total_train_seconds"]) == (3, 12.5) and math.isnan(row["nonfinite_losses"])


def test_an_empty_init_run_id_is_a_fine_tune_only_row_without_a_warning(tmp_path, capsys):
    """init_run_id "" (no stage 1) is missing, like null: no 'starts from run ''' warning, empty stage-1 columns."""
    fin = _edit(_fin(tmp_path), init_run_id="", init_precision="")
    row = build_schedules(load_runs([fin])).iloc[0]
    assert row["stage1_run_id"] is None and math.isnan(row["stage1_train_seconds"])
    assert pd.isna(row["stage1_precision"]) and "warning" not in capsys.readouterr().err

