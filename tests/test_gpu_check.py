"""benchmarks/gpu_check.py: the logic that decides what a borrowed GPU's run reports, checked on a CPU with
hand-built inputs and hand-computed expectations (mutation audit). The summary and verdicts (checks_from),
the figures of a timed row (FLOPs, MFU against the right peak, tokens/s), the timed window (warm-up and
profiled steps outside it), the profiler's per-step arithmetic on CUDA-like events, the synthetic batches,
the time budget, the JSON written after every row and the exit code. Nothing here needs a GPU."""

import json
import sys
import time
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_helpers import load_benchmark  # noqa: E402

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture(scope="module")
def gc():
    return load_benchmark("gpu_check")


def _ok(precision, variant, sps, mfu=None):
    return {"precision": precision, "variant": variant, "status": "ok", "reason": None,
            "steps_per_second": sps, "mfu": mfu}


# ------------------------------------------------------------------ checks_from: verdicts
def _checks(gc, rows, device=CUDA):
    ratios, checks = gc.checks_from(rows, device)
    return ratios, {c["name"]: c for c in checks}


def test_targets_pass_at_exactly_their_threshold(gc):
    """>= 2.5x and >= 35%: a value at the target passes, one just under fails."""
    _, c = _checks(gc, [_ok("fp32", "eager", 10.0, 0.5), _ok("amp_bf16", "eager", 25.0, 0.35)])
    assert c["speedup_amp_bf16_over_fp32"]["value"] == 2.5 and c["speedup_amp_bf16_over_fp32"]["result"] == "PASS"
    assert c["mfu_amp_bf16"]["value"] == 0.35 and c["mfu_amp_bf16"]["result"] == "PASS"
    _, c = _checks(gc, [_ok("fp32", "eager", 10.0), _ok("amp_bf16", "eager", 24.9, 0.349)])
    assert c["speedup_amp_bf16_over_fp32"]["result"] == "FAIL" and c["mfu_amp_bf16"]["result"] == "FAIL"
    assert c["speedup_amp_bf16_over_fp32"]["target"] == 2.5 and c["mfu_amp_bf16"]["target"] == 0.35


def test_failed_and_skipped_rows_never_count(gc):
    """A failed row (even one that got as far as a speed or an MFU before it failed) gives no ratio and no
    MFU; a failed fp32 row leaves the speed-up unmeasured, not a number, and on a GPU fails its target."""
    failed_bf16 = {**_ok("amp_bf16", "compiled", 99.0, 0.99), "status": "failed", "reason": "OutOfMemoryError"}
    failed_fp32 = {"precision": "fp32", "variant": "eager", "status": "failed", "reason": "RuntimeError: x"}
    skipped = {"precision": "tf32", "variant": "eager", "status": "skipped", "reason": "time budget"}
    rows = [failed_fp32, _ok("amp_bf16", "eager", 30.0, 0.2), _ok("fp32", "compiled", 10.0), failed_bf16, skipped]
    ratios, c = _checks(gc, rows)
    assert ratios == {}  # no ok fp32 eager row; the compiled amp_bf16 row failed
    assert c["speedup_amp_bf16_over_fp32"]["value"] is None and c["speedup_amp_bf16_over_fp32"]["result"] == "FAIL"
    assert c["speedup_amp_bf16_over_fp32"]["note"] == "fp32 (eager) failed: RuntimeError: x"
    assert c["mfu_amp_bf16"]["value"] == 0.2 and c["mfu_amp_bf16"]["result"] == "FAIL"  # not the failed row's 0.99


def test_a_row_a_target_needs_failing_on_a_gpu_fails_the_target_a_skipped_one_does_not(gc):
    """amp_bf16 out of memory on a GPU: the check cannot show its targets are met, so both FAIL (exit 1), the
    note naming the row and its reason. Skipped rows (bf16 unsupported before Ampere, the time budget) leave
    the targets n/a; on a CPU nothing is a verdict. A failed row of another precision does not count."""
    oom = {"precision": "amp_bf16", "variant": "eager", "status": "failed", "reason": "OutOfMemoryError: 2 GiB"}
    _, c = _checks(gc, [_ok("fp32", "eager", 10.0, 0.5), oom])
    assert (c["speedup_amp_bf16_over_fp32"]["result"], c["mfu_amp_bf16"]["result"]) == ("FAIL", "FAIL")
    assert c["speedup_amp_bf16_over_fp32"]["note"] == c["mfu_amp_bf16"]["note"] == \
        "amp_bf16 (eager) failed: OutOfMemoryError: 2 GiB"
    skipped = {**oom, "status": "skipped", "reason": "bf16 needs compute capability 8.0"}
    _, c = _checks(gc, [_ok("fp32", "eager", 10.0, 0.5), skipped])
    assert (c["speedup_amp_bf16_over_fp32"]["result"], c["mfu_amp_bf16"]["result"]) == ("n/a", "n/a")
    _, c = _checks(gc, [_ok("fp32", "eager", 10.0, 0.5), oom], device=CPU)
    assert (c["speedup_amp_bf16_over_fp32"]["result"], c["mfu_amp_bf16"]["result"]) == ("n/a", "n/a")
    other = {**oom, "precision": "pure_fp16"}
    _, c = _checks(gc, [_ok("fp32", "eager", 10.0, 0.5), _ok("amp_bf16", "eager", 30.0, 0.4), other])
    assert (c["speedup_amp_bf16_over_fp32"]["result"], c["mfu_amp_bf16"]["result"]) == ("PASS", "PASS")
    # an amp_bf16 row that ran (compiled) keeps the MFU check on its figure, despite the eager row's failure
    _, c = _checks(gc, [_ok("fp32", "eager", 10.0, 0.5), oom, _ok("amp_bf16", "compiled", 50.0, 0.4)])
    assert c["mfu_amp_bf16"]["result"] == "PASS" and c["speedup_amp_bf16_over_fp32"]["result"] == "FAIL"


def test_mfu_target_is_amp_bf16s_best_variant_only(gc):
    rows = [_ok("fp32", "eager", 10.0, 0.6), _ok("amp_bf16", "eager", 20.0, 0.1), _ok("pure_bf16", "eager", 40.0, 0.5),
            _ok("amp_bf16", "compiled", 60.0, 0.3), _ok("tf32", "eager", 15.0, 0.4)]
    ratios, c = _checks(gc, rows)
    assert c["mfu_amp_bf16"]["value"] == 0.3 and c["mfu_amp_bf16"]["result"] == "FAIL"  # pure_bf16's 0.5 is not it
    # no compiled fp32 row: the speed-up compares the eager rows, 20 / 10
    assert c["speedup_amp_bf16_over_fp32"]["variant"] == "eager" and c["speedup_amp_bf16_over_fp32"]["value"] == 2.0
    assert ratios == {"amp_bf16/fp32 (eager)": 2.0, "pure_bf16/fp32 (eager)": 4.0, "tf32/fp32 (eager)": 1.5}


