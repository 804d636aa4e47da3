"""The workflow refuses a bad config before the DAG is built, with a message that names the config key.

Each case goes through precswitch.study.check (the schema, then the checks it cannot express), the path the
Snakefile takes; three cases also go through the `snakemake -n` command line (a schema error, a cross-key error).
docs/errors.md refers to the cases here by their ids (cfgN).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
from workflow_helpers import ROOT, SNAKEFILE, assert_names_the_key, dry_run, write_config

from precswitch import study
from precswitch.study import ConfigError

# --------------------------------------------------------------------------- config errors
GOOD_SCHEDULES = {"x": {"pretrain": "fp32", "finetune": "fp32"}}


CASES = [
        ({"schedules": {"x": {"pretrain": "fp64", "finetune": "fp32"}}}, "schedules.x.pretrain",
         "amp_bf16"),
        ({"schedule": GOOD_SCHEDULES}, "(top level)", "schedules"),
        # a bare 16-bit name: mixed (amp_) or pure? a near miss: did you mean
        ({"schedules": {"x": {"pretrain": "bf16", "finetune": "fp32"}}, "analysis": {"baseline": "x"}},
         "schedules.x.pretrain", "'bf16' is ambiguous: amp_bf16 = fp32 master weights"),
        ({"schedules": {"x": {"pretrain": "fp32", "finetune": "amp_fp61"}}, "analysis": {"baseline": "x"}},
         "schedules.x.finetune", "did you mean 'amp_fp16'"),
        # a stage is a precision name or a switch object: a number says both, not "not an object"
        ({"schedules": {"x": {"pretrain": 16, "finetune": "fp32"}}, "analysis": {"baseline": "x"}},
         "schedules.x.pretrain", "not of type 'string', 'object'"),
        ({"model": {"hidden_size": "big"}}, "model.hidden_size", "integer"),
        # transformers.set_seed and numpy take 0..2^32-1: a bigger seed crashed every training job
        ({"seeds": [1, 2**32]}, "seeds.1", "greater than the maximum of 4294967295"),
        # {x} is a wildcard to Snakemake; . and / would scatter the study over the checkout or the root
        ({"results_dir": "res{x}"}, "results_dir", "no braces (Snakemake reads {x} as a wildcard)"),
        ({"results_dir": "./"}, "results_dir", "not the working directory (.) nor the root (/)"),
        ({"results_dir": "/"}, "results_dir", "cannot hold a study"),
        ({"results_dir": str(ROOT / "pyproject.toml")}, "results_dir", "exists and is not a directory"),
        ({"data": {"pretrain": {"kind": "text", "train": [str(ROOT / "tests")], "eval": [str(ROOT / "README.md")]}}},
         "data.pretrain", "tests' is a directory; name the file(s) in it"),
        ({"seeds": []}, "seeds", "non-empty"),
        ({"seeds": [1, 2, 1]}, "seeds", "non-unique"),
        ({"analysis": {"baseline": "fp64-fp64"}}, "analysis.baseline", "fp32-fp32"),
        ({"schedules": {"x": {}}, "analysis": {"baseline": "x"}}, "schedules.x", "finetune"),
        ({"train": {"pretrain": {"steps": 0}}}, "train.pretrain.steps", "minimum of 1"),
        ({"train": {"finetune": {"steps": -5}}}, "train.finetune.steps", "minimum of 1"),
        ({"train": {"finetune": {"lr": float("nan")}}}, "train.finetune.lr", "finite"),
        ({"train": {"pretrain": {"lr": float("inf")}}}, "train.pretrain.lr", ""),
        ({"train": {"pretrain": {"steps": None}}}, "train.pretrain", "exactly one of steps and epochs"),
        ({"data": {"finetune": {"kind": "tsv", "train": "missing/train.tsv", "eval": "missing/dev.tsv"}}},
         "data.finetune", "missing/train.tsv"),
        ({"data": {"finetune": {"kind": "xlsx"}}}, "data.finetune.kind", "parquet"),
        ({"device": "tpu"}, "device", "cuda"),
        ({"train": {"finetune": {"lr": "2e-5"}}}, "train.finetune.lr", "write 2.0e-05"),  # YAML 1.1 text
        ({"analysis": {"contrasts": [["fp16-fp32", "fp16-fp61"]]}}, "analysis.contrasts[0]", "'fp16-fp61'"),
        ({"analysis": {"contrasts": [["fp16-fp32", "fp32-fp32"], ["fp16-fp16", "fp16-fp16"]]}},
         "analysis.contrasts[1]", "'fp16-fp16' with itself"),
        ({"schedules": {"x": {"pretrain": "fp32", "finetune": "fp8"}}, "analysis": {"baseline": "x"},
          "train": {"finetune": {"eval_precision": "fp32"}}}, "train.finetune.eval_precision", "fp8"),
        # a hub revision for something that is not on the hub
        ({"model": {"revision": "v1"}}, "model.revision", "model.init 'scratch' is scratch"),
        ({"model": {"init": "/tmp", "revision": "v1"}}, "model.revision", "is a local directory"),
        ({"data": {"pretrain": {"kind": "synthetic", "revision": "v1"}}}, "data.pretrain.revision",
         "kind synthetic"),
        ({"model": {"init": "bert-base-cased", "revision": ""}}, "model.revision", "non-empty"),
        # a local path that is no model directory: a mistyped one was looked up on the hub by the fetch job
        ({"model": {"init": "./nope"}}, "model.init", "local model directory './nope' does not exist"),
        ({"model": {"init": str(ROOT / "README.md")}}, "model.init", "is a file; a model is a directory"),
        ({"model": {"init": str(ROOT / "workflow")}}, "model.init", "has no config.json"),
        # precswitch stats could not size "seeds needed" and stopped after the whole study trained
        ({"analysis": {"alpha": 0.9}}, "analysis.power", "must exceed analysis.alpha (0.9)"),
        ({"analysis": {"margin": 150}}, "analysis.margin", "maximum of 100"),
        # keys a source kind does not read were dropped silently: files without `kind: tsv` trained on the
        # synthetic language
        ({"data": {"finetune": {"kind": "synthetic", "train": str(ROOT / "README.md")}}}, "data.finetune.train",
         "does not apply to kind synthetic, which reads only eval_fraction, labels, max_eval_rows, "
         "max_train_rows, mlm_examples; remove it (set kind: tsv, csv, jsonl, parquet or text to read files)"),
        ({"data": {"pretrain": {"kind": "text", "train": [str(ROOT / "README.md")], "text_column": "t"}}},
         "data.pretrain.text_column", "does not apply to kind text"),
        ({"data": {"finetune": {"kind": "text", "train": [str(ROOT / "README.md")]}}}, "data.finetune.kind",
         "text is unlabelled lines (masked LM only)"),
        # found by the engine only when the stage starts (stage 2: after every stage-1 run trained)
        ({"data": {"synthetic": {"n_train": 10}}}, "train.finetune.batch_size",
         "64 exceeds the 10 training rows of data.synthetic.n_train"),
        ({"data": {"pretrain": {"kind": "synthetic", "max_train_rows": 4}}}, "train.pretrain.batch_size",
         "exceeds the 4 training rows of data.pretrain.max_train_rows"),
        # an in-stage switch that rounds to step 0 or to the last step is no switch
        ({"schedules": {"x": {"pretrain": {"precision": "amp_bf16", "switch_to": "fp32", "switch_at": 0.001},
                              "finetune": "fp32"}}, "analysis": {"baseline": "x"}, "train": {"pretrain": {"steps": 300}}},
         "schedules.x.pretrain.switch_at", "switch_at 0.001 of 300 steps rounds to step 0: the whole stage would "
         "run in fp32, not switch from amp_bf16; use switch_at >= "),
        ({"schedules": {"x": {"finetune": {"precision": "amp_bf16", "switch_to": "fp32", "switch_at": 0.999}}},
          "analysis": {"baseline": "x"}, "train": {"finetune": {"steps": 300}}},
         "schedules.x.finetune.switch_at", "rounds to step 300, the end of the stage: it would never switch to fp32"),
        ({"sweeps": {"s": {"pretrain": {"precision": "amp_fp16", "switch_to": "fp32"}, "finetune": "fp32",
                           "switch_at": [0.0, 0.001, 1.0]}}, "train": {"pretrain": {"steps": 300}}},
         "schedules.s-at0.1.pretrain.switch_at", "rounds to step 0"),
        ({"train": {"pretrain": {"steps": 5, "timing_warmup_steps": 5}}}, "train.pretrain.timing_warmup_steps",
         "5 leaves none of the stage's 5 steps"),
        # every job's shell command names results_dir: shell characters broke the first job
        ({"results_dir": "res$x"}, "results_dir", "no shell characters"),
        ({"results_dir": "~/res"}, "results_dir", "no leading - or ~"),
        ({"results_dir": "res;rm"}, "results_dir", "no shell characters"),
        # a run directory per schedule (runs/finetune/<name>/seed1): no '/' (a nested directory, or another's)
        ({"schedules": {"a/b": {"finetune": "fp32"}}, "analysis": {"baseline": "a/b"}}, "schedules",
         "'a/b' does not match"),
        ({"sweeps": {"s/t": {"finetune": {"precision": "amp_fp16", "switch_to": "fp32"}, "switch_at": [0.5]}}},
         "sweeps", "'s/t' does not match"),
        # eval_precision's enum has 'same' besides the precisions: a bare 16-bit name still asks mixed or pure
        ({"train": {"finetune": {"eval_precision": "bf16"}}}, "train.finetune.eval_precision",
         "'bf16' is ambiguous: amp_bf16 = fp32 master weights"),
        # a stage's overrides: the optimizer's values only (steps would unpair the schedules), each one a change
        ({"schedules": {"x": {"pretrain": {"precision": "pure_fp16", "overrides": {"steps": 10}}, "finetune": "fp32"}},
          "analysis": {"baseline": "x"}}, "schedules.x.pretrain.overrides", "'steps' was unexpected"),
        ({"schedules": {"x": {"pretrain": {"precision": "pure_fp16", "overrides": {"adam_eps": 1.0e-6}},
                              "finetune": "fp32"}}, "analysis": {"baseline": "x"}},
         "schedules.x.pretrain.overrides.adam_eps", "1e-06 is train.pretrain.adam_eps already"),
        ({"schedules": {"x": {"pretrain": "fp32", "finetune": {"precision": "fp32", "overrides": {"lr": 0}}}},
          "analysis": {"baseline": "x"}}, "schedules.x.finetune.overrides.lr", "less than or equal to the minimum of 0"),
        ({"schedules": {"x": {"pretrain": "fp32", "finetune": {"precision": "fp32", "overrides": {"lr": float("nan")}}}},
          "analysis": {"baseline": "x"}}, "schedules.x.finetune.overrides.lr", "nan is not a finite number"),
    ]


@pytest.mark.parametrize("cfg, key, allowed", CASES)
def test_config_error_names_the_key(cfg, key, allowed):
    with pytest.raises(ConfigError) as e:
        study.check(cfg)
    assert e.value.key == key
    assert_names_the_key(str(e.value), key, allowed)


@pytest.mark.parametrize("case", [0, 2, 40])
def test_a_config_error_reaches_the_dry_run_command(tmp_path, case):
    """The same refusal through `snakemake -n` (schema errors and a cross-key one): the line naming the key is
    printed, and no job is planned."""
    cfg, key, allowed = CASES[case]
    proc = dry_run(tmp_path, cfg)
    assert proc.returncode != 0, f"config {cfg} was accepted"
    err = proc.stdout + proc.stderr
    assert_names_the_key(err, key, allowed)
    assert "Job stats" not in err  # rejected before the DAG is built


# --------------------------------------------------------------------- checks and settings of precswitch.study
def _read(cfg: dict) -> dict:
    """What precswitch.study makes of a config, as the Snakefile reads it: the refusal (its line), or the plan
    and the settings the data jobs get."""
    try:
        p = study.plan(study.validate(copy.deepcopy(cfg)))
    except ConfigError as e:
        return {"ok": False, "error": str(e)}
    return {"ok": True, "plan": p, "sweeps": p.sweeps, "fetch": study.fetch_needed(p.config),
            "tokenizer": study.tokenizer_options(p.config), "compile": p.config["train"]["pretrain"]["compile"]}


def test_config_checks_the_schema_cannot_express(tmp_path):
    """Each bad config is refused naming its key and the reason (a table source without its eval file, a hub
    source without a name, a table as stage-1 source, a list of files for a one-file kind, two swept stages in one
    sweep, heads that do not divide the hidden size, power equal to alpha); boundary values are accepted (max_length
    equal to the position embeddings); YAML's `compile: off` (false) is off, also beside telemetry; a sweep over
    stage 1 tags its schedules with that stage; the tokenizer is trained for model.max_position_embeddings (not a
    stage's max_length), cased when asked; a local model.init needs no fetch."""
    init = tmp_path / "init"
    init.mkdir()
    (init / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": 512}))
    (init / "model.safetensors").write_bytes(b"")  # the check asks for weights by name
    table = tmp_path / "t.tsv"
    table.write_text("label\ts1\n1\ta b\n0\tc d\n", encoding="utf-8")
    cols = {"text_a": "s1", "text_b": None, "label": "label"}
    tsv = {"kind": "tsv", "train": str(table), "eval": str(table), "columns": cols}
    cases = [
        ({"data": {"finetune": {**tsv, "eval": None}}}, "data.finetune.eval", "required for kind tsv (file path)"),
        ({"data": {"finetune": {"kind": "hub", "config": "mrpc"}}}, "data.finetune.name", "required for kind hub"),
        ({"data": {"pretrain": tsv}}, "data.pretrain.kind", "tsv is a classification table; stage 1"),
        ({"data": {"finetune": {**tsv, "train": [str(table)]}}}, "data.finetune.train",
         "kind tsv takes one file path, not a list"),
        ({"sweeps": {"s": {"pretrain": {"precision": "amp_fp16", "switch_to": "fp32"},
                           "finetune": {"precision": "amp_fp16", "switch_to": "fp32"}, "switch_at": [0.5]}}},
         "sweeps.s", "exactly one stage must be swept"),
        ({"model": {"hidden_size": 100, "num_attention_heads": 3}}, "model.num_attention_heads",
         "3 does not divide model.hidden_size (100)"),
        ({"analysis": {"alpha": 0.5, "power": 0.5}}, "analysis.power", "0.5 must exceed analysis.alpha (0.5)"),
    ]
    for cfg, key, problem in cases:
        with pytest.raises(ConfigError) as e:
            study.check(cfg)
        assert e.value.key == key and problem in str(e.value), (cfg, str(e.value))
    assert _read({"device": "cuda:1"})["ok"]
    fits = _read({"model": {"max_position_embeddings": 64}, "train": {"pretrain": {"max_length": 64}}})
    assert fits["tokenizer"] == "--vocab-size 400 --model-max-length 64"
    compiled = _read({"train": {"pretrain": {"compile": False, "telemetry_every": 5}},
                      "tokenizer": {"vocab_size": 5000, "cased": True}, "model": {"max_position_embeddings": 96}})
    assert compiled["compile"] == "off"
    assert compiled["tokenizer"] == "--vocab-size 5000 --model-max-length 96 --cased"
    local = _read({"model": {"init": str(init)}, "device": "auto"})
    assert local["fetch"] is False and local["tokenizer"] == f"--pretrained {init}"
    swept = _read({"schedules": {"x": {"finetune": "fp32"}}, "analysis": {"baseline": "x", "contrasts": []},
                   "sweeps": {"pre": {"pretrain": {"precision": "amp_bf16", "switch_to": "fp32"}, "finetune": "fp32",
                                      "switch_at": [0.25]}}})
    assert swept["sweeps"] == {"pre-at25": {"sweep": "pre", "sweep_at": 0.25, "sweep_stage": "pretrain"}}
    assert sorted(swept["plan"].schedules) == ["pre-at25", "x"]


def test_planning_leaves_the_config_as_given():
    """plan() works on a copy: the sweep points and YAML's compile false are in plan.config, not in the config."""
    cfg = study.validate({"sweeps": {"s": {"finetune": {"precision": "amp_bf16", "switch_to": "fp32"},
                                           "switch_at": [0.5]}},
                          "train": {"pretrain": {"compile": False}}})
    before = copy.deepcopy(cfg)
    p = study.plan(cfg)
    assert cfg == before
    assert "s-at50" in p.config["schedules"] and p.config["train"]["pretrain"]["compile"] == "off"


def test_reading_a_cpu_study_config_does_not_import_torch(tmp_path):
    """The workflow reads and checks a config (every dry run, every SLURM job's Snakemake) without importing torch:
    precswitch.study and the precision names (precswitch.catalog) are torch-free. It used to import torch through
    precswitch.precision and precswitch.train.config: ~3 of a dry run's 7 s on a 2-core CPU. (device auto asks
    torch whether there is a GPU: not here, device cpu.) -X importtime lists every module the dry run imported."""
    cfg = {"schedules": {"x": {"pretrain": {"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 0.5},
                               "finetune": "pure_bf16"}},
           "analysis": {"baseline": "x", "contrasts": []}, "seeds": [1], "device": "cpu",
           "sweeps": {"s": {"finetune": {"precision": "amp_bf16", "switch_to": "fp32"}, "switch_at": [0.5]}},
           "train": {"finetune": {"eval_precision": "fp32"}}}
    path = write_config(tmp_path / "study.yaml", cfg)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "snakemake", "-s", str(SNAKEFILE), "-d",
                           str(tmp_path), "-n", "--configfile", str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "s-at50" in proc.stdout, (proc.stdout + proc.stderr)[-3000:]
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    assert "precswitch.study" in imported and "torch" not in imported


# ------------------------------------------------------------------------------- GPU checks and previous runs
def test_gpu_checks_before_any_job_name_the_key(monkeypatch):
    """A local run's training jobs: device cuda on a machine without a GPU is refused naming device and the number
    of jobs; device auto there trains on the CPU, which refuses a GPU-only precision naming the schedule's stage
    (stage 1 by the schedule that uses the run); device cpu asks nothing (checked when the config was read)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = {"schedules": {"x": {"pretrain": "fp32", "finetune": "fp32"}, "t": {"pretrain": "tf32", "finetune": "fp32"}},
           "analysis": {"baseline": "x", "contrasts": []}, "seeds": [1]}
    cuda = study.plan(study.validate({**copy.deepcopy(cfg), "device": "cuda"}))
    with pytest.raises(ConfigError) as e:
        study.check_gpu(cuda, [("pretrain", "fp32"), ("finetune", "x")], None)
    assert e.value.key == "device" and "2 training jobs" in str(e.value)
    auto = study.plan(study.validate({**copy.deepcopy(cfg), "device": "auto"}))
    assert study.check_gpu(auto, [("pretrain", "fp32"), ("finetune", "t")], None) is None
    with pytest.raises(ConfigError) as e:
        study.check_gpu(auto, [("pretrain", "tf32")], None)
    assert e.value.key == "schedules.t.pretrain" and "tf32 needs cuda" in str(e.value)
    assert study.check_gpu(cuda, [], None) is None  # e.g. only the fetch job runs


def test_keep_previous_runs_keeps_finished_runs_with_their_log_not_their_resume_state(tmp_path):
    res = tmp_path / "res"
    done, unfinished = res / "runs" / "finetune" / "x" / "seed1", res / "runs" / "finetune" / "x" / "seed2"
    for run in (done, unfinished):
        (run / "resume").mkdir(parents=True)
    (done / "metrics.json").write_text('{"run": 1}')
    log = res / "logs" / "finetune" / "x" / "seed1.log"
    log.parent.mkdir(parents=True)
    log.write_text("log 1")
    runs = [(str(done / "metrics.json"), [str(log)]), (str(unfinished / "metrics.json"), [])]
    kept = study.keep_previous_runs(runs, str(res), str(res / "previous"))
    prev = res / "previous" / "runs" / "finetune" / "x"
    assert kept == ["runs/finetune/x/seed1"]
    assert sorted(p.name for p in (prev / "seed1").iterdir()) == ["metrics.json", "seed1.log"]
    assert not (prev / "seed2").exists()
    (done / "metrics.json").write_text('{"run": 2}')
    study.keep_previous_runs(runs, str(res), str(res / "previous"))
    assert (prev / "seed1" / "metrics.json").read_text() == '{"run": 2}'  # the latest previous version
