"""The catalog conformance suite on every catalog pgsnap ships (issue 25):
MemoryCatalog, DirectoryCatalog, and PostgresCatalog on a real PostgreSQL server
(one server per test module, a fresh schema per test, migrated as a user would)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from pgsnap.catalog import DirectoryCatalog, MemoryCatalog
from pgsnap.catalog.postgres import PostgresCatalog, migrate
from pgsnap.protocols import Catalog
from pgsnap.testing.catalog_conformance import CatalogConformance
from pgsnap.testing.pgserver import PgServer


class TestMemoryCatalog(CatalogConformance):
    damageable = False  # nothing in memory is unreadable

    @pytest.fixture
    def catalog(self) -> MemoryCatalog:
        return MemoryCatalog()

    @pytest.fixture
    def reopen(self, catalog: MemoryCatalog) -> Callable[[], Catalog]:
        return lambda: catalog  # one process's memory: the same object


class TestDirectoryCatalog(CatalogConformance):
    @pytest.fixture
    def catalog(self, tmp_path: Path) -> DirectoryCatalog:
        return DirectoryCatalog(tmp_path / "catalog")

    @pytest.fixture
    def reopen(self, tmp_path: Path) -> Callable[[], Catalog]:
        return lambda: DirectoryCatalog(tmp_path / "catalog")

    @pytest.fixture
    def damage(self, tmp_path: Path) -> Callable[[str], None]:
        def damage(backup_id: str) -> None:
            path = tmp_path / "catalog" / f"{backup_id}.json"
            data = json.loads(path.read_text())
            data["start_lsn"] = "not an LSN"
            path.write_text(json.dumps(data))

        return damage


_schemas = itertools.count()


@pytest.mark.postgres
class TestPostgresCatalog(CatalogConformance):
    @pytest.fixture
    def schema(self, catalog_server: PgServer) -> str:
        name = f"cat{next(_schemas)}"
        applied = migrate(catalog_server.conninfo(), schema=name)
        assert [v for v, _what in applied] == [1, 2]
        return name

    @pytest.fixture
    def catalog(self, catalog_server: PgServer, schema: str) -> Iterator[PostgresCatalog]:
        made = PostgresCatalog(catalog_server.conninfo(), "db1", schema=schema)
        yield made
        made.close()

    @pytest.fixture
    def reopen(self, catalog_server: PgServer, schema: str) -> Iterator[Callable[[], Catalog]]:
        made: list[PostgresCatalog] = []

        def reopen() -> Catalog:
            made.append(PostgresCatalog(catalog_server.conninfo(), "db1", schema=schema))
            return made[-1]

        yield reopen
        for c in made:
            c.close()

    @pytest.fixture
    def damage(self, catalog_server: PgServer, schema: str) -> Callable[[str], None]:
        def damage(backup_id: str) -> None:
            catalog_server.sql(
                f"UPDATE {schema}.backups SET record = jsonb_set(record, '{{start_lsn}}', "
                "'\"not an LSN\"') WHERE id = %s",
                (backup_id,),
            )

        return damage

    def test_clusters_share_the_tables_not_the_records(
        self, catalog: PostgresCatalog, reopen: Any, catalog_server: PgServer, schema: str
    ) -> None:
        """Two clusters in one catalog database: each sees its own records, and their
        locks are independent."""
        from pgsnap.locks import LockHolder
        from pgsnap.testing.catalog_conformance import backup_record

        other = PostgresCatalog(catalog_server.conninfo(), "db2", schema=schema)
        try:
            catalog.put(backup_record("b-1"))
            other.put(backup_record("b-1", system_identifier="7300000000000000009"))
            assert catalog.get("b-1").system_identifier == "7300000000000000001"
            assert other.get("b-1").system_identifier == "7300000000000000009"
            other.delete("b-1")
            assert [r.id for r in catalog.list()] == ["b-1"]
            mine = LockHolder.for_run("recovery", "r" * 64)
            with catalog.cluster_lock().acquire(mine), other.cluster_lock().acquire(mine):
                assert [h.kind for h in other.cluster_lock().holders()] == ["recovery"]
            assert [row.cluster for row in catalog.fleet()] == ["db1", "db2"]
            catalog.put(backup_record("b-2", minutes=5, stop_timeline=2))
            newest = {row.cluster: row.newest for row in catalog.fleet()}
            assert newest["db1"] is not None and newest["db1"].id == "b-2"
            assert newest["db2"] is None  # its only backup was deleted
            on_1 = {row.cluster: row.newest for row in catalog.fleet(timeline=1)}
            assert on_1["db1"] is not None and on_1["db1"].id == "b-1"
        finally:
            other.close()


@pytest.mark.postgres
def test_an_import_round_trips_every_record_kind(catalog_server: PgServer, tmp_path: Path) -> None:
    """A directory catalog holding every record kind (backups pinned and not, failed
    and done, safety snapshots, clones, drills) is imported with nothing lost, and an
    unreadable file is counted, not imported."""
    import datetime as dt

    from pgsnap.catalog import copy_records
    from pgsnap.model import BackupState, Pin
    from pgsnap.testing.catalog_conformance import (
        backup_record,
        clone_record,
        drill_record,
        safety_record,
    )

    source = DirectoryCatalog(tmp_path / "catalog")
    source.put(backup_record("b-1", pin=Pin("legal hold")))
    source.put(backup_record("b-2", minutes=5, state=BackupState.FAILED, failure_reason="x"))
    source.put(
        backup_record("b-3", minutes=9, pin=Pin("a year", dt.datetime(2027, 1, 1, tzinfo=dt.UTC)))
    )
    source.put_safety(safety_record("s-1"))
    source.put_clone(clone_record("c1"))
    source.put_clone(clone_record("c2", minutes=3))
    source.put_drill(drill_record("d1", "b-1"))
    source.put_drill(drill_record("d2", "b-3", minutes=10))
    (tmp_path / "catalog" / "b-9.json").write_text("{not json")
    migrate(catalog_server.conninfo(), schema="imported")
    target = PostgresCatalog(catalog_server.conninfo(), "db1", schema="imported")
    try:
        counts = copy_records(source, target)
        assert counts == {"backups": 3, "safety": 1, "clones": 2, "drills": 2, "unreadable": 1}
        assert target.list() == source.list()
        assert target.list_safety() == source.list_safety()
        assert target.list_clones() == source.list_clones()
        assert target.list_drills() == source.list_drills()
        assert copy_records(source, target)["backups"] == 3  # again: replaced, not doubled
        assert len(target.list()) == 3
    finally:
        target.close()


@pytest.mark.postgres
def test_a_version_1_catalog_is_refused_until_migrated_then_read_whole(
    catalog_server: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 2 (retention's columns) on a catalog that version 1 wrote: the backup
    server that needs version 2 refuses it and says to migrate; `migrate` backfills the
    columns from the records (a hand-edited time that does not read as one is left
    to the start time), and then every record reads back and the fleet's expiry
    forecast sees the pin and the copies."""
    import datetime as dt

    import pgsnap.catalog.postgres as pgcat
    from pgsnap.errors import CatalogError
    from pgsnap.model import CopyRecord, Pin, to_dict
    from pgsnap.planner.expiry import RetentionPolicy
    from pgsnap.testing.catalog_conformance import backup_record

    conninfo = catalog_server.conninfo()
    with monkeypatch.context() as m:  # what the version 1 pgsnap made
        m.setattr(pgcat, "_MIGRATIONS", pgcat._MIGRATIONS[:1])
        m.setattr(pgcat, "SCHEMA_VERSION", 1)
        assert [v for v, _ in migrate(conninfo, schema="old")] == [1]
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    records = [
        backup_record("b-1", pin=Pin("legal hold")),
        backup_record("b-2", minutes=60),
        backup_record("b-3", minutes=120),
        backup_record("b-4", minutes=180),
    ]
    records[1] = attrs.evolve(records[1], copies=(CopyRecord("b-2.1", "/c", "ab" * 32, t0),))
    with catalog_server.connect() as conn:
        made = conn.execute("INSERT INTO old.clusters (name) VALUES ('db1') RETURNING id")
        (cluster_id,) = made.fetchall()[0]
        for r in records:
            doc = to_dict(r)
            if r.id == "b-3":
                doc["stop_time"] = "yesterday"  # hand-edited: not a time
            conn.execute(
                "INSERT INTO old.backups (cluster_id, id, system_identifier, state, timeline,"
                " start_time, record) VALUES (%s, %s, %s, %s, 1, %s, %s)",
                (
                    cluster_id,
                    r.id,
                    r.system_identifier,
                    r.state.value,
                    r.start_time,
                    json.dumps(doc),
                ),
            )
    catalog = PostgresCatalog(conninfo, "db1", schema="old")
    try:
        with pytest.raises(CatalogError, match="at version 1; this pgsnap needs 2") as info:
            catalog.list()
        assert "pgsnap catalog migrate" in (info.value.hint or "")
        assert catalog.migrate(dry_run=True)[0][0] == 2
        assert [v for v, _ in catalog.migrate()] == [2]
        rows = catalog_server.sql(
            "SELECT id, consistent_at = start_time, pinned, copies FROM old.backups ORDER BY id"
        )
        assert rows == [  # the stop time; for b-3, whose stop is not a time, the start
            ("b-1", False, True, 0),
            ("b-2", False, False, 1),
            ("b-3", True, False, 0),
            ("b-4", False, False, 0),
        ]
        assert [r.id for r in catalog.scan().records] == ["b-1", "b-2", "b-4"]
        assert [e.backup_id for e in catalog.scan().unreadable] == ["b-3"]
        forecast = catalog.expirable(RetentionPolicy(redundancy=1), now=t0 + dt.timedelta(1))
        assert [(f.backup_id, f.action) for f in forecast] == [
            ("b-2", "snapshots"),
            ("b-3", "backup"),
        ]
    finally:
        catalog.close()
