"""Stage hyper-parameters (precswitch.train.config): every bad value is refused by ``resolve`` with a message
naming its key, before anything is built or trained; the config hash follows what changes the numbers.
No data, model or training: each check is ``resolve`` on a dict."""

from __future__ import annotations

import json
import re

import pytest
import torch

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
    ({"epochs": 2}, r"set exactly one of 'steps' or 'epochs'"),
    ({"steps": None}, r"set exactly one of 'steps' or 'epochs'"),
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
                    "switch_at": 1, "precision": "amp_fp16", "steps": 4.0, "stage": "finetune"})
    assert hp["max_nonfinite_fraction"] == 1 and hp["warmup_ratio"] == 0 and hp["switch_at"] == 1
    assert hp["steps"] == 4 and isinstance(hp["steps"], int)
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
    assert C.resolve({**BASE, "init": "some/ckpt"})["model"] == {"attn_implementation": "eager"}
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


def test_a_command_module_missing_a_dependency_is_an_error_not_a_missing_command(monkeypatch):
    """Only a command module that does not exist is left out of `precswitch --help`; one that exists but cannot
    import a library it needs raises (the command silently vanishing would hide the broken install)."""
    import importlib

    from precswitch import cli

    real = importlib.import_module

    def fake(name, *a):
        if name == "precswitch.warm":
            raise ModuleNotFoundError("No module named 'nosuchlib'", name="nosuchlib")
        if name == "precswitch.fetch":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *a)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(ModuleNotFoundError, match="nosuchlib"):
        cli.build_parser()
    monkeypatch.setattr(cli, "COMMAND_MODULES", tuple(m for m in cli.COMMAND_MODULES if m != "precswitch.warm"))
    help_text = cli.build_parser().format_help()
    assert "train" in help_text and "fetch" not in help_text


def test_main_returns_the_warm_servers_exit_status(monkeypatch):
    """With no argv (the console script), a command the warm-start server ran exits with its child's status."""
    import sys

    from precswitch import cli, warm

    monkeypatch.setattr(warm, "delegate", lambda argv: 75 if argv == ["train", "x"] else None)
    monkeypatch.setattr(sys, "argv", ["precswitch", "train", "x"])
    assert cli.main() == 75
