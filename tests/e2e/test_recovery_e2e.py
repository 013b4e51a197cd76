"""Recovery, tested by recovering: a real PostgreSQL (the system's 15) under pgsnap.

Each test writes numbered batches of rows around a snapshot backup (mock
backend, directory volumes), breaks something, plans and executes a recovery
through :class:`~pgsnap.cluster.Cluster`, and checks WHICH ROWS EXIST in the
recovered server. Refused plans are checked to touch nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from pgsnap.errors import (
    BackendUnavailable,
    ExecutionError,
    InputError,
    NoBackupForTarget,
    PlanAlreadyRunError,
    PlanningError,
    StalePlanError,
    TargetOutOfRange,
    WalGapError,
)
from pgsnap.executor import Event, EventKind
from pgsnap.model import LSN, BackupState, RecoveryTarget, VolumeRole

from .conftest import Env, assert_not_in_backup_mode, backed_up, count_listings, pitr_setup

pytestmark = pytest.mark.postgres


@pytest.fixture(params=["directories", "block"])
def volume_mode(request: pytest.FixtureRequest) -> str:
    """Recoveries run with directory volumes and with simulated block devices; tests of
    planning alone, and most point-in-time targets, on directories only."""
    return str(request.param)


DATA = VolumeRole.DATA
WAL = VolumeRole.WAL


def recover(env: Env, target: RecoveryTarget | None = None, **kwargs: Any) -> Any:
    plan = env.cluster.plan_recovery(target, **kwargs)
    result = env.cluster.execute(plan)
    assert not env.server.sql("SELECT pg_is_in_recovery()")[0][0]
    return result


# --------------------------------------------------------------------------- (a)


def test_complete_recovery_keeps_unarchived_wal(e2e_env: Any) -> None:
    env: Env = e2e_env()
    backed_up(env)
    env.write(2)
    env.switch_wal()  # batch 2 is archived
    env.write(3)  # batch 3 is only in pg_wal: never archived
    current = env.server.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")[0][0]
    env.crash()
    assert not (env.archive_dir / current).exists()
    env.lose_data()

    plan = env.cluster.plan_recovery(RecoveryTarget.latest(), lost=[DATA])
    restored = [s.params["volume_id"] for s in plan.steps if s.id.startswith("restore-")]
    assert restored == [env.data_vol]  # the WAL volume is kept
    host_steps = [s.id for s in plan.steps if s.id.endswith(f"-{env.data_vol}")]
    if env.backend.block:  # the device goes away from the host and comes back
        assert host_steps == [
            f"{a}-{env.data_vol}"
            for a in ("unmount", "detach", "restore", "attach", "wait-device", "mount")
        ]
    else:
        assert host_steps == [f"restore-{env.data_vol}"]
    result = env.cluster.execute(plan)
    assert not result.resumed
    assert env.batches() == env.expect(1, 2, 3)
    assert env.timeline() == 2
    # The recovered server is writable and archives on its new timeline.
    env.write(4)
    assert env.batches() == env.expect(1, 2, 3, 4)


def test_recovery_into_unarchived_wal_finds_pg_wal_anywhere_on_the_wal_volume(
    pg_server: Any, volume_mode: str
) -> None:
    """Issue 7 #4: with ``initdb --waldir`` pointing below the WAL volume's root, the
    surviving WAL was not found once the data volume (and its pg_wal link) was lost."""
    from .conftest import make_env

    env = make_env(pg_server, block=volume_mode == "block", deep_wal=True)
    try:
        record = backed_up(env)
        assert record.wal_directory and record.wal_directory.endswith("/cluster1/wal")
        env.write(2)
        env.switch_wal()
        env.write(3)  # only in pg_wal, deep in the WAL volume
        target = RecoveryTarget.lsn(env.current_lsn())  # a point in the unarchived WAL
        env.write(4)
        env.crash()
        env.lose_data()
        plan = env.cluster.plan_recovery(target, lost=[DATA])
        assert any("WAL volume" in k for k in plan.kept)
        env.cluster.execute(plan)
        assert env.batches() == env.expect(1, 2, 3)
    finally:
        env.backend.close()


# --------------------------------------------------------------------------- (b)


# Every kind of target, losing the data volume or both, on directories; on block
# devices two of them (what differs there is the restore, not the target).
PITR_CASES = [
    *(
        pytest.param("directories", kind, lost, id=f"directories-{kind}-{name}")
        for kind in ("time", "lsn", "xid", "name")
        for lost, name in (((DATA,), "data"), ((DATA, WAL), "data+wal"))
    ),
    pytest.param("block", "time", (DATA, WAL), id="block-time-data+wal"),
    pytest.param("block", "xid", (DATA,), id="block-xid-data"),
]


@pytest.mark.parametrize(("volume_mode", "kind", "lost"), PITR_CASES)
def test_point_in_time_recovery(e2e_env: Any, kind: str, lost: tuple[VolumeRole, ...]) -> None:
    env: Env = e2e_env()
    target = pitr_setup(env, kind)
    env.crash()
    env.lose_data()
    if WAL in lost:
        env.lose_wal()
    plan = env.cluster.plan_recovery(target, lost=lost)
    env.cluster.execute(plan)
    assert env.batches() == env.expect(1, 2), plan.explain()
    assert env.timeline() == 2


def test_immediate_recovery(e2e_env: Any) -> None:
    env: Env = e2e_env()
    record = backed_up(env)
    env.write(2)  # after the backup stopped
    env.switch_wal()
    env.crash()
    env.lose_data()
    plan = env.cluster.plan_recovery(RecoveryTarget.immediate(), lost=[DATA])
    env.cluster.execute(plan)
    assert env.batches() == env.expect(1)
    assert record.stop_lsn is not None


# --------------------------------------------------------------------------- (c)


def refused(env: Env, error: type[PlanningError], target: RecoveryTarget, **kwargs: Any) -> Any:
    """Plan ``target``; it must be refused with ``error``, touching nothing."""
    before = env.data_state()
    snaps = env.snapshot_ids()
    journals = env.journals()
    with pytest.raises(error) as info:
        env.cluster.plan_recovery(target, **kwargs)
    assert env.data_state() == before
    assert before["running"]
    assert env.snapshot_ids() == snaps
    assert env.journals() == journals
    assert not any(j.startswith("recovery-") for j in journals)
    return info.value


@pytest.mark.parametrize("volume_mode", ["directories"])  # planning: the volumes do not matter
def test_target_before_the_backup_is_refused(e2e_env: Any) -> None:
    env: Env = e2e_env()
    env.create_table()
    env.write(1)
    before_time = env.now()
    before_lsn = env.current_lsn()
    record = env.cluster.backup("e2e")
    env.write(2)
    env.switch_wal()
    err = refused(env, NoBackupForTarget, RecoveryTarget.time(before_time))
    assert record.id in str(err)
    refused(env, NoBackupForTarget, RecoveryTarget.lsn(before_lsn))
    refused(env, NoBackupForTarget, RecoveryTarget.lsn(before_lsn), lost=[DATA, WAL])
    # Just after the backup's consistency point is fine (the plan is made, not run).
    assert record.stop_lsn is not None
    env.cluster.plan_recovery(RecoveryTarget.lsn(record.stop_lsn + 1))


@pytest.mark.parametrize("volume_mode", ["directories"])  # planning: the volumes do not matter
def test_target_past_the_end_of_the_archive_is_refused(e2e_env: Any) -> None:
    env: Env = e2e_env()
    backed_up(env)
    env.write(2)
    last = env.switch_wal()
    time.sleep(0.1)
    after_last_commit = env.now()
    seg = 1024 * 1024
    # An LSN two segments past the last archived one.
    beyond = LSN((int(last[8:16], 16) * 0x100000000 // seg + int(last[16:], 16) + 3) * seg)
    err = refused(env, TargetOutOfRange, RecoveryTarget.lsn(beyond), lost=[DATA, WAL])
    assert err.reachable_lsn
    # A time in the future.
    future = after_last_commit.replace(year=after_last_commit.year + 1)
    refused(env, TargetOutOfRange, RecoveryTarget.time(future), lost=[DATA, WAL])
    refused(env, TargetOutOfRange, RecoveryTarget.time(future))
    # A time after the last commit in the archive (read from the WAL by pgsnap's reader).
    refused(env, TargetOutOfRange, RecoveryTarget.time(after_last_commit), lost=[DATA, WAL])
    # A restore point that does not exist.
    refused(env, TargetOutOfRange, RecoveryTarget.name("no_such_point"), lost=[DATA, WAL])


def test_target_past_the_end_of_the_surviving_wal_is_refused(e2e_env: Any) -> None:
    """Keeping the WAL volume, the end is the end of pg_wal, not of pre-allocated segments."""
    env: Env = e2e_env()
    backed_up(env)
    env.write(2)
    env.switch_wal()
    env.server.sql("CHECKPOINT")  # recycles old segments into future names
    env.write(3)
    end = env.current_lsn()
    refused(env, TargetOutOfRange, RecoveryTarget.lsn(end + 8 * 1024 * 1024))
    # Within the current segment, but after the last record: replay cannot reach it.
    refused(env, TargetOutOfRange, RecoveryTarget.lsn(end + 64))
    refused(env, TargetOutOfRange, RecoveryTarget.time(env.now()))
    # Before the end is fine.
    plan = env.cluster.plan_recovery(RecoveryTarget.lsn(end - 64))
    assert plan.summary["recoverable to"].startswith(str(end)), plan.summary


# --------------------------------------------------------------------------- (d)


@pytest.mark.parametrize("volume_mode", ["directories"])  # planning: the volumes do not matter
def test_wal_gap_refuses_later_targets_and_allows_earlier_ones(e2e_env: Any) -> None:
    env: Env = e2e_env()
    backed_up(env)
    env.write(2)
    before_gap = env.now()
    env.write(3)  # the first commit after before_gap: in the segment before the gap
    env.switch_wal()
    env.write(4)
    gap = env.switch_wal()  # batch 4's segment: deleted below
    env.write(5)
    after_gap = env.now()
    env.write(6)
    env.switch_wal()
    (env.archive_dir / gap).unlink()
    # The server's pg_wal still holds the segment (not yet recycled): only with the WAL
    # volume lost too is the gap real, so both are lost.
    env.crash()
    env.lose_data()
    env.lose_wal()
    lost = [DATA, WAL]
    snaps = env.snapshot_ids()

    for target in (RecoveryTarget.time(after_gap), RecoveryTarget.latest()):
        with pytest.raises(WalGapError) as info:
            env.cluster.plan_recovery(target, lost=lost)
        assert gap in info.value.missing, info.value
        assert gap in str(info.value)
    assert env.snapshot_ids() == snaps  # nothing made
    assert not any(j.startswith("recovery-") for j in env.journals())

    plan = env.cluster.plan_recovery(RecoveryTarget.time(before_gap), lost=lost)
    env.cluster.execute(plan)
    assert env.batches() == env.expect(1, 2)


@pytest.mark.parametrize("volume_mode", ["directories"])  # planning: the volumes do not matter
def test_plans_probe_the_archive_by_name_and_still_see_a_segment_deleted_since(
    e2e_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27: a plan does not list the archive when an earlier run knows it (it
    probes names from there and confirms what the plan rests on), and a segment
    deleted by hand since is still a gap for ``latest``."""
    env: Env = e2e_env()
    backed_up(env)
    env.write(2)
    before_gap = env.now()
    env.write(3)
    env.switch_wal()
    env.write(4)
    gap = env.switch_wal()
    env.write(5)
    after_gap = env.now()
    env.switch_wal()
    env.crash()
    env.lose_data()
    env.lose_wal()
    lost = [DATA, WAL]
    listings = count_listings(monkeypatch)
    first = env.cluster.plan_recovery(RecoveryTarget.latest(), lost=lost)
    assert len(listings) == 1  # nothing known yet: listed, and kept
    second = env.cluster.plan_recovery(RecoveryTarget.latest(), lost=lost)
    assert len(listings) == 1, "the second plan listed the archive"
    assert second.summary == first.summary and second.warnings == first.warnings

    (env.archive_dir / gap).unlink()
    for target in (RecoveryTarget.latest(), RecoveryTarget.time(after_gap)):
        with pytest.raises(WalGapError) as info:
            env.cluster.plan_recovery(target, lost=lost)
        assert gap in info.value.missing, info.value
    assert len(listings) > 1  # the doubt was settled by a listing

    plan = env.cluster.plan_recovery(RecoveryTarget.time(before_gap), lost=lost)
    env.cluster.execute(plan)
    assert env.batches() == env.expect(1, 2)


