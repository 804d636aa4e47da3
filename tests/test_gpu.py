"""GPU slot logic (faked device counts, real processes and real flocks), provenance, and the
gpu_check benchmark smoke-tested on CPU. Nothing here needs a GPU."""

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from precswitch import gpu
from precswitch.errors import PrecswitchError

sys.path.insert(0, str(Path(__file__).parent))
from bench_helpers import load_benchmark  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CTX = mp.get_context("fork")


def _hold(lock_dir, n, got, release, env=None, timeout=20.0):
    """Child: take a slot, report (index, time), hold it until `release` is set."""
    if env:
        os.environ.update(env)
    with gpu.acquire_gpu_slot(lock_dir, n_devices=n, timeout=timeout, poll=0.05) as i:
        got.put((i, time.monotonic()))
        release.wait(30)
        got.put(("released", time.monotonic()))


def _hold_forever(lock_dir, n, got):
    with gpu.acquire_gpu_slot(lock_dir, n_devices=n, timeout=20, poll=0.05) as i:
        got.put(i)
        time.sleep(300)


@pytest.fixture
def no_cvd(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_two_gpus_two_processes_get_different_indices(tmp_path, no_cvd):
    got, release = CTX.Queue(), CTX.Event()
    procs = [CTX.Process(target=_hold, args=(tmp_path, 2, got, release)) for _ in range(2)]
    for p in procs:
        p.start()
    try:
        first = [got.get(timeout=30) for _ in range(2)]  # both hold at the same time
        assert sorted(i for i, _ in first) == [0, 1]
    finally:
        release.set()
        for p in procs:
            p.join(30)
    assert all(p.exitcode == 0 for p in procs)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["gpu-0.lock", "gpu-1.lock"]


def test_one_gpu_second_waits_until_first_releases(tmp_path, no_cvd):
    q1, q2, r1, r2 = CTX.Queue(), CTX.Queue(), CTX.Event(), CTX.Event()
    a = CTX.Process(target=_hold, args=(tmp_path, 1, q1, r1))
    a.start()
    try:
        idx_a, _ = q1.get(timeout=30)
        b = CTX.Process(target=_hold, args=(tmp_path, 1, q2, r2))
        b.start()
        time.sleep(1.0)
        assert q2.empty(), "second process got the only GPU while the first still held it"
        r1.set()
        _, released_at = q1.get(timeout=30)
        idx_b, got_at = q2.get(timeout=30)
        assert idx_a == idx_b == 0
        assert got_at >= released_at
        r2.set()
        b.join(30)
        assert b.exitcode == 0
    finally:
        r1.set()
        r2.set()
        a.join(30)


def test_a_job_waiting_for_a_gpu_says_so_once_naming_the_holder(tmp_path, no_cvd, monkeypatch, capsys):
    """A job queued behind another's GPU lock used to wait without a word in its log."""
    q = CTX.Queue()
    a = CTX.Process(target=_hold_forever, args=(tmp_path, 1, q))
    a.start()
    try:
        assert q.get(timeout=30) == 0
        monkeypatch.setattr(gpu, "WAIT_NOTICE_S", 0.1)
        with pytest.raises(gpu.GpuSlotTimeout):
            with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=0.5, poll=0.05):
                pass
        err = capsys.readouterr().err
        assert err.count("precswitch: waiting for a free GPU") == 1 and f"gpu-0: pid={a.pid} host=" in err, err
    finally:
        os.kill(a.pid, signal.SIGKILL)
        a.join(30)


def test_killed_holder_frees_its_slot(tmp_path, no_cvd):
    q = CTX.Queue()
    a = CTX.Process(target=_hold_forever, args=(tmp_path, 1, q))
    a.start()
    assert q.get(timeout=30) == 0
    with pytest.raises(gpu.GpuSlotTimeout, match="no free GPU slot"):
        with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=0.3, poll=0.05):
            pass
    os.kill(a.pid, signal.SIGKILL)  # crash: no cleanup code runs
    a.join(30)
    t0 = time.monotonic()
    with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=10, poll=0.05) as i:
        assert i == 0
    assert time.monotonic() - t0 < 5


def test_in_process_nesting_and_release(tmp_path, no_cvd):
    with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=1) as a:
        with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=1) as b:
            assert (a, b) == (0, 1)
            with pytest.raises(gpu.GpuSlotTimeout):
                with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=0.2, poll=0.05):
                    pass
        # released: index 1 is free again; indices= restricts the candidates
        with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=1, indices=[1]) as c:
            assert c == 1
    assert "pid=" in (tmp_path / "gpu-0.lock").read_text()


def test_cuda_visible_devices_names_physical_gpus(tmp_path, monkeypatch):
    # this process sees physical GPUs 3 and 1 as cuda:0 and cuda:1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert gpu.visible_device_ids(2) == ["3", "1"]
    with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=1) as i:
        assert i == 0 and (tmp_path / "gpu-3.lock").exists()
        # another job that sees only physical GPU 3 (as its cuda:0) must wait ...
        q, r = CTX.Queue(), CTX.Event()
        p = CTX.Process(target=_hold, args=(tmp_path, 1, q, r, {"CUDA_VISIBLE_DEVICES": "3"}, 0.5))
        p.start()
        p.join(30)
        assert p.exitcode != 0 and q.empty()  # timed out
        # ... one that sees only physical GPU 1 gets it, as its index 0
        q, r = CTX.Queue(), CTX.Event()
        p = CTX.Process(target=_hold, args=(tmp_path, 1, q, r, {"CUDA_VISIBLE_DEVICES": "1"}, 5))
        p.start()
        assert q.get(timeout=30)[0] == 0
        r.set()
        p.join(30)
        assert p.exitcode == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f1c2d3e-aaaa-bbbb-cccc-0123456789ab")
    assert gpu.visible_device_ids(1) == ["GPU-8f1c2d3e-aaaa-bbbb-cccc-0123456789ab"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-GPU-8f1c2d3e/1/0")
    assert gpu.visible_device_ids(2) == ["MIG-GPU-8f1c2d3e_1_0", "1"]


def test_errors_and_defaults(tmp_path, monkeypatch):
    with pytest.raises(PrecswitchError, match="no CUDA device is visible"):
        with gpu.acquire_gpu_slot(tmp_path, n_devices=0):
            pass
    with pytest.raises(PrecswitchError, match="out of range"):
        with gpu.acquire_gpu_slot(tmp_path, n_devices=2, indices=[2]):
            pass
    # n_devices defaults to torch.cuda.device_count(): 0 on this CPU-only machine
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(PrecswitchError, match="no CUDA device"):
            with gpu.acquire_gpu_slot(tmp_path):
                pass
    monkeypatch.setenv(gpu.LOCK_DIR_ENV, str(tmp_path / "locks"))
    assert gpu.default_lock_dir() == tmp_path / "locks"
    monkeypatch.delenv(gpu.LOCK_DIR_ENV)
    assert gpu.default_lock_dir().name == __import__("socket").gethostname()


def test_claim_device(tmp_path, no_cvd):
    import torch

    assert gpu.claim_device(torch.device("cpu"), lock_dir=tmp_path) == torch.device("cpu")
    assert gpu.claim_info()["gpu_slot_index"] is None
    try:
        dev = gpu.claim_device("cuda", lock_dir=tmp_path, n_devices=2, timeout=1)
        assert dev == torch.device("cuda", 0)
        assert gpu.claim_device("cuda", lock_dir=tmp_path, n_devices=2) == dev  # idempotent
        info = gpu.claim_info()
        assert info["gpu_slot_index"] == 0 and info["gpu_slot_physical_id"] == "0"
        assert info["gpu_slot_wait_seconds"] >= 0 and info["gpu_lock_dir"] == str(tmp_path)
        with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=1) as other:
            assert other == 1  # the claim holds GPU 0
    finally:
        gpu.release_claim()
    assert gpu.claim_info()["gpu_slot_index"] is None
    # an explicit cuda:N waits for that GPU only
    try:
        assert gpu.claim_device("cuda:1", lock_dir=tmp_path, n_devices=2, timeout=1) == torch.device("cuda", 1)
    finally:
        gpu.release_claim()


def test_gpu_provenance_none_on_cpu():
    import torch

    if torch.cuda.is_available():
        info = gpu.gpu_provenance()
        assert info["name"] and info["compute_capability"]
    else:
        assert gpu.gpu_provenance() is None


# ------------------------------------------------------------------ benchmarks/gpu_check on CPU
@pytest.mark.parametrize("mlm", [False, True])
def test_gpu_check_cpu_smoke(tmp_path, mlm):
    from precswitch import precision as P

    out = tmp_path / "gpu_check.json"
    cmd = [str(ROOT / "benchmarks" / "gpu_check"), "--device", "cpu", "--steps", "3", "--quick", "--out", str(out)]
    if mlm:
        cmd += ["--mlm", "--profile-steps", "1"]
    env = {**os.environ, "PYTHON": sys.executable}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["objective"] == ("mlm" if mlm else "classify")
    by = {row["precision"]: row for row in res["results"]}
    assert set(by) == set(P.NAMES)  # every precision of the catalog
    assert by["tf32"]["status"] == "skipped" and "tf32" in by["tf32"]["reason"]
    assert by["fp8"]["status"] == "skipped" and "fp8" in by["fp8"]["reason"]
    assert by["pure_fp16"]["adam_eps"] == 1e-4
    for name in ("fp32", "amp_fp16", "amp_bf16", "pure_fp16", "pure_bf16", "pure_bf16_kahan", "pure_bf16_sr"):
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
    if mlm:  # profiled: no kernels on a CPU, so no GPU-busy fraction either
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
    else:
        assert "profiled_steps" not in by["fp32"]


