"""The conformance suite, and lvm's own promises, on real lvm2 inside the test VM.

One VM serves this module (:func:`lvm_vm` in tests/conftest.py); its disk
``/dev/vda`` holds the volume group ``pgsnapvg`` with a thin pool ``pool``.
After each test every other LV is removed, so nothing leaks from one test to
the next. The suite runs twice: on thin volumes (thin snapshots, a copy is
merged, the snapshot survives) and on plain linear volumes (classic
copy-on-write snapshots, merged and consumed). Markers are written straight
onto the block device (``dd``), with a constant block further in that every
read checks.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pgsnap.backends.lvm import (
    LvExistsError,
    LvInUseError,
    LvmBackend,
    LvmNoSpaceError,
    SnapshotInvalidError,
    VolumeGroupNotFound,
    classify_failure,
    parse_lvs_json,
)
from pgsnap.errors import BackendError, SnapshotNotFound, VolumeNotFound
from pgsnap.host import Host
from pgsnap.model import LocationKind, RestorePreparation
from pgsnap.protocols import Capability
from pgsnap.testing.conformance import (
    MakeVolume,
    ReadMarker,
    StorageBackendConformance,
    WriteMarker,
)

pytestmark = pytest.mark.xdist_group("lvm-conformance")

VG = "pgsnapvg"
POOL = "pool"
BLOCK = 4096
CONSTANT_OFFSET = 1 << 20  # 1 MiB into the volume
CONSTANT = b"constant-block".ljust(BLOCK, b"\xa5")


_CHANGES = frozenset({"lvcreate", "lvconvert", "lvrename", "lvchange", "mount", "dd"})
"""Commands after which a test's volume group needs cleaning (mkfs runs on an LV it made)."""


@pytest.fixture(scope="module")
def vm_host(lvm_vm: Any) -> Host:
    """The VM's host with the volume group and thin pool made once per module; its
    runner notes when a command changed what :func:`_clean` removes."""
    host: Host = lvm_vm.host
    if host.run(["vgs", VG], check=False).returncode != 0:
        host.run(["pvcreate", "-q", "-y", "/dev/vda"])
        host.run(["vgcreate", "-q", VG, "/dev/vda"])
        host.run(["lvcreate", "-q", "-T", "-L", "1G", f"{VG}/{POOL}"])
    runner = host.runner
    real = runner.run

    def run(argv: Any, **kwargs: Any) -> Any:
        if _CHANGES.intersection(argv):
            host.changed = True  # type: ignore[attr-defined]
        return real(argv, **kwargs)

    runner.run = run  # type: ignore[method-assign]
    _clean(host)
    return host


def _clean(host: Host) -> None:
    """Remove every LV of the VG but the thin pool (unmounting what is mounted below
    /mnt), in one command."""
    script = (
        "awk '$2 ~ \"^/mnt/\" {print $2}' /proc/mounts | xargs -r -n1 umount -l; "
        f"names=$(lvs --noheadings -o lv_full_name,lv_attr {VG} | "
        "awk '$2 !~ /^t/ {print $1}'); "
        '[ -z "$names" ] || lvremove -q -y -f $names'
    )
    host.run(["sh", "-c", script], timeout=120)
    host.changed = False  # type: ignore[attr-defined]


@pytest.fixture
def clean_vg(vm_host: Host) -> Iterator[Host]:
    """The VM's host; every LV but the pool is removed after the test when one of its
    commands may have made something (the module's first test finds the VG as
    :func:`vm_host` left it, each later one as the previous test's cleanup did)."""
    yield vm_host
    if getattr(vm_host, "changed", True):
        _clean(vm_host)


def _make_volume(host: Host, *, thin: bool, size: str = "32M") -> Callable[[str], str]:
    made: list[str] = []

    def make(name: str) -> str:
        lv = f"{name}-{len(made)}"
        if thin:
            host.run(["lvcreate", "-q", "-y", "-V", size, "-T", f"{VG}/{POOL}", "-n", lv])
        else:
            host.run(["lvcreate", "-q", "-y", "-L", size, "-n", lv, VG])
        host.run(
            [
                "dd",
                f"of=/dev/{VG}/{lv}",
                f"bs={BLOCK}",
                f"seek={CONSTANT_OFFSET // BLOCK}",
                "count=1",
                "conv=notrunc,fsync",
            ],
            stdin=CONSTANT,
        )
        made.append(lv)
        return f"{VG}/{lv}"

    return make


