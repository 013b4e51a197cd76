"""The executor: the only code that sequences I/O.

:class:`Executor` runs a :class:`~pgsnap.plan.Plan` step by step. Each step
is an operation (:mod:`pgsnap.operations`); the executor knows operations, not
plan kinds or step ids. What it guarantees:

- **One journal per plan identity** (:mod:`pgsnap._journal`): every step's
  start, end and outputs are appended as they happen. A run interrupted (the
  process killed, Ctrl-C) is resumed by running the plan again: finished steps
  are skipped, the interrupted one is re-run or probed as its operation's
  resume policy says. A run that ended (done, failed, compensated) is never
  run again: :class:`~pgsnap.errors.PlanAlreadyRunError`, make a new plan.
- **One mutating plan at a time per cluster**: the cluster lock
  (:mod:`pgsnap.locks`: beside the catalog, or in the journal directory) is
  taken before the first step and held to the last; a second run fails at
  once with :class:`~pgsnap.errors.ClusterLockedError` naming the holder
  (backups may share it). A new run is also refused while another plan's run
  is interrupted (its journal names it: resume it first), except that an
  interrupted backup blocks nothing.
- **One process per plan**: the journal is locked while a process runs it
  (:class:`~pgsnap.errors.PlanLockedError` for a second one); listing
  interrupted plans never takes that lock.
- **Invariants checked, not trusted**: before the first step changes
  anything, every remaining step's :meth:`~pgsnap.operations.Operation.precheck`
  runs against what the collaborators say now and the rest of the plan (the
  snapshot restored is the backup's whose label is written...); a violation
  is :class:`~pgsnap.errors.InvariantError` and nothing runs.
- **Undo on failure**: the compensations of the finished steps run in
  reverse, each one getting its chance even if another fails; what could not
  be removed is reported (``ExecutionError.leftovers``) and given to the
  compensations that record it (a failed backup lists its orphaned snapshots).
- **Points of no return**: once a barrier step has started (PostgreSQL
  replaying on restored volumes), a failure undoes nothing; the error says so.
  The remaining steps whose operation is a ``cleanup`` (removing the recovery
  settings once the server has left recovery) still run.
- **What cannot resume is undone**: a step whose resume policy is ``ABORT``
  (it needs the backup session the interrupted process held) means the
  interrupted run is undone instead of resumed, at once on Ctrl-C, and on
  the next run after a kill (what the killed process created but never
  journalled is found by probing, and removed too).
- **Errors**: every failure of a step is an :class:`~pgsnap.errors.ExecutionError`
  with the step, what had finished, what was undone and what failed to be
  undone; the step's own pgsnap error is its ``cause``.
- **Freshness**: ``check_fresh(plan)`` runs before the first step of a new
  run and raises :class:`~pgsnap.errors.StalePlanError` when the facts changed.
- **Events** (started, progress, finished, failed, skipped, adopted,
  compensating...) with timings go to ``on_event``; ``dry_run`` reports what
  would run and touches nothing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from pgsnap._attrs import define, frozen
from pgsnap._journal import (
    JOURNAL_SUFFIX,
    Journal,
    RunState,
    StepState,
    is_locked,
    journal_path,
    open_journal,
    prune_journals,
    read_journal,
)
from pgsnap.errors import (
    ClusterLockedError,
    ExecutionError,
    InvariantError,
    LockLostError,
    PgsnapError,
    PlanAlreadyRunError,
)
from pgsnap.locks import ClusterLock, FileClusterLock, Lease, LockHolder, LockMode, lock_mode
from pgsnap.model import Layout
from pgsnap.operations import (
    JSONValue,
    Operation,
    OperationContext,
    OperationRegistry,
    Outputs,
    PlanView,
    Resume,
    RunFailure,
    default_operations,
)
from pgsnap.plan import Plan, Step
from pgsnap.protocols import (
    Catalog,
    ClusterLockProvider,
    DatabaseAdapter,
    PrimaryServer,
    StorageBackend,
    WalArchive,
)

if TYPE_CHECKING:
    from pgsnap.host import Host

__all__ = [
    "Event",
    "EventKind",
    "ExecutionResult",
    "Executor",
    "RunState",
    "StepState",
    "prune_journals",
]

log = logging.getLogger(__name__)


class EventKind(enum.Enum):
    """What happened to a step."""

    STARTED = "started"
    PROGRESS = "progress"
    """A long step reports how it is getting on (``detail``, ``data``)."""
    FINISHED = "finished"
    FAILED = "failed"
    SKIPPED = "skipped"
    """Already done in an earlier, interrupted run (resume)."""
    ADOPTED = "adopted"
    """An interrupted process had done it; found by probing, counted as done."""
    PLANNED = "planned"
    """Dry run: the step would run."""
    COMPENSATING = "compensating"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"


@frozen
class Event:
    """A progress event: which step, what happened, how long it took."""

    kind: EventKind
    step_id: str
    description: str
    index: int
    total: int
    seconds: float | None = None
    error: str | None = None
    detail: str | None = None
    """What a progress event says (``replayed to 0/5000000, 12 segments restored``)."""
    data: Mapping[str, JSONValue] = attrs.field(factory=dict)
    """A progress event's figures as plain data (for products and ``--json-events``)."""

    def __str__(self) -> str:
        took = f" ({self.seconds:.2f} s)" if self.seconds is not None else ""
        err = f": {self.error}" if self.error else ""
        said = f": {self.detail}" if self.detail else ""
        return (
            f"[{self.index}/{self.total}] {self.kind.value:<12} {self.description}{took}{err}{said}"
        )


