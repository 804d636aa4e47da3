"""The analysis tables: per-schedule summaries and paired contrasts over the schedules table, and stats.json.

``precswitch stats`` writes summary.csv/.md, deltas.csv and stats.json; the statistics themselves are in
:mod:`.paired`, the settings in :mod:`.settings`, the number style in :mod:`.fmt`.

Failure rule (also written into stats.json, the verdict and docs/analysis.md):

* ``diverged`` / ``skipped`` (either stage) or no finite accuracy (``no_eval``) → the row is **failed**:
  counted per schedule (``n_failed``, ``failed_seeds``) and excluded from every mean, CI and test; a
  contrast drops that seed on both sides (pairing).
* ``ok`` but accuracy ≤ majority-class accuracy → **degenerate**: the model learnt nothing useful, but the
  run finished, so it *is* that schedule's outcome and stays in every statistic; it is counted and
  flagged (``n_degenerate``, ``degenerate_seeds``) so no mean hides it.

Holm runs per metric over the distinct schedule comparisons, vs-baseline and named together (a pair in both
counted once); the stage-1 rows are a family of their own. Intervals (``ci_low``/``ci_high``) are unadjusted
(1 − alpha) t intervals of one comparison; the labels use the Holm-adjusted p-value.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import PrecswitchError
from .aggregate import first_value
from .memory import schedule_tensor_bytes
from .paired import (MIN_BOOTSTRAP_PAIRS, classify, describe, describe_positive, describe_proportion, holm,
                     paired_contrast, power_analysis, resolution_of, within_margin)

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
    Metric("test_accuracy", "test accuracy", "difference", "fraction", "points", 1.0, True, True),
    Metric("test_f1", "test F1", "difference", "fraction", "points", 1.0, True, True),
    Metric("test_mcc", "test MCC", "difference", "-1..1", "MCC x 100", 1.0, True, False),
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
    "cuda_version", "python_version", "threads", "git_commit", "hostname", "compile",
    "model_parameters", "cpu_capability", "cpu_isa", "onednn_max_cpu_isa", "cpu_flags",
]
#: accuracy metrics and the column with their eval set's size (an accuracy's step is 1 / that)
EXAMPLES_OF = {"accuracy": "eval_examples", "test_accuracy": "test_examples", "mlm_accuracy": None}
# (config_hash is not provenance of the study: it hashes each run's hyper-parameters, seed and run_id
# included, so it differs between every two runs; it stays in runs.csv)

#: runs.csv columns with the 1-minute load average at the start and end of each run's training loop
LOAD_COLUMNS = ("load_avg_1m_start", "load_avg_1m_end")
#: a CPU run counts as oversubscribed when the load average exceeds the CPU count by more than this
#: share: each process then gets under 1/1.25 of a core, so its clock stretches by over 25%. A study
#: running cores/threads jobs on all cores sits at ~1x by itself (plus a little background).
LOAD_OVERSUBSCRIBED = 1.25


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
# Tables
# --------------------------------------------------------------------------------------------------
def _summary_rows(df, level: str, group_col: str, metrics: list[Metric], alpha: float,
                  counts: dict[str, dict]) -> list[dict]:
    rows = []
    for g, sub in df.groupby(group_col, sort=True, dropna=False):
        used = sub[sub["used"]]
        for m in metrics:
            if m.column not in sub or not df[m.column].notna().any():
                continue
            vals = used[m.column].astype(float) * m.scale
            if m.kind == "count":  # counters: over every run, failed included (they carry the cause)
                vals = sub[m.column].astype(float) * m.scale
            if m.kind == "ratio":
                d = describe_positive(vals, alpha)
            elif m.column in EXAMPLES_OF:
                d = describe_proportion(vals, _examples(used, m.column), alpha)
            else:
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


def _contrast_rows(df, group_col: str, families: list[tuple[str, list[tuple[str, str]]]], metrics: list[Metric],
                   settings: dict) -> list[dict]:
    """Paired contrasts, one row per (family, pair, metric), Holm-adjusted per metric (:func:`_holm_family`)."""
    rows = [_contrast_row(df, group_col, family, a, b, m, settings)
            for family, pairs in families for m in metrics if m.column in df and df[m.column].notna().any()
            for a, b in pairs]
    for m in metrics:
        _holm_family([r for r in rows if r["metric"] == m.column], m, settings)
    return rows


def _contrast_row(df, group_col: str, family: str, a: str, b: str, m: Metric, settings: dict) -> dict:
    xa, xb, seeds = _pair(df, group_col, a, b, m.column)
    # ``seeds`` lists the pairs that enter the statistics (paired_contrast drops non-finite values and, for
    # ratios, non-positive ones), so it always has n_pairs entries
    keep = [math.isfinite(x) and math.isfinite(y) and (m.kind != "ratio" or (x > 0 and y > 0))
            for x, y in zip(xa, xb)]
    seeds = [sd for sd, k in zip(seeds, keep) if k]
    scale = 100.0 if m.delta_unit in ("points", "MCC x 100") else 1.0
    ab = df[df[group_col].isin([a, b]) & df["used"]]
    r = paired_contrast(xa, xb, kind=m.kind, scale=scale, margin=settings["margin"] if m.margin else None,
                        alpha=settings["alpha"], power=settings["power"], n_boot=settings["bootstrap_resamples"],
                        seed=settings["seed"], resolution=resolution_of(_examples(ab, m.column, all_=True), scale))
    r.update({"family": family, "contrast": f"{a} vs {b}", "a": a, "b": b, "metric": m.column, "label": m.label,
              "unit": m.delta_unit, "higher_is_better": m.higher_is_better,
              "seeds": " ".join(str(s) for s in seeds)})
    return r


def _examples(df, metric: str, all_: bool = False):
    """The eval-set sizes of an accuracy metric's runs (their counts, or the largest with ``all_`` False);
    None when the table does not have them."""
    col = EXAMPLES_OF.get(metric)
    if not col or col not in df:
        return None
    v = df[col].astype(float)
    return v.to_numpy() if all_ else (float(v.max()) if v.notna().any() else None)


def _holm_family(mrows: list[dict], m: Metric, settings: dict) -> None:
    """Holm over the *distinct* comparisons of one metric (A vs B and B vs A, or the same pair in two families,
    count once and share one adjusted p): a comparison the verdict reports twice (a named contrast that is also
    a vs-baseline one) gets one p and one label. The power figures are then for the test the label uses: Holm's
    strictest threshold, alpha / m (m comparisons with a p). The positive control against the baseline is a check
    of the instrument, not one of the study's claims: it is tested alone, at alpha, and does not widen the family."""
    alpha = settings["alpha"]
    control = _control_key(settings)
    keys = list(dict.fromkeys(frozenset((r["a"], r["b"])) for r in mrows))
    first = {k: next(r for r in mrows if frozenset((r["a"], r["b"])) == k) for k in keys}
    claims = [k for k in keys if k != control]
    ps = dict(zip(claims, holm([first[k]["p_t"] for k in claims], alpha)))
    pw = dict(zip(claims, holm([first[k]["p_wilcoxon"] for k in claims], alpha)))
    if control in first:
        ps[control], pw[control] = first[control]["p_t"], first[control]["p_wilcoxon"]
    m_family = max(1, sum(math.isfinite(ps[k]) for k in claims))
    for r in mrows:
        k = frozenset((r["a"], r["b"]))
        r["p_holm"], r["p_wilcoxon_holm"] = ps[k], pw[k]
        m_test = 1 if k == control else m_family
        if r["kind"] == "difference" and m_test > 1:
            r.update(power_analysis(r["sd"], r["n_pairs"], alpha / m_test, settings["power"],
                                    settings["margin"] if m.margin else None, observed=r["mean"]))
        r["classification"] = classify(r, alpha, m.higher_is_better)
        r["within_margin"] = within_margin(r)


