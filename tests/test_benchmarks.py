"""The benchmark scripts' figures (mutation audit): what each script prints or writes, from hand-built
measurements with hand-computed expectations. The expensive parts (`precswitch` processes, training,
Snakemake, clocks) are faked; nothing here trains a model of any size worth timing or needs a GPU.

Each script is imported as a module from its file; the options of its command line are checked to reach
the runs it starts (engine_run's hparams, the subprocess's arguments)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


sys.path.insert(0, str(Path(__file__).parent))
from bench_helpers import load_benchmark as _load  # noqa: E402


class Clock:
    """A perf_counter that moves only when told to (robust on a busy machine)."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += max(s, 0.0)


def _fake_prepare(calls):
    def prepare(root, **kw):
        calls.append((Path(root), kw))
        return {"mlm": Path(root) / "prepared-mlm", "classify": Path(root) / "prepared-classify"}
    return prepare


def _row(out: str, *first: str) -> list[str]:
    """The printed table row whose first fields are `first`."""
    rows = [line.split() for line in out.splitlines() if line.split()[:len(first)] == list(first)]
    assert len(rows) == 1, (first, out)
    return rows[0]


# ================================================================== _bench.py
@pytest.fixture
def bench():
    return _load("_bench")


def test_engine_run_hparams_out_dir_and_wall_time(bench, tmp_path, monkeypatch):
    """engine_run: the caller's hparams override the defaults, the stage's outputs go to `out` when given,
    and wall_seconds is the process's wall time (the clock around the `precswitch train` call)."""
    clock, seen = Clock(), []

    def cli(*args):
        seen.append(args)
        hp, out = json.loads(args[args.index("--hparams") + 1]), Path(args[args.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.json").write_text(json.dumps({"steps_per_second": 3.0, "batch_size": hp["batch_size"]}))
        clock.sleep(7.5)

    monkeypatch.setattr(bench, "cli", cli)
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=clock))
    m = bench.engine_run(tmp_path / "d", "mlm", "amp_bf16", out=tmp_path / "keep", batch_size=8, steps=3,
                         model={"hidden_size": 16}, save_checkpoint=True, eval_batch_size=64)
    assert m == {"steps_per_second": 3.0, "batch_size": 8, "wall_seconds": 7.5}
    (args,) = seen
    assert args[0] == "train" and Path(args[args.index("--out") + 1]) == tmp_path / "keep"
    hp = json.loads(args[args.index("--hparams") + 1])
    assert hp["data"] == str(tmp_path / "d") and hp["objective"] == "mlm" and hp["precision"] == "amp_bf16"
    assert hp["batch_size"] == 8 and hp["steps"] == 3 and hp["model"] == {"hidden_size": 16}
    assert hp["save_checkpoint"] is True and hp["eval_batch_size"] == 64  # the caller's, not the defaults
    assert hp["seed"] == 1 and hp["on_unsupported"] == "skip"  # defaults kept
    assert (hp["lr"], hp["warmup_ratio"]) == (5e-4, 0.1)  # engine_vs_trainer's Trainer runs these
    assert (tmp_path / "keep" / "metrics.json").exists()
    # without out: a temporary directory, removed afterwards
    m = bench.engine_run(tmp_path / "d", "classify", "fp32")
    hp = json.loads(seen[-1][seen[-1].index("--hparams") + 1])
    assert hp["save_checkpoint"] is False and hp["eval_batch_size"] == 256
    assert hp["batch_size"] == 32 and hp["model"] == bench.MODEL and hp["objective"] == "classify"
    assert not Path(seen[-1][seen[-1].index("--out") + 1]).exists()