def test_no_verdict_on_a_cpu(gc):
    ratios, c = _checks(gc, [_ok("fp32", "eager", 10.0, 0.5), _ok("amp_bf16", "eager", 100.0, 0.9)], device=CPU)
    assert ratios == {"amp_bf16/fp32 (eager)": 10.0}
    assert c["speedup_amp_bf16_over_fp32"]["result"] == "n/a" and c["mfu_amp_bf16"]["result"] == "n/a"
    assert c["speedup_amp_bf16_over_fp32"]["value"] == 10.0


# ------------------------------------------------------------------ one timed row: figures
# QUICK model: hidden h 64, FFN f 256, 2 layers, vocab V 1000, 2 labels; batch 3 x seq 16 (48 tokens).
# Forward matmul FLOPs per token per layer: 8h^2 + 4hf + 4sh = 32768 + 65536 + 4096 = 102400.
B, S = 3, 16
FULL_ENCODER = 48 * 2 * 102_400  # 9,830,400
# the engine's classification step: layer 2 computes K, V for all 48 tokens (2 x 2h^2 each) and the rest
# for [CLS] only: Q 2h^2 + scores 2sh + sum 2sh + out 2h^2 + FFN 4hf = 8192 + 2048 + 2048 + 8192 + 65536
CLS_ENCODER = 48 * 102_400 + 48 * 2 * 8192 + B * 86_016  # 5,959,680
CLS_HEAD = B * (2 * 64 * 64 + 2 * 64 * 2)  # pooler + classifier on [CLS]: 25,344
MLM_HEAD_PER_ROW = 2 * 64 * 64 + 2 * 64 * 1000  # transform + decoder: 136,192


def _row(gc, name, extra=(), peaks=None, **over):
    args = gc.parse_args(["--device", "cpu", "--quick", "--batch", str(B), "--seq", str(S), "--steps", "2",
                          "--warmup", "1", *extra])
    batches = gc.make_batches(gc.QUICK, B, S, args.mlm, CPU, n=2, engine_step=args.step == "engine")
    row = gc.measure_one(name, "eager", args, gc.QUICK, CPU, batches, peaks or {})
    assert row["status"] == "ok", row
    return row, batches


def _rates_are_consistent(row, flops_per_step):
    n, sec = row["steps_measured"], row["seconds"]
    assert row["model_flops_per_step"] == flops_per_step
    assert row["steps_per_second"] == pytest.approx(n / sec) and row["step_seconds"] == pytest.approx(sec / n)
    assert row["samples_per_second"] == pytest.approx(n * B / sec)
    assert row["tokens_per_second"] == pytest.approx(n * B * S / sec)
    assert row["achieved_tflops"] == pytest.approx(flops_per_step * n / sec / 1e12)


def test_classification_row_flops_mfu_and_rates(gc):
    """The engine's classification step: FLOPs with the [CLS]-only last layer, counted by hand; MFU against
    the peak of the row's own precision (fp32's for fp32, bf16's for amp_bf16)."""
    peaks = {"fp32": 0.002, "tf32": 0.003, "fp16": 0.007, "bf16": 0.005}
    want = 3 * (CLS_ENCODER + CLS_HEAD)  # 17,955,072
    for name, key in (("fp32", "fp32"), ("amp_bf16", "bf16")):
        row, _ = _row(gc, name, peaks=peaks)
        _rates_are_consistent(row, want)
        assert row["peak_key"] == key and row["peak_tflops"] == peaks[key]
        assert row["mfu"] == pytest.approx(row["achieved_tflops"] / peaks[key])
        assert row["fused_adamw"] is True  # the engine's default optimizer_impl: fused


def test_stock_step_counts_the_full_model(gc):
    row, _ = _row(gc, "fp32", extra=["--step", "stock"])
    _rates_are_consistent(row, 3 * (FULL_ENCODER + CLS_HEAD))  # 29,567,232
    assert row["mfu"] is None and row["peak_tflops"] is None  # no peak given


def test_mlm_row_flops_count_the_scored_rows(gc):
    row, batches = _row(gc, "fp32", extra=["--mlm"])
    labelled = [int((b["labels"] != -100).sum()) for b in batches]
    head_rows = round(sum((x + 15) // 16 * 16 for x in labelled) / len(labelled))  # padded to 16, averaged
    assert 0 < head_rows < B * S
    _rates_are_consistent(row, 3 * (FULL_ENCODER + head_rows * MLM_HEAD_PER_ROW))


def test_timed_window_excludes_warmup_and_profiled_steps(gc, monkeypatch):
    """Warm-up steps (compilation) and profiled steps are slow here on purpose: neither may reach the timed
    window, whose steps are exactly --steps; the step clips gradients every time, as the engine's does; the
    profile's GPU time and matmul time become per-step fractions of the unprofiled step."""
    calls, clips = [], []
    slow, late = {"on": True}, {"s": 0.0}
    real_forward, real_clip = gc.forward_loss, gc.torch.nn.utils.clip_grad_norm_
    # a slow step takes 100 s more on measure_one's clock (no real sleep: robust on a busy machine)
    monkeypatch.setattr(gc, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + late["s"]))

    def forward(model, b, objective):
        calls.append(slow["on"])
        if slow["on"]:
            late["s"] += 100.0
        return real_forward(model, b, objective)

    def clip(params, max_norm, *a, **k):
        clips.append(max_norm)
        return real_clip(params, max_norm, *a, **k)

    def fake_profile(step, batches, n, device, top=8):
        slow["on"] = True
        for i in range(n):
            step(batches[i % len(batches)])
        return {"profiled_steps": n, "gpu_kernel_ms_per_step": 4.0, "matmul_ms_per_step": 2.0}

    orig_sync = gc.measure.sync

    def sync(device):  # the sync that opens the timed window: from here on, steps are fast
        orig_sync(device)
        if len(calls) == 1:
            slow["on"] = False

    monkeypatch.setattr(gc, "forward_loss", forward)
    monkeypatch.setattr(gc.torch.nn.utils, "clip_grad_norm_", clip)
    monkeypatch.setattr(gc, "profile_steps", fake_profile)
    monkeypatch.setattr(gc.measure, "sync", sync)
    row, _ = _row(gc, "fp32", extra=["--steps", "3", "--profile-steps", "1"])
    assert calls == [True, False, False, False, True]  # 1 warm-up, 3 timed, 1 profiled
    assert clips == [1.0] * 5
    from precswitch.train import engine

    # the engine's optimizer and step (its clipping: fp32 norm of 16-bit grads), not a copy of them
    assert gc.train_step is engine.train_step and gc.build_optimizer is engine.build_optimizer
    assert row["warmup_steps"] == 1 and row["warmup_seconds"] >= 100
    assert row["steps_measured"] == 3 and row["seconds"] < 100, row["seconds"]
    step_s = row["seconds"] / 3
    assert row["step_seconds"] == pytest.approx(step_s)
    assert row["gpu_busy_fraction"] == pytest.approx(0.004 / step_s)
    assert row["matmul_share_of_step"] == pytest.approx(0.002 / step_s)
    assert row["matmul_tflops"] == pytest.approx(row["model_flops_per_step"] / 0.002 / 1e12)


def test_warmup_zero_is_kept(gc):
    assert gc.parse_args(["--warmup", "0"]).warmup == 0 and gc.parse_args([]).warmup == 10
    assert gc.parse_args(["--quick"]).warmup == 1


# ------------------------------------------------------------------ profile_steps on CUDA-like events
KERNELS = [  # (name, calls over 2 steps, GPU us): CUDA kernels as torch.profiler names them
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     20, 8000.0),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", 4, 2000.0),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t>, false>"
     "(Flash_fwd_params)", 4, 1000.0),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
     "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >",
     6, 600.0),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
     "(at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, bool*, bool*>", 2, 400.0),
    ("triton_poi_fused_add_gelu_native_dropout_3", 2, 200.0),
    ("Memset (Device)", 2, 40.0),
]


