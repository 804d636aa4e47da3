"""One training stage of a BERT-style model under one named precision.

The loop is deliberately plain (nanoGPT style): the only place precision enters is
``prec.autocast(...)`` around the forward pass, ``scaler`` around backward/step, and
``prec.prepare_model`` for the storage dtype. Everything measured goes to ``metrics.json``
(see docs/contracts.md, "metrics.json") and the per-step log ``steps.csv``.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import json
import math
import os
import random
import signal
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from .. import METRICS_SCHEMA_VERSION
from .. import flops, gpu, measure
from .. import precision as P
from ..errors import EXIT_PREEMPTED, PrecisionUnsupported, PrecswitchError
from ..telemetry import ActivationTelemetry
from ..io import atomic_path, atomic_write_json, atomic_write_text, flock_and_sign, lock_holder, read_json
from . import config as C

STAGE_FILE = "precswitch_stage.json"
STEP_FIELDS = ["step", "loss", "lr", "grad_norm", "loss_scale", "step_seconds", "skipped"]


class Preempted(Exception):
    """SIGTERM (or SIGINT: Ctrl-C) arrived: the resumable state was saved. ``exit_code``: EXIT_PREEMPTED after
    SIGTERM, 130 (the shell's code for Ctrl-C) after SIGINT."""

    def __init__(self, message: str, exit_code: int = EXIT_PREEMPTED):
        super().__init__(message)
        self.exit_code = exit_code


#: the signals that stop a stage with its state saved (SIGTERM: a scheduler's preemption or Snakemake's
#: cancellation; SIGINT: Ctrl-C), and each one's exit code
STOP_SIGNALS = {signal.SIGTERM: EXIT_PREEMPTED, signal.SIGINT: 128 + signal.SIGINT}


def blown_up(nonfinite: int, steps: int, eval_loss: float | None, objective: str, vocab_size: int,
             max_fraction: float = C.DEFAULTS["max_nonfinite_fraction"]) -> str | None:
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


# ====================================================================== inputs
def _quiet_transformers() -> None:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
    except Exception:  # noqa: BLE001
        pass


def _load_data(hp: dict) -> tuple[Any, Any, dict]:
    import datasets

    data_dir = Path(hp["data"])
    meta_path = data_dir / "meta.json"
    if not data_dir.is_dir():
        raise PrecswitchError(f"data dir {str(data_dir)!r} does not exist (write it with `precswitch prepare`)")
    if not meta_path.is_file():
        raise PrecswitchError(f"data dir {str(data_dir)!r} has no meta.json: not written by `precswitch prepare`")
    meta = read_json(meta_path)
    if meta.get("objective") != hp["objective"]:
        raise PrecswitchError(
            f"data {str(data_dir)!r} was prepared for objective {meta.get('objective')!r}, "
            f"but this stage's objective is {hp['objective']!r}"
        )
    try:
        dd = datasets.load_from_disk(str(data_dir))
    except Exception as e:  # noqa: BLE001
        raise PrecswitchError(f"data dir {str(data_dir)!r} cannot be read as a prepared dataset: {e}") from None
    for split in ("train", "eval"):
        if split not in dd:
            raise PrecswitchError(f"data dir {str(data_dir)!r} lacks the {split!r} split (has {list(dd)})")
        if len(dd[split]) == 0:
            raise PrecswitchError(f"data dir {str(data_dir)!r}: the {split!r} split is empty")
    return dd["train"], dd["eval"], meta


def _load_tokenizer(hp: dict, meta: dict):
    from transformers import AutoTokenizer

    tok_dir = hp["tokenizer"] or meta.get("tokenizer")
    if not tok_dir:
        raise PrecswitchError("no tokenizer: set hparams 'tokenizer' (the data's meta.json names none)")
    if not Path(tok_dir).exists():
        raise PrecswitchError(f"tokenizer dir {str(tok_dir)!r} does not exist")
    try:
        return AutoTokenizer.from_pretrained(str(tok_dir))
    except Exception as e:  # noqa: BLE001
        raise PrecswitchError(f"tokenizer {str(tok_dir)!r} cannot be loaded: {e}") from None


def _init_info(init: str) -> dict:
    """What the init checkpoint says about itself (written by a previous stage), if anything."""
    p = Path(init) / STAGE_FILE
    return read_json(p) if p.is_file() else {}


def _checkpoint_dtype(init_dir: Path) -> str | None:
    """dtype of the first floating tensor stored in a safetensors checkpoint (what the next stage reads)."""
    files = sorted(init_dir.glob("*.safetensors"))
    if not files:
        return None
    try:
        with open(files[0], "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
    except Exception:  # noqa: BLE001 - reported by from_pretrained later
        return None
    names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
    for k, v in header.items():
        if k != "__metadata__" and v.get("dtype") in names:
            return names[v["dtype"]]
    return None


def _model_pin(hp: dict, init: str, init_info: dict) -> dict:
    """Hub revision (requested) and commit (resolved, from the cache) of the pretrained model this run's weights
    come from: init itself when it is a hub name, else what the init checkpoint's stage file says (stage 2)."""
    if init == "scratch":
        return {"model_revision": None, "model_commit": None}
    if Path(init).expanduser().is_dir():
        return {"model_revision": init_info.get("model_revision"), "model_commit": init_info.get("model_commit")}
    from ..fetch import hub_commit

    return {"model_revision": hp.get("init_revision"), "model_commit": hub_commit(init, hp.get("init_revision"))}


def _attn_kernel(attn: str, device) -> str:
    """model.attn_implementation ``auto``: sdpa on CUDA (fused attention kernels), eager on a CPU (5-10% faster
    for the tiny CPU model, docs/findings.md); eager and sdpa as given."""
    if attn != "auto":
        return attn
    return "sdpa" if device is not None and torch.device(device).type == "cuda" else "eager"


def _build_model(hp: dict, tokenizer, meta: dict, device=None):
    """Scratch from a BertConfig, or from a checkpoint dir / pretrained name; ``device`` picks the attention
    kernel of ``auto`` (None: a CPU's)."""
    from transformers import AutoConfig, BertConfig, BertForMaskedLM, BertForSequenceClassification

    cls = BertForMaskedLM if hp["objective"] == "mlm" else BertForSequenceClassification
    extra = {}
    if hp["objective"] == "classify":
        extra["num_labels"] = int(meta["num_labels"])
    m = dict(hp["model"])
    attn = _attn_kernel(m.pop("attn_implementation", "auto"), device)
    init = str(hp["init"])
    revision = hp.get("init_revision")
    if init == "scratch":
        cfg = BertConfig(
            vocab_size=m.pop("vocab_size", None) or len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            attn_implementation=attn,
            **m,
            **extra,
        )
        return cls(cfg), None
    path = Path(init).expanduser()
    is_dir = path.is_dir()
    if not is_dir and (init.startswith((".", "/", "~")) or init.count("/") > 1 or path.suffix):
        raise PrecswitchError(f"model init {init!r}: directory does not exist")
    if is_dir and not (path / "config.json").is_file():
        raise PrecswitchError(f"model dir {init!r} has no config.json: not a saved model (save_pretrained)")
    if is_dir and revision:
        raise PrecswitchError(f"init_revision {revision!r} is for a hub model; init {init!r} is a local directory")
    rev = {"revision": revision} if revision else {}  # the pinned hub branch/tag/commit (model.revision)
    try:
        cfg = AutoConfig.from_pretrained(init, **extra, **rev)
        cfg._attn_implementation = attn
        model = cls.from_pretrained(init, config=cfg, dtype=torch.float32, **rev)
    except OSError as e:
        from ..fetch import hub_offline

        offline = hub_offline()
        if is_dir:
            raise PrecswitchError(f"checkpoint {init!r} is corrupt or incomplete: {str(e).splitlines()[0]}") from None
        raise PrecswitchError(
            f"model {init!r}" + (f" (revision {revision!r})" if revision else "")
            + " is not a local dir and could not be loaded from the hub"
            + (" (offline: HF_HUB_OFFLINE=1 and it is not in the cache; run the download rule first)" if offline else "")
            + f": {str(e).splitlines()[0]}"
        ) from None
    except Exception as e:  # noqa: BLE001 - truncated safetensors etc.
        raise PrecswitchError(f"checkpoint {init!r} cannot be loaded (corrupt or truncated?): {e}") from None
    return model, (_checkpoint_dtype(path) if is_dir else None)


# ====================================================================== batching
def step_seed(seed: int, step: int) -> int:
    """The RNG seed of training step ``step``'s masked-LM masks: a pure function of (seed, step)."""
    return int(np.random.SeedSequence([seed, step, 0x6D61736B]).generate_state(1)[0])


class Batches:
    """Deterministic batches: epoch e is a fixed permutation seeded by (seed, e); position = step.

    Both the order and the masked-LM masks are pure functions of (seed, step) (the collator runs
    under ``step_seed``, not the global RNG), so a resumed run sees exactly the batches the
    uninterrupted run would have seen without saving a sampler, every precision of seed s masks the
    same tokens whatever its dropout draws, and the loop can build step t+1's batch while the GPU
    still runs step t without changing any result. Rows stay in the Arrow dataset (memory-mapped)
    and are fetched per batch, so a large corpus costs no Python memory.
    """

    def __init__(self, ds, batch_size: int, seed: int, collate):
        self.ds, self.bs, self.seed, self.collate = ds, batch_size, seed, collate
        self.n = len(ds)
        self.per_epoch = self.n // batch_size
        self._epoch, self._perm = -1, None

    def get(self, step: int) -> dict:
        epoch, pos = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm, self._epoch = torch.randperm(self.n, generator=g).tolist(), epoch
        feats = _features(self.ds, self._perm[pos * self.bs : (pos + 1) * self.bs])
        # Only the CPU generator the collator draws from: torch.manual_seed would also reseed every CUDA
        # generator (and fork_rng(devices=[]) would not restore them), making GPU dropout f(seed, step).
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(step_seed(self.seed, step))
            return self.collate(feats)


def _model_columns(ds, objective: str):
    cols = ["input_ids", "attention_mask", "token_type_ids"] + (["labels"] if objective == "classify" else [])
    return ds.select_columns([c for c in cols if c in ds.column_names])


def _features(ds, idx) -> list[dict]:
    cols = ds[idx]
    return [dict(zip(cols, vals)) for vals in zip(*cols.values())]


class _PadAfterMasking:
    """Pad a masked-LM batch to a multiple of ``multiple`` AFTER masking: the masks are drawn on the
    unpadded shape, so they are the ones every other precision of the seed draws (masking a wider
    tensor draws other random numbers for every token). The added columns are padding: pad id,
    attention 0, token type 0, label -100."""

    def __init__(self, collate, multiple: int, pad_id: int):
        self.collate, self.multiple, self.pad_id = collate, multiple, pad_id

    def __call__(self, features):
        batch = self.collate(features)
        extra = -batch["input_ids"].shape[1] % self.multiple
        if extra:
            fill = {"input_ids": self.pad_id, "labels": -100}
            for k, v in batch.items():
                if isinstance(v, torch.Tensor) and v.dim() == 2:
                    batch[k] = torch.nn.functional.pad(v, (0, extra), value=fill.get(k, 0))
        return batch


def _make_collator(objective: str, tokenizer, mlm_probability: float, pad_to_multiple_of: int | None = None):
    """``pad_to_multiple_of``: fp8 stages pad every batch's length to a multiple of 16, because fp8
    matmuls (torch._scaled_mm) need every dimension, the tokens of the weight gradient included, divisible by 16.
    Masked LM pads after masking (:class:`_PadAfterMasking`), so an fp8 stage masks the same tokens."""
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding

    if objective == "mlm":
        mlm = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=mlm_probability)
        return _PadAfterMasking(mlm, pad_to_multiple_of, tokenizer.pad_token_id) if pad_to_multiple_of else mlm
    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)


