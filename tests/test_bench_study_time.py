"""benchmarks/study_time.py: the per-rule split of a study's wall time from Snakemake's benchmark files."""

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("study_time", Path(__file__).parent.parent / "benchmarks" / "study_time.py")
study_time = importlib.util.module_from_spec(spec)
spec.loader.exec_module(study_time)

HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def _tsv(path: Path, seconds: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + f"{seconds}\t0:00:01\t1\t1\t1\t1\t0\t0\t0\t0\n")


def test_per_rule_sums_jobs_by_rule(tmp_path):
    _tsv(tmp_path / "data" / "synth.tsv", 2.0)
    _tsv(tmp_path / "data" / "prepare-pretrain.tsv", 3.0)
    _tsv(tmp_path / "pretrain" / "fp32" / "seed1.tsv", 10.0)
    _tsv(tmp_path / "pretrain" / "amp_bf16" / "seed1.tsv", 40.5)
    _tsv(tmp_path / "finetune" / "fp32-fp32" / "seed1.tsv", 5.0)
    (tmp_path / "empty.tsv").write_text(HEADER)  # a job that wrote no row is not counted
    assert study_time.per_rule(tmp_path) == {"data/synth": (1, 2.0), "data/prepare-pretrain": (1, 3.0),
                                             "pretrain": (2, 50.5), "finetune": (1, 5.0)}


def test_fast_path_proxy_runs_every_16bit_stage_in_fp32_under_its_own_name():
    import yaml

    from precswitch import study

    config = yaml.safe_load((Path(__file__).parent.parent / "config" / "config.yaml").read_text())
    proxy = study_time.fast_path_proxy(config)
    cfg = study.validate({**config, **proxy})
    plan = study.plan(cfg)
    assert len(plan.stage1) == len(study.plan(study.validate(config)).stage1)  # still one run each
    assert {spec["precision"] for spec in plan.stage1.values()} == {"fp32"}
    assert {s["finetune"]["precision"] for s in plan.schedules.values()} == {"fp32"}
    assert plan.stage1_of("fp16-fp32") == plan.stage1_of("fp16-fp16") != plan.stage1_of("fp32-fp32")
    assert proxy["schedules"]["fp32-fp32"] == config["schedules"]["fp32-fp32"]  # fp32 stages are untouched
