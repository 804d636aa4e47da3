"""The one declaration of every study setting: ``workflow/schemas/config.schema.yaml`` (type, default, range,
description). The study (precswitch.study), ``precswitch train`` (precswitch.train.config) and the analysis
settings (precswitch.analysis.settings) read their defaults and bounds from here. Torch-free."""

from __future__ import annotations

import copy
import functools
import math
from pathlib import Path
from typing import Any

PATH = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


@functools.cache
def _load() -> dict:
    import yaml

    from .errors import PrecswitchError

    if not PATH.is_file():
        raise PrecswitchError(f"the workflow schema that declares every setting is missing: {PATH}")
    with open(PATH, encoding="utf-8") as f:
        return yaml.safe_load(f)


def load() -> dict:
    """The schema (a fresh copy)."""
    return copy.deepcopy(_load())


def node(*path: str) -> dict:
    """The schema of a top-level key's (nested) property, e.g. ``node("analysis", "margin")``."""
    n = _load()
    for key in path:
        n = n["properties"][key]
    return n


def defaults(*path: str) -> dict[str, Any]:
    """The default of every property of an object key, e.g. ``defaults("analysis")`` (a fresh copy)."""
    return copy.deepcopy({k: v.get("default") for k, v in node(*path)["properties"].items()})


def stage_train() -> dict:
    """``$defs/stage_train``: the keys of one training stage, with their generic defaults and bounds."""
    return _load()["$defs"]["stage_train"]


def stage_defaults(stage: str) -> dict[str, Any]:
    """The defaults of ``train.<stage>``: the generic ones of ``$defs/stage_train`` with the stage's own (the
    first ``allOf`` item of ``train.<stage>``); a stage label the schema does not know gets the generic ones."""
    values = {k: v.get("default") for k, v in stage_train()["properties"].items()}
    own = node("train")["properties"].get(stage)
    if own is not None:
        values.update({k: v["default"] for k, v in own["allOf"][0]["properties"].items()})
    return copy.deepcopy(values)


@functools.cache
def validator_class():
    """The schema's validator class with JSON Schema's "integer" narrowed to Python ints (JSON Schema counts 16.0
    as an integer; a count here is written without a decimal point)."""
    from jsonschema import validators

    base = validators.validator_for(_load())
    checker = base.TYPE_CHECKER.redefine("integer", lambda _c, x: isinstance(x, int) and not isinstance(x, bool))
    return validators.extend(base, type_checker=checker)


def validator(subschema: dict | None = None):
    """A strict-integer validator of the whole schema, or of ``subschema`` (its ``$ref``s resolve in the schema)."""
    whole = _load()
    return validator_class()(whole if subschema is None else {**subschema, "$defs": whole["$defs"]})


def key_of(error) -> str:
    """The dotted key a jsonschema error is about (``analysis.contrasts[0]``)."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")


def nonfinite(value, key: str = "") -> str | None:
    """The key of the first nan/inf number inside ``value`` (JSON Schema's bounds let nan through), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return key or "(top level)"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = nonfinite(v, f"{key}[{k}]" if isinstance(k, int) else f"{key}.{k}" if key else str(k))
        if found:
            return found
    return None


def allowed(node: dict) -> str:
    """What a schema node allows, in words: ``a positive integer``, ``a number in (0, 1]``, ``true or false``."""
    if "enum" in node:  # (compile's false is YAML's reading of an unquoted off)
        return ", ".join(repr(v) for v in node["enum"] if v is not False)
    types = [node["type"]] if isinstance(node.get("type"), str) else list(node.get("type") or [])
    if "integer" in types:
        lo, hi = node.get("minimum"), node.get("maximum")
        text = {1: "a positive integer", 0: "a non-negative integer"}.get(lo, "an integer" if lo is None
                                                                          else f"an integer >= {lo}")
        if hi is not None:
            bits = (hi + 1).bit_length() - 1
            text += f" below 2^{bits}" if hi + 1 == 2 ** bits and bits >= 16 else f" <= {hi}"
    elif "number" in types:
        lo, hi = node.get("exclusiveMinimum", node.get("minimum")), node.get("exclusiveMaximum", node.get("maximum"))
        left, right = "(" if "exclusiveMinimum" in node else "[", ")" if "exclusiveMaximum" in node else "]"
        if lo is not None and hi is not None:
            text = f"a number in {left}{lo:g}, {hi:g}{right}"
        elif lo is not None:
            text = f"a number {'>' if left == '(' else '>='} {lo:g}"
        else:
            text = "a number"
    elif "boolean" in types:
        text = "true or false"
    elif "object" in types:
        text = "a mapping"
    elif "string" in types:
        text = "text"
    else:
        text = "as the schema says"
    return text + (" or null" if "null" in types else "")


def problem(error) -> str:
    """A jsonschema ValidationError as ``<key> must be <allowed>, got <value>`` (the key, the value, what is
    allowed; not a dump of the schema)."""
    key = key_of(error) or "(top level)"
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        return f"unknown {key} key(s) {extra}; allowed: {', '.join(error.schema.get('properties', {}))}"
    if error.validator == "enum":
        from .catalog import NAMES, name_hint

        hint = name_hint(error.instance) if isinstance(error.instance, str) and set(
            error.validator_value) - {"same"} <= set(NAMES) else ""  # bf16: amp_bf16 or pure_bf16?
        return f"{key} {error.instance!r}: allowed {allowed(error.schema)}{hint}"
    if error.validator in ("type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum"):
        return f"{key} must be {allowed(error.schema)}, got {error.instance!r}"
    return f"{key}: {error.message}"
