"""The layers of pgsnap hold: no import runs up a layer, and no imports go round.

Imports are read from the source (every ``import`` and ``from ... import``, at
module level or inside a function: a lazy import couples as much as any
other). Imports under ``if TYPE_CHECKING:`` are left out: they never run and
cannot make an import cycle at run time. docs/architecture.md draws the same
layers.
"""

from __future__ import annotations

import ast
import collections
import pathlib
from collections.abc import Iterator

import pgsnap

PACKAGE = pathlib.Path(pgsnap.__file__).parent

LAYERS: tuple[tuple[str, ...], ...] = (
    ("pgsnap.__main__",),  # python -m pgsnap
    ("pgsnap._entry",),  # the command: wal-push/wal-get lean, the rest to the CLI
    ("pgsnap.cli",),
    ("pgsnap._demo",),
    ("pgsnap.testing",),  # simulators, throwaway servers, the conformance suite
    ("pgsnap",),  # the lazy face: its imports of the layers below are type-only
    ("pgsnap.cluster", "pgsnap.fleet"),  # Cluster: observe, plan, execute; many of them
    ("pgsnap.observe", "pgsnap.config", "pgsnap.clones", "pgsnap.progress"),
    ("pgsnap.planner", "pgsnap.executor", "pgsnap.timeline"),
    ("pgsnap.plan",),
    (
        "pgsnap.operations",
        "pgsnap.adapters",
        "pgsnap.backends",
        "pgsnap.catalog",
        "pgsnap.archives",  # WAL archives over object stores and other tools' repositories
    ),
    ("pgsnap.protocols",),
    (
        "pgsnap.wal",
        "pgsnap.copies",
        "pgsnap.host",
        "pgsnap._journal",
        "pgsnap.locks",
        "pgsnap._registry",
        "pgsnap.agent",  # commands run in forks of a process that imported pgsnap once
    ),
    ("pgsnap.stores",),  # object stores: a directory, an S3 bucket
    ("pgsnap.model",),
    ("pgsnap.errors", "pgsnap._version", "pgsnap._moved", "pgsnap._argv", "pgsnap._attrs"),
)
"""Top to bottom. A component (a top-level module or subpackage of pgsnap) imports
only components of the layers below its own; those of one layer do not import
each other."""

MOVED = (
    "pgsnap.walreader",
    "pgsnap.walindex",
    "pgsnap.waldump",
    "pgsnap.archive",
    "pgsnap.session",
    "pgsnap.checks",
    "pgsnap.journal",
    "pgsnap.registry",
    "pgsnap.demo",
)
"""Deprecated aliases of moved modules (tests/unit/test_package.py): outside the layers."""


def _name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_only(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines |= {n.lineno for n in ast.walk(sub) if hasattr(n, "lineno")}
    return lines


def imports() -> Iterator[tuple[str, str, int]]:
    """``(importer, imported, line)`` for every run-time import of a pgsnap module."""
    modules = {_name(p): p for p in PACKAGE.rglob("*.py")}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_only(tree)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                targets = [module, *(f"{module}.{a.name}" for a in node.names)]
            else:
                continue
            for target in targets:
                if target in modules and target != name:
                    yield name, target, node.lineno


def component(module: str) -> str:
    """The top-level module or subpackage ``module`` belongs to."""
    return ".".join(module.split(".")[:2])


def test_every_component_has_a_layer() -> None:
    placed = {c for layer in LAYERS for c in layer}
    found = {component(_name(p)) for p in PACKAGE.rglob("*.py")} - set(MOVED)
    assert found - placed == set(), "add the new component to LAYERS (and the drawing)"
    assert placed - found == set(), "a component in LAYERS no longer exists"


def test_no_import_runs_up_or_across_a_layer() -> None:
    level = {c: n for n, layer in enumerate(LAYERS) for c in layer}
    wrong = []
    for importer, imported, line in imports():
        a, b = component(importer), component(imported)
        if a == b or a in MOVED:
            continue
        if level[b] <= level[a]:
            wrong.append(f"{importer}:{line} imports {imported}")
    assert wrong == []


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = collections.defaultdict(set)
    for importer, imported, _line in imports():
        graph[importer].add(imported)
    cycles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    assert cycles == []
