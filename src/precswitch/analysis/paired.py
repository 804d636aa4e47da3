"""Paired statistics: the paired contrast of two schedules seed by seed, its intervals, tests and power.

Everything is paired by seed: schedule A seed k is compared with schedule B seed k.

Classification of a contrast A − B (see :func:`classify`):

* ``better`` / ``worse``: the paired t-test's Holm-adjusted p-value < alpha; the (1 − alpha) CI then excludes
  0 (or ×1). ``within_margin`` notes a significant difference whose whole CI lies inside ±margin.
* ``equivalent``: not significant, and the whole (1 − alpha) t CI lies inside (−margin, +margin) — which implies
  the TOST p-value < alpha/2 (TOST p is reported and also required < alpha).
* ``identical``: every paired difference is exactly 0 (ties on every seed): a plain fact, ranked above
  ``equivalent``, never weaker than what a single flipped example would get.
* ``inconclusive``: neither.
* ``insufficient data``: fewer than 2 pairs.

Discrete metrics (an accuracy is k/N of N eval examples): a difference moves in steps of ``resolution``
(100/N points). Each accuracy is rounded to that grid, so the differences carry a rounding variance of
``resolution²/6`` (two uniform rounding errors of variance step²/12) that an observed SD of 0 hides. The t-test,
its interval, TOST and the power figures use ``sd_eff = sqrt(sd² + resolution²/6)``: three equal differences
get an interval of honest width (never ``[−0.05, −0.05]``), and a constant shift is never weaker evidence than
the same shift with one seed one example off. The sequential path (:mod:`.sequential`) uses the same ``sd_eff``.

Seeds needed (power analysis, statsmodels TTestPower checked against the exact power of the paired t-test):
``seeds_needed`` detect a margin-sized difference, ``seeds_needed_observed`` the observed difference, both with
the configured power; ``seeds_needed_equivalence`` would put the CI inside ±margin if the observed mean and SD
held. Ratios (time, memory, throughput) are paired log-ratios, reported back as geometric-mean ratios.

Bootstrap intervals are only computed from ``MIN_BOOTSTRAP_PAIRS`` paired seeds on (fewer pairs have too few
distinct resamples for an interval worth showing).

``python -m precswitch.analysis.paired [N_SIMS [N_SEEDS]]`` prints the false-positive rate under the null.
"""

from __future__ import annotations

import functools
import math
import sys
import warnings
from typing import Any, Sequence

#: bootstrap CIs only from this many pairs on: n pairs have C(2n−1, n) distinct resamples (10 for n = 3,
#: 35 for 4, 126 for 5, 1716 for 7, 6435 for 8), too few below 8 for a percentile/BCa interval to mean much
MIN_BOOTSTRAP_PAIRS = 8


def describe(x: Sequence[float], alpha: float = 0.05) -> dict:
    """n, mean, std, (1 − alpha) t CI, min, max of the finite values."""
    import numpy as np
    from scipy import stats

    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    n = int(x.size)
    out = {"n": n, "mean": math.nan, "std": math.nan, "ci_low": math.nan, "ci_high": math.nan,
           "min": math.nan, "max": math.nan}
    if n == 0:
        return out
    out.update(mean=float(x.mean()), min=float(x.min()), max=float(x.max()))
    if n >= 2:
        sd = float(x.std(ddof=1))
        if sd <= 1e-9 * float(np.max(np.abs(x))):  # equal values, up to numpy's rounding (an SD of ~1e-16)
            sd = 0.0
        out["std"] = sd
        if sd > 0:  # n equal values: no interval, not a point that reads as an exact mean
            lo, hi = stats.t.interval(1 - alpha, n - 1, loc=x.mean(), scale=sd / math.sqrt(n))
            out["ci_low"], out["ci_high"] = float(lo), float(hi)
    return out