def test_prepare_passes_its_options_to_each_step(bench, tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(bench, "cli", lambda *a: seen.append(a))
    out = bench.prepare(tmp_path, n_corpus=123, n_train=45, max_length=99, pack=True)
    assert out == {"mlm": tmp_path / "prepared-mlm", "classify": tmp_path / "prepared-classify"}
    synth, tok, mlm, cls = seen

    def opt(args, name):
        return args[args.index(name) + 1]

    assert synth[0] == "synth" and opt(synth, "--n-corpus") == "123" and opt(synth, "--n-train") == "45"
    assert opt(synth, "--n-dev") == "200" and opt(synth, "--seed") == "0"
    assert tok[0] == "tokenizer" and opt(tok, "--out") == str(tmp_path / "tokenizer")
    assert opt(tok, "--vocab-size") == "4000"  # the "vocab 4k" the scripts print
    for args, obj in ((mlm, "mlm"), (cls, "classify")):
        assert args[0] == "prepare" and opt(args, "--objective") == obj and opt(args, "--max-length") == "99"
        assert opt(args, "--tokenizer") == str(tmp_path / "tokenizer")
    assert json.loads(opt(mlm, "--source")).get("mlm_examples") == "pack"  # packed blocks: masked LM only
    assert "mlm_examples" not in json.loads(opt(cls, "--source"))
    seen.clear()
    bench.prepare(tmp_path)
    assert "mlm_examples" not in json.loads(seen[2][seen[2].index("--source") + 1])
    assert seen[2][seen[2].index("--max-length") + 1] == "64"


def test_cli_raises_on_failure_and_prints_the_reason(bench, monkeypatch, capsys):
    def run(cmd, check=False, **kw):
        if check:
            raise subprocess.CalledProcessError(3, cmd, "", "Traceback...\nValueError: bad hparams")
        return subprocess.CompletedProcess(cmd, 3, "", "")

    monkeypatch.setattr(bench.subprocess, "run", run)
    with pytest.raises(subprocess.CalledProcessError):
        bench.cli("train", "--hparams", "{}")
    err = capsys.readouterr().err
    assert "precswitch train failed (exit 3)" in err and "ValueError: bad hparams" in err  # the reason too


# ================================================================== precision_throughput.py
MB = 2**20


def _pt_metrics(sps, tps, peak_mb, joules, steps=12, warm=2, energy_total=None, kind="cpu_peak_rss"):
    return {"status": "ok", "steps_per_second": sps, "tokens_per_second": tps, "peak_memory_bytes": peak_mb * MB,
            "energy_joules_steady": joules, "energy_joules": energy_total, "steps_completed": steps,
            "timing_warmup_steps": warm, "memory_kind": kind}


def _run_pt(monkeypatch, tmp_path, table, argv, calls=None, prep=None):
    """precision_throughput.main with a fake engine_run: table[(objective, precision)] is the list of
    metrics.json its successive repeats return (an exception instance: that repeat raises it)."""
    pt = _load("precision_throughput")
    left = {k: list(v) for k, v in table.items()}
    calls = [] if calls is None else calls

    def engine_run(data, obj, prec, **hp):
        calls.append({"data": data, "objective": obj, "precision": prec, **hp})
        m = left[(obj, prec)].pop(0)
        if isinstance(m, Exception):
            raise m
        return {**m, "objective": obj, "precision": prec}

    monkeypatch.setattr(pt, "engine_run", engine_run)
    monkeypatch.setattr(pt, "prepare", _fake_prepare([] if prep is None else prep))
    monkeypatch.setattr(sys, "argv", ["precision_throughput.py", *argv])
    pt.main()
    return pt


def test_precision_throughput_medians_ratio_energy_and_memory(monkeypatch, tmp_path, capsys):
    """Each figure is the median over the repeats (not the mean), memory in MiB, J/step the steady energy
    over the steps after the warm-up, and 'vs fp32' the row's steps/s over fp32's of the same objective."""
    table = {
        ("mlm", "fp32"): [_pt_metrics(10, 1000, 100, 20, energy_total=99), _pt_metrics(11, 1100, 200, 30),
                          _pt_metrics(30, 5000, 900, 90)],
        ("mlm", "amp_bf16"): [_pt_metrics(20, 2000, 50, 10), _pt_metrics(22, 2300, 60, 15),
                              _pt_metrics(23, 2400, 70, 20, steps=7, warm=7)],  # no steady step: not counted
        ("classify", "fp32"): [_pt_metrics(40, 4000, 10, None)] * 3,
        ("classify", "amp_bf16"): [_pt_metrics(60, 6000, 10, None)] * 3,
    }
    _run_pt(monkeypatch, tmp_path, table, ["--precisions", "fp32,amp_bf16", "--repeats", "3"])
    out = capsys.readouterr().out
    # objective precision compile steps/s tokens/s vs peak-MB J/step status kind
    assert _row(out, "mlm", "fp32") == ["mlm", "fp32", "off", "11.00", "1100", "1.00x", "200", "3.00", "ok",
                                        "cpu_peak_rss"]
    # J/step: 10/10 and 15/10 (the third run has no steady step) -> median 1.25
    assert _row(out, "mlm", "amp_bf16")[3:8] == ["22.00", "2300", "2.00x", "60", "1.25"]
    assert _row(out, "classify", "fp32")[3:8] == ["40.00", "4000", "1.00x", "10", "-"]
    assert _row(out, "classify", "amp_bf16")[3:6] == ["60.00", "6000", "1.50x"]  # vs classify's fp32, not mlm's
    assert "median of 3 processes" in out


def test_precision_throughput_options_reach_every_run(monkeypatch, tmp_path):
    calls, prep = [], []
    m = _pt_metrics(5, 500, 10, None)
    table = {(o, p): [m] * 4 for o in ("mlm",) for p in ("fp32", "pure_fp16")}
    pt = _run_pt(monkeypatch, tmp_path, table, ["--steps", "7", "--warmup", "2", "--repeats", "1", "--threads", "3",
                                                "--device", "cuda", "--precisions", "fp32,pure_fp16", "--objectives",
                                                "mlm", "--model", "base", "--max-length", "128",
                                                "--compile", "off,reduce-overhead"], calls=calls, prep=prep)
    assert len(calls) == 4  # 2 compile settings x 2 precisions x 1 repeat
    for c in calls:
        assert (c["steps"], c["timing_warmup_steps"], c["threads"], c["device"]) == (7, 2, 3, "cuda")
        assert c["model"] == pt.BASE_MODEL and c["objective"] == "mlm"
        assert c["adam_eps"] == (1e-4 if c["precision"] == "pure_fp16" else 1e-8)
    assert [c["compile"] for c in calls] == ["off", "off", "reduce-overhead", "reduce-overhead"]
    ((_, kw),) = prep
    assert kw == {"max_length": 128, "pack": True}
    calls.clear()
    prep.clear()
    pt = _run_pt(monkeypatch, tmp_path, {("mlm", "fp32"): [m]}, ["--repeats", "1", "--precisions", "fp32",
                                                                 "--objectives", "mlm"], calls=calls, prep=prep)
    assert calls[0]["model"] == pt.MODEL and calls[0]["adam_eps"] == 1e-8 and calls[0]["compile"] == "off"
    assert prep[0][1] == {"max_length": 64, "pack": False}


def test_precision_throughput_failed_run_and_metrics_out(monkeypatch, tmp_path, capsys):
    """A run whose process fails is a '-' row with its reason; the others go on. --metrics-out holds every
    run's metrics.json (the failed one as a failed record)."""
    err = subprocess.CalledProcessError(1, ["x"], "", "Traceback\nRuntimeError: no bf16 here\n")
    table = {("mlm", "fp32"): [_pt_metrics(10, 1000, 100, None)] * 2, ("mlm", "amp_bf16"): [err, err],
             ("mlm", "pure_bf16"): [_pt_metrics(30, 3000, 50, None)] * 2}
    out_json = tmp_path / "all.json"
    _run_pt(monkeypatch, tmp_path, table, ["--repeats", "2", "--objectives", "mlm", "--precisions",
                                           "fp32,amp_bf16,pure_bf16", "--metrics-out", str(out_json)])
    out = capsys.readouterr().out
    assert _row(out, "mlm", "amp_bf16")[3:9] == ["-"] * 5 + ["failed"]
    assert "exit 1: RuntimeError: no bf16 here" in out
    assert _row(out, "mlm", "pure_bf16")[3:6] == ["30.00", "3000", "3.00x"]
    every = json.loads(out_json.read_text())
    assert [r["precision"] for r in every] == ["fp32", "fp32", "amp_bf16", "amp_bf16", "pure_bf16", "pure_bf16"]
    assert [r["status"] for r in every] == ["ok", "ok", "failed", "failed", "ok", "ok"]


def test_precision_throughput_status_counts_a_rows_mixed_runs(monkeypatch, tmp_path, capsys):
    """A row whose first repeat failed and the others ran shows '2/3 ok' (its figures are the ok runs'),
    not the first repeat's 'failed'; one whose first repeat ran and a later one failed is not 'ok' either."""
    err = subprocess.CalledProcessError(1, ["x"], "", "RuntimeError: out of memory\n")
    table = {("mlm", "fp32"): [err, _pt_metrics(10, 1000, 100, None), _pt_metrics(12, 1200, 100, None)],
             ("mlm", "amp_bf16"): [_pt_metrics(20, 2000, 50, None), err, _pt_metrics(24, 2400, 50, None)],
             ("mlm", "pure_bf16"): [_pt_metrics(30, 3000, 50, None)] * 3}
    _run_pt(monkeypatch, tmp_path, table, ["--repeats", "3", "--objectives", "mlm", "--precisions",
                                           "fp32,amp_bf16,pure_bf16"])
    out = capsys.readouterr().out
    assert _row(out, "mlm", "fp32")[3:] == ["11.00", "1100", "1.00x", "100", "-", "2/3", "ok", "cpu_peak_rss"]
    assert _row(out, "mlm", "amp_bf16")[3:] == ["22.00", "2200", "2.00x", "50", "-", "2/3", "ok", "cpu_peak_rss"]
    assert _row(out, "mlm", "pure_bf16")[8] == "ok"


def test_precision_throughput_a_diverged_repeat_is_not_ok_but_its_steps_were_timed(monkeypatch, tmp_path, capsys):
    """A repeat that diverged (pure_fp16 with a small eps) ran and timed its steps: its figures count, and the
    status says how many repeats were ok (a diverged one is not); a row that all diverged says 'diverged'."""
    div = {**_pt_metrics(40, 4000, 50, None), "status": "diverged"}
    table = {("mlm", "fp32"): [_pt_metrics(10, 1000, 100, None)] * 3,
             ("mlm", "pure_fp16"): [_pt_metrics(20, 2000, 50, None), div, _pt_metrics(30, 3000, 50, None)],
             ("mlm", "pure_bf16"): [div] * 3}
    _run_pt(monkeypatch, tmp_path, table, ["--repeats", "3", "--objectives", "mlm", "--precisions",
                                           "fp32,pure_fp16,pure_bf16"])
    out = capsys.readouterr().out
    assert _row(out, "mlm", "pure_fp16")[3:] == ["30.00", "3000", "3.00x", "50", "-", "2/3", "ok", "cpu_peak_rss"]
    assert _row(out, "mlm", "pure_bf16")[8] == "diverged"


def test_precision_throughput_metrics_out_keeps_the_runs_before_an_interruption(monkeypatch, tmp_path):
    """--metrics-out is written after every precision: a run stopped by a time limit (here an error, not a failed
    process, in the second precision's run) leaves the first precision's records on disk."""
    out_json = tmp_path / "all.json"
    table = {("mlm", "fp32"): [_pt_metrics(10, 1000, 100, None)], ("mlm", "amp_bf16"): [RuntimeError("time limit")]}
    with pytest.raises(RuntimeError):
        _run_pt(monkeypatch, tmp_path, table, ["--repeats", "1", "--objectives", "mlm", "--precisions",
                                               "fp32,amp_bf16", "--metrics-out", str(out_json)])
    assert [(r["precision"], r["steps_per_second"]) for r in json.loads(out_json.read_text())] == [("fp32", 10)]


# ================================================================== batch_size_sweep.py
def test_batch_size_sweep_memory_growth_and_ratios(monkeypatch, tmp_path, capsys):
    """Per (batch, precision): peak and baseline in MiB, growth = peak - baseline; 'memory relative to fp32'
    divides each precision's peak (and growth) by fp32's at the same batch size; the options reach the runs."""
    bss = _load("batch_size_sweep")
    mib = 2**20  # the engine's bytes; the table is in MiB
    # (bs, precision): (peak MiB, baseline MiB, samples/s)
    table = {(4, "fp32"): (500, 480, 100.0), (4, "amp_bf16"): (600, 480, 90.0),
             (8, "fp32"): (540, 480, 150.0), (8, "amp_bf16"): (570, 480, 160.0)}
    calls, prep = [], []

    def engine_run(data, obj, prec, **hp):
        calls.append({"data": data, "objective": obj, "precision": prec, **hp})
        peak, base, sps = table[(hp["batch_size"], prec)]
        return {"status": "ok", "peak_memory_bytes": peak * mib, "memory_baseline_bytes": base * mib,
                "memory_kind": "cpu_peak_rss", "samples_per_second": sps, "step_seconds_median": 0.1,
                "device": "cpu"}

    monkeypatch.setattr(bss._bench, "engine_run", engine_run)
    monkeypatch.setattr(bss._bench, "prepare", lambda root, **kw: prep.append(kw) or _fake_prepare([])(root))
    monkeypatch.setattr(bss, "_plot", lambda df, path, kind, args: None)
    out = tmp_path / "sweep"
    monkeypatch.setattr(sys, "argv", ["batch_size_sweep.py", "--batch-sizes", "4", "8", "--precisions", "fp32",
                                      "amp_bf16", "--objective", "classify", "--steps", "9",
                                      "--timing-warmup-steps", "3", "--threads", "2", "--device", "cpu",
                                      "--hidden", "64", "--out", str(out)])
    bss.main()
    text = capsys.readouterr().out
    assert prep == [{"n_corpus": 6000, "n_train": 2000}]
    assert len(calls) == 4
    for c in calls:
        assert c["objective"] == "classify" and c["data"].name == "prepared-classify"
        assert (c["steps"], c["timing_warmup_steps"], c["threads"], c["device"]) == (9, 3, 2, "cpu")
        assert c["model"]["hidden_size"] == 64 and c["model"]["intermediate_size"] == 256
        assert c["adam_eps"] == 1e-8
    import pandas as pd

    df = pd.read_csv(out / "sweep.csv")
    r = df[(df.precision == "amp_bf16") & (df.batch_size == 4)].iloc[0]
    assert (r.peak_memory_mib, r.baseline_mib, r.loop_growth_mib, r.samples_per_second) == (600, 480, 120, 90.0)
    assert df[(df.precision == "fp32") & (df.batch_size == 8)].iloc[0].loop_growth_mib == 60
    # amp_bf16 vs fp32: bs4 peak 600/500, growth 120/20; bs8 570/540, 90/60
    assert "  amp_bf16   bs4: 1.20; 6.00 | bs8: 1.06; 1.50" in text
    assert "memory = cpu_peak_rss" in text
    line = next(x for x in text.splitlines() if x.startswith("  bs=8   amp_bf16"))
    assert line.split()[2:9] == ["peak", "570.0", "MiB", "growth", "90.0", "MiB", "160.0"]


def test_batch_size_sweep_goes_on_past_a_run_that_measured_nothing(monkeypatch, tmp_path, capsys):
    """A skipped point (e.g. pure_bf16 where the device lacks bf16: status skipped, no memory or speed) is a
    row of dashes and its status, not a crash of the whole sweep (it used to stop on format(None, '8.1f'));
    its ratio to fp32 is '-', and the other points are still measured and written."""
    bss = _load("batch_size_sweep")
    monkeypatch.setattr(bss._bench, "prepare", lambda root, **kw: _fake_prepare([])(root))
    monkeypatch.setattr(bss._bench, "engine_run", lambda d, o, p, **hp: (
        {"status": "skipped", "peak_memory_bytes": None, "memory_baseline_bytes": None, "memory_kind": None,
         "samples_per_second": None} if p == "pure_bf16" and hp["batch_size"] == 8 else
        {"status": "ok", "peak_memory_bytes": (300 if p == "fp32" else 150) * bss.MIB,
         "memory_baseline_bytes": 100 * bss.MIB, "memory_kind": "cpu_peak_rss", "samples_per_second": 5.0}))
    monkeypatch.setattr(bss, "_plot", lambda *a: None)
    monkeypatch.setattr(sys, "argv", ["batch_size_sweep.py", "--batch-sizes", "4", "8", "--precisions", "fp32",
                                      "pure_bf16", "--out", str(tmp_path)])
    bss.main()
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("  bs=8   pure_bf16"))
    assert line.split()[2:9] == ["peak", "-", "MiB", "growth", "-", "MiB", "-"] and line.endswith("skipped")
    assert "  pure_bf16  bs4: 0.50; 0.25 | bs8: -; -" in text
    import pandas as pd

    df = pd.read_csv(tmp_path / "sweep.csv")
    assert sorted(zip(df.batch_size, df.precision, df.status)) == [
        (4, "fp32", "ok"), (4, "pure_bf16", "ok"), (8, "fp32", "ok"), (8, "pure_bf16", "skipped")]