def write_block(host: Host, device: str, data: bytes) -> None:
    block = struct.pack(">I", len(data)) + data
    host.run(
        ["dd", f"of={device}", f"bs={BLOCK}", "count=1", "conv=notrunc,fsync"],
        stdin=block.ljust(BLOCK, b"\0"),
    )


def read_block(host: Host, device: str, *, check_constant: bool = True) -> bytes:
    raw = host.run(["dd", f"if={device}", f"bs={BLOCK}", "count=1"]).stdout
    (length,) = struct.unpack(">I", raw[:4])
    if check_constant:
        constant = host.run(
            ["dd", f"if={device}", f"bs={BLOCK}", f"skip={CONSTANT_OFFSET // BLOCK}", "count=1"]
        ).stdout
        assert constant == CONSTANT, "the block beyond the marker changed"
    return raw[4 : 4 + length]


class _LvmConformance(StorageBackendConformance):
    declared_capabilities = frozenset({Capability.CLONES})
    thin = True

    @pytest.fixture
    def backend(self, clean_vg: Host) -> LvmBackend:
        return LvmBackend(VG, host=clean_vg)

    @pytest.fixture
    def make_volume(self, clean_vg: Host) -> MakeVolume:
        return _make_volume(clean_vg, thin=self.thin)

    @pytest.fixture
    def write_marker(self, clean_vg: Host) -> WriteMarker:
        return lambda volume_id, data: write_block(clean_vg, f"/dev/{volume_id}", data)

    @pytest.fixture
    def read_marker(self, clean_vg: Host) -> ReadMarker:
        return lambda volume_id: read_block(clean_vg, f"/dev/{volume_id}")


class TestLvmThinConformance(_LvmConformance):
    """The whole suite on thin volumes: thin snapshots, restores merge a copy, clones
    are thin snapshots of the snapshot."""

    thin = True


class TestLvmClassicConformance(_LvmConformance):
    """The suite on linear volumes: classic snapshots, consumed by a restore; clones are
    refused (the restore profile says why).

    Every test of snapshots, groups, restores, deletes, listings of snapshots and clones
    runs here too. The tests of what does not depend on the kind of LV (volume
    listings, ids, errors, capabilities) run once, in the thin class: each costs
    seconds of commands in the emulated VM and would check the same code again."""

    thin = False

    test_name_and_capabilities = None  # type: ignore[assignment]
    test_declared_capabilities_match_the_backend = None  # type: ignore[assignment]
    test_list_volumes_sorted_and_complete = None  # type: ignore[assignment]
    test_get_volume_matches_list = None  # type: ignore[assignment]
    test_unknown_volume_raises_volume_not_found = None  # type: ignore[assignment]
    test_unknown_snapshot_raises_snapshot_not_found = None  # type: ignore[assignment]
    test_locate_returns_a_location = None  # type: ignore[assignment]
    test_attach_detach_refused_without_mapping = None
    test_policies_refused_without_capability = None
    test_secure_snapshot_refused_without_capability = None
    test_nonsense_ids_raise_pgsnap_errors = None  # type: ignore[assignment]
    test_errors_pickle = None  # type: ignore[assignment]


# --------------------------------------------------------------------------- lvm's own


@pytest.fixture
def host(clean_vg: Host) -> Host:
    return clean_vg


@pytest.fixture
def backend(host: Host) -> LvmBackend:
    return LvmBackend(VG, host=host)


def lv_attrs(host: Host) -> dict[str, str]:
    """``{name: lv_attr}`` of every LV of the VG, hidden ones with their brackets."""
    return {lv.name: lv.attr for lv in LvmBackend(VG, host=host).ex_logical_volumes()}


