#!/usr/bin/env python
"""Our engine vs Hugging Face ``Trainer``: same model, data, precision, optimizer and number of steps.

Each measurement is a fresh process (clean clocks and memory), alternating engine/Trainer, repeated
``--repeats`` times; the figure is the median steady-state steps/s (wall between step ends after
``--warmup`` steps, so data collation and bookkeeping count for both) and the ratio engine/Trainer.

Equal work: BertForMaskedLM / BertForSequenceClassification from the same BertConfig and seed, the same
prepared dataset and collator (DataCollatorForLanguageModeling / DataCollatorWithPadding), batch size,
AdamW (fused, Trainer's default ``adamw_torch_fused``), linear warm-up schedule, grad clipping 1.0, no
evaluation or checkpointing during the timed loop, one thread count for both. Same training, not the
same arithmetic: the engine reaches the same losses and gradients with less of it (masked-LM scores
only at masked positions, ``engine.mlm_forward``; the last encoder layer computed for [CLS] only in
classification, ``engine.cls_only_last_layer``; tests/test_engine.py checks both against the stock
forward), while Trainer runs the stock Hugging Face forward.

Precisions: ``fp32`` and ``amp_bf16`` (Trainer ``bf16=True``). fp16 is NOT compared on CPU: Trainer's
``fp16=True`` with ``use_cpu=True`` silently trains in fp32 in transformers 5 / accelerate 1.15
(accelerate enables native fp16 AMP only off-CPU), so it would not be the same work.

Usage: python benchmarks/engine_vs_trainer.py [--steps 60] [--repeats 3] [--threads 2]
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
from _bench import MODEL, PY, engine_run, positive_int, prepare, split_names  # noqa: E402

TRAINER_SCRIPT = r'''
import json, sys, time, torch
args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
import transformers
from transformers import (BertConfig, BertForMaskedLM, BertForSequenceClassification, Trainer, TrainingArguments,
                          TrainerCallback, AutoTokenizer, DataCollatorForLanguageModeling, DataCollatorWithPadding)
import datasets
transformers.utils.logging.set_verbosity_error()
datasets.disable_progress_bars()
dd = datasets.load_from_disk(args["data"]); meta = json.load(open(args["data"] + "/meta.json"))
tok = AutoTokenizer.from_pretrained(meta["tokenizer"])
transformers.set_seed(args["seed"])
m = dict(args["model"]); attn = m.pop("attn_implementation")
if args["objective"] == "mlm":
    cfg = BertConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, attn_implementation=attn, **m)
    model = BertForMaskedLM(cfg); coll = DataCollatorForLanguageModeling(tok, mlm_probability=0.15)
else:
    cfg = BertConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, attn_implementation=attn,
                     num_labels=meta["num_labels"], **m)
    model = BertForSequenceClassification(cfg); coll = DataCollatorWithPadding(tok)
starts, ends = [], []
class Clock(TrainerCallback):
    def on_step_begin(self, a, state, control, **kw):
        if not starts:
            starts.append(time.perf_counter())
    def on_step_end(self, a, state, control, **kw):
        ends.append(time.perf_counter())
targs = TrainingArguments(output_dir=args["tmp"], per_device_train_batch_size=args["batch_size"],
    max_steps=args["steps"], learning_rate=args["lr"], warmup_steps=int(round(0.1 * args["steps"])),
    weight_decay=0.01, adam_epsilon=1e-8, max_grad_norm=1.0, lr_scheduler_type="linear",
    logging_strategy="no", save_strategy="no", eval_strategy="no", report_to=[], use_cpu=True,
    bf16=args["precision"] == "amp_bf16", dataloader_num_workers=0, seed=args["seed"], disable_tqdm=True,
    optim="adamw_torch_fused", dataloader_drop_last=True)
tr = Trainer(model=model, args=targs, train_dataset=dd["train"], data_collator=coll, callbacks=[Clock()])
tr.train()
w = args["warmup"]
t_from = ends[w - 1] if w else starts[0]  # the end of the last warm-up step; with none, the first step's start
print(json.dumps({"steps_per_second": (len(ends) - w) / (ends[-1] - t_from), "steps": len(ends),
                  "final_loss": tr.state.log_history[-1].get("train_loss")}))
'''


def engine(data: Path, objective: str, precision: str, a) -> float:
    m = engine_run(data, objective, precision, steps=a.steps, threads=a.threads, timing_warmup_steps=a.warmup,
                   optimizer_impl="fused", adam_eps=1e-8)
    return m["steps_per_second"]


def trainer(data: Path, objective: str, precision: str, a) -> float:
    with tempfile.TemporaryDirectory() as t:
        args = {"data": str(data), "objective": objective, "precision": precision, "steps": a.steps, "seed": 1,
                "model": MODEL, "threads": a.threads, "batch_size": 32, "lr": 5e-4, "warmup": a.warmup, "tmp": t}
        r = subprocess.run([PY, "-c", TRAINER_SCRIPT, json.dumps(args)], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(r.stderr[-3000:])
        return json.loads(r.stdout.strip().splitlines()[-1])["steps_per_second"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=positive_int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=positive_int, default=3)
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--precisions", default="fp32,amp_bf16")
    ap.add_argument("--objectives", default="mlm,classify")
    a = ap.parse_args()
    if not 0 <= a.warmup < a.steps:
        ap.error(f"--warmup {a.warmup}: needs 0 <= warmup < --steps ({a.steps}), or no step is timed")
    objectives = split_names(ap, "--objectives", a.objectives, ("mlm", "classify"))
    precisions = split_names(ap, "--precisions", a.precisions, ("fp32", "amp_bf16"))  # fp16: see the docstring
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as root:
        data = prepare(Path(root))
        print(f"# engine vs HF Trainer {transformers.__version__}, torch {torch.__version__}, threads {a.threads}, "
              f"{a.steps} steps (first {a.warmup} excluded), batch 32, seq 64, median of {a.repeats} processes")
        print(f"{'objective':<9} {'precision':<9} {'engine steps/s':>15} {'Trainer steps/s':>16} {'ratio':>6}")
        rows = []
        for obj in objectives:
            for prec in precisions:
                e, t = [], []
                for _ in range(a.repeats):  # alternate so drift hits both alike
                    e.append(engine(data[obj], obj, prec, a))
                    t.append(trainer(data[obj], obj, prec, a))
                em, tm = statistics.median(e), statistics.median(t)
                rows.append((obj, prec, em, tm))
                print(f"{obj:<9} {prec:<9} {em:>15.2f} {tm:>16.2f} {em / tm:>6.2f}", flush=True)
        worst = min(r[2] / r[3] for r in rows)
        print(f"# worst ratio {worst:.2f} (target >= 1.10): {'PASS' if worst >= 1.10 else 'FAIL'}")


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"# took {time.time() - t0:.0f} s")