@pytest.mark.parametrize("volume_mode", ["directories"])
def test_a_gentle_backup_waits_for_the_next_checkpoint_and_recovers(e2e_env: Any) -> None:
    """Issue 27: ``checkpoint="next"`` forces no checkpoint of its own until PostgreSQL
    has made its next one (here one the workload asks for after 2 s); the backup then
    starts with little left to write, and recovers like any other."""
    import threading

    env: Env = e2e_env()
    env.create_table()
    env.write(1)
    before = env.server.sql("SELECT redo_lsn::text FROM pg_control_checkpoint()")[0][0]

    def checkpoint_later() -> None:
        time.sleep(2.0)
        env.server.sql("CHECKPOINT")

    plan = env.cluster.plan_backup("gentle", checkpoint="next")
    assert [s.id for s in plan.steps][:2] == ["wait-checkpoint", "backup-start"]
    events: list[Event] = []
    later = threading.Thread(target=checkpoint_later)
    later.start()
    try:
        env.cluster.execute(plan, on_event=events.append)
    finally:
        later.join()
    record = env.cluster.backup_of(plan)
    assert record.state is BackupState.DONE
    waited = next(
        e for e in events if e.step_id == "wait-checkpoint" and e.kind is EventKind.FINISHED
    )
    assert waited.seconds is not None and waited.seconds >= 1.5, waited
    after = env.server.sql("SELECT redo_lsn::text FROM pg_control_checkpoint()")[0][0]
    assert LSN.parse(after) > LSN.parse(before)
    with pytest.raises(InputError, match="checkpoint must be one of"):
        env.cluster.plan_backup(checkpoint="gentle")

    env.write(2)
    env.switch_wal()
    env.crash()
    env.lose_data()
    env.cluster.execute(env.cluster.plan_recovery(RecoveryTarget.latest()))
    assert env.batches() == env.expect(1, 2)


