"""The mock backend's own behaviour: ids, fault injection, directories, secure snapshots.

The protocol contract itself is checked by tests/conformance/test_mock_conformance.py.
"""

from __future__ import annotations

import datetime as dt
import os
import pickle
import pwd
import shutil
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pgsnap.backends.mock import FAULT_POINTS, MockBackend
from pgsnap.errors import (
    BackendError,
    BackendUnavailable,
    ConfigurationError,
    SnapshotNotFound,
    UnsupportedCapability,
    VolumeNotFound,
)
from pgsnap.model import Location, LocationKind, RestorePreparation, RestoreProfile
from pgsnap.protocols import Capability

T0 = dt.datetime(2025, 1, 1, 12, 0, tzinfo=dt.UTC)


class FakeTime:
    """A clock and a sleep function that advances it (no wall-clock waits)."""

    def __init__(self) -> None:
        self.now = T0
        self.slept: list[float] = []

    def clock(self) -> dt.datetime:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += dt.timedelta(seconds=seconds)


@pytest.fixture
def fake() -> FakeTime:
    return FakeTime()


@pytest.fixture
def backend(fake: FakeTime) -> MockBackend:
    return MockBackend(clock=fake.clock, sleep=fake.sleep)


def two_volumes(backend: MockBackend) -> tuple[str, str]:
    return backend.add_volume("data").id, backend.add_volume("wal").id


# --------------------------------------------------------------------------- basics


def test_ids_are_deterministic(backend: MockBackend) -> None:
    v1, v2 = two_volumes(backend)
    assert (v1, v2) == ("vol-0001", "vol-0002")
    group = backend.create_snapshot_group([v1, v2], "b1")
    assert group.id == "cg-0001"
    assert [s.id for s in group.snapshots] == ["snap-0001", "snap-0002"]
    assert backend.add_policy("nightly", [v1]).id == "pol-0001"
    assert backend.clone_snapshot("snap-0001", "dev").id == "vol-0003"
    assert backend.add_volume("x", volume_id="custom").id == "custom"
    with pytest.raises(ConfigurationError, match="already used"):
        backend.add_volume("y", volume_id="custom")


def test_name_repr_and_capabilities() -> None:
    backend = MockBackend(capabilities={Capability.CLONES})
    assert backend.name == "mock"
    assert backend.capabilities == frozenset({Capability.CLONES})
    text = repr(backend)
    assert "\n" not in text
    assert text.startswith("<MockBackend volumes=0 ")
    assert "capabilities=clones" in text
    assert MockBackend().capabilities == frozenset(Capability)
    # Values are accepted too (a TOML configuration has strings); anything else is refused.
    assert MockBackend(capabilities=["mapping"]).capabilities == {Capability.MAPPING}
    with pytest.raises(ConfigurationError, match="teleport") as info:
        MockBackend(capabilities=["mapping", "teleport"])
    assert "consistency_groups" in (info.value.hint or "")
    with pytest.raises(ConfigurationError):
        MockBackend(capabilities=[42])  # type: ignore[list-item]


def test_consistency_group_shares_one_instant(backend: MockBackend, fake: FakeTime) -> None:
    group = backend.create_snapshot_group(two_volumes(backend), "b1")
    assert {s.created_at for s in group.snapshots} == {T0}
    assert group.created_at == T0


def test_without_consistency_groups_volumes_are_snapshotted_one_by_one(fake: FakeTime) -> None:
    backend = MockBackend(capabilities=(), clock=fake.clock, sleep=fake.sleep)
    v1, v2 = two_volumes(backend)
    group = backend.create_snapshot_group([v1, v2], "b1")
    first, second = group.snapshots
    assert first.created_at == T0
    assert second.created_at > first.created_at  # even with a clock that did not move
    assert second.group_id == first.group_id == group.id
    # With latency per volume, the gap is the latency.
    backend.add_latency("snapshot_volume", 2.0)
    later = backend.create_snapshot_group([v1, v2], "b2")
    a, b = later.snapshots
    assert b.created_at - a.created_at == dt.timedelta(seconds=2)


def test_naive_clock_is_refused() -> None:
    backend = MockBackend(clock=lambda: dt.datetime(2025, 1, 1))
    vol = backend.add_volume("data")
    with pytest.raises(ConfigurationError, match="naive"):
        backend.create_snapshot_group([vol.id], "b1")
    assert backend.list_snapshots() == ()


def test_group_input_errors(backend: MockBackend) -> None:
    v1, _ = two_volumes(backend)
    with pytest.raises(ConfigurationError, match="at least one"):
        backend.create_snapshot_group([], "empty")
    with pytest.raises(ConfigurationError, match="more than once"):
        backend.create_snapshot_group([v1, v1], "dupe")
    with pytest.raises(VolumeNotFound) as info:
        backend.create_snapshot_group([v1, "nope"], "missing")
    assert info.value.details["volume_id"] == "nope"
    assert backend.list_snapshots() == ()


def test_restore_of_another_volume_snapshot_is_refused(backend: MockBackend) -> None:
    v1, v2 = two_volumes(backend)
    snap = backend.create_snapshot_group([v1], "b1").snapshots[0]
    with pytest.raises(BackendError, match="can only restore its own volume") as info:
        backend.restore_volume(v2, snap.id)
    err = info.value
    assert not isinstance(err, LookupError)
    assert err.details["snapshot_volume_id"] == v1
    assert err.hint is not None
    assert "clone" in err.hint


def test_deleting_one_snapshot_shrinks_its_group(backend: MockBackend) -> None:
    v1, v2 = two_volumes(backend)
    group = backend.create_snapshot_group([v1, v2], "b1")
    backend.delete_snapshot(group.snapshots[0].id)
    assert [s.volume_id for s in backend.get_snapshot_group(group.id).snapshots] == [v2]
    backend.delete_snapshot(group.snapshots[1].id)
    with pytest.raises(SnapshotNotFound):
        backend.get_snapshot_group(group.id)


# --------------------------------------------------------------------------- faults and calls


def test_fault_fires_on_the_nth_call_only(backend: MockBackend) -> None:
    backend.inject_fault("list_volumes", on_call=2)
    backend.list_volumes()
    with pytest.raises(BackendUnavailable) as info:
        backend.list_volumes()
    assert info.value.retryable
    assert info.value.details["method"] == "list_volumes"
    backend.list_volumes()  # times=1: spent


def test_fault_fires_times_in_a_row(backend: MockBackend) -> None:
    backend.inject_fault("get_volume", times=2)
    vid = backend.add_volume("data").id
    for _ in range(2):
        with pytest.raises(BackendUnavailable):
            backend.get_volume(vid)
    assert backend.get_volume(vid).id == vid


def test_fault_with_custom_error_and_clear(backend: MockBackend) -> None:
    boom = RuntimeError("boom")
    backend.inject_fault("list_snapshots", error=boom)
    with pytest.raises(RuntimeError) as info:
        backend.list_snapshots()
    assert info.value is boom
    backend.inject_fault("list_snapshots", times=5)
    backend.clear_faults()
    assert backend.list_snapshots() == ()


