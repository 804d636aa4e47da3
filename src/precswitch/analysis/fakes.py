"""Fake stage outputs (metrics.json + steps.csv, as docs/contracts.md defines them) for tests and demos.

``write_fake_study(root, ...)`` lays out ``root/runs/pretrain/{precision}/seed{seed}/`` and
``root/runs/finetune/{schedule}/seed{seed}/`` like the workflow does and returns the metrics.json paths.
Nothing here trains anything: numbers are drawn from a seeded generator with planted effects.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

#: Schedules as the user names them: name → (stage-1 precision or None for finetune-only, stage-2 precision)
DEFAULT_SCHEDULES = {
    "fp32-fp32": ("fp32", "fp32"),
    "fp16-fp32": ("amp_fp16", "fp32"),
    "fp16-fp16": ("amp_fp16", "amp_fp16"),
    "bf16-fp32": ("amp_bf16", "fp32"),
}
#: the smallest study with a comparison: one schedule against the baseline (one power analysis, not six)
TWO_SCHEDULES = {"fp32-fp32": ("fp32", "fp32"), "bf16-fp32": ("amp_bf16", "fp32")}

_SPEED = {"fp32": 1.0, "tf32": 1.0, "amp_fp16": 1.05, "amp_bf16": 1.35, "pure_fp16": 1.45, "pure_bf16": 1.9}
_MEM = {"fp32": 1.0, "tf32": 1.0, "amp_fp16": 1.1, "amp_bf16": 1.1, "pure_fp16": 0.6, "pure_bf16": 0.6}


def _provenance() -> dict:
    return {
        "device": "cpu", "device_name": "Fake CPU", "cuda_version": None, "driver_version": None,
        "cudnn_version": None, "gpu_index": None, "torch_version": "2.13.0+cpu",
        "transformers_version": "5.24.0", "datasets_version": "5.2.0", "python_version": "3.12.0",
        "threads": 2, "tf32_matmul": False, "tf32_cudnn": False, "float32_matmul_precision": "highest",
        "deterministic": True, "git_commit": "0000000", "hostname": "fakehost", "config_hash": "cafe1234",
        "started_at": "2026-11-30T07:00:00Z", "finished_at": "2026-11-30T07:01:00Z",
    }


def write_stage(out: Path, *, run_id: str, stage: str, precision: str, seed: int, status: str = "ok",
                schedule: str | None = None, init: str = "scratch", init_run_id: str | None = None,
                init_precision: str | None = None, init_status: str | None = None, metrics: dict | None = None,
                steps: int = 20,
                loss_start: float = 7.0, loss_end: float = 3.0, rng=None) -> Path:
    """Write one stage's metrics.json and steps.csv under ``out``; return the metrics.json path."""
    import numpy as np

    rng = rng if rng is not None else np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    fp16 = precision in ("amp_fp16", "pure_fp16")
    lines = ["step,loss,lr,grad_norm,loss_scale,step_seconds,skipped"]
    scale = 65536.0
    skipped_steps = 0
    scales: list[float] = []  # the scale each step ran with (the engine's loss_scale column)
    nonfinite: list[int] = []  # steps whose loss is NaN
    done = steps if status == "ok" else max(2, steps // 3)
    for i in range(1, done + 1):
        loss = loss_end + (loss_start - loss_end) * math.exp(-4 * i / steps) + rng.normal(0, 0.05)
        skipped = 0
        ls = scale if fp16 else ""  # a skipped step's row carries the scale that overflowed (contracts: steps.csv)
        if fp16:
            scales.append(scale)
        if fp16 and i in (1, 2):
            skipped, scale = 1, scale / 2
            skipped_steps += 1
        if status == "diverged" and i > done - 2:
            loss = float("nan")
            nonfinite.append(i)
        lines.append(f"{i},{loss},{1e-4},{1.0 + rng.normal(0, 0.1):.4f},{ls},"
                     f"{0.05 / _SPEED.get(precision, 1.0):.4f},{skipped}")
    (out / "steps.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    m: dict[str, Any] = {
        "schema_version": 1, "run_id": run_id, "stage": stage,
        "objective": "mlm" if stage == "pretrain" else "classify", "precision": precision, "seed": seed,
        "status": status, "status_reason": None if status == "ok" else f"{status} (fake)",
        "schedule": schedule, "init": init, "init_run_id": init_run_id, "init_precision": init_precision,
        "init_status": init_status,
        "param_dtype": "float16" if precision.startswith("pure_fp16") else
        ("bfloat16" if precision == "pure_bf16" else "float32"),
        "checkpoint_dtype_written": "float32", "checkpoint_dtype_read": None,
        "train_seconds": 60.0 / _SPEED.get(precision, 1.0) * (1 + rng.normal(0, 0.02)),
        "eval_seconds": 2.0, "setup_seconds": 4.0, "checkpoint_seconds": 0.5,
        "steps_planned": steps, "steps_completed": done, "timing_warmup_steps": 2,
        "samples_per_second": 32 * 20 * _SPEED.get(precision, 1.0) * (1 + rng.normal(0, 0.02)),
        "tokens_per_second": 64 * 32 * 20 * _SPEED.get(precision, 1.0),
        "steps_per_second": 20 * _SPEED.get(precision, 1.0), "step_seconds_median": 0.05,
        "step_seconds_p90": 0.06,
        "peak_memory_bytes": int(400 * 2**20 * _MEM.get(precision, 1.0) * (1 + rng.normal(0, 0.01))),
        "memory_kind": "cpu_peak_rss", "cuda_max_reserved_bytes": None,
        "loss_scale_start": scales[0] if fp16 else None, "loss_scale_end": scales[-1] if fp16 else None,
        "loss_scale_min": min(scales) if fp16 else None, "skipped_steps": skipped_steps,
        # a skipped (overflowed) step's loss is finite: the engine counts only NaN/inf losses
        "nonfinite_losses": len(nonfinite), "first_nonfinite_step": nonfinite[0] if nonfinite else None,
        "final_train_loss": None if status == "diverged" else loss_end,
        "grad_norm": {"mean": 1.0, "median": 1.0, "p90": 1.2, "max": 2.0},
        "eval_precision": "fp32",
        "hparams": {"steps": steps, "precision": precision}, "tags": {"schedule": schedule},
        "resumed": False, "attempts": 1,
        "model_parameters": 1_013_890 if stage == "pretrain" else 946_946,
        **_provenance(),
    }
    m.update(metrics or {})
    (out / "metrics.json").write_text(json.dumps(m, indent=2), encoding="utf-8")
    return out / "metrics.json"


def write_fake_study(root: str | Path, *, schedules: dict | None = None, seeds=range(1, 6),
                     effects: dict | None = None, sd: float = 1.0, seed_sd: float = 1.5,
                     base_accuracy: float = 80.0, majority_accuracy: float = 0.55,
                     diverged: set | None = None, degenerate: set | None = None,
                     stage1_effects: dict | None = None, rng_seed: int = 0, test_split: bool = False) -> list[Path]:
    """Write a whole fake study; return the metrics.json paths (pretrain first).

    ``effects``: schedule → accuracy shift in points; ``sd``: per-run noise SD in points;
    ``seed_sd``: SD of the per-seed effect shared by all schedules (the reason to pair);
    ``diverged``: {(schedule, seed)} whose fine-tuning diverged, or {(precision, seed)} with a stage-1
    precision, whose pre-training diverged; ``degenerate``: {(schedule, seed)} predicting the majority
    class; ``stage1_effects``: stage-1 precision → mlm_accuracy shift in points; ``test_split``: the runs also
    report a held-out test split (``test_accuracy`` ... ``test_examples``, docs/contracts.md), 1 point below dev.
    """
    import numpy as np

    root = Path(root)
    schedules = DEFAULT_SCHEDULES if schedules is None else schedules
    effects = effects or {}
    diverged = diverged or set()
    degenerate = degenerate or set()
    stage1_effects = stage1_effects or {}
    rng = np.random.default_rng(rng_seed)
    seeds = list(seeds)
    seed_effect = {s: rng.normal(0, seed_sd) for s in seeds}
    paths: list[Path] = []
    pre_ids: dict[tuple[str, int], str] = {}
    for p1 in sorted({p for p, _ in schedules.values() if p is not None}):
        for s in seeds:
            rid = f"pretrain-{p1}-seed{s}"
            status = "diverged" if (p1, s) in diverged else "ok"
            mlm = 0.30 + (stage1_effects.get(p1, 0.0) + rng.normal(0, 0.3)) / 100
            paths.append(write_stage(
                root / "runs" / "pretrain" / p1 / f"seed{s}", run_id=rid, stage="pretrain", precision=p1,
                seed=s, status=status, rng=rng,
                metrics={"eval_loss": None if status != "ok" else 4.0 - 3 * (mlm - 0.3) + rng.normal(0, 0.01),
                         "mlm_accuracy": None if status != "ok" else mlm,
                         "perplexity": None if status != "ok" else math.exp(4.0),
                         **({"eval_note": "diverged"} if status != "ok" else {})}))
            pre_ids[(p1, s)] = rid
    for name, (p1, p2) in schedules.items():
        for s in seeds:
            init_id = pre_ids.get((p1, s)) if p1 else None
            status = "ok"
            if (name, s) in diverged:
                status = "diverged"
            elif p1 is not None and (p1, s) in diverged:
                # the engine fine-tunes from a diverged stage 1's checkpoint (init_status diverged); from
                # non-finite weights the fine-tuning diverges too. Only a skipped stage 1 skips stage 2.
                status = "diverged"
            acc = (base_accuracy + seed_effect[s] + effects.get(name, 0.0) + rng.normal(0, sd)) / 100
            if (name, s) in degenerate:
                acc = majority_accuracy
            acc = min(acc, 1.0)
            metrics = {"accuracy": acc, "f1": min(1.0, acc + 0.03), "mcc": 2 * acc - 1,
                       "majority_accuracy": majority_accuracy, "eval_loss": 0.5}
            if test_split:
                metrics.update({"test_accuracy": acc - 0.01, "test_f1": min(1.0, acc + 0.02), "test_mcc": 2 * acc - 1.02,
                                "test_majority_accuracy": majority_accuracy, "test_examples": 2000})
            if status != "ok":
                metrics.update({"accuracy": None, "f1": None, "mcc": None, "eval_loss": None, "test_accuracy": None,
                                "eval_note": f"{status}: no evaluation"})
            paths.append(write_stage(
                root / "runs" / "finetune" / name / f"seed{s}", run_id=f"finetune-{name}-seed{s}",
                stage="finetune", precision=p2, seed=s, status=status, schedule=name,
                init=str(root / "runs" / "pretrain" / p1 / f"seed{s}" / "checkpoint") if p1 else "scratch",
                init_run_id=init_id, init_precision=p1, metrics=metrics, loss_start=0.7, loss_end=0.4,
                init_status=("diverged" if (p1, s) in diverged else "ok") if p1 else None,
                rng=rng))
    return paths
