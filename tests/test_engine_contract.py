"""Engine behaviour the mutation audits found unpinned: how evaluation runs and scores (eval mode, no autograd,
per-example weighting, the positive class, more than two labels), what a fine-tuning stage starts from and
trains in, what a diverged stage records, the optimizer settings and schedule rounding, and metrics.json's
rates and statistics against steps.csv."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

sys.path.insert(0, str(Path(__file__).parent))
from engine_fixtures import TINY, make_prepared, mlm_batch, prepared_both, steps_rows  # noqa: E402

from precswitch import precision as P  # noqa: E402
from precswitch.errors import PrecswitchError  # noqa: E402
from precswitch.train import engine  # noqa: E402
from precswitch.train.engine import run_stage  # noqa: E402
from precswitch.train.engine import loop as engine_loop, state as engine_state  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_both(tmp_path_factory)


# ====================================================================== evaluate
def _dropout_mlm():
    """A tiny BertForMaskedLM with heavy dropout, in train mode (as the training loop leaves it)."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    return BertForMaskedLM(BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.5,
                                      attention_probs_dropout_prob=0.5)).train()


def test_evaluate_runs_without_dropout_or_autograd_and_gives_the_model_back_in_train_mode():
    """The eval loss of a model with dropout 0.5 is the dropout-free loss (the same on every call, whatever the RNG),
    computed without recording a graph, and mlm_accuracy the fraction of the masked tokens predicted; the model is in
    train mode again afterwards."""
    model, batches = _dropout_mlm(), [mlm_batch(20, seed=1), mlm_batch(12, seed=2)]
    seen = []
    model.bert.register_forward_hook(lambda mod, a, out: seen.append((mod.training, torch.is_grad_enabled())))
    model.eval()
    total, correct = 0.0, 0
    with torch.no_grad():
        for b in batches:
            logits = model(**{k: v for k, v in b.items() if k != "labels"}).logits.view(-1, 97)
            labels = b["labels"].view(-1)
            total += float(torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum"))
            correct += int((logits.argmax(-1) == labels)[labels != -100].sum())
    model.train()
    seen.clear()
    runs = [engine.evaluate(model, batches, "mlm", P.get("fp32"), CPU, {}) for _ in range(2)]
    assert runs[0]["eval_loss"] == runs[1]["eval_loss"] == pytest.approx(total / 32, rel=1e-5)
    assert runs[0]["mlm_accuracy"] == correct / 32 and runs[0]["eval_masked_tokens"] == 32
    assert seen == [(False, False)] * 4 and model.training


class _FixedLogits(torch.nn.Module):
    """A classifier whose logits for example i are ``table[input_ids[i, 0]]`` (and its loss their mean
    cross-entropy, as a transformers classifier's): predictions chosen by the test."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.tensor(table, dtype=torch.float32)
        self.config = SimpleNamespace(problem_type="single_label_classification")

    def forward(self, input_ids, labels, **_):
        logits = self.table[input_ids[:, 0]]
        return SimpleNamespace(logits=logits, loss=torch.nn.functional.cross_entropy(logits, labels))


def _cls_batch(rows, labels):
    ids = torch.tensor([[r, 0] for r in rows])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.tensor(labels)}


def test_classification_eval_weighs_every_example_and_scores_label_1_as_the_positive_class():
    """A batch of 5 and a batch of 1: eval_loss is the mean over the 6 examples (not over the 2 batches). The
    predictions (TP 1, FP 2, FN 1, TN 2) give accuracy 3/6, F1 of class 1 = 2·1/(2·1 + 2 + 1) = 0.4 (class 0's
    would be 4/7) and MCC (1·2 − 2·1)/… = 0."""
    table = [[2.0, 0.0], [0.0, 2.0], [0.5, 0.0], [0.0, 3.0]]  # rows 0, 2: predict 0; rows 1, 3: predict 1
    model = _FixedLogits(table)
    # (row, label): TP (1,1); FP (1,0), (3,0); FN (0,1); TN (0,0), (2,0)
    big = _cls_batch([1, 1, 3, 0, 0], [1, 0, 0, 1, 0])
    small = _cls_batch([2], [0])
    ev = engine.evaluate(model, [big, small], "classify", P.get("fp32"), CPU, {"num_labels": 2, "majority_accuracy": 4 / 6})
    logits = torch.tensor([table[r] for r in [1, 1, 3, 0, 0, 2]])
    want = float(torch.nn.functional.cross_entropy(logits, torch.tensor([1, 0, 0, 1, 0, 0])))
    assert ev["eval_loss"] == pytest.approx(want, rel=1e-6) and ev["eval_examples"] == 6
    assert ev["accuracy"] == pytest.approx(0.5) and ev["f1"] == pytest.approx(0.4) and ev["mcc"] == pytest.approx(0.0)
    assert ev["majority_accuracy"] == 4 / 6 and ev["eval_note"] is None


def test_classification_eval_of_three_labels_reports_the_macro_f1():
    """num_labels 3: F1 is the unweighted mean of the three classes' F1 (a binary F1 is undefined there)."""
    table = [[3.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 3.0]]
    # labels 0 0 1 1 2 2, predicted 0 1 1 1 2 0: F1 class 0 = 2/(2+1+1) = .5, class 1 = 4/5, class 2 = 2/3
    batch = _cls_batch([0, 1, 1, 1, 2, 0], [0, 0, 1, 1, 2, 2])
    ev = engine.evaluate(_FixedLogits(table), [batch], "classify", P.get("fp32"), CPU, {"num_labels": 3})
    assert ev["accuracy"] == pytest.approx(4 / 6) and ev["f1"] == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)


