"""The four seams of pgsnap, as :class:`typing.Protocol` classes.

Implementations do not inherit from these: anything with the right methods
fits. Each method's docstring is its contract: what it guarantees and which
:mod:`pgsnap.errors` it raises. The conformance suite in
:mod:`pgsnap.testing.conformance` is what "implements StorageBackend" means.

- :class:`StorageBackend`: volumes, consistency-group snapshots, restore,
  where a host finds a volume, attach and detach, clones, snapshot policies;
  optionally :class:`StorageHealth`: problems the storage can see coming
  (a snapshot limit near, an invalid snapshot), reported by ``pgsnap check``.
- :class:`DatabaseAdapter` and :class:`BackupSession`: the PostgreSQL server;
  :class:`PrimaryServer`: the primary of a standby pgsnap backs up.
- :class:`WalArchive`: where archived WAL lives, used only through its
  methods (:mod:`pgsnap.testing.wal_conformance` is what implementing it
  means); optionally :class:`WalArchiveDeletion` (retention removes files)
  and :class:`LocalWalArchive` (a local directory, for ``pg_waldump``).
- :class:`Catalog`: where backup records live.
- :class:`Runner`: how commands reach the database host (locally, over ssh,
  on a test VM's console); :class:`pgsnap.host.Host` builds files, processes
  and mounts on it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from pgsnap.host.runners import Runner

if TYPE_CHECKING:
    from pgsnap.host import Host
    from pgsnap.locks import ClusterLock
    from pgsnap.model import (
        ArchiverStatus,
        BackupRecord,
        BackupStart,
        BackupStop,
        CheckpointState,
        CloneRecord,
        DrillRecord,
        Location,
        RecoverySettings,
        RestoreProfile,
        SafetySnapshot,
        ServerFacts,
        Snapshot,
        SnapshotAccess,
        SnapshotGroup,
        SnapshotPolicy,
        StorageProblem,
        StorageVolume,
    )
    from pgsnap.wal import ArchiveIndex, TimelineGraph
    from pgsnap.wal.files import ArchivedFile, ReadStream

__all__ = [
    "STORAGE_BACKEND_METHODS",
    "BackupSession",
    "Capability",
    "Catalog",
    "CloneServer",
    "ClusterLockProvider",
    "DatabaseAdapter",
    "DeletableClones",
    "ExposableSnapshots",
    "LocalWalArchive",
    "PrimaryServer",
    "ReadableSnapshots",
    "RecoveryOutcome",
    "Runner",
    "ServerInstances",
    "StorageBackend",
    "StorageHealth",
    "WalArchive",
    "WalArchiveDeletion",
]


STORAGE_BACKEND_METHODS: Final = (
    "list_volumes",
    "get_volume",
    "list_snapshots",
    "create_snapshot_group",
    "get_snapshot_group",
    "delete_snapshot",
    "delete_snapshot_group",
    "restore_volume",
    "restore_profile",
    "wait_for_restore",
    "locate",
    "attach",
    "detach",
    "clone_snapshot",
    "list_policies",
    "pause_policy",
    "resume_policy",
)
"""The methods every :class:`StorageBackend` defines (the registry checks them)."""


class Capability(enum.Enum):
    """What a storage backend can do; the planner reads these, never guesses."""

    CONSISTENCY_GROUPS = "consistency_groups"
    """Snapshots of several volumes are taken at one instant in one call."""
    POLICIES = "policies"
    """The storage runs snapshot schedules that can be paused and resumed."""
    MAPPING = "mapping"
    """Volumes are attached to hosts and detached from them (PowerFlex maps a volume
    to an SDC, LVM activates it); without it :meth:`StorageBackend.attach` and
    :meth:`StorageBackend.detach` are refused."""
    SECURE_SNAPSHOTS = "secure_snapshots"
    """Snapshots can be protected against deletion for a retention period."""
    CLONES = "clones"
    """A snapshot can be turned into a new writable volume."""


class StorageBackend(Protocol):
    """A storage system holding the cluster's volumes.

    Errors: every method raises :class:`~pgsnap.errors.BackendError` (or a
    subclass) on failure, never a library's own exception;
    :class:`~pgsnap.errors.VolumeNotFound` / :class:`~pgsnap.errors.SnapshotNotFound`
    for unknown ids; :class:`~pgsnap.errors.UnsupportedCapability` when asked
    for something :attr:`capabilities` does not list;
    :class:`~pgsnap.errors.BackendUnavailable` when retrying may help.
    """

    @property
    def name(self) -> str:
        """The backend's registered name (``"mock"``, ``"powerflex"``...)."""
        ...

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What this backend supports."""
        ...

    def list_volumes(self) -> tuple[StorageVolume, ...]:
        """Every volume the backend can see, sorted by id."""
        ...

    def get_volume(self, volume_id: str) -> StorageVolume:
        """One volume; ``VolumeNotFound`` if it does not exist."""
        ...

    def list_snapshots(self, volume_id: str | None = None) -> tuple[Snapshot, ...]:
        """Snapshots (of one volume, or all), oldest first.

        ``VolumeNotFound`` if ``volume_id`` is given and does not exist.
        """
        ...

    def create_snapshot_group(
        self, volume_ids: Sequence[str], name: str, *, secure: bool = False
    ) -> SnapshotGroup:
        """Snapshot ``volume_ids`` together, all or nothing.

        With ``CONSISTENCY_GROUPS`` the snapshots share one instant. If any
        volume cannot be snapshotted, no snapshot is left behind and the error
        says which volume. ``secure`` needs ``SECURE_SNAPSHOTS``.
        """
        ...

    def get_snapshot_group(self, group_id: str) -> SnapshotGroup:
        """A group by id; ``SnapshotNotFound`` if it does not exist (any more)."""
        ...

    def delete_snapshot(self, snapshot_id: str) -> None:
        """Delete one snapshot; ``SnapshotNotFound`` if it does not exist."""
        ...

    def delete_snapshot_group(self, group_id: str) -> None:
        """Delete every snapshot of a group; ``SnapshotNotFound`` if unknown."""
        ...

    def restore_volume(self, volume_id: str, snapshot_id: str) -> None:
        """Replace the volume's content with the snapshot's.

        The snapshot must be of this volume. The caller has done what
        :meth:`restore_profile` asks first (server stopped, file system
        unmounted, volume detached); a backend refuses with
        :class:`~pgsnap.errors.BackendError` when the volume is still in use
        in a way it can tell (attached where it must not be). The snapshot
        stays unless the profile says the restore consumes it.
        """
        ...

    def restore_profile(self, volume_id: str) -> RestoreProfile:
        """What a restore of ``volume_id`` needs from the host and what it costs.

        Read by the recovery planner as data: unmount or detach first, whether
        the snapshot is consumed, whether the restore completes later.
        ``VolumeNotFound`` for an unknown volume.
        """
        ...

    def wait_for_restore(self, volume_id: str, *, timeout: float) -> None:
        """Return once a restore of ``volume_id`` has completed.

        Returns at once when the restore was synchronous. ``BackendError``
        when it failed or did not complete within ``timeout`` seconds.
        """
        ...

    def locate(self, volume_id: str) -> Location:
        """How a host finds the volume: a directory, or a device node.

        A device may appear only while the volume is attached. Pure lookup:
        nothing on the host is checked. ``VolumeNotFound`` for an unknown volume.
        """
        ...

    def attach(self, volume_id: str, host: str) -> None:
        """Make the volume visible to ``host`` (the storage's name for it); idempotent.

        Needs ``MAPPING`` (``UnsupportedCapability`` otherwise).
        """
        ...

    def detach(self, volume_id: str, host: str) -> None:
        """Hide the volume from ``host``; idempotent. Needs ``MAPPING``.

        The caller unmounts the file system first.
        """
        ...

    def clone_snapshot(self, snapshot_id: str, name: str) -> StorageVolume:
        """A new writable volume with the snapshot's content (needs ``CLONES``).

        The clone does not depend on the snapshot: deleting the snapshot later (the
        backup expires) leaves the clone and its content intact, so a clone, or a
        standby seeded from one, outlives its backup."""
        ...

    def list_policies(self) -> tuple[SnapshotPolicy, ...]:
        """Snapshot policies (needs ``POLICIES``; empty tuple otherwise)."""
        ...

    def pause_policy(self, policy_id: str) -> None:
        """Stop a policy from taking or rotating snapshots; idempotent."""
        ...

    def resume_policy(self, policy_id: str) -> None:
        """Let a paused policy run again; idempotent."""
        ...


@runtime_checkable
class ReadableSnapshots(Protocol):
    """Optional for a :class:`StorageBackend`: its snapshots can be read in place,
    without touching their origins, for a copy off the array (``pgsnap copy``).

    ``isinstance(backend, ReadableSnapshots)`` tells. The mock (directory
    volumes) and btrfs (read-only snapshot subvolumes) have it; LVM and
    PowerFlex, whose snapshots must first be activated or mapped and mounted,
    have :class:`ExposableSnapshots` instead.
    """

    def snapshot_access(self, snapshot_id: str) -> SnapshotAccess:
        """Where the snapshot's tree can be read on the database host.
        :class:`~pgsnap.errors.SnapshotNotFound` if it is gone;
        :class:`~pgsnap.errors.UnsupportedCapability` for one that cannot be
        read in place (an in-memory or block-device snapshot)."""
        ...


@runtime_checkable
class ExposableSnapshots(Protocol):
    """Optional for a :class:`StorageBackend`: its snapshots are block devices that
    are read by exposing them on a host and mounting them read-only there, for a
    copy off the array (``pgsnap copy``), without touching their origins.

    ``isinstance(backend, ExposableSnapshots)`` tells (as for
    :class:`ReadableSnapshots`, the protocol is the declaration). LVM activates
    the snapshot on its own host (a thin snapshot skips activation otherwise);
    PowerFlex maps the snapshot volume read-only to the host's SDC. The copy
    planner builds expose → mount read-only → send → unmount → conceal from
    it, naming no backend; the mount options come from
    :func:`pgsnap.host.readonly.read_only_mount_options`.
    """

    def expose_snapshot(self, snapshot_id: str, host: str) -> Location:
        """Make the snapshot's block device visible on ``host`` (the storage's name
        for it, as :meth:`StorageBackend.attach` takes) and return where that host
        finds it (a device node, which may take a moment to appear). Idempotent;
        never changes the snapshot's origin volume or its mappings.
        :class:`~pgsnap.errors.SnapshotNotFound` if it is gone;
        :class:`~pgsnap.errors.BackendError` for a host that cannot see it."""
        ...

    def conceal_snapshot(self, snapshot_id: str, host: str) -> None:
        """Undo :meth:`expose_snapshot` (the caller unmounts first). Idempotent: a
        snapshot not exposed there, or gone, is fine."""
        ...


@runtime_checkable
class DeletableClones(Protocol):
    """Optional for a :class:`StorageBackend` with ``CLONES``: the volumes it made with
    :meth:`StorageBackend.clone_snapshot` can be deleted again (``pgsnap clone
    destroy``). ``isinstance(backend, DeletableClones)`` tells.
    """

    def delete_clone(self, volume_id: str) -> None:
        """Delete the clone volume ``volume_id`` (the caller detaches and unmounts it
        first). Idempotent: a clone already gone is fine. A volume that this backend
        cannot tell is a clone is refused with
        :class:`~pgsnap.errors.BackendError`: an origin is never deleted."""
        ...


@runtime_checkable
class StorageHealth(Protocol):
    """Optional for a :class:`StorageBackend`: what is wrong with the storage
    before a backup or a restore fails on it.

    A backend that has ``storage_problems`` is asked by ``Cluster.check()``
    (``pgsnap check``), and each :class:`~pgsnap.model.StorageProblem` becomes
    a finding with the problem's code; a backend without it reports nothing
    (``isinstance(backend, StorageHealth)`` tells). pgsnap's backends report a
    snapshot tree near its snapshot limit (mock, PowerFlex), and invalid,
    filling or left-over snapshots and filling thin pools (LVM).
    """

    def storage_problems(
        self, volume_ids: Sequence[str] | None = None
    ) -> tuple[StorageProblem, ...]:
        """The problems the storage has now, worst first (empty: none).

        ``volume_ids``: only problems concerning these volumes and their
        snapshots (a cluster passes the volumes it snapshots); None: every
        volume the backend sees. Read-only and quick (one listing); an
        unknown volume id is skipped, not an error. Raises
        :class:`~pgsnap.errors.BackendError` when the storage cannot be
        asked (a check reports that as a finding too).
        """
        ...


class BackupSession(Protocol):
    """Backup mode on one dedicated database session.

    Use as a context manager: leaving the block closes the session, and a
    backup still running is aborted by the server (never left in backup mode).
    """

    def start(self, label: str, *, fast: bool = True) -> BackupStart:
        """Enter backup mode (``pg_backup_start`` / ``pg_start_backup(.., false)``).

        ``BackupModeError`` if the server refuses (a backup already running in
        this session, ``wal_level`` too low...).
        """
        ...

    def stop(self) -> BackupStop:
        """Leave backup mode without waiting for the archive.

        Returns the label and tablespace map; ``BackupModeError`` if the
        session was lost (the server has then aborted the backup).
        """
        ...

    def close(self) -> None:
        """Close the session (aborting a running backup); idempotent."""
        ...

    def __enter__(self) -> BackupSession: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class RecoveryOutcome(Protocol):
    """What the server did at the end of a recovery (see the adapter)."""

    @property
    def reached_target(self) -> bool:
        """The server logged that it stopped at (or after) the target."""
        ...

    @property
    def timeline(self) -> int:
        """The timeline the server is on afterwards."""
        ...

    @property
    def state(self) -> str:
        """``"promoted"``, ``"paused"`` or ``"shutdown"``."""
        ...

    @property
    def log_lines(self) -> tuple[str, ...]:
        """The server's log lines about the recovery (where it stopped, new timeline)."""
        ...


