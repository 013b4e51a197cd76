"""Clones and drills on real PostgreSQL (issue 22), on mock directory volumes.

Every test writes to production while the clone is made and checks, from the rows,
that the clone holds exactly what the target says and production holds everything;
and that production's data directory, archive and volumes are untouched, and a
destroyed clone leaves nothing on the storage, the host or in the catalog.
The btrfs case is in test_btrfs_e2e.py (same scenario, :func:`clone_scenario`).
"""

from __future__ import annotations

import datetime as dt
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pgsnap.errors import ConfigurationError, InvariantError, PgsnapError
from pgsnap.executor import Event, EventKind
from pgsnap.host import Host
from pgsnap.model import (
    CloneRecord,
    CloneState,
    CloneVolume,
    RecoveryAction,
    RecoveryTarget,
    decode_value,
)
from pgsnap.planner.clone import plan_clone_destroy

from ._clones import clone_scenario
from .conftest import Env, backed_up, make_env, pitr_setup
from .test_guard_e2e import unchecked

pytestmark = [pytest.mark.postgres]

MAJORS = (12, 15, 18)


@pytest.fixture(params=MAJORS, ids=[f"pg{m}" for m in MAJORS])
def bindir(
    request: pytest.FixtureRequest, pg_bindir: Path, pg_bindir_for: Callable[[int], Path]
) -> Path:
    major: int = request.param
    return pg_bindir if major == 15 else pg_bindir_for(major)


def test_a_clone_at_a_time_beside_production(e2e_env: Any, bindir: Path) -> None:
    clone_scenario(e2e_env(bindir))


def test_a_clone_of_block_volumes_is_attached_and_mounted(pg_server: Any) -> None:
    """The mock's simulated block devices: the clone volume is attached to the host,
    its device waited for and mounted at the clone's data directory, and on destroy
    unmounted, detached and deleted."""
    env = make_env(pg_server, None, block=True)
    try:
        plan = clone_scenario(env)
        actions = [s.action for s in plan.steps]
        assert "storage.attach_clone" in actions and "host.mount_clone" in actions
    finally:
        env.backend.close()


def test_a_clone_on_another_host_is_attached_mounted_and_run_there(pg_server: Any) -> None:
    """``host=``: the storage maps the clone's volume to another host's name (here a
    second simulated host of the mock's block devices: its devices are those attached
    to *its* name), which mounts it and runs the clone's server; the database host
    never sees the clone's device. A host pgsnap does not reach is refused by name."""
    env = make_env(pg_server, None, block=True)
    try:
        dev1 = env.backend.simulated_host(Host(name="dev1"))
        env.cluster.clone_hosts["dev1"] = dev1
        target = pitr_setup(env, "time")
        volumes = {v.id for v in env.backend.list_volumes()}
        with pytest.raises(ConfigurationError, match="no such host") as info:
            env.cluster.plan_clone(target, name="t1", host="dev2")
        assert "[clone_hosts.dev2]" in (info.value.hint or "")
        record = env.cluster.clone(target, name="t1", host="dev1")
        assert record.host == "dev1"
        (vol,) = record.volumes
        assert env.backend.get_volume(vol.volume_id).mapped_hosts == ("dev1",)
        assert [m.target for m in dev1.mounts() if m.target == vol.path] == [vol.path]
        assert not [m for m in env.cluster.host.mounts() if m.target == vol.path]
        server = env.cluster.adapter.instance(  # type: ignore[attr-defined]
            data_directory=record.data_directory, port=record.port,
            socket_directory=record.at, host=dev1,
        )  # fmt: skip
        assert dict(server.query("SELECT batch, count(*) FROM t GROUP BY 1")) == env.expect(1, 2)
        env.write(4)
        env.cluster.destroy_clone("t1")
        assert env.cluster.clones() == ()
        assert {v.id for v in env.backend.list_volumes()} == volumes
        assert not os.path.exists(record.at)
        assert env.batches() == env.expect(1, 2, 3, 4)
    finally:
        env.backend.close()


def test_a_paused_clone_for_reporting_is_read_only_at_its_target(e2e_env: Any) -> None:
    env: Env = e2e_env()
    target = pitr_setup(env, "xid")
    record = env.cluster.clone(target, name="report", action="pause")
    clone = env.cluster.adapter.instance(  # type: ignore[attr-defined]
        data_directory=record.data_directory, port=record.port, socket_directory=record.at
    )
    assert clone.query("SELECT pg_is_in_recovery()")[0][0] is True
    rows = dict(clone.query("SELECT batch, count(*) FROM t GROUP BY batch ORDER BY 1"))
    assert rows == env.expect(1, 2)
    env.cluster.destroy_clone("report")
    assert not os.path.exists(record.at)


