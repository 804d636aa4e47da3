"""The study's logic: config checks, run planning, per-run settings, GPU checks, previous-run keeping.

Plain functions over the config dict, used by the workflow (``workflow/rules/common.smk`` is its wiring) and
unit-tested on dicts. Torch-free: reading a config (every dry run) imports no torch; only the GPU checks of a
real run ask torch, inside the function.

The order of checks: :func:`validate` (the JSON schema ``workflow/schemas/config.schema.yaml``, filling its
defaults), then :func:`plan` (the checks the schema cannot express, and the runs). A mistake is a
:class:`ConfigError`, one line ``config key <key>: <problem>`` (docs/errors.md).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import sweeps as _sweeps
from .cpu_isa import problem as cpu_isa_problem
from .catalog import NAMES, SPECS, eval_precision_problem, name_hint
from .errors import PrecswitchError
from .fetch import is_hub_model, resolve_local_model
from .specs import run_spec, spec_name, stage_spec
from .train.config import DEFAULTS as HP_DEFAULTS
from .train.config import SWITCH_PAIR_PROBLEM, compile_telemetry_problem, steps_epochs_problem, switch_step

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"
PRECISIONS = list(NAMES)
STAGES = ("pretrain", "finetune")
OBJECTIVE = {"pretrain": "mlm", "finetune": "classify"}
FILE_KINDS = ("text", "tsv", "csv", "jsonl", "parquet")
# hparams keys that are not the engine's (prepare options) or not the stage's
NOT_HPARAMS = {"pretrain": {"max_length"}, "finetune": {"max_length", "mlm_probability"}}
# keys of a source spec that mean something for each kind (the schema fills defaults for all)
_CAPS = {"max_train_rows", "max_eval_rows"}
_MLM = {"eval_fraction", "mlm_examples"}
SOURCE_KEYS = {
    "synthetic": {"labels"} | _CAPS | _MLM,
    "text": {"train", "eval"} | _CAPS | _MLM,
    "hub": {"name", "config", "revision", "train_split", "eval_split", "columns", "text_column", "labels"}
    | _CAPS | _MLM,
}
TABLE_KEYS = {"train", "eval", "columns", "labels", "max_train_rows", "max_eval_rows"}
#: environment of jobs that must not download (compute nodes): everything is in the fetch job's cache
OFFLINE_VARS = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class ConfigError(PrecswitchError):
    """A config mistake, one line naming the key: ``config key <key>: <problem>``."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"config key {key}: {problem}")
        self.key = key


# --- the schema ----------------------------------------------------------------------------------
@functools.cache
def schema() -> dict:
    import yaml

    with open(SCHEMA_PATH) as f:
        return yaml.safe_load(f)


def _schema_default(*keys):
    node = schema()
    for key in keys:
        node = node["properties"][key]
    return node["default"]


def default_contrasts() -> list:
    return _schema_default("analysis", "contrasts")


def _source_defaults() -> dict:
    """The schema's default of every data-source key (a key a kind does not read must keep it)."""
    return {k: v.get("default") for k, v in schema()["$defs"]["source"]["properties"].items()}


def validate(config: dict) -> dict:
    """The JSON schema, through Snakemake's ``validate`` (which fills the schema's defaults into ``config`` in
    place): what it refuses becomes one :func:`schema_error` line. Returns ``config``. Before it, every mapping
    key must be text (:func:`_check_keys_are_text`); after it, an integer key must hold an integer, not a
    whole-number float (:func:`_check_integers`)."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate as snakemake_validate

    _check_keys_are_text(config, "")
    try:
        snakemake_validate(config, str(SCHEMA_PATH))
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


@functools.cache
def _strict_validator():
    """The schema's validator with JSON Schema's "integer" narrowed to Python ints: JSON Schema counts 16.0 as an
    integer, and the engine (precswitch.train.config.resolve) refuses it, after stage 1 trained."""
    from jsonschema import validators

    base = validators.validator_for(schema())
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _checker, x: isinstance(x, int) and not isinstance(x, bool))
    return validators.extend(base, type_checker=checker)(schema())


def _float_errors(errors):
    """The type errors of a float where an integer is meant, also inside oneOf/anyOf alternatives."""
    for e in errors:
        if e.validator == "type" and isinstance(e.instance, float) and "integer" in _as_list(e.validator_value):
            yield e
        yield from _float_errors(e.context or [])


def _check_integers(config: dict) -> None:
    """One rule for every integer key: a float (16.0, 1e3) is refused now, naming the key, not after stage 1."""
    error = next(_float_errors(_strict_validator().iter_errors(config)), None)
    if error is not None:
        key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path).lstrip(".")
        v = error.instance
        whole = f"write {int(v)}" if math.isfinite(v) and v == int(v) else "give a whole number"
        raise ConfigError(key, f"{v!r} is not an integer (this key counts, without a decimal point: {whole})")


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
    if (error.validator == "enum" and isinstance(error.instance, str)
            and set(error.validator_value) - {"same"} <= set(PRECISIONS)):  # eval_precision adds 'same'
        allowed = name_hint(error.instance)  # bf16: amp_bf16 or pure_bf16?
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


def check_results_dir(results_dir: str) -> None:
    """The study's outputs can be written under results_dir: it exists and is writable, or the nearest folder above
    it that exists is one where it can be created. Asked of the file system (a temporary file or folder, removed at
    once), so a read-only mount, /proc or a folder of another user is named now, not by the first job's OSError."""
    import tempfile

    path = os.path.abspath(results_dir)
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ConfigError("results_dir", f"{results_dir!r} cannot be created: {probe!r} is a file, not a folder")
    try:
        if probe == path:
            with tempfile.TemporaryFile(dir=probe):
                pass
        else:
            os.rmdir(tempfile.mkdtemp(dir=probe, prefix=".precswitch-probe-"))
    except OSError as e:
        what = "written" if probe == path else f"created (in {probe!r})"
        raise ConfigError("results_dir", f"{results_dir!r} cannot be {what}: {e.strerror}; choose a folder "
                                         "you can write, e.g. results_dir: results") from None


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


