"""The records pgsnap works with: immutable, typed, and lossless through JSON.

Everything here is a frozen attrs class (or an enum). Records are *facts*
(what was observed: volumes, snapshots, backups) or *requests* (a recovery
target). They hold no connections and do no I/O.

JSON: :func:`to_json` / :func:`from_json` (and ``to_dict`` / ``from_dict``)
convert any record losslessly. The document carries ``format_version``
(:data:`FORMAT_VERSION`); a reader accepts any minor version of its major
version and ignores keys it does not know, and refuses another major version
with :class:`~pgsnap.errors.FormatError`.
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import json
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeVar, Union

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import FormatError, InputError, LSNError, TargetError, TimeError

__all__ = [
    "FORMAT_VERSION",
    "LSN",
    "MAX_TIMELINE",
    "ArchiverStatus",
    "BackupRecord",
    "BackupStart",
    "BackupState",
    "BackupStop",
    "CheckpointState",
    "CloneRecord",
    "CloneState",
    "CloneVolume",
    "CopyRecord",
    "DrillCheck",
    "DrillPhase",
    "DrillRecord",
    "Layout",
    "Location",
    "LocationKind",
    "Mount",
    "Pin",
    "RecoveryAction",
    "RecoverySettings",
    "RecoveryTarget",
    "RestorePreparation",
    "RestoreProfile",
    "SafetySnapshot",
    "ServerFacts",
    "ServerRole",
    "Severity",
    "Snapshot",
    "SnapshotAccess",
    "SnapshotGroup",
    "SnapshotPolicy",
    "StandbyStatus",
    "StorageProblem",
    "StorageVolume",
    "Tablespace",
    "TargetKind",
    "Timeline",
    "Volume",
    "VolumeRole",
    "decode_value",
    "encode_value",
    "from_dict",
    "from_json",
    "step_key",
    "to_dict",
    "to_json",
    "utc_time",
    "validate_timeline",
]

FORMAT_VERSION: Final = "1.0"
"""Format version written into every JSON document (``major.minor``)."""

MAX_TIMELINE: Final = 0xFFFFFFFF
"""Largest timeline id PostgreSQL can use (an unsigned 32-bit number)."""

Timeline = int
"""A timeline id: an integer from 1 to :data:`MAX_TIMELINE`."""

_LSN_RE = re.compile(r"^\s*([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})\s*$")
_MAX_LSN = 0xFFFFFFFFFFFFFFFF


def validate_timeline(value: int) -> int:
    """Return ``value`` if it is a legal timeline id, else raise ``InputError``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_TIMELINE:
        from pgsnap.errors import InputError  # noqa: PLC0415 - keep import list short

        raise InputError(
            f"invalid timeline id {value!r}",
            hint=f"a timeline id is an integer from 1 to {MAX_TIMELINE}",
            value=value,
        )
    return value