def test_fault_fires_before_any_state_change(backend: MockBackend) -> None:
    v1, v2 = two_volumes(backend)
    backend.inject_fault("create_snapshot_group")
    with pytest.raises(BackendUnavailable):
        backend.create_snapshot_group([v1, v2], "b1")
    assert backend.list_snapshots() == ()
    group = backend.create_snapshot_group([v1, v2], "b1")
    assert group.id == "cg-0001"  # the failed call used no id

    backend.write_blob(v1, "k", b"new")
    backend.inject_fault("restore_volume")
    with pytest.raises(BackendUnavailable):
        backend.restore_volume(v1, group.for_volume(v1).id)
    assert backend.read_blob(v1, "k") == b"new"

    backend.inject_fault("delete_snapshot_group")
    with pytest.raises(BackendUnavailable):
        backend.delete_snapshot_group(group.id)
    assert backend.get_snapshot_group(group.id) == group


def test_inject_fault_validates_its_arguments(backend: MockBackend) -> None:
    with pytest.raises(ConfigurationError, match="not a mock method"):
        backend.inject_fault("list_volume")
    with pytest.raises(ConfigurationError):
        backend.inject_fault("list_volumes", on_call=0)
    with pytest.raises(ConfigurationError):
        backend.inject_fault("list_volumes", times=0)
    with pytest.raises(ConfigurationError):
        backend.add_latency("list_volumes", -1)
    assert "snapshot_volume" in FAULT_POINTS


def test_latency_uses_the_injected_sleep(backend: MockBackend, fake: FakeTime) -> None:
    backend.add_latency("list_volumes", 1.5)
    backend.list_volumes()
    backend.list_volumes()
    assert fake.slept == [1.5, 1.5]
    assert fake.now == T0 + dt.timedelta(seconds=3)
    backend.clear_faults()
    backend.list_volumes()
    assert fake.slept == [1.5, 1.5]


def test_a_held_call_waits_for_its_release_file(backend: MockBackend, tmp_path: Path) -> None:
    release = tmp_path / "go"
    backend.add_hold("list_volumes", release)
    done = threading.Event()

    def call() -> None:
        backend.list_volumes()
        done.set()

    worker = threading.Thread(target=call)
    worker.start()
    assert not done.wait(0.3)  # held
    release.touch()
    assert done.wait(10)
    worker.join()
    backend.add_hold("list_volumes", tmp_path / "never", timeout=0.05)
    with pytest.raises(BackendUnavailable, match="never released"):
        backend.list_volumes()
    backend.clear_faults()
    backend.list_volumes()  # no longer held


def test_hold_from_a_configuration_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="file path"):
        MockBackend(hold={"list_volumes": 3})  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError, match="not a mock method"):
        MockBackend(hold={"list_volume": str(tmp_path / "go")})
    (tmp_path / "go").touch()
    MockBackend(hold={"list_volumes": str(tmp_path / "go")}).list_volumes()


def test_call_log_records_names_and_arguments(backend: MockBackend) -> None:
    v1, v2 = two_volumes(backend)
    group = backend.create_snapshot_group([v1, v2], "b1")
    backend.restore_volume(v1, group.for_volume(v1).id)
    backend.attach(v1, "db1")
    backend.wait_for_restore(v1, timeout=5.0)
    assert backend.calls == [
        ("create_snapshot_group", ((v1, v2), "b1", False)),
        ("snapshot_volume", (v1,)),
        ("snapshot_volume", (v2,)),
        ("restore_volume", (v1, "snap-0001")),
        ("attach", (v1, "db1")),
        ("wait_for_restore", (v1, 5.0)),
    ]


def test_group_is_all_or_nothing_on_a_fault_mid_group(tmp_path: Path, fake: FakeTime) -> None:
    backend = MockBackend(root=tmp_path / "root", clock=fake.clock)
    vids = []
    for name in ("data", "wal", "ts"):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "f").write_text(name)
        vids.append(backend.add_volume(name, path=directory).id)
    backend.inject_fault("snapshot_volume", on_call=2)
    with pytest.raises(BackendUnavailable) as info:
        backend.create_snapshot_group(vids, "b1")
    err = info.value
    assert err.details["volume_id"] == vids[1]
    assert "vol-0002" in str(err)
    assert "no snapshot of the group was kept" in str(err)
    assert backend.list_snapshots() == ()
    assert list((tmp_path / "root" / "snapshots").iterdir()) == []
    assert pickle.loads(pickle.dumps(err)).details["volume_id"] == vids[1]
    # The failed attempt consumed no id.
    assert backend.create_snapshot_group(vids, "b1").id == "cg-0001"


def test_group_is_all_or_nothing_on_an_io_error(tmp_path: Path) -> None:
    backend = MockBackend(root=tmp_path / "root")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    va = backend.add_volume("a", path=tmp_path / "a").id
    vb = backend.add_volume("b", path=tmp_path / "b").id
    (tmp_path / "b").rmdir()  # the second volume's directory vanished
    with pytest.raises(BackendError, match="failed at volume 'vol-0002'") as info:
        backend.create_snapshot_group([va, vb], "b1")
    assert info.value.details["volume_id"] == vb
    assert isinstance(info.value.__cause__, BackendError)
    assert backend.list_snapshots() == ()
    assert list((tmp_path / "root" / "snapshots").iterdir()) == []


# --------------------------------------------------------------------------- capabilities


def test_ungranted_capabilities_raise() -> None:
    backend = MockBackend(capabilities={Capability.CONSISTENCY_GROUPS})
    vid = backend.add_volume("data").id
    snap = backend.create_snapshot_group([vid], "b1").snapshots[0]
    with pytest.raises(UnsupportedCapability) as info:
        backend.attach(vid, "db1")
    assert info.value.details["capability"] == "mapping"
    with pytest.raises(UnsupportedCapability):
        backend.detach(vid, "db1")
    assert pickle.loads(pickle.dumps(info.value)).details["capability"] == "mapping"
    with pytest.raises(UnsupportedCapability):
        backend.clone_snapshot(snap.id, "dev")
    with pytest.raises(UnsupportedCapability):
        backend.create_snapshot_group([vid], "s", secure=True)
    with pytest.raises(UnsupportedCapability):
        backend.add_policy("p", [vid])
    assert backend.list_policies() == ()
    with pytest.raises(UnsupportedCapability):
        backend.pause_policy("pol-0001")


def test_attach_detach_are_idempotent(backend: MockBackend) -> None:
    vid = backend.add_volume("data").id
    backend.attach(vid, "db2")
    backend.attach(vid, "db1")
    backend.attach(vid, "db1")
    assert backend.get_volume(vid).mapped_hosts == ("db1", "db2")
    backend.detach(vid, "db1")
    backend.detach(vid, "db1")
    assert backend.get_volume(vid).mapped_hosts == ("db2",)
    with pytest.raises(ConfigurationError):
        backend.attach(vid, " ")
    for call in (backend.attach, backend.detach):
        with pytest.raises(VolumeNotFound) as info:
            call("vol-9999", "db1")
        assert info.value.volume_id == "vol-9999"


# --------------------------------------------------------------------------- secure snapshots


