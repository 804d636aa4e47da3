"""Engine edge cases: a switch point that rounds to no switch, an in-stage ``switch_to`` the device cannot run
under ``on_unsupported: skip``, and masked-LM batches (or an eval split) without a masked token."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from engine_fixtures import TINY, make_prepared, mlm_batch, prepared_both, steps_rows, tiny_bert_mlm  # noqa: E402

from precswitch import precision as P  # noqa: E402
from precswitch.errors import PrecisionUnsupported, PrecswitchError  # noqa: E402
from precswitch.train import config as C  # noqa: E402
from precswitch.train import engine  # noqa: E402
from precswitch.train.engine import run_stage  # noqa: E402
from precswitch.train.engine import batching as engine_batching, loop as engine_loop  # noqa: E402

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return prepared_both(tmp_path_factory)


def _nothing_written(out: Path) -> bool:
    return not (out / "metrics.json").exists() and not (out / "steps.csv").exists() \
        and not (out / "checkpoint").exists()


# ================================================================== H1: a switch point that is no switch
@pytest.mark.parametrize("at, msg", [
    (0.01, r"switch_at 0\.01 of 20 steps rounds to step 0: the whole stage would run in fp32.*"
           r"switch_at >= 0\.05 \(the earliest switch: after step 1 of 20\)"),
    (0.99, r"switch_at 0\.99 of 20 steps rounds to step 20, the end of the stage: it would never switch to fp32.*"
           r"switch_at <= 0\.95 \(the latest switch: after step 19 of 20\)"),
])
def test_steps_stage_switch_rounding_to_no_switch_is_refused_before_training(data, tmp_path, at, msg):
    """Before: switch_at 0.01 of 20 steps ran every step in fp32 and 0.99 never switched, both recorded as
    switched runs. Now refused with the key, the value, the steps and the earliest/latest real switch."""
    hp = {"data": str(data["mlm"]), "precision": "amp_bf16", "switch_to": "fp32", "switch_at": at, "steps": 20,
          "model": TINY}
    with pytest.raises(PrecswitchError, match=msg):
        run_stage(hp, tmp_path / "r")
    assert _nothing_written(tmp_path / "r")
    with pytest.raises(PrecswitchError, match=msg):  # refused by the hparams check itself (the CLI's too)
        C.resolve(hp)


@pytest.mark.parametrize("at, msg", [
    (0.1, r"switch_at 0\.1 of 3 steps rounds to step 0.*switch_at >= 0\.3333 \(the earliest switch: after step 1"),
    (0.9, r"switch_at 0\.9 of 3 steps rounds to step 3, the end.*switch_at <= 0\.6667 \(the latest switch: "
          r"after step 2 of 3\)"),
])
def test_epochs_stage_switch_rounding_to_no_switch_is_refused_before_training(data, tmp_path, at, msg):
    """An epochs stage's step count is known only once its data is loaded (96 rows / batch 32 = 3 steps):
    the engine refuses there, before the model is built or a step is taken."""
    hp = {"data": str(data["mlm"]), "precision": "amp_bf16", "switch_to": "fp32", "switch_at": at, "epochs": 1,
          "batch_size": 32, "model": TINY}
    C.resolve(hp)  # the step count is unknown here: accepted
    with pytest.raises(PrecswitchError, match=msg):
        run_stage(hp, tmp_path / "r")
    assert _nothing_written(tmp_path / "r")


def test_epochs_stage_with_a_real_switch_still_switches(data, tmp_path):
    m = run_stage({"data": str(data["mlm"]), "precision": "amp_bf16", "switch_to": "fp32", "switch_at": 0.5,
                   "epochs": 1, "batch_size": 32, "model": TINY, "save_checkpoint": False}, tmp_path / "r")
    assert m["status"] == "ok" and m["steps_planned"] == 3
    assert m["switch_step"] == 2 and m["precision_final"] == "fp32"


# ================================================================== H2: an unsupported switch_to is skipped
@pytest.mark.parametrize("key", ["switch_to", "eval_precision"])
def test_unsupported_switch_to_or_eval_precision_is_skipped_or_refused_before_the_model(data, tmp_path,
                                                                                      monkeypatch, key):
    """tf32 needs a CUDA GPU. Before: a switch_to: tf32 under on_unsupported: skip crashed after the model was
    built. Now every precision the stage would run is checked where the stage precision is: skip records
    the run as skipped, error refuses it, both before the data or the model are touched."""
    def no_data(*a, **k):
        raise AssertionError("data loaded before the precision check")

    monkeypatch.setattr(engine_loop, "load_data", no_data)
    monkeypatch.setattr(engine_loop, "build_model", no_data)
    extra = {"switch_to": "tf32", "switch_at": 0.5} if key == "switch_to" else {"eval_precision": "tf32"}
    hp = {"data": str(data["classify"]), "objective": "classify", "stage": "finetune", "precision": "fp32",
          "steps": 4, "model": TINY, **extra}
    m = run_stage({**hp, "on_unsupported": "skip"}, tmp_path / "skip")
    assert m["status"] == "skipped" and "'tf32'" in m["status_reason"] and "'cpu'" in m["status_reason"]
    assert json.loads((tmp_path / "skip" / "metrics.json").read_text())["status"] == "skipped"
    assert (tmp_path / "skip" / "steps.csv").read_text().splitlines() == [",".join(engine.STEP_FIELDS)]
    with pytest.raises(PrecisionUnsupported, match=r"precision 'tf32' cannot run on device 'cpu'"):
        run_stage(hp, tmp_path / "error")
    assert _nothing_written(tmp_path / "error")


# ================================================================== H4: no masked token
@pytest.mark.parametrize("host_rows", [False, True])
def test_mlm_loss_of_a_batch_without_a_masked_token_is_a_graph_zero(host_rows):
    """Before: the mean cross-entropy over no row, NaN. Now 0, on the graph (backward runs, every gradient
    is zero), whether the head rows are selected on the host (training) or in the forward (eval)."""
    model = tiny_bert_mlm()
    batch = mlm_batch(0)
    if host_rows:
        batch.update(zip(engine.HEAD_KEYS, engine.mlm_head_rows(batch["labels"])))
    loss, scores, rows = engine.mlm_forward(model, batch)
    assert rows.numel() == 0 and scores.shape[0] == 0
    assert loss.dtype == torch.float32 and loss.requires_grad and loss.item() == 0.0
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and not g.any() for g in grads.values()), [n for n, g in grads.items() if g is None]
    # under autocast (16-bit scores): still an fp32 zero
    with P.get("amp_bf16").autocast("cpu"):
        assert engine.mlm_forward(model, batch)[0].item() == 0.0


def _empty_steps(data_dir: Path, batch_size: int, seed: int, mlm_probability: float, steps: int) -> list[int]:
    """The 1-based steps whose training batch has no masked token, rebuilt from the engine's batching."""
    import datasets
    from transformers import AutoTokenizer

    train = datasets.load_from_disk(str(data_dir))["train"]
    tok = AutoTokenizer.from_pretrained(json.loads((data_dir / "meta.json").read_text())["tokenizer"])
    b = engine.Batches(engine_batching.model_columns(train, "mlm"), batch_size, seed,
                       engine_batching.make_collator("mlm", tok, mlm_probability))
    return [s + 1 for s in range(steps) if not (b.get(s)["labels"] != -100).any()]


