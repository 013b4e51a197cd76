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

Two halves, as the planners: :func:`gather_check_facts` does the I/O (it only
reads) and returns :class:`CheckFacts`; :func:`check_findings` is pure and
turns those facts into :class:`~pgsnap.planner.backup.Finding` s.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs

from pgsnap.catalog import CatalogScan, UnreadableEntry, scan_catalog
from pgsnap.errors import ArchiveError, CommandError, HostError, PgsnapError, TimelineError
from pgsnap.model import LSN, ArchiverStatus, BackupRecord, SafetySnapshot, StorageProblem
from pgsnap.planner.backup import Finding, Severity
from pgsnap.planner.reconcile import Orphan
from pgsnap.protocols import StorageHealth
from pgsnap.wal import (
    VALID_SEGMENT_SIZES,
    ArchiveIndex,
    TimelineGraph,
    WalCheck,
    WalFileKind,
    check,
    parse_archive_name,
)

if TYPE_CHECKING:
    from pgsnap.protocols import Catalog, DatabaseAdapter, StorageBackend, WalArchive

__all__ = [
    "DEFAULT_SEGMENT_SIZE",
    "SAFETY_REMINDER",
    "CheckFacts",
    "EmptyArchive",
    "check_findings",
    "gather_check_facts",
    "gather_storage_problems",
]

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_SIZE = 16 * 1024 * 1024
"""The segment size assumed when no server, backup or archived segment says (16 MiB)."""


@attrs.frozen
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


# --------------------------------------------------------------------------- I/O


class EmptyArchive:
    """Stands in for an archive that cannot be read, so the other facts can be observed.

    It has the real archive's ``location`` and holds nothing. A check uses it
    to run the backup preflight when the archive directory is missing: the
    ``archive`` finding reports the archive itself.
    """

    def __init__(self, location: str) -> None:
        self._location = location

    @property
    def location(self) -> str:
        """Where the (unreadable) archive is."""
        return self._location

    def list_names(
        self, segment_size: int | None = None, *, check_sizes: bool = True
    ) -> tuple[str, ...]:
        """Nothing."""
        return ()

    def exists(self, name: str) -> bool:
        """Nothing exists."""
        return False

    def read_text(self, name: str) -> str:
        """Nothing can be read."""
        raise ArchiveError(f"{name} cannot be read: the archive {self._location} is unreadable")

    def index(self, segment_size: int, *, check_sizes: bool = True) -> ArchiveIndex:
        """An empty index."""
        return ArchiveIndex.build((), segment_size)

    def histories(self, names: Sequence[str] | None = None) -> TimelineGraph:
        """No history."""
        return TimelineGraph()

    def restore_command(self) -> str:
        """None can work."""
        raise ArchiveError(f"the archive {self._location} is unreadable")


def gather_storage_problems(
    backend: StorageBackend, volume_ids: Sequence[str] | None = None
) -> tuple[tuple[StorageProblem, ...], str | None]:
    """Ask ``backend`` for its problems with ``volume_ids`` (reads only).

    Returns the problems and None, or no problem and why the backend could
    not be asked: any exception it raises is caught (a check reports it as
    the ``storage`` finding and goes on). A backend without
    :class:`~pgsnap.protocols.StorageHealth` has no problem to report.
    """
    if not isinstance(backend, StorageHealth):
        return (), None
    ids = None if volume_ids is None else tuple(volume_ids)
    try:
        found = backend.storage_problems(ids)
    except PgsnapError as exc:
        log.debug("storage problems of %s not known: %s", backend.name, exc)
        return (), str(exc)
    except Exception as exc:  # a third-party backend's own exception: still a finding
        log.debug("storage problems of %s not known", backend.name, exc_info=True)
        return (), f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    problems = tuple(found)
    bad = [p for p in problems if not isinstance(p, StorageProblem)]
    if bad:
        return (), (
            f"the {backend.name} backend's storage_problems() returned "
            f"{type(bad[0]).__name__}, not StorageProblem"
        )
    return problems, None


def _segment_size(
    server_size: int | None, backups: tuple[BackupRecord, ...], archive: WalArchive
) -> int:
    """The server's segment size, else the newest backup's, else an archived segment's."""
    if server_size is not None:
        return server_size
    if backups:
        return backups[-1].wal_segment_size
    location = getattr(archive, "path", None)
    if isinstance(location, str):
        try:
            names = archive.list_names()
        except PgsnapError:
            names = ()
        for name in names:
            entry = parse_archive_name(name)
            if entry.kind is WalFileKind.SEGMENT and entry.compression is None:
                try:
                    size = os.stat(os.path.join(location, name)).st_size
                except OSError:
                    continue
                if size in VALID_SEGMENT_SIZES:
                    return size
    return DEFAULT_SEGMENT_SIZE


