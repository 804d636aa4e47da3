"""GPU slots (faked device counts, real processes and real flocks), claims and provenance. Nothing here
needs a GPU."""

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import pytest

from precswitch import gpu
from precswitch.errors import PrecswitchError

CTX = mp.get_context("fork")


def _hold(lock_dir, n, got, release, env=None, timeout=20.0):
    """Child: take a slot, report (index, time), hold it until `release` is set."""
    if env:
        os.environ.update(env)
    with gpu.acquire_gpu_slot(lock_dir, n_devices=n, timeout=timeout, poll=0.05) as i:
        got.put((i, time.monotonic()))
        release.wait(30)
        got.put(("released", time.monotonic()))


def _hold_forever(lock_dir, n, got):
    with gpu.acquire_gpu_slot(lock_dir, n_devices=n, timeout=20, poll=0.05) as i:
        got.put(i)
        time.sleep(300)


@pytest.fixture
def no_cvd(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_two_gpus_two_processes_get_different_indices(tmp_path, no_cvd):
    got, release = CTX.Queue(), CTX.Event()
    procs = [CTX.Process(target=_hold, args=(tmp_path, 2, got, release)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        first = [got.get(timeout=30) for _ in range(2)]  # both hold at the same time
        assert sorted(i for i, _ in first) == [0, 1]
    finally:
        release.set()
        for p in procs:
            p.join(30)
    assert all(p.exitcode == 0 for p in procs)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["gpu-0.lock", "gpu-1.lock"]


def test_one_gpu_second_waits_until_first_releases(tmp_path, no_cvd):
    q1, q2, r1, r2 = CTX.Queue(), CTX.Queue(), CTX.Event(), CTX.Event()
    a = CTX.Process(target=_hold, args=(tmp_path, 1, q1, r1))
    a.start()
    try:
        idx_a, _ = q1.get(timeout=30)
        b = CTX.Process(target=_hold, args=(tmp_path, 1, q2, r2))
        b.start()
        time.sleep(1.0)
        assert q2.empty(), "second process got the only GPU while the first still held it"
        r1.set()
        _, released_at = q1.get(timeout=30)
        idx_b, got_at = q2.get(timeout=30)
        assert idx_a == idx_b == 0
        assert got_at >= released_at
        r2.set()
        b.join(30)
        assert b.exitcode == 0
    finally:
        r1.set()
        r2.set()
        a.join(30)


def test_a_job_waiting_for_a_gpu_says_so_once_naming_the_holder(tmp_path, no_cvd, monkeypatch, capsys):
    """A job queued behind another's GPU lock used to wait without a word in its log."""
    q = CTX.Queue()
    a = CTX.Process(target=_hold_forever, args=(tmp_path, 1, q))
    a.start()
    try:
        assert q.get(timeout=30) == 0
        monkeypatch.setattr(gpu, "WAIT_NOTICE_S", 0.1)
        with pytest.raises(gpu.GpuSlotTimeout):
            with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=0.5, poll=0.05):
                pass
        err = capsys.readouterr().err
        assert err.count("precswitch: waiting for a free GPU") == 1 and f"gpu-0: pid={a.pid} host=" in err, err
    finally:
        os.kill(a.pid, signal.SIGKILL)
        a.join(30)


def test_killed_holder_frees_its_slot(tmp_path, no_cvd):
    q = CTX.Queue()
    a = CTX.Process(target=_hold_forever, args=(tmp_path, 1, q))
    a.start()
    assert q.get(timeout=30) == 0
    with pytest.raises(gpu.GpuSlotTimeout, match="no free GPU slot"):
        with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=0.3, poll=0.05):
            pass
    os.kill(a.pid, signal.SIGKILL)  # crash: no cleanup code runs
    a.join(30)
    t0 = time.monotonic()
    with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=10, poll=0.05) as i:
        assert i == 0
    assert time.monotonic() - t0 < 5


