"""Model FLOPs of BERT training steps (matmul FLOPs, the convention behind MFU).

Counted: every matrix multiply of the model, at 2 FLOPs per multiply-add, on every token the model
computes on (padding included: the GPU computes on it). Not counted: embeddings lookups, LayerNorm,
softmax, GELU, dropout, residual adds, the loss and the optimizer (all O(tokens x hidden) with a
small constant, a few % at most for BERT sizes). This is the "model FLOPs" of the PaLM paper's MFU:
the same number for every precision and kernel, so MFU = achieved model FLOP/s / peak FLOP/s.

Forward FLOPs per token, per encoder layer, hidden h, FFN width f, sequence length s:

=========================  ============  =======================================
Q, K, V projections        3 * 2*h*h     three h x h matmuls
attention scores  Q K^T    2*s*h         each token's query against s keys (all heads together)
weighted sum      P V      2*s*h         s attention weights times s values
output projection          2*h*h
FFN in / out               2*h*f + 2*f*h
=========================  ============  =======================================
total per layer            8h^2 + 4hf + 4sh

Heads:

* masked LM (``BertForMaskedLM``): transform h x h + decoder h x V on *every* token
  (transformers computes the logits at all positions; the loss uses the masked ones):
  ``2h^2 + 2hV`` per token.
* classification (``BertForSequenceClassification``): pooler h x h + classifier h x C on the
  [CLS] token only: ``2h^2 + 2hC`` per *sequence*.

Training step = 3 x forward (backward = 2 x forward: gradients with respect to the inputs and to
the weights, each a matmul of the forward's size).

The study's engine does less than the stock forward for the same loss and gradients, and its FLOPs
are counted as done (``head_rows``, ``cls_only_last_layer``):

* masked LM: the head scores only the labelled rows (``engine.mlm_forward``; ~15% of the tokens,
  padded to a multiple of 16): ``head_rows * (2h^2 + 2hV)`` instead of every token's.
* classification: the last encoder layer computes keys and values for every token, but queries,
  attention, output projection and FFN for [CLS] only (``engine.cls_only_last_layer``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

OBJECTIVES = ("mlm", "classify")
#: backward costs 2x forward (input gradients + weight gradients)
TRAIN_MULTIPLIER = 3


@dataclass(frozen=True)
class BertDims:
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    vocab_size: int
    num_labels: int = 2

    @classmethod
    def of(cls, config: Any) -> "BertDims":
        """From a ``transformers.BertConfig``, a mapping, or a BertDims."""
        if isinstance(config, BertDims):
            return config
        get = config.get if isinstance(config, Mapping) else lambda k, d=None: getattr(config, k, d)
        missing = [k for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size") if get(k) is None]
        if missing:
            raise ValueError(f"BERT config lacks {missing} (needs hidden_size, num_hidden_layers, "
                             "intermediate_size, vocab_size)")
        return cls(
            hidden_size=int(get("hidden_size")),
            num_hidden_layers=int(get("num_hidden_layers")),
            intermediate_size=int(get("intermediate_size")),
            vocab_size=int(get("vocab_size")),
            num_labels=int(get("num_labels", 2) or 2),
        )


def layer_forward_flops_per_token(config: Any, seq_len: int) -> dict[str, int]:
    """Forward matmul FLOPs of one encoder layer for one token, by part."""
    d = BertDims.of(config)
    h, f, s = d.hidden_size, d.intermediate_size, int(seq_len)
    return {
        "qkv": 3 * 2 * h * h,
        "attention_scores": 2 * s * h,
        "attention_weighted_sum": 2 * s * h,
        "attention_output": 2 * h * h,
        "ffn": 2 * h * f + 2 * f * h,
    }


def forward_flops(config: Any, batch: int, seq_len: int, objective: str, *, head_rows: int | None = None,
                  cls_only_last_layer: bool = False) -> dict[str, int]:
    """Forward matmul FLOPs of one batch, by part (``encoder``, ``head``) and ``total``.

    ``head_rows`` (mlm): token rows the vocabulary head scores per batch (default: every token, as
    ``BertForMaskedLM`` does). ``cls_only_last_layer`` (classify): the engine's last layer.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r}: allowed {', '.join(OBJECTIVES)}")
    d = BertDims.of(config)
    h, f, s = d.hidden_size, d.intermediate_size, int(seq_len)
    tokens = int(batch) * s
    per_layer = sum(layer_forward_flops_per_token(d, seq_len).values())
    encoder = tokens * d.num_hidden_layers * per_layer
    if objective == "classify" and cls_only_last_layer:
        last = layer_forward_flops_per_token(d, seq_len)
        encoder -= tokens * per_layer  # the last layer, counted anew:
        encoder += tokens * 2 * (2 * h * h)  # K and V for every token
        encoder += int(batch) * (2 * h * h + last["attention_scores"] + last["attention_weighted_sum"]
                                 + last["attention_output"] + last["ffn"])  # Q, attention, out, FFN for [CLS]
    if objective == "mlm":
        rows = tokens if head_rows is None else int(head_rows)
        head = rows * (2 * h * h + 2 * h * d.vocab_size)
    else:
        head = int(batch) * (2 * h * h + 2 * h * d.num_labels)
    return {"encoder": encoder, "head": head, "total": encoder + head}


