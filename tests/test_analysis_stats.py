"""Statistics: validity self-checks (planted effect, null false-positive rate, equivalence, failures)."""

import math

import numpy as np
import pandas as pd
import pytest

from precswitch.analysis.aggregate import aggregate
from precswitch.analysis.fakes import TWO_SCHEDULES, write_fake_study
from precswitch.analysis.paired import classify, holm, paired_contrast
from precswitch.analysis.settings import load_settings
from precswitch.analysis.cli import run_stats
from precswitch.analysis.stats import compute
from precswitch.errors import PrecswitchError

FAST = {"bootstrap_resamples": 200}


def _study(tmp_path, **kw):
    paths = write_fake_study(tmp_path / "study", **kw)
    return aggregate(paths, tmp_path / "tables")


def _acc(deltas, a, b="fp32-fp32", family="vs_baseline", metric="accuracy"):
    r = deltas[(deltas["family"] == family) & (deltas["a"] == a) & (deltas["b"] == b) & (deltas["metric"] == metric)]
    assert len(r) == 1
    return r.iloc[0]


def test_planted_effect_is_worse(tmp_path):
    # fp16-fp16 is 2 points worse; per-run noise SD 0.7 point (paired-difference SD ~1 point); 10 seeds
    runs, sched = _study(tmp_path, seeds=range(1, 11), effects={"fp16-fp16": -2.0}, sd=0.7, rng_seed=1)
    _, deltas, stats = compute(runs, sched, load_settings(**FAST))
    r = _acc(deltas, "fp16-fp16")
    assert r["classification"] == "worse"
    assert r["mean"] == pytest.approx(-2.0, abs=1.0)
    assert r["ci_high"] < 0 and r["p_holm"] < 0.05 and r["n_pairs"] == 10
    assert math.isfinite(r["boot_low"]) and r["boot_low"] < r["mean"] < r["boot_high"]
    assert math.isfinite(r["mde"]) and r["mde"] > 0
    # the named contrast "does switching to fp32 for fine-tuning help after fp16 pre-training?" sees it too
    n = _acc(deltas, "fp16-fp32", "fp16-fp16", family="named")
    assert n["classification"] == "better"
    # schedules without a planted effect are not called different
    for s in ("fp16-fp32", "bf16-fp32"):
        assert _acc(deltas, s)["classification"] in ("equivalent", "inconclusive")


def test_diverged_run_counted_and_excluded(tmp_path):
    seeds = range(1, 7)
    runs0, sched0 = _study(tmp_path / "a", seeds=seeds, rng_seed=5)
    runs1, sched1 = _study(tmp_path / "b", seeds=seeds, rng_seed=5, diverged={("fp16-fp32", 3)})
    s = load_settings(**FAST)
    sum0, del0, st0 = compute(runs0, sched0, s)
    sum1, del1, st1 = compute(runs1, sched1, s)
    i0, i1 = st0["schedules"]["fp16-fp32"], st1["schedules"]["fp16-fp32"]
    assert (i0["n_failed"], i1["n_failed"]) == (0, 1)
    assert (i0["n_diverged"], i1["n_diverged"]) == (0, 1)
    assert i1["n_used"] == i0["n_used"] - 1 == 5
    assert i1["failed"][0]["seed"] == 3 and i1["failed"][0]["outcome"] == "diverged"
    # the mean is over the other seeds only (same fake numbers for those seeds)
    row = sum1[(sum1["level"] == "schedule") & (sum1["group"] == "fp16-fp32") & (sum1["metric"] == "accuracy")].iloc[0]
    ok = sched1[(sched1["schedule"] == "fp16-fp32") & (sched1["seed"] != 3)]["accuracy"]
    assert row["n"] == 5 and row["mean"] == pytest.approx(ok.mean())
    assert row["n_failed"] == 1
    # pairing drops seed 3 on both sides
    r = _acc(del1, "fp16-fp32")
    assert r["n_pairs"] == 5 and "3" not in r["seeds"].split()
    assert _acc(del0, "fp16-fp32")["n_pairs"] == 6


def test_degenerate_run_flagged_and_kept(tmp_path):
    runs, sched = _study(tmp_path, seeds=range(1, 6), degenerate={("bf16-fp32", 2)})
    summary, deltas, stats = compute(runs, sched, load_settings(**FAST))
    i = stats["schedules"]["bf16-fp32"]
    assert i["n_degenerate"] == 1 and i["n_failed"] == 0 and i["n_used"] == 5
    assert i["degenerate_seeds"] == [2]
    assert _acc(deltas, "bf16-fp32")["n_pairs"] == 5


