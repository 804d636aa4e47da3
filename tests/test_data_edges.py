"""Data-loading edge cases from the config audit (H3, H6, M4, L4, L8): each bad table or mapping is refused
with one line naming the file or key and the problem, and what the loader does silently (the eval cap,
dropped rows) is logged by prepare and recorded in meta.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from precswitch.data.loading import MAX_AUTO_EVAL_LINES, check_source_files, check_table_headers, load_source
from precswitch.data.prepare import prepare
from precswitch.data.tokenizer import build_tokenizer
from precswitch.errors import PrecswitchError

MRPC_COLS = {"text_a": "#1 String", "text_b": "#2 String", "label": "Quality"}
MRPC_HEADER = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
PAIRS = {"text_a": "s1", "text_b": "s2", "label": "y"}


def _mrpc_like(path: Path, rows: list[tuple], header: str = MRPC_HEADER) -> Path:
    path.write_text(header + "".join("\t".join(map(str, r)) + "\n" for r in rows), encoding="utf-8")
    return path


def _rows(n: int, labels=(0, 1)) -> list[tuple]:
    return [(labels[i % len(labels)], 100 + i, 200 + i, f"the cat number {i} sat", f"a dog number {i} ran")
            for i in range(n)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    texts = [f"line number {i} here , the cat sat on a dog" for i in range(200)]
    return build_tokenizer(texts, root / "tok", vocab_size=200, model_max_length=64)


@pytest.mark.parametrize("cols, msg", [
    ({**MRPC_COLS, "text_b": "#1 String"}, "columns text_a and text_b both name column '#1 String'"),
    ({"text_a": "Quality", "text_b": None, "label": "Quality"}, "columns text_a and label both name column 'Quality'"),
    ({"text_a": "#1 String", "text_b": "Quality", "label": "Quality"},
     "columns text_b and label both name column 'Quality'"),
])
def test_a_column_named_for_two_roles_is_refused_by_the_header_check_and_the_loader(tmp_path, cols, msg):
    """text_b = text_a crashed prepare with KeyError 'text_a', label = text_a with pyarrow's 'Field "label"
    exists 2 times in schema', after stage 1 trained; the header check (run by the workflow's config check,
    which prefixes 'config key data.<stage>.columns: ') passed both."""
    train = _mrpc_like(tmp_path / "train.tsv", _rows(6))
    dev = _mrpc_like(tmp_path / "dev.tsv", _rows(4))
    spec = {"kind": "tsv", "train": str(train), "eval": str(dev), "columns": cols}
    with pytest.raises(PrecswitchError) as e:
        check_table_headers(spec)
    text = str(e.value)
    assert text.startswith("source: " + msg) and "each role (text_a, text_b, label) needs its own column" in text
    assert "\n" not in text
    # what the workflow prints
    assert f"config key data.finetune.columns: {text.removeprefix('source: ')}".startswith(
        "config key data.finetune.columns: " + msg)
    with pytest.raises(PrecswitchError, match="^source: " + msg):
        load_source(spec, "classify")
    # the same for a hub source (no header to read: the mapping alone is wrong)
    with pytest.raises(PrecswitchError, match="^source: " + msg):
        check_table_headers({"kind": "hub", "name": "x/y", "columns": cols})


def test_distinct_columns_still_load_including_a_swap(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("text_a,label\n0,a cat\n1,a dog\n0,it rains\n1,it pours\n", encoding="utf-8")
    spec = {"kind": "csv", "train": str(path), "eval": str(path), "columns": {"text_a": "label", "text_b": None,
                                                                            "label": "text_a"}}
    check_table_headers(spec)
    src = load_source(spec, "classify")
    assert src.train["text_a"] == ["a cat", "a dog", "it rains", "it pours"]  # the column named 'label'
    assert src.label_values == [0, 1] and src.train["label"] == [0, 1, 0, 1]


def _lines_file(path: Path, n: int) -> Path:
    path.write_text("".join(f"line number {i} here\n" for i in range(n)), encoding="utf-8")
    return path


def test_eval_fraction_cap_is_logged_and_recorded_in_meta(tmp_path, tok, capsys):
    """eval_fraction 0.5 of 4101 lines asked for 2050 held-out lines and silently got the 2000-line cap."""
    f = _lines_file(tmp_path / "c.txt", 4101)
    spec = {"kind": "text", "train": [str(f)], "eval_fraction": 0.5, "mlm_examples": "lines"}
    meta = prepare(spec, tok, "mlm", 32, tmp_path / "out")
    err = capsys.readouterr().err
    assert MAX_AUTO_EVAL_LINES == 2000
    assert (meta["n_train"], meta["n_eval"]) == (2102, 1999)  # 1999: the train part keeps an even line count
    on_disk = json.loads((tmp_path / "out" / "meta.json").read_text())
    for m in (meta, on_disk):
        assert m["eval_fraction"] == 0.5 and m["eval_lines_cap"] == 2000 and m["eval_lines"] == 1999
        assert m["eval_fraction_effective"] == pytest.approx(1999 / 4101) and m["eval_capped"] is True
    assert (f"precswitch: eval_fraction 0.5 of the 4101 lines of {f} would hold out 2050 lines, above the cap of "
            "2000 held-out lines: 1999 lines (48.74%) held out for eval, 2102 for training") in err
    # under the cap (default 5%: round(5.05) = 5 lines of 101): recorded, not logged; with eval files: null
    f = _lines_file(tmp_path / "c.txt", 101)
    meta = prepare({"kind": "text", "train": [str(f)], "mlm_examples": "lines"}, tok, "mlm", 32, tmp_path / "o2")
    assert "eval_fraction" not in capsys.readouterr().err
    assert (meta["eval_fraction"], meta["eval_lines"], meta["eval_capped"], meta["n_train"]) == (0.05, 5, False, 96)
    meta = prepare({"kind": "text", "train": [str(f)], "eval": [str(f)], "mlm_examples": "lines"}, tok, "mlm",
                   32, tmp_path / "o3")
    assert meta["eval_fraction"] is None and meta["eval_lines"] is None and meta["eval_capped"] is None


def test_eval_fraction_leaving_no_training_line_names_eval_fraction(tmp_path):
    """0.99 of 10 lines held out all 10 and was refused as 'train split is empty after filtering'."""
    from precswitch.data.synthetic import write_synthetic

    f = _lines_file(tmp_path / "c.txt", 10)
    with pytest.raises(PrecswitchError, match=r"^source: eval_fraction 0.99 of the 10 lines of .*c.txt holds out "
                                              r"10 lines, leaving no line for training; lower eval_fraction"):
        load_source({"kind": "text", "train": [str(f)], "eval_fraction": 0.99}, "mlm")
    d = write_synthetic(tmp_path / "syn", seed=1, n_corpus=10, n_train=20, n_dev=10)
    with pytest.raises(PrecswitchError, match=r"eval_fraction 0.99 of the 10 lines of .*corpus.txt holds out 10"):
        load_source({"kind": "synthetic", "dir": str(d), "eval_fraction": 0.99}, "mlm")
    # a fraction that leaves a line still works (9 held out -> 8: train keeps an even count); null = default
    src = load_source({"kind": "text", "train": [str(f)], "eval_fraction": 0.9}, "mlm")
    assert (len(src.train), len(src.eval)) == (2, 8)
    src = load_source({"kind": "text", "train": [str(f)], "eval_fraction": None}, "mlm")
    assert (len(src.train), len(src.eval)) == (9, 1)


def test_header_only_or_empty_eval_file_is_named_not_datasets_train_split(tmp_path):
    """A header-only eval TSV read as 'Instruction "train" corresponds to no data!'."""
    train = _mrpc_like(tmp_path / "train.tsv", _rows(6))
    empty = _mrpc_like(tmp_path / "empty_eval.tsv", [])
    with pytest.raises(PrecswitchError) as e:
        load_source({"kind": "tsv", "train": str(train), "eval": str(empty)}, "classify")
    assert str(e.value).startswith(f"source: cannot read tsv file {empty}: the file has a header but no data rows "
                                   "(datasets: ")
    assert 'Instruction "train" corresponds to no data!' in str(e.value)  # the original, appended
    zero = tmp_path / "zero.csv"
    zero.write_bytes(b"")
    with pytest.raises(PrecswitchError, match=f"^source: cannot read csv file {zero}: the file is empty"):
        load_source({"kind": "csv", "train": str(zero), "eval": str(zero), "columns": PAIRS}, "classify")


def test_table_without_rows_or_with_only_empty_cells_says_which(tmp_path):
    """Parquet/JSONL with no rows load as empty datasets; all rows blank were 'empty after filtering'."""
    import pandas as pd

    good = tmp_path / "good.csv"
    good.write_text("s1,s2,y\na,b,0\nc,d,1\n", encoding="utf-8")
    empty_pq = tmp_path / "empty.parquet"
    pd.DataFrame({"s1": pd.Series([], dtype=str), "s2": pd.Series([], dtype=str),
                  "y": pd.Series([], dtype="int64")}).to_parquet(empty_pq, index=False)
    good_pq = tmp_path / "good.parquet"
    pd.read_csv(good).to_parquet(good_pq, index=False)
    with pytest.raises(PrecswitchError, match=rf"^source: cannot read parquet file {empty_pq}: the file has no data "
                                              r"rows \(datasets: "):
        load_source({"kind": "parquet", "train": str(good_pq), "eval": str(empty_pq), "columns": PAIRS}, "classify")
    blank = tmp_path / "blank.csv"
    blank.write_text("s1,s2,y\n,b,0\n ,d,1\n", encoding="utf-8")
    nl = tmp_path / "blank_lines.jsonl"
    nl.write_text("\n\n", encoding="utf-8")
    with pytest.raises(PrecswitchError, match=rf"^source: cannot read jsonl file {nl}: the file has no data rows"):
        load_source({"kind": "jsonl", "train": str(nl), "eval": str(nl), "columns": PAIRS}, "classify")
    with pytest.raises(PrecswitchError, match=rf"^source: eval split is empty after filtering \({blank}\): all 2 "
                                              r"rows have an empty text or label cell$"):
        load_source({"kind": "csv", "train": str(good), "eval": str(blank), "columns": PAIRS}, "classify")


def test_one_class_training_split_is_refused_naming_the_file(tmp_path):
    """'need at least 2 label values, found [1]'; with labels listed, one training class was not refused."""
    one = _mrpc_like(tmp_path / "oneclass.tsv", _rows(8, labels=(1,)))
    dev = _mrpc_like(tmp_path / "dev.tsv", _rows(4))
    msg = (rf"^source: {one}: every one of the 8 training rows has label 1; a classifier needs training rows of at "
           "least 2 classes")
    with pytest.raises(PrecswitchError, match=msg):
        load_source({"kind": "tsv", "train": str(one), "eval": str(dev)}, "classify")
    with pytest.raises(PrecswitchError, match=msg):
        load_source({"kind": "tsv", "train": str(one), "eval": str(dev), "labels": [0, 1]}, "classify")
    # max_train_rows cutting a file sorted by label leaves one class too
    srt = _mrpc_like(tmp_path / "sorted.tsv", sorted(_rows(8), key=lambda r: r[0]))
    with pytest.raises(PrecswitchError, match=r"every one of the 3 training rows has label 0"):
        load_source({"kind": "tsv", "train": str(srt), "eval": str(dev), "max_train_rows": 3}, "classify")
    with pytest.raises(PrecswitchError, match=r"^source: labels must list at least 2 classes, got \[1\]"):
        load_source({"kind": "tsv", "train": str(dev), "eval": str(dev), "labels": [1]}, "classify")


def test_eval_label_not_among_the_training_labels_says_where_the_classes_come_from(tmp_path):
    train = tmp_path / "train.csv"
    train.write_text("s1,s2,y\na,b,0\nc,d,1\ne,f,0\ng,h,1\n", encoding="utf-8")
    dev = tmp_path / "dev.csv"
    dev.write_text("s1,s2,y\na,b,0\nc,d,maybe\n", encoding="utf-8")
    spec = {"kind": "csv", "train": str(train), "eval": str(dev), "columns": PAIRS}
    with pytest.raises(PrecswitchError, match=rf"^source: {dev}: label value\(s\) \['maybe'\] not in the allowed "
                                              r"labels \[0, 1\] \(labels is not given: the classes are the "
                                              r"training file's; list labels to name them\)$"):
        load_source(spec, "classify")


def test_rows_with_an_empty_text_cell_are_counted_logged_and_recorded(tmp_path, tok, capsys):
    train = tmp_path / "train.csv"
    train.write_text("s1,s2,y\nthe cat,a dog,0\n,a dog,1\nthe cat,a dog,1\nthe cat,,0\nthe cat,a dog,0\n",
                     encoding="utf-8")
    dev = tmp_path / "dev.csv"
    dev.write_text("s1,s2,y\nthe cat,a dog,0\n   ,a dog,1\nthe cat,a dog,1\n", encoding="utf-8")
    spec = {"kind": "csv", "train": str(train), "eval": str(dev), "columns": PAIRS}
    src = load_source(spec, "classify")
    assert (len(src.train), len(src.eval)) == (3, 2)
    assert src.dropped == {"train": (2, 5, str(train)), "eval": (1, 3, str(dev))}
    meta = prepare(spec, tok, "classify", 32, tmp_path / "out")
    err = capsys.readouterr().err
    assert (meta["train_rows_dropped"], meta["eval_rows_dropped"]) == (2, 1)
    assert f"precswitch: warning: train split ({train}): 2 of 5 rows dropped (empty text or label cell)" in err
    assert f"precswitch: warning: eval split ({dev}): 1 of 3 rows dropped (empty text or label cell)" in err
    # nothing dropped: recorded as 0, nothing logged
    ok = tmp_path / "ok.csv"
    ok.write_text("s1,s2,y\na,b,0\nc,d,1\n", encoding="utf-8")
    meta = prepare({**spec, "train": str(ok), "eval": str(ok)}, tok, "classify", 32, tmp_path / "out2")
    assert (meta["train_rows_dropped"], meta["eval_rows_dropped"]) == (0, 0)
    assert "dropped" not in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_an_empty_second_sentence_drops_the_row_in_every_table_format(tmp_path, kind):
    """An empty text_b cell is a null in CSV (dropped) but an empty string in JSONL/parquet, where it was kept and
    tokenized as "[CLS] a [SEP] [SEP]"; a whitespace-only text_b was kept in both (a whitespace-only text_a is
    dropped). Every format drops them now, and counts them."""
    recs = [("a b", "", 0), ("c d", "e f", 1), ("g h", "   ", 1), ("k", "l", 0)]
    f = tmp_path / f"t.{kind}"
    if kind == "jsonl":
        f.write_text("".join(json.dumps({"s1": a, "s2": b, "y": y}) + "\n" for a, b, y in recs), encoding="utf-8")
    else:
        f.write_text("s1,s2,y\n" + "".join(f"{a},{b},{y}\n" for a, b, y in recs), encoding="utf-8")
    src = load_source({"kind": kind, "train": str(f), "eval": str(f), "columns": PAIRS}, "classify")
    assert src.train["text_a"] == ["c d", "k"] and src.train["text_b"] == ["e f", "l"]
    assert src.dropped["train"][:2] == (2, 4)
    # no text_b column mapped: nothing is dropped for it
    single = load_source({"kind": kind, "train": str(f), "eval": str(f), "columns": {**PAIRS, "text_b": None}},
                         "classify")
    assert single.train["text_a"] == ["a b", "c d", "g h", "k"]


@pytest.mark.parametrize("key, value, msg", [
    ("max_train_rows", 0, "max_train_rows must be a positive integer or null, got 0"),
    ("max_eval_rows", True, "max_eval_rows must be a positive integer or null, got True"),
    ("eval_fraction", 0, r"eval_fraction must be in \(0, 1\), got 0"),
    ("eval_fraction", 1.0, r"eval_fraction must be in \(0, 1\), got 1.0"),
    ("labels", [], r"labels must be a non-empty list, got \[\]"),
    ("mlm_examples", "sentences", "mlm_examples 'sentences' not allowed"),
])
def test_spec_values_out_of_range_are_refused_when_the_spec_is_read(key, value, msg):
    """max_train_rows 0 selected no row (an 'empty split' later), True read as 1; eval_fraction 0 fell back to
    the 5% default and 1 held out every line; labels [] inferred the classes; all refused, naming the key."""
    from precswitch.data.loading import parse_source

    with pytest.raises(PrecswitchError, match=f"^source: {msg}"):
        parse_source({"kind": "text", "train": ["c.txt"], key: value})


@pytest.mark.parametrize("kind", ["tsv", "csv", "jsonl", "parquet"])
def test_header_check_reads_each_table_format_as_the_loader_does(tmp_path, kind):
    """The workflow's config check reads the header only: a BOM (GLUE, Excel CSVs), a tab-separated header, a
    JSONL file starting with a blank line and a parquet schema all give the loader's column names."""
    import pandas as pd

    f = tmp_path / f"t.{kind}"
    df = pd.DataFrame({"s1": ["a b", "c d"], "s2": ["e", "f"], "y": [0, 1]})
    if kind in ("tsv", "csv"):
        sep = "\t" if kind == "tsv" else ","
        f.write_text("\ufeff" + df.to_csv(sep=sep, index=False), encoding="utf-8")
    elif kind == "jsonl":
        f.write_text("\n" + df.to_json(orient="records", lines=True), encoding="utf-8")
    else:
        df.to_parquet(f, index=False)
    spec = {"kind": kind, "train": str(f), "eval": str(f), "columns": PAIRS}
    check_table_headers(spec)
    assert load_source(spec, "classify").train["text_a"] == ["a b", "c d"]
    with pytest.raises(PrecswitchError, match=rf"^source: {f}: column\(s\) not found: label='Y'; columns found: "
                                              r"\['s1', 's2', 'y'\]$"):
        check_table_headers({**spec, "columns": {**PAIRS, "label": "Y"}})


