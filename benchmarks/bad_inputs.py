#!/usr/bin/env python
"""Bad inputs a new user writes (issue 31): are they refused before any training, in one clear line?

    python benchmarks/bad_inputs.py               # every case, in-process (seconds)
    python benchmarks/bad_inputs.py --snakemake   # the config cases also through a real `snakemake -n` (minutes)

A config case is a config file: its duplicate keys (precswitch.study.check_config_files) and then every config
check (precswitch.study.check). A data case is a data file named by a config: the config checks (they read the
files' headers), then the loader `precswitch prepare` runs before any training job (priority 2). A case counts as
refused cleanly when a check raises the package's error (ConfigError / PrecswitchError: one line, no traceback)
whose message names what it should (the key or the file). Prints one line per case that is not, then the count.
``CONFIGS`` and ``DATA`` are the catalog tests/test_study_config_checks.py runs too.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

# (case id, config YAML, what the refusal must name)
CONFIGS = [
    # 1. an integer key given a whole-number float: refused at config time, naming the key
    ("float-batch-size", "train: {finetune: {batch_size: 16.0}}", "train.finetune.batch_size"),
    ("float-log-every", "train: {pretrain: {log_every: 10.0}}", "train.pretrain.log_every"),
    ("float-steps", "train: {pretrain: {steps: 20.0}}", "train.pretrain.steps"),
    ("float-eval-batch", "train: {finetune: {eval_batch_size: 64.0}}", "train.finetune.eval_batch_size"),
    ("float-max-nonfinite", "train: {pretrain: {max_nonfinite: 3.0}}", "train.pretrain.max_nonfinite"),
    ("float-checkpoint-every", "train: {finetune: {checkpoint_every_steps: 5.0}}",
     "train.finetune.checkpoint_every_steps"),
    ("float-warmup-steps", "train: {finetune: {timing_warmup_steps: 5.0}}", "train.finetune.timing_warmup_steps"),
    ("float-telemetry", "train: {pretrain: {telemetry_every: 2.0}}", "train.pretrain.telemetry_every"),
    ("float-hidden", "model: {hidden_size: 64.0}", "model.hidden_size"),
    ("float-layers", "model: {num_hidden_layers: 1.0}", "model.num_hidden_layers"),
    ("float-positions", "model: {max_position_embeddings: 64.0}", "model.max_position_embeddings"),
    ("float-vocab", "tokenizer: {vocab_size: 500.0}", "tokenizer.vocab_size"),
    ("float-n-train", "data: {synthetic: {n_train: 300.0}}", "data.synthetic.n_train"),
    ("float-synth-seed", "data: {synthetic: {seed: 1.0}}", "data.synthetic.seed"),
    ("float-seed", "seeds: [1, 2.0]", "seeds[1]"),
    ("float-threads", "threads: 2.0", "threads"),
    ("float-mem", "resources: {mem_mb: 4000.0}", "resources.mem_mb"),
    ("float-runtime", "resources: {runtime: 60.0}", "resources.runtime"),
    ("float-resamples", "analysis: {bootstrap_resamples: 200.0}", "analysis.bootstrap_resamples"),
    ("float-analysis-seed", "analysis: {seed: 0.0}", "analysis.seed"),
    ("float-max-rows", "data: {pretrain: {kind: synthetic, max_train_rows: 100.0}}", "data.pretrain.max_train_rows"),
    ("exp-max-rows", "data: {finetune: {kind: synthetic, max_train_rows: 1e3}}", "data.finetune.max_train_rows"),
    # 2. a name YAML reads as a bool, null or number
    ("schedule-on", "schedules: {on: {finetune: fp32}}", "schedules.True"),
    ("schedule-off", "schedules: {off: {finetune: fp32}}", "schedules.False"),
    ("schedule-yes", "schedules: {yes: {finetune: fp32}}", "schedules.True"),
    ("schedule-null", "schedules: {null: {finetune: fp32}}", "schedules.None"),
    ("schedule-tilde", "schedules: {~: {finetune: fp32}}", "schedules.None"),
    ("schedule-year", "schedules: {2024: {finetune: fp32}}", "schedules.2024"),
    ("schedule-float", "schedules: {1.5: {finetune: fp32}}", "schedules.1.5"),
    ("stage-on", "schedules: {x: {finetune: fp32, on: fp32}}", "schedules.x.True"),
    ("baseline-bool", "schedules: {a: {finetune: fp32}}\nanalysis: {baseline: no}", "analysis.baseline"),
    #    a results_dir that cannot be created or written
    ("results-proc", "results_dir: /proc/precswitch-results", "results_dir"),
    ("results-under-file", "results_dir: {file}/results", "results_dir"),
    ("results-is-file", "results_dir: {file}", "results_dir"),
    # 3. a key written twice in one config file
    ("dup-top", "seeds: [1]\nseeds: [2]", "seeds"),
    ("dup-nested", "train:\n  finetune:\n    lr: 1.0e-4\n    lr: 3.0e-4", "train.finetune.lr"),
    ("dup-schedule", "schedules:\n  a: {finetune: fp32}\n  a: {finetune: amp_bf16}", "schedules.a"),
    ("dup-in-flow", "model: {hidden_size: 64, hidden_size: 32}", "model.hidden_size"),
    ("dup-stage", "schedules:\n  a:\n    finetune: fp32\n    finetune: amp_bf16", "schedules.a.finetune"),
    ("dup-results", "results_dir: a\nresults_dir: b", "results_dir"),
]

_PAIRS = "data: {{finetune: {{kind: {kind}, train: {train}, eval: {eval}, columns: {{text_a: a, text_b: b, label: y}}}}}}"
_OK_TSV = "a\tb\ty\n" + "".join(f"w{i} x\tw{i} y\t{i % 2}\n" for i in range(40))


def _table(kind, train_text, eval_text=None, mode="w"):
    """A data case: (files to write {name: text or bytes}, config YAML naming them)."""
    ext = {"tsv": "tsv", "csv": "csv", "jsonl": "jsonl", "parquet": "parquet"}[kind]
    files = {f"train.{ext}": train_text, f"dev.{ext}": _OK_TSV if eval_text is None and kind == "tsv" else eval_text}
    return files, _PAIRS.format(kind=kind, train="{dir}/train." + ext, eval="{dir}/dev." + ext)


def _text(text):
    return {"corpus.txt": text}, "data: {pretrain: {kind: text, train: {dir}/corpus.txt}}"


# (case id, files, config YAML ({dir}: where the files are), what the refusal must name)
DATA = [
    ("tsv-empty-file", *_table("tsv", ""), "train.tsv"),
    ("tsv-header-only", *_table("tsv", "a\tb\ty\n"), "train"),
    ("tsv-missing-label-column", *_table("tsv", "a\tb\tlabel\nx\ty\t1\n"), "y"),
    ("csv-semicolons", *_table("csv", "a;b;y\nx;y;1\nz;w;0\n", "a;b;y\nx;y;1\n"), "csv"),
    ("tsv-all-text-empty", *_table("tsv", "a\tb\ty\n" + "\t\t1\n\t\t0\n" * 10), "train"),
    ("tsv-one-class", *_table("tsv", "a\tb\ty\n" + "".join(f"w{i}\tv{i}\t1\n" for i in range(20))), "label"),
    ("tsv-binary", *_table("tsv", bytes(range(256)) * 4), "train.tsv"),
    ("tsv-utf16", *_table("tsv", _OK_TSV.encode("utf-16")), "train.tsv"),
    ("tsv-ragged", *_table("tsv", "a\tb\ty\n" + "x\ty\t1\textra\tmore\n" * 5 + "x\ty\t0\n" * 5), "train.tsv"),
    ("jsonl-malformed", *_table("jsonl", '{"a": "x", "b": "y", "y": 1}\n{"a": "x", \n',
                                '{"a": "x", "b": "y", "y": 1}\n{"a": "z", "b": "w", "y": 0}\n'), "train.jsonl"),
    ("jsonl-list-rows", *_table("jsonl", '["x", "y", 1]\n["z", "w", 0]\n',
                                '{"a": "x", "b": "y", "y": 1}\n{"a": "z", "b": "w", "y": 0}\n'), "train.jsonl"),
    ("jsonl-empty", *_table("jsonl", "", '{"a": "x", "b": "y", "y": 1}\n'), "train.jsonl"),
    ("parquet-not-parquet", *_table("parquet", "a,b,y\nx,y,1\n", "a,b,y\nx,y,1\n"), "train.parquet"),
    ("eval-unseen-label", *_table("tsv", _OK_TSV, "a\tb\ty\n" + "x\ty\t7\n" * 5), "7"),
    ("text-empty", *_text(""), "corpus.txt"),
    ("text-blank-lines", *_text("\n\n   \n\n"), "corpus.txt"),
    ("text-binary", *_text(bytes(range(256)) * 8), "corpus.txt"),
    ("text-headings-only", *_text(" = Title = \n = = Section = = \n"), "corpus.txt"),
    ("train-is-dir", {"sub/x.tsv": _OK_TSV}, _PAIRS.format(kind="tsv", train="{dir}/sub", eval="{dir}/sub/x.tsv"),
     "sub"),
    ("eval-missing", {"train.tsv": _OK_TSV}, _PAIRS.format(kind="tsv", train="{dir}/train.tsv",
                                                            eval="{dir}/nope.tsv"), "nope.tsv"),
]


def _is_one_line(e: BaseException) -> bool:
    from precswitch.errors import PrecswitchError

    return isinstance(e, PrecswitchError) and "\n" not in str(e).strip() and str(e).strip() != ""


def run_config(text: str, where: Path) -> BaseException | None:
    """A config case: its file's duplicate keys, then every config check. Returns what refused it, or None."""
    import yaml

    from precswitch import study

    a_file = where / "a-file"
    a_file.write_text("not a folder\n")
    path = where / "config.yaml"
    path.write_text(text.replace("{file}", str(a_file)) + "\n")
    try:
        study.check_config_files([path])
        study.check(yaml.safe_load(path.read_text()) or {})
    except Exception as e:  # noqa: BLE001 - the kind of exception is what is measured
        return e
    return None