def _event(key, count, device_type, device_us=0.0, cpu_us=0.0):
    return types.SimpleNamespace(key=key, count=count, device_type=device_type, self_device_time_total=device_us,
                                 self_cuda_time_total=device_us, self_cpu_time_total=cpu_us)


def test_profile_steps_per_step_arithmetic_on_cuda_events(gc, monkeypatch):
    """profile_steps over 2 steps of a fake CUDA profile: counts and GPU times per step, host syncs without
    the final one, host-side ops ignored on CUDA (their time is launches, not work), kinds by kernel name."""
    import torch.profiler

    cuda_t, cpu_t = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    events = [_event(k, c, cuda_t, device_us=us) for k, c, us in KERNELS] + [
        _event("cudaStreamSynchronize", 3, cpu_t, cpu_us=50.0),
        _event("cudaDeviceSynchronize", 2, cpu_t, cpu_us=50.0),  # one of them: profile_steps' own final sync
        _event("cudaEventSynchronize", 0, cpu_t),
        _event("aten::_local_scalar_dense", 2, cpu_t, cpu_us=30.0),
        _event("aten::mm", 24, cpu_t, cpu_us=90_000.0),  # host-side op: launches
        _event("cudaLaunchKernel", 40, cpu_t, cpu_us=20_000.0),
    ]
    steps = []

    class FakeProfile:
        def __init__(self, activities):
            assert torch.profiler.ProfilerActivity.CUDA in activities

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def key_averages(self):
            return events

    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    monkeypatch.setattr(gc.measure, "sync", lambda device: None)
    res = gc.profile_steps(lambda b: steps.append(b), [{"i": 0}, {"i": 1}], 2, CUDA, top=3)
    assert steps == [{"i": 0}, {"i": 1}]
    assert res["profiled_steps"] == 2 and res["time_basis"] == "gpu_kernel_time"
    assert res["kernels_per_step"] == 20.0  # 40 kernels / 2 steps
    assert res["gpu_kernel_ms_per_step"] == pytest.approx(6.12)  # 12,240 us / 2
    assert res["host_syncs_per_step"] == 2.0  # (3 + 2 - 1) / 2
    assert res["host_item_calls_per_step"] == 1.0
    assert res["ms_per_step_by_kind"] == pytest.approx(
        {"matmul": 5.0, "attention": 0.5, "elementwise": 0.3, "optimizer": 0.2, "compiled": 0.1, "copy_cast": 0.02})
    assert list(res["ms_per_step_by_kind"]) == ["matmul", "attention", "elementwise", "optimizer", "compiled",
                                               "copy_cast"]  # most expensive first
    assert res["matmul_ms_per_step"] == pytest.approx(5.5)  # matmuls and attention
    top = res["top_kernels"]
    assert [(t["kind"], t["ms_per_step"], t["calls_per_step"]) for t in top] == [
        ("matmul", 4.0, 10.0), ("matmul", 1.0, 2.0), ("attention", 0.5, 2.0)]
    assert top[1]["name"].startswith("ampere_bf16_s16816gemm")


@pytest.mark.parametrize("name, kind", [
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", "matmul"),
    ("ampere_sgemm_128x64_tn", "matmul"),
    ("sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16_stage4_warpsize2x2x1_tensor16x8x8_kernel", "matmul"),
    ("void cutlass::Kernel<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x1_tn_align8>(Params)", "matmul"),
    ("flash_fwd_kernel", "attention"),
    ("void flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8>, true>", "attention"),
    ("triton_red_fused_native_layer_norm_0", "compiled"),
    ("triton_poi_fused_gelu_1", "compiled"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >",
     "copy_cast"),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>", "layer_norm"),
])
def test_kernel_kind_of_more_real_kernels(gc, name, kind):
    assert gc.kernel_kind(name) == kind


# ------------------------------------------------------------------ synthetic batches
def test_make_batches_shapes_ids_and_masks(gc):
    """batch x seq rows; no special-token ids (< 1000) in a real vocabulary; masked-LM labels are the
    original ids at the masked positions (each shown as id 4) and -100 elsewhere, ~15% masked and at least
    one per row; every batch different."""
    cfg = dict(gc.BASE)
    bs = gc.make_batches(cfg, 16, 64, True, CPU, n=3, engine_step=False)
    assert len(bs) == 3
    masked_total = 0
    for b in bs:
        ids, labels = b["input_ids"], b["labels"]
        assert ids.shape == labels.shape == b["attention_mask"].shape == b["token_type_ids"].shape == (16, 64)
        assert bool(b["attention_mask"].all()) and not bool(b["token_type_ids"].any())
        m = labels != -100
        assert bool((ids[m] == 4).all()) and bool((ids[~m] >= 1000).all()) and bool((ids < cfg["vocab_size"]).all())
        assert bool((labels[m] >= 1000).all()) and bool(m.any(dim=1).all())
        masked_total += int(m.sum())
    assert 0.12 < masked_total / (3 * 16 * 64) < 0.19
    assert not torch.equal(bs[0]["input_ids"], bs[1]["input_ids"])
    # short rows: at 15%, many 4-token rows would have no masked token (0.85^4 = 52%); each still has one
    short = gc.make_batches(cfg, 32, 4, True, CPU, n=1, engine_step=False)[0]
    assert bool((short["labels"] != -100).any(dim=1).all())
    cls = gc.make_batches(cfg, 5, 8, False, CPU, n=2, engine_step=False)
    assert cls[0]["input_ids"].shape == (5, 8) and cls[0]["labels"].shape == (5,)
    assert set(torch.cat([b["labels"] for b in cls]).tolist()) <= {0, 1}
    assert bool((cls[0]["input_ids"] >= 1000).all())


