"""The whole workflow for real, on tiny configs (slow: a few minutes on 2 cores).

One study of tests/configs/tiny.yaml (4 schedules, 2 of them sharing stage 1, one without stage 1,
2 seeds) is run once per module, the way a crash leaves one: kill -9 of snakemake (and its jobs) in the
middle of the grid, a rerun refused until the stale lock is removed (`--unlock`, as the README says), then
the rerun of only the unfinished jobs. The tests then check that every finished output stayed
byte-identical with an unchanged mtime, read the study's tables, build the report (and render it in a
browser) and check what a config change reruns.
"""

from __future__ import annotations

import base64
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from workflow_helpers import CONFIGS, SNAKEFILE, job_counts, load_config, snakemake, write_config

pytestmark = pytest.mark.slow

TINY = load_config("tiny.yaml")
STAGE1 = {s["pretrain"] for s in TINY["schedules"].values() if "pretrain" in s}
N_RUNS = len(STAGE1) * len(TINY["seeds"]) + len(TINY["schedules"]) * len(TINY["seeds"])


def _incomplete(workdir: Path) -> set[Path]:
    """Outputs Snakemake still marks incomplete (a job it started and never saw finish).

    Markers are files under .snakemake/incomplete named by the url-safe base64 of the output path,
    split into path segments ('@' marks a continued segment).
    """
    root = workdir / ".snakemake" / "incomplete"
    out = set()
    for f in root.rglob("*") if root.exists() else []:
        if f.is_file() and f.name != "migration_underway":
            b64 = "".join(part.lstrip("@") for part in f.relative_to(root).parts)
            out.add((workdir / base64.urlsafe_b64decode(b64).decode()).resolve())
    return out


