"""Load a data source (docs/contracts.md, "Data source spec") into ``datasets.Dataset`` splits.

The result has uniform columns whatever the source:

* objective ``mlm``: ``text``
* objective ``classify``: ``text_a``, ``text_b`` (only for pairs) and ``label`` (int class index, the
  position of the raw label value in ``label_values``).

Every failure caused by the input raises :class:`precswitch.errors.PrecswitchError` naming the file,
column or key and what is allowed.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PrecswitchError
from ..io import load_mapping_arg

KINDS = ("synthetic", "text", "tsv", "csv", "jsonl", "parquet", "hub")
OBJECTIVES = ("mlm", "classify")
SPEC_KEYS = {
    "kind", "dir", "train", "eval", "columns", "name", "config", "train_split", "eval_split",
    "text_column", "labels", "max_train_rows", "max_eval_rows", "eval_fraction", "mlm_examples", "revision",
    "test", "test_split",
}
#: kinds whose classification data is a table file per split (they take an optional ``test`` file)
TABLE_KINDS = ("tsv", "csv", "jsonl", "parquet")
#: WikiText heading lines: `` = Title = ``, `` = = Section = = `` ...
HEADING_RE = re.compile(r"^\s*(=\s+)+\S.*?(\s+=)+\s*$")
#: Share of lines held out for eval when an MLM source has no eval files (synthetic corpus, text without eval).
DEFAULT_EVAL_FRACTION = 0.05
#: ... but at most this many lines, so that a large corpus does not get a huge eval set; when the cap applies,
#: ``prepare`` says so and meta.json records the requested fraction, the cap and the lines held out.
MAX_AUTO_EVAL_LINES = 2000

GLUE_MRPC_COLUMNS = {"text_a": "#1 String", "text_b": "#2 String", "label": "Quality"}


@dataclass
class LoadedSource:
    """Loaded splits in the uniform layout (see module docstring)."""

    objective: str
    train: Any  # datasets.Dataset
    eval: Any  # datasets.Dataset
    label_values: list | None = None
    spec: dict = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    #: the held-out tail split of an MLM source without eval files (see :func:`_split_tail`), else None
    held_out: dict | None = None
    #: rows dropped per split ("train", "eval", "test") because a mapped text or label cell is empty
    dropped: dict = field(default_factory=dict)
    #: the held-out test split (classify only: synthetic test.tsv, a table source's ``test`` file, a hub source's
    #: ``test_split``), else None
    test: Any = None

    def notes(self) -> list[str]:
        """One line per thing a user should know about how the splits were made (for the prepare log)."""
        out = []
        h = self.held_out
        if h and h["capped"]:
            out.append(f"eval_fraction {h['eval_fraction']:g} of the {h['lines']} lines of {h['where']} would hold out "
                       f"{h['eval_lines_requested']} lines, above the cap of {h['eval_lines_cap']} held-out lines: "
                       f"{h['eval_lines']} lines ({100 * h['eval_fraction_effective']:.2f}%) held out for eval, "
                       f"{h['lines'] - h['eval_lines']} for training")
        for split, (n, total, where) in self.dropped.items():
            if n:
                out.append(f"warning: {split} split ({where}): {n} of {total} rows dropped (empty text or label "
                           "cell)")
        return out


# --------------------------------------------------------------------------- spec parsing


def parse_source(value: str | dict | os.PathLike) -> dict:
    """A source spec from a dict, a JSON string, ``@file.json``, or a path to a ``.json``/``.yaml`` file."""
    if isinstance(value, dict):
        spec = dict(value)
    else:
        spec = load_mapping_arg(value, "--source")
    return validate_spec(spec)


def validate_spec(spec: dict) -> dict:
    kind = spec.get("kind")
    if kind not in KINDS:
        raise PrecswitchError(f"source: unknown kind {kind!r} (allowed: {', '.join(KINDS)})")
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise PrecswitchError(f"source: unknown key(s) {unknown} (allowed: {sorted(SPEC_KEYS)})")
    need = {"synthetic": ["dir"], "text": ["train"], "hub": ["name"]}.get(kind, ["train", "eval"])
    for k in need:
        if spec.get(k) in (None, "", []):
            raise PrecswitchError(f"source (kind {kind}): key {k!r} is required")
    if spec.get("test") is not None and kind not in TABLE_KINDS:
        raise PrecswitchError(f"source: test (a file) is for kinds {', '.join(TABLE_KINDS)}; this source is kind "
                              f"{kind}" + (" (use test_split)" if kind == "hub" else ""))
    if spec.get("test_split") is not None and kind != "hub":
        raise PrecswitchError(f"source: test_split is for kind hub only; this source is kind {kind}"
                              + (" (use test: a file)" if kind in TABLE_KINDS else ""))
    if kind in TABLE_KINDS:
        for k in ("train", "eval", "test"):
            if k == "test" and spec.get(k) is None:
                continue
            if not isinstance(spec[k], (str, os.PathLike)):
                raise PrecswitchError(f"source (kind {kind}): {k} takes one file path, not a list, got {spec[k]!r}")
    rev = spec.get("revision")
    if rev is not None:
        if kind != "hub":
            raise PrecswitchError(f"source: revision is for kind hub only (a hub branch, tag or commit); this source is "
                                  f"kind {kind}")
        if not isinstance(rev, str) or not rev.strip():
            raise PrecswitchError(f"source: revision must be a branch, tag or commit (text) or null, got {rev!r}")
    for k in ("max_train_rows", "max_eval_rows"):
        v = spec.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise PrecswitchError(f"source: {k} must be a positive integer or null, got {v!r}")
    if spec.get("labels") is not None and (not isinstance(spec["labels"], list) or not spec["labels"]):
        raise PrecswitchError(f"source: labels must be a non-empty list, got {spec['labels']!r}")
    if spec.get("mlm_examples") not in (None, "pairs", "lines", "pack"):
        raise PrecswitchError(f"source: mlm_examples {spec['mlm_examples']!r} not allowed (allowed: pairs, lines, pack)")
    frac = spec.get("eval_fraction")
    if frac is not None and not (isinstance(frac, (int, float)) and 0 < frac < 1):
        raise PrecswitchError(f"source: eval_fraction must be in (0, 1), got {frac!r}")
    return spec


def source_files(spec: dict, objective: str | None = None) -> list[Path]:
    """Local files a source reads (for hashing and existence checks)."""
    kind = spec["kind"]
    if kind == "synthetic":
        d = Path(spec["dir"])
        if objective == "mlm":
            return [d / "corpus.txt"]
        if objective == "classify":  # test.tsv: written by synth since issue 38 (older dirs have none)
            return [d / "train.tsv", d / "dev.tsv"] + ([d / "test.tsv"] if (d / "test.tsv").is_file() else [])
        return [d / "corpus.txt", d / "train.tsv"]
    if kind == "hub":
        return []
    files: list[Path] = []
    for key in ("train", "eval") + (("test",) if objective != "mlm" else ()):
        v = spec.get(key)
        if v is None:
            continue
        files += [Path(f) for f in (v if isinstance(v, list) else [v])]
    return files


def check_table_headers(spec: dict) -> None:
    """The column mapping of a local table source (tsv, csv, jsonl, parquet) against its files' headers: the
    first line, the first record, the parquet schema; cheap, so that the workflow names a misspelt column
    when it reads the config, not when it prepares the data while stage 1 already trains. Files that are
    missing or unreadable here are left to the loader, which says why."""
    kind = spec.get("kind")
    if isinstance(spec.get("columns"), dict):
        _require_distinct_columns(spec["columns"])
    if kind not in ("tsv", "csv", "jsonl", "parquet"):
        return
    for f in source_files(spec, "classify"):
        names = _header(kind, f) if f.is_file() else None
        if names is not None:
            _require_column_names(names, _columns(spec), str(f))
            _require_unique_header_columns(names, _columns(spec), str(f))


def _header(kind: str, f: Path) -> list[str] | None:
    import csv

    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            return list(pq.read_schema(f).names)
        with open(f, encoding="utf-8-sig", newline="") as fh:
            if kind == "jsonl":
                line = next((ln for ln in fh if ln.strip()), None)
                rec = json.loads(line) if line else None
                return list(rec) if isinstance(rec, dict) else None
            first = fh.readline().rstrip("\r\n")
            if not first:
                return None
            return first.split("\t") if kind == "tsv" else next(csv.reader([first]))
    except Exception:  # noqa: BLE001 - unreadable here: the loader reports it with its cause
        return None


def source_hash(spec: dict, objective: str | None = None) -> str:
    """sha256 over the canonical spec and the contents of its local files."""
    h = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode())
    for f in source_files(spec, objective):
        h.update(str(f.name).encode())
        if f.is_file():
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


def check_source_files(spec: dict, objective: str | None = None) -> None:
    """Raise if a local file the source names is missing."""
    if spec["kind"] == "synthetic":
        d = Path(spec["dir"])
        if not d.is_dir():
            raise PrecswitchError(f"source: synthetic dir not found: {d} (write it with `precswitch synth`)")
    _check_files(source_files(spec, objective), spec["kind"])


def _check_files(files: list[Path], what: str) -> None:
    for f in files:
        if f.is_dir():
            raise PrecswitchError(f"source: {what} file {f} is a directory; name the file(s) in it")
        if not f.is_file():
            raise PrecswitchError(f"source: {what} file not found: {f}")


# --------------------------------------------------------------------------- readers (datasets builders)


def _quiet() -> None:
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()


def _read_table(kind: str, files: list[Path]):
    """Read one split of a tabular file with the ``datasets`` builders."""
    import datasets

    _check_files(files, kind)
    data_files = [str(f) for f in files]
    # Only an empty cell is missing: pandas' default NA strings ("NA", "N/A", "null", "None", "nan", ...)
    # are text a sentence may be, and would silently drop the row.
    na = {"keep_default_na": False, "na_values": [""]}
    for f in files if kind in ("tsv", "csv") else ():  # rows with extra fields parse without error: see _ragged_line
        problem = _ragged_line(kind, f)
        if problem:
            raise PrecswitchError(f"source: cannot read {kind} file {f}: {problem}")
    try:
        if kind == "tsv":  # GLUE: no quoting, BOM in the header
            ds = datasets.load_dataset("csv", data_files=data_files, split="train", delimiter="\t",
                                       quoting=3, encoding="utf-8-sig", keep_in_memory=True, **na)
        elif kind == "csv":
            ds = datasets.load_dataset("csv", data_files=data_files, split="train", encoding="utf-8-sig",
                                       keep_in_memory=True, **na)
        elif kind == "jsonl":
            ds = datasets.load_dataset("json", data_files=data_files, split="train", keep_in_memory=True)
        elif kind == "parquet":
            ds = datasets.load_dataset("parquet", data_files=data_files, split="train", keep_in_memory=True)
        else:  # pragma: no cover - guarded by validate_spec
            raise PrecswitchError(f"source: unknown kind {kind!r}")
    except PrecswitchError:
        raise
    except Exception as e:  # noqa: BLE001 - a file datasets cannot parse is a user error
        msg = _error_text(e)
        for f in files:
            problem = _table_file_problem(kind, f)
            if problem:
                raise PrecswitchError(f"source: cannot read {kind} file {f}: {problem} (datasets: {msg})") from None
        raise PrecswitchError(f"source: cannot read {kind} file(s) {', '.join(data_files)}: {msg}") from None
    return ds


def _error_text(e: BaseException) -> str:
    """First line of an exception, with its innermost cause's first line (datasets wraps the parser's
    "Expected 5 fields in line 6, saw 6" in "An error occurred while generating the dataset")."""
    def first(x: BaseException) -> str:
        t = str(x).strip()
        return t.splitlines()[0] if t else type(x).__name__

    inner, seen = e, {id(e)}
    while (nxt := inner.__cause__ or inner.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        inner = nxt
    msg = first(e)
    return msg if inner is e or first(inner) == msg else f"{msg}: {first(inner)}"


def _table_file_problem(kind: str, f: Path) -> str | None:
    """Why a local table could not be read (empty, no data rows, a ragged line, a JSONL line that is not an
    object, not UTF-8); read only on the loader's failure path. None when no cause is found here."""
    if f.stat().st_size == 0:
        return "the file is empty"
    if kind == "parquet":
        try:
            import pyarrow.parquet as pq

            rows = pq.read_metadata(f).num_rows
        except Exception as e:  # noqa: BLE001
            return f"not a readable parquet file ({_error_text(e)})"
        return "the file has no data rows" if rows == 0 else None
    bad_utf8 = _text_file_problem([f])
    if bad_utf8:
        return bad_utf8.removeprefix(f"{f} ")
    if kind in ("tsv", "csv"):
        return _ragged_line(kind, f, whole=True)
    with open(f, encoding="utf-8-sig", newline="") as fh:
        if kind == "jsonl":
            n = 0
            for i, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                n += 1
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    return f"line {i} is not valid JSON ({e.msg}); each line must be one JSON object"
                if not isinstance(rec, dict):
                    what = {list: "an array", str: "a string", bool: "a boolean"}.get(type(rec), "a number"
                                                                                     if rec is not None else "null")
                    return (f"line {i} is {what}, not a JSON object; each line must be one object "
                            '{"column": value, ...}')
            return "the file has no data rows" if n == 0 else None
    return None


