"""The btrfs backend without btrfs: parsing, metadata, error mapping, and what it runs.

The command outputs and error messages below were captured on the project's
machine (Debian 12, btrfs-progs 6.2, kernel 6.18, ``LC_ALL=C``) from real
btrfs file systems on loop devices; a fake :class:`~pgsnap.protocols.Runner`
plays them back, and records every command the backend runs.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import pickle
import shutil
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from pgsnap.backends.btrfs import (
    CAPABILITIES,
    BtrfsBackend,
    BtrfsError,
    BtrfsPermissionError,
    NestedSubvolumeError,
    NoSpaceError,
    NotBtrfsError,
    ReadOnlyFilesystemError,
    SubvolumeBusyError,
    classify_failure,
    parse_group_metadata,
    parse_subvolume_list,
)
from pgsnap.errors import (
    BackendError,
    BackendUnavailable,
    CommandTimeout,
    ConfigurationError,
    PgsnapError,
    SnapshotNotFound,
    UnsupportedCapability,
    VolumeNotFound,
)
from pgsnap.host import CommandResult, Host
from pgsnap.model import LocationKind, RestorePreparation
from pgsnap.protocols import Capability
from pgsnap.testing.runners import ScriptedRunner

# --------------------------------------------------------------------------- captured output

# `btrfs subvolume list -a -u -q /mnt/root`, where /mnt/root is `mount -o subvol=/@`
# (an Ubuntu-like layout): subvolumes below @ print from the top level, the others
# with <FS_TREE>/ in front.
LIST_VIA_AT = """\
ID 256 gen 7 top level 5 parent_uuid -                                    uuid 4aa8f75f-b201-fb40-b353-6548aa7c0b24 path <FS_TREE>/@
ID 257 gen 7 top level 5 parent_uuid -                                    uuid 8910465b-1dcc-434d-9437-eb4bf85222a8 path <FS_TREE>/@home
ID 258 gen 7 top level 256 parent_uuid -                                    uuid f9c6cb28-0865-1c45-ae09-924370c5974e path @/srv/pg/data
ID 259 gen 7 top level 256 parent_uuid -                                    uuid c4e39c93-8eae-e04c-8437-31c2e7698beb path @/srv/pg/wal
ID 260 gen 7 top level 256 parent_uuid f9c6cb28-0865-1c45-ae09-924370c5974e uuid 1785f093-9ba3-444c-b337-b618b8a6913f path @/srv/pg/snapshots/cg-1/s1
"""
LIST_VIA_AT_RO = """\
ID 260 gen 7 top level 256 parent_uuid f9c6cb28-0865-1c45-ae09-924370c5974e uuid 1785f093-9ba3-444c-b337-b618b8a6913f path @/srv/pg/snapshots/cg-1/s1
"""
# `btrfs subvolume list -t /mnt` and `-a` through a subvolume mount (/pgdata = subvol=/data).
LIST_A_VIA_SUBVOL = """\
ID 257 gen 7 top level 5 path <FS_TREE>/wal
ID 258 gen 12 top level 5 path <FS_TREE>/snaps/s1
ID 261 gen 12 top level 5 path <FS_TREE>/data
ID 262 gen 13 top level 261 path data/inner
ID 263 gen 13 top level 5 path <FS_TREE>/d1/d2/deep
"""

# Error messages (standard error, exit status 1 unless said).
NOT_BTRFS_LIST = "ERROR: not a btrfs filesystem: /tmp\nERROR: can't access '/tmp'"
NOT_BTRFS_SNAPSHOT = "ERROR: Not a Btrfs filesystem: Invalid argument"
NOT_A_SUBVOLUME = "ERROR: Not a Btrfs subvolume: Invalid argument"
MISSING = "ERROR: Could not statfs: No such file or directory"
READ_ONLY_SNAPSHOT = "ERROR: cannot snapshot 'mnt/wal': Read-only file system"
READ_ONLY_DELETE = "ERROR: Could not destroy subvolume/snapshot: Read-only file system"
READ_ONLY_MKDIR = "mkdir: cannot create directory '/mnt/snapshots/cg-x': Read-only file system"
NESTED_DELETE = "ERROR: Could not destroy subvolume/snapshot: Directory not empty"
BUSY_MV = "mv: cannot move 'mnt/wal/mp2' to 'mnt/wal/mp3': Device or resource busy"
NOT_ROOT = "ERROR: cannot access 'mnt': Permission denied\nERROR: can't access 'mnt'"
NOT_ROOT_SNAPSHOT = "ERROR: Could not statfs: Permission denied"
NO_SPACE_WRITE = "cat: write error: No space left on device"
# The format of btrfs-progs' snapshot error ("cannot snapshot '%s': %m") with ENOSPC.
NO_SPACE_SNAPSHOT = "ERROR: cannot snapshot '/srv/pg/wal': No space left on device"


def failed(stderr: str, argv: Sequence[str] = ("btrfs",), rc: int = 1) -> CommandResult:
    return CommandResult(tuple(argv), rc, b"", stderr.encode())


# --------------------------------------------------------------------------- parsing


def test_list_paths_are_all_from_the_top_level_with_a() -> None:
    subs = {s.id: s for s in parse_subvolume_list(LIST_VIA_AT)}
    assert subs[256].path == "@"
    assert subs[257].path == "@home"
    assert subs[258].path == "@/srv/pg/data"
    assert subs[258].top_level == 256
    assert subs[258].parent_uuid is None
    assert subs[260].parent_uuid == subs[258].uuid == "f9c6cb28-0865-1c45-ae09-924370c5974e"
    assert subs[260].uuid == "1785f093-9ba3-444c-b337-b618b8a6913f"
    quirk = {s.id: s.path for s in parse_subvolume_list(LIST_A_VIA_SUBVOL)}
    assert quirk == {257: "wal", 258: "snaps/s1", 261: "data", 262: "data/inner", 263: "d1/d2/deep"}


def test_list_lines_that_do_not_parse_are_skipped() -> None:
    text = "ID 5 gen 1 top level 0 path <FS_TREE>\ngarbage\nID x gen 1 top level 5 path a\n"
    text += "ID 300 gen 9 top level 5 parent_uuid - uuid u-1 path with path in it/x\n"
    (only,) = parse_subvolume_list(text)
    assert (only.id, only.path, only.uuid) == (300, "with path in it/x", "u-1")


def meta_doc(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": "pgsnap-btrfs-group",
        "version": 1,
        "id": "cg-20261201T050000000000Z-0123abcd",
        "name": "pgsnap-b1",
        "created_at": "2026-12-01T05:00:00+00:00",
        "snapshots": [
            {
                "id": "snap-20261201T050000000000Z-0123abcd-1",
                "volume_id": "/srv/pg/data",
                "volume_uuid": "f9c6cb28",
                "created_at": "2026-12-01T05:00:00.000100+00:00",
            }
        ],
    }
    doc.update(changes)
    return doc


def test_group_metadata_round_trips_and_ignores_unknown_keys() -> None:
    meta = parse_group_metadata(json.dumps(meta_doc(future_field=1)))
    assert meta.name == "pgsnap-b1"
    assert meta.snapshots[0].volume_id == "/srv/pg/data"
    assert meta.snapshots[0].created_at == dt.datetime(2026, 12, 1, 5, 0, 0, 100, tzinfo=dt.UTC)
    assert parse_group_metadata(meta.to_json()) == meta


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"format": "pgsnap-mock-state"}, "not a pgsnap-btrfs-group"),
        ({"version": 2}, "version 2"),
        ({"id": "../../etc"}, "malformed group id"),
        ({"snapshots": []}, "non-empty list"),
        ({"created_at": "2026-12-01T05:00:00"}, "no time zone"),
        ({"name": None}, "name"),
        (
            {
                "snapshots": [
                    {**meta_doc()["snapshots"][0], "id": "snap-20261201T050000000000Z-ffffffff-1"}
                ]
            },
            "not a snapshot of group",
        ),
        ({"snapshots": [{**meta_doc()["snapshots"][0], "volume_id": "data"}]}, "absolute"),
        ({"snapshots": [{**meta_doc()["snapshots"][0]}] * 2}, "twice"),
    ],
)
def test_bad_group_metadata_is_refused(changes: dict[str, Any], match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        parse_group_metadata(json.dumps(meta_doc(**changes)))


# --------------------------------------------------------------------------- error mapping


@pytest.mark.parametrize(
    ("stderr", "cls", "hint_says"),
    [
        (NOT_BTRFS_LIST, NotBtrfsError, "btrfs file system"),
        (NOT_BTRFS_SNAPSHOT, NotBtrfsError, "btrfs file system"),
        (BUSY_MV, SubvolumeBusyError, "unmount"),
        (NESTED_DELETE, NestedSubvolumeError, "btrfs subvolume list -o"),
        (NO_SPACE_WRITE, NoSpaceError, "free space"),
        (NO_SPACE_SNAPSHOT, NoSpaceError, "free space"),
        (READ_ONLY_SNAPSHOT, ReadOnlyFilesystemError, "remount"),
        (READ_ONLY_DELETE, ReadOnlyFilesystemError, "remount"),
        (READ_ONLY_MKDIR, ReadOnlyFilesystemError, "remount"),
        (NOT_ROOT, BtrfsPermissionError, "root"),
        (NOT_ROOT_SNAPSHOT, BtrfsPermissionError, "root"),
        (NOT_A_SUBVOLUME, BtrfsError, "btrfs-progs"),
        (MISSING, BtrfsError, "btrfs-progs"),
    ],
)
def test_failures_map_to_typed_errors_with_hints(
    stderr: str, cls: type[BtrfsError], hint_says: str
) -> None:
    err = classify_failure(failed(stderr, ("btrfs", "subvolume", "x")), what="x", volume_id="/v")
    assert type(err) is cls
    assert isinstance(err, BackendError)
    assert err.backend == "btrfs"
    assert hint_says in (err.hint or "")
    assert stderr.splitlines()[-1] in err.message
    assert err.details["volume_id"] == "/v"
    copy = pickle.loads(pickle.dumps(err))
    assert (type(copy), str(copy), copy.details) == (cls, str(err), err.details)


def test_a_missing_btrfs_program_says_install_btrfs_progs() -> None:
    err = classify_failure(failed("", ("btrfs", "subvolume", "list"), rc=127), what="listing")
    assert "not installed" in err.message
    assert "btrfs-progs" in (err.hint or "")


# --------------------------------------------------------------------------- a fake host

MOUNTS = {
    "filesystems": [
        {"source": "/dev/vda", "target": "/", "fstype": "ext4", "options": "rw,relatime"},
        {
            "source": "/dev/loop0[/@]",
            "target": "/mnt/root",
            "fstype": "btrfs",
            "options": "rw,relatime,discard=async,space_cache=v2,subvolid=256,subvol=/@",
        },
    ]
}
SELF_MOUNT = {
    "source": "/dev/loop0[/@/srv/pg/data]",
    "target": "/pgdata",
    "fstype": "btrfs",
    "options": "rw,relatime,discard=async,space_cache=v2,subvolid=258,subvol=/@/srv/pg/data",
}
DATA, WAL = "/mnt/root/srv/pg/data", "/mnt/root/srv/pg/wal"
SNAPDIR = "/mnt/root/srv/pg/snapshots"


class FakeRunner(ScriptedRunner):
    """Answers the commands the backend (and the Host it uses) runs; records them all.

    ``handlers`` are tried newest first; the first that returns a result wins.
    Unknown commands fail the test.
    """

    description = "fake"

    def __init__(self) -> None:
        super().__init__()
        self.mounts = json.loads(json.dumps(MOUNTS))
        self.listing = LIST_VIA_AT
        self.readonly = LIST_VIA_AT_RO
        self.groups: dict[str, str] = {}
        self.incomplete: list[str] = []
        self.users: list[str] = []
        """``/proc/<pid>/...`` links the process scan finds."""

    def default(self, args: list[str]) -> CommandResult:
        if args[:2] == ["realpath", "-m"]:
            return self.ok(args, args[-1].encode() + b"\0")
        if args[0] == "findmnt":
            return self.ok(args, json.dumps(self.mounts).encode())
        if args[:3] == ["btrfs", "subvolume", "list"]:
            text = self.readonly if "-r" in args else self.listing
            return self.ok(args, text.encode())
        if args[:2] == ["sh", "-c"] and "group.json" in args[2]:
            out = b""
            for gid, text in sorted(self.groups.items()):
                out += b"G\0" + gid.encode() + b"\0" + text.encode() + b"\0"
            for gid in self.incomplete:
                out += b"I\0" + gid.encode() + b"\0\0"
            return self.ok(args, out)
        if args[:2] == ["sh", "-c"] and "pgsnap-maps" in args[2]:  # processes_using
            return self.ok(args, b"4242\0" + b"".join(p.encode() + b"\0" for p in self.users))
        if args[:2] == ["sh", "-c"] or args[0] in ("btrfs", "mv", "rm"):
            return self.ok(args)
        if args[:2] == ["test", "-e"] or args[:2] == ["test", "-L"]:
            return CommandResult(tuple(args), 1, b"", b"")
        pytest.fail(f"unexpected command {args}")

    def btrfs_calls(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] == "btrfs" and c[2] != "list"]


@pytest.fixture
def runner() -> FakeRunner:
    return FakeRunner()


@pytest.fixture
def backend(runner: FakeRunner) -> BtrfsBackend:
    clock = iter(dt.datetime(2026, 12, 1, 5, 0, 0, i, tzinfo=dt.UTC) for i in range(1000))
    return BtrfsBackend(SNAPDIR, host=Host(runner, name="db1"), clock=lambda: next(clock))


def add_snapshot_of_data(runner: FakeRunner, gid_suffix: str = "0123abcd") -> str:
    """Metadata and a listed snapshot subvolume of DATA; returns the snapshot id."""
    gid = f"cg-20261201T050000000000Z-{gid_suffix}"
    sid = f"snap-20261201T050000000000Z-{gid_suffix}-1"
    doc = meta_doc(id=gid)
    doc["snapshots"][0].update(
        id=sid, volume_id=DATA, volume_uuid="f9c6cb28-0865-1c45-ae09-924370c5974e"
    )
    runner.groups[gid] = json.dumps(doc)
    line = (
        "ID 270 gen 9 top level 256 parent_uuid f9c6cb28-0865-1c45-ae09-924370c5974e "
        f"uuid 11111111-2222 path @/srv/pg/snapshots/{gid}/{sid}\n"
    )
    runner.listing += line
    runner.readonly += line
    return sid


# --------------------------------------------------------------------------- the backend


def test_volumes_are_the_writable_subvolumes_reached_through_the_mount(backend, runner) -> None:
    vols = backend.list_volumes()
    # @ is the mounted subvolume itself, @home is not reachable, s1 is read-only.
    assert [v.id for v in vols] == [DATA, WAL]
    assert vols[0].path == DATA and vols[0].name == "data"
    assert vols[0].extra == {
        "fs_path": "/@/srv/pg/data",
        "subvolume_id": "258",
        "uuid": "f9c6cb28-0865-1c45-ae09-924370c5974e",
    }
    assert backend.locate(DATA).kind is LocationKind.DIRECTORY
    assert backend.locate(DATA).path == DATA
    assert backend.restore_profile(DATA).before is RestorePreparation.NOTHING
    assert not backend.restore_profile(DATA).consumes_snapshot
    assert backend.get_volume(DATA + "/") == vols[0]  # the same path, normalized
    assert backend.capabilities == CAPABILITIES == frozenset({Capability.CLONES})
    for bad in ("/mnt/root", "/mnt/root/@home", "data", "/pgdata", ""):
        with pytest.raises(VolumeNotFound) as info:
            backend.get_volume(bad)
        assert info.value.volume_id == bad
        assert "btrfs subvolume list" in (info.value.hint or "")


def test_a_subvolume_also_mounted_by_itself_is_restored_unmounted(backend, runner) -> None:
    runner.mounts["filesystems"].append(SELF_MOUNT)
    profile = backend.restore_profile(DATA)
    assert profile.before is RestorePreparation.UNMOUNT
    location = backend.locate(DATA)
    assert (location.kind, location.path) == (LocationKind.BLOCK_DEVICE, "/dev/loop0")
    assert backend.get_volume(DATA).extra["mounted_at"] == "/pgdata"
    assert backend.restore_profile(WAL).before is RestorePreparation.NOTHING
    sid = add_snapshot_of_data(runner)
    with pytest.raises(SubvolumeBusyError, match="mounted by itself at /pgdata") as info:
        backend.restore_volume(DATA, sid)
    assert "subvolid" in (info.value.hint or "")
    assert runner.btrfs_calls() == []  # nothing was done
    assert not [c for c in runner.calls if c[0] == "mv"]


def test_a_snapshot_directory_off_btrfs_is_refused(runner) -> None:
    backend = BtrfsBackend("/srv/elsewhere/snapshots", host=Host(runner))
    with pytest.raises(NotBtrfsError, match="ext4") as info:
        backend.list_volumes()
    assert "snapshot_dir" in (info.value.hint or "")


def test_a_snapshot_directory_inside_a_volume_is_refused(runner) -> None:
    backend = BtrfsBackend(DATA + "/.snapshots", host=Host(runner))
    with pytest.raises(ConfigurationError, match="inside the subvolume"):
        backend.list_volumes()
    with pytest.raises(ConfigurationError, match="absolute"):
        BtrfsBackend("snapshots", host=Host(runner))


def test_snapshots_are_listed_from_metadata_checked_against_btrfs(backend, runner, caplog) -> None:
    sid = add_snapshot_of_data(runner)
    (snap,) = backend.list_snapshots()
    assert (snap.id, snap.volume_id, snap.name) == (sid, DATA, "pgsnap-b1")
    assert snap.extra["path"] == f"{SNAPDIR}/{snap.group_id}/{sid}"
    assert backend.list_snapshots(WAL) == ()
    # Metadata that does not parse, a snapshot whose parent is not the recorded volume,
    # a group being taken: none is listed, each with a warning.
    runner.groups["cg-20261201T060000000000Z-deadbeef"] = "{not json"
    other = add_snapshot_of_data(runner, "0badf00d")
    runner.listing = runner.listing.replace(
        f"parent_uuid f9c6cb28-0865-1c45-ae09-924370c5974e uuid 11111111-2222 path @/srv/pg/snapshots/cg-20261201T050000000000Z-0badf00d/{other}",
        f"parent_uuid 99999999 uuid 11111111-2222 path @/srv/pg/snapshots/cg-20261201T050000000000Z-0badf00d/{other}",
    )
    runner.incomplete.append("cg-20261201T070000000000Z-00000000")
    with caplog.at_level(logging.WARNING, logger="pgsnap.backends.btrfs"):
        assert [s.id for s in backend.list_snapshots()] == [sid]
    text = caplog.text
    assert "group.json is unreadable" in text
    assert "is not the read-only snapshot" in text
    assert "cg-20261201T070000000000Z-00000000" in text
    with pytest.raises(SnapshotNotFound):
        backend.get_snapshot_group("cg-20261201T050000000000Z-0badf00d")


def test_a_group_failing_at_its_second_volume_deletes_the_first(backend, runner) -> None:
    def enospc(args: list[str], _stdin: bytes | None) -> CommandResult | None:
        if args[:3] == ["btrfs", "subvolume", "snapshot"] and args[-2] == WAL:
            return failed(NO_SPACE_SNAPSHOT, args)
        return None

    runner.on(enospc)
    with pytest.raises(NoSpaceError) as info:
        backend.create_snapshot_group([DATA, WAL], "b1")
    err = info.value
    assert err.details["volume_id"] == WAL
    assert "at volume '/mnt/root/srv/pg/wal' (2 of 2)" in err.message
    assert "no snapshot of the group was kept" in err.message
    snapshots = [c for c in runner.calls if c[:3] == ["btrfs", "subvolume", "snapshot"]]
    assert [c[3:5] for c in snapshots] == [["-r", DATA], ["-r", WAL]]
    first = snapshots[0][-1]
    gdir = first.rsplit("/", 1)[0]
    assert gdir.startswith(SNAPDIR + "/cg-")
    assert ["btrfs", "subvolume", "delete", first] in runner.calls
    assert ["rm", "-rf", "--one-file-system", "--", gdir] in runner.calls
    assert runner.stdin == {}  # no metadata was written
    assert pickle.loads(pickle.dumps(err)).details == err.details


def test_a_group_writes_its_metadata_last(backend, runner: FakeRunner) -> None:
    def remember(args: list[str], stdin: bytes | None) -> CommandResult | None:
        if args[:2] == ["sh", "-c"] and stdin is not None:
            gid = args[4].split("/")[-2]
            runner.groups[gid] = stdin.decode()
            sids = [s["id"] for s in json.loads(stdin)["snapshots"]]
            for n, (sid, vol) in enumerate(zip(sids, (DATA, WAL), strict=True)):
                uuid = (
                    "f9c6cb28-0865-1c45-ae09-924370c5974e"
                    if vol == DATA
                    else ("c4e39c93-8eae-e04c-8437-31c2e7698beb")
                )
                line = (
                    f"ID {280 + n} gen 9 top level 256 parent_uuid {uuid} uuid u{n} "
                    f"path @/srv/pg/snapshots/{gid}/{sid}\n"
                )
                runner.listing += line
                runner.readonly += line
            return runner.ok(args)
        return None

    runner.on(remember)
    group = backend.create_snapshot_group([DATA, WAL], "pgsnap-b1")
    assert [s.volume_id for s in group.snapshots] == [DATA, WAL]
    assert group.snapshots[0].created_at < group.snapshots[1].created_at
    order = [c[:3] for c in runner.calls if c[0] == "btrfs" and c[2] != "list"]
    assert order == [["btrfs", "subvolume", "snapshot"]] * 2
    write = max(i for i in runner.stdin)
    last_snapshot = max(i for i, c in enumerate(runner.calls) if c[2:3] == ["snapshot"])
    assert write > last_snapshot
    assert runner.calls[write][4] == f"{SNAPDIR}/{group.id}/group.json"
    doc = json.loads(runner.stdin[write])
    assert [s["volume_uuid"] for s in doc["snapshots"]] == [
        "f9c6cb28-0865-1c45-ae09-924370c5974e",
        "c4e39c93-8eae-e04c-8437-31c2e7698beb",
    ]


def test_a_busy_swap_changes_nothing(backend, runner) -> None:
    sid = add_snapshot_of_data(runner)

    def busy(args: list[str], _stdin: bytes | None) -> CommandResult | None:
        if args[0] == "mv" and args[3] == DATA:
            return failed(BUSY_MV, args)
        return None

    runner.on(busy)
    with pytest.raises(SubvolumeBusyError) as info:
        backend.restore_volume(DATA, sid)
    assert info.value.details["volume_id"] == DATA
    staging = next(c[-1] for c in runner.calls if c[2:3] == ["snapshot"])
    assert staging.startswith("/mnt/root/srv/pg/.data.pgsnap-restore-")
    assert ["btrfs", "subvolume", "delete", staging] in runner.calls  # no leftover
    assert [c for c in runner.calls if c[0] == "mv"] == [
        ["mv", "-T", "--", DATA, staging.replace("restore", "old")]
    ]


def test_a_swap_runs_snapshot_rename_rename_sync_delete(backend, runner) -> None:
    sid = add_snapshot_of_data(runner)
    backend.restore_volume(DATA, sid)
    assert backend.settle(timeout=10)
    steps = [c for c in runner.calls if c[0] == "mv" or (c[0] == "btrfs" and c[2] != "list")]
    staging = steps[0][-1]
    old = staging.replace("pgsnap-restore", "pgsnap-old")
    snap_path = f"{SNAPDIR}/cg-20261201T050000000000Z-0123abcd/{sid}"
    assert steps == [
        ["btrfs", "subvolume", "snapshot", snap_path, staging],
        ["mv", "-T", "--", DATA, old],
        ["mv", "-T", "--", staging, DATA],
        ["btrfs", "filesystem", "sync", "/mnt/root/srv/pg"],
        ["btrfs", "subvolume", "delete", old],
    ]


def test_the_old_subvolume_is_deleted_behind_the_restore(backend, runner, caplog) -> None:
    """Deleting the subvolume a swap replaced drops its pages from memory (1.7 s for
    15 GB a crashed server left cached): the restore returns without waiting for it,
    settle() waits, and a failed delete is a warning naming the subvolume."""
    sid = add_snapshot_of_data(runner)
    started, release = threading.Event(), threading.Event()

    def slow_then_failing_delete(args: list[str], _stdin: bytes | None) -> CommandResult | None:
        if args[:3] == ["btrfs", "subvolume", "delete"]:
            started.set()
            release.wait(10)
            return failed(
                "ERROR: Could not destroy subvolume/snapshot: Device or resource busy", args
            )
        return None

    runner.on(slow_then_failing_delete)
    backend.restore_volume(DATA, sid)  # returns while the delete is blocked
    assert started.wait(10)
    assert not backend.settle(timeout=0.05)
    with caplog.at_level(logging.WARNING, logger="pgsnap.backends.btrfs"):
        release.set()
        assert backend.settle(timeout=10)
    old = next(c[-1] for c in runner.calls if c[:3] == ["btrfs", "subvolume", "delete"])
    assert ".data.pgsnap-old-" in old
    assert any(
        old in r.getMessage() and "could not be deleted" in r.getMessage() for r in caplog.records
    )
    assert backend.settle(timeout=0)  # nothing pending


def test_restoring_another_volumes_snapshot_is_refused(backend, runner) -> None:
    sid = add_snapshot_of_data(runner)
    with pytest.raises(BackendError) as info:
        backend.restore_volume(WAL, sid)
    assert not isinstance(info.value, LookupError)
    assert "can only restore its own volume" in info.value.message
    with pytest.raises(SnapshotNotFound):
        backend.restore_volume(DATA, "snap-20261201T050000000000Z-0123abcd-9")
    assert runner.btrfs_calls() == []


def test_a_timed_out_command_is_unavailable_and_says_frozen(backend, runner) -> None:
    def hang(args: list[str], _stdin: bytes | None) -> CommandResult | None:
        if args[:3] == ["btrfs", "subvolume", "list"]:
            raise CommandTimeout("timed out", argv=args, returncode=-9, host="fake")
        return None

    runner.on(hang)
    with pytest.raises(BackendUnavailable) as info:
        backend.list_volumes()
    assert info.value.retryable
    assert "fsfreeze -u" in (info.value.hint or "")


def test_what_btrfs_lacks_is_refused(backend) -> None:
    for call in (
        lambda: backend.attach(DATA, "db1"),
        lambda: backend.detach(DATA, "db1"),
        lambda: backend.pause_policy("p"),
        lambda: backend.resume_policy("p"),
        lambda: backend.create_snapshot_group([DATA], "s", secure=True),
    ):
        with pytest.raises(UnsupportedCapability):
            call()
    assert backend.list_policies() == ()


def test_commands_are_argument_lists_and_scripts_take_data_as_arguments(backend, runner) -> None:
    sid = add_snapshot_of_data(runner)
    backend.list_volumes()
    backend.list_snapshots()
    backend.restore_volume(DATA, sid)
    backend.delete_snapshot(sid)
    for call in runner.calls:
        if call[:2] == ["sh", "-c"]:
            script = call[2]
            assert SNAPDIR not in script and DATA not in script, "data pasted into a script"
    assert any(c[:3] == ["btrfs", "subvolume", "delete"] for c in runner.calls)


def test_every_error_is_a_pgsnap_error(runner) -> None:
    runner.on(lambda args, _s: failed(NOT_ROOT, args) if args[0] == "btrfs" else None)
    backend = BtrfsBackend(SNAPDIR, host=Host(runner))
    with pytest.raises(BtrfsPermissionError) as info:
        backend.list_snapshots()
    assert isinstance(info.value, PgsnapError)
    assert "root" in (info.value.hint or "")


# --------------------------------------------------------------------------- where btrfs cannot run


def test_without_root_a_loop_mounted_btrfs_is_refused_saying_why(monkeypatch) -> None:
    from pgsnap.testing import btrfs as testing_btrfs

    monkeypatch.setattr("pgsnap.testing.btrfs.os.geteuid", lambda: 1000)
    reason = testing_btrfs.btrfs_unavailable()
    assert reason is not None and "root" in reason
    with pytest.raises(ConfigurationError, match="needs root") as info:
        testing_btrfs.LoopBtrfs.create()
    assert info.value.hint


def test_without_btrfs_progs_the_reason_says_install_it(monkeypatch) -> None:
    from pgsnap.testing import btrfs as testing_btrfs

    monkeypatch.setattr("pgsnap.testing.btrfs.os.geteuid", lambda: 0)
    monkeypatch.setattr(testing_btrfs, "_kernel_has_btrfs", lambda: True)
    monkeypatch.setattr("pgsnap.testing.btrfs.os.path.exists", lambda path: True)
    real_which = shutil.which
    monkeypatch.setattr(
        "pgsnap.testing.btrfs.shutil.which",
        lambda name: None if name in ("mkfs.btrfs", "btrfs") else real_which(name) or name,
    )
    reason = testing_btrfs.btrfs_unavailable()
    assert reason == "missing program(s): mkfs.btrfs, btrfs (apt-get install btrfs-progs)"


def test_the_btrfs_demo_says_why_it_cannot_run(monkeypatch, capsys) -> None:
    from pgsnap.cli import EXIT_USAGE, main
    from pgsnap.testing import btrfs as testing_btrfs

    monkeypatch.setattr(testing_btrfs, "btrfs_unavailable", lambda: "the kernel has no btrfs")
    assert main(["demo", "--backend", "btrfs"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "pgsnap demo --backend btrfs cannot run on this machine: the kernel has no btrfs" in err
    assert "mock backend" in err


# --------------------------------------------------------------------------- configuration


def test_a_configuration_file_builds_a_btrfs_backend_on_the_database_host(tmp_path) -> None:
    """``snapshot_dir`` is relative to the file; the backend runs on the [host]'s host."""
    from pgsnap.cli import load_cluster

    (tmp_path / "archive").mkdir()
    config = tmp_path / "pgsnap.toml"
    config.write_text(
        f"""
[host]
name = "db1"

[database]
conninfo = "host=/nonexistent dbname=postgres"
data_directory = "{DATA}"

[storage]
backend = "btrfs"

[storage.options]
snapshot_dir = "snapshots"
wait_for_cleaner = true

[archive]
path = "archive"

[catalog]
path = "catalog"

[[volume]]
id = "{DATA}"
role = "data"
mount_point = "{DATA}"

[[volume]]
id = "{WAL}"
role = "wal"
mount_point = "{WAL}"
"""
    )
    cluster = load_cluster(config)
    backend = cluster.backend
    assert isinstance(backend, BtrfsBackend)
    assert backend.snapshot_dir == str(tmp_path / "snapshots")
    assert backend.host is cluster.adapter.host
    assert backend.host.name == "db1"
    assert "wait_for_cleaner=True" in repr(backend)
    assert [v.id for v in cluster.layout.volumes] == [DATA, WAL]


