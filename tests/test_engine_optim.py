"""Compensated pure-bf16 updates (precswitch.optim): small updates survive, everything stays bf16, resume is exact."""

from __future__ import annotations

import copy

import pytest
import torch

from precswitch.errors import PrecswitchError
from precswitch.optim import (
    KahanWrapper,
    stochastic_round_to_bf16,
    wrap_optimizer,
)

N = 4096  # elements: the SR mean over many elements is tight
LR = 1e-4  # update per step: far below half the bf16 spacing at 1.0 (2**-9 ≈ 0.00195)
STEPS = 200


def _param(value: float = 1.0) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.full((N,), value, dtype=torch.bfloat16))


def _inner(kind: str, p, lr=LR):
    if kind == "sgd":
        return torch.optim.SGD([p], lr=lr)
    impl = {"adamw_fused": {"fused": True}, "adamw_foreach": {"foreach": True}, "adamw_loop": {"foreach": False}}[kind]
    return torch.optim.AdamW([p], lr=lr, weight_decay=0.0, **impl)


def _run(opt, p, steps=STEPS, grad=1.0):
    for _ in range(steps):
        p.grad = torch.full_like(p, grad)
        opt.step()
        opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("inner", ["sgd", "adamw_fused", "adamw_foreach", "adamw_loop"])
def test_plain_bf16_loses_small_updates(inner):
    p = _param()
    _run(_inner(inner, p), p)
    assert torch.all(p == 1.0), "nearest rounding should cancel every update of 1e-4 at w=1"


@pytest.mark.parametrize("inner", ["sgd", "adamw_fused", "adamw_foreach", "adamw_loop"])
def test_kahan_recovers_small_updates(inner):
    p = _param()
    _run(wrap_optimizer("kahan", _inner(inner, p)), p)
    expected = 1.0 - STEPS * LR  # 0.98 (Adam with a constant gradient steps by ~lr)
    spacing = 2.0**-8  # bf16 spacing just below 1.0
    assert torch.all((p.float() - expected).abs() <= spacing), p.float()[:4]
    assert p.dtype == torch.bfloat16


@pytest.mark.parametrize("inner", ["sgd", "adamw_fused", "adamw_foreach"])
def test_stochastic_rounding_recovers_small_updates_on_average(inner):
    p = _param()
    _run(wrap_optimizer("stochastic_rounding", _inner(inner, p), seed=3), p)
    moved = 1.0 - p.detach().float()
    assert (moved != 0).any()
    # per element SD ≈ 0.009; mean over 4096 elements: SD ≈ 1.4e-4
    assert abs(float(moved.mean()) - STEPS * LR) < 1e-3, float(moved.mean())


def test_everything_stays_bf16():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 2)).to(torch.bfloat16)
    for kind in ("kahan", "stochastic_rounding"):
        inner = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        opt = wrap_optimizer(kind, inner, seed=0)
        ptrs = [p.data_ptr() for p in model.parameters()]
        for _ in range(3):
            model(torch.randn(8, 16, dtype=torch.bfloat16)).float().pow(2).mean().backward()
            for p in model.parameters():
                assert p.grad.dtype == torch.bfloat16
            opt.step()
            for p in model.parameters():
                assert p.dtype == torch.bfloat16 and p.grad.dtype == torch.bfloat16
            opt.zero_grad()
        assert [p.data_ptr() for p in model.parameters()] == ptrs, "updates are written in place"
        for p in model.parameters():
            st = inner.state[p]
            assert st["exp_avg"].dtype == torch.bfloat16 and st["exp_avg_sq"].dtype == torch.bfloat16
        if kind == "kahan":
            assert all(c.dtype == torch.bfloat16 for c in opt.compensation.values())
            assert len(opt.compensation) == len(list(model.parameters()))


def test_fp32_params_pass_through():
    a = torch.nn.Parameter(torch.ones(8))  # fp32
    b = torch.nn.Parameter(torch.ones(8, dtype=torch.bfloat16))
    ref = torch.nn.Parameter(torch.ones(8))
    opt = KahanWrapper(torch.optim.SGD([a, b], lr=0.1))
    ref_opt = torch.optim.SGD([ref], lr=0.1)
    for _ in range(3):
        a.grad, b.grad, ref.grad = torch.ones(8), torch.ones(8, dtype=torch.bfloat16), torch.ones(8)
        opt.step()
        ref_opt.step()
    assert a.dtype == torch.float32 and torch.equal(a, ref)
    assert torch.allclose(b.float(), ref, atol=1e-2)


