"""The conformance suite, and btrfs's own promises, on a real loop-mounted btrfs.

Every test gets a fresh btrfs file system (a sparse image on a loop device,
about 0.15 s to make), so nothing leaks from one test to the next. Volumes
are subvolumes under ``<mount>/vols``; snapshots go to ``<mount>/snapshots``.
Without root, btrfs or loop devices the tests skip saying why (and fail in
CI, where ``PGSNAP_NO_SKIPS=1``).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgsnap.backends.btrfs import (
    BtrfsBackend,
    NoSpaceError,
    NotBtrfsError,
    ReadOnlyFilesystemError,
    SubvolumeBusyError,
    parse_subvolume_list,
)
from pgsnap.errors import SnapshotNotFound
from pgsnap.model import LocationKind, RestorePreparation
from pgsnap.protocols import Capability
from pgsnap.testing.btrfs import LoopBtrfs, btrfs_unavailable
from pgsnap.testing.conformance import (
    MakeVolume,
    ReadMarker,
    StorageBackendConformance,
    WriteMarker,
)

pytestmark = pytest.mark.xdist_group("loop")

MARKER = "marker"


@pytest.fixture
def fs() -> Iterator[LoopBtrfs]:
    """A fresh loop-mounted btrfs for one test (skips, saying why, where impossible)."""
    reason = btrfs_unavailable()
    if reason is not None:
        pytest.skip(f"no loop-mounted btrfs on this machine: {reason}")
    with LoopBtrfs.create(size=1 << 30) as made:
        (made.mount_point / "vols").mkdir()
        yield made


def subvolumes(fs: LoopBtrfs) -> dict[str, tuple[str, str | None]]:
    """``{path: (uuid, parent uuid)}`` of every subvolume, as btrfs lists them."""
    out = subprocess.run(
        ["btrfs", "subvolume", "list", "-a", "-u", "-q", str(fs.mount_point)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return {s.path: (s.uuid, s.parent_uuid) for s in parse_subvolume_list(out)}


class TestBtrfsConformance(StorageBackendConformance):
    """The whole suite: clones declared, no consistency groups, no mapping, no policies."""

    declared_capabilities = frozenset({Capability.CLONES})

    @pytest.fixture
    def backend(self, fs: LoopBtrfs) -> BtrfsBackend:
        return BtrfsBackend(str(fs.mount_point / "snapshots"))

    @pytest.fixture
    def make_volume(self, fs: LoopBtrfs) -> MakeVolume:
        made: list[str] = []

        def make(name: str) -> str:
            path = fs.subvolume(f"vols/{name}-{len(made)}")
            (path / "sub").mkdir()
            (path / "sub" / "file").write_text("constant")
            made.append(str(path))
            return str(path)

        return make

    @pytest.fixture
    def write_marker(self) -> WriteMarker:
        def write(volume_id: str, data: bytes) -> None:
            path = Path(volume_id)
            # A new file name each time as well, to check that a restore removes files.
            for old in path.glob("marker*"):
                old.unlink()
            (path / MARKER).write_bytes(data)
            (path / f"marker-{data.hex()}").touch()

        return write

    @pytest.fixture
    def read_marker(self) -> ReadMarker:
        def read(volume_id: str) -> bytes:
            path = Path(volume_id)
            data = (path / MARKER).read_bytes()
            names = sorted(p.name for p in path.glob("marker*"))
            assert names == sorted([MARKER, f"marker-{data.hex()}"]), names
            assert (path / "sub" / "file").read_text() == "constant"
            return data

        return read


# --------------------------------------------------------------------------- btrfs's own


@pytest.fixture
def backend(fs: LoopBtrfs) -> BtrfsBackend:
    return BtrfsBackend(str(fs.mount_point / "snapshots"))


def test_a_new_backend_lists_the_same_snapshots_and_groups(fs: LoopBtrfs, backend) -> None:
    """Everything pgsnap knows is on the file system: metadata beside the snapshots."""
    a, b = fs.subvolume("vols/a"), fs.subvolume("vols/b")
    g1 = backend.create_snapshot_group([str(a), str(b)], "first")
    g2 = backend.create_snapshot_group([str(b)], "second")
    backend.delete_snapshot(g1.for_volume(str(b)).id)

    again = BtrfsBackend(str(fs.mount_point / "snapshots"))
    assert again.list_snapshots() == backend.list_snapshots()
    assert [s.id for s in again.list_snapshots()] == [
        g1.for_volume(str(a)).id,
        g2.snapshots[0].id,
    ]
    assert again.get_snapshot_group(g1.id) == backend.get_snapshot_group(g1.id)
    assert again.get_snapshot_group(g2.id).name == "second"
    # The metadata is a small JSON file in the group's directory.
    doc = json.loads((fs.mount_point / "snapshots" / g1.id / "group.json").read_text())
    assert doc["format"] == "pgsnap-btrfs-group"
    assert [s["volume_id"] for s in doc["snapshots"]] == [str(a)]
    # Snapshots are read-only subvolumes whose parent is the volume.
    listed = subvolumes(fs)
    snap_path = f"snapshots/{g1.id}/{g1.for_volume(str(a)).id}"
    assert listed[snap_path][1] == listed["vols/a"][0]


def test_snapshots_are_read_only_and_group_members_are_taken_one_by_one(fs, backend) -> None:
    a, b = fs.subvolume("vols/a"), fs.subvolume("vols/b")
    group = backend.create_snapshot_group([str(a), str(b)], "g")
    first, second = group.snapshots
    assert first.created_at < second.created_at  # not one instant: no consistency groups
    with pytest.raises(OSError, match="Read-only"):
        (Path(first.extra["path"]) / "x").write_text("no")


def test_restore_swaps_in_a_writable_snapshot_and_deletes_the_old_subvolume(fs, backend) -> None:
    data = fs.subvolume("vols/data")
    os.chown(data, 1234, 5678)
    data.chmod(0o700)
    (data / "f").write_text("at snapshot")
    snap = backend.create_snapshot_group([str(data)], "b").snapshots[0]
    (data / "f").write_text("later")
    (data / "new").write_text("after the snapshot")
    before = subvolumes(fs)["vols/data"][0]

    backend.restore_volume(str(data), snap.id)
    assert backend.settle(timeout=60)  # the old subvolume is deleted behind the restore

    after = subvolumes(fs)
    assert after["vols/data"][0] != before  # a new subvolume at the same path...
    assert after["vols/data"][1] == snap.extra["uuid"]  # ...snapshotted from the backup's
    assert before not in {uuid for uuid, _parent in after.values()}  # the old one is gone
    assert not [p for p in after if ".pgsnap-" in p]  # and nothing is left over
    assert (data / "f").read_text() == "at snapshot"
    assert not (data / "new").exists()
    st = data.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (1234, 5678, 0o700)
    (data / "f").write_text("writable")  # the restored volume is writable
    assert snap.id in {s.id for s in backend.list_snapshots(str(data))}  # the backup stays


def test_a_subvolume_mounted_by_itself_must_be_unmounted(fs, backend) -> None:
    """Profile UNMOUNT, the device to mount again, and a refusal while it is mounted."""
    data = fs.subvolume("vols/data")
    (data / "f").write_text("v1")
    snap = backend.create_snapshot_group([str(data)], "b").snapshots[0]
    (data / "f").write_text("v2")
    assert backend.restore_profile(str(data)).before is RestorePreparation.NOTHING
    assert backend.locate(str(data)).kind is LocationKind.DIRECTORY

    mount_point = fs.base / "pgdata"
    mount_point.mkdir()
    subprocess.run(
        ["mount", "-o", "subvol=/vols/data", fs.device, str(mount_point)],
        check=True,
        capture_output=True,
    )
    try:
        assert backend.restore_profile(str(data)).before is RestorePreparation.UNMOUNT
        location = backend.locate(str(data))
        assert (location.kind, location.path) == (LocationKind.BLOCK_DEVICE, fs.device)
        assert backend.get_volume(str(data)).extra["mounted_at"] == str(mount_point)
        with pytest.raises(SubvolumeBusyError, match="mounted by itself") as info:
            backend.restore_volume(str(data), snap.id)
        assert "unmount" in (info.value.hint or "")
        assert (mount_point / "f").read_text() == "v2"  # untouched
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)
    backend.restore_volume(str(data), snap.id)
    assert backend.restore_profile(str(data)).before is RestorePreparation.NOTHING
    # Mounted again by its path it shows the restored content; by its old id it cannot be.
    subprocess.run(
        ["mount", "-o", "subvol=/vols/data", fs.device, str(mount_point)],
        check=True,
        capture_output=True,
    )
    try:
        assert (mount_point / "f").read_text() == "v1"
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def test_a_snapshot_directory_off_btrfs_is_not_btrfs(tmp_path: Path) -> None:
    fstype = subprocess.run(
        ["findmnt", "-n", "-o", "FSTYPE", "-T", str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert fstype != "btrfs", "this test needs a snapshot directory that is not on btrfs"
    backend = BtrfsBackend(str(tmp_path / "snapshots"))
    with pytest.raises(NotBtrfsError) as info:
        backend.list_volumes()
    assert fstype in str(info.value)
    assert info.value.hint


def test_a_read_only_file_system_is_refused_with_nothing_left(fs, backend) -> None:
    a = fs.subvolume("vols/a")
    subprocess.run(["mount", "-o", "remount,ro", str(fs.mount_point)], check=True)
    try:
        with pytest.raises(ReadOnlyFilesystemError) as info:
            backend.create_snapshot_group([str(a)], "ro")
        assert "read-write" in (info.value.hint or "")
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(fs.mount_point)], check=True)
    assert backend.list_snapshots() == ()


def test_a_full_file_system_is_no_space_with_nothing_left(fs, backend) -> None:
    a = fs.subvolume("vols/a")
    kept = backend.create_snapshot_group([str(a)], "before")
    fill = subprocess.run(
        ["dd", "if=/dev/zero", f"of={a}/fill", "bs=4M", "status=none"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert "No space left on device" in fill.stderr
    with pytest.raises(NoSpaceError) as info:
        backend.create_snapshot_group([str(a)], "full")
    assert "no snapshot of the group was kept" in str(info.value)
    assert backend.get_snapshot_group(kept.id).name == "before"
    assert backend.list_snapshots() == kept.snapshots
    assert sorted(p.name for p in (fs.mount_point / "snapshots").iterdir()) == [kept.id]
    # A restore still works on a full file system (and frees the space of the old one).
    backend.restore_volume(str(a), kept.snapshots[0].id)
    assert not (a / "fill").exists()


def test_an_interrupted_group_is_not_listed_and_can_be_removed(fs, backend) -> None:
    a = fs.subvolume("vols/a")
    done = backend.create_snapshot_group([str(a)], "done")
    # What a process killed while taking a group leaves: a directory, a snapshot, no metadata.
    stale = "cg-20200101T000000000000Z-0badc0de"
    (fs.mount_point / "snapshots" / stale).mkdir()
    subprocess.run(
        [
            "btrfs",
            "subvolume",
            "snapshot",
            "-r",
            str(a),
            str(fs.mount_point / "snapshots" / stale / "snap-20200101T000000000000Z-0badc0de-1"),
        ],
        check=True,
        capture_output=True,
    )
    assert backend.list_snapshots() == done.snapshots
    assert backend.ex_incomplete_groups() == (str(fs.mount_point / "snapshots" / stale),)
    with pytest.raises(SnapshotNotFound):
        backend.get_snapshot_group(stale)
    assert backend.ex_remove_incomplete() == (str(fs.mount_point / "snapshots" / stale),)
    assert backend.ex_incomplete_groups() == ()
    assert not [p for p in subvolumes(fs) if stale in p]
    assert backend.list_snapshots() == done.snapshots


def test_wait_for_cleaner_commits_and_waits(fs) -> None:
    a = fs.subvolume("vols/a")
    (a / "data").write_bytes(os.urandom(32 << 20))  # work for the cleaner
    backend = BtrfsBackend(str(fs.mount_point / "snapshots"), wait_for_cleaner=True)
    group = backend.create_snapshot_group([str(a)], "g")
    backend.delete_snapshot_group(group.id)
    deleted = subprocess.run(
        ["btrfs", "subvolume", "list", "-d", str(fs.mount_point)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert deleted.strip() == ""  # nothing waits for the cleaner any more
    assert backend.list_snapshots() == ()


def test_a_volume_in_use_is_not_swapped(fs, backend) -> None:
    """A process working in the volume (a server that was not stopped) is named, and
    the volume is left alone until it is gone."""
    data = fs.subvolume("vols/data")
    (data / "f").write_text("v1")
    snap = backend.create_snapshot_group([str(data)], "b").snapshots[0]
    (data / "f").write_text("v2")
    proc = subprocess.Popen(["sleep", "60"], cwd=data)
    try:
        with pytest.raises(SubvolumeBusyError, match=f"pid {proc.pid} sleep") as info:
            backend.restore_volume(str(data), snap.id)
        assert "stop" in (info.value.hint or "")
        assert (data / "f").read_text() == "v2"
    finally:
        proc.kill()
        proc.wait()
    backend.restore_volume(str(data), snap.id)
    assert (data / "f").read_text() == "v1"


def test_the_mock_clones_files_copy_on_write_on_btrfs(fs: LoopBtrfs) -> None:
    """The mock's snapshots on a file system with reflinks (issue 26): a snapshot of an
    unchanged file shares its blocks (FICLONE), and writing either side leaves the other
    as it was; the mock's disk usage says what full copies would take."""
    from pgsnap.backends.mock import MockBackend
    from pgsnap.backends.mock._files import reflink

    src, dst = fs.mount_point / "vols" / "a", fs.mount_point / "vols" / "b"
    src.write_bytes(b"x" * 1_000_000)
    assert reflink(src, dst)
    assert dst.read_bytes() == b"x" * 1_000_000
    dst.write_bytes(b"y" * 10)
    assert src.read_bytes() == b"x" * 1_000_000
    volume = fs.mount_point / "vols" / "pgdata"
    volume.mkdir()
    (volume / "big").write_bytes(b"z" * 4_000_000)
    backend = MockBackend(root=fs.mount_point / "mock")
    vid = backend.add_volume("data", path=volume).id
    for label in ("b1", "b2", "b3"):
        backend.create_snapshot_group([vid], label)
    shared = subprocess.run(
        ["btrfs", "filesystem", "du", "--raw", "-s", str(fs.mount_point / "mock")],
        check=True, capture_output=True, text=True,
    ).stdout.splitlines()[-1].split()  # fmt: skip
    # btrfs' own count ("Total  Exclusive  Set shared"): the three snapshots hold no
    # block of their own; they share the volume's (one copy's worth, 4 MB).
    exclusive, set_shared = int(shared[1]), int(shared[2])
    assert exclusive == 0 and 4_000_000 <= set_shared < 5_000_000, shared
    assert backend.disk_usage()[1] == 3 * 4_000_000
    # Three files, not one linked three times: reflinks, which need no comparison.
    assert len({os.stat(p).st_ino for p in (fs.mount_point / "mock").rglob("big")}) == 3