def _ragged_line(kind: str, f: Path, *, whole: bool = False) -> str | None:
    """The first line of a tsv/csv file with more fields than its header; ``whole``: or that the file has no
    header line or no data rows. Checked before the loader too: given rows that all have extra fields, pandas
    reads the extras as index columns without an error, and the columns after them shift."""
    import csv

    with open(f, encoding="utf-8-sig", newline="", errors="replace") as fh:
        if kind == "tsv":
            rows = ((i, ln.rstrip("\r\n").split("\t")) for i, ln in enumerate(fh, 1))
        else:
            reader = csv.reader(fh)
            rows = ((reader.line_num, row) for row in reader)  # line_num: the physical line a record ends on
        header, n = None, 0
        for i, row in rows:
            if not row or row == [""]:
                continue
            if header is None:
                header = row
                continue
            n += 1
            if len(row) > len(header):
                sep = "tab" if kind == "tsv" else "unquoted comma"
                return f"line {i} has {len(row)} fields, the header has {len(header)} (a stray {sep} in a text?)"
        if not whole:
            return None
        if header is None:
            return "the file has no header line"
        return "the file has a header but no data rows" if n == 0 else None


def _read_text_lines(files: list[Path]):
    """Plain text, one example a line; blank lines and `` = Heading = `` lines dropped (WikiText)."""
    import datasets

    _check_files(files, "text")
    try:
        ds = datasets.load_dataset("text", data_files=[str(f) for f in files], split="train", keep_in_memory=True)
    except Exception as e:  # noqa: BLE001 - name the file and why, not datasets' generation traceback
        raise PrecswitchError(f"source: cannot read text file(s): {_text_file_problem(files) or e}") from None
    ds = ds.filter(lambda b: [bool(t.strip()) and not HEADING_RE.match(t) for t in b["text"]], batched=True,
                   keep_in_memory=True)
    return ds.map(lambda b: {"text": [t.strip() for t in b["text"]]}, batched=True, keep_in_memory=True)