def test_batch_size_sweep_ratio_to_an_fp32_growth_of_zero_is_a_dash(monkeypatch, tmp_path, capsys):
    """fp32's loop grew by 0 MiB (peak == baseline): no growth ratio ('-', not inf); the peak ratio stands."""
    bss = _load("batch_size_sweep")
    monkeypatch.setattr(bss._bench, "prepare", lambda root, **kw: _fake_prepare([])(root))
    monkeypatch.setattr(bss._bench, "engine_run", lambda d, o, p, **hp: {
        "status": "ok", "peak_memory_bytes": (100 if p == "fp32" else 150) * bss.MIB,
        "memory_baseline_bytes": 100 * bss.MIB, "memory_kind": "cpu_peak_rss", "samples_per_second": 5.0})
    monkeypatch.setattr(bss, "_plot", lambda *a: None)
    monkeypatch.setattr(sys, "argv", ["batch_size_sweep.py", "--batch-sizes", "4", "--precisions", "fp32",
                                      "amp_bf16", "--out", str(tmp_path)])
    bss.main()
    assert "  amp_bf16   bs4: 1.50; -" in capsys.readouterr().out
    assert bss._num(float("nan"), "8.1f") == "       -" and bss._num(None, ".2f") == "-"


def test_batch_size_sweep_trains_on_enough_rows_for_the_largest_batch(monkeypatch, tmp_path):
    bss = _load("batch_size_sweep")
    prep, eps = [], []
    monkeypatch.setattr(bss._bench, "prepare", lambda root, **kw: prep.append(kw) or _fake_prepare([])(root))
    monkeypatch.setattr(bss._bench, "engine_run", lambda d, o, p, **hp: eps.append(hp["adam_eps"]) or {
        "status": "ok", "peak_memory_bytes": 2 * bss.MIB, "memory_baseline_bytes": bss.MIB,
        "memory_kind": "cuda_max_allocated", "samples_per_second": 1.0})
    monkeypatch.setattr(bss, "_plot", lambda *a: None)
    monkeypatch.setattr(sys, "argv", ["batch_size_sweep.py", "--batch-sizes", "1500", "--precisions", "pure_fp16",
                                      "--out", str(tmp_path)])
    bss.main()
    assert prep == [{"n_corpus": 6000, "n_train": 3000}]
    assert eps == [1e-4]  # pure_fp16: with 1e-8 (0 in fp16) it diverges


# ================================================================== pretrain_transfer.py
def _fake_transfer_cli(seen):
    """`precswitch` as pretrain_transfer.py calls it: prepare writes meta.json, train writes metrics.json
    whose fine-tuning accuracy shows where it started from (0.6 + seed/100 from a checkpoint, 0.5 from scratch)."""
    def cli(*args):
        seen.append(args)
        if args[0] == "prepare":
            out = Path(args[args.index("--out") + 1])
            out.mkdir(parents=True)
            (out / "meta.json").write_text(json.dumps({"n_train": 30, "n_eval": 10, "majority_accuracy": 0.5}))
        if args[0] == "train":
            hp, out = json.loads(args[args.index("--hparams") + 1]), Path(args[args.index("--out") + 1])
            out.mkdir(parents=True)
            if hp["stage"] == "pretrain":
                m = {"steps_completed": hp["steps"], "train_seconds": 3.0, "eval_loss": 2.5, "mlm_accuracy": 0.4}
            else:
                scratch = hp["init"] == "scratch"
                m = {"accuracy": 0.5 if scratch else 0.6 + hp["seed"] / 100, "f1": 0.1 if scratch else 0.7}
            (out / "metrics.json").write_text(json.dumps(m))
        return ""
    return cli


