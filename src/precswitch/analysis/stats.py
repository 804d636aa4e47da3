"""Statistics over the schedules table: per-schedule summaries, paired contrasts, equivalence, power.

Everything is paired by seed: schedule A seed k is compared with schedule B seed k.

Failure rule (also written into stats.json, the verdict and docs/analysis.md):

* ``diverged`` / ``skipped`` (either stage) or no finite accuracy (``no_eval``) → the row is **failed**:
  counted per schedule (``n_failed``, ``failed_seeds``) and excluded from every mean, CI and test; a
  contrast drops that seed on both sides (pairing).
* ``ok`` but accuracy ≤ majority-class accuracy → **degenerate**: the model learnt nothing useful, but the
  run finished, so it *is* that schedule's outcome and stays in every statistic; it is counted and
  flagged (``n_degenerate``, ``degenerate_seeds``) so no mean hides it.

Classification of a contrast A − B (accuracy and F1 in points = fraction × 100):

* ``better`` / ``worse``: the paired t-test's Holm-adjusted p-value < alpha (Holm per metric over the
  distinct schedule comparisons, vs-baseline and named together, a pair in both counted once; the stage-1
  rows apart); the (1 − alpha) CI then excludes 0. If the CI also lies inside ±margin the row
  notes that the difference is smaller than the margin.
* ``equivalent``: not significant, and the whole (1 − alpha) t CI lies inside (−margin, +margin) — which
  implies the TOST p-value < alpha/2 (TOST p is reported and also required < alpha).
* ``inconclusive``: neither; ``seeds_needed`` says how many paired seeds detect a margin-sized difference
  with the configured power (statsmodels TTestPower, at alpha / the size of the Holm family: the strictest
  Holm threshold), ``seeds_needed_equivalence`` how many would put the
  CI inside ±margin if the observed mean and SD held.
* ``insufficient data``: fewer than 2 pairs.

Intervals (``ci_low``/``ci_high``) are unadjusted (1 − alpha) t intervals of one comparison; the labels use
the Holm-adjusted p-value, so an interval can exclude 0 (or ×1) while the row is not significant. Bootstrap
intervals are only computed from ``MIN_BOOTSTRAP_PAIRS`` paired seeds on (fewer pairs have too few distinct
resamples for an interval worth showing).
"""

from __future__ import annotations

import json
import functools
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

from ..errors import PrecswitchError

QUESTION = (
    "If BERT is pre-trained in low precision (fp16/bf16) and fine-tuned in fp32, does accuracy go up "
    "or down, and what is saved in time and memory? \"Low precision\" names two different things, kept apart "
    "here: mixed precision (amp_fp16, amp_bf16: fp32 master weights, fp16/bf16 compute) and pure 16-bit "
    "training (pure_fp16, pure_bf16: weights, gradients and optimizer state in 16 bits)."
)

DEFAULT_SETTINGS: dict[str, Any] = {
    "baseline": "fp32-fp32",
    # (A, B): "A vs B"; these answer the question. Contrasts whose schedules were not run are listed
    # as missing, not an error.
    "contrasts": [
        ["fp16-fp32", "fp16-fp16"],  # does switching to fp32 for fine-tuning help after fp16 pre-training?
        ["fp16-fp32", "fp32-fp32"],  # does fp16 pre-training cost accuracy when fine-tuning in fp32?
        ["bf16-fp32", "fp32-fp32"],  # the same for bf16 pre-training
    ],
    "margin": 1.0,  # equivalence margin, accuracy points (fraction × 100)
    "alpha": 0.05,
    "power": 0.8,
    "bootstrap_resamples": 10000,
    "seed": 0,
}
#: bootstrap CIs only from this many pairs on: n pairs have C(2n−1, n) distinct resamples (10 for n = 3,
#: 35 for 4, 126 for 5, 1716 for 7, 6435 for 8), too few below 8 for a percentile/BCa interval to mean much
MIN_BOOTSTRAP_PAIRS = 8
_SETTING_ALIASES = {"n_boot": "bootstrap_resamples", "bootstrap": "bootstrap_resamples",
                    "equivalence_margin": "margin"}

FAILURE_RULE = (
    "Runs that diverged or were skipped (in either stage), or have no finite accuracy, are failed: "
    "they are counted per schedule and excluded from every mean, CI and test (a paired contrast drops "
    "that seed on both sides). Runs that finished but whose accuracy is at or below the majority-class "
    "accuracy are degenerate: they stay in every statistic (they are that schedule's real outcome) and "
    "are counted and flagged."
)


# --------------------------------------------------------------------------------------------------
# Metric catalogue
# --------------------------------------------------------------------------------------------------
class Metric:
    def __init__(self, column: str, label: str, kind: str, unit: str, delta_unit: str,
                 scale: float = 1.0, higher_is_better: bool | None = True, margin: bool = False):
        self.column = column
        self.label = label
        self.kind = kind  # "difference" (A − B) or "ratio" (A / B via paired log-ratios)
        self.unit = unit  # unit of the summary value
        self.delta_unit = delta_unit
        self.scale = scale  # summary value = column × scale
        self.higher_is_better = higher_is_better
        self.margin = margin  # equivalence margin applies


MIB = 1.0 / (1024 * 1024)

#: per-schedule metrics (schedules table)
SCHEDULE_METRICS = [
    Metric("accuracy", "accuracy", "difference", "fraction", "points", 1.0, True, True),
    Metric("f1", "F1", "difference", "fraction", "points", 1.0, True, True),
    Metric("mcc", "MCC", "difference", "-1..1", "MCC x 100", 1.0, True, False),
    Metric("stage1_train_seconds", "stage-1 train time", "ratio", "s", "ratio", 1.0, False),
    Metric("stage2_train_seconds", "stage-2 train time", "ratio", "s", "ratio", 1.0, False),
    Metric("total_train_seconds", "total train time", "ratio", "s", "ratio", 1.0, False),
    Metric("stage1_samples_per_second", "stage-1 throughput", "ratio", "samples/s", "ratio", 1.0, True),
    Metric("stage2_samples_per_second", "stage-2 throughput", "ratio", "samples/s", "ratio", 1.0, True),
    Metric("stage1_peak_memory_bytes", "stage-1 peak memory", "ratio", "MiB", "ratio", MIB, False),
    Metric("stage2_peak_memory_bytes", "stage-2 peak memory", "ratio", "MiB", "ratio", MIB, False),
    Metric("peak_memory_bytes", "peak memory (both stages)", "ratio", "MiB", "ratio", MIB, False),
    Metric("stage1_eval_loss", "stage-1 eval loss", "difference", "nats", "nats", 1.0, False),
    Metric("stage1_mlm_accuracy", "stage-1 masked-token accuracy", "difference", "fraction", "points",
           1.0, True),
]
#: summary-only counters per schedule
SCHEDULE_COUNTERS = [
    Metric("skipped_steps", "skipped steps", "count", "steps", "steps", 1.0, None),
    Metric("nonfinite_losses", "non-finite losses", "count", "steps", "steps", 1.0, None),
]
#: stage-1 metrics (pretrain runs, grouped by precision)
STAGE1_METRICS = [
    Metric("eval_loss", "eval loss (MLM)", "difference", "nats", "nats", 1.0, False),
    Metric("mlm_accuracy", "masked-token accuracy", "difference", "fraction", "points", 1.0, True),
    Metric("train_seconds", "train time", "ratio", "s", "ratio", 1.0, False),
    Metric("samples_per_second", "throughput", "ratio", "samples/s", "ratio", 1.0, True),
    Metric("peak_memory_bytes", "peak memory", "ratio", "MiB", "ratio", MIB, False),
]
#: stage-2 metrics (finetune runs, grouped by precision; summary only: inits differ)
STAGE2_METRICS = [
    Metric("train_seconds", "train time", "ratio", "s", "ratio", 1.0, False),
    Metric("samples_per_second", "throughput", "ratio", "samples/s", "ratio", 1.0, True),
    Metric("peak_memory_bytes", "peak memory", "ratio", "MiB", "ratio", MIB, False),
]
RUN_COUNTERS = [
    Metric("skipped_steps", "skipped steps", "count", "steps", "steps", 1.0, None),
    Metric("nonfinite_losses", "non-finite losses", "count", "steps", "steps", 1.0, None),
]

