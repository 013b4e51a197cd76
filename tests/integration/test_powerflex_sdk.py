"""Dell's own Python SDK (PyPowerFlex 2.0.1) against the gateway simulator, over TLS.

The SDK is a test peer of :class:`~pgsnap.testing.powerflex_sim.PowerFlexSimulator`:
a client no one here wrote, whose source is the reference for the REST dialect
(which endpoints, which body fields, on which versions). It speaks only HTTPS, so
the simulator sits behind :class:`~pgsnap.testing.powerflex_sim.TlsFront` with a
certificate from a throwaway CA, given to the SDK as ``certificate_path`` (and to
pgsnap as ``verify=``). For 3.6, 4.5 and 5.0 the SDK is driven as a user would drive
it: log in, list and create volumes, take a (secure) snapshot group, map and unmap
(an SDC on 3.x/4.x, a Host on 5.x), delete. Then pgsnap's backend and the SDK share
one simulated array and must agree on it: what one does, the other sees.

The SDK comes from the ``test`` extra; nothing here is skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from PyPowerFlex import PowerFlexClient  # type: ignore[import-untyped]
from PyPowerFlex.exceptions import PowerFlexClientException  # type: ignore[import-untyped]
from PyPowerFlex.objects.common.system import SnapshotDef  # type: ignore[import-untyped]

from pgsnap.backends.powerflex import PowerFlexBackend, PowerFlexVolumeMapped
from pgsnap.testing.powerflex_sim import (
    GatewayCertificate,
    PowerFlexSimulator,
    TlsFront,
    make_certificate,
)

VERSIONS = ["3.6", "4.5", "5.0"]
ONLY_ME = "ONLY_ME"  # PyPowerFlex RemoveMode.only_me


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> GatewayCertificate:
    """The gateway's certificate for 127.0.0.1, signed by a throwaway CA."""
    return make_certificate(tmp_path_factory.mktemp("tls"))


def sdk_client(front: TlsFront, sim: PowerFlexSimulator, cert: GatewayCertificate) -> Any:
    """A PyPowerFlex client, initialized as its README says, through the TLS front."""
    user, password = sim.credentials
    client = PowerFlexClient(
        gateway_address="127.0.0.1",
        gateway_port=front.port,
        username=user,
        password=password,
        verify_certificate=True,
        certificate_path=str(cert.ca),
        timeout=10,
    )
    # initialize() calls logging.basicConfig(stream=sys.stdout): keep the root logger
    # as it was, so no handler outlives this test's captured stdout.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        client.initialize()
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return client


@attrs.define
class Peers:
    """One simulated array, behind TLS, seen by the SDK and by pgsnap's backend."""

    sim: PowerFlexSimulator
    front: TlsFront
    sdk: Any
    pgsnap: PowerFlexBackend

    @property
    def gen2(self) -> bool:
        """PowerFlex 5.x: the SDK's gen2 objects, mapping through Hosts."""
        return self.sim.major >= 5

    def system_id(self) -> str:
        return str(self.sdk.system.get()[0]["id"])

    def snapshot(self, defs: list[Any], *, retention: int | None = None) -> dict[str, Any]:
        """A snapshot group the way the SDK's version takes one."""
        if self.gen2:
            answer = self.sdk.system.create_snapshot(self.system_id(), defs, retention)
        else:
            answer = self.sdk.system.snapshot_volumes(
                self.system_id(), defs, access_mode="ReadOnly", retention_period=retention
            )
        assert isinstance(answer, dict)
        return answer

    def host_id(self, name: str) -> str:
        """The id the SDK maps with: the SDC's (3.x/4.x) or the Host's (5.x)."""
        found = (self.sdk.host if self.gen2 else self.sdk.sdc).get(filter_fields={"name": name})
        (only,) = found
        return str(only["id"])

    def map(self, volume_id: str, host_id: str) -> None:
        if self.gen2:
            self.sdk.volume.add_mapped_host(volume_id, host_id=host_id, access_mode="ReadWrite")
        else:
            self.sdk.volume.add_mapped_sdc(volume_id, sdc_id=host_id, access_mode="ReadWrite")

    def unmap(self, volume_id: str, host_id: str) -> None:
        if self.gen2:
            self.sdk.volume.remove_mapped_host(volume_id, host_id=host_id)
        else:
            self.sdk.volume.remove_mapped_sdc(volume_id, sdc_id=host_id)

    def mapped_volumes(self, host_id: str) -> list[str]:
        """The ids of the volumes the SDK says are mapped to the host."""
        if self.gen2:
            related = self.sdk.host.get_related(host_id, "Volume")
        else:
            related = self.sdk.sdc.get_mapped_volumes(host_id)
        return sorted(str(v["id"]) for v in related)

    def actions(self) -> list[str]:
        return [r.action for r in self.sim.requests if r.action]


