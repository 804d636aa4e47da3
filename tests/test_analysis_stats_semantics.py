"""Statistics, second mutation audit: the semantics a reviewer of the paper would check, each against an
independent computation (scipy/statsmodels on hand-built numbers, the exact power, a simulation)."""

import math

import numpy as np
import pytest

from precswitch.analysis.paired import power_analysis


# ---------------------------------------------------------------------------- power / seeds needed
def test_seeds_needed_never_falls_as_the_paired_sd_grows():
    for alpha in (0.05, 0.025, 0.0125):
        ns = [power_analysis(float(sd), 5, alpha, 0.8, 1.0)["seeds_needed"] for sd in np.geomspace(0.02, 1.5, 40)]
        assert all(a <= b for a, b in zip(ns, ns[1:])), (alpha, ns)


# ---------------------------------------------------------------------------- paired_contrast edge cases
from precswitch.analysis.paired import classify, paired_contrast, within_margin  # noqa: E402
from precswitch.analysis.settings import load_settings  # noqa: E402
from precswitch.analysis.paired import loss_negligible  # noqa: E402
from precswitch.analysis.stats import compute, mark_outcomes  # noqa: E402


# ---------------------------------------------------------------------------- classification boundaries
def _row(**kw):
    r = {"kind": "difference", "n_pairs": 6, "mean": 0.2, "ci_low": -0.5, "ci_high": 0.9, "p_t": 0.5,
         "p_holm": 0.5, "margin": 1.0, "tost_p": 0.01}
    r.update(kw)
    return r


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
# ---------------------------------------------------------------------------- mutation audit 4
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

