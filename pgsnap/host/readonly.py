"""Mounting a snapshot's file system read-only, beside its origin, without writing it.

A snapshot of a mounted file system is a crash image: its journal (ext4) or
log (XFS) still holds work to replay, and mounting it the ordinary way, even
with ``ro``, replays it, which writes the snapshot. XFS also refuses a second
file system with the UUID of one already mounted (its origin). So the options
depend on the file system, read from its superblock:

======== ===================================== ===========================
fstype   options                               why
======== ===================================== ===========================
xfs      ``ro``, ``nouuid``, ``norecovery``    no log replay; same UUID as the origin
ext2/3/4 ``ro``, ``noload``                    no journal replay
other    ``ro``
======== ===================================== ===========================

:func:`mount_read_only` is what :meth:`LvmBackend.ex_mount_snapshot
<pgsnap.backends.lvm.LvmBackend.ex_mount_snapshot>` and the copy plan's
``host.mount_snapshot`` step use.
"""

from __future__ import annotations

import logging
from typing import Final

from pgsnap.host.host import Host

__all__ = [
    "SUPERBLOCK_BYTES",
    "file_system_type",
    "mount_read_only",
    "read_file_system_type",
    "read_only_mount_options",
]

log = logging.getLogger(__name__)

SUPERBLOCK_BYTES: Final = 4096
"""How much of a device's start :func:`file_system_type` reads."""


def file_system_type(head: bytes) -> str | None:
    """``"xfs"`` or ``"ext4"`` (any ext2/3/4) from the first :data:`SUPERBLOCK_BYTES`
    of a device; None when it is neither (or unreadable: empty)."""
    if head[:4] == b"XFSB":
        return "xfs"
    if head[1080:1082] == b"\x53\xef":  # the ext2/3/4 superblock magic at 1024 + 56
        return "ext4"
    return None


def read_only_mount_options(fstype: str | None, *, read_only: bool = True) -> tuple[str, ...]:
    """The mount options that mount a snapshot of a file system of type ``fstype``
    beside its origin without writing it (see the module docstring); without
    ``read_only``, only what mounting beside the origin needs (XFS ``nouuid``)."""
    kind = (fstype or "").lower()
    if kind == "xfs":
        return ("nouuid", "ro", "norecovery") if read_only else ("nouuid",)
    if kind in ("ext2", "ext3", "ext4"):
        return ("ro", "noload") if read_only else ()
    return ("ro",) if read_only else ()


def read_file_system_type(host: Host, device: str) -> str | None:
    """The file system on ``device`` of ``host``, from its superblock (``dd``); None
    when it cannot be read or is neither XFS nor ext2/3/4."""
    result = host.run(
        ["dd", f"if={device}", f"bs={SUPERBLOCK_BYTES}", "count=1", "status=none"],
        timeout=60,
        check=False,
    )
    if not result.ok:
        log.debug("cannot read the superblock of %s: %s", device, result.error_text)
        return None
    return file_system_type(result.stdout)


def mount_read_only(
    host: Host, device: str, mount_point: str, *, read_only: bool = True
) -> tuple[str, ...]:
    """Mount the snapshot file system on ``device`` at ``mount_point`` of ``host``
    (made if missing) with :func:`read_only_mount_options` for the type its
    superblock shows; return the options used. A no-op when exactly that is
    mounted there (:meth:`Host.mount <pgsnap.host.Host.mount>`)."""
    options = read_only_mount_options(read_file_system_type(host, device), read_only=read_only)
    host.make_dirs(mount_point, mode=0o755)
    host.mount(device, mount_point, options=options)
    return options
