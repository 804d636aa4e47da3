"""The GPU lease (benchmarks/lease/): the carry resolves for the rental's Python and image versions (offline, from the
lock), it fits the device tool, the lease's time arithmetic, its config inherits the default study, and a lease cut
off mid-study still brings its results back. The expensive end-to-end rehearsal is benchmarks/lease/rehearse.sh."""

import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
LEASE = ROOT / "benchmarks" / "lease"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"lease_{name}", LEASE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_lock_resolves_for_python_3_12_and_the_images_pinned_versions():
    w = _load("wheels")
    lock = w.read_lock()
    assert lock["python"] == "3.12"
    assert {k: lock["image"][k] for k in ("torch", "transformers", "huggingface-hub", "numpy", "tokenizers")} == {
        "torch": "2.11.0", "transformers": "5.17.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2",
        "tokenizers": "0.23.2"}
    assert w.unmet(lock) == []
    locked = {x["name"] for x in lock["wheels"]}
    assert {"snakemake", "datasets", "jsonschema"} <= locked
    assert locked & w.image_packages() == set(lock["override"])  # the image's own, only where carried on purpose
    tags = [x["wheel"].rsplit("-", 3)[1:3] for x in lock["wheels"]]  # python tag, abi tag
    assert all(py in ("py3", "py2.py3", "cp312", "py312") and abi in ("none", "cp312") for py, abi in tags), tags


def test_an_image_version_outside_a_carried_packages_bounds_is_named():
    w = _load("wheels")
    lock = copy.deepcopy(w.read_lock())
    lock["image"]["pyarrow"] = "23.0.0"  # datasets 5.2 needs pyarrow >= 24
    lock["wheels"] = [x for x in lock["wheels"] if x["name"] != "fsspec"]  # the image's fsspec: unknown, fine
    lock["wheels"].append({"name": "extra", "version": "1", "requires": ["not-anywhere>=1"]})
    got = w.unmet(lock)
    assert any(m.startswith("datasets: pyarrow") and "have 23.0.0" in m for m in got), got
    assert any(m.startswith("extra: not-anywhere") and "missing" in m for m in got), got
    assert len(got) == 2


def test_the_carry_fits_the_device_tools_limit():
    w = _load("wheels")
    wheels = sum(x["bytes"] for x in w.read_lock()["wheels"])
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    tracked = sum((ROOT / f).stat().st_size for f in files.split("\0") if f and (ROOT / f).is_file())
    assert wheels + tracked < w.CARRY_LIMIT


def test_a_step_gets_what_is_left_less_what_follows_and_is_skipped_rather_than_unlimited():
    t = _load("lease_time")
    assert t.step_limit(left=300, keep=40) == 260
    assert t.step_limit(left=45, keep=40) == 0  # 5 s: skipped (`timeout 0` would mean no limit at all)
    assert t.step_limit(left=10, keep=40) == 0
    assert t.BUDGET_S < t.COMMAND_S


def test_the_lease_prediction_counts_every_fixed_cost_and_compile():
    t = _load("lease_time")
    lease = yaml.safe_load((ROOT / "config" / "gpu-lease.yaml").read_text())
    default = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    n2 = len(default["schedules"]) * len(lease["seeds"])  # the default's schedules, the lease's seeds
    # stage-1 runs shared by precision; the positive control (no `pretrain`) has none
    n1 = len({str(s["pretrain"]) for s in default["schedules"].values() if "pretrain" in s}) * len(lease["seeds"])
    eager = t.predict(ROOT / "config" / "gpu-lease.yaml")
    assert eager["total"] == pytest.approx(sum(eager["parts"].values()))
    assert set(t.FIXED) <= set(eager["parts"])
    fixed = t.job_fixed_s()  # measured on the H200: 13.7 s a process there, + BERT-small's allowance
    assert 13.7 + t.SIZE_ALLOWANCE_S == pytest.approx(fixed, abs=0.05)
    assert eager["job_s"] == (fixed, fixed)
    assert eager["parts"][f"pretrain: {n1} jobs"] > n1 * fixed and eager["parts"][f"finetune: {n2} jobs"] > n2 * fixed
    assert eager["spare"] >= t.SPARE  # the study fits one command with a quarter of it to spare
    compiled = t.predict(ROOT / "config" / "gpu-lease.yaml", compile_stage1=True)
    assert compiled["total"] == pytest.approx(eager["total"] + t.COMPILE_S * (1 + n1))  # preflight + cold compiles
    assert compiled["spare"] < eager["spare"]