def test_secure_snapshot_cannot_be_deleted_until_expired(backend: MockBackend) -> None:
    v1, v2 = two_volumes(backend)
    group = backend.create_snapshot_group([v1, v2], "b1", secure=True)
    snap = group.snapshots[0]
    assert all(s.secure for s in group.snapshots)
    with pytest.raises(BackendError, match="secure") as info:
        backend.delete_snapshot(snap.id)
    assert info.value.hint is not None
    assert "ex_expire_secure" in info.value.hint
    with pytest.raises(BackendError, match="secure"):
        backend.delete_snapshot_group(group.id)
    assert len(backend.list_snapshots()) == 2  # nothing of the group was deleted
    backend.ex_expire_secure(snap.id)
    backend.ex_expire_secure(snap.id)  # idempotent
    assert not backend.get_snapshot_group(group.id).snapshots[0].secure
    backend.delete_snapshot(snap.id)
    with pytest.raises(BackendError, match="secure"):
        backend.delete_snapshot_group(group.id)  # the other one is still secure


# --------------------------------------------------------------------------- policies


def test_policy_runs_refuses_while_paused_and_rotates(backend: MockBackend, fake: FakeTime) -> None:
    v1, v2 = two_volumes(backend)
    policy = backend.add_policy("hourly", [v1, v2], retain=2)
    assert backend.list_policies() == (policy,)
    groups = []
    for _ in range(3):
        groups.append(backend.ex_run_policy(policy.id))
        fake.now += dt.timedelta(hours=1)
    assert [g.name for g in groups] == ["hourly-1", "hourly-2", "hourly-3"]
    assert groups[0].snapshots[0].extra == {"policy_id": policy.id}
    with pytest.raises(SnapshotNotFound):
        backend.get_snapshot_group(groups[0].id)  # rotated out
    assert len(backend.list_snapshots()) == 4
    backend.pause_policy(policy.id)
    backend.pause_policy(policy.id)
    assert backend.list_policies()[0].paused
    with pytest.raises(BackendError, match="paused"):
        backend.ex_run_policy(policy.id)
    assert len(backend.list_snapshots()) == 4
    backend.resume_policy(policy.id)
    assert backend.ex_run_policy(policy.id).name == "hourly-4"
    with pytest.raises(BackendError, match="no snapshot policy") as info:
        backend.pause_policy("pol-9999")
    assert info.value.details["policy_id"] == "pol-9999"


# --------------------------------------------------------------------------- directories


def _tree(volume: Path, outside: Path, uid: int, gid: int) -> None:
    """A small PGDATA-like tree with modes, an owner, links in and out of the volume."""
    (volume / "base" / "1").mkdir(parents=True)
    (volume / "base" / "1" / "1259").write_bytes(b"heap")
    (volume / "PG_VERSION").write_text("15\n")
    (volume / "postgresql.conf").write_text("wal_level = replica\n")
    os.chmod(volume / "postgresql.conf", 0o640)
    os.chmod(volume / "base", 0o700)
    (volume / "pg_tblspc").mkdir()
    os.symlink(outside, volume / "pg_tblspc" / "16384")  # out of the volume
    os.symlink("PG_VERSION", volume / "version-link")  # relative, inside
    os.mkfifo(volume / "a-fifo")
    for path in [volume, *volume.rglob("*")]:
        os.lchown(path, uid, gid)
    os.utime(volume / "PG_VERSION", ns=(1_000_000_000, 1_500_000_000_123))


def _lstat_all(volume: Path) -> dict[str, tuple[int, int, int, int | None, str | None]]:
    out = {}
    for path in sorted(volume.rglob("*")):
        st = os.lstat(path)
        link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
        mtime = None if stat.S_ISDIR(st.st_mode) or link else st.st_mtime_ns
        out[str(path.relative_to(volume))] = (st.st_mode, st.st_uid, st.st_gid, mtime, link)
    return out


@pytest.fixture
def owner() -> tuple[int, int]:
    """The postgres user when running as root (the tests do), else ourselves."""
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            return 1234, 1234
        return pw.pw_uid, pw.pw_gid
    return os.getuid(), os.getgid()


def test_directory_restore_preserves_owner_mode_links(
    tmp_path: Path, owner: tuple[int, int]
) -> None:
    uid, gid = owner
    outside = tmp_path / "tablespace"
    outside.mkdir()
    (outside / "keep").write_text("outside the volume")
    volume = tmp_path / "pgdata"
    volume.mkdir(mode=0o750)
    os.chmod(volume, 0o750)
    _tree(volume, outside, uid, gid)
    before = _lstat_all(volume)

    backend = MockBackend(root=tmp_path / "root")
    vid = backend.add_volume("data", path=volume).id
    snap = backend.create_snapshot_group([vid], "b1").snapshots[0]

    # Snapshot copies are private, whoever owns the volume.
    assert stat.S_IMODE(os.stat(tmp_path / "root").st_mode) == 0o700
    home = tmp_path / "root" / "snapshots" / snap.id
    assert stat.S_IMODE(os.stat(home).st_mode) == 0o700
    assert snap.extra["path"] == str(home / "tree")
    assert _lstat_all(home / "tree") == before

    # Damage the volume: change, add, remove, re-mode, re-link.
    (volume / "PG_VERSION").write_text("16\n")
    (volume / "postmaster.pid").write_text("4242")
    (volume / "base" / "1" / "1259").unlink()
    os.chmod(volume / "postgresql.conf", 0o666)
    (volume / "version-link").unlink()
    os.symlink("/etc/passwd", volume / "version-link")
    (volume / "new-dir").mkdir()

    backend.restore_volume(vid, snap.id)

    assert _lstat_all(volume) == before
    st = os.stat(volume)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o750, uid, gid)
    assert (volume / "PG_VERSION").read_text() == "15\n"
    assert os.readlink(volume / "pg_tblspc" / "16384") == str(outside)
    # Emptying the volume did not follow the link out of it.
    assert (outside / "keep").read_text() == "outside the volume"


def test_restore_recreates_a_removed_volume_directory(
    tmp_path: Path, owner: tuple[int, int]
) -> None:
    uid, gid = owner
    volume = tmp_path / "pgdata"
    volume.mkdir()
    os.chmod(volume, 0o700)
    (volume / "PG_VERSION").write_text("15\n")
    os.chown(volume, uid, gid)
    backend = MockBackend(root=tmp_path / "root")
    vid = backend.add_volume("data", path=volume).id
    snap = backend.create_snapshot_group([vid], "b1").snapshots[0]
    for path in volume.iterdir():
        path.unlink()
    volume.rmdir()  # the volume is lost
    backend.restore_volume(vid, snap.id)
    st = os.stat(volume)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o700, uid, gid)
    assert (volume / "PG_VERSION").read_text() == "15\n"


def test_directory_clones(tmp_path: Path) -> None:
    volume = tmp_path / "pgdata"
    volume.mkdir()
    (volume / "f").write_text("v1")
    backend = MockBackend(root=tmp_path / "root")
    vid = backend.add_volume("data", path=volume).id
    snap = backend.create_snapshot_group([vid], "b1").snapshots[0]
    clone = backend.clone_snapshot(snap.id, "dev")
    assert clone.path == str(tmp_path / "root" / "clones" / clone.id)
    assert clone.extra == {"kind": "directory", "clone_of": snap.id}
    target = tmp_path / "dev2"
    clone2 = backend.clone_snapshot(snap.id, "dev2", path=target)
    assert clone2.path == str(target)
    assert (target / "f").read_text() == "v1"
    with pytest.raises(ConfigurationError, match="exists"):
        backend.clone_snapshot(snap.id, "dev3", path=target)
    with pytest.raises(ConfigurationError, match="overlaps"):
        backend.clone_snapshot(snap.id, "dev4", path=volume / "inside")


