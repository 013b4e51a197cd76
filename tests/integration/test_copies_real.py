"""A copy off the array recovers a real PostgreSQL server once every snapshot is gone.

Real PostgreSQL 15 on mock volumes (directories): a backup through the cluster,
its data volume's read-only snapshot copied to a directory target, the
backup's snapshots deleted (the array is gone), the copy restored into an
empty data directory, and PostgreSQL replaying the archived WAL to a restore
point. The test checks which rows exist.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from pgsnap.copies import (
    CopyTarget,
    DirectoryCopyTarget,
    Manifest,
    copy_trees,
    restore_trees,
    verify_copy,
)
from pgsnap.errors import ConfigurationError, PlanningError
from pgsnap.model import VolumeRole
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
    assert "MiB read" in err and "files" in err  # progress on stderr, as a backup's
    (listed,) = env.run_json("list")
    assert [c["copy_id"] for c in listed["copies"]] == ["c1"]
    code, out, err = env.run("verify-copy", "c1", "--to", str(target))
    assert code == 0 and "all present and whole" in out, err
    some = next((target / "chunks").glob("*/*"))
    some.write_bytes(b"PGSC\x00damaged")
    code, out, err = env.run("verify-copy", "c1", "--to", str(target))
    assert code == 4 and "damaged chunk" in out, (out, err)
    code, _out, err = env.run("copy", record["id"])
    assert code == 2 and "no copy target" in err
