"""Activation telemetry: planted overflow found in the right layer; off means no hooks at all."""

from __future__ import annotations

import csv
import io
import json

import pytest
import torch
from torch import nn

from precswitch.telemetry import FP16_MAX, FP16_MIN_NORMAL, ROW_FIELDS, ActivationTelemetry


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.norm = nn.LayerNorm(16)
        self.big = nn.Linear(16, 16)
        self.out = nn.Linear(16, 2)

    def forward(self, x):
        return self.out(torch.relu(self.big(self.norm(self.inp(x)))))


def _model():
    torch.manual_seed(0)
    m = Tiny()
    with torch.no_grad():
        m.big.weight.mul_(1e5)  # planted: outputs of `big` reach ~1e5 > 65504
        m.out.weight.mul_(1e-3)  # ... and the next layer brings them back into range
    return m


def _total_hooks(m: nn.Module) -> int:
    return sum(len(mod._forward_hooks) for mod in m.modules())


def test_planted_overflow_is_reported_in_the_right_layer():
    m = _model()
    tel = ActivationTelemetry(m, every=2)
    for step in range(5):
        with tel.step(step):
            m(torch.randn(32, 8))
    s = tel.summary()
    assert s["steps_sampled"] == 3  # steps 0, 2, 4
    assert s["max_abs_layer"] == "big"
    assert s["layers"]["big"]["frac_overflow_fp16"] > 0
    assert s["layers_with_overflow"] == ["big"]
    assert s["layers"]["inp"]["frac_overflow_fp16"] == 0
    assert s["layers"]["norm"]["frac_overflow_fp16"] == 0
    assert s["max_abs"] > 65504 and s["frac_overflow_fp16"] > 0
    json.dumps(s)  # metrics.json-ready
    rows = tel.rows()
    assert {r["step"] for r in rows} == {0, 2, 4}
    assert {r["layer"] for r in rows} == {"inp", "norm", "big", "out"}
    assert set(rows[0]) == set(ROW_FIELDS)
    parsed = list(csv.DictReader(io.StringIO(tel.csv_text())))
    assert len(parsed) == 12 and list(parsed[0]) == ROW_FIELDS
    assert _total_hooks(m) == 0, "hooks are removed after each sampled step"


def test_underflow_fraction_counts_tiny_nonzero_values_exactly():
    lin = nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(4))
    tel = ActivationTelemetry(lin, every=1)
    x = torch.tensor([[0.0, FP16_MIN_NORMAL / 2, FP16_MIN_NORMAL, 70000.0]])
    with tel.step(0):
        lin(x)
    (row,) = tel.rows()
    assert row["frac_underflow_fp16"] == 0.25  # only the subnormal value; 0 and the smallest normal don't count
    assert row["frac_overflow_fp16"] == 0.25
    assert row["max_abs"] == 70000.0


def test_bf16_activations_classified_exactly():
    # 65536 is a bf16 value that overflows fp16; comparing in bf16 against 65504 (which rounds to 65536) would miss it
    lin = nn.Linear(2, 2, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(2))
    tel = ActivationTelemetry(lin, every=1)
    with tel.step(0):
        lin(torch.tensor([[65536.0, 65280.0]], dtype=torch.bfloat16))
    assert tel.rows()[0]["frac_overflow_fp16"] == 0.5


@pytest.mark.parametrize("every", [0, None])
def test_off_registers_nothing(every):
    m = _model()
    tel = ActivationTelemetry(m, every=every)
    assert not tel.enabled
    for step in range(3):
        ctx = tel.step(step)
        with ctx:
            assert _total_hooks(m) == 0
            m(torch.randn(2, 8))
    assert tel.rows() == [] and tel.summary()["steps_sampled"] == 0
    assert tel.summary()["max_abs"] is None and tel.summary()["modules_watched"] == 0


def test_hooks_only_on_sampled_steps():
    m = _model()
    tel = ActivationTelemetry(m, every=10)
    with tel.step(3):
        assert _total_hooks(m) == 0
    with tel.step(10):
        assert _total_hooks(m) == 4 and tel.hooks_registered == 4
    assert _total_hooks(m) == 0


def test_nonfinite_activations_reported():
    m = _model()
    with torch.no_grad():
        m.inp.weight[0, 0] = float("nan")
    tel = ActivationTelemetry(m, every=1)
    with tel.step(0):
        m(torch.ones(2, 8))
    s = tel.summary()
    assert s["max_abs"] is None  # NaN → null in JSON
    assert s["max_abs_layer"] == "inp"
    json.dumps(s)


