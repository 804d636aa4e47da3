"""What a stage records where the mutation audits found it unpinned: a skipped stage's outputs (on_unsupported skip,
and the stage 2 started from it), a checkpoint init's attention kernel and head dtype, the stage file of a switched
stage, metrics.json's loss-scale, grad-norm, provenance and size fields, the resumable state's time kept out of
the training time, and a stage resumed past its in-stage switch."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from engine_fixtures import TINY, make_prepared, preempted_then_resumed, prepared_both, steps_rows, tiny_bert_mlm  # noqa: E402

from precswitch import precision as P  # noqa: E402
from precswitch.train import engine  # noqa: E402
from precswitch.train.engine import run_stage  # noqa: E402
from precswitch.train.engine import loop as engine_loop  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_both(tmp_path_factory)


# ====================================================================== on_unsupported: skip
def test_a_skipped_stage_records_its_hparams_and_writes_no_checkpoint_when_told_not_to(data, tmp_path):
    """tf32 on a CPU with on_unsupported skip: metrics.json (with its hparams), a header-only steps.csv, and a
    checkpoint/ holding only the stage file, unless save_checkpoint is false (then none at all). The stage 2
    started from the skipped stage 1 records its init and passes on stage 1's own reason."""
    hp = {"data": str(data["mlm"]), "precision": "tf32", "steps": 2, "model": TINY, "on_unsupported": "skip"}
    s1 = run_stage(hp, tmp_path / "s1")
    assert s1["status"] == "skipped" and s1["hparams"]["precision"] == "tf32" and s1["hparams"]["steps"] == 2
    assert (tmp_path / "s1" / "steps.csv").read_text() == ",".join(engine.STEP_FIELDS) + "\n"
    assert [p.name for p in (tmp_path / "s1" / "checkpoint").iterdir()] == [engine.STAGE_FILE]
    none = run_stage({**hp, "save_checkpoint": False}, tmp_path / "none")
    assert none["status"] == "skipped" and not (tmp_path / "none" / "checkpoint").exists()

    init = str(tmp_path / "s1" / "checkpoint")
    s2 = run_stage({"data": str(data["classify"]), "objective": "classify", "stage": "finetune", "steps": 1,
                    "init": init}, tmp_path / "s2")
    assert s2["status"] == "skipped" and s2["init"] == init and s2["hparams"]["init"] == init
    why = s2["status_reason"].split("which was skipped: ", 1)[1]
    assert why == s1["status_reason"] and "tf32" in why


# ====================================================================== checkpoint init
def test_a_checkpoint_init_gets_the_hparams_attention_kernel_and_an_fp32_head(data, tmp_path, monkeypatch):
    """Stage 1 pure_bf16 (sdpa attention, bf16 safetensors), stage 2 fp32 with the default auto (eager on a CPU): the model is built
    with eager attention (not the library's default, sdpa), and its new classifier head is drawn in fp32 (from_pretrained would otherwise follow the checkpoint's
    bf16 and round the head's initial weights to bf16 before the fp32 cast)."""
    run_stage({"data": str(data["mlm"]), "precision": "pure_bf16", "adam_eps": 1e-4, "steps": 1,
               "model": {**TINY, "attn_implementation": "sdpa"}}, tmp_path / "pre")
    built = {}
    real = engine_loop.build_model

    def build(hp, *a, **k):
        model, dtype = real(hp, *a, **k)
        built.update(attn=model.config._attn_implementation, head=model.classifier.weight.detach().clone())
        return model, dtype

    monkeypatch.setattr(engine_loop, "build_model", build)
    m = run_stage({"data": str(data["classify"]), "objective": "classify", "stage": "finetune", "steps": 1,
                   "init": str(tmp_path / "pre" / "checkpoint"), "save_checkpoint": False}, tmp_path / "ft")
    assert m["status"] == "ok" and m["checkpoint_dtype_read"] == "bfloat16" and m["init_status"] == "ok"
    assert built["attn"] == "eager" and m["hparams"]["model"] == {"attn_implementation": "auto"}
    head = built["head"]
    assert head.dtype == torch.float32 and not torch.equal(head, head.to(torch.bfloat16).float())


