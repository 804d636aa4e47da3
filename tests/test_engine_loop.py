"""The training loop's parts: run_stage is the public train_step on the engine's batches; the GPU's windowed
read-back records what the per-step one does; progress and phase lines in the stage's log."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from engine_fixtures import TINY, prepared_both, steps_rows  # noqa: E402

from precswitch import precision as P  # noqa: E402
from precswitch.train import config as C  # noqa: E402
from precswitch.train import engine  # noqa: E402
from precswitch.train.engine import run_stage  # noqa: E402
from precswitch.train.engine import batching as engine_batching, inputs as engine_inputs, loop as engine_loop  # noqa: E402

NOT_TIMES = ("step", "loss", "lr", "grad_norm", "loss_scale", "skipped")  # steps.csv but step_seconds


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_both(tmp_path_factory)


def _hand_loop(hparams: dict) -> list[tuple[float, float, float]]:
    """(loss, grad_norm, lr) of each step of a masked-LM stage, trained by hand from the engine's public parts:
    its batches, build_optimizer, train_step and the linear schedule."""
    import transformers

    hp = C.resolve(hparams)
    prec = P.get(hp["precision"])
    rows = []
    with P.restoring_global_numerics():
        torch.set_num_threads(hp["threads"])
        prec.apply_backend_flags()
        splits, meta = engine_inputs.load_data(hp)
        train_ds = splits["train"]
        tok = engine_inputs.load_tokenizer(hp, meta)
        collate = engine_batching.make_collator("mlm", tok, hp["mlm_probability"])
        batches = engine.Batches(engine_batching.model_columns(train_ds, "mlm"), hp["batch_size"], hp["seed"], collate)
        transformers.set_seed(hp["seed"])
        model = prec.prepare_model(engine_loop.build_model(hp, tok, meta)[0])
        model.train()
        opt = engine.build_optimizer(model, hp, prec)
        steps = hp["steps"]
        sched = transformers.get_linear_schedule_with_warmup(opt, int(round(hp["warmup_ratio"] * steps)), steps)
        scaler = prec.make_scaler("cpu")
        for step in range(steps):
            b = batches.get(step)
            b.update(zip(engine.HEAD_KEYS, engine.mlm_head_rows(b["labels"])))
            r = engine.train_step(model, engine.drop_full_attention_mask(b), opt, scaler, prec, objective="mlm",
                                  device_type="cpu", max_grad_norm=hp["max_grad_norm"])
            rows.append((float(r.loss), float(r.grad_norm), sched.get_last_lr()[0]))
            sched.step()
    return rows


@pytest.mark.parametrize("prec", ["fp32", "amp_bf16"])
def test_a_stage_is_train_step_on_the_engines_batches(data, tmp_path, prec):
    """Every step of run_stage equals a hand loop over build_optimizer and train_step (the step gpu_check times):
    the same losses, gradient norms and learning rates, bit for bit."""
    hp = {"data": str(data["mlm"]), "precision": prec, "steps": 6, "seed": 5, "model": TINY,
          "save_checkpoint": False, "log_every": 1}
    run_stage(hp, tmp_path / "s")
    stage = [(float(r["loss"]), float(r["grad_norm"]), float(r["lr"])) for r in steps_rows(tmp_path / "s")]
    assert len(stage) == 6
    assert stage == _hand_loop(hp)


@pytest.mark.parametrize("case", [
    {"precision": "fp32", "log_every": 3, "steps": 8},
    {"precision": "amp_fp16", "log_every": 4, "steps": 7, "checkpoint_every_steps": 3,  # a NaN loss every 3rd step
     "max_nonfinite_fraction": 0.5},
    # eps 1e-8 is 0 in fp16 math: NaN losses, diverged inside a window
    {"precision": "pure_fp16", "log_every": 5, "steps": 12, "optimizer_impl": "foreach", "adam_eps": 1e-8},
])
def test_read_back_every_log_every_steps_records_what_every_step_does(data, tmp_path, monkeypatch, case):
    """A GPU's loop reads the steps' results back every log_every steps (one sync per window, not per step).
    Run that way here, on the CPU, a stage records the same steps.csv rows (times aside), counters, loss
    scales and status (a divergence at the step it reached max_nonfinite) as the per-step read-back."""
    calls = []
    if case["precision"] == "amp_fp16":  # skipped steps inside the windows
        real = engine.forward_loss

        def every_third_nan(*a):
            calls.append(1)
            return real(*a) * (float("nan") if len(calls) % 3 == 0 else 1.0)

        monkeypatch.setattr(engine_loop, "forward_loss", every_third_nan)
    hp = {"data": str(data["mlm"]), "seed": 2, "model": TINY, "save_checkpoint": False, "max_nonfinite": 3, **case}
    every = run_stage(hp, tmp_path / "every")
    calls.clear()
    syncs = []
    real_sync = engine_loop.measure.sync
    monkeypatch.setattr(engine_loop, "reads_every_step", lambda device: False)
    monkeypatch.setattr(engine_loop.measure, "sync", lambda device: (syncs.append(1), real_sync(device)))
    windowed = run_stage(hp, tmp_path / "windowed")

    def rows(d):
        return [{k: r[k] for k in NOT_TIMES} for r in steps_rows(d)]

    assert rows(tmp_path / "windowed") == rows(tmp_path / "every")
    keys = ("status", "status_reason", "steps_completed", "nonfinite_losses", "first_nonfinite_step",
            "skipped_steps", "loss_scale_start", "loss_scale_end", "final_train_loss", "grad_norm", "samples_seen",
            "tokens_seen", "state_saves")
    assert repr({k: windowed[k] for k in keys}) == repr({k: every[k] for k in keys})  # nan == nan here
    n = every["steps_completed"]
    if case["precision"] == "pure_fp16":
        assert every["status"] == "diverged" and n < case["steps"]
    else:
        assert every["status"] == "ok" and n == case["steps"]
        assert every["skipped_steps"] == (2 if case["precision"] == "amp_fp16" else 0)
        # one sync per window (logged steps, state saves, the warm-up's end, the last step) + 2 around eval
        assert len(syncs) - 2 < n
    assert windowed["train_seconds"] > 0 and len([r for r in steps_rows(tmp_path / "windowed")]) >= 2


def test_the_log_shows_each_phase_and_a_progress_bar(data, tmp_path, capsys):
    """stderr (the stage's log in the workflow) names each phase as it starts, in order, and carries tqdm's
    progress: step of total, steps/s and the loss."""
    run_stage({"data": str(data["mlm"]), "steps": 5, "model": TINY, "log_every": 2}, tmp_path / "s")
    err = capsys.readouterr().err
    phases = re.findall(r"phase (\w+) \(\+", err)
    assert phases == ["data", "model", "training", "eval", "checkpoint"]
    bar = re.findall(r"(\d+)/5 \[[^\]]*step/s, loss=([\d.]+)\]", err)
    assert bar and bar[-1][0] == "5"
    assert float(bar[-1][1]) == pytest.approx(float(steps_rows(tmp_path / "s")[-1]["loss"]), rel=1e-3)


def test_progress_false_leaves_the_bar_out_not_the_phases(data, tmp_path, capsys):
    run_stage({"data": str(data["mlm"]), "steps": 3, "model": TINY, "progress": False, "save_checkpoint": False},
              tmp_path / "s")
    err = capsys.readouterr().err
    assert "step/s" not in err and "/3 [" not in err
    assert re.findall(r"phase (\w+) \(\+", err) == ["data", "model", "training", "eval", "checkpoint"]