def test_metadata_is_in_lvm_tags_and_a_new_backend_lists_the_same(host, backend) -> None:
    a = _make_volume(host, thin=True)("a")
    b = _make_volume(host, thin=False)("b")
    name = "nightly backup: 2026/12/01 ü, 100%"
    g1 = backend.create_snapshot_group([a, b], name)
    g2 = backend.create_snapshot_group([a], "second")
    assert g1.name == name
    assert [s.volume_id for s in g1.snapshots] == [a, b]
    again = LvmBackend(VG, host=host)
    assert again.list_snapshots() == backend.list_snapshots()
    assert again.get_snapshot_group(g1.id) == backend.get_snapshot_group(g1.id)
    assert [s.id for s in again.list_snapshots(a)] == [g1.for_volume(a).id, g2.snapshots[0].id]
    # lvm itself lists them by the bare tag, with pgsnap's key=value tags.
    out = host.run(["lvs", "--reportformat", "json", "-o", "lv_name,lv_tags", "@pgsnap"]).text
    rows = {lv.name: lv.tags for lv in parse_lvs_json(out)}
    snap_lv = g1.for_volume(a).id.split("/")[1]
    assert f"pgsnap.group={g1.id}" in rows[snap_lv]
    assert "pgsnap.origin=" + a.split("/")[1] in rows[snap_lv]
    assert len(rows) == 3
    # Kinds: thin snapshot of the thin volume, classic of the linear one.
    assert g1.for_volume(a).extra["kind"] == "thin"
    assert g1.for_volume(b).extra["kind"] == "classic"
    attrs = lv_attrs(host)
    assert attrs[snap_lv][0] == "V" and attrs[snap_lv][9] == "k"  # activation skip
    assert attrs[g1.for_volume(b).id.split("/")[1]].startswith("swi-a-s")


def test_thin_snapshot_is_activated_with_K_to_be_read(host, backend) -> None:
    vid = _make_volume(host, thin=True)("t")
    write_block(host, f"/dev/{vid}", b"at snapshot time")
    snap = backend.create_snapshot_group([vid], "read").snapshots[0]
    write_block(host, f"/dev/{vid}", b"later")
    assert snap.extra["activation_skip"] == "yes"
    assert not host.exists(f"/dev/{snap.id}")  # skipped: not active
    device = backend.ex_activate(snap.id)
    assert read_block(host, device) == b"at snapshot time"
    backend.ex_deactivate(snap.id)
    assert read_block(host, f"/dev/{vid}") == b"later"


def test_thin_restore_keeps_the_backup_and_its_id(host, backend) -> None:
    vid = _make_volume(host, thin=True)("t")
    write_block(host, f"/dev/{vid}", b"one")
    snap = backend.create_snapshot_group([vid], "keep").snapshots[0]
    assert backend.restore_profile(vid) == backend.restore_profile(vid)
    assert backend.restore_profile(vid).before is RestorePreparation.UNMOUNT
    assert not backend.restore_profile(vid).consumes_snapshot
    for later in (b"two", b"three"):
        write_block(host, f"/dev/{vid}", later)
        backend.restore_volume(vid, snap.id)
        assert read_block(host, f"/dev/{vid}") == b"one"
        (listed,) = backend.list_snapshots(vid)
        assert (listed.id, listed.group_id, listed.created_at) == (
            snap.id,
            snap.group_id,
            snap.created_at,
        )
    # No copy is left over, and nothing is reported.
    assert not [n for n in lv_attrs(host) if ".pgsnapnew." in n or ".pgsnapold." in n]
    assert backend.ex_check() == ()


def test_thin_restores_from_any_snapshot_in_any_order(host, backend) -> None:
    """After a restore, every other snapshot of the volume still restores (lvm2 drops
    the origin link of a thin volume's other snapshots when one is merged into it:
    a merge-based restore failed here with "is not a mergeable logical volume")."""
    vid = _make_volume(host, thin=True)("o")
    snaps = {}
    for text in (b"first", b"second", b"third"):
        write_block(host, f"/dev/{vid}", text)
        snaps[text] = backend.create_snapshot_group([vid], text.decode()).snapshots[0].id
    for text in (b"second", b"first", b"third"):
        write_block(host, f"/dev/{vid}", b"scribble")
        backend.restore_volume(vid, snaps[text])
        assert read_block(host, f"/dev/{vid}") == text
    assert sorted(s.id for s in backend.list_snapshots(vid)) == sorted(snaps.values())
    assert lv_attrs(host)[vid.split("/")[1]][4] == "a"  # active
    assert "k" not in lv_attrs(host)[vid.split("/")[1]][9:]  # no activation skip


