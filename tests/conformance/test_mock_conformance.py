"""The conformance suite run against the mock backend, in every set-up it has.

- in-memory volumes with every capability;
- directory-backed volumes (a real file tree is copied and restored), in
  memory and with a state file (persisted across instances and processes);
- block mode: directory-backed volumes as simulated block devices (restores
  need a detach), synchronous, and with asynchronous restores and a state file;
- a mock with no capability at all, which gets the UnsupportedCapability
  checks of the suite instead of the capabilities' tests.

No test of the suite is skipped in any of them. The last tests run the suite
against deliberately broken backends (with pytester) to prove that it fails
them, and that it generates only the tests that apply.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from pgsnap.backends.mock import MockBackend
from pgsnap.model import LocationKind, RestorePreparation
from pgsnap.protocols import Capability
from pgsnap.testing.conformance import (
    MakePolicy,
    MakeVolume,
    ReadMarker,
    StorageBackendConformance,
    WriteMarker,
)

pytest_plugins = ("pytester",)

MARKER = "marker"
EVERYTHING = frozenset(Capability)


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

    declared_capabilities = EVERYTHING

    @pytest.fixture
    def backend(self) -> Iterator[MockBackend]:
        with MockBackend() as backend:
            yield backend


def content_dir(backend: MockBackend, volume_id: str) -> Path:
    """A directory volume's content: its path, or in block mode its LUN."""
    volume = backend.get_volume(volume_id)
    path = volume.path if volume.path is not None else volume.extra.get("lun")
    assert path is not None, volume
    return Path(path)


class TestMockDirectoryConformance(MemoryFixtures, StorageBackendConformance):
    """Every capability, directory-backed volumes: markers are files in the directory."""

    declared_capabilities = EVERYTHING

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
            path = content_dir(backend, volume_id)
            # A new file name each time as well, to check that restore removes files.
            for old in path.glob("marker*"):
                old.unlink()
            (path / MARKER).write_bytes(data)
            (path / f"marker-{data.hex()}").touch()

        return write

    @pytest.fixture
    def read_marker(self, backend: MockBackend) -> ReadMarker:
        def read(volume_id: str) -> bytes:
            path = content_dir(backend, volume_id)
            data = (path / MARKER).read_bytes()
            names = sorted(p.name for p in path.glob("marker*"))
            assert names == sorted([MARKER, f"marker-{data.hex()}"]), names
            assert (path / "sub" / "file").read_text() == "constant"
            return data

        return read


class TestMockPersistentConformance(TestMockDirectoryConformance):
    """Directory volumes with a state file: every call reloads and saves the JSON state."""

    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[MockBackend]:
        with MockBackend(state_file=tmp_path / "state.json", root=tmp_path / "root") as backend:
            yield backend


class TestMockBlockConformance(TestMockDirectoryConformance):
    """Block mode: directory volumes are simulated block devices, restored detached."""

    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[MockBackend]:
        with MockBackend(root=tmp_path / "root", block=True) as backend:
            yield backend

    def test_the_mock_is_in_block_mode(self, backend: MockBackend, make_volume: MakeVolume) -> None:
        """The variant really runs the suite against block devices that restore detached."""
        vid = make_volume("block")
        assert backend.locate(vid).kind is LocationKind.BLOCK_DEVICE
        profile = backend.restore_profile(vid)
        assert profile.before is RestorePreparation.DETACH
        assert profile.completes_later is backend.async_restore


class TestMockBlockAsyncConformance(TestMockBlockConformance):
    """Block mode with restores that complete later, and a state file."""

    @pytest.fixture
    def backend(self, tmp_path: Path) -> Iterator[MockBackend]:
        with MockBackend(
            state_file=tmp_path / "state.json",
            root=tmp_path / "root",
            block=True,
            async_restore=True,
        ) as backend:
            assert backend.async_restore
            yield backend


class TestMockReducedConformance(MemoryFixtures, StorageBackendConformance):
    """No capability at all: the suite checks refusals instead of the capabilities."""

    declared_capabilities = frozenset()

    @pytest.fixture
    def backend(self) -> MockBackend:
        return MockBackend(capabilities=())


# --------------------------------------------------------------------------- the suite has teeth

