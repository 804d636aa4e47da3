"""Sequential seeds: settle each paired comparison with as few seeds as it needs (issue 34).

The data of one comparison are its paired differences ``d`` (schedule A minus schedule B, seed by seed,
in points of accuracy). After every look (a batch of new seeds) the comparison's confidence *sequence*
is computed; it is

* ``different`` once the interval excludes 0,
* ``equivalent`` once it lies inside ``(-margin, +margin)``; ``identical`` instead when every pair so far is an
  exact tie (the fixed design's label for the same data, :mod:`.paired`),
* ``inconclusive`` when the maximum number of seeds is reached first (said so, never rounded to a call),
* ``continue`` otherwise: the comparison's two schedules get the next seeds.

The interval is the anytime-valid t confidence sequence (Lai 1976; Pérez-Ortiz, Lardy, de Heide and
Grünwald 2024): the set of means ``mu0`` whose e-process (a Bayes factor with a N(0, g) prior on the
standardised effect and the right-Haar prior on sigma)

    E_n(mu0) = (1 + n g)^(-1/2) [(1 + t^2/nu) / (1 + t^2/(nu (1 + n g)))]^((nu + 1)/2),   nu = n - 1,

with ``t`` the one-sample t of ``d - mu0``, stays below ``1/alpha``. Under ``mu = mu0`` the e-process is a
nonnegative martingale, so by Ville's inequality P(sup_n E_n(mu) >= 1/alpha) <= alpha: the true mean is in
every interval of the sequence with probability >= 1 - alpha, however many looks are taken and whenever
one stops. Both calls (``different``, ``equivalent``) therefore err with probability <= alpha. ``E_n`` grows
with ``|t|``, so the set is ``mean +- radius(n) * s / sqrt(n)`` with a closed-form ``radius`` (no root
finding). The SD is the fixed design's effective SD (:func:`.paired.effective_sd`: the rounding variance of an
accuracy's grid added), so equal differences get an interval of honest width, never a point. docs/sequential.md gives the reasons for this method, its assumptions and the simulation proof.

Torch-free: numpy, pandas and scipy (statsmodels for the fixed design's sample size).
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

#: Prior variance of the standardised effect (mean / SD of the differences). g = 1.4 makes the interval
#: narrowest at 10 paired seeds for alpha 0.05 (radius(10) is least at g = 1.38): a margin-sized effect
#: at about 10 seeds is what it is tuned for. docs/sequential.md, "The prior scale g".
DEFAULT_G = 1.4

#: The labels a look can give, in the order they are checked.
DECISIONS = ("different", "identical", "equivalent", "inconclusive", "continue")
#: Labels that end a comparison.
SETTLED = ("different", "identical", "equivalent", "inconclusive")


def radius(n, alpha: float = 0.05, g: float = DEFAULT_G):
    """Half-width of the confidence sequence at ``n`` pairs in units of the standard error ``s / sqrt(n)``.

    Solving ``E_n(mu0) = 1/alpha`` for ``t^2``: with ``r = 1/(1 + n g)`` and ``q = (r alpha^2)^(1/n)``,
    ``t^2 = nu (1 - q) / (q - r)``. Infinite (the whole line) below 2 pairs and while ``q <= r``, i.e. while
    even an infinite t cannot make ``E_n`` reach ``1/alpha``. Vectorised over ``n``.
    """
    n = np.asarray(n, dtype=float)
    nu = n - 1.0
    with np.errstate(divide="ignore", invalid="ignore"):
        r = 1.0 / (1.0 + n * g)
        q = (r * alpha * alpha) ** (1.0 / n)
        out = np.sqrt(nu * (1.0 - q) / (q - r))
    return np.where((n >= 2) & (q > r), out, np.inf)


def e_value(d: Sequence[float], mu0: float = 0.0, g: float = DEFAULT_G) -> float:
    """The e-process ``E_n(mu0)`` after the differences ``d`` (1.0 below 2 of them)."""
    d = np.asarray(d, dtype=float)
    n = d.size
    if n < 2:
        return 1.0
    nu = n - 1
    ss = float(np.sum((d - d.mean()) ** 2))
    k = 1.0 + n * g
    if ss == 0.0:  # |t| is infinite: E_n takes its largest value, k^(nu/2)
        return k ** (nu / 2) if d.mean() != mu0 else 1.0
    t2 = n * (d.mean() - mu0) ** 2 / (ss / nu)
    return k ** -0.5 * ((1.0 + t2 / nu) / (1.0 + t2 / (nu * k))) ** ((nu + 1) / 2)


def _mean_se(d: np.ndarray, resolution: float | None = None) -> tuple[float, float]:
    from .paired import effective_sd

    n = d.size
    mean = float(d.mean()) if n else math.nan
    se = effective_sd(d, resolution) / math.sqrt(n) if n >= 2 else math.inf
    return mean, se


def confidence_sequence(d: Sequence[float], alpha: float = 0.05, g: float = DEFAULT_G,
                        resolution: float | None = None) -> tuple[float, float]:
    """``(lo, hi)`` of the confidence sequence after the paired differences ``d`` (NaN = a failed pair,
    dropped; ``resolution``: the step of a difference, :func:`.paired.effective_sd`). ``(-inf, inf)`` until it
    is finite (at alpha 0.05 and g 1.4: from 5 pairs on) and when the SD is 0 (no interval, never a point)."""
    d = np.asarray(d, dtype=float)
    d = d[np.isfinite(d)]
    mean, se = _mean_se(d, resolution)
    half = float(radius(d.size, alpha, g)) * se if d.size >= 2 else math.inf
    if not math.isfinite(half) or half == 0:
        return -math.inf, math.inf
    return mean - half, mean + half


def _label(lo, hi, margin: float, at_max, tied=False):
    """Vectorised decision of looks with intervals ``[lo, hi]`` (``at_max``: no seeds left after it; ``tied``:
    every pair so far is an exact tie, so a settled look says ``identical``)."""
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    equiv, at_max, tied = (lo > -margin) & (hi < margin), np.asarray(at_max, dtype=bool), np.asarray(tied, dtype=bool)
    return np.select(
        [(lo > 0) | (hi < 0), tied & (equiv | at_max), equiv, at_max],
        ["different", "identical", "equivalent", "inconclusive"], default="continue")


def decide(d: Sequence[float], margin: float, alpha: float = 0.05, max_seeds: int = 20,
           g: float = DEFAULT_G, seeds_run: int | None = None, resolution: float | None = None) -> dict:
    """One look at a comparison: its estimate, interval and decision.

    ``d``: the paired differences so far; NaN entries are seeds whose pair failed (either side not ``ok``):
    they count towards ``seeds_run`` (the cost, capped by ``max_seeds``) but not towards ``n`` (pairs).
    ``different`` wins over ``equivalent`` when both hold (a real difference smaller than the margin).
    """
    d = np.asarray(d, dtype=float)
    seeds = d.size if seeds_run is None else int(seeds_run)
    pairs = d[np.isfinite(d)]
    lo, hi = confidence_sequence(pairs, alpha, g, resolution)
    decision = str(_label(lo, hi, margin, seeds >= max_seeds, pairs.size >= 2 and bool(np.all(pairs == 0))))
    mean = float(pairs.mean()) if pairs.size else math.nan
    return {"seeds": seeds, "n": int(pairs.size), "mean": mean, "lo": lo, "hi": hi, "decision": decision}


def looks(start: int = 3, step: int = 1, max_seeds: int = 20) -> list[int]:
    """Seeds run at each look: ``start``, ``start + step``, ..., always ending at ``max_seeds``."""
    if not 1 <= start <= max_seeds or step < 1:
        raise ValueError(f"need 1 <= start <= max_seeds and step >= 1 (start={start}, step={step}, "
                         f"max_seeds={max_seeds})")
    out = list(range(start, max_seeds + 1, step))
    return out if out[-1] == max_seeds else out + [max_seeds]


def path(d_by_seed: Mapping[int, float] | pd.Series, margin: float, alpha: float = 0.05, start: int = 3,
         step: int = 1, max_seeds: int = 20, g: float = DEFAULT_G, resolution: float | None = None) -> pd.DataFrame:
    """One row per look (seeds, n, mean, lo, hi, decision), up to the look that settled the comparison.

    ``d_by_seed``: the difference of every seed run, in seed order (NaN where the pair failed; see
    :func:`paired_differences`). Looks the data do not reach yet are not shown: the last row then says
    ``continue``. Pairs that arrive after the settling look (a schedule kept running for another of its
    comparisons) do not change the decision: the stopping time is the first settled look.
    """
    s = pd.Series(d_by_seed, dtype=float).sort_index()
    rows = []
    for k in looks(start, step, max_seeds):
        if k > len(s):
            break
        row = decide(s.to_numpy()[:k], margin, alpha, max_seeds, g, resolution=resolution)
        rows.append(row)
        if row["decision"] in SETTLED:
            break
    return pd.DataFrame(rows, columns=["seeds", "n", "mean", "lo", "hi", "decision"])


def paired_differences(schedules: pd.DataFrame, a: str, b: str, metric: str = "accuracy",
                       scale: float = 100.0) -> pd.Series:
    """``scale * (a - b)`` of ``metric`` per seed run by both schedules (schedules.csv rows), NaN where
    either run is not ``ok`` or lacks the metric: a failed run drops its pair but its seed was spent."""
    def side(name):
        rows = schedules[schedules["schedule"] == name].set_index("seed")
        ok = rows["status"].fillna("ok").astype(str).eq("ok") if "status" in rows else True
        return rows[metric].astype(float).where(ok)
    sa, sb = side(a), side(b)
    seeds = sa.index.intersection(sb.index).sort_values()
    return (scale * (sa.loc[seeds] - sb.loc[seeds])).rename(f"{a} - {b}")


def next_seeds(comparisons: Iterable[tuple[str, str, str]], seeds: Sequence[int], step: int = 1,
               max_seeds: int = 20) -> dict[str, list[int]]:
    """Schedules that need more seeds, and which: ``{schedule: [new seeds]}``.

    ``comparisons``: ``(a, b, decision)`` of every comparison at the latest look. A comparison that is
    ``continue`` gets new seeds on *both* sides, the same seed numbers, so every pair stays paired; a
    schedule (a shared baseline) runs while any of its comparisons is unsettled. ``seeds``: the seeds run
    so far (shared numbering); the new ones follow the largest, at most ``step`` of them and never past
    ``max_seeds`` seeds in all.
    """
    for a, b, decision in comparisons:
        if decision not in DECISIONS:
            raise ValueError(f"comparison {a} vs {b}: decision '{decision}' is not one of {DECISIONS}")
    open_ = sorted({x for a, b, decision in comparisons if decision == "continue" for x in (a, b)})
    first = max(seeds, default=-1) + 1
    new = list(range(first, first + max(0, min(step, max_seeds - len(seeds)))))
    return {name: list(new) for name in open_} if new else {}


def simulate(effect: float, sd: float, n_sims: int = 4000, start: int = 3, step: int = 1,
             max_seeds: int = 20, alpha: float = 0.05, margin: float = 1.0, rng=None,
             g: float = DEFAULT_G, naive: bool = False) -> dict:
    """Monte Carlo of the sequential design with Gaussian differences N(effect, sd^2), vectorised over sims.

    Returns the rate of each final decision with its Monte Carlo standard error, the mean seeds used
    (and its SE), and ``p_wrong``: the rate of the erroneous call (``different`` when ``effect`` is 0,
    ``equivalent`` when ``|effect| >= margin``; 0 otherwise). ``naive=True`` replaces the confidence
    sequence by the ordinary t interval at every look (repeated t-tests: the error it shows is peeking).
    """
    rng = np.random.default_rng(rng)
    d = rng.normal(effect, sd, size=(n_sims, max_seeds))
    n = np.arange(1, max_seeds + 1, dtype=float)
    mean = np.cumsum(d, axis=1) / n
    with np.errstate(invalid="ignore", divide="ignore"):
        var = (np.cumsum(d * d, axis=1) - n * mean * mean) / (n - 1)
    at = np.asarray(looks(start, step, max_seeds))
    k = n[at - 1]
    if naive:
        from scipy import stats
        mult = np.where(k >= 2, stats.t.ppf(1 - alpha / 2, np.maximum(k - 1, 1)), np.inf)
    else:
        mult = radius(k, alpha, g)
    with np.errstate(invalid="ignore"):
        half = mult * np.sqrt(np.maximum(var[:, at - 1], 0.0) / k)
    half = np.where(np.isfinite(mult), half, np.inf)
    m = mean[:, at - 1]
    label = _label(m - half, m + half, margin, at == max_seeds)  # the last look is always settled
    first = np.argmax(label != "continue", axis=1)
    decision = label[np.arange(n_sims), first]
    used = at[first]
    out = {"effect": effect, "sd": sd, "n_sims": n_sims}
    for name in SETTLED:
        p = float(np.mean(decision == name))
        out[f"p_{name}"], out[f"se_{name}"] = p, math.sqrt(p * (1 - p) / n_sims)
    wrong = "different" if effect == 0 else ("equivalent" if abs(effect) >= margin else None)
    out["p_wrong"] = out[f"p_{wrong}"] if wrong else 0.0
    out["mean_seeds"] = float(used.mean())
    out["se_mean_seeds"] = float(used.std(ddof=1) / math.sqrt(n_sims))
    return out


def fixed_seeds(effect: float, sd: float, power: float = 0.8, alpha: float = 0.05) -> int | None:
    """Paired seeds a fixed design needs for the two-sided paired t-test to detect ``effect`` with ``power``
    (the verdict's own seeds-needed: precswitch.analysis.paired.seeds_to_detect, exact at small n); None when
    there is nothing to detect (effect 0) or power is out of reach."""
    from .paired import seeds_to_detect

    if effect == 0 or not alpha < power < 1:
        return None
    n = seeds_to_detect(abs(effect), sd, alpha, power)
    return int(n) if math.isfinite(n) else None


def tost_power(n: int, effect: float, sd: float, margin: float, alpha: float = 0.05, grid: int = 4000) -> float:
    """Power of the paired TOST (equivalence within ``+-margin`` at level ``alpha``) with ``n`` pairs: the
    mean's normal law averaged over the sample SD's quantiles (midpoint rule on ``grid`` points; exact
    to ~1e-4)."""
    from scipy import stats
    nu, se = n - 1, sd / math.sqrt(n)
    u = (np.arange(grid) + 0.5) / grid
    s = sd * np.sqrt(stats.chi2.ppf(u, nu) / nu)
    w = margin - stats.t.ppf(1 - alpha, nu) * s / math.sqrt(n)  # equivalence when |mean| < w
    p = stats.norm.cdf((w - effect) / se) - stats.norm.cdf((-w - effect) / se)
    return float(np.mean(np.where(w > 0, p, 0.0)))


def fixed_equivalence_seeds(effect: float, sd: float, margin: float, power: float = 0.8,
                            alpha: float = 0.05, most: int = 1000) -> int | None:
    """Paired seeds a fixed TOST design needs to show equivalence within ``+-margin`` with ``power``;
    None when ``|effect| >= margin`` or more than ``most`` would be needed."""
    if abs(effect) >= margin or not alpha < power < 1:
        return None
    return next((n for n in range(2, most + 1) if tost_power(n, effect, sd, margin, alpha) >= power), None)


# --- the workflow's looks (a sequential study: config key `sequential`, workflow/rules/sequential.smk) ------
#: sequential.csv columns: one row per comparison and look, up to the look that settled it
TABLE_COLUMNS = ["comparison", "a", "b", "look", "seeds", "n", "mean", "lo", "hi", "decision"]


def comparison_path(schedules: pd.DataFrame, a: str, b: str, design: Mapping) -> pd.DataFrame:
    """:func:`path` of comparison ``a`` vs ``b`` of a sequential study (``design``: precswitch.study's
    ``sequential_design``): the pairs in the order of the design's seeds, looks at its start, step, max_seeds."""
    from .paired import resolution_of

    d = paired_differences(schedules, a, b)
    order = [s for s in design["seeds"] if s in d.index]
    d = d.reindex(order).reset_index(drop=True)
    rows = schedules[schedules["schedule"].isin([a, b])]
    res = resolution_of(rows["eval_examples"]) if "eval_examples" in rows else None
    p = path(d, design["margin"], design["alpha"], design["start"], design["step"], design["max_seeds"],
             resolution=res)
    p.insert(0, "look", range(len(p)))
    return p


def look(schedules: pd.DataFrame, design: Mapping, k: int) -> dict:
    """Look ``k`` (0: after the first ``start`` seeds) of a sequential study, from its stage-2 rows so far
    (``schedule``, ``seed``, ``status``, ``accuracy``): each comparison's latest row of its path (a settled one
    keeps the look that settled it) and the seeds each schedule runs next (``next``; empty: ``done``)."""
    points = looks(design["start"], design["step"], design["max_seeds"])
    if not 0 <= k < len(points):
        raise ValueError(f"look {k}: this design has looks 0 to {len(points) - 1}")
    n_k = points[k]
    rows = []
    for a, b in design["comparisons"]:
        p = comparison_path(schedules, a, b, design)
        last = p.iloc[-1].to_dict() if len(p) else {"seeds": 0}
        if last["seeds"] < n_k and last.get("decision") not in SETTLED:
            raise ValueError(f"look {k}: comparison {a} vs {b} has {last['seeds']} paired seeds, the look "
                             f"needs {n_k} (a run missing from the look's inputs)")
        rows.append({"a": a, "b": b, **last})
    new = next_seeds([(r["a"], r["b"], r["decision"]) for r in rows], list(range(n_k)), design["step"],
                     design["max_seeds"])
    nxt = {name: [design["seeds"][i] for i in idx] for name, idx in new.items()}
    return {"look": k, "seeds": n_k, "comparisons": rows, "next": nxt, "done": not nxt}


def sequential_table(schedules: pd.DataFrame, design: Mapping) -> pd.DataFrame:
    """sequential.csv: every comparison's path (one row per look up to the one that settled it)."""
    parts = []
    for a, b in design["comparisons"]:
        p = comparison_path(schedules, a, b, design)
        p.insert(0, "comparison", f"{a} vs {b}")
        p.insert(1, "a", a)
        p.insert(2, "b", b)
        parts.append(p)
    return pd.concat(parts, ignore_index=True)[TABLE_COLUMNS]


def _mean_seconds(schedules: pd.DataFrame, name: str, column: str) -> float:
    v = schedules.loc[schedules["schedule"] == name, column].astype(float)
    return float(v.mean()) if v.notna().any() else 0.0


def _fixed_design(last, sd: float, design: Mapping) -> int | None:
    """The paired seeds a fixed design of the same power (analysis.power, at the comparison's seed SD) needs to
    reach what the sequential design concluded: a t-test detecting the observed difference when it ended
    *different*, a TOST showing equivalence at the observed difference when it ended *equivalent*, a t-test
    detecting a margin-sized difference otherwise (what a fixed design is usually sized for). At least 2."""
    if not (math.isfinite(sd) and sd > 0):
        return None
    power, alpha, margin = design["power"], design["alpha"], design["margin"]
    if last["decision"] == "different":
        n = fixed_seeds(float(last["mean"]), sd, power, alpha)
    elif last["decision"] in ("equivalent", "identical"):
        n = fixed_equivalence_seeds(float(last["mean"]), sd, margin, power, alpha)
    else:
        n = fixed_seeds(margin, sd, power, alpha)
    return None if n is None else max(2, int(n))


def savings(schedules: pd.DataFrame, table: pd.DataFrame, design: Mapping) -> dict:
    """Seeds and training seconds of the sequential study against the fixed design of the same power
    (:func:`_fixed_design`: sized for what each comparison concluded). Per comparison: seeds used, that fixed number, and the seconds
    of one seed of its two schedules (stage 2 of each, plus their stage-1 runs, each once) times the seeds
    saved. For the study: the training seconds spent (every stage-1 run once) against every schedule run with
    the largest fixed number of any comparison (one seed list for the study), and with max_seeds."""
    stage1 = design["stage1"]

    def seed_seconds(names):
        s2 = sum(_mean_seconds(schedules, n, "stage2_train_seconds") for n in names)
        firsts = {stage1[n]: n for n in names if stage1.get(n) is not None}
        return s2 + sum(_mean_seconds(schedules, n, "stage1_train_seconds") for n in firsts.values())

    rows = []
    for a, b in design["comparisons"]:
        last = table[(table["a"] == a) & (table["b"] == b)].iloc[-1]
        from .paired import effective_sd, resolution_of

        d = paired_differences(schedules, a, b).dropna()
        rows_ab = schedules[schedules["schedule"].isin([a, b])]
        res = resolution_of(rows_ab["eval_examples"]) if "eval_examples" in rows_ab else None
        sd = effective_sd(d.to_numpy(), res) if d.size >= 2 else math.nan
        fixed = _fixed_design(last, sd, design)
        per_seed = seed_seconds([a, b])
        saved = None if fixed is None else fixed - int(last["seeds"])
        rows.append({"comparison": f"{a} vs {b}", "a": a, "b": b, "decision": last["decision"],
                     "seeds": int(last["seeds"]), "mean": float(last["mean"]), "lo": float(last["lo"]),
                     "hi": float(last["hi"]), "sd": sd, "fixed_seeds": fixed, "seeds_saved": saved,
                     "seconds_saved": None if saved is None else saved * per_seed})
    spent = float(schedules.drop_duplicates("stage1_run_id")["stage1_train_seconds"].fillna(0).sum()
                  if "stage1_run_id" in schedules else 0.0) + float(schedules["stage2_train_seconds"].fillna(0).sum())
    all_seed = seed_seconds(list(design["schedules"]))
    fixed_n = max((r["fixed_seeds"] for r in rows if r["fixed_seeds"] is not None), default=None)
    runs = schedules.groupby("schedule")["seed"].nunique().reindex(design["schedules"]).fillna(0).astype(int)
    return {"comparisons": rows, "seeds_per_schedule": runs.to_dict(), "train_seconds": spent,
            "fixed_seeds": fixed_n, "fixed_train_seconds": None if fixed_n is None else fixed_n * all_seed,
            "max_seeds": design["max_seeds"], "max_train_seconds": design["max_seeds"] * all_seed,
            "alpha": design["alpha"], "margin": design["margin"], "power": design["power"]}