def test_pretrain_transfer_pairs_each_seed_and_reports_the_gain(monkeypatch, tmp_path, capsys):
    pt = _load("pretrain_transfer")
    seen = []
    monkeypatch.setattr(pt, "cli", _fake_transfer_cli(seen))
    cfg = pt.yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    cfg["train"]["finetune"]["max_length"] = 48
    cfg["tokenizer"]["vocab_size"] = 3210
    (tmp_path / "c.yaml").write_text(pt.yaml.safe_dump(cfg))
    monkeypatch.setattr(sys, "argv", ["pretrain_transfer.py", "--seeds", "1", "4", "10", "--pretrain-steps", "7",
                                      "--finetune-steps", "5", "--language", '{"n_topics": 3}',
                                      "--synth-seed", "9", "--keep", str(tmp_path / "w"), "--config",
                                      str(tmp_path / "c.yaml")])
    pt.main()
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "w" / "pretrain_transfer.json").read_text())
    assert [(r["seed"], r["acc_pretrained"], r["acc_scratch"], r["stage1_steps"]) for r in rows] == [
        (1, 0.61, 0.5, 7), (4, 0.64, 0.5, 7), (10, 0.7, 0.5, 7)]
    assert rows[0]["f1_pretrained"] == 0.7 and rows[0]["f1_scratch"] == 0.1
    assert "gain +0.110" in out and "gain +0.140" in out
    # gains 0.11, 0.14, 0.20: mean 0.15 (the median would be 0.14)
    assert "pre-trained 0.650, scratch 0.500; paired gain +0.150 (min +0.110, max +0.200) over 3 seed(s)" in out
    synth = next(a for a in seen if a[0] == "synth")
    assert synth[synth.index("--seed") + 1] == "9" and synth[synth.index("--language") + 1] == '{"n_topics": 3}'
    syn = cfg["data"]["synthetic"]
    assert [synth[synth.index(o) + 1] for o in ("--n-corpus", "--n-train", "--n-dev")] == [
        str(syn["n_corpus"]), str(syn["n_train"]), str(syn["n_dev"])]
    tok = next(a for a in seen if a[0] == "tokenizer")
    assert tok[tok.index("--vocab-size") + 1] == str(cfg["tokenizer"]["vocab_size"])
    prep = {a[a.index("--objective") + 1]: a for a in seen if a[0] == "prepare"}
    for stage, obj in (("pretrain", "mlm"), ("finetune", "classify")):
        assert prep[obj][prep[obj].index("--max-length") + 1] == str(cfg["train"][stage]["max_length"])
    trains = [json.loads(a[a.index("--hparams") + 1]) for a in seen if a[0] == "train"]
    assert [(h["stage"], h["seed"], h.get("init")) for h in trains] == [
        ("pretrain", 1, None), ("finetune", 1, str(tmp_path / "w" / "pretrain-seed1" / "checkpoint")),
        ("finetune", 1, "scratch"),
        ("pretrain", 4, None), ("finetune", 4, str(tmp_path / "w" / "pretrain-seed4" / "checkpoint")),
        ("finetune", 4, "scratch"),
        ("pretrain", 10, None), ("finetune", 10, str(tmp_path / "w" / "pretrain-seed10" / "checkpoint")),
        ("finetune", 10, "scratch")]
    pre, ft = trains[0], trains[1]
    assert pre["steps"] == 7 and pre["epochs"] is None  # the override
    assert ft["steps"] == 5 and ft["epochs"] is None  # each stage its own override
    assert pre["precision"] == ft["precision"] == "fp32" and pre["save_checkpoint"] is True
    assert trains[1] == {**trains[2], "init": trains[1]["init"]}  # the pair differs in its init only


def test_pretrain_transfer_stage_hparams_are_the_studys():
    pt = _load("pretrain_transfer")
    cfg = {"train": {"finetune": {"steps": 5, "epochs": None, "lr": 3e-4, "adam_eps": 1e-6, "batch_size": 16,
                                  "warmup_ratio": 0.1, "weight_decay": 0.01, "max_length": 64, "log_every": 3}},
           "model": {"init": "scratch", "revision": None, "hidden_size": 8}, "threads": 3}
    hp = pt.stage_hparams(cfg, "finetune")
    assert hp == {"steps": 5, "lr": 3e-4, "adam_eps": 1e-6, "batch_size": 16, "warmup_ratio": 0.1,
                  "weight_decay": 0.01, "model": {"hidden_size": 8}, "threads": 3, "device": "cpu"}


# ================================================================== engine_vs_trainer.py
def test_engine_vs_trainer_medians_ratio_and_verdict(monkeypatch, capsys):
    """Per row: median engine steps/s and median Trainer steps/s over the repeats, their ratio; the verdict
    is on the worst ratio (>= 1.10). Both sides get the same steps, warm-up, threads, precision and data."""
    evt = _load("engine_vs_trainer")
    eng = {("mlm", "fp32"): [30, 33, 90], ("mlm", "amp_bf16"): [24, 22, 23],
           ("classify", "fp32"): [40, 40, 40], ("classify", "amp_bf16"): [50, 50, 50]}
    trn = {("mlm", "fp32"): [20, 22, 21], ("mlm", "amp_bf16"): [20, 20, 100],
           ("classify", "fp32"): [20, 20, 20], ("classify", "amp_bf16"): [25, 25, 25]}
    ecalls, tcalls = [], []

    def engine_run(data, obj, prec, **hp):
        ecalls.append({"data": data, "objective": obj, "precision": prec, **hp})
        return {"steps_per_second": eng[(obj, prec)].pop(0)}

    def run(cmd, **kw):
        args = json.loads(cmd[-1])
        assert cmd[:3] == [evt.PY, "-c", evt.TRAINER_SCRIPT]
        tcalls.append(args)
        sps = trn[(args["objective"], args["precision"])].pop(0)
        return subprocess.CompletedProcess(cmd, 0, f"noise\n{json.dumps({'steps_per_second': sps})}\n", "")

    monkeypatch.setattr(evt, "engine_run", engine_run)
    monkeypatch.setattr(evt, "prepare", _fake_prepare([]))
    monkeypatch.setattr(evt.subprocess, "run", run)
    monkeypatch.setattr(sys, "argv", ["engine_vs_trainer.py", "--steps", "9", "--warmup", "2", "--threads", "3"])
    evt.main()
    out = capsys.readouterr().out
    assert _row(out, "mlm", "fp32")[2:] == ["33.00", "21.00", "1.57"]
    assert _row(out, "mlm", "amp_bf16")[2:] == ["23.00", "20.00", "1.15"]
    assert _row(out, "classify", "amp_bf16")[2:] == ["50.00", "25.00", "2.00"]
    assert "# worst ratio 1.15 (target >= 1.10): PASS" in out
    assert len(ecalls) == len(tcalls) == 12
    for e, t in zip(ecalls, tcalls):
        assert (e["objective"], e["precision"]) == (t["objective"], t["precision"])
        assert e["data"] == Path(t["data"]) and e["data"].name == f"prepared-{e['objective']}"
        assert (e["steps"], e["timing_warmup_steps"], e["threads"]) == (t["steps"], t["warmup"], t["threads"]) == (9, 2, 3)
        assert e["optimizer_impl"] == "fused" and e["adam_eps"] == 1e-8
        assert t["batch_size"] == 32 and t["lr"] == 5e-4 and t["model"] == evt.MODEL


def test_engine_vs_trainer_verdict_at_the_threshold(monkeypatch, capsys):
    evt = _load("engine_vs_trainer")
    monkeypatch.setattr(evt, "prepare", _fake_prepare([]))
    for e_sps, verdict in ((11.0, "PASS"), (10.99, "FAIL")):
        monkeypatch.setattr(evt, "engine", lambda *a: e_sps)
        monkeypatch.setattr(evt, "trainer", lambda *a: 10.0)
        monkeypatch.setattr(sys, "argv", ["engine_vs_trainer.py", "--repeats", "1", "--objectives", "mlm",
                                          "--precisions", "fp32"])
        evt.main()
        assert f"(target >= 1.10): {verdict}" in capsys.readouterr().out


