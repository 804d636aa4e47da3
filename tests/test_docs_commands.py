"""The snakemake commands the docs tell users to type parse as intended.

``--configfile`` takes several files, so a target written after it (``--configfile study.yaml
fetch``) is read as a second config file and the command fails with FileNotFoundError. Every
``snakemake`` command in a bash block of README.md, config/README.md and docs/*.md (but the dated
docs/findings.md) is parsed with
Snakemake's own argument parser: each config file must be a YAML file and each target a rule or a
path under the study's results.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
#: docs/findings.md is left out: its dated entries quote commands as they ran at their commit
DOCS = [ROOT / "README.md", ROOT / "config" / "README.md",
        *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "findings.md")]
SEPARATORS = {"&&", "||", ";", "|", "&"}


def shell_blocks(path: Path) -> list[str]:
    """The fenced blocks of a markdown file that are shell or unlabelled (fences paired in order: a regex
    over the text would take the closing fence of a ```yaml block for the opening of a shell one)."""
    blocks, lang, lines = [], None, []
    for line in path.read_text(encoding="utf-8").splitlines():
        fence = re.match(r"\s*```(\w*)", line)
        if fence and lang is None:
            lang, lines = fence.group(1), []
        elif fence:
            if lang in ("", "bash", "sh", "console"):
                blocks.append("\n".join(lines) + "\n")
            lang = None
        elif lang is not None:
            lines.append(line)
    return blocks


def snakemake_commands(path: Path) -> list[list[str]]:
    commands = []
    for block in shell_blocks(path):
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
    study = {}
    for f in parsed.configfile or []:
        if str(f).startswith(("config/", "tests/")):  # the repository's own (my-study.yaml is the user's)
            assert (ROOT / f).is_file(), f"{doc}: `snakemake {' '.join(args)}`: no file {f}"
            study.update(yaml.safe_load((ROOT / f).read_text(encoding="utf-8")))
    if parsed.workflow_profile:
        assert (ROOT / parsed.workflow_profile / "config.yaml").is_file(), (
            f"{doc}: `snakemake {' '.join(args)}`: no profile {parsed.workflow_profile}/config.yaml")
    if parsed.report and (study or not parsed.configfile):
        results_dir = study.get("results_dir", "results")
        assert str(parsed.report).startswith(results_dir + "/"), (
            f"{doc}: `snakemake {' '.join(args)}`: the report belongs in the study's results_dir {results_dir}/")


def script_commands(path: Path) -> list[tuple[str, list[str]]]:
    """`python benchmarks/x.py ...`, `benchmarks/gpu_check ...`, `bash benchmarks/x.sh`, `python -m module`
    as the docs write them, in shell blocks or inline code: (script or -m module, arguments)."""
    text = path.read_text(encoding="utf-8")
    lines = [line for block in shell_blocks(path) for line in block.replace("\\\n", " ").splitlines()]
    lines += re.findall(r"`([^`\n]*(?:python|benchmarks/)[^`\n]*)`", text)
    found = []
    for line in lines:
        for m in re.finditer(r"(?:^|\s)(?:\S*python3?\s+-m\s+(precswitch[\w.]*)|(benchmarks/\w+(?:\.py|\.sh)|benchmarks/gpu_check))"
                             r"(?=\s|$)([^#]*)", line):
            args = []
            for tok in shlex.split(m.group(3)):
                if tok in SEPARATORS:
                    break
                args.append(tok)
            found.append((f"-m{m.group(1)}" if m.group(1) else m.group(2), args))
    return found


SCRIPTS = [(p.relative_to(ROOT).as_posix(), s, a) for p in DOCS for s, a in script_commands(p)]


def test_docs_have_script_commands():
    assert len(SCRIPTS) >= 8, SCRIPTS


@pytest.mark.parametrize("doc,script,args", SCRIPTS, ids=[f"{d}:{s}" for d, s, _ in SCRIPTS])
def test_documented_script_exists_and_takes_its_options(doc, script, args):
    """The script (or module) exists, and every --option the docs give it is one its parser defines."""
    if script.startswith("-m"):
        module = script[2:]
        spec = importlib.util.find_spec(module)
        assert spec and spec.origin, f"{doc}: no module {module}"
        source = Path(spec.origin).read_text(encoding="utf-8")
    else:
        assert (ROOT / script).is_file(), f"{doc}: no script {script}"
        source = (ROOT / script).read_text(encoding="utf-8")
        if not script.endswith(".py") and (ROOT / (script + ".py")).is_file():  # benchmarks/gpu_check wraps gpu_check.py
            source += (ROOT / (script + ".py")).read_text(encoding="utf-8")
    for opt in (a.split("=")[0] for a in args if a.startswith("--")):
        assert f'"{opt}"' in source, f"{doc}: `{script} {' '.join(args)}`: {script} has no option {opt}"


def _options(parser) -> set[str]:
    """Every option string of ``parser`` and of its sub-commands' parsers."""
    import argparse

    opts = set()
    for action in parser._actions:
        opts |= set(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                opts |= _options(sub)
    return opts


def test_precswitch_commands_in_the_docs_use_options_that_exist():
    """`precswitch <command> --option ...` as the docs write it (inline or in a block; continuation lines
    indented): each option is one the command's parser has."""
    import argparse

    from precswitch.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    seen = 0
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in re.finditer(r"\bprecswitch (\w+)((?:[^`\n]*)(?:\n {8,}[^`\n]*)*)", text):
            name, rest = m.groups()
            if name not in commands:
                continue
            seen += 1
            for opt in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest):
                assert opt in _options(commands[name]), (
                    f"{doc.relative_to(ROOT)}: `precswitch {name}` has no option {opt} "
                    f"(it has {sorted(_options(commands[name]))})")
    assert seen >= 10