def _check_lsn_value(_inst: object, _attr: object, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise LSNError(f"an LSN must be an integer, not {type(value).__name__}", value=value)
    if not 0 <= value <= _MAX_LSN:
        raise LSNError(
            f"LSN {value} is out of range",
            hint="an LSN is an unsigned 64-bit number (0/0 to FFFFFFFF/FFFFFFFF)",
            value=value,
        )


@frozen(order=False)
class LSN:
    """A WAL location (log sequence number): a 64-bit byte position in the WAL.

    Written ``X/Y`` (high and low 32 bits in hex, e.g. ``16/B374D848``).
    :meth:`parse` accepts upper or lower case and zero-padded halves (the
    PostgreSQL 19 style ``0/0000ABCD``); ``str()`` gives PostgreSQL's
    unpadded upper-case form. LSNs compare and sort as integers; ``lsn + n``
    and ``lsn - n`` move by bytes, ``lsn1 - lsn2`` is the distance in bytes.
    """

    value: int = attrs.field(validator=_check_lsn_value)

    @classmethod
    def parse(cls, text: str | LSN) -> LSN:
        """Parse ``X/Y`` text (or return an LSN unchanged)."""
        if isinstance(text, LSN):
            return text
        if not isinstance(text, str):
            raise LSNError(f"an LSN must be text like '16/B374D848', not {type(text).__name__}")
        m = _LSN_RE.match(text)
        if m is None:
            raise LSNError(
                f"malformed LSN {text!r}",
                hint="write an LSN as two hex numbers of 1 to 8 digits, e.g. '16/B374D848'",
                text=text,
            )
        return cls((int(m.group(1), 16) << 32) | int(m.group(2), 16))

    @property
    def high(self) -> int:
        """The upper 32 bits (the "log id")."""
        return self.value >> 32

    @property
    def low(self) -> int:
        """The lower 32 bits."""
        return self.value & 0xFFFFFFFF

    # Ordering by value, written out: attrs' generated comparisons build tuples
    # (a planner compares LSNs hundreds of thousands of times over a big catalog).
    def __lt__(self, other: object) -> bool:
        if other.__class__ is not LSN:
            return NotImplemented
        return self.value < other.value

    def __le__(self, other: object) -> bool:
        if other.__class__ is not LSN:
            return NotImplemented
        return self.value <= other.value

    def __gt__(self, other: object) -> bool:
        if other.__class__ is not LSN:
            return NotImplemented
        return self.value > other.value

    def __ge__(self, other: object) -> bool:
        if other.__class__ is not LSN:
            return NotImplemented
        return self.value >= other.value

    def __str__(self) -> str:
        return f"{self.high:X}/{self.low:X}"

    def __repr__(self) -> str:
        return f"LSN('{self}')"

    def __add__(self, other: int) -> LSN:
        if isinstance(other, bool) or not isinstance(other, int):
            return NotImplemented
        return LSN(self.value + other)

    @typing.overload
    def __sub__(self, other: LSN) -> int: ...
    @typing.overload
    def __sub__(self, other: int) -> LSN: ...
    def __sub__(self, other: LSN | int) -> int | LSN:
        if isinstance(other, LSN):
            return self.value - other.value
        if isinstance(other, bool) or not isinstance(other, int):
            return NotImplemented
        return LSN(self.value - other)


def utc_time(
    value: dt.datetime, what: str = "time", error: type[InputError] = TimeError
) -> dt.datetime:
    """``value`` in UTC; ``error`` (a :class:`~pgsnap.errors.TimeError` by default)
    when it has no time zone or cannot be expressed in UTC.

    The one converter behind every time field of pgsnap's records: naive times
    are refused (pgsnap never guesses a zone), and every stored time is UTC, so
    records compare and sort by instant whatever offset they were given in.
    """
    if not isinstance(value, dt.datetime):
        raise error(f"{what} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise error(
            f"{what} {value.isoformat()} has no time zone",
            hint="give a UTC offset or zone, e.g. '2026-11-30 12:00:00+00:00' "
            "(in Python: datetime(..., tzinfo=timezone.utc))",
        )
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise error(
            f"{what} {value.isoformat()} is out of range once converted to UTC",
            hint="give a time between years 1 and 9999 in UTC",
        ) from None


def _utc(value: dt.datetime) -> dt.datetime:
    return utc_time(value)


def _opt_utc(value: dt.datetime | None) -> dt.datetime | None:
    return None if value is None else utc_time(value)


def _lsn(value: LSN | str) -> LSN:
    return LSN.parse(value)


def _opt_lsn(value: LSN | str | None) -> LSN | None:
    return None if value is None else LSN.parse(value)


def _timeline_ok(_inst: object, _attr: object, value: int) -> None:
    validate_timeline(value)


def _str_tuple(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _sorted_map(mapping: Mapping[str, str]) -> dict[str, str]:
    return dict(sorted(mapping.items()))


def _volumes(values: Iterable[Volume]) -> tuple[Volume, ...]:
    return tuple(values)


def _snapshots(values: Iterable[Snapshot]) -> tuple[Snapshot, ...]:
    return tuple(values)


def _tablespaces(values: Iterable[Tablespace]) -> tuple[Tablespace, ...]:
    return tuple(values)


# --------------------------------------------------------------------------- volumes


class VolumeRole(enum.Enum):
    """What a volume holds for the cluster."""

    DATA = "data"
    """The data directory (PGDATA)."""
    WAL = "wal"
    """``pg_wal`` when it lives on its own volume."""
    TABLESPACE = "tablespace"
    """A tablespace (the volume's ``tablespace_oid`` says which)."""
    ARCHIVE = "archive"
    """The WAL archive: never snapshotted with the cluster, never restored."""


def _check_volume(inst: Volume, _attr: object, _value: VolumeRole) -> None:
    if inst.role is VolumeRole.TABLESPACE and inst.tablespace_oid is None:
        from pgsnap.errors import ConfigurationError  # noqa: PLC0415

        raise ConfigurationError(
            f"volume {inst.id!r} has role tablespace but no tablespace_oid",
            hint="give the OID of the tablespace it holds (SELECT oid FROM pg_tablespace)",
            volume_id=inst.id,
        )


@frozen
class Volume:
    """One storage volume of a cluster's layout and the role it plays.

    ``id`` is the backend's volume id; ``mount_point`` is where the volume's
    file system is mounted on the database host (for directory-backed mock
    volumes: the directory).
    """

    id: str
    name: str
    role: VolumeRole = attrs.field(validator=_check_volume)
    mount_point: str
    tablespace_oid: int | None = None

    @property
    def step_key(self) -> str:
        """How plans' step ids name this volume (``restore-<key>``): :func:`step_key`
        of its id and name."""
        return step_key(self.id, self.name)


_PLAIN_KEY: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def step_key(volume_id: str, *names: str) -> str:
    """The part of a step id that names a volume: its id when that is a plain word (a
    mock's ``vol-0001``, a PowerFlex id), else the first of ``names`` that is one (the
    layout's name of the volume: a btrfs volume's id is its path, an LVM volume's is
    ``vg/lv``), else the id with every run of other characters replaced by ``-``."""
    for candidate in (volume_id, *names):
        if _PLAIN_KEY.fullmatch(candidate):
            return candidate
    return re.sub(r"[^A-Za-z0-9._]+", "-", volume_id).strip("-") or "volume"


@frozen
class Layout:
    """The volumes that hold one cluster: data, optional WAL, tablespaces, archive."""

    volumes: tuple[Volume, ...] = attrs.field(converter=_volumes)

    def __attrs_post_init__(self) -> None:
        from pgsnap.errors import ConfigurationError  # noqa: PLC0415

        ids = [v.id for v in self.volumes]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ConfigurationError(
                f"volume id(s) listed more than once in the layout: {', '.join(dupes)}",
                hint="each storage volume plays exactly one role",
            )
        keys: dict[str, str] = {}
        for v in self.volumes:
            other = keys.setdefault(v.step_key, v.id)
            if other != v.id:
                raise ConfigurationError(
                    f"volumes {other} and {v.id} would both be named {v.step_key!r} in "
                    "plans' step ids",
                    hint="give the volumes different names in the layout",
                )
        if sum(v.role is VolumeRole.DATA for v in self.volumes) != 1:
            raise ConfigurationError(
                "a layout needs exactly one volume with role 'data'",
                hint="add the volume that holds the data directory",
            )

    def by_role(self, role: VolumeRole) -> tuple[Volume, ...]:
        """The volumes with ``role``, in layout order."""
        return tuple(v for v in self.volumes if v.role is role)

    @property
    def data(self) -> Volume:
        """The data-directory volume."""
        return self.by_role(VolumeRole.DATA)[0]

    @property
    def wal(self) -> Volume | None:
        """The ``pg_wal`` volume, if ``pg_wal`` lives on its own volume."""
        found = self.by_role(VolumeRole.WAL)
        return found[0] if found else None

    @property
    def snapshotted(self) -> tuple[Volume, ...]:
        """The volumes a backup snapshots: every role except the archive."""
        return tuple(v for v in self.volumes if v.role is not VolumeRole.ARCHIVE)

    def get(self, volume_id: str) -> Volume:
        """The volume with ``volume_id``; ``VolumeNotFound`` if it is not in the layout."""
        for v in self.volumes:
            if v.id == volume_id:
                return v
        from pgsnap.errors import VolumeNotFound  # noqa: PLC0415

        raise VolumeNotFound(f"volume {volume_id!r} is not in the layout", volume_id=volume_id)


@frozen
class StorageVolume:
    """A volume as the storage backend reports it."""

    id: str
    name: str
    size_bytes: int = 0
    path: str | None = None
    """Where the volume's content is reachable on this host, if the backend knows."""
    mapped_hosts: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    extra: Mapping[str, str] = attrs.field(factory=dict, converter=_sorted_map)
    """Vendor-specific fields (free text)."""


@frozen
class Snapshot:
    """A point-in-time copy of one volume."""

    id: str
    volume_id: str
    name: str
    created_at: dt.datetime = attrs.field(converter=_utc)
    group_id: str | None = None
    """The consistency group the snapshot was taken in, if any."""
    secure: bool = False
    """Protected against deletion until its retention expires (where supported)."""
    extra: Mapping[str, str] = attrs.field(factory=dict, converter=_sorted_map)


@frozen
class SnapshotGroup:
    """Snapshots of several volumes taken at one instant (a consistency group)."""

    id: str
    name: str
    created_at: dt.datetime = attrs.field(converter=_utc)
    snapshots: tuple[Snapshot, ...] = attrs.field(converter=_snapshots)

    def for_volume(self, volume_id: str) -> Snapshot:
        """The group's snapshot of ``volume_id``; ``SnapshotNotFound`` if absent."""
        for s in self.snapshots:
            if s.volume_id == volume_id:
                return s
        from pgsnap.errors import SnapshotNotFound  # noqa: PLC0415

        raise SnapshotNotFound(
            f"snapshot group {self.id!r} has no snapshot of volume {volume_id!r}",
            snapshot_id=self.id,
            volume_id=volume_id,
        )


@frozen
class SnapshotPolicy:
    """A storage-side schedule that takes and rotates snapshots."""

    id: str
    name: str
    volume_ids: tuple[str, ...] = attrs.field(converter=_str_tuple)
    paused: bool = False


class LocationKind(enum.Enum):
    """How the database host reaches a volume's content."""

    DIRECTORY = "directory"
    """The volume is a directory on the host; nothing is mounted (the mock's default)."""
    BLOCK_DEVICE = "block_device"
    """The volume is a block device that the host mounts at the volume's mount point."""


@frozen
class Location:
    """Where a host finds a volume (:meth:`StorageBackend.locate`).

    ``path`` is the directory, or the device node (a ``/dev/disk/by-id`` path,
    an LV path such as ``/dev/vg0/pgdata``). A device may exist only while the
    volume is attached to the host.
    """

    kind: LocationKind
    path: str

    @classmethod
    def directory(cls, path: str) -> Location:
        """A directory on the host."""
        return cls(LocationKind.DIRECTORY, path)

    @classmethod
    def device(cls, path: str) -> Location:
        """A block device node on the host."""
        return cls(LocationKind.BLOCK_DEVICE, path)

    def __str__(self) -> str:
        return f"{self.kind.value} {self.path}"


class RestorePreparation(enum.Enum):
    """What must happen to a volume on the host before the storage restores it."""

    NOTHING = "nothing"
    """The storage rewrites the content in place under a stopped server (directories)."""
    UNMOUNT = "unmount"
    """The file system is unmounted first and mounted again afterwards (btrfs, LVM)."""
    DETACH = "detach"
    """Unmounted, then detached from the host (unmapped), attached and mounted again
    afterwards (PowerFlex, whose overwrite refuses a mapped volume)."""


@frozen
class RestoreProfile:
    """What a restore of one volume asks of the plan (:meth:`StorageBackend.restore_profile`).

    The recovery planner reads it as data and builds unmount, detach, restore,
    attach, wait-for-device and mount steps from it, naming no backend.

    - ``before``: what the host must do first (see :class:`RestorePreparation`);
    - ``consumes_snapshot``: the restore uses the snapshot up (a classic LVM
      merge): the backup cannot be restored again, and the plan lists it as lost.
      A backend that keeps a copy for itself (a thin LVM snapshot of the
      snapshot, merged instead) says False;
    - ``completes_later``: :meth:`StorageBackend.restore_volume` returns before the
      content is in place; the plan then waits with
      :meth:`StorageBackend.wait_for_restore` before mounting;
    - ``clone_refusal``: why this volume's snapshots cannot be cloned
      (:meth:`StorageBackend.clone_snapshot`) although the backend declares
      ``CLONES`` (a classic LVM snapshot cannot be snapshotted); empty when they
      can. The clone planner refuses such a clone with this reason.
    """

    before: RestorePreparation = RestorePreparation.NOTHING
    consumes_snapshot: bool = False
    completes_later: bool = False
    clone_refusal: str = ""

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.before, RestorePreparation):
            from pgsnap.errors import ConfigurationError  # noqa: PLC0415

            raise ConfigurationError(
                f"RestoreProfile.before must be a RestorePreparation, not {self.before!r}"
            )

    @property
    def unmounts(self) -> bool:
        """True when the file system is unmounted around the restore."""
        return self.before is not RestorePreparation.NOTHING

    @property
    def detaches(self) -> bool:
        """True when the volume is detached from the host around the restore."""
        return self.before is RestorePreparation.DETACH


def _options(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


@frozen
class Mount:
    """A mounted file system on the database host, as ``findmnt`` reports it."""

    source: str
    """What is mounted (a device path, or what the kernel shows for it)."""
    target: str
    """The mount point."""
    fstype: str = ""
    options: tuple[str, ...] = attrs.field(default=(), converter=_options)
    """Mount options (``rw``, ``noatime``...), in the kernel's order."""


# --------------------------------------------------------------------------- storage health


class Severity(enum.Enum):
    """How much a finding or a storage problem matters."""

    ERROR = "error"
    """Blocks a backup, or puts a recovery at risk."""
    WARNING = "warning"
    """Worth knowing; does not block (yet)."""


_PROBLEM_CODE_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def _problem_code(_inst: object, _attr: object, value: str) -> None:
    if not isinstance(value, str) or not _PROBLEM_CODE_RE.match(value):
        raise InputError(
            f"a storage problem's code must be a short snake_case word, not {value!r}",
            hint="e.g. 'snapshot_limit', 'snapshot_invalid', 'snapshot_filling'",
        )


def _opt_percent(value: float | None) -> float | None:
    return None if value is None else float(value)


@frozen
class StorageProblem:
    """Something wrong, or about to go wrong, on the storage, said before anyone relies on it.

    A backend that can tell reports these from ``storage_problems()`` (the
    optional :class:`~pgsnap.protocols.StorageHealth` protocol); ``pgsnap
    check`` shows each as a finding whose code is :attr:`code`.

    - ``code``: stable, for scripts (snake_case). pgsnap's backends use
      ``snapshot_limit`` (a snapshot tree near or at the storage's snapshot
      limit: new backups fail once it is reached), ``snapshot_invalid`` (a
      snapshot whose content is lost: it restores nothing),
      ``snapshot_filling`` (a copy-on-write snapshot filling up: it becomes
      invalid when full), ``pool_filling`` (a thin pool holding snapshots
      filling up) and ``restore_leftover`` (something an interrupted restore
      left behind);
    - ``severity``: :attr:`Severity.ERROR` when something fails now (a
      backup, a restore), :attr:`Severity.WARNING` before it does;
    - ``message``: what is wrong, in a sentence naming the object;
    - ``hint``: what to do about it;
    - ``volume_id`` / ``snapshot_id``: the volume and the snapshot concerned
      (None when the problem is not about one);
    - ``percent_used``: how full the limited resource is (0 to 100 and more;
      None when the problem is not about filling up).
    """

    code: str = attrs.field(validator=_problem_code)
    severity: Severity
    message: str
    hint: str = ""
    volume_id: str | None = None
    snapshot_id: str | None = None
    percent_used: float | None = attrs.field(default=None, converter=_opt_percent)

    def __str__(self) -> str:
        text = f"{self.severity.value}: {self.message}"
        return f"{text}; {self.hint}" if self.hint else text


# --------------------------------------------------------------------------- checkpoints


_SPREAD_SLACK: Final = 5.0
"""Seconds a spread checkpoint may run past its target (its fsyncs) before a caller
takes it for skipped."""


@frozen
class CheckpointState:
    """The server's last checkpoint (``pg_control_checkpoint()``; on a standby, its last
    restartpoint) and the settings that schedule the next one."""

    redo_lsn: LSN
    time: dt.datetime
    """When the last checkpoint began (aware)."""
    timeout_seconds: float
    """``checkpoint_timeout``: a checkpoint begins at most this long after the last."""
    completion_target: float
    """``checkpoint_completion_target``: the share of that time a checkpoint is spread
    over."""

    read_at: dt.datetime | None = None
    """The server's clock when this was read (``clock_timestamp()``), so that the
    schedule is reckoned on the server's clock, not the caller's."""
    insert_lsn: LSN | None = None
    """Where WAL is being inserted when this was read (None on a standby)."""
    wal_checkpoint_bytes: int | None = None
    """How much WAL past the last checkpoint's redo point makes PostgreSQL begin the
    next one (``max_wal_size`` / (1 + ``checkpoint_completion_target``), less a
    segment)."""

    @property
    def wal_since_redo(self) -> int | None:
        """WAL written since the last checkpoint's redo point (None when unknown)."""
        if self.insert_lsn is None:
            return None
        return max(0, self.insert_lsn.value - self.redo_lsn.value)

    @property
    def wal_checkpoint_running(self) -> bool:
        """Whether a checkpoint begun for ``max_wal_size`` is under way: enough WAL
        has been written since the last redo point, and the control file has not moved
        on yet (it does when that checkpoint ends)."""
        since = self.wal_since_redo
        return (
            since is not None
            and self.wal_checkpoint_bytes is not None
            and (since >= self.wal_checkpoint_bytes)
        )

    @property
    def next_done_by(self) -> dt.datetime:
        """When the next scheduled checkpoint is over at the latest (one begins sooner
        when ``max_wal_size`` of WAL is written)."""
        spread = self.timeout_seconds * (1.0 + self.completion_target)
        return self.time + dt.timedelta(seconds=spread)

    def next_due(self, at: dt.datetime) -> tuple[dt.datetime, dt.datetime | None]:
        """When PostgreSQL's next timed checkpoint begins, seen at ``at`` (the server's
        clock), and when a timed one that may still be spreading its writes began (None
        when none can be).

        A timed checkpoint begins ``checkpoint_timeout`` after the last one began. A
        server that wrote nothing skips it, keeping the old time in its control file,
        and the next is one timeout later again: so the next is the first multiple of
        the timeout still ahead. One begun at the last multiple may still be running
        for the spread (``checkpoint_completion_target`` of the timeout) and a few
        seconds more, unless it was skipped: only its end can tell, when the control
        file's time moves on. Times are PostgreSQL's whole seconds: a caller asks a
        second or two early.
        """
        period = dt.timedelta(seconds=max(self.timeout_seconds, 1.0))
        passed = max(0, int((at - self.time) / period))
        due = self.time + period * (passed + 1)
        if passed == 0:
            return due, None
        began = self.time + period * passed
        running_for = period * self.completion_target + dt.timedelta(seconds=_SPREAD_SLACK)
        return due, (began if at - began <= running_for else None)


# --------------------------------------------------------------------------- archiver


@frozen
class ArchiverStatus:
    """One row of ``pg_stat_archiver`` plus the settings that decide archiving.

    Times are aware datetimes (or None when never happened).
    """

    archived_count: int
    last_archived_wal: str | None
    last_archived_time: dt.datetime | None = attrs.field(converter=_opt_utc)
    failed_count: int
    last_failed_wal: str | None
    last_failed_time: dt.datetime | None = attrs.field(converter=_opt_utc)
    wal_level: str
    archive_mode: str
    archive_command: str = ""
    archive_library: str = ""
    oldest_ready_age_seconds: float | None = None
    """Age of the oldest ``.ready`` file in ``archive_status`` (None: none waiting / unknown)."""


# --------------------------------------------------------------------------- server


@frozen
class Tablespace:
    """A user tablespace of the cluster (the built-in ones are not listed)."""

    oid: int
    name: str
    location: str


class ServerRole(enum.Enum):
    """What a server is: a primary (read-write) or a standby (in recovery, replaying
    its primary's WAL)."""

    PRIMARY = "primary"
    STANDBY = "standby"


@frozen
class StandbyStatus:
    """What a standby reports about its replication (``describe()`` on a server in
    recovery).

    ``receiver`` is ``pg_stat_wal_receiver.status`` (``"streaming"``...), None when no
    WAL receiver runs (a standby fed by ``restore_command`` alone, or between
    connections), empty when one runs but the role may not see its state (it needs
    ``pg_read_all_stats``); ``sender`` the primary it streams from (``host:port``).
    ``receive_lsn`` / ``replay_lsn``: ``pg_last_wal_receive_lsn()`` /
    ``pg_last_wal_replay_lsn()``; ``replay_time``: the commit time of the last
    transaction replayed. ``full_page_writes`` is the primary's setting as the last
    checkpoint record replayed carries it (``pg_control_checkpoint()``): PostgreSQL
    refuses a backup on a standby whose primary runs without it.
    """

    receiver: str | None
    sender: str = ""
    receive_lsn: LSN | None = attrs.field(default=None, converter=_opt_lsn)
    replay_lsn: LSN | None = attrs.field(default=None, converter=_opt_lsn)
    replay_time: dt.datetime | None = attrs.field(default=None, converter=_opt_utc)
    full_page_writes: bool = True
    slot_name: str = ""

    @property
    def streaming(self) -> bool:
        """True when the WAL receiver streams from the primary."""
        return self.receiver == "streaming"


@frozen
class ServerFacts:
    """What the database adapter observed about a running server.

    ``settings`` holds the settings that matter for backup and recovery, as
    PostgreSQL reports them (text): ``wal_level``, ``archive_mode``,
    ``archive_command``, ``archive_library``, ``archive_timeout``,
    ``full_page_writes``, ``data_checksums``, ``hot_standby``.
    """

    version_num: int
    system_identifier: str
    data_directory: str
    wal_directory: str
    """Where ``pg_wal`` really lives (the symlink resolved)."""
    wal_segment_size: int
    timeline: int
    checkpoint_lsn: LSN = attrs.field(converter=_lsn)
    redo_lsn: LSN = attrs.field(converter=_lsn)
    current_lsn: LSN | None = attrs.field(converter=_opt_lsn)
    """``pg_current_wal_lsn()`` (None on a standby)."""
    in_recovery: bool
    tablespaces: tuple[Tablespace, ...] = attrs.field(default=(), converter=_tablespaces)
    settings: Mapping[str, str] = attrs.field(factory=dict, converter=_sorted_map)
    replay_lsn: LSN | None = attrs.field(default=None, converter=_opt_lsn)
    """``pg_last_wal_replay_lsn()``: the end of the last WAL record replayed by a
    recovery (it stays there after a promotion); None if the server never recovered."""
    standby: StandbyStatus | None = None
    """A server in recovery: its replication (None on a primary)."""

    @property
    def role(self) -> ServerRole:
        """:attr:`ServerRole.STANDBY` while the server is in recovery."""
        return ServerRole.STANDBY if self.in_recovery else ServerRole.PRIMARY

    @property
    def major(self) -> int:
        """The major version (12 ... 18)."""
        return self.version_num // 10000


@frozen
class BackupStart:
    """What ``pg_backup_start`` returned."""

    lsn: LSN = attrs.field(converter=_lsn)
    timeline: int
    time: dt.datetime = attrs.field(converter=_utc)


@frozen
class BackupStop:
    """What ``pg_backup_stop(false)`` returned: keep both files byte for byte."""

    lsn: LSN = attrs.field(converter=_lsn)
    labelfile: str
    spcmapfile: str
    time: dt.datetime = attrs.field(converter=_utc)
    timeline: int


# --------------------------------------------------------------------------- backups


class BackupState(enum.Enum):
    """Life of a backup: STARTED → WAITING_FOR_WAL → DONE, or FAILED from any state."""

    STARTED = "started"
    WAITING_FOR_WAL = "waiting_for_wal"
    DONE = "done"
    FAILED = "failed"


def _opt_aware(value: dt.datetime | None) -> dt.datetime | None:
    return None if value is None else utc_time(value)


@frozen
class Pin:
    """A backup kept by retention whatever the policy says: forever (``until`` None)
    or until a time, for a ``reason`` a person gave."""

    reason: str
    until: dt.datetime | None = attrs.field(default=None, converter=_opt_aware)

    def holds(self, now: dt.datetime) -> bool:
        """True while the pin keeps its backup."""
        return self.until is None or now < self.until


def _check_access(instance: SnapshotAccess, _attribute: object, _value: object) -> None:
    if bool(instance.path) == bool(instance.host):
        from pgsnap.errors import ConfigurationError  # noqa: PLC0415

        raise ConfigurationError(
            "a SnapshotAccess gives either a path (read in place) or a host (exposed "
            f"there first), not {'both' if instance.path else 'neither'}",
            hint="SnapshotAccess.in_place(path) or SnapshotAccess.exposed_on(host)",
        )


@frozen
class SnapshotAccess:
    """How a snapshot's content can be read without touching its origin, for a copy.

    Either:

    - **in place**: ``path`` is a directory on the database host holding the
      snapshot's tree, read-only in spirit (a btrfs read-only snapshot, the
      mock's copy; :meth:`~pgsnap.protocols.ReadableSnapshots.snapshot_access`):
      the copy reads it as it is;
    - **exposed**: ``host`` names the host (the storage's name for it) on which
      the snapshot must first be exposed (:class:`~pgsnap.protocols.ExposableSnapshots`:
      LVM activates it, PowerFlex maps it to the host's SDC) and mounted
      read-only; the copy plan does that, and undoes it, around the send.
    """

    path: str = attrs.field(default="", validator=_check_access)
    host: str = ""

    @classmethod
    def in_place(cls, path: str) -> SnapshotAccess:
        """A snapshot tree read where it is."""
        return cls(path=path)

    @classmethod
    def exposed_on(cls, host: str) -> SnapshotAccess:
        """A snapshot to expose on ``host`` and mount read-only before it is read."""
        return cls(host=host)

    @property
    def must_expose(self) -> bool:
        """True when the snapshot is exposed and mounted before it is read."""
        return bool(self.host)


@frozen
class CopyRecord:
    """A copy of a backup off the array, as the catalog keeps it on the backup's record.

    ``target`` is the copy target's location (never a secret), ``manifest_digest``
    the SHA-256 of the manifest written there; the rest is what the copy did.
    """

    copy_id: str
    target: str
    manifest_digest: str
    created_at: dt.datetime = attrs.field(converter=_utc)
    files: int = 0
    bytes_read: int = 0
    bytes_sent: int = 0
    chunks_new: int = 0
    chunks_reused: int = 0
    seconds: float = 0.0
    wal: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    """The WAL files the copy carries (the backup's segments from its start to its
    stop, and its timeline's history file), as named in the archive: a copy with
    them restores to the backup's consistency point with no WAL archive at all."""
    key_fingerprint: str = ""
    """The fingerprint of the copy key the copy is encrypted with ("" : not encrypted);
    never the key (:class:`~pgsnap.copies.keys.CopyKey`)."""


@frozen
class BackupRecord:
    """A backup in the catalog: what was taken, where it starts and ends.

    ``labelfile`` and ``spcmapfile`` are the exact texts PostgreSQL returned at
    backup stop; they are written back byte for byte at restore. ``snapshots``
    maps each snapshotted volume id to its snapshot id.
    """

    id: str
    label: str
    state: BackupState
    system_identifier: str
    """The cluster's system identifier (text: it does not fit a JSON double)."""
    server_version: int
    """``server_version_num``, e.g. 150018."""
    wal_segment_size: int
    layout: Layout
    start_lsn: LSN = attrs.field(converter=_lsn)
    start_timeline: int = attrs.field(validator=_timeline_ok)
    start_time: dt.datetime = attrs.field(converter=_utc)
    stop_lsn: LSN | None = attrs.field(default=None, converter=_opt_lsn)
    stop_timeline: int | None = None
    stop_time: dt.datetime | None = attrs.field(default=None, converter=_opt_utc)
    labelfile: str | None = None
    spcmapfile: str | None = None
    snapshot_group_id: str | None = None
    snapshots: Mapping[str, str] = attrs.field(factory=dict, converter=_sorted_map)
    orphaned_snapshots: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    """Snapshots taken for this backup that could not be deleted after a failure."""
    failure_reason: str | None = None
    backup_mode_seconds: float | None = None
    """Time the server spent in backup mode."""
    total_seconds: float | None = None
    pgsnap_version: str = ""
    wal_directory: str | None = None
    """Where ``pg_wal`` really was on the database host at the backup (the data
    directory's link resolved): where a surviving WAL volume's WAL is found again."""
    pin: Pin | None = None
    """Kept by retention whatever the policy says (``pgsnap pin``)."""
    copies: tuple[CopyRecord, ...] = ()
    """Copies of the backup off the array (``pgsnap copy``), oldest first."""
    taken_on: ServerRole = ServerRole.PRIMARY
    """Where the backup was taken: on the primary, or on a standby (its snapshots are
    then of the standby's volumes, and its label says ``BACKUP FROM: standby``)."""
    taken_host: str = ""
    """The database host it was taken on (the host's name; empty in older records)."""

    @property
    def is_usable(self) -> bool:
        """True when the backup is DONE (only DONE backups are restored)."""
        return self.state is BackupState.DONE


@frozen
class SafetySnapshot:
    """The snapshots a recovery took of the volumes it was about to overwrite.

    ``name`` is the snapshot group's name (``s-<time>``: the catalog keys it by
    that), ``group_id`` its id on the storage and ``snapshots`` maps each volume
    to its snapshot. The recovery that took it is ``plan_id``; it restored
    backup ``backup_id`` towards ``target``. It holds the state of those
    volumes just before the recovery (after a point-in-time recovery, the only
    copy of what was written after the target): kept until deleted
    (``pgsnap safety delete``, or ``pgsnap expire --safety-after``).
    """

    name: str
    group_id: str
    snapshots: Mapping[str, str] = attrs.field(converter=_sorted_map)
    created_at: dt.datetime = attrs.field(converter=_utc)
    plan_id: str
    backup_id: str
    target: str


class CloneState(enum.Enum):
    """Where a clone is in its life."""

    CREATING = "creating"
    """Its plan is running, or was interrupted or failed: ``pgsnap clone destroy``
    removes whatever was made."""
    READY = "ready"
    """Recovered, promoted (or paused at its target), handed over."""


@frozen
class CloneVolume:
    """One volume of a clone: a new writable copy of backup snapshot ``snapshot_id``
    of the cluster's volume ``origin`` (``role``), found by the clone's server at
    ``path`` (the directory, or the mount point of its device). ``volume_id`` is the
    storage's id of the new volume, once made (empty before)."""

    origin: str
    role: VolumeRole
    snapshot_id: str
    path: str
    volume_id: str = ""
    kind: LocationKind = LocationKind.DIRECTORY
    """How the host reaches it: a directory (``path``), or a block device mounted at
    ``path``."""

    @property
    def step_key(self) -> str:
        """How clone plans' step ids name this volume: :func:`step_key` of its origin
        and the last part of its path (the layout's name of the volume)."""
        return step_key(self.origin, self.path.rstrip("/").rsplit("/", 1)[-1])


def _clone_volumes(values: Iterable[CloneVolume]) -> tuple[CloneVolume, ...]:
    return tuple(values)


@frozen
class CloneRecord:
    """A clone: a separate PostgreSQL instance on new writable copies of a backup's
    snapshots, recovered to ``target``; it never writes to the cluster it came from.

    ``name`` keys it in the catalog. It was made from backup ``backup_id`` by plan
    ``plan_id``, on host ``host``, below directory ``at``; its server runs on
    ``data_directory`` with ``port`` and the socket directory ``socket_directory``,
    and was promoted (``action`` ``"promote"``) or left paused at the target
    (``"pause"``, read-only). ``purpose`` is ``"clone"``, ``"drill"`` or ``"standby"``
    (a streaming standby seeded from the backup: it stays in recovery, read-only,
    following the primary; its ``action`` is ``"pause"`` and its ``target`` latest).
    """

    name: str
    backup_id: str
    target: RecoveryTarget
    host: str
    at: str
    data_directory: str
    port: int
    socket_directory: str
    action: RecoveryAction
    state: CloneState
    created_at: dt.datetime = attrs.field(converter=_utc)
    created_by: str
    plan_id: str
    volumes: tuple[CloneVolume, ...] = attrs.field(converter=_clone_volumes)
    ready_at: dt.datetime | None = attrs.field(default=None, converter=_opt_utc)
    purpose: str = "clone"
    slot: str = ""
    """A standby (``purpose`` ``"standby"``): its physical replication slot on the
    primary (dropped when the standby is destroyed)."""


@frozen
class DrillCheck:
    """One check a restore drill ran on its clone: ``name`` (``"reached target"``,
    ``"amcheck"``, ``"checksums"``, ``"server log"``, ``"sql 1"``...), whether it
    passed, and what it found."""

    name: str
    ok: bool
    detail: str = ""


@frozen
class DrillPhase:
    """How long one phase of a drill took: ``name`` is ``"storage"`` (the clone's
    volumes made and mounted), ``"replay"`` (server start to accepting connections at
    the target), ``"checks"`` or ``"cleanup"``."""

    name: str
    seconds: float


def _drill_checks(values: Iterable[DrillCheck]) -> tuple[DrillCheck, ...]:
    return tuple(values)


def _drill_phases(values: Iterable[DrillPhase]) -> tuple[DrillPhase, ...]:
    return tuple(values)


@frozen
class DrillRecord:
    """The result of a restore drill of backup ``backup_id`` to ``target``: proof (or
    not) that the backup restores.

    ``ok`` when every check passed. ``rto_seconds`` is the time from the drill's first
    step to its clone accepting connections at the target; ``rpo_seconds`` the time
    between the target (or, for ``latest``, the drill's start) and the last
    transaction the clone replayed (None when the server did not say). ``phases`` are
    the measured phases, ``checks`` what was checked; ``error`` says why a drill that
    did not get as far as its checks failed. ``kept`` when the clone ``clone`` was
    left for inspection.
    """

    id: str
    backup_id: str
    target: RecoveryTarget
    clone: str
    started_at: dt.datetime = attrs.field(converter=_utc)
    finished_at: dt.datetime = attrs.field(converter=_utc)
    ok: bool
    checks: tuple[DrillCheck, ...] = attrs.field(converter=_drill_checks)
    phases: tuple[DrillPhase, ...] = attrs.field(converter=_drill_phases)
    rto_seconds: float | None
    rpo_seconds: float | None
    replay_lsn: LSN | None = attrs.field(default=None, converter=_opt_lsn)
    last_transaction: dt.datetime | None = attrs.field(default=None, converter=_opt_utc)
    wal_segments: int = 0
    wal_bytes: int = 0
    error: str = ""
    kept: bool = False

    @property
    def replay_rate(self) -> float | None:
        """WAL replayed per second of the ``replay`` phase (bytes/s), None when not
        measured."""
        seconds = next((p.seconds for p in self.phases if p.name == "replay"), None)
        if not seconds or not self.wal_bytes:
            return None
        return self.wal_bytes / seconds


# --------------------------------------------------------------------------- targets


class TargetKind(enum.Enum):
    """Kinds of recovery target, as PostgreSQL's ``recovery_target*`` settings."""

    LATEST = "latest"
    """Replay all available WAL (complete recovery)."""
    IMMEDIATE = "immediate"
    """Stop as soon as the backup is consistent."""
    TIME = "time"
    LSN = "lsn"
    XID = "xid"
    NAME = "name"
    """A restore point made by ``pg_create_restore_point``."""


_TARGET_VALUE_TYPES: Final[dict[TargetKind, type]] = {
    TargetKind.LATEST: type(None),
    TargetKind.IMMEDIATE: type(None),
    TargetKind.TIME: dt.datetime,
    TargetKind.LSN: LSN,
    TargetKind.XID: int,
    TargetKind.NAME: str,
}


def _target_value(
    value: dt.datetime | LSN | int | str | None,
) -> dt.datetime | LSN | int | str | None:
    if isinstance(value, dt.datetime):
        return utc_time(value, "target time", TargetError)
    return value


def _target_value_ok(
    inst: RecoveryTarget, _attr: object, value: dt.datetime | LSN | int | str | None
) -> None:
    kind = inst.kind
    expected = _TARGET_VALUE_TYPES[kind]
    if not isinstance(value, expected) or isinstance(value, bool):
        raise TargetError(
            f"a {kind.value} target needs a value of type {expected.__name__}, not {value!r}",
            hint="build targets with RecoveryTarget.time(...), .lsn(...), .xid(...), .name(...)",
        )
    if kind is TargetKind.XID and not 3 <= typing.cast(int, value) <= 0xFFFFFFFFFFFFFFFF:
        raise TargetError(f"transaction id {value} is out of range", hint="use a normal xid (>= 3)")
    if kind is TargetKind.NAME and not 0 < len(typing.cast(str, value)) <= 63:
        raise TargetError(
            f"restore point name {value!r} must have 1 to 63 characters",
            hint="use the name given to pg_create_restore_point()",
        )


@frozen
class RecoveryTarget:
    """Where recovery stops: exactly one target, and only one.

    Build with the class methods: ``RecoveryTarget.latest()``,
    ``.immediate()``, ``.time(aware_datetime)``, ``.lsn("0/3000060")``,
    ``.xid(735)``, ``.name("before_migration")``. A time without a time zone is
    refused with :class:`~pgsnap.errors.TargetError`, never guessed.
    ``inclusive`` matters for time, LSN and xid targets (PostgreSQL's
    ``recovery_target_inclusive``).
    """

    kind: TargetKind
    value: dt.datetime | LSN | int | str | None = attrs.field(
        default=None, converter=_target_value, validator=_target_value_ok
    )
    inclusive: bool = True

    @classmethod
    def latest(cls) -> RecoveryTarget:
        """Replay to the end of the available WAL."""
        return cls(TargetKind.LATEST)

    @classmethod
    def immediate(cls) -> RecoveryTarget:
        """Stop at the backup's consistency point."""
        return cls(TargetKind.IMMEDIATE)

    @classmethod
    def time(cls, when: dt.datetime | str, *, inclusive: bool = True) -> RecoveryTarget:
        """Stop at a commit time; ``when`` must carry a time zone."""
        if isinstance(when, str):
            try:
                when = dt.datetime.fromisoformat(when)
            except ValueError:
                raise TargetError(
                    f"malformed time {when!r}",
                    hint="use ISO 8601 with an offset, e.g. '2026-11-30 12:00:00+00:00'",
                ) from None
        return cls(TargetKind.TIME, when, inclusive)

    @classmethod
    def lsn(cls, where: LSN | str, *, inclusive: bool = True) -> RecoveryTarget:
        """Stop at a WAL location."""
        return cls(TargetKind.LSN, LSN.parse(where), inclusive)

    @classmethod
    def xid(cls, xid: int, *, inclusive: bool = True) -> RecoveryTarget:
        """Stop at the commit of a transaction id."""
        return cls(TargetKind.XID, xid, inclusive)

    @classmethod
    def name(cls, restore_point: str) -> RecoveryTarget:
        """Stop at a named restore point."""
        return cls(TargetKind.NAME, restore_point)

    def __str__(self) -> str:
        if self.value is None:
            return self.kind.value
        value = self.value.isoformat() if isinstance(self.value, dt.datetime) else self.value
        excl = "" if self.inclusive else " (exclusive)"
        return f"{self.kind.value} {value}{excl}"


# --------------------------------------------------------------------------- JSON

_T = TypeVar("_T")


_JSON_SCALARS: Final[frozenset[type]] = frozenset({str, int, float, bool, type(None)})


@functools.cache
def _field_names(cls: object) -> tuple[str, ...] | None:
    """The field names of an attrs class (None: not one), looked up once per class."""
    if not isinstance(cls, type) or not attrs.has(cls):
        return None
    return tuple(f.name for f in attrs.fields(cls))


def encode_value(value: Any) -> Any:
    """``value`` as plain JSON data (records, LSNs, times, enums, tuples, mappings)."""
    cls: object = type(value)
    if cls in _JSON_SCALARS:  # the exact types: an enum that is also a str is not one of them
        return value
    if isinstance(value, LSN):
        return str(value)
    names = _field_names(cls)
    if names is not None:
        return {name: encode_value(getattr(value, name)) for name in names}
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [encode_value(v) for v in value]
    if isinstance(value, frozenset | set):
        return sorted((encode_value(v) for v in value), key=json.dumps)
    if isinstance(value, Mapping):
        return {str(k): encode_value(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise FormatError(f"cannot serialise a {type(value).__name__}")


def decode_value(tp: Any, data: Any, where: str) -> Any:
    """Plain JSON ``data`` as a value of type ``tp``; :class:`FormatError` naming ``where``."""
    return _decoder(tp)(data, where)


_Decode = Callable[[Any, str], Any]


@functools.cache
def _decoder(tp: Any) -> _Decode:
    """The decoder of type ``tp``, built once per type (types are immutable), so that
    decoding a record costs no reflection (``typing.get_type_hints``) per value."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return lambda data, where: data
    if origin in (Union, types.UnionType):
        return _union_decoder(args, tp)
    if origin in (frozenset, set) or origin is tuple:
        item = _decoder(args[0] if args else Any)
        make: Callable[[Iterable[Any]], Any] = tuple if origin is tuple else frozenset

        def sequence(data: Any, where: str) -> Any:
            if not isinstance(data, list):
                raise FormatError(f"{where}: expected a list, got {type(data).__name__}")
            return make(item(v, f"{where}[{i}]") for i, v in enumerate(data))

        return sequence
    if origin in (Mapping, dict) or tp is dict:
        value = _decoder(args[1] if len(args) == 2 else Any)

        def mapping(data: Any, where: str) -> Any:
            if not isinstance(data, dict):
                raise FormatError(f"{where}: expected an object, got {type(data).__name__}")
            return {str(k): value(v, f"{where}.{k}") for k, v in data.items()}

        return mapping
    leaf = _LEAVES.get(tp)
    if leaf is not None:
        return leaf
    if isinstance(tp, type) and attrs.has(tp):
        if tp is RecoveryTarget:  # the kind decides the value's type
            return lambda data, where: _from_dict(tp, data, where)
        return _record_decoder(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_decoder(tp)

    def unknown(data: Any, where: str) -> Any:
        raise FormatError(f"{where}: cannot decode type {tp!r}")

    return unknown


def _union_decoder(args: tuple[Any, ...], tp: Any) -> _Decode:
    nullable = type(None) in args
    # RecoveryTarget.value: the kind decides; otherwise try in order.
    choices = [_decoder(a) for a in args if a is not type(None)]
    if nullable and len(choices) == 1:  # X | None, the common case: no loop
        only = choices[0]

        def optional(data: Any, where: str) -> Any:
            return None if data is None else only(data, where)

        return optional

    def union(data: Any, where: str) -> Any:
        if data is None and nullable:
            return None
        if len(choices) == 1:
            return choices[0](data, where)
        errors: list[str] = []
        for choice in choices:
            try:
                return choice(data, where)
            except (FormatError, LSNError, TargetError, TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise FormatError(f"{where}: {data!r} matches none of {tp}: {'; '.join(errors)}")

    return union


def _enum_decoder(tp: type[enum.Enum]) -> _Decode:
    def decode(data: Any, where: str) -> Any:
        try:
            return tp(data)
        except ValueError as exc:
            raise FormatError(f"{where}: {data!r} is not a valid {tp.__name__}") from exc

    return decode


def _lsn_value(data: Any, where: str) -> LSN:
    if not isinstance(data, str):
        raise FormatError(f"{where}: expected an LSN string, got {data!r}")
    return LSN.parse(data)


def _time_value(data: Any, where: str) -> dt.datetime:
    if not isinstance(data, str):
        raise FormatError(f"{where}: expected an ISO time string, got {data!r}")
    try:
        return dt.datetime.fromisoformat(data)
    except ValueError as exc:
        raise FormatError(f"{where}: malformed time {data!r}") from exc


def _bool_value(data: Any, where: str) -> bool:
    if not isinstance(data, bool):
        raise FormatError(f"{where}: expected true/false, got {data!r}")
    return data


def _int_value(data: Any, where: str) -> int:
    if isinstance(data, bool) or not isinstance(data, int):
        raise FormatError(f"{where}: expected an integer, got {data!r}")
    return data


def _float_value(data: Any, where: str) -> float:
    if isinstance(data, bool) or not isinstance(data, int | float):
        raise FormatError(f"{where}: expected a number, got {data!r}")
    return float(data)


def _str_value(data: Any, where: str) -> str:
    if not isinstance(data, str):
        raise FormatError(f"{where}: expected a string, got {data!r}")
    return data


def _none_value(data: Any, where: str) -> None:
    if data is not None:
        raise FormatError(f"{where}: expected null, got {data!r}")


_LEAVES: Final[dict[Any, _Decode]] = {
    LSN: _lsn_value,
    dt.datetime: _time_value,
    bool: _bool_value,
    int: _int_value,
    float: _float_value,
    str: _str_value,
    type(None): _none_value,
}


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, _Decode, bool], ...]:
    """``(name, decoder, required)`` of each field of the attrs class ``cls``."""
    hints = typing.get_type_hints(cls)
    return tuple(
        (f.name, _decoder(hints[f.name]), f.default is attrs.NOTHING) for f in attrs.fields(cls)
    )


# How a field's value is checked: plain JSON leaves are checked inline (the
# common case, no call), everything else by its decoder.
_PLAIN: Final = 0
_STR: Final = 1
_INT: Final = 2
_OPT_STR: Final = 3
_OPT_INT: Final = 4
_MISSING: Final = object()

_PLAIN_KINDS: Final[dict[Any, int]] = {
    str: _STR,
    int: _INT,
    str | None: _OPT_STR,
    int | None: _OPT_INT,
    typing.Optional[str]: _OPT_STR,  # noqa: UP045 (how get_type_hints spells it)
    typing.Optional[int]: _OPT_INT,  # noqa: UP045
}


_MEMOISED: Final[frozenset[type]] = frozenset({Layout})


def _record_decoder(cls: type[_T]) -> _Decode:
    """A decoder for the attrs class ``cls``: its fields' decoders looked up once,
    strings and integers checked inline. Same checks and messages as
    :func:`_from_dict`; about three times faster (a catalog decodes every record)."""
    hints = typing.get_type_hints(cls)
    fields = tuple(
        (
            f.name,
            _PLAIN_KINDS.get(hints[f.name], _PLAIN),
            _decoder(hints[f.name]),
            f.default is attrs.NOTHING,
        )
        for f in attrs.fields(typing.cast(Any, cls))
    )
    name_of = cls.__name__
    # Small immutable values repeat from record to record (every backup of a
    # cluster has the same Layout): decoded once per distinct text.
    memo: dict[str, Any] | None = {} if cls in _MEMOISED else None

    def decode(data: Any, where: str) -> Any:
        if memo is not None:
            key = repr(data)
            hit = memo.get(key)
            if hit is None:
                hit = build(data, where)
                if len(memo) < 64:
                    memo[key] = hit
            return hit
        return build(data, where)

    def build(data: Any, where: str) -> Any:
        if data.__class__ is not dict:
            raise FormatError(f"{where}: expected an object for {name_of}, got {data!r}")
        get = data.get
        kwargs: dict[str, Any] = {}
        for name, kind, dec, required in fields:
            v = get(name, _MISSING)
            if v is _MISSING:
                if required:
                    raise FormatError(f"{where}: {name_of} needs {name!r}")
                continue
            cls_of = v.__class__
            if (
                (kind == _STR and cls_of is str)
                or (kind == _INT and cls_of is int)
                or (kind == _OPT_STR and (v is None or cls_of is str))
                or (kind == _OPT_INT and (v is None or cls_of is int))
            ):
                kwargs[name] = v
            else:
                kwargs[name] = dec(v, f"{where}.{name}")
        # Unknown keys (from a newer minor version) are ignored on purpose.
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, FormatError):
                raise
            raise FormatError(f"{where}: invalid {name_of}: {exc}") from exc

    return decode


def _from_dict(cls: type[_T], data: Any, where: str) -> _T:
    if not isinstance(data, dict):
        raise FormatError(f"{where}: expected an object for {cls.__name__}, got {data!r}")
    kwargs: dict[str, Any] = {}
    for name, decode, required in _fields(typing.cast(Any, cls)):
        if name not in data:
            if required:
                raise FormatError(f"{where}: {cls.__name__} needs {name!r}")
            continue
        if cls is RecoveryTarget and name == "value":
            # The kind decides the value's type (a NAME target may look like a time).
            kind = decode_value(TargetKind, data.get("kind"), f"{where}.kind")
            kwargs[name] = decode_value(_TARGET_VALUE_TYPES[kind], data[name], f"{where}.value")
            continue
        kwargs[name] = decode(data[name], f"{where}.{name}")
    # Unknown keys (from a newer minor version) are ignored on purpose.
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{where}: invalid {cls.__name__}: {exc}") from exc


def to_dict(record: Any) -> dict[str, Any]:
    """A JSON-ready dict of an attrs record, with ``format_version`` and ``type``."""
    body = encode_value(record)
    if not isinstance(body, dict):
        raise FormatError(f"cannot serialise a {type(record).__name__} as a document")
    return {"format_version": FORMAT_VERSION, "type": type(record).__name__, **body}


def check_format_version(
    data: Mapping[str, Any], where: str = "document", ours: str = FORMAT_VERSION
) -> None:
    """Refuse a document whose major format version is not the major of ``ours``."""
    version = data.get("format_version")
    if not isinstance(version, str) or not re.fullmatch(r"\d+\.\d+", version):
        raise FormatError(f"{where} has no valid format_version (got {version!r})")
    major = ours.split(".", maxsplit=1)[0]
    if version.split(".")[0] != major:
        raise FormatError(
            f"{where} has format version {version}; this pgsnap reads {major}.x",
            hint="use the pgsnap version that wrote it, or make the document again",
        )


def from_dict(cls: type[_T], data: Mapping[str, Any]) -> _T:
    """Rebuild a record of ``cls`` from :func:`to_dict` output."""
    if data.get("format_version") != FORMAT_VERSION:
        check_format_version(data, cls.__name__)
    # "format_version" and "type" are not fields: the decoder ignores them.
    return typing.cast(_T, _decoder(typing.cast(Any, cls))(data, cls.__name__))


def to_json(record: Any, *, indent: int | None = 2) -> str:
    """Serialise a record as a JSON document (see :func:`to_dict`)."""
    return json.dumps(to_dict(record), indent=indent, sort_keys=False)


def from_json(cls: type[_T], text: str | bytes) -> _T:
    """Rebuild a record of ``cls`` from :func:`to_json` output."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise FormatError("a pgsnap document is a JSON object")
    return from_dict(cls, data)


# --------------------------------------------------------------------------- recovery settings


class RecoveryAction(enum.Enum):
    """What the server does when it reaches the target (``recovery_target_action``)."""

    PROMOTE = "promote"
    PAUSE = "pause"
    SHUTDOWN = "shutdown"


def _quote_conf(value: str) -> str:
    """Quote a value for postgresql.conf (backslashes escaped, single quotes doubled)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


@frozen
class RecoverySettings:
    """The recovery configuration written into the data directory (PostgreSQL 12+).

    ``target_timeline`` is ``"latest"``, ``"current"`` or a timeline number as
    text. ``lines()`` renders the ``postgresql.auto.conf`` entries; the adapter
    also creates ``recovery.signal``.
    """

    restore_command: str
    target: RecoveryTarget
    target_timeline: str = "latest"
    action: RecoveryAction = RecoveryAction.PROMOTE

    def parameters(self) -> dict[str, str]:
        """The settings as PostgreSQL parameter name → unquoted value."""
        out = {
            "restore_command": self.restore_command,
            "recovery_target_timeline": self.target_timeline,
            "recovery_target_action": self.action.value,
        }
        t = self.target
        if t.kind is TargetKind.IMMEDIATE:
            out["recovery_target"] = "immediate"
        elif t.kind is TargetKind.TIME:
            assert isinstance(t.value, dt.datetime)
            # Numeric offset from UTC, never an abbreviation (PostgreSQL docs).
            out["recovery_target_time"] = t.value.astimezone(dt.UTC).strftime(
                "%Y-%m-%d %H:%M:%S.%f+00"
            )
        elif t.kind is TargetKind.LSN:
            out["recovery_target_lsn"] = str(t.value)
        elif t.kind is TargetKind.XID:
            out["recovery_target_xid"] = str(t.value)
        elif t.kind is TargetKind.NAME:
            assert isinstance(t.value, str)
            out["recovery_target_name"] = t.value
        if t.kind in (TargetKind.TIME, TargetKind.LSN, TargetKind.XID):
            out["recovery_target_inclusive"] = "on" if t.inclusive else "off"
        return out

    def lines(self) -> list[str]:
        """``name = 'value'`` lines for ``postgresql.auto.conf``."""
        return [f"{k} = {_quote_conf(v)}" for k, v in self.parameters().items()]
