"""The conformance suite run against the mock backend, in three set-ups.

- in-memory volumes with every capability;
- directory-backed volumes (a real file tree is copied and restored), in
  memory and with a state file (persisted across instances and processes);
- a mock with no capability at all, which proves the capability skips and the
  UnsupportedCapability checks of the suite work.

The last tests run the suite against deliberately broken backends (with
pytester) to prove that it fails them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from pgsnap.backends.mock import MockBackend
from pgsnap.testing.conformance import (
    MakePolicy,
    MakeVolume,
    ReadMarker,
    StorageBackendConformance,
    WriteMarker,
)

pytest_plugins = ("pytester",)

MARKER = "marker"


class MemoryFixtures:
    """Fixtures for in-memory mock volumes."""

    @pytest.fixture
    def make_volume(self, backend: MockBackend) -> MakeVolume:
        return lambda name: backend.add_volume(name).id

    @pytest.fixture
    def write_marker(self, backend: MockBackend) -> WriteMarker:
        return lambda volume_id, data: backend.write_blob(volume_id, MARKER, data)

    @pytest.fixture
    def read_marker(self, backend: MockBackend) -> ReadMarker:
        return lambda volume_id: backend.read_blob(volume_id, MARKER)

    @pytest.fixture
    def make_policy(self, backend: MockBackend) -> MakePolicy:
        def make(name: str, volume_ids: Sequence[str]) -> str:
            return backend.add_policy(name, volume_ids).id

        return make


class TestMockMemoryConformance(MemoryFixtures, StorageBackendConformance):
    """Every capability, in-memory volumes."""

    @pytest.fixture
    def backend(self) -> Iterator[MockBackend]:
        with MockBackend() as backend:
            yield backend


class TestMockDirectoryConformance(MemoryFixtures, StorageBackendConformance):
    """Every capability, directory-backed volumes: markers are files in the directory."""

    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[MockBackend]:
        with MockBackend(root=tmp_path / "root") as backend:
            yield backend

    @pytest.fixture
    def make_volume(self, backend: MockBackend, tmp_path: Path) -> MakeVolume:
        def make(name: str) -> str:
            directory = tmp_path / "volumes" / f"{name}-{len(backend.list_volumes())}"
            directory.mkdir(parents=True)
            (directory / "sub").mkdir()
            (directory / "sub" / "file").write_text("constant")
            return backend.add_volume(name, path=directory).id

        return make

    @pytest.fixture
    def write_marker(self, backend: MockBackend) -> WriteMarker:
        def write(volume_id: str, data: bytes) -> None:
            path = backend.get_volume(volume_id).path
            assert path is not None
            # A new file name each time as well, to check that restore removes files.
            for old in Path(path).glob("marker*"):
                old.unlink()
            (Path(path) / MARKER).write_bytes(data)
            (Path(path) / f"marker-{data.hex()}").touch()

        return write

    @pytest.fixture
    def read_marker(self, backend: MockBackend) -> ReadMarker:
        def read(volume_id: str) -> bytes:
            path = backend.get_volume(volume_id).path
            assert path is not None
            data = (Path(path) / MARKER).read_bytes()
            names = sorted(p.name for p in Path(path).glob("marker*"))
            assert names == sorted([MARKER, f"marker-{data.hex()}"]), names
            return data

        return read


class TestMockPersistentConformance(TestMockDirectoryConformance):
    """Directory volumes with a state file: every call reloads and saves the JSON state."""

    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[MockBackend]:
        with MockBackend(state_file=tmp_path / "state.json", root=tmp_path / "root") as backend:
            yield backend


class TestMockReducedConformance(MemoryFixtures, StorageBackendConformance):
    """No capability at all: the suite must skip and check refusals instead."""

    @pytest.fixture
    def backend(self) -> MockBackend:
        return MockBackend(capabilities=())


# --------------------------------------------------------------------------- the suite has teeth

_HARNESS = """
import pytest
from pgsnap.backends.mock import MockBackend
from pgsnap.protocols import Capability
from pgsnap.testing.conformance import StorageBackendConformance

