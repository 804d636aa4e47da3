#!/usr/bin/env python
"""Steps/s, tokens/s and peak memory of every precision, both objectives, on this machine.

Tiny BERT (hidden 128, 2 layers, vocab 4k), batch 32, seq 64, AdamW; each figure is the median of
``--repeats`` fresh processes (one stage each), steady state after ``--warmup`` steps. Ratios are vs fp32
measured in the same run, fp32 first (timings on shared machines are noisy: compare ratios, not seconds).
pure_fp16 runs with adam_eps 1e-4 here (with the default 1e-8 it diverges: see the study's findings).

Usage: python benchmarks/precision_throughput.py [--steps 60] [--repeats 3] [--threads 2] [--device cpu]
On a GPU, the engine at BERT-base's size, eager against CUDA graphs (the hparam compile):
  python benchmarks/precision_throughput.py --device cuda --model base --max-length 128 --repeats 1 \
      --objectives mlm --precisions fp32,amp_bf16 --compile off,reduce-overhead
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from precswitch.precision import NAMES  # noqa: E402
from precswitch.train.config import COMPILE_MODES  # noqa: E402

from _bench import BASE_MODEL, MODEL, engine_run, positive_int, prepare, split_names  # noqa: E402


def status_of(runs: list[dict]) -> str:
    """A row's status: its runs' own when they all agree, else how many of them were ok ('2/3 ok')."""
    kinds = {r["status"] for r in runs}
    return kinds.pop() if len(kinds) == 1 else f"{sum(r['status'] == 'ok' for r in runs)}/{len(runs)} ok"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=positive_int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precisions", default="fp32,amp_fp16,amp_bf16,pure_fp16,pure_bf16")
    ap.add_argument("--objectives", default="mlm,classify")
    ap.add_argument("--model", choices=["tiny", "base"], default="tiny",
                    help="tiny (default) or base: BERT-base's layers and widths (SDPA), the data's 4k vocabulary, "
                         "masked-LM text packed into full --max-length blocks")
    ap.add_argument("--max-length", type=positive_int, default=64, help="tokens per sequence (default 64)")
    ap.add_argument("--compile", default="off",
                    help="comma-separated engine compile settings to compare (off, default, reduce-overhead)")
    ap.add_argument("--metrics-out", help="also write every run's metrics.json, as one JSON list, here")
    a = ap.parse_args()
    # the engine times every step when its warm-up leaves none (timing_warmup_steps 0 in metrics.json),
    # while the header would still say the warm-up was excluded
    if not 0 <= a.warmup < a.steps:
        ap.error(f"--warmup {a.warmup}: needs 0 <= warmup < --steps ({a.steps}), or no step is timed")
    objectives = split_names(ap, "--objectives", a.objectives, ("mlm", "classify"))
    precisions = split_names(ap, "--precisions", a.precisions, NAMES)  # a typo: exit 2, not a failed row per repeat
    compiles = split_names(ap, "--compile", a.compile, COMPILE_MODES)
    model = BASE_MODEL if a.model == "base" else MODEL
    every = []
    with tempfile.TemporaryDirectory() as root:
        data = prepare(Path(root), max_length=a.max_length, pack=a.model == "base")  # base: full-length blocks
        print(f"# precision throughput: {a.steps} steps ({a.warmup} warm-up excluded), batch 32, seq {a.max_length}, "
              f"model {a.model}, threads {a.threads}, device {a.device}, median of {a.repeats} processes")
        print(f"{'objective':<9} {'precision':<10} {'compile':<15} {'steps/s':>8} {'tokens/s':>9} {'vs fp32':>8} "
              f"{'peak MB':>8} {'J/step':>7} {'status':>8}  memory kind")
        # fp32 first: every other row's "vs fp32" is over fp32's steps/s of the same objective and compile
        # setting ("-" when fp32 is not listed or its runs failed), whatever the order given
        precisions = sorted(precisions, key=lambda p: p != "fp32")
        for obj, comp in ((o, c) for o in objectives for c in compiles):
            base = None
            for prec in precisions:
                runs = []
                for _ in range(a.repeats):
                    try:
                        runs.append(engine_run(data[obj], obj, prec, steps=a.steps, threads=a.threads,
                                               timing_warmup_steps=a.warmup, device=a.device, model=model,
                                               compile=comp, adam_eps=1e-4 if prec == "pure_fp16" else 1e-8))
                    except subprocess.CalledProcessError as e:  # its stderr is printed; go on with the rest
                        runs.append({"objective": obj, "precision": prec, "status": "failed",
                                     "status_reason": f"exit {e.returncode}: "
                                     + ((e.stderr or "").strip().splitlines() or [""])[-1][:300]})
                every += runs
                if a.metrics_out:  # after every precision: a run cut off by a time limit keeps what it measured
                    Path(a.metrics_out).write_text(json.dumps(every, indent=1, default=str))
                ok = [r for r in runs if r.get("steps_per_second")]
                if not ok:
                    print(f"{obj:<9} {prec:<10} {comp:<15} {'-':>8} {'-':>9} {'-':>8} {'-':>8} {'-':>7} {status_of(runs):>8}  "
                          f"{runs[0].get('status_reason') or ''}", flush=True)
                    continue
                sps = statistics.median(r["steps_per_second"] for r in ok)
                tps = statistics.median(r["tokens_per_second"] for r in ok)
                mem = statistics.median(r["peak_memory_bytes"] for r in ok) / 2**20
                # steady state: the steps after the warm-up (a compiled run's warm-up is its compilation)
                joules = [r["energy_joules_steady"] / (r["steps_completed"] - r["timing_warmup_steps"]) for r in ok
                          if r.get("energy_joules_steady") is not None
                          and r["steps_completed"] > r["timing_warmup_steps"]]
                jps = f"{statistics.median(joules):.2f}" if joules else "-"
                if prec == "fp32":
                    base = sps
                vs = f"{sps / base:>7.2f}x" if base else f"{'-':>8}"
                print(f"{obj:<9} {prec:<10} {comp:<15} {sps:>8.2f} {tps:>9.0f} {vs} {mem:>8.0f} {jps:>7} "
                      f"{status_of(runs):>8}  {ok[0]['memory_kind']}", flush=True)
    if a.metrics_out:
        Path(a.metrics_out).write_text(json.dumps(every, indent=1, default=str))


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"# took {time.time() - t0:.0f} s")
