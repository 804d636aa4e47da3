"""Statistics, second mutation audit: the semantics a reviewer of the paper would check, each against an
independent computation (scipy/statsmodels on hand-built numbers, the exact power, a simulation)."""

import math

import numpy as np
import pytest
from scipy import stats as st

from precswitch.analysis.paired import paired_t_power, power_analysis


# ---------------------------------------------------------------------------- power / seeds needed
@pytest.mark.parametrize("sd, alpha, want", [(0.2503, 0.0125, 4), (0.1184, 0.0125, 3), (0.12, 0.0125, 3),
                                             (0.2279, 0.05 / 3, 4), (0.1427, 0.01, 4), (0.21, 0.05, 3)])
def test_seeds_needed_is_the_fewest_pairs_reaching_the_power_when_the_sd_is_small(sd, alpha, want):
    """'about N paired seeds would detect a 1-point difference with 80% power after Holm': with a paired SD far
    below the margin and a Holm-divided alpha, statsmodels' power is NaN at few pairs and the scan replaced it
    by the power at half the effect, a loose lower bound: 7 seeds were asked for where 4 have 90% power."""
    n = power_analysis(sd, 5, alpha, 0.8, 1.0)["seeds_needed"]
    assert n == want
    assert paired_t_power(1 / sd, want, alpha) >= 0.8 > paired_t_power(1 / sd, want - 1, alpha)


def test_seeds_needed_has_the_claimed_power_by_simulation():
    rng = np.random.default_rng(3)
    sd, alpha = 0.2503, 0.0125
    n = int(power_analysis(sd, 5, alpha, 0.8, 1.0)["seeds_needed"])
    hit = [float((st.ttest_1samp(rng.normal(1.0, sd, size=(100_000, k)), 0.0, axis=1).pvalue < alpha).mean())
           for k in (n - 1, n)]
    assert hit[0] < 0.8 <= hit[1]  # n pairs reach 80% power, n − 1 do not (0.46 and 0.90 at 3 and 4)


def test_seeds_needed_never_falls_as_the_paired_sd_grows():
    for alpha in (0.05, 0.025, 0.0125):
        ns = [power_analysis(float(sd), 5, alpha, 0.8, 1.0)["seeds_needed"] for sd in np.geomspace(0.02, 1.5, 40)]
        assert all(a <= b for a, b in zip(ns, ns[1:])), (alpha, ns)


# ---------------------------------------------------------------------------- paired_contrast edge cases
from precswitch.analysis.paired import _sign_seeds, classify, paired_contrast, within_margin  # noqa: E402
from precswitch.analysis.settings import load_settings  # noqa: E402
from precswitch.analysis.stats import compute, loss_negligible, mark_outcomes  # noqa: E402


def test_identical_values_have_p_1_in_both_tests_not_the_sign_tests_p():
    """No difference at all in any seed: the t-test and the Wilcoxon test have nothing against the null (p 1),
    not the sign test's 2 · 0.5^n (0.03 at 6 seeds, which reads as significant) nor a missing p."""
    x = [80.0, 75.0, 70.0, 82.0, 79.0, 77.0]
    r = paired_contrast(x, x, margin=1.0)
    assert r["p_t"] == 1.0 and r["p_wilcoxon"] == 1.0 and r["mean"] == 0.0
    r = paired_contrast(x, x, kind="ratio")
    assert r["p_t"] == 1.0 and r["p_wilcoxon"] == 1.0 and r["mean"] == 1.0


def test_a_small_but_real_spread_goes_through_the_t_test():
    """Only a spread at rounding level (1e-9 of the largest difference) counts as 'all differences equal': a paired
    SD of 0.01 point on a 10-point difference is a measurement, tested by the t-test (p from scipy), not the sign
    test."""
    b = np.array([70.0, 75.0, 80.0])
    a = b + np.array([10.0, 10.01, 9.99])
    r = paired_contrast(a, b, margin=1.0)
    assert r["sd"] == pytest.approx(0.01)
    assert r["p_t"] == pytest.approx(st.ttest_rel(a, b).pvalue)
    assert r["p_t"] < 1e-4 and math.isfinite(r["ci_low"])


def test_wilcoxon_drops_zero_differences_as_scipy_does_by_default():
    """scipy.stats.wilcoxon's default (zero_method 'wilcox'): zero differences are left out, the rest ranked."""
    b = np.array([80.0, 75.0, 70.0, 82.0, 79.0, 77.0, 74.0, 71.0, 78.0])
    d = np.array([0.0, 1.0, 2.0, -0.5, 3.0, 1.5, 2.5, -0.25, 4.0])  # one zero (Pratt or zsplit: p 0.047)
    r = paired_contrast(b + d, b, margin=1.0)
    assert r["p_wilcoxon"] == pytest.approx(st.wilcoxon(d).pvalue)
    assert r["p_wilcoxon"] == pytest.approx(st.wilcoxon(d[d != 0]).pvalue) == pytest.approx(5 / 128)


def test_equal_differences_exactly_at_the_margin_are_not_inside_it():
    """The margin is an open band: every pair 1.0 point apart with margin 1.0 is not 'inside ±1 point'."""
    b = np.array([80.0, 75.0, 70.0, 82.0, 79.0, 77.0])
    r = paired_contrast(b + 1.0, b, margin=1.0)
    assert r["tost_p"] == 1.0
    r["p_holm"] = 1.0
    assert classify(r, 0.05) == "inconclusive"


