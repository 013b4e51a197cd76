"""PostgreSQL on logical volumes inside the lvm2 test VM, backed up and recovered by
:class:`~pgsnap.cluster.Cluster`.

:class:`~pgsnap.testing.lvmpg.LvmPostgres` boots the VM with a PostgreSQL
server of this machine, two logical volumes (data, ``pg_wal``) and a WAL
archive in a directory shared with this machine, where pgsnap reads it; the
catalog and journal are here too. Everything on the database host goes
through the VM's console Host. Two set-ups, one VM each:

- **PostgreSQL 15, ext4 on thin volumes**: a restore swaps in a thin copy of
  the backup's snapshot, which stays;
- **PostgreSQL 17, XFS on linear volumes, classic snapshots**: a restore merges
  the snapshot and consumes it (the plan says so under "lost").

Each test writes numbered batches of rows, takes backups with
``Cluster.backup``, breaks the cluster, recovers with ``Cluster.plan_recovery``
and ``Cluster.execute``, and checks WHICH ROWS EXIST.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from pgsnap.backends.lvm import LvmBackend
from pgsnap.errors import MountBusyError, PgsnapError, PlanningError
from pgsnap.executor import Event, EventKind
from pgsnap.host import CommandResult, Host
from pgsnap.model import RecoveryTarget, VolumeRole
from pgsnap.testing.lvmpg import (
    DATA_MNT,
    PGDATA,
    PGWAL,
    VG,
    WAL_MNT,
    LvmPostgres,
    VmPgSetup,
    lvmpg_unavailable,
)

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("lvm-e2e")]

DATA, WAL = VolumeRole.DATA, VolumeRole.WAL


def boot(setup: VmPgSetup) -> Generator[LvmPostgres, None, None]:
    reason = lvmpg_unavailable()
    if reason is not None:
        pytest.skip(f"no PostgreSQL on lvm2 in a VM on this machine: {reason}")
    with LvmPostgres.boot(setup) as pg:
        pg.sql("CREATE TABLE rows (batch int, n int)")
        yield pg


SETUPS = {
    "thin_ext4": VmPgSetup(major=15, fs="ext4", thin=True),
    "classic_xfs": VmPgSetup(major=17, fs="xfs", thin=False),
}
"""The VM set-ups; tests/e2e/conftest.py orders this module's tests by set-up."""


class _OneVm:
    """At most one VM at a time: an idle VM still costs a core under TCG, and the
    tests run grouped by set-up (tests/e2e/conftest.py), so each boots once."""

    def __init__(self) -> None:
        self.name: str | None = None
        self._booted: Generator[LvmPostgres, None, None] | None = None
        self.env: LvmPostgres | None = None

    def get(self, name: str) -> LvmPostgres:
        if self.name != name or self.env is None:
            self.close()
            self._booted = boot(SETUPS[name])
            self.env = next(self._booted)
            self.name = name
        return self.env

    def close(self) -> None:
        booted, self._booted, self.env, self.name = self._booted, None, None, None
        if booted is not None:
            booted.close()  # leaves the LvmPostgres.boot block: the VM is shut down


@pytest.fixture(scope="module")
def vm_pool() -> Iterator[_OneVm]:
    pool = _OneVm()
    yield pool
    pool.close()


@pytest.fixture
def thin_ext4(vm_pool: _OneVm) -> LvmPostgres:
    return vm_pool.get("thin_ext4")


@pytest.fixture
def classic_xfs(vm_pool: _OneVm) -> LvmPostgres:
    return vm_pool.get("classic_xfs")


def write(env: LvmPostgres, batch: int) -> None:
    env.sql("INSERT INTO rows SELECT %s, g FROM generate_series(1, 3) g", (batch,))


def batches(env: LvmPostgres) -> list[int]:
    return [r[0] for r in env.sql("SELECT DISTINCT batch FROM rows ORDER BY 1")]


def recover(env: LvmPostgres, target: RecoveryTarget, lost: Sequence[VolumeRole]) -> Any:
    plan = env.cluster.plan_recovery(target, lost=list(lost))
    try:
        env.cluster.execute(plan)
    except Exception:
        print(plan.explain(), env.server_log(), sep="\n", file=sys.stderr)
        raise
    return plan


