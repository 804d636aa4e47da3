"""``precswitch train``'s hyper-parameters (precswitch.train.config): their defaults and bounds are the study
schema's (one declaration), a bad value is refused naming its key before anything is built, the cross-key rules
are the study's, the config hash follows what changes the numbers; and the train command line around them.
No data, model or training: each check is a function on a dict."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from precswitch import schema, study
from precswitch.cli import main
from precswitch.errors import PrecswitchError
from precswitch.train import config as C
from precswitch.train import engine

BASE = {"data": "d", "steps": 10}


def test_the_defaults_are_the_schemas_train_stage_defaults():
    """One value per setting: `precswitch train` fills train.<its stage>'s defaults, model's and threads'."""
    for stage in ("pretrain", "finetune"):
        hp = C.resolve({**BASE, "stage": stage})
        filled = study.validate({})
        assert {k: hp[k] for k in filled["train"][stage] if k not in ("max_length", "steps")} == \
            {k: v for k, v in filled["train"][stage].items() if k not in ("max_length", "steps")}
        assert {k: hp["model"][k] for k in filled["model"] if k not in ("init", "revision")} == \
            {k: v for k, v in filled["model"].items() if k not in ("init", "revision")}
        assert (hp["threads"], hp["device"]) == (filled["threads"], filled["device"])
    assert C.DEFAULTS["lr"] == schema.stage_defaults("pretrain")["lr"] != schema.stage_defaults("finetune")["lr"]


def test_a_partial_hparams_trains_the_run_the_study_would():
    """The same partial settings through `precswitch train` and through the study: the same resolved hparams
    (and config hash), the workflow's paths and names aside."""
    cfg = {"schedules": {"x": {"finetune": "amp_bf16"}}, "analysis": {"baseline": "x", "contrasts": []},
           "seeds": [3], "train": {"finetune": {"lr": 2.0e-4, "steps": 50}}}
    p = study.plan(study.validate(copy.deepcopy(cfg)))
    by_study = C.resolve(study.hparams(p, "finetune", "x", 3, data="d", tokenizer="t", init="scratch"))
    by_hand = C.resolve({"stage": "finetune", "objective": "classify", "precision": "amp_bf16", "seed": 3,
                         "data": "d", "tokenizer": "t", "lr": 2.0e-4, "steps": 50, "run_id": by_study["run_id"],
                         "tags": by_study["tags"]})
    assert by_hand == by_study and C.config_hash(by_hand) == C.config_hash(by_study)


@pytest.mark.parametrize("patch, key", [
    ({"lr": 0}, "lr"), ({"lr": float("inf")}, "lr"), ({"lr": "1e-3"}, "lr"), ({"weight_decay": -0.1}, "weight_decay"),
    ({"adam_eps": 0}, "adam_eps"), ({"adam_beta1": 1.5}, "adam_beta1"), ({"adam_beta2": 1.0}, "adam_beta2"),
    ({"warmup_ratio": 1}, "warmup_ratio"), ({"mlm_probability": 0}, "mlm_probability"),
    ({"batch_size": 8.0}, "batch_size"), ({"eval_batch_size": 0}, "eval_batch_size"), ({"threads": 0}, "threads"),
    ({"log_every": 0}, "log_every"), ({"max_nonfinite": True}, "max_nonfinite"),
    ({"max_nonfinite_fraction": 0}, "max_nonfinite_fraction"), ({"seed": 2**32}, "seed"), ({"seed": -1}, "seed"),
    ({"telemetry_every": 2.0}, "telemetry_every"), ({"timing_warmup_steps": -1}, "timing_warmup_steps"),
    ({"checkpoint_every_steps": "4"}, "checkpoint_every_steps"), ({"checkpoint_every_minutes": -1},
                                                                  "checkpoint_every_minutes"),
    ({"max_grad_norm": float("nan")}, "max_grad_norm"), ({"eval_seed": 1.5}, "eval_seed"),
    ({"deterministic": "yes"}, "deterministic"), ({"save_checkpoint": "no"}, "save_checkpoint"),
    ({"progress": 1}, "progress"), ({"tags": ["a"]}, "tags"), ({"objective": "seq2seq"}, "objective"),
    ({"optimizer_impl": "adamw"}, "optimizer_impl"), ({"on_unsupported": "ignore"}, "on_unsupported"),
    ({"eval_precision": "fp64"}, "eval_precision"), ({"compile": "max"}, "compile"), ({"precision": "fp64"}, "fp64"),
    ({"device": "tpu"}, "device"), ({"data": None}, "data"), ({"steps": 0}, "steps"), ({"steps": 2.5}, "steps"),
    ({"steps": float("nan")}, "steps"), ({"steps": None, "epochs": float("inf")}, "epochs"),
    ({"steps": None, "epochs": -1.5}, "epochs"), ({"init_revision": "  "}, "init_revision"),
    ({"init_revision": "v1"}, "init_revision"), ({"model": {"hidden_size": 0}}, "model.hidden_size"),
    ({"model": {"hidden_dropout_prob": 1.5}}, "model.hidden_dropout_prob"),
    ({"model": {"attn_implementation": "flash"}}, "model.attn_implementation"),
    ({"init": "ckpt", "model": {"attn_implementation": "flash"}}, "model.attn_implementation"),
    ({"model": {"hidden_sise": 64}}, "hidden_sise"), ({"model": {"revision": "v1"}}, "revision"),
    ({"model": {"hidden_size": 30, "num_attention_heads": 4}}, "model.hidden_size"), ({"bogus": 1}, "bogus"),
])
def test_a_bad_value_is_refused_naming_its_key(patch, key):
    with pytest.raises(PrecswitchError) as e:
        C.resolve({**BASE, "precision": "amp_fp16", **patch})
    assert str(e.value).startswith(key) or f" {key}" in str(e.value) or f"'{key}'" in str(e.value), str(e.value)