def test_missing_baseline_names_baseline_and_available(tmp_path):
    runs, sched = _study(tmp_path, seeds=[1, 2])
    with pytest.raises(PrecswitchError) as e:
        compute(runs, sched, load_settings(baseline="fp64-fp64"))
    msg = str(e.value)
    assert "fp64-fp64" in msg and "fp16-fp32" in msg and "fp32-fp32" in msg


def test_run_stats_writes_outputs_and_lists_missing_contrasts(tmp_path):
    _study(tmp_path, seeds=range(1, 4), schedules={"fp32-fp32": ("fp32", "fp32"), "fp16-fp32": ("amp_fp16", "fp32")})
    out = tmp_path / "res"
    stats = run_stats(tmp_path / "tables" / "runs.csv", tmp_path / "tables" / "schedules.parquet",
                      load_settings(**FAST), out)
    for n in ("summary.csv", "summary.md", "deltas.csv", "stats.json"):
        assert (out / n).is_file()
    assert ["fp16-fp32", "fp16-fp16"] in stats["missing_contrasts"]
    assert stats["named_contrasts"] == [["fp16-fp32", "fp32-fp32"]]
    summary = pd.read_csv(out / "summary.csv")
    assert {"schedule", "stage1", "stage2"} <= set(summary["level"])
    md = (out / "summary.md").read_text()
    assert "fp16-fp32" in md and "Stage 1" in md


# ---------------------------------------------------------------------------- audit fixes
def test_bootstrap_only_from_min_pairs():
    from precswitch.analysis.paired import MIN_BOOTSTRAP_PAIRS

    assert MIN_BOOTSTRAP_PAIRS == 8
    rng = np.random.default_rng(3)
    for n, finite in ((3, False), (5, False), (7, False), (8, True), (12, True)):
        b = rng.normal(80, 2, n)
        r = paired_contrast(b + rng.normal(0.5, 1.0, n), b, margin=1.0, n_boot=200)
        assert math.isfinite(r["boot_low"]) == finite and math.isfinite(r["boot_high"]) == finite, n
        assert math.isfinite(r["ci_low"])  # the t interval stays


def test_stage1_relation_shared_different_none(tmp_path):
    sched_def = {"fp32-fp32": ("fp32", "fp32"), "fp16-fp32": ("amp_fp16", "fp32"),
                 "fp16-fp16": ("amp_fp16", "amp_fp16"), "ft-fp32": (None, "fp32")}
    runs, sched = _study(tmp_path, seeds=range(1, 4), schedules=sched_def)
    s = load_settings(**FAST, contrasts=[["fp16-fp32", "fp16-fp16"], ["fp16-fp32", "fp32-fp32"],
                                         ["ft-fp32", "fp16-fp32"]])
    _, deltas, stats = compute(runs, sched, s)
    rel = stats["stage1_relation"]
    assert rel["fp16-fp32 vs fp16-fp16"] == "shared"
    assert rel["fp16-fp32 vs fp32-fp32"] == "different"
    assert rel["ft-fp32 vs fp16-fp32"] == "none" and rel["ft-fp32 vs fp32-fp32"] == "none"
    assert rel["fp16-fp16 vs fp32-fp32"] == "different"
    assert stats["schedules"]["ft-fp32"]["has_stage1"] is False
    assert stats["schedules"]["fp16-fp16"]["has_stage1"] is True
    # what the verdict then uses: the shared stage 1 is exactly ×1, stage 2 differs (fakes: amp_fp16 is faster)
    s1 = _acc(deltas, "fp16-fp32", "fp16-fp16", family="named", metric="stage1_train_seconds")
    s2 = _acc(deltas, "fp16-fp32", "fp16-fp16", family="named", metric="stage2_train_seconds")
    assert s1["mean"] == 1.0 and s2["mean"] == pytest.approx(1.05, rel=0.05)


def _with_load(runs, start, end, cpu_count=2, device="cpu"):
    runs = runs.copy()
    runs["load_avg_1m_start"] = start
    runs["load_avg_1m_end"] = end
    runs["cpu_count"] = cpu_count
    runs["device"] = device
    return runs


