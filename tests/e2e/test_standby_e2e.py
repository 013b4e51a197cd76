"""Backups taken on a streaming standby, and standbys seeded from snapshots (issue 24).

Real streaming replication: the primary is ``e2e_env``'s server on mock volumes;
its standby is made with ``pg_basebackup -R`` onto volumes of its own (another
mock backend), shares the primary's archive, and is a :class:`~pgsnap.cluster.Cluster`
of its own with ``primary=`` the primary's adapter. Every recovery is checked by
the rows the recovered server holds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pgsnap.adapters.postgres import PostgresAdapter
from pgsnap.cluster import Cluster
from pgsnap.errors import PgsnapError
from pgsnap.executor import Event, EventKind
from pgsnap.model import BackupState, RecoveryTarget, ServerRole, VolumeRole
from pgsnap.testing.pgserver import PgServer
from pgsnap.testing.sandbox import mock_cluster

from .conftest import Env, assert_server_not_in_backup_mode

pytestmark = pytest.mark.postgres

MAJORS = [12, 15, 18]
DATA, WAL = VolumeRole.DATA, VolumeRole.WAL


@pytest.fixture(params=MAJORS, ids=[f"pg{m}" for m in MAJORS])
def bindir(
    request: pytest.FixtureRequest, pg_bindir: Path, pg_bindir_for: Callable[[int], Path]
) -> Path:
    major: int = request.param
    return pg_bindir if major == 15 else pg_bindir_for(major)


class Standby:
    """A running streaming standby of ``primary`` and the pgsnap Cluster on it."""

    def __init__(self, primary: Env, factory: Any, *, reach_primary: bool = True) -> None:
        self.primary = primary
        self.server = PgServer.standby_of(primary.server)
        factory.servers.append(self.server)  # cleaned up (and its log shown) with the test's
        self.server.start()
        self.server.wait_for_streaming()
        options: dict[str, Any] = {}
        if reach_primary:
            options["primary"] = PostgresAdapter(primary.server.conninfo())
        self.cluster: Cluster = mock_cluster(self.server, **options)

    def rows(self) -> dict[int, int]:
        return {
            int(b): int(c)
            for b, c in self.server.sql("SELECT batch, count(*) FROM t GROUP BY batch ORDER BY 1")
        }

    def caught_up(self) -> None:
        lsn = self.primary.server.sql("SELECT pg_current_wal_lsn()::text")[0][0]
        self.server.wait_for_replay(str(lsn))


def writer(env: Env, batch: int) -> tuple[threading.Thread, threading.Event, list[int]]:
    """A thread inserting rows of ``batch`` on the primary until told to stop."""
    stop = threading.Event()
    done: list[int] = []

    def run() -> None:
        with env.server.connect() as conn:
            n = 0
            while not stop.is_set():
                conn.execute("INSERT INTO t (batch, n, at) VALUES (%s, %s, now())", (batch, n))
                n += 1
                done.append(n)
                time.sleep(0.002)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, stop, done


def test_a_backup_on_the_standby_while_the_primary_writes_recovers_to_a_time(
    e2e_env: Any, pg_server: Any, bindir: Path
) -> None:
    env: Env = e2e_env(bindir)
    env.create_table()
    env.write(1)
    standby = Standby(env, pg_server)
    thread, stop, done = writer(env, 100)
    try:
        plan = standby.cluster.plan_backup("on the standby")
        assert "primary-switch-wal" in [s.id for s in plan.steps], plan.explain()
        standby.cluster.execute(plan)
    finally:
        stop.set()
        thread.join()
    record = standby.cluster.backup_of(plan)
    assert record.state is BackupState.DONE
    assert record.taken_on is ServerRole.STANDBY and record.taken_host
    assert "BACKUP FROM: standby" in (record.labelfile or "")
    assert done, "the primary wrote nothing during the backup"
    # The primary never entered backup mode: the backup was the standby's.
    assert (
        env.server.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgsnap backup'"
        )[0][0]
        == 0
    )
    env.write(2)
    standby.caught_up()
    target = RecoveryTarget.time(env.now())
    env.write(3)
    env.switch_wal()
    assert_server_not_in_backup_mode(standby.server)

    # The standby loses everything; the archive (the primary's) brings it to the target.
    standby.server.pg_ctl("stop", "-m", "immediate")
    for d in (standby.server.data_dir, standby.server.wal_dir):
        env.lose(d)
    plan = standby.cluster.plan_recovery(target, lost=[DATA, WAL])
    assert record.id in plan.explain()
    assert any("taken on a standby" in w for w in plan.warnings), plan.warnings
    standby.cluster.execute(plan)
    assert standby.rows() == {1: 3, 2: 3, 100: len(done)}
    assert not standby.server.sql("SELECT pg_is_in_recovery()")[0][0]


def test_a_standby_promoted_during_its_backup_fails_cleanly(e2e_env: Any, pg_server: Any) -> None:
    env: Env = e2e_env()
    env.create_table()
    env.write(1)
    standby = Standby(env, pg_server)
    before = {s.id for s in standby.cluster.backend.list_snapshots()}

    def promote_after_snapshot(event: Event) -> None:
        if event.step_id == "snapshot" and event.kind is EventKind.FINISHED:
            standby.server.pg_ctl("promote", "-w")

    plan = standby.cluster.plan_backup("promoted mid-way")
    with pytest.raises(PgsnapError) as failed:
        standby.cluster.execute(plan, on_event=promote_after_snapshot)
    assert "promoted" in str(failed.value), failed.value
    record = standby.cluster.backup_of(plan)
    assert record.state is BackupState.FAILED
    assert {s.id for s in standby.cluster.backend.list_snapshots()} == before
    assert not standby.server.sql("SELECT pg_is_in_recovery()")[0][0]
    assert_server_not_in_backup_mode(standby.server)  # a backup starts and stops there


def test_without_the_primary_a_standby_backup_waits_for_the_primarys_archive_timeout(
    e2e_env: Any, pg_server: Any
) -> None:
    env: Env = e2e_env(archive_timeout="1s")
    env.create_table()
    env.write(1)
    standby = Standby(env, pg_server, reach_primary=False)
    plan = standby.cluster.plan_backup("alone", wal_timeout=60)
    assert "primary-switch-wal" not in [s.id for s in plan.steps]
    assert any("standby_wal" in w for w in plan.warnings), plan.warnings
    thread, stop, _done = writer(env, 100)  # traffic, so archive_timeout switches
    try:
        standby.cluster.execute(plan)
    finally:
        stop.set()
        thread.join()
    assert standby.cluster.backup_of(plan).state is BackupState.DONE


# --------------------------------------------------------------------------- seeding


def _pg_wal(server: PgServer) -> set[str]:
    return {p.name for p in server.wal_dir.iterdir() if len(p.name) == 24}


def _recycle(env: Env) -> None:
    """Finish several segments and checkpoint: the primary's pg_wal lets them go."""
    for batch in range(10, 14):
        env.write(batch)
        env.switch_wal()
    env.server.sql("CHECKPOINT")


