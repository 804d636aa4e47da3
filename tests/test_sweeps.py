"""precswitch.sweeps: the schedules a study config's ``sweeps:`` expands into (the workflow's common.smk and
benchmarks/gpu_hours.py both read them from here). Unit-level: no Snakemake."""

from __future__ import annotations

import pytest

from precswitch.errors import PrecswitchError
from precswitch.sweeps import expand, point_name, point_stages, swept_stages

SWITCH = {"precision": "amp_bf16", "switch_to": "fp32"}


def test_a_point_is_named_by_its_percent_to_six_significant_digits():
    """<name>-at<100 f>: 0.29 is at29 (29.000000000000004 before rounding), 0.125 at12.5, 1/3 at33.3333; 0 and 1
    are at0 and at100; points closer than the rounding get one name."""
    names = {0: "s-at0", 0.0: "s-at0", 1: "s-at100", 0.29: "s-at29", 0.57: "s-at57", 0.125: "s-at12.5",
             1 / 3: "s-at33.3333", 0.1234561: "s-at12.3456", 0.1234564: "s-at12.3456", 0.12345: "s-at12.345"}
    assert {f: point_name("s", f) for f in names} == names
    # the percent as a switched stage-1 run's name has it (aggregate.spec_name, common.smk): 6 decimals, then 6
    # significant digits, also for a tiny fraction
    from precswitch.analysis.aggregate import spec_name

    for f in (*names, 0.0000123456789, 0.999999, 0.5000004):
        assert point_name("s", f).removeprefix("s-at") == spec_name("a", "b", f).removeprefix("a-to-b-at"), f
    assert point_name("s", 0.0000123456789) == "s-at0.001235"


def test_each_point_runs_the_swept_stage_by_its_fraction_and_keeps_the_other_stage():
    """f = 1: the whole stage in `precision` (no switch); f = 0: the whole stage in `switch_to`; between: a switch
    at f. The stage not swept is the sweep's own (here itself a switch), unchanged."""
    pre = {**SWITCH, "switch_at": 0.5}
    sweep = {"pretrain": pre, "finetune": {"precision": "amp_fp16", "switch_to": "fp32"}, "switch_at": [0, 0.25, 1]}
    assert swept_stages(sweep) == ["finetune"]
    assert point_stages(sweep, "finetune", 1) == {"pretrain": pre, "finetune": "amp_fp16"}
    assert point_stages(sweep, "finetune", 0) == {"pretrain": pre, "finetune": "fp32"}
    assert point_stages(sweep, "finetune", 0.25) == {
        "pretrain": pre, "finetune": {"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 0.25}}
    assert expand({"s": sweep}) == {"s-at0": point_stages(sweep, "finetune", 0),
                                    "s-at25": point_stages(sweep, "finetune", 0.25),
                                    "s-at100": point_stages(sweep, "finetune", 1)}
    stage1 = {"pretrain": dict(SWITCH), "finetune": "fp32", "switch_at": [0.5]}  # a sweep of stage 1
    assert expand({"p": stage1}) == {"p-at50": {"pretrain": {**SWITCH, "switch_at": 0.5}, "finetune": "fp32"}}
    finetune_only = {"finetune": dict(SWITCH), "switch_at": [0.5]}  # no stage 1: none appears
    assert expand({"f": finetune_only}) == {"f-at50": {"finetune": {**SWITCH, "switch_at": 0.5}}}
    assert expand(None) == expand({}) == {}
    # a stage given as a mapping without switch_to is a plain stage, not a second swept one
    plain = {"pretrain": {"precision": "fp32"}, "finetune": dict(SWITCH), "switch_at": [0.5]}
    assert swept_stages(plain) == ["finetune"]
    assert expand({"q": plain}) == {"q-at50": {"pretrain": {"precision": "fp32"}, "finetune": {**SWITCH, "switch_at": 0.5}}}


@pytest.mark.parametrize("sweeps, schedules, msg", [
    ({"s": {"finetune": "fp32", "switch_at": [0.5]}}, None, "config key sweeps.s: exactly one stage must be swept"),
    ({"s": {"pretrain": dict(SWITCH), "finetune": dict(SWITCH), "switch_at": [0.5]}}, None,
     "config key sweeps.s: exactly one stage must be swept"),
    ({"s": {"finetune": dict(SWITCH), "switch_at": [0.5, 0.1234561, 0.1234564]}}, None,
     "config key sweeps.s.switch_at[2]: 0.1234564 and 0.1234561 give one schedule name, 's-at12.3456'; make them "
     "equal or further apart"),
    ({"s": {"finetune": dict(SWITCH), "switch_at": [0.5]}}, {"s-at50": {"finetune": "fp32"}},
     "config key sweeps.s: schedule 's-at50' (sweep point 0.5) is already a schedule; rename the sweep or the "
     "schedule"),
])
def test_what_the_workflow_refuses_is_refused_with_its_message(sweeps, schedules, msg):
    """As common.smk's expand_sweeps says it (test_workflow.py's audit4 and config checks): no swept stage was an
    IndexError, two swept stages silently swept the first, and points that round to one name or are named like a
    schedule silently replaced one another (benchmarks/gpu_hours.py then counted fewer jobs)."""
    with pytest.raises(PrecswitchError) as e:
        expand(sweeps, schedules)
    assert str(e.value).startswith(msg)
