"""verdict.md against hand-made stats.json: which words go with which numbers, what is (not) reported.

Every test renders a small stats dict (no fake study, no statistics run), so each one is milliseconds.
"""

from precswitch.analysis.verdict import _ratio, render

BASE = "fp32-fp32"


def _info(stage1="amp_fp16", **kw):
    i = {"stage1_precision": stage1, "stage2_precision": "fp32", "n_runs": 6, "n_used": 6, "n_failed": 0,
         "n_degenerate": 0, "seeds": [1, 2, 3, 4, 5, 6], "has_stage1": stage1 is not None,
         "stage2_skipped_steps": 0, "nonfinite_losses": 0,
         "accuracy_points": {"n": 6, "mean": 80.0, "std": 1.0, "ci_low": 79.0, "ci_high": 81.0}}
    i.update(kw)
    return i


def _stats(deltas=(), schedules=None, named=(), **extra):
    """One schedule (fp16-fp32, stage 1 amp_fp16) against the fp32-fp32 baseline; ``extra`` overrides."""
    s = {"question": "Q?", "settings": {"margin": 1.0, "alpha": 0.05, "power": 0.8, "bootstrap_resamples": 0},
         "baseline": BASE, "provenance": {"device": ["cpu"], "model_parameters": ["108000000"]},
         "schedules": schedules or {BASE: _info("fp32"), "fp16-fp32": _info()},
         "named_contrasts": [list(p) for p in named], "missing_contrasts": [], "deltas": list(deltas),
         "stage1_relation": {"fp16-fp32 vs fp32-fp32": "different"}}
    s.update(extra)
    return s


def _acc(cls, mean, lo, hi, p_holm, family="vs_baseline", a="fp16-fp32", b=BASE, **kw):
    return {"family": family, "a": a, "b": b, "metric": "accuracy", "kind": "difference", "n_pairs": 6,
            "mean": mean, "ci_low": lo, "ci_high": hi, "p_holm": p_holm, "classification": cls, "margin": 1.0,
            **kw}


def _rat(metric, mean, lo, hi, p_holm, cls, family="vs_baseline", a="fp16-fp32", b=BASE, **kw):
    return {"family": family, "a": a, "b": b, "metric": metric, "kind": "ratio", "n_pairs": 6, "mean": mean,
            "ci_low": lo, "ci_high": hi, "p_holm": p_holm, "classification": cls, **kw}


def _answer(text):
    return text.split("## Answer")[1].strip().split("\n\n")[0]


def _para(text, name="fp16-fp32"):
    return next(p for p in text.split("\n\n") if p.startswith(f"**{name}**"))


def _caveats(text):
    return text.split("## Caveats")[1]


def test_a_ratio_gets_a_fourth_decimal_and_no_more():
    """Three decimals can still print a CI as one number: then four (×0.9693 [0.9691, 0.9695]); four is the
    most, also when even four cannot tell the bounds apart."""
    assert _ratio({"mean": 0.96930, "ci_low": 0.96912, "ci_high": 0.96948}) == "×0.9693 [0.9691, 0.9695]"
    assert _ratio({"mean": 0.969320, "ci_low": 0.969310, "ci_high": 0.969340}) == "×0.9693 [0.9693, 0.9693]"


def test_by_less_than_the_margin_only_qualifies_a_significant_difference():
    """An equivalent row whose CI lies inside the margin is 'the same accuracy within ±1 point', never also
    'though by less than the margin' (which qualifies better/worse)."""
    eq = _acc("equivalent", 0.1, -0.4, 0.6, 0.7, tost_p=0.004, within_margin=True)
    para = _para(render(_stats([eq])))
    assert "**EQUIVALENT** — the same accuracy as fp32-fp32 within ±1 point." in para
    assert "by less than" not in para


def test_no_stage1_schedule_is_not_said_to_pre_train_in_none():
    """A fine-tune-only schedule against the baseline with the same stage 2: the question names the schedules,
    it does not read 'Pre-training in None instead of fp32'."""
    info = {BASE: _info("fp32"), "ft-fp32": _info(None)}
    acc = _acc("inconclusive", 0.3, -0.9, 1.5, 0.6, a="ft-fp32")
    text = render(_stats([acc], schedules=info, stage1_relation={"ft-fp32 vs fp32-fp32": "none"}))
    ans = _answer(text)
    assert "Schedule ft-fp32 (no stage 1 → fp32) against fp32-fp32 (fp32 → fp32)" in ans
    assert "None" not in ans