_HARNESS = """
import pytest
from pgsnap.backends.mock import MockBackend
from pgsnap.model import RestorePreparation, RestoreProfile
from pgsnap.protocols import Capability
from pgsnap.testing.conformance import StorageBackendConformance

ALL = frozenset(Capability)

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
    @pytest.fixture
    def make_policy(self, backend):
        return lambda name, ids: backend.add_policy(name, ids).id
"""


_BROKEN = """
class Liar(MockBackend):
    "Claims no MAPPING but attaches anyway."
    @property
    def capabilities(self):
        return super().capabilities - {Capability.MAPPING}

class TestLiar(Fixtures, StorageBackendConformance):
    declared_capabilities = ALL - {Capability.MAPPING}
    @pytest.fixture
    def backend(self):
        return Liar()

class Lazy(MockBackend):
    "Restore does nothing."
    def restore_volume(self, volume_id, snapshot_id):
        self.get_volume(volume_id)

class TestLazy(Fixtures, StorageBackendConformance):
    declared_capabilities = ALL
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
    declared_capabilities = ALL
    @pytest.fixture
    def backend(self):
        return Leaky()

class DetachWithoutMapping(MockBackend):
    "A profile that asks for a detach the backend cannot do."
    def restore_profile(self, volume_id):
        super().restore_profile(volume_id)
        return RestoreProfile(before=RestorePreparation.DETACH)

class TestDetachWithoutMapping(Fixtures, StorageBackendConformance):
    declared_capabilities = frozenset()
    @pytest.fixture
    def backend(self):
        return DetachWithoutMapping(capabilities=())

class SilentAsync(MockBackend):
    "Restores complete later, but the profile does not say so."
    def restore_profile(self, volume_id):
        super().restore_profile(volume_id)
        return RestoreProfile()

class TestSilentAsync(Fixtures, StorageBackendConformance):
    declared_capabilities = ALL
    @pytest.fixture
    def backend(self):
        return SilentAsync(async_restore=True)

class NeverLocates(MockBackend):
    "locate() of an unknown volume answers anyway."
    def locate(self, volume_id):
        try:
            return super().locate(volume_id)
        except LookupError:
            return super().locate(self.list_volumes()[0].id)

class TestNeverLocates(Fixtures, StorageBackendConformance):
    declared_capabilities = ALL
    @pytest.fixture
    def backend(self):
        return NeverLocates()

class TestReduced(Fixtures, StorageBackendConformance):
    declared_capabilities = {Capability.CONSISTENCY_GROUPS}
    @pytest.fixture
    def backend(self):
        return MockBackend(capabilities={Capability.CONSISTENCY_GROUPS})

class TestReducedSubclass(TestReduced):
    "A subclass declaring more gets the tests of what it adds, and loses the refusals."
    declared_capabilities = {Capability.CONSISTENCY_GROUPS, Capability.CLONES}
    @pytest.fixture
    def backend(self):
        return MockBackend(capabilities=self.declared_capabilities)

class TestMisdeclared(Fixtures, StorageBackendConformance):
    declared_capabilities = ALL
    @pytest.fixture
    def backend(self):
        return MockBackend(capabilities={Capability.CONSISTENCY_GROUPS})

class TestOwnOverride(Fixtures, StorageBackendConformance):
    declared_capabilities = ALL
    @pytest.fixture
    def backend(self):
        return MockBackend()
    def test_clone_is_independent(self):
        "The class's own test wins over the suite's."

class TestNoFixtures(StorageBackendConformance):
    pass
"""


