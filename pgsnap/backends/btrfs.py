"""``btrfs``: a real copy-on-write :class:`~pgsnap.protocols.StorageBackend` on btrfs subvolumes.

Volumes, snapshots and restores
-------------------------------

- **A volume is a writable btrfs subvolume**, identified by its absolute path
  on the database host: the volume id *is* the path (``/srv/pg/data``), so a
  layout needs no mapping, and ``[[volume]] id`` and ``mount_point`` are the
  same path. The volumes are discovered, not configured: every writable
  subvolume reached through the mount that holds the snapshot directory
  (``btrfs subvolume list``), except the subvolume mounted there itself, the
  snapshot directory's content and the leftovers of an interrupted restore.
- **A snapshot is a read-only subvolume snapshot** (``btrfs subvolume
  snapshot -r``) in ``snapshot_dir``, which must be on the same btrfs file
  system (and outside every volume). Each snapshot group is a directory
  ``snapshot_dir/<group id>/`` holding one snapshot per volume
  (``<snapshot id>``) and ``group.json``, the group's metadata (format
  ``pgsnap-btrfs-group`` version 1: name, times, and for each snapshot the
  volume's path and the volume's UUID at snapshot time). ``group.json`` is
  written last, atomically: a group without it was interrupted while being
  taken and is never listed (:meth:`BtrfsBackend.ex_incomplete_groups`,
  :meth:`BtrfsBackend.ex_remove_incomplete`). Everything pgsnap knows is on
  the file system: a new backend over the same ``snapshot_dir`` lists the same
  snapshots and groups, and a snapshot is listed only if ``btrfs subvolume
  list`` shows it read-only with the recorded volume UUID as its parent UUID.
- **A restore swaps the subvolume** for a writable snapshot of the backup's
  snapshot, which stays: ``btrfs subvolume snapshot SNAP <dir>/.<name>.pgsnap-restore-<t>``,
  then ``mv`` the live subvolume aside (``.<name>.pgsnap-old-<t>``), ``mv``
  the new one to the volume's path, ``btrfs filesystem sync`` (the swap is
  durable before PostgreSQL starts), and ``btrfs subvolume delete`` of the
  old one, in a thread of its own: the kernel drops the old subvolume's pages
  from memory as it deletes it (1.7 s for 15 GB cached after a crash), while
  the recovery goes on (:meth:`BtrfsBackend.settle` waits for it, and so does
  the interpreter's exit; a failure there is a warning naming it: the restore
  is done). The
  subvolume's root keeps its owner and mode, as a snapshot copies them. A
  volume whose path is missing (a restore interrupted between the two
  renames) is recreated from a snapshot of that path. A volume holding nested
  subvolumes is refused (:class:`NestedSubvolumeError`): the swap would move
  them aside with the old content.
- **Deletes** are ``btrfs subvolume delete``; with ``wait_for_cleaner=True``
  they commit (``--commit-after``) and wait until the cleaner has freed the
  space (``btrfs subvolume sync``).
- **Clones** (``CLONES``) are writable snapshots of a snapshot, beside the
  volume by default; they are volumes like any other.

What a restore asks of the host (:meth:`BtrfsBackend.restore_profile`)
------------------------------------------------------------------------

- ``NOTHING`` for a subvolume reached through a parent mount (the usual
  layout: a btrfs file system mounted at ``/srv/pg``, subvolumes ``data`` and
  ``wal`` below it). With the server stopped, the rename puts the new
  subvolume at the same path: there is nothing to unmount. A process still
  using the volume (a server that was not stopped) is refused with
  :class:`SubvolumeBusyError` naming it: it would go on with the old one.
- ``UNMOUNT`` for a subvolume that is *also mounted by itself* (``mount -o
  subvol=/data /dev/sdb /pgdata``): that mount would keep showing the old
  subvolume after the swap, so :meth:`~BtrfsBackend.restore_volume` refuses
  with :class:`SubvolumeBusyError` while it is mounted, and
  :meth:`~BtrfsBackend.locate` gives the device to mount again. (pgsnap's
  recovery planner does not plan that remount correctly yet: it would mount
  with the old ``subvolid=``; see docs/reference/btrfs.md. Keep the cluster's
  directories on subvolumes reached through a parent mount.)

The restore never consumes the snapshot and completes at once.

Consistency of a group (why ``CONSISTENCY_GROUPS`` is not declared)
--------------------------------------------------------------------

btrfs snapshots one subvolume per ioctl, each in its own transaction commit:
two snapshots taken back to back are two instants, and btrfs-progs offers no
way to snapshot several subvolumes in one transaction (the asynchronous
snapshot flag that allowed it was removed from the kernel in 5.7). Freezing
the file system does not help: observed on this project's machine (kernel
6.18, btrfs-progs 6.2), ``btrfs subvolume snapshot`` on a file system frozen
with ``fsfreeze -f`` blocks in uninterruptible sleep (``timeout`` cannot kill
it) and takes the snapshot after ``fsfreeze -u``, while reporting failure to
its caller. So the backend never freezes, takes the snapshots one after the
other in the order given, and does **not** claim ``CONSISTENCY_GROUPS``; the
backup preflight then notes that backup mode makes the backup consistent.

Why that is enough for pgsnap's backups: each snapshot is an atomic,
crash-consistent image of its own subvolume (the ioctl flushes the
subvolume's dirty data and takes the tree at a transaction commit, so it holds
every write that completed before it, fsynced or not). pgsnap takes the
snapshots between ``pg_backup_start`` and ``pg_backup_stop``, and a restored
cluster starts from ``backup_label``: PostgreSQL replays the WAL from the
backup's start (redo) LSN at least to its stop LSN, with full-page writes
forced on during backup mode, and does not consider the data consistent
before. That is the guarantee ``pg_basebackup`` relies on while it copies
files for minutes; volumes snapshotted microseconds apart need nothing more.
The WAL that replay needs comes from the archive (restore_command, which
PostgreSQL tries before ``pg_wal``), and pgsnap marks a backup DONE only once
the archive holds every segment from its start to its stop, which are both
outside the snapshots' instants (the stop is after both). A WAL volume
snapshotted before or after the data volume therefore does not matter: if
it is restored too, the recovery plan empties the restored ``pg_wal`` (its
segments are older copies of what the archive holds) and replay takes every
segment from the archive; if it survives (complete recovery) it is not
restored at all, and its newer WAL is replayed after the archive's.
Where the order could matter (crash-consistent snapshots without backup
mode, which pgsnap never takes) data is snapshotted before WAL when the
layout lists them so.

Errors
------

Every failure is a :class:`~pgsnap.errors.BackendError` with a hint:
:class:`NotBtrfsError` (not a btrfs file system), :class:`SubvolumeBusyError`
(device or resource busy, mounted by itself), :class:`NoSpaceError`,
:class:`ReadOnlyFilesystemError`, :class:`NestedSubvolumeError`,
:class:`BtrfsPermissionError` (btrfs needs root), :class:`BtrfsError` for the
rest, :class:`~pgsnap.errors.VolumeNotFound` and
:class:`~pgsnap.errors.SnapshotNotFound`; a command that times out or a
host that cannot be reached is :class:`~pgsnap.errors.BackendUnavailable`.

Every command runs through the :class:`~pgsnap.host.Host`'s runner as an
argument list (the metadata is read by a fixed ``sh -c`` script with the
directory as its argument), so the backend works the same over ssh. The host
needs btrfs-progs, GNU coreutils and util-linux; btrfs commands need root.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import posixpath
import re
import secrets
import threading
import time
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.backends._common import CommandBackend, group_failure
from pgsnap.errors import (
    BackendError,
    BackendUnavailable,
    CommandTimeout,
    ConfigurationError,
    HostError,
    HostUnreachable,
    PgsnapError,
    SnapshotNotFound,
    UnsupportedCapability,
    VolumeNotFound,
)
from pgsnap.model import (
    Location,
    Mount,
    RestorePreparation,
    RestoreProfile,
    Snapshot,
    SnapshotAccess,
    SnapshotGroup,
    SnapshotPolicy,
    StorageVolume,
)
from pgsnap.protocols import Capability

if TYPE_CHECKING:
    from pgsnap.host import CommandResult, Host

__all__ = [
    "CAPABILITIES",
    "METADATA_FORMAT",
    "METADATA_VERSION",
    "BtrfsBackend",
    "BtrfsError",
    "BtrfsPermissionError",
    "GroupMetadata",
    "NestedSubvolumeError",
    "NoSpaceError",
    "NotBtrfsError",
    "ReadOnlyFilesystemError",
    "SnapshotMetadata",
    "Subvolume",
    "SubvolumeBusyError",
    "classify_failure",
    "parse_group_metadata",
    "parse_subvolume_list",
]

log = logging.getLogger(__name__)

_NAME: Final = "btrfs"

_CLONE_MARKS: Final = "clones"
"""The snapshot directory's subdirectory marking the subvolumes made as clones."""

