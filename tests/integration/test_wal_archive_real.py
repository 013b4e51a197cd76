"""A WAL archive that is not a directory gives the same facts as one that is.

A real server (PostgreSQL 15, 1 MiB segments) is backed up with pgsnap and
writes commits and restore points on two timelines' worth of segments; its
archive is copied, some segments gzip-compressed, into a directory and into a
:class:`~pgsnap.testing.memory_wal.MemoryWalArchive`. The observer's recovery,
rebuild and expiry facts, the recovery planner's plans and pgsnap's WAL reader
must be the same through either: everything they read goes through the
archive's protocol methods.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import attrs
import pytest

from pgsnap.cluster import Cluster
from pgsnap.model import LSN, RecoveryTarget, TargetKind
from pgsnap.planner.recovery import RecoveryRequest, plan_recovery
from pgsnap.protocols import WalArchive
from pgsnap.testing.memory_wal import MemoryWalArchive
from pgsnap.testing.sandbox import mock_cluster
from pgsnap.wal import DirectoryWalArchive, TimelineSpan, read_wal, scan_events
from pgsnap.wal.reader import EndOfWal, ScanEnd, SegmentRead

pytestmark = pytest.mark.postgres

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def _clusters(base: Cluster, tmp_path: Path, archives: dict[str, WalArchive]) -> dict[str, Cluster]:
    return {
        kind: Cluster(
            adapter=base.adapter,
            backend=base.backend,
            archive=archive,
            catalog=base.catalog,
            layout=base.layout,
            clock=lambda: NOW,
            wal_index=tmp_path / f"index-{kind}",
        )
        for kind, archive in archives.items()
    }


def _plan_text(plan: Any, archive: WalArchive) -> str:
    """The plan as JSON, with what names the archive (its location, its
    restore_command) replaced, and its id and fingerprint (digests of it all) left
    out: the rest must not depend on the archive."""
    data = {k: v for k, v in plan.to_dict().items() if k not in ("id", "fingerprint")}
    text = json.dumps(data, sort_keys=True, default=str)
    for said in (archive.restore_command(), archive.location):
        text = text.replace(json.dumps(said)[1:-1], "<archive>")
    return text


def _items(archive: WalArchive, start: LSN, end: LSN) -> list[object]:
    """read_wal's items, with where each file is (its location) left out."""
    out: list[object] = []
    for item in read_wal([archive], [TimelineSpan(1, None, None)], start, end):
        if isinstance(item, SegmentRead):
            assert item.file is not None and item.source == 0
            out.append((item.name, item.file.name, item.lsn, item.system_identifier))
        elif isinstance(item, EndOfWal):
            out.append(attrs.evolve(item, path=None))
        elif isinstance(item, ScanEnd) and item.end_of_wal is not None:
            out.append(attrs.evolve(item, end_of_wal=attrs.evolve(item.end_of_wal, path=None)))
        else:
            out.append(item)
    return out


def test_memory_archive_gives_the_directory_archives_facts(pg_server: Any, tmp_path: Path) -> None:
    server = pg_server(wal_segsize_mb=1)
    server.start()
    server.sql("CREATE TABLE t (batch int, n int)")
    base = mock_cluster(server, wal_index=False)
    backup = base.backup("seam")
    marks: dict[str, Any] = {}
    with server.connect() as conn:
        for batch in range(6):
            for n in range(20):
                conn.execute("INSERT INTO t VALUES (%s, %s)", (batch, n))
            if batch == 2:
                marks["time"] = conn.execute("SELECT clock_timestamp()").fetchone()[0]
                conn.execute("SELECT pg_create_restore_point('seam_point')")
                marks["xid"] = int(conn.execute("SELECT txid_current()").fetchone()[0])
            conn.execute("SELECT pg_switch_wal()")
    server.switch_wal_and_wait_archived()
    server.wait_for_archive_idle()
    server.stop()  # the facts must not move while they are compared

    # One copy of the archive, every third segment gzip-compressed.
    packed = tmp_path / "archive"
    packed.mkdir()
    for n, f in enumerate(sorted(server.archive_dir.iterdir())):
        if len(f.name) == 24 and n % 3 == 1:
            (packed / f"{f.name}.gz").write_bytes(gzip.compress(f.read_bytes(), 1))
        else:
            shutil.copy(f, packed / f.name)
    assert list(packed.glob("*.gz"))
    memory = MemoryWalArchive.from_directory(packed, name="seam")
    archives: dict[str, WalArchive] = {
        "directory": DirectoryWalArchive(packed, gzip=True),
        "memory": memory,
    }
    clusters = _clusters(base, tmp_path, archives)

    requests = [
        RecoveryRequest(),
        RecoveryRequest(target=RecoveryTarget.time(marks["time"])),
        RecoveryRequest(target=RecoveryTarget.name("seam_point")),
        RecoveryRequest(target=RecoveryTarget.xid(marks["xid"])),
        RecoveryRequest(target=RecoveryTarget.immediate(), backup_id=backup.id),
    ]
    for request in requests:
        found: dict[str, Any] = {}
        for kind, cluster in clusters.items():
            for _again in range(2):  # the second time, from the WAL index
                facts = cluster.observer.recovery_facts(request)
                assert facts.archive_location == archives[kind].location
                assert facts.events is not None
                found.setdefault(kind, []).append(attrs.evolve(facts, archive_location=""))
        assert found["memory"] == found["directory"], request
        assert found["memory"][0] == found["memory"][1], request
        plans = {
            kind: _plan_text(
                plan_recovery(cluster.observer.recovery_facts(request), request), archives[kind]
            )
            for kind, cluster in clusters.items()
        }
        assert plans["memory"] == plans["directory"], request
        events = found["memory"][0].events
        assert events is not None and events.commits
        if request.target.kind is TargetKind.NAME:
            assert events.restore_point("seam_point") is not None
        if request.target.kind is TargetKind.XID:
            assert events.commit_of(marks["xid"]) is not None

    rebuild = {k: c.observer.rebuild_facts() for k, c in clusters.items()}
    assert rebuild["memory"] == rebuild["directory"]
    assert rebuild["memory"].system_identifier == backup.system_identifier
    expiry = {
        k: attrs.evolve(c.observer.expiry_facts(), archive_location="") for k, c in clusters.items()
    }
    assert expiry["memory"] == expiry["directory"]

    # The WAL reader: the same items and events from each, and from the path.
    start, end = backup.start_lsn, LSN(0xFFFFFFFF)
    items = _items(archives["directory"], start, end)
    assert any(isinstance(i, tuple) and i[1].endswith(".gz") for i in items)
    assert _items(memory, start, end) == items
    spans = [TimelineSpan(1, None, None)]
    by_path = scan_events([packed], spans, start, end)
    assert by_path.commits and by_path.restore_points
    for archive in archives.values():
        assert scan_events([archive], spans, start, end) == by_path
    memory.close()