def test_one_pair_of_a_ratio_is_reported_as_a_ratio():
    """n = 1: no test, but the point estimate is A/B (not its logarithm), like every other ratio row."""
    r = paired_contrast([30.0], [60.0], kind="ratio")
    assert r["n_pairs"] == 1 and r["mean"] == pytest.approx(0.5) and math.isnan(r["p_t"])
    r["p_holm"] = math.nan
    assert classify(r, 0.05, higher_is_better=False) == "insufficient data"


def test_bootstrap_of_fractions_is_in_points_like_the_t_interval():
    rng = np.random.default_rng(5)
    b = rng.uniform(0.7, 0.9, 9)
    a = b + rng.normal(0.005, 0.004, 9)
    r = paired_contrast(a, b, scale=100.0, margin=1.0, n_boot=500, seed=1)
    want = st.bootstrap(((a - b) * 100,), np.mean, n_resamples=500, confidence_level=0.95, method="BCa",
                        rng=np.random.default_rng(1)).confidence_interval
    assert (r["boot_low"], r["boot_high"]) == pytest.approx((want.low, want.high), rel=1e-9)
    assert r["ci_low"] < r["boot_high"] and r["boot_low"] < r["ci_high"]  # the same units


def test_bootstrap_of_equal_differences_is_the_point():
    """From 8 pairs on a bootstrap interval is given; every resample of 8 equal differences has that mean, so the
    interval is the point (BCa itself fails on a constant sample), not missing."""
    b = np.arange(70.0, 78.0)
    r = paired_contrast(b + 0.5, b, margin=1.0, n_boot=200)
    assert r["boot_low"] == r["boot_high"] == 0.5


def test_sign_test_minimum_is_strictly_below_alpha():
    # two-sided sign test, all n one way: p = 2 · 0.5^n; 4 pairs give exactly 0.125, not below alpha 0.125
    assert _sign_seeds(0.125, "two-sided") == 5
    assert _sign_seeds(0.0625, "two-sided") == 6
    assert _sign_seeds(0.05, "two-sided") == 6


# ---------------------------------------------------------------------------- classification boundaries
def _row(**kw):
    r = {"kind": "difference", "n_pairs": 6, "mean": 0.2, "ci_low": -0.5, "ci_high": 0.9, "p_t": 0.5,
         "p_holm": 0.5, "margin": 1.0, "tost_p": 0.01}
    r.update(kw)
    return r


def test_significance_is_p_strictly_below_alpha():
    row = _row(mean=1.5, ci_low=0.4, ci_high=2.6, p_holm=0.05, tost_p=0.6)
    assert classify(row, 0.05) == "inconclusive"
    assert classify({**row, "p_holm": 0.0499}, 0.05) == "better"


def test_equivalence_needs_the_ci_strictly_inside_the_margin():
    assert classify(_row(), 0.05) == "equivalent" and within_margin(_row())
    for lo, hi in ((-1.0, 0.9), (-0.5, 1.0)):
        r = _row(ci_low=lo, ci_high=hi)
        assert classify(r, 0.05) == "inconclusive" and not within_margin(r), (lo, hi)
    # a CI that excludes 0 but lies inside the margin is still inside it
    assert within_margin(_row(mean=0.5, ci_low=0.2, ci_high=0.8))


def test_one_pair_is_insufficient_data_not_inconclusive():
    r = paired_contrast([81.0], [80.0], margin=1.0)
    r["p_holm"] = math.nan
    assert r["n_pairs"] == 1 and classify(r, 0.05) == "insufficient data"


# ---------------------------------------------------------------------------- loss negligible
def test_loss_negligible_needs_the_whole_ci_not_the_mean():
    # base loss 2 nats: ±0.002 nats. The mean (0.0005) is inside, the CI's upper end (0.003) is not
    assert not loss_negligible(-0.002 + 0.0001, 0.003, 2.0)
    assert loss_negligible(-0.0019, 0.0019, 2.0)
    assert not loss_negligible(-0.0019, 0.0019, 0.0)


# ---------------------------------------------------------------------------- outcomes
def _sched_rows(rows):
    import pandas as pd

    return pd.DataFrame(rows, columns=["status", "accuracy", "majority_accuracy"])


def test_outcomes_degenerate_at_the_majority_and_missing_status_is_ok():
    df = mark_outcomes(_sched_rows([
        ("ok", 0.55, 0.55),          # exactly the majority class: learnt nothing
        ("ok", 0.56, 0.55),          # above it
        (None, 0.80, 0.55),          # no status recorded: a finished run
        ("ok", float("nan"), 0.55),  # no accuracy
        ("diverged", 0.80, 0.55),
        ("oom", 0.80, 0.55),         # an unknown status is failed under its own name
    ]))
    assert list(df["outcome"]) == ["degenerate", "ok", "ok", "no_eval", "diverged", "oom"]
    assert list(df["used"]) == [True, True, True, False, False, False]


# ---------------------------------------------------------------------------- whole-study semantics
@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from precswitch.analysis.aggregate import aggregate
    from precswitch.analysis.fakes import write_fake_study

    root = tmp_path_factory.mktemp("sem")
    paths = write_fake_study(root / "s", seeds=range(1, 7), effects={"fp16-fp16": -1.0}, sd=0.7, rng_seed=2)
    return aggregate(paths, root / "t")


S0 = {"bootstrap_resamples": 0}


def _get(deltas, a, b="fp32-fp32", family="vs_baseline", metric="accuracy"):
    r = deltas[(deltas["family"] == family) & (deltas["a"] == a) & (deltas["b"] == b) & (deltas["metric"] == metric)]
    assert len(r) == 1, (family, a, b, metric)
    return r.iloc[0]