def describe_positive(x: Sequence[float], alpha: float = 0.05) -> dict:
    """:func:`describe` of a positive quantity (a time, a throughput, a memory): the same n, mean, SD, min and
    max, but the (1 − alpha) interval is the t interval of log(x) taken back by exp (the geometric mean's), so
    it never reaches below 0 as a t interval of 3 noisy times can."""
    import numpy as np

    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    out = describe(x, alpha)
    if x.size >= 2 and np.all(x > 0) and math.isfinite(out["ci_low"]):
        lg = describe(np.log(x), alpha)
        out["ci_low"], out["ci_high"] = math.exp(lg["ci_low"]), math.exp(lg["ci_high"])
    return out


def describe_proportion(x: Sequence[float], examples: float | None = None, alpha: float = 0.05) -> dict:
    """:func:`describe` of accuracies (fractions) whose interval stays inside [0, 1]: the seeds' t interval on the
    logit scale, taken back (each accuracy k/N moved to (k + 0.5)/(N + 1) so 0 and 1 have a logit), and beside it
    ``cp_low``/``cp_high``, the Clopper-Pearson interval of the seeds' pooled correct/examples (the eval set's own
    sampling error: an interval even when every seed scored the same). ``examples``: N per run (None: no CP)."""
    import numpy as np
    from scipy import stats

    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    out = describe(x, alpha)
    out["cp_low"] = out["cp_high"] = math.nan
    n_ex = float(examples) if examples is not None and math.isfinite(float(examples)) and examples > 0 else None
    if x.size >= 2 and math.isfinite(out["ci_low"]):
        p = (x * n_ex + 0.5) / (n_ex + 1) if n_ex else np.clip(x, 1e-6, 1 - 1e-6)
        lg = describe(np.log(p / (1 - p)), alpha)
        if math.isfinite(lg["ci_low"]):
            out["ci_low"], out["ci_high"] = (float(1 / (1 + math.exp(-v))) for v in (lg["ci_low"], lg["ci_high"]))
    if n_ex and x.size:
        k, total = int(round(float(np.sum(x * n_ex)))), int(round(n_ex * x.size))
        ci = stats.binomtest(min(max(k, 0), total), total).proportion_ci(1 - alpha, method="exact")
        out["cp_low"], out["cp_high"] = float(ci.low), float(ci.high)
    return out


def resolution_of(examples: Any, scale: float = 100.0) -> float | None:
    """The step of a difference of accuracies in ``scale`` units: scale / the fewest eval examples of the runs
    (``examples``: their counts); None when none is known."""
    import numpy as np

    n = np.asarray(examples, dtype=float).ravel() if examples is not None else np.array([])
    n = n[np.isfinite(n) & (n > 0)]
    return float(scale / n.min()) if n.size else None


def effective_sd(d, resolution: float | None) -> float:
    """The paired SD with the rounding variance of a grid of step ``resolution`` added (module docstring):
    ``sqrt(sd² + resolution²/6)``; the SD alone when ``resolution`` is None."""
    import numpy as np

    d = np.asarray(d, dtype=float)
    sd = float(d.std(ddof=1)) if d.size >= 2 else math.nan
    if d.size >= 2 and sd <= 1e-9 * float(np.max(np.abs(d))):
        # equal differences up to rounding: accuracies k/N give (k+1)/N − k/N that differ in the last bits,
        # an SD of ~1e-15; such a spread is no measurement
        sd = 0.0
    if resolution is None:
        return sd
    return math.sqrt(sd * sd + resolution * resolution / 6.0)


#: a stage-1 eval-loss difference is called negligible (verdict, summary.md) when its whole CI lies within
#: ± this fraction of the baseline precision's mean eval loss. 0.1%: for a loss near 2 nats that is 0.002
#: nats, a 0.1% change in perplexity, far below the seed-to-seed spread of a pre-training run. Paired seeds
#: share data and masks, so such a tiny but consistent difference can be significant without mattering.
NEGLIGIBLE_LOSS_FRACTION = 0.001