def test_failures_in_the_answer_tell_not_run_from_diverged():
    """Skipped runs only (a precision the device lacks) read 'was not run'; a mix says what each failure was,
    and no '0 without a finite accuracy' when every failure is accounted for."""
    skipped = _info(n_failed=2, n_skipped=2, n_diverged=0, n_used=4)
    text = render(_stats([_acc("inconclusive", 0.3, -0.9, 1.5, 0.6)], schedules={BASE: _info("fp32"),
                                                                                  "fp16-fp32": skipped}))
    assert "`fp16-fp32` was not run in 2 of 6 seeds (skipped: see its paragraph)" in _answer(text)
    mixed = _info(n_failed=3, n_skipped=1, n_diverged=1, n_used=3)
    text = render(_stats([_acc("inconclusive", 0.3, -0.9, 1.5, 0.6)], schedules={BASE: _info("fp32"),
                                                                                  "fp16-fp32": mixed}))
    assert ("`fp16-fp32` failed in 3 of 6 seeds (1 diverged, 1 skipped, 1 without a finite accuracy)"
            in _answer(text))
    diverged = _info(n_failed=2, n_skipped=0, n_diverged=2, n_used=4)
    text = render(_stats([_acc("inconclusive", 0.3, -0.9, 1.5, 0.6)], schedules={BASE: _info("fp32"),
                                                                                  "fp16-fp32": diverged}))
    assert "`fp16-fp32` failed in 2 of 6 seeds (2 diverged)." in _answer(text)
    assert "not run" not in _answer(text)


def test_a_mean_exactly_at_the_margin_puts_equivalence_out_of_reach():
    """|mean| = margin: no CI around it fits inside (−margin, +margin), so the verdict says so."""
    r = _acc("inconclusive", -1.0, -2.2, 0.2, 0.2, sd=1.2, seeds_needed=14)
    assert "the observed mean is outside the margin, so equivalence is not in reach" in _para(render(_stats([r])))


def test_stats_without_stage1_relation_fall_back_to_the_precisions():
    """An older stats.json without stage1_relation: the same stage-1 precision is a shared stage 1 (stage-2
    cost, 'shared with the baseline'), a different one reports the totals."""
    rows = [_rat("stage1_train_seconds", 1.0, 1.0, 1.0, 1.0, "inconclusive"),
            _rat("stage2_train_seconds", 0.7, 0.65, 0.75, 0.002, "better"),
            _rat("total_train_seconds", 0.9, 0.85, 0.95, 0.002, "better")]
    same = _stats(rows, schedules={BASE: _info("fp32"), "fp16-fp32": _info("fp32")})
    del same["stage1_relation"]
    text = render(same)
    assert "stage 1 shared with the baseline (the same runs)" in _para(text)
    other = _stats(rows)
    del other["stage1_relation"]
    para = _para(render(other))
    assert "shared with the baseline" not in para and "stage 1 ×1.00 [1.00, 1.00]" in para


def test_older_stats_without_has_stage1_judge_it_by_a_finite_stage1_time():
    """No has_stage1 key (older stats.json): a schedule whose stage-1 time row has no mean (NaN: no stage-1
    runs) has no stage 1, and the named contrast's cost sentence says so."""
    info = {BASE: _info("fp32"), "fp16-fp32": _info(), "ft-fp32": _info(None)}
    for i in info.values():
        del i["has_stage1"]
    rows = [_acc("inconclusive", 0.3, -0.9, 1.5, 0.6, family="named", a="ft-fp32"),
            _rat("stage1_train_seconds", float("nan"), None, None, None, "insufficient data", family="named",
                 a="ft-fp32"),
            _rat("stage2_train_seconds", 0.7, 0.65, 0.75, 0.002, "better", family="named", a="ft-fp32"),
            _rat("stage1_train_seconds", 0.8, 0.75, 0.85, 0.002, "better")]  # fp16-fp32 vs the baseline
    text = render(_stats(rows, schedules=info, named=[("ft-fp32", BASE)],
                         stage1_relation={"ft-fp32 vs fp32-fp32": "none"}))
    assert "stage 2 only: `ft-fp32` has no stage 1 (fine-tunes model.init), so the totals" in _answer(text)


def test_missing_contrasts_are_listed_not_replaced_by_baseline_comparisons():
    """Every configured contrast names a schedule that was not run: the Answer says none could be computed and
    lists them; it does not answer another question (each schedule against the baseline) instead."""
    text = render(_stats([_acc("worse", -2.0, -3.0, -1.0, 0.01)], missing_contrasts=[["fp8-fp32", BASE]]))
    ans = _answer(text)
    assert ans == ("None of the configured contrasts could be computed: see the per-schedule paragraphs. "
                   "The contrast `fp8-fp32` vs `fp32-fp32` was not run (schedule missing).")


