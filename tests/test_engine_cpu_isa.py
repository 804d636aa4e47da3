"""cpu_isa: a training job capped at an instruction set runs and records that level, and repeats exactly under it;
a level the CPU lacks is refused before anything runs, naming the key; native leaves the environment alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from engine_fixtures import TINY, make_prepared

from precswitch import cpu_isa, study
from precswitch.cli import main
from precswitch.errors import PrecswitchError
from precswitch.train import config as C

#: an AVX2-only EPYC's flags (no AVX-512): what this project's smallest machines have
AVX2_ONLY = {"sse4_2", "avx", "avx2", "fma", "bmi2"}
#: an AVX-512 BF16 EPYC's
AVX512_BF16 = AVX2_ONLY | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}
NEEDS_AVX2 = pytest.mark.skipif(cpu_isa.problem("avx2") is not None, reason="an x86 CPU with AVX2 runs the cap")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """metrics.json of one tiny amp_bf16 masked-LM stage (bf16: the kernels that differ most between CPUs), run
    twice with --cpu-isa avx2 and once native, each `precswitch train` in a fresh process without a cap of its own."""
    root = tmp_path_factory.mktemp("isa")
    data = make_prepared(root, "mlm", n_train=16, n_eval=8)
    hp = {"data": str(data), "precision": "amp_bf16", "steps": 3, "model": TINY, "batch_size": 8,
          "eval_batch_size": 8, "threads": 1, "seed": 1, "timing_warmup_steps": 1}
    env = {k: v for k, v in os.environ.items() if k not in (cpu_isa.ONEDNN, cpu_isa.ATEN)}
    out = {}
    for name, args in (("a", ["--cpu-isa", "avx2"]), ("b", ["--cpu-isa", "avx2"]), ("native", [])):
        r = subprocess.run([sys.executable, "-m", "precswitch.cli", "train", "--hparams", json.dumps(hp),
                            "--out", str(root / name), *args], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        out[name] = json.loads((root / name / "metrics.json").read_text())
    return out


@NEEDS_AVX2
def test_a_capped_stage_records_the_cap_and_repeats_exactly(runs):
    a, b, native = runs["a"], runs["b"], runs["native"]
    assert (a["cpu_capability"], a["cpu_isa"], a["onednn_max_cpu_isa"]) == ("AVX2", "avx2", "AVX2")
    assert a["hparams"]["cpu_isa"] == "avx2"
    assert "avx2" in a["cpu_flags"].split()
    assert set(a["cpu_flags"].split()) <= set(cpu_isa.RECORDED_FLAGS)
    # the second capped run: every value that does not measure time, memory or the process is the same
    moving = ("seconds", "per_second", "memory", "_bytes", "started", "finished", "load_avg", "energy")
    same = [k for k in a if not any(m in k for m in moving)]
    assert {k: a[k] for k in same} == {k: b[k] for k in same}
    assert a["final_train_loss"] is not None and a["eval_loss"] is not None
    # native: no cap set, the run records so, and its identity (config hash) is not the capped runs'
    assert (native["cpu_isa"], native["onednn_max_cpu_isa"], native["hparams"]["cpu_isa"]) == ("native", None,
                                                                                                 "native")
    assert native["config_hash"] != a["config_hash"]


def test_a_level_the_cpu_lacks_is_refused_naming_cpu_isa(monkeypatch, tmp_path, capsys):
    assert cpu_isa.problem("avx512", AVX512_BF16) is None and cpu_isa.problem("avx2", AVX2_ONLY) is None
    assert "avx512f" in cpu_isa.problem("avx512", AVX2_ONLY)
    assert "avx2" in cpu_isa.problem("avx2", set())  # no /proc/cpuinfo flags (not x86): only native
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: AVX2_ONLY)
    # the study config, before any job
    with pytest.raises(study.ConfigError) as e:
        study.check({"cpu_isa": "avx512"})
    assert e.value.key == "cpu_isa"
    study.check({"cpu_isa": "avx2"})
    with pytest.raises(study.ConfigError) as e:  # the schema: a level that is none of them
        study.check({"cpu_isa": "sse4"})
    assert e.value.key == "cpu_isa"
    # precswitch train: exit 2, one line naming the key, nothing written
    hp = {"data": str(tmp_path / "d"), "steps": 1}
    assert main(["train", "--hparams", json.dumps(hp), "--out", str(tmp_path / "o"), "--cpu-isa", "avx512"]) == 2
    err = capsys.readouterr().err
    assert "cpu_isa" in err and "avx512f" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
    with pytest.raises(PrecswitchError, match="cpu_isa"):  # the hparams of a direct run_stage
        C.resolve({**hp, "cpu_isa": "avx512"})


def test_native_leaves_the_environment_and_a_cap_sets_both_libraries(monkeypatch):
    env = {cpu_isa.ONEDNN: "AVX512_CORE_AMX"}  # set by hand: native keeps it, and records no level for it
    cpu_isa.apply("native", env)
    assert env == {cpu_isa.ONEDNN: "AVX512_CORE_AMX"} and cpu_isa.in_force(env) is None
    assert cpu_isa.in_force({}) == "native"
    cpu_isa.apply("avx2", env)
    assert env == {cpu_isa.ONEDNN: "AVX2", cpu_isa.ATEN: "avx2"} and cpu_isa.in_force(env) == "avx2"
    cpu_isa.apply("avx512", env)
    assert env == {cpu_isa.ONEDNN: "AVX512_CORE", cpu_isa.ATEN: "avx512"} and cpu_isa.in_force(env) == "avx512"
    # this process imported torch already: a cap set now would not hold, so it is refused
    monkeypatch.delenv(cpu_isa.ONEDNN, raising=False)
    monkeypatch.delenv(cpu_isa.ATEN, raising=False)
    import torch  # noqa: F401

    with pytest.raises(PrecswitchError, match="cpu_isa avx2"):
        cpu_isa.apply("avx2")
    assert cpu_isa.ONEDNN not in os.environ


def test_the_study_passes_a_cap_to_every_training_job_and_native_to_none(monkeypatch):
    monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: AVX2_ONLY)
    for level in ("avx2", "native"):
        p = study.plan(study.validate({"cpu_isa": level}))
        for stage, name in (("pretrain", next(iter(p.stage1))), ("finetune", next(iter(p.schedules)))):
            hp = study.hparams(p, stage, name, 1, data="d", tokenizer="t", init="scratch")
            assert hp.get("cpu_isa") == (None if level == "native" else level), (level, stage)
