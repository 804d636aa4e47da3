#!/usr/bin/env python
"""Input pipeline: what building one batch costs, and what `data_workers` takes off the step.

1. Collation cost per batch (Arrow rows -> padding -> masked-LM masks; `Batches.get`, one thread,
   in this process) at the GPU studies' shapes: batch 32 x 128 tokens, median of --batches calls.
   Set against the BERT-base step time that the MFU target implies on an H200 (model FLOPs of the
   engine's step / (35% of 790 TFLOP/s)): an *estimate*, not a GPU measurement.
2. The study's engine on this CPU, one fresh process per run, threads 1: steady-state steps/s with
   data_workers 0 (batches built between steps) and 1 (a worker process builds them ahead), masked
   LM at 32 x 128. With a free core for the worker, the ratio shows the collation leaving the step.
   Target: data_workers 1 >= 1.05x data_workers 0 here (the share collation takes of a CPU step).

Usage: python benchmarks/input_pipeline.py [--steps 80] [--repeats 3] [--batches 200]
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
TARGET_RATIO = 1.05


def collation_ms(data: Path, objective: str, n: int) -> float:
    torch.set_num_threads(1)
    hp = C.resolve({"data": str(data), "steps": 1, "objective": objective})
    train, _, meta = _load_data(hp)
    collate = _make_collator(objective, _load_tokenizer(hp, meta), 0.15)
    b = Batches(_model_columns(train, objective), 32, 0, collate)
    for s in range(5):
        b.get(s)
    times = []
    for s in range(5, 5 + n):
        t = time.perf_counter()
        b.get(s)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, default=200)
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

        print(f"# 2. engine steps/s on this CPU, mlm 32 x 128, threads 1, {a.steps} steps, median of {a.repeats} processes")
        sps = {}
        for workers in (0, 1):
            runs = [engine_run(data["mlm"], "mlm", "fp32", steps=a.steps, threads=1, data_workers=workers,
                               timing_warmup_steps=5) for _ in range(a.repeats)]
            sps[workers] = statistics.median(r["steps_per_second"] for r in runs)
            print(f"data_workers {workers}: {sps[workers]:7.2f} steps/s  (runs: "
                  + ", ".join(f"{r['steps_per_second']:.2f}" for r in runs) + ")")
        ratio = sps[1] / sps[0]
        print(f"# data_workers 1 / 0 = {ratio:.2f} (target >= {TARGET_RATIO}): {'PASS' if ratio >= TARGET_RATIO else 'FAIL'}")


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"# took {time.time() - t0:.0f} s")