def test_in_process_nesting_and_release(tmp_path, no_cvd):
    with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=1) as a:
        with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=1) as b:
            assert (a, b) == (0, 1)
            with pytest.raises(gpu.GpuSlotTimeout):
                with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=0.2, poll=0.05):
                    pass
        # released: index 1 is free again; indices= restricts the candidates
        with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=1, indices=[1]) as c:
            assert c == 1
    assert "pid=" in (tmp_path / "gpu-0.lock").read_text()


def test_cuda_visible_devices_names_physical_gpus(tmp_path, monkeypatch):
    # this process sees physical GPUs 3 and 1 as cuda:0 and cuda:1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert gpu.visible_device_ids(2) == ["3", "1"]
    with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=1) as i:
        assert i == 0 and (tmp_path / "gpu-3.lock").exists()
        # another job that sees only physical GPU 3 (as its cuda:0) must wait ...
        q, r = CTX.Queue(), CTX.Event()
        p = CTX.Process(target=_hold, args=(tmp_path, 1, q, r, {"CUDA_VISIBLE_DEVICES": "3"}, 0.5))
        p.start()
        p.join(30)
        assert p.exitcode != 0 and q.empty()  # timed out
        # ... one that sees only physical GPU 1 gets it, as its index 0
        q, r = CTX.Queue(), CTX.Event()
        p = CTX.Process(target=_hold, args=(tmp_path, 1, q, r, {"CUDA_VISIBLE_DEVICES": "1"}, 5))
        p.start()
        assert q.get(timeout=30)[0] == 0
        r.set()
        p.join(30)
        assert p.exitcode == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f1c2d3e-aaaa-bbbb-cccc-0123456789ab")
    assert gpu.visible_device_ids(1) == ["GPU-8f1c2d3e-aaaa-bbbb-cccc-0123456789ab"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-GPU-8f1c2d3e/1/0")
    assert gpu.visible_device_ids(2) == ["MIG-GPU-8f1c2d3e_1_0", "1"]


def test_errors_and_defaults(tmp_path, monkeypatch):
    with pytest.raises(PrecswitchError, match="no CUDA device is visible"):
        with gpu.acquire_gpu_slot(tmp_path, n_devices=0):
            pass
    # n_devices defaults to torch.cuda.device_count(): 0 on this CPU-only machine
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(PrecswitchError, match="no CUDA device"):
            with gpu.acquire_gpu_slot(tmp_path):
                pass
    monkeypatch.setenv(gpu.LOCK_DIR_ENV, str(tmp_path / "locks"))
    assert gpu.default_lock_dir() == tmp_path / "locks"
    monkeypatch.delenv(gpu.LOCK_DIR_ENV)
    assert gpu.default_lock_dir().name == __import__("socket").gethostname()


def test_claim_device(tmp_path, no_cvd):
    import torch

    assert gpu.claim_device(torch.device("cpu"), lock_dir=tmp_path) == torch.device("cpu")
    assert gpu.claim_info()["gpu_slot_index"] is None
    try:
        dev = gpu.claim_device("cuda", lock_dir=tmp_path, n_devices=2, timeout=1)
        assert dev == torch.device("cuda", 0)
        assert gpu.claim_device("cuda", lock_dir=tmp_path, n_devices=2) == dev  # idempotent
        info = gpu.claim_info()
        assert info["gpu_slot_index"] == 0 and info["gpu_slot_physical_id"] == "0"
        assert info["gpu_slot_wait_seconds"] >= 0 and info["gpu_lock_dir"] == str(tmp_path)
        with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=1) as other:
            assert other == 1  # the claim holds GPU 0
    finally:
        gpu.release_claim()
    assert gpu.claim_info()["gpu_slot_index"] is None  # an explicit cuda:N: test_claim_records_the_physical_gpu...