def _exec_trainer_script(evt, monkeypatch, tmp_path, capsys, precision="fp32", steps=6, warmup=2,
                         step_times=(5.0, 3.0, 1.0, 1.0, 2.0, 2.0)):
    """Run TRAINER_SCRIPT in this process with stand-ins for transformers and datasets: the fake Trainer
    calls the script's callback once per step, each step taking step_times[i] on a fake clock."""
    clock, got = Clock(), {}
    tf = types.ModuleType("transformers")

    class Trainer:
        def __init__(self, model, args, train_dataset, data_collator, callbacks):
            got["args"], self.callbacks = args, callbacks
            self.state = types.SimpleNamespace(log_history=[{"train_loss": 1.5}])

        def train(self):
            for i in range(got["args"]["max_steps"]):
                for cb in self.callbacks:  # TrainerCallback's own on_step_begin does nothing
                    getattr(cb, "on_step_begin", lambda *a: None)(got["args"], self.state, None)
                clock.sleep(step_times[i])
                for cb in self.callbacks:
                    cb.on_step_end(got["args"], self.state, None)

    tf.Trainer, tf.TrainerCallback, tf.TrainingArguments = Trainer, object, lambda **kw: kw
    tf.BertConfig = lambda **kw: kw
    tf.BertForMaskedLM = tf.BertForSequenceClassification = lambda cfg: ("model", cfg)
    tf.DataCollatorForLanguageModeling = tf.DataCollatorWithPadding = lambda *a, **k: "collator"
    tf.AutoTokenizer = types.SimpleNamespace(
        from_pretrained=lambda p: type("Tok", (), {"__len__": lambda s: 100, "pad_token_id": 0})())
    tf.set_seed = lambda s: None
    tf.utils = types.SimpleNamespace(logging=types.SimpleNamespace(set_verbosity_error=lambda: None))
    ds = types.ModuleType("datasets")
    ds.load_from_disk = lambda p: {"train": "rows"}
    ds.disable_progress_bars = lambda: None
    monkeypatch.setitem(sys.modules, "transformers", tf)
    monkeypatch.setitem(sys.modules, "datasets", ds)
    import time as real_time
    monkeypatch.setattr(real_time, "perf_counter", clock)
    (tmp_path / "meta.json").write_text(json.dumps({"tokenizer": "tok", "num_labels": 2}))
    args = {"data": str(tmp_path), "objective": "mlm", "precision": precision, "steps": steps, "seed": 1,
            "model": evt.MODEL, "threads": 1, "batch_size": 32, "lr": 5e-4, "warmup": warmup, "tmp": str(tmp_path)}
    monkeypatch.setattr(sys, "argv", ["-c", json.dumps(args)])
    exec(compile(evt.TRAINER_SCRIPT, "<trainer>", "exec"), {"__name__": "__main__"})
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1]), got["args"]


def test_engine_vs_trainer_a_failed_trainer_process_stops_with_its_reason(monkeypatch):
    evt = _load("engine_vs_trainer")
    monkeypatch.setattr(evt.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, "", "Traceback...\nImportError: accelerate"))
    a = types.SimpleNamespace(steps=6, threads=1, warmup=1)
    with pytest.raises(SystemExit) as e:
        evt.trainer(Path("d"), "mlm", "fp32", a)
    assert "ImportError: accelerate" in str(e.value.code)


def test_trainer_script_times_the_steps_after_the_warmup(monkeypatch, tmp_path, capsys):
    """Trainer's steady-state steps/s: the steps after the first `warmup` ones over the time between the end
    of step `warmup` and the end of the last step (4 steps taking 1 + 1 + 2 + 2 s here: 4 / 6 s), as the
    engine's timing_warmup_steps; and the TrainingArguments are the engine's run (steps, batch, lr, bf16)."""
    evt = _load("engine_vs_trainer")
    res, targs = _exec_trainer_script(evt, monkeypatch, tmp_path, capsys)
    assert res["steps_per_second"] == pytest.approx(4 / 6) and res["steps"] == 6 and res["final_loss"] == 1.5
    assert targs["max_steps"] == 6 and targs["per_device_train_batch_size"] == 32 and targs["learning_rate"] == 5e-4
    assert targs["bf16"] is False and targs["use_cpu"] is True and targs["optim"] == "adamw_torch_fused"
    assert targs["max_grad_norm"] == 1.0 and targs["warmup_steps"] == 1  # round(0.1 x 6), the engine's warmup_ratio
    from precswitch.train.config import DEFAULTS  # the engine's run: its defaults (engine_run sets lr, batch)

    assert (targs["weight_decay"], targs["adam_epsilon"], targs["max_grad_norm"]) == (
        DEFAULTS["weight_decay"], DEFAULTS["adam_eps"], DEFAULTS["max_grad_norm"])
    assert targs["dataloader_drop_last"] is True  # the engine's batches are all full (n // batch_size per epoch)
    res, targs = _exec_trainer_script(evt, monkeypatch, tmp_path, capsys, precision="amp_bf16", warmup=1)
    assert res["steps_per_second"] == pytest.approx(5 / 9) and targs["bf16"] is True


def test_trainer_script_without_warmup_times_every_step(monkeypatch, tmp_path, capsys):
    """--warmup 0: every step, from the first step's start (6 steps in 14 s), as the engine's
    timing_warmup_steps 0; it used to divide by ends[-1] - ends[-1] = 0. A warm-up that leaves no timed
    step is refused before anything runs."""
    evt = _load("engine_vs_trainer")
    res, _ = _exec_trainer_script(evt, monkeypatch, tmp_path, capsys, warmup=0)
    assert res["steps_per_second"] == pytest.approx(6 / 14)
    monkeypatch.setattr(evt, "prepare", lambda root: pytest.fail("prepared data despite a bad --warmup"))
    for bad in (["--warmup", "9", "--steps", "9"], ["--warmup", "-1"]):
        monkeypatch.setattr(sys, "argv", ["engine_vs_trainer.py", *bad])
        with pytest.raises(SystemExit) as e:
            evt.main()
        assert e.value.code == 2
    assert "--warmup 9: needs 0 <= warmup < --steps (9)" in capsys.readouterr().err


# ================================================================== input_pipeline.py
@pytest.fixture(scope="module")
def ip():
    return _load("input_pipeline")


class _FakeBatches:
    """Batches.get taking cost_ms of the fake clock per call (the first calls slower: a warm-up)."""

    def __init__(self, clock, cost_ms, slow_first=0, slow_ms=0.0):
        self.clock, self.cost, self.slow_first, self.slow, self.calls = clock, cost_ms, slow_first, slow_ms, []

    def get(self, step):
        self.clock.sleep((self.slow if len(self.calls) < self.slow_first else self.cost) / 1e3)
        self.calls.append(step)
        return {"step": step}


def test_collation_ms_is_the_median_after_five_warmup_calls(ip, monkeypatch):
    clock = Clock()
    fb = _FakeBatches(clock, 2.0, slow_first=5, slow_ms=500.0)
    costs = iter([1.0, 2.0, 9.0])  # the timed calls: median 2, mean 4
    steps = []

    def get(step):
        steps.append(step)
        clock.sleep((500.0 if step < 5 else next(costs)) / 1e3)

    fb.get = get
    monkeypatch.setattr(ip, "_batches", lambda data, obj: fb)
    monkeypatch.setattr(ip, "time", types.SimpleNamespace(perf_counter=clock, sleep=clock.sleep))
    monkeypatch.setattr(ip.torch, "set_num_threads", lambda n: None)
    assert ip.collation_ms(Path("d"), "mlm", 3) == pytest.approx(2.0)
    assert steps == list(range(8))  # 5 warm-up calls made (not timed), then the 3 timed ones


