"""THE precision catalog: every precision name the study knows, and exactly what it means.

Each name means one thing, on CPU and on CUDA, everywhere (config, code, tables, plots):

=============  =====================  ====================  ==============================  ======
name           weights / grads /      matmul compute        loss scaling                    TF32
               optimizer state
=============  =====================  ====================  ==============================  ======
``fp32``       fp32                   fp32                  none                            OFF
``tf32``       fp32                   TF32 tensor cores     none                            ON
``amp_fp16``   fp32 (master)          fp16 (autocast)       dynamic (torch.amp.GradScaler)  OFF
``amp_bf16``   fp32 (master)          bf16 (autocast)       none                            OFF
``pure_fp16``  fp16                   fp16                  dynamic (GradScaler, fp16 grads) OFF
``pure_bf16``  bf16                   bf16                  none                            OFF
``pure_bf16_   bf16 (+ bf16 Kahan     bf16; update math     none                            OFF
kahan``        compensation buffer)   fp32, Kahan-summed
``pure_bf16_   bf16                   bf16; update          none                            OFF
sr``                                  stochastically
                                      rounded to bf16
``fp8``        fp32 (master)          fp8 Linear matmuls    none (per-tensor dynamic        OFF
                                      (torchao, e4m3 fwd /  scaling of fp8 casts), bf16
                                      e5m2 grad), bf16      autocast elsewhere
                                      autocast elsewhere
=============  =====================  ====================  ==============================  ======

``pure_bf16_kahan`` / ``pure_bf16_sr``: pure bf16 with a compensated weight update
(:mod:`precswitch.optim`; Zamirai et al. 2020). ``fp8`` needs an Ada/Hopper GPU (compute capability
8.9+) and torchao (:mod:`precswitch.fp8`); elsewhere it is refused like any unsupported precision.

Torch-free: the workflow reads these names when it checks a config (a dry run never imports torch).
:mod:`precswitch.precision` turns each entry into what a stage runs with. Adding a precision means adding one
entry to :data:`SPECS` (and, if it needs new machinery, a branch in :mod:`precswitch.precision`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from .errors import PrecswitchError


@dataclass(frozen=True)
class Spec:
    """What one named precision is (dtypes by name: ``float32``, ``float16``, ``bfloat16``). Frozen: a precision
    is a fact, not a setting."""

    name: str
    description: str
    #: dtype of the weights, gradients and optimizer state (and of the checkpoint written)
    param_dtype: str
    #: autocast compute dtype, or None for no autocast
    autocast_dtype: str | None
    #: dynamic loss scaling with torch.amp.GradScaler
    loss_scaling: bool
    #: TF32 tensor-core matmuls allowed (CUDA only)
    tf32: bool
    #: device types this precision can run on at all
    device_types: tuple[str, ...] = ("cpu", "cuda")
    #: compensation of the weight update for 16-bit params: None | "kahan" | "stochastic_rounding"
    update_compensation: str | None = None
    #: Linear layers run fp8 matmuls (torchao float8 training)
    fp8_linear: bool = False


SPECS: dict[str, Spec] = {
    p.name: p
    for p in [
        Spec("fp32", "fp32 weights and compute; TF32 explicitly off", "float32", None, False, False),
        Spec(
            "tf32", "fp32 weights; matmuls on TF32 tensor cores", "float32", None, False, True, ("cuda",)
        ),
        Spec(
            "amp_fp16",
            "fp32 master weights, fp16 autocast, dynamic loss scaling (GradScaler)",
            "float32",
            "float16",
            True,
            False,
        ),
        Spec("amp_bf16", "fp32 master weights, bf16 autocast, no loss scaling", "float32", "bfloat16", False, False),
        Spec(
            "pure_fp16",
            "fp16 weights, gradients and optimizer state; dynamic loss scaling",
            "float16",
            None,
            True,
            False,
        ),
        Spec("pure_bf16", "bf16 weights, gradients and optimizer state", "bfloat16", None, False, False),
        Spec(
            "pure_bf16_kahan",
            "bf16 weights, gradients and optimizer state; Kahan-compensated updates (bf16 buffer)",
            "bfloat16",
            None,
            False,
            False,
            update_compensation="kahan",
        ),
        Spec(
            "pure_bf16_sr",
            "bf16 weights, gradients and optimizer state; stochastically rounded updates",
            "bfloat16",
            None,
            False,
            False,
            update_compensation="stochastic_rounding",
        ),
        Spec(
            "fp8",
            "fp32 master weights; fp8 matmuls in Linear layers (torchao float8), bf16 autocast elsewhere",
            "float32",
            "bfloat16",
            False,
            False,
            ("cuda",),
            fp8_linear=True,
        ),
    ]
}

NAMES: tuple[str, ...] = tuple(SPECS)


_BARE_HALF = {"fp16": "fp16", "float16": "fp16", "half": "fp16", "bf16": "bf16", "bfloat16": "bf16"}


def name_hint(name: Any) -> str:
    """A hint for a name that is not a precision: a bare 16-bit type asks which of mixed (amp_) or pure
    16-bit is meant (the distinction the study is about); a near miss gets 'did you mean'. '' if none."""
    n = str(name).strip().lower().replace("-", "_")
    if n in _BARE_HALF:
        h = _BARE_HALF[n]
        return (f" ({name!r} is ambiguous: amp_{h} = fp32 master weights with {h} autocast, the usual "
                f"'mixed precision'; pure_{h} = weights, grads and optimizer state in {h})")
    close = [n] if n in SPECS else difflib.get_close_matches(n, NAMES, n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def spec(name: str) -> Spec:
    """Look up a precision by name; an unknown name is a clear error listing the allowed ones."""
    try:
        return SPECS[name]
    except KeyError:
        raise PrecswitchError(f"unknown precision {name!r}{name_hint(name)}; allowed: {', '.join(NAMES)}") from None


def eval_precision_problem(stage_precision: str, eval_precision: str) -> str | None:
    """Why ``eval_precision`` cannot evaluate a stage trained in ``stage_precision`` (None: it can).

    An fp8 stage's Linear layers stay torchao Float8Linear: an evaluation "in" another precision
    would still run them in fp8 and be mislabelled. (The config check and the engine both ask here.)
    """
    if spec(stage_precision).fp8_linear and eval_precision != "same" and not spec(eval_precision).fp8_linear:
        return "its Linear layers stay fp8 (torchao Float8Linear), so the evaluation would still be fp8; use same (or fp8)"
    return None
