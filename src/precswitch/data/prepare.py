"""Tokenize a data source into a ``datasets.DatasetDict`` (``train``/``eval``, and ``test`` when a classification
source has one: docs/data.md) plus ``meta.json``.

* classify: one row per example, ``tokenizer(text_a[, text_b], truncation=True, max_length=L)``; no padding
  (the training loop pads each batch dynamically); ``labels`` int64 class index.
* mlm, source key ``mlm_examples``:
  - ``pairs`` (default for kind ``synthetic``): lines ``2k`` and ``2k+1`` form one example, encoded as a
    BERT sentence pair ``[CLS] a [SEP] b [SEP]`` (token types 0/1, truncated longest-first to ``L``; the
    loop pads each batch) -- the same layout as the paraphrase pairs of stage 2. Sentences start at fixed
    positions, so a tiny model learns the grammar and word classes within a few hundred steps (packed,
    the same corpus stayed at a unigram-level loss for 1000 steps).
  - ``lines``: one example per line, ``[CLS] line [SEP]`` truncated to ``L``.
  - ``pack`` (default otherwise, e.g. WikiText paragraphs): texts are tokenized without special tokens,
    concatenated in order and cut into blocks of ``L - 2`` tokens, each written as ``[CLS] block [SEP]``
    (as in BERT pre-training: no padding, nothing truncated away). Packing runs per group of
    ``PACK_GROUP`` lines; the tail of a group shorter than a block is dropped, unless a split would
    otherwise have no block at all (then its one short block is kept).
  Masking happens in the training loop.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from ..errors import PrecswitchError

PACK_GROUP = 5000
OBJECTIVES = ("mlm", "classify")


def _pack(ds, tokenizer, max_length: int):
    block = max_length - 2
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id

    def tok(batch):
        return {"ids": tokenizer(batch["text"], add_special_tokens=False)["input_ids"]}

    ids = ds.map(tok, batched=True, remove_columns=ds.column_names, keep_in_memory=True)

    def group(batch, keep_tail: bool):
        flat = [t for seq in batch["ids"] for t in seq]
        n = len(flat) // block * block
        chunks = [flat[i : i + block] for i in range(0, n, block)]
        if keep_tail and not chunks and flat:
            chunks = [flat[:block]]
        inp = [[cls_id] + c + [sep_id] for c in chunks]
        return {
            "input_ids": inp,
            "attention_mask": [[1] * len(x) for x in inp],
            "token_type_ids": [[0] * len(x) for x in inp],
        }

    out = ids.map(lambda b: group(b, False), batched=True, batch_size=PACK_GROUP, remove_columns=["ids"],
                  keep_in_memory=True)
    if len(out) == 0:
        out = ids.map(lambda b: group(b, True), batched=True, batch_size=len(ids) or 1, remove_columns=["ids"],
                      keep_in_memory=True)
    return out


def _lines(ds, tokenizer, max_length: int):
    def enc(batch):
        e = tokenizer(batch["text"], truncation=True, max_length=max_length, return_token_type_ids=True)
        return {"input_ids": e["input_ids"], "attention_mask": e["attention_mask"],
                "token_type_ids": e["token_type_ids"]}

    return ds.map(enc, batched=True, remove_columns=ds.column_names, keep_in_memory=True)


def _line_pairs(ds, tokenizer, max_length: int):
    def enc(batch):
        t = batch["text"]
        a, b = t[0::2], t[1::2]
        e1 = tokenizer(a[: len(b)], b, truncation=True, max_length=max_length, return_token_type_ids=True)
        ids, am, tt = list(e1["input_ids"]), list(e1["attention_mask"]), list(e1["token_type_ids"])
        if len(a) > len(b):  # an odd line at the end: a single segment
            e2 = tokenizer(a[-1:], truncation=True, max_length=max_length, return_token_type_ids=True)
            ids += e2["input_ids"]
            am += e2["attention_mask"]
            tt += e2["token_type_ids"]
        return {"input_ids": ids, "attention_mask": am, "token_type_ids": tt}

    return ds.map(enc, batched=True, batch_size=PACK_GROUP, remove_columns=ds.column_names, keep_in_memory=True)


def mlm_examples(spec: dict) -> str:
    return spec.get("mlm_examples") or ("pairs" if spec["kind"] == "synthetic" else "pack")


def _encode_pairs(ds, tokenizer, max_length: int):
    import datasets

    pair = "text_b" in ds.column_names

    def enc(batch):
        a = [str(t) for t in batch["text_a"]]
        b = [str(t) for t in batch["text_b"]] if pair else None
        e = tokenizer(a, b, truncation=True, max_length=max_length, return_token_type_ids=True)
        return {"input_ids": e["input_ids"], "attention_mask": e["attention_mask"],
                "token_type_ids": e["token_type_ids"], "labels": batch["label"]}

    out = ds.map(enc, batched=True, remove_columns=ds.column_names, keep_in_memory=True)
    return out.cast_column("labels", datasets.Value("int64"))


def _untruncated_lengths(ds, tokenizer) -> list[int]:
    """Each example's length in tokens without truncation (special tokens included)."""
    pair = "text_b" in ds.column_names

    def enc(batch):
        a = [str(t) for t in batch["text_a"]]
        b = [str(t) for t in batch["text_b"]] if pair else None
        return {"n": [len(x) for x in tokenizer(a, b, truncation=False, verbose=False)["input_ids"]]}

    return ds.map(enc, batched=True, remove_columns=ds.column_names, keep_in_memory=True)["n"]


