"""The import graph of the `tether` package (or another top-level package of this checkout, such as
`tether_lab`), read from the source (nothing is imported).

    python -m tether_lab.import_graph              # cycles between modules; exit 1 when there is one
    python -m tether_lab.import_graph --packages   # package-level edges with counts
    python -m tether_lab.import_graph --runtime    # leave out imports under `if TYPE_CHECKING:`
    python -m tether_lab.import_graph --package tether_lab   # the lab's own graph (its imports of
                                                             # `tether` are edges out, never cycles)

Every `import` counts, wherever it sits: at module level and inside a function (a lazy import is
still a dependency), and by default under `if TYPE_CHECKING:` too (a cycle hidden from the
interpreter is still a cycle for the reader). Generated protobuf code (`tether/responses`) is
left out: it imports only itself and protobuf.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "tether"
SKIP = ("tether.responses",)


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Module name -> source file, for every module of `package` under `root`."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if not name.startswith(SKIP):
            found[name] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that `name` names or lies in (`a.b.c` -> `a.b` when c is a symbol)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _walk(tree: ast.AST, type_checking: bool):
    """ast.walk, leaving out `if TYPE_CHECKING:` bodies unless `type_checking`."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if not type_checking and _is_type_checking(node):
            todo.extend(node.orelse)  # type: ignore[attr-defined]
            continue
        todo.extend(ast.iter_child_nodes(node))


def imports(name: str, path: Path, known: dict[str, Path], *, type_checking: bool = True) -> set[str]:
    """The modules of `known` that the module `name` (at `path`) imports."""
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _walk(ast.parse(path.read_text(), str(path)), type_checking):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` depends on pkg.mod; `from mod import symbol` on mod.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            dep = _resolve(target, known)
            if dep and dep != name:
                out.add(dep)
    return out


def graph(root: Path = ROOT, *, type_checking: bool = True, package: str = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports."""
    known = modules(root, package)
    return {name: imports(name, path, known, type_checking=type_checking) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def package_of(module: str, packages: set[str]) -> str:
    """`tether.core.turn` -> `tether.core`; a top-level module (`tether.cli`) -> `tether`."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or module in packages else parts[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", action="store_true", help="print package-level edges")
    parser.add_argument("--runtime", action="store_true", help="leave out `if TYPE_CHECKING:` imports")
    parser.add_argument("--package", default=PACKAGE, help=f"the top-level package to read (default: {PACKAGE})")
    args = parser.parse_args()
    edges = graph(type_checking=not args.runtime, package=args.package)
    if args.packages:
        packages = {n for n, p in modules(package=args.package).items() if p.name == "__init__.py"}
        counts: Counter[tuple[str, str]] = Counter()
        for a, deps in edges.items():
            for b in deps:
                pa, pb = package_of(a, packages), package_of(b, packages)
                if pa != pb:
                    counts[(pa, pb)] += 1
        for (a, b), n in sorted(counts.items()):
            print(f"{a} -> {b} ({n})")
    found = cycles(edges)
    for component in found:
        print("cycle:", " <-> ".join(component))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
