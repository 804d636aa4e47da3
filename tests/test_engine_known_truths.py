"""config/known-truths.yaml: the known truths of 16-bit training hold at the default study's CPU scale.

Each truth runs the engine with the recipe the config gives its schedule (the default study's model,
learning rate and batch, merged with config/known-truths.yaml, the schedule's overrides included) on a
small copy of the synthetic language, for a few dozen steps instead of the study's 600."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from precswitch.cli import main as cli_main

ROOT = Path(__file__).resolve().parent.parent


def _config() -> dict:
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    truths = yaml.safe_load((ROOT / "config" / "known-truths.yaml").read_text())
    for key in ("train", "model"):
        for k, v in (truths.get(key) or {}).items():
            base[key][k] = {**base[key][k], **v} if isinstance(v, dict) else v
    base["schedules"] = truths["schedules"]
    return base


CFG = _config()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("truths")
    syn, tok = root / "synth", root / "tok"
    assert cli_main(["synth", "--out", str(syn), "--seed", "0", "--n-corpus", "3000", "--n-train", "200",
                     "--n-dev", "100"]) == 0
    src = json.dumps({"kind": "synthetic", "dir": str(syn)})
    assert cli_main(["tokenizer", "--source", src, "--out", str(tok), "--vocab-size", str(CFG["tokenizer"]["vocab_size"]),
                     "--model-max-length", str(CFG["model"]["max_position_embeddings"])]) == 0
    out = root / "mlm"
    assert cli_main(["prepare", "--source", src, "--tokenizer", str(tok), "--objective", "mlm", "--max-length",
                     str(CFG["train"]["pretrain"]["max_length"]), "--out", str(out)]) == 0
    return out


def _stage1(data: Path, out: Path, spec, steps: int) -> dict:
    """The stage-1 run of a schedule's spec (a precision, or {precision, overrides}) at the config's recipe."""
    spec = {"precision": spec} if isinstance(spec, str) else spec
    train = {k: v for k, v in CFG["train"]["pretrain"].items() if k not in ("max_length", "steps", "epochs")}
    model = {k: v for k, v in CFG["model"].items() if k not in ("init", "revision")}
    hp = {**train, **spec.get("overrides", {}), "precision": spec["precision"], "steps": steps, "seed": 1,
          "data": str(data), "model": model, "threads": 1, "device": "cpu", "save_checkpoint": False,
          "checkpoint_every_minutes": 0, "progress": False}
    assert cli_main(["train", "--hparams", json.dumps(hp), "--out", str(out)]) == 0
    return json.loads((out / "metrics.json").read_text())


def test_pure_fp16_at_adamws_default_eps_diverges(data, tmp_path):
    spec = CFG["schedules"]["purefp16-fp32"]["pretrain"]
    assert spec["precision"] == "pure_fp16" and spec["overrides"]["adam_eps"] == 1e-8  # AdamW's default
    m = _stage1(data, tmp_path / "pf16", spec, steps=60)
    assert m["status"] == "diverged" and m["nonfinite_losses"] > 0
    assert m["hparams"]["adam_eps"] == 1e-8


@pytest.mark.slow  # pure_bf16 is emulated on an AVX2 CPU: ~1 minute
def test_pure_bf16_loses_against_fp32_at_the_same_seed(data, tmp_path):
    """bf16 weights round small updates away: after the stage's warm-up and decay, masked-LM loss is worse
    than fp32's from the same init, data order and masks (measured at 150 steps: 3.421 vs 3.392, +0.9%;
    the full study's 600 steps: +3.8%, config/README.md)."""
    assert CFG["schedules"]["pbf16-pbf16"]["pretrain"] == "pure_bf16"
    fp32 = _stage1(data, tmp_path / "fp32", CFG["schedules"]["fp32-fp32"]["pretrain"], steps=150)
    bf16 = _stage1(data, tmp_path / "pbf16", "pure_bf16", steps=150)
    assert fp32["status"] == bf16["status"] == "ok"
    assert bf16["eval_loss"] > fp32["eval_loss"] * 1.005, (bf16["eval_loss"], fp32["eval_loss"])