def train_step_flops(config: Any, batch: int, seq_len: int, objective: str, **engine) -> int:
    """Model FLOPs of one training step (forward + backward = 3 x forward) of ``batch`` sequences.

    ``engine``: ``head_rows`` / ``cls_only_last_layer`` as in :func:`forward_flops`.
    """
    return TRAIN_MULTIPLIER * forward_flops(config, batch, seq_len, objective, **engine)["total"]


#: the engine pads the rows its masked-LM head scores to a multiple of this (tensor-core shapes)
HEAD_ROW_MULTIPLE = 16


def padded_head_rows(labelled: int) -> int:
    """Rows the engine's masked-LM head scores for ``labelled`` labelled tokens (engine.mlm_forward)."""
    return int(labelled) + (-int(labelled)) % HEAD_ROW_MULTIPLE


def engine_head_rows(batch: int, seq_len: int, mlm_probability: float = 0.15) -> int:
    """Expected rows the engine's masked-LM head scores per batch (labelled tokens, padded)."""
    return padded_head_rows(round(int(batch) * int(seq_len) * float(mlm_probability)))


def train_flops_per_token(config: Any, seq_len: int, objective: str) -> float:
    return train_step_flops(config, 1, seq_len, objective) / int(seq_len)


def mfu(step_flops: float, step_seconds: float, peak_flops_per_second: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s divided by the device's peak FLOP/s."""
    if step_seconds <= 0 or peak_flops_per_second <= 0:
        raise ValueError("step_seconds and peak_flops_per_second must be > 0")
    return step_flops / step_seconds / peak_flops_per_second


def parameter_count(config: Any, objective: str = "classify", type_vocab_size: int = 2,
                    max_position_embeddings: int = 512) -> int:
    """Parameters of a BERT (weights + biases + LayerNorms), for 6 * N * tokens sanity checks."""
    d = BertDims.of(config)
    h, f, L = d.hidden_size, d.intermediate_size, d.num_hidden_layers
    emb = (d.vocab_size + max_position_embeddings + type_vocab_size) * h + 2 * h
    layer = 4 * (h * h + h) + (h * f + f) + (f * h + h) + 2 * 2 * h
    if objective == "mlm":
        head = (h * h + h) + 2 * h + d.vocab_size  # transform + LayerNorm + decoder bias (weight tied)
    else:
        head = (h * h + h) + (h * d.num_labels + d.num_labels)  # pooler + classifier
    return emb + L * layer + head


#: standard sizes (vocab of bert-base-cased; bert-small as in Turc et al. 2019)
BERT_BASE = BertDims(hidden_size=768, num_hidden_layers=12, intermediate_size=3072, vocab_size=28996)
BERT_SMALL = BertDims(hidden_size=512, num_hidden_layers=4, intermediate_size=2048, vocab_size=30522)