def test_fp16_max_itself_is_not_an_overflow():
    """65504 is fp16's largest finite value: an activation of exactly 65504 fits (not counted, nor its layer
    listed); one just above it (65505, which fp16 rounds to 65504 but anything from 65520 on becomes inf) is an
    overflow by the documented rule |x| > 65504."""
    lin = nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(3))
    assert torch.isfinite(torch.tensor(FP16_MAX).half())
    tel = ActivationTelemetry(lin, every=1)
    with tel.step(0):
        lin(torch.tensor([[FP16_MAX, -FP16_MAX, 1.0]]))
    assert tel.rows()[0]["frac_overflow_fp16"] == 0 and tel.summary()["layers_with_overflow"] == []
    with tel.step(1):
        lin(torch.tensor([[65505.0, 1.0, 1.0]]))
    assert tel.rows()[1]["frac_overflow_fp16"] == pytest.approx(1 / 3)


def test_an_overflow_the_sample_misses_still_lists_its_layer():
    """Outputs above sample_limit are classified on a strided sample, but max_abs is exact: an overflowing value the
    sample skips (stride 5 over 12 values: positions 0, 5, 10) still puts its layer in layers_with_overflow."""
    lin = nn.Linear(12, 12, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(12))
    model = nn.Sequential(lin)
    tel = ActivationTelemetry(model, every=1, sample_limit=4)
    x = torch.ones(1, 12)
    x[0, 1] = 70000.0
    with tel.step(0):
        model(x)
    s = tel.summary()
    assert s["frac_overflow_fp16"] == 0  # not in the sample
    assert s["max_abs"] == 70000.0 and s["layers_with_overflow"] == ["0"]


def test_negative_activations_and_a_module_called_twice_count_in_full():
    """max_abs is the largest |x| (a -70000 output counts: fp16 overflows at either sign); a module called twice in
    one forward (shared weights) reports the max over both calls and fractions over all their values."""
    lin = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(2))

    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, a, b):
            return self.lin(a), self.lin(b)

    model = Twice()
    tel = ActivationTelemetry(model, every=1)
    with tel.step(0):
        model(torch.tensor([[-70000.0, 1.0]]), torch.tensor([[1e-6, 2.0]]))
    (row,) = tel.rows()
    assert row["layer"] == "lin" and row["max_abs"] == 70000.0
    assert row["frac_overflow_fp16"] == 0.25 and row["frac_underflow_fp16"] == 0.25  # 1 of 4 values each


@pytest.mark.parametrize("every", [-1, True, False, 2.0, "10"])
def test_every_must_be_a_real_integer(every):
    """every=True is not "every step" (nor False "off"): a bool, float or string is refused like a negative."""
    with pytest.raises(ValueError, match="non-negative integer or None"):
        ActivationTelemetry(nn.Linear(2, 2), every=every)


def test_an_empty_output_is_left_out_not_a_crash():
    """A module that scores no rows on a step (a masked-LM head on a batch without a masked token) gives an empty
    output: it is left out of that step (no row, no NaN fraction), the other modules are recorded as usual."""
    model = nn.ModuleDict({"body": nn.Linear(4, 4), "head": nn.Linear(4, 3)})
    tel = ActivationTelemetry(model, every=1)
    with tel.step(0):
        h = model["body"](torch.ones(2, 4))
        model["head"](h[torch.zeros(2, dtype=torch.bool)])  # no row selected
    assert [r["layer"] for r in tel.rows()] == ["body"]
    s = tel.summary()
    assert set(s["layers"]) == {"body"} and s["steps_sampled"] == 1 and s["frac_overflow_fp16"] == 0


def test_infinite_activations_are_inf_in_the_summary_and_an_overflow():
    """An output that already overflowed (inf, as fp16 autocast produces): max_abs is inf in the rows and the string
    "inf" in the JSON summary (not null, which means NaN), its layer is listed, the infs count as overflow."""
    lin = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        lin.weight.fill_(1.0)
    tel = ActivationTelemetry(nn.Sequential(lin), every=1)
    with tel.step(0):
        tel.model(torch.tensor([[float("-inf")], [1.0]]))
    assert tel.rows()[0]["max_abs"] == float("inf") and tel.rows()[0]["frac_overflow_fp16"] == 0.5
    s = json.loads(json.dumps(tel.summary()))
    assert s["max_abs"] == "inf" and s["layers"]["0"]["max_abs"] == "inf" and s["max_abs_layer"] == "0"
    assert s["layers_with_overflow"] == ["0"]


