"""The Snakemake workflow without training: DAG shape, config validation, lint, format, docs.

Dry runs only (a few seconds each); the end-to-end runs are in test_workflow_e2e.py, the config errors in
test_study_config_checks.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from workflow_helpers import ROOT, dry_run, job_counts, snakemake, write_config

from precswitch import study

DEFAULT_STAGE1 = {"fp32", "amp_fp16", "amp_bf16"}
DEFAULT_SCHEDULES = {"fp32-fp32", "fp16-fp32", "fp16-fp16", "bf16-fp32", "scratch-fp32"}  # + the positive control


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """plan(name): stdout of `snakemake -n -p` of the embedded default ("default") or HUB_STUDY ("hub"),
    run once per module and shared by the tests that read it."""
    cache = {}

    def get(name):
        if name not in cache:
            proc = dry_run(tmp_path_factory.mktemp(name), {"default": None, "hub": HUB_STUDY}[name], "-p")
            assert proc.returncode == 0, proc.stderr[-3000:]
            cache[name] = proc.stdout
        return cache[name]

    return get


# --------------------------------------------------------------------------------------------- DAG
def test_default_dry_run_shares_stage1(plan):
    out = plan("default")
    counts = job_counts(out)
    # 5 schedules x 3 seeds: 3 stage-1 precisions (fp16-fp32 and fp16-fp16 share; the control has none) x 3
    assert counts == {
        "synth": 1, "tokenizer": 1, "prepare": 2, "pretrain": 9, "finetune": 15,
        "aggregate": 1, "stats": 1, "plots": 1, "verdict": 1, "all": 1,
    }, counts
    stage1 = set(re.findall(r"results/runs/pretrain/(\w+)/seed(\d+)/metrics\.json", out))
    assert stage1 == {(p, s) for p in DEFAULT_STAGE1 for s in ("1", "2", "3")}
    assert "plots/accuracy.svg" in out and "switch_point" not in out and "overflow" not in out  # nothing to draw
    stage2 = set(re.findall(r"results/runs/finetune/([\w.+-]+)/seed(\d+)/metrics\.json", out))
    assert stage2 == {(n, s) for n in DEFAULT_SCHEDULES for s in ("1", "2", "3")}
    # per seed: 3 stage-1 jobs, 5 stage-2 jobs
    for seed in ("1", "2", "3"):
        assert sum(1 for _, s in stage1 if s == seed) == 3
        assert sum(1 for _, s in stage2 if s == seed) == 5


def test_cuda_study_on_a_machine_without_gpu_stops_before_any_job(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the refusal cannot happen here")
    cfg = write_config(tmp_path / "study.yaml", {"device": "cuda", "threads": 1})
    proc = snakemake(tmp_path, "--cores", "1", "--configfile", cfg)
    assert proc.returncode != 0
    err = proc.stdout + proc.stderr
    assert "config key device:" in err and "24 training jobs" in err
    assert not (tmp_path / "results").exists()  # not even the data jobs ran
    # a dry run plans it as usual (GPU studies are planned on laptops and login nodes)
    assert dry_run(tmp_path, {"device": "cuda", "threads": 1}).returncode == 0


GPU_ONLY_STUDY = {"schedules": {"fp32-fp32": {"pretrain": "fp32", "finetune": "fp32"},
                               "t": {"pretrain": "tf32", "finetune": "fp32"}},
                  "analysis": {"contrasts": []}, "seeds": [1], "threads": 1}


def test_a_gpu_only_precision_on_cpu_is_refused_before_any_job(tmp_path):
    """tf32 (or fp8) with device cpu is refused when the config is read (on_unsupported: skip allows it), device
    auto on a machine without a GPU before the first job (a dry run plans it: the GPU may be where it runs)."""
    proc = dry_run(tmp_path, {**GPU_ONLY_STUDY, "device": "cpu"})
    err = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "config key schedules.t.pretrain: tf32 cannot run on a CPU" in err, err[-2000:]
    assert "train.pretrain.on_unsupported" in err
    skip = {**GPU_ONLY_STUDY, "device": "cpu", "train": {"pretrain": {"on_unsupported": "skip"}}}
    assert dry_run(tmp_path, skip).returncode == 0  # recorded as skipped: allowed
    import torch

    if torch.cuda.is_available():
        return
    auto = {**GPU_ONLY_STUDY, "device": "auto"}
    assert dry_run(tmp_path, auto).returncode == 0
    proc = snakemake(tmp_path, "--cores", "1", "--configfile", write_config(tmp_path / "auto.yaml", auto))
    err = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "config key schedules.t.pretrain: tf32 cannot run on a CPU" in err, err[-2000:]
    assert not (tmp_path / "results").exists()  # not even the data jobs ran


def test_a_misspelt_table_column_is_named_when_the_config_is_read(tmp_path):
    """A wrong column name used to be found by the fine-tuning data's prepare job, which runs beside the
    stage-1 training jobs (on a GPU study: after hours of them). The headers are checked up front (each table
    format: test_data_edges.py::test_header_check_reads_each_table_format_as_the_loader_does)."""
    rows = "label\tid1\tid2\ts1\ts2\n1\t1\t2\tA cat.\tA cat sat.\n"
    (tmp_path / "train.tsv").write_text(rows, encoding="utf-8")
    (tmp_path / "dev.tsv").write_text(rows, encoding="utf-8")
    good = {"kind": "tsv", "train": str(tmp_path / "train.tsv"), "eval": str(tmp_path / "dev.tsv"),
            "columns": {"text_a": "s1", "text_b": "s2", "label": "label"}}
    assert dry_run(tmp_path, {"data": {"finetune": good}}).returncode == 0
    bad = {**good, "columns": {"text_a": "#1 Str", "text_b": "s2", "label": "label"}}
    proc = dry_run(tmp_path, {"data": {"finetune": bad}})
    err = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Job stats" not in err
    assert ("config key data.finetune.columns: " + str(tmp_path / "train.tsv") + ": column(s) not found: "
            "text_a='#1 Str'; columns found: ['label', 'id1', 'id2', 's1', 's2']") in err, err[-2000:]


def test_every_output_is_under_results_dir(tmp_path):
    """Two studies run from one directory never share a file: each writes under its results_dir."""
    proc = dry_run(tmp_path, {"results_dir": "studies/mine/"}, "--printshellcmds")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    outputs = [p.strip() for block in re.findall(r"^\s+(?:output|log|benchmark): (.*)$", out, re.M)
               for p in block.split(",")]
    assert len(outputs) > 60
    assert all(p.startswith("studies/mine/") for p in outputs), [p for p in outputs if not p.startswith("studies/")]
    assert "--out-dir studies/mine " in out  # aggregate writes its tables there too
    assert '"init": "studies/mine/runs/pretrain/' in out  # stage 2 starts from this study's stage 1


def test_device_auto_claims_a_gpu_only_where_one_is(tmp_path):
    """device auto trains on the CPU where torch sees no CUDA GPU: a local run's training jobs then claim
    gpu=0 (profiles/default's gpu: 1 would run them one at a time for a GPU they never use). A dry run plans gpu=1 (the GPU may be on the machine that runs it),
    as a cluster run does. --touch plans and 'runs' the jobs as a real local run does, without training."""
    import torch

    cfg = {"device": "auto", "seeds": [1], "schedules": {"fp32-fp32": {"pretrain": "fp32", "finetune": "fp32"}},
           "analysis": {"contrasts": []}}
    planned = re.findall(r"rule (?:pretrain|finetune):.*?resources: ([^\n]*)", dry_run(tmp_path, cfg).stdout, re.S)
    assert len(planned) == 2 and all("gpu=1" in r for r in planned), planned
    proc = snakemake(tmp_path, "--touch", "-c1", "--configfile", tmp_path / "study.yaml")
    out = proc.stdout + proc.stderr
    ran = re.findall(r"rule (?:pretrain|finetune):.*?resources: ([^\n]*)", out, re.S)
    here = "gpu=1" if torch.cuda.is_available() else "gpu=0"
    assert proc.returncode == 0 and len(ran) == 2 and all(here in r for r in ran), out[-3000:]


def _touch_study(tmp_path, cfg):
    """Mark every output of cfg's study as made: `--touch` records each job's params (it does so for
    outputs that do not exist yet), then the outputs are made as empty files/dirs of one mtime."""
    path = write_config(tmp_path / "study.yaml", cfg)
    out = snakemake(tmp_path, "-n", "--configfile", path, check=True).stdout
    snakemake(tmp_path, "--touch", "-c1", "--configfile", path, check=True)
    made = []
    for line in re.findall(r"^    output: (.*)$", out, re.M):
        for f in line.split(", "):
            f = tmp_path / f
            if f.name in ("tokenizer", "prepared", "checkpoint"):
                f.mkdir(parents=True, exist_ok=True)
            else:
                f.parent.mkdir(parents=True, exist_ok=True)
                f.touch()
            made.append(f)
    for f in made:
        os.utime(f, (1.7e9, 1.7e9))
    assert "Nothing to be done" in snakemake(tmp_path, "-n", "--configfile", path, check=True).stdout


HUB_STUDY = {
    "schedules": {"x": {"pretrain": "fp32", "finetune": "fp32"}, "y": {"finetune": "fp32"}},
    "analysis": {"baseline": "x", "contrasts": []},
    "seeds": [1],
    "model": {"init": "acme/tiny-bert", "revision": "v1"},
    "data": {"finetune": {"kind": "hub", "name": "nyu-mll/glue", "config": "mrpc", "revision": "abc"}},
}


def test_revision_reaches_the_commands_and_null_stays_out(tmp_path, plan):
    out = plan("hub")
    jobs = {j: b for j, b in zip(re.findall(r"\n(?:local)?rule (\w+):", out),
                                 re.split(r"\n(?:local)?rule \w+:", out)[1:])}
    assert "--pretrained acme/tiny-bert --revision v1" in jobs["tokenizer"]
    hps = [json.loads(h) for h in re.findall(r"--hparams '([^']*)'", out)]
    by_id = {hp["run_id"]: hp for hp in hps}
    assert by_id["pretrain-fp32-seed1"]["init_revision"] == "v1"
    assert by_id["finetune-y-seed1"]["init_revision"] == "v1"  # no stage 1: fine-tunes model.init
    assert "init_revision" not in by_id["finetune-x-seed1"]  # from the stage-1 checkpoint
    assert all("revision" not in hp["model"] for hp in hps)  # not a BertConfig override
    assert '"revision": "abc"' in out  # the finetune source (prepare, fetch)
    # unpinned: no revision anywhere, so studies from before revision pinning keep their params
    unpinned = {**HUB_STUDY, "model": {"init": "acme/tiny-bert"},
                "data": {"finetune": {k: v for k, v in HUB_STUDY["data"]["finetune"].items() if k != "revision"}}}
    commands = re.findall(r"Shell command: (.*)", dry_run(tmp_path, unpinned, "-p").stdout)
    assert len(commands) > 5 and not any("revision" in c for c in commands)


def test_model_sizes_reach_only_the_stages_built_from_scratch(tmp_path, plan):
    """A checkpoint or pretrained init brings its own sizes: its jobs get only the attention kernel, so editing
    the sizes (e.g. of the CPU default that the GPU configs inherit) changes no param of theirs, and their
    metrics.json does not record sizes the model does not have."""
    sizes = {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "max_position_embeddings"}
    default = [json.loads(h) for h in re.findall(r"--hparams '([^']*)'", plan("default"))]
    scratch = [hp for hp in default if hp["init"] == "scratch"]
    assert scratch and all(sizes < set(hp["model"]) for hp in scratch)  # stage 1 from scratch: the sizes
    from_ckpt = [hp for hp in default if hp["init"] != "scratch"]
    assert len(from_ckpt) == 12 and all(hp["model"] == {"attn_implementation": "auto"} for hp in from_ckpt)
    hub = [json.loads(h) for h in re.findall(r"--hparams '([^']*)'", plan("hub"))]
    assert len(hub) == 3 and all(hp["model"] == {"attn_implementation": "auto"} for hp in hub)
    bigger = {**HUB_STUDY, "model": {**HUB_STUDY["model"], "hidden_size": 64, "num_hidden_layers": 7}}
    assert [json.loads(h) for h in re.findall(r"--hparams '([^']*)'", dry_run(tmp_path, bigger, "-p").stdout)] == hub


# ------------------------------------------------------------------------------ schema / config
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"


def _properties(schema: dict, path: str = ""):
    """Every (path, subschema) of a named property, following local $refs."""
    defs = yaml.safe_load(SCHEMA.read_text())["$defs"]

    def walk(node, path, seen):
        if not isinstance(node, dict):
            return
        if "$ref" in node:
            name = node["$ref"].split("/")[-1]
            if name not in seen:
                yield from walk(defs[name], path, seen | {name})
        for name, sub in (node.get("properties") or {}).items():
            yield f"{path}.{name}".lstrip("."), sub
            yield from walk(sub, f"{path}.{name}", seen)
        for sub in [*node.get("allOf", []), *(node[k] for k in ("then", "else") if k in node)]:
            yield from walk(sub, path, seen)
        if isinstance(node.get("additionalProperties"), dict):
            yield from walk(node["additionalProperties"], f"{path}.*", seen)

    yield from walk(schema, path, frozenset())


def test_schema_every_key_has_description_and_default():
    schema = yaml.safe_load(SCHEMA.read_text())
    assert schema["additionalProperties"] is False
    missing = []
    for path, sub in _properties(schema):
        if set(sub) <= {"default"}:  # a stage-specific default override (allOf)
            continue
        target = sub
        if "$ref" in sub:
            target = {**yaml.safe_load(SCHEMA.read_text())["$defs"][sub["$ref"].split("/")[-1]], **sub}
        if "description" not in target:
            missing.append(f"{path}: description")
        if path.startswith(("schedules.*", "sweeps.*")):  # a stage's precision: no default by nature
            continue
        if "default" not in sub and "default" not in target:
            missing.append(f"{path}: default")
    assert not missing, missing


def test_embedded_config_is_the_schema_defaults():
    """config/config.yaml writes out the schema defaults: leaving a key out means its value."""
    defaults = study.validate({})
    embedded = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    assert study.validate(embedded) == defaults


def test_config_readme_documents_every_key():
    readme = (ROOT / "config" / "README.md").read_text()
    schema = yaml.safe_load(SCHEMA.read_text())
    undocumented = [p for p, _ in _properties(schema)
                    if "*" not in p and f"`{p.split('.')[-1]}`" not in readme]
    assert not undocumented, undocumented


def test_precision_enum_matches_package_catalog():
    from precswitch import precision

    schema = yaml.safe_load(SCHEMA.read_text())
    assert schema["$defs"]["precision"]["enum"] == list(precision.NAMES)


# ------------------------------------------------------------------------------ lint / format
def test_snakemake_lint_is_clean(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Lints for" not in out, out[-3000:]


def test_snakefmt_clean():
    snakefmt = shutil.which("snakefmt") or str(Path(sys.executable).with_name("snakefmt"))
    if not Path(snakefmt).exists():
        pytest.skip("snakefmt not installed (pip install -e '.[test]')")
    files = ["Snakefile", *map(str, sorted((ROOT / "workflow" / "rules").glob("*.smk")))]
    proc = subprocess.run([snakefmt, "--check", *files], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_rule_has_log_and_benchmark():
    text = "\n".join(p.read_text() for p in (ROOT / "workflow" / "rules").glob("*.smk"))
    rules = re.split(r"^rule ", text, flags=re.M)[1:]
    assert len(rules) >= 9
    for body in rules:
        name = body.split(":")[0]
        assert "\n    log:" in body, name
        assert "\n    benchmark:" in body, name
        assert "\n    conda:" in body, name


# ------------------------------------------------------------------------------ profile / envs / docs
def _requirement(spec: str) -> tuple[str, str]:
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", spec)
    return m.group(1).lower().replace("_", "-"), m.group(2).replace(" ", "")


def test_conda_env_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = dict(_requirement(d) for d in project["dependencies"])
    env = yaml.safe_load((ROOT / "envs" / "precswitch.yaml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    got = dict(_requirement(d) for d in pip)
    assert got == wanted
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    assert python.replace(" ", "") == "python" + project["requires-python"].replace(" ", "")


def test_readme_test_command_is_the_ci_command():
    ci_last = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.strip()][-1]
    readme = (ROOT / "README.md").read_text()
    assert ci_last in readme.splitlines(), "README.md must show .ci/run's test command verbatim"


def test_checkout_has_the_standard_layout_and_git_ignores_every_output():
    """A clone has the top-level layout the README describes, results/ included (its README.md is the one
    tracked file there), and git ignores what a study writes under results/."""
    for path in ("Snakefile", "workflow/rules", "config/config.yaml", "results/README.md", "envs/precswitch.yaml",
                 "tests", "README.md", "profiles/default/config.yaml", "profiles/slurm/config.yaml",
                 "pyproject.toml"):
        assert (ROOT / path).exists(), path
    outputs = ["results/runs.csv", "results/verdict.md", "results/runs/pretrain/fp32/seed1/metrics.json",
               "results/bert-base-mrpc/report.html", "results/README.md"]
    proc = subprocess.run(["git", "-C", str(ROOT), "check-ignore", *outputs], capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr
    assert proc.stdout.split() == outputs[:-1]  # every output ignored, results/README.md not
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "results"], capture_output=True, text=True)
    assert tracked.stdout.split() == ["results/README.md"]


def test_more_threads_than_cores_is_said_before_the_run(tmp_path):
    """Snakemake scales a job's threads down to --cores, but the engine pins torch to config threads: with more
    threads than cores every training job oversubscribes its cores and its timings are distorted."""
    warned = dry_run(tmp_path, {"threads": 2}, "--cores", "1")
    assert warned.returncode == 0, warned.stderr[-3000:]
    assert ("precswitch: warning: threads 2 is more than --cores 1: Snakemake gives each training job 1 core(s), "
            "but torch runs 2 threads in it") in warned.stderr
    quiet = dry_run(tmp_path, {"threads": 2}, "--cores", "2")
    assert quiet.returncode == 0 and "precswitch: warning: threads" not in quiet.stderr
    # the documented cluster dry run: Snakemake plans it with --cores 1 (any dry run without --cores), but
    # each SLURM job gets its own cores: no warning (it read "threads 2 is more than --cores 1")
    cluster = dry_run(tmp_path, {"threads": 2}, "--workflow-profile", ROOT / "profiles" / "slurm")
    assert cluster.returncode == 0, cluster.stderr[-3000:]
    assert "precswitch: warning: threads" not in cluster.stderr and "slurm_partition=" in cluster.stdout


# ------------------------------------------------------------------------------ what each job gets
def _jobs(out: str) -> list[tuple[str, str]]:
    """(rule, its block: input/output/threads lines and the shell command) of each job of a dry run with -p."""
    return re.findall(r"^(?:local)?rule (\w+):\n(.*?)(?=^\[|\Z)", out, re.M | re.S)


def test_each_training_job_gets_its_own_seed_stage1_run_and_settings(tmp_path):
    """Stage 2 starts from, and waits for, the stage-1 run of ITS schedule and seed (a switched stage 1 is its own
    run, not its first precision's; a finetune-only schedule starts from model.init); each job gets its stage's
    precision and settings, its seed, the config's device and threads (also its Snakemake threads); stage 1
    always saves its checkpoint; every run is scored with one eval_seed (the same eval masks)."""
    cfg = {"schedules": {"x": {"pretrain": "amp_bf16", "finetune": "fp32"},
                         "z": {"pretrain": {"precision": "amp_bf16", "switch_to": "fp32", "switch_at": 0.5},
                               "finetune": "amp_bf16"},
                         "y": {"finetune": "amp_bf16"}},
           "analysis": {"baseline": "x", "contrasts": []}, "seeds": [3, 5], "device": "cuda", "threads": 2,
           # save_checkpoint is always on for stage 1 (stage 2 starts from it), whatever the config says
           "train": {"pretrain": {"lr": 0.001, "steps": 40, "save_checkpoint": False},
                     "finetune": {"lr": 0.0002, "steps": 30}}}
    proc = dry_run(tmp_path, cfg, "-p", "--cores", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    train = {}
    for rule, block in _jobs(proc.stdout):
        if rule in ("pretrain", "finetune"):
            hp = json.loads(re.search(r"--hparams '([^']*)'", block).group(1))
            assert hp["stage"] == rule and hp["run_id"] not in train
            train[hp["run_id"]] = (hp, block)
    stage1 = {"amp_bf16": ("amp_bf16", None), "amp_bf16-to-fp32-at50": ("amp_bf16", "fp32")}
    assert set(train) == ({f"pretrain-{n}-seed{s}" for n in stage1 for s in (3, 5)}
                          | {f"finetune-{n}-seed{s}" for n in "xyz" for s in (3, 5)})
    assert len({hp.get("eval_seed") for hp, _ in train.values()}) == 1
    for run_id, (hp, block) in train.items():
        seed, stage = int(run_id.rsplit("-seed", 1)[1]), hp["stage"]
        assert hp["seed"] == seed, run_id
        assert (hp["device"], hp["threads"]) == ("cuda", 2) and "\n    threads: 2\n" in block, run_id
        assert (hp["lr"], hp["steps"]) == (cfg["train"][stage]["lr"], cfg["train"][stage]["steps"]), run_id
        assert hp["save_checkpoint"] is (stage == "pretrain"), run_id
        inputs = re.search(r"^    input: (.*)$", block, re.M).group(1).split(", ")
        if stage == "pretrain":
            name = run_id.removeprefix("pretrain-").rsplit("-seed", 1)[0]
            assert (hp["precision"], hp.get("switch_to")) == stage1[name], run_id
            assert hp["init"] == "scratch" and hp["tags"] == {}, run_id
            continue
        schedule = hp["tags"]["schedule"]
        assert hp["precision"] == {"x": "fp32", "z": "amp_bf16", "y": "amp_bf16"}[schedule], run_id
        assert "switch_to" not in hp, run_id
        run = {"x": "amp_bf16", "z": "amp_bf16-to-fp32-at50", "y": None}[schedule]
        if run is None:
            assert hp["init"] == "scratch" and not [i for i in inputs if "/runs/" in i], run_id
        else:
            ckpt = f"results/runs/pretrain/{run}/seed{seed}/checkpoint"
            assert hp["init"] == ckpt, run_id
            assert sorted(i for i in inputs if "/runs/" in i) == sorted(
                [ckpt, f"results/runs/pretrain/{run}/seed{seed}/metrics.json"]), (run_id, inputs)


def test_data_and_aggregate_jobs_get_their_stages_settings(tmp_path):
    """Each stage's data is prepared for its objective at its own max_length; synth makes the sizes asked for,
    from the seed asked for;
    aggregate reads every stage-1 and stage-2 run (runs.csv has a row for each) and its steps log."""
    cfg = {"seeds": [1, 2], "train": {"pretrain": {"max_length": 64}, "finetune": {"max_length": 48}},
           "model": {"max_position_embeddings": 64},
           "data": {"synthetic": {"n_train": 2000, "n_dev": 500, "seed": 7, "n_corpus": 9000}}}
    proc = dry_run(tmp_path, cfg, "-p")
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = _jobs(proc.stdout)
    commands = {}
    for rule, block in jobs:
        command = re.search(r"^Shell command: (.*)$", block, re.M).group(1)
        stage = re.search(r"wildcards: stage=(\w+)", block)
        commands[rule if stage is None else f"{rule}[{stage.group(1)}]"] = command
    assert "--objective mlm --max-length 64 " in commands["prepare[pretrain]"]
    assert "--objective classify --max-length 48 " in commands["prepare[finetune]"]
    assert "--seed 7 --n-corpus 9000 --n-train 2000 --n-dev 500 " in commands["synth"]
    made = [m for rule, block in jobs if rule in ("pretrain", "finetune")
            for m in re.findall(r"^    output: ([^,\n]*/metrics\.json)", block, re.M)]
    assert len(made) == 2 * (len(DEFAULT_STAGE1) + len(DEFAULT_SCHEDULES))
    read, logs = (g.split() for g in re.search(r"--metrics (.*?) --steps (.*?) --out-dir",
                                                commands["aggregate"]).groups())
    assert sorted(read) == sorted(made)
    # and every run's steps.csv (the steps table), an output of its training rule beside its metrics.json
    assert sorted(logs) == sorted(m.removesuffix("metrics.json") + "steps.csv" for m in made)


def test_compute_jobs_run_offline_and_only_fetch_downloads(tmp_path, plan):
    """A study that reads the hub: the fetch rule (a local rule: on the login node) downloads, every other job
    that reads a model or data runs with the hub's offline switches (compute nodes have no internet); a hub data
    source alone (model from scratch) is enough to need them. A study without the hub sets nothing."""
    offline = "HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 precswitch "
    data_only = {**HUB_STUDY, "model": {"init": "scratch"}}
    for out in (plan("hub"), dry_run(tmp_path, data_only, "-p").stdout):
        commands = [(rule, re.search(r"^Shell command: (.*)$", block, re.M).group(1)) for rule, block in _jobs(out)]
        assert {r for r, _ in commands} >= {"fetch", "tokenizer", "prepare", "pretrain", "finetune"}
        for rule, command in commands:
            if rule in ("tokenizer", "prepare", "pretrain", "finetune"):
                assert command.startswith(offline), (rule, command[:200])
            else:
                assert "OFFLINE" not in command, (rule, command[:200])
    out = plan("default")
    assert "Shell command: precswitch train" in out and "OFFLINE" not in out and "rule fetch" not in out


def test_a_rerun_keeps_the_finished_runs_it_replaces_under_previous(tmp_path):
    """onstart: each finished run that will rerun is kept, as it was, under <results_dir>/previous/ before any job
    starts (its files and its log, not its resume/ state); an unfinished run and the runs that do not rerun are
    not; the next rerun keeps the latest version. (--touch runs onstart as a real run does, without training.)"""
    study = {"schedules": {"x": {"pretrain": "fp32", "finetune": "fp32"}, "y": {"finetune": "fp32"}},
             "analysis": {"baseline": "x", "contrasts": []}, "seeds": [1, 2],
             "results_dir": "res"}
    _touch_study(tmp_path, study)
    res = tmp_path / "res"
    finished = {}
    for run in sorted((res / "runs").glob("*/*/seed*")):
        rel = run.relative_to(res)
        finished[rel] = json.dumps({"run": str(rel)})
        (run / "metrics.json").write_text(finished[rel])
        (run / "resume").mkdir()
        (run / "resume" / "state.pt").write_text("resume state")
        (res / "logs" / rel.relative_to("runs").parent).mkdir(parents=True, exist_ok=True)
        (res / "logs" / f"{rel.relative_to('runs')}.log").write_text(f"log of {rel}")
    assert len(finished) == 2 + 4
    weights = res / "runs" / "finetune" / "x" / "seed1" / "model.safetensors"
    weights.write_bytes(b"w" * (2 << 20))  # a large file: hard-linked, not copied
    (res / "runs" / "finetune" / "y" / "seed2" / "metrics.json").unlink()  # an unfinished run (resume/ only)
    del finished[Path("runs/finetune/y/seed2")]
    for f in res.rglob("*"):
        os.utime(f, (1.7e9, 1.7e9))

    def rerun_finetune(lr):
        path = write_config(tmp_path / "changed.yaml", {**study, "train": {"finetune": {"lr": lr}}})
        proc = snakemake(tmp_path, "--touch", "-c1", "--configfile", path, check=True)
        assert "3 finished run(s) will rerun; their previous results are kept under res/previous/" in proc.stderr

    rerun_finetune(1e-4)
    prev = res / "previous"
    kept = sorted(p.parent.relative_to(prev) for p in prev.rglob("metrics.json"))
    assert kept == sorted(r for r in finished if r.parts[1] == "finetune")  # stage 1 does not rerun
    for rel in kept:
        assert (prev / rel / "metrics.json").read_text() == finished[rel]
        assert (res / rel / "metrics.json").read_text() == finished[rel]  # the run itself is where it was
        assert (prev / rel / f"{rel.name}.log").read_text() == f"log of {rel}"
        assert not (prev / rel / "resume").exists()
    assert not (prev / "runs" / "finetune" / "y" / "seed2").exists()
    kept_weights = prev / "runs" / "finetune" / "x" / "seed1" / "model.safetensors"
    assert kept_weights.read_bytes() == weights.read_bytes()
    probe = tmp_path / "probe"
    probe.touch()
    try:
        os.link(probe, tmp_path / "probe-link")
    except OSError:  # a file system without hard links: copied
        pass
    else:
        assert kept_weights.stat().st_ino == weights.stat().st_ino  # no second copy of the weights
    (res / "runs" / "finetune" / "x" / "seed1" / "metrics.json").write_text('{"run": "second"}')
    rerun_finetune(5e-5)
    assert (prev / "runs" / "finetune" / "x" / "seed1" / "metrics.json").read_text() == '{"run": "second"}'
    assert sorted(p.name for p in (prev / "runs" / "finetune" / "x").iterdir()) == ["seed1", "seed2"]


def test_a_batch_as_large_as_the_training_rows_is_accepted(tmp_path):
    """The engine refuses a batch larger than the training rows; a batch of exactly their number (one full batch
    per step) runs, and the config check lets it through."""
    cfg = {"data": {"synthetic": {"n_train": 32}}, "train": {"finetune": {"batch_size": 32}}}
    proc = dry_run(tmp_path, cfg)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-2000:]


# every stage_train key the engine reads, with values the engine refuses (and the schema must, before the
# DAG is built, instead of a job failing after others trained) and boundary values both accept
STAGE_BAD = [("batch_size", 0), ("eval_batch_size", 0), ("lr", 0), ("warmup_ratio", 1), ("weight_decay", -0.1),
             ("adam_eps", -1e-8), ("adam_beta1", 1), ("adam_beta2", 1.0), ("adam_beta2", -0.1),
             ("mlm_probability", 0), ("mlm_probability", 1), ("max_nonfinite", 0), ("max_nonfinite_fraction", 0),
             ("telemetry_every", -1), ("log_every", 0), ("checkpoint_every_steps", -1), ("max_grad_norm", -1),
             ("compile", "max-autotune"), ("eval_precision", "fp64"), ("on_unsupported", "ignore"), ("steps", 0),
             ("lrr", 0.1)]
STAGE_GOOD = [("max_nonfinite_fraction", 1), ("warmup_ratio", 0), ("adam_beta1", 0), ("weight_decay", 0),
              ("max_grad_norm", 0), ("compile", False), ("compile", "reduce-overhead"), ("eval_precision", "same"),
              ("checkpoint_every_minutes", 0), ("telemetry_every", 0)]


@pytest.mark.parametrize("key, value", STAGE_BAD + STAGE_GOOD)
def test_schema_and_engine_agree_on_stage_hyperparameters(key, value):
    from precswitch.errors import PrecswitchError
    from precswitch.train import config as C

    cfg = {"train": {"finetune": {key: value}}}
    hp = {"data": "d", "steps": 10, key: value}
    if (key, value) in STAGE_BAD:
        with pytest.raises(study.ConfigError) as e:
            study.validate(cfg)
        assert e.value.key == (f"train.finetune.{key}" if key != "lrr" else "train.finetune")
        with pytest.raises(PrecswitchError, match=key):
            C.resolve(hp)
    else:
        study.validate(cfg)
        assert C.resolve(hp)[key] == ("off" if value is False else value)


@pytest.mark.parametrize("cfg", [
    {"device": "cudax"}, {"device": "cuda:"}, {"device": "gpu"},
    {"schedules": {"x": {"finetune": {"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 0}}}},
    {"schedules": {"x": {"finetune": {"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 1.5}}}},
    {"schedules": {"x": {"finetune": {"precision": "amp_fp16", "switch_to": "fp64", "switch_at": 0.5}}}},
    {"model": {"num_attention_heads": 0}}, {"model": {"attn_implementation": "flash"}},
    {"train": {"pretrain": {"max_length": 4}}}, {"threads": 0},
])
def test_schema_refuses(cfg):
    with pytest.raises(study.ConfigError):
        study.validate(cfg)


def test_schema_stage_defaults():
    """Left out, a stage's keys take the stage's defaults: stage 1 its own steps, lr, warm-up and checkpoint."""
    cfg = study.validate({})
    pre, fin = cfg["train"]["pretrain"], cfg["train"]["finetune"]
    assert (pre["steps"], pre["lr"], pre["warmup_ratio"], pre["save_checkpoint"]) == (600, 5.0e-3, 0.06, True)
    assert (fin["steps"], fin["lr"], fin["warmup_ratio"], fin["save_checkpoint"]) == (600, 1.0e-3, 0.1, False)
    assert (pre["batch_size"], fin["batch_size"]) == (32, 64) and pre["compile"] == fin["compile"] == "off"


# ------------------------------------------------------------------------------ jobs' logs, resources, targets
def test_each_jobs_command_writes_stdout_and_stderr_to_its_log(plan):
    """Every job's command sends its output, stdout and stderr, to the job's own log: a command without
    `> log 2>&1` printed its errors to the terminal (or a SLURM log) and left results/logs/... empty."""
    for name in ("default", "hub"):
        jobs = _jobs(plan(name))
        assert {r for r, _ in jobs} >= {"synth" if name == "default" else "fetch", "tokenizer", "prepare", "pretrain",
                                        "finetune", "aggregate", "stats", "plots", "verdict"}
        for rule, block in jobs:
            if rule == "all":
                continue
            log = re.search(r"^    log: (.*)$", block, re.M).group(1)
            command = re.search(r"^Shell command: (.*)$", block, re.M).group(1)
            commands = [c for c in re.split(r" && | \|\| ", command) if "precswitch " in c]
            assert commands, (rule, command)
            for c in commands:
                # a training job's trainer opens its own log (--log), once it holds its run dir
                ending = f" --log {log}" if rule in ("pretrain", "finetune") else f" > {log} 2>&1"
                assert c.rstrip(")").endswith(ending), (rule, c)


def test_training_jobs_claim_the_configs_resources_and_run_in_priority_order(tmp_path):
    """Each training job claims the study config's mem_mb and runtime (minutes: the SLURM profile's time limit) and,
    off the CPU (cuda and auto: a GPU may be there), one gpu; prepare goes before stage 1, stage 1 before stage 2."""
    for device, gpu in (("cuda", 1), ("cpu", 0)):  # auto: test_device_auto_claims_a_gpu_only_where_one_is
        cfg = {"device": device, "threads": 1, "resources": {"mem_mb": 5100, "runtime": 77}}
        out = dry_run(tmp_path, {**HUB_STUDY, **cfg}).stdout
        jobs = re.findall(r"^(?:local)?rule (\w+):\n(.*?)(?=^\[|\Z)", out, re.M | re.S)
        assert {n for n, _ in jobs} >= {"prepare", "pretrain", "finetune"}, out[-2000:]
        for name, block in jobs:
            priority = re.search(r"^    priority: (\d+)$", block, re.M)
            assert int(priority.group(1) if priority else 0) == {"prepare": 2, "pretrain": 1}.get(name, 0), name
            if name in ("pretrain", "finetune"):
                resources = dict(kv.split("=", 1) for kv in re.search(
                    r"^    resources: (.*)$", block, re.M).group(1).split(", "))
                assert (resources["mem_mb"], resources["runtime"], resources["gpu"]) == ("5100", "77", str(gpu)), \
                    (device, name, resources)


@pytest.mark.parametrize("target", [
    "results/runs/finetune/fp32-fp32/x/seed1/metrics.json",
    "results/runs/pretrain/fp32/seed1x/metrics.json",
    "results/runs/finetune/nosuch/seed1/metrics.json",
    "results/runs/pretrain/pure_fp16/seed1/metrics.json",  # a catalog precision no schedule pre-trains in
])
def test_no_wildcard_matches_across_a_slash_or_outside_the_study(tmp_path, target):
    """A path that is not a run of the study has no rule (seed is digits, schedule and precision the study's names):
    a wildcard matching across '/' or any text made a job of it (or an input function's KeyError)."""
    path = write_config(tmp_path / "study.yaml", {})
    proc = snakemake(tmp_path, "-n", target, "--configfile", path)
    err = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "MissingRuleException" in err, err[-2000:]


def test_a_switch_at_1_stage_shares_the_unswitched_run(tmp_path):
    """switch_at 1 runs every step of the stage in its first precision (no switch), as a sweep's point 1 does: a
    schedule written so starts from the plain precision's stage-1 runs instead of training a copy of them (same
    steps, same precision) under another name, and its stage 2 runs without a switch."""
    cfg = {"schedules": {"a": {"pretrain": "amp_fp16", "finetune": "fp32"},
                         "b": {"pretrain": {"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 1},
                               "finetune": {"precision": "fp32", "switch_to": "amp_bf16", "switch_at": 1.0}},
                         "c": {"pretrain": {"precision": "amp_fp16", "switch_to": "fp32", "switch_at": 0.5},
                               "finetune": "fp32"}},
           "seeds": [4], "analysis": {"baseline": "a", "contrasts": []}}
    proc = dry_run(tmp_path, cfg, "-p")
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = job_counts(proc.stdout)
    assert (counts["pretrain"], counts["finetune"]) == (2, 3), counts
    hps = {hp["run_id"]: hp for hp in map(json.loads, re.findall(r"--hparams '([^']*)'", proc.stdout))}
    assert set(hps) == {"pretrain-amp_fp16-seed4", "pretrain-amp_fp16-to-fp32-at50-seed4", "finetune-a-seed4",
                        "finetune-b-seed4", "finetune-c-seed4"}
    assert hps["finetune-b-seed4"]["init"] == hps["finetune-a-seed4"]["init"] == \
        "results/runs/pretrain/amp_fp16/seed4/checkpoint"
    assert hps["finetune-b-seed4"]["precision"] == "fp32" and "switch_to" not in hps["finetune-b-seed4"]
