"""The executor against the mock backend and a scripted database adapter.

These test the executor's own guarantees (compensation, FAILED records,
orphans, journal and resume, dry run, staleness, events). Real backups and
recoveries are proven in tests/e2e against real PostgreSQL servers.
"""

import datetime as dt
import json

import attrs
import pytest

from pgsnap import errors
from pgsnap.backends.mock import MockBackend
from pgsnap.catalog import MemoryCatalog
from pgsnap.executor import EventKind, Executor, required_wal_files
from pgsnap.model import (
    LSN,
    BackupStart,
    BackupState,
    BackupStop,
    Layout,
    ServerFacts,
    Volume,
    VolumeRole,
)
from pgsnap.plan import Plan, Step
from pgsnap.planner.backup import BackupRequest, plan_backup
from pgsnap.planner.facts import BackupFacts
from pgsnap.wal import ArchiveIndex, TimelineGraph, segment_name
from tests.unit.test_planner_backup import ARCHIVER

MB = 1 << 20
NOW = dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC)


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
        return BackupStop(LSN(4 * MB + 0x100), "START WAL LOCATION: 0/300028\n", "", NOW, 1)

    def close(self):
        if self.db.in_backup:
            self.db.log.append("abort")
        self.db.in_backup = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class FakeDb:
    """Enough of a DatabaseAdapter for the executor's backup path."""

    def __init__(self):
        self.in_backup = False
        self.log = []

    def describe(self):
        return ServerFacts(
            version_num=150018, system_identifier="1", data_directory="/pg/data",
            wal_directory="/pg/wal", wal_segment_size=MB, timeline=1, checkpoint_lsn="0/1",
            redo_lsn="0/1", current_lsn="0/1", in_recovery=False,
            settings={"wal_level": "replica"},
        )

    def archiver_status(self):
        return ARCHIVER

    def backup_session(self):
        return FakeSession(self)


class FakeArchive:
    """A WAL archive whose files appear when the test says so."""

    def __init__(self, names=()):
        self.names = set(names)
        self.location = "/archive"

    def list_names(self):
        return tuple(sorted(self.names))

    def exists(self, name):
        return name in self.names

    def read_text(self, name):
        raise NotImplementedError

    def index(self, segment_size):
        return ArchiveIndex.build(self.names, segment_size)

    def histories(self):
        return TimelineGraph()

    def restore_command(self):
        return "cp /archive/%f %p"


@pytest.fixture
def world():
    backend = MockBackend()
    data = backend.add_volume("data")
    wal = backend.add_volume("wal")
    layout = Layout([Volume(data.id, "data", VolumeRole.DATA, "/pg/data"),
                     Volume(wal.id, "wal", VolumeRole.WAL, "/pg/wal")])
    events = []
    db = FakeDb()
    catalog = MemoryCatalog()
    archive = FakeArchive()
    ex = Executor(adapter=db, backend=backend, catalog=catalog, archive=archive, layout=layout,
                  on_event=events.append, sleep=lambda s: None)
    return attrs.make_class("World", ["backend", "layout", "db", "catalog", "archive", "ex",
                                      "events"])(backend, layout, db, catalog, archive, ex, events)


def backup_plan(world, wal_timeout=0.05):
    facts = BackupFacts(
        server=world.db.describe(), archiver=ARCHIVER, layout=world.layout,
        volumes=world.backend.list_volumes(), capabilities=world.backend.capabilities,
        catalog=(), archive_location="/archive", archive_timelines=(1,),
    )
    return plan_backup(facts, BackupRequest("b-1", "test", wal_timeout=wal_timeout))


def archive_backup_wal(world):
    record = world.catalog.get("b-1")
    stop, backup_file = required_wal_files(record)
    world.archive.names |= {segment_name(1, 3, MB), segment_name(1, 4, MB), backup_file}
    assert stop == segment_name(1, 4, MB)