@pytest.mark.parametrize("name, kind", [
    # CUDA kernels as torch.profiler names them (cuBLAS on Hopper, CUTLASS, flash / mem-efficient attention)
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     "matmul"),
    ("nvjet_hsh_192x192_64x4_2x1_v_bz_coopA_TNN", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(cutlass_80_tensorop_s1688gemm_64x64_16x6_"
     "tn_align4::Params)", "matmul"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t>, "
     "false, false>(pytorch_flash::Flash_fwd_params)", "attention"),
    ("fmha_cutlassB_bf16_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel<cutlass::arch::Sm80>::Params)",
     "attention"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
     "(at::native::ADAM_MODE)1, false>, double*, double, double, double, double, double, bool, bool*, bool*>", "optimizer"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "TensorListMetadata<1>, at::native::(anonymous namespace)::LpNormFunctor<float, (at::native::(anonymous namespace)"
     "::NormType)1, float, float>, float*, int>", "foreach"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, "
     "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)", "layer_norm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
     "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >",
     "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)"
     "::{lambda()#1}::operator()() const::{lambda(float)#1}, at::detail::Array<char*, 2> >", "copy_cast"),
    ("void at::native::(anonymous namespace)::fused_dropout_kernel_vec<c10::BFloat16, float, unsigned int, 1, 4, bool>",
     "dropout"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 7, false, false>", "softmax_ce"),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>", "softmax_ce"),
    ("void at::native::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>", "embedding"),
    ("void at::native::(anonymous namespace)::krn_partials_per_segment<long>(long*, long const*, long, long)", "embedding"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
     "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>>>",
     "reduction"),
    ("Memset (Device)", "copy_cast"),
    # elementwise kernels whose helpers' names say "cast": a mixed-dtype add under autocast is no cast kernel
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, "
     "float, float, at::native::binary_internal::MulFunctor<float>>>(at::TensorIteratorBase&, ...)", "elementwise"),
    ("void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>, "
     "TrivialOffsetCalculator<2, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
     "at::native::memory::LoadWithCast<2>, at::native::memory::StoreWithCast<1>>", "elementwise"),
    ("void at::native::(anonymous namespace)::distribution_elementwise_grid_stride_kernel<unsigned int, 4, "
     "at::native::templates::cuda::random_from_to_kernel<at::PhiloxCudaState>...>", "elementwise"),  # randint: no dropout
    ("void at::native::(anonymous namespace)::masked_scale_kernel<c10::BFloat16, float, bool>", "dropout"),
    ("triton_poi_fused__scaled_dot_product_efficient_attention_add_5", "compiled"),
    ("triton_tem_fused__scaled_dot_product_flex_attention_0", "attention"),
    ("Memcpy DtoD (Device -> Device)", "copy_cast"),
    ("triton_per_fused__to_copy_add_native_layer_norm_native_layer_norm_backward_3", "compiled"),
    ("triton_tem_fused_addmm_0", "matmul"),
    ("## Call CompiledFxGraph f6ssdqgbq7l5mb4rid7p5t3qxzy4c7stsvyv72hd4pznfsauaxdz ##", "compiled"),
    # aten ops on a CPU
    ("aten::addmm", "matmul"), ("aten::mm", "matmul"), ("aten::_fused_adamw_", "optimizer"),
    ("aten::native_layer_norm_backward", "layer_norm"), ("aten::embedding_dense_backward", "embedding"),
    ("aten::view", "views_alloc"), ("aten::linear", "views_alloc"), ("aten::add_", "elementwise"),
    ("aten::_foreach_norm", "foreach"), ("aten::isneginf", "other"),
])
def test_gpu_check_kernel_kind(name, kind):
    """kernel_kind reads what a kernel (or CPU op) does from its name; "lambda" in a template is no optimizer."""
    assert _load_gpu_check().kernel_kind(name) == kind


@pytest.mark.parametrize("mlm", [False, True])
def test_gpu_check_engine_batches_drop_the_full_mask_and_its_host_read(mlm):
    """gpu_check's engine-step batches are built as the engine builds them: no padding, so no mask,
    and the forward reads nothing back from the device (run 2 on the H200 counted one such read per
    eager step); the stock step keeps the mask, as model(**batch) from a tokenizer gets it."""
    import torch
    from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification

    gc = _load_gpu_check()
    cfg = dict(gc.QUICK)
    model = (BertForMaskedLM if mlm else BertForSequenceClassification)(BertConfig(**cfg, attn_implementation="sdpa"))
    dev = torch.device("cpu")
    engine_b = gc.make_batches(cfg, 4, 16, mlm, dev, n=2)
    stock_b = gc.make_batches(cfg, 4, 16, mlm, dev, n=2, engine_step=False)
    assert all("attention_mask" not in b for b in engine_b) and all(b["attention_mask"].all() for b in stock_b)
    objective = "mlm" if mlm else "classify"
    reads = {name: gc.profile_steps(lambda b: gc.forward_loss(model, b, objective), bs, 2, dev)["host_item_calls_per_step"]
             for name, bs in (("engine", engine_b), ("stock", stock_b))}
    assert reads == {"engine": 0.0, "stock": 1.0}


def test_gpu_check_profile_counts_host_waits():
    """profile_steps counts per step the values the host waits for (.item(), bool(tensor))."""
    import torch

    gc = _load_gpu_check()
    x = torch.ones(4)

    def step(b):
        return float((x * b["k"]).sum()) + float(x.max())  # two host reads of a tensor value per step

    res = gc.profile_steps(step, [{"k": torch.tensor(2.0)}], 3, torch.device("cpu"))
    assert res["profiled_steps"] == 3 and res["host_item_calls_per_step"] == 2.0
    assert res["kernels_per_step"] == 0 and res["host_syncs_per_step"] == 0
    res = gc.profile_steps(lambda b: x * b["k"], [{"k": torch.tensor(2.0)}], 2, torch.device("cpu"))
    assert res["host_item_calls_per_step"] == 0
    assert gc.host_launch_us(torch.device("cpu")) is None
    assert gc.parse_args([]).compile_mode == "reduce-overhead"  # compiled rows: CUDA graphs


def _load_gpu_check():
    return load_benchmark("gpu_check")


def test_gpu_check_peaks_and_verdicts():
    """The GPU-only logic of gpu_check (peaks per precision, PASS/FAIL), with made-up rows."""
    import torch

    gc = _load_gpu_check()
    key, peaks = gc.find_peaks("NVIDIA H200", {})
    assert key == "H200" and peaks == {"fp32": 67.0, "tf32": 395.0, "fp16": 790.0, "bf16": 790.0, "fp8": 1580.0}
    assert gc.find_peaks("NVIDIA H200", {"bf16": 989.0})[1]["bf16"] == 989.0
    assert gc.find_peaks("Tesla T4", {}) == (None, {})
    from precswitch import precision as P

    assert {n: gc.peak_key(P.get(n)) for n in P.NAMES} == {
        "fp32": "fp32", "tf32": "tf32", "amp_fp16": "fp16", "amp_bf16": "bf16", "pure_fp16": "fp16",
        "pure_bf16": "bf16", "pure_bf16_kahan": "bf16", "pure_bf16_sr": "bf16", "fp8": "fp8"}

    def row(p, v, sps, mfu):
        return {"precision": p, "variant": v, "status": "ok", "steps_per_second": sps, "mfu": mfu}

    cuda = torch.device("cuda")
    rows = [row("fp32", "eager", 10.0, 0.5), row("amp_bf16", "eager", 20.0, 0.2),
            row("fp32", "compiled", 11.0, 0.55), row("amp_bf16", "compiled", 30.0, 0.36)]
    ratios, checks = gc.checks_from(rows, cuda)
    assert ratios == {"amp_bf16/fp32 (eager)": 2.0, "amp_bf16/fp32 (compiled)": pytest.approx(30 / 11)}
    c = {x["name"]: x for x in checks}
    assert c["speedup_amp_bf16_over_fp32"]["variant"] == "compiled"
    assert c["speedup_amp_bf16_over_fp32"]["result"] == "PASS"  # 2.73 >= 2.5
    assert c["mfu_amp_bf16"]["value"] == 0.36 and c["mfu_amp_bf16"]["result"] == "PASS"
    # compiled amp_bf16 missing (e.g. skipped for the time budget): eager decides, and fails
    rows[3] = {"precision": "amp_bf16", "variant": "compiled", "status": "skipped", "reason": "time budget"}
    _, checks = gc.checks_from(rows, cuda)
    c = {x["name"]: x for x in checks}
    assert c["speedup_amp_bf16_over_fp32"]["variant"] == "eager"
    assert c["speedup_amp_bf16_over_fp32"]["result"] == "FAIL" and c["mfu_amp_bf16"]["result"] == "FAIL"


def test_slurm_jobs_lock_in_their_own_dir(monkeypatch):
    from precswitch import gpu

    monkeypatch.delenv(gpu.LOCK_DIR_ENV, raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    node = gpu.default_lock_dir()
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert gpu.default_lock_dir() == node / "slurm-4242"
    # an exported PRECSWITCH_GPU_LOCK_DIR reaches every SLURM job (--export=ALL): one dir for all of them
    # queued jobs holding different GPUs behind each other; each job still locks in its own
    monkeypatch.setenv(gpu.LOCK_DIR_ENV, "/x/locks")
    assert str(gpu.default_lock_dir()) == "/x/locks/slurm-4242"
    monkeypatch.delenv("SLURM_JOB_ID")
    assert str(gpu.default_lock_dir()) == "/x/locks"


def test_a_shared_lock_dir_makes_its_lock_files_writable_for_all(tmp_path):
    """Two users sharing a workstation share PRECSWITCH_GPU_LOCK_DIR: a lock file made 0644 by the umask
    gave the other user a PermissionError traceback."""
    import stat

    from precswitch import gpu

    old = os.umask(0o022)
    try:
        fd = gpu._try_lock(tmp_path / "gpu-0.lock")
    finally:
        os.umask(old)
    assert fd is not None
    os.close(fd)
    assert stat.S_IMODE((tmp_path / "gpu-0.lock").stat().st_mode) == 0o666
    locked = tmp_path / "ro"
    locked.mkdir()
    (locked / "gpu-0.lock").write_text("")
    (locked / "gpu-0.lock").chmod(0o444)
    if os.geteuid() == 0:
        return  # root opens it anyway: the refusal below cannot happen here
    with pytest.raises(PrecswitchError, match="is not writable by this user"):
        gpu._try_lock(locked / "gpu-0.lock")


def test_nvml_readings_come_from_the_gpu_cuda_means(monkeypatch):
    """NVML numbers GPUs in PCI order and ignores CUDA_VISIBLE_DEVICES: energy and memory must come
    from the GPU that CUDA device 0 is (matched by UUID), not from NVML's GPU 0."""
    import types

    import torch

    from precswitch import measure

    gpus = {"GPU-aaaa": ("nvml0", 111_000, 1 << 30), "GPU-cccc": ("nvml2", 333_000, 3 << 30)}
    handles = {h: (e, m) for h, e, m in gpus.values()}
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: f"nvml{i}",
        nvmlDeviceGetHandleByUUID=lambda u: gpus[u][0],
        nvmlDeviceGetTotalEnergyConsumption=lambda h: handles[h][0],
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=handles[h][1]),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid="cccc"))
    monkeypatch.setattr(measure, "_NVML_HANDLES", {})
    dev = torch.device("cuda", 0)  # CUDA_VISIBLE_DEVICES=2: CUDA's 0 is NVML's 2
    assert measure.nvml_energy_mj(dev) == 333_000
    assert measure.nvml_memory_used(dev) == 3 << 30
    # a MIG slice: NVML knows it as MIG-<uuid> (its PCI bus id would name the whole parent GPU)
    gpus["MIG-dddd"] = ("nvml3", 444_000, 4 << 30)
    handles["nvml3"] = (444_000, 4 << 30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid="dddd"))
    monkeypatch.setattr(measure, "_NVML_HANDLES", {})
    assert measure.nvml_energy_mj(dev) == 444_000


def test_gpu_check_one_compiled_row_in_the_budget_is_amp_bf16s(tmp_path, monkeypatch):
    """When the time budget leaves room for one compiled row only, it must be amp_bf16's (the MFU
    target needs it; a lone compiled fp32 row serves no target)."""
    gc = _load_gpu_check()

    def fake_measure(name, variant, args, cfg, device, batches, peaks):
        return {"precision": name, "variant": variant, "status": "ok", "reason": None, "steps_per_second": 1.0,
                "mfu": None, "warmup_seconds": 1000.0 if variant == "compiled" else 0.1, "seconds": 0.1}

    monkeypatch.setattr(gc, "measure_one", fake_measure)
    monkeypatch.setattr(gc, "print_table", lambda res: None)
    out = tmp_path / "g.json"
    gc.main(["--device", "cpu", "--quick", "--compile", "on", "--budget-seconds", "300", "--out", str(out)])
    rows = json.loads(out.read_text())["results"]
    compiled_ok = [r["precision"] for r in rows if r["variant"] == "compiled" and r["status"] == "ok"]
    assert compiled_ok == ["amp_bf16"]


