"""results/verdict.md: the answer to the question, one paragraph per schedule, caveats.

Everything comes from stats.json (written by ``precswitch stats``), whose ``provenance`` block is taken
from the runs table's provenance columns (device, versions, git commit, config hash).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from ..errors import PrecswitchError
from ..specs import describe, first_precision
from .stats import (
    NEGLIGIBLE_LOSS_FRACTION,
    _sign_seeds,
    conf_level,
    diff_label,
    fmt_num,
    fmt_p,
    fmt_triple,
    loss_negligible,
    not_significant,
)

TITLE = "Pre-train in 16 bits, fine-tune in fp32: does accuracy go up or down?"

#: what each family of precision names keeps in which format (README's table), for the verdict's
#: "in this study" line; a switch spec (amp_fp16-to-fp32-at80) counts as its first precision
PRECISION_KINDS = (
    ("fp32", "fp32 throughout, TF32 off"),
    ("tf32", "fp32 weights, TF32 tensor-core matmuls"),
    ("amp_", "mixed precision (fp32 master weights, fp16/bf16 compute)"),
    ("pure_", "pure 16 bits (weights, gradients and optimizer state in fp16/bf16)"),
    ("fp8", "fp8 matmuls (fp32 master weights)"),
)


def precision_kind(spec: str) -> str:
    name = first_precision(spec)
    for prefix, kind in PRECISION_KINDS:
        if name == prefix or (prefix.endswith("_") and name.startswith(prefix)):
            return kind
    return "other"


def _formats(kind: str, specs: list[str]) -> str:
    """The kind's 'fp16/bf16' narrowed to the 16-bit formats its precisions use: `amp_bf16` alone computes
    in bf16, not 'fp16/bf16'."""
    names = [first_precision(x) for x in specs]
    used = [f for f in ("fp16", "bf16") if any(f in n for n in names)]
    return kind.replace("fp16/bf16", "/".join(used)) if used else kind


def _stage1_kinds(specs) -> str:
    """'**Stage 1 ran in:** fp32: ...; amp_bf16, amp_fp16: mixed precision (...). No stage 1 ...' for the
    stage-1 precisions of this study, so a reader of the question knows which "low precision" answered it."""
    groups: dict[str, list[str]] = {}
    for spec in sorted(map(str, specs)):
        groups.setdefault(precision_kind(spec), []).append(spec)
    if not groups:
        return ""
    order = [k for _, k in PRECISION_KINDS] + ["other"]
    parts = [", ".join(f"`{x}`" for x in groups[k]) + (f": {_formats(k, groups[k])}" if k != "other" else "")
             for k in order if k in groups]
    mixed, pure = PRECISION_KINDS[2][1] in groups, PRECISION_KINDS[3][1] in groups
    tail = ""
    if mixed and not pure:
        tail = (" No stage 1 kept its weights in 16 bits (`pure_fp16`, `pure_bf16`), so the answer below is "
                "about mixed precision.")
    elif pure and not mixed:
        tail = " No stage 1 used mixed precision (`amp_fp16`, `amp_bf16`)."
    return f"**Stage 1 ran in:** {'; '.join(parts)}.{tail}"


def _param_span(values: list) -> str:
    """'108.3M' or '108.3M-108.9M' (a masked-LM and a classification head differ in size); '22.6k' below 0.1M
    (not '0.0M')."""
    lo, hi = (f"{v / 1e6:.1f}M" if v >= 1e5 else f"{v / 1e3:.1f}k"
              for v in (min(map(float, values)), max(map(float, values))))
    return lo if lo == hi else f"{lo}-{hi}"


#: below this many parameters the verdict calls the model tiny (the embedded default has ~1M; BERT-small
#: ~29M, BERT-base 108M) and says its numbers need not transfer to BERT-base/large
TINY_MODEL_PARAMETERS = 10_000_000


def _f(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _pt(v: Any, nd: int = 2, sign: bool = True) -> str:
    if not _f(v):
        return "n/a"
    s = f"{v:+.{nd}f}" if sign else f"{v:.{nd}f}"
    return s.replace("-", "−")


_p = fmt_p


def _n(v: Any, nd: int = 2, sig: int = 2, sign: bool = True) -> str:
    """A difference with at least ``sig`` significant digits (a tiny value never prints as 0.000)."""
    return fmt_num(v, nd, sig, sign) if _f(v) else "n/a"


#: a memory ratio with no pair left after dropping the seeds whose two runs started differently (stats.py)
MEMORY_NOT_COMPARED = "not compared (in every seed with both runs, one was started warm, the other cold)"


def _ratio(r: dict | None) -> str:
    """×0.87 [0.86, 0.88]; more decimals (up to 4) where 2 would print a CI as one number (×0.969 [0.967,
    0.972], not ×0.97 [0.97, 0.97])."""
    if not r or not _f(r.get("mean")):
        return "n/a"
    lo, hi, dec = r.get("ci_low"), r.get("ci_high"), 2
    ci = _f(lo) and _f(hi)
    if ci:
        while dec < 4 and lo != hi and f"{lo:.{dec}f}" == f"{hi:.{dec}f}":
            dec += 1
    s = f"×{r['mean']:.{dec}f}"
    if ci:
        s += f" [{lo:.{dec}f}, {hi:.{dec}f}]"
    return s


def _saved(r: dict | None, what: str) -> str:
    """The label of a time/memory ratio with its Holm-adjusted p: '13% time saved, Holm p 0.004' or
    'not significant after Holm, p 0.081; only the unadjusted CI excludes ×1'."""
    if not r or not _f(r.get("mean")):
        return ""
    m = r["mean"]
    sig = r.get("classification") in ("better", "worse", "higher", "lower")
    if not sig:
        return not_significant(r)
    pct = abs(1 - m) * 100
    # the style by the printed value: ×0.90 is 9.999…% in floating point, '10%' like ×1.10's, not '10.0%'
    pct_s = f"{pct:.0f}%" if pct >= 9.95 else (f"{pct:.1f}%" if pct >= 0.095 else f"{fmt_num(pct, 2, 2)}%")
    if what == "throughput":  # higher is better: nothing is "saved"
        lab = f"{pct_s} {'more' if m > 1 else 'less'} throughput"
    else:
        lab = f"{pct_s} {what} saved" if m < 1 else f"{pct_s} more {what}"
    return f"{lab}, Holm p {_p(r.get('p_holm'))}"


def _count(n: Any, one: str, many: str | None = None) -> str:
    """'1 paired seed', '3 paired seeds'."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


