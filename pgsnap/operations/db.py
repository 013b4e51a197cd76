"""Operations on the PostgreSQL server (through the :class:`~pgsnap.protocols.DatabaseAdapter`)."""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
import typing
from collections.abc import Callable, Mapping
from typing import Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import CatalogError, DatabaseError, ExecutionError
from pgsnap.model import (
    LSN,
    BackupRecord,
    CheckpointState,
    RecoveryAction,
    RecoverySettings,
    RecoveryTarget,
    TargetKind,
    VolumeRole,
)
from pgsnap.operations.base import (
    JSONValue,
    Operation,
    OperationContext,
    Outputs,
    PlanView,
    Ref,
    Resume,
    Target,
    renamed_operations,
)
from pgsnap.protocols import BackupSession

__all__ = [
    "AbortBackup",
    "ClearRecoverySettings",
    "PrepareDataDirectory",
    "StartBackup",
    "StartServer",
    "StopBackup",
    "StopServer",
    "SwitchPrimaryWal",
    "VerifyRecovery",
    "WaitForCheckpoint",
    "WaitRecovery",
    "WriteBackupLabel",
    "WriteRecoverySettings",
]

log = logging.getLogger(__name__)

SESSION = "backup_session"
"""The key of the open backup session in :attr:`OperationContext.resources`."""
_MODE_STARTED = "backup_mode_started"


def _session(ctx: OperationContext) -> BackupSession:
    session = ctx.resources.get(SESSION)
    if session is None:
        raise ExecutionError(
            "no backup session is open in this process",
            step_id=ctx.step_id,
            hint="backup mode ends with the session that began it; take a new backup",
        )
    return typing.cast(BackupSession, session)


# --------------------------------------------------------------------------- backup


def _wal_rate(before: CheckpointState, after: CheckpointState) -> float | None:
    """Bytes of WAL a second between two readings (None when it cannot be told)."""
    if before.insert_lsn is None or after.insert_lsn is None:
        return None
    if before.read_at is None or after.read_at is None:
        return None
    seconds = (after.read_at - before.read_at).total_seconds()
    if seconds <= 0 or after.insert_lsn < before.insert_lsn:
        return None
    return (after.insert_lsn.value - before.insert_lsn.value) / seconds


def _wal_seconds_left(state: CheckpointState, rate: float | None) -> float | None:
    """Seconds until WAL written at ``rate`` makes PostgreSQL begin a checkpoint."""
    since = state.wal_since_redo
    if since is None or state.wal_checkpoint_bytes is None or not rate:
        return None
    return max(0.0, (state.wal_checkpoint_bytes - since) / rate)


