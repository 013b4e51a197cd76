"""The clone scenario shared by the mock (test_clone_e2e.py) and btrfs
(test_btrfs_e2e.py) end-to-end tests."""

from __future__ import annotations

import os
from typing import Any

from pgsnap.model import CloneState

from .conftest import Env, pitr_setup


def _mounts() -> list[str]:
    with open("/proc/self/mounts") as f:
        return sorted(f.read().splitlines())


def _production_state(env: Env) -> dict[str, Any]:
    dd = env.server.data_dir
    return {
        "files": {n: (dd / n).read_bytes() for n in ("postgresql.auto.conf", "postgresql.conf")},
        "labels": [p for p in ("backup_label", "recovery.signal") if (dd / p).exists()],
        "volumes": sorted((v.id, v.name, v.path) for v in env.backend.list_volumes()),
    }


def _archive(env: Env) -> set[str]:
    return set(os.listdir(env.archive_dir))


def clone_scenario(env: Env) -> Any:
    """Backup, batch 2, a time target, batch 3; clone at the target while production
    writes batch 4; check rows on both sides, production untouched, then destroy."""
    target = pitr_setup(env, "time")  # batch 1, backup, batch 2, <target>, batch 3
    before = _production_state(env)
    volumes_before = {v.id for v in env.backend.list_volumes()}
    mounts_before = _mounts()
    host_mounts = sorted(str(m) for m in env.cluster.host.mounts())
    archive_before = _archive(env)

    plan = env.cluster.plan_clone(target, name="t1")
    assert plan.kind == "clone"
    env.write(4)  # production goes on
    record = env.cluster.clone(target, name="t1")  # made again: the same plan
    assert record.state is CloneState.READY
    assert record.data_directory.startswith(record.at)

    clone = env.cluster.adapter.instance(  # type: ignore[attr-defined]
        data_directory=record.data_directory, port=record.port, socket_directory=record.at
    )
    rows = dict(clone.query("SELECT batch, count(*) FROM t GROUP BY batch ORDER BY 1"))
    assert rows == env.expect(1, 2)
    (name,) = clone.query("SHOW cluster_name")[0]
    assert name == "pgsnap-clone-t1"
    (mode,) = clone.query("SHOW archive_mode")[0]
    assert mode == "off"
    clone.query("INSERT INTO t (batch, n) VALUES (99, 0)")  # the clone is writable
    clone.query("SELECT pg_switch_wal()")

    env.write(5)
    assert env.batches() == env.expect(1, 2, 3, 4, 5)  # production has everything
    after = _production_state(env)
    assert after["files"] == before["files"]
    assert after["labels"] == before["labels"] == []
    # The clone's volume is new; production's are as they were.
    assert set(before["volumes"]) <= set(after["volumes"])
    new = [v for v in after["volumes"] if v not in before["volumes"]]
    assert [v[0] for v in new] == [v.volume_id for v in record.volumes]
    # The archive got production's segments only: no history file, no other timeline.
    added = _archive(env) - archive_before
    assert not [n for n in added if n.endswith(".history") or not n.startswith("00000001")], added

    (listed,) = env.cluster.clones()
    assert listed.name == "t1"
    env.cluster.destroy_clone("t1")
    assert env.cluster.clones() == ()
    assert {v.id for v in env.backend.list_volumes()} == volumes_before
    assert not os.path.exists(record.at)
    assert _mounts() == mounts_before
    assert sorted(str(m) for m in env.cluster.host.mounts()) == host_mounts
    assert env.batches() == env.expect(1, 2, 3, 4, 5)
    return plan