@pytest.fixture(params=VERSIONS)
def peers(
    request: pytest.FixtureRequest, tmp_path: Path, cert: GatewayCertificate
) -> Iterator[Peers]:
    with (
        PowerFlexSimulator(version=request.param, root=tmp_path / "array") as sim,
        TlsFront(sim.url, cert) as front,
    ):
        user, password = sim.credentials
        backend = PowerFlexBackend(
            front.url, user, password, verify=str(cert.ca), sleep=lambda _s: None, listing_ttl=0
        )
        yield Peers(sim, front, sdk_client(front, sim, cert), backend)
        backend.close()


# --------------------------------------------------------------------------- the SDK alone


def test_the_sdk_logs_in_as_its_version_says(peers: Peers) -> None:
    sim, sdk = peers.sim, peers.sdk
    assert sdk.system.api_version() == sim.version
    generation = "gen2" if peers.gen2 else "gen1"
    assert type(sdk.volume).__module__ == f"PyPowerFlex.objects.{generation}.volume"
    sim.requests.clear()
    assert sdk.volume.get() == []
    paths = [(r.method, r.path, r.status) for r in sim.requests]
    if sim.major < 4:  # GET /api/login (Basic user:password), the token as Basic password
        assert ("GET", "/api/login", 200) in paths
        assert ("GET", "/api/logout", 200) in paths
        assert not any(p.startswith("/rest/") for _, p, _ in paths)
    else:  # PowerFlex Manager: /rest/auth/login, Bearer, /rest/auth/logout answered 204
        assert ("POST", "/rest/auth/login", 200) in paths
        assert ("POST", "/rest/auth/logout", 204) in paths
    assert ("GET", "/api/types/Volume/instances", 200) in paths
    assert {s for _, _, s in paths} <= {200, 204}  # nothing refused
    assert peers.front.connections > 0  # every byte of it went through TLS


@pytest.mark.parametrize("version", ["3.6", "4.5"])
def test_the_sdk_when_the_version_endpoint_needs_a_session(
    version: str, tmp_path: Path, cert: GatewayCertificate
) -> None:
    """PyPowerFlex asks /api/version with Basic (user, /api/login token) on every version;
    a 4.x gateway accepts that, and so must the simulator."""
    with (
        PowerFlexSimulator(version=version, root=tmp_path, version_needs_auth=True) as sim,
        TlsFront(sim.url, cert) as front,
    ):
        sdk = sdk_client(front, sim, cert)
        assert sdk.system.api_version() == version
        vid = sim.add_volume("pgdata")
        assert [v["id"] for v in sdk.volume.get()] == [vid]
        versions = [r.status for r in sim.requests if r.path == "/api/version"]
        assert versions and set(versions) == {200}