@frozen
class WaitForCheckpoint(Operation):
    """Wait for PostgreSQL's own checkpoint schedule (a gentle backup).

    ``until="done"`` (``checkpoint="next"``): wait until the next checkpoint PostgreSQL
    schedules itself is over. A backup's own, fast, checkpoint then flushes only what
    was written since, in a short burst. Waits at most until that checkpoint is due
    (``checkpoint_timeout`` and its spread, from the last one) plus ``margin`` seconds.

    ``until="due"`` (``checkpoint="scheduled"``): wait until the next timed checkpoint
    is ``lead`` seconds from beginning (:meth:`~pgsnap.model.CheckpointState.next_due`,
    on the server's clock), letting one that is still spreading its writes end first.
    The backup's spread checkpoint, requested then, takes that checkpoint's place: the
    workload sees no checkpoint it would not have had. Waits at most two timeouts and
    a spread, plus ``margin``.

    Either way it tells how long is left every few seconds.
    """

    name = "db.wait_checkpoint"
    target = Target.DATABASE

    margin: float = 60.0
    until: str = attrs.field(default="done", validator=attrs.validators.in_(("done", "due")))
    lead: float = 2.0

    def run(self, ctx: OperationContext) -> Outputs:
        if self.until == "due":
            return self._until_due(ctx)
        first = ctx.adapter.checkpoint_state()
        started = time.monotonic()
        due = first.next_done_by
        limit = max(0.0, (due - first.time).total_seconds()) + self.margin
        told = started
        while True:
            ctx.sleep(0.5)
            now = ctx.adapter.checkpoint_state()
            if now.redo_lsn != first.redo_lsn or now.time != first.time:
                waited = round(time.monotonic() - started, 3)
                return {"checkpoint_redo_lsn": str(now.redo_lsn), "waited_seconds": waited}
            elapsed = time.monotonic() - started
            if elapsed >= limit:
                raise self._late(first, limit)
            if time.monotonic() - told >= 5.0:
                told = time.monotonic()
                ctx.progress(
                    f"waiting for PostgreSQL's next checkpoint (the last began at "
                    f"{first.time.isoformat(timespec='seconds')}; the next is over by "
                    f"{due.isoformat(timespec='seconds')})",
                    {"elapsed_seconds": round(elapsed, 1), "due": due.isoformat()},
                )

    def _until_due(self, ctx: OperationContext) -> Outputs:
        state = ctx.adapter.checkpoint_state()
        first = state
        limit = state.timeout_seconds * (2.0 + state.completion_target) + self.margin
        waited = 0.0
        told = -5.0
        rate: float | None = None
        previous: CheckpointState | None = None
        while True:
            at = state.read_at or dt.datetime.now(dt.UTC)
            due, running = state.next_due(at)
            left = (due - at).total_seconds() - self.lead
            what = (
                f"{left + self.lead:.0f} s to PostgreSQL's next timed checkpoint "
                f"({due.isoformat(timespec='seconds')}); the backup's checkpoint takes its place"
            )
            if state.wal_checkpoint_running:
                if previous is not None and (
                    state.redo_lsn != previous.redo_lsn or state.time != previous.time
                ):
                    # One just ended with enough WAL written since its redo point for
                    # the next to begin at once (back to back): the backup's request
                    # joins that one's.
                    return {"checkpoint_due": at.isoformat(), "waited_seconds": round(waited, 3)}
                running = running or state.time
                what = "letting the checkpoint PostgreSQL began for max_wal_size end"
            elif running is not None:
                what = (
                    f"letting the checkpoint PostgreSQL began at "
                    f"{running.isoformat(timespec='seconds')} end"
                )
            else:
                wal_left = _wal_seconds_left(state, rate)
                if wal_left is not None and wal_left < left + self.lead:
                    left = wal_left - self.lead
                    what = (
                        f"about {wal_left:.0f} s until PostgreSQL begins a checkpoint for "
                        "max_wal_size; the backup's checkpoint takes its place"
                    )
            if running is None and left <= 0:
                return {"checkpoint_due": due.isoformat(), "waited_seconds": round(waited, 3)}
            if waited >= limit:
                raise self._late(first, limit)
            if waited - told >= 5.0:
                told = waited
                ctx.progress(
                    f"waiting: {what}",
                    {"elapsed_seconds": round(waited, 1), "due": due.isoformat()},
                )
            # Wake before the lead, and every few seconds to see the schedule move (a
            # checkpoint ending, WAL written faster); every second until the rate of
            # WAL is known.
            most = 5.0 if rate is not None or state.insert_lsn is None else 1.0
            pause = 0.5 if running is not None else min(max(left, 0.05), most)
            ctx.sleep(pause)
            waited += pause
            previous, state = state, ctx.adapter.checkpoint_state()
            rate = _wal_rate(previous, state) or rate

    @staticmethod
    def _late(first: CheckpointState, limit: float) -> DatabaseError:
        return DatabaseError(
            f"PostgreSQL did not complete a checkpoint within {limit:.0f} s (the last "
            f"began at {first.time.isoformat(timespec='seconds')}, "
            f"checkpoint_timeout {first.timeout_seconds:g} s)",
            hint="check the server log for checkpoints (log_checkpoints = on), or "
            "back up with the fast checkpoint (--checkpoint fast)",
            sqlstate=None,
        )