def test_gpu_check_fp8_row_fails_alone_when_torchao_cannot_import(monkeypatch, tmp_path):
    """torchao's float8 import is probed in a child process: an import that aborts (ABI mismatch) or fails
    makes the fp8 row an error with the reason, and the process goes on to the next rows."""
    import subprocess as sp

    gc = _load_gpu_check()
    gc._FP8_PROBE.clear()
    monkeypatch.setattr(gc.P, "check_supported", lambda prec, device: None)  # as on a Hopper GPU
    real_run = sp.run
    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        assert "torchao.float8" in cmd[-1]
        return real_run([sys.executable, "-c", "import os; os.abort()"], **kw)  # the child dies on import

    monkeypatch.setattr(sp, "run", fake_run)
    args = gc.parse_args(["--device", "cpu", "--quick"])
    row = gc.measure_one("fp8", "eager", args, gc.QUICK, gc.torch.device("cpu"), [], {})
    assert row["status"] == "error" and "import torchao.float8 failed" in row["reason"], row
    row2 = gc.measure_one("fp8", "compiled", args, gc.QUICK, gc.torch.device("cpu"), [], {})
    assert row2["status"] == "error" and len(seen) == 1  # probed once per process
    gc._FP8_PROBE.clear()


def test_gpu_check_times_at_least_min_seconds_where_energy_is_read(monkeypatch):
    """amp_bf16 with CUDA graphs ran its 50 timed steps in 0.5 s on the H200: too short a window for NVML's
    energy counter. Where energy is read, a row times at least --min-seconds of steps (more than --steps),
    and its per-step figures divide by the steps it really timed."""
    gc = _load_gpu_check()
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


def test_gpu_check_small_preset_is_the_bert_small_config():
    import yaml

    gc = _load_gpu_check()
    cfg = yaml.safe_load((ROOT / "config" / "bert-small-scratch.yaml").read_text())
    for key, value in gc.SMALL.items():
        want = cfg["tokenizer"]["vocab_size"] if key == "vocab_size" else cfg["model"][key]
        assert value == want, key


# ------------------------------------------------------------------ benchmarks/gpu_hours.py
def _gpu_hours():
    return load_benchmark("gpu_hours")


def _fake_check(path, objective, batch, steps_s: dict, variant="eager"):
    path.write_text(json.dumps({
        "schema": "precswitch-gpu-check/1", "objective": objective, "batch": batch, "seq_len": 128,
        "model": {"num_hidden_layers": 12, "hidden_size": 768},
        "results": [{"precision": p, "variant": variant, "status": "ok", "step_seconds": s} for p, s in steps_s.items()]
        + [{"precision": "pure_fp16", "variant": "eager", "status": "failed"}],
    }))
    return path


def test_gpu_hours_hand_count(tmp_path, capsys):
    """Stage 1 once per distinct stage-1 precision and seed, stage 2 once per schedule and seed."""
    import yaml

    gh = _gpu_hours()
    train = {"batch_size": 32, "max_length": 128}
    cfg = {"seeds": [1, 2], "model": {"init": "bert-base-cased"},
           "schedules": {"a": {"pretrain": "fp32", "finetune": "fp32"}, "b": {"pretrain": "fp32", "finetune": "amp_bf16"},
                         "c": {"pretrain": {"precision": "amp_bf16", "switch_to": "fp32", "switch_at": 0.25},
                               "finetune": "fp32"}},
           "train": {"pretrain": {**train, "steps": 1000}, "finetune": {**train, "steps": None, "epochs": 2}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    mlm = _fake_check(tmp_path / "mlm.json", "mlm", 32, {"fp32": 0.098, "amp_bf16": 0.018})
    cls = _fake_check(tmp_path / "cls.json", "classify", 32, {"fp32": 0.048, "amp_bf16": 0.028})
    cls2 = _fake_check(tmp_path / "cls2.json", "classify", 32, {"amp_bf16": 0.038})  # a second, slower reading
    compiled = _fake_check(tmp_path / "cg.json", "classify", 32, {"fp32": 0.001}, variant="compiled")  # ignored
    args = ["--step-overhead-ms", "2", "--stage1-job-s", "100", "--stage2-job-s", "10", "--finetune-rows", "330"]
    assert gh.main([str(tmp_path / "c.yaml"), str(mlm), str(cls), str(cls2), str(compiled), *args]) == 0
    out = capsys.readouterr().out
    # stage 1: fp32 (shared by a and b) 1000 x 0.1 + 100 = 200 s; the switch 250 x 0.02 + 750 x 0.1 + 100 = 180 s
    # stage 2: 2 epochs x (330 // 32 = 10) = 20 steps: fp32 20 x 0.05 + 10 = 11 s (a, c); amp_bf16 20 x 0.03|0.04 + 10
    s1 = 2 * (200 + 180) / 3600
    s2_lo, s2_hi = 2 * (11 + 11 + 10.6) / 3600, 2 * (11 + 11 + 10.8) / 3600
    assert f"pretrain: {s1:.1f} GPU-hours" in out
    assert f"total: {s1 + s2_lo:.1f}" in out and "20 " in out
    res = gh.estimate(cfg, gh.load_measurements([mlm, cls, cls2]), gh.main.__globals__["argparse"].Namespace(
        step_overhead_ms=2, stage1_job_s=100, stage2_job_s=10, pretrain_rows=None, finetune_rows=330))
    assert len([j for j in res["jobs"] if j["stage"] == "pretrain"]) == 2  # fp32 shared by a and b
    got = {j["spec"]: j["run_s"] for j in res["jobs"] if j["stage"] == "finetune"}
    assert got["b"] == pytest.approx((10.6, 10.8)) and got["a"] == pytest.approx((11.0, 11.0))
    assert sum(j["run_s"][1] * j["seeds"] for j in res["jobs"]) / 3600 == pytest.approx(s1 + s2_hi)
    # a precision without a measurement is named, not guessed
    assert gh.main([str(tmp_path / "c.yaml"), str(mlm), *args]) == 2
    assert "classify fp32 batch 32 x 128" in capsys.readouterr().err


def test_gpu_hours_of_the_shipped_config_from_the_h200_measurements():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_hours.py"), str(ROOT / "config" / "bert-base-mrpc.yaml"),
                        *map(str, sorted((ROOT / "benchmarks" / "lease" / "h200").glob("*gpu_check*.json"))),
                        str(ROOT / "benchmarks" / "lease" / "h200" / "run2_prof_eager.json")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "10000" in r.stdout and "342" in r.stdout and "total:" in r.stdout
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_hours.py"), str(ROOT / "config" / "bert-small-scratch.yaml"),
                        str(ROOT / "benchmarks" / "lease" / "h200" / "run1_engine_cuda_metrics.json")], capture_output=True, text=True)
    assert r.returncode != 0 and "not a gpu_check --out result" in r.stderr


def test_gpu_hours_refuses_results_of_two_gpus(tmp_path):
    """Step times of an H100 and an H200 made one min-max range that was neither GPU's estimate."""
    gh = _gpu_hours()
    paths = []
    for name in ("NVIDIA H200", "NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        p = _check_json(tmp_path / f"{len(paths)}.json", "classify", 32, 128, 12, 768, {"fp32": 0.05})
        p.write_text(json.dumps({**json.loads(p.read_text()), "device": "cuda", "device_name": name}))
        paths.append(p)
    assert gh.load_measurements(paths[:2])[("classify", "fp32", 32, 128, 12, 768)] == [0.05, 0.05]
    with pytest.raises(SystemExit, match=r"timed on different GPUs \(NVIDIA H200: .*0\.json, NVIDIA H100 80GB HBM3: "
                                         r".*2\.json\); give the results of the one GPU"):
        gh.load_measurements(paths)


def test_gpu_hours_reads_a_partial_config_as_the_workflow_does(tmp_path, capsys):
    """Only the keys that differ from config/config.yaml (as `snakemake --configfile` takes them): the rest comes
    from config.yaml and the schema's defaults (it was a KeyError on 'seeds'); the schedules map replaces the
    default one; a file that is no mapping, or a schema error, is one line naming the file."""
    import yaml

    gh = _gpu_hours()
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    shape = {"batch_size": 32, "max_length": 128}
    part = {"model": {"init": "bert-base-cased"}, "schedules": {"x": {"finetune": "amp_bf16"}},
            "analysis": {"baseline": "x", "contrasts": []}, "train": {"finetune": shape}}
    (tmp_path / "part.yaml").write_text(yaml.safe_dump(part))
    cfg = gh.study_config(tmp_path / "part.yaml")
    assert cfg["seeds"] == base["seeds"] and list(cfg["schedules"]) == ["x"]
    assert cfg["train"]["finetune"]["lr"] == base["train"]["finetune"]["lr"]  # merged, not replaced
    cls = _check_json(tmp_path / "cls.json", "classify", 32, 128, 12, 768, {"amp_bf16": 0.03})
    assert gh.main([str(tmp_path / "part.yaml"), str(cls)]) == 0
    assert f"1 schedules x {len(base['seeds'])} seeds" in capsys.readouterr().out
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(SystemExit, match=r"list.yaml: a study config is a YAML mapping, got list"):
        gh.study_config(tmp_path / "list.yaml")
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"schedules": {"x": {"finetune": "fp64"}}}))
    with pytest.raises(SystemExit, match=r"bad.yaml: not a valid study config: config key schedules.x.finetune: 'fp64' is not "):
        gh.study_config(tmp_path / "bad.yaml")


def _check_json(path, objective, batch, seq, layers, hidden, steps_s: dict, variant="eager", status="ok"):
    path.write_text(json.dumps({
        "schema": "precswitch-gpu-check/1", "objective": objective, "batch": batch, "seq_len": seq,
        "model": {"num_hidden_layers": layers, "hidden_size": hidden},
        "results": [{"precision": p, "variant": variant, "status": status, "step_seconds": s}
                    for p, s in steps_s.items()]}))
    return path


def _hours_args(**over):
    import argparse

    return argparse.Namespace(**{"step_overhead_ms": 2.0, "stage1_job_s": 25.0, "stage2_job_s": 18.0,
                                 "pretrain_rows": None, "finetune_rows": 100, **over})


def test_gpu_hours_uses_eager_ok_rows_at_the_configs_shapes(tmp_path):
    """Only eager rows that ran (the engine does not compile; a failed row has no time), keyed by objective,
    precision, batch, sequence length and model shape: a config at length 64 takes the length-64 times."""
    gh = _gpu_hours()
    mlm = _check_json(tmp_path / "mlm.json", "mlm", 128, 64, 4, 512, {"fp32": 0.5})
    cls = _check_json(tmp_path / "cls.json", "classify", 16, 64, 4, 512, {"fp32": 0.1, "amp_bf16": 0.05})
    cls128 = _check_json(tmp_path / "cls128.json", "classify", 16, 128, 4, 512, {"fp32": 9.0, "amp_bf16": 9.0})
    compiled = _check_json(tmp_path / "cg.json", "classify", 16, 64, 4, 512, {"fp32": 0.001}, variant="compiled")
    failed = _check_json(tmp_path / "f.json", "classify", 16, 64, 4, 512, {"amp_bf16": 0.001}, status="failed")
    meas = gh.load_measurements([mlm, cls, cls128, compiled, failed])
    assert dict(meas) == {("mlm", "fp32", 128, 64, 4, 512): [0.5], ("classify", "fp32", 16, 64, 4, 512): [0.1],
                          ("classify", "amp_bf16", 16, 64, 4, 512): [0.05],
                          ("classify", "fp32", 16, 128, 4, 512): [9.0], ("classify", "amp_bf16", 16, 128, 4, 512): [9.0]}
    cfg = {"seeds": [1, 2, 3], "model": {"init": "scratch", "num_hidden_layers": 4, "hidden_size": 512},
           "schedules": {"a": {"pretrain": "fp32", "finetune": "fp32"}, "b": {"pretrain": "fp32", "finetune": "amp_bf16"}},
           "train": {"pretrain": {"steps": 100, "epochs": None, "batch_size": 128, "max_length": 64},
                     "finetune": {"steps": None, "epochs": 3, "batch_size": 16, "max_length": 64}}}
    res = gh.estimate(cfg, meas, _hours_args())
    # stage 1: 100 x (0.5 + 0.002) + 25 = 75.2 s, shared; stage 2: 3 x (100 // 16) = 18 steps x (t + 0.002) + 18
    assert res["missing"] == []
    assert sorted((j["stage"], j["steps"], j["seeds"], round(j["run_s"][0], 6), round(j["run_s"][1], 6))
                  for j in res["jobs"]) == [("finetune", 18, 3, 18.936, 18.936), ("finetune", 18, 3, 19.836, 19.836),
                                            ("pretrain", 100, 3, 75.2, 75.2)]


