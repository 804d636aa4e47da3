# Wiring shared by the rules: paths, input and params functions over the checked study (STUDY, made by
# the Snakefile with precswitch.study.plan), the onstart checks. The study's logic is in
# src/precswitch/study/. No rules here.

import json
import os
import re
import sys

from snakemake.exceptions import WorkflowError
from precswitch.gpu import physical_gpus

# this checkout's workflow/ directory (also when the Snakefile is included from elsewhere)
WORKFLOW_DIR = os.path.dirname(
    str(workflow.current_basedir.get_path_or_uri(secret_free=True))
)
STAGES = list(study.STAGES)
OBJECTIVE = study.OBJECTIVE


# --- paths (docs/contracts.md, "Results layout") --------------------------------------------------
# every output of a study is under its results_dir: two studies run from one checkout never share
# (or overwrite) a file
RESULTS = os.path.normpath(config["results_dir"])
SYNTH_DIR = f"{RESULTS}/data/synth"
SYNTH_FILES = [
    f"{SYNTH_DIR}/corpus.txt",
    f"{SYNTH_DIR}/train.tsv",
    f"{SYNTH_DIR}/dev.tsv",
    f"{SYNTH_DIR}/test.tsv",
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
FETCH_MANIFEST = f"{RESULTS}/data/fetch-manifest.json"

SCHEDULES = STUDY.schedules
# the seeds; in a sequential study, the seeds a schedule may run, in order (the looks choose how many)
SEEDS = STUDY.seeds
# a sequential study's design (precswitch.study.sequential_design), or None: every schedule runs every seed
SEQUENTIAL = STUDY.sequential
SEQUENTIAL_DIR = f"{RESULTS}/sequential"
# stage-1 runs in use, by name (the precision wildcard): schedules whose stage 1 is the same (same
# precision, same in-stage switch, same overrides) share their stage-1 runs
STAGE1 = STUDY.stage1
STAGE1_PRECISIONS = sorted(STAGE1)


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


_THREADS_NOTE = study.threads_note(config["threads"], _local_cores())
for _note in [_THREADS_NOTE, *study.warmup_notes(config)]:
    if _note:
        print(_note, file=sys.stderr)


def training_gpus(wildcards):
    """A training job's `gpu` resource: 1 (a GPU of its own; profiles/default's gpu: 1 then runs one timed
    job at a time) unless the job trains on the CPU: device cpu, or device auto in a local run on a
    machine where torch sees no CUDA GPU, whose jobs need not queue for a GPU slot they never use.
    Evaluated when the jobs are planned, not at parse time: only then is the executor known (at parse
    every run looks local). A cluster run (the GPU is on the node, not on the submit host) and a dry run
    (a plan, maybe for another machine) keep 1 for auto."""
    device = str(config["device"])
    if device == "cpu":
        return 0
    if device != "auto" or not workflow.local_exec or workflow.dryrun:
        return 1
    import torch

    return 0 if not torch.cuda.is_available() else 1


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
def source_json(stage):
    """The stage's data source as the JSON `precswitch tokenizer/prepare --source` take."""
    return json.dumps(study.source_spec(config, stage, SYNTH_DIR), sort_keys=True)


def source_inputs(stage):
    """Files a stage's source reads (so that editing them reruns what depends on them)."""
    if config["data"][stage]["kind"] == "synthetic":
        return SYNTH_FILES
    return study.source_files(config["data"][stage])


def tokenizer_options():
    return study.tokenizer_options(config)


# --- training -------------------------------------------------------------------------------------
def study_runs():
    """(schedule, seed) of every stage-2 run of the study: every schedule with every seed, or in a
    sequential study the runs its looks asked for (sequential_runs, workflow/rules/sequential.smk).
    """
    if SEQUENTIAL is not None:
        return sequential_runs()
    return [(s, seed) for s in SCHEDULES for seed in SEEDS]


def pretrain_metrics(runs=None):
    """The stage-1 runs the stage-2 runs `runs` (default: the study's) start from, each once."""
    runs = set(study_runs() if runs is None else runs)
    used = {(STUDY.stage1_of(s), seed) for s, seed in runs}
    return [
        f"{PRETRAIN_DIR}/metrics.json".format(precision=p, seed=seed)
        for p in STAGE1_PRECISIONS
        for seed in SEEDS
        if (p, seed) in used
    ]


def finetune_metrics(runs=None):
    runs = set(study_runs() if runs is None else runs)
    return [
        f"{FINETUNE_DIR}/metrics.json".format(schedule=s, seed=seed)
        for s in SCHEDULES
        for seed in SEEDS
        if (s, seed) in runs
    ]


def finetune_init(wildcards):
    """Stage 2 starts from the stage-1 checkpoint of its schedule, or from model.init."""
    precision = STUDY.stage1_of(wildcards.schedule)
    if precision is None:
        return config["model"]["init"]
    run = PRETRAIN_DIR.format(precision=precision, seed=wildcards.seed)
    return f"{run}/checkpoint"


def finetune_inputs(wildcards):
    precision = STUDY.stage1_of(wildcards.schedule)
    if precision is None:
        return {}
    run = PRETRAIN_DIR.format(precision=precision, seed=wildcards.seed)
    return {"stage1": f"{run}/metrics.json", "checkpoint": f"{run}/checkpoint"}


def _hparams(stage, name, seed, init):
    hp = study.hparams(
        STUDY,
        stage,
        name,
        seed,
        data=PREPARED_DIR.format(stage=stage),
        tokenizer=TOKENIZER_DIR,
        init=init,
    )
    return json.dumps(hp, sort_keys=True)


def pretrain_hparams(wildcards):
    return _hparams(
        "pretrain", wildcards.precision, wildcards.seed, config["model"]["init"]
    )


def finetune_hparams(wildcards):
    return _hparams(
        "finetune", wildcards.schedule, wildcards.seed, finetune_init(wildcards)
    )


# --- analysis -------------------------------------------------------------------------------------
def analysis_json():
    return json.dumps(study.analysis_settings(STUDY), sort_keys=True)


# --- hub downloads (rule fetch, workflow/rules/download.smk) --------------------------------------
def fetch_needed():
    return study.fetch_needed(config)


def fetch_inputs(wildcards=None):
    """Input function: the fetch manifest when the config needs the hub, else nothing."""
    return [FETCH_MANIFEST] if fetch_needed() else []


def fetch_config_json():
    return json.dumps(study.fetch_spec(config), sort_keys=True)


# Environment of jobs that must not download (compute nodes): everything is in the cache. The rules
# put OFFLINE_ENV in front of their command.
OFFLINE_ENV = (
    "".join(f"{k}={v} " for k, v in study.OFFLINE_VARS.items())
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


# --- onstart (real runs only) ---------------------------------------------------------------------
def _training_jobs():
    return [
        j
        for j in workflow.dag.needrun_jobs()
        if j.rule.name in ("pretrain", "finetune")
    ]


def _run_name(job):
    """The stage-1 run (pretrain) or the schedule (finetune) of a training job."""
    w = job.wildcards
    return w.precision if job.rule.name == "pretrain" else w.schedule


def _uses_gpu(jobs):
    """A local run's training jobs claim a GPU (training_gpus): device cuda, or auto where torch sees one."""
    device = str(config["device"])
    if not jobs or device == "cpu":
        return False
    if device != "auto":
        return True
    import torch

    return torch.cuda.is_available()


def check_gpu_here():
    """Training jobs with device cuda need a GPU torch can see (on a cluster: a CUDA build of torch, which
    the jobs run unless --sdm gives them their own); said before any job starts, instead of after the
    data jobs, when the first training job fails."""
    from snakemake.logging import logger

    device = str(config["device"])
    jobs = _training_jobs()
    try:
        if not workflow.local_exec:
            if jobs and not workflow.deployment_settings.deployment_method:
                study.check_cuda_build(device)
            return
        limit = workflow.global_resources.get("gpu")
        limit = getattr(
            limit, "value", limit
        )  # Snakemake 9: an object, value None when not set
        if limit is None and _uses_gpu(jobs):
            # no --resources gpu=K: one training job per GPU found (precswitch.gpu)
            found = len(physical_gpus())
            limit = max(1, found)
            workflow.register_resource("gpu", limit)
            logger.info(study.gpu_limit_line(limit, found))
        note = study.check_gpu(
            STUDY,
            [(j.rule.name, _run_name(j)) for j in jobs],
            None if limit is None else int(limit),
        )
    except study.ConfigError as e:
        study.refuse(e)  # one line
    if note:
        logger.warning(f"precswitch: {note}")


def keep_previous_runs():
    """Keep each finished run a rerun will replace under <results_dir>/previous/ (precswitch.study)."""
    from snakemake.logging import logger

    # a prepared dataset is a directory output too: Snakemake deletes it before its job reruns, so a rerun
    # that fails would leave none
    prepared = [
        (f"{j.output[0]}/meta.json", list(j.log))
        for j in workflow.dag.needrun_jobs()
        if j.rule.name == "prepare"
    ]
    kept = study.keep_previous_runs(
        [(j.output.metrics, list(j.log)) for j in _training_jobs()] + prepared,
        RESULTS,
        PREVIOUS,
    )
    if kept:
        logger.info(
            f"precswitch: {len(kept)} finished run(s) will rerun; their previous results are kept "
            f"under {PREVIOUS}/ (e.g. {kept[0]}): delete it when no longer needed"
        )


def data_notes():
    """onsuccess: rows the prepare jobs dropped, on the console (their logs alone would hide them)."""
    for note in study.prepared_notes(
        [f"{PREPARED_DIR.format(stage=stage)}/meta.json" for stage in STAGES]
    ):
        print(note, file=sys.stderr)


def cpu_time_note():
    """One line at the start of a run whose 16-bit precisions this CPU emulates (precswitch.fast_paths)."""
    from precswitch.fast_paths import study_time_note

    note = study_time_note(config)
    if note:
        print(note, file=sys.stderr)


def steps_logs(metrics):
    """Each run's steps.csv, beside its metrics.json (both outputs of the training rules)."""
    return [os.path.join(os.path.dirname(m), "steps.csv") for m in metrics]


def sequential_runs(upto=None):
    """(schedule, seed) of the stage-2 runs asked for by the looks before look `upto` (None: all of
    them, up to the look that said done). Raises Snakemake's IncompleteCheckpointException while a look
    it needs has not run: Snakemake then runs it and asks again."""
    runs = [(s, seed) for s in SCHEDULES for seed in SEEDS[: SEQUENTIAL["start"]]]
    k = 0
    while upto is None or k < upto:
        with open(checkpoints.look.get(k=k).output[0]) as f:
            look = json.load(f)
        if look["done"]:
            break
        runs += [(s, seed) for s, seeds in look["next"].items() for seed in seeds]
        k += 1
    return runs
