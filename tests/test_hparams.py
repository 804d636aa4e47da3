"""Stage hyper-parameters: what a study's training job gets (precswitch.study.hparams, from the config) and how
``precswitch train`` checks them (precswitch.train.config): every bad value is refused by ``resolve`` with a message
naming its key, before anything is built or trained; the config hash follows what changes the numbers.
No data, model or training: each check is a function on a dict."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
import yaml
from workflow_helpers import ROOT

from precswitch import study
from precswitch.errors import PrecswitchError
from precswitch.train import config as C

BASE = {"data": "d", "steps": 10}


@pytest.mark.parametrize("patch, msg", [
    ({"lr": 0}, r"lr must be > 0, got 0"),
    ({"lr": -1e-3}, r"lr must be > 0, got -0\.001"),
    ({"weight_decay": -0.1}, r"weight_decay must be >= 0"),
    ({"adam_eps": -1e-8}, r"adam_eps and weight_decay must be >= 0"),
    ({"adam_eps": float("nan")}, r"^adam_eps must be a finite number, got nan"),
    ({"adam_beta1": float("inf")}, r"^adam_beta1 must be a finite number, got inf"),
    ({"warmup_ratio": 1}, r"warmup_ratio must be in \[0, 1\), got 1"),
    ({"warmup_ratio": -0.1}, r"warmup_ratio must be in \[0, 1\)"),
    ({"mlm_probability": 0}, r"mlm_probability must be in \(0, 1\), got 0"),
    ({"mlm_probability": 1}, r"mlm_probability must be in \(0, 1\), got 1"),
    ({"batch_size": 0}, r"^batch_size must be a positive integer, got 0"),
    ({"batch_size": 8.0}, r"^batch_size must be a positive integer, got 8\.0"),
    ({"eval_batch_size": 0}, r"^eval_batch_size must be a positive integer"),
    ({"threads": 0}, r"^threads must be a positive integer"),
    ({"log_every": 0}, r"^log_every must be a positive integer"),
    ({"max_nonfinite": 0}, r"^max_nonfinite must be a positive integer"),
    ({"seed": -1}, r"^seed must be a non-negative integer below 2\^32, got -1"),
    ({"telemetry_every": -1}, r"^telemetry_every must be a non-negative integer, got -1"),
    ({"objective": "seq2seq"}, r"objective 'seq2seq': allowed mlm, classify"),
    ({"optimizer_impl": "adamw"}, r"optimizer_impl 'adamw': allowed 'fused' or 'foreach'"),
    ({"on_unsupported": "ignore"}, r"on_unsupported 'ignore': allowed 'error' or 'skip'"),
    ({"eval_precision": "fp64"}, r"eval_precision 'fp64': allowed 'same' or one of fp32, tf32"),
    ({"precision": "fp64"}, r"fp64"),
    ({"data": None}, r"hparams key 'data' is required"),
    ({"epochs": 2}, r"set exactly one of steps and epochs"),
    ({"steps": None}, r"set exactly one of steps and epochs"),
    ({"steps": 2.5}, r"steps must be a whole number, got 2\.5"),
    ({"steps": True}, r"steps must be a positive number, got True"),
    ({"switch_at": 0.5}, r"switch_to and switch_at go together"),
    ({"switch_to": "fp32"}, r"switch_to and switch_at go together"),
    ({"switch_to": "fp32", "switch_at": 1.5}, r"switch_at must be a fraction of the steps in \(0, 1\], got 1\.5"),
    ({"switch_to": "fp32", "switch_at": 0}, r"switch_at must be a fraction of the steps in \(0, 1\], got 0"),
    ({"switch_to": "fp64", "switch_at": 0.5}, r"fp64"),
    ({"model": {"hidden_size": 0}}, r"model\.hidden_size must be a positive integer, got 0"),
    ({"model": {"num_attention_heads": -2}}, r"model\.num_attention_heads must be a positive integer, got -2"),
    ({"model": {"hidden_sise": 64}}, r"unknown model key\(s\) \['hidden_sise'\]"),
])
def test_a_bad_value_is_refused_naming_its_key(patch, msg):
    with pytest.raises(PrecswitchError, match=msg):
        C.resolve({**BASE, **patch})


@pytest.mark.parametrize("first, then", [("fp32", "fp8"), ("fp8", "amp_bf16"), ("pure_bf16", "pure_bf16_kahan"),
                                         ("pure_bf16_sr", "pure_bf16"), ("amp_bf16", "pure_bf16"),
                                         ("pure_fp16", "pure_bf16")])
def test_an_in_stage_switch_between_weight_storages_is_refused(first, then):
    """fp8 converts the Linear layers and Kahan/SR keep extra optimizer state: neither can start or stop
    inside a stage, though the weight dtype is the same."""
    with pytest.raises(PrecswitchError, match=f"cannot switch from '{first}' to '{then}' inside a stage"):
        C.resolve({**BASE, "precision": first, "switch_to": then, "switch_at": 0.5})


@pytest.mark.parametrize("first, then, why", [
    ("fp32", "fp8", "float32 vs float32 + fp8 Linear layers"),
    ("pure_bf16", "pure_bf16_kahan", "bfloat16 vs bfloat16 + kahan update"),
    ("pure_bf16_sr", "pure_bf16", "bfloat16 + stochastic_rounding update vs bfloat16"),
    ("amp_bf16", "pure_bf16", "float32 vs bfloat16"),
])
def test_the_switch_refusal_says_how_the_storage_differs(first, then, why):
    """It used to say '(float32 vs float32)' for fp8 and '(bfloat16 vs bfloat16)' for Kahan/SR: a difference
    that is none."""
    with pytest.raises(PrecswitchError, match=re.escape(f"stored differently ({why}); use two stages instead")):
        C.resolve({**BASE, "precision": first, "switch_to": then, "switch_at": 0.5})


@pytest.mark.parametrize("first, then", [("amp_fp16", "fp32"), ("fp32", "amp_bf16"), ("amp_bf16", "amp_fp16")])
def test_an_in_stage_switch_between_fp32_master_weight_precisions_is_accepted(first, then):
    hp = C.resolve({**BASE, "precision": first, "switch_to": then, "switch_at": 0.5})
    assert (hp["switch_to"], hp["switch_at"], C.switch_step(hp, 10)) == (then, 0.5, 5)


def test_boundary_values_are_accepted_and_defaults_filled():
    hp = C.resolve({**BASE, "max_nonfinite_fraction": 1, "warmup_ratio": 0, "seed": 0, "switch_to": "fp32",
                    "switch_at": 1, "precision": "amp_fp16", "steps": 4, "stage": "finetune"})
    assert hp["max_nonfinite_fraction"] == 1 and hp["warmup_ratio"] == 0 and hp["switch_at"] == 1
    assert hp["steps"] == 4 and isinstance(hp["steps"], int)
    with pytest.raises(PrecswitchError, match=r"steps must be a whole number, got 4\.0"):  # as the study config
        C.resolve({**BASE, "steps": 4.0})
    assert hp["run_id"] == "finetune-amp_fp16-seed0"  # stage, precision and seed: unique per job
    assert C.resolve({**BASE, "seed": 7})["run_id"] == "pretrain-fp32-seed7"
    assert C.resolve({**BASE, "run_id": "mine"})["run_id"] == "mine"
    # a key given as null takes its default
    assert C.resolve({**BASE, "lr": None, "batch_size": None}) == C.resolve(BASE)


def test_config_hash_follows_every_key_that_changes_the_numbers():
    """Beyond test_engine's list: the optimizer settings, the model, the data and the init, the objective,
    steps vs epochs and the compile mode (off is the same as not set)."""
    fixed = {**BASE, "run_id": "r"}
    h = C.config_hash(C.resolve(fixed))
    for change in ({"weight_decay": 0.1}, {"warmup_ratio": 0.2}, {"adam_eps": 1e-6}, {"adam_beta1": 0.8},
                   {"adam_beta2": 0.98}, {"model": {"hidden_size": 96}}, {"model": {"attn_implementation": "sdpa"}},
                   {"data": "other"}, {"init": "some/checkpoint"}, {"objective": "classify"},
                   {"steps": None, "epochs": 10}, {"compile": "default"}, {"optimizer_impl": "foreach"},
                   {"tokenizer": "tok2"}, {"max_nonfinite": 3}):
        assert C.config_hash(C.resolve({**fixed, **change})) != h, change
    assert C.config_hash(C.resolve({**fixed, "compile": "off"})) == h
    assert C.config_hash(C.resolve({**fixed, "compile": False})) == h
    # stable: the same hparams in another key order give the same hash
    assert C.config_hash(C.resolve(dict(reversed(list(fixed.items()))))) == h


@pytest.mark.parametrize("spec", ["mps", "tpu", "xla:0"])
def test_a_device_other_than_cpu_or_cuda_is_named(spec):
    with pytest.raises(PrecswitchError, match=f"device '{spec}': allowed auto, cpu, cuda, cuda:N"):
        C.resolve_device(spec)


def test_cuda_on_a_machine_without_it_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(PrecswitchError, match=r"device 'cuda:1' requested but no CUDA GPU is available"):
        C.resolve_device("cuda:1")
    assert C.resolve_device("auto") == torch.device("cpu")
    assert C.resolve_device("cpu") == torch.device("cpu")


def test_train_cli_set_overrides_parse_json_values(monkeypatch, capsys):
    """``precswitch train --set KEY=VALUE``: VALUE read as JSON (else kept as text), split at the first '=',
    applied over --hparams, later --set winning."""
    from precswitch.cli import main
    from precswitch.train import engine

    seen = {}

    def fake_run_stage(hp, out):
        seen.update(hp=hp, out=str(out))
        return {"run_id": hp.get("run_id"), "status": "ok"}

    monkeypatch.setattr(engine, "run_stage", fake_run_stage)
    rc = main(["train", "--hparams", '{"data": "d", "steps": 3, "lr": 0.1}', "--out", "o",
               "--set", "steps=5", "--set", "precision=amp_fp16", "--set", "tags={\"a\": [1, 2]}",
               "--set", "run_id=x=y", "--set", "lr=1e-3", "--set", "lr=2e-3", "--set", "progress=false"])
    assert rc == 0
    assert seen == {"out": "o", "hp": {"data": "d", "steps": 5, "lr": 2e-3, "precision": "amp_fp16",
                                       "tags": {"a": [1, 2]}, "run_id": "x=y", "progress": False}}


def test_train_cli_dotted_set_changes_one_key_of_a_mapping_and_keeps_the_others(monkeypatch):
    """``--set model.hidden_size=64`` changes that key of the --hparams file's model and keeps its other keys
    (a plain ``--set model={...}`` replaces the whole mapping); a missing mapping is made; the file is not changed."""
    from precswitch.cli import main
    from precswitch.train import engine

    seen = {}
    monkeypatch.setattr(engine, "run_stage", lambda hp, out: seen.update(hp) or {"status": "ok"})
    base = {"data": "d", "steps": 3, "model": {"hidden_size": 32, "num_hidden_layers": 2}}
    argv = ["train", "--hparams", json.dumps(base), "--out", "o"]
    assert main([*argv, "--set", "model.hidden_size=64", "--set", "tags.sweep.at=0.5"]) == 0
    assert seen["model"] == {"hidden_size": 64, "num_hidden_layers": 2}
    assert seen["tags"] == {"sweep": {"at": 0.5}}
    seen.clear()
    assert main([*argv, "--set", 'model={"hidden_size": 64}']) == 0
    assert seen["model"] == {"hidden_size": 64}


@pytest.mark.parametrize("argv, msg", [
    (["--set", "steps"], "--set 'steps': expected KEY=VALUE"),
    (["--set", "steps.x=1"], "--set 'steps.x=1': steps is not a mapping (it is 3)"),
    (["--set", "lr=-1"], "lr must be > 0, got -1"),  # -1 the number, not the text '-1'
    (["--set", "stepz=3"], "unknown hparams key(s) ['stepz']"),
])
def test_train_cli_bad_set_is_one_line_exit_2_before_training(tmp_path, capsys, argv, msg):
    from precswitch.cli import main

    out = tmp_path / "o"
    rc = main(["train", "--hparams", '{"data": "d", "steps": 3}', "--out", str(out), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("precswitch: error: ") and msg in err[0], err
    assert not out.exists()


def test_no_command_prints_help_and_exits_2(capsys):
    from precswitch.cli import main

    assert main([]) == 2
    assert "usage: precswitch" in capsys.readouterr().out


@pytest.mark.parametrize("off", [None, 0])
def test_max_grad_norm_null_turns_clipping_off_as_0_does(off):
    """DEFAULTS: '0 or null: no clipping'. null used to be replaced by the default 1.0 like any other null
    key: the stage clipped at 1.0 (and recorded max_grad_norm 1.0) though the user had turned clipping off."""
    hp = C.resolve({**BASE, "max_grad_norm": off})
    assert hp["max_grad_norm"] == off
    assert C.resolve(BASE)["max_grad_norm"] == 1.0  # left out: the default


@pytest.mark.parametrize("patch, msg", [
    ({"adam_beta1": 1.5}, r"^adam_beta1 must be in \[0, 1\), got 1\.5"),
    ({"adam_beta1": -0.1}, r"^adam_beta1 must be in \[0, 1\), got -0\.1"),
    ({"adam_beta2": 1.0}, r"^adam_beta2 must be in \[0, 1\), got 1\.0"),
    ({"model": {"hidden_dropout_prob": 1.5}}, r"^model\.hidden_dropout_prob must be a number in \[0, 1\], got 1\.5"),
    ({"model": {"attention_probs_dropout_prob": -0.1}}, r"^model\.attention_probs_dropout_prob must be a number"),
    ({"model": {"hidden_dropout_prob": "0.1"}}, r"^model\.hidden_dropout_prob must be a number in \[0, 1\], got .0\.1."),
    ({"model": {"attn_implementation": "flash"}}, r"^model\.attn_implementation 'flash': allowed 'eager', 'sdpa'"),
    ({"init": "some/checkpoint", "model": {"attn_implementation": "flash"}}, r"^model\.attn_implementation 'flash'"),
])
def test_optimizer_betas_dropout_and_attention_kernel_are_checked_with_the_rest(patch, msg):
    """These used to pass resolve: torch (AdamW, Dropout) or transformers refused them with a traceback (exit 1,
    not naming the key) once the data was loaded and the model built; an unknown kernel with a checkpoint init
    was blamed on the checkpoint ('cannot be loaded (corrupt or truncated?)')."""
    with pytest.raises(PrecswitchError, match=msg):
        C.resolve({**BASE, **patch})
    assert C.resolve({**BASE, "adam_beta1": 0, "adam_beta2": 0.95,
                      "model": {"hidden_dropout_prob": 0, "attention_probs_dropout_prob": 1,
                                "attn_implementation": "sdpa"}})


def test_a_bad_beta_through_the_cli_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    from precswitch.cli import main

    out = tmp_path / "o"
    assert main(["train", "--hparams", '{"data": "d", "steps": 3, "adam_beta2": 1}', "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["precswitch: error: adam_beta2 must be in [0, 1), got 1"]
    assert not out.exists()


# ------------------------------------------------------------------ mutation audit 2 (plots/config/flops)
@pytest.mark.parametrize("patch, msg", [
    ({"steps": 0}, r"^steps must be a positive number, got 0"),
    ({"steps": None, "epochs": 0}, r"^epochs must be a positive number, got 0"),
    ({"steps": None, "epochs": -1.5}, r"^epochs must be a positive number, got -1\.5"),
    ({"lr": float("inf")}, r"^lr must be a finite number, got inf"),
    ({"lr": float("nan")}, r"^lr must be a finite number, got nan"),
    ({"lr": "1e-3"}, r"^lr must be a finite number, got '1e-3'"),
    ({"weight_decay": float("nan")}, r"^weight_decay must be a finite number, got nan"),
    ({"warmup_ratio": "0.1"}, r"^warmup_ratio must be a finite number"),
    ({"mlm_probability": float("nan")}, r"^mlm_probability must be a finite number, got nan"),
    ({"max_nonfinite_fraction": 0}, r"^max_nonfinite_fraction must be a number in \(0, 1\], got 0"),
    ({"max_nonfinite_fraction": True}, r"^max_nonfinite_fraction must be a number in \(0, 1\], got True"),
    ({"timing_warmup_steps": -1}, r"^timing_warmup_steps must be a non-negative integer, got -1"),
    ({"telemetry_every": 2.0}, r"^telemetry_every must be a non-negative integer, got 2\.0"),
    ({"max_nonfinite": True}, r"^max_nonfinite must be a positive integer, got True"),
    ({"init_revision": "  "}, r"^init_revision must be a hub branch, tag or commit"),
    ({"switch_to": "fp32", "switch_at": True}, r"^switch_at must be a fraction of the steps in \(0, 1\], got True"),
])
def test_more_bad_values_are_refused_naming_their_key(patch, msg):
    """Each of these passed ``resolve`` under a mutant of its check: a zero-step stage, an infinite or text lr
    (a TypeError deep in the optimizer), a stage that is diverged at its first non-finite loss, ..."""
    with pytest.raises(PrecswitchError, match=msg):
        C.resolve({**BASE, "precision": "amp_fp16", **patch})


def test_zero_weight_decay_and_adam_eps_and_extreme_valid_values_are_accepted():
    """weight_decay 0 (no decay) is common and adam_eps 0 is AdamW's own lower bound: both are in the allowed
    '>= 0'; so are timing_warmup_steps 0 and a fractional epochs count."""
    hp = C.resolve({**BASE, "weight_decay": 0, "adam_eps": 0, "timing_warmup_steps": 0, "eval_seed": 0})
    assert (hp["weight_decay"], hp["adam_eps"], hp["timing_warmup_steps"], hp["eval_seed"]) == (0, 0, 0, 0)
    assert C.resolve({"data": "d", "epochs": 0.5})["epochs"] == 0.5


def test_a_checkpoint_init_records_only_the_attention_kernel_of_the_model_keys():
    """A checkpoint or pretrained model brings its own sizes: metrics.json's hparams must not claim the defaults'
    (or the given) hidden_size/layers, which the model does not have; the kernel still applies."""
    hp = C.resolve({**BASE, "init": "runs/pretrain/fp32/seed1/checkpoint",
                    "model": {"hidden_size": 64, "attn_implementation": "sdpa"}})
    assert hp["model"] == {"attn_implementation": "sdpa"}
    assert C.resolve({**BASE, "init": "some/ckpt"})["model"] == {"attn_implementation": "auto"}
    assert C.resolve(BASE)["model"]["hidden_size"] == 64  # from scratch: the sizes are kept


@pytest.mark.parametrize("patch", [{"steps": float("nan")}, {"steps": float("inf")},
                                   {"steps": None, "epochs": float("inf")}, {"steps": None, "epochs": float("nan")}])
def test_a_non_finite_steps_or_epochs_is_named_before_training(patch):
    """steps .nan / .inf (YAML) ended ``resolve`` in a bare ValueError / OverflowError from int(); epochs .inf or
    .nan passed and crashed in the engine (int(round(inf * batches))) once the data was loaded."""
    key = "steps" if patch.get("steps") is not None else "epochs"
    with pytest.raises(PrecswitchError, match=rf"^{key} must be a finite positive number, got (nan|inf)$"):
        C.resolve({**BASE, **patch})


def test_resolve_refuses_a_steps_switch_that_rounds_to_no_switch_and_an_fp8_eval_in_another_precision():
    """A ``steps`` stage's switch point is checked by ``resolve`` (before any data is read), and an fp8 stage
    cannot be evaluated 'in fp32' (its Linear layers stay Float8Linear): both refused naming the key."""
    with pytest.raises(PrecswitchError, match=r"^switch_at 0\.01 of 10 steps rounds to step 0"):
        C.resolve({**BASE, "precision": "amp_fp16", "switch_to": "fp32", "switch_at": 0.01})
    with pytest.raises(PrecswitchError, match=r"^eval_precision 'fp32' after an fp8 stage: its Linear layers stay fp8"):
        C.resolve({**BASE, "precision": "fp8", "eval_precision": "fp32"})
    assert C.resolve({**BASE, "precision": "fp8", "eval_precision": "same"})["eval_precision"] == "same"


def test_model_keys_a_tokenizer_or_bert_config_may_set_are_accepted_and_init_revision_needs_a_hub_init():
    """model.vocab_size (the engine's ``m.pop('vocab_size') or len(tokenizer)``), type_vocab_size, layer_norm_eps
    and initializer_range are BertConfig keys the engine passes on: allowed. An init_revision with a scratch init
    names no model to pin: refused."""
    extra = {"vocab_size": 500, "type_vocab_size": 1, "layer_norm_eps": 1e-6, "initializer_range": 0.01}
    assert {k: C.resolve({**BASE, "model": extra})["model"][k] for k in extra} == extra
    with pytest.raises(PrecswitchError, match=r"^init_revision 'v1' is for a hub model init; init is scratch"):
        C.resolve({**BASE, "init_revision": "v1"})
    assert C.resolve({**BASE, "init": "acme/tiny-bert", "init_revision": "v1"})["init_revision"] == "v1"


def test_auto_device_is_the_gpu_where_there_is_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert C.resolve_device("auto") == torch.device("cuda")


# ------------------------------------------------------------------ mutation audit 7 (analysis cli/fakes/sweeps)
def test_exit_codes_are_the_documented_ones_and_an_unsupported_precision_is_a_user_error(monkeypatch, capsys):
    """2 for bad input, 75 after SIGTERM (docs/contracts.md, docs/slurm.md: the retry resumes on 75); a precision
    the device cannot run is bad input like any other: one line, exit 2, not a traceback (exit 1)."""
    from precswitch.cli import main
    from precswitch.errors import EXIT_PREEMPTED, EXIT_USER_ERROR, PrecisionUnsupported
    from precswitch.train import engine

    assert (EXIT_USER_ERROR, EXIT_PREEMPTED) == (2, 75)

    def refuse(hp, out):
        raise PrecisionUnsupported("precision 'tf32' cannot run on device 'cpu'")

    monkeypatch.setattr(engine, "run_stage", refuse)
    assert main(["train", "--hparams", '{"data": "d", "steps": 3}', "--out", "o"]) == 2
    got = capsys.readouterr()
    assert got.err == "precswitch: error: precision 'tf32' cannot run on device 'cpu'\n" and got.out == ""


def test_train_cli_prints_one_json_summary_line_and_keeps_a_text_value_as_given(monkeypatch, capsys):
    """stdout is one JSON line with the run's id, status, times, eval figures (accuracy and mlm_accuracy alike)
    and peak memory; a --set VALUE that is not JSON is kept verbatim, spaces included."""
    from precswitch.cli import main
    from precswitch.train import engine

    seen = {}
    m = {"run_id": "r", "status": "ok", "train_seconds": 1.5, "steps_per_second": 2.0, "eval_loss": 0.5,
         "accuracy": None, "mlm_accuracy": 0.25, "peak_memory_bytes": 7, "other": 1}
    monkeypatch.setattr(engine, "run_stage", lambda hp, out: seen.update(hp) or m)
    assert main(["train", "--hparams", '{"data": "d", "steps": 3}', "--out", "o", "--set", "run_id= a b "]) == 0
    assert seen["run_id"] == " a b "
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out) == {k: v for k, v in m.items() if k != "other"}


def test_train_cli_dotted_set_names_the_first_key_that_is_not_a_mapping(capsys):
    from precswitch.cli import main

    rc = main(["train", "--hparams", '{"data": "d", "steps": 3, "tags": {"a": {"b": 1}}}', "--out", "o",
               "--set", "steps.x.y=1"])
    assert rc == 2 and "--set 'steps.x.y=1': steps is not a mapping (it is 3)" in capsys.readouterr().err
    rc = main(["train", "--hparams", '{"data": "d", "steps": 3, "tags": {"a": {"b": 1}}}', "--out", "o",
               "--set", "tags.a.b.c=1"])
    assert rc == 2 and "--set 'tags.a.b.c=1': tags.a.b is not a mapping (it is 1)" in capsys.readouterr().err


# ---------------------------------------------------------- precswitch.study.hparams: what each training job gets
def _jobs(cfg: dict) -> dict:
    """What precswitch.study makes of a config: the refusal, or the stage-1 runs, schedules, sweep tags, whether
    the hub is needed, and the hparams of every training job (what `precswitch train` gets), with the paths of
    workflow/rules/common.smk (a schedule fine-tunes from its stage-1 run's checkpoint)."""
    try:
        p = study.plan(study.validate(copy.deepcopy(cfg)))
    except study.ConfigError as e:
        return {"ok": False, "error": str(e)}
    hps = {}
    for seed in p.seeds:
        runs = [("pretrain", run, p.config["model"]["init"]) for run in p.stage1]
        runs += [("finetune", name, p.config["model"]["init"] if p.stage1_of(name) is None
                  else f"results/runs/pretrain/{p.stage1_of(name)}/seed{seed}/checkpoint") for name in p.schedules]
        for stage, name, init in runs:
            hp = study.hparams(p, stage, name, str(seed), data=f"results/data/{stage}/prepared",
                               tokenizer="results/data/pretrain/tokenizer", init=init)
            hps[hp["run_id"]] = json.loads(json.dumps(hp))  # as the job's command line carries it
    return {"ok": True, "stage1": p.stage1, "schedules": p.schedules, "sweeps": p.sweeps,
            "fetch": study.fetch_needed(p.config), "hparams": hps}


# every key of a stage set to a value that is not its default (and not the other stage's): what reaches the job
AUDIT4_PRETRAIN = {
    "steps": 40, "batch_size": 8, "eval_batch_size": 16, "lr": 0.002, "warmup_ratio": 0.2, "weight_decay": 0.05,
    "adam_eps": 1e-7, "adam_beta1": 0.8, "adam_beta2": 0.95, "max_grad_norm": 0.5, "max_length": 96,
    "mlm_probability": 0.2, "eval_precision": "fp32", "max_nonfinite": 3, "max_nonfinite_fraction": 0.5,
    "timing_warmup_steps": 2, "log_every": 4, "checkpoint_every_steps": 7, "checkpoint_every_minutes": 3,
    "save_checkpoint": False, "telemetry_every": 5, "on_unsupported": "skip"}
AUDIT4_FINETUNE = {
    "steps": None, "epochs": 2, "batch_size": 4, "eval_batch_size": 12, "lr": 5e-5, "warmup_ratio": 0.05,
    "weight_decay": 0.0, "adam_eps": 1e-4, "adam_beta1": 0.85, "adam_beta2": 0.98, "max_grad_norm": 0,
    "max_length": 48, "mlm_probability": 0.3, "eval_precision": "amp_bf16", "max_nonfinite": 9,
    "max_nonfinite_fraction": 1, "timing_warmup_steps": 0, "log_every": 1, "checkpoint_every_steps": 0,
    "checkpoint_every_minutes": 0, "save_checkpoint": True, "compile": "reduce-overhead", "on_unsupported": "skip"}
_SWITCH = {"precision": "amp_fp16", "switch_to": "fp32"}
_ONE = {"seeds": [1], "analysis": {"baseline": "x", "contrasts": []}}
AUDIT4_CONFIGS = {
    "home_too_long": {"model": {"init": "~/init"}, "train": {"finetune": {"max_length": 128}}},
    "home_fits": {"model": {"init": "~/init"}, "train": {"pretrain": {"max_length": 64}, "finetune": {"max_length": 64}},
                  "seeds": [1]},
    "round_stage1": {"schedules": {"a": {"pretrain": {**_SWITCH, "switch_at": 0.1234561}, "finetune": "fp32"},
                                   "b": {"pretrain": {**_SWITCH, "switch_at": 0.1234564}, "finetune": "fp32"}},
                     "analysis": {"baseline": "a", "contrasts": []}, "seeds": [1]},
    "round_sweep": {"sweeps": {"s": {"finetune": _SWITCH, "switch_at": [0.5, 0.1234561, 0.1234564]}}, "seeds": [1]},
    "round_apart": {"schedules": {"a": {"pretrain": {**_SWITCH, "switch_at": 0.125}, "finetune": "fp32"},
                                  "b": {"pretrain": {**_SWITCH, "switch_at": 0.1234}, "finetune": "fp32"}},
                    "analysis": {"baseline": "a", "contrasts": []}, "seeds": [1]},
    "every_key": {"train": {"pretrain": AUDIT4_PRETRAIN, "finetune": AUDIT4_FINETUNE}, "device": "cuda", "threads": 3,
                  "seeds": [7, 11], "model": {"max_position_embeddings": 128}},
    # finetune swept; its stage 1 is a switch of its own (not swept), shared by every point
    "sweep": {"schedules": {"x": {"pretrain": "fp32", "finetune": "fp32"}},
              "sweeps": {"s": {"pretrain": {**_SWITCH, "switch_at": 0.5},
                               "finetune": {"precision": "amp_bf16", "switch_to": "fp32"},
                               "switch_at": [0, 0.125, 0.29, 0.5, 1]}}, **_ONE},
    "hub_pretrain_data": {"data": {"pretrain": {"kind": "hub", "name": "wikitext", "text_column": "text"}},
                          "seeds": [1]},
    # a hub model brings its own position embeddings (known after fetch): model.max_position_embeddings is not its
    "hub_model": {"model": {"init": "acme/tiny-bert", "max_position_embeddings": 32},
                  "train": {"pretrain": {"max_length": 512}}, "seeds": [1]},
    "cpu_switch_to_tf32": {"device": "cpu", "schedules": {"x": {"pretrain": {"precision": "fp32", "switch_to": "tf32",
                                                                           "switch_at": 0.5}, "finetune": "fp32"}},
                           **_ONE},
    # an epochs stage: its step count only the engine knows, so neither timing_warmup_steps nor switch_at is checked
    "epochs_stage": {"schedules": {"x": {"pretrain": {**_SWITCH, "switch_at": 0.001}, "finetune": "fp32"}},
                     "train": {"pretrain": {"steps": None, "epochs": 1.5, "timing_warmup_steps": 50}}, **_ONE},
    # stage 1 reads the synthetic corpus, not its n_train classification rows
    "synthetic_rows": {"data": {"synthetic": {"n_train": 16}},
                       "train": {"pretrain": {"batch_size": 32}, "finetune": {"batch_size": 16}}, "seeds": [1]},
    "steps_and_epochs": {"train": {"pretrain": {"steps": 10, "epochs": 1}}},
    # on_unsupported is the refused stage's own
    "cpu_tf32_finetune_skipped": {"device": "cpu", "schedules": {"x": {"pretrain": "fp32", "finetune": "tf32"}},
                                  "train": {"finetune": {"on_unsupported": "skip"}}, **_ONE},
    "cpu_tf32_finetune_pretrain_skipped": {"device": "cpu", "schedules": {"x": {"pretrain": "fp32", "finetune": "tf32"}},
                                           "train": {"pretrain": {"on_unsupported": "skip"}}, **_ONE},
    "hub_without_name": {"data": {"finetune": {"kind": "hub", "name": ""}}},
    # optimizer overrides of one stage of one schedule: a stage-1 run of their own, shared by equal overrides
    "overrides": {"schedules": {
        "x": {"pretrain": "pure_fp16", "finetune": "fp32"},
        "e1": {"pretrain": {"precision": "pure_fp16", "overrides": {"adam_eps": 1e-4}}, "finetune": "fp32"},
        "e2": {"pretrain": {"precision": "pure_fp16", "overrides": {"adam_eps": 1.0e-4}},
               "finetune": {"precision": "fp32", "overrides": {"lr": 1e-4, "max_grad_norm": 0}}},
        # a switch at 1 is the run without a switch, its overrides kept
        "s": {"pretrain": {"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 1, "overrides": {"lr": 0.002}},
              "finetune": "fp32"}},
        "sweeps": {"w": {"pretrain": "fp32", "finetune": {"precision": "amp_bf16", "switch_to": "fp32",
                                                           "overrides": {"weight_decay": 0}},
                         "switch_at": [0, 0.5, 1]}},
        "device": "cuda", **_ONE},
    # the shipped opt-in study of pure_fp16's eps, as `--configfile config/pure-fp16-eps.yaml` reads it
    "pure_fp16_eps": yaml.safe_load((ROOT / "config" / "pure-fp16-eps.yaml").read_text()),
}


@pytest.fixture(scope="module")
def audit4(tmp_path_factory):
    """What precswitch.study makes of each of AUDIT4_CONFIGS (see _jobs), by name; HOME holds ~/init, a local
    model whose config.json has 64 position embeddings."""
    tmp = tmp_path_factory.mktemp("audit4")
    init = tmp / "home" / "init"
    init.mkdir(parents=True)
    (init / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": 64}))
    (init / "model.safetensors").write_bytes(b"")  # the check asks for weights by name
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(tmp / "home"))
        return {name: _jobs(cfg) for name, cfg in AUDIT4_CONFIGS.items()}


def test_a_model_init_under_home_is_a_local_model(audit4):
    """model.init '~/...' is a local directory (the engine and `precswitch tokenizer` expand ~): its config.json
    bounds a stage's max_length when the config is read (the check looked for a literal '~' directory, found none
    and let max_length 128 through to the prepare job, which refused it after stage 1 trained), and it needs no
    fetch."""
    too_long, fits = audit4["home_too_long"], audit4["home_fits"]
    assert not too_long["ok"] and too_long["error"] == (
        "config key train.finetune.max_length: 128 exceeds the position embeddings (64) of model.init '~/init'")
    assert fits["ok"] and fits["fetch"] is False, fits
    assert {hp["init"] for hp in fits["hparams"].values() if hp["stage"] == "pretrain"} == {"~/init"}


def test_switch_points_that_round_to_one_name_are_refused(audit4):
    """A stage-1 run and a sweep point are named by the switch point's percent to 6 significant digits: two switch
    points closer than that got one name, so schedule a fine-tuned from the stage-1 run trained at b's switch_at
    (its own never ran), and a sweep's second point was 'already a schedule'. Both are refused, naming the key;
    points further apart get names of their own (12.5, not 12)."""
    assert audit4["round_stage1"]["error"] == (
        "config key schedules.b.pretrain: switch_at 0.1234564 and schedule a's 0.1234561 give one stage-1 run name, "
        "'amp_fp16-to-fp32-at12.3456'; make them equal or further apart")
    assert audit4["round_sweep"]["error"] == (
        "config key sweeps.s.switch_at[2]: 0.1234564 and 0.1234561 give one schedule name, 's-at12.3456'; make them "
        "equal or further apart")
    apart = audit4["round_apart"]
    assert apart["ok"] and sorted(apart["stage1"]) == ["amp_fp16-to-fp32-at12.34", "amp_fp16-to-fp32-at12.5"]
    assert apart["hparams"]["finetune-b-seed1"]["init"] == \
        "results/runs/pretrain/amp_fp16-to-fp32-at12.34/seed1/checkpoint"
    assert apart["hparams"]["pretrain-amp_fp16-to-fp32-at12.5-seed1"]["switch_at"] == 0.125


def test_every_stage_key_reaches_its_stages_jobs(audit4):
    """Each train.<stage> key set in the config reaches every job of that stage with its value, and only that
    stage's (stage 2 does not get stage 1's); max_length is the prepare job's (the data is cut to it), not the
    engine's; mlm_probability is stage 1's only; save_checkpoint is always on for stage 1; compile off and
    telemetry_every 0 are left to the engine's defaults, max_nonfinite_fraction too at its default (0.25) but not
    at 1 (the test turned off)."""
    result = audit4["every_key"]
    assert result["ok"], result
    hps = result["hparams"]
    assert set(hps) == {f"{stage}-{n}-seed{s}" for s in (7, 11)
                        for stage, names in (("pretrain", ("fp32", "amp_fp16", "amp_bf16")),
                                             ("finetune", ("fp32-fp32", "fp16-fp32", "fp16-fp16", "bf16-fp32")))
                        for n in names}
    for run_id, hp in hps.items():
        stage = hp["stage"]
        given = {"pretrain": AUDIT4_PRETRAIN, "finetune": AUDIT4_FINETUNE}[stage]
        expected = {k: v for k, v in given.items() if k not in ("max_length", "mlm_probability", "save_checkpoint")}
        if stage == "pretrain":
            expected.update(mlm_probability=given["mlm_probability"], epochs=None)
        assert {k: hp.get(k, "(absent)") for k in expected} == expected, run_id
        assert hp["save_checkpoint"] is True, run_id
        assert "max_length" not in hp and ("mlm_probability" in hp) == (stage == "pretrain"), run_id
        assert ("compile" in hp, "telemetry_every" in hp) == ((False, True) if stage == "pretrain" else (True, False))
        assert (hp["seed"], hp["device"], hp["threads"]) == (int(run_id.rsplit("seed", 1)[1]), "cuda", 3), run_id
    assert hps["pretrain-amp_bf16-seed7"]["model"]["max_position_embeddings"] == 128


def test_stage_overrides_make_a_run_of_their_own_with_those_values(audit4):
    """A stage's overrides reach its jobs (and only its: the stage's other values, and the other stage's, are
    train.<stage>'s) and name its run: pure_fp16 with adam_eps 1e-4 is stage-1 run pure_fp16-with-adam_eps0.0001,
    apart from plain pure_fp16 and shared by the two schedules that ask for it (1e-4 and 1.0e-4 are one value);
    the job's tags say which values are overrides (the analysis' spec column). A switch at 1 keeps its overrides;
    a sweep's overrides apply at every point."""
    result = audit4["overrides"]
    assert result["ok"], result
    assert sorted(result["stage1"]) == ["amp_fp16-with-lr0.002", "fp32", "pure_fp16", "pure_fp16-with-adam_eps0.0001"]
    hps = result["hparams"]
    plain, tuned = hps["pretrain-pure_fp16-seed1"], hps["pretrain-pure_fp16-with-adam_eps0.0001-seed1"]
    assert (plain["adam_eps"], plain["tags"]) == (1e-6, {})
    assert (tuned["adam_eps"], tuned["tags"]) == (1e-4, {"overrides": {"adam_eps": 1e-4}})
    assert {k: v for k, v in tuned.items() if k not in ("adam_eps", "tags", "run_id")} == \
        {k: v for k, v in plain.items() if k not in ("adam_eps", "tags", "run_id")}
    for name in ("e1", "e2"):
        assert hps[f"finetune-{name}-seed1"]["init"] == "results/runs/pretrain/pure_fp16-with-adam_eps0.0001/seed1/checkpoint"
    assert hps["finetune-x-seed1"]["init"] == "results/runs/pretrain/pure_fp16/seed1/checkpoint"
    e1, e2 = hps["finetune-e1-seed1"], hps["finetune-e2-seed1"]
    assert (e1["lr"], e1["max_grad_norm"], e1["tags"]) == (1e-3, 1.0, {"schedule": "e1"})
    assert (e2["lr"], e2["max_grad_norm"], e2["adam_eps"]) == (1e-4, 0, e1["adam_eps"])
    assert e2["tags"] == {"schedule": "e2", "overrides": {"lr": 1e-4, "max_grad_norm": 0}}
    s1 = hps["pretrain-amp_fp16-with-lr0.002-seed1"]
    assert (s1["precision"], s1["lr"], "switch_to" in s1) == ("amp_fp16", 0.002, False)
    for at, precision in ((0, "fp32"), (50, "amp_bf16"), (100, "amp_bf16")):
        hp = hps[f"finetune-w-at{at}-seed1"]
        assert (hp["precision"], hp["weight_decay"], hp["tags"]["overrides"]) == (precision, 0, {"weight_decay": 0})
        assert hp["tags"]["sweep"] == "w"
    assert hps["finetune-w-at50-seed1"]["switch_to"] == "fp32"


def test_the_pure_fp16_eps_study_differs_in_the_eps_alone(audit4):
    """config/pure-fp16-eps.yaml: the two pure_fp16 stage-1 runs of a seed get the same hparams but adam_eps (1e-8,
    the study's train.pretrain value, against the schedule's override 1e-4), and each schedule fine-tunes its own."""
    result = audit4["pure_fp16_eps"]
    assert result["ok"], result
    assert sorted(result["stage1"]) == ["fp32", "fp32-with-adam_eps0.0001", "pure_fp16", "pure_fp16-with-adam_eps0.0001"]
    hps = result["hparams"]
    for seed in (1, 2, 3):
        plain, tuned = hps[f"pretrain-pure_fp16-seed{seed}"], hps[f"pretrain-pure_fp16-with-adam_eps0.0001-seed{seed}"]
        assert (plain["adam_eps"], tuned["adam_eps"], plain["steps"]) == (1e-8, 1e-4, 600)
        differ = {k for k in plain.keys() | tuned.keys() if plain.get(k) != tuned.get(k)}
        assert differ == {"adam_eps", "run_id", "tags"}, differ
        assert hps[f"finetune-purefp16eps-fp32-seed{seed}"]["init"].endswith(
            f"/pure_fp16-with-adam_eps0.0001/seed{seed}/checkpoint")


def test_a_sweep_point_is_named_by_its_percent_and_runs_its_stages(audit4):
    """A finetune sweep over [0, 0.125, 0.29, 0.5, 1]: point f is schedule s-at<100 f> (0.29 is at29, not at28;
    0.125 at12.5); at 0 the stage runs all in switch_to, at 1 all in precision, between them it switches at f; every
    point keeps the sweep's stage 1 (itself a switch, not swept) and shares its runs; each job's tags say which
    point it is."""
    result = audit4["sweep"]
    assert result["ok"], result
    names = {0: "s-at0", 0.125: "s-at12.5", 0.29: "s-at29", 0.5: "s-at50", 1: "s-at100"}
    assert result["sweeps"] == {n: {"sweep": "s", "sweep_at": f, "sweep_stage": "finetune"} for f, n in names.items()}
    assert sorted(result["stage1"]) == ["amp_fp16-to-fp32-at50", "fp32"]
    hps = result["hparams"]
    for f, name in names.items():
        hp = hps[f"finetune-{name}-seed1"]
        first = {"precision": "fp32"} if f == 0 else {"precision": "amp_bf16"}
        if 0 < f < 1:
            first.update(switch_to="fp32", switch_at=f)
        assert {k: hp[k] for k in ("precision", "switch_to", "switch_at") if k in hp} == first, name
        assert hp["init"] == "results/runs/pretrain/amp_fp16-to-fp32-at50/seed1/checkpoint", name
        assert hp["tags"] == {"schedule": name, **result["sweeps"][name]}, name
    pre = hps["pretrain-amp_fp16-to-fp32-at50-seed1"]
    assert (pre["precision"], pre["switch_to"], pre["switch_at"], pre["tags"]) == ("amp_fp16", "fp32", 0.5, {})


def test_config_keys_the_checks_read_and_let_through(audit4):
    """A hub data source for stage 1 alone needs the fetch (and a hub model's positions are its own, not
    model.max_position_embeddings); a switch_to the CPU cannot run is refused on device cpu like a first precision;
    an epochs stage has no step count to check timing_warmup_steps or switch_at against; only stage 2's batch must
    fit data.synthetic.n_train (stage 1 reads the synthetic corpus); steps and epochs both set,
    and a hub source named '', are refused naming their key."""
    assert audit4["hub_pretrain_data"]["ok"] and audit4["hub_pretrain_data"]["fetch"] is True
    hub = audit4["hub_model"]
    assert hub["ok"] and hub["fetch"] is True, hub
    assert audit4["cpu_switch_to_tf32"]["error"].startswith(
        "config key schedules.x.pretrain: tf32 cannot run on a CPU (device is cpu): tf32 needs cuda")
    epochs = audit4["epochs_stage"]
    assert epochs["ok"], epochs
    pre = epochs["hparams"]["pretrain-amp_fp16-to-fp32-at0.1-seed1"]
    assert (pre["epochs"], pre["steps"], pre["timing_warmup_steps"], pre["switch_at"]) == (1.5, None, 50, 0.001)
    rows = audit4["synthetic_rows"]
    assert rows["ok"] and {hp["batch_size"] for hp in rows["hparams"].values() if hp["stage"] == "pretrain"} == {32}
    assert audit4["steps_and_epochs"]["error"] == ("config key train.pretrain: set exactly one of steps and epochs "
                                                   "(the other null); got steps=10, epochs=1")
    assert audit4["hub_without_name"]["error"].startswith("config key data.finetune.name: required for kind hub")


def test_on_unsupported_is_read_from_its_stages_key(audit4):
    """device cpu refuses a precision the CPU cannot run unless that stage's on_unsupported is skip (stage 1's does
    not cover stage 2), and the message names the stage's key."""
    assert audit4["cpu_tf32_finetune_skipped"]["ok"], audit4["cpu_tf32_finetune_skipped"]
    assert audit4["cpu_tf32_finetune_skipped"]["hparams"]["finetune-x-seed1"]["on_unsupported"] == "skip"
    assert audit4["cpu_tf32_finetune_pretrain_skipped"]["error"] == (
        "config key schedules.x.finetune: tf32 cannot run on a CPU (device is cpu): tf32 needs cuda; set device: cuda "
        "on a GPU machine, or train.finetune.on_unsupported: skip to record such runs as skipped")


@pytest.mark.parametrize("train, key", [
    ({"compile": "default", "telemetry_every": 5}, "train.pretrain.compile"),
    ({"steps": 10, "epochs": 1}, "train.pretrain"),
])
def test_a_rule_of_the_config_and_of_the_hparams_is_one_check(train, key):
    """A cross-key rule a study config and `precswitch train --hparams` share is one function of
    precswitch.train.config: the workflow names the config key, resolve the hparams, with the same problem."""
    with pytest.raises(study.ConfigError) as config_error:
        study.check({"train": {"pretrain": train}})
    assert config_error.value.key == key
    problem = str(config_error.value).split(": ", 1)[1]
    with pytest.raises(PrecswitchError) as hparams_error:
        C.resolve({"data": "d", **train})
    assert str(hparams_error.value).endswith(problem)