def test_backup_success_records_everything(world):
    plan = backup_plan(world)
    world.ex.register("archive.wait_for_wal", _arrive_then(world))
    result = world.ex.run(plan)
    rec = world.catalog.get("b-1")
    assert rec.state is BackupState.DONE
    assert rec.labelfile == "START WAL LOCATION: 0/300028\n"
    assert set(rec.snapshots) == {v.id for v in world.layout.snapshotted}
    assert rec.backup_mode_seconds is not None
    assert rec.total_seconds is not None
    assert world.db.log == ["start", "stop"]
    assert [e.kind for e in world.events].count(EventKind.FINISHED) == 5
    assert set(result.seconds) >= {s.id for s in plan.steps}


def _arrive_then(world):
    from pgsnap.executor import _h_wait_for_wal

    def handler(ctx, step, params):
        archive_backup_wal(world)
        return _h_wait_for_wal(ctx, step, params)

    return handler


def test_snapshot_failure_leaves_no_backup_mode_no_snapshot_and_a_failed_record(world):
    world.backend.inject_fault("create_snapshot_group", error=errors.BackendUnavailable("array down"))
    with pytest.raises(errors.BackendUnavailable):
        world.ex.run(backup_plan(world))
    assert world.db.log == ["start", "abort"]
    assert not world.db.in_backup
    assert world.backend.list_snapshots() == ()
    rec = world.catalog.get("b-1")
    assert rec.state is BackupState.FAILED
    assert "snapshot failed" in rec.failure_reason
    assert "array down" in rec.failure_reason


def test_wal_timeout_deletes_the_snapshots_and_names_the_missing_files(world):
    with pytest.raises(errors.ArchiveError) as info:
        world.ex.run(backup_plan(world))
    stop, backup_file = required_wal_files(world.catalog.get("b-1"))
    assert info.value.missing == (stop, backup_file)
    assert world.backend.list_snapshots() == ()
    rec = world.catalog.get("b-1")
    assert rec.state is BackupState.FAILED
    assert rec.labelfile  # the label was kept the moment backup mode ended
    kinds = [(e.kind, e.step_id) for e in world.events]
    assert (EventKind.COMPENSATED, "snapshot") in kinds


def test_undeletable_snapshots_are_recorded_as_orphans(world):
    world.backend.inject_fault("delete_snapshot_group")
    with pytest.raises(errors.ArchiveError):
        world.ex.run(backup_plan(world))
    rec = world.catalog.get("b-1")
    assert rec.state is BackupState.FAILED
    assert set(rec.orphaned_snapshots) == {s.id for s in world.backend.list_snapshots()}
    assert len(rec.orphaned_snapshots) == 2


def test_dry_run_touches_nothing(world):
    result = world.ex.run(backup_plan(world), dry_run=True)
    assert result.dry_run
    assert world.db.log == []
    assert world.catalog.list() == ()
    assert {e.kind for e in world.events} == {EventKind.PLANNED}


def test_unknown_action_is_refused_before_anything_runs(world):
    plan = Plan("custom", (Step("x", "nobody.knows", "x", "x"),), "fp")
    with pytest.raises(errors.ExecutionError, match=r"nobody\.knows"):
        world.ex.run(plan)


def test_stale_plan_refused(world):
    def stale(plan):
        raise errors.StalePlanError("facts changed")

    world.ex.check_fresh = stale
    with pytest.raises(errors.StalePlanError):
        world.ex.run(backup_plan(world))
    assert world.db.log == []


def _counting_plan():
    steps = [Step(f"s{i}", "test.count", f"step {i}", "test",
                  compensation="test.undo") for i in range(4)]
    return Plan("recovery", tuple(steps), "fp-count")


