"""Data sources: real GLUE/WikiText files from ../shared/data, and CSV/JSONL/parquet written here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from precswitch.data.loading import HEADING_RE, load_source, parse_source, source_hash, source_texts
from precswitch.errors import PrecswitchError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
MRPC = SHARED / "glue" / "MRPC"
WIKI = SHARED / "wikitext-2-raw"
needs_shared = pytest.mark.skipif(not MRPC.is_dir(), reason="../shared/data (real GLUE/WikiText files) not present")
MRPC_COLS = {"text_a": "#1 String", "text_b": "#2 String", "label": "Quality"}


@needs_shared
def test_glue_mrpc_tsv_rows_and_labels():
    src = load_source({"kind": "tsv", "train": str(MRPC / "train.tsv"), "eval": str(MRPC / "dev.tsv"),
                       "columns": MRPC_COLS}, "classify")
    assert len(src.train) == 3668 and len(src.eval) == 408
    assert src.label_values == [0, 1]
    assert src.train["label"].count(1) == 2474 and src.train["label"].count(0) == 1194
    assert src.eval["label"].count(1) == 279 and src.eval["label"].count(0) == 129
    assert src.train.column_names == ["text_a", "text_b", "label"]
    # QUOTE_NONE: quotes stay in the text, rows are not merged
    assert any('"' in t for t in src.train["text_a"])
    assert src.train[0]["text_a"].startswith("Amrozi accused his brother")


@needs_shared
def test_a_stray_label_or_a_wrong_label_column_is_refused_when_labels_are_read_from_the_data(tmp_path):
    """One row of MRPC with label 'x' silently made a 3-class task (F1 turned macro); mapping label to the
    '#1 ID' column made ~4,000 classes. Read from the data (labels not given), both are refused; listing
    labels is the way to state the classes."""
    lines = (MRPC / "train.tsv").read_text(encoding="utf-8-sig").splitlines()
    lines[5] = "x" + lines[5][1:]
    train = tmp_path / "train.tsv"
    train.write_text("\n".join(lines) + "\n", encoding="utf-8")
    spec = {"kind": "tsv", "train": str(train), "eval": str(MRPC / "dev.tsv"), "columns": MRPC_COLS}
    with pytest.raises(PrecswitchError, match=r"train.tsv: label value\(s\) 'x' \(1 row\) of 3668 rows: a typo\? "
                                              r".*list them in labels \(e.g. \['0', '1'\]\)"):
        load_source(spec, "classify")
    with pytest.raises(PrecswitchError, match=r"label value\(s\) \['x'\] not in the allowed labels \[0, 1\]"):
        load_source({**spec, "labels": [0, 1]}, "classify")  # stated classes: the stray row is named
    with pytest.raises(PrecswitchError, match=r"the label column has \d{4} distinct values .*is it the label column"):
        load_source({**spec, "train": str(MRPC / "train.tsv"), "columns": {**MRPC_COLS, "label": "#1 ID"}},
                    "classify")


@needs_shared
def test_glue_labels_order_and_not_allowed_labels():
    spec = {"kind": "tsv", "train": str(MRPC / "train.tsv"), "eval": str(MRPC / "dev.tsv"), "columns": MRPC_COLS}
    src = load_source({**spec, "labels": [1, 0], "max_train_rows": 50, "max_eval_rows": 10}, "classify")
    assert src.label_values == [1, 0] and len(src.train) == 50 and len(src.eval) == 10
    assert src.train[0]["label"] == 0  # raw label 1 is class index 0 now
    with pytest.raises(PrecswitchError, match=r"label value\(s\) \[.0.\] not in the allowed labels \[1, 2\]"):
        load_source({**spec, "labels": [1, 2]}, "classify")
    with pytest.raises(PrecswitchError, match=r"allowed labels \[True, False\]; YAML reads unquoted yes/no"):
        load_source({**spec, "labels": [True, False]}, "classify")
    # a listed class no training row has (labels: [0, 1, 2] on MRPC) made a 3-way classifier and turned F1 into
    # a macro F1, silently
    with pytest.raises(PrecswitchError, match=r"train.tsv: labels lists \[2\], which no training row has "
                                              r"\(the training rows have \[0, 1\]\)"):
        load_source({**spec, "labels": [0, 1, 2]}, "classify")


@needs_shared
def test_wikitext_lines_headings_dropped():
    f = WIKI / "wiki.valid.raw"
    src = load_source({"kind": "text", "train": [str(f)], "eval": [str(WIKI / "wiki.test.raw")]}, "mlm")
    raw = f.read_text(encoding="utf-8").splitlines()
    expect = [ln.strip() for ln in raw if ln.strip() and not HEADING_RE.match(ln)]
    assert len(raw) > len(expect) > 1000
    assert src.train["text"] == expect
    assert not any(t.startswith("= ") for t in src.train["text"])
    headings = [ln for ln in raw if ln.strip().startswith("= ")]
    assert headings and all(HEADING_RE.match(h) for h in headings)
    assert len(src.eval) > 1000
    # without eval files the tail of train is held out
    auto = load_source({"kind": "text", "train": str(f)}, "mlm")
    assert len(auto.train) + len(auto.eval) == len(expect) and auto.eval["text"][-1] == expect[-1]


def _tables(tmp_path):
    import pandas as pd

    tr = pd.DataFrame({"s1": ["a cat sat", "a dog ran", "it rains", "  "], "s2": ["x", "y", "z", "w"],
                       "y": ["pos", "neg", "pos", "neg"]})
    ev = pd.DataFrame({"s1": ["the sun", "the moon"], "s2": ["u", "v"], "y": ["neg", "pos"]})
    files = {}
    for kind, ext in (("csv", "csv"), ("jsonl", "jsonl"), ("parquet", "parquet")):
        for split, df in (("train", tr), ("eval", ev)):
            p = tmp_path / f"{split}.{ext}"
            if kind == "csv":
                df.to_csv(p, index=False)
            elif kind == "jsonl":
                df.to_json(p, orient="records", lines=True)
            else:
                df.to_parquet(p, index=False)
            files[(kind, split)] = p
    return files


@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
def test_tables_with_column_mapping(tmp_path, kind):
    files = _tables(tmp_path)
    spec = {"kind": kind, "train": str(files[(kind, "train")]), "eval": str(files[(kind, "eval")]),
            "columns": {"text_a": "s1", "text_b": "s2", "label": "y"}}
    src = load_source(spec, "classify")
    assert len(src.train) == 3  # the blank text_a row is dropped
    assert src.label_values == ["neg", "pos"]
    assert src.train["label"] == [1, 0, 1] and src.eval["label"] == [0, 1]
    single = load_source({**spec, "columns": {"text_a": "s1", "text_b": None, "label": "y"},
                          "labels": ["pos", "neg"]}, "classify")
    assert single.train.column_names == ["text_a", "label"] and single.train["label"] == [0, 1, 0]
    mlm = load_source({**spec, "text_column": "s1"}, "mlm")
    assert mlm.train["text"] == ["a cat sat", "a dog ran", "it rains"]
    with pytest.raises(PrecswitchError, match=r"column\(s\) not found: label='quality'; columns found: \['s1', 's2', 'y'\]"):
        load_source({**spec, "columns": {"text_a": "s1", "label": "quality"}}, "classify")


def test_errors_name_what_is_wrong(tmp_path):
    with pytest.raises(PrecswitchError, match=r"unknown kind 'xml' \(allowed: synthetic, text, tsv"):
        load_source({"kind": "xml", "train": "a"}, "classify")
    with pytest.raises(PrecswitchError, match="file not found: .*nope.csv"):
        load_source({"kind": "csv", "train": str(tmp_path / "nope.csv"), "eval": str(tmp_path / "nope.csv"),
                     "columns": {"text_a": "a", "label": "b"}}, "classify")
    with pytest.raises(PrecswitchError, match="key 'eval' is required"):
        load_source({"kind": "csv", "train": "x.csv"}, "classify")
    with pytest.raises(PrecswitchError, match=r"unknown key\(s\) \['colums'\]"):
        load_source({"kind": "csv", "train": "x", "eval": "y", "colums": {}}, "classify")
    with pytest.raises(PrecswitchError, match="synthetic dir not found"):
        load_source({"kind": "synthetic", "dir": str(tmp_path / "none")}, "mlm")
    blank = tmp_path / "blank.txt"
    blank.write_text("\n = Title = \n\n = = Section = = \n", encoding="utf-8")
    with pytest.raises(PrecswitchError, match="train split is empty after filtering"):
        load_source({"kind": "text", "train": [str(blank)], "eval": [str(blank)]}, "mlm")
    with pytest.raises(PrecswitchError, match="objective must be mlm"):
        load_source({"kind": "text", "train": [str(blank)]}, "classify")
    # an empty or non-UTF-8 text file gave datasets' 41-line generation traceback naming neither file nor cause
    empty, binary = tmp_path / "empty.txt", tmp_path / "binary.txt"
    empty.write_bytes(b"")
    binary.write_bytes(b"fine line\n\xff\xfe broken\n")
    with pytest.raises(PrecswitchError, match=r"cannot read text file\(s\): .*empty.txt is empty"):
        load_source({"kind": "text", "train": [str(empty)], "eval": [str(blank)]}, "mlm")
    with pytest.raises(PrecswitchError, match=r"binary.txt is not UTF-8 text \(byte 0xff at offset 10\)"):
        load_source({"kind": "text", "train": [str(binary)], "eval": [str(blank)]}, "mlm")
    with pytest.raises(PrecswitchError, match=r"text file .* is a directory; name the file\(s\) in it"):
        load_source({"kind": "text", "train": [str(tmp_path)], "eval": [str(blank)]}, "mlm")


def test_parse_source_json_file_and_yaml(tmp_path):
    spec = {"kind": "synthetic", "dir": "results/data/synth", "labels": None}
    j = tmp_path / "s.json"
    j.write_text(json.dumps(spec))
    y = tmp_path / "s.yaml"
    y.write_text("kind: synthetic\ndir: results/data/synth\nlabels: null\n")
    assert parse_source(json.dumps(spec)) == parse_source(f"@{j}") == parse_source(str(y)) == spec
    with pytest.raises(PrecswitchError, match="not valid JSON"):
        parse_source("{kind: 1")
    with pytest.raises(PrecswitchError, match="neither a JSON object nor an existing file"):
        parse_source(str(tmp_path / "missing.yaml"))


def test_synthetic_source_and_hash(tmp_path):
    from precswitch.data.synthetic import write_synthetic

    d = write_synthetic(tmp_path / "syn", seed=1, n_corpus=400, n_train=40, n_dev=20)
    spec = {"kind": "synthetic", "dir": str(d)}
    cls = load_source(spec, "classify")
    assert (len(cls.train), len(cls.eval), cls.label_values) == (40, 20, [0, 1])
    mlm = load_source(spec, "mlm")
    assert len(mlm.train) + len(mlm.eval) == 400 and len(mlm.eval) == 20
    assert len(source_texts(spec)) == 380 + 80  # corpus minus the held-out tail, both sentences
    h = source_hash(spec, "mlm")
    (d / "corpus.txt").write_text("changed .\n", encoding="utf-8")
    assert source_hash(spec, "mlm") != h


def test_hub_offline_error_names_the_dataset(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets")}
    code = ("import sys\nfrom precswitch.data.loading import load_source\nfrom precswitch.errors import PrecswitchError\n"
            "try:\n    load_source({'kind': 'hub', 'name': 'nyu-mll/glue', 'config': 'mrpc'}, 'classify')\n"
            "except PrecswitchError as e:\n    print(e); sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    assert "nyu-mll/glue" in r.stdout and "HF_HUB_OFFLINE" in r.stdout


def test_hub_revision_reaches_load_dataset(monkeypatch):
    import datasets

    calls = []
    real = datasets.Dataset.from_dict

    def load_dataset(name, config=None, **kw):
        calls.append((name, config, kw))
        return real({"sentence1": ["a b", "c d"], "sentence2": ["a c", "c b"], "label": [1, 0]})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    cols = {"text_a": "sentence1", "text_b": "sentence2", "label": "label"}
    spec = parse_source({"kind": "hub", "name": "nyu-mll/glue", "config": "mrpc", "columns": cols,
                         "revision": "abc123"})
    load_source(spec, "classify")
    assert [c[2] for c in calls] == [{"split": "train", "revision": "abc123"},
                                      {"split": "validation", "revision": "abc123"}]
    calls.clear()
    load_source(parse_source({"kind": "hub", "name": "nyu-mll/glue", "config": "mrpc", "columns": cols}), "classify")
    assert [c[2] for c in calls] == [{"split": "train"}, {"split": "validation"}]  # unpinned: as before
    # the revision is part of the spec, so of the source hash (a changed revision re-prepares)
    assert source_hash(spec) != source_hash({**spec, "revision": "def456"})


def test_revision_only_for_hub_sources():
    with pytest.raises(PrecswitchError, match="revision is for kind hub only"):
        parse_source({"kind": "text", "train": ["c.txt"], "revision": "v1"})
    with pytest.raises(PrecswitchError, match="revision must be a branch, tag or commit"):
        parse_source({"kind": "hub", "name": "x/y", "revision": ""})


@pytest.mark.parametrize("kind", ["tsv", "csv"])
def test_na_like_sentences_are_text_not_missing(tmp_path, kind):
    # pandas reads "NA", "null", "None", "nan", "N/A" as missing by default: those rows were silently dropped
    sep = "\t" if kind == "tsv" else ","
    rows = [["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"], ["1", "1", "2", "NA", "N/A"],
            ["0", "3", "4", "null", "None"], ["1", "5", "6", "nan", "a b"], ["0", "7", "8", "", "empty"],
            ["", "9", "10", "no label", "x"], ["0", "11", "12", "c d", "e f"]]
    f = tmp_path / f"t.{kind}"
    f.write_text("\n".join(sep.join(r) for r in rows) + "\n", encoding="utf-8")
    src = load_source({"kind": kind, "train": str(f), "eval": str(f), "columns": MRPC_COLS}, "classify")
    assert src.train["text_a"] == ["NA", "null", "nan", "c d"]  # only the empty text / empty label rows go
    assert src.train["text_b"] == ["N/A", "None", "a b", "e f"]
    assert src.label_values == [0, 1] and src.train["label"] == [1, 0, 1, 0]


def test_text_source_drops_whitespace_only_and_heading_lines_and_strips_the_rest(tmp_path):
    """WikiText's blank lines are a single space: kept, they became empty MLM examples ([CLS] [SEP])."""
    f = tmp_path / "t.txt"
    f.write_text(" \n = Title = \n  first line  \n\t\n = = Section = = \nsecond = line\n   \n= not a heading\nthird\n",
                 encoding="utf-8")
    src = load_source({"kind": "text", "train": [str(f)], "eval": [str(f)]}, "mlm")
    assert src.train["text"] == ["first line", "second = line", "= not a heading", "third"]
    assert src.eval["text"] == src.train["text"]


