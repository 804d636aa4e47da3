"""Stage hyper-parameters of ``precswitch train``: defaults, parsing and validation (before any training starts).

A stage's study settings (the keys of ``train.<stage>``, ``model``, ``threads``, ``device``, ``cpu_isa``) are declared once, in
the study schema (precswitch.schema): their defaults and bounds are those of ``train.<the hparams' stage>``, so a
partial hparams trains the run the study would. The keys only the trainer knows are declared here, in
:data:`TRAINER_KEYS`. The cross-key rules are precswitch.stage_rules', shared with the study."""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from .. import catalog as P  # torch-free: the workflow checks configs with this module
from .. import cpu_isa
from .. import schema
from .. import stage_rules as rules
from ..errors import PrecswitchError
from ..io import load_mapping_arg

_INT = {"type": "integer", "minimum": 0}
#: the keys only the trainer knows (the workflow sets them per job): JSON schema with defaults
TRAINER_KEYS: dict[str, dict] = {
    "run_id": {"type": ["string", "null"], "default": None},  # None: "{stage}-{precision}-seed{seed}"
    "stage": {"type": "string", "default": "pretrain"},  # a label choosing train.<stage>'s defaults
    "objective": {"enum": ["mlm", "classify"], "default": "mlm"},  # what the loop trains
    "precision": {"type": "string", "default": "fp32"},  # checked by the catalog (its hints)
    "seed": {"type": "integer", "minimum": 0, "maximum": 2**32 - 1, "default": 0},
    "tags": {"type": "object", "default": {}},
    "data": {"type": ["string", "null"], "default": None},  # prepared dataset dir (precswitch prepare): required
    "tokenizer": {"type": ["string", "null"], "default": None},  # default: the data's meta.json tokenizer
    "init": {"type": "string", "minLength": 1, "default": "scratch"},  # scratch | checkpoint dir | model dir or hub name
    "init_revision": {"type": ["string", "null"], "pattern": "\\S", "default": None},  # hub branch/tag/commit
    "optimizer_impl": {"enum": ["fused", "foreach"], "default": "fused"},  # torch AdamW kernel (HF Trainer: fused)
    "eval_seed": {**_INT, "default": 1234},  # fixed MLM eval masks: every run is scored on the same masked tokens
    "progress": {"type": ["boolean", "null"], "default": None},  # tqdm bar on stderr: shown unless false
    "resume_dir": {"type": ["string", "null"], "default": None},  # default: <out>/resume
    "deterministic": {"type": "boolean", "default": False},  # torch.use_deterministic_algorithms
    "switch_to": {"type": ["string", "null"], "default": None},  # precision of the rest of the stage
    # ... after this fraction of the steps: the range of a study's switch_at
    "switch_at": {**schema.load()["$defs"]["switch"]["properties"]["switch_at"], "type": ["number", "null"],
                  "default": None},
}
#: model keys only the trainer knows (BertConfig's dropout), beside the study's model sizes
TRAINER_MODEL_KEYS: dict[str, dict] = {
    "hidden_dropout_prob": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.1},
    "attention_probs_dropout_prob": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.1},
}
#: BertConfig fields a model mapping may also give (checked by transformers)
MODEL_EXTRA_KEYS = ("vocab_size", "type_vocab_size", "layer_norm_eps", "initializer_range")
#: train.<stage> keys that are options of `precswitch prepare`, not of the trainer
PREPARE_KEYS = ("max_length",)
#: keys whose null means something of its own (a null of another key takes its default)
NULL_MEANS_ITSELF = ("steps", "epochs", "max_grad_norm")
COMPILE_MODES = tuple(v for v in schema.stage_train()["properties"]["compile"]["enum"] if v is not False)
ATTN_IMPLEMENTATIONS = tuple(schema.node("model", "attn_implementation")["enum"])


@functools.cache
def _properties() -> dict:
    """The schema of a resolved hparams: the trainer's own keys, train.<stage>'s, threads, device and model."""
    stage = {k: v for k, v in schema.stage_train()["properties"].items() if k not in PREPARE_KEYS}
    model = {k: v for k, v in schema.node("model")["properties"].items() if k not in ("init", "revision")}
    model.update(TRAINER_MODEL_KEYS)
    model.update({k: {} for k in MODEL_EXTRA_KEYS})
    return {**TRAINER_KEYS, **stage, "threads": schema.node("threads"), "device": schema.node("device"),
            "cpu_isa": schema.node("cpu_isa"), "model": {"type": "object", "additionalProperties": False, "properties": model}}


def defaults(stage: str = "pretrain") -> dict[str, Any]:
    """Every key a stage accepts, with its default: the trainer's own, and the schema's train.<stage>."""
    own = {k: v["default"] for k, v in TRAINER_KEYS.items()}
    stage_keys = {k: v for k, v in schema.stage_defaults(stage).items() if k not in PREPARE_KEYS}
    model = {k: v for k, v in schema.defaults("model").items() if k not in ("init", "revision")}
    model.update({k: v["default"] for k, v in TRAINER_MODEL_KEYS.items()})
    return {**own, "stage": stage, **stage_keys, "threads": schema.node("threads")["default"],
            "device": schema.node("device")["default"], "cpu_isa": schema.node("cpu_isa")["default"], "model": model}