def _slots(env: Env) -> dict[str, bool]:
    return {
        str(name): bool(active)
        for name, active in env.server.sql("SELECT slot_name, active FROM pg_replication_slots")
    }


def _conninfo(env: Env) -> str:
    return f"host={env.server.socket_dir} port={env.server.port} user=postgres"


def test_a_standby_seeded_from_a_snapshot_streams_catches_up_and_outlives_its_backup(
    e2e_env: Any, bindir: Path
) -> None:
    env: Env = e2e_env(bindir)
    env.create_table()
    env.write(1)
    record = env.cluster.backup("seed")
    start_segment = (record.labelfile or "").split("(file ", 1)[1][:24]
    _recycle(env)  # the primary no longer has the backup's WAL: the archive serves it
    assert start_segment not in _pg_wal(env.server)

    plan = env.cluster.plan_seed_standby("s1", primary_conninfo=_conninfo(env))
    actions = [s.action for s in plan.steps]
    assert actions.index("db.create_slot") < actions.index("db.start_clone"), plan.explain()
    assert record.id in plan.explain() and "pgsnap_s1" in plan.explain()
    env.cluster.execute(plan)
    standby = env.cluster.catalog.get_clone("s1")
    assert standby.purpose == "standby" and standby.slot == "pgsnap_s1"
    assert standby.state.value == "ready"
    assert _slots(env) == {"pgsnap_s1": True}
    server = env.cluster.adapter.instance(  # type: ignore[attr-defined]
        data_directory=standby.data_directory, port=standby.port, socket_directory=standby.at
    )
    assert server.query("SELECT pg_is_in_recovery(), status FROM pg_stat_wal_receiver") == [
        (True, "streaming")
    ]
    # Rows written on the primary arrive; caught up, it lags 0 bytes and holds the
    # primary's rows exactly.
    env.write(20)
    lsn = str(env.server.sql("SELECT pg_current_wal_lsn()::text")[0][0])
    deadline = time.monotonic() + 30
    while not server.query(f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn")[0][0]:
        assert time.monotonic() < deadline, "the seeded standby does not keep up"
        time.sleep(0.05)
    rows = "SELECT batch, n FROM t ORDER BY 1, 2"
    assert server.query(rows) == env.server.sql(rows)
    lag = env.server.sql(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn) FROM pg_stat_replication"
    )
    assert [int(x[0]) for x in lag] == [0]

    # The backup expires: the standby does not depend on its snapshots.
    env.cluster.delete(record.id)
    server.stop_server()
    server.start_server()
    deadline = time.monotonic() + 30
    while True:
        try:
            if server.query("SELECT status FROM pg_stat_wal_receiver") == [("streaming",)]:
                break
        except PgsnapError:
            pass
        assert time.monotonic() < deadline, "the standby does not come back"
        time.sleep(0.1)
    assert server.query(rows) == env.server.sql(rows)

    env.cluster.destroy_standby("s1")
    assert _slots(env) == {}
    assert env.cluster.standbys() == ()
    assert not Path(standby.at).exists()


