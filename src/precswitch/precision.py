"""The one place where a precision name turns into an autocast context, a loss scaler, a parameter dtype
and the TF32 switches (nanoGPT style). What each name means is the catalog, :mod:`precswitch.catalog`
(torch-free, read by the workflow); :data:`CATALOG` here is that catalog with torch dtypes. A new precision
that needs new machinery adds a branch in :meth:`Precision.autocast`, :meth:`Precision.make_scaler` or
:func:`check_supported`.

Unsupported combinations (``tf32`` on CPU, bf16 on a CUDA GPU without bf16) are detected by
:func:`check_supported` *before* training. The engine then either refuses with
:class:`~precswitch.errors.PrecisionUnsupported` (default, ``on_unsupported: error``) or records the
stage as ``status: skipped`` with the reason (``on_unsupported: skip``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ContextManager

import torch

from .catalog import NAMES, SPECS, eval_precision_problem, name_hint, spec  # noqa: F401 (the catalog's names, here too)
from .errors import PrecisionUnsupported, PrecswitchError  # noqa: F401 (get raises it)


@dataclass(frozen=True)
class Precision:
    """How one named precision runs. Frozen: a precision is a fact, not a setting."""

    name: str
    description: str
    #: dtype of the weights, gradients and optimizer state (and of the checkpoint written)
    param_dtype: torch.dtype
    #: autocast compute dtype, or None for no autocast
    autocast_dtype: torch.dtype | None
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

    @property
    def is_pure(self) -> bool:
        return self.param_dtype != torch.float32

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.autocast_dtype or self.param_dtype

    def apply_backend_flags(self) -> dict[str, Any]:
        """Set the global TF32 switches for this precision (explicitly, every stage) and return them.

        ``fp32`` really means fp32: TF32 is switched OFF for every precision except ``tf32``. (The engine gives
        the caller its own switches back when the stage ends: :func:`restoring_global_numerics`.)
        """
        if hasattr(torch.backends, "fp32_precision"):
            # torch >= 2.9: per-backend switches a caller set with the new API (say torch.backends.fp32_precision =
            # "tf32") outlive the legacy setters below (cuDNN and oneDNN would inherit TF32 / bf16 in an fp32 stage)
            # and make their getters raise: clear them all to "none" (torch's default) first
            for name in _FP32_PRECISION_BACKENDS:
                _fp32_precision_backend(name).fp32_precision = "none"
        torch.backends.cuda.matmul.allow_tf32 = self.tf32
        torch.backends.cudnn.allow_tf32 = self.tf32
        torch.set_float32_matmul_precision("high" if self.tf32 else "highest")
        return backend_flags()

    def autocast(self, device_type: str) -> ContextManager:
        """The forward-pass context: ``torch.autocast`` for amp_*, nothing otherwise."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device_type, dtype=self.autocast_dtype)

    def make_scaler(self, device_type: str) -> torch.amp.GradScaler | None:
        """A dynamic loss scaler for fp16 modes, else None."""
        if not self.loss_scaling:
            return None
        if self.is_pure:
            return PureFP16GradScaler(device_type)
        return torch.amp.GradScaler(device_type)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Cast the model to this precision's storage dtype (fp32 master weights for amp_*);
        swap Linear layers for fp8 ones where the precision says so."""
        model = model.to(dtype=self.param_dtype)
        if self.fp8_linear:
            from .fp8 import convert_model_to_fp8

            model = convert_model_to_fp8(model)
        return model

    def wrap_optimizer(self, optimizer: torch.optim.Optimizer, seed: int) -> torch.optim.Optimizer:
        """Kahan / stochastic-rounding update compensation for pure-bf16 variants; else unchanged."""
        if self.update_compensation is None:
            return optimizer
        from .optim import wrap_optimizer

        return wrap_optimizer(self.update_compensation, optimizer, seed=seed)


class PureFP16GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` for fp16 *parameters* (pure_fp16).

    The stock scaler refuses to unscale fp16 gradients (it assumes AMP with fp32 master weights).
    Everything else — dynamic scale growth/back-off, inf/NaN detection, step skipping — is the
    library's own; we only allow fp16 gradients in its unscale kernel, and keep the scale at or
    below 2**15: here the loss itself is fp16, so the gradient backward starts from *is* the scale,
    and the stock 2**16 is above fp16's maximum (65504): it would be inf, and skip the first step
    and one step after every growth back to 2**16, whatever the loss.
    """

    MAX_SCALE = 2.0**15

    def __init__(self, device: str = "cuda", init_scale: float = MAX_SCALE, **kwargs):
        super().__init__(device, init_scale=min(init_scale, self.MAX_SCALE), **kwargs)

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):  # noqa: D401
        return super()._unscale_grads_(optimizer, inv_scale, found_inf, True)

    def update(self, new_scale=None) -> None:
        super().update(new_scale)
        if self._enabled and self._scale is not None:
            self._scale.clamp_(max=self.MAX_SCALE)