def test_an_interrupted_thin_restore_is_finished_by_the_next_one(host, backend) -> None:
    vid = _make_volume(host, thin=True)("i")
    vg, name = vid.split("/")
    write_block(host, f"/dev/{vid}", b"snapshotted")
    snap = backend.create_snapshot_group([vid], "i").snapshots[0]
    write_block(host, f"/dev/{vid}", b"later")
    # What a restore killed after renaming the volume away leaves: a tagged copy, the
    # volume under another name, and no volume of that name.
    host.run(
        [
            "lvcreate",
            "-q",
            "-s",
            "-n",
            f"{name}.pgsnapnew.dead",
            "--addtag",
            f"pgsnap.new={name}",
            snap.id,
        ]
    )
    host.run(["lvchange", "-q", "--addtag", f"pgsnap.old={name}", vid])
    host.run(["lvrename", "-q", vg, name, f"{name}.pgsnapold.dead"])
    with pytest.raises(VolumeNotFound):
        backend.get_volume(vid)
    backend.restore_volume(vid, snap.id)
    assert read_block(host, f"/dev/{vid}") == b"snapshotted"
    assert not [n for n in lv_attrs(host) if ".pgsnapnew." in n or ".pgsnapold." in n]
    (listed,) = backend.list_snapshots(vid)
    assert listed.id == snap.id


def test_classic_restore_consumes_the_snapshot(host, backend) -> None:
    vid = _make_volume(host, thin=False)("c")
    write_block(host, f"/dev/{vid}", b"one")
    snap = backend.create_snapshot_group([vid], "consume").snapshots[0]
    assert backend.restore_profile(vid).consumes_snapshot
    write_block(host, f"/dev/{vid}", b"two")
    backend.restore_volume(vid, snap.id)
    assert read_block(host, f"/dev/{vid}") == b"one"
    assert backend.list_snapshots(vid) == ()
    with pytest.raises(SnapshotNotFound):
        backend.restore_volume(vid, snap.id)
    assert lv_attrs(host)[vid.split("/")[1]][4] == "a"  # active again


@pytest.mark.parametrize("thin", [True, False], ids=["thin", "classic"])
def test_a_deferred_merge_is_finished_by_reactivating_the_origin(host, backend, thin) -> None:
    vid = _make_volume(host, thin=thin)("d")
    host.run(["mkfs.ext4", "-q", f"/dev/{vid}"])
    host.make_dirs("/mnt/d", mode=0o755)
    host.run(["mount", f"/dev/{vid}", "/mnt/d"])
    host.write_atomic("/mnt/d/file", b"snapshotted")
    host.run(["sync"])
    snap = backend.create_snapshot_group([vid], "deferred").snapshots[0]
    host.write_atomic("/mnt/d/file", b"later")
    host.run(["sync"])
    # lvm defers a merge into an open origin: what an interrupted restore leaves.
    result = host.run(["lvconvert", "--merge", snap.id], check=False)
    said = result.text + result.error_text
    assert "Delaying merge" in said or "will occur on next activation" in said, said
    with pytest.raises(BackendError, match="open"):
        backend.wait_for_restore(vid, timeout=2)
    # Being merged, the snapshot is consumed already: not listed, not restorable.
    assert snap.id not in {s.id for s in backend.list_snapshots()}
    host.unmount("/mnt/d")
    backend.wait_for_restore(vid, timeout=120)
    host.run(["mount", f"/dev/{vid}", "/mnt/d"])
    try:
        assert host.read_bytes("/mnt/d/file") == b"snapshotted"
    finally:
        host.unmount("/mnt/d")
    assert not [n for n in lv_attrs(host) if n.strip("[]") == snap.id.split("/")[1]]