def _holm(ps):
    """Holm's adjustment by statsmodels (test_analysis_stats.py checks stats.holm against it written out)."""
    from statsmodels.stats.multitest import multipletests

    return list(multipletests(ps, method="holm")[1])


def test_schedule_tables_sum_times_and_take_the_larger_memory(study):
    _, sched = study
    assert np.allclose(sched["total_train_seconds"], sched["stage1_train_seconds"] + sched["stage2_train_seconds"])
    assert np.allclose(sched["peak_memory_bytes"],
                       np.maximum(sched["stage1_peak_memory_bytes"], sched["stage2_peak_memory_bytes"]))


def test_a_named_contrast_given_the_other_way_round_is_one_holm_slot(study):
    """'fp32-fp32 vs fp16-fp32' is the comparison 'fp16-fp32 vs fp32-fp32' (vs baseline): one p in a family of
    the 3 distinct comparisons, and the two rows mirror each other."""
    runs, sched = study
    _, deltas, _ = compute(runs, sched, load_settings(contrasts=[["fp32-fp32", "fp16-fp32"]], **S0))
    vb = deltas[(deltas["family"] == "vs_baseline") & (deltas["metric"] == "accuracy")]
    named = _get(deltas, "fp32-fp32", "fp16-fp32", family="named")
    fwd = _get(deltas, "fp16-fp32")
    assert len(vb) == 3
    assert list(vb["p_holm"]) == pytest.approx(_holm(list(vb["p_t"])))
    assert named["p_holm"] == pytest.approx(fwd["p_holm"]) and named["mean"] == pytest.approx(-fwd["mean"])
    assert (named["ci_low"], named["ci_high"]) == pytest.approx((-fwd["ci_high"], -fwd["ci_low"]))


def test_a_comparison_without_a_p_is_not_in_the_holm_family_nor_the_power(study):
    """fp16-fp16 with one used seed: its two comparisons have no p; the family (and alpha / m for the power) is
    the 2 comparisons that have one."""
    from precswitch.analysis.paired import power_analysis

    runs, sched = study
    sched = sched.copy()
    sched.loc[(sched["schedule"] == "fp16-fp16") & (sched["seed"] > 1), "status"] = "diverged"
    _, deltas, st_ = compute(runs, sched, load_settings(**S0))
    assert st_["schedules"]["fp16-fp16"]["n_failed"] == 5
    r = _get(deltas, "fp16-fp32")
    other = _get(deltas, "bf16-fp32")
    assert math.isnan(_get(deltas, "fp16-fp16")["p_t"])
    assert [r["p_holm"], other["p_holm"]] == pytest.approx(_holm([r["p_t"], other["p_t"]]))
    want = power_analysis(r["sd"], r["n_pairs"], 0.05 / 2, 0.8, 1.0)
    assert r["seeds_needed"] == want["seeds_needed"] and r["mde"] == pytest.approx(want["mde"])


def test_a_ratio_with_a_zero_leaves_that_seed_out_and_lists_the_rest(study):
    runs, sched = study
    sched = sched.copy()
    sched.loc[(sched["schedule"] == "bf16-fp32") & (sched["seed"] == 4), "stage2_train_seconds"] = 0.0
    _, deltas, _ = compute(runs, sched, load_settings(**S0))
    r = _get(deltas, "bf16-fp32", metric="stage2_train_seconds")
    assert r["n_pairs"] == 5 and r["seeds"] == "1 2 3 5 6"


def test_failed_rows_are_counted_and_their_counters_summed_but_not_their_accuracy(study):
    """No finite accuracy counts as failed (no_eval); a failed row's accuracy is not in the schedule's mean; its
    skipped steps (the cause) are in the counter's sum."""
    runs, sched = study
    sched = sched.copy()
    s = sched["schedule"] == "fp16-fp32"
    sched.loc[s & (sched["seed"] == 2), "accuracy"] = np.nan
    sched.loc[s & (sched["seed"] == 3), ["status", "accuracy", "skipped_steps"]] = ["diverged", 0.99, 40.0]
    summary, _, st_ = compute(runs, sched, load_settings(**S0))
    i = st_["schedules"]["fp16-fp32"]
    assert (i["n_failed"], i["n_diverged"], i["n_used"]) == (2, 1, 4)
    assert {f["outcome"] for f in i["failed"]} == {"no_eval", "diverged"}
    used = sched[s & ~sched["seed"].isin([2, 3])]["accuracy"] * 100
    assert i["accuracy_points"]["n"] == 4 and i["accuracy_points"]["mean"] == pytest.approx(used.mean())
    row = summary[(summary["level"] == "schedule") & (summary["group"] == "fp16-fp32")
                  & (summary["metric"] == "skipped_steps")].iloc[0]
    assert row["sum"] == pytest.approx(sched[s]["skipped_steps"].sum()) and row["sum"] >= 40


def test_a_skipped_stage1_run_is_left_out_of_the_stage1_comparisons(study):
    runs, sched = study
    runs = runs.copy()
    sel = (runs["stage"] == "pretrain") & (runs["precision"] == "amp_bf16") & (runs["seed"] == 5)
    runs.loc[sel, "status"] = "skipped"
    _, deltas, st_ = compute(runs, sched, load_settings(**S0))
    r = _get(deltas, "amp_bf16", "fp32", family="stage1", metric="train_seconds")
    assert r["n_pairs"] == 5 and "5" not in r["seeds"].split()
    assert st_["stage1_precisions"]["amp_bf16"]["n_skipped"] == 1


