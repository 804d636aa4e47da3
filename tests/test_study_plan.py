"""What a checked study runs (precswitch.study.plan), what each of its jobs gets (study.hparams and the data
jobs' options), how its stages' runs are named (precswitch.specs, precswitch.sweeps), what it says on the
console, and the finished runs a rerun keeps. Functions on dicts: no Snakemake run."""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from workflow_helpers import ROOT, snakemake, write_config

from precswitch import study
from precswitch.analysis.aggregate import spec_name as table_spec_name
from precswitch.errors import PrecswitchError
from precswitch.specs import overrides_suffix, run_spec, spec_name, stage_spec
from precswitch.sweeps import expand, point_name, point_stages

SWITCH = {"precision": "amp_fp16", "switch_to": "fp32"}
ONE = {"seeds": [1], "analysis": {"baseline": "x", "contrasts": []}}


def _jobs(cfg: dict) -> dict:
    """The plan of a config and the hparams of every training job by run id, with common.smk's paths."""
    p = study.plan(study.validate(copy.deepcopy(cfg)))
    hps = {}
    for seed in p.seeds:
        runs = [("pretrain", run, p.config["model"]["init"]) for run in p.stage1]
        runs += [("finetune", name, p.config["model"]["init"] if p.stage1_of(name) is None
                  else f"results/runs/pretrain/{p.stage1_of(name)}/seed{seed}/checkpoint") for name in p.schedules]
        for stage, name, init in runs:
            hp = study.hparams(p, stage, name, str(seed), data=f"results/data/{stage}/prepared",
                               tokenizer="results/data/pretrain/tokenizer", init=init)
            hps[hp["run_id"]] = json.loads(json.dumps(hp))  # as the job's command line carries it
    return {"plan": p, "hparams": hps}


PRETRAIN = {"steps": 40, "batch_size": 8, "eval_batch_size": 16, "lr": 0.002, "warmup_ratio": 0.2,
            "weight_decay": 0.05, "adam_eps": 1e-7, "adam_beta1": 0.8, "adam_beta2": 0.95, "max_grad_norm": 0.5,
            "max_length": 96, "mlm_probability": 0.2, "eval_precision": "fp32", "max_nonfinite": 3,
            "max_nonfinite_fraction": 0.5, "timing_warmup_steps": 2, "log_every": 4, "checkpoint_every_steps": 7,
            "checkpoint_every_minutes": 3, "save_checkpoint": False, "telemetry_every": 5, "on_unsupported": "skip"}
FINETUNE = {"steps": None, "epochs": 2, "batch_size": 4, "lr": 5e-5, "max_grad_norm": 0, "max_length": 48,
            "mlm_probability": 0.3, "eval_precision": "amp_bf16", "max_nonfinite_fraction": 1,
            "compile": "reduce-overhead"}


def test_every_stage_key_reaches_its_stages_jobs_and_only_theirs():
    """max_length is the prepare job's; mlm_probability stage 1's; save_checkpoint always on for stage 1."""
    hps = _jobs({"train": {"pretrain": PRETRAIN, "finetune": FINETUNE}, "device": "cuda", "threads": 3,
                 "seeds": [7], "model": {"max_position_embeddings": 128}})["hparams"]
    assert len(hps) == 8  # 3 stage-1 runs, 5 schedules (the positive control scratch-fp32 among them)
    for run_id, hp in hps.items():
        given = PRETRAIN if hp["stage"] == "pretrain" else FINETUNE
        expected = {k: v for k, v in given.items() if k not in ("max_length", "mlm_probability", "save_checkpoint")}
        assert {k: hp[k] for k in expected} == expected, run_id
        assert hp["save_checkpoint"] is (True if hp["stage"] == "pretrain" else False)
        assert "max_length" not in hp and ("mlm_probability" in hp) == (hp["stage"] == "pretrain"), run_id
        assert (hp["seed"], hp["device"], hp["threads"]) == (7, "cuda", 3)
    assert hps["pretrain-amp_bf16-seed7"]["model"]["max_position_embeddings"] == 128


