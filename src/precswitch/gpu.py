"""GPU helpers: one timed training job per GPU on a workstation, and GPU provenance.

Snakemake never assigns GPU ids. With ``snakemake --cores all --resources gpu=k`` on a workstation
with k GPUs, up to k training jobs start at once, and each must pick a *different* GPU. They do so
here, with one lock file per GPU and ``fcntl.flock``:

* :func:`acquire_gpu_slot` tries the visible GPUs in order with a non-blocking ``flock``; the first
  free one is ours. If all are taken it polls until one is released (or ``timeout`` passes).
* A lock dies with its process (the kernel drops ``flock`` locks when the file descriptor is
  closed, also on a crash or ``kill -9``), so a crashed holder never leaves a stale slot.
* The index returned is an index into the *visible* devices (``cuda:<index>``, CUDA_VISIBLE_DEVICES
  semantics), but the lock file is named after the *physical* device (the CUDA_VISIBLE_DEVICES entry:
  an ordinal or a ``GPU-<uuid>``/``MIG-<uuid>``), so processes with different CUDA_VISIBLE_DEVICES
  still exclude each other correctly on the same physical GPU.
* The default lock directory is one per user and machine (``<tmp>/precswitch-gpu-locks-<uid>/<hostname>``):
  two studies of one user in two checkouts stay off each other's GPUs. Users who share a workstation
  share a directory by setting ``$PRECSWITCH_GPU_LOCK_DIR`` (its lock files are made writable for all).
  The host name keeps nodes apart if the directory is on a shared file system; a SLURM job locks in
  ``slurm-<job id>`` below either, as its GPUs are its own, and removes that dir when its slot is
  released (at the latest when the process exits normally; a killed job's dir stays, and its lock
  file is free).

Engines call :func:`claim_device` once per process (a stage is one process): it holds the slot
until the process exits.

flock on NFS: Linux emulates flock with POSIX byte-range locks on NFS, which work across clients
with NFSv4 but not with every NFS setup; keep the lock directory on a local disk (the default).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from .errors import PrecswitchError
from .io import flock_and_sign, lock_holder

LOCK_DIR_ENV = "PRECSWITCH_GPU_LOCK_DIR"


class GpuSlotTimeout(PrecswitchError):
    """No GPU slot became free within the timeout."""


def default_lock_dir() -> Path:
    """``$PRECSWITCH_GPU_LOCK_DIR``, else ``<tmp>/precswitch-gpu-locks-<uid>/<hostname>``.

    Inside a SLURM job (``SLURM_JOB_ID`` set) the scheduler already gave the job its own GPU(s), and
    every job on a node may see them as ``CUDA_VISIBLE_DEVICES=0``: a node-wide lock named ``gpu-0``
    would then make jobs on *different* GPUs wait for each other. So each SLURM job locks in a
    directory of its own (``.../slurm-<job id>``).
    """
    env = os.environ.get(LOCK_DIR_ENV)
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    base = Path(env) if env else Path(tempfile.gettempdir()) / f"precswitch-gpu-locks-{uid}" / socket.gethostname()
    job = os.environ.get("SLURM_JOB_ID")
    # also under $PRECSWITCH_GPU_LOCK_DIR, which every job inherits (the plugin submits with --export=ALL):
    # on a shared file system one dir for all would queue jobs holding different GPUs on different nodes
    return base / f"slurm-{job}" if job else base


def visible_device_ids(n_devices: int) -> list[str]:
    """Physical ids of the ``n_devices`` visible devices, for naming lock files.

    CUDA_VISIBLE_DEVICES="2,3" makes cuda:0 the physical GPU 2: its lock is ``gpu-2.lock``.
    Unset (or shorter than n_devices): the visible index itself. Characters that do not belong in a
    file name become ``_``.
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [str(i) for i in range(n_devices)]
    if env is None or env.strip() == "":
        return ids
    entries = [e.strip() for e in env.split(",")]
    for i in range(min(n_devices, len(entries))):
        e = entries[i]
        if e:  # old MIG ids look like MIG-GPU-<uuid>/1/0: keep them usable as file names
            ids[i] = "".join(c if c.isalnum() or c in "-_." else "_" for c in e)
    return ids


