"""One training stage from top to bottom: set-up, resume, the loop, evaluation, checkpoint, records.

The loop is deliberately plain (nanoGPT style): the only place precision enters is ``prec.autocast(...)`` around
the forward pass, the loss scaler around backward/step (both in :func:`.step.train_step`), and
``prec.prepare_model`` for the storage dtype. Everything measured goes to ``metrics.json`` (docs/contracts.md,
"metrics.json") and the per-step log ``steps.csv``.
"""

from __future__ import annotations

import copy
import math
import os
import sys
import time
import warnings
from pathlib import Path
import torch

from ... import METRICS_SCHEMA_VERSION, gpu, measure
from ... import precision as P
from ...errors import PrecisionUnsupported, PrecswitchError
from ...io import WriteRefused
from ...telemetry import ActivationTelemetry
from .. import config as C
from ...stage_rules import switch_step
from .batching import COMPILED_PAD_MULTIPLE, Batches, Prefetch, eval_batches, make_collator, model_columns
from .evaluate import NO_EVAL_MASK, blown_up, evaluate, held_out_metrics
from .inputs import build_model, init_info, load_data, load_tokenizer, model_pin, quiet_transformers
from .records import RanStep, record_skipped, record_steps, write_checkpoint, write_records
from .stage import Stage
from .state import LoopState, ResumeFile, StopSignals, run_dir_lock, set_rng_state, rng_state
from .step import build_optimizer, cls_only_last_layer, forward_loss, train_step

#: the progress bar's shortest interval between two lines in a log file (not a terminal), seconds
PROGRESS_SECONDS = 5.0


def run_stage(hparams: dict, out_dir: str | os.PathLike, on_locked=None) -> dict:
    """Run one stage. Returns the metrics dict (also written to ``out_dir/metrics.json``).

    Raises PrecswitchError for bad input (before training), when another process trains into ``out_dir``, and when
    the disk refuses a write (one line naming the file; the stage can be rerun); Preempted after SIGTERM or SIGINT
    (state saved). The process-wide numeric switches the stage sets (TF32, float32 matmul precision, deterministic
    algorithms, threads) are the caller's again when it returns or raises
    (:func:`precswitch.precision.restoring_global_numerics`). ``on_locked``: called once the stage holds ``out_dir``
    (the CLI's --log opens the log file then, so a refused run does not truncate the holder's).
    """
    C.resolve(hparams)  # bad hparams are named before anything is created
    with run_dir_lock(Path(out_dir)), P.restoring_global_numerics():
        if on_locked is not None:
            on_locked()
        s = open_stage(hparams, out_dir)
        reason = skip_reason(s)
        if reason:
            try:
                return record_skipped(s, reason)
            except WriteRefused as e:
                raise PrecswitchError(f"{e}; free space (or make it writable) and run the same command again") from None
        return _train_and_record(s)


def _train_and_record(s: Stage) -> dict:
    _phase(s, "data")
    setup_data(s)
    _phase(s, "model")
    setup_model(s)
    setup_training(s)
    restore_state(s)
    with StopSignals() as stop:
        s.setup_seconds = time.perf_counter() - s.t_setup - (gpu.claim_info()["gpu_slot_wait_seconds"] or 0.0)
        _phase(s, "training")
        measured = train_loop(s, stop)
        _phase(s, "eval")
        evaluation = evaluate_stage(s)
        if stop.requested:  # preempted while evaluating: keep the finished training, not the evaluation
            save_state(s)
            raise stop.preempted(f"after step {s.loop.step} (evaluation)", s.resume.path)
        # SIGTERM and SIGINT stay caught until the checkpoint is written: stopped during evaluation, the stage
        # saves its finished training (a rerun evaluates it); during the checkpoint write, it finishes (seconds)
        _phase(s, "checkpoint")
        t_checkpoint = time.perf_counter()
        try:
            if s.hp["save_checkpoint"]:
                write_checkpoint(s, s.loop.status)
        except WriteRefused as e:
            raise _write_failed(s, e) from None
    checkpoint_seconds = time.perf_counter() - t_checkpoint + s.loop.state_seconds
    try:
        return write_records(s, measured, evaluation, checkpoint_seconds)
    except WriteRefused as e:
        raise _write_failed(s, e) from None


def _write_failed(s: Stage, error: WriteRefused) -> PrecswitchError:
    """A write at the end of the stage failed (a full disk, a quota, a read-only mount): one line naming the file,
    and the training kept resumable: its state saved now (the rerun evaluates and writes it), or, where that
    cannot be written either, the last state saved during the loop kept as it was (written atomically)."""
    try:
        save_state(s)
        kept = f"the finished training is saved in {str(s.resume.path)!r}"
    except WriteRefused:
        kept = (f"the last resumable state {str(s.resume.path)!r} is kept" if s.resume.path.is_file()
                else "no resumable state could be saved either: the stage starts over")
    return PrecswitchError(f"{error}; {kept}; free space (or make it writable) and run the same command again")