def _pm(margin: float) -> str:
    return f"±{margin:g} point" + ("" if margin == 1 else "s")


def _all_degenerate(i: dict) -> bool:
    return bool(i.get("n_used")) and i.get("n_degenerate") == i.get("n_used")


class _Deltas:
    def __init__(self, rows: list[dict]):
        self.rows = rows

    def get(self, family: str, a: str, b: str, metric: str) -> dict | None:
        for r in self.rows:
            if r.get("family") == family and r.get("a") == a and r.get("b") == b and r.get("metric") == metric:
                return r
        return None

    def any(self, a: str, b: str, metric: str) -> dict | None:
        return (self.get("named", a, b, metric) or self.get("vs_baseline", a, b, metric))


def _acc_phrase(r: dict | None, margin: float, conf: int, with_p: bool = False) -> str:
    """'+0.17 points [unadjusted 95% CI −0.74, +1.09], 8 paired seeds' (with_p: and the Holm/TOST p
    the classification rests on)"""
    if not r or not _f(r.get("mean")):
        return "no paired seeds"
    # at least 2 significant digits, the CI in the mean's style: a difference of 0.004 points is not "+0.00"
    m, lo, hi = fmt_triple(r["mean"], r.get("ci_low"), r.get("ci_high"))
    s = f"{m} points"
    if _f(r.get("ci_low")) and _f(r.get("ci_high")):
        s += f" [unadjusted {conf}% CI {lo}, {hi}]"
    if with_p and _f(r.get("p_holm")):
        s += f", Holm p {_p(r['p_holm'])}"
        if r.get("classification") == "equivalent" and _f(r.get("tost_p")):
            s += f", TOST p {_p(r['tost_p'])}"
    s += f", {_count(r.get('n_pairs'), 'paired seed')}"
    return s


def _class_phrase(r: dict | None, b: str, margin: float) -> str:
    """What the bold label means for this comparison with ``b``, without repeating the label."""
    c = (r or {}).get("classification", "insufficient data")
    if c == "better":
        s = f"more accurate than {b}"
    elif c == "worse":
        s = f"less accurate than {b}"
    elif c == "equivalent":
        s = f"the same accuracy as {b} within {_pm(margin)}"
    elif c == "inconclusive":
        s = f"neither a significant difference from {b} nor a CI inside {_pm(margin)}"
    else:
        s = "fewer than 2 paired seeds with results"
    if c in ("better", "worse") and r and r.get("within_margin"):
        s += f", though by less than the {_pm(margin)} margin"
    return s


def _question_phrase(a: str, b: str, info: dict) -> str:
    """What a contrast asks, derived from the schedules' precisions."""
    ia, ib = info.get(a, {}), info.get(b, {})
    a1, a2, b1, b2 = (describe(x) if isinstance(x, str) else x  # pure_fp16 with adam_eps 0.0001: overrides in words
                      for x in (ia.get("stage1_precision"), ia.get("stage2_precision"),
                                ib.get("stage1_precision"), ib.get("stage2_precision")))
    if a1 and a1 == b1 and a2 != b2:
        return f"After {a1} pre-training, fine-tuning in {a2} instead of {b2}"
    if a2 and a2 == b2 and a1 != b1 and a1 and b1:
        return f"Pre-training in {a1} instead of {b1} (fine-tuning in {a2} both times)"
    return f"Schedule {a} ({a1 or 'no stage 1'} → {a2}) against {b} ({b1 or 'no stage 1'} → {b2})"