# ====================================================================== fine-tuning from a checkpoint
def _three_label_data(root: Path) -> Path:
    """The test classification data with labels 0, 1, 2 (num_labels 3 in its meta.json)."""
    from datasets import load_from_disk

    src = make_prepared(root, "classify")
    dd = load_from_disk(str(src))
    dd = dd.map(lambda row, i: {"labels": i % 3}, with_indices=True)
    out = root / "prepared-3"
    dd.save_to_disk(str(out))
    meta = json.loads((src / "meta.json").read_text())
    meta.update(num_labels=3, label_values=[0, 1, 2], majority_accuracy=0.35)
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def test_a_finetuning_stage_starts_from_stage_1s_final_weights_trains_with_dropout_and_seeds_its_head(
        data, tmp_path, monkeypatch):
    """Stage 2 from a stage-1 checkpoint: the encoder starts from the weights stage 1 wrote (after its last step),
    the forward runs in train mode (dropout on: from_pretrained returns a model in eval mode), the new classifier
    head has as many outputs as the data has labels (3 here) and is drawn from the stage's seed."""
    from safetensors.torch import load_file

    run_stage({"data": str(data["mlm"]), "steps": 3, "lr": 1e-2, "seed": 1, "model": TINY}, tmp_path / "pre")
    final = load_file(next((tmp_path / "pre" / "checkpoint").glob("*.safetensors")))
    three = _three_label_data(tmp_path / "d3")
    built, modes = {}, []
    real_build, real_fwd = engine_loop.build_model, engine.forward_loss

    def build(hp, *a, **k):
        model, dtype = real_build(hp, *a, **k)
        built[hp["seed"]] = {n: v.clone() for n, v in model.state_dict().items()}
        return model, dtype

    def fwd(model, *a):
        modes.append(model.training and model.bert.encoder.layer[0].attention.self.dropout.training)
        return real_fwd(model, *a)

    monkeypatch.setattr(engine_loop, "build_model", build)
    monkeypatch.setattr(engine_loop, "forward_loss", fwd)
    for seed in (1, 2):
        m = run_stage({"data": str(three), "objective": "classify", "stage": "finetune", "steps": 1, "seed": seed,
                       "init": str(tmp_path / "pre" / "checkpoint"), "save_checkpoint": False}, tmp_path / f"ft{seed}")
        assert m["status"] == "ok" and m["eval_examples"] == 40 and 0 <= m["f1"] <= 1
    assert modes == [True, True]
    for seed in (1, 2):
        enc = {k: v for k, v in built[seed].items() if k.startswith("bert.") and "pooler" not in k}
        assert enc and all(torch.equal(v, final[k]) for k, v in enc.items())
        assert built[seed]["classifier.weight"].shape == (3, 32)
    assert not torch.equal(built[1]["classifier.weight"], built[2]["classifier.weight"])


# ====================================================================== divergence
# ====================================================================== optimizer and schedule
def test_the_optimizer_runs_with_the_hparams_lr_betas_and_eps(data, tmp_path):
    seen = []
    handle = register_optimizer_step_pre_hook(lambda opt, a, k: seen.append(
        [(g["initial_lr"], g["betas"], g["eps"]) for g in opt.param_groups]))
    try:
        run_stage({"data": str(data["mlm"]), "steps": 1, "model": TINY, "lr": 2e-3, "adam_beta1": 0.8,
                   "adam_beta2": 0.95, "adam_eps": 1e-6, "save_checkpoint": False}, tmp_path / "r")
    finally:
        handle.remove()
    assert seen == [[(2e-3, (0.8, 0.95), 1e-6)] * 2]