def _phase(s: Stage, name: str) -> None:
    """One line in the stage's log when a phase starts: data, model, training, eval, checkpoint."""
    print(f"precswitch train {s.hp['run_id']}: phase {name} (+{time.perf_counter() - s.t_setup:.1f} s)",
          file=sys.stderr, flush=True)


# ------------------------------------------------------------------ set-up
def open_stage(hparams: dict, out_dir) -> Stage:
    """Resolve the hyper-parameters, check the output dir, claim the device, set threads and backend flags."""
    t_setup = time.perf_counter()
    started_at = measure.now_iso()
    hp = C.resolve(hparams)
    prec = P.get(hp["precision"])
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise PrecswitchError(f"output dir {str(out)!r} is not writable: {e.strerror}") from None
    if hp["deterministic"]:  # cuBLAS refuses deterministic mode without a fixed workspace (read at first use)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_num_threads(hp["threads"])
    # One timed job per GPU: a bare `cuda` takes the first free GPU slot (a lock file per GPU, held
    # until this process exits); `cuda:N` waits for GPU N. CPU: unchanged. See precswitch.gpu.
    device = gpu.claim_device(C.resolve_device(hp["device"]))
    flags = prec.apply_backend_flags()
    config_hash = C.config_hash(hp)
    base = {
        "schema_version": METRICS_SCHEMA_VERSION, "run_id": hp["run_id"], "stage": hp["stage"],
        "objective": hp["objective"], "precision": prec.name, "seed": hp["seed"],
        "schedule": hp["tags"].get("schedule"), "tags": hp["tags"], "config_hash": config_hash,
        "started_at": started_at,
    }
    return Stage(hp=hp, out=out, t_setup=t_setup, prec=prec,
                 switch_prec=P.get(hp["switch_to"]) if hp["switch_to"] else None,
                 eval_prec=prec if hp["eval_precision"] == "same" else P.get(hp["eval_precision"]), device=device,
                 flags=flags, config_hash=config_hash, base_metrics=base, init=str(hp["init"]))


def skip_reason(s: Stage) -> str | None:
    """Why the stage is recorded as skipped instead of run: a precision this device lacks (on_unsupported: skip),
    or an init checkpoint whose own stage was skipped. None: it runs."""
    try:  # every precision the stage would run: its own, the in-stage switch_to, the eval precision
        for p in {q.name: q for q in (s.prec, s.switch_prec, s.eval_prec) if q is not None}.values():
            P.check_supported(p, s.device)
    except PrecisionUnsupported as e:
        if s.hp["on_unsupported"] != "skip":
            raise
        return str(e)  # recorded without its init keys
    s.init_stage = init_info(s.init)
    if s.init_stage.get("status") == "skipped":  # nothing to start from: recorded, as its stage 1 was
        return (f"its init {s.init!r} is stage {s.init_stage.get('run_id')!r}, which was skipped: "
                f"{s.init_stage.get('status_reason')}")
    return None


