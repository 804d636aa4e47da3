# Helpers shared by the rules: the schedule -> stage-1 map, paths, checks the schema cannot express,
# and the hyper-parameter builders. No rules here.

import json
import math
import re
import os
import shlex
import sys

from snakemake.exceptions import WorkflowError

# this checkout's workflow/ directory (also when the Snakefile is included from elsewhere)
WORKFLOW_DIR = os.path.dirname(
    str(workflow.current_basedir.get_path_or_uri(secret_free=True))
)
# the precision names come from the package's catalog (src/precswitch/catalog.py, torch-free); the package is
# installed editable, and this checkout's src/ goes first in case another copy is installed
_SRC = os.path.join(os.path.dirname(WORKFLOW_DIR), "src")
if os.path.isdir(_SRC) and _SRC not in sys.path:
    sys.path.insert(0, _SRC)
import precswitch.gpu as precswitch_gpu
import precswitch.sweeps as precswitch_sweeps
from precswitch.specs import run_spec, spec_name, stage_spec
from precswitch.catalog import SPECS, NAMES, eval_precision_problem
from precswitch.train.config import DEFAULTS as HP_DEFAULTS
from precswitch.train.config import switch_step as precswitch_switch_step
from precswitch.fetch import is_hub_model, resolve_local_model
from precswitch.data.loading import check_table_headers
from precswitch.errors import PrecswitchError

PRECISIONS = list(NAMES)
STAGES = ["pretrain", "finetune"]
OBJECTIVE = {"pretrain": "mlm", "finetune": "classify"}
FILE_KINDS = ["text", "tsv", "csv", "jsonl", "parquet"]
# hparams keys that are not the engine's (prepare options) or not the stage's
NOT_HPARAMS = {
    "pretrain": {"max_length"},
    "finetune": {"max_length", "mlm_probability"},
}


# --- paths (docs/contracts.md, "Results layout") --------------------------------------------------
# every output of a study is under its results_dir: two studies run from one checkout never share
# (or overwrite) a file
RESULTS = os.path.normpath(config["results_dir"])
SYNTH_DIR = f"{RESULTS}/data/synth"
SYNTH_FILES = [
    f"{SYNTH_DIR}/corpus.txt",
    f"{SYNTH_DIR}/train.tsv",
    f"{SYNTH_DIR}/dev.tsv",
]
# one tokenizer, trained on the stage-1 source, serves both stages (a fine-tuned model must read the
# token ids it was pre-trained on)
TOKENIZER_DIR = f"{RESULTS}/data/pretrain/tokenizer"
PREPARED_DIR = f"{RESULTS}/data/{{stage}}/prepared"
PRETRAIN_DIR = f"{RESULTS}/runs/pretrain/{{precision}}/seed{{seed}}"
FINETUNE_DIR = f"{RESULTS}/runs/finetune/{{schedule}}/seed{{seed}}"
# the finished runs a rerun replaces, as they were (keep_previous_runs)
PREVIOUS = f"{RESULTS}/previous"
LOGS = f"{RESULTS}/logs"
BENCHMARKS = f"{RESULTS}/benchmarks"


def _load_schema():
    import yaml

    with open(os.path.join(WORKFLOW_DIR, "schemas", "config.schema.yaml")) as f:
        return yaml.safe_load(f)


SCHEMA = _load_schema()


def _schema_default(*keys):
    node = SCHEMA
    for key in keys:
        node = node["properties"][key]
    return node["default"]


DEFAULT_CONTRASTS = _schema_default("analysis", "contrasts")


#: the schema's default of every data-source key (a key a kind does not read must keep it)
SOURCE_DEFAULTS = {
    k: v.get("default") for k, v in SCHEMA["$defs"]["source"]["properties"].items()
}

# keys of a source spec that mean something for each kind (the schema fills defaults for all)
_CAPS = {"max_train_rows", "max_eval_rows"}
_MLM = {"eval_fraction", "mlm_examples"}
SOURCE_KEYS = {
    "synthetic": {"labels"} | _CAPS | _MLM,
    "text": {"train", "eval"} | _CAPS | _MLM,
    "hub": {
        "name",
        "config",
        "revision",
        "train_split",
        "eval_split",
        "columns",
        "text_column",
        "labels",
    }
    | _CAPS
    | _MLM,
}
TABLE_KEYS = {"train", "eval", "columns", "labels", "max_train_rows", "max_eval_rows"}


def config_error(key, message):
    """A config mistake: one line naming the key, raised before the DAG is built."""
    return WorkflowError(f"config key {key}: {message}")


