"""The SLURM profile (profiles/slurm, docs/slurm.md).

* Without SLURM: the cluster profile and its test variant (tests/slurm/profile) agree except on the
  lines marked TEST:, every line of the cluster profile is commented, and a dry run of the documented
  command uses profiles/slurm *instead of* profiles/default.
* With SLURM binaries and root (CI apt-installs slurmctld slurmd slurm-client munge): a throw-away
  single-node cluster (tests/slurm/start.sh) runs a tiny study through the documented command with
  the test variant profile; every non-local job must go through sbatch (SLURM job ids in the log and
  in .snakemake/slurm_logs, and SLURM's own record of them), results/runs.csv and schedules.csv must
  equal those of a local run of the same config (metric columns, text-exact: CPU runs with pinned
  threads are deterministic), and a rule failing on its first attempt must be reported failed and be
  resubmitted. The daemons are stopped by PID afterwards (tests/slurm/stop.sh) and checked gone.

Every snakemake runs under `timeout -k 10 <s>`; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml


ROOT = Path(__file__).resolve().parents[1]
SLURM_TESTS = ROOT / "tests" / "slurm"
USER_PROFILE = ROOT / "profiles" / "slurm" / "config.yaml"
TEST_PROFILE = SLURM_TESTS / "profile" / "config.yaml"
TINY_CONFIG = ROOT / "tests" / "configs" / "tiny.yaml"
SLURM_BINARIES = ["munged", "munge", "unmunge", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel"]


def alive(pid: int) -> bool:
    """True while process ``pid`` exists and is not a zombie (exited, not yet reaped: as good as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (not Linux): existence is all we know
        return True
# serialises the cluster tests of concurrent pytest runs on one machine (one /etc/slurm/slurm.conf)
LOCK_FILE = Path("/tmp/precswitch-slurm-test.lock")
LOCK_WAIT_S = 600
SNAKEMAKE_TIMEOUT_S = 540

# rules allowed to run on the submit host (every other rule must run as a SLURM job)
LOCAL_OK = {"all", "fetch", "synth", "aggregate", "stats", "plots", "verdict"}
# runs.csv / schedules.csv columns that must be identical between the local and the SLURM run
RUNS_COLUMNS = [
    "run_id", "stage", "objective", "precision", "seed", "status", "schedule", "init_run_id",
    "init_precision", "config_hash", "param_dtype", "steps_completed", "threads", "skipped_steps",
    "nonfinite_losses", "final_train_loss", "grad_norm_mean", "grad_norm_max", "eval_loss",
    "perplexity", "mlm_accuracy", "accuracy", "f1", "mcc", "majority_accuracy",
]
SCHEDULES_COLUMNS = [
    "schedule", "seed", "stage1_precision", "stage2_precision", "status", "accuracy", "f1", "mcc",
    "majority_accuracy", "stage1_eval_loss", "stage1_mlm_accuracy",
]
# the keys (dotted paths) on which the test variant may differ from profiles/slurm
TEST_ONLY_KEYS = {
    "slurm-status-command",
    "slurm-init-seconds-before-status-checks",
    "default-resources.slurm_partition",
    "default-resources.slurm_account",
    "default-resources.mem_mb",
    "set-resources.pretrain.slurm_partition",
    "set-resources.finetune.slurm_partition",
    "set-resources.pretrain.cpus_per_gpu",
    "set-resources.finetune.cpus_per_gpu",
}
SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+) \(log: (.+?)\)")


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def snakemake_cmd(timeout_s: int, *args: str) -> list[str]:
    return ["timeout", "-k", "10", str(timeout_s), sys.executable, "-m", "snakemake", *args]


def run_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    env.update(extra)
    return env