CAPABILITIES: Final = frozenset({Capability.CLONES})
"""What the backend declares: clones. Not ``CONSISTENCY_GROUPS`` (see the module docstring)."""

METADATA_FORMAT: Final = "pgsnap-btrfs-group"
"""The ``format`` of ``group.json``."""
METADATA_VERSION: Final = 1
"""The version written; a reader accepts this major version and ignores unknown keys."""

_GROUP_FILE: Final = "group.json"
_STAMP: Final = "%Y%m%dT%H%M%S%fZ"
_GROUP_RE: Final = re.compile(r"^cg-(\d{8}T\d{12}Z)-([0-9a-f]{8})$")
_SNAP_RE: Final = re.compile(r"^snap-(\d{8}T\d{12}Z)-([0-9a-f]{8})-(\d{1,4})$")
_STAGING_RE: Final = re.compile(r"^\.(.+)\.pgsnap-(restore|old)-[0-9a-f]{8}$")
_FS_TREE: Final = "<FS_TREE>"
_ONE_TICK: Final = dt.timedelta(microseconds=1)

_ROOT_HINT: Final = (
    "run pgsnap as root on the database host: btrfs subvolume commands need CAP_SYS_ADMIN"
)
_FROZEN_HINT: Final = (
    "a btrfs command waits while its file system is frozen (fsfreeze -u it) or very busy; "
    "retry, or raise command_timeout"
)

# A fixed script: lists the group directories of the snapshot directory ($1). For each,
# "G\0<dir>\0<group.json>\0" when its metadata is there, "I\0<dir>\0\0" when it is not
# (a group being taken, or one whose taking was interrupted).
_READ_GROUPS_SCRIPT: Final = """dir=$1
[ -d "$dir" ] || exit 0
cd -- "$dir" || exit 3
for d in cg-*; do
  [ -d "$d" ] || continue
  if [ -f "$d/group.json" ]; then
    printf 'G\\0%s\\0' "$d"; cat -- "$d/group.json" || exit 4; printf '\\0'
  else
    printf 'I\\0%s\\0\\0' "$d"
  fi
done
"""


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _read_groups_here(snapdir: str) -> list[tuple[bytes, bytes, bytes]] | None:
    """What :data:`_READ_GROUPS_SCRIPT` prints, as (kind, group directory, group.json)
    triples, read in this process: the script runs a ``cat`` per group (70 ms for 70
    groups, growing with every backup kept). None when something fails that the
    script should report (it runs then, and its error says why)."""
    try:
        with os.scandir(snapdir) as it:  # (an absolute path: the constructor checked)
            entries = sorted(it, key=lambda e: e.name)
    except FileNotFoundError:
        return []  # as the script: no snapshot directory yet, no groups
    except OSError:
        return None
    found: list[tuple[bytes, bytes, bytes]] = []
    for entry in entries:
        if not entry.name.startswith("cg-"):
            continue
        name = os.fsencode(entry.name)
        meta = os.path.join(entry.path, _GROUP_FILE)
        try:
            if not entry.is_dir():  # (following a symbolic link, as [ -d ])
                continue
            if not os.path.isfile(meta):
                found.append((b"I", name, b""))
                continue
            with open(meta, "rb") as fh:
                found.append((b"G", name, fh.read()))
        except OSError:
            return None
    return found


# --------------------------------------------------------------------------- errors


class BtrfsError(BackendError):
    """A btrfs command failed (``argv``, ``stderr``: its last lines, when there was one)."""


class NotBtrfsError(BtrfsError):
    """The path is not on a btrfs file system (``path``)."""


class SubvolumeBusyError(BtrfsError):
    """The subvolume is in use: device or resource busy, or mounted by itself."""


class NoSpaceError(BtrfsError):
    """The file system is full (data, metadata or quota)."""


class ReadOnlyFilesystemError(BtrfsError):
    """The file system (or the subvolume written into) is read-only."""


class NestedSubvolumeError(BtrfsError):
    """The volume holds other subvolumes, which a snapshot leaves out and a swap would move."""


class BtrfsPermissionError(BtrfsError):
    """The command was not allowed (btrfs subvolume commands need root)."""


def classify_failure(
    result: CommandResult, *, what: str, hint: str | None = None, **details: Any
) -> BtrfsError:
    """The typed error for a failed command (``what`` failed), from its exit status and
    its standard error (``LC_ALL=C``, as the runners set it).

    ``hint`` replaces the default hint of the generic :class:`BtrfsError`; the
    specific classes always say what to do for their cause.
    """
    err = result.error_text
    low = err.lower()
    tail = err.splitlines()[-1] if err else f"exit status {result.returncode}"
    message = f"{what} failed: {tail}"
    info: dict[str, Any] = {
        "backend": _NAME,
        "argv": tuple(result.argv),
        "stderr": err,
        **details,
    }
    if result.returncode == 127:
        return BtrfsError(
            f"{what} failed: {result.argv[0] if result.argv else 'the program'} is not installed",
            hint="install btrfs-progs on the database host (apt-get install btrfs-progs)",
            **info,
        )
    if "not a btrfs filesystem" in low:
        return NotBtrfsError(
            message,
            hint="the volumes and the snapshot directory must be on a btrfs file system "
            "(findmnt -T PATH shows what holds a path)",
            **info,
        )
    if "resource busy" in low or "text file busy" in low:
        return SubvolumeBusyError(
            message,
            hint="something uses the subvolume: a mount on it or below it, a process, a "
            "swap file, a running send; stop or unmount it and try again",
            **info,
        )
    if "directory not empty" in low:
        return NestedSubvolumeError(
            message,
            hint="the subvolume holds other subvolumes (btrfs subvolume list -o PATH): "
            "move or delete them first",
            **info,
        )
    if "no space left on device" in low or "disk quota exceeded" in low:
        return NoSpaceError(
            message,
            hint="free space on the file system (delete old snapshots, btrfs balance) or "
            "grow it; btrfs filesystem usage shows data and metadata space",
            **info,
        )
    if "read-only file system" in low:
        return ReadOnlyFilesystemError(
            message,
            hint="the file system is mounted read-only (or went read-only after an error: "
            "see dmesg); remount it read-write (mount -o remount,rw) and try again",
            **info,
        )
    if "permission denied" in low or "operation not permitted" in low:
        return BtrfsPermissionError(message, hint=_ROOT_HINT, **info)
    return BtrfsError(
        message,
        hint=hint or "see the command's message; btrfs-progs and dmesg say more",
        **info,
    )