def _finished(workdir: Path) -> dict[Path, tuple[bytes, int]]:
    """metrics.json of every stage run that Snakemake saw finish."""
    runs = workdir / "results" / "runs"
    skip = _incomplete(workdir)
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in runs.rglob("metrics.json") if p.resolve() not in skip}


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("tiny-study")
    cfg = CONFIGS / "tiny.yaml"
    out = workdir.parent / f"{workdir.name}-killed.log"
    with open(out, "w") as f:  # own process group: kill -9 takes its jobs too
        p = subprocess.Popen([sys.executable, "-m", "snakemake", "-s", str(SNAKEFILE), "-d", str(workdir), "--cores",
                              "2", "--configfile", str(cfg)], stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600
    while len(_finished(workdir)) < 2:  # mid-grid: two stage runs finished, the study not
        assert p.poll() is None, f"snakemake ended before two stage runs finished:\n{out.read_text()[-4000:]}"
        if time.monotonic() > deadline:
            os.killpg(p.pid, signal.SIGKILL)
            raise AssertionError("timed out waiting for two finished stage runs")
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    before = _finished(workdir)
    locked = snakemake(workdir, "--cores", "2", "--configfile", cfg, timeout=120)
    snakemake(workdir, "--unlock", "--configfile", cfg, timeout=120, check=True)
    proc = snakemake(workdir, "--cores", "2", "--configfile", cfg, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return SimpleNamespace(workdir=workdir, cfg=cfg, before=before, locked=locked, rerun=proc)


def test_a_grid_killed_midway_is_locked_then_reruns_only_its_unfinished_jobs(tiny_study):
    before, after = tiny_study.before, _finished(tiny_study.workdir)
    assert 2 <= len(before) < N_RUNS, "killed too late: every stage run had already finished (the window missed)"
    # the stale lock refused the rerun, clearly
    assert tiny_study.locked.returncode != 0 and "LockException" in tiny_study.locked.stdout + tiny_study.locked.stderr
    assert len(after) == N_RUNS
    log = tiny_study.rerun.stdout + tiny_study.rerun.stderr
    for path, (data, mtime) in before.items():
        assert after[path] == (data, mtime), f"{path} was rerun or changed"
        assert f"output: {path.parent.relative_to(tiny_study.workdir)}/metrics.json" not in log  # not run again


def test_tables_have_one_row_per_run_and_schedule_seed(tiny_study):
    import pandas as pd

    workdir = tiny_study.workdir
    runs = pd.read_csv(workdir / "results" / "runs.csv")
    schedules = pd.read_csv(workdir / "results" / "schedules.csv")
    assert len(runs) == N_RUNS and runs["run_id"].is_unique
    assert (runs["stage"] == "pretrain").sum() == len(STAGE1) * len(TINY["seeds"])
    assert len(schedules) == len(TINY["schedules"]) * len(TINY["seeds"])
    assert set(zip(schedules["schedule"], schedules["seed"])) == {
        (n, s) for n in TINY["schedules"] for s in TINY["seeds"]
    }
    for name, stages in TINY["schedules"].items():
        rows = schedules[schedules["schedule"] == name]
        assert set(rows["stage2_precision"]) == {stages["finetune"]}
        if "pretrain" in stages:
            assert set(rows["stage1_precision"]) == {stages["pretrain"]}
    # parquet twins hold the same rows
    assert len(pd.read_parquet(workdir / "results" / "runs.parquet")) == len(runs)
    assert len(pd.read_parquet(workdir / "results" / "schedules.parquet")) == len(schedules)


def test_values_are_sane(tiny_study):
    import pandas as pd

    workdir = tiny_study.workdir
    runs = pd.read_csv(workdir / "results" / "runs.csv")
    schedules = pd.read_csv(workdir / "results" / "schedules.csv")
    assert set(runs["status"]) == {"ok"}
    assert (runs["train_seconds"] > 0).all() and (runs["eval_seconds"] > 0).all()
    assert (runs["peak_memory_bytes"] > 10_000_000).all()
    assert (runs["threads"] == 1).all() and set(runs["device"]) == {"cpu"}
    mlm = runs[runs["stage"] == "pretrain"]
    assert mlm["eval_loss"].map(math.isfinite).all() and mlm["mlm_accuracy"].between(0, 1).all()
    assert schedules["accuracy"].between(0, 1).all() and schedules["f1"].between(0, 1).all()
    assert (schedules["total_train_seconds"] >= schedules["stage2_train_seconds"]).all()
    # the stage-1 precision a finetune started from is the one its schedule names
    fin = runs[runs["stage"] == "finetune"]
    for _, row in fin.iterrows():
        stages = TINY["schedules"][row["schedule"]]
        if "pretrain" in stages:
            assert row["init_precision"] == stages["pretrain"]
            assert row["init_run_id"] == f"pretrain-{stages['pretrain']}-seed{row['seed']}"
        else:
            assert row["init"] == "scratch"


def test_analysis_outputs(tiny_study):
    workdir = tiny_study.workdir
    results = workdir / "results"
    for name in ("summary.csv", "summary.md", "deltas.csv", "stats.json", "verdict.md"):
        assert (results / name).stat().st_size > 0, name
    for name in ("accuracy", "forest", "time_memory", "loss_curves", "loss_scale", "stage1"):
        for ext in ("png", "svg"):
            assert (results / "plots" / f"{name}.{ext}").stat().st_size > 0
    # no sweep and no telemetry in this study: the plots they would fill are not drawn (no empty figures)
    assert not list((results / "plots").glob("switch_point.*")) and not list((results / "plots").glob("overflow.*"))
    # every job left a log and a benchmark
    for sub in ("data/synth", "data/tokenizer", "data/prepare-pretrain", "data/prepare-finetune",
                "pretrain/fp32/seed1", "finetune/scratch-fp32/seed2", "analysis/aggregate", "analysis/stats",
                "analysis/plots", "analysis/verdict"):
        assert (results / "logs" / f"{sub}.log").is_file(), sub
        assert (results / "benchmarks" / f"{sub}.tsv").is_file(), sub


def test_report_builds(tiny_study):
    workdir, cfg = tiny_study.workdir, tiny_study.cfg
    proc = snakemake(workdir, "--configfile", cfg, "--report", "results/report.html", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = (workdir / "results" / "report.html").read_text(errors="replace")
    assert len(html) > 100_000
    for word in ("Accuracy", "Cost", "Numerics", "Tables", "precswitch"):
        assert word in html, word


def test_changing_one_schedule_reruns_only_what_depends_on_it(tiny_study, tmp_path):
    workdir = tiny_study.workdir
    cfg = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    # stage 2 of bf16-bf16 in pure bf16: its 2 fine-tunes rerun; the shared amp_bf16 stage 1 does not
    cfg["schedules"]["bf16-bf16"]["finetune"] = "pure_bf16"
    proc = snakemake(workdir, "-n", "--configfile", write_config(tmp_path / "changed.yaml", cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = job_counts(proc.stdout)
    n = len(TINY["seeds"])
    assert counts == {"finetune": n, "aggregate": 1, "stats": 1, "plots": 1, "verdict": 1, "all": 1}, counts
    import re

    rerun = set(re.findall(r"output: results/runs/finetune/([\w.+-]+)/seed\d+/metrics.json", proc.stdout))
    assert rerun == {"bf16-bf16"}


CHROMIUM = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if Path(p).exists()), None)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--virtual-time-budget=8000", "--window-size=1400,1000"]


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium; CI does)")
def test_report_renders_in_a_real_browser(tiny_study, tmp_path):
    """Headless Chromium loads the report: no JavaScript errors, navigation and every plot present."""
    workdir, cfg = tiny_study.workdir, tiny_study.cfg
    report = workdir / "results" / "report.html"
    if not report.exists():
        snakemake(workdir, "--configfile", cfg, "--report", "results/report.html", timeout=300, check=True)
    url = report.resolve().as_uri()
    dom = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'ud1'}", "--enable-logging=stderr",
                          "--v=0", "--dump-dom", url], capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0, dom.stderr[-3000:]
    console = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln]
    errors = [ln for ln in console if "Uncaught" in ln or ":ERROR:" in ln or "Error:" in ln]
    assert not errors, errors
    body = re.sub(r"<script.*?</script>", "", dom.stdout[dom.stdout.find("<body"):], flags=re.S)
    for word in ("Workflow", "Accuracy", "Cost", "Numerics", "Tables", "Verdict"):  # rendered navigation
        assert word in body, word
    # the landing page answers first: the headline table (the configured contrasts first), then the forest plot
    landing = body[body.find('class="prose'):body.find("How this study was run")]
    table = re.search(r'<table[^>]*class="headline.*?</table>', landing, re.S)
    assert table, landing[:3000]

    def text(html):
        return " ".join(re.sub(r"<[^>]+>", " ", html).split())

    header = [text(c) for c in re.findall(r"<th.*?</th>", table.group(0), re.S)]
    assert header[:3] == ["comparison", "test accuracy Δ (points) [95% CI]", "accuracy"] and "memory ratio" in header
    rows = [[text(c) for c in re.findall(r"<td.*?</td>", r, re.S)] for r in re.findall(r"<tr>.*?</tr>",
                                                                                     table.group(0), re.S)[1:]]
    assert [r[0] for r in rows[:2]] == [f"{a} vs {b}" for a, b in TINY["analysis"]["contrasts"]]
    assert len(rows) == len(TINY["schedules"])  # the two contrasts, then the other two schedules vs the baseline
    assert re.search(r'class="forest[^"]*">.*?<svg', landing[table.end():], re.S), "no forest plot on the landing page"
    plots = sorted({p.stem for p in (workdir / "results" / "plots").glob("*.svg")})
    assert plots
    for name in plots:
        assert f"{name}.svg" in dom.stdout, f"plot {name} missing from the rendered report"
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'ud2'}", f"--screenshot={shot}", url],
                   capture_output=True, timeout=180)
    assert shot.exists() and shot.stat().st_size > 20_000  # a rendered page, not a blank one


