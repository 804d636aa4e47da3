"""The plan of a checked study: which runs it makes (schedules with their sweep points, shared stage-1 runs,
seeds; a sequential design's comparisons)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from .. import schema
from .. import stage_rules as rules
from .. import sweeps as _sweeps
from ..errors import PrecswitchError
from ..specs import run_spec, spec_name
from .checks import CHECKS, STAGES
from .jobs import source_spec
from .validate import ConfigError, validate


def _expand_sweeps(cfg) -> dict:
    """Add the schedules of every switch-point sweep (<name>-at<percent>) to cfg["schedules"]; returns each
    point's stage-2 tags (sweep, sweep_at = f, sweep_stage) by schedule name. precswitch.sweeps says what a
    sweep is (the schema checked its precisions and fractions)."""
    sweeps = cfg.get("sweeps") or {}
    meta = {}
    for name, sweep in sweeps.items():
        swept = _sweeps.swept_stages(sweep)
        if len(swept) != 1:
            continue  # precswitch.sweeps.expand below says what is wrong
        stage = swept[0]
        why = rules.switch(sweep[stage]["precision"], sweep[stage]["switch_to"], 1)
        if why:
            raise ConfigError(f"sweeps.{name}.{stage}.{why[0]}", why[1])
        for f in sweep["switch_at"]:
            meta[_sweeps.point_name(name, f)] = {"sweep": name, "sweep_at": f, "sweep_stage": stage}
    try:  # one stage swept, no two points or schedules of one name (the messages name the key)
        cfg["schedules"].update(_sweeps.expand(sweeps, cfg["schedules"]))
    except PrecswitchError as e:  # "config key <key>: <problem>" already
        raise ConfigError(*str(e).removeprefix("config key ").split(": ", 1)) from None
    return meta


@dataclass
class Plan:
    """What a checked config runs. ``config``: a copy of the config with the sweep points among its schedules
    and YAML's ``compile: false`` read as off; ``schedules``: name -> {stage: run spec} (precswitch.specs);
    ``sweeps``: a sweep point's stage-2 tags by schedule name; ``stage1``: the stage-1 runs by run name (the
    precision wildcard), shared by the schedules whose stage 1 is the same (precision, switch, overrides);
    ``seeds``: the seeds, every run made once per seed; with a sequential design (``sequential``, made by
    :func:`sequential_design`), the seeds a schedule may run, in the order it runs them, of which the looks
    choose how many."""

    config: dict
    schedules: dict
    sweeps: dict
    stage1: dict
    seeds: list
    sequential: dict | None = None

    def stage1_of(self, schedule: str) -> str | None:
        """The stage-1 run name of a schedule (its directory under runs/pretrain), or None (model.init)."""
        spec = self.schedules[schedule].get("pretrain")
        return None if spec is None else spec_name(spec)


def plan(config: dict) -> Plan:
    """Check a config the schema filled (:func:`validate`) past the schema, and plan its runs. ``config`` is
    not changed. Raises ConfigError naming the key."""
    cfg = copy.deepcopy(config)
    for stage in STAGES:  # YAML reads an unquoted `compile: off` as false: one spelling from here on
        cfg["train"][stage]["compile"] = rules.compile_mode(cfg["train"][stage]["compile"])
    sweeps = _expand_sweeps(cfg)
    for check_ in CHECKS:
        check_(cfg)
    schedules = {name: {stage: run_spec(v) for stage, v in stages.items()} for name, stages in cfg["schedules"].items()}
    stage1, owner = {}, {}
    for name, stages in schedules.items():
        if "pretrain" not in stages:
            continue
        run = spec_name(stages["pretrain"])
        if stage1.setdefault(run, stages["pretrain"]) != stages["pretrain"]:
            # the name keeps 6 significant digits of the percent: two switch points closer than that would share
            # one run, trained at one of them, and the other schedule would fine-tune from a stage 1 it did not ask
            raise ConfigError(
                f"schedules.{name}.pretrain",
                f"switch_at {stages['pretrain']['switch_at']} and schedule {owner[run]}'s "
                f"{stage1[run]['switch_at']} give one stage-1 run name, {run!r}; make them equal or further apart")
        owner.setdefault(run, name)
    # a misspelt column of a local table is named now, not by the prepare job that runs beside stage 1
    from ..data.loading import check_table_headers

    for stage in STAGES:
        try:
            check_table_headers(source_spec(cfg, stage, synth_dir=""))
        except PrecswitchError as e:
            raise ConfigError(f"data.{stage}.columns", str(e).removeprefix("source: ")) from None
    seeds = [int(s) for s in cfg["seeds"]]
    study = Plan(config=cfg, schedules=schedules, sweeps=sweeps, stage1=stage1, seeds=seeds)
    if cfg["sequential"] is not None:
        study.seeds = seed_sequence(seeds, cfg["sequential"]["max_seeds"])
        study.sequential = sequential_design(study)
    return study


def seed_sequence(seeds: list, n: int) -> list[int]:
    """The first ``n`` seeds of a sequential design: the seeds list's first values, then the integers after its
    largest (the same every rerun)."""
    seeds = [int(s) for s in seeds]
    return (seeds + list(range(max(seeds) + 1, max(seeds) + 1 + n)))[:n]


def sequential_design(study: Plan) -> dict:
    """What `precswitch look` needs of a sequential study (JSON): the sequential settings, analysis.margin and
    analysis.power, the seed sequence, the comparisons ([a, b]: each schedule vs analysis.baseline, then the
    analysis.contrasts not already among them) and each schedule's stage-1 run (None: model.init)."""
    analysis = analysis_settings(study)
    base = analysis["baseline"]
    pairs = [[s, base] for s in study.schedules if s != base]
    seen = {frozenset(p) for p in pairs}
    for a, b in analysis["contrasts"]:
        if frozenset((a, b)) not in seen:
            pairs.append([a, b])
            seen.add(frozenset((a, b)))
    return {**study.config["sequential"], "margin": analysis["margin"], "power": analysis["power"],
            "seeds": list(study.seeds), "comparisons": pairs, "schedules": list(study.schedules),
            "stage1": {s: study.stage1_of(s) for s in study.schedules}}


def check(config: dict) -> None:
    """Every check of a study config: the schema (its defaults filled into a copy), then :func:`plan`'s."""
    plan(validate(copy.deepcopy(config)))


def analysis_settings(study: Plan) -> dict:
    """The analysis settings for precswitch stats; the schema's default contrast pairs and positive control that
    name a schedule this study does not run are dropped here (the checks let them through quietly)."""
    analysis = dict(study.config["analysis"])
    if analysis["contrasts"] == schema.node("analysis", "contrasts")["default"]:
        analysis["contrasts"] = [pair for pair in analysis["contrasts"]
                                 if all(name in study.schedules for name in pair)]
    if analysis["positive_control"] not in study.schedules:  # the default's control, absent here: none
        analysis["positive_control"] = None
    return analysis