def test_load_check(tmp_path):
    runs, sched = _study(tmp_path, schedules=TWO_SCHEDULES, seeds=range(1, 4))  # one comparison: the check is apart
    s = load_settings(**FAST)
    # old runs: no load columns → nothing
    assert "load_avg_1m_start" not in runs
    assert compute(runs, sched, s)[2]["load"] is None
    n = len(runs)
    start = [0.5] * n
    end = [1.0] * n
    end[0], start[3] = 3.5, 2.6  # two runs over 25% above 2 CPUs (one at the end, one at the start)
    end[4] = 2.4  # 20% above: a study using both cores plus a little background, not flagged
    start[5] = None  # unknown at one end: the other end decides
    load = compute(_with_load(runs, start, end), sched, s)[2]["load"]
    assert load["n_runs_checked"] == n and load["n_oversubscribed"] == 2
    assert sorted(load["oversubscribed_runs"]) == sorted([runs["run_id"].iloc[0], runs["run_id"].iloc[3]])
    assert load["max_load"] == 3.5 and load["cpu_count"] == [2]
    # load exactly 1.25 x the CPU count is not oversubscribed; all null → not checked
    assert compute(_with_load(runs, 2.5, 2.5), sched, s)[2]["load"]["n_oversubscribed"] == 0
    assert compute(_with_load(runs, None, None), sched, s)[2]["load"] is None
    # GPU runs are not checked (the caveat is about CPU timings)
    assert compute(_with_load(runs, 9.0, 9.0, device="cuda"), sched, s)[2]["load"] is None


def _tiny_stage1_loss(runs, delta=-6.6e-5, sd=1.5e-5):
    """amp_fp16 stage-1 eval loss = fp32's (same seed) + a tiny, consistent difference."""
    runs = runs.copy()
    pre = runs["stage"] == "pretrain"
    fp32 = runs[pre & (runs["precision"] == "fp32")].set_index("seed")["eval_loss"]
    rng = np.random.default_rng(0)
    for i in runs.index[pre & (runs["precision"] == "amp_fp16")]:
        runs.loc[i, "eval_loss"] = fp32[runs.loc[i, "seed"]] + delta + rng.normal(0, sd)
    return runs


def test_one_holm_family_per_metric_so_a_repeated_comparison_gets_one_label(tmp_path):
    # fp16-fp32 vs fp32-fp32 is both a vs-baseline and a named contrast. Adjusted in two separate families
    # it got Holm p 0.063 (inconclusive) in one and 0.031 (worse) in the other, so the verdict's answer and
    # its per-schedule paragraph contradicted each other on the same numbers.
    runs, sched = _study(tmp_path, seeds=range(1, 7), effects={"fp16-fp32": -1.0, "bf16-fp32": -0.6}, sd=0.7,
                         rng_seed=4)
    _, deltas, _ = compute(runs, sched, load_settings(bootstrap_resamples=0))
    sch = deltas[deltas["family"].isin(["vs_baseline", "named"])]
    for (metric, a, b), g in sch.groupby(["metric", "a", "b"]):
        if len(g) > 1:
            assert g["p_holm"].nunique(dropna=False) == 1 and g["classification"].nunique() == 1, (metric, a, b)
    v, n = _acc(deltas, "fp16-fp32"), _acc(deltas, "fp16-fp32", family="named")
    assert v["p_holm"] == n["p_holm"] and v["classification"] == n["classification"]
    # the family is the 4 distinct comparisons (3 vs baseline + fp16-fp32 vs fp16-fp16), each counted once
    acc = sch[sch["metric"] == "accuracy"].drop_duplicates(["a", "b"])
    assert len(acc) == 4
    assert sorted(acc["p_holm"]) == pytest.approx(sorted(holm(list(acc["p_t"]))))


