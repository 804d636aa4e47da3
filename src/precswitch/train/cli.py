"""``precswitch train``: run ONE training stage under ONE named precision."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="run one training stage (mlm or classify) under one precision",
        description=(
            "Run one training stage and write OUT/metrics.json, OUT/steps.csv and OUT/checkpoint/. "
            "Exit 0 on success or recorded divergence, 2 on bad input (nothing written), "
            "75 after SIGTERM (resumable state saved: run the same command again)."
        ),
    )
    p.add_argument("--hparams", required=True, help="JSON object, @file.json, or a .json/.yaml file path")
    p.add_argument("--out", required=True, help="output directory of the stage")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=("override one hyper-parameter (VALUE parsed as JSON, else string); a dotted KEY sets one key of a "
              "mapping and keeps the others (model.hidden_size=256), a plain one replaces the whole value; repeatable"),
    )
    p.set_defaults(func=_run)


def _run(args) -> int:
    import json

    from ..errors import EXIT_PREEMPTED, PrecswitchError
    from . import config as C

    hp = C.load_hparams(args.hparams)
    for item in args.set:
        if "=" not in item:
            raise PrecswitchError(f"--set {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        try:
            value = json.loads(v)
        except json.JSONDecodeError:
            value = v
        *parents, leaf = k.split(".")
        node = hp
        for i, part in enumerate(parents):  # model.hidden_size: into the mapping, its other keys kept
            child = node.get(part, {})
            if not isinstance(child, dict):
                where = ".".join(parents[: i + 1])
                raise PrecswitchError(f"--set {item!r}: {where} is not a mapping (it is {child!r})")
            node[part] = child = dict(child)
            node = child
        node[leaf] = value
    from ..gpu import pin_gpu

    # one GPU per job, pinned through CUDA_VISIBLE_DEVICES before the engine's torch initialises CUDA
    pin_gpu(hp.get("device", C.DEFAULTS["device"]))
    from .engine import Preempted, run_stage

    try:
        m = run_stage(hp, args.out)
    except Preempted as e:
        print(f"precswitch: preempted: {e}", file=sys.stderr)
        return e.exit_code
    summary = {k: m.get(k) for k in ("run_id", "status", "train_seconds", "steps_per_second", "eval_loss", "accuracy",
                                      "mlm_accuracy", "peak_memory_bytes")}
    print(json.dumps(summary))
    return 0
