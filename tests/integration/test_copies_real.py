"""A copy off the array recovers a real PostgreSQL server once every snapshot is gone.

Real PostgreSQL 15 on mock volumes (directories): a backup through the cluster,
its data volume's read-only snapshot copied to a directory target, the
backup's snapshots deleted (the array is gone), the copy restored into an
empty data directory, and PostgreSQL replaying the archived WAL to a restore
point. The test checks which rows exist.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import attrs
import pytest

from pgsnap.copies import (
    CopyKey,
    CopyTarget,
    DirectoryCopyTarget,
    Manifest,
    copy_trees,
    restore_trees,
    verify_copy,
)
from pgsnap.errors import ConfigurationError, InvariantError, NoBackupForTarget, PlanningError
from pgsnap.model import RecoveryTarget, VolumeRole
from pgsnap.plan import Plan
from pgsnap.testing.sandbox import mock_cluster

from .conftest import CliEnv, backed_up

pytestmark = pytest.mark.postgres


def rows(server: Any) -> list[int]:
    return [r[0] for r in server.sql("SELECT DISTINCT batch FROM t ORDER BY 1")]


def recovered_from_copy(
    pg_server: Any, store: CopyTarget, copy_id: str, archive_dir: Path, point: str
) -> Any:
    """A new server restored from copy ``copy_id`` alone into an empty data directory,
    replayed from ``archive_dir`` to the restore point ``point`` and promoted."""
    manifest = Manifest.from_json(store.get_manifest(copy_id))
    restored = pg_server.prepare(archive_dir=archive_dir)
    os.rmdir(restored.data_dir)  # a fresh, empty volume: restore_trees makes the top
    restore_trees(manifest, store, {"pgdata": restored.data_dir})
    # What pgsnap's restore plan does to a restored data directory (the recovery plan
    # from a copy comes with the rest of issue 21): no stale postmaster.pid, pg_wal on
    # this server's WAL volume.
    (restored.data_dir / "postmaster.pid").unlink(missing_ok=True)
    wal_link = restored.data_dir / "pg_wal"
    if wal_link.is_symlink():
        wal_link.unlink()
        wal_link.symlink_to(restored.wal_dir)
    restored.write_backup_label(manifest.files["backup_label"])
    restored.enable_recovery(recovery_target_name=point, recovery_target_action="promote")
    restored.start()
    restored.wait_for_promotion()
    return restored


def test_a_copy_recovers_the_cluster_when_every_snapshot_is_gone(
    pg_server: Any, tmp_path: Path
) -> None:
    server = pg_server()
    server.start()
    cluster = mock_cluster(server)
    server.sql("CREATE TABLE t (batch int)")
    server.sql("INSERT INTO t SELECT 1 FROM generate_series(1, 100)")
    record = cluster.backup("to-copy")
    server.sql("INSERT INTO t VALUES (2)")
    server.sql("SELECT pg_create_restore_point('after2')")
    server.sql("INSERT INTO t VALUES (3)")
    server.switch_wal_and_wait_archived()

    data = cluster.layout.by_role(VolumeRole.DATA)[0]
    snap = next(
        s for s in cluster.backend.list_snapshots(data.id) if s.id in record.snapshots.values()
    )
    target = DirectoryCopyTarget(tmp_path / "copies")
    assert record.labelfile is not None
    manifest, stats = copy_trees(
        {"pgdata": snap.extra["path"]},
        target,
        copy_id=f"{record.id}-1",
        backup_id=record.id,
        files={"backup_label": record.labelfile},
    )
    assert stats.chunks_new > 0 and verify_copy(target, manifest.copy_id).ok

    # The array is gone: every snapshot of the backup, and the server's data.
    assert record.snapshot_group_id is not None
    cluster.backend.delete_snapshot_group(record.snapshot_group_id)
    assert not [s for s in cluster.backend.list_snapshots() if s.id in record.snapshots.values()]
    server.stop(mode="immediate")

    restored = recovered_from_copy(
        pg_server,
        DirectoryCopyTarget(tmp_path / "copies"),
        manifest.copy_id,
        server.archive_dir,
        "after2",
    )
    assert rows(restored) == [1, 2]
    assert restored.sql("SELECT count(*) FROM t WHERE batch = 1")[0][0] == 100


def test_cluster_copy_is_a_plan_recorded_on_the_backup_and_sends_only_changes(
    pg_server: Any, tmp_path: Path
) -> None:
    server = pg_server()
    server.start()
    cluster = mock_cluster(server)
    server.sql("CREATE TABLE t (batch int)")
    server.sql("INSERT INTO t SELECT 1 FROM generate_series(1, 2000)")
    first = cluster.backup("one")
    server.sql("INSERT INTO t VALUES (2)")
    second = cluster.backup("two")
    target = tmp_path / "copies"
    events: list[Any] = []
    c1 = cluster.copy(first.id, target, on_event=events.append)
    c2 = cluster.copy(second.id, target)
    assert [c.copy_id for c in cluster.catalog.get(first.id).copies] == [c1.copy_id]
    assert [c.copy_id for c in cluster.catalog.get(second.id).copies] == [c2.copy_id]
    assert c1.target == str(target) and c1.chunks_new > 0 and c1.files > 100
    # The second backup differs in a few pages: most of its chunks are already there.
    assert c2.chunks_reused > c2.chunks_new and c2.bytes_sent < c1.bytes_sent / 2
    assert any(e.kind.value == "progress" for e in events)
    report = cluster.verify_copy(c2.copy_id, target)
    assert report.ok and report.chunks_checked == report.chunks_total
    manifest = DirectoryCopyTarget(target).get_manifest(c2.copy_id)
    assert hashlib.sha256(manifest.encode()).hexdigest() == c2.manifest_digest

    # Refused, with the reason: a copy id that exists; a backup whose snapshots are gone.
    with pytest.raises(PlanningError, match="already has a copy"):
        cluster.plan_copy(first.id, target, copy_id=c1.copy_id)
    assert first.snapshot_group_id is not None
    cluster.backend.delete_snapshot_group(first.snapshot_group_id)
    with pytest.raises(PlanningError, match="no readable snapshot"):
        cluster.plan_copy(first.id, target)
    with pytest.raises(ConfigurationError, match="no copy target"):
        cluster.plan_copy(second.id)


def test_pgsnap_copy_and_verify_copy(cli_env: CliEnv) -> None:
    env = cli_env
    record = backed_up(env)
    target = env.work / "copies"
    code, out, err = env.run("copy", record["id"], "--to", str(target), "--dry-run")
    assert code == 0 and "copy pgdata" in out, err
    code, out, err = env.run("copy", record["id"], "--to", str(target), "--copy-id", "c1")
    assert code == 0, err
    assert out.startswith(f"copy c1 of backup {record['id']} in {target}: ")
    assert "it carries the backup's WAL" in out
    assert "MiB read" in err and "files" in err  # progress on stderr, as a backup's
    assert "MiB/s" in err and " s left" in err  # with the rate and the time left
    (listed,) = env.run_json("list")
    assert [c["copy_id"] for c in listed["copies"]] == ["c1"]
    code, out, err = env.run("verify-copy", "c1", "--to", str(target))
    assert code == 0 and "all present and whole" in out, err
    code, out, err = env.run("plan-recovery", "--from-copy", "c1")
    assert code == 0, err
    assert re.search(rf"from copy +c1 in {re.escape(str(target))}", out), out
    assert "from copy c1" in out, out
    code, out, err = env.run("plan-recovery", "--from-copy", "c9")
    assert code != 0 and "has a copy 'c9'" in err, (out, err)
    some = next((target / "chunks").glob("*/*"))
    some.write_bytes(b"PGSC\x00damaged")
    code, out, err = env.run("verify-copy", "c1", "--to", str(target))
    assert code == 4 and "damaged chunk" in out, (out, err)
    code, _out, err = env.run("copy", record["id"])
    assert code == 2 and "no copy target" in err


def _emptied(directory: Path) -> None:
    """The volume is lost: what a new, empty one holds (nothing)."""
    for p in directory.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def _doctored(plan: Plan, step_id: str, **params: Any) -> Plan:
    """``plan`` with a step's parameters changed, built in Python (no id to disagree)."""
    steps = tuple(
        attrs.evolve(s, params={**s.params, **params}) if s.id == step_id else s for s in plan.steps
    )
    return attrs.evolve(plan, steps=steps)


