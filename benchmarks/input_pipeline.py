#!/usr/bin/env python
"""Input pipeline: what building one batch costs, and what building it during the step saves.

1. Collation cost per batch (Arrow rows -> padding -> masked-LM masks; `Batches.get`, one thread)
   at the GPU studies' shapes: batch 32 x 128 tokens, median of --batches calls. Set against the
   BERT-base step time that the MFU target implies on an H200 (model FLOPs of the engine's step /
   (35% of 790 TFLOP/s)): an *estimate*, not a GPU measurement.
2. A simulated GPU: each step "launches" --device-ms of device work (a deadline; the host is free
   meanwhile, as after queuing CUDA kernels) and then synchronizes (sleeps until the deadline, GIL
   released, as in torch.cuda.synchronize). The engine builds step t+1's batch between launch and sync (overlap);
   the old loop built it after the sync (serial). Printed: mean step time of each over --batches steps,
   the first 5 (warm-up) left out.
   Reference: the same loop building no batch (so sleep overshoot cancels out). Target: overlap
   <= 1.05 x reference (the batch hides behind the device work); serial shows what it cost before.
   A DataLoader worker process was tried too: on this machine receiving a batch from it cost
   1.4-3.3 ms of host time, as much as building it (docs/gpu.md), so the engine does not use one.

Usage: python benchmarks/input_pipeline.py [--batches 200] [--device-ms 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _bench import positive_float, positive_int, prepare  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
try:
    import precswitch  # noqa: F401
except ModuleNotFoundError:
    sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from precswitch import flops  # noqa: E402
from precswitch.train import config as C  # noqa: E402
from precswitch.train.engine import (  # noqa: E402
    Batches, _load_data, _load_tokenizer, _make_collator, _model_columns,
)

from gpu_check import BASE as BERT_BASE, PEAKS_TFLOPS, TARGET_MFU  # noqa: E402 - the GPU check's model and peak

H200_BF16 = PEAKS_TFLOPS["H200"]["bf16"] * 1e12
TARGET_OVERLAP = 1.05
WARMUP = 5  #: first calls / steps left out of each figure (allocator and cache warm-up)


def collation_ms(data: Path, objective: str, n: int) -> float:
    torch.set_num_threads(1)
    b = _batches(data, objective)
    for s in range(WARMUP):
        b.get(s)
    times = []
    for s in range(WARMUP, WARMUP + n):
        t = time.perf_counter()
        b.get(s)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def _batches(data: Path, objective: str) -> Batches:
    hp = C.resolve({"data": str(data), "steps": 1, "objective": objective})
    train, _, meta = _load_data(hp)
    return Batches(_model_columns(train, objective), 32, 0, _make_collator(objective, _load_tokenizer(hp, meta), 0.15))


def simulated_step_ms(data: Path, steps: int, device_ms: float, overlap: bool | None) -> float:
    """Mean wall time of a step whose device part takes device_ms; the next batch built during it
    (overlap), after it (not overlap) or not at all (None: the device-only reference)."""
    b = _batches(data, "mlm")
    pending = b.get(0)
    times = []
    for step in range(steps):
        t = time.perf_counter()
        batch, pending = pending, None  # noqa: F841 - "copied to the device"
        device_done = time.perf_counter() + device_ms / 1e3  # launch: the device works until then
        if overlap:
            pending = b.get(step + 1)
        left = device_done - time.perf_counter()  # synchronize: wait for the device, if still busy
        if left > 0:
            time.sleep(left)
        if overlap is False:
            pending = b.get(step + 1)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.fmean(times[WARMUP:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=positive_int, default=200)
    ap.add_argument("--device-ms", type=positive_float, default=8.0, help="simulated GPU step (default: the H200 estimate)")
    a = ap.parse_args()
    if a.batches <= WARMUP:
        ap.error(f"--batches {a.batches}: needs more than the {WARMUP} warm-up steps, or no step is timed")
    with tempfile.TemporaryDirectory() as root:
        data = prepare(Path(root), max_length=128)
        print("# 1. collation per batch of 32 x 128 tokens, one thread (Batches.get: rows, padding, masks)")
        for obj in ("mlm", "classify"):
            print(f"{obj:<9} {collation_ms(data[obj], obj, a.batches):6.2f} ms")
        for obj in ("mlm", "classify"):
            f = flops.train_step_flops(BERT_BASE, 32, 128, obj, **({"head_rows": flops.engine_head_rows(32, 128)}
                                                                   if obj == "mlm" else {"cls_only_last_layer": True}))
            print(f"# H200 estimate, BERT-base {obj} step at {TARGET_MFU:.0%} MFU of {H200_BF16 / 1e12:.0f} TFLOP/s: "
                  f"{f / 1e12:.2f} TFLOP -> {1e3 * f / (TARGET_MFU * H200_BF16):.1f} ms (not measured)")

        print(f"# 2. simulated GPU step: {a.device_ms:g} ms of device work, mlm batches, mean of steps "
              f"{WARMUP + 1}-{a.batches} (the first {WARMUP} are warm-up)")
        ref = simulated_step_ms(data["mlm"], a.batches, a.device_ms, overlap=None)
        serial = simulated_step_ms(data["mlm"], a.batches, a.device_ms, overlap=False)
        overlap = simulated_step_ms(data["mlm"], a.batches, a.device_ms, overlap=True)
        print(f"device only, no batch built (reference): {ref:6.2f} ms per step (sleep overshoot included)")
        print(f"next batch after the sync (old loop):    {serial:6.2f} ms per step ({serial / ref:.3f} x reference)")
        print(f"next batch during the step (engine):     {overlap:6.2f} ms per step ({overlap / ref:.3f} x reference)")
        r = overlap / ref
        print(f"# overlap = {r:.3f} x reference (target <= {TARGET_OVERLAP}): {'PASS' if r <= TARGET_OVERLAP else 'FAIL'}")

if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"# took {time.time() - t0:.0f} s")