def test_an_open_volume_is_refused_and_left_as_it_was(host, backend) -> None:
    vid = _make_volume(host, thin=False)("busy")
    host.run(["mkfs.ext4", "-q", f"/dev/{vid}"])
    host.make_dirs("/mnt/busy", mode=0o755)
    host.run(["mount", f"/dev/{vid}", "/mnt/busy"])
    try:
        snap = backend.create_snapshot_group([vid], "busy").snapshots[0]
        with pytest.raises(LvInUseError, match="open") as info:
            backend.restore_volume(vid, snap.id)
        assert info.value.hint
        assert [s.id for s in backend.list_snapshots(vid)] == [snap.id]
        assert host.mount_of("/mnt/busy") is not None
    finally:
        host.unmount("/mnt/busy")


def test_a_classic_snapshot_filling_up_is_reported_then_invalid(host) -> None:
    backend = LvmBackend(VG, host=host, cow_size="8M", warn_percent=50)
    vid = _make_volume(host, thin=False, size="64M")("fill")
    write_block(host, f"/dev/{vid}", b"kept")
    snap = backend.create_snapshot_group([vid], "fill").snapshots[0]
    assert backend.ex_check() == ()
    host.run(
        [
            "dd",
            "if=/dev/urandom",
            f"of=/dev/{vid}",
            "bs=1M",
            "seek=2",
            "count=5",
            "conv=notrunc,fsync",
        ]
    )
    (warning,) = backend.ex_check()
    assert snap.id in warning and "full" in warning
    (filling,) = backend.storage_problems([vid])  # what pgsnap check shows
    assert (filling.code, filling.snapshot_id) == ("snapshot_filling", snap.id)
    assert backend.storage_problems(["nosuchvg/other"]) == ()
    host.run(
        [
            "dd",
            "if=/dev/urandom",
            f"of=/dev/{vid}",
            "bs=1M",
            "seek=8",
            "count=16",
            "conv=notrunc,fsync",
        ]
    )
    (listed,) = backend.list_snapshots(vid)
    assert listed.extra["state"] == "invalid"
    (problem,) = backend.ex_check()
    assert snap.id in problem and "invalid" in problem
    (invalid,) = backend.storage_problems([vid])
    assert (invalid.code, invalid.severity.value) == ("snapshot_invalid", "error")
    with pytest.raises(SnapshotInvalidError):
        backend.restore_volume(vid, snap.id)
    # lvm's own refusal maps to the same error.
    result = host.run(["lvconvert", "--merge", snap.id], check=False)
    assert isinstance(classify_failure(result, what="merge"), SnapshotInvalidError)


def test_errors_from_real_lvm_messages(host, backend) -> None:
    with pytest.raises(VolumeGroupNotFound) as vg_err:
        LvmBackend("nosuchvg", host=host).list_volumes()
    assert vg_err.value.details["volume_group"] == "nosuchvg"
    vid = _make_volume(host, thin=False)("err")
    lv = vid.split("/")[1]
    exists = host.run(["lvcreate", "-L", "8M", "-n", lv, VG], check=False)
    assert isinstance(classify_failure(exists, what="create"), LvExistsError)
    # Not enough space for the copy-on-write store: nothing is left behind.
    big = _make_volume(host, thin=False, size="2500M")("big")
    greedy = LvmBackend(VG, host=host, cow_size="100%ORIGIN")
    before = set(lv_attrs(host))
    with pytest.raises(LvmNoSpaceError) as space:
        greedy.create_snapshot_group([vid, big], "too big")
    assert space.value.details["volume_id"] == big
    assert set(lv_attrs(host)) == before
    # A snapshot in use (mounted) cannot be removed.
    host.run(["mkfs.ext4", "-q", f"/dev/{vid}"])
    snap = backend.create_snapshot_group([vid], "in use").snapshots[0]
    host.make_dirs("/mnt/snap", mode=0o755)
    host.run(["mount", "-o", "ro", f"/dev/{snap.id}", "/mnt/snap"])
    try:
        with pytest.raises(LvInUseError):
            backend.delete_snapshot(snap.id)
    finally:
        host.unmount("/mnt/snap")
    backend.delete_snapshot(snap.id)
    with pytest.raises(SnapshotNotFound):
        backend.delete_snapshot(snap.id)
    with pytest.raises(VolumeNotFound):
        backend.get_volume(f"{VG}/pool")  # the thin pool is not a volume
    assert backend.locate(vid).kind is LocationKind.BLOCK_DEVICE
    assert backend.locate(vid).path == f"/dev/{vid}"