# --- checks the JSON schema cannot express ---------------------------------------------------------
def _check_finite(value, key):
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key, f"{value} is not a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, f"{key}[{i}]")


def _as_list(value):
    return [value] if isinstance(value, str) else list(value or [])


def source_files(source: dict) -> list:
    """The local files a data source reads (empty for synthetic and hub)."""
    if source["kind"] not in FILE_KINDS:
        return []
    return _as_list(source.get("train")) + _as_list(source.get("eval"))


def _check_source(stage, source):
    key = f"data.{stage}"
    kind = source["kind"]
    if kind in FILE_KINDS:
        if not source.get("train"):
            raise ConfigError(f"{key}.train", f"required for kind {kind} (file path)")
        if kind != "text":
            if not source.get("eval"):
                raise ConfigError(f"{key}.eval", f"required for kind {kind} (file path)")
            for split in ("train", "eval"):
                if not isinstance(source[split], str):
                    raise ConfigError(f"{key}.{split}", f"kind {kind} takes one file path, not a list")
        for path in source_files(source):
            if os.path.isdir(path):
                raise ConfigError(key, f"{path!r} is a directory; name the file(s) in it")
            if not os.path.exists(path):
                raise ConfigError(key, f"file {path!r} not found (relative paths are relative to "
                                       f"the working directory {os.getcwd()})")
    if kind != "hub" and source.get("revision") is not None:
        raise ConfigError(
            f"{key}.revision",
            f"{source['revision']!r} is a hub revision (branch, tag or commit) and this source is "
            f"kind {kind}; set it to null or use kind hub")
    if kind == "hub" and not source.get("name"):
        raise ConfigError(f"{key}.name", "required for kind hub (e.g. nyu-mll/glue)")
    if stage == "finetune" and kind == "text":
        raise ConfigError(f"{key}.kind", "text is unlabelled lines (masked LM only); stage 2 (classification) takes "
                                         "synthetic, tsv, csv, jsonl, parquet or hub")
    # a key this kind does not read would be dropped silently (e.g. train/eval files with the
    # default kind synthetic: the study would train on the synthetic language)
    reads = SOURCE_KEYS.get(kind, TABLE_KEYS)
    defaults = _source_defaults()
    for k, v in source.items():
        if k != "kind" and k not in reads and v != defaults.get(k):
            files = " (set kind: tsv, csv, jsonl, parquet or text to read files)"
            raise ConfigError(f"{key}.{k}", f"does not apply to kind {kind}, which reads only "
                                            f"{', '.join(sorted(reads))}; remove it"
                                            + (files if k in ("train", "eval") else ""))
    if stage == "pretrain" and kind in ("tsv", "csv", "jsonl", "parquet"):
        raise ConfigError(f"{key}.kind", f"{kind} is a classification table; stage 1 (masked LM) takes "
                                         "synthetic, text or hub (with text_column)")


# stage specs: a precision name, or {precision, switch_to, switch_at, overrides} (an in-stage switch, and
# optimizer hyper-parameters of that stage only): precswitch.specs normalises them and names their runs
def _check_precision(name, key):
    if name not in PRECISIONS:
        raise ConfigError(key, f"unknown precision {name!r}; allowed: {', '.join(PRECISIONS)}")


