"""Evaluation of the trained model, and the judgement whether a stage that finished has diverged."""

from __future__ import annotations

import math
from typing import Any

import torch

from ... import precision as P
from ...errors import PrecswitchError
from .step import mlm_forward

#: a masked-LM eval split with no masked token has no loss to report (not a model that is NaN)
NO_EVAL_MASK = ("the masked-LM eval split has no masked token: raise train.pretrain.mlm_probability "
                "(hparams mlm_probability) or the number of eval rows")


@torch.no_grad()
def evaluate(model, batches: list[dict], objective: str, prec: P.Precision, device, meta: dict) -> dict:
    model.eval()
    total_loss, total_n = 0.0, 0
    correct, masked = 0, 0
    preds, labels, nonfinite = [], [], 0
    for b in batches:
        if objective == "mlm" and not bool((b["labels"] != -100).any()):
            continue  # no masked token: nothing to score (it would weigh 0 in the mean)
        b = {k: v.to(device) for k, v in b.items()}
        if objective == "mlm":
            with prec.autocast(device.type):
                loss, scores, rows = mlm_forward(model, b)
            if loss.dtype != torch.float32:  # pure_*: the metric in fp32, as autocast computes amp_*'s loss
                loss = torch.nn.functional.cross_entropy(scores.float(), rows, ignore_index=-100)
            mask = rows != -100
            n = int(mask.sum())
            total_loss += float(loss.float()) * n
            total_n += n
            correct += int((scores.float().argmax(-1)[mask] == rows[mask]).sum())
            masked += n
        else:
            with prec.autocast(device.type):
                out = model(**b)
            logits = out.logits.float()
            n = len(b["labels"])
            loss = out.loss
            if loss.dtype != torch.float32 and model.config.problem_type == "single_label_classification":
                loss = torch.nn.functional.cross_entropy(logits, b["labels"].view(-1))  # pure_*: fp32 metric
            total_loss += float(loss.float()) * n
            total_n += n
            nonfinite += int((~torch.isfinite(logits)).any(-1).sum())
            preds += logits.argmax(-1).tolist()
            labels += b["labels"].tolist()
    model.train()
    if objective == "mlm" and masked == 0:
        raise PrecswitchError(NO_EVAL_MASK)
    loss = total_loss / max(total_n, 1)
    res: dict[str, Any] = {"eval_loss": loss if math.isfinite(loss) else None, "eval_note": None}
    if objective == "mlm":
        res["perplexity"] = math.exp(loss) if math.isfinite(loss) and loss < 700 else None
        res["mlm_accuracy"] = correct / max(masked, 1) if math.isfinite(loss) else None
        res["eval_masked_tokens"] = masked
        if not math.isfinite(loss):
            res["eval_note"] = "non-finite eval loss: model weights or activations are NaN/inf"
    else:
        res["majority_accuracy"] = meta.get("majority_accuracy")
        res["eval_examples"] = len(labels)
        if nonfinite:
            res.update(accuracy=None, f1=None, mcc=None)
            res["eval_note"] = f"non-finite logits for {nonfinite} of {len(labels)} eval examples: predictions meaningless"
        else:
            from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

            binary = int(meta.get("num_labels", 2)) == 2
            res["accuracy"] = float(accuracy_score(labels, preds))
            res["f1"] = float(f1_score(labels, preds, pos_label=1, average="binary" if binary else "macro", zero_division=0))
            res["mcc"] = float(matthews_corrcoef(labels, preds))
    return res




def held_out_metrics(dev_style: dict, meta: dict) -> dict:
    """A classifier's scores on the held-out test split, under the test_* keys of metrics.json."""
    return {"test_accuracy": dev_style.get("accuracy"), "test_f1": dev_style.get("f1"),
            "test_mcc": dev_style.get("mcc"), "test_loss": dev_style["eval_loss"],
            "test_examples": dev_style["eval_examples"], "test_majority_accuracy": meta.get("test_majority_accuracy")}


def blown_up(nonfinite: int, steps: int, eval_loss: float | None, objective: str, vocab_size: int,
             max_fraction: float) -> str | None:
    """Why a stage that finished with finite eval outputs still diverged, or None. Two signs: non-finite losses
    on more than ``max_fraction`` (hparams max_nonfinite_fraction) of the steps, even without max_nonfinite
    of them in a row (the scaler's skips keep a pure_fp16 run limping along between them); a masked-LM
    eval loss above twice ln(vocab), the loss of guessing uniformly (an untrained model's), so the training
    made the model worse than untrained. (A classifier's eval loss can exceed ln(labels) by overconfidence
    alone: not a sign.)"""
    if steps and nonfinite / steps > max_fraction:
        return (f"{nonfinite} of {steps} training losses were non-finite (more than {max_fraction:.0%}: "
                "max_nonfinite_fraction), though never max_nonfinite in a row")
    uniform = math.log(vocab_size) if vocab_size > 1 else None
    if objective == "mlm" and uniform and eval_loss is not None and math.isfinite(eval_loss) \
            and eval_loss > 2 * uniform:
        return (f"eval loss {eval_loss:.4g} nats is more than twice ln(vocab) = {uniform:.3g}, the loss of "
                "uniform guessing: training made the model worse than untrained")
    return None

