"""Shared helpers of the benchmark scripts: tiny prepared data and one engine run per fresh process."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
MODEL = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512,
         "max_position_embeddings": 128, "attn_implementation": "eager"}
#: BERT-base's layers and widths (the vocabulary stays the data's): the engine at the GPU studies' size
BASE_MODEL = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
              "max_position_embeddings": 512, "attn_implementation": "sdpa"}


def positive_int(text: str) -> int:
    """argparse type of a count that must be at least 1 (steps, repeats, batch sizes, ...)."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def split_names(ap: argparse.ArgumentParser, option: str, text: str, allowed=None) -> list[str]:
    """A comma-separated option (--precisions a,b): its names, refused (ap.error, exit 2) when one is empty,
    repeated, or not among allowed (when given) -- before any data is prepared or any run started."""
    names = [n.strip() for n in text.split(",")]
    for n in names:
        if not n:
            ap.error(f"{option} {text!r}: an empty name")
        if allowed is not None and n not in allowed:
            ap.error(f"{option}: unknown name {n!r}; allowed: {', '.join(allowed)}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        ap.error(f"{option} {text!r}: {', '.join(dup)} given twice (each would be measured again)")
    return names


def cli(*args: str) -> subprocess.CompletedProcess:
    """Run `precswitch ARGS`; on failure print the end of its stderr (the reason) before raising."""
    try:
        return subprocess.run([PY, "-m", "precswitch.cli", *args], check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError as e:
        print(f"# precswitch {args[0]} failed (exit {e.returncode}):\n{(e.stderr or '')[-3000:]}", file=sys.stderr)
        raise


def prepare(root: Path, n_corpus: int = 6000, n_train: int = 2000, max_length: int = 64,
            pack: bool = False) -> dict[str, Path]:
    """Synthetic language -> WordPiece tokenizer -> prepared mlm and classify datasets under root.
    pack: masked-LM text packed into full max_length blocks (as WikiText in the GPU configs), not the
    synthetic default of one short sentence pair per row."""
    synth, tok = root / "synth", root / "tokenizer"
    src = json.dumps({"kind": "synthetic", "dir": str(synth)})
    cli("synth", "--out", str(synth), "--seed", "0", "--n-corpus", str(n_corpus), "--n-train", str(n_train),
        "--n-dev", "200")
    cli("tokenizer", "--source", src, "--out", str(tok), "--vocab-size", "4000")
    out = {}
    for obj in ("mlm", "classify"):
        out[obj] = root / f"prepared-{obj}"
        spec = json.dumps({"kind": "synthetic", "dir": str(synth), **({"mlm_examples": "pack"} if pack else {})})
        cli("prepare", "--source", spec if obj == "mlm" else src, "--tokenizer", str(tok), "--objective", obj,
            "--max-length", str(max_length), "--out", str(out[obj]))
    return out


def engine_run(data: Path, objective: str, precision: str, out: Path | None = None, **hp) -> dict:
    """One `precswitch train` in a fresh process; returns its metrics.json plus ``wall_seconds``, the
    process's wall time. out: keep the stage's outputs there (default: a temporary directory)."""
    full = {"data": str(data), "objective": objective, "precision": precision, "seed": 1, "model": MODEL,
            "batch_size": 32, "lr": 5e-4, "warmup_ratio": 0.1, "save_checkpoint": False, "eval_batch_size": 256,
            "on_unsupported": "skip",
            **hp}
    with tempfile.TemporaryDirectory() as t:
        where = Path(out or t)
        t0 = time.perf_counter()
        cli("train", "--hparams", json.dumps(full), "--out", str(where))
        wall = time.perf_counter() - t0
        return {**json.loads((where / "metrics.json").read_text()), "wall_seconds": wall}
