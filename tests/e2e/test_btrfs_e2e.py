"""Recovery on real btrfs: PostgreSQL's data directory and pg_wal on two subvolumes.

A loop-mounted btrfs holds the cluster (``<base>/data`` and ``<base>/wal`` are
subvolumes; the archive, catalog and journal are plain directories beside
them); :class:`~pgsnap.backends.btrfs.BtrfsBackend` snapshots the two
subvolumes in backup mode and restores by swapping subvolumes. Each test
writes numbered batches of rows, breaks the cluster, recovers through
:class:`~pgsnap.cluster.Cluster` and checks WHICH ROWS EXIST. Without root,
btrfs, loop devices or PostgreSQL the tests skip saying why (and fail in CI).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from pgsnap.backends.btrfs import BtrfsBackend, parse_subvolume_list
from pgsnap.model import RecoveryTarget, VolumeRole
from pgsnap.testing.btrfs import LoopBtrfs, btrfs_cluster, btrfs_server, btrfs_unavailable

from ._clones import clone_scenario
from .conftest import Env, backed_up, pitr_setup

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("loop")]

DATA = VolumeRole.DATA
WAL = VolumeRole.WAL


@pytest.fixture
def fs() -> Iterator[LoopBtrfs]:
    reason = btrfs_unavailable()
    if reason is not None:
        pytest.skip(f"no loop-mounted btrfs on this machine: {reason}")
    with LoopBtrfs.create() as made:
        yield made


@pytest.fixture
def btrfs_env(fs: LoopBtrfs, pg_server: Any, pg_bindir: Any) -> Callable[[], Env]:
    """``btrfs_env()``: a running cluster on two subvolumes of ``fs``, under pgsnap.

    ``fs`` comes first, so it is torn down last (after the server is stopped).
    """

    def build() -> Env:
        server = btrfs_server(
            pg_bindir,
            fs,
            prepare=pg_server.prepare,
            archive=True,
            settings={"archive_timeout": "60s", "autovacuum": False},
        )
        server.start()
        cluster = btrfs_cluster(server, fs)
        backend = cluster.backend
        assert isinstance(backend, BtrfsBackend)
        return Env(
            server, cast(Any, backend), cluster, str(server.data_dir), str(server.wal_dir), ""
        )

    return build


def subvolume_facts(env: Env, path: str) -> tuple[str, str | None]:
    """``(uuid, parent uuid)`` of the subvolume at ``path``, from btrfs itself."""
    mount = env.cluster.backend.get_volume(path).extra["fs_path"].lstrip("/")
    listing = subprocess.run(
        ["btrfs", "subvolume", "list", "-a", "-u", "-q", path],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    (sub,) = [s for s in parse_subvolume_list(listing) if s.path == mount]
    return sub.uuid, sub.parent_uuid


@pytest.mark.parametrize("kind", ["time", "xid"])
def test_point_in_time_recovery_restores_both_subvolumes(btrfs_env: Any, kind: str) -> None:
    env: Env = btrfs_env()
    target = pitr_setup(env, kind)  # batch 1, backup, batch 2, <target>, batch 3
    (record,) = env.cluster.backups()
    assert set(record.snapshots) == {env.data_vol, env.wal_vol}
    env.crash()
    env.lose_data()
    env.lose_wal()

    plan = env.cluster.plan_recovery(target, lost=[DATA, WAL])
    restores = [s for s in plan.steps if s.id.startswith("restore-")]
    assert sorted(s.params["volume_id"] for s in restores) == sorted([env.data_vol, env.wal_vol])
    # A btrfs volume's id is its path: the steps are named by the layout's names.
    assert all("/" not in s.id for s in plan.steps), [s.id for s in plan.steps]
    # Reached through their parent mount, the subvolumes are swapped in place: no unmount.
    assert not [s for s in plan.steps if s.id.startswith(("unmount-", "mount-"))]
    env.cluster.execute(plan)

    assert env.batches() == env.expect(1, 2), plan.explain()
    assert env.timeline() == 2
    for volume in (env.data_vol, env.wal_vol):
        # A new subvolume, snapshotted from the backup's snapshot, which stays.
        snapshot = record.snapshots[volume]
        snaps = {s.id: s for s in env.backend.list_snapshots(volume)}
        assert snapshot in snaps
        assert subvolume_facts(env, volume)[1] == snaps[snapshot].extra["uuid"]
    env.write(4)  # the recovered cluster is writable
    assert env.batches() == env.expect(1, 2, 4)


def test_complete_recovery_keeps_the_wal_subvolume(btrfs_env: Any) -> None:
    env: Env = btrfs_env()
    backed_up(env)
    env.write(2)
    env.switch_wal()  # batch 2 is archived
    env.write(3)  # batch 3 is only in pg_wal, on the WAL subvolume: never archived
    current = env.server.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")[0][0]
    wal_before = subvolume_facts(env, env.wal_vol)
    data_before = subvolume_facts(env, env.data_vol)
    env.crash()
    assert not (env.archive_dir / current).exists()
    env.lose_data()

    plan = env.cluster.plan_recovery(RecoveryTarget.latest(), lost=[DATA])
    restored = [s.params["volume_id"] for s in plan.steps if s.id.startswith("restore-")]
    assert restored == [env.data_vol]
    env.cluster.execute(plan)

    assert env.batches() == env.expect(1, 2, 3)
    assert subvolume_facts(env, env.wal_vol) == wal_before  # the very same WAL subvolume
    assert subvolume_facts(env, env.data_vol)[0] != data_before[0]  # data was swapped
    leftovers = [p for p in (env.server.base_dir).iterdir() if ".pgsnap-" in p.name]
    assert leftovers == []
    env.write(4)
    assert env.batches() == env.expect(1, 2, 3, 4)


def test_the_demo_runs_on_btrfs(fs: LoopBtrfs, capsys: pytest.CaptureFixture[str]) -> None:
    """``pgsnap demo --backend btrfs`` recovers the right rows and leaves nothing behind.

    (The ``fs`` fixture only checks that this machine can make a loop-mounted btrfs.)
    """
    from pgsnap.cli import EXIT_OK, main

    def loops() -> set[str]:
        out = subprocess.run(["losetup", "-a"], check=True, capture_output=True, text=True)
        return {line.split(":", 1)[0] for line in out.stdout.splitlines()}

    before = loops()
    assert main(["demo", "--backend", "btrfs"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "verification: PASSED" in out
    assert "btrfs subvolumes" in out
    assert "restore-" in out
    assert loops() == before


def test_a_copy_of_a_btrfs_backup_recovers_once_the_file_system_is_gone(
    btrfs_env: Callable[[], Env], tmp_path: Any
) -> None:
    """Issue 21: the read-only snapshot subvolume is copied in place (no load on the
    origin), every snapshot of the backup deleted, the data subvolume replaced by a
    new, empty one; the recovery plan restores the copy into it and replays to a time
    between two batches."""
    env = btrfs_env()
    env.create_table()
    env.write(1)
    record = env.cluster.backup("btrfs-copy")
    env.write(2)
    time.sleep(0.05)
    (when,) = env.server.sql("SELECT clock_timestamp()")[0]
    time.sleep(0.05)
    env.write(3)
    env.server.switch_wal_and_wait_archived()
    target = tmp_path / "copies"
    copy = env.cluster.copy(record.id, target)
    assert copy.files > 100 and env.cluster.verify_copy(copy.copy_id, target).ok
    assert record.snapshot_group_id is not None
    env.cluster.backend.delete_snapshot_group(record.snapshot_group_id)
    env.server.stop(mode="immediate")
    data = env.data_vol
    subprocess.run(["btrfs", "subvolume", "delete", data], check=True, capture_output=True)
    subprocess.run(["btrfs", "subvolume", "create", data], check=True, capture_output=True)

    env.cluster.copy_target = str(target)
    plan = env.cluster.plan_recovery(RecoveryTarget.time(when))
    assert [s.action for s in plan.steps].count("copy.restore") == 1
    assert "storage.restore_volume" not in [s.action for s in plan.steps]
    env.cluster.execute(plan)
    assert env.batches() == env.expect(1, 2)


def test_a_clone_on_btrfs_is_a_new_subvolume_beside_production(btrfs_env: Any) -> None:
    env: Env = btrfs_env()
    clone_scenario(env)
    volumes = {v.id for v in env.backend.list_volumes()}
    env.switch_wal()  # batches 4 and 5 archived: a latest drill replays them
    drill = env.cluster.drill(checks=["SELECT count(*) = 15 FROM t"])
    assert drill.ok, [c for c in drill.checks if not c.ok]
    assert env.cluster.clones() == ()
    assert {v.id for v in env.backend.list_volumes()} == volumes


def test_a_standby_on_btrfs_is_backed_up_there_recovered_and_a_new_one_seeded(
    btrfs_env: Any, fs: LoopBtrfs, pg_server: Any
) -> None:
    """Issue 24 on real btrfs: the primary and its streaming standby on subvolumes of
    their own; a second standby seeded from the primary's backup (a writable snapshot
    of the read-only one) streams with the primary's rows; a backup taken on the
    first standby; that standby loses both subvolumes and is recovered to a time from
    the shared archive (rows checked). The recovery comes last: the recovered
    standby is a primary of its own, archiving a new timeline."""
    from pgsnap.adapters.postgres import PostgresAdapter
    from pgsnap.model import BackupState, ServerRole
    from pgsnap.testing.btrfs import make_subvolumes
    from pgsnap.testing.pgserver import PgServer

    env: Env = btrfs_env()
    env.create_table()
    env.write(1)
    standby = PgServer.standby_of(
        env.server,
        parent_dir=fs.mount_point,
        make_directories=lambda s: make_subvolumes(s.data_dir, s.wal_dir),
    )
    pg_server.servers.append(standby)
    standby.start()
    standby.wait_for_streaming()
    on_standby = btrfs_cluster(
        standby,
        fs,
        snapshot_dir=str(fs.mount_point / "standby-snapshots"),
        primary=PostgresAdapter(env.server.conninfo()),
    )
    # A new standby of the primary, seeded from the primary's own backup.
    env.cluster.backup("seed")
    made = env.cluster.seed_standby(
        "s1",
        primary_conninfo=f"host={env.server.socket_dir} port={env.server.port} user=postgres",
    )
    server = env.cluster.adapter.instance(  # type: ignore[attr-defined]
        data_directory=made.data_directory, port=made.port, socket_directory=made.at
    )
    env.write(5)
    lsn = str(env.server.sql("SELECT pg_current_wal_lsn()::text")[0][0])
    deadline = time.monotonic() + 30
    while not server.query(f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn")[0][0]:
        assert time.monotonic() < deadline, "the seeded standby does not keep up"
        time.sleep(0.05)
    query = "SELECT batch, n FROM t ORDER BY 1, 2"
    assert server.query(query) == env.server.sql(query)
    env.cluster.destroy_standby("s1")
    assert env.server.sql("SELECT count(*) FROM pg_replication_slots")[0][0] == 0

    env.write(2)
    record = on_standby.backup("on the standby")
    assert record.state is BackupState.DONE and record.taken_on is ServerRole.STANDBY
    env.write(3)
    lsn = str(env.server.sql("SELECT pg_current_wal_lsn()::text")[0][0])
    standby.wait_for_replay(lsn)
    target = RecoveryTarget.time(env.now())
    env.write(4)
    env.switch_wal()

    standby.pg_ctl("stop", "-m", "immediate")
    for d in (standby.data_dir, standby.wal_dir):
        env.lose(d)
    plan = on_standby.plan_recovery(target, lost=[DATA, WAL])
    on_standby.execute(plan)
    rows = standby.sql("SELECT batch, count(*) FROM t GROUP BY 1 ORDER BY 1")
    assert rows == [(1, 3), (2, 3), (3, 3), (5, 3)], plan.explain()
    standby.stop()