#: the defaults of a stage labelled pretrain (the trainer's default stage)
DEFAULTS = defaults()


def load_hparams(arg: str | dict) -> dict[str, Any]:
    """Parse ``--hparams``: a JSON object string, ``@file.json``, or a path to a .json/.yaml file."""
    if isinstance(arg, dict):
        return dict(arg)
    return load_mapping_arg(arg, "--hparams")


def _fill(raw: dict[str, Any]) -> dict[str, Any]:
    """The hparams with every default filled (train.<stage>'s). A key given as null takes its default, except
    where null means something of its own; an epochs stage given without steps has no steps."""
    unknown = sorted(set(raw) - set(_properties()))
    if unknown:
        raise PrecswitchError(f"unknown hparams key(s) {unknown}; allowed: {sorted(_properties())}")
    base = defaults(raw["stage"] if isinstance(raw.get("stage"), str) else "pretrain")
    if raw.get("epochs") is not None and "steps" not in raw:
        base["steps"] = None
    hp = {**base, **{k: v for k, v in raw.items() if v is not None or k in NULL_MEANS_ITSELF}}
    model = raw.get("model") or {}
    if not isinstance(model, dict):
        raise PrecswitchError(f"model must be a mapping, got {model!r}")
    hp["model"] = {**base["model"], **model}
    hp["compile"] = rules.compile_mode(hp["compile"])
    return hp


def _check_schema(hp: dict) -> None:
    """Types and bounds, from the schema: one line ``<key> must be <allowed>, got <value>``."""
    where = schema.nonfinite(hp)
    if where:
        raise PrecswitchError(f"{where} must be a finite number, got {_get(hp, where)!r}")
    if hp["max_grad_norm"] is None:  # null: no clipping, as 0
        hp = {**hp, "max_grad_norm": 0}
    error = next(iter(schema.validator({"type": "object", "properties": _properties()}).iter_errors(hp)), None)
    if error is not None:
        raise PrecswitchError(schema.problem(error))


def _get(hp, dotted):
    for part in dotted.split("."):
        hp = hp[part]
    return hp


def _check_model(hp: dict) -> None:
    """A checkpoint or pretrained model brings its own sizes and dropout: only the attention kernel applies, and
    only it is recorded (metrics.json's hparams must not claim sizes the model does not have)."""
    m = hp["model"]
    if str(hp["init"]) != "scratch":
        hp["model"] = {"attn_implementation": m["attn_implementation"]}
    elif m["hidden_size"] % m["num_attention_heads"]:
        raise PrecswitchError(f"model.hidden_size {m['hidden_size']} is not a multiple of "
                              f"model.num_attention_heads {m['num_attention_heads']}")
    if hp["init_revision"] is not None and str(hp["init"]) == "scratch":
        raise PrecswitchError(f"init_revision {hp['init_revision']!r} is for a hub model init; init is scratch")


def _check_precisions(hp: dict) -> None:
    P.spec(hp["precision"])  # raises with the allowed names (and a hint: fp16 is amp_fp16 or pure_fp16?)
    if hp["switch_to"] is not None:
        P.spec(hp["switch_to"])
    why = P.eval_precision_problem(hp["precision"], hp["eval_precision"])
    if why:
        raise PrecswitchError(f"eval_precision {hp['eval_precision']!r} after an {hp['precision']} stage: {why}")


def _check_rules(hp: dict) -> None:
    """The cross-key rules the study checks too (precswitch.stage_rules)."""
    if why := cpu_isa.problem(hp["cpu_isa"]):  # a level this CPU lacks
        raise PrecswitchError(f"cpu_isa {why}")
    if not hp["data"]:
        raise PrecswitchError("hparams key 'data' is required: a dataset dir written by `precswitch prepare`")
    why = rules.stage_problem(hp)
    if why:
        key, text = why
        raise PrecswitchError(text if text.startswith(key) else f"{key}: {text}")  # key "": the text names both


def resolve(raw: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and validate every key. Raises PrecswitchError naming the key and what is allowed."""
    hp = _fill(raw)
    _check_schema(hp)
    _check_model(hp)
    _check_precisions(hp)
    _check_rules(hp)
    if hp["run_id"] is None:
        hp["run_id"] = f"{hp['stage']}-{hp['precision']}-seed{hp['seed']}"
    return hp


def config_hash(hp: dict[str, Any]) -> str:
    """Hash of the hyper-parameters that determine the result (not of run-time plumbing)."""
    ignore = {"progress", "log_every", "resume_dir", "checkpoint_every_steps", "checkpoint_every_minutes", "tags",
              "telemetry_every"}
    # compile off (eager) and cpu_isa native are left out, so runs made before the keys existed keep their hash
    kept = {k: v for k, v in hp.items()
            if k not in ignore and (k, v) not in (("compile", "off"), ("cpu_isa", "native"))}
    canonical = json.dumps(kept, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def resolve_device(spec: str):
    import torch

    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise PrecswitchError(f"device {spec!r}: allowed auto, cpu, cuda, cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise PrecswitchError(f"device {spec!r} requested but no CUDA GPU is available (torch {torch.__version__})")
    if dev.type not in ("cpu", "cuda"):
        raise PrecswitchError(f"device {spec!r}: allowed auto, cpu, cuda, cuda:N")
    return dev