def test_suite_fails_broken_backends(pytester: pytest.Pytester) -> None:
    """A suite that never fails proves nothing: broken backends must fail it."""
    pytester.makepyfile(test_broken=_HARNESS + _BROKEN)
    # In this process alone (the outer run may be spread over xdist workers, which
    # pytest-benchmark, when installed, would refuse).
    result = pytester.runpytest_inprocess(
        "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:benchmark"
    )
    outcome: dict[str, str] = {}
    for report in result.reprec.getreports("pytest_runtest_logreport"):  # type: ignore[attr-defined]
        if report.when == "call" or report.outcome != "passed":
            outcome["::".join(report.nodeid.split("::")[1:])] = report.outcome

    # Nothing is ever skipped: a test that does not apply is not generated.
    assert "skipped" not in outcome.values(), sorted(
        k for k, v in outcome.items() if v == "skipped"
    )
    # Declaring less than it does is caught by the refusal test of that capability.
    assert outcome["TestLiar::test_attach_detach_refused_without_mapping"] == "failed"
    assert "TestLiar::test_attach_detach_idempotent" not in outcome
    assert outcome["TestLiar::test_group_content_is_content_at_snapshot_time"] == "passed"
    # A restore that does nothing (and accepts any snapshot) is caught.
    for test in (
        "test_group_content_is_content_at_snapshot_time",
        "test_restore_keeps_snapshot",
        "test_restore_refuses_snapshot_of_other_volume",
        "test_restore_round_trip_follows_the_profile",
        "test_clone_is_independent",
    ):
        assert outcome[f"TestLazy::{test}"] == "failed", test
    # A library exception leaking out is caught.
    for test in (
        "test_unknown_volume_raises_volume_not_found",
        "test_nonsense_ids_raise_pgsnap_errors[get_volume]",
        "test_errors_pickle",
    ):
        assert outcome[f"TestLeaky::{test}"] == "failed", test
    # Profiles must be true: a detach needs MAPPING; a restore that completes later says so.
    assert outcome["TestDetachWithoutMapping::test_restore_profile_is_consistent"] == "failed"
    assert outcome["TestSilentAsync::test_restore_keeps_snapshot"] == "failed"
    assert outcome["TestSilentAsync::test_group_content_is_content_at_snapshot_time"] == "passed"
    # An unknown volume must be VolumeNotFound for locate too.
    assert outcome["TestNeverLocates::test_unknown_volume_raises_volume_not_found"] == "failed"
    # A reduced backend gets refusal tests for what it lacks, and they pass.
    reduced = {k: v for k, v in outcome.items() if k.startswith("TestReduced::")}
    assert "TestReduced::test_attach_detach_idempotent" not in reduced
    assert "TestReduced::test_clone_is_independent" not in reduced
    assert reduced["TestReduced::test_attach_detach_refused_without_mapping"] == "passed"
    assert reduced["TestReduced::test_clone_refused_without_capability"] == "passed"
    assert reduced["TestReduced::test_consistency_group_shares_one_instant"] == "passed"
    assert "TestReduced::test_group_without_consistency_groups_has_every_volume" not in reduced
    assert "failed" not in reduced.values()
    sub = {k: v for k, v in outcome.items() if k.startswith("TestReducedSubclass::")}
    assert sub["TestReducedSubclass::test_clone_is_independent"] == "passed"
    assert "TestReducedSubclass::test_clone_refused_without_capability" not in sub
    assert sub["TestReducedSubclass::test_attach_detach_refused_without_mapping"] == "passed"
    assert "failed" not in sub.values()
    # Declared capabilities that are not the backend's fail loudly.
    assert outcome["TestMisdeclared::test_declared_capabilities_match_the_backend"] == "failed"
    result.stdout.fnmatch_lines(["*TestMisdeclared.declared_capabilities is not what backend*"])
    # A test the class defines itself is kept.
    assert outcome["TestOwnOverride::test_clone_is_independent"] == "passed"
    # A subclass that forgets the fixtures and the capabilities gets clear failures.
    assert outcome["TestNoFixtures::test_name_and_capabilities"] == "failed"
    assert outcome["TestNoFixtures::test_declared_capabilities_match_the_backend"] == "failed"
    assert not [k for k in outcome if k.startswith("TestNoFixtures::test_attach")]
    result.stdout.fnmatch_lines(["*must define the 'backend' fixture*"])


def test_capability_tests_cover_every_capability() -> None:
    """Each capability has tests for declaring it and for not declaring it."""
    from pgsnap.testing.conformance import CAPABILITY_TESTS

    assert set(CAPABILITY_TESTS) == set(Capability)
    for with_it, without_it in CAPABILITY_TESTS.values():
        assert [n for n in vars(with_it) if n.startswith("test_")]
        assert [n for n in vars(without_it) if n.startswith("test_")]


def test_declared_capabilities_must_be_capabilities() -> None:
    """A typo in declared_capabilities is caught when the class is defined."""
    with pytest.raises(TypeError, match="non-capabilities"):
        type("TestTypo", (StorageBackendConformance,), {"declared_capabilities": {"mapping"}})
    with pytest.raises(TypeError, match="set of Capability"):
        type("TestOne", (StorageBackendConformance,), {"declared_capabilities": Capability.CLONES})
