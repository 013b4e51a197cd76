"""The backend registry: lazy loading, registration, entry points and the kill switch."""

from __future__ import annotations

import importlib.metadata
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import pgsnap.backends as backends
from pgsnap.backends import BackendRegistry
from pgsnap.backends.mock import MockBackend
from pgsnap.errors import BackendNotFound, ConfigurationError

ROOT = Path(__file__).resolve().parents[2]


class FakeEntryPoint:
    """Enough of importlib.metadata.EntryPoint for the registry."""

    def __init__(self, name: str, value: str) -> None:
        self.name = name
        self.value = value


@pytest.fixture
def entry_points(monkeypatch: pytest.MonkeyPatch) -> list[FakeEntryPoint]:
    """Replace the installed entry points with a list the test fills."""
    declared: list[FakeEntryPoint] = []
    seen_groups: list[str] = []

    def fake(*, group: str) -> list[FakeEntryPoint]:
        seen_groups.append(group)
        return [ep for ep in declared if group == "pgsnap.backends"]

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    monkeypatch.delenv("PGSNAP_NO_PLUGINS", raising=False)
    return declared


@pytest.fixture
def plugin_module(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A fake third-party module holding a backend class (imported by name)."""
    module = ModuleType("acme_pgsnap_fake")

    class AcmeBackend(MockBackend):
        def __init__(self, *, url: str = "https://lab", **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.url = url

    AcmeBackend.__module__ = module.__name__
    module.AcmeBackend = AcmeBackend  # type: ignore[attr-defined]
    module.not_a_class = 42  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_importing_the_registry_imports_no_backend() -> None:
    result = _run(
        """
        import sys
        import pgsnap.backends as b
        assert "pgsnap.backends.mock" not in sys.modules, "mock imported at import time"
        names = b.registered_backends()
        assert "pgsnap.backends.mock" not in sys.modules, "listing names imported the mock"
        assert "pgsnap.backends.btrfs" not in sys.modules, "listing names imported btrfs"
        assert "pgsnap.backends.lvm" not in sys.modules, "listing names imported lvm"
        assert "pgsnap.backends.powerflex" not in sys.modules, "listing imported powerflex"
        cls = b.backend_class("mock")
        assert "pgsnap.backends.mock" in sys.modules
        assert "pgsnap.backends.btrfs" not in sys.modules
        assert "pgsnap.backends.powerflex" not in sys.modules
        assert "requests" not in sys.modules
        print(cls.__name__, dict(names))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "MockBackend {'btrfs': 'pgsnap.backends.btrfs:BtrfsBackend', "
        "'lvm': 'pgsnap.backends.lvm:LvmBackend', "
        "'mock': 'pgsnap.backends.mock:MockBackend', "
        "'powerflex': 'pgsnap.backends.powerflex:PowerFlexBackend'"
    )


def test_importing_pgsnap_imports_no_pytest_nor_conformance() -> None:
    result = _run(
        """
        import sys
        import pgsnap, pgsnap.backends, pgsnap.testing
        bad = [m for m in ("pytest", "pgsnap.testing.conformance", "pgsnap.backends.mock")
               if m in sys.modules]
        assert not bad, bad
        """
    )
    assert result.returncode == 0, result.stderr


def test_builtin_mock_by_name(entry_points: list[FakeEntryPoint]) -> None:
    registry = BackendRegistry()
    assert registry.backend_class("mock") is MockBackend
    backend = registry.create("mock")
    assert isinstance(backend, MockBackend)
    assert registry.names() == ("btrfs", "lvm", "mock", "powerflex")


def test_module_functions_use_the_default_registry() -> None:
    assert backends.default_registry() is backends.default_registry()
    assert backends.backend_class("mock") is MockBackend
    assert isinstance(backends.create_backend("mock"), MockBackend)
    names = backends.registered_backends()
    assert names["mock"] == "pgsnap.backends.mock:MockBackend"
    with pytest.raises(TypeError):
        names["x"] = "y"  # type: ignore[index]