@frozen
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
            f"<ExecutionResult {self.plan.kind} {self.plan.id[:12]} steps={len(self.outputs)} "
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


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@define
class _Run:
    """One execution of a plan by this process: its journal, operations and context."""

    plan: Plan
    journal: Journal
    ops: dict[str, Operation]
    undos: dict[str, Operation | None]
    ctx: OperationContext
    timings: dict[str, float] = attrs.field(factory=dict)

    @property
    def total(self) -> int:
        return len(self.plan.steps)

    def index(self, step: Step) -> int:
        return self.plan.steps.index(step) + 1

    def state(self, step_id: str) -> StepState | None:
        record = self.journal.steps.get(step_id)
        return None if record is None else record.state

    def done(self) -> list[Step]:
        """Steps whose forward run finished (journal order is plan order)."""
        return [s for s in self.plan.steps if self.state(s.id) in _FINISHED]

    def past_barrier(self) -> str | None:
        """The barrier step that has started, if any."""
        for s in self.plan.steps:
            if self.ops[s.id].barrier and s.id in self.journal.steps:
                return s.id
        return None


_FINISHED = frozenset(
    {
        StepState.DONE,
        StepState.COMPENSATING,
        StepState.COMPENSATED,
        StepState.COMPENSATION_FAILED,
    }
)
_UNDOING = frozenset({StepState.COMPENSATING, StepState.COMPENSATED, StepState.COMPENSATION_FAILED})


