"""The loop's state in typed fields, and what makes a stage resumable: resume/state.pt, the RNG, the stop signals,
and the lock on the output dir."""

from __future__ import annotations

import contextlib
import math
import os
import random
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch

from ...errors import EXIT_PREEMPTED, PrecswitchError
from ...io import atomic_path, atomic_write_json, flock_and_sign, lock_holder, read_json, refused_writes

#: the file in a stage's output dir that the process training into it holds an exclusive lock on
RUN_LOCK = ".lock"
#: beside state.pt: the resumable-state save count and seconds including the save that wrote state.pt (whose own
#: duration its pickled loop state cannot hold), so a resumed stage reports that save's seconds too
STATE_SECONDS = "state_seconds.json"


class StepRow(NamedTuple):
    """One row of steps.csv (its columns, in order)."""

    step: int
    loss: float | None  #: None: a masked-LM batch without a masked token (nothing scored)
    lr: float
    grad_norm: float
    loss_scale: float | None
    step_seconds: float
    skipped: int


STEP_FIELDS = list(StepRow._fields)


@dataclass
class LoopState:
    """What the loop has done so far; saved in state.pt as a plain dict (readable across versions)."""

    step: int = 0
    rows: list[StepRow] = field(default_factory=list)  #: steps.csv's rows: every log_every-th step, skips, the last
    step_times: list[float] = field(default_factory=list)
    train_seconds: float = 0.0
    nonfinite: int = 0
    consecutive_nonfinite: int = 0
    first_nonfinite: int | None = None
    skipped: int = 0
    loss_scales: list[float] = field(default_factory=list)
    attempts: int = 0
    tokens: int = 0
    samples: int = 0
    state_saves: int = 0
    state_seconds: float = 0.0
    status: str = "ok"
    status_reason: str | None = None
    mlm_empty: int = 0  #: masked-LM training batches without a masked token
    grad_norms: list[float] = field(default_factory=list)  #: every step's, empty masked-LM batches left out

    def diverge(self, reason: str) -> None:
        self.status, self.status_reason = "diverged", reason

    def last_loss(self) -> float | None:
        return next((r.loss for r in reversed(self.rows) if r.loss is not None), None)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**d, "rows": [list(r) for r in self.rows]}

    @classmethod
    def from_dict(cls, saved: dict) -> LoopState:
        d = {_RENAMED.get(k, k): v for k, v in saved.items()}
        d["rows"] = [StepRow(*r) for r in d["rows"]]
        # a state saved before every step's norm was kept: the steps before it have their logged rows' norms only
        d.setdefault("grad_norms", [r.grad_norm for r in d["rows"] if r.loss is not None])
        return cls(**{k: v for k, v in d.items() if k in _FIELDS})


#: loop-state keys of state.pt files written before the typed state
_RENAMED = {"consecutive": "consecutive_nonfinite", "scales": "loss_scales"}
_FIELDS = {f.name for f in fields(LoopState)}


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def write_state(path: Path, state: dict) -> float:
    """torch.save ``state`` to ``path`` atomically (the file there before stays whole if this fails); its seconds."""
    t = time.perf_counter()
    with refused_writes(path), atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(state, f)  # through a Python file: a full disk is an OSError, not torch's RuntimeError
    return time.perf_counter() - t


