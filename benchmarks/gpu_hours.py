"""GPU-hours of a study config on one GPU, from step times measured by benchmarks/gpu_check.

  python benchmarks/gpu_hours.py config/bert-base-mrpc.yaml benchmarks/lease/h200/*gpu_check*.json benchmarks/lease/h200/*prof*.json

For every job the workflow runs (stage 1 once per distinct stage-1 spec and seed, shared by the
schedules that start the same way; stage 2 once per schedule and seed; a switch-point sweep's points are
schedules too) it takes the eager step time
measured for that objective (masked LM for stage 1, classification for stage 2), precision, batch size
and sequence length, adds the engine's per-step extra (--step-overhead-ms: the next batch's collation,
which on a host-bound GPU step is not hidden) and a fixed cost per job (--stage1-job-s, --stage2-job-s:
process start and imports, CUDA and model set-up, evaluation, checkpoints; defaults 25 s and 18 s, from
benchmarks/job_overhead.py: ~16 s a job at BERT-base's size on the H200 of benchmarks/lease/h200/, plus
evaluation, stage 1's resumable-state save and Snakemake's dispatch; docs/gpu.md). Several
measurements of one kind give a range: the table prints the fastest and the slowest. The engine runs
eager PyTorch, so compiled rows are ignored, and results of gpu_check --step stock or of a run on a CPU
are refused, and so are results of two different GPUs. A job whose measurement is missing is named, not
guessed; unless --extrapolate: then its step time is scaled from a measured step of the same objective and
precision at another shape (another model, batch or length) by the largest of four ratios (target over
measured): aten ops per eager step (the host's launches, counted on this CPU: gpu_check.count_ops), model
FLOPs (the matmuls), activation elements (the memory-bound kernels: tokens x layers x (hidden +
intermediate + heads x length)) and parameters (the optimizer). Each part of a step scales by at most the
largest ratio, so the step does too, if the GPU's cost per op, per FLOP and per byte is no worse at the new
shape than at the measured one: an upper estimate, not a measurement, and marked so (docs/gpu.md). The
config is read as the workflow reads `--configfile`: over config/config.yaml, with the
schema's defaults.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from precswitch.errors import PrecswitchError
from precswitch.specs import run_spec, spec_name
from precswitch.sweeps import expand as expand_sweeps


def load_measurements(paths: list[Path]) -> dict[tuple, list[float]]:
    """(objective, precision, batch, seq, layers, hidden) -> eager step seconds, one per measurement."""
    out: dict[tuple, list[float]] = defaultdict(list)
    gpus: dict[str, Path] = {}
    for p in paths:
        res = json.loads(p.read_text())
        if not isinstance(res, dict) or res.get("schema") != "precswitch-gpu-check/1":
            raise SystemExit(f"gpu_hours: {p} is not a gpu_check --out result")
        if res.get("device", "cuda") != "cuda":  # a CPU run's step times are no GPU's
            raise SystemExit(f"gpu_hours: {p} timed device {res['device']!r} ({res.get('device_name')}), not a GPU; "
                             "give results of gpu_check on the GPU the study will run on")
        if res.get("step", "engine") != "engine":  # stock: model(**batch).loss, a heavier step than the engine's
            raise SystemExit(f"gpu_hours: {p} timed gpu_check --step {res['step']}, not the study's step; "
                             "give results of --step engine (the default)")
        if res.get("device_name"):  # files written before the name was recorded are read as they are
            gpus.setdefault(res["device_name"], p)
        if len(gpus) > 1:  # one range over two GPUs' step times would be neither GPU's
            raise SystemExit("gpu_hours: the results were timed on different GPUs ("
                             + ", ".join(f"{n}: {q}" for n, q in gpus.items())
                             + "); give the results of the one GPU the study will run on")
        m = res["model"]
        for r in res["results"]:
            if r.get("status") == "ok" and r.get("variant") == "eager":
                key = (res["objective"], r["precision"], res["batch"], res["seq_len"],
                       m["num_hidden_layers"], m["hidden_size"])
                out[key].append(r["step_seconds"])
    return out


def stage_parts(spec) -> list[tuple[str, float]]:
    """[(precision, fraction of the stage's steps)] of one schedule stage."""
    if isinstance(spec, str):
        return [(spec, 1.0)]
    if "switch_to" in spec:
        at = spec["switch_at"]
        if isinstance(at, list):
            raise SystemExit("gpu_hours: switch_at sweeps are not expanded here; list the swept schedules instead")
        return [(spec["precision"], at), (spec["switch_to"], 1.0 - at)]
    return [(spec["precision"], 1.0)]


def run_key(spec) -> str:
    """One stage-1 run per key, as the workflow names them (precswitch.specs run_spec / spec_name): "fp32",
    {precision: fp32} (no switch_to) and a switch at 1 (every step before the switch) are the same run; overrides
    make another run."""
    return spec_name(run_spec(spec))


def stage_steps(train: dict, rows: int | None, name: str) -> int:
    if train.get("steps"):
        return int(train["steps"])
    if rows is None:
        raise SystemExit(f"gpu_hours: train.{name} counts epochs: give --{name}-rows (training examples)")
    # as the engine: a partial last batch dropped each epoch, round(epochs x batches) steps (epochs may be
    # fractional), at least 1
    return max(1, int(round(float(train["epochs"]) * (rows // int(train["batch_size"])))))


#: sizes of hub model families known without a download, by the start of the repo name (vocabulary: 28,996
#: words cased, 30,522 uncased)
KNOWN_CONFIGS = {
    "bert-base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                      max_position_embeddings=512),
    "bert-large": dict(num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, intermediate_size=4096,
                       max_position_embeddings=512),
}
#: (layers, hidden) of those families
KNOWN_SHAPES = {k: (v["num_hidden_layers"], v["hidden_size"]) for k, v in KNOWN_CONFIGS.items()}
#: the BertConfig sizes --extrapolate needs
SIZE_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size",
             "max_position_embeddings")


def model_shape(cfg: dict) -> tuple[int, int]:
    """(layers, hidden) of the model the study trains: model.* for a model built from scratch; for a pretrained
    model.init its own sizes (a local directory's config.json, else a known hub family); the config's model.*
    sizes do not apply there (the workflow passes them only to stages built from scratch)."""
    m = cfg.get("model") or {}
    init = m.get("init") or "scratch"
    if init == "scratch":
        return (m.get("num_hidden_layers"), m.get("hidden_size"))
    local = Path(str(init)) / "config.json"
    if local.is_file():
        c = json.loads(local.read_text())
        return (c.get("num_hidden_layers"), c.get("hidden_size"))
    name = str(init).rstrip("/").rsplit("/", 1)[-1].lower()
    for family, shape in KNOWN_SHAPES.items():
        if name.startswith(family):
            return shape
    raise SystemExit(f"gpu_hours: model.init {init!r}: its sizes are unknown here (no {local}, not a "
                     f"{' or '.join(KNOWN_SHAPES)} name): give --shape LAYERS,HIDDEN")


def model_config(cfg: dict) -> dict:
    """The BertConfig sizes (SIZE_KEYS) of the model the study trains, for --extrapolate: a model built from
    scratch has model.* and tokenizer.vocab_size; a pretrained model.init its local config.json, else a known
    hub family's sizes (KNOWN_CONFIGS)."""
    m = cfg.get("model") or {}
    init = m.get("init") or "scratch"
    if init == "scratch":
        sizes = {**{k: m.get(k) for k in SIZE_KEYS}, "vocab_size": (cfg.get("tokenizer") or {}).get("vocab_size")}
    else:
        local = Path(str(init)) / "config.json"
        name = str(init).rstrip("/").rsplit("/", 1)[-1].lower()
        family = next((f for f in KNOWN_CONFIGS if name.startswith(f)), None)
        if local.is_file():
            sizes = {k: json.loads(local.read_text()).get(k) for k in SIZE_KEYS}
        elif family:
            sizes = {**KNOWN_CONFIGS[family], "vocab_size": 30522 if "uncased" in name else 28996}
        else:
            raise SystemExit(f"gpu_hours: model.init {init!r}: its sizes are unknown here (no {local}, not a "
                             f"{' or '.join(KNOWN_CONFIGS)} name): --extrapolate needs them")
    lacking = [k for k in SIZE_KEYS if sizes.get(k) is None]
    if lacking:
        raise SystemExit(f"gpu_hours: the model's {', '.join(lacking)} unknown: --extrapolate needs them")
    return {k: int(sizes[k]) for k in SIZE_KEYS}


def load_references(paths: list[Path]) -> dict[tuple[str, str], list[dict]]:
    """(objective, precision) -> the measured eager steps --extrapolate scales from: each with its model's
    sizes, batch, sequence length, step seconds and file (load_measurements has checked the files)."""
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for p in paths:
        res = json.loads(p.read_text())
        lacking = [k for k in SIZE_KEYS if (res.get("model") or {}).get(k) is None]
        if lacking:  # gpu_check records every size; a hand-made file may not
            raise SystemExit(f"gpu_hours: {p} records no model {', '.join(lacking)}: --extrapolate cannot scale from it")
        for r in res["results"]:
            if r.get("status") == "ok" and r.get("variant") == "eager":
                out[(res["objective"], r["precision"])].append(
                    {"model": res["model"], "batch": res["batch"], "seq": res["seq_len"],
                     "step_seconds": r["step_seconds"], "file": p.name})
    return out


def op_count(layers: int, objective: str, precision: str) -> int:
    """Aten ops of one eager engine step of a `layers`-layer BERT (gpu_check.count_ops, on this CPU): the
    counts of a 1- and a 2-layer model, extended by the second's extra ops per layer (each layer adds the
    same number: tests/test_bench_gpu_check.py; widths, batch and length change nothing), cached per process."""
    key = (objective, precision)
    if key not in _OPS:
        import gpu_check  # torch and transformers: only for --extrapolate

        try:
            _OPS[key] = tuple(gpu_check.count_ops({"num_hidden_layers": n, "vocab_size": 1000}, precision,
                                                  mlm=objective == "mlm") for n in (1, 2))
        except PrecswitchError as e:  # fp8: its step needs a GPU
            raise SystemExit(f"gpu_hours: --extrapolate: {e}") from None
    one, two = _OPS[key]
    return one + (int(layers) - 1) * (two - one)


_OPS: dict[tuple[str, str], tuple[int, int]] = {}


def _engine_flops(sizes: dict, batch: int, seq: int, objective: str, mlm_probability: float) -> int:
    from precswitch import flops

    kw = ({"head_rows": flops.engine_head_rows(batch, seq, mlm_probability)} if objective == "mlm"
          else {"cls_only_last_layer": True})
    return flops.train_step_flops(sizes, batch, seq, objective, **kw)


def _activations(sizes: dict, batch: int, seq: int) -> int:
    return batch * seq * sizes["num_hidden_layers"] * (
        sizes["hidden_size"] + sizes["intermediate_size"] + sizes["num_attention_heads"] * seq)


def scale_ratios(ref: dict, sizes: dict, batch: int, seq: int, objective: str, precision: str,
                 mlm_probability: float = 0.15) -> dict[str, float]:
    """Target over measured, per part of a step (--extrapolate): ops, flops, activations, parameters; and
    `factor`, the largest."""
    from precswitch import flops

    m = ref["model"]
    r = {
        "ops": op_count(sizes["num_hidden_layers"], objective, precision)
        / op_count(m["num_hidden_layers"], objective, precision),
        # the measured step masked 15% (gpu_check), the study's step its mlm_probability
        "flops": _engine_flops(sizes, batch, seq, objective, mlm_probability)
        / _engine_flops(m, ref["batch"], ref["seq"], objective, 0.15),
        "activations": _activations(sizes, batch, seq) / _activations(m, ref["batch"], ref["seq"]),
        "parameters": flops.parameter_count(sizes, objective, max_position_embeddings=sizes["max_position_embeddings"])
        / flops.parameter_count(m, objective, max_position_embeddings=m.get("max_position_embeddings", 512)),
    }
    r["factor"] = max(r.values())
    return r


def _shape(text: str) -> tuple[int, int]:
    try:
        layers, hidden = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LAYERS,HIDDEN (e.g. 12,768), got {text!r}") from None
    return layers, hidden


def estimate(cfg: dict, meas: dict, args, refs: dict | None = None) -> dict:
    """The workflow's jobs with their run seconds (fastest, slowest measurement) and the measurements
    missing; with refs (load_references; --extrapolate) a missing one is scaled from a measured step of its
    objective and precision (scale_ratios), and listed under "extrapolated"."""
    layers, hidden = getattr(args, "shape", None) or model_shape(cfg)
    sizes = model_config(cfg) if refs is not None else None
    extrapolated: dict[tuple, list[dict]] = {}
    seeds = cfg["seeds"]
    stages = {"pretrain": ("mlm", args.stage1_job_s, args.pretrain_rows),
              "finetune": ("classify", args.stage2_job_s, args.finetune_rows)}
    jobs, missing = [], set()
    for stage, (objective, job_s, rows) in stages.items():
        specs = {}
        for name, sched in {**cfg["schedules"], **expand_sweeps(cfg.get("sweeps"), cfg["schedules"])}.items():
            if stage not in sched:  # no stage 1: the schedule fine-tunes model.init directly
                continue
            spec = sched[stage]
            # stage 1 is shared by the schedules that start the same way; stage 2 is one job per schedule
            key = run_key(spec) if stage == "pretrain" else name
            specs.setdefault(key, spec)
        if not specs:
            continue
        train = cfg["train"][stage]
        steps = stage_steps(train, rows, stage)
        b, seq = int(train["batch_size"]), int(train["max_length"])
        for key, spec in specs.items():
            lo = hi = 0.0
            scaled = False
            for prec, frac in stage_parts(spec):
                t = meas.get((objective, prec, b, seq, layers, hidden))
                if not t and refs is not None and refs.get((objective, prec)):
                    target = (objective, prec, b, seq, layers, hidden)
                    if target not in extrapolated:
                        extrapolated[target] = []
                        for ref in refs[(objective, prec)]:
                            r = scale_ratios(ref, sizes, b, seq, objective, prec,
                                             float(train.get("mlm_probability", 0.15)))
                            extrapolated[target].append({**r, "ref": ref,
                                                         "step_seconds": ref["step_seconds"] * r["factor"]})
                    t = [e["step_seconds"] for e in extrapolated[target]]
                    scaled = True
                if not t:
                    missing.add(f"{objective} {prec} batch {b} x {seq} ({layers} layers, {hidden} hidden)")
                    continue
                per = args.step_overhead_ms / 1000
                lo += frac * steps * (min(t) + per)
                hi += frac * steps * (max(t) + per)
            jobs.append({"stage": stage, "spec": key if stage == "finetune" else spec, "steps": steps,
                         "seeds": len(seeds), "run_s": (lo + job_s, hi + job_s), "extrapolated": scaled})
    return {"jobs": jobs, "missing": sorted(missing), "extrapolated": extrapolated}


def span(lo: float, hi: float, f: str) -> str:
    """'1.2' when the fastest and slowest measurements agree at this precision, else '1.1-1.3'."""
    a, b = format(lo, f), format(hi, f)
    return a if a == b else f"{a}-{b}"


ROOT = Path(__file__).resolve().parent.parent


def parameter_count(cfg: dict) -> int:
    """Parameters of the study's masked-LM model (its sizes as model_config reads them), counted on the meta
    device: nothing allocated."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    with torch.device("meta"):
        model = BertForMaskedLM(BertConfig(**model_config(cfg)))
    return sum(p.numel() for p in model.parameters())


def disk_bytes(cfg: dict, gpus: int = 1) -> dict[str, int]:
    """What the study's checkpoints need on disk: ``checkpoints`` (kept: one per stage-1 run, the weights in the
    stage's dtype, 2 bytes a parameter for pure 16-bit precisions and 4 otherwise) and ``resumable`` (while a job
    runs: its resumable state, fp32 weights and AdamW's two moments, 12 bytes a parameter, one per GPU at a
    time). Data and the hub cache come on top (docs/gpu.md, "Disk")."""
    params = parameter_count(cfg)
    runs = {run_key(sched["pretrain"]): stage_parts(sched["pretrain"])[-1][0]
            for sched in cfg["schedules"].values() if sched.get("pretrain")}
    per_seed = sum(params * (2 if prec.startswith("pure_") else 4) for prec in runs.values())
    return {"parameters": params, "checkpoints": per_seed * len(cfg["seeds"]), "resumable": params * 12 * gpus}


def study_config(path: Path) -> dict:
    """The study config as the workflow reads ``--configfile path``: config/config.yaml under it (nested maps
    merged, a schedules map replacing the default one), then the schema's defaults; a partial config (only the
    keys that differ) gave a KeyError or a shape of 'None layers'."""
    import copy

    from snakemake.utils import update_config, validate

    user = yaml.safe_load(path.read_text())
    if not isinstance(user, dict):
        raise SystemExit(f"gpu_hours: {path}: a study config is a YAML mapping, got {type(user).__name__}")
    cfg = copy.deepcopy(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    update_config(cfg, user)
    if "schedules" in user:
        cfg["schedules"] = user["schedules"]
    try:
        validate(cfg, str(ROOT / "workflow" / "schemas" / "config.schema.yaml"), set_default=True)
    except Exception as e:  # noqa: BLE001 - the schema's message, one line, naming the key (as the Snakefile does)
        err = e.__cause__ or e.__context__ or e
        key = ".".join(str(k) for k in getattr(err, "absolute_path", [])) or "(top level)"
        raise SystemExit(f"gpu_hours: {path}: not a valid study config: config key {key}: "
                         f"{str(getattr(err, 'message', err)).splitlines()[0]}") from None
    try:  # the sweeps the workflow refuses (a traceback, or points dropped or replacing a schedule, here)
        expand_sweeps(cfg.get("sweeps"), cfg["schedules"])
    except PrecswitchError as e:
        raise SystemExit(f"gpu_hours: {path}: not a valid study config: {e}") from None
    return cfg


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", type=Path)
    p.add_argument("measured", type=Path, nargs="*", help="gpu_check JSON results (all but --disk need one)")
    p.add_argument("--step-overhead-ms", type=float, default=2.0,
                   help="engine's extra per step over gpu_check's step (next batch's collation; default 2)")
    p.add_argument("--stage1-job-s", type=float, default=25.0,
                   help="fixed seconds per stage-1 job (default 25: benchmarks/job_overhead.py)")
    p.add_argument("--stage2-job-s", type=float, default=18.0,
                   help="fixed seconds per stage-2 job (default 18: benchmarks/job_overhead.py)")
    p.add_argument("--pretrain-rows", type=int, default=None, help="stage-1 training sequences (epochs configs)")
    p.add_argument("--finetune-rows", type=int, default=3668, help="stage-2 training examples (default 3668: MRPC)")
    p.add_argument("--shape", type=_shape, default=None, metavar="LAYERS,HIDDEN",
                   help="the model's layers and hidden size (default: from the config, see model_shape)")
    p.add_argument("--extrapolate", action="store_true",
                   help="scale a job's step time from a measured step at another shape when its own shape was not "
                        "measured (an upper estimate: see the module's docstring), marked '*'")
    p.add_argument("--disk", action="store_true", help="only print the disk the study's checkpoints need")
    args = p.parse_args(argv)
    if args.disk:
        d = disk_bytes(study_config(args.config))
        print(f"{args.config}: {d['parameters'] / 1e6:.1f}M parameters; checkpoints {d['checkpoints'] / 2**30:.2f} GiB "
              f"kept, + {d['resumable'] / 2**30:.2f} GiB resumable state per GPU while a job runs")
        return 0
    if not args.measured:
        p.error("give the gpu_check JSON results (benchmarks/lease/h200/*.json)")
    if args.extrapolate and args.shape:
        p.error("--extrapolate needs the model's own sizes (from the config), not --shape")
    cfg = study_config(args.config)
    res = estimate(cfg, load_measurements(args.measured), args,
                   load_references(args.measured) if args.extrapolate else None)
    if res["missing"]:
        print("gpu_hours: no eager measurement for: " + "; ".join(res["missing"]), file=sys.stderr)
        return 2
    n_sched = len(cfg["schedules"]) + len(expand_sweeps(cfg.get("sweeps")))  # a sweep's points are schedules of the study
    print(f"{args.config}: {n_sched} schedules x {len(cfg['seeds'])} seeds")
    print(f"{'stage':<9} {'precision':<40} {'steps':>6} {'one run (min)':>14} {'all seeds (h)':>14}")
    tot = defaultdict(lambda: [0.0, 0.0])
    for j in res["jobs"]:
        lo, hi = j["run_s"]
        spec = j["spec"] if j["stage"] == "finetune" else run_key(j["spec"])  # a schedule; a stage-1 run's name
        print(f"{j['stage']:<9} {spec:<40} {j['steps']:>6} {span(lo / 60, hi / 60, '.1f'):>14} "
              f"{span(lo * j['seeds'] / 3600, hi * j['seeds'] / 3600, '.2f'):>14}" + (" *" if j["extrapolated"] else ""))
        tot[j["stage"]][0] += lo * j["seeds"] / 3600
        tot[j["stage"]][1] += hi * j["seeds"] / 3600
    all_lo, all_hi = sum(v[0] for v in tot.values()), sum(v[1] for v in tot.values())
    for stage, (lo, hi) in tot.items():
        print(f"{stage}: {span(lo, hi, '.1f')} GPU-hours")
    print(f"total: {span(all_lo, all_hi, '.1f')} GPU-hours (step overhead {args.step_overhead_ms:g} ms; "
          f"per job {args.stage1_job_s:g} s stage 1, {args.stage2_job_s:g} s stage 2)"
          + (", * extrapolated" if res["extrapolated"] else ""))
    if res["extrapolated"]:
        print("* not measured at its shape: the step time measured at another, times the largest ratio (target over "
              "measured) of ops per step, model FLOPs, activations and parameters; an upper estimate if the GPU "
              "does no worse per op, FLOP and byte at the new shape:")
        for (objective, prec, b, seq, layers, hidden), rows in res["extrapolated"].items():
            for e in rows:
                ref, m = e["ref"], e["ref"]["model"]
                print(f"  {objective} {prec} batch {b} x {seq} ({layers} layers, {hidden} hidden) from batch "
                      f"{ref['batch']} x {ref['seq']} ({m['num_hidden_layers']} layers, {m['hidden_size']} hidden; "
                      f"{ref['file']}): ops x{e['ops']:.2f}, FLOPs x{e['flops']:.2f}, activations "
                      f"x{e['activations']:.2f}, parameters x{e['parameters']:.2f}: "
                      f"{ref['step_seconds'] * 1000:.1f} ms -> {e['step_seconds'] * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