# ------------------------------------------------------------------ main: budget, JSON, exit code
def _run_main(gc, monkeypatch, tmp_path, rows_of, argv, clock=None):
    """main with measure_one faked by rows_of(name, variant) -> (row, seconds it takes); a fake clock."""
    clock = clock if clock is not None else {"t": 0.0}
    monkeypatch.setattr(gc, "time", types.SimpleNamespace(perf_counter=lambda: clock["t"]))
    monkeypatch.setattr(gc, "print_table", lambda res: None)
    seen = []
    out = tmp_path / "g.json"

    def fake_measure(name, variant, args, cfg, device, batches, peaks):
        seen.append(json.loads(out.read_text()) if out.exists() else None)
        row, took = rows_of(name, variant)
        clock["t"] += took
        return row

    monkeypatch.setattr(gc, "measure_one", fake_measure)
    rc = gc.main(["--device", "cpu", "--quick", "--no-slot", "--out", str(out), *argv])
    return rc, json.loads(out.read_text()), seen


def _timed(name, variant, warmup, seconds):
    return {**_ok(name, variant, 1.0), "warmup_seconds": warmup, "seconds": seconds}, warmup + seconds


@pytest.mark.parametrize("budget", [200, 215, 85, 220])
def test_budget_skips_compiled_rows_by_their_expected_cost(gc, monkeypatch, tmp_path, budget):
    """A compiled row starts only if the time used plus its expected cost fits the budget: 60 s before any
    compiled row ran, then the largest warm-up + timed seconds of one so far. Eager rows always run. Every
    skipped row is in the JSON with its reason.
    Eager rows 10 s each (t = 40 s after 4). Budget 200: amp_bf16 at 40 (+60 fits) takes 60 s; fp32 at 100
    (+60) takes 25; amp_fp16 at 125 (+60 = 185) takes 35; pure_bf16 at 160 (+60 = 220) is skipped.
    Budget 215: the same (pure_bf16's expected cost is amp_bf16's 50 s warm-up plus its 10 timed seconds: 220 s).
    Budget 85: the first compiled row, at 40 + 60 = 100 s, is already over: every compiled row is skipped.
    Budget 220: pure_bf16 is expected to end at 160 + 60 = 220 s, not after the budget: it runs too."""
    cost = {"amp_bf16": (50, 10), "fp32": (20, 5), "amp_fp16": (30, 5), "pure_bf16": (40, 5)}

    def rows_of(name, variant):
        return _timed(name, variant, 1, 9) if variant == "eager" else _timed(name, variant, *cost[name])

    rc, res, _ = _run_main(gc, monkeypatch, tmp_path, rows_of, ["--compile", "on", "--budget-seconds", str(budget),
                                                               "--precisions", "amp_bf16,fp32,amp_fp16,pure_bf16"])
    got = [(r["precision"], r["variant"], r["status"]) for r in res["results"]]
    names = ["amp_bf16", "fp32", "amp_fp16", "pure_bf16"]
    ran = 4 if budget >= 220 else 3 if budget > 100 else 0
    assert got == [(n, "eager", "ok") for n in names] + [
        (n, "compiled", "ok" if i < ran else "skipped") for i, n in enumerate(names)]
    skipped = [r for r in res["results"] if r["status"] == "skipped"]
    at = 160 if budget > 100 else 40
    assert all(r["reason"] == f"time budget: {at} s used of --budget-seconds {budget}" for r in skipped)
    assert rc == 0 and res["complete"] is True


def test_json_is_rewritten_after_every_row(gc, monkeypatch, tmp_path):
    def rows_of(name, variant):
        return _timed(name, variant, 1, 1)

    _, res, seen = _run_main(gc, monkeypatch, tmp_path, rows_of, ["--compile", "off", "--precisions", "fp32,amp_bf16,tf32"])
    assert seen[0] is None  # nothing written before the first row
    for k, partial in enumerate(seen[1:], start=1):  # before row k+1: the k rows so far, marked incomplete
        assert partial["complete"] is False and [r["precision"] for r in partial["results"]] == ["fp32", "amp_bf16"][:k]
        assert partial["checks"] and partial["schema"] == "precswitch-gpu-check/1"
    assert res["complete"] is True and len(res["results"]) == 3


@pytest.mark.parametrize("bf16_sps, bf16_mfu, want", [
    (30.0, 0.40, 0),   # 3.0x, 40%: both PASS
    (20.0, 0.40, 1),   # 2.0x: FAIL
    (30.0, 0.20, 1),   # 20%: FAIL
    (30.0, None, 0),   # no peak for this GPU: the MFU check is n/a, which is no failure
])
def test_exit_code_follows_the_verdicts_not_the_skipped_rows(gc, monkeypatch, tmp_path, bf16_sps, bf16_mfu, want):
    """On a GPU (checks_from told it is one), exit 1 only for a FAIL; skipped rows (tf32 unsupported, fp8
    without torchao) and n/a checks leave it 0."""
    real = gc.checks_from
    monkeypatch.setattr(gc, "checks_from", lambda rows, device: real(rows, CUDA))

    def rows_of(name, variant):
        if name in ("tf32", "fp8"):
            return {"precision": name, "variant": variant, "status": "skipped", "reason": f"{name}: unsupported"}, 0.0
        if name == "fp32":
            return _ok("fp32", variant, 10.0, 0.5), 1.0
        return _ok("amp_bf16", variant, bf16_sps, bf16_mfu), 1.0

    rc, res, _ = _run_main(gc, monkeypatch, tmp_path, rows_of, ["--compile", "off", "--precisions", "amp_bf16,fp32,tf32,fp8"])
    results = {c["name"]: c["result"] for c in res["checks"]}
    assert rc == want, results
    assert ("FAIL" in results.values()) == (want == 1)


