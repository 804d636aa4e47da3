"""Switch-point sweeps: the schedules a study config's ``sweeps:`` expands into.

One place for the workflow (``precswitch.study``, which also checks the sweep and tags its
runs) and ``benchmarks/gpu_hours.py``. A sweep names one stage with ``{precision, switch_to}`` and no
``switch_at`` (the swept stage) and a list ``switch_at`` of fractions f of that stage's steps run in
``precision`` before switching to ``switch_to``: f = 1 runs the whole stage in ``precision``, f = 0 in
``switch_to``. Point f is the schedule ``<name>-at<100 f>``.
"""

from __future__ import annotations

from .specs import percent

STAGES = ("pretrain", "finetune")


def swept_stages(sweep: dict) -> list[str]:
    """The stages of ``sweep`` given as ``{precision, switch_to}`` without ``switch_at`` (a valid sweep has one)."""
    return [st for st in STAGES if isinstance(sweep.get(st), dict)
            and sweep[st].get("switch_to") is not None and sweep[st].get("switch_at") is None]


def point_name(name: str, fraction: float) -> str:
    """``fp16-switch-at25`` for point 0.25 of sweep ``fp16-switch``."""
    return f"{name}-at{percent(fraction)}"


def point_stages(sweep: dict, stage: str, fraction: float) -> dict:
    """The schedule (stage -> precision or stage spec) of one point of ``sweep``, ``stage`` being the swept one
    (its overrides, if any, apply at every point)."""
    first, then = sweep[stage]["precision"], sweep[stage]["switch_to"]
    overrides = {"overrides": sweep[stage]["overrides"]} if sweep[stage].get("overrides") else {}
    stages = {st: sweep[st] for st in STAGES if st in sweep and st != stage}
    if fraction == 1:
        stages[stage] = {"precision": first, **overrides} if overrides else first
    elif fraction == 0:
        stages[stage] = {"precision": then, **overrides} if overrides else then
    else:
        stages[stage] = {"precision": first, "switch_to": then, "switch_at": fraction, **overrides}
    return stages


def expand(sweeps: dict | None, schedules: dict | None = None) -> dict[str, dict]:
    """Every point of every sweep: ``{schedule name: stages}``.

    Refuses, as the workflow does (``precswitch.study``, same messages), a sweep that does not sweep
    exactly one stage, two points of a sweep that get one name, and a point named like one of ``schedules``: an
    IndexError, or points silently dropped or replacing a schedule, before.
    """
    from .errors import PrecswitchError

    out: dict[str, dict] = {}
    for name, sweep in (sweeps or {}).items():
        swept = swept_stages(sweep)
        if len(swept) != 1:
            raise PrecswitchError(
                f"config key sweeps.{name}: exactly one stage must be swept: give it {{precision: P, switch_to: Q}} "
                "without switch_at, e.g. {pretrain: amp_fp16, finetune: {precision: amp_fp16, switch_to: fp32}, "
                "switch_at: [0.0, 0.5, 1.0]}")
        at: dict[str, float] = {}
        for i, f in enumerate(sweep["switch_at"]):
            schedule = point_name(name, f)
            if schedule in at:
                raise PrecswitchError(
                    f"config key sweeps.{name}.switch_at[{i}]: {f} and {at[schedule]} give one schedule name, "
                    f"{schedule!r}; make them equal or further apart")
            if schedule in (schedules or {}) or schedule in out:
                raise PrecswitchError(
                    f"config key sweeps.{name}: schedule {schedule!r} (sweep point {f}) is already a schedule; "
                    "rename the sweep or the schedule")
            at[schedule] = f
            out[schedule] = point_stages(sweep, swept[0], f)
    return out
