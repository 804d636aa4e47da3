"""The snakemake commands the docs tell users to type parse as intended.

``--configfile`` takes several files, so a target written after it (``--configfile study.yaml
fetch``) is read as a second config file and the command fails with FileNotFoundError. Every
``snakemake`` command in a bash block of README.md, config/README.md and docs/*.md is parsed with
Snakemake's own argument parser: each config file must be a YAML file and each target a rule or a
path under the study's results.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "config" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SEPARATORS = {"&&", "||", ";", "|", "&"}


def snakemake_commands(path: Path) -> list[list[str]]:
    commands = []
    text = path.read_text(encoding="utf-8")
    for block in re.findall(r"```(?:bash|sh|console)?\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            lex = shlex.shlex(line, posix=True, punctuation_chars=True)
            lex.whitespace_split = True
            try:
                tokens = list(lex)
            except ValueError:  # not shell (e.g. an output listing)
                continue
            command: list[str] = []
            for tok in [*tokens, ";"]:
                if tok in SEPARATORS:
                    if command and command[0].endswith("snakemake"):
                        commands.append(command[1:])
                    command = []
                else:
                    command.append(tok)
    return commands


CASES = [(p.relative_to(ROOT).as_posix(), args) for p in DOCS for args in snakemake_commands(p)]


def test_docs_have_snakemake_commands():
    assert len(CASES) >= 10, CASES


@pytest.mark.parametrize("doc,args", CASES, ids=[f"{d}:{' '.join(a)[:60]}" for d, a in CASES])
def test_documented_snakemake_command_parses(doc, args):
    from snakemake.cli import get_argument_parser

    parsed = get_argument_parser().parse_args(args)
    for f in parsed.configfile or []:
        assert str(f).endswith((".yaml", ".yml")), f"{doc}: `snakemake {' '.join(args)}` reads {f!s} as a config file"
    for target in parsed.targets or []:
        assert target in {"all", "fetch"} or target.startswith("results/"), (
            f"{doc}: `snakemake {' '.join(args)}`: unexpected target {target!r}")
