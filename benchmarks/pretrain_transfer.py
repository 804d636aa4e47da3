"""Does stage 1 (masked-LM pre-training on the synthetic corpus) help stage 2 (the paraphrase task)?

Runs the real pipeline through the CLI, each stage in a fresh process, with the default study's settings
(config/config.yaml: synthetic sizes, model, steps, learning rates, max lengths, 1 thread):

    precswitch synth -> tokenizer -> prepare (mlm, classify)
    per seed: train pretrain (fp32)  ->  train finetune from that checkpoint
                                         train finetune from scratch (same seed: same head init, data order)

and prints dev accuracy of both fine-tunings per seed, the paired difference, and stage-1 figures.

    .venv/bin/python benchmarks/pretrain_transfer.py                 # study defaults, seeds 1 2 3
    .venv/bin/python benchmarks/pretrain_transfer.py --seeds 1 --pretrain-steps 600 --keep /tmp/xfer

Measured 2026-12-02 at 174e3fe (2-core CPU, 1 thread, default study: stage 1 600 steps, stage 2 300 steps at
lr 3e-4; the synthetic task without identical pairs, b9fea66):
    seed 1: pre-trained 0.771, scratch 0.500    seed 2: 0.657 vs 0.500    seed 3: 0.715 vs 0.500
    mean paired gain +0.215 (min +0.157); stage 1 took 26-29 s; whole script 213 s.
(Before b9fea66: 2026-12-01, 0.660 / 0.710 / 0.792, gain +0.221; 2026-11-30, 0.792 / 0.757 / 0.843, +0.297.)
With stage 1 at 300 steps the gain was -0.013 (0.487 vs 0.500): see docs/data.md.
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

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import positive_int  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def cli(*args: str) -> str:
    r = subprocess.run([PY, "-m", "precswitch.cli", *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"precswitch {args[0]} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout


def stage_hparams(cfg: dict, stage: str) -> dict:
    t = dict(cfg["train"][stage])
    keep = ("steps", "epochs", "batch_size", "eval_batch_size", "lr", "warmup_ratio", "weight_decay", "adam_eps",
            "adam_beta1", "adam_beta2", "max_grad_norm", "mlm_probability")
    hp = {k: t[k] for k in keep if k in t and t[k] is not None}
    hp["model"] = {k: v for k, v in cfg["model"].items() if k not in ("init", "revision")}  # as the workflow (common.smk)
    hp["threads"] = int(cfg.get("threads") or 1)
    hp["device"] = "cpu"
    return hp


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "config" / "config.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--pretrain-steps", type=positive_int, default=None, help="override train.pretrain.steps")
    ap.add_argument("--finetune-steps", type=positive_int, default=None, help="override train.finetune.steps")
    ap.add_argument("--synth-seed", type=int, default=None)
    ap.add_argument("--language", default=None, help="JSON overrides of the synthetic LanguageConfig")
    ap.add_argument("--keep", default=None, help="work directory to keep (default: a temporary one)")
    args = ap.parse_args()
    dup = sorted({s for s in args.seeds if args.seeds.count(s) > 1})
    if dup:  # the same runs again, in the same directories, counted twice in the mean gain
        ap.error(f"--seeds: {', '.join(map(str, dup))} given twice")

    cfg = yaml.safe_load(Path(args.config).read_text())
    syn = cfg["data"]["synthetic"]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="pretrain-transfer-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    synth = work / "synth"
    cli("synth", "--out", str(synth), "--seed", str(args.synth_seed if args.synth_seed is not None else syn["seed"]),
        "--n-corpus", str(syn["n_corpus"]), "--n-train", str(syn["n_train"]), "--n-dev", str(syn["n_dev"]),
        *(["--language", args.language] if args.language else []))
    src = json.dumps({"kind": "synthetic", "dir": str(synth)})
    tok = work / "tokenizer"
    cli("tokenizer", "--source", src, "--out", str(tok), "--vocab-size", str(cfg["tokenizer"]["vocab_size"]))
    data = {}
    for stage, obj in (("pretrain", "mlm"), ("finetune", "classify")):
        data[stage] = work / f"prepared-{stage}"
        cli("prepare", "--source", src, "--tokenizer", str(tok), "--objective", obj,
            "--max-length", str(cfg["train"][stage]["max_length"]), "--out", str(data[stage]))
    meta = json.loads((data["finetune"] / "meta.json").read_text())
    print(f"data: {syn} -> mlm {json.loads((data['pretrain'] / 'meta.json').read_text())['n_train']} examples, "
          f"classify {meta['n_train']} train / {meta['n_eval']} dev (majority {meta['majority_accuracy']:.3f}); "
          f"{time.time() - t0:.0f}s", flush=True)

    pre_hp = stage_hparams(cfg, "pretrain")
    ft_hp = stage_hparams(cfg, "finetune")
    if args.pretrain_steps is not None:
        pre_hp.update(steps=args.pretrain_steps, epochs=None)
    if args.finetune_steps is not None:
        ft_hp.update(steps=args.finetune_steps, epochs=None)

    def train(out: Path, hp: dict) -> dict:
        cli("train", "--hparams", json.dumps(hp), "--out", str(out))
        return json.loads((out / "metrics.json").read_text())

    rows = []
    for seed in args.seeds:
        pre = train(work / f"pretrain-seed{seed}", {**pre_hp, "stage": "pretrain", "objective": "mlm",
                                                      "precision": "fp32", "seed": seed,
                                                      "data": str(data["pretrain"]), "tokenizer": str(tok),
                                                      "save_checkpoint": True})
        common = {**ft_hp, "stage": "finetune", "objective": "classify", "precision": "fp32", "seed": seed,
                  "data": str(data["finetune"]), "tokenizer": str(tok), "save_checkpoint": False}
        fp = train(work / f"finetune-pretrained-seed{seed}",
                   {**common, "init": str(work / f"pretrain-seed{seed}" / "checkpoint")})
        fs = train(work / f"finetune-scratch-seed{seed}", {**common, "init": "scratch"})
        row = {"seed": seed, "stage1_steps": pre["steps_completed"], "stage1_seconds": pre["train_seconds"],
               "stage1_eval_loss": pre["eval_loss"], "stage1_mlm_accuracy": pre["mlm_accuracy"],
               "acc_pretrained": fp["accuracy"], "acc_scratch": fs["accuracy"],
               "f1_pretrained": fp["f1"], "f1_scratch": fs["f1"]}
        rows.append(row)
        print(f"seed {seed}: stage 1 {row['stage1_steps']} steps in {row['stage1_seconds']:.0f}s "
              f"(eval loss {row['stage1_eval_loss']:.3f}, masked acc {row['stage1_mlm_accuracy']:.3f}) | "
              f"dev accuracy: pre-trained {row['acc_pretrained']:.3f}, scratch {row['acc_scratch']:.3f}, "
              f"gain {row['acc_pretrained'] - row['acc_scratch']:+.3f}", flush=True)
    gains = [r["acc_pretrained"] - r["acc_scratch"] for r in rows]
    print(f"mean dev accuracy: pre-trained {statistics.mean(r['acc_pretrained'] for r in rows):.3f}, "
          f"scratch {statistics.mean(r['acc_scratch'] for r in rows):.3f}; paired gain "
          f"{statistics.mean(gains):+.3f} (min {min(gains):+.3f}, max {max(gains):+.3f}) over {len(rows)} seed(s); "
          f"total {time.time() - t0:.0f}s; work dir {work}")
    (work / "pretrain_transfer.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