def _effect_verb(r: dict | None, margin: float) -> str:
    """'raises accuracy'; with ', though by less than the ±1 point margin' when the whole CI lies inside it,
    as in the schedule's paragraph (the Answer is what most readers read)."""
    c = (r or {}).get("classification", "insufficient data")
    s = {
        "better": "raises accuracy",
        "worse": "lowers accuracy",
        "equivalent": f"leaves accuracy unchanged within {_pm(margin)}",
        "inconclusive": "has an inconclusive effect on accuracy",
    }.get(c, "cannot be judged (fewer than 2 paired seeds with results)")
    if c in ("better", "worse") and r and r.get("within_margin"):
        s += f", though by less than the {_pm(margin)} margin"
    return s


def _failed_phrase(info: dict, names) -> str:
    """'`pf16-pf16` failed in 2 of 2 seeds (2 diverged)' for the schedules among ``names`` with failed runs, and
    '`x` has no result for seed(s) 2 ...' for those missing a seed the others have."""
    bits = []
    for x in names:
        i = info.get(x, {})
        if i.get("n_failed"):
            kinds = [f"{i[k]} {w}" for k, w in (("n_diverged", "diverged"), ("n_skipped", "skipped")) if i.get(k)]
            other = i["n_failed"] - sum(i.get(k) or 0 for k in ("n_diverged", "n_skipped"))
            if other > 0:
                kinds.append(f"{other} without a finite accuracy")
            if i.get("n_skipped") == i["n_failed"]:  # not run (e.g. a precision this device lacks): no numerical failure
                bits.append(f"`{x}` was not run in {i['n_failed']} of {i.get('n_runs')} seeds (skipped: see its paragraph)")
            else:
                bits.append(f"`{x}` failed in {i['n_failed']} of {i.get('n_runs')} seeds ({', '.join(kinds)})")
        if i.get("missing_seeds"):  # fewer pairs than seeds: say which, as its paragraph does
            bits.append(f"`{x}` has no result for seed(s) {', '.join(map(str, i['missing_seeds']))} "
                        "(see its paragraph)")
    return "; ".join(bits)


def _needs(r: dict | None, margin: float, power: float) -> str:
    if not r:
        return ""
    bits = []
    if _f(r.get("seeds_needed")):
        bits.append(f"about {int(r['seeds_needed'])} paired seeds would detect a {margin:g}-point difference "
                    f"with {power * 100:.0f}% power after Holm (observed paired SD {_pt(r.get('sd'), 2, False)} points)")
    if _f(r.get("seeds_needed_equivalence")):
        bits.append(f"about {int(r['seeds_needed_equivalence'])} would put the CI inside {_pm(margin)} "
                    "if the observed mean and SD held")
    elif _f(r.get("mean")) and abs(r["mean"]) >= margin:
        bits.append("the observed mean is outside the margin, so equivalence is not in reach")
    return "; ".join(bits)


def _loss_phrase(el: dict, base_loss: Any, b1: str) -> str:
    """'eval loss −6.6e−5 nats [−1.0e−4, −3.1e−5] (−0.0031% of fp32's 2.15 nats; better, Holm p 0.031 —
    negligible: the whole CI is within ±0.1% of the loss)'"""
    lo, hi = el.get("ci_low"), el.get("ci_high")
    m, l, h = fmt_triple(el["mean"], lo, hi)
    s = f"eval loss {m} nats"
    if _f(lo) and _f(hi):
        s += f" [{l}, {h}]"
    bits = []
    rel = _f(base_loss) and base_loss > 0
    if rel:
        bits.append(f"{_n(el['mean'] / base_loss * 100, 1)}% of {b1}'s {base_loss:.3g} nats")
    lab = diff_label(el)
    if rel and loss_negligible(lo, hi, base_loss):
        lab += (f" — negligible: the whole CI is within ±{NEGLIGIBLE_LOSS_FRACTION * 100:g}% of the loss"
                if el.get("classification") in ("better", "worse") else
                f"; negligible either way: the whole CI is within ±{NEGLIGIBLE_LOSS_FRACTION * 100:g}% of the loss")
    bits.append(lab)
    return s + f" ({'; '.join(bits)})"


def _stage1_relation(stats: dict, a: str, b: str) -> str:
    """shared | different | none (stats.json ``stage1_relation``; older files: from the precisions)."""
    rel = (stats.get("stage1_relation") or {}).get(f"{a} vs {b}")
    if rel:
        return rel
    info = stats.get("schedules", {})
    a1, b1 = info.get(a, {}).get("stage1_precision"), info.get(b, {}).get("stage1_precision")
    if not a1 or not b1:
        return "none"
    return "shared" if a1 == b1 else "different"


