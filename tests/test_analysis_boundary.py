"""Statistics at the boundary (issue 38): ties, one flipped example, constant shifts, the ceiling; the fixed and the
sequential path under the same rules; the held-out split, the positive control and the CPU provenance in the
verdict."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from precswitch.analysis.aggregate import aggregate
from precswitch.analysis.fakes import TWO_SCHEDULES, write_fake_study
from precswitch.analysis.paired import classify, describe_proportion, paired_contrast
from precswitch.analysis.sequential import decide
from precswitch.analysis.settings import load_settings
from precswitch.analysis.stats import compute
from precswitch.analysis.verdict import headline, render, _View
from precswitch.errors import PrecswitchError

STEP = 0.05  # points: one example of a 2,000-example eval set
SIG = ("better", "worse")
ALPHAS = (0.05, 0.05 / 3, 0.01)
FEW = settings(max_examples=20, deadline=None, derandomize=True)  # the same 20 examples on every run


def fixed(d, alpha=0.05, margin=1.0):
    """The fixed path's label and row for paired differences ``d`` in points (accuracies k/2000)."""
    b = np.full(len(d), 0.9)
    r = paired_contrast(b + np.asarray(d) / 100, b, scale=100.0, margin=margin, alpha=alpha, resolution=STEP,
                        with_power=False)
    r["p_holm"] = r["p_t"]
    return classify(r, alpha), r


def sequential(d, alpha=0.05, margin=1.0):
    """The sequential path's decision at its last look (no seeds left), the same data."""
    return decide(d, margin, alpha, max_seeds=len(d), resolution=STEP)


steps = st.lists(st.integers(-60, 60), min_size=2, max_size=12).map(lambda k: [STEP * x for x in k])


@FEW
@given(n=st.integers(2, 20), flip=st.sampled_from([-1, 1]), where=st.integers(0, 19), alpha=st.sampled_from(ALPHAS))
def test_ties_on_every_seed_are_identical_and_never_weaker_than_one_flip(n, flip, where, alpha):
    label, r = fixed([0.0] * n, alpha)
    assert label == "identical" and sequential([0.0] * n, alpha)["decision"] == "identical"
    assert r["ci_high"] - r["ci_low"] > 0  # an interval of honest width, never the point [0, 0]
    d = [0.0] * n
    d[where % n] = flip * STEP
    one, _ = fixed(d, alpha)
    assert one in ("equivalent", "inconclusive")  # one example is no evidence of a difference, nor identity


@FEW
@given(k=st.integers(-40, 40).filter(bool), n=st.integers(2, 12), where=st.integers(0, 11),
       flip=st.sampled_from([-1, 1]), alpha=st.sampled_from(ALPHAS))
def test_a_constant_shift_is_never_weaker_than_the_same_shift_with_one_seed_one_example_off(k, n, where, flip, alpha):
    const = [k * STEP] * n
    off = list(const)
    off[where % n] += flip * STEP
    lc, rc = fixed(const, alpha)
    lo, _ = fixed(off, alpha)
    assert rc["ci_high"] - rc["ci_low"] > 0
    if lo in SIG:
        assert lc == lo, (const, off)
    if lo == "equivalent":
        assert lc in ("equivalent", *SIG)


@FEW
@given(d=steps, alpha=st.sampled_from(ALPHAS))
def test_the_sequential_decision_never_says_more_than_the_fixed_label(d, alpha):
    label, r = fixed(d, alpha)
    seq = sequential(d, alpha)["decision"]
    assert (seq == "identical") == (label == "identical")
    if seq == "different":
        assert label == ("better" if np.mean(d) > 0 else "worse")
    if seq == "equivalent":
        assert label == "equivalent" or (label in SIG and -1 < r["ci_low"] and r["ci_high"] < 1)


def test_the_boundary_table():
    """benchmarks/boundary_labels.py's cases, as numbers: eight pairs of −0.05 are worse with an interval of width."""
    assert fixed([0, 0, 0])[0] == "identical"
    assert fixed([0.05, 0, 0])[0] == "equivalent"
    assert fixed([-2, -2, -2])[0] == fixed([-2, -2.05, -2])[0] == "worse"
    label, r = fixed([-0.05] * 8)
    assert label == "worse" and r["ci_low"] < -0.05 < r["ci_high"] < 0
    # without a known resolution a constant shift takes the smallest gap between the values as its step
    r = paired_contrast([0.93] * 3, [0.95] * 3, scale=100.0, margin=1.0)
    assert r["resolution"] == pytest.approx(2.0) and r["ci_high"] > r["ci_low"]


@FEW
@given(acc=st.lists(st.integers(1900, 2000), min_size=1, max_size=8))
def test_accuracy_intervals_stay_inside_0_and_100_and_a_ceiling_has_one(acc):
    x = np.array(acc) / 2000
    d = describe_proportion(x, 2000)
    for k in ("ci_low", "ci_high", "cp_low", "cp_high"):
        assert math.isnan(d[k]) or 0 <= d[k] <= 1, k
    assert d["cp_low"] < d["mean"] or d["mean"] == 0  # the pooled eval-set interval exists even at SD 0
    if len(set(acc)) == 1:
        assert math.isnan(d["ci_low"])  # no seed interval from equal values, not a point
    if all(a == 2000 for a in acc):
        assert d["cp_high"] == 1.0 and d["cp_low"] < 1.0


def _study(tmp_path, **kw):
    return aggregate(write_fake_study(tmp_path / "s", **kw), tmp_path / "t")