def test_gpu_hours_schedule_without_stage_1(tmp_path):
    """A schedule without pretrain (the schema allows it: it fine-tunes model.init directly) runs no stage-1
    job; gpu_hours used to stop on it with KeyError 'pretrain'. With no stage 1 anywhere, stage 1's train
    section and measurements are not needed at all."""
    gh = _gpu_hours()
    meas = gh.load_measurements([
        _check_json(tmp_path / "mlm.json", "mlm", 128, 64, 4, 512, {"fp32": 0.5}),
        _check_json(tmp_path / "cls.json", "classify", 16, 64, 4, 512, {"fp32": 0.1, "amp_bf16": 0.05})])
    finetune = {"steps": None, "epochs": 3, "batch_size": 16, "max_length": 64}
    cfg = {"seeds": [1, 2], "model": {"init": "scratch", "num_hidden_layers": 4, "hidden_size": 512},
           "schedules": {"a": {"pretrain": "fp32", "finetune": "fp32"}, "c": {"finetune": "amp_bf16"}},
           "train": {"pretrain": {"steps": 100, "epochs": None, "batch_size": 128, "max_length": 64},
                     "finetune": finetune}}
    res = gh.estimate(cfg, meas, _hours_args())
    # stage 1 (a only): 100 x 0.502 + 25 = 75.2 s; stage 2: 18 steps x (t + 0.002) + 18 s, for a and for c
    assert res["missing"] == []
    assert sorted((j["stage"], j["spec"] if j["stage"] == "finetune" else "-", round(j["run_s"][0], 6))
                  for j in res["jobs"]) == [("finetune", "a", 19.836), ("finetune", "c", 18.936), ("pretrain", "-", 75.2)]
    cfg = {**cfg, "schedules": {"c": {"finetune": "amp_bf16"}}, "train": {"finetune": finetune}}
    res = gh.estimate(cfg, meas, _hours_args())
    assert [(j["stage"], j["spec"], round(j["run_s"][0], 6)) for j in res["jobs"]] == [("finetune", "c", 18.936)]


def test_gpu_hours_counts_the_workflows_jobs(tmp_path):
    """The jobs the workflow runs, counted by hand: schedules a and b share one stage-1 run per seed (fp32,
    written once as a name and once as a mapping: the workflow normalises both to the run "fp32"; b1's switch
    at 1 is that run too), s has
    its own (a switch), c has none; stage 2 runs once per schedule and seed.
    finetune: 3 epochs x (100 // 16 = 6 batches, the partial one dropped) = 18 steps."""
    gh = _gpu_hours()
    cfg = {"seeds": [1, 2, 3], "model": {"init": "scratch", "num_hidden_layers": 4, "hidden_size": 512},
           "schedules": {"a": {"pretrain": "fp32", "finetune": "fp32"},
                         "b": {"pretrain": {"precision": "fp32"}, "finetune": "amp_bf16"},
                         # every step before the switch: the workflow runs it as the plain fp32 run (run_spec)
                         "b1": {"pretrain": {"precision": "fp32", "switch_to": "amp_bf16", "switch_at": 1},
                                "finetune": "amp_bf16"},
                         "s": {"pretrain": {"precision": "amp_bf16", "switch_to": "fp32", "switch_at": 0.75},
                               "finetune": "fp32"},
                         "c": {"finetune": "amp_bf16"},
                         # its own optimizer values: another stage-1 run (named fp32-with-adam_eps0.0001)
                         "e": {"pretrain": {"precision": "fp32", "overrides": {"adam_eps": 1e-4}}, "finetune": "fp32"}},
           "train": {"pretrain": {"steps": 100, "epochs": None, "batch_size": 128, "max_length": 64},
                     "finetune": {"steps": None, "epochs": 3, "batch_size": 16, "max_length": 64}}}
    meas = gh.load_measurements([
        _check_json(tmp_path / "mlm.json", "mlm", 128, 64, 4, 512, {"fp32": 0.5, "amp_bf16": 0.2}),
        _check_json(tmp_path / "cls.json", "classify", 16, 64, 4, 512, {"fp32": 0.1, "amp_bf16": 0.05})])
    res = gh.estimate(cfg, meas, _hours_args())
    assert res["missing"] == []
    # stage 1: fp32 100 x 0.502 + 25 = 75.2 s (twice: a's, e's); the switch 75 x 0.202 + 25 x 0.502 + 25 = 52.7 s
    # stage 2: fp32 18 x 0.102 + 18 = 19.836 s (a, s, e); amp_bf16 18 x 0.052 + 18 = 18.936 s (b, b1, c)
    jobs = sorted((j["stage"], j["steps"], j["seeds"], round(j["run_s"][0], 6)) for j in res["jobs"])
    assert jobs == [("finetune", 18, 3, 18.936), ("finetune", 18, 3, 18.936), ("finetune", 18, 3, 18.936),
                    ("finetune", 18, 3, 19.836), ("finetune", 18, 3, 19.836), ("finetune", 18, 3, 19.836),
                    ("pretrain", 100, 3, 52.7), ("pretrain", 100, 3, 75.2), ("pretrain", 100, 3, 75.2)]
    assert sorted(gh.run_key(j["spec"]) for j in res["jobs"] if j["stage"] == "pretrain") == [
        "amp_bf16-to-fp32-at75", "fp32", "fp32-with-adam_eps0.0001"]
    total_h = 3 * (2 * 75.2 + 52.7 + 3 * 19.836 + 3 * 18.936) / 3600
    assert sum(j["run_s"][1] * j["seeds"] for j in res["jobs"]) / 3600 == pytest.approx(total_h)


def test_gpu_hours_refuses_the_stock_steps_times(tmp_path):
    """gpu_check --step stock times model(**batch).loss (the masked-LM head over every token, the full last
    layer), not the step the study's jobs run: its times would overstate the GPU-hours, so such a file is
    refused by name; --step engine files (and older files without the field) are read."""
    gh = _gpu_hours()
    engine = _check_json(tmp_path / "engine.json", "mlm", 128, 64, 4, 512, {"fp32": 0.5})
    stock = _check_json(tmp_path / "stock.json", "mlm", 128, 64, 4, 512, {"fp32": 0.7})
    stock.write_text(json.dumps({**json.loads(stock.read_text()), "step": "stock"}))
    engine.write_text(json.dumps({**json.loads(engine.read_text()), "step": "engine"}))
    assert dict(gh.load_measurements([engine])) == {("mlm", "fp32", 128, 64, 4, 512): [0.5]}
    with pytest.raises(SystemExit, match=r"stock\.json timed gpu_check --step stock"):
        gh.load_measurements([engine, stock])


def test_gpu_hours_refuses_a_cpu_run_and_a_json_that_is_no_gpu_check_result(tmp_path):
    """A gpu_check run on a CPU (`--device cpu` at BERT-base's shapes keys like the H200's rows) was read as
    GPU step times: alone it printed CPU hours as GPU-hours, beside a GPU's file it stretched the range to
    them. It is refused by name, as is a JSON of another schema (a mapping, not only a list); files written
    before the device was recorded are read."""
    gh = _gpu_hours()
    gpu = _check_json(tmp_path / "gpu.json", "mlm", 32, 128, 12, 768, {"fp32": 0.1})
    cpu = _check_json(tmp_path / "cpu.json", "mlm", 32, 128, 12, 768, {"fp32": 9.0})
    cpu.write_text(json.dumps({**json.loads(cpu.read_text()), "device": "cpu", "device_name": "x86_64"}))
    gpu.write_text(json.dumps({**json.loads(gpu.read_text()), "device": "cuda", "device_name": "NVIDIA H200"}))
    assert dict(gh.load_measurements([gpu])) == {("mlm", "fp32", 32, 128, 12, 768): [0.1]}
    with pytest.raises(SystemExit, match=r"cpu\.json timed device 'cpu' \(x86_64\), not a GPU"):
        gh.load_measurements([gpu, cpu])
    other = tmp_path / "metrics.json"
    for bad in ({"schema": "precswitch-metrics/1", "results": []}, {"results": []}):
        other.write_text(json.dumps(bad))
        with pytest.raises(SystemExit, match=r"metrics\.json is not a gpu_check --out result"):
            gh.load_measurements([other])


def test_gpu_hours_epoch_steps_as_the_engine_counts_them():
    """The engine trains max(1, round(epochs x (rows // batch))) steps (train/engine.py): a partial last
    batch is dropped each epoch, and a fractional epoch count (the schema allows a number) is not truncated."""
    gh = _gpu_hours()

    def steps(epochs, rows, batch=32):
        return gh.stage_steps({"steps": None, "epochs": epochs, "batch_size": batch}, rows, "finetune")

    assert steps(2, 50) == 2  # 50 // 32 = 1 batch per epoch, not 100 // 32 = 3
    assert steps(3, 3668) == 342  # MRPC: 114 batches per epoch
    assert steps(1.5, 330) == 15  # 10 batches per epoch; int(1.5) x 10 = 10 dropped half an epoch
    assert steps(0.5, 40) == 1  # round(0.5 x 1) = 0: never 0
    assert gh.stage_steps({"steps": 7, "epochs": None, "batch_size": 32}, 330, "finetune") == 7


def test_gpu_check_profiler_failure_keeps_the_rows_timing(tmp_path, monkeypatch, capsys):
    """The profiled steps run after the timed ones; a profiler error (CUPTI, Kineto) used to mark the row failed
    and drop the steps/s just measured. Now the row stays ok, with profile_error."""
    gc = _load_gpu_check()

    def broken(*a, **k):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    monkeypatch.setattr(gc, "profile_steps", broken)
    out = tmp_path / "g.json"
    gc.main(["--device", "cpu", "--quick", "--steps", "2", "--precisions", "fp32", "--profile-steps", "1",
             "--no-slot", "--out", str(out)])
    (row,) = json.loads(out.read_text())["results"]
    assert row["status"] == "ok" and row["steps_per_second"] > 0 and row["step_seconds"] > 0
    assert row["profile_error"] == "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"
    assert "profiling fp32 eager failed (its timing above stands)" in capsys.readouterr().out


