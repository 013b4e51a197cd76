"""The backup planner's preflight on synthetic facts."""

import datetime as dt
from typing import Any

import attrs
import pytest

from pgsnap import errors
from pgsnap.model import (
    ArchiverStatus,
    Layout,
    Location,
    Mount,
    RestoreProfile,
    ServerFacts,
    StorageVolume,
    Tablespace,
    Volume,
    VolumeRole,
)
from pgsnap.plan import Plan
from pgsnap.planner.backup import BackupRequest, Severity, plan_backup, preflight
from pgsnap.planner.facts import BackupFacts, PathFacts, VolumeFacts, cluster_paths
from pgsnap.protocols import Capability
from tests.unit.test_model import _record

NOW = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)
LAYOUT = Layout(
    [
        Volume("v-data", "data", VolumeRole.DATA, "/pg/data"),
        Volume("v-wal", "wal", VolumeRole.WAL, "/pg/wal"),
        Volume("v-ts", "ts", VolumeRole.TABLESPACE, "/pg/ts", tablespace_oid=16400),
        Volume("v-arch", "archive", VolumeRole.ARCHIVE, "/archive"),
    ]
)
SERVER = ServerFacts(
    version_num=150018,
    system_identifier="7300000000000000001",
    data_directory="/pg/data/15/main",
    wal_directory="/pg/wal/pg_wal",
    wal_segment_size=16 << 20,
    timeline=1,
    checkpoint_lsn="0/3000060",
    redo_lsn="0/3000028",
    current_lsn="0/3000100",
    in_recovery=False,
    tablespaces=(Tablespace(16400, "fast", "/pg/ts/fast"),),
    settings={
        "wal_level": "replica",
        "archive_mode": "on",
        "full_page_writes": "on",
        "archive_timeout": "60",
        "data_checksums": "on",
    },
)
ARCHIVER = ArchiverStatus(
    archived_count=10,
    last_archived_wal="000000010000000000000002",
    last_archived_time=NOW,
    failed_count=0,
    last_failed_wal=None,
    last_failed_time=None,
    wal_level="replica",
    archive_mode="on",
    archive_command="cp %p /archive/%f",
)


def directory_volumes(layout):
    """Every snapshotted volume is the directory at its mount point (as the mock's)."""
    return tuple(
        VolumeFacts(v.id, Location.directory(v.mount_point), RestoreProfile(), v.mount_point)
        for v in layout.snapshotted
    )


def paths_of(server, mounts=None):
    """The server's directories, resolved to themselves; on ``mounts[path prefix]``."""
    out = []
    for what, path in cluster_paths(server):
        mount = next((m for p, m in (mounts or {}).items() if path.startswith(p)), None)
        out.append(PathFacts(what, path, path, mount, mount.source if mount else None))
    return tuple(out)


def facts(**kw):
    base: dict[str, Any] = dict(
        server=SERVER,
        archiver=ARCHIVER,
        layout=LAYOUT,
        volumes=tuple(StorageVolume(v, v) for v in ("v-data", "v-wal", "v-ts", "v-arch")),
        capabilities=frozenset(Capability),
        catalog=(),
        archive_location="/archive",
        archive_timelines=(1,),
        archive_system_identifier="7300000000000000001",
        host="db1",
    )
    base.update(kw)
    base.setdefault("volume_facts", directory_volumes(base["layout"]))
    base.setdefault("paths", paths_of(base["server"]))
    return BackupFacts(**base)


def codes(findings, severity=Severity.ERROR):
    return sorted(f.code for f in findings if f.severity is severity)


def test_healthy_cluster_has_no_blocking_findings():
    assert codes(preflight(facts())) == []
    plan = plan_backup(facts(), BackupRequest("20261130T120000000Z", "nightly"))
    assert [s.id for s in plan.steps] == [
        "backup-start",
        "record-start",
        "snapshot",
        "backup-stop",
        "record-stop",
        "wait-wal",
        "done",
    ]
    assert plan.step("snapshot").params["volume_ids"] == ["v-data", "v-wal", "v-ts"]
    assert Plan.from_json(plan.to_json()) == plan


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"server": attrs.evolve(SERVER, in_recovery=True)}, "standby_streaming"),
        ({"archiver": attrs.evolve(ARCHIVER, wal_level="minimal")}, "archiving"),
        ({"archiver": attrs.evolve(ARCHIVER, archive_mode="off")}, "archiving"),
        (
            {
                "archiver": attrs.evolve(
                    ARCHIVER,
                    failed_count=1,
                    last_failed_time=NOW,
                    last_failed_wal="000000010000000000000003",
                )
            },
            "archiving",
        ),
        ({"server": attrs.evolve(SERVER, data_directory="/elsewhere/data")}, "coverage"),
        ({"server": attrs.evolve(SERVER, wal_directory="/other/pg_wal")}, "coverage"),
        (
            {"server": attrs.evolve(SERVER, tablespaces=(Tablespace(16500, "x", "/mnt/x"),))},
            "coverage",
        ),
        ({"archive_location": "/pg/data/archive"}, "archive_location"),
        ({"catalog": (_record(system_identifier="999"),)}, "system_identifier"),
        ({"archive_system_identifier": "999"}, "system_identifier"),
        ({"archive_timelines": (1, 2)}, "split_brain"),
        ({"volumes": (StorageVolume("v-data", "d"),)}, "volume_missing"),
        ({"last_archived_present": False}, "archive_mismatch"),
    ],
)
def test_each_blocking_finding(change, code):
    found = preflight(facts(**change))
    assert code in codes(found)
    with pytest.raises(errors.PreflightError) as info:
        plan_backup(facts(**change), BackupRequest("b", "b"))
    assert f"[{code}]" in str(info.value)