def test_seeds_needed_when_the_paired_sd_is_far_below_the_margin():
    from statsmodels.stats.power import TTestPower

    from precswitch.analysis.paired import paired_t_power, power_analysis

    # 2 seeds, paired SD 0.1 point, mean 0.5: the CI (±0.9) crosses the margin, so the row is inconclusive and
    # the verdict needs seeds_needed. solve_power gave NaN at SD 0.125 and 2 at SD 0.1 (power there: 0.73).
    r = paired_contrast([80.43, 70.57], [80.0, 70.0], margin=1.0)
    r["p_holm"] = r["p_t"]
    assert classify(r, 0.05) == "inconclusive" and r["seeds_needed"] == 3
    for sd in (0.3, 0.2, 0.125, 0.1, 0.05, 0.01):
        n = power_analysis(sd, 2, 0.05, 0.8, 1.0)["seeds_needed"]
        assert math.isfinite(n) and n >= 2, sd
        if n > 2:  # n − 1 pairs have too little power
            assert not TTestPower().power(1 / sd, n - 1, 0.05) >= 0.8, sd  # (NaN at es 8, n 2: power ≈ 0.6)
            assert paired_t_power(1 / sd, n - 1, 0.05) < 0.8 <= paired_t_power(1 / sd, n, 0.05), sd
    assert power_analysis(1.0, 2, 0.05, 0.8, 1.0)["seeds_needed"] == 10  # the ordinary range is unchanged


def test_deltas_seeds_are_the_pairs_used(tmp_path):
    # a used run (finite accuracy) without F1, and a schedule without stage 1: the seeds column listed the
    # seeds of both finished runs (4 and 3) while n_pairs counted the pairs with values (3 and 0)
    runs, sched = _study(tmp_path, seeds=range(1, 5))
    sched.loc[(sched["schedule"] == "fp16-fp32") & (sched["seed"] == 2), "f1"] = np.nan
    sched.loc[sched["schedule"] == "bf16-fp32", "stage1_train_seconds"] = np.nan
    _, deltas, _ = compute(runs, sched, load_settings(bootstrap_resamples=0))
    for r in deltas.to_dict("records"):
        seeds = r["seeds"].split() if isinstance(r["seeds"], str) else []
        assert len(seeds) == r["n_pairs"], (r["family"], r["contrast"], r["metric"])
    assert _acc(deltas, "fp16-fp32", metric="f1")["seeds"] == "1 3 4"


def test_power_is_for_the_holm_adjusted_test_the_label_uses(tmp_path):
    from precswitch.analysis.paired import power_analysis

    # the label needs Holm p < alpha; over m comparisons the strictest Holm step is alpha / m. Power at
    # plain alpha promised "about 8 seeds" where the labelled test needs more.
    runs, sched = _study(tmp_path, seeds=range(1, 7), effects={"fp16-fp32": -1.0, "bf16-fp32": -0.6}, sd=0.7,
                         rng_seed=4)
    _, deltas, _ = compute(runs, sched, load_settings(bootstrap_resamples=0))
    r = _acc(deltas, "fp16-fp32")
    m = deltas[(deltas["metric"] == "accuracy") & deltas["family"].isin(["vs_baseline", "named"])]
    m = len(m.drop_duplicates(["a", "b"]))
    assert m == 4
    want = power_analysis(r["sd"], r["n_pairs"], 0.05 / m, 0.8, 1.0)
    plain = power_analysis(r["sd"], r["n_pairs"], 0.05, 0.8, 1.0)
    assert r["seeds_needed"] == want["seeds_needed"] > plain["seeds_needed"]
    assert r["mde"] == pytest.approx(want["mde"]) and r["mde"] > plain["mde"]
    assert _acc(deltas, "fp16-fp32", family="named")["seeds_needed"] == r["seeds_needed"]


@pytest.mark.parametrize("n, alpha, want", [(3, 0.05 / 4, 6.55), (3, 0.05 / 3, 5.67), (3, 0.05 / 2, 4.62),
                                             (2, 0.05 / 4, 46.2), (2, 0.05 / 2, 23.1), (10, 0.05, 0.996)])
def test_detectable_difference_has_the_power_it_claims(n, alpha, want):
    """'with these seeds a difference of X points is detectable at 80% power after Holm': statsmodels'
    solve_power returned a non-root at 2-3 pairs and Holm-divided alpha (5.0 SD at n = 3, alpha 0.0125, where
    the power is 0.61), so the default study's verdict understated X by a quarter. Checked against a simulation
    of the paired t-test and the exact power."""
    import numpy as np
    from scipy import stats as st

    from precswitch.analysis.paired import paired_t_power, power_analysis

    mde = power_analysis(1.0, n, alpha)["mde"]
    assert mde == pytest.approx(want, rel=0.01)
    assert paired_t_power(mde, n, alpha) == pytest.approx(0.8, abs=1e-4)
    rng = np.random.default_rng(0)
    d = rng.normal(mde, 1.0, size=(200_000, n))
    p = st.ttest_1samp(d, 0.0, axis=1).pvalue
    assert float((p < alpha).mean()) == pytest.approx(0.8, abs=0.005)


