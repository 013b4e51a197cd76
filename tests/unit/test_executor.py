"""The executor against the mock backend and a scripted database adapter.

These test the executor's own guarantees: one journal per plan identity, no
resume of an ended run, undo in reverse, the point of no return, what cannot
resume is undone, orphans, locks, staleness, events. Real backups and
recoveries are proven in tests/e2e against real PostgreSQL servers.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
from collections.abc import Iterator
from typing import Any, ClassVar, cast

import attrs
import pytest

from pgsnap import errors
from pgsnap._journal import RunState, StepState, journal_path, read_journal
from pgsnap.backends.mock import MockBackend
from pgsnap.catalog import DirectoryCatalog, MemoryCatalog
from pgsnap.executor import Event, EventKind, Executor
from pgsnap.host import Host
from pgsnap.model import (
    LSN,
    BackupStart,
    BackupState,
    BackupStop,
    Layout,
    RecoveryAction,
    RecoveryTarget,
    ServerFacts,
    Volume,
    VolumeRole,
)
from pgsnap.operations import (
    Operation,
    OperationContext,
    Outputs,
    Ref,
    Resume,
    Target,
    default_operations,
)
from pgsnap.operations.catalog import required_wal_files
from pgsnap.operations.db import VerifyRecovery
from pgsnap.plan import Plan, Step
from pgsnap.planner.backup import BackupRequest, plan_backup
from pgsnap.planner.facts import BackupFacts
from pgsnap.protocols import DatabaseAdapter
from pgsnap.wal import ArchiveIndex, TimelineGraph, segment_name
from pgsnap.wal.files import ReadStream
from tests.unit.test_planner_backup import ARCHIVER, directory_volumes, paths_of

MB = 1 << 20
NOW = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)
STOP_LSN = LSN(4 * MB + 0x100)


class FakeSession:
    def __init__(self, db):
        self.db = db

    def start(self, label, *, fast=True):
        self.db.in_backup = True
        self.db.log.append("start")
        return BackupStart(LSN(3 * MB + 0x28), 1, NOW)

    def stop(self):
        self.db.in_backup = False
        self.db.log.append("stop")
        return BackupStop(STOP_LSN, "START WAL LOCATION: 0/300028\n", "", NOW, 1)

    def close(self):
        if self.db.in_backup:
            self.db.log.append("abort")
        self.db.in_backup = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class FakeDb:
    """Enough of a DatabaseAdapter for the executor's backup path and verify."""

    def __init__(self):
        self.in_backup = False
        self.log = []
        self.host = Host()
        self.replay_lsn: LSN | None = None
        self.in_recovery = False
        self.running = True
        self.timeline = 1

    def describe(self):
        return ServerFacts(
            version_num=150018,
            system_identifier="1",
            data_directory="/pg/data",
            wal_directory="/pg/wal",
            wal_segment_size=MB,
            timeline=self.timeline,
            checkpoint_lsn="0/1",
            redo_lsn="0/1",
            current_lsn="0/1",
            in_recovery=self.in_recovery,
            settings={"wal_level": "replica"},
            replay_lsn=self.replay_lsn,
        )

    def archiver_status(self):
        return ARCHIVER

    def backup_session(self):
        return FakeSession(self)

    def is_running(self):
        return self.running


class FakeArchive:
    """A WAL archive whose files appear when the test says so (or when first asked)."""

    def __init__(self, names=()):
        self.names = set(names)
        self.location = "/archive"
        self.arrive = None  # called on every probe, before answering

    def list_names(self, segment_size=None, *, check_sizes=True):
        return tuple(sorted(self.names))

    def exists(self, name):
        if self.arrive is not None:
            self.arrive()
        return name in self.names

    def read_text(self, name):
        raise NotImplementedError

    def index(self, segment_size, *, check_sizes=True):
        return ArchiveIndex.build(self.names, segment_size)

    def histories(self, names=None):
        return TimelineGraph()

    def restore_command(self):
        return "cp /archive/%f %p"

    def stat(self, name: str) -> None:
        return None  # names only: no file behind them for the WAL checks to read

    def open(self, name: str) -> ReadStream:
        raise NotImplementedError


@attrs.define
class World:
    backend: MockBackend
    layout: Layout
    db: FakeDb
    catalog: Any
    archive: FakeArchive
    ex: Executor
    events: list[Event]

    def archive_backup_wal(self, *, skip=()):
        record = self.catalog.get("b-1")
        stop, backup_file = required_wal_files(record)
        assert stop == segment_name(1, 4, MB)
        names = {segment_name(1, 3, MB), segment_name(1, 4, MB), backup_file}
        self.archive.names |= names - set(skip)

    def wal_arrives(self, **kw):
        def arrive():
            if "b-1" in {r.id for r in self.catalog.list()}:
                record = self.catalog.get("b-1")
                if record.stop_lsn is not None:
                    self.archive_backup_wal(**kw)

        self.archive.arrive = arrive