def test_schedule_stage1_rows_take_the_stage1_rows_power_with_its_p(study):
    """A schedule row of a stage-1 metric takes the stage-1 row's Holm p; its power figures are then those of the
    same (stage-1) family, not the schedule family's."""
    runs, sched = study
    _, deltas, _ = compute(runs, sched, load_settings(**S0))
    r = _get(deltas, "bf16-fp32", metric="stage1_eval_loss")
    s1 = _get(deltas, "amp_bf16", "fp32", family="stage1", metric="eval_loss")
    assert r["p_holm"] == pytest.approx(s1["p_holm"])
    assert math.isfinite(s1["mde"]) and r["mde"] == pytest.approx(s1["mde"])  # (no margin for a loss: no seeds_needed)


def test_a_schedule_whose_stage2_failed_keeps_its_own_family_for_stage1_metrics(study):
    """bf16-fp32 seed 2's fine-tuning diverged: its stage-1 time pairs 5 seeds, the stage-1 row 6, so they are
    not the same comparison and the schedule row keeps the schedule family's Holm p."""
    runs, sched = study
    sched = sched.copy()
    sched.loc[(sched["schedule"] == "bf16-fp32") & (sched["seed"] == 2), "status"] = "diverged"
    _, deltas, _ = compute(runs, sched, load_settings(**S0))
    r = _get(deltas, "bf16-fp32", metric="stage1_train_seconds")
    s1 = _get(deltas, "amp_bf16", "fp32", family="stage1", metric="train_seconds")
    assert r["n_pairs"] == 5 and s1["n_pairs"] == 6
    fam = deltas[deltas["family"].isin(["vs_baseline", "named"]) & (deltas["metric"] == "stage1_train_seconds")]
    fam = fam.assign(k=[frozenset((a, b)) for a, b in zip(fam["a"], fam["b"])]).drop_duplicates("k")
    # the rows that share the stage-1 row's p are the other schedules'; this one is adjusted in its own family
    want = dict(zip(fam["a"] + "|" + fam["b"], _holm(list(fam["p_t"]))))
    assert r["p_holm"] == pytest.approx(want["bf16-fp32|fp32-fp32"])
    assert r["p_holm"] != pytest.approx(s1["p_holm"])


# ---------------------------------------------------------------------------- equivalence seeds, describe
def test_seeds_for_equivalence_are_the_t_intervals_fewest_pairs():
    """Smallest n with t(1 − alpha/2, n − 1) · SD / √n < margin − |mean|: at mean 0, SD 2, margin 1, 18 pairs
    (17 give a half-width of 1.03 points, 18 give 0.99)."""
    b = np.array([80.0, 75.0, 70.0, 82.0])
    d = np.array([-2.0, 2.0, 2.0, -2.0]) * math.sqrt(3) / 2  # mean 0, sample SD 2
    r = paired_contrast(b + d, b, margin=1.0)
    assert r["mean"] == pytest.approx(0.0, abs=1e-12) and r["sd"] == pytest.approx(2.0)
    want = next(n for n in range(2, 1000) if st.t.ppf(0.975, n - 1) * 2.0 / math.sqrt(n) < 1.0)
    assert r["seeds_needed_equivalence"] == want == 18


# ---------------------------------------------------------------------------- mutation audit 4
def test_describe_of_equal_values_gives_the_sign_tests_interval_only_from_its_minimum():
    """n equal values (a schedule whose accuracy is the same k/N on every seed): no t interval; [v, v] covers with
    probability 1 − 2 · 0.5^n, so a (1 − alpha) interval exists from 6 values at alpha 0.05 (5 at alpha 0.1, where
    2 · 0.5^5 = 0.0625 < 0.1), none below: a point read as 'the mean is exactly v' from 3 seeds."""
    from precswitch.analysis.paired import describe

    for n, alpha, point in ((5, 0.05, False), (6, 0.05, True), (4, 0.1, False), (5, 0.1, True), (2, 0.05, False)):
        d = describe([0.75] * n, alpha)
        assert d["n"] == n and d["mean"] == 0.75 and d["std"] == 0.0 and d["min"] == d["max"] == 0.75, (n, alpha)
        if point:
            assert d["ci_low"] == d["ci_high"] == 0.75, (n, alpha)
        else:
            assert math.isnan(d["ci_low"]) and math.isnan(d["ci_high"]), (n, alpha)
    one = describe([0.75, float("nan")])  # one finite value: a mean, no SD, no interval
    assert one["n"] == 1 and one["mean"] == 0.75 and math.isnan(one["std"]) and math.isnan(one["ci_low"])


def test_no_seeds_for_equivalence_when_the_mean_sits_exactly_on_the_margin():
    """|mean| = margin: no CI, however narrow, fits inside the open band (analysis.md: none when |mean| ≥ margin),
    so the count is missing, not infinite (which reads as 'more seeds than any study could run')."""
    b = np.array([80.0, 75.0, 70.0])
    for d in (np.array([0.5, 1.5, 1.0]), -np.array([0.5, 1.5, 1.0])):  # mean exactly ±1.0, SD 0.5
        r = paired_contrast(b + d, b, margin=1.0)
        assert abs(r["mean"]) == 1.0 and r["sd"] == pytest.approx(0.5)
        assert math.isnan(r["seeds_needed_equivalence"])
    near = paired_contrast(b + np.array([0.49, 1.49, 0.99]), b, margin=1.0)  # mean 0.99: reachable, if far off
    assert math.isfinite(near["seeds_needed_equivalence"]) and near["seeds_needed_equivalence"] > 1000