@pytest.mark.parametrize("volume_mode", ["directories"])
def test_an_indexed_archive_lets_a_time_target_plan_read_only_its_segment(
    e2e_env: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 27: ``index_wal`` (``pgsnap wal --index``) reads the WAL a recovery from
    the newest backup reads into the WAL index, once; a plan to a time then reads
    only what holds its target, and recovers the right rows."""
    env: Env = e2e_env()
    record = backed_up(env)
    env.switch_wal()
    for batch in (2, 3):
        env.write(batch)
        env.switch_wal()
    target = env.now()
    for batch in range(4, 14):  # past the plan's first window of 8 segments
        env.write(batch)
        env.switch_wal()

    run = env.cluster.index_wal()
    assert run.backup_id == record.id and run.start is not None, run
    assert run.start <= record.start_lsn < LSN(run.start.value + 1024 * 1024), run
    assert run.read >= 13 and run.added >= run.read - 1, run  # the last may be partial
    again = env.cluster.index_wal()
    assert again.read <= 1 and again.indexed >= run.read - 1, again

    def reads() -> tuple[int, int]:
        found = [
            re.search(r"(\d+) segments read, (\d+) from the index", r.getMessage())
            for r in caplog.records
        ]
        return (
            sum(int(m.group(1)) for m in found if m),
            sum(int(m.group(2)) for m in found if m),
        )

    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="pgsnap.observe"):
        plan = env.cluster.plan_recovery(RecoveryTarget.time(target), lost=[DATA, WAL])
    read, from_index = reads()
    # Read: the backup's first segment (the plan starts inside it), the target's, and
    # the one after each, to finish their records; the rest came from the index.
    assert read <= 4 and from_index >= 6, [r.getMessage() for r in caplog.records]
    env.crash()
    env.lose_data()
    env.lose_wal()
    env.cluster.execute(plan)
    assert env.batches() == env.expect(1, 2, 3)


@pytest.mark.parametrize("volume_mode", ["directories"])
def test_a_scheduled_backup_takes_the_place_of_the_next_timed_checkpoint(e2e_env: Any) -> None:
    """Issue 27: ``checkpoint="scheduled"`` waits until PostgreSQL's next timed
    checkpoint is due and starts backup mode then with a spread checkpoint, so the
    server makes no checkpoint it would not have made: the first checkpoint after the
    schedule's origin is the backup's (``force wait``, not ``immediate``), begun just
    before the timed one was due; and the backup recovers."""
    import threading

    env: Env = e2e_env()
    env.create_table()
    env.write(1)
    env.server.configure(
        {"checkpoint_timeout": "30s", "checkpoint_completion_target": 0.1, "log_checkpoints": "on"}
    )
    env.server.reload()
    env.server.sql("CREATE TABLE filler (n int)")
    env.server.sql("CHECKPOINT")  # the schedule's origin: the next timed one is 30 s on
    origin = env.server.sql("SELECT checkpoint_time FROM pg_control_checkpoint()")[0][0]
    offset = env.server.log_file.stat().st_size
    done = threading.Event()

    def keep_writing() -> None:  # a server that writes nothing skips its timed checkpoint
        while not done.wait(0.2):
            env.server.sql("INSERT INTO filler SELECT generate_series(1, 100)")

    plan = env.cluster.plan_backup("scheduled", checkpoint="scheduled")
    assert [s.id for s in plan.steps][:2] == ["wait-checkpoint", "backup-start"]
    assert "spread checkpoint" in plan.steps[1].description
    events: list[Event] = []
    ended: list[dt.datetime] = []

    def seen(event: Event) -> None:
        events.append(event)
        if event.step_id == "wait-checkpoint" and event.kind is EventKind.FINISHED:
            ended.append(env.now())  # the server's clock

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        env.cluster.execute(plan, on_event=seen)
    finally:
        done.set()
        writer.join()
    record = env.cluster.backup_of(plan)
    assert record.state is BackupState.DONE
    assert any(e.kind is EventKind.PROGRESS and e.step_id == "wait-checkpoint" for e in events)
    due = origin + dt.timedelta(seconds=30)
    assert len(ended) == 1 and due - dt.timedelta(seconds=4) <= ended[0] <= due, (ended, due)
    with open(env.server.log_file, errors="replace") as f:
        f.seek(offset)
        log = f.read()
    starts = re.findall(r"checkpoint starting: ([a-z ]+)", log)
    assert starts and starts[0].strip() == "force wait", starts

    env.write(2)
    env.switch_wal()
    env.crash()
    env.lose_data()
    env.cluster.execute(env.cluster.plan_recovery(RecoveryTarget.latest()))
    assert env.batches() == env.expect(1, 2)


# --------------------------------------------------------------------------- (e)


@pytest.mark.parametrize("old_timeline", ["1", "current"])
def test_recoveries_across_timelines(e2e_env: Any, old_timeline: str) -> None:
    env: Env = e2e_env()
    backed_up(env)
    env.write(2)
    t_before_fork = env.now()
    env.write(3)
    t_fork = env.now()
    env.write(4)
    env.switch_wal()
    env.crash()
    env.lose_data()

    # First PITR: timeline 2 forks off timeline 1 after batch 3.
    recover(env, RecoveryTarget.time(t_fork), lost=[DATA])
    assert env.batches() == env.expect(1, 2, 3)
    assert env.timeline() == 2
    env.write(5)
    env.switch_wal()
    assert (env.archive_dir / "00000002.history").exists()

    # Latest on timeline 2: everything of timeline 2 (batch 4 stayed on timeline 1).
    env.crash()
    env.lose_data()
    plan = env.cluster.plan_recovery(RecoveryTarget.latest(), lost=[DATA])
    assert plan.summary["timeline path"].startswith("1 (until"), plan.summary
    env.cluster.execute(plan)
    assert env.batches() == env.expect(1, 2, 3, 5)
    assert env.timeline() == 3

    # Back on timeline 1, before the fork: the later timelines are ignored.
    env.crash()
    env.lose_data()
    recover(env, RecoveryTarget.time(t_before_fork), timeline=old_timeline, lost=[DATA, WAL])
    assert env.batches() == env.expect(1, 2)
    assert env.timeline() == 4

    # And latest on timeline 2 again, explicitly, after the archive grew timelines 3, 4.
    env.crash()
    env.lose_data()
    recover(env, RecoveryTarget.latest(), timeline=2, lost=[DATA, WAL])
    assert env.batches() == env.expect(1, 2, 3, 5)
    assert env.timeline() == 5


# --------------------------------------------------------------------------- (f)


@pytest.mark.parametrize("fault", ["create_snapshot_group", "snapshot_volume"])
def test_backup_aborted_by_a_storage_failure(e2e_env: Any, fault: str) -> None:
    env: Env = e2e_env()
    env.create_table()
    env.write(1)
    # snapshot_volume fails the second volume: the first one's copy must go too.
    env.backend.inject_fault(fault, on_call=2 if fault == "snapshot_volume" else 1)
    with pytest.raises(ExecutionError) as info:
        env.cluster.backup("e2e failing")
    assert isinstance(info.value.cause, BackendUnavailable)
    assert info.value.step_id == "snapshot"
    assert_not_in_backup_mode(env)
    assert "aborting backup due to backend exiting" in env.server.log_text()
    assert env.snapshot_ids() == set()
    (record,) = env.cluster.backups()
    assert record.state is BackupState.FAILED
    assert record.failure_reason and "snapshot" in record.failure_reason
    assert record.orphaned_snapshots == ()
    # The server is fine and the next backup works.
    env.write(2)
    done = env.cluster.backup("e2e retry")
    assert done.state is BackupState.DONE
    assert len(env.snapshot_ids()) == 2


# --------------------------------------------------------------------------- (g)


def run_until_killed(env: Env, plan: Any, kill_after: str) -> int:
    """Execute ``plan`` in a forked child that SIGKILLs itself once ``kill_after`` finished.

    Returns the child's wait status. The child shares nothing with the test
    process but what fork copied: the MockBackend's snapshots (made before the
    fork) and the files on disk, which is all a resumed run needs.
    """

    def on_event(event: Event) -> None:
        if event.kind is EventKind.FINISHED and event.step_id == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        code = 3
        try:
            env.cluster.execute(plan, on_event=on_event)
            code = 2  # it should have been killed
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


@pytest.mark.parametrize(
    ("lost", "kill_at"),
    [
        ((DATA,), "restore"),
        ((DATA, WAL), "restore"),
        ((DATA,), "start-server"),
    ],
    ids=["data-after-restore", "data+wal-after-restore", "data-after-start"],
)
def test_interrupted_recovery_resumes_from_its_journal(
    e2e_env: Any, lost: tuple[VolumeRole, ...], kill_at: str
) -> None:
    env: Env = e2e_env()
    target = pitr_setup(env, "time")
    env.crash()
    env.lose_data()
    plan = env.cluster.plan_recovery(target, lost=lost)
    restores = [s.id for s in plan.steps if s.id.startswith("restore-")]
    kill_after = restores[-1] if kill_at == "restore" else kill_at

    status = run_until_killed(env, plan, kill_after)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    (journal,) = [j for j in env.journals() if j.startswith("recovery-")]
    assert env.cluster.adapter.is_running() is (kill_at == "start-server")

    events: list[Event] = []
    result = env.cluster.execute(plan, on_event=events.append)
    assert result.resumed
    skipped = [e.step_id for e in events if e.kind is EventKind.SKIPPED]
    ids = [s.id for s in plan.steps]
    assert skipped == ids[: ids.index(kill_after) + 1]
    started = [e.step_id for e in events if e.kind is EventKind.STARTED]
    assert started == ids[ids.index(kill_after) + 1 :]
    assert env.batches() == env.expect(1, 2)
    assert env.timeline() == 2
    # The run ended: the same plan is never run again (a new plan is a new run).
    assert env.journals().count(journal) == 1
    with pytest.raises(PlanAlreadyRunError):
        env.cluster.execute(plan)
    assert env.batches() == env.expect(1, 2)


# --------------------------------------------------------------------------- the demo


def test_the_demo_command_recovers_the_right_rows(capsys: pytest.CaptureFixture[str]) -> None:
    from pgsnap.cli import EXIT_OK, main

    assert main(["demo"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "verification: PASSED" in out


def test_a_kept_demo_leaves_a_configuration_that_the_commands_it_prints_use(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`pgsnap demo --keep` (a newcomer's next step): a working configuration beside the
    kept cluster, three commands to try that work as printed, and one line that
    removes it all."""
    import shlex
    import subprocess

    from pgsnap.cli import EXIT_OK, main

    assert main(["demo", "--keep"]) == EXIT_OK
    out = capsys.readouterr().out
    tries = [line.strip() for line in out.splitlines() if line.startswith("  pgsnap ")]
    (removal,) = [line for line in out.splitlines() if line.startswith("to remove it all: ")]
    command = removal.removeprefix("to remove it all: ")
    base = Path(shlex.split(command)[-1])
    try:
        assert [t.split()[1] for t in tries] == ["check", "list", "plan-recovery"], out
        assert main(shlex.split(tries[0])[1:]) in (EXIT_OK, 4), capsys.readouterr()
        capsys.readouterr()
        assert main([*shlex.split(tries[1])[1:], "--json"]) == EXIT_OK
        (backup,) = json.loads(capsys.readouterr().out)
        assert backup["state"] == "done"
        assert main(shlex.split(tries[2])[1:]) == EXIT_OK
        assert re.search(r"^  target +latest$", capsys.readouterr().out, re.M)
    finally:
        done = subprocess.run(command, shell=True, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert not base.exists()


# --------------------------------------------------------------------------- issue 7: scans


def _two_backups_with_a_gap_between(env: Env) -> tuple[Any, Any, str]:
    """B1, batch 2, a segment then lost from the archive, B2: returns (b1, b2, lost)."""
    b1 = backed_up(env)
    env.write(2)
    lost = env.switch_wal()  # batch 2's segment: deleted below
    env.write(3)
    env.switch_wal()
    b2 = env.cluster.backup("e2e second")
    (env.archive_dir / lost).unlink()
    return b1, b2, lost


@pytest.mark.parametrize("kind", ["xid", "name"])
def test_a_target_after_a_later_backup_is_reached_despite_a_gap_before_it(
    e2e_env: Any, kind: str
) -> None:
    """Issue 7 #2: the scan started at the oldest backup, stopped at its first gap and
    called itself complete, so a target after B2 was 'not in the reachable WAL'."""
    env: Env = e2e_env()
    _b1, b2, _lost = _two_backups_with_a_gap_between(env)
    if kind == "xid":
        target = RecoveryTarget.xid(env.write_in_one_xact(4))
    else:
        env.write(4)
        env.server.sql("SELECT pg_create_restore_point('after_b2')")
        target = RecoveryTarget.name("after_b2")
    env.write(5)
    env.switch_wal()
    env.crash()
    env.lose_data()
    env.lose_wal()
    plan = env.cluster.plan_recovery(target, lost=[DATA, WAL])
    assert plan.summary["backup"].startswith(b2.id), plan.summary
    env.cluster.execute(plan)
    assert env.batches() == env.expect(1, 2, 3, 4)


@pytest.mark.parametrize("volume_mode", ["directories"])  # planning: the volumes do not matter
def test_a_target_inside_a_gap_is_a_gap_not_out_of_range(e2e_env: Any) -> None:
    """Issue 7 #2: an xid committed in a segment lost between two backups is refused
    as a gap naming that segment (the WAL after B2 is complete: it is not there)."""
    env: Env = e2e_env()
    backed_up(env)
    xid = env.write_in_one_xact(2)  # committed in the segment lost below
    lost = env.switch_wal()
    env.write(3)
    env.switch_wal()
    env.cluster.backup("e2e second")
    env.write(4)
    env.switch_wal()
    (env.archive_dir / lost).unlink()
    env.crash()
    env.lose_data()
    env.lose_wal()
    with pytest.raises(WalGapError) as info:
        env.cluster.plan_recovery(RecoveryTarget.xid(xid), lost=[DATA, WAL])
    assert lost in info.value.missing, info.value
    assert lost in str(info.value)


@pytest.mark.parametrize("volume_mode", ["directories"])  # planning: the volumes do not matter
def test_planning_scans_only_the_wal_the_chosen_backup_reaches(e2e_env: Any) -> None:
    """Issue 7 #3: a time target after B2 reads WAL from B2 on, not from the oldest backup."""
    from pgsnap.planner.recovery import RecoveryRequest

    env: Env = e2e_env()
    backed_up(env)
    for batch in (2, 3):
        env.write(batch)
        env.switch_wal()
    b2 = env.cluster.backup("e2e second")
    env.write(4)
    when = env.now()
    env.write(5)
    env.switch_wal()
    facts = env.cluster.recovery_facts(RecoveryRequest(RecoveryTarget.time(when)))
    assert facts.events is not None and facts.events.spans
    assert facts.events.spans[0][0] >= b2.start_lsn, facts.events.spans
    assert facts.events.commits  # and it read what it needs


def _segments_read(records: list[logging.LogRecord]) -> tuple[int, int]:
    """(read, from the index) summed over the observer's WAL reads in ``records``."""
    read = indexed = 0
    for r in records:
        m = re.search(r"(\d+) segments read, (\d+) from the index", r.getMessage())
        if r.name == "pgsnap.observe" and m:
            read += int(m[1])
            indexed += int(m[2])
    return read, indexed


@pytest.mark.parametrize("volume_mode", ["directories"])  # planning: the volumes do not matter
def test_a_second_plan_reads_the_wal_from_the_index_and_recovers_the_same(
    e2e_env: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 8 (the index): planning again reads only the segments it has not seen,
    gives the answers a read without the index gives, and its plan recovers the
    right rows."""
    from pgsnap.planner.recovery import RecoveryRequest

    env: Env = e2e_env()
    backed_up(env)
    when = None
    for batch in range(2, 12):
        env.write(batch)
        if batch == 6:
            when = env.now()
        env.switch_wal()
    assert when is not None
    env.crash()
    env.lose_data()
    target = RecoveryTarget.time(when)
    caplog.set_level(logging.DEBUG, logger="pgsnap.observe")
    cold_plan = env.cluster.plan_recovery(target)
    cold = _segments_read(caplog.records)
    caplog.clear()
    warm_plan = env.cluster.plan_recovery(target)
    warm = _segments_read(caplog.records)
    assert cold[1] == 0 and warm[1] > 0, (cold, warm)
    assert warm[0] < cold[0], (cold, warm)
    assert warm_plan.summary == cold_plan.summary
    assert warm_plan.warnings == cold_plan.warnings

    request = RecoveryRequest(target)
    warm_facts = env.cluster.recovery_facts(request)
    index, env.cluster.wal_index = env.cluster.wal_index, None
    try:
        plain = env.cluster.recovery_facts(request)
    finally:
        env.cluster.wal_index = index
    assert warm_facts.events is not None and plain.events is not None
    for ev in (warm_facts.events, plain.events):
        assert ev.complete
    assert warm_facts.events.first_commit_after(when) == plain.events.first_commit_after(when)
    assert warm_facts.events.last_commit() == plain.events.last_commit()
    assert warm_facts.events.end_of_wal == plain.events.end_of_wal

    env.cluster.execute(warm_plan)
    assert env.batches() == env.expect(1, 2, 3, 4, 5, 6)


def test_a_plan_whose_facts_changed_is_refused_before_touching_anything(e2e_env: Any) -> None:
    """execute checks the plan's facts without re-planning (its backup pinned, no WAL
    read): a snapshot of its backup deleted since is a StalePlanError and nothing is
    touched; a plan on another backup is not stale for it and recovers."""
    env: Env = e2e_env()
    first = backed_up(env)
    env.write(2)
    env.switch_wal()
    second = env.cluster.backup("e2e second")
    env.write(3)
    env.switch_wal()
    env.crash()
    env.lose_data()
    plan = env.cluster.plan_recovery(backup_id=first.id)
    state = env.data_state()
    snapshot = next(iter(second.snapshots.values()))
    env.backend.delete_snapshot(next(iter(first.snapshots.values())))
    with pytest.raises(StalePlanError):
        env.cluster.execute(plan)
    assert env.data_state() == state
    assert not [j for j in env.journals() if not j.startswith("backup-")]
    # a plan on the other backup is not stale for what happened to the first
    plan = env.cluster.plan_recovery()
    assert plan.summary["backup"].startswith(second.id)
    assert snapshot in env.snapshot_ids()
    env.cluster.execute(plan)
    assert env.batches() == env.expect(1, 2, 3)


@pytest.mark.parametrize("volume_mode", ["directories"])  # planning: the volumes do not matter
def test_times_before_and_after_a_fork_plan_right_and_say_which_timeline(e2e_env: Any) -> None:
    """Issue 7 #5: after a recovery made timeline 2, a time on timeline 1 before the fork
    plans with the default timeline; one after the fork warns that timeline 2's state
    at that time is recovered, and says how to choose timeline 1."""
    env: Env = e2e_env()
    backed_up(env)
    env.write(2)
    t_before_fork = env.now()
    env.write(3)
    t_fork = env.now()
    env.write(4)
    t_after_fork_on_1 = env.now()
    env.write(6)  # timeline 1 goes on after that time
    env.switch_wal()
    env.crash()
    env.lose_data()
    recover(env, RecoveryTarget.time(t_fork), lost=[DATA])
    assert env.timeline() == 2
    env.write(5)
    env.switch_wal()

    plan = env.cluster.plan_recovery(RecoveryTarget.time(t_before_fork), lost=[DATA, WAL])
    assert not any("forked" in w for w in plan.warnings), plan.warnings
    plan = env.cluster.plan_recovery(RecoveryTarget.time(t_after_fork_on_1), lost=[DATA, WAL])
    warned = [w for w in plan.warnings if "forked" in w]
    assert warned and "--timeline 1" in warned[0], plan.warnings
    # The same time on timeline 1 recovers timeline 1's rows (batch 4 is there).
    env.crash()
    env.lose_data()
    env.lose_wal()
    recover(env, RecoveryTarget.time(t_after_fork_on_1), timeline=1, lost=[DATA, WAL])
    assert env.batches() == env.expect(1, 2, 3, 4)
    env.crash()
    env.lose_data()
    env.lose_wal()
    recover(env, RecoveryTarget.time(t_before_fork), lost=[DATA, WAL])
    assert env.batches() == env.expect(1, 2)