def test_the_sdk_creates_lists_and_deletes_volumes(peers: Peers) -> None:
    sdk = peers.sdk
    (pool,) = sdk.storage_pool.get()
    made = sdk.volume.create(pool["id"], 8, name="sdk-vol", volume_type="ThinProvisioned")
    assert (made["name"], made["sizeInKb"], made["mappedSdcInfo"]) == ("sdk-vol", 8 << 20, None)
    assert [v["name"] for v in sdk.volume.get()] == ["sdk-vol"]
    assert [v.name for v in peers.pgsnap.list_volumes()] == ["sdk-vol"]
    sdk.volume.delete(made["id"], ONLY_ME)
    assert sdk.volume.get() == []
    assert peers.pgsnap.list_volumes() == ()


def test_the_sdk_takes_a_secure_snapshot_group_and_deletes_it_after_expiry(
    peers: Peers,
) -> None:
    sim, sdk = peers.sim, peers.sdk
    a, b = sim.add_volume("vol-a"), sim.add_volume("vol-b")
    started = int(time.time())
    answer = peers.snapshot([SnapshotDef(a, "g1.a"), SnapshotDef(b, "g1.b")], retention=60)
    gid = answer["snapshotGroupId"]
    snaps = sdk.volume.get(filter_fields={"consistencyGroupId": gid})
    assert sorted(s["id"] for s in snaps) == sorted(answer["volumeIdList"])
    for s in snaps:
        assert s["accessModeLimit"] == "ReadOnly"
        assert s["volumeType"] == ("ReadOnlySnapshot" if peers.gen2 else "Snapshot")
        assert s["secureSnapshotExpTime"] >= started + 3600
    # Secure: the group cannot be removed before its expiry; retention can be delayed.
    with pytest.raises(PowerFlexClientException, match="secure"):
        sdk.system.remove_cg_snapshots(peers.system_id(), gid)
    first = snaps[0]["id"]
    before = snaps[0]["secureSnapshotExpTime"]
    sdk.volume.set_retention_period(first, 120)
    assert sdk.volume.get(entity_id=first)["secureSnapshotExpTime"] > before
    for s in answer["volumeIdList"]:
        sim.set_secure_expiry(s, started - 1)  # expired
    assert sdk.system.remove_cg_snapshots(peers.system_id(), gid) == {"numberOfVolumes": 2}
    assert sdk.volume.get(filter_fields={"consistencyGroupId": gid}) == []


def test_the_sdk_maps_and_unmaps_through_the_versions_objects(peers: Peers) -> None:
    sim, sdk = peers.sim, peers.sdk
    sdc = sim.add_sdc("db1")
    vid = sim.add_volume("pgdata")
    if sim.major >= 4:  # the SDC is also a Host there, of the same id
        hosts = sdk.host.get()
        assert [(h["id"], h["name"], h["hostType"]) for h in hosts] == [(sdc, "db1", "SdcHost")]
    assert peers.host_id("db1") == sdc
    peers.map(vid, sdc)
    (info,) = sdk.volume.get(entity_id=vid)["mappedSdcInfo"]
    assert (info["sdcId"], info["sdcName"], info["accessMode"]) == (sdc, "db1", "ReadWrite")
    assert peers.mapped_volumes(sdc) == [vid]
    peers.unmap(vid, sdc)
    assert sdk.volume.get(entity_id=vid)["mappedSdcInfo"] is None
    assert peers.mapped_volumes(sdc) == []
    expected = (
        ["addMappedHost", "removeMappedHost"] if peers.gen2 else ["addMappedSdc", "removeMappedSdc"]
    )
    assert peers.actions() == expected


# --------------------------------------------------------------------------- SDK and pgsnap


