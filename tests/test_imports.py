"""The package has no import circles (benchmarks/code_size.py finds them; issue 29)."""

from __future__ import annotations

from pathlib import Path

from bench_helpers import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def _code_size():
    return load_benchmark("code_size")


def test_src_has_no_import_circles():
    cs = _code_size()
    assert cs.import_circles(cs.import_graph(ROOT / "src")) == []


def test_a_lazy_import_circle_through_a_subpackage_is_found(tmp_path):
    cs = _code_size()
    pkg = tmp_path / "precswitch"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import c\n")
    (pkg / "c.py").write_text("import precswitch.a\n")
    (pkg / "d.py").write_text("from . import a\n")  # imports into the circle, not part of it
    assert cs.import_circles(cs.import_graph(tmp_path)) == [["precswitch.a", "precswitch.c", "precswitch.sub.b"]]
