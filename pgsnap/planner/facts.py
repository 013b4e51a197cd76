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
from collections.abc import Mapping
from typing import Any

import attrs

from pgsnap.model import (
    LSN,
    ArchiverStatus,
    BackupRecord,
    Layout,
    ServerFacts,
    Snapshot,
    SnapshotPolicy,
    StorageVolume,
    to_dict,
)
from pgsnap.protocols import Capability
from pgsnap.wal import ArchiveIndex, TimelineGraph

__all__ = ["BackupFacts", "RecoveryFacts", "WalEvents", "fingerprint"]


@attrs.frozen
class WalEvents:
    """What a scan of WAL records (``pg_waldump``) found, for stating targets as times.

    ``commits`` are ``(lsn, commit time, xid)`` of transaction commits in LSN
    order; ``restore_points`` are ``(lsn, name)``. ``scanned_from`` /
    ``scanned_to`` bound the scanned range (``complete`` when it covers all
    the WAL after the oldest usable backup, up to ``end_of_wal`` when set).
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

    def last_commit(self, before: LSN | None = None) -> tuple[LSN, dt.datetime, int] | None:
        """The last commit (before ``before``, when given)."""
        for c in reversed(self.commits):
            if before is None or c[0] < before:
                return c
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
class BackupFacts:
    """Everything the backup planner looks at."""

    server: ServerFacts
    archiver: ArchiverStatus
    layout: Layout
    volumes: tuple[StorageVolume, ...]
    capabilities: frozenset[Capability]
    catalog: tuple[BackupRecord, ...]
    archive_location: str
    archive_timelines: tuple[int, ...]
    archive_system_identifier: str | None = None
    """System identifier read from an archived segment's header (None if none)."""


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
    restore_command: str
    now: dt.datetime
    server: ServerFacts | None = None
    archive_with_local_wal: ArchiveIndex | None = None
    events: WalEvents | None = None


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
