"""The GPU study configs: schema-valid, what the issue asks for, and a Snakemake dry run of each as written
(hub names), plus the fetch rule on local stand-ins. Nothing is downloaded and nothing trains."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_data_fetch import make_tiny_model
from workflow_helpers import job_counts

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
CONFIGS = ["bert-base-mrpc.yaml", "bert-small-scratch.yaml"]
SCHEDULES = {
    "fp32-fp32": ("fp32", "fp32"),
    "fp16-fp32": ("amp_fp16", "fp32"),
    "fp16-fp16": ("amp_fp16", "amp_fp16"),
    "bf16-fp32": ("amp_bf16", "fp32"),
    "bf16-bf16": ("amp_bf16", "amp_bf16"),
    "purefp16-fp32": ("pure_fp16", "fp32"),
    "purebf16-fp32": ("pure_bf16", "fp32"),
    "tf32-tf32": ("tf32", "tf32"),
}


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / "config" / name).read_text())


@pytest.mark.parametrize("name", CONFIGS)
def test_schema_valid_and_complete(name):
    from snakemake.utils import validate

    cfg = load(name)
    raw = copy.deepcopy(cfg)
    validate(cfg, str(ROOT / "workflow" / "schemas" / "config.schema.yaml"))
    # every key is written out: the schema's defaults add nothing at the top level or per stage
    assert set(raw) == set(cfg)
    for stage in ("pretrain", "finetune"):
        assert set(raw["train"][stage]) == set(cfg["train"][stage])
    # same keys as the embedded default study, its schema defaults filled in (the same schema, the same shape)
    default = load("config.yaml")
    validate(default, str(ROOT / "workflow" / "schemas" / "config.schema.yaml"))
    assert set(raw) == set(default)
    for stage in ("pretrain", "finetune"):
        assert set(raw["train"][stage]) == set(default["train"][stage])
    got = {k: (v["pretrain"], v["finetune"]) for k, v in raw["schedules"].items()}
    assert got == SCHEDULES
    assert len(raw["seeds"]) >= 10 and raw["device"] == "cuda"
    assert raw["results_dir"] == f"results/{name.removesuffix('.yaml')}"  # its own: never the default study's
    assert raw["analysis"]["baseline"] == "fp32-fp32"
    for a, b in raw["analysis"]["contrasts"]:
        assert a in SCHEDULES and b in SCHEDULES
    pre, fin = raw["data"]["pretrain"], raw["data"]["finetune"]
    assert (pre["kind"], pre["name"], pre["config"], pre["text_column"]) == (
        "hub", "Salesforce/wikitext", "wikitext-103-raw-v1", "text")
    assert (fin["kind"], fin["name"], fin["config"]) == ("hub", "nyu-mll/glue", "mrpc")
    assert fin["columns"] == {"text_a": "sentence1", "text_b": "sentence2", "label": "label"}
    ft = raw["train"]["finetune"]
    assert 3 <= ft["epochs"] <= 5 and ft["steps"] is None and ft["batch_size"] == 32 and ft["max_length"] == 128


def test_bert_base_specifics():
    cfg = load("bert-base-mrpc.yaml")
    assert cfg["model"]["init"] == "bert-base-cased"
    assert cfg["train"]["finetune"]["lr"] == 2e-5
    assert cfg["train"]["pretrain"]["steps"] > 0 and cfg["train"]["pretrain"]["max_length"] == 128


def test_bert_small_specifics():
    m = load("bert-small-scratch.yaml")["model"]
    assert m["init"] == "scratch"
    assert (m["num_hidden_layers"], m["hidden_size"], m["num_attention_heads"], m["intermediate_size"]) == (
        4, 512, 8, 2048)


# ------------------------------------------------------------------ dry runs
def snakemake(tmp_path: Path, configfile: Path, *targets: str, dry: bool = True, env: dict | None = None):
    cmd = [SNAKEMAKE, "-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path), f"--configfile={configfile}",
           "--cores", "1", "-p"]
    if dry:
        cmd.append("-n")
    cmd += ["--", *targets] if targets else []
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    e.update(env or {})
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}"
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=e)


@pytest.mark.parametrize("name", CONFIGS)
def test_dry_run_as_written(tmp_path, name):
    r = snakemake(tmp_path, ROOT / "config" / name, "all", f"{load(name)['results_dir']}/data/fetch-manifest.json")
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-3000:]
    c = job_counts(r.stdout)
    assert c["pretrain"] == 6 * 10  # 6 stage-1 precisions x 10 seeds, shared by the schedules
    assert c["finetune"] == 8 * 10
    assert c["tokenizer"] == 1 and c["prepare"] == 2 and c["fetch"] == 1
    assert "synth" not in c  # no synthetic source
    assert "precswitch fetch --config" in r.stdout and "Salesforce/wikitext" in r.stdout
    if name == "bert-base-mrpc.yaml":
        assert "--pretrained bert-base-cased" in r.stdout
        assert '"init": "bert-base-cased"' in r.stdout.replace("\\", "")
    else:
        assert "--vocab-size 30522" in r.stdout


def local_standins(tmp_path: Path, name: str) -> Path:
    """A copy of the config whose model and data are tiny local stand-ins."""
    cfg = load(name)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "wiki.train.txt").write_text("the red fox saw the dog\n" * 20)
    (tmp_path / "data" / "wiki.valid.txt").write_text("the old cat met a bird\n" * 5)
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    (tmp_path / "data" / "train.tsv").write_text(header + "1\t1\t2\tthe fox\tthe dog\n" * 8)
    (tmp_path / "data" / "dev.tsv").write_text(header + "0\t1\t2\tthe cat\tthe bird\n" * 4)
    if cfg["model"]["init"] != "scratch":
        cfg["model"]["init"] = str(make_tiny_model(tmp_path / "models" / "tiny-bert", max_positions=512))
    cfg["data"]["pretrain"] = {"kind": "text", "train": ["data/wiki.train.txt"], "eval": ["data/wiki.valid.txt"]}
    cfg["data"]["finetune"] = {"kind": "tsv", "train": "data/train.tsv", "eval": "data/dev.tsv",
                               "columns": {"text_a": "#1 String", "text_b": "#2 String", "label": "Quality"}}
    out = tmp_path / f"local-{name}"
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return out


def test_fetch_rule_runs_local_and_fails_clearly_offline(tmp_path):
    cfgfile = local_standins(tmp_path, "bert-base-mrpc.yaml")
    res = load("bert-base-mrpc.yaml")["results_dir"]
    r = snakemake(tmp_path, cfgfile, f"{res}/data/fetch-manifest.json", dry=False,
                  env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((tmp_path / res / "data" / "fetch-manifest.json").read_text())
    assert [i["kind"] for i in m["items"]] == ["local_dir", "local_files", "local_files"]
    # the study as written, offline with an empty cache: the job fails and its log names the model
    other = tmp_path / "offline"
    other.mkdir()
    r = snakemake(other, ROOT / "config" / "bert-base-mrpc.yaml", f"{res}/data/fetch-manifest.json", dry=False,
                  env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})
    assert r.returncode != 0
    log = (other / res / "logs" / "data" / "fetch.log").read_text()
    assert "hub model 'bert-base-cased' is not available offline" in log
    assert "hub dataset 'nyu-mll/glue'" in log
    assert not (other / res / "data" / "fetch-manifest.json").exists()