def _device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


#: after this many seconds of waiting for a GPU slot, say so (with the holders) on stderr
WAIT_NOTICE_S = 5.0


def _same_file(fd: int, path: Path) -> bool:
    """``fd`` is still the file at ``path`` (not one a SLURM job's cleanup unlinked meanwhile)."""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _try_lock(path: Path) -> int | None:
    """Open ``path`` and take an exclusive non-blocking flock; the fd, or None if held elsewhere.

    A flock taken on a file that was unlinked between our open and our flock (a finished SLURM job
    removes its lock dir: :func:`_remove_job_lock_dir`) is no lock on ``path``: let go, and try the
    file now at ``path`` (the dir made again if it went too)."""
    for _ in range(10):
        fd = _try_lock_once(path)
        if fd is None or _same_file(fd, path):
            return fd
        _release(fd)
    return None


def _try_lock_once(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except FileNotFoundError:  # the dir went (a SLURM job's cleanup, see _remove_job_lock_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        raise PrecswitchError(f"GPU lock file {str(path)!r} is not writable by this user: another user's "
                              "lock dir? Set PRECSWITCH_GPU_LOCK_DIR to a directory of your own, or make the "
                              "shared one's files group/world-writable") from None
    try:
        os.fchmod(fd, 0o666)  # the umask's 0644 would lock other users of a shared lock dir out
    except OSError:  # not our file: it already has its mode
        pass
    info = f"pid={os.getpid()} host={socket.gethostname()} since={time.strftime('%Y-%m-%dT%H:%M:%S')}\n"
    try:
        locked = flock_and_sign(fd, info)
    except OSError:
        os.close(fd)
        raise
    if not locked:
        os.close(fd)
        return None
    return fd