def _io_counts(host: Host, device: str) -> tuple[int, int, int]:
    """The kernel's counts for ``device`` (``/sys/dev/block/MAJ:MIN/stat``): reads
    completed, sectors written, sectors discarded. They count whoever wrote: a file
    system's log replay, its superblock's mount count, a trim. (Writes completed is no
    measure: an empty flush, which writes nothing, counts as one on some kernels.)"""
    fields = host.run(
        [
            "sh",
            "-c",
            'set -- $(stat -L -c "%t %T" "$1") && cat "/sys/dev/block/$((0x$1)):$((0x$2))/stat"',
            "sh",
            device,
        ]
    ).text.split()
    return int(fields[0]), int(fields[6]), int(fields[13])


@pytest.mark.parametrize(
    ("fs", "thin"),
    [("xfs", True), ("ext4", False)],
    ids=["xfs-thin", "ext4-classic"],  # each file system's options, each snapshot kind
)
def test_a_snapshot_mounts_beside_its_mounted_origin(host, backend, fs, thin) -> None:
    """XFS needs ``nouuid`` (the snapshot has its origin's UUID); a snapshot of a mounted
    file system is mounted read-only without replaying its log, and is not written: the
    kernel counts no write to its device (cheaper than hashing it under emulation)."""
    vid = _make_volume(host, thin=thin, size="320M")(f"m{fs}{int(thin)}")  # XFS: >= 300 MB
    mkfs = ["mkfs.xfs", "-q", "-f"] if fs == "xfs" else ["mkfs.ext4", "-q"]
    host.run([*mkfs, f"/dev/{vid}"], timeout=300)
    origin, beside = f"/mnt/{fs}-origin", f"/mnt/{fs}-snapshot"
    host.make_dirs(origin, mode=0o755)
    host.run(["mount", f"/dev/{vid}", origin])
    try:
        host.write_atomic(f"{origin}/file", b"at snapshot time")
        host.run(["sync"])
        snap = backend.create_snapshot_group([vid], f"mount {fs}").snapshots[0]
        host.write_atomic(f"{origin}/file", b"later")
        device = backend.ex_activate(snap.id)  # thin snapshots skip activation
        reads, written, discarded = _io_counts(host, device)
        if fs == "xfs":  # what pgsnap avoids: the same UUID is refused without nouuid
            host.make_dirs("/mnt/plain", mode=0o755)
            plain = host.run(
                ["mount", "-o", "ro,norecovery", f"/dev/{snap.id}", "/mnt/plain"], check=False
            )
            assert plain.returncode != 0, "XFS mounted a duplicate UUID without nouuid"
        assert backend.ex_mount_snapshot(snap.id, beside) == device == f"/dev/{snap.id}"
        assert host.read_text(f"{beside}/file") == "at snapshot time"
        assert host.read_text(f"{origin}/file") == "later"
        mount = host.mount_of(beside)
        assert mount is not None and "ro" in mount.options, mount
        host.run(["sync"])
        now = _io_counts(host, device)
        assert now[0] > reads, (reads, now)  # the same device: the mount read it
        assert now[1:] == (written, discarded), "the snapshot was written while mounted"
        backend.ex_unmount_snapshot(snap.id, beside)
        assert not [m for m in host.mounts() if m.target == beside]
        if thin:
            assert not host.exists(f"/dev/{snap.id}")  # deactivated again
        else:
            assert _io_counts(host, device)[1:] == (written, discarded), "written at unmount"
    finally:
        for target in (beside, origin):
            host.run(["umount", target], check=False)
