"""A disk that refuses a stage's writes (full, read-only), on a real small file system (a tmpfs; root only), and
the library's own error type where it cannot be mounted: one line naming the file, saying the stage can be rerun;
nothing there before is corrupted or deleted; the rerun, with space again, gives the uninterrupted run's result."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from engine_fixtures import TINY, make_prepared  # noqa: E402
from precswitch.errors import PrecswitchError  # noqa: E402
from precswitch.train.engine import run_stage  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_prepared(tmp_path_factory.mktemp("data"), "mlm", n_train=64)


@pytest.fixture
def disk(tmp_path):
    """A 4 MiB tmpfs; skipped where this process may not mount one (not root)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mount -t tmpfs is not permitted here (test_a_safetensors_error_is_one_line covers the type)")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill ``disk`` up to about ``leave`` bytes free; returns the filler (delete it to free the space)."""
    filler = disk / f"filler-{uuid.uuid4().hex[:6]}"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:  # full
            pass
    if leave:
        os.truncate(filler, filler.stat().st_size - leave)
    return filler


def hp(data, **kw) -> dict:
    return {"data": str(data), "steps": 4, "seed": 1, "model": TINY, "threads": 1, "progress": False,
            "timing_warmup_steps": 1, **kw}


def one_line_rerun(e: pytest.ExceptionInfo, names: str) -> str:
    text = str(e.value)
    assert "\n" not in text and names in text and "run the same command again" in text, text
    return text


def test_a_full_disk_at_the_checkpoint_is_one_line_and_the_rerun_gives_the_same_run(data, disk, tmp_path):
    reference = run_stage(hp(data), tmp_path / "reference")
    weights = (tmp_path / "reference" / "checkpoint" / "model.safetensors").stat().st_size
    filler = fill(disk, leave=weights // 2)  # config.json fits; the weights (safetensors' writer) do not
    out = disk / "run"
    with pytest.raises(PrecswitchError) as e:
        run_stage(hp(data), out)
    assert "No space left on device" in one_line_rerun(e, str(out / "checkpoint"))
    assert not (out / "checkpoint").exists() and not list(out.glob(".checkpoint*"))  # nothing half-written
    filler.unlink()
    again = run_stage(hp(data), out)
    assert again["status"] == "ok" and again["eval_loss"] == reference["eval_loss"]
    assert (out / "checkpoint" / "model.safetensors").stat().st_size == weights


def test_a_full_disk_at_a_state_save_keeps_the_state_before_and_resumes_from_it(data, disk, monkeypatch):
    """The disk fills after the first resumable-state save (checkpoint_every_steps 2): the second (torch.save)
    fails in one line naming state.pt, the first stays whole, and the rerun resumes from step 2."""
    from precswitch.train.engine import state

    real, fillers = state.write_state, []

    def full_at_the_second_save(path, snapshot):
        fillers.append(fill(disk) if fillers else None)
        return real(path, snapshot)

    monkeypatch.setattr(state, "write_state", full_at_the_second_save)
    out = disk / "run"
    with pytest.raises(PrecswitchError) as e:
        run_stage(hp(data, steps=6, checkpoint_every_steps=2, save_checkpoint=False), out)
    one_line_rerun(e, str(out / "resume" / "state.pt"))
    monkeypatch.undo()
    fillers[1].unlink()
    import torch

    assert torch.load(out / "resume" / "state.pt", weights_only=False)["loop"]["step"] == 2
    m = run_stage(hp(data, steps=6, checkpoint_every_steps=2, save_checkpoint=False), out)
    assert m["resumed"] and m["steps_completed"] == 6 and m["status"] == "ok"


def test_a_full_disk_at_the_records_keeps_the_results_there_before(data, disk, tmp_path):
    """A rerun into a dir holding a finished stage's steps.csv and metrics.json, on a full disk: one line naming
    steps.csv, and both files are byte for byte the ones there before."""
    out = disk / "run"
    run_stage(hp(data, save_checkpoint=False), out)
    before = {n: (out / n).read_bytes() for n in ("steps.csv", "metrics.json")}
    filler = fill(disk)
    with pytest.raises(PrecswitchError) as e:
        run_stage(hp(data, save_checkpoint=False, seed=2), out)
    one_line_rerun(e, str(out / "steps.csv"))
    assert {n: (out / n).read_bytes() for n in before} == before
    filler.unlink()


def test_a_read_only_file_system_is_one_line(data, disk, tmp_path):
    """hparams resume_dir on a read-only mount: the first resumable-state save names state.pt and the mount's
    refusal; the stage's own dir is untouched by it."""
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    try:
        with pytest.raises(PrecswitchError) as e:
            run_stage(hp(data, checkpoint_every_steps=2, resume_dir=str(disk / "resume")), tmp_path / "run")
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
    assert "Read-only file system" in one_line_rerun(e, str(disk / "resume"))
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_a_skipped_stage_on_a_full_disk_is_one_line(data, disk):
    fill(disk)
    with pytest.raises(PrecswitchError) as e:
        run_stage(hp(data, precision="tf32", on_unsupported="skip"), disk / "run")
    one_line_rerun(e, "steps.csv")


def test_a_safetensors_error_is_one_line(data, tmp_path, monkeypatch):
    """Without a small disk to fill: the checkpoint writer's own error type (SafetensorError, not an OSError)."""
    from safetensors import SafetensorError
    from transformers import PreTrainedModel

    def full(self, *a, **k):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full)
    out = tmp_path / "run"
    with pytest.raises(PrecswitchError) as e:
        run_stage(hp(data), out)
    assert "No space left on device" in one_line_rerun(e, str(out / "checkpoint"))
    monkeypatch.undo()
    m = run_stage(hp(data), out)  # the finished training was saved: evaluated and written, no step trained again
    assert m["resumed"] and m["steps_completed"] == 4