def test_stage_overrides_make_a_run_of_their_own_shared_by_equal_overrides():
    cfg = {"schedules": {
        "x": {"pretrain": "pure_fp16", "finetune": "fp32"},
        "e1": {"pretrain": {"precision": "pure_fp16", "overrides": {"adam_eps": 1e-4}}, "finetune": "fp32"},
        "e2": {"pretrain": {"precision": "pure_fp16", "overrides": {"adam_eps": 1.0e-4}},
               "finetune": {"precision": "fp32", "overrides": {"lr": 1e-4}}},
        "s": {"pretrain": {**SWITCH, "switch_at": 1, "overrides": {"lr": 0.002}}, "finetune": "fp32"}},
        "device": "cuda", **ONE}
    result = _jobs(cfg)
    assert sorted(result["plan"].stage1) == ["amp_fp16-with-lr0.002", "pure_fp16", "pure_fp16-with-adam_eps0.0001"]
    hps = result["hparams"]
    plain, tuned = hps["pretrain-pure_fp16-seed1"], hps["pretrain-pure_fp16-with-adam_eps0.0001-seed1"]
    assert (plain["adam_eps"], tuned["adam_eps"], tuned["tags"]) == (1e-6, 1e-4, {"overrides": {"adam_eps": 1e-4}})
    assert {k for k in plain if plain[k] != tuned[k]} == {"adam_eps", "tags", "run_id"}
    assert hps["finetune-e2-seed1"]["init"].endswith("/pure_fp16-with-adam_eps0.0001/seed1/checkpoint")
    assert (hps["finetune-e2-seed1"]["lr"], hps["finetune-e1-seed1"]["lr"]) == (1e-4, 1e-3)
    assert "switch_to" not in hps["pretrain-amp_fp16-with-lr0.002-seed1"]  # a switch at 1 is no switch


def test_the_pure_fp16_eps_study_differs_in_the_eps_alone():
    hps = _jobs(yaml.safe_load((ROOT / "config" / "pure-fp16-eps.yaml").read_text()))["hparams"]
    plain, tuned = hps["pretrain-pure_fp16-seed1"], hps["pretrain-pure_fp16-with-adam_eps0.0001-seed1"]
    assert (plain["adam_eps"], tuned["adam_eps"]) == (1e-8, 1e-4)
    assert {k for k in plain.keys() | tuned.keys() if plain.get(k) != tuned.get(k)} == {"adam_eps", "run_id", "tags"}


def test_a_sweep_point_runs_its_stages_and_shares_the_sweeps_stage_1():
    cfg = {"schedules": {"x": {"pretrain": "fp32", "finetune": "fp32"}},
           "sweeps": {"s": {"pretrain": {**SWITCH, "switch_at": 0.5},
                            "finetune": {"precision": "amp_bf16", "switch_to": "fp32"}, "switch_at": [0, 0.29, 1]}},
           **ONE}
    result = _jobs(cfg)
    assert result["plan"].sweeps["s-at29"] == {"sweep": "s", "sweep_at": 0.29, "sweep_stage": "finetune"}
    assert sorted(result["plan"].stage1) == ["amp_fp16-to-fp32-at50", "fp32"]
    for name, first in (("s-at0", ("fp32", None)), ("s-at29", ("amp_bf16", "fp32")), ("s-at100", ("amp_bf16", None))):
        hp = result["hparams"][f"finetune-{name}-seed1"]
        assert (hp["precision"], hp.get("switch_to")) == first and hp["tags"]["sweep"] == "s"
        assert hp["init"] == "results/runs/pretrain/amp_fp16-to-fp32-at50/seed1/checkpoint"