@frozen
class StartBackup(Operation):
    """Enter backup mode on a dedicated session, kept open in this process."""

    name = "db.backup_start"
    target = Target.DATABASE
    compensation = "db.backup_abort"
    resume = Resume.ABORT

    label: str
    fast: bool = True

    def run(self, ctx: OperationContext) -> Outputs:
        facts = ctx.adapter.describe()
        session = ctx.adapter.backup_session()
        ctx.resources[SESSION] = session
        start = session.start(self.label, fast=self.fast)
        ctx.resources[_MODE_STARTED] = time.monotonic()
        return {
            "start_lsn": str(start.lsn),
            "timeline": start.timeline,
            "start_time": start.time.isoformat(),
            "system_identifier": facts.system_identifier,
            "server_version": facts.version_num,
            "wal_segment_size": facts.wal_segment_size,
            "wal_directory": facts.wal_directory,
            "role": facts.role.value,
            "host": ctx.host.name,
        }


@frozen
class AbortBackup(Operation):
    """Close the backup session: the server aborts a backup whose session ends."""

    name = "db.backup_abort"
    target = Target.DATABASE

    def run(self, ctx: OperationContext) -> Outputs:
        session = ctx.resources.pop(SESSION, None)
        if session is not None:
            session.close()
        return {}


@frozen
class StopBackup(Operation):
    """Leave backup mode without waiting for the archive; return the label and map."""

    name = "db.backup_stop"
    target = Target.DATABASE
    resume = Resume.ABORT

    def run(self, ctx: OperationContext) -> Outputs:
        session = _session(ctx)
        stop = session.stop()
        started = ctx.resources.pop(_MODE_STARTED, None)
        seconds = None if started is None else round(time.monotonic() - float(started), 4)
        session.close()
        ctx.resources.pop(SESSION, None)
        return {
            "stop_lsn": str(stop.lsn),
            "timeline": stop.timeline,
            "stop_time": stop.time.isoformat(),
            "labelfile": stop.labelfile,
            "spcmapfile": stop.spcmapfile,
            "backup_mode_seconds": seconds,
        }


@frozen
class SwitchPrimaryWal(Operation):
    """Switch WAL on the primary of the standby a backup was taken on, so the segment
    holding the backup's stop point is completed and archived now (a standby cannot
    switch WAL itself). A primary that wrote nothing since its last switch has no
    segment to complete: the call is then a no-op, as on PostgreSQL."""

    name = "db.primary_switch_wal"
    target = Target.DATABASE

    stop: Ref

    def run(self, ctx: OperationContext) -> Outputs:
        primary = ctx.primary
        if primary is None:
            raise ExecutionError(
                f"step {ctx.step_id} switches WAL on the primary, but pgsnap has no "
                "connection to it",
                step_id=ctx.step_id,
                hint="configure [primary] (Cluster(primary=...)) and make a new plan",
            )
        stop = ctx.resolve(self.stop)
        stop_lsn = LSN.parse(str(stop["stop_lsn"])) if isinstance(stop, Mapping) else None
        rows = primary.query(
            "SELECT pg_is_in_recovery(), pg_current_wal_lsn()::text, "
            "CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_switch_wal()::text END"
        )
        in_recovery, current, switched = rows[0]
        if in_recovery:
            raise ExecutionError(
                "the configured primary is in recovery: it cannot switch WAL (was it "
                "demoted, or is [primary] another standby?)",
                step_id=ctx.step_id,
                hint="point [primary] at the server the standby streams from",
            )
        if stop_lsn is not None and LSN.parse(str(current)) < stop_lsn:
            raise ExecutionError(
                f"the configured primary is at {current}, before the backup's stop point "
                f"{stop_lsn}: it is not the primary this standby replays",
                step_id=ctx.step_id,
                hint="point [primary] at the server the standby streams from",
            )
        return {"switched_at": str(switched), "primary_lsn": str(current)}


