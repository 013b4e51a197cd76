"""The catalog conformance suite: what "implements :class:`~pgsnap.protocols.Catalog`" means.

Every catalog runs it: :class:`~pgsnap.catalog.MemoryCatalog`,
:class:`~pgsnap.catalog.DirectoryCatalog`, :class:`~pgsnap.catalog.postgres.PostgresCatalog`,
and a third party's. Subclass :class:`CatalogConformance` in a test module (the name
must start with ``Test``) and provide two fixtures:

- ``catalog``: a fresh, empty catalog for each test;
- ``reopen``: a function that returns another catalog object over the same records
  (what a second process, or a second backup server, would open). A catalog that
  lives in one process's memory returns the same object.

Optional fixture ``damage``: a function ``(backup_id) -> None`` that makes the stored
record of that backup unreadable as a record (a hand-edited file, a row written by
hand); when the catalog has no such thing, leave it out and the class attribute
``damageable = False`` skips nothing but the check that needs it (it is then not run,
and says why in its docstring, not as a skip).

Class attributes: ``shared_lock`` (True when ``reopen`` gives a catalog whose
:meth:`~pgsnap.protocols.ClusterLockProvider.cluster_lock` is the same lock as
another process's: the lock table is checked across the two objects).

The suite checks: every method; put, get, replace and delete; order by instant
(across a daylight-saving change); bad ids refused; missing records; every record
kind round-tripped equal (a pinned backup, a safety snapshot, a clone, a drill);
records written through one object read through another; unreadable records
reported by ``scan`` and left out of ``list``; ``newest`` and the system
identifiers where the catalog answers them itself; concurrent writers; the cluster
lock (shared runs side by side, exclusive alone, refused at once naming the
holder, free again after release); and that every failure is a
:class:`~pgsnap.errors.PgsnapError` that survives pickling.

This module imports pytest; nothing in :mod:`pgsnap` imports it.
"""

from __future__ import annotations

import datetime as dt
import pickle
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import attrs
import pytest

from pgsnap.catalog import catalog_system_identifiers, scan_catalog
from pgsnap.errors import BackupNotFound, CatalogError, ClusterLockedError, PgsnapError
from pgsnap.locks import LockHolder
from pgsnap.model import (
    BackupRecord,
    BackupState,
    CloneRecord,
    CloneState,
    CloneVolume,
    DrillCheck,
    DrillPhase,
    DrillRecord,
    Layout,
    Pin,
    RecoveryAction,
    RecoveryTarget,
    SafetySnapshot,
    Volume,
    VolumeRole,
)
from pgsnap.protocols import Catalog, ClusterLockProvider

__all__ = ["CatalogConformance", "backup_record", "clone_record", "drill_record", "safety_record"]

T0 = dt.datetime(2026, 11, 30, tzinfo=dt.UTC)
Reopen = Callable[[], Catalog]


def backup_record(backup_id: str = "b-1", minutes: float = 0, **changes: Any) -> BackupRecord:
    """A DONE backup record started ``minutes`` after a fixed time (test data)."""
    start = T0 + dt.timedelta(minutes=minutes)
    base: dict[str, Any] = {
        "id": backup_id,
        "label": "nightly",
        "state": BackupState.DONE,
        "system_identifier": "7300000000000000001",
        "server_version": 150018,
        "wal_segment_size": 16 << 20,
        "layout": Layout(
            [
                Volume("v1", "data", VolumeRole.DATA, "/pg/data"),
                Volume("v2", "wal", VolumeRole.WAL, "/pg/wal"),
            ]
        ),
        "start_lsn": "0/4000028",
        "start_timeline": 1,
        "start_time": start,
        "stop_lsn": "0/4000100",
        "stop_timeline": 1,
        "stop_time": start + dt.timedelta(seconds=2),
        "labelfile": "START WAL LOCATION: 0/4000028 (file 000000010000000000000004)\n",
        "snapshot_group_id": f"cg-{backup_id}",
        "snapshots": {"v1": f"s1-{backup_id}", "v2": f"s2-{backup_id}"},
        "backup_mode_seconds": 0.05,
    }
    base.update(changes)
    return BackupRecord(**base)