def test_a_masking_hook_runs_before_hand_over(e2e_env: Any) -> None:
    env: Env = e2e_env()
    backed_up(env)
    env.write(2)
    env.switch_wal()
    record = env.cluster.clone(
        name="masked", mask_sql="UPDATE t SET at = NULL", mask_dbname="postgres"
    )
    clone = env.cluster.adapter.instance(  # type: ignore[attr-defined]
        data_directory=record.data_directory, port=record.port, socket_directory=record.at
    )
    assert clone.query("SELECT count(*) FROM t WHERE at IS NOT NULL")[0][0] == 0
    assert env.server.sql("SELECT count(*) FROM t WHERE at IS NULL")[0][0] == 0
    env.cluster.destroy_clone("masked")


def test_a_clone_that_fails_is_undone_and_production_untouched(e2e_env: Any) -> None:
    env: Env = e2e_env()
    backed_up(env)
    env.switch_wal()
    volumes = {v.id for v in env.backend.list_volumes()}
    with pytest.raises(Exception, match="mask"):
        env.cluster.clone(name="broken", mask_sql="SELECT * FROM no_such_table", mask_script="")
    assert env.cluster.clones() == ()
    assert {v.id for v in env.backend.list_volumes()} == volumes
    env.write(2)
    assert env.batches() == env.expect(1, 2)


def test_a_drill_proves_the_backup_and_records_it(e2e_env: Any, bindir: Path) -> None:
    env: Env = e2e_env(bindir)
    record = backed_up(env)
    env.write(2)
    env.switch_wal()
    volumes = {v.id for v in env.backend.list_volumes()}
    drill = env.cluster.drill(checks=["SELECT count(*) = 6 FROM t"])
    assert drill.ok, [c for c in drill.checks if not c.ok]
    assert drill.backup_id == record.id
    names = {c.name: c for c in drill.checks}
    assert {"reached target", "amcheck", "checksums", "sql 1", "server log"} <= set(names)
    assert drill.rto_seconds is not None and drill.rto_seconds > 0
    assert drill.rpo_seconds is not None and drill.rpo_seconds >= 0
    assert drill.wal_segments >= 1
    assert env.cluster.drills(record.id) == (drill,)
    assert env.cluster.clones() == ()
    assert {v.id for v in env.backend.list_volumes()} == volumes


def test_a_failed_drill_is_recorded_and_kept_when_asked(e2e_env: Any) -> None:
    env: Env = e2e_env()
    backed_up(env)
    env.switch_wal()
    drill = env.cluster.drill(
        RecoveryTarget.immediate(), checks=["SELECT count(*) = 1000 FROM t"], keep_on_failure=True
    )
    assert not drill.ok
    assert [c.name for c in drill.checks if not c.ok] == ["sql 1"]
    assert drill.kept
    (kept,) = env.cluster.clones()
    assert kept.purpose == "drill"
    env.cluster.destroy_clone(kept.name)
    assert env.cluster.clones() == ()


def _run_until_killed(env: Env, plan: Any, step: str, kind: EventKind) -> int:
    """Execute ``plan`` in a forked child that SIGKILLs itself at ``kind`` of ``step``."""

    def on_event(event: Event) -> None:
        if event.kind is kind and event.step_id == step:
            os.kill(os.getpid(), signal.SIGKILL)

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        code = 3
        try:
            env.cluster.execute(plan, on_event=on_event)
            code = 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


@pytest.mark.parametrize(
    ("step", "kind", "then"),
    [
        ("record-clone", EventKind.FINISHED, "resume"),
        ("clone-data", EventKind.STARTED, "destroy"),
        ("start-clone", EventKind.FINISHED, "destroy"),
        ("wait-clone", EventKind.STARTED, "resume"),
    ],
)
def test_a_clone_killed_half_way_is_resumed_or_destroyed_leaving_nothing(
    e2e_env: Any, step: str, kind: EventKind, then: str
) -> None:
    env: Env = e2e_env()
    backed_up(env)
    env.switch_wal()
    volumes = {v.id for v in env.backend.list_volumes()}
    archive = set(os.listdir(env.archive_dir))
    plan = env.cluster.plan_clone(name="killed")
    if step == "clone-data":
        step = f"clone-{env.cluster.layout.data.id}"
    (at,) = [s.params["at"] for s in plan.steps if s.action == "catalog.record_clone"]
    status = _run_until_killed(env, plan, step, kind)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    if then == "resume":
        (result,) = env.cluster.resume()
        assert result.resumed
        (record,) = env.cluster.clones()
        assert record.state is CloneState.READY
    else:
        # Destroying it at once: the interrupted run must be finished first.
        with pytest.raises(PgsnapError) as info:
            env.cluster.destroy_clone("killed")
        assert "resume" in str(info.value), info.value
        env.cluster.resume()
    env.cluster.destroy_clone("killed")
    assert env.cluster.clones() == ()
    assert {v.id for v in env.backend.list_volumes()} == volumes
    assert not os.path.exists(str(at))
    added = set(os.listdir(env.archive_dir)) - archive
    assert all(n.startswith("00000001") and not n.endswith(".history") for n in added), added
    env.write(2)
    assert env.batches() == env.expect(1, 2)


