"""Facts: immutable records of what was observed, the planners' only input.

Gathering facts is the only I/O before planning (see
:mod:`pgsnap.session`); the planners are pure functions of these records and
a request. :func:`fingerprint` digests the parts of the facts a plan depends
on, so the executor can refuse a plan whose facts went stale.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

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
from pgsnap.wal import ArchiveIndex, TimelineGraph

__all__ = [
    "BackupFacts",
    "PathFacts",
    "RecoveryFacts",
    "VolumeFacts",
    "WalEvents",
    "cluster_paths",
    "fingerprint",
]


def _spans(values: Iterable[tuple[LSN, LSN]]) -> tuple[tuple[LSN, LSN], ...]:
    """Sorted, with overlapping or touching spans joined."""
    out: list[tuple[LSN, LSN]] = []
    for lo, hi in sorted(values):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


@attrs.frozen
class WalEvents:
    """What a read of the WAL found, for placing targets and stating them as times.

    ``commits`` are ``(lsn, commit time, xid)`` of transaction commits in LSN
    order: every commit (:func:`pgsnap.walreader.scan_events`, ``pg_waldump``),
    or those a plan's questions need (:func:`pgsnap.walindex.read_events`:
    each segment's first and last, and those answering its
    :class:`~pgsnap.walindex.WalQuery`); ``restore_points`` are ``(lsn, name)``.
    ``spans`` are the stretches of WAL that were scanned (``[from, to)``,
    sorted, disjoint): the WAL each candidate backup can reach, not more.
    ``complete`` when they cover all the WAL every candidate backup can reach,
    up to ``end_of_wal`` when set.
    """

    commits: tuple[tuple[LSN, dt.datetime, int], ...] = ()
    restore_points: tuple[tuple[LSN, str], ...] = ()
    scanned_from: LSN | None = None
    scanned_to: LSN | None = None
    complete: bool = False
    end_of_wal: LSN | None = None
    """Where the valid WAL ends, when the scan stopped at an invalid record before
    the end of the segments (a surviving pg_wal: recycled or zeroed space follows
    the last record). Replay ends there too; None when the scan did not see it."""
    spans: tuple[tuple[LSN, LSN], ...] = attrs.field(default=(), converter=_spans)

    def __attrs_post_init__(self) -> None:
        if not self.spans and self.scanned_from is not None and self.scanned_to is not None:
            object.__setattr__(self, "spans", ((self.scanned_from, self.scanned_to),))

    def covers(self, lsn: LSN) -> bool:
        """True when ``lsn`` lies in a scanned stretch."""
        return any(lo <= lsn < hi for lo, hi in self.spans)

    def uncovered(self, lo: LSN, hi: LSN) -> tuple[tuple[LSN, LSN], ...]:
        """The parts of ``[lo, hi)`` not scanned yet."""
        out: list[tuple[LSN, LSN]] = []
        at = lo
        for a, b in self.spans:
            if b <= at:
                continue
            if a >= hi:
                break
            if a > at:
                out.append((at, a))
            at = max(at, b)
        if at < hi:
            out.append((at, hi))
        return tuple(out)

    def merge(self, other: WalEvents) -> WalEvents:
        """Both scans' findings (of stretches of one timeline path)."""
        commits = {c[0]: c for c in (*self.commits, *other.commits)}
        points = {(p[0], p[1]) for p in (*self.restore_points, *other.restore_points)}
        spans = _spans((*self.spans, *other.spans))
        ends = [e for e in (self.end_of_wal, other.end_of_wal) if e is not None]
        return WalEvents(
            commits=tuple(commits[k] for k in sorted(commits)),
            restore_points=tuple(sorted(points)),
            scanned_from=spans[0][0] if spans else None,
            scanned_to=spans[-1][1] if spans else None,
            complete=self.complete and other.complete,
            end_of_wal=max(ends) if ends else None,
            spans=spans,
        )

    def last_commit(self, before: LSN | None = None) -> tuple[LSN, dt.datetime, int] | None:
        """The last commit (before ``before``, when given)."""
        for c in reversed(self.commits):
            if before is None or c[0] < before:
                return c
        return None

    def known_last_commit(self, before: LSN) -> tuple[LSN, dt.datetime, int] | None:
        """The last commit before ``before``, when the WAL read proves it is the last:
        it lies in a scanned stretch that runs on, without a hole, to ``before``."""
        last = self.last_commit(before=before)
        if last is None:
            return None
        for lo, hi in self.spans:
            if lo <= last[0] < hi:
                return last if hi >= before else None
        return None

    def restore_point(self, name: str) -> LSN | None:
        """The LSN of the first restore point called ``name`` (None if not seen)."""
        for lsn, n in self.restore_points:
            if n == name:
                return lsn
        return None

    def commit_of(self, xid: int) -> LSN | None:
        """The LSN of the commit of ``xid`` (None if not seen)."""
        for lsn, _when, x in self.commits:
            if x == xid:
                return lsn
        return None

    def first_commit_after(self, when: dt.datetime) -> LSN | None:
        """The LSN of the first commit later than ``when`` (None if none)."""
        for lsn, t, _x in self.commits:
            if t > when:
                return lsn
        return None


@attrs.frozen
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


@attrs.frozen
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


@attrs.frozen
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

    def volume(self, volume_id: str) -> VolumeFacts | None:
        """The facts of ``volume_id`` (None when not gathered)."""
        return next((v for v in self.volume_facts if v.volume_id == volume_id), None)


def _str_map(value: Mapping[str, str]) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()}


@attrs.frozen
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
    (:func:`~pgsnap.walreader.segment_problem`): a recovery that would fetch one
    is refused, as at a gap."""

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