def step_ids(plan: Any, prefix: str) -> list[str]:
    return [s.id for s in plan.steps if s.id.startswith(prefix)]


# --------------------------------------------------------------------------- PITR


def test_point_in_time_recovery_through_the_cluster(thin_ext4: LvmPostgres) -> None:
    """A time target on thin volumes (a classic restore's merge is recovered end to end
    by the compensation test below, to the latest point)."""
    env = thin_ext4
    write(env, 1)
    record = env.cluster.backup("lvm-e2e")
    assert sorted(record.snapshots) == [f"{VG}/data", f"{VG}/wal"]
    kinds = {s.extra["kind"] for s in env.backend.list_snapshots()}
    assert kinds == {"thin"}
    write(env, 2)
    target = RecoveryTarget.time(env.now())
    write(env, 3)
    env.switch_wal()
    assert batches(env)[-3:] == [1, 2, 3]
    before = batches(env)[:-3]

    env.crash()
    env.lose(PGDATA)
    env.lose(PGWAL)
    plan = env.cluster.plan_recovery(target, lost=[DATA, WAL])
    text = plan.explain()
    # Block volumes: unmounted, swapped for copies of the snapshots, mounted again.
    assert len(step_ids(plan, "unmount-")) == 2, text
    assert len(step_ids(plan, "restore-")) == 2, text
    assert len(step_ids(plan, "mount-")) == 2, text
    recover(env, target, [DATA, WAL])

    assert batches(env) == [*before, 1, 2], env.server_log()
    assert env.timeline() >= 2
    write(env, 4)  # writable
    assert batches(env)[-3:] == [1, 2, 4]
    mounts = env.host.run(["findmnt", "-n", "-o", "SOURCE,FSTYPE", DATA_MNT]).text.split()
    assert mounts == [f"/dev/mapper/{VG}-data", env.setup.fs]
    names = {s.id for s in env.backend.list_snapshots()}
    assert set(record.snapshots.values()) <= names  # a copy was swapped in; the backup stays


def test_complete_recovery_waits_out_a_busy_file_system_and_keeps_the_wal_volume(
    thin_ext4: LvmPostgres,
) -> None:
    """Only the data volume is lost: the WAL volume is kept and its unarchived WAL
    replayed. First a process (not the server, which the plan stops) holds the data
    volume's file system: the plan's unmount fails with MountBusyError naming it, the
    run is undone, everything stays mounted; once it is gone a new plan recovers."""
    env = thin_ext4
    # The running server holds the data volume: unmounting it is refused, naming
    # the holder, and everything stays mounted.
    with pytest.raises(MountBusyError) as busy:
        env.host.unmount(DATA_MNT)
    assert any("postgres" in h for h in busy.value.holders), busy.value.holders
    assert env.host.mount_of(DATA_MNT) is not None and env.host.mount_of(WAL_MNT) is not None

    env.cluster.backup("lvm-e2e-complete")
    write(env, 5)
    env.switch_wal()
    write(env, 6)  # only in pg_wal, on the WAL volume: never archived
    (current,) = env.sql("SELECT pg_walfile_name(pg_current_wal_lsn())")[0]
    expected = batches(env)
    env.crash()
    assert not (env.archive_dir / current).exists()
    env.lose(PGDATA)
    env.host.run(
        [
            "sh",
            "-c",
            f"cd {DATA_MNT} && {{ sleep 3600 >/dev/null 2>&1 </dev/null & echo $! >/tmp/holder; }}",
        ]
    )
    try:
        plan = env.cluster.plan_recovery(RecoveryTarget.latest(), lost=[DATA])
        with pytest.raises(PgsnapError) as failed:
            env.cluster.execute(plan)
        cause = failed.value.__cause__ or failed.value
        assert isinstance(cause, MountBusyError) or "busy" in str(failed.value), failed.value
        assert "sleep" in str(failed.value), failed.value
        assert env.host.mount_of(DATA_MNT) is not None and env.host.mount_of(WAL_MNT) is not None
        assert env.cluster.interrupted() == ()
    finally:
        env.host.run(["sh", "-c", "kill $(cat /tmp/holder)"])
    time.sleep(1)

    plan = recover(env, RecoveryTarget.latest(), [DATA])
    assert [s.params["volume_id"] for s in plan.steps if s.id.startswith("restore-")] == [
        f"{VG}/data"
    ]
    assert batches(env) == expected, env.server_log()
    assert 6 in expected


