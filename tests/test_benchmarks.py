"""The benchmark scripts' figures (mutation audit): what each script prints or writes, from hand-built
measurements with hand-computed expectations. The expensive parts (`precswitch` processes, training,
clocks) are faked; nothing here trains a model of any size worth timing or needs a GPU.

Each script is imported as a module from its file; the options of its command line are checked to reach
the runs it starts (engine_run's hparams, the subprocess's arguments)."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

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




# ================================================================== bad options: refused before any work
BAD_OPTIONS = [  # (script, argv, what the one-line error says)
    ("precision_throughput", ["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),  # was IndexError
    ("precision_throughput", ["--steps", "5", "--warmup", "5"], "--warmup 5: needs 0 <= warmup < --steps (5)"),
    ("precision_throughput", ["--objectives", "mlm,clasify"], "--objectives: unknown name 'clasify'"),
    ("precision_throughput", ["--precisions", "fp32,,amp_bf16"], "--precisions 'fp32,,amp_bf16': an empty name"),
    ("precision_throughput", ["--compile", "off,off"], "--compile 'off,off': off given twice"),
    # a typo made a "failed" row per repeat (a process start each) instead of a usage error
    ("precision_throughput", ["--precisions", "fp32,amp_bf61"], "--precisions: unknown name 'amp_bf61'; allowed: fp32,"),
    ("precision_throughput", ["--compile", "off,max-autotune"], "--compile: unknown name 'max-autotune'; allowed: off, "
     "default, reduce-overhead"),
    ("engine_vs_trainer", ["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),  # was StatisticsError
    ("engine_vs_trainer", ["--precisions", "fp32,amp_fp16"], "--precisions: unknown name 'amp_fp16'"),
]


@pytest.mark.parametrize("script,argv,message", BAD_OPTIONS, ids=[f"{s}:{' '.join(a)}" for s, a, _ in BAD_OPTIONS])
def test_bad_options_are_refused_before_any_work(script, argv, message, monkeypatch, tmp_path, capsys):
    """A bad option is one line and exit 2 before any data is prepared, process started or model built
    (not a crash, a silently ignored option or a mislabelled figure after minutes of runs)."""
    mod = _load(script)

    def no_work(*a, **kw):
        pytest.fail(f"{script} started work despite {argv}")

    for name in ("prepare", "engine_run", "cli"):
        if hasattr(mod, name):
            monkeypatch.setattr(mod, name, no_work)
    if hasattr(mod, "_bench"):
        monkeypatch.setattr(mod._bench, "prepare", no_work)
        monkeypatch.setattr(mod._bench, "engine_run", no_work)
    if hasattr(mod, "subprocess"):
        monkeypatch.setattr(mod.subprocess, "run", no_work)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", *argv])
    with pytest.raises(SystemExit) as e:
        mod.main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