PROVENANCE_COLUMNS = [
    "device", "device_name", "memory_kind", "torch_version", "transformers_version", "datasets_version",
    "cuda_version", "python_version", "threads", "git_commit", "hostname", "process_start", "compile",
    "model_parameters",
]
# (config_hash is not provenance of the study: it hashes each run's hyper-parameters, seed and run_id
# included, so it differs between every two runs; it stays in runs.csv)

#: a stage-1 eval-loss difference is called negligible (verdict, summary.md) when its whole CI lies within
#: ± this fraction of the baseline precision's mean eval loss. 0.1%: for a loss near 2 nats that is 0.002
#: nats, a 0.1% change in perplexity, far below the seed-to-seed spread of a pre-training run. Paired seeds
#: share data and masks, so such a tiny but consistent difference can be significant without mattering.
NEGLIGIBLE_LOSS_FRACTION = 0.001

#: runs.csv columns with the 1-minute load average at the start and end of each run's training loop
LOAD_COLUMNS = ("load_avg_1m_start", "load_avg_1m_end")
#: a CPU run counts as oversubscribed when the load average exceeds the CPU count by more than this
#: share: each process then gets under 1/1.25 of a core, so its clock stretches by over 25%. A study
#: running cores/threads jobs on all cores sits at ~1x by itself (plus a little background).
LOAD_OVERSUBSCRIBED = 1.25


# --------------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------------
def _parse_contrast(c: Any) -> tuple[str, str]:
    pair = None
    if isinstance(c, str):
        for sep in (" vs ", " - ", ","):
            if sep in c:
                a, b = c.split(sep, 1)
                pair = a.strip(), b.strip()
                break
    elif isinstance(c, dict) and "a" in c and "b" in c:
        pair = str(c["a"]), str(c["b"])
    elif isinstance(c, (list, tuple)) and len(c) == 2:
        pair = str(c[0]), str(c[1])
    if pair is not None:
        if pair[0] == pair[1]:  # it used to be reported as "not run (schedule missing)"
            raise PrecswitchError(f"analysis setting 'contrasts': entry {c!r} compares {pair[0]!r} with itself; "
                                  "give two different schedules")
        return pair
    raise PrecswitchError(
        f"analysis setting 'contrasts': entry {c!r} is not a pair; allowed: [A, B], 'A vs B' or {{a: A, b: B}}"
    )


def load_settings(path: str | os.PathLike | None = None, **overrides: Any) -> dict:
    """Analysis settings: defaults ← file (JSON or YAML; an ``analysis:`` section is used if present)
    ← overrides that are not None."""
    settings = dict(DEFAULT_SETTINGS)
    raw: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise PrecswitchError(f"analysis settings file not found: {p}")
        text = p.read_text(encoding="utf-8")
        try:
            if p.suffix.lower() == ".json":
                raw = json.loads(text)
            else:
                import yaml

                raw = yaml.safe_load(text)
        except Exception as e:  # noqa: BLE001 - any parse error is a user error
            raise PrecswitchError(f"analysis settings file {p} cannot be parsed: {e}") from None
        raw = raw or {}
        if not isinstance(raw, dict):
            raise PrecswitchError(f"analysis settings file {p}: expected a mapping")
        if isinstance(raw.get("analysis"), dict):
            raw = raw["analysis"]
    raw = dict(raw)
    raw.update({k: v for k, v in overrides.items() if v is not None})
    for k, v in raw.items():
        k = _SETTING_ALIASES.get(k, k)
        if k not in DEFAULT_SETTINGS:
            raise PrecswitchError(
                f"unknown analysis setting '{k}'; allowed: {', '.join(sorted(DEFAULT_SETTINGS))}"
            )
        settings[k] = v
    contrasts = settings["contrasts"] or []
    if not isinstance(contrasts, (list, tuple)):  # a bare 'A vs B' was read letter by letter, a number crashed
        raise PrecswitchError(
            "analysis setting 'contrasts' must be a list of contrasts ([A, B], 'A vs B' or {a: A, b: B}); "
            f"got {type(contrasts).__name__} {contrasts!r}")
    # a pair given twice is one comparison (one row per metric, one Holm slot)
    settings["contrasts"] = [list(c) for c in dict.fromkeys(_parse_contrast(c) for c in contrasts)]
    for key, whole in (("margin", False), ("alpha", False), ("power", False), ("bootstrap_resamples", True),
                       ("seed", True)):
        # named, and a count a whole number: 'bootstrap_resamples: .inf' raised OverflowError, 1.5 ran 1 resample
        v = settings[key]
        try:
            if isinstance(v, bool):
                raise ValueError(v)
            x = float(v)
            if whole and not x.is_integer():
                raise ValueError(v)
        except (TypeError, ValueError, OverflowError):
            raise PrecswitchError(
                f"analysis setting '{key}' must be {'a whole number' if whole else 'a number'}, got {v!r}") from None
        settings[key] = int(x) if whole else x
    if not 0 < settings["alpha"] < 1:
        raise PrecswitchError(f"analysis setting 'alpha' must be in (0, 1), got {settings['alpha']}")
    if not 0 < settings["power"] < 1:
        raise PrecswitchError(f"analysis setting 'power' must be in (0, 1), got {settings['power']}")
    if settings["power"] <= settings["alpha"]:
        raise PrecswitchError(
            f"analysis setting 'power' ({settings['power']:g}) must exceed 'alpha' ({settings['alpha']:g}): "
            "with no effect at all a test already rejects with probability alpha, so there is no "
            "smallest detectable difference or number of seeds for a power at or below it")
    if not 0 < settings["margin"] <= 100:
        raise PrecswitchError(f"analysis setting 'margin' must be in (0, 100] accuracy points, got {settings['margin']}")
    if settings["bootstrap_resamples"] < 0:
        raise PrecswitchError("analysis setting 'bootstrap_resamples' must be >= 0 (0 = no bootstrap)")
    settings["baseline"] = str(settings["baseline"])
    return settings


# --------------------------------------------------------------------------------------------------
# Outcomes
# --------------------------------------------------------------------------------------------------
def mark_outcomes(schedules):
    """Add ``outcome`` (ok | degenerate | diverged | skipped | no_eval) and ``used`` (bool) columns."""
    import numpy as np

    df = schedules.copy()
    acc = df["accuracy"].astype(float)
    maj = df["majority_accuracy"].astype(float) if "majority_accuracy" in df else np.nan
    status = df["status"].fillna("ok").astype(str)
    outcome = np.where(
        status.isin(["diverged", "skipped"]), status,
        np.where(~np.isfinite(acc), "no_eval",
                 np.where(np.isfinite(maj) & (acc <= maj + 1e-9), "degenerate", "ok")))
    # any other status string (unknown) counts as failed under its own name
    other = ~status.isin(["ok", "diverged", "skipped"])
    outcome = np.where(other, status, outcome)
    df["outcome"] = outcome
    df["used"] = df["outcome"].isin(["ok", "degenerate"])
    return df