def test_schedule_stage1_metrics_share_the_stage1_rows_holm_p_and_label(tmp_path):
    """bf16-fp32 vs fp32-fp32 on stage-1 train time compares the very runs of the stage-1 row amp_bf16 vs
    fp32: one adjusted p and one label, not 'saved' in the stage-1 section and 'not significant' above."""
    from precswitch.analysis.aggregate import aggregate
    from precswitch.analysis.fakes import write_fake_study
    from precswitch.analysis.settings import load_settings
    from precswitch.analysis.cli import run_stats

    paths = write_fake_study(tmp_path / "s", seeds=[1, 2, 3, 4], rng_seed=3)
    aggregate(paths, tmp_path / "t")
    stats = run_stats(tmp_path / "t" / "runs.csv", tmp_path / "t" / "schedules.csv",
                      load_settings(bootstrap_resamples=0), tmp_path / "t")
    rows = {(r["family"], r["a"], r["b"], r["metric"]): r for r in stats["deltas"]}
    checked = 0
    for sched, prec in (("bf16-fp32", "amp_bf16"), ("fp16-fp32", "amp_fp16"), ("fp16-fp16", "amp_fp16")):
        for sm, pm in (("stage1_train_seconds", "train_seconds"), ("stage1_peak_memory_bytes", "peak_memory_bytes"),
                       ("stage1_eval_loss", "eval_loss")):
            r, st = rows[("vs_baseline", sched, "fp32-fp32", sm)], rows[("stage1", prec, "fp32", pm)]
            assert r["mean"] == pytest.approx(st["mean"])  # the same runs
            assert r["p_holm"] == pytest.approx(st["p_holm"]) and r["classification"] == st["classification"]
            checked += 1
    # the two fp16 schedules share their stage-1 runs: that comparison keeps its own (degenerate) row
    same = rows[("named", "fp16-fp32", "fp16-fp16", "stage1_train_seconds")]
    assert same["mean"] == pytest.approx(1.0)
    assert checked == 9


def test_power_at_or_below_alpha_is_refused_and_the_detectable_difference_never_crashes():
    """power <= alpha has no 'seeds needed' answer (a test rejects with probability alpha at no effect):
    `precswitch stats` crashed in scipy's brentq after the whole study trained. The settings refuse it, naming
    both keys; the detectable difference itself is 0 there instead of a crash."""
    from precswitch.analysis.paired import _mde_dz, paired_t_power

    for kw in ({"alpha": 0.9}, {"power": 0.02}, {"power": 0.5, "alpha": 0.5}):
        with pytest.raises(PrecswitchError, match=r"'power' \(.*\) must exceed 'alpha'"):
            load_settings(**kw)
    assert load_settings(power=0.5, alpha=0.3)["power"] == 0.5
    assert _mde_dz(5, 0.9, 0.8) == 0.0
    dz = _mde_dz(5, 0.3, 0.5)
    assert dz > 0 and paired_t_power(dz, 5, 0.3) == pytest.approx(0.5, abs=1e-4)


def test_stage2_summary_leaves_out_runs_whose_stage1_failed(tmp_path):
    """A stage-2 run that finished from a failed stage 1 belongs to a failed schedule: the schedule statistics
    leave it out, so the stage-2-by-precision summary does too (it used to pool it as a normal fp32 run)."""
    import json

    paths = write_fake_study(tmp_path / "s", seeds=range(1, 4), diverged={("amp_fp16", s) for s in range(1, 4)})
    for p in paths:  # the workflow fine-tunes them anyway: their own status is ok
        m = json.loads(p.read_text())
        if m["stage"] == "finetune" and m["status"] != "ok":
            m.update(status="ok", status_reason=None)
            p.write_text(json.dumps(m))
    runs, sched = aggregate(paths, tmp_path / "t")
    summary, _, _ = compute(runs, sched, load_settings(bootstrap_resamples=0))
    row = summary[(summary["level"] == "stage2") & (summary["group"] == "fp32") & (summary["metric"] == "train_seconds")]
    # fp32 stage 2: fp32-fp32 and bf16-fp32 (3 seeds each) used; fp16-fp32's 3 runs from a diverged stage 1 not
    assert row.iloc[0][["n_runs", "n_used", "n_failed", "n"]].tolist() == [9, 6, 3, 6]


