"""Bad inputs the other test files do not reach: a malformed config file, and a precision the device
cannot run, given through the whole CLI. (The full catalog, with where each case is tested: docs/errors.md.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def test_malformed_yaml_config_is_refused_before_anything_runs(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("schedules:\n  x: {pretrain: fp32, finetune: fp32\nseeds: [1\n")
    r = subprocess.run([SNAKEMAKE, "-n", "-s", str(ROOT / "Snakefile"), "--directory", str(ROOT),
                        "--configfile", str(bad)], capture_output=True, text=True, timeout=180)
    err = r.stdout + r.stderr
    assert r.returncode != 0
    assert "not valid JSON or YAML" in err and "Traceback" not in err
    assert "Job stats" not in err


def test_tf32_on_cpu_through_the_cli_names_precision_and_device(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
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


import pytest  # noqa: E402


@pytest.mark.parametrize("key, value", [
    ("checkpoint_every_steps", "4"), ("checkpoint_every_steps", -1), ("checkpoint_every_minutes", -1),
    ("checkpoint_every_minutes", "10"), ("max_grad_norm", "1.0"), ("max_grad_norm", float("nan")),
    ("timing_warmup_steps", "5"), ("eval_seed", 1.5), ("deterministic", "yes"), ("save_checkpoint", "no"),
    ("progress", 1), ("tags", ["a"]),
])
def test_run_time_hparams_of_the_wrong_type_are_named_before_training(key, value):
    """Keys the loop reads only after its first step (checkpoint_every_steps, max_grad_norm) used to crash
    mid-stage with a TypeError; the others crashed in set-up with a traceback, or ('no') read as true."""
    from precswitch.errors import PrecswitchError
    from precswitch.train import config as C

    with pytest.raises(PrecswitchError, match=key):
        C.resolve({"data": "x", "steps": 1, key: value})
    assert C.resolve({"data": "x", "steps": 1, "max_grad_norm": 0, "checkpoint_every_minutes": 0.5})


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