SPARSE = {"batch_size": 1, "mlm_probability": 0.05, "steps": 16, "seed": 5, "log_every": 1, "model": TINY}


@pytest.mark.parametrize("prec", ["fp32", "amp_fp16"])
def test_batches_without_a_masked_token_are_counted_not_nonfinite(data, tmp_path, prec):
    """batch_size 1 and mlm_probability 0.05: some batches mask nothing. Before: each such batch had
    a NaN loss, counted as non-finite, and an fp32 stage 1 was recorded as diverged. Now: ok, counted in
    mlm_empty_batches, an empty loss cell in steps.csv, a zero gradient, no loss-scaler skip."""
    empty = _empty_steps(data["mlm"], 1, SPARSE["seed"], SPARSE["mlm_probability"], SPARSE["steps"])
    assert 0 < len(empty) < SPARSE["steps"]  # the case under test: some batches empty, some not
    m = run_stage({"data": str(data["mlm"]), "precision": prec, **SPARSE}, tmp_path / "r")
    assert m["status"] == "ok", m["status_reason"]
    assert m["nonfinite_losses"] == 0 and m["first_nonfinite_step"] is None
    assert m["mlm_empty_batches"] == len(empty)
    assert m["eval_loss"] is not None and math.isfinite(m["eval_loss"]) and m["eval_note"] is None
    rows = steps_rows(tmp_path / "r")
    assert [int(r["step"]) for r in rows if r["loss"] == ""] == empty
    assert all(float(r["grad_norm"]) == 0.0 and r["skipped"] == "0" for r in rows if r["loss"] == "")
    assert all(math.isfinite(float(r["loss"])) and float(r["grad_norm"]) > 0 for r in rows if r["loss"] != "")
    assert m["grad_norm"]["max"] > 0 and m["grad_norm"]["median"] > 0  # the zeros are not measured norms
    assert m["final_train_loss"] == float([r["loss"] for r in rows if r["loss"] != ""][-1])
    if prec == "amp_fp16":  # the scaler saw finite (zero) gradients there: no skip, no back-off after them
        after = {int(r["step"]): r["loss_scale"] for r in rows}
        assert all(after[s + 1] == after[s] for s in empty if s + 1 in after)
        assert m["skipped_steps"] == sum(int(r["skipped"]) for r in rows if r["loss"] != "")
    else:
        assert m["skipped_steps"] == 0 and m["grad_norm"]["nonfinite"] == 0


