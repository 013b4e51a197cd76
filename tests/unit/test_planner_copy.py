"""The copy planner (pure): what a copy plan holds, and what it refuses."""

from __future__ import annotations

import datetime as dt

import attrs
import pytest

from pgsnap.errors import ConfigurationError, PlanningError
from pgsnap.model import LSN, BackupState, CopyRecord, Layout, SnapshotAccess, Volume, VolumeRole
from pgsnap.plan import Plan
from pgsnap.planner.copy import CopyRequest, plan_copy

from .test_planner_recovery import T0, backup

TS_LAYOUT = Layout(
    [
        Volume("vol-data", "data", VolumeRole.DATA, "/pg/data"),
        Volume("vol-wal", "wal", VolumeRole.WAL, "/pg/wal"),
        Volume("vol-ts", "ts", VolumeRole.TABLESPACE, "/pg/ts", tablespace_oid=16400),
    ]
)


def record():  # a DONE backup with data, WAL and tablespace snapshots
    r = backup("b1", 2, 3, 0)
    return attrs.evolve(
        r, layout=TS_LAYOUT, snapshots={**r.snapshots, "vol-ts": "b1-t"}, spcmapfile="16400 /x\n"
    )


ACCESS = {"vol-data": SnapshotAccess("/snaps/d"), "vol-ts": SnapshotAccess("/snaps/t")}


def test_a_copy_plan_sends_the_data_and_tablespace_trees_then_records_the_copy() -> None:
    plan = plan_copy(record(), ACCESS, CopyRequest("b1", "/copies"))
    assert [s.id for s in plan.steps] == ["send", "record"]
    send = plan.steps[0]
    assert send.action == "copy.send" and send.compensation == "copy.delete_manifest"
    assert send.compensation_params == {
        "copy_id": "b1.1",
        "target_dir": "/copies",
        "target_options": {},
    }
    assert send.params["trees"] == {"pgdata": "/snaps/d", "tablespace-16400": "/snaps/t"}
    assert send.params["labelfile"] == "LABEL: b1\n"
    assert send.params["spcmapfile"] == "16400 /x\n"
    assert plan.kind == "copy" and plan.request["copy_id"] == "b1.1"
    assert Plan.from_json(plan.to_json()) == plan  # plans are data
    again = plan_copy(record(), ACCESS, CopyRequest("b1", "/copies"))
    assert again.id == plan.id  # the same facts, the same plan


def test_an_s3_target_travels_with_its_options_and_no_secret() -> None:
    options = {"endpoint_url": "http://127.0.0.1:8333", "access_key_env": "KEY"}
    plan = plan_copy(record(), ACCESS, CopyRequest("b1", "s3://bkt/pg", target_options=options))
    assert plan.steps[0].params["target_dir"] == "s3://bkt/pg"
    assert plan.steps[0].params["target_options"] == options


def test_the_next_copy_gets_the_next_number() -> None:
    done = CopyRecord("b1.1", "/copies", "ab" * 32, T0)
    r = attrs.evolve(record(), copies=(done,))
    plan = plan_copy(r, ACCESS, CopyRequest("b1", "/copies"))
    assert plan.request["copy_id"] == "b1.2"
    with pytest.raises(PlanningError, match=r"already has a copy b1\.1"):
        plan_copy(r, ACCESS, CopyRequest("b1", "/copies", copy_id="b1.1"))


@pytest.mark.parametrize(
    ("change", "access", "request_", "error", "match"),
    [
        ({"state": BackupState.FAILED}, ACCESS, CopyRequest("b1", "/c"), PlanningError, "not done"),
        ({}, {"vol-data": ACCESS["vol-data"]}, CopyRequest("b1", "/c"), PlanningError, "vol-ts"),
        ({}, ACCESS, CopyRequest("b1", "copies"), ConfigurationError, "absolute"),
        ({}, ACCESS, CopyRequest("b1", "/c", copy_id="../x"), ConfigurationError, "copy id"),
    ],
)
def test_what_cannot_be_copied_is_refused_with_the_reason(
    change: dict[str, object],
    access: dict[str, SnapshotAccess],
    request_: CopyRequest,
    error: type[Exception],
    match: str,
) -> None:
    with pytest.raises(error, match=match):
        plan_copy(attrs.evolve(record(), **change), access, request_)


def test_a_copy_of_another_time_is_another_plan() -> None:
    r = record()
    later = attrs.evolve(r, copies=(CopyRecord("b1.1", "/c", "ab" * 32, T0 + dt.timedelta(1)),))
    a = plan_copy(r, ACCESS, CopyRequest("b1", "/copies", copy_id="x"))
    b = plan_copy(later, ACCESS, CopyRequest("b1", "/copies", copy_id="x"))
    assert a.fingerprint != b.fingerprint  # a plan made before another copy is stale


