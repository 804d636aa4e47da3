"""Faults around a study's runs (a full disk: tests/test_engine_faults.py): a stage shorter than its timing warm-up, a second trainer on a
running stage, a rerun that fails, a precision the device cannot run, data refused by prepare. Each is one line
naming the file, key or precision, and nothing finished is lost."""

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

from precswitch.errors import PrecswitchError

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
TINY = {"max_position_embeddings": 64, "hidden_size": 32, "intermediate_size": 64}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from engine_fixtures import make_prepared

    return make_prepared(tmp_path_factory.mktemp("data"), "mlm", n_train=64)


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


def test_tf32_on_cpu_through_the_cli_names_precision_and_device(tmp_path):
    from engine_fixtures import make_prepared

    data = make_prepared(tmp_path, "mlm")
    out = tmp_path / "out"
    hp = {"data": str(data), "precision": "tf32", "steps": 1, "device": "cpu"}
    r = subprocess.run([sys.executable, "-m", "precswitch.cli", "train", "--hparams", json.dumps(hp), "--out",
                        str(out)], capture_output=True, text=True, timeout=180)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]  # one line, no traceback wall
    assert "'tf32'" in r.stderr and "'cpu'" in r.stderr and "Ampere" in r.stderr
    assert not (out / "metrics.json").exists()


def test_an_unusable_finetuning_table_stops_the_study_before_stage_1_trains(tmp_path):
    """A one-class training table passes the config check (it reads headers only) and is refused by
    `prepare`. With --cores equal to threads (the README's advice for timing) every stage-1 job, priority 1,
    used to train before the fine-tuning data was prepared: the error came after all of stage 1. `prepare`
    now runs first (priority 2)."""
    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    train.write_text("a\tb\tlabel\n" + "".join(f"w{i} x\tw{i} y\t1\n" for i in range(40)))
    dev.write_text("a\tb\tlabel\n" + "".join(f"w{i} x\tw{i} y\t{i % 2}\n" for i in range(10)))
    extra = tmp_path / "one-class.yaml"
    extra.write_text(yaml.safe_dump({
        "results_dir": str(tmp_path / "results"), "seeds": [1], "threads": 1,
        "data": {"finetune": {"kind": "tsv", "train": str(train), "eval": str(dev),
                              "columns": {"text_a": "a", "text_b": "b", "label": "label"}}}}))
    r = subprocess.run([SNAKEMAKE, "--cores", "1", "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path),
                        "--configfile", str(ROOT / "tests" / "configs" / "tiny.yaml"), str(extra)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    log = (tmp_path / "results" / "logs" / "data" / "prepare-finetune.log").read_text()
    assert "one" in log.lower() and "class" in log.lower(), log[-2000:]
    # and on the console, not only in the log: the log's last line, the one-line error
    assert "precswitch: error:" in r.stderr and "at least 2 classes" in r.stderr, r.stderr[-2000:]
    assert not list((tmp_path / "results").glob("runs/pretrain/*/seed1/metrics.json"))  # no stage 1 trained
    assert "rule pretrain" not in r.stdout + r.stderr  # nor started
