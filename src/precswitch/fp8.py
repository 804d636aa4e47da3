"""fp8 training of the linear layers through torchao (NVIDIA Ada/Hopper and newer GPUs only).

``torchao.float8.convert_to_float8_training`` swaps ``nn.Linear`` modules for ``Float8Linear``: the
matmul inputs (activations, weights, gradients) are cast to float8 (e4m3 forward, e5m2 for gradients
in the default tensorwise recipe) with dynamic per-tensor scales, the GEMM runs on fp8 tensor cores
(``torch._scaled_mm``) and accumulates in higher precision. Master weights stay in the model's
dtype; everything else (embeddings, LayerNorm, softmax, the loss) runs as before. The fp8 GEMM needs
compute capability 8.9+ (Ada: 8.9, Hopper: 9.0) and matrix dimensions that are multiples of 16.

torchao is an *optional* dependency (GPU only; ``pip install torchao``): it is imported lazily, and
on a machine without it :func:`check_fp8_supported` refuses with a clear message before training.
torchao's speed-up needs ``torch.compile`` (eager mode runs the casts as separate kernels); at tiny
model sizes fp8 is slower than bf16 either way.

What is converted (:func:`fp8_module_filter`): every ``nn.Linear`` whose ``in_features`` and
``out_features`` are multiples of 16, except the task head (``cls.*`` of BertForMaskedLM,
``classifier`` of BertForSequenceClassification, and the pooler ``bert.pooler.dense`` that only feeds
the classifier), which stays in high precision as in torchtitan's recipe (the output layer is the
most sensitive, and the MLM decoder is tied to the word embeddings).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch
from torch import nn

from .errors import PrecisionUnsupported

PRECISION_NAME = "fp8"
MIN_CAPABILITY = (8, 9)
#: module-name prefixes of the heads that are never converted
HEAD_PREFIXES = ("cls", "classifier", "bert.pooler", "pooler", "lm_head", "qa_outputs")
INSTALL_HINT = "pip install torchao"


def _describe(device: torch.device) -> str:
    if device.type == "cuda":
        try:
            return f"{device} ({torch.cuda.get_device_name(device)})"
        except Exception:  # noqa: BLE001
            return str(device)
    return str(device)


def torchao_available() -> bool:
    return importlib.util.find_spec("torchao") is not None


def check_fp8_supported(device: torch.device | str, precision: str = PRECISION_NAME) -> None:
    """Raise PrecisionUnsupported (naming the precision and the device) unless fp8 training can run here."""
    device = torch.device(device)
    if device.type != "cuda":
        raise PrecisionUnsupported(
            f"precision {precision!r} cannot run on device {_describe(device)!r}: fp8 matmuls need an NVIDIA GPU "
            f"with compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer (Ada, Hopper, Blackwell) "
            f"and torchao ({INSTALL_HINT})"
        )
    if not torch.cuda.is_available():
        raise PrecisionUnsupported(f"precision {precision!r}: device {str(device)!r} requested but CUDA is not available")
    cap = torch.cuda.get_device_capability(device)
    if tuple(cap) < MIN_CAPABILITY:
        raise PrecisionUnsupported(
            f"precision {precision!r} needs fp8 tensor cores (compute capability "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}+, Ada/Hopper or newer); GPU {_describe(device)!r} is "
            f"{cap[0]}.{cap[1]}"
        )
    if not torchao_available():
        raise PrecisionUnsupported(
            f"precision {precision!r} on {_describe(device)!r} needs torchao, which is not installed: {INSTALL_HINT}"
        )
    try:
        import torchao.float8  # noqa: F401
    except Exception as e:  # noqa: BLE001 - e.g. a torchao built for another torch
        raise PrecisionUnsupported(
            f"precision {precision!r}: torchao is installed but torchao.float8 cannot be imported "
            f"({type(e).__name__}: {e}); install a torchao matching torch {torch.__version__} ({INSTALL_HINT})"
        ) from None


def is_head(fqn: str, prefixes: tuple[str, ...] = HEAD_PREFIXES) -> bool:
    return any(fqn == p or fqn.startswith(p + ".") for p in prefixes)


def fp8_module_filter(module: nn.Module, fqn: str, prefixes: tuple[str, ...] = HEAD_PREFIXES) -> bool:
    """torchao ``module_filter_fn``: True for the Linear layers to convert (dims % 16 == 0, not a head)."""
    if not isinstance(module, nn.Linear):
        return False
    if is_head(fqn, prefixes):
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def fp8_candidates(model: nn.Module, prefixes: tuple[str, ...] = HEAD_PREFIXES) -> list[str]:
    """Names of the Linear layers :func:`convert_model_to_fp8` would convert (no torchao needed)."""
    return [name for name, m in model.named_modules() if fp8_module_filter(m, name, prefixes)]


def convert_model_to_fp8(
    model: nn.Module,
    config=None,
    module_filter_fn: Callable[[nn.Module, str], bool] | None = None,
) -> nn.Module:
    """Swap the eligible Linear layers for torchao ``Float8Linear`` (in place; returns the model).

    Call after moving the model to the GPU and casting it to its storage dtype, and before building
    the optimizer (the parameters are kept, but do it in that order anyway). ``config``: a
    ``torchao.float8.Float8LinearConfig`` (default: torchao's default tensorwise dynamic scaling).
    """
    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError:
        raise PrecisionUnsupported(
            f"precision {PRECISION_NAME!r} needs torchao, which is not installed: {INSTALL_HINT}"
        ) from None
    n = len(fp8_candidates(model)) if module_filter_fn is None else None
    if n == 0:
        raise PrecisionUnsupported(
            f"precision {PRECISION_NAME!r}: no Linear layer of this model has dimensions that are multiples of 16; "
            f"nothing would run in fp8"
        )
    return convert_to_float8_training(model, module_filter_fn=module_filter_fn or fp8_module_filter, config=config)


def count_fp8_linears(model: nn.Module) -> int:
    """How many modules are torchao Float8Linear (0 without torchao)."""
    return sum(1 for m in model.modules() if type(m).__name__ == "Float8Linear")


__all__ = [
    "PRECISION_NAME",
    "check_fp8_supported",
    "convert_model_to_fp8",
    "count_fp8_linears",
    "fp8_candidates",
    "fp8_module_filter",
    "torchao_available",
]
