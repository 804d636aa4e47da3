"""What a stage records: each step's results in the loop state and steps.csv, the checkpoint, metrics.json."""

from __future__ import annotations

import csv
import io
import math
import statistics
from typing import NamedTuple

import numpy as np
import torch

from ... import gpu, measure
from ... import precision as P
from ...io import atomic_path, atomic_write_json, atomic_write_text, refused_writes
from .inputs import STAGE_FILE
from .stage import Stage
from .state import STEP_FIELDS, LoopState, StepRow
from .step import StepResult


class RanStep(NamedTuple):
    """A step that ran, before its device results are read back."""

    step: int
    result: StepResult
    lr: float
    samples: int
    tokens: int
    empty: bool


def read_back(ran: list[RanStep]) -> list[tuple[float, float, float | None, bool]]:
    """(loss, grad_norm, loss_scale, skipped) of each step, in one device-to-host transfer."""
    parts = []
    for r in ran:
        x = [r.result.loss.float(), r.result.grad_norm.float().to(r.result.loss.device)]
        if r.result.loss_scale is not None:
            x += [r.result.loss_scale.float(), r.result.skipped.float()]
        parts.append(torch.stack(x))
    flat = torch.cat(parts).tolist()
    out, i = [], 0
    for r in ran:
        if r.result.loss_scale is not None:
            out.append((flat[i], flat[i + 1], flat[i + 2], bool(flat[i + 3])))
            i += 4
        else:
            out.append((flat[i], flat[i + 1], None, False))
            i += 2
    return out


def record_steps(loop: LoopState, ran: list[RanStep], seconds: float, *, log_every: int, total_steps: int,
                 max_nonfinite: int) -> None:
    """Add the steps that ran to the loop state: counters, steps.csv rows, the non-finite run (divergence). Each
    step's time is its share of ``seconds`` (on a CPU, one step at a time: its own). A stage that diverges stops
    recording at the step it diverged at."""
    dt = seconds / len(ran)
    for r, (loss, grad_norm, scale, skipped) in zip(ran, read_back(ran)):
        loop.train_seconds += dt
        loop.step_times.append(dt)
        loop.samples += r.samples
        loop.tokens += r.tokens
        loop.skipped += int(skipped)
        loop.mlm_empty += int(r.empty)
        if scale is not None:
            loop.loss_scales.append(scale)
        if not r.empty:  # a batch without a masked token has a zero gradient by construction: not a measured norm
            loop.grad_norms.append(grad_norm)
        # no masked token: no loss to log (an empty cell, not its zero: it would read as a perfect batch)
        row = StepRow(r.step + 1, None if r.empty else loss, r.lr, grad_norm, scale, round(dt, 6), int(skipped))
        # every skipped step gets its own row (as well as every log_every-th step), so steps.csv and
        # the loss_scale plot show each skip at its step, not only those that fall on a logged one
        if r.step % log_every == 0 or r.step == total_steps - 1 or skipped:
            loop.rows.append(row)
        loop.step = r.step + 1
        if r.empty:
            continue  # nothing was scored: neither a non-finite loss nor a finite one (the run of them goes on)
        if math.isfinite(loss):
            loop.consecutive_nonfinite = 0
            continue
        loop.nonfinite += 1
        loop.consecutive_nonfinite += 1
        loop.first_nonfinite = loop.first_nonfinite or r.step + 1
        if loop.consecutive_nonfinite >= max_nonfinite:
            loop.diverge(f"{loop.consecutive_nonfinite} consecutive non-finite losses "
                         f"(max_nonfinite={max_nonfinite}); first at step {loop.first_nonfinite}")
            if not loop.rows or loop.rows[-1] is not row:  # the step it stopped at: the last row
                loop.rows.append(row)
            return


def write_json(path, obj) -> None:
    with refused_writes(path):
        atomic_write_json(path, obj)


def write_steps_csv(path, rows: list[StepRow]) -> None:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(STEP_FIELDS)
    writer.writerows(rows)
    with refused_writes(path):
        atomic_write_text(path, buf.getvalue())