def test_a_ratio_row_has_no_power_figures_nor_equivalence_test():
    """Time, throughput and memory have no margin (analysis.md): their rows carry no TOST p, no detectable
    difference and no seed counts; an mde on the log scale would read as a ratio."""
    a = np.array([50.0, 90.0, 60.0, 40.0, 70.0])
    b = np.array([100.0, 100.0, 50.0, 80.0, 75.0])
    r = paired_contrast(a, b, kind="ratio", margin=None)
    assert r["kind"] == "ratio" and math.isfinite(r["p_t"])
    for k in ("tost_p", "mde", "seeds_needed", "seeds_needed_equivalence", "margin"):
        assert math.isnan(r[k]), k


@pytest.mark.parametrize("alpha", [0.01, 0.2])
def test_three_and_ten_pairs_match_the_two_sided_t_test_at_any_alpha(alpha):
    """n = 3 by hand (d = +1, −0.5, +2.5: mean 1, SD 1.5) and n = 10 against scipy, at alpha 0.01 (99% interval) and
    0.2 (80%): the interval is mean ± t(1 − alpha/2, n − 1) · SD/√n, p the two-sided paired t-test's (not half of
    it), TOST the larger one-sided p against ±margin (statsmodels' ttost_paired), Wilcoxon the exact signed-rank p."""
    from statsmodels.stats.weightstats import ttost_paired

    a, b = np.array([81.0, 78.5, 83.0]), np.array([80.0, 79.0, 80.5])
    r = paired_contrast(a, b, margin=2.0, alpha=alpha)
    half = st.t.ppf(1 - alpha / 2, 2) * 1.5 / math.sqrt(3)
    assert (r["mean"], r["sd"], r["n_pairs"]) == pytest.approx((1.0, 1.5, 3))
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((1.0 - half, 1.0 + half))
    assert r["p_t"] == pytest.approx(2 * st.t.sf(1.0 / (1.5 / math.sqrt(3)), 2)) == pytest.approx(0.36754, abs=1e-5)
    assert r["tost_p"] == pytest.approx(ttost_paired(a, b, -2.0, 2.0)[0]) == pytest.approx(st.t.sf(1 / (1.5 / math.sqrt(3)), 2))
    assert r["p_wilcoxon"] == pytest.approx(0.5)  # ranks 2, 1, 3 with the 1 negative: 2 · P(W− ≤ 1) = 2 · 2/8
    rng = np.random.default_rng(21)
    b10 = rng.normal(80, 2, 10)
    a10 = b10 + rng.normal(0.8, 1.0, 10)
    r = paired_contrast(a10, b10, margin=1.0, alpha=alpha)
    tt = st.ttest_rel(a10, b10)
    ci = tt.confidence_interval(1 - alpha)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((ci.low, ci.high)) and r["p_t"] == pytest.approx(tt.pvalue)
    assert r["p_wilcoxon"] == pytest.approx(st.wilcoxon(a10 - b10).pvalue)
    assert r["tost_p"] == pytest.approx(ttost_paired(a10, b10, -1.0, 1.0)[0])
    # time ratios: the same t machinery on log(A/B), the interval reported back as ratios
    t = paired_contrast(np.exp(a / 50), np.exp(b / 50), kind="ratio", alpha=alpha)
    assert (t["mean"], t["ci_low"], t["ci_high"]) == pytest.approx(
        (math.exp(1 / 50), math.exp((1 - half) / 50), math.exp((1 + half) / 50)))
    assert t["p_t"] == pytest.approx(0.36754, abs=1e-5) and t["sd"] == pytest.approx(1.5 / 50)


def test_holm_is_capped_at_1_monotone_in_the_raw_p_and_ignores_missing_ones():
    """Holm's step-down: the i-th smallest of m p-values × (m − i + 1), running maximum, at most 1; a comparison
    without a p (NaN) is not one of the m."""
    from statsmodels.stats.multitest import multipletests

    from precswitch.analysis.paired import holm

    ps = [0.5, 0.01, 0.6, 0.02]
    got = holm(ps)
    assert got == pytest.approx([1.0, 0.04, 1.0, 0.06])
    assert got == pytest.approx(list(multipletests(ps, method="holm")[1]))
    order = np.argsort(ps)
    assert all(got[i] <= got[j] for i, j in zip(order, order[1:]))  # a smaller raw p never gets a larger adjusted one
    assert max(holm([0.9, 0.95, 0.99])) == 1.0
    with_nan = holm([0.5, float("nan"), 0.01, 0.6, 0.02])
    assert math.isnan(with_nan[1]) and [with_nan[i] for i in (0, 2, 3, 4)] == pytest.approx(got)
    assert holm([0.03], alpha=0.01) == [0.03]  # one comparison: unchanged, whatever alpha


def test_classify_direction_of_a_metric_without_one_and_of_ratios():
    """A metric with no better direction (higher_is_better None) is called higher/lower; a ratio's null is ×1, so a
    time ratio of 0.8 [0.7, 0.9] is lower (better for time) and 1.2 [1.1, 1.3] higher."""
    t = {"kind": "ratio", "n_pairs": 6, "mean": 0.8, "ci_low": 0.7, "ci_high": 0.9, "p_holm": 0.01}
    assert classify(t, 0.05, higher_is_better=None) == "lower"
    assert classify({**t, "mean": 1.2, "ci_low": 1.1, "ci_high": 1.3}, 0.05, higher_is_better=None) == "higher"
    # a ratio whose interval holds ×1 is not significant whatever p says (its log-scale CI includes 0)
    assert classify({**t, "mean": 0.95, "ci_low": 0.9, "ci_high": 1.01}, 0.05, higher_is_better=False) == "inconclusive"
    d = {"kind": "difference", "n_pairs": 6, "mean": -0.8, "ci_low": -1.2, "ci_high": -0.4, "p_holm": 0.01}
    assert classify(d, 0.05, higher_is_better=None) == "lower"


