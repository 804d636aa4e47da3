"""precswitch.io: atomic writes leave files with the permissions a plain open() would give."""

from __future__ import annotations

import os
import stat

import pytest

from precswitch.io import atomic_write_json, atomic_write_text


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_atomic_write_respects_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "verdict.md", "text\n")
        atomic_write_json(tmp_path / "sub" / "metrics.json", {"a": 1})
        atomic_write_text(tmp_path / "verdict.md", "again\n")  # replacing an existing file
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(plain.stat().st_mode) == mode
    for p in (tmp_path / "verdict.md", tmp_path / "sub" / "metrics.json"):
        assert stat.S_IMODE(p.stat().st_mode) == mode, (p, oct(p.stat().st_mode))
    assert (tmp_path / "verdict.md").read_text() == "again\n"
    assert not [p for p in tmp_path.rglob(".*.tmp")]


def test_type_cli_config_reads_nested_text_as_yaml():
    from precswitch.io import type_cli_config

    # what `snakemake --config seeds='[1,2]' 'analysis={margin: 0.5, baseline: fp32-fp32}'` hands over
    cli = {"seeds": ["1", "2"], "analysis": {"margin": "0.5", "baseline": "fp32-fp32"}, "threads": 2,
           "model": {"init": "null", "hidden_size": "1e3"}}
    config = {"seeds": ["1", "2"], "analysis": {"margin": "0.5", "baseline": "fp32-fp32", "alpha": 0.05},
              "threads": 2, "model": {"init": "null", "hidden_size": "1e3"}, "device": "cpu"}
    type_cli_config(cli, config)
    assert config["seeds"] == [1, 2] and config["analysis"] == {"margin": 0.5, "baseline": "fp32-fp32", "alpha": 0.05}
    assert config["model"] == {"init": None, "hidden_size": "1e3"}  # YAML 1.1: 1e3 stays text (schema says so)
    type_cli_config({}, config)
    type_cli_config(None, config)
    config = {"seeds": ["1"], "tags": {"note": "[1, 2]"}}
    type_cli_config({"seeds": ["1", "2", "3"], "tags": {"note": "[1, 2]"}}, config)
    assert config == {"seeds": [1], "tags": {"note": "[1, 2]"}}  # a longer cli list; text reading as a list stays


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-step"])
def test_atomic_path_replaces_a_directory_and_a_failed_replace_keeps_the_old_one(tmp_path, monkeypatch, exchange):
    """A checkpoint dir replaced by a new one; when the write fails (disk full at the rename), the old
    checkpoint is still there, under its own name, and no temporary is left behind."""
    import errno

    from precswitch import io

    if not exchange:
        monkeypatch.setattr(io, "_exchange", lambda a, b: False)
    ck = tmp_path / "checkpoint"
    ck.mkdir()
    (ck / "w").write_text("old")
    with io.atomic_path(ck) as tmp:
        tmp.mkdir()
        (tmp / "w").write_text("new")
    assert (ck / "w").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]

    real = os.replace

    def full(a, b):
        if str(a).endswith(f"tmp-{os.getpid()}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(a, b)

    monkeypatch.setattr(os, "replace", full)
    monkeypatch.setattr(io, "_exchange", lambda a, b: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full"))
                        if exchange else False)
    with pytest.raises(OSError):
        with io.atomic_path(ck) as tmp:
            tmp.mkdir()
            (tmp / "w").write_text("newer")
    assert (ck / "w").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


def _write_checkpoint(path, kind: str, text: str) -> None:
    """A checkpoint of ``kind`` "dir" (a directory holding file w) or "file", holding ``text``."""
    if kind == "dir":
        path.mkdir()
        (path / "w").write_text(text)
    else:
        path.write_text(text)


def _read_checkpoint(path, kind: str) -> str:
    return (path / "w" if kind == "dir" else path).read_text()


@pytest.mark.parametrize("kind", ["dir", "file"])
def test_atomic_path_failing_in_the_body_leaves_the_old_one_and_no_temporary(tmp_path, kind):
    """A checkpoint save that fails halfway (an exception while the temporary is written): the previous
    checkpoint stays, whole, and the half-written temporary is removed."""
    from precswitch import io

    target = tmp_path / "checkpoint"
    _write_checkpoint(target, kind, "old")
    with pytest.raises(RuntimeError):
        with io.atomic_path(target) as tmp:
            _write_checkpoint(tmp, kind, "half")
            raise RuntimeError("killed halfway")
    assert _read_checkpoint(target, kind) == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "unlink-then-rename"])
