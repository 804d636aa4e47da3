"""Stage hyper-parameters: defaults, parsing and validation (before any training starts)."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from .. import catalog as P  # torch-free: the workflow checks configs with this module
from .. import cpu_isa
from ..errors import PrecswitchError
from ..io import load_mapping_arg

#: Every key a stage accepts, with its default. ``None`` = required or "not set".
DEFAULTS: dict[str, Any] = {
    "run_id": None,  # default: "{stage}-{precision}-seed{seed}"
    "stage": "pretrain",  # pretrain | finetune (a label; the objective decides the loop)
    "objective": "mlm",  # mlm | classify
    "precision": "fp32",
    "seed": 0,
    "tags": {},
    "data": None,  # prepared dataset dir (precswitch prepare)
    "tokenizer": None,  # tokenizer dir; default: the data's meta.json tokenizer
    "init": "scratch",  # scratch | checkpoint dir | pretrained model dir or hub name
    "init_revision": None,  # hub branch/tag/commit of a hub-name init (None: the default branch)
    "model": {
        "hidden_size": 64,  # the embedded default study's model (config/config.yaml)
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 128,
        "max_position_embeddings": 128,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "attn_implementation": "auto",  # sdpa on CUDA, eager on a CPU (engine._attn_kernel)
    },
    "steps": None,
    "epochs": None,
    "batch_size": 32,
    "eval_batch_size": 128,
    "lr": 5e-4,
    "warmup_ratio": 0.1,
    "weight_decay": 0.01,
    "adam_eps": 1e-8,  # AdamW's default, kept faithful: in fp16 it rounds to 0 (see pure_fp16)
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "optimizer_impl": "fused",  # fused | foreach: torch AdamW kernel (HF Trainer's default is fused)
    "compile": "off",  # off | default | reduce-overhead: torch.compile the forward and loss (reduce-overhead: CUDA graphs)
    "max_grad_norm": 1.0,  # 0 or null: no clipping (the norm is still recorded)
    "mlm_probability": 0.15,
    "eval_precision": "same",  # same | fp32 | any precision name
    "eval_seed": 1234,  # fixed MLM eval masks: every run is scored on the same masked tokens
    "max_nonfinite": 10,  # K consecutive non-finite losses end the stage as "diverged"
    "max_nonfinite_fraction": 0.25,  # non-finite losses on more than this fraction of the steps: "diverged"
    "timing_warmup_steps": 5,  # excluded from steady-state throughput
    "threads": 1,  # torch intra-op threads (pinned: results depend on it)
    "cpu_isa": "native",  # native | avx2 | avx512: oneDNN's and ATen's cap, set by `precswitch train` (cpu_isa.py)
    "device": "auto",  # auto | cpu | cuda | cuda:N
    "on_unsupported": "error",  # error | skip: precision the device can't run
    "log_every": 1,
    "progress": None,  # tqdm bar on stderr (the stage log): shown unless false
    "save_checkpoint": True,
    "checkpoint_every_steps": 0,  # resumable state every N steps (0 = off)
    "checkpoint_every_minutes": 0.0,  # ... or every M minutes of training (0 = off)
    "resume_dir": None,  # default: <out>/resume
    "deterministic": False,  # torch.use_deterministic_algorithms (the engine sets CUBLAS_WORKSPACE_CONFIG if unset)
    "switch_to": None,  # precision to switch to inside the stage (same weight dtype), e.g. fp32
    "switch_at": None,  # ... after this fraction of the steps, in (0, 1]
    "telemetry_every": 0,  # activation telemetry (max |x|, fp16 overflow/underflow) every K steps; 0 = off
}

OBJECTIVES = ("mlm", "classify")
#: torch.compile of the training forward and loss: off (eager, the default), default (kernel fusion),
#: reduce-overhead (fusion + CUDA graphs: on an H200 the only mode that lifted 16-bit BERT-base steps
#: out of the host's kernel launches, docs/gpu.md)
COMPILE_MODES = ("off", "default", "reduce-overhead")
#: attention kernels (model.attn_implementation), as in the workflow schema
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "auto")
MODEL_KEYS = set(DEFAULTS["model"]) | {"vocab_size", "type_vocab_size", "layer_norm_eps", "initializer_range"}


# Cross-key rules that a study config (precswitch.study, which names the config key) and a stage's hparams
# (resolve) share: one wording, one test.
SWITCH_PAIR_PROBLEM = "switch_to and switch_at go together: set both (or neither)"


def compile_telemetry_problem(compile_mode, telemetry_every) -> str | None:
    """Activation telemetry needs eager mode: what is wrong with compiling a stage that records it, or None."""
    if compile_mode in ("off", False) or not telemetry_every:
        return None
    return (f"{compile_mode!r} with telemetry_every {telemetry_every}: activation telemetry hooks run in eager mode "
            "only; set compile: off or telemetry_every: 0")


def steps_epochs_problem(steps, epochs) -> str | None:
    """A stage's length is steps or epochs, never both nor neither."""
    if (steps is None) != (epochs is None):
        return None
    return f"set exactly one of steps and epochs (the other null); got steps={steps}, epochs={epochs}"