class Fixtures:
    @pytest.fixture
    def make_volume(self, backend):
        return lambda name: backend.add_volume(name).id
    @pytest.fixture
    def write_marker(self, backend):
        return lambda v, data: backend.write_blob(v, "m", data)
    @pytest.fixture
    def read_marker(self, backend):
        return lambda v: backend.read_blob(v, "m")
"""


_BROKEN = """
class Liar(MockBackend):
    "Claims no MAPPING but maps anyway."
    @property
    def capabilities(self):
        return super().capabilities - {Capability.MAPPING}

class TestLiar(Fixtures, StorageBackendConformance):
    @pytest.fixture
    def backend(self):
        return Liar()

class Lazy(MockBackend):
    "Restore does nothing."
    def restore_volume(self, volume_id, snapshot_id):
        self.get_volume(volume_id)

class TestLazy(Fixtures, StorageBackendConformance):
    @pytest.fixture
    def backend(self):
        return Lazy()

class Leaky(MockBackend):
    "Leaks a KeyError for an unknown volume."
    def get_volume(self, volume_id):
        if volume_id not in {v.id for v in self.list_volumes()}:
            raise KeyError(volume_id)
        return super().get_volume(volume_id)

class TestLeaky(Fixtures, StorageBackendConformance):
    @pytest.fixture
    def backend(self):
        return Leaky()

class TestReduced(Fixtures, StorageBackendConformance):
    @pytest.fixture
    def backend(self):
        return MockBackend(capabilities={Capability.CONSISTENCY_GROUPS})

class TestNoFixtures(StorageBackendConformance):
    pass
"""


def test_suite_fails_broken_backends(pytester: pytest.Pytester) -> None:
    """A suite that never fails proves nothing: broken backends must fail it."""
    pytester.makepyfile(test_broken=_HARNESS + _BROKEN)
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    outcome: dict[str, str] = {}
    for report in result.reprec.getreports("pytest_runtest_logreport"):  # type: ignore[attr-defined]
        if report.when == "call" or report.outcome != "passed":
            outcome["::".join(report.nodeid.split("::")[1:])] = report.outcome

    # Declaring less than it does is caught; the capability's own test is skipped.
    assert outcome["TestLiar::test_undeclared_capability_is_refused[mapping]"] == "failed"
    assert outcome["TestLiar::test_map_unmap_idempotent"] == "skipped"
    assert outcome["TestLiar::test_group_content_is_content_at_snapshot_time"] == "passed"
    # A restore that does nothing (and accepts any snapshot) is caught.
    for test in (
        "test_group_content_is_content_at_snapshot_time",
        "test_restore_keeps_snapshot",
        "test_restore_refuses_snapshot_of_other_volume",
        "test_clone_is_independent",
    ):
        assert outcome[f"TestLazy::{test}"] == "failed", test
    # A library exception leaking out is caught.
    for test in (
        "test_unknown_volume_raises_volume_not_found",
        "test_nonsense_ids_raise_pgsnap_errors[pgsnap-conformance-no-such-id-get_volume]",
        "test_errors_pickle",
    ):
        assert outcome[f"TestLeaky::{test}"] == "failed", test
    # A reduced backend: capability tests skip, refusals are checked and pass.
    assert outcome["TestReduced::test_map_unmap_idempotent"] == "skipped"
    assert outcome["TestReduced::test_clone_is_independent"] == "skipped"
    assert outcome["TestReduced::test_undeclared_capability_is_refused[mapping]"] == "passed"
    assert outcome["TestReduced::test_undeclared_capability_is_refused[clones]"] == "passed"
    assert outcome["TestReduced::test_consistency_group_shares_one_instant"] == "passed"
    reduced = {k: v for k, v in outcome.items() if k.startswith("TestReduced::")}
    assert "failed" not in reduced.values()
    # A subclass that forgets the fixtures gets a clear failure.
    assert outcome["TestNoFixtures::test_name_and_capabilities"] == "failed"
    result.stdout.fnmatch_lines(["*must define the 'backend' fixture*"])