def loss_negligible(lo: Any, hi: Any, base_loss: Any) -> bool:
    """True when the whole CI [lo, hi] of a loss difference lies within ±NEGLIGIBLE_LOSS_FRACTION of the
    baseline loss."""
    try:
        lo, hi, base_loss = float(lo), float(hi), float(base_loss)
    except (TypeError, ValueError):
        return False
    if not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(base_loss)) or base_loss <= 0:
        return False
    return max(abs(lo), abs(hi)) < NEGLIGIBLE_LOSS_FRACTION * base_loss


def _bootstrap_ci(d, alpha: float, n_boot: int, seed: int) -> tuple[float, float]:
    import numpy as np
    from scipy import stats

    if n_boot <= 0 or d.size < MIN_BOOTSTRAP_PAIRS:  # too few distinct resamples: no interval worth the name
        return math.nan, math.nan
    if np.all(d == d[0]):  # every resample is the same value: no interval, not a point
        return math.nan, math.nan
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                res = stats.bootstrap((d,), np.mean, n_resamples=n_boot, confidence_level=1 - alpha,
                                      method=method, rng=np.random.default_rng(seed))
            except TypeError:  # a signature problem (e.g. scipy < 1.15 has no rng=) must not vanish as NaN
                raise
            except Exception:  # noqa: BLE001 - BCa can fail on tiny samples; fall back
                continue
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isfinite(lo) and math.isfinite(hi):
            return lo, hi
    return math.nan, math.nan


def _seeds_for_ci_inside(mean: float, sd: float, margin: float, alpha: float) -> float:
    """Smallest n with t_{1-alpha/2,n-1} · sd/√n < margin − |mean| (the CI would fit inside ±margin if the
    observed mean and SD held); NaN when |mean| ≥ margin, inf beyond 10^6 seeds."""
    import numpy as np
    from scipy import stats

    room = margin - abs(mean)
    if not (math.isfinite(room) and math.isfinite(sd)) or room <= 0:
        return math.nan
    if sd == 0:  # the degenerate interval exists from the sign test's minimum on (see paired_contrast)
        return _sign_seeds(alpha, "two-sided")
    ns = np.unique(np.concatenate([np.arange(2, 1001), np.geomspace(1001, 1e6, 400).astype(int)]))
    half = stats.t.ppf(1 - alpha / 2, ns - 1) * sd / np.sqrt(ns)
    hit = np.nonzero(half < room)[0]
    return float(ns[hit[0]]) if hit.size else math.inf


def paired_contrast(a: Sequence[float], b: Sequence[float], *, kind: str = "difference",
                    scale: float = 1.0, margin: float | None = None, alpha: float = 0.05,
                    power: float = 0.8, n_boot: int = 0, seed: int = 0,
                    with_power: bool = True, resolution: float | None = None) -> dict:
    """Paired comparison of A and B (same-length arrays, element k = seed k; non-finite pairs dropped).

    kind "difference": d = (A − B) × scale; mean/CI/test on d (TOST vs ±margin when margin is given).
    ``resolution``: the step of d (100/N points for accuracies of N examples; module docstring). None: unknown;
    then, only when every d is equal and not 0, the smallest gap between the distinct values of A and B
    (scaled) stands in for it, a conservative upper bound.
    kind "ratio": d = log(A / B); mean/CI reported back as ratios exp(·) (geometric-mean ratio), so the
    interval of a ratio of positive quantities never reaches 0.
    """
    import numpy as np

    a, b, d = _paired_values(a, b, kind, scale)
    n = int(d.size)
    res: dict[str, Any] = {
        "kind": kind, "n_pairs": n, "mean": math.nan, "sd": math.nan, "ci_low": math.nan,
        "ci_high": math.nan, "boot_low": math.nan, "boot_high": math.nan, "p_t": math.nan,
        "p_wilcoxon": math.nan, "tost_p": math.nan, "mde": math.nan, "seeds_needed": math.nan,
        "seeds_needed_observed": math.nan, "seeds_needed_equivalence": math.nan,
        "margin": margin if margin is not None else math.nan, "identical": False, "resolution": math.nan,
    }
    if n:
        res["mean"] = float(d.mean())
    if n >= 2:
        res["identical"] = bool(np.all(d == 0))
        if kind == "ratio":
            resolution = None
        elif resolution is None and effective_sd(d, None) == 0 and not res["identical"]:
            vals = np.unique(np.concatenate([a, b]) * scale)
            resolution = float(np.min(np.diff(vals))) if vals.size > 1 else None
        sd = effective_sd(d, resolution)
        res["sd"] = sd
        res["resolution"] = resolution if resolution is not None else math.nan
        res.update(_t_test(d, sd, alpha))
        res["p_wilcoxon"] = _wilcoxon(d)
        res["boot_low"], res["boot_high"] = _bootstrap_ci(d, alpha, n_boot, seed)
        if kind == "difference" and margin is not None and math.isfinite(margin):
            res["tost_p"] = _tost(d, sd, margin)
        if with_power and kind == "difference":
            res.update(power_analysis(sd, n, alpha, power, margin, observed=res["mean"]))
            if margin is not None and math.isfinite(margin):
                res["seeds_needed_equivalence"] = _seeds_for_ci_inside(res["mean"], sd, margin, alpha)
    return _ratio_back(res) if kind == "ratio" else res


