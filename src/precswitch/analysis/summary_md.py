"""summary.md: the per-schedule and per-stage summary tables and the stage-1 paired differences, rendered from
the tables :mod:`.stats` computes (summary, deltas)."""

from __future__ import annotations

import math

from .fmt import conf_level, diff, fmt_p, md_table, num, with_ci
from .paired import NEGLIGIBLE_LOSS_FRACTION, loss_negligible
from .stats import SCHEDULE_COUNTERS, SCHEDULE_METRICS, STAGE1_METRICS, STAGE2_METRICS, RUN_COUNTERS, Metric

#: decimals of a summary value, by its unit (fractions are shown in %)
SUMMARY_DECIMALS = {"fraction": 2, "-1..1": 3, "nats": 3, "s": 2, "MiB": 1, "samples/s": 1}


def _mean_ci(d: dict, unit: str) -> str:
    scale = 100.0 if unit == "fraction" else 1.0
    nd = SUMMARY_DECIMALS.get(unit, 2)
    return with_ci(d.get("mean", math.nan) * scale, d.get("ci_low", math.nan) * scale,
                   d.get("ci_high", math.nan) * scale, num, decimals=nd).replace("n/a", "–")


def _summary_block(summary, level: str, title: str, metrics: list[Metric]) -> str:
    sub = summary[summary["level"] == level]
    if sub.empty:
        return ""
    header = ["group", "runs", "used", "failed", "degenerate"] + [
        f"{m.label} ({'%' if m.unit == 'fraction' else m.unit})" for m in metrics]
    rows = []
    for g, gs in sub.groupby("group", sort=True):
        first = gs.iloc[0]
        r = [g, int(first["n_runs"]), int(first["n_used"]), int(first["n_failed"]), int(first["n_degenerate"])]
        for m in metrics:
            mm = gs[gs["metric"] == m.column]
            d = mm.iloc[0].to_dict() if len(mm) else {}
            r.append("–" if not d else num(d.get("sum"), 0).replace("n/a", "–") if m.kind == "count"
                     else _mean_ci(d, m.unit))
        rows.append(r)
    return f"## {title}\n\n" + md_table(header, rows) + "\n"


def stage1_difference_rows(deltas, summary, baseline: str) -> list[list[str]]:
    """Per stage-1 comparison: eval-loss Δ [CI] in nats, Δ in % of B's loss, its label (``negligible`` when the
    whole CI lies within ±NEGLIGIBLE_LOSS_FRACTION of B's loss), masked-token accuracy Δ [CI] and its label."""
    st1 = deltas[deltas["family"] == "stage1"]

    def loss_of(group):
        bl = summary[(summary["level"] == "stage1") & (summary["group"] == group) & (summary["metric"] == "eval_loss")]
        return float(bl["mean"].iloc[0]) if len(bl) else math.nan

    rows = []
    for (a, b), g in st1.groupby(["a", "b"], sort=False):
        el, ma = (g[g["metric"] == k].iloc[0].to_dict() if (g["metric"] == k).any() else {}
                  for k in ("eval_loss", "mlm_accuracy"))
        n = (el or ma).get("n_pairs")
        base = loss_of(b)
        rel = el.get("mean", math.nan) / base * 100 if math.isfinite(base) and base > 0 else math.nan
        lab = label(el) + ("; negligible" if el and loss_negligible(el.get("ci_low"), el.get("ci_high"), base) else "")
        rows.append([a if b == baseline else f"{a} − {b}", int(n) if isinstance(n, (int, float)) and math.isfinite(n)
                     else "–", with_ci(el.get("mean"), el.get("ci_low"), el.get("ci_high"), diff, unit="nats"),
                     num(rel, 2, sign=True) + "%" if math.isfinite(rel) else "–", lab,
                     with_ci(ma.get("mean"), ma.get("ci_low"), ma.get("ci_high")), label(ma)])
    return rows


def label(r: dict | None) -> str:
    """'better (Holm p 0.031)' / 'inconclusive (Holm p 0.583)' / 'insufficient data' for a delta row."""
    c = (r or {}).get("classification")
    if not isinstance(c, str) or c == "insufficient data":
        return "insufficient data" if r else "–"
    return f"{c} (Holm p {fmt_p(r.get('p_holm'))})"


def render_summary_md(summary, settings: dict, deltas=None, stage1_baseline: str | None = None) -> str:
    """summary.md: the summary tables; with ``deltas`` and ``stage1_baseline`` also the stage-1 paired
    differences (the verdict's stage-1 table)."""
    conf = conf_level(settings["alpha"])
    out = ["# Summary per schedule and stage\n",
           f"Mean [{conf}% CI] over the runs used (ok and degenerate; failed runs excluded and counted). Accuracy, "
           "F1 and masked-token accuracy in %, times in seconds of the training loop, memory in MiB. Intervals of "
           "times, throughputs and memory are t intervals on the log scale (they never reach below 0). "
           "Differences between schedules, paired by seed, are in deltas.csv and the verdict.\n",
           _summary_block(summary, "schedule", "Per schedule: accuracy",
                          [m for m in SCHEDULE_METRICS if m.column in ("accuracy", "f1", "mcc")] + SCHEDULE_COUNTERS),
           _summary_block(summary, "schedule", "Per schedule: time and memory",
                          [m for m in SCHEDULE_METRICS if m.kind == "ratio"]),
           _summary_block(summary, "stage1", "Stage 1 (pre-training) by precision", STAGE1_METRICS + RUN_COUNTERS),
           _summary_block(summary, "stage2", "Stage 2 (fine-tuning) by precision (all schedules pooled; inits "
                          "differ; a run whose stage 1 failed is counted as failed)", STAGE2_METRICS + RUN_COUNTERS)]
    if deltas is not None and stage1_baseline and (deltas["family"] == "stage1").any():
        out.append(f"## Stage 1: paired differences (against {stage1_baseline}, then the named contrasts' stage 1s)\n")
        out.append(STAGE1_TABLE_NOTE.format(conf=conf, pct=NEGLIGIBLE_LOSS_FRACTION * 100) + "\n")
        out.append(md_table(STAGE1_TABLE_HEADER, stage1_difference_rows(deltas, summary, stage1_baseline)) + "\n")
    return "\n".join(x for x in out if x)


STAGE1_TABLE_HEADER = ["stage 1", "pairs", "eval loss Δ (nats)", "Δ in % of B's loss", "eval loss label",
                       "masked-token accuracy Δ (points)", "accuracy label"]
STAGE1_TABLE_NOTE = ("A − B paired by seed (deltas.csv, family `stage1`): mean [unadjusted {conf}% t CI]; labels from "
                     "the Holm-adjusted p over the stage-1 comparisons; *negligible*: the whole loss CI lies within "
                     "±{pct:g}% of B's mean eval loss.")