def test_gpu_limit_note_says_when_the_limit_is_not_one_job_per_gpu():
    from precswitch.gpu import gpu_limit_note

    # one job per GPU, or a single job: nothing to say
    assert gpu_limit_note(2, 2, 10) is None
    assert gpu_limit_note(None, 4, 1) is None
    assert gpu_limit_note(8, 2, 2) is None  # 2 jobs on 2 GPUs, whatever the limit
    assert gpu_limit_note(1, 1, 10, "cuda:0") is None
    # no limit: every ready job starts, the extra ones wait for a lock
    note = gpu_limit_note(None, 2, 10)
    assert "no gpu resource limit" in note and "up to 10 training jobs" in note and "8 of them wait" in note
    assert "--resources gpu=2" in note
    # a limit above the GPU count
    note = gpu_limit_note(4, 2, 10)
    assert "limit is 4" in note and "2 of them wait" in note and "--resources gpu=2" in note
    # cuda:N pins every job to one GPU, however many are visible
    note = gpu_limit_note(4, 8, 10, "cuda:3")
    assert "uses GPU 3 only" in note and "3 of them wait" in note and "--resources gpu=1" in note
    # a limit below the GPU count leaves GPUs idle (unless there are fewer jobs than the limit)
    note = gpu_limit_note(1, 4, 10)
    assert "3 GPU(s) stay idle" in note and "--resources gpu=4" in note
    assert "--resources gpu=3" in gpu_limit_note(1, 4, 3)
    assert gpu_limit_note(2, 4, 2) is None


def test_a_slurm_job_removes_its_own_lock_dir(tmp_path, no_cvd, monkeypatch):
    """Each SLURM job locks in slurm-<job id>/ on the node; a finished job used to leave that dir (and its
    lock files) behind, one per job. Released, the job's dir goes; a file another process holds stays."""
    monkeypatch.setenv(gpu.LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    job_dir = tmp_path / "slurm-77"
    with gpu.acquire_gpu_slot(n_devices=2, timeout=1) as i:
        assert i == 0 and (job_dir / "gpu-0.lock").is_file()
    assert not job_dir.exists()
    # another process of the same job holds GPU 1: its file (and so the dir) stays, GPU 0's goes
    q, r = CTX.Queue(), CTX.Event()
    p = CTX.Process(target=_hold, args=(None, 2, q, r))
    p.start()
    try:
        assert q.get(timeout=30)[0] == 0
        with gpu.acquire_gpu_slot(n_devices=2, timeout=1) as i:
            assert i == 1
        assert sorted(f.name for f in job_dir.iterdir()) == ["gpu-0.lock"]
        with pytest.raises(gpu.GpuSlotTimeout):  # still held: the cleanup did not take it from its holder
            with gpu.acquire_gpu_slot(n_devices=2, timeout=0.2, poll=0.05, indices=[0]):
                pass
    finally:
        r.set()
        p.join(30)
    assert p.exitcode == 0 and not job_dir.exists()
    # a stage process (claim_device, held until the process ends) tidies up when it exits
    code = ("import sys; from precswitch import gpu; gpu.claim_device('cuda', n_devices=1, timeout=5); "
            "print(gpu.claim_info()['gpu_lock_dir'])")
    c = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, SLURM_JOB_ID="78"))
    assert c.returncode == 0, c.stderr[-2000:]
    assert c.stdout.strip() == str(tmp_path / "slurm-78") and not (tmp_path / "slurm-78").exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == []
    # outside SLURM the lock dir is the workstation's, shared by every run: it stays
    monkeypatch.delenv("SLURM_JOB_ID")
    with gpu.acquire_gpu_slot(n_devices=1, timeout=1):
        pass
    assert (tmp_path / "gpu-0.lock").is_file()


def test_a_lock_taken_on_a_file_unlinked_meanwhile_is_retaken_on_the_new_one(tmp_path, monkeypatch):
    """The cleanup can unlink a lock file between another process's open and its flock: that flock
    locks nothing anyone else sees, so _try_lock must lock the file now at the path instead."""
    from precswitch import io

    path = tmp_path / "gpu-0.lock"
    real = io.flock_and_sign
    calls = []

    def unlink_first(fd, holder):
        if not calls:
            path.unlink()  # what _remove_job_lock_dir does after our open
        calls.append(fd)
        return real(fd, holder)

    monkeypatch.setattr(gpu, "flock_and_sign", unlink_first)
    fd = gpu._try_lock(path)
    try:
        assert fd is not None and len(calls) == 2
        st, now = os.fstat(fd), path.stat()
        assert (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)
    finally:
        gpu._release(fd)


# ------------------------------------------------------------------ mutation audit (gpu): slots, claims, provenance
def test_the_default_lock_dir_is_one_per_user_and_host(monkeypatch):
    """Two users of one workstation (each with the default) must not share lock files: the first one's
    0666 files would do, but a dir made 0755 by the other's umask would refuse the second user."""
    import socket
    import tempfile

    monkeypatch.delenv(gpu.LOCK_DIR_ENV, raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert gpu.default_lock_dir() == (Path(tempfile.gettempdir()) / f"precswitch-gpu-locks-{os.getuid()}"
                                      / socket.gethostname())


def test_cuda_visible_devices_longer_than_the_device_count(tmp_path, monkeypatch):
    """CUDA_VISIBLE_DEVICES may name more GPUs than n_devices counts (a caller passing n_devices=1): the
    first n entries name the lock files, in order."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", " 6, 2,5")
    assert gpu.visible_device_ids(2) == ["6", "2"]
    assert gpu.visible_device_ids(1) == ["6"]
    with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=1) as i:
        assert i == 0 and [f.name for f in tmp_path.iterdir()] == ["gpu-6.lock"]


def test_a_lock_dir_removed_meanwhile_is_made_again(tmp_path):
    """A finished SLURM job's cleanup may rmdir the job's lock dir between another process's mkdir and
    its open: that process makes the dir again and locks there."""
    path = tmp_path / "slurm-9" / "gpu-0.lock"
    fd = gpu._try_lock(path)
    try:
        assert fd is not None and path.is_file()
        assert gpu._try_lock(path) is None  # really locked
    finally:
        gpu._release(fd)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts /proc/self/fd")
def test_waiting_and_releasing_leak_no_file_descriptors(tmp_path, no_cvd):
    """A job waits for a GPU for hours, trying every lock file each poll: a descriptor left open per try
    would end in EMFILE ('Too many open files') for the job, and one left per release in a process
    that takes slots again and again."""
    with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=1) as i:  # another open file: the flock excludes it
        assert i == 0
        before = _open_fds()
        with pytest.raises(gpu.GpuSlotTimeout):
            with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=0.3, poll=0.005):
                pass
        assert _open_fds() == before
    before = _open_fds()
    for _ in range(20):
        with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=1):
            pass
    assert _open_fds() == before


def test_a_slot_is_released_when_its_block_raises(tmp_path, no_cvd):
    """A training stage that fails inside the `with` must not keep its GPU: a later job (here another
    process) takes the same GPU at once."""
    with pytest.raises(RuntimeError, match="diverged"):
        with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=1) as i:
            assert i == 0
            raise RuntimeError("diverged")
    q, r = CTX.Queue(), CTX.Event()
    p = CTX.Process(target=_hold, args=(tmp_path, 1, q, r, None, 2.0))
    p.start()
    try:
        assert q.get(timeout=30)[0] == 0
    finally:
        r.set()
        p.join(30)
    assert p.exitcode == 0


def test_indices_outside_the_visible_devices_are_refused(tmp_path, no_cvd):
    """cuda:-1 or an empty candidate list is a caller's mistake: say so at once, instead of locking the
    last GPU under index -1 (torch's cuda:-1 is no GPU) or waiting forever for no GPU at all."""
    for indices in ([-1], [0, -2], []):
        with pytest.raises(PrecswitchError, match="out of range") as e:
            with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=0.2, poll=0.05, indices=indices):
                pass
        assert not isinstance(e.value, gpu.GpuSlotTimeout)
    assert list(tmp_path.iterdir()) == []  # nothing was locked


def test_the_timeout_holds_when_poll_is_longer(tmp_path, no_cvd):
    with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=1):
        t0 = time.monotonic()
        with pytest.raises(gpu.GpuSlotTimeout):
            with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=0.3, poll=30):
                pass
        assert time.monotonic() - t0 < 3