def test_degenerate_wording_needs_finished_runs_and_both_sides():
    """A schedule with no finished run is not 'EVERY finished run is degenerate'; one degenerate side makes
    the paragraph note it, not call the comparison NOT INFORMATIVE (that needs both sides)."""
    none_used = _info(n_used=0, n_failed=6, n_diverged=6, n_degenerate=0,
                      failed=[{"seed": k, "outcome": "diverged"} for k in range(1, 7)])
    para = _para(render(_stats([_acc("insufficient data", float("nan"), None, None, None)],
                                schedules={BASE: _info("fp32"), "fp16-fp32": none_used})))
    assert "degenerate" not in para and "6 failed run(s)" in para
    one_side = _info(n_degenerate=6, degenerate_seeds=[1, 2, 3, 4, 5, 6])
    text = render(_stats([_acc("worse", -20.0, -22.0, -18.0, 0.001)],
                         schedules={BASE: _info("fp32"), "fp16-fp32": one_side}))
    para = _para(text)
    assert "**WORSE** — less accurate" in para and "NOT INFORMATIVE" not in para
    assert "EVERY finished run is degenerate" in para
    both = render(_stats([_acc("worse", -20.0, -22.0, -18.0, 0.001)],
                         schedules={BASE: _info("fp32", n_degenerate=6), "fp16-fp32": one_side}))
    assert "**WORSE, BUT NOT INFORMATIVE: both only predict the majority class**" in _para(both)


def test_power_and_to_resolve_only_where_they_say_something():
    """mde 0 (equal paired differences from 6 seeds on) prints no 'difference of 0.00 points is detectable';
    'To resolve it' belongs to an inconclusive row only."""
    eq0 = _acc("worse", -1.0, -1.0, -1.0, 0.03, sd=0.0, mde=0.0, seeds_needed=6, seeds_needed_equivalence=6)
    para = _para(render(_stats([eq0])))
    assert "is detectable" not in para and "To resolve it" not in para
    worse = _acc("worse", -2.0, -3.0, -1.0, 0.01, sd=1.0, mde=1.5, seeds_needed=9)
    para = _para(render(_stats([worse])))
    assert "a difference of 1.50 points is detectable at 80% power after Holm" in para
    assert "To resolve it" not in para and "seeds would detect" not in para


def test_a_memory_ratio_without_pairs_is_not_called_warm_cold():
    """A memory row without a mean and without seeds left out for mixed starts (no stage-1 memory) prints
    nothing; only rows that lost their seeds to warm/cold starts read 'not compared'."""
    rows = [_rat("stage1_peak_memory_bytes", float("nan"), None, None, None, "insufficient data", n_mixed_starts=0),
            _rat("stage2_peak_memory_bytes", 0.8, 0.75, 0.85, 0.002, "better", n_mixed_starts=0)]
    para = _para(render(_stats(rows)))
    assert "Peak memory: stage 2 ×0.80 [0.75, 0.85] (20% memory saved, Holm p 0.002)." in para
    assert "not compared" not in para
    rows[0]["n_mixed_starts"] = 3
    para = _para(render(_stats(rows)))
    assert "Peak memory: stage 1 not compared (in every seed with both runs, one was started warm" in para


def test_numeric_health_reports_only_what_happened_and_where():
    """Counters of 0 and a loss scale that stayed at 1 or above are not warnings; the stage a skip or a
    scale collapse happened in is named correctly."""
    quiet = _info(stage1_skipped_steps=0, stage2_skipped_steps=0, nonfinite_losses=0, stage1_loss_scale_min=1.0,
                  stage2_loss_scale_min=65536.0)
    para = _para(render(_stats(schedules={BASE: _info("fp32"), "fp16-fp32": quiet})))
    assert "Numeric health: no failed runs, no skipped steps, no non-finite losses." in para
    noisy = _info(stage1_skipped_steps=4, stage2_skipped_steps=0, nonfinite_losses=1, stage1_loss_scale_min=2.0,
                  stage2_loss_scale_min=0.25)
    para = _para(render(_stats(schedules={BASE: _info("fp32"), "fp16-fp32": noisy})))
    assert ("Numeric health: 4 skipped optimizer steps in stage 1 (loss-scale overflow), over all seeds; "
            "1 non-finite loss over both stages; the stage 2 loss scale fell to 0.25") in para
    assert "in stage 2 (loss-scale" not in para and "stage 1 loss scale" not in para


def _stage1_row(a, metric, mean, lo, hi, kind="difference", cls="better", n=6, **kw):
    return {"family": "stage1", "a": a, "b": "fp32", "metric": metric, "kind": kind, "n_pairs": n, "mean": mean,
            "ci_low": lo, "ci_high": hi, "p_holm": 0.01, "classification": cls, **kw}


def test_stage1_section_lists_failures_of_each_side():
    """Failed stage-1 runs are counted on the compared precision's line and on a line of the baseline's own."""
    rows = [_stage1_row("amp_fp16", "eval_loss", 0.05, 0.03, 0.07, cls="worse")]
    text = render(_stats(rows, stage1_baseline_precision="fp32",
                         stage1_precisions={"fp32": {"n_failed": 1}, "amp_fp16": {"n_failed": 2}}))
    sec = text.split("## Stage 1 on its own")[1].split("## How failures")[0]
    assert "- **amp_fp16** vs fp32 (6 paired seeds; 2 failed run(s)): eval loss +0.050 nats" in sec
    assert "- baseline fp32: 1 failed run(s)." in sec


