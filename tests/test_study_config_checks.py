"""A bad study config is refused before the DAG is built, in one line naming the config key (precswitch.study:
the schema, then the checks it cannot express). One case per rule; each asserts the key (and, where the value
is the point, a label). docs/errors.md lists the refusals."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from workflow_helpers import ROOT, SNAKEFILE, write_config

from precswitch import schema, study
from precswitch.study import ConfigError

sys.path.insert(0, str(ROOT / "benchmarks"))
import bad_inputs as B  # noqa: E402

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
X = {"analysis": {"baseline": "x", "contrasts": []}}


def _x(**stages):
    return {"schedules": {"x": stages}, **X}


def _switch(at):
    return {"precision": "amp_bf16", "switch_to": "fp32", "switch_at": at}


CASES = [
    # the schema: types, ranges, names (a hint for a bare 16-bit name)
    ({"schedule": {}}, "(top level)", ""),
    (_x(pretrain="fp64", finetune="fp32"), "schedules.x.pretrain", "amp_bf16"),
    (_x(pretrain="bf16", finetune="fp32"), "schedules.x.pretrain", "ambiguous"),
    (_x(pretrain=16, finetune="fp32"), "schedules.x.pretrain", ""),
    ({"schedules": {"a/b": {"finetune": "fp32"}}, "analysis": {"baseline": "a/b"}}, "schedules", ""),
    ({"train": {"finetune": {"eval_precision": "bf16"}}}, "train.finetune.eval_precision", "ambiguous"),
    ({"model": {"hidden_size": "big"}}, "model.hidden_size", ""),
    ({"seeds": [1, 2**32]}, "seeds.1", ""),
    ({"seeds": []}, "seeds", ""),
    ({"seeds": [1, 2, 1]}, "seeds", ""),
    ({"train": {"pretrain": {"steps": 0}}}, "train.pretrain.steps", ""),
    ({"train": {"finetune": {"lr": "2e-5"}}}, "train.finetune.lr", "write 2.0e-05"),  # YAML 1.1 reads it as text
    ({"train": {"finetune": {"lr": float("nan")}}}, "train.finetune.lr", ""),
    ({"analysis": {"margin": 150}}, "analysis.margin", ""),
    ({"device": "tpu"}, "device", ""),
    ({"data": {"finetune": {"kind": "xlsx"}}}, "data.finetune.kind", ""),
    ({"model": {"init": "bert-base-cased", "revision": ""}}, "model.revision", ""),
    (_x(pretrain={"precision": "pure_fp16", "overrides": {"steps": 10}}, finetune="fp32"),
     "schedules.x.pretrain.overrides", ""),
    (_x(finetune={"precision": "fp32", "overrides": {"lr": 0}}), "schedules.x.finetune.overrides.lr", ""),
    (_x(finetune={"precision": "fp32", "overrides": {"lr": float("nan")}}), "schedules.x.finetune.overrides.lr", ""),
    # results_dir: no wildcard or shell characters, a folder, not among the checkout's code (issue 42)
    ({"results_dir": "res{x}"}, "results_dir", ""),
    ({"results_dir": "res;rm"}, "results_dir", ""),
    ({"results_dir": "./"}, "results_dir", ""),
    ({"results_dir": str(ROOT / "pyproject.toml")}, "results_dir", ""),
    ({"results_dir": "src"}, "results_dir", "src"),
    ({"results_dir": str(ROOT / "workflow" / "results")}, "results_dir", "workflow"),
    ({"results_dir": str(ROOT)}, "results_dir", ""),
    # the checks a schema cannot express
    ({"analysis": {"baseline": "fp64-fp64"}}, "analysis.baseline", ""),
    ({"analysis": {"contrasts": [["fp16-fp32", "fp16-fp61"]]}}, "analysis.contrasts[0]", "fp16-fp61"),
    ({"analysis": {"contrasts": [["fp16-fp16", "fp16-fp16"]]}}, "analysis.contrasts[0]", ""),
    ({"analysis": {"alpha": 0.5, "power": 0.5}}, "analysis.power", ""),
    (_x(pretrain="fp32", finetune="fp8") | {"train": {"finetune": {"eval_precision": "fp32"}}},
     "train.finetune.eval_precision", ""),
    (_x(pretrain=_switch(0.001), finetune="fp32") | {"train": {"pretrain": {"steps": 300}}},
     "schedules.x.pretrain.switch_at", "rounds to step 0"),
    (_x(finetune={"precision": "pure_bf16", "switch_to": "pure_bf16_kahan", "switch_at": 0.5}),
     "schedules.x.finetune.switch_to", ""),
    ({"sweeps": {"s": {"pretrain": {"precision": "amp_fp16", "switch_to": "fp32"}, "finetune": "fp32",
                       "switch_at": [0.0, 0.001, 1.0]}}, "train": {"pretrain": {"steps": 300}}},
     "schedules.s-at0.1.pretrain.switch_at", ""),
    ({"sweeps": {"s": {"pretrain": {"precision": "amp_fp16", "switch_to": "fp32"},
                       "finetune": {"precision": "amp_fp16", "switch_to": "fp32"}, "switch_at": [0.5]}}}, "sweeps.s", ""),
    ({"train": {"pretrain": {"steps": None}}}, "train.pretrain.steps", ""),
    ({"train": {"pretrain": {"compile": "default", "telemetry_every": 5}}}, "train.pretrain.compile", ""),
    ({"train": {"pretrain": {"steps": 5, "timing_warmup_steps": 5}}}, "train.pretrain.timing_warmup_steps", ""),
    (_x(pretrain={"precision": "pure_fp16", "overrides": {"adam_eps": 1.0e-6}}, finetune="fp32"),
     "schedules.x.pretrain.overrides.adam_eps", ""),
    ({"data": {"synthetic": {"n_train": 10}}}, "train.finetune.batch_size", ""),
    ({"data": {"pretrain": {"kind": "synthetic", "max_train_rows": 4}}}, "train.pretrain.batch_size", ""),
    ({"device": "cpu", **_x(pretrain="fp32", finetune="tf32")}, "schedules.x.finetune", "tf32"),
    ({"model": {"hidden_size": 100, "num_attention_heads": 3}}, "model.num_attention_heads", ""),
    ({"model": {"max_position_embeddings": 16}}, "train.pretrain.max_length", ""),
    ({"model": {"revision": "v1"}}, "model.revision", ""),
    ({"model": {"init": "./nope"}}, "model.init", ""),
    ({"model": {"init": str(ROOT / "workflow")}}, "model.init", ""),
    ({"data": {"pretrain": {"kind": "synthetic", "revision": "v1"}}}, "data.pretrain.revision", ""),
    ({"data": {"finetune": {"kind": "tsv", "train": "missing/train.tsv", "eval": "missing/dev.tsv"}}},
     "data.finetune", "missing/train.tsv"),
    ({"data": {"pretrain": {"kind": "text", "train": [str(ROOT / "tests")]}}}, "data.pretrain", ""),
    ({"data": {"finetune": {"kind": "synthetic", "train": str(ROOT / "README.md")}}}, "data.finetune.train", ""),
    ({"data": {"finetune": {"kind": "text", "train": [str(ROOT / "README.md")]}}}, "data.finetune.kind", ""),
    ({"data": {"finetune": {"kind": "hub", "config": "mrpc"}}}, "data.finetune.name", ""),
    ({"data": {"pretrain": {"kind": "tsv", "train": str(ROOT / "README.md"), "eval": str(ROOT / "README.md")}}},
     "data.pretrain.kind", ""),
    # names that cannot be folders or wildcard values (issue 40)
    ({"schedules": {"n" * 300: {"finetune": "fp32"}}, "analysis": {"baseline": "n" * 300}}, "schedules.", "300"),
    ({"schedules": {"x" + "ab" * 30: {"finetune": "fp32"}}, "analysis": {"baseline": "x" + "ab" * 30}},
     "schedules.x" + "ab" * 30, "periodic"),
]


@pytest.mark.parametrize("cfg, key, label", CASES)
def test_a_bad_config_is_refused_naming_its_key(cfg, key, label):
    with pytest.raises(ConfigError) as e:
        study.check(cfg)
    assert e.value.key.startswith(key) if key.endswith(".") else e.value.key == key, str(e.value)
    assert label in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, key", [
    ("train: {finetune: {batch_size: 16.0}}", "train.finetune.batch_size"),
    ("schedules: {on: {finetune: fp32}}", "schedules.True"),
    ("seeds: [1]\nseeds: [2]", "seeds"),
    ("results_dir: src", "results_dir"),
    ("results_dir: /proc/precswitch-results", "results_dir"),
])
def test_a_refusal_through_snakemake_is_the_line_alone(text, key, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text + "\n")
    r = subprocess.run([SNAKEMAKE, "-n", "--cores", "1", "-s", str(SNAKEFILE), "--directory", str(ROOT),
                        "--configfile", str(cfg)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 1 and [line for line in lines if line.startswith("Error: ")] == [
        next(line for line in lines if line.startswith(f"Error: config key {key}:"))], r.stderr
    assert not any("Traceback" in line or 'File "' in line for line in lines) and "Job stats" not in r.stdout


def test_a_malformed_config_file_is_refused_before_anything_runs(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("schedules:\n  x: {pretrain: fp32, finetune: fp32\nseeds: [1\n")
    r = subprocess.run([SNAKEMAKE, "-n", "-s", str(SNAKEFILE), "--directory", str(ROOT), "--configfile", str(bad)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode != 0 and "not valid JSON or YAML" in r.stderr + r.stdout and "Job stats" not in r.stdout


def _integer_keys(node, path=()):
    """(path, schema node) of every key of the schema whose type is integer (not number)."""
    types = [node["type"]] if isinstance(node.get("type"), str) else node.get("type") or []
    if "integer" in types and path:
        yield path, node
    for k, child in node.get("properties", {}).items():
        yield from _integer_keys(child, (*path, k))
    for ref in [node.get("then", {}).get("$ref", "")] + [part.get("$ref", "") for part in node.get("allOf", [])]:
        if ref.startswith("#/$defs/"):
            yield from _integer_keys(schema.load()["$defs"][ref.rsplit("/", 1)[1]], path)


@pytest.mark.parametrize("path, node", list(_integer_keys(schema.load())), ids=lambda v: ".".join(v) if
                         isinstance(v, tuple) else "")
def test_every_integer_key_refuses_a_whole_number_float_naming_it(path, node, tmp_path, monkeypatch):
    """JSON Schema counts 16.0 as an integer; the trainer does not: refused when the config is read."""
    monkeypatch.chdir(tmp_path)
    default = node.get("default")
    value = float(default if isinstance(default, int) and default > 0 else 4)
    cfg = value
    for k in reversed(path):
        cfg = {k: cfg}
    with pytest.raises(ConfigError) as e:
        study.check(cfg)
    assert e.value.key == ".".join(path)


@pytest.mark.parametrize("text, key", [
    ("schedules: {on: {finetune: fp32}}", "schedules.True"),
    ("schedules: {null: {finetune: fp32}}", "schedules.None"),
    ("schedules: {2024: {finetune: fp32}}", "schedules.2024"),
    ("data: {finetune: {kind: tsv, columns: {1: a}}}", "data.finetune.columns.1"),
])
def test_a_name_yaml_reads_as_a_bool_null_or_number_is_named(text, key, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        study.check(yaml.safe_load(text))
    assert e.value.key == key


def test_a_key_written_twice_is_named_with_its_file_and_lines(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("seeds: [1]\ntrain:\n  finetune:\n    batch_size: 16\n    lr: 1.0e-4\n    batch_size: 8\n")
    with pytest.raises(ConfigError) as e:
        study.check_config_files([f])
    assert e.value.key == "train.finetune.batch_size" and str(f) in str(e.value) and "4 and 6" in str(e.value)
    f.write_text("a: {b: 1}\nc: [{b: 1}, {b: 2}]\n")  # the same key in two mappings is no duplicate
    study.check_config_files([f])


def test_a_results_dir_that_cannot_be_created_or_written_is_named(tmp_path, monkeypatch):
    (tmp_path / "f").write_text("x")
    for bad in ("/proc/precswitch-results", str(tmp_path / "f" / "results")):
        with pytest.raises(ConfigError) as e:
            study.check({"results_dir": bad})
        assert e.value.key == "results_dir"
    import tempfile

    def read_only(*a, **k):  # root can write any folder: the file system's answer is simulated
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    for where in (tmp_path / "new", tmp_path):
        with pytest.raises(ConfigError, match="Read-only file system") as e:
            study.check({"results_dir": str(where)})
        assert e.value.key == "results_dir"


def test_reading_a_cpu_study_config_does_not_import_torch(tmp_path):
    """Every dry run reads the config: precswitch.study and the precision names are torch-free."""
    cfg = {"schedules": {"x": {"pretrain": _switch(0.5), "finetune": "pure_bf16"}}, **X, "seeds": [1],
           "device": "cpu", "sweeps": {"s": {"finetune": {"precision": "amp_bf16", "switch_to": "fp32"},
                                             "switch_at": [0.5]}}}
    path = write_config(tmp_path / "study.yaml", cfg)
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "snakemake", "-s", str(SNAKEFILE), "-d",
                           str(tmp_path), "-n", "--configfile", str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "s-at50" in proc.stdout, (proc.stdout + proc.stderr)[-3000:]
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    assert "precswitch.study" in imported and "torch" not in imported


@pytest.mark.parametrize("case, text, names", B.CONFIGS, ids=[c[0] for c in B.CONFIGS])
def test_each_bad_config_of_the_catalog_is_one_line_naming_the_key(case, text, names, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert B.verdict(B.run_config(text, tmp_path), names) is None


@pytest.mark.parametrize("case, files, text, names", B.DATA, ids=[c[0] for c in B.DATA])
def test_each_bad_data_file_of_the_catalog_is_refused_before_training(case, files, text, names, tmp_path,
                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert B.verdict(B.run_data(files, text, tmp_path), names) is None