# ---------------------------------------------------------------------------- mutation audit
# Each test below checks a number against an independent computation (scipy's distributions on hand-built
# numbers), so that a wrong sign, an unpaired test, a wrong confidence level or a wrong back-transform fails.
def test_paired_difference_matches_the_t_distribution_on_hand_numbers():
    from scipy import stats as st

    a = np.array([81.0, 78.5, 83.0, 79.0, 80.5, 77.0])
    b = np.array([80.0, 79.0, 80.5, 77.5, 79.0, 76.5])
    d = a - b  # A − B: +1.0, −0.5, +2.5, +1.5, +1.5, +0.5
    n, mean, se = 6, d.mean(), d.std(ddof=1) / math.sqrt(6)
    for alpha in (0.05, 0.1):
        r = paired_contrast(a, b, margin=1.0, alpha=alpha, n_boot=0)
        half = st.t.ppf(1 - alpha / 2, n - 1) * se
        assert r["mean"] == pytest.approx(13 / 12) and r["n_pairs"] == n
        assert (r["ci_low"], r["ci_high"]) == pytest.approx((mean - half, mean + half))
        assert r["p_t"] == pytest.approx(2 * st.t.sf(mean / se, n - 1))  # paired: the one-sample t of d
        assert r["p_wilcoxon"] == pytest.approx(st.wilcoxon(d).pvalue)  # signed-rank on d, not rank-sum
        # TOST: the larger of the two one-sided p-values against −margin and +margin
        assert r["tost_p"] == pytest.approx(max(st.t.sf((mean + 1) / se, n - 1), st.t.cdf((mean - 1) / se, n - 1)))
    # the same accuracies as fractions, scaled to points: every number in points, TOST against ±1 point
    f = paired_contrast(a / 100, b / 100, scale=100.0, margin=1.0, n_boot=0)
    r = paired_contrast(a, b, margin=1.0, n_boot=0)
    for k in ("mean", "sd", "ci_low", "ci_high", "p_t", "p_wilcoxon", "tost_p", "seeds_needed", "mde"):
        assert f[k] == pytest.approx(r[k]), k
    # B − A is the mirror image
    m = paired_contrast(b, a, margin=1.0, n_boot=0)
    assert (m["mean"], m["ci_low"], m["ci_high"]) == pytest.approx((-r["mean"], -r["ci_high"], -r["ci_low"]))


def test_ratio_is_the_geometric_mean_of_paired_ratios():
    from scipy import stats as st

    a = np.array([50.0, 90.0, 60.0, 40.0])  # e.g. seconds of schedule A, seed by seed
    b = np.array([100.0, 100.0, 50.0, 80.0])
    logs = np.log(a / b)  # per-seed ratios 0.5, 0.9, 1.2, 0.5
    half = st.t.ppf(0.975, 3) * logs.std(ddof=1) / 2
    r = paired_contrast(a, b, kind="ratio", n_boot=0)
    geo = math.exp(logs.mean())
    assert r["mean"] == pytest.approx(geo) and r["mean"] == pytest.approx(0.7208, abs=1e-4)
    assert abs(r["mean"] - (a / b).mean()) > 0.02  # not the arithmetic mean of the ratios (0.775)
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((math.exp(logs.mean() - half), math.exp(logs.mean() + half)))
    assert r["p_t"] == pytest.approx(2 * st.t.sf(abs(logs.mean()) / (logs.std(ddof=1) / 2), 3))
    assert r["sd"] == pytest.approx(logs.std(ddof=1))  # sd stays on the log scale


def test_label_needs_the_holm_adjusted_p_not_the_unadjusted_ci():
    # unadjusted p 0.01 and a CI excluding 0, but Holm p 0.2: not significant, so not better
    row = {"kind": "difference", "n_pairs": 6, "mean": 1.5, "ci_low": 0.4, "ci_high": 2.6, "p_t": 0.01,
           "p_holm": 0.2, "margin": 1.0, "tost_p": 0.6}
    assert classify(row, 0.05) == "inconclusive"
    assert classify({**row, "p_holm": 0.03}, 0.05) == "better"
    # ratios: lower time/memory is better, higher throughput is better
    t = {"kind": "ratio", "n_pairs": 6, "mean": 0.8, "ci_low": 0.7, "ci_high": 0.9, "p_holm": 0.01}
    assert classify(t, 0.05, higher_is_better=False) == "better"
    assert classify(t, 0.05, higher_is_better=True) == "worse"
    assert classify({**t, "mean": 1.2, "ci_low": 1.1, "ci_high": 1.3}, 0.05, higher_is_better=False) == "worse"