# --------------------------------------------------------------------------- server


@frozen
class StopServer(Operation):
    """Stop the server (fast shutdown); a no-op when it is down."""

    name = "db.stop_server"
    target = Target.DATABASE

    timeout: float = 120.0

    def run(self, ctx: OperationContext) -> Outputs:
        was_running = ctx.adapter.is_running()
        ctx.adapter.stop_server(timeout=self.timeout)
        return {"was_running": was_running}


@frozen
class StartServer(Operation):
    """Start the server; on restored volumes it begins replaying WAL (a point of no return)."""

    name = "db.start_server"
    target = Target.DATABASE
    barrier = True

    timeout: float = 120.0

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        """On restored volumes, PostgreSQL starts only with the backup's label and the
        recovery settings written after the last restore: without the label it would
        replay from the snapshot's own checkpoint (a corrupt cluster), without the
        settings it would not fetch WAL from the archive."""
        here = plan.index(ctx.step_id) if ctx.step_id else len(plan.steps)
        before = plan.steps[:here]
        restored = [n for n, (_s, op, _u) in enumerate(before) if op.restores() is not None]
        labels = [n for n, (_s, op, _u) in enumerate(before) if isinstance(op, WriteBackupLabel)]
        settings = [
            n for n, (_s, op, _u) in enumerate(before) if isinstance(op, WriteRecoverySettings)
        ]
        if not (restored or labels or settings):
            return  # a plain start: nothing was restored
        last = max(restored, default=-1)
        missing = [
            what
            for what, where in (("a backup label", labels), ("recovery settings", settings))
            if not [n for n in where if n > last]
        ]
        if missing:
            raise self.mismatch(
                ctx,
                f"it starts PostgreSQL on restored volumes without first writing "
                f"{' and '.join(missing)} (after the last restore): the server would "
                "replay from the wrong place or not at all",
                "the plan was edited: make a new plan",
            )

    def run(self, ctx: OperationContext) -> Outputs:
        if ctx.adapter.is_running():
            return {"already_running": True}
        ctx.adapter.start_server(timeout=self.timeout)
        return {"already_running": False}


@frozen
class PrepareDataDirectory(Operation):
    """Clean a restored data directory (postmaster.pid, temporary state, stale pg_wal)."""

    name = "db.prepare_data_directory"
    target = Target.DATABASE

    clear_wal: bool = False

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        """Only a data directory this plan restored first is cleaned: on the live one,
        removing ``postmaster.pid`` and ``pg_wal`` would lose WAL and let a second
        postmaster start."""
        here = plan.index(ctx.step_id) if ctx.step_id else len(plan.steps)
        data = {v.id for v in ctx.layout.volumes if v.role is VolumeRole.DATA}
        restored = {r[0] for _s, op, _u in plan.steps[:here] if (r := op.restores()) is not None}
        if data and not data <= restored:
            raise self.mismatch(
                ctx,
                f"it cleans the data directory (postmaster.pid, temporary state"
                f"{', pg_wal' if self.clear_wal else ''}), but the plan does not first "
                f"restore volume(s) {', '.join(sorted(data - restored))}: it would clean "
                "the live one",
                "the plan was edited: make a new plan",
            )

    def run(self, ctx: OperationContext) -> Outputs:
        removed = ctx.adapter.prepare_data_directory(clear_wal=self.clear_wal)
        return {"removed": len(removed)}