def test_a_recovery_plan_restores_from_the_copy_when_the_array_lost_the_snapshots(
    pg_server: Any, tmp_path: Path
) -> None:
    """The snapshots are gone and the data directory with them: the planner offers the
    copy by itself, the plan restores it into the empty volume, and PostgreSQL
    replays the archive to a restore point."""
    server = pg_server()
    server.start()
    cluster = mock_cluster(server, copy_target=tmp_path / "copies")
    server.sql("CREATE TABLE t (batch int)")
    server.sql("INSERT INTO t SELECT 1 FROM generate_series(1, 100)")
    record = cluster.backup("to-copy")
    copy = cluster.copy(record.id)
    server.sql("INSERT INTO t VALUES (2)")
    server.sql("SELECT pg_create_restore_point('after2')")
    server.sql("INSERT INTO t VALUES (3)")
    server.switch_wal_and_wait_archived()
    assert record.snapshot_group_id is not None
    cluster.backend.delete_snapshot_group(record.snapshot_group_id)
    server.stop(mode="immediate")
    _emptied(server.data_dir)

    plan = cluster.plan_recovery(RecoveryTarget.name("after2"))
    actions = [s.action for s in plan.steps]
    assert "copy.restore" in actions and "storage.restore_volume" not in actions
    assert copy.copy_id in plan.summary["from copy"] and "to read" in plan.summary["from copy"]
    assert any("snapshots (they are gone" in k for k in plan.kept)
    restore = next(s for s in plan.steps if s.action == "copy.restore")
    assert restore.compensation == "storage.restore_volume"
    assert actions.index("copy.restore") < actions.index("db.write_backup_label")

    # Doctored plans are refused before anything changes: the copy written somewhere
    # else, another manifest, another backup's copy.
    for edit, refusal in (
        ({"directory": str(tmp_path / "elsewhere")}, "layout has volume"),
        ({"manifest_digest": "0" * 64}, "does not record copy"),
        ({"copy_id": "other.1"}, "does not record copy"),
        ({"backup_id": "other"}, "not in the catalog"),
    ):
        with pytest.raises(InvariantError, match=refusal):
            cluster.execute(_doctored(plan, restore.id, **edit))
        assert list(server.data_dir.iterdir()) == []

    # The copy carries the backup's WAL, written into pg_wal after the clean-up.
    assert copy.wal and not any(n.endswith(".history") for n in copy.wal)
    assert actions.index("db.prepare_data_directory") < actions.index("copy.restore_wal")
    assert actions.index("copy.restore_wal") < actions.index("db.write_backup_label")
    events: list[Any] = []
    result = cluster.execute(plan, on_event=events.append)
    wal_bytes = len(copy.wal) * record.wal_segment_size
    assert result.outputs[restore.id]["bytes_written"] == copy.bytes_read - wal_bytes
    assert rows(server) == [1, 2]
    assert server.sql("SELECT count(*) FROM t WHERE batch = 1")[0][0] == 100
    assert any(e.kind.value == "progress" and e.step_id == restore.id for e in events)


