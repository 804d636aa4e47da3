#!/usr/bin/env python
"""The house's size: lines of code per top-level folder, the longest functions, and import circles in src/.

    python benchmarks/code_size.py [--top 5] [ROOT]

Lines are the lines (as wc -l counts them, and the non-blank ones) of .py, .smk, Snakefile and .sh files (comments and docstrings count: they are
read too). A function's length is its span in lines (decorators excluded). An import circle is a set of
src/precswitch modules that import each other, directly or through others (imports inside functions count:
a lazy import still ties the two modules together). tests/test_imports.py asserts there are none.
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from pathlib import Path

CODE_SUFFIXES = {".py", ".smk", ".sh"}
FOLDERS = ("src", "workflow", "benchmarks", "tests")


def code_files(root: Path, folder: str) -> list[Path]:
    base = root / folder
    files = [p for p in base.rglob("*") if p.is_file() and (p.suffix in CODE_SUFFIXES or p.name == "Snakefile")]
    return sorted(p for p in files if "__pycache__" not in p.parts)


def count_lines(path: Path) -> tuple[int, int]:
    """(all lines, non-blank lines)."""
    lines = path.read_text(errors="replace").splitlines()
    return len(lines), sum(1 for line in lines if line.strip())


def functions(path: Path) -> list[tuple[int, str]]:
    """(length in lines, qualified name) of every function in a Python file."""
    tree = ast.parse(path.read_text(), str(path))
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((child.end_lineno - child.lineno + 1, f"{prefix}{child.name}"))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return out


def module_name(src: Path, path: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def import_graph(src: Path, package: str = "precswitch") -> dict[str, set[str]]:
    """module -> the package's modules it imports (anywhere in the file)."""
    modules = {module_name(src, p): p for p in (src / package).rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        here = mod.split(".") if is_pkg else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here[: len(here) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for t in targets:
                # the module itself, or the longest known module that contains the imported name
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != mod and t != package:
                    graph[mod].add(t)
        graph.setdefault(mod, set())
    return dict(graph)


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--top", type=int, default=5, help="how many of the longest functions to list")
    args = ap.parse_args()
    root = Path(args.root)
    print(f"{'folder':<12} {'files':>6} {'lines':>8} {'non-blank':>10}")
    total = [0, 0]
    for folder in FOLDERS + ("Snakefile",):
        files = [root / folder] if folder == "Snakefile" else code_files(root, folder)
        files = [f for f in files if f.exists()]
        counts = [count_lines(f) for f in files]
        n, nb = sum(c[0] for c in counts), sum(c[1] for c in counts)
        total = [total[0] + n, total[1] + nb]
        print(f"{folder:<12} {len(files):>6} {n:>8} {nb:>10}")
    print(f"{'total':<12} {'':>6} {total[0]:>8} {total[1]:>10}")
    code = [f for folder in ("src", "workflow", "benchmarks") for f in code_files(root, folder) if f.suffix == ".py"]
    longest = sorted(((n, f"{f.relative_to(root)}:{name}") for f in code for n, name in functions(f)), reverse=True)
    print(f"\nlongest functions (src, workflow, benchmarks):")
    for n, name in longest[: args.top]:
        print(f"  {n:>5}  {name}")
    circles = import_circles(import_graph(root / "src"))
    print(f"\nimport circles in src/: {len(circles)}")
    for c in circles:
        print("  " + " <-> ".join(c))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