def test_warmup_and_epoch_step_counts_round_to_the_nearest_step(data, tmp_path):
    """warmup_ratio 0.25 of 7 steps is 1.75: 2 warm-up steps (not 1), and 0 is none; epochs 0.5 of 3 full batches per epoch is
    1.5: 2 steps; 2 epochs of batch 40 over 96 rows are 2 × 2 full batches (the last 16 rows of each permutation
    are left out, no short batch)."""
    run_stage({"data": str(data["mlm"]), "steps": 7, "lr": 1e-3, "warmup_ratio": 0.25, "model": TINY,
               "log_every": 1, "save_checkpoint": False}, tmp_path / "w")
    want = [1e-3 * t / 2 if t < 2 else 1e-3 * (7 - t) / 5 for t in range(7)]
    assert [float(r["lr"]) for r in steps_rows(tmp_path / "w")] == pytest.approx(want, rel=1e-9, abs=1e-15)
    run_stage({"data": str(data["mlm"]), "steps": 3, "lr": 1e-3, "warmup_ratio": 0, "model": TINY,
               "log_every": 1, "save_checkpoint": False}, tmp_path / "w0")  # no warm-up: the first step runs at the full lr
    assert [float(r["lr"]) for r in steps_rows(tmp_path / "w0")] == pytest.approx([1e-3, 2e-3 / 3, 1e-3 / 3], rel=1e-9)
    half = run_stage({"data": str(data["mlm"]), "epochs": 0.5, "model": TINY, "save_checkpoint": False},
                     tmp_path / "half")
    two = run_stage({"data": str(data["mlm"]), "epochs": 2, "batch_size": 40, "model": TINY,
                     "save_checkpoint": False}, tmp_path / "two")
    assert half["steps_planned"] == half["steps_completed"] == 2
    assert two["steps_planned"] == 4 and two["samples_seen"] == 160


def test_a_batch_of_the_whole_training_set_and_rows_as_long_as_the_positions_are_accepted(tmp_path):
    """batch_size equal to the training rows and data max_length equal to max_position_embeddings are the largest
    allowed; one more row in the batch is refused naming both numbers."""
    d = make_prepared(tmp_path / "d", "mlm", n_train=16, n_eval=8, max_length=32)
    hp = {"data": str(d), "steps": 1, "batch_size": 16, "model": {**TINY, "max_position_embeddings": 32},
          "save_checkpoint": False}
    assert run_stage(hp, tmp_path / "r")["status"] == "ok"
    with pytest.raises(PrecswitchError, match=r"^batch_size 17 is larger than the training set \(16 rows in "):
        run_stage({**hp, "batch_size": 17}, tmp_path / "r2")


# ====================================================================== metrics.json against steps.csv
def test_rates_token_counts_and_statistics_are_those_of_the_logged_steps(data, tmp_path, monkeypatch):
    """Padded masked-LM rows, 6 steps, 2 of timing warm-up, a state save every 2 steps (reported as 100 s each):
    tokens_seen counts the attended tokens of the batches (not the padding), tokens_per_second is the tokens per step
    times steps_per_second, the grad_norm statistics and step_seconds_p90 are those of steps.csv's columns,
    perplexity is exp(eval_loss), and checkpoint_seconds includes the state saves."""
    attended = []
    real_get, real_save = engine.Batches.get, engine_state.write_state

    def get(self, step):
        b = real_get(self, step)
        attended.append(int(b["attention_mask"].sum()))
        return b

    monkeypatch.setattr(engine.Batches, "get", get)
    monkeypatch.setattr(engine_state, "write_state", lambda path, state: real_save(path, state) + 100.0)
    m = run_stage({"data": str(data["mlm"]), "steps": 6, "batch_size": 8, "model": TINY, "timing_warmup_steps": 2,
                   "checkpoint_every_steps": 2, "log_every": 1, "save_checkpoint": False}, tmp_path / "r")
    rows = steps_rows(tmp_path / "r")
    assert len(attended) == 6 and m["tokens_seen"] == sum(attended) < 6 * 8 * 32 and m["samples_seen"] == 48
    assert m["tokens_per_second"] == pytest.approx(sum(attended) / 6 * m["steps_per_second"], rel=1e-9)
    gns = [float(r["grad_norm"]) for r in rows]
    assert m["grad_norm"]["mean"] == pytest.approx(float(np.mean(gns)), rel=1e-9)
    assert m["grad_norm"]["median"] == pytest.approx(float(np.median(gns)), rel=1e-9)
    assert m["grad_norm"]["p90"] == pytest.approx(float(np.percentile(gns, 90)), rel=1e-9)
    assert m["grad_norm"]["max"] == max(gns) and m["grad_norm"]["nonfinite"] == 0
    steady = [float(r["step_seconds"]) for r in rows][2:]
    assert m["step_seconds_p90"] == pytest.approx(float(np.percentile(steady, 90)), abs=2e-6)
    assert m["perplexity"] == pytest.approx(math.exp(m["eval_loss"]), rel=1e-12)
    assert m["state_saves"] == 2 and m["state_save_seconds"] >= 200 and m["checkpoint_seconds"] >= m["state_save_seconds"]