def _numbered_csv(path, n, blank_at=()):
    rows = ["s1,s2,y"] + [("" if i in blank_at else f"a{i}") + f",b{i},{'pos' if i % 2 else 'neg'}" for i in range(n)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_max_rows_take_the_first_rows_of_their_own_split_and_dropped_rows_count_all_rows_read(tmp_path):
    """max_train_rows cuts train only, max_eval_rows eval only, each keeping the file's first rows (after the
    rows with an empty text are dropped); the dropped count is of all rows read, before the cut (meta.json)."""
    train = _numbered_csv(tmp_path / "train.csv", 8, blank_at=(1,))
    dev = _numbered_csv(tmp_path / "dev.csv", 6, blank_at=(0, 5))
    spec = {"kind": "csv", "train": str(train), "eval": str(dev), "columns": {"text_a": "s1", "text_b": "s2",
                                                                                "label": "y"}}
    src = load_source({**spec, "max_train_rows": 3}, "classify")
    assert src.train["text_a"] == ["a0", "a2", "a3"] and src.eval["text_a"] == ["a1", "a2", "a3", "a4"]
    assert src.dropped == {"train": (1, 8, str(train)), "eval": (2, 6, str(dev))}
    src = load_source({**spec, "max_eval_rows": 2}, "classify")
    assert src.train["text_a"] == ["a0", "a2", "a3", "a4", "a5", "a6", "a7"] and src.eval["text_a"] == ["a1", "a2"]
    assert src.dropped == {"train": (1, 8, str(train)), "eval": (2, 6, str(dev))}


def test_tokenizer_texts_of_a_table_are_both_sentences(tmp_path):
    """Words only the second sentence has must reach the tokenizer's vocabulary (else they become pieces/[UNK])."""
    f = _numbered_csv(tmp_path / "t.csv", 4, blank_at=(2,))
    spec = {"kind": "csv", "train": str(f), "eval": str(f), "columns": {"text_a": "s1", "text_b": "s2", "label": "y"}}
    assert source_texts(spec) == ["a0", "a1", "a3", "b0", "b1", "b3"]
    assert source_texts({**spec, "columns": {"text_a": "s1", "text_b": None, "label": "y"}}) == ["a0", "a1", "a3"]


def test_a_test_split_is_read_with_the_training_classes_from_each_kind_of_source(tmp_path, monkeypatch):
    """Contract 1: synthetic test.tsv, a table's optional ``test`` file, a hub ``test_split``; a masked-LM
    stage and a source without one have none; max_eval_rows caps it like eval; its labels must be train's."""
    import datasets

    from precswitch.data.synthetic import write_synthetic

    syn = {"kind": "synthetic", "dir": str(write_synthetic(tmp_path / "syn", seed=1, n_corpus=20, n_train=10,
                                                           n_dev=6, n_test=8))}
    assert len(load_source(syn, "classify").test) == 8 and load_source(syn, "mlm").test is None
    hashes = {"classify": source_hash(syn, "classify"), "mlm": source_hash(syn, "mlm")}
    for name in ("train.tsv", "dev.tsv", "test.tsv"):  # an edited pair file re-prepares stage 2, not stage 1
        with open(tmp_path / "syn" / name, "a", encoding="utf-8") as fh:
            fh.write("1\t1\t2\tthe a\tthe b\n")
        assert source_hash(syn, "classify") != hashes["classify"] and source_hash(syn, "mlm") == hashes["mlm"]
        hashes["classify"] = source_hash(syn, "classify")
    train, dev, test = (_numbered_csv(tmp_path / f"{s}.csv", n, blank_at=b) for s, n, b in
                        (("train", 8, ()), ("dev", 4, ()), ("test", 6, (0,))))
    spec = {"kind": "csv", "train": str(train), "eval": str(dev), "columns": {"text_a": "s1", "text_b": "s2",
                                                                                "label": "y"}}
    assert load_source(spec, "classify").test is None
    src = load_source({**spec, "test": str(test), "max_eval_rows": 3}, "classify")
    assert src.test["text_a"] == ["a1", "a2", "a3"] and src.test["label"] == [1, 0, 1]  # neg=0, pos=1 as train
    assert src.dropped["test"] == (1, 6, str(test))
    test.write_text("s1,s2,y\na,b,maybe\n", encoding="utf-8")
    with pytest.raises(PrecswitchError, match=r"test.csv: label value\(s\) \['maybe'\] not in the allowed labels"):
        load_source({**spec, "test": str(test)}, "classify")
    with pytest.raises(PrecswitchError, match="file not found: .*none.csv"):
        load_source({**spec, "test": str(tmp_path / "none.csv")}, "classify")
    for bad, key in (({**syn, "test": "t.tsv"}, "test"), ({**spec, "test_split": "test"}, "test_split"),
                     ({"kind": "hub", "name": "x/y", "test": "t.csv"}, "test")):
        with pytest.raises(PrecswitchError, match=rf"source: {key} \(?.*is for kind"):
            parse_source(bad)
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None, **kw: calls.append(kw["split"]) or
                        datasets.Dataset.from_dict({"sentence": ["a b", "c d"], "label": [1, 0]}))
    hub = {"kind": "hub", "name": "x/y", "columns": {"text_a": "sentence", "label": "label"}, "test_split": "test"}
    assert len(load_source(hub, "classify").test) == 2 and calls == ["train", "validation", "test"]