def test_summary_fractions_are_over_every_value_seen_per_layer_and_overall():
    """Two sampled steps, two layers: each layer's overflow and underflow fractions are its counts over all its
    values on both steps, and the overall ones all counts over all values (not a mean of per-layer or per-step
    fractions); the row fractions are per step."""
    lin = nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(4))
    model = nn.Sequential(lin, nn.Linear(4, 2))
    tel = ActivationTelemetry(model, every=1)
    with torch.no_grad():
        model[1].weight.zero_()
        model[1].bias.fill_(1.0)
    with tel.step(0):
        model(torch.tensor([[70000.0, 1e-6, 1.0, 1.0]]))  # layer 0: 1 over, 1 under of 4
    with tel.step(1):
        model(torch.tensor([[1e-6, 1e-6, 1e-6, 1.0], [1.0, 1.0, 1.0, 1.0]]))  # layer 0: 0 over, 3 under of 8
    rows = {(r["step"], r["layer"]): r for r in tel.rows()}
    assert (rows[0, "0"]["frac_overflow_fp16"], rows[0, "0"]["frac_underflow_fp16"]) == (0.25, 0.25)
    assert (rows[1, "0"]["frac_overflow_fp16"], rows[1, "0"]["frac_underflow_fp16"]) == (0.0, 3 / 8)
    s = tel.summary()
    assert s["layers"]["0"] == {"max_abs": 70000.0, "frac_overflow_fp16": 1 / 12, "frac_underflow_fp16": 4 / 12}
    assert s["layers"]["1"]["frac_underflow_fp16"] == 0.0 and s["layers"]["1"]["max_abs"] == 1.0
    # layer 1 saw 2 + 4 values, none over or under
    assert (s["frac_overflow_fp16"], s["frac_underflow_fp16"]) == (1 / 18, 4 / 18)


def test_resumed_summary_covers_the_steps_before_the_resume():
    """A run resumed after step 1 reports the summary of all its steps: a step-0 overflow that later steps do not
    repeat is still in max_abs, the fractions and layers_with_overflow."""
    lin = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(2))
    inputs = [torch.tensor([[70000.0, 1.0]]), torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 1.0]])]

    def run(tel, steps):
        for step in steps:
            with tel.step(step):
                lin(inputs[step])
        return tel

    full = run(ActivationTelemetry(lin, every=1), range(3))
    resumed = ActivationTelemetry(lin, every=1)
    resumed.load_state_dict(run(ActivationTelemetry(lin, every=1), range(1)).state_dict())
    run(resumed, range(1, 3))
    assert resumed.summary() == full.summary() and resumed.rows() == full.rows()
    assert full.summary()["max_abs"] == 70000.0 and full.summary()["layers_with_overflow"] == [""]


def test_a_watched_module_returning_a_tuple_is_measured_on_its_first_output():
    """module_types may name modules that return a tuple (hidden states first, as transformers' layers do): the
    first element is measured, not the module skipped."""

    class Pair(nn.Module):
        def forward(self, x):
            return x * 2, None

    model = nn.Sequential(Pair())
    tel = ActivationTelemetry(model, every=1, module_types=(Pair,))
    with tel.step(0):
        model(torch.tensor([40000.0, 1.0]))
    (row,) = tel.rows()
    assert row["layer"] == "0" and row["max_abs"] == 80000.0 and row["frac_overflow_fp16"] == 0.5


# ---------------------------------------------------------------------- mutation audit 5 (precision)
def test_an_inf_that_spreads_is_attributed_to_the_first_layer_it_appears_in():
    """An overflow (inf) in the first layer carried through the next: both report max_abs inf; max_abs_layer names
    the first one (where it arose, in module order), not the last that merely passed it on."""
    a, b = nn.Linear(1, 1), nn.Linear(1, 1)
    with torch.no_grad():
        a.weight.fill_(1e38)
        b.weight.fill_(1.0)
        a.bias.zero_()
        b.bias.zero_()
    tel = ActivationTelemetry(nn.Sequential(a, b), every=1)
    with tel.step(0):
        tel.model(torch.tensor([[1e3]]))  # 1e41: inf in fp32, and inf * 1 + 0 in the next layer
    assert [r["max_abs"] for r in tel.rows()] == [float("inf")] * 2
    assert tel.summary()["max_abs_layer"] == "0"


def test_a_sampled_forward_that_raises_leaves_no_hooks_behind():
    """A sampled step whose forward raises (an OOM, a bad batch) gets its hooks removed all the same: the error
    propagates, and the following unsampled steps run with no hook and record nothing."""
    m = _model()
    tel = ActivationTelemetry(m, every=2)
    with pytest.raises(RuntimeError, match="bad batch"):
        with tel.step(0):
            m(torch.randn(2, 8))
            raise RuntimeError("bad batch")
    assert _total_hooks(m) == 0 and tel.hooks_registered == 0
    rows = len(tel.rows())
    with tel.step(1):
        m(torch.randn(2, 8))
    assert len(tel.rows()) == rows


def test_the_sample_stride_is_coprime_with_the_feature_dimension_not_the_batch():
    """A (1001 x 16) output sampled to ~1001 values: a stride of 16 would read feature 0 only (and miss an outlier
    feature); the stride is made coprime with the last (feature) dimension, so feature 4's share is ~1/16."""
    lin = nn.Linear(16, 16, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(16))
        lin.weight[4, 4] = 1e5
    tel = ActivationTelemetry(lin, every=1, sample_limit=1001)
    with tel.step(0):
        lin(torch.ones(1001, 16))
    (row,) = tel.rows()
    assert row["max_abs"] == 1e5 and abs(row["frac_overflow_fp16"] - 1 / 16) < 0.01