class Executor:
    """Runs plans. See the module docstring for the guarantees.

    ``host``: the database host for host steps (default: ``adapter.host``).
    ``journal_dir``: where journals go (None: in memory, no resume).
    ``on_event``: called with every :class:`Event` (default: nothing).
    ``check_fresh``: called with the plan before the first step of a new run;
    raises :class:`~pgsnap.errors.StalePlanError` when its facts changed.
    ``operations``: the registry steps are built from (default: the default
    one, where :func:`~pgsnap.operations.register_operation` adds).
    ``lock``: the cluster lock (default: the catalog's, when it keeps one, else
    one in the journal directory; with neither, runs are not locked).
    ``hosts``: other hosts by name (clones); ``primary``: the primary of the standby
    this cluster is (:class:`~pgsnap.protocols.PrimaryServer`), for its steps.
    ``alone``: runs hold the cluster lock exclusively whatever their kind.
    """

    def __init__(
        self,
        *,
        adapter: DatabaseAdapter,
        backend: StorageBackend,
        catalog: Catalog,
        archive: WalArchive,
        layout: Layout,
        host: Host | None = None,
        journal_dir: str | os.PathLike[str] | None = None,
        on_event: Callable[[Event], None] | None = None,
        check_fresh: Callable[[Plan], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], dt.datetime] = _utcnow,
        operations: OperationRegistry | None = None,
        lock: ClusterLock | None = None,
        hosts: Mapping[str, Host] | None = None,
        primary: PrimaryServer | None = None,
        alone: bool = False,
    ) -> None:
        self.adapter = adapter
        self.backend = backend
        self.catalog = catalog
        self.archive = archive
        self.layout = layout
        self._host = host
        self.journal_dir = Path(journal_dir) if journal_dir is not None else None
        self.on_event = on_event or (lambda _e: None)
        self.check_fresh = check_fresh
        self.sleep = sleep
        self.clock = clock
        self.operations = operations or default_operations()
        self.lock = lock if lock is not None else _default_lock(catalog, self.journal_dir)
        self.hosts: Mapping[str, Host] = dict(hosts or {})
        self.primary = primary
        self.alone = alone
        self._lease: Lease | None = None

    def __repr__(self) -> str:
        return f"<Executor backend={self.backend.name} journal={self.journal_dir}>"

    @property
    def host(self) -> Host:
        """The database host that host steps act on."""
        return self._host if self._host is not None else self.adapter.host

    # ------------------------------------------------------------------ events

    def _emit(
        self,
        kind: EventKind,
        step: Step,
        index: int,
        total: int,
        seconds: float | None = None,
        error: str | None = None,
        detail: str | None = None,
        data: Mapping[str, JSONValue] | None = None,
    ) -> None:
        event = Event(
            kind, step.id, step.description, index, total, seconds, error, detail, dict(data or {})
        )
        log.info("%s", event)
        try:
            self.on_event(event)
        except Exception:  # a broken progress callback must not break a recovery
            log.exception("event callback failed")

    # ------------------------------------------------------------------ running

    def run(self, plan: Plan, *, dry_run: bool = False) -> ExecutionResult:
        """Execute ``plan``, or resume its interrupted run; see the module docstring."""
        ops = {s.id: s.operation(self.operations) for s in plan.steps}
        undos = {s.id: s.undo_operation(self.operations) for s in plan.steps}
        total = len(plan.steps)
        if dry_run:
            for n, step in enumerate(plan.steps, 1):
                self._emit(EventKind.PLANNED, step, n, total)
            return ExecutionResult(plan, {}, {}, 0.0, dry_run=True)
        lease = self._acquire(plan)
        self._lease = lease
        try:
            return self._run_journalled(plan, ops, undos)
        finally:
            self._lease = None
            if lease is not None:
                lease.release()
            if self.journal_dir is not None:
                try:
                    prune_journals(self.journal_dir, now=self.clock())
                except OSError as exc:  # never fails a run
                    log.warning("cannot prune the journals in %s: %s", self.journal_dir, exc)

    def _acquire(self, plan: Plan) -> Lease | None:
        """Take the cluster lock for ``plan`` (None: this executor has no lock)."""
        if self.lock is None:
            return None
        journal = (
            None
            if self.journal_dir is None
            else str(journal_path(self.journal_dir, plan.kind, plan.id))
        )
        return self.lock.acquire(
            LockHolder.for_run(
                plan.kind, plan.id, journal=journal, clock=self.clock, alone=self.alone
            )
        )

    def check_not_busy(self, kind: str) -> None:
        """Raise :class:`~pgsnap.errors.ClusterLockedError` now when a new run of a
        ``kind`` plan would be refused (another run holds the cluster, or an
        interrupted run must be finished first). Takes nothing: a caller asks
        before planning, so a second ``pgsnap recover`` fails at once; the run
        itself takes the lock."""
        if self.lock is not None:
            mine = LockMode.EXCLUSIVE if self.alone else lock_mode(kind)
            holders = self.lock.holders()
            blocking = [
                h for h in holders if not (mine is LockMode.SHARED and h.mode is LockMode.SHARED)
            ]
            if blocking:
                who = "; ".join(str(h) for h in blocking)
                raise ClusterLockedError(
                    f"cannot run a {kind} plan: another pgsnap run holds the cluster ({who})",
                    hint="wait for it to finish and run again; only backups may run side by side",
                    holders=tuple(str(h) for h in blocking),
                )
        self._refuse_if_interrupted(kind, "")

    def _refuse_if_interrupted(self, kind: str, plan_id: str) -> None:
        """A new run waits for the interrupted runs of other plans to be finished."""
        others = [
            p
            for p in self.interrupted()
            if p.id != plan_id and lock_mode(p.kind) is LockMode.EXCLUSIVE
        ]
        if not others:
            return
        assert self.journal_dir is not None
        names = [str(journal_path(self.journal_dir, p.kind, p.id)) for p in others]
        pairs = zip(others, names, strict=True)
        shown = "; ".join(f"{p.kind} plan {p.id[:12]} ({n})" for p, n in pairs)
        raise ClusterLockedError(
            f"cannot start this {kind} plan: the run of {shown} was interrupted and has "
            "not been finished; a new run on top of it could undo what it did, or be undone "
            "by it",
            hint="finish it first: `pgsnap resume --yes` (or Cluster.execute of that plan) "
            "resumes it, or undoes what cannot resume",
            interrupted=tuple(names),
        )

    def _prechecks(self, run: _Run) -> None:
        """Every step still to run checks its invariants before anything changes."""
        view = PlanView(
            tuple((s.id, run.ops[s.id], run.undos[s.id]) for s in run.plan.steps),
            started=frozenset(run.journal.steps),
        )
        for step in run.plan.steps:
            if run.state(step.id) in _FINISHED:
                continue
            run.ctx.step_id = step.id
            for op, seen in ((run.ops[step.id], view), (run.undos[step.id], view.for_undo())):
                if op is None:
                    continue
                try:
                    op.precheck(run.ctx, seen)
                except InvariantError:
                    raise
                except PgsnapError as exc:  # the collaborators could not be asked
                    raise InvariantError(
                        f"step {step.id} ({op.name}) cannot check what it depends on: "
                        f"{_one_line(exc)}",
                        step_id=step.id,
                        hint=exc.hint or "fix the cause and run the plan again",
                        cause=exc,
                    ) from exc
        run.ctx.step_id = ""

    def _run_journalled(
        self,
        plan: Plan,
        ops: dict[str, Operation],
        undos: dict[str, Operation | None],
    ) -> ExecutionResult:
        with open_journal(
            self.journal_dir, plan.kind, plan.to_dict(), plan.id, self.clock
        ) as journal:
            if journal.state is not RunState.RUNNING:
                raise PlanAlreadyRunError(
                    f"this {plan.kind} plan ({plan.id[:12]}) has already run: it ended "
                    f"{journal.state.value}" + (f" ({journal.reason})" if journal.reason else ""),
                    hint="a plan runs once; make a new plan for a new run",
                    plan_id=plan.id,
                    state=journal.state.value,
                )
            if not journal.resumed:
                self._refuse_if_interrupted(plan.kind, plan.id)
            ctx = OperationContext(
                adapter=self.adapter,
                backend=self.backend,
                catalog=self.catalog,
                archive=self.archive,
                host=self.host,
                layout=self.layout,
                outputs={
                    sid: dict(rec.outputs or {})
                    for sid, rec in journal.steps.items()
                    if rec.state in _FINISHED
                },
                resources={},
                sleep=self.sleep,
                clock=self.clock,
                run_started=journal.started_at,
                plan_id=plan.id,
                hosts=self.hosts,
                primary=self.primary,
            )
            run = _Run(plan, journal, ops, undos, ctx)
            for sid, rec in journal.steps.items():
                if rec.seconds is not None:
                    run.timings[sid] = rec.seconds
            try:
                if not journal.resumed:
                    if self.check_fresh is not None:
                        self.check_fresh(plan)
                    self._prechecks(run)
                return self._run(run)
            finally:
                _close_resources(ctx)

    def _run(self, run: _Run) -> ExecutionResult:
        started = time.monotonic()
        resumed = run.journal.resumed
        if resumed:
            self._resume(run)
        try:
            for step in run.plan.steps:
                n = run.index(step)
                if run.state(step.id) in _FINISHED:
                    self._emit(EventKind.SKIPPED, step, n, run.total)
                    continue
                self._step(run, step)
        except LockLostError:
            # Nothing is undone: another backup server may hold the cluster now.
            log.warning(
                "run of plan %s stopped: the cluster lock was lost; resume it once the lock "
                "can be taken again",
                run.plan.id[:12],
            )
            raise
        except Exception as exc:
            self._failed(run, exc)
        except BaseException as exc:  # KeyboardInterrupt, SystemExit
            self._interrupted(run, exc)
            raise
        run.journal.finish(RunState.DONE)
        return ExecutionResult(
            plan=run.plan,
            outputs=dict(run.ctx.outputs),
            seconds=dict(run.timings),
            total_seconds=time.monotonic() - started,
            resumed=resumed,
        )

    def _step(self, run: _Run, step: Step) -> None:
        n = run.index(step)
        if self._lease is not None:
            self._lease.check(step.id)  # a lock kept in a database can be lost: stop here
        self._emit(EventKind.STARTED, step, n, run.total)
        run.journal.record_step(step.id, StepState.RUNNING)
        run.ctx.step_id = step.id
        t0 = time.monotonic()

        def progress(message: str, data: Mapping[str, JSONValue]) -> None:
            self._emit(
                EventKind.PROGRESS, step, n, run.total, time.monotonic() - t0, None, message, data
            )

        run.ctx.progress = progress
        try:
            outputs = run.ops[step.id].run(run.ctx)
            _check_outputs(step, outputs)
        except Exception as exc:
            took = time.monotonic() - t0
            run.journal.record_step(step.id, StepState.FAILED, seconds=took, error=_one_line(exc))
            self._emit(EventKind.FAILED, step, n, run.total, took, _one_line(exc))
            raise
        finally:
            run.ctx.progress = _no_progress
        took = time.monotonic() - t0
        self._done(run, step, outputs, took)
        self._emit(EventKind.FINISHED, step, n, run.total, took)

    def _done(self, run: _Run, step: Step, outputs: Outputs, seconds: float, **kw: Any) -> None:
        run.journal.record_step(step.id, StepState.DONE, outputs=outputs, seconds=seconds, **kw)
        outputs_map = run.ctx.outputs
        assert isinstance(outputs_map, dict)
        outputs_map[step.id] = dict(outputs)
        run.timings[step.id] = seconds

    # ------------------------------------------------------------------ resume

    def _resume(self, run: _Run) -> None:
        """Pick up an interrupted run: finish an undo, adopt, or undo what cannot resume."""
        steps = run.journal.steps
        if any(rec.state in _UNDOING for rec in steps.values()):
            reason = run.journal.reason or "the interrupted run was being undone"
            self._undo(run, reason, failing_step="")
            raise self._undone_error(run, f"{reason}; the undo was finished now", "")
        failed = [s for s in run.plan.steps if run.state(s.id) is StepState.FAILED]
        if failed:
            step = failed[0]
            error = steps[step.id].error or "failed"
            self._failed(run, ExecutionError(error, step_id=step.id), step=step)
        self._adopt(run)
        try:
            self._prechecks(run)
        except InvariantError as exc:
            self._failed(run, exc, step=_step_of(run, exc.step_id), plain=True)
        blocking = [
            s
            for s in run.plan.steps
            if run.state(s.id) not in _FINISHED and run.ops[s.id].resume is Resume.ABORT
        ]
        if blocking:
            step = blocking[0]
            reason = (
                f"the run was interrupted, and step {step.id} ({step.action}) cannot run in "
                "another process than the one that began the run"
            )
            self._failed(run, ExecutionError(reason, step_id=step.id), step=step, plain=True)

    def _adopt(self, run: _Run) -> None:
        """Probe the steps an interruption left running; count those that took effect as done."""
        for step in run.plan.steps:
            if run.state(step.id) is not StepState.RUNNING:
                continue
            op = run.ops[step.id]
            if op.resume is Resume.RERUN:
                continue
            run.ctx.step_id = step.id
            found = op.probe(run.ctx)
            if found is not None:
                self._done(run, step, found, 0.0, adopted=True)
                self._emit(EventKind.ADOPTED, step, run.index(step), run.total)

    # ------------------------------------------------------------------ failure

    def _failed(
        self,
        run: _Run,
        exc: Exception,
        *,
        step: Step | None = None,
        plain: bool = False,
    ) -> None:
        """Undo the run after ``exc`` (or not, past the point of no return), then raise."""
        if step is None:
            step = next(
                (s for s in run.plan.steps if run.state(s.id) is StepState.FAILED),
                run.plan.steps[-1],
            )
        reason = str(exc) if plain else f"step {step.id} failed: {_one_line(exc)}"
        cause = exc if isinstance(exc, PgsnapError) and not plain else None
        barrier = run.past_barrier()
        if barrier is not None:
            cleaned = self._cleanup(run, reason, step)
            run.journal.finish(RunState.FAILED, reason)
            raise ExecutionError(
                f"{reason}; the point of no return (step {barrier}) was passed, so nothing "
                "was undone" + (f"; cleaned up: {', '.join(cleaned)}" if cleaned else ""),
                hint="PostgreSQL was already replaying on the restored volumes: look at the "
                "server and its log; the plan's 'kept' list says what still holds the state "
                "from before the recovery",
                step_id=step.id,
                completed=[s.id for s in run.done()],
                past_point_of_no_return=True,
                cause=cause,
            ) from exc
        self._undo(run, reason, failing_step=step.id)
        raise self._undone_error(run, reason, step.id, cause=cause) from exc

    def _cleanup(self, run: _Run, reason: str, failed: Step) -> list[str]:
        """After a failure past the point of no return: run the cleanup steps still to do."""
        done: list[str] = []
        for step in run.plan.steps:
            op = run.ops[step.id]
            if not op.cleanup or run.state(step.id) in _FINISHED or step.id == failed.id:
                continue
            n = run.index(step)
            self._emit(EventKind.STARTED, step, n, run.total)
            run.journal.record_step(step.id, StepState.RUNNING)
            run.ctx.step_id = step.id
            run.ctx.failure = RunFailure(reason, failed.id)
            t0 = time.monotonic()
            try:
                outputs = op.run(run.ctx)
                _check_outputs(step, outputs)
            except Exception as exc:  # a cleanup never hides the failure itself
                log.exception("cleanup step %s failed", step.id)
                took = time.monotonic() - t0
                run.journal.record_step(
                    step.id, StepState.FAILED, seconds=took, error=_one_line(exc)
                )
                self._emit(EventKind.FAILED, step, n, run.total, took, _one_line(exc))
                continue
            finally:
                run.ctx.failure = None
            took = time.monotonic() - t0
            self._done(run, step, outputs, took)
            self._emit(EventKind.FINISHED, step, n, run.total, took)
            if not outputs.get("skipped"):
                done.append(step.id)
        return done

    def _interrupted(self, run: _Run, exc: BaseException) -> None:
        """Ctrl-C: keep the journal for a resume, unless what is left cannot resume."""
        remaining = [s for s in run.plan.steps if run.state(s.id) not in _FINISHED]
        cannot = [s for s in remaining if run.ops[s.id].resume is Resume.ABORT]
        if cannot and run.past_barrier() is None:
            reason = f"the run was interrupted ({type(exc).__name__}) before step {cannot[0].id}"
            self._adopt(run)
            self._undo(run, reason, failing_step=cannot[0].id)
            return
        log.warning("run of plan %s interrupted; run the plan again to resume", run.plan.id[:12])

    def _undo(self, run: _Run, reason: str, *, failing_step: str) -> None:
        """Run the compensations of the finished steps in reverse; end the run."""
        leftovers: list[str] = []
        failures = 0
        for step in reversed(run.done()):
            undo = run.undos[step.id]
            state = run.state(step.id)
            if state is StepState.COMPENSATION_FAILED:
                failures += 1
                leftovers += run.ops[step.id].created(run.ctx.outputs.get(step.id, {}))
                continue
            if undo is None or state is StepState.COMPENSATED:
                continue
            n = run.index(step)
            self._emit(EventKind.COMPENSATING, step, n, run.total)
            run.journal.record_step(step.id, StepState.COMPENSATING)
            run.ctx.step_id = step.id
            run.ctx.failure = RunFailure(reason, failing_step, tuple(leftovers))
            t0 = time.monotonic()
            try:
                undo.run(run.ctx)
            except Exception as exc:  # every compensation gets its chance
                log.exception("compensation of %s failed", step.id)
                failures += 1
                leftovers += run.ops[step.id].created(run.ctx.outputs.get(step.id, {}))
                run.journal.record_step(
                    step.id, StepState.COMPENSATION_FAILED, error=_one_line(exc)
                )
                self._emit(
                    EventKind.COMPENSATION_FAILED,
                    step,
                    n,
                    run.total,
                    time.monotonic() - t0,
                    _one_line(exc),
                )
                continue
            run.journal.record_step(step.id, StepState.COMPENSATED)
            self._emit(EventKind.COMPENSATED, step, n, run.total, time.monotonic() - t0)
        run.ctx.failure = None
        _close_resources(run.ctx)
        run.journal.finish(RunState.FAILED if failures else RunState.COMPENSATED, reason)

    def _undone_error(
        self, run: _Run, reason: str, step_id: str, *, cause: PgsnapError | None = None
    ) -> ExecutionError:
        steps = run.journal.steps
        compensated = [  # in the order the compensations ran
            s.id for s in reversed(run.plan.steps) if run.state(s.id) is StepState.COMPENSATED
        ]
        failed = [
            f"{s.id}: {steps[s.id].error}"
            for s in run.plan.steps
            if run.state(s.id) is StepState.COMPENSATION_FAILED
        ]
        leftovers: list[str] = []
        for s in run.plan.steps:
            if run.state(s.id) is StepState.COMPENSATION_FAILED:
                leftovers += run.ops[s.id].created(run.ctx.outputs.get(s.id, {}))
        undone = (
            f"; undone: {', '.join(compensated)}" if compensated else "; nothing needed undoing"
        )
        if failed:
            undone += f"; could NOT undo: {'; '.join(failed)}"
        if leftovers:
            undone += f"; left behind: {', '.join(leftovers)}"
        return ExecutionError(
            reason + undone,
            hint=(
                "remove what was left behind once you have looked at it; "
                if leftovers or failed
                else ""
            )
            + "fix the cause and make a new plan",
            step_id=step_id,
            completed=[s.id for s in run.done()],
            compensated=compensated,
            compensation_failures=failed,
            leftovers=leftovers,
            cause=cause,
        )

    # ------------------------------------------------------------------ inspection

    def interrupted(self) -> tuple[Plan, ...]:
        """Plans whose run stopped half way (journal running, no process holding it).

        Run one again with :meth:`run` to resume it. Looking never takes a
        journal's lock, so it cannot disturb a run in progress.
        """
        if self.journal_dir is None or not self.journal_dir.is_dir():
            return ()
        plans = []
        for path in sorted(self.journal_dir.glob(f"*{JOURNAL_SUFFIX}")):
            try:
                view = read_journal(path)
            except (OSError, PgsnapError) as exc:
                log.warning("unreadable journal %s: %s", path, exc)
                continue
            if view is None or view.state is not RunState.RUNNING or not view.has_progress:
                continue
            if is_locked(path):
                continue
            try:
                plans.append(Plan.from_dict(view.plan))
            except PgsnapError as exc:
                log.warning("journal %s holds a plan this pgsnap cannot run: %s", path, exc)
        return tuple(plans)