def test_seeding_is_refused_before_anything_when_the_archive_cannot_reach_the_primary(
    e2e_env: Any,
) -> None:
    env: Env = e2e_env()
    env.create_table()
    env.write(1)
    env.cluster.backup("seed")
    lost = env.switch_wal()
    _recycle(env)
    (env.archive_dir / lost).unlink()  # neither the archive nor pg_wal has it now
    assert lost not in _pg_wal(env.server)
    with pytest.raises(PgsnapError) as refused:
        env.cluster.plan_seed_standby("s2", primary_conninfo=_conninfo(env))
    assert lost in str(refused.value) or "gap" in str(refused.value).lower(), refused.value
    assert env.cluster.standbys() == () and _slots(env) == {}


def test_a_standby_that_cannot_reach_the_primary_is_undone_slot_and_all(e2e_env: Any) -> None:
    env: Env = e2e_env()
    env.create_table()
    env.write(1)
    env.cluster.backup("seed")
    volumes = {v.id for v in env.backend.list_volumes()}
    wrong = f"host={env.server.socket_dir} port=1 user=postgres"  # nobody listens there
    with pytest.raises(PgsnapError) as failed:
        env.cluster.seed_standby("s3", primary_conninfo=wrong, catch_up_timeout=5)
    assert "did not catch up" in str(failed.value), failed.value
    assert _slots(env) == {}
    assert env.cluster.standbys() == ()
    assert {v.id for v in env.backend.list_volumes()} == volumes
    with pytest.raises(PgsnapError, match="password"):
        env.cluster.plan_seed_standby("s4", primary_conninfo=_conninfo(env) + " password=x")