def test_stage1_section_heads_a_study_whose_precisions_have_no_pairs():
    """Two stage-1 precisions but no delta rows (e.g. an older stats.json): the section still appears with the
    baseline's failures; one stage-1 precision alone has nothing to compare and no section."""
    two = render(_stats([], stage1_baseline_precision="fp32",
                        stage1_precisions={"fp32": {"n_failed": 1}, "amp_fp16": {"n_failed": 0}}))
    assert "## Stage 1 on its own (pre-training, against fp32)" in two and "- baseline fp32: 1 failed run(s)." in two
    one = render(_stats([], stage1_baseline_precision="fp32", stage1_precisions={"fp32": {"n_failed": 0}}))
    assert "## Stage 1 on its own" not in one


def test_a_zero_baseline_loss_gives_no_relative_size():
    """A stage-1 baseline mean eval loss of 0 (or none) has no % to give: the line keeps the nats and label."""
    rows = [_stage1_row("amp_fp16", "eval_loss", 0.05, 0.03, 0.07, cls="worse")]
    text = render(_stats(rows, stage1_baseline_precision="fp32",
                         stage1_summary={"fp32": {"eval_loss": {"n": 6, "mean": 0.0}}}))
    line = next(ln for ln in text.splitlines() if ln.startswith("- **amp_fp16**"))
    assert "eval loss +0.050 nats [+0.030, +0.070] (worse, Holm p 0.010)" in line and "%" not in line


def test_caveats_follow_the_provenance():
    """Two devices (or thread counts) are flagged, one is not; 'Small scale' follows the largest model; the
    oversubscription caveat and Answer sentence are for CPU runs only; warm/cold only when both occur."""
    text = render(_stats(provenance={"device": ["cpu"], "threads": ["2", "4"], "model_parameters": ["108000000"]}))
    assert "The runs do not share one threads (2, 4)" in _caveats(text) and "Small scale" not in text
    text = render(_stats(provenance={"device": ["cpu"], "threads": ["2"], "model_parameters": ["108000000"]}))
    assert "do not share one" not in text
    text = render(_stats(provenance={"device": ["cpu"], "model_parameters": ["4000000", "12000000"]}))
    assert "Small scale" not in text  # the largest model is not tiny
    load = {"n_oversubscribed": 2, "n_runs_checked": 10, "cpu_count": [16], "max_load": 30.0, "threshold": 1.25}
    gpu = render(_stats(provenance={"device": ["cuda:0"], "compile": ["reduce-overhead"]}, load=load))
    assert "oversubscribed" not in gpu
    cpu = render(_stats(load=load))
    assert "Timings: 2 of 10 runs ran on an oversubscribed machine" in _answer(cpu)
    assert "oversubscribed during 2 of 10 CPU runs" in _caveats(cpu)
    warm = render(_stats(process_starts={"warm": 12}, memory_pairs_mixed_starts=0))
    assert "started two ways" not in warm and "Memory: the ratios above" not in warm
    both = render(_stats(process_starts={"warm": 10, "cold": 2}, memory_pairs_mixed_starts=0))
    assert "started two ways (warm 10, cold 2)" in _caveats(both) and "Memory: the ratios above" not in _answer(both)


def test_bootstrap_caveat_names_only_rows_below_its_minimum():
    """Bootstrap CIs start at bootstrap_min_pairs (8): rows with 8 pairs need no caveat, 7 do; 0 resamples
    (bootstrap off) none."""
    s = {"margin": 1.0, "alpha": 0.05, "power": 0.8, "bootstrap_resamples": 1000}
    eight = render(_stats([_acc("inconclusive", 0.3, -0.9, 1.5, 0.6, n_pairs=8)], settings=s,
                          bootstrap_min_pairs=8))
    assert "Bootstrap CIs are only computed" not in eight
    seven = render(_stats([_acc("inconclusive", 0.3, -0.9, 1.5, 0.6, n_pairs=7)], settings=s,
                          bootstrap_min_pairs=8))
    assert "Bootstrap CIs are only computed from 8 paired seeds on" in _caveats(seven)


def test_a_margin_other_than_one_is_plural_and_named_in_the_labels():
    s = {"margin": 0.5, "alpha": 0.05, "power": 0.8, "bootstrap_resamples": 0}
    eq = _acc("equivalent", 0.1, -0.2, 0.3, 0.7, tost_p=0.004, margin=0.5)
    text = render(_stats([eq], settings=s))
    assert "the same accuracy as fp32-fp32 within ±0.5 points." in _para(text)
    assert "equivalence margin ±0.5 points of accuracy" in text


