"""The conformance suite against the PowerFlex backend and the gateway simulator.

The same suite runs for PowerFlex 3.x (``snapshotVolumes``,
``overwriteVolumeContent``, Basic token login), 4.x (the same calls, Bearer
login through ``/rest/auth/login``) and 5.x (``createSnapshot``,
``createThinClone``, the ``restore`` action, ``assignSnapshotPolicy``). Each
test gets a fresh simulator; volumes are directories in it, and the marker
is a file in the volume's directory. No test of the suite is skipped.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from pgsnap.backends.powerflex import PowerFlexBackend
from pgsnap.protocols import Capability
from pgsnap.testing.conformance import (
    MakePolicy,
    MakeVolume,
    ReadMarker,
    StorageBackendConformance,
    WriteMarker,
)
from pgsnap.testing.powerflex_sim import PowerFlexSimulator

MARKER = "marker"
CONFORMANCE_HOST = "pgsnap-conformance-host"


class PowerFlexFixtures:
    """Fixtures shared by the three versions (``version`` is a class attribute)."""

    version = "3.6"

    @pytest.fixture
    def sim(self, tmp_path: Path) -> Iterator[PowerFlexSimulator]:
        with PowerFlexSimulator(version=self.version, root=tmp_path / "array") as sim:
            sim.add_sdc(CONFORMANCE_HOST)
            yield sim

    @pytest.fixture
    def backend(self, sim: PowerFlexSimulator) -> Iterator[PowerFlexBackend]:
        user, password = sim.credentials
        with PowerFlexBackend(sim.url, user, password, sleep=lambda _s: None) as backend:
            yield backend

    @pytest.fixture
    def make_volume(self, backend: PowerFlexBackend) -> MakeVolume:
        return lambda name: backend.ex_create_volume(name).id

    @pytest.fixture
    def write_marker(self, sim: PowerFlexSimulator) -> WriteMarker:
        def write(volume_id: str, data: bytes) -> None:
            (sim.volume_path(volume_id) / MARKER).write_bytes(data)

        return write

    @pytest.fixture
    def read_marker(self, sim: PowerFlexSimulator) -> ReadMarker:
        return lambda volume_id: (sim.volume_path(volume_id) / MARKER).read_bytes()

    @pytest.fixture
    def make_policy(self, backend: PowerFlexBackend) -> MakePolicy:
        def make(name: str, volume_ids: Sequence[str]) -> str:
            return backend.ex_create_policy(name[:31], volume_ids)

        return make


class TestPowerFlex3Conformance(PowerFlexFixtures, StorageBackendConformance):
    """PowerFlex 3.6."""

    version = "3.6"
    declared_capabilities = frozenset(Capability)


class TestPowerFlex4Conformance(PowerFlexFixtures, StorageBackendConformance):
    """PowerFlex 4.5 (PowerFlex Manager login)."""

    version = "4.5"
    declared_capabilities = frozenset(Capability)


class TestPowerFlex5Conformance(PowerFlexFixtures, StorageBackendConformance):
    """PowerFlex 5.0 (createSnapshot, restore)."""

    version = "5.0"
    declared_capabilities = frozenset(Capability)
