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

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import attrs
import pytest

from pgsnap.backends.powerflex import PowerFlexBackend, PowerFlexSnapshotLimit
from pgsnap.errors import ExecutionError, InvariantError, PgsnapError
from pgsnap.executor import Event, EventKind
from pgsnap.model import BackupState, RecoveryTarget, VolumeRole
from pgsnap.plan import Plan
from pgsnap.testing.powerflex_sim import Fault, PowerFlexSimulator, powerflex_cluster

from ._clones import clone_scenario
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


def _doctored(plan: Plan, step_id: str, **params: Any) -> Plan:
    """``plan`` with a step's parameters changed (built in Python: no id to disagree)."""
    steps = tuple(
        attrs.evolve(s, params={**s.params, **params}) if s.id == step_id else s for s in plan.steps
    )
    return attrs.evolve(plan, steps=steps)


def test_a_copy_of_a_powerflex_backup_recovers_once_the_snapshots_are_gone(
    pf_env: Any, tmp_path: Path
) -> None:
    """Issue 21: the backup's snapshot volume is mapped read-only to the SDC, mounted
    beside its origin, copied, unmounted and unmapped; doctored plans that would
    mount over or read the live data directory, or unmap an origin, are refused
    before the first step; a failed send is undone; then every snapshot is
    deleted and the recovery planner restores the copy and replays to a time."""
    env, sim = pf_env("4.5")
    env.cluster.copy_mount_root = str(tmp_path / "copy-mnt")
    target = pitr_setup(env, "time")  # batch 1, backup, batch 2, <target>, batch 3
    (record,) = env.cluster.backups()
    data, snap = env.data_vol, record.snapshots[env.data_vol]
    plan = env.cluster.plan_copy(record.id, tmp_path / "copies")
    assert [s.id for s in plan.steps] == [
        f"expose-{data}",
        f"mount-{data}",
        "send",
        f"unmount-{data}",
        f"conceal-{data}",
        "record",
    ]
    point = str(tmp_path / "copy-mnt" / f"{record.id}.1" / "pgdata")
    assert plan.steps[2].params["trees"] == {"pgdata": point}

    maps = sim.count(action="addMappedSdc")
    live = str(env.server.data_dir)
    for step, edit, refusal in (
        (f"mount-{data}", {"mount_point": live}, "mount point of volume"),
        (f"unmount-{data}", {"mount_point": live}, "mount point of volume"),
        ("send", {"trees": {"pgdata": live}}, "mount point of volume"),
        ("send", {"trees": {"pgdata": str(env.server.data_dir.parent)}}, "inside or around"),
        ("send", {"trees": {"pgdata": str(tmp_path / "elsewhere")}}, "no step of this plan"),
        (f"expose-{data}", {"snapshot_id": data}, "is a volume of the cluster"),
        (f"conceal-{data}", {"snapshot_id": data}, "is a volume of the cluster"),
        (f"expose-{data}", {"snapshot_id": record.snapshots[env.wal_vol]}, "not backup"),
        (f"mount-{data}", {"device": "/dev/sda"}, "not the device a step"),
        (f"expose-{data}", {"host": "backup1"}, "pgsnap runs on the database host"),
    ):
        with pytest.raises(InvariantError, match=refusal):
            env.cluster.execute(_doctored(plan, step, **edit))
    assert sim.count(action="addMappedSdc") == maps  # nothing was mapped
    assert not (tmp_path / "copy-mnt").exists()

    # A send that fails (the target cannot be made) unmounts and unmaps the snapshot.
    (tmp_path / "blocked").write_text("a file, not a directory")
    failing = env.cluster.plan_copy(record.id, tmp_path / "blocked" / "copies")
    with pytest.raises(PgsnapError):
        env.cluster.execute(failing)
    assert sim.volume(snap)["mappedSdcInfo"] in (None, [])
    assert not os.path.exists(point) and env.cluster.interrupted() == ()
    assert sim.count(action="removeMappedSdc") == 1

    # Interrupted once the snapshot is mounted (as a crash would stop pgsnap): the
    # plan resumes from its journal, reads the mount point and undoes the exposure.
    def crash_after_mount(event: Event) -> None:
        if event.kind is EventKind.FINISHED and event.step_id == f"mount-{data}":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        env.cluster.execute(plan, on_event=crash_after_mount)
    assert [p.id for p in env.cluster.interrupted()] == [plan.id]
    assert os.path.isdir(point)  # still mounted
    events: list[Event] = []
    assert env.cluster.execute(plan, on_event=events.append).resumed
    skipped = [e.step_id for e in events if e.kind is EventKind.SKIPPED]
    assert skipped == [f"expose-{data}", f"mount-{data}"]
    (copy,) = env.cluster.catalog.get(record.id).copies
    assert copy.files > 100 and env.cluster.verify_copy(copy.copy_id, tmp_path / "copies").ok
    assert sim.volume(snap)["mappedSdcInfo"] in (None, [])  # unmapped again
    assert not os.path.exists(point)  # unmounted, its mount point removed
    assert sim.count(action="removeMappedSdc") == 2

    # The array loses the backup; the data volume is wiped (a fresh, mounted file system).
    assert record.snapshot_group_id is not None
    env.cluster.backend.delete_snapshot_group(record.snapshot_group_id)
    env.crash()
    env.lose_data()
    env.cluster.copy_target = str(tmp_path / "copies")
    recovery = env.cluster.plan_recovery(target, lost=[DATA])
    actions = [s.action for s in recovery.steps]
    assert actions.count("copy.restore") == 1 and "storage.restore_volume" not in actions
    env.cluster.execute(recovery)
    assert env.batches() == env.expect(1, 2), recovery.explain()


@pytest.mark.parametrize("version", ["4.5", "5.0"])
def test_a_clone_on_powerflex_is_a_snapshot_of_the_snapshot_mapped_to_the_host(
    pf_env: Any, version: str
) -> None:
    env, _sim = pf_env(version)
    plan = clone_scenario(env)
    actions = [s.action for s in plan.steps]
    assert "storage.attach_clone" in actions and "host.mount_clone" in actions
    volumes = {v.id for v in env.backend.list_volumes()}
    env.switch_wal()  # batches 4 and 5 archived: a latest drill replays them
    drill = env.cluster.drill(checks=["SELECT count(*) = 15 FROM t"])
    assert drill.ok, [c for c in drill.checks if not c.ok]
    assert env.cluster.clones() == ()
    assert {v.id for v in env.backend.list_volumes()} == volumes