def write_test_config(path: Path, device: str = "auto") -> Path:
    """The tiny study of tests/configs/tiny.yaml cut to 1 seed and 2 schedules sharing stage 1. `device: auto`:
    its training jobs ask SLURM for a GPU (the rules' gpu resource), and run on the CPU where none is visible
    (the local cluster's GPUs are fake)."""
    cfg = yaml.safe_load(TINY_CONFIG.read_text())
    cfg["device"] = device
    cfg["schedules"] = {
        "fp32-fp32": {"pretrain": "fp32", "finetune": "fp32"},
        "fp32-bf16": {"pretrain": "fp32", "finetune": "amp_bf16"},
    }
    cfg["seeds"] = [1]
    cfg.setdefault("analysis", {})["contrasts"] = []
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


# --- profile checks (no SLURM needed) -------------------------------------------------------------
def test_test_profile_differs_from_cluster_profile_only_on_test_keys():
    user = flatten(yaml.safe_load(USER_PROFILE.read_text()))
    test = flatten(yaml.safe_load(TEST_PROFILE.read_text()))
    differing = {k for k in set(user) | set(test) if user.get(k, "<absent>") != test.get(k, "<absent>")}
    assert differing <= TEST_ONLY_KEYS, f"test variant drifted from profiles/slurm on {sorted(differing - TEST_ONLY_KEYS)}"
    # and every such difference is marked in the test variant
    text = TEST_PROFILE.read_text()
    for key in differing:
        leaf = key.rsplit(".", 1)[-1]
        assert re.search(rf"# TEST:[^\n]*\n(\s*#[^\n]*\n)*\s*{re.escape(leaf)}:|# TEST:[^\n]*{re.escape(leaf)}", text), (
            f"{key} differs from profiles/slurm but has no '# TEST:' comment"
        )


def test_cluster_profile_contents():
    profile = yaml.safe_load(USER_PROFILE.read_text())
    assert profile["executor"] == "slurm"
    assert "resources" not in profile, "no global resource limits (e.g. gpu) in the cluster profile"
    for key in ("jobs", "latency-wait", "retries"):
        assert key in profile
    assert profile.get("slurm-status-command", "sacct") == "sacct", "users with accounting need sacct"
    assert {"slurm_partition", "slurm_account", "runtime", "mem_mb"} <= set(profile["default-resources"])
    rules = set(re.findall(r"^rule (\w+):", (ROOT / "workflow" / "rules" / "train.smk").read_text(), re.M))
    assert {"pretrain", "finetune"} <= rules
    for rule in ("pretrain", "finetune"):
        # the rules ask for their GPU (gpu=0 for a device: cpu study): a `gpu:` here would override them
        assert "gpu" not in profile["set-resources"][rule]
        assert profile["set-resources"][rule]["cpus_per_gpu"] >= 1
    assert set(profile["set-resources"]) <= rules | set(
        re.findall(r"^rule (\w+):", "\n".join(p.read_text() for p in (ROOT / "workflow" / "rules").glob("*.smk")), re.M)
    )


@pytest.mark.parametrize("path", [USER_PROFILE, TEST_PROFILE], ids=["profiles/slurm", "tests/slurm/profile"])
def test_text_resources_keep_their_inner_quotes(path):
    """Snakemake evaluates a resource value as Python: `slurm_partition: "all"` (a common partition
    name) becomes the builtin all() and the run stops with a ValueError. Text values are written
    "'name'" so that editing the name in place stays safe."""
    profile = yaml.safe_load(path.read_text())
    resources = {f"default-resources.{k}": v for k, v in profile["default-resources"].items()}
    for rule, res in profile["set-resources"].items():
        resources.update({f"set-resources.{rule}.{k}": v for k, v in res.items()})
    for key, value in resources.items():
        if isinstance(value, str):
            assert len(value) > 2 and value[0] == value[-1] == "'", f"{key}: {value!r} needs inner quotes"


@pytest.mark.parametrize("path", [USER_PROFILE, TEST_PROFILE, ROOT / "profiles" / "default" / "config.yaml"],
                         ids=["profiles/slurm", "tests/slurm/profile", "profiles/default"])