def test_holds_for_lists_up_to_three_values_and_every_schedules_seeds():
    text = render(_stats(provenance={"device": ["cpu"], "git_commit": ["aaa", "bbb"], "hostname": ["h"],
                                     "threads": ["1", "2", "3", "4"], "model_parameters": ["108000000"]},
                         schedules={BASE: _info("fp32", seeds=[1, 2]), "fp16-fp32": _info(seeds=[2, 3])}))
    head = text.split("## Answer")[0]
    assert "git commit `aaa`, `bbb`" in head and "threads 4 distinct values (per run; see runs.csv)" in head
    assert "Seeds 1, 2, 3 (6 runs per schedule)" in head


def test_each_failed_seed_is_listed_with_its_outcome_and_reason():
    i = _info(n_failed=2, n_diverged=1, n_skipped=1, n_used=4,
              failed=[{"seed": 2, "outcome": "diverged", "reason": "nan loss"}, {"seed": 5, "outcome": "skipped"}])
    para = _para(render(_stats(schedules={BASE: _info("fp32"), "fp16-fp32": i})))
    assert ("2 failed run(s), excluded from the means and counted — seed 2: diverged (nan loss); seed 5: skipped"
            in para)


def test_stage1_line_counts_the_pairs_of_what_it_reports():
    """A stage 1 without eval metrics (eval_loss null: e.g. an eval split with no masked token) still has its
    time and memory pairs: the line read '**amp_bf16** vs fp32 (0 paired seeds): train time ×0.74 [0.72, 0.77]
    (26% time saved, ...)'; it now counts the pairs of the numbers it gives."""
    nan = float("nan")
    rows = [_stage1_row("amp_bf16", "eval_loss", nan, None, None, cls="insufficient data", n=0),
            _stage1_row("amp_bf16", "mlm_accuracy", nan, None, None, cls="insufficient data", n=0),
            _stage1_row("amp_bf16", "train_seconds", 0.74, 0.72, 0.77, kind="ratio", n=3),
            _stage1_row("amp_bf16", "peak_memory_bytes", 1.10, 1.05, 1.15, kind="ratio", cls="worse", n=3)]
    text = render(_stats(rows, stage1_baseline_precision="fp32"))
    line = next(ln for ln in text.splitlines() if ln.startswith("- **amp_bf16**"))
    assert line.startswith("- **amp_bf16** vs fp32 (3 paired seeds): train time ×0.74 [0.72, 0.77] (26% time saved")
    # with eval metrics the count is still the eval loss's
    rows[0].update(mean=0.05, ci_low=0.03, ci_high=0.07, n_pairs=5, classification="worse")
    line = next(ln for ln in render(_stats(rows, stage1_baseline_precision="fp32")).splitlines()
                if ln.startswith("- **amp_bf16**"))
    assert line.startswith("- **amp_bf16** vs fp32 (5 paired seeds): eval loss +0.050 nats")


def test_the_answer_says_when_a_significant_difference_is_smaller_than_the_margin():
    """docs/analysis.md: a better/worse difference whose CI lies inside ±margin gets 'though by less than the
    margin'. The schedule's paragraph said so, the Answer did not: 'raises accuracy (`fp16-fp32` − `fp32-fp32`:
    +0.0040 points ...)' read as a finding about precision; it now says 'raises accuracy, though by less than
    the ±1 point margin'."""
    tiny = _acc("better", 0.004, 0.0021, 0.0059, 0.01, family="named", within_margin=True)
    ans = _answer(render(_stats([tiny], named=[("fp16-fp32", BASE)])))
    assert ("raises accuracy, though by less than the ±1 point margin (`fp16-fp32` − `fp32-fp32`: +0.0040 points"
            in ans)
    big = _acc("worse", -2.4, -3.7, -1.1, 0.01, family="named", within_margin=False)
    ans = _answer(render(_stats([big], named=[("fp16-fp32", BASE)])))
    assert "lowers accuracy (`fp16-fp32` − `fp32-fp32`: −2.40 points" in ans and "by less than" not in ans


def test_a_contrast_with_different_stage1_reports_the_totals_rows():
    """Different stage-1 runs: the Answer's time and memory are the total-time and both-stage peak rows (not the
    stage-2 rows, whose numbers differ)."""
    rows = [_acc("inconclusive", 0.3, -0.9, 1.5, 0.6, family="named"),
            _rat("total_train_seconds", 0.8, 0.75, 0.85, 0.002, "better", family="named"),
            _rat("stage2_train_seconds", 0.5, 0.45, 0.55, 0.002, "better", family="named"),
            _rat("peak_memory_bytes", 1.1, 1.05, 1.15, 0.002, "worse", family="named"),
            _rat("stage2_peak_memory_bytes", 0.6, 0.55, 0.65, 0.002, "better", family="named")]
    ans = _answer(render(_stats(rows, named=[("fp16-fp32", BASE)])))
    assert ("it takes ×0.80 [0.75, 0.85] the total training time (20% time saved, Holm p 0.002) and ×1.10 "
            "[1.05, 1.15] the peak memory over both stages (10% more memory, Holm p 0.002).") in ans