def test_journal_resume_skips_done_steps(world, tmp_path):
    ran, undone = [], []
    world.ex.journal_dir = tmp_path
    crash = {"at": "s2"}

    def count(ctx, step, params):
        if step.id == crash["at"]:
            raise KeyboardInterrupt  # the process is interrupted here
        ran.append(step.id)
        return {"n": len(ran)}

    world.ex.register("test.count", count)
    world.ex.register("test.undo", lambda ctx, step, p: undone.append(step.id) or {})
    with pytest.raises(KeyboardInterrupt):
        world.ex.run(_counting_plan())
    assert ran == ["s0", "s1"]
    assert undone == []  # an interruption is not a failure: nothing is undone
    journal = json.loads((tmp_path / "recovery-fp-count.json").read_text())
    assert journal["steps"]["s1"]["state"] == "done"
    crash["at"] = None
    result = world.ex.run(_counting_plan())
    assert result.resumed
    assert ran == ["s0", "s1", "s2", "s3"]
    assert result.outputs["s0"] == {"n": 1}  # outputs restored from the journal
    assert [e.step_id for e in world.events if e.kind is EventKind.SKIPPED] == ["s0", "s1"]
    # once done, a new run of the same plan starts afresh
    world.ex.run(_counting_plan())
    assert ran[-4:] == ["s0", "s1", "s2", "s3"]


def test_failure_compensates_in_reverse_and_every_compensation_runs(world, tmp_path):
    undone = []

    def count(ctx, step, params):
        if step.id == "s3":
            raise errors.BackendError("boom")
        return {}

    def undo(ctx, step, params):
        undone.append(step.id)
        if step.id == "s1":
            raise RuntimeError("undo failed")
        return {}

    world.ex.register("test.count", count)
    world.ex.register("test.undo", undo)
    with pytest.raises(errors.BackendError):
        world.ex.run(_counting_plan())
    assert undone == ["s2", "s1", "s0"]
    kinds = [e.kind for e in world.events]
    assert EventKind.COMPENSATION_FAILED in kinds


def test_foreign_exceptions_are_wrapped(world):
    world.ex.register("test.count", lambda ctx, step, p: 1 / 0)
    world.ex.register("test.undo", lambda ctx, step, p: {})
    with pytest.raises(errors.ExecutionError) as info:
        world.ex.run(_counting_plan())
    assert info.value.step_id == "s0"
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_broken_event_callback_does_not_break_a_run(world):
    world.ex.on_event = lambda e: 1 / 0
    world.ex.register("test.count", lambda ctx, step, p: {})
    world.ex.register("test.undo", lambda ctx, step, p: {})
    assert world.ex.run(_counting_plan()).outputs


def test_a_segment_lost_between_start_and_stop_fails_the_backup(world):
    from pgsnap.executor import _h_wait_for_wal

    def arrive_without_start_segment(ctx, step, params):
        archive_backup_wal(world)
        world.archive.names.discard(segment_name(1, 3, MB))
        return _h_wait_for_wal(ctx, step, params)

    world.ex.register("archive.wait_for_wal", arrive_without_start_segment)
    with pytest.raises(errors.ArchiveError) as info:
        world.ex.run(backup_plan(world))
    assert info.value.missing == (segment_name(1, 3, MB),)
    assert world.catalog.get("b-1").state is BackupState.FAILED
    assert world.backend.list_snapshots() == ()


# --------------------------------------------------------------------------- interrupted backups


def test_ctrl_c_before_backup_stop_cleans_up_at_once(world, tmp_path):
    world.ex.journal_dir = tmp_path

    def interrupt(ctx, step, params):
        raise KeyboardInterrupt

    world.ex.register("db.backup_stop", interrupt)
    with pytest.raises(KeyboardInterrupt):
        world.ex.run(backup_plan(world))
    assert not world.db.in_backup
    assert world.backend.list_snapshots() == ()
    assert world.catalog.get("b-1").state is BackupState.FAILED
    assert world.ex.interrupted() == ()