# --------------------------------------------------------------------------------------------------
# Core statistics
# --------------------------------------------------------------------------------------------------
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
        out["std"] = sd
        if sd == 0:
            # n equal values: no t interval. [min, max] = [v, v] covers the median with probability
            # 1 − 2 · 0.5^n, a (1 − alpha) interval only from the sign test's minimum n on (6 at alpha 0.05),
            # as in paired_contrast; below it there is none, not a point that reads as an exact mean
            if n >= _sign_seeds(alpha, "two-sided"):
                out["ci_low"] = out["ci_high"] = out["mean"]
        else:
            lo, hi = stats.t.interval(1 - alpha, n - 1, loc=x.mean(), scale=sd / math.sqrt(n))
            out["ci_low"], out["ci_high"] = float(lo), float(hi)
    return out


def _bootstrap_ci(d, alpha: float, n_boot: int, seed: int) -> tuple[float, float]:
    import numpy as np
    from scipy import stats

    if n_boot <= 0 or d.size < MIN_BOOTSTRAP_PAIRS:  # too few distinct resamples: no interval worth the name
        return math.nan, math.nan
    if np.all(d == d[0]):
        return float(d[0]), float(d[0])
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
                    with_power: bool = True) -> dict:
    """Paired comparison of A and B (same-length arrays, element k = seed k; non-finite pairs dropped).

    kind "difference": d = (A − B) × scale; mean/CI/test on d (TOST vs ±margin when margin is given).
    kind "ratio": d = log(A / B); mean/CI reported back as ratios exp(·) (geometric-mean ratio).
    """
    import numpy as np
    from scipy import stats

    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    ok = np.isfinite(a) & np.isfinite(b)
    if kind == "ratio":
        ok &= (a > 0) & (b > 0)
    a, b = a[ok], b[ok]
    if kind == "ratio":
        d = np.log(a / b)
    elif kind == "difference":
        d = (a - b) * scale
    else:
        raise ValueError(f"kind must be difference or ratio, not {kind!r}")
    n = int(d.size)
    res: dict[str, Any] = {
        "kind": kind, "n_pairs": n, "mean": math.nan, "sd": math.nan, "ci_low": math.nan,
        "ci_high": math.nan, "boot_low": math.nan, "boot_high": math.nan, "p_t": math.nan,
        "p_wilcoxon": math.nan, "tost_p": math.nan, "mde": math.nan, "seeds_needed": math.nan,
        "seeds_needed_equivalence": math.nan, "margin": margin if margin is not None else math.nan,
    }
    if n == 0:
        return res
    mean = float(d.mean())
    res["mean"] = mean
    if n < 2:
        return _ratio_back(res) if kind == "ratio" else res
    sd = float(d.std(ddof=1))
    if sd <= 1e-9 * float(np.max(np.abs(d))):
        # equal differences up to rounding: accuracies k/N give (k+1)/N − k/N that differ in the last bits,
        # an SD of ~1e-15 and a t-test p of ~1e-27; such a spread is no measurement, the difference is exact
        sd = 0.0
    res["sd"] = sd
    if sd == 0:
        # degenerate: every pair differs by exactly the same amount (common with discrete accuracies on a
        # small eval set), the t statistic is undefined. Not p = 0: under the null such ties happen (2 seeds
        # with the same ±1-example difference), so the exact sign test decides (2 · 0.5^n, two-sided).
        # Its interval is the order-statistic one, [min d, max d] = [mean, mean], which covers the median
        # with probability 1 − 2 · 0.5^n: a (1 − alpha) interval only from the sign test's minimum n on
        # (6 pairs at alpha 0.05); below that there is none, not a point (which would read as "the CI lies
        # inside the margin" next to a label saying it does not).
        if n >= _sign_seeds(alpha, "two-sided"):
            res["ci_low"] = res["ci_high"] = mean
        res["p_t"] = 1.0 if mean == 0 else _sign_p(n, "two-sided")
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tt = stats.ttest_rel(a * scale if kind == "difference" else np.log(a),
                                 b * scale if kind == "difference" else np.log(b))
            ci = tt.confidence_interval(1 - alpha)
        res["p_t"] = float(tt.pvalue)
        res["ci_low"], res["ci_high"] = float(ci.low), float(ci.high)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if np.any(d != 0):
                res["p_wilcoxon"] = float(stats.wilcoxon(d).pvalue)
            else:
                res["p_wilcoxon"] = 1.0
        except ValueError:
            pass
    res["boot_low"], res["boot_high"] = _bootstrap_ci(d, alpha, n_boot, seed)
    if kind == "difference" and margin is not None and math.isfinite(margin):
        if sd == 0:  # exact sign tests against both bounds: every pair inside → max of the two = 0.5^n
            res["tost_p"] = _sign_p(n, "greater") if -margin < mean < margin else 1.0
        else:
            from statsmodels.stats.weightstats import ttost_paired

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                res["tost_p"] = float(ttost_paired(a * scale, b * scale, -margin, margin)[0])
    if with_power and kind == "difference":
        res.update(power_analysis(sd, n, alpha, power, margin))
        if margin is not None and math.isfinite(margin):
            res["seeds_needed_equivalence"] = _seeds_for_ci_inside(mean, sd, margin, alpha)
    if kind == "ratio":
        res = _ratio_back(res)
    return res


def _sign_p(n: int, alternative: str) -> float:
    """Exact sign-test p-value when all n paired differences have the same sign (scipy binomtest)."""
    from scipy.stats import binomtest

    return float(binomtest(n, n, 0.5, alternative=alternative).pvalue)


def conf_level(alpha: float) -> str:
    """The confidence level of the (1 − alpha) intervals as printed: '95', '97.5', '99.9' (not rounded to
    an integer: alpha 0.001 is not a '100%' interval)."""
    return f"{round((1 - alpha) * 100, 6):g}"


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
                   margin: float | None = None) -> dict:
    """Minimum detectable paired effect at ``power`` for n pairs, and pairs needed to detect ``margin``."""
    from statsmodels.stats.power import TTestPower

    out = {"mde": math.nan, "seeds_needed": math.nan}
    if not math.isfinite(sd):
        return out
    tp = TTestPower()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if n >= 2:
            if sd == 0:  # the sign test: any consistent difference once n reaches its minimum, none before
                out["mde"] = 0.0 if n >= _sign_seeds(alpha, "two-sided") else math.inf
            else:
                out["mde"] = _mde_dz(tp, n, alpha, power) * sd
        if margin is not None and math.isfinite(margin):
            if sd == 0:  # the degenerate test is a sign test (see paired_contrast)
                out["seeds_needed"] = _sign_seeds(alpha, "two-sided")
            else:
                try:
                    nn = float(tp.solve_power(effect_size=margin / sd, nobs=None, alpha=alpha,
                                              power=power, alternative="two-sided"))
                    out["seeds_needed"] = float(max(2, math.ceil(nn)))
                except Exception:  # noqa: BLE001
                    pass
                if not math.isfinite(out["seeds_needed"]) or out["seeds_needed"] <= 10:
                    # few pairs: solve_power gives up (NaN from es ≈ 6) or stops at its bound (2.0 at
                    # es = 10, where 2 pairs have power 0.73); scan the power curve instead
                    out["seeds_needed"] = _seeds_by_scan(margin / sd, alpha, power)
    return out


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


def _mde_dz(tp, n: int, alpha: float, power: float) -> float:
    """Smallest standardized paired effect detected with ``power`` by n pairs at ``alpha``. statsmodels'
    solve_power is taken when its answer checks out against the exact power; at 2-3 pairs with a Holm-divided
    alpha it returns a non-root without raising (e.g. 5.0 SD at n = 3, alpha 0.0125, where the power is
    0.61 and the answer 6.55), so the root is then found on the exact power."""
    from scipy.optimize import brentq

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
    """Holm-adjusted p-values (statsmodels multipletests); NaN entries stay NaN and are not counted."""
    import numpy as np
    from statsmodels.stats.multitest import multipletests

    import gc

    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    m = np.isfinite(p)
    if m.any():
        # statsmodels' Holm branch calls gc.collect() on every call (~0.1 s once pandas/matplotlib are
        # loaded); skip that collection only, the arithmetic is statsmodels' own.
        collect = gc.collect
        gc.collect = _NoCollect.collect
        try:
            out[m] = multipletests(p[m], alpha=alpha, method="holm")[1]
        finally:
            gc.collect = collect
    return [float(v) for v in out]


