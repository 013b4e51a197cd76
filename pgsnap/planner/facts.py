"""Facts: immutable records of what was observed, the planners' only input.

Gathering facts is the only I/O before planning (see
:mod:`pgsnap.cluster`); the planners are pure functions of these records and
a request. :func:`fingerprint` digests the parts of the facts a plan depends
on, so the executor can refuse a plan whose facts went stale.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import ConfigurationError
from pgsnap.model import (
    LSN,
    ArchiverStatus,
    BackupRecord,
    Layout,
    Location,
    LocationKind,
    Mount,
    RestoreProfile,
    ServerFacts,
    Snapshot,
    SnapshotPolicy,
    StorageVolume,
    to_dict,
)
from pgsnap.protocols import Capability
from pgsnap.wal.continuity import ArchiveIndex
from pgsnap.wal.events import WalEvents
from pgsnap.wal.timelines import TimelineGraph

__all__ = [
    "BackupFacts",
    "PathFacts",
    "RecoveryFacts",
    "VolumeFacts",
    "WalEvents",
    "cluster_paths",
    "fingerprint",
]


@frozen
class VolumeFacts:
    """What the storage and the database host say about one volume of the layout.

    ``location`` and ``profile`` come from the storage (:meth:`locate`,
    :meth:`restore_profile`); ``resolved`` is the location's path with every
    symlink resolved on the host (None when it is not there now: a detached
    device); ``mount`` is what is mounted exactly at the volume's mount point
    now (None: nothing, or the volume is a directory).
    """

    volume_id: str
    location: Location
    profile: RestoreProfile
    resolved: str | None = None
    mount: Mount | None = None


@frozen
class PathFacts:
    """Where one of the cluster's directories really is on the database host.

    ``what`` names it (``"data directory"``, ``"pg_wal"``, ``"tablespace ts1
    (oid 16384)"``); ``real`` is the path resolved on the host; ``mount`` the
    mount holding it and ``device`` that mount's source, resolved.
    """

    what: str
    path: str
    real: str
    mount: Mount | None = None
    device: str | None = None

    def on(self, volume: VolumeFacts) -> bool:
        """True when this directory lives on ``volume``."""
        if volume.location.kind is LocationKind.DIRECTORY:
            root = (volume.resolved or volume.location.path).rstrip("/") or "/"
            return self.real == root or self.real.startswith(root.rstrip("/") + "/")
        return (
            self.device is not None
            and volume.resolved is not None
            and self.device == volume.resolved
        )


def cluster_paths(server: ServerFacts) -> tuple[tuple[str, str], ...]:
    """``(what, path)`` of each directory of the cluster a volume must hold."""
    items = [("data directory", server.data_directory), ("pg_wal", server.wal_directory)]
    items += [(f"tablespace {t.name} (oid {t.oid})", t.location) for t in server.tablespaces]
    return tuple(items)


@frozen
class BackupFacts:
    """Everything the backup planner looks at."""

    server: ServerFacts
    archiver: ArchiverStatus
    layout: Layout
    volumes: tuple[StorageVolume, ...]
    capabilities: frozenset[Capability]
    catalog: tuple[BackupRecord, ...]
    """Catalog records (the observer leaves them out: it gives their system identifiers)."""
    archive_location: str
    archive_timelines: tuple[int, ...]
    """Timelines the archive holds (at least those ahead of the server's)."""
    archive_system_identifier: str | None = None
    """System identifier read from an archived segment's header (None if none)."""
    host: str = ""
    """The database host's name, as the storage knows it."""
    volume_facts: tuple[VolumeFacts, ...] = ()
    """Per layout volume (archive excluded): location, restore profile, mount."""
    paths: tuple[PathFacts, ...] = ()
    """The data directory, pg_wal and every tablespace, as the host resolves them."""
    catalog_system_identifiers: frozenset[str] = frozenset()
    """The system identifiers of the catalog's backups (besides those in ``catalog``)."""
    last_archived_present: bool | None = None
    """Whether the archive holds the file ``pg_stat_archiver`` says was archived last
    (None: not asked, or nothing archived yet). False: ``archive_command`` writes
    somewhere else (or copies nothing), and a backup's WAL would never arrive."""
    primary: ServerFacts | None = None
    """The server is a standby and pgsnap reaches its primary (``[primary]``): what the
    primary reported."""
    primary_archiver: ArchiverStatus | None = None
    """The primary's ``pg_stat_archiver`` (with :attr:`primary`)."""
    primary_error: str = ""
    """A primary is configured but could not be asked: why."""

    def volume(self, volume_id: str) -> VolumeFacts | None:
        """The facts of ``volume_id`` (None when not gathered)."""
        return next((v for v in self.volume_facts if v.volume_id == volume_id), None)


def _str_map(value: Mapping[str, str]) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()}


@frozen
class RecoveryFacts:
    """Everything the recovery planner looks at.

    ``server`` is None when the server is down (the usual case after a
    failure). ``local_wal`` names the segments in the surviving ``pg_wal``
    (used only when the WAL volume is kept). ``now`` is the time the facts
    were gathered: the planner never reads a clock.
    """

    layout: Layout
    backups: tuple[BackupRecord, ...]
    snapshots: tuple[Snapshot, ...]
    policies: tuple[SnapshotPolicy, ...]
    capabilities: frozenset[Capability]
    archive: ArchiveIndex
    timelines: TimelineGraph
    archive_location: str
    """Where the WAL archive is, for messages (the archive gives the restore_command
    itself when the plan runs, so a command carrying credentials is never in a plan)."""
    now: dt.datetime
    server: ServerFacts | None = None
    archive_with_local_wal: ArchiveIndex | None = None
    events: WalEvents | None = None
    host: str = ""
    """The database host's name, as the storage knows it (attach and detach use it)."""
    volume_facts: tuple[VolumeFacts, ...] = ()
    """Per layout volume (archive excluded): location, restore profile, mount."""
    damaged: Mapping[str, str] = attrs.field(factory=dict, converter=_str_map)
    """Archived segments that cannot be replayed (name → why: truncated, another
    cluster's, not the segment of its name), among those the observer verified
    (:func:`~pgsnap.wal.reader.segment_problem`): a recovery that would fetch one
    is refused, as at a gap."""

    copies: frozenset[tuple[str, str]] = frozenset()
    """The copies off the array found in their targets: ``(target, copy id)`` of each
    manifest the observer saw, among the catalog's copies."""
    copy_options: Mapping[str, str] = attrs.field(factory=dict, converter=_str_map)
    """The configured copy target's options (no secret), for a copy in S3."""
    clone_hosts: frozenset[str] = frozenset()
    """The hosts other than the database host where clones may run (by the storage's
    name for them): pgsnap reaches them (``[clone_hosts.NAME]``)."""
    data_directory: str = ""
    """The cluster's data directory as pgsnap is configured with it (or the running
    server reports it); "" : not known. A clone finds its data directory at the same
    place below its copy of the data volume."""
    copy_key_file: str = ""
    """The configured copy key file (``[copies] key_file``: its path, never the key),
    given to the steps that restore an encrypted copy; "" : none."""
    archive_by_name: bool = False
    """``archive`` was not listed: it is what an earlier run knew, extended by probing
    names (:mod:`pgsnap.wal.known`). A plan made from it holds only once confirmed
    (:meth:`pgsnap.observe.Observer.confirm_archive`)."""
    _newest_first: tuple[BackupRecord, ...] | None = attrs.field(
        init=False, default=None, eq=False, repr=False
    )

    def usable_newest_first(self) -> tuple[BackupRecord, ...]:
        """The usable backups (DONE, with a stop LSN), the newest stop first: the order
        a recovery considers them in. Sorted on the first call and kept: a plan and
        its observation ask several times, which at ten thousand backups cost 8 ms a
        time. (:meth:`evolve` passes it on; ``attrs.evolve`` makes facts that sort
        again.)"""
        if self._newest_first is None:
            done = [b for b in self.backups if b.is_usable and b.stop_lsn is not None]
            done.sort(
                key=lambda b: (b.stop_time or b.start_time, b.stop_lsn or b.start_lsn),
                reverse=True,
            )
            object.__setattr__(self, "_newest_first", tuple(done))
        assert self._newest_first is not None
        return self._newest_first

    def evolve(self, **changes: Any) -> RecoveryFacts:
        """``attrs.evolve(self, **changes)`` that keeps the order
        :meth:`usable_newest_first` found, when ``backups`` is not among the changes:
        the observer adds to the facts three times, and each new one sorted ten
        thousand backups again (about 12 ms each)."""
        evolved = attrs.evolve(self, **changes)
        if "backups" not in changes and self._newest_first is not None:
            object.__setattr__(evolved, "_newest_first", self._newest_first)
        return evolved

    def volume(self, volume_id: str) -> VolumeFacts:
        """The facts of ``volume_id``; ConfigurationError when they were not gathered
        (the planner never guesses how a volume is restored)."""
        for v in self.volume_facts:
            if v.volume_id == volume_id:
                return v
        raise ConfigurationError(
            f"the recovery facts say nothing of how volume {volume_id} is located and restored",
            hint="gather facts with Cluster.recovery_facts(), or give a VolumeFacts per volume",
            volume_id=volume_id,
        )


def _canonical(value: Any) -> Any:
    if attrs.has(type(value)):
        return _canonical(to_dict(value))
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda i: str(i[0]))}
    if isinstance(value, list | tuple | frozenset | set):
        items = [_canonical(v) for v in value]
        return sorted(items, key=json.dumps) if isinstance(value, frozenset | set) else items
    if isinstance(value, LSN):
        return str(value)
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if hasattr(value, "value") and hasattr(value, "name"):  # enums
        return value.value
    return value


def fingerprint(parts: Mapping[str, Any]) -> str:
    """A stable sha256 hex digest of plain data and records."""
    blob = json.dumps(_canonical(parts), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()
