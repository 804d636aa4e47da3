"""results/verdict.md: the answer first (a headline table and two sentences), then the details in tables.

Everything comes from stats.json (``precswitch stats``): each schedule's design (stage-1/stage-2 precision,
switch, overrides) from the schedules table's columns, never from its name. Sections, one function each:
title, headline table, answer sentences, accuracy tests, per-schedule table, time and memory, memory and
the tensors, stage 1, failures, caveats, provenance.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path
from typing import Any

from ..errors import PrecswitchError
from .paired import NEGLIGIBLE_LOSS_FRACTION, loss_negligible
from .fmt import conf_level, diff, finite, fmt_p, interval, md_table, mib, num, ratio_ci, seeds, with_ci

#: below this many parameters the verdict calls the model tiny (the embedded default has ~1M; BERT-base 108M)
TINY_MODEL_PARAMETERS = 10_000_000
#: on a CPU, a memory difference counts as the precision's only when the model and optimizer state bytes of the
#: two sides differ (in the same direction) by at least this share of the baseline side's process peak
MATERIAL_SHARE = 0.05
SIGNIFICANT = ("better", "worse", "higher", "lower")
#: a schedule within this many equivalence margins of 100% accuracy, or of the majority class, gets a ceiling
#: (floor) caveat: there a ±margin difference is a large share of its errors (of what it learnt)
CEILING_MARGINS = 2.0
#: provenance keys of the CPU instruction set (docs/contracts.md 5): runs of one study should share them
CPU_KEYS = ("cpu_capability", "onednn_max_cpu_isa", "cpu_flags")


def render(stats: dict, sequential: dict | None = None) -> str:
    v = _View(stats, sequential)
    sections = [_title(v), _headline(v), _answer(v), _control(v), _sequential(sequential), _accuracy_details(v),
                _schedules_table(v), _cost_details(v), _memory_table(v), _stage1(v), _failures(v), _caveats(v),
                _provenance(v)]
    return "\n\n".join(s for s in sections if s) + "\n"


class _View:
    """stats.json with the look-ups every section needs."""

    def __init__(self, stats: dict, sequential: dict | None = None):
        self.stats = stats
        #: the headline metric: test_accuracy when every finished run has the held-out split, else accuracy (dev)
        self.acc = stats.get("accuracy_metric", "accuracy")
        self.split = stats.get("split", "dev")
        #: a sequential study: (a, b) → the comparison's last look (sequential.json)
        self.seq = {(r["a"], r["b"]): r for r in (sequential or {}).get("comparisons", [])}
        s = stats.get("settings", {})
        self.margin, self.alpha, self.power = s.get("margin", 1.0), s.get("alpha", 0.05), s.get("power", 0.8)
        self.conf = conf_level(self.alpha)
        self.baseline = stats.get("baseline")
        self.info: dict = stats.get("schedules", {})
        self.deltas: list[dict] = stats.get("deltas", [])
        self.prov: dict = stats.get("provenance", {})
        self.cpu = any(str(d).startswith("cpu") for d in self.prov.get("device", []))
        self.cpu_rss = "cpu_peak_rss" in self.prov.get("memory_kind", []) or (self.cpu and not self.prov.get("memory_kind"))

    def row(self, family: str, a: str, b: str, metric: str) -> dict | None:
        return next((r for r in self.deltas if (r.get("family"), r.get("a"), r.get("b"), r.get("metric"))
                     == (family, a, b, metric)), None)

    def comparisons(self) -> list[tuple[str, str, str]]:
        """(a, b, family): the named contrasts first, then every other schedule against the baseline."""
        named = [(a, b, "named") for a, b in self.stats.get("named_contrasts", [])]
        seen = {frozenset((a, b)) for a, b, _ in named}
        rest = [(s, self.baseline, "vs_baseline") for s in sorted(self.info)
                if s != self.baseline and frozenset((s, self.baseline)) not in seen]
        return named + rest

    def relation(self, a: str, b: str) -> str:
        return (self.stats.get("stage1_relation") or {}).get(f"{a} vs {b}", "different")

    def stage(self, s: str, k: int) -> str:
        """A schedule's stage as the table has it: its spec, or 'none' for a schedule without a stage 1."""
        i = self.info.get(s, {})
        if k == 1 and not i.get("has_stage1", True):
            return "none"
        return str(i.get(f"stage{k}_spec") or i.get(f"stage{k}_precision") or "none")


# ------------------------------------------------------------------------------------------------ title
def design(v: _View) -> str:
    """Which stage's precision varies across the schedules: pretrain | finetune | both | none."""
    s1 = {v.stage(s, 1) for s in v.info}
    s2 = {v.stage(s, 2) for s in v.info}
    return {(True, False): "pretrain", (False, True): "finetune", (True, True): "both"}.get(
        (len(s1) > 1, len(s2) > 1), "none")