@pytest.fixture(scope="module")
def computed(study):
    runs, sched = study
    return compute(runs, sched, load_settings(**S0))


def test_only_accuracy_and_f1_have_the_equivalence_margin(computed):
    """analysis.md: TOST (bounds ±margin) for accuracy and F1; MCC, losses, masked-token accuracy, time and memory
    have no margin, so no TOST p, no seeds_needed and no 'equivalent' label."""
    _, deltas, _ = computed
    has = deltas[deltas["margin"].notna()]
    assert set(has["metric"]) == {"accuracy", "f1"} and (has["margin"] == 1.0).all()
    assert has["tost_p"].notna().all() and has["seeds_needed"].notna().all()
    rest = deltas[deltas["margin"].isna()]
    assert {"mcc", "stage1_mlm_accuracy", "mlm_accuracy", "eval_loss", "stage1_eval_loss"} <= set(rest["metric"])
    assert rest["tost_p"].isna().all() and rest["seeds_needed"].isna().all()
    assert not (rest["classification"] == "equivalent").any()
    assert rest.loc[rest["kind"] == "ratio", "mde"].isna().all()  # no power figures for a ratio
    assert rest.loc[rest["kind"] == "difference", "mde"].notna().all()


def test_wilcoxon_p_is_holm_adjusted_in_the_same_family(computed):
    """p_wilcoxon_holm is Holm over the distinct schedule comparisons' Wilcoxon p (per metric), as p_holm is over
    their t-test p; the stage-1 rows over the stage-1 precisions."""
    _, deltas, _ = computed
    for fam in (["vs_baseline", "named"], ["stage1"]):
        for metric, g in deltas[deltas["family"].isin(fam)].groupby("metric"):
            g = g.drop_duplicates(["a", "b"])
            g = g[g["metric"].isin(["accuracy", "total_train_seconds", "eval_loss", "train_seconds"])]
            if g.empty:
                continue
            assert list(g["p_wilcoxon_holm"]) == pytest.approx(_holm(list(g["p_wilcoxon"]))), metric
            assert (g["p_wilcoxon_holm"] > g["p_wilcoxon"]).any(), metric


def test_summary_memory_is_in_mib_and_accuracy_a_fraction(computed, study):
    _, sched = study
    summary, _, _ = computed
    row = summary[(summary["level"] == "schedule") & (summary["group"] == "fp32-fp32")
                  & (summary["metric"] == "peak_memory_bytes")].iloc[0]
    want = sched[sched["schedule"] == "fp32-fp32"]["peak_memory_bytes"] / 2 ** 20
    assert row["unit"] == "MiB" and row["mean"] == pytest.approx(want.mean()) and row["max"] == pytest.approx(want.max())
    acc = summary[(summary["level"] == "schedule") & (summary["group"] == "fp32-fp32")
                  & (summary["metric"] == "accuracy")].iloc[0]
    assert acc["unit"] == "fraction" and acc["mean"] == pytest.approx(sched[sched["schedule"] == "fp32-fp32"]["accuracy"].mean())


def test_failed_runs_are_reported_with_their_stage_and_reason_and_missing_seeds_apart(study):
    """stats.json per schedule: each failed seed with its outcome and 'stage N <status>: <reason>' (the reason only
    when recorded), 'no finite accuracy' for no_eval; a seed with no row at all is missing, not failed; the
    accuracy summary and the loss-scale minimum are over the schedule's rows (accuracy: the used ones)."""
    runs, sched = study
    sched = sched.copy()
    s = sched["schedule"] == "fp16-fp32"
    sched.loc[s & (sched["seed"] == 2), ["status", "stage1_status", "stage1_status_reason"]] = [
        "diverged", "diverged", "non-finite loss at step 40"]
    sched.loc[s & (sched["seed"] == 3), "accuracy"] = np.nan
    sched.loc[s & (sched["seed"] == 4), ["status", "stage2_status", "stage2_status_reason"]] = ["skipped", "skipped", ""]
    sched.loc[s & (sched["seed"] == 5), "stage1_loss_scale_min"] = 0.125
    used = sched[s & sched["seed"].isin([1, 5, 6])]["accuracy"] * 100
    sched = sched[~((sched["schedule"] == "bf16-fp32") & (sched["seed"] == 3))]
    _, deltas, st_ = compute(runs, sched, load_settings(**S0))
    info = st_["schedules"]["fp16-fp32"]
    assert info["failed"] == [
        {"seed": 2, "outcome": "diverged", "reason": "stage 1 diverged: non-finite loss at step 40"},
        {"seed": 3, "outcome": "no_eval", "reason": "no finite accuracy"},
        {"seed": 4, "outcome": "skipped", "reason": "stage 2 skipped"},
    ]
    assert info["missing_seeds"] == [] and info["seeds"] == [1, 2, 3, 4, 5, 6]
    assert info["accuracy_points"]["n"] == 3 and info["accuracy_points"]["mean"] == pytest.approx(used.mean())
    assert info["stage1_loss_scale_min"] == 0.125
    assert st_["schedules"]["bf16-fp32"]["missing_seeds"] == [3] and st_["schedules"]["bf16-fp32"]["n_failed"] == 0
    assert st_["schedules"]["fp32-fp32"]["missing_seeds"] == []
    # the missing seed cannot pair: the other five pair seed by seed, not by position
    r = _get(deltas, "bf16-fp32")
    a, b = (sched[sched["schedule"] == x].set_index("seed")["accuracy"] for x in ("bf16-fp32", "fp32-fp32"))
    assert r["seeds"] == "1 2 4 5 6" and r["mean"] == pytest.approx(((a - b.loc[a.index]) * 100).mean())


