"""The docs say what the code does: mechanical checks of docs/contracts.md and docs/errors.md.

contracts.md lists metrics.json's keys and the columns of steps.csv, activations.csv, runs.csv and
schedules.csv; a tiny CPU stage of each objective (a few seconds) is run and its files are compared
with those lists, both ways.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from engine_fixtures import TINY, make_prepared

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = (ROOT / "docs" / "contracts.md").read_text(encoding="utf-8")


def _strip_parens(text: str) -> str:
    while True:
        new = re.sub(r"\([^()]*\)", "", text)
        if new == text:
            return new
        text = new


def documented_metrics_keys() -> set[str]:
    """The keys contracts.md's "metrics.json" section names under Identity, Dtypes, ..., Resume."""
    sec = CONTRACTS.split("## metrics.json")[1].split("\n## ")[0]
    header, *paras = re.split(r"\n(?=[A-Z][A-Za-z ]*: )", sec)
    names = {"grad_norm", "tags", "hparams"}  # the dicts the section's title names
    for para in paras:
        label = para.split(":", 1)[0]
        if label in ("Time detail", "Status"):  # prose about steps.csv and the status values
            continue
        for span in re.findall(r"`([^`]*)`", _strip_parens(para.split(":", 1)[1])):
            for item in re.sub(r"\{[^}]*\}", "", span).split(","):
                if re.fullmatch(r"[a-z][a-z0-9_]*", item.strip()) and item.strip() != "null":  # a JSON value
                    names.add(item.strip())
    return names


@pytest.fixture(scope="module")
def stage_runs(tmp_path_factory):
    """metrics.json etc. of a tiny amp_fp16 masked-LM stage (telemetry on) and an fp32 classify stage from it."""
    from precswitch.cli import main

    root = tmp_path_factory.mktemp("stages")
    mlm = make_prepared(root, "mlm", n_train=32, n_eval=16)
    cls = make_prepared(root, "classify", n_train=32, n_eval=16)
    base = {"tokenizer": str(root / "tokenizer"), "model": TINY, "batch_size": 8, "eval_batch_size": 8,
            "threads": 1, "seed": 1, "timing_warmup_steps": 1}
    p, f = root / "p", root / "f"
    assert main(["train", "--hparams", json.dumps({
        **base, "data": str(mlm), "objective": "mlm", "stage": "pretrain", "precision": "amp_fp16", "steps": 3,
        "telemetry_every": 2, "run_id": "p"}), "--out", str(p)]) == 0
    assert main(["train", "--hparams", json.dumps({
        **base, "data": str(cls), "objective": "classify", "stage": "finetune", "precision": "fp32", "steps": 2,
        "init": str(p / "checkpoint"), "tags": {"schedule": "fp16-fp32"}, "run_id": "f"}), "--out", str(f)]) == 0
    return {"pretrain": p, "finetune": f}


def test_metrics_json_keys_are_the_documented_ones(stage_runs):
    written = set()
    for out in stage_runs.values():
        written |= set(json.loads((out / "metrics.json").read_text()))
    documented = documented_metrics_keys()
    assert not documented - written, f"contracts.md lists keys a CPU stage's metrics.json lacks: {sorted(documented - written)}"
    assert not written - documented, f"metrics.json keys contracts.md does not list: {sorted(written - documented)}"
    gn = json.loads((stage_runs["pretrain"] / "metrics.json").read_text())["grad_norm"]
    doc_gn = re.search(r"grad_norm \{([^}]*)\}", CONTRACTS).group(1)
    assert set(gn) == {k.strip() for k in doc_gn.split(",")}


def _columns(phrase: str) -> list[str]:
    """The backticked column list right after ``phrase`` in contracts.md."""
    m = re.search(re.escape(phrase) + r"[^`]*`([^`]*)`", CONTRACTS)
    assert m, phrase
    return [c.strip() for c in m.group(1).split(",")]


def _header(path: Path) -> list[str]:
    with open(path, newline="") as f:
        return next(csv.reader(f))


def test_steps_and_activations_csv_columns_are_the_documented_ones(stage_runs):
    for out in stage_runs.values():
        assert _header(out / "steps.csv") == _columns("`DIR/steps.csv` (columns")
    assert _header(stage_runs["pretrain"] / "activations.csv") == _columns("`telemetry_every` > 0; columns")