def title(v: _View) -> tuple[str, str]:
    """(the title by design, 'Tiny BERT (...) on a CPU, 2 seeds.'): shared by verdict.md and the report's front."""
    s1 = sorted({v.stage(s, 1) for s in v.info})
    s2 = sorted({v.stage(s, 2) for s in v.info})
    text = {
        "pretrain": f"Pre-training precision ({', '.join(s1)}), fine-tuned in {', '.join(s2)}: does accuracy change?",
        "finetune": f"Fine-tuning precision ({', '.join(s2)}) after {', '.join(s1)} pre-training: does accuracy change?",
        "both": "Pre-training and fine-tuning precision: what does each schedule change?",
        "none": f"One schedule, `{v.baseline}`: nothing to compare",
    }[design(v)]
    scale = _scale(v)
    return text, f"{scale[:1].upper()}{scale[1:]}."


def _title(v: _View) -> str:
    text, scale = title(v)
    return f"# {text}\n\n{scale}"


def _scale(v: _View) -> str:
    """'Tiny BERT (0.95M-1.0M parameters) on a CPU, 5 seeds'."""
    sizes = [float(x) for x in v.prov.get("model_parameters", []) if _isnum(x)]
    size = "BERT"
    if sizes:
        lo, hi = (f"{x / 1e6:.2g}M" for x in (min(sizes), max(sizes)))
        size = f"{'tiny BERT' if max(sizes) < TINY_MODEL_PARAMETERS else 'BERT'} ({lo if lo == hi else f'{lo}-{hi}'} parameters)"
    where = "a CPU" if v.cpu else ", ".join(f"`{x}`" for x in v.prov.get("device_name", [])) or "an unknown device"
    n = len({x for i in v.info.values() for x in i.get("seeds", [])})
    if v.seq:
        used = sorted({int(r["seeds"]) for r in v.seq.values()})
        return f"{size} on {where}, sequential seeds ({'-'.join(map(str, dict.fromkeys([used[0], used[-1]])))} per comparison)"
    return f"{size} on {where}, {n} seed{'s' if n != 1 else ''}"