def test_from_copy_restores_data_and_wal_from_the_copy_and_the_archive(
    pg_server: Any, tmp_path: Path
) -> None:
    """Asked for (from_copy), the copy is used although the snapshots are there; with
    the WAL volume lost too, pg_wal is emptied and the archive replays to its end.
    Without a reachable copy the plan is refused, saying why."""
    server = pg_server()
    server.start()
    cluster = mock_cluster(server, copy_target=tmp_path / "copies")
    server.sql("CREATE TABLE t (batch int)")
    server.sql("INSERT INTO t VALUES (1)")
    record = cluster.backup("copied")
    with pytest.raises(NoBackupForTarget, match="no copy off the array"):
        cluster.plan_recovery(from_copy=True)
    copy = cluster.copy(record.id)
    server.sql("INSERT INTO t VALUES (2)")
    server.switch_wal_and_wait_archived()
    server.stop(mode="immediate")

    plan = cluster.plan_recovery(from_copy=copy.copy_id, lost=("data", "wal"))
    actions = [s.action for s in plan.steps]
    assert "copy.restore" in actions and "storage.restore_volume" not in actions
    assert actions.index("storage.snapshot_group") < actions.index("copy.restore")
    cluster.execute(plan)
    assert rows(server) == [1, 2]
    # The state replaced is kept in the safety snapshot, as for a snapshot restore.
    assert len(cluster.safety_snapshots()) == 1
    with pytest.raises(NoBackupForTarget, match="has a copy 'nope'"):
        cluster.plan_recovery(from_copy="nope")
    # The copy target gone: the plan says the copy was not found there.
    shutil.rmtree(tmp_path / "copies")
    with pytest.raises(NoBackupForTarget, match="not found in their targets"):
        cluster.plan_recovery(from_copy=True)