def make_world(tmp_path=None, *, catalog=None, backend=None):
    backend = backend or MockBackend()
    data = backend.add_volume("data")
    wal = backend.add_volume("wal")
    layout = Layout(
        [
            Volume(data.id, "data", VolumeRole.DATA, "/pg/data"),
            Volume(wal.id, "wal", VolumeRole.WAL, "/pg/wal"),
        ]
    )
    events: list[Event] = []
    db = FakeDb()
    catalog = catalog if catalog is not None else MemoryCatalog()
    archive = FakeArchive()
    ex = Executor(
        adapter=cast(DatabaseAdapter, db),
        backend=backend,
        catalog=catalog,
        archive=archive,
        layout=layout,
        on_event=events.append,
        sleep=lambda s: None,
        journal_dir=None if tmp_path is None else tmp_path / "journal",
    )
    return World(backend, layout, db, catalog, archive, ex, events)


@pytest.fixture
def world():
    return make_world()


@pytest.fixture
def jworld(tmp_path):
    """A world whose executor keeps journals on disk."""
    return make_world(tmp_path)


def backup_plan(world, wal_timeout=0.05, backup_id="b-1"):
    facts = BackupFacts(
        server=world.db.describe(),
        archiver=ARCHIVER,
        layout=world.layout,
        volumes=world.backend.list_volumes(),
        capabilities=world.backend.capabilities,
        catalog=(),
        archive_location="/archive",
        archive_timelines=(1,),
        host="db1",
        volume_facts=directory_volumes(world.layout),
        paths=paths_of(world.db.describe()),
    )
    return plan_backup(facts, BackupRequest(backup_id, "test", wal_timeout=wal_timeout))


# --------------------------------------------------------------------------- test operations

SCRIPT: dict[str, Any] = {}
"""What the test operations do: step id -> exception to raise (or a callable)."""
RAN: list[str] = []
UNDONE: list[str] = []


@attrs.frozen
class Count(Operation):
    name: ClassVar[str] = "test.count"
    target: ClassVar[Target] = Target.HOST
    compensation: ClassVar[str | None] = "test.undo"

    tag: str

    def run(self, ctx: OperationContext) -> Outputs:
        action = SCRIPT.get(self.tag)
        if isinstance(action, BaseException):
            raise action
        if callable(action):
            action(ctx)
        RAN.append(self.tag)
        return {"n": len(RAN)}


@attrs.frozen
class Undo(Operation):
    name: ClassVar[str] = "test.undo"
    target: ClassVar[Target] = Target.HOST

    tag: str
    seen: str | Ref | None = None

    def run(self, ctx: OperationContext) -> Outputs:
        UNDONE.append(self.tag)
        if self.seen is not None:
            UNDONE.append(f"saw {ctx.resolve(self.seen)}")
        action = SCRIPT.get(f"undo-{self.tag}")
        if isinstance(action, BaseException):
            raise action
        return {}


@attrs.frozen
class Barrier(Count):
    name: ClassVar[str] = "test.barrier"
    compensation: ClassVar[str | None] = None
    barrier: ClassVar[bool] = True


@attrs.frozen
class NeedsProcess(Count):
    """Like the backup stop: it needs what only the process that began the run had."""

    name: ClassVar[str] = "test.needs_process"
    compensation: ClassVar[str | None] = None
    resume: ClassVar[Resume] = Resume.ABORT


@pytest.fixture(autouse=True)
def test_operations() -> Iterator[None]:
    registry = default_operations()
    for cls in (Count, Undo, Barrier, NeedsProcess):
        registry.register(cls.name, cls, replace=True)
    SCRIPT.clear()
    RAN.clear()
    UNDONE.clear()
    yield
    for cls in (Count, Undo, Barrier, NeedsProcess):
        registry.unregister(cls.name)


def counting_plan(n=4, *, kind="recovery", barrier_at=None, needs_process_at=None, fp="fp"):
    steps = []
    for i in range(n):
        tag = f"s{i}"
        if i == barrier_at:
            steps.append(Step.of(tag, Barrier(tag), description=f"step {i}", reason="test"))
        elif i == needs_process_at:
            steps.append(Step.of(tag, NeedsProcess(tag), description=f"step {i}", reason="t"))
        else:
            steps.append(
                Step.of(
                    tag,
                    Count(tag),
                    description=f"step {i}",
                    reason="test",
                    undo=Undo(tag, seen=Ref(tag, "n")),
                )
            )
    return Plan(kind, tuple(steps), fp)


