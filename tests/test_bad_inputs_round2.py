"""Issue 31, bad input round 2, one test (or more) per class of what fell short:
1. accepted by the config check, refused after stage 1 trained (a whole-number float for an integer key);
2. a crash instead of a message (a name YAML reads as a bool/null/number, a results_dir that cannot be written,
   a full disk at the end of a stage);
3. silently accepted (a key written twice, a stage shorter than its timing warm-up, rows dropped by prepare);
4. collateral damage (a refused trainer truncating the running one's log, a failed prepare rerun losing the
   prepared data, a kill command matching every study);
5. not one line (Snakemake's frames around a config refusal).
The catalog of 60 bad inputs (benchmarks/bad_inputs.py) runs here too. docs/errors.md lists each refusal."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).parent))

import bad_inputs as B  # noqa: E402

from precswitch import study  # noqa: E402
from precswitch.errors import PrecswitchError  # noqa: E402
from precswitch.train import config as C  # noqa: E402

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
TINY = {"max_position_embeddings": 64, "hidden_size": 32, "intermediate_size": 64}


# ------------------------------------------------------------------------------------ the catalog
@pytest.mark.parametrize("case, text, names", B.CONFIGS, ids=[c[0] for c in B.CONFIGS])
def test_each_bad_config_is_refused_in_one_line_naming_the_key(case, text, names, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert B.verdict(B.run_config(text, tmp_path), names) is None


@pytest.mark.parametrize("case, files, text, names", B.DATA, ids=[c[0] for c in B.DATA])
def test_each_bad_data_file_is_refused_before_training_in_one_line_naming_it(case, files, text, names, tmp_path,
                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert B.verdict(B.run_data(files, text, tmp_path), names) is None


def test_the_catalog_holds_at_least_40_new_bad_inputs():
    assert len(B.CONFIGS) + len(B.DATA) >= 40 and len(B.DATA) >= 15


# ------------------------------------------------------------------ 1. one rule for integer keys
def _integer_keys(node, path=()):
    """Every key of the schema whose type is integer (not number), as a path of keys."""
    types = node.get("type")
    types = [types] if isinstance(types, str) else (types or [])
    if "integer" in types and path:
        yield path
    for k, sub in (node.get("properties") or {}).items():
        yield from _integer_keys(sub, path + (k,))


def _nest(path, value):
    for k in reversed(path):
        value = {k: value}
    return value


@pytest.mark.parametrize("path", list(_integer_keys(study.schema())), ids=".".join)
def test_every_integer_key_of_the_schema_refuses_a_whole_number_float_naming_it(path, tmp_path, monkeypatch):
    """JSON Schema counts 16.0 as an integer; the engine refused it after stage 1 trained. Now one rule: a float
    is refused at config time, naming the key (schedules' and sources' keys included: data.<stage> below)."""
    monkeypatch.chdir(tmp_path)
    default = study._schema_default(*path) if "default" in _node(path) else 1
    value = float(default if isinstance(default, int) and default > 0 else 4)
    with pytest.raises(study.ConfigError) as e:
        study.check(_nest(path, value))
    assert e.value.key == ".".join(path)
    assert str(int(value)) in str(e.value)


def _node(path):
    node = study.schema()
    for k in path:
        node = node["properties"][k]
    return node


def test_a_sources_integer_key_refuses_a_float_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for stage in study.STAGES:
        for key in ("max_train_rows", "max_eval_rows"):
            with pytest.raises(study.ConfigError) as e:
                study.check({"data": {stage: {"kind": "synthetic", key: 100.0}}})
            assert e.value.key == f"data.{stage}.{key}"


INT_HPARAMS = [k for k, v in C.DEFAULTS.items() if isinstance(v, int) and not isinstance(v, bool)] + ["steps"]


@pytest.mark.parametrize("key", INT_HPARAMS)
def test_every_integer_hparam_of_precswitch_train_refuses_a_whole_number_float(key):
    value = 4.0
    with pytest.raises(PrecswitchError, match=key):
        C.resolve({"data": "x", "steps": 4, key: value})


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                                 "max_position_embeddings"])
def test_every_integer_model_size_of_precswitch_train_refuses_a_float(key):
    with pytest.raises(PrecswitchError, match=f"model.{key}"):
        C.resolve({"data": "x", "steps": 4, "model": {key: 2.0}})


# ------------------------------------------------------------------ 2. a message, not a crash
@pytest.mark.parametrize("text, key", [
    ("schedules: {on: {finetune: fp32}}", "schedules.True"),
    ("schedules: {null: {finetune: fp32}}", "schedules.None"),
    ("schedules: {2024: {finetune: fp32}}", "schedules.2024"),
    ("sweeps: {no: {}}", "sweeps.False"),
    ("data: {finetune: {kind: tsv, columns: {1: a}}}", "data.finetune.columns.1"),
])
def test_a_name_yaml_reads_as_a_bool_null_or_number_is_named(text, key, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(study.ConfigError) as e:
        study.check(yaml.safe_load(text))
    assert e.value.key == key and "quote" in str(e.value)


def test_a_results_dir_that_cannot_be_created_or_written_is_named(tmp_path, monkeypatch):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    for bad in ("/proc/precswitch-results", str(a_file / "results")):
        with pytest.raises(study.ConfigError) as e:
            study.check_results_dir(bad)
        assert e.value.key == "results_dir"
    # a read-only mount (root can write any folder, so the file system's answer is simulated)
    import tempfile

    def read_only(*a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    for where in (tmp_path / "new", tmp_path):
        with pytest.raises(study.ConfigError, match="Read-only file system") as e:
            study.check_results_dir(str(where))
        assert e.value.key == "results_dir"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from engine_fixtures import make_prepared

    return make_prepared(tmp_path_factory.mktemp("data"), "mlm", n_train=64)


# ------------------------------------------------------------------ 3. said, not silently accepted
def test_a_key_written_twice_is_named_with_its_file_and_lines(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("seeds: [1]\ntrain:\n  finetune:\n    batch_size: 16\n    lr: 1.0e-4\n    batch_size: 8\n")
    with pytest.raises(study.ConfigError) as e:
        study.check_config_files([f])
    assert e.value.key == "train.finetune.batch_size" and str(f) in str(e.value) and "4 and 6" in str(e.value)
    f.write_text("a: {b: 1}\nc: [{b: 1}, {b: 2}]\n")  # the same key in two mappings is no duplicate
    study.check_config_files([f])


def test_an_epochs_stage_shorter_than_its_timing_warm_up_is_warned_at_config_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = study.validate({"train": {"finetune": {"steps": None, "epochs": 0.05, "batch_size": 32}},
                          "data": {"synthetic": {"n_train": 300}}})
    notes = study.warmup_notes(cfg)
    assert len(notes) == 1 and "train.finetune" in notes[0] and "timing_warmup_steps 5" in notes[0]
    cfg["train"]["finetune"]["epochs"] = 2
    assert study.warmup_notes(cfg) == []


def test_a_stage_shorter_than_its_warm_up_is_recorded_and_in_the_verdicts_caveats(prepared, tmp_path, capfd):
    from precswitch.analysis import verdict
    from precswitch.analysis.stats import input_notes
    from precswitch.train import engine

    hp = {"data": str(prepared), "steps": 3, "seed": 1, "model": TINY, "threads": 1, "progress": False,
          "timing_warmup_steps": 5, "save_checkpoint": False}
    m = engine.run_stage(hp, tmp_path / "run")
    assert m["timing_warmup_short"] is True and m["timing_warmup_steps"] == 0
    assert "timing_warmup_steps 5" in capfd.readouterr().err  # the engine's log
    import pandas as pd

    runs = pd.DataFrame([{"run_id": "a", "stage": "finetune", "timing_warmup_short": True, "train_rows_dropped": 30,
                          "train_rows_read": 90},
                         {"run_id": "b", "stage": "finetune", "timing_warmup_short": False,
                          "train_rows_dropped": 30, "train_rows_read": 90}])
    notes = input_notes(runs)
    assert notes == {"short_warmup": ["a"], "rows_dropped": {"finetune": [30, 90]}}
    caveats = verdict._caveats(verdict._View({"input_notes": notes}))
    assert "timing_warmup_steps" in caveats and "`a`" in caveats and "30 of 90 finetune" in caveats


def test_rows_dropped_by_prepare_reach_the_console(tmp_path):
    meta = tmp_path / "finetune" / "prepared" / "meta.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"train_rows_dropped": 30, "train_rows_read": 90}))
    notes = study.prepared_notes([meta, tmp_path / "missing" / "meta.json"])
    assert len(notes) == 1 and "30 of 90" in notes[0] and "finetune" in notes[0]


# ------------------------------------------------------------------ 4. no collateral damage
def test_a_trainer_refused_by_the_run_lock_leaves_the_runs_log_as_it_was(prepared, tmp_path):
    from precswitch.train.engine import RUN_LOCK

    out, log = tmp_path / "run", tmp_path / "logs" / "run.log"
    out.mkdir()
    log.parent.mkdir()
    log.write_text("the running stage's log\n")
    fd = os.open(out / RUN_LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another process trains there
    try:
        hp = {"data": str(prepared), "steps": 2, "model": TINY, "threads": 1}
        r = subprocess.run([sys.executable, "-m", "precswitch.cli", "train", "--hparams", json.dumps(hp), "--out",
                            str(out), "--log", str(log)], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    finally:
        os.close(fd)
    assert r.returncode == 2 and "in use by another training process" in r.stderr
    assert log.read_text() == "the running stage's log\n"


def test_a_prepared_dataset_a_rerun_replaces_is_kept_as_runs_are(tmp_path):
    results = tmp_path / "results"
    prepared = results / "data" / "finetune" / "prepared"
    prepared.mkdir(parents=True)
    (prepared / "meta.json").write_text("{}")
    (prepared / "data.arrow").write_text("rows")
    kept = study.keep_previous_runs([(str(prepared / "meta.json"), [])], str(results), str(results / "previous"))
    assert kept == ["data/finetune/prepared"]
    assert (results / "previous" / "data" / "finetune" / "prepared" / "data.arrow").read_text() == "rows"


def test_a_prepare_rerun_keeps_the_previous_prepared_data_under_previous(tmp_path):
    """Through the workflow (--touch runs onstart as a real run does, without training): a changed prepare param
    reruns prepare, which Snakemake starts by deleting its output directory; the previous one is kept first."""
    from test_workflow import _touch_study
    from workflow_helpers import snakemake, write_config

    cfg = {"schedules": {"y": {"finetune": "fp32"}}, "analysis": {"baseline": "y", "contrasts": []}, "seeds": [1],
           "results_dir": "res"}
    _touch_study(tmp_path, cfg)
    prepared = tmp_path / "res" / "data" / "finetune" / "prepared"
    (prepared / "meta.json").write_text('{"n_train": 3}')
    (prepared / "data.arrow").write_text("rows")
    for f in (tmp_path / "res").rglob("*"):
        os.utime(f, (1.7e9, 1.7e9))
    changed = write_config(tmp_path / "changed.yaml", {**cfg, "train": {"finetune": {"max_length": 24}}})
    snakemake(tmp_path, "--touch", "-c1", "--configfile", changed, check=True)
    kept = tmp_path / "res" / "previous" / "data" / "finetune" / "prepared"
    assert (kept / "data.arrow").read_text() == "rows" and (kept / "meta.json").read_text() == '{"n_train": 3}'


def test_the_readmes_kill_command_matches_one_studys_training_only():
    readme = (ROOT / "README.md").read_text()
    kills = [line for line in readme.splitlines() if "pkill -f" in line]
    assert kills and all("--out" in line or "would stop every" in line for line in kills)


# ------------------------------------------------------------------ 5. one line
@pytest.mark.parametrize("text, key", [
    ("train: {finetune: {batch_size: 16.0}}", "train.finetune.batch_size"),
    ("schedules: {on: {finetune: fp32}}", "schedules.True"),
    ("seeds: [1]\nseeds: [2]", "seeds"),
    ("schedules: {x: {finetune: fp64}}", "schedules.x.finetune"),
    ("results_dir: /proc/precswitch-results", "results_dir"),
])
def test_a_config_refusal_through_snakemake_is_the_line_alone(text, key, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text + "\n")
    r = subprocess.run([SNAKEMAKE, "-n", "--cores", "1", "-s", str(ROOT / "Snakefile"), "--directory", str(ROOT),
                        "--configfile", str(cfg)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert r.returncode == 1
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert [line for line in lines if line.startswith("Error: ")] == [
        next(line for line in lines if line.startswith(f"Error: config key {key}:"))]
    assert not any("Traceback" in line or 'File "' in line or "WorkflowError" in line for line in lines), r.stderr
    assert "Job stats" not in r.stdout + r.stderr
