# Helpers shared by the rules: the schedule -> stage-1 map, paths, checks the schema cannot express,
# and the hyper-parameter builders. No rules here.

import json
import math
import re
import os
import shlex
import sys

from snakemake.exceptions import WorkflowError

PRECISIONS = [
    "fp32",
    "tf32",
    "amp_fp16",
    "amp_bf16",
    "pure_fp16",
    "pure_bf16",
    "pure_bf16_kahan",
    "pure_bf16_sr",
    "fp8",
]
STAGES = ["pretrain", "finetune"]
OBJECTIVE = {"pretrain": "mlm", "finetune": "classify"}
FILE_KINDS = ["text", "tsv", "csv", "jsonl", "parquet"]
# hparams keys that are not the engine's (prepare options) or not the stage's
NOT_HPARAMS = {
    "pretrain": {"max_length"},
    "finetune": {"max_length", "mlm_probability"},
}

# this checkout's workflow/ directory (also when the Snakefile is included from elsewhere)
WORKFLOW_DIR = os.path.dirname(
    str(workflow.current_basedir.get_path_or_uri(secret_free=True))
)

# --- paths (docs/contracts.md, "Results layout") --------------------------------------------------
SYNTH_DIR = "results/data/synth"
SYNTH_FILES = [
    f"{SYNTH_DIR}/corpus.txt",
    f"{SYNTH_DIR}/train.tsv",
    f"{SYNTH_DIR}/dev.tsv",
]
# one tokenizer, trained on the stage-1 source, serves both stages (a fine-tuned model must read the
# token ids it was pre-trained on)
TOKENIZER_DIR = "results/data/pretrain/tokenizer"
PREPARED_DIR = "results/data/{stage}/prepared"
PRETRAIN_DIR = "results/runs/pretrain/{precision}/seed{seed}"
FINETUNE_DIR = "results/runs/finetune/{schedule}/seed{seed}"
LOGS = "results/logs"
BENCHMARKS = "results/benchmarks"


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
            if not os.path.exists(path):
                raise config_error(
                    key,
                    f"file {path!r} not found (relative paths are relative to "
                    f"the working directory {os.getcwd()})",
                )
    if kind == "hub" and not source.get("name"):
        raise config_error(f"{key}.name", "required for kind hub (e.g. nyu-mll/glue)")
    if stage == "pretrain" and kind in ("tsv", "csv", "jsonl", "parquet"):
        raise config_error(
            f"{key}.kind",
            f"{kind} is a classification table; stage 1 (masked LM) takes "
            "synthetic, text or hub (with text_column)",
        )