def test_mlm_text_of_a_table_column(tmp_path):
    """text_column wins over columns.text_a, columns.text_a is the fallback, a table that has a column named
    'text' besides the chosen one still loads, and the tokenizer reads the same column."""
    from precswitch.data.loading import source_texts

    f = tmp_path / "t.csv"
    f.write_text("text,s1,s2,y\nother a,first a,second a,0\nother b,first b,second b,1\n", encoding="utf-8")
    spec = {"kind": "csv", "train": str(f), "eval": str(f), "columns": PAIRS}
    src = load_source({**spec, "text_column": "s2"}, "mlm")
    assert src.train.column_names == ["text"] and src.train["text"] == ["second a", "second b"]
    assert load_source(spec, "mlm").train["text"] == ["first a", "first b"]
    assert source_texts({**spec, "text_column": "s2"}) == ["second a", "second b"]
    with pytest.raises(PrecswitchError, match=r"^source \(kind csv\): key 'columns' is required"):
        load_source({"kind": "csv", "train": str(f), "eval": str(f)}, "classify")


def test_label_values_read_from_the_data_are_ordered_numerically_and_floats_are_integers(tmp_path):
    """Labels 2 and 10 are classes [2, 10] (not the string order [10, 2]); JSONL 0.0/1.0 are the classes 0
    and 1, matching labels: [0, 1]; a label listed twice is refused."""
    f = tmp_path / "t.csv"
    f.write_text("s1,s2,y\n" + "".join(f"a{i},b{i},{(2, 10)[i % 2]}\n" for i in range(6)), encoding="utf-8")
    src = load_source({"kind": "csv", "train": str(f), "eval": str(f), "columns": PAIRS}, "classify")
    assert src.label_values == [2, 10] and src.train["label"] == [0, 1, 0, 1, 0, 1]
    j = tmp_path / "t.jsonl"
    j.write_text("".join(json.dumps({"s1": f"a{i}", "s2": "b", "y": float(i % 2)}) + "\n" for i in range(4)),
                 encoding="utf-8")
    spec = {"kind": "jsonl", "train": str(j), "eval": str(j), "columns": PAIRS}
    src = load_source(spec, "classify")
    assert src.label_values == [0, 1] and all(type(v) is int for v in src.label_values)
    assert load_source({**spec, "labels": [1, 0]}, "classify").train["label"] == [1, 0, 1, 0]
    with pytest.raises(PrecswitchError, match=r"^source: labels has duplicates: \[0, 0, 1\]"):
        load_source({**spec, "labels": [0, 0, 1]}, "classify")


