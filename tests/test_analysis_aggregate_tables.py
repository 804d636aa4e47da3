"""The tables carry the structure (issue 29): a stage's precision, in-stage switch and overrides are columns of runs
and schedules; every run's steps.csv rows are one steps table and the telemetry one activations table; the plots
draw from the tables alone, with the run folders gone."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from precswitch.analysis.aggregate import (ACTIVATION_COLUMNS, STEP_RUN_COLUMNS, aggregate, build_steps, load_runs,
                                           read_table)
from precswitch.analysis.fakes import write_fake_study
from precswitch.errors import PrecswitchError

LAYERS = ["bert.embeddings.LayerNorm", "bert.encoder.layer.2.output.dense", "bert.encoder.layer.10.output.dense"]


def _study(tmp_path, seeds=(1, 2), telemetry=False, log_every=1):
    """A fake study whose amp_bf16 stage 1 switches to fp32 after 80% of its steps and whose fp16-fp16 fine-tuning
    overrides adam_eps and lr; ``telemetry``: every stage-1 run records per-layer maxima. Returns metrics paths."""
    paths = write_fake_study(tmp_path / "s", seeds=list(seeds))
    for p in paths:
        m = json.loads(p.read_text())
        m["hparams"]["log_every"] = log_every
        if m["stage"] == "pretrain" and m["precision"] == "amp_bf16":
            m.update(switch_to="fp32", switch_at=0.8)
        if m["stage"] == "finetune" and m["schedule"] == "fp16-fp16":
            m["tags"]["overrides"] = {"lr": 2e-5, "adam_eps": 1e-4}
        if telemetry and m["stage"] == "pretrain":
            peaks = [10.0 * m["seed"], 7e4 if m["precision"] == "amp_bf16" else 50.0, "inf" if m["seed"] == 2 else 3.0]
            m["activation_telemetry"] = {"every": 5, "max_abs": peaks[1], "max_abs_layer": LAYERS[1],
                                         "layers": {x: {"max_abs": v, "frac_overflow_fp16": 0.0,
                                                        "frac_underflow_fp16": 0.25} for x, v in zip(LAYERS, peaks)}}
        p.write_text(json.dumps(m))
    return paths


def _steps_of(paths):
    return [p.parent / "steps.csv" for p in paths]


def test_runs_carry_precision_switch_and_each_override_as_columns(tmp_path):
    paths = _study(tmp_path)
    aggregate(paths, tmp_path / "t", _steps_of(paths))
    for ext in ("csv", "parquet"):
        runs = read_table(tmp_path / "t" / f"runs.{ext}").set_index("run_id")
        sw = runs.loc["pretrain-amp_bf16-seed1"]
        assert (sw["precision"], sw["switch_to"], sw["switch_at"]) == ("amp_bf16", "fp32", 0.8)
        assert sw["spec"] == "amp_bf16-to-fp32-at80"  # the display name, made from the columns
        assert math.isnan(sw["override_adam_eps"]) and math.isnan(sw["override_lr"])
        ov = runs.loc["finetune-fp16-fp16-seed2"]
        assert (ov["precision"], ov["override_adam_eps"], ov["override_lr"]) == ("amp_fp16", 1e-4, 2e-5)
        assert ov["spec"] == "amp_fp16-with-adam_eps0.0001-lr2e-05"
        # one column per key some stage overrides, no others
        assert sorted(c for c in runs.columns if c.startswith("override_")) == ["override_adam_eps", "override_lr"]
        # a pandas user filters on the value, no name parsing
        assert set(runs.index[runs["override_adam_eps"] == 1e-4]) == {"finetune-fp16-fp16-seed1",
                                                                     "finetune-fp16-fp16-seed2"}


def test_schedules_carry_each_stages_structure_as_columns(tmp_path):
    paths = _study(tmp_path)
    aggregate(paths, tmp_path / "t", _steps_of(paths))
    for ext in ("csv", "parquet"):
        sched = read_table(tmp_path / "t" / f"schedules.{ext}")
        row = sched[(sched["schedule"] == "bf16-fp32") & (sched["seed"] == 1)].iloc[0]
        assert (row["stage1_precision"], row["stage1_switch_to"], row["stage1_switch_at"]) == ("amp_bf16", "fp32", 0.8)
        assert row["stage2_precision"] == "fp32" and pd.isna(row["stage2_switch_to"])
        assert row["stage1_spec"] == "amp_bf16-to-fp32-at80"
        ov = sched[sched["schedule"] == "fp16-fp16"]
        assert ov["stage2_override_adam_eps"].tolist() == [1e-4, 1e-4]
        assert ov["stage2_override_lr"].tolist() == [2e-5, 2e-5]
        assert ov["stage1_override_adam_eps"].isna().all()
        assert sched.loc[sched["schedule"] != "fp16-fp16", "stage2_override_adam_eps"].isna().all()
        # the run files are the runs table's: join on the run ids, no path columns repeated here
        assert not [c for c in sched.columns if c.endswith("metrics_path")]


def test_a_study_without_overrides_has_no_override_columns(tmp_path, capsys):
    """... and without steps files asked for, the steps table is its header, without a warning."""
    paths = write_fake_study(tmp_path / "s", seeds=[1])
    runs, sched = aggregate(paths, tmp_path / "t")
    assert not [c for c in list(runs.columns) + list(sched.columns) if "override_" in c]
    assert read_table(tmp_path / "t" / "steps.csv").empty and "steps.csv" not in capsys.readouterr().err


def test_the_steps_table_has_every_runs_rows_with_its_identity(tmp_path):
    paths = _study(tmp_path)
    runs, _ = aggregate(paths, tmp_path / "t", _steps_of(paths))
    for ext in ("csv", "parquet"):
        steps = read_table(tmp_path / "t" / f"steps.{ext}")
        assert list(steps.columns[:len(STEP_RUN_COLUMNS)]) == list(STEP_RUN_COLUMNS)
        assert set(steps["run_id"]) == set(runs["run_id"])
        for p in paths:
            own = pd.read_csv(p.parent / "steps.csv")
            rid = json.loads(p.read_text())["run_id"]
            got = steps[steps["run_id"] == rid]
            assert got["step"].tolist() == own["step"].tolist()
            assert got["loss"].tolist() == pytest.approx(own["loss"].tolist(), nan_ok=True)
            run = runs[runs["run_id"] == rid].iloc[0]
            for c in ("stage", "seed", "status", "spec", "precision"):
                assert set(got[c]) == {run[c]}, (rid, c)
        sw = steps[steps["run_id"] == "pretrain-amp_bf16-seed1"]
        assert set(sw["switch_to"]) == {"fp32"} and set(sw["switch_at"]) == {0.8}
        ov = steps[steps["schedule"] == "fp16-fp16"]
        assert set(ov["override_adam_eps"]) == {1e-4} and steps.loc[steps["schedule"] != "fp16-fp16",
                                                                     "override_adam_eps"].isna().all()


def test_regular_rows_are_the_log_every_grid_and_the_last_step(tmp_path):
    """With log_every 3 the engine logs steps 1, 4, 7, ... and the last (8), plus a row for a skipped step in
    between (5): only the extra row is irregular."""
    paths = _study(tmp_path, seeds=[1], log_every=3)
    pd.DataFrame({"step": [1, 4, 5, 7, 8], "loss": [5.0, 4.0, 3.9, 3.0, 2.9]}).to_csv(
        paths[0].parent / "steps.csv", index=False)
    steps = build_steps(load_runs(paths), _steps_of(paths))
    rid = json.loads(paths[0].read_text())["run_id"]
    got = steps[steps["run_id"] == rid]
    assert dict(zip(got["step"], got["regular"])) == {1: True, 4: True, 5: False, 7: True, 8: True}


def test_a_run_without_a_readable_log_is_counted_and_a_stray_log_is_refused(tmp_path, capsys):
    paths = _study(tmp_path, seeds=[1])
    (paths[0].parent / "steps.csv").unlink()
    (paths[1].parent / "steps.csv").write_text("")
    runs = load_runs(paths)
    steps = build_steps(runs, _steps_of(paths))
    assert set(steps["run_id"]) == set(runs["run_id"]) - {json.loads(p.read_text())["run_id"] for p in paths[:2]}
    assert "no steps.csv for 2 run(s)" in capsys.readouterr().err
    stray = tmp_path / "elsewhere" / "steps.csv"
    stray.parent.mkdir()
    stray.write_text("step,loss\n1,2.0\n")
    with pytest.raises(PrecswitchError, match="elsewhere"):
        build_steps(runs, [stray])


def test_the_activations_table_is_each_stage1_runs_layers_in_forward_order(tmp_path):
    paths = _study(tmp_path, telemetry=True)
    aggregate(paths, tmp_path / "t", _steps_of(paths))
    acts = read_table(tmp_path / "t" / "activations.csv")
    assert list(acts.columns) == list(ACTIVATION_COLUMNS)
    one = acts[acts["run_id"] == "pretrain-amp_bf16-seed2"]
    assert one["layer"].tolist() == LAYERS  # layer.2 before layer.10: the recorded order, not sorted
    assert one["max_abs"].tolist() == [20.0, 7e4, math.inf]
    assert set(one["spec"]) == {"amp_bf16-to-fp32-at80"} and set(one["stage"]) == {"pretrain"}
    assert len(acts) == 3 * 2 * len(LAYERS)  # 3 stage-1 precisions x 2 seeds


def test_without_telemetry_the_activations_table_is_its_header(tmp_path):
    paths = _study(tmp_path, seeds=[1])
    aggregate(paths, tmp_path / "t", _steps_of(paths))
    assert (tmp_path / "t" / "activations.csv").read_text().strip() == ",".join(ACTIVATION_COLUMNS)

