"""What ``pgsnap check`` finds beyond the backup preflight: recoveries at risk.

The backup preflight (:func:`pgsnap.planner.backup.preflight`) judges whether a
backup can be taken. A check also asks whether the backups that exist can be
recovered, and says so even when no backup could be taken right now:

- ``server``: the server cannot be described (stopped, unreachable);
- ``archive``: the WAL archive cannot be read (a missing directory);
- ``archive_mismatch``: ``pg_stat_archiver`` reports a file archived that the
  archive does not hold (``archive_command`` writes somewhere else);
- ``backup_wal``: a DONE backup's own WAL (start to stop) is not all archived;
- ``wal_gap``: a segment is missing after a backup, so a recovery stops short;
- ``catalog``: a catalog record cannot be read (its file is named);
- ``os_user``: the configured OS user does not exist, or does not own the
  data directory (stopping and starting the server would fail mid-recovery);
- storage problems the backend reports (the optional
  :class:`~pgsnap.protocols.StorageHealth`), each under its own code
  (``snapshot_limit``, ``snapshot_invalid``...: see
  :class:`~pgsnap.model.StorageProblem`); ``storage`` when the backend
  could not be asked;
- ``orphan_snapshots``: snapshots pgsnap made of the cluster's volumes that
  no catalog record names (:func:`~pgsnap.planner.reconcile.find_orphans`),
  with their age: space the storage holds for nothing, deleted by
  ``pgsnap expire --orphans-after``;
- ``safety_snapshots``: safety snapshots recoveries recorded that are older
  than :data:`SAFETY_REMINDER` (kept until deleted: a reminder, with the
  command that deletes each).

Two halves, as the planners: the observer gathers the facts (it only reads:
:meth:`pgsnap.observe.Observer.check_facts`) into :class:`CheckFacts`;
:func:`check_findings`, here, is pure and turns those facts into
:class:`~pgsnap.planner.backup.Finding` s.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING, Final

from pgsnap._attrs import frozen
from pgsnap.catalog import UnreadableEntry
from pgsnap.errors import PgsnapError, TimelineError
from pgsnap.model import LSN, ArchiverStatus, BackupRecord, SafetySnapshot, StorageProblem
from pgsnap.planner.backup import Finding, Severity
from pgsnap.planner.reconcile import Orphan
from pgsnap.wal import (
    ArchiveIndex,
    TimelineGraph,
    WalCheck,
    check,
)

if TYPE_CHECKING:
    pass

__all__ = [
    "DEFAULT_SEGMENT_SIZE",
    "SAFETY_REMINDER",
    "CheckFacts",
    "check_findings",
]

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_SIZE = 16 * 1024 * 1024
"""The segment size assumed when no server, backup or archived segment says (16 MiB)."""


@frozen
class CheckFacts:
    """What a check observed, beyond the backup facts (see the module docstring).

    ``server_error`` is why the server could not be described (None: it was),
    ``server_running`` whether its postmaster runs (None: unknown).
    ``archiver`` is ``pg_stat_archiver`` (None when the server was not asked).
    ``archive_error`` is why the archive could not be read; ``archive_names``
    its file names; ``index`` and ``timelines`` its WAL at ``segment_size``.
    ``backups`` are the readable catalog records, ``unreadable`` the others.
    ``os_user`` is the OS user configured to run the server (None: the data
    directory's owner), ``os_user_exists`` whether the host knows it (None:
    not asked); ``data_directory_owner`` / ``data_directory_uid`` describe the
    data directory on the host (None: unknown or missing).
    ``storage_problems`` are what the storage backend reported
    (:class:`~pgsnap.protocols.StorageHealth`; empty when it has no such
    report), ``storage_error`` why asking it failed (None: it did not).
    """

    archive_location: str
    segment_size: int
    index: ArchiveIndex
    timelines: TimelineGraph
    archive_names: tuple[str, ...] = ()
    archive_error: str | None = None
    server_error: str | None = None
    server_running: bool | None = None
    archiver: ArchiverStatus | None = None
    backups: tuple[BackupRecord, ...] = ()
    unreadable: tuple[UnreadableEntry, ...] = ()
    host: str = "this machine"
    data_directory: str | None = None
    data_directory_owner: str | None = None
    data_directory_uid: int | None = None
    os_user: str | None = None
    os_user_exists: bool | None = None
    storage_problems: tuple[StorageProblem, ...] = ()
    storage_error: str | None = None
    orphans: tuple[Orphan, ...] = ()
    """Orphan snapshot groups (:func:`~pgsnap.planner.reconcile.find_orphans`)."""
    now: dt.datetime | None = None
    """The time of the check (orphans' ages; None: ages not shown)."""
    safety: tuple[SafetySnapshot, ...] = ()
    """The safety snapshots recoveries recorded."""
    server_refused: bool = False
    """The server answered and refused pgsnap's connection (authentication, slots)."""
    server_port: int | None = None
    """The port the running server listens on (its ``postmaster.pid``), when known."""
    not_writable: tuple[tuple[str, str], ...] = ()
    """(what, why) for the catalog and journal directories a backup could not write."""
    recovery_refusal: tuple[str, str] | None = None
    """Why the recovery planner refuses a recovery of the newest backup to the end of
    the archive (the error's class name and message), when it does."""


# --------------------------------------------------------------------------- pure


def check_findings(facts: CheckFacts) -> tuple[Finding, ...]:
    """Every check-only finding in ``facts`` (pure: no I/O, no clock)."""
    out: list[Finding] = []
    out += _server(facts)
    out += _archive(facts)
    out += _backups_wal(facts)
    out += _catalog(facts)
    out += _os_user(facts)
    out += _storage(facts)
    out += _orphans(facts)
    out += _safety(facts)
    out += _writable(facts)
    out += _recovery(facts)
    return tuple(out)


SAFETY_REMINDER: Final = dt.timedelta(days=14)
"""A recorded safety snapshot older than this is a warning in ``check`` (it is kept
until deleted: the warning reminds that it holds storage, and how to delete it)."""


def _safety(facts: CheckFacts) -> list[Finding]:
    now = facts.now
    if now is None:
        return []
    old = [r for r in facts.safety if now - r.created_at >= SAFETY_REMINDER]
    if not old:
        return []
    shown = "; ".join(
        f"{r.name} ({(now - r.created_at).days} days, recovery to {r.target})" for r in old[:5]
    )
    more = f"; and {len(old) - 5} more" if len(old) > 5 else ""
    return [
        Finding(
            "safety_snapshots",
            Severity.WARNING,
            f"{len(old)} safety snapshot(s) recoveries took are older than "
            f"{SAFETY_REMINDER.days} days: {shown}{more}; each holds the state a recovery "
            "replaced (kept until deleted): `pgsnap safety delete NAME` once it is no longer "
            "needed, or `pgsnap expire --safety-after 14d`",
        )
    ]


_ORPHANS_SHOWN: Final = 10


def _orphans(facts: CheckFacts) -> list[Finding]:
    if not facts.orphans:
        return []
    now = facts.now
    lines = [
        o.describe(now)
        if now is not None
        else f"snapshot group {o.group_name} ({o.group_id}: {', '.join(o.snapshot_ids)})"
        for o in facts.orphans[:_ORPHANS_SHOWN]
    ]
    more = len(facts.orphans) - len(lines)
    held = [o for o in facts.orphans if o.held is not None]
    return [
        Finding(
            "orphan_snapshots",
            Severity.WARNING,
            f"{len(facts.orphans)} snapshot group(s) pgsnap made are named by no backup record "
            f"(a killed or failed backup, a recovery's safety snapshot): {'; '.join(lines)}"
            + (f"; and {more} more" if more > 0 else "")
            + (f" ({len(held)} still needed by an unfinished run or backup)" if held else "")
            + ": look at them, then `pgsnap expire --orphans-after 7d` deletes those older "
            "than 7 days (or `pgsnap rebuild-catalog` makes records of backups whose record "
            "was lost)",
        )
    ]


def _server(facts: CheckFacts) -> list[Finding]:
    if facts.server_error is None:
        return []
    where = f" (data directory {facts.data_directory})" if facts.data_directory else ""
    if facts.server_running is False:
        message = (
            f"the server is not running{where}: a backup needs it running; start it, "
            "or recover it if its volumes were lost (pgsnap plan-recovery)"
        )
    elif facts.server_refused:
        message = (
            f"the server runs{where} but refuses pgsnap: {facts.server_error}; a backup "
            "and a recovery's verification would fail: fix the password or pg_hba.conf"
        )
    else:
        port = (
            f" (its postmaster.pid says it listens on port {facts.server_port})"
            if facts.server_port is not None
            else ""
        )
        message = (
            f"the server runs{where}{port} but pgsnap cannot reach it: "
            f"{facts.server_error}; check [database] conninfo (host, port)"
            if facts.server_running
            else f"cannot ask the server{where}: {facts.server_error}; fix the connection "
            "([database] conninfo, the password) or start the server"
        )
    return [Finding("server", Severity.ERROR, message)]


def _writable(facts: CheckFacts) -> list[Finding]:
    return [
        Finding(
            "not_writable",
            Severity.ERROR,
            f"{what} is not writable: {why}; a backup records itself there, and a "
            "recovery journals every step: fix its permissions or mount it read-write",
        )
        for what, why in facts.not_writable
    ]


def _recovery(facts: CheckFacts) -> list[Finding]:
    """What the recovery planner says of a recovery to the end of the archive, when it
    refuses one that the other findings have not already named."""
    if facts.recovery_refusal is None:
        return []
    _kind, message = facts.recovery_refusal
    return [Finding("recovery", Severity.ERROR, message)]


def _archive(facts: CheckFacts) -> list[Finding]:
    if facts.archive_error is None:
        return []  # an archive that lacks what the archiver sent is the preflight's finding
    return [
        Finding(
            "archive",
            Severity.ERROR,
            f"the WAL archive cannot be read: {facts.archive_error}; no recovery can "
            "fetch WAL from it: fix [archive] path or mount its file system",
        )
    ]


def _usable(facts: CheckFacts) -> list[BackupRecord]:
    """DONE backups with a stop LSN at the archive's segment size, oldest first."""
    out = []
    for b in facts.backups:
        if not b.is_usable or b.stop_lsn is None:
            continue
        if b.wal_segment_size != facts.segment_size:
            log.debug(
                "backup %s: %s-byte segments, the archive is read at %s: not checked",
                b.id,
                b.wal_segment_size,
                facts.segment_size,
            )
            continue
        out.append(b)
    return sorted(out, key=lambda b: (b.start_lsn, b.start_time))


def _walk(facts: CheckFacts, b: BackupRecord, end: LSN | None) -> WalCheck | None:
    """``wal.check`` from the backup's start, on the latest timeline that descends from it."""
    own = b.stop_timeline or b.start_timeline
    latest = max(facts.timelines.latest(), own)
    for tli in dict.fromkeys((latest, own)):
        try:
            return check(facts.index, (b.start_timeline, b.start_lsn), end, tli, facts.timelines)
        except TimelineError:
            continue  # the backup is not on that timeline's history: try its own
        except PgsnapError as exc:
            log.debug("WAL of backup %s not checked on timeline %s: %s", b.id, tli, exc)
            return None
    return None


def _missing(result: WalCheck) -> str:
    if not result.missing_count:
        return ", ".join(result.missing_histories)
    more = f" and {result.missing_count - 1} more" if result.missing_count > 1 else ""
    return f"{result.missing[0]}{more}"


def _backups_wal(facts: CheckFacts) -> list[Finding]:
    if facts.archive_error is not None:
        return []  # the archive finding says it all
    usable = _usable(facts)
    if not usable:
        return []
    out: list[Finding] = []
    newest = usable[-1]
    seen: set[str] = set()
    for b in reversed(usable):
        is_newest = b is newest
        severity = Severity.ERROR if is_newest else Severity.WARNING
        assert b.stop_lsn is not None
        own = _walk(facts, b, b.stop_lsn)
        if own is not None and own.missing_count:
            seen.add(own.missing[0])
            out.append(
                Finding(
                    "backup_wal",
                    severity,
                    f"backup {b.id}{' (the newest)' if is_newest else ''} cannot be restored: "
                    f"its WAL from {b.start_lsn} to {b.stop_lsn} is not all in the archive "
                    f"(missing {_missing(own)}); copy the segments back into the archive, "
                    "or take a new backup",
                )
            )
            continue
        after = _walk(facts, b, None)
        if after is None or after.complete:
            continue
        first = after.missing[0] if after.missing else ",".join(after.missing_histories)
        if first in seen:
            continue  # a newer backup's finding names this gap already
        seen.add(first)
        if is_newest:
            out.append(
                Finding(
                    "wal_gap",
                    Severity.ERROR,
                    f"WAL after the newest backup {b.id} is missing from the archive: "
                    f"{_missing(after)}; a recovery from it stops at {after.reachable_lsn} "
                    "and every later transaction is lost: copy the segments back into the "
                    "archive (from pg_wal, if still there), then take a new backup",
                )
            )
        elif after.reachable_lsn < newest.start_lsn:
            out.append(
                Finding(
                    "wal_gap",
                    Severity.WARNING,
                    f"WAL after backup {b.id} is missing from the archive: {_missing(after)}; "
                    f"points between {after.reachable_lsn} and {newest.stop_lsn} (the "
                    f"consistency point of backup {newest.id}) cannot be recovered",
                )
            )
    return out


def _catalog(facts: CheckFacts) -> list[Finding]:
    return [
        Finding(
            "catalog",
            Severity.ERROR,
            f"catalog file {u.path} is unreadable ({u.error}): the backup it records "
            f"({u.backup_id}) cannot be used for a recovery; restore the file from a copy, "
            "or move it out of the catalog",
        )
        for u in facts.unreadable
    ]


def _os_user(facts: CheckFacts) -> list[Finding]:
    user, owner = facts.os_user, facts.data_directory_owner
    where = facts.data_directory
    if user is not None and facts.os_user_exists is False:
        return [
            Finding(
                "os_user",
                Severity.ERROR,
                f"os_user {user!r} does not exist on the database host ({facts.host}): the "
                "server could not be stopped or started (a recovery would fail); set "
                f"[database] os_user to the data directory's owner"
                f"{f' ({owner!r})' if owner else ''}, or remove it",
            )
        ]
    if user is not None and owner is not None and owner != user:
        return [
            Finding(
                "os_user",
                Severity.ERROR,
                f"the data directory {where} belongs to {owner!r}, not to os_user {user!r}: "
                "the server could not be stopped or started (a recovery would fail); set "
                f"[database] os_user = {owner!r}, or chown the data directory",
            )
        ]
    if facts.data_directory_uid == 0:
        return [
            Finding(
                "os_user",
                Severity.ERROR,
                f"the data directory {where} belongs to root; PostgreSQL refuses to run as "
                "root: chown -R it (and pg_wal, tablespaces) to the server's OS user",
            )
        ]
    return []


def _storage(facts: CheckFacts) -> list[Finding]:
    out: list[Finding] = []
    if facts.storage_error is not None:
        out.append(
            Finding(
                "storage",
                Severity.WARNING,
                f"the storage could not be asked about its health: {facts.storage_error}; "
                "snapshot limits and invalid snapshots are not checked: fix the storage "
                "connection ([storage] options) and check again",
            )
        )
    order = {Severity.ERROR: 0, Severity.WARNING: 1}
    for p in sorted(facts.storage_problems, key=lambda p: order[p.severity]):
        message = f"{p.message}; {p.hint}" if p.hint else p.message
        out.append(Finding(p.code, p.severity, message))
    return out
