"""A snapshot limit near, on a real PostgreSQL cluster (issue 13): ``check`` warns
before backups fail, says so plainly when they will, and retention clears it.

The cluster is the end-to-end one (mock volumes for data and WAL); the storage
is the same mock seen by a second backend object configured with
``snapshot_limit=3`` (as another ``pgsnap`` process would be, sharing its state
file), so every backup's snapshots count against a V-Tree-like limit. Then
``Cluster.backups(policy)`` shows which backups the next expiry removes, and
that expiry makes room again.
"""

from __future__ import annotations

from typing import Any

import pytest

from pgsnap import errors
from pgsnap.backends.mock import MockBackend
from pgsnap.cluster import Cluster
from pgsnap.model import Severity
from pgsnap.planner.expiry import RetentionPolicy
from tests.e2e.conftest import Env, assert_not_in_backup_mode

pytestmark = pytest.mark.postgres


def _limited(env: Env, limit: int, warn: float) -> tuple[Cluster, MockBackend]:
    state = env.backend.state_file
    assert state is not None
    backend = MockBackend(
        state_file=state, root=env.backend.root, snapshot_limit=limit, limit_warn_percent=warn
    )
    c = env.cluster
    cluster = Cluster(
        adapter=c.adapter,
        backend=backend,
        archive=c.archive,
        catalog=c.catalog,
        layout=c.layout,
        journal_dir=c.journal_dir,
    )
    return cluster, backend


def _limit_findings(cluster: Cluster) -> list[Any]:
    return [f for f in cluster.check().findings if f.code == "snapshot_limit"]


def test_check_warns_before_the_limit_and_backups_fail_only_after_it(e2e_env: Any) -> None:
    env: Env = e2e_env()
    cluster, backend = _limited(env, limit=3, warn=60)
    env.create_table()
    env.write(1)
    first = cluster.backup("b1")
    assert _limit_findings(cluster) == []  # 1 of 3 snapshots per volume
    env.write(2)
    cluster.backup("b2")
    report = cluster.check()
    warnings = [f for f in report.findings if f.code == "snapshot_limit"]
    # Data and WAL volumes each hold 2 of 3: a warning each, the check still OK.
    assert {f.severity for f in warnings} == {Severity.WARNING} and len(warnings) == 2
    assert report.ok, report.explain()
    assert {p.volume_id for p in report.storage_problems} == {env.data_vol, env.wal_vol}
    assert "2 of the 3 snapshots" in report.explain()
    assert "pgsnap expire" in warnings[0].message  # says what to do
    env.write(3)
    cluster.backup("b3")
    report = cluster.check()
    errors_ = [f for f in report.findings if f.code == "snapshot_limit"]
    assert {f.severity for f in errors_} == {Severity.ERROR} and not report.ok
    # The announced failure: typed, nothing left behind, the database not in backup mode.
    before = env.snapshot_ids()
    with pytest.raises(errors.ExecutionError) as info:
        cluster.backup("b4")
    assert isinstance(info.value.cause, errors.SnapshotLimitError)
    assert env.snapshot_ids() == before
    assert_not_in_backup_mode(env)

    # The listing says what the next expiry with redundancy 1 removes; it makes room.
    policy = RetentionPolicy(redundancy=1)
    listed = cluster.backups(policy)
    assert listed.forecast is not None
    going = set(listed.forecast.removed)
    assert first.id in going and len(going) == 2
    assert any("next expire removes it" in note for note in listed.notes(listed[0]))
    cluster.expire(policy)
    assert {b.id for b in cluster.backups() if b.state.value == "done"} == (
        {b.id for b in listed if b.state.value == "done"} - going
    )
    assert _limit_findings(cluster) == []
    env.write(4)
    assert cluster.backup("b5").state.value == "done"
    backend.close()


def test_a_backend_that_cannot_report_is_a_finding_not_a_crash(e2e_env: Any) -> None:
    env: Env = e2e_env()
    env.backend.inject_fault("storage_problems")
    report = env.cluster.check()
    (finding,) = [f for f in report.findings if f.code == "storage"]
    assert finding.severity is Severity.WARNING and "injected fault" in finding.message
    assert report.storage_problems == ()


def test_a_storage_outage_is_a_finding_and_the_rest_is_still_reported(e2e_env: Any) -> None:
    """The backend fails every call (the array is unreachable): check reports the
    storage as a finding and still reports the archive and the backups."""
    env: Env = e2e_env()
    env.create_table()
    env.cluster.backup("before the outage")
    for method in ("list_volumes", "get_volume", "locate", "list_snapshots", "storage_problems"):
        env.backend.inject_fault(method, times=100)
    report = env.cluster.check()
    (finding,) = [f for f in report.findings if f.code == "storage"]
    assert "injected fault" in finding.message
    assert finding.severity.value == "error" and not report.ok  # a backup would fail
    assert len(report.backups) == 1
    assert report.wal and "no WAL archived yet" not in report.wal[0]
