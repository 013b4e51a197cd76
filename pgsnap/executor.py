"""The executor: the only code that sequences I/O.

:class:`Executor` runs a :class:`~pgsnap.plan.Plan` step by step against the
database adapter, the storage backend, the catalog and the archive:

- every step is journalled (a JSON file, written atomically) with its
  outputs, so an interrupted recovery resumes where it stopped;
- events (started, finished, failed, compensating...) with timings go to a
  callback: the CLI shows them as progress;
- on failure the compensations of the steps already done run in reverse,
  and a failed backup is recorded FAILED in the catalog with the reason (its
  snapshots deleted, or recorded as orphans if deletion fails);
- ``dry_run`` reports what would run and touches nothing;
- a plan whose facts changed since planning is refused (``check_fresh``).

Handlers are looked up by the step's ``action`` in a table; callers may add
their own with :meth:`Executor.register`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from pgsnap.errors import (
    ArchiveError,
    ExecutionError,
    PgsnapError,
    StalePlanError,
)
from pgsnap.model import (
    BackupRecord,
    BackupState,
    Layout,
    RecoverySettings,
    from_dict,
)
from pgsnap.plan import Plan, Step
from pgsnap.protocols import BackupSession, Catalog, DatabaseAdapter, StorageBackend, WalArchive
from pgsnap.wal import ArchiveIndex, check, segment_name, segment_number, walfile_name

__all__ = ["Event", "EventKind", "ExecutionResult", "Executor", "StepContext"]

log = logging.getLogger(__name__)

JOURNAL_VERSION = 1


class EventKind(enum.Enum):
    """What happened to a step."""

    STARTED = "started"
    FINISHED = "finished"
    FAILED = "failed"
    SKIPPED = "skipped"
    """Already done in an earlier, interrupted run (resume)."""
    PLANNED = "planned"
    """Dry run: the step would run."""
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"


@attrs.frozen
class Event:
    """A progress event: which step, what happened, how long it took."""

    kind: EventKind
    step_id: str
    description: str
    index: int
    total: int
    seconds: float | None = None
    error: str | None = None

    def __str__(self) -> str:
        took = f" ({self.seconds:.2f} s)" if self.seconds is not None else ""
        err = f": {self.error}" if self.error else ""
        return f"[{self.index}/{self.total}] {self.kind.value:<12} {self.description}{took}{err}"


@attrs.frozen
class ExecutionResult:
    """The outcome of a run: outputs per step and timings."""

    plan: Plan
    outputs: Mapping[str, Mapping[str, Any]]
    seconds: Mapping[str, float]
    total_seconds: float
    resumed: bool = False
    dry_run: bool = False

    def __repr__(self) -> str:
        return (
            f"<ExecutionResult {self.plan.kind} steps={len(self.outputs)} "
            f"total={self.total_seconds:.2f}s{' dry-run' if self.dry_run else ''}>"
        )

    def _repr_html_(self) -> str:
        import html  # noqa: PLC0415

        rows = "".join(
            f"<tr><td><code>{html.escape(s.id)}</code></td><td>{html.escape(s.description)}</td>"
            f"<td>{self.seconds.get(s.id, 0):.2f} s</td></tr>"
            for s in self.plan.steps
        )
        return (
            f"<div><b>{html.escape(self.plan.kind)} executed</b> in "
            f"{self.total_seconds:.2f} s<table>{rows}</table></div>"
        )


@attrs.define
class StepContext:
    """What handlers work with: the collaborators and the outputs so far."""

    adapter: DatabaseAdapter
    backend: StorageBackend
    catalog: Catalog
    archive: WalArchive
    layout: Layout
    outputs: dict[str, dict[str, Any]]
    sleep: Callable[[float], None]
    clock: Callable[[], dt.datetime]
    session: BackupSession | None = None
    timings: dict[str, float] = attrs.field(factory=dict)


Handler = Callable[[StepContext, Step, Mapping[str, Any]], dict[str, Any]]


# --------------------------------------------------------------------------- journal


class _Journal:
    """One JSON file per plan run: the plan, each step's state and outputs."""

    def __init__(self, directory: Path | None, plan: Plan) -> None:
        self.path = (directory / f"{plan.kind}-{plan.fingerprint[:20]}.json") if directory else None
        self.data: dict[str, Any] = {
            "journal_version": JOURNAL_VERSION,
            "plan": plan.to_dict(),
            "state": "running",
            "steps": {},
        }

    def load(self) -> bool:
        if self.path is None or not self.path.exists():
            return False
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise ExecutionError(
                f"the journal {self.path} is unreadable: {exc}",
                hint="inspect it; remove it only if you are sure no run is half done",
            ) from exc
        if data.get("state") == "done":
            return False
        self.data = data
        return True

    @property
    def steps(self) -> dict[str, Any]:
        steps: dict[str, Any] = self.data["steps"]
        return steps

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the plan's lock: one process runs a plan at a time."""
        if self.path is None:
            yield
            return
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(_lock_path(self.path), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ExecutionError(
                    f"another process is executing this plan (journal {self.path})",
                    hint="wait for it to finish; run it again only once it has stopped",
                    step_id="",
                ) from None
            yield
        finally:
            os.close(fd)

    def record(self, step_id: str, **fields: Any) -> None:
        self.steps.setdefault(step_id, {}).update(fields)
        self.save()

    def finish(self, state: str) -> None:
        self.data["state"] = state
        self.save()

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".journal-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as fh:
                os.fchmod(fh.fileno(), 0o600)
                json.dump(self.data, fh, indent=1, default=str)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


def _lock_path(journal: Path) -> Path:
    return journal.with_name(journal.name + ".lock")


def _is_locked(journal: Path) -> bool:
    try:
        fd = os.open(_lock_path(journal), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


# --------------------------------------------------------------------------- executor


class Executor:
    """Runs plans. See the module docstring for the guarantees.

    ``journal_dir``: where journals go (None: no journal, no resume).
    ``on_event``: called with every :class:`Event` (default: nothing).
    ``check_fresh``: called with the plan before the first step; raises
    :class:`~pgsnap.errors.StalePlanError` when its facts changed (the
    :class:`~pgsnap.session.Cluster` facade supplies one that re-plans).
    """

    def __init__(
        self,
        *,
        adapter: DatabaseAdapter,
        backend: StorageBackend,
        catalog: Catalog,
        archive: WalArchive,
        layout: Layout,
        journal_dir: str | os.PathLike[str] | None = None,
        on_event: Callable[[Event], None] | None = None,
        check_fresh: Callable[[Plan], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.adapter = adapter
        self.backend = backend
        self.catalog = catalog
        self.archive = archive
        self.layout = layout
        self.journal_dir = Path(journal_dir) if journal_dir is not None else None
        self.on_event = on_event or (lambda _e: None)
        self.check_fresh = check_fresh
        self.sleep = sleep
        self.clock = clock
        self._handlers: dict[str, Handler] = dict(_HANDLERS)

    def __repr__(self) -> str:
        return f"<Executor backend={self.backend.name} journal={self.journal_dir}>"

    def register(self, action: str, handler: Handler) -> None:
        """Add or replace the handler of ``action``."""
        self._handlers[action] = handler

    def _emit(
        self,
        kind: EventKind,
        step: Step,
        index: int,
        total: int,
        seconds: float | None = None,
        error: str | None = None,
    ) -> None:
        event = Event(kind, step.id, step.description, index, total, seconds, error)
        log.info("%s", event)
        try:
            self.on_event(event)
        except Exception:  # a broken progress callback must not break a recovery
            log.exception("event callback failed")

    def run(self, plan: Plan, *, dry_run: bool = False) -> ExecutionResult:
        """Execute ``plan`` (or resume it from its journal); see the module docstring."""
        unknown = sorted({s.action for s in plan.steps} - set(self._handlers))
        if unknown:
            raise ExecutionError(
                f"this executor cannot run actions {', '.join(unknown)}",
                hint="register handlers for them with Executor.register()",
                step_id="",
            )
        total = len(plan.steps)
        if dry_run:
            for n, step in enumerate(plan.steps, 1):
                self._emit(EventKind.PLANNED, step, n, total)
            return ExecutionResult(plan, {}, {}, 0.0, dry_run=True)

        journal = _Journal(self.journal_dir, plan)
        with journal.locked():
            return self._run(plan, journal, total)

    def _run(self, plan: Plan, journal: _Journal, total: int) -> ExecutionResult:
        resumed = journal.load()
        if not resumed and self.check_fresh is not None:
            self.check_fresh(plan)
        ctx = StepContext(
            adapter=self.adapter,
            backend=self.backend,
            catalog=self.catalog,
            archive=self.archive,
            layout=self.layout,
            outputs={},
            sleep=self.sleep,
            clock=self.clock,
        )
        if resumed:
            for sid, st in journal.steps.items():
                if st.get("state") == "done":
                    ctx.outputs[sid] = dict(st.get("outputs") or {})
                    ctx.timings[sid] = float(st.get("seconds") or 0.0)
            if plan.kind == "backup" and "backup-stop" not in ctx.outputs:
                # Backup mode died with the process (the server aborts a backup
                # whose session ends): what it took is cleaned up and the backup
                # recorded FAILED. After backup-stop the label is in the catalog
                # and only the WAL wait remains: that resumes normally.
                self._adopt_untracked_snapshots(plan, ctx, journal)
                self._fail(plan, ctx, journal, "the backup was interrupted (process ended)", total)
                raise ExecutionError(
                    "the interrupted backup was cleaned up and recorded FAILED",
                    hint="take a new backup",
                    step_id="",
                )
        journal.save()
        started = time.monotonic()
        done: list[Step] = []
        try:
            for n, step in enumerate(plan.steps, 1):
                if step.id in ctx.outputs:
                    done.append(step)
                    self._emit(EventKind.SKIPPED, step, n, total)
                    continue
                self._emit(EventKind.STARTED, step, n, total)
                journal.record(step.id, state="running")
                t0 = time.monotonic()
                try:
                    outputs = self._handlers[step.action](ctx, step, step.params)
                except BaseException as exc:
                    took = time.monotonic() - t0
                    journal.record(step.id, state="failed", error=_one_line(exc), seconds=took)
                    self._emit(EventKind.FAILED, step, n, total, took, _one_line(exc))
                    raise
                took = time.monotonic() - t0
                ctx.outputs[step.id] = outputs
                ctx.timings[step.id] = took
                journal.record(step.id, state="done", outputs=outputs, seconds=took)
                done.append(step)
                self._emit(EventKind.FINISHED, step, n, total, took)
        except KeyboardInterrupt:
            if plan.kind == "backup" and "backup-stop" not in ctx.outputs:
                # Backup mode cannot outlive this process: clean up now.
                self._fail(plan, ctx, journal, "the backup was interrupted", total, done)
                raise
            # Keep the journal as it is, so running the plan again resumes it.
            journal.save()
            raise
        except BaseException as exc:
            failed_step = next((s for s in plan.steps if s.id not in ctx.outputs), None)
            reason = f"step {failed_step.id if failed_step else '?'} failed: {_one_line(exc)}"
            self._fail(plan, ctx, journal, reason, total, done)
            if isinstance(exc, PgsnapError):
                raise
            raise ExecutionError(
                reason,
                hint="see the log; compensations have run",
                step_id=failed_step.id if failed_step else "",
            ) from exc
        journal.finish("done")
        return ExecutionResult(
            plan=plan,
            outputs=dict(ctx.outputs),
            seconds=dict(ctx.timings),
            total_seconds=time.monotonic() - started,
            resumed=resumed,
        )

    def interrupted(self) -> tuple[Plan, ...]:
        """Plans whose run stopped half way (journal still running, no process on it).

        Run one again with :meth:`run` to resume it (a recovery continues; a
        backup continues its WAL wait, or is cleaned up and recorded FAILED).
        """
        if self.journal_dir is None or not self.journal_dir.is_dir():
            return ()
        plans = []
        for path in sorted(self.journal_dir.glob("*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                log.warning("unreadable journal %s", path)
                continue
            if data.get("state") == "running" and not _is_locked(path):
                plans.append(Plan.from_dict(data["plan"]))
        return tuple(plans)

    def _adopt_untracked_snapshots(self, plan: Plan, ctx: StepContext, journal: _Journal) -> None:
        """Find snapshots a killed run took but never journalled, so they are cleaned up.

        The process may have died after the storage made the group and before
        the journal said so: the group carries the plan's snapshot name.
        """
        for step in plan.steps:
            state = journal.steps.get(step.id, {}).get("state")
            if step.action != "storage.snapshot_group" or state != "running":
                continue
            name = str(step.params.get("name", ""))
            groups = {s.group_id for s in ctx.backend.list_snapshots() if s.group_id}
            for group_id in sorted(groups):
                group = ctx.backend.get_snapshot_group(group_id)
                if group.name == name:
                    snaps = {s.volume_id: s.id for s in group.snapshots}
                    ctx.outputs[step.id] = {
                        "group_id": group.id,
                        "snapshots": snaps,
                        "snapshot_ids": [s.id for s in group.snapshots],
                    }
                    log.warning("found snapshot group %s of the interrupted run", group.id)

    def _fail(
        self,
        plan: Plan,
        ctx: StepContext,
        journal: _Journal,
        reason: str,
        total: int,
        done: list[Step] | None = None,
    ) -> None:
        if done is None:
            done = [s for s in plan.steps if s.id in ctx.outputs]
        for step in reversed(done):
            if not step.compensation:
                continue
            n = plan.steps.index(step) + 1
            self._emit(EventKind.COMPENSATING, step, n, total)
            t0 = time.monotonic()
            try:
                self._handlers[step.compensation](ctx, step, step.compensation_params)
                journal.record(step.id, compensated=True)
                self._emit(EventKind.COMPENSATED, step, n, total, time.monotonic() - t0)
            except Exception as exc:  # keep going: every compensation gets its chance
                log.exception("compensation of %s failed", step.id)
                journal.record(step.id, compensation_error=_one_line(exc))
                self._emit(
                    EventKind.COMPENSATION_FAILED,
                    step,
                    n,
                    total,
                    time.monotonic() - t0,
                    _one_line(exc),
                )
                if step.compensation == "storage.delete_snapshot_group":
                    ctx.outputs.setdefault("_orphans", {}).setdefault("ids", []).extend(
                        ctx.outputs.get(step.id, {}).get("snapshot_ids", [])
                    )
        if ctx.session is not None:
            with contextlib.suppress(Exception):
                ctx.session.close()
            ctx.session = None
        if plan.kind == "backup":
            _record_backup_failure(ctx, plan, reason)
        journal.finish("failed")


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


# --------------------------------------------------------------------------- backup handlers


def _backup(ctx: StepContext, backup_id: str) -> BackupRecord:
    return ctx.catalog.get(backup_id)


def _update(ctx: StepContext, backup_id: str, **changes: Any) -> BackupRecord:
    record = attrs.evolve(_backup(ctx, backup_id), **changes)
    ctx.catalog.put(record)
    return record


def _record_backup_failure(ctx: StepContext, plan: Plan, reason: str) -> None:
    backup_id = plan.steps[0].params.get("backup_id")
    if not backup_id:
        return
    orphans = tuple(ctx.outputs.get("_orphans", {}).get("ids", []))
    try:
        _update(
            ctx,
            str(backup_id),
            state=BackupState.FAILED,
            failure_reason=reason,
            orphaned_snapshots=orphans,
        )
    except PgsnapError:
        log.warning("backup %s failed before it was recorded: %s", backup_id, reason)


def _h_backup_start(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    from pgsnap import __version__  # noqa: PLC0415

    facts = ctx.adapter.describe()
    session = ctx.adapter.backup_session()
    ctx.session = session
    start = session.start(str(p["label"]), fast=bool(p.get("fast", True)))
    ctx.timings["_backup_mode_start"] = time.monotonic()
    record = BackupRecord(
        id=str(p["backup_id"]),
        label=str(p["label"]),
        state=BackupState.STARTED,
        system_identifier=facts.system_identifier,
        server_version=facts.version_num,
        wal_segment_size=facts.wal_segment_size,
        layout=ctx.layout,
        start_lsn=start.lsn,
        start_timeline=start.timeline,
        start_time=start.time,
        pgsnap_version=__version__,
    )
    ctx.catalog.put(record)
    return {
        "start_lsn": str(start.lsn),
        "timeline": start.timeline,
        "start_time": start.time.isoformat(),
    }


def _h_backup_abort(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    if ctx.session is not None:
        ctx.session.close()  # the server aborts a backup whose session ends
        ctx.session = None
    return {}


def _h_snapshot_group(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    group = ctx.backend.create_snapshot_group(
        list(p["volume_ids"]), str(p["name"]), secure=bool(p.get("secure", False))
    )
    snaps = {s.volume_id: s.id for s in group.snapshots}
    if p.get("backup_id"):
        _update(ctx, str(p["backup_id"]), snapshot_group_id=group.id, snapshots=snaps)
    return {
        "group_id": group.id,
        "snapshots": snaps,
        "snapshot_ids": [s.id for s in group.snapshots],
    }


def _h_delete_group(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    out = ctx.outputs.get(step.id, {})
    if out.get("group_id"):
        ctx.backend.delete_snapshot_group(str(out["group_id"]))
    return {}


def _h_backup_stop(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    if ctx.session is None:
        raise ExecutionError(
            "no backup session is open",
            step_id=step.id,
            hint="a backup cannot be resumed; take a new one",
        )
    stop = ctx.session.stop()
    mode_seconds = time.monotonic() - ctx.timings.get("_backup_mode_start", time.monotonic())
    ctx.session.close()
    ctx.session = None
    _update(
        ctx,
        str(p["backup_id"]),
        state=BackupState.WAITING_FOR_WAL,
        stop_lsn=stop.lsn,
        stop_timeline=stop.timeline,
        stop_time=stop.time,
        labelfile=stop.labelfile,
        spcmapfile=stop.spcmapfile,
        backup_mode_seconds=round(mode_seconds, 4),
    )
    return {
        "stop_lsn": str(stop.lsn),
        "stop_time": stop.time.isoformat(),
        "backup_mode_seconds": mode_seconds,
    }


def required_wal_files(record: BackupRecord) -> tuple[str, str]:
    """(the stop segment, the ``.backup`` history file) a backup waits for.

    The stop segment is the one holding the byte before the stop LSN (as
    PostgreSQL's ``pg_backup_stop`` computes it); the history file is named
    by the start segment and the start offset.
    """
    assert record.stop_lsn is not None
    seg = record.wal_segment_size
    stop_name = walfile_name(
        record.stop_lsn,
        record.stop_timeline or record.start_timeline,
        seg,
        previous_at_boundary=True,
    )
    start_name = walfile_name(record.start_lsn, record.start_timeline, seg)
    return stop_name, f"{start_name}.{record.start_lsn.value % seg:08X}.backup"


def _h_wait_for_wal(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    record = _backup(ctx, str(p["backup_id"]))
    stop_name, backup_file = required_wal_files(record)
    timeout = float(p.get("timeout", 60.0))
    deadline = time.monotonic() + timeout
    delay = 0.01
    waited_for: list[str] = [stop_name, backup_file]
    while True:
        waited_for = [n for n in waited_for if not ctx.archive.exists(n)]
        if not waited_for:
            break
        if time.monotonic() >= deadline:
            raise ArchiveError(
                f"WAL of backup {record.id} did not reach the archive within {timeout:g} s: "
                f"missing {', '.join(waited_for)}",
                hint="check the archiver (pgsnap check / pg_stat_archiver) and archive_command",
                missing=tuple(waited_for),
            )
        ctx.sleep(delay)
        delay = min(delay * 1.5, 0.2)
    missing = _missing_backup_segments(ctx.archive, record)
    if missing:
        raise ArchiveError(
            f"backup {record.id}: WAL between start and stop is missing from the archive: "
            f"{', '.join(missing)}",
            hint="the archive lost segments; this backup cannot be restored",
            missing=missing,
        )
    return {"stop_segment": stop_name, "backup_file": backup_file}


def _missing_backup_segments(archive: WalArchive, record: BackupRecord) -> tuple[str, ...]:
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


def _h_mark_done(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    record = _backup(ctx, str(p["backup_id"]))
    total = sum(v for k, v in ctx.timings.items() if not k.startswith("_"))
    _update(ctx, record.id, state=BackupState.DONE, total_seconds=round(total, 4))
    return {"state": "done"}


# --------------------------------------------------------------------------- recovery handlers


def _h_pause_policies(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    for pid in p.get("policy_ids", []):
        ctx.backend.pause_policy(str(pid))
    return {}


def _h_resume_policies(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    for pid in p.get("policy_ids", []):
        ctx.backend.resume_policy(str(pid))
    return {}


def _h_stop_server(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    was_running = ctx.adapter.is_running()
    ctx.adapter.stop_server()
    return {"was_running": was_running}


def _h_start_server(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    ctx.adapter.start_server()
    return {}


def _h_restore_volume(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    volume_id = str(p["volume_id"])
    snapshot_id = p.get("snapshot_id")
    if snapshot_id is None and p.get("from_step"):
        snaps = ctx.outputs.get(str(p["from_step"]), {}).get("snapshots", {})
        snapshot_id = snaps.get(volume_id)
    if snapshot_id is None:
        raise ExecutionError(f"no snapshot to restore volume {volume_id} from", step_id=step.id)
    ctx.backend.restore_volume(volume_id, str(snapshot_id))
    return {"volume_id": volume_id, "snapshot_id": str(snapshot_id)}


def _h_prepare_datadir(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    removed = ctx.adapter.prepare_data_directory(clear_wal=bool(p.get("clear_wal")))
    return {"removed": len(removed)}


def _h_write_label(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    record = _backup(ctx, str(p["backup_id"]))
    if record.labelfile is None:
        raise ExecutionError(
            f"backup {record.id} has no backup label in the catalog",
            step_id=step.id,
            hint="this backup cannot be restored",
        )
    digest = hashlib.sha256(record.labelfile.encode()).hexdigest()
    if p.get("label_sha256") and digest != p["label_sha256"]:
        raise StalePlanError(
            f"the backup label of {record.id} changed since the plan was made",
            hint="make a new plan",
        )
    ctx.adapter.write_backup_label(record.labelfile, record.spcmapfile or "")
    return {"label_sha256": digest}


def _h_write_settings(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    settings = from_dict(RecoverySettings, p["settings"])
    ctx.adapter.write_recovery_settings(settings)
    return {}


def _h_clear_settings(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    ctx.adapter.clear_recovery_settings()
    return {}


def _h_wait_recovery(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    outcome = ctx.adapter.wait_recovery(timeout=float(p.get("timeout", 600.0)))
    state = str(getattr(outcome, "state", ""))
    expected = {"promote": "promoted", "pause": "paused", "shutdown": "shutdown"}[str(p["action"])]
    if state and state != expected:
        raise ExecutionError(
            f"recovery ended {state}, but the plan asked to {p['action']}",
            hint="with hot_standby=off a pause becomes a shutdown; see the server log",
            step_id=step.id,
        )
    if p.get("target_kind") not in ("latest",) and not outcome.reached_target:
        raise ExecutionError(
            "recovery ended without reaching the target",
            step_id=step.id,
            hint="see the server log; the plan's WAL check should have caught this",
        )
    return {
        "state": state,
        "timeline": outcome.timeline,
        "reached_target": outcome.reached_target,
        "log": list(getattr(outcome, "log_lines", ())),
    }


def _h_verify(ctx: StepContext, step: Step, p: Mapping[str, Any]) -> dict[str, Any]:
    action = str(p.get("action"))
    if action == "shutdown":
        if ctx.adapter.is_running():
            raise ExecutionError("the server should have shut down at the target", step_id=step.id)
        return {"running": False}
    facts = ctx.adapter.describe()
    if action == "promote":
        if facts.in_recovery:
            raise ExecutionError("the server is still in recovery after promotion", step_id=step.id)
        min_tli = p.get("min_timeline")
        if min_tli is not None and facts.timeline < int(min_tli):
            raise ExecutionError(
                f"the server is on timeline {facts.timeline}, expected a new timeline >= {min_tli}",
                step_id=step.id,
            )
    elif not facts.in_recovery:
        raise ExecutionError("the server should be paused in recovery", step_id=step.id)
    return {
        "timeline": facts.timeline,
        "in_recovery": facts.in_recovery,
        "current_lsn": str(facts.current_lsn) if facts.current_lsn else None,
    }


_HANDLERS: Mapping[str, Handler] = {
    "db.backup_start": _h_backup_start,
    "db.backup_abort": _h_backup_abort,
    "storage.snapshot_group": _h_snapshot_group,
    "storage.delete_snapshot_group": _h_delete_group,
    "db.backup_stop": _h_backup_stop,
    "archive.wait_for_wal": _h_wait_for_wal,
    "catalog.mark_done": _h_mark_done,
    "storage.pause_policies": _h_pause_policies,
    "storage.resume_policies": _h_resume_policies,
    "db.stop_server": _h_stop_server,
    "db.start_server": _h_start_server,
    "storage.restore_volume": _h_restore_volume,
    "host.prepare_data_directory": _h_prepare_datadir,
    "host.write_backup_label": _h_write_label,
    "db.write_recovery_settings": _h_write_settings,
    "db.clear_recovery_settings": _h_clear_settings,
    "db.wait_recovery": _h_wait_recovery,
    "db.verify": _h_verify,
}