def _text_file_problem(files: list[Path]) -> str | None:
    """Which file made the text builder fail, and why (empty, not UTF-8); read only on that failure path."""
    for f in files:
        if f.stat().st_size == 0:
            return f"{f} is empty"
        with open(f, "rb") as fh:
            offset = 0
            dec = codecs.getincrementaldecoder("utf-8")()
            while chunk := fh.read(1 << 20):
                try:
                    dec.decode(chunk)
                except UnicodeDecodeError as e:
                    return f"{f} is not UTF-8 text (byte {chunk[e.start]:#04x} at offset {offset + e.start})"
                offset += len(chunk)
    return None


def _hub(spec: dict, split: str):
    import datasets

    name, config, revision = spec["name"], spec.get("config"), spec.get("revision")
    try:
        # revision: the pinned branch/tag/commit (offline, the cache must hold that revision)
        return datasets.load_dataset(name, config, split=split, **({"revision": revision} if revision else {}))
    except Exception as e:  # noqa: BLE001 - offline/missing/unknown split all become one clear line
        from ..fetch import datasets_offline

        offline = datasets_offline()
        hint = (" (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE/TRANSFORMERS_OFFLINE is set and it is not in the local "
                "cache: download it once online, or use a local file source: kind tsv/csv/jsonl/parquet/text)"
                ) if offline else ""
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PrecswitchError(
            f"source: cannot load hub dataset {name!r} config {config!r} split {split!r}"
            + (f" revision {revision!r}" if revision else "") + f"{hint}: {msg}"
        ) from None