class _NoCollect:
    @staticmethod
    def collect(*_a: Any, **_k: Any) -> int:
        return 0


def classify(row: dict, alpha: float, higher_is_better: bool | None = True) -> str:
    """better | worse | equivalent | inconclusive | insufficient data (see module docstring)."""
    n = row.get("n_pairs", 0) or 0
    mean = row.get("mean", math.nan)
    if n < 2 or not math.isfinite(mean):
        return "insufficient data"
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


# --------------------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------------------
def _summary_rows(df, level: str, group_col: str, metrics: list[Metric], alpha: float,
                  counts: dict[str, dict]) -> list[dict]:
    rows = []
    for g, sub in df.groupby(group_col, sort=True, dropna=False):
        used = sub[sub["used"]]
        for m in metrics:
            if m.column not in sub:
                continue
            vals = used[m.column].astype(float) * m.scale
            if m.kind == "count":  # counters: over every run, failed included (they carry the cause)
                vals = sub[m.column].astype(float) * m.scale
            d = describe(vals, alpha)
            rows.append({"level": level, "group": g, "metric": m.column, "label": m.label, "unit": m.unit,
                         **counts.get(g, {}), **d, "sum": float(vals.sum(min_count=1))
                         if m.kind == "count" else math.nan})
    return rows


def _counts(df, group_col: str) -> dict[str, dict]:
    out = {}
    for g, sub in df.groupby(group_col, sort=True, dropna=False):
        out[g] = {
            "n_runs": int(len(sub)),
            "n_used": int(sub["used"].sum()),
            "n_failed": int((~sub["used"]).sum()),
            "n_diverged": int((sub["outcome"] == "diverged").sum()),
            "n_skipped": int((sub["outcome"] == "skipped").sum()),
            "n_degenerate": int((sub["outcome"] == "degenerate").sum()),
        }
    return out


def _aligned(df, group_col: str, a: str, b: str, col: str):
    """``col`` of A and of B as Series aligned by seed (only seeds where both rows are used), and the seeds."""
    sa = df[(df[group_col] == a) & df["used"]].set_index("seed")[col]
    sb = df[(df[group_col] == b) & df["used"]].set_index("seed")[col]
    sa = sa[~sa.index.duplicated()]
    sb = sb[~sb.index.duplicated()]
    seeds = sorted(set(sa.index) & set(sb.index))
    return sa.reindex(seeds), sb.reindex(seeds), seeds


def _pair(df, group_col: str, a: str, b: str, col: str):
    """Values of ``col`` for A and B aligned by seed (only seeds where both rows are used)."""
    sa, sb, seeds = _aligned(df, group_col, a, b, col)
    return sa.astype(float).to_numpy(), sb.astype(float).to_numpy(), seeds


#: the processes whose peak memory a memory column of the schedules table takes (a runs table's
#: peak_memory_bytes is its own run's)
MEMORY_STAGES = {"stage1_peak_memory_bytes": ("stage1",), "stage2_peak_memory_bytes": ("stage2",),
                 "peak_memory_bytes": ("stage1", "stage2")}


def _process_starts(runs) -> dict[str, str]:
    """run_id → process_start (warm | cold) of the runs whose peak memory is the process's RSS on a CPU, when
    those runs were started both ways; {} otherwise. A warm-started (forked) process never touches the
    shared-library pages a cold one loads, so its RSS is ~120 MB lower (config/README.md, warm_start):
    a memory comparison may pair only processes started the same way."""
    if not {"run_id", "process_start", "memory_kind"} <= set(runs.columns):
        return {}
    cpu = runs[(runs["memory_kind"] == "cpu_peak_rss") & runs["process_start"].notna()]
    if cpu["process_start"].astype(str).nunique() < 2:
        return {}
    return dict(zip(cpu["run_id"].astype(str), cpu["process_start"].astype(str)))


def _with_start_keys(df, starts: dict[str, str]):
    """df plus, per memory column, ``_start_of_<column>``: how the process(es) it measures started ('' when
    unknown or not CPU RSS). :func:`_contrast_rows` pairs a seed's memory only when both sides' keys match."""
    if not starts:
        return df
    df = df.copy()

    def start(ids):
        return ids.map(lambda r: starts.get(str(r), "") if isinstance(r, str) else "").astype(str)

    if "stage1_run_id" in df and "stage2_run_id" in df:  # the schedules table
        by_stage = {"stage1": start(df["stage1_run_id"]), "stage2": start(df["stage2_run_id"])}
        for col, stages in MEMORY_STAGES.items():
            if col in df:
                df[f"_start_of_{col}"] = by_stage[stages[0]].str.cat([by_stage[x] for x in stages[1:]], sep="/")
    elif "run_id" in df and "peak_memory_bytes" in df:  # a runs table
        df["_start_of_peak_memory_bytes"] = start(df["run_id"])
    return df


def _contrast_rows(df, group_col: str, families: list[tuple[str, list[tuple[str, str]]]], metrics: list[Metric],
                   settings: dict) -> list[dict]:
    """Paired contrasts, one row per (family, pair, metric). Holm runs per metric over the *distinct*
    comparisons of all the given families together (A vs B and B vs A, or the same pair in two families,
    count once and share one adjusted p): a comparison the verdict reports twice (a named contrast that is
    also a vs-baseline one) then gets one p and one label, not two that may disagree."""
    import numpy as np

    alpha, margin = settings["alpha"], settings["margin"]
    rows = []
    for family, pairs in families:
        for m in metrics:
            if m.column not in df:
                continue
            for a, b in pairs:
                xa, xb, seeds = _pair(df, group_col, a, b, m.column)
                mixed_starts = 0
                if f"_start_of_{m.column}" in df:  # CPU RSS of warm- and cold-started processes: not comparable
                    ka, kb, _ = _aligned(df, group_col, a, b, f"_start_of_{m.column}")
                    differ = (ka.to_numpy() != kb.to_numpy()) & np.isfinite(xa) & np.isfinite(xb)
                    mixed_starts = int(differ.sum())
                    xa, xb = np.where(differ, np.nan, xa), np.where(differ, np.nan, xb)
                # ``seeds`` lists the pairs that enter the statistics (paired_contrast drops non-finite
                # values and, for ratios, non-positive ones), so it always has n_pairs entries
                keep = [math.isfinite(x) and math.isfinite(y) and (m.kind != "ratio" or (x > 0 and y > 0))
                        for x, y in zip(xa, xb)]
                seeds = [sd for sd, k in zip(seeds, keep) if k]
                scale = 100.0 if m.delta_unit == "points" or m.delta_unit == "MCC x 100" else 1.0
                r = paired_contrast(
                    xa, xb, kind=m.kind, scale=scale, margin=margin if m.margin else None, alpha=alpha,
                    power=settings["power"], n_boot=settings["bootstrap_resamples"], seed=settings["seed"],
                    with_power=True,
                )
                r.update({"family": family, "contrast": f"{a} vs {b}", "a": a, "b": b, "metric": m.column,
                          "label": m.label, "unit": m.delta_unit,
                          "higher_is_better": m.higher_is_better, "seeds": " ".join(str(s) for s in seeds),
                          "n_mixed_starts": mixed_starts})
                rows.append(r)
    for m in metrics:
        mrows = [r for r in rows if r["metric"] == m.column]
        keys = list(dict.fromkeys(frozenset((r["a"], r["b"])) for r in mrows))
        first = {k: next(r for r in mrows if frozenset((r["a"], r["b"])) == k) for k in keys}
        ps = dict(zip(keys, holm([first[k]["p_t"] for k in keys], alpha)))
        pw = dict(zip(keys, holm([first[k]["p_wilcoxon"] for k in keys], alpha)))
        # power for the test the label uses: Holm's strictest threshold is alpha / m (m comparisons with a p)
        m_family = max(1, sum(math.isfinite(p) for p in ps.values()))
        for r in mrows:
            k = frozenset((r["a"], r["b"]))
            r["p_holm"] = ps[k]
            r["p_wilcoxon_holm"] = pw[k]
            if r["kind"] == "difference" and m_family > 1:
                r.update(power_analysis(r["sd"], r["n_pairs"], alpha / m_family, settings["power"],
                                        margin if m.margin else None))
            r["classification"] = classify(r, alpha, m.higher_is_better)
            r["within_margin"] = within_margin(r)
    return rows