def kinds(world):
    return [(e.kind, e.step_id) for e in world.events]


# --------------------------------------------------------------------------- backups


def test_backup_success_records_everything(world):
    world.wal_arrives()
    result = world.ex.run(backup_plan(world))
    rec = world.catalog.get("b-1")
    assert rec.state is BackupState.DONE
    assert rec.labelfile == "START WAL LOCATION: 0/300028\n"
    assert set(rec.snapshots) == {v.id for v in world.layout.snapshotted}
    assert rec.snapshot_group_id
    assert rec.backup_mode_seconds is not None
    assert rec.total_seconds is not None
    assert world.db.log == ["start", "stop"]
    assert [k for k, _ in kinds(world)].count(EventKind.FINISHED) == 7
    assert set(result.seconds) >= {s.id for s in result.plan.steps}


def test_snapshot_failure_leaves_no_backup_mode_no_snapshot_and_a_failed_record(world):
    world.backend.inject_fault(
        "create_snapshot_group", error=errors.BackendUnavailable("array down")
    )
    with pytest.raises(errors.ExecutionError) as info:
        world.ex.run(backup_plan(world))
    err = info.value
    assert isinstance(err.cause, errors.BackendUnavailable)
    assert err.step_id == "snapshot"
    assert err.completed == ("backup-start", "record-start")
    assert err.compensated == ("record-start", "backup-start")  # in the order they ran
    assert world.db.log == ["start", "abort"]
    assert not world.db.in_backup
    assert world.backend.list_snapshots() == ()
    rec = world.catalog.get("b-1")
    assert rec.state is BackupState.FAILED
    assert "snapshot failed" in rec.failure_reason
    assert "array down" in rec.failure_reason


def test_wal_timeout_deletes_the_snapshots_and_names_the_missing_files(world):
    with pytest.raises(errors.ExecutionError) as info:
        world.ex.run(backup_plan(world))
    assert isinstance(info.value.cause, errors.ArchiveError)
    stop, backup_file = required_wal_files(world.catalog.get("b-1"))
    assert info.value.cause.details["missing"] == (stop, backup_file)
    assert world.backend.list_snapshots() == ()
    rec = world.catalog.get("b-1")
    assert rec.state is BackupState.FAILED
    assert rec.labelfile  # the label was kept the moment backup mode ended
    assert (EventKind.COMPENSATED, "snapshot") in kinds(world)


def test_undeletable_snapshots_are_recorded_as_orphans(world):
    world.backend.inject_fault("delete_snapshot_group")
    with pytest.raises(errors.ExecutionError) as info:
        world.ex.run(backup_plan(world))
    rec = world.catalog.get("b-1")
    assert rec.state is BackupState.FAILED
    left = {s.id for s in world.backend.list_snapshots()}
    assert set(rec.orphaned_snapshots) == left and len(left) == 2
    assert set(info.value.leftovers) == left
    assert info.value.compensation_failures and "snapshot" in info.value.compensation_failures[0]
    assert "left behind" in str(info.value)


def test_a_segment_lost_between_start_and_stop_fails_the_backup(world):
    world.wal_arrives(skip={segment_name(1, 3, MB)})
    with pytest.raises(errors.ExecutionError) as info:
        world.ex.run(backup_plan(world))
    assert info.value.cause is not None
    assert info.value.cause.details["missing"] == (segment_name(1, 3, MB),)
    assert world.catalog.get("b-1").state is BackupState.FAILED
    assert world.backend.list_snapshots() == ()


def test_a_backup_is_done_only_once_its_snapshots_are_confirmed(world):
    """The storage loses the group (a policy rotated it out) before the backup is DONE."""

    def arrive_and_lose():
        world.archive.arrive = None
        world.archive_backup_wal()
        world.backend.delete_snapshot_group(world.catalog.get("b-1").snapshot_group_id)

    def arm():
        record = world.catalog.list()[0] if world.catalog.list() else None
        if record is not None and record.stop_lsn is not None:
            arrive_and_lose()

    world.archive.arrive = arm
    with pytest.raises(errors.ExecutionError, match="no longer on the storage") as info:
        world.ex.run(backup_plan(world))
    assert info.value.step_id == "done"
    assert world.catalog.get("b-1").state is BackupState.FAILED


def test_dry_run_touches_nothing(jworld):
    result = jworld.ex.run(backup_plan(jworld), dry_run=True)
    assert result.dry_run
    assert jworld.db.log == []
    assert jworld.catalog.list() == ()
    assert {e.kind for e in jworld.events} == {EventKind.PLANNED}
    assert not (
        jworld.ex.journal_dir
        and jworld.ex.journal_dir.exists()
        and any(jworld.ex.journal_dir.iterdir())
    )