def _cost_phrase(D: _Deltas, stats: dict, a: str, b: str, family: str = "named") -> str:
    """Time and memory of a named contrast: the totals when the two schedules' stage 1 differs, else
    (shared stage-1 runs, or no stage 1 on one side) stage 2 alone, saying so."""
    rel = _stage1_relation(stats, a, b)
    if rel in ("shared", "none"):
        t = D.get(family, a, b, "stage2_train_seconds")
        mem = D.get(family, a, b, "stage2_peak_memory_bytes")
        t_what, m_what = "the stage-2 (fine-tuning) training time", "the stage-2 peak memory"
        if rel == "shared":
            why = ("stage 2 only: both schedules start from the very same stage-1 runs, which add the same "
                   "time to both totals and set both peak memories")
        else:
            lone = [x for x in (a, b) if not _has_stage1(stats, x)] or [a, b]
            why = (f"stage 2 only: {' and '.join(f'`{x}`' for x in lone)} "
                   f"{'has' if len(lone) == 1 else 'have'} no stage 1 (fine-tunes model.init), so the totals "
                   "would not compare like with like")
    else:
        t = D.get(family, a, b, "total_train_seconds")
        mem = D.get(family, a, b, "peak_memory_bytes")
        t_what, m_what, why = "the total training time", "the peak memory over both stages", ""
    tail = []
    if t and _f(t.get("mean")):
        tail.append(f"takes {_ratio(t)} {t_what} ({_saved(t, 'time')})")
    if mem and _f(mem.get("mean")):
        tail.append(f"{_ratio(mem)} {m_what} ({_saved(mem, 'memory')})")
    if not tail:
        return ""
    return "; it " + " and ".join(tail) + (f" — {why}" if why else "")


def _has_stage1(stats: dict, s: str) -> bool:
    """Whether schedule ``s`` has a stage-1 run (stats.json ``has_stage1``; older files: whether a paired
    stage-1 time exists for it)."""
    i = stats.get("schedules", {}).get(s) or {}
    if "has_stage1" in i:
        return bool(i["has_stage1"])
    return any(rr.get("metric") == "stage1_train_seconds" and s in (rr.get("a"), rr.get("b"))
               and _f(rr.get("mean")) for rr in stats.get("deltas", []))


