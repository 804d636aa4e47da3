#!/usr/bin/env python
"""The fixed cost of one training job at BERT-base's size: everything a job spends outside its
training steps, the per-job term of benchmarks/gpu_hours.py (--stage1-job-s, --stage2-job-s).

Runs `precswitch train` twice in fresh processes, as the workflow's rules do, on BERT-base's layers
and widths (the synthetic data's 4k vocabulary: ~86M parameters, bert-base-cased has 108M):
  stage 1: masked LM from a BERT-base model directory written with save_pretrained (as a fetched
           bert-base-cased is loaded), --steps steps, resumable state saved once, final checkpoint;
  stage 2: classification initialised from stage 1's checkpoint (as every fine-tuning job is).
For each it splits the process's wall time into what the engine reports (setup_seconds: data, model
load, optimizer; train_seconds; eval_seconds; checkpoint_seconds; state_save_seconds) and the rest
(interpreter start, imports, writing metrics, exit), and prints the fixed cost per job without the
training steps and without evaluation (which on a GPU is a second or two: forward passes only).

What a CPU cannot say: the CUDA part of setup (context creation, cuBLAS/cuDNN handles, NVML), and how
long a process takes to start and import CUDA torch. With --gpu-metrics and --gpu-log (the metrics.json
list and the printed output of a GPU run of precision_throughput.py, tiny model, e.g.
benchmarks/h200/run1_engine_cuda*) it adds (a) the GPU's median setup_seconds minus this machine's for
the same tiny model, run here too, and (b) the GPU run's seconds outside every engine-timed part,
per process, less this machine's preparation of the benchmark data (the GPU run prepared its data
too): the estimate of a job's fixed cost on that GPU.

--model tiny runs the embedded default's model on the tiny benchmark's data instead (seconds; the tests do).

  .venv/bin/python benchmarks/job_overhead.py --gpu-metrics benchmarks/h200/run1_engine_cuda_metrics.json \
      --gpu-log benchmarks/h200/run1_engine_cuda.txt
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _bench import BASE_MODEL, MODEL, engine_run, positive_int, prepare  # noqa: E402

#: the parts of a run the engine times; checkpoint_seconds includes state_save_seconds (resumable state)
ENGINE_PARTS = ("setup_seconds", "train_seconds", "eval_seconds", "checkpoint_seconds")


def timed_run(hp: dict, out: Path) -> dict:
    """One `precswitch train` process (_bench.engine_run, outputs kept in out): its metrics.json plus
    wall_seconds and rest_seconds (wall minus every part the engine reports: interpreter start,
    imports, metrics write, exit)."""
    hp = dict(hp)
    m = engine_run(hp.pop("data"), hp.pop("objective"), hp.pop("precision"), out=out, **hp)
    m["rest_seconds"] = m["wall_seconds"] - sum(m.get(k) or 0.0 for k in ENGINE_PARTS)
    return m


def fixed_seconds(m: dict) -> float:
    """A job's cost outside its training steps and its evaluation."""
    return m["wall_seconds"] - m["train_seconds"] - (m.get("eval_seconds") or 0.0)