# --------------------------------------------------------------------------- section 1 defects


def test_a_failed_backup_run_again_is_refused_and_never_done(jworld):
    """Defect: a run whose WAL wait timed out (snapshots deleted, FAILED) ran again to DONE."""
    plan = backup_plan(jworld)
    with pytest.raises(errors.ExecutionError):
        jworld.ex.run(plan)
    assert jworld.catalog.get("b-1").state is BackupState.FAILED
    jworld.wal_arrives()  # the WAL would now be there
    with pytest.raises(errors.PlanAlreadyRunError) as info:
        jworld.ex.run(plan)
    assert info.value.state == "compensated"
    assert jworld.catalog.get("b-1").state is BackupState.FAILED
    assert jworld.backend.list_snapshots() == ()
    assert jworld.db.log == ["start", "stop"]  # nothing ran the second time


def test_the_same_backup_id_never_overwrites_a_record_even_without_a_journal(world):
    world.wal_arrives()
    world.ex.run(backup_plan(world))
    done = world.catalog.get("b-1")
    with pytest.raises(errors.ExecutionError, match="already holds a backup"):
        world.ex.run(backup_plan(world))
    assert world.catalog.get("b-1") == done
    assert {s.id for s in world.backend.list_snapshots()} == set(done.snapshots.values())
    assert world.db.log == ["start", "stop", "start", "abort"]


def test_plans_differing_only_in_an_action_have_their_own_journals(jworld):
    """Defect: a 'pause' plan resumed an interrupted 'promote' journal and promoted."""
    promote = counting_plan(fp="same-facts")
    pause = attrs.evolve(promote, request={"action": "pause"})
    assert promote.fingerprint == pause.fingerprint and promote.id != pause.id
    SCRIPT["s2"] = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        jworld.ex.run(promote)
    assert jworld.ex.interrupted() == (promote,)
    SCRIPT.clear()
    directory = jworld.ex.journal_dir
    promote_journal = journal_path(directory, "recovery", promote.id)
    # Issue 19: another plan does not run over an interrupted one; the error names it.
    with pytest.raises(errors.ClusterLockedError) as refused:
        jworld.ex.run(pause)
    assert refused.value.interrupted == (str(promote_journal),)
    assert refused.value.hint is not None
    assert "pgsnap resume" in refused.value.hint
    view = read_journal(promote_journal)  # the other run is left as it was
    assert view is not None
    assert view.plan_id == promote.id and view.state is RunState.RUNNING
    assert not journal_path(directory, "recovery", pause.id).exists()
    assert jworld.ex.run(promote).resumed  # finished: now the other plan may run
    result = jworld.ex.run(pause)
    assert not result.resumed  # a fresh run of its own: nothing skipped
    assert EventKind.SKIPPED not in {e.kind for e in jworld.events[-8:]}
    assert promote_journal != journal_path(directory, "recovery", pause.id)


def test_looking_for_interrupted_plans_never_takes_a_journal_lock(jworld, monkeypatch):
    """Defect: the check took the plan's lock, so a run starting meanwhile failed.

    The interleaving is injected: while the check talks to the kernel about the
    journal, another process's run takes the lock. It must get it.
    """
    import pgsnap._journal as journal_module

    plan = counting_plan()
    SCRIPT["s1"] = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        jworld.ex.run(plan)
    path = journal_path(jworld.ex.journal_dir, plan.kind, plan.id)
    real_fcntl = fcntl.fcntl
    grabbed = []

    def interleaved(fd, cmd, arg=0):
        answer = real_fcntl(fd, cmd, arg)
        if cmd == fcntl.F_OFD_GETLK:  # mid-check: a concurrent run starts now
            other = os.open(path, os.O_RDWR)
            try:
                grabbed.append(journal_module._try_lock(other))
            finally:
                os.close(other)
        return answer

    monkeypatch.setattr(fcntl, "fcntl", interleaved)  # the module pgsnap._journal calls
    assert jworld.ex.interrupted() == (plan,)
    assert grabbed == [True]


def test_a_plan_being_run_is_neither_interrupted_nor_runnable_twice(jworld):
    """A run in progress holds its journal: others see it as running, not interrupted."""
    plan = counting_plan()
    seen: dict[str, Any] = {}

    def meanwhile(ctx):
        seen["interrupted"] = jworld.ex.interrupted()
        with pytest.raises(errors.PlanLockedError) as info:
            make_world(jworld.ex.journal_dir.parent).ex.run(plan)
        seen["locked"] = info.value

    SCRIPT["s2"] = meanwhile
    jworld.ex.run(plan)
    assert seen["interrupted"] == ()
    assert seen["locked"].retryable and seen["locked"].step_id == ""