def test_a_nested_lock_dir_that_does_not_exist_yet_is_made(tmp_path, no_cvd, monkeypatch):
    """The default lock dir is <tmp>/precswitch-gpu-locks-<uid>/<host>[/slurm-<id>]: none of it exists on
    a fresh node."""
    monkeypatch.setenv(gpu.LOCK_DIR_ENV, str(tmp_path / "a" / "b"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with gpu.acquire_gpu_slot(n_devices=1, timeout=1) as i:
        assert i == 0 and (tmp_path / "a" / "b" / "gpu-0.lock").is_file()


def test_an_explicit_lock_dir_is_kept_inside_a_slurm_job(tmp_path, no_cvd, monkeypatch):
    """Only the job's own slurm-<id> dir is tidied away; a lock dir the caller names (shared with
    other runs) stays, with its lock files."""
    monkeypatch.setenv("SLURM_JOB_ID", "31")
    shared = tmp_path / "shared"
    with gpu.acquire_gpu_slot(shared, n_devices=1, timeout=1):
        pass
    assert [f.name for f in shared.iterdir()] == ["gpu-0.lock"]
    try:
        gpu.claim_device("cuda", lock_dir=shared, n_devices=1, timeout=1)
    finally:
        gpu.release_claim()
    assert [f.name for f in shared.iterdir()] == ["gpu-0.lock"]


def test_claim_records_how_long_it_waited(tmp_path, no_cvd):
    """metrics.json's gpu_slot_wait_seconds (and setup_seconds, which subtracts it) need the real wait."""
    import threading

    import torch  # noqa: F401 - imported before the clock starts (claim_device imports it)

    q, r = CTX.Queue(), CTX.Event()
    p = CTX.Process(target=_hold, args=(tmp_path, 1, q, r))
    p.start()
    try:
        assert q.get(timeout=30)[0] == 0
        threading.Timer(0.6, r.set).start()
        t0 = time.monotonic()
        gpu.claim_device("cuda", lock_dir=tmp_path, n_devices=1, timeout=20, poll=0.05)
        waited = time.monotonic() - t0
        assert 0.5 <= gpu.claim_info()["gpu_slot_wait_seconds"] <= waited
    finally:
        gpu.release_claim()
        r.set()
        p.join(30)


def test_claim_records_the_physical_gpu_and_makes_it_current(tmp_path, monkeypatch):
    """With CUDA_VISIBLE_DEVICES=5,7 the claim of cuda:1 is physical GPU 7 (its lock file and its
    provenance), and torch's current device is the one claimed, not the one asked for."""
    import torch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    set_to = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: set_to.append(torch.device(d)))
    try:
        assert gpu.claim_device("cuda:1", lock_dir=tmp_path, n_devices=2, timeout=1) == torch.device("cuda", 1)
        info = gpu.claim_info()
        assert (info["gpu_slot_index"], info["gpu_slot_physical_id"]) == (1, "7")
        assert set_to == [torch.device("cuda", 1)] and (tmp_path / "gpu-7.lock").is_file()
    finally:
        gpu.release_claim()
    # a plain "cuda" while another job holds physical GPU 5: the claim is cuda:1, and so is the current device
    with gpu.acquire_gpu_slot(tmp_path, n_devices=2, timeout=1) as held:
        assert held == 0
        try:
            assert gpu.claim_device("cuda", lock_dir=tmp_path, n_devices=2, timeout=1) == torch.device("cuda", 1)
            assert set_to[-1] == torch.device("cuda", 1) and gpu.claim_info()["gpu_slot_physical_id"] == "7"
        finally:
            gpu.release_claim()


def _fake_cuda(monkeypatch, props):
    """torch.cuda as on a machine whose visible devices have ``props`` (current device 0)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(props))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])


def _props(name, major, uuid, bus):
    import types

    return types.SimpleNamespace(name=name, major=major, minor=0, total_memory=80 << 30, multi_processor_count=108,
                                 uuid=uuid, pci_domain_id=0, pci_bus_id=bus, pci_device_id=0)


def _fake_nvml(monkeypatch, by_index: dict):
    """pynvml with two GPUs, found by their GPU- UUIDs, by NVML index only as ``by_index`` says, never by PCI id."""
    import types

    gpus = {"hA": ("GPU-aaaa", 250_000, 1530), "hC": ("GPU-cccc", 400_000, 1410)}

    def by_uuid(u):
        return {"GPU-aaaa": "hA", "GPU-cccc": "hC"}[u]  # a bare or MIG- uuid: KeyError, as NVML's not-found

    def by_pci(bus):
        raise RuntimeError("NVML_ERROR_NOT_FOUND")

    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlSystemGetDriverVersion=lambda: b"550.54",
        nvmlSystemGetCudaDriverVersion=lambda: 12040, nvmlDeviceGetHandleByUUID=by_uuid,
        nvmlDeviceGetHandleByPciBusId=by_pci, nvmlDeviceGetHandleByIndex=lambda i: by_index[i],
        nvmlDeviceGetUUID=lambda h: gpus[h][0].encode(), nvmlDeviceGetEnforcedPowerLimit=lambda h: gpus[h][1],
        NVML_CLOCK_SM=0, NVML_CLOCK_MEM=1, nvmlDeviceGetMaxClockInfo=lambda h, kind: gpus[h][2] if kind == 0 else 1215)
    monkeypatch.setitem(sys.modules, "pynvml", fake)


def test_gpu_provenance_describes_the_gpu_asked_for(monkeypatch):
    """Provenance of cuda:1 with CUDA_VISIBLE_DEVICES=4,6: physical GPU 6's name, capability and NVML
    readings (NVML found by the GPU- prefixed UUID torch gives bare), not cuda:0's."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    _fake_cuda(monkeypatch, [_props("Fake V100", 7, "aaaa", 0x17), _props("Fake A100", 8, "cccc", 0x65)])
    _fake_nvml(monkeypatch, by_index={})  # only the UUID finds a GPU
    info = gpu.gpu_provenance(1)
    assert (info["gpu_index"], info["gpu_physical_id"], info["name"]) == (1, "6", "Fake A100")
    assert info["compute_capability"] == "8.0" and info["bf16_supported"] is True  # an A100 has native bf16
    assert (info["uuid"], info["power_limit_watts"], info["max_sm_clock_mhz"]) == ("GPU-cccc", 400.0, 1410)
    assert (info["driver_version"], info["nvml_cuda_driver_version"]) == ("550.54", "12.4")
    info = gpu.gpu_provenance()  # the current device: cuda:0, physical 4, a V100 (no native bf16)
    assert (info["gpu_index"], info["gpu_physical_id"], info["bf16_supported"]) == (0, "4", False)
    assert info["uuid"] == "GPU-aaaa"
    # no UUID from torch and no PCI match: the physical id (CUDA_VISIBLE_DEVICES' 6) is NVML's index, not cuda:1's 1
    _fake_cuda(monkeypatch, [_props("Fake V100", 7, None, 0x17), _props("Fake A100", 8, None, 0x65)])
    _fake_nvml(monkeypatch, by_index={4: "hA", 6: "hC"})
    info = gpu.gpu_provenance(1)
    assert info["uuid"] == "GPU-cccc" and info["power_limit_watts"] == 400.0


def test_a_lock_on_a_file_replaced_meanwhile_is_no_lock(tmp_path, monkeypatch):
    """The cleanup unlinks the lock file after our open, and another process makes a new one at the path
    and locks it before our flock: our flock on the old file is no lock on that GPU, which is held."""
    from precswitch import io

    path = tmp_path / "gpu-0.lock"
    real = io.flock_and_sign
    other, state = [], {"replaced": False}

    def replaced_first(fd, holder):
        if not state["replaced"]:
            state["replaced"] = True
            path.unlink()
            other.append(gpu._try_lock_once(path))  # the other process's new lock file, locked
        return real(fd, holder)

    monkeypatch.setattr(gpu, "flock_and_sign", replaced_first)
    try:
        assert gpu._try_lock(path) is None  # held by the other: not ours as well
        assert state["replaced"] and other[0] is not None
    finally:
        gpu._release(other[0])


def test_the_cleanup_never_unlinks_a_lock_file_made_after_its_open(tmp_path, monkeypatch):
    """Two processes of a job tidy up at once: one unlinks gpu-0.lock after the other opened it, and a
    third process makes a new gpu-0.lock and locks it. The second's flock (on the old file) succeeds; it
    must not unlink the new, held file (a fourth process would lock yet another one: two jobs on GPU 0)."""
    import fcntl

    path = tmp_path / "gpu-0.lock"
    path.write_text("")
    real_flock = fcntl.flock
    held, state = [], {"replaced": False}

    def flock(fd, op):
        if not state["replaced"] and op == fcntl.LOCK_EX | fcntl.LOCK_NB:
            state["replaced"] = True
            path.unlink()
            held.append(gpu._try_lock_once(path))  # the third process's new lock file, locked
        return real_flock(fd, op)

    monkeypatch.setattr(gpu.fcntl, "flock", flock)
    try:
        gpu._remove_job_lock_dir(tmp_path)
        assert state["replaced"] and held[0] is not None
        assert path.is_file() and gpu._same_file(held[0], path)  # the holder's file is still the one at the path
    finally:
        monkeypatch.undo()
        gpu._release(held[0])


def test_a_released_slot_is_free_even_while_a_forked_child_still_holds_its_descriptor(tmp_path, no_cvd):
    """A process forked inside the slot's block (a fork-started worker) inherits the lock file's descriptor and may
    outlive the block: releasing the slot must unlock it (flock LOCK_UN), not only close this process's copy, or the
    GPU stays taken until that child exits."""
    with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=1) as i:
        assert i == 0
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: waits, holding the inherited descriptor, until the test lets it go
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        os.close(r)
    try:
        with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=0.2, poll=0.05) as j:
            assert j == 0
    finally:
        os.close(w)
        os.waitpid(pid, 0)


