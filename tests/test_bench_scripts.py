"""The benchmark scripts' figures: what each script prints or writes, from hand-built
measurements with hand-computed expectations. The expensive parts (`precswitch` processes, training,
clocks) are faked; nothing here trains a model of any size worth timing or needs a GPU.

Each script is imported as a module from its file; the options of its command line are checked to reach
the runs it starts (engine_run's hparams, the subprocess's arguments)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from bench_helpers import load_benchmark as _load  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


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


def _gpu_hours():
    return _load("gpu_hours")


def _fake_check(path, objective, batch, steps_s: dict, variant="eager"):
    path.write_text(json.dumps({
        "schema": "precswitch-gpu-check/1", "objective": objective, "batch": batch, "seq_len": 128,
        "model": {"num_hidden_layers": 12, "hidden_size": 768},
        "results": [{"precision": p, "variant": variant, "status": "ok", "step_seconds": s} for p, s in steps_s.items()]
        + [{"precision": "pure_fp16", "variant": "eager", "status": "failed"}],
    }))
    return path


def test_gpu_hours_hand_count(tmp_path, capsys):
    """Stage 1 once per distinct stage-1 precision and seed, stage 2 once per schedule and seed."""
    import yaml

    gh = _gpu_hours()
    train = {"batch_size": 32, "max_length": 128}
    cfg = {"seeds": [1, 2], "model": {"init": "bert-base-cased"},
           "schedules": {"a": {"pretrain": "fp32", "finetune": "fp32"}, "b": {"pretrain": "fp32", "finetune": "amp_bf16"},
                         "c": {"pretrain": {"precision": "amp_bf16", "switch_to": "fp32", "switch_at": 0.25},
                               "finetune": "fp32"}},
           "train": {"pretrain": {**train, "steps": 1000}, "finetune": {**train, "steps": None, "epochs": 2}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    mlm = _fake_check(tmp_path / "mlm.json", "mlm", 32, {"fp32": 0.098, "amp_bf16": 0.018})
    cls = _fake_check(tmp_path / "cls.json", "classify", 32, {"fp32": 0.048, "amp_bf16": 0.028})
    cls2 = _fake_check(tmp_path / "cls2.json", "classify", 32, {"amp_bf16": 0.038})  # a second, slower reading
    compiled = _fake_check(tmp_path / "cg.json", "classify", 32, {"fp32": 0.001}, variant="compiled")  # ignored
    args = ["--step-overhead-ms", "2", "--stage1-job-s", "100", "--stage2-job-s", "10", "--finetune-rows", "330"]
    assert gh.main([str(tmp_path / "c.yaml"), str(mlm), str(cls), str(cls2), str(compiled), *args]) == 0
    out = capsys.readouterr().out
    # stage 1: fp32 (shared by a and b) 1000 x 0.1 + 100 = 200 s; the switch 250 x 0.02 + 750 x 0.1 + 100 = 180 s
    # stage 2: 2 epochs x (330 // 32 = 10) = 20 steps: fp32 20 x 0.05 + 10 = 11 s (a, c); amp_bf16 20 x 0.03|0.04 + 10
    s1 = 2 * (200 + 180) / 3600
    s2_lo, s2_hi = 2 * (11 + 11 + 10.6) / 3600, 2 * (11 + 11 + 10.8) / 3600
    assert f"pretrain: {s1:.1f} GPU-hours" in out
    assert f"total: {s1 + s2_lo:.1f}" in out and "20 " in out
    res = gh.estimate(cfg, gh.load_measurements([mlm, cls, cls2]), gh.main.__globals__["argparse"].Namespace(
        step_overhead_ms=2, stage1_job_s=100, stage2_job_s=10, pretrain_rows=None, finetune_rows=330))
    assert len([j for j in res["jobs"] if j["stage"] == "pretrain"]) == 2  # fp32 shared by a and b
    got = {j["spec"]: j["run_s"] for j in res["jobs"] if j["stage"] == "finetune"}
    assert got["b"] == pytest.approx((10.6, 10.8)) and got["a"] == pytest.approx((11.0, 11.0))
    assert sum(j["run_s"][1] * j["seeds"] for j in res["jobs"]) / 3600 == pytest.approx(s1 + s2_hi)
    # a precision without a measurement is named, not guessed
    assert gh.main([str(tmp_path / "c.yaml"), str(mlm), *args]) == 2
    assert "classify fp32 batch 32 x 128" in capsys.readouterr().err


def test_gpu_hours_reads_a_partial_config_as_the_workflow_does(tmp_path, capsys):
    """Only the keys that differ from config/config.yaml (as `snakemake --configfile` takes them): the rest comes
    from config.yaml and the schema's defaults (it was a KeyError on 'seeds'); the schedules map replaces the
    default one; a file that is no mapping, or a schema error, is one line naming the file."""
    import yaml

    gh = _gpu_hours()
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    shape = {"batch_size": 32, "max_length": 128}
    part = {"model": {"init": "bert-base-cased"}, "schedules": {"x": {"finetune": "amp_bf16"}},
            "analysis": {"baseline": "x", "contrasts": []}, "train": {"finetune": shape}}
    (tmp_path / "part.yaml").write_text(yaml.safe_dump(part))
    cfg = gh.study_config(tmp_path / "part.yaml")
    assert cfg["seeds"] == base["seeds"] and list(cfg["schedules"]) == ["x"]
    assert cfg["train"]["finetune"]["lr"] == base["train"]["finetune"]["lr"]  # merged, not replaced
    cls = _check_json(tmp_path / "cls.json", "classify", 32, 128, 12, 768, {"amp_bf16": 0.03})
    assert gh.main([str(tmp_path / "part.yaml"), str(cls)]) == 0
    assert f"1 schedules x {len(base['seeds'])} seeds" in capsys.readouterr().out
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(SystemExit, match=r"list.yaml: a study config is a YAML mapping, got list"):
        gh.study_config(tmp_path / "list.yaml")
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"schedules": {"x": {"finetune": "fp64"}}}))
    with pytest.raises(SystemExit, match=r"bad.yaml: not a valid study config: config key schedules.x.finetune: 'fp64' is not "):
        gh.study_config(tmp_path / "bad.yaml")


def _check_json(path, objective, batch, seq, layers, hidden, steps_s: dict, variant="eager", status="ok"):
    path.write_text(json.dumps({
        "schema": "precswitch-gpu-check/1", "objective": objective, "batch": batch, "seq_len": seq,
        "model": {"num_hidden_layers": layers, "hidden_size": hidden},
        "results": [{"precision": p, "variant": variant, "status": status, "step_seconds": s}
                    for p, s in steps_s.items()]}))
    return path


def _hours_args(**over):
    import argparse

    return argparse.Namespace(**{"step_overhead_ms": 2.0, "stage1_job_s": 25.0, "stage2_job_s": 18.0,
                                 "pretrain_rows": None, "finetune_rows": 100, **over})


def test_gpu_hours_refuses_a_cpu_run_and_a_json_that_is_no_gpu_check_result(tmp_path):
    """A gpu_check run on a CPU (`--device cpu` at BERT-base's shapes keys like the H200's rows) was read as
    GPU step times: alone it printed CPU hours as GPU-hours, beside a GPU's file it stretched the range to
    them. It is refused by name, as is a JSON of another schema (a mapping, not only a list); files written
    before the device was recorded are read."""
    gh = _gpu_hours()
    gpu = _check_json(tmp_path / "gpu.json", "mlm", 32, 128, 12, 768, {"fp32": 0.1})
    cpu = _check_json(tmp_path / "cpu.json", "mlm", 32, 128, 12, 768, {"fp32": 9.0})
    cpu.write_text(json.dumps({**json.loads(cpu.read_text()), "device": "cpu", "device_name": "x86_64"}))
    gpu.write_text(json.dumps({**json.loads(gpu.read_text()), "device": "cuda", "device_name": "NVIDIA H200"}))
    assert dict(gh.load_measurements([gpu])) == {("mlm", "fp32", 32, 128, 12, 768): [0.1]}
    with pytest.raises(SystemExit, match=r"cpu\.json timed device 'cpu' \(x86_64\), not a GPU"):
        gh.load_measurements([gpu, cpu])
    other = tmp_path / "metrics.json"
    for bad in ({"schema": "precswitch-metrics/1", "results": []}, {"results": []}):
        other.write_text(json.dumps(bad))
        with pytest.raises(SystemExit, match=r"metrics\.json is not a gpu_check --out result"):
            gh.load_measurements([other])


def test_gpu_hours_of_bert_base_mrpc_are_the_documented_figures():
    """docs/gpu.md's GPU-hours table, from the H200 files with the default per-step and per-job costs: each
    stage-1 precision's 10,000-step run and its 10 seeds, 342 fine-tuning steps, the stage totals and 7.4 in all."""
    h200 = ROOT / "benchmarks" / "lease" / "h200"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_hours.py"), str(ROOT / "config" / "bert-base-mrpc.yaml"),
                        str(h200 / "run1_gpu_check.json"), str(h200 / "run1_gpu_check_mlm.json"),
                        str(h200 / "run2_prof_eager.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = {tuple(line.split()[:2]): line.split()[2:] for line in r.stdout.splitlines() if line.startswith(("pretrain ", "finetune "))}
    assert {k[1]: v for k, v in rows.items() if k[0] == "pretrain"} == {
        "fp32": ["10000", "10.8", "1.80"], "amp_fp16": ["10000", "6.9", "1.15"], "amp_bf16": ["10000", "5.3", "0.89"],
        "pure_fp16": ["10000", "5.1", "0.85"], "pure_bf16": ["10000", "6.1", "1.01"], "tf32": ["10000", "5.4", "0.90"]}
    finetune = [v for k, v in rows.items() if k[0] == "finetune"]
    assert len(finetune) == 8 and all(v[0] == "342" for v in finetune)
    assert "pretrain: 6.6 GPU-hours" in r.stdout and "finetune: 0.7-0.8 GPU-hours" in r.stdout
    assert "total: 7.4 GPU-hours (step overhead 2 ms; per job 25 s stage 1, 18 s stage 2)" in r.stdout


