"""``precswitch`` command line: a thin dispatcher. Each command's module owns its arguments.

Modules listed in COMMANDS expose ``register(subparsers)``, which adds one or more sub-commands and
sets ``func`` (called with the parsed args; returns an exit code). Heavy imports (torch, transformers)
happen inside those functions so that ``precswitch --help`` is fast.
"""

from __future__ import annotations

import argparse
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
    "precswitch.warm",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="precswitch",
        description="One-stage BERT training under a named precision, data preparation and analysis.",
    )
    parser.add_argument("--version", action="version", version=f"precswitch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:  # a module not written yet must not break the others
            if e.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        # hand the command to the warm-start server when Snakemake started one (precswitch.warm)
        from . import warm

        status = warm.delegate(sys.argv[1:])
        if status is not None:
            return status
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


if __name__ == "__main__":
    sys.exit(main())
