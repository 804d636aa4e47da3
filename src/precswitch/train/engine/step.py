"""The forward pass and one training step: sparse masked-LM scoring, the [CLS]-only last layer, clipping with
fp32 norms, AdamW, and the step under the precision's autocast and loss scaler."""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import torch

from ... import precision as P
from .batching import HEAD_KEYS, mlm_head_rows

#: batch keys mlm_forward reads itself (not passed to the encoder)
MLM_EXTRA_KEYS = ("labels", *HEAD_KEYS)


def mlm_forward(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Masked-LM loss scored at the masked positions only ("sparse predictions", as in NVIDIA's BERT
    pre-training): ``(loss, scores of the selected rows, labels of those rows)``.

    ``BertForMaskedLM(**batch).loss`` projects every token onto the vocabulary and then ignores the
    ~85% whose label is -100; for a 30k vocabulary that projection is about a fifth of BERT-base's
    step. Here the encoder output is gathered at the labelled positions first, then the same head
    (``model.cls``: transform, LayerNorm, decoder tied to the embeddings) and the same loss (mean
    cross-entropy over labelled tokens) run on those rows: equal loss and gradients (tests/test_engine.py),
    less work. The row count is padded to a multiple of 16 with ignored rows (tensor-core shapes).

    A batch with no masked token (possible with a small batch, short rows or a small mlm_probability) has
    nothing to score: its loss is a zero that stays on the graph (``0 * sum`` of the empty scores), not the
    NaN of a mean over no rows, so backward, the loss scaler and the optimizer step run as on any batch and
    every gradient is zero (the step the mean's NaN loss already gave, only without the NaN).
    """
    if "head_rows" in batch:  # selected on the host with the batch (no device-to-host sync mid-forward)
        idx, rows_labels = batch["head_rows"], batch["head_labels"]
    else:
        idx, rows_labels = mlm_head_rows(batch["labels"])
    hidden = model.bert(**{k: v for k, v in batch.items() if k not in MLM_EXTRA_KEYS}).last_hidden_state
    scores = model.cls(hidden.reshape(-1, hidden.size(-1))[idx])
    if rows_labels.numel() == 0:  # no masked token (rows are padded only when there is one): a graph zero
        return scores.float().sum() * 0.0, scores, rows_labels
    loss = torch.nn.functional.cross_entropy(scores, rows_labels, ignore_index=-100)
    return loss, scores, rows_labels



def _cls_only_layer_forward(layer, hidden_states, attention_mask=None, *args, **kwargs):
    """A BertLayer's forward that computes the [CLS] position only (see :func:`cls_only_last_layer`)."""
    from transformers.models.bert import modeling_bert as mb

    sa = layer.attention.self
    b, t, _ = hidden_states.shape
    hd = sa.attention_head_size
    cls = hidden_states[:, :1]
    q = sa.query(cls).view(b, 1, -1, hd).transpose(1, 2)
    k = sa.key(hidden_states).view(b, t, -1, hd).transpose(1, 2)
    v = sa.value(hidden_states).view(b, t, -1, hd).transpose(1, 2)
    if attention_mask is not None and attention_mask.dim() == 4:
        attention_mask = attention_mask[..., :1, :]  # the [CLS] query's row
    attend = mb.ALL_ATTENTION_FUNCTIONS.get_interface(sa.config._attn_implementation, mb.eager_attention_forward)
    ctx, _ = attend(sa, q, k, v, attention_mask, dropout=sa.dropout.p if sa.training else 0.0, scaling=sa.scaling)
    att = layer.attention.output(ctx.reshape(b, 1, -1).contiguous(), cls)
    return layer.feed_forward_chunk(att)


def cls_only_last_layer(model) -> bool:
    """Make a BertForSequenceClassification's last encoder layer compute the [CLS] position only.

    The classifier reads nothing but the pooled [CLS] vector, and in the last layer no other
    position feeds it except through that layer's keys and values. So the last layer needs keys and
    values for every token but queries, attention output, and feed-forward for [CLS] alone: the same
    loss and gradients (tests/test_engine.py) for ~(1 - 1/seq) less of that layer's other work. The
    model's weights, state dict and checkpoints are untouched (the instance's forward is replaced).
    Returns False (and changes nothing) for a model without that structure.
    """
    import types

    layers = getattr(getattr(getattr(model, "bert", None), "encoder", None), "layer", None)
    if not layers or not hasattr(model, "classifier") or getattr(model.config, "is_decoder", False):
        return False
    last = layers[-1]
    if not all(hasattr(last, a) for a in ("attention", "feed_forward_chunk")):
        return False
    last.forward = types.MethodType(_cls_only_layer_forward, last)
    return True


def forward_loss(model, batch: dict, objective: str) -> torch.Tensor:
    """The training loss of one batch: sparse masked-LM scoring for mlm, the model's own loss otherwise."""
    if objective == "mlm":
        return mlm_forward(model, batch)[0]
    return model(**batch).loss


def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` (total 2-norm over every gradient; clip to ``max_norm``; the norm before
    clipping is returned), with the norm of 16-bit gradients (pure_*) reduced in fp32.

    torch reduces fp16 gradients to an fp16 norm: finite gradients whose total norm exceeds 65504 (many moderate
    elements) give ``inf``, and the clip factor ``max_norm / inf`` then zeroes the whole update (the step runs on
    nothing, unrecorded as a skip) or, with clipping off (``max_norm`` inf), is ``inf / inf`` = NaN and writes NaN
    into every weight, on a step whose gradients were all finite (the loss scaler found no inf in them). bf16 norms
    carry 8 bits. fp32 gradients take torch's own path unchanged (bit for bit)."""
    params = [p for p in parameters if p.grad is not None]
    if all(p.grad.dtype == torch.float32 for p in params):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    # torch's two halves of clip_grad_norm_, with each gradient's norm taken in fp32 (one tensor at a time:
    # no fp32 copy of all gradients, which would inflate pure_*'s peak memory)
    total = torch.nn.utils.get_total_norm([torch.linalg.vector_norm(p.grad, dtype=torch.float32) for p in params])
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def build_optimizer(model, hp: dict, prec: P.Precision) -> torch.optim.Optimizer:
    """AdamW with weight decay on the matrices (``ndim >= 2``) only, fused or foreach (``hp["optimizer_impl"]``),
    wrapped for the precision's update compensation (Kahan / stochastic rounding, seeded by ``hp["seed"]``).
    ``hp`` needs lr, weight_decay, adam_beta1, adam_beta2, adam_eps, optimizer_impl and seed."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": hp["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=hp["lr"],
        betas=(hp["adam_beta1"], hp["adam_beta2"]),
        eps=hp["adam_eps"],
        **({"fused": True} if hp["optimizer_impl"] == "fused" else {"foreach": True}),
    )
    return prec.wrap_optimizer(optimizer, seed=hp["seed"])  # Kahan / SR variants; else unchanged


class StepResult(NamedTuple):
    """What one :func:`train_step` leaves on the device (read back by the caller when it chooses: no sync here)."""

    loss: torch.Tensor  #: the batch's loss (detached; a copy under CUDA graphs, whose outputs the next replay overwrites)
    grad_norm: torch.Tensor  #: total gradient 2-norm before clipping
    loss_scale: torch.Tensor | None  #: the loss scale the step ran with (None: no loss scaling)
    skipped: torch.Tensor | None  #: True where the scaler skipped the optimizer step (inf/NaN gradients)


def train_step(model, batch: dict, optimizer, scaler, prec: P.Precision, *, objective: str, device_type: str,
               loss_fn=forward_loss, max_grad_norm: float = math.inf, watch=None, between=None,
               cudagraphs: bool = False) -> StepResult:
    """One training step: forward and loss under the precision's autocast, backward (scaled where the precision
    scales the loss), gradient clipping (:func:`clip_grad_norm`), the optimizer step (through the scaler) and
    zeroed gradients. Nothing is read back to the host (the fp16 scaler's own inf check aside).

    ``loss_fn(model, batch, objective)``: the loss (``forward_loss`` or a compiled copy); ``watch``: a context
    around the forward (activation telemetry); ``between()``: host work run after backward is queued (the next
    step's batch), while the device still works; ``cudagraphs``: mark a new CUDA-graph iteration first."""
    if cudagraphs:  # a new iteration: the last step's graph outputs may be overwritten
        torch.compiler.cudagraph_mark_step_begin()
    with watch or contextlib.nullcontext(), prec.autocast(device_type):
        loss = loss_fn(model, batch, objective)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
    else:
        loss.backward()
    if between is not None:
        between()
    grad_norm = clip_grad_norm(model.parameters(), max_grad_norm)
    scale = skipped = None
    if scaler is not None:
        scale = scaler._get_scale_async().clone()  # get_scale() would sync; update() changes it in place
        scaler.step(optimizer)
        scaler.update()
        skipped = scaler._get_scale_async() < scale  # the scaler backs off exactly when it skips
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    loss = loss.detach()
    return StepResult(loss.clone() if cudagraphs else loss, grad_norm, scale, skipped)  # the next replay reuses it

