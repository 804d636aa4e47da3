"""The per-job fixed cost (benchmarks/job_overhead.py) and the imports that make it: each command imports what it
needs, not what another command does (checked in a fresh process's sys.modules)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bench_helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

#: runs `precswitch ARGV` as the program (cli.main() on sys.argv), then prints the heavy modules it left imported
PROBE = """
import gc, json, sys
heavy = json.loads(sys.argv[2])
sys.argv = ["precswitch", *json.loads(sys.argv[1])]
from precswitch import cli
rc = cli.main()
print(json.dumps({"rc": rc, "frozen": gc.get_freeze_count(),
                  "modules": sorted(m for m in sys.modules if m.split(".")[0] in heavy)}))
"""
HEAVY = ["torch", "transformers", "datasets", "sklearn", "scipy", "pandas", "matplotlib"]


def run_cli(argv: list[str], cwd: Path) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(HEAVY)], cwd=cwd,
                       env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "HOME": str(cwd)},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["rc"] == 0, r.stderr[-3000:]
    return {"frozen": res["frozen"], "tops": {m.split(".")[0] for m in res["modules"]}, "modules": res["modules"]}


def test_analysis_and_synth_commands_leave_torch_unimported(tmp_path):
    """synth writes text files: no torch, transformers, datasets; the analysis reads tables: no torch, transformers
    or datasets either (aggregate: not even scipy)."""
    from precswitch.analysis.fakes import write_fake_study

    synth = run_cli(["synth", "--out", "syn", "--seed", "0", "--n-corpus", "50", "--n-train", "20", "--n-dev", "10"],
                    tmp_path)
    assert not synth["tops"] & {"torch", "transformers", "datasets", "pandas"}, synth["modules"]
    assert (tmp_path / "syn" / "corpus.txt").stat().st_size > 0
    metrics = [str(p) for p in write_fake_study(tmp_path / "fake", seeds=range(1, 4))]
    agg = run_cli(["aggregate", "--metrics", *metrics, "--out-dir", "res"], tmp_path)
    assert "pandas" in agg["tops"] and not agg["tops"] & {"torch", "transformers", "datasets", "scipy"}
    stats = run_cli(["stats", "--runs", "res/runs.csv", "--schedules", "res/schedules.csv", "--out-dir", "res",
                     "--baseline", "fp32-fp32"], tmp_path)
    verdict = run_cli(["verdict", "--stats", "res/stats.json", "--out", "res/verdict.md"], tmp_path)
    for res in (stats, verdict):
        assert not res["tops"] & {"torch", "transformers", "datasets"}, res["modules"]
    assert (tmp_path / "res" / "verdict.md").stat().st_size > 0


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("jo")
    run_cli(["synth", "--out", "syn", "--seed", "0", "--n-corpus", "400", "--n-train", "80", "--n-dev", "40"], root)
    src = json.dumps({"kind": "synthetic", "dir": "syn"})
    run_cli(["tokenizer", "--source", src, "--out", "tok", "--vocab-size", "500"], root)
    return root, src


def test_prepare_leaves_torch_unimported(tiny_data):
    """Tokenizing and saving a dataset needs no torch: the BERT tokenizer loads through its own class, not
    AutoTokenizer (whose model-config code imports torch)."""
    root, src = tiny_data
    res = run_cli(["prepare", "--source", src, "--tokenizer", "tok", "--objective", "classify", "--max-length", "32",
                   "--out", "pc"], root)
    assert "datasets" in res["tops"] and "torch" not in res["tops"], res["modules"]
    assert json.loads((root / "pc" / "meta.json").read_text())["objective"] == "classify"


def test_a_masked_lm_stage_leaves_sklearn_unimported_and_the_program_freezes_before_exit(tiny_data):
    """A masked-LM stage has no task metrics: no sklearn. Run as the program, main() freezes the objects left
    before the interpreter's shutdown (which otherwise collects them all: seconds of a job's exit)."""
    root, src = tiny_data
    run_cli(["prepare", "--source", src, "--tokenizer", "tok", "--objective", "mlm", "--max-length", "32",
             "--out", "pm"], root)
    hp = {"data": "pm", "tokenizer": "tok", "objective": "mlm", "precision": "fp32", "steps": 2,
          "timing_warmup_steps": 1, "batch_size": 8, "threads": 1,
          "model": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
                    "max_position_embeddings": 64}}
    res = run_cli(["train", "--hparams", json.dumps(hp), "--out", "s1"], root)
    assert "torch" in res["tops"] and "sklearn" not in res["tops"], res["modules"]
    assert res["frozen"] > 0
    assert json.loads((root / "s1" / "metrics.json").read_text())["status"] == "ok"


def _job_overhead():
    return load_benchmark("job_overhead")


def test_job_overhead_phases_add_up():
    """Each phase runs from the previous stamp to its own; a missing stamp (a function the engine no longer has)
    leaves its phase out and its time in the next; the checkpoint write leaves out periodic state saves."""
    jo = _job_overhead()
    marks = {"spawn": 100.0, "main": 100.1, "stage": 104.1, "data": 105.0, "model": 106.0, "model_built": 107.5,
             "loop": 107.7, "first_step": 108.0, "eval": 120.0, "eval_done": 121.0, "metrics_written": 121.6,
             "main_end": 121.7, "exit": 122.2}
    p = jo.phases(marks, {"checkpoint_seconds": 0.9, "state_save_seconds": 0.4})
    assert p["imports"] == pytest.approx(4.0) and p["data"] == pytest.approx(1.0)
    assert p["model build"] == pytest.approx(1.5) and p["first step"] == pytest.approx(0.3)
    assert p["to first step"] == pytest.approx(8.0)
    assert p["checkpoint write"] == pytest.approx(0.5) and p["metrics write"] == pytest.approx(0.1)
    assert p["exit"] == pytest.approx(0.6) and p["last step to exit"] == pytest.approx(2.2)
    del marks["model"]
    p = jo.phases(marks, {})
    assert p["data"] is None and p["model build"] == pytest.approx(2.5)
    assert sum(p[n] for n, _ in jo.START_PHASES if p[n] is not None) == pytest.approx(p["to first step"])




def test_job_overhead_stamps_every_phase_of_this_engine(tiny_data):
    """The driver stamps the engine's functions where the engine looks them up: a real stage of this checkout has a
    time for every phase and no stamp missing (a refactor that moves one fails here, not as a silent None)."""
    root, src = tiny_data
    run_cli(["prepare", "--source", src, "--tokenizer", "tok", "--objective", "mlm", "--max-length", "32",
             "--out", "pj"], root)
    hp = {"data": str(root / "pj"), "tokenizer": str(root / "tok"), "objective": "mlm", "precision": "fp32",
          "steps": 2, "timing_warmup_steps": 1, "batch_size": 8, "threads": 1, "run_id": "jo", "stage": "pretrain",
          "model": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
                    "max_position_embeddings": 64}}
    p = _job_overhead().timed_job(SRC, hp, root / "jo")
    assert p["missing"] == []
    assert all(p[n] is not None and p[n] >= 0 for n in p if n != "missing"), p