class DatabaseAdapter(Protocol):
    """One PostgreSQL cluster: observe it, put it in backup mode, stop, start, recover.

    Errors: :class:`~pgsnap.errors.DatabaseError` (with ``sqlstate`` when the
    server gave one) or :class:`~pgsnap.errors.HostError` (the host's files and
    commands); never a driver exception.
    """

    @property
    def host(self) -> Host:
        """The database host: where the server's files, processes and mounts are."""
        ...

    def describe(self) -> ServerFacts:
        """Version, system identifier, directories, settings, timeline, checkpoint."""
        ...

    def archiver_status(self) -> ArchiverStatus:
        """The ``pg_stat_archiver`` row and the archiving settings."""
        ...

    def checkpoint_state(self) -> CheckpointState:
        """The last checkpoint (or restartpoint) and the settings that schedule the next."""
        ...

    def backup_session(self) -> BackupSession:
        """A new dedicated session for backup mode (not yet in backup mode)."""
        ...

    def is_running(self) -> bool:
        """True when the server accepts connections."""
        ...

    def stop_server(self, *, timeout: float = 120.0) -> None:
        """Stop the server (fast shutdown) and wait; no-op when already stopped."""
        ...

    def start_server(self, *, timeout: float = 120.0) -> None:
        """Start the server and return once the postmaster is up (it may still recover)."""
        ...

    def wait_recovery(
        self,
        *,
        timeout: float = 600.0,
        on_progress: Callable[[str, Mapping[str, object]], None] | None = None,
    ) -> RecoveryOutcome:
        """Wait until recovery ends (promoted, paused or shut down) and say how.

        ``on_progress(message, data)`` is called as replay moves (the replay LSN,
        segments restored). A server that is up but refuses the connection
        (authentication, ``pg_hba.conf``, no free slot) is
        :class:`~pgsnap.errors.ServerRefusedError` at once, not a timeout.
        """
        ...

    def write_recovery_settings(self, settings: RecoverySettings) -> None:
        """Write the settings and ``recovery.signal``, replacing stale targets."""
        ...

    def clear_recovery_settings(self) -> None:
        """Remove what :meth:`write_recovery_settings` wrote; idempotent."""
        ...

    def prepare_data_directory(self, *, clear_wal: bool) -> tuple[str, ...]:
        """Clean a restored data directory (server stopped); return what was removed.

        Removes ``postmaster.pid``, ``postmaster.opts``, ``pg_replslot/*`` and
        temporary state; with ``clear_wal`` also the files in ``pg_wal``.
        """
        ...

    def write_backup_label(self, labelfile: str, spcmapfile: str) -> None:
        """Write ``backup_label`` (and ``tablespace_map`` if non-empty) byte for byte."""
        ...

    def stored_system_identifier(self) -> str | None:
        """The system identifier in the data directory's ``global/pg_control`` (the
        server need not run; None when the data directory holds no ``pg_control``)."""
        ...

    def recovery_ended(self) -> bool | None:
        """Whether the server has left recovery since it was started for one
        (promoted, or shut down at its target): True, False (still recovering, or
        it failed), None (cannot tell). Reads the server log; needs no connection."""
        ...