def test_slurm_jobs_lock_in_their_own_dir(monkeypatch):
    from precswitch import gpu

    monkeypatch.delenv(gpu.LOCK_DIR_ENV, raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    node = gpu.default_lock_dir()
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert gpu.default_lock_dir() == node / "slurm-4242"
    # an exported PRECSWITCH_GPU_LOCK_DIR reaches every SLURM job (--export=ALL): one dir for all of them
    # queued jobs holding different GPUs behind each other; each job still locks in its own
    monkeypatch.setenv(gpu.LOCK_DIR_ENV, "/x/locks")
    assert str(gpu.default_lock_dir()) == "/x/locks/slurm-4242"
    monkeypatch.delenv("SLURM_JOB_ID")
    assert str(gpu.default_lock_dir()) == "/x/locks"


def test_a_shared_lock_dir_makes_its_lock_files_writable_for_all(tmp_path):
    """Two users sharing a workstation share PRECSWITCH_GPU_LOCK_DIR: a lock file made 0644 by the umask
    gave the other user a PermissionError traceback."""
    import stat

    from precswitch import gpu

    old = os.umask(0o022)
    try:
        fd = gpu._try_lock(tmp_path / "gpu-0.lock")
    finally:
        os.umask(old)
    assert fd is not None
    os.close(fd)
    assert stat.S_IMODE((tmp_path / "gpu-0.lock").stat().st_mode) == 0o666
    locked = tmp_path / "ro"
    locked.mkdir()
    (locked / "gpu-0.lock").write_text("")
    (locked / "gpu-0.lock").chmod(0o444)
    if os.geteuid() == 0:
        return  # root opens it anyway: the refusal below cannot happen here
    with pytest.raises(PrecswitchError, match="is not writable by this user"):
        gpu._try_lock(locked / "gpu-0.lock")


def test_gpu_limit_note_says_when_the_limit_is_not_one_job_per_gpu():
    from precswitch.gpu import gpu_limit_note

    # one job per GPU, or a single job: nothing to say
    assert gpu_limit_note(2, 2, 10) is None
    assert gpu_limit_note(None, 4, 1) is None
    assert gpu_limit_note(8, 2, 2) is None  # 2 jobs on 2 GPUs, whatever the limit
    assert gpu_limit_note(1, 1, 10, "cuda:0") is None
    # no limit: every ready job starts, the extra ones wait for a lock
    note = gpu_limit_note(None, 2, 10)
    assert "no gpu resource limit" in note and "up to 10 training jobs" in note and "8 of them wait" in note
    assert "--resources gpu=2" in note
    # a limit above the GPU count
    note = gpu_limit_note(4, 2, 10)
    assert "limit is 4" in note and "2 of them wait" in note and "--resources gpu=2" in note
    # cuda:N pins every job to one GPU, however many are visible
    note = gpu_limit_note(4, 8, 10, "cuda:3")
    assert "uses GPU 3 only" in note and "3 of them wait" in note and "--resources gpu=1" in note
    # a limit below the GPU count leaves GPUs idle (unless there are fewer jobs than the limit)
    note = gpu_limit_note(1, 4, 10)
    assert "3 GPU(s) stay idle" in note and "--resources gpu=4" in note
    assert "--resources gpu=3" in gpu_limit_note(1, 4, 3)
    assert gpu_limit_note(2, 4, 2) is None


def test_a_slurm_job_removes_its_own_lock_dir(tmp_path, no_cvd, monkeypatch):
    """Each SLURM job locks in slurm-<job id>/ on the node; a finished job used to leave that dir (and its
    lock files) behind, one per job. Released, the job's dir goes; a file another process holds stays."""
    monkeypatch.setenv(gpu.LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    job_dir = tmp_path / "slurm-77"
    with gpu.acquire_gpu_slot(n_devices=2, timeout=1) as i:
        assert i == 0 and (job_dir / "gpu-0.lock").is_file()
    assert not job_dir.exists()
    # another process of the same job holds GPU 1: its file (and so the dir) stays, GPU 0's goes
    q, r = CTX.Queue(), CTX.Event()
    p = CTX.Process(target=_hold, args=(None, 2, q, r))
    p.start()
    try:
        assert q.get(timeout=30)[0] == 0
        with gpu.acquire_gpu_slot(n_devices=2, timeout=1) as i:
            assert i == 1
        assert sorted(f.name for f in job_dir.iterdir()) == ["gpu-0.lock"]
        with pytest.raises(gpu.GpuSlotTimeout):  # still held: the cleanup did not take it from its holder
            with gpu.acquire_gpu_slot(n_devices=2, timeout=0.2, poll=0.05, indices=[0]):
                pass
    finally:
        r.set()
        p.join(30)
    assert p.exitcode == 0 and not job_dir.exists()
    # a stage process (claim_device, held until the process ends) tidies up when it exits
    code = ("import sys; from precswitch import gpu; gpu.claim_device('cuda', n_devices=1, timeout=5); "
            "print(gpu.claim_info()['gpu_lock_dir'])")
    c = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, SLURM_JOB_ID="78"))
    assert c.returncode == 0, c.stderr[-2000:]
    assert c.stdout.strip() == str(tmp_path / "slurm-78") and not (tmp_path / "slurm-78").exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == []
    # outside SLURM the lock dir is the workstation's, shared by every run: it stays
    monkeypatch.delenv("SLURM_JOB_ID")
    with gpu.acquire_gpu_slot(n_devices=1, timeout=1):
        pass
    assert (tmp_path / "gpu-0.lock").is_file()