@frozen
class WriteBackupLabel(Operation):
    """Write the backup's ``backup_label`` and ``tablespace_map`` from the catalog.

    What it depends on is checked, not trusted: before the run changes
    anything, that the catalog's label is the one the plan was made with
    (``label_sha256``) and that the plan restores every data and tablespace
    volume from this backup's snapshots and from no other backup's; when it
    runs (after the restores), that the restored data directory belongs to
    the backup's cluster (the system identifier in ``global/pg_control``).
    """

    name = "db.write_backup_label"
    target = Target.DATABASE

    backup_id: str
    label_sha256: str

    def _record(self, ctx: OperationContext) -> BackupRecord:
        record = self.backup_record(ctx, self.backup_id)
        if record.labelfile is None:
            raise self.mismatch(
                ctx,
                f"backup {record.id} has no backup label in the catalog",
                "this backup cannot be restored; choose another",
            )
        digest = hashlib.sha256(record.labelfile.encode()).hexdigest()
        if digest != self.label_sha256:
            raise self.mismatch(
                ctx,
                f"the catalog's backup label of {record.id} is not the one the plan was "
                f"made with (sha256 {digest[:12]}, the plan says {self.label_sha256[:12]})",
                "the plan was edited or the catalog changed: make a new plan",
            )
        return record

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        self._record(ctx)
        here = plan.index(ctx.step_id) if ctx.step_id else len(plan.steps)
        restores = [(sid, r) for sid, op, _u in plan.steps if (r := op.restores()) is not None]
        others = sorted({b for _s, (_v, b) in restores if b is not None} - {self.backup_id})
        if others:
            raise self.mismatch(
                ctx,
                f"it writes backup {self.backup_id}'s label, but the plan restores snapshots "
                f"of backup(s) {', '.join(others)}: the cluster would mix two backups",
                "the plan was edited: make a new plan",
            )
        restored = {v for sid, (v, b) in restores if b == self.backup_id and plan.index(sid) < here}
        wanted = {
            v.id for v in ctx.layout.volumes if v.role in (VolumeRole.DATA, VolumeRole.TABLESPACE)
        }
        if wanted - restored:
            raise self.mismatch(
                ctx,
                f"it writes backup {self.backup_id}'s label, but the plan does not first "
                f"restore volume(s) {', '.join(sorted(wanted - restored))} from that backup: "
                "the data directory and tablespaces must all be the backup's",
                "the plan was edited: make a new plan",
            )

    def run(self, ctx: OperationContext) -> Outputs:
        record = self._record(ctx)
        assert record.labelfile is not None
        found = ctx.adapter.stored_system_identifier()
        if found != record.system_identifier:
            what = (
                "holds no global/pg_control"
                if found is None
                else f"belongs to the cluster with system identifier {found}"
            )
            raise self.mismatch(
                ctx,
                f"the restored data directory {what}, not to backup {record.id}'s cluster "
                f"({record.system_identifier}): the snapshot restored is not this backup's",
                "nothing was started; the restores are undone: check the layout's volumes "
                "and the storage, then make a new plan",
            )
        ctx.adapter.write_backup_label(record.labelfile, record.spcmapfile or "")
        return {"label_sha256": self.label_sha256, "system_identifier": found}


@frozen
class WriteRecoverySettings(Operation):
    """Write the recovery settings and ``recovery.signal``.

    The ``restore_command`` is not a parameter: it is asked of the WAL
    archive when the step runs, so a command carrying credentials never
    enters a plan or a journal.
    """

    name = "db.write_recovery_settings"
    target = Target.DATABASE
    compensation = "db.clear_recovery_settings"

    recovery_target: RecoveryTarget
    timeline: str = "latest"
    action: RecoveryAction = RecoveryAction.PROMOTE

    def settings(self, restore_command: str) -> RecoverySettings:
        """The settings with ``restore_command`` filled in."""
        return RecoverySettings(
            restore_command=restore_command,
            target=self.recovery_target,
            target_timeline=self.timeline,
            action=self.action,
        )

    def run(self, ctx: OperationContext) -> Outputs:
        ctx.adapter.write_recovery_settings(self.settings(ctx.archive.restore_command()))
        return {}