def write_checkpoint(s: Stage, status: str, reason: str | None = None) -> None:
    """checkpoint/: the weights in the stage's storage dtype, the tokenizer and the stage file the next stage reads
    (a skipped stage's holds the stage file only, status skipped); written atomically, so a checkpoint there before
    is kept whole when the disk refuses."""
    stage_file = {"run_id": s.hp["run_id"], "precision": s.prec.name, "objective": s.hp["objective"],
                  "dtype": None if status == "skipped" else P.dtype_name(s.prec.param_dtype), "status": status,
                  **({"status_reason": reason} if status == "skipped" else {}), "config_hash": s.config_hash,
                  **({} if status == "skipped" else s.model_pin)}
    with refused_writes(s.out / "checkpoint"), atomic_path(s.out / "checkpoint") as tmp:
        if status == "skipped":
            tmp.mkdir()
        else:
            s.model.save_pretrained(tmp)
            s.tokenizer.save_pretrained(tmp)
        atomic_write_json(tmp / STAGE_FILE, stage_file)


def record_skipped(s: Stage, reason: str) -> dict:
    """Record the stage as skipped: metrics.json, a header-only steps.csv and, where the stage saves
    one, a checkpoint/ holding only its stage file (status skipped), so that the next stage, which
    starts from it, is recorded as skipped too instead of failing on a missing checkpoint."""
    write_steps_csv(s.out / "steps.csv", [])
    if s.hp["save_checkpoint"]:
        write_checkpoint(s, "skipped", reason)
    info = s.init_stage
    init_keys = ({"init": s.init, "init_run_id": info.get("run_id"), "init_precision": info.get("precision"),
                  "init_status": info.get("status")} if info else {})
    metrics = {**s.base_metrics, "status": "skipped", "status_reason": reason, **init_keys,
               **measure.provenance(s.device), **s.flags, "hparams": s.hp, "finished_at": measure.now_iso()}
    write_json(s.out / "metrics.json", metrics)
    return metrics


def write_records(s: Stage, measured: dict, evaluation: dict, checkpoint_seconds: float) -> dict:
    """steps.csv, activations.csv (telemetry on), metrics.json; then the resumable state, no longer needed, goes."""
    write_steps_csv(s.out / "steps.csv", s.loop.rows)
    if s.telemetry.enabled:
        with refused_writes(s.out / "activations.csv"):
            s.telemetry.write_csv(s.out / "activations.csv")
    eval_seconds = evaluation.pop("eval_seconds")
    metrics = {
        **s.base_metrics,
        **origin_metrics(s),
        **precision_metrics(s),
        **timing_metrics(s, eval_seconds, checkpoint_seconds),
        **resource_metrics(s, measured),
        **numerics_metrics(s),
        "eval_precision": s.eval_prec.name,
        "activation_telemetry": s.telemetry.summary() if s.telemetry.enabled else None,
        **evaluation,
        **measure.provenance(s.device),
        **gpu.claim_info(),
        "threads": s.hp["threads"],
        "compile": s.hp["compile"],
        "load_avg_1m_start": measured["load0"],  # machine load around the timed loop: above cpu_count, clocks stretch
        "load_avg_1m_end": measured["load1"],
        **s.flags,
        "resumed": s.resumed,
        "attempts": s.loop.attempts,
        "hparams": s.hp,
        "finished_at": measure.now_iso(),
    }
    write_json(s.out / "metrics.json", metrics)
    s.resume.remove()
    return metrics


def origin_metrics(s: Stage) -> dict:
    """The stage's status and where its weights and data come from."""
    return {
        "status": s.loop.status,
        "status_reason": s.loop.status_reason,
        "init": s.init,
        "init_run_id": s.init_stage.get("run_id"),
        "init_precision": s.init_stage.get("precision"),
        "init_status": s.init_stage.get("status"),
        **s.model_pin,  # model_revision, model_commit: the pinned hub revision of the pretrained weights
        "data_revision": (s.meta.get("source") or {}).get("revision"),
        "data_commit": s.meta.get("source_commit"),
        # rows of the source dropped for an empty text or label cell by `precswitch prepare` (the verdict says it)
        "train_rows_dropped": s.meta.get("train_rows_dropped"),
        "train_rows_read": s.meta.get("train_rows_read"),
    }


def precision_metrics(s: Stage) -> dict:
    prec, saved = s.prec, s.hp["save_checkpoint"]
    return {
        "switch_to": s.switch_prec.name if s.switch_prec else None,
        "switch_at": s.hp["switch_at"] if s.switch_prec else None,
        "switch_step": s.switch_step,
        "precision_final": s.current_prec.name,
        "update_compensation": prec.update_compensation,
        "param_dtype": P.dtype_name(prec.param_dtype),
        "autocast_dtype": P.dtype_name(prec.autocast_dtype) if prec.autocast_dtype else None,
        "checkpoint_dtype_written": P.dtype_name(prec.param_dtype) if saved else None,
        "checkpoint_dtype_read": s.checkpoint_dtype_read,
    }