def test_directory_volume_checks(tmp_path: Path) -> None:
    backend = MockBackend(root=tmp_path / "root")
    with pytest.raises(ConfigurationError, match="does not exist"):
        backend.add_volume("x", path=tmp_path / "missing")
    (tmp_path / "a" / "b").mkdir(parents=True)
    backend.add_volume("a", path=tmp_path / "a")
    with pytest.raises(ConfigurationError, match="overlaps volume"):
        backend.add_volume("b", path=tmp_path / "a" / "b")
    (tmp_path / "root").mkdir()
    with pytest.raises(ConfigurationError, match="snapshot root"):
        backend.add_volume("r", path=tmp_path / "root")
    with pytest.raises(ConfigurationError, match="invalid blob key"):
        backend.write_blob("vol-0001", "../escape", b"x")
    backend.write_blob("vol-0001", "b/file", b"x")
    assert (tmp_path / "a" / "b" / "file").read_bytes() == b"x"
    assert backend.read_blob("vol-0001", "b/file") == b"x"
    with pytest.raises(BackendError):
        backend.read_blob("vol-0001", "nope")


def test_temporary_root_is_created_lazily_and_removed_on_close(tmp_path: Path) -> None:
    volume = tmp_path / "pgdata"
    volume.mkdir()
    with MockBackend() as backend:
        assert "root=None" in repr(backend)
        vid = backend.add_volume("data", path=volume).id
        backend.create_snapshot_group([vid], "b1")
        root = backend.root
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
        assert root.is_dir()
    assert not root.exists()
    backend.close()  # idempotent


def test_memory_blob_errors(backend: MockBackend) -> None:
    vid = backend.add_volume("data").id
    with pytest.raises(BackendError, match="no blob"):
        backend.read_blob(vid, "k")
    with pytest.raises(VolumeNotFound):
        backend.write_blob("vol-9999", "k", b"")


# --------------------------------------------------------------------------- threads


def test_concurrent_groups_get_distinct_ids() -> None:
    backend = MockBackend()
    vids = [backend.add_volume(f"v{i}").id for i in range(4)]
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(25):
                backend.create_snapshot_group(vids, "b")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    snaps = backend.list_snapshots()
    assert len(snaps) == 400
    assert len({s.id for s in snaps}) == 400
    groups = {s.group_id for s in snaps}
    assert len(groups) == 100


def test_files_vanishing_during_the_copy_are_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running server deletes files while the mock copies; the copy skips them."""
    volume = tmp_path / "pgdata"
    (volume / "pg_stat_tmp").mkdir(parents=True)
    (volume / "pg_stat_tmp" / "global.tmp").write_text("x")
    (volume / "gone-dir").mkdir()
    (volume / "gone-dir" / "f").write_text("x")
    (volume / "PG_VERSION").write_text("15\n")
    backend = MockBackend(root=tmp_path / "root")
    vid = backend.add_volume("data", path=volume).id

    real_copyfile = shutil.copyfile
    real_scandir = os.scandir

    def racing_copyfile(src: Any, dst: Any, **kwargs: Any) -> Any:
        if Path(src).name == "global.tmp":
            Path(src).unlink()  # deleted between the listing and the copy
        return real_copyfile(src, dst, **kwargs)

    def racing_scandir(path: Any) -> Any:
        if not isinstance(path, int) and Path(path).name == "gone-dir":
            shutil.rmtree(path)
        return real_scandir(path)

    monkeypatch.setattr(shutil, "copyfile", racing_copyfile)
    monkeypatch.setattr(os, "scandir", racing_scandir)
    snap = backend.create_snapshot_group([vid], "b1").snapshots[0]
    monkeypatch.undo()
    tree = Path(snap.extra["path"])
    assert sorted(p.name for p in tree.iterdir()) == ["PG_VERSION", "pg_stat_tmp"]
    assert list((tree / "pg_stat_tmp").iterdir()) == []


# --------------------------------------------------------------------------- persistent state


def _state_dir(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A state file, a snapshot root and a directory volume with a file in it."""
    volume = tmp_path / "pgdata"
    volume.mkdir()
    (volume / "PG_VERSION").write_text("15\n")
    return tmp_path / "state" / "mock.json", tmp_path / "root", volume


def test_state_survives_a_new_instance(tmp_path: Path, fake: FakeTime) -> None:
    state, root, volume = _state_dir(tmp_path)
    first = MockBackend(state_file=state, root=root, clock=fake.clock)
    mem = first.add_volume("mem", size_bytes=5).id
    first.write_blob(mem, "marker", b"\x00v1")
    data = first.add_volume("data", path=volume).id
    group = first.create_snapshot_group([mem, data], "b1", secure=True)
    first.write_blob(mem, "marker", b"v2")
    (volume / "PG_VERSION").write_text("16\n")
    first.attach(data, "host-a")
    policy = first.add_policy("nightly", [mem], retain=2)
    first.pause_policy(policy.id)
    clone = first.clone_snapshot(group.for_volume(data).id, "dev")
    assert state.exists()
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert sorted(p.name for p in state.parent.iterdir()) == ["mock.json", "mock.json.lock"]

    second = MockBackend(state_file=state, root=root, clock=fake.clock)
    assert second.list_volumes() == first.list_volumes()
    assert second.list_snapshots() == first.list_snapshots()
    assert second.get_snapshot_group(group.id) == group
    assert second.list_policies() == first.list_policies()
    assert second.list_policies()[0].paused
    assert second.get_volume(data).mapped_hosts == ("host-a",)
    assert second.get_volume(clone.id).path == clone.path
    # Content: blobs and the directory copy both come back through the new instance.
    assert second.read_blob(mem, "marker") == b"v2"
    second.restore_volume(mem, group.for_volume(mem).id)
    second.restore_volume(data, group.for_volume(data).id)
    assert second.read_blob(mem, "marker") == b"\x00v1"
    assert (volume / "PG_VERSION").read_text() == "15\n"
    # Secure flags persist; ids continue where the first instance stopped.
    with pytest.raises(BackendError, match="secure"):
        second.delete_snapshot_group(group.id)
    assert second.create_snapshot_group([mem], "b2").id == "cg-0002"
    assert second.add_volume("more").id == "vol-0004"
    # ... and the first instance sees what the second did (it reloads before each call).
    assert [g.name for g in first.list_snapshots()][-1] == "b2"
    first.ex_expire_secure(group.snapshots[0].id)
    assert not second.list_snapshots()[0].secure


def test_state_file_default_root_is_kept_next_to_it(tmp_path: Path) -> None:
    state, _, volume = _state_dir(tmp_path)
    backend = MockBackend(state_file=state)
    vid = backend.add_volume("data", path=volume).id
    snap = backend.create_snapshot_group([vid], "b1").snapshots[0]
    backend.close()  # a persistent root is never removed
    assert backend.root == state.with_name("mock.json.d")
    assert Path(snap.extra["path"]).is_relative_to(backend.root)
    assert Path(snap.extra["path"], "PG_VERSION").exists()
    assert MockBackend(state_file=state).list_snapshots() == (snap,)