# --- checks the JSON schema cannot express --------------------------------------------------------
def _check_finite(value, key):
    if isinstance(value, float) and not math.isfinite(value):
        raise config_error(key, f"{value} is not a finite number")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_finite(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_finite(v, f"{key}[{i}]")


def _as_list(value):
    return [value] if isinstance(value, str) else list(value or [])


def _source_files(source):
    """The local files a data source reads (empty for synthetic and hub)."""
    if source["kind"] not in FILE_KINDS:
        return []
    return _as_list(source.get("train")) + _as_list(source.get("eval"))


def _check_source(stage, source):
    key = f"data.{stage}"
    kind = source["kind"]
    if kind in FILE_KINDS:
        if not source.get("train"):
            raise config_error(f"{key}.train", f"required for kind {kind} (file path)")
        if kind != "text":
            if not source.get("eval"):
                raise config_error(
                    f"{key}.eval", f"required for kind {kind} (file path)"
                )
            for split in ("train", "eval"):
                if not isinstance(source[split], str):
                    raise config_error(
                        f"{key}.{split}", f"kind {kind} takes one file path, not a list"
                    )
        for path in _source_files(source):
            if os.path.isdir(path):
                raise config_error(
                    key, f"{path!r} is a directory; name the file(s) in it"
                )
            if not os.path.exists(path):
                raise config_error(
                    key,
                    f"file {path!r} not found (relative paths are relative to "
                    f"the working directory {os.getcwd()})",
                )
    if kind != "hub" and source.get("revision") is not None:
        raise config_error(
            f"{key}.revision",
            f"{source['revision']!r} is a hub revision (branch, tag or commit) and this source is "
            f"kind {kind}; set it to null or use kind hub",
        )
    if kind == "hub" and not source.get("name"):
        raise config_error(f"{key}.name", "required for kind hub (e.g. nyu-mll/glue)")
    if stage == "finetune" and kind == "text":
        raise config_error(
            f"{key}.kind",
            "text is unlabelled lines (masked LM only); stage 2 (classification) takes "
            "synthetic, tsv, csv, jsonl, parquet or hub",
        )
    # a key this kind does not read would be dropped silently (e.g. train/eval files with the
    # default kind synthetic: the study would train on the synthetic language)
    reads = SOURCE_KEYS.get(kind, TABLE_KEYS)
    for k, v in source.items():
        if k != "kind" and k not in reads and v != SOURCE_DEFAULTS.get(k):
            files = " (set kind: tsv, csv, jsonl, parquet or text to read files)"
            raise config_error(
                f"{key}.{k}",
                f"does not apply to kind {kind}, which reads only "
                f"{', '.join(sorted(reads))}; remove it"
                + (files if k in ("train", "eval") else ""),
            )
    if stage == "pretrain" and kind in ("tsv", "csv", "jsonl", "parquet"):
        raise config_error(
            f"{key}.kind",
            f"{kind} is a classification table; stage 1 (masked LM) takes "
            "synthetic, text or hub (with text_column)",
        )


# --- stage specs: a precision name, or {precision, switch_to, switch_at, overrides} -------------------
# (an in-stage switch, and optimizer hyper-parameters of that stage only): precswitch.specs normalises
# them and names their runs (stage_spec, run_spec, spec_name)


def _check_precision(name, key):
    if name not in PRECISIONS:
        raise config_error(
            key, f"unknown precision {name!r}; allowed: {', '.join(PRECISIONS)}"
        )


def _refuse_gpu_only(spec, train, key, where, stage):
    """Refuse the precisions a stage would run (its own, switch_to, eval_precision) that cannot run on a
    CPU, when the stage is set to fail on them (on_unsupported: error)."""
    if train["on_unsupported"] != "error":
        return
    names = [
        n
        for n in dict.fromkeys(
            [spec["precision"], spec["switch_to"], train["eval_precision"]]
        )
        if n in SPECS and "cpu" not in SPECS[n].device_types
    ]
    if names:
        raise config_error(
            key,
            f"{', '.join(names)} cannot run on a CPU ({where}): "
            f"{' and '.join(f'{n} needs {SPECS[n].device_types[0]}' for n in names)}; set device: cuda "
            f"on a GPU machine, or train.{stage}.on_unsupported: skip to record such runs as skipped",
        )


def _storage(name):
    p = SPECS[name]
    return (p.param_dtype, p.update_compensation, p.fp8_linear)


def _check_switch(precision, switch_to, key):
    """An in-stage switch keeps the weights: both precisions must store them the same way."""
    _check_precision(switch_to, f"{key}.switch_to")
    if _storage(precision) != _storage(switch_to):
        same = [
            p
            for p in PRECISIONS
            if p != precision and _storage(p) == _storage(precision)
        ]
        raise config_error(
            f"{key}.switch_to",
            f"cannot switch from {precision} to {switch_to} inside a stage: their weights are "
            f"stored differently; allowed from {precision}: {', '.join(same) or 'none'} "
            "(or use two stages)",
        )


def check_stage(value, key):
    spec = stage_spec(value)
    if spec["precision"] is None:
        raise config_error(f"{key}.precision", "required (the stage's first precision)")
    _check_precision(
        spec["precision"], key if isinstance(value, str) else f"{key}.precision"
    )
    if (spec["switch_to"] is None) != (spec["switch_at"] is None):
        raise config_error(
            key, "switch_to and switch_at go together: set both (or neither)"
        )
    if spec["switch_to"] is not None:
        if not 0 < spec["switch_at"] <= 1:
            raise config_error(
                f"{key}.switch_at",
                f"{spec['switch_at']} is outside (0, 1]: the fraction of the stage's steps run in "
                f"{spec['precision']} before switching to {spec['switch_to']}",
            )
        _check_switch(spec["precision"], spec["switch_to"], key)
    return spec


def _check_overrides(spec, train, key, stage):
    """An override that repeats train.<stage>'s value would train the same run again under another name."""
    for k, v in spec["overrides"].items():
        if float(v) == float(train[k]):
            raise config_error(
                f"{key}.overrides.{k}",
                f"{v} is train.{stage}.{k} already: the stage would repeat the run without overrides "
                f"under another name; leave {k} out of overrides (or give it another value)",
            )


def expand_sweeps(cfg):
    """Add the schedules of every switch-point sweep (<name>-at<percent>) to cfg["schedules"].

    A sweep names one stage with {precision, switch_to} and no switch_at (the swept stage) and a
    list of fractions f of that stage's steps run in `precision` before switching to `switch_to`:
    f = 1 runs the whole stage in `precision` (no switch), f = 0 the whole stage in `switch_to`.
    Each schedule's stage-2 tags carry sweep, sweep_at (= f) and sweep_stage.
    """
    sweeps = cfg.get("sweeps") or {}
    meta = {}
    for name, sweep in sweeps.items():
        key = f"sweeps.{name}"
        swept = precswitch_sweeps.swept_stages(sweep)
        if len(swept) != 1:
            continue  # precswitch.sweeps.expand below says what is wrong
        stage = swept[0]
        first, then = sweep[stage]["precision"], sweep[stage]["switch_to"]
        _check_precision(first, f"{key}.{stage}.precision")
        _check_switch(first, then, f"{key}.{stage}")
        for i, f in enumerate(sweep["switch_at"]):
            if not 0 <= f <= 1:
                raise config_error(
                    f"{key}.switch_at[{i}]",
                    f"{f} is outside [0, 1] (fraction in {first})",
                )
            meta[precswitch_sweeps.point_name(name, f)] = {
                "sweep": name,
                "sweep_at": f,
                "sweep_stage": stage,
            }
    try:  # one stage swept, no two points or schedules of one name (the messages name the key)
        cfg["schedules"].update(precswitch_sweeps.expand(sweeps, cfg["schedules"]))
    except PrecswitchError as e:
        raise WorkflowError(str(e)) from None
    return meta


def _init_positions(model):
    """The position embeddings of the model a study starts from: model.max_position_embeddings
    (scratch) or a local model.init's config.json; None for a hub model (known after fetch).
    """
    if model["init"] == "scratch":
        return model["max_position_embeddings"]
    # ~ as the engine and `precswitch tokenizer` read it (precswitch.fetch)
    path = os.path.join(os.path.expanduser(str(model["init"])), "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f).get("max_position_embeddings")


def _check_switch_step(spec, hp, key):
    """The engine switches at step round(switch_at * steps) and refuses a switch_at that rounds to
    step 0 or (below 1) to the last step (precswitch.train.config.switch_step): asked here for a
    stage with steps, before anything trains (an epochs stage's step count only the engine knows).
    """
    if spec["switch_to"] is None or hp["steps"] is None:
        return
    try:
        precswitch_switch_step(spec, hp["steps"])
    except PrecswitchError as e:
        raise config_error(f"{key}.switch_at", str(e)) from None


def _check_batch_fits(cfg, stage):
    """A batch larger than the training rows is refused by the engine when the stage starts (for
    stage 2: after every stage-1 run trained); what is known now is checked now."""
    batch, source = cfg["train"][stage]["batch_size"], cfg["data"][stage]
    rows = []
    if source.get("max_train_rows") is not None:
        rows.append((source["max_train_rows"], f"data.{stage}.max_train_rows"))
    if stage == "finetune" and source["kind"] == "synthetic":
        n = (cfg["data"].get("synthetic") or {}).get("n_train", 3000)
        rows.append((n, "data.synthetic.n_train"))
    for n, what in rows:
        if batch > n:
            raise config_error(
                f"train.{stage}.batch_size",
                f"{batch} exceeds the {n} training rows of {what}",
            )


def check_config(cfg):
    _check_finite(cfg, "")
    if os.path.exists(cfg["results_dir"]) and not os.path.isdir(cfg["results_dir"]):
        raise config_error(
            "results_dir",
            f"{cfg['results_dir']!r} exists and is not a directory; name a directory for the study's outputs",
        )
    schedules = cfg["schedules"]
    if not schedules:
        raise config_error("schedules", "needs at least one schedule")
    for name, stages in schedules.items():
        if not stages or "finetune" not in stages:
            raise config_error(
                f"schedules.{name}",
                "needs a finetune precision (and optionally a pretrain one), "
                f"e.g. {{pretrain: amp_fp16, finetune: fp32}}; allowed: {', '.join(PRECISIONS)}",
            )
        for stage, value in stages.items():
            if stage not in STAGES:
                raise config_error(
                    f"schedules.{name}.{stage}",
                    f"unknown stage; allowed: {', '.join(STAGES)}",
                )
            check_stage(value, f"schedules.{name}.{stage}")
    for name, stages in schedules.items():
        for stage, value in stages.items():
            ev = cfg["train"][stage]["eval_precision"]
            precision = stage_spec(value)["precision"]
            why = eval_precision_problem(precision, ev)
            if why:
                raise config_error(
                    f"train.{stage}.eval_precision",
                    f"{ev} cannot evaluate the {precision} {stage} stage of schedule {name}: {why}",
                )
    if cfg["device"] == "cpu":
        for name, stages in schedules.items():
            for stage, value in stages.items():
                _refuse_gpu_only(
                    stage_spec(value),
                    cfg["train"][stage],
                    f"schedules.{name}.{stage}",
                    "device is cpu",
                    stage,
                )
    for stage in STAGES:
        train = cfg["train"][stage]
        if train["compile"] != "off" and train["telemetry_every"]:
            raise config_error(
                f"train.{stage}.compile",
                f"{train['compile']} with telemetry_every {train['telemetry_every']}: activation "
                "telemetry hooks run in eager mode only; set compile: off or telemetry_every: 0",
            )
    seeds = cfg["seeds"]
    if not seeds:
        raise config_error("seeds", "needs at least one seed")
    duplicates = sorted({s for s in seeds if seeds.count(s) > 1})
    if duplicates:
        raise config_error(
            "seeds", f"duplicate seeds {duplicates}; each seed may appear once"
        )
    analysis = cfg["analysis"]
    if analysis["baseline"] not in schedules:
        raise config_error(
            "analysis.baseline",
            f"{analysis['baseline']!r} is not a schedule; allowed: {', '.join(schedules)}",
        )
    for i, pair in enumerate(analysis["contrasts"]):
        if pair[0] == pair[1]:
            # precswitch stats would drop it as "missing": say so now, naming the pair
            raise config_error(
                f"analysis.contrasts[{i}]",
                f"compares {pair[0]!r} with itself; give two different schedules",
            )
        missing = [name for name in pair if name not in schedules]
        # the schema's default pair is dropped quietly by studies without those schedules; a pair
        # written in the config must name schedules that run
        if missing and analysis["contrasts"] != DEFAULT_CONTRASTS:
            raise config_error(
                f"analysis.contrasts[{i}]",
                f"{', '.join(map(repr, missing))} is not a schedule; allowed: {', '.join(schedules)}",
            )
    if analysis["power"] <= analysis["alpha"]:
        # precswitch stats would stop on it after the whole study trained
        raise config_error(
            "analysis.power",
            f"{analysis['power']} must exceed analysis.alpha ({analysis['alpha']}): with no effect a "
            "test already rejects with probability alpha, so no number of seeds reaches a lower power",
        )
    model = cfg["model"]
    for stage in STAGES:
        hp = cfg["train"][stage]
        if (hp["steps"] is None) == (hp["epochs"] is None):
            raise config_error(
                f"train.{stage}",
                "set exactly one of steps and epochs (the other null); "
                f"got steps={hp['steps']}, epochs={hp['epochs']}",
            )
        positions = _init_positions(model)
        if positions is not None and hp["max_length"] > positions:
            raise config_error(
                f"train.{stage}.max_length",
                f"{hp['max_length']} exceeds the position embeddings ({positions}) of "
                + (
                    "model.max_position_embeddings"
                    if model["init"] == "scratch"
                    else f"model.init {model['init']!r}"
                ),
            )
        if hp["steps"] is not None and hp["timing_warmup_steps"] >= hp["steps"]:
            raise config_error(
                f"train.{stage}.timing_warmup_steps",
                f"{hp['timing_warmup_steps']} leaves none of the stage's {hp['steps']} steps "
                "for the steady-state throughput; use fewer",
            )
        _check_batch_fits(cfg, stage)
    for name, stages in schedules.items():
        for stage, value in stages.items():
            _check_switch_step(
                stage_spec(value), cfg["train"][stage], f"schedules.{name}.{stage}"
            )
            _check_overrides(
                stage_spec(value),
                cfg["train"][stage],
                f"schedules.{name}.{stage}",
                stage,
            )
    if model["hidden_size"] % model["num_attention_heads"]:
        raise config_error(
            "model.num_attention_heads",
            f"{model['num_attention_heads']} does not divide model.hidden_size "
            f"({model['hidden_size']})",
        )
    if model["revision"] is not None and not is_hub_model(model["init"]):
        what = "scratch" if model["init"] == "scratch" else "a local directory"
        raise config_error(
            "model.revision",
            f"{model['revision']!r} is a hub revision (branch, tag or commit) but model.init "
            f"{model['init']!r} is {what}; set model.revision: null",
        )
    init = str(model["init"])
    if init != "scratch" and not is_hub_model(init):
        # a local path (starts with . / ~, or has two /): a model directory now, or every job that
        # reads it fails later (a mistyped one would otherwise be looked up on the hub)
        try:
            resolve_local_model(init)
        except PrecswitchError as e:
            raise config_error(
                "model.init", str(e).removeprefix("model.init: ")
            ) from None
    for stage in STAGES:
        _check_source(stage, cfg["data"][stage])


_check_finite(config.get("sweeps") or {}, "sweeps")
# YAML reads an unquoted `compile: off` as false: one spelling from here on
for _stage in STAGES:
    if config["train"][_stage]["compile"] is False:
        config["train"][_stage]["compile"] = "off"
SWEEPS = expand_sweeps(config)
check_config(config)


def threads_note(threads, cores):
    """A training job pins torch to `threads` CPU threads (its hparams; results depend on it), but
    Snakemake scales a job's threads down to --cores: more threads than cores oversubscribes them.
    """
    if not cores or threads <= cores:
        return None
    return (
        f"precswitch: warning: threads {threads} is more than --cores {cores}: Snakemake gives each "
        f"training job {cores} core(s), but torch runs {threads} threads in it, so the timings are "
        f"oversubscribed; run with --cores {threads} or more, or set threads: {cores}"
    )


def _local_cores():
    """--cores of a local run; None for a cluster run. Read at parse time, when workflow.local_exec is still
    True for every run (the executor is set later): a cluster executor's real run has no total (reading it
    raises), and its dry run has 1, which Snakemake sets for any dry run without --cores, with --jobs (the
    cluster profile's jobs: 100) kept as the node count; a local run's --jobs N becomes its cores instead.
    So a node count means the 1 is not the cores the jobs will get (also for a local dry run with -j N).
    """
    nodes = workflow.global_resources.get("_nodes")
    if getattr(nodes, "value", nodes) is not None:
        return None
    try:
        return workflow.cores
    except WorkflowError:
        return None


_THREADS_NOTE = threads_note(config["threads"], _local_cores())
if _THREADS_NOTE:
    print(_THREADS_NOTE, file=sys.stderr)


SCHEDULES = {
    name: {stage: run_spec(v) for stage, v in stages.items()}
    for name, stages in config["schedules"].items()
}
SEEDS = [int(s) for s in config["seeds"]]
# stage-1 runs in use, by name (the precision wildcard): schedules whose stage 1 is the same (same
# precision, same in-stage switch) share their stage-1 runs
STAGE1 = {}
_STAGE1_OWNER = {}
for _name, _stages in SCHEDULES.items():
    if "pretrain" not in _stages:
        continue
    _run = spec_name(_stages["pretrain"])
    if STAGE1.setdefault(_run, _stages["pretrain"]) != _stages["pretrain"]:
        # the name keeps 6 significant digits of the percent: two switch points closer than that would share one
        # run, trained at one of them, and the other schedule would fine-tune from a stage 1 it did not ask for
        raise config_error(
            f"schedules.{_name}.pretrain",
            f"switch_at {_stages['pretrain']['switch_at']} and schedule {_STAGE1_OWNER[_run]}'s "
            f"{STAGE1[_run]['switch_at']} give one stage-1 run name, {_run!r}; make them equal or further apart",
        )
    _STAGE1_OWNER.setdefault(_run, _name)
STAGE1_PRECISIONS = sorted(STAGE1)


def training_gpus(wildcards):
    """A training job's `gpu` resource: 1 (a GPU of its own; profiles/default's gpu: 1 then runs one timed
    job at a time) unless the job trains on the CPU: device cpu, or device auto in a local run on a
    machine where torch sees no CUDA GPU, whose jobs need not queue for a GPU slot they never use.
    Evaluated when the jobs are planned, not at parse time: only then is the executor known (at parse
    every run looks local). A cluster run (the GPU is on the node, not on the submit host) and a dry run
    (a plan, maybe for another machine) keep 1 for auto."""
    return 0 if trains_on_cpu_here() else 1


def trains_on_cpu_here():
    """The training jobs of this run train on the CPU: device cpu, or device auto in a local run (not a
    dry run) on a machine where torch sees no CUDA GPU."""
    device = str(config["device"])
    if device == "cpu":
        return True
    if device != "auto" or not workflow.local_exec or workflow.dryrun:
        return False
    import torch

    return not torch.cuda.is_available()


wildcard_constraints:
    # the study's stage-1 runs only: another catalog precision has no run to make (its
    # hparams would be a KeyError)
    precision="|".join(re.escape(p) for p in sorted(STAGE1, key=len, reverse=True)),
    schedule="|".join(re.escape(s) for s in SCHEDULES),
    seed=r"\d+",
    stage="|".join(STAGES),


# --- the precswitch command -----------------------------------------------------------------------
# Rules call `precswitch`: workflow/scripts/precswitch runs this checkout's CLI with the first
# `python` on PATH. Put the interpreter running Snakemake first, so that `.venv/bin/snakemake` works
# without activating the venv (with --sdm conda, the rule's env is activated in front of it).
os.environ.update(
    PATH=os.pathsep.join(
        [
            os.path.join(WORKFLOW_DIR, "scripts"),
            os.path.dirname(sys.executable),
            os.environ.get("PATH", ""),
        ]
    )
)


# --- data -----------------------------------------------------------------------------------------


def source_spec(stage):
    """The stage's data source as the JSON `precswitch tokenizer/prepare --source` take."""
    source = config["data"][stage]
    keys = SOURCE_KEYS.get(source["kind"], TABLE_KEYS)
    spec = {k: v for k, v in source.items() if k in keys and v is not None}
    spec["kind"] = source["kind"]
    if source["kind"] == "synthetic":
        spec["dir"] = SYNTH_DIR
    return spec


# a misspelt column of a local table is named now, not by the prepare job that runs beside stage 1
for _stage in STAGES:
    try:
        check_table_headers(source_spec(_stage))
    except PrecswitchError as e:
        raise config_error(
            f"data.{_stage}.columns", str(e).removeprefix("source: ")
        ) from None


def source_json(stage):
    return json.dumps(source_spec(stage), sort_keys=True)


def source_inputs(stage):
    """Files a stage's source reads (so that editing them reruns what depends on them)."""
    if config["data"][stage]["kind"] == "synthetic":
        return SYNTH_FILES
    return _source_files(config["data"][stage])


def tokenizer_options():
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


# --- training -------------------------------------------------------------------------------------
def stage1_precision(schedule):
    """The stage-1 run name of a schedule (its directory under results/runs/pretrain), or None."""
    spec = SCHEDULES[schedule].get("pretrain")
    return None if spec is None else spec_name(spec)


def pretrain_metrics():
    return expand(
        f"{PRETRAIN_DIR}/metrics.json", precision=STAGE1_PRECISIONS, seed=SEEDS
    )


def finetune_metrics():
    return expand(f"{FINETUNE_DIR}/metrics.json", schedule=list(SCHEDULES), seed=SEEDS)


def finetune_init(wildcards):
    """Stage 2 starts from the stage-1 checkpoint of its schedule, or from model.init."""
    precision = stage1_precision(wildcards.schedule)
    if precision is None:
        return config["model"]["init"]
    run = PRETRAIN_DIR.format(precision=precision, seed=wildcards.seed)
    return f"{run}/checkpoint"


def finetune_inputs(wildcards):
    precision = stage1_precision(wildcards.schedule)
    if precision is None:
        return {}
    run = PRETRAIN_DIR.format(precision=precision, seed=wildcards.seed)
    return {"stage1": f"{run}/metrics.json", "checkpoint": f"{run}/checkpoint"}


def _hparams(stage, spec, seed, init, tags):
    hp = {
        k: v for k, v in config["train"][stage].items() if k not in NOT_HPARAMS[stage]
    }
    if not hp.get("telemetry_every"):
        hp.pop(
            "telemetry_every", None
        )  # off: the engine's default (keeps old runs' params)
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
        data=PREPARED_DIR.format(stage=stage),
        tokenizer=TOKENIZER_DIR,
        init=init,
        model=model,
        threads=config["threads"],
        device=config["device"],
    )
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
    return json.dumps(hp, sort_keys=True)


def pretrain_hparams(wildcards):
    # no schedule names in stage-1 tags: adding a schedule must not rerun shared stage-1 runs
    return _hparams(
        "pretrain",
        STAGE1[wildcards.precision],
        wildcards.seed,
        config["model"]["init"],
        {},
    )


def finetune_hparams(wildcards):
    tags = {"schedule": wildcards.schedule, **SWEEPS.get(wildcards.schedule, {})}
    return _hparams(
        "finetune",
        SCHEDULES[wildcards.schedule]["finetune"],
        wildcards.seed,
        finetune_init(wildcards),
        tags,
    )


# a stage the device cannot run (on_unsupported: skip) writes metrics.json only: give it an empty log
STEPS_HEADER = "step,loss,lr,grad_norm,loss_scale,step_seconds,skipped"


# --- analysis -------------------------------------------------------------------------------------
def analysis_json():
    """The analysis settings for precswitch stats; the schema's default contrast pairs that name a
    schedule this study does not run are dropped here (check_config lets them through quietly).
    """
    analysis = dict(config["analysis"])
    if analysis["contrasts"] == DEFAULT_CONTRASTS:
        analysis["contrasts"] = [
            pair
            for pair in analysis["contrasts"]
            if all(name in SCHEDULES for name in pair)
        ]
    return json.dumps(analysis, sort_keys=True)


# --- hub downloads (rule fetch, workflow/rules/download.smk) --------------------------------------
FETCH_MANIFEST = f"{RESULTS}/data/fetch-manifest.json"


def _hub_model_init():
    """model.init when it names a hub model (not scratch, not a local path: precswitch.fetch decides,
    as the fetch job does; a local path that is not a model directory was refused by check_config).
    """
    init = str(config["model"]["init"])
    return init if is_hub_model(init) else None


def fetch_needed():
    """True when the config reads anything from the hub (a model or a data source)."""
    return _hub_model_init() is not None or any(
        config["data"][stage]["kind"] == "hub" for stage in STAGES
    )


def fetch_inputs(wildcards=None):
    """Input function: the fetch manifest when the config needs the hub, else nothing."""
    return [FETCH_MANIFEST] if fetch_needed() else []


def fetch_config_json():
    """The part of the config `precswitch fetch` reads (changing it reruns the fetch)."""

    # a revision left null is left out, so that adding the key did not rerun existing studies
    def pinned(d):
        return {k: v for k, v in d.items() if k != "revision" or v is not None}

    spec = {
        "model": pinned(
            {"init": config["model"]["init"], "revision": config["model"]["revision"]}
        ),
        "data": {stage: pinned(config["data"][stage]) for stage in STAGES},
    }
    return json.dumps(spec, sort_keys=True)


# Environment of jobs that must not download (compute nodes): everything is in the cache. The rules
# put OFFLINE_ENV in front of their command.
OFFLINE_VARS = (
    {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if fetch_needed()
    else {}
)
OFFLINE_ENV = "".join(f"{k}={v} " for k, v in OFFLINE_VARS.items())


def caption(name):
    """workflow/report/<name>.rst (path relative to the rule files), or None while it is not written."""
    path = os.path.join(WORKFLOW_DIR, "report", f"{name}.rst")
    return f"../report/{name}.rst" if os.path.exists(path) else None


# plot name (precswitch.analysis.plots.PLOT_NAMES) -> where it goes in the HTML report
PLOTS = {
    "accuracy": {
        "category": "Accuracy",
        "labels": {"figure": "fine-tuned accuracy per schedule", "stage": "finetune"},
    },
    "forest": {
        "category": "Accuracy",
        "labels": {"figure": "paired differences vs baseline", "stage": "finetune"},
    },
    "stage1": {
        "category": "Accuracy",
        "labels": {"figure": "stage-1 masked-LM metrics", "stage": "pretrain"},
    },
    "time_memory": {
        "category": "Cost",
        "labels": {"figure": "training time and peak memory", "stage": "both"},
    },
    "loss_curves": {
        "category": "Numerics",
        "labels": {"figure": "training loss curves", "stage": "both"},
    },
    "loss_scale": {
        "category": "Numerics",
        "labels": {"figure": "fp16 loss scale and skipped steps", "stage": "both"},
    },
    "switch_point": {
        "category": "Switch point",
        "labels": {"figure": "accuracy and time vs switch point", "stage": "swept"},
    },
    "overflow": {
        "category": "Numerics",
        "labels": {
            "figure": "max |activation| per layer vs fp16 limit",
            "stage": "pretrain",
        },
    },
}


# a plot this config cannot fill is not drawn (nor put in the report): the switch-point plot needs a
# sweep, the overflow plot stage-1 activation telemetry
if not config.get("sweeps"):
    del PLOTS["switch_point"]
if not config["train"]["pretrain"].get("telemetry_every"):
    del PLOTS["overflow"]


def check_cuda_build_for_cluster(device):
    """onstart with a cluster executor: the jobs run this interpreter's environment on GPU nodes (unless
    --sdm gives them their own), so a CPU-only torch here fails every training job there, after its wait
    in the queue and its retries. A CUDA build is known without a GPU (torch.version.cuda).
    """
    if not device.startswith("cuda") or workflow.deployment_settings.deployment_method:
        return
    if not any(
        j.rule.name in ("pretrain", "finetune") for j in workflow.dag.needrun_jobs()
    ):
        return
    import torch

    if torch.version.cuda is None and not getattr(torch.version, "hip", None):
        raise WorkflowError(
            f"config key device: {device}, but torch {torch.__version__} in {sys.prefix}, which the "
            "cluster jobs run, is a CPU-only build: every training job would fail on its GPU node; "
            "install a CUDA build of torch there (README, docs/slurm.md)"
        )


def check_gpu_here():
    """onstart (real runs only): training jobs run here with device cuda need a GPU torch can see.
    Said before any job starts, instead of after the data jobs, when the first training job fails.
    """
    device = str(config["device"])
    if not workflow.local_exec:
        check_cuda_build_for_cluster(device)
        return
    if not (device.startswith("cuda") or device == "auto"):
        return
    training = [
        j
        for j in workflow.dag.needrun_jobs()
        if j.rule.name in ("pretrain", "finetune")
    ]
    if not training:
        return  # e.g. only the fetch rule, on a login node
    import torch

    # auto without a GPU is cpu: refuse what a CPU cannot run, before any job
    if device == "auto":
        if torch.cuda.is_available():
            _note_gpu_limit(device, len(training))
            return
        where = f"device is auto and torch {torch.__version__} sees no CUDA GPU here"
        for j in training:
            stage = "pretrain" if j.rule.name == "pretrain" else "finetune"
            if stage == "pretrain":
                spec = STAGE1[j.wildcards.precision]
                schedule = next(
                    n
                    for n, st in SCHEDULES.items()
                    if "pretrain" in st and st["pretrain"] == spec
                )
            else:
                schedule = j.wildcards.schedule
                spec = SCHEDULES[schedule]["finetune"]
            _refuse_gpu_only(
                spec,
                config["train"][stage],
                f"schedules.{schedule}.{stage}",
                where,
                stage,
            )
        return
    if not torch.cuda.is_available():
        raise WorkflowError(
            f"config key device: {config['device']}, but this machine has no CUDA GPU that torch "
            f"{torch.__version__} can see, and {len(training)} training jobs would run here; run on "
            "a GPU machine, install a CUDA build of torch (README), or set device: cpu"
        )
    _note_gpu_limit(device, len(training))


def _note_gpu_limit(device, n_jobs):
    """onstart: say when the gpu resource limit is not one training job per visible GPU."""
    import torch
    from snakemake.logging import logger

    # Snakemake 9 keeps parsed resources as objects (value None when not set)
    limit = workflow.global_resources.get("gpu")
    limit = getattr(limit, "value", limit)
    note = precswitch_gpu.gpu_limit_note(
        None if limit is None else int(limit), torch.cuda.device_count(), n_jobs, device
    )
    if note:
        logger.warning(f"precswitch: {note}")


def _link_or_copy(src, dst):
    """Hard-link a large file (a checkpoint's weights: no copy, no space until the rerun replaces the
    original; the engine writes every file anew, never in place), copy a small one."""
    import shutil

    if os.path.getsize(src) > (1 << 20):
        try:
            os.link(src, dst)
            return dst
        except OSError:  # another filesystem, or links not allowed: copy
            pass
    return shutil.copy2(src, dst)


def keep_previous_runs():
    """onstart (real runs only): Snakemake deletes a job's old outputs when it starts it again (its
    params, code or inputs changed, or -R), so a rerun that then fails would leave the finished run
    gone. Keep each finished run that will rerun (its run dir, less resume/, and its log) under
    <results_dir>/previous/, the latest previous version of each, before any job starts.
    """
    import shutil

    from snakemake.logging import logger

    kept = []
    for j in workflow.dag.needrun_jobs():
        if j.rule.name not in ("pretrain", "finetune"):
            continue
        run_dir = os.path.dirname(j.output.metrics)
        if not os.path.isfile(j.output.metrics):
            continue  # nothing finished to lose: a new run, or an interrupted one (resume/ stays put)
        rel = os.path.relpath(run_dir, RESULTS)
        dst = os.path.join(PREVIOUS, rel)
        tmp = f"{dst}.incoming"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(
            run_dir,
            tmp,
            copy_function=_link_or_copy,
            ignore=shutil.ignore_patterns("resume"),
        )
        for log in j.log:
            if os.path.isfile(log):
                shutil.copy2(log, os.path.join(tmp, os.path.basename(log)))
        shutil.rmtree(dst, ignore_errors=True)
        os.replace(tmp, dst)
        kept.append(rel)
    if kept:
        logger.info(
            f"precswitch: {len(kept)} finished run(s) will rerun; their previous results are kept "
            f"under {PREVIOUS}/ (e.g. {kept[0]}): delete it when no longer needed"
        )
