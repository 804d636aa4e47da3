"""Compensated pure-bf16 weight updates: Kahan summation and stochastic rounding.

Why: with bf16 weights, ``w + Δw`` is rounded to the nearest bf16 value. bf16 keeps 8 significant
bits, so at ``|w| ≈ 1`` the spacing is 2**-8..2**-7 and any update smaller than half of that
(≈ 0.002) is lost *entirely*, every step (Zamirai et al. 2020, "Revisiting BFloat16 Training").
Late in training, ``lr · update`` is almost always that small. Two fixes recover fp32 accuracy
without fp32 master weights:

* **Kahan summation** keeps, per parameter, a bf16 compensation buffer ``c`` holding the part of the
  intended update that rounding threw away, and adds it back next step::

      y = Δw + c ;  w' = bf16(w + y) ;  c = y - (w' - w)          (all in fp32 math, c stored bf16)

* **Stochastic rounding** rounds ``w + Δw`` up or down at random with probabilities proportional to
  the distances, so the rounding is unbiased (``E[w'] = w + Δw``): small updates survive on average.

Design (both wrappers): the wrapped optimizer is an ordinary ``torch.optim`` optimizer (AdamW,
fused/foreach/for-loop, SGD, ...) built on the bf16 parameters. At :meth:`step` the wrapper

1. upcasts every bf16 parameter, its gradient and its optimizer-state tensors to fp32 (exact), by
   swapping ``param.data`` / ``param.grad`` / ``state[param][k]``;
2. lets the inner optimizer do its normal update *in fp32 math* (so weight decay, bias correction,
   eps, ... are exactly the library's own);
3. takes the intended update ``Δw = w_fp32_new - w_old`` and writes ``w_old + Δw`` back into the
   parameter's **original bf16 storage** (same tensor, same ``data_ptr``) with Kahan compensation or
   stochastic rounding; restores the bf16 gradient; rounds the optimizer state back to bf16
   (round-to-nearest, as torch's own AdamW does for bf16 state).

So between steps *everything* is bf16: parameters, gradients, optimizer state, compensation buffer
(no fp32 master weights: this is still "pure bf16", only the update arithmetic is fp32, as inside
torch's fused kernels and torchao's ``_AdamW(bf16_stochastic_round=True)``). The fp32 copies exist
only during ``step()`` (transient memory ≈ 16 bytes per bf16 parameter for AdamW).

Parameters that are not bf16/fp16 (e.g. an fp32 head) pass through untouched: the inner optimizer
updates them as usual. Stochastic rounding supports bf16 only (the bit trick below); Kahan works for
bf16 and fp16.

The wrappers *are* ``torch.optim.Optimizer`` instances sharing ``param_groups`` and ``state`` with the
inner optimizer, so LR schedulers (``get_linear_schedule_with_warmup``), ``clip_grad_norm_`` and
``zero_grad`` work unchanged. ``state_dict()`` is the inner optimizer's state dict plus one extra key
``"precswitch_compensation"`` (kind, Kahan buffers by parameter index, SR generator state), so a
resumed run continues bit-for-bit.

Use :func:`wrap_optimizer` (``kind`` in ``None | "kahan" | "stochastic_rounding"``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .errors import PrecswitchError

KINDS = (None, "kahan", "stochastic_rounding")
_LOW = (torch.bfloat16, torch.float16)
_SD_KEY = "precswitch_compensation"


def stochastic_round_to_bf16(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Round an fp32 tensor to bf16 stochastically (unbiased): P(round up) = distance to the lower value / spacing.

    Bit trick: bf16 is the upper 16 bits of fp32. Add a uniform random integer in [0, 2**16) to the
    fp32 bit pattern (as int32) and truncate the lower 16 bits. Because fp32 is sign-magnitude, this
    rounds the *magnitude* up with the right probability for either sign; a carry into the exponent
    is the correct next bf16 value. Non-finite inputs are passed through (round-to-nearest).
    """
    if x.dtype != torch.float32:
        x = x.float()
    bits = x.view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device=x.device, generator=generator)
    rounded = ((bits + noise) & -65536).view(torch.float32)  # -65536 == 0xFFFF0000 as int32
    rounded = torch.where(torch.isfinite(x), rounded, x)
    return rounded.to(torch.bfloat16)  # exact: the low 16 bits are zero