# --------------------------------------------------------------------------- faults


def run_until_killed(env: LvmPostgres, plan: Any, kill_after: str) -> int:
    """Execute ``plan`` in another process that SIGKILLs itself once ``kill_after``
    finished; return its exit status.

    That process builds its own Cluster and talks to the VM over the console
    socket, which this process releases meanwhile (one connection at a time).
    """
    plan_file = env.base / "plan.json"
    plan_file.write_text(plan.to_json())
    args = {
        "console": env.vm.console_path,
        "port": env.port,
        "setup": attrs.asdict(env.setup),
        "base": str(env.base),
        "bindir": env.bindir,
        "plan": str(plan_file),
        "kill_after": kill_after,
    }
    root = Path(__file__).resolve().parents[2]
    with env.vm.runner.released():
        child = subprocess.run(
            [sys.executable, "-m", "tests.e2e._lvm_child", json.dumps(args)],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
    if child.returncode != -signal.SIGKILL:
        print(child.stdout, child.stderr, sep="\n", file=sys.stderr)
    return child.returncode


def test_a_killed_recovery_resumes_from_its_journal(classic_xfs: LvmPostgres) -> None:
    env = classic_xfs
    env.cluster.backup("lvm-e2e-killed")
    write(env, 9)
    target = RecoveryTarget.time(env.now())
    write(env, 10)
    env.switch_wal()
    expected = [b for b in batches(env) if b != 10]
    env.crash()
    env.lose(PGDATA)
    plan = env.cluster.plan_recovery(target, lost=[DATA])
    kill_after = step_ids(plan, "restore-")[-1]

    assert run_until_killed(env, plan, kill_after) == -signal.SIGKILL
    assert [p for p in env.cluster.interrupted() if p.id == plan.id]

    events: list[Event] = []
    result = env.cluster.execute(plan, on_event=events.append)
    assert result.resumed
    ids = [s.id for s in plan.steps]
    skipped = [e.step_id for e in events if e.kind is EventKind.SKIPPED]
    assert skipped == ids[: ids.index(kill_after) + 1]
    assert batches(env) == expected, env.server_log()
    assert env.timeline() >= 2


class FailingRestore:
    """A Runner that passes everything to the VM but fails the ``nth`` command of a
    restore the way lvm2 does: the thin copy (``lvcreate -s`` tagged ``pgsnap.new=``,
    the pool is full) or the classic ``lvconvert --merge`` (exit status 5)."""

    def __init__(self, inner: Any, *, thin: bool, nth: int) -> None:
        self.inner = inner
        self.thin = thin
        self.nth = nth
        self.seen = 0

    @property
    def description(self) -> str:
        return str(self.inner.description)

    def _matches(self, argv: Sequence[str]) -> bool:
        if self.thin:
            return "lvcreate" in argv and any(a.startswith("pgsnap.new=") for a in argv)
        return "lvconvert" in argv and "--merge" in argv  # after ``env LC_ALL=C``

    def run(
        self,
        argv: Sequence[str],
        *,
        user: str | None = None,
        stdin: bytes | None = None,
        timeout: float = 60.0,
    ) -> CommandResult:
        if self._matches(argv):
            self.seen += 1
            if self.seen == self.nth:
                message = (
                    f"  Cannot create new thin volume, free space in thin pool {VG}/pool "
                    "reached threshold.\n"
                    if self.thin
                    else f'  Unable to merge LV "{argv[-1]}" into its origin.\n'
                )
                return CommandResult(tuple(argv), 5, b"", message.encode())
        result: CommandResult = self.inner.run(argv, user=user, stdin=stdin, timeout=timeout)
        return result


def test_a_failed_restore_is_compensated_and_a_new_plan_recovers(classic_xfs: LvmPostgres) -> None:
    # Classic volumes only: there the failed run also uses up a snapshot (the merge),
    # the harder case. The thin compensation is the same executor path with a thin
    # restore as the undo, which the LVM conformance restores cover.
    env = classic_xfs
    first = env.cluster.backup("lvm-e2e-first")
    write(env, 7)
    second = env.cluster.backup("lvm-e2e-second")
    write(env, 8)
    env.switch_wal()
    expected = batches(env)
    env.crash()
    env.lose(PGDATA)
    env.host.write_atomic(f"{PGDATA}/MARKER", b"the state before the recovery")
    env.host.write_atomic(f"{PGWAL}/MARKER", b"the WAL before the recovery")

    # The second volume's restore fails: the first volume, already restored, is put
    # back from the safety snapshot, both are mounted again.
    failing = FailingRestore(env.vm.runner, thin=env.setup.thin, nth=2)
    cluster = env.make_cluster(LvmBackend(VG, host=Host(failing)))
    plan = cluster.plan_recovery(RecoveryTarget.latest(), lost=[DATA, WAL])
    assert second.id in plan.explain()
    events: list[Event] = []
    with pytest.raises(PgsnapError) as failed:
        cluster.execute(plan, on_event=events.append)
    assert failing.seen >= 2, failed.value
    assert "undone" in str(failed.value), failed.value
    compensated = [e.step_id for e in events if e.kind is EventKind.COMPENSATING]
    assert any(s.startswith("restore-") for s in compensated), compensated
    assert env.host.read_text(f"{PGDATA}/MARKER") == "the state before the recovery"
    assert env.host.read_text(f"{PGWAL}/MARKER") == "the WAL before the recovery"
    assert env.host.mount_of(DATA_MNT) is not None and env.host.mount_of(WAL_MNT) is not None
    assert cluster.interrupted() == ()
    present = {s.id for s in env.backend.list_snapshots()}
    assert set(first.snapshots.values()) <= present
    # The first volume's merge consumed its snapshot, as the plan said it would.
    assert "lost" in plan.explain().lower()
    assert not set(second.snapshots.values()) <= present

    # A new plan, without the fault, recovers everything from the first backup: the
    # second lost a snapshot to the failed run.
    env.host.remove([f"{PGDATA}/MARKER", f"{PGWAL}/MARKER"])
    plan = recover(env, RecoveryTarget.latest(), [DATA, WAL])
    assert first.id in plan.explain()
    assert batches(env) == expected, env.server_log()


# --------------------------------------------------------------------------- copies


def test_a_copy_of_a_thin_snapshot_recovers_once_the_backups_snapshots_are_gone(
    thin_ext4: LvmPostgres, tmp_path: Path
) -> None:
    """Issue 21 on real lvm2: the copy activates the thin snapshot, mounts it read-only
    (ext4 ``ro,noload``) beside its origin and reads it through the Host seam (tar in
    the VM), then unmounts and deactivates it; with the backup's snapshots deleted,
    the recovery restores the copy into the data volume, writes the copy's WAL, and
    replays to a time target."""
    env = thin_ext4
    write(env, 107)
    record = env.cluster.backup("lvm-e2e-copy")
    plan = env.cluster.plan_copy(record.id, tmp_path / "copies")
    actions = [s.action for s in plan.steps]
    assert actions[:2] == ["storage.expose_snapshot", "host.mount_snapshot"], plan.explain()
    env.cluster.execute(plan)
    (copy,) = env.cluster.catalog.get(record.id).copies
    assert copy.wal and copy.files > 0
    # Nothing left mounted or active of the snapshot.
    mounted = env.host.run(["findmnt", "-rn", "-o", "TARGET"]).text.split()
    assert not [m for m in mounted if m.startswith("/run/pgsnap/copies")], mounted
    write(env, 108)
    target = RecoveryTarget.time(env.now())
    write(env, 109)
    env.switch_wal()
    before = batches(env)
    assert {107, 108, 109} <= set(before)

    assert record.snapshot_group_id is not None
    env.backend.delete_snapshot_group(record.snapshot_group_id)
    env.crash()
    env.lose(PGDATA)
    plan = env.cluster.plan_recovery(target, lost=[DATA])
    assert "copy.restore" in [s.action for s in plan.steps], plan.explain()
    recover(env, target, [DATA])
    assert batches(env) == [b for b in before if b != 109], env.server_log()


# --------------------------------------------------------------------------- clones


def _lvs_names(env: LvmPostgres) -> set[str]:
    return {lv.id for lv in env.backend.ex_logical_volumes()}


def _mounts(env: LvmPostgres) -> list[str]:
    return sorted(env.host.run(["findmnt", "-rn", "-o", "SOURCE,TARGET"]).text.splitlines())


def test_a_clone_on_thin_volumes_never_touches_production(thin_ext4: LvmPostgres) -> None:
    """Issue 22 on real lvm2: the clone's data volume is a thin snapshot of the backup's
    thin snapshot, active and mounted read-write beside production; its server runs in
    the VM on a port of its own (reached over TCP, as production is), replays from the
    shared archive to a time target while production keeps writing, and holds exactly
    the rows of the target. Destroyed, it leaves no LV, no mount, no directory. (A drill
    is this clone plus checks that do not depend on the storage: its e2e tests run on
    btrfs, the mock and the PowerFlex simulator, not again here under TCG.)"""
    env = thin_ext4
    write(env, 201)
    record = env.cluster.backup("lvm-e2e-clone")
    write(env, 202)
    target = RecoveryTarget.time(env.now())
    write(env, 203)
    env.switch_wal()
    expected = [b for b in batches(env) if b != 203]
    lvs_before, mounts_before = _lvs_names(env), _mounts(env)
    archive_before = {p.name for p in env.archive_dir.iterdir()}
    port = env.clone_ports[0]

    plan = env.cluster.plan_clone(target, name="t1", port=port)
    actions = [s.action for s in plan.steps]
    assert "host.mount_clone" in actions and "storage.attach_clone" in actions, plan.explain()
    write(env, 204)  # production goes on
    try:
        clone = env.cluster.clone(target, name="t1", port=port)
    except Exception:
        print(plan.explain(), env.server_log(), sep="\n", file=sys.stderr)
        raise
    assert clone.data_directory == f"{clone.at}/data/pgdata"  # below the volume, as PGDATA
    (made,) = _lvs_names(env) - lvs_before
    assert made == clone.volumes[0].volume_id
    (lv,) = [lv for lv in env.backend.ex_logical_volumes() if lv.id == made]
    assert lv.thin and lv.active and lv.tag("clone") == record.snapshots[f"{VG}/data"].split("/")[1]
    server = env.cluster.adapter.instance(
        data_directory=clone.data_directory, port=clone.port, socket_directory=clone.at
    )
    assert [r[0] for r in server.query("SELECT DISTINCT batch FROM rows ORDER BY 1")] == expected
    assert server.query("SHOW archive_mode")[0][0] == "off"
    server.query("INSERT INTO rows VALUES (299, 1)")  # writable
    server.query("SELECT pg_switch_wal()")
    write(env, 205)
    env.switch_wal()
    assert {204, 205} <= set(batches(env)) and 299 not in batches(env)
    added = {p.name for p in env.archive_dir.iterdir()} - archive_before
    own = f"{env.timeline():08X}"  # production's timeline (earlier tests recovered it)
    assert all(n.startswith(own) and not n.endswith(".history") for n in added), added

    env.cluster.destroy_clone("t1")
    assert env.cluster.clones() == ()
    assert _lvs_names(env) == lvs_before
    assert _mounts(env) == mounts_before
    assert not env.host.exists(clone.at)


def test_a_clone_of_classic_snapshots_is_refused_before_anything_is_made(
    classic_xfs: LvmPostgres,
) -> None:
    env = classic_xfs
    env.cluster.backup("lvm-e2e-classic-clone")
    lvs_before = _lvs_names(env)
    with pytest.raises(PlanningError, match="cannot be snapshotted") as info:
        env.cluster.plan_clone(name="t2", port=env.clone_ports[0])
    assert "thin" in str(info.value) or "another host" in (info.value.hint or "")
    assert _lvs_names(env) == lvs_before
    assert env.cluster.clones() == ()