def test_atomic_path_replaces_a_symlink_not_the_directory_it_points_to(tmp_path, monkeypatch, exchange):
    """A checkpoint path that is a symlink to a directory elsewhere (moved to another disk) is replaced as a link:
    the directory it pointed to is left alone, and no temporary is left behind. (A directory cannot be renamed
    over a link: the save of a rerun used to fail with NotADirectoryError after all its training.)"""
    from precswitch import io

    if not exchange:
        monkeypatch.setattr(io, "_exchange", lambda a, b: False)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "w").write_text("old")
    results = tmp_path / "results"
    results.mkdir()
    (results / "checkpoint").symlink_to(elsewhere, target_is_directory=True)
    with io.atomic_path(results / "checkpoint") as tmp:
        tmp.mkdir()
        (tmp / "w").write_text("new")
    ck = results / "checkpoint"
    assert not ck.is_symlink() and (ck / "w").read_text() == "new"
    assert (elsewhere / "w").read_text() == "old"
    assert sorted(p.name for p in results.iterdir()) == ["checkpoint"]
    # a link whose target is gone (the other disk not mounted): replaced too, the dead link not left as a temporary
    (results / "checkpoint-2").symlink_to(tmp_path / "unmounted", target_is_directory=True)
    with io.atomic_path(results / "checkpoint-2") as tmp:
        tmp.mkdir()
        (tmp / "w").write_text("new")
    assert (results / "checkpoint-2" / "w").read_text() == "new"
    assert sorted(p.name for p in results.iterdir()) == ["checkpoint", "checkpoint-2"]


def test_a_lock_file_names_only_its_present_holder(tmp_path, monkeypatch):
    """The holder's note replaces the previous (longer) one whole; an empty lock file is 'holder unknown'; a note
    that cannot be written (disk full) still leaves the lock taken, reported as taken."""
    import errno
    import fcntl

    from precswitch.io import flock_and_sign, lock_holder

    path = tmp_path / "gpu-0.lock"
    path.write_text("pid=123456789 host=a-much-longer-host-name-of-the-last-holder\n")
    assert lock_holder(tmp_path / "empty.lock") == "holder unknown"
    (tmp_path / "empty.lock").write_text("")
    assert lock_holder(tmp_path / "empty.lock", "unknown process") == "unknown process"
    fd = os.open(path, os.O_RDWR)
    try:
        assert flock_and_sign(fd, "pid 7")
        assert lock_holder(path) == "pid 7"
    finally:
        os.close(fd)

    def full(*a):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    fd = os.open(path, os.O_RDWR)
    other = os.open(path, os.O_RDWR)
    try:
        assert flock_and_sign(fd, "pid 8") is True
        with pytest.raises(BlockingIOError):  # and it really is held
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(other)
        os.close(fd)


@pytest.mark.parametrize("kind", ["dir", "file"])
def test_atomic_path_flushes_the_contents_to_disk_before_the_rename_and_the_rename_after(tmp_path, monkeypatch, kind):
    """A machine crash right after the rename must not leave an empty `state.pt` or checkpoint file: every file
    (and directory) of the temporary is fsynced before it is renamed in, and the parent directory after."""
    from precswitch import io

    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(a, b):
        events.append(("replace", str(b)))
        return real_replace(a, b)

    monkeypatch.setattr(io.os, "fsync", fsync)
    monkeypatch.setattr(io.os, "replace", replace)
    monkeypatch.setattr(io, "_exchange", lambda a, b: False)
    target = tmp_path / "checkpoint"
    with io.atomic_path(target) as tmp:
        if kind == "dir":
            (tmp / "sub").mkdir(parents=True)
            (tmp / "sub" / "model.safetensors").write_text("w")
            (tmp / "config.json").write_text("{}")
        else:
            tmp.write_text("state")
    tmp_name = f".checkpoint.tmp-{os.getpid()}"
    rename = events.index(("replace", str(target)))
    synced_before = {p for what, p in events[:rename] if what == "fsync"}
    if kind == "dir":
        want = {str(tmp_path / tmp_name / n) for n in ("sub/model.safetensors", "config.json", "sub", "")}
        assert {p.rstrip("/") for p in want} <= synced_before, events
    else:
        assert str(tmp_path / tmp_name) in synced_before, events
    assert ("fsync", str(tmp_path)) in events[rename + 1:], events
    # atomic_write_text flushes its directory after the rename too
    events.clear()
    io.atomic_write_text(tmp_path / "metrics.json", "{}")
    assert events[-2:] == [("replace", str(tmp_path / "metrics.json")), ("fsync", str(tmp_path))]


# ------------------------------------------------------------------ mutation audit 4 (gpu): durable IO
def test_a_file_system_that_cannot_fsync_a_directory_still_gets_the_write(tmp_path, monkeypatch):
    """Some network and FUSE file systems refuse fsync on a directory (EINVAL): the file itself was flushed
    and renamed, so the write stands, and no error reaches the run."""
    import errno

    from precswitch import io

    real_fsync = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_fsync(fd)

    monkeypatch.setattr(io.os, "fsync", fsync)
    io.atomic_write_text(tmp_path / "metrics.json", "{}\n")
    with io.atomic_path(tmp_path / "checkpoint") as tmp:
        _write_checkpoint(tmp, "dir", "new")
    assert (tmp_path / "metrics.json").read_text() == "{}\n" and _read_checkpoint(tmp_path / "checkpoint", "dir") == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "metrics.json"]


