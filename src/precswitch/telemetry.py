"""Cheap activation-overflow telemetry: does this model's activations fit fp16?

bf16 has fp32's range; fp16 tops out at 65,504 and its smallest *normal* value is 2**-14 ≈ 6.1035e-05.
A model pre-trained in bf16 (or fp32) can grow activations that overflow when the next stage runs
in fp16 (known for T5). This module measures, every ``every`` steps, for each watched module output:

* ``max_abs``: the largest |activation| (``inf``/``nan`` if the output already is non-finite);
* ``frac_overflow_fp16``: the fraction of values with ``|x| > 65504``, fp16's largest finite value (from 65520
  up they become ``inf`` in fp16; the few between round down to 65504);
* ``frac_underflow_fp16``: the fraction with ``0 < |x| < 2**-14`` (fp16 subnormal or flushed to 0).

``max_abs`` is exact (one read-only ``torch.aminmax`` pass over the whole output). The two
fractions are exact for outputs of at most ``sample_limit`` values (default 262,144: every hidden-size
output of a batch-32 x seq-64 x hidden-128 model); larger outputs (FFN intermediate, MLM logits over the
vocabulary) are classified on a strided sample of ~``sample_limit`` values whose stride is coprime with
the feature dimension (so every feature is visited). ``layers_with_overflow`` uses the exact max.

Granularity: the output of every ``nn.Linear`` and ``nn.LayerNorm`` (``module_types``), named by the
module's qualified name (``bert.encoder.layer.1.output.dense``). That localises an overflow to the
sub-layer (attention projection, FFN up/down, LayerNorm) at the cost of ~8 reductions per BERT layer;
``BertLayer`` granularity would hide *where* inside the layer the large values arise (the FFN
output, typically), which is the actionable part. Only forward activations are watched (not
gradients); comparisons are done in fp32, so bf16/fp16 activations are classified exactly.

Cost: when ``every`` is 0/None nothing is ever registered (``step()`` returns a shared null
context). Otherwise forward hooks are registered only for the forward pass of a sampled step and
removed right after it; statistics stay on the device until the step ends (one host sync per
sampled step). Measured overhead: docs/findings.md.

Usage in a training loop::

    tel = ActivationTelemetry(model, every=10)        # every=0 → off
    for step in ...:
        with tel.step(step), prec.autocast(device.type):
            loss = model(**batch).loss
        ...
    metrics["activation_telemetry"] = tel.summary()
    tel.write_csv(out / "activations.csv")            # or tel.rows()
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0**-14  # 6.103515625e-05
ROW_FIELDS = ["step", "layer", "max_abs", "frac_overflow_fp16", "frac_underflow_fp16"]
_NULL = contextlib.nullcontext()


class ActivationTelemetry:
    """Sample per-module activation range statistics every ``every`` steps (0/None: off, zero cost)."""

    def __init__(
        self,
        model: nn.Module,
        every: int | None = 10,
        module_types: tuple[type[nn.Module], ...] = (nn.Linear, nn.LayerNorm),
        sample_limit: int = 1 << 18,
    ):
        if every is not None and (not isinstance(every, int) or isinstance(every, bool) or every < 0):
            raise ValueError(f"telemetry every must be a non-negative integer or None, got {every!r}")
        self.every = every or 0
        self.sample_limit = int(sample_limit)
        self.model = model
        self.modules: list[tuple[str, nn.Module]] = [
            (name, m) for name, m in model.named_modules() if isinstance(m, module_types)
        ]
        self._handles: list[Any] = []
        self._pending: dict[str, list[torch.Tensor]] = {}  # name -> [max, n_over, n_under, numel] (device)
        self._rows: list[dict[str, Any]] = []
        self._agg: dict[str, dict[str, float]] = {}
        self.steps_sampled = 0

    @property
    def enabled(self) -> bool:
        return self.every > 0

    def is_sampled(self, step_index: int) -> bool:
        return self.enabled and step_index % self.every == 0

    @property
    def hooks_registered(self) -> int:
        return len(self._handles)

    # ------------------------------------------------------------------ hooks
    def _hook(self, name: str):
        def hook(module, args, output):
            if isinstance(output, (tuple, list)):
                output = output[0]
            if not torch.is_tensor(output) or not output.is_floating_point() or output.numel() == 0:
                return
            with torch.no_grad():
                x = output.detach()
                lo, hi = torch.aminmax(x)  # one read-only pass over everything: the max is exact
                mx = torch.maximum(lo.float().neg(), hi.float())
                sample, n = _sample(x, self.sample_limit)
                a = sample.abs()
                if a.dtype != torch.float32:
                    a = a.float()  # classify in fp32: a bf16 65504 would round to 65536
                stats = torch.stack([
                    mx,
                    torch.count_nonzero(a > FP16_MAX).float(),
                    torch.count_nonzero((a < FP16_MIN_NORMAL) & (a > 0)).float(),
                ])
            prev = self._pending.get(name)
            if prev is None:
                self._pending[name] = [stats, n]
            else:  # module called more than once in the forward pass
                s = prev[0]
                self._pending[name] = [torch.stack([torch.maximum(s[0], stats[0]), s[1] + stats[1], s[2] + stats[2]]),
                                       prev[1] + n]

        return hook

    def _register(self) -> None:
        for name, m in self.modules:
            self._handles.append(m.register_forward_hook(self._hook(name)))

    def _remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _collect(self, step_index: int) -> None:
        if not self._pending:
            return
        names = list(self._pending)
        host = torch.stack([self._pending[n][0] for n in names]).cpu().tolist()  # one sync
        for name, (mx, over, under) in zip(names, host):
            numel = self._pending[name][1]
            row = {
                "step": step_index,
                "layer": name,
                "max_abs": mx,
                "frac_overflow_fp16": over / numel,
                "frac_underflow_fp16": under / numel,
            }
            self._rows.append(row)
            agg = self._agg.setdefault(name, {"max_abs": -math.inf, "over": 0.0, "under": 0.0, "numel": 0})
            agg["max_abs"] = _nanmax(agg["max_abs"], mx)
            agg["over"] += over
            agg["under"] += under
            agg["numel"] += numel
        self._pending.clear()
        self.steps_sampled += 1

    # ------------------------------------------------------------------ API
    def step(self, step_index: int):
        """Context manager around the forward pass of step ``step_index``; watches it if sampled."""
        if not self.is_sampled(step_index):
            return _NULL
        return self._watch(step_index)

    @contextlib.contextmanager
    def _watch(self, step_index: int) -> Iterator[None]:
        self._register()
        try:
            yield
        finally:
            self._remove()
            self._collect(step_index)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to continue the same rows and summary (plain Python objects)."""
        return {"every": self.every, "rows": list(self._rows), "agg": {k: dict(v) for k, v in self._agg.items()},
                "steps_sampled": self.steps_sampled}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rows = list(state["rows"])
        self._agg = {k: dict(v) for k, v in state["agg"].items()}
        self.steps_sampled = int(state["steps_sampled"])

    def rows(self) -> list[dict[str, Any]]:
        """One row per (sampled step, module): the fields of :data:`ROW_FIELDS`."""
        return list(self._rows)

    def csv_text(self) -> str:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=ROW_FIELDS)
        w.writeheader()
        w.writerows(self._rows)
        return buf.getvalue()

    def write_csv(self, path: str | Path) -> None:
        from .io import atomic_write_text

        atomic_write_text(Path(path), self.csv_text())

    def summary(self) -> dict[str, Any]:
        """For metrics.json: flat overall scalars plus ``layers`` {name: {max_abs, frac_overflow_fp16, frac_underflow_fp16}}."""
        layers = {
            name: {
                "max_abs": _json_float(a["max_abs"]),
                "frac_overflow_fp16": a["over"] / a["numel"] if a["numel"] else None,
                "frac_underflow_fp16": a["under"] / a["numel"] if a["numel"] else None,
            }
            for name, a in self._agg.items()
        }
        overall, top = -math.inf, None
        for name, a in self._agg.items():
            m = a["max_abs"]
            if math.isnan(m) or m > overall:
                overall, top = m, name
                if math.isnan(m):
                    break
        total = sum(a["numel"] for a in self._agg.values())
        return {
            "every": self.every,
            "steps_sampled": self.steps_sampled,
            "modules_watched": len(self.modules) if self.enabled else 0,
            "max_abs": _json_float(overall) if top is not None else None,
            "max_abs_layer": top,
            "frac_overflow_fp16": sum(a["over"] for a in self._agg.values()) / total if total else None,
            "frac_underflow_fp16": sum(a["under"] for a in self._agg.values()) / total if total else None,
            "layers_with_overflow": sorted(n for n, a in self._agg.items() if a["over"] > 0 or a["max_abs"] > FP16_MAX),
            "layers": layers,
        }


def _sample(x: torch.Tensor, limit: int) -> tuple[torch.Tensor, int]:
    """All of ``x`` if it has at most ``limit`` values, else a strided view of about ``limit`` of them.

    The stride is chosen coprime with the last dimension, so the sample cycles through every feature
    (channel-specific outliers, as in LLM.int8, are not skipped systematically).
    """
    n = x.numel()
    if n <= limit:
        return x, n
    flat = x.reshape(-1)
    last = x.shape[-1] if x.dim() else 1
    stride = -(-n // limit)
    while math.gcd(stride, last) != 1:
        stride += 1
    view = flat[::stride]
    return view, view.numel()


def _nanmax(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)


def _json_float(x: float) -> float | str | None:
    """JSON has no inf/nan: NaN → None, ±inf → the string "inf"/"-inf"."""
    if math.isnan(x):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


__all__ = ["FP16_MAX", "FP16_MIN_NORMAL", "ROW_FIELDS", "ActivationTelemetry"]