def _paired_values(a, b, kind: str, scale: float):
    """A and B without the pairs a statistic cannot use, and their paired differences (log-ratios)."""
    import numpy as np

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ok = np.isfinite(a) & np.isfinite(b)
    if kind == "ratio":
        ok &= (a > 0) & (b > 0)
        a, b = a[ok], b[ok]
        return np.log(a), np.log(b), np.log(a / b)
    if kind != "difference":
        raise ValueError(f"kind must be difference or ratio, not {kind!r}")
    a, b = a[ok], b[ok]
    return a, b, (a - b) * scale


def _t_test(d, sd: float, alpha: float) -> dict:
    """p_t and the (1 − alpha) interval of the paired t-test on the differences ``d`` with SD ``sd`` (the
    effective SD, :func:`effective_sd`). An SD of 0 (equal differences, no resolution known) has no t statistic:
    the exact sign test decides (2 · 0.5^n, two-sided; 1 for ties) and there is no interval, never a point."""
    from scipy import stats

    n, mean = int(d.size), float(d.mean())
    if sd == 0:
        return {"p_t": 1.0 if mean == 0 else _sign_p(n, "two-sided")}
    se = sd / math.sqrt(n)
    half = float(stats.t.ppf(1 - alpha / 2, n - 1)) * se
    return {"p_t": float(2 * stats.t.sf(abs(mean) / se, n - 1)), "ci_low": mean - half, "ci_high": mean + half}


def _wilcoxon(d) -> float:
    import numpy as np
    from scipy import stats

    if not np.any(d != 0):
        return 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return float(stats.wilcoxon(d).pvalue)
        except ValueError:
            return math.nan


def _tost(d, sd: float, margin: float) -> float:
    """TOST p against ±margin: the larger of the two one-sided t-test p-values with SD ``sd``; for an SD of 0 the
    exact sign tests against both bounds (0.5^n when every pair lies inside)."""
    from scipy import stats

    n, mean = int(d.size), float(d.mean())
    if sd == 0:
        return _sign_p(n, "greater") if -margin < mean < margin else 1.0
    se = sd / math.sqrt(n)
    return float(max(stats.t.sf((mean + margin) / se, n - 1), stats.t.sf((margin - mean) / se, n - 1)))


def _sign_p(n: int, alternative: str) -> float:
    """Exact sign-test p-value when all n paired differences have the same sign (scipy binomtest)."""
    from scipy.stats import binomtest

    return float(binomtest(n, n, 0.5, alternative=alternative).pvalue)