# ------------------------------------------------------------------ mutation audit 7 (warm/io): mapping arguments
def test_load_mapping_arg_reads_padded_json_upper_case_yaml_and_refuses_an_unreadable_file(tmp_path):
    """Surrounding whitespace (a quoted multi-line --hparams) is no file name; a .YAML file is YAML; a file that
    is not UTF-8 text is the usual one-line refusal naming the option, not a UnicodeDecodeError traceback."""
    from precswitch.errors import PrecswitchError
    from precswitch.io import load_mapping_arg

    assert load_mapping_arg('\n  {"steps": 3}\n', "--hparams") == {"steps": 3}
    y = tmp_path / "h.YAML"
    y.write_text("steps: 3\nname: x\n")
    assert load_mapping_arg(f"@{y}", "--hparams") == {"steps": 3, "name": "x"}
    bad = tmp_path / "h.json"
    bad.write_bytes(b'{"name": "\xff"}')
    with pytest.raises(PrecswitchError, match=r"^--source: cannot parse .*h\.json"):
        load_mapping_arg(str(bad), "--source")


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-step"])
def test_atomic_path_puts_a_directory_over_a_file_and_clears_a_crashed_swaps_leftover(tmp_path, monkeypatch, exchange):
    """A directory written where a file stands raised ENOTDIR (a file over a directory worked); and on a file
    system without rename-exchange, a '.NAME.old-<pid>' directory left by a crashed process with this pid made
    every later replace fail with ENOTEMPTY."""
    from precswitch import io

    if not exchange:
        monkeypatch.setattr(io, "_exchange", lambda a, b: False)
    target = tmp_path / "checkpoint"
    target.write_text("a file")
    with io.atomic_path(target) as tmp:
        tmp.mkdir()
        (tmp / "w").write_text("new")
    assert (target / "w").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint"]
    leftover = tmp_path / f".checkpoint.old-{os.getpid()}"
    leftover.mkdir()
    (leftover / "w").write_text("a crashed swap's")
    with io.atomic_path(target) as tmp:
        tmp.mkdir()
        (tmp / "w").write_text("newer")
    assert (target / "w").read_text() == "newer"
    # the one-step swap never uses the name: the leftover is not its to clear
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["checkpoint"] + [leftover.name] * exchange)


@pytest.mark.parametrize("stop", [OSError(28, "No space left on device"), KeyboardInterrupt()], ids=["full", "ctrl-c"])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch, stop):
    """The disk fills (or Ctrl-C comes: not an Exception) while metrics.json is rewritten: the old file stays
    whole and no temporary is left beside it."""
    path = tmp_path / "metrics.json"
    atomic_write_json(path, {"status": "ok"})
    old = path.read_text()

    def fail(fd):
        raise stop

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(type(stop)):
        atomic_write_json(path, {"status": "rerun"})
    assert path.read_text() == old and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_atomic_write_json_is_strict_json(tmp_path):
    """NaN and infinities (a diverged run's loss, also as numpy scalars or inside lists and tuples) are null, numpy
    scalars numbers and paths text: every JSON reader can parse the file."""
    import json
    import math

    import numpy as np

    path = tmp_path / "m.json"
    atomic_write_json(path, {"loss": math.nan, "curve": [1.0, math.inf], "pair": (2, -math.inf), "np": np.float32("nan"),
                             "scale": [np.float16("inf"), np.array(-np.inf)], "acc": np.float32(0.5), "n": np.int64(3),
                             "where": tmp_path})

    def refuse(name):
        raise ValueError(f"non-strict JSON: {name}")

    assert json.loads(path.read_text(), parse_constant=refuse) == {
        "loss": None, "curve": [1.0, None], "pair": [2, None], "np": None, "scale": [None, None], "acc": 0.5, "n": 3,
        "where": str(tmp_path)}


def test_a_disks_refusal_is_named_whatever_the_writers_error_type(tmp_path):
    """refused_writes: an OSError, or a library's own error naming an OS error (safetensors' SafetensorError), is
    WriteRefused naming the file and the OS's words; any other error passes unchanged (a bug, not a disk)."""
    from safetensors import SafetensorError

    from precswitch.io import WriteRefused, disk_write_error, refused_writes

    rust = SafetensorError("Error while serializing: I/O error: Read-only file system (os error 30) at path \"x\"")
    assert disk_write_error(rust) == "Read-only file system"
    assert disk_write_error(OSError(28, "No space left on device")) == "No space left on device"
    assert disk_write_error(RuntimeError("unexpected pos 576 vs 534")) is None
    with pytest.raises(WriteRefused) as e:
        with refused_writes(tmp_path / "checkpoint"):
            raise rust
    assert (e.value.path, e.value.why) == (str(tmp_path / "checkpoint"), "Read-only file system")
    with pytest.raises(ValueError):
        with refused_writes(tmp_path / "checkpoint"):
            raise ValueError("a bug")