def test_input_pipeline_batches_are_the_engines(ip, monkeypatch):
    """_batches builds what the engine's loop builds: batch 32, seed 0, the engine's default masking rate."""
    from precswitch.train.config import DEFAULTS

    seen = {}
    monkeypatch.setattr(ip, "_load_data", lambda hp: seen.update(hp=hp) or ("rows", None, {"meta": 1}))
    monkeypatch.setattr(ip, "_load_tokenizer", lambda hp, meta: "tok")
    monkeypatch.setattr(ip, "_model_columns", lambda train, obj: ("cols", train, obj))
    monkeypatch.setattr(ip, "_make_collator", lambda obj, tok, p: ("coll", obj, tok, p))
    monkeypatch.setattr(ip, "Batches", lambda *a: a)
    got = ip._batches(Path("data"), "mlm")
    assert got == (("cols", "rows", "mlm"), 32, 0, ("coll", "mlm", "tok", DEFAULTS["mlm_probability"]))
    assert seen["hp"]["data"] == "data" and seen["hp"]["objective"] == "mlm"


def test_simulated_step_serial_overlap_and_reference(ip, monkeypatch):
    """A step of 8 ms of device work: no batch built 8 ms; the batch (3 ms) built after the sync 11 ms; built
    during the device work, hidden: 8 ms. The first 5 steps (a slow 50 ms batch each here) are not in the mean;
    each step builds the next step's batch."""
    clock = Clock()
    monkeypatch.setattr(ip, "time", types.SimpleNamespace(perf_counter=clock, sleep=clock.sleep))
    for overlap, want in ((None, 8.0), (False, 11.0), (True, 8.0)):
        fb = _FakeBatches(clock, 3.0, slow_first=6, slow_ms=50.0)
        monkeypatch.setattr(ip, "_batches", lambda data, obj: fb)
        assert ip.simulated_step_ms(Path("d"), 10, 8.0, overlap) == pytest.approx(want)
        assert fb.calls == ([0] if overlap is None else list(range(11)))
    fb = _FakeBatches(clock, 7.5)  # a batch just shorter than the device work: the rest of the 8 ms is waited for
    monkeypatch.setattr(ip, "_batches", lambda data, obj: fb)
    assert ip.simulated_step_ms(Path("d"), 8, 8.0, True) == pytest.approx(8.0)
    fb = _FakeBatches(clock, 12.0)  # a batch longer than the device work: the overlap shows it
    monkeypatch.setattr(ip, "_batches", lambda data, obj: fb)
    assert ip.simulated_step_ms(Path("d"), 8, 8.0, True) == pytest.approx(12.0)


def test_input_pipeline_main_ratios_estimate_and_verdict(ip, monkeypatch, capsys):
    from precswitch import flops

    prep = []
    monkeypatch.setattr(ip, "prepare", _fake_prepare(prep))
    monkeypatch.setattr(ip, "collation_ms", lambda data, obj, n: {"mlm": 2.5, "classify": 1.25}[obj])
    sim = {None: 8.0, False: 11.0, True: 8.4}
    monkeypatch.setattr(ip, "simulated_step_ms", lambda data, steps, ms, overlap: sim[overlap])
    monkeypatch.setattr(sys, "argv", ["input_pipeline.py", "--batches", "20", "--device-ms", "8"])
    ip.main()
    out = capsys.readouterr().out
    assert prep[0][1] == {"max_length": 128}  # the GPU studies' 128 tokens, as printed
    assert "mlm         2.50 ms" in out and "classify    1.25 ms" in out
    assert "next batch after the sync (old loop):     11.00 ms per step (1.375 x reference)" in out
    assert "next batch during the step (engine):       8.40 ms per step (1.050 x reference)" in out
    assert "# overlap = 1.050 x reference (target <= 1.05): PASS" in out
    f = flops.train_step_flops(ip.BERT_BASE, 32, 128, "mlm", head_rows=flops.engine_head_rows(32, 128))
    assert f"{f / 1e12:.2f} TFLOP -> {1e3 * f / (0.35 * 790e12):.1f} ms (not measured)" in out
    assert "at 35% MFU of 790 TFLOP/s" in out
    assert "mlm batches, mean of steps 6-20 (the first 5 are warm-up)" in out
    sim[True] = 8.41
    ip.main()
    assert "(target <= 1.05): FAIL" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["input_pipeline.py", "--batches", "5"])  # nothing left to time
    monkeypatch.setattr(ip, "prepare", lambda root, **kw: pytest.fail("prepared data despite a bad --batches"))
    with pytest.raises(SystemExit) as e:
        ip.main()
    assert e.value.code == 2 and "--batches 5: needs more than the 5 warm-up steps" in capsys.readouterr().err


# ================================================================== checkpoint_cost.py
def test_checkpoint_cost_per_save_and_share(monkeypatch, capsys):
    cc = _load("checkpoint_cost")
    calls = []

    def engine_run(data, obj, prec, **hp):
        calls.append({"objective": obj, "precision": prec, **hp})
        on = "checkpoint_every_steps" in hp
        return {"state_saves": 4 if on else 0, "state_save_seconds": 2.0 if on else 0.0,
                "train_seconds": 40.0 if on else 39.0, "checkpoint_seconds": 2.7 if on else 0.7,
                "eval_loss": 3.25}

    monkeypatch.setattr(cc, "engine_run", engine_run)
    monkeypatch.setattr(cc, "prepare", _fake_prepare([]))
    monkeypatch.setattr(sys, "argv", ["checkpoint_cost.py", "--steps", "20", "--every", "5", "--precision", "fp32"])
    cc.main()
    out = capsys.readouterr().out
    assert "saves 4; 500 ms per save; 2.00 s in all = 5.0% of train_seconds (40.0 s)" in out
    assert "train_seconds without state 39.0 s, with 40.0 s (saves excluded); final checkpoint write 0.70 s" in out
    off, on = calls
    assert "checkpoint_every_steps" not in off and on["checkpoint_every_steps"] == 5
    for c in calls:
        assert (c["objective"], c["precision"], c["steps"], c["threads"], c["save_checkpoint"]) == (
            "mlm", "fp32", 20, 1, True)


# ================================================================== pipeline_overhead.py
def _study(workdir: Path, results_dir: str = "results"):
    """What a finished study leaves: 3 runs' metrics.json and Snakemake's benchmark files."""
    res = workdir / results_dir
    for i, (train, ev) in enumerate(((30.0, 2.0), (40.0, 3.0), (50.0, 5.0))):
        d = res / "runs" / ("pretrain" if i == 0 else "finetune") / f"r{i}" / "seed1"
        d.mkdir(parents=True)
        (d / "metrics.json").write_text(json.dumps({"train_seconds": train, "eval_seconds": ev,
                                                     "setup_seconds": 1.0, "checkpoint_seconds": 0.5}))
    for rel, s in (("data/synth.tsv", 5.0), ("pretrain/fp32/seed1.tsv", 80.0), ("finetune/a/seed1.tsv", 30.0),
                   ("finetune/b/seed1.tsv", 40.0)):
        f = res / "benchmarks" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"s\th:m:s\tmax_rss\n{s}\t0:00:{int(s)}\t100\n")


def _run_overhead(monkeypatch, tmp_path, cfg_text, cores, results_dir="results"):
    po = _load("pipeline_overhead")
    clock, cmds = Clock(), []
    work = tmp_path / "work"

    def run(cmd, **kw):
        cmds.append(cmd)
        if "--report" not in cmd:
            _study(work, results_dir)
            clock.sleep(100.0)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    cfg = tmp_path / "study.yaml"
    tmp_path.mkdir(exist_ok=True)
    cfg.write_text(cfg_text)
    monkeypatch.setattr(po.subprocess, "run", run)
    monkeypatch.setattr(po, "time", types.SimpleNamespace(perf_counter=clock))
    assert po.main(["--configfile", str(cfg), "--cores", str(cores), "--workdir", str(work)]) == 0
    return cmds


