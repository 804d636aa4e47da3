#!/usr/bin/env python
"""Input pipeline: what building one batch costs, and what `data_workers` takes off the step.

1. Collation cost per batch (Arrow rows -> padding -> masked-LM masks; `Batches.get`, one thread,
   in this process) at the GPU studies' shapes: batch 32 x 128 tokens, median of --batches calls.
   Set against the BERT-base step time that the MFU target implies on an H200 (model FLOPs of the
   engine's step / (35% of 790 TFLOP/s)): an *estimate*, not a GPU measurement.
2. A simulated GPU step: the training loop's host side waits --device-ms per step with the GIL
   released (as it does in torch.cuda.synchronize) and takes its batches from `BatchStream` with
   data_workers 0, 1, 2. Printed: host milliseconds per step spent getting the next batch.
   Target: with data_workers 2, under 10% of the in-process (data_workers 0) cost.
3. The study's engine on this CPU, one fresh process per run, threads 1: steady-state steps/s with
   data_workers 0 and 1, masked LM at 32 x 128. Here the step is CPU compute, so a worker only
   competes with it for cores: why `auto` is 0 on CPU. No target.

Usage: python benchmarks/input_pipeline.py [--steps 80] [--repeats 3] [--batches 200] [--device-ms 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _bench import engine_run, prepare  # noqa: E402

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

BERT_BASE = dict(hidden_size=768, num_hidden_layers=12, intermediate_size=3072, vocab_size=28996)
H200_BF16 = 790e12
TARGET_MFU = 0.35
TARGET_SHARE = 0.10


def collation_ms(data: Path, objective: str, n: int) -> float:
    torch.set_num_threads(1)
    b = _batches(data, objective)
    for s in range(5):
        b.get(s)
    times = []
    for s in range(5, 5 + n):
        t = time.perf_counter()
        b.get(s)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def _batches(data: Path, objective: str) -> Batches:
    hp = C.resolve({"data": str(data), "steps": 1, "objective": objective})
    train, _, meta = _load_data(hp)
    return Batches(_model_columns(train, objective), 32, 0, _make_collator(objective, _load_tokenizer(hp, meta), 0.15))


def host_wait_ms(data: Path, workers: int, steps: int, device_ms: float) -> float:
    """Mean host time per step spent in next(stream) while a simulated device step takes device_ms."""
    stream = _batches(data, "mlm").stream(0, steps + 10, workers=workers)
    waits = []
    for i in range(steps + 10):
        t = time.perf_counter()
        next(stream)
        if i >= 10:  # workers' start-up excluded, as the engine starts them during set-up
            waits.append(time.perf_counter() - t)
        time.sleep(device_ms / 1e3)
    stream.close()
    return 1e3 * statistics.fmean(waits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--device-ms", type=float, default=8.0, help="simulated GPU step (default: the H200 estimate)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        data = prepare(Path(root), max_length=128)
        print("# 1. collation per batch of 32 x 128 tokens, one thread (Batches.get: rows, padding, masks)")
        for obj in ("mlm", "classify"):
            print(f"{obj:<9} {collation_ms(data[obj], obj, a.batches):6.2f} ms")
        for obj in ("mlm", "classify"):
            f = flops.train_step_flops(BERT_BASE, 32, 128, obj, **({"head_rows": flops.engine_head_rows(32, 128)}
                                                                   if obj == "mlm" else {"cls_only_last_layer": True}))
            print(f"# H200 estimate, BERT-base {obj} step at {TARGET_MFU:.0%} MFU of 790 TFLOP/s: "
                  f"{f / 1e12:.2f} TFLOP -> {1e3 * f / (TARGET_MFU * H200_BF16):.1f} ms (not measured)")

        print(f"# 2. simulated GPU step of {a.device_ms:g} ms (host waits, GIL released), {a.batches} steps, mlm: "
              f"host ms per step getting the next batch")
        wait = {w: host_wait_ms(data["mlm"], w, a.batches, a.device_ms) for w in (0, 1, 2)}
        for w, ms in wait.items():
            print(f"data_workers {w}: {ms:6.3f} ms  = {ms / (a.device_ms + ms):5.1%} of the step")
        share = wait[2] / wait[0]
        print(f"# data_workers 2 / 0 host wait = {share:.3f} (target < {TARGET_SHARE}): "
              f"{'PASS' if share < TARGET_SHARE else 'FAIL'}")

        print(f"# 3. engine steps/s on this CPU, mlm 32 x 128, threads 1, {a.steps} steps, median of {a.repeats} processes")
        sps = {}
        for workers in (0, 1):
            runs = [engine_run(data["mlm"], "mlm", "fp32", steps=a.steps, threads=1, data_workers=workers,
                               timing_warmup_steps=5) for _ in range(a.repeats)]
            sps[workers] = statistics.median(r["steps_per_second"] for r in runs)
            print(f"data_workers {workers}: {sps[workers]:7.2f} steps/s  (runs: "
                  + ", ".join(f"{r['steps_per_second']:.2f}" for r in runs) + ")")
        print(f"# data_workers 1 / 0 on CPU = {sps[1] / sps[0]:.2f} (no target: on CPU the worker competes for cores)")


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"# took {time.time() - t0:.0f} s")