def test_a_percentage_saved_is_styled_by_its_printed_value():
    """×0.90 is 9.999…% less in floating point: it read '10.0% time saved' beside ×1.10's '10% more memory';
    both now read '10%' (as 9.96% does); 9.6% and 9.4% keep one decimal, below 0.1% two significant digits."""
    from precswitch.analysis.verdict import _saved

    def saved(m, what="time"):
        return _saved({"mean": m, "classification": "better", "p_holm": 0.002}, what).split(",")[0]

    assert saved(0.90) == "10% time saved" and saved(1.10, "memory") == "10% more memory"
    assert saved(0.9004) == "10% time saved" and saved(0.906) == "9.4% time saved"
    assert saved(0.904) == "9.6% time saved" and saved(1.096, "memory") == "9.6% more memory"
    assert saved(0.999) == "0.1% time saved" and saved(0.9995) == "0.050% time saved"
    assert saved(1.25, "throughput") == "25% more throughput"


def test_a_switched_stage1_counts_as_its_first_precision_whatever_that_is():
    """A stage 1 that switched inside the stage (`fp32-to-amp_bf16-at50`, `tf32-to-fp32-at80`) is grouped with its
    first precision in 'Stage 1 ran in', not as an unnamed 'other' kind."""
    from precswitch.analysis.verdict import _stage1_kinds

    assert _stage1_kinds(["fp32-to-amp_bf16-at50", "tf32-to-fp32-at80"]) == (
        "**Stage 1 ran in:** `fp32-to-amp_bf16-at50`: fp32 throughout, TF32 off; `tf32-to-fp32-at80`: fp32 weights, "
        "TF32 tensor-core matmuls.")


def test_two_schedules_of_the_same_precisions_are_named_not_called_a_precision_change():
    """Two points of a switch-point sweep have the same stage-1 and stage-2 precisions: the Answer names the two
    schedules; it does not read 'fine-tuning in fp32 instead of fp32' or 'Pre-training in amp_fp16 instead of
    amp_fp16'."""
    info = {BASE: _info("fp32"), "sw-at20": _info(), "sw-at80": _info()}
    acc = _acc("inconclusive", 0.3, -0.9, 1.5, 0.6, family="named", a="sw-at20", b="sw-at80")
    ans = _answer(render(_stats([acc], schedules=info, named=[("sw-at20", "sw-at80")],
                                stage1_relation={"sw-at20 vs sw-at80": "different"})))
    assert ans.startswith("Schedule sw-at20 (amp_fp16 → fp32) against sw-at80 (amp_fp16 → fp32) has an inconclusive")
    assert "instead of" not in ans


def test_an_answer_against_the_baseline_reports_the_stage2_cost_of_a_shared_stage1():
    """No contrasts configured: the Answer compares each schedule with the baseline (family vs_baseline). A
    schedule sharing the baseline's stage 1 gets the stage-2 time and memory rows of that family, as a named
    contrast does, not no cost at all."""
    info = {BASE: _info("fp32"), "fp32-fp16": _info("fp32", stage2_precision="amp_fp16")}
    rows = [_acc("inconclusive", 0.3, -0.9, 1.5, 0.6, a="fp32-fp16"),
            _rat("stage2_train_seconds", 0.7, 0.65, 0.75, 0.002, "better", a="fp32-fp16"),
            _rat("stage2_peak_memory_bytes", 0.8, 0.75, 0.85, 0.002, "better", a="fp32-fp16"),
            _rat("total_train_seconds", 0.9, 0.85, 0.95, 0.002, "better", a="fp32-fp16")]
    ans = _answer(render(_stats(rows, schedules=info, stage1_relation={"fp32-fp16 vs fp32-fp32": "shared"})))
    assert ("it takes ×0.70 [0.65, 0.75] the stage-2 (fine-tuning) training time (30% time saved, Holm p 0.002) "
            "and ×0.80 [0.75, 0.85] the stage-2 peak memory (20% memory saved, Holm p 0.002) — stage 2 only: both "
            "schedules start from the very same stage-1 runs") in ans


def test_holds_for_lists_three_values_and_the_cuda_version_of_gpu_runs():
    """Up to three distinct values are listed (three is still a list, four are counted); a CUDA version is
    part of what the result holds for when the runs record one, and absent when they do not."""
    prov = {"device": ["cuda:0"], "device_name": ["NVIDIA H100", "NVIDIA H200"], "torch_version": ["2.12", "2.13"],
            "threads": ["1", "2", "3"], "cuda_version": ["12.8"], "compile": ["off"], "model_parameters": ["108000000"]}
    head = render(_stats(provenance=prov)).split("## Answer")[0]
    assert "threads `1`, `2`, `3`" in head and "distinct values" not in head
    assert "device `cuda:0` (`NVIDIA H100`, `NVIDIA H200`); torch `2.12`, `2.13`, transformers unknown, CUDA `12.8`;" in head
    assert "CUDA" not in render(_stats()).split("## Answer")[0]