def setup_data(s: Stage) -> None:
    """Libraries quiet, the prepared data and tokenizer, the step count, the training batches (built per step)
    and the evaluation batches (built once: dev, and test where the data holds a test split)."""
    hp = s.hp
    torch.use_deterministic_algorithms(hp["deterministic"])  # set every run, either way (as the TF32 switches)
    s.flags = P.backend_flags()
    quiet_transformers()
    if hp["objective"] == "classify":  # the task metrics; a masked-LM stage is spared sklearn and scipy (~3 s)
        import sklearn.metrics  # noqa: F401 - imported in set-up, so eval_seconds times evaluation, not imports
    # GradScaler skips optimizer.step() on overflow by design; the scheduler still advances (as in PyTorch's AMP
    # recipe; HF Trainer instead holds it back on a skipped step), so step t has the same LR in every precision.
    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")

    splits, s.meta = load_data(hp)
    s.tokenizer = load_tokenizer(hp, s.meta)
    train_rows = len(splits["train"])
    if hp["batch_size"] > train_rows:
        raise PrecswitchError(
            f"batch_size {hp['batch_size']} is larger than the training set ({train_rows} rows in {hp['data']!r})")
    per_epoch = train_rows // hp["batch_size"]  # = Batches.per_epoch
    s.total_steps = hp["steps"] if hp["steps"] is not None else max(1, int(round(hp["epochs"] * per_epoch)))
    s.switch_step = switch_step(hp, s.total_steps)  # an epochs stage's switch point: refused before training
    if s.total_steps <= hp["timing_warmup_steps"]:  # metrics.json's timing_warmup_short; the verdict says it
        print(f"precswitch train {hp['run_id']}: warning: the stage has {s.total_steps} step(s), not more than "
              f"timing_warmup_steps {hp['timing_warmup_steps']}: its steady-state rates include the warm-up "
              "(use more steps or epochs, or fewer timing_warmup_steps)", file=sys.stderr, flush=True)

    pad16 = 16 if s.prec.fp8_linear else None  # an in-stage switch keeps fp8 (config.resolve: same weight storage)
    collate = make_collator(hp["objective"], s.tokenizer, hp["mlm_probability"], pad16)
    train_collate = collate
    if hp["compile"] != "off" and hp["objective"] == "classify":
        # compiled: pad training batches to a multiple of 32 (a few shapes), not each to its longest pair
        # (a shape per batch: a recompile or, with CUDA graphs, a recorded graph for each); eval stays eager
        train_collate = make_collator(hp["objective"], s.tokenizer, hp["mlm_probability"], COMPILED_PAD_MULTIPLE)
    s.batches = Batches(model_columns(splits["train"], hp["objective"]), hp["batch_size"], hp["seed"], train_collate)
    eval_rows = model_columns(splits["eval"], hp["objective"])
    s.eval_batches = eval_batches(eval_rows, collate, hp["eval_batch_size"], hp["eval_seed"])
    if hp["objective"] == "mlm" and not any(bool((b["labels"] != -100).any()) for b in s.eval_batches):
        raise PrecswitchError(f"{NO_EVAL_MASK} ({len(eval_rows)} eval rows in {hp['data']!r}, mlm_probability "
                              f"{hp['mlm_probability']}, eval_seed {hp['eval_seed']}); refused before training")
    if "test" in splits and hp["objective"] == "classify":  # built under its own fixed RNG, as the dev batches
        test_rows = model_columns(splits["test"], hp["objective"])
        s.test_batches = eval_batches(test_rows, collate, hp["eval_batch_size"], hp["eval_seed"])


def setup_model(s: Stage) -> None:
    """The seeded model (scratch or the init checkpoint) in the precision's storage dtype on the device."""
    import transformers

    hp = s.hp
    transformers.set_seed(hp["seed"])
    model, s.checkpoint_dtype_read = build_model(hp, s.tokenizer, s.meta, s.device)
    s.model_pin = model_pin(hp, s.init, s.init_stage)
    max_pos = model.config.max_position_embeddings
    if int(s.meta.get("max_length", 0)) > max_pos:
        raise PrecswitchError(
            f"data max_length {s.meta['max_length']} exceeds the model's position embeddings ({max_pos}); "
            f"lower max_length or raise model.max_position_embeddings"
        )
    model = s.prec.prepare_model(model).to(s.device)
    if hp["objective"] == "classify" and not s.prec.fp8_linear:
        cls_only_last_layer(model)  # same loss and gradients, less work (fp8 keeps full shapes)
    model.train()
    s.model = model


def setup_training(s: Stage) -> None:
    """Optimizer, LR schedule, loss scaler, activation telemetry and the (compiled or eager) training loss."""
    import transformers

    hp = s.hp
    s.optimizer = build_optimizer(s.model, hp, s.prec)
    warmup = int(round(hp["warmup_ratio"] * s.total_steps))
    s.scheduler = transformers.get_linear_schedule_with_warmup(s.optimizer, warmup, s.total_steps)
    s.scaler = s.precision_at(0).make_scaler(s.device.type)
    s.telemetry = ActivationTelemetry(s.model, every=hp["telemetry_every"])
    # torch.compile (hparam compile; off = eager): the training forward and loss only; evaluation stays
    # eager. Compilation happens in the first steps, inside train_seconds (timing_warmup_steps excludes
    # it from the steady-state rates). reduce-overhead replays CUDA graphs: each step is marked new.
    s.train_loss = forward_loss if hp["compile"] == "off" else torch.compile(forward_loss, mode=hp["compile"])
    s.cudagraphs = hp["compile"] == "reduce-overhead" and s.device.type == "cuda"