def _split_tail(ds, fraction: float, where: str = "the source"):
    """Deterministic split: the last ``fraction`` of rows (at most MAX_AUTO_EVAL_LINES, at least 1) is eval.

    Returns ``(train, eval, info)``; ``info`` (LoadedSource.held_out, meta.json) records the requested
    fraction, the cap, the lines held out and whether the cap applied."""
    n = len(ds)
    if n < 2:
        raise PrecswitchError(f"source: only {n} text line(s) in {where}; need at least 2 to hold out an eval split")
    requested = max(1, int(round(n * fraction)))
    if requested >= n:
        raise PrecswitchError(f"source: eval_fraction {fraction:g} of the {n} lines of {where} holds out {requested} "
                              "lines, leaving no line for training; lower eval_fraction (or give more lines)")
    n_eval = min(MAX_AUTO_EVAL_LINES, requested)
    if n_eval > 1 and (n - n_eval) % 2:  # keep consecutive line pairs (2k, 2k+1) together
        n_eval -= 1
    info = {"where": where, "lines": n, "eval_fraction": fraction, "eval_lines_cap": MAX_AUTO_EVAL_LINES,
            "eval_lines_requested": requested, "eval_lines": n_eval, "eval_fraction_effective": n_eval / n,
            "capped": requested > MAX_AUTO_EVAL_LINES}
    return ds.select(range(n - n_eval)), ds.select(range(n - n_eval, n)), info


