"""The facade for scripts and notebooks: one object for one cluster.

:class:`Cluster` holds the database adapter, the storage backend, the WAL
archive, the catalog and the layout, and offers the whole job in a few calls::

    cluster = Cluster(adapter=..., backend=..., archive=..., catalog=..., layout=...)
    cluster.check()                      # preflight + archive report
    plan = cluster.plan_backup()         # a Plan: look at it, then
    cluster.execute(plan)                # run it
    plan = cluster.plan_recovery(RecoveryTarget.time(when))
    print(plan.explain()); cluster.execute(plan)

Observation (gathering facts) happens here; planning is pure
(:mod:`pgsnap.planner`); execution is the :class:`~pgsnap.executor.Executor`.
"""

from __future__ import annotations

import datetime as dt
import html
import logging
import os
import posixpath
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from pgsnap.errors import (
    ConfigurationError,
    HostFileNotFound,
    PgsnapError,
    PlanningError,
    StalePlanError,
    VolumeNotFound,
)
from pgsnap.executor import Event, ExecutionResult, Executor
from pgsnap.host import FileKind, LocalRunner
from pgsnap.model import (
    BackupRecord,
    BackupState,
    Layout,
    LocationKind,
    Mount,
    RecoveryAction,
    RecoveryTarget,
    ServerFacts,
    VolumeRole,
    from_dict,
)
from pgsnap.plan import Plan
from pgsnap.planner.backup import BackupRequest, Finding, Severity, plan_backup, preflight
from pgsnap.planner.facts import (
    BackupFacts,
    PathFacts,
    RecoveryFacts,
    VolumeFacts,
    WalEvents,
    cluster_paths,
)
from pgsnap.planner.recovery import RecoveryRequest, plan_recovery
from pgsnap.protocols import Capability, Catalog, DatabaseAdapter, StorageBackend, WalArchive
from pgsnap.wal import ArchiveIndex, ArchiverHealth, archiver_health, check, segment_start
from pgsnap.waldump import find_waldump, scan_wal

if TYPE_CHECKING:
    from pgsnap.host import Host

__all__ = [
    "BackupList",
    "CheckReport",
    "Cluster",
    "is_live_segment",
    "read_archive_system_identifier",
]

log = logging.getLogger(__name__)

DEFAULT_SEGMENT_SIZE = 16 * 1024 * 1024


def read_archive_system_identifier(path: str | os.PathLike[str]) -> str | None:
    """The system identifier in a WAL segment's first page header (None if unreadable).

    The long page header starts every segment: magic, info, timeline,
    page address, remaining length (20 bytes, padded to 24), then the 64-bit
    system identifier (little-endian on x86 and ARM).
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(32)
    except OSError:
        return None
    if len(head) < 32:
        return None
    return str(int.from_bytes(head[24:32], "little"))


_SEGMENT_NAME_LEN = 24


def is_live_segment(name: str, head: bytes, segment_size: int) -> bool:
    """False for a segment file in pg_wal that holds no WAL of its name (yet).

    After a checkpoint PostgreSQL renames old segments to future names
    (``wal_recycle``) or creates zero-filled ones: such a file exists, but its
    first page header (``head``: its first 16 bytes) still carries its old
    address (or nothing). Its name must not count as WAL that replay can
    reach. Other files (history, ``.partial``, ``.backup``) count as they are.
    The header: ``xlp_magic`` (2 bytes), ``xlp_info`` (2), ``xlp_tli`` (4),
    ``xlp_pageaddr`` (8, little-endian).
    """
    if len(name) != _SEGMENT_NAME_LEN or any(c not in "0123456789ABCDEF" for c in name):
        return True
    if len(head) < 16:
        return False
    per_id = 0x100000000 // segment_size
    segno = int(name[8:16], 16) * per_id + int(name[16:], 16)
    tli = int.from_bytes(head[4:8], "little")
    pageaddr = int.from_bytes(head[8:16], "little")
    return pageaddr == segno * segment_size and 0 < tli <= int(name[:8], 16)


@attrs.frozen
class CheckReport:
    """What ``Cluster.check()`` found: preflight findings, archiver health, WAL per timeline."""

    findings: tuple[Finding, ...]
    archiver: ArchiverHealth
    wal: tuple[str, ...]
    backups: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when nothing blocks a backup."""
        return not any(f.severity is Severity.ERROR for f in self.findings)

    def explain(self) -> str:
        """The report as text."""
        lines = [f"pgsnap check: {'OK' if self.ok else 'PROBLEMS FOUND'}"]
        lines.append("Findings:" if self.findings else "Findings: none")
        lines += [f"  {f}" for f in self.findings]
        lines.append("WAL archive:")
        lines += [f"  {w}" for w in self.wal]
        lines.append("Backups:" if self.backups else "Backups: none")
        lines += [f"  {b}" for b in self.backups]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        e = html.escape
        return "<pre>" + e(self.explain()) + "</pre>"