@pytest.mark.parametrize("patch, key", [
    ({"switch_at": 0.5}, ""), ({"switch_to": "fp32"}, ""),
    ({"switch_to": "fp32", "switch_at": 1.5}, "switch_at"), ({"switch_to": "fp32", "switch_at": True}, "switch_at"),
    ({"switch_to": "pure_fp16", "switch_at": 0.5}, "switch_to"), ({"switch_to": "fp32", "switch_at": 0.01}, "switch_at"),
    ({"compile": "default", "telemetry_every": 5}, "compile"), ({"steps": 10, "epochs": 1}, "steps"),
])
def test_a_cross_key_rule_is_the_studys_rule(patch, key):
    """precswitch.stage_rules and the schema's ranges: `precswitch train` refuses what the study refuses, naming
    the same key (a cross-key rule in the same words)."""
    with pytest.raises(PrecswitchError) as hparams_error:
        C.resolve({**BASE, "precision": "amp_fp16", **patch})
    assert str(hparams_error.value).startswith(key)
    stage = {"precision": "amp_fp16", **{k: v for k, v in patch.items() if k in ("switch_to", "switch_at")}}
    cfg = {"schedules": {"x": {"finetune": stage}}, "analysis": {"baseline": "x", "contrasts": []},
           "train": {"finetune": {"steps": 10, **{k: v for k, v in patch.items() if k not in stage}}}}
    with pytest.raises(study.ConfigError) as config_error:
        study.check(cfg)
    assert config_error.value.key == (f"schedules.x.finetune.{key}" if key in ("switch_to", "switch_at")
                                      else f"train.finetune.{key}" if key else "schedules.x.finetune")
    if patch.get("switch_at") not in (1.5, True):  # a cross-key rule, not the schema's range
        assert str(hparams_error.value).endswith(str(config_error.value).split(": ", 1)[1])


def test_boundary_values_are_accepted():
    hp = C.resolve({**BASE, "max_nonfinite_fraction": 1, "warmup_ratio": 0, "seed": 2**32 - 1, "switch_to": "fp32",
                    "switch_at": 1, "precision": "amp_fp16", "weight_decay": 0, "timing_warmup_steps": 0,
                    "eval_seed": 0, "adam_beta1": 0, "max_grad_norm": None, "compile": False,
                    "model": {"hidden_dropout_prob": 0, "vocab_size": 500, "layer_norm_eps": 1e-6}})
    assert (hp["switch_at"], hp["max_grad_norm"], hp["compile"], hp["model"]["vocab_size"]) == (1, None, "off", 500)
    assert C.resolve({"data": "d", "epochs": 0.5})["steps"] is None  # an epochs stage has no steps
    assert C.resolve({**BASE, "lr": None}) == C.resolve(BASE)  # null takes the default
    assert C.resolve({**BASE, "stage": "finetune"})["run_id"] == "finetune-fp32-seed0"
    assert C.resolve({**BASE, "init": "acme/tiny-bert", "init_revision": "v1"})["init_revision"] == "v1"