# --------------------------------------------------------------------------- uniform layout


def _columns(spec: dict) -> dict:
    cols = spec.get("columns")
    if cols is None:
        if spec["kind"] in ("tsv", "synthetic"):
            return dict(GLUE_MRPC_COLUMNS)
        raise PrecswitchError(f"source (kind {spec['kind']}): key 'columns' is required "
                              "({text_a: COL, text_b: COL|null, label: COL})")
    if not isinstance(cols, dict):
        raise PrecswitchError(f"source: columns must be a mapping, got {cols!r}")
    unknown = sorted(set(cols) - {"text_a", "text_b", "label"})
    if unknown:
        raise PrecswitchError(f"source: unknown columns key(s) {unknown} (allowed: text_a, text_b, label)")
    _require_distinct_columns(cols)
    return cols


def _require_distinct_columns(cols: dict) -> None:
    """text_a, text_b and label are three roles: one column named for two of them (text_b = text_a, label =
    text_a) fed the same text twice or a text as the label, and crashed the loader with a KeyError."""
    seen: list[tuple[str, Any]] = []
    for k in ("text_a", "text_b", "label"):
        c = cols.get(k)
        if c is None or c == "":
            continue
        for k0, c0 in seen:
            if c0 == c:
                raise PrecswitchError(f"source: columns {k0} and {k} both name column {c!r}; each role (text_a, "
                                      "text_b, label) needs its own column (text_b may be null)")
        seen.append((k, c))


def _require_unique_header_columns(names: list[str], wanted: dict[str, str | None], where: str) -> None:
    """A mapped column that a CSV/TSV header names twice: pandas reads the first and renames the second 's1.1',
    so the loader silently took one of two columns (and the header check called 's1.1' missing)."""
    for k, c in wanted.items():
        if c is not None and names.count(c) > 1:
            raise PrecswitchError(f"source: {where}: column {c!r} ({k}) appears {names.count(c)} times in the header; "
                                  "which one is meant is ambiguous: give each column its own name")


def _require_columns(ds, wanted: dict[str, str], where: str) -> None:
    _require_column_names(ds.column_names, wanted, where)


def _require_column_names(names: list[str], wanted: dict[str, str | None], where: str) -> None:
    """Raise naming each mapped column (key=column) that ``names`` lacks, and the columns there are."""
    missing = {k: c for k, c in wanted.items() if c is not None and c not in names}
    if missing:
        desc = ", ".join(f"{k}={c!r}" for k, c in missing.items())
        raise PrecswitchError(f"source: {where}: column(s) not found: {desc}; columns found: {_few(names)}")


def _to_mlm(ds, column: str, where: str):
    _require_columns(ds, {"text_column": column}, where)
    ds = ds.select_columns([column])
    if column != "text":
        ds = ds.rename_column(column, "text")
    return ds.filter(lambda b: [t is not None and bool(str(t).strip()) for t in b["text"]], batched=True,
                     keep_in_memory=True)


def _drop_note(before: int, ds, where: str) -> tuple[int, int, str]:
    """(rows dropped, rows read, where) for LoadedSource.dropped."""
    return before - len(ds), before, where