# ------------------------------------------------------------------ state save / restore
def restore_state(s: Stage) -> None:
    """Continue from resume/state.pt where a stopped run of the same hyper-parameters left one (a stale one,
    of other hyper-parameters, is set aside); else start at step 0."""
    s.resume = ResumeFile(Path(s.hp["resume_dir"] or s.out / "resume"))
    saved = s.resume.load(s.config_hash)
    if saved is not None:
        s.model.load_state_dict(saved["model"])
        s.optimizer.load_state_dict(saved["optimizer"])
        s.scheduler.load_state_dict(saved["scheduler"])
        s.loop = LoopState.from_dict(saved["loop"])
        done = s.resume.saved_seconds()
        if done.get("state_saves") == s.loop.state_saves:  # the same save: state.pt holds all but its own seconds
            s.loop.state_seconds = done["state_seconds"]
        s.scaler = s.precision_at(s.loop.step).make_scaler(s.device.type)
        if s.scaler is not None and saved["scaler"] is not None:
            s.scaler.load_state_dict(saved["scaler"])
        if saved.get("telemetry"):
            s.telemetry.load_state_dict(saved["telemetry"])
        set_rng_state(saved["rng"])
        s.resumed = True
    s.loop.attempts += 1


def save_state(s: Stage) -> None:
    """Save everything a rerun needs to continue bit for bit (resume/state.pt), counted in the loop state."""
    s.resume.save(s.loop, lambda: {
        "config_hash": s.config_hash, "model": s.model.state_dict(), "optimizer": s.optimizer.state_dict(),
        "scheduler": s.scheduler.state_dict(), "scaler": s.scaler.state_dict() if s.scaler is not None else None,
        "rng": rng_state(), "loop": s.loop.to_dict(),
        "telemetry": s.telemetry.state_dict() if s.telemetry.enabled else None,
    })


# ------------------------------------------------------------------ the loop
def _progress_bar(s: Stage):
    """tqdm on stderr (the stage's log in the workflow): step, loss, steps/s, ETA; updated at log_every steps,
    printed at most every few seconds. hparams progress false: none."""
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    return tqdm(total=s.total_steps, initial=s.loop.step, desc=s.hp["run_id"], unit="step", file=sys.stderr,
                mininterval=0.5 if tty else PROGRESS_SECONDS, ascii=None if tty else True,
                disable=s.hp["progress"] is False)


def _switch_precision(s: Stage, step: int) -> None:
    """At the in-stage switch point (and for a run resumed past it): the new precision's flags and scaler."""
    s.current_prec = s.precision_at(step)
    s.flags = s.current_prec.apply_backend_flags()
    if s.current_prec.loss_scaling and s.scaler is None:
        s.scaler = s.current_prec.make_scaler(s.device.type)
    elif not s.current_prec.loss_scaling:
        s.scaler = None


def _state_save_due(s: Stage, step: int, last_save_t: float) -> bool:
    """Whether the resumable state is saved after ``step`` steps: every checkpoint_every_steps steps or
    checkpoint_every_minutes minutes, never at the last step (metrics.json follows)."""
    hp = s.hp
    return step < s.total_steps and bool(
        (hp["checkpoint_every_steps"] and step % hp["checkpoint_every_steps"] == 0)
        or (hp["checkpoint_every_minutes"] and time.perf_counter() - last_save_t >= 60 * hp["checkpoint_every_minutes"]))


def _save_state_in_loop(s: Stage) -> None:
    try:
        save_state(s)
    except WriteRefused as e:  # atomic: the state saved before, if any, is still there
        raise PrecswitchError(f"{e}; the state saved before it, if any, is kept; free space (or make it writable) "
                              "and run the same command again") from None


def reads_every_step(device: torch.device) -> bool:
    """Whether the loop reads each step's results back as the step ends: on a CPU (nothing to wait for), not on
    a GPU (a read waits for the device: they are read every log_every steps)."""
    return device.type == "cpu"


