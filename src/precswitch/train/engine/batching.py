"""Batches: deterministic per (seed, step), built on the host, the next one while the device runs this one."""

from __future__ import annotations

import numpy as np
import torch

from ... import flops

#: batch keys of the masked-LM rows selected on the host (mlm_head_rows); not model inputs
HEAD_KEYS = ("head_rows", "head_labels")
#: a compiled classification stage pads its training batches to a multiple of this many tokens
COMPILED_PAD_MULTIPLE = 32


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
        self.ds, self.batch_size, self.seed, self.collate = ds, batch_size, seed, collate
        self.rows = len(ds)
        self.per_epoch = self.rows // batch_size
        self._epoch, self._order = -1, None

    def get(self, step: int) -> dict:
        epoch, pos = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order, self._epoch = torch.randperm(self.rows, generator=g).tolist(), epoch
        feats = features(self.ds, self._order[pos * self.batch_size : (pos + 1) * self.batch_size])
        # Only the CPU generator the collator draws from: torch.manual_seed would also reseed every CUDA
        # generator (and fork_rng(devices=[]) would not restore them), making GPU dropout f(seed, step).
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(step_seed(self.seed, step))
            return self.collate(feats)


def eval_batches(rows, collate, batch_size: int, seed: int) -> list[dict]:
    """Eval batches built once under a fixed RNG: every run is scored on the same MLM masks."""
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)  # CPU only, as in Batches.get
        return [collate(features(rows, range(i, min(i + batch_size, len(rows)))))
                for i in range(0, len(rows), batch_size)]


def model_columns(ds, objective: str):
    cols = ["input_ids", "attention_mask", "token_type_ids"] + (["labels"] if objective == "classify" else [])
    return ds.select_columns([c for c in cols if c in ds.column_names])


def features(ds, idx) -> list[dict]:
    cols = ds[idx]
    return [dict(zip(cols, vals)) for vals in zip(*cols.values())]


class _PadAfterMasking:
    """Pad a masked-LM batch to a multiple of ``multiple`` AFTER masking: the masks are drawn on the
    unpadded shape, so they are the ones every other precision of the seed draws (masking a wider
    tensor draws other random numbers for every token). The added columns are padding: pad id,
    attention 0, token type 0, label -100."""

    def __init__(self, collate, multiple: int, pad_id: int):
        self.collate, self.multiple, self.pad_id = collate, multiple, pad_id

    def __call__(self, feats):
        batch = self.collate(feats)
        extra = -batch["input_ids"].shape[1] % self.multiple
        if extra:
            fill = {"input_ids": self.pad_id, "labels": -100}
            for k, v in batch.items():
                if isinstance(v, torch.Tensor) and v.dim() == 2:
                    batch[k] = torch.nn.functional.pad(v, (0, extra), value=fill.get(k, 0))
        return batch


def make_collator(objective: str, tokenizer, mlm_probability: float, pad_to_multiple_of: int | None = None):
    """``pad_to_multiple_of``: fp8 stages pad every batch's length to a multiple of 16, because fp8
    matmuls (torch._scaled_mm) need every dimension, the tokens of the weight gradient included, divisible by 16.
    Masked LM pads after masking (:class:`_PadAfterMasking`), so an fp8 stage masks the same tokens."""
    from transformers import DataCollatorForLanguageModeling, DataCollatorWithPadding

    if objective == "mlm":
        mlm = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=mlm_probability)
        return _PadAfterMasking(mlm, pad_to_multiple_of, tokenizer.pad_token_id) if pad_to_multiple_of else mlm
    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad_to_multiple_of)


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


class HostBatch:
    """One training step's batch on the host: the tensors, their token count (counted before a full mask is
    dropped), and whether it is a masked-LM batch without a masked token (nothing to score: a zero loss)."""

    def __init__(self, batches: Batches, objective: str, compiled: bool, step: int):
        batch = batches.get(step)
        self.empty = False
        if objective == "mlm":
            batch.update(zip(HEAD_KEYS, mlm_head_rows(batch["labels"])))
            self.empty = batch["head_rows"].numel() == 0
        self.tokens = int(batch["attention_mask"].sum())
        self.samples = int(batch["input_ids"].shape[0])
        # compiled: the batch keeps one set of keys (a dropped mask is another graph); the compiled forward
        # has no mask check to sync on anyway
        self.batch, self.compiled = (batch if compiled else drop_full_attention_mask(batch)), compiled

    def to(self, device: torch.device) -> dict:
        batch = {k: v.to(device, non_blocking=True) for k, v in self.batch.items()}
        if self.compiled and not self.empty:
            for k in HEAD_KEYS:  # the masked-row count varies by batch: one dynamic graph, not a recompile
                if k in batch:
                    torch._dynamo.mark_dynamic(batch[k], 0)
        return batch


class Prefetch:
    """The next step's host batch, built while the device runs this step's forward and backward."""

    def __init__(self, batches: Batches, objective: str, compiled: bool):
        self.make = lambda step: HostBatch(batches, objective, compiled, step)
        self.pending: tuple[int, HostBatch] | None = None

    def build(self, step: int) -> None:
        self.pending = (step, self.make(step))

    def take(self, step: int) -> HostBatch:
        got, self.pending = self.pending, None
        return got[1] if got is not None and got[0] == step else self.make(step)