def _to_classify(ds, cols: dict, where: str):
    if not cols.get("text_a") or not cols.get("label"):
        raise PrecswitchError("source: columns needs text_a and label for objective classify "
                              f"(got {cols}); text_b may be null")
    wanted = {k: cols.get(k) for k in ("text_a", "text_b", "label")}
    _require_columns(ds, wanted, where)
    keep = [c for c in (wanted["text_a"], wanted["text_b"], wanted["label"]) if c]
    ds = ds.select_columns(keep)
    rename = {wanted[k]: k for k in ("text_a", "text_b", "label") if wanted[k] and wanted[k] != k}
    # rename via a temporary name to allow swaps such as {text_a: label, label: text_a}
    ds = ds.rename_columns({c: f"__ps_{k}" for c, k in rename.items()})
    ds = ds.rename_columns({f"__ps_{k}": k for k in rename.values()})

    def ok(b):
        n = len(b["label"])
        good = []
        for i in range(n):
            # text_b too: an empty cell is a null in CSV/TSV but "" in JSONL/parquet, and a whitespace-only one
            # is neither (both were kept and tokenized as "[CLS] a [SEP] [SEP]")
            texts = [b["text_a"][i]] + ([b["text_b"][i]] if "text_b" in b else [])
            good.append(b["label"][i] is not None and all(t is not None and bool(str(t).strip()) for t in texts))
        return good

    return ds.filter(ok, batched=True, keep_in_memory=True)


