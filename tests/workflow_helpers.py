"""Helpers for the workflow tests: run Snakemake on this repository's Snakefile in a scratch directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SNAKEFILE = ROOT / "Snakefile"
CONFIGS = Path(__file__).resolve().parent / "configs"


def snakemake(workdir, *args, timeout=120, check=False) -> subprocess.CompletedProcess:
    """``snakemake -s REPO/Snakefile -d WORKDIR ARGS`` with this interpreter, bounded by ``timeout``.

    The working directory has no config/config.yaml, so the config is the given --configfile(s)
    over the schema defaults, which are the embedded default's values.
    """
    cmd = [sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "-d", str(workdir), *map(str, args)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"snakemake {' '.join(map(str, args))} ran over {timeout}s:\n{e.stdout}\n{e.stderr}")
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a (dry) run: rule -> count."""
    m = re.search(r"Job stats:\njob\s+count\n[- ]+\n(.*?)\ntotal\s+(\d+)", output, re.S)
    if not m:
        return {}
    counts = {}
    for line in m.group(1).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
    return counts


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def load_config(name: str) -> dict:
    return yaml.safe_load((CONFIGS / name).read_text())


def real_files_config() -> dict:
    """tests/configs/real-files.yaml with its repository-relative data paths made absolute."""
    cfg = load_config("real-files.yaml")
    for stage in ("pretrain", "finetune"):
        src = cfg["data"][stage]
        for split in ("train", "eval"):
            value = src.get(split)
            if isinstance(value, str):
                src[split] = str((ROOT / value).resolve())
            elif isinstance(value, list):
                src[split] = [str((ROOT / v).resolve()) for v in value]
    return cfg


def real_data_present() -> bool:
    cfg = real_files_config()
    files = [cfg["data"]["finetune"]["train"], cfg["data"]["finetune"]["eval"], *cfg["data"]["pretrain"]["train"]]
    return all(Path(f).is_file() for f in files)


def dry_run(tmp_path, cfg: dict | None = None, *extra):
    """Dry run in tmp_path; no cfg: the embedded default config/config.yaml."""
    path = ROOT / "config" / "config.yaml" if cfg is None else write_config(tmp_path / "study.yaml", cfg)
    return snakemake(tmp_path, "-n", "--configfile", path, *extra)


def assert_names_the_key(err: str, key: str, allowed: str) -> None:
    """`err` has a line `config key KEY: ...` that says `allowed`."""
    assert f"config key {key}:" in err, err[-3000:]
    line = next(ln for ln in err.splitlines() if f"config key {key}:" in ln)
    assert allowed in line, line
