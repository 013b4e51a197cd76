"""A gentle backup's wait for PostgreSQL's checkpoint schedule (issue 27).

``CheckpointState.next_due`` reckons when the next timed checkpoint begins; the
``db.wait_checkpoint`` operation with ``until="due"`` waits for it on a simulated
checkpointer whose clock moves only when the operation sleeps.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgsnap.model import LSN, CheckpointState
from pgsnap.operations import OperationContext
from pgsnap.operations.db import WaitForCheckpoint

T0 = dt.datetime(2026, 12, 7, 12, 0, 0, tzinfo=dt.UTC)


def state(began: dt.datetime, timeout: float = 30.0, target: float = 0.5) -> CheckpointState:
    return CheckpointState(
        redo_lsn=LSN(0x1000000), time=began, timeout_seconds=timeout, completion_target=target
    )


def s(seconds: float) -> dt.timedelta:
    return dt.timedelta(seconds=seconds)


def test_the_next_timed_checkpoint_is_a_timeout_after_the_last_began() -> None:
    due, running = state(T0).next_due(T0 + s(12))
    assert (due, running) == (T0 + s(30), None)


def test_one_begun_at_the_last_multiple_may_still_be_spreading_its_writes() -> None:
    # 30 s timeout, spread over half of it: one began at 12:00:30 may run to about :50.
    due, running = state(T0).next_due(T0 + s(33))
    assert (due, running) == (T0 + s(60), T0 + s(30))
    due, running = state(T0).next_due(T0 + s(30 + 15 + 4))
    assert running == T0 + s(30)


def test_one_not_over_long_after_its_spread_was_skipped_by_an_idle_server() -> None:
    due, running = state(T0).next_due(T0 + s(30 + 15 + 6))
    assert (due, running) == (T0 + s(60), None)
    due, running = state(T0).next_due(T0 + s(3600 + 1))
    assert (due, running) == (T0 + s(3630), T0 + s(3600))


@given(
    timeout=st.floats(30, 86400),
    target=st.floats(0.0, 1.0),
    after=st.floats(0, 10 * 86400),
)
def test_the_due_time_is_the_first_multiple_of_the_timeout_ahead(
    timeout: float, target: float, after: float
) -> None:
    at = T0 + s(after)
    due, running = state(T0, timeout, target).next_due(at)
    assert at < due <= at + s(timeout) + s(0.001)
    periods = (due - T0) / s(timeout)
    assert abs(periods - round(periods)) < 1e-6
    if running is not None:
        assert running == due - s(timeout)
        assert at - running <= s(timeout * target + 5)


MB = 1024 * 1024


@attrs.define
class Checkpointer:
    """PostgreSQL's checkpointer on a fake clock. WAL is written at ``wal_rate`` bytes a
    second. A checkpoint begins ``timeout`` seconds after the last began, or sooner when
    ``wal_trigger`` bytes of WAL were written since the last redo point; its redo point
    is where WAL was then; it is over ``timeout * target`` seconds later, and only then
    do the control file's time and redo pointer move."""

    began: dt.datetime
    timeout: float = 30.0
    target: float = 0.5
    wal_rate: float = 1 * MB
    wal_trigger: int = 1024 * MB
    now: dt.datetime = T0
    slept: list[float] = attrs.Factory(list)

    def sleep(self, seconds: float) -> None:
        assert seconds > 0, seconds
        self.slept.append(seconds)
        self.now += s(seconds)

    def insert_at(self, when: dt.datetime) -> int:
        return 0x10000000 + int(self.wal_rate * (when - T0).total_seconds())

    def checkpoint_state(self) -> CheckpointState:
        # The last checkpoint, begun at ``began``, is over by T0; each later one begins
        # when due and not before the one before it is over.
        spread = s(self.timeout * self.target)
        start, redo, ended = self.began, self.insert_at(self.began), self.began
        while True:
            by_time = start + s(self.timeout)
            by_wal = start + s((redo + self.wal_trigger - self.insert_at(start)) / self.wal_rate)
            nxt = max(min(by_time, by_wal), ended)
            if nxt + spread > self.now:
                break
            start, redo, ended = nxt, self.insert_at(nxt), nxt + spread
        return CheckpointState(
            redo_lsn=LSN(redo),
            time=start,
            timeout_seconds=self.timeout,
            completion_target=self.target,
            read_at=self.now,
            insert_lsn=LSN(self.insert_at(self.now)),
            wal_checkpoint_bytes=self.wal_trigger,
        )


def run(op: WaitForCheckpoint, pg: Checkpointer) -> tuple[dict[str, Any], list[str]]:
    told: list[str] = []
    none = cast(Any, None)
    ctx = OperationContext(
        adapter=cast(Any, pg),
        backend=none,
        catalog=none,
        archive=none,
        host=none,
        layout=none,
        outputs={},
        resources={},
        sleep=pg.sleep,
        clock=lambda: pg.now,
        run_started=T0,
        progress=lambda message, _data: told.append(message),
    )
    return dict(op.run(ctx)), told