#: schedule-level stage-1 metric → the stage-1 (pretrain run) metric it copies
STAGE1_OF_SCHEDULE = {"stage1_train_seconds": "train_seconds", "stage1_samples_per_second": "samples_per_second",
                      "stage1_peak_memory_bytes": "peak_memory_bytes", "stage1_eval_loss": "eval_loss",
                      "stage1_mlm_accuracy": "mlm_accuracy"}


def _named_stage1_pairs(sched, named: list, specs: set, baseline) -> list[tuple]:
    """The stage-1 runs a named contrast compares when its two schedules start from different stage 1s that are
    not already compared (with the stage-1 baseline): e.g. purefp16eps-fp32 vs fp32eps-fp32 compares
    pure_fp16-with-adam_eps0.0001 with fp32-with-adam_eps0.0001, pure fp16 against fp32 at one recipe, which the
    comparisons with fp32 (another recipe) do not. In the stage-1 Holm family with the others."""
    col = "stage1_spec" if "stage1_spec" in sched else "stage1_precision"
    pairs: list[tuple] = []
    for a, b in named:
        sa, sb = _first(sched[sched["schedule"] == a], col), _first(sched[sched["schedule"] == b], col)
        if sa is None or sb is None or sa == sb or not {sa, sb} <= specs or baseline in (sa, sb):
            continue
        if (sa, sb) not in pairs and (sb, sa) not in pairs:
            pairs.append((sa, sb))
    return pairs


def _share_stage1_labels(rows: list[dict], stage_rows: list[dict], sched, alpha: float) -> None:
    """A schedule comparison's stage-1 metric (bf16-fp32 vs fp32-fp32: stage-1 train time) compares the very
    runs a ``stage1`` row compares (amp_bf16 vs fp32). Both are reported, so they share that row's Holm p
    and label; adjusted in the schedule family (where fp16-fp32 and fp16-fp16 repeat amp_fp16 vs fp32)
    the same numbers could be 'saved' in one paragraph and 'not significant' in the next."""
    spec = {}
    for s, sub in sched.groupby("schedule", sort=False):
        spec[s] = _stage1_spec(sub)
    by_key = {(r["metric"], frozenset((r["a"], r["b"]))): r for r in stage_rows}
    for r in rows:
        m = STAGE1_OF_SCHEDULE.get(r["metric"])
        pa, pb = spec.get(r["a"]), spec.get(r["b"])
        st = by_key.get((m, frozenset((pa, pb)))) if m and pa and pb and pa != pb else None
        if st is None or sorted(str(x) for x in r["seeds"].split()) != sorted(str(x) for x in st["seeds"].split()):
            continue  # not the same stage-1 runs (e.g. a seed whose stage 2 failed): keep its own family
        for k in ("p_holm", "p_wilcoxon_holm", "mde", "seeds_needed", "seeds_needed_equivalence"):
            if k in st:
                r[k] = st[k]
        r["classification"] = classify(r, alpha, r["higher_is_better"])


DELTA_COLUMNS = [
    "family", "contrast", "a", "b", "metric", "label", "kind", "unit", "n_pairs", "mean", "sd",
    "ci_low", "ci_high", "boot_low", "boot_high", "p_t", "p_holm", "p_wilcoxon", "p_wilcoxon_holm",
    "margin", "tost_p", "within_margin", "mde", "seeds_needed", "seeds_needed_equivalence",
    "classification", "higher_is_better", "seeds", "n_mixed_starts",
]
SUMMARY_COLUMNS = [
    "level", "group", "metric", "label", "unit", "n", "mean", "std", "ci_low", "ci_high", "min", "max",
    "sum", "n_runs", "n_used", "n_failed", "n_diverged", "n_skipped", "n_degenerate",
]


def _first(df, col: str):
    if col not in df:
        return None
    v = df[col].dropna()
    v = v[v.astype(str) != ""]
    return None if v.empty else v.mode().iloc[0]


def _stage1_spec(sub) -> Any:
    """A schedule's stage 1: its spec (amp_fp16-to-fp32-at80 for an in-stage switch), else the precision."""
    return _first(sub, "stage1_spec") or _first(sub, "stage1_precision")


def _provenance(runs) -> dict:
    out = {}
    for c in PROVENANCE_COLUMNS:
        if c in runs:
            vals = sorted({str(v) for v in runs[c].dropna() if str(v) != ""})
            out[c] = vals
    return out


def _has_stage1(sub) -> bool:
    if "stage1_run_id" in sub:
        v = sub["stage1_run_id"]
        return bool((v.notna() & (v.astype(str) != "")).any())
    return bool(sub["stage1_train_seconds"].astype(float).notna().any()) if "stage1_train_seconds" in sub else False


def _stage1_relation(sched, a: str, b: str) -> str:
    """How the stage 1 of schedules A and B relate, seed by seed.

    ``shared``: every seed both have starts from the very same stage-1 run (same ``stage1_run_id``), so
    stage 1 adds identical time to both and its peak memory is the same measurement;
    ``none``: A or B has no stage-1 run at all (fine-tunes ``model.init``);
    ``different``: otherwise.
    """
    col = "stage1_run_id"
    if not all(_has_stage1(sched[sched["schedule"] == s]) for s in (a, b)):
        return "none"
    if col not in sched:  # older schedules table: the same stage-1 spec means the same runs
        spec = "stage1_spec" if "stage1_spec" in sched else "stage1_precision"
        sa, sb = _first(sched[sched["schedule"] == a], spec), _first(sched[sched["schedule"] == b], spec)
        return "shared" if sa is not None and sa == sb else "different"
    ids = {}
    for s in (a, b):
        sub = sched[sched["schedule"] == s]
        v = sub.set_index("seed")[col]
        v = v[~v.index.duplicated()]
        v = v[v.notna() & (v.astype(str) != "")]
        if v.empty:
            return "none"
        ids[s] = v
    seeds = sorted(set(ids[a].index) & set(ids[b].index), key=str)
    if seeds and all(str(ids[a][k]) == str(ids[b][k]) for k in seeds):
        return "shared"
    return "different"


def _load_check(runs) -> dict | None:
    """Runs on a CPU whose 1-minute load average (start or end of the training loop) exceeded the
    machine's CPU count by more than LOAD_OVERSUBSCRIBED: the machine was oversubscribed and their
    timings are distorted. None when the
    runs table has no load-average or cpu_count columns (runs from before they were recorded)."""
    import pandas as pd

    cols = [c for c in LOAD_COLUMNS if c in runs]
    if not cols or "cpu_count" not in runs or runs.empty:
        return None
    df = runs
    if "device" in df:
        df = df[df["device"].astype(str).str.startswith("cpu")]
    if df.empty:
        return None
    load = df[cols].apply(pd.to_numeric, errors="coerce").max(axis=1)
    cpus = pd.to_numeric(df["cpu_count"], errors="coerce")
    known = load.notna() & cpus.notna() & (cpus > 0)
    if not known.any():
        return None
    over = known & (load > LOAD_OVERSUBSCRIBED * cpus)
    return {
        "n_runs_checked": int(known.sum()),
        "n_oversubscribed": int(over.sum()),
        "oversubscribed_runs": sorted(str(r) for r in df.loc[over, "run_id"]) if "run_id" in df else [],
        "max_load": float(load[known].max()),
        "cpu_count": sorted({int(c) for c in cpus[known]}),
        "threshold": LOAD_OVERSUBSCRIBED,
    }


