"""``precswitch`` command line: a thin dispatcher. Each command's module owns its arguments.

Modules listed in COMMANDS expose ``register(subparsers)``, which adds one or more sub-commands and
sets ``func`` (called with the parsed args; returns an exit code). Heavy imports (torch, transformers)
happen inside those functions so that ``precswitch --help`` is fast.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys

from . import __version__
from .errors import EXIT_USER_ERROR, PrecswitchError

#: Modules that register sub-commands (order = order in --help).
COMMAND_MODULES = (
    "precswitch.data.cli",
    "precswitch.train.cli",
    "precswitch.analysis.cli",
    "precswitch.fetch",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="precswitch",
        description="One-stage BERT training under a named precision, data preparation and analysis.",
    )
    parser.add_argument("--version", action="version", version=f"precswitch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command. With no argv (the ``precswitch`` program: the process exits next) the objects left are
    frozen out of the garbage collector first: the interpreter's shutdown otherwise walks every object torch,
    transformers and datasets created, seconds of a training job's exit (benchmarks/job_overhead.py)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USER_ERROR
    try:
        return int(args.func(args) or 0)
    except PrecswitchError as e:
        print(f"precswitch: error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    finally:
        if argv is None:
            gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
