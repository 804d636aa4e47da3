"""Which 16-bit types this CPU computes natively, and the one line a study prints when it cannot.

Torch-free (reads ``/proc/cpuinfo``), so the workflow can call it at start for free. On a CPU without a
bf16/fp16 fast path (AVX2 only: most laptops and many cloud CPUs) torch emulates 16-bit arithmetic, and an
``amp_bf16`` / ``amp_fp16`` run takes ~4-5x the time of its fp32 twin (docs/findings.md, 2026-12-02 and
2026-12-05); with AMX or AVX-512 BF16 a bf16 run is as fast as fp32 or faster (/work/shared/FACTS.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

#: x86 flags (``flags`` line) and Arm features (``Features`` line) that give each type a fast path
FAST_FLAGS = {
    "bf16": ("amx_bf16", "avx512_bf16", "bf16"),  # bf16: Arm's BFloat16 extension
    "fp16": ("amx_fp16", "avx512_fp16", "asimdhp"),  # asimdhp: Arm's half-precision SIMD
}
#: the precisions whose arithmetic is each 16-bit type (src/precswitch/catalog.py)
PRECISIONS_OF = {
    "bf16": ("amp_bf16", "pure_bf16", "pure_bf16_kahan", "pure_bf16_sr"),
    "fp16": ("amp_fp16", "pure_fp16"),
}


def cpu_flags(cpuinfo: str | None = None) -> set[str] | None:
    """The CPU's feature flags from ``/proc/cpuinfo`` text (read when not given), or None where there is none."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def cpu_fast_paths(flags: Iterable[str] | None = None) -> dict[str, bool] | None:
    """``{"bf16": bool, "fp16": bool}``: whether the CPU has a native path for each type; None if unknown."""
    found = cpu_flags() if flags is None else set(flags)
    if found is None:
        return None
    return {dtype: any(f in found for f in names) for dtype, names in FAST_FLAGS.items()}


def _stage_precisions(spec) -> list[str]:
    if spec is None:
        return []
    if isinstance(spec, str):
        return [spec]
    return [p for p in (spec.get("precision"), spec.get("switch_to")) if p]


def study_precisions(config: Mapping) -> set[str]:
    """Every precision a study's schedules and sweeps train in (both stages, both sides of a switch)."""
    out: set[str] = set()
    for group in ("schedules", "sweeps"):
        for sched in (config.get(group) or {}).values():
            for stage in ("pretrain", "finetune"):
                out.update(_stage_precisions(sched.get(stage)))
    return out


def study_time_note(config: Mapping, flags: Iterable[str] | None = None) -> str | None:
    """One line saying that this CPU computes the study's 16-bit precisions slowly, or None.

    None when the study trains on a GPU (``device`` cuda, or auto with an NVIDIA device present), when it
    uses no 16-bit precision, when the CPU has a fast path for every type it uses, or when the flags
    cannot be read."""
    device = str(config.get("device", "cpu"))
    if device.startswith("cuda") or (device == "auto" and flags is None and Path("/dev/nvidia0").exists()):
        return None
    paths = cpu_fast_paths(flags)
    if paths is None:
        return None
    used = study_precisions(config)
    slow = [p for dtype, has in paths.items() if not has for p in PRECISIONS_OF[dtype] if p in used]
    if not slow:
        return None
    missing = "/".join(dtype for dtype, has in paths.items() if not has)
    return (f"precswitch: this CPU has no {missing} fast path (no AMX or AVX-512 {missing.upper()}): "
            f"torch emulates it, so {', '.join(sorted(slow))} runs take ~4-5x fp32's time")