def test_every_profile_line_is_commented(path):
    """Every setting has its comment; no profile sets a global gpu limit (a local run sets gpu=K itself)."""
    lines = path.read_text().splitlines()
    assert "gpu" not in (yaml.safe_load(path.read_text()).get("resources") or {})
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#") or "#" in line:
            continue
        before = lines[i - 1].strip() if i else ""
        assert before.startswith("#"), f"{path.relative_to(ROOT)}:{i + 1}: {line!r} has no comment"


def test_documented_command_replaces_workflow_profile(tmp_path):
    """`--workflow-profile profiles/slurm` replaces profiles/default: the dry run says so, and the
    training jobs carry the cluster profile's resources, not the workstation's."""
    pytest.importorskip("snakemake_executor_plugin_slurm", reason="snakemake-executor-plugin-slurm is not installed")
    cfg = write_test_config(tmp_path / "tiny-slurm.yaml")
    cmd = snakemake_cmd(
        240, "-s", str(ROOT / "Snakefile"), "--workflow-profile", str(ROOT / "profiles" / "slurm"),
        "--configfile", str(cfg), "--dry-run",
    )
    proc = subprocess.run(cmd, cwd=tmp_path, env=run_env(), capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert f"Using workflow specific profile {ROOT / 'profiles' / 'slurm'}" in out, out[:2000]
    assert "profiles/default" not in out
    block = out[out.index("rule pretrain:"):]
    block = block[: block.index("\n\n")]
    for expected in ("gpu=1", "cpus_per_gpu=8", "slurm_partition=gpu", "slurm_account=CHANGE_ME"):
        assert expected in block, f"{expected} not in pretrain's resources:\n{block}"
    # time (minutes) and memory of a training job are the study config's (resources:), not the profile's defaults
    study = {"mem_mb": 4000, "runtime": 60, **yaml.safe_load(cfg.read_text()).get("resources", {})}
    resources = dict(kv.split("=", 1) for kv in re.search(r"^    resources: (.*)$", block, re.M).group(1).split(", "))
    assert (resources["runtime"], resources["mem_mb"]) == (str(study["runtime"]), str(study["mem_mb"])), resources
    # the pitfall docs/slurm.md warns about: with --profile, profiles/default is applied on top
    cmd[cmd.index("--workflow-profile")] = "--profile"
    proc = subprocess.run(cmd, cwd=tmp_path, env=run_env(), capture_output=True, text=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert f"workflow specific profile {ROOT / 'profiles' / 'default'}" in proc.stdout + proc.stderr


def test_a_cpu_only_torch_is_refused_before_any_cluster_job(tmp_path):
    """The cluster jobs run this interpreter's environment on GPU nodes: with a CPU-only torch every GPU
    training job would fail there, after its queue wait and its retries. Refused at the start, before
    anything is submitted (stub SLURM commands record what would be)."""
    pytest.importorskip("snakemake_executor_plugin_slurm", reason="snakemake-executor-plugin-slurm is not installed")
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build: nothing to refuse")
    shims, log = tmp_path / "shim", tmp_path / "calls.log"
    shims.mkdir()
    for name, out in (("sbatch", "echo 4242"), ("sinfo", "printf 'PARTITION\\ngpu\\n'"), ("sacctmgr", "echo CHANGE_ME"),
                      ("sacct", "true"), ("squeue", "true"), ("scontrol", "true"), ("scancel", "true")):
        (shims / name).write_text(f"#!/bin/sh\necho \"{name} $*\" >> {log}\n{out}\n")
        (shims / name).chmod(0o755)
    cfg = tmp_path / "gpu.yaml"
    cfg.write_text(yaml.safe_dump({"results_dir": str(tmp_path / "results"), "device": "cuda"}))
    cmd = snakemake_cmd(240, "-s", str(ROOT / "Snakefile"), "--workflow-profile", str(ROOT / "profiles" / "slurm"),
                        "--configfile", str(ROOT / "config" / "bert-base-mrpc.yaml"), str(cfg))
    env = run_env(PATH=f"{shims}:{os.environ['PATH']}")
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "is a CPU-only build: every training job would fail on its GPU node" in out, \
        out[-3000:]
    assert "sbatch" not in (log.read_text() if log.exists() else "")  # nothing was submitted


# --- the local cluster ----------------------------------------------------------------------------
def _skip_reason() -> str | None:
    if os.name != "posix" or os.geteuid() != 0:
        return "needs root to start munged/slurmctld/slurmd"
    missing = [b for b in SLURM_BINARIES if shutil.which(b) is None]
    if missing:
        return (
            f"SLURM not installed (missing {', '.join(missing)}): "
            "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge"
        )
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        return "snakemake-executor-plugin-slurm is not installed (pip install -e '.[slurm]')"
    return None


def _free_ports(n: int) -> list[int]:
    """n distinct free ports (all sockets held until every number is taken)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


@contextlib.contextmanager
def _exclusive(lock_file: Path, wait_s: int):
    with open(lock_file, "a+") as f:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another SLURM test held {lock_file} for over {wait_s}s")
                time.sleep(2)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("slurm-state")
    with _exclusive(LOCK_FILE, LOCK_WAIT_S):
        ctld_port, slurmd_port = _free_ports(2)  # picked once the other session's cluster is gone
        env = run_env(
            SLURMCTLD_PORT=str(ctld_port),
            SLURMD_PORT=str(slurmd_port),
            FAKE_GPUS="2",
            MIN_JOB_AGE="900",
            SLURM_WAIT_S="60",
        )
        pids = {}
        try:
            proc = subprocess.run(
                ["timeout", "-k", "5", "120", str(SLURM_TESTS / "start.sh"), str(state)],
                env=env, capture_output=True, text=True,
            )
            if proc.returncode == 3:
                pytest.skip(f"not touching an existing SLURM setup: {proc.stderr.strip()}")
            assert proc.returncode == 0, f"start.sh failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            pids = {p.stem: int(p.read_text().strip()) for p in (state / "pids").glob("*.pid")}
            assert {"slurmctld", "slurmd"} <= set(pids), pids
            yield state
        finally:
            stop = subprocess.run(
                ["timeout", "-k", "5", "60", str(SLURM_TESTS / "stop.sh"), str(state)],
                capture_output=True, text=True,
            )
            print(stop.stdout, stop.stderr)
            deadline = time.monotonic() + 15
            while any(alive(p) for p in pids.values()) and time.monotonic() < deadline:
                time.sleep(0.2)
            still = {n: p for n, p in pids.items() if alive(p)}
            assert not still, f"daemons still running after stop.sh: {still}"
            assert not (Path("/etc/slurm/slurm.conf").is_symlink() and str(state) in os.readlink("/etc/slurm/slurm.conf"))


def _squeue(state: Path, job_ids: list[str]) -> dict[str, dict]:
    proc = subprocess.run(
        ["timeout", "20", "squeue", "--states=all", "-h", "-j", ",".join(job_ids),
         "-O", "JobID:20,State:20,tres-per-job:40,Comment:200"],
        env=run_env(SLURM_CONF=str(state / "slurm.conf")), capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    jobs = {}
    for line in proc.stdout.splitlines():
        job_id, st, tres, comment = line[:20].strip(), line[20:40].strip(), line[40:80].strip(), line[80:].strip()
        jobs[job_id] = {"state": st, "tres": tres, "comment": comment}
    return jobs


def _read_table(path: Path, columns: list[str], key: list[str]):
    import pandas as pd

    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in key if c not in table.columns]
    assert not missing, f"{path}: no {missing}"
    cols = [c for c in columns if c in table.columns]
    return table[cols].sort_values(key).reset_index(drop=True)


def snapshot_checkout(dest: Path) -> Path:
    """A copy of what the runs read (Snakefile, workflow, config, profiles, src, tests/slurm), so that
    both runs use the same code even if the working tree is edited while the test runs."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".snakemake", "results")
    dest.mkdir()
    shutil.copy2(ROOT / "Snakefile", dest / "Snakefile")
    for sub in ("workflow", "config", "profiles", "src", "envs", "tests/slurm", "tests/configs"):
        if (ROOT / sub).exists():
            shutil.copytree(ROOT / sub, dest / sub, ignore=ignore, symlinks=True)
    return dest


@pytest.mark.slow
def test_study_through_slurm_matches_local_run(local_cluster, tmp_path):
    state = local_cluster
    root = snapshot_checkout(tmp_path / "checkout")
    cfg = write_test_config(tmp_path / "tiny-slurm.yaml")
    targets = ["results/runs.csv", "results/schedules.csv"]
    dirs = {name: tmp_path / name for name in ("local", "slurm", "flaky")}
    for d in dirs.values():
        d.mkdir()
    env = run_env(SLURM_CONF=str(state / "slurm.conf"))
    commands = {
        # the reference: the workstation run (profiles/default) of the same config
        "local": snakemake_cmd(SNAKEMAKE_TIMEOUT_S, *targets, "-s", str(root / "Snakefile"), "--cores", "2",
                               "--configfile", str(cfg)),
        # the documented cluster command (docs/slurm.md), with the test variant of profiles/slurm
        "slurm": snakemake_cmd(SNAKEMAKE_TIMEOUT_S, *targets, "-s", str(root / "Snakefile"),
                               "--workflow-profile", str(root / "tests" / "slurm" / "profile"), "--configfile", str(cfg)),
        # a rule failing on its first attempt, through the same cluster and profile
        "flaky": snakemake_cmd(SNAKEMAKE_TIMEOUT_S, "-s", str(root / "tests" / "slurm" / "flaky" / "Snakefile"),
                               "--workflow-profile", str(root / "tests" / "slurm" / "profile")),
    }
    started = time.monotonic()
    procs, logs, walls = {}, {}, {}
    try:
        for name, cmd in commands.items():
            logs[name] = open(dirs[name] / "snakemake.out", "w")
            procs[name] = subprocess.Popen(cmd, cwd=dirs[name], env=env, stdout=logs[name], stderr=subprocess.STDOUT)
        deadline = started + SNAKEMAKE_TIMEOUT_S + 30
        while len(walls) < len(procs) and time.monotonic() < deadline:
            for name, proc in procs.items():
                if name not in walls and proc.poll() is not None:
                    walls[name] = time.monotonic() - started
            time.sleep(0.5)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=15)
                if proc.poll() is None:
                    proc.kill()
        for f in logs.values():
            f.close()
    out = {name: (dirs[name] / "snakemake.out").read_text() for name in dirs}
    print("wall time:", {name: f"{w:.0f}s" for name, w in walls.items()})
    for name, proc in procs.items():
        assert proc.returncode == 0, f"{name} run failed ({proc.returncode}):\n{out[name][-4000:]}"

    # --- the test variant replaced profiles/default (no workstation `gpu: 1` limit leaked in) ---
    slurm_out = out["slurm"]
    assert f"Using workflow specific profile {root / 'tests' / 'slurm' / 'profile'}" in slurm_out, slurm_out[:1000]
    assert f"Using workflow specific profile {root / 'profiles' / 'default'}" in out["local"], out["local"][:1000]
    events = [line for line in slurm_out.splitlines() if SUBMITTED.search(line) or line.startswith("Finished jobid")]
    finetunes = [i for i, line in enumerate(events) if "/rule_finetune/" in line]
    assert len(finetunes) == 2 and not any(e.startswith("Finished") for e in events[finetunes[0]:finetunes[1]]), (
        "the two finetune jobs (gpu=1 each) were not submitted together: a global gpu limit applies\n"
        + "\n".join(events)
    )

    # --- every job that does work went through sbatch ---
    submitted = SUBMITTED.findall(slurm_out)
    assert submitted, slurm_out[-3000:]
    print("SLURM jobs:", [(Path(log).parent.relative_to(dirs["slurm"] / ".snakemake" / "slurm_logs").as_posix(), jid)
                          for _, jid, log in submitted])
    remote_rules = re.findall(r"^rule (\w+):", slurm_out, re.M)
    local_rules = re.findall(r"^localrule (\w+):", slurm_out, re.M)
    assert len(remote_rules) == len(submitted), "a non-local job was not submitted"
    assert set(local_rules) <= LOCAL_OK, f"rules run on the submit host instead of SLURM: {set(local_rules) - LOCAL_OK}"
    expected_counts = {"prepare": 2, "pretrain": 1, "finetune": 2, "tokenizer": 1}
    for rule, n in expected_counts.items():
        assert remote_rules.count(rule) == n, f"{rule}: {remote_rules.count(rule)} SLURM jobs, expected {n}"
    slurm_logs = dirs["slurm"] / ".snakemake" / "slurm_logs"
    for _, job_id, log in submitted:
        assert Path(log).is_file() and Path(log).parent.is_relative_to(slurm_logs), log
        assert Path(log).name == f"{job_id}.log"
    jobs = _squeue(state, [jid for _, jid, _ in submitted])
    for _, job_id, log in submitted:
        rule = Path(log).relative_to(slurm_logs).parts[0].removeprefix("rule_")
        assert job_id in jobs, f"SLURM has no record of job {job_id}"
        assert jobs[job_id]["state"] == "COMPLETED", (job_id, jobs[job_id])
        assert jobs[job_id]["comment"].startswith(f"rule_{rule}"), (job_id, jobs[job_id])
        if rule in ("pretrain", "finetune"):
            assert jobs[job_id]["tres"] == "gres:gpu:1", f"{rule} job {job_id} did not ask for --gpus=1: {jobs[job_id]}"

    # --- same numbers as the local run ---
    for table, columns, key, required in (
        ("runs.csv", RUNS_COLUMNS, ["run_id"], ["eval_loss", "accuracy", "mlm_accuracy"]),
        ("schedules.csv", SCHEDULES_COLUMNS, ["schedule", "seed"], ["accuracy", "stage1_eval_loss"]),
    ):
        local = _read_table(dirs["local"] / "results" / table, columns, key)
        slurm = _read_table(dirs["slurm"] / "results" / table, columns, key)
        assert len(local) == len(slurm) > 0
        assert list(local.columns) == list(slurm.columns)
        for col in required:
            assert col in local.columns, f"{table} lacks {col}"
        diff = local.compare(slurm)
        assert diff.empty, f"{table} differs between the local and the SLURM run:\n{diff.to_string()}"
        print(table, "\n", slurm.to_string())
    # --- a failing job is reported failed and resubmitted ---
    flaky_out = out["flaky"]
    flaky_jobs = SUBMITTED.findall(flaky_out)
    assert len(flaky_jobs) == 2, flaky_out[-3000:]
    first, second = flaky_jobs[0][1], flaky_jobs[1][1]
    assert re.search(rf"Error in rule flaky:\n\s+message: SLURM-job '{first}' failed", flaky_out), flaky_out[-3000:]
    assert (dirs["flaky"] / "flaky.txt").read_text().strip() == "2"
    assert (dirs["flaky"] / "attempts.txt").read_text().split() == ["attempt", "1", "attempt", "2"]
    flaky_states = _squeue(state, [first, second])
    assert flaky_states[first]["state"] == "FAILED" and flaky_states[second]["state"] == "COMPLETED", flaky_states
    assert "failing on purpose" in (dirs["flaky"] / ".snakemake" / "slurm_logs" / "rule_flaky" / f"{first}.log").read_text()