def _backticked_names(text: str) -> set[str]:
    return {n.strip() for span in re.findall(r"`([^`]*)`", text) for n in span.split(",")
            if re.fullmatch(r"[a-z][a-z0-9_]*", n.strip())}


def test_runs_and_schedules_tables_have_the_documented_columns(stage_runs, tmp_path):
    from precswitch.analysis.aggregate import SCHEDULE_COLUMNS, aggregate

    runs, schedules = aggregate([out / "metrics.json" for out in stage_runs.values()], tmp_path)
    flat = set()
    for out in stage_runs.values():
        flat |= {k for k, v in json.loads((out / "metrics.json").read_text()).items() if not isinstance(v, dict)}
    runs_doc = CONTRACTS.split("\nruns.csv:")[1].split("\nschedules.csv:")[0]
    extra = set(runs.columns) - flat
    assert extra <= _backticked_names(runs_doc), f"runs.csv columns contracts.md does not name: {sorted(extra - _backticked_names(runs_doc))}"
    sched_doc = CONTRACTS.split("\nschedules.csv:")[1].split(", in this order")[0]
    documented = [c.strip() for c in re.search(r"`([^`]*)`", sched_doc, re.S).group(1).replace("\n", " ").split(",")]
    assert documented == SCHEDULE_COLUMNS
    assert list(schedules.columns[:len(SCHEDULE_COLUMNS)]) == SCHEDULE_COLUMNS


def test_contracts_hparams_block_names_every_engine_hyperparameter():
    from precswitch.train.config import DEFAULTS

    sec = CONTRACTS.split("## Stage hyper-parameters")[1]
    block = sec.split("```yaml")[1].split("```")[0]
    words = set(re.findall(r"[a-z][a-z0-9_]*", block))
    missing = sorted(k for k in [*DEFAULTS, *DEFAULTS["model"]] if k not in words)
    assert not missing, f"precswitch.train.config.DEFAULTS keys contracts.md's hparams block lacks: {missing}"


# --------------------------------------------------------------------------- test files the docs and code name
def test_every_test_the_docs_and_code_name_exists():
    """`test_x.py` and `test_x.py::test_y` named in the docs, the code or the benchmarks (docs/errors.md points each
    refusal at its test) are files of tests/, and test_y a test in it: a renamed or folded test leaves no stale name."""
    texts = [p for d in ("docs", "config", "src", "benchmarks", "workflow") for p in (ROOT / d).rglob("*")
             if p.suffix in (".md", ".py", ".yaml", ".sh", ".smk", ".rst")] + [ROOT / "README.md"]
    stale = set()
    for path in texts:
        for file, name in re.findall(r"\b(test_[a-z0-9_]+\.py)(?:::(test_[a-z0-9_]+))?", path.read_text("utf-8")):
            test = ROOT / "tests" / file
            if not test.is_file() or (name and not re.search(rf"^def {name}\(", test.read_text("utf-8"), re.M)):
                stale.add(f"{path.relative_to(ROOT)}: {file}{'::' + name if name else ''}")
    assert not stale, sorted(stale)


# --------------------------------------------------------------------------- CLI options, config keys, precisions


def test_plots_help_names_every_plot():
    from precswitch.analysis.plots import PLOT_NAMES
    from precswitch.cli import build_parser

    import argparse

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["plots"]
    missing = [p for p in PLOT_NAMES if p not in sub.format_help()]
    assert not missing, f"precswitch plots --help does not name {missing}"


def test_precision_tables_match_the_catalog():
    """README.md's and config/README.md's precision tables: one row per catalog name, in catalog order;
    loss scaling 'dynamic' exactly for the precisions with a loss scaler (amp_fp16, pure_fp16)."""
    from precswitch import precision as P

    for doc in (ROOT / "README.md", ROOT / "config" / "README.md"):
        rows = [[c.strip() for c in line.strip().strip("|").split("|")]
                for line in doc.read_text(encoding="utf-8").splitlines() if re.match(r"\| `[a-z0-9_]+` \|", line)]
        assert [r[0].strip("`") for r in rows] == list(P.NAMES), doc
        for r in rows:
            name = r[0].strip("`")
            assert (r[3] == "dynamic") == P.CATALOG[name].loss_scaling, f"{doc.name}: {name} loss scaling {r[3]!r}"
            assert (r[3] == "none") == (not P.CATALOG[name].loss_scaling), f"{doc.name}: {name} loss scaling {r[3]!r}"
        assert "TF32 off" in dict((r[0].strip("`"), r[2]) for r in rows)["fp32"], doc