def test_the_wait_ends_just_before_the_timed_checkpoint_begins() -> None:
    pg = Checkpointer(began=T0 - s(4))
    out, told = run(WaitForCheckpoint(until="due", lead=2.0), pg)
    assert pg.now == pytest.approx(T0 + s(26 - 2), abs=s(0.001))
    assert out["checkpoint_due"] == (T0 + s(26)).isoformat()
    assert out["waited_seconds"] == pytest.approx(24)
    assert max(pg.slept) <= 5.0  # looks again every few seconds
    assert told and "next timed checkpoint" in told[0]


def test_a_checkpoint_still_spreading_its_writes_is_let_end_first() -> None:
    # The last checkpoint in the control file began 33 s ago: the timed one that began
    # 3 s ago is running (the control file moves when it ends, at 15 s).
    pg = Checkpointer(began=T0 - s(33))
    out, told = run(WaitForCheckpoint(until="due", lead=2.0), pg)
    assert pg.now == pytest.approx(T0 - s(3) + s(30 - 2), abs=s(0.001))
    assert out["checkpoint_due"] == (T0 + s(27)).isoformat()
    assert any("end" in m for m in told)


def test_a_checkpoint_for_max_wal_size_is_let_end_then_the_schedule_restarts() -> None:
    # 20 MB begin a checkpoint, at 1 MB/s: one began at -5 s for max_wal_size and
    # ends at 10 s; the next one for max_wal_size then begins at 15 s, before the
    # timed one (25 s): the wait ends 2 s before it.
    pg = Checkpointer(began=T0 - s(25), wal_rate=1 * MB, wal_trigger=20 * MB)
    _out, told = run(WaitForCheckpoint(until="due", lead=2.0), pg)
    assert any("max_wal_size end" in m for m in told), told
    assert T0 + s(12.5) <= pg.now <= T0 + s(13.5), pg.now


def test_checkpoints_back_to_back_are_joined_as_one_ends() -> None:
    # At 10 MB/s, 40 MB begin the next checkpoint before the last ends: they run back
    # to back, and the backup's request joins the one pending when one ends (15 s).
    pg = Checkpointer(began=T0 - s(4), wal_rate=10 * MB, wal_trigger=40 * MB)
    _out, _ = run(WaitForCheckpoint(until="due", lead=2.0), pg)
    assert T0 + s(15) <= pg.now <= T0 + s(15.5)


def test_wal_written_fast_enough_to_begin_one_first_is_taken_for_the_schedule() -> None:
    # 100 MB trigger at 5 MB/s: a checkpoint for max_wal_size would begin 20 s after
    # the last, before the timed one at 30 s: the wait ends before it.
    pg = Checkpointer(began=T0, wal_rate=5 * MB, wal_trigger=100 * MB)
    _out, told = run(WaitForCheckpoint(until="due", lead=2.0), pg)
    assert T0 + s(15) <= pg.now <= T0 + s(18.5), pg.now
    assert any("max_wal_size" in m for m in told), told


def test_a_standby_without_an_insert_position_waits_for_the_time_alone() -> None:
    @attrs.define
    class Standby(Checkpointer):
        def checkpoint_state(self) -> CheckpointState:
            return attrs.evolve(super().checkpoint_state(), insert_lsn=None)

    pg = Standby(began=T0 - s(4))
    _out, _ = run(WaitForCheckpoint(until="due", lead=2.0), pg)
    assert pg.now == pytest.approx(T0 + s(24), abs=s(0.001))


def test_a_server_whose_checkpoints_never_end_fails_the_wait_naming_it() -> None:
    @attrs.define
    class Stuck(Checkpointer):
        def checkpoint_state(self) -> CheckpointState:
            got = super().checkpoint_state()
            # The control file never moves; every read finds a checkpoint running.
            return attrs.evolve(got, time=self.now - s(1 + self.timeout), read_at=self.now)

    pg = Stuck(began=T0 - s(31))
    with pytest.raises(Exception, match="did not complete a checkpoint within"):
        run(WaitForCheckpoint(until="due", margin=10.0), pg)
    assert pg.now - T0 <= s(30 * 2.5 + 10 + 1)


def test_the_wait_until_the_next_checkpoint_ends_is_unchanged() -> None:
    pg = Checkpointer(began=T0 - s(4))
    out, _ = run(WaitForCheckpoint(), pg)
    assert out["checkpoint_redo_lsn"] == str(LSN(pg.insert_at(T0 + s(26))))
    assert pg.now >= T0 + s(26 + 15)


def test_only_done_and_due_are_waits() -> None:
    with pytest.raises(ValueError, match="'until' must be in"):
        WaitForCheckpoint(until="soon")