def test_a_slot_is_released_when_its_block_raises(tmp_path, no_cvd):
    """A training stage that fails inside the `with` must not keep its GPU: a later job (here another
    process) takes the same GPU at once."""
    with pytest.raises(RuntimeError, match="diverged"):
        with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=1) as i:
            assert i == 0
            raise RuntimeError("diverged")
    q, r = CTX.Queue(), CTX.Event()
    p = CTX.Process(target=_hold, args=(tmp_path, 1, q, r, None, 2.0))
    p.start()
    try:
        assert q.get(timeout=30)[0] == 0
    finally:
        r.set()
        p.join(30)
    assert p.exitcode == 0


def test_indices_outside_the_visible_devices_are_refused(tmp_path, no_cvd):
    """cuda:-1 or an empty candidate list is a caller's mistake: say so at once, instead of locking the
    last GPU under index -1 (torch's cuda:-1 is no GPU) or waiting forever for no GPU at all."""
    for indices in ([-1], [0, -2], [], [2]):
        with pytest.raises(PrecswitchError, match="out of range") as e:
            with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=0.2, poll=0.05, indices=indices):
                pass
        assert not isinstance(e.value, gpu.GpuSlotTimeout)
    assert list(tmp_path.iterdir()) == []  # nothing was locked


def test_claim_records_the_physical_gpu_and_makes_it_current(tmp_path, monkeypatch):
    """With CUDA_VISIBLE_DEVICES=5,7 the claim of cuda:1 is physical GPU 7 (its lock file and its
    provenance), and torch's current device is the one claimed, not the one asked for."""
    import torch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    set_to = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: set_to.append(torch.device(d)))
    try:
        assert gpu.claim_device("cuda:1", lock_dir=tmp_path, n_devices=2, timeout=1) == torch.device("cuda", 1)
        info = gpu.claim_info()
        assert (info["gpu_slot_index"], info["gpu_slot_physical_id"]) == (1, "7")
        assert set_to == [torch.device("cuda", 1)] and (tmp_path / "gpu-7.lock").is_file()
    finally:
        gpu.release_claim()
    # a plain "cuda" while another job holds physical GPU 5: the claim is cuda:1, and so is the current device
    with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=1) as held:
        assert held == 0
        try:
            assert gpu.claim_device("cuda", lock_dir=tmp_path, n_devices=2, timeout=1) == torch.device("cuda", 1)
            assert set_to[-1] == torch.device("cuda", 1) and gpu.claim_info()["gpu_slot_physical_id"] == "7"
        finally:
            gpu.release_claim()