def _warmup_steps(s: Stage) -> int:
    """The steps left out of the steady-state rates: timing_warmup_steps, or none where the stage ran no more
    than that (e.g. resumed past the warm-up)."""
    return s.hp["timing_warmup_steps"] if len(s.loop.step_times) > s.hp["timing_warmup_steps"] else 0


def timing_metrics(s: Stage, eval_seconds: float, checkpoint_seconds: float) -> dict:
    """Seconds by phase, work done, and the steady-state rates: the steps after the timing warm-up."""
    hp, loop = s.hp, s.loop
    warmup = _warmup_steps(s)
    steady = loop.step_times[warmup:]
    steady_s = sum(steady)
    tokens_per_step = loop.tokens / max(len(loop.step_times), 1)
    rate = (lambda per_step: len(steady) * per_step / steady_s) if steady_s > 0 else (lambda per_step: None)
    return {
        "train_seconds": loop.train_seconds,
        "eval_seconds": eval_seconds,
        "setup_seconds": s.setup_seconds,
        "checkpoint_seconds": checkpoint_seconds,
        "state_saves": loop.state_saves,
        "state_save_seconds": loop.state_seconds,
        "steps_planned": s.total_steps,
        "steps_completed": loop.step,
        "batch_size": hp["batch_size"],
        "model_parameters": sum(p.numel() for p in s.model.parameters()),
        "samples_seen": loop.samples,
        "tokens_seen": loop.tokens,
        "timing_warmup_steps": warmup,
        # the stage was too short to leave the warm-up out of its rates (the verdict's caveats say so)
        "timing_warmup_short": s.total_steps <= hp["timing_warmup_steps"],
        "steps_per_second": rate(1),
        "samples_per_second": rate(hp["batch_size"]),
        "tokens_per_second": rate(tokens_per_step),
        "step_seconds_median": statistics.median(steady) if steady else None,
        "step_seconds_p90": float(np.percentile(steady, 90)) if steady else None,
    }


def resource_metrics(s: Stage, measured: dict) -> dict:
    """Peak memory and energy (NVML; None on a CPU): all steps, and the steady ones after timing_warmup_steps."""
    e0, e_warm, e1 = measured["energy0"], measured["energy_warm"], measured["energy1"]
    steady = None
    if e1 is not None and e0 is not None:
        if not _warmup_steps(s):
            steady = (e1 - e0) / 1000
        elif e_warm is not None:
            steady = (e1 - e_warm) / 1000
    return {
        **measured["mem"],
        "memory_baseline_bytes": measured["rss_before"] if s.device.type == "cpu" else None,
        "energy_joules": (e1 - e0) / 1000 if e0 is not None and e1 is not None else None,
        # the steps after timing_warmup_steps, the steady-state rates' steps (None if resumed past the warm-up)
        "energy_joules_steady": steady,
    }


def numerics_metrics(s: Stage) -> dict:
    """Loss scale, skipped and non-finite steps, the last logged loss, gradient-norm statistics."""
    loop = s.loop
    scales = loop.loss_scales
    # every step's norm (not only the steps.csv rows: with log_every 10, a tenth of them), empty batches left out
    norms = [g for g in loop.grad_norms if math.isfinite(g)]
    return {
        "loss_scale_start": scales[0] if scales else None,
        "loss_scale_end": scales[-1] if scales else None,
        "loss_scale_min": min(scales) if scales else None,
        "skipped_steps": loop.skipped,
        "nonfinite_losses": loop.nonfinite,
        "first_nonfinite_step": loop.first_nonfinite,
        # masked-LM training batches without a masked token: zero loss and gradient, an empty loss in steps.csv
        "mlm_empty_batches": loop.mlm_empty if s.hp["objective"] == "mlm" else None,
        "final_train_loss": loop.last_loss(),
        "grad_norm": {
            "mean": statistics.fmean(norms) if norms else None,
            "median": statistics.median(norms) if norms else None,
            "p90": float(np.percentile(norms, 90)) if norms else None,
            "max": max(norms) if norms else None,
            "nonfinite": len(loop.grad_norms) - len(norms),
        },
    }