def _refuse_gpu_only(spec, train, key, where, stage):
    """Refuse the precisions a stage would run (its own, switch_to, eval_precision) that cannot run on a
    CPU, when the stage is set to fail on them (on_unsupported: error)."""
    if train["on_unsupported"] != "error":
        return
    names = [n for n in dict.fromkeys([spec["precision"], spec["switch_to"], train["eval_precision"]])
             if n in SPECS and "cpu" not in SPECS[n].device_types]
    if names:
        raise ConfigError(
            key,
            f"{', '.join(names)} cannot run on a CPU ({where}): "
            f"{' and '.join(f'{n} needs {SPECS[n].device_types[0]}' for n in names)}; set device: cuda "
            f"on a GPU machine, or train.{stage}.on_unsupported: skip to record such runs as skipped")


def _storage(name):
    p = SPECS[name]
    return (p.param_dtype, p.update_compensation, p.fp8_linear)


def _check_switch(precision, switch_to, key):
    """An in-stage switch keeps the weights: both precisions must store them the same way."""
    _check_precision(switch_to, f"{key}.switch_to")
    if _storage(precision) != _storage(switch_to):
        same = [p for p in PRECISIONS if p != precision and _storage(p) == _storage(precision)]
        raise ConfigError(
            f"{key}.switch_to",
            f"cannot switch from {precision} to {switch_to} inside a stage: their weights are "
            f"stored differently; allowed from {precision}: {', '.join(same) or 'none'} (or use two stages)")


def check_stage(value, key) -> dict:
    """One stage of a schedule (a precision name or a switch object), as precswitch.specs reads it."""
    spec = stage_spec(value)
    if spec["precision"] is None:
        raise ConfigError(f"{key}.precision", "required (the stage's first precision)")
    _check_precision(spec["precision"], key if isinstance(value, str) else f"{key}.precision")
    if (spec["switch_to"] is None) != (spec["switch_at"] is None):
        raise ConfigError(key, SWITCH_PAIR_PROBLEM)
    if spec["switch_to"] is not None:
        if not 0 < spec["switch_at"] <= 1:
            raise ConfigError(
                f"{key}.switch_at",
                f"{spec['switch_at']} is outside (0, 1]: the fraction of the stage's steps run in "
                f"{spec['precision']} before switching to {spec['switch_to']}")
        _check_switch(spec["precision"], spec["switch_to"], key)
    return spec


def _check_overrides(spec, train, key, stage):
    """An override that repeats train.<stage>'s value would train the same run again under another name."""
    for k, v in spec["overrides"].items():
        if float(v) == float(train[k]):
            raise ConfigError(
                f"{key}.overrides.{k}",
                f"{v} is train.{stage}.{k} already: the stage would repeat the run without overrides "
                f"under another name; leave {k} out of overrides (or give it another value)")


def _expand_sweeps(cfg) -> dict:
    """Add the schedules of every switch-point sweep (<name>-at<percent>) to cfg["schedules"]; returns each
    point's stage-2 tags (sweep, sweep_at = f, sweep_stage) by schedule name. precswitch.sweeps says what a
    sweep is."""
    sweeps = cfg.get("sweeps") or {}
    meta = {}
    for name, sweep in sweeps.items():
        key = f"sweeps.{name}"
        swept = _sweeps.swept_stages(sweep)
        if len(swept) != 1:
            continue  # precswitch.sweeps.expand below says what is wrong
        stage = swept[0]
        first, then = sweep[stage]["precision"], sweep[stage]["switch_to"]
        _check_precision(first, f"{key}.{stage}.precision")
        _check_switch(first, then, f"{key}.{stage}")
        for i, f in enumerate(sweep["switch_at"]):
            if not 0 <= f <= 1:
                raise ConfigError(f"{key}.switch_at[{i}]", f"{f} is outside [0, 1] (fraction in {first})")
            meta[_sweeps.point_name(name, f)] = {"sweep": name, "sweep_at": f, "sweep_stage": stage}
    try:  # one stage swept, no two points or schedules of one name (the messages name the key)
        cfg["schedules"].update(_sweeps.expand(sweeps, cfg["schedules"]))
    except PrecswitchError as e:  # "config key <key>: <problem>" already
        raise ConfigError(*str(e).removeprefix("config key ").split(": ", 1)) from None
    return meta