def load_hparams(arg: str | dict) -> dict[str, Any]:
    """Parse ``--hparams``: a JSON object string, ``@file.json``, or a path to a .json/.yaml file."""
    if isinstance(arg, dict):
        return dict(arg)
    return load_mapping_arg(arg, "--hparams")


def resolve(raw: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults and validate every key. Raises PrecswitchError naming the key and what is allowed."""
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise PrecswitchError(f"unknown hparams key(s) {unknown}; allowed: {sorted(DEFAULTS)}")
    # a key given as null takes its default, except where null means something of its own (max_grad_norm:
    # no clipping, as 0)
    hp = {**DEFAULTS, **{k: v for k, v in raw.items() if v is not None or k in ("steps", "epochs", "max_grad_norm")}}
    hp["model"] = {**DEFAULTS["model"], **(raw.get("model") or {})}
    bad_model = sorted(set(hp["model"]) - MODEL_KEYS)
    if bad_model:
        raise PrecswitchError(f"unknown model key(s) {bad_model}; allowed: {sorted(MODEL_KEYS)}")
    attn = hp["model"]["attn_implementation"]
    if attn not in ATTN_IMPLEMENTATIONS:
        raise PrecswitchError(f"model.attn_implementation {attn!r}: allowed "
                              f"{', '.join(repr(a) for a in ATTN_IMPLEMENTATIONS)}")
    if str(hp["init"]) != "scratch":
        # a checkpoint or pretrained model brings its own sizes and dropout: only the attention kernel applies,
        # and only it is recorded (metrics.json's hparams must not claim sizes the model does not have)
        hp["model"] = {"attn_implementation": hp["model"]["attn_implementation"]}
    else:
        m = hp["model"]
        for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                    "max_position_embeddings"):
            v = m.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise PrecswitchError(f"model.{key} must be a positive integer, got {v!r}")
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            v = m.get(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 1:
                raise PrecswitchError(f"model.{key} must be a number in [0, 1], got {v!r}")
        if m["hidden_size"] % m["num_attention_heads"]:
            raise PrecswitchError(f"model.hidden_size {m['hidden_size']} is not a multiple of "
                                  f"model.num_attention_heads {m['num_attention_heads']}")

    P.spec(hp["precision"])  # raises with the allowed names
    if hp["eval_precision"] not in ("same",) + P.NAMES:
        raise PrecswitchError(f"eval_precision {hp['eval_precision']!r}: allowed 'same' or one of {', '.join(P.NAMES)}")
    if hp["objective"] not in OBJECTIVES:
        raise PrecswitchError(f"objective {hp['objective']!r}: allowed {', '.join(OBJECTIVES)}")
    if hp["optimizer_impl"] not in ("fused", "foreach"):
        raise PrecswitchError(f"optimizer_impl {hp['optimizer_impl']!r}: allowed 'fused' or 'foreach'")
    if hp["compile"] is False:  # YAML reads an unquoted off as false
        hp["compile"] = "off"
    if hp["compile"] not in COMPILE_MODES:
        raise PrecswitchError(f"compile {hp['compile']!r}: allowed {', '.join(repr(m) for m in COMPILE_MODES)}")
    why = compile_telemetry_problem(hp["compile"], hp["telemetry_every"])
    if why:
        raise PrecswitchError(f"compile {why}")
    if why := cpu_isa.problem(hp["cpu_isa"]):
        raise PrecswitchError(f"cpu_isa {why}")
    if hp["on_unsupported"] not in ("error", "skip"):
        raise PrecswitchError(f"on_unsupported {hp['on_unsupported']!r}: allowed 'error' or 'skip'")
    if not hp["data"]:
        raise PrecswitchError("hparams key 'data' is required: a dataset dir written by `precswitch prepare`")
    why = steps_epochs_problem(hp["steps"], hp["epochs"])
    if why:
        raise PrecswitchError(why)
    for key in ("steps", "epochs"):
        if hp[key] is not None and (not isinstance(hp[key], (int, float)) or isinstance(hp[key], bool) or hp[key] <= 0):
            raise PrecswitchError(f"{key} must be a positive number, got {hp[key]!r}")
        if hp[key] is not None and not math.isfinite(hp[key]):  # not a bare int(nan)/int(inf) error, here or in the engine
            raise PrecswitchError(f"{key} must be a finite positive number, got {hp[key]!r}")
    if hp["steps"] is not None and not isinstance(hp["steps"], int):
        # one rule for every integer key, as the study config's: 4.0 is refused, not read as 4
        raise PrecswitchError(f"steps must be a whole number, got {hp['steps']!r}"
                              + (" (an integer: no decimal point)" if hp["steps"] == int(hp["steps"]) else ""))
    for key in ("seed", "batch_size", "eval_batch_size", "threads", "max_nonfinite", "log_every"):
        v = hp[key]
        if not isinstance(v, int) or isinstance(v, bool) or (v < 0 if key == "seed" else v <= 0) \
                or (key == "seed" and v >= 2**32):
            raise PrecswitchError(f"{key} must be a {'non-negative' if key == 'seed' else 'positive'} integer"
                                  + (" below 2^32" if key == "seed" else "") + f", got {v!r}")
    for key in ("lr", "adam_eps", "weight_decay", "warmup_ratio", "mlm_probability", "adam_beta1", "adam_beta2"):
        v = hp[key]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise PrecswitchError(f"{key} must be a finite number, got {v!r}")
    for key in ("adam_beta1", "adam_beta2"):  # torch.optim.AdamW refuses them only once the model is built
        if not 0 <= hp[key] < 1:
            raise PrecswitchError(f"{key} must be in [0, 1), got {hp[key]!r}")
    if hp["lr"] <= 0:
        raise PrecswitchError(f"lr must be > 0, got {hp['lr']!r}")
    if hp["adam_eps"] < 0 or hp["weight_decay"] < 0:
        raise PrecswitchError("adam_eps and weight_decay must be >= 0")
    if not 0 <= hp["warmup_ratio"] < 1:
        raise PrecswitchError(f"warmup_ratio must be in [0, 1), got {hp['warmup_ratio']!r}")
    if not 0 < hp["mlm_probability"] < 1:
        raise PrecswitchError(f"mlm_probability must be in (0, 1), got {hp['mlm_probability']!r}")
    v = hp["max_nonfinite_fraction"]
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v <= 1:
        raise PrecswitchError(f"max_nonfinite_fraction must be a number in (0, 1], got {v!r}")
    # run-time keys the loop reads only after training started: a wrong type would crash mid-stage
    for key in ("timing_warmup_steps", "checkpoint_every_steps", "eval_seed"):
        v = hp[key]
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise PrecswitchError(f"{key} must be a non-negative integer, got {v!r}")
    for key in ("checkpoint_every_minutes", "max_grad_norm"):
        v = hp[key]
        if key == "max_grad_norm" and v is None:
            continue  # null: no clipping
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise PrecswitchError(f"{key} must be a finite number >= 0 (0: off), got {v!r}")
    for key in ("deterministic", "save_checkpoint"):
        if not isinstance(hp[key], bool):
            raise PrecswitchError(f"{key} must be true or false, got {hp[key]!r}")
    if hp["progress"] is not None and not isinstance(hp["progress"], bool):
        raise PrecswitchError(f"progress must be true, false or null, got {hp['progress']!r}")
    if not isinstance(hp["tags"], dict):
        raise PrecswitchError(f"tags must be a mapping, got {hp['tags']!r}")
    if not isinstance(hp["telemetry_every"], int) or isinstance(hp["telemetry_every"], bool) or hp["telemetry_every"] < 0:
        raise PrecswitchError(f"telemetry_every must be a non-negative integer, got {hp['telemetry_every']!r}")
    if (hp["switch_to"] is None) != (hp["switch_at"] is None):
        raise PrecswitchError(SWITCH_PAIR_PROBLEM)
    if hp["switch_to"] is not None:
        a, b = P.spec(hp["precision"]), P.spec(hp["switch_to"])
        at = hp["switch_at"]
        if not isinstance(at, (int, float)) or isinstance(at, bool) or not 0 < at <= 1:
            raise PrecswitchError(f"switch_at must be a fraction of the steps in (0, 1], got {at!r}")
        if (a.param_dtype, a.update_compensation, a.fp8_linear) != (b.param_dtype, b.update_compensation, b.fp8_linear):
            raise PrecswitchError(
                f"cannot switch from {a.name!r} to {b.name!r} inside a stage: their weights are stored differently "
                f"({_storage(a)} vs {_storage(b)}); use two stages instead"
            )
        if hp["steps"] is not None:  # an epochs stage's step count is known only with its data (engine)
            switch_step(hp, hp["steps"])
    why = P.eval_precision_problem(hp["precision"], hp["eval_precision"])
    if why:
        raise PrecswitchError(f"eval_precision {hp['eval_precision']!r} after an {hp['precision']} stage: {why}")
    rev = hp["init_revision"]
    if rev is not None and (not isinstance(rev, str) or not rev.strip()):
        raise PrecswitchError(f"init_revision must be a hub branch, tag or commit (text) or null, got {rev!r}")
    if rev is not None and str(hp["init"]) == "scratch":
        raise PrecswitchError(f"init_revision {rev!r} is for a hub model init; init is scratch")
    if hp["run_id"] is None:
        hp["run_id"] = f"{hp['stage']}-{hp['precision']}-seed{hp['seed']}"
    return hp


def _storage(p) -> str:
    """How a precision stores and updates the weights (what an in-stage switch must keep), for messages."""
    return " + ".join([p.param_dtype] + (["fp8 Linear layers"] if p.fp8_linear else [])
                      + ([f"{p.update_compensation} update"] if p.update_compensation else []))


def _fraction_at(step: int, total: int) -> str:
    """``step / total`` as a switch_at to print: 4 significant digits, more where those would round to another step."""
    for digits in range(4, 18):
        text = f"{step / total:.{digits}g}"
        if int(round(float(text) * total)) == step:
            return text
    return repr(step / total)


def switch_step(hp: dict[str, Any], total_steps: int) -> int | None:
    """The step of an in-stage switch, ``round(switch_at * total_steps)`` (None: the stage does not switch).

    Refuses (PrecswitchError naming switch_at) a switch point that rounds to step 0 (the whole stage would
    run in switch_to) or, for a switch_at below 1, to the last step (the stage would never switch): either
    run would be recorded as a switch it never made. switch_at 1 is kept: all steps in precision (no switch).
    ``resolve`` checks a ``steps`` stage; the engine checks an ``epochs`` stage once its data gives the steps."""
    if hp["switch_to"] is None:
        return None
    at, total = hp["switch_at"], int(total_steps)
    step = int(round(at * total))
    if 0 < step < total or at == 1:
        return step
    first, then = hp["precision"], hp["switch_to"]
    where = f"switch_at {at!r} of {total} step{'s' if total != 1 else ''} rounds to step {step}"
    if total < 2:
        raise PrecswitchError(f"{where}: a 1-step stage cannot switch part-way (a switch needs at least 2 steps); "
                              f"run it in {first} or {then} without switch_to/switch_at")
    if step == 0:
        raise PrecswitchError(
            f"{where}: the whole stage would run in {then}, not switch from {first}; use switch_at >= "
            f"{_fraction_at(1, total)} (the earliest switch: after step 1 of {total}), or drop switch_to/switch_at "
            f"and use precision {then}")
    raise PrecswitchError(
        f"{where}, the end of the stage: it would never switch to {then}; use switch_at <= "
        f"{_fraction_at(total - 1, total)} (the latest switch: after step {total - 1} of {total}), or drop "
        f"switch_to/switch_at to run the whole stage in {first}")


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
