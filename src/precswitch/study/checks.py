"""The checks a JSON schema cannot express, on a config the schema filled and whose sweeps are expanded
(precswitch.study.plan runs :data:`CHECKS` in order). Each is a named function raising ConfigError naming the
key. The rules of one training stage are precswitch.stage_rules', which ``precswitch train`` calls too."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .. import schema
from .. import stage_rules as rules
from ..cpu_isa import problem as cpu_isa_problem
from ..catalog import SPECS, eval_precision_problem
from ..errors import PrecswitchError
from ..fetch import is_hub_model, resolve_local_model
from ..specs import run_spec, spec_name, stage_spec
from .validate import ConfigError

STAGES = ("pretrain", "finetune")
FILE_KINDS = ("text", "tsv", "csv", "jsonl", "parquet")
# keys of a source spec that mean something for each kind (the schema fills defaults for all)
_CAPS = {"max_train_rows", "max_eval_rows"}
_MLM = {"eval_fraction", "mlm_examples"}
SOURCE_KEYS = {
    "synthetic": {"labels"} | _CAPS | _MLM,
    "text": {"train", "eval"} | _CAPS | _MLM,
    "hub": {"name", "config", "revision", "train_split", "eval_split", "test_split", "columns", "text_column", "labels"}
    | _CAPS | _MLM,
}
TABLE_KEYS = {"train", "eval", "test", "columns", "labels", "max_train_rows", "max_eval_rows"}
#: this checkout, and its folders of code or configuration: a results_dir there would write runs among them
REPO = Path(__file__).resolve().parents[3]
REPO_FOLDERS = ("src", "workflow", "config", "tests", "benchmarks", "envs", "profiles", "docs", ".git", ".ci",
                ".github", ".venv")


def _stages(cfg):
    """(schedule, stage, spec) of every stage of every schedule."""
    for name, stages in cfg["schedules"].items():
        for stage, value in stages.items():
            yield name, stage, stage_spec(value)


def check_finite(cfg):
    """nan and inf pass JSON Schema's bounds."""
    where = schema.nonfinite(cfg)
    if where:
        raise ConfigError(where, "not a finite number")


def check_results_dir(cfg):
    """results_dir is a folder outside the checkout's code and configuration, and one this user can write."""
    results_dir = cfg["results_dir"]
    if os.path.exists(results_dir) and not os.path.isdir(results_dir):
        raise ConfigError("results_dir", f"{results_dir!r} exists and is not a directory; name a directory "
                                         "for the study's outputs")
    path = os.path.realpath(results_dir)
    for folder in (os.path.realpath(REPO / f) for f in ("", *REPO_FOLDERS)):
        if path == folder or (folder != str(REPO) and path.startswith(folder + os.sep)):
            raise ConfigError("results_dir", f"{results_dir!r} is {'' if path == folder else 'inside '}{folder}, a "
                                             "folder of this checkout's code or configuration; use e.g. "
                                             "results_dir: results")
    _check_writable(results_dir)


def _check_writable(results_dir: str) -> None:
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



def check_schedules(cfg):
    """Every schedule has a finetune stage (and optionally a pretrain one)."""
    if not cfg["schedules"]:
        raise ConfigError("schedules", "needs at least one schedule")
    for name, stages in cfg["schedules"].items():
        if "finetune" not in (stages or {}):
            raise ConfigError(f"schedules.{name}", "needs a finetune precision (and optionally a pretrain one), "
                                                   "e.g. {pretrain: amp_fp16, finetune: fp32}")


