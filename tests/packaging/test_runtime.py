"""The runtime package stands on its own: `tether serve` runs without any extra installed, the
runtime never imports the development tools, a missing extra names the `pip install` that brings
it, and the runtime's import graph has no cycle."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from tether.extras import MissingExtra, require
from tether_lab import import_graph
from tether_lab.load import write_config
from tether_lab.processes import ServerProcess

# Every package an extra brings (pyproject.toml), made unimportable in a child process.
EXTRA_MODULES = ("openai", "matplotlib", "tqdm", "asyncpg", "redis", "opentelemetry")
BLOCK = f"import sys\nfor _m in {EXTRA_MODULES!r}:\n    sys.modules[_m] = None\n"
NO_TOOLS = BLOCK + "sys.modules['tether_lab'] = None\n"


def test_serve_runs_without_any_extra(tmp_path: Path) -> None:
    config = write_config(tmp_path / "tether.toml", store=f"sqlite:///{tmp_path}/tether.db")
    with ServerProcess(config, tmp_path, prelude=NO_TOOLS) as server:
        body = {"model": "tether-sim", "input": "hello", "store": True}
        created = httpx.post(f"{server.api_url}/responses", json=body, timeout=30)
        assert created.status_code == 200, created.text
        assert created.json()["status"] == "completed"
        fetched = httpx.get(f"{server.api_url}/responses/{created.json()['id']}", timeout=30)
        assert fetched.status_code == 200
        assert server.terminate(30) == 0, server.log_text()[-2000:]


def test_a_store_whose_extra_is_missing_names_the_pip_install(tmp_path: Path) -> None:
    code = BLOCK + textwrap.dedent("""
        from tether.store.factory import create_store
        try:
            create_store("postgresql://127.0.0.1:1/none")
        except ImportError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'tether[postgres]'" in out.stdout, out.stdout + out.stderr


def test_bench_without_the_lab_extra_says_which_pip_install_to_run() -> None:
    code = BLOCK + "from tether.cli import main\nsys.exit(main(['bench', '--help']))\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "pip install 'tether[lab]'" in out.stderr, out.stderr


def test_require_blames_only_a_missing_optional_package() -> None:
    with pytest.raises(MissingExtra, match=r"pip install 'tether\[redis\]'") as caught:
        require("a_package_that_is_not_installed", "redis")
    assert caught.value.extra == "redis"
    # A module missing inside Tether is a bug, not a missing extra.
    with pytest.raises(ModuleNotFoundError) as bug:
        require("tether.no_such_module", "redis")
    assert not isinstance(bug.value, MissingExtra)


def test_the_runtime_never_imports_the_tools() -> None:
    sources = {m: p.read_text(encoding="utf-8") for m, p in import_graph.modules().items()}
    assert len(sources) > 50  # the runtime was read
    offenders = [m for m, text in sources.items() if "from tether_lab" in text or "import tether_lab" in text]
    assert offenders == []


def test_runtime_import_graph_has_no_cycle() -> None:
    assert import_graph.cycles(import_graph.graph(type_checking=False)) == []


def test_the_cycle_check_finds_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "tether"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from tether.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tether.c import C\n")
    (pkg / "c.py").write_text("def f():\n    from tether import a\n")
    strict = import_graph.cycles(import_graph.graph(tmp_path))
    assert strict == [["tether.a", "tether.c", "tether.sub.b"]]
    assert import_graph.cycles(import_graph.graph(tmp_path, type_checking=False)) == []