def test_a_checkpoint_init_records_only_the_attention_kernel_of_the_model_keys():
    hp = C.resolve({**BASE, "init": "runs/pretrain/fp32/seed1/checkpoint", "model": {"hidden_size": 64}})
    assert hp["model"] == {"attn_implementation": "auto"}


def test_the_config_hash_follows_every_key_that_changes_the_numbers():
    fixed = {**BASE, "run_id": "r"}
    h = C.config_hash(C.resolve(fixed))
    for change in ({"weight_decay": 0.1}, {"warmup_ratio": 0.2}, {"adam_eps": 1e-4}, {"adam_beta1": 0.8},
                   {"model": {"hidden_size": 96}}, {"model": {"attn_implementation": "sdpa"}}, {"data": "other"},
                   {"init": "some/checkpoint"}, {"objective": "classify"}, {"steps": None, "epochs": 10},
                   {"compile": "default"}, {"optimizer_impl": "foreach"}, {"tokenizer": "tok2"}, {"max_nonfinite": 3}):
        assert C.config_hash(C.resolve({**fixed, **change})) != h, change
    for same in ({"compile": "off"}, {"compile": False}, {"log_every": 3}, {"tags": {"a": 1}}):
        assert C.config_hash(C.resolve({**fixed, **same})) == h, same
    assert C.config_hash(C.resolve(dict(reversed(list(fixed.items()))))) == h


@pytest.mark.parametrize("spec", ["mps", "xla:0"])
def test_a_device_other_than_cpu_or_cuda_is_named(spec):
    with pytest.raises(PrecswitchError, match=f"device '{spec}'"):
        C.resolve_device(spec)


def test_cuda_on_a_machine_without_it_is_named_and_auto_is_the_gpu_where_there_is_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(PrecswitchError, match="device 'cuda:1'"):
        C.resolve_device("cuda:1")
    assert C.resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert C.resolve_device("auto") == torch.device("cuda")


# --------------------------------------------------------------------------------- the train command line
def test_set_overrides_parse_json_values_and_dotted_keys_keep_the_rest_of_a_mapping(monkeypatch, capsys):
    seen = {}
    m = {"run_id": "r", "status": "ok", "train_seconds": 1.5, "steps_per_second": 2.0, "eval_loss": 0.5,
         "accuracy": None, "mlm_accuracy": 0.25, "peak_memory_bytes": 7, "other": 1}
    monkeypatch.setattr(engine, "run_stage", lambda hp, out: seen.update(hp=hp) or m)
    base = '{"data": "d", "steps": 3, "lr": 0.1, "model": {"hidden_size": 32, "num_hidden_layers": 2}}'
    assert main(["train", "--hparams", base, "--out", "o", "--set", "steps=5", "--set", "tags={\"a\": [1]}",
                 "--set", "run_id= x=y ", "--set", "lr=1e-3", "--set", "lr=2e-3", "--set", "progress=false",
                 "--set", "model.hidden_size=64", "--set", "tags.sweep.at=0.5"]) == 0
    assert seen["hp"] == {"data": "d", "steps": 5, "lr": 2e-3, "tags": {"a": [1], "sweep": {"at": 0.5}},
                          "run_id": " x=y ", "progress": False, "model": {"hidden_size": 64, "num_hidden_layers": 2}}
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out) == {k: v for k, v in m.items() if k != "other"}


@pytest.mark.parametrize("argv, key", [
    (["--set", "steps"], "--set 'steps'"), (["--set", "steps.x=1"], "--set 'steps.x=1'"),
    (["--set", "lr=-1"], "lr"), (["--set", "stepz=3"], "stepz"), (["--set", "adam_beta2=1"], "adam_beta2"),
])
def test_a_bad_hparam_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, argv, key):
    out = tmp_path / "o"
    rc = main(["train", "--hparams", '{"data": "d", "steps": 3}', "--out", str(out), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("precswitch: error: ") and key in err[0], err
    assert not out.exists()


def test_exit_codes_are_the_documented_ones_and_an_unsupported_precision_is_a_user_error(monkeypatch, capsys):
    from precswitch.errors import EXIT_PREEMPTED, EXIT_USER_ERROR, PrecisionUnsupported

    assert (EXIT_USER_ERROR, EXIT_PREEMPTED) == (2, 75)

    def refuse(hp, out):
        raise PrecisionUnsupported("precision 'tf32' cannot run on device 'cpu'")

    monkeypatch.setattr(engine, "run_stage", refuse)
    assert main(["train", "--hparams", '{"data": "d", "steps": 3}', "--out", "o"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert main([]) == 2 and "usage: precswitch" in capsys.readouterr().out
