"""One training job per GPU, pinned by CUDA_VISIBLE_DEVICES before CUDA starts (precswitch.gpu.pin_gpu), and
the GPU count the workflow uses as its `gpu` limit (physical_gpus): fake GPUs, no GPU or torch CUDA needed."""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from precswitch import gpu

SRC = str(Path(__file__).resolve().parents[1] / "src")
SMI = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb)
  MIG 1g.10gb     Device  0: (UUID: MIG-cccc)
GPU 2: Tesla V100-SXM2-16GB (UUID: GPU-dddd)
"""


def test_gpus_are_counted_from_nvidia_smi_without_cuda(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu, "_nvidia_smi_list", lambda: SMI)
    assert gpu.physical_gpus() == ["0", "1", "2"]  # the MIG line is a slice of GPU 1, not a GPU
    monkeypatch.setattr(gpu, "_nvidia_smi_list", lambda: "")  # no nvidia-smi, no driver
    assert gpu.physical_gpus() == []


@pytest.mark.parametrize("cvd, expected", [("2,3", ["2", "3"]), ("GPU-bbbb", ["GPU-bbbb"]), ("", []),
                                           ("-1", []), ("1,-1,2", ["1"])])
def test_cuda_visible_devices_wins_over_nvidia_smi(monkeypatch, cvd, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cvd)
    monkeypatch.setattr(gpu, "_nvidia_smi_list", lambda: SMI)
    assert gpu.physical_gpus() == expected


def _pin_in_a_process(lock_dir, cvd, device="cuda", timeout=None):
    """A `precswitch train`-like process: pins, prints the CUDA_VISIBLE_DEVICES it got, holds until stdin closes."""
    code = ("import os, sys; from precswitch import gpu; "
            f"got = gpu.pin_gpu({device!r}, lock_dir={str(lock_dir)!r}, timeout={timeout!r}); "
            "print(got, os.environ.get('CUDA_VISIBLE_DEVICES'), flush=True); sys.stdin.read()")
    env = {**os.environ, "PYTHONPATH": SRC, "CUDA_VISIBLE_DEVICES": cvd}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_k_jobs_on_k_gpus_each_see_only_their_own(tmp_path):
    """Two fake GPUs (physical 3 and 5): two jobs at once get one each, as their only visible GPU; a third job
    waits for a lock and times out while both are held."""
    procs = [_pin_in_a_process(tmp_path, "3,5") for _ in range(2)]
    try:
        lines = sorted(p.stdout.readline().split() for p in procs)
        assert lines == [["3", "3"], ["5", "5"]]
        third = _pin_in_a_process(tmp_path, "3,5", timeout=1)
        out, err = third.communicate("", timeout=60)
        assert third.returncode != 0 and "GpuSlotTimeout" in err
    finally:
        for p in procs:
            p.communicate("", timeout=30)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["gpu-3.lock", "gpu-5.lock"]


def test_a_released_gpu_is_pinned_by_the_next_job(tmp_path):
    first = _pin_in_a_process(tmp_path, "0")
    assert first.stdout.readline().split() == ["0", "0"]
    first.communicate("", timeout=30)  # the job ends: the kernel drops its lock
    second = _pin_in_a_process(tmp_path, "0", timeout=10)
    assert second.stdout.readline().split() == ["0", "0"]
    second.communicate("", timeout=30)


def test_cuda_n_pins_gpu_n_and_cpu_pins_nothing(tmp_path, monkeypatch):
    p = _pin_in_a_process(tmp_path, "4,6,8", device="cuda:1")
    assert p.stdout.readline().split() == ["6", "6"]
    p.communicate("", timeout=30)
    p = _pin_in_a_process(tmp_path, "4,6", device="cpu")
    assert p.stdout.readline().split() == ["None", "4,6"]  # a CPU job keeps its environment
    p.communicate("", timeout=30)
    # auto on a machine without a GPU: nothing pinned, the job trains on the CPU
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(gpu, "_nvidia_smi_list", lambda: "")
    assert gpu.pin_gpu("auto", lock_dir=tmp_path) is None and "CUDA_VISIBLE_DEVICES" not in os.environ


def test_after_pinning_the_engine_claims_cuda_0_the_pinned_gpu(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,7")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    try:
        assert gpu.pin_gpu("cuda:1", lock_dir=tmp_path) == "7"
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "7"
        assert gpu.claim_device("cuda:1") == torch.device("cuda", 0)  # its only visible GPU
        info = gpu.claim_info()
        assert (info["gpu_slot_index"], info["gpu_slot_physical_id"]) == (0, "7")
    finally:
        gpu.release_claim()


def test_attention_kernel_auto_is_sdpa_on_cuda_and_eager_on_a_cpu():
    import torch

    from precswitch.train.engine import inputs as engine

    assert engine._attn_kernel("auto", torch.device("cuda", 0)) == "sdpa"
    assert engine._attn_kernel("auto", torch.device("cpu")) == "eager"
    assert engine._attn_kernel("auto", None) == "eager"
    assert engine._attn_kernel("eager", torch.device("cuda")) == "eager"  # an explicit kernel is kept
    assert engine._attn_kernel("sdpa", torch.device("cpu")) == "sdpa"


@pytest.mark.slow
@pytest.mark.parametrize("extra, limit", [((), "3"), (("--resources", "gpu=1"), None)])
def test_a_local_run_limits_gpu_jobs_to_the_gpus_it_finds_unless_told(tmp_path, monkeypatch, extra, limit):
    """Three fake GPUs (CUDA_VISIBLE_DEVICES=5,6,7) and device cuda: a run whose training jobs use a GPU sets its
    gpu limit to the 3 it finds as it starts, and says so; --resources gpu=1 overrides it (no line then). Torch
    sees none of the fake GPUs, so onstart then refuses the run, before any job."""
    from workflow_helpers import CONFIGS, snakemake

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6,7")
    r = snakemake(tmp_path, "--cores", "1", *extra, "--configfile", CONFIGS / "tiny.yaml", "--config", "device=cuda",
                  timeout=300)
    assert r.returncode == 1 and "no CUDA GPU" in r.stderr, r.stderr[-3000:]
    found = re.search(r"precswitch: gpu limit (\d+) \((\d+) GPU\(s\) found", r.stdout + r.stderr)
    assert (found.groups() if found else None) == (limit and (limit, "3"))
