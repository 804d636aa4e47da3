"""The real file loaders through the workflow up to the verdict, for real: tests/configs/real-files.yaml reads
WikiText-2 raw text (stage 1) and the GLUE MRPC TSVs (stage 2) from ../shared/data. Its own file so that
it runs beside test_workflow_e2e.py's tiny study on another worker."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from workflow_helpers import real_data_present, real_files_config, snakemake, write_config

pytestmark = pytest.mark.slow


@pytest.mark.skipif(not real_data_present(), reason="../shared/data (MRPC, WikiText-2) not beside the repository")
def test_real_files_config_runs(tmp_path):
    cfg = real_files_config()
    # up to the verdict (the plots read the same tables; tests/test_workflow_e2e.py draws them)
    proc = snakemake(tmp_path, f"{cfg['results_dir']}/verdict.md", "--cores", "2", "--configfile",
                     write_config(tmp_path / "real.yaml", cfg), timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    res = tmp_path / cfg["results_dir"]
    # README points users at this file: run from a checkout, it must not overwrite the default study
    assert cfg["results_dir"].rstrip("/") != "results" and not (tmp_path / "results" / "runs.csv").exists()
    schedules = pd.read_csv(res / "schedules.csv")
    assert len(schedules) == len(cfg["schedules"]) * len(cfg["seeds"])
    assert schedules["accuracy"].between(0, 1).all()
    # MRPC dev has 408 pairs, 68% paraphrases: the majority baseline the runs are compared with
    assert schedules["majority_accuracy"].round(3).eq(round(279 / 408, 3)).all()
    meta = json.loads((res / "data" / "finetune" / "prepared" / "meta.json").read_text())
    assert meta["n_eval"] == 408 and meta["objective"] == "classify"
    assert (res / "verdict.md").stat().st_size > 0