def test_the_test_split_is_reported_when_every_run_has_it_and_dev_is_caveated_otherwise(tmp_path):
    runs, sched = _study(tmp_path, schedules=TWO_SCHEDULES, seeds=range(1, 4), test_split=True)
    _, deltas, stats = compute(runs, sched, load_settings(bootstrap_resamples=0))
    assert (stats["split"], stats["accuracy_metric"]) == ("test", "test_accuracy")
    assert {"test_accuracy", "test_f1", "test_mcc"} <= set(deltas["metric"])
    v = _View(stats)
    header, rows, _ = headline(v)
    assert header[1].startswith("test accuracy")
    t = next(r for r in stats["deltas"] if r["metric"] == "test_accuracy" and r["a"] == "bf16-fp32")
    row = next(r for r in rows if r[0] == "`bf16-fp32` vs `fp32-fp32`")
    assert row[3] == str(t["n_pairs"]) and row[2] == t["classification"]
    assert "## Accuracy tests (test split)" in render(stats)
    sched.loc[sched.index[0], "test_accuracy"] = float("nan")
    _, _, dev = compute(runs, sched, load_settings(bootstrap_resamples=0))
    assert dev["split"] == "dev" and "Reported on the dev split" in render(dev)


def test_the_positive_control_is_detected_or_the_headline_says_the_study_cannot_answer(tmp_path):
    runs, sched = _study(tmp_path, seeds=range(1, 6), effects={"fp16-fp16": -6.0}, sd=0.5)
    _, _, stats = compute(runs, sched, load_settings(bootstrap_resamples=0, positive_control="fp16-fp16"))
    pc = stats["positive_control"]
    assert pc["detected"] and pc["classification"] == "worse" and pc["mean"] < -4
    assert 0 < pc["mde"] < 6 and (pc["alpha"], pc["power"]) == (0.05, 0.8)
    assert "not sensitive enough" not in render(stats) and "**detected**" in render(stats)
    # the control is tested alone (its raw p) and leaves the Holm family of the other comparisons as it was
    _, _, none = compute(runs, sched, load_settings(bootstrap_resamples=0))
    rows = {(r["a"], r["b"], r["family"]): r for r in stats["deltas"] if r["metric"] == pc["metric"]}
    base = {(r["a"], r["b"], r["family"]): r for r in none["deltas"] if r["metric"] == pc["metric"]}
    ctrl = rows[("fp16-fp16", "fp32-fp32", "vs_baseline")]
    assert ctrl["p_holm"] == ctrl["p_t"] < base[("fp16-fp16", "fp32-fp32", "vs_baseline")]["p_holm"]
    other = ("bf16-fp32", "fp32-fp32", "vs_baseline")
    assert rows[other]["p_holm"] <= base[other]["p_holm"]
    _, _, weak = compute(runs, sched, load_settings(bootstrap_resamples=0, positive_control="bf16-fp32"))
    assert weak["positive_control"]["detected"] is False
    text = render(weak)
    assert "**not detected**" in text and text.index("not sensitive enough") < text.index("## Accuracy tests")
    with pytest.raises(PrecswitchError, match="positive_control"):
        load_settings(positive_control="fp32-fp32")


def test_cpu_capabilities_are_shown_and_a_mixed_study_is_warned_about(tmp_path):
    runs, sched = _study(tmp_path, schedules=TWO_SCHEDULES, seeds=range(1, 4))
    stats = compute(runs, sched, load_settings(bootstrap_resamples=0))[2]
    assert "cpu capability" not in render(stats)  # metrics without the keys: nothing shown, nothing broken
    runs = runs.assign(cpu_capability=["AVX2" if i % 2 else "AVX512" for i in range(len(runs))],
                       onednn_max_cpu_isa=None, cpu_flags="avx2 avx512f avx512_bf16")
    stats = compute(runs, sched, load_settings(bootstrap_resamples=0))[2]
    assert stats["provenance"]["cpu_capability"] == ["AVX2", "AVX512"]
    text = render(stats)
    holds = text.split("## Holds for")[1]
    assert "| cpu capability | `AVX2`, `AVX512` |" in holds and "| cpu flags | `avx2 avx512f avx512_bf16` |" in holds
    assert "cpu_capability (AVX2, AVX512)" in text.split("## Caveats")[1]


def test_a_sequential_headline_shows_where_each_comparison_stopped(tmp_path):
    runs, sched = _study(tmp_path, seeds=range(1, 7))
    stats = compute(runs, sched, load_settings(bootstrap_resamples=0))[2]
    seq = {"comparisons": [{"a": "fp16-fp32", "b": "fp32-fp32", "decision": "different", "seeds": 5, "n": 5,
                            "mean": -1.5, "lo": -2.9, "hi": -0.1, "fixed_seeds": 8, "seeds_saved": 3,
                            "seconds_saved": 30.0}],
           "seeds_per_schedule": {"fp16-fp32": 5}, "train_seconds": 1.0, "fixed_seeds": 8,
           "fixed_train_seconds": 2.0, "max_seeds": 6, "max_train_seconds": 3.0, "alpha": 0.05, "margin": 1.0,
           "power": 0.8}
    header, rows, _ = headline(_View(stats, seq))
    row = next(r for r in rows if r[0].startswith("`fp16-fp32` vs `fp32-fp32`"))
    assert "confidence sequence" in header[1] and row[1:4] == ["−1.50 [−2.90, −0.10]", "worse", "5"]
