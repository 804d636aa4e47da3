"""benchmarks/gpu_check.py: the logic that decides what a borrowed GPU's run reports, checked on a CPU with
hand-built inputs and hand-computed expectations. The summary and verdicts (checks_from),
the figures of a timed row (FLOPs, MFU against the right peak, tokens/s), the timed window (warm-up and
profiled steps outside it), the profiler's per-step arithmetic on CUDA-like events, the synthetic batches,
the time budget, the JSON written after every row and the exit code. Nothing here needs a GPU."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_helpers import load_benchmark  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
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


# ------------------------------------------------------------------ one timed row: figures
# QUICK model: hidden h 64, FFN f 256, 2 layers, vocab V 1000, 2 labels; batch 3 x seq 16 (48 tokens).
# Forward matmul FLOPs per token per layer: 8h^2 + 4hf + 4sh = 32768 + 65536 + 4096 = 102400.
B, S = 3, 16
FULL_ENCODER = 48 * 2 * 102_400  # 9,830,400
# the engine's classification step: layer 2 computes K, V for all 48 tokens (2 x 2h^2 each) and the rest
# for [CLS] only: Q 2h^2 + scores 2sh + sum 2sh + out 2h^2 + FFN 4hf = 8192 + 2048 + 2048 + 8192 + 65536
CLS_ENCODER = 48 * 102_400 + 48 * 2 * 8192 + B * 86_016  # 5,959,680
CLS_HEAD = B * (2 * 64 * 64 + 2 * 64 * 2)  # pooler + classifier on [CLS]: 25,344


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


def test_device_cuda_without_a_gpu_is_an_error_naming_the_option(gc, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gc.torch.cuda, "is_available", lambda: False)
    out = tmp_path / "g.json"
    assert gc.main(["--device", "cuda:1", "--out", str(out)]) == 2
    assert "--device cuda:1 but no CUDA GPU is visible" in capsys.readouterr().err and not out.exists()


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


# ------------------------------------------------------------------ the script on a CPU


def test_gpu_check_cpu_smoke(tmp_path):
    """The script as a lent GPU runs it, on the CPU: a row per precision asked for (the GPU-only ones skipped
    with their reason), the figures of each, no PASS/FAIL, and the profiled time by kind of op. Four
    precisions, not all nine: a 16-bit step is emulated on an AVX2 CPU (minutes for all of them)."""
    out = tmp_path / "gpu_check.json"
    cmd = [str(ROOT / "benchmarks" / "gpu_check"), "--device", "cpu", "--steps", "3", "--quick", "--out", str(out),
           "--precisions", "fp32,amp_bf16,pure_fp16,tf32,fp8", "--mlm", "--profile-steps", "1"]
    env = {**os.environ, "PYTHON": sys.executable}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["objective"] == "mlm"
    by = {row["precision"]: row for row in res["results"]}
    assert set(by) == {"fp32", "amp_bf16", "pure_fp16", "tf32", "fp8"}
    assert by["tf32"]["status"] == "skipped" and "tf32" in by["tf32"]["reason"]
    assert by["fp8"]["status"] == "skipped" and "fp8" in by["fp8"]["reason"]
    assert by["pure_fp16"]["adam_eps"] == 1e-4
    for name in ("fp32", "amp_bf16", "pure_fp16"):
        row = by[name]
        assert row["status"] == "ok", row
        assert row["steps_measured"] == 3
        assert row["steps_per_second"] > 0 and row["tokens_per_second"] > 0
        assert row["model_flops_per_step"] > 0 and row["achieved_tflops"] > 0
        assert row["mfu"] is None  # no peak for a CPU
        assert row["peak_memory_bytes"] > 0
    checks = {c["name"]: c for c in res["checks"]}
    assert checks["speedup_amp_bf16_over_fp32"]["value"] > 0
    assert checks["mfu_amp_bf16"]["result"] == "n/a"
    assert "speedup_amp_bf16_over_fp32" in r.stdout and "n/a" in r.stdout  # no PASS/FAIL on a CPU
    assert res["peaks_table"]["H200"]["bf16"] == 790
    assert res["complete"] is True and "gpu_check: fp32 (eager): ok" in r.stderr  # rows reported as they finish
    assert by["pure_fp16"]["loss_scale_end"] == 32768.0  # fp16 loss: the scale never exceeds 2**15
    assert res["host_launch_us"] is None  # a CUDA-launch figure
    # profiled: no kernels on a CPU, so no GPU-busy fraction either
    assert by["fp32"]["profiled_steps"] == 1 and by["fp32"]["kernels_per_step"] == 0
    assert "gpu_busy_fraction" not in by["fp32"] and "where a step's time goes" in r.stdout
    # where the time goes on a CPU: the aten ops' own time, by kind, adding up to the matmul figure
    for name in ("fp32", "amp_bf16"):
        row = by[name]
        kinds = row["ms_per_step_by_kind"]
        assert row["time_basis"] == "cpu_op_self_time"
        assert {"matmul", "optimizer", "layer_norm", "softmax_ce", "dropout"} <= set(kinds), kinds
        assert row["matmul_ms_per_step"] == pytest.approx(kinds["matmul"] + kinds.get("attention", 0.0))
        # against the unprofiled step: on a CPU the profiler's own cost can push it past 1
        assert row["matmul_share_of_step"] == pytest.approx(row["matmul_ms_per_step"] / 1000 / row["step_seconds"])
        assert row["matmul_tflops"] == pytest.approx(
            row["model_flops_per_step"] / (row["matmul_ms_per_step"] / 1000) / 1e12)
        assert all(v >= 0 for v in kinds.values()) and row["matmul_ms_per_step"] < sum(kinds.values())
        top = row["top_kernels"]
        assert top and top[0]["ms_per_step"] >= top[-1]["ms_per_step"]
    assert "_fused_adamw_" in {t["name"].split("::")[-1] for t in by["fp32"]["top_kernels"]} or \
        by["fp32"]["ms_per_step_by_kind"]["optimizer"] > 0
    assert "copy_cast" in by["amp_bf16"]["ms_per_step_by_kind"]  # autocast's weight casts
    assert "CPU time of aten ops by kind" in r.stdout and "matmul TFLOP/s" in r.stdout


@pytest.mark.parametrize("name, kind", [
    # CUDA kernels as torch.profiler names them, and aten ops on a CPU
    ("nvjet_hsh_192x192_64x4_2x1_v_bz_coopA_TNN", "matmul"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t>, "
     "false, false>(pytorch_flash::Flash_fwd_params)", "attention"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
     "(at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, bool*, bool*>", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)"
     "::{lambda()#1}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >", "copy_cast"),
    # a mixed-dtype add under autocast is no cast kernel, though its helpers' names say "cast"
    ("void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>, "
     "TrivialOffsetCalculator<2, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
     "at::native::memory::LoadWithCast<2>, at::native::memory::StoreWithCast<1>>", "elementwise"),
    ("void at::native::(anonymous namespace)::masked_scale_kernel<c10::BFloat16, float, bool>", "dropout"),
    ("triton_poi_fused__scaled_dot_product_efficient_attention_add_5", "compiled"),
    ("triton_tem_fused_addmm_0", "matmul"),
    ("aten::addmm", "matmul"), ("aten::_fused_adamw_", "optimizer"), ("aten::view", "views_alloc"),
    ("aten::isneginf", "other"),
])
def test_gpu_check_kernel_kind(name, kind):
    """kernel_kind reads what a kernel (or CPU op) does from its name; "lambda" in a template is no optimizer."""
    assert load_benchmark("gpu_check").kernel_kind(name) == kind


def test_gpu_check_times_at_least_min_seconds_where_energy_is_read(monkeypatch):
    """amp_bf16 with CUDA graphs ran its 50 timed steps in 0.5 s on the H200: too short a window for NVML's
    energy counter. Where energy is read, a row times at least --min-seconds of steps (more than --steps),
    and its per-step figures divide by the steps it really timed."""
    gc = load_benchmark("gpu_check")
    dev = gc.torch.device("cpu")
    # a virtual clock: every step takes 0.125 s on it, whatever this machine's load (a real clock made the
    # test fail on a busy CPU, where 2 steps already took over --min-seconds)
    clock = {"t": 0.0}
    real_forward = gc.forward_loss

    def forward(model, b, objective):
        clock["t"] += 0.125
        return real_forward(model, b, objective)

    monkeypatch.setattr(gc, "forward_loss", forward)
    monkeypatch.setattr(gc, "time", types.SimpleNamespace(perf_counter=lambda: clock["t"]))
    # an energy counter on the CPU, as NVML on a GPU: 1 W, in mJ
    monkeypatch.setattr(gc.measure, "nvml_energy_mj", lambda device: int(clock["t"] * 1000))
    args = gc.parse_args(["--device", "cpu", "--quick", "--steps", "2", "--warmup", "1", "--min-seconds", "0.5"])
    batches = gc.make_batches(gc.QUICK, args.batch, args.seq, args.mlm, dev, engine_step=True)
    row = gc.measure_one("fp32", "eager", args, gc.QUICK, dev, batches, {})
    assert row["status"] == "ok", row
    n = row["steps_measured"]
    assert n == 4 and row["seconds"] == 0.5 and row["energy_window_seconds"] == row["seconds"]  # 4 x 0.125 s
    assert row["warmup_seconds"] == 0.125  # the warm-up step, outside the window
    assert row["steps_per_second"] == 8.0 and row["step_seconds"] == 0.125
    assert row["energy_joules_per_step"] == pytest.approx(0.125)  # 1 W x 0.5 s / 4 steps
    # no energy counter (a CPU, a GPU without NVML): exactly --steps steps
    monkeypatch.setattr(gc.measure, "nvml_energy_mj", lambda device: None)
    row = gc.measure_one("fp32", "eager", args, gc.QUICK, dev, batches, {})
    assert row["steps_measured"] == 2 and row["energy_joules_per_step"] is None


@pytest.mark.parametrize("script", ["lease/gpu_lease.sh", "gpu_check"])
def test_device_scripts_parse(script):
    """bash -n of every shell script of the GPU check: a syntax error would cost a lent GPU's time."""
    r = subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_count_ops_grows_by_one_layers_ops_per_layer_and_ignores_widths_batch_and_length(gc):
    """An eager step's aten ops: the same number more for each added layer; the same count at any width, batch
    and sequence length (what lets gpu_hours count a narrowed copy)."""
    tiny = dict(gc.QUICK, num_hidden_layers=1)
    c = {n: gc.count_ops({**tiny, "num_hidden_layers": n}, "fp32", mlm=True) for n in (1, 2, 3)}
    assert c[3] - c[2] == c[2] - c[1] > 20  # a layer: its matmuls, norms, dropouts, adds, their backward
    wide = {**tiny, "num_hidden_layers": 2, "hidden_size": 96, "num_attention_heads": 3, "intermediate_size": 200}
    assert gc.count_ops(wide, "fp32", mlm=True, batch=3, seq=24, width=None) == c[2]
    with pytest.raises(gc.PrecswitchError, match="fp8"):
        gc.count_ops(tiny, "fp8", mlm=True)