def test_inferred_label_limits_are_the_documented_ones(tmp_path):
    """Read from the data: 100 classes are accepted, 101 refused; a class is 'rare' below 3 rows AND below 1%
    of the rows (3 rows of 400 and 2 rows of 100 are classes, not typos)."""
    def table(name, labels):
        p = tmp_path / name
        p.write_text("s1,s2,y\n" + "".join(f"a{i},b,{v}\n" for i, v in enumerate(labels)), encoding="utf-8")
        return {"kind": "csv", "train": str(p), "eval": str(p), "columns": PAIRS}

    assert len(load_source(table("c100.csv", [f"c{i % 100}" for i in range(300)]), "classify").label_values) == 100
    with pytest.raises(PrecswitchError, match="the label column has 101 distinct values"):
        load_source(table("c101.csv", [f"c{i % 101}" for i in range(303)]), "classify")
    assert load_source(table("r3.csv", ["x"] * 3 + ["a", "b"] * 199), "classify").label_values == ["a", "b", "x"]
    assert load_source(table("r2.csv", ["x"] * 2 + ["a", "b"] * 49), "classify").label_values == ["a", "b", "x"]


def test_a_non_utf8_byte_past_the_first_megabyte_is_located_in_the_whole_file(tmp_path):
    """A bad byte is located in the whole file, not within the 1 MiB chunk it was read in. (A CSV's BOM:
    test_header_check_reads_each_table_format_as_the_loader_does.)"""
    big = tmp_path / "big.txt"
    big.write_bytes(b"fine line\n" * 110_000 + b"\xff\n")
    with pytest.raises(PrecswitchError, match=r"big.txt is not UTF-8 text \(byte 0xff at offset 1100000\)"):
        load_source({"kind": "text", "train": [str(big)], "eval": [str(big)]}, "mlm")