class CloneServer(DatabaseAdapter, Protocol):
    """A clone's PostgreSQL instance (:meth:`ServerInstances.instance`): a
    :class:`DatabaseAdapter` on the clone's data directory, and what a clone needs
    beyond it."""

    def query(
        self, sql: str, params: Sequence[Any] = (), *, dbname: str | None = None
    ) -> list[tuple[Any, ...]]:
        """Run ``sql`` (autocommit, ``params`` for its ``%s``) and return its rows."""
        ...

    def prepare_clone_directory(self, tablespaces: Mapping[str, str]) -> tuple[str, ...]:
        """Make the cloned data directory its own: ``pg_wal`` a new empty directory,
        the ``pg_tblspc`` links pointed at the clone's tablespaces (oid → path), then
        cleaned as :meth:`DatabaseAdapter.prepare_data_directory`."""
        ...

    def write_instance_settings(self, parameters: Mapping[str, str]) -> None:
        """Set ``parameters`` in ``postgresql.auto.conf``, after every other line."""
        ...

    def write_standby_settings(self, parameters: Mapping[str, str]) -> None:
        """Set ``parameters`` as :meth:`write_instance_settings` does, and make the
        instance start as a standby (``standby.signal``, no ``recovery.signal``)."""
        ...


@runtime_checkable
class PrimaryServer(Protocol):
    """The primary a standby streams from, as pgsnap reaches it for a backup taken on
    the standby (``Cluster(primary=...)``, ``[primary]``): checked when planning, asked
    to switch WAL so the backup's last segment is archived at once. A
    :class:`~pgsnap.adapters.postgres.PostgresAdapter` on the primary fits."""

    def describe(self) -> ServerFacts:
        """As :meth:`DatabaseAdapter.describe`."""
        ...

    def archiver_status(self) -> ArchiverStatus:
        """As :meth:`DatabaseAdapter.archiver_status`."""
        ...

    def query(
        self, sql: str, params: Sequence[Any] = (), *, dbname: str | None = None
    ) -> list[tuple[Any, ...]]:
        """Run ``sql`` (autocommit, ``params`` for its ``%s``) and return its rows."""
        ...