# --------------------------------------------------------------------------- parsing


@frozen
class Subvolume:
    """One line of ``btrfs subvolume list -a -u -q``."""

    id: int
    top_level: int
    """The id of the subvolume it lies in (5: the file system's top level)."""
    uuid: str
    parent_uuid: str | None
    """The UUID of the subvolume it is a snapshot of (None: not a snapshot)."""
    path: str
    """Relative to the file system's top level, without a leading ``/``."""


_LIST_RE: Final = re.compile(
    r"^ID (?P<id>\d+) gen \d+(?: cgen \d+)? top level (?P<top>\d+)"
    r"(?: otime \S+ \S+)?"
    r"(?: +parent_uuid (?P<parent>\S+))?"
    r"(?: +received_uuid \S+)?"
    r"(?: +uuid (?P<uuid>\S+))?\s*$"
)


def parse_subvolume_list(text: str) -> tuple[Subvolume, ...]:
    """The subvolumes in the output of ``btrfs subvolume list -a -u -q PATH``.

    With ``-a``, btrfs-progs prefixes ``<FS_TREE>/`` to the subvolumes that are
    not below PATH's subvolume and prints the others from the top level as
    well: stripping the prefix gives every path relative to the top level.
    (Without ``-a``, subvolumes below PATH's subvolume are printed relative to
    it, the others relative to the top level, and the two cannot be told
    apart.) Lines that do not parse (a name holding a newline) are skipped.
    """
    found: list[Subvolume] = []
    for line in text.splitlines():
        head, sep, path = line.partition(" path ")
        if not sep:
            continue
        m = _LIST_RE.match(head)
        if m is None:
            log.debug("btrfs: skipping a line of btrfs subvolume list: %r", line)
            continue
        if path == _FS_TREE:
            continue
        if path.startswith(_FS_TREE + "/"):
            path = path[len(_FS_TREE) + 1 :]
        parent = m.group("parent")
        found.append(
            Subvolume(
                id=int(m.group("id")),
                top_level=int(m.group("top")),
                uuid=m.group("uuid") or "-",
                parent_uuid=None if parent in (None, "-") else parent,
                path=path.strip("/"),
            )
        )
    return tuple(found)


@frozen
class SnapshotMetadata:
    """One snapshot in ``group.json``: what ``btrfs subvolume list`` cannot say."""

    id: str
    volume_id: str
    volume_uuid: str
    created_at: dt.datetime


@frozen
class GroupMetadata:
    """A snapshot group's ``group.json`` (format :data:`METADATA_FORMAT`)."""

    id: str
    name: str
    created_at: dt.datetime
    snapshots: tuple[SnapshotMetadata, ...]

    def to_json(self) -> str:
        """The ``group.json`` text (what :func:`parse_group_metadata` reads back)."""
        doc = {
            "format": METADATA_FORMAT,
            "version": METADATA_VERSION,
            "id": self.id,
            "name": self.name,
            "created_at": self.created_at.isoformat(),
            "snapshots": [
                {
                    "id": s.id,
                    "volume_id": s.volume_id,
                    "volume_uuid": s.volume_uuid,
                    "created_at": s.created_at.isoformat(),
                }
                for s in self.snapshots
            ],
        }
        return json.dumps(doc, indent=1) + "\n"


def _time(value: object, where: str) -> dt.datetime:
    if not isinstance(value, str):
        raise TypeError(f"{where}: expected a time, got {value!r}")
    parsed = dt.datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"{where}: {value!r} has no time zone")
    return parsed.astimezone(dt.UTC)