@frozen
class ClearRecoverySettings(Operation):
    """Remove what :class:`WriteRecoverySettings` wrote."""

    name = "db.clear_recovery_settings"
    target = Target.DATABASE
    cleanup = True

    def run(self, ctx: OperationContext) -> Outputs:
        if ctx.failure is not None and ctx.failure.step_id != ctx.step_id:
            # A cleanup after a failure past the point of no return: only once the
            # server has left recovery (the settings are what a restart needs to go on).
            ended = ctx.adapter.recovery_ended()
            if not ended:
                log.warning(
                    "recovery settings kept: the server has not left recovery "
                    "(a restart needs them to go on); remove them once it has"
                )
                return {"skipped": True, "why": "the server has not left recovery"}
        ctx.adapter.clear_recovery_settings()
        return {}


_EXPECTED = {
    RecoveryAction.PROMOTE: "promoted",
    RecoveryAction.PAUSE: "paused",
    RecoveryAction.SHUTDOWN: "shutdown",
}


@frozen
class WaitRecovery(Operation):
    """Wait until recovery ends the way the plan asked, at its target."""

    name = "db.wait_recovery"
    target = Target.DATABASE

    action: RecoveryAction
    target_kind: TargetKind
    timeout: float = 600.0
    until_lsn: LSN | None = None
    """How far replay goes at most (the target's LSN, or the end of the reachable WAL):
    progress says how much is left and when it should end."""
    target_lsn: LSN | None = None
    """Where replay stops for the target, when the plan knows (an LSN target, a restore
    point, the commit a time or xid target stops at; None for latest or when the WAL
    was not read): the timeline picture places the target there."""

    def run(self, ctx: OperationContext) -> Outputs:
        told = _ReplayProgress(ctx.progress, self.until_lsn)
        outcome = ctx.adapter.wait_recovery(timeout=self.timeout, on_progress=told)
        expected = _EXPECTED[self.action]
        if outcome.state != expected:
            raise ExecutionError(
                f"recovery ended {outcome.state}, but the plan asked to {self.action.value}",
                step_id=ctx.step_id,
                hint="with hot_standby=off a pause becomes a shutdown; see the server log",
            )
        if self.target_kind is not TargetKind.LATEST and not outcome.reached_target:
            raise ExecutionError(
                "recovery ended without reaching the target",
                step_id=ctx.step_id,
                hint="see the server log; the plan's WAL check should have caught this",
            )
        replay = getattr(outcome, "replay_lsn", None)
        last = getattr(outcome, "last_transaction", None)
        log_path = getattr(outcome, "log_path", None)
        return {
            "state": outcome.state,
            "timeline": outcome.timeline,
            "reached_target": outcome.reached_target,
            "replay_lsn": None if replay is None else str(replay),
            "last_transaction": None if last is None else str(last),
            "log_path": None if log_path is None else str(log_path),
            "log": list(outcome.log_lines),
        }


class _ReplayProgress:
    """Adds the replay's rate and what is left to the server's progress (what it
    restored and replayed): bytes a second between two reports, and, towards
    ``until``, the bytes and an estimate of the seconds left."""

    def __init__(
        self, tell: Callable[[str, Mapping[str, JSONValue]], None], until: LSN | None
    ) -> None:
        self._tell = tell
        self._until = until
        self._first: tuple[float, int] | None = None

    def __call__(self, message: str, data: Mapping[str, object]) -> None:
        out: dict[str, JSONValue] = {
            k: v if v is None or isinstance(v, str | int | float | bool) else str(v)
            for k, v in data.items()
        }
        replay = data.get("replay_lsn")
        now = time.monotonic()
        try:
            position = LSN.parse(str(replay)).value if replay else None
        except ValueError:
            position = None
        if position is not None:
            if self._first is None:
                self._first = (now, position)
            start_time, start_position = self._first
            elapsed = now - start_time
            if elapsed > 0.5 and position > start_position:
                rate = (position - start_position) / elapsed
                out["rate_bytes_per_second"] = round(rate)
                message += f"; {rate / (1 << 20):.1f} MiB/s"
                if self._until is not None:
                    left = max(0, self._until.value - position)
                    out["bytes_left"] = left
                    out["eta_seconds"] = round(left / rate, 1)
                    message += (
                        f", {left / (1 << 20):.1f} MiB to {self._until} (about {left / rate:.0f} s)"
                    )
        self._tell(message, out)