def test_unknown_name_lists_the_available_ones(entry_points: list[FakeEntryPoint]) -> None:
    registry = BackendRegistry()
    registry.register("extra", MockBackend)
    with pytest.raises(BackendNotFound) as info:
        registry.backend_class("powerflx")
    err = info.value
    assert isinstance(err, LookupError)
    assert isinstance(err, ConfigurationError)
    assert err.details["available"] == ("btrfs", "extra", "lvm", "mock", "powerflex")
    assert "available: btrfs, extra, lvm, mock, powerflex" in str(err)
    copy = pickle.loads(pickle.dumps(err))
    assert (type(copy), str(copy), copy.details["available"]) == (
        BackendNotFound,
        str(err),
        err.details["available"],
    )


def _count_entry_point_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The groups of every read of the entry points from now on (as they are made)."""
    calls: list[str] = []
    fake = importlib.metadata.entry_points

    def counting(*, group: str) -> Any:
        calls.append(group)
        return fake(group=group)

    monkeypatch.setattr(importlib.metadata, "entry_points", counting)
    return calls


def test_a_name_is_checked_without_importing_its_plugin(
    entry_points: list[FakeEntryPoint], plugin_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``target()`` answers what a name is registered as, importing nothing and reading
    no entry points for a built-in name; an unknown name gets load()'s error."""
    calls = _count_entry_point_reads(monkeypatch)
    monkeypatch.delitem(sys.modules, "pgsnap.backends.powerflex", raising=False)
    registry = BackendRegistry()
    assert registry.target("powerflex") == "pgsnap.backends.powerflex:PowerFlexBackend"
    assert "pgsnap.backends.powerflex" not in sys.modules
    assert calls == []
    entry_points.append(FakeEntryPoint("acme", "acme_pgsnap_fake:AcmeBackend"))
    assert registry.target("acme") == "acme_pgsnap_fake:AcmeBackend"
    assert calls == ["pgsnap.backends"]
    assert registry.target("mock") == "pgsnap.backends.mock:MockBackend"
    with pytest.raises(BackendNotFound) as info:
        registry.target("powerflx")
    assert info.value.details["available"] == ("acme", "btrfs", "lvm", "mock", "powerflex")


def test_register_class_and_string(
    entry_points: list[FakeEntryPoint], plugin_module: ModuleType
) -> None:
    registry = BackendRegistry()
    registry.register("acme", "acme_pgsnap_fake:AcmeBackend")
    registry.register("mock2", MockBackend)
    assert registry.targets() == {
        "acme": "acme_pgsnap_fake:AcmeBackend",
        "btrfs": "pgsnap.backends.btrfs:BtrfsBackend",
        "lvm": "pgsnap.backends.lvm:LvmBackend",
        "mock": "pgsnap.backends.mock:MockBackend",
        "mock2": "pgsnap.backends.mock:MockBackend",
        "powerflex": "pgsnap.backends.powerflex:PowerFlexBackend",
    }
    backend = registry.create("acme", url="https://other")
    assert backend.url == "https://other"  # type: ignore[attr-defined]
    assert registry.backend_class("mock2") is MockBackend
    # Taken names need replace=True.
    with pytest.raises(ConfigurationError, match="already registered"):
        registry.register("acme", MockBackend)
    with pytest.raises(ConfigurationError, match="already registered"):
        registry.register("mock", MockBackend)
    registry.register("acme", MockBackend, replace=True)
    assert registry.backend_class("acme") is MockBackend
    registry.unregister("acme")
    with pytest.raises(BackendNotFound):
        registry.backend_class("acme")
    with pytest.raises(BackendNotFound):
        registry.unregister("mock")  # built-ins cannot be unregistered