def test_a_misspelled_compensation_is_refused_when_the_plan_is_built_or_loaded():
    """Defect: a misspelled compensation surfaced only at rollback, as a swallowed failure."""
    good = counting_plan(2)
    bad_step = attrs.evolve(good.steps[0], compensation="test.undoo")
    with pytest.raises(errors.InvalidPlanError, match=r"test\.undoo") as info:
        Plan("recovery", (bad_step,), "fp")
    assert info.value.step_id == "s0"
    data = good.to_dict()
    data["steps"][1]["compensation"] = "storage.delete_snapshot_grup"
    del data["id"]
    with pytest.raises(errors.InvalidPlanError, match="delete_snapshot_grup"):
        Plan.from_dict(data)
    wrong = attrs.evolve(good.steps[0], compensation="db.stop_server", compensation_params={})
    with pytest.raises(errors.InvalidPlanError, match=r"undone by test\.undo"):
        Plan("recovery", (wrong,), "fp")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"action": "nobody.knows"}, r"nobody\.knows"),
        ({"params": {"tag": "s0", "typo": 1}}, "typo"),
        ({"params": {}}, "needs parameter 'tag'"),
        ({"params": {"tag": 7}}, "expected a string"),
        ({"compensation_params": {"tag": "s0", "seen": {"$ref": ["s9", "n"]}}}, "s9"),
    ],
)
def test_plans_that_cannot_run_are_refused_when_built(change, match):
    step = attrs.evolve(counting_plan(1).steps[0], **change)
    with pytest.raises(errors.InvalidPlanError, match=match):
        Plan("recovery", (step,), "fp")


def test_old_and_edited_plans_are_refused_when_loaded():
    plan = counting_plan(2)
    data = plan.to_dict()
    with pytest.raises(errors.FormatError, match="older pgsnap"):
        Plan.from_dict({**data, "format_version": "1.0"})
    edited = {**data, "summary": {"backup": "another"}}
    with pytest.raises(errors.FormatError, match="does not match its id"):
        Plan.from_dict(edited)
    # Issue 19: removing the id no longer lets an edited plan in.
    with pytest.raises(errors.FormatError, match='no "id"'):
        Plan.from_dict({k: v for k, v in edited.items() if k != "id"})
    assert Plan.from_json(plan.to_json()) == plan


def test_verify_checks_how_far_recovery_replayed(world):
    """Defect: verify's description promised a min_replay_lsn check it never made."""
    world.db.in_recovery, world.db.timeline = False, 2
    verify = VerifyRecovery(action=RecoveryAction.PROMOTE, min_replay_lsn=STOP_LSN, min_timeline=2)
    plan = Plan("recovery", (Step.of("verify", verify, description="v", reason="r"),), "fp")
    world.db.replay_lsn = STOP_LSN - 8
    with pytest.raises(errors.ExecutionError, match="replayed only to") as info:
        world.ex.run(plan)
    assert info.value.step_id == "verify"
    world.db.replay_lsn = STOP_LSN
    result = world.ex.run(plan)
    assert result.outputs["verify"]["replay_checked"] is True
    # After a shutdown the wait step's outcome says how far replay went.
    world.db.running = False
    shutdown = VerifyRecovery(
        action=RecoveryAction.SHUTDOWN, min_replay_lsn=STOP_LSN, wait_step="w"
    )
    steps = (
        Step.of("w", Count("w"), description="w", reason="r"),
        Step.of("v", shutdown, description="v", reason="r"),
    )
    SCRIPT["w"] = lambda ctx: None
    result = world.ex.run(Plan("recovery", steps, "fp2"))
    assert result.outputs["v"]["replay_checked"] is False  # unknown: said, not passed off


# --------------------------------------------------------------------------- undo and resume


def test_failure_undoes_in_reverse_and_every_compensation_runs(jworld):
    SCRIPT["s3"] = errors.BackendError("boom")
    SCRIPT["undo-s1"] = RuntimeError("undo failed")
    plan = counting_plan()
    with pytest.raises(errors.ExecutionError) as info:
        jworld.ex.run(plan)
    assert [u for u in UNDONE if not u.startswith("saw")] == ["s2", "s1", "s0"]
    assert "saw 3" in UNDONE  # a compensation sees the outputs of the step it undoes
    err = info.value
    assert err.step_id == "s3" and isinstance(err.cause, errors.BackendError)
    assert err.completed == ("s0", "s1", "s2")
    assert err.compensated == ("s2", "s0")
    assert err.compensation_failures == ("s1: RuntimeError: undo failed",)
    assert (EventKind.COMPENSATION_FAILED, "s1") in kinds(jworld)
    view = read_journal(journal_path(jworld.ex.journal_dir, plan.kind, plan.id))
    assert view is not None
    assert view.state is RunState.FAILED
    assert view.steps["s2"].state is StepState.COMPENSATED  # compensated steps: their own state
    assert view.steps["s1"].state is StepState.COMPENSATION_FAILED
    assert view.steps["s3"].state is StepState.FAILED
    with pytest.raises(errors.PlanAlreadyRunError):
        jworld.ex.run(plan)