@runtime_checkable
class ServerInstances(Protocol):
    """Optional for a :class:`DatabaseAdapter`: it can drive another instance of the
    same PostgreSQL on the same host (a clone's, a drill's)."""

    def instance(
        self,
        *,
        data_directory: str,
        port: int,
        socket_directory: str,
        log_file: str | None = None,
        host: Host | None = None,
    ) -> CloneServer:
        """The adapter of the instance on ``data_directory`` on ``host`` (default: the
        database host), logging to ``log_file``, reached on ``port``: through the Unix
        socket in ``socket_directory`` when pgsnap is on its machine, else over TCP
        (see :meth:`instance_listen_addresses`)."""
        ...

    def instance_listen_addresses(self, host: Host | None = None) -> str:
        """What another instance (on ``host``, default: the database host) must listen
        on for :meth:`instance` to reach it: ``""`` (its Unix socket only) when it is
        reached through its socket, else the addresses to listen on."""
        ...


class WalArchive(Protocol):
    """Where archived WAL lives: a directory
    (:class:`~pgsnap.wal.archive.DirectoryWalArchive`), or anything else with
    these methods (an object store).

    Everything pgsnap reads from an archive goes through these methods: the
    observer, the planners' facts, the WAL reader and its index, the executor's
    checks and the CLI never build a path from :attr:`location`. Names are
    plain file names as the archive stores them (``000000010000000000000003``,
    ``000000010000000000000003.gz``, ``00000002.history``,
    ``...00000028.backup``); a name with a directory part is refused with
    :class:`~pgsnap.errors.WalNameError`. Errors are
    :class:`~pgsnap.errors.ArchiveError` with a hint. The conformance suite
    :class:`pgsnap.testing.wal_conformance.WalArchiveConformance` checks an
    implementation.
    """

    @property
    def location(self) -> str:
        """Where the archive is, for messages (a path or URL, never a secret)."""
        ...

    def list_names(
        self, segment_size: int | None = None, *, check_sizes: bool = True
    ) -> tuple[str, ...]:
        """Every file name in the archive; ``ArchiveError`` if unreadable.

        With ``segment_size``, only the files a recovery can use: a compressed
        segment the ``restore_command`` cannot fetch is left out, and (with
        ``check_sizes``) a segment file of another size. Without
        ``check_sizes`` no file is looked at beyond its name (planning: the
        WAL reader checks the sizes of the segments it reads).
        """
        ...

    def exists(self, name: str) -> bool:
        """True when the file is in the archive (compressed forms count)."""
        ...

    def stat(self, name: str) -> ArchivedFile | None:
        """The file stored under exactly ``name`` (no compressed form is looked
        for: :func:`pgsnap.wal.reader.find_segment` does that), or None when
        there is none (an archive that does not exist holds nothing).

        The :class:`~pgsnap.wal.files.ArchivedFile` gives its stored size, its
        modification time in nanoseconds (``size`` and ``mtime_ns`` together tell
        a rewritten file from the one seen before: caches of verified and
        indexed segments are keyed by them), its compression (from the name),
        ``location`` for messages and, when known without decompressing, its
        ``content_size``. ``ArchiveError`` when the archive cannot say
        (permission denied, an I/O or network error).
        """
        ...

    def open(self, name: str) -> ReadStream:
        """The content of the file stored under exactly ``name``, decompressed by
        its suffix (``.gz``, ``.bz2``, ``.xz``; ``.lz4``/``.zst`` where a codec is
        available), as a stream read front to back (the WAL reader reads a
        segment in chunks; a header check reads 40 bytes).

        ``ArchiveError`` when the file is missing (with a hint), cannot be
        opened, or is compressed in a way the archive cannot decompress; the
        stream's ``read`` raises ``ArchiveError`` when the content turns out
        damaged. The caller closes the stream.
        """
        ...

    def read_text(self, name: str) -> str:
        """The content of a small text file (``.history``, ``.backup``)."""
        ...

    def index(self, segment_size: int, *, check_sizes: bool = True) -> ArchiveIndex:
        """An :class:`~pgsnap.wal.ArchiveIndex` of the archive as it is now (files a
        recovery cannot use among its ``unknown_names``; ``check_sizes`` as in
        :meth:`list_names`)."""
        ...

    def histories(self, names: Sequence[str] | None = None) -> TimelineGraph:
        """The timeline graph from the ``.history`` files among ``names`` (as
        :meth:`list_names` or :attr:`ArchiveIndex.history_names` gave them), or
        from every one in the archive (None: the archive is listed)."""
        ...

    def restore_command(self) -> str:
        """A ``restore_command`` that copies ``%f`` from this archive to ``%p``.

        Run by ``sh -c`` after PostgreSQL substitutes ``%f`` and ``%p``: it
        writes the file's decompressed content to ``%p`` and exits 0, or exits
        non-zero when the archive does not hold ``%f``. ``ArchiveError`` when no
        such command can be written.
        """
        ...