def test_every_significant_label_follows_the_metrics_direction(tmp_path):
    # fakes: amp_bf16 pre-trains 1.35× faster with 1.1× the memory; fp32 fine-tuning is the same speed.
    # bf16-fp32 against fp32-fp32 must then be better on stage-1 and total time and throughput, worse on memory
    runs, sched = _study(tmp_path, seeds=range(1, 6))
    _, deltas, _ = compute(runs, sched, load_settings(bootstrap_resamples=0))
    want = {"stage1_train_seconds": "better", "total_train_seconds": "better", "stage1_samples_per_second": "better",
            "stage1_peak_memory_bytes": "worse", "peak_memory_bytes": "worse"}
    for metric, c in want.items():
        r = _acc(deltas, "bf16-fp32", metric=metric)
        assert r["classification"] == c, (metric, r["mean"], r["classification"])
    lower_is_better = {"stage1_train_seconds", "stage2_train_seconds", "total_train_seconds", "stage1_peak_memory_bytes",
                       "stage2_peak_memory_bytes", "peak_memory_bytes", "stage1_eval_loss", "train_seconds",
                       "eval_loss"}
    n = 0
    for r in deltas.to_dict("records"):
        if r["classification"] in ("better", "worse"):
            up = r["mean"] > (1.0 if r["kind"] == "ratio" else 0.0)
            assert (r["classification"] == "better") == (up != (r["metric"] in lower_is_better)), r
            n += 1
    assert n >= 10


def test_pairs_match_by_seed_when_a_run_failed(tmp_path):
    """A failed run drops its seed from both sides: the mean difference is the one over the seeds both schedules
    finished, pairing seed k with seed k (not the k-th remaining run of A with the k-th run of B)."""
    from scipy import stats as st

    runs, sched = _study(tmp_path, seeds=range(1, 7), rng_seed=5, diverged={("fp16-fp32", 3)})
    _, deltas, _ = compute(runs, sched, load_settings(bootstrap_resamples=0))
    a = sched[sched["schedule"] == "fp16-fp32"].set_index("seed")
    b = sched[sched["schedule"] == "fp32-fp32"].set_index("seed")
    seeds = [1, 2, 4, 5, 6]
    d = (a.loc[seeds, "accuracy"] - b.loc[seeds, "accuracy"]).to_numpy() * 100
    r = _acc(deltas, "fp16-fp32")
    assert r["seeds"] == "1 2 4 5 6" and r["mean"] == pytest.approx(d.mean())
    assert r["p_t"] == pytest.approx(st.ttest_1samp(d, 0.0).pvalue)
    # the diverged run's time is no measurement of the schedule's cost: left out of the ratio and the summary,
    # although the fake records a finite train_seconds for it
    assert math.isfinite(a.loc[3, "stage2_train_seconds"])
    t = _acc(deltas, "fp16-fp32", metric="stage2_train_seconds")
    logs = np.log(a.loc[seeds, "stage2_train_seconds"].to_numpy() / b.loc[seeds, "stage2_train_seconds"].to_numpy())
    assert t["seeds"] == "1 2 4 5 6" and t["mean"] == pytest.approx(math.exp(logs.mean()))
    summary, _, _ = compute(runs, sched, load_settings(bootstrap_resamples=0))
    row = summary[(summary["level"] == "schedule") & (summary["group"] == "fp16-fp32")
                  & (summary["metric"] == "stage2_train_seconds")].iloc[0]
    assert row["n"] == 5 and row["mean"] == pytest.approx(a.loc[seeds, "stage2_train_seconds"].mean())
    # a seed missing altogether on one side (no metrics.json) is left out the same way
    sched2 = sched[~((sched["schedule"] == "fp32-fp32") & (sched["seed"] == 1))]
    _, deltas2, _ = compute(runs, sched2, load_settings(bootstrap_resamples=0))
    r2 = _acc(deltas2, "fp16-fp32")
    assert r2["seeds"] == "2 4 5 6" and r2["mean"] == pytest.approx(d[1:].mean())