def test_an_eval_split_without_a_masked_token_is_refused_before_training(tmp_path):
    """2 eval rows at mlm_probability 0.001 mask nothing. Before: trained, then recorded as diverged with
    'model weights or activations are NaN/inf'. Now a clear error, before any step."""
    d = make_prepared(tmp_path / "d", "mlm", n_train=16, n_eval=2)
    with pytest.raises(PrecswitchError, match=r"the masked-LM eval split has no masked token: raise "
                                              r"train\.pretrain\.mlm_probability .* or the number of eval rows "
                                              r"\(2 eval rows"):
        run_stage({"data": str(d), "mlm_probability": 0.001, "steps": 2, "batch_size": 4, "model": TINY},
                  tmp_path / "r")
    assert _nothing_written(tmp_path / "r")


def test_evaluate_leaves_out_batches_without_a_masked_token_and_refuses_none_at_all():
    model = tiny_bert_mlm()
    prec, cpu = P.get("fp32"), torch.device("cpu")
    normal, empty = mlm_batch(30, seed=1), mlm_batch(0)
    alone = engine.evaluate(model, [normal], "mlm", prec, cpu, {})
    mixed = engine.evaluate(model, [empty, normal, empty], "mlm", prec, cpu, {})
    assert math.isfinite(alone["eval_loss"]) and mixed == alone and mixed["eval_masked_tokens"] == 30
    with pytest.raises(PrecswitchError, match="the masked-LM eval split has no masked token"):
        engine.evaluate(model, [empty, empty], "mlm", prec, cpu, {})
    # pure 16-bit: the fp32 re-reduction of the loss must not turn an empty batch into NaN either
    m16 = P.get("pure_bf16").prepare_model(tiny_bert_mlm())
    assert math.isfinite(engine.evaluate(m16, [empty, normal], "mlm", P.get("pure_bf16"), cpu, {})["eval_loss"])


def test_the_non_finite_fraction_counts_only_steps_that_scored_a_loss(data, tmp_path, monkeypatch):
    """max_nonfinite_fraction is over the steps that had a loss: batches without a masked token (no loss, neither
    finite nor not) are left out of the denominator. 4 NaN losses (amp_fp16: the scaler skips them) among the scored
    steps: above 25% of those, though not of all 16 steps, so the stage is diverged."""
    from precswitch.train import engine

    empty = _empty_steps(data["mlm"], 1, SPARSE["seed"], SPARSE["mlm_probability"], SPARSE["steps"])
    scored = SPARSE["steps"] - len(empty)
    assert 4 / SPARSE["steps"] <= 0.25 < 4 / scored  # the case under test
    real, nans = engine.forward_loss, []

    def some_nan(model, batch, objective):
        loss = real(model, batch, objective)
        if bool((batch["labels"] != -100).any()) and len(nans) < 4:
            nans.append(1)
            return loss * float("nan")
        return loss

    monkeypatch.setattr(engine_loop, "forward_loss", some_nan)
    m = run_stage({"data": str(data["mlm"]), "precision": "amp_fp16", **SPARSE, "max_nonfinite": 100,
                   "save_checkpoint": False}, tmp_path / "r")
    assert m["nonfinite_losses"] == 4 and m["mlm_empty_batches"] == len(empty)
    assert m["status"] == "diverged" and f"4 of {scored} training losses were non-finite" in m["status_reason"]