def test_failed_calls_leave_the_state_file_consistent(tmp_path: Path) -> None:
    state, root, volume = _state_dir(tmp_path)
    backend = MockBackend(state_file=state, root=root)
    v1 = backend.add_volume("data", path=volume).id
    v2 = backend.add_volume("mem").id
    backend.inject_fault("snapshot_volume", on_call=2)
    with pytest.raises(BackendUnavailable):
        backend.create_snapshot_group([v1, v2], "b1")
    again = MockBackend(state_file=state, root=root)
    assert again.list_snapshots() == ()
    assert again.create_snapshot_group([v1, v2], "b1").id == "cg-0001"
    assert sorted(p.name for p in (root / "snapshots").iterdir()) == ["snap-0001"]


def test_volumes_option_adds_configured_volumes_once(tmp_path: Path) -> None:
    state, root, volume = _state_dir(tmp_path)
    specs: list[dict[str, Any]] = [
        {"id": "vol-data", "name": "pgdata", "path": str(volume)},
        {"id": "vol-mem", "size_bytes": 10},
    ]
    first = MockBackend(state_file=state, root=root, volumes=specs)
    listed = first.list_volumes()
    assert [(v.id, v.name, v.path) for v in listed] == [
        ("vol-data", "pgdata", str(volume)),
        ("vol-mem", "vol-mem", None),
    ]
    first.create_snapshot_group(["vol-data"], "b1")
    # Idempotent by id: a second construction (the next CLI command) adds nothing,
    # and a state that did not change is not rewritten.
    before = state.stat()
    second = MockBackend(state_file=state, root=root, volumes=specs)
    assert second.list_volumes() == listed
    after = state.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert len(second.list_snapshots()) == 1
    # Through the registry, as a TOML [storage.options] table gives it (strings only).
    from pgsnap.backends import BackendRegistry

    made = BackendRegistry(plugins=False).create(
        "mock", state_file=str(state), root=str(root), volumes=specs, capabilities=["clones"]
    )
    assert [v.id for v in made.list_volumes()] == ["vol-data", "vol-mem"]
    # Without a state file the volumes are simply added.
    assert [v.id for v in MockBackend(volumes=specs[1:]).list_volumes()] == ["vol-mem"]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"id": "vol-data", "path": "/elsewhere"}, "configured with path"),
        ({"id": "v", "name": "x", "pth": "/typo"}, "unknown key"),
        ({"name": "no id"}, "needs an id"),
        ({"id": "v", "size_bytes": "big"}, "size_bytes"),
        ("vol-data", "must be a table"),
    ],
)
def test_volumes_option_errors(tmp_path: Path, spec: Any, match: str) -> None:
    state, root, volume = _state_dir(tmp_path)
    MockBackend(state_file=state, root=root, volumes=[{"id": "vol-data", "path": str(volume)}])
    with pytest.raises(ConfigurationError, match=match):
        MockBackend(state_file=state, root=root, volumes=[spec])


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{not json", "is corrupt"),
        ('{"format": "something-else", "version": 1}', "not a mock state file"),
        ('{"format": "pgsnap-mock-state", "version": 99}', "state version 99; this pgsnap reads"),
        ('{"format": "pgsnap-mock-state", "version": 1}', "KeyError"),
        (
            '{"format": "pgsnap-mock-state", "version": 1, "root": null, "counters": {},'
            ' "volumes": [{"id": 7}], "snapshots": [], "groups": [], "policies": []}',
            "volumes\\[0\\].id",
        ),
        (
            '{"format": "pgsnap-mock-state", "version": 1, "root": null, "counters": {},'
            ' "volumes": [], "snapshots": [], "policies": [], "groups": [{"id": "cg-0001",'
            ' "name": "b", "created_at": "2025-01-01T00:00:00+00:00",'
            ' "snapshot_ids": ["snap-0009"], "policy_id": null}]}',
            "unknown snapshot",
        ),
    ],
)
def test_corrupt_state_file_is_a_clear_backend_error(
    tmp_path: Path, content: str, match: str
) -> None:
    state = tmp_path / "mock.json"
    state.write_text(content)
    with pytest.raises(BackendError, match=match) as info:
        MockBackend(state_file=state)
    err = info.value
    assert str(state) in err.message
    assert err.details["state_file"] == str(state)
    assert err.hint is not None
    assert "move it away" in err.hint
    assert pickle.loads(pickle.dumps(err)).details == err.details
    assert state.read_text() == content  # never overwritten


def test_state_file_corrupted_later_fails_the_next_call(tmp_path: Path) -> None:
    state = tmp_path / "mock.json"
    backend = MockBackend(state_file=state)
    vid = backend.add_volume("data").id
    state.write_bytes(b"\xff\xfe garbage")
    with pytest.raises(BackendError, match="state file"):
        backend.create_snapshot_group([vid], "b1")


_WORKER = """
import sys
from pgsnap.backends.mock import MockBackend

state, worker, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
backend = MockBackend(state_file=state, volumes=[{"id": "shared"}])
own = backend.add_volume(f"w{worker}").id
for i in range(rounds):
    backend.write_blob(own, "n", str(i).encode())
    backend.create_snapshot_group(["shared", own], f"w{worker}-{i}")
"""