def test_a_copy_with_its_wal_recovers_when_the_archive_is_lost_with_the_array(
    pg_server: Any, tmp_path: Path
) -> None:
    """The copy carries the backup's WAL from its start to its stop: with every
    snapshot, the data directory and the whole WAL archive gone, the plan restores
    the copy, writes that WAL into pg_wal and PostgreSQL reaches the backup's
    consistency point. A copy made when the archive no longer holds the backup's
    WAL says so, and cannot be restored without the archive."""
    server = pg_server()
    server.start()
    cluster = mock_cluster(server, copy_target=tmp_path / "copies")
    server.sql("CREATE TABLE t (batch int)")
    server.sql("INSERT INTO t SELECT 1 FROM generate_series(1, 50)")
    record = cluster.backup("self-sufficient")
    plan = cluster.plan_copy(record.id)
    assert "no archive" in plan.summary["wal"] and not plan.warnings
    cluster.execute(plan)
    (copy,) = cluster.catalog.get(record.id).copies
    server.sql("INSERT INTO t VALUES (2)")  # after the backup: not in the copy's WAL
    server.switch_wal_and_wait_archived()
    assert record.snapshot_group_id is not None
    cluster.backend.delete_snapshot_group(record.snapshot_group_id)
    server.stop(mode="immediate")
    _emptied(server.data_dir)
    _emptied(server.wal_dir)
    _emptied(server.archive_dir)

    plan = cluster.plan_recovery(RecoveryTarget.immediate(), lost=("data", "wal"))
    step = next(s for s in plan.steps if s.action == "copy.restore_wal")
    assert "carries the backup's WAL" in plan.summary["from copy"]
    # A doctored step that writes WAL the copy does not carry is refused.
    with pytest.raises(InvariantError, match="does not carry"):
        cluster.execute(_doctored(plan, step.id, names=[*copy.wal, "00000001000000FF00000001"]))
    result = cluster.execute(plan)
    assert sorted(result.outputs[step.id]["written"]) == sorted(copy.wal)
    assert rows(server) == [1]
    assert server.sql("SELECT count(*) FROM t")[0][0] == 50

    # Made without the backup's WAL in the archive, a copy carries none and says so.
    later = cluster.backup("second")
    for name in os.listdir(server.archive_dir):
        os.unlink(server.archive_dir / name)
    plan = cluster.plan_copy(later.id)
    assert plan.warnings and "without it" in plan.warnings[0]
    assert "needs the WAL archive" in plan.summary["wal"]


