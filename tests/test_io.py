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
