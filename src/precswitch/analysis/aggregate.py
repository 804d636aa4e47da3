"""Aggregate per-stage ``metrics.json`` and ``steps.csv`` files into the study's tables.

``runs``: one row per stage run (the flat scalars of metrics.json, plus ``grad_norm_<k>`` from the
``grad_norm`` dict, ``override_<key>`` per optimizer override of the stage and ``metrics_path``, the file
it came from).

``schedules``: one row per (schedule, seed), built from every *finetune* run: its stage 1 is the run whose
``run_id`` equals the finetune run's ``init_run_id``. A finetune run whose ``init_run_id`` is empty or
not among the inputs (fine-tuning from scratch or from a hub model) gives a row with empty stage-1
columns (``stage1_precision`` then falls back to the finetune run's ``init_precision``).

The contract columns (docs/contracts.md) come first, in contract order; extra columns follow. A stage's
structure is columns, never a name to parse: ``precision``, ``switch_to``, ``switch_at`` (in-stage switch)
and one ``override_<key>`` column per optimizer override key that some stage of the study uses (its value
where that stage overrides it, empty elsewhere: ``runs[runs.override_adam_eps == 1e-4]``); schedules
carry the same per stage (``stage1_precision``, ``stage1_switch_to``, ``stage1_switch_at``,
``stage1_override_<key>``, ``stage2_...``). ``spec`` (``stage1_spec``, ``stage2_spec``) is the display name
of that structure (``amp_fp16-to-fp32-at80``, ``pure_fp16-with-adam_eps0.0001``; the stage-1 run's
directory name): label with it, filter on the columns. Then switch-point sweeps (``sweep``, ``sweep_at``,
``sweep_stage`` from the stage-2 tags) and, in runs, the activation-telemetry summary (``act_max_abs``,
``act_max_abs_layer``, ``act_frac_overflow_fp16``, ``act_frac_underflow_fp16``; empty when telemetry was off).

``steps``: every run's ``steps.csv`` rows, each with its run's identity and structure (:data:`STEP_RUN_COLUMNS`)
and ``regular`` (the row is on the run's log grid: every ``log_every``-th step and the last; False for the
extra row the engine logs for a skipped step in between). ``activations``: one row per (stage-1 run, watched
module) from metrics.json's ``activation_telemetry.layers`` (the module's largest |activation| over the
sampled steps), in forward order. The plots read these tables and nothing in a run folder.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterable

from .. import specs
from ..errors import PrecswitchError

#: schedules.csv columns fixed by docs/contracts.md (in this order).
SCHEDULE_COLUMNS = [
    "schedule", "seed", "stage1_precision", "stage2_precision", "status",
    "accuracy", "f1", "mcc", "majority_accuracy",
    "stage1_train_seconds", "stage2_train_seconds", "total_train_seconds",
    "stage1_peak_memory_bytes", "stage2_peak_memory_bytes",
    "stage1_status", "stage2_status", "stage1_eval_loss", "stage1_mlm_accuracy",
    "stage2_samples_per_second", "skipped_steps", "nonfinite_losses",
]
#: Extra schedules.csv columns (after the contract ones).
SCHEDULE_EXTRA_COLUMNS = [
    "stage1_run_id", "stage2_run_id", "stage1_samples_per_second", "stage1_tokens_per_second",
    "stage2_tokens_per_second", "stage1_skipped_steps", "stage2_skipped_steps",
    "stage1_nonfinite_losses", "stage2_nonfinite_losses", "stage1_loss_scale_min",
    "stage2_loss_scale_min", "stage1_status_reason", "stage2_status_reason", "peak_memory_bytes",
    "stage1_spec", "stage1_switch_to", "stage1_switch_at", "stage2_spec", "stage2_switch_to", "stage2_switch_at",
    "sweep", "sweep_at", "sweep_stage",
    # the eval sets' sizes (an accuracy's step) and the held-out test split (docs/contracts.md)
    "eval_examples", "test_accuracy", "test_f1", "test_mcc", "test_majority_accuracy", "test_examples",
]
#: prefix of a runs column holding one optimizer override of the stage (``override_adam_eps``); schedules
#: have ``stage1_override_<key>`` and ``stage2_override_<key>`` after the extra columns. Only the keys some
#: stage of the study overrides get a column.
OVERRIDE_PREFIX = "override_"

#: runs.csv columns copied from metrics.json's ``activation_telemetry`` summary (null when off).
TELEMETRY_COLUMNS = {
    "act_max_abs": "max_abs",
    "act_max_abs_layer": "max_abs_layer",
    "act_frac_overflow_fp16": "frac_overflow_fp16",
    "act_frac_underflow_fp16": "frac_underflow_fp16",
}
#: tags of a stage-2 run copied into runs.csv (switch-point sweeps, workflow/rules/common.smk)
TAG_COLUMNS = ("sweep", "sweep_at", "sweep_stage")
#: runs columns copied onto each of the run's rows in the steps table (its identity and structure; the
#: run's ``override_<key>`` columns follow)
STEP_RUN_COLUMNS = ("run_id", "stage", "schedule", "seed", "status", "spec", "precision", "switch_to",
                    "switch_at")
#: the steps.csv columns the engine writes (docs/contracts.md, "Stage output")
STEP_COLUMNS = ("step", "loss", "lr", "grad_norm", "loss_scale", "step_seconds", "skipped")
#: activations table: the stage-1 run's identity, then one watched module's summary
ACTIVATION_COLUMNS = ("run_id", "stage", "seed", "status", "spec", "precision", "switch_to", "switch_at",
                      "layer", "max_abs", "frac_overflow_fp16", "frac_underflow_fp16")


def spec_name(precision: Any, switch_to: Any, switch_at: Any, overrides: Any = None) -> Any:
    """``amp_fp16``, ``amp_fp16-to-fp32-at80`` for a stage that switched after 80% of its steps, and
    ``pure_fp16-with-adam_eps0.0001`` for a stage run with its own optimizer values (the workflow's stage-1
    directory name: :func:`precswitch.specs.spec_name`). A display name: the structure is in the columns."""
    if _is_missing(precision):
        return precision
    return specs.spec_name({"precision": precision, "switch_to": switch_to, "switch_at": switch_at,
                            "overrides": overrides if isinstance(overrides, dict) else None})


def override_columns(table, prefix: str = OVERRIDE_PREFIX) -> list[str]:
    """The ``<prefix><key>`` columns of a table, in column order."""
    return [c for c in table.columns if str(c).startswith(prefix)]

#: Statuses in order of severity: the schedule's status is the worst of its stages'.
STATUS_SEVERITY = {"ok": 0, "skipped": 1, "diverged": 2}

_IDENTITY_FIRST = [
    "run_id", "stage", "objective", "precision", "seed", "status", "status_reason", "schedule",
    "init", "init_run_id", "init_precision",
]


def _is_missing(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    if isinstance(v, str) and v == "":
        return True
    return False


def flatten_metrics(metrics: dict, path: str | os.PathLike | None = None) -> dict:
    """Flat scalars of one metrics.json; ``grad_norm`` dict → ``grad_norm_<k>``; schedule from tags."""
    row: dict[str, Any] = {}
    for k, v in metrics.items():
        if isinstance(v, dict):
            if k == "grad_norm":
                for kk, vv in v.items():
                    if not isinstance(vv, (dict, list)):
                        row[f"grad_norm_{kk}"] = vv
            continue  # hparams, tags: not scalars
        if isinstance(v, list):
            continue
        row[k] = v
    tags = metrics.get("tags") or {}
    if _is_missing(row.get("schedule")) and isinstance(tags, dict) and tags.get("schedule"):
        row["schedule"] = tags["schedule"]
    if isinstance(tags, dict):
        for k in TAG_COLUMNS:
            if k in tags and _is_missing(row.get(k)):
                row[k] = tags[k]
    hp = metrics.get("hparams")
    if _is_missing(row.get("init")) and isinstance(hp, dict) and isinstance(hp.get("init"), str):
        row["init"] = hp["init"]  # a skipped stage records no init: its hparams do
    overrides = tags.get("overrides") if isinstance(tags, dict) else None
    overrides = overrides if isinstance(overrides, dict) else {}
    row["spec"] = spec_name(row.get("precision"), row.get("switch_to"), row.get("switch_at"), overrides)
    for k in sorted(overrides):
        row[f"{OVERRIDE_PREFIX}{k}"] = float(overrides[k])
    tel = metrics.get("activation_telemetry")
    for col, key in TELEMETRY_COLUMNS.items():
        v = tel.get(key) if isinstance(tel, dict) else None
        if isinstance(v, str) and col != "act_max_abs_layer":  # JSON-safe "inf"/"-inf"
            v = float(v)
        row[col] = v
    if path is not None:
        row["metrics_path"] = str(path)
    return row


def load_runs(paths: Iterable[str | os.PathLike]):
    """Read metrics.json files into the runs DataFrame (one row per distinct run_id)."""
    import pandas as pd

    rows: dict[str, dict] = {}
    seen_paths: set[str] = set()
    for p in paths:
        p = Path(p)
        key = str(p.resolve())
        if key in seen_paths:
            continue
        seen_paths.add(key)
        if not p.is_file():
            raise PrecswitchError(f"metrics file not found: {p}")
        try:
            with open(p, encoding="utf-8") as f:
                metrics = json.load(f)
        except json.JSONDecodeError as e:
            raise PrecswitchError(f"metrics file {p} is not valid JSON: {e}") from None
        if not isinstance(metrics, dict):
            raise PrecswitchError(f"metrics file {p}: expected a JSON object")
        for key_ in ("run_id", "stage", "precision", "seed", "status"):
            if _is_missing(metrics.get(key_)):
                raise PrecswitchError(f"metrics file {p}: missing required key '{key_}'")
        if metrics["stage"] not in ("pretrain", "finetune"):
            raise PrecswitchError(
                f"metrics file {p}: stage '{metrics['stage']}' is not one of pretrain, finetune"
            )
        row = flatten_metrics(metrics, p)
        rid = row["run_id"]
        if rid in rows:
            old = {k: v for k, v in rows[rid].items() if k != "metrics_path"}
            new = {k: v for k, v in row.items() if k != "metrics_path"}
            if old != new:
                raise PrecswitchError(
                    f"run_id '{rid}' appears in two different metrics files: "
                    f"{rows[rid]['metrics_path']} and {p}"
                )
            continue
        rows[rid] = row
    if not rows:
        raise PrecswitchError("no metrics files given (--metrics FILE...)")
    df = pd.DataFrame(list(rows.values()))
    df = df.sort_values(["stage", "precision", "seed", "run_id"],
                        key=lambda s: s.map({"pretrain": 0, "finetune": 1}) if s.name == "stage" else s)
    # columns in the order the sorted runs name them (not the order of the --metrics arguments)
    first = [c for c in _IDENTITY_FIRST if c in df.columns]
    seen = dict.fromkeys(k for rid in df["run_id"] for k in rows[rid])
    df = df[first + [c for c in seen if c not in first]]
    return df.reset_index(drop=True)


def _worst_status(*statuses: Any) -> str:
    present = [s for s in statuses if not _is_missing(s)]
    if not present:
        return "ok"
    return max(present, key=lambda s: STATUS_SEVERITY.get(s, 3))


def _num(v: Any) -> float:
    if _is_missing(v):
        return float("nan")
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def _sum_nan(*vals: Any) -> float:
    xs = [_num(v) for v in vals]
    xs = [x for x in xs if not math.isnan(x)]
    return float(sum(xs)) if xs else float("nan")


def _dir_key(path: Path) -> str:
    try:
        return str(path.resolve())
    except OSError:
        return str(path)


def build_schedules(runs):
    """One row per (schedule, seed), joined stage 1 → stage 2 by ``init_run_id``."""
    import pandas as pd

    by_id = {r["run_id"]: r for r in runs.to_dict("records")}
    overrides = override_columns(runs)
    by_dir = {_dir_key(Path(str(r["metrics_path"])).parent): r["run_id"] for r in by_id.values()
              if r.get("stage") == "pretrain" and not _is_missing(r.get("metrics_path"))}
    out = []
    fine = runs[runs["stage"] == "finetune"]
    for r in fine.to_dict("records"):
        sched = r.get("schedule")
        if _is_missing(sched):
            raise PrecswitchError(
                f"finetune run '{r['run_id']}' ({r.get('metrics_path')}) has no schedule "
                "(metrics.json 'schedule' or tags.schedule)"
            )
        s1 = None
        init_id = r.get("init_run_id")
        if _is_missing(init_id) and not _is_missing(r.get("init")):
            # a stage skipped before loading its init (precision refused) names only the checkpoint dir
            init_id = by_dir.get(_dir_key(Path(str(r["init"])).parent))
        if not _is_missing(init_id):
            s1 = by_id.get(init_id)
            if s1 is None:
                print(
                    f"precswitch aggregate: warning: finetune run '{r['run_id']}' starts from run "
                    f"'{init_id}', which is not among the inputs: its stage-1 columns stay empty",
                    file=sys.stderr,
                )
            elif s1.get("stage") != "pretrain":
                print(
                    f"precswitch aggregate: warning: run '{init_id}' (init of '{r['run_id']}') is a "
                    f"{s1.get('stage')} run, used as stage 1 anyway",
                    file=sys.stderr,
                )
        s1d: dict = s1 if s1 is not None else {}
        g1 = s1d.get
        stage1_precision = g1("precision") if s1 is not None else r.get("init_precision")
        row = {
            "schedule": sched,
            "seed": r["seed"],
            "stage1_precision": None if _is_missing(stage1_precision) else stage1_precision,
            "stage2_precision": r["precision"],
            "status": _worst_status(g1("status"), r.get("status")),
            "accuracy": _num(r.get("accuracy")),
            "f1": _num(r.get("f1")),
            "mcc": _num(r.get("mcc")),
            "majority_accuracy": _num(r.get("majority_accuracy")),
            "stage1_train_seconds": _num(g1("train_seconds")),
            "stage2_train_seconds": _num(r.get("train_seconds")),
            "total_train_seconds": _sum_nan(g1("train_seconds"), r.get("train_seconds")),
            "stage1_peak_memory_bytes": _num(g1("peak_memory_bytes")),
            "stage2_peak_memory_bytes": _num(r.get("peak_memory_bytes")),
            "stage1_status": g1("status"),
            "stage2_status": r.get("status"),
            "stage1_eval_loss": _num(g1("eval_loss")),
            "stage1_mlm_accuracy": _num(g1("mlm_accuracy")),
            "stage2_samples_per_second": _num(r.get("samples_per_second")),
            "skipped_steps": _sum_nan(g1("skipped_steps"), r.get("skipped_steps")),
            "nonfinite_losses": _sum_nan(g1("nonfinite_losses"), r.get("nonfinite_losses")),
            "stage1_run_id": g1("run_id"),
            "stage2_run_id": r["run_id"],
            "stage1_samples_per_second": _num(g1("samples_per_second")),
            "stage1_tokens_per_second": _num(g1("tokens_per_second")),
            "stage2_tokens_per_second": _num(r.get("tokens_per_second")),
            "stage1_skipped_steps": _num(g1("skipped_steps")),
            "stage2_skipped_steps": _num(r.get("skipped_steps")),
            "stage1_nonfinite_losses": _num(g1("nonfinite_losses")),
            "stage2_nonfinite_losses": _num(r.get("nonfinite_losses")),
            "stage1_loss_scale_min": _num(g1("loss_scale_min")),
            "stage2_loss_scale_min": _num(r.get("loss_scale_min")),
            "stage1_status_reason": g1("status_reason"),
            "stage2_status_reason": r.get("status_reason"),
            "stage1_spec": g1("spec") if s1 is not None else None,
            "stage1_switch_to": g1("switch_to"),
            "stage1_switch_at": _num(g1("switch_at")),
            "stage2_spec": r.get("spec"),
            "stage2_switch_to": r.get("switch_to"),
            "stage2_switch_at": _num(r.get("switch_at")),
            "sweep": r.get("sweep"),
            "sweep_at": _num(r.get("sweep_at")),
            "sweep_stage": r.get("sweep_stage"),
            **{k: _num(r.get(k)) for k in ("eval_examples", "test_accuracy", "test_f1", "test_mcc",
                                          "test_majority_accuracy", "test_examples")},
        }
        for stage, run in (("stage1", s1d), ("stage2", r)):
            for c in overrides:
                row[f"{stage}_{c}"] = _num(run.get(c))
        mems = [x for x in (row["stage1_peak_memory_bytes"], row["stage2_peak_memory_bytes"])
                if not math.isnan(x)]
        row["peak_memory_bytes"] = max(mems) if mems else float("nan")
        out.append(row)
    df = pd.DataFrame(out, columns=SCHEDULE_COLUMNS + SCHEDULE_EXTRA_COLUMNS
                      + [f"{stage}_{c}" for stage in ("stage1", "stage2") for c in overrides])
    dup = df.duplicated(["schedule", "seed"], keep=False)
    if dup.any():
        d = df[dup].sort_values(["schedule", "seed"])
        pairs = ", ".join(f"{s} seed {k} ({rid})" for s, k, rid in
                          zip(d["schedule"], d["seed"], d["stage2_run_id"]))
        raise PrecswitchError(f"more than one finetune run for the same (schedule, seed): {pairs}")
    return df.sort_values(["schedule", "seed"]).reset_index(drop=True)


def _parquet_safe(df):
    """Object columns holding mixed Python types (e.g. int and str) → str, so pyarrow can write them."""
    df = df.copy()
    for c in df.columns:
        if df[c].dtype == object:
            types = {type(v) for v in df[c] if not _is_missing(v)}
            numeric = {int, float, bool}
            if len(types) > 1 and not types <= numeric:
                df[c] = df[c].map(lambda v: None if _is_missing(v) else str(v))
    return df


def write_table(df, csv_path: str | os.PathLike, parquet_path: str | os.PathLike | None = None) -> None:
    """Write CSV (and parquet) atomically."""
    from ..io import atomic_path, atomic_write_text

    atomic_write_text(csv_path, df.to_csv(index=False))
    if parquet_path is not None:
        with atomic_path(parquet_path) as tmp:
            _parquet_safe(df).to_parquet(tmp, index=False)


#: Columns that are text even when every value looks like a number (commit ids, hashes, versions).
STRING_COLUMNS = [
    "run_id", "stage", "objective", "precision", "status", "status_reason", "schedule", "init", "init_run_id",
    "init_precision", "param_dtype", "checkpoint_dtype_written", "checkpoint_dtype_read", "memory_kind",
    "eval_precision", "eval_note", "device", "device_name", "cuda_version", "driver_version", "cudnn_version",
    "torch_version", "transformers_version", "datasets_version", "python_version", "float32_matmul_precision",
    "git_commit", "hostname", "config_hash", "started_at", "finished_at", "metrics_path",
    "stage1_precision", "stage2_precision", "stage1_status", "stage2_status", "stage1_run_id", "stage2_run_id",
    "stage1_status_reason", "stage2_status_reason",
    "spec", "switch_to", "precision_final", "update_compensation", "autocast_dtype", "act_max_abs_layer",
    "sweep", "sweep_stage", "stage1_spec", "stage2_spec", "stage1_switch_to", "stage2_switch_to",
    "init_status", "model_revision", "model_commit", "data_revision", "data_commit", "layer",
]


def first_value(df, col: str):
    """The most common non-empty value of a column (None when it has none)."""
    if col not in df:
        return None
    v = df[col].dropna()
    v = v[v.astype(str) != ""]
    return None if v.empty else v.mode().iloc[0]


def read_table(path: str | os.PathLike):
    """Read runs/schedules written by :func:`write_table` (CSV or parquet) with text columns kept text."""
    import pandas as pd

    path = Path(path)
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    header = pd.read_csv(path, nrows=0).columns
    text = [c for c in STRING_COLUMNS if c in header]
    df = pd.read_csv(path, dtype={c: "string" for c in text})
    if text:  # only an empty cell is missing text: a schedule may be named `NA`, `None` or `nan`
        df[text] = pd.read_csv(path, usecols=text, dtype="string", keep_default_na=False, na_values=[""])[text]
    return df.astype({c: object for c in text}).replace({pd.NA: None})


def _metrics_of(run: dict) -> dict:
    """The metrics.json a runs row came from (one of aggregate's inputs), read again."""
    with open(str(run["metrics_path"]), encoding="utf-8") as f:
        return json.load(f)


def _regular_rows(st, log_every: Any):
    """True for the rows of the run's regular log (every ``log_every``-th step and the last); False for the rows
    the engine adds for a skipped step in between, which only one run has at that step, so curves averaged
    over seeds leave them out. Without a readable ``log_every`` every row counts as regular."""
    try:
        every = int(log_every)
    except (TypeError, ValueError):
        every = 0
    step = st["step"].astype(int)
    if every < 1:
        return step == step
    return ((step - 1) % every == 0) | (step == step.max())


def build_steps(runs, steps_paths: Iterable[str | os.PathLike] | None = None):
    """Every run's steps.csv rows in one table, each with its run's identity and structure columns
    (:data:`STEP_RUN_COLUMNS`, ``override_<key>``) and ``regular``. A steps file belongs to the run whose
    metrics.json is in its folder; one without such a run is an error. A run without a steps file, or with an
    unreadable one, has no rows (a warning counts them); an empty log (a skipped stage's header) has none either.
    ``steps_paths`` None: no logs asked for, the table is its header (no warning)."""
    import pandas as pd

    run_cols = list(STEP_RUN_COLUMNS) + override_columns(runs)
    if steps_paths is None:
        return pd.DataFrame(columns=run_cols + list(STEP_COLUMNS) + ["regular"])
    records = runs.to_dict("records")
    by_dir = {_dir_key(Path(str(r["metrics_path"])).parent): r["run_id"] for r in records
              if not _is_missing(r.get("metrics_path"))}
    given: dict[str, Path] = {}
    for p in steps_paths:
        p = Path(p)
        rid = by_dir.get(_dir_key(p.parent))
        if rid is None:
            raise PrecswitchError(f"steps file {p}: no metrics.json among the inputs is in its folder "
                                  "(give each run's metrics.json and steps.csv)")
        given[rid] = p
    frames, missing = [], 0
    for r in records:
        sp = given.get(r["run_id"])
        if sp is None or not sp.is_file():
            missing += 1
            continue
        try:
            st = pd.read_csv(sp)
        except Exception:  # noqa: BLE001 - an empty or broken log is counted, not fatal
            missing += 1
            continue
        if st.empty or "step" not in st or "loss" not in st:
            continue
        hparams = _metrics_of(r).get("hparams")
        st["regular"] = _regular_rows(st, hparams.get("log_every") if isinstance(hparams, dict) else None)
        for c in run_cols:
            st[c] = r.get(c)
        frames.append(st[run_cols + [c for c in st.columns if c not in run_cols]])
    if missing:
        print(f"precswitch aggregate: warning: no steps.csv for {missing} run(s); their curves are missing "
              "from the plots", file=sys.stderr)
    if not frames:
        return pd.DataFrame(columns=run_cols + list(STEP_COLUMNS) + ["regular"])
    out = pd.concat(frames, ignore_index=True)
    for c in ("step", "loss", "loss_scale", "skipped"):
        if c in out:
            out[c] = pd.to_numeric(out[c], errors="coerce")
    return out


def build_activations(runs):
    """One row per (run, watched module) of every run with activation telemetry, from its metrics.json's
    ``activation_telemetry.layers`` (largest |activation| over the sampled steps; ``inf`` kept), modules in
    the order the run recorded them (forward order)."""
    import pandas as pd

    rows = []
    for r in runs.to_dict("records"):
        if _is_missing(r.get("metrics_path")):
            continue
        tel = _metrics_of(r).get("activation_telemetry")
        layers = tel.get("layers") if isinstance(tel, dict) else None
        if not isinstance(layers, dict):
            continue
        for layer, v in layers.items():
            v = v if isinstance(v, dict) else {}
            rows.append({**{c: r.get(c) for c in ACTIVATION_COLUMNS[:8]}, "layer": layer,
                         **{k: _num(v.get(k)) for k in ACTIVATION_COLUMNS[9:]}})
    return pd.DataFrame(rows, columns=list(ACTIVATION_COLUMNS))


def aggregate(metrics_paths: Iterable[str | os.PathLike], out_dir: str | os.PathLike,
              steps_paths: Iterable[str | os.PathLike] | None = None):
    """Build the tables and write ``runs``, ``schedules`` and ``steps`` (``.csv`` and ``.parquet``) and
    ``activations.csv`` (header only without telemetry) in out_dir; ``steps_paths``: the runs' steps.csv
    files (each in its run's folder, beside its metrics.json; None: a steps table without rows). Returns
    (runs, schedules)."""
    out_dir = Path(out_dir)
    runs = load_runs(metrics_paths)
    schedules = build_schedules(runs)
    steps = build_steps(runs, steps_paths)
    activations = build_activations(runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_table(runs, out_dir / "runs.csv", out_dir / "runs.parquet")
    write_table(schedules, out_dir / "schedules.csv", out_dir / "schedules.parquet")
    write_table(steps, out_dir / "steps.csv", out_dir / "steps.parquet")
    write_table(activations, out_dir / "activations.csv")
    return runs, schedules