def _release(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _job_lock_dir(lock_dir: str | os.PathLike | None) -> Path | None:
    """The SLURM job's own lock dir (``.../slurm-<job id>``) when the slot is taken there, else None."""
    return default_lock_dir() if lock_dir is None and os.environ.get("SLURM_JOB_ID") else None


def _remove_job_lock_dir(d: Path) -> None:
    """Remove a SLURM job's own lock dir once its slot is released, so that finished jobs leave no
    ``slurm-<id>`` dirs behind on the node. A lock file is unlinked only while this process holds its
    flock, so one that another process of the job holds stays (and so does the dir); a process that
    opened a file just before it went finds that out (:func:`_try_lock`). A workstation's lock dir is
    shared by every run on it and is never removed."""
    for f in d.glob("gpu-*.lock"):
        try:
            fd = os.open(f, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _same_file(fd, f):
                f.unlink()
        except OSError:  # held by another process of this job, or already gone
            pass
        finally:
            os.close(fd)
    try:
        d.rmdir()
    except OSError:  # a lock file is left (held), or something else is in it
        pass


def _acquire(
    lock_dir: str | os.PathLike | None,
    n_devices: int | None,
    timeout: float | None,
    poll: float,
    indices: Sequence[int] | None,
) -> tuple[int, int, float]:
    """Block until a slot is ours: (index, fd, seconds waited)."""
    n = _device_count() if n_devices is None else int(n_devices)
    if n < 1:
        raise PrecswitchError(
            "no GPU slot to acquire: no CUDA device is visible "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
        )
    candidates = list(range(n)) if indices is None else [int(i) for i in indices]
    bad = [i for i in candidates if not 0 <= i < n]
    if bad or not candidates:
        raise PrecswitchError(f"GPU index(es) {bad or candidates} out of range: {n} visible device(s) (0..{n - 1})")
    d = Path(lock_dir) if lock_dir is not None else default_lock_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PrecswitchError(f"GPU lock dir {str(d)!r} cannot be created: {e.strerror}") from None
    ids = visible_device_ids(n)
    t0 = time.monotonic()
    said = False
    while True:
        for i in candidates:
            fd = _try_lock(d / f"gpu-{ids[i]}.lock")
            if fd is not None:
                return i, fd, time.monotonic() - t0
        waited = time.monotonic() - t0
        if not said and waited >= WAIT_NOTICE_S:  # a job waiting for a GPU says so in its log, once
            print(f"precswitch: waiting for a free GPU ({_holders(d, ids, candidates)}); lock files in {str(d)!r}",
                  file=sys.stderr, flush=True)
            said = True
        if timeout is not None and waited >= timeout:
            # the holders again: a timeout shorter than WAIT_NOTICE_S has named them nowhere else
            raise GpuSlotTimeout(
                f"no free GPU slot after {waited:.0f} s: all of GPU(s) {[ids[i] for i in candidates]} are held "
                f"by other jobs ({_holders(d, ids, candidates)}; lock files in {str(d)!r})"
            )
        time.sleep(poll if timeout is None else max(0.0, min(poll, timeout - waited)))


def _holders(d: Path, ids: list[str], candidates: Sequence[int]) -> str:
    """Who holds each candidate GPU, as its lock file says (``gpu-0: pid=... host=... since=...; ...``)."""
    return "; ".join(f"gpu-{ids[i]}: {lock_holder(d / f'gpu-{ids[i]}.lock')}" for i in candidates)


@contextlib.contextmanager
def acquire_gpu_slot(
    lock_dir: str | os.PathLike | None = None,
    n_devices: int | None = None,
    timeout: float | None = None,
    poll: float = 0.5,
    indices: Sequence[int] | None = None,
) -> Iterator[int]:
    """Hold one GPU for the ``with`` block; yields its index into the visible devices (``cuda:<index>``).

    ``n_devices`` defaults to ``torch.cuda.device_count()``; ``indices`` restricts the GPUs tried
    (e.g. ``[2]`` to wait for ``cuda:2`` only). Waits (polling every ``poll`` s) while every candidate
    is held; ``timeout`` seconds (None = forever) then raises :class:`GpuSlotTimeout`. Released when
    the block exits, and by the kernel if the process dies.
    """
    index, fd, _ = _acquire(lock_dir, n_devices, timeout, poll, indices)
    try:
        yield index
    finally:
        _release(fd)
        job_dir = _job_lock_dir(lock_dir)
        if job_dir is not None:
            _remove_job_lock_dir(job_dir)


def gpu_limit_note(limit: int | None, n_devices: int, n_jobs: int, device: str = "cuda") -> str | None:
    """What a local run's ``gpu`` resource limit means on this machine, when it is not one job per GPU.

    ``limit``: Snakemake's ``gpu`` limit (``--resources gpu=K``, the profile's ``resources:``; None when
    not set: no limit); ``n_devices``: visible GPUs; ``n_jobs``: training jobs that will run; ``device``:
    config ``device`` (``cuda:N`` pins every job to GPU N). More concurrent jobs than GPUs is not wrong
    (the extra ones wait for a GPU lock) but each waiting job holds its cores; fewer leaves GPUs idle.
    Returns a sentence for onstart's log, or None when the limit fits.
    """
    pinned = device.startswith("cuda:")
    slots = 1 if pinned else n_devices
    where = f"config device {device} uses GPU {device.split(':', 1)[1]} only" if pinned else (
        f"{n_devices} GPU(s) visible")
    if n_jobs <= 1 or slots < 1:
        return None
    concurrent = n_jobs if limit is None else min(limit, n_jobs)
    if concurrent > slots:
        said = "no gpu resource limit is set" if limit is None else f"the gpu resource limit is {limit}"
        return (f"{said} and {where}: up to {concurrent} training jobs start at once and "
                f"{concurrent - slots} of them wait for a GPU lock, holding their cores; "
                f"run with --resources gpu={slots}")
    if limit is not None and limit < slots and limit < n_jobs:
        return (f"the gpu resource limit is {limit} and {where}: {slots - limit} GPU(s) stay idle; "
                f"--resources gpu={min(slots, n_jobs)} runs one training job per GPU")
    return None


# ------------------------------------------------------------------ GPUs found without CUDA
def _nvidia_smi_list() -> str:
    """``nvidia-smi -L``'s output ('' without nvidia-smi or a driver)."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ""
    try:
        return subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def physical_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries, found WITHOUT initialising CUDA (no torch):
    the entries of CUDA_VISIBLE_DEVICES when it is set (up to the first invalid one, as CUDA reads it), else one
    ordinal per ``GPU N:`` line of ``nvidia-smi -L``; [] when neither names a GPU. The Snakefile counts them for
    the ``gpu`` limit (one training job per GPU) and :func:`pin_gpu` picks one of them."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        out = []
        for e in (x.strip() for x in env.split(",")):
            if not e or e.startswith("-"):  # CUDA stops at an invalid entry: "-1" hides every GPU
                break
            out.append(e)
        return out
    return [line.split(":", 1)[0].split()[1] for line in _nvidia_smi_list().splitlines()
            if line.startswith("GPU ") and ":" in line]


def pin_gpu(device: str, lock_dir: str | os.PathLike | None = None, timeout: float | None = None) -> str | None:
    """Give this process one GPU of its own BEFORE torch initialises CUDA: take a free GPU's slot lock and set
    ``CUDA_VISIBLE_DEVICES`` to that GPU alone, so the job sees it as ``cuda:0`` and can touch no other (a lock
    alone leaves a stray allocation, a library or a child process free to use GPU 0). ``device``: config
    ``device`` (``auto``/``cuda``: the first free GPU; ``cuda:N``: wait for GPU N; ``cpu``: nothing). Returns
    the CUDA_VISIBLE_DEVICES entry pinned, or None (a CPU job, or no GPU found without CUDA: then
    :func:`claim_device` locks through torch as before). The slot is held until the process exits;
    :func:`claim_device` then returns ``cuda:0``."""
    device = str(device)
    if device == "cpu" or "fd" in _HELD:
        return _HELD.get("pinned")
    gpus = physical_gpus()
    if not gpus or not (device in ("auto", "cuda") or device.startswith("cuda:")):
        return None
    indices = [int(device.split(":", 1)[1])] if device.startswith("cuda:") else None
    index, fd, waited = _acquire(lock_dir, len(gpus), timeout, 1.0, indices)
    pinned = gpus[index]
    os.environ["CUDA_VISIBLE_DEVICES"] = pinned
    _HELD.update(fd=fd, index=0, physical_id=visible_device_ids(1)[0], wait_seconds=waited, pinned=pinned,
                 lock_dir=str(Path(lock_dir) if lock_dir is not None else default_lock_dir()),
                 job_dir=_job_lock_dir(lock_dir))
    atexit.unregister(release_claim)
    atexit.register(release_claim)
    return pinned


# ------------------------------------------------------------------ one slot per process (engines)
_HELD: dict[str, Any] = {}


def claim_device(
    device: Any,
    lock_dir: str | os.PathLike | None = None,
    timeout: float | None = None,
    poll: float = 1.0,
    n_devices: int | None = None,
):
    """Claim a GPU slot for the rest of this process and return the ``torch.device`` to train on.

    ``device``: a ``torch.device`` (or string). CPU: returned unchanged, nothing locked.
    ``cuda`` (no index): the first free visible GPU. ``cuda:N``: waits for GPU N itself.
    The slot is held until the process exits (or :func:`release_claim`); claiming again in the same
    process returns the held device. Sets ``torch.cuda.set_device``. :func:`claim_info` tells how
    long the claim waited (for metrics.json).
    """
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return dev
    if "fd" in _HELD:
        if "device" not in _HELD:  # pinned by pin_gpu: its GPU is the only one visible
            _HELD["device"] = torch.device("cuda", 0)
            if torch.cuda.is_available():
                torch.cuda.set_device(_HELD["device"])
        return _HELD["device"]
    index, fd, waited = _acquire(lock_dir, n_devices, timeout, poll, None if dev.index is None else [dev.index])
    out = torch.device("cuda", index)
    if torch.cuda.is_available():
        torch.cuda.set_device(out)
    ids = visible_device_ids(_device_count() if n_devices is None else n_devices)
    _HELD.update(fd=fd, device=out, index=index, physical_id=ids[index], wait_seconds=waited,
                 lock_dir=str(Path(lock_dir) if lock_dir is not None else default_lock_dir()),
                 job_dir=_job_lock_dir(lock_dir))
    atexit.unregister(release_claim)
    atexit.register(release_claim)  # the process's end releases the flock anyway; this also tidies up
    return out


def claim_info() -> dict[str, Any]:
    """``{gpu_slot_index, gpu_slot_physical_id, gpu_slot_wait_seconds, gpu_lock_dir}`` (None when no claim)."""
    return {
        "gpu_slot_index": _HELD.get("index"),
        "gpu_slot_physical_id": _HELD.get("physical_id"),
        "gpu_slot_wait_seconds": _HELD.get("wait_seconds"),
        "gpu_lock_dir": _HELD.get("lock_dir"),
    }


def release_claim() -> None:
    """Release the slot held by :func:`claim_device` (normally the process exit does it)."""
    fd = _HELD.pop("fd", None)
    job_dir = _HELD.get("job_dir")
    _HELD.clear()
    if fd is not None:
        _release(fd)
        if job_dir is not None:
            _remove_job_lock_dir(job_dir)


# ------------------------------------------------------------------ provenance
def gpu_provenance(index: int | None = None) -> dict[str, Any] | None:
    """What GPU this is: name, compute capability, memory, driver, CUDA, cuDNN (None without CUDA).

    ``index``: visible device index (default: the current device). NVML fields (driver, UUID, power
    limit, clocks) are None when nvidia-ml-py or the driver's NVML is missing.
    """
    import torch

    if not torch.cuda.is_available():
        return None
    idx = torch.cuda.current_device() if index is None else int(index)
    props = torch.cuda.get_device_properties(idx)
    info: dict[str, Any] = {
        "gpu_index": idx,
        "gpu_physical_id": visible_device_ids(torch.cuda.device_count())[idx],
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "total_memory_bytes": int(props.total_memory),
        "multiprocessor_count": int(props.multi_processor_count),
        "cuda_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "torch_version": torch.__version__,
        "bf16_supported": props.major >= 8 or bool(torch.version.hip),  # native (is_bf16_supported counts emulation)
        "driver_version": None,
        "nvml_cuda_driver_version": None,
        "uuid": None,
        "power_limit_watts": None,
        "max_sm_clock_mhz": None,
        "max_mem_clock_mhz": None,
    }
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        info["driver_version"] = _s(pynvml.nvmlSystemGetDriverVersion())
        try:
            v = pynvml.nvmlSystemGetCudaDriverVersion()
            info["nvml_cuda_driver_version"] = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception:  # noqa: BLE001
            pass
        h = _nvml_handle_for(pynvml, idx, torch)
        if h is not None:
            for key, fn in (
                ("uuid", lambda: _s(pynvml.nvmlDeviceGetUUID(h))),
                ("power_limit_watts", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000),
                ("max_sm_clock_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
                ("max_mem_clock_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)),
            ):
                try:
                    info[key] = fn()
                except Exception:  # noqa: BLE001
                    pass
    except Exception:  # noqa: BLE001 - NVML is optional
        pass
    return info


def _s(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def _nvml_handle_for(pynvml, idx: int, torch):
    """NVML handle of visible device ``idx``. NVML ignores CUDA_VISIBLE_DEVICES: match by UUID, then PCI."""
    props = torch.cuda.get_device_properties(idx)
    uuid = getattr(props, "uuid", None)
    if uuid:
        u = str(uuid)
        # torch gives the bare UUID; NVML wants it prefixed, GPU- for a whole GPU, MIG- for a MIG slice
        # (whose PCI bus id below would name the whole parent GPU)
        for cand in ([u] if u.startswith(("GPU-", "MIG-")) else [f"GPU-{u}", f"MIG-{u}"]):
            try:
                return pynvml.nvmlDeviceGetHandleByUUID(cand)
            except Exception:  # noqa: BLE001
                pass
    try:
        bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        return pynvml.nvmlDeviceGetHandleByPciBusId(bus.upper())
    except Exception:  # noqa: BLE001
        pass
    try:
        phys = visible_device_ids(torch.cuda.device_count())[idx]
        if phys.startswith(("GPU-", "MIG-")):
            return pynvml.nvmlDeviceGetHandleByUUID(phys)
        return pynvml.nvmlDeviceGetHandleByIndex(int(phys))
    except Exception:  # noqa: BLE001
        return None
