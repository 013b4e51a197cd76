"""Host mounts on real file systems: tmpfs mounts, an ext4 loop device, busy unmounts.

Everything here mounts for real, so it needs root (this machine kind runs the
tests as root; without root the tests skip, or fail under
``PGSNAP_REQUIRE_POSTGRES=1``). Every mount is made under a fresh directory in
/tmp, and the fixture unmounts whatever is left there (lazily, as a last
resort) and detaches the loop devices it made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from pgsnap.errors import CommandError, DeviceNotFound, MountBusyError, MountError
from pgsnap.host import CommandResult, Host, LocalRunner
from pgsnap.host.host import _FINDMNT_COLUMNS, _parse_findmnt
from pgsnap.model import Mount

from ..conftest import postgres_required

pytestmark = pytest.mark.xdist_group("loop")


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        if postgres_required():
            pytest.fail("mount tests need root (PGSNAP_REQUIRE_POSTGRES=1)", pytrace=False)
        pytest.skip("mount tests need root")


class WithoutFindmnt:
    """A local runner on a host where findmnt is not installed (its commands exit 127)."""

    description = "local"

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        stdin: bytes | None = None,
        timeout: float = 60.0,
    ) -> CommandResult:
        args = list(argv)
        if args[0] == "findmnt":
            args[0] = "pgsnap-findmnt-is-not-installed"
        return LocalRunner().run(args, user=user, stdin=stdin, timeout=timeout)


def _mounts_under(base: str) -> list[str]:
    return [m.target for m in Host().mounts() if m.target.startswith(base + "/")]


@pytest.fixture
def base() -> Iterator[Path]:
    """A fresh directory under /tmp; mounts left below it are removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="pgsnap-mounts-", dir="/tmp"))
    yield path
    for _ in range(10):
        left = _mounts_under(str(path))
        if not left:
            break
        for target in sorted(left, key=len, reverse=True):
            if subprocess.run(["umount", target], check=False, capture_output=True).returncode:
                subprocess.run(["umount", "-l", target], check=False, capture_output=True)
    shutil.rmtree(path, ignore_errors=True)


def tmpfs(target: Path, source: str = "pgsnap-test") -> Path:
    """Mount a small tmpfs on ``target`` (created) without going through Host."""
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", source, str(target)],
        check=True,
        capture_output=True,
    )
    return target


def mount_of(host: Host, path: str) -> Mount:
    """``host.mount_of(path)``, never None here: some mount holds every path."""
    found = host.mount_of(path)
    assert found is not None, path
    return found


@pytest.fixture
def loop_device(base: Path) -> Iterator[Callable[[], str]]:
    """``loop_device()``: a fresh ext4 file system on a loop device; detached afterwards."""
    devices: list[str] = []

    def make() -> str:
        image = base / f"disk{len(devices)}.img"
        with open(image, "wb") as fh:
            fh.truncate(16 << 20)
        device = subprocess.run(
            ["losetup", "-f", "--show", str(image)], check=True, capture_output=True, text=True
        ).stdout.strip()
        devices.append(device)
        subprocess.run(["mkfs.ext4", "-q", "-F", device], check=True, capture_output=True)
        return device

    yield make
    for device in devices:
        for target in [m.target for m in Host().mounts() if m.source == device]:
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)
        subprocess.run(["losetup", "-d", device], check=False, capture_output=True)


def spawn(argv: list[str], **kwargs) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, **kwargs)
    time.sleep(0.2)
    return proc


# --------------------------------------------------------------------------- listing


def test_mounts_lists_a_new_mount_with_an_awkward_name(base):
    target = tmpfs(base / "with space\nand newline", source="pgsnap-awkward")
    mounts = Host().mounts()
    mine = [m for m in mounts if m.target == str(target)]
    assert len(mine) == 1
    assert (mine[0].source, mine[0].fstype) == ("pgsnap-awkward", "tmpfs")
    assert "rw" in mine[0].options and "size=4096k" in mine[0].options
    assert mounts[0].target == "/" or any(m.target == "/" for m in mounts)