def _sign_seeds(alpha: float, alternative: str) -> float:
    """Fewest pairs, all of one sign, for which the exact sign test reaches p < alpha (6 two-sided at 0.05)."""
    n = 2
    while _sign_p(n, alternative) >= alpha:
        n += 1
    return float(n)


def _ratio_back(res: dict) -> dict:
    """Log-ratio → ratio for the location/interval fields (sd stays on the log scale)."""
    for k in ("mean", "ci_low", "ci_high", "boot_low", "boot_high"):
        if math.isfinite(res[k]):
            res[k] = math.exp(res[k])
    return res


def power_analysis(sd: float, n: int, alpha: float = 0.05, power: float = 0.8,
                   margin: float | None = None, observed: float | None = None) -> dict:
    """Minimum detectable paired effect at ``power`` for n pairs (``mde``), pairs needed to detect a
    ``margin``-sized difference (``seeds_needed``) and to detect the ``observed`` mean difference
    (``seeds_needed_observed``): two different questions, reported apart."""
    out = {"mde": math.nan, "seeds_needed": math.nan}
    if not math.isfinite(sd):
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if observed is not None:
            out["seeds_needed_observed"] = seeds_to_detect(abs(observed), sd, alpha, power)
        if n >= 2:
            if sd == 0:  # the sign test: any consistent difference once n reaches its minimum, none before
                out["mde"] = 0.0 if n >= _sign_seeds(alpha, "two-sided") else math.inf
            else:
                out["mde"] = _mde_dz(n, alpha, power) * sd
        if margin is not None and math.isfinite(margin):
            out["seeds_needed"] = seeds_to_detect(margin, sd, alpha, power)
    return out


def seeds_to_detect(effect: float, sd: float, alpha: float, power: float) -> float:
    """Fewest paired seeds whose paired t-test detects a difference ``effect`` with ``power`` at ``alpha``,
    the paired SD being ``sd``; NaN for no effect, inf beyond 10,000 seeds."""
    if not (math.isfinite(effect) and math.isfinite(sd)) or effect <= 0:
        return math.nan
    if sd == 0:  # the degenerate test is a sign test (see _t_test)
        return _sign_seeds(alpha, "two-sided")
    from statsmodels.stats.power import TTestPower

    tp = TTestPower()
    nn = math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            nn = float(max(2, math.ceil(float(tp.solve_power(effect_size=effect / sd, nobs=None, alpha=alpha,
                                                             power=power, alternative="two-sided")))))
        except Exception:  # noqa: BLE001
            pass
    if not math.isfinite(nn) or nn <= 10:
        # few pairs: solve_power gives up (NaN from es ≈ 6) or stops at its bound (2.0 at es = 10, where
        # 2 pairs have power 0.73); scan the power curve instead
        nn = _seeds_by_scan(effect / sd, alpha, power)
    return nn


def paired_t_power(dz: float, n: int, alpha: float) -> float:
    """Power of the two-sided paired t-test with n pairs at standardized effect ``dz`` (mean / SD of the
    differences), exactly: T = (Z + dz·√n) / √(V/df), V ~ χ²(df), df = n − 1, so
    P(|T| > c) = E_V[Φ(−c√(V/df) + δ) + Φ(−c√(V/df) − δ)], integrated over V. The noncentral-t functions
    of statsmodels and scipy return NaN at 2-3 pairs with a Holm-divided alpha, where this stays finite."""
    import numpy as np
    from scipy import special, stats

    df, nc = n - 1, dz * math.sqrt(n)
    c = float(stats.t.ppf(1 - alpha / 2, df))
    r = c * np.sqrt(_chi2_nodes(df) / df)  # the expectation over V as a mean over its quantiles (midpoint rule)
    return float(np.mean(special.ndtr(-r + nc) + special.ndtr(-r - nc)))


@functools.lru_cache(maxsize=64)
def _chi2_nodes(df: int, k: int = 20_000):
    import numpy as np
    from scipy import stats

    return stats.chi2.ppf((np.arange(k) + 0.5) / k, df)