def _source_commit(spec: dict) -> str | None:
    """The commit a hub source's revision resolved to (from the local hub cache; None if unknown)."""
    if spec.get("kind") != "hub":
        return None
    from ..fetch import hub_commit

    return hub_commit(spec["name"], spec.get("revision"), repo_type="dataset")


def _split_meta(src) -> dict:
    """How the splits were made: the held-out tail of an MLM source without eval files (requested
    eval_fraction, the cap, the lines held out; None for sources with eval files) and the rows dropped for an
    empty text or label cell (counted before max_train_rows / max_eval_rows)."""
    h = src.held_out or {}
    return {
        "eval_fraction": h.get("eval_fraction"),
        "eval_lines_cap": h.get("eval_lines_cap"),
        "eval_lines": h.get("eval_lines"),
        "eval_fraction_effective": h.get("eval_fraction_effective"),
        "eval_capped": h.get("capped"),
        "train_rows_dropped": src.dropped.get("train", (None,))[0],
        "eval_rows_dropped": src.dropped.get("eval", (None,))[0],
        "test_rows_dropped": src.dropped.get("test", (None,))[0],
        "train_rows_read": src.dropped.get("train", (None, None))[1],
    }


def prepare(source: dict | str, tokenizer_dir: str | Path, objective: str, max_length: int,
            out: str | Path) -> dict:
    """Load, tokenize, save ``out`` (DatasetDict + meta.json) atomically; return the meta dict."""
    import datasets

    from ..io import atomic_path, atomic_write_json
    from .loading import check_source_files, load_source, parse_source, source_hash
    from .tokenizer import load_tokenizer

    if objective not in OBJECTIVES:
        raise PrecswitchError(f"--objective {objective!r} not allowed (allowed: {', '.join(OBJECTIVES)})")
    spec = parse_source(source)
    check_source_files(spec, objective)  # fail fast, before loading the tokenizer
    tokenizer = load_tokenizer(tokenizer_dir)
    if not isinstance(max_length, int) or max_length < 8:
        raise PrecswitchError(f"--max-length must be an integer >= 8, got {max_length!r}")
    mml = tokenizer.model_max_length
    if mml and max_length > mml:
        raise PrecswitchError(f"--max-length {max_length} exceeds the tokenizer's model_max_length {mml} "
                              f"({tokenizer_dir}); allowed: <= {mml}")
    src = load_source(spec, objective)
    for note in src.notes():  # the eval cap applied, rows dropped: in the job's log, not only in meta.json
        print(f"precswitch: {note}", file=sys.stderr, flush=True)
    if objective == "mlm":
        fn = {"pairs": _line_pairs, "lines": _lines, "pack": _pack}[mlm_examples(spec)]
        train, eval_ = fn(src.train, tokenizer, max_length), fn(src.eval, tokenizer, max_length)
    else:
        train, eval_ = (_encode_pairs(src.train, tokenizer, max_length),
                        _encode_pairs(src.eval, tokenizer, max_length))
    splits = {"train": train, "eval": eval_}
    if src.test is not None:
        splits["test"] = _encode_pairs(src.test, tokenizer, max_length)
    for name, ds in splits.items():
        if len(ds) == 0:
            raise PrecswitchError(f"prepare: {name} split has no examples after tokenization")
    meta: dict = {"objective": objective}
    if objective == "classify":
        counts = {name: Counter(ds["labels"]) for name, ds in splits.items()}

        def label_counts(name):
            return {str(src.label_values[k]): v for k, v in sorted(counts[name].items())} if name in counts else None

        def majority(name):
            return max(counts[name].values()) / len(splits[name]) if name in counts else None

        meta.update(
            num_labels=len(src.label_values),
            label_values=src.label_values,
            majority_accuracy=majority("eval"),
            test_majority_accuracy=majority("test"),
            train_label_counts=label_counts("train"),
            eval_label_counts=label_counts("eval"),
            test_label_counts=label_counts("test"),
        )
    else:
        meta.update(num_labels=None, label_values=None, majority_accuracy=None, test_majority_accuracy=None)
    lengths = [len(x) for x in train["input_ids"]]
    meta.update(
        n_train=len(train),
        n_eval=len(eval_),
        n_test=len(splits["test"]) if "test" in splits else None,
        max_length=max_length,
        train_tokens=sum(lengths),
        mean_train_length=sum(lengths) / len(lengths),
        # examples that lost tokens (one exactly max_length tokens long lost none)
        truncated_train=(sum(1 for n in _untruncated_lengths(src.train, tokenizer) if n > max_length)
                         if objective == "classify" else None),
        tokenizer=str(tokenizer_dir),
        vocab_size=len(tokenizer),
        source=spec,
        source_hash=source_hash(spec, objective),
        source_commit=_source_commit(spec),
        mlm_examples=(mlm_examples(spec) if objective == "mlm" else None),
        **_split_meta(src),
        datasets_version=datasets.__version__,
    )
    dd = datasets.DatasetDict(splits)
    out = Path(out)
    with atomic_path(out) as tmp:
        dd.save_to_disk(str(tmp))
        atomic_write_json(tmp / "meta.json", meta)
    return meta
