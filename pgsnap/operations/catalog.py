"""Operations on the catalog's backup records, and the wait for a backup's WAL.

A backup's record follows the backup: STARTED once backup mode began,
WAITING_FOR_WAL with its label and snapshots the moment backup mode ends,
DONE only once its WAL is archived and its snapshots are confirmed to exist,
FAILED (with the reason and any snapshots that could not be removed) when
the run is undone.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import (
    ArchiveError,
    BackupNotFound,
    DamagedSegmentError,
    ExecutionError,
    PgsnapError,
    UnsupportedCapability,
)
from pgsnap.model import LSN, BackupRecord, BackupState, Pin, SafetySnapshot, ServerRole
from pgsnap.operations.base import (
    JSONValue,
    Operation,
    OperationContext,
    Outputs,
    PlanView,
    Ref,
    Resume,
)
from pgsnap.operations.base import Target as _Target
from pgsnap.protocols import WalArchive, WalArchiveDeletion
from pgsnap.wal import (
    ArchiveIndex,
    check,
    segment_name,
    segment_number,
    segments_to_replay,
    walfile_name,
)
from pgsnap.wal.reader import archived_segment_problem, find_segment

__all__ = [
    "DeleteBackupRecord",
    "DeleteSafetyRecord",
    "DeleteWal",
    "FailBackup",
    "MarkBackupDone",
    "MarkUnusable",
    "PutRebuiltRecord",
    "RecordBackupStart",
    "RecordBackupStop",
    "RecordSafetySnapshot",
    "SetPin",
    "VerifyWal",
    "WaitForWal",
    "missing_backup_segments",
    "required_wal_files",
]

log = logging.getLogger(__name__)


def _outputs(ctx: OperationContext, ref: Ref) -> Mapping[str, JSONValue]:
    found = ctx.resolve(ref)
    if not isinstance(found, Mapping):
        raise ExecutionError(
            f"step {ctx.step_id} expected the {ref} to be a mapping", step_id=ctx.step_id
        )
    return found


def _update(ctx: OperationContext, backup_id: str, **changes: Any) -> BackupRecord:
    record = attrs.evolve(ctx.catalog.get(backup_id), **changes)
    ctx.catalog.put(record)
    return record


@frozen
class RecordBackupStart(Operation):
    """Record the backup STARTED in the catalog, from what backup start returned.

    Refuses a backup id already in the catalog: a plan never overwrites
    another backup's record.
    """

    name = "catalog.record_backup_start"
    target = _Target.CATALOG
    compensation = "catalog.fail_backup"
    resume = Resume.CHECK

    backup_id: str
    label: str
    start: Ref

    def _record(self, ctx: OperationContext) -> BackupRecord:
        from pgsnap._version import __version__  # noqa: PLC0415

        out = _outputs(ctx, self.start)
        return BackupRecord(
            id=self.backup_id,
            label=self.label,
            state=BackupState.STARTED,
            system_identifier=str(out["system_identifier"]),
            server_version=int(out["server_version"]),
            wal_segment_size=int(out["wal_segment_size"]),
            layout=ctx.layout,
            start_lsn=LSN.parse(str(out["start_lsn"])),
            start_timeline=int(out["timeline"]),
            start_time=dt.datetime.fromisoformat(str(out["start_time"])),
            pgsnap_version=__version__,
            wal_directory=None if out.get("wal_directory") is None else str(out["wal_directory"]),
            taken_on=ServerRole(str(out.get("role", ServerRole.PRIMARY.value))),
            taken_host=str(out.get("host", "")),
        )

    def run(self, ctx: OperationContext) -> Outputs:
        record = self._record(ctx)
        try:
            existing = ctx.catalog.get(self.backup_id)
        except BackupNotFound:
            existing = None
        if existing is not None:
            raise ExecutionError(
                f"the catalog already holds a backup {self.backup_id!r} "
                f"({existing.state.value}); a plan never overwrites another backup's record",
                step_id=ctx.step_id,
                hint="make a new backup plan (it gets a new backup id)",
            )
        ctx.catalog.put(record)
        return {"backup_id": record.id}

    def probe(self, ctx: OperationContext) -> Outputs | None:
        try:
            existing = ctx.catalog.get(self.backup_id)
        except BackupNotFound:
            return None
        ours = self._record(ctx)
        if existing.start_lsn == ours.start_lsn and existing.start_time == ours.start_time:
            return {"backup_id": existing.id}
        return None


@frozen
class RecordBackupStop(Operation):
    """Keep the label, the tablespace map and the snapshots in the catalog: WAITING_FOR_WAL."""

    name = "catalog.record_backup_stop"
    target = _Target.CATALOG

    backup_id: str
    stop: Ref
    snapshot: Ref

    def run(self, ctx: OperationContext) -> Outputs:
        stop = _outputs(ctx, self.stop)
        snap = _outputs(ctx, self.snapshot)
        snapshots = snap.get("snapshots")
        if not isinstance(snapshots, Mapping):
            raise ExecutionError(
                f"step {ctx.step_id}: the snapshot step reported no snapshots", step_id=ctx.step_id
            )
        seconds = stop.get("backup_mode_seconds")
        _update(
            ctx,
            self.backup_id,
            state=BackupState.WAITING_FOR_WAL,
            stop_lsn=LSN.parse(str(stop["stop_lsn"])),
            stop_timeline=int(stop["timeline"]),
            stop_time=dt.datetime.fromisoformat(str(stop["stop_time"])),
            labelfile=str(stop["labelfile"]),
            spcmapfile=str(stop.get("spcmapfile") or ""),
            snapshot_group_id=str(snap["group_id"]),
            snapshots={str(k): str(v) for k, v in snapshots.items()},
            backup_mode_seconds=None if seconds is None else float(seconds),
        )
        return {}


def required_wal_files(record: BackupRecord) -> tuple[str, str | None]:
    """(the stop segment, the ``.backup`` history file) a backup waits for.

    The stop segment is the one holding the byte before the stop LSN (as
    PostgreSQL's ``pg_backup_stop`` computes it); the history file is named
    by the start segment and the start offset. A backup taken on a standby has
    no history file (PostgreSQL writes none in recovery): None.
    """
    assert record.stop_lsn is not None
    seg = record.wal_segment_size
    stop_name = walfile_name(
        record.stop_lsn,
        record.stop_timeline or record.start_timeline,
        seg,
        previous_at_boundary=True,
    )
    if record.taken_on is ServerRole.STANDBY:
        return stop_name, None
    start_name = walfile_name(record.start_lsn, record.start_timeline, seg)
    return stop_name, f"{start_name}.{record.start_lsn.value % seg:08X}.backup"


def missing_backup_segments(archive: WalArchive, record: BackupRecord) -> tuple[str, ...]:
    """The segments from the backup's start to its stop that the archive lacks.

    On one timeline (a primary's backup) the few names are probed directly, so
    a large archive is not listed on every backup; across a timeline switch
    the archive is indexed and the timeline path followed.
    """
    assert record.stop_lsn is not None
    seg = record.wal_segment_size
    stop_tli = record.stop_timeline or record.start_timeline
    if stop_tli == record.start_timeline:
        first = segment_number(record.start_lsn, seg)
        last = segment_number(record.stop_lsn - 1, seg)
        names = [segment_name(stop_tli, n, seg) for n in range(first, last + 1)]
        return tuple(n for n in names if not archive.exists(n))
    index: ArchiveIndex = archive.index(seg)
    result = check(
        index,
        (record.start_timeline, record.start_lsn),
        record.stop_lsn,
        stop_tli,
        archive.histories(),
    )
    return result.missing + result.missing_histories


@frozen
class WaitForWal(Operation):
    """Wait for the backup's stop segment and ``.backup`` file, then check start to stop."""

    name = "archive.wait_for_wal"
    target = _Target.ARCHIVE

    backup_id: str
    timeout: float = 60.0

    def run(self, ctx: OperationContext) -> Outputs:
        record = ctx.catalog.get(self.backup_id)
        stop_name, backup_file = required_wal_files(record)
        started = time.monotonic()
        deadline = started + self.timeout
        delay = 0.01
        told = started
        waited_for: list[str] = [stop_name] + ([backup_file] if backup_file else [])
        while True:
            waited_for = [n for n in waited_for if not ctx.archive.exists(n)]
            if not waited_for:
                break
            now = time.monotonic()
            if now - told >= 1.0:
                told = now
                _tell_wal_wait(ctx, waited_for, now - started, self.timeout)
            if time.monotonic() >= deadline:
                standby = record.taken_on is ServerRole.STANDBY
                raise ArchiveError(
                    f"WAL of backup {record.id} did not reach the archive within "
                    f"{self.timeout:g} s: missing {', '.join(waited_for)}",
                    hint=(
                        "a standby cannot switch WAL: the primary must complete and archive "
                        "that segment (configure [primary] so pgsnap switches it, or set "
                        "archive_timeout on the primary), or allow longer (--wal-timeout)"
                        if standby
                        else "check the archiver (pgsnap check / pg_stat_archiver) and "
                        "archive_command, or allow longer (--wal-timeout)"
                    ),
                    missing=tuple(waited_for),
                )
            ctx.sleep(delay)
            delay = min(delay * 1.5, 0.2)
        missing = missing_backup_segments(ctx.archive, record)
        if missing:
            raise ArchiveError(
                f"backup {record.id}: WAL between start and stop is missing from the archive: "
                f"{', '.join(missing)}",
                hint="the archive lost segments; this backup cannot be restored",
                missing=missing,
            )
        return {"stop_segment": stop_name, "backup_file": backup_file or ""}


def _tell_wal_wait(ctx: OperationContext, waiting: list[str], waited: float, limit: float) -> None:
    """A WAL wait's progress: what it waits for, and what the archiver last archived
    (when the server answers: a busy or remote one may not, and the wait goes on)."""
    data: dict[str, JSONValue] = {
        "waiting_for": list(waiting),
        "waited_seconds": round(waited, 1),
        "timeout_seconds": limit,
    }
    said = f"waiting for {', '.join(waiting)} in the archive ({waited:.0f} of {limit:g} s)"
    try:
        status = ctx.adapter.archiver_status()
    except PgsnapError:
        status = None
    if status is not None and status.last_archived_wal:
        data["last_archived"] = status.last_archived_wal
        data["failed_count"] = status.failed_count
        said += f"; the archiver last archived {status.last_archived_wal}"
        if status.failed_count:
            said += f" and failed {status.failed_count} times"
    ctx.progress(said, data)


@frozen
class RecordSafetySnapshot(Operation):
    """Record in the catalog the safety snapshot a recovery just took (from the outputs
    of the step that took it), so it is listed, kept and deleted by name, and never
    mistaken for an orphan."""

    name = "catalog.record_safety_snapshot"
    target = _Target.CATALOG

    group_name: str
    backup_id: str
    recovery_target: str
    taken: Ref

    def run(self, ctx: OperationContext) -> Outputs:
        taken = _outputs(ctx, self.taken)
        snapshots = taken.get("snapshots")
        if not isinstance(snapshots, Mapping):
            raise ExecutionError(
                f"step {ctx.step_id} expected the {self.taken} to name its snapshots",
                step_id=ctx.step_id,
            )
        record = SafetySnapshot(
            name=self.group_name,
            group_id=str(taken.get("group_id")),
            snapshots={str(k): str(v) for k, v in snapshots.items()},
            created_at=ctx.clock(),
            plan_id=ctx.plan_id,
            backup_id=self.backup_id,
            target=self.recovery_target,
        )
        ctx.catalog.put_safety(record)
        return {"name": record.name}


@frozen
class PutRebuiltRecord(Operation):
    """Write a backup record a catalog rebuild made from the storage and the archive
    (:func:`~pgsnap.planner.reconcile.plan_rebuild`), unless the catalog has one of
    that id by now: a record in the catalog is never overwritten, nor one whose
    file cannot be read."""

    name = "catalog.put_rebuilt_record"
    target = _Target.CATALOG

    record: BackupRecord

    def run(self, ctx: OperationContext) -> Outputs:
        try:
            ctx.catalog.get(self.record.id)
        except BackupNotFound:
            ctx.catalog.put(self.record)
            log.info(
                "catalog rebuild: backup %s recorded from the storage and the archive",
                self.record.id,
            )
            return {"written": True}
        except PgsnapError as exc:  # unreadable: a record is there, never overwritten
            return {"written": False, "why": f"its catalog entry cannot be read: {exc}"}
        return {"written": False, "why": "recorded meanwhile; kept as it is"}


@frozen
class SetPin(Operation):
    """Set a backup's pin: retention keeps a pinned backup (forever, or until a time)
    for the reason a person gave; ``pin`` None unpins it. Planned by
    :func:`~pgsnap.planner.expiry.plan_pin`, whose undo sets the pin it found."""

    name = "catalog.set_pin"
    target = _Target.CATALOG
    compensation = "catalog.set_pin"

    backup_id: str
    pin: Pin | None = None

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        try:
            ctx.catalog.get(self.backup_id)
        except BackupNotFound:
            raise self.mismatch(
                ctx,
                f"backup {self.backup_id} is not in the catalog",
                "list the backups with `pgsnap list`, then make a new plan",
            ) from None

    def run(self, ctx: OperationContext) -> Outputs:
        record = ctx.catalog.get(self.backup_id)
        ctx.catalog.put(attrs.evolve(record, pin=self.pin))
        return {"pinned": self.pin is not None}


@frozen
class DeleteSafetyRecord(Operation):
    """Remove a safety snapshot's catalog record (one already gone is fine)."""

    name = "catalog.delete_safety"
    target = _Target.CATALOG

    safety_name: str

    def run(self, ctx: OperationContext) -> Outputs:
        try:
            ctx.catalog.delete_safety(self.safety_name)
        except PgsnapError as exc:
            log.info("safety snapshot record %s: %s", self.safety_name, exc)
            return {"deleted": False}
        return {"deleted": True}


@frozen
class VerifyWal(Operation):
    """Before anything changes: every archived segment the recovery will replay can be
    replayed (its size, page magic, system identifier, its own address, compressed
    segments too: :func:`~pgsnap.wal.reader.segment_problem`).

    PostgreSQL checks the same only as it fetches each one, after the point of no
    return (a truncated copy is a FATAL ``archive file has wrong size``; another
    cluster's WAL ends replay early). The segments are those on the path from
    ``start_lsn`` on ``start_timeline`` to ``end_lsn`` (None: everything the archive
    holds on the path when the step runs, for a recovery to the end of the WAL).
    """

    name = "archive.verify_wal"
    target = _Target.ARCHIVE

    start_timeline: int
    start_lsn: LSN
    timeline: int
    segment_size: int
    system_identifier: str
    major: int
    end_lsn: LSN | None = None

    def run(self, ctx: OperationContext) -> Outputs:
        index = ctx.archive.index(self.segment_size, check_sizes=False)
        graph = ctx.archive.histories(index.history_names)
        result = check(
            index, (self.start_timeline, self.start_lsn), self.end_lsn, self.timeline, graph
        )
        names = list(segments_to_replay(index, result))
        started = time.monotonic()
        told = started
        for n, name in enumerate(names, 1):
            found = find_segment(ctx.archive, name)
            if found is None:  # gone since it was listed: replay stops there, as planned
                continue
            why = archived_segment_problem(
                ctx.archive,
                found,
                segment_size=self.segment_size,
                system_identifier=self.system_identifier,
                major=self.major,
            )
            if why is not None:
                raise DamagedSegmentError(
                    f"archived segment {name} cannot be replayed: {why}; nothing was "
                    "changed (PostgreSQL would have stopped on it after the point of no "
                    "return)",
                    hint="put a good copy of it in the archive (a surviving pg_wal may hold "
                    "one) or move the file away if it never was complete, then make a new "
                    "plan (pgsnap plan-recovery says what is reachable)",
                    name=name,
                    reason=why,
                    path=found.location,
                )
            now = time.monotonic()
            if now - told >= 1.0:
                told = now
                ctx.progress(
                    f"{n} of {len(names)} segments verified",
                    {"verified": n, "segments": len(names)},
                )
        return {"verified": len(names), "seconds": round(time.monotonic() - started, 3)}


@frozen
class MarkBackupDone(Operation):
    """Mark the backup DONE, once every snapshot it names is confirmed to exist."""

    name = "catalog.mark_done"
    target = _Target.CATALOG

    backup_id: str

    def run(self, ctx: OperationContext) -> Outputs:
        record = ctx.catalog.get(self.backup_id)
        if not record.snapshots:
            raise ExecutionError(
                f"backup {record.id} records no snapshot; it cannot be DONE",
                step_id=ctx.step_id,
                hint="take a new backup",
            )
        present = {s.id for s in ctx.backend.list_snapshots()}
        gone = sorted(f"{v}: {s}" for v, s in record.snapshots.items() if s not in present)
        if gone:
            raise ExecutionError(
                f"backup {record.id}: snapshot(s) no longer on the storage: {', '.join(gone)}",
                step_id=ctx.step_id,
                hint="the storage lost or deleted them (a snapshot policy rotating them out?); "
                "take a new backup",
            )
        _update(ctx, record.id, state=BackupState.DONE, total_seconds=round(ctx.elapsed(), 4))
        return {"state": BackupState.DONE.value}


@frozen
class FailBackup(Operation):
    """Record the backup FAILED with the reason, and the snapshots that could not be removed.

    Runs as the compensation of :class:`RecordBackupStart`, last of the
    backup's compensations, so it knows which snapshots were left behind.
    """

    name = "catalog.fail_backup"
    target = _Target.CATALOG

    backup_id: str

    def run(self, ctx: OperationContext) -> Outputs:
        failure = ctx.failure
        reason = failure.reason if failure is not None else "the backup was undone"
        orphans = failure.leftovers if failure is not None else ()
        try:
            _update(
                ctx,
                self.backup_id,
                state=BackupState.FAILED,
                failure_reason=reason,
                orphaned_snapshots=orphans,
            )
        except BackupNotFound:
            log.warning("backup %s failed before it was recorded: %s", self.backup_id, reason)
        except PgsnapError:
            raise
        return {"orphans": list(orphans)}


def _names(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


@frozen
class DeleteBackupRecord(Operation):
    """Remove a backup's record from the catalog (retention); one already gone is fine.

    Planned after its snapshots are deleted: a run cut short between the two
    leaves a record whose snapshots are gone, which the recovery planner
    passes over, never snapshots no record names.
    """

    name = "catalog.delete_backup"
    target = _Target.CATALOG

    backup_id: str

    def run(self, ctx: OperationContext) -> Outputs:
        try:
            ctx.catalog.delete(self.backup_id)
        except BackupNotFound:
            log.info("backup %s was already gone from the catalog", self.backup_id)
            return {"deleted": False}
        return {"deleted": True}


@frozen
class DeleteWal(Operation):
    """Delete archived WAL segments of one timeline, ``first``..``last`` (segment
    numbers), and the named ``.backup`` files; files already gone are fine."""

    name = "archive.delete_wal"
    target = _Target.ARCHIVE

    timeline: int
    first: int
    last: int
    segment_size: int
    extra_names: tuple[str, ...] = attrs.field(default=(), converter=_names)

    def run(self, ctx: OperationContext) -> Outputs:
        from pgsnap.wal import segment_name  # noqa: PLC0415

        archive = ctx.archive
        if not isinstance(archive, WalArchiveDeletion):
            raise UnsupportedCapability(
                f"the WAL archive {archive.location} cannot delete files",
                hint="expire WAL with the archive's own tools, or use an archive that "
                "can (WalArchiveDeletion: DirectoryWalArchive has it)",
            )
        names = [
            segment_name(self.timeline, n, self.segment_size)
            for n in range(self.first, self.last + 1)
        ]
        deleted = archive.delete([*names, *self.extra_names])
        return {"deleted": int(deleted) if isinstance(deleted, int) else len(names)}


@frozen
class MarkUnusable(Operation):
    """Record a DONE backup FAILED because it can no longer be restored (its
    snapshots vanished from the storage), with the reason: the recovery planner
    never offers it, listings show why, and retention removes it later."""

    name = "catalog.mark_unusable"
    target = _Target.CATALOG

    backup_id: str
    reason: str

    def run(self, ctx: OperationContext) -> Outputs:
        try:
            _update(ctx, self.backup_id, state=BackupState.FAILED, failure_reason=self.reason)
        except BackupNotFound:
            return {"marked": False}
        return {"marked": True}