def test_pipeline_overhead_wall_useful_slots_and_process_time(monkeypatch, tmp_path, capsys):
    """slots = cores // threads (at most the number of runs); useful = (train + eval) / slots; overhead =
    wall - useful; training processes beyond train+eval = their Snakemake job wall - (train + eval)."""
    cmds = _run_overhead(monkeypatch, tmp_path, "threads: 2\ndevice: cpu\n", cores=4)
    out = capsys.readouterr().out
    res = json.loads(out.strip().splitlines()[-1])
    assert (res["wall_seconds"], res["train_seconds"], res["eval_seconds"], res["slots"], res["runs"]) == (
        100.0, 120.0, 10.0, 2, 3)
    assert res["overhead_seconds"] == 35.0 and res["overhead_percent"] == 35.0 and res["setup_seconds_sum"] == 3.0
    assert res["process_seconds_beyond_train_eval_sum"] == 20.0
    assert res["benchmark_seconds_by_group"] == {"data": 5.0, "pretrain": 80.0, "finetune": 70.0}
    assert "-> 10.0 s of wall" in out and "rest: data + analysis jobs, Snakemake, idle slots      25.0 s" in out
    (cmd,) = cmds
    assert cmd[cmd.index("--cores") + 1] == "4" and cmd[cmd.index("-d") + 1] == str(tmp_path / "work")
    assert cmd[cmd.index("--configfile") + 1] == str(tmp_path / "study.yaml")


def test_pipeline_overhead_failed_snakemake_is_reported_and_a_given_workdir_kept(monkeypatch, tmp_path, capsys):
    po = _load("pipeline_overhead")
    work = tmp_path / "work"
    monkeypatch.setattr(po.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "out", "MissingInput"))
    assert po.main(["--cores", "1", "--workdir", str(work)]) == 1
    err = capsys.readouterr().err
    assert "MissingInput" in err and f"snakemake failed (1); workdir kept: {work}" in err
    _run_overhead(monkeypatch, tmp_path, "threads: 1\n", cores=1)  # --workdir given: kept after a success too
    assert (tmp_path / "work" / "results" / "runs").is_dir() and "(removed)" not in capsys.readouterr().out


def test_pipeline_overhead_slots_never_exceed_runs_and_one_per_gpu(monkeypatch, tmp_path, capsys):
    _run_overhead(monkeypatch, tmp_path, "threads: 1\ndevice: cpu\n", cores=16)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["slots"] == 3  # 16 slots, 3 runs
    _run_overhead(monkeypatch, tmp_path / "g", "threads: 1\ndevice: cuda\n", cores=16)
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["slots"] == 1 and res["overhead_seconds"] == 100.0 - 130.0


# ================================================================== telemetry_overhead.py
def test_telemetry_overheads_from_step_times():
    """Overheads vs the baseline's mean (mean column) and median (median column); a sampled step's cost is
    its median's excess over the baseline median, amortised over `every` steps."""
    to = _load("telemetry_overhead")
    times = {"baseline": [1.0, 1.0, 4.0], "off": [1.0, 1.5, 1.5], "on_every2": [1.5, 3.0, 3.0]}
    f = to.overheads(times, [3.0, 3.0, 1.5], 2)
    assert f["variants"]["baseline"] == {"median": 1.0, "mean": 2.0, "overhead_mean": 0.0, "overhead_median": 0.0}
    off = f["variants"]["off"]
    assert (off["median"], off["mean"]) == (1.5, pytest.approx(4 / 3))
    assert off["overhead_mean"] == pytest.approx(4 / 3 / 2 - 1) and off["overhead_median"] == pytest.approx(0.5)
    assert f["sampled_median"] == 3.0 and f["sampled_extra"] == 2.0 and f["amortised"] == 1.0


def test_telemetry_overhead_interleaves_and_samples_every_kth_own_step(monkeypatch, capsys):
    """Each variant runs rounds x steps steps (the 5 warm-up steps in none of them); the sampled steps are the
    on-variant's every K-th own step, the same steps its telemetry watched."""
    to = _load("telemetry_overhead")
    import transformers

    real = transformers.BertConfig
    monkeypatch.setattr(transformers, "BertConfig", lambda **kw: real(**{
        **kw, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "max_position_embeddings": 64}))
    real_randint = to.torch.randint  # the batch: 2 x 8 tokens instead of 32 x 64
    monkeypatch.setattr(to.torch, "randint", lambda lo, hi, shape, **kw: real_randint(lo, hi, (2, 8), **kw))
    got = {}
    fig = {"variants": {n: {"median": 0.5, "mean": 0.25, "overhead_mean": 0.125, "overhead_median": 0.0625}
                        for n in ("baseline", "off", "on_every3")}, "sampled_median": 0.75, "sampled_extra": 0.5,
           "amortised": 0.5 / 3}
    monkeypatch.setattr(to, "overheads", lambda t, s, e: got.update(times=t, sampled=s, every=e) or fig)
    monkeypatch.setattr(sys, "argv", ["telemetry_overhead.py", "--rounds", "2", "--steps", "4", "--every", "3"])
    to.main()
    out = capsys.readouterr().out
    assert {k: len(v) for k, v in got["times"].items()} == {"baseline": 8, "off": 8, "on_every3": 8}
    assert len(got["sampled"]) == 3 and got["every"] == 3  # own steps 0, 3, 6
    assert "3 steps sampled" in out and "hooks registered now: off=0" in out
    # variant, median ms, mean ms, overhead (mean), overhead (median): each figure under its own heading
    assert _row(out, "off") == ["off", "500.00", "250.00", "12.50%", "6.25%"]
    assert "median 750.00 ms = +50.0% vs baseline median -> amortised at every=3: +16.67%" in out


def test_telemetry_overhead_rotates_the_order_and_off_never_samples(monkeypatch, capsys):
    """5 un-timed warm-up steps first, then rounds x steps x 3 timed ones (optimizer steps counted); the order
    rotates step by step (baseline, off, on / off, on, baseline / on, baseline, off); "off" samples nothing;
    "on" samples its own steps 0 and 4 of 5 at every=4 (not steps 1 and 5, nor every other step)."""
    to = _load("telemetry_overhead")
    import transformers

    from precswitch import telemetry

    real = transformers.BertConfig
    monkeypatch.setattr(transformers, "BertConfig", lambda **kw: real(**{
        **kw, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "max_position_embeddings": 64}))
    real_randint = to.torch.randint
    monkeypatch.setattr(to.torch, "randint", lambda lo, hi, shape, **kw: real_randint(lo, hi, (2, 8), **kw))
    order, tels, opt_steps = [], [], []

    class Tel(telemetry.ActivationTelemetry):
        def __init__(self, model, every):
            super().__init__(model, every=every)
            tels.append(self)

        def step(self, n):
            order.append(("off" if self.every == 0 else "on", n))
            return super().step(n)

    real_adamw = to.torch.optim.AdamW

    class AdamW(real_adamw):
        def step(self, *a, **kw):
            opt_steps.append(1)
            return super().step(*a, **kw)

    monkeypatch.setattr(telemetry, "ActivationTelemetry", Tel)
    monkeypatch.setattr(to.torch.optim, "AdamW", AdamW)
    got = {}
    real_overheads = to.overheads
    monkeypatch.setattr(to, "overheads", lambda t, smp, e: got.update(times=t, sampled=smp) or real_overheads(t, smp, e))
    monkeypatch.setattr(sys, "argv", ["telemetry_overhead.py", "--rounds", "1", "--steps", "5", "--every", "4",
                                      "--precision", "pure_bf16"])
    to.main()
    assert len(opt_steps) == 5 + 15
    # i=0: b, off, on; i=1: off, on, b; i=2: on, b, off; i=3: b, off, on; i=4: off, on, b
    assert [v for v, _ in order] == ["off", "on", "off", "on", "on", "off", "off", "on", "off", "on"]
    assert [n for v, n in order if v == "on"] == [0, 1, 2, 3, 4]
    off, on = tels
    assert off.every == 0 and off.steps_sampled == 0 and on.steps_sampled == 2 and len(got["sampled"]) == 2
    assert next(on.model.parameters()).dtype == to.torch.bfloat16  # --precision pure_bf16: bf16 weights
    assert "2 steps sampled" in capsys.readouterr().out