def test_a_group_pgsnap_takes_is_what_the_sdk_sees(peers: Peers) -> None:
    sim, sdk = peers.sim, peers.sdk
    data, wal = sim.add_volume("pgdata"), sim.add_volume("pgwal")
    group = peers.pgsnap.create_snapshot_group([data, wal], "20261201T060000Z", secure=True)
    seen = sdk.volume.get(filter_fields={"consistencyGroupId": group.id})
    assert sorted((s["name"], s["ancestorVolumeId"]) for s in seen) == [
        ("20261201T060000Z.pgdata", data),
        ("20261201T060000Z.pgwal", wal),
    ]
    assert {s["accessModeLimit"] for s in seen} == {"ReadOnly"}
    assert all(s["secureSnapshotExpTime"] > time.time() for s in seen)
    assert sorted(s["id"] for s in seen) == sorted(s.id for s in group.snapshots)
    with pytest.raises(PowerFlexClientException, match="secure"):  # the array's refusal
        sdk.system.remove_cg_snapshots(peers.system_id(), group.id)


def test_a_group_the_sdk_takes_is_what_pgsnap_sees_and_restores(peers: Peers) -> None:
    sim, backend = peers.sim, peers.pgsnap
    vid = sim.add_volume("pgdata")
    (sim.volume_path(vid) / "marker").write_text("before")
    answer = peers.snapshot([SnapshotDef(vid, "sdk-taken.pgdata")])
    (sim.volume_path(vid) / "marker").write_text("after")
    (snap,) = backend.list_snapshots(vid)  # read-only: a backup snapshot to pgsnap
    assert (snap.id, snap.group_id, snap.name) == (
        answer["volumeIdList"][0],
        answer["snapshotGroupId"],
        "sdk-taken.pgdata",
    )
    assert not snap.secure
    assert backend.get_snapshot_group(answer["snapshotGroupId"]).snapshots == (snap,)
    backend.restore_volume(vid, snap.id)
    assert (sim.volume_path(vid) / "marker").read_text() == "before"
    backend.delete_snapshot_group(answer["snapshotGroupId"])
    assert peers.sdk.volume.get(filter_fields={"ancestorVolumeId": vid}) == []


def test_a_mapping_the_sdk_makes_is_what_pgsnap_sees(peers: Peers) -> None:
    sim, backend = peers.sim, peers.pgsnap
    host = sim.simulated_host("db1")
    vid = sim.add_volume("pgdata")
    snap = backend.create_snapshot_group([vid], "m1").snapshots[0]
    peers.map(vid, peers.host_id("db1"))
    assert backend.get_volume(vid).mapped_hosts == ("db1",)
    mapped = len(sim.requests)
    backend.attach(vid, "db1")  # already mapped: pgsnap sends no mapping call
    assert not [r for r in sim.requests[mapped:] if r.action]
    device = backend.locate(vid).path
    assert device == f"/dev/disk/by-id/emc-vol-{sim.system_id}-{vid}"
    assert host.wait_for_device(device, timeout=5) == str(sim.volume_path(vid).resolve())
    with pytest.raises(PowerFlexVolumeMapped):  # restoring needs it unmapped
        backend.restore_volume(vid, snap.id)
    backend.detach(vid, "db1")
    assert peers.sdk.volume.get(entity_id=vid)["mappedSdcInfo"] is None
    assert not host.exists(device)


def test_a_mapping_pgsnap_makes_is_what_the_sdk_sees(peers: Peers) -> None:
    sim, backend = peers.sim, peers.pgsnap
    sdc = sim.add_sdc("db1")
    vid = sim.add_volume("pgdata")
    backend.attach(vid, "db1")
    assert peers.mapped_volumes(sdc) == [vid]
    (info,) = peers.sdk.volume.get(entity_id=vid)["mappedSdcInfo"]
    assert (info["sdcId"], info["accessMode"]) == (sdc, "ReadWrite")
    # pgsnap mapped the way the SDK of that version does.
    assert peers.actions()[-1] == ("addMappedHost" if peers.gen2 else "addMappedSdc")
    peers.unmap(vid, sdc)
    unmapped = len(sim.requests)
    backend.detach(vid, "db1")  # unmapped by the SDK: nothing left to do
    assert not [r for r in sim.requests[unmapped:] if r.action]
    assert backend.get_volume(vid).mapped_hosts == ()