def _control_key(settings: dict) -> frozenset | None:
    """The pair {positive control, baseline}, or None when the study has no control."""
    name = settings.get("positive_control")
    return frozenset((name, settings["baseline"])) if name else None


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
        sa, sb = first_value(sched[sched["schedule"] == a], col), first_value(sched[sched["schedule"] == b], col)
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
        for k in ("p_holm", "p_wilcoxon_holm", "mde", "seeds_needed", "seeds_needed_observed",
                  "seeds_needed_equivalence"):
            if k in st:
                r[k] = st[k]
        r["classification"] = classify(r, alpha, r["higher_is_better"])


DELTA_COLUMNS = [
    "family", "contrast", "a", "b", "metric", "label", "kind", "unit", "n_pairs", "mean", "sd",
    "ci_low", "ci_high", "boot_low", "boot_high", "p_t", "p_holm", "p_wilcoxon", "p_wilcoxon_holm",
    "margin", "tost_p", "within_margin", "mde", "seeds_needed", "seeds_needed_observed",
    "seeds_needed_equivalence", "classification", "higher_is_better", "seeds", "identical", "resolution",
]
SUMMARY_COLUMNS = [
    "level", "group", "metric", "label", "unit", "n", "mean", "std", "ci_low", "ci_high", "min", "max",
    "sum", "n_runs", "n_used", "n_failed", "n_diverged", "n_skipped", "n_degenerate",
]


