"""Cross-key rules of one training stage, written once: the study (precswitch.study, which names the config key)
and ``precswitch train`` (precswitch.train.config.resolve) both call them. Each returns ``None`` or the problem
as ``(key, text)``, ``key`` relative to the stage (``switch_to``, ``compile``, ...; "" for the stage itself).
Torch-free."""

from __future__ import annotations

from .catalog import NAMES, SPECS
from .errors import PrecswitchError


def compile_mode(value):
    """YAML reads an unquoted ``compile: off`` as false: one spelling, "off", from here on."""
    return "off" if value is False else value


def compile_telemetry(compile, telemetry_every):
    """Activation telemetry hooks run in eager mode only."""
    if compile_mode(compile) == "off" or not telemetry_every:
        return None
    return "compile", (f"{compile!r} with telemetry_every {telemetry_every}: activation telemetry hooks run in eager "
                       "mode only; set compile: off or telemetry_every: 0")


def steps_epochs(steps, epochs):
    """A stage's length is steps or epochs, never both nor neither."""
    if (steps is None) != (epochs is None):
        return None
    return "steps", f"set exactly one of steps and epochs (the other null); got steps={steps}, epochs={epochs}"


def storage(name: str) -> tuple:
    """How a precision stores and updates the weights: what an in-stage switch must keep."""
    p = SPECS[name]
    return p.param_dtype, p.update_compensation, p.fp8_linear


def switch(precision, switch_to, switch_at):
    """An in-stage switch: switch_to and switch_at go together, and both precisions store the weights the same way
    (switch_at's range is the schema's)."""
    if (switch_to is None) != (switch_at is None):  # the stage's problem, not one key's
        return "", "switch_to and switch_at go together: set both (or neither)"
    if switch_to is None:
        return None
    if storage(precision) != storage(switch_to):
        same = [p for p in NAMES if p != precision and storage(p) == storage(precision)]
        return "switch_to", (f"cannot switch from {precision!r} to {switch_to!r} inside a stage: their weights are "
                             f"stored differently; allowed from {precision}: {', '.join(same) or 'none'} "
                             "(or use two stages)")
    return None


def _fraction_at(step: int, total: int) -> str:
    """``step / total`` as a switch_at to print: 4 significant digits, more where those would round to another step."""
    for digits in range(4, 18):
        text = f"{step / total:.{digits}g}"
        if int(round(float(text) * total)) == step:
            return text
    return repr(step / total)


def switch_step(hp: dict, total_steps: int) -> int | None:
    """The step of an in-stage switch, ``round(switch_at * total_steps)`` (None: the stage does not switch).

    Refuses (PrecswitchError naming switch_at) a switch point that rounds to step 0 (the whole stage would
    run in switch_to) or, for a switch_at below 1, to the last step (the stage would never switch): either
    run would be recorded as a switch it never made. switch_at 1 is kept: all steps in precision (no switch).
    The study and ``resolve`` check a ``steps`` stage; the engine checks an ``epochs`` stage once its data gives
    the steps."""
    if hp["switch_to"] is None:
        return None
    at, total = hp["switch_at"], int(total_steps)
    step = int(round(at * total))
    if 0 < step < total or at == 1:
        return step
    first, then = hp["precision"], hp["switch_to"]
    where = f"switch_at {at!r} of {total} step{'s' if total != 1 else ''} rounds to step {step}"
    if total < 2:
        raise PrecswitchError(f"{where}: a 1-step stage cannot switch part-way (a switch needs at least 2 steps); "
                              f"run it in {first} or {then} without switch_to/switch_at")
    if step == 0:
        raise PrecswitchError(
            f"{where}: the whole stage would run in {then}, not switch from {first}; use switch_at >= "
            f"{_fraction_at(1, total)} (the earliest switch: after step 1 of {total}), or drop switch_to/switch_at "
            f"and use precision {then}")
    raise PrecswitchError(
        f"{where}, the end of the stage: it would never switch to {then}; use switch_at <= "
        f"{_fraction_at(total - 1, total)} (the latest switch: after step {total - 1} of {total}), or drop "
        f"switch_to/switch_at to run the whole stage in {first}")


def stage_problem(hp: dict):
    """The first broken cross-key rule of one stage's settings (a ``precision``, its optional ``switch_to`` /
    ``switch_at``, and train.<stage>'s keys), or None. The order is the order the messages are said in."""
    for why in (switch(hp["precision"], hp.get("switch_to"), hp.get("switch_at")),
                compile_telemetry(hp["compile"], hp["telemetry_every"]),
                steps_epochs(hp["steps"], hp["epochs"])):
        if why:
            return why
    if hp.get("switch_to") is not None and hp["steps"] is not None:
        try:
            switch_step(hp, hp["steps"])
        except PrecswitchError as e:
            return "switch_at", str(e)
    return None