def test_mfu_note_names_the_missing_row_not_the_peak_table(gc):
    """On a GPU with a known peak, an MFU check without an ok amp_bf16 row (it failed, e.g. out of memory at
    a large batch, or was skipped) says so; it used to blame the peak table ("no peak FLOP/s known")."""
    failed = {"precision": "amp_bf16", "variant": "compiled", "status": "failed", "reason": "OutOfMemoryError"}
    _, c = _checks(gc, [_ok("fp32", "eager", 10.0, 0.5), failed])
    assert c["mfu_amp_bf16"]["result"] == "FAIL"
    assert c["mfu_amp_bf16"]["note"] == "amp_bf16 (compiled) failed: OutOfMemoryError"
    _, c = _checks(gc, [_ok("fp32", "eager", 10.0, 0.5), {**failed, "status": "skipped", "reason": "time budget"}])
    assert c["mfu_amp_bf16"]["result"] == "n/a"
    assert c["mfu_amp_bf16"]["note"] == "no amp_bf16 row measured (skipped or not requested)"
    _, c = _checks(gc, [_ok("amp_bf16", "eager", 10.0, None)])  # measured, but no peak for this GPU
    assert "no peak FLOP/s known" in c["mfu_amp_bf16"]["note"]
    _, c = _checks(gc, [_ok("amp_bf16", "eager", 10.0, 0.4)])
    assert c["mfu_amp_bf16"]["note"] is None