class BackupList(tuple[BackupRecord, ...]):
    """Backup records, oldest first: a plain tuple that displays as a table."""

    __slots__ = ()

    def rows(self) -> list[tuple[str, ...]]:
        """One row of text per backup: id, state, timeline, start, stop, time, label."""
        return [
            (
                b.id,
                b.state.value + (f" ({b.failure_reason})" if b.failure_reason else ""),
                str(b.start_timeline),
                str(b.start_lsn),
                str(b.stop_lsn or "-"),
                b.stop_time.isoformat(timespec="seconds") if b.stop_time else "-",
                b.label,
            )
            for b in self
        ]

    def __repr__(self) -> str:
        return f"<BackupList {len(self)} backups>"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython
        p.text("\n".join("  ".join(r) for r in self.rows()) or "no backups")

    def _repr_html_(self) -> str:
        head = ("id", "state", "timeline", "start LSN", "stop LSN", "consistent at", "label")
        e = html.escape
        body = "".join(
            "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in self.rows()
        )
        return "<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + f"</tr>{body}</table>"


class Cluster:
    """One PostgreSQL cluster under pgsnap's care. See the module docstring."""

    def __init__(
        self,
        *,
        adapter: DatabaseAdapter,
        backend: StorageBackend,
        archive: WalArchive,
        catalog: Catalog,
        layout: Layout,
        journal_dir: str | os.PathLike[str] | None = None,
        waldump: str | os.PathLike[str] | None = None,
        clock: Callable[[], dt.datetime] | None = None,
        on_event: Callable[[Event], None] | None = None,
        max_scan_segments: int = 256,
    ) -> None:
        self.adapter = adapter
        self.backend = backend
        self.archive = archive
        self.catalog = catalog
        self.layout = layout
        self.journal_dir = journal_dir
        self._waldump = Path(waldump) if waldump is not None else None
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self.on_event = on_event
        self.max_scan_segments = max_scan_segments

    def __repr__(self) -> str:
        return (
            f"<Cluster backend={self.backend.name} archive={self.archive.location} "
            f"volumes={len(self.layout.volumes)}>"
        )

    # ------------------------------------------------------------------ observe

    def backup_facts(self) -> BackupFacts:
        """Observe what the backup planner needs (server, archiver, volumes, catalog)."""
        server = self.adapter.describe()
        index = self.archive.index(server.wal_segment_size)
        sysid = None
        for tli in sorted(index.timelines(), reverse=True):
            ranges = index.ranges(tli)
            if ranges:
                from pgsnap.wal import segment_name  # noqa: PLC0415

                name = segment_name(tli, ranges[-1].last, server.wal_segment_size)
                sysid = self._segment_sysid(name)
                break
        return BackupFacts(
            server=server,
            archiver=self.adapter.archiver_status(),
            layout=self.layout,
            volumes=self.backend.list_volumes(),
            capabilities=self.backend.capabilities,
            catalog=self.catalog.list(),
            archive_location=self.archive.location,
            archive_timelines=tuple(
                sorted(set(index.timelines()) | set(self.archive.histories().timelines()))
            ),
            archive_system_identifier=sysid,
            host=self.host.name,
            volume_facts=self._volume_facts(),
            paths=self._path_facts(server),
        )

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
        out = []
        for what, path in cluster_paths(server):
            real = host.realpath(path)
            mount = host.mount_of(real)
            device = None
            if mount is not None:
                device = host.realpath(mount.source) if mount.source.startswith("/") else None
            out.append(PathFacts(what, path, real, mount, device))
        return tuple(out)

    def _segment_sysid(self, name: str) -> str | None:
        path = Path(self.archive.location) / name
        return read_archive_system_identifier(path) if path.exists() else None

    def _segment_size(self, backups: Iterable[BackupRecord]) -> int:
        sizes = {b.wal_segment_size for b in backups}
        if len(sizes) == 1:
            return sizes.pop()
        try:
            return self.adapter.describe().wal_segment_size
        except PgsnapError:
            return max(sizes) if sizes else DEFAULT_SEGMENT_SIZE

    def _local_wal_dir(self) -> str | None:
        """The surviving pg_wal on the host: the WAL volume's ``pg_wal`` or its root."""
        wal = self.layout.wal
        if wal is None:
            return None
        nested = posixpath.join(wal.mount_point, "pg_wal")
        info = self.host.stat(nested)
        if info is not None and info.kind is FileKind.DIRECTORY:
            return nested
        return wal.mount_point

    def _surviving_segments(self, directory: str, segment_size: int) -> list[str] | None:
        """The names in the surviving pg_wal that hold WAL (None: no such directory)."""
        try:
            heads = self.host.read_heads(directory, 16)
        except HostFileNotFound:
            return None
        return [n for n, head in heads.items() if is_live_segment(n, head, segment_size)]

    def recovery_facts(self, request: RecoveryRequest | None = None) -> RecoveryFacts:
        """Observe what the recovery planner needs; scans WAL commit times when it can."""
        request = request or RecoveryRequest()
        backups = self.catalog.list()
        seg = self._segment_size(backups)
        names = self.archive.list_names()
        index = ArchiveIndex.build(names, seg)
        merged = None
        local_dir = self._local_wal_dir()
        local = None if local_dir is None else self._surviving_segments(local_dir, seg)
        if local is not None:
            merged = ArchiveIndex.build((*names, *local), seg)
        graph = self.archive.histories()
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
        )
        events = self._scan_events(facts, request, local_dir)
        return attrs.evolve(facts, events=events)

    def _scan_events(
        self, facts: RecoveryFacts, request: RecoveryRequest, local_dir: str | None
    ) -> WalEvents | None:
        usable = [b for b in facts.backups if b.is_usable and b.stop_lsn is not None]
        if not usable:
            return None
        major = usable[-1].server_version // 10000
        # The adapter's binaries first (PostgresAdapter.bindir, when it has one), then
        # the usual places for the backup's major version, then PATH.
        adapter_bindir = getattr(self.adapter, "bindir", None)
        waldump = (
            self._waldump
            or (find_waldump(adapter_bindir) if adapter_bindir else None)
            or find_waldump(major=major)
        )
        if waldump is None:
            return None
        try:
            out = subprocess.run(
                [str(waldump), "--version"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
        except OSError:
            return None
        if f" {major}." not in out and f" {major}" not in out.split("(")[-1]:
            log.info(
                "pg_waldump (%s) does not match PostgreSQL %s: WAL not scanned", out.strip(), major
            )
            return None
        oldest = min(usable, key=lambda b: b.start_lsn)
        keep_wal = VolumeRole.WAL not in request.lost and facts.archive_with_local_wal is not None
        index = (
            facts.archive_with_local_wal
            if keep_wal and facts.archive_with_local_wal
            else facts.archive
        )
        if request.timeline == "latest":
            tli = max(facts.timelines.latest(), oldest.start_timeline)
        elif request.timeline == "current":
            tli = oldest.start_timeline
        else:
            tli = int(request.timeline)
        try:
            reach = check(
                index, (oldest.start_timeline, oldest.start_lsn), None, tli, facts.timelines
            )
        except PgsnapError as exc:
            log.debug("no WAL scan: %s", exc)
            return None
        seg = oldest.wal_segment_size
        start = oldest.start_lsn
        limit = self.max_scan_segments * seg
        if reach.reachable_lsn - start > limit:
            start = segment_start((reach.reachable_lsn.value - limit) // seg, seg)
        dirs: list[str] = [self.archive.location]
        if keep_wal and local_dir is not None and isinstance(self.host.runner, LocalRunner):
            # pg_waldump runs here: it reads a surviving pg_wal only on this machine.
            dirs.append(local_dir)
        events = scan_wal(waldump, dirs, reach.path, start, reach.reachable_lsn)
        if start != oldest.start_lsn:
            events = attrs.evolve(events, complete=False)
        return events

    # ------------------------------------------------------------------ report

    def check(self) -> CheckReport:
        """Preflight findings, archiver health and the WAL archive per timeline."""
        facts = self.backup_facts()
        findings = preflight(facts)
        seg = facts.server.wal_segment_size
        index = self.archive.index(seg)
        wal_lines = []
        for tli in index.timelines():
            ranges = index.ranges(tli)
            gaps = index.gaps(tli)
            wal_lines.append(
                f"timeline {tli}: {sum(r.count for r in ranges)} segments in {len(ranges)} "
                f"range(s)"
                + (
                    f"; gaps: {', '.join(g.names(seg)[0] for g in gaps[:5])}"
                    if gaps
                    else "; no gaps"
                )
            )
        if not wal_lines:
            wal_lines.append("no WAL archived yet")
        backups = tuple(
            f"{b.id} {b.state.value} start {b.start_lsn} stop {b.stop_lsn} "
            f"({b.stop_time.isoformat() if b.stop_time else '-'})"
            for b in facts.catalog
        )
        return CheckReport(
            findings=findings,
            archiver=archiver_health(facts.archiver),
            wal=tuple(wal_lines),
            backups=backups,
        )

    def backups(self) -> BackupList:
        """The catalog's backups, oldest first (a tuple that renders as a table)."""
        return BackupList(self.catalog.list())

    # ------------------------------------------------------------------ plan

    def plan_backup(
        self,
        label: str | None = None,
        *,
        backup_id: str | None = None,
        fast: bool = True,
        wal_timeout: float = 60.0,
        secure_snapshots: bool = False,
    ) -> Plan:
        """Observe, run the preflight, and return the backup plan."""
        now = self._now()
        backup_id = backup_id or now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"
        request = BackupRequest(
            backup_id=backup_id,
            label=label or f"pgsnap {backup_id}",
            fast_checkpoint=fast,
            wal_timeout=wal_timeout,
            secure_snapshots=secure_snapshots,
        )
        return plan_backup(self.backup_facts(), request)

    def plan_recovery(
        self,
        target: RecoveryTarget | None = None,
        *,
        timeline: str | int = "latest",
        action: RecoveryAction | str = RecoveryAction.PROMOTE,
        lost: Iterable[VolumeRole | str] = (VolumeRole.DATA,),
        backup_id: str | None = None,
        safety_snapshot: bool = True,
        recovery_timeout: float = 600.0,
    ) -> Plan:
        """Observe and return the recovery plan (or raise a PlanningError saying why not)."""
        request = RecoveryRequest(
            target=target or RecoveryTarget.latest(),
            timeline=str(timeline),
            action=RecoveryAction(action),
            lost=frozenset(VolumeRole(r) for r in lost),
            backup_id=backup_id,
            safety_snapshot=safety_snapshot,
            recovery_timeout=recovery_timeout,
        )
        return self._plan_recovery(request)

    def _plan_recovery(self, request: RecoveryRequest) -> Plan:
        return plan_recovery(self.recovery_facts(request), request)

    # ------------------------------------------------------------------ execute

    def _check_fresh(self, plan: Plan) -> None:
        if plan.kind != "recovery" or not plan.request:
            return
        request = from_dict(RecoveryRequest, plan.request)
        try:
            now = self._plan_recovery(request)
        except PlanningError as exc:
            raise StalePlanError(
                f"the plan no longer holds: {exc.message}", hint="make a new plan"
            ) from exc
        if now.fingerprint != plan.fingerprint:
            raise StalePlanError(
                "the facts changed since the plan was made (backups, snapshots, timelines or WAL)",
                hint="make a new plan and review it",
                planned=plan.fingerprint,
                current=now.fingerprint,
            )

    def executor(self, on_event: Callable[[Event], None] | None = None) -> Executor:
        """An :class:`~pgsnap.executor.Executor` wired to this cluster."""
        return Executor(
            adapter=self.adapter,
            backend=self.backend,
            catalog=self.catalog,
            archive=self.archive,
            layout=self.layout,
            host=self.host,
            journal_dir=self.journal_dir,
            on_event=on_event or self.on_event,
            check_fresh=self._check_fresh,
            clock=self._now,
        )

    def execute(
        self,
        plan: Plan,
        *,
        dry_run: bool = False,
        on_event: Callable[[Event], None] | None = None,
    ) -> ExecutionResult:
        """Run a plan (checking first that its facts still hold)."""
        return self.executor(on_event).run(plan, dry_run=dry_run)

    def interrupted(self) -> tuple[Plan, ...]:
        """Plans whose execution stopped half way; :meth:`execute` one to resume it."""
        return self.executor().interrupted()

    def backup(self, label: str | None = None, **options: object) -> BackupRecord:
        """Plan and execute a backup; return its DONE record."""
        plan = self.plan_backup(label, **options)  # type: ignore[arg-type]
        self.execute(plan)
        record = self.catalog.get(str(plan.request["backup_id"]))
        assert record.state is BackupState.DONE
        return record

    def _now(self) -> dt.datetime:
        """The clock's time, in UTC; a naive clock is a ConfigurationError, not a TypeError."""
        now = self.clock()
        if not isinstance(now, dt.datetime) or now.tzinfo is None or now.utcoffset() is None:
            raise ConfigurationError(
                f"the Cluster's clock returned {now!r}, not an aware datetime",
                hint="return aware times, e.g. datetime.now(timezone.utc)",
            )
        return now.astimezone(dt.UTC)