def gather_check_facts(
    *,
    adapter: DatabaseAdapter,
    archive: WalArchive,
    catalog: Catalog,
    scan: CatalogScan | None = None,
    server_error: str | None = None,
    archiver: ArchiverStatus | None = None,
    segment_size: int | None = None,
    backend: StorageBackend | None = None,
    volume_ids: Sequence[str] | None = None,
    server_refused: bool = False,
    journal_dir: str | os.PathLike[str] | None = None,
) -> CheckFacts:
    """Observe what :func:`check_findings` needs (reads only).

    ``scan`` is the catalog's content when the caller has read it already;
    ``server_error`` is why describing the server failed (the caller tried);
    ``archiver`` and ``segment_size`` are what the server said, when it did;
    ``backend`` is asked for its problems with ``volume_ids``
    (:func:`gather_storage_problems`; None: the storage is not checked).
    ``server_refused``: the server answered and refused the connection.
    ``journal_dir``: the executor's journal directory, checked writable (as the
    catalog is, when it can say: ``check_writable``).
    """
    if scan is None:
        scan = scan_catalog(catalog)
    seg = _segment_size(segment_size, scan.records, archive)
    archive_error = None
    names: tuple[str, ...] = ()
    index = ArchiveIndex.build((), seg)
    graph = TimelineGraph()
    try:
        names = archive.list_names()
        index = archive.index(seg)
        graph = archive.histories(index.history_names)
    except ArchiveError as exc:
        archive_error = exc.message
    except PgsnapError as exc:  # a malformed history file: the WAL report shows the rest
        log.warning("the archive's timeline histories cannot be read: %s", exc)
    host = adapter.host
    running: bool | None = None
    if server_error is not None:
        try:
            running = adapter.is_running()
        except PgsnapError as exc:
            log.debug("is the server running? %s", exc)
    data_directory = getattr(adapter, "data_directory", None)
    data_directory = data_directory if isinstance(data_directory, str) else None
    owner: str | None = None
    uid: int | None = None
    if data_directory is not None:
        try:
            info = host.stat(data_directory)
        except HostError as exc:
            log.debug("data directory %s not described: %s", data_directory, exc)
            info = None
        if info is not None:
            owner, uid = info.owner, info.uid
    os_user = _configured_os_user(adapter)
    storage_problems: tuple[StorageProblem, ...] = ()
    storage_error: str | None = None
    if backend is not None:
        storage_problems, storage_error = gather_storage_problems(backend, volume_ids)
    exists: bool | None = None
    if os_user is not None and os_user != owner:
        try:
            exists = host.run(["id", "-u", "--", os_user], check=False, timeout=30).ok
        except (CommandError, HostError) as exc:
            log.debug("id -u %s: %s", os_user, exc)
    port = None
    if server_error is not None and running:
        listening = getattr(adapter, "listening_port", None)
        port = listening() if callable(listening) else None
    return CheckFacts(
        server_refused=server_refused,
        server_port=port if isinstance(port, int) else None,
        not_writable=_not_writable(catalog, journal_dir),
        archive_location=archive.location,
        segment_size=seg,
        index=index,
        timelines=graph,
        archive_names=names,
        archive_error=archive_error,
        server_error=server_error,
        server_running=running,
        archiver=archiver,
        backups=scan.records,
        unreadable=scan.unreadable,
        host=host.description,
        data_directory=data_directory,
        data_directory_owner=owner,
        data_directory_uid=uid,
        os_user=os_user,
        os_user_exists=exists,
        storage_problems=storage_problems,
        storage_error=storage_error,
    )


def _not_writable(
    catalog: object, journal_dir: str | os.PathLike[str] | None
) -> tuple[tuple[str, str], ...]:
    """(what, why) for the catalog and journal directories that cannot be written now:
    a file is created in each and removed (the journal directory's nearest existing
    ancestor when it does not exist yet: a run creates it)."""
    out: list[tuple[str, str]] = []
    probe = getattr(catalog, "check_writable", None)
    if callable(probe):
        try:
            probe()
        except PgsnapError as exc:
            out.append((f"the catalog {getattr(catalog, 'path', catalog)}", exc.message))
    if journal_dir is not None:
        where = os.path.abspath(os.fspath(journal_dir))
        while not os.path.isdir(where) and os.path.dirname(where) != where:
            where = os.path.dirname(where)
        name = os.path.join(where, f".pgsnap-write-check-{os.getpid()}")
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.close(fd)
            os.unlink(name)
        except OSError as exc:
            out.append((f"the journal directory {journal_dir}", exc.strerror or str(exc)))
    return tuple(out)


def _configured_os_user(adapter: object) -> str | None:
    """The OS user the adapter was told runs the server (None: the data directory's owner).

    Read from the adapter's public ``os_user`` (adapters without one have
    no configured user).
    """
    value = getattr(adapter, "os_user", None)
    if isinstance(value, str) and value:
        return value
    return None