# ====================================================================== the forward pass
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


#: batch keys of the masked-LM rows selected on the host (mlm_head_rows); not model inputs
HEAD_KEYS = ("head_rows", "head_labels")
#: a compiled classification stage pads its training batches to a multiple of this many tokens
COMPILED_PAD_MULTIPLE = 32
#: batch keys mlm_forward reads itself (not passed to the encoder)
MLM_EXTRA_KEYS = ("labels", *HEAD_KEYS)


def drop_full_attention_mask(batch: dict) -> dict:
    """Drop an attention mask that masks nothing (no padding, as in packed masked-LM blocks), checked
    on the host before the batch goes to the device. Given such a mask on a GPU, transformers checks
    it there (``padding_mask.all()`` in its mask utilities: a device-to-host sync in the middle of
    every forward) and then attends without a mask; given none, it attends without a mask straight
    away. Same kernels, same numbers (tests/test_engine.py), one sync per step fewer. A batch with
    any padding keeps its mask."""
    mask = batch.get("attention_mask")
    if mask is not None and mask.device.type == "cpu" and bool(mask.all()):
        del batch["attention_mask"]
    return batch


def mlm_head_rows(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The flat positions the masked-LM head scores and their labels, padded with ignored rows to a
    multiple of 16 (``flops.padded_head_rows``). On a CPU tensor this is host work: the training loop
    does it while building the batch, because ``nonzero`` on a GPU tensor waits for the GPU."""
    idx = (labels.view(-1) != -100).nonzero().squeeze(1)
    pad = flops.padded_head_rows(idx.numel()) - idx.numel()
    rows_labels = labels.view(-1)[idx]
    if pad:
        idx = torch.cat([idx, idx.new_zeros(pad)])
        rows_labels = torch.cat([rows_labels, rows_labels.new_full((pad,), -100)])
    return idx, rows_labels


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


# ====================================================================== the optimizer and one step
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


# ====================================================================== evaluation
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


#: a masked-LM eval split with no masked token has no loss to report (not a model that is NaN)
NO_EVAL_MASK = ("the masked-LM eval split has no masked token: raise train.pretrain.mlm_probability "
                "(hparams mlm_probability) or the number of eval rows")


def _eval_batches(rows, collate, bs: int, seed: int) -> list[dict]:
    """Eval batches built once under a fixed RNG: every run is scored on the same MLM masks."""
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)  # CPU only, as in Batches.get
        return [collate(_features(rows, range(i, min(i + bs, len(rows))))) for i in range(0, len(rows), bs)]


# ====================================================================== state (resume)
def _rng_state() -> dict:
    st = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def _save_state(path: Path, state: dict) -> float:
    t = time.perf_counter()
    with atomic_path(path) as tmp:
        torch.save(state, tmp)
    return time.perf_counter() - t


#: beside state.pt: the resumable-state save count and seconds including the save that wrote state.pt (whose own
#: duration its pickled loop state cannot hold), so a resumed stage reports that save's seconds too
STATE_SECONDS = "state_seconds.json"


def _save_state_counted(path: Path, snapshot, st: dict) -> None:
    """Count a save in the loop state ``st``, save ``snapshot()`` (which holds ``st``), and record the count and the
    seconds, this save's included, beside it."""
    st["state_saves"] += 1
    st["state_seconds"] += _save_state(path, snapshot())
    atomic_write_json(path.parent / STATE_SECONDS, {"state_saves": st["state_saves"],
                                                    "state_seconds": st["state_seconds"]})


def _read_state_seconds(path: Path) -> dict:
    """The count and seconds of the save that wrote state.pt, or {} where that is not known: the file is absent (a
    kill -9 between the two writes) or unreadable. It is bookkeeping only (one save's seconds): never a reason to
    refuse the resume that state.pt allows."""
    try:
        done = read_json(path)
    except (OSError, ValueError):
        return {}
    ok = (isinstance(done, dict) and isinstance(done.get("state_saves"), int)
          and isinstance(done.get("state_seconds"), (int, float)) and math.isfinite(done["state_seconds"]))
    return done if ok else {}


def _set_aside_stale_state(resume_dir: Path, old_hash, new_hash: str) -> Path:
    """The resumable state of a stage stopped under other hyper-parameters (a config changed before the rerun)
    cannot be resumed: it is moved aside, not deleted (``<resume_dir>.stale-<its hash>``, replacing an older
    one of the same hash), and the stage starts over; one line in the log says so."""
    stale = resume_dir.with_name(f"{resume_dir.name}.stale-{str(old_hash)[:16]}")
    if stale.exists():
        import shutil

        shutil.rmtree(stale)  # the same hyper-parameters' older state
    os.replace(resume_dir, stale)
    print(f"precswitch train: resume state {str(resume_dir / 'state.pt')!r} belongs to different hyper-parameters "
          f"(hash {old_hash} != {new_hash}): moved to {str(stale)!r}; the stage starts over", file=sys.stderr,
          flush=True)
    return stale


# ====================================================================== the stage
#: the file in a stage's output dir that the process training into it holds an exclusive lock on
RUN_LOCK = ".lock"


@contextlib.contextmanager
def _run_dir_lock(out: Path):
    """Hold an exclusive lock on ``out`` for the stage: a second process training into the same dir (a rerun
    while an orphan of a killed Snakemake, or a job of a lost SLURM session, still trains there) would mix
    both runs' state, checkpoint and metrics. It is refused at once, naming the holder; the lock goes with
    its process (flock), so a killed stage leaves none behind."""
    import socket

    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / RUN_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:  # not writable: run_stage says so, naming the dir
        yield
        return
    try:
        job = os.environ.get("SLURM_JOB_ID")
        info = f"pid {os.getpid()} on {socket.gethostname()}" + (f", SLURM job {job}" if job else "")
        if not flock_and_sign(fd, info):
            raise PrecswitchError(
                f"output dir {str(out)!r} is in use by another training process "
                f"({lock_holder(out / RUN_LOCK, 'unknown process')}): stop it first "
                "(kill it, or scancel its SLURM job), then run again") from None
        yield
    finally:
        os.close(fd)  # releases the lock


def run_stage(hparams: dict, out_dir: str | os.PathLike, on_locked=None) -> dict:
    """Run one stage. Returns the metrics dict (also written to ``out_dir/metrics.json``).

    Raises PrecswitchError for bad input (before training, and when another process trains into
    ``out_dir``), Preempted after SIGTERM or SIGINT (state saved). The process-wide numeric switches the stage
    sets (TF32, float32 matmul precision, deterministic algorithms, threads) are the caller's again when it returns
    or raises (:func:`precswitch.precision.restoring_global_numerics`). ``on_locked``: called once the stage holds
    ``out_dir`` (the CLI's --log opens the log file then, so a refused run does not truncate the holder's).
    """
    C.resolve(hparams)  # bad hparams are named before anything is created
    # the stage sets TF32, matmul precision, deterministic algorithms and threads for itself: the caller gets its own back
    with _run_dir_lock(Path(out_dir)), P.restoring_global_numerics():
        if on_locked is not None:
            on_locked()
        return _run_stage(hparams, out_dir)


def _run_stage(hparams: dict, out_dir: str | os.PathLike) -> dict:
    """The stage from top to bottom: set-up, resume, the loop, evaluation, checkpoint, records."""
    s = _open(hparams, out_dir)
    reason = _skip_reason(s)
    if reason:
        return _record_skipped(s, reason)
    _phase(s, "data")
    _setup_data(s)
    _phase(s, "model")
    _setup_model(s)
    _setup_training(s)
    _restore_state(s)
    with _StopSignals() as stop:
        s.setup_seconds = time.perf_counter() - s.t_setup - (gpu.claim_info()["gpu_slot_wait_seconds"] or 0.0)
        _phase(s, "training")
        loop = _train_loop(s, stop)
        _phase(s, "eval")
        ev = _evaluate_stage(s)
        if stop.requested:  # preempted while evaluating: keep the finished training, not the evaluation
            _save_loop_state(s)
            raise stop.preempted(f"after step {s.st['step']} (evaluation)", s.state_path)
        # SIGTERM and SIGINT stay caught until the checkpoint is written: stopped during evaluation, the stage
        # saves its finished training (a rerun evaluates it); during the checkpoint write, it finishes (seconds)
        _phase(s, "checkpoint")
        t_ckpt = time.perf_counter()
        try:
            _save_checkpoint(s)
        except OSError as e:
            raise _write_failed(s, e, s.out / "checkpoint") from None
    checkpoint_seconds = time.perf_counter() - t_ckpt + s.st["state_seconds"]
    try:
        return _write_records(s, loop, ev, checkpoint_seconds)
    except OSError as e:
        raise _write_failed(s, e, e.filename or s.out / "metrics.json") from None


def _write_failed(s: _Stage, error: OSError, what) -> PrecswitchError:
    """A write at the end of the stage failed (a full disk, a quota, a read-only mount): one line naming the file,
    and the training kept resumable: its state saved now (the rerun evaluates and writes it), or, where that
    cannot be written either, the last state saved during the loop kept as it was (written atomically)."""
    try:
        _save_loop_state(s)
        kept = f"the finished training is saved in {str(s.state_path)!r}"
    except OSError:
        kept = (f"the last resumable state {str(s.state_path)!r} is kept" if s.state_path.is_file()
                else "no resumable state could be saved either: the stage starts over")
    return PrecswitchError(f"cannot write {str(what)!r}: {error.strerror or error}; {kept}; free space (or make it "
                           "writable) and run the same command again")


@dataclass
class _Stage:
    """What the stage's steps share: its settings and run-wide objects (set up in order), and ``st``, the loop
    state saved in state.pt (a plain dict: resumable across versions)."""

    hp: dict
    out: Path
    t_setup: float
    prec: P.Precision
    prec2: P.Precision | None  # the in-stage switch (e.g. 80% amp_fp16 then fp32): new autocast/scaler/TF32 flags
    eval_prec: P.Precision
    device: torch.device
    flags: dict  # the backend flags in force (TF32, matmul precision, deterministic): recorded in metrics.json
    chash: str
    base: dict  # the first keys of every metrics.json, skipped stages' included
    init: str
    init_info: dict = field(default_factory=dict)  # what the init checkpoint's stage file says (stage 2)
    # _setup_data
    meta: dict = field(default_factory=dict)
    tokenizer: Any = None
    total_steps: int = 0
    switch_step: int | None = None
    batches: Batches | None = None
    eval_batches: list = field(default_factory=list)
    # _setup_model, _setup_training
    model: Any = None
    ckpt_dtype_read: str | None = None
    model_pin: dict = field(default_factory=dict)
    optimizer: Any = None
    scheduler: Any = None
    scaler: Any = None
    tel: ActivationTelemetry | None = None
    train_loss: Any = None
    cudagraphs: bool = False
    # resume and the loop
    state_path: Path | None = None
    st: dict = field(default_factory=dict)
    resumed: bool = False
    cur: P.Precision | None = None  # the precision in force (prec, or prec2 past the switch step)
    setup_seconds: float = 0.0

    def active(self, step: int) -> P.Precision:
        return self.prec2 if self.prec2 is not None and step >= self.switch_step else self.prec


def _phase(s: _Stage, name: str) -> None:
    """One line in the stage's log when a phase starts: data, model, training, eval, checkpoint."""
    print(f"precswitch train {s.hp['run_id']}: phase {name} (+{time.perf_counter() - s.t_setup:.1f} s)",
          file=sys.stderr, flush=True)


# ------------------------------------------------------------------ set-up
def _open(hparams: dict, out_dir) -> _Stage:
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
    chash = C.config_hash(hp)
    base = {
        "schema_version": METRICS_SCHEMA_VERSION, "run_id": hp["run_id"], "stage": hp["stage"],
        "objective": hp["objective"], "precision": prec.name, "seed": hp["seed"],
        "schedule": hp["tags"].get("schedule"), "tags": hp["tags"], "config_hash": chash, "started_at": started_at,
    }
    return _Stage(hp=hp, out=out, t_setup=t_setup, prec=prec, prec2=P.get(hp["switch_to"]) if hp["switch_to"] else None,
                  eval_prec=prec if hp["eval_precision"] == "same" else P.get(hp["eval_precision"]), device=device,
                  flags=flags, chash=chash, base=base, init=str(hp["init"]))


def _skip_reason(s: _Stage) -> str | None:
    """Why the stage is recorded as skipped instead of run: a precision this device lacks (on_unsupported: skip),
    or an init checkpoint whose own stage was skipped. None: it runs."""
    try:  # every precision the stage would run: its own, the in-stage switch_to, the eval precision
        for p in {q.name: q for q in (s.prec, s.prec2, s.eval_prec) if q is not None}.values():
            P.check_supported(p, s.device)
    except PrecisionUnsupported as e:
        if s.hp["on_unsupported"] != "skip":
            raise
        return str(e)  # recorded without its init keys
    s.init_info = _init_info(s.init) if s.init != "scratch" else {}
    if s.init_info.get("status") == "skipped":  # nothing to start from: recorded, as its stage 1 was
        return (f"its init {s.init!r} is stage {s.init_info.get('run_id')!r}, which was skipped: "
                f"{s.init_info.get('status_reason')}")
    return None


def _record_skipped(s: _Stage, reason: str) -> dict:
    """Record the stage as skipped: metrics.json, a header-only steps.csv and, where the stage saves
    one, a checkpoint/ holding only its stage file (status skipped), so that the next stage, which
    starts from it, is recorded as skipped too instead of failing on a missing checkpoint."""
    hp = s.hp
    atomic_write_text(s.out / "steps.csv", ",".join(STEP_FIELDS) + "\n")
    if hp["save_checkpoint"]:
        with atomic_path(s.out / "checkpoint") as tmp:
            tmp.mkdir()
            atomic_write_json(tmp / STAGE_FILE, {"run_id": hp["run_id"], "precision": s.prec.name,
                                                 "objective": hp["objective"], "dtype": None, "status": "skipped",
                                                 "status_reason": reason, "config_hash": s.chash})
    info = s.init_info
    init_keys = ({"init": s.init, "init_run_id": info.get("run_id"), "init_precision": info.get("precision"),
                  "init_status": info.get("status")} if info else {})
    metrics = {**s.base, "status": "skipped", "status_reason": reason, **init_keys, **measure.provenance(s.device),
               **s.flags, "hparams": hp, "finished_at": measure.now_iso()}
    atomic_write_json(s.out / "metrics.json", metrics)
    return metrics


def _setup_data(s: _Stage) -> None:
    """Libraries quiet, the prepared data and tokenizer, the step count, the training batches (built per step)
    and the evaluation batches (built once)."""
    hp = s.hp
    torch.use_deterministic_algorithms(hp["deterministic"])  # set every run, either way (as the TF32 switches)
    s.flags = P.backend_flags()
    _quiet_transformers()
    if hp["objective"] == "classify":  # the task metrics; a masked-LM stage is spared sklearn and scipy (~3 s)
        import sklearn.metrics  # noqa: F401 - imported in set-up, so eval_seconds times evaluation, not imports
    # GradScaler skips optimizer.step() on overflow by design; the scheduler still advances (as in PyTorch's AMP
    # recipe; HF Trainer instead holds it back on a skipped step), so step t has the same LR in every precision.
    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")

    train_ds, eval_ds, s.meta = _load_data(hp)
    s.tokenizer = _load_tokenizer(hp, s.meta)
    if hp["batch_size"] > len(train_ds):
        raise PrecswitchError(
            f"batch_size {hp['batch_size']} is larger than the training set ({len(train_ds)} rows in {hp['data']!r})"
        )
    per_epoch = len(train_ds) // hp["batch_size"]  # = Batches.per_epoch
    s.total_steps = hp["steps"] if hp["steps"] is not None else max(1, int(round(hp["epochs"] * per_epoch)))
    s.switch_step = C.switch_step(hp, s.total_steps)  # an epochs stage's switch point: refused before training
    if s.total_steps <= hp["timing_warmup_steps"]:  # metrics.json's timing_warmup_short; the verdict says it
        print(f"precswitch train {hp['run_id']}: warning: the stage has {s.total_steps} step(s), not more than "
              f"timing_warmup_steps {hp['timing_warmup_steps']}: its steady-state rates include the warm-up "
              "(use more steps or epochs, or fewer timing_warmup_steps)", file=sys.stderr, flush=True)

    pad16 = 16 if s.prec.fp8_linear else None  # an in-stage switch keeps fp8 (config.resolve: same weight storage)
    collate = _make_collator(hp["objective"], s.tokenizer, hp["mlm_probability"], pad16)
    train_collate = collate
    if hp["compile"] != "off" and hp["objective"] == "classify":
        # compiled: pad training batches to a multiple of 32 (a few shapes), not each to its longest pair
        # (a shape per batch: a recompile or, with CUDA graphs, a recorded graph for each); eval stays eager
        train_collate = _make_collator(hp["objective"], s.tokenizer, hp["mlm_probability"], COMPILED_PAD_MULTIPLE)
    s.batches = Batches(_model_columns(train_ds, hp["objective"]), hp["batch_size"], hp["seed"], train_collate)
    eval_rows = _model_columns(eval_ds, hp["objective"])
    s.eval_batches = _eval_batches(eval_rows, collate, hp["eval_batch_size"], hp["eval_seed"])
    if hp["objective"] == "mlm" and not any(bool((b["labels"] != -100).any()) for b in s.eval_batches):
        raise PrecswitchError(f"{NO_EVAL_MASK} ({len(eval_rows)} eval rows in {hp['data']!r}, mlm_probability "
                              f"{hp['mlm_probability']}, eval_seed {hp['eval_seed']}); refused before training")


def _setup_model(s: _Stage) -> None:
    """The seeded model (scratch or the init checkpoint) in the precision's storage dtype on the device."""
    import transformers

    hp = s.hp
    transformers.set_seed(hp["seed"])
    model, s.ckpt_dtype_read = _build_model(hp, s.tokenizer, s.meta, s.device)
    s.model_pin = _model_pin(hp, s.init, s.init_info)
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


def _setup_training(s: _Stage) -> None:
    """Optimizer, LR schedule, loss scaler, activation telemetry and the (compiled or eager) training loss."""
    import transformers

    hp = s.hp
    s.optimizer = build_optimizer(s.model, hp, s.prec)
    warmup = int(round(hp["warmup_ratio"] * s.total_steps))
    s.scheduler = transformers.get_linear_schedule_with_warmup(s.optimizer, warmup, s.total_steps)
    s.scaler = s.active(0).make_scaler(s.device.type)
    s.tel = ActivationTelemetry(s.model, every=hp["telemetry_every"])
    # torch.compile (hparam compile; off = eager): the training forward and loss only; evaluation stays
    # eager. Compilation happens in the first steps, inside train_seconds (timing_warmup_steps excludes
    # it from the steady-state rates). reduce-overhead replays CUDA graphs: each step is marked new.
    s.train_loss = forward_loss if hp["compile"] == "off" else torch.compile(forward_loss, mode=hp["compile"])
    s.cudagraphs = hp["compile"] == "reduce-overhead" and s.device.type == "cuda"


# ------------------------------------------------------------------ state save / restore
def _new_loop_state() -> dict:
    return {
        "step": 0, "rows": [], "step_times": [], "train_seconds": 0.0, "nonfinite": 0, "consecutive": 0,
        "first_nonfinite": None, "skipped": 0, "scales": [], "attempts": 0, "tokens": 0, "samples": 0,
        "state_saves": 0, "state_seconds": 0.0, "status": "ok", "status_reason": None, "mlm_empty": 0,
        "grad_norms": [],
    }


def _restore_state(s: _Stage) -> None:
    """Continue from resume/state.pt where a stopped run of the same hyper-parameters left one (a stale one,
    of other hyper-parameters, is set aside); else start at step 0."""
    resume_dir = Path(s.hp["resume_dir"] or s.out / "resume")
    s.state_path = resume_dir / "state.pt"
    s.st = _new_loop_state()
    saved = None
    if s.state_path.is_file():
        try:
            # to the CPU: the RNG states must stay CPU byte tensors, and a GPU copy of the whole state
            # would sit in the peak memory; load_state_dict copies onto the model's/optimizer's device
            saved = torch.load(s.state_path, weights_only=False, map_location="cpu")
        except Exception as e:  # noqa: BLE001
            raise PrecswitchError(f"resume state {str(s.state_path)!r} is corrupt: {e}; "
                                  "delete it to start over") from None
        if saved.get("config_hash") != s.chash:
            _set_aside_stale_state(resume_dir, saved.get("config_hash"), s.chash)
            saved = None
    if saved is not None:
        s.model.load_state_dict(saved["model"])
        s.optimizer.load_state_dict(saved["optimizer"])
        s.scheduler.load_state_dict(saved["scheduler"])
        st = s.st = saved["loop"]
        st.setdefault("mlm_empty", 0)  # state saved before the counter existed
        done = _read_state_seconds(resume_dir / STATE_SECONDS)
        if done.get("state_saves") == st["state_saves"]:  # the same save: state.pt holds all but its own seconds
            st["state_saves"], st["state_seconds"] = done["state_saves"], done["state_seconds"]
        # a state saved before every step's norm was kept: the steps before it have their logged rows' norms only
        st.setdefault("grad_norms", [r[3] for r in st["rows"] if r[1] is not None])
        s.scaler = s.active(st["step"]).make_scaler(s.device.type)
        if s.scaler is not None and saved["scaler"] is not None:
            s.scaler.load_state_dict(saved["scaler"])
        if saved.get("telemetry"):
            s.tel.load_state_dict(saved["telemetry"])
        _set_rng_state(saved["rng"])
        s.resumed = True
    s.st["attempts"] += 1


def _save_loop_state(s: _Stage) -> None:
    """Save everything a rerun needs to continue bit for bit (resume/state.pt), counted in the loop state."""
    _save_state_counted(s.state_path, lambda: {
        "config_hash": s.chash, "model": s.model.state_dict(), "optimizer": s.optimizer.state_dict(),
        "scheduler": s.scheduler.state_dict(), "scaler": s.scaler.state_dict() if s.scaler is not None else None,
        "rng": _rng_state(), "loop": s.st, "telemetry": s.tel.state_dict() if s.tel.enabled else None,
    }, s.st)


class _StopSignals:
    """SIGTERM (a scheduler's preemption, Snakemake's cancellation) and SIGINT (Ctrl-C) caught while the stage
    trains, evaluates and writes its checkpoint: the loop then saves its state and raises :class:`Preempted`.
    The previous handlers are back when the block ends, however it ends."""

    def __init__(self):
        self.requested, self.signal, self._old = False, None, {}

    def __enter__(self) -> _StopSignals:
        self._old = {s: signal.getsignal(s) for s in STOP_SIGNALS}
        try:
            for s in STOP_SIGNALS:
                signal.signal(s, self._on_stop)
        except ValueError:  # not the main thread
            pass
        return self

    def __exit__(self, *exc) -> None:
        try:
            for s, h in self._old.items():
                signal.signal(s, h)
        except ValueError:
            pass

    def _on_stop(self, signum, frame) -> None:  # noqa: ARG002
        self.requested = True
        self.signal = self.signal or signal.Signals(signum)

    def preempted(self, where: str, state_path: Path) -> Preempted:
        sig = self.signal or signal.SIGTERM
        name = "SIGINT (Ctrl-C)" if sig == signal.SIGINT else sig.name
        return Preempted(f"{name} {where}: state saved to {state_path}", STOP_SIGNALS.get(sig, EXIT_PREEMPTED))


# ------------------------------------------------------------------ batches
def _host_batch(s: _Stage, step: int) -> tuple[dict, int, bool]:
    """The step's batch, built on the host, its token count (counted before a full mask is dropped), and
    whether it is a masked-LM batch without a masked token (nothing to score: a zero loss, see mlm_forward)."""
    b = s.batches.get(step)
    empty = False
    if s.hp["objective"] == "mlm":
        b.update(zip(HEAD_KEYS, mlm_head_rows(b["labels"])))
        empty = b["head_rows"].numel() == 0
    n_tokens = int(b["attention_mask"].sum())
    # compiled: the batch keeps one set of keys (a dropped mask is another graph); the compiled forward
    # has no mask check to sync on anyway
    return (drop_full_attention_mask(b) if s.hp["compile"] == "off" else b), n_tokens, empty


def _to_device(s: _Stage, batch: dict, empty: bool) -> dict:
    batch = {k: v.to(s.device, non_blocking=True) for k, v in batch.items()}
    if s.hp["compile"] != "off" and not empty:
        for k in HEAD_KEYS:  # the masked-row count varies by batch: one dynamic graph, not a recompile
            if k in batch:
                torch._dynamo.mark_dynamic(batch[k], 0)
    return batch


class _Prefetch:
    """The next step's host batch, built while the device runs this step's forward and backward."""

    def __init__(self, s: _Stage):
        self.s, self.pending = s, None

    def build(self, step: int) -> None:
        self.pending = (step, _host_batch(self.s, step))

    def take(self, step: int) -> tuple[dict, int, bool]:
        got, self.pending = self.pending, None
        return got[1] if got is not None and got[0] == step else _host_batch(self.s, step)


# ------------------------------------------------------------------ records of the loop
class _Ran(NamedTuple):
    """A step that ran, before its device results are read back."""

    step: int
    result: StepResult
    lr: float
    samples: int
    tokens: int
    empty: bool


def _read_back(ran: list[_Ran]) -> list[tuple[float, float, float | None, bool]]:
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


def _record_steps(s: _Stage, ran: list[_Ran], seconds: float) -> None:
    """Add the steps that ran to the loop state: counters, steps.csv rows, the non-finite run (divergence). Each
    step's time is its share of ``seconds`` (on a CPU, one step at a time: its own). A stage that diverges stops
    recording at the step it diverged at."""
    hp, st = s.hp, s.st
    dt = seconds / len(ran)
    for r, (loss, gn, scale, skipped) in zip(ran, _read_back(ran)):
        step = r.step
        st["train_seconds"] += dt
        st["step_times"].append(dt)
        st["samples"] += r.samples
        st["tokens"] += r.tokens
        st["skipped"] += int(skipped)
        st["mlm_empty"] += int(r.empty)
        if scale is not None:
            st["scales"].append(scale)
        if not r.empty:  # a batch without a masked token has a zero gradient by construction: not a measured norm
            st["grad_norms"].append(gn)
        # no masked token: no loss to log (an empty cell, not its zero: it would read as a perfect batch)
        row = [step + 1, None if r.empty else loss, r.lr, gn, scale, round(dt, 6), int(skipped)]
        # every skipped step gets its own row (as well as every log_every-th step), so steps.csv and
        # the loss_scale plot show each skip at its step, not only those that fall on a logged one
        if step % hp["log_every"] == 0 or step == s.total_steps - 1 or skipped:
            st["rows"].append(row)
        st["step"] = step + 1
        if r.empty:
            continue  # nothing was scored: neither a non-finite loss nor a finite one (the run of them goes on)
        if math.isfinite(loss):
            st["consecutive"] = 0
            continue
        st["nonfinite"] += 1
        st["consecutive"] += 1
        st["first_nonfinite"] = st["first_nonfinite"] or step + 1
        if st["consecutive"] >= hp["max_nonfinite"]:
            st["status"] = "diverged"
            st["status_reason"] = (f"{st['consecutive']} consecutive non-finite losses "
                                   f"(max_nonfinite={hp['max_nonfinite']}); first at step {st['first_nonfinite']}")
            if not st["rows"] or st["rows"][-1] is not row:  # the step it stopped at: the last row
                st["rows"].append(row)
            return


def _progress_bar(s: _Stage):
    """tqdm on stderr (the stage's log in the workflow): step, loss, steps/s, ETA; updated at log_every steps,
    printed at most every few seconds. hparams progress false: none."""
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    return tqdm(total=s.total_steps, initial=s.st["step"], desc=s.hp["run_id"], unit="step", file=sys.stderr,
                mininterval=0.5 if tty else PROGRESS_SECONDS, ascii=None if tty else True,
                disable=s.hp["progress"] is False)


#: the progress bar's shortest interval between two lines in a log file (not a terminal), seconds
PROGRESS_SECONDS = 5.0


# ------------------------------------------------------------------ the loop
def _switch_precision(s: _Stage, step: int) -> None:
    """At the in-stage switch point (and for a run resumed past it): the new precision's flags and scaler."""
    s.cur = s.active(step)
    s.flags = s.cur.apply_backend_flags()
    if s.cur.loss_scaling and s.scaler is None:
        s.scaler = s.cur.make_scaler(s.device.type)
    elif not s.cur.loss_scaling:
        s.scaler = None


def _reads_every_step(device: torch.device) -> bool:
    """Whether the loop reads each step's results back as the step ends: on a CPU (nothing to wait for), not on
    a GPU (a read waits for the device: they are read every log_every steps)."""
    return device.type == "cpu"


def _train_loop(s: _Stage, stop: _StopSignals) -> dict:
    """Train the steps left. Returns the loop's measurements: memory, energy, machine load.

    Time per step = wall from the end of the previous step to the end of this one (device-synchronized):
    batch collation, transfer, forward, backward, step and bookkeeping; resumable-state saves excluded.
    On a CPU every step is read back at its end. On a GPU the loop does not wait for the device each step:
    the steps' losses, norms and scales stay there and are read back together every log_every steps (and
    before a state save, at the end of the timing warm-up, at the last step), each step timed as its share
    of that window; a stage that reaches max_nonfinite is recorded up to that step, as on a CPU."""
    hp, st, device = s.hp, s.st, s.device
    measure.reset_peak_memory(device)
    m = {"rss_before": measure.current_rss(), "energy0": measure.nvml_energy_mj(device), "energy_warm": None,
         "load0": measure.load_avg_1m()}
    t_prev = last_state_t = time.perf_counter()
    bar = _progress_bar(s)
    s.cur = s.active(st["step"])  # a run resumed past its switch point starts in the switched precision
    s.flags = s.cur.apply_backend_flags()
    prefetch, ran, every_step = _Prefetch(s), [], _reads_every_step(device)
    step = st["step"]
    try:
        while step < s.total_steps and st["status"] == "ok":  # a diverged stage resumed: no more steps
            if s.active(step) is not s.cur:  # the in-stage switch point
                _switch_precision(s, step)
            batch, n_tokens, empty = prefetch.take(step)
            n_samples = int(batch["input_ids"].shape[0])
            batch = _to_device(s, batch, empty)
            nxt = step + 1
            result = train_step(
                s.model, batch, s.optimizer, s.scaler, s.cur, objective=hp["objective"], device_type=device.type,
                # a batch with no masked token runs eager: the compiled graph never sees 0 head rows
                loss_fn=forward_loss if empty else s.train_loss, max_grad_norm=hp["max_grad_norm"] or math.inf,
                watch=s.tel.step(step), cudagraphs=s.cudagraphs,
                # host work while the GPU runs the queued kernels (no sync above)
                between=(lambda: prefetch.build(nxt)) if nxt < s.total_steps else None,
            )
            ran.append(_Ran(step, result, s.scheduler.get_last_lr()[0], n_samples, n_tokens, empty))
            s.scheduler.step()
            step = nxt
            due = (hp["checkpoint_every_steps"] and step % hp["checkpoint_every_steps"] == 0) or (
                hp["checkpoint_every_minutes"] and time.perf_counter() - last_state_t >= 60 * hp["checkpoint_every_minutes"]
            )
            due = due and step < s.total_steps  # none at the last step: metrics.json follows
            if not (every_step or stop.requested or due or (step - 1) % hp["log_every"] == 0 or step == s.total_steps
                    or step == hp["timing_warmup_steps"]):
                continue  # read back later, with the rest of the log_every window
            measure.sync(device)
            now = time.perf_counter()
            _record_steps(s, ran, now - t_prev)
            t_prev, ran = now, []
            if step == hp["timing_warmup_steps"] and m["energy0"] is not None:  # synced above: read once
                m["energy_warm"] = measure.nvml_energy_mj(device)
            if (step - 1) % hp["log_every"] == 0 or st["status"] != "ok" or step == s.total_steps:
                last = next((r[1] for r in reversed(st["rows"]) if r[1] is not None), None)
                bar.set_postfix(loss=f"{last:.4g}" if last is not None else "-", refresh=False)
                bar.update(st["step"] - bar.n)
            if st["status"] != "ok":
                break
            if stop.requested or due:  # a signal may have come during the sync above
                try:
                    _save_loop_state(s)
                except OSError as e:  # atomic: the state saved before, if any, is still there
                    raise PrecswitchError(f"cannot write the resumable state {str(s.state_path)!r}: "
                                          f"{e.strerror or e}; the state saved before it, if any, is kept; free "
                                          "space and run the same command again") from None
                last_state_t = t_prev = time.perf_counter()
                if stop.requested:
                    raise stop.preempted(f"at step {st['step']}", s.state_path)
    finally:
        bar.close()
    m.update(mem=measure.peak_memory(device), energy1=measure.nvml_energy_mj(device), load1=measure.load_avg_1m())
    return m


# ------------------------------------------------------------------ evaluation and checkpoint
def _evaluate_stage(s: _Stage) -> dict:
    """Evaluate the trained model (in eval_precision: the precision the stage ended in, or another, on a copy);
    a non-finite or blown-up result marks the stage diverged. Returns the eval metrics with eval_seconds."""
    hp, st = s.hp, s.st
    t_eval = time.perf_counter()
    measure.sync(s.device)
    if hp["eval_precision"] == "same":
        s.eval_prec = s.cur  # the precision the stage ended in
    s.eval_prec.apply_backend_flags()
    eval_model = s.model
    if s.eval_prec.param_dtype != s.prec.param_dtype or s.eval_prec.fp8_linear != s.prec.fp8_linear:
        eval_model = s.eval_prec.prepare_model(copy.deepcopy(s.model))
    ev = evaluate(eval_model, s.eval_batches, hp["objective"], s.eval_prec, s.device, s.meta)
    measure.sync(s.device)
    eval_seconds = time.perf_counter() - t_eval
    del eval_model
    if st["status"] == "ok" and ev.get("eval_note"):
        st["status"] = "diverged"
        st["status_reason"] = f"final model is not finite: {ev['eval_note']}"
    if st["status"] == "ok":
        reason = blown_up(st["nonfinite"], st["step"] - st["mlm_empty"], ev.get("eval_loss"), hp["objective"],
                          int(s.model.config.vocab_size), hp["max_nonfinite_fraction"])
        if reason:
            st["status"], st["status_reason"] = "diverged", reason
    return {**ev, "eval_seconds": eval_seconds}


def _save_checkpoint(s: _Stage) -> None:
    """checkpoint/: the weights in the stage's storage dtype, the tokenizer and the stage file (precswitch_stage.json)
    the next stage reads; written atomically. Nothing where hparams save_checkpoint is false."""
    hp = s.hp
    if not hp["save_checkpoint"]:
        return
    with atomic_path(s.out / "checkpoint") as tmp:
        s.model.save_pretrained(tmp)
        s.tokenizer.save_pretrained(tmp)
        atomic_write_json(
            tmp / STAGE_FILE,
            {"run_id": hp["run_id"], "precision": s.prec.name, "objective": hp["objective"],
             "dtype": P.dtype_name(s.prec.param_dtype), "status": s.st["status"], "config_hash": s.chash,
             **s.model_pin},
        )


# ------------------------------------------------------------------ records
def _write_records(s: _Stage, loop: dict, ev: dict, checkpoint_seconds: float) -> dict:
    """steps.csv, activations.csv (telemetry on), metrics.json; then the resumable state, no longer needed, goes."""
    buf = io.StringIO()
    wr = csv.writer(buf)
    wr.writerow(STEP_FIELDS)
    wr.writerows(s.st["rows"])
    atomic_write_text(s.out / "steps.csv", buf.getvalue())
    if s.tel.enabled:
        s.tel.write_csv(s.out / "activations.csv")
    prov = {**measure.provenance(s.device), **gpu.claim_info()}
    eval_seconds = ev.pop("eval_seconds")
    metrics = {
        **s.base,
        **_origin_metrics(s),
        **_precision_metrics(s),
        **_timing_metrics(s, eval_seconds, checkpoint_seconds),
        **_resource_metrics(s, loop),
        **_numerics_metrics(s),
        "eval_precision": s.eval_prec.name,
        "activation_telemetry": s.tel.summary() if s.tel.enabled else None,
        **ev,
        **prov,
        "threads": s.hp["threads"],
        "compile": s.hp["compile"],
        "load_avg_1m_start": loop["load0"],  # machine load around the timed loop: above cpu_count, clocks stretch
        "load_avg_1m_end": loop["load1"],
        **s.flags,
        "resumed": s.resumed,
        "attempts": s.st["attempts"],
        "hparams": s.hp,
        "finished_at": measure.now_iso(),
    }
    atomic_write_json(s.out / "metrics.json", metrics)
    if s.state_path.is_file():
        s.state_path.unlink()
        resume_dir = s.state_path.parent
        (resume_dir / STATE_SECONDS).unlink(missing_ok=True)
        try:
            resume_dir.rmdir()
        except OSError:
            pass
    return metrics


def _origin_metrics(s: _Stage) -> dict:
    """The stage's status and where its weights and data come from."""
    return {
        "status": s.st["status"],
        "status_reason": s.st["status_reason"],
        "init": s.init,
        "init_run_id": s.init_info.get("run_id"),
        "init_precision": s.init_info.get("precision"),
        "init_status": s.init_info.get("status"),
        **s.model_pin,  # model_revision, model_commit: the pinned hub revision of the pretrained weights
        "data_revision": (s.meta.get("source") or {}).get("revision"),
        "data_commit": s.meta.get("source_commit"),
        # rows of the source dropped for an empty text or label cell by `precswitch prepare` (the verdict says it)
        "train_rows_dropped": s.meta.get("train_rows_dropped"),
        "train_rows_read": s.meta.get("train_rows_read"),
    }


def _precision_metrics(s: _Stage) -> dict:
    prec, saved = s.prec, s.hp["save_checkpoint"]
    return {
        "switch_to": s.prec2.name if s.prec2 else None,
        "switch_at": s.hp["switch_at"] if s.prec2 else None,
        "switch_step": s.switch_step,
        "precision_final": s.cur.name,
        "update_compensation": prec.update_compensation,
        "param_dtype": P.dtype_name(prec.param_dtype),
        "autocast_dtype": P.dtype_name(prec.autocast_dtype) if prec.autocast_dtype else None,
        "checkpoint_dtype_written": P.dtype_name(prec.param_dtype) if saved else None,
        "checkpoint_dtype_read": s.ckpt_dtype_read,
    }


def _timing_metrics(s: _Stage, eval_seconds: float, checkpoint_seconds: float) -> dict:
    """Seconds by phase, work done, and the steady-state rates: the steps after timing_warmup_steps (all of them
    where the stage ran no more than that, e.g. resumed past the warm-up)."""
    hp, st = s.hp, s.st
    times = st["step_times"]
    w = hp["timing_warmup_steps"] if len(times) > hp["timing_warmup_steps"] else 0
    steady = times[w:]
    steady_s = sum(steady)
    steady_steps = len(steady)
    tokens_per_step = st["tokens"] / max(len(times), 1)
    return {
        "train_seconds": st["train_seconds"],
        "eval_seconds": eval_seconds,
        "setup_seconds": s.setup_seconds,
        "checkpoint_seconds": checkpoint_seconds,
        "state_saves": st["state_saves"],
        "state_save_seconds": st["state_seconds"],
        "steps_planned": s.total_steps,
        "steps_completed": st["step"],
        "batch_size": hp["batch_size"],
        "model_parameters": sum(p.numel() for p in s.model.parameters()),
        "samples_seen": st["samples"],
        "tokens_seen": st["tokens"],
        "timing_warmup_steps": w,
        # the stage was too short to leave the warm-up out of its rates (the verdict's caveats say so)
        "timing_warmup_short": s.total_steps <= hp["timing_warmup_steps"],
        "steps_per_second": steady_steps / steady_s if steady_s > 0 else None,
        "samples_per_second": steady_steps * hp["batch_size"] / steady_s if steady_s > 0 else None,
        "tokens_per_second": steady_steps * tokens_per_step / steady_s if steady_s > 0 else None,
        "step_seconds_median": statistics.median(steady) if steady else None,
        "step_seconds_p90": float(np.percentile(steady, 90)) if steady else None,
    }


def _resource_metrics(s: _Stage, loop: dict) -> dict:
    """Peak memory and energy (NVML; None on a CPU): all steps, and the steady ones after timing_warmup_steps."""
    e0, e_warm, e1 = loop["energy0"], loop["energy_warm"], loop["energy1"]
    w = s.hp["timing_warmup_steps"] if len(s.st["step_times"]) > s.hp["timing_warmup_steps"] else 0
    steady = None
    if e1 is not None and e0 is not None:
        if not w:
            steady = (e1 - e0) / 1000
        elif e_warm is not None:
            steady = (e1 - e_warm) / 1000
    return {
        **loop["mem"],
        "memory_baseline_bytes": loop["rss_before"] if s.device.type == "cpu" else None,
        "energy_joules": (e1 - e0) / 1000 if e0 is not None and e1 is not None else None,
        # the steps after timing_warmup_steps, the steady-state rates' steps (None if resumed past the warm-up)
        "energy_joules_steady": steady,
    }


def _numerics_metrics(s: _Stage) -> dict:
    """Loss scale, skipped and non-finite steps, the last logged loss, gradient-norm statistics."""
    st = s.st
    scales = st["scales"]
    # every step's norm (not only the steps.csv rows: with log_every 10, a tenth of them), empty batches left out
    gns = [g for g in st["grad_norms"] if math.isfinite(g)]
    return {
        "loss_scale_start": scales[0] if scales else None,
        "loss_scale_end": scales[-1] if scales else None,
        "loss_scale_min": min(scales) if scales else None,
        "skipped_steps": st["skipped"],
        "nonfinite_losses": st["nonfinite"],
        "first_nonfinite_step": st["first_nonfinite"],
        # masked-LM training batches without a masked token: zero loss and gradient, an empty loss in steps.csv
        "mlm_empty_batches": st["mlm_empty"] if s.hp["objective"] == "mlm" else None,
        "final_train_loss": next((r[1] for r in reversed(st["rows"]) if r[1] is not None), None),
        "grad_norm": {
            "mean": statistics.fmean(gns) if gns else None,
            "median": statistics.median(gns) if gns else None,
            "p90": float(np.percentile(gns, 90)) if gns else None,
            "max": max(gns) if gns else None,
            "nonfinite": len(st["grad_norms"]) - len(gns),
        },
    }


__all__ = ["run_stage", "evaluate", "build_optimizer", "train_step", "StepResult", "Preempted", "EXIT_PREEMPTED",
           "STAGE_FILE"]
