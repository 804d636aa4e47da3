"""GPU check: training-step throughput, model FLOP/s, MFU, memory and energy of BERT-base under
every precision of the catalog, with the same precision code as the study (precswitch.precision).

Nothing is downloaded: the model is a BertConfig with random weights, the data synthetic tokens.
Default: BERT-base (12 layers, 768 hidden, vocab 28996 = bert-base-cased), sequence classification,
batch 32, sequence length 128, 10 warm-up steps (excluded; they include torch.compile) and 50
timed steps per precision (more if 50 take under --min-seconds, 2 s, where NVML energy is read),
CUDA-synchronized at both ends of the timed window.

  benchmarks/gpu_check --out gpu_check.json                 # on a GPU: eager AND compiled variants
  benchmarks/gpu_check --mlm --out gpu_check-mlm.json       # masked-LM steps instead
  benchmarks/gpu_check --device cpu --steps 3 --quick       # tiny smoke run on CPU (tests do this)

Targets (on CUDA): steps/s of amp_bf16 over fp32 >= 2.5 (same variant: compiled when both were
compiled, else eager), and MFU of amp_bf16 >= 35% (best variant). Exit 0 when every target passes
(or does not apply: CPU, no peak figure for this GPU, a row it needs skipped), 1 when one fails, which
includes a row it needs failing (out of memory, a compile error). The JSON is written either way.

pure_fp16 runs with AdamW eps 1e-4 (--pure-fp16-eps): 1e-8 rounds to 0 in fp16 and Adam then divides
0 by 0. Every other precision uses eps 1e-8. The engine of the study does not compile the model: the
eager rows are the study's speed; the compiled rows show what the hardware gives (MFU target).
Compiled rows use CUDA graphs (--compile-mode reduce-overhead): on an H200, BERT-base at batch 32 in
16 bits launches ~1,200 kernels per eager step and the host needs ~24 ms to launch them while the GPU
needs ~12 ms, so eager 16-bit steps are host-bound (benchmarks/lease/h200/). --profile-steps N shows it:
kernels, GPU kernel time and host synchronizations per step, and the GPU-busy fraction; and where
the GPU time goes, by kind of kernel (KIND_PATTERNS: matmul, attention, optimizer, layer norm, ...),
with the matmuls' own FLOP rate (model FLOPs / time in matmuls and attention).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import re
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
try:
    import precswitch  # noqa: F401
except ModuleNotFoundError:  # a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from precswitch import flops, gpu, measure  # noqa: E402
from precswitch import precision as P  # noqa: E402
from precswitch.errors import PrecisionUnsupported, PrecswitchError  # noqa: E402
from precswitch.train.engine import (  # noqa: E402
    HEAD_KEYS,
    build_optimizer,
    cls_only_last_layer,
    drop_full_attention_mask,
    forward_loss,
    mlm_head_rows,
    train_step,
)

# ------------------------------------------------------------------ peak FLOP/s, dense, TFLOP/s
#: One table: the peak each precision's MFU is measured against, per GPU (matched by name).
#: H200 SXM: bf16/fp16 = 790, the dense bf16 matmul rate measured on an H200 (769-798 TFLOP/s;
#: the data sheet says 989); tf32 = 395 (half of it, as on the data sheet: 494.5 = 989/2);
#: fp32 = 67 (CUDA cores, no tensor cores; data sheet). H100 SXM: the same silicon and clocks.
PEAKS_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"fp32": 67.0, "tf32": 395.0, "fp16": 790.0, "bf16": 790.0, "fp8": 1580.0},
    "H100": {"fp32": 67.0, "tf32": 395.0, "fp16": 790.0, "bf16": 790.0, "fp8": 1580.0},
}
PEAK_LABELS = {
    "fp32": "fp32 CUDA-core peak (no tensor cores)",
    "tf32": "TF32 tensor-core dense peak",
    "fp16": "fp16 tensor-core dense peak (= measured bf16 matmul)",
    "bf16": "bf16 tensor-core dense matmul, measured",
    "fp8": "fp8 tensor-core dense peak (assumed 2x the measured bf16; not measured here)",
}
TARGET_SPEEDUP = 2.5
TARGET_MFU = 0.35
#: targets' precisions first, amp_bf16 before fp32: when the time budget leaves room for one compiled
#: row only, it is amp_bf16's (the MFU target); fp32 compiled only adds the compiled speed-up
ORDER = ["amp_bf16", "fp32", "tf32", "amp_fp16", "pure_bf16", "pure_fp16", "pure_bf16_kahan", "pure_bf16_sr", "fp8"]

BASE = dict(vocab_size=28996, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
            intermediate_size=3072, max_position_embeddings=512)
#: BERT-small as config/bert-small-scratch.yaml builds it (its own 30,522-word WordPiece vocabulary)
SMALL = dict(vocab_size=30522, hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
             intermediate_size=2048, max_position_embeddings=512)
QUICK = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=256, max_position_embeddings=64)


def peak_key(prec: P.Precision) -> str:
    if prec.fp8_linear:
        return "fp8"
    if prec.tf32:
        return "tf32"
    return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[prec.compute_dtype]


#: board variants of a table's GPU with lower clocks and power (H100 PCIe: 756 TFLOP/s dense bf16 on its data
#: sheet against 989 for SXM; H100/H200 NVL): the SXM row would understate their MFU, so they get none
PEAK_VARIANTS_NOT_IN_TABLE = ("pcie", "nvl")


def find_peaks(device_name: str, overrides: dict[str, float]) -> tuple[str | None, dict[str, float]]:
    name = device_name.lower()
    if any(v in name for v in PEAK_VARIANTS_NOT_IN_TABLE):
        return None, dict(overrides)  # no row for this board: MFU only with --peak
    for key, table in PEAKS_TFLOPS.items():
        if key.lower() in name:
            return key, {**table, **overrides}
    return None, dict(overrides)


# ------------------------------------------------------------------ host-side cost
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def host_launch_us(device, n: int = 2000) -> float | None:
    """Host microseconds per tiny eager op (dispatcher + kernel launch), the floor of an eager step's
    cost per kernel: an eager step of k kernels cannot take less than about k times this."""
    if device.type != "cuda":
        return None
    x = torch.zeros(1, device=device)
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize(device)
    t = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    us = (time.perf_counter() - t) / n * 1e6  # host time only: launches are asynchronous
    torch.cuda.synchronize(device)
    return us


#: What a kernel (CUDA) or an aten op (CPU) does, read from its name: the first pattern that matches.
#: Attention before matmul (flash / cutlass-fmha names say gemm-like things); Inductor's fused Triton
#: kernels are "compiled" (their names list every op they fuse) unless they are matmul templates
#: (triton_tem_, max-autotune); optimizer before foreach (fused AdamW is a multi_tensor_apply kernel).
KIND_PATTERNS: tuple[tuple[str, str], ...] = (
    # not Inductor's pointwise/reduction kernels, whose names list the aten ops they fused (sdpa's included)
    ("attention", r"^(?!triton_(poi|red|per)_).*(flash|fmha|attention|sdpa|scaled_dot_product)"),
    ("matmul", r"gemm|gemv|nvjet|cutlass|xmma|cublas|triton_tem|_scaled_mm|aten::(mm|addmm|bmm|baddbmm)$"),
    ("compiled", r"^triton_|^cpp_fused|CompiledFxGraph"),  # CPU: a compiled graph's own kernels
    ("views_alloc", r"^aten::(view|_unsafe_view|reshape|_reshape_alias|as_strided|empty|empty_like|empty_strided|t|"
                    r"transpose|permute|expand|alias|detach|unsqueeze|squeeze|select|slice|linear|matmul|to|"
                    r"resolve_conj|contiguous)$"),  # CPU only: the dispatcher's cost of views and allocations
    ("optimizer", r"adam|sgd|lamb(?!da)"),  # not "lambda", in many kernels' template names
    ("layer_norm", r"layer_?norm|welford|rms_?norm|gammabeta"),
    ("softmax_ce", r"softmax|nll_loss|cross_entropy|logsumexp"),
    ("embedding", r"embedding|index_select|indexselect|index_put|indexing_backward|index_add|scatter|gather|"
                  r"grad_weight|segment|radix|sort"),
    ("dropout", r"dropout|bernoulli|masked_scale"),  # not "philox": every random kernel (randint) uses it
    ("foreach", r"multi_tensor_apply|foreach|non_finite|update_scale|norm"),
    # not broadcast, nor the elementwise kernels' gpu_kernel_impl_nocast / Load(With|Without)Cast helpers
    ("copy_cast", r"copy|memcpy|memset|(?<!broad)(?<!no)(?<!with)(?<!without)cast|fill|clone|catarray|\bcat\b|zero_"),
    ("elementwise", r"elementwise|gelu|tanh|erf|aten::(add|mul|div|sub|neg|where|masked_fill|ne|eq|lt|gt)_?$"),
    ("reduction", r"reduce|aten::(sum|mean|max|min|amax)$"),
)
_KIND_RES = [(kind, re.compile(rx, re.IGNORECASE)) for kind, rx in KIND_PATTERNS]


def kernel_kind(name: str) -> str:
    """The kind of one CUDA kernel or aten op, by its name (KIND_PATTERNS); "other" if none matches."""
    for kind, rx in _KIND_RES:
        if rx.search(name):
            return kind
    return "other"


def profile_steps(step, batches: list[dict], n: int, device, top: int = 8) -> dict:
    """n more steps under torch.profiler: kernels launched, GPU kernel time and host-blocking
    synchronizations per step. gpu_kernel_ms_per_step against the unprofiled step time says whether a
    step is GPU-bound (close to it) or host-bound (far below it: the GPU waits for the launches).

    Where the time goes, by kind (kernel_kind): on CUDA the kernels' GPU time, on a CPU the aten ops'
    self CPU time (time_basis says which), in ms per step, plus the `top` most expensive names.
    matmul_ms_per_step (matmuls and attention) lets measure_one say how fast the matmuls themselves run:
    an MFU far below the matmuls' own rate is lost in the other kinds, not in the tensor cores."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for i in range(n):
            step(batches[i % len(batches)])
        measure.sync(device)
    kernels, kernel_us, syncs, items = 0, 0.0, 0, 0
    by_kind: dict[str, float] = {}
    names: list[tuple[float, int, str]] = []
    for e in prof.key_averages():
        if e.key in SYNC_CALLS:
            syncs += e.count
            continue
        if e.key == "aten::_local_scalar_dense":  # .item(), bool(tensor): a value the host waits for
            items += e.count
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
            kernels += e.count
            kernel_us += us
        elif not cuda and (e.key.startswith("aten::") or "CompiledFxGraph" in e.key):
            us = e.self_cpu_time_total  # a CPU has no kernels: its ops' own time is the step's work
        else:
            continue  # on CUDA the host-side ops: their time is the launches', not the work's
        kind = kernel_kind(e.key)
        by_kind[kind] = by_kind.get(kind, 0.0) + us
        names.append((us, e.count, e.key))
    last_sync = 1  # the one measure.sync after the n steps
    names.sort(reverse=True)
    return {"profiled_steps": n, "kernels_per_step": kernels / n, "gpu_kernel_ms_per_step": kernel_us / 1000 / n,
            "host_syncs_per_step": max(syncs - last_sync, 0) / n, "host_item_calls_per_step": items / n,
            "time_basis": "gpu_kernel_time" if cuda else "cpu_op_self_time",
            "ms_per_step_by_kind": {k: v / 1000 / n for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "matmul_ms_per_step": (by_kind.get("matmul", 0.0) + by_kind.get("attention", 0.0)) / 1000 / n,
            "top_kernels": [{"name": k[:200], "kind": kernel_kind(k), "ms_per_step": us / 1000 / n,
                             "calls_per_step": c / n} for us, c, k in names[:top]]}


# ------------------------------------------------------------------ one measurement
def make_batches(cfg: dict, batch: int, seq: int, mlm: bool, device, n: int = 4,
                 engine_step: bool = True) -> list[dict]:
    """n synthetic batches of full-length rows (no padding) on device; for the engine's step (as the
    engine builds them) with the masked-LM head's rows selected and the all-ones mask dropped on the host."""
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(n):
        ids = torch.randint(1000 if cfg["vocab_size"] > 2000 else 5, cfg["vocab_size"], (batch, seq), generator=g)
        b = {"input_ids": ids, "attention_mask": torch.ones(batch, seq, dtype=torch.long),
             "token_type_ids": torch.zeros(batch, seq, dtype=torch.long)}
        if mlm:
            masked = torch.rand(batch, seq, generator=g) < 0.15
            masked[:, 1] = True  # at least one masked token per sequence
            b["labels"] = torch.where(masked, ids, torch.full_like(ids, -100))
            b["input_ids"] = torch.where(masked, torch.full_like(ids, 4), ids)  # a [MASK]-like id
        else:
            b["labels"] = torch.randint(0, 2, (batch,), generator=g)
        if mlm:  # the engine selects the head's rows on the host, with the batch (engine.host_batch)
            b.update(zip(HEAD_KEYS, mlm_head_rows(b["labels"])))
        if engine_step:
            drop_full_attention_mask(b)
        out.append({k: v.to(device) for k, v in b.items()})
    return out


_FP8_PROBE: dict[str, str | None] = {}


def fp8_import_problem() -> str | None:
    """Why torchao's float8 training cannot be imported here (None: it can), found in a child process,
    once: a compiled extension that aborts on import (an ABI mismatch with this torch) then costs the fp8
    rows, not the rows still to come in this process."""
    if "fp8" not in _FP8_PROBE:
        import subprocess

        code = "from torchao.float8 import convert_to_float8_training"
        try:
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            err = None if r.returncode == 0 else (f"import torchao.float8 failed (exit {r.returncode}): "
                                                  + (r.stderr.strip().splitlines() or [""])[-1][:300])
        except subprocess.TimeoutExpired:
            err = "import torchao.float8 took over 120 s"
        _FP8_PROBE["fp8"] = err
    return _FP8_PROBE["fp8"]


class BuiltStep:
    """One precision's training step as measure_one times it (build_step): the model, optimizer and scaler
    it updates and step(batch) -> loss."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def build_step(name: str, cfg: dict, device, *, mlm: bool, step_kind: str = "engine", attn: str | None = None,
               fused: bool = True, lr: float = 2e-5, eps: float = 1e-8, variant: str = "eager",
               compile_mode: str = "reduce-overhead", seed: int = 0) -> BuiltStep:
    """The training step of precision `name` for a BertConfig(**cfg) on device: the engine's own
    (engine.build_optimizer, engine.train_step: forward and loss under the precision's autocast, backward
    scaled for fp16, gradient clipping at 1.0, AdamW fused or foreach, wrapped for Kahan / stochastic rounding)
    with the engine's loss (masked-LM head on the masked rows only, [CLS]-only last layer for classification)
    or, step_kind "hf", the stock model(**batch).loss. Used by measure_one (timed) and count_ops (counted)."""
    from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification

    prec = P.get(name)
    objective = "mlm" if mlm else "classify"
    torch.manual_seed(seed)
    bcfg = BertConfig(**cfg, num_labels=2, attn_implementation=attn)
    if not mlm:  # else the first forward sets it, and a compiled step recompiles on the second
        bcfg.problem_type = "single_label_classification"
    model = (BertForMaskedLM if mlm else BertForSequenceClassification)(bcfg)
    model = prec.prepare_model(model).to(device)
    cls_only = step_kind == "engine" and not mlm and not prec.fp8_linear
    if cls_only:
        cls_only_last_layer(model)  # the engine's classification step (fp8 keeps full shapes, as there)
    model.train()
    hp = {"lr": lr, "weight_decay": 0.01, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_eps": eps,
          "optimizer_impl": "fused" if fused else "foreach", "seed": 0}
    opt = build_optimizer(model, hp, prec)  # the engine's AdamW groups, Kahan / SR wrappers included
    scaler = prec.make_scaler(device.type)
    if step_kind == "engine":
        loss_of = forward_loss
    else:
        def loss_of(model, b, objective):  # noqa: ARG001 - stock: every token scored by the model's own loss
            return model(**{k: v for k, v in b.items() if k not in HEAD_KEYS}).loss
    step_model = torch.compile(loss_of, mode=compile_mode) if variant == "compiled" else loss_of

    cudagraphs = variant == "compiled" and compile_mode in ("reduce-overhead", "max-autotune")

    def step(b):
        return train_step(model, b, opt, scaler, prec, objective=objective, device_type=device.type,
                          loss_fn=step_model, max_grad_norm=1.0, cudagraphs=cudagraphs).loss

    return BuiltStep(step=step, model=model, opt=opt, scaler=scaler, bcfg=bcfg, cls_only=cls_only,
                     cudagraphs=cudagraphs)


def count_ops(cfg: dict, name: str, *, mlm: bool, batch: int = 2, seq: int = 16, attn: str | None = "sdpa",
              width: int | None = 64) -> int:
    """Aten ops one eager training step of precision `name` dispatches (build_step, counted on a CPU on the
    second step: AdamW's first creates its state). On a GPU each of them is host work (a kernel launch, or a
    view or allocation), which is what an eager step's host time is made of: the op count of two models' steps
    scales the host time measured for one to the other (gpu_hours.py --extrapolate). The count depends on the
    layers and the step, not on widths, batch or sequence length (tests/test_engine_gpu_slots.py), so a copy of the model
    narrowed to `width` (default 64; None: cfg's own widths) is counted. tf32 is fp32's step with a backend
    flag: fp32's count."""
    from torch.utils._python_dispatch import TorchDispatchMode

    if name == "tf32":
        name = "fp32"
    if P.get(name).fp8_linear:
        raise PrecswitchError(f"precision {name!r}: its step needs a GPU (fp8 matmuls); its ops are not counted on a CPU")
    narrow = dict(cfg) if width is None else {
        **cfg, "hidden_size": width, "num_attention_heads": 2, "intermediate_size": 4 * width,
        "vocab_size": min(int(cfg.get("vocab_size", 1000)), 1000), "max_position_embeddings": max(seq, 64)}
    eps = 1e-4 if name == "pure_fp16" else 1e-8
    device = torch.device("cpu")
    built = build_step(name, narrow, device, mlm=mlm, attn=attn, eps=eps)
    batches = make_batches(narrow, batch, seq, mlm, device, n=2)
    built.step(batches[0])

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        built.step(batches[1])
    return Count.n


def measure_one(name: str, variant: str, args, cfg: dict, device, batches: list[dict], peaks: dict) -> dict:
    prec = P.get(name)
    objective = "mlm" if args.mlm else "classify"
    eps = args.pure_fp16_eps if name == "pure_fp16" else args.adam_eps
    fused = args.fused in ("on", "auto")  # the engine's default (optimizer_impl: fused), CPU and CUDA
    row = {
        "precision": name, "variant": variant, "status": "ok", "reason": None, "description": prec.description,
        "param_dtype": P.dtype_name(prec.param_dtype),
        "autocast_dtype": P.dtype_name(prec.autocast_dtype) if prec.autocast_dtype else None,
        "loss_scaling": prec.loss_scaling, "adam_eps": eps, "fused_adamw": fused, "compiled": variant == "compiled",
    }
    try:
        P.check_supported(prec, device)
    except PrecisionUnsupported as e:
        return {**row, "status": "skipped", "reason": str(e)}
    if prec.fp8_linear and (problem := fp8_import_problem()):
        return {**row, "status": "error", "reason": problem}
    flags = prec.apply_backend_flags()
    row.update(flags)
    built = step = scaler = None
    try:
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        measure.reset_peak_memory(device)
        built = build_step(name, cfg, device, mlm=args.mlm, step_kind=args.step, attn=args.attn, fused=fused,
                           lr=args.lr, eps=eps, variant=variant, compile_mode=args.compile_mode)
        step, bcfg, scaler, cls_only = built.step, built.bcfg, built.scaler, built.cls_only

        t_w = time.perf_counter()
        for i in range(args.warmup):
            step(batches[i % len(batches)])
        measure.sync(device)
        row["warmup_steps"] = args.warmup
        row["warmup_seconds"] = time.perf_counter() - t_w  # includes compilation
        e0 = measure.nvml_energy_mj(device)
        measure.sync(device)
        t0 = time.perf_counter()
        losses = []
        # at least --steps steps, and on CUDA at least --min-seconds of them: NVML's energy counter over a
        # half-second window (amp_bf16 with CUDA graphs: 50 steps in 0.5 s) is too coarse
        min_s = args.min_seconds if e0 is not None else 0.0
        n = 0
        while n < args.steps or time.perf_counter() - t0 < min_s:
            losses.append(step(batches[n % len(batches)]))  # detached (a copy under CUDA graphs: train_step)
            n += 1
        measure.sync(device)
        seconds = time.perf_counter() - t0
        e1 = measure.nvml_energy_mj(device)
        final = float(losses[-1].float())
        mem = measure.peak_memory(device)
        engine_kw = {}
        if args.step == "engine" and args.mlm:  # rows the sparse head scored, averaged over the batches
            engine_kw["head_rows"] = round(statistics.fmean(
                flops.padded_head_rows(int((b["labels"] != -100).sum())) for b in batches))
        elif cls_only:
            engine_kw["cls_only_last_layer"] = True
        step_flops = flops.train_step_flops(bcfg, args.batch, args.seq, objective, **engine_kw)
        key = peak_key(prec)
        peak = peaks.get(key)
        achieved = step_flops * n / seconds
        row.update(
            steps_measured=n,
            seconds=seconds,
            step_seconds=seconds / n,
            steps_per_second=n / seconds,
            samples_per_second=n * args.batch / seconds,
            tokens_per_second=n * args.batch * args.seq / seconds,
            model_flops_per_step=step_flops,
            achieved_tflops=achieved / 1e12,
            peak_key=key,
            peak_tflops=peak,
            mfu=achieved / (peak * 1e12) if peak else None,
            peak_memory_bytes=mem["peak_memory_bytes"],
            memory_kind=mem["memory_kind"],
            peak_reserved_bytes=mem.get("cuda_max_reserved_bytes"),
            energy_joules_per_step=(e1 - e0) / 1000 / n if e0 is not None and e1 is not None else None,
            energy_window_seconds=seconds if e0 is not None and e1 is not None else None,
            final_loss=final if math.isfinite(final) else None,
            loss_finite=math.isfinite(final),
            loss_scale_end=float(scaler.get_scale()) if scaler is not None else None,
        )
        if args.profile_steps:  # after the timed row is complete: a profiler failure must not lose it
            try:
                row.update(profile_steps(step, batches, args.profile_steps, device))
            except Exception as e:  # noqa: BLE001 - CUPTI/Kineto trouble: the row keeps its timing
                row["profile_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            if row.get("gpu_kernel_ms_per_step"):
                row["gpu_busy_fraction"] = row["gpu_kernel_ms_per_step"] / 1000 / row["step_seconds"]
        if row.get("matmul_ms_per_step"):  # the matmuls' own rate, and the step's share they take
            row["matmul_tflops"] = step_flops / (row["matmul_ms_per_step"] / 1000) / 1e12
            row["matmul_share_of_step"] = row["matmul_ms_per_step"] / 1000 / row["step_seconds"]
    except Exception as e:  # noqa: BLE001 - one failing variant (OOM, compile error) must not end the check
        row.update(status="failed", reason=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500])
    finally:
        built = step = scaler = None  # the step's closure holds the model and optimizer: free them
        try:  # after a sticky CUDA error these raise again: the row already says what failed
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if variant == "compiled":
                torch._dynamo.reset()
        except Exception as e:  # noqa: BLE001
            row.setdefault("cleanup_error", f"{type(e).__name__}: {e}"[:300])
    return row


# ------------------------------------------------------------------ summary
def checks_from(rows: list[dict], device) -> tuple[dict, list[dict]]:
    ok = {(r["precision"], r["variant"]): r for r in rows if r["status"] == "ok"}
    ratios = {}
    for variant in ("eager", "compiled"):
        base = ok.get(("fp32", variant))
        for r in rows:
            if r["status"] == "ok" and r["variant"] == variant and base is not None and r["precision"] != "fp32":
                ratios[f"{r['precision']}/fp32 ({variant})"] = r["steps_per_second"] / base["steps_per_second"]
    variant = "compiled" if ("fp32", "compiled") in ok and ("amp_bf16", "compiled") in ok else "eager"
    fp32, bf16 = ok.get(("fp32", variant)), ok.get(("amp_bf16", variant))
    speed = bf16["steps_per_second"] / fp32["steps_per_second"] if fp32 and bf16 else None
    mfus = [r["mfu"] for r in rows if r["status"] == "ok" and r["precision"] == "amp_bf16" and r["mfu"] is not None]
    best_mfu = max(mfus) if mfus else None
    bf16_ran = any(r["status"] == "ok" and r["precision"] == "amp_bf16" for r in rows)
    on_gpu = device.type == "cuda"

    # a row a target needs that crashed (out of memory, a compile error) fails the target on a GPU: the
    # check could not show it is met; a skipped row (unsupported precision, time budget) leaves it n/a
    speed_broken = [r for r in rows if r["status"] == "failed" and r["variant"] == variant
                    and r["precision"] in ("fp32", "amp_bf16")]
    mfu_broken = [] if bf16_ran else [r for r in rows if r["status"] == "failed" and r["precision"] == "amp_bf16"]

    def verdict(value, target, broken):
        if not on_gpu:
            return "n/a"
        if value is None:
            return "FAIL" if broken else "n/a"
        return "PASS" if value >= target else "FAIL"

    def failed_note(broken):
        return "; ".join(f"{r['precision']} ({r['variant']}) failed: {r.get('reason')}" for r in broken)

    checks = [
        {"name": "speedup_amp_bf16_over_fp32", "variant": variant, "value": speed, "target": TARGET_SPEEDUP,
         "result": verdict(speed, TARGET_SPEEDUP, speed_broken),
         "note": ("targets apply to a GPU; on CPU the value is informational" if not on_gpu
                  else failed_note(speed_broken) if speed is None and speed_broken else None)},
        {"name": "mfu_amp_bf16", "variant": "best", "value": best_mfu, "target": TARGET_MFU,
         "result": verdict(best_mfu, TARGET_MFU, mfu_broken),
         "note": None if best_mfu is not None else ("no peak FLOP/s known for this device (see PEAKS_TFLOPS, --peak)"
                                                    if bf16_ran else failed_note(mfu_broken) if mfu_broken
                                                    else "no amp_bf16 row measured (skipped or not requested)")},
    ]
    return ratios, checks


def fmt(v, spec=".2f", scale=1.0):
    return "-" if v is None else format(v * scale, spec)


def print_kinds(prof: list[dict], top: int = 4) -> None:
    """Profiled rows' time by kind (ms per step), the matmuls' own rate, and the top kernels."""
    order = [k for k, _ in KIND_PATTERNS] + ["other"]
    kinds = [k for k in order if any(r.get("ms_per_step_by_kind", {}).get(k) for r in prof)]
    if not kinds:
        return
    basis = "GPU kernel time" if prof[0].get("time_basis") == "gpu_kernel_time" else "CPU time of aten ops"
    print(f"\n{basis} by kind, ms per step; matmul TFLOP/s = model FLOPs / time in matmuls and attention:")
    print(f"  {'precision':<15} {'variant':<9} " + " ".join(f"{k[:11]:>11}" for k in kinds)
          + f" {'matmul TFLOP/s':>14} {'matmul share':>12}")
    for r in prof:
        by = r.get("ms_per_step_by_kind", {})
        print(f"  {r['precision']:<15} {r['variant']:<9} " + " ".join(f"{fmt(by.get(k, 0.0), '.2f'):>11}" for k in kinds)
              + f" {fmt(r.get('matmul_tflops'), '.1f'):>14} {fmt(r.get('matmul_share_of_step'), '.0%'):>12}")
    for r in prof:
        print(f"  top {top}, {r['precision']} {r['variant']}: " + "; ".join(
            f"{k['name'][:60]} ({k['kind']}) {k['ms_per_step']:.2f} ms x{k['calls_per_step']:.0f}"
            for k in r.get("top_kernels", [])[:top]))


def print_table(res: dict) -> None:
    print(f"\nprecswitch gpu_check: {res['device_name']} ({res['device']}), {res['objective']}, "
          f"batch {res['batch']} x seq {res['seq_len']}, {res['steps']} timed steps after {res['warmup']} warm-up"
          + (f" (more where {res['steps']} took under {res['min_seconds']:g} s: NVML energy window)"
             if res.get("min_seconds") and res.get("device") == "cuda" else ""))
    head = f"{'precision':<10} {'variant':<9} {'status':<8} {'step/s':>8} {'tok/s':>10} {'TFLOP/s':>8} " \
           f"{'peak':>6} {'MFU%':>6} {'alloc GiB':>9} {'resv GiB':>9} {'J/step':>7}  note"
    print(head)
    print("-" * len(head))
    for r in res["results"]:
        note = r.get("reason") or ("" if r.get("loss_finite", True) else "NON-FINITE LOSS")
        if r["precision"] == "pure_fp16" and r["status"] == "ok":
            note = f"adam_eps {r['adam_eps']:g} " + note
        print(f"{r['precision']:<10} {r['variant']:<9} {r['status']:<8} {fmt(r.get('steps_per_second')):>8} "
              f"{fmt(r.get('tokens_per_second'), '.0f'):>10} {fmt(r.get('achieved_tflops'), '.2f'):>8} "
              f"{fmt(r.get('peak_tflops'), '.0f'):>6} {fmt(r.get('mfu'), '.1f', 100):>6} "
              f"{fmt(r.get('peak_memory_bytes'), '.2f', 2**-30):>9} {fmt(r.get('peak_reserved_bytes'), '.2f', 2**-30):>9} "
              f"{fmt(r.get('energy_joules_per_step'), '.2f'):>7}  {note[:90]}")
    prof = [r for r in res["results"] if r.get("profiled_steps") and r.get("status") == "ok"]
    for r in res["results"]:
        if r.get("profile_error"):
            print(f"  profiling {r['precision']} {r['variant']} failed (its timing above stands): {r['profile_error']}")
    if prof:
        print(f"\nwhere a step's time goes (torch.profiler over {prof[0]['profiled_steps']} more steps; host cost of one "
              f"tiny eager op: {fmt(res.get('host_launch_us'), '.1f')} us):")
        print(f"  {'precision':<15} {'variant':<9} {'step ms':>8} {'GPU ms':>8} {'GPU busy':>8} {'kernels':>8} {'syncs':>6}")
        for r in prof:
            print(f"  {r['precision']:<15} {r['variant']:<9} {fmt(r['step_seconds'], '.2f', 1000):>8} "
                  f"{fmt(r['gpu_kernel_ms_per_step'], '.2f'):>8} {fmt(r.get('gpu_busy_fraction'), '.0%'):>8} "
                  f"{fmt(r['kernels_per_step'], '.0f'):>8} {fmt(r['host_syncs_per_step'], '.1f'):>6}")
        print_kinds(prof)
    print("\nratios (steps/s over fp32):")
    for k, v in res["ratios"].items():
        print(f"  {k:<28} {v:.2f}x")
    print("\nchecks:")
    for c in res["checks"]:
        val = "-" if c["value"] is None else (f"{c['value']:.2f}x" if "speedup" in c["name"] else f"{100 * c['value']:.1f}%")
        tgt = f"{c['target']:.2f}x" if "speedup" in c["name"] else f"{100 * c['target']:.0f}%"
        print(f"  {c['name']:<28} {val:>8}  target >= {tgt:<6} {c['result']}" + (f"  ({c['note']})" if c["note"] else ""))
    print(f"\npeaks ({res['peaks_key'] or 'unknown device: MFU not computed'}): "
          + ", ".join(f"{k} {v:g} TFLOP/s" for k, v in res["peaks_used"].items()))


# ------------------------------------------------------------------ main
def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", help="auto | cuda | cuda:N | cpu (default auto)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per precision (default 50; quick 3)")
    p.add_argument("--warmup", type=int, default=None, help="untimed warm-up steps (default 10; quick 1)")
    p.add_argument("--quick", action="store_true", help="tiny BERT (2 layers, 64 hidden), batch 8, seq 32")
    p.add_argument("--small", action="store_true", help="BERT-small of config/bert-small-scratch.yaml instead of BERT-base")
    p.add_argument("--mlm", action="store_true", help="masked-LM steps (BertForMaskedLM) instead of classification")
    p.add_argument("--precisions", default=",".join(ORDER), help="comma-separated subset of the catalog")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default 32; quick 8)")
    p.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 128; quick 32)")
    p.add_argument("--attn", choices=["sdpa", "eager"], default=None, help="attention kernel (default sdpa on CUDA, eager on CPU)")
    p.add_argument("--compile", choices=["auto", "on", "off", "only"], default="auto",
                   help="torch.compile: auto = on for CUDA (eager AND compiled rows), off = eager only, "
                        "only = compiled rows only")
    p.add_argument("--compile-mode", default="reduce-overhead",
                   help="torch.compile mode of the compiled rows (default 'reduce-overhead': CUDA graphs; on an H200 "
                        "at batch 32 mode 'default' left the 16-bit step as host-bound as eager, benchmarks/lease/h200/)")
    p.add_argument("--fused", choices=["auto", "on", "off"], default="auto", help="fused AdamW (default on, like the engine's optimizer_impl: fused; off = foreach)")
    p.add_argument("--step", choices=["engine", "stock"], default="engine",
                   help="engine (default): the study's step (masked-LM head on masked rows only, [CLS]-only "
                        "last layer for classification; FLOPs counted as done); stock: model(**batch).loss")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--adam-eps", type=float, default=1e-8, help="AdamW eps of every precision but pure_fp16")
    p.add_argument("--pure-fp16-eps", type=float, default=1e-4, help="AdamW eps of pure_fp16 (1e-8 is 0 in fp16)")
    p.add_argument("--peak", action="append", default=[], metavar="KEY=TFLOPS",
                   help="override/add a peak (keys fp32, tf32, fp16, bf16, fp8), e.g. --peak bf16=989")
    p.add_argument("--budget-seconds", type=float, default=450.0,
                   help="skip a compiled variant that would end after this many seconds, judged by the costliest compiled "
                        "row so far (60 s before the first) (default 450)")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="after the timed window, profile this many more steps: kernels, GPU kernel time and host "
                        "synchronizations per step, GPU-busy fraction (default 0: off)")
    p.add_argument("--min-seconds", type=float, default=2.0,
                   help="where NVML energy is read (CUDA), time at least this many seconds of steps, more than "
                        "--steps if need be, so the energy counter's window is not too short (default 2)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    p.add_argument("--no-slot", action="store_true", help="do not take a GPU slot lock (precswitch.gpu)")
    p.add_argument("--out", default="gpu_check.json", help="JSON results path (default gpu_check.json)")
    a = p.parse_args(argv)
    a.steps = a.steps or (3 if a.quick else 50)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.quick else 10)
    a.batch = a.batch or (8 if a.quick else 32)
    a.seq = a.seq or (32 if a.quick else 128)
    return a