def test_columns_mapping_must_name_known_roles(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("s1,s2,y\na,b,0\nc,d,1\n", encoding="utf-8")
    spec = {"kind": "csv", "train": str(f), "eval": str(f)}
    with pytest.raises(PrecswitchError, match=r"^source: unknown columns key\(s\) \['txt_b'\] \(allowed: text_a"):
        load_source({**spec, "columns": {"text_a": "s1", "txt_b": "s2", "label": "y"}}, "classify")
    with pytest.raises(PrecswitchError, match=r"^source: columns must be a mapping, got 's1'"):
        load_source({**spec, "columns": "s1"}, "classify")
    with pytest.raises(PrecswitchError, match=r"^source: columns needs text_a and label for objective classify"):
        load_source({**spec, "columns": {"text_b": "s2", "label": "y"}}, "classify")


def test_a_table_source_given_a_list_of_files_is_refused_in_one_line(tmp_path):
    """`train: [train.csv]` (the text kind's form) crashed `precswitch prepare --source` with "TypeError: expected
    str, bytes or os.PathLike object, not list"; the workflow's config check and fetch refuse it too."""
    from precswitch import fetch

    f = tmp_path / "t.csv"
    f.write_text("s1,s2,y\na,b,0\nc,d,1\n", encoding="utf-8")
    with pytest.raises(PrecswitchError, match=r"^source \(kind csv\): train takes one file path, not a list, got \["):
        load_source({"kind": "csv", "train": [str(f)], "eval": str(f), "columns": PAIRS}, "classify")
    with pytest.raises(PrecswitchError, match=r"^config key data.finetune.eval: kind tsv takes one file path, not a list"):
        fetch.requirements({"data": {"finetune": {"kind": "tsv", "train": "a.tsv", "eval": ["b.tsv", "c.tsv"]}}})
    assert fetch.requirements({"data": {"pretrain": {"kind": "text", "train": ["a.txt", "b.txt"]}}})[0]["files"] == [
        "a.txt", "b.txt"]


def test_header_check_reads_the_eval_file_too(tmp_path):
    """The config check names a mapped column the eval file lacks (a dev file with another header), not only the
    training file's."""
    train, dev = tmp_path / "train.csv", tmp_path / "dev.csv"
    train.write_text("s1,s2,y\na,b,0\n", encoding="utf-8")
    dev.write_text("s1,s2,label\na,b,0\n", encoding="utf-8")
    with pytest.raises(PrecswitchError, match=r"^source: .*dev.csv: column\(s\) not found: label='y'; columns found: "
                                              r"\['s1', 's2', 'label'\]$"):
        check_table_headers({"kind": "csv", "train": str(train), "eval": str(dev), "columns": PAIRS})


def test_source_hash_changes_when_a_line_moves_from_train_to_eval(tmp_path):
    """The hash (which decides whether prepare reruns) covers each file on its own: moving the last training line
    to the front of the eval file leaves the bytes read in order the same, and must still change it."""
    from precswitch.data.loading import source_hash

    train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
    spec = {"kind": "text", "train": [str(train)], "eval": [str(dev)]}
    train.write_text("one\ntwo\n", encoding="utf-8")
    dev.write_text("three\n", encoding="utf-8")
    h = source_hash(spec, "mlm")
    train.write_text("one\n", encoding="utf-8")
    dev.write_text("two\nthree\n", encoding="utf-8")
    assert source_hash(spec, "mlm") != h


def test_a_text_file_of_headings_only_says_why_its_split_is_empty(tmp_path):
    ok, f = tmp_path / "ok.txt", tmp_path / "h.txt"
    ok.write_text("a line\n", encoding="utf-8")
    f.write_text(" = Title = \n \n = = Section = = \n", encoding="utf-8")
    with pytest.raises(PrecswitchError, match=r"^source: eval split is empty after filtering \(.*h.txt\): no line left "
                                              r"once blank and ' = Heading = ' lines are dropped$"):
        load_source({"kind": "text", "train": [str(ok)], "eval": [str(f)]}, "mlm")


@pytest.mark.parametrize("kind", ["tsv", "csv"])
def test_a_mapped_column_named_twice_in_the_header_is_refused(tmp_path, kind):
    """A header 's1,s1,s2,y' loaded the first 's1' as text_a silently (pandas renames the second 's1.1', which the
    header check then called missing); the header check and the loader now name the repeated column. A repeated
    column that no key maps is no problem."""
    import re

    sep = "\t" if kind == "tsv" else ","
    f = tmp_path / f"t.{kind}"
    f.write_text("".join(sep.join(r) + "\n" for r in (["s1", "s1", "s2", "y"], ["a", "b", "c", "0"],
                                                       ["d", "e", "f", "1"])), encoding="utf-8")
    spec = {"kind": kind, "train": str(f), "eval": str(f), "columns": PAIRS}
    msg = rf"^source: {re.escape(str(f))}: column 's1' \(text_a\) appears 2 times in the header; which one is meant"
    with pytest.raises(PrecswitchError, match=msg):
        check_table_headers(spec)
    with pytest.raises(PrecswitchError, match=msg):
        load_source(spec, "classify")
    with pytest.raises(PrecswitchError, match=r"column 's1' \(text_column\) appears 2 times in the header"):
        load_source({**spec, "text_column": "s1"}, "mlm")
    other = {**spec, "columns": {"text_a": "s2", "text_b": None, "label": "y"}}
    check_table_headers(other)
    assert load_source(other, "classify").train["text_a"] == ["c", "f"]


def test_header_check_reads_a_quoted_csv_header_as_the_loader_does(tmp_path):
    """A CSV header may quote its names ('"s1","s2","y"', a name with a comma): read as CSV, not split on commas."""
    f = tmp_path / "t.csv"
    f.write_text('"s1","s2","y, label"\n"a, b",c,0\nd,e,1\n', encoding="utf-8")
    spec = {"kind": "csv", "train": str(f), "eval": str(f), "columns": {**PAIRS, "label": "y, label"}}
    check_table_headers(spec)
    assert load_source(spec, "classify").train["text_a"] == ["a, b", "d"]


@pytest.mark.parametrize("kind", ["csv", "tsv"])
def test_a_small_file_whose_header_row_repeats_or_whose_label_has_a_space_is_refused(tmp_path, kind):
    """Under 300 rows one stray label row is over 1% of them, so the typo check let it through as a class: the
    header row repeated inside the data (two files joined) made a 3-class task with the class 'y', and a label
    written 'pos ' beside 'pos' another class (a numeric '1 ' is read as 1). Both are refused with labels read from the data; stated labels refuse
    the stray rows by name, as for any value not listed."""
    sep = "," if kind == "csv" else "\t"
    rows = [f"a{i}{sep}b{i}{sep}{('neg', 'pos')[i % 2]}" for i in range(20)]

    def load(lines, **extra):
        p = tmp_path / f"t.{kind}"
        p.write_text("\n".join([sep.join(["s1", "s2", "y"]), *lines]) + "\n", encoding="utf-8")
        return load_source({"kind": kind, "train": str(p), "eval": str(p), "columns": PAIRS, **extra}, "classify")

    assert load(rows).label_values == ["neg", "pos"]
    with pytest.raises(PrecswitchError, match=r"t\.(csv|tsv): 1 row of the label column hold 'y', the column's own "
                                              r"name: a header row repeated inside the data"):
        load(rows[:10] + [sep.join(["s1", "s2", "y"])] + rows[10:])
    with pytest.raises(PrecswitchError, match=r"label values 'pos' \(9 rows\) and 'pos ' \(1 row\) differ only in "
                                              r"surrounding spaces"):
        load(rows[:-1] + [f"a{sep}b{sep}pos "])
    with pytest.raises(PrecswitchError, match=r"label value\(s\) \['y'\] not in the allowed labels"):
        load(rows + [sep.join(["s1", "s2", "y"])], labels=["neg", "pos"])


@pytest.mark.parametrize("kind, text, want", [
    ("tsv", "s1\ts2\ty\na\tb\t0\nc\td\n" + "e\tf\t1\n" * 3 + "g\th\t1\textra\n",
     r"line 7 has 4 fields, the header has 3 \(a stray tab in a text\?\)"),  # the short line 3 is not blamed
    ("csv", 's1,s2,y\n"a, quoted",b,0\nc,d,1\ne,f,g,0\n',
     r"line 4 has 4 fields, the header has 3 \(a stray unquoted comma in a text\?\)"),
    # every row long: pandas took the extras as index columns, the label column held another field
    ("tsv", "s1\ts2\ty\n" + "x\ty\t1\textra\tmore\n" * 5 + "x\ty\t0\n" * 5, r"line 2 has 5 fields, the header has 3"),
    ("jsonl", '["s1", "s2", "y"]\n["a", "b", 0]\n', r"line 1 is an array, not a JSON object; each line must be one "
                                                     r"object \{\"column\": value, \.\.\.\} \(datasets: "),
    ("jsonl", '{"s1": "a", "s2": "b", "y": 0}\n{"s1": "c", "s2": \n', "line 2 is not valid JSON"),
    ("tsv", "", "the file is empty"), ("csv", "", "the file is empty"), ("jsonl", "", "the file is empty"),
])
def test_a_malformed_table_names_its_file_and_line(tmp_path, kind, text, want):
    """pandas' 'Expected 5 fields in line 6, saw 6' and datasets' generation errors were hidden behind 'An error
    occurred while generating the dataset'. The header check (the workflow's config check) leaves a file
    without column names to the loader, which names it."""
    f = tmp_path / f"t.{kind}"
    f.write_text(text, encoding="utf-8")
    spec = {"kind": kind, "train": str(f), "eval": str(f), "columns": PAIRS}
    if not text.startswith("s1"):
        assert check_table_headers(spec) is None
    with pytest.raises(PrecswitchError, match=rf"^source: cannot read {kind} file {f}: {want}"):
        load_source(spec, "classify")


def test_the_held_out_tail_rounds_keeps_line_pairs_and_is_capped_only_above_the_cap(tmp_path):
    """30 lines x 5% = 1.5 -> 2 lines (rounded, not truncated); x 10% = 3 would split a line pair: 2, not called
    capped; one line is refused naming the count; exactly the cap (2000 lines) is not capped and logs nothing."""
    src = load_source({"kind": "text", "train": [str(_lines_file(tmp_path / "a.txt", 30))]}, "mlm")
    assert (len(src.train), len(src.eval)) == (28, 2) and src.eval["text"][-1] == "line number 29 here"
    src = load_source({"kind": "text", "train": [str(tmp_path / "a.txt")], "eval_fraction": 0.1}, "mlm")
    assert (src.held_out["eval_lines_requested"], src.held_out["eval_lines"], src.held_out["capped"]) == (3, 2, False)
    assert src.notes() == []
    with pytest.raises(PrecswitchError, match=r"^source: only 1 text line\(s\) in .*one.txt; need at least 2"):
        load_source({"kind": "text", "train": [str(_lines_file(tmp_path / "one.txt", 1))]}, "mlm")
    src = load_source({"kind": "text", "train": [str(_lines_file(tmp_path / "b.txt", 4000))], "eval_fraction": 0.5},
                      "mlm")
    assert (len(src.eval), src.held_out["eval_lines_requested"], src.held_out["capped"]) == (2000, 2000, False)
    assert src.notes() == []


def test_hub_sources_pass_config_and_split_names_and_read_no_local_file(monkeypatch):
    import datasets

    calls = []

    def load_dataset(name, config=None, split=None, **kw):
        calls.append((name, config, split))
        n = 0 if split == "empty" else 2
        return datasets.Dataset.from_dict({"sentence": ["a b", "c d"][:n], "label": [0, 1][:n]})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    spec = {"kind": "hub", "name": "acme/sst", "config": "sst2", "train_split": "train[:50%]", "eval_split": "dev",
            "columns": {"text_a": "sentence", "text_b": None, "label": "label"}}
    assert load_source(spec, "classify").label_values == [0, 1]
    assert calls == [("acme/sst", "sst2", "train[:50%]"), ("acme/sst", "sst2", "dev")]
    with pytest.raises(PrecswitchError, match=r"^source: eval split is empty after filtering \(hub acme/sst:empty\): "
                                              r"it has no data rows$"):
        load_source({**spec, "eval_split": "empty"}, "classify")
    assert check_source_files(spec, "classify") is None