def safety_record(name: str = "s-20261130T000000Z", minutes: float = 0) -> SafetySnapshot:
    """A safety snapshot record (test data)."""
    return SafetySnapshot(
        name=name,
        group_id=f"g-{name}",
        snapshots={"v1": "x1"},
        created_at=T0 + dt.timedelta(minutes=minutes),
        plan_id="p" * 64,
        backup_id="b-1",
        target="latest",
    )


def clone_record(name: str = "c1", minutes: float = 0) -> CloneRecord:
    """A clone record (test data)."""
    return CloneRecord(
        name=name,
        backup_id="b-1",
        target=RecoveryTarget.latest(),
        host="db1",
        at=f"/c/{name}",
        data_directory=f"/c/{name}/data",
        port=55432,
        socket_directory=f"/c/{name}",
        action=RecoveryAction.PROMOTE,
        state=CloneState.READY,
        created_at=T0 + dt.timedelta(minutes=minutes),
        created_by="me@db1",
        plan_id="q" * 64,
        volumes=[CloneVolume("v1", VolumeRole.DATA, "s1-b-1", f"/c/{name}/data", "nv-1")],
    )


def drill_record(drill_id: str = "d1", backup_id: str = "b-1", minutes: float = 0) -> DrillRecord:
    """A drill record (test data)."""
    at = T0 + dt.timedelta(minutes=minutes)
    return DrillRecord(
        id=drill_id,
        backup_id=backup_id,
        target=RecoveryTarget.latest(),
        clone=f"drill-{drill_id}",
        started_at=at,
        finished_at=at + dt.timedelta(seconds=9),
        ok=True,
        checks=[DrillCheck("amcheck", True, "3 indexes")],
        phases=[DrillPhase("storage", 0.5)],
        rto_seconds=2.5,
        rpo_seconds=1.0,
    )


def _pickles(exc: PgsnapError) -> None:
    again = pickle.loads(pickle.dumps(exc))  # noqa: S301 - our own object
    assert type(again) is type(exc) and str(again) == str(exc)


CATALOG_METHODS = (
    "put",
    "get",
    "list",
    "delete",
    "put_safety",
    "list_safety",
    "delete_safety",
    "put_clone",
    "get_clone",
    "list_clones",
    "delete_clone",
    "put_drill",
    "list_drills",
)