def test_data_source_spec_names_every_loader_key_and_the_schema_has_them():
    import yaml

    from precswitch.data.loading import SPEC_KEYS

    block = CONTRACTS.split("## Data source spec")[1].split("```yaml")[1].split("```")[0]
    named = set(re.findall(r"(?:^|[\s#,])([a-z_]+):", block, re.M))
    assert SPEC_KEYS <= named, f"contracts.md's source spec lacks {sorted(SPEC_KEYS - named)}"
    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text(encoding="utf-8"))
    for stage in ("pretrain", "finetune"):
        node = schema["properties"]["data"]["properties"][stage]
        if "$ref" in node:
            node = schema["$defs"][node["$ref"].split("/")[-1]]
        props = set(node["properties"])
        assert props == SPEC_KEYS - {"dir"}, f"data.{stage}: schema {sorted(props)} vs loader {sorted(SPEC_KEYS)}"


def test_prepared_meta_json_keys_are_the_documented_ones(tmp_path):
    """`precswitch synth/tokenizer/prepare` in-process on a small synthetic language, both objectives."""
    from precswitch.cli import main

    para = CONTRACTS.split("`DIR/meta.json`:")[1].split("\n\n")[0]
    spans = re.findall(r"`([^`]*)`", para)
    documented = set(re.findall(r'"([a-z_]+)"', spans[0])) | {s for s in spans[1:] if re.fullmatch(r"[a-z_]+", s)}
    src = json.dumps({"kind": "synthetic", "dir": str(tmp_path / "s")})
    assert main(["synth", "--out", str(tmp_path / "s"), "--seed", "0", "--n-corpus", "200", "--n-train", "40",
                 "--n-dev", "20"]) == 0
    assert main(["tokenizer", "--source", src, "--out", str(tmp_path / "tok"), "--vocab-size", "400"]) == 0
    written = set()
    for objective in ("mlm", "classify"):
        out = tmp_path / objective
        assert main(["prepare", "--source", src, "--tokenizer", str(tmp_path / "tok"), "--objective", objective,
                     "--max-length", "32", "--out", str(out)]) == 0
        written |= set(json.loads((out / "meta.json").read_text()))
    assert written == documented, (f"meta.json keys contracts.md does not list: {sorted(written - documented)}; "
                                   f"listed but not written: {sorted(documented - written)}")


def test_summary_and_deltas_columns_are_explained(tmp_path):
    """Every column of summary.csv and deltas.csv (a fake study through aggregate and stats) is named in its
    report caption (workflow/report/summary.rst, deltas.rst) or in docs/analysis.md's table section."""
    import pandas as pd

    from precswitch.analysis.aggregate import aggregate
    from precswitch.analysis.fakes import write_fake_study
    from precswitch.analysis.settings import load_settings
    from precswitch.analysis.cli import run_stats

    paths = write_fake_study(tmp_path / "study", seeds=range(1, 4))
    aggregate(paths, tmp_path / "out")
    run_stats(tmp_path / "out" / "runs.csv", tmp_path / "out" / "schedules.csv",
              load_settings(None, bootstrap_resamples=0), tmp_path / "out")
    analysis = (ROOT / "docs" / "analysis.md").read_text(encoding="utf-8").split("## Tables")[1].split("\n## ")[0]
    for table in ("summary", "deltas"):
        caption = (ROOT / "workflow" / "report" / f"{table}.rst").read_text(encoding="utf-8")
        named = set(re.findall(r"``([a-z_0-9]+)``", caption)) | _backticked_names(analysis)
        named |= {n for span in re.findall(r"`([^`]*)`", analysis) for n in re.findall(r"[a-z_0-9]+", span)}
        columns = set(pd.read_csv(tmp_path / "out" / f"{table}.csv").columns)
        assert not columns - named, f"{table}.csv columns neither {table}.rst nor analysis.md names: {sorted(columns - named)}"


MRPC_TRAIN_ROWS = 3668  # GLUE MRPC's training pairs (the GPU configs' stage 2; benchmarks/gpu_hours.py's default)