def check_config(cfg):
    _check_finite(cfg, "")
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
        for stage, precision in stages.items():
            if stage not in STAGES:
                raise config_error(
                    f"schedules.{name}.{stage}",
                    f"unknown stage; allowed: {', '.join(STAGES)}",
                )
            if precision not in PRECISIONS:
                raise config_error(
                    f"schedules.{name}.{stage}",
                    f"unknown precision {precision!r}; allowed: {', '.join(PRECISIONS)}",
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
    model = cfg["model"]
    for stage in STAGES:
        hp = cfg["train"][stage]
        if (hp["steps"] is None) == (hp["epochs"] is None):
            raise config_error(
                f"train.{stage}",
                "set exactly one of steps and epochs (the other null); "
                f"got steps={hp['steps']}, epochs={hp['epochs']}",
            )
        if (
            model["init"] == "scratch"
            and hp["max_length"] > model["max_position_embeddings"]
        ):
            raise config_error(
                f"train.{stage}.max_length",
                f"{hp['max_length']} exceeds model.max_position_embeddings "
                f"({model['max_position_embeddings']})",
            )
    if model["hidden_size"] % model["num_attention_heads"]:
        raise config_error(
            "model.num_attention_heads",
            f"{model['num_attention_heads']} does not divide model.hidden_size "
            f"({model['hidden_size']})",
        )
    for stage in STAGES:
        _check_source(stage, cfg["data"][stage])


check_config(config)

SCHEDULES = config["schedules"]
SEEDS = [int(s) for s in config["seeds"]]
# stage-1 precisions in use: schedules starting with the same precision share their stage-1 runs
STAGE1_PRECISIONS = sorted(
    {s["pretrain"] for s in SCHEDULES.values() if "pretrain" in s}
)
GPU_PER_JOB = 0 if config["device"] == "cpu" else 1


wildcard_constraints:
    precision="|".join(PRECISIONS),
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
# keys of a source spec that mean something for each kind (the schema fills defaults for all)
_CAPS = {"max_train_rows", "max_eval_rows"}
_MLM = {"eval_fraction", "mlm_examples"}
SOURCE_KEYS = {
    "synthetic": {"labels"} | _CAPS | _MLM,
    "text": {"train", "eval"} | _CAPS | _MLM,
    "hub": {
        "name",
        "config",
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


def source_spec(stage):
    """The stage's data source as the JSON `precswitch tokenizer/prepare --source` take."""
    source = config["data"][stage]
    keys = SOURCE_KEYS.get(source["kind"], TABLE_KEYS)
    spec = {k: v for k, v in source.items() if k in keys and v is not None}
    spec["kind"] = source["kind"]
    if source["kind"] == "synthetic":
        spec["dir"] = SYNTH_DIR
    return spec


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
        return f"--pretrained {shlex.quote(model['init'])}"
    options = f"--vocab-size {tok['vocab_size']}"
    options += f" --model-max-length {model['max_position_embeddings']}"
    return options + (" --cased" if tok["cased"] else "")


# --- training -------------------------------------------------------------------------------------
def stage1_precision(schedule):
    return SCHEDULES[schedule].get("pretrain")


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


def _hparams(stage, precision, seed, init, tags):
    hp = {
        k: v for k, v in config["train"][stage].items() if k not in NOT_HPARAMS[stage]
    }
    model = {k: v for k, v in config["model"].items() if k != "init"}
    hp.update(
        run_id=f"{stage}-{tags['schedule'] if 'schedule' in tags else precision}-seed{seed}",
        stage=stage,
        objective=OBJECTIVE[stage],
        precision=precision,
        seed=int(seed),
        tags=tags,
        data=PREPARED_DIR.format(stage=stage),
        tokenizer=TOKENIZER_DIR,
        init=init,
        model=model,
        threads=config["threads"],
        device=config["device"],
    )
    if stage == "pretrain":
        hp["save_checkpoint"] = True
    return json.dumps(hp, sort_keys=True)


def pretrain_hparams(wildcards):
    # no schedule names in stage-1 tags: adding a schedule must not rerun shared stage-1 runs
    return _hparams(
        "pretrain", wildcards.precision, wildcards.seed, config["model"]["init"], {}
    )


def finetune_hparams(wildcards):
    return _hparams(
        "finetune",
        SCHEDULES[wildcards.schedule]["finetune"],
        wildcards.seed,
        finetune_init(wildcards),
        {"schedule": wildcards.schedule},
    )


# --- analysis -------------------------------------------------------------------------------------
def analysis_json():
    return json.dumps(config["analysis"], sort_keys=True)


# --- hub downloads (rule fetch, workflow/rules/download.smk) --------------------------------------
FETCH_MANIFEST = "results/data/fetch-manifest.json"


def _hub_model_init():
    """model.init when it names a hub model (not scratch, not an existing local directory)."""
    init = str(config["model"]["init"])
    if init == "scratch" or os.path.exists(os.path.expanduser(init)):
        return None
    return init


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
    spec = {
        "model": {"init": config["model"]["init"]},
        "data": {stage: config["data"][stage] for stage in STAGES},
    }
    return json.dumps(spec, sort_keys=True)


# Environment prefix for jobs that must not download (compute nodes): everything is in the cache.
OFFLINE_ENV = (
    "HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "
    if fetch_needed()
    else ""
)


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
}
