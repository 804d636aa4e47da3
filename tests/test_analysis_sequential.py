"""Sequential seeds (precswitch.analysis.sequential): the confidence sequence, the decisions per look, the
seeds each comparison asks for, and the simulation proof that repeated looks keep the error rates."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from precswitch.analysis import sequential as sq

ROOT = Path(__file__).resolve().parents[1]
ALPHA = 0.05


def test_interval_ends_are_where_the_e_process_reaches_one_over_alpha():
    d = np.random.default_rng(1).normal(1.0, 1.0, 8)
    lo, hi = sq.confidence_sequence(d, ALPHA)
    assert lo < d.mean() < hi
    assert sq.e_value(d, lo) == pytest.approx(1 / ALPHA, rel=1e-9)
    assert sq.e_value(d, hi) == pytest.approx(1 / ALPHA, rel=1e-9)
    assert sq.e_value(d, d.mean()) < 1 / ALPHA  # inside: not rejected
    assert sq.e_value(d, hi + 0.1) > 1 / ALPHA  # outside: rejected
    # identical differences: |t| is infinite and E_n takes its largest value (1 + n g)^((n - 1)/2)
    assert sq.e_value([1.0] * 5, 0.0) == pytest.approx((1 + 5 * sq.DEFAULT_G) ** 2)


def test_interval_is_the_whole_line_until_the_e_process_can_reach_one_over_alpha():
    # (1 + n g)^((n - 1)/2) is the largest E_n can be: below 1/alpha for n <= 4 at g 1.4
    assert sq.confidence_sequence([0.1, 0.2, 0.4, 0.3], ALPHA) == (-math.inf, math.inf)
    assert all(math.isfinite(x) for x in sq.confidence_sequence([0.1, 0.2, 0.4, 0.3, 0.2], ALPHA))
    assert np.isinf(sq.radius([1, 2, 4], ALPHA)).all() and np.isfinite(sq.radius(5, ALPHA))


def test_interval_is_wider_than_the_fixed_t_interval_and_shrinks_with_seeds():
    from scipy import stats
    n = np.arange(5, 201)
    r = sq.radius(n, ALPHA)
    assert (r > stats.t.ppf(1 - ALPHA / 2, n - 1)).all()  # the price of looking at every n
    assert (np.diff(r / np.sqrt(n)) < 0).all()  # width in units of sd shrinks at every new seed
    d = np.random.default_rng(7).normal(1.0, 1.0, 200)
    widths = []
    for k in (5, 20, 200):
        lo, hi = sq.confidence_sequence(d[:k], ALPHA)
        assert lo < 1.0 < hi
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]


def test_failed_pairs_are_dropped_but_their_seeds_count():
    d = [0.5, math.nan, 0.7, 0.4, math.nan]
    look = sq.decide(d, margin=1.0, max_seeds=5)
    assert (look["seeds"], look["n"]) == (5, 3)
    assert look["mean"] == pytest.approx(np.mean([0.5, 0.7, 0.4]))
    assert look["decision"] == "inconclusive"  # 3 pairs give no finite interval, no seeds left


def test_decisions():
    rng = np.random.default_rng(3)
    assert sq.decide(rng.normal(3.0, 0.3, 6), margin=1.0)["decision"] == "different"
    assert sq.decide(rng.normal(0.0, 0.1, 6), margin=1.0)["decision"] == "equivalent"
    noisy = rng.normal(0.0, 3.0, 6)
    assert sq.decide(noisy, margin=1.0, max_seeds=20)["decision"] == "continue"
    assert sq.decide(noisy, margin=1.0, max_seeds=6)["decision"] == "inconclusive"
    # a real difference smaller than the margin is called different (both hold)
    small = sq.decide(rng.normal(0.5, 0.02, 6), margin=1.0)
    assert small["decision"] == "different" and -1.0 < small["lo"] and small["hi"] < 1.0
    # ties on every seed: identical once settled; with no accuracy step known there is no interval, never [0, 0]
    assert sq.decide([0.0] * 5, margin=1.0, resolution=0.05)["decision"] == "identical"
    assert sq.decide([0.0] * 5, margin=1.0)["decision"] == "continue"
    assert sq.decide([0.0] * 5, margin=1.0, max_seeds=5)["decision"] == "identical"


def test_path_has_one_row_per_look_and_stops_at_the_first_settled_one():
    d = pd.Series(np.random.default_rng(5).normal(2.0, 1.0, 20), index=range(100, 120))
    p = sq.path(d, margin=1.0, start=3, step=2)
    assert list(p.columns) == ["seeds", "n", "mean", "lo", "hi", "decision"]
    assert list(p["seeds"]) == list(range(3, 3 + 2 * len(p), 2))
    assert p["decision"].iloc[-1] == "different"
    assert (p["decision"].iloc[:-1] == "continue").all()
    assert p["mean"].iloc[-1] == pytest.approx(d.iloc[: p["seeds"].iloc[-1]].mean())
    # a look the data have not reached is not shown; the comparison goes on
    short = sq.path(d.iloc[:4], margin=1.0, start=3, step=1)
    assert list(short["seeds"]) == [3, 4] and short["decision"].iloc[-1] == "continue"
    # never settled: inconclusive at the maximum, the last look at max_seeds even off the step grid
    noisy = sq.path(np.random.default_rng(6).normal(0.0, 5.0, 20), margin=1.0, start=3, step=4, max_seeds=13)
    assert list(noisy["seeds"]) == [3, 7, 11, 13] and noisy["decision"].iloc[-1] == "inconclusive"


def test_paired_differences_drop_a_failed_run_pair():
    rows = [("a", 0, 0.80, "ok"), ("a", 1, 0.81, "diverged"), ("a", 2, 0.79, "ok"), ("a", 3, 0.85, "ok"),
            ("b", 0, 0.78, "ok"), ("b", 1, 0.80, "ok"), ("b", 2, math.nan, "ok")]
    df = pd.DataFrame(rows, columns=["schedule", "seed", "accuracy", "status"])
    d = sq.paired_differences(df, "a", "b")
    assert list(d.index) == [0, 1, 2]  # seed 3 was not run by b: not a pair, not a spent seed of the pair
    assert d.loc[0] == pytest.approx(2.0) and d.loc[[1, 2]].isna().all()
    assert sq.decide(d, margin=1.0, max_seeds=3)[("n")] == 1


def test_next_seeds_keeps_pairs_paired_and_runs_a_shared_baseline_while_needed():
    comps = [("amp_bf16", "fp32", "continue"), ("amp_fp16", "fp32", "different"),
             ("pure_bf16", "amp_bf16", "equivalent")]
    new = sq.next_seeds(comps, seeds=[0, 1, 2], step=2)
    assert new == {"amp_bf16": [3, 4], "fp32": [3, 4]}  # both sides, same seeds; amp_fp16 stops
    settled = [(a, b, "different") for a, b, _ in comps]
    assert sq.next_seeds(settled, seeds=[0, 1, 2]) == {}
    # never past max_seeds in all
    assert sq.next_seeds(comps, seeds=list(range(19)), step=3, max_seeds=20) == {"amp_bf16": [19], "fp32": [19]}
    with pytest.raises(ValueError, match="maybe"):
        sq.next_seeds([("a", "b", "maybe")], seeds=[0])


def test_false_difference_rate_under_no_difference_stays_at_most_alpha_over_all_looks():
    n = 4000
    r = sq.simulate(0.0, 1.0, n_sims=n, start=3, step=1, max_seeds=20, alpha=ALPHA, margin=1.0, rng=11)
    assert r["p_different"] <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / n)
    assert r["p_wrong"] == r["p_different"]
    assert r["p_different"] + r["p_equivalent"] + r["p_inconclusive"] == pytest.approx(1.0)


def test_a_two_point_effect_with_seed_sd_one_is_called_in_few_seeds():
    r = sq.simulate(2.0, 1.0, n_sims=4000, rng=12)
    assert r["p_different"] > 0.99
    assert r["mean_seeds"] <= 7.0
    assert sq.fixed_seeds(2.0, 1.0) == 5  # the fixed design at 80% power (statsmodels: 4.4 pairs)


def test_no_difference_with_seed_sd_half_a_point_reaches_equivalence():
    r = sq.simulate(0.0, 0.5, n_sims=4000, margin=1.0, rng=13)
    assert r["p_equivalent"] > 0.95
    assert r["mean_seeds"] < 10


def test_equivalence_is_rarely_called_for_a_margin_sized_effect():
    n = 4000
    r = sq.simulate(1.0, 1.0, n_sims=n, margin=1.0, rng=14)
    assert r["p_wrong"] == r["p_equivalent"] <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / n)


def test_fixed_designs():
    assert sq.fixed_seeds(1.0, 1.0) == 10
    assert sq.fixed_seeds(0.0, 1.0) is None
    assert sq.fixed_equivalence_seeds(1.0, 1.0, margin=1.0) is None
    # TOST power against its own Monte Carlo
    from scipy import stats
    n, sims = 6, 40000
    d = np.random.default_rng(15).normal(0.2, 0.5, (sims, n))
    half = stats.t.ppf(1 - ALPHA, n - 1) * d.std(axis=1, ddof=1) / math.sqrt(n)
    mc = np.mean(np.abs(d.mean(axis=1)) + half < 1.0)
    assert sq.tost_power(n, 0.2, 0.5, 1.0, ALPHA) == pytest.approx(mc, abs=3 * math.sqrt(mc * (1 - mc) / sims))
    n_eq = sq.fixed_equivalence_seeds(0.0, 1.0, margin=1.0)
    assert sq.tost_power(n_eq, 0.0, 1.0, 1.0) >= 0.8 > sq.tost_power(n_eq - 1, 0.0, 1.0, 1.0)


def test_a_huge_effect_needs_the_smallest_fixed_design_not_none():
    """statsmodels' solver fails to converge below 2 pairs (a 40-point effect at SD 6): that is 2 seeds."""
    assert sq.fixed_seeds(21.0, 1.41, 0.8, 0.6) == 2 and sq.fixed_seeds(40.0, 6.0) == 3
    assert sq.fixed_seeds(1.0, 1.0) == 10  # a margin-sized effect at SD 1 (the docs' table)