def test_a_switched_stage_writes_its_own_precision_into_its_stage_file_and_metrics(data, tmp_path):
    """amp_fp16 switching to fp32 at 0.5: the stage file and the next stage's init_precision name the stage's
    precision (amp_fp16; precision_final says fp32), switch_at is recorded, and the next stage counts the model's
    parameters (tied embeddings once) and its batch size."""
    from transformers import BertForSequenceClassification

    s1 = run_stage({"data": str(data["mlm"]), "precision": "amp_fp16", "switch_to": "fp32", "switch_at": 0.5,
                    "steps": 4, "model": TINY}, tmp_path / "s1")
    assert (s1["switch_at"], s1["switch_step"], s1["precision_final"]) == (0.5, 2, "fp32")
    stage = json.loads((tmp_path / "s1" / "checkpoint" / engine.STAGE_FILE).read_text())
    assert stage["precision"] == "amp_fp16" and stage["status"] == "ok"
    init = str(tmp_path / "s1" / "checkpoint")
    s2 = run_stage({"data": str(data["classify"]), "objective": "classify", "steps": 2, "batch_size": 8,
                    "init": init, "save_checkpoint": False}, tmp_path / "s2")
    assert (s2["init"], s2["init_precision"], s2["init_status"]) == (init, "amp_fp16", "ok")
    model = BertForSequenceClassification.from_pretrained(init, num_labels=2)
    assert s2["model_parameters"] == sum(p.numel() for p in model.parameters())
    assert s2["batch_size"] == 8 and s2["samples_seen"] == 16


# ====================================================================== metrics.json fields
def test_loss_scale_and_grad_norm_records_of_a_stage_with_one_overflow(data, tmp_path, monkeypatch):
    """amp_fp16, a scaler starting at 1 that doubles every step, a NaN loss at step 2: the scales used are 1, 2
    (skipped: back to 1), 1, 2, 4, so loss_scale_start 1, loss_scale_min 1, loss_scale_end 4 (the last step's, as
    in steps.csv), and the NaN step's gradient norm is counted as non-finite, not averaged in."""
    monkeypatch.setattr(P.Precision, "make_scaler", lambda self, device_type: torch.amp.GradScaler(
        device_type, init_scale=1.0, growth_interval=1) if self.loss_scaling else None)
    real, calls = engine.forward_loss, []

    def nan_at_2(*a):
        calls.append(1)
        return real(*a) * (float("nan") if len(calls) == 2 else 1.0)

    monkeypatch.setattr(engine_loop, "forward_loss", nan_at_2)
    m = run_stage({"data": str(data["mlm"]), "precision": "amp_fp16", "steps": 5, "model": TINY, "log_every": 1,
                   "save_checkpoint": False}, tmp_path / "r")
    rows = steps_rows(tmp_path / "r")
    assert [float(r["loss_scale"]) for r in rows] == [1.0, 2.0, 1.0, 2.0, 4.0]
    assert (m["loss_scale_start"], m["loss_scale_min"], m["loss_scale_end"]) == (1.0, 1.0, 4.0)
    assert m["skipped_steps"] == 1 and m["nonfinite_losses"] == 1 and m["status"] == "ok"
    assert m["grad_norm"]["nonfinite"] == 1
    assert m["grad_norm"]["max"] == max(float(r["grad_norm"]) for r in rows if r["skipped"] == "0")