class CatalogConformance:
    """The suite; see the module docstring."""

    damageable: ClassVar[bool] = True
    shared_lock: ClassVar[bool] = True

    def test_has_every_method(self, catalog: Catalog) -> None:
        """Every method of the Catalog protocol, callable."""
        missing = [m for m in CATALOG_METHODS if not callable(getattr(catalog, m, None))]
        assert missing == []

    def test_an_empty_catalog(self, catalog: Catalog) -> None:
        """A new catalog lists nothing of any kind."""
        assert catalog.list() == ()
        assert catalog.list_safety() == () and catalog.list_clones() == ()
        assert catalog.list_drills() == () and catalog.list_drills("b-1") == ()
        assert scan_catalog(catalog).records == ()
        assert catalog_system_identifiers(catalog) == frozenset()

    def test_put_get_replace_delete(self, catalog: Catalog) -> None:
        """Records are read back equal, replaced by id, deleted; a missing one is
        BackupNotFound naming it."""
        a, b = backup_record("b-1"), backup_record("b-2", minutes=-5)
        catalog.put(a)
        catalog.put(b)
        assert catalog.get("b-1") == a
        assert [r.id for r in catalog.list()] == ["b-2", "b-1"]  # oldest start first
        failed = attrs.evolve(a, state=BackupState.FAILED, failure_reason="the snapshot failed")
        catalog.put(failed)
        assert catalog.get("b-1") == failed
        assert len(catalog.list()) == 2
        catalog.delete("b-1")
        assert [r.id for r in catalog.list()] == ["b-2"]
        for call in (catalog.get, catalog.delete):
            with pytest.raises(BackupNotFound) as info:
                call("b-1")
            assert "b-1" in str(info.value)
            _pickles(info.value)

    def test_order_is_by_instant_not_by_text(self, catalog: Catalog) -> None:
        """03:30+02:00 is before 02:45+00:00 (a daylight-saving change in one list)."""
        cest = dt.timezone(dt.timedelta(hours=2))
        early = backup_record("b-early", start_time=dt.datetime(2026, 10, 25, 3, 30, tzinfo=cest))
        late = backup_record("b-late", start_time=dt.datetime(2026, 10, 25, 2, 45, tzinfo=dt.UTC))
        catalog.put(late)
        catalog.put(early)
        assert [r.id for r in catalog.list()] == ["b-early", "b-late"]

    @pytest.mark.parametrize("bad", ["../etc/passwd", "a/b", "", ".hidden", "x" * 200, "a'b"])
    def test_bad_ids_are_refused(self, catalog: Catalog, bad: str) -> None:
        """Ids that are not names (paths, quotes, too long) are a CatalogError."""
        with pytest.raises(CatalogError) as info:
            catalog.get(bad)
        _pickles(info.value)
        with pytest.raises(CatalogError):
            catalog.put(attrs.evolve(backup_record(), id=bad))
        with pytest.raises(CatalogError):
            catalog.delete(bad)

    def test_every_record_kind_round_trips(self, catalog: Catalog) -> None:
        """A pinned backup, a safety snapshot, a clone, drills: read back equal."""
        pinned = backup_record("b-1", pin=Pin("audit 2026", T0 + dt.timedelta(days=365)))
        catalog.put(pinned)
        assert catalog.get("b-1") == pinned and catalog.get("b-1").pin == pinned.pin
        s1, s0 = safety_record("s-1", minutes=1), safety_record("s-0")
        catalog.put_safety(s1)
        catalog.put_safety(s0)
        assert catalog.list_safety() == (s0, s1)
        c = clone_record("c1")
        catalog.put_clone(c)
        assert catalog.get_clone("c1") == c and catalog.list_clones() == (c,)
        ready = attrs.evolve(c, state=CloneState.CREATING)
        catalog.put_clone(ready)
        assert catalog.list_clones() == (ready,)
        d2, d1 = drill_record("d2", "b-2", minutes=2), drill_record("d1", "b-1", minutes=1)
        catalog.put_drill(d2)
        catalog.put_drill(d1)
        assert catalog.list_drills() == (d1, d2)
        assert catalog.list_drills("b-2") == (d2,)
        assert catalog.list_drills("b-9") == ()

    def test_named_records_are_deleted_and_missing_ones_named(self, catalog: Catalog) -> None:
        """Safety snapshots and clones are deleted by name; a missing one is a
        CatalogError naming it."""
        catalog.put_safety(safety_record("s-1"))
        catalog.put_clone(clone_record("c1"))
        catalog.delete_safety("s-1")
        catalog.delete_clone("c1")
        assert catalog.list_safety() == () and catalog.list_clones() == ()
        for call, name in (
            (catalog.delete_safety, "s-1"),
            (catalog.delete_clone, "c1"),
            (catalog.get_clone, "c9"),
        ):
            with pytest.raises(CatalogError) as info:
                call(name)
            assert name in str(info.value)
            _pickles(info.value)

    def test_what_one_object_writes_another_reads(self, catalog: Catalog, reopen: Reopen) -> None:
        """A second process (or backup server) sees every write, and its deletes."""
        catalog.put(backup_record("b-1"))
        catalog.put_clone(clone_record("c1"))
        other = reopen()
        assert [r.id for r in other.list()] == ["b-1"]
        assert other.get_clone("c1") == clone_record("c1")
        other.put(backup_record("b-2", minutes=1))
        other.delete_clone("c1")
        assert [r.id for r in catalog.list()] == ["b-1", "b-2"]
        assert catalog.list_clones() == ()

    def test_an_unreadable_record_is_reported_not_fatal(
        self, catalog: Catalog, request: pytest.FixtureRequest
    ) -> None:
        """``scan`` names it with the reason; ``list`` leaves it out; ``get`` raises a
        CatalogError that names it (only for catalogs with a ``damage`` fixture)."""
        if not self.damageable:
            return
        damage = request.getfixturevalue("damage")
        catalog.put(backup_record("b-1"))
        catalog.put(backup_record("b-2", minutes=1))
        damage("b-1")
        scan = scan_catalog(catalog)
        assert [r.id for r in scan.records] == ["b-2"]
        (bad,) = scan.unreadable
        assert bad.backup_id == "b-1" and bad.error and "b-1" in bad.path
        assert [r.id for r in catalog.list()] == ["b-2"]
        with pytest.raises(CatalogError) as info:
            catalog.get("b-1")
        assert "b-1" in str(info.value)
        _pickles(info.value)

    def test_newest_and_system_identifiers(self, catalog: Catalog) -> None:
        """Where the catalog answers ``newest`` itself, it answers as the records do."""
        catalog.put(backup_record("b-1"))
        catalog.put(backup_record("b-2", minutes=1, stop_timeline=2))
        catalog.put(backup_record("b-3", minutes=2, state=BackupState.FAILED, failure_reason="x"))
        catalog.put(backup_record("b-4", minutes=3, system_identifier="7300000000000000002"))
        newest = getattr(catalog, "newest", None)
        if callable(newest):
            assert newest().id == "b-4"
            assert newest(2).id == "b-2"
            assert newest(1).id == "b-4"
            assert newest(7) is None
        assert catalog_system_identifiers(catalog) == {
            "7300000000000000001",
            "7300000000000000002",
        }

    def test_concurrent_writers_lose_nothing(self, catalog: Catalog, reopen: Reopen) -> None:
        """Four writers (threads, each with its own catalog object) at once."""
        errors: list[BaseException] = []

        def write(n: int) -> None:
            mine = reopen()
            try:
                for i in range(10):
                    mine.put(backup_record(f"b-{n}-{i}", minutes=n * 10 + i))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(catalog.list()) == 40

    def test_the_cluster_lock(self, catalog: Catalog, reopen: Reopen) -> None:
        """Backups share the lock, everything else holds it alone; a refusal is at once
        and names the holder; a released lock is free (for catalogs that keep one)."""
        if not isinstance(catalog, ClusterLockProvider):
            return
        lock = catalog.cluster_lock()
        other_catalog = reopen() if self.shared_lock else catalog
        assert isinstance(other_catalog, ClusterLockProvider)
        other = other_catalog.cluster_lock()

        def holder(kind: str) -> LockHolder:
            return LockHolder.for_run(kind, kind[0] * 64, journal=f"/j/{kind}.journal")

        with lock.acquire(holder("backup")) as first:
            with other.acquire(holder("backup")):
                assert sorted(h.kind for h in other.holders()) == ["backup", "backup"]
            with pytest.raises(ClusterLockedError) as info:
                other.acquire(holder("recovery"))
            assert "backup plan bbbbbbbbbbbb" in str(info.value)
            _pickles(info.value)
            first.check("snapshot")  # still held
        assert lock.holders() == () and other.holders() == ()
        with other.acquire(holder("recovery")):
            with pytest.raises(ClusterLockedError):
                lock.acquire(holder("backup"))
            assert [h.kind for h in lock.holders()] == ["recovery"]
        with lock.acquire(holder("expiry")):
            pass
