#!/usr/bin/env python
"""A training job's fixed cost: from process start to its first training step, and from its last step to exit.

Runs one stage-1 job (masked LM from scratch) and one stage-2 job (classification from that stage 1's
checkpoint) of the embedded default study (config/config.yaml: tiny BERT, synthetic data, fp32, its
hyper-parameters) as the workflow runs them: `precswitch train` in a fresh process, each --repeats times,
with --steps training steps (the fixed cost does not depend on them). Prints the median of each phase:

  process start to the first step: interpreter start, imports (to run_stage), set-up (config, device,
      numeric switches, the stage's lazy imports), data (dataset and tokenizer), model build,
      optimizer and loop set-up (optimizer, collator, batches, eval batches, the first batch), first step
  last step to exit: eval, checkpoint write (without periodic resumable-state saves), metrics write
      (steps.csv, provenance, metrics.json), exit (the summary line and interpreter shutdown)

How: a small driver runs `precswitch.cli.main` in the child and stamps the wall clock where the engine enters
its phases (run_stage, _load_data, _build_model, the first forward_loss, the first measure.sync after it,
evaluate, the metrics.json write); the parent stamps the spawn and the exit. A stamp whose function the
engine no longer has is left out: its phase then counts in the next one (shown as '-').

--src DIR runs another checkout's package (LABEL=DIR, repeatable, interleaved: e.g. before and after a
change, on the same prepared data; a ratio column compares the last with the first).

  PYTHONPATH=src .venv/bin/python benchmarks/job_overhead.py --src before=../baseline/src --src after=src
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).parent))
from _bench import PY, cli, positive_int  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: Runs `precswitch ARGV` (sys.argv[2:]) as the program does (cli.main() reading sys.argv) and writes the
#: wall-clock stamps to sys.argv[1].
DRIVER = r"""
import json, sys, time
T = {"main": time.time()}
marks, sys.argv = sys.argv[1], ["precswitch", *sys.argv[2:]]
import precswitch
from precswitch import cli, measure
from precswitch.train import engine
from precswitch.train.engine import loop as L, records as R
T["src"] = precswitch.__file__
T["missing"] = []  # stamps whose function this package does not have where it is looked up (their phase: None)

def stamp(owner, name, enter=None, leave=None, when=lambda: True):
    f = getattr(owner, name, None)
    if f is None:
        T["missing"].append(f"{owner.__name__}.{name}")
        return
    def wrapped(*a, **k):
        if enter and enter not in T and when():
            T[enter] = time.time()
        r = f(*a, **k)
        if leave and leave not in T and when():
            T[leave] = time.time()
        return r
    setattr(owner, name, wrapped)

# each where its caller looks it up: the CLI imports run_stage from the engine package, the loop the rest
stamp(engine, "run_stage", "stage")
stamp(L, "load_data", "data")
stamp(L, "build_model", "model", "model_built")
stamp(L, "forward_loss", "loop")
stamp(measure, "sync", leave="first_step", when=lambda: "loop" in T)
stamp(L, "evaluate", "eval", "eval_done")
write = getattr(R, "atomic_write_json", None)  # stamped at metrics.json's write only
if write is None:
    T["missing"].append(f"{R.__name__}.atomic_write_json")
else:
    def write_json(path, *a, **k):
        r = write(path, *a, **k)
        if str(path).endswith("metrics.json"):
            T["metrics_written"] = time.time()
        return r
    R.atomic_write_json = write_json
rc = cli.main()
T["main_end"] = time.time()
with open(marks, "w") as f:
    json.dump(T, f)