def _label_key(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return str(v)


#: labels read from the data (``labels`` not given): more classes than this, or a class with fewer rows than
#: RARE_LABEL_ROWS and under 1% of them, is refused as a likely wrong column or a typo; listing ``labels``
#: accepts it
MAX_INFERRED_LABELS = 100
RARE_LABEL_ROWS = 3


def _few(values: list, k: int = 10) -> str:
    """A list for an error message: at most k items, then how many more."""
    values = list(values)
    return str(values) if len(values) <= k else f"{values[:k]} ... and {len(values) - k} more"


def _check_inferred_labels(labels: list, where: str, column: str | None = None) -> None:
    """Labels taken from the training column: one stray value (a typo in one row) would silently make a
    binary task 3-class, and F1 macro instead of binary; a wrong column (an ID) makes hundreds of classes.
    In a small file one stray row is over 1% of the rows: the two strays a file's own text makes (the header
    row repeated inside the data, a label written with a space around it) are refused at any size."""
    from collections import Counter

    counts = Counter(_label_key(v) for v in labels)
    if column is not None and str(column) in counts:
        c = counts[str(column)]
        raise PrecswitchError(f"source: {where}: {c} row{'s' if c > 1 else ''} of the label column hold "
                              f"{str(column)!r}, the column's own name: a header row repeated inside the data "
                              "(files joined together?); remove those rows")
    by_stripped: dict[str, list[str]] = {}
    for v in counts:
        by_stripped.setdefault(v.strip(), []).append(v)
    twins = sorted((sorted(vs) for vs in by_stripped.values() if len(vs) > 1), key=str)
    if twins:
        shown = "; ".join(" and ".join(f"{v!r} ({counts[v]} row{'s' if counts[v] > 1 else ''})" for v in vs)
                          for vs in twins[:5])
        raise PrecswitchError(f"source: {where}: label values {shown} differ only in surrounding spaces, so they "
                              "would be different classes: fix the file, or list the classes in labels to refuse "
                              "the stray rows by name")
    if len(counts) > MAX_INFERRED_LABELS:
        raise PrecswitchError(f"source: {where}: the label column has {len(counts)} distinct values (e.g. "
                              f"{_few(sorted(counts), 5)}): is it the label column? List the classes in labels "
                              "to accept it")
    n = sum(counts.values())
    rare = sorted((v for v, c in counts.items() if c < RARE_LABEL_ROWS and c < 0.01 * n), key=str)
    if rare:
        shown = ", ".join(f"{v!r} ({counts[v]} row{'s' if counts[v] > 1 else ''})" for v in rare[:10])
        raise PrecswitchError(f"source: {where}: label value(s) {shown} of {n} rows: a typo? "
                              f"The classes are read from the data when labels is not given; list them in labels "
                              f"(e.g. {_few(sorted(v for v in counts if v not in rare), 5)}) to accept or refuse "
                              "such rows")


def _encode_labels(train, eval_, allowed: list | None, where_train: str, where_eval: str,
                   label_column: str | None = None, test=None, where_test: str | None = None):
    """The three splits with labels as class indices (the training rows' classes unless ``allowed``), and the
    class values; an eval or test label outside them is refused naming its file."""
    import datasets

    inferred = allowed is None
    train_keys = {_label_key(v) for v in train.unique("label")}
    if len(train_keys) < 2:
        v = train[0]["label"]
        raise PrecswitchError(f"source: {where_train}: every one of the {len(train)} training rows has label {v!r}; "
                              "a classifier needs training rows of at least 2 classes (is the label column the "
                              "right one, or did max_train_rows cut a file sorted by label?)")
    if inferred:
        found = sorted(set(train["label"]), key=lambda v: (not isinstance(v, (int, float)), v if
                                                           isinstance(v, (int, float)) else str(v)))
        allowed = [int(v) if isinstance(v, float) and v.is_integer() else v for v in found]
        _check_inferred_labels(train["label"], where_train, label_column)
    index = {_label_key(v): i for i, v in enumerate(allowed)}
    if len(index) != len(allowed):
        raise PrecswitchError(f"source: labels has duplicates: {allowed}")
    if len(allowed) < 2:
        raise PrecswitchError(f"source: labels must list at least 2 classes, got {allowed}")

    def enc(ds, where, is_eval):
        bad = sorted({_label_key(v) for v in ds.unique("label")} - set(index))
        if bad:
            hint = ("; YAML reads unquoted yes/no/true/false as booleans: quote them (labels: ['yes', 'no'])"
                    if any(isinstance(v, bool) for v in allowed) else "")
            if inferred and is_eval:
                hint += " (labels is not given: the classes are the training file's; list labels to name them)"
            raise PrecswitchError(f"source: {where}: label value(s) {_few(bad)} not in the allowed labels "
                                  f"{_few(allowed)}{hint}")
        ds = ds.map(lambda b: {"label": [index[_label_key(v)] for v in b["label"]]}, batched=True,
                    keep_in_memory=True)
        return ds.cast_column("label", datasets.Value("int64"))

    encoded = (enc(train, where_train, False), enc(eval_, where_eval, True),
               None if test is None else enc(test, where_test, True))
    unseen = [v for v in allowed if _label_key(v) not in train_keys]
    if unseen:  # a class the model never trains on: an extra output, and F1 becomes the macro F1 of > 2 classes
        raise PrecswitchError(f"source: {where_train}: labels lists {_few(unseen)}, which no training row has "
                              f"(the training rows have {_few(sorted(train.unique('label'), key=str))}); a class never "
                              "trained on is a mistake: remove it from labels (or check the file and column)")
    return (*encoded, allowed)


def load_source(spec: dict | str, objective: str) -> LoadedSource:
    """Load train/eval splits of a source for ``objective`` (``mlm`` or ``classify``)."""
    if objective not in OBJECTIVES:
        raise PrecswitchError(f"objective {objective!r} not allowed (allowed: {', '.join(OBJECTIVES)})")
    spec = parse_source(spec) if not isinstance(spec, dict) else validate_spec(dict(spec))
    _quiet()
    kind = spec["kind"]
    files = [str(f) for f in source_files(spec, objective)]
    frac = spec.get("eval_fraction") or DEFAULT_EVAL_FRACTION  # null = the default
    held_out = None
    test, where_test = None, None

    if kind == "synthetic":
        d = Path(spec["dir"])
        if not d.is_dir():
            raise PrecswitchError(f"source: synthetic dir not found: {d} (write it with `precswitch synth`)")
        if objective == "mlm":
            train, eval_, held_out = _split_tail(_read_text_lines([d / "corpus.txt"]), frac, str(d / "corpus.txt"))
            where = (str(d / "corpus.txt"), str(d / "corpus.txt") + " (held-out tail)")
        else:
            train, eval_ = _read_table("tsv", [d / "train.tsv"]), _read_table("tsv", [d / "dev.tsv"])
            where = (str(d / "train.tsv"), str(d / "dev.tsv"))
            if (d / "test.tsv").is_file():
                test, where_test = _read_table("tsv", [d / "test.tsv"]), str(d / "test.tsv")
    elif kind == "text":
        if objective != "mlm":
            raise PrecswitchError("source: kind text provides unlabelled lines: objective must be mlm")
        tr_files = [Path(f) for f in (spec["train"] if isinstance(spec["train"], list) else [spec["train"]])]
        train = _read_text_lines(tr_files)
        if spec.get("eval"):
            ev_files = [Path(f) for f in (spec["eval"] if isinstance(spec["eval"], list) else [spec["eval"]])]
            eval_ = _read_text_lines(ev_files)
            where = (", ".join(map(str, tr_files)), ", ".join(map(str, ev_files)))
        else:
            train, eval_, held_out = _split_tail(train, frac, ", ".join(map(str, tr_files)))
            where = (", ".join(map(str, tr_files)), "held-out tail of train")
    elif kind == "hub":
        train = _hub(spec, spec.get("train_split") or "train")
        eval_ = _hub(spec, spec.get("eval_split") or "validation")
        where = (f"hub {spec['name']}:{spec.get('train_split') or 'train'}",
                 f"hub {spec['name']}:{spec.get('eval_split') or 'validation'}")
        if spec.get("test_split") and objective == "classify":
            test, where_test = _hub(spec, spec["test_split"]), f"hub {spec['name']}:{spec['test_split']}"
    else:
        train = _read_table(kind, [Path(spec["train"])])
        eval_ = _read_table(kind, [Path(spec["eval"])])
        where = (str(spec["train"]), str(spec["eval"]))
        if spec.get("test") and objective == "classify":
            test, where_test = _read_table(kind, [Path(spec["test"])]), str(spec["test"])
    if objective == "mlm":  # a masked-LM stage has no test split
        test = None

    label_values = None
    if objective == "mlm":
        if kind in ("synthetic", "text"):
            col = "text"
        else:
            col = spec.get("text_column") or (spec.get("columns") or {}).get("text_a")
            if not col:
                raise PrecswitchError(f"source (kind {kind}, objective mlm): set text_column (or columns.text_a)")
        convert = lambda ds, w: _to_mlm(ds, col, w)  # noqa: E731
    else:
        cols = _columns(spec)
        convert = lambda ds, w: _to_classify(ds, cols, w)  # noqa: E731
    if kind in ("tsv", "csv"):  # the header as written: pandas renamed a repeated name ('s1' twice: 's1', 's1.1')
        wanted = {"text_column": col} if objective == "mlm" else cols
        for f in (spec["train"], spec["eval"]) + ((spec["test"],) if test is not None else ()):
            names = _header(kind, Path(f))
            if names is not None:
                _require_unique_header_columns(names, wanted, str(f))
    splits = {"train": (train, where[0]), "eval": (eval_, where[1])}
    if test is not None:
        splits["test"] = (test, where_test)
    read = {split: len(ds) for split, (ds, _) in splits.items()}
    splits = {split: (convert(ds, w), w) for split, (ds, w) in splits.items()}
    # rows with an empty text (or label) cell are dropped: the prepare log and meta.json say how many;
    # kind text/synthetic lines were read blank- and heading-free already, so nothing is counted for them
    dropped = {split: _drop_note(read[split], ds, w) for split, (ds, w) in splits.items()}
    # max_eval_rows caps both evaluation splits (eval and test)
    caps = {"train": spec.get("max_train_rows"), "eval": spec.get("max_eval_rows"), "test": spec.get("max_eval_rows")}
    splits = {split: (ds.select(range(min(len(ds), caps[split]))) if caps[split] else ds, w)
              for split, (ds, w) in splits.items()}
    for split, (ds, w) in splits.items():
        if len(ds) == 0:
            if kind in ("synthetic", "text"):
                why = "no line left once blank and ' = Heading = ' lines are dropped"
            elif read[split] == 0:
                why = "it has no data rows"
            else:
                why = f"all {read[split]} rows have an empty text or label cell"
            raise PrecswitchError(f"source: {split} split is empty after filtering ({w}): {why}")
    (train, _), (eval_, _) = splits["train"], splits["eval"]
    test = splits["test"][0] if "test" in splits else None
    if objective == "classify":
        train, eval_, test, label_values = _encode_labels(train, eval_, spec.get("labels"), where[0], where[1],
                                                          cols["label"] if kind in ("tsv", "csv") else None,
                                                          test=test, where_test=where_test)
    return LoadedSource(objective, train, eval_, label_values, spec, files, held_out, dropped, test)


def source_texts(spec: dict | str) -> list[str]:
    """All training text of a source, for tokenizer training.

    synthetic: corpus lines and both sentences of train pairs; text: train lines; tables/hub: ``text_a``
    (and ``text_b``) of train, or ``text_column`` when that is set.
    """
    spec = parse_source(spec) if not isinstance(spec, dict) else validate_spec(dict(spec))
    kind = spec["kind"]
    if kind == "synthetic":
        mlm = load_source(spec, "mlm")
        cls = load_source(spec, "classify")
        return list(mlm.train["text"]) + list(cls.train["text_a"]) + list(cls.train["text_b"])
    if kind == "text" or spec.get("text_column"):
        return list(load_source(spec, "mlm").train["text"])
    src = load_source(spec, "classify")
    texts = list(src.train["text_a"])
    if "text_b" in src.train.column_names:
        texts += list(src.train["text_b"])
    return texts