def _jsonable(o: Any) -> Any:
    if isinstance(o, dict):
        return {str(k): _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if hasattr(o, "item") and not isinstance(o, (str, bytes)):
        try:
            o = o.item()
        except (TypeError, ValueError):
            return str(o)
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return o


def _failure_reason(r: dict) -> str | None:
    """'stage 1 diverged: <reason>; stage 2 skipped: <reason>' for the stages that did not finish ok."""
    bits = []
    for k in ("stage1", "stage2"):
        st = r.get(f"{k}_status")
        if isinstance(st, str) and st != "ok":
            reason = r.get(f"{k}_status_reason")
            bits.append(f"stage {k[-1]} {st}" + (f": {reason}" if isinstance(reason, str) and reason else ""))
    if not bits and r.get("outcome") == "no_eval":
        bits.append("no finite accuracy")
    return "; ".join(bits) or None


def compute(runs, schedules, settings: dict) -> tuple[Any, Any, dict]:
    """Return (summary DataFrame, deltas DataFrame, stats dict)."""
    import pandas as pd

    baseline = settings["baseline"]
    sched = mark_outcomes(schedules)
    available = sorted(sched["schedule"].dropna().unique())
    if baseline not in available:
        raise PrecswitchError(
            f"baseline schedule '{baseline}' has no runs; available schedules: "
            f"{', '.join(available) if available else '(none)'} (set analysis setting 'baseline')"
        )
    alpha = settings["alpha"]
    starts = _process_starts(runs)
    sched = _with_start_keys(sched, starts)

    # ---- schedule level
    counts = _counts(sched, "schedule")
    summary_rows = _summary_rows(sched, "schedule", "schedule", SCHEDULE_METRICS + SCHEDULE_COUNTERS,
                                 alpha, counts)
    others = [s for s in available if s != baseline]
    named, missing = [], []
    for a, b in settings["contrasts"]:
        if a in available and b in available and a != b:
            named.append((a, b))
        else:
            missing.append([a, b])
    # one Holm family per metric over every distinct schedule comparison reported (vs baseline and named)
    delta_rows = _contrast_rows(sched, "schedule", [("vs_baseline", [(s, baseline) for s in others]),
                                                    ("named", named)], SCHEDULE_METRICS, settings)

    # ---- stage 1 (pretrain runs by precision) and stage 2 (finetune runs by precision)
    stage_rows = []
    stage1_baseline = None
    runs = runs.copy()
    if "status" in runs:
        st = runs["status"].fillna("ok").astype(str)
        runs["outcome"] = st
        runs["used"] = st == "ok"
    pre = runs[runs["stage"] == "pretrain"] if "stage" in runs else runs.iloc[0:0]
    fin = runs[runs["stage"] == "finetune"] if "stage" in runs else runs.iloc[0:0]
    stage1_counts, stage2_counts = {}, {}
    if len(pre):
        # stage-1 runs are grouped by their spec: the precision, or e.g. amp_fp16-to-fp32-at80 for an
        # in-stage switch (a switched stage 1 is its own group, not a duplicate of amp_fp16)
        pre = pre.copy()
        if "spec" in pre:
            pre["precision"] = pre["spec"].where(pre["spec"].notna(), pre["precision"])
        pre = _with_start_keys(pre.drop_duplicates(["precision", "seed"]), starts)
        stage1_counts = _counts(pre, "precision")
        summary_rows += _summary_rows(pre, "stage1", "precision", STAGE1_METRICS + RUN_COUNTERS, alpha,
                                      stage1_counts)
        base_col = "stage1_spec" if "stage1_spec" in sched else "stage1_precision"
        stage1_baseline = _first(sched[sched["schedule"] == baseline], base_col)
        if stage1_baseline is None or stage1_baseline not in set(pre["precision"]):
            stage1_baseline = "fp32" if "fp32" in set(pre["precision"]) else None
        if stage1_baseline is not None:
            precs = sorted(p for p in pre["precision"].unique() if p != stage1_baseline)
            pairs = [(p, stage1_baseline) for p in precs] + _named_stage1_pairs(
                sched, named, set(pre["precision"]), stage1_baseline)
            stage_rows = _contrast_rows(pre, "precision", [("stage1", pairs)], STAGE1_METRICS, settings)
    if len(fin):
        # a finished stage 2 of a schedule whose stage 1 failed: the schedule is left out, so is the run
        failed_init = []
        if {"stage1_status", "stage2_run_id"} <= set(sched.columns):
            s1 = sched["stage1_status"]
            failed_init = sched.loc[s1.notna() & (s1.astype(str) != "ok"), "stage2_run_id"].dropna()
        fin = fin.copy()
        fin["used"] = fin["used"] & ~fin["run_id"].astype(str).isin({str(r) for r in failed_init})
        stage2_counts = _counts(fin, "precision")
        summary_rows += _summary_rows(fin, "stage2", "precision", STAGE2_METRICS + RUN_COUNTERS, alpha,
                                      stage2_counts)
    _share_stage1_labels(delta_rows, stage_rows, sched, alpha)
    delta_rows += stage_rows
    stage1_summary = {}
    if len(pre):
        for p, sub in pre.groupby("precision", sort=True):
            used = sub[sub["used"]]
            stage1_summary[p] = {m.column: describe(used[m.column].astype(float) * m.scale, alpha)
                                 for m in STAGE1_METRICS if m.column in used}
    stage1_relation = {f"{a} vs {b}": _stage1_relation(sched, a, b)
                       for a, b in [(s, baseline) for s in others] + named}

    summary = pd.DataFrame(summary_rows).reindex(columns=SUMMARY_COLUMNS)
    deltas = pd.DataFrame(delta_rows).reindex(columns=DELTA_COLUMNS)

    # ---- per-schedule facts for the verdict
    sched_info = {}
    all_seeds = set(sched["seed"])
    for s in available:
        sub = sched[sched["schedule"] == s]
        missing_seeds = sorted(all_seeds - set(sub["seed"]), key=str)
        acc = describe(sub.loc[sub["used"], "accuracy"].astype(float) * 100, alpha)
        sched_info[s] = {
            # the spec (amp_fp16-to-fp32-at80 for an in-stage switch), else the precision
            "stage1_precision": _stage1_spec(sub),
            # a stage-1 run of its own (a finetune-only schedule names init_precision above, runs none)
            "has_stage1": _has_stage1(sub),
            "stage2_precision": _first(sub, "stage2_spec") or _first(sub, "stage2_precision"),
            **counts[s],
            "failed": [{"seed": _jsonable(r["seed"]), "outcome": r["outcome"], "reason": _failure_reason(r)}
                       for r in sub[~sub["used"]].to_dict("records")],
            "degenerate_seeds": [_jsonable(v) for v in sub.loc[sub["outcome"] == "degenerate", "seed"]],
            "accuracy_points": acc,
            "skipped_steps": float(sub["skipped_steps"].astype(float).sum(min_count=1)),
            "stage1_skipped_steps": float(sub.get("stage1_skipped_steps", pd.Series(dtype=float))
                                          .astype(float).sum(min_count=1)),
            "stage2_skipped_steps": float(sub.get("stage2_skipped_steps", pd.Series(dtype=float))
                                          .astype(float).sum(min_count=1)),
            "nonfinite_losses": float(sub["nonfinite_losses"].astype(float).sum(min_count=1)),
            "stage1_loss_scale_min": float(sub.get("stage1_loss_scale_min", pd.Series(dtype=float))
                                           .astype(float).min()),
            "stage2_loss_scale_min": float(sub.get("stage2_loss_scale_min", pd.Series(dtype=float))
                                           .astype(float).min()),
            "seeds": [_jsonable(v) for v in sorted(sub["seed"].unique())],
            "sweep": _first(sub, "sweep") if "sweep" in sub else None,
            "sweep_at": _first(sub, "sweep_at") if "sweep_at" in sub else None,
            # seeds other schedules have but this one lacks (no finetune metrics.json was given)
            "missing_seeds": [_jsonable(v) for v in missing_seeds],
        }
    stats = {
        "question": QUESTION,
        "settings": settings,
        "baseline": baseline,
        "stage1_baseline_precision": stage1_baseline,
        "failure_rule": FAILURE_RULE,
        "provenance": _provenance(runs),
        "schedules": sched_info,
        "stage1_precisions": stage1_counts,
        "stage2_precisions": stage2_counts,
        "named_contrasts": [list(p) for p in named],
        # "A vs B" → shared | different | none (see _stage1_relation): with a shared stage 1, or none on
        # one side, the verdict reports stage-2 time and memory instead of the totals
        "stage1_relation": stage1_relation,
        # stage-1 mean, SD and CI per precision and metric (eval loss in nats): the verdict states
        # stage-1 loss differences relative to the baseline precision's loss
        "stage1_summary": stage1_summary,
        "bootstrap_min_pairs": MIN_BOOTSTRAP_PAIRS,
        "load": _load_check(runs),
        # CPU-RSS runs started both ways (warm: forked from the warm-start server; cold): how many of each,
        # and the paired seeds the memory comparisons left out because their two sides started differently
        "process_starts": ({k: sum(v == k for v in starts.values()) for k in sorted(set(starts.values()))}
                           if starts else None),
        "memory_pairs_mixed_starts": int(sum(r.get("n_mixed_starts") or 0 for r in delta_rows)),
        "missing_contrasts": missing,
        "deltas": deltas.to_dict("records"),
    }
    return summary, deltas, _jsonable(stats)


# --------------------------------------------------------------------------------------------------
# Rendering and I/O
# --------------------------------------------------------------------------------------------------
def fmt_num(v: float, nd: int = 2, sig: int = 2, sign: bool = False, sci: bool = False) -> str:
    """A number with at least ``nd`` decimals and at least ``sig`` significant digits, so a small value
    never prints as 0.000: 0.0121 → ``0.012``, 78.88 → ``78.88``; below 0.001 (or with ``sci``) in
    scientific notation (−6.6e−5). A minus sign is U+2212; ``sign`` adds + to positive values."""
    if v == 0:
        s = f"{0.0:.{nd}f}"
    elif abs(v) < 1e-3 or sci:
        mant, exp = f"{v:.{max(sig - 1, 0)}e}".split("e")
        s = f"{mant}e{int(exp)}"
    else:
        mag = math.floor(math.log10(abs(v)))
        dec = max(nd, sig - 1 - mag)
        s = f"{v:.{dec}f}"
    if sign and v > 0:
        s = "+" + s
    return s.replace("-", "−")


def fmt_triple(mean: Any, lo: Any, hi: Any, nd: int = 2, sig: int = 2,
               sign: bool = True) -> tuple[str, str, str]:
    """A difference and its CI bounds in one style: all in scientific notation when the mean is below
    0.001 (−6.6e−5 [−1.0e−4, −3.1e−5]; −1.6e−4 [−1.2e−3, +8.8e−4]), else with the decimals that give the
    mean ``sig`` significant digits (at least ``nd``): +0.012 [−0.126, +0.150], −1.04 [−5.80, +3.71].
    "n/a" for a missing value."""
    def ok(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    vals = [float(v) for v in (mean, lo, hi) if ok(v)]
    if not vals:
        return "n/a", "n/a", "n/a"
    ref = abs(mean) if ok(mean) and mean != 0 else max(abs(v) for v in vals)
    if 0 < ref < 1e-3:
        out = [fmt_num(float(v), nd, sig, sign, sci=True) if ok(v) else "n/a" for v in (mean, lo, hi)]
    else:
        dec = max(nd, sig - 1 - math.floor(math.log10(ref))) if ref > 0 else nd
        out = [(f"{v:+.{dec}f}" if sign else f"{v:.{dec}f}").replace("-", "−") if ok(v) else "n/a"
               for v in (mean, lo, hi)]
    return out[0], out[1], out[2]


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


def diff_label(r: dict) -> str:
    """'better, Holm p 0.031' / 'inconclusive: not significant after Holm, p 0.583' for a delta row."""
    c = r.get("classification") or "insufficient data"
    if isinstance(c, float):
        c = "insufficient data"
    if c in ("better", "worse", "higher", "lower"):
        return f"{c}, Holm p {_pfmt(r.get('p_holm'))}"
    return f"{c}: {not_significant(r)}"


def not_significant(r: dict) -> str:
    """'not significant after Holm, p 0.081', plus '; only the unadjusted CI excludes ×1' where the
    unadjusted interval would suggest otherwise (the reason the two do not contradict each other)."""
    c = r.get("classification") or "insufficient data"
    if isinstance(c, float) or c == "insufficient data":
        return "too few paired seeds to test"
    s = f"not significant after Holm, p {_pfmt(r.get('p_holm'))}"
    null = 1.0 if r.get("kind") == "ratio" else 0.0
    lo, hi = r.get("ci_low"), r.get("ci_high")
    if (isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and math.isfinite(lo) and math.isfinite(hi)
            and (lo > null or hi < null)):
        s += f"; only the unadjusted CI excludes {'×1' if null else '0'}"
    return s


#: the usual alphas: a p-value below one of them never prints as it (fmt_p)
P_THRESHOLDS = (0.2, 0.1, 0.05, 0.025, 0.01, 0.005)


def fmt_p(v: Any) -> str:
    """A p-value to 3 decimals ('< 0.001' below), with more digits where 3 decimals would round it up to a
    usual alpha (P_THRESHOLDS) that it is below: Holm p 0.0496 prints '0.0496', not '0.050' beside the label
    'better', which says p < 0.05."""
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        return "n/a"
    if v < 0.001:
        return "< 0.001"
    s = f"{v:.3f}"
    if v < float(s) and float(s) in P_THRESHOLDS:
        for nd in range(4, 10):
            s = f"{v:.{nd}f}"
            if float(s) < v or float(s) not in P_THRESHOLDS:
                break
    return s


_pfmt = fmt_p


def _fmt(v: Any, nd: int = 2, sig: int | None = None) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, float):
        return fmt_num(v, nd, sig) if sig else f"{v:.{nd}f}"
    return str(v)


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |",
             "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _mean_ci(d: dict, nd: int = 2, scale: float = 1.0, sig: int = 3) -> str:
    if not d or d.get("n", 0) == 0 or d.get("mean") is None or not math.isfinite(d.get("mean", math.nan)):
        return "–"
    s = _fmt(d["mean"] * scale, nd, sig)
    lo, hi = d.get("ci_low", math.nan), d.get("ci_high", math.nan)
    if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi):
        s += f" [{_fmt(lo * scale, nd, sig)}, {_fmt(hi * scale, nd, sig)}]"
    return s