def _train(kind, seed, steps, state=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).to(torch.bfloat16)
    opt = wrap_optimizer(kind, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, foreach=True), seed=seed)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - s / 100)
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        start = state["step"]
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(16, 32, generator=g) for _ in range(40)]
    for s in range(start, steps):
        x = xs[s].to(torch.bfloat16)
        loss = (model(x).float() - x[:, :1].float()).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    snap = {"model": {k: v.clone() for k, v in model.state_dict().items()}, "opt": opt.state_dict(),
            "sched": sched.state_dict(), "step": steps}
    return model, opt, snap


@pytest.mark.parametrize("kind", ["kahan", "stochastic_rounding"])
def test_resume_is_bitwise(kind):
    full, _, _ = _train(kind, seed=5, steps=40)
    _, _, snap = _train(kind, seed=5, steps=20)
    resumed, opt, _ = _train(kind, seed=5, steps=40, state=snap)
    for a, b in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    for st in opt.state.values():
        assert st["exp_avg"].dtype == torch.bfloat16


@pytest.mark.parametrize("kind", ["kahan", "stochastic_rounding"])
def test_deterministic_for_a_seed(kind):
    a, _, _ = _train(kind, seed=7, steps=15)
    b, _, _ = _train(kind, seed=7, steps=15)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    if kind == "stochastic_rounding":
        c, _, _ = _train(kind, seed=8, steps=15)
        assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters()))


def test_resume_with_other_kind_is_refused():
    _, _, snap = _train("kahan", seed=1, steps=2)
    with pytest.raises(PrecswitchError, match="kahan"):
        _train("stochastic_rounding", seed=1, steps=4, state=snap)


def test_scheduler_drives_inner_lr():
    p = _param()
    inner = torch.optim.SGD([p], lr=1.0)
    opt = wrap_optimizer("kahan", inner)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    assert inner.param_groups[0]["lr"] == 0.5 and opt.param_groups is inner.param_groups
    _run(opt, p, steps=1)
    sched.step()


def test_stochastic_round_is_unbiased_and_exact_on_bf16_values():
    g = torch.Generator().manual_seed(0)
    x = torch.full((100_000,), 1.0 + 2.0**-9)  # a quarter of the way between 1 and 1 + 2**-7
    r = stochastic_round_to_bf16(x, g).float()
    assert set(r.unique().tolist()) == {1.0, 1.0 + 2.0**-7}
    assert abs(float(r.mean()) - (1.0 + 2.0**-9)) < 6e-5
    neg = stochastic_round_to_bf16(-x, g).float()
    assert abs(float(neg.mean()) + (1.0 + 2.0**-9)) < 6e-5
    exact = torch.randn(1000).to(torch.bfloat16)
    assert torch.equal(stochastic_round_to_bf16(exact.float(), g), exact)
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])
    out = stochastic_round_to_bf16(special, g).float()
    assert out[0] == float("inf") and out[1] == float("-inf") and torch.isnan(out[2]) and out[3] == 0


@pytest.mark.parametrize("kind", ["kahan", "stochastic_rounding"])
def test_a_failed_inner_step_writes_nothing_into_the_bf16_weights(kind):
    """An inner optimizer that raises half-way through its step (after touching the fp32 copies) leaves the bf16
    weights, their gradients and dtypes as they were: nothing half-updated is written back."""

    class Boom(torch.optim.SGD):
        def step(self, closure=None):
            super().step(closure)
            raise RuntimeError("boom")

    p = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    opt = wrap_optimizer(kind, Boom([p], lr=0.5), seed=0)
    p.grad = torch.ones(4, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="boom"):
        opt.step()
    assert p.dtype == torch.bfloat16 and torch.equal(p, torch.ones(4, dtype=torch.bfloat16))
    assert p.grad.dtype == torch.bfloat16 and torch.equal(p.grad, torch.ones(4, dtype=torch.bfloat16))