def model_dir(root: Path, sizes: dict, vocab_size: int) -> Path:
    """A masked-LM directory as save_pretrained writes it (random weights), as a fetched model is."""
    from transformers import BertConfig, BertForMaskedLM

    m = dict(sizes)
    attn = m.pop("attn_implementation")
    model = BertForMaskedLM(BertConfig(vocab_size=vocab_size, attn_implementation=attn, **m))
    out = root / "init-model"
    model.save_pretrained(out)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=positive_int, default=4, help="training steps per job (default 4)")
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--model", choices=["base", "tiny"], default="base",
                    help="base (default): BERT-base's layers and widths; tiny: the embedded default's (a smoke test)")
    ap.add_argument("--gpu-metrics", type=Path, default=None,
                    help="metrics.json list of precision_throughput.py on a GPU (tiny model)")
    ap.add_argument("--json-out", type=Path, default=None, help="also write the final JSON line's object here")
    ap.add_argument("--gpu-log", type=Path, default=None, help="that run's printed output (its '# took N s')")
    a = ap.parse_args(argv)
    gpu, took = None, None
    if bool(a.gpu_metrics) != bool(a.gpu_log):  # one without the other used to be ignored, without a word
        ap.error("--gpu-metrics and --gpu-log go together (the GPU run's metrics and its printed output)")
    if a.gpu_metrics:  # read before the runs (minutes at BERT-base's size), not after them
        try:
            gpu = json.loads(a.gpu_metrics.read_text())
            log = a.gpu_log.read_text()
        except (OSError, ValueError) as e:
            ap.error(f"--gpu-metrics/--gpu-log: {e}")
        gpu = [m for m in (gpu if isinstance(gpu, list) else [gpu])
               if isinstance(m, dict) and m.get("device") == "cuda" and m.get("setup_seconds")]
        took = re.search(r"^# took (\d+(?:\.\d+)?) s", log, re.MULTILINE)
        if not gpu or not took:
            ap.error(f"no CUDA run with setup_seconds in {a.gpu_metrics}, or no '# took N s' in {a.gpu_log}")
    rows = {}
    with tempfile.TemporaryDirectory() as t:
        root = Path(t)
        t_prep = time.perf_counter()
        tiny_root = root / "tiny-data"
        tiny_data = prepare(tiny_root)  # what precision_throughput.py prepares before its runs (tiny model)
        prep_seconds = time.perf_counter() - t_prep
        # BERT-base's jobs read 128-token blocks, as the GPU configs' stage 1; the tiny smoke run reads the tiny data
        data_root = root if a.model == "base" else tiny_root
        data = prepare(root, max_length=128, pack=True) if a.model == "base" else tiny_data
        vocab = json.loads((data_root / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
        sizes = BASE_MODEL if a.model == "base" else MODEL
        init = model_dir(root, sizes, len(vocab))
        common = dict(seed=1, precision=a.precision, threads=a.threads, steps=a.steps, timing_warmup_steps=1,
                      batch_size=32, eval_batch_size=128, lr=5e-5, warmup_ratio=0.1,
                      tokenizer=str(data_root / "tokenizer"), device="cpu")
        attn = {"attn_implementation": sizes["attn_implementation"]}  # the sizes come from the model dir
        rows["stage 1"] = timed_run({**common, "objective": "mlm", "data": str(data["mlm"]), "init": str(init),
                                     "model": attn, "save_checkpoint": True,
                                     "checkpoint_every_steps": max(a.steps // 2, 1)}, root / "s1")
        rows["stage 2"] = timed_run({**common, "objective": "classify", "data": str(data["classify"]),
                                     "init": str(root / "s1" / "checkpoint"), "model": attn,
                                     "save_checkpoint": False}, root / "s2")
        # the tiny model on the tiny benchmark's data, as the GPU's tiny runs it is compared with
        tiny = timed_run({**common, "objective": "mlm", "data": str(tiny_data["mlm"]), "init": "scratch",
                          "model": MODEL, "save_checkpoint": False, "steps": 20,
                          "tokenizer": str(tiny_root / "tokenizer")}, root / "tiny")
    print(f"# job overhead: {a.model} model's layers and widths (vocab {len(vocab)}), {a.precision}, {a.steps} steps, "
          f"threads {a.threads}, device cpu; seconds")
    print(f"{'job':<8} {'params':>6} {'wall':>7} {'rest':>6} {'setup':>6} {'train':>7} {'eval':>6} {'ckpt':>6} "
          f"{'state':>6} {'fixed':>6}")
    for name, m in rows.items():
        print(f"{name:<8} {m['model_parameters'] / 1e6:>5.0f}M {m['wall_seconds']:>7.1f} {m['rest_seconds']:>6.1f} "
              f"{m['setup_seconds']:>6.1f} {m['train_seconds']:>7.1f} {m['eval_seconds'] or 0:>6.1f} "
              f"{m['checkpoint_seconds'] or 0:>6.1f} {m['state_save_seconds'] or 0:>6.1f} {fixed_seconds(m):>6.1f}")
    saves = rows["stage 1"].get("state_saves") or 0
    per_save = rows["stage 1"]["state_save_seconds"] / saves if saves else None
    print(f"tiny model setup here: {tiny['setup_seconds']:.1f} s; resumable state of stage 1: "
          + (f"{per_save:.1f} s per save ({saves} saves)" if per_save else "no save"))
    rest_here = statistics.fmean(m["rest_seconds"] for m in (*rows.values(), tiny))
    print(f"data preparation of the tiny benchmark: {prep_seconds:.1f} s; process start, imports and exit: "
          f"{rest_here:.1f} s per process")
    result = {"prep_seconds": prep_seconds, "rest_per_process_s": rest_here,
              "stage1_fixed_s": fixed_seconds(rows["stage 1"]), "stage2_fixed_s": fixed_seconds(rows["stage 2"]),
              "state_save_s": per_save, "tiny_setup_s": tiny["setup_seconds"],
              "rows": {k: {f: m.get(f) for f in ("wall_seconds", "rest_seconds", "model_parameters", *ENGINE_PARTS,
                                                 "state_save_seconds")}
                       for k, m in rows.items()}}
    if gpu:
        setup = statistics.median(m["setup_seconds"] for m in gpu)
        cuda_extra = max(setup - tiny["setup_seconds"], 0.0)
        outside = float(took.group(1)) - sum(m.get(k) or 0.0 for m in gpu for k in ENGINE_PARTS)
        gpu_rest = max(outside - prep_seconds, 0.0) / len(gpu)  # per process: start, CUDA torch imports, exit
        extra = cuda_extra + max(gpu_rest - rest_here, 0.0)
        result.update(cuda_setup_extra_s=cuda_extra, gpu_rest_per_process_s=gpu_rest,
                      gpu_stage1_job_s=result["stage1_fixed_s"] - (rows["stage 1"]["state_save_seconds"] or 0) + extra,
                      gpu_stage2_job_s=result["stage2_fixed_s"] + extra)
        print(f"on the GPU ({len(gpu)} tiny runs): setup {setup:.1f} s (here {tiny['setup_seconds']:.1f} s: CUDA adds "
              f"{cuda_extra:.1f} s); outside the engine's clocks {outside:.0f} s in all, less {prep_seconds:.0f} s of data "
              f"preparation as here: {gpu_rest:.1f} s per process (here {rest_here:.1f} s)")
        print(f"estimated fixed cost per job on that GPU, without evaluation or periodic state saves: "
              f"stage 1 {result['gpu_stage1_job_s']:.0f} s, stage 2 {result['gpu_stage2_job_s']:.0f} s")
    if a.json_out:
        a.json_out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