class ResumeFile:
    """resume/state.pt: everything a rerun needs to continue bit for bit, with STATE_SECONDS beside it."""

    def __init__(self, resume_dir: Path):
        self.dir, self.path = resume_dir, resume_dir / "state.pt"

    def load(self, config_hash: str) -> dict | None:
        """The saved state, or None: there is none, or it is of other hyper-parameters (set aside, not deleted)."""
        if not self.path.is_file():
            return None
        try:
            # to the CPU: the RNG states must stay CPU byte tensors, and a GPU copy of the whole state
            # would sit in the peak memory; load_state_dict copies onto the model's/optimizer's device
            saved = torch.load(self.path, weights_only=False, map_location="cpu")
        except Exception as e:  # noqa: BLE001
            raise PrecswitchError(f"resume state {str(self.path)!r} is corrupt: {e}; delete it to start over") from None
        if saved.get("config_hash") != config_hash:
            self._set_aside(saved.get("config_hash"), config_hash)
            return None
        return saved

    def save(self, loop: LoopState, snapshot: Callable[[], dict]) -> None:
        """Count a save in ``loop``, save ``snapshot()`` (which holds ``loop``), and record the count and the
        seconds, this save's included, beside it. A disk that refuses raises WriteRefused; the state saved
        before, if any, is untouched (atomic)."""
        loop.state_saves += 1
        loop.state_seconds += write_state(self.path, snapshot())
        with refused_writes(self.dir / STATE_SECONDS):
            atomic_write_json(self.dir / STATE_SECONDS, {"state_saves": loop.state_saves,
                                                         "state_seconds": loop.state_seconds})

    def saved_seconds(self) -> dict:
        """The count and seconds of the save that wrote state.pt, or {} where that is not known: the file is absent
        (a kill -9 between the two writes) or unreadable. It is bookkeeping only (one save's seconds): never a
        reason to refuse the resume that state.pt allows."""
        try:
            done = read_json(self.dir / STATE_SECONDS)
        except (OSError, ValueError):
            return {}
        ok = (isinstance(done, dict) and isinstance(done.get("state_saves"), int)
              and isinstance(done.get("state_seconds"), (int, float)) and math.isfinite(done["state_seconds"]))
        return done if ok else {}

    def remove(self) -> None:
        """The stage finished: its resumable state is no longer needed."""
        if self.path.is_file():
            self.path.unlink()
            (self.dir / STATE_SECONDS).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self.dir.rmdir()

    def _set_aside(self, old_hash, new_hash: str) -> None:
        """The resumable state of a stage stopped under other hyper-parameters (a config changed before the rerun)
        cannot be resumed: it is moved aside, not deleted (``<resume_dir>.stale-<its hash>``, replacing an older
        one of the same hash), and the stage starts over; one line in the log says so."""
        stale = self.dir.with_name(f"{self.dir.name}.stale-{str(old_hash)[:16]}")
        if stale.exists():
            shutil.rmtree(stale)  # the same hyper-parameters' older state
        os.replace(self.dir, stale)
        print(f"precswitch train: resume state {str(self.path)!r} belongs to different hyper-parameters "
              f"(hash {old_hash} != {new_hash}): moved to {str(stale)!r}; the stage starts over", file=sys.stderr,
              flush=True)


class Preempted(Exception):
    """SIGTERM (or SIGINT: Ctrl-C) arrived: the resumable state was saved. ``exit_code``: EXIT_PREEMPTED after
    SIGTERM, 130 (the shell's code for Ctrl-C) after SIGINT."""

    def __init__(self, message: str, exit_code: int = EXIT_PREEMPTED):
        super().__init__(message)
        self.exit_code = exit_code


#: the signals that stop a stage with its state saved (SIGTERM: a scheduler's preemption or Snakemake's
#: cancellation; SIGINT: Ctrl-C), and each one's exit code
STOP_SIGNALS = {signal.SIGTERM: EXIT_PREEMPTED, signal.SIGINT: 128 + signal.SIGINT}


class StopSignals:
    """SIGTERM (a scheduler's preemption, Snakemake's cancellation) and SIGINT (Ctrl-C) caught while the stage
    trains, evaluates and writes its checkpoint: the loop then saves its state and raises :class:`Preempted`.
    The previous handlers are back when the block ends, however it ends."""

    def __init__(self):
        self.requested, self.signal, self._old = False, None, {}

    def __enter__(self) -> StopSignals:
        self._old = {s: signal.getsignal(s) for s in STOP_SIGNALS}
        with contextlib.suppress(ValueError):  # not the main thread
            for s in STOP_SIGNALS:
                signal.signal(s, self._on_stop)
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(ValueError):
            for s, h in self._old.items():
                signal.signal(s, h)

    def _on_stop(self, signum, frame) -> None:  # noqa: ARG002
        self.requested = True
        self.signal = self.signal or signal.Signals(signum)

    def preempted(self, where: str, state_path: Path) -> Preempted:
        sig = self.signal or signal.SIGTERM
        name = "SIGINT (Ctrl-C)" if sig == signal.SIGINT else sig.name
        return Preempted(f"{name} {where}: state saved to {state_path}", STOP_SIGNALS.get(sig, EXIT_PREEMPTED))


@contextlib.contextmanager
def run_dir_lock(out: Path):
    """Hold an exclusive lock on ``out`` for the stage: a second process training into the same dir (a rerun
    while an orphan of a killed Snakemake, or a job of a lost SLURM session, still trains there) would mix
    both runs' state, checkpoint and metrics. It is refused at once, naming the holder; the lock goes with
    its process (flock), so a killed stage leaves none behind."""
    import socket

    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / RUN_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:  # not writable: run_stage says so, naming the dir
        yield
        return
    try:
        job = os.environ.get("SLURM_JOB_ID")
        info = f"pid {os.getpid()} on {socket.gethostname()}" + (f", SLURM job {job}" if job else "")
        if not flock_and_sign(fd, info):
            raise PrecswitchError(
                f"output dir {str(out)!r} is in use by another training process "
                f"({lock_holder(out / RUN_LOCK, 'unknown process')}): stop it first "
                "(kill it, or scancel its SLURM job), then run again") from None
        yield
    finally:
        os.close(fd)  # releases the lock