def test_precision_throughput_vs_fp32_is_fp32s_row_whatever_the_order(monkeypatch, tmp_path, capsys):
    """'vs fp32' divides by fp32's steps/s: not by the first precision listed, nor by the next one when
    fp32's runs failed (then there is no ratio: '-')."""
    table = {("mlm", "amp_bf16"): [_pt_metrics(30, 3000, 50, None)], ("mlm", "fp32"): [_pt_metrics(10, 1000, 100, None)],
             ("classify", "fp32"): [subprocess.CalledProcessError(1, ["x"], "", "OutOfMemoryError")],
             ("classify", "amp_bf16"): [_pt_metrics(20, 2000, 50, None)]}
    _run_pt(monkeypatch, tmp_path, table, ["--repeats", "1", "--precisions", "amp_bf16,fp32"])
    out = capsys.readouterr().out
    assert _row(out, "mlm", "amp_bf16")[3:6] == ["30.00", "3000", "3.00x"]
    assert _row(out, "mlm", "fp32")[3:6] == ["10.00", "1000", "1.00x"]
    assert _row(out, "classify", "amp_bf16")[3:6] == ["20.00", "2000", "-"]


def test_pipeline_overhead_reads_the_studys_results_dir(monkeypatch, tmp_path, capsys):
    """A study with its own results_dir (config/frontier.yaml, the GPU configs) writes its runs there, not
    under results/: the overhead must count them. The config file is merged onto config/config.yaml, as
    the Snakefile does (threads and device from there when the file does not set them)."""
    _run_overhead(monkeypatch, tmp_path, "results_dir: results/mystudy\n", cores=2, results_dir="results/mystudy")
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (res["runs"], res["train_seconds"], res["slots"]) == (3, 120.0, 2)  # config.yaml: threads 1, cpu
    assert res["overhead_seconds"] == 35.0


# ================================================================== pure_fp16_eps.py
def test_pure_fp16_eps_runs_each_kernel_and_eps_and_says_how_each_ended(monkeypatch, capsys):
    """One pure_fp16 masked-LM run per (kernel, eps), the options reaching it; a cell says ok with the losses,
    or diverged with the first non-finite loss's step, or (no non-finite loss) the engine's reason."""
    pe = _load("pure_fp16_eps")
    calls = []

    def engine_run(data, obj, prec, **hp):
        calls.append((data.name, obj, prec, hp["optimizer_impl"], hp["adam_eps"], hp["steps"], hp["threads"]))
        if hp["adam_eps"] == 1e-8:
            return {"status": "diverged", "first_nonfinite_step": 16 if hp["optimizer_impl"] == "fused" else 2,
                    "status_reason": "3 non-finite losses in a row"}
        if hp["optimizer_impl"] == "foreach":
            return {"status": "diverged", "first_nonfinite_step": None, "status_reason": "eval loss 12.2 nats ..."}
        if hp["adam_eps"] == 1e-6:
            return {"status": "skipped", "status_reason": "precision 'pure_fp16' cannot run on device 'cpu'"}
        return {"status": "ok", "final_train_loss": 4.804, "eval_loss": 4.656, "first_nonfinite_step": None}

    monkeypatch.setattr(pe, "engine_run", engine_run)
    monkeypatch.setattr(pe, "prepare", _fake_prepare([]))
    pe.main(["--steps", "12", "--eps", "1e-8", "1e-4", "1e-6", "--impls", "fused", "foreach", "--threads", "1"])
    out = capsys.readouterr().out
    assert calls == [("prepared-mlm", "mlm", "pure_fp16", impl, eps, 12, 1)
                     for impl in ("fused", "foreach") for eps in (1e-8, 1e-4, 1e-6)]
    assert "fused    eps 1e-06   skipped: precision 'pure_fp16' cannot run on device 'cpu'\n" in out
    assert "fused    eps 1e-08   diverged (first non-finite loss at step 16)\n" in out
    assert "fused    eps 0.0001  ok: final training loss 4.80, eval loss 4.66\n" in out
    assert "foreach  eps 1e-08   diverged (first non-finite loss at step 2)\n" in out
    assert "foreach  eps 0.0001  diverged: eval loss 12.2 nats ...\n" in out


# ================================================================== bad options: refused before any work
BAD_OPTIONS = [  # (script, argv, what the one-line error says)
    ("precision_throughput", ["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),  # was IndexError
    ("precision_throughput", ["--steps", "5", "--warmup", "5"], "--warmup 5: needs 0 <= warmup < --steps (5)"),
    ("precision_throughput", ["--objectives", "mlm,clasify"], "--objectives: unknown name 'clasify'"),
    ("precision_throughput", ["--precisions", "fp32,,amp_bf16"], "--precisions 'fp32,,amp_bf16': an empty name"),
    ("precision_throughput", ["--compile", "off,off"], "--compile 'off,off': off given twice"),
    # a typo made a "failed" row per repeat (a process start each) instead of a usage error
    ("batch_size_sweep", ["--precisions", "fp32", "bf16"], "argument --precisions: invalid choice: 'bf16'"),
    ("precision_throughput", ["--precisions", "fp32,amp_bf61"], "--precisions: unknown name 'amp_bf61'; allowed: fp32,"),
    ("precision_throughput", ["--compile", "off,max-autotune"], "--compile: unknown name 'max-autotune'; allowed: off, "
     "default, reduce-overhead"),
    ("batch_size_sweep", ["--batch-sizes", "4", "4"], "--batch-sizes: 4 given twice"),  # the pivot failed at the end
    ("batch_size_sweep", ["--precisions", "fp32", "fp32"], "--precisions: fp32 given twice"),
    ("batch_size_sweep", ["--batch-sizes", "0"], "argument --batch-sizes: must be >= 1, got 0"),
    ("batch_size_sweep", ["--steps", "5", "--timing-warmup-steps", "5"], "--timing-warmup-steps 5: needs 0 <= warm-up"),
    ("batch_size_sweep", ["--hidden", "65"], "--hidden 65: must be a multiple of the 2 attention heads"),
    ("telemetry_overhead", ["--every", "0"], "argument --every: must be >= 1, got 0"),  # was StatisticsError at the end
    ("telemetry_overhead", ["--rounds", "0"], "argument --rounds: must be >= 1, got 0"),
    ("checkpoint_cost", ["--steps", "50", "--every", "50"], "--every 50: needs --every < --steps (50)"),  # 0 saves
    ("checkpoint_cost", ["--every", "0"], "argument --every: must be >= 1, got 0"),
    ("engine_vs_trainer", ["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),  # was StatisticsError
    ("engine_vs_trainer", ["--precisions", "fp32,amp_fp16"], "--precisions: unknown name 'amp_fp16'"),
    ("input_pipeline", ["--device-ms", "0"], "argument --device-ms: must be a finite number > 0, got 0"),
    ("input_pipeline", ["--device-ms", "nan"], "argument --device-ms: must be a finite number > 0, got nan"),
    ("input_pipeline", ["--device-ms", "inf"], "argument --device-ms: must be a finite number > 0, got inf"),
    ("pure_fp16_eps", ["--eps", "1e-8", "-1"], "argument --eps: must be a finite number > 0, got -1"),
    ("pretrain_transfer", ["--pretrain-steps", "0"], "argument --pretrain-steps: must be >= 1, got 0"),  # was ignored
    ("pretrain_transfer", ["--seeds", "1", "2", "1"], "--seeds: 1 given twice"),
    ("pipeline_overhead", ["--cores", "0"], "argument --cores: must be >= 1, got 0"),
]


@pytest.mark.parametrize("script,argv,message", BAD_OPTIONS, ids=[f"{s}:{' '.join(a)}" for s, a, _ in BAD_OPTIONS])
def test_bad_options_are_refused_before_any_work(script, argv, message, monkeypatch, tmp_path, capsys):
    """A bad option is one line and exit 2 before any data is prepared, process started or model built
    (not a crash, a silently ignored option or a mislabelled figure after minutes of runs)."""
    mod = _load(script)

    def no_work(*a, **kw):
        pytest.fail(f"{script} started work despite {argv}")

    for name in ("prepare", "engine_run", "cli", "_batches"):
        if hasattr(mod, name):
            monkeypatch.setattr(mod, name, no_work)
    if hasattr(mod, "_bench"):
        monkeypatch.setattr(mod._bench, "prepare", no_work)
        monkeypatch.setattr(mod._bench, "engine_run", no_work)
    if hasattr(mod, "subprocess"):
        monkeypatch.setattr(mod.subprocess, "run", no_work)
    if script == "telemetry_overhead":
        import transformers
        monkeypatch.setattr(transformers, "BertConfig", no_work)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