def test_an_encrypted_copy_recovers_the_cluster_with_its_key_and_not_without(
    pg_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``[copies] key_file``: the copy is encrypted (sealed manifest, keyed chunk names)
    and recorded with its key's fingerprint. With every snapshot gone, a plan without
    the key is refused, one with another key is refused by its prechecks before the
    data directory is touched, and with the key the cluster is recovered. The key
    appears in no plan, event, error or log line."""
    caplog.set_level(logging.DEBUG)
    key = CopyKey.generate(tmp_path / "copy.key")
    wrong = CopyKey.generate(tmp_path / "other.key")
    secrets = [(tmp_path / n).read_text().strip() for n in ("copy.key", "other.key")]
    server = pg_server()
    server.start()
    cluster = mock_cluster(
        server, copy_target=tmp_path / "copies", copy_key_file=tmp_path / "copy.key"
    )
    server.sql("CREATE TABLE t (batch int)")
    server.sql("INSERT INTO t SELECT 1 FROM generate_series(1, 100)")
    record = cluster.backup("encrypted")
    plan = cluster.plan_copy(record.id)
    assert plan.steps[0].params["key_file"] == str(tmp_path / "copy.key")
    events: list[Any] = []
    cluster.execute(plan, on_event=events.append)
    (copy,) = cluster.catalog.get(record.id).copies
    assert copy.key_fingerprint == key.fingerprint
    stored = DirectoryCopyTarget(tmp_path / "copies").get_manifest(copy.copy_id)
    assert stored.startswith("pgsnap-sealed-manifest:1:") and "pg_control" not in stored
    assert cluster.verify_copy(copy.copy_id).ok
    server.sql("INSERT INTO t VALUES (2)")
    server.sql("SELECT pg_create_restore_point('after2')")
    server.sql("INSERT INTO t VALUES (3)")
    server.switch_wal_and_wait_archived()
    assert record.snapshot_group_id is not None
    cluster.backend.delete_snapshot_group(record.snapshot_group_id)
    server.stop(mode="immediate")
    _emptied(server.data_dir)

    cluster.copy_key_file = None
    with pytest.raises(PlanningError, match=f"encrypted with key {key.fingerprint}") as refused:
        cluster.plan_recovery(RecoveryTarget.name("after2"))
    cluster.copy_key_file = str(tmp_path / "other.key")
    plan = cluster.plan_recovery(RecoveryTarget.name("after2"))
    with pytest.raises(InvariantError, match=f"not with the key in .*{wrong.fingerprint}") as bad:
        cluster.execute(plan)
    assert list(server.data_dir.iterdir()) == []  # refused before anything changed

    cluster.copy_key_file = str(tmp_path / "copy.key")
    plan = cluster.plan_recovery(RecoveryTarget.name("after2"))
    restores = [s for s in plan.steps if s.action in ("copy.restore", "copy.restore_wal")]
    assert len(restores) == 2
    assert all(s.params["key_file"] == str(tmp_path / "copy.key") for s in restores)
    assert key.fingerprint in plan.summary["from copy"]
    for step in restores:  # a doctored plan that drops the key file: refused as well
        with pytest.raises(InvariantError, match="give \\[copies\\] key_file"):
            cluster.execute(_doctored(plan, step.id, key_file=""))
    assert list(server.data_dir.iterdir()) == []
    cluster.execute(plan, on_event=events.append)
    assert rows(server) == [1, 2]
    assert server.sql("SELECT count(*) FROM t WHERE batch = 1")[0][0] == 100

    shown = "\n".join(
        [
            plan.to_json(),
            plan.explain(),
            repr(cluster),
            str(refused.value),
            str(bad.value),
            repr(bad.value.details),
            json.dumps(attrs.asdict(cluster.catalog.get(record.id)), default=str),
            *(repr(e) for e in events),
            *(r.getMessage() for r in caplog.records),
        ]
    )
    for secret in secrets:
        assert secret not in shown and secret[:32] not in shown