def test_concurrent_processes_do_not_lose_or_corrupt_state(tmp_path: Path) -> None:
    import subprocess
    import sys

    import pgsnap

    state = tmp_path / "mock.json"
    workers, rounds = 4, 15
    src = str(Path(pgsnap.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(state), str(w), str(rounds)],
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        for w in range(workers)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    backend = MockBackend(state_file=state)
    snaps = backend.list_snapshots()
    assert len(snaps) == 2 * workers * rounds  # no update lost
    assert len({s.id for s in snaps}) == len(snaps)
    assert len({s.group_id for s in snaps}) == workers * rounds
    assert [v.id for v in backend.list_volumes()] == ["shared"] + [
        f"vol-{n:04d}" for n in range(1, workers + 1)
    ]
    for w in range(workers):
        vid = next(v.id for v in backend.list_volumes() if v.name == f"w{w}")
        assert backend.read_blob(vid, "n") == str(rounds - 1).encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mock.json", "mock.json.lock"]


# --------------------------------------------------------------------------- locate and restore profiles


def test_locate_directories_mode(tmp_path: Path) -> None:
    volume = tmp_path / "pgdata"
    volume.mkdir()
    backend = MockBackend(root=tmp_path / "root")
    directory = backend.add_volume("data", path=volume).id
    memory = backend.add_volume("mem").id
    assert backend.locate(directory) == Location.directory(str(volume))
    assert backend.locate(memory) == Location.device(f"/dev/pgsnap-mock/{memory}")
    assert not Path(backend.locate(memory).path).exists()
    with pytest.raises(VolumeNotFound) as info:
        backend.locate("vol-9999")
    assert info.value.volume_id == "vol-9999"
    assert backend.restore_profile(directory) == RestoreProfile()
    assert backend.restore_profile(memory) == RestoreProfile()
    assert not backend.restore_profile(directory).completes_later
    with pytest.raises(VolumeNotFound):
        backend.restore_profile("vol-9999")


def test_new_protocol_methods_are_fault_points(backend: MockBackend) -> None:
    for method in ("attach", "detach", "locate", "restore_profile", "wait_for_restore"):
        assert method in FAULT_POINTS
    assert "map_volume" not in FAULT_POINTS
    vid = backend.add_volume("data").id
    backend.inject_fault("locate")
    with pytest.raises(BackendUnavailable):
        backend.locate(vid)
    backend.inject_fault("restore_profile")
    with pytest.raises(BackendUnavailable):
        backend.restore_profile(vid)
    assert backend.locate(vid).kind is LocationKind.BLOCK_DEVICE


def test_wait_for_restore_returns_at_once_without_async(backend: MockBackend) -> None:
    vid = backend.add_volume("data").id
    backend.wait_for_restore(vid, timeout=0)  # nothing restored: nothing to wait for
    snap = backend.create_snapshot_group([vid], "b1").snapshots[0]
    backend.restore_volume(vid, snap.id)
    assert "restoring" not in backend.get_volume(vid).extra
    backend.wait_for_restore(vid, timeout=0)
    with pytest.raises(VolumeNotFound):
        backend.wait_for_restore("vol-9999", timeout=0)


# --------------------------------------------------------------------------- block mode


def _block(tmp_path: Path, **options: Any) -> tuple[MockBackend, str, Path]:
    """A block-mode mock with one directory volume (its LUN holds PG_VERSION)."""
    lun = tmp_path / "lun-data"
    lun.mkdir()
    (lun / "PG_VERSION").write_text("15\n")
    backend = MockBackend(root=tmp_path / "root", block=True, **options)
    return backend, backend.add_volume("data", path=lun).id, lun


def test_block_mode_needs_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="MAPPING"):
        MockBackend(block=True, capabilities=[Capability.CLONES])
    with pytest.raises(ConfigurationError, match="block must be true or false"):
        MockBackend(block="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="async_restore"):
        MockBackend(async_restore=1)  # type: ignore[arg-type]
    assert not (tmp_path / "state.json").exists()
    with pytest.raises(ConfigurationError, match="MAPPING"):
        MockBackend(block=True, capabilities=(), state_file=tmp_path / "state.json")
    assert not (tmp_path / "state.json").exists()  # a refused construction writes nothing


def test_block_volume_is_a_device_that_exists_while_attached(tmp_path: Path) -> None:
    backend, vid, lun = _block(tmp_path)
    assert backend.block
    assert "mode=block" in repr(backend)
    device = tmp_path / "root" / "dev" / vid
    assert backend.locate(vid) == Location.device(str(device))
    record = backend.get_volume(vid)
    assert record.path is None  # the LUN is not for the host
    assert record.extra["kind"] == "block"
    assert record.extra["lun"] == str(lun)
    assert not os.path.lexists(device)
    backend.attach(vid, "db1")
    assert os.readlink(device) == str(lun)
    assert (device / "PG_VERSION").read_text() == "15\n"
    backend.attach(vid, "db1")  # idempotent
    backend.attach(vid, "db2")
    backend.detach(vid, "db1")
    assert os.path.lexists(device)  # db2 still sees it
    backend.detach(vid, "db2")
    assert not os.path.lexists(device)
    backend.detach(vid, "db2")  # idempotent
    assert backend.restore_profile(vid) == RestoreProfile(before=RestorePreparation.DETACH)
    # In-memory volumes in block mode: a device that never exists, restored detached too.
    mem = backend.add_volume("mem").id
    assert backend.locate(mem) == Location.device(f"/dev/pgsnap-mock/{mem}")
    backend.attach(mem, "db1")
    assert not os.path.lexists(f"/dev/pgsnap-mock/{mem}")
    assert backend.restore_profile(mem).detaches


def test_block_restore_of_an_attached_volume_fails(tmp_path: Path) -> None:
    backend, vid, lun = _block(tmp_path)
    snap = backend.create_snapshot_group([vid], "b1").snapshots[0]
    (lun / "PG_VERSION").write_text("16\n")
    backend.attach(vid, "db2")
    backend.attach(vid, "db1")
    with pytest.raises(BackendError, match="attached to host\\(s\\) db1, db2") as info:
        backend.restore_volume(vid, snap.id)
    err = info.value
    assert not isinstance(err, LookupError)
    assert err.hint is not None
    assert "detach" in err.hint
    assert err.details["hosts"] == ("db1", "db2")
    assert pickle.loads(pickle.dumps(err)).details == err.details
    assert (lun / "PG_VERSION").read_text() == "16\n"  # untouched
    backend.detach(vid, "db1")
    with pytest.raises(BackendError, match="db2"):
        backend.restore_volume(vid, snap.id)
    backend.detach(vid, "db2")
    backend.restore_volume(vid, snap.id)
    assert (lun / "PG_VERSION").read_text() == "15\n"
    backend.attach(vid, "db1")
    assert (tmp_path / "root" / "dev" / vid / "PG_VERSION").read_text() == "15\n"


def test_block_mode_volume_ids_name_device_nodes(tmp_path: Path) -> None:
    backend, _, _ = _block(tmp_path)
    (tmp_path / "other").mkdir()
    for bad in ("a/b", "..", "."):
        with pytest.raises(ConfigurationError, match="cannot name a device node"):
            backend.add_volume("x", path=tmp_path / "other", volume_id=bad)
    assert backend.add_volume("x", path=tmp_path / "other", volume_id="vol-x").id == "vol-x"


def test_block_clones_are_block_devices(tmp_path: Path) -> None:
    backend, vid, _ = _block(tmp_path)
    snap = backend.create_snapshot_group([vid], "b1").snapshots[0]
    clone = backend.clone_snapshot(snap.id, "dev")
    assert clone.path is None
    assert clone.extra["kind"] == "block"
    assert backend.locate(clone.id).path == str(tmp_path / "root" / "dev" / clone.id)
    backend.attach(clone.id, "db1")
    assert (Path(backend.locate(clone.id).path) / "PG_VERSION").read_text() == "15\n"


# --------------------------------------------------------------------------- restores that complete later


def test_async_restore_is_restoring_until_waited_for(tmp_path: Path) -> None:
    backend, vid, lun = _block(tmp_path, async_restore=True)
    assert backend.async_restore
    assert backend.restore_profile(vid) == RestoreProfile(
        before=RestorePreparation.DETACH, completes_later=True
    )
    snap = backend.create_snapshot_group([vid], "b1").snapshots[0]
    (lun / "PG_VERSION").write_text("16\n")
    backend.restore_volume(vid, snap.id)
    assert backend.get_volume(vid).extra["restoring"] == snap.id
    refused: list[Callable[[], object]] = [
        lambda: backend.attach(vid, "db1"),
        lambda: backend.create_snapshot_group([vid], "b2"),
        lambda: backend.restore_volume(vid, snap.id),
    ]
    for call in refused:
        with pytest.raises(BackendError, match="being restored") as info:
            call()
        assert info.value.hint is not None
        assert "wait_for_restore" in info.value.hint
        assert not isinstance(info.value, LookupError)
    assert backend.get_volume(vid).mapped_hosts == ()
    assert len(backend.list_snapshots()) == 1
    # A failed wait leaves it restoring; a successful one completes it.
    backend.inject_fault("wait_for_restore")
    with pytest.raises(BackendUnavailable):
        backend.wait_for_restore(vid, timeout=10)
    assert "restoring" in backend.get_volume(vid).extra
    backend.wait_for_restore(vid, timeout=10)
    assert "restoring" not in backend.get_volume(vid).extra
    backend.wait_for_restore(vid, timeout=10)
    backend.attach(vid, "db1")
    assert (tmp_path / "root" / "dev" / vid / "PG_VERSION").read_text() == "15\n"
    assert len(backend.create_snapshot_group([vid], "b2").snapshots) == 1
    with pytest.raises(VolumeNotFound):
        backend.wait_for_restore("vol-9999", timeout=1)


def test_async_restore_without_block_mode(backend: MockBackend) -> None:
    mock = MockBackend(async_restore=True)
    vid = mock.add_volume("data").id
    mock.write_blob(vid, "k", b"v1")
    snap = mock.create_snapshot_group([vid], "b1").snapshots[0]
    mock.write_blob(vid, "k", b"v2")
    assert mock.restore_profile(vid) == RestoreProfile(completes_later=True)
    mock.restore_volume(vid, snap.id)
    assert mock.read_blob(vid, "k") == b"v1"  # content copied already
    with pytest.raises(BackendError, match="being restored"):
        mock.attach(vid, "db1")
    mock.wait_for_restore(vid, timeout=1)
    mock.attach(vid, "db1")


# --------------------------------------------------------------------------- the mode in the state file


def test_mode_is_persisted_and_fixed(tmp_path: Path) -> None:
    import json

    state = tmp_path / "mock.json"
    lun = tmp_path / "lun"
    lun.mkdir()
    first = MockBackend(state_file=state, block=True, async_restore=True)
    assert state.exists()  # the mode is pinned at once
    vid = first.add_volume("data", path=lun).id
    snap = first.create_snapshot_group([vid], "b1").snapshots[0]
    first.restore_volume(vid, snap.id)
    # Left out: the state file's mode.
    second = MockBackend(state_file=state)
    assert (second.block, second.async_restore) == (True, True)
    assert second.get_volume(vid).extra["restoring"] == snap.id  # restoring persists
    with pytest.raises(BackendError, match="being restored"):
        second.attach(vid, "db1")
    second.wait_for_restore(vid, timeout=1)
    first.attach(vid, "db1")  # the first instance sees the completed restore
    assert os.readlink(tmp_path / "mock.json.d" / "dev" / vid) == str(lun)
    # Given and different: refused, naming the option.
    with pytest.raises(ConfigurationError, match="created with block = true") as info:
        MockBackend(state_file=state, block=False)
    assert info.value.details["option"] == "block"
    assert info.value.hint is not None
    assert "new state_file" in info.value.hint
    with pytest.raises(ConfigurationError, match="async_restore = true, not false"):
        MockBackend(state_file=state, async_restore=False)
    # A refused construction leaves the state file as it was.
    assert json.loads(state.read_text())["mode"] == {"block": True, "async_restore": True}
    # A state file in block mode needs MAPPING, whoever opens it.
    with pytest.raises(ConfigurationError, match="MAPPING"):
        MockBackend(state_file=state, capabilities=["clones"])
    # Through the registry, as a TOML [storage.options] table gives it.
    from pgsnap.backends import BackendRegistry

    made = BackendRegistry(plugins=False).create(
        "mock", state_file=str(state), block=True, async_restore=True
    )
    assert made.locate(vid).kind is LocationKind.BLOCK_DEVICE


def test_mode_switched_behind_a_backend_is_a_clear_error(tmp_path: Path) -> None:
    state = tmp_path / "mock.json"
    backend = MockBackend(state_file=state)
    vid = backend.add_volume("data").id
    state.unlink()
    MockBackend(state_file=state, block=True)  # another process starts over in block mode
    with pytest.raises(BackendError, match="now in block mode") as info:
        backend.get_volume(vid)
    assert info.value.details["state_file"] == str(state)


_V1_STATE = {
    "format": "pgsnap-mock-state",
    "version": 1,
    "root": None,
    "counters": {"vol": 1, "snap": 1, "cg": 1},
    "volumes": [
        {
            "id": "vol-0001",
            "name": "data",
            "size_bytes": 5,
            "path": None,
            "hosts": ["db1"],
            "extra": {"kind": "memory"},
            "blobs": {"k": "djE="},
        }
    ],
    "snapshots": [
        {
            "record": {
                "format_version": "1.0",
                "type": "Snapshot",
                "id": "snap-0001",
                "volume_id": "vol-0001",
                "name": "b1",
                "created_at": "2025-01-01T12:00:00+00:00",
                "group_id": "cg-0001",
                "secure": False,
                "extra": {},
            },
            "seq": 1,
            "home": None,
            "policy_id": None,
            "blobs": {"k": "djA="},
        }
    ],
    "groups": [
        {
            "id": "cg-0001",
            "name": "b1",
            "created_at": "2025-01-01T12:00:00+00:00",
            "snapshot_ids": ["snap-0001"],
            "policy_id": None,
        }
    ],
    "policies": [],
}


def test_version_1_state_file_is_migrated(tmp_path: Path) -> None:
    import json

    state = tmp_path / "mock.json"
    state.write_text(json.dumps(_V1_STATE))
    backend = MockBackend(state_file=state)
    assert (backend.block, backend.async_restore) == (False, False)
    assert backend.get_volume("vol-0001").mapped_hosts == ("db1",)
    assert backend.read_blob("vol-0001", "k") == b"v1"
    backend.restore_volume("vol-0001", "snap-0001")
    assert backend.read_blob("vol-0001", "k") == b"v0"
    saved = json.loads(state.read_text())
    assert saved["version"] == 3
    assert saved["mode"] == {"block": False, "async_restore": False}
    assert saved["mounts"] == []
    assert saved["copying"] == []
    assert saved["volumes"][0]["restoring"] is None
    assert backend.create_snapshot_group(["vol-0001"], "b2").id == "cg-0002"
    # A version 1 state was never in block mode: asking for it is refused.
    state.write_text(json.dumps(_V1_STATE))
    with pytest.raises(ConfigurationError, match="created with block = false"):
        MockBackend(state_file=state, block=True)


def test_version_2_state_file_is_migrated_and_skips_what_a_killed_copy_left(
    tmp_path: Path,
) -> None:
    import json

    state = tmp_path / "mock.json"
    v2: dict[str, Any] = json.loads(json.dumps(_V1_STATE))
    v2.update(version=2, mode={"block": False, "async_restore": False}, mounts=[])
    v2["volumes"][0]["restoring"] = None
    state.write_text(json.dumps(v2))
    # What a copy killed under version 2 left: a snapshot home no state records.
    stray = tmp_path / "mock.json.d" / "snapshots" / "snap-0002" / "tree"
    stray.mkdir(parents=True)
    backend = MockBackend(state_file=state)
    assert backend.read_blob("vol-0001", "k") == b"v1"
    volume = tmp_path / "pgdata"
    volume.mkdir()
    (volume / "PG_VERSION").write_text("15\n")
    vid = backend.add_volume("data", path=volume).id
    group = backend.create_snapshot_group([vid], "b2")
    assert (group.id, group.snapshots[0].id) == ("cg-0002", "snap-0003")  # snap-0002 skipped
    assert Path(group.snapshots[0].extra["path"], "PG_VERSION").read_text() == "15\n"
    assert stray.is_dir()  # not recorded, so not known to be ours: left alone
    saved = json.loads(state.read_text())
    assert (saved["version"], saved["copying"]) == (3, [])


_V3_EMPTY = (
    '{"format": "pgsnap-mock-state", "version": 3, "mode": {"block": false,'
    ' "async_restore": false}, "root": null, "counters": {}, "volumes": [],'
    ' "snapshots": [], "groups": [], "policies": [], "mounts": [], '
)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (_V3_EMPTY[:-2] + "}", "KeyError"),
        (
            _V3_EMPTY + '"copying": [{"id": "snap-0001", "path": "rel/snap-0001", "pid": 1,'
            ' "started": "2025-01-01T00:00:00+00:00", "dev": 1, "ino": 2}]}',
            "not absolute",
        ),
        (
            _V3_EMPTY + '"copying": [{"id": "snap-0001", "path": "/r/snap-0001", "pid": 1,'
            ' "started": "2025-01-01T00:00:00", "dev": 1, "ino": 2}]}',
            "naive time",
        ),
    ],
)
def test_corrupt_version_3_state_is_a_clear_backend_error(
    tmp_path: Path, content: str, match: str
) -> None:
    state = tmp_path / "mock.json"
    state.write_text(content)
    with pytest.raises(BackendError, match=match):
        MockBackend(state_file=state)
    assert state.read_text() == content


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ('{"format": "pgsnap-mock-state", "version": 2}', "KeyError"),
        (
            '{"format": "pgsnap-mock-state", "version": 2, "mode": {"block": "yes",'
            ' "async_restore": false}}',
            "mode.block",
        ),
        (
            '{"format": "pgsnap-mock-state", "version": 2, "mode": {"block": false,'
            ' "async_restore": false}, "root": null, "counters": {}, "volumes": [],'
            ' "snapshots": [], "groups": [], "policies": [], "mounts": [{"host": "h",'
            ' "volume_id": "vol-0009", "target": "/mnt", "mode": 493, "uid": 0, "gid": 0}]}',
            "unknown volume vol-0009",
        ),
    ],
)
def test_corrupt_version_2_state_is_a_clear_backend_error(
    tmp_path: Path, content: str, match: str
) -> None:
    state = tmp_path / "mock.json"
    state.write_text(content)
    with pytest.raises(BackendError, match=match):
        MockBackend(state_file=state)
    assert state.read_text() == content