# ------------------------------------------------------------------ mutation audit 2: main on a faked GPU, defaults
def _fake_gpu_main(gc, monkeypatch, tmp_path, argv, name="NVIDIA H200", rows_of=None):
    """main as on a CUDA machine (nothing of CUDA runs: the device's name, provenance, batches and the rows are
    faked; checks_from sees a CUDA device): (exit code, JSON, [(precision, variant, peaks, args)] measured,
    devices claimed)."""
    monkeypatch.setattr(gc.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gc.torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(gc.gpu, "gpu_provenance", lambda index=None: {"name": name})
    claimed = []
    monkeypatch.setattr(gc.gpu, "claim_device", lambda device: claimed.append(device) or device)
    monkeypatch.setattr(gc, "host_launch_us", lambda device: 8.0)
    monkeypatch.setattr(gc, "make_batches", lambda *a, **k: [])
    monkeypatch.setattr(gc, "print_table", lambda res: None)
    seen = []

    def fake_measure(prec, variant, args, cfg, device, batches, peaks):
        seen.append((prec, variant, dict(peaks), args))
        if rows_of is not None:
            return rows_of(prec, variant)
        return _ok(prec, variant, 10.0 if prec == "fp32" else 30.0, None)

    monkeypatch.setattr(gc, "measure_one", fake_measure)
    out = tmp_path / "g.json"
    rc = gc.main(["--out", str(out), *argv])
    return rc, json.loads(out.read_text()), seen, claimed


def test_on_a_gpu_main_runs_eager_then_compiled_rows_with_the_gpus_peaks(gc, monkeypatch, tmp_path):
    """On CUDA (--device auto) the default is eager rows then compiled rows (CUDA graphs), SDPA attention, a
    GPU slot claimed, and the peaks of the H200's row of the table, with --peak overriding one key; the JSON
    records them. A GPU without a row in the table gets the --peak figures only (no MFU without them)."""
    rc, res, seen, claimed = _fake_gpu_main(gc, monkeypatch, tmp_path,
                                            ["--precisions", "amp_bf16,fp32", "--peak", "bf16=989"])
    assert [(p, v) for p, v, _, _ in seen] == [("amp_bf16", "eager"), ("fp32", "eager"), ("amp_bf16", "compiled"),
                                              ("fp32", "compiled")]
    want = {"fp32": 67.0, "tf32": 395.0, "fp16": 790.0, "bf16": 989.0, "fp8": 1580.0}
    assert all(peaks == want for _, _, peaks, _ in seen)
    assert res["peaks_key"] == "H200" and res["peaks_used"] == want and res["device"] == "cuda"
    assert seen[0][3].attn == "sdpa" and res["attn_implementation"] == "sdpa"
    assert res["compile_mode"] == "reduce-overhead" and res["host_launch_us"] == 8.0
    assert [d.type for d in claimed] == ["cuda"]  # one timed job per GPU, also against a running study
    assert rc == 0  # 3x over fp32; no MFU figure from the fake rows: n/a, no failure
    rc, res, seen, claimed = _fake_gpu_main(gc, monkeypatch, tmp_path, ["--precisions", "amp_bf16", "--no-slot",
                                                                        "--compile", "off", "--peak", "bf16=300"],
                                            name="NVIDIA RTX 6000 Ada Generation")
    assert res["peaks_key"] is None and res["peaks_used"] == {"bf16": 300.0} and seen[0][2] == {"bf16": 300.0}
    assert [(p, v) for p, v, _, _ in seen] == [("amp_bf16", "eager")] and claimed == []
    _, res, seen, _ = _fake_gpu_main(gc, monkeypatch, tmp_path, ["--precisions", "amp_bf16", "--compile", "off"],
                                     name="NVIDIA RTX 6000 Ada Generation")
    assert res["peaks_used"] == {} and seen[0][2] == {}


def test_peaks_given_on_a_cpu_reach_the_rows(gc, monkeypatch, tmp_path):
    """A CPU has no row in the table, but --peak gives its figures (an MFU for a CPU run): they reach the rows and
    the JSON; without --peak there are none. On a CPU --compile auto means eager rows only."""
    seen = []

    def fake_measure(name, variant, args, cfg, device, batches, peaks):
        seen.append((name, variant, dict(peaks)))
        return _ok(name, variant, 1.0)

    monkeypatch.setattr(gc, "measure_one", fake_measure)
    monkeypatch.setattr(gc, "print_table", lambda res: None)
    out = tmp_path / "g.json"
    gc.main(["--device", "cpu", "--quick", "--precisions", "fp32", "--peak", "fp32=2.5", "--out", str(out)])
    assert seen == [("fp32", "eager", {"fp32": 2.5})]
    res = json.loads(out.read_text())
    assert res["peaks_used"] == {"fp32": 2.5} and res["peaks_key"] is None and res["attn_implementation"] == "eager"
    seen.clear()
    gc.main(["--device", "cpu", "--quick", "--precisions", "fp32", "--out", str(out)])
    assert seen == [("fp32", "eager", {})]


def test_compile_only_runs_the_compiled_rows_only(gc, monkeypatch, tmp_path):
    """--compile only (device_profile.sh's batch sweep) measures no eager row; --compile on measures both."""
    def rows_of(name, variant):
        return _timed(name, variant, 1, 1)

    _, res, _ = _run_main(gc, monkeypatch, tmp_path, rows_of, ["--compile", "only", "--precisions", "amp_bf16,fp32"])
    assert [(r["precision"], r["variant"]) for r in res["results"]] == [("amp_bf16", "compiled"), ("fp32", "compiled")]
    _, res, _ = _run_main(gc, monkeypatch, tmp_path, rows_of, ["--compile", "on", "--precisions", "fp32"])
    assert [(r["precision"], r["variant"]) for r in res["results"]] == [("fp32", "eager"), ("fp32", "compiled")]


def test_defaults_are_the_documented_ones(gc):
    """docs/gpu.md: 50 timed steps after 10 warm-up, batch 32 x 128, a 450 s budget for compiled rows, at least
    2 s timed where NVML energy is read, CUDA graphs, fused AdamW, the engine's step, eps 1e-8 (pure_fp16 1e-4);
    --quick: 3 steps after 1, batch 8 x 32."""
    a = gc.parse_args([])
    assert (a.steps, a.warmup, a.batch, a.seq) == (50, 10, 32, 128)
    assert (a.budget_seconds, a.min_seconds, a.compile, a.compile_mode) == (450.0, 2.0, "auto", "reduce-overhead")
    assert (a.fused, a.step, a.adam_eps, a.pure_fp16_eps, a.mlm, a.small) == ("auto", "engine", 1e-8, 1e-4, False, False)
    assert a.precisions.split(",") == gc.ORDER and gc.ORDER[:2] == ["amp_bf16", "fp32"]
    q = gc.parse_args(["--quick"])
    assert (q.steps, q.warmup, q.batch, q.seq) == (3, 1, 8, 32)


def test_device_cuda_without_a_gpu_is_an_error_naming_the_option(gc, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gc.torch.cuda, "is_available", lambda: False)
    out = tmp_path / "g.json"
    assert gc.main(["--device", "cuda:1", "--out", str(out)]) == 2
    assert "--device cuda:1 but no CUDA GPU is visible" in capsys.readouterr().err and not out.exists()


def test_the_row_uses_fused_adamw_and_reports_the_last_timed_loss(gc, monkeypatch):
    """fused_adamw in a row is what its optimizer ran (--fused off: foreach), and final_loss is the loss of the
    last timed step, not of the first or of a warm-up step."""
    made, k = [], {"n": 0}
    real_adamw, real_forward = gc.torch.optim.AdamW, gc.forward_loss

    def adamw(*a, **kw):
        made.append({x: kw.get(x) for x in ("fused", "foreach", "eps")})
        return real_adamw(*a, **kw)

    def forward(model, b, objective):  # the real loss's graph, shifted to a known value: 1.0, 2.0, ...
        k["n"] += 1
        loss = real_forward(model, b, objective)
        return loss - loss.detach() + float(k["n"])

    monkeypatch.setattr(gc.torch.optim, "AdamW", adamw)
    monkeypatch.setattr(gc, "forward_loss", forward)
    row, _ = _row(gc, "fp32", extra=["--steps", "3"])  # 1 warm-up step + 3 timed
    assert made == [{"fused": True, "foreach": None, "eps": 1e-8}] and row["fused_adamw"] is True
    assert row["final_loss"] == 4.0 and row["loss_finite"] is True
    made.clear()
    k["n"] = 0
    row, _ = _row(gc, "pure_fp16", extra=["--fused", "off"])
    assert made == [{"fused": None, "foreach": True, "eps": 1e-4}] and row["fused_adamw"] is False
    assert row["final_loss"] == 3.0  # 1 warm-up + 2 timed
    # the allocator's peak and the reserved peak, each in its own field (as measure.peak_memory reads CUDA's)
    monkeypatch.setattr(gc.measure, "peak_memory", lambda device: {
        "peak_memory_bytes": 100, "memory_kind": "cuda_max_allocated", "cuda_max_reserved_bytes": 300})
    row, _ = _row(gc, "fp32")
    assert (row["peak_memory_bytes"], row["peak_reserved_bytes"], row["memory_kind"]) == (100, 300, "cuda_max_allocated")


def test_mfu_check_without_a_peak_is_na_even_if_another_amp_bf16_row_failed(gc):
    """amp_bf16 ran (compiled) on a GPU without a peak figure while its eager row ran out of memory: the MFU
    check is n/a for want of a peak (the row it needs did run), not a failure; and a compiled fp32 row that
    failed does not fail the speed-up when the eager rows decide it and amp_bf16 was skipped."""
    oom = {"precision": "amp_bf16", "variant": "eager", "status": "failed", "reason": "OutOfMemoryError"}
    _, c = _checks(gc, [_ok("fp32", "eager", 10.0), oom, _ok("amp_bf16", "compiled", 50.0, None)])
    assert c["mfu_amp_bf16"]["result"] == "n/a" and "no peak FLOP/s known" in c["mfu_amp_bf16"]["note"]


@pytest.mark.parametrize("argv, message", [
    (["--peak", "bf61=989"], "--peak 'bf61=989': unknown key 'bf61'; allowed: fp32, tf32, fp16, bf16, fp8"),
    (["--peak", "bf16"], "--peak 'bf16': expected KEY=TFLOPS, e.g. --peak bf16=989"),
    (["--peak", "bf16=fast"], "--peak 'bf16=fast': bf16's peak must be a positive number of TFLOP/s"),
    (["--peak", "fp32=0"], "--peak 'fp32=0': fp32's peak must be a positive number of TFLOP/s"),
    (["--precisions", "fp32,amp_bf61"], "--precisions: unknown precision 'amp_bf61' (did you mean"),
])
def test_bad_peak_or_precision_is_one_line_exit_2_before_anything_runs(gc, monkeypatch, tmp_path, capsys, argv, message):
    """A --peak key outside the table was accepted and ignored (`--peak bf61=989` left bf16's MFU against 790 on a
    GPU, silently), a --peak without '=' or with a word for its value ended in a traceback, and so did an unknown
    --precisions name; each is now one line naming the option, exit 2, before a GPU slot, a model or the JSON."""
    monkeypatch.setattr(gc, "measure_one", lambda *a, **k: pytest.fail("measured despite a bad option"))
    monkeypatch.setattr(gc.gpu, "claim_device", lambda device: pytest.fail("claimed a GPU despite a bad option"))
    out = tmp_path / "g.json"
    assert gc.main(["--device", "cpu", "--quick", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpu_check: error: {message}") and err.count("\n") == 1 and not out.exists()
    assert gc.parse_peaks(["bf16=989", "fp8=1979.5"]) == {"bf16": 989.0, "fp8": 1979.5}


@pytest.mark.parametrize("name, param, autocast, scaled, compensation", [
    ("fp32", torch.float32, None, False, None),
    ("amp_bf16", torch.float32, torch.bfloat16, False, None),
    ("amp_fp16", torch.float32, torch.float16, True, None),
    ("pure_bf16", torch.bfloat16, None, False, None),
    ("pure_bf16_kahan", torch.bfloat16, None, False, "kahan"),
])
def test_each_row_trains_in_its_own_precision(gc, monkeypatch, name, param, autocast, scaled, compensation):
    """A row's steps run the study's code of its precision: the weights in its dtype, the forward under its autocast,
    fresh gradients every step, a loss scaler's gradients unscaled before clipping at 1.0 (the engine's order: clipping scaled gradients would
    clip nearly every step), the update compensation of the compensated pure-bf16 variants; the row records the
    backend flags (TF32 off)."""
    import precswitch.optim
    from precswitch.train.engine import step as engine

    seen, norms, wrapped = [], [], []
    real_forward, real_clip, real_wrap = gc.forward_loss, engine.clip_grad_norm, precswitch.optim.wrap_optimizer

    def forward(model, b, objective):
        on = torch.is_autocast_enabled("cpu")
        seen.append((next(model.parameters()).dtype, torch.get_autocast_dtype("cpu") if on else None,
                     all(p.grad is None for p in model.parameters())))  # each step's gradients are its own
        return real_forward(model, b, objective)

    def clip(params, max_norm):
        params = list(params)
        norms.append(float(torch.linalg.vector_norm(torch.stack([p.grad.float().norm() for p in params]))))
        return real_clip(params, max_norm)

    def wrap(kind, optimizer, seed):
        wrapped.append(kind)
        return real_wrap(kind, optimizer, seed=seed)

    monkeypatch.setattr(gc, "forward_loss", forward)
    monkeypatch.setattr(engine, "clip_grad_norm", clip)  # train_step's
    monkeypatch.setattr(precswitch.optim, "wrap_optimizer", wrap)
    row, _ = _row(gc, name)
    assert set(seen) == {(param, autocast, True)}
    assert (row["loss_scale_end"] is not None) == scaled
    assert len(norms) == 3 and max(norms) < 1e3, norms  # a scale of 65536 would multiply them by that much
    assert wrapped == ([compensation] if compensation else [])
    assert row["tf32_matmul"] is False
    assert row["adam_eps"] == 1e-8  # pure_fp16 alone gets 1e-4 (amp_fp16's fp32 master weights and moments need not)


def test_printed_table_shows_mfu_and_the_checks_in_percent(gc, capsys):
    """What a lent GPU's run prints: MFU in percent in each row and in the MFU check, the speed-up as a ratio."""
    rows = [{**_ok("fp32", "eager", 10.0, 0.5), "peak_tflops": 67.0},
            {**_ok("amp_bf16", "eager", 30.0, 0.355), "peak_tflops": 790.0}]
    ratios, checks = gc.checks_from(rows, CUDA)
    gc.print_table({"device_name": "NVIDIA H200", "device": "cuda", "objective": "classify", "batch": 32, "seq_len": 128,
                    "steps": 50, "warmup": 10, "min_seconds": 2.0, "results": rows, "ratios": ratios, "checks": checks,
                    "host_launch_us": None, "peaks_key": "H200", "peaks_used": {"bf16": 790.0}})
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith(("fp32 ", "amp_bf16 "))}
    assert lines["fp32"][3:4] == ["10.00"] and "50.0" in lines["fp32"] and "35.5" in lines["amp_bf16"]
    assert "amp_bf16/fp32 (eager)        3.00x" in out
    assert [ln.split()[:2] + ln.split()[-1:] for ln in out.splitlines() if ln.strip().startswith(("speedup_", "mfu_"))] == [
        ["speedup_amp_bf16_over_fp32", "3.00x", "PASS"], ["mfu_amp_bf16", "35.5%", "PASS"]]


# ------------------------------------------------------------------ mutation audit 6 (gpu_check/flops/fp8)
def test_mfu_check_takes_amp_bf16s_best_row_whichever_variant_ran_last(gc):
    """The compiled row comes after the eager one; where it reaches the lower MFU (CUDA graphs do not always pay),
    the check is still amp_bf16's best figure, the eager row's."""
    _, c = _checks(gc, [_ok("fp32", "eager", 10.0), _ok("amp_bf16", "eager", 30.0, 0.4),
                        _ok("fp32", "compiled", 10.0), _ok("amp_bf16", "compiled", 28.0, 0.3)])
    assert c["mfu_amp_bf16"]["value"] == 0.4 and c["mfu_amp_bf16"]["result"] == "PASS"
    assert c["speedup_amp_bf16_over_fp32"]["variant"] == "compiled" and c["speedup_amp_bf16_over_fp32"]["value"] == 2.8


def test_a_failed_row_of_the_other_variant_leaves_the_speedup_check_alone(gc):
    """The speed-up compares one variant (compiled when fp32 and amp_bf16 both ran compiled, else eager): a failed
    row of the other variant is not a row it needs. Here fp32's compiled row failed, so the eager rows decide, and
    amp_bf16's eager row was skipped: n/a, not FAIL; a failed eager fp32 row would fail it."""
    failed = {"precision": "fp32", "variant": "compiled", "status": "failed", "reason": "RuntimeError: compile"}
    skipped = {"precision": "amp_bf16", "variant": "eager", "status": "skipped", "reason": "time budget"}
    rows = [_ok("fp32", "eager", 10.0), skipped, failed, _ok("amp_bf16", "compiled", 40.0, 0.4)]
    _, c = _checks(gc, rows)
    speed = c["speedup_amp_bf16_over_fp32"]
    assert (speed["variant"], speed["value"], speed["result"], speed["note"]) == ("eager", None, "n/a", None)
    rows[0] = {**failed, "variant": "eager"}
    _, c = _checks(gc, rows)
    assert c["speedup_amp_bf16_over_fp32"]["result"] == "FAIL"
    assert c["speedup_amp_bf16_over_fp32"]["note"] == "fp32 (eager) failed: RuntimeError: compile"


def test_fp8_row_counts_the_full_model_against_the_fp8_peak(gc, monkeypatch):
    """An fp8 row keeps the full last layer (as the engine does: its fp8 GEMMs need the full shapes), so its FLOPs
    are the stock classification step's, and its MFU is against the fp8 peak. (No fp8 on a CPU: the row runs
    amp_bf16's code under a precision marked fp8_linear, with the device and torchao checks and torchao's conversion
    faked.)"""
    import dataclasses

    from precswitch import precision as P

    fake = dataclasses.replace(P.get("amp_bf16"), fp8_linear=True)
    monkeypatch.setattr(gc.P, "get", lambda name: fake)
    monkeypatch.setattr(gc.P, "check_supported", lambda prec, device: None)
    monkeypatch.setattr(gc, "fp8_import_problem", lambda: None)
    import precswitch.fp8

    monkeypatch.setattr(precswitch.fp8, "convert_model_to_fp8", lambda model: model)  # no torchao here
    calls = []
    monkeypatch.setattr(gc, "cls_only_last_layer", lambda model: calls.append(model) or True)
    row, _ = _row(gc, "fp8", peaks={"bf16": 0.005, "fp8": 0.01})
    assert calls == []
    _rates_are_consistent(row, 3 * (FULL_ENCODER + CLS_HEAD))
    assert row["peak_key"] == "fp8" and row["peak_tflops"] == 0.01
    assert row["mfu"] == pytest.approx(row["achieved_tflops"] / 0.01)


def test_printed_table_units_memory_energy_and_profile(gc, capsys):
    """The table's units: memory in GiB (2**30 bytes), energy in J per step, tokens/s, achieved TFLOP/s; the
    profile's step in ms, GPU time in ms and GPU-busy in percent."""
    row = {**_ok("amp_bf16", "eager", 20.0, 0.1), "peak_tflops": 790.0, "tokens_per_second": 81920.0,
           "achieved_tflops": 79.0, "peak_memory_bytes": 3 * 2**30, "peak_reserved_bytes": 2**31,
           "energy_joules_per_step": 8.25, "profiled_steps": 2, "step_seconds": 0.05, "gpu_kernel_ms_per_step": 12.5,
           "gpu_busy_fraction": 0.25, "kernels_per_step": 1200.0, "host_syncs_per_step": 1.0}
    ratios, checks = gc.checks_from([row], CUDA)
    gc.print_table({"device_name": "NVIDIA H200", "device": "cuda", "objective": "classify", "batch": 32, "seq_len": 128,
                    "steps": 50, "warmup": 10, "min_seconds": 2.0, "results": [row], "ratios": ratios, "checks": checks,
                    "host_launch_us": 8.0, "peaks_key": "H200", "peaks_used": {"bf16": 790.0}})
    out = capsys.readouterr().out.splitlines()
    main = next(ln.split() for ln in out if ln.startswith("amp_bf16 "))
    assert main[2:11] == ["ok", "20.00", "81920", "79.00", "790", "10.0", "3.00", "2.00", "8.25"]
    prof = next(ln.split() for ln in out if ln.strip().startswith("amp_bf16 ") and not ln.startswith("amp_bf16"))
    assert prof[2:7] == ["50.00", "12.50", "25%", "1200", "1.0"]


def test_peak_table_matches_a_gpu_name_in_any_case_and_refuses_an_infinite_peak(gc):
    assert gc.find_peaks("nvidia h100 80gb hbm3", {})[0] == "H100"
    # lower-clocked boards of the same chips: the SXM row would understate their MFU; --peak still applies
    for board in ("NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL"):
        assert gc.find_peaks(board, {}) == (None, {}), board
        assert gc.find_peaks(board, {"bf16": 756.0}) == (None, {"bf16": 756.0}), board
    with pytest.raises(ValueError, match=r"--peak 'bf16=inf': bf16's peak must be a positive number"):
        gc.parse_peaks(["bf16=inf"])


def test_the_json_records_the_shapes_gpu_hours_keys_its_step_times_on(gc, monkeypatch, tmp_path):
    """gpu_hours reads each eager row's step time under the JSON's objective, batch, sequence length and model
    shape: a run at batch 5 x 24, masked LM, is found there (and nowhere else)."""
    from bench_helpers import load_benchmark

    def rows_of(name, variant):
        return {**_ok(name, variant, 4.0), "step_seconds": 0.25}

    _, res, _, _ = _fake_gpu_main(gc, monkeypatch, tmp_path, ["--quick", "--compile", "off", "--precisions", "fp32",
                                                              "--batch", "5", "--seq", "24", "--mlm"], rows_of=rows_of)
    assert (res["device"], res["objective"], res["batch"], res["seq_len"], res["model"], res["step"]) == (
        "cuda", "mlm", 5, 24, gc.QUICK, "engine")
    meas = load_benchmark("gpu_hours").load_measurements([tmp_path / "g.json"])
    assert dict(meas) == {("mlm", "fp32", 5, 24, gc.QUICK["num_hidden_layers"], gc.QUICK["hidden_size"]): [0.25]}


# ------------------------------------------------------------------ count_ops (gpu_hours.py --extrapolate)
def test_count_ops_grows_by_one_layers_ops_per_layer_and_ignores_widths_batch_and_length(gc):
    """An eager step's aten ops: the same number more for each added layer; the same count at any width, batch
    and sequence length (what lets gpu_hours count a narrowed copy); autocast's casts add ops; tf32 is fp32's step."""
    tiny = dict(gc.QUICK, num_hidden_layers=1)
    c = {n: gc.count_ops({**tiny, "num_hidden_layers": n}, "fp32", mlm=True) for n in (1, 2, 3)}
    assert c[3] - c[2] == c[2] - c[1] > 20  # a layer: its matmuls, norms, dropouts, adds, their backward
    wide = {**tiny, "num_hidden_layers": 2, "hidden_size": 96, "num_attention_heads": 3, "intermediate_size": 200}
    assert gc.count_ops(wide, "fp32", mlm=True, batch=3, seq=24, width=None) == c[2]
    assert gc.count_ops({**tiny, "num_hidden_layers": 2}, "fp32", mlm=True, width=None) == c[2]
    amp = gc.count_ops({**tiny, "num_hidden_layers": 2}, "amp_bf16", mlm=True)
    assert amp > c[2]  # autocast's casts
    assert gc.count_ops({**tiny, "num_hidden_layers": 2}, "tf32", mlm=True) == c[2]
    with pytest.raises(gc.PrecswitchError, match="fp8"):
        gc.count_ops(tiny, "fp8", mlm=True)