def test_a_volume_a_process_still_uses_is_not_swapped(backend, runner: FakeRunner) -> None:
    """A server that was not stopped would go on writing to the old subvolume."""
    sid = add_snapshot_of_data(runner)
    runner.users = ["/proc/777/cwd"]

    def proc(args: list[str], _stdin: bytes | None) -> CommandResult | None:
        if args[:2] == ["sh", "-c"] and "Uid:" in args[2]:  # what the process is
            assert args[4:] == ["777"]
            return runner.ok(
                args, b"777\x00postgres\x00777 (postgres) S 1 777\x00" + DATA.encode() + b"x\x00"
            )
        return None

    runner.on(proc)
    with pytest.raises(SubvolumeBusyError, match="in use") as info:
        backend.restore_volume(DATA, sid)
    assert "stop" in (info.value.hint or "")
    assert info.value.details["holders"] == ("pid 777 postgres (user postgres)",)
    assert runner.btrfs_calls() == []
    assert not [c for c in runner.calls if c[0] == "mv"]


def test_an_observation_looks_at_the_file_system_once(backend, runner: FakeRunner) -> None:
    """Issue 27 ("fewer storage calls"): the questions one observation asks share one
    view (realpath, findmnt and two subvolume listings: four commands a question
    before); a change drops it; the next observation looks again, so a freshness check
    sees what another process changed meanwhile."""

    def looks() -> int:
        return sum(1 for c in runner.calls if c[0] == "findmnt")

    sid = add_snapshot_of_data(runner)
    with backend.observation():
        backend.list_volumes()
        backend.locate(DATA)
        backend.restore_profile(DATA)
        backend.list_snapshots()
        with backend.observation():  # nested: the same view
            backend.get_volume(DATA)
        assert looks() == 1
        backend.delete_snapshot(sid)  # a change
        after = looks()
        backend.list_volumes()
        backend.list_volumes()
        assert looks() == after + 1  # looked once again after the change, then shared
    backend.list_volumes()
    backend.list_volumes()
    assert looks() == after + 3  # outside an observation: every call looks
    with backend.observation():
        runner.listing = runner.listing.replace("path @/srv/pg/snapshots/", "path @/gone/")
        runner.readonly = runner.readonly.replace("path @/srv/pg/snapshots/", "path @/gone/")
        assert backend.list_snapshots(DATA) == ()  # another process's change is seen


