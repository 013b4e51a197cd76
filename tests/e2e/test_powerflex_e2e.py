"""Backup and point-in-time recovery with the PowerFlex backend, against the simulator.

A real PostgreSQL server runs on simulated PowerFlex volumes (data, WAL,
archive), mapped to the SDC ``db1`` and mounted through the simulator's host.
pgsnap backs it up with one ``snapshotVolumes`` (``createSnapshot`` on 5.x)
call over HTTP, rows are written, the volumes are lost, and the recovery
plan unmounts, unmaps, overwrites (``overwriteVolumeContent``, or
``restore`` on 5.x), maps (``addMappedSdc``; ``addMappedHost`` on 5.x), waits for
the device and mounts before
PostgreSQL replays to the target. The test checks WHICH ROWS EXIST.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from pgsnap.backends.powerflex import PowerFlexBackend, PowerFlexSnapshotLimit
from pgsnap.errors import ExecutionError
from pgsnap.model import BackupState, RecoveryTarget, VolumeRole
from pgsnap.testing.powerflex_sim import Fault, PowerFlexSimulator, powerflex_cluster

from .conftest import Env, assert_not_in_backup_mode, backed_up, pitr_setup

pytestmark = pytest.mark.postgres

DATA = VolumeRole.DATA
WAL = VolumeRole.WAL
STEPS = ("unmount", "detach", "restore", "attach", "wait-device", "mount")


@pytest.fixture
def pf_env(pg_server: Any) -> Iterator[Callable[[str], tuple[Env, PowerFlexSimulator]]]:
    """``pf_env(version, **backend_options)``: a running cluster on simulated PowerFlex volumes, under pgsnap."""
    made: list[tuple[PowerFlexBackend, PowerFlexSimulator]] = []

    def build(version: str, **backend_options: Any) -> tuple[Env, PowerFlexSimulator]:
        server = pg_server(
            None,
            wal_segsize_mb=1,
            separate_wal_dir=True,
            archive=True,
            settings={"archive_timeout": "60s", "autovacuum": False},
        )
        server.start()
        sim = PowerFlexSimulator(version=version, root=server.base_dir / "array").start()
        options = {"sleep": lambda _s: None, **backend_options}
        cluster = powerflex_cluster(server, sim, backend_options=options)
        backend = cast(PowerFlexBackend, cluster.backend)
        made.append((backend, sim))
        layout = cluster.layout
        assert layout.wal is not None
        archive = layout.by_role(VolumeRole.ARCHIVE)[0]
        env = Env(server, cast(Any, backend), cluster, layout.data.id, layout.wal.id, archive.id)
        return env, sim

    yield build
    for backend, sim in made:
        backend.close()
        sim.stop()


@pytest.mark.parametrize("version", ["3.6", "4.5", "5.0"])
def test_point_in_time_recovery_on_powerflex(pf_env: Any, version: str) -> None:
    env, sim = pf_env(version)
    snap_action = "createSnapshot" if sim.major >= 5 else "snapshotVolumes"
    restore_action = "restore" if sim.major >= 5 else "overwriteVolumeContent"
    # Mapping as PyPowerFlex does: SDCs on 3.x/4.x, Host objects on 5.x.
    add, remove = (
        ("addMappedHost", "removeMappedHost")
        if sim.major >= 5
        else ("addMappedSdc", "removeMappedSdc")
    )
    target = pitr_setup(env, "time")  # batch 1, backup, batch 2, <target>, batch 3
    (record,) = env.cluster.backups()
    assert sim.count(action=snap_action) == 1  # one call for data and WAL together
    group = env.cluster.backend.get_snapshot_group(record.snapshot_group_id or "")
    assert {s.volume_id for s in group.snapshots} == {env.data_vol, env.wal_vol}
    assert group.name == record.id  # the backup id is in the snapshots' names
    assert all(s.name.startswith(f"{record.id}.") for s in group.snapshots)
    backend = cast(PowerFlexBackend, env.cluster.backend)
    policy = backend.ex_create_policy("hourly-data", [env.data_vol])
    env.crash()
    env.lose_data()
    env.lose_wal()

    plan = env.cluster.plan_recovery(target, lost=[DATA, WAL])
    ids = [s.id for s in plan.steps]
    assert ids.index("pause-policies") < ids.index(f"restore-{env.data_vol}")
    assert ids.index("resume-policies") > ids.index(f"mount-{env.data_vol}")
    for vol in (env.data_vol, env.wal_vol):
        steps = [s.id for s in plan.steps if s.id.endswith(f"-{vol}")]
        assert steps == [f"{a}-{vol}" for a in STEPS], plan.explain()
    text = plan.explain() + plan.to_json()
    for secret in (sim.credentials[1], *sim.issued_tokens()):
        assert secret not in text
    env.cluster.execute(plan)

    assert env.batches() == env.expect(1, 2), plan.explain()
    assert env.timeline() == 2
    assert sim.count(action=restore_action) == 2
    assert sim.count(action=remove) == 2
    assert sim.count(action=add) == 3 + 2  # set-up, then after the restores
    snapshots = {s.id for s in env.cluster.backend.list_snapshots()}
    assert set(record.snapshots.values()) <= snapshots  # the backup's snapshots survive
    env.write(4)  # the recovered cluster is writable
    assert env.batches() == env.expect(1, 2, 4)
    assert sim.logins == 1  # set-up, backup and recovery on one session
    # The policy of the restored data volume was paused during the recovery, then resumed.
    assert sim.count(action="pauseSnapshotPolicy") == 1
    assert sim.count(action="resumeSnapshotPolicy") == 1
    assert [p.paused for p in backend.list_policies() if p.id == policy] == [False]


def test_complete_recovery_keeps_the_wal_volume(pf_env: Any) -> None:
    env, sim = pf_env("4.5")
    backed_up(env)
    env.write(2)
    env.switch_wal()
    env.write(3)  # only in pg_wal, on the WAL volume
    env.crash()
    env.lose_data()
    plan = env.cluster.plan_recovery(RecoveryTarget.latest(), lost=[DATA])
    restored = [s.params["volume_id"] for s in plan.steps if s.id.startswith("restore-")]
    assert restored == [env.data_vol]
    env.cluster.execute(plan)
    assert env.batches() == env.expect(1, 2, 3)
    assert sim.count(action="overwriteVolumeContent") == 1


def test_a_vtree_at_its_limit_fails_the_backup_and_ends_backup_mode(pf_env: Any) -> None:
    # The V-Tree is filled behind the backend's back: no listing reuse to go stale.
    env, sim = pf_env("3.6", listing_ttl=0)
    env.create_table()
    env.write(1)
    client = cast(PowerFlexBackend, env.cluster.backend).client
    client.post(
        f"/instances/System::{sim.system_id}/action/snapshotVolumes",
        {
            "snapshotDefs": [
                {"volumeId": env.wal_vol, "snapshotName": f"old-{n}"} for n in range(126)
            ],
            "accessModeLimit": "ReadOnly",
        },
    )
    before = {s.id for s in env.cluster.backend.list_snapshots()}
    with pytest.raises(ExecutionError) as info:
        env.cluster.backup("e2e at the limit")
    assert isinstance(info.value.cause, PowerFlexSnapshotLimit)
    assert "126 snapshots" in str(info.value.cause)
    assert_not_in_backup_mode(env)
    assert {s.id for s in env.cluster.backend.list_snapshots()} == before
    (record,) = env.cluster.backups()
    assert record.state is BackupState.FAILED
    assert record.failure_reason and "snapshot limit" in record.failure_reason


def test_a_backup_through_faults_makes_one_group(pf_env: Any) -> None:
    """503s on reads, the token expiring and the connection dropped after
    ``snapshotVolumes`` was carried out: the backup is DONE with exactly one group,
    recorded, and recovers."""
    env, sim = pf_env("4.5", listing_ttl=0)
    env.create_table()
    env.write(1)
    listing = "/api/types/Volume/instances"
    reads = sim.inject(Fault("status", method="GET", path_contains=listing, times=2, status=503))
    sim.inject(Fault("expire_tokens", path_contains="snapshotVolumes"))
    dropped = sim.inject(Fault("drop_after", path_contains="snapshotVolumes"))
    record = env.cluster.backup("e2e through faults")
    assert record.state is BackupState.DONE
    assert (reads.fired, dropped.fired) == (2, 1)
    assert [r.status for r in sim.requests if r.action == "snapshotVolumes"] == [401, 0]
    assert sim.logins == 2
    groups = {sim.volume(v)["consistencyGroupId"] for v in sim.volume_ids()} - {None}
    assert groups == {record.snapshot_group_id}
    assert_not_in_backup_mode(env)
    env.write(2)
    env.switch_wal()
    env.crash()
    env.lose_data()
    env.cluster.execute(env.cluster.plan_recovery(RecoveryTarget.latest(), lost=[DATA]))
    assert env.batches() == env.expect(1, 2)