def _no_progress(_message: str, _data: Mapping[str, JSONValue]) -> None:
    """Progress reported outside a running step goes nowhere."""


def _step_of(run: _Run, step_id: str) -> Step:
    try:
        return run.plan.step(step_id)
    except KeyError:
        return run.plan.steps[0]


def _default_lock(catalog: Catalog, journal_dir: Path | None) -> ClusterLock | None:
    """The catalog's cluster lock, else one in the journal directory, else none."""
    if isinstance(catalog, ClusterLockProvider):
        return catalog.cluster_lock()
    if journal_dir is not None:
        return FileClusterLock(journal_dir / ".cluster-lock")
    return None


def _check_outputs(step: Step, outputs: Any) -> None:
    if not isinstance(outputs, dict):
        raise ExecutionError(
            f"operation {step.action} returned {type(outputs).__name__}, not a dict of outputs",
            step_id=step.id,
            hint="an operation's run() returns plain JSON data",
        )
    try:
        json.dumps(outputs)
    except (TypeError, ValueError) as exc:
        raise ExecutionError(
            f"operation {step.action} returned outputs that are not plain JSON data: {exc}",
            step_id=step.id,
            hint="an operation's run() returns plain JSON data (they are journalled)",
        ) from exc


def _close_resources(ctx: OperationContext) -> None:
    """Close what a run held in this process (a backup session aborts its backup)."""
    for key in list(ctx.resources):
        value = ctx.resources.pop(key)
        close = getattr(value, "close", None)
        if callable(close):
            with contextlib.suppress(Exception):
                close()