def render_summary_md(summary, settings: dict, deltas=None, stage1_baseline: str | None = None) -> str:
    """summary.md: the summary tables; with ``deltas`` and ``stage1_baseline`` also the stage-1 paired
    differences (the verdict's "Stage 1 on its own" numbers, formatted alike)."""
    conf = conf_level(settings["alpha"])
    out = ["# Summary per schedule and stage\n",
           (f"Mean [{conf}% t CI] over the runs used (ok and degenerate; failed runs excluded and counted). "
            "Accuracy, F1 and masked-token accuracy in %, times in seconds of the training loop, memory in MiB. "
            "Values keep at least 3 significant digits (below 0.001 in scientific notation, e.g. 6.6e−5), "
            "so a small number never reads as zero. Differences between schedules, paired by seed, are in "
            "deltas.csv and the verdict.\n")]

    def block(level: str, title: str, metrics: list[Metric]):
        sub = summary[summary["level"] == level]
        if sub.empty:
            return
        header = ["group", "runs", "used", "failed", "degenerate"] + [
            f"{m.label} ({'%' if m.unit == 'fraction' else m.unit})" for m in metrics]
        rows = []
        for g, gs in sub.groupby("group", sort=True):
            first = gs.iloc[0]
            r = [g, int(first["n_runs"]), int(first["n_used"]), int(first["n_failed"]), int(first["n_degenerate"])]
            for m in metrics:
                mm = gs[gs["metric"] == m.column]
                if mm.empty:
                    r.append("–")
                    continue
                d = mm.iloc[0].to_dict()
                scale = 100.0 if m.unit == "fraction" else 1.0
                nd = 3 if m.unit in ("-1..1", "nats") else (1 if m.unit in ("MiB", "samples/s") else 2)
                if m.kind == "count":
                    r.append(_fmt(d.get("sum"), 0))
                else:
                    r.append(_mean_ci(d, nd, scale))
            rows.append(r)
        out.append(f"## {title}\n")
        out.append(md_table(header, rows) + "\n")

    block("schedule", "Per schedule: accuracy", [m for m in SCHEDULE_METRICS if m.column in
                                                  ("accuracy", "f1", "mcc")] + SCHEDULE_COUNTERS)
    block("schedule", "Per schedule: time and memory",
          [m for m in SCHEDULE_METRICS if m.kind == "ratio"])
    block("stage1", "Stage 1 (pre-training) by precision", STAGE1_METRICS + RUN_COUNTERS)
    block("stage2", "Stage 2 (fine-tuning) by precision (all schedules pooled; inits differ; a run whose "
          "stage 1 failed is counted as failed)",
          STAGE2_METRICS + RUN_COUNTERS)
    if deltas is not None and stage1_baseline and len(deltas):
        st1 = deltas[deltas["family"] == "stage1"]
        if len(st1):
            def loss_of(group):
                bl = summary[(summary["level"] == "stage1") & (summary["group"] == group)
                             & (summary["metric"] == "eval_loss")]
                return float(bl["mean"].iloc[0]) if len(bl) else math.nan

            def row(name, g, base_loss):
                el = g[g["metric"] == "eval_loss"]
                ma = g[g["metric"] == "mlm_accuracy"]
                el = el.iloc[0].to_dict() if len(el) else None
                ma = ma.iloc[0].to_dict() if len(ma) else None
                n = (el or ma or {}).get("n_pairs")
                r = [name, int(n) if isinstance(n, (int, float)) and math.isfinite(n) else "–"]
                if el is not None and math.isfinite(float(el.get("mean", math.nan))):
                    m, lo, hi = fmt_triple(el["mean"], el.get("ci_low"), el.get("ci_high"))
                    r.append(f"{m} [{lo}, {hi}]")
                    rel = el["mean"] / base_loss * 100 if math.isfinite(base_loss) and base_loss > 0 else math.nan
                    r.append(fmt_num(rel, 1, 2, True) + "%" if math.isfinite(rel) else "–")
                    lab = diff_label(el)
                    if loss_negligible(el.get("ci_low"), el.get("ci_high"), base_loss):
                        lab += "; negligible"
                    r.append(lab)
                else:
                    r += ["–", "–", "–"]
                if ma is not None and math.isfinite(float(ma.get("mean", math.nan))):
                    m, lo, hi = fmt_triple(ma["mean"], ma.get("ci_low"), ma.get("ci_high"))
                    r += [f"{m} [{lo}, {hi}]", diff_label(ma)]
                else:
                    r += ["–", "–"]
                return r

            pct = NEGLIGIBLE_LOSS_FRACTION * 100
            out.append(f"## Stage 1: paired differences against {stage1_baseline}\n")
            out.append(f"A − {stage1_baseline}, paired by seed (the same rows as deltas.csv, family `stage1`): mean "
                       f"[unadjusted {conf}% t CI]; labels from the Holm-adjusted p over the stage-1 comparisons. "
                       f"The eval-loss difference is also given in % of {stage1_baseline}'s mean eval loss; "
                       f"*negligible* = the whole CI lies within ±{pct:g}% of that loss.\n")
            vs_base = st1[st1["b"] == stage1_baseline]
            rows = [row(a, g, loss_of(stage1_baseline)) for a, g in vs_base.groupby("a", sort=True)]
            out.append(md_table(["precision", "pairs", "eval loss Δ (nats)", f"Δ in % of {stage1_baseline}'s loss",
                                 "eval loss label", "masked-token accuracy Δ (points)", "accuracy label"], rows)
                       + "\n")
            others = st1[st1["b"] != stage1_baseline]
            if len(others):
                out.append("## Stage 1: paired differences of the named contrasts' stage 1s\n")
                out.append("A − B for a named contrast whose two schedules start from different stage 1s, neither of "
                           f"them {stage1_baseline} (e.g. two precisions at one set of `overrides`); the same Holm "
                           "family as above, the loss difference in % of B's mean eval loss.\n")
                rows = [row(f"{a} − {b}", g, loss_of(b))
                        for (a, b), g in others.groupby(["a", "b"], sort=False)]
                out.append(md_table(["stage 1s", "pairs", "eval loss Δ (nats)", "Δ in % of B's loss",
                                     "eval loss label", "masked-token accuracy Δ (points)", "accuracy label"], rows)
                           + "\n")
    return "\n".join(out)