#: the catalog (:mod:`precswitch.catalog`) with torch dtypes
CATALOG: dict[str, Precision] = {
    n: Precision(**{**vars(s), "param_dtype": getattr(torch, s.param_dtype),
                    "autocast_dtype": getattr(torch, s.autocast_dtype) if s.autocast_dtype else None})
    for n, s in SPECS.items()
}

#: dtype names as written in metrics.json and checkpoints
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def get(name: str) -> Precision:
    """Look up a precision by name; an unknown name is a clear error listing the allowed ones."""
    return CATALOG[spec(name).name]


def check_supported(precision: Precision, device: torch.device) -> None:
    """Raise PrecisionUnsupported (naming the precision and the device) if it can't run there."""
    dev_type = device.type
    if precision.fp8_linear:
        from .fp8 import check_fp8_supported

        check_fp8_supported(device, precision.name)
    if dev_type not in precision.device_types:
        raise PrecisionUnsupported(
            f"precision {precision.name!r} cannot run on device {describe_device(device)!r}: "
            f"it needs {' or '.join(precision.device_types)}"
            + (" (TF32 tensor cores exist only on NVIDIA Ampere or newer GPUs)" if precision.tf32 else "")
        )
    uses_bf16 = torch.bfloat16 in (precision.param_dtype, precision.autocast_dtype)
    if dev_type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        # not torch.cuda.is_bf16_supported(): it says True on pre-Ampere GPUs too (emulated bf16), and asks
        # about the current device, not this one
        if uses_bf16 and major < 8 and not torch.version.hip:
            raise PrecisionUnsupported(
                f"precision {precision.name!r} needs bf16, which GPU {describe_device(device)!r} "
                f"(compute capability {major}.{minor}) does not support (bf16 needs Ampere, 8.0, or newer)"
            )
        if precision.tf32 and major < 8:
            raise PrecisionUnsupported(
                f"precision 'tf32' needs an Ampere (8.0) or newer GPU; {describe_device(device)!r} is {major}.{minor}"
            )


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def backend_flags() -> dict[str, Any]:
    """The global numeric switches as they are now (recorded in every metrics.json)."""
    return {
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic": bool(torch.are_deterministic_algorithms_enabled()),
    }


#: torch >= 2.9's per-backend fp32 precision switches (the generic one first): a caller who set them there is
#: restored there (its legacy getters raise until then)
_FP32_PRECISION_BACKENDS = ("", "cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn", "mkldnn", "mkldnn.matmul",
                            "mkldnn.conv", "mkldnn.rnn")


def _fp32_precision_backend(name: str):
    obj = torch.backends
    for part in filter(None, name.split(".")):
        obj = getattr(obj, part)
    return obj


@contextlib.contextmanager
def restoring_global_numerics():
    """Give the caller back the process-wide numeric switches a stage sets: the TF32 switches and float32 matmul
    precision (:meth:`Precision.apply_backend_flags`), deterministic algorithms and the intra-op thread count.

    A stage sets them explicitly for itself (never trusting what it inherited); a caller running a stage in its own
    process (a notebook, a test, a script running several stages) must not find, say, TF32 left on by a ``tf32``
    stage under its own "fp32" matmuls. Restored through the API the caller set them with: legacy switches
    (``allow_tf32``, ``set_float32_matmul_precision``) when they can be read, else the per-backend
    ``fp32_precision`` values; per-backend values the legacy switches do not cover (oneDNN convolutions and RNNs,
    which :meth:`Precision.apply_backend_flags` clears too) are put back as well."""
    legacy = None
    with contextlib.suppress(RuntimeError):  # torch >= 2.9 refuses to read them once the new API was used
        legacy = (bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.allow_tf32),
                  torch.get_float32_matmul_precision())
    per_backend = None
    if hasattr(torch.backends, "fp32_precision"):
        per_backend = {n: _fp32_precision_backend(n).fp32_precision for n in _FP32_PRECISION_BACKENDS}
    deterministic = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        if legacy is not None:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = legacy[0], legacy[1]
            torch.set_float32_matmul_precision(legacy[2])
        if per_backend is not None:
            # after the legacy setters, only what they do not cover differs (say mkldnn.conv = "bf16"): set just that,
            # so legacy getters the caller could read stay readable
            for n, v in per_backend.items():
                if _fp32_precision_backend(n).fp32_precision != v:
                    _fp32_precision_backend(n).fp32_precision = v
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        torch.set_num_threads(threads)


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))
