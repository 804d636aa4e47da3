"""The workflow's in-stage switches in schedules, switch-point sweeps, telemetry, fp8 skipped.

Dry runs of config/frontier.yaml (job counts, stage-1 sharing of switched vs unswitched stage 1,
sweep expansion, the hparams the engine gets), config errors for the new keys, and the analysis of
switched / swept / telemetry / skipped runs on fake metrics (the engine tests train them for real).
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from workflow_helpers import ROOT, assert_names_the_key, job_counts, snakemake, write_config

from precswitch import study

from precswitch.analysis.aggregate import aggregate
from precswitch.analysis.fakes import write_stage
from precswitch.analysis.settings import load_settings
from precswitch.analysis.cli import run_stats
from precswitch.analysis.verdict import write_verdict

FRONTIER = ROOT / "config" / "frontier.yaml"
FRONTIER_CFG = yaml.safe_load(FRONTIER.read_text())
RES = FRONTIER_CFG["results_dir"]  # results/frontier: apart from the default study


def _dry(tmp_path, *args, cfg=None):
    files = ["--configfile", FRONTIER]
    if cfg is not None:
        files.append(write_config(tmp_path / "extra.yaml", cfg))  # one --configfile A B (a second flag replaces)
    return snakemake(tmp_path, "-n", *files, *args)


def _hparams(out: str) -> list[dict]:
    return [json.loads(m) for m in re.findall(r"--hparams '(\{.*?\})'", out)]


# ------------------------------------------------------------------------------------ dry runs
def test_frontier_dry_run_counts_and_sharing(tmp_path):
    proc = _dry(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    counts = job_counts(out)
    n_seeds = len(FRONTIER_CFG["seeds"])
    sweep = FRONTIER_CFG["sweeps"]["fp16-ft"]["switch_at"]
    n_sched = len(FRONTIER_CFG["schedules"]) + len(sweep)
    # stage 1: fp32, amp_fp16 (shared by fp16-fp32 and every sweep point), amp_bf16, pure_bf16, and the
    # switched amp_fp16-to-fp32-at80 (its own run, not amp_fp16's)
    assert counts["pretrain"] == 5 * n_seeds, counts
    assert counts["finetune"] == n_sched * n_seeds, counts
    for rule in ("synth", "aggregate", "stats", "plots", "verdict"):
        assert counts[rule] == 1
    stage1 = set(re.findall(RES + r"/runs/pretrain/([\w.+-]+)/seed(\d+)/metrics\.json", out))
    assert {p for p, _ in stage1} == {"fp32", "amp_fp16", "amp_bf16", "pure_bf16", "amp_fp16-to-fp32-at80"}
    stage2 = {n for n, _ in re.findall(RES + r"/runs/finetune/([\w.+-]+)/seed(\d+)/metrics\.json", out)}
    assert {"fp16-ft-at0", "fp16-ft-at50", "fp16-ft-at100", "bf16-fp8", "fp16x80-fp32", "pbf16-lr2x"} <= stage2
    assert f"{RES}/plots/switch_point.svg" in out and f"{RES}/plots/overflow.svg" in out  # a sweep, telemetry


def test_frontier_hparams(tmp_path):
    proc = _dry(tmp_path, "--printshellcmds", "--forceall")
    assert proc.returncode == 0, proc.stderr[-3000:]
    hps = _hparams(proc.stdout + proc.stderr)
    by_id = {h["run_id"]: h for h in hps}
    # switched stage 1
    h = by_id["pretrain-amp_fp16-to-fp32-at80-seed1"]
    assert (h["precision"], h["switch_to"], h["switch_at"]) == ("amp_fp16", "fp32", 0.8)
    assert h["tags"] == {} and h["telemetry_every"] == FRONTIER_CFG["train"]["pretrain"]["telemetry_every"]
    assert "switch_to" not in by_id["pretrain-amp_fp16-seed1"]
    fin = by_id["finetune-fp16x80-fp32-seed1"]
    assert fin["init"] == f"{RES}/runs/pretrain/amp_fp16-to-fp32-at80/seed1/checkpoint"
    assert fin["telemetry_every"] == 0  # not set for stage 2: the schema default, 0 = off
    # a stage-2 override: that schedule's lr only, from the shared pure_bf16 stage 1
    lr2x, plain = by_id["finetune-pbf16-lr2x-seed1"], by_id["finetune-pbf16-pbf16-seed1"]
    assert (lr2x["lr"], lr2x["tags"]["overrides"]) == (2e-3, {"lr": 2e-3}) and plain["lr"] == 1e-3
    assert lr2x["init"] == plain["init"] == f"{RES}/runs/pretrain/pure_bf16/seed1/checkpoint"
    # sweep points: 1.0 = no switch, 0.0 = all in switch_to, else a switch
    at50, at100, at0 = (by_id[f"finetune-fp16-ft-at{p}-seed2"] for p in (50, 100, 0))
    assert (at50["precision"], at50["switch_to"], at50["switch_at"]) == ("amp_fp16", "fp32", 0.5)
    assert at100["precision"] == "amp_fp16" and "switch_to" not in at100
    assert at0["precision"] == "fp32" and "switch_to" not in at0
    assert at50["tags"] == {"schedule": "fp16-ft-at50", "sweep": "fp16-ft", "sweep_at": 0.5,
                            "sweep_stage": "finetune"}
    assert at50["init"] == f"{RES}/runs/pretrain/amp_fp16/seed2/checkpoint"
    assert by_id["finetune-bf16-fp8-seed1"]["on_unsupported"] == "skip"


def test_stage1_sweep_and_baseline_from_a_sweep(tmp_path):
    cfg = {"schedules": {"fp32-fp32": {"pretrain": "fp32", "finetune": "fp32"}},
           "sweeps": {"pre": {"pretrain": {"precision": "amp_bf16", "switch_to": "fp32"}, "finetune": "fp32",
                              "switch_at": [0.25, 0.75]}},
           "seeds": [1], "analysis": {"baseline": "pre-at75"}}
    proc = snakemake(tmp_path, "-n", "--configfile", write_config(tmp_path / "c.yaml", cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert job_counts(out)["pretrain"] == 3 and job_counts(out)["finetune"] == 3
    stage1 = set(re.findall(r"results/runs/pretrain/([\w.+-]+)/seed1/metrics\.json", out))  # not frontier.yaml
    assert stage1 == {"fp32", "amp_bf16-to-fp32-at25", "amp_bf16-to-fp32-at75"}


def test_default_config_unchanged_by_the_new_keys(tmp_path):
    proc = snakemake(tmp_path, "-n", "--printshellcmds", "--configfile", ROOT / "config" / "config.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for h in _hparams(proc.stdout + proc.stderr):
        assert not {"switch_to", "switch_at"} & set(h)
        assert (h["telemetry_every"], h["compile"]) == (0, "off")  # the schema defaults, carried like every key
        assert h["run_id"] == f"{h['stage']}-{h['tags'].get('schedule', h['precision'])}-seed{h['seed']}"


# ------------------------------------------------------------------------------- config errors
def _sched(**stage) -> dict:
    return {"schedules": {"x": {"pretrain": "fp32", **stage}}, "seeds": [1], "analysis": {"baseline": "x"}}


def _sweep(sweep: dict) -> dict:
    return {"schedules": {"x": {"finetune": "fp32"}}, "sweeps": {"s": sweep}, "seeds": [1],
            "analysis": {"baseline": "x"}}


FRONTIER_CASES = [
        (_sched(finetune={"precision": "amp_fp16", "switch_to": "pure_bf16", "switch_at": 0.5}),
         "schedules.x.finetune.switch_to", "stored differently"),
        (_sched(finetune={"precision": "pure_bf16", "switch_to": "pure_bf16_kahan", "switch_at": 0.5}),
         "schedules.x.finetune.switch_to", "allowed from pure_bf16"),
        (_sched(finetune={"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 1.5}),
         "schedules.x.finetune.switch_at", "maximum of 1"),
        (_sched(finetune={"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 0}),
         "schedules.x.finetune.switch_at", "0"),
        (_sched(finetune={"precision": "fp64", "switch_to": "fp32", "switch_at": 0.5}),
         "schedules.x.finetune.precision", "amp_bf16"),
        (_sched(finetune={"precision": "amp_fp16", "switch_to": "fp64", "switch_at": 0.5}),
         "schedules.x.finetune.switch_to", "amp_bf16"),
        (_sched(finetune={"precision": "amp_fp16", "switch_to": "fp32"}), "schedules.x.finetune",
         "switch_to and switch_at go together"),
        (_sched(finetune={"precision": "amp_fp16", "switch_at": 0.5, "swich_to": "fp32"}),
         "schedules.x.finetune", "swich_to"),
        (_sweep({"finetune": "fp32", "switch_at": [0.5]}), "sweeps.s", "exactly one stage"),
        (_sweep({"finetune": {"precision": "amp_fp16", "switch_to": "fp32"}, "switch_at": [1.5]}),
         "sweeps.s.switch_at.0", "maximum of 1"),
        (_sweep({"finetune": {"precision": "amp_fp16", "switch_to": "pure_fp16"}, "switch_at": [0.5]}),
         "sweeps.s.finetune.switch_to", "stored differently"),
        (_sweep({"finetune": {"precision": "amp_fp16", "switch_to": "fp32"}}), "sweeps.s", "switch_at"),
        ({**_sweep({"finetune": {"precision": "amp_fp16", "switch_to": "fp32"}, "switch_at": [0.5]}),
          "schedules": {"s-at50": {"finetune": "fp32"}}, "analysis": {"baseline": "s-at50"}},
         "sweeps.s", "already a schedule"),
        ({"train": {"pretrain": {"telemetry_every": -1}}}, "train.pretrain.telemetry_every", "minimum of 0"),
        ({"train": {"finetune": {"compile": "fast"}}}, "train.finetune.compile", "reduce-overhead"),
        ({"train": {"pretrain": {"compile": "default", "telemetry_every": 5}}}, "train.pretrain.compile",
         "eager mode only"),
    ]


@pytest.mark.parametrize("cfg, key, allowed", FRONTIER_CASES)
def test_config_errors_name_the_key(cfg, key, allowed):
    """Refused when the workflow reads the config (precswitch.study.check: the schema, then the cross-key checks),
    before any DAG; test_study_config_checks.py runs a dry run for the same kind of refusal."""
    with pytest.raises(study.ConfigError) as e:
        study.check(cfg)
    assert e.value.key == key
    assert_names_the_key(str(e.value), key, allowed)


# ------------------------------------------------------------------------------------ analysis
def _telemetry(peak: float) -> dict:
    layers = ("bert.embeddings.LayerNorm", "bert.encoder.layer.0.output.dense", "cls.predictions.transform.LayerNorm")
    return {"every": 5, "steps_sampled": 4, "modules_watched": 3, "max_abs": peak,
            "max_abs_layer": "bert.encoder.layer.0.output.dense",
            "frac_overflow_fp16": 0.001 if peak > 65504 else 0.0, "frac_underflow_fp16": 0.02,
            "layers_with_overflow": [], "layers": {layer: {"max_abs": peak / (3 - i), "frac_overflow_fp16": 0.0,
                                                            "frac_underflow_fp16": 0.01}
                                                    for i, layer in enumerate(layers)}}


@pytest.fixture(scope="module")
def switched_study(tmp_path_factory):
    """fp32 stage 1, amp_bf16 stage 1 with telemetry, a switched amp_fp16->fp32 stage 1; a sweep over
    stage 2; a skipped fp8 fine-tuning; 3 seeds."""
    root = tmp_path_factory.mktemp("switched") / "results"
    paths = []
    specs = {"fp32": ("fp32", None, None), "amp_bf16": ("amp_bf16", None, None),
             "amp_fp16-to-fp32-at80": ("amp_fp16", "fp32", 0.8)}
    for seed in (1, 2, 3):
        for name, (p, to, at) in specs.items():
            extra = {"eval_loss": 4.0, "mlm_accuracy": 0.3, "switch_to": to, "switch_at": at,
                     "switch_step": 16 if to else None, "precision_final": to or p}
            if name == "amp_bf16":
                extra["activation_telemetry"] = _telemetry(1.0e5)
            elif name == "fp32":
                extra["activation_telemetry"] = _telemetry(12.0)
            mp = write_stage(root / "runs" / "pretrain" / name / f"seed{seed}", run_id=f"pretrain-{name}-seed{seed}",
                             stage="pretrain", precision=p, seed=seed, metrics=extra)
            paths.append(mp)
        fin = {"fp32-fp32": ("fp32", "fp32", None, None, None),
               "fp16x80-fp32": ("amp_fp16-to-fp32-at80", "fp32", None, None, None),
               "bf16-fp8": ("amp_bf16", "fp8", None, None, None)}
        for at in (0.0, 0.5, 1.0):
            first = "fp32" if at == 0 else "amp_fp16"
            fin[f"sw-at{int(at * 100)}"] = ("fp32", first, "fp32" if 0 < at < 1 else None,
                                            at if 0 < at < 1 else None, at)
        for name, (s1, p2, to, at, sweep_at) in fin.items():
            skipped = p2 == "fp8"
            acc = 0.8 + 0.01 * seed + (0.02 * sweep_at if sweep_at is not None else 0)
            m = {"accuracy": None if skipped else acc, "f1": None if skipped else acc, "mcc": 0.5,
                 "majority_accuracy": 0.55, "switch_to": to, "switch_at": at, "precision_final": to or p2}
            tags = {"schedule": name}
            if sweep_at is not None:
                tags.update(sweep="sw", sweep_at=sweep_at, sweep_stage="finetune")
            m["tags"] = tags
            init = root / "runs" / "pretrain" / s1 / f"seed{seed}" / "checkpoint"
            if skipped:  # the engine refuses fp8 before loading the init: only hparams name it
                m.update(init=None, hparams={"init": str(init), "precision": p2})
            paths.append(write_stage(root / "runs" / "finetune" / name / f"seed{seed}",
                                     run_id=f"finetune-{name}-seed{seed}", stage="finetune", precision=p2,
                                     seed=seed, status="skipped" if skipped else "ok", schedule=name,
                                     init_run_id=None if skipped else f"pretrain-{s1}-seed{seed}", metrics=m))
    aggregate(paths, root, [p.parent / "steps.csv" for p in paths])
    stats = run_stats(root / "runs.csv", root / "schedules.csv",
                      load_settings(bootstrap_resamples=100, contrasts=[["bf16-fp8", "fp32-fp32"]]), root)
    return root, stats


def test_stats_and_verdict_with_switched_stage1_and_skipped_fp8(switched_study, tmp_path):
    root, stats = switched_study
    # the switched stage 1 is its own group, compared with fp32
    assert {"fp32", "amp_bf16", "amp_fp16-to-fp32-at80"} <= set(stats["stage1_precisions"])
    x80 = stats["schedules"]["fp16x80-fp32"]
    assert (x80["stage1_spec"], x80["stage1_precision"], x80["stage1_switch_to"]) == (
        "amp_fp16-to-fp32-at80", "amp_fp16", "fp32")
    fp8 = stats["schedules"]["bf16-fp8"]
    assert fp8["n_skipped"] == 3 and fp8["n_used"] == 0
    text = write_verdict(root / "stats.json", tmp_path / "verdict.md")
    row = next(ln for ln in text.splitlines() if ln.startswith("| `bf16-fp8` vs"))
    assert row.split("|")[3].strip().startswith("not judged") and "skipped" in text


# ---------------------------------------------------------------------------- end to end (slow)


def test_compile_reaches_the_engine_and_yaml_false_is_off(tmp_path):
    """train.<stage>.compile goes into the stage's hparams, off included; YAML's unquoted off (false) is off."""
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["train"]["pretrain"]["compile"] = "reduce-overhead"
    cfg["train"]["finetune"]["compile"] = False
    cfg["train"]["pretrain"]["telemetry_every"] = 0
    proc = snakemake(tmp_path, "-n", "--printshellcmds", "--forceall", "--configfile",
                     write_config(tmp_path / "c.yaml", cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    hps = _hparams(proc.stdout + proc.stderr)
    assert {h["compile"] for h in hps if h["stage"] == "pretrain"} == {"reduce-overhead"}
    fin = [h for h in hps if h["stage"] == "finetune"]
    assert fin and {h["compile"] for h in fin} == {"off"}