def _name_max(results_dir) -> int:
    probe = os.path.abspath(results_dir)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:
        return os.pathconf(probe, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def check_names(cfg):
    """A schedule's name and a stage-1 run's name are folder names under results_dir (and Snakemake wildcard
    values): no longer than the file system allows, and not periodic (Snakemake's PeriodicWildcardError)."""
    from snakemake.io import PeriodicityDetector

    limit, periodic = _name_max(cfg["results_dir"]), PeriodicityDetector()
    names = {name: f"schedules.{name}" for name in cfg["schedules"]}
    names.update({spec_name(run_spec(v)): f"schedules.{n}.pretrain" for n, st in cfg["schedules"].items()
                  for s, v in st.items() if s == "pretrain"})
    for name, key in names.items():
        if len(name.encode()) > limit:
            raise ConfigError(key.replace(name, name[:24] + "..."), f"the run name is {len(name.encode())} bytes, "
                              f"longer than a folder name may be here ({limit}); use a shorter name")
        repeat = periodic.is_periodic(name)
        if repeat:
            raise ConfigError(key, f"the run name repeats {repeat!r} at its end, which Snakemake refuses as a "
                                   "periodic wildcard; use a name without the repeats")


def check_precisions(cfg):
    """Each stage's eval_precision can evaluate it; with device cpu, no stage needs a GPU."""
    for name, stage, spec in _stages(cfg):
        ev = cfg["train"][stage]["eval_precision"]
        why = eval_precision_problem(spec["precision"], ev)
        if why:
            raise ConfigError(f"train.{stage}.eval_precision",
                              f"{ev} cannot evaluate the {spec['precision']} {stage} stage of schedule {name}: {why}")
        if cfg["device"] == "cpu":
            refuse_gpu_only(spec, cfg["train"][stage], f"schedules.{name}.{stage}", "device is cpu", stage)


def refuse_gpu_only(spec, train, key, where, stage):
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



def _stage_rule(train, spec, key):
    """precswitch.stage_rules on one stage: train.<stage>'s keys with a schedule's precision and switch."""
    why = rules.stage_problem({**train, **spec})
    if why:
        sub, text = why
        raise ConfigError(f"{key}.{sub}" if sub else key, text)


def check_stage_rules(cfg):
    """The rules of one training stage, as ``precswitch train`` checks them: train.<stage> alone, then with
    each schedule's precision and switch; and timing_warmup_steps below steps."""
    for stage in STAGES:
        train = cfg["train"][stage]
        _stage_rule(train, stage_spec("fp32"), f"train.{stage}")
        if train["steps"] is not None and train["timing_warmup_steps"] >= train["steps"]:
            # the engine records such a stage (timing_warmup_short); a study refuses it when it can know
            raise ConfigError(f"train.{stage}.timing_warmup_steps",
                              f"{train['timing_warmup_steps']} leaves none of the stage's {train['steps']} steps "
                              "for the steady-state throughput; use fewer")
    for name, stage, spec in _stages(cfg):
        _stage_rule(cfg["train"][stage], spec, f"schedules.{name}.{stage}")


def check_overrides(cfg):
    """An override that repeats train.<stage>'s value would train the same run again under another name."""
    for name, stage, spec in _stages(cfg):
        for k, v in spec["overrides"].items():
            if float(v) == float(cfg["train"][stage][k]):
                raise ConfigError(
                    f"schedules.{name}.{stage}.overrides.{k}",
                    f"{v} is train.{stage}.{k} already: the stage would repeat the run without overrides "
                    f"under another name; leave {k} out of overrides (or give it another value)")


def check_seeds(cfg):
    seeds = cfg["seeds"]
    if not seeds:
        raise ConfigError("seeds", "needs at least one seed")
    duplicates = sorted({s for s in seeds if seeds.count(s) > 1})
    if duplicates:
        raise ConfigError("seeds", f"duplicate seeds {duplicates}; each seed may appear once")


def check_sequential(cfg):
    seq = cfg["sequential"]
    if seq is not None and seq["max_seeds"] < seq["start"]:
        raise ConfigError("sequential.max_seeds", f"{seq['max_seeds']} is less than sequential.start "
                                                  f"({seq['start']}): the first look needs start seeds")
    if seq is not None and len(cfg["schedules"]) < 2:
        raise ConfigError("sequential", "needs at least two schedules (a sequential design settles comparisons "
                                        "between schedules); set sequential: null to run the seeds list")


def check_analysis(cfg):
    """The baseline, contrasts and positive control name schedules of the study (the schema's default pairs and
    control may name absent ones: they are dropped quietly); power exceeds alpha."""
    analysis, schedules = cfg["analysis"], cfg["schedules"]
    if analysis["baseline"] not in schedules:
        raise ConfigError("analysis.baseline",
                          f"{analysis['baseline']!r} is not a schedule; allowed: {', '.join(schedules)}")
    default_pairs = analysis["contrasts"] == schema.node("analysis", "contrasts")["default"]
    for i, pair in enumerate(analysis["contrasts"]):
        if pair[0] == pair[1]:
            raise ConfigError(f"analysis.contrasts[{i}]", f"compares {pair[0]!r} with itself; give two different "
                                                          "schedules")
        missing = [name for name in pair if name not in schedules]
        if missing and not default_pairs:
            raise ConfigError(f"analysis.contrasts[{i}]", f"{', '.join(map(repr, missing))} is not a schedule; "
                                                          f"allowed: {', '.join(schedules)}")
    control = analysis["positive_control"]
    if control is not None and control not in schedules and control != schema.node("analysis", "positive_control")["default"]:
        raise ConfigError("analysis.positive_control", f"{control!r} is not a schedule; allowed: {', '.join(schedules)}"
                                                       " (or null: no control)")
    if analysis["power"] <= analysis["alpha"]:
        raise ConfigError("analysis.power", f"{analysis['power']} must exceed analysis.alpha ({analysis['alpha']}): "
                                            "with no effect a test already rejects with probability alpha")


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



def check_model(cfg):
    """The model can be built and read every stage's sequences; model.revision and a local model.init make sense."""
    model = cfg["model"]
    positions = _init_positions(model)
    for stage in STAGES:
        length = cfg["train"][stage]["max_length"]
        if positions is not None and length > positions:
            raise ConfigError(f"train.{stage}.max_length", f"{length} exceeds the position embeddings ({positions}) "
                              "of " + ("model.max_position_embeddings" if model["init"] == "scratch"
                                       else f"model.init {model['init']!r}"))
    if model["hidden_size"] % model["num_attention_heads"]:
        raise ConfigError("model.num_attention_heads", f"{model['num_attention_heads']} does not divide "
                                                       f"model.hidden_size ({model['hidden_size']})")
    if model["revision"] is not None and not is_hub_model(model["init"]):
        what = "scratch" if model["init"] == "scratch" else "a local directory"
        raise ConfigError("model.revision", f"{model['revision']!r} is a hub revision (branch, tag or commit) but "
                                            f"model.init {model['init']!r} is {what}; set model.revision: null")
    init = str(model["init"])
    if init != "scratch" and not is_hub_model(init):
        # a local path: a model directory now, or every job that reads it fails later
        try:
            resolve_local_model(init)
        except PrecswitchError as e:
            raise ConfigError("model.init", str(e).removeprefix("model.init: ")) from None


def check_batches(cfg):
    """A batch larger than the training rows known now (the engine would refuse it when the stage starts)."""
    for stage in STAGES:
        batch, source = cfg["train"][stage]["batch_size"], cfg["data"][stage]
        rows = []
        if source.get("max_train_rows") is not None:
            rows.append((source["max_train_rows"], f"data.{stage}.max_train_rows"))
        if stage == "finetune" and source["kind"] == "synthetic":
            rows.append((cfg["data"]["synthetic"]["n_train"], "data.synthetic.n_train"))
        for n, what in rows:
            if batch > n:
                raise ConfigError(f"train.{stage}.batch_size", f"{batch} exceeds the {n} training rows of {what}")


def _as_list(value):
    return [value] if isinstance(value, str) else list(value or [])


def source_files(source: dict) -> list:
    """The local files a data source reads (empty for synthetic and hub)."""
    if source["kind"] not in FILE_KINDS:
        return []
    return _as_list(source.get("train")) + _as_list(source.get("eval")) + _as_list(source.get("test"))


def check_sources(cfg):
    for stage in STAGES:
        _check_source(stage, cfg["data"][stage])


def _check_source(stage, source):
    """A data source: the files its kind needs exist, and no key it does not read is set."""
    key = f"data.{stage}"
    kind = source["kind"]
    if kind in FILE_KINDS:
        if not source.get("train"):
            raise ConfigError(f"{key}.train", f"required for kind {kind} (file path)")
        if kind != "text":
            if not source.get("eval"):
                raise ConfigError(f"{key}.eval", f"required for kind {kind} (file path)")
            for split in ("train", "eval", "test"):
                if split in source and source[split] is not None and not isinstance(source[split], str):
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
    defaults = {k: v.get("default") for k, v in schema.load()["$defs"]["source"]["properties"].items()}
    for k, v in source.items():
        if k != "kind" and k not in reads and v != defaults.get(k):
            files = " (set kind: tsv, csv, jsonl, parquet or text to read files)"
            raise ConfigError(f"{key}.{k}", f"does not apply to kind {kind}, which reads only "
                                            f"{', '.join(sorted(reads))}; remove it"
                                            + (files if k in ("train", "eval") else ""))
    if stage == "pretrain" and kind in ("tsv", "csv", "jsonl", "parquet"):
        raise ConfigError(f"{key}.kind", f"{kind} is a classification table; stage 1 (masked LM) takes "
                                         "synthetic, text or hub (with text_column)")


def check_cpu_isa(cfg):
    """A cap this CPU does not have (precswitch.cpu_isa), before any job starts."""
    why = cpu_isa_problem(cfg["cpu_isa"])
    if why:
        raise ConfigError("cpu_isa", why)


# stage specs: a precision name, or {precision, switch_to, switch_at, overrides} (an in-stage switch, and
# optimizer hyper-parameters of that stage only): precswitch.specs normalises them and names their runs


#: every check, in the order a config is checked (the first mistake is said)
CHECKS = (check_finite, check_results_dir, check_cpu_isa, check_schedules, check_names, check_precisions, check_seeds,
          check_sequential, check_analysis, check_stage_rules, check_batches, check_overrides, check_model,
          check_sources)