def test_steps_csv_has_every_log_every_th_step_counted_from_the_first_and_the_last(data, tmp_path):
    run_stage({"data": str(data["mlm"]), "steps": 8, "model": TINY, "log_every": 3, "save_checkpoint": False},
              tmp_path / "r")
    assert [r["step"] for r in steps_rows(tmp_path / "r")] == ["1", "4", "7", "8"]


def _nan_from_step_4(monkeypatch, real=engine.forward_loss):
    """Make the training loss NaN from the 4th step of the next stage on."""
    calls = []

    def nan_from_4(*a):
        calls.append(1)
        return real(*a) * (float("nan") if len(calls) >= 4 else 1.0)

    monkeypatch.setattr(engine_loop, "forward_loss", nan_from_4)


def test_grad_norm_statistics_cover_every_step_whatever_log_every(data, tmp_path, monkeypatch):
    """log_every decides which steps steps.csv shows, not metrics.json's grad_norm statistics: NaN losses from step 4
    (max_nonfinite 3, the stage stops after step 6) give the same grad_norm with log_every 10 as with 1, three
    non-finite norms (as nonfinite_losses) and the finite ones' mean and max over steps 1-3."""
    _nan_from_step_4(monkeypatch)
    hp = {"data": str(data["mlm"]), "steps": 30, "model": TINY, "max_nonfinite": 3, "save_checkpoint": False}
    every = run_stage({**hp, "log_every": 1}, tmp_path / "every")
    _nan_from_step_4(monkeypatch)
    tenth = run_stage({**hp, "log_every": 10}, tmp_path / "tenth")
    finite = [float(r["grad_norm"]) for r in steps_rows(tmp_path / "every")][:3]
    assert every["nonfinite_losses"] == tenth["nonfinite_losses"] == 3 and every["steps_completed"] == 6
    assert every["grad_norm"]["nonfinite"] == 3 and every["grad_norm"]["max"] == max(finite)
    assert every["grad_norm"]["mean"] == pytest.approx(float(np.mean(finite)), rel=1e-12)
    assert tenth["grad_norm"] == every["grad_norm"]


def test_a_stage_that_diverges_between_logged_steps_logs_the_step_it_stopped_at(data, tmp_path, monkeypatch):
    """steps.csv has a row for every log_every-th step and the last: for a stage stopped by max_nonfinite that is the
    step it stopped at (step 6 here, with log_every 10), so its last row and final_train_loss show the non-finite loss
    it ended with, not step 1's finite one."""
    _nan_from_step_4(monkeypatch)
    m = run_stage({"data": str(data["mlm"]), "steps": 30, "model": TINY, "max_nonfinite": 3, "log_every": 10,
                   "save_checkpoint": False}, tmp_path / "r")
    rows = steps_rows(tmp_path / "r")
    assert m["status"] == "diverged" and m["steps_completed"] == 6
    assert [r["step"] for r in rows] == ["1", "6"] and rows[-1]["loss"] == "nan" and rows[-1]["grad_norm"] == "nan"
    assert json.loads((tmp_path / "r" / "metrics.json").read_text())["final_train_loss"] is None


def test_hparams_tokenizer_wins_over_the_one_the_data_names(data, tmp_path):
    """hparams tokenizer is used instead of the data's meta.json tokenizer: here one with an added token, so the
    scratch model's vocabulary (and the checkpoint's tokenizer) has 61 entries, not the data tokenizer's 60."""
    from transformers import AutoTokenizer

    meta = json.loads((Path(data["mlm"]) / "meta.json").read_text())
    tok = AutoTokenizer.from_pretrained(meta["tokenizer"])
    assert tok.add_tokens(["zebra"]) == 1 and len(tok) == 61
    tok.save_pretrained(tmp_path / "tok")
    run_stage({"data": str(data["mlm"]), "tokenizer": str(tmp_path / "tok"), "steps": 1, "model": TINY},
              tmp_path / "r")
    assert json.loads((tmp_path / "r" / "checkpoint" / "config.json").read_text())["vocab_size"] == 61
    assert len(AutoTokenizer.from_pretrained(tmp_path / "r" / "checkpoint")) == 61
    # a model.vocab_size given in hparams sizes the vocabulary instead
    run_stage({"data": str(data["mlm"]), "steps": 1, "model": {**TINY, "vocab_size": 80}}, tmp_path / "v")
    assert json.loads((tmp_path / "v" / "checkpoint" / "config.json").read_text())["vocab_size"] == 80

