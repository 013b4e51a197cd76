"""Throwaway btrfs file systems on loop devices, and PostgreSQL clusters on their subvolumes.

Used by the btrfs backend's tests and by ``pgsnap demo --backend btrfs``::

    from pgsnap.testing.btrfs import LoopBtrfs, btrfs_unavailable

    reason = btrfs_unavailable()          # None when this machine can do it
    with LoopBtrfs.create() as fs:        # sparse image, losetup, mkfs.btrfs, mount
        data = fs.subvolume("data", owner="postgres", mode=0o700)

:class:`LoopBtrfs` makes a sparse image file in a fresh directory under
``/tmp`` (mode 0755, so that a server running as ``postgres`` can reach the
mount below it), attaches it with ``losetup -f --show``, formats it with
``mkfs.btrfs -q`` and mounts it at ``<directory>/mnt``. :meth:`LoopBtrfs.close`
(also at the end of a ``with`` block, and if creation fails half-way) unmounts
it (lazily as a last resort), detaches the loop device and removes the
image and the directory; it never raises, it logs what it could not undo.

:func:`btrfs_server` creates a :class:`~pgsnap.testing.pgserver.PgServer`
whose data directory and ``pg_wal`` are two subvolumes of such a file
system, and :func:`btrfs_cluster` wires a :class:`~pgsnap.cluster.Cluster`
to it with a :class:`~pgsnap.backends.btrfs.BtrfsBackend`.

Everything here needs root, btrfs in the kernel, ``losetup``, ``mount`` and
btrfs-progs; :func:`btrfs_unavailable` says which is missing. This module
runs its commands locally with :mod:`subprocess` (loop devices are local);
the backend itself goes through a :class:`~pgsnap.host.Host`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Self

from pgsnap.errors import ConfigurationError

if TYPE_CHECKING:
    from pgsnap.cluster import Cluster
    from pgsnap.executor import Event
    from pgsnap.host import Host
    from pgsnap.testing.pgserver import PgServer

__all__ = [
    "DEFAULT_SIZE",
    "LoopBtrfs",
    "btrfs_cluster",
    "btrfs_server",
    "btrfs_unavailable",
    "make_subvolumes",
]

log = logging.getLogger(__name__)

DEFAULT_SIZE: Final = 2 << 30
"""Size of the sparse image (2 GiB; only what is written takes space)."""

_TOOLS: Final = ("losetup", "mount", "umount", "mkfs.btrfs", "btrfs")


def _run(argv: Sequence[str], *, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, "LC_ALL": "C"},
    )


def _kernel_has_btrfs() -> bool:
    try:
        with open("/proc/filesystems", encoding="ascii") as fh:
            return any(line.split()[-1:] == ["btrfs"] for line in fh)
    except OSError:
        return False


def btrfs_unavailable() -> str | None:
    """Why this machine cannot make a loop-mounted btrfs (None: it can).

    Needs root, btrfs in the kernel (``/proc/filesystems``, after trying
    ``modprobe btrfs``), loop devices (``/dev/loop-control``), and the
    programs ``losetup``, ``mount``, ``umount``, ``mkfs.btrfs`` and ``btrfs``.
    """
    if os.geteuid() != 0:
        return "a loop-mounted btrfs needs root (losetup and mount)"
    if not _kernel_has_btrfs():
        if shutil.which("modprobe"):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                _run(["modprobe", "btrfs"], timeout=30)
        if not _kernel_has_btrfs():
            return "the kernel has no btrfs (not in /proc/filesystems, modprobe btrfs failed)"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices (/dev/loop-control is missing)"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        hint = " (apt-get install btrfs-progs)" if {"mkfs.btrfs", "btrfs"} & set(missing) else ""
        return f"missing program(s): {', '.join(missing)}{hint}"
    return None


class LoopBtrfs:
    """A btrfs file system on a loop device, mounted at :attr:`mount_point`.

    Build it with :meth:`create`; :meth:`close` undoes everything.
    """

    def __init__(self, base: Path) -> None:
        self.base: Path = base
        """The temporary directory holding the image and the mount point."""
        self.image: Path = base / "btrfs.img"
        self.mount_point: Path = base / "mnt"
        self.device: str | None = None
        """The loop device (``/dev/loopN``) while attached."""
        self.mounted = False
        self._closed = False

    def __repr__(self) -> str:
        return f"<LoopBtrfs {self.device} on {self.mount_point}>"

    @classmethod
    def create(
        cls, *, size: int = DEFAULT_SIZE, parent: str | os.PathLike[str] | None = None
    ) -> Self:
        """A new, mounted file system of ``size`` bytes (sparse) under ``parent`` (``/tmp``).

        :class:`~pgsnap.errors.ConfigurationError` saying why when the machine
        cannot (see :func:`btrfs_unavailable`) or a command fails; whatever was
        done before the failure is undone.
        """
        reason = btrfs_unavailable()
        if reason is not None:
            raise ConfigurationError(
                f"cannot make a loop-mounted btrfs here: {reason}",
                hint="run as root on a machine with btrfs, loop devices and btrfs-progs",
            )
        where = Path(parent) if parent is not None else Path("/tmp")  # noqa: S108 - shared on purpose
        base = Path(tempfile.mkdtemp(prefix="pgsnap-btrfs-", dir=where))
        base.chmod(0o755)  # the server's OS user must reach the mount below it
        fs = cls(base)
        try:
            with open(fs.image, "wb") as fh:
                fh.truncate(size)
            fs.image.chmod(0o600)
            fs.device = fs._check(["losetup", "-f", "--show", str(fs.image)], "losetup").strip()
            fs._check(["mkfs.btrfs", "-q", fs.device], "mkfs.btrfs")
            fs.mount_point.mkdir(mode=0o755)
            fs._check(["mount", "-t", "btrfs", fs.device, str(fs.mount_point)], "mount")
            fs.mounted = True
            fs.mount_point.chmod(0o755)
        except BaseException:
            fs.close()
            raise
        log.debug("made %r", fs)
        return fs

    def _check(self, argv: Sequence[str], what: str) -> str:
        proc = _run(argv)
        if proc.returncode != 0:
            raise ConfigurationError(
                f"{what} failed (exit status {proc.returncode}): "
                f"{(proc.stderr or proc.stdout).strip()[-1000:]}",
                hint="check losetup -a, free loop devices and the kernel log (dmesg)",
                argv=tuple(argv),
            )
        return proc.stdout

    def subvolume(self, relpath: str, *, owner: str | None = None, mode: int | None = None) -> Path:
        """Create the subvolume ``relpath`` below the mount point (its parent must exist);
        give its root ``owner`` (a user name) and ``mode``."""
        path = self.mount_point / relpath
        self._check(["btrfs", "subvolume", "create", str(path)], "btrfs subvolume create")
        if owner is not None:
            entry = pwd.getpwnam(owner)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        if mode is not None:
            path.chmod(mode)
        return path

    def close(self) -> None:
        """Unmount, detach the loop device, remove the image and the directory; idempotent.

        Never raises: what cannot be undone is logged (a busy mount is
        unmounted lazily after a few tries).
        """
        if self._closed:
            return
        targets = self._mounts_of_device() if self.device is not None else []
        if self.mounted and str(self.mount_point) not in targets:
            targets.append(str(self.mount_point))
        for target in sorted(targets, key=len, reverse=True):  # deepest first
            _unmount(target)
        self.mounted = False
        if self.device is not None:
            proc = _run(["losetup", "-d", self.device])
            if proc.returncode != 0:
                log.warning("cannot detach %s: %s", self.device, proc.stderr.strip())
            self.device = None
        with contextlib.suppress(FileNotFoundError):
            self.image.unlink()
        shutil.rmtree(self.base, ignore_errors=True)
        self._closed = True

    def _mounts_of_device(self) -> list[str]:
        """Every mount point of this file system (the main one, subvolumes mounted by
        themselves), from ``/proc/self/mountinfo``."""
        found: list[str] = []
        try:
            with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
                lines = fh.read().splitlines()
        except OSError:
            return found
        for line in lines:
            fields = line.split(" ")
            if "-" not in fields:
                continue
            sep = fields.index("-")
            if len(fields) > sep + 2 and fields[sep + 2] == self.device:
                found.append(_unescape(fields[4]))
        return found

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _unescape(field: str) -> str:
    """A mountinfo field with its octal escapes (``\\040`` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _unmount(target: str) -> None:
    """Unmount ``target``, retrying a busy one, lazily as a last resort (logged)."""
    for attempt in range(10):
        proc = _run(["umount", target])
        if proc.returncode == 0:
            return
        if attempt == 9:
            log.warning("cannot unmount %s (%s); unmounting it lazily", target, proc.stderr.strip())
            _run(["umount", "-l", target])
            return
        time.sleep(0.2)


# --------------------------------------------------------------------------- PostgreSQL


def make_subvolumes(*paths: Path) -> None:
    """Replace each of ``paths`` (an empty directory on btrfs) with a subvolume of the
    same owner and mode (before ``initdb``)."""
    for path in paths:
        st = path.stat()
        if any(path.iterdir()):
            raise ConfigurationError(f"{path} is not empty: it cannot become a subvolume")
        path.rmdir()
        proc = _run(["btrfs", "subvolume", "create", str(path)])
        if proc.returncode != 0:
            raise ConfigurationError(
                f"btrfs subvolume create {path} failed: {proc.stderr.strip()}",
                hint=f"is {path.parent} on btrfs?",
            )
        os.chown(path, st.st_uid, st.st_gid)
        path.chmod(st.st_mode & 0o7777)


def btrfs_server(
    bindir: Path,
    fs: LoopBtrfs,
    *,
    prepare: Callable[..., PgServer] | None = None,
    wal_segsize_mb: int = 1,
    **options: Any,
) -> PgServer:
    """A new cluster (``initdb`` + configuration, not started) on ``fs``: its data
    directory and ``pg_wal`` are the subvolumes ``<base>/data`` and ``<base>/wal``.

    ``prepare`` makes the directories (default
    :meth:`PgServer.prepare <pgsnap.testing.pgserver.PgServer.prepare>`; a
    test's factory gives its own so that it cleans the server up); the other
    options go to it (``archive``, ``settings``...). The archive and the
    socket are plain directories under the base, outside the subvolumes.
    """
    from pgsnap.testing.pgserver import PgServer  # noqa: PLC0415

    make = prepare or PgServer.prepare
    server = make(bindir, separate_wal_dir=True, parent_dir=fs.mount_point, **options)
    try:
        make_subvolumes(server.data_dir, server.wal_dir)
        server.initdb(wal_segsize_mb=wal_segsize_mb)
        server.configure()
    except BaseException:
        if prepare is None:
            server.cleanup()
        raise
    return server


def btrfs_cluster(
    server: PgServer,
    fs: LoopBtrfs,
    *,
    on_event: Callable[[Event], None] | None = None,
    host: Host | None = None,
    snapshot_dir: str | None = None,
    **cluster_options: Any,
) -> Cluster:
    """A Cluster for a :func:`btrfs_server` on ``fs``, with a
    :class:`~pgsnap.backends.btrfs.BtrfsBackend`.

    The layout's volumes are the data and WAL subvolumes (ids and mount points
    are their paths); the archive, the catalog and the journal are plain
    directories under the server's base directory (outside the volumes).
    Snapshots go to ``snapshot_dir`` (default ``<mount>/snapshots``).
    """
    from pgsnap.backends.btrfs import BtrfsBackend  # noqa: PLC0415
    from pgsnap.host import Host  # noqa: PLC0415
    from pgsnap.model import Volume, VolumeRole  # noqa: PLC0415
    from pgsnap.testing.sandbox import server_cluster  # noqa: PLC0415

    host = host or Host()
    backend = BtrfsBackend(snapshot_dir or str(fs.mount_point / "snapshots"), host=host)
    data, wal = str(server.data_dir), str(server.wal_dir)
    volumes = (
        Volume(data, "pgdata", VolumeRole.DATA, data),
        Volume(wal, "pgwal", VolumeRole.WAL, wal),
    )
    return server_cluster(server, backend, volumes, host=host, on_event=on_event, **cluster_options)