def test_simulated_host_is_a_host_named_like_its_base() -> None:
    from pgsnap.host import Host, LocalRunner
    from pgsnap.host.simulated import SimulatedHost

    backend = MockBackend(block=True)
    base = Host(LocalRunner(), name="db1")
    host = backend.simulated_host(base)
    assert isinstance(host, SimulatedHost)
    assert isinstance(host, Host)
    assert host.name == "db1"
    assert host.runner is base.runner
    assert host.devices is backend.devices
    assert "db1" in repr(host)
    assert isinstance(backend.simulated_host(), SimulatedHost)


def test_directory_snapshots_can_be_read_in_place_for_a_copy(tmp_path: Path) -> None:
    from pgsnap.protocols import ReadableSnapshots

    backend = MockBackend(root=tmp_path / "root")
    assert isinstance(backend, ReadableSnapshots)
    data = tmp_path / "data"
    data.mkdir()
    (data / "PG_VERSION").write_text("15\n")
    vol = backend.add_volume("pgdata", path=data)
    memory = backend.add_volume("mem")
    group = backend.create_snapshot_group([vol.id, memory.id], "g")
    (data / "PG_VERSION").write_text("changed\n")
    where = backend.snapshot_access(group.for_volume(vol.id).id)
    assert (Path(where.path) / "PG_VERSION").read_text() == "15\n"
    with pytest.raises(UnsupportedCapability, match="in memory"):
        backend.snapshot_access(group.for_volume(memory.id).id)
    with pytest.raises(SnapshotNotFound):
        backend.snapshot_access("snap-9999")


