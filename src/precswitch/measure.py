"""Measurement: synchronized clocks, peak memory, provenance. One process per stage measures cleanly."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from . import cpu_isa


def sync(device: torch.device) -> None:
    """Wait for queued GPU work so a clock read means what it says (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------- memory
def _read_vm(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_peak_memory(device: torch.device) -> None:
    """Start a fresh peak: CUDA allocator stats, or the process high-water mark (VmHWM) on CPU."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def load_avg_1m() -> float | None:
    """The machine's 1-minute load average (runnable processes), or None where the OS has none.
    Above the CPU count, jobs compete for cores and CPU clocks stretch (caveat in the verdict)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def current_rss() -> int | None:
    return _read_vm("VmRSS")


def peak_memory(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        out = {
            "peak_memory_bytes": int(torch.cuda.max_memory_allocated(device)),
            "memory_kind": "cuda_max_allocated",
            "cuda_max_reserved_bytes": int(torch.cuda.max_memory_reserved(device)),
        }
        out["nvml_memory_used_bytes"] = nvml_memory_used(device)
        return out
    return {"peak_memory_bytes": _read_vm("VmHWM"), "memory_kind": "cpu_peak_rss", "cuda_max_reserved_bytes": None,
            "nvml_memory_used_bytes": None}


_NVML_HANDLES: dict[int, Any] = {}


def _nvml_handle(device: torch.device):
    """NVML handle of the CUDA device ``device`` (matched by UUID/PCI: NVML numbers GPUs its own way)."""
    try:
        import pynvml  # nvidia-ml-py

        from .gpu import _nvml_handle_for

        idx = device.index if device.index is not None else torch.cuda.current_device()
        if idx not in _NVML_HANDLES:
            pynvml.nvmlInit()
            _NVML_HANDLES[idx] = _nvml_handle_for(pynvml, idx, torch)
        return pynvml, _NVML_HANDLES[idx]
    except Exception:  # noqa: BLE001 - NVML is optional
        return None, None


def nvml_memory_used(device: torch.device) -> int | None:
    nv, h = _nvml_handle(device)
    if h is None:
        return None
    try:
        return int(nv.nvmlDeviceGetMemoryInfo(h).used)
    except Exception:  # noqa: BLE001
        return None


def nvml_energy_mj(device: torch.device) -> int | None:
    """Total energy counter in millijoules (Volta+), or None."""
    if device.type != "cuda":
        return None
    nv, h = _nvml_handle(device)
    if h is None:
        return None
    try:
        return int(nv.nvmlDeviceGetTotalEnergyConsumption(h))
    except Exception:  # noqa: BLE001
        return None


# ---------------------------------------------------------------- provenance
def git_commit() -> str | None:
    env = os.environ.get("PRECSWITCH_GIT_COMMIT")
    if env:
        return env
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except Exception:  # noqa: BLE001 - not a checkout
        return None


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def provenance(device: torch.device) -> dict[str, Any]:
    import datasets
    import transformers

    info: dict[str, Any] = {
        "device": device.type,
        "device_name": platform.processor() or platform.machine(),
        "gpu_index": None,
        "compute_capability": None,
        "cuda_version": torch.version.cuda,
        "cudnn_version": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "driver_version": None,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "datasets_version": datasets.__version__,
        "python_version": platform.python_version(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "git_commit": git_commit(),
        "hostname": socket.gethostname(),
        **cpu_isa.provenance(),  # the CPU capability, the cap in force and the flags that matter (cpu_isa.py)
    }
    if device.type == "cpu":
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    info["device_name"] = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
    else:
        idx = device.index if device.index is not None else torch.cuda.current_device()
        info["gpu_index"] = idx
        info["device_name"] = torch.cuda.get_device_name(idx)
        major, minor = torch.cuda.get_device_capability(idx)
        info["compute_capability"] = f"{major}.{minor}"
        nv, h = _nvml_handle(device)
        if nv is not None:
            try:
                info["driver_version"] = nv.nvmlSystemGetDriverVersion()
            except Exception:  # noqa: BLE001
                pass
    return info