def write_files(files: dict, where: Path) -> None:
    for name, content in files.items():
        p = where / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        elif content is not None:
            p.write_text(content)


def run_data(files: dict, text: str, where: Path) -> BaseException | None:
    """A data case: the config checks, then what `precswitch prepare` loads (before any training job)."""
    import yaml

    from precswitch import study
    from precswitch.data.loading import load_source

    write_files(files, where)
    cfg = yaml.safe_load(text.replace("{dir}", str(where)))
    try:
        study.check(cfg)
        checked = study.validate(cfg)
        for stage in study.STAGES:
            if checked["data"][stage]["kind"] != "synthetic":
                load_source(study.source_spec(checked, stage, ""), study.OBJECTIVE[stage])
    except Exception as e:  # noqa: BLE001
        return e
    return None


def verdict(error: BaseException | None, names: str) -> str | None:
    """None when refused cleanly naming ``names``; else why not."""
    if error is None:
        return "accepted"
    if not _is_one_line(error):
        return f"{type(error).__name__} (a traceback): {str(error)[:160]!r}"
    if names not in str(error):
        return f"one line, but it does not name {names!r}: {error}"
    return None


def snakemake_dry_run(text: str, where: Path) -> str | None:
    """A config case through `snakemake -n`: None when its stderr is the refusal alone (no frames)."""
    path = where / "config.yaml"
    a_file = where / "a-file"
    a_file.write_text("not a folder\n")
    path.write_text(text.replace("{file}", str(a_file)) + "\n")
    r = subprocess.run([str(Path(sys.executable).with_name("snakemake")), "-n", "--cores", "1", "-s",
                        str(ROOT / "Snakefile"), "--directory", str(ROOT), "--configfile", str(path)],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    err = r.stderr
    if r.returncode == 0:
        return "accepted by snakemake -n"
    if "Traceback" in err or 'File "' in err or "Exception" in err:
        return "frames on stderr: " + err.strip().splitlines()[-1][:160]
    if not any(line.startswith("Error: config key") for line in err.splitlines()):
        return "no one-line refusal: " + err.strip()[-160:]
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--snakemake", action="store_true", help="also run the config cases through snakemake -n")
    args = parser.parse_args(argv)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the default results_dir (results) is created nowhere that matters
        for i, (case, text, names) in enumerate(CONFIGS):
            where = Path(tmp, f"c{i}")
            where.mkdir()
            why = verdict(run_config(text, where), names)
            if why is None and args.snakemake:
                why = snakemake_dry_run(text, where)
            if why:
                failures.append((f"config {case}", why))
        for i, (case, files, text, names) in enumerate(DATA):
            where = Path(tmp, f"d{i}")
            where.mkdir()
            why = verdict(run_data(files, text, where), names)
            if why:
                failures.append((f"data {case}", why))
    for case, why in failures:
        print(f"NOT CLEAN {case}: {why}")
    total = len(CONFIGS) + len(DATA)
    print(f"{total - len(failures)} of {total} bad inputs ({len(CONFIGS)} configs, {len(DATA)} data files) refused "
          f"before any training with one line naming the key or file"
          + (" (configs also through snakemake -n: that line alone on stderr)" if args.snakemake else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