def test_nothing_is_undone_past_the_point_of_no_return(jworld):
    SCRIPT["s3"] = errors.DatabaseError("recovery failed")
    plan = counting_plan(4, barrier_at=2)
    assert plan.point_of_no_return == "s2"
    assert "point of no return" in plan.explain()
    with pytest.raises(errors.ExecutionError, match="point of no return") as info:
        jworld.ex.run(plan)
    assert UNDONE == []
    assert info.value.past_point_of_no_return
    view = read_journal(journal_path(jworld.ex.journal_dir, plan.kind, plan.id))
    assert view is not None
    assert view.state is RunState.FAILED


def test_a_failure_before_the_barrier_is_undone(jworld):
    SCRIPT["s1"] = errors.BackendError("boom")
    with pytest.raises(errors.ExecutionError) as info:
        jworld.ex.run(counting_plan(4, barrier_at=2))
    assert not info.value.past_point_of_no_return
    assert [u for u in UNDONE if not u.startswith("saw")] == ["s0"]


def test_foreign_exceptions_are_wrapped(world):
    SCRIPT["s0"] = ZeroDivisionError("division by zero")
    with pytest.raises(errors.ExecutionError) as info:
        world.ex.run(counting_plan())
    assert info.value.step_id == "s0"
    assert info.value.cause is None
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_broken_event_callback_does_not_break_a_run(world):
    world.ex.on_event = lambda e: 1 / 0
    assert world.ex.run(counting_plan()).outputs


def test_journal_resume_skips_done_steps_and_a_done_run_is_not_run_again(jworld):
    SCRIPT["s2"] = KeyboardInterrupt()
    plan = counting_plan()
    with pytest.raises(KeyboardInterrupt):
        jworld.ex.run(plan)
    assert RAN == ["s0", "s1"]
    assert UNDONE == []  # an interruption is not a failure: nothing is undone
    view = read_journal(journal_path(jworld.ex.journal_dir, plan.kind, plan.id))
    assert view is not None
    assert view.steps["s1"].state is StepState.DONE
    assert view.steps["s2"].state is StepState.RUNNING
    SCRIPT.clear()
    result = jworld.ex.run(plan)
    assert result.resumed
    assert RAN == ["s0", "s1", "s2", "s3"]
    assert result.outputs["s0"] == {"n": 1}  # outputs restored from the journal
    assert [s for k, s in kinds(jworld) if k is EventKind.SKIPPED] == ["s0", "s1"]
    with pytest.raises(errors.PlanAlreadyRunError) as info:
        jworld.ex.run(plan)
    assert info.value.state == "done"


def test_every_journal_record_is_on_disk_before_the_next_step_acts(jworld, monkeypatch):
    """A step's end is fsynced with the next record (issue 27: one fsync a step, not
    two): when a step runs, all the journal says so far is durable, and so is the
    run's end."""
    real_fsync = os.fsync
    synced: dict[int, int] = {}  # fd -> the file's size at its last fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        synced[fd] = os.fstat(fd).st_size

    monkeypatch.setattr(os, "fsync", fsync)
    plan = counting_plan(4)
    path = journal_path(jworld.ex.journal_dir, plan.kind, plan.id)
    durable_at_step: list[bool] = []

    def check(ctx: OperationContext) -> None:
        size = path.stat().st_size
        durable_at_step.append(size > 0 and size in synced.values())

    for i in range(4):
        SCRIPT[f"s{i}"] = check
    jworld.ex.run(plan)
    assert durable_at_step == [True] * 4
    assert list(synced.values()) == [path.stat().st_size]  # the run's end, synced
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", calls.append)
    RAN.clear()
    jworld.ex.run(counting_plan(4, fp="other"))
    assert len(calls) == 4 + 1  # each step's start (with the end before it), the run's end


def test_ctrl_c_before_a_step_that_cannot_resume_undoes_at_once(jworld):
    SCRIPT["s1"] = KeyboardInterrupt()
    plan = counting_plan(4, needs_process_at=2)
    with pytest.raises(KeyboardInterrupt):
        jworld.ex.run(plan)
    assert [u for u in UNDONE if not u.startswith("saw")] == ["s0"]
    assert jworld.ex.interrupted() == ()