def test_stage1_summary_and_comparisons_use_only_finished_stage1_runs(study):
    """A diverged stage-1 run is counted under its precision and left out of its mean (stats.json stage1_summary)
    and of the paired stage-1 rows, which compare each precision with the baseline's (A − fp32, not fp32 − A; fp32
    when the baseline schedule has no stage-1 spec of its own)."""
    runs, sched = study
    runs = runs.copy()
    sel = (runs["stage"] == "pretrain") & (runs["precision"] == "amp_fp16") & (runs["seed"] == 3)
    runs.loc[sel, ["status", "eval_loss"]] = ["diverged", 99.0]
    # the baseline's own stage-1 spec unknown (a finetune-only baseline): the stage-1 rows compare against fp32
    sched = sched.copy()
    sched.loc[sched["schedule"] == "fp32-fp32", ["stage1_spec", "stage1_precision"]] = None
    _, deltas, st_ = compute(runs, sched, load_settings(**S0))
    assert st_["stage1_baseline_precision"] == "fp32"
    ok = runs[(runs["stage"] == "pretrain") & (runs["precision"] == "amp_fp16") & ~sel]
    summ = st_["stage1_summary"]["amp_fp16"]["eval_loss"]
    assert summ["n"] == 5 and summ["mean"] == pytest.approx(ok["eval_loss"].mean()) and summ["max"] < 99
    assert st_["stage1_precisions"]["amp_fp16"]["n_diverged"] == 1
    r = _get(deltas, "amp_fp16", "fp32", family="stage1", metric="eval_loss")
    fp32 = runs[(runs["stage"] == "pretrain") & (runs["precision"] == "fp32")].set_index("seed")["eval_loss"]
    want = (ok.set_index("seed")["eval_loss"] - fp32.loc[ok["seed"]]).mean()
    assert r["n_pairs"] == 5 and r["seeds"] == "1 2 4 5 6" and r["mean"] == pytest.approx(want)


def test_load_check_counts_cpu_runs_with_a_known_cpu_count_only():
    """The oversubscription check reads the larger of the two load averages of each CPU run against its own CPU
    count; a GPU run (however loaded) and a run with an unknown or zero CPU count are not checked, nor in max_load."""
    import pandas as pd

    from precswitch.analysis.stats import _load_check

    runs = pd.DataFrame({
        "run_id": ["a", "b", "c", "d", "e"],
        "device": ["cpu", "cpu", "cuda:0", "cpu", "cpu"],
        "load_avg_1m_start": [1.0, 5.5, 40.0, 30.0, 2.0],
        "load_avg_1m_end": [2.6, 1.0, 40.0, 30.0, None],
        "cpu_count": [2, 4, 2, 0, 2],
    })
    load = _load_check(runs)
    assert load["n_runs_checked"] == 3 and load["n_oversubscribed"] == 2
    assert load["oversubscribed_runs"] == ["a", "b"] and load["max_load"] == 5.5 and load["cpu_count"] == [2, 4]
    assert _load_check(runs.assign(cpu_count=0)) is None


def test_stage1_relation_is_decided_on_the_seeds_both_schedules_have():
    """shared: every common seed starts from the very same stage-1 run; different: one differs, or no seed in
    common (nothing shows a shared stage 1); none: one side has no stage-1 run; an older table without run ids
    compares the stage-1 specs."""
    import pandas as pd

    from precswitch.analysis.stats import _stage1_relation

    def sched(rows):
        return pd.DataFrame(rows, columns=["schedule", "seed", "stage1_run_id", "stage1_spec"])

    both = [("A", 1, "p1", "amp_fp16"), ("A", 2, "p2", "amp_fp16"), ("B", 1, "p1", "amp_fp16"), ("B", 2, "p2", "amp_fp16"),
            ("B", 3, "q3", "amp_fp16")]
    assert _stage1_relation(sched(both), "A", "B") == "shared"  # B's extra seed 3 has no partner
    one_off = both[:3] + [("B", 2, "x2", "amp_fp16")]
    assert _stage1_relation(sched(one_off), "A", "B") == "different"
    apart = [("A", 1, "p1", "amp_fp16"), ("B", 2, "p2", "amp_fp16")]
    assert _stage1_relation(sched(apart), "A", "B") == "different"
    none = both[:2] + [("B", 1, None, None), ("B", 2, "", None)]
    assert _stage1_relation(sched(none), "A", "B") == _stage1_relation(sched(none), "B", "A") == "none"
    old = sched(both).drop(columns="stage1_run_id").assign(stage1_train_seconds=10.0)
    assert _stage1_relation(old, "A", "B") == "shared"
    old.loc[old["schedule"] == "B", "stage1_spec"] = "amp_bf16"
    assert _stage1_relation(old, "A", "B") == "different"


def test_settings_have_no_aliases_and_none_leaves_the_default():
    """One spelling per setting (the schema's): an alias is an unknown key; a command-line value of None leaves
    the file's (here the schema's default)."""
    from precswitch.errors import PrecswitchError

    for alias in ("n_boot", "bootstrap", "equivalence_margin"):
        with pytest.raises(PrecswitchError, match=alias):
            load_settings(**{alias: 1})
    assert load_settings(bootstrap_resamples=0, alpha=None)["alpha"] == 0.05
    with pytest.raises(PrecswitchError, match="contrasts"):
        load_settings(contrasts=["a vs b"])