def parse_peaks(items: list[str]) -> dict[str, float]:
    """--peak KEY=TFLOPS items -> {key: TFLOP/s}; a key outside the table's (a typo would leave the table's figure
    in place, silently) or a value that is not a positive number raises ValueError naming the item."""
    out = {}
    for item in items:
        k, eq, v = item.partition("=")
        k = k.strip()
        if not eq:
            raise ValueError(f"--peak {item!r}: expected KEY=TFLOPS, e.g. --peak bf16=989")
        if k not in PEAK_LABELS:
            raise ValueError(f"--peak {item!r}: unknown key {k!r}; allowed: {', '.join(PEAK_LABELS)} "
                             "(KEY=TFLOPS, e.g. --peak bf16=989)")
        try:
            out[k] = float(v)
        except ValueError:
            out[k] = float("nan")
        if not out[k] > 0 or math.isinf(out[k]):
            raise ValueError(f"--peak {item!r}: {k}'s peak must be a positive number of TFLOP/s")
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    # the options are checked before anything waits for a GPU slot or builds a model
    names = [n.strip() for n in args.precisions.split(",") if n.strip()]
    try:
        for n in names:
            P.get(n)
        overrides = parse_peaks(args.peak)
    except (ValueError, PrecswitchError) as e:
        print(f"gpu_check: error: {'--precisions: ' if isinstance(e, PrecswitchError) else ''}{e}", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            print(f"gpu_check: error: --device {args.device} but no CUDA GPU is visible", file=sys.stderr)
            return 2
    if device.type == "cuda" and not args.no_slot:
        device = gpu.claim_device(device)  # one timed job per GPU, also against a running study
    args.attn = args.attn or ("sdpa" if device.type == "cuda" else "eager")
    if device.type == "cuda":
        dev_name = torch.cuda.get_device_name(device)
        prov = gpu.gpu_provenance(device.index)
    else:
        dev_name = measure.provenance(device)["device_name"]
        prov = {"name": dev_name, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count()}
    key, peaks = find_peaks(dev_name, overrides) if device.type == "cuda" else (None, dict(overrides))
    compile_on = args.compile in ("on", "only") or (args.compile == "auto" and device.type == "cuda")
    variants = (["eager"] if args.compile != "only" else []) + (["compiled"] if compile_on else [])
    cfg = QUICK if args.quick else SMALL if args.small else BASE
    batches = make_batches(cfg, args.batch, args.seq, args.mlm, device, engine_step=args.step == "engine")
    launch_us = host_launch_us(device)
    if launch_us is not None:
        print(f"gpu_check: host cost of one tiny eager op (dispatch + launch): {launch_us:.1f} us", file=sys.stderr)

    rows = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    from precswitch.io import atomic_write_json

    def result(final: bool) -> dict:
        ratios, checks = checks_from(rows, device)
        return {
            "schema": "precswitch-gpu-check/1",
            "complete": final,  # false: written after a row, more rows were to come
            "started_at": started,
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "wall_seconds": time.perf_counter() - t_start,
            "device": device.type,
            "device_name": dev_name,
            "provenance": prov,
            "host_launch_us": launch_us,
            "gpu_slot": gpu.claim_info(),
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "git_commit": measure.git_commit(),
            "objective": "mlm" if args.mlm else "classify",
            "model": cfg,
            "quick": args.quick,
            "batch": args.batch,
            "seq_len": args.seq,
            "steps": args.steps,
            "warmup": args.warmup,
            "min_seconds": args.min_seconds,
            "timing": "one window of --steps steps per row (more while under --min-seconds where NVML energy is "
                      "read: steps_measured), CUDA-synchronized at both ends; warm-up excluded",
            "attn_implementation": args.attn,
            "step": args.step,
            "compile_mode": args.compile_mode if compile_on else None,
            "adam_eps": args.adam_eps,
            "pure_fp16_adam_eps": args.pure_fp16_eps,
            "peaks_table": PEAKS_TFLOPS,
            "peak_labels": PEAK_LABELS,
            "peaks_key": key,
            "peaks_used": peaks,
            "results": rows,
            "ratios": ratios,
            "checks": checks,
        }

    compile_cost = None
    for variant in variants:
        for name in names:
            elapsed = time.perf_counter() - t_start
            if variant == "compiled" and elapsed + (compile_cost or 60.0) > args.budget_seconds:
                rows.append({"precision": name, "variant": variant, "status": "skipped",
                             "reason": f"time budget: {elapsed:.0f} s used of --budget-seconds {args.budget_seconds:g}"})
                continue
            print(f"gpu_check: {name} ({variant}) ...", file=sys.stderr, flush=True)
            row = measure_one(name, variant, args, cfg, device, batches, peaks)
            rows.append(row)
            print(f"gpu_check: {name} ({variant}): {row['status']}"
                  + (f", {row['steps_per_second']:.2f} steps/s" if row.get("steps_per_second") else "")
                  + (f", MFU {row['mfu']:.1%}" if row.get("mfu") else "")
                  + (f", {row['reason']}" if row.get("reason") else ""), file=sys.stderr, flush=True)
            atomic_write_json(out, result(final=False))  # a run cut off by a time limit keeps its rows
            if variant == "compiled" and row.get("warmup_seconds"):
                compile_cost = max(compile_cost or 0.0, row["warmup_seconds"] + row.get("seconds", 0.0))
    res = result(final=True)
    checks = res["checks"]
    atomic_write_json(out, res)
    print_table(res)
    print(f"\nresults: {out}  ({res['wall_seconds']:.0f} s)")
    return 1 if any(c["result"] == "FAIL" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