def test_failed_stage1_run_left_out_of_the_stage1_comparisons(tmp_path):
    runs, sched = _study(tmp_path, seeds=range(1, 6), diverged={("amp_fp16", 2)})
    pre = runs[(runs["stage"] == "pretrain")].set_index(["precision", "seed"])
    assert math.isfinite(pre.loc[("amp_fp16", 2), "train_seconds"])  # recorded, but the run diverged
    summary, deltas, stats = compute(runs, sched, load_settings(bootstrap_resamples=0))
    t = _acc(deltas, "amp_fp16", "fp32", family="stage1", metric="train_seconds")
    assert t["seeds"] == "1 3 4 5" and t["n_pairs"] == 4
    logs = [math.log(pre.loc[("amp_fp16", k), "train_seconds"] / pre.loc[("fp32", k), "train_seconds"]) for k in (1, 3, 4, 5)]
    assert t["mean"] == pytest.approx(math.exp(np.mean(logs)))
    assert stats["stage1_precisions"]["amp_fp16"]["n_failed"] == 1
    row = summary[(summary["level"] == "stage1") & (summary["group"] == "amp_fp16") & (summary["metric"] == "train_seconds")]
    assert row.iloc[0]["n"] == 4


def _holm_by_hand(ps):
    """Holm's step-down adjustment written out: the i-th smallest of m p-values × (m − i), running max, ≤ 1."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    out, run = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        run = max(run, min(1.0, (len(ps) - rank) * ps[i]))
        out[i] = run
    return out


def test_a_named_contrast_of_two_other_stage_1s_gets_its_own_stage1_row(tmp_path):
    """fp16-fp32 vs bf16-fp32 start from amp_fp16 and amp_bf16, neither the stage-1 baseline (fp32): their
    stage 1s are compared directly (pure fp16 against fp32 at one set of overrides is the case this is for), in
    the stage-1 Holm family, sharing its p and label with the contrast's own stage-1 metrics; summary.md and the
    verdict show it. A contrast that has fp32's stage 1 on one side, or a shared stage 1, adds nothing."""
    from precswitch.analysis.summary_md import render_summary_md
    from precswitch.analysis.verdict import render

    runs, sched = _study(tmp_path, seeds=range(1, 5), rng_seed=5)
    s = load_settings(bootstrap_resamples=0, contrasts=[["fp16-fp32", "bf16-fp32"], ["fp16-fp32", "fp32-fp32"],
                                                        ["fp16-fp32", "fp16-fp16"]])
    summary, deltas, stats = compute(runs, sched, s)
    st1 = deltas[deltas["family"] == "stage1"]
    assert sorted({(a, b) for a, b in zip(st1["a"], st1["b"])}) == [
        ("amp_bf16", "fp32"), ("amp_fp16", "amp_bf16"), ("amp_fp16", "fp32")]
    row = _acc(deltas, "amp_fp16", "amp_bf16", family="stage1", metric="eval_loss")
    pre = runs[runs["stage"] == "pretrain"].set_index(["precision", "seed"])["eval_loss"].astype(float)
    by_hand = [pre[("amp_fp16", k)] - pre[("amp_bf16", k)] for k in range(1, 5)]
    assert row["mean"] == pytest.approx(np.mean(by_hand)) and row["n_pairs"] == 4
    # one Holm family over the three stage-1 comparisons of the metric
    fam = st1[st1["metric"] == "eval_loss"].set_index(["a", "b"])
    assert list(holm(list(fam["p_t"]), 0.05)) == pytest.approx(list(fam["p_holm"]))
    shared = _acc(deltas, "fp16-fp32", "bf16-fp32", family="named", metric="stage1_eval_loss")
    assert (shared["p_holm"], shared["classification"]) == (row["p_holm"], row["classification"])
    md = render_summary_md(summary, s, deltas, stats["stage1_baseline_precision"])
    assert "| amp_fp16 − amp_bf16 | 4 |" in md
    rows = [ln for ln in render(stats).split("## Stage 1 on its own")[1].splitlines() if ln.startswith("| `")]
    assert [r.split("|")[1:3] for r in rows][-1] == [" `amp_fp16` vs `amp_bf16` ", " 4 "]
    # without that contrast: only the comparisons with fp32
    _, deltas, _ = compute(runs, sched, load_settings(bootstrap_resamples=0, contrasts=[["fp16-fp32", "fp16-fp16"]]))
    assert set(deltas.loc[deltas["family"] == "stage1", "b"]) == {"fp32"}