@functools.lru_cache(maxsize=256)
def _mde_dz(n: int, alpha: float, power: float) -> float:
    """Smallest standardized paired effect detected with ``power`` by n pairs at ``alpha``. statsmodels'
    solve_power is taken when its answer checks out against the exact power; at 2-3 pairs with a Holm-divided
    alpha it returns a non-root without raising (e.g. 5.0 SD at n = 3, alpha 0.0125, where the power is
    0.61 and the answer 6.55), so the root is then found on the exact power. A function of (n, alpha, power)
    alone, kept per process: a study asks it the same few questions for every comparison and metric."""
    from scipy.optimize import brentq
    from statsmodels.stats.power import TTestPower

    tp = TTestPower()

    if paired_t_power(0.0, n, alpha) >= power:  # power <= alpha: even no effect is "detected"
        return 0.0
    try:
        dz = float(tp.solve_power(effect_size=None, nobs=n, alpha=alpha, power=power, alternative="two-sided"))
        if math.isfinite(dz) and abs(paired_t_power(dz, n, alpha) - power) < 1e-4:
            return dz
    except Exception:  # noqa: BLE001 - root finding can fail for n=2
        pass
    hi = 1.0
    while paired_t_power(hi, n, alpha) < power:
        hi *= 2
        if hi > 1e6:
            return math.inf
    return float(brentq(lambda d: paired_t_power(d, n, alpha) - power, 0.0, hi, xtol=1e-6))


def _seeds_by_scan(es: float, alpha: float, power: float) -> float:
    """Fewest pairs with power ≥ ``power`` at effect size ``es``, on the exact power of the paired t-test
    (:func:`paired_t_power`), for the small-n answers solve_power gets wrong: with a paired SD far below the
    margin (es ≳ 6) statsmodels' noncentral t is NaN at 2-7 pairs and its root finder gives up or stops at its
    bound. (Replacing a NaN by the power at es/2, es/4, ... was a loose lower bound: 7 seeds asked for where
    4 have 90% power at alpha 0.0125, and more seeds asked for at a smaller SD.)"""
    if not math.isfinite(es) or es <= 0:
        return math.inf
    # the power grows with n: double up to a sufficient n, then bisect (a handful of exact evaluations)
    lo, hi = 1, 2
    while paired_t_power(es, hi, alpha) < power:
        lo, hi = hi, hi * 2
        if hi > 10_000:
            return math.inf
    while hi - lo > 1:  # power(lo) < target (lo = 1: no test), power(hi) ≥ target
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if paired_t_power(es, mid, alpha) >= power else (mid, hi)
    return float(hi)


def holm(pvalues: Sequence[float], alpha: float = 0.05) -> list[float]:
    """Holm-adjusted p-values: the k-th smallest of m p-values times (m − k + 1), made monotone, capped at 1;
    NaN entries stay NaN and are not counted. statsmodels' multipletests(method="holm") gives the same numbers
    (the tests check it) but calls gc.collect() on every call, ~0.15 s each with pandas loaded: most of the
    time of `precswitch stats`. ``alpha`` does not change an adjusted p; it is kept for the call's symmetry."""
    import numpy as np

    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(p))
    if idx.size:
        order = idx[np.argsort(p[idx], kind="stable")]
        m = order.size
        out[order] = np.minimum(1.0, np.maximum.accumulate(p[order] * np.arange(m, 0, -1)))
    return [float(v) for v in out]


#: the labels, strongest evidence of *no* difference first (identical, then equivalent)
LABELS = ("better", "worse", "higher", "lower", "identical", "equivalent", "inconclusive", "insufficient data")