def _isnum(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


# ------------------------------------------------------------------------------------------------ headline
def headline(v: _View) -> tuple[list[str], list[list[str]], str]:
    """The headline table (header, one row per comparison, the named contrasts first) and its note."""
    rows = [_headline_row(v, a, b, fam) for a, b, fam in v.comparisons()]
    split = "test split" if v.split == "test" else "dev split"
    what = f"{v.conf}% confidence sequence" if v.seq else f"{v.conf}% CI"
    header = ["comparison", f"{'test ' if v.split == 'test' else ''}accuracy Δ (points) [{what}]", "accuracy", "seeds",
              "time ratio", "time", "memory ratio", "memory"]
    rule = (f"each comparison's anytime-valid confidence sequence at the look it stopped: *better/worse* = it "
            f"excludes 0; *equivalent* = inside {_pm(v.margin)}" if v.seq else
            f"*better/worse* = Holm-adjusted p < {v.alpha:g}; *equivalent* = the whole CI inside {_pm(v.margin)}")
    note = (f"A − B paired by seed, on the {split}. Accuracy: {rule}; *identical* = a tie on every seed; otherwise "
            f"*inconclusive*. Time and memory: A / B, geometric mean "
            "of paired ratios; over both stages, or stage 2 alone (marked) when the two share their stage-1 runs or "
            "one has none; *n.s.* = not significant after Holm.")
    missing = [f"`{a}` vs `{b}`" for a, b in v.stats.get("missing_contrasts", [])]
    if missing:
        note += f" Not run (schedule missing): {', '.join(missing)}."
    return header, rows, note


def _headline(v: _View) -> str:
    header, rows, note = headline(v)
    return "## Answer\n\n" + md_table(header, rows) + "\n\n" + note if rows else ""


def cost_rows(v: _View, a: str, b: str, family: str) -> tuple[dict | None, dict | None, bool]:
    """The time and memory rows of a comparison: totals, or stage 2 alone when stage 1 is shared or absent."""
    stage2 = v.relation(a, b) in ("shared", "none")
    t = v.row(family, a, b, "stage2_train_seconds" if stage2 else "total_train_seconds")
    m = v.row(family, a, b, "stage2_peak_memory_bytes" if stage2 else "peak_memory_bytes")
    return t, m, stage2


def _headline_row(v: _View, a: str, b: str, family: str) -> list[str]:
    acc = v.row(family, a, b, v.acc)
    t, m, stage2 = cost_rows(v, a, b, family)
    mark = " (stage 2)" if stage2 else ""
    sq = v.seq.get((a, b))
    if sq is not None:
        cells = [_seq_estimate(sq), sequential_label(v, sq, acc, a, b), str(sq["seeds"])]
    else:
        cells = [with_ci(*_mci(acc)), accuracy_label(v, acc, a, b), seeds((acc or {}).get("n_pairs"))]
    return [f"`{a}` vs `{b}`" + (" (positive control)" if a == _control_name(v) else ""), *cells,
            ratio_ci(t) + (mark if t else ""), time_label(t), ratio_ci(m) + (mark if m else ""),
            memory_label(v, m, a, b, stage2)]


def _mci(r: dict | None) -> tuple:
    r = r or {}
    return r.get("mean"), r.get("ci_low"), r.get("ci_high")


def _seq_estimate(r: dict) -> str:
    if not finite(r.get("mean")):
        return "no pairs"
    return f"{diff(r['mean'])} [{diff(r['lo']) if finite(r.get('lo')) else '−∞'}, " \
           f"{diff(r['hi']) if finite(r.get('hi')) else '+∞'}]"


def sequential_label(v: _View, sq: dict, r: dict | None, a: str, b: str) -> str:
    """A sequential comparison's decision as the fixed design's words: *different* → better/worse by its sign."""
    c = sq.get("decision")
    if c == "different":
        c = "better" if sq["mean"] > 0 else "worse"
    elif c == "continue":
        c = "open (more seeds needed)"
    return accuracy_label(v, {**(r or {}), "classification": c, "n_pairs": sq.get("n", 2)}, a, b)


def _control_name(v: _View) -> str | None:
    return (v.stats.get("positive_control") or {}).get("schedule")


def accuracy_label(v: _View, r: dict | None, a: str, b: str) -> str:
    c = (r or {}).get("classification")
    if not isinstance(c, str) or c == "insufficient data":
        return "not judged (< 2 pairs)"
    if all(_all_degenerate(v.info.get(x, {})) for x in (a, b)):
        return f"{c}, not informative (majority class only)"
    if c == "identical":
        return "identical on every seed"
    if c in ("better", "worse") and r.get("within_margin"):
        return f"{c}, within ±{v.margin:g}"
    return c


def time_label(r: dict | None) -> str:
    if not r or not finite(r.get("mean")):
        return "–"
    if r.get("classification") not in SIGNIFICANT:
        return "n.s."
    return "faster" if r["mean"] < 1 else "slower"


def memory_label(v: _View, r: dict | None, a: str, b: str, stage2: bool) -> str:
    """'saved' / 'more' only when the model and optimizer state bytes explain the difference; on a CPU a
    difference they do not explain is the runtime's footprint."""
    if not r or not finite(r.get("mean")):
        return "–"
    if r.get("classification") not in SIGNIFICANT:
        return "n.s."
    if not memory_explained(v, a, b, r["mean"], stage2):
        return UNEXPLAINED
    return "saved" if r["mean"] < 1 else "more"


#: a memory difference whose direction or size the weight and optimizer bytes do not account for
UNEXPLAINED = "not explained by weight and optimizer bytes"


def tensor_bytes(v: _View, s: str, stage2: bool) -> float:
    i = v.info.get(s, {})
    vals = [i.get("stage2_tensor_bytes")] + ([] if stage2 else [i.get("stage1_tensor_bytes")])
    vals = [x for x in vals if finite(x)]
    return max(vals) if vals else math.nan


def memory_explained(v: _View, a: str, b: str, ratio: float, stage2: bool) -> bool:
    """A memory ratio is the precision's when the memory measured is the device's (CUDA), or when the two
    sides' model and optimizer state bytes differ in its direction by a material share of B's process peak."""
    if not v.cpu_rss:
        return True
    ta, tb = tensor_bytes(v, a, stage2), tensor_bytes(v, b, stage2)
    ib = v.info.get(b, {})
    peaks = [ib.get("stage2_peak_memory_bytes")] + ([] if stage2 else [ib.get("stage1_peak_memory_bytes")])
    peak = max([x for x in peaks if finite(x)], default=math.nan)
    if not (finite(ta) and finite(tb) and finite(peak)) or peak <= 0:
        return False
    return abs(ta - tb) >= MATERIAL_SHARE * peak and (ta < tb) == (ratio < 1)


def _pm(margin: float) -> str:
    return f"±{margin:g} point{'' if margin == 1 else 's'}"


def _all_degenerate(i: dict) -> bool:
    return bool(i.get("n_used")) and i.get("n_degenerate") == i.get("n_used")


# ------------------------------------------------------------------------------------------------ answer
def _answer(v: _View) -> str:
    """One or two plain sentences: what the study found, at its scale."""
    comps = v.comparisons()
    if not comps:
        return f"Only `{v.baseline}` ran: add schedules to the config to compare it with something."
    parts = [_finding(v, a, b, fam) for a, b, fam in comps]
    out = [f"At this scale ({_scale(v)}), on the {v.split} split: " + "; ".join(parts) + "."]
    pc = v.stats.get("positive_control") or {}
    if pc and pc.get("ran") and not control_detected(v):
        out.insert(0, f"**The study is not sensitive enough to answer**: it did not detect its positive control "
                      f"`{pc['schedule']}` (see Positive control).")
    costs = []
    saved = [f"`{a}`" for a, b, fam in comps if memory_label(v, cost_rows(v, a, b, fam)[1], a, b,
                                                            cost_rows(v, a, b, fam)[2]) == UNEXPLAINED]
    if saved:
        costs.append(f"the weight and optimizer bytes do not explain the memory differences of "
                     f"{', '.join(dict.fromkeys(saved))} (see Memory)")
    load = v.stats.get("load") or {}
    if v.cpu and (load.get("n_oversubscribed") or 0) > 0:
        costs.append(f"the time ratios are unreliable: {load['n_oversubscribed']} of {load.get('n_runs_checked')} "
                     "runs ran on an oversubscribed machine")
    if costs:
        text = "; ".join(costs)
        out.append(text[:1].upper() + text[1:] + ".")
    return " ".join(out)


def _finding(v: _View, a: str, b: str, family: str) -> str:
    r = v.row(family, a, b, v.acc)
    c = (r or {}).get("classification")
    if (a, b) in v.seq:
        sq = v.seq[(a, b)]
        c = {"different": "better" if (sq.get("mean") or 0) > 0 else "worse"}.get(sq["decision"], sq["decision"])
        r = {**(r or {}), "mean": sq.get("mean")}
    if c == "identical":
        s = f"`{a}` and `{b}` tie on every seed"
    elif c in ("better", "worse"):
        s = f"`{a}` is {'more' if c == 'better' else 'less'} accurate than `{b}` ({diff(r['mean'])} points)"
    elif c == "equivalent":
        s = f"`{a}` matches `{b}` within {_pm(v.margin)}"
    elif c in ("inconclusive", "continue"):
        s = f"`{a}` vs `{b}` is inconclusive"
    else:
        s = f"`{a}` vs `{b}` cannot be judged (fewer than 2 paired seeds)"
    failed = [f"`{x}` failed in {v.info[x]['n_failed']} of {v.info[x].get('n_runs')} runs"
              for x in (a, b) if (v.info.get(x) or {}).get("n_failed")]
    return s + (f" ({', '.join(failed)})" if failed else "")


# ------------------------------------------------------------------------------------------------ details
def _accuracy_details(v: _View) -> str:
    rows = []
    for a, b, fam in v.comparisons():
        r = v.row(fam, a, b, v.acc) or {}
        rows.append([f"`{a}` vs `{b}`", seeds(r.get("n_pairs")), with_ci(*_mci(r)),
                     with_ci(r.get("mean"), r.get("boot_low"), r.get("boot_high")) if finite(r.get("boot_low")) else "–",
                     fmt_p(r.get("p_holm")), fmt_p(r.get("p_wilcoxon_holm")), fmt_p(r.get("tost_p")),
                     num(r.get("sd"), 2), num(r.get("mde"), 2), seeds(r.get("seeds_needed_observed")),
                     seeds(r.get("seeds_needed")), seeds(r.get("seeds_needed_equivalence"))])
    if not rows:
        return ""
    header = ["comparison", "pairs", f"Δ [{v.conf}% t CI]", "bootstrap CI", "Holm p", "Wilcoxon Holm p", "TOST p",
              "paired SD", "detectable Δ", "seeds: observed Δ", f"seeds: {v.margin:g}-point Δ", "seeds: CI in margin"]
    note = (f"Points. Seeds needed, with {v.power * 100:.0f}% power at the Holm-adjusted alpha and the observed "
            f"paired SD: *observed Δ* = pairs that detect a difference as large as the one observed; "
            f"*{v.margin:g}-point Δ* = pairs that detect a margin-sized difference; *CI in margin* = pairs that would "
            f"put the CI inside ±{v.margin:g} if the observed mean and SD held (n/a when the mean is outside). "
            "*Detectable Δ*: the smallest difference these pairs detect with that power.")
    return f"## Accuracy tests ({v.split} split)\n\n" + md_table(header, rows) + "\n\n" + note


def _schedules_table(v: _View) -> str:
    rows = []
    for s in [v.baseline] + sorted(k for k in v.info if k != v.baseline):
        i = v.info.get(s)
        if i is None:
            continue
        acc = i.get("accuracy_points", {})
        rows.append([f"`{s}`", v.stage(s, 1), v.stage(s, 2), _overrides(i), f"{i.get('n_used')}/{i.get('n_runs')}",
                     i.get("n_failed", 0), i.get("n_degenerate", 0),
                     with_ci(acc.get("mean"), acc.get("ci_low"), acc.get("ci_high"), num),
                     interval(acc.get("cp_low"), acc.get("cp_high"), num) or "–", num(acc.get("std"), 2), num(i.get("stage1_skipped_steps"), 0), num(i.get("stage2_skipped_steps"), 0),
                     num(i.get("nonfinite_losses"), 0)])
    header = ["schedule", "stage 1", "stage 2", "overrides", "used/runs", "failed", "degenerate",
              f"{v.split} accuracy % [{v.conf}% CI over seeds, logit scale]", "eval-set CI (Clopper-Pearson, pooled)",
              "seed SD", "skipped steps 1", "skipped steps 2", "non-finite losses"]
    return "## Schedules\n\n" + md_table(header, rows)


def _overrides(i: dict) -> str:
    bits = [f"stage {k}: " + ", ".join(f"{key} {val}" for key, val in sorted(o.items()))
            for k in (1, 2) if (o := i.get(f"stage{k}_overrides"))]
    return "; ".join(bits) or "–"


def _cost_details(v: _View) -> str:
    metrics = [("stage1_train_seconds", "stage-1 time"), ("stage2_train_seconds", "stage-2 time"),
               ("total_train_seconds", "total time"), ("stage2_samples_per_second", "stage-2 throughput"),
               ("stage1_peak_memory_bytes", "stage-1 peak"), ("stage2_peak_memory_bytes", "stage-2 peak")]
    rows = []
    for a, b, fam in v.comparisons():
        shared = v.relation(a, b) == "shared"
        cells = []
        for col, _ in metrics:
            r = v.row(fam, a, b, col)
            if shared and col.startswith("stage1_"):
                cells.append("shared")
            elif r and finite(r.get("mean")):
                cells.append(f"{ratio_ci(r)}, Holm p {fmt_p(r.get('p_holm'))}")
            else:
                cells.append("–")
        rows.append([f"`{a}` vs `{b}`"] + cells)
    if not rows:
        return ""
    return ("## Time and memory\n\n" + md_table(["comparison"] + [m for _, m in metrics], rows) + "\n\n"
            f"A / B, geometric mean of paired ratios [{v.conf}% CI on the log scale]; *shared*: both start from the "
            "same stage-1 runs. Train time is the training loop only.")


def _memory_table(v: _View) -> str:
    rows = []
    for s in [v.baseline] + sorted(k for k in v.info if k != v.baseline):
        i = v.info.get(s, {})
        for k in (1, 2):
            peak, tb = i.get(f"stage{k}_peak_memory_bytes"), i.get(f"stage{k}_tensor_bytes")
            if not finite(peak) and not finite(tb):
                continue
            share = f"{tb / peak * 100:.1f}%" if finite(peak) and finite(tb) and peak > 0 else "n/a"
            rows.append([f"`{s}`", k, v.stage(s, k), mib(peak), mib(tb), share])
    if not rows:
        return ""
    what = ("the process's peak RSS, which holds the Python/torch runtime" if v.cpu_rss else "the device's peak memory")
    return ("## Memory\n\n" + md_table(["schedule", "stage", "precision", "process peak (MiB)",
                                        "model + optimizer state (MiB)", "share"], rows) + "\n\n"
            f"Process peak: {what}. Model + optimizer state: parameters × bytes each holds (weight, gradient and "
            "AdamW's two moments in the precision's parameter dtype: 16 bytes in fp32 and mixed precision, 8 in pure "
            "16 bits), exact from the parameter count. A memory difference is called *saved* only when these "
            f"bytes explain it (on a CPU: they differ in its direction by at least {MATERIAL_SHARE:.0%} of the "
            "process peak).")


def _stage1(v: _View) -> str:
    b1 = v.stats.get("stage1_baseline_precision")
    st1 = [r for r in v.deltas if r.get("family") == "stage1"]
    if not b1 or not st1:
        return ""
    summary = v.stats.get("stage1_summary") or {}
    rows = []
    for a, b in dict.fromkeys((r["a"], r["b"]) for r in st1):
        el, ma, ts, pm = (next((r for r in st1 if (r["a"], r["b"], r["metric"]) == (a, b, m)), None)
                          for m in ("eval_loss", "mlm_accuracy", "train_seconds", "peak_memory_bytes"))
        base = ((summary.get(b) or {}).get("eval_loss") or {}).get("mean")
        n = next((r.get("n_pairs") for r in (el, ma, ts, pm) if r and finite(r.get("mean"))), 0)
        lab = _short(el) + ("; negligible" if el and loss_negligible(el.get("ci_low"), el.get("ci_high"), base) else "")
        rows.append([f"`{a}` vs `{b}`", seeds(n), with_ci(*_mci(el), diff, unit="nats"), lab,
                     with_ci(*_mci(ma)), _short(ma), ratio_ci(ts), ratio_ci(pm)])
    header = ["stage 1", "pairs", "eval loss Δ (nats)", "loss", "masked-token acc. Δ (points)", "acc.",
              "time ratio", "peak memory ratio"]
    return (f"## Stage 1 on its own (against {b1})\n\n" + md_table(header, rows) + "\n\n"
            f"Masked-LM eval metrics of the pre-trained models, paired by seed; labels from the Holm-adjusted p over "
            f"the stage-1 comparisons. *negligible*: the whole loss CI lies within ±{NEGLIGIBLE_LOSS_FRACTION:.1%} of "
            "B's loss (paired seeds share data and masks, so a tiny difference can be significant without mattering).")


def _short(r: dict | None) -> str:
    c = (r or {}).get("classification")
    return c if isinstance(c, str) else "–"


def _failures(v: _View) -> str:
    lines = []
    for s in sorted(v.info):
        i = v.info[s]
        for f in i.get("failed", []):
            lines.append(f"- `{s}` seed {f.get('seed')}: {f.get('outcome')}" + (f" ({f['reason']})" if f.get("reason") else ""))
        if i.get("missing_seeds"):
            lines.append(f"- `{s}`: no result for seed(s) {', '.join(map(str, i['missing_seeds']))}")
        if i.get("n_degenerate"):
            lines.append(f"- `{s}`: degenerate (accuracy ≤ majority class, kept in the statistics) in seed(s) "
                         f"{', '.join(map(str, i.get('degenerate_seeds', [])))}")
    rule = v.stats.get("failure_rule", "")
    return "## Failures\n\n" + ("\n".join(lines) + "\n\n" if lines else "None.\n\n") + rule


# ------------------------------------------------------------------------------------------------ caveats
def _caveats(v: _View) -> str:
    cav = [c for c in (_split_caveat(v), _cpu_caveat(v), _isa_caveat(v), _gpu_caveat(v), _scale_caveat(v),
                       _load_caveat(v), _bootstrap_caveat(v), _wilcoxon_caveat(v)) if c]
    cav += _ceiling_caveats(v)
    cav += _input_caveats(v)
    cav += [f"The runs do not share one {k} ({', '.join(v.prov[k])}): timings and results may not be comparable."
            for k in ("device", "device_name", "torch_version", "transformers_version", "git_commit", "threads",
                      "compile") if len(v.prov.get(k, [])) > 1]
    return "## Caveats\n\n" + "\n".join(f"- {c}" for c in cav) if cav else ""


def _split_caveat(v: _View) -> str:
    if v.split == "test":
        return ""
    return ("Reported on the dev split, the split the recipe was tuned on (no run has a held-out `test` split): "
            "the numbers may flatter every schedule alike.")


def _isa_caveat(v: _View) -> str:
    mixed = [f"{k} ({', '.join(v.prov[k])})" for k in CPU_KEYS if len(v.prov.get(k, [])) > 1]
    if not mixed:
        return ""
    return ("The runs ran at different CPU instruction sets: " + "; ".join(mixed) + ". oneDNN and ATen pick other "
            "kernels at each, so values differ in the last digits and bf16/fp16 times are not comparable; "
            "pin `cpu_isa` (config/README.md).")


def ceiling(v: _View, s: str) -> str | None:
    """'ceiling' / 'floor' when schedule ``s``'s mean accuracy is within CEILING_MARGINS margins of 100% or of
    the majority class; None otherwise."""
    acc = v.info.get(s, {}).get("accuracy_points", {})
    mean, maj = acc.get("mean"), v.info.get(s, {}).get("majority_points")
    room = CEILING_MARGINS * v.margin
    if finite(mean) and 100 - mean < room:
        return "ceiling"
    if finite(mean) and finite(maj) and mean - maj < room:
        return "floor"
    return None


def _ceiling_caveats(v: _View) -> list[str]:
    out, floor = [], []
    for s in sorted(v.info):
        where, acc = ceiling(v, s), v.info[s].get("accuracy_points", {})
        if where == "ceiling":
            err = 100 - acc["mean"]
            allows = f"{(err + v.margin) / err:.0f}×" if err > 0 else "any multiple of"
            out.append(f"`{s}` is at the ceiling ({num(acc['mean'])}%, within {CEILING_MARGINS:g} margins of 100%): "
                       f"the {_pm(v.margin)} margin allows {allows} its error rate; a precision effect has little "
                       "room to show, and *equivalent* says less than it seems.")
        elif where == "floor":
            floor.append(f"`{s}` ({num(acc['mean'])}% against {num(v.info[s]['majority_points'])}%)")
    if floor:
        out.append(f"Near the floor, within {CEILING_MARGINS:g} margins of the majority class: {', '.join(floor)}: "
                   "they learnt little, and their comparisons say little about the precision.")
    return out


def control_detected(v: _View) -> bool:
    """The positive control is detected: its label against the baseline is *worse* (in a sequential study, the
    decision it stopped with is *different*, below 0)."""
    pc = v.stats.get("positive_control") or {}
    sq = v.seq.get((pc.get("schedule"), pc.get("baseline")))
    if sq is not None:
        return sq.get("decision") == "different" and (sq.get("mean") or 0) < 0
    return bool(pc.get("detected"))


def _control(v: _View) -> str:
    """The positive control's line: detected or not, its difference, and the study's minimal detectable difference."""
    pc = v.stats.get("positive_control")
    if not pc:
        return ""
    name = f"`{pc['schedule']}`"
    if not pc.get("ran"):
        return f"**Positive control** {name}: not run (no finished runs): the study's sensitivity is untested."
    found = "detected" if control_detected(v) else "not detected"
    mde = (f"{num(pc.get('mde'))} points" if finite(pc.get("mde")) else
           "none at these seeds" if pc.get("mde") == math.inf else "n/a")
    return (f"**Positive control** {name} vs `{pc['baseline']}`: **{found}** ({pc.get('classification')}, "
            f"{with_ci(pc.get('mean'), pc.get('ci_low'), pc.get('ci_high'))} points, {seeds(pc.get('n_pairs'))} "
            f"pairs; tested alone at alpha {pc.get('alpha'):g}: a check of the instrument, outside the Holm family "
            f"of the study's comparisons). Minimal detectable difference at these seeds: {mde} (largest over the "
            f"study's other comparisons; alpha {pc.get('alpha'):g} Holm-adjusted, power {pc.get('power'):g}).")


def _input_caveats(v: _View) -> list[str]:
    """Inputs that change what the numbers mean (stats.json's input_notes): stages too short for their timing
    warm-up, source rows dropped for an empty cell."""
    notes = v.stats.get("input_notes") or {}
    out = []
    short = notes.get("short_warmup") or []
    if short:
        out.append(f"{len(short)} run(s) had no more steps than `timing_warmup_steps` (e.g. `{short[0]}`): their "
                   "steps/s include the warm-up (first steps, compilation); give the stage more steps or epochs.")
    for stage, (n, read) in sorted((notes.get("rows_dropped") or {}).items()):
        of = f" of {read}" if read else ""
        out.append(f"{n}{of} {stage} training rows were dropped for an empty text or label cell "
                   f"(`precswitch prepare`): the {stage} stage trained on the rest.")
    return out


def _cpu_caveat(v: _View) -> str:
    if not v.cpu:
        return ""
    return ("Measured on a CPU: the speed of fp16/bf16 depends on its instruction set (e.g. AMX for bf16), and peak "
            "memory is the process's RSS, mostly the runtime's; neither says what a GPU would do.")


def _gpu_caveat(v: _View) -> str:
    gpu = any(str(d).startswith("cuda") for d in v.prov.get("device", []))
    if not gpu or [c for c in v.prov.get("compile", []) if c != "off"]:
        return ""
    return ("GPU timings are of eager PyTorch (`compile: off`): small 16-bit steps wait on kernel launches "
            "(docs/gpu.md); `train.<stage>.compile: reduce-overhead` measures the compiled step.")


def _scale_caveat(v: _View) -> str:
    sizes = [float(x) for x in v.prov.get("model_parameters", []) if _isnum(x)]
    if sizes and max(sizes) >= TINY_MODEL_PARAMETERS:
        return ""
    return ("Small scale: a tiny BERT, short training, few seeds; effects of long training or large models "
            "(e.g. fp16 overflow in activations) will not show here.")


def _load_caveat(v: _View) -> str:
    load = v.stats.get("load") or {}
    if not v.cpu or not (load.get("n_oversubscribed") or 0) > 0:
        return ""
    return (f"{load['n_oversubscribed']} of {load.get('n_runs_checked')} CPU runs ran with a 1-minute load above "
            f"{load.get('threshold', 1.25):g}× the CPU count ({'/'.join(map(str, load.get('cpu_count') or []))}; "
            f"highest {load.get('max_load', math.nan):.1f}): their time ratios are unreliable; rerun with fewer "
            "parallel jobs (`--cores`).")


def _bootstrap_caveat(v: _View) -> str:
    bmin = v.stats.get("bootstrap_min_pairs")
    if not (bmin and v.stats.get("settings", {}).get("bootstrap_resamples", 0)) or not any(
            2 <= (r.get("n_pairs") or 0) < bmin for r in v.deltas):
        return ""
    return f"Bootstrap CIs only from {bmin} paired seeds on; rows with fewer show the t CI alone."


def _wilcoxon_caveat(v: _View) -> str:
    from .paired import _sign_seeds

    w_min = int(_sign_seeds(v.alpha, "two-sided"))
    small = sorted({f"`{r['a']}` vs `{r['b']}`" for r in v.deltas if r.get("metric") == v.acc
                    and r.get("family") != "stage1" and (r.get("n_pairs") or 0) < w_min})
    if not small:
        return ""
    return (f"Below {w_min} paired seeds the Wilcoxon test cannot reach p < {v.alpha:g} ({', '.join(small)}); "
            "the labels use the paired t-test.")


def _provenance(v: _View) -> str:
    def pv(k: str) -> str:
        vals = v.prov.get(k) or []
        return f"{len(vals)} values (see runs.csv)" if len(vals) > 3 else ", ".join(f"`{x}`" for x in vals) or "unknown"

    n_per = sorted({i.get("n_runs") for i in v.info.values()})
    items = [("device", f"{pv('device')} ({pv('device_name')})"), ("torch", pv("torch_version")),
             ("transformers", pv("transformers_version"))]
    items += [("CUDA", pv("cuda_version"))] if v.prov.get("cuda_version") else []
    items += [("git commit", pv("git_commit")), ("threads", pv("threads")), ("memory measured as", pv("memory_kind")),
              ("runs per schedule", "/".join(map(str, n_per))), ("baseline", f"`{v.baseline}`"),
              ("alpha", f"{v.alpha:g} (paired t-tests, Holm-adjusted per metric)"),
              ("equivalence margin", f"{_pm(v.margin)} of accuracy"),
              ("reported split", v.split)]
    items += [(k.replace("_", " "), pv(k)) for k in ("cpu_isa",) + CPU_KEYS if v.prov.get(k)]
    return "## Holds for\n\n" + md_table(["", ""], [[k, x] for k, x in items])


def render_front(stats: dict, sequential: dict | None = None) -> str:
    """The answer for the report's landing page in reStructuredText (workflow/report/workflow.rst includes it): the
    title by design, the headline table, the answer sentences and the table's note, as at the top of verdict.md."""
    v = _View(stats, sequential)
    text, scale = title(v)
    header, rows, note = headline(v)
    # `name` is inline code in Markdown; the same with reST's default role set to literal (reset at the end)
    out = [".. default-role:: literal", "", text, "=" * len(text), "", scale, ""]
    if rows:
        buf = io.StringIO()
        csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows([header, *rows])
        out += [".. csv-table::", "   :header-rows: 1", "   :widths: auto", "   :class: headline", ""]
        out += ["   " + line for line in buf.getvalue().splitlines()] + [""]
    out += [_answer(v), "", _control(v), "", note if rows else "", "", ".. default-role::", ""]
    return "\n".join(out)


def _hours(seconds: Any) -> str:
    if not _isnum(seconds) or not math.isfinite(seconds):
        return "n/a"
    return f"{seconds / 3600:.2f} h" if abs(seconds) >= 3600 else f"{seconds:,.0f} s"


def _sequential(seq: dict | None) -> str:
    """A sequential study (precswitch sequential's sequential.json): per comparison the seeds it used, why it
    stopped, and the seeds and training time saved against the fixed design of the same power."""
    if not seq:
        return ""
    why = {"different": "interval excludes 0", "equivalent": f"interval inside {_pm(seq['margin'])}",
           "inconclusive": f"max seeds ({seq['max_seeds']}) reached, not settled", "continue": "still open"}
    def end(x, unbounded):  # sequential.json has null for an unbounded end
        return diff(x) if finite(x) else unbounded

    rows = []
    for r in seq["comparisons"]:
        estimate = (f"{diff(r['mean'])} [{end(r['lo'], '−∞')}, {end(r['hi'], '+∞')}]"
                    if finite(r["mean"]) else "no pairs")
        rows.append([f"`{r['a']}` vs `{r['b']}`", f"**{r['decision']}** ({why.get(r['decision'], '')})",
                     r["seeds"], estimate, r["fixed_seeds"] or "n/a",
                     "n/a" if r["seeds_saved"] is None else r["seeds_saved"], _hours(r["seconds_saved"])])
    per = ", ".join(f"`{k}` {n}" for k, n in seq["seeds_per_schedule"].items())
    fixed = seq["fixed_seeds"]
    total = (f"Training time spent: {_hours(seq['train_seconds'])}; the fixed design of the same power "
             + (f"({fixed} seeds for every schedule) would take {_hours(seq['fixed_train_seconds'])}"
                if fixed else "could not be sized (no seed SD)")
             + f", and {seq['max_seeds']} seeds for every schedule {_hours(seq['max_train_seconds'])}.")
    return ("## Sequential seeds\n\n"
            f"Each comparison stopped at its first settled look (anytime-valid {1 - seq['alpha']:.0%} confidence "
            f"sequence of the paired accuracy difference, in points; docs/sequential.md). Fixed = the paired seeds a "
            f"fixed design with power {seq['power']:g} at the comparison's seed SD needs to reach the same "
            f"conclusion, sized knowing the observed difference (to detect it when *different*, to show "
            f"equivalence within {_pm(seq['margin'])} when *equivalent*, a {_pm(seq['margin'])} difference "
            "otherwise): hindsight no fixed design has; saved = fixed − used, times the seconds of one seed of its "
            "schedules.\n\n"
            + md_table(["comparison", "stopped", "seeds", "difference [interval]", "fixed", "seeds saved",
                        "training time saved"], rows)
            + f"\n\nSeeds run per schedule: {per}. {total}")


def write_verdict(stats_path: str | os.PathLike, out_path: str | os.PathLike,
                  front_path: str | os.PathLike | None = None,
                  sequential_path: str | os.PathLike | None = None) -> str:
    """verdict.md from stats.json (and a sequential study's sequential.json); with ``front_path`` also the report's
    landing-page answer (render_front)."""
    from ..io import atomic_write_text

    p = Path(stats_path)
    if not p.is_file():
        raise PrecswitchError(f"stats file not found: {p} (run `precswitch stats` first)")
    try:
        stats = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise PrecswitchError(f"stats file {p} is not valid JSON: {e}") from None
    sequential = json.loads(Path(sequential_path).read_text(encoding="utf-8")) if sequential_path else None
    text = render(stats, sequential)
    if front_path is not None:
        atomic_write_text(front_path, render_front(stats, sequential))
    atomic_write_text(out_path, text)
    return text