# --------------------------------------------------------------------------- group metadata


def _group_dirs(root) -> None:
    """A snapshot directory as pgsnap leaves it, and what else may be in it."""
    for gid, body in (
        ("cg-20260101T000000000000Z-0000000a", b'{"id": "a"}'),
        ("cg-20260102T000000000000Z-0000000b", '{"id": "b é"}'.encode()),
    ):
        (root / gid).mkdir(parents=True)
        (root / gid / "group.json").write_bytes(body)
    (root / "cg-20260103T000000000000Z-0000000c").mkdir()  # being taken: no metadata yet
    (root / "cg-20260104T000000000000Z-0000000d").write_text("a file, not a group")
    (root / "cg-not-a-group-name").mkdir()
    (root / "cg-not-a-group-name" / "group.json").write_text("{}")
    (root / "other").mkdir()
    (root / "cg-20260105T000000000000Z-0000000e").mkdir()
    (root / "cg-20260105T000000000000Z-0000000e" / "group.json").mkdir()  # not a file


def test_group_metadata_is_read_in_process_here_as_the_script_reads_it(
    tmp_path, monkeypatch
) -> None:
    """On this machine the groups' metadata is read without a process (the script
    runs a `cat` per group: 70 ms for 70 groups); over any other runner the script
    runs. Both read the same groups, complete and incomplete."""
    from pgsnap.host import LocalRunner

    class Counting(LocalRunner):  # a subclass: not "this machine's own" runner
        calls = 0

        def run(self, *args: Any, **kwargs: Any) -> CommandResult:
            type(self).calls += 1
            return super().run(*args, **kwargs)

    snapdir = tmp_path / "snapshots"
    _group_dirs(snapdir)
    here = BtrfsBackend(str(snapdir), host=Host())
    over_commands = BtrfsBackend(str(snapdir), host=Host(Counting()))
    assert Host().local and not Host(Counting()).local
    expected = (
        {
            "cg-20260101T000000000000Z-0000000a": '{"id": "a"}',
            "cg-20260102T000000000000Z-0000000b": '{"id": "b é"}',
        },
        ["cg-20260103T000000000000Z-0000000c", "cg-20260105T000000000000Z-0000000e"],
    )
    assert over_commands._read_groups() == expected
    assert Counting.calls == 1

    def no_process(self: Any, *args: Any, **kwargs: Any) -> CommandResult:
        raise AssertionError(f"ran {args[0] if args else kwargs}")

    with monkeypatch.context() as m:
        m.setattr(LocalRunner, "run", no_process)
        assert here._read_groups() == expected
    missing = tmp_path / "no-snapshots-yet"
    assert BtrfsBackend(str(missing), host=Host())._read_groups() == ({}, [])
    assert BtrfsBackend(str(missing), host=Host(Counting()))._read_groups() == ({}, [])