@frozen
class VerifyRecovery(Operation):
    """Check the server is where the plan said: state, timeline, replayed far enough.

    ``min_replay_lsn`` is the backup's consistency point: recovery must have
    replayed at least that far. After a promotion or a pause the server says
    (``pg_last_wal_replay_lsn()``); after a shutdown the wait step's outcome
    does (the server log or ``pg_controldata``), and when neither can tell the
    check is reported as not made rather than passed.
    """

    name = "db.verify"
    target = Target.DATABASE

    action: RecoveryAction
    min_replay_lsn: LSN
    min_timeline: int | None = None
    wait_step: str = "wait-recovery"

    def precheck(self, ctx: OperationContext, plan: PlanView) -> None:
        for _sid, label in plan.of(WriteBackupLabel):
            try:
                stop = ctx.catalog.get(label.backup_id).stop_lsn
            except CatalogError:
                continue  # the label step says why
            if stop is not None and self.min_replay_lsn < stop:
                raise self.mismatch(
                    ctx,
                    f"it accepts a replay to {self.min_replay_lsn}, before backup "
                    f"{label.backup_id}'s consistency point {stop}: an inconsistent cluster "
                    "would pass",
                    "the plan was edited: make a new plan",
                )

    def run(self, ctx: OperationContext) -> Outputs:
        if self.action is RecoveryAction.SHUTDOWN:
            if ctx.adapter.is_running():
                raise ExecutionError(
                    "the server should have shut down at the target", step_id=ctx.step_id
                )
            waited = ctx.outputs.get(self.wait_step, {})
            text = waited.get("replay_lsn")
            replayed = None if text is None else LSN.parse(str(text))
            self._check_replayed(ctx, replayed)
            return {"running": False, "replay_lsn": text, "replay_checked": replayed is not None}
        facts = ctx.adapter.describe()
        if self.action is RecoveryAction.PROMOTE:
            if facts.in_recovery:
                raise ExecutionError(
                    "the server is still in recovery after promotion", step_id=ctx.step_id
                )
            if self.min_timeline is not None and facts.timeline < self.min_timeline:
                raise ExecutionError(
                    f"the server is on timeline {facts.timeline}, expected a new timeline "
                    f">= {self.min_timeline}",
                    step_id=ctx.step_id,
                )
        elif not facts.in_recovery:
            raise ExecutionError("the server should be paused in recovery", step_id=ctx.step_id)
        self._check_replayed(ctx, facts.replay_lsn)
        return {
            "timeline": facts.timeline,
            "in_recovery": facts.in_recovery,
            "replay_lsn": None if facts.replay_lsn is None else str(facts.replay_lsn),
            "replay_checked": facts.replay_lsn is not None,
        }

    def _check_replayed(self, ctx: OperationContext, replayed: LSN | None) -> None:
        if replayed is None:
            log.warning(
                "cannot tell how far recovery replayed; not checked against %s",
                self.min_replay_lsn,
            )
            return
        if replayed < self.min_replay_lsn:
            raise ExecutionError(
                f"recovery replayed only to {replayed}, before the backup's consistency point "
                f"{self.min_replay_lsn}: the cluster is not consistent",
                step_id=ctx.step_id,
                hint="see the server log; the WAL between the backup's start and stop is needed",
            )


_RENAMED: Final = {
    "BackupStart": "StartBackup",
    "BackupAbort": "AbortBackup",
    "BackupStop": "StopBackup",
    "Verify": "VerifyRecovery",
}
"""Old names of operations (they were named like the records they make), kept for one
release with a DeprecationWarning."""

__getattr__ = renamed_operations(__name__, _RENAMED, globals())