def test_stale_plan_refused_and_no_journal_left(jworld):
    def stale(plan):
        raise errors.StalePlanError("facts changed")

    jworld.ex.check_fresh = stale
    with pytest.raises(errors.StalePlanError):
        jworld.ex.run(backup_plan(jworld))
    assert jworld.db.log == []
    assert list(jworld.ex.journal_dir.iterdir()) == []


def test_outputs_must_be_plain_data(world):
    SCRIPT["s0"] = lambda ctx: None

    @attrs.frozen
    class Bad(Count):
        name: ClassVar[str] = "test.bad"

        def run(self, ctx):
            return {"when": NOW}

    default_operations().register("test.bad", Bad, replace=True)
    try:
        plan = Plan("recovery", (Step.of("b", Bad("b"), description="b", reason="r"),), "f")
        with pytest.raises(errors.ExecutionError, match="not plain JSON"):
            world.ex.run(plan)
    finally:
        default_operations().unregister("test.bad")


# --------------------------------------------------------------------------- interrupted backups


def test_ctrl_c_before_backup_stop_cleans_up_at_once(jworld):
    jworld.db.backup_session = lambda: InterruptingSession(jworld.db)
    with pytest.raises(KeyboardInterrupt):
        jworld.ex.run(backup_plan(jworld))
    assert not jworld.db.in_backup
    assert jworld.backend.list_snapshots() == ()
    assert jworld.catalog.get("b-1").state is BackupState.FAILED
    assert jworld.ex.interrupted() == ()


class InterruptingSession(FakeSession):
    def stop(self):
        raise KeyboardInterrupt


def test_backup_interrupted_while_waiting_for_wal_resumes(jworld):
    plan = backup_plan(jworld)

    def interrupt():
        raise KeyboardInterrupt

    jworld.archive.arrive = interrupt
    with pytest.raises(KeyboardInterrupt):
        jworld.ex.run(plan)
    assert jworld.catalog.get("b-1").state is BackupState.WAITING_FOR_WAL
    assert jworld.ex.interrupted() == (plan,)
    jworld.wal_arrives()
    result = jworld.ex.run(jworld.ex.interrupted()[0])
    assert result.resumed
    assert jworld.catalog.get("b-1").state is BackupState.DONE
    assert len(jworld.backend.list_snapshots()) == 2
    assert jworld.ex.interrupted() == ()


def test_a_killed_backup_is_cleaned_up_including_unjournalled_snapshots(tmp_path, monkeypatch):
    """The process dies right after the storage made the group, before the journal knew."""
    from pgsnap.operations.storage import TakeSnapshotGroup

    state = tmp_path / "mock.json"
    backend = MockBackend(state_file=state, root=tmp_path / "snaps")
    world = make_world(tmp_path, catalog=DirectoryCatalog(tmp_path / "catalog"), backend=backend)
    plan = backup_plan(world)
    real_run = TakeSnapshotGroup.run

    def snapshot_then_die(self, ctx):
        real_run(self, ctx)
        os._exit(0)  # killed: no journal entry, no catalog update

    monkeypatch.setattr(TakeSnapshotGroup, "run", snapshot_then_die)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child dies inside
        try:
            world.ex.run(plan)
        finally:
            os._exit(1)
    os.waitpid(pid, 0)
    monkeypatch.setattr(TakeSnapshotGroup, "run", real_run)

    survivor = MockBackend(state_file=state)  # a new process's view of the storage
    assert len(survivor.list_snapshots()) == 2
    assert world.catalog.get("b-1").snapshots == {}  # the catalog never heard of them
    ex = attrs.evolve(world, backend=survivor).ex
    ex.backend = survivor
    (pending,) = ex.interrupted()
    assert pending == plan
    with pytest.raises(errors.ExecutionError, match="cannot run in another process") as info:
        ex.run(pending)
    assert info.value.step_id == "backup-stop"
    assert survivor.list_snapshots() == ()
    record = world.catalog.get("b-1")
    assert record.state is BackupState.FAILED
    assert "interrupted" in record.failure_reason
    assert (EventKind.ADOPTED, "snapshot") in kinds(world)


def test_backup_list_renders_for_notebooks():
    from pgsnap.cluster import BackupList
    from tests.unit.test_model import _record

    backups = BackupList(
        [
            _record(id="b-1"),
            _record(id="b-<2>", state=BackupState.FAILED, failure_reason="array down"),
        ]
    )
    assert isinstance(backups, tuple)
    assert backups[0].id == "b-1"
    html = backups._repr_html_()
    assert "<td>b-&lt;2&gt;</td>" in html  # escaped
    assert "failed (array down)" in html
    assert repr(backups) == "<BackupList 2 backups>"