def test_mountinfo_fallback_reads_the_same_as_findmnt(base):
    tmpfs(base / "a b\\c\td", source="pgsnap-fallback")
    tmpfs(base / "ro", source="pgsnap-ro")
    subprocess.run(["mount", "-o", "remount,ro", str(base / "ro")], check=True)
    (base / "src").mkdir()
    (base / "bound").mkdir()
    subprocess.run(["mount", "--bind", str(base / "src"), str(base / "bound")], check=True)
    listed = LocalRunner().run(["findmnt", "--json", "--list", "-o", _FINDMNT_COLUMNS])
    with_findmnt = _parse_findmnt(listed.text, "local")
    without = Host(WithoutFindmnt()).mounts()
    assert without == with_findmnt
    assert Host().mounts() == with_findmnt  # read from /proc/self/mountinfo, no command
    assert any(m.target == str(base / "a b\\c\td") for m in without)
    bound = next(m for m in without if m.target == str(base / "bound"))
    assert bound.source.endswith(f"[{base}/src]")  # the bound directory, as findmnt shows it


def test_a_host_whose_run_is_overridden_still_sees_the_mount_command() -> None:
    """Host's contract: a subclass that overrides run() sees every command, so the
    table is read from /proc only for the plain local host."""
    seen: list[str] = []

    class Audited(Host):
        def run(self, argv: Sequence[str], **kwargs: object) -> CommandResult:
            seen.append(argv[0])
            return super().run(argv, **kwargs)  # type: ignore[arg-type]

    assert Audited().mounts() == Host().mounts()
    assert seen == ["findmnt"]


def test_mount_of_is_the_longest_mount_point_above_the_real_path(base):
    data = tmpfs(base / "data", source="pgsnap-data")
    nested = tmpfs(data / "pg_wal", source="pgsnap-wal")
    (base / "data2").mkdir()
    (base / "link").symlink_to(data)
    host = Host()
    assert mount_of(host, str(data)).source == "pgsnap-data"
    assert mount_of(host, str(data / "base" / "1")).source == "pgsnap-data"  # need not exist
    assert mount_of(host, str(nested / "000000010000000000000001")).source == "pgsnap-wal"
    assert mount_of(host, str(base / "link" / "file")).source == "pgsnap-data"
    # /tmp/x/data is not a prefix of /tmp/x/data2 by path components.
    outer = host.mount_of(str(base / "data2" / "file"))
    assert outer is not None and outer.source not in ("pgsnap-data", "pgsnap-wal")
    assert mount_of(host, "/").target == "/"


def test_mount_of_sees_the_top_of_stacked_mounts(base):
    target = tmpfs(base / "stack", source="pgsnap-below")
    tmpfs(target, source="pgsnap-above")
    assert mount_of(Host(), str(target / "f")).source == "pgsnap-above"


# --------------------------------------------------------------------------- mount


def test_mount_tmpfs_and_again_is_a_no_op(base):
    host = Host()
    target = base / "mnt point"
    target.mkdir()
    host.mount("pgsnap-t1", str(target), fstype="tmpfs", options=("size=1m", "noatime"))
    mine = [m for m in host.mounts() if m.target == str(target)]
    assert [(m.source, m.fstype) for m in mine] == [("pgsnap-t1", "tmpfs")]
    assert "noatime" in mine[0].options
    host.mount("pgsnap-t1", str(target), fstype="tmpfs", options=("size=1m", "noatime"))
    assert len([m for m in host.mounts() if m.target == str(target)]) == 1


def test_mount_over_something_else_is_refused(base):
    host = Host()
    target = tmpfs(base / "taken", source="pgsnap-first")
    with pytest.raises(MountError) as info:
        host.mount("pgsnap-second", str(target), fstype="tmpfs")
    assert info.value.target == str(target)
    assert info.value.host == "local"
    assert "pgsnap-first" in str(info.value)
    with pytest.raises(MountError, match="read-write, not read-only"):
        host.mount("pgsnap-first", str(target), fstype="tmpfs", options=("ro",))
    assert [m.source for m in host.mounts() if m.target == str(target)] == ["pgsnap-first"]


def test_mount_a_device_compares_resolved_device_paths(base, loop_device):
    host = Host()
    device, other = loop_device(), loop_device()
    alias = base / "by-id" / "pgsnap-volume"
    alias.parent.mkdir()
    alias.symlink_to(device)
    target = base / "pgdata"
    target.mkdir()
    host.mount(str(alias), str(target), fstype="ext4")
    assert mount_of(host, str(target)).source == device
    host.mount(device, str(target))  # the same device by another name: nothing to do
    host.mount(str(alias), str(target), fstype="ext4", options=("rw",))
    assert len([m for m in host.mounts() if m.target == str(target)]) == 1
    with pytest.raises(MountError, match=device):
        host.mount(other, str(target), fstype="ext4")
    host.unmount(str(target))
    assert mount_of(host, str(target)).target != str(target)


