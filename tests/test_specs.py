"""precswitch.specs: how a schedule's stage is written and what its run is called. One naming for the workflow's
stage-1 directories (common.smk), the analysis' spec display column and benchmarks/gpu_hours.py; the tables carry
the structure itself as columns. Unit-level: no Snakemake."""

from __future__ import annotations

import pytest

from precswitch.analysis.aggregate import spec_name as table_spec_name
from precswitch.specs import OVERRIDE_KEYS, overrides_suffix, run_spec, spec_name, stage_spec
from precswitch.sweeps import point_stages


def test_a_stage_is_normalised_with_its_overrides_sorted():
    assert stage_spec("amp_fp16") == {"precision": "amp_fp16", "switch_to": None, "switch_at": None, "overrides": {}}
    spec = stage_spec({"precision": "pure_fp16", "overrides": {"lr": 1e-3, "adam_eps": 1e-4}})
    assert list(spec["overrides"]) == ["adam_eps", "lr"]
    assert stage_spec({"precision": "fp32", "overrides": None})["overrides"] == {}


@pytest.mark.parametrize("value, name", [
    ("fp32", "fp32"),
    ({"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 0.8}, "amp_fp16-to-fp32-at80"),
    ({"precision": "amp_bf16", "switch_to": "fp32", "switch_at": 0.125}, "amp_bf16-to-fp32-at12.5"),
    ({"precision": "pure_fp16", "overrides": {"adam_eps": 1.0e-4}}, "pure_fp16-with-adam_eps0.0001"),
    ({"precision": "pure_bf16", "overrides": {"lr": 2e-5, "adam_eps": 1e-6}}, "pure_bf16-with-adam_eps1e-06-lr2e-05"),
    ({"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 0.5, "overrides": {"max_grad_norm": 0}},
     "amp_fp16-to-fp32-at50-with-max_grad_norm0.0"),
])
def test_a_run_is_named_by_its_precisions_and_overrides(value, name):
    """The workflow's name (run directory) and the tables' spec column are one name."""
    assert spec_name(stage_spec(value)) == name
    spec = stage_spec(value)
    assert table_spec_name(spec["precision"], spec["switch_to"], spec["switch_at"], spec["overrides"]) == name


def test_different_override_values_never_share_a_name():
    """repr of the float: values that a 6-digit name would round together stay apart; equal values written two
    ways (1e-4, 1.0e-4, an int 0 and 0.0) are one name."""
    assert overrides_suffix({"lr": 1.0000001e-4}) != overrides_suffix({"lr": 1.0000002e-4})
    assert overrides_suffix({"lr": 1e-4}) == overrides_suffix({"lr": 1.0e-4}) == "-with-lr0.0001"
    assert overrides_suffix({"max_grad_norm": 0}) == overrides_suffix({"max_grad_norm": 0.0})
    assert overrides_suffix({}) == overrides_suffix(None) == ""


def test_a_switch_at_1_is_the_run_without_a_switch_and_keeps_its_overrides():
    assert run_spec({"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 1}) == stage_spec("amp_fp16")
    kept = run_spec({"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 1, "overrides": {"lr": 0.002}})
    assert spec_name(kept) == "amp_fp16-with-lr0.002"
    assert run_spec({"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 0.5})["switch_at"] == 0.5


def test_the_tables_spec_column_reads_missing_values_as_none():
    """runs.csv may hold NaN for a run that did not switch; a skipped run may have no precision at all."""
    nan = float("nan")
    assert table_spec_name("amp_fp16", nan, nan) == "amp_fp16"
    assert table_spec_name("amp_fp16", nan, nan, {"lr": 1e-3}) == "amp_fp16-with-lr0.001"
    assert table_spec_name("amp_fp16", nan, nan, "not a mapping") == "amp_fp16"
    assert table_spec_name(None, None, None) is None


def test_a_sweeps_overrides_apply_at_every_point():
    sweep = {"pretrain": "fp32", "switch_at": [0, 0.5, 1],
             "finetune": {"precision": "amp_bf16", "switch_to": "fp32", "overrides": {"lr": 1e-4}}}
    names = [spec_name(run_spec(point_stages(sweep, "finetune", f)["finetune"])) for f in (0, 0.5, 1)]
    assert names == ["fp32-with-lr0.0001", "amp_bf16-to-fp32-at50-with-lr0.0001", "amp_bf16-with-lr0.0001"]


def test_the_loss_scale_plot_finds_fp16_in_a_stages_columns_not_its_name():
    """A stage with fp16 in any part, its precision or the switch_to of an in-stage switch, has a loss scale;
    overrides change nothing."""
    import pandas as pd

    from precswitch.analysis.plots import _scales_loss

    steps = pd.DataFrame({"precision": ["pure_fp16", "fp32", "amp_bf16", "fp32"],
                          "switch_to": [None, "amp_fp16", None, "amp_bf16"],
                          "spec": ["pure_fp16-with-adam_eps0.0001", "fp32-to-amp_fp16-at50-with-lr0.001",
                                   "amp_bf16-with-lr0.001", "fp32-to-amp_bf16-at50"]})
    assert _scales_loss(steps).tolist() == [True, True, False, False]
    # the spec label plays no part: a name that reads like fp16 with fp32 columns is fp32
    assert not _scales_loss(pd.DataFrame({"precision": ["fp32"], "switch_to": [None],
                                          "spec": ["amp_fp16"]})).any()


def test_the_schema_allows_exactly_the_override_keys():
    """workflow/schemas/config.schema.yaml's overrides are precswitch.specs.OVERRIDE_KEYS, each a train.<stage> key
    of the same type and bounds (so an override is refused wherever the stage's own value would be)."""
    import yaml
    from pathlib import Path

    schema = yaml.safe_load((Path(__file__).parents[1] / "workflow" / "schemas" / "config.schema.yaml").read_text())
    overrides = schema["$defs"]["overrides"]["properties"]
    stage = schema["$defs"]["stage_train"]["properties"]
    assert tuple(overrides) == OVERRIDE_KEYS
    bounds = ("type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
    for key, sub in overrides.items():
        assert "default" not in sub, key  # a default would be filled into every overrides mapping
        assert {b: sub.get(b) for b in bounds} == {b: stage[key].get(b) for b in bounds}, key


def test_a_runs_spec_column_carries_the_overrides_its_tags_name():
    """aggregate reads a run's overrides from metrics.json's tags (its hparams hold every value, overridden or
    not): the spec is the run's directory name; a run without them keeps its precision."""
    from precswitch.analysis.aggregate import flatten_metrics

    base = {"run_id": "pretrain-pure_fp16-with-adam_eps0.0001-seed1", "stage": "pretrain", "precision": "pure_fp16",
            "seed": 1, "status": "ok", "hparams": {"adam_eps": 1e-4, "lr": 1e-3}}
    row = flatten_metrics({**base, "tags": {"overrides": {"adam_eps": 1e-4}}})
    assert row["spec"] == "pure_fp16-with-adam_eps0.0001"
    assert flatten_metrics({**base, "tags": {}})["spec"] == "pure_fp16"
    assert flatten_metrics({**base, "switch_to": "fp32", "switch_at": 0.5,
                            "tags": {"overrides": {"lr": 1e-3}}})["spec"] == "pure_fp16-to-fp32-at50-with-lr0.001"