# --------------------------------------------------------------------------- issue 19


def test_a_journal_removed_during_the_run_is_written_again_and_reported(jworld, caplog):
    """Issue 19: deleting the journal directory during a run went unreported, and the
    run could then not be resumed after an interruption."""
    import shutil

    plan = counting_plan(4)
    directory = jworld.ex.journal_dir
    SCRIPT["s1"] = lambda ctx: shutil.rmtree(directory)
    SCRIPT["s2"] = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        jworld.ex.run(plan)
    assert "was removed while its run goes on" in caplog.text
    view = read_journal(journal_path(directory, plan.kind, plan.id))
    assert view is not None
    assert view.state is RunState.RUNNING
    assert [sid for sid, r in view.steps.items() if r.state is StepState.DONE] == ["s0", "s1"]
    SCRIPT.clear()
    result = jworld.ex.run(plan)  # resumed from the journal written again
    assert result.resumed
    assert [(e.kind, e.step_id) for e in jworld.events[-4:]] == [
        (EventKind.STARTED, "s2"),
        (EventKind.FINISHED, "s2"),
        (EventKind.STARTED, "s3"),
        (EventKind.FINISHED, "s3"),
    ]


def test_a_run_is_refused_at_once_while_another_process_holds_the_cluster(jworld):
    """The executor takes the cluster lock before anything; a second run is refused
    with the holder named, before its first step, leaving no journal."""
    from pgsnap.locks import LockHolder

    lock = jworld.ex.lock
    assert lock is not None  # the journal directory's, with an in-memory catalog
    other = LockHolder("recovery", "e" * 64, 4242, "db9", NOW)
    with lock.acquire(other):
        with pytest.raises(errors.ClusterLockedError) as info:
            jworld.ex.run(counting_plan(2))
        assert "pid 4242 on db9" in str(info.value)
        assert jworld.events == []
        assert list(jworld.ex.journal_dir.glob("*.journal")) == []
    assert jworld.ex.run(counting_plan(2)).total_seconds >= 0


def test_prechecks_run_before_the_first_step(world):
    """A step whose invariant does not hold refuses the run before any step starts."""

    @attrs.frozen
    class Picky(Operation):
        name: ClassVar[str] = "test.picky"
        target: ClassVar[Target] = Target.HOST

        def precheck(self, ctx, plan):
            raise self.mismatch(ctx, "not what the plan says", "make a new plan")

        def run(self, ctx):
            raise AssertionError("never run")

    default_operations().register(Picky.name, Picky, replace=True)
    try:
        plan = Plan(
            "recovery",
            (
                Step.of("a", Count("a"), description="a", reason="r"),
                Step.of("b", Picky(), description="b", reason="r"),
            ),
            "fp-p",
        )
        with pytest.raises(errors.InvariantError, match="not what the plan says") as info:
            world.ex.run(plan)
    finally:
        default_operations().unregister(Picky.name)
    assert info.value.step_id == "b"
    assert world.events == [] and "a" not in RAN


def test_the_server_starts_on_restored_volumes_only_after_label_and_settings():
    """Issue 19: dropping both the restore and the label step of a recovery plan reached
    the point of no return (PostgreSQL started on whatever the volumes held)."""
    from types import SimpleNamespace

    from pgsnap.operations.base import PlanView
    from pgsnap.operations.db import (
        StartServer,
        WriteBackupLabel,
        WriteRecoverySettings,
    )
    from pgsnap.operations.storage import RestoreVolume

    restore = ("restore", RestoreVolume(volume_id="v", snapshot_id="s", backup_id="b"), None)
    label = ("label", WriteBackupLabel(backup_id="b", label_sha256="0" * 64), None)
    settings = ("settings", WriteRecoverySettings(recovery_target=RecoveryTarget.immediate()), None)
    start = ("start", StartServer(), None)
    ctx: Any = SimpleNamespace(step_id="start")

    def check(*steps: Any) -> None:
        StartServer().precheck(ctx, PlanView(tuple(steps)))

    check(start)  # a plain start
    check(restore, label, settings, start)
    for steps, missing in [
        ((restore, start), "a backup label and recovery settings"),
        ((settings, start), "a backup label"),
        ((restore, settings, start), "a backup label"),
        ((restore, label, start), "recovery settings"),
        ((label, settings, restore, start), "a backup label and recovery settings"),
    ]:
        with pytest.raises(errors.InvariantError, match=f"without first writing {missing} "):
            check(*steps)