@pytest.mark.parametrize("doctored", ["data_directory", "volume path", "at", "snapshot"])
def test_a_doctored_clone_plan_is_refused_before_anything_changes(
    e2e_env: Any, doctored: str
) -> None:
    env: Env = e2e_env()
    backed_up(env)
    env.switch_wal()
    volumes = {v.id for v in env.backend.list_volumes()}
    production = str(env.server.data_dir)
    doc = env.cluster.plan_clone(name="doc").to_dict()
    for step in doc["steps"]:
        params = step["params"]
        if doctored == "data_directory" and "data_directory" in params:
            params["data_directory"] = production
        if doctored == "at" and "at" in params:
            params["at"] = str(env.server.wal_dir)
        if "volume" in params:
            if doctored == "volume path":
                params["volume"]["path"] = production
            if doctored == "snapshot":
                params["volume"]["snapshot_id"] = "snap-9999"
    with pytest.raises(InvariantError):
        env.cluster.execute(unchecked(doc))
    assert env.cluster.clones() == ()
    assert {v.id for v in env.backend.list_volumes()} == volumes
    env.write(2)
    assert env.batches() == env.expect(1, 2)


def _drill_until_killed(env: Env, name: str, nth: int, delay: float | None) -> int:
    """Run a drill in a forked child that SIGKILLs itself at its ``nth`` step event
    (started or finished, clone and destroy plans alike), or ``delay`` seconds after
    it (the checks run between the clone's last event and the destroy's first)."""
    seen = 0

    def on_event(event: Event) -> None:
        nonlocal seen
        if event.kind not in (EventKind.STARTED, EventKind.FINISHED):
            return
        if seen == nth:
            if delay is None:
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                threading.Timer(delay, os.kill, (os.getpid(), signal.SIGKILL)).start()
        seen += 1

    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        code = 3
        try:
            env.cluster.drill(name=name, checks=["SELECT count(*) = 6 FROM t"], on_event=on_event)
            time.sleep(30)  # a timer set near the end still fires: killed after the drill
            code = 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def test_a_drill_killed_at_random_points_is_resumed_or_destroyed_leaving_nothing(
    e2e_env: Any,
) -> None:
    """Issue 22 §3: a drill SIGKILLed at random points (any step of its clone or destroy
    plan, or during its checks) is finished by ``resume`` and its clone destroyed;
    nothing is left on the storage, the host, the catalog or the archive, and
    production goes on. The seed is printed: PGSNAP_DRILL_KILL_SEED replays it."""
    env: Env = e2e_env()
    backed_up(env)
    env.write(2)
    env.switch_wal()
    seed = int(os.environ.get("PGSNAP_DRILL_KILL_SEED") or time.time_ns() % 10**9)
    print(f"PGSNAP_DRILL_KILL_SEED={seed}")
    rng = random.Random(seed)
    plan = env.cluster.plan_clone(name="probe")
    clone_events = 2 * len(plan.steps)
    destroy = plan_clone_destroy(_probe_record(plan))
    total = clone_events + 2 * len(destroy.steps)
    volumes = {v.id for v in env.backend.list_volumes()}
    archive = set(os.listdir(env.archive_dir))
    points = [
        (rng.randrange(clone_events), None),  # in the clone plan
        (clone_events - 1, rng.uniform(0.0, 1.5)),  # during the checks (or just after)
        (rng.randrange(clone_events, total), None),  # in the destroy plan
    ]
    for n, (nth, delay) in enumerate(points):
        name = f"killed-{n}"
        status = _drill_until_killed(env, name, nth, delay)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (seed, status)
        env.cluster.resume()
        left = env.cluster.clones()
        assert {c.name for c in left} <= {name}, (seed, left)
        for clone in left:
            env.cluster.destroy_clone(clone.name)
        assert env.cluster.clones() == ()
        assert env.cluster.interrupted() == ()
        assert {v.id for v in env.backend.list_volumes()} == volumes, seed
        added = set(os.listdir(env.archive_dir)) - archive
        assert all(a.startswith("00000001") and not a.endswith(".history") for a in added), added
    env.write(3)
    assert env.batches() == env.expect(1, 2, 3)
    assert not [p for p in os.listdir(os.path.dirname(env.server.data_dir)) if "clone" in p]


def _probe_record(plan: Any) -> CloneRecord:
    """The clone record a clone plan would write (for the length of its destroy plan)."""
    (step,) = [s for s in plan.steps if s.action == "catalog.record_clone"]
    p = step.params
    return CloneRecord(
        name=p["clone"], backup_id=p["backup_id"], target=RecoveryTarget.latest(),
        host=p["host"], at=p["at"], data_directory=p["data_directory"], port=p["port"],
        socket_directory=p["at"], action=RecoveryAction.PROMOTE, state=CloneState.CREATING,
        created_at=dt.datetime.now(dt.UTC), created_by="t", plan_id="p",
        volumes=decode_value(tuple[CloneVolume, ...], p["volumes"], "volumes"),
    )  # fmt: skip