def test_runs_on_two_gpus_or_two_library_versions_are_flagged_in_the_caveats():
    """Two device names, torch versions, transformers versions or git commits across the runs: each is said
    in the Caveats (timings may not be comparable), not only listed in 'Holds for'; one value of each is not."""
    prov = {"device": ["cuda:0"], "device_name": ["NVIDIA H100", "NVIDIA H200"], "torch_version": ["2.12", "2.13"],
            "transformers_version": ["5.1", "5.24"], "git_commit": ["aaa", "bbb"], "compile": ["off"],
            "model_parameters": ["108000000"]}
    cav = _caveats(render(_stats(provenance=prov)))
    for k, v in (("device_name", "NVIDIA H100, NVIDIA H200"), ("torch_version", "2.12, 2.13"),
                 ("transformers_version", "5.1, 5.24"), ("git_commit", "aaa, bbb")):
        assert f"The runs do not share one {k} ({v}): timings and results may not be comparable." in cav, k
    one = {k: v[:1] for k, v in prov.items()}
    assert "do not share one" not in _caveats(render(_stats(provenance=one)))


def test_bootstrap_caveat_ignores_rows_too_small_for_any_interval():
    """A row of 0 or 1 pair has no t CI either (insufficient data): it does not make the verdict say that
    contrasts 'show the t CI alone' when every compared contrast has a bootstrap CI."""
    s = {"margin": 1.0, "alpha": 0.05, "power": 0.8, "bootstrap_resamples": 1000}
    rows = [_acc("inconclusive", 0.3, -0.9, 1.5, 0.6, n_pairs=8),
            _acc("insufficient data", float("nan"), None, None, None, a="other", n_pairs=1),
            _rat("stage1_train_seconds", float("nan"), None, None, None, "insufficient data", n_pairs=0)]
    text = render(_stats(rows, settings=s, bootstrap_min_pairs=8))
    assert "Bootstrap CIs are only computed" not in text


def test_stage1_line_words_time_and_memory_by_their_own_ratios():
    """Each stage-1 ratio is worded as what it measures: a faster stage 1 with more memory reads 'time saved'
    for the time and 'more memory' for the memory (not 'time' twice, nor 'saved' for a ratio above 1)."""
    rows = [_stage1_row("amp_bf16", "train_seconds", 0.74, 0.72, 0.77, kind="ratio", n=3),
            _stage1_row("amp_bf16", "peak_memory_bytes", 1.10, 1.05, 1.15, kind="ratio", cls="worse", n=3)]
    line = next(ln for ln in render(_stats(rows, stage1_baseline_precision="fp32")).splitlines()
                if ln.startswith("- **amp_bf16**"))
    assert line == ("- **amp_bf16** vs fp32 (3 paired seeds): train time ×0.74 [0.72, 0.77] (26% time saved, Holm p "
                    "0.010); peak memory ×1.10 [1.05, 1.15] (10% more memory, Holm p 0.010).")


def test_the_answer_gives_the_p_values_its_label_rests_on_and_no_others():
    """A better/worse contrast gives its Holm p (the TOST p is beside the point: no 'TOST p' after 'raises
    accuracy'); an equivalent one gives both; a single pair has neither (no 'Holm p n/a')."""
    better = _acc("better", 2.0, 1.2, 2.8, 0.004, family="named", tost_p=0.97)
    ans = _answer(render(_stats([better], named=[("fp16-fp32", BASE)])))
    assert "+2.00 points [unadjusted 95% CI +1.20, +2.80], Holm p 0.004, 6 paired seeds" in ans and "TOST" not in ans
    eq = _acc("equivalent", 0.1, -0.4, 0.6, 0.7, family="named", tost_p=0.004)
    ans = _answer(render(_stats([eq], named=[("fp16-fp32", BASE)])))
    assert "+0.10 points [unadjusted 95% CI −0.40, +0.60], Holm p 0.700, TOST p 0.004, 6 paired seeds" in ans
    one = _acc("insufficient data", 0.5, None, None, None, family="named", n_pairs=1)
    ans = _answer(render(_stats([one], named=[("fp16-fp32", BASE)])))
    assert "(`fp16-fp32` − `fp32-fp32`: +0.50 points, 1 paired seed)" in ans and "n/a" not in ans


def test_the_answer_warns_when_either_side_only_predicts_the_majority_class():
    """A contrast whose baseline side (b) never learnt the task is as uninformative as one whose a side did:
    the Answer says so naming that schedule."""
    info = {BASE: _info("fp32", n_degenerate=6), "fp16-fp32": _info()}
    ans = _answer(render(_stats([_acc("better", 20.0, 18.0, 22.0, 0.001, family="named")], schedules=info,
                                named=[("fp16-fp32", BASE)])))
    assert ("— but every finished run of `fp32-fp32` predicts only the majority class: the task was not learnt, "
            "so this says nothing about precision") in ans


