"""``precswitch train``: run ONE training stage under ONE named precision."""

from __future__ import annotations

import argparse
import sys

from .. import cpu_isa  # torch-free


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
    p.add_argument("--cpu-isa", choices=tuple(cpu_isa.LEVELS),
                   help=("cap oneDNN and ATen at this CPU instruction set before torch starts (hparams cpu_isa; "
                         "native, the default: what the CPU has); avx2 gives an AVX2 CPU's numbers on any x86 CPU"))
    p.add_argument("--log", metavar="FILE",
                   help=("write the stage's output (progress, phases, warnings) to FILE, opened only once the stage "
                         "holds its output dir: a run refused because another process trains there leaves that "
                         "run's log as it was; an error is also said on the console"))
    p.set_defaults(func=_run)


def _to_log(path: str) -> int:
    """Send this process's stdout and stderr to ``path`` (truncated); returns a copy of the console's stderr."""
    import os

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    console = os.dup(2)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return console


def _run(args) -> int:
    import json

    from ..errors import PrecswitchError
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
    if args.cpu_isa:
        hp["cpu_isa"] = args.cpu_isa
    # oneDNN and ATen read their caps when torch starts: set them before the engine imports it
    level = hp.get("cpu_isa") or C.DEFAULTS["cpu_isa"]
    if why := cpu_isa.problem(level):
        raise PrecswitchError(f"cpu_isa {why}")
    cpu_isa.apply(level)
    from ..gpu import pin_gpu

    # one GPU per job, pinned through CUDA_VISIBLE_DEVICES before the engine's torch initialises CUDA
    pin_gpu(hp.get("device", C.DEFAULTS["device"]))
    from .engine import Preempted, run_stage

    console = []  # the console's stderr, once the output goes to --log

    def locked():
        console.append(_to_log(args.log))

    try:
        m = run_stage(hp, args.out, on_locked=locked) if args.log else run_stage(hp, args.out)
    except Preempted as e:
        print(f"precswitch: preempted: {e}", file=sys.stderr)
        return e.exit_code
    except PrecswitchError as e:  # in the log (the caller prints it) and on the console
        for fd in console:
            import os

            os.write(fd, f"precswitch: error: {e} (log: {args.log})\n".encode())
        raise
    summary = {k: m.get(k) for k in ("run_id", "status", "train_seconds", "steps_per_second", "eval_loss", "accuracy",
                                      "mlm_accuracy", "peak_memory_bytes")}
    print(json.dumps(summary))
    return 0