sys.exit(rc)
"""

#: phase -> (the stamp it ends at); each starts where the previous present stamp is (the first at the spawn)
START_PHASES = (("interpreter start", "main"), ("imports", "stage"), ("set-up", "data"), ("data", "model"),
                ("model build", "model_built"), ("optimizer and loop set-up", "loop"), ("first step", "first_step"))
END_PHASES = ("eval", "checkpoint write", "metrics write", "exit")
#: hparams keys of config.yaml's train.<stage> that are not the engine's (as the workflow leaves them out)
NOT_HPARAMS = {"pretrain": {"max_length"}, "finetune": {"max_length", "mlm_probability"}}


def phases(marks: dict, metrics: dict) -> dict:
    """Seconds of each phase of one job from its stamps (marks: the driver's plus spawn and exit) and its
    metrics.json; None for a phase whose stamp is missing (its time is in the next one)."""
    out, prev = {}, marks["spawn"]
    for name, key in START_PHASES:
        t = marks.get(key)
        out[name] = None if t is None else t - prev
        prev = t if t is not None else prev
    out["to first step"] = prev - marks["spawn"]
    last = marks.get("eval", marks.get("main_end"))
    ckpt = (metrics.get("checkpoint_seconds") or 0.0) - (metrics.get("state_save_seconds") or 0.0)
    eval_s = marks["eval_done"] - marks["eval"] if "eval_done" in marks and "eval" in marks else None
    written = marks.get("metrics_written")
    out["eval"] = eval_s
    out["checkpoint write"] = ckpt
    out["metrics write"] = (written - marks["eval_done"] - ckpt) if written and eval_s is not None else None
    out["exit"] = marks["exit"] - (written or marks["main_end"])
    out["last step to exit"] = marks["exit"] - last
    out["wall"] = marks["exit"] - marks["spawn"]
    return out


def stage_hparams(cfg: dict, stage: str, steps: int, data: Path, tokenizer: Path, init: str) -> dict:
    """The hparams the workflow gives a stage of study config cfg (fp32, seed 1), with `steps` steps."""
    hp = {k: v for k, v in cfg["train"][stage].items() if k not in NOT_HPARAMS[stage]}
    hp.update(steps=steps, epochs=None, timing_warmup_steps=min(hp["timing_warmup_steps"], steps - 1))
    model = {k: v for k, v in cfg["model"].items() if k not in ("init", "revision")}
    hp.update(run_id=f"{stage}-fp32-seed1", stage=stage, objective="mlm" if stage == "pretrain" else "classify",
              precision="fp32", seed=1, tags={} if stage == "pretrain" else {"schedule": "fp32-fp32"},
              data=str(data), tokenizer=str(tokenizer), init=init,
              model=model if init == "scratch" else {"attn_implementation": model["attn_implementation"]},
              threads=cfg["threads"], device=cfg["device"])
    return hp


def prepare_default(root: Path, cfg: dict) -> dict[str, Path]:
    """The default study's data (synthetic language, tokenizer, both stages' prepared datasets) under root."""
    syn, tok = cfg["data"]["synthetic"], root / "tokenizer"
    src = json.dumps({"kind": "synthetic", "dir": str(root / "synth")})
    cli("synth", "--out", str(root / "synth"), "--seed", str(syn["seed"]), "--n-corpus", str(syn["n_corpus"]),
        "--n-train", str(syn["n_train"]), "--n-dev", str(syn["n_dev"]))
    cli("tokenizer", "--source", src, "--out", str(tok), "--vocab-size", str(cfg["tokenizer"]["vocab_size"]),
        "--model-max-length", str(cfg["model"]["max_position_embeddings"]))
    out = {"tokenizer": tok}
    for stage, obj in (("pretrain", "mlm"), ("finetune", "classify")):
        out[stage] = root / f"prepared-{stage}"
        cli("prepare", "--source", src, "--tokenizer", str(tok), "--objective", obj,
            "--max-length", str(cfg["train"][stage]["max_length"]), "--out", str(out[stage]))
    return out


def timed_job(src: Path, hp: dict, out: Path) -> dict:
    """One `precswitch train` in a fresh process running src's package: its phases (seconds)."""
    marks_file = out.with_suffix(".marks.json")
    # src's package first, then whatever the caller's path holds (a lease's carried site: jsonschema, datasets)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))}
    spawn = time.time()
    r = subprocess.run([PY, "-c", DRIVER, str(marks_file), "train", "--hparams", json.dumps(hp), "--out", str(out)],
                       env=env, capture_output=True, text=True)
    end = time.time()
    if r.returncode != 0:
        raise SystemExit(f"job_overhead: precswitch train ({src}) failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    marks = {**json.loads(marks_file.read_text()), "spawn": spawn, "exit": end}
    if Path(marks["src"]).resolve().parent.parent != src.resolve():
        raise SystemExit(f"job_overhead: the child ran {marks['src']}, not the package under {src}")
    if marks["missing"]:  # a package of another layout (--src): its phases there are None, their time in the next
        print(f"job_overhead: {src}: no {', '.join(marks['missing'])} to stamp", file=sys.stderr)
    return {**phases(marks, json.loads((out / "metrics.json").read_text())), "missing": marks["missing"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=positive_int, default=10, help="training steps per job (default 10)")
    ap.add_argument("--repeats", type=positive_int, default=3, help="processes per job and package (median)")
    ap.add_argument("--src", action="append", default=[], metavar="[LABEL=]DIR",
                    help="the package's src/ directory to run (default: this checkout's); repeatable")
    ap.add_argument("--config", type=Path, default=ROOT / "config" / "config.yaml", help="the study config")
    ap.add_argument("--json-out", type=Path, default=None, help="also write the result (JSON) here")
    a = ap.parse_args(argv)
    srcs = {}
    for item in a.src or [f"src={ROOT / 'src'}"]:
        label, _, path = item.rpartition("=")
        label = label or Path(path).resolve().parent.name
        if not (Path(path) / "precswitch" / "cli.py").is_file():
            ap.error(f"--src {item}: {path} holds no precswitch package")
        if label in srcs:
            ap.error(f"--src {item}: label {label!r} given twice")
        srcs[label] = Path(path)
    cfg = yaml.safe_load(a.config.read_text())
    runs = {(label, stage): [] for label in srcs for stage in ("stage 1", "stage 2")}
    with tempfile.TemporaryDirectory() as t:
        root = Path(t)
        data = prepare_default(root / "data", cfg)
        for r in range(a.repeats):  # interleaved: a load on the machine falls on every package alike
            for label, src in srcs.items():
                s1 = root / f"{label}-{r}-s1"
                hp1 = stage_hparams(cfg, "pretrain", a.steps, data["pretrain"], data["tokenizer"], "scratch")
                runs[label, "stage 1"].append(timed_job(src, hp1, s1))
                hp2 = stage_hparams(cfg, "finetune", a.steps, data["finetune"], data["tokenizer"],
                                    str(s1 / "checkpoint"))
                runs[label, "stage 2"].append(timed_job(src, hp2, root / f"{label}-{r}-s2"))
    names = [n for n, _ in START_PHASES] + ["to first step"] + list(END_PHASES) + ["last step to exit", "wall"]
    med = {f"{label} {stage}": {n: (statistics.median(vals) if (vals := [p[n] for p in ps if p[n] is not None])
                                   else None) for n in names}
           for (label, stage), ps in runs.items()}
    cols = list(med)
    ratio = len(srcs) == 2
    labels = list(srcs)
    print(f"# job overhead: default study's tiny model (config {a.config.name}), fp32, {a.steps} steps, "
          f"median of {a.repeats} fresh processes; seconds")
    head = f"{'phase':<26}" + "".join(f"{c:>17}" for c in cols)
    if ratio:
        head += "".join(f"{f'{labels[1]}/{labels[0]} {s[-1]}':>16}" for s in ("stage 1", "stage 2"))
    print(head)
    for n in names:
        line = f"{n:<26}" + "".join(f"{med[c][n]:>17.2f}" if med[c][n] is not None else f"{'-':>17}" for c in cols)
        if ratio:
            for s in ("stage 1", "stage 2"):
                x, y = med[f"{labels[0]} {s}"][n], med[f"{labels[1]} {s}"][n]
                line += f"{y / x:>16.2f}" if x and y is not None else f"{'-':>16}"
        print(line)
    result = {"steps": a.steps, "repeats": a.repeats, "src": {k: str(v) for k, v in srcs.items()}, "median": med,
              "runs": {f"{label} {stage}": ps for (label, stage), ps in runs.items()}}
    if a.json_out:
        a.json_out.write_text(json.dumps(result, indent=1))
    print(json.dumps({"median": med}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