@pytest.mark.parametrize(
    ("name", "target", "match"),
    [
        ("Bad Name", "x:Y", "invalid storage backend name"),
        ("ok", "no_colon", "invalid storage backend target"),
        ("ok", MockBackend(), "must be a class"),
    ],
)
def test_register_refuses_bad_input(name: str, target: Any, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        BackendRegistry(plugins=False).register(name, target)


def test_loading_errors_are_configuration_errors(
    entry_points: list[FakeEntryPoint], plugin_module: ModuleType
) -> None:
    registry = BackendRegistry()
    registry.register("gone", "no_such_module_pgsnap:Backend")
    registry.register("typo", "acme_pgsnap_fake:AcmeBackendd")
    registry.register("value", "acme_pgsnap_fake:not_a_class")
    registry.register("plain", object)
    for name, match in [
        ("gone", "could not be loaded"),
        ("typo", "has no attribute"),
        ("value", "not a class"),
        ("plain", "does not implement StorageBackend"),
    ]:
        with pytest.raises(ConfigurationError, match=match) as info:
            registry.backend_class(name)
        assert not isinstance(info.value, BackendNotFound)


def test_create_refuses_unknown_options(entry_points: list[FakeEntryPoint]) -> None:
    with pytest.raises(ConfigurationError, match="does not accept") as info:
        BackendRegistry().create("mock", colour="blue")
    assert info.value.details["options"] == ("colour",)
    assert isinstance(info.value.__cause__, TypeError)


def test_entry_points_are_read_only_when_asked(
    entry_points: list[FakeEntryPoint], plugin_module: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_entry_point_reads(monkeypatch)
    registry = BackendRegistry()
    assert calls == []  # creating a registry reads nothing
    entry_points.append(FakeEntryPoint("acme", "acme_pgsnap_fake:AcmeBackend"))
    entry_points.append(FakeEntryPoint("mock", "acme_pgsnap_fake:AcmeBackend"))
    assert registry.names() == ("acme", "btrfs", "lvm", "mock", "powerflex")
    assert calls == ["pgsnap.backends"]
    assert registry.backend_class("acme") is plugin_module.AcmeBackend
    assert registry.backend_class("mock") is MockBackend  # a built-in wins over a plugin
    registry.register("acme", MockBackend, replace=True)  # run time wins over a plugin
    assert registry.backend_class("acme") is MockBackend


def test_duplicate_entry_points_keep_the_first(
    entry_points: list[FakeEntryPoint], plugin_module: ModuleType
) -> None:
    entry_points.append(FakeEntryPoint("acme", "acme_pgsnap_fake:AcmeBackend"))
    entry_points.append(FakeEntryPoint("acme", "pgsnap.backends.mock:MockBackend"))
    assert BackendRegistry().backend_class("acme") is plugin_module.AcmeBackend


@pytest.mark.parametrize("value", ["1", "true", "yes"])
def test_kill_switch_ignores_entry_points(
    entry_points: list[FakeEntryPoint],
    plugin_module: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    value: str,
) -> None:
    entry_points.append(FakeEntryPoint("acme", "acme_pgsnap_fake:AcmeBackend"))
    monkeypatch.setenv("PGSNAP_NO_PLUGINS", value)
    registry = BackendRegistry()
    assert registry.names() == ("btrfs", "lvm", "mock", "powerflex")
    with pytest.raises(BackendNotFound) as info:
        registry.backend_class("acme")
    assert info.value.hint is not None
    assert "PGSNAP_NO_PLUGINS" in info.value.hint
    monkeypatch.setenv("PGSNAP_NO_PLUGINS", "0")
    assert registry.backend_class("acme") is plugin_module.AcmeBackend


def test_plugins_false_ignores_entry_points(
    entry_points: list[FakeEntryPoint], plugin_module: ModuleType
) -> None:
    entry_points.append(FakeEntryPoint("acme", "acme_pgsnap_fake:AcmeBackend"))
    registry = BackendRegistry(plugins=False, builtins={})
    assert registry.names() == ()
    assert "plugins=off" in repr(registry)


def test_registries_are_independent(entry_points: list[FakeEntryPoint]) -> None:
    one, two = BackendRegistry(), BackendRegistry()
    one.register("only-one", MockBackend)
    assert "only-one" in one.names()
    assert "only-one" not in two.names()
    assert "only-one" not in backends.registered_backends()
