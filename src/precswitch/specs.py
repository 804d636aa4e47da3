"""Stage specs: how a schedule's stage is written in a study config, and what its run is called.

A stage is a precision name (``amp_fp16``), or a mapping ``{precision, switch_to, switch_at, overrides}``:

- ``switch_to`` / ``switch_at``: an in-stage switch, the first fraction ``switch_at`` of the steps in
  ``precision`` and the rest in ``switch_to``;
- ``overrides``: optimizer hyper-parameters (:data:`OVERRIDE_KEYS`) that this stage, in this schedule, runs with
  instead of ``train.<stage>``'s: e.g. pure_fp16 with ``adam_eps: 1.0e-4`` beside the faithful pure_fp16 in one
  study (docs/gpu.md, "AdamW epsilon and pure_fp16").

The name of a stage's run (its stage-1 directory, and the ``spec`` display column of the tables) is
``amp_fp16``, ``amp_fp16-to-fp32-at80`` (80% of the steps in amp_fp16) and, with overrides,
``pure_fp16-with-adam_eps0.0001`` (each key and its value's ``repr``, sorted by key): two stages get one
name only when they run the same precisions with the same hyper-parameters, so schedules share a stage-1 run
exactly when its training is the same. The name goes one way, structure → name: the tables carry the
structure as columns (``precision``, ``switch_to``, ``switch_at``, ``override_<key>``), so no reader parses
a name back.

One place for the workflow (``common.smk``), the analysis (``aggregate``'s spec column) and
``benchmarks/gpu_hours.py``. Torch-free.
"""

from __future__ import annotations

import math
from typing import Any

from .schema import load as _schema

#: train.<stage> keys a stage spec may override (the schema's $defs/overrides): the optimizer's recipe, which a
#: precision may need tuned (pure_fp16's adam_eps, a larger lr for pure_bf16's lost updates); not the keys that
#: fix the data seen, the step count or the measurement (batch_size, steps, max_length, ...), which pairing relies on
OVERRIDE_KEYS = tuple(_schema()["$defs"]["overrides"]["properties"])


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def stage_spec(value: Any) -> dict:
    """The normalised spec of one stage: ``{precision, switch_to, switch_at, overrides}`` (overrides a dict
    sorted by key, empty when none)."""
    if isinstance(value, str):
        return {"precision": value, "switch_to": None, "switch_at": None, "overrides": {}}
    overrides = value.get("overrides") or {}
    return {
        "precision": value.get("precision"),
        "switch_to": value.get("switch_to"),
        "switch_at": value.get("switch_at"),
        "overrides": {k: overrides[k] for k in sorted(overrides)},
    }


def run_spec(value: Any) -> dict:
    """The stage a schedule runs: switch_at 1 runs every step in its first precision, which is the run of that
    precision without a switch (as a sweep's point 1 is written), so that schedules share it instead of training
    a copy of it under another name. Overrides are kept."""
    spec = stage_spec(value)
    if spec["switch_at"] == 1:
        spec.update(switch_to=None, switch_at=None)
    return spec


def percent(fraction: float) -> str:
    """A switch point as a name has it: the percent with 6 decimals, shortest form (``80``, ``12.5``)."""
    return f"{round(float(fraction) * 100, 6):g}"


def overrides_suffix(overrides: dict | None) -> str:
    """``-with-adam_eps0.0001-lr2e-05`` for ``{adam_eps: 1e-4, lr: 2e-5}``; ``""`` for none. ``repr`` of the
    float: the shortest text that reads back as the same value, so two different values never share a name."""
    if not overrides:
        return ""
    return "-with-" + "-".join(f"{k}{float(overrides[k])!r}" for k in sorted(overrides))


def spec_name(spec: dict) -> str:
    """The run name of a (normalised or raw) stage spec: ``amp_fp16``, ``amp_fp16-to-fp32-at80``,
    ``pure_fp16-with-adam_eps0.0001``."""
    name = str(spec["precision"])
    if not _missing(spec.get("switch_to")) and not _missing(spec.get("switch_at")):
        name += f"-to-{spec['switch_to']}-at{percent(spec['switch_at'])}"
    return name + overrides_suffix(spec.get("overrides"))