def test_a_copy_carries_the_backups_wal_as_the_archive_stores_it() -> None:
    """The segments from the backup's start to its stop (compressed names as stored);
    when the archive lacks one, the copy is made without WAL and the plan says so."""
    from pgsnap.planner.copy import backup_wal_names

    rec = record()
    names = backup_wal_names(rec)
    assert names == ("000000010000000000000002", "000000010000000000000003")
    stored = {names[0]: names[0] + ".gz", names[1]: names[1]}
    plan = plan_copy(rec, ACCESS, CopyRequest("b1", "/copies"), stored)
    assert plan.steps[0].params["wal"] == [names[0] + ".gz", names[1]]
    assert "2 files from the archive" in plan.summary["wal"] and not plan.warnings
    assert "pg_wal (2 WAL files)" in plan.steps[0].description
    short = plan_copy(rec, ACCESS, CopyRequest("b1", "/copies"), {names[0]: names[0]})
    assert short.steps[0].params["wal"] == []
    assert "000000010000000000000003 missing" in short.warnings[0]
    assert "needs the WAL archive" in short.summary["wal"]
    assert short.fingerprint != plan.fingerprint
    # A stop exactly at a segment's start needs none of that segment; timeline 2 its history.
    at_boundary = attrs.evolve(rec, stop_lsn=LSN(4 * 1024 * 1024), stop_timeline=2)
    assert backup_wal_names(at_boundary) == (
        "000000020000000000000002",
        "000000020000000000000003",
        "00000002.history",
    )


# --------------------------------------------------------------------------- exposed snapshots

EXPOSED = {"vol-data": SnapshotAccess.exposed_on("db1"), "vol-ts": SnapshotAccess.exposed_on("db1")}


def exposed_request(*, mount_root: str = "/run/pgsnap/copies", runs_on: str = "db1") -> CopyRequest:
    return CopyRequest("b1", "/copies", mount_root=mount_root, runs_on=runs_on)


def test_block_snapshots_are_exposed_and_mounted_read_only_around_the_send() -> None:
    """Issue 21: LVM and PowerFlex snapshots are exposed on the reading host and mounted
    at fresh mount points before `send`, unmounted and concealed after it, each with
    its undo; no backend is named, the send reads the mount points."""
    plan = plan_copy(record(), EXPOSED, exposed_request())
    assert [s.id for s in plan.steps] == [
        "expose-vol-data",
        "mount-vol-data",
        "expose-vol-ts",
        "mount-vol-ts",
        "send",
        "unmount-vol-data",
        "conceal-vol-data",
        "unmount-vol-ts",
        "conceal-vol-ts",
        "record",
    ]
    steps = {s.id: s for s in plan.steps}
    expose, mount = steps["expose-vol-data"], steps["mount-vol-data"]
    assert expose.action == "storage.expose_snapshot"
    assert expose.params == {
        "backup_id": "b1",
        "volume_id": "vol-data",
        "snapshot_id": "b1-d",
        "host": "db1",
    }
    assert expose.compensation == "storage.conceal_snapshot"
    assert expose.compensation_params == expose.params
    assert mount.action == "host.mount_snapshot"
    assert mount.params["device"] == {"$ref": ["expose-vol-data", "device"]}
    assert mount.params["mount_point"] == "/run/pgsnap/copies/b1.1/pgdata"
    assert mount.compensation == "host.unmount_snapshot"
    assert steps["send"].params["trees"] == {
        "pgdata": "/run/pgsnap/copies/b1.1/pgdata",
        "tablespace-16400": "/run/pgsnap/copies/b1.1/tablespace-16400",
    }
    assert steps["unmount-vol-data"].params == {
        "mount_point": "/run/pgsnap/copies/b1.1/pgdata",
        "host": "db1",
    }
    assert steps["unmount-vol-data"].compensation is None  # undone by the mount's undo
    assert steps["conceal-vol-ts"].params["snapshot_id"] == "b1-t"
    assert "read-only" in plan.explain()
    assert Plan.from_json(plan.to_json()) == plan
    assert plan_copy(record(), EXPOSED, exposed_request()).id == plan.id  # deterministic
    in_place = plan_copy(record(), ACCESS, CopyRequest("b1", "/copies", copy_id="b1.1"))
    assert in_place.fingerprint != plan.fingerprint


def test_a_copy_that_would_read_on_another_host_than_pgsnap_runs_on_is_refused() -> None:
    """The copy reads the mounted snapshots locally: a backup host means running
    pgsnap there."""
    backup_host = {k: SnapshotAccess.exposed_on("backup1") for k in EXPOSED}
    with pytest.raises(PlanningError, match=r"mounted on host 'backup1', but pgsnap runs on db1"):
        plan_copy(record(), backup_host, exposed_request())
    with pytest.raises(PlanningError, match="neither the database host nor a backup host"):
        plan_copy(record(), EXPOSED, exposed_request(runs_on=""))
    plan = plan_copy(record(), backup_host, exposed_request(runs_on="backup1"))
    assert {s.params.get("host") for s in plan.steps if "host" in s.params} == {"backup1"}


@pytest.mark.parametrize("root", ["relative/mnt", "/", ""])
def test_the_mount_root_must_be_an_absolute_directory(root: str) -> None:
    with pytest.raises(ConfigurationError, match="mount root"):
        plan_copy(record(), EXPOSED, exposed_request(mount_root=root))


def test_a_snapshot_access_is_in_place_or_exposed_never_both() -> None:
    assert SnapshotAccess("/s") == SnapshotAccess.in_place("/s")
    assert not SnapshotAccess("/s").must_expose and SnapshotAccess.exposed_on("h").must_expose
    for bad in ({"path": "/s", "host": "h"}, {}):
        with pytest.raises(ConfigurationError, match="either a path"):
            SnapshotAccess(**bad)
