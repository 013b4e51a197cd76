"""pgsnap expire-copies, copy-gc and a copied backup's snapshots expired, end to end
through the command on the mock backend (directory volumes, no server) and a
directory copy target; tests/integration/test_copies_s3.py runs copy retention on
S3."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

import pgsnap
from pgsnap.cli import EXIT_LOCKED, main
from pgsnap.copies import DirectoryCopyTarget, Manifest
from pgsnap.copies.markers import Marker
from pgsnap.model import LSN, BackupRecord, BackupState

from ..unit.test_cli_unit import write_config


def run(capsys: pytest.CaptureFixture[str], config: Path, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main([argv[0], "-c", str(config), *argv[1:]])
    out, err = capsys.readouterr()
    return code, out, err


def backed_up(cluster: Any, data: Path, n: int, days_ago: int) -> BackupRecord:
    """A DONE backup of the data directory as it is now (the mock's snapshot of it),
    made ``days_ago`` days ago, without a server: what a copy needs."""
    (data / "PG_VERSION").write_text("16\n")
    (data / "rel").write_bytes(bytes([n]) * 5000)  # a chunk of its own
    group = cluster.backend.create_snapshot_group(["vol-data"], f"b{n}")
    when = dt.datetime.now(dt.UTC) - dt.timedelta(days=days_ago)
    record = BackupRecord(
        id=f"b{n}",
        label=f"b{n}",
        state=BackupState.DONE,
        system_identifier="7",
        server_version=160004,
        wal_segment_size=16 << 20,
        layout=cluster.layout,
        start_lsn=LSN((n + 1) << 24),
        start_timeline=1,
        start_time=when,
        stop_lsn=LSN(((n + 1) << 24) + 0x100),
        stop_timeline=1,
        stop_time=when,
        labelfile=f"START WAL LOCATION: b{n}\n",
        snapshot_group_id=group.id,
        snapshots={s.volume_id: s.id for s in group.snapshots},
    )
    cluster.catalog.put(record)
    return record


def test_expire_copies_and_copy_gc_on_a_directory_target(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write_config(tmp_path)
    target = tmp_path / "copies"
    with config.open("a") as f:
        f.write(f'\n[copies]\npath = "{target}"\n\n[copies.retention]\nredundancy = 1\n')
    cluster = pgsnap.Cluster.from_config(config)
    data = tmp_path / "data"
    records = [backed_up(cluster, data, n, days_ago=3 - n) for n in range(3)]
    for r in records:
        code, _out, err = run(capsys, config, "copy", r.id)
        assert code == 0, err
    store = DirectoryCopyTarget(target)
    assert store.manifest_ids() == ("b0.1", "b1.1", "b2.1")
    # b0's snapshots are gone (the array lost them): its copy is its last way back.
    assert records[0].snapshot_group_id is not None
    cluster.backend.delete_snapshot_group(records[0].snapshot_group_id)
    only_b1 = Manifest.from_json(store.get_manifest("b1.1")).chunk_ids() - (
        Manifest.from_json(store.get_manifest("b0.1")).chunk_ids()
        | Manifest.from_json(store.get_manifest("b2.1")).chunk_ids()
    )
    assert only_b1

    code, out, err = run(capsys, config, "expire-copies", "--dry-run")
    assert code == 0, err
    assert "copy b0.1 (backup b0" in out and "the last copy of backup b0" in out, out
    assert "copy b2.1 (backup b2" in out and "within redundancy 1" in out, out
    assert "remove the manifest of copy b1.1" in out, out
    assert store.manifest_ids() == ("b0.1", "b1.1", "b2.1")  # a dry run

    code, out, err = run(capsys, config, "expire-copies")
    assert code == 0, err
    assert "deleted: 1 copies" in out and "removed" in out, out
    assert store.manifest_ids() == ("b0.1", "b2.1")
    assert not only_b1 & set(store.chunk_ids())  # its own chunks went with it
    assert [c.copy_id for c in cluster.catalog.get("b1").copies] == []
    for copy_id in ("b0.1", "b2.1"):
        code, out, err = run(capsys, config, "verify-copy", copy_id)
        assert code == 0 and "all present and whole" in out, (out, err)
    code, out, err = run(capsys, config, "expire-copies")
    assert code == 0 and "nothing to delete" in out, (out, err)

    code, out, err = run(capsys, config, "copy-gc", "--dry-run", "--json")
    assert code == 0, err
    assert json.loads(out)["chunks_deleted"] == 0 and json.loads(out)["dry_run"] is True

    # A copy in progress (its fresh marker): the collection refuses, exit 6, naming it;
    # an expiry still removes what it must and defers the collection, saying so.
    pending = Marker.new("pending.b9.1", dt.datetime.now(dt.UTC), copy_id="b9.1")
    store.put_marker("pending.b9.1", pending.to_json())
    code, out, err = run(capsys, config, "copy-gc")
    assert code == EXIT_LOCKED, (out, err)
    assert "\npgsnap: busy: 1 copies are in progress" in err and "copy b9.1" in err, err
    code, out, err = run(capsys, config, "expire-copies", "--max-age", "2d")
    assert code == 0, err
    assert "garbage collection deferred" in err and "pgsnap copy-gc" in err, err
    assert store.manifest_ids() == ("b2.1",)
    store.delete_marker("pending.b9.1")
    code, out, err = run(capsys, config, "copy-gc")
    assert code == 0 and "removed" in out, (out, err)

    # pgsnap delete of a copied backup: the snapshots go, the record stays for the copy.
    code, out, err = run(capsys, config, "delete", "b2")
    assert code == 0, err
    assert "its record stays for its copies" in out, out
    assert cluster.catalog.get("b2").copies and not [
        s for s in cluster.backend.list_snapshots() if s.id in records[2].snapshots.values()
    ]


def test_expire_copies_and_copy_gc_read_encrypted_copies_with_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With [copies] key_file, retention reads the sealed manifests: an expired copy's
    own chunks are collected and the kept copy verifies; without the key the
    collection refuses and removes nothing."""
    from pgsnap.copies.keys import CopyKey

    key_file = tmp_path / "copy.key"
    CopyKey.generate(key_file)
    config = write_config(tmp_path)
    target = tmp_path / "copies"
    with config.open("a") as f:
        f.write(
            f'\n[copies]\npath = "{target}"\nkey_file = "{key_file}"\n\n'
            "[copies.retention]\nredundancy = 1\n"
        )
    cluster = pgsnap.Cluster.from_config(config)
    data = tmp_path / "data"
    records = [backed_up(cluster, data, n, days_ago=2 - n) for n in range(2)]
    for r in records:
        code, _out, err = run(capsys, config, "copy", r.id)
        assert code == 0, err
    store = DirectoryCopyTarget(target)
    before = set(store.chunk_ids())
    code, out, err = run(capsys, config, "expire-copies")
    assert code == 0, (out, err)
    assert store.manifest_ids() == ("b1.1",)
    assert set(store.chunk_ids()) < before  # b0's own chunks went with it
    code, out, err = run(capsys, config, "verify-copy", "b1.1")
    assert code == 0 and "all present and whole" in out, (out, err)
    code, out, err = run(capsys, config, "copy-gc")
    assert code == 0, (out, err)

    (tmp_path / "keyless").mkdir()
    keyless = write_config(tmp_path / "keyless")
    with keyless.open("a") as f:
        f.write(f'\n[copies]\npath = "{target}"\n')
    left = set(store.chunk_ids())
    code, out, err = run(capsys, keyless, "copy-gc")
    assert code != 0 and "encrypted" in err, (out, err)
    assert set(store.chunk_ids()) == left