def run_stats(runs_path, schedules_path, settings: dict, out_dir=None, *, summary_csv=None,
              summary_md=None, deltas_csv=None, stats_json=None) -> dict:
    """Read the tables, compute, write summary.csv/.md, deltas.csv, stats.json (atomically)."""
    import pandas as pd

    from ..io import atomic_write_json, atomic_write_text

    for p in (runs_path, schedules_path):
        if not Path(p).is_file():
            raise PrecswitchError(f"input table not found: {p}")
    runs = _read_table(runs_path)
    schedules = _read_table(schedules_path)
    if schedules.empty:
        raise PrecswitchError(f"{schedules_path} has no rows (no finetune runs were aggregated)")
    summary, deltas, stats = compute(runs, schedules, settings)
    out_dir = Path(out_dir) if out_dir is not None else None

    def target(explicit, name):
        if explicit is not None:
            return Path(explicit)
        if out_dir is None:
            raise PrecswitchError(f"no output path for {name}: give --out-dir or the explicit option")
        return out_dir / name

    atomic_write_text(target(summary_csv, "summary.csv"), summary.to_csv(index=False))
    atomic_write_text(target(summary_md, "summary.md"),
                      render_summary_md(summary, settings, deltas, stats.get("stage1_baseline_precision")))
    atomic_write_text(target(deltas_csv, "deltas.csv"), deltas.to_csv(index=False))
    atomic_write_json(target(stats_json, "stats.json"), stats)
    del pd
    return stats


def _read_table(path):
    from .aggregate import read_table

    return read_table(path)


# --------------------------------------------------------------------------------------------------
# Validity self-check: false-positive rate under the null
# --------------------------------------------------------------------------------------------------
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
    """``python -m precswitch.analysis.stats [N_SIMS [N_SEEDS]]``: print the null false-positive rate."""
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