def test_provenance_of_the_data_the_load_around_the_loop_and_a_stage_no_longer_than_its_warm_up(
        data, tmp_path, monkeypatch):
    """data_revision and data_commit come from the data's meta.json (source.revision, source_commit); the load
    average is read before and after the loop (two readings, in that order); a stage of 2 steps with
    timing_warmup_steps 2 has no steps after the warm-up, so all its steps are timed (warm-up 0), not none."""
    src = tmp_path / "data"
    shutil.copytree(data["mlm"], src)
    meta = json.loads((src / "meta.json").read_text())
    meta.update(source={"kind": "hub", "revision": "v1.0"}, source_commit="abc123")
    (src / "meta.json").write_text(json.dumps(meta))
    loads = iter([1.5, 2.5])
    monkeypatch.setattr(engine_loop.measure, "load_avg_1m", lambda: next(loads))
    m = run_stage({"data": str(src), "steps": 2, "model": TINY, "timing_warmup_steps": 2, "save_checkpoint": False},
                  tmp_path / "r")
    assert (m["data_revision"], m["data_commit"]) == ("v1.0", "abc123")
    assert (m["load_avg_1m_start"], m["load_avg_1m_end"]) == (1.5, 2.5)
    assert m["timing_warmup_steps"] == 0 and m["steps_per_second"] is not None and m["step_seconds_median"] > 0
    assert m["checkpoint_dtype_written"] is None and not (tmp_path / "r" / "checkpoint").exists()


def test_evaluate_reports_no_perplexity_beyond_exp_range_and_no_accuracy_of_a_nan_model():
    """An mlm eval loss of hundreds of nats has no float perplexity (null, not an OverflowError); a model with NaN
    weights has neither eval loss nor masked accuracy, and says why."""
    from engine_fixtures import mlm_batch

    model = tiny_bert_mlm()
    with torch.no_grad():
        model.cls.predictions.decoder.bias.copy_(torch.linspace(0, 5e4, model.config.vocab_size))
    res = engine.evaluate(model, [mlm_batch(16)], "mlm", P.get("fp32"), CPU, {})
    assert res["eval_loss"] > 710 and res["perplexity"] is None and res["mlm_accuracy"] is not None
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight.fill_(float("nan"))
    res = engine.evaluate(model, [mlm_batch(16)], "mlm", P.get("fp32"), CPU, {})
    assert res["eval_loss"] is None and res["mlm_accuracy"] is None and res["perplexity"] is None
    assert res["eval_note"].startswith("non-finite eval loss")


# ====================================================================== resumable state
def test_a_stage_resumed_past_its_switch_trains_on_without_the_loss_scaler(data, tmp_path, monkeypatch):
    """amp_fp16 switching to fp32 after step 2 of 4, preempted during step 3 and resumed: the resumed stage runs the
    fp32 steps without a loss scaler (empty loss_scale cells) and ends with the uninterrupted run's steps.csv."""
    hp = {"data": str(data["mlm"]), "precision": "amp_fp16", "switch_to": "fp32", "switch_at": 0.5, "steps": 4,
          "model": TINY, "save_checkpoint": False, "log_every": 1}
    run_stage(hp, tmp_path / "whole")
    resumed = preempted_then_resumed(monkeypatch, hp, tmp_path / "resumed", 3)
    assert resumed["resumed"] is True and resumed["precision_final"] == "fp32"
    cols = [c for c in engine.STEP_FIELDS if c != "step_seconds"]
    rows = [[r[c] for c in cols] for r in steps_rows(tmp_path / "resumed")]
    assert [r[cols.index("loss_scale")] != "" for r in rows] == [True, True, False, False]
    assert rows == [[r[c] for c in cols] for r in steps_rows(tmp_path / "whole")]