def test_skipped_and_unevaluated_runs_are_not_all_called_not_run():
    """'was not run' is for a schedule whose every failure is a skip; one skip and one run without a finite
    accuracy is 'failed in 2 of 6 seeds (1 skipped, 1 without a finite accuracy)'."""
    i = _info(n_failed=2, n_skipped=1, n_diverged=0, n_used=4)
    ans = _answer(render(_stats([_acc("inconclusive", 0.3, -0.9, 1.5, 0.6)], schedules={BASE: _info("fp32"),
                                                                                       "fp16-fp32": i})))
    assert "`fp16-fp32` failed in 2 of 6 seeds (1 skipped, 1 without a finite accuracy)" in ans
    assert "not run" not in ans


def test_a_significantly_higher_but_negligible_loss_is_worse_and_negligible():
    """A stage-1 eval loss significantly higher than the baseline's by less than 0.1% of it: 'worse, Holm p … —
    negligible' (the label stands, qualified), not 'negligible either way' (which is for a non-significant one)."""
    rows = [_stage1_row("amp_fp16", "eval_loss", 0.0005, 0.0003, 0.0007, cls="worse")]
    text = render(_stats(rows, stage1_baseline_precision="fp32",
                         stage1_summary={"fp32": {"eval_loss": {"n": 6, "mean": 2.0}}}))
    line = next(ln for ln in text.splitlines() if ln.startswith("- **amp_fp16**"))
    assert ("eval loss +5.0e−4 nats [+3.0e−4, +7.0e−4] (+0.025% of fp32's 2 nats; worse, Holm p 0.010 — negligible: "
            "the whole CI is within ±0.1% of the loss)") in line


def test_a_contrast_not_judged_is_not_also_called_not_informative():
    """Both sides only predict the majority class but there is a single pair: the label is NOT JUDGED alone
    (there is no comparison to qualify); the paragraph still says every run is degenerate."""
    info = {BASE: _info("fp32", n_degenerate=6), "fp16-fp32": _info(n_degenerate=6, degenerate_seeds=[1])}
    para = _para(render(_stats([_acc("insufficient data", 0.0, None, None, None, n_pairs=1)], schedules=info)))
    assert "**NOT JUDGED** — fewer than 2 paired seeds with results." in para and "NOT INFORMATIVE" not in para
    assert "EVERY finished run is degenerate" in para


def test_seeds_needed_that_is_not_a_number_is_left_out():
    """An inconclusive row whose seeds_needed is infinite or NaN (no finite sample size reaches the power) says
    nothing about it; the equivalence count is still given."""
    for bad in (float("inf"), float("nan")):
        r = _acc("inconclusive", 0.3, -0.9, 1.5, 0.6, sd=1.2, seeds_needed=bad, seeds_needed_equivalence=40)
        para = _para(render(_stats([r])))
        assert "To resolve it: about 40 would put the CI inside ±1 point if the observed mean and SD held." in para
        assert "would detect" not in para


def test_a_bootstrap_interval_is_printed_beside_the_t_interval_in_its_style():
    """From 8 pairs on a row has a bootstrap CI: the paragraph gives it after the t CI, in the mean's style."""
    r = _acc("better", 0.3, 0.1, 0.5, 0.01, n_pairs=8, boot_low=0.12, boot_high=0.48)
    para = _para(render(_stats([r])))
    assert "paired difference +0.30 points [unadjusted 95% CI +0.10, +0.50], 8 paired seeds (bootstrap CI +0.12, +0.48)" in para
    assert "bootstrap CI" not in _para(render(_stats([_acc("better", 0.3, 0.1, 0.5, 0.01, n_pairs=8)])))


def test_stage1_kinds_names_only_the_16_bit_formats_the_study_used():
    """A study whose only mixed-precision stage 1 was amp_bf16 (an MRPC study with a bf16 sweep) read
    '`amp_bf16`: mixed precision (fp32 master weights, fp16/bf16 compute)': amp_bf16 computes in bf16 only."""
    from precswitch.analysis.verdict import _stage1_kinds

    assert _stage1_kinds(["fp32", "amp_bf16"]).startswith(
        "**Stage 1 ran in:** `fp32`: fp32 throughout, TF32 off; `amp_bf16`: mixed precision (fp32 master weights, "
        "bf16 compute). No stage 1 kept its weights in 16 bits")
    assert "(fp32 master weights, fp16 compute)" in _stage1_kinds(["amp_fp16-to-fp32-at80"])
    assert "(fp32 master weights, fp16/bf16 compute)" in _stage1_kinds(["amp_fp16", "amp_bf16"])
    assert "optimizer state in bf16)" in _stage1_kinds(["pure_bf16_kahan", "pure_bf16"])

