"""Library manners: cheap import, documented public names, no print."""

import ast
import importlib
import inspect
import pathlib
import pkgutil
import subprocess
import sys

import pytest

import pgsnap

PACKAGE = pathlib.Path(pgsnap.__file__).parent


def test_import_does_not_load_drivers():
    code = (
        "import sys, pgsnap, pgsnap.model, pgsnap.wal, pgsnap.backends, pgsnap.cluster, "
        "pgsnap.plan, pgsnap.executor, pgsnap.cli; "
        "print(sorted(m for m in ('psycopg', 'requests', 'pgsnap.backends.mock') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


MOVED = {
    "pgsnap.walreader": "pgsnap.wal.reader",
    "pgsnap.walindex": "pgsnap.wal.contents",
    "pgsnap.waldump": "pgsnap.wal.dump",
    "pgsnap.archive": "pgsnap.wal.archive",
    "pgsnap.session": "pgsnap.cluster",
    "pgsnap.journal": "pgsnap._journal",
    "pgsnap.registry": "pgsnap._registry",
    "pgsnap.demo": "pgsnap._demo",
    "pgsnap.copies.s3http": "pgsnap.stores.s3http",
}

SPLIT = {"pgsnap.checks": ("pgsnap.planner.checks", "pgsnap.observe")}
"""Old modules whose names went to more than one new one."""
"""Old module paths that still import, with a DeprecationWarning, for one release."""


REPLACED = {"pgsnap.backends.mock_host": "pgsnap.host.simulated"}
"""Old modules whose class became a more general one (a thin subclass, deprecated)."""


def _modules():
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="pgsnap."):
        if info.name not in MOVED and info.name not in SPLIT and info.name not in REPLACED:
            yield importlib.import_module(info.name)


def test_moved_modules_still_import_with_a_deprecation_warning():
    for old, new in MOVED.items():
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
            alias = importlib.import_module(old)
        moved = importlib.import_module(new)
        assert alias.__all__ == moved.__all__
        for name in moved.__all__:
            assert getattr(alias, name) is getattr(moved, name), (old, name)


def test_every_public_name_is_documented():
    undocumented = []
    for mod in _modules():
        if not mod.__doc__:
            undocumented.append(mod.__name__)
        for name in getattr(mod, "__all__", ()):
            obj = getattr(mod, name)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and not obj.__doc__:
                undocumented.append(f"{mod.__name__}.{name}")
            if inspect.isclass(obj) and obj.__module__ == mod.__name__:
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or not inspect.isfunction(member):
                        continue
                    # An override is documented by the method it overrides (its contract).
                    if not inspect.getdoc(getattr(obj, attr)):
                        undocumented.append(f"{mod.__name__}.{name}.{attr}")
    assert undocumented == []


def test_no_print_outside_the_cli():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "cli.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == []


def test_readme_example_names_exist():
    """The README's Python example imports and calls names that exist."""
    readme = (PACKAGE.parent / "README.md").read_text()
    code = readme.split("```python", 1)[1].split("```", 1)[0]
    tree = ast.parse(code)
    namespace: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom | ast.Import):
            exec(compile(ast.Module([node], []), "README", "exec"), namespace)
    from pgsnap.cluster import Cluster

    for attr in ("check", "backup", "plan_recovery", "execute"):
        assert attr in code
        assert callable(getattr(Cluster, attr))
    first_commands = [b.split("```", 1)[0].strip() for b in readme.split("```sh")[1:3]]
    assert first_commands[0].endswith("pgsnap demo")
    assert "pytest" in first_commands[1]


def test_the_working_set_is_offered_lazily_by_import_pgsnap():
    import pgsnap.errors

    code = (
        "import sys, pgsnap; before = sorted(m for m in sys.modules if m.startswith('pgsnap')); "
        "c = pgsnap.Cluster; e = pgsnap.WalGapError; p = pgsnap.Plan; h = pgsnap.SshRunner; "
        "print(before, 'pgsnap.cluster' in sys.modules, 'psycopg' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['pgsnap', 'pgsnap._version', 'pgsnap.errors'] True False"
    assert set(pgsnap.__all__) == {*pgsnap._WHERE, "__version__"}
    assert set(pgsnap.errors.__all__) <= set(pgsnap.__all__)  # every error is offered
    for name in pgsnap.__all__:
        assert getattr(pgsnap, name) is not None
    assert sorted(dir(pgsnap)) == sorted(pgsnap.__all__)


def test_runtime_dependencies_are_what_the_runtime_imports():
    """pyproject's dependencies are exactly the third-party modules pgsnap imports
    (pgsnap.testing, which tests use, may import pytest as well)."""
    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    declared = {
        d.split("[")[0].split(">")[0].split("=")[0].strip().lower() for d in project["dependencies"]
    }
    imported = set()
    for path in PACKAGE.rglob("*.py"):
        if "testing" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m not in sys.stdlib_module_names and m != "pgsnap"}
    # Optional accelerators (extras, imported under try/except ImportError) and the
    # optional backends' libraries (imported lazily inside the backend) beside them.
    optional = {
        d.split(">")[0].split("=")[0].strip().lower()
        for extra in ("fast", "powerflex")
        for d in project["optional-dependencies"][extra]
    }
    assert third_party - optional == declared
    assert optional <= third_party  # an extra nothing uses is a stale extra


def test_split_modules_still_import_with_a_deprecation_warning():
    for old, news in SPLIT.items():
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=f"{old} moved"):
            alias = importlib.import_module(old)
        for name in alias.__all__:
            homes = [m for m in map(importlib.import_module, news) if hasattr(m, name)]
            assert homes and getattr(alias, name) is getattr(homes[0], name), (old, name)


def test_the_mock_host_is_the_shared_simulated_host_under_its_old_name():
    """Issue 20: the mock's and the PowerFlex simulator's hosts were two copies of one
    mount simulation; both are now :class:`pgsnap.host.simulated.SimulatedHost`."""
    from pgsnap.backends.mock import MockBackend
    from pgsnap.host.simulated import SimulatedHost

    sys.modules.pop("pgsnap.backends.mock_host", None)
    with pytest.warns(DeprecationWarning, match="pgsnap.backends.mock_host moved to"):
        alias = importlib.import_module("pgsnap.backends.mock_host")
    backend = MockBackend(block=True)
    host = alias.MockHost(backend)
    assert isinstance(host, SimulatedHost) and host.devices is backend.devices


def test_operations_renamed_as_operations_keep_their_old_names_for_a_release():
    """Issue 20: operation classes were named like the records they make
    (``SnapshotGroup``, ``Mount``, ``BackupStart``; ``Verify`` twice). The old names
    still work, with a DeprecationWarning; plans and journals name actions, not
    classes, so they are unchanged."""
    from pgsnap.operations import BUILTIN_OPERATIONS, db, host, storage

    for module in (db, host, storage):
        for old, new in module._RENAMED.items():
            with pytest.warns(DeprecationWarning, match=f"{old} is now {new}"):
                assert getattr(module, old) is getattr(module, new)
            assert old not in module.__all__ and new in module.__all__
            assert f"{module.__name__}:{new}" in BUILTIN_OPERATIONS.values()
    with pytest.raises(AttributeError):
        db.NoSuchOperation  # noqa: B018
