"""Tiny prepared datasets + tokenizer for engine tests, built directly per docs/contracts.md."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = "the a red blue old young fox dog cat bird chased saw liked met quickly slowly near far".split()


def _sentences(n: int, seed: int) -> list[str]:
    r = random.Random(seed)
    return [" ".join(r.choice(WORDS) for _ in range(r.randint(4, 9))) for _ in range(n)]


def make_tokenizer(out: Path, max_length: int = 32):
    """The product's WordPiece tokenizer (vocabulary 60) on the fixture's sentences: the same ids in every process
    (tokenizers' own trainer breaks ties in hash-map order, so the engine tests' data changed from run to run)."""
    from precswitch.data.tokenizer import train_wordpiece, wrap_fast

    fast = wrap_fast(train_wordpiece(_sentences(200, 0), 60), max_length)
    fast.save_pretrained(out)
    return fast


def make_prepared(root: Path, objective: str, n_train: int = 96, n_eval: int = 40, max_length: int = 32,
                  packed: bool = False, n_test: int = 0) -> Path:
    """Write tokenizer + prepared dataset under root; return the dataset dir. packed (mlm): the
    sentences' tokens concatenated into full max_length blocks, no padding (as the GPU configs'
    WikiText is prepared); else one padded sentence per row. n_test: a held-out ``test`` split of that many rows."""
    from datasets import Dataset, DatasetDict

    tok_dir = root / "tokenizer"
    tok = make_tokenizer(tok_dir, max_length) if not tok_dir.exists() else None
    if tok is None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(tok_dir)
    splits = {}
    for split, n, seed in (("train", n_train, 1), ("eval", n_eval, 2), ("test", n_test, 3))[:3 if n_test else 2]:
        a = _sentences(n, seed)
        if objective == "mlm" and packed:
            ids = [t for x in tok(a * 4, add_special_tokens=False)["input_ids"] for t in x]
            blocks = [ids[i:i + max_length] for i in range(0, len(ids) - max_length + 1, max_length)][:n]
            splits[split] = Dataset.from_dict({"input_ids": blocks, "attention_mask": [[1] * max_length for _ in blocks],
                                               "token_type_ids": [[0] * max_length for _ in blocks]})
        elif objective == "mlm":
            enc = tok(a, truncation=True, max_length=max_length, padding="max_length")
            splits[split] = Dataset.from_dict(dict(enc))
        else:
            r = random.Random(seed + 10)
            labels = [r.randint(0, 1) for _ in range(n)]
            # label 1: second sentence repeats the first (learnable)
            b = [x if y else s for x, y, s in zip(a, labels, _sentences(n, seed + 20))]
            enc = tok(a, b, truncation=True, max_length=max_length)
            splits[split] = Dataset.from_dict({**dict(enc), "labels": labels})
    out = root / f"prepared-{objective}{'-packed' if packed else ''}{'-test' if n_test else ''}"
    DatasetDict(splits).save_to_disk(str(out))
    meta = {"objective": objective, "n_train": n_train, "n_eval": n_eval, "max_length": max_length,
            "tokenizer": str(tok_dir), "source": {"kind": "test"}}
    if objective == "classify":
        ev = splits["eval"]["labels"]
        meta.update(num_labels=2, label_values=[0, 1], majority_accuracy=max(ev.count(0), ev.count(1)) / len(ev))
        if n_test:
            te = splits["test"]["labels"]
            meta["test_majority_accuracy"] = max(te.count(0), te.count(1)) / len(te)
    (out / "meta.json").write_text(json.dumps(meta))
    return out


#: the tiny BERT the engine tests train (with the data of make_prepared)
TINY = {"max_position_embeddings": 64, "hidden_size": 32, "intermediate_size": 64}


def prepared_both(tmp_path_factory) -> dict:
    """Prepared masked-LM and classification data, for a module-scoped ``data`` fixture."""
    root = tmp_path_factory.mktemp("data")
    return {"mlm": make_prepared(root, "mlm"), "classify": make_prepared(root, "classify")}


def tiny_bert_mlm():
    """A seeded 2-layer BertForMaskedLM (vocab 97, hidden 32) without dropout: the engine tests' direct model."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    return BertForMaskedLM(BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0))


def mlm_batch(n_masked: int, seed: int = 0) -> dict:
    """A 4 x 24 masked-LM batch for :func:`tiny_bert_mlm` with ``n_masked`` labelled (masked) positions."""
    import torch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 97, (4, 24), generator=g)
    labels = torch.full_like(ids, -100)
    pos = torch.randperm(ids.numel(), generator=g)[:n_masked]
    labels.view(-1)[pos] = ids.view(-1)[pos]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids),
            "labels": labels}


def steps_rows(out: Path) -> list[dict]:
    """A stage run's steps.csv as dicts (strings, as csv reads them)."""
    import csv

    with open(out / "steps.csv", newline="") as f:
        return list(csv.DictReader(f))


def preempted_then_resumed(monkeypatch, hp: dict, out: Path, during_step: int) -> dict:
    """Run a stage into ``out`` that gets SIGTERM during step ``during_step`` (at that step's clock sync; the
    engine saves its resumable state and raises Preempted), then run it again there; return the resumed
    stage's metrics."""
    import os
    import signal

    import pytest

    from precswitch import measure
    from precswitch.train import engine

    real_sync, calls = measure.sync, []

    def sync_then_sigterm(device):
        real_sync(device)
        calls.append(1)
        if len(calls) == during_step:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(measure, "sync", sync_then_sigterm)
    with pytest.raises(engine.Preempted):
        engine.run_stage(hp, out)
    monkeypatch.setattr(measure, "sync", real_sync)
    return engine.run_stage(hp, out)