class _CompensatedOptimizer(torch.optim.Optimizer):
    """Base of the wrappers: fp32 update math on bf16 storage. Subclasses define :meth:`_write_back`."""

    kind: str = ""

    def __init__(self, optimizer: torch.optim.Optimizer):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"{type(self).__name__} wraps a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(optimizer, _CompensatedOptimizer):
            raise TypeError(f"{type(self).__name__}: the optimizer is already wrapped ({optimizer.kind})")
        # Optimizer.__init__ is deliberately not called: it would copy the param groups, and the LR
        # scheduler must edit the *inner* optimizer's groups. We share them instead (properties below).
        self.optimizer = optimizer
        self.defaults = optimizer.defaults
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._optimizer_state_dict_pre_hooks = OrderedDict()
        self._optimizer_state_dict_post_hooks = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()
        self._patch_step_function()
        self._warned_capturable_if_run_uncaptured = True

    # ------------------------------------------------------------------ shared with the inner optimizer
    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value) -> None:
        self.optimizer.param_groups = value

    @property
    def state(self):  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value) -> None:
        self.optimizer.state = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.optimizer!r})"

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # ------------------------------------------------------------------ helpers
    def _params(self) -> Iterator[torch.Tensor]:
        """All parameters in state_dict index order (torch packs them group by group)."""
        for g in self.param_groups:
            yield from g["params"]

    def _low_params(self) -> list[torch.Tensor]:
        return [p for p in self._params() if p.grad is not None and p.dtype in _LOW]

    # ------------------------------------------------------------------ the step
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        low = self._low_params()
        saved = []  # (param, original low-precision storage, original grad)
        for p in low:
            old, grad = p.data, p.grad
            p.grad = None
            p.data = old.float()
            p.grad = grad.float()
            st = self.state.get(p)
            if st:
                for k, v in st.items():
                    if k != "step" and torch.is_tensor(v) and v.dtype in _LOW:
                        st[k] = v.float()
            saved.append((p, old, grad))
        stepped = False
        try:
            self.optimizer.step()
            stepped = True
        finally:
            for p, old, grad in saved:
                if stepped:
                    self._write_back(p, old, p.data)
                p.grad = None
                p.data = old
                p.grad = grad
                for k, v in self.state.get(p, {}).items():
                    if k != "step" and torch.is_tensor(v) and v.is_floating_point() and v.dtype != old.dtype:
                        self.state[p][k] = v.to(old.dtype)
        return loss

    def _write_back(self, p: torch.Tensor, old: torch.Tensor, new32: torch.Tensor) -> None:
        """Write the intended new value ``new32`` (fp32) into the low-precision storage ``old`` in place."""
        raise NotImplementedError

    # ------------------------------------------------------------------ state
    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, extra: dict[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        sd = self.optimizer.state_dict()
        sd[_SD_KEY] = {"kind": self.kind, **self._extra_state()}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        sd = dict(state_dict)
        extra = sd.pop(_SD_KEY, None)
        if extra is None or extra.get("kind") != self.kind:
            got = None if extra is None else extra.get("kind")
            raise PrecswitchError(
                f"optimizer state was saved with compensation {got!r}, but this run uses {self.kind!r}: "
                f"resume with the same precision"
            )
        self.optimizer.load_state_dict(sd)
        self._load_extra_state(extra)


class KahanWrapper(_CompensatedOptimizer):
    """Kahan-compensated updates of bf16/fp16 parameters; the compensation buffer is stored in the param dtype."""

    kind = "kahan"

    def __init__(self, optimizer: torch.optim.Optimizer):
        super().__init__(optimizer)
        self.compensation: dict[torch.Tensor, torch.Tensor] = {}

    def _write_back(self, p, old, new32):
        # new32 is a temporary (the fp32 copy the inner optimizer updated): reuse it in place.
        comp = self.compensation.get(p)
        if comp is None:
            s = new32  # first step: w + Δw, nothing carried yet
        else:
            # s = w + (Δw + c) = new32 + c; in fp32 the sum is exact enough: its error is ~2**-24
            # relative to w, far below what the bf16 buffer can carry
            s = new32.add_(comp)
        rounded = s.to(old.dtype)
        # what rounding dropped: y - (rounded - w) = s - rounded, kept for the next step
        c = s.sub_(rounded)
        if comp is None:
            self.compensation[p] = c.to(old.dtype)
        else:
            comp.copy_(c)
        old.copy_(rounded)

    def _extra_state(self):
        idx = {p: i for i, p in enumerate(self._params())}
        return {"buffers": {idx[p]: c for p, c in self.compensation.items() if p in idx}}

    def _load_extra_state(self, extra):
        params = list(self._params())
        self.compensation = {}
        for i, c in extra.get("buffers", {}).items():
            p = params[int(i)]
            self.compensation[p] = c.to(device=p.device, dtype=p.dtype).clone()


class StochasticRoundingWrapper(_CompensatedOptimizer):
    """Stochastically rounded updates of bf16 parameters (unbiased), reproducible through ``generator``."""

    kind = "stochastic_rounding"

    def __init__(self, optimizer: torch.optim.Optimizer, generator: torch.Generator | None = None, seed: int = 0):
        super().__init__(optimizer)
        bad = sorted({str(p.dtype) for p in self._params() if p.dtype == torch.float16})
        if bad:
            raise PrecswitchError(
                "stochastic rounding is implemented for bf16 parameters only; got float16 parameters "
                "(use Kahan summation for fp16)"
            )
        if generator is None:
            dev = next(iter(self._params())).device
            generator = torch.Generator(device=dev).manual_seed(seed)
        self.generator = generator

    def _write_back(self, p, old, new32):
        old.copy_(stochastic_round_to_bf16(new32, self.generator))

    def _extra_state(self):
        return {"generator_state": self.generator.get_state()}

    def _load_extra_state(self, extra):
        if "generator_state" in extra:
            self.generator.set_state(extra["generator_state"].cpu())


def wrap_optimizer(kind: str | None, optimizer: torch.optim.Optimizer, seed: int = 0) -> torch.optim.Optimizer:
    """``None`` → the optimizer itself; ``"kahan"`` → :class:`KahanWrapper`;
    ``"stochastic_rounding"`` → :class:`StochasticRoundingWrapper` with a generator seeded by ``seed``
    on the parameters' device."""
    if kind is None:
        return optimizer
    if kind == "kahan":
        return KahanWrapper(optimizer)
    if kind == "stochastic_rounding":
        dev = next(p for g in optimizer.param_groups for p in g["params"]).device
        return StochasticRoundingWrapper(optimizer, torch.Generator(device=dev).manual_seed(seed))
    raise PrecswitchError(f"optimizer compensation {kind!r}: allowed None, 'kahan', 'stochastic_rounding'")


__all__ = ["KINDS", "KahanWrapper", "StochasticRoundingWrapper", "stochastic_round_to_bf16", "wrap_optimizer"]