def _stage1_spec(sub) -> Any:
    """A schedule's stage 1: its spec (amp_fp16-to-fp32-at80 for an in-stage switch), else the precision."""
    return first_value(sub, "stage1_spec") or first_value(sub, "stage1_precision")


def _provenance(runs) -> dict:
    out = {}
    for c in PROVENANCE_COLUMNS:
        if c in runs:
            vals = sorted({str(v) for v in runs[c].dropna() if str(v) != ""})
            out[c] = vals
    return out


def input_notes(runs) -> dict:
    """What changes what the numbers mean, from the runs' metrics: the runs too short to leave their timing warm-up
    out of their rates (``short_warmup``: run ids), and per stage the source rows `precswitch prepare` dropped for
    an empty text or label cell (``rows_dropped``: {stage: [dropped, read]})."""
    import pandas as pd

    notes: dict = {"short_warmup": [], "rows_dropped": {}}
    if "timing_warmup_short" in runs and "run_id" in runs:
        short = runs["timing_warmup_short"].astype(str).str.lower().isin(["true", "1", "1.0"])
        notes["short_warmup"] = sorted(str(r) for r in runs.loc[short, "run_id"])
    if "train_rows_dropped" in runs and "stage" in runs:
        for stage, sub in runs.groupby("stage"):
            n = pd.to_numeric(sub["train_rows_dropped"], errors="coerce").max()
            if n == n and n > 0:
                read = pd.to_numeric(sub.get("train_rows_read", pd.Series(dtype=float)), errors="coerce").max()
                notes["rows_dropped"][str(stage)] = [int(n), int(read) if read == read else None]
    return notes


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
        sa, sb = first_value(sched[sched["schedule"] == a], spec), first_value(sched[sched["schedule"] == b], spec)
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
    # the split the headline and its tests use (docs/contracts.md 3): test when every finished run has it
    fin = sched[sched["used"]]
    split = "test" if len(fin) and "test_accuracy" in fin and fin["test_accuracy"].notna().all() else "dev"
    metric = "test_accuracy" if split == "test" else "accuracy"
    counts = _counts(sched, "schedule")
    summary_rows = _summary_rows(sched, "schedule", "schedule", SCHEDULE_METRICS + SCHEDULE_COUNTERS, alpha, counts)
    others = [s for s in available if s != baseline]
    named = [(a, b) for a, b in settings["contrasts"] if a in available and b in available]
    missing = [[a, b] for a, b in settings["contrasts"] if (a, b) not in named]
    # one Holm family per metric over every distinct schedule comparison reported (vs baseline and named)
    delta_rows = _contrast_rows(sched, "schedule", [("vs_baseline", [(s, baseline) for s in others]),
                                                    ("named", named)], SCHEDULE_METRICS, settings)
    runs = _runs_used(runs)
    pre, stage1_baseline, stage_rows, stage1_counts = _stage1(runs, sched, named, settings, summary_rows)
    stage2_counts = _stage2(runs, sched, alpha, summary_rows)
    _share_stage1_labels(delta_rows, stage_rows, sched, alpha)
    delta_rows += stage_rows
    summary = pd.DataFrame(summary_rows).reindex(columns=SUMMARY_COLUMNS)
    deltas = pd.DataFrame(delta_rows).reindex(columns=DELTA_COLUMNS)
    stats = {
        "settings": settings,
        "baseline": baseline,
        "stage1_baseline_precision": stage1_baseline,
        "failure_rule": FAILURE_RULE,
        "provenance": _provenance(runs),
        "input_notes": input_notes(runs),
        "split": split,
        "accuracy_metric": metric,
        "schedules": {s: _schedule_info(sched, runs, s, counts[s], alpha, metric) for s in available},
        "stage1_precisions": stage1_counts,
        "stage2_precisions": stage2_counts,
        "named_contrasts": [list(p) for p in named],
        # "A vs B" → shared | different | none (see _stage1_relation): with a shared stage 1, or none on
        # one side, the verdict reports stage-2 time and memory instead of the totals
        "stage1_relation": {f"{a} vs {b}": _stage1_relation(sched, a, b)
                            for a, b in [(s, baseline) for s in others] + named},
        # stage-1 mean, SD and CI per precision and metric (eval loss in nats)
        "stage1_summary": _stage1_summary(pre, alpha),
        "bootstrap_min_pairs": MIN_BOOTSTRAP_PAIRS,
        "load": _load_check(runs),
        "missing_contrasts": missing,
        "deltas": deltas.to_dict("records"),
        "positive_control": positive_control(delta_rows, settings, available, metric),
    }
    return summary, deltas, _jsonable(stats)