@pytest.mark.parametrize("objective", ["mlm", "classify"])
def test_a_stage_whose_final_model_is_not_finite_is_diverged_though_every_loss_was(data, tmp_path, monkeypatch,
                                                                                   objective):
    """Every training loss finite, but the model evaluated has a NaN weight: the stage is diverged (not ok), and
    status_reason says the final model is not finite, with the evaluation's note."""
    real = engine.evaluate

    def nan_then_evaluate(model, *a, **k):
        with torch.no_grad():
            model.bert.embeddings.word_embeddings.weight.fill_(float("nan"))
        return real(model, *a, **k)

    monkeypatch.setattr(engine_loop, "evaluate", nan_then_evaluate)
    m = run_stage({"data": str(data[objective]), "objective": objective, "steps": 2, "model": TINY,
                   "save_checkpoint": False}, tmp_path / "r")
    assert m["nonfinite_losses"] == 0 and m["status"] == "diverged"
    assert m["status_reason"] == f"final model is not finite: {m['eval_note']}" and m["eval_note"]


# ====================================================================== precswitch train (CLI)
def test_train_cli_prints_the_stage_summary_and_exits_with_the_preemption_code(monkeypatch, capsys):
    """A finished stage: one JSON line with the documented summary keys (the metrics' values, null where absent),
    exit 0 also for a diverged stage; a preempted one: the code Preempted carries (130 after Ctrl-C), and a line
    on stderr."""
    from precswitch.cli import main

    keys = ("run_id", "status", "train_seconds", "steps_per_second", "eval_loss", "accuracy", "mlm_accuracy",
            "peak_memory_bytes")
    metrics = {"run_id": "r", "status": "diverged", "train_seconds": 1.5, "eval_loss": 2.0, "mlm_accuracy": 0.25,
               "peak_memory_bytes": 7, "steps_per_second": 3.0, "extra": 1}
    monkeypatch.setattr(engine, "run_stage", lambda hp, out: dict(metrics))
    assert main(["train", "--hparams", '{"data": "d", "steps": 1}', "--out", "o"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert json.loads(out[-1]) == {k: metrics.get(k) for k in keys}

    def preempted(hp, out):
        raise engine.Preempted("SIGINT (Ctrl-C) at step 3: state saved", 130)

    monkeypatch.setattr(engine, "run_stage", preempted)
    assert main(["train", "--hparams", '{"data": "d", "steps": 1}', "--out", "o"]) == 130
    assert "preempted: SIGINT (Ctrl-C) at step 3" in capsys.readouterr().err


def test_a_test_split_is_evaluated_after_the_dev_eval_and_recorded_as_test_keys(tmp_path, monkeypatch):
    """Prepared data with a held-out test split: stage 2 scores the final model on it (the eval precision's, after
    the dev eval) into test_* keys; the dev keys are those of a run without the split, bit for bit (no RNG drawn)."""
    import datasets

    root = tmp_path / "d"
    plain = make_prepared(root, "classify")
    with_test = make_prepared(root, "classify", n_test=24)
    calls = []
    real = engine_loop.evaluate
    monkeypatch.setattr(engine_loop, "evaluate", lambda model, batches, *a: calls.append(
        sum(len(b["labels"]) for b in batches)) or real(model, batches, *a))
    hp = {"objective": "classify", "stage": "finetune", "precision": "amp_bf16", "steps": 4, "model": TINY,
          "save_checkpoint": False}
    dev_only = run_stage({**hp, "data": str(plain)}, tmp_path / "dev")
    m = run_stage({**hp, "data": str(with_test)}, tmp_path / "test")
    assert calls == [40, 40, 24]  # dev, then dev and test
    test_keys = {"test_accuracy", "test_f1", "test_mcc", "test_loss", "test_examples", "test_majority_accuracy"}
    assert not test_keys & set(dev_only) and test_keys <= set(m)
    assert {k: m[k] for k in ("accuracy", "f1", "mcc", "eval_loss")} == \
        {k: dev_only[k] for k in ("accuracy", "f1", "mcc", "eval_loss")}
    labels = datasets.load_from_disk(str(with_test))["test"]["labels"]
    assert m["test_examples"] == 24 and 0 <= m["test_accuracy"] <= 1 and m["test_loss"] > 0
    assert m["test_majority_accuracy"] == max(labels.count(0), labels.count(1)) / 24
