"""The CPU instruction set training runs on (config key ``cpu_isa``, ``precswitch train --cpu-isa``).

oneDNN and ATen pick their kernels by what the CPU has, so one study gives other last digits on an AVX-512 or
AMX CPU than on an AVX2 one. Capping both libraries at one level (the environment variables they read when
torch starts) makes CPUs that have it compute alike: an AVX-512 BF16 EPYC capped at avx2 reproduced an AVX2
EPYC's study to every digit (docs: README, "Reproduce these numbers elsewhere"). Torch-free: :func:`apply`
must run before ``import torch``; the workflow checks a config with :func:`problem`.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from .errors import PrecswitchError

ONEDNN, ATEN = "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"
#: level -> (ONEDNN_MAX_CPU_ISA, ATEN_CPU_CAPABILITY, the CPU flags both need); native sets nothing
LEVELS = {
    "native": (None, None, ()),
    "avx2": ("AVX2", "avx2", ("avx2", "fma")),
    "avx512": ("AVX512_CORE", "avx512", ("avx512f", "avx512bw", "avx512vl", "avx512dq")),
}
#: the flags every run records: they decide whether 16-bit matmuls run natively or are emulated
RECORDED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


@functools.cache
def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags (the first ``flags`` line of /proc/cpuinfo); empty where there is none."""
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def problem(level: str, flags: set[str] | frozenset[str] | None = None) -> str | None:
    """Why ``level`` cannot run on this CPU (one line, for ``cpu_isa: <problem>``), or None."""
    if level not in LEVELS:
        return f"{level!r}: allowed {', '.join(LEVELS)}"
    flags = cpu_flags() if flags is None else flags
    lacks = [f for f in LEVELS[level][2] if f not in flags]
    if not lacks:
        return None
    usable = [lvl for lvl, (_, _, need) in LEVELS.items() if set(need) <= flags]
    return f"{level} needs CPU flags this CPU lacks ({' '.join(lacks)}); use {' or '.join(usable)}"


def apply(level: str, environ=os.environ) -> None:
    """Cap oneDNN and ATen at ``level`` in ``environ`` (native: nothing, whatever it holds stays). In the running
    process only before torch is imported: later, the libraries have read their caps already."""
    onednn, aten, _ = LEVELS[level]
    if onednn is None:
        return
    if environ is os.environ and "torch" in sys.modules and (environ.get(ONEDNN), environ.get(ATEN)) != (onednn, aten):
        raise PrecswitchError(f"cpu_isa {level}: torch is already imported in this process, so the cap would not "
                              "hold; run the stage with `precswitch train` (a fresh process)")
    environ[ONEDNN], environ[ATEN] = onednn, aten


def in_force(environ=os.environ) -> str | None:
    """The level this process's environment caps torch at: native (neither variable set), a level, or None
    (another cap set by hand: ``onednn_max_cpu_isa`` and ``cpu_capability`` say which)."""
    pair = ((environ.get(ONEDNN) or "").upper() or None, (environ.get(ATEN) or "").lower() or None)
    return next((lvl for lvl, (o, a, _) in LEVELS.items() if (o, a) == pair), None)


def provenance() -> dict:
    """What a run records of its CPU: the capability ATen dispatches to, the cap in force, the flags that matter."""
    import torch

    flags = cpu_flags()
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_isa": in_force(),
            "onednn_max_cpu_isa": os.environ.get(ONEDNN) or None,
            "cpu_flags": " ".join(f for f in RECORDED_FLAGS if f in flags)}