def positive_control(rows: list[dict], settings: dict, available: list, metric: str) -> dict | None:
    """The study's positive control (``analysis.positive_control``, a schedule known to be worse than the
    baseline): whether it was detected (its label against the baseline is *worse*, tested alone at alpha: it
    checks the instrument and is no claim of the study), its difference, and the minimal detectable difference
    of the study (the largest over its other comparisons of the headline metric, at the Holm-adjusted alpha,
    with ``power``); None when no control is set."""
    name, base = settings.get("positive_control"), settings["baseline"]
    if not name:
        return None
    row = next((r for r in rows if r["family"] == "vs_baseline" and r["metric"] == metric and r["a"] == name), None)
    # the smallest difference the study's own comparisons detect (the control's spread is not theirs)
    control = _control_key(settings)
    mdes = [r["mde"] for r in rows if r["metric"] == metric and r["family"] != "stage1"
            and frozenset((r["a"], r["b"])) != control
            and isinstance(r.get("mde"), float) and not math.isnan(r["mde"])]
    return {"schedule": name, "baseline": base, "ran": name in available, "metric": metric,
            "classification": row["classification"] if row else None,
            "detected": bool(row and row["classification"] == "worse"),
            "mean": row["mean"] if row else math.nan, "ci_low": row["ci_low"] if row else math.nan,
            "ci_high": row["ci_high"] if row else math.nan, "n_pairs": row["n_pairs"] if row else 0,
            "mde": max(mdes) if mdes else math.nan, "alpha": settings["alpha"], "power": settings["power"]}


def _runs_used(runs):
    """The runs table with ``outcome`` and ``used`` (a run is used when its status is ok)."""
    runs = runs.copy()
    if "status" in runs:
        st = runs["status"].fillna("ok").astype(str)
        runs["outcome"] = st
        runs["used"] = st == "ok"
    return runs


def _stage1(runs, sched, named, settings: dict, summary_rows: list) -> tuple:
    """Stage-1 runs grouped by their spec (the precision, or e.g. amp_fp16-to-fp32-at80 for an in-stage switch:
    its own group, not a duplicate of amp_fp16); their summary rows (appended) and paired rows against the
    baseline schedule's stage 1, plus the named contrasts' own stage-1 pairs. Returns (pre, baseline, rows,
    counts)."""
    pre = runs[runs["stage"] == "pretrain"] if "stage" in runs else runs.iloc[0:0]
    if not len(pre):
        return pre, None, [], {}
    pre = pre.copy()
    if "spec" in pre:
        pre["precision"] = pre["spec"].where(pre["spec"].notna(), pre["precision"])
    pre = pre.drop_duplicates(["precision", "seed"])
    counts = _counts(pre, "precision")
    summary_rows += _summary_rows(pre, "stage1", "precision", STAGE1_METRICS + RUN_COUNTERS, settings["alpha"], counts)
    col = "stage1_spec" if "stage1_spec" in sched else "stage1_precision"
    base = first_value(sched[sched["schedule"] == settings["baseline"]], col)
    specs = set(pre["precision"])
    if base is None or base not in specs:
        base = "fp32" if "fp32" in specs else None
    if base is None:
        return pre, None, [], counts
    pairs = [(p, base) for p in sorted(specs - {base})] + _named_stage1_pairs(sched, named, specs, base)
    return pre, base, _contrast_rows(pre, "precision", [("stage1", pairs)], STAGE1_METRICS, settings), counts


def _stage2(runs, sched, alpha: float, summary_rows: list) -> dict:
    """Stage-2 runs by precision (summary only: their inits differ). A finished stage 2 of a schedule whose
    stage 1 failed is left out with its schedule."""
    fin = runs[runs["stage"] == "finetune"] if "stage" in runs else runs.iloc[0:0]
    if not len(fin):
        return {}
    failed_init = []
    if {"stage1_status", "stage2_run_id"} <= set(sched.columns):
        s1 = sched["stage1_status"]
        failed_init = sched.loc[s1.notna() & (s1.astype(str) != "ok"), "stage2_run_id"].dropna()
    fin = fin.copy()
    fin["used"] = fin["used"] & ~fin["run_id"].astype(str).isin({str(r) for r in failed_init})
    counts = _counts(fin, "precision")
    summary_rows += _summary_rows(fin, "stage2", "precision", STAGE2_METRICS + RUN_COUNTERS, alpha, counts)
    return counts


