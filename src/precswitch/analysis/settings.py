"""Analysis settings: the workflow schema's ``analysis`` defaults ← a settings file ← the CLI's options.

The defaults have one source, ``workflow/schemas/config.schema.yaml`` (``properties.analysis``); this module
reads them from there and checks the values a file or an option gives.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import PrecswitchError


def defaults() -> dict[str, Any]:
    """The schema's analysis defaults (a fresh copy each call)."""
    from ..schema import defaults as schema_defaults

    return schema_defaults("analysis")


def load_settings(path: str | os.PathLike | None = None, **overrides: Any) -> dict:
    """Analysis settings: defaults ← file (JSON or YAML; an ``analysis:`` section is used if present)
    ← overrides that are not None."""
    import copy

    settings = copy.deepcopy(defaults())
    raw = dict(_read_file(path)) if path is not None else {}
    raw.update({k: v for k, v in overrides.items() if v is not None})
    for k, v in raw.items():
        if k not in settings:
            raise PrecswitchError(f"unknown analysis setting '{k}'; allowed: {', '.join(sorted(settings))}")
        settings[k] = v
    settings["contrasts"] = _contrasts(settings["contrasts"])
    for key, whole in (("margin", False), ("alpha", False), ("power", False), ("bootstrap_resamples", True),
                       ("seed", True)):
        settings[key] = _number(key, settings[key], whole)
    _check_ranges(settings)
    settings["baseline"] = str(settings["baseline"])
    control = settings.get("positive_control")
    if control is not None and str(control) == settings["baseline"]:
        raise PrecswitchError(f"analysis setting 'positive_control' ({control}) is the baseline: name a schedule "
                              "known to be worse than it")
    return settings


def _read_file(path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise PrecswitchError(f"analysis settings file not found: {p}")
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix.lower() == ".json":
            raw = json.loads(text)
        else:
            import yaml

            raw = yaml.safe_load(text)
    except Exception as e:  # noqa: BLE001 - any parse error is a user error
        raise PrecswitchError(f"analysis settings file {p} cannot be parsed: {e}") from None
    raw = raw or {}
    if not isinstance(raw, dict):
        raise PrecswitchError(f"analysis settings file {p}: expected a mapping")
    return raw["analysis"] if isinstance(raw.get("analysis"), dict) else raw


def _contrasts(contrasts: Any) -> list[list[str]]:
    """[A, B] pairs; a pair given twice is one comparison (one row per metric, one Holm slot)."""
    contrasts = contrasts or []
    if not isinstance(contrasts, (list, tuple)):  # a bare 'A vs B' was read letter by letter
        raise PrecswitchError("analysis setting 'contrasts' must be a list of [A, B] pairs; "
                              f"got {type(contrasts).__name__} {contrasts!r}")
    pairs = []
    for c in contrasts:
        if not (isinstance(c, (list, tuple)) and len(c) == 2):
            raise PrecswitchError(f"analysis setting 'contrasts': entry {c!r} is not a pair [A, B]")
        a, b = str(c[0]), str(c[1])
        if a == b:
            raise PrecswitchError(f"analysis setting 'contrasts': entry {c!r} compares {a!r} with itself; "
                                  "give two different schedules")
        pairs.append((a, b))
    return [list(c) for c in dict.fromkeys(pairs)]


def _number(key: str, v: Any, whole: bool) -> float | int:
    """A number (a whole one for counts: 'bootstrap_resamples: .inf' raised OverflowError, 1.5 ran 1)."""
    try:
        if isinstance(v, bool):
            raise ValueError(v)
        x = float(v)
        if whole and not x.is_integer():
            raise ValueError(v)
    except (TypeError, ValueError, OverflowError):
        raise PrecswitchError(
            f"analysis setting '{key}' must be {'a whole number' if whole else 'a number'}, got {v!r}") from None
    return int(x) if whole else x


def _check_ranges(s: dict) -> None:
    if not 0 < s["alpha"] < 1:
        raise PrecswitchError(f"analysis setting 'alpha' must be in (0, 1), got {s['alpha']}")
    if not 0 < s["power"] < 1:
        raise PrecswitchError(f"analysis setting 'power' must be in (0, 1), got {s['power']}")
    if s["power"] <= s["alpha"]:
        raise PrecswitchError(
            f"analysis setting 'power' ({s['power']:g}) must exceed 'alpha' ({s['alpha']:g}): with no effect "
            "at all a test already rejects with probability alpha, so no number of seeds reaches such a power")
    if not 0 < s["margin"] <= 100:
        raise PrecswitchError(f"analysis setting 'margin' must be in (0, 100] accuracy points, got {s['margin']}")
    if s["bootstrap_resamples"] < 0:
        raise PrecswitchError("analysis setting 'bootstrap_resamples' must be >= 0 (0 = no bootstrap)")