def test_mount_of_a_whole_device_where_a_subdirectory_of_it_is_mounted(base, loop_device):
    # findmnt shows "/dev/loopN[/sub]": the same device, but not its whole file system.
    host = Host()
    device = loop_device()
    whole, target = base / "whole", base / "target"
    whole.mkdir()
    target.mkdir()
    host.mount(device, str(whole))
    (whole / "sub").mkdir()
    host.mount(str(whole / "sub"), str(target), options=("bind",))
    assert mount_of(host, str(target)).source == f"{device}[/sub]"
    with pytest.raises(MountError, match=r"\[/sub\]"):
        host.mount(device, str(target), fstype="ext4")


def test_bind_mount_is_idempotent_and_compared_by_directory(base):
    host = Host()
    source, other, target = base / "source", base / "other", base / "target"
    for d in (source, other, target):
        d.mkdir()
    host.mount(str(source), str(target), options=("bind",))
    host.mount(str(source), str(target), options=("bind",))
    assert len([m for m in host.mounts() if m.target == str(target)]) == 1
    with pytest.raises(MountError):
        host.mount(str(other), str(target), options=("bind",))


def test_mount_failures_say_why(base):
    host = Host()
    with pytest.raises(MountError, match="make_dirs") as info:
        host.mount("pgsnap-t", str(base / "missing"), fstype="tmpfs")
    assert info.value.target == str(base / "missing")
    (base / "mnt").mkdir()
    with pytest.raises(MountError, match="does not exist"):
        host.mount(str(base / "no-such-device"), str(base / "mnt"), fstype="ext4")


# --------------------------------------------------------------------------- unmount


def test_unmount_and_unmount_again(base):
    host = Host()
    target = tmpfs(base / "gone soon")
    host.unmount(str(target))
    assert str(target) not in [m.target for m in host.mounts()]
    host.unmount(str(target))  # not a mount point: nothing to do
    host.unmount(str(base / "never existed"))


def test_unmount_busy_names_the_holders(base):
    host = Host()
    target = tmpfs(base / "busy")
    (target / "sub").mkdir()
    holder = spawn(["sleep", "30"], cwd=target / "sub")
    try:
        with pytest.raises(MountBusyError) as info:
            host.unmount(str(target))
        err = info.value
        assert err.target == str(target)
        assert err.host == "local"
        assert err.holders == (f"pid {holder.pid} sleep (user root)",)
        assert f"pid {holder.pid} sleep" in str(err)
        assert str(target) in [m.target for m in host.mounts()]  # still mounted
    finally:
        holder.kill()
        holder.wait()
    host.unmount(str(target))
    assert str(target) not in [m.target for m in host.mounts()]


def test_unmount_busy_because_of_a_nested_mount(base):
    host = Host()
    outer = tmpfs(base / "outer")
    tmpfs(outer / "inner")
    with pytest.raises(MountBusyError) as info:
        host.unmount(str(outer))
    assert info.value.holders == ()
    assert str(outer / "inner") in str(info.value.hint)


def test_recursive_remove_stays_on_its_file_system(base):
    host = Host()
    tree = base / "tree"
    mounted = tmpfs(tree / "volume")
    (mounted / "precious").write_bytes(b"data")
    (tree / "plain").write_bytes(b"")
    with pytest.raises(CommandError):
        host.remove([str(tree)], recursive=True)
    assert (mounted / "precious").read_bytes() == b"data"


# --------------------------------------------------------------------------- devices


def test_wait_for_device_that_appears(base):
    device = base / "device"
    alias = base / "alias"

    def attach() -> None:
        time.sleep(0.3)
        device.write_bytes(b"")
        alias.symlink_to(device)

    thread = threading.Thread(target=attach)
    started = time.monotonic()
    thread.start()
    try:
        assert Host().wait_for_device(str(alias), timeout=10) == str(device)
    finally:
        thread.join()
    assert 0.3 <= time.monotonic() - started < 3


def test_wait_for_device_times_out(base):
    started = time.monotonic()
    with pytest.raises(DeviceNotFound) as info:
        Host().wait_for_device(str(base / "never"), timeout=0.6)
    elapsed = time.monotonic() - started
    assert 0.6 <= elapsed < 3
    assert (info.value.device, info.value.host) == (str(base / "never"), "local")
    assert isinstance(info.value, LookupError)


def test_mount_record_shape():
    root = Host().mount_of("/")
    assert isinstance(root, Mount) and root.target == "/" and root.fstype