# ------------------------------------------------------------------ mutation audit 2: gpu_hours' printout, device scripts
def test_gpu_hours_of_bert_base_mrpc_are_the_documented_figures():
    """docs/gpu.md's GPU-hours table, from the H200 files with the default per-step and per-job costs: each
    stage-1 precision's 10,000-step run and its 10 seeds, 342 fine-tuning steps, the stage totals and 7.4 in all."""
    h200 = ROOT / "benchmarks" / "lease" / "h200"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_hours.py"), str(ROOT / "config" / "bert-base-mrpc.yaml"),
                        str(h200 / "run1_gpu_check.json"), str(h200 / "run1_gpu_check_mlm.json"),
                        str(h200 / "run2_prof_eager.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in r.stdout.splitlines() if line.startswith(("pretrain ", "finetune "))}
    assert {k[1]: v for k, v in rows.items() if k[0] == "pretrain"} == {
        "fp32": ["10000", "10.8", "1.80"], "amp_fp16": ["10000", "6.9", "1.15"], "amp_bf16": ["10000", "5.3", "0.89"],
        "pure_fp16": ["10000", "5.1", "0.85"], "pure_bf16": ["10000", "6.1", "1.01"], "tf32": ["10000", "5.4", "0.90"]}
    finetune = [v for k, v in rows.items() if k[0] == "finetune"]
    assert len(finetune) == 8 and all(v[0] == "342" for v in finetune)
    assert "pretrain: 6.6 GPU-hours" in r.stdout and "finetune: 0.7-0.8 GPU-hours" in r.stdout
    assert "total: 7.4 GPU-hours (step overhead 2 ms; per job 25 s stage 1, 18 s stage 2)" in r.stdout


def test_gpu_hours_prints_the_range_of_its_measurements(tmp_path, capsys):
    """Two readings of one step time: a run, its seeds, its stage and the total print fastest-slowest."""
    import yaml

    gh = _gpu_hours()
    cfg = {"seeds": [1, 2, 3, 4], "model": {"init": "scratch", "num_hidden_layers": 4, "hidden_size": 512},
           "schedules": {"a": {"pretrain": "fp32", "finetune": "fp32"}},
           "train": {"pretrain": {"steps": 3600, "batch_size": 128, "max_length": 64},
                     "finetune": {"steps": 360, "batch_size": 16, "max_length": 64}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    fast = _check_json(tmp_path / "a.json", "mlm", 128, 64, 4, 512, {"fp32": 0.998})
    slow = _check_json(tmp_path / "b.json", "mlm", 128, 64, 4, 512, {"fp32": 1.998})
    cls = _check_json(tmp_path / "c.json", "classify", 16, 64, 4, 512, {"fp32": 0.498})
    assert gh.main([str(tmp_path / "c.yaml"), str(fast), str(slow), str(cls), "--stage1-job-s", "0",
                    "--stage2-job-s", "0"]) == 0
    out = capsys.readouterr().out
    # stage 1: 3600 x (1 | 2) s = 60-120 min, x 4 seeds = 4-8 h; stage 2: 360 x 0.5 s = 3 min, 0.2 h
    assert "pretrain  fp32" in out and "60.0-120.0" in out and "4.00-8.00" in out
    assert "pretrain: 4.0-8.0 GPU-hours" in out and "finetune: 0.2 GPU-hours" in out
    assert "total: 4.2-8.2 GPU-hours" in out


def test_gpu_hours_rounds_a_fractional_epoch_count_as_the_engine():
    """0.75 epochs of 10 batches: the engine trains round(7.5) = 8 steps, not 7."""
    gh = _gpu_hours()
    assert gh.stage_steps({"steps": None, "epochs": 0.75, "batch_size": 32}, 330, "finetune") == 8


BENCH_SCRIPTS = ["lease/gpu_lease.sh", "gpu_check"]


@pytest.mark.parametrize("script", BENCH_SCRIPTS)
def test_device_scripts_parse(script):
    """bash -n of every shell script of the GPU check: a syntax error would cost a lent GPU's time."""
    r = subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_gpu_hours_counts_the_schedules_of_a_switch_point_sweep(tmp_path, capsys):
    """A sweep (config/frontier.yaml has one) expands into schedules <name>-at<100 F> in the workflow: each runs
    its jobs. gpu_hours read `schedules` only, so a sweep's jobs were left out of the GPU-hours. Here a stage-2
    sweep from amp_bf16 to fp32 at 0, 0.5 and 1 (3 fine-tuning jobs; its stage 1 is schedule a's), and a stage-1
    sweep from fp32 to amp_bf16 at 0, 0.25 and 1 (F = 0 and 1 are the plain amp_bf16 and fp32 runs: one new
    stage-1 run, the switch at 0.25)."""
    import yaml

    gh = _gpu_hours()
    cfg = {"seeds": [1, 2], "model": {"init": "scratch", "num_hidden_layers": 4, "hidden_size": 512},
           "schedules": {"a": {"pretrain": "fp32", "finetune": "fp32"}, "b": {"pretrain": "amp_bf16", "finetune": "fp32"}},
           "sweeps": {"ft": {"pretrain": "fp32", "finetune": {"precision": "amp_bf16", "switch_to": "fp32"},
                             "switch_at": [0.0, 0.5, 1.0]},
                      "pt": {"pretrain": {"precision": "fp32", "switch_to": "amp_bf16"}, "finetune": "fp32",
                             "switch_at": [0.0, 0.25, 1.0]}},
           "train": {"pretrain": {"steps": 100, "epochs": None, "batch_size": 128, "max_length": 64},
                     "finetune": {"steps": 10, "epochs": None, "batch_size": 16, "max_length": 64}}}
    meas = gh.load_measurements([
        _check_json(tmp_path / "mlm.json", "mlm", 128, 64, 4, 512, {"fp32": 0.498, "amp_bf16": 0.198}),
        _check_json(tmp_path / "cls.json", "classify", 16, 64, 4, 512, {"fp32": 0.098, "amp_bf16": 0.048})])
    res = gh.estimate(cfg, meas, _hours_args())
    assert res["missing"] == []
    pre = sorted(round(j["run_s"][0], 6) for j in res["jobs"] if j["stage"] == "pretrain")
    # fp32 100 x 0.5 + 25 = 75; amp_bf16 100 x 0.2 + 25 = 45; the switch 25 x 0.5 + 75 x 0.2 + 25 = 52.5
    assert pre == [45.0, 52.5, 75.0]
    fine = {j["spec"]: round(j["run_s"][0], 6) for j in res["jobs"] if j["stage"] == "finetune"}
    # fp32 10 x 0.1 + 18 = 19; amp_bf16 10 x 0.05 + 18 = 18.5; half and half 18.75
    assert fine == {"a": 19.0, "b": 19.0, "ft-at0": 19.0, "ft-at50": 18.75, "ft-at100": 18.5, "pt-at0": 19.0,
                    "pt-at25": 19.0, "pt-at100": 19.0}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    assert gh.main([str(tmp_path / "c.yaml"), str(tmp_path / "mlm.json"), str(tmp_path / "cls.json")]) == 0
    assert "8 schedules x 2 seeds" in capsys.readouterr().out



def test_gpu_hours_model_shape_of_a_pretrained_init(tmp_path, capsys):
    """A pretrained model.init has its own sizes: a local directory's config.json, a bert-base / bert-large hub
    name by its family (whatever the path holds: 'base' in a folder name is not BERT-base); anything else is named
    and --shape given instead. (It used to be 12 x 768 whenever 'base' occurred anywhere in the init.)"""
    gh = _gpu_hours()
    local = tmp_path / "base_models" / "my-bert"
    local.mkdir(parents=True)
    (local / "config.json").write_text(json.dumps({"num_hidden_layers": 6, "hidden_size": 512}))
    assert gh.model_shape({"model": {"init": str(local), "num_hidden_layers": 2}}) == (6, 512)
    assert gh.model_shape({"model": {"init": "google-bert/bert-large-cased"}}) == (24, 1024)
    assert gh.model_shape({"model": {"init": str(tmp_path / "base_models" / "bert-large-uncased")}}) == (24, 1024)
    assert gh.model_shape({"model": {"init": "bert-base-cased"}}) == (12, 768)
    assert gh.model_shape({"model": {"init": None, "num_hidden_layers": 4, "hidden_size": 512}}) == (4, 512)
    with pytest.raises(SystemExit, match=r"model.init 'distilbert-base-uncased': its sizes are unknown.*--shape"):
        gh.model_shape({"model": {"init": "distilbert-base-uncased"}})
    # --shape sets them, for any init
    cfg = {"seeds": [1], "model": {"init": "distilbert-base-uncased"},
           "schedules": {"a": {"finetune": "fp32"}},
           "train": {"finetune": {"batch_size": 32, "max_length": 128, "steps": 10}}}
    (tmp_path / "c.yaml").write_text(json.dumps(cfg))
    cls = _fake_check(tmp_path / "cls.json", "classify", 32, {"fp32": 0.048})
    assert gh.main([str(tmp_path / "c.yaml"), str(cls), "--shape", "12,768"]) == 0
    assert "finetune" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        gh.main([str(tmp_path / "c.yaml"), str(cls), "--shape", "12x768"])
    assert "--shape: expected LAYERS,HIDDEN (e.g. 12,768), got '12x768'" in capsys.readouterr().err


# ------------------------------------------------------------------ mutation audit 4 (gpu): slots, claims, provenance
def test_a_timeout_names_who_holds_the_gpus_and_where_the_locks_are(tmp_path, no_cvd):
    """A timeout shorter than WAIT_NOTICE_S printed no holder anywhere ('holders are named in each file'): the
    error itself names each GPU's holder (pid and host, from its lock file) and the lock dir."""
    q = CTX.Queue()
    a = CTX.Process(target=_hold_forever, args=(tmp_path, 1, q))
    a.start()
    try:
        assert q.get(timeout=30) == 0
        with pytest.raises(gpu.GpuSlotTimeout) as e:
            with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=0.2, poll=0.05):
                pass
        msg = str(e.value)
        assert f"gpu-0: pid={a.pid} host=" in msg and f"lock files in {str(tmp_path)!r}" in msg, msg
    finally:
        os.kill(a.pid, signal.SIGKILL)
        a.join(30)


def test_a_wait_shorter_than_the_notice_time_says_nothing(tmp_path, no_cvd, capsys):
    """The 'waiting for a free GPU' line is for a job that really waits (WAIT_NOTICE_S): a short wait for a slot
    another job is about to release leaves the log alone."""
    with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=1):
        with pytest.raises(gpu.GpuSlotTimeout):
            with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=0.2, poll=0.05):
                pass
    assert "waiting for a free GPU" not in capsys.readouterr().err


def test_a_claim_gives_up_after_its_timeout_and_claims_nothing(tmp_path, no_cvd):
    """claim_device(timeout=...) on a GPU another job holds raises GpuSlotTimeout in time (not a wait for ever),
    and leaves no claim behind: a later claim of the freed GPU gets it."""
    with gpu.acquire_gpu_slot(tmp_path, n_devices=1, timeout=1):
        t0 = time.monotonic()
        with pytest.raises(gpu.GpuSlotTimeout):
            gpu.claim_device("cuda", lock_dir=tmp_path, n_devices=1, timeout=0.2, poll=0.05)
        assert time.monotonic() - t0 < 5
        assert gpu.claim_info()["gpu_slot_index"] is None
    try:
        assert str(gpu.claim_device("cuda", lock_dir=tmp_path, n_devices=1, timeout=1)) == "cuda:0"
    finally:
        gpu.release_claim()


def test_a_claim_without_a_device_count_names_the_physical_gpu_torch_counts(tmp_path, monkeypatch):
    """The engine calls claim_device(device) without n_devices: the count (and so the physical id of cuda:1
    under CUDA_VISIBLE_DEVICES=5,7) comes from torch."""
    import torch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    try:
        assert gpu.claim_device("cuda:1", lock_dir=tmp_path, timeout=1) == torch.device("cuda", 1)
        assert gpu.claim_info()["gpu_slot_physical_id"] == "7" and (tmp_path / "gpu-7.lock").is_file()
    finally:
        gpu.release_claim()


def test_a_lock_dir_the_caller_names_is_kept_even_where_it_is_the_jobs_own(tmp_path, no_cvd, monkeypatch):
    """Only a slot taken in the default lock dir tidies the SLURM job's dir away; a caller who names that same
    dir (other processes of the job may be about to lock there) keeps it."""
    monkeypatch.setenv(gpu.LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "55")
    named = gpu.default_lock_dir()
    with gpu.acquire_gpu_slot(named, n_devices=1, timeout=1):
        pass
    assert [f.name for f in named.iterdir()] == ["gpu-0.lock"]


def test_gpu_provenance_without_an_index_describes_the_current_device(monkeypatch):
    """After claim_device set cuda:1 as the current device, gpu_provenance() describes cuda:1, not cuda:0."""
    import torch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    _fake_cuda(monkeypatch, [_props("Fake V100", 7, "aaaa", 0x17), _props("Fake A100", 8, "cccc", 0x65)])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    _fake_nvml(monkeypatch, by_index={})
    info = gpu.gpu_provenance()
    assert (info["gpu_index"], info["gpu_physical_id"], info["name"], info["uuid"]) == (1, "6", "Fake A100", "GPU-cccc")


def test_gpu_provenance_keeps_what_nvml_gave_when_some_readings_fail(monkeypatch):
    """An older driver's NVML lacks the CUDA driver version call, and a GPU may refuse one reading (power limit
    not supported): those fields are None, every other one is still recorded, and nothing raises."""
    _fake_cuda(monkeypatch, [_props("Fake A100", 8, "cccc", 0x65)])
    _fake_nvml(monkeypatch, by_index={})
    nvml = sys.modules["pynvml"]

    def not_supported(*a):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    monkeypatch.setattr(nvml, "nvmlSystemGetCudaDriverVersion", not_supported, raising=False)
    monkeypatch.setattr(nvml, "nvmlDeviceGetEnforcedPowerLimit", not_supported, raising=False)
    info = gpu.gpu_provenance(0)
    assert (info["driver_version"], info["nvml_cuda_driver_version"]) == ("550.54", None)
    assert (info["uuid"], info["power_limit_watts"], info["max_sm_clock_mhz"], info["max_mem_clock_mhz"]) == (
        "GPU-cccc", None, 1410, 1215)
    # no NVML at all (nvidia-ml-py not installed): the CUDA fields, every NVML one None
    monkeypatch.setitem(sys.modules, "pynvml", None)
    info = gpu.gpu_provenance(0)
    assert info["name"] == "Fake A100" and info["compute_capability"] == "8.0"
    assert all(info[k] is None for k in ("driver_version", "nvml_cuda_driver_version", "uuid", "power_limit_watts",
                                         "max_sm_clock_mhz", "max_mem_clock_mhz"))


def test_nvml_finds_a_gpu_without_a_uuid_by_its_pci_bus_id(monkeypatch):
    """Where torch gives no UUID, NVML finds the GPU by its PCI bus id, in NVML's own form (8-digit domain,
    upper-case hex: '00000000:65:00.0'), before falling back to an index."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    _fake_cuda(monkeypatch, [_props("Fake V100", 7, None, 0x17), _props("Fake A100", 8, None, 0xAB)])
    _fake_nvml(monkeypatch, by_index={})  # by index: nothing
    monkeypatch.setattr(sys.modules["pynvml"], "nvmlDeviceGetHandleByPciBusId",
                        lambda bus: {"00000000:17:00.0": "hA", "00000000:AB:00.0": "hC"}[bus])
    assert gpu.gpu_provenance(1)["uuid"] == "GPU-cccc"
    assert gpu.gpu_provenance(0)["uuid"] == "GPU-aaaa"


def test_gpu_hours_refuses_the_sweeps_the_workflow_refuses(tmp_path):
    """A sweep with no swept stage was an IndexError (a traceback); a sweep point named like a schedule replaced
    it, and two points that round to one name counted as one, so the GPU-hours left jobs out. Each is now one line
    naming the file and the config key, with the workflow's message (mutation audit 7)."""
    import yaml

    gh = _gpu_hours()
    sw = {"precision": "amp_bf16", "switch_to": "fp32"}
    for sweeps, schedules, msg in (
            ({"s": {"finetune": "fp32", "switch_at": [0.5]}}, None, "config key sweeps.s: exactly one stage must be swept"),
            ({"s": {"finetune": sw, "switch_at": [0.5]}}, {"s-at50": {"finetune": "fp32"}},
             "config key sweeps.s: schedule 's-at50' (sweep point 0.5) is already a schedule"),
            ({"s": {"finetune": sw, "switch_at": [0.1234561, 0.1234564]}}, None,
             "config key sweeps.s.switch_at[1]: 0.1234564 and 0.1234561 give one schedule name, 's-at12.3456'")):
        cfg = {"sweeps": sweeps, **({"schedules": schedules} if schedules else {})}
        (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
        with pytest.raises(SystemExit) as e:
            gh.study_config(tmp_path / "c.yaml")
        assert str(e.value).startswith(f"gpu_hours: {tmp_path / 'c.yaml'}: not a valid study config: {msg}"), e.value
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"sweeps": {"s": {"finetune": sw, "switch_at": [0.5, 1]}}}))
    assert "s-at50" not in gh.study_config(tmp_path / "c.yaml")["schedules"]  # the config is left as it was