def _stage1_summary(pre, alpha: float) -> dict:
    out = {}
    for p, sub in (pre.groupby("precision", sort=True) if len(pre) else ()):
        used = sub[sub["used"]]
        out[p] = {m.column: describe(used[m.column].astype(float) * m.scale, alpha)
                  for m in STAGE1_METRICS if m.column in used}
    return out


def _schedule_info(sched, runs, s: str, counts: dict, alpha: float, metric: str = "accuracy") -> dict:
    """What the verdict needs of one schedule: its design (from the table's columns, never from its name),
    counts, failures, accuracy, numeric health and the bytes of its model and optimizer state."""
    import pandas as pd

    sub = sched[sched["schedule"] == s]

    def total(col: str) -> float:
        return float(sub.get(col, pd.Series(dtype=float)).astype(float).sum(min_count=1))

    def total_mean(df, col: str) -> float:
        return float(df[col].astype(float).mean()) if col in df and df[col].notna().any() else math.nan

    return {
        **_design(sub),
        "has_stage1": _has_stage1(sub),
        **counts,
        "failed": [{"seed": _jsonable(r["seed"]), "outcome": r["outcome"], "reason": _failure_reason(r)}
                   for r in sub[~sub["used"]].to_dict("records")],
        "degenerate_seeds": [_jsonable(v) for v in sub.loc[sub["outcome"] == "degenerate", "seed"]],
        # the headline accuracy (test split when the study has one) in %, its interval inside [0, 100]
        "accuracy_points": {k: v * 100 if k not in ("n",) else v for k, v in describe_proportion(
            sub.loc[sub["used"], metric].astype(float), _examples(sub[sub["used"]], metric), alpha).items()},
        "majority_points": total_mean(sub, "test_majority_accuracy" if metric == "test_accuracy"
                                      else "majority_accuracy") * 100,
        "skipped_steps": total("skipped_steps"),
        "stage1_skipped_steps": total("stage1_skipped_steps"),
        "stage2_skipped_steps": total("stage2_skipped_steps"),
        "nonfinite_losses": total("nonfinite_losses"),
        "stage1_loss_scale_min": float(sub.get("stage1_loss_scale_min", pd.Series(dtype=float)).astype(float).min()),
        "stage2_loss_scale_min": float(sub.get("stage2_loss_scale_min", pd.Series(dtype=float)).astype(float).min()),
        "seeds": [_jsonable(v) for v in sorted(sub["seed"].unique())],
        "sweep": first_value(sub, "sweep"),
        "sweep_at": first_value(sub, "sweep_at"),
        # seeds other schedules have but this one lacks (no finetune metrics.json was given)
        "missing_seeds": [_jsonable(v) for v in sorted(set(sched["seed"]) - set(sub["seed"]), key=str)],
        **{f"stage{k}_tensor_bytes": schedule_tensor_bytes(sub, runs, k) for k in (1, 2)},
        # the process peaks the tensor bytes are set beside (mean over the runs used)
        **{f"stage{k}_peak_memory_bytes": float(sub.loc[sub["used"], f"stage{k}_peak_memory_bytes"].astype(float).mean())
           if f"stage{k}_peak_memory_bytes" in sub else math.nan for k in (1, 2)},
    }


def _design(sub) -> dict:
    """Per stage: its precision, in-stage switch, optimizer overrides and spec (the run's name, shown as it is),
    from the schedules table's columns."""
    out = {}
    for k in (1, 2):
        spec = first_value(sub, f"stage{k}_spec") or first_value(sub, f"stage{k}_precision")
        prefix = f"stage{k}_override_"  # one column per override key (aggregate.override_columns)
        overrides = {c[len(prefix):]: float(v) for c in sub.columns if c.startswith(prefix)
                     for v in [first_value(sub, c)] if v is not None and not (isinstance(v, float) and math.isnan(v))}
        out.update({f"stage{k}_precision": first_value(sub, f"stage{k}_precision"), f"stage{k}_spec": spec,
                    f"stage{k}_switch_to": first_value(sub, f"stage{k}_switch_to"),
                    f"stage{k}_switch_at": first_value(sub, f"stage{k}_switch_at"),
                    f"stage{k}_overrides": overrides or {}})
    return out