def test_power_settings_reach_the_power_figures():
    """seeds_needed follows the configured power, seeds_needed_equivalence the configured alpha (its interval is the
    (1 − alpha) one): 0.9 power needs more seeds than 0.8; a 90% interval fits inside the margin with fewer seeds."""
    b = np.array([80.0, 75.0, 70.0, 82.0, 79.0])
    a = b + np.array([1.0, -0.8, 1.2, -0.5, 0.6])
    r8 = paired_contrast(a, b, margin=1.0, power=0.8)
    r9 = paired_contrast(a, b, margin=1.0, power=0.9)
    assert r9["seeds_needed"] == power_analysis(r8["sd"], 5, 0.05, 0.9, 1.0)["seeds_needed"] > r8["seeds_needed"]
    assert r9["mde"] > r8["mde"]
    r10 = paired_contrast(a, b, margin=1.0, alpha=0.1)
    want = next(n for n in range(2, 100) if st.t.ppf(0.95, n - 1) * r8["sd"] / math.sqrt(n) < 1.0 - abs(r8["mean"]))
    assert r10["seeds_needed_equivalence"] == want < r8["seeds_needed_equivalence"]


def test_every_delta_row_has_its_metrics_direction_and_unit(computed):
    """analysis.md: accuracy, F1, MCC and masked-token accuracy are better higher (in points, MCC × 100); eval loss
    better lower (nats); time and memory better lower, throughput higher (ratios); stage 1 on its own alike."""
    _, deltas, _ = computed
    want = {"accuracy": (True, "points"), "f1": (True, "points"), "mcc": (True, "MCC x 100"),
            "stage1_mlm_accuracy": (True, "points"), "mlm_accuracy": (True, "points"),
            "stage1_eval_loss": (False, "nats"), "eval_loss": (False, "nats"),
            "stage1_samples_per_second": (True, "ratio"), "stage2_samples_per_second": (True, "ratio"),
            "samples_per_second": (True, "ratio")}
    for m in ("stage1_train_seconds", "stage2_train_seconds", "total_train_seconds", "train_seconds",
              "stage1_peak_memory_bytes", "stage2_peak_memory_bytes", "peak_memory_bytes"):
        want[m] = (False, "ratio")
    got = {m: (bool(g["higher_is_better"].iloc[0]), g["unit"].iloc[0]) for m, g in deltas.groupby("metric")}
    assert got == want
    for m, g in deltas.groupby("metric"):
        assert g["higher_is_better"].nunique() == 1 and g["unit"].nunique() == 1, m
        assert set(g["kind"]) == {"ratio" if want[m][1] == "ratio" else "difference"}, m


def test_summary_counters_unknown_everywhere_are_missing_not_zero():
    """A counter (skipped steps) no run of a group recorded sums to nothing ('–' in summary.md), not to 0, which
    would read as 'no step was skipped'; one recorded value sums as itself, failed rows included."""
    import pandas as pd

    from precswitch.analysis.stats import SCHEDULE_COUNTERS, _counts, _summary_rows

    df = mark_outcomes(pd.DataFrame({
        "schedule": ["A", "A", "B", "B"], "seed": [1, 2, 1, 2], "status": ["ok", "ok", "ok", "diverged"],
        "accuracy": [0.8, 0.7, 0.8, 0.9], "majority_accuracy": 0.5,
        "skipped_steps": [np.nan, np.nan, 0.0, 12.0], "nonfinite_losses": [np.nan, np.nan, np.nan, 3.0]}))
    rows = {(r["group"], r["metric"]): r for r in _summary_rows(df, "schedule", "schedule", SCHEDULE_COUNTERS, 0.05,
                                                                _counts(df, "schedule"))}
    assert math.isnan(rows[("A", "skipped_steps")]["sum"]) and math.isnan(rows[("A", "nonfinite_losses")]["sum"])
    assert rows[("B", "skipped_steps")]["sum"] == 12.0 and rows[("B", "nonfinite_losses")]["sum"] == 3.0
    assert rows[("B", "skipped_steps")]["n_failed"] == 1 and rows[("B", "skipped_steps")]["n_used"] == 1


def test_null_simulation_follows_its_alpha_and_margin():
    """simulate_false_positive_rate runs the study's own rule at the alpha and margin given: at alpha 0.2 about a
    fifth of the null pairs are called different; with a margin of 100 points every other pair is equivalent, with
    0.01 none; the rate sits inside its Wilson interval and the same seed gives the same answer."""
    from precswitch.analysis.paired import simulate_false_positive_rate

    wide = simulate_false_positive_rate(n_sims=150, n_seeds=5, alpha=0.2, seed=3, margin=100.0)
    assert 0.1 < wide["false_positive_rate"] < 0.3 and wide["alpha"] == 0.2
    assert wide["ci_low"] < wide["false_positive_rate"] < wide["ci_high"]
    assert wide["equivalent_rate"] == pytest.approx(1 - wide["false_positive_rate"])
    narrow = simulate_false_positive_rate(n_sims=150, n_seeds=5, alpha=0.2, seed=3, margin=0.01)
    assert narrow["equivalent_rate"] == 0 and narrow["false_positive_rate"] == wide["false_positive_rate"]


def test_confidence_level_keeps_every_digit_alpha_has():
    """alpha 0.0005 is a 99.95% interval, 0.0125 (0.05 over a Holm family of 4) 98.75%: not rounded to 100 or 98.8."""
    from precswitch.analysis.fmt import conf_level

    assert [conf_level(a) for a in (0.0005, 0.0125, 0.1, 0.2)] == ["99.95", "98.75", "90", "80"]