def test_backup_interrupted_while_waiting_for_wal_resumes(world, tmp_path):
    from pgsnap.executor import _h_wait_for_wal

    world.ex.journal_dir = tmp_path
    plan = backup_plan(world)

    def interrupt(ctx, step, params):
        raise KeyboardInterrupt

    world.ex.register("archive.wait_for_wal", interrupt)
    with pytest.raises(KeyboardInterrupt):
        world.ex.run(plan)
    assert world.catalog.get("b-1").state is BackupState.WAITING_FOR_WAL
    assert world.ex.interrupted() == (plan,)

    def arrive(ctx, step, params):
        archive_backup_wal(world)
        return _h_wait_for_wal(ctx, step, params)

    world.ex.register("archive.wait_for_wal", arrive)
    result = world.ex.run(world.ex.interrupted()[0])
    assert result.resumed
    assert world.catalog.get("b-1").state is BackupState.DONE
    assert len(world.backend.list_snapshots()) == 2
    assert world.ex.interrupted() == ()


def test_a_killed_backup_is_cleaned_up_including_unjournalled_snapshots(tmp_path):
    """The process dies right after the storage made the group, before the journal knew."""
    import os

    from pgsnap.catalog import DirectoryCatalog
    from pgsnap.executor import _h_snapshot_group

    state = tmp_path / "mock.json"
    backend = MockBackend(state_file=state, root=tmp_path / "snaps")
    data, wal = backend.add_volume("data"), backend.add_volume("wal")
    layout = Layout([Volume(data.id, "data", VolumeRole.DATA, "/pg/data"),
                     Volume(wal.id, "wal", VolumeRole.WAL, "/pg/wal")])
    db, catalog = FakeDb(), DirectoryCatalog(tmp_path / "catalog")

    def executor(backend):
        return Executor(adapter=db, backend=backend, catalog=catalog, archive=FakeArchive(),
                        layout=layout, journal_dir=tmp_path / "journal", sleep=lambda s: None)

    ex = executor(backend)
    facts = BackupFacts(server=db.describe(), archiver=ARCHIVER, layout=layout,
                        volumes=backend.list_volumes(), capabilities=backend.capabilities,
                        catalog=(), archive_location="/archive", archive_timelines=(1,))
    plan = plan_backup(facts, BackupRequest("b-1", "test"))

    def snapshot_then_die(ctx, step, params):
        ctx.backend.create_snapshot_group(list(params["volume_ids"]), str(params["name"]))
        os._exit(0)  # killed: no journal entry, no catalog update

    ex.register("storage.snapshot_group", snapshot_then_die)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child dies inside
        try:
            ex.run(plan)
        finally:
            os._exit(1)
    os.waitpid(pid, 0)

    survivor = MockBackend(state_file=state)  # a new process's view of the storage
    assert len(survivor.list_snapshots()) == 2
    assert catalog.get("b-1").snapshots == {}  # the catalog never heard of them
    ex = executor(survivor)
    ex.register("storage.snapshot_group", _h_snapshot_group)
    (pending,) = ex.interrupted()
    with pytest.raises(errors.ExecutionError, match="cleaned up"):
        ex.run(pending)
    assert survivor.list_snapshots() == ()
    assert catalog.get("b-1").state is BackupState.FAILED


def test_one_process_at_a_time_per_plan(world, tmp_path):
    import fcntl
    import os

    world.ex.journal_dir = tmp_path
    plan = backup_plan(world)
    lock = tmp_path / f"backup-{plan.fingerprint[:20]}.json.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(errors.ExecutionError, match="another process"):
            world.ex.run(plan)
    finally:
        os.close(fd)
    assert world.db.log == []


def test_backup_list_renders_for_notebooks():
    from pgsnap.session import BackupList
    from tests.unit.test_model import _record

    backups = BackupList([_record(id="b-1"), _record(id="b-<2>", state=BackupState.FAILED,
                                                     failure_reason="array down")])
    assert isinstance(backups, tuple)
    assert backups[0].id == "b-1"
    html = backups._repr_html_()
    assert "<td>b-&lt;2&gt;</td>" in html  # escaped
    assert "failed (array down)" in html
    assert repr(backups) == "<BackupList 2 backups>"
