"""Preemption and resume: SIGTERM saves state (exit 75), so does Ctrl-C (exit 130); kill -9 loses at most the last interval; the
resumed run ends bitwise-identical to an uninterrupted one."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from engine_fixtures import make_prepared, preempted_then_resumed, steps_rows  # noqa: E402

from precswitch.errors import EXIT_PREEMPTED  # noqa: E402
from precswitch.train.engine import loop as engine_loop, state as engine_state  # noqa: E402

TINY = {"max_position_embeddings": 64, "hidden_size": 32, "intermediate_size": 64}
STEPS = 60  # the first state is saved at step 4: a window of 56 steps to stop the stage in


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    data = make_prepared(root, "mlm", n_train=256)
    hp = {"data": str(data), "precision": "amp_fp16", "steps": STEPS, "seed": 5, "model": TINY, "threads": 1,
          "checkpoint_every_steps": 4}
    ref = root / "reference"  # the uninterrupted run, in this process (a train job's run_stage, without its start-up)
    from precswitch.train.engine import run_stage

    assert run_stage(hp, ref)["status"] == "ok"
    return hp, ref


def _start(hp: dict, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "precswitch.cli", "train", "--hparams", json.dumps(hp), "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _rerun(hp: dict, out: Path) -> None:
    """The rerun of a stopped stage: `precswitch train` in this process (the resume a new job makes, without a
    second start-up of torch and transformers)."""
    from precswitch.cli import main as cli_main

    assert cli_main(["train", "--hparams", json.dumps(hp), "--out", str(out)]) == 0


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    t = time.time()
    while not path.exists():
        assert proc.poll() is None, f"finished before {path} appeared: {proc.stderr.read()}"
        assert time.time() - t < timeout, f"{path} never appeared"
        time.sleep(0.05)


def _same_result(a: Path, b: Path) -> None:
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (a, b))
    for key in ("eval_loss", "mlm_accuracy", "perplexity", "final_train_loss", "grad_norm", "loss_scale_end",
                "skipped_steps", "steps_completed"):
        assert ma[key] == mb[key], key
    la, lb = ([r.split(",")[:5] for r in (d / "steps.csv").read_text().splitlines()] for d in (a, b))
    assert la == lb  # every step's loss, lr, grad norm and loss scale
    fa, fb = (next((d / "checkpoint").glob("*.safetensors")).read_bytes() for d in (a, b))
    assert fa == fb


@pytest.mark.parametrize("sig, code, name", [(signal.SIGTERM, EXIT_PREEMPTED, "SIGTERM"),
                                             (signal.SIGINT, 130, "SIGINT (Ctrl-C)")])
def test_stop_signal_saves_state_and_rerun_resumes_identically(setup, tmp_path, sig, code, name):
    """SIGTERM (preemption, Snakemake's cancel) and SIGINT (Ctrl-C) both save the state; Ctrl-C used to end the
    stage with a KeyboardInterrupt traceback and everything since the last periodic save lost."""
    hp, ref = setup
    out = tmp_path / "run"
    p = _start(hp, out)
    _wait_for(out / "resume" / "state.pt", p)
    p.send_signal(sig)
    assert p.wait(timeout=60) == code
    err = p.stderr.read()
    assert f"preempted: {name} at step" in err and "Traceback" not in err, err
    assert (out / "resume" / "state.pt").is_file() and not (out / "metrics.json").exists()
    _rerun(hp, out)
    m = json.loads((out / "metrics.json").read_text())
    assert m["resumed"] is True and m["attempts"] == 2 and m["train_seconds"] > 0
    assert not (out / "resume").exists()  # cleaned up after success
    _same_result(ref, out)


def test_kill9_at_random_step_then_rerun_is_identical(setup, tmp_path):
    hp, ref = setup
    out = tmp_path / "run"
    p = _start(hp, out)
    _wait_for(out / "resume" / "state.pt", p)
    time.sleep(random.uniform(0.0, 0.5))
    p.kill()
    p.wait(timeout=30)
    assert not (out / "metrics.json").exists()
    _rerun(hp, out)
    m = json.loads((out / "metrics.json").read_text())
    assert m["resumed"] is True and m["attempts"] == 2
    _same_result(ref, out)


def test_resume_state_of_other_hparams_is_set_aside_and_the_stage_starts_over(setup, tmp_path, capsys):
    """A stage stopped, then rerun with other hyper-parameters (the study's config edited before the rerun, which
    Snakemake reruns the job for): its state cannot be resumed. The rerun used to stop with 'delete it to start
    over', and Snakemake with it, after the first such job; now the state is moved aside (kept, not deleted), the
    log says so, and the stage trains from step 0 under the new hyper-parameters."""
    hp, _ = setup
    out = tmp_path / "run"
    p = _start(hp, out)
    _wait_for(out / "resume" / "state.pt", p)
    p.kill()
    p.wait(timeout=30)
    old_state = (out / "resume" / "state.pt").read_bytes()
    capsys.readouterr()
    _rerun({**hp, "lr": 1e-3}, out)
    stale = list(out.glob("resume.stale-*"))
    assert len(stale) == 1 and (stale[0] / "state.pt").read_bytes() == old_state
    line = next(ln for ln in capsys.readouterr().err.splitlines() if "belongs to different hyper-parameters" in ln)
    assert f"moved to {str(stale[0])!r}; the stage starts over" in line, line
    m = json.loads((out / "metrics.json").read_text())
    assert m["resumed"] is False and m["attempts"] == 1 and m["hparams"]["lr"] == 1e-3
    assert not (out / "resume").exists()


@pytest.fixture
def outer_sigterm():
    """A SIGTERM handler outside the stage that fails the test (instead of ending pytest) if the stage
    does not catch the signal itself."""
    def uncaught(*_):
        raise AssertionError("SIGTERM reached the handler outside the stage: the stage would have died")

    old = signal.signal(signal.SIGTERM, uncaught)
    yield uncaught
    signal.signal(signal.SIGTERM, old)


def _sigterm_during_evaluation(monkeypatch):
    """SIGTERM to this process while the stage evaluates (after its last training step)."""
    import os

    from precswitch.train import engine

    real = engine.evaluate

    def evaluate(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*a, **k)

    monkeypatch.setattr(engine_loop, "evaluate", evaluate)


def test_sigterm_during_evaluation_keeps_the_training_and_rerun_finishes_identically(setup, tmp_path, monkeypatch,
                                                                                     outer_sigterm):
    """Preempted after the last step (evaluation, checkpoint): the handler used to be gone by then, so
    SIGTERM killed the stage and every step since the last periodic save was lost."""
    from precswitch.train.engine import Preempted, run_stage

    hp, ref = setup
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        _sigterm_during_evaluation(m)
        with pytest.raises(Preempted, match="evaluation"):
            run_stage(hp, out)
    assert (out / "resume" / "state.pt").is_file() and not (out / "metrics.json").exists()
    assert signal.getsignal(signal.SIGTERM) is outer_sigterm  # the stage's own handler is gone again
    m = run_stage(hp, out)
    assert m["resumed"] is True and m["attempts"] == 2 and m["steps_completed"] == STEPS
    _same_result(ref, out)


def test_diverged_stage_preempted_during_evaluation_resumes_without_training_on(setup, tmp_path, monkeypatch,
                                                                                outer_sigterm):
    from precswitch.train import engine

    hp, _ = setup
    hp = {**hp, "steps": 20, "max_nonfinite": 2}
    real_loss = engine.forward_loss
    out = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(engine_loop, "forward_loss", lambda *a: real_loss(*a) * float("nan"))
        _sigterm_during_evaluation(m)
        with pytest.raises(engine.Preempted):
            engine.run_stage(hp, out)
    res = engine.run_stage(hp, out)  # resumed with finite losses: a diverged stage must not train on
    assert res["status"] == "diverged" and res["steps_completed"] == 2 and res["resumed"] is True


def test_a_resumed_amp_fp16_stage_keeps_its_loss_scale(tmp_path, monkeypatch, outer_sigterm):
    """The loss scale is part of the resumable state: a scaler started at 2**40 backs off on the first steps;
    preempted after step 4 and resumed, the stage continues from the backed-off scale (not from 2**40 again), so
    its steps.csv (loss scales, skips, losses) and final weights are the uninterrupted run's."""
    import torch
    from safetensors.torch import load_file

    from precswitch import precision as P
    from precswitch.train import engine
    from precswitch.train.engine import run_stage

    stock = P.Precision.make_scaler
    monkeypatch.setattr(P.Precision, "make_scaler", lambda self, d: None if stock(self, d) is None
                        else torch.amp.GradScaler(d, init_scale=2.0**40))
    hp = {"data": str(make_prepared(tmp_path / "data", "mlm")), "precision": "amp_fp16", "steps": 8, "seed": 4,
          "model": TINY, "max_nonfinite": 100, "max_nonfinite_fraction": 1.0}
    whole = run_stage(hp, tmp_path / "whole")
    assert whole["skipped_steps"] >= 6  # still backing off when it is preempted
    resumed = preempted_then_resumed(monkeypatch, hp, tmp_path / "resumed", 4)
    assert resumed["resumed"] is True
    cols = [c for c in engine.STEP_FIELDS if c != "step_seconds"]
    assert [[r[c] for c in cols] for r in steps_rows(tmp_path / "resumed")] == \
        [[r[c] for c in cols] for r in steps_rows(tmp_path / "whole")]
    w = [load_file(next((tmp_path / d / "checkpoint").glob("*.safetensors"))) for d in ("whole", "resumed")]
    assert all(torch.equal(w[0][k], w[1][k]) for k in w[0])


# ---------------------------------------------------------------------- in-process (fast) checks of the resume state
@pytest.fixture(scope="module")
def small_mlm(tmp_path_factory):
    return str(make_prepared(tmp_path_factory.mktemp("small"), "mlm"))


def test_a_stage_preempted_in_the_loop_gives_the_caller_its_handlers_and_resumes_everything(
        small_mlm, tmp_path, monkeypatch, outer_sigterm):
    """Preempted during step 2 of 6 (activation telemetry on, resumable state every 3 steps and every minute):

    - the state goes to hparams resume_dir, and the rerun resumes from there;
    - the caller's SIGTERM handler is back once Preempted is raised (an in-process caller, a test runner or a
      notebook, would otherwise ignore SIGTERM from then on);
    - the resumed stage ends with the uninterrupted one's steps.csv, activations.csv (the telemetry rows before
      the preemption are part of the state) and weights, also from a state written before the mlm_empty counter;
    - the periodic saves are the ones asked for: none at the last step (the stage is done: metrics.json follows),
      and checkpoint_every_minutes counts minutes (a clock of 1 s per reading: no minute passes in 6 steps)."""
    import csv
    import types

    import torch
    from safetensors.torch import load_file

    from precswitch.train import engine

    hp = {"data": small_mlm, "precision": "fp32", "steps": 6, "seed": 3, "model": TINY, "threads": 1,
          "telemetry_every": 1, "checkpoint_every_steps": 3, "checkpoint_every_minutes": 1.0}
    with monkeypatch.context() as m:
        ticks = iter(range(10**6))
        m.setattr(engine_loop, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
        whole = engine.run_stage(hp, tmp_path / "whole")
    assert whole["state_saves"] == 1  # after step 3; not after step 6, and no minute ever passed

    out = tmp_path / "resumed"
    hp = {**hp, "resume_dir": str(tmp_path / "scratch" / "state-of-resumed")}  # hparams resume_dir (not hashed)
    real_sync, calls = engine_loop.measure.sync, []

    def sync_then_sigterm(device):
        real_sync(device)
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    with monkeypatch.context() as m:
        m.setattr(engine_loop.measure, "sync", sync_then_sigterm)
        with pytest.raises(engine.Preempted, match="SIGTERM at step 2") as e:
            engine.run_stage(hp, out)
    assert e.value.exit_code == EXIT_PREEMPTED
    assert signal.getsignal(signal.SIGTERM) is outer_sigterm
    state = tmp_path / "scratch" / "state-of-resumed" / "state.pt"
    assert not (out / "resume").exists()
    saved = torch.load(state, weights_only=False)
    assert saved["loop"]["step"] == 2
    del saved["loop"]["mlm_empty"]  # a state saved before the counter existed
    torch.save(saved, state)
    resumed = engine.run_stage(hp, out)
    assert resumed["resumed"] is True and resumed["steps_completed"] == 6 and resumed["mlm_empty_batches"] == 0
    assert resumed["attempts"] == 2 and not state.parent.exists()  # the state is gone once metrics.json is in

    def rows(d, name, drop):
        with open(tmp_path / d / name, newline="") as f:
            return [{k: v for k, v in r.items() if k not in drop} for r in csv.DictReader(f)]

    for name, drop in (("steps.csv", {"step_seconds"}), ("activations.csv", set())):
        assert rows("resumed", name, drop) == rows("whole", name, drop), name
    assert rows("whole", "activations.csv", set())  # telemetry did record
    w = [load_file(next((tmp_path / d / "checkpoint").glob("*.safetensors"))) for d in ("whole", "resumed")]
    assert all(torch.equal(w[0][k], w[1][k]) for k in w[0])


def test_a_corrupt_resume_state_is_refused_naming_it_and_a_foreign_one_set_aside(small_mlm, tmp_path):
    """A state.pt that cannot be read (a disk that filled) is refused before training, naming the file and saying
    to delete it; nothing is written. One that another configuration wrote is moved aside (resume.stale-<hash>),
    not deleted, and the stage trains from step 0."""
    import torch

    from precswitch.errors import PrecswitchError
    from precswitch.train.engine import run_stage

    hp = {"data": small_mlm, "precision": "fp32", "steps": 2, "seed": 3, "model": TINY, "threads": 1}
    out = tmp_path / "run"
    state = out / "resume" / "state.pt"
    state.parent.mkdir(parents=True)
    state.write_bytes(b"PK\x03\x04 half a zip")
    with pytest.raises(PrecswitchError, match=r"resume state .*state\.pt' is corrupt: .*delete it to start over"):
        run_stage(hp, out)
    assert sorted(p.name for p in out.iterdir()) == [".lock", "resume"]
    torch.save({"config_hash": "0123abcd"}, state)
    m = run_stage(hp, out)
    assert m["resumed"] is False and m["steps_completed"] == 2
    assert torch.load(out / "resume.stale-0123abcd" / "state.pt") == {"config_hash": "0123abcd"}


def test_the_resume_state_restores_every_rng_the_stage_may_draw_from(monkeypatch):
    """torch's CPU generator, Python's and numpy's, and (on a GPU) every CUDA generator: saved and restored."""
    import random as pyrandom

    import numpy as np
    import torch

    cuda = {"state": ["gpu0-state", "gpu1-state"], "set": []}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(cuda["state"]))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", cuda["set"].append)
    st = engine_state.rng_state()
    first = (torch.rand(3), pyrandom.random(), np.random.rand())
    engine_state.set_rng_state(st)
    again = (torch.rand(3), pyrandom.random(), np.random.rand())
    assert torch.equal(first[0], again[0]) and first[1:] == again[1:]
    assert cuda["set"] == [["gpu0-state", "gpu1-state"]]


def test_a_second_stage_on_a_run_dir_in_use_is_refused_at_once_naming_the_holder(small_mlm, tmp_path):
    """Another process holds the run dir's lock (an orphan still training there): refused before anything is
    loaded or written, naming the holder; free again once that lock goes."""
    import fcntl

    from precswitch.errors import PrecswitchError
    from precswitch.train.engine import RUN_LOCK, run_stage

    out = tmp_path / "run"
    out.mkdir()
    fd = os.open(out / RUN_LOCK, os.O_RDWR | os.O_CREAT)  # another open file description: another holder
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"pid 4242 on node7, SLURM job 99")
        hp = {"data": small_mlm, "precision": "fp32", "steps": 2, "seed": 3, "model": TINY, "threads": 1}
        with pytest.raises(PrecswitchError, match=r"in use by another training process \(pid 4242 on node7, SLURM "
                                                  r"job 99\): stop it first"):
            run_stage(hp, out)
        assert sorted(p.name for p in out.iterdir()) == [RUN_LOCK]
    finally:
        os.close(fd)