def classify(row: dict, alpha: float, higher_is_better: bool | None = True) -> str:
    """better | worse | identical | equivalent | inconclusive | insufficient data (see module docstring)."""
    n = row.get("n_pairs", 0) or 0
    mean = row.get("mean", math.nan)
    if n < 2 or not math.isfinite(mean):
        return "insufficient data"
    if row.get("identical") is True:
        return "identical"
    p = row.get("p_holm")
    if p is None or not math.isfinite(p):
        p = row.get("p_t", math.nan)
    null = 1.0 if row.get("kind") == "ratio" else 0.0
    lo, hi = row.get("ci_low", math.nan), row.get("ci_high", math.nan)
    if math.isfinite(p) and p < alpha and (lo > null or hi < null):
        up = mean > null
        if higher_is_better is None:
            return "higher" if up else "lower"
        return "better" if up == bool(higher_is_better) else "worse"
    margin = row.get("margin", math.nan)
    if (margin is not None and math.isfinite(margin) and math.isfinite(lo) and math.isfinite(hi)
            and -margin < lo and hi < margin and math.isfinite(row.get("tost_p", math.nan))
            and row["tost_p"] < alpha):
        return "equivalent"
    return "inconclusive"


def within_margin(row: dict) -> bool:
    m = row.get("margin", math.nan)
    lo, hi = row.get("ci_low", math.nan), row.get("ci_high", math.nan)
    return bool(m is not None and math.isfinite(m) and math.isfinite(lo) and math.isfinite(hi)
                and -m < lo and hi < m)


def simulate_false_positive_rate(n_sims: int = 2000, n_seeds: int = 10, sd: float = 1.0,
                                 alpha: float = 0.05, seed: int = 0, seed_sd: float = 2.0,
                                 margin: float = 1.0) -> dict:
    """Two schedules drawn from the same distribution (shared per-seed effect of SD ``seed_sd`` points
    plus independent noise of SD ``sd`` points), classified by the same code as the real analysis.

    Returns the rate at which they are called "better" or "worse" (should be ≈ alpha), with a 95%
    Wilson interval, and the rate of "equivalent" calls.
    """
    import numpy as np
    from statsmodels.stats.proportion import proportion_confint

    rng = np.random.default_rng(seed)
    n_diff = n_equiv = 0
    for _ in range(n_sims):
        shared = rng.normal(80.0, seed_sd, n_seeds)
        a = shared + rng.normal(0.0, sd, n_seeds)
        b = shared + rng.normal(0.0, sd, n_seeds)
        r = paired_contrast(a, b, kind="difference", scale=1.0, margin=margin, alpha=alpha,
                            n_boot=0, with_power=False)
        r["p_holm"] = holm([r["p_t"]], alpha)[0]
        c = classify(r, alpha, True)
        n_diff += c in ("better", "worse")
        n_equiv += c == "equivalent"
    lo, hi = proportion_confint(n_diff, n_sims, alpha=0.05, method="wilson")
    return {"n_sims": n_sims, "n_seeds": n_seeds, "sd": sd, "seed_sd": seed_sd, "alpha": alpha,
            "false_positive_rate": n_diff / n_sims, "ci_low": float(lo), "ci_high": float(hi),
            "equivalent_rate": n_equiv / n_sims, "margin": margin}


def main(argv: list[str] | None = None) -> int:
    """``python -m precswitch.analysis.paired [N_SIMS [N_SEEDS]]``: print the null false-positive rate."""
    argv = sys.argv[1:] if argv is None else argv
    n_sims = int(argv[0]) if argv else 2000
    n_seeds = int(argv[1]) if len(argv) > 1 else 10
    r = simulate_false_positive_rate(n_sims=n_sims, n_seeds=n_seeds)
    print(f"false-positive rate under the null: {r['false_positive_rate']:.4f} "
          f"(95% CI {r['ci_low']:.4f}–{r['ci_high']:.4f}; {r['n_sims']} simulations, {r['n_seeds']} seeds, "
          f"alpha {r['alpha']}, noise SD {r['sd']} points); equivalent (±{r['margin']}) called in "
          f"{r['equivalent_rate']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
