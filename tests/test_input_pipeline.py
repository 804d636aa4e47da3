"""Input pipeline: batches (order and masked-LM masks) are functions of (seed, step), so DataLoader
workers, resume and the precision's own RNG use never change them; workers survive a job-wide SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from engine_fixtures import make_prepared  # noqa: E402

from precswitch.errors import EXIT_PREEMPTED, PrecswitchError  # noqa: E402
from precswitch.train import config as C  # noqa: E402
from precswitch.train.engine import (  # noqa: E402
    Batches, _load_data, _load_tokenizer, _make_collator, _model_columns, data_workers, run_stage,
)

TINY = {"max_position_embeddings": 64, "hidden_size": 32, "intermediate_size": 64}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipe")
    return {"mlm": make_prepared(root, "mlm", n_train=100), "classify": make_prepared(root, "classify")}


def _batches(path: Path, objective: str, seed: int, bs: int = 16) -> Batches:
    hp = C.resolve({"data": str(path), "steps": 1, "objective": objective})
    train, _, meta = _load_data(hp)
    collate = _make_collator(objective, _load_tokenizer(hp, meta), 0.15)
    return Batches(_model_columns(train, objective), bs, seed, collate)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_batch_is_a_function_of_seed_and_step(data):
    b = _batches(data["mlm"], "mlm", seed=7)
    first = b.get(3)
    torch.rand(1000)  # the global RNG moves (dropout, other runs' masks) ...
    b.get(9)  # ... and the permutation cache moves to another epoch (100 rows / 16 = 6 steps per epoch)
    again = b.get(3)
    assert _same(first, again)  # ... the masks and order of step 3 stay
    assert (first["labels"] != -100).any()  # masked-LM labels exist
    assert not _same(first, b.get(4))
    assert not _same(first, _batches(data["mlm"], "mlm", seed=8).get(3))  # another seed masks otherwise


@pytest.mark.parametrize("objective", ["mlm", "classify"])
def test_worker_stream_equals_in_process_stream(data, objective):
    b = _batches(data[objective], objective, seed=2)
    start, stop = 2, 17  # crosses epoch boundaries; 15 steps over 2 workers: uneven split
    plain = list(b.stream(start, stop, workers=0))
    s = b.stream(start, stop, workers=2)
    pooled = list(s)
    s.close()
    assert [st for st, _ in plain] == [st for st, _ in pooled] == list(range(start, stop))
    assert all(_same(x, y) for (_, x), (_, y) in zip(plain, pooled))


def test_data_workers_resolution_and_validation(data):
    assert data_workers("auto", torch.device("cpu")) == 0
    assert data_workers("auto", torch.device("cuda")) == 2
    assert data_workers(3, torch.device("cpu")) == 3
    for bad in (-1, "two", 1.5, True):
        with pytest.raises(PrecswitchError, match="data_workers"):
            C.resolve({"data": str(data["mlm"]), "steps": 1, "data_workers": bad})
    # results do not depend on it: a resume state written with workers is valid without them
    base = {"data": "x", "steps": 1}
    assert C.config_hash(C.resolve({**base, "data_workers": 2})) == C.config_hash(C.resolve(base))


def test_training_with_workers_is_identical(data, tmp_path):
    hp = {"data": str(data["mlm"]), "precision": "amp_bf16", "steps": 14, "seed": 4, "model": TINY,
          "timing_warmup_steps": 2, "batch_size": 16}
    m0 = run_stage({**hp, "data_workers": 0}, tmp_path / "w0")
    m2 = run_stage({**hp, "data_workers": 2}, tmp_path / "w2")
    assert (m0["data_workers"], m2["data_workers"]) == (0, 2)
    for key in ("eval_loss", "mlm_accuracy", "final_train_loss", "grad_norm", "tokens_seen", "samples_seen"):
        assert m0[key] == m2[key], key
    losses = [(tmp_path / d / "steps.csv").read_text().splitlines() for d in ("w0", "w2")]
    assert [r.split(",")[:5] for r in losses[0]] == [r.split(",")[:5] for r in losses[1]]


def test_jobwide_sigterm_with_workers_saves_state_and_resumes(data, tmp_path):
    """A batch scheduler signals every process of the job: workers must not die before the trainer saves."""
    hp = {"data": str(data["mlm"]), "precision": "fp32", "steps": 400, "seed": 1, "model": TINY,
          "checkpoint_every_steps": 3, "data_workers": 2, "batch_size": 16}
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "precswitch.cli", "train", "--hparams", json.dumps(hp), "--out", str(out)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    t = time.time()
    while not (out / "resume" / "state.pt").exists():
        assert p.poll() is None, p.stderr.read()
        assert time.time() - t < 120
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGTERM)  # the trainer and its DataLoader workers
    assert p.wait(timeout=60) == EXIT_PREEMPTED, p.stderr.read()
    err = p.stderr.read()
    assert "preempted" in err and "DataLoader worker" not in err
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "metrics.json").read_text())
    assert m["resumed"] is True and m["steps_completed"] == 400
    ref = run_stage({**hp, "data_workers": 0, "checkpoint_every_steps": 0}, tmp_path / "ref")
    assert m["eval_loss"] == ref["eval_loss"] and m["final_train_loss"] == ref["final_train_loss"]