def train_loop(s: Stage, stop: StopSignals) -> dict:
    """Train the steps left. Returns the loop's measurements: memory, energy, machine load.

    Time per step = wall from the end of the previous step to the end of this one (device-synchronized):
    batch collation, transfer, forward, backward, step and bookkeeping; resumable-state saves excluded.
    On a CPU every step is read back at its end. On a GPU the loop does not wait for the device each step: the
    steps' losses, norms and scales stay there and are read back together every log_every steps (and before a
    state save, at the end of the timing warm-up, at the last step), each step timed as its share of that window; a stage that reaches max_nonfinite is recorded up to that step, as on a CPU."""
    hp, loop, device = s.hp, s.loop, s.device
    measure.reset_peak_memory(device)
    measured = {"rss_before": measure.current_rss(), "energy0": measure.nvml_energy_mj(device),
                "energy_warm": None, "load0": measure.load_avg_1m()}
    t_prev = last_save_t = time.perf_counter()
    bar = _progress_bar(s)
    s.current_prec = s.precision_at(loop.step)  # a run resumed past its switch point starts in the switched one
    s.flags = s.current_prec.apply_backend_flags()
    prefetch = Prefetch(s.batches, hp["objective"], compiled=hp["compile"] != "off")
    ran: list[RanStep] = []
    step = loop.step
    try:
        while step < s.total_steps and loop.status == "ok":  # a diverged stage resumed: no more steps
            if s.precision_at(step) is not s.current_prec:  # the in-stage switch point
                _switch_precision(s, step)
            host = prefetch.take(step)
            next_step = step + 1
            result = train_step(
                s.model, host.to(device), s.optimizer, s.scaler, s.current_prec, objective=hp["objective"],
                device_type=device.type,
                # a batch with no masked token runs eager: the compiled graph never sees 0 head rows
                loss_fn=forward_loss if host.empty else s.train_loss, max_grad_norm=hp["max_grad_norm"] or math.inf,
                watch=s.telemetry.step(step), cudagraphs=s.cudagraphs,
                # host work while the GPU runs the queued kernels (no sync above)
                between=(lambda: prefetch.build(next_step)) if next_step < s.total_steps else None,
            )
            ran.append(RanStep(step, result, s.scheduler.get_last_lr()[0], host.samples, host.tokens, host.empty))
            s.scheduler.step()
            step = next_step

            save_due = _state_save_due(s, step, last_save_t)
            log_due = (step - 1) % hp["log_every"] == 0 or step == s.total_steps
            if not (reads_every_step(device) or stop.requested or save_due or log_due
                    or step == hp["timing_warmup_steps"]):
                continue  # on a GPU: read back later, with the rest of the log_every window
            measure.sync(device)
            now = time.perf_counter()
            record_steps(loop, ran, now - t_prev, log_every=hp["log_every"], total_steps=s.total_steps,
                         max_nonfinite=hp["max_nonfinite"])
            t_prev, ran = now, []
            if step == hp["timing_warmup_steps"] and measured["energy0"] is not None:  # synced above: read once
                measured["energy_warm"] = measure.nvml_energy_mj(device)
            if log_due or loop.status != "ok":
                last = loop.last_loss()
                bar.set_postfix(loss=f"{last:.4g}" if last is not None else "-", refresh=False)
                bar.update(loop.step - bar.n)
            if loop.status != "ok":
                break
            if stop.requested or save_due:  # a signal may have come during the sync above
                _save_state_in_loop(s)
                last_save_t = t_prev = time.perf_counter()
                if stop.requested:
                    raise stop.preempted(f"at step {loop.step}", s.resume.path)
    finally:
        bar.close()
    measured.update(mem=measure.peak_memory(device), energy1=measure.nvml_energy_mj(device),
                    load1=measure.load_avg_1m())
    return measured


# ------------------------------------------------------------------ evaluation
def evaluate_stage(s: Stage) -> dict:
    """Evaluate the trained model (in eval_precision: the precision the stage ended in, or another, on a copy) on
    the dev split, then on the test split where there is one; a non-finite or blown-up dev result marks the stage
    diverged. Returns the eval metrics with eval_seconds (the dev evaluation's)."""
    hp, loop = s.hp, s.loop
    t_eval = time.perf_counter()
    measure.sync(s.device)
    if hp["eval_precision"] == "same":
        s.eval_prec = s.current_prec  # the precision the stage ended in
    s.eval_prec.apply_backend_flags()
    eval_model = s.model
    if s.eval_prec.param_dtype != s.prec.param_dtype or s.eval_prec.fp8_linear != s.prec.fp8_linear:
        eval_model = s.eval_prec.prepare_model(copy.deepcopy(s.model))
    dev = evaluate(eval_model, s.eval_batches, hp["objective"], s.eval_prec, s.device, s.meta)
    measure.sync(s.device)
    eval_seconds = time.perf_counter() - t_eval
    test = {}
    if s.test_batches is not None:
        test = held_out_metrics(evaluate(eval_model, s.test_batches, hp["objective"], s.eval_prec, s.device, s.meta),
                                s.meta)
    del eval_model
    if loop.status == "ok" and dev.get("eval_note"):
        loop.diverge(f"final model is not finite: {dev['eval_note']}")
    if loop.status == "ok":
        reason = blown_up(loop.nonfinite, loop.step - loop.mlm_empty, dev.get("eval_loss"), hp["objective"],
                          int(s.model.config.vocab_size), hp["max_nonfinite_fraction"])
        if reason:
            loop.diverge(reason)
    return {**dev, **test, "eval_seconds": eval_seconds}