def test_the_lease_config_inherits_the_default_task_and_restates_only_gpu_sizes():
    cfg = yaml.safe_load((ROOT / "config" / "gpu-lease.yaml").read_text())
    assert not {"schedules", "analysis", "data", "tokenizer", "sweeps", "sequential"} & set(cfg)
    assert cfg["device"] == "cuda" and len(cfg["seeds"]) >= 2
    assert cfg["model"]["hidden_size"] == 512 and cfg["model"]["num_hidden_layers"] == 4  # BERT-small
    assert cfg["train"]["pretrain"]["compile"] == "off"  # compiled only after the lease's own preflight passed
    assert {s["on_unsupported"] for s in cfg["train"].values()} == {"skip"}


def test_disk_of_a_gpu_config_counts_each_stage_1_checkpoint_in_its_dtype():
    gh = _load("lease_time")._gpu_hours()
    d = gh.disk_bytes(gh.study_config(ROOT / "config" / "bert-small-scratch.yaml"))
    # fp32, amp_fp16, amp_bf16, tf32 checkpoints in fp32 (4 bytes), pure_fp16 and pure_bf16 in 16 bits; 10 seeds
    assert d["checkpoints"] == d["parameters"] * (4 * 4 + 2 * 2) * 10
    assert 28e6 < d["parameters"] < 30e6  # BERT-small with BERT's 30522-token vocabulary


@pytest.mark.slow
def test_a_lease_cut_off_mid_study_brings_back_its_results_without_states(tmp_path):
    """gpu_lease.sh --cpu-smoke with a budget far too short for the study: the pipeline is cut by its timeout, and
    $OUT still holds lease.log and results.tar.gz (the commit, logs; no checkpoint, resume state or data)."""
    out = tmp_path / "out"
    smoke = ROOT / "results" / "gpu-lease-smoke"  # the smoke run's own folder: a leftover would resume, not be cut
    shutil.rmtree(smoke, ignore_errors=True)
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OUT": str(out), "PYTHON": sys.executable,
           "HOME": str(tmp_path), "PRECSWITCH_SITE": str(tmp_path / "site"), "LEASE_BUDGET_S": "80",
           "LEASE_COMMIT": "0123abc"}
    try:
        r = subprocess.run(["bash", str(LEASE / "gpu_lease.sh"), "--cpu-smoke"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(smoke, ignore_errors=True)
    log = (out / "lease.log").read_text()
    assert r.returncode == 124, log[-3000:]  # the pipeline's timeout, not a success, not a preflight failure
    assert "pipeline exit 124" in log and "compile preflight" not in log
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"lease.log", "results.tar.gz"} <= set(files), files
    tar = out / "results.tar.gz"
    assert 0 < tar.stat().st_size < 16 * 2**20
    with tarfile.open(tar) as t:
        names = t.getnames()
        commit = t.extractfile("results/gpu-lease-smoke/lease-commit.txt").read().decode().strip()
    assert commit == "0123abc"
    with tarfile.open(tar) as t:  # the jobs that finished before the cut record the commit too (no .git there)
        ran = [json.load(t.extractfile(n))["git_commit"] for n in names if n.endswith("/metrics.json")]
    assert set(ran) <= {"0123abc"}, ran
    assert any(n.startswith("results/gpu-lease-smoke/logs/") for n in names), names
    assert not [n for n in names if n.startswith("results/gpu-lease-smoke/data/") or "/checkpoint" in n
                or "/resume" in n or n.endswith(".pt")]
    assert os.access(ROOT / "workflow" / "scripts" / "precswitch", os.X_OK)