def _text(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def parse_group_metadata(text: str) -> GroupMetadata:
    """A ``group.json``; ``ValueError`` (or ``TypeError``) when it is not a valid one.

    Unknown keys are ignored; another ``version`` than :data:`METADATA_VERSION`
    is refused.
    """
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.get("format") != METADATA_FORMAT:
        raise ValueError(f"not a {METADATA_FORMAT} document")
    if doc.get("version") != METADATA_VERSION:
        raise ValueError(
            f"version {doc.get('version')!r}; this pgsnap reads version {METADATA_VERSION}"
        )
    gid = _text(doc.get("id"), "id")
    if not _GROUP_RE.match(gid):
        raise ValueError(f"malformed group id {gid!r}")
    raw = doc.get("snapshots")
    if not isinstance(raw, list) or not raw:
        raise TypeError("snapshots: expected a non-empty list")
    snaps: list[SnapshotMetadata] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise TypeError(f"snapshots[{i}]: expected an object")
        sid = _text(item.get("id"), f"snapshots[{i}].id")
        if not _SNAP_RE.match(sid) or _group_of(sid) != gid:
            raise ValueError(f"snapshots[{i}].id {sid!r} is not a snapshot of group {gid}")
        volume_id = _text(item.get("volume_id"), f"snapshots[{i}].volume_id")
        if not volume_id.startswith("/"):
            raise ValueError(f"snapshots[{i}].volume_id {volume_id!r} is not an absolute path")
        snaps.append(
            SnapshotMetadata(
                id=sid,
                volume_id=volume_id,
                volume_uuid=_text(item.get("volume_uuid"), f"snapshots[{i}].volume_uuid"),
                created_at=_time(item.get("created_at"), f"snapshots[{i}].created_at"),
            )
        )
    if len({s.id for s in snaps}) != len(snaps):
        raise ValueError("a snapshot id appears twice")
    name = doc.get("name")
    if not isinstance(name, str):
        raise TypeError(f"name: expected a string, got {name!r}")
    return GroupMetadata(gid, name, _time(doc.get("created_at"), "created_at"), tuple(snaps))


def _group_of(snapshot_id: str) -> str | None:
    """The group id a snapshot id belongs to (None for a malformed id)."""
    m = _SNAP_RE.match(snapshot_id) if isinstance(snapshot_id, str) else None
    return None if m is None else f"cg-{m.group(1)}-{m.group(2)}"


def _clean_path(value: object) -> str | None:
    """``value`` as a normalized absolute path, or None if it cannot be a volume id."""
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value or "\n" in value:
        return None
    return posixpath.normpath(value).replace("//", "/")


def _fsroot(mount: Mount) -> str:
    """The subvolume mounted (relative to the top level, no slashes around; "" for it)."""
    for option in mount.options:
        if option.startswith("subvol="):
            return option[len("subvol=") :].strip("/")
    source = mount.source
    if source.endswith("]") and "[" in source:
        return source[source.rfind("[") + 1 : -1].strip("/")
    return ""


def _device(mount: Mount) -> str:
    """The mounted device, without findmnt's ``[/subvolume]`` suffix."""
    source = mount.source
    if source.endswith("]") and "[" in source:
        return source[: source.rfind("[")]
    return source


def _reads_only(argv: Sequence[str]) -> bool:
    """Whether a command only reads: the view stays true after it."""
    head = tuple(argv[:3])
    return (
        head[:1] == ("test",)
        or head in (("btrfs", "subvolume", "list"), ("btrfs", "subvolume", "show"))
        or (head[:2] == ("sh", "-c") and argv[2] == _READ_GROUPS_SCRIPT)
    )


def _under(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")


# --------------------------------------------------------------------------- the view


@frozen
class _Vol:
    path: str
    sub: Subvolume
    self_mounts: tuple[Mount, ...]


@frozen
class _Snap:
    record: Snapshot
    sub: Subvolume
    path: str
    index: int


@frozen
class _View:
    """What the file system looks like now (one ``btrfs subvolume list`` pair)."""

    mount: Mount
    mount_root: str
    fsroot: str
    snapdir: str
    snapdir_rel: str
    subvolumes: tuple[Subvolume, ...]
    readonly: frozenset[int]
    mounts: tuple[Mount, ...]

    def host_path(self, rel: str) -> str | None:
        """Where the host reaches the subvolume at ``rel`` through the mount (None: not)."""
        if not self.fsroot:
            return posixpath.join(self.mount_root, rel) if rel else self.mount_root
        if rel == self.fsroot:
            return self.mount_root
        if rel.startswith(self.fsroot + "/"):
            return posixpath.join(self.mount_root, rel[len(self.fsroot) + 1 :])
        return None

    def self_mounts(self, rel: str) -> tuple[Mount, ...]:
        """The other mounts of this file system whose root is the subvolume at ``rel``."""
        device = _device(self.mount)
        return tuple(
            m
            for m in self.mounts
            if m.fstype == "btrfs"
            and _device(m) == device
            and _fsroot(m) == rel
            and m.target != self.mount.target
        )

    def children(self, sub: Subvolume) -> tuple[Subvolume, ...]:
        return tuple(s for s in self.subvolumes if s.top_level == sub.id)


# --------------------------------------------------------------------------- the backend


class BtrfsBackend(CommandBackend):
    """Volumes on btrfs subvolumes, snapshots in ``snapshot_dir`` (see the module docstring).

    - ``snapshot_dir``: an absolute path on the btrfs file system that holds
      the volumes, outside every volume (created, mode 0700, on the first
      snapshot). The volumes are the writable subvolumes reached through the
      mount that holds it.
    - ``host``: the database host whose btrfs this is (default: this machine);
      every command runs through its runner.
    - ``wait_for_cleaner``: deletes commit and wait until the space is freed.
    - ``command_timeout``: seconds a btrfs command may take.
    - ``clock``: the aware time stamped on snapshots (default: now, UTC).

    Thread-safe: one lock serializes the calls that change something.
    """

    _NAME: ClassVar[str] = _NAME
    _ERROR: ClassVar[type[BackendError]] = BtrfsError
    _TIMEOUT_HINT: ClassVar[str] = _FROZEN_HINT
    _UNSUPPORTED_HINT: ClassVar[str] = (
        "plans for btrfs do not need it; see BtrfsBackend.capabilities"
    )

    def __init__(
        self,
        snapshot_dir: str | os.PathLike[str],
        *,
        host: Host | None = None,
        wait_for_cleaner: bool = False,
        command_timeout: float = 300.0,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        raw = os.fspath(snapshot_dir)
        path = _clean_path(raw)
        if path is None or path == "/":
            raise ConfigurationError(
                f"snapshot_dir must be an absolute directory path, not {raw!r}",
                hint="e.g. snapshot_dir = '/srv/pg/.pgsnap-snapshots', on the btrfs file "
                "system of the volumes and outside them",
                snapshot_dir=raw,
            )
        if not isinstance(wait_for_cleaner, bool):
            raise ConfigurationError(
                f"wait_for_cleaner must be true or false, not {wait_for_cleaner!r}"
            )
        if isinstance(command_timeout, bool) or not (
            isinstance(command_timeout, int | float) and command_timeout > 0
        ):
            raise ConfigurationError(
                f"command_timeout must be a positive number of seconds, not {command_timeout!r}"
            )
        if host is None:
            from pgsnap.host import Host  # noqa: PLC0415 - built only when none is given

            host = Host()
        self._host = host
        self._snapdir = path
        self._wait = wait_for_cleaner
        self._timeout = float(command_timeout)
        self._clock = clock or _utcnow
        self._lock = threading.RLock()
        self._seen = threading.local()  # this thread's view in an observation()
        self._deleting: list[threading.Thread] = []  # old subvolumes of swaps, being deleted

    # ------------------------------------------------------------------ basics

    @property
    def name(self) -> str:
        """Always ``"btrfs"``."""
        return _NAME

    @property
    def capabilities(self) -> frozenset[Capability]:
        """``CLONES`` (see :data:`CAPABILITIES`)."""
        return CAPABILITIES

    @property
    def snapshot_dir(self) -> str:
        """Where the snapshot groups live (as given, normalized)."""
        return self._snapdir

    @property
    def host(self) -> Host:
        """The host whose btrfs file system this is."""
        return self._host

    def __repr__(self) -> str:
        return (
            f"<BtrfsBackend snapshot_dir={self._snapdir} host={self._host.description} "
            f"wait_for_cleaner={self._wait}>"
        )

    # ------------------------------------------------------------------ protocol: read

    def list_volumes(self) -> tuple[StorageVolume, ...]:
        """Every writable subvolume reached through the snapshot directory's mount, by id."""
        view = self._view()
        return tuple(self._volume_record(v) for v in self._volumes(view, warn=True).values())

    def get_volume(self, volume_id: str) -> StorageVolume:
        """One volume (its path); ``VolumeNotFound`` when it is not a volume."""
        view = self._view()
        return self._volume_record(self._volume(view, volume_id))

    def list_snapshots(self, volume_id: str | None = None) -> tuple[Snapshot, ...]:
        """Snapshots (of one volume, or all), oldest first."""
        view = self._view()
        wanted = None
        if volume_id is not None:
            wanted = self._volume(view, volume_id).path
        snaps = [s for g in self._groups(view, warn=True).values() for s in g[1]]
        if wanted is not None:
            snaps = [s for s in snaps if s.record.volume_id == wanted]
        snaps.sort(key=lambda s: (s.record.created_at, s.record.group_id or "", s.index))
        return tuple(s.record for s in snaps)

    def get_snapshot_group(self, group_id: str) -> SnapshotGroup:
        """A group with the snapshots it still has; ``SnapshotNotFound`` when none is left."""
        view = self._view()
        meta, snaps = self._group(view, group_id)
        return _group_record(meta, snaps)

    def list_policies(self) -> tuple[SnapshotPolicy, ...]:
        """Always empty: btrfs has no snapshot schedules (snapper's are not pgsnap's)."""
        return ()

    # ------------------------------------------------------------------ protocol: snapshots

    def create_snapshot_group(
        self, volume_ids: Sequence[str], name: str, *, secure: bool = False
    ) -> SnapshotGroup:
        """Snapshot the volumes one after the other (read-only), all or nothing.

        Not at one instant (see the module docstring): each snapshot has its own
        ``created_at``. If one fails, the snapshots already taken are deleted
        and the error names the volume. ``secure`` is refused
        (:class:`~pgsnap.errors.UnsupportedCapability`).
        """
        if secure:
            raise UnsupportedCapability(
                "btrfs cannot protect snapshots against deletion (no secure snapshots)",
                hint="take the backup without secure snapshots",
                backend=_NAME,
            )
        if isinstance(volume_ids, str):
            raise ConfigurationError(
                "volume_ids is a sequence of volume paths, not one string",
                hint=f"pass [{volume_ids!r}]",
            )
        ids = tuple(volume_ids)
        if not ids:
            raise ConfigurationError(
                "a snapshot group needs at least one volume",
                hint="pass the paths of the subvolumes to snapshot",
            )
        if not isinstance(name, str):
            raise ConfigurationError(f"the group name must be a string, not {name!r}")
        with self._lock:
            view = self._view()
            vols = [self._volume(view, v) for v in ids]
            paths = [v.path for v in vols]
            dupes = sorted({p for p in paths if paths.count(p) > 1})
            if dupes:
                raise ConfigurationError(
                    f"volume(s) listed more than once: {', '.join(dupes)}",
                    hint="list each volume once",
                    volume_ids=tuple(dupes),
                )
            for vol in vols:
                nested = view.children(vol.sub)
                if nested:
                    log.warning(
                        "btrfs: volume %s holds nested subvolume(s) %s: their content is not "
                        "in its snapshot",
                        vol.path,
                        ", ".join(view.host_path(s.path) or s.path for s in nested),
                    )
            now = self._clock()
            token = secrets.token_hex(4)
            stamp = now.astimezone(dt.UTC).strftime(_STAMP)
            gid = f"cg-{stamp}-{token}"
            gdir = posixpath.join(self._snapdir, gid)
            self._make_dir(self._snapdir)
            self._make_dir(gdir)
            taken: list[str] = []
            metas: list[SnapshotMetadata] = []
            current: str | None = None
            index = 0
            try:
                for index, vol in enumerate(vols, start=1):
                    current = vol.path
                    created = self._clock().astimezone(dt.UTC)
                    if metas and created <= metas[-1].created_at:
                        created = metas[-1].created_at + _ONE_TICK
                    sid = f"snap-{stamp}-{token}-{index}"
                    dest = posixpath.join(gdir, sid)
                    self._btrfs(
                        ["subvolume", "snapshot", "-r", vol.path, dest],
                        what=f"snapshot of {vol.path}",
                        volume_id=vol.path,
                    )
                    taken.append(dest)
                    metas.append(SnapshotMetadata(sid, vol.path, vol.sub.uuid, created))
                current = None
                meta = GroupMetadata(gid, name, metas[0].created_at, tuple(metas))
                self._write(posixpath.join(gdir, _GROUP_FILE), meta.to_json())
            except BaseException as exc:
                self._discard(gdir, taken)
                log.debug("btrfs: group %r failed; removed %d snapshot(s)", name, len(taken))
                if not isinstance(exc, Exception):
                    raise  # KeyboardInterrupt and friends pass through unchanged
                raise group_failure(
                    exc,
                    name,
                    current,
                    index,
                    len(vols),
                    error=BtrfsError,
                    backend=_NAME,
                    afterwards="writing its metadata",
                ) from exc
            log.debug("btrfs: group %s %r: %s", gid, name, [m.id for m in metas])
            return _group_record(meta, self._group(self._view(), gid)[1])

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete one snapshot (its subvolume, then its line in ``group.json``)."""
        with self._lock:
            view = self._view()
            gid = _group_of(snapshot_id)
            if gid is None:
                raise self._snapshot_not_found(snapshot_id)
            meta, snaps = self._group(view, gid, missing=snapshot_id)
            found = [s for s in snaps if s.record.id == snapshot_id]
            if not found:
                raise self._snapshot_not_found(snapshot_id)
            snap = found[0]
            self._delete_subvolumes([snap], view)
            rest = tuple(m for m in meta.snapshots if m.id != snapshot_id)
            gdir = posixpath.join(self._snapdir, gid)
            still_there = [s for s in snaps if s.record.id != snapshot_id]
            if still_there:
                self._write(
                    posixpath.join(gdir, _GROUP_FILE), attrs.evolve(meta, snapshots=rest).to_json()
                )
            else:
                self._remove_group_dir(gdir)

    def delete_snapshot_group(self, group_id: str) -> None:
        """Delete every snapshot of a group and its directory; ``SnapshotNotFound`` if gone."""
        with self._lock:
            view = self._view()
            _meta, snaps = self._group(view, group_id)
            self._delete_subvolumes(snaps, view)
            self._remove_group_dir(posixpath.join(self._snapdir, group_id))

    def restore_volume(self, volume_id: str, snapshot_id: str) -> None:
        """Swap the volume's subvolume for a writable snapshot of ``snapshot_id``.

        The server must be stopped. Refused with :class:`SubvolumeBusyError`
        while the subvolume is mounted by itself (unmount it first: the profile
        says so) or a process uses it (its working directory, open or mapped
        files: a running server would go on writing to the old one), with
        :class:`NestedSubvolumeError` when it holds nested subvolumes, with
        :class:`~pgsnap.errors.BackendError` for another volume's snapshot.
        The snapshot stays.
        """
        with self._lock:
            view = self._view()
            snap = self._snapshot(view, snapshot_id)
            path = _clean_path(volume_id)
            vols = self._volumes(view)
            vol = vols.get(path) if path is not None else None
            if vol is None:
                if path is None or snap.record.volume_id != path or self._exists(path):
                    raise self._volume_not_found(volume_id, view)
                # The volume's path is gone (a swap interrupted between its renames):
                # the snapshot of that very path brings it back.
                log.warning("btrfs: volume %s is missing; recreating it from %s", path, snapshot_id)
                self._btrfs(
                    ["subvolume", "snapshot", snap.path, path],
                    what=f"restore of {path} from {snapshot_id}",
                    volume_id=path,
                )
                self._sync(posixpath.dirname(path))
                return
            if snap.record.volume_id != vol.path:
                raise BackendError(
                    f"snapshot {snapshot_id!r} is of volume {snap.record.volume_id!r}, "
                    f"not {vol.path!r}: a snapshot can only restore its own volume",
                    hint=f"restore {vol.path!r} from one of its own snapshots "
                    f"(list_snapshots({vol.path!r})), or clone {snapshot_id!r} instead",
                    backend=_NAME,
                    volume_id=vol.path,
                    snapshot_id=snapshot_id,
                    snapshot_volume_id=snap.record.volume_id,
                )
            self._refuse_in_use(vol, view)
            self._swap(vol.path, snap)

    def restore_profile(self, volume_id: str) -> RestoreProfile:
        """``NOTHING`` for a subvolume reached through a parent mount, ``UNMOUNT`` for
        one that is also mounted by itself; never consumed, complete at once."""
        view = self._view()
        vol = self._volume(view, volume_id)
        before = RestorePreparation.UNMOUNT if vol.self_mounts else RestorePreparation.NOTHING
        return RestoreProfile(before=before)

    def snapshot_access(self, snapshot_id: str) -> SnapshotAccess:
        """The read-only snapshot subvolume's directory on the host: read in place."""
        return SnapshotAccess(path=self._snapshot(self._view(), snapshot_id).path)

    def wait_for_restore(self, volume_id: str, *, timeout: float) -> None:
        """Return at once: a swap is complete when :meth:`restore_volume` returns."""
        self._volume(self._view(), volume_id)

    # ------------------------------------------------------------------ protocol: hosts

    def locate(self, volume_id: str) -> Location:
        """The volume's directory; for a subvolume mounted by itself, the device the host
        mounts it from (with ``subvol=``)."""
        view = self._view()
        vol = self._volume(view, volume_id)
        if vol.self_mounts:
            return Location.device(_device(vol.self_mounts[0]))
        return Location.directory(vol.path)

    # ------------------------------------------------------------------ protocol: clones

    def clone_snapshot(
        self, snapshot_id: str, name: str, *, path: str | None = None
    ) -> StorageVolume:
        """A new writable subvolume with the snapshot's content: ``path``, or ``name``
        beside the snapshot's volume. It is a volume like the others."""
        with self._lock:
            view = self._view()
            snap = self._snapshot(view, snapshot_id)
            if path is None:
                if (
                    not isinstance(name, str)
                    or name in ("", ".", "..")
                    or "/" in name
                    or "\0" in name
                    or "\n" in name
                ):
                    raise ConfigurationError(
                        f"invalid clone name {name!r}",
                        hint="a clone's name is one path component (no '/'), or give path=",
                        name=str(name),
                    )
                dest = posixpath.join(posixpath.dirname(snap.record.volume_id), name)
            else:
                clean = _clean_path(path)
                if clean is None:
                    raise ConfigurationError(
                        f"invalid clone path {path!r}", hint="give an absolute path"
                    )
                dest = clean
            real_parent = self._realpath(posixpath.dirname(dest))
            dest = posixpath.join(real_parent, posixpath.basename(dest))
            if not _under(dest, view.mount_root) or _under(dest, view.snapdir):
                raise ConfigurationError(
                    f"a clone at {dest} would not be a volume of this backend",
                    hint=f"put it below {view.mount_root} and outside {self._snapdir}",
                    path=dest,
                )
            if self._exists(dest):
                raise BtrfsError(
                    f"cannot clone {snapshot_id!r} to {dest}: it exists",
                    hint="choose another name, or delete what is there",
                    backend=_NAME,
                    path=dest,
                )
            self._btrfs(
                ["subvolume", "snapshot", snap.path, dest],
                what=f"clone of {snapshot_id} to {dest}",
                snapshot_id=snapshot_id,
            )
            log.debug("btrfs: cloned %s into %s", snapshot_id, dest)
            vol = self._volume(self._view(), dest)
            # The mark that lets delete_clone tell a clone from an origin (a restored
            # volume is a writable snapshot of a snapshot too).
            self._make_dir(posixpath.join(self._snapdir, _CLONE_MARKS))
            self._write(self._clone_mark(vol.sub.uuid), json.dumps({"path": dest}))
            return self._volume_record(vol)

    def _clone_mark(self, uuid: str) -> str:
        return posixpath.join(self._snapdir, _CLONE_MARKS, f"{uuid}.json")

    def delete_clone(self, volume_id: str) -> None:
        """Delete a subvolume made by :meth:`clone_snapshot` (by its path); idempotent.

        Refused (:class:`~pgsnap.errors.BackendError`) for a subvolume this backend
        did not clone (no mark in the snapshot directory), and for one still mounted
        by itself."""
        with self._lock:
            view = self._view()
            try:
                vol = self._volume(view, volume_id)
            except VolumeNotFound:
                return
            mark = self._clone_mark(vol.sub.uuid)
            if not self._exists(mark):
                raise BtrfsError(
                    f"subvolume {vol.path} is not a clone this backend made: it is never deleted",
                    hint="only volumes made by clone_snapshot are deleted",
                    backend=_NAME,
                    path=vol.path,
                )
            if vol.self_mounts:
                raise BtrfsError(
                    f"clone {vol.path} is mounted on {vol.self_mounts[0].target}",
                    hint="unmount it first",
                    backend=_NAME,
                    path=vol.path,
                )
            self._delete_paths([vol.path], path=vol.path)
            self._forget_observed()
            self._host_call(f"removing {mark}", lambda: self._host.remove([mark]))
            log.debug("btrfs: deleted clone %s", vol.path)

    # ------------------------------------------------------------------ protocol: policies

    # ------------------------------------------------------------------ vendor-only (ex_)

    def ex_incomplete_groups(self) -> tuple[str, ...]:
        """Group directories without ``group.json``: being taken now, or interrupted."""
        return tuple(posixpath.join(self._snapdir, d) for d in self._read_groups()[1])

    def ex_remove_incomplete(self, *, older_than: float = 3600.0) -> tuple[str, ...]:
        """Delete the incomplete groups started more than ``older_than`` seconds ago
        (their snapshots and directory); return their directories."""
        removed: list[str] = []
        with self._lock:
            view = self._view()
            now = self._clock().astimezone(dt.UTC)
            for gid in self._read_groups()[1]:
                m = _GROUP_RE.match(gid)
                if m is None:
                    continue
                started = dt.datetime.strptime(m.group(1), _STAMP).replace(tzinfo=dt.UTC)
                if (now - started).total_seconds() < older_than:
                    continue
                gdir = posixpath.join(self._snapdir, gid)
                prefix = "/".join(p for p in (view.snapdir_rel, gid) if p) + "/"
                subs = [s for s in view.subvolumes if s.path.startswith(prefix)]
                if subs:
                    self._delete_paths([posixpath.join(gdir, s.path[len(prefix) :]) for s in subs])
                self._remove_group_dir(gdir)
                removed.append(gdir)
        return tuple(removed)

    def ex_wait_for_cleaner(self, *, timeout: float | None = None) -> None:
        """Wait until every subvolume deleted so far has been cleaned (space freed)."""
        view = self._view()
        self._btrfs(
            ["subvolume", "sync", view.mount_root],
            what="waiting for the btrfs cleaner",
            timeout=timeout,
        )

    # ------------------------------------------------------------------ internals: commands

    def _btrfs(
        self,
        args: Sequence[str],
        *,
        what: str,
        timeout: float | None = None,
        **details: Any,
    ) -> CommandResult:
        argv = ["btrfs", *args]
        log.debug("btrfs: %s", " ".join(argv))
        result = self._run(argv, timeout=timeout)
        if not result.ok:
            raise classify_failure(result, what=what, **details)
        return result

    def _host_call(self, what: str, call: Callable[[], Any]) -> Any:
        """A :class:`~pgsnap.host.Host` file method; its failures become backend errors."""
        try:
            return call()
        except CommandTimeout as exc:
            raise BackendUnavailable(
                f"{what} did not finish on {self._host.description}",
                hint=_FROZEN_HINT,
                backend=_NAME,
            ) from exc
        except HostUnreachable as exc:
            raise BackendUnavailable(
                f"{what}: the database host cannot be reached: {exc.message}",
                hint=exc.hint,
                backend=_NAME,
            ) from exc
        except HostError as exc:
            stderr = str(exc.details.get("stderr") or exc.message)
            argv = tuple(exc.details.get("argv") or ())
            returncode = int(exc.details.get("returncode") or 1)
            from pgsnap.host import CommandResult  # noqa: PLC0415

            result = CommandResult(argv or ("sh",), returncode, b"", stderr.encode())
            raise classify_failure(result, what=what) from exc

    def _run(self, argv: Sequence[str], *, timeout: float | None = None) -> CommandResult:
        if not _reads_only(argv):
            self._forget_observed()  # what was seen may have changed
        return super()._run(argv, timeout=timeout)

    def _realpath(self, path: str) -> str:
        resolved: str = self._host_call(f"resolving {path}", lambda: self._host.realpath(path))
        return resolved

    def _exists(self, path: str) -> bool:
        result = self._run(["test", "-e", path])
        if result.returncode not in (0, 1):
            raise classify_failure(result, what=f"checking whether {path} exists")
        # A dangling symlink is not there for test -e, but a rename onto it would replace it.
        if result.ok:
            return True
        return self._run(["test", "-L", path]).ok

    def _make_dir(self, path: str) -> None:
        self._forget_observed()
        self._host_call(f"creating {path}", lambda: self._host.make_dirs(path, mode=0o700))

    def _write(self, path: str, text: str) -> None:
        self._forget_observed()
        self._host_call(
            f"writing {path}", lambda: self._host.write_atomic(path, text.encode(), mode=0o600)
        )

    def _sync(self, path: str) -> None:
        self._btrfs(["filesystem", "sync", path], what=f"committing the file system of {path}")

    def _mv(self, src: str, dst: str, *, what: str, **details: Any) -> None:
        result = self._run(["mv", "-T", "--", src, dst])
        if not result.ok:
            raise classify_failure(result, what=what, **details)

    # ------------------------------------------------------------------ internals: the view

    def _view(self) -> _View:
        """The mount holding the snapshot directory and the file system's subvolumes
        (within an :meth:`observation`, the one already seen)."""
        seen = self._observed()
        if seen is not None and "view" in seen:
            return typing.cast(_View, seen["view"])
        view = self._look()
        if seen is not None:
            seen["view"] = view
        return view

    def _look(self) -> _View:
        snapdir = self._realpath(self._snapdir)
        mounts: tuple[Mount, ...] = self._host_call("listing mounts", self._host.mounts)
        best: Mount | None = None
        for mount in mounts:
            if _under(snapdir, mount.target) and (
                best is None or len(mount.target) >= len(best.target)
            ):
                best = mount
        if best is None or best.fstype != "btrfs":
            found = "nothing" if best is None else f"{best.fstype} ({best.source} on {best.target})"
            raise NotBtrfsError(
                f"the snapshot directory {self._snapdir} is not on a btrfs file system: "
                f"{found} holds it",
                hint="set snapshot_dir to a directory on the btrfs file system that holds "
                "the volumes (outside the volumes)",
                backend=_NAME,
                path=self._snapdir,
            )
        root = best.target
        fsroot = _fsroot(best)
        listing = self._btrfs(
            ["subvolume", "list", "-a", "-u", "-q", root], what=f"listing the subvolumes of {root}"
        )
        ro = self._btrfs(
            ["subvolume", "list", "-a", "-u", "-q", "-r", root],
            what=f"listing the read-only subvolumes of {root}",
        )
        subvolumes = parse_subvolume_list(listing.text)
        readonly = frozenset(s.id for s in parse_subvolume_list(ro.text))
        inner = posixpath.relpath(snapdir, root)
        if inner == ".":
            raise ConfigurationError(
                f"the snapshot directory {self._snapdir} is the root of the mount {root}",
                hint=f"use a directory below it, e.g. {posixpath.join(root, '.pgsnap-snapshots')}",
                backend=_NAME,
                snapshot_dir=self._snapdir,
            )
        snapdir_rel = "/".join(p for p in (fsroot, inner) if p)
        view = _View(
            mount=best,
            mount_root=root,
            fsroot=fsroot,
            snapdir=snapdir,
            snapdir_rel=snapdir_rel,
            subvolumes=subvolumes,
            readonly=readonly,
            mounts=mounts,
        )
        for sub in subvolumes:
            if sub.id in readonly or sub.path == fsroot:
                continue
            if _under(snapdir_rel, sub.path) and not _under(sub.path, snapdir_rel):
                raise ConfigurationError(
                    f"the snapshot directory {self._snapdir} lies inside the subvolume "
                    f"{view.host_path(sub.path) or '/' + sub.path}: a restore of it would "
                    "move the snapshots away with the old content",
                    hint="put snapshot_dir outside every volume, e.g. next to them",
                    backend=_NAME,
                    snapshot_dir=self._snapdir,
                )
        return view

    def _volumes(self, view: _View, *, warn: bool = False) -> dict[str, _Vol]:
        found: dict[str, _Vol] = {}
        leftovers: list[str] = []
        for sub in view.subvolumes:
            if sub.id in view.readonly or sub.path == view.fsroot:
                continue
            if _under(sub.path, view.snapdir_rel):
                continue
            path = view.host_path(sub.path)
            if path is None or path == view.mount_root:
                continue
            if _STAGING_RE.match(posixpath.basename(path)):
                leftovers.append(path)
                continue
            found[path] = _Vol(path, sub, view.self_mounts(sub.path))
        if warn and leftovers:
            log.warning(
                "btrfs: left over by an interrupted restore (not volumes): %s; "
                "'.pgsnap-old-' ones hold a volume's content from before its restore: "
                "delete them with btrfs subvolume delete once you no longer need them",
                ", ".join(sorted(leftovers)),
            )
        return dict(sorted(found.items()))

    def _volume(self, view: _View, volume_id: str) -> _Vol:
        path = _clean_path(volume_id)
        vol = self._volumes(view).get(path) if path is not None else None
        if vol is None:
            raise self._volume_not_found(volume_id, view)
        return vol

    def _volume_not_found(self, volume_id: object, view: _View) -> VolumeNotFound:
        return VolumeNotFound(
            f"no btrfs volume {volume_id!r}: a volume is the path of a writable subvolume "
            f"reached through {view.mount_root}",
            hint=f"btrfs subvolume list -a {view.mount_root} lists the subvolumes; create one "
            "with btrfs subvolume create PATH",
            volume_id=str(volume_id),
            backend=_NAME,
        )

    def _snapshot_not_found(self, snapshot_id: object) -> SnapshotNotFound:
        return SnapshotNotFound(
            f"no snapshot {snapshot_id!r} in {self._snapdir}",
            hint="list_snapshots() lists the snapshots there",
            snapshot_id=str(snapshot_id),
            backend=_NAME,
        )

    @staticmethod
    def _volume_record(vol: _Vol) -> StorageVolume:
        extra = {
            "uuid": vol.sub.uuid,
            "subvolume_id": str(vol.sub.id),
            "fs_path": "/" + vol.sub.path,
        }
        if vol.self_mounts:
            extra["mounted_at"] = ",".join(m.target for m in vol.self_mounts)
        return StorageVolume(
            id=vol.path,
            name=posixpath.basename(vol.path),
            size_bytes=0,
            path=vol.path,
            extra=extra,
        )

    # ------------------------------------------------------------------ internals: groups

    def _read_groups(self) -> tuple[dict[str, str], list[str]]:
        """``({group id: group.json text}, [incomplete group ids])``: one command, or
        none on this machine (:func:`_read_groups_here`)."""
        found = _read_groups_here(self._snapdir) if self._host.local else None
        if found is None:
            result = self._run(["sh", "-c", _READ_GROUPS_SCRIPT, "sh", self._snapdir])
            if not result.ok:
                raise classify_failure(
                    result, what=f"reading the snapshot metadata in {self._snapdir}"
                )
            fields = result.stdout.split(b"\0")
            found = [
                (fields[i], fields[i + 1], fields[i + 2]) for i in range(0, len(fields) - 2, 3)
            ]
        complete: dict[str, str] = {}
        incomplete: list[str] = []
        for kind, name, body in found:
            gid = name.decode("utf-8", "surrogateescape")
            if not _GROUP_RE.match(gid):
                continue
            if kind == b"G":
                complete[gid] = body.decode("utf-8", "replace")
            elif kind == b"I":
                incomplete.append(gid)
        return complete, incomplete

    def _groups(
        self, view: _View, *, warn: bool = False
    ) -> dict[str, tuple[GroupMetadata, list[_Snap]]]:
        texts, incomplete = self._read_groups()
        if warn and incomplete:
            log.warning(
                "btrfs: snapshot group(s) without metadata in %s (being taken, or interrupted "
                "while taken; not listed): %s; BtrfsBackend.ex_remove_incomplete() deletes "
                "old ones",
                self._snapdir,
                ", ".join(incomplete),
            )
        by_path = {s.path: s for s in view.subvolumes}
        groups: dict[str, tuple[GroupMetadata, list[_Snap]]] = {}
        for gid, text in texts.items():
            try:
                meta = parse_group_metadata(text)
            except (ValueError, TypeError) as exc:
                log.warning(
                    "btrfs: %s is unreadable (%s): its snapshots are not listed; restore the "
                    "file from a copy",
                    posixpath.join(self._snapdir, gid, _GROUP_FILE),
                    exc,
                )
                continue
            if meta.id != gid:
                log.warning("btrfs: %s/%s names group %s: ignored", gid, _GROUP_FILE, meta.id)
                continue
            snaps: list[_Snap] = []
            for index, sm in enumerate(meta.snapshots, start=1):
                rel = "/".join(p for p in (view.snapdir_rel, gid, sm.id) if p)
                sub = by_path.get(rel)
                if sub is None:
                    continue  # deleted (a delete interrupted before group.json was rewritten)
                if sub.id not in view.readonly or sub.parent_uuid != sm.volume_uuid:
                    log.warning(
                        "btrfs: %s is not the read-only snapshot of %s its metadata records: "
                        "not listed",
                        posixpath.join(self._snapdir, gid, sm.id),
                        sm.volume_id,
                    )
                    continue
                path = posixpath.join(self._snapdir, gid, sm.id)
                record = Snapshot(
                    id=sm.id,
                    volume_id=sm.volume_id,
                    name=meta.name,
                    created_at=sm.created_at,
                    group_id=gid,
                    extra={"path": path, "uuid": sub.uuid, "subvolume_id": str(sub.id)},
                )
                snaps.append(_Snap(record, sub, path, index))
            groups[gid] = (meta, snaps)
        return groups

    def _group(
        self, view: _View, group_id: str, *, missing: str | None = None
    ) -> tuple[GroupMetadata, list[_Snap]]:
        """A group with at least one snapshot left; ``SnapshotNotFound`` (for ``missing``,
        or the group id) otherwise."""
        if not isinstance(group_id, str) or not _GROUP_RE.match(group_id):
            raise self._snapshot_not_found(missing or group_id)
        found = self._groups(view).get(group_id)
        if found is None or not found[1]:
            raise self._snapshot_not_found(missing or group_id)
        return found

    def _snapshot(self, view: _View, snapshot_id: str) -> _Snap:
        gid = _group_of(snapshot_id)
        if gid is None:
            raise self._snapshot_not_found(snapshot_id)
        _meta, snaps = self._group(view, gid, missing=snapshot_id)
        for snap in snaps:
            if snap.record.id == snapshot_id:
                return snap
        raise self._snapshot_not_found(snapshot_id)

    def _delete_paths(self, paths: Sequence[str], **details: Any) -> None:
        if not paths:
            return
        args = ["subvolume", "delete"]
        if self._wait:
            args.append("--commit-after")
        self._btrfs([*args, *paths], what=f"deleting {', '.join(paths)}", **details)

    def _delete_subvolumes(self, snaps: Sequence[_Snap], view: _View) -> None:
        self._delete_paths([s.path for s in snaps], snapshot_id=snaps[0].record.id if snaps else "")
        if self._wait:
            self._btrfs(
                ["subvolume", "sync", view.mount_root, *(str(s.sub.id) for s in snaps)],
                what="waiting for the btrfs cleaner",
            )

    def _remove_group_dir(self, gdir: str) -> None:
        """Remove a group's directory once its snapshots are gone (its metadata with it).

        ``rm --one-file-system`` skips a subvolume still there (and fails): then
        the directory stays, with a warning.
        """
        try:
            self._forget_observed()
            self._host_call(f"removing {gdir}", lambda: self._host.remove([gdir], recursive=True))
        except BtrfsError as exc:
            log.warning("btrfs: cannot remove %s: %s", gdir, exc)

    def _discard(self, gdir: str, taken: Iterable[str]) -> None:
        """Undo a group that failed: its snapshots and directory (best effort, logged)."""
        paths = list(taken)
        try:
            self._delete_paths(paths)
        except PgsnapError as exc:
            log.error(
                "btrfs: could not delete the snapshots of a failed group (%s): %s; delete "
                "them with btrfs subvolume delete",
                ", ".join(paths),
                exc,
            )
            return
        self._remove_group_dir(gdir)

    # ------------------------------------------------------------------ internals: restore

    def _refuse_in_use(self, vol: _Vol, view: _View) -> None:
        if vol.self_mounts:
            targets = ", ".join(m.target for m in vol.self_mounts)
            raise SubvolumeBusyError(
                f"volume {vol.path} is mounted by itself at {targets}: after a swap that "
                "mount would still show the old subvolume",
                hint=f"unmount {targets} first (its restore profile says UNMOUNT), restore, "
                "then mount it again with subvol= (not the old subvolid=)",
                backend=_NAME,
                volume_id=vol.path,
                mounted_at=tuple(m.target for m in vol.self_mounts),
            )
        found = self._host_call(
            f"finding processes using {vol.path}", lambda: self._host.processes_using(vol.path)
        )
        holders = [p for p in found if not p.zombie]
        if holders:
            held = "; ".join(str(p) for p in holders)
            raise SubvolumeBusyError(
                f"volume {vol.path} is in use ({held}): a process would keep working on the "
                "old subvolume after the swap",
                hint="stop those processes first (a PostgreSQL server: stop it; the recovery "
                "plan does), then restore",
                backend=_NAME,
                volume_id=vol.path,
                holders=tuple(str(p) for p in holders),
            )
        nested = view.children(vol.sub)
        if nested:
            names = ", ".join(view.host_path(s.path) or "/" + s.path for s in nested)
            raise NestedSubvolumeError(
                f"volume {vol.path} holds nested subvolume(s) {names}: a swap would move "
                "them aside with the old content",
                hint="move the nested subvolumes out of the volume (mv), then restore",
                backend=_NAME,
                volume_id=vol.path,
            )

    def _swap(self, path: str, snap: _Snap) -> None:
        """Put a writable snapshot of ``snap`` at ``path`` and delete the old subvolume."""
        parent, base = posixpath.split(path)
        token = secrets.token_hex(4)
        staging = posixpath.join(parent, f".{base}.pgsnap-restore-{token}")
        old = posixpath.join(parent, f".{base}.pgsnap-old-{token}")
        sid = snap.record.id
        self._btrfs(
            ["subvolume", "snapshot", snap.path, staging],
            what=f"restore of {path} from {sid}",
            volume_id=path,
            snapshot_id=sid,
        )
        try:
            self._mv(path, old, what=f"moving {path} aside", volume_id=path)
        except BaseException:
            self._forget(staging)
            raise
        try:
            self._mv(staging, path, what=f"moving the restored subvolume to {path}", volume_id=path)
        except BaseException:
            try:
                self._mv(old, path, what=f"moving {path} back")
            except PgsnapError as exc:
                log.error(
                    "btrfs: volume %s is now at %s (moving it back failed: %s); "
                    "mv -T %s %s puts it back",
                    path,
                    old,
                    exc,
                    old,
                    path,
                )
            self._forget(staging)
            raise
        self._sync(parent)
        log.info("btrfs: restored %s from %s", path, sid)
        self._delete_behind(old, path)

    def _delete_behind(self, old: str, path: str) -> None:
        """Delete ``old``, the subvolume a swap replaced at ``path``, in a thread.

        Deleting a subvolume drops its files' pages from the page cache, in the
        command: about 0.1 s per GB a crashed server left cached. Nothing that
        follows a restore needs it gone, so the recovery goes on meanwhile;
        :meth:`settle` waits for it (a non-daemon thread: the interpreter's exit
        does too). A failure is a warning naming the subvolume, as before.
        """

        def delete() -> None:
            try:
                self._delete_paths([old], volume_id=path)
            except PgsnapError as exc:
                log.warning(
                    "btrfs: %s was restored, but its old subvolume %s could not be deleted "
                    "(%s); delete it with btrfs subvolume delete once you no longer need it",
                    path,
                    old,
                    exc,
                )

        thread = threading.Thread(target=delete, name=f"pgsnap-btrfs-delete {old}")
        with self._lock:
            self._deleting = [t for t in self._deleting if t.is_alive()]
            self._deleting.append(thread)
        thread.start()

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until the subvolumes that restores replaced are deleted (they are
        deleted behind the restore, see the module docstring); False when
        ``timeout`` seconds passed first."""
        with self._lock:
            pending = list(self._deleting)
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in pending:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._deleting = [t for t in self._deleting if t.is_alive()]
            return not self._deleting

    def _forget(self, path: str) -> None:
        try:
            self._delete_paths([path])
        except PgsnapError as exc:
            log.warning("btrfs: cannot delete %s: %s; delete it by hand", path, exc)

    # ------------------------------------------------------------------ internals: refusals


def _group_record(meta: GroupMetadata, snaps: Sequence[_Snap]) -> SnapshotGroup:
    ordered = sorted(snaps, key=lambda s: s.index)
    return SnapshotGroup(
        id=meta.id,
        name=meta.name,
        created_at=meta.created_at,
        snapshots=tuple(s.record for s in ordered),
    )