# --------------------------------------------------------------------------- space


@pytest.mark.parametrize("reflinks", [False, True], ids=["hard-links", "reflinks-if-any"])
def test_snapshots_share_what_did_not_change_and_stay_what_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reflinks: bool
) -> None:
    """Issue 26: the mock kept a full copy per snapshot (3.4 GB after 40 demos). An
    unchanged file is now shared with the volume's previous snapshot (a hard link, on a
    file system without reflinks; a reflink shares its blocks where there are some);
    a file changed in place, even within the same time stamp and size, is copied; and
    nothing written to the volume, restored or deleted later changes another snapshot."""
    from pgsnap.backends.mock import _files

    if not reflinks:
        monkeypatch.setattr(_files, "reflink", lambda src, dst: False)
    volume = tmp_path / "pgdata"
    volume.mkdir()
    (volume / "base").mkdir()
    (volume / "base" / "big").write_bytes(b"x" * 200_000)
    (volume / "same-size").write_bytes(b"AAAA")
    backend = MockBackend(root=tmp_path / "root")
    vid = backend.add_volume("data", path=volume).id
    first = backend.create_snapshot_group([vid], "b1").snapshots[0]
    one = backend.disk_usage()
    # Changed in place with the same size and the same time stamp (a coarse clock).
    st = os.stat(volume / "same-size")
    (volume / "same-size").write_bytes(b"BBBB")
    os.utime(volume / "same-size", ns=(st.st_atime_ns, st.st_mtime_ns))
    second = backend.create_snapshot_group([vid], "b2").snapshots[0]
    two = backend.disk_usage()
    tree1 = Path(backend.snapshot_access(first.id).path or "")
    tree2 = Path(backend.snapshot_access(second.id).path or "")
    big1, big2 = os.stat(tree1 / "base" / "big"), os.stat(tree2 / "base" / "big")
    if not reflinks:
        assert big1.st_ino == big2.st_ino  # one file, linked
        assert two[0] < one[0] + 100_000  # the second snapshot took no room for it
    assert two[1] == 2 * one[1]  # both hold every byte, as copies
    assert (tree1 / "same-size").read_bytes() == b"AAAA"
    assert (tree2 / "same-size").read_bytes() == b"BBBB"
    assert os.stat(tree1 / "same-size").st_ino != os.stat(tree2 / "same-size").st_ino

    (volume / "base" / "big").write_bytes(b"y" * 200_000)  # the volume moves on
    backend.restore_volume(vid, first.id)
    assert (volume / "base" / "big").read_bytes() == b"x" * 200_000
    (volume / "base" / "big").write_bytes(b"z" * 200_000)  # written after a restore
    backend.delete_snapshot(first.id)
    assert (tree2 / "base" / "big").read_bytes() == b"x" * 200_000
    assert (tree2 / "same-size").read_bytes() == b"BBBB"
    assert backend.disk_usage()[1] == one[1]