def test_switch_points_that_round_to_one_run_name_are_refused_and_those_apart_are_two_runs():
    def two(a, b):
        return {"schedules": {"a": {"pretrain": {**SWITCH, "switch_at": a}, "finetune": "fp32"},
                              "b": {"pretrain": {**SWITCH, "switch_at": b}, "finetune": "fp32"}},
                "analysis": {"baseline": "a", "contrasts": []}, "seeds": [1]}

    with pytest.raises(study.ConfigError) as e:
        study.check(two(0.1234561, 0.1234564))
    assert e.value.key == "schedules.b.pretrain"
    assert sorted(_jobs(two(0.125, 0.1234))["plan"].stage1) == ["amp_fp16-to-fp32-at12.34", "amp_fp16-to-fp32-at12.5"]


def test_what_the_checks_let_through(tmp_path, monkeypatch):
    """An epochs stage has no step count to check switch_at or timing_warmup_steps against; a hub model's positions
    are its own; a local model.init under ~ bounds max_length by its config.json; on_unsupported: skip is the
    refused stage's own; YAML's compile false is off; the tokenizer options follow the model."""
    init = tmp_path / "init"
    init.mkdir()
    (init / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": 64}))
    (init / "model.safetensors").write_bytes(b"")
    monkeypatch.setenv("HOME", str(tmp_path))
    epochs = _jobs({"schedules": {"x": {"pretrain": {**SWITCH, "switch_at": 0.001}, "finetune": "fp32"}}, **ONE,
                    "train": {"pretrain": {"steps": None, "epochs": 1.5, "timing_warmup_steps": 50}}})
    assert epochs["hparams"]["pretrain-amp_fp16-to-fp32-at0.1-seed1"]["switch_at"] == 0.001
    hub = _jobs({"model": {"init": "acme/tiny-bert"}, "train": {"pretrain": {"max_length": 512}}, "seeds": [1]})
    assert study.fetch_needed(hub["plan"].config) and study.tokenizer_options(hub["plan"].config) == \
        "--pretrained acme/tiny-bert"
    with pytest.raises(study.ConfigError) as e:
        study.check({"model": {"init": "~/init"}, "train": {"finetune": {"max_length": 128}}})
    assert e.value.key == "train.finetune.max_length"
    skipped = _jobs({"device": "cpu", "schedules": {"x": {"finetune": "tf32"}}, **ONE,
                     "train": {"finetune": {"on_unsupported": "skip"}}})
    assert skipped["hparams"]["finetune-x-seed1"]["on_unsupported"] == "skip"
    off = _jobs({"train": {"pretrain": {"compile": False}}, "tokenizer": {"vocab_size": 5000, "cased": True},
                 "model": {"max_position_embeddings": 96}, "seeds": [1]})["plan"].config
    assert off["train"]["pretrain"]["compile"] == "off"
    assert study.tokenizer_options(off) == "--vocab-size 5000 --model-max-length 96 --cased"


def test_planning_leaves_the_config_as_given():
    cfg = study.validate({"sweeps": {"s": {"finetune": {"precision": "amp_bf16", "switch_to": "fp32"},
                                           "switch_at": [0.5]}}, "train": {"pretrain": {"compile": False}}})
    before = copy.deepcopy(cfg)
    p = study.plan(cfg)
    assert cfg == before and "s-at50" in p.config["schedules"]


# ------------------------------------------------------------------------------------ run names and sweeps
@pytest.mark.parametrize("value, name", [
    ("fp32", "fp32"),
    ({"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 0.8}, "amp_fp16-to-fp32-at80"),
    ({"precision": "amp_bf16", "switch_to": "fp32", "switch_at": 0.125}, "amp_bf16-to-fp32-at12.5"),
    ({"precision": "pure_bf16", "overrides": {"lr": 2e-5, "adam_eps": 1e-6}}, "pure_bf16-with-adam_eps1e-06-lr2e-05"),
    ({"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 0.5, "overrides": {"max_grad_norm": 0}},
     "amp_fp16-to-fp32-at50-with-max_grad_norm0.0"),
])
def test_a_run_is_named_by_its_precisions_and_overrides_as_the_tables_name_it(value, name):
    spec = stage_spec(value)
    assert spec_name(spec) == name
    assert table_spec_name(spec["precision"], spec["switch_to"], spec["switch_at"], spec["overrides"]) == name


def test_names_of_runs_and_sweep_points():
    """repr of an override: close values stay apart, equal ones written two ways are one name; a switch at 1 is the
    run without a switch; a point is named by its percent to 6 significant digits, as a switched run is."""
    assert overrides_suffix({"lr": 1.0000001e-4}) != overrides_suffix({"lr": 1.0000002e-4})
    assert overrides_suffix({"lr": 1e-4}) == overrides_suffix({"lr": 1.0e-4}) == "-with-lr0.0001"
    assert overrides_suffix({"max_grad_norm": 0}) == overrides_suffix({"max_grad_norm": 0.0})
    assert run_spec({**SWITCH, "switch_at": 1}) == stage_spec("amp_fp16")
    nan = float("nan")
    assert table_spec_name("amp_fp16", nan, nan) == "amp_fp16" and table_spec_name(None, None, None) is None
    names = {0: "s-at0", 1: "s-at100", 0.29: "s-at29", 0.125: "s-at12.5", 1 / 3: "s-at33.3333",
             0.1234561: "s-at12.3456", 0.0000123456789: "s-at0.001235"}
    assert {f: point_name("s", f) for f in names} == names
    for f in names:
        assert point_name("s", f).removeprefix("s-at") == table_spec_name("a", "b", f).removeprefix("a-to-b-at")


def test_each_sweep_point_runs_the_swept_stage_by_its_fraction_with_its_overrides():
    pre = {**SWITCH, "switch_at": 0.5}
    sweep = {"pretrain": pre, "finetune": {"precision": "amp_bf16", "switch_to": "fp32", "overrides": {"lr": 1e-4}},
             "switch_at": [0, 0.25, 1]}
    points = expand({"s": sweep})
    assert list(points) == ["s-at0", "s-at25", "s-at100"] and all(p["pretrain"] == pre for p in points.values())
    assert [spec_name(run_spec(p["finetune"])) for p in points.values()] == [
        "fp32-with-lr0.0001", "amp_bf16-to-fp32-at25-with-lr0.0001", "amp_bf16-with-lr0.0001"]
    assert point_stages({"finetune": SWITCH, "switch_at": [0.5]}, "finetune", 0.5) == \
        {"finetune": {**SWITCH, "switch_at": 0.5}}


@pytest.mark.parametrize("sweeps, schedules, key", [
    ({"s": {"finetune": "fp32", "switch_at": [0.5]}}, None, "sweeps.s"),
    ({"s": {"pretrain": dict(SWITCH), "finetune": dict(SWITCH), "switch_at": [0.5]}}, None, "sweeps.s"),
    ({"s": {"finetune": dict(SWITCH), "switch_at": [0.5, 0.1234561, 0.1234564]}}, None, "sweeps.s.switch_at[2]"),
    ({"s": {"finetune": dict(SWITCH), "switch_at": [0.5]}}, {"s-at50": {"finetune": "fp32"}}, "sweeps.s"),
])
def test_a_sweep_the_workflow_cannot_run_is_refused_naming_its_key(sweeps, schedules, key):
    with pytest.raises(PrecswitchError) as e:
        expand(sweeps, schedules)
    assert str(e.value).startswith(f"config key {key}:")


# --------------------------------------------------------------------------------------- console and GPU
def test_console_notes_say_what_a_log_alone_would_hide(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = study.validate({"train": {"finetune": {"steps": None, "epochs": 0.05, "batch_size": 32}},
                          "data": {"synthetic": {"n_train": 300}}})
    assert len(study.warmup_notes(cfg)) == 1 and "train.finetune" in study.warmup_notes(cfg)[0]
    cfg["train"]["finetune"]["epochs"] = 2
    assert study.warmup_notes(cfg) == []
    meta = tmp_path / "finetune" / "prepared" / "meta.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"train_rows_dropped": 30, "train_rows_read": 90}))
    notes = study.prepared_notes([meta, tmp_path / "missing" / "meta.json"])
    assert len(notes) == 1 and "30 of 90" in notes[0]
    assert study.threads_note(4, 2) and study.threads_note(2, 2) is None and study.threads_note(4, None) is None
    assert "2 GPU(s) found" in study.gpu_limit_line(2, 2)


def test_a_cpu_study_says_no_gpu_limit(tmp_path):
    """Issue 42: a CPU study said `gpu limit 1` on a machine without a GPU (--touch runs onstart as a run does)."""
    path = write_config(tmp_path / "study.yaml", {"schedules": {"y": {"finetune": "fp32"}}, "seeds": [1],
                                                  "analysis": {"baseline": "y", "contrasts": []}, "device": "cpu"})
    r = snakemake(tmp_path, "--touch", "-c1", "--configfile", path, check=True)
    assert "gpu limit" not in r.stdout + r.stderr


def test_gpu_checks_before_any_job_name_the_key(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = {"schedules": {"x": {"pretrain": "fp32", "finetune": "fp32"}, "t": {"pretrain": "tf32", "finetune": "fp32"}},
           "analysis": {"baseline": "x", "contrasts": []}, "seeds": [1]}
    cuda = study.plan(study.validate({**copy.deepcopy(cfg), "device": "cuda"}))
    with pytest.raises(study.ConfigError) as e:
        study.check_gpu(cuda, [("pretrain", "fp32"), ("finetune", "x")], None)
    assert e.value.key == "device" and "2 training jobs" in str(e.value)
    auto = study.plan(study.validate({**copy.deepcopy(cfg), "device": "auto"}))
    assert study.check_gpu(auto, [("pretrain", "fp32"), ("finetune", "t")], None) is None
    with pytest.raises(study.ConfigError) as e:
        study.check_gpu(auto, [("pretrain", "tf32")], None)
    assert e.value.key == "schedules.t.pretrain"
    assert study.check_gpu(cuda, [], None) is None


# ------------------------------------------------------------------------------------------ previous runs
def test_keep_previous_runs_keeps_finished_runs_and_prepared_data_with_their_logs(tmp_path):
    res = tmp_path / "res"
    done, unfinished = res / "runs" / "finetune" / "x" / "seed1", res / "runs" / "finetune" / "x" / "seed2"
    for run in (done, unfinished):
        (run / "resume").mkdir(parents=True)
    (done / "metrics.json").write_text('{"run": 1}')
    log = res / "logs" / "finetune" / "x" / "seed1.log"
    log.parent.mkdir(parents=True)
    log.write_text("log 1")
    prepared = res / "data" / "finetune" / "prepared"
    prepared.mkdir(parents=True)
    (prepared / "meta.json").write_text("{}")
    runs = [(str(done / "metrics.json"), [str(log)]), (str(unfinished / "metrics.json"), []),
            (str(prepared / "meta.json"), [])]
    assert study.keep_previous_runs(runs, str(res), str(res / "previous")) == [
        "runs/finetune/x/seed1", "data/finetune/prepared"]
    prev = res / "previous" / "runs" / "finetune" / "x"
    assert sorted(p.name for p in (prev / "seed1").iterdir()) == ["metrics.json", "seed1.log"]
    assert not (prev / "seed2").exists()
    (done / "metrics.json").write_text('{"run": 2}')
    study.keep_previous_runs(runs, str(res), str(res / "previous"))
    assert (prev / "seed1" / "metrics.json").read_text() == '{"run": 2}'  # the latest previous version