def _init_positions(model):
    """The position embeddings of the model a study starts from: model.max_position_embeddings (scratch) or a
    local model.init's config.json; None for a hub model (known after fetch)."""
    if model["init"] == "scratch":
        return model["max_position_embeddings"]
    # ~ as the engine and `precswitch tokenizer` read it (precswitch.fetch)
    path = os.path.join(os.path.expanduser(str(model["init"])), "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f).get("max_position_embeddings")


def _check_switch_step(spec, hp, key):
    """The engine switches at step round(switch_at * steps) and refuses a switch_at that rounds to step 0 or
    (below 1) to the last step (precswitch.train.config.switch_step): asked here for a stage with steps, before
    anything trains (an epochs stage's step count only the engine knows)."""
    if spec["switch_to"] is None or hp["steps"] is None:
        return
    try:
        switch_step(spec, hp["steps"])
    except PrecswitchError as e:
        raise ConfigError(f"{key}.switch_at", str(e)) from None


def _check_batch_fits(cfg, stage):
    """A batch larger than the training rows is refused by the engine when the stage starts (for stage 2: after
    every stage-1 run trained); what is known now is checked now."""
    batch, source = cfg["train"][stage]["batch_size"], cfg["data"][stage]
    rows = []
    if source.get("max_train_rows") is not None:
        rows.append((source["max_train_rows"], f"data.{stage}.max_train_rows"))
    if stage == "finetune" and source["kind"] == "synthetic":
        n = (cfg["data"].get("synthetic") or {}).get("n_train", 3000)
        rows.append((n, "data.synthetic.n_train"))
    for n, what in rows:
        if batch > n:
            raise ConfigError(f"train.{stage}.batch_size", f"{batch} exceeds the {n} training rows of {what}")


def _check_config(cfg):
    """The cross-key rules, on a config the schema filled and whose sweeps are expanded."""
    _check_finite(cfg, "")
    if os.path.exists(cfg["results_dir"]) and not os.path.isdir(cfg["results_dir"]):
        raise ConfigError("results_dir", f"{cfg['results_dir']!r} exists and is not a directory; name a directory "
                                         "for the study's outputs")
    check_results_dir(cfg["results_dir"])
    if why := cpu_isa_problem(cfg["cpu_isa"]):  # a level this CPU lacks, before any job starts
        raise ConfigError("cpu_isa", why)
    schedules = cfg["schedules"]
    if not schedules:
        raise ConfigError("schedules", "needs at least one schedule")
    for name, stages in schedules.items():
        if not stages or "finetune" not in stages:
            raise ConfigError(f"schedules.{name}", "needs a finetune precision (and optionally a pretrain one), "
                                                   f"e.g. {{pretrain: amp_fp16, finetune: fp32}}; allowed: "
                                                   f"{', '.join(PRECISIONS)}")
        for stage, value in stages.items():
            if stage not in STAGES:
                raise ConfigError(f"schedules.{name}.{stage}", f"unknown stage; allowed: {', '.join(STAGES)}")
            check_stage(value, f"schedules.{name}.{stage}")
    for name, stages in schedules.items():
        for stage, value in stages.items():
            ev = cfg["train"][stage]["eval_precision"]
            precision = stage_spec(value)["precision"]
            why = eval_precision_problem(precision, ev)
            if why:
                raise ConfigError(f"train.{stage}.eval_precision",
                                  f"{ev} cannot evaluate the {precision} {stage} stage of schedule {name}: {why}")
    if cfg["device"] == "cpu":
        for name, stages in schedules.items():
            for stage, value in stages.items():
                _refuse_gpu_only(stage_spec(value), cfg["train"][stage], f"schedules.{name}.{stage}",
                                 "device is cpu", stage)
    for stage in STAGES:
        train = cfg["train"][stage]
        why = compile_telemetry_problem(train["compile"], train["telemetry_every"])
        if why:
            raise ConfigError(f"train.{stage}.compile", why)
    seeds = cfg["seeds"]
    if not seeds:
        raise ConfigError("seeds", "needs at least one seed")
    duplicates = sorted({s for s in seeds if seeds.count(s) > 1})
    if duplicates:
        raise ConfigError("seeds", f"duplicate seeds {duplicates}; each seed may appear once")
    seq = cfg["sequential"]
    if seq is not None and seq["max_seeds"] < seq["start"]:
        raise ConfigError("sequential.max_seeds", f"{seq['max_seeds']} is less than sequential.start "
                                                  f"({seq['start']}): the first look needs start seeds")
    if seq is not None and len(schedules) < 2:
        raise ConfigError("sequential", "needs at least two schedules (a sequential design settles comparisons "
                                        "between schedules); set sequential: null to run the seeds list")
    analysis = cfg["analysis"]
    if analysis["baseline"] not in schedules:
        raise ConfigError("analysis.baseline",
                          f"{analysis['baseline']!r} is not a schedule; allowed: {', '.join(schedules)}")
    for i, pair in enumerate(analysis["contrasts"]):
        if pair[0] == pair[1]:
            # precswitch stats would drop it as "missing": say so now, naming the pair
            raise ConfigError(f"analysis.contrasts[{i}]", f"compares {pair[0]!r} with itself; give two different "
                                                          "schedules")
        missing = [name for name in pair if name not in schedules]
        # the schema's default pair is dropped quietly by studies without those schedules; a pair
        # written in the config must name schedules that run
        if missing and analysis["contrasts"] != default_contrasts():
            raise ConfigError(f"analysis.contrasts[{i}]", f"{', '.join(map(repr, missing))} is not a schedule; "
                                                          f"allowed: {', '.join(schedules)}")
    if analysis["power"] <= analysis["alpha"]:
        # precswitch stats would stop on it after the whole study trained
        raise ConfigError(
            "analysis.power",
            f"{analysis['power']} must exceed analysis.alpha ({analysis['alpha']}): with no effect a "
            "test already rejects with probability alpha, so no number of seeds reaches a lower power")
    model = cfg["model"]
    for stage in STAGES:
        hp = cfg["train"][stage]
        why = steps_epochs_problem(hp["steps"], hp["epochs"])
        if why:
            raise ConfigError(f"train.{stage}", why)
        positions = _init_positions(model)
        if positions is not None and hp["max_length"] > positions:
            raise ConfigError(
                f"train.{stage}.max_length",
                f"{hp['max_length']} exceeds the position embeddings ({positions}) of "
                + ("model.max_position_embeddings" if model["init"] == "scratch" else f"model.init {model['init']!r}"))
        if hp["steps"] is not None and hp["timing_warmup_steps"] >= hp["steps"]:
            raise ConfigError(f"train.{stage}.timing_warmup_steps",
                              f"{hp['timing_warmup_steps']} leaves none of the stage's {hp['steps']} steps "
                              "for the steady-state throughput; use fewer")
        _check_batch_fits(cfg, stage)
    for name, stages in schedules.items():
        for stage, value in stages.items():
            _check_switch_step(stage_spec(value), cfg["train"][stage], f"schedules.{name}.{stage}")
            _check_overrides(stage_spec(value), cfg["train"][stage], f"schedules.{name}.{stage}", stage)
    if model["hidden_size"] % model["num_attention_heads"]:
        raise ConfigError("model.num_attention_heads", f"{model['num_attention_heads']} does not divide "
                                                       f"model.hidden_size ({model['hidden_size']})")
    if model["revision"] is not None and not is_hub_model(model["init"]):
        what = "scratch" if model["init"] == "scratch" else "a local directory"
        raise ConfigError("model.revision", f"{model['revision']!r} is a hub revision (branch, tag or commit) but "
                                            f"model.init {model['init']!r} is {what}; set model.revision: null")
    init = str(model["init"])
    if init != "scratch" and not is_hub_model(init):
        # a local path (starts with . / ~, or has two /): a model directory now, or every job that
        # reads it fails later (a mistyped one would otherwise be looked up on the hub)
        try:
            resolve_local_model(init)
        except PrecswitchError as e:
            raise ConfigError("model.init", str(e).removeprefix("model.init: ")) from None
    for stage in STAGES:
        _check_source(stage, cfg["data"][stage])


# --- the plan: which runs the study makes ------------------------------------------------------------
@dataclass
class Plan:
    """What a checked config runs. ``config``: a copy of the config with the sweep points among its schedules
    and YAML's ``compile: false`` read as off; ``schedules``: name -> {stage: run spec} (precswitch.specs);
    ``sweeps``: a sweep point's stage-2 tags by schedule name; ``stage1``: the stage-1 runs by run name (the
    precision wildcard), shared by the schedules whose stage 1 is the same (precision, switch, overrides);
    ``seeds``: the seeds, every run made once per seed; with a sequential design (``sequential``, made by
    :func:`sequential_design`), the seeds a schedule may run, in the order it runs them, of which the looks
    choose how many."""

    config: dict
    schedules: dict
    sweeps: dict
    stage1: dict
    seeds: list
    sequential: dict | None = None

    def stage1_of(self, schedule: str) -> str | None:
        """The stage-1 run name of a schedule (its directory under runs/pretrain), or None (model.init)."""
        spec = self.schedules[schedule].get("pretrain")
        return None if spec is None else spec_name(spec)


def plan(config: dict) -> Plan:
    """Check a config the schema filled (:func:`validate`) past the schema, and plan its runs. ``config`` is
    not changed. Raises ConfigError naming the key."""
    cfg = copy.deepcopy(config)
    _check_finite(cfg.get("sweeps") or {}, "sweeps")
    for stage in STAGES:  # YAML reads an unquoted `compile: off` as false: one spelling from here on
        if cfg["train"][stage]["compile"] is False:
            cfg["train"][stage]["compile"] = "off"
    sweeps = _expand_sweeps(cfg)
    _check_config(cfg)
    schedules = {name: {stage: run_spec(v) for stage, v in stages.items()} for name, stages in cfg["schedules"].items()}
    stage1, owner = {}, {}
    for name, stages in schedules.items():
        if "pretrain" not in stages:
            continue
        run = spec_name(stages["pretrain"])
        if stage1.setdefault(run, stages["pretrain"]) != stages["pretrain"]:
            # the name keeps 6 significant digits of the percent: two switch points closer than that would share
            # one run, trained at one of them, and the other schedule would fine-tune from a stage 1 it did not ask
            raise ConfigError(
                f"schedules.{name}.pretrain",
                f"switch_at {stages['pretrain']['switch_at']} and schedule {owner[run]}'s "
                f"{stage1[run]['switch_at']} give one stage-1 run name, {run!r}; make them equal or further apart")
        owner.setdefault(run, name)
    # a misspelt column of a local table is named now, not by the prepare job that runs beside stage 1
    from .data.loading import check_table_headers

    for stage in STAGES:
        try:
            check_table_headers(source_spec(cfg, stage, synth_dir=""))
        except PrecswitchError as e:
            raise ConfigError(f"data.{stage}.columns", str(e).removeprefix("source: ")) from None
    seeds = [int(s) for s in cfg["seeds"]]
    study = Plan(config=cfg, schedules=schedules, sweeps=sweeps, stage1=stage1, seeds=seeds)
    if cfg["sequential"] is not None:
        study.seeds = seed_sequence(seeds, cfg["sequential"]["max_seeds"])
        study.sequential = sequential_design(study)
    return study


def seed_sequence(seeds: list, n: int) -> list[int]:
    """The first ``n`` seeds of a sequential design: the seeds list's first values, then the integers after its
    largest (the same every rerun)."""
    seeds = [int(s) for s in seeds]
    return (seeds + list(range(max(seeds) + 1, max(seeds) + 1 + n)))[:n]


def sequential_design(study: Plan) -> dict:
    """What `precswitch look` needs of a sequential study (JSON): the sequential settings, analysis.margin and
    analysis.power, the seed sequence, the comparisons ([a, b]: each schedule vs analysis.baseline, then the
    analysis.contrasts not already among them) and each schedule's stage-1 run (None: model.init)."""
    analysis = analysis_settings(study)
    base = analysis["baseline"]
    pairs = [[s, base] for s in study.schedules if s != base]
    seen = {frozenset(p) for p in pairs}
    for a, b in analysis["contrasts"]:
        if frozenset((a, b)) not in seen:
            pairs.append([a, b])
            seen.add(frozenset((a, b)))
    return {**study.config["sequential"], "margin": analysis["margin"], "power": analysis["power"],
            "seeds": list(study.seeds), "comparisons": pairs, "schedules": list(study.schedules),
            "stage1": {s: study.stage1_of(s) for s in study.schedules}}


def check(config: dict) -> None:
    """Every check of a study config: the schema (its defaults filled into a copy), then :func:`plan`'s."""
    plan(validate(copy.deepcopy(config)))


# --- per-run settings ---------------------------------------------------------------------------------
def hparams(study: Plan, stage: str, name: str, seed, *, data: str, tokenizer: str, init) -> dict:
    """The hyper-parameters `precswitch train --hparams` gets for one training job: stage 1 of stage-1 run
    ``name`` (a key of ``study.stage1``) or stage 2 of schedule ``name``; ``data``, ``tokenizer`` and ``init``
    are the workflow's paths (init: model.init, or the stage-1 checkpoint a schedule fine-tunes from)."""
    config = study.config
    if stage == "pretrain":
        # no schedule names in stage-1 tags: adding a schedule must not rerun shared stage-1 runs
        spec, tags = study.stage1[name], {}
    else:
        spec, tags = study.schedules[name]["finetune"], {"schedule": name, **study.sweeps.get(name, {})}
    hp = {k: v for k, v in config["train"][stage].items() if k not in NOT_HPARAMS[stage]}
    if not hp.get("telemetry_every"):
        hp.pop("telemetry_every", None)  # off: the engine's default (keeps old runs' params)
    if hp.get("compile") == "off":
        hp.pop("compile")  # off: the engine's default, likewise
    if hp.get("max_nonfinite_fraction") == HP_DEFAULTS["max_nonfinite_fraction"]:
        hp.pop("max_nonfinite_fraction")  # the engine's default, likewise
    # init and its hub revision are not BertConfig fields: the revision goes as init_revision, and
    # only when set and the stage starts from model.init (a stage-1 checkpoint records its own)
    model = {k: v for k, v in config["model"].items() if k not in ("init", "revision")}
    if str(init) != "scratch":
        # a checkpoint or pretrained model brings its own sizes: pass only what applies to it, so that
        # editing the sizes (e.g. of the CPU default a GPU config inherits) reruns nothing that ignores them
        model = {"attn_implementation": model["attn_implementation"]}
    hp.update(
        run_id=f"{stage}-{tags['schedule'] if 'schedule' in tags else spec_name(spec)}-seed{seed}",
        stage=stage,
        objective=OBJECTIVE[stage],
        precision=spec["precision"],
        seed=int(seed),
        tags=tags,
        data=data,
        tokenizer=tokenizer,
        init=init,
        model=model,
        threads=config["threads"],
        device=config["device"],
    )
    if config["cpu_isa"] != "native":  # native: the engine's default (keeps old runs' params)
        hp["cpu_isa"] = config["cpu_isa"]
    revision = config["model"]["revision"]
    if revision is not None and init == config["model"]["init"]:
        hp["init_revision"] = revision
    if spec["switch_to"] is not None:
        hp.update(switch_to=spec["switch_to"], switch_at=spec["switch_at"])
    if spec["overrides"]:
        # this schedule's own optimizer values for the stage; the tag says which they are (the spec column)
        hp.update(spec["overrides"])
        hp["tags"] = {**tags, "overrides": spec["overrides"]}
    if stage == "pretrain":
        hp["save_checkpoint"] = True
    return hp


def source_spec(config: dict, stage: str, synth_dir: str) -> dict:
    """The stage's data source as the JSON `precswitch tokenizer/prepare --source` take (the synthetic
    language's files in ``synth_dir``)."""
    source = config["data"][stage]
    keys = SOURCE_KEYS.get(source["kind"], TABLE_KEYS)
    spec = {k: v for k, v in source.items() if k in keys and v is not None}
    spec["kind"] = source["kind"]
    if source["kind"] == "synthetic":
        spec["dir"] = synth_dir
    return spec


def tokenizer_options(config: dict) -> str:
    """`precswitch tokenizer` options: train WordPiece, or copy model.init's tokenizer."""
    model, tok = config["model"], config["tokenizer"]
    if model["init"] != "scratch":
        options = f"--pretrained {shlex.quote(model['init'])}"
        if model["revision"] is not None:
            options += f" --revision {shlex.quote(model['revision'])}"
        return options
    options = f"--vocab-size {tok['vocab_size']}"
    options += f" --model-max-length {model['max_position_embeddings']}"
    return options + (" --cased" if tok["cased"] else "")


def fetch_needed(config: dict) -> bool:
    """True when the config reads anything from the hub (a model or a data source); a local path that is not a
    model directory was refused by the checks."""
    return is_hub_model(str(config["model"]["init"])) or any(config["data"][s]["kind"] == "hub" for s in STAGES)


def fetch_spec(config: dict) -> dict:
    """The part of the config `precswitch fetch` reads (changing it reruns the fetch)."""

    # a revision left null is left out, so that adding the key did not rerun existing studies
    def pinned(d):
        return {k: v for k, v in d.items() if k != "revision" or v is not None}

    return {"model": pinned({"init": config["model"]["init"], "revision": config["model"]["revision"]}),
            "data": {stage: pinned(config["data"][stage]) for stage in STAGES}}


def analysis_settings(study: Plan) -> dict:
    """The analysis settings for precswitch stats; the schema's default contrast pairs that name a schedule this
    study does not run are dropped here (the checks let them through quietly)."""
    analysis = dict(study.config["analysis"])
    if analysis["contrasts"] == default_contrasts():
        analysis["contrasts"] = [pair for pair in analysis["contrasts"]
                                 if all(name in study.schedules for name in pair)]
    return analysis


def warmup_notes(config: dict) -> list[str]:
    """Warnings for an epochs stage whose step count is known now to be at most its timing_warmup_steps (its rates
    would include the warm-up): the rows are known for a synthetic fine-tuning task (n_train) and bounded by
    max_train_rows. A steps stage with too few steps is refused by the checks; the rest the engine says."""
    notes = []
    for stage in STAGES:
        hp, source = config["train"][stage], config["data"][stage]
        if hp["epochs"] is None:
            continue
        rows = [source.get("max_train_rows")]
        if stage == "finetune" and source["kind"] == "synthetic":
            rows.append((config["data"].get("synthetic") or {}).get("n_train"))
        rows = [r for r in rows if r is not None]
        if not rows:
            continue
        steps = max(1, int(round(hp["epochs"] * (min(rows) // hp["batch_size"]))))
        if steps <= hp["timing_warmup_steps"]:
            notes.append(f"precswitch: warning: train.{stage}: epochs {hp['epochs']:g} of at most {min(rows)} rows "
                         f"at batch_size {hp['batch_size']} is at most {steps} step(s), not more than "
                         f"timing_warmup_steps {hp['timing_warmup_steps']}: the stage's steps/s will include the "
                         "warm-up; use more epochs or fewer timing_warmup_steps")
    return notes


def prepared_notes(meta_paths) -> list[str]:
    """Warnings for the console from the prepared datasets' meta.json (precswitch prepare): source rows dropped for
    an empty text or label cell, which the prepare log alone would hide."""
    notes = []
    for path in meta_paths:
        try:
            with open(path) as f:
                meta = json.load(f)
        except (OSError, ValueError):
            continue
        n, read = meta.get("train_rows_dropped"), meta.get("train_rows_read")
        if n:
            notes.append(f"precswitch: warning: {n}{f' of {read}' if read else ''} training rows of "
                         f"{os.path.dirname(path)} were dropped for an empty text or label cell (the verdict's "
                         "caveats say it too)")
    return notes


def threads_note(threads: int, cores: int | None) -> str | None:
    """A training job pins torch to `threads` CPU threads (its hparams; results depend on it), but Snakemake
    scales a job's threads down to --cores: more threads than cores oversubscribes them."""
    if not cores or threads <= cores:
        return None
    return (
        f"precswitch: warning: threads {threads} is more than --cores {cores}: Snakemake gives each "
        f"training job {cores} core(s), but torch runs {threads} threads in it, so the timings are "
        f"oversubscribed; run with --cores {threads} or more, or set threads: {cores}")


# --- GPU checks (before any job of a real run starts) -------------------------------------------------
def check_cuda_build(device: str) -> None:
    """A cluster run whose jobs use this interpreter's environment on GPU nodes: a CPU-only torch here fails
    every training job there, after its wait in the queue and its retries. A CUDA build is known without a GPU
    (torch.version.cuda)."""
    if not device.startswith("cuda"):
        return
    import sys

    import torch

    if torch.version.cuda is None and not getattr(torch.version, "hip", None):
        raise ConfigError(
            "device", f"{device}, but torch {torch.__version__} in {sys.prefix}, which the cluster jobs run, is a "
                      "CPU-only build: every training job would fail on its GPU node; install a CUDA build of torch "
                      "there (README, docs/slurm.md)")


def check_gpu(study: Plan, jobs: list, gpu_limit: int | None) -> str | None:
    """A local run's training jobs, ``jobs`` as (stage, name) with name the stage-1 run or the schedule: with
    device cuda they need a GPU torch can see; with device auto and none, they train on the CPU, which must run
    their precisions. Said before any job starts, instead of when the first training job fails. Returns a note
    when the gpu resource limit is not one training job per visible GPU."""
    config = study.config
    device = str(config["device"])
    if not (device.startswith("cuda") or device == "auto") or not jobs:
        return None
    import torch

    from .gpu import gpu_limit_note

    if torch.cuda.is_available():
        return gpu_limit_note(gpu_limit, torch.cuda.device_count(), len(jobs), device)
    if device != "auto":
        raise ConfigError(
            "device", f"{config['device']}, but this machine has no CUDA GPU that torch {torch.__version__} can "
                      f"see, and {len(jobs)} training jobs would run here; run on a GPU machine, install a CUDA "
                      "build of torch (README), or set device: cpu")
    # auto without a GPU is cpu: refuse what a CPU cannot run, before any job
    where = f"device is auto and torch {torch.__version__} sees no CUDA GPU here"
    for stage, name in jobs:
        if stage == "pretrain":
            spec = study.stage1[name]
            schedule = next(n for n, st in study.schedules.items() if st.get("pretrain") == spec)
        else:
            schedule, spec = name, study.schedules[name]["finetune"]
        _refuse_gpu_only(spec, config["train"][stage], f"schedules.{schedule}.{stage}", where, stage)
    return None


# --- previous runs ---------------------------------------------------------------------------------------
def _link_or_copy(src, dst):
    """Hard-link a large file (a checkpoint's weights: no copy, no space until the rerun replaces the original;
    the engine writes every file anew, never in place), copy a small one."""
    if os.path.getsize(src) > (1 << 20):
        try:
            os.link(src, dst)
            return dst
        except OSError:  # another filesystem, or links not allowed: copy
            pass
    return shutil.copy2(src, dst)


def keep_previous_runs(runs: list, results_dir: str, previous_dir: str) -> list[str]:
    """Snakemake deletes a job's old outputs when it starts it again (its params, code or inputs changed, or
    -R), so a rerun that then fails would leave the finished run gone. Of ``runs``, (metrics.json, log files)
    of each training job that will run, keep each finished one (its run dir, less resume/, and its logs) under
    ``previous_dir`` at its path relative to ``results_dir``, the latest previous version of each. Returns the
    kept run dirs (relative)."""
    kept = []
    for metrics, logs in runs:
        if not os.path.isfile(metrics):
            continue  # nothing finished to lose: a new run, or an interrupted one (resume/ stays put)
        run_dir = os.path.dirname(metrics)
        rel = os.path.relpath(run_dir, results_dir)
        dst = os.path.join(previous_dir, rel)
        tmp = f"{dst}.incoming"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(run_dir, tmp, copy_function=_link_or_copy, ignore=shutil.ignore_patterns("resume"))
        for log in logs:
            if os.path.isfile(log):
                shutil.copy2(log, os.path.join(tmp, os.path.basename(log)))
        shutil.rmtree(dst, ignore_errors=True)
        os.replace(tmp, dst)
        kept.append(rel)
    return kept


def refuse(error) -> None:
    """End the workflow on a config mistake with one line (the key, the value, what is allowed): no Snakemake
    frames around it (the Snakefile calls this for every ConfigError)."""
    import sys

    print(f"Error: {error}", file=sys.stderr)
    sys.exit(1)
