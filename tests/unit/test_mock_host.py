"""The simulated host of the mock's block mode: mounts as symlinks, on real directories.

Real processes hold mounted volumes (``sleep`` with its working directory
under a mount point), so the busy checks go through ``Host.processes_using``
and its scan of ``/proc``.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgsnap.backends.mock import MockBackend
from pgsnap.errors import BackendError, DeviceNotFound, MountBusyError, MountError
from pgsnap.host import Host
from pgsnap.host.simulated import SimulatedHost
from pgsnap.model import Mount

HOST = "db1"


class World:
    """A block-mode mock with two volumes (LUNs with content) and empty mount points."""

    def __init__(self, tmp_path: Path, **options: Any) -> None:
        self.tmp = tmp_path
        self.state = tmp_path / "mock.json"
        self.backend = MockBackend(
            state_file=self.state, root=tmp_path / "root", block=True, **options
        )
        self.luns: dict[str, Path] = {}
        for name in ("data", "wal"):
            lun = tmp_path / f"lun-{name}"
            (lun / "sub").mkdir(parents=True)
            (lun / "PG_VERSION").write_text(f"{name}-v1\n")
            vid = self.backend.add_volume(name, path=lun, volume_id=f"vol-{name}").id
            self.luns[vid] = lun
        self.data, self.wal = "vol-data", "vol-wal"
        self.mnt = tmp_path / "mnt" / "pgdata"
        self.mnt.mkdir(parents=True)
        self.mnt.chmod(0o755)
        self.host = self.backend.simulated_host(Host(name=HOST))

    def device(self, vid: str) -> str:
        return self.backend.locate(vid).path

    def attach_and_mount(self, vid: str, target: Path) -> None:
        self.backend.attach(vid, HOST)
        self.host.wait_for_device(self.device(vid), timeout=5)
        self.host.mount(self.device(vid), str(target))


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started by a test, killed and reaped afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


# --------------------------------------------------------------------------- mount


def test_mount_needs_the_device_attached_to_this_host(world: World) -> None:
    device = world.device(world.data)
    with pytest.raises(MountError, match="no such device") as info:
        world.host.mount(device, str(world.mnt))
    assert info.value.target == str(world.mnt)
    assert info.value.host == "local"
    world.backend.attach(world.data, "db2")  # another host's attachment is not ours
    with pytest.raises(MountError, match="no such device"):
        world.host.mount(device, str(world.mnt))
    with pytest.raises(DeviceNotFound) as waited:
        world.host.wait_for_device(device, timeout=0.1)
    assert waited.value.device == device
    assert world.mnt.is_dir()
    assert not world.mnt.is_symlink()

    world.backend.attach(world.data, HOST)
    resolved = world.host.wait_for_device(device, timeout=5)
    assert resolved == os.path.realpath(world.luns[world.data])
    world.host.mount(device, str(world.mnt), fstype="ext4", options=("noatime",))
    assert world.mnt.is_symlink()
    assert os.readlink(world.mnt) == str(world.luns[world.data])
    assert (world.mnt / "PG_VERSION").read_text() == "data-v1\n"
    (world.mnt / "written").write_text("through the mount")
    assert (world.luns[world.data] / "written").read_text() == "through the mount"
    world.host.mount(device, str(world.mnt))  # the same device again: a no-op


def test_wait_for_device_sees_an_attach_while_it_polls(world: World) -> None:
    import threading

    device = world.device(world.data)
    timer = threading.Timer(0.3, world.backend.attach, args=(world.data, HOST))
    timer.start()
    try:
        assert world.host.wait_for_device(device, timeout=10) == str(world.luns[world.data])
    finally:
        timer.join()


def test_mount_point_must_be_an_existing_empty_directory(world: World) -> None:
    world.backend.attach(world.data, HOST)
    device = world.device(world.data)
    with pytest.raises(MountError, match="mount point does not exist"):
        world.host.mount(device, str(world.tmp / "missing"))
    (world.tmp / "file").write_text("x")
    with pytest.raises(MountError, match="not a directory"):
        world.host.mount(device, str(world.tmp / "file"))
    full = world.tmp / "full"
    full.mkdir()
    (full / "keep").write_text("mine")
    with pytest.raises(MountError, match="not empty"):
        world.host.mount(device, str(full))
    assert (full / "keep").read_text() == "mine"
    assert full.is_dir()
    assert not full.is_symlink()
    assert world.host.mounts()[-1].fstype != "mockfs"  # nothing was mounted


def test_one_device_per_mount_point_and_one_mount_per_device(world: World) -> None:
    world.attach_and_mount(world.data, world.mnt)
    world.backend.attach(world.wal, HOST)
    with pytest.raises(MountError, match="already mounted there"):
        world.host.mount(world.device(world.wal), str(world.mnt))
    other = world.tmp / "other"
    other.mkdir()
    with pytest.raises(MountError, match="already mounted on"):
        world.host.mount(world.device(world.data), str(other))
    # The device given as its resolved path is the same device.
    world.host.mount(str(world.luns[world.data]), str(world.mnt))
    assert os.readlink(world.mnt) == str(world.luns[world.data])


# --------------------------------------------------------------------------- mounts and mount_of


def test_mounts_lists_real_and_simulated_mounts(world: World) -> None:
    assert not [m for m in world.host.mounts() if m.fstype == "mockfs"]
    world.attach_and_mount(world.data, world.mnt)
    mounts = world.host.mounts()
    expected = Mount(world.device(world.data), str(world.mnt), "mockfs", ("rw",))
    assert mounts[-1] == expected
    assert any(m.target == "/" for m in mounts)  # the real ones first
    assert [m for m in mounts if m.fstype == "mockfs"] == [expected]
    # Another host (by name) on the same mock has no simulated mount.
    elsewhere = world.backend.simulated_host(Host(name="db2"))
    assert not [m for m in elsewhere.mounts() if m.fstype == "mockfs"]
    assert elsewhere.mount_of(str(world.mnt / "PG_VERSION")) != expected


def test_mount_of_matches_by_path_components(world: World) -> None:
    world.attach_and_mount(world.data, world.mnt)
    mount = Mount(world.device(world.data), str(world.mnt), "mockfs", ("rw",))
    assert world.host.mount_of(str(world.mnt)) == mount
    assert world.host.mount_of(str(world.mnt / "sub" / "not-yet")) == mount
    assert world.host.mount_of(str(world.luns[world.data] / "PG_VERSION")) == mount  # resolved
    assert world.host.mount_of(f"{world.mnt}/../pgdata/sub") == mount
    sibling = world.tmp / "mnt" / "pgdata2"
    sibling.mkdir()
    real = world.host.mount_of(str(sibling))
    assert real is not None
    assert real.fstype != "mockfs"  # a prefix of the name is not a parent
    assert world.host.mount_of(str(world.luns[world.wal])) == real


def test_nested_mounts_the_innermost_wins_and_blocks_the_outer_unmount(world: World) -> None:
    world.attach_and_mount(world.data, world.mnt)
    inner = world.mnt / "pg_wal"
    inner.mkdir()  # inside the data volume, as pg_wal on its own volume
    world.attach_and_mount(world.wal, inner)
    assert (inner / "PG_VERSION").read_text() == "wal-v1\n"
    assert world.host.mount_of(str(inner / "x")) == Mount(
        world.device(world.wal), str(inner), "mockfs", ("rw",)
    )
    with pytest.raises(MountBusyError, match="mounted under it"):
        world.host.unmount(str(world.mnt))
    world.host.unmount(str(inner))
    world.host.unmount(str(world.mnt))
    assert world.mnt.is_dir()
    assert not world.mnt.is_symlink()


# --------------------------------------------------------------------------- unmount


def test_unmount_gives_back_the_empty_directory(world: World) -> None:
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
            uid, gid = owner.pw_uid, owner.pw_gid
        except KeyError:
            uid, gid = 1234, 1234
        os.chown(world.mnt, uid, gid)
    else:
        uid, gid = os.getuid(), os.getgid()
    world.mnt.chmod(0o750)
    world.host.unmount(str(world.mnt))  # nothing mounted: a no-op
    world.attach_and_mount(world.data, world.mnt)
    (world.mnt / "new").write_text("kept on the volume")
    world.host.unmount(str(world.mnt))
    assert world.mnt.is_dir()
    assert not world.mnt.is_symlink()
    assert list(world.mnt.iterdir()) == []
    st = os.stat(world.mnt)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o750, uid, gid)
    assert (world.luns[world.data] / "new").read_text() == "kept on the volume"
    assert world.host.mount_of(str(world.mnt)) != Mount(
        world.device(world.data), str(world.mnt), "mockfs", ("rw",)
    )
    world.host.unmount(str(world.mnt))  # again: a no-op


def test_unmount_of_a_volume_in_use_names_the_processes(
    world: World, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    world.attach_and_mount(world.data, world.mnt)
    proc = subprocess.Popen(["sleep", "30"], cwd=world.mnt / "sub")
    sleepers.append(proc)
    with pytest.raises(MountBusyError) as info:
        world.host.unmount(str(world.mnt))
    err = info.value
    assert err.target == str(world.mnt)
    assert any(h.startswith(f"pid {proc.pid} sleep") for h in err.holders), err.holders
    assert f"pid {proc.pid}" in err.message
    assert world.mnt.is_symlink()  # still mounted
    proc.kill()
    proc.wait(timeout=10)
    # An open file holds it as well.
    with (world.mnt / "log").open("w") as out:
        writer = subprocess.Popen(["sleep", "30"], stdout=out)
    sleepers.append(writer)
    with pytest.raises(MountBusyError) as again:
        world.host.unmount(str(world.mnt))
    assert any(h.startswith(f"pid {writer.pid} ") for h in again.value.holders)
    writer.kill()
    writer.wait(timeout=10)
    world.host.unmount(str(world.mnt))
    assert not world.mnt.is_symlink()


# --------------------------------------------------------------------------- the storage side


def test_detach_of_a_mounted_volume_is_refused(world: World) -> None:
    world.attach_and_mount(world.data, world.mnt)
    with pytest.raises(BackendError, match="in use") as info:
        world.backend.detach(world.data, HOST)
    assert info.value.hint is not None
    assert str(world.mnt) in info.value.hint
    assert world.backend.get_volume(world.data).mapped_hosts == (HOST,)
    world.backend.attach(world.data, "db2")
    world.backend.detach(world.data, "db2")  # not mounted there: fine
    world.host.unmount(str(world.mnt))
    world.backend.detach(world.data, HOST)
    assert not os.path.lexists(world.device(world.data))
    with pytest.raises(DeviceNotFound):
        world.host.wait_for_device(world.device(world.data), timeout=0.1)


def test_a_restore_as_a_plan_runs_it(world: World) -> None:
    """unmount → detach → restore → attach → wait for the device → mount."""
    world.attach_and_mount(world.data, world.mnt)
    snap = world.backend.create_snapshot_group([world.data], "b1").snapshots[0]
    (world.mnt / "PG_VERSION").write_text("data-v2\n")
    (world.mnt / "postmaster.pid").write_text("4242")
    device = world.device(world.data)
    with pytest.raises(BackendError, match="attached to host\\(s\\) db1"):
        world.backend.restore_volume(world.data, snap.id)
    world.host.unmount(str(world.mnt))
    world.backend.detach(world.data, HOST)
    with pytest.raises(MountError, match="no such device"):
        world.host.mount(device, str(world.mnt))
    world.backend.restore_volume(world.data, snap.id)
    world.backend.attach(world.data, HOST)
    world.host.wait_for_device(device, timeout=5)
    world.host.mount(device, str(world.mnt))
    assert (world.mnt / "PG_VERSION").read_text() == "data-v1\n"
    assert not (world.mnt / "postmaster.pid").exists()


def test_an_asynchronous_restore_is_attached_only_once_complete(tmp_path: Path) -> None:
    world = World(tmp_path, async_restore=True)
    snap = world.backend.create_snapshot_group([world.data], "b1").snapshots[0]
    world.backend.restore_volume(world.data, snap.id)
    with pytest.raises(BackendError, match="being restored"):
        world.backend.attach(world.data, HOST)
    with pytest.raises(MountError, match="no such device"):
        world.host.mount(world.device(world.data), str(world.mnt))
    world.backend.wait_for_restore(world.data, timeout=5)
    world.attach_and_mount(world.data, world.mnt)
    assert (world.mnt / "PG_VERSION").read_text() == "data-v1\n"


# --------------------------------------------------------------------------- shared state


def test_two_backends_on_one_state_file_share_devices_and_mounts(world: World) -> None:
    other = MockBackend(state_file=world.state, root=world.tmp / "root")
    assert other.block
    other_host = other.simulated_host(Host(name=HOST))
    world.backend.attach(world.data, HOST)
    # The other process mounts what the first attached...
    other_host.mount(world.device(world.data), str(world.mnt))
    expected = Mount(world.device(world.data), str(world.mnt), "mockfs", ("rw",))
    # ... the first sees the mount, and its storage refuses the detach.
    assert expected in world.host.mounts()
    assert world.host.mount_of(str(world.mnt)) == expected
    with pytest.raises(BackendError, match="in use"):
        world.backend.detach(world.data, HOST)
    saved = json.loads(world.state.read_text())
    assert [(m["volume_id"], m["target"], m["host"]) for m in saved["mounts"]] == [
        (world.data, str(world.mnt), HOST)
    ]
    world.host.unmount(str(world.mnt))
    assert expected not in other_host.mounts()
    other.detach(world.data, HOST)
    assert world.backend.get_volume(world.data).mapped_hosts == ()
    # A new instance (the next pgsnap command) starts from the same table.
    third = MockBackend(state_file=world.state).simulated_host(Host(name=HOST))
    assert not [m for m in third.mounts() if m.fstype == "mockfs"]


# --------------------------------------------------------------------------- everything else is the real host


def test_in_memory_devices_never_appear(world: World) -> None:
    mem = world.backend.add_volume("mem").id
    world.backend.attach(mem, HOST)
    device = world.backend.locate(mem).path
    assert device == f"/dev/pgsnap-mock/{mem}"
    with pytest.raises(DeviceNotFound) as info:
        world.host.wait_for_device(device, timeout=0.1)
    assert info.value.device == device
    with pytest.raises(MountError, match="no such device"):
        world.host.mount(device, str(world.mnt))


def test_other_paths_go_to_the_real_host(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, tuple[Any, ...]]] = []

    def spy(name: str, result: Any = None) -> Any:
        def call(self: Host, *args: Any, **kwargs: Any) -> Any:
            assert isinstance(self, SimulatedHost)
            calls.append((name, args))
            return result

        return call

    monkeypatch.setattr(Host, "mount", spy("mount"))
    monkeypatch.setattr(Host, "unmount", spy("unmount"))
    monkeypatch.setattr(Host, "wait_for_device", spy("wait_for_device", "/dev/sdz"))
    world.host.mount("/dev/sdz", str(world.mnt), fstype="ext4", options=("noatime",))
    world.host.unmount(str(world.mnt))
    assert world.host.wait_for_device("/dev/disk/by-id/x", timeout=1) == "/dev/sdz"
    assert calls == [
        ("mount", ("/dev/sdz", str(world.mnt))),
        ("unmount", (str(world.mnt),)),
        ("wait_for_device", ("/dev/disk/by-id/x",)),
    ]
    monkeypatch.undo()
    # Files and processes are the real machine's, through the base host's runner.
    assert world.host.exists(str(world.luns[world.data] / "PG_VERSION"))
    assert world.host.process(os.getpid()) is not None


def test_a_device_wait_reports_progress_until_the_device_appears(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26: a wait for a device says what it waits for while it waits, and still
    fails with DeviceNotFound (naming the whole wait) when the device never comes."""
    import threading
    import types

    from pgsnap.errors import DeviceNotFound
    from pgsnap.operations.host import WaitForDevice

    monkeypatch.setattr("pgsnap.operations.host._SLICE", 0.2)
    told: list[str] = []
    ctx = types.SimpleNamespace(host=world.host, progress=lambda m, d: told.append(m))
    device = world.device(world.data)
    timer = threading.Timer(0.7, world.backend.attach, args=(world.data, HOST))
    timer.start()
    try:
        out = WaitForDevice(device=device, timeout=10).run(ctx)  # type: ignore[arg-type]
    finally:
        timer.join()
    assert out == {"resolved": str(world.luns[world.data])}
    assert told and all(m.startswith(f"waiting for device {device}") for m in told)
    told.clear()
    with pytest.raises(DeviceNotFound, match=r"within 0\.5 s") as info:
        WaitForDevice(device=world.device(world.wal), timeout=0.5).run(ctx)  # type: ignore[arg-type]
    assert info.value.details["timeout"] == 0.5 and told