def render(stats: dict) -> str:
    s = stats.get("settings", {})
    margin, alpha, power = s.get("margin", 1.0), s.get("alpha", 0.05), s.get("power", 0.8)
    conf = conf_level(alpha)
    baseline = stats.get("baseline")
    info: dict = stats.get("schedules", {})
    D = _Deltas(stats.get("deltas", []))
    prov: dict = stats.get("provenance", {})
    out: list[str] = [f"# {TITLE}", ""]
    out.append(f"**Question.** {stats.get('question', '')}")
    out.append("")
    kinds = _stage1_kinds(stats.get("stage1_precisions", {}))
    if kinds:
        out += [kinds, ""]

    def pv(k: str) -> str:
        v = prov.get(k) or []
        if len(v) > 3:
            return f"{len(v)} distinct values (per run; see runs.csv)"
        return ", ".join(f"`{x}`" for x in v) if v else "unknown"

    seeds = sorted({x for i in info.values() for x in i.get("seeds", [])}, key=lambda x: (str(type(x)), x))
    n_per = sorted({i.get("n_runs") for i in info.values()})
    out.append("**Holds for:** "
               f"device {pv('device')} ({pv('device_name')}); torch {pv('torch_version')}, "
               f"transformers {pv('transformers_version')}"
               + (f", CUDA {pv('cuda_version')}" if prov.get("cuda_version") else "")
               + f"; git commit {pv('git_commit')}; "
               f"threads {pv('threads')}"
               + (f"; model {_param_span(prov['model_parameters'])} parameters" if prov.get("model_parameters") else "")
               + (f"; training step compiled: {pv('compile')}" if prov.get("compile") else "")
               + f"; memory measured as {pv('memory_kind')}"
               + (f" in {pv('process_start')}-started processes" if prov.get("process_start") else "") + ". "
               f"Seeds {', '.join(map(str, seeds))} ({'/'.join(map(str, n_per))} run{'' if n_per == [1] else 's'} per schedule); "
               f"baseline `{baseline}`; equivalence margin {_pm(margin)} of accuracy; alpha {alpha:g} "
               f"(paired t-tests, Holm-adjusted per metric over every schedule comparison below, each counted once). "
               f"Intervals in brackets are "
               f"unadjusted {conf}% t CIs of one comparison; labels (better/worse, significant, saved) use "
               f"the Holm-adjusted p shown beside them, so an interval can exclude 0 (or ×1) while the label "
               f"says not significant. Per-run hyper-parameter hashes: `config_hash` in runs.csv.")
    out.append("")

    # ---------------- answer
    out.append("## Answer")
    out.append("")
    sentences = []
    answered = [(a, b, "named") for a, b in stats.get("named_contrasts", [])]
    if not answered and not stats.get("missing_contrasts"):
        # no contrasts configured (analysis.contrasts: []): answer with each schedule against the baseline
        answered = [(a, baseline, "vs_baseline") for a in sorted(info) if a != baseline]
    for a, b, family in answered:
        r = D.get(family, a, b, "accuracy")
        sent = (f"{_question_phrase(a, b, info)} {_effect_verb(r, margin)} "
                f"(`{a}` − `{b}`: {_acc_phrase(r, margin, conf, with_p=True)})")
        sent += _cost_phrase(D, stats, a, b, family)
        dead = [x for x in (a, b) if _all_degenerate(info.get(x, {}))]
        if dead:
            sent += (f" — but every finished run of {' and '.join(f'`{x}`' for x in dead)} predicts only the "
                     "majority class: the task was not learnt, so this says nothing about precision")
        failed = _failed_phrase(info, (a, b))
        if failed:  # a failure is a finding: say it here, not only in the per-schedule paragraphs
            sent += f"; {failed}"
        sentences.append(sent + ".")
    if not sentences and set(info) <= {baseline} and not stats.get("missing_contrasts"):
        sentences.append(f"Only the baseline schedule `{baseline}` ran: there is nothing to compare it with "
                         "(add schedules to the config to answer the question); its own figures are below.")
    elif not sentences:
        sentences.append("None of the configured contrasts could be computed: see the per-schedule paragraphs.")
    for a, b in stats.get("missing_contrasts", []):
        sentences.append(f"The contrast `{a}` vs `{b}` was not run (schedule missing).")
    load = stats.get("load") or {}
    if (any(str(d).startswith("cpu") for d in prov.get("device", []))
            and (load.get("n_oversubscribed") or 0) > 0):
        # the time ratios above come from these runs: say so here, not only in the Caveats at the end
        sentences.append(f"Timings: {load['n_oversubscribed']} of {load.get('n_runs_checked')} runs ran on an "
                         "oversubscribed machine, so the time ratios above are unreliable (see Caveats); "
                         "accuracy and memory are not affected.")
    if stats.get("process_starts") and (stats.get("memory_pairs_mixed_starts") or 0) > 0:
        sentences.append("Memory: the ratios above leave out every seed whose two runs were started differently "
                         "(warm vs cold: their RSS is not comparable; see Caveats).")
    out.append(" ".join(sentences))
    out.append("")
    out.append(f"Accuracy is the fine-tuned model's accuracy on the eval split; differences are in percentage "
               f"points, paired by seed. A schedule is *better/worse* when the Holm-adjusted paired t-test gives "
               f"p < {alpha:g}; *equivalent* when it is not and the whole {conf}% CI lies inside {_pm(margin)} "
               f"(TOST p < {alpha:g}); otherwise *inconclusive*.")
    out.append("")

    # ---------------- per schedule
    out.append(f"## Per schedule (against `{baseline}`)")
    out.append("")
    order = [baseline] + sorted(k for k in info if k != baseline)
    for name in order:
        i = info.get(name)
        if i is None:
            continue
        head = (f"**{name}** (stage 1 {i.get('stage1_precision') or 'none (fine-tune only)'} → stage 2 "
                f"{i.get('stage2_precision')}; {i.get('n_used')} of {_count(i.get('n_runs'), 'run')} used)")
        parts = []
        acc = i.get("accuracy_points", {})
        acc_s = f"accuracy {_pt(acc.get('mean'), 2, False)}%" if _f(acc.get("mean")) else "no finished runs"
        if _f(acc.get("ci_low")):
            acc_s += f" [{conf}% CI {_pt(acc['ci_low'], 2, False)}, {_pt(acc['ci_high'], 2, False)}]"
        if _f(acc.get("std")):
            acc_s += f", seed SD {_pt(acc['std'], 2, False)} points"
        if name == baseline:
            parts.append(f"{head}: the baseline; {acc_s}.")
        else:
            r = D.get("vs_baseline", name, baseline, "accuracy")
            c = (r or {}).get("classification", "insufficient data")
            label = {"better": "BETTER", "worse": "WORSE", "equivalent": "EQUIVALENT",
                     "inconclusive": "INCONCLUSIVE"}.get(c, "NOT JUDGED")
            if c != "insufficient data" and _all_degenerate(i) and _all_degenerate(info.get(baseline, {})):
                label += ", BUT NOT INFORMATIVE: both only predict the majority class"
            txt = f"{head}: **{label}** — {_class_phrase(r, baseline, margin)}. {acc_s[:1].upper()}{acc_s[1:]}; "
            txt += f"paired difference {_acc_phrase(r, margin, conf)}"
            if r and _f(r.get("boot_low")) and _f(r.get("boot_high")):
                _, blo, bhi = fmt_triple(r["mean"], r["boot_low"], r["boot_high"])
                txt += f" (bootstrap CI {blo}, {bhi})"
            if r:
                txt += (f"; paired t Holm p {_p(r.get('p_holm'))}, Wilcoxon p {_p(r.get('p_wilcoxon'))}, "
                        f"TOST p {_p(r.get('tost_p'))}")
                if _f(r.get("mde")) and r["mde"] > 0:
                    txt += f"; with these seeds a difference of {_pt(r['mde'], 2, False)} points is detectable at {power * 100:.0f}% power after Holm"
            txt += "."
            if c == "inconclusive":
                n = _needs(r, margin, power)
                if n:
                    txt += f" To resolve it: {n}."
            parts.append(txt)
            # time and memory
            shared1 = _stage1_relation(stats, name, baseline) == "shared"
            tm = []
            for col, lab in (("stage1_train_seconds", "stage 1"), ("stage2_train_seconds", "stage 2"),
                             ("total_train_seconds", "total")):
                rr = D.get("vs_baseline", name, baseline, col)
                if shared1 and col == "stage1_train_seconds":
                    tm.append("stage 1 shared with the baseline (the same runs)")
                elif rr and _f(rr.get("mean")):
                    tm.append(f"{lab} {_ratio(rr)} ({_saved(rr, 'time')})")
            mm = []
            for col, lab in (("stage1_peak_memory_bytes", "stage 1"), ("stage2_peak_memory_bytes", "stage 2")):
                rr = D.get("vs_baseline", name, baseline, col)
                if shared1 and col == "stage1_peak_memory_bytes":
                    continue
                if rr and _f(rr.get("mean")):
                    mm.append(f"{lab} {_ratio(rr)} ({_saved(rr, 'memory')})")
                elif rr and (rr.get("n_mixed_starts") or 0) > 0:
                    mm.append(f"{lab} {MEMORY_NOT_COMPARED}")
            th = D.get("vs_baseline", name, baseline, "stage2_samples_per_second")
            line = []
            if tm:
                line.append(f"Training time vs baseline (geometric-mean ratio [unadjusted {conf}% CI], paired "
                            "log-ratios): " + "; ".join(tm))
            if mm:
                line.append("Peak memory: " + "; ".join(mm))
            if th and _f(th.get("mean")):
                line.append(f"Stage-2 throughput {_ratio(th)} ({_saved(th, 'throughput')})")
            if line:
                parts.append(". ".join(line) + ".")
        # health
        h = []
        if i.get("n_failed"):
            fl = "; ".join(f"seed {f.get('seed')}: {f.get('outcome')}" + (f" ({f['reason']})" if f.get("reason") else "")
                           for f in i.get("failed", []))
            h.append(f"{i['n_failed']} failed run(s), excluded from the means and counted — {fl}")
        if i.get("missing_seeds"):
            h.append(f"no result at all for seed(s) {', '.join(map(str, i['missing_seeds']))}, which other "
                     "schedules have (no fine-tuning metrics were aggregated: not run, not finished, or its "
                     "stage 1 failed); these seeds are missing from its pairs")
        if _all_degenerate(i):
            h.append("EVERY finished run is degenerate (accuracy ≤ majority class): the task was not learnt, "
                     "so accuracy comparisons with this schedule say nothing about precision")
        elif i.get("n_degenerate"):
            h.append(f"{i['n_degenerate']} degenerate run(s) (accuracy ≤ majority class; kept in the statistics): "
                     f"seeds {', '.join(map(str, i.get('degenerate_seeds', [])))}")
        for k, lab in (("stage1_skipped_steps", "stage 1"), ("stage2_skipped_steps", "stage 2")):
            if _f(i.get(k)) and i[k] > 0:
                h.append(f"{_count(int(i[k]), 'skipped optimizer step')} in {lab} (loss-scale overflow), over all seeds")
        if _f(i.get("nonfinite_losses")) and i["nonfinite_losses"] > 0:
            h.append(f"{_count(int(i['nonfinite_losses']), 'non-finite loss', 'non-finite losses')} over both stages")
        for k, lab in (("stage1_loss_scale_min", "stage 1"), ("stage2_loss_scale_min", "stage 2")):
            if _f(i.get(k)) and i[k] < 1:
                h.append(f"the {lab} loss scale fell to {i[k]:g} (gradients underflow or overflow persistently)")
        if h:
            parts.append("Numeric health: " + "; ".join(h) + ".")
        elif not any(_f(i.get(k)) for k in ("stage2_skipped_steps", "nonfinite_losses")):
            # runs.csv without the counters (hand-made or older metrics.json): not "none", unknown
            parts.append("Numeric health: no failed runs; skipped steps and non-finite losses not recorded.")
        else:
            parts.append("Numeric health: no failed runs, no skipped steps, no non-finite losses.")
        out.append(" ".join(parts))
        out.append("")

    # ---------------- stage 1
    b1 = stats.get("stage1_baseline_precision")
    st1 = [r for r in stats.get("deltas", []) if r.get("family") == "stage1"]
    if b1 and (st1 or len(stats.get("stage1_precisions") or {}) > 1):  # something to compare b1 with
        out.append(f"## Stage 1 on its own (pre-training, against {b1})")
        out.append("")
        base_loss = ((stats.get("stage1_summary") or {}).get(b1) or {}).get("eval_loss", {}).get("mean")
        out.append("Masked-LM eval metrics of the pre-trained models, paired by seed. At small scale a "
                   "pre-training precision effect may show here without reaching fine-tuning accuracy. "
                   f"Brackets: unadjusted {conf}% CIs; labels from Holm-adjusted p over the stage-1 comparisons "
                   f"(each stage 1 against {b1}, then those of the named contrasts whose stage 1s differ). "
                   "Paired seeds share data and masks, so a loss difference far too small to matter can still be "
                   f"significant: one whose whole CI lies within ±{NEGLIGIBLE_LOSS_FRACTION * 100:g}% of "
                   f"the other stage 1's eval loss is called negligible.")
        out.append("")
        summary1 = stats.get("stage1_summary") or {}
        pairs = sorted({(r["a"], r["b"]) for r in st1 if r["b"] == b1}) + list(
            dict.fromkeys((r["a"], r["b"]) for r in st1 if r["b"] != b1))
        for p, q in pairs:
            el, ma, ts, pm = (next((r for r in st1 if (r["a"], r["b"]) == (p, q) and r["metric"] == m), None)
                              for m in ("eval_loss", "mlm_accuracy", "train_seconds", "peak_memory_bytes"))
            bits = []
            if el and _f(el.get("mean")):
                q_loss = base_loss if q == b1 else (summary1.get(q) or {}).get("eval_loss", {}).get("mean")
                bits.append(_loss_phrase(el, q_loss, q))
            if ma and _f(ma.get("mean")):
                m, l, h = fmt_triple(ma["mean"], ma.get("ci_low"), ma.get("ci_high"))
                ci = f" [{l}, {h}]" if _f(ma.get("ci_low")) and _f(ma.get("ci_high")) else ""
                bits.append(f"masked-token accuracy {m} points{ci} ({diff_label(ma)})")
            if ts and _f(ts.get("mean")):
                bits.append(f"train time {_ratio(ts)} ({_saved(ts, 'time')})")
            if pm and _f(pm.get("mean")):
                bits.append(f"peak memory {_ratio(pm)} ({_saved(pm, 'memory')})")
            elif pm and (pm.get("n_mixed_starts") or 0) > 0:
                bits.append(f"peak memory {MEMORY_NOT_COMPARED}")
            # the pairs of the first metric with a result: a stage 1 without eval metrics (eval_loss null)
            # still has its time and memory pairs
            n = next((r.get("n_pairs") for r in (el, ma, ts, pm) if r and _f(r.get("mean"))), 0)
            cnt = stats.get("stage1_precisions", {}).get(p, {})
            fail = f"; {cnt.get('n_failed')} failed run(s)" if cnt.get("n_failed") else ""
            cnt_q = stats.get("stage1_precisions", {}).get(q, {}) if q != b1 else {}  # b1's are listed below
            fail += f"; {q}: {cnt_q.get('n_failed')} failed run(s)" if cnt_q.get("n_failed") else ""
            out.append(f"- **{p}** vs {q} ({_count(n, 'paired seed')}{fail}): " + ("; ".join(bits) if bits else "no paired data") + ".")
        bf = stats.get("stage1_precisions", {}).get(b1, {})
        if bf.get("n_failed"):
            out.append(f"- baseline {b1}: {bf['n_failed']} failed run(s).")
        out.append("")

    # ---------------- rules and caveats
    out.append("## How failures are counted")
    out.append("")
    out.append(stats.get("failure_rule", ""))
    out.append("")
    out.append("## Caveats")
    out.append("")
    cav = []
    devices = prov.get("device", [])
    if any(str(d).startswith("cpu") for d in devices):
        cav.append("Timings and memory were measured on a CPU. They say nothing about GPUs: there fp16/bf16 run on "
                   "tensor cores and memory is device memory. On a CPU the speed of fp16 and bf16 depends on the "
                   "instruction set (e.g. AMX for bf16), and peak memory is the process's peak RSS, which includes "
                   "the Python/torch runtime, not only tensors.")
    compiled = [c for c in prov.get("compile", []) if c != "off"]
    if any(str(d).startswith("cuda") for d in devices) and not compiled:
        cav.append("Timings on a GPU are of eager PyTorch (`compile: off`, the default). On an H200, BERT-base's "
                   "eager 16-bit steps at batch 32 waited on the host's kernel launches: amp_bf16 ran 2.2× fp32's "
                   "steps/s eager and 5× with CUDA graphs (docs/gpu.md). The time ratios here are eager PyTorch's "
                   "on this machine, not the GPU's limit; `train.<stage>.compile: reduce-overhead` measures the "
                   "compiled step. Accuracy and memory comparisons are not affected.")
    for k in ("device", "device_name", "torch_version", "transformers_version", "git_commit", "threads", "compile"):
        if len(prov.get(k, [])) > 1:
            cav.append(f"The runs do not share one {k} ({', '.join(prov[k])}): timings and results may not be comparable.")
    sizes = [float(x) for x in prov.get("model_parameters", [])]
    if not sizes or max(sizes) < TINY_MODEL_PARAMETERS:  # runs from before the key: assume the tiny default
        cav.append("Small scale: a tiny BERT, short training and few seeds. Effects that need long training or "
                   "large models (e.g. fp16 overflow in activations of large bf16-pretrained models) will not show "
                   "here, and the numbers need not transfer to BERT-base/large.")
    load = stats.get("load") or {}
    if any(str(d).startswith("cpu") for d in devices) and (load.get("n_oversubscribed") or 0) > 0:
        cc = "/".join(map(str, load.get("cpu_count") or [])) or "?"
        cav.append(f"The machine was oversubscribed during {load['n_oversubscribed']} of {load.get('n_runs_checked')} "
                   f"CPU runs: their 1-minute load average at the start or end of the training loop exceeded the "
                   f"CPU count ({cc}) by more than {load.get('threshold', 1.25) - 1:.0%} (highest load "
                   f"{load.get('max_load', math.nan):.1f}). Other work competed for the "
                   "cores, so those runs' timings are distorted and the time and throughput ratios are unreliable "
                   "(accuracy and peak memory are per process and not affected). Rerun with fewer parallel jobs (`--cores`) on an "
                   "otherwise idle machine for timings.")
    starts = stats.get("process_starts") or {}
    if len(starts) > 1:
        how = ", ".join(f"{k} {v}" for k, v in starts.items())
        cav.append(f"Peak memory here is each CPU process's RSS, and the runs were started two ways ({how}): a "
                   "warm-started process (forked from the warm-start server) does not count the shared-library "
                   "pages it never touches, so its RSS is about 120 MB below a cold one's (config/README.md, "
                   "`warm_start`). Memory ratios pair only seeds whose two runs started the same way (deltas.csv's "
                   "`n_mixed_starts` counts the seeds left out of each); the memory means in summary.md mix both. For memory figures, run every job one way (e.g. `warm_start: false`).")
    bmin = stats.get("bootstrap_min_pairs")
    if bmin and s.get("bootstrap_resamples", 0) and any(
            2 <= (r.get("n_pairs") or 0) < bmin for r in stats.get("deltas", [])):
        cav.append(f"Bootstrap CIs are only computed from {bmin} paired seeds on (n pairs allow only C(2n−1, n) "
                   "distinct resamples: 10 for n = 3); contrasts with fewer pairs show the t CI alone (empty "
                   "boot_low/boot_high in deltas.csv, no thin bar in the forest plot).")
    # the exact Wilcoxon test's smallest two-sided p is 2 / 2^n, the sign test's: 6 pairs at alpha 0.05
    w_min = int(_sign_seeds(alpha, "two-sided"))
    small = sorted({f"{r['a']} vs {r['b']}" for r in stats.get("deltas", [])
                    if r.get("metric") == "accuracy" and r.get("family") != "stage1"
                    and (r.get("n_pairs") or 0) < w_min})
    if small:
        cav.append(f"With fewer than {w_min} paired seeds the Wilcoxon signed-rank test cannot reach p < {alpha:g} "
                   f"({', '.join(small)}); the verdict uses the paired t-test.")
    cav.append("Train time is the training loop only (no setup, evaluation or checkpoint writes); time ratios "
               "are geometric means of per-seed ratios. Seed-to-seed noise in fine-tuning accuracy is often "
               "larger than any precision effect: read the CIs, not the means.")
    out.extend(f"- {c}" for c in cav)
    out.append("")
    return "\n".join(out)


def write_verdict(stats_path: str | os.PathLike, out_path: str | os.PathLike) -> str:
    from ..io import atomic_write_text

    p = Path(stats_path)
    if not p.is_file():
        raise PrecswitchError(f"stats file not found: {p} (run `precswitch stats` first)")
    try:
        stats = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise PrecswitchError(f"stats file {p} is not valid JSON: {e}") from None
    text = render(stats)
    atomic_write_text(out_path, text)
    return text
