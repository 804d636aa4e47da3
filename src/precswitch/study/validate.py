"""Reading a study config: the JSON schema (workflow/schemas/config.schema.yaml, through Snakemake's validate,
which fills its defaults), the YAML traps before it, and how a mistake is said: a :class:`ConfigError`, one
line ``config key <key>: <problem>`` (docs/errors.md)."""

from __future__ import annotations

import copy
import math

from .. import schema
from ..errors import PrecswitchError


class ConfigError(PrecswitchError):
    """A config mistake, one line naming the key: ``config key <key>: <problem>``."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"config key {key}: {problem}")
        self.key = key


def refuse(error) -> None:
    """End the workflow on a config mistake with one line (the key, the value, what is allowed): no Snakemake
    frames around it (the Snakefile calls this for every ConfigError)."""
    import sys

    print(f"Error: {error}", file=sys.stderr)
    sys.exit(1)


def validate(config: dict) -> dict:
    """The JSON schema, through Snakemake's ``validate`` (which fills the schema's defaults into ``config`` in
    place): what it refuses becomes one :func:`schema_error` line. Returns ``config``. Before it, every mapping
    key must be text (:func:`_check_keys_are_text`); after it, an integer key must hold an integer, not a
    whole-number float (:func:`_check_integers`)."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate as snakemake_validate

    _check_keys_are_text(config, "")
    try:
        snakemake_validate(config, str(schema.PATH))
    except WorkflowError as e:
        error = e.__cause__ or e.__context__
        if not hasattr(error, "absolute_path"):  # not a schema violation: Snakemake's own message
            raise
        raise schema_error(error) from None
    _check_integers(config)
    return config


# YAML 1.1 (PyYAML, Snakemake's loader) reads these unquoted words as booleans or null
_YAML_WORDS = {True: "on, yes, true, y", False: "off, no, false, n", None: "null, ~ or nothing"}


def _check_keys_are_text(value, key):
    """Every mapping key of the config is text. YAML reads an unquoted schedule name `on:` as the boolean true,
    `null:` as None and `2024:` as a number; later code joins and compares names as text. One line naming it."""
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                where = f"{key}.{k}" if key else str(k)
                what = (f"the {type(k).__name__} {k!r}" if k is not None else "null")
                read = (f" (YAML reads an unquoted {_YAML_WORDS[k]} as {k!r})"
                        if k is None or isinstance(k, bool) else " (YAML reads an unquoted number as a number)")
                example = {True: "on", False: "off", None: "null"}.get(k, k) if not isinstance(k, (int, float)) or \
                    isinstance(k, bool) else k
                raise ConfigError(where, f"the name is {what}, not text{read}; quote the name, e.g. '{example}':")
            _check_keys_are_text(v, f"{key}.{k}" if key else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_keys_are_text(v, f"{key}[{i}]")



def _float_errors(errors):
    """The type errors of a float where an integer is meant, also inside oneOf/anyOf alternatives."""
    for e in errors:
        if e.validator == "type" and isinstance(e.instance, float) and "integer" in _as_list(e.validator_value):
            yield e
        yield from _float_errors(e.context or [])


def _as_list(value):
    return [value] if isinstance(value, str) else list(value or [])


def _check_integers(config: dict) -> None:
    """One rule for every integer key: a float (16.0, 1e3) is refused now, naming the key, not after stage 1
    (JSON Schema counts 16.0 as an integer; precswitch.schema's validator does not)."""
    error = next(_float_errors(schema.validator().iter_errors(config)), None)
    if error is not None:
        v = error.instance
        whole = f"write {int(v)}" if math.isfinite(v) and v == int(v) else "give a whole number"
        raise ConfigError(schema.key_of(error), f"{v!r} is not an integer (this key counts, without a decimal point: "
                                                f"{whole})")


def schema_error(error) -> ConfigError:
    """A jsonschema ValidationError as one line naming the key and what is allowed (not a dump of the schema)."""
    key = ".".join(str(p) for p in error.absolute_path) or "(top level)"
    allowed = ""
    if error.validator == "additionalProperties":
        allowed = f"; allowed keys: {', '.join(error.schema.get('properties', {}))}"
    if error.validator == "type" and "number" in str(error.validator_value) and isinstance(error.instance, str):
        try:  # YAML 1.1 reads 1e-3 (no dot) as a string
            allowed = f" (YAML reads it as text: write {float(error.instance):.1e})"
        except ValueError:
            pass
    elif error.validator == "type" and "integer" in str(error.validator_value) and isinstance(error.instance, str):
        try:  # 1e3 for a count: YAML reads it as text, and a count is written without an exponent
            n = float(error.instance)
            allowed = f" (YAML reads it as text: write {int(n)})" if n.is_integer() else ""
        except (ValueError, OverflowError):
            pass
    if error.validator == "enum":  # the allowed values, and a hint for a precision (bf16: amp_ or pure_?)
        return ConfigError(key, schema.problem(error).removeprefix(f"{key} "))
    message = error.message
    if error.validator == "pattern" and key == "results_dir":
        message = (
            f"{error.instance!r} cannot hold a study: no whitespace, no braces (Snakemake reads "
            "{x} as a wildcard), no shell characters ($ ` ' \" \\ ; & | < > ( ) * ? [ ] ! #; every "
            "job's shell command names it), no leading - or ~, not the working directory (.) nor the root (/)"
        )
    return ConfigError(key, f"{message}{allowed}")


def check_config_files(paths) -> None:
    """A key written twice in one mapping of a config file: YAML (and Snakemake's loader) keeps the last without a
    word. Refused naming the file, the key and both lines. ``paths``: the config files Snakemake reads."""
    import yaml

    def walk(node, key, path):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for k, v in node.value:
                name = k.value if isinstance(k, yaml.ScalarNode) else None
                if name is not None and name != "<<":
                    where = f"{key}.{name}" if key else name
                    if name in seen:
                        raise ConfigError(where, f"written twice in {path} (lines {seen[name] + 1} and "
                                                 f"{k.start_mark.line + 1}); YAML keeps the last one without a "
                                                 "word: keep one")
                    seen[name] = k.start_mark.line
                    walk(v, where, path)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                walk(v, f"{key}[{i}]", path)

    for path in dict.fromkeys(str(p) for p in paths):
        try:
            with open(path, encoding="utf-8") as f:
                node = yaml.compose(f, Loader=yaml.SafeLoader)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # Snakemake's own loader names an unreadable or malformed file
        walk(node, "", path)


def given_schedules(merged: dict, command_line: dict | None, configfiles: list) -> dict | None:
    """The schedules map of the study when the command line gives one, read before Snakemake merges the
    config files into ``merged``: a map given replaces the default one instead of merging into it; of several
    --configfile files that each give one, the last one's map is the study's (Snakemake would merge them all);
    --config schedules='{...}' replaces them all (Snakemake would merge it into the files' map too)."""
    import yaml

    if "schedules" in (command_line or {}):
        return copy.deepcopy(command_line["schedules"])
    files = []
    for path in configfiles:
        with open(path) as f:
            c = yaml.safe_load(f)
        if isinstance(c, dict) and isinstance(c.get("schedules"), dict):
            files.append(c["schedules"])
    if len(files) > 1:
        return copy.deepcopy(files[-1])
    return copy.deepcopy(merged.get("schedules"))


