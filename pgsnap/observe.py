"""Observation: the facts the planners need, gathered from the world (read-only I/O).

:class:`Observer` asks the database adapter, the storage backend, the WAL
archive, the catalog and the database host what they hold, and returns the
immutable facts (:mod:`pgsnap.planner.facts`) the pure planners work from.
It is the only I/O before planning, and it never changes anything.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import logging
import os
import posixpath
import subprocess
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import attrs

from pgsnap._attrs import define, frozen
from pgsnap._journal import JOURNAL_SUFFIX, RunState, read_journal
from pgsnap.catalog import CatalogScan, catalog_system_identifiers, scan_catalog
from pgsnap.copies import open_target
from pgsnap.errors import (
    ArchiveError,
    CommandError,
    ConfigurationError,
    HostError,
    HostFileNotFound,
    PgsnapError,
    SnapshotNotFound,
    UnsupportedCapability,
    VolumeNotFound,
    WalNameError,
)
from pgsnap.host import FileKind, Host, LocalRunner, mount_holding
from pgsnap.model import (
    LSN,
    ArchiverStatus,
    BackupRecord,
    Layout,
    LocationKind,
    Mount,
    RecoveryTarget,
    ServerFacts,
    SnapshotAccess,
    StorageProblem,
    TargetKind,
    VolumeRole,
)
from pgsnap.planner.checks import DEFAULT_SEGMENT_SIZE, CheckFacts
from pgsnap.planner.copy import backup_wal_names
from pgsnap.planner.copy_expiry import CopyExpiryFacts
from pgsnap.planner.expiry import ExpiryFacts
from pgsnap.planner.facts import (
    BackupFacts,
    PathFacts,
    RecoveryFacts,
    VolumeFacts,
    WalEvents,
    cluster_paths,
)
from pgsnap.planner.reconcile import RebuildFacts, RebuildSource, SnapshotHold, hold_of_journal
from pgsnap.planner.recovery import Candidate, RecoveryRequest, iter_candidates
from pgsnap.protocols import (
    Capability,
    Catalog,
    DatabaseAdapter,
    ExposableSnapshots,
    LocalWalArchive,
    PrimaryServer,
    ReadableSnapshots,
    StorageBackend,
    StorageHealth,
    WalArchive,
)
from pgsnap.timeline import TimelineView, build_timeline
from pgsnap.wal import (
    ArchivedFile,
    ArchiveIndex,
    DirectoryWalArchive,
    TimelineGraph,
    TimelineSpan,
    archived_segment_size,
    backup_file_name,
    check,
    parse_backup_file,
    segment_name,
    segment_start,
    segments_to_replay,
)
from pgsnap.wal.contents import WalIndex, WalQuery, read_events
from pgsnap.wal.dump import scan_wal
from pgsnap.wal.files import ReadStream
from pgsnap.wal.known import KnownArchive
from pgsnap.wal.reader import (
    WalSource,
    archived_segment_problem,
    find_segment,
    parse_page_header,
    read_archived_segment_header,
    read_segment_header,
)

__all__ = [
    "DEFAULT_SEGMENT_SIZE",
    "EmptyArchive",
    "Observer",
    "gather_check_facts",
    "gather_storage_problems",
    "is_live_segment",
    "read_archive_system_identifier",
]

log = logging.getLogger(__name__)

_Scanner = Callable[
    [list[WalSource], tuple[TimelineSpan, ...], LSN, LSN, WalQuery, int], tuple[WalEvents, int]
]
"""Reads the WAL of the sources (the archive, then a surviving pg_wal) along a timeline path
from one LSN to another, answering a :class:`~pgsnap.wal.contents.WalQuery`, reading at most
so many segments (the newest); returns what it found and how many segments it read."""

_SEGMENT_NAME_LEN = 24


def _judged_lazily(candidates: Iterator[Candidate]) -> Iterator[Candidate]:
    """The candidates until one cannot be judged: a request the planner refuses (an
    unknown backup, a missing timeline) gets no WAL read; the planner says why."""
    try:
        yield from candidates
    except PgsnapError as exc:
        log.debug("no (further) WAL scan: %s", exc)


def _segment_of(archived: str | None) -> str | None:
    """The segment whose header an archiver's last archived file lets one read: the
    file itself when it is a segment; for a backup history file
    (``<segment>.<offset>.backup``, what a backup archives last), the segment it is
    named after, archived before it. None for anything else (a timeline history, a
    ``.partial``, nothing archived)."""
    if archived is None:
        return None
    name = archived.strip()
    head = name[:_SEGMENT_NAME_LEN]
    if len(head) != _SEGMENT_NAME_LEN or not _is_hex(head):
        return None
    tail = name[_SEGMENT_NAME_LEN:]
    if not tail:
        return head
    if tail.endswith(".backup") and len(tail) == 16 and _is_hex(tail[1:9]) and tail[0] == ".":
        return head
    return None


def _is_hex(text: str) -> bool:
    return all(c in "0123456789ABCDEFabcdef" for c in text)


def read_archive_system_identifier(path: str | os.PathLike[str]) -> str | None:
    """The system identifier in a WAL segment's first page header, plain or
    compressed (None if unreadable: :func:`pgsnap.wal.read_segment_header`)."""
    try:
        return str(read_segment_header(path).system_identifier)
    except (ArchiveError, WalNameError):
        return None


def is_live_segment(name: str, head: bytes, segment_size: int) -> bool:
    """False for a segment file in pg_wal that holds no WAL of its name (yet).

    After a checkpoint PostgreSQL renames old segments to future names
    (``wal_recycle``) or creates zero-filled ones: such a file exists, but its
    first page header (``head``: at least its first 16 bytes, read with
    :func:`pgsnap.wal.parse_page_header`) still carries its old address (or
    nothing). Its name must not count as WAL that replay can reach. Other
    files (history, ``.partial``, ``.backup``) count as they are.
    """
    if len(name) != _SEGMENT_NAME_LEN or any(c not in "0123456789ABCDEF" for c in name):
        return True
    page = parse_page_header(head)
    if page is None:
        return False
    per_id = 0x100000000 // segment_size
    segno = int(name[8:16], 16) * per_id + int(name[16:], 16)
    return page.pageaddr == LSN(segno * segment_size) and 0 < page.timeline <= int(name[:8], 16)


# --------------------------------------------------------------------------- check's facts


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

    def stat(self, name: str) -> ArchivedFile | None:
        """No file."""
        return None

    def open(self, name: str) -> ReadStream:
        """Nothing can be read."""
        raise ArchiveError(f"{name} cannot be read: the archive {self._location} is unreadable")

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
    try:
        size = archived_segment_size(archive)
    except PgsnapError as exc:
        log.debug("segment size: the archive cannot say (%s)", exc)
        size = None
    return DEFAULT_SEGMENT_SIZE if size is None else size


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


_F = TypeVar("_F", bound=Callable[..., Any])


def _one_listing(method: _F) -> _F:
    """Run an observation inside the backend's ``observation()`` block, where it has
    one (:meth:`pgsnap.backends.lvm.LvmBackend.observation`): the storage is listed
    once for all the questions an observation asks, and anew by the next one."""

    @functools.wraps(method)
    def observed(self: Observer, *args: Any, **kwargs: Any) -> Any:
        block = getattr(self.backend, "observation", None)
        with block() if callable(block) else contextlib.nullcontext():
            return method(self, *args, **kwargs)

    return typing.cast(_F, observed)


_INDEX_STRETCH: Final = 64
"""Segments :meth:`Observer.index_wal` reads between two progress reports."""


@frozen
class WalIndexRun:
    """What :meth:`Observer.index_wal` did: the backup and timeline it followed, the
    WAL from ``start`` to ``end``, the segments ``read`` (and so indexed: ``added``
    summaries stored) and those ``indexed`` already. Nothing when there is no usable
    backup (``backup_id`` None)."""

    backup_id: str | None = None
    timeline: int | None = None
    start: LSN | None = None
    end: LSN | None = None
    read: int = 0
    indexed: int = 0
    added: int = 0

    def explain(self) -> str:
        """One line for a person."""
        if self.backup_id is None or self.start is None:
            return "WAL index: no usable backup, so no WAL a recovery would read"
        return (
            f"WAL index: {self.added} segment(s) indexed now, {self.indexed} before "
            f"({self.read} read); the WAL a recovery from backup {self.backup_id} reads "
            f"on timeline {self.timeline}, {self.start} to {self.end}"
        )


@define
class Observer:
    """Gathers facts for the planners from one cluster's collaborators.

    ``clock`` gives the (aware, UTC) time the facts are taken at;
    ``waldump`` is a ``pg_waldump`` to read the WAL with instead of
    pgsnap's own reader (:mod:`pgsnap.wal.reader`); ``wal_index`` keeps what
    that reader found in each archived segment, so planning reads each
    segment once (:mod:`pgsnap.wal.contents`; None: no index);
    ``max_scan_segments`` bounds the segments read for commit times per
    plan (segments the index answers are not counted); ``journal_dir`` is
    the executor's journal directory (what unfinished runs still need from
    the storage: :meth:`snapshot_holds`; None: no journals).
    """

    adapter: DatabaseAdapter
    backend: StorageBackend
    archive: WalArchive
    catalog: Catalog
    layout: Layout
    clock: Callable[[], dt.datetime]
    waldump: Path | None = None
    max_scan_segments: int = 256
    wal_index: WalIndex | None = None
    journal_dir: Path | None = None
    copy_options: Mapping[str, str] = attrs.field(factory=dict)
    """The configured copy target's options (no secret): used to look for the
    catalog's copies in S3 targets."""
    copy_key_file: str = ""
    """The configured copy key file's path (``[copies] key_file``), passed on to the
    recovery planner; the observer never reads it."""
    primary: PrimaryServer | None = None
    """The primary, when the cluster is a standby and pgsnap reaches its primary."""

    def _now(self) -> dt.datetime:
        return self.clock()

    @_one_listing
    def backup_facts(self) -> BackupFacts:
        """Observe what the backup planner needs (server, archiver, volumes, catalog).

        The archive is not listed: the timelines ahead of the server's are found
        by their ``.history`` files (a timeline above 1 always has one), and the
        archive's system identifier is read from the segment the server archived
        last (after a backup, when that was its ``.backup`` file, from the segment
        that file names). Only a server that has archived nothing yet (or last a
        timeline's history) costs a listing, to find some segment to read it from.
        The catalog gives its clusters' system identifiers
        (:func:`~pgsnap.catalog.catalog_system_identifiers`).
        """
        server = self.adapter.describe()
        archiver = self.adapter.archiver_status()
        primary, primary_archiver, primary_error = None, None, ""
        if server.in_recovery and self.primary is not None:
            try:
                primary = self.primary.describe()
                primary_archiver = self.primary.archiver_status()
            except PgsnapError as exc:
                log.warning("the primary cannot be asked: %s", exc)
                primary, primary_error = None, exc.message
        last = archiver.last_archived_wal
        timeline = server.timeline if primary is None else max(server.timeline, primary.timeline)
        probe = _segment_of(
            last or (None if primary_archiver is None else primary_archiver.last_archived_wal)
        )
        if probe is not None:
            sysid = self._segment_sysid(probe)
            timelines = self._timelines_from(timeline)
        else:
            sysid, timelines = self._listed_sysid_and_timelines(server.wal_segment_size)
        present = None
        if last:
            try:
                present = self.archive.exists(last.strip())
            except PgsnapError as exc:
                log.debug("is %s archived? %s", last, exc)
        return BackupFacts(
            last_archived_present=present,
            server=server,
            archiver=archiver,
            layout=self.layout,
            volumes=self.backend.list_volumes(),
            capabilities=self.backend.capabilities,
            catalog=(),
            catalog_system_identifiers=catalog_system_identifiers(self.catalog),
            archive_location=self.archive.location,
            archive_timelines=timelines,
            archive_system_identifier=sysid,
            host=self.host.name,
            volume_facts=self._volume_facts(),
            paths=self._path_facts(server),
            primary=primary,
            primary_archiver=primary_archiver,
            primary_error=primary_error,
        )

    def snapshot_access(
        self, record: BackupRecord, *, host: str | None = None
    ) -> dict[str, SnapshotAccess]:
        """Where each data and tablespace snapshot of ``record`` can be read (volume id
        → access), for a copy: in place (:class:`~pgsnap.protocols.ReadableSnapshots`),
        or exposed on ``host`` (default: the database host's name) and mounted
        there first (:class:`~pgsnap.protocols.ExposableSnapshots`). A snapshot
        that is gone is left out (the copy planner refuses then).
        :class:`~pgsnap.errors.UnsupportedCapability` when the backend can do
        neither."""
        backend = self.backend
        if not isinstance(backend, ReadableSnapshots | ExposableSnapshots):
            raise UnsupportedCapability(
                f"the {backend.name} backend's snapshots can be neither read in place nor "
                "exposed on a host, so its backups cannot be copied",
                hint="copies work on backends with ReadableSnapshots (mock, btrfs) or "
                "ExposableSnapshots (LVM, PowerFlex)",
                backend=backend.name,
            )
        wanted = [
            (vol, snap)
            for vol in record.layout.volumes
            if (snap := record.snapshots.get(vol.id)) is not None
            and vol.role in (VolumeRole.DATA, VolumeRole.TABLESPACE)
        ]
        found: dict[str, SnapshotAccess] = {}
        if isinstance(backend, ReadableSnapshots):
            for vol, snap in wanted:
                try:
                    found[vol.id] = backend.snapshot_access(snap)
                except SnapshotNotFound:
                    log.info("backup %s: snapshot %s of %s is gone", record.id, snap, vol.id)
            return found
        where = host or self.host.name
        present = {s.id for s in backend.list_snapshots()}
        for vol, snap in wanted:
            if snap in present:
                found[vol.id] = SnapshotAccess.exposed_on(where)
            else:
                log.info("backup %s: snapshot %s of %s is gone", record.id, snap, vol.id)
        return found

    def backup_wal(self, record: BackupRecord) -> dict[str, str]:
        """Which of the WAL files a copy of ``record`` carries
        (:func:`~pgsnap.planner.copy.backup_wal_names`) the archive holds, each with
        the name it is stored under (compressed or not): a few ``stat`` calls. A
        file the archive cannot answer for counts as absent."""
        found: dict[str, str] = {}
        for name in backup_wal_names(record):
            try:
                hit = (
                    self.archive.stat(name)
                    if name.endswith(".history")
                    else find_segment(self.archive, name)
                )
            except PgsnapError as exc:
                log.info("WAL file %s of backup %s not found: %s", name, record.id, exc)
                continue
            if hit is not None:
                found[name] = hit.name
        return found

    @_one_listing
    def expiry_facts(self) -> ExpiryFacts:
        """Observe what the expiry planner needs: the catalog, the storage's snapshots,
        the archive and its timeline histories.

        The archive is listed (names only), or, when its state is known from an
        earlier run (:mod:`pgsnap.wal.known`), probed by name: new segments and
        timelines after what is known, each run's first segment (a run an
        expiry cut short is bisected), and the ``.backup`` files of the
        catalog's backups. An expiry deletes only below the WAL its kept
        backups need, which the catalog and the histories decide, so what a
        probe may miss (a segment older than any known) is kept, never lost."""
        scan = scan_catalog(self.catalog)
        backups = scan.records
        seg = self._segment_size(backups)
        known = self.known_archive(seg)
        probed = None if known is None else known.probed()
        trimmed = None if known is None or probed is None else known.trimmed(probed)
        if known is not None and trimmed is not None:
            known.save(trimmed)
            index = trimmed
            names = {backup_file_name(b.start_lsn, b.start_timeline, seg) for b in backups}
            index = attrs.evolve(index, backup_names=known.present(sorted(names)))
        else:
            index = self._listed(seg)
        return ExpiryFacts(
            backups=backups,
            snapshots=self.backend.list_snapshots(),
            archive=index,
            timelines=self._histories(index),
            now=self._now(),
            capabilities=self.backend.capabilities,
            archive_location=self.archive.location,
            volume_ids=frozenset(v.id for v in self.layout.volumes),
            holds=self.snapshot_holds(),
            unreadable=tuple(u.backup_id for u in scan.unreadable),
            safety=self.catalog.list_safety(),
        )

    @_one_listing
    def copy_expiry_facts(self, target: str) -> CopyExpiryFacts:
        """Observe what copy retention needs for the copy target ``target``: the
        catalog, the manifests in the target (one listing; a target that cannot be
        listed is a :class:`~pgsnap.errors.CopyError`: nothing is planned on doubt)
        and the storage's snapshots (when the storage cannot be listed, the array
        may be gone: the facts say so, and every backup counts as one whose
        snapshots are gone)."""
        scan = scan_catalog(self.catalog)
        options = dict(self.copy_options) if target.startswith("s3://") else {}
        manifests = frozenset(open_target(target, options).manifest_ids())
        snapshots: frozenset[str] | None
        try:
            snapshots = frozenset(s.id for s in self.backend.list_snapshots())
        except PgsnapError as exc:
            log.warning(
                "the storage's snapshots cannot be listed (%s): every backup counts as one "
                "whose snapshots are gone",
                exc,
            )
            snapshots = None
        return CopyExpiryFacts(
            backups=scan.records,
            target=target,
            manifests=manifests,
            now=self._now(),
            snapshots=snapshots,
            target_options=options,
            unreadable=tuple(u.backup_id for u in scan.unreadable),
        )

    @_one_listing
    def check_facts(
        self,
        *,
        scan: CatalogScan | None = None,
        server_error: str | None = None,
        archiver: ArchiverStatus | None = None,
        segment_size: int | None = None,
        server_refused: bool = False,
    ) -> CheckFacts:
        """What ``check``'s own findings need (:func:`gather_check_facts` on this
        cluster's collaborators, its snapshotted volumes and journal directory)."""
        return gather_check_facts(
            adapter=self.adapter,
            archive=self.archive,
            catalog=self.catalog,
            scan=scan,
            server_error=server_error,
            archiver=archiver,
            segment_size=segment_size,
            backend=self.backend,
            volume_ids=[v.id for v in self.layout.snapshotted],
            server_refused=server_refused,
            journal_dir=self.journal_dir,
        )

    @_one_listing
    def rebuild_facts(self, log_timezone: dt.tzinfo | None = None) -> RebuildFacts:
        """Observe what a catalog rebuild needs (reads only): the catalog, the
        storage's snapshots, the archive's index, histories and ``.backup`` files
        (those of backups the catalog already has are not read), and the
        cluster's system identifier and version (the server's, else the
        newest archived segment's header). ``log_timezone`` resolves the zone
        abbreviations of START/STOP TIME (``CET``...)."""
        from pgsnap._version import __version__  # noqa: PLC0415

        scan = scan_catalog(self.catalog)
        backups = scan.records
        seg = self._segment_size(backups)
        index = self.archive.index(seg, check_sizes=False)
        known = {
            backup_file_name(b.start_lsn, b.start_timeline, b.wal_segment_size) for b in backups
        }
        sources = []
        for name in index.backup_names:
            if name in known or name.split(".backup")[0] + ".backup" in known:
                continue  # a backup the catalog has
            try:
                text = self.archive.read_text(name)
                parsed = parse_backup_file(text, log_timezone=log_timezone)
            except PgsnapError as exc:
                sources.append(RebuildSource(name, "", None, exc.message))
                continue
            sources.append(RebuildSource(name, text, parsed))
        sysid, version = self._cluster_identity(index)
        return RebuildFacts(
            backups=backups,
            snapshots=self.backend.list_snapshots(),
            volume_ids=frozenset(v.id for v in self.layout.volumes),
            layout=self.layout,
            sources=tuple(sources),
            archive=index,
            timelines=self._histories(index),
            system_identifier=sysid,
            server_version=version,
            pgsnap_version=__version__,
            unreadable=tuple(u.backup_id for u in scan.unreadable),
        )

    def _cluster_identity(self, index: ArchiveIndex) -> tuple[str | None, int | None]:
        """(system identifier, server_version_num): the server's, else the newest
        archived segment's header (the version as ``major * 10000``)."""
        try:
            server = self.adapter.describe()
        except PgsnapError as exc:
            log.info("rebuild: the server cannot be asked (%s); reading the archive", exc)
        else:
            return server.system_identifier, server.version_num
        seg = index.segment_size
        for tli in sorted(index.timelines(), reverse=True):
            ranges = index.ranges(tli)
            if not ranges:
                continue
            try:
                header = read_archived_segment_header(
                    self.archive, segment_name(tli, ranges[-1].last, seg)
                )
            except PgsnapError as exc:
                log.info("rebuild: %s", exc)
                return None, None
            major = header.major
            return str(header.system_identifier), None if major is None else major * 10000
        return None, None

    def snapshot_holds(self) -> tuple[SnapshotHold, ...]:
        """What the journals of runs that have not ended (interrupted, or running
        now) still need from the storage (:func:`~pgsnap.planner.reconcile.hold_of_journal`).

        A journal that cannot be read holds nothing but is logged: its run is
        resumed (or discarded) by hand, and ``pgsnap resume`` says why.
        """
        directory = self.journal_dir
        if directory is None or not directory.is_dir():
            return ()
        holds = []
        for path in sorted(directory.glob(f"*{JOURNAL_SUFFIX}")):
            try:
                view = read_journal(path)
            except (OSError, PgsnapError) as exc:
                log.warning("unreadable journal %s: what its run needs is not known: %s", path, exc)
                continue
            if view is None or view.state is not RunState.RUNNING:
                continue
            hold = hold_of_journal(
                {**view.plan, "id": view.plan_id},
                {k: r.outputs for k, r in view.steps.items()},
            )
            if hold is not None:
                holds.append(hold)
        return tuple(holds)

    def _timelines_from(self, timeline: int) -> tuple[int, ...]:
        """``timeline`` and the timelines after it whose ``.history`` the archive holds
        (probed upwards until two in a row are missing)."""
        found = [timeline]
        probe, misses = timeline + 1, 0
        while misses < 2:
            if self.archive.exists(f"{probe:08X}.history"):
                found.append(probe)
                misses = 0
            else:
                misses += 1
            probe += 1
        return tuple(found)

    def _listed_sysid_and_timelines(self, segment_size: int) -> tuple[str | None, tuple[int, ...]]:
        """The system identifier of the newest segment of the newest timeline, and every
        timeline, from a listing of the archive."""
        index = self.archive.index(segment_size, check_sizes=False)
        sysid = None
        for tli in sorted(index.timelines(), reverse=True):
            ranges = index.ranges(tli)
            if ranges:
                sysid = self._segment_sysid(segment_name(tli, ranges[-1].last, segment_size))
                break
        timelines = set(index.timelines()) | set(self._histories(index).timelines())
        return sysid, tuple(sorted(timelines))

    def _histories(self, index: ArchiveIndex) -> TimelineGraph:
        """The timeline graph of the history files the listing found (no second listing)."""
        return self.archive.histories(index.history_names)

    @property
    def host(self) -> Host:
        """The database host (the adapter's)."""
        return self.adapter.host

    def _volume_facts(self) -> tuple[VolumeFacts, ...]:
        """Where the host finds each snapshotted volume, how it is restored, what is mounted."""
        host = self.host
        mounts: tuple[Mount, ...] | None = None
        out = []
        for vol in self.layout.snapshotted:
            try:
                location = self.backend.locate(vol.id)
                profile = self.backend.restore_profile(vol.id)
            except VolumeNotFound:
                continue  # not on the storage: the planners say so, with the fix

            resolved: str | None = None
            mount: Mount | None = None
            if location.kind is LocationKind.DIRECTORY:
                resolved = host.realpath(location.path)
            else:
                if host.exists(location.path):
                    resolved = host.realpath(location.path)
                if mounts is None:
                    mounts = host.mounts()
                target = os.path.normpath(vol.mount_point)
                at = [m for m in mounts if os.path.normpath(m.target) == target]
                mount = at[-1] if at else None
            out.append(VolumeFacts(vol.id, location, profile, resolved, mount))
        return tuple(out)

    def _path_facts(self, server: ServerFacts) -> tuple[PathFacts, ...]:
        """The cluster's directories as the host resolves them, and the mounts holding them."""
        host = self.host
        paths = cluster_paths(server)
        if not paths:
            return ()
        # Three commands for all the paths (each is a round trip on a remote host).
        reals = host.realpaths([path for _, path in paths])
        if type(host).mount_of is Host.mount_of:
            mounts = host.mounts()
            holders = [mount_holding(real, mounts) for real in reals]
        else:  # a host that simulates mounts answers for itself
            holders = [host.mount_of(real) for real in reals]
        sources = sorted({m.source for m in holders if m is not None and m.source.startswith("/")})
        devices = dict(zip(sources, host.realpaths(sources), strict=True))
        return tuple(
            PathFacts(what, path, real, mount, None if mount is None else devices.get(mount.source))
            for (what, path), real, mount in zip(paths, reals, holders, strict=True)
        )

    def _segment_sysid(self, name: str) -> str | None:
        """The system identifier in the header of the archived file ``name`` (None
        when it is not there or cannot be read)."""
        try:
            if self.archive.stat(name) is None:
                return None
            return str(read_archived_segment_header(self.archive, name).system_identifier)
        except (ArchiveError, WalNameError) as exc:
            log.debug("system identifier of %s not read: %s", name, exc)
            return None

    def _segment_size(self, backups: Iterable[BackupRecord]) -> int:
        sizes = {b.wal_segment_size for b in backups}
        if len(sizes) == 1:
            return sizes.pop()
        try:
            return self.adapter.describe().wal_segment_size
        except PgsnapError:
            return max(sizes) if sizes else DEFAULT_SEGMENT_SIZE

    def _local_wal_dir(self, backups: Iterable[BackupRecord]) -> str | None:
        """The surviving pg_wal on the WAL volume, as the host resolves it.

        Looked for, in order: where the data directory's ``pg_wal`` link points
        (when the data directory survived), where ``pg_wal`` was at each backup
        (newest first; ``initdb --waldir`` may put it anywhere on the volume),
        then ``<mount point>/pg_wal`` and the mount point itself. Only a
        directory on the WAL volume counts.
        """
        wal = self.layout.wal
        if wal is None:
            return None
        host = self.host
        mount = host.realpath(wal.mount_point)
        candidates: list[str] = []
        data_directory = getattr(self.adapter, "data_directory", None)
        if isinstance(data_directory, str):
            candidates.append(posixpath.join(data_directory, "pg_wal"))
        for b in sorted(backups, key=lambda r: r.start_time, reverse=True):
            if b.wal_directory and b.wal_directory not in candidates:
                candidates.append(b.wal_directory)
        candidates += [posixpath.join(wal.mount_point, "pg_wal"), wal.mount_point]
        for candidate in candidates:
            info = host.stat(candidate)
            if info is None or info.kind is not FileKind.DIRECTORY:
                continue
            real = host.realpath(candidate)
            if real == mount or real.startswith(mount.rstrip("/") + "/"):
                return real
        return None

    def _surviving_segments(self, directory: str, segment_size: int) -> list[str] | None:
        """The names in the surviving pg_wal that hold WAL (None: no such directory)."""
        try:
            heads = self.host.read_heads(directory, 16)
        except HostFileNotFound:
            return None
        return [n for n, head in heads.items() if is_live_segment(n, head, segment_size)]

    def timeline_view(self) -> TimelineView:
        """What is recoverable (:mod:`pgsnap.timeline`): the catalog's backups and drills
        over the archive's segments and timelines, with the restore points the WAL
        index has seen. One listing of the archive; no WAL is read."""
        scan = scan_catalog(self.catalog)
        seg = self._segment_size(scan.records)
        index = self.archive.index(seg, check_sizes=False)
        graph = self._histories(index)
        points: tuple[tuple[LSN, str, int], ...] = ()
        sysids = {b.system_identifier for b in scan.records}
        if self.wal_index is not None and len(sysids) == 1:
            (sysid,) = sysids
            seen = self.wal_index.restore_points(sysid, seg)
            points = tuple((LSN(lsn), name, tli) for lsn, tli, name in seen)
        drills = getattr(self.catalog, "list_drills", None)
        return build_timeline(
            scan.records,
            index,
            graph,
            restore_points=points,
            drills=drills() if callable(drills) else (),
            now=self._now(),
        )

    def known_archive(self, segment_size: int) -> KnownArchive | None:
        """What is known of the archive between runs (:mod:`pgsnap.wal.known`): for a
        directory archive with a WAL index; None otherwise (it is listed)."""
        if self.wal_index is None or not isinstance(self.archive, DirectoryWalArchive):
            return None
        return KnownArchive(self.wal_index.path, self.archive, segment_size)

    def _listed(self, segment_size: int) -> ArchiveIndex:
        """One listing of the archive, names only (no stat of each file: the reader
        checks the sizes of the segments it reads), kept as what is known of it."""
        index = self.archive.index(segment_size, check_sizes=False)
        known = self.known_archive(segment_size)
        if known is not None:
            known.save(index)
        return index

    def confirm_archive(self, facts: RecoveryFacts, backup_id: str) -> str | None:
        """Confirm the archive a plan from ``facts`` (made without listing it) rests on,
        from backup ``backup_id``'s first segment on (:meth:`KnownArchive.confirm`).
        None when it holds; else why not: list the archive and plan again."""
        record = next((b for b in facts.backups if b.id == backup_id), None)
        seg = facts.archive.segment_size
        known = self.known_archive(seg)
        if record is None or known is None:
            return f"backup {backup_id!r} cannot be confirmed by name"
        start = record.start_lsn.value // seg
        why = known.confirm(facts.archive, record.start_timeline, start)
        if why is None:
            known.save(facts.archive)  # the next plan probes from here
        return why

    @_one_listing
    def recovery_facts(
        self,
        request: RecoveryRequest | None = None,
        *,
        read_wal: bool = True,
        by_name: bool = False,
        backups: tuple[BackupRecord, ...] | None = None,
    ) -> RecoveryFacts:
        """Observe what the recovery planner needs; reads WAL commit times when it can
        (and ``read_wal``: without, ``events`` is None).

        ``by_name``: when the archive's state is known from an earlier run, probe it
        by name instead of listing it (``facts.archive_by_name`` is then set): the
        plan made from these facts must be confirmed by :meth:`confirm_archive`.
        ``backups``: the catalog's records, when this command has read them already
        (a command reads the catalog once); None reads them.
        """
        request = request or RecoveryRequest()
        if backups is None:
            backups = self.catalog.list()
        seg = self._segment_size(backups)
        index = None
        known = self.known_archive(seg) if by_name else None
        if known is not None:
            index = known.probed()
        probed = index is not None
        if index is None:
            index = self._listed(seg)
        merged = None
        local_dir = self._local_wal_dir(backups)
        local = None if local_dir is None else self._surviving_segments(local_dir, seg)
        if local is not None:
            merged = index.merged(ArchiveIndex.build(local, seg))
        graph = self._histories(index)
        server = None
        try:
            if self.adapter.is_running():
                server = self.adapter.describe()
        except PgsnapError as exc:
            log.debug("server not described: %s", exc)
        caps = self.backend.capabilities
        facts = RecoveryFacts(
            layout=self.layout,
            backups=backups,
            snapshots=self.backend.list_snapshots(),
            policies=self.backend.list_policies() if Capability.POLICIES in caps else (),
            capabilities=caps,
            archive=index,
            timelines=graph,
            archive_location=self.archive.location,
            now=self._now(),
            server=server,
            archive_with_local_wal=merged,
            host=self.host.name,
            volume_facts=self._volume_facts(),
            archive_by_name=probed,
        )
        configured = getattr(self.adapter, "data_directory", None)
        data_directory = (
            configured
            if isinstance(configured, str)
            else (server.data_directory if server is not None else "")
        )
        facts = facts.evolve(
            data_directory=data_directory,
            copies=self._copies_found(backups),
            copy_options=self.copy_options,
            copy_key_file=self.copy_key_file,
        )
        facts = facts.evolve(damaged=self._damaged_segments(facts, request))
        if not read_wal:
            return facts
        events = self._scan_events(facts, request, local_dir)
        return facts.evolve(events=events)

    def _copies_found(self, backups: Iterable[BackupRecord]) -> frozenset[tuple[str, str]]:
        """``(target, copy id)`` of the DONE backups' copies whose manifests are in their
        targets: one listing per target. A target that cannot be read is logged and
        its copies left out (the planner then says they were not found)."""
        wanted: dict[str, set[str]] = {}
        for b in backups:
            if b.is_usable:
                for c in b.copies:
                    wanted.setdefault(c.target, set()).add(c.copy_id)
        found: set[tuple[str, str]] = set()
        for location, ids in sorted(wanted.items()):
            options = self.copy_options if location.startswith("s3://") else {}
            try:
                listed = set(open_target(location, options).manifest_ids())
            except PgsnapError as exc:
                log.warning("copy target %s cannot be listed: %s", location, exc)
                continue
            found.update((location, i) for i in ids & listed)
        return frozenset(found)

    def _damaged_segments(self, facts: RecoveryFacts, request: RecoveryRequest) -> dict[str, str]:
        """The archived segments a recovery from the best candidate backup would fetch
        (from its start to the end of the archive) that cannot be replayed, with why
        (:func:`~pgsnap.wal.reader.segment_problem`). Each costs a stat and a 40-byte
        read; the executor checks them again before the point of no return."""
        first = next(_judged_lazily(iter_candidates(facts, request, [])), None)
        if first is None:
            return {}
        b = first.backup
        try:
            reach = check(
                facts.archive,
                (b.start_timeline, b.start_lsn),
                None,
                first.timeline,
                facts.timelines,
            )
        except PgsnapError as exc:
            log.debug("segments of backup %s not verified: %s", b.id, exc)
            return {}
        damaged: dict[str, str] = {}
        seg = facts.archive.segment_size
        index = self.wal_index
        known = {} if index is None else index.verified(b.system_identifier, seg)
        whole: dict[str, tuple[int, int]] = {}
        for name in segments_to_replay(facts.archive, reach):
            found = find_segment(self.archive, name)
            if found is None:
                continue
            identity = found.identity
            if known.get(name) == identity:
                continue  # found whole before, and the file did not change since
            why = archived_segment_problem(
                self.archive,
                found,
                segment_size=seg,
                system_identifier=b.system_identifier,
                major=b.server_version // 10000,
            )
            if why is not None:
                log.warning("archived segment %s cannot be replayed: %s", name, why)
                damaged[name] = why
            else:
                whole[name] = identity
        if index is not None and whole:
            try:
                index.note_verified(b.system_identifier, seg, whole)
            except OSError as exc:  # a cache: planning goes on without it
                log.warning("cannot remember verified segments in %s: %s", index.path, exc)
        return damaged

    def _scan_events(
        self, facts: RecoveryFacts, request: RecoveryRequest, local_dir: str | None
    ) -> WalEvents | None:
        usable = [b for b in facts.backups if b.is_usable and b.stop_lsn is not None]
        if not usable:
            return None
        major = usable[-1].server_version // 10000
        newest = usable[-1]
        scanner = self._scanner(major, newest.system_identifier, newest.wal_segment_size)
        if scanner is None:
            return None
        keep_wal = VolumeRole.WAL not in request.lost and facts.archive_with_local_wal is not None
        index = (
            facts.archive_with_local_wal
            if keep_wal and facts.archive_with_local_wal
            else facts.archive
        )
        candidates = _judged_lazily(iter_candidates(facts, request, []))
        sources: list[WalSource] = [self.archive]
        if keep_wal and local_dir is not None and isinstance(self.host.runner, LocalRunner):
            # The WAL is read here: a surviving pg_wal only when it is on this machine.
            sources.append(local_dir)
        return self._scan_candidates(scanner, sources, facts, request, index, candidates)

    def index_wal(
        self, progress: Callable[[str, Mapping[str, Any]], None] | None = None
    ) -> WalIndexRun:
        """Read into the WAL index the archived WAL a recovery from the newest usable
        backup reads: from its start to the end of the archive, along the timeline a
        recovery to the latest point follows. A later plan of a time, xid or
        restore-point target then finds those segments there and reads only the one
        that holds its target. Segments already indexed are not read again.
        ``progress`` is told how far it got after each stretch of segments."""
        if self.wal_index is None:
            raise ConfigurationError(
                "this cluster keeps no WAL index ([catalog] wal_index = false)",
                hint="set [catalog] wal_index (default: wal-index in the catalog directory)",
            )
        request = RecoveryRequest(lost=frozenset({VolumeRole.DATA, VolumeRole.WAL}))
        facts = self.recovery_facts(request, read_wal=False)
        usable = [b for b in facts.backups if b.is_usable and b.stop_lsn is not None]
        if not usable:
            return WalIndexRun()
        newest = usable[-1]
        seg = facts.archive.segment_size
        cand = next(iter(iter_candidates(facts, request, [])), None)
        if cand is None:
            return WalIndexRun(backup_id=newest.id)
        b = cand.backup
        reach = check(
            facts.archive, (b.start_timeline, b.start_lsn), None, cand.timeline, facts.timelines
        )
        run = WalIndexRun(
            backup_id=b.id, timeline=cand.timeline, start=b.start_lsn, end=reach.reachable_lsn
        )
        at = segment_start(b.start_lsn.value // seg, seg)  # whole segments are indexed
        while at < reach.reachable_lsn:
            upto = min(reach.reachable_lsn, segment_start(at.value // seg + _INDEX_STRETCH, seg))
            found = read_events(
                [self.archive],
                reach.path,
                at,
                upto,
                segment_size=seg,
                system_identifier=b.system_identifier,
                major=b.server_version // 10000,
                index=self.wal_index,
            )
            run = attrs.evolve(
                run,
                read=run.read + found.read,
                indexed=run.indexed + found.indexed,
                added=run.added + found.added,
            )
            if progress is not None:
                progress(
                    f"WAL indexed to {upto} of {reach.reachable_lsn} ({run.read} segments "
                    f"read, {run.indexed} already indexed)",
                    {"lsn": str(upto), "end": str(reach.reachable_lsn), "read": run.read},
                )
            at = upto
        log.info(
            "WAL index: %d segments read, %d already indexed, from backup %s to %s",
            run.read,
            run.indexed,
            b.id,
            reach.reachable_lsn,
        )
        return run

    def _scanner(self, major: int, system_identifier: str, segment_size: int) -> _Scanner | None:
        """What reads the WAL: pgsnap's own reader, or the ``pg_waldump`` given (which
        reads directories: only for an archive that is one, a
        :class:`~pgsnap.protocols.LocalWalArchive`)."""
        archive = self.archive
        if self.waldump is not None and not isinstance(archive, LocalWalArchive):
            log.warning(
                "pg_waldump reads directories and the archive %s is not one: its WAL is "
                "read with pgsnap's own reader",
                archive.location,
            )
        if self.waldump is None or not isinstance(archive, LocalWalArchive):
            wal_index = self.wal_index

            def read(
                dirs: list[WalSource],
                path: tuple[TimelineSpan, ...],
                lo: LSN,
                hi: LSN,
                query: WalQuery,
                budget: int,
            ) -> tuple[WalEvents, int]:
                found = read_events(
                    dirs,
                    path,
                    lo,
                    hi,
                    segment_size=segment_size,
                    system_identifier=system_identifier,
                    major=major,
                    query=query,
                    index=wal_index,
                    max_read=budget,
                )
                log.debug(
                    "WAL %s..%s: %d segments read, %d from the index (%d indexed now)",
                    lo,
                    hi,
                    found.read,
                    found.indexed,
                    found.added,
                )
                return found.events, found.read

            return read
        waldump = self.waldump
        try:
            out = subprocess.run(
                [str(waldump), "--version"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
        except OSError as exc:
            log.warning("pg_waldump %s cannot run (%s): WAL not scanned", waldump, exc)
            return None
        if f" {major}." not in out and f" {major}" not in out.split("(")[-1]:
            log.warning(
                "pg_waldump (%s) does not match PostgreSQL %s: WAL not scanned", out.strip(), major
            )
            return None

        archive_dir = archive.path

        def dump(
            dirs: list[WalSource],
            path: tuple[TimelineSpan, ...],
            lo: LSN,
            hi: LSN,
            query: WalQuery,
            budget: int,
        ) -> tuple[WalEvents, int]:
            del query  # pg_waldump reports every commit
            first = lo
            limit = budget * segment_size
            if hi - lo > limit:  # the newest WAL within the budget
                first = segment_start((hi.value - limit) // segment_size, segment_size)
            # pg_waldump reads directories: the archive's own, then a surviving pg_wal.
            paths = [d if isinstance(d, str | os.PathLike) else archive_dir for d in dirs]
            found = scan_wal(waldump, paths, path, first, hi)
            if first != lo:
                found = attrs.evolve(found, complete=False)
            return found, max(1, (hi - first + segment_size - 1) // segment_size)

        return dump

    def _scan_candidates(
        self,
        scan: _Scanner,
        dirs: list[WalSource],
        facts: RecoveryFacts,
        request: RecoveryRequest,
        index: ArchiveIndex,
        candidates: Iterable[Candidate],
    ) -> WalEvents | None:
        """Scan the WAL each candidate backup reaches, best candidate first.

        A time, LSN, latest or immediate target is served by the first
        candidate: only its stretch is read. An xid or a restore point cannot be
        placed before it is found: stretches of older candidates are read until
        it is found after a candidate's consistency point. At most
        ``max_scan_segments`` segments in all (the newest of each stretch).
        """
        target = request.target
        events: WalEvents | None = None
        budget = self.max_scan_segments
        complete = True
        for cand in candidates:
            b = cand.backup
            assert b.stop_lsn is not None
            try:
                reach = check(
                    index, (b.start_timeline, b.start_lsn), None, cand.timeline, facts.timelines
                )
            except PgsnapError as exc:
                log.debug("no WAL scan from backup %s: %s", b.id, exc)
                complete = False
                continue
            todo = (
                [(b.start_lsn, reach.reachable_lsn)]
                if events is None
                else list(events.uncovered(b.start_lsn, reach.reachable_lsn))
            )
            # The last commit before where each timeline of the path ends and before
            # the end of the reachable WAL: the planner states those as times.
            query = WalQuery.for_target(
                target, [*(s.end for s in reach.path if s.end is not None), reach.reachable_lsn]
            )
            if target.kind is TargetKind.TIME and isinstance(target.value, dt.datetime):
                # Forward from the backup, until the first commit after the time:
                # the WAL after it does not change the plan (what it costs does not
                # grow with the archive after the target).
                events, budget, ok = self._scan_forward(
                    scan,
                    dirs,
                    reach.path,
                    todo,
                    query,
                    budget,
                    target.value,
                    events,
                    index.segment_size,
                )
                complete = complete and ok
                unread = bool(todo) and (
                    events is None
                    or (events.end_of_wal is None and bool(events.uncovered(*todo[-1])))
                )
                if len(dirs) > 1 and unread and budget > 0:
                    # A surviving pg_wal may end before its last file does: read its
                    # end too, so the plan says where the valid WAL ends.
                    lo, hi = _tail(*todo[-1], index.segment_size)
                    found, used = scan(dirs, reach.path, lo, hi, query, budget)
                    budget -= used
                    events = found if events is None else events.merge(found)
                break
            if target.kind in (TargetKind.LATEST, TargetKind.IMMEDIATE) and todo:
                # Replay runs to the end whatever lies before it: only the newest
                # segments are read (where the valid WAL ends, the last commit).
                todo = [_tail(*todo[-1], index.segment_size)]
            for lo, hi in reversed(todo):  # the newest WAL first
                if budget <= 0:
                    complete = False
                    break
                found, used = scan(dirs, reach.path, lo, hi, query, budget)
                budget -= used
                complete = complete and found.complete
                events = found if events is None else events.merge(found)
            if target.kind not in (TargetKind.XID, TargetKind.NAME):
                break
            lsn = _located(events, target)
            if lsn is not None and lsn > b.stop_lsn:
                break
        if events is None:
            return None
        return attrs.evolve(events, complete=complete and events.complete)

    @staticmethod
    def _scan_forward(
        scan: _Scanner,
        dirs: list[WalSource],
        path: tuple[TimelineSpan, ...],
        todo: list[tuple[LSN, LSN]],
        query: WalQuery,
        budget: int,
        when: dt.datetime,
        events: WalEvents | None,
        seg: int,
    ) -> tuple[WalEvents | None, int, bool]:
        """Read ``todo`` oldest first, in growing windows, until a commit after
        ``when`` is seen (or the budget ends: then incomplete).

        A window never holds more segments than the budget has left (the oldest
        WAL is wanted: a cut read would keep the newest), and each starts two
        segments before the last one ended, so that its last segments, read
        there only to finish its records, are read whole once and indexed."""
        complete = True
        for lo, hi in todo:
            at, window = lo, _FIRST_WINDOW
            while at < hi:
                if budget <= 0:
                    return events, budget, False
                size = max(1, min(window, budget))
                upto = min(hi, segment_start(at.value // seg + size, seg))
                found, used = scan(dirs, path, at, upto, query, budget)
                budget -= used
                complete = complete and found.complete
                events = found if events is None else events.merge(found)
                if found.first_commit_after(when) is not None or not found.complete:
                    return events, budget, complete
                if found.end_of_wal is not None:
                    return events, budget, complete
                at, window = LSN(max(upto.value - 2 * seg, at.value + seg)), window * 2
        return events, budget, complete


_TAIL: Final = 3
"""Segments before the last one read for a 'latest' or 'immediate' target."""

_FIRST_WINDOW: Final = 8
"""Forward reads go in windows of 8, 16, 32... segments."""


def _tail(lo: LSN, hi: LSN, seg: int) -> tuple[LSN, LSN]:
    """The end of the stretch ``[lo, hi)``: its last segment and the ``_TAIL`` before it."""
    return max(lo, segment_start(max(0, (hi.value - 1) // seg - _TAIL), seg)), hi


def _located(events: WalEvents | None, target: RecoveryTarget) -> LSN | None:
    """Where an xid's commit or a restore point is, once a scan has seen it."""
    if events is None:
        return None
    if target.kind is TargetKind.XID and isinstance(target.value, int):
        return events.commit_of(target.value)
    if target.kind is TargetKind.NAME and isinstance(target.value, str):
        return events.restore_point(target.value)
    return None