def test_an_archive_that_lacks_what_was_archived_blocks_the_backup():
    """Issue 19: `check` reported archive_mismatch (archive_command `true` copies
    nothing) but `pgsnap backup` went on: snapshots, waited, undid, recorded FAILED."""
    found = [
        f for f in preflight(facts(last_archived_present=False)) if f.code == "archive_mismatch"
    ]
    assert found and found[0].severity is Severity.ERROR
    assert "PostgreSQL archived 000000010000000000000002" in found[0].message
    assert "cp %p /archive/%f" in found[0].message and "copies nothing" in found[0].message
    # Nothing archived yet, or not asked: nothing to say.
    assert "archive_mismatch" not in codes(preflight(facts(last_archived_present=None)))
    quiet = facts(
        archiver=attrs.evolve(ARCHIVER, last_archived_wal=None), last_archived_present=False
    )
    assert "archive_mismatch" not in codes(preflight(quiet))


def test_warnings_do_not_block():
    f = facts(
        server=attrs.evolve(
            SERVER, settings={**SERVER.settings, "archive_timeout": "0", "data_checksums": "off"}
        ),
        capabilities=frozenset(),
    )
    assert codes(preflight(f), Severity.WARNING) == [
        "archive_timeout",
        "consistency_group",
        "data_checksums",
    ]
    plan = plan_backup(f, BackupRequest("b", "b"))
    assert len(plan.warnings) == 3


def test_pg_wal_inside_the_data_volume_needs_no_wal_volume():
    layout = Layout([Volume("v-data", "data", VolumeRole.DATA, "/pg/data")])
    server = attrs.evolve(SERVER, wal_directory="/pg/data/15/main/pg_wal", tablespaces=())
    assert codes(preflight(facts(layout=layout, server=server))) == []
    server = attrs.evolve(server, wal_directory="/pg/wal/pg_wal")
    assert codes(preflight(facts(layout=layout, server=server))) == ["coverage"]


def test_secure_snapshots_need_the_capability():
    with pytest.raises(errors.UnsupportedCapability):
        plan_backup(
            facts(capabilities=frozenset({Capability.CONSISTENCY_GROUPS})),
            BackupRequest("b", "b", secure_snapshots=True),
        )


BLOCK_LAYOUT = Layout(
    [
        Volume("v-data", "data", VolumeRole.DATA, "/pg/data"),
        Volume("v-wal", "wal", VolumeRole.WAL, "/pg/wal"),
    ]
)
BLOCK_SERVER = attrs.evolve(SERVER, tablespaces=())
DATA_MOUNT = Mount("/dev/mapper/vg-data", "/pg/data", "xfs", ("rw",))
WAL_MOUNT = Mount("/dev/mapper/vg-wal", "/pg/wal", "xfs", ("rw",))


def block_facts(data_mount=DATA_MOUNT, *, data_device="/dev/mapper/vg-data", mounts=None):
    volume_facts = (
        VolumeFacts(
            "v-data", Location.device("/dev/vg/data"), RestoreProfile(), data_device, data_mount
        ),
        VolumeFacts(
            "v-wal",
            Location.device("/dev/vg/wal"),
            RestoreProfile(),
            "/dev/mapper/vg-wal",
            WAL_MOUNT,
        ),
    )
    held = mounts if mounts is not None else {"/pg/data": DATA_MOUNT, "/pg/wal": WAL_MOUNT}
    return facts(
        layout=BLOCK_LAYOUT,
        server=BLOCK_SERVER,
        volume_facts=volume_facts,
        paths=paths_of(BLOCK_SERVER, held),
    )


def test_block_devices_cover_what_their_mounted_file_systems_hold():
    assert codes(preflight(block_facts())) == []


def test_coverage_is_judged_by_the_mounts_not_by_path_prefixes():
    # /pg/data/15/main is under the data volume's mount point by name, but the file
    # system holding it is another device (the volume is not mounted there).
    other = Mount("/dev/sdz1", "/pg/data", "ext4", ("rw",))
    found = preflight(block_facts(mounts={"/pg/data": other, "/pg/wal": WAL_MOUNT}))
    messages = [f.message for f in found if f.code == "coverage"]
    assert len(messages) == 1 and "/dev/sdz1" in messages[0] and "v-data" in messages[0]


def test_an_unmounted_block_volume_is_a_finding():
    found = preflight(block_facts(data_mount=None))
    assert any(f.code == "coverage" and "not mounted" in f.message for f in found)


def test_the_snapshot_step_says_how_the_storage_takes_the_group():
    together = plan_backup(facts(), BackupRequest("20261130T120000000Z", "n"))
    assert "as one consistency group" in together.step("snapshot").description
    apart = plan_backup(
        facts(capabilities=frozenset(Capability) - {Capability.CONSISTENCY_GROUPS}),
        BackupRequest("20261130T120000000Z", "n"),
    )
    assert "one after another" in apart.step("snapshot").description
    assert "backup mode" in apart.step("snapshot").reason
