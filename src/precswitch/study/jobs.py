"""Per-job settings of a planned study: a training job's hparams (`precswitch train --hparams`), the data
source and tokenizer options of the data jobs, what the fetch job downloads."""

from __future__ import annotations

import shlex

from ..fetch import is_hub_model
from ..specs import spec_name
from ..train.config import PREPARE_KEYS
from .checks import SOURCE_KEYS, STAGES, TABLE_KEYS

OBJECTIVE = {"pretrain": "mlm", "finetune": "classify"}
# train.<stage> keys that are not the trainer's (prepare options) or not the stage's
NOT_HPARAMS = {"pretrain": set(PREPARE_KEYS), "finetune": {*PREPARE_KEYS, "mlm_probability"}}
#: environment of jobs that must not download (compute nodes): everything is in the fetch job's cache
OFFLINE_VARS = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def hparams(study, stage: str, name: str, seed, *, data: str, tokenizer: str, init) -> dict:
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
    if config["cpu_isa"] != "native":  # native: the trainer's default (keeps old runs' params)
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

