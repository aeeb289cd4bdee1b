"""The development tools have no import cycle of their own (read from the source by
`python -m tether_lab.import_graph --package tether_lab`), and the check reads the package it is
given rather than always `tether`."""

from __future__ import annotations

from pathlib import Path

from tether_lab import import_graph


def test_lab_import_graph_has_no_cycle() -> None:
    edges = import_graph.graph(package="tether_lab")
    assert "tether_lab.bench" in edges and "tether_lab.overhead" in edges
    assert import_graph.cycles(edges) == []


def test_the_package_option_reads_that_package(tmp_path: Path) -> None:
    pkg = tmp_path / "lab"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from lab.b import run\nimport tether.core\n")
    (pkg / "b.py").write_text("def run():\n    from lab import a\n")
    edges = import_graph.graph(tmp_path, package="lab")
    assert edges == {"lab": set(), "lab.a": {"lab.b"}, "lab.b": {"lab.a"}}
    assert import_graph.cycles(edges) == [["lab.a", "lab.b"]]