@runtime_checkable
class WalArchiveDeletion(Protocol):
    """Optional for a :class:`WalArchive`: it can remove files, so retention
    (``archive.delete_wal``) expires WAL in it; without it that step is refused
    with :class:`~pgsnap.errors.UnsupportedCapability` (``isinstance`` tells)."""

    def delete(self, names: Sequence[str]) -> int:
        """Remove these files and their compressed copies (``name.gz``...);
        names not there are skipped. Returns how many files were removed;
        ``ArchiveError`` when one cannot be removed (those before it are gone)."""
        ...


@runtime_checkable
class LocalWalArchive(Protocol):
    """Optional for a :class:`WalArchive`: its files are a directory on this machine,
    as stored, so tools that read directories (``pg_waldump``) can read them.
    An archive without it is read through its methods only."""

    @property
    def path(self) -> str:
        """The local directory holding the archive's files."""
        ...


class Catalog(Protocol):
    """Where backup records are kept.

    Writes are atomic: a reader sees the old record or the new one, never a
    mix; concurrent writers cannot corrupt it.
    """

    def put(self, record: BackupRecord) -> None:
        """Insert or replace the record with ``record.id``."""
        ...

    def get(self, backup_id: str) -> BackupRecord:
        """One record; ``BackupNotFound`` if absent."""
        ...

    def list(self) -> tuple[BackupRecord, ...]:
        """Every record, oldest start time first."""
        ...

    def delete(self, backup_id: str) -> None:
        """Remove a record; ``BackupNotFound`` if absent."""
        ...

    def put_safety(self, record: SafetySnapshot) -> None:
        """Record (or replace) a recovery's safety snapshot, keyed by its name."""
        ...

    def list_safety(self) -> tuple[SafetySnapshot, ...]:
        """Every recorded safety snapshot, oldest first."""
        ...

    def delete_safety(self, name: str) -> None:
        """Remove a safety snapshot's record; ``CatalogError`` if absent."""
        ...

    def put_clone(self, record: CloneRecord) -> None:
        """Record (or replace) a clone, keyed by its name."""
        ...

    def get_clone(self, name: str) -> CloneRecord:
        """One clone's record; ``CatalogError`` if absent."""
        ...

    def list_clones(self) -> tuple[CloneRecord, ...]:
        """Every recorded clone, oldest first."""
        ...

    def delete_clone(self, name: str) -> None:
        """Remove a clone's record; ``CatalogError`` if absent."""
        ...

    def put_drill(self, record: DrillRecord) -> None:
        """Record a drill's result, keyed by its id."""
        ...

    def list_drills(self, backup_id: str | None = None) -> tuple[DrillRecord, ...]:
        """The drills of one backup (or all), oldest first."""
        ...


@runtime_checkable
class ClusterLockProvider(Protocol):
    """A catalog that also keeps the cluster lock of the clusters it serves (optional).

    The executor takes that lock for every run (:mod:`pgsnap.locks`), so every
    process sharing the catalog, on any host, runs one mutating plan at a time
    per cluster. :class:`~pgsnap.catalog.DirectoryCatalog` keeps it beside its
    records; a catalog without it leaves the lock to the journal directory.
    """

    def cluster_lock(self) -> ClusterLock:
        """The lock (the same one for every call on this catalog)."""
        ...
