"""Switch-point sweeps: the schedules a study config's ``sweeps:`` expands into.

One place for the workflow (``common.smk``'s ``expand_sweeps``, which also checks the sweep and tags its
runs) and ``benchmarks/gpu_hours.py``. A sweep names one stage with ``{precision, switch_to}`` and no
``switch_at`` (the swept stage) and a list ``switch_at`` of fractions f of that stage's steps run in
``precision`` before switching to ``switch_to``: f = 1 runs the whole stage in ``precision``, f = 0 in
``switch_to``. Point f is the schedule ``<name>-at<100 f>``.
"""

from __future__ import annotations

STAGES = ("pretrain", "finetune")


def swept_stages(sweep: dict) -> list[str]:
    """The stages of ``sweep`` given as ``{precision, switch_to}`` without ``switch_at`` (a valid sweep has one)."""
    return [st for st in STAGES if isinstance(sweep.get(st), dict)
            and sweep[st].get("switch_to") is not None and sweep[st].get("switch_at") is None]


def point_name(name: str, fraction: float) -> str:
    """``fp16-switch-at25`` for point 0.25 of sweep ``fp16-switch``."""
    return f"{name}-at{round(fraction * 100, 6):g}"


def point_stages(sweep: dict, stage: str, fraction: float) -> dict:
    """The schedule (stage -> precision or switch spec) of one point of ``sweep``, ``stage`` being the swept one."""
    first, then = sweep[stage]["precision"], sweep[stage]["switch_to"]
    stages = {st: sweep[st] for st in STAGES if st in sweep and st != stage}
    if fraction == 1:
        stages[stage] = first
    elif fraction == 0:
        stages[stage] = then
    else:
        stages[stage] = {"precision": first, "switch_to": then, "switch_at": fraction}
    return stages


def expand(sweeps: dict | None) -> dict[str, dict]:
    """Every point of every (valid) sweep: ``{schedule name: stages}``."""
    out = {}
    for name, sweep in (sweeps or {}).items():
        stage = swept_stages(sweep)[0]
        for f in sweep["switch_at"]:
            out[point_name(name, f)] = point_stages(sweep, stage, f)
    return out