def test_stochastic_rounding_keeps_every_nan_a_nan():
    """A NaN whose payload fills the mantissa (0x7FFFFFFF, or 0xFFFFFFFF negative) would carry out of the int32 in
    the bit trick and come back as a finite number (-0.0): a NaN weight silently 'repaired'. It stays NaN."""
    bits = torch.tensor([0x7FFFFFFF, -1, 0x7FC00000, 0x7F800001], dtype=torch.int32)
    x = bits.view(torch.float32)
    assert torch.isnan(x).all()
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        assert torch.isnan(stochastic_round_to_bf16(x, g).float()).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kahan_weight_plus_buffer_tracks_a_float64_reference(dtype):
    """Kahan for bf16 and fp16 parameters (the docs: both), checked against the same SGD run in float64: weights of
    several magnitudes, 60 steps of random updates of 1/32 to 1/8 of their 16-bit spacing (a few spacings in all).
    Weight + compensation buffer is the float64 result to within the buffer's own rounding (half its spacing, summed
    over the steps), the weight alone within one spacing; the parameter, its gradient and the buffer stay 16-bit.
    Nearest rounding (an fp16 parameter passed through uncompensated) would leave every weight where it started."""
    g = torch.Generator().manual_seed(0)
    w0 = (torch.tensor([0.01, -0.3, 1.0, -3.0, 20.0, 100.0]).repeat(50) * (1 + torch.rand(300, generator=g))).to(dtype)
    p = torch.nn.Parameter(w0.clone())
    opt = wrap_optimizer("kahan", torch.optim.SGD([p], lr=1.0))
    ref, rel = w0.double(), 2.0**-12 if dtype == torch.bfloat16 else 2.0**-15
    for _ in range(60):
        step = ((0.5 + torch.rand(300, generator=g)) * w0.float() * rel).to(dtype)
        p.grad = -step
        ref += step.double()
        opt.step()
    buf = opt.compensation[p]
    assert p.dtype == dtype and p.grad.dtype == dtype and buf.dtype == dtype
    spacing = 2.0 ** (torch.floor(torch.log2(ref.abs())) - (7 if dtype == torch.bfloat16 else 10))
    total = p.detach().double() + buf.double()
    assert torch.all((total - ref).abs() <= 60 * spacing * 2.0**-9), float(((total - ref).abs() / spacing).max())
    assert torch.all((p.detach().double() - ref).abs() <= spacing)
    assert torch.all(p.detach() != w0)  # the updates arrived (plain rounding would drop every one)


def test_kahan_buffers_resume_on_their_own_parameters_when_gradients_arrive_out_of_order():
    """The second parameter gets a gradient first (the first one only from step 2): the saved buffers are keyed by
    parameter index, so a resumed run gives each parameter its own buffer back and continues bit for bit (keyed by
    arrival order they would be swapped: another shape, or the other weight's carried update)."""
    def fresh():
        a = torch.nn.Parameter(torch.ones(3, dtype=torch.bfloat16))
        b = torch.nn.Parameter(torch.full((5,), 2.0, dtype=torch.bfloat16))
        return a, b, KahanWrapper(torch.optim.SGD([a, b], lr=1.0))

    def step(a, b, opt, with_a=True):
        if with_a:
            a.grad = torch.full((3,), -(2.0**-10), dtype=torch.bfloat16)
        b.grad = torch.full((5,), -(3 * 2.0**-11), dtype=torch.bfloat16)
        opt.step()
        opt.zero_grad()

    a, b, opt = fresh()
    step(a, b, opt, with_a=False)
    step(a, b, opt)
    saved = copy.deepcopy({"a": a.detach(), "b": b.detach(), "opt": opt.state_dict()})  # as torch.save would keep it
    for _ in range(3):
        step(a, b, opt)
    a2, b2, opt2 = fresh()
    with torch.no_grad():
        a2.copy_(saved["a"])
        b2.copy_(saved["b"])
    opt2.load_state_dict(saved["opt"])
    assert opt2.compensation[a2].shape == (3,) and opt2.compensation[b2].shape == (5,)
    for _ in range(3):
        step(a2, b2, opt2)
    assert torch.equal(a2, a) and torch.equal(b2, b)
    assert torch.equal(opt2.compensation[a2], opt.compensation[a])