# ------------------------------------------------------------------ gpu_hours.py --extrapolate
_REF_MODEL = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 256,
              "vocab_size": 1000, "max_position_embeddings": 64}


def _ref_json(path, objective, batch, seq, steps_s: dict, model=None):
    path.write_text(json.dumps({
        "schema": "precswitch-gpu-check/1", "objective": objective, "batch": batch, "seq_len": seq,
        "model": model or _REF_MODEL, "device": "cuda", "device_name": "NVIDIA H200",
        "results": [{"precision": p, "variant": "eager", "status": "ok", "step_seconds": s} for p, s in steps_s.items()]}))
    return path


def test_gpu_hours_extrapolates_by_the_largest_ratio_and_marks_it(tmp_path, capsys, monkeypatch):
    """Stage 1: a model 6x as deep as the measured one, at an eighth of its batch, with 5x its ops per step
    (set here): ops is the largest ratio (activations 6/8, FLOPs less, parameters ~4x), so the step takes 5x
    the measured one. Stage 2: the same model as measured at twice the batch: FLOPs and activations 2x, ops
    and parameters 1x, so 2x. Each job is marked, and the ratios are printed."""
    import yaml

    gh = _gpu_hours()
    # 1 layer 60 ops, +40 a layer: 100 at 2 layers, 500 at 12
    monkeypatch.setattr(gh, "_OPS", {("mlm", "fp32"): (60, 100), ("classify", "amp_bf16"): (200, 300)})
    cfg = {"seeds": [1, 2], "tokenizer": {"vocab_size": 1000},
           "model": {**{k: v for k, v in _REF_MODEL.items() if k != "vocab_size"}, "init": "scratch",
                     "num_hidden_layers": 12},
           "schedules": {"a": {"pretrain": "fp32", "finetune": "amp_bf16"}},
           "train": {"pretrain": {"steps": 1000, "batch_size": 1, "max_length": 32},
                     "finetune": {"steps": 100, "batch_size": 16, "max_length": 32}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    mlm = _ref_json(tmp_path / "mlm.json", "mlm", 8, 32, {"fp32": 0.010})
    cls = _ref_json(tmp_path / "cls.json", "classify", 8, 32, {"amp_bf16": 0.004}, {**_REF_MODEL, "num_hidden_layers": 12})
    args = [str(tmp_path / "c.yaml"), str(mlm), str(cls), "--stage1-job-s", "0", "--stage2-job-s", "0",
            "--step-overhead-ms", "0"]
    assert gh.main(args) == 2  # without --extrapolate: named, not guessed
    assert "mlm fp32 batch 1 x 32 (12 layers, 64 hidden)" in capsys.readouterr().err
    assert gh.main([*args, "--extrapolate"]) == 0
    out = capsys.readouterr().out
    # stage 1: 1000 x 0.010 x 5 = 50 s x 2 seeds; stage 2 (same model, batch 16): 100 x 0.004 x 2 = 0.8 s x 2
    assert "pretrain  fp32" in out and " 0.8 " in out and "0.03 *" in out
    assert f"total: {(100 + 1.6) / 3600:.1f} GPU-hours" in out and "* extrapolated" in out
    lines = [ln for ln in out.splitlines() if ln.startswith("  ")]
    assert len(lines) == 2
    assert "mlm fp32 batch 1 x 32 (12 layers, 64 hidden) from batch 8 x 32 (2 layers, 64 hidden; mlm.json)" in lines[0]
    assert "ops x5.00" in lines[0] and "activations x0.75" in lines[0] and "10.0 ms -> 50.0 ms" in lines[0]
    assert "from batch 8 x 32 (12 layers, 64 hidden; cls.json)" in lines[1]
    assert "ops x1.00, FLOPs x2.00, activations x2.00, parameters x1.00: 4.0 ms -> 8.0 ms" in lines[1]
    res = gh.estimate(gh.study_config(tmp_path / "c.yaml"), gh.load_measurements([mlm, cls]),
                      _hours_args(stage1_job_s=0, stage2_job_s=0, step_overhead_ms=0),
                      gh.load_references([mlm, cls]))
    got = {j["stage"]: (j["run_s"], j["extrapolated"]) for j in res["jobs"]}
    assert got == {"pretrain": (pytest.approx((50.0, 50.0)), True), "finetune": (pytest.approx((0.8, 0.8)), True)}
    r = res["extrapolated"][("mlm", "fp32", 1, 32, 12, 64)][0]
    assert r["flops"] < 0.75 and 3 < r["parameters"] < 5 and r["factor"] == 5.0


def test_gpu_hours_extrapolation_uses_measured_shapes_first_and_names_what_it_cannot_scale(tmp_path, capsys,
                                                                                          monkeypatch):
    """A job measured at its own shape keeps its measured time under --extrapolate; a precision measured at no
    shape is still named; --shape is refused with it (the scaling needs the model's own sizes), and so are a
    result that does not record them and a precision whose ops cannot be counted on a CPU (fp8)."""
    import yaml

    gh = _gpu_hours()
    monkeypatch.setattr(gh, "_OPS", {("mlm", "fp32"): (60, 100), ("classify", "fp32"): (60, 100)})
    cfg = {"seeds": [1], "tokenizer": {"vocab_size": 1000},
           "model": {**{k: v for k, v in _REF_MODEL.items() if k != "vocab_size"}, "init": "scratch"},
           "schedules": {"a": {"pretrain": "fp32", "finetune": "fp32"}, "b": {"pretrain": "fp32", "finetune": "pure_bf16"}},
           "train": {"pretrain": {"steps": 1000, "batch_size": 8, "max_length": 32},
                     "finetune": {"steps": 100, "batch_size": 16, "max_length": 32}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    mlm = _ref_json(tmp_path / "mlm.json", "mlm", 8, 32, {"fp32": 0.010})
    cls = _ref_json(tmp_path / "cls.json", "classify", 8, 32, {"fp32": 0.004})
    assert gh.main([str(tmp_path / "c.yaml"), str(mlm), str(cls), "--extrapolate"]) == 2
    assert "classify pure_bf16 batch 16 x 32" in capsys.readouterr().err
    res = gh.estimate(gh.study_config(tmp_path / "c.yaml"), gh.load_measurements([mlm, cls]), _hours_args(),
                      gh.load_references([mlm, cls]))
    pre = [j for j in res["jobs"] if j["stage"] == "pretrain"]
    assert len(pre) == 1 and not pre[0]["extrapolated"] and pre[0]["run_s"][0] == pytest.approx(1000 * 0.012 + 25)
    assert list(res["extrapolated"]) == [("classify", "fp32", 16, 32, 2, 64)]
    with pytest.raises(SystemExit):
        gh.main([str(tmp_path / "c.yaml"), str(mlm), "--extrapolate", "--shape", "2,64"])
    assert "not --shape" in capsys.readouterr().err
    bare = _check_json(tmp_path / "bare.json", "mlm", 8, 32, 2, 64, {"fp32": 0.010})  # layers and hidden only
    with pytest.raises(SystemExit, match="bare.json records no model num_attention_heads, intermediate_size"):
        gh.main([str(tmp_path / "c.yaml"), str(bare), str(cls), "--extrapolate"])
    fp8 = _ref_json(tmp_path / "fp8.json", "classify", 8, 32, {"fp8": 0.004})
    (tmp_path / "f.yaml").write_text(yaml.safe_dump({**cfg, "schedules": {"a": {"pretrain": "fp32", "finetune": "fp8"}}}))
    with pytest.raises(SystemExit, match="--extrapolate: precision 'fp8': its step needs a GPU"):
        gh.main([str(tmp_path / "f.yaml"), str(mlm), str(fp8), "--extrapolate"])


def test_gpu_hours_model_config_reads_a_scratch_config_a_local_model_and_a_hub_family(tmp_path):
    gh = _gpu_hours()
    local = tmp_path / "m"
    local.mkdir()
    (local / "config.json").write_text(json.dumps({**_REF_MODEL, "num_hidden_layers": 3, "model_type": "bert"}))
    assert gh.model_config({"model": {"init": str(local)}})["num_hidden_layers"] == 3
    assert gh.model_config({"model": {"init": "google-bert/bert-base-uncased"}})["vocab_size"] == 30522
    assert gh.model_config({"model": {"init": "bert-base-cased"}}) == {
        "num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072,
        "vocab_size": 28996, "max_position_embeddings": 512}
    with pytest.raises(SystemExit, match="vocab_size"):
        gh.model_config({"model": {"init": "scratch", **_REF_MODEL}})  # no tokenizer.vocab_size
    with pytest.raises(SystemExit, match="roberta-base"):
        gh.model_config({"model": {"init": "roberta-base"}})


def test_gpu_hours_of_bert_small_scratch_extrapolated_from_the_h200_are_the_documented_figures():
    """docs/gpu.md's bert-small-scratch figures: no BERT-small step has run on a GPU; scaled from the H200's
    BERT-base steps (ops counted on this CPU), 12.1 GPU-hours at most, every job marked."""
    h200 = ROOT / "benchmarks" / "lease" / "h200"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_hours.py"), str(ROOT / "config" / "bert-small-scratch.yaml"),
                        str(h200 / "run1_gpu_check.json"), str(h200 / "run1_gpu_check_mlm.json"),
                        str(h200 / "run2_prof_eager.json"), "--extrapolate"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in r.stdout.splitlines() if line.startswith(("pretrain ", "finetune "))}
    assert all(v[-1] == "*" for v in rows.values()) and len(rows) == 14
    assert {k[1]: v[:3] for k, v in rows.items() if k[0] == "pretrain"} == {
        "fp32": ["20000", "18.9", "3.16"], "amp_fp16": ["20000", "12.1", "2.01"], "amp_bf16": ["20000", "9.2", "1.54"],
        "pure_fp16": ["20000", "8.9", "1.48"], "pure_bf16": ["20000", "10.6", "1.76"], "tf32": ["20000", "9.4", "1.56"]}
    assert "pretrain: 11.5 GPU-hours" in r.stdout and "finetune: 0.6 GPU-hours" in r.stdout
    assert "total: 12.1 GPU-hours" in r.stdout
    assert "mlm amp_bf16 batch 128 x 128 (4 layers, 512 hidden) from batch 32 x 128 (12 layers, 768 hidden" in r.stdout
