"""analysis.fakes writes what the workflow and the engine write (docs/contracts.md): the same directories and
run ids, steps.csv with the engine's columns, and metrics that agree with their own steps.csv."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from precswitch.analysis.fakes import DEFAULT_SCHEDULES, write_fake_study

COMMON = Path(__file__).resolve().parents[1] / "workflow" / "rules" / "common.smk"


def _workflow_dir(name: str) -> str:
    """PRETRAIN_DIR / FINETUNE_DIR of workflow/rules/common.smk, as a format string under the results dir."""
    m = re.search(rf'^{name} = f"{{RESULTS}}/(.+)"$', COMMON.read_text(), re.M)
    assert m, name
    return m.group(1).replace("{{", "{").replace("}}", "}")


def _rows(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_fake_study_has_the_workflow_layout_and_run_ids(tmp_path):
    paths = write_fake_study(tmp_path, seeds=[1, 2])
    pre, fin = _workflow_dir("PRETRAIN_DIR"), _workflow_dir("FINETUNE_DIR")
    stage1 = sorted({p for p, _ in DEFAULT_SCHEDULES.values()})
    expect = [tmp_path / pre.format(precision=p, seed=s) / "metrics.json" for p in stage1 for s in (1, 2)]
    expect += [tmp_path / fin.format(schedule=n, seed=s) / "metrics.json" for n in DEFAULT_SCHEDULES for s in (1, 2)]
    assert paths == expect
    for p in paths:
        m = json.loads(p.read_text())
        assert (p.parent / "steps.csv").is_file()
        if m["stage"] == "pretrain":
            assert (m["run_id"], m["objective"], m["schedule"]) == (f"pretrain-{m['precision']}-seed{m['seed']}", "mlm", None)
        else:  # the workflow's run id and init: the schedule's stage-1 checkpoint
            p1, p2 = DEFAULT_SCHEDULES[m["schedule"]]
            assert (m["run_id"], m["objective"], m["precision"]) == (f"finetune-{m['schedule']}-seed{m['seed']}", "classify", p2)
            assert m["init"] == str(tmp_path / pre.format(precision=p1, seed=m["seed"]) / "checkpoint")
            assert (m["init_run_id"], m["init_precision"]) == (f"pretrain-{p1}-seed{m['seed']}", p1)


def _stages(tmp_path):
    paths = write_fake_study(tmp_path, seeds=[1, 2], diverged={("amp_fp16", 2), ("bf16-fp32", 1)})
    for p in paths:
        m = json.loads(p.read_text())
        with open(p.parent / "steps.csv", encoding="utf-8") as f:
            header = f.readline().strip().split(",")
        yield p, m, header, _rows(p.parent / "steps.csv")


# ------------------------------------------------------------------ mutation audit 7 (analysis cli/fakes/sweeps)
def test_fake_schedules_pair_by_seed_and_failed_stages_have_no_eval_figures(tmp_path):
    """The seed effect is shared by every schedule (sd 0: one accuracy per seed, whatever the schedule) and a
    planted effect shifts only its schedule, capped at accuracy 1; a fine-tune-only schedule starts from scratch
    with no stage-1 run (init_run_id/precision/status null, no 'None' directory); every stage's tags name its
    schedule; a diverged stage has a status_reason and null eval figures (contracts: NaN -> null), an ok one
    neither; pure_bf16 keeps bfloat16 weights."""
    schedules = {"a": ("fp32", "fp32"), "b": ("amp_fp16", "fp32"), "up": ("fp32", "fp32"), "ft": (None, "pure_bf16")}
    paths = write_fake_study(tmp_path, schedules=schedules, seeds=[1, 2, 3], sd=0.0, effects={"up": 50.0},
                             diverged={("amp_fp16", 2), ("a", 3)})
    metrics = [json.loads(p.read_text()) for p in paths]
    assert not (tmp_path / "runs" / "pretrain" / "None").exists()
    acc = {(m["schedule"], m["seed"]): m["accuracy"] for m in metrics if m["stage"] == "finetune"}
    for s in (1, 2, 3):
        same = {acc[(n, s)] for n in ("a", "b", "ft") if acc[(n, s)] is not None}
        assert len(same) == 1 and acc[("up", s)] == 1.0, (s, acc)
    assert len({acc[("ft", s)] for s in (1, 2, 3)}) == 3
    for m in metrics:
        assert m["tags"] == {"schedule": m["schedule"]}
        failed = m["status"] != "ok"
        assert (m["status_reason"] is not None) == failed, m["run_id"]
        evals = ("eval_loss", "mlm_accuracy", "perplexity") if m["stage"] == "pretrain" else (
            "eval_loss", "accuracy", "f1", "mcc")
        assert all((m[k] is None) == failed for k in evals), m["run_id"]
        if m["schedule"] == "ft":
            assert (m["init"], m["init_run_id"], m["init_precision"], m["init_status"]) == ("scratch", None, None, None)
            assert m["param_dtype"] == "bfloat16"
    assert sum(m["status"] == "diverged" for m in metrics) == 3  # amp_fp16 seed 2, b seed 2, a seed 3