def _fake_cuda(monkeypatch, props):
    """torch.cuda as on a machine whose visible devices have ``props`` (current device 0)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(props))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])


def _props(name, major, uuid, bus):
    import types

    return types.SimpleNamespace(name=name, major=major, minor=0, total_memory=80 << 30, multi_processor_count=108,
                                 uuid=uuid, pci_domain_id=0, pci_bus_id=bus, pci_device_id=0)


def _fake_nvml(monkeypatch, by_index: dict):
    """pynvml with two GPUs, found by their GPU- UUIDs, by NVML index only as ``by_index`` says, never by PCI id."""
    import types

    gpus = {"hA": ("GPU-aaaa", 250_000, 1530), "hC": ("GPU-cccc", 400_000, 1410)}

    def by_uuid(u):
        return {"GPU-aaaa": "hA", "GPU-cccc": "hC"}[u]  # a bare or MIG- uuid: KeyError, as NVML's not-found

    def by_pci(bus):
        raise RuntimeError("NVML_ERROR_NOT_FOUND")

    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlSystemGetDriverVersion=lambda: b"550.54",
        nvmlSystemGetCudaDriverVersion=lambda: 12040, nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetHandleByPciBusId=by_pci, nvmlDeviceGetHandleByIndex=lambda i: by_index[i],
        nvmlDeviceGetUUID=lambda h: gpus[h][0].encode(), nvmlDeviceGetEnforcedPowerLimit=lambda h: gpus[h][1],
        NVML_CLOCK_SM=0, NVML_CLOCK_MEM=1, nvmlDeviceGetMaxClockInfo=lambda h, kind: gpus[h][2] if kind == 0 else 1215)
    monkeypatch.setitem(sys.modules, "pynvml", fake)


def test_gpu_provenance_describes_the_gpu_asked_for(monkeypatch):
    """Provenance of cuda:1 with CUDA_VISIBLE_DEVICES=4,6: physical GPU 6's name, capability and NVML
    readings (NVML found by the GPU- prefixed UUID torch gives bare), not cuda:0's."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    _fake_cuda(monkeypatch, [_props("Fake V100", 7, "aaaa", 0x17), _props("Fake A100", 8, "cccc", 0x65)])
    _fake_nvml(monkeypatch, by_index={})  # only the UUID finds a GPU
    info = gpu.gpu_provenance(1)
    assert (info["gpu_index"], info["gpu_physical_id"], info["name"]) == (1, "6", "Fake A100")
    assert info["compute_capability"] == "8.0" and info["bf16_supported"] is True  # an A100 has native bf16
    assert (info["uuid"], info["power_limit_watts"], info["max_sm_clock_mhz"]) == ("GPU-cccc", 400.0, 1410)
    assert (info["driver_version"], info["nvml_cuda_driver_version"]) == ("550.54", "12.4")
    info = gpu.gpu_provenance()  # the current device: cuda:0, physical 4, a V100 (no native bf16)
    assert (info["gpu_index"], info["gpu_physical_id"], info["bf16_supported"]) == (0, "4", False)
    assert info["uuid"] == "GPU-aaaa"
    # no UUID from torch and no PCI match: the physical id (CUDA_VISIBLE_DEVICES' 6) is NVML's index, not cuda:1's 1
    _fake_cuda(monkeypatch, [_props("Fake V100", 7, None, 0x17), _props("Fake A100", 8, None, 0x65)])
    _fake_nvml(monkeypatch, by_index={4: "hA", 6: "hC"})
    info = gpu.gpu_provenance(1)
    assert info["uuid"] == "GPU-cccc" and info["power_limit_watts"] == 400.0


