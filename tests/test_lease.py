"""The GPU lease (benchmarks/lease/): which wheels it carries, that the carry fits the device tool's 64 MiB, and
the very script a lease runs, end to end on a CPU (--cpu-smoke), so that a lease never meets an untested script."""

import importlib.util
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LEASE = ROOT / "benchmarks" / "lease"


def _wheels():
    spec = importlib.util.spec_from_file_location("lease_wheels", LEASE / "wheels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_lock_holds_exactly_what_the_pipeline_needs_and_the_gpu_image_lacks():
    w = _wheels()
    image = w.image_packages()
    assert {"torch", "transformers", "pandas", "pyarrow", "tokenizers", "pygments"} <= image
    want = w.needed(w.installed, image)  # from this environment's metadata, no network
    locked = {name: version for name, version, _, _ in w.read_lock()}
    assert locked == want  # rerun `python benchmarks/lease/wheels.py lock` when this fails
    assert {"snakemake", "datasets", "jsonschema"} <= set(locked) and not set(locked) & image


def test_a_package_the_image_has_is_neither_carried_nor_walked_into():
    w = _wheels()
    meta = {"snakemake": ("9.0", ["pandas>=2", "yte", "winreg-only; sys_platform == 'win32'",
                                  "pygments; extra == 'reports'"]),
            "yte": ("1.0", ["dpath"]), "dpath": ("2.0", []), "pygments": ("2.0", []),
            "pandas": ("3.0", ["not-installed-anywhere"])}
    got = w.needed(meta.get, image={"pandas"}, roots={"snakemake": ("reports",)})
    assert got == {"snakemake": "9.0", "yte": "1.0", "dpath": "2.0", "pygments": "2.0"}
    assert w.needed(meta.get, image={"pandas", "pygments"}, roots={"snakemake": ()}) == {
        "snakemake": "9.0", "yte": "1.0", "dpath": "2.0"}


def test_the_carry_fits_the_device_tools_limit():
    """The checkout's tracked files plus the locked wheels (sizes recorded by `wheels.py lock`) stay under 64 MiB."""
    w = _wheels()
    wheels = sum(size for *_, size in w.read_lock())
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    tracked = sum((ROOT / f).stat().st_size for f in files.split("\0") if f and (ROOT / f).is_file())
    print(f"carry: wheels {wheels / 2**20:.1f} MiB + checkout {tracked / 2**20:.1f} MiB")
    assert wheels + tracked < w.CARRY_LIMIT
    assert all(wheel.endswith(".whl") and size > 0 for _, _, wheel, size in w.read_lock())


def test_the_lease_config_is_the_four_default_schedules_on_a_gpu_with_two_seeds_or_more():
    import yaml

    cfg = yaml.safe_load((ROOT / "config" / "gpu-lease.yaml").read_text())
    default = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    assert cfg["schedules"] == default["schedules"] and len(cfg["seeds"]) >= 2
    assert cfg["device"] == "cuda" and cfg["data"]["finetune"]["kind"] == "synthetic"
    assert cfg["model"]["hidden_size"] == 512 and cfg["model"]["num_hidden_layers"] == 4  # BERT-small
    assert {s["on_unsupported"] for s in cfg["train"].values()} == {"skip"}  # no bf16 (V100, T4): skipped, recorded


@pytest.mark.slow
def test_the_lease_script_runs_the_pipeline_on_a_cpu(tmp_path):
    """benchmarks/lease/gpu_lease.sh --cpu-smoke: the real pipeline with config/gpu-lease.yaml scaled down, its
    report, job_overhead; lease.log and results.tar.gz (verdict, report, tables; no checkpoint) in $OUT."""
    out = tmp_path / "out"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "OUT": str(out), "PYTHON": sys.executable,
           "HOME": str(tmp_path), "PRECSWITCH_SITE": str(tmp_path / "site"),
           "LEASE_BUDGET_S": "1500"}  # a loaded CI machine: the GPU's 530 s budget is the lease's, not the smoke's
    t0 = time.monotonic()
    r = subprocess.run(["bash", str(LEASE / "gpu_lease.sh"), "--cpu-smoke"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    print(f"lease script --cpu-smoke: {time.monotonic() - t0:.0f} s wall")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert len(list(out.iterdir())) <= 8 and (out / "lease.log").is_file()
    with tarfile.open(out / "results.tar.gz") as t:
        names = t.getnames()
    base = "results/gpu-lease-smoke"
    for f in ("verdict.md", "report.html", "runs.csv", "schedules.csv"):
        assert f"{base}/{f}" in names, f
    assert not [n for n in names if "/checkpoint" in n]
    log = (out / "lease.log").read_text()
    assert "lease done in" in log and "seed3" not in log  # the lease config's 2 seeds, not the default's 3
    assert (out / "job_overhead.json").is_file()


def test_disk_of_a_gpu_config_counts_each_stage_1_checkpoint_in_its_dtype():
    import importlib.util as iu

    spec = iu.spec_from_file_location("gpu_hours", ROOT / "benchmarks" / "gpu_hours.py")
    gh = iu.module_from_spec(spec)
    spec.loader.exec_module(gh)
    cfg = gh.study_config(ROOT / "config" / "bert-small-scratch.yaml")
    d = gh.disk_bytes(cfg)
    # fp32, amp_fp16, amp_bf16, tf32 checkpoints in fp32 (4 bytes), pure_fp16 and pure_bf16 in 16 bits; 10 seeds
    assert d["checkpoints"] == d["parameters"] * (4 * 4 + 2 * 2) * 10
    assert 28e6 < d["parameters"] < 30e6  # BERT-small with BERT's 30522-token vocabulary
    lease = gh.disk_bytes(gh.study_config(ROOT / "config" / "gpu-lease.yaml"))
    assert lease["checkpoints"] == lease["parameters"] * 4 * 3 * 2  # 3 stage-1 precisions x 2 seeds
