"""The expiry planner on small, hand-made histories (issue 13)."""

from __future__ import annotations

import datetime as dt

import attrs

from pgsnap.model import BackupState
from pgsnap.planner.expiry import ExpiryFacts, RetentionPolicy, plan_expiry
from pgsnap.protocols import Capability, ClusterLockProvider
from pgsnap.wal import ArchiveIndex, TimelineGraph
from tests.property.test_expiry_properties import END1, MB, T0, _backup, _names, _snapshots


def _facts(backups, snapshots=None):
    return ExpiryFacts(
        backups=tuple(backups),
        snapshots=_snapshots(backups, set()) if snapshots is None else snapshots,
        archive=ArchiveIndex.build(_names([(1, 0, END1)]), MB),
        timelines=TimelineGraph.from_histories([]),
        now=T0 + dt.timedelta(days=10),
        capabilities=frozenset(Capability),
    )


def test_a_backup_whose_snapshots_vanished_is_marked_and_counts_for_nothing():
    a, b, c = (_backup(i, seg, BackupState.DONE, False) for i, seg in enumerate((5, 20, 40)))
    snaps = tuple(s for s in _snapshots([a, b, c], set()) if not s.id.startswith(c.id))
    plan = plan_expiry(_facts([a, b, c], snaps), RetentionPolicy(redundancy=1))
    actions = [(s.action, s.id) for s in plan.steps]
    assert ("catalog.mark_unusable", f"mark-unusable-{c.id}") in actions
    assert any(w.startswith(f"backup {c.id} cannot be restored") for w in plan.warnings)
    # c is not restorable: redundancy 1 keeps b, the newest that is; a goes.
    assert ("catalog.delete_backup", f"delete-record-{a.id}") in actions
    assert ("catalog.delete_backup", f"delete-record-{b.id}") not in actions
    assert ("catalog.delete_backup", f"delete-record-{c.id}") not in actions  # not yet


def test_a_failed_backups_leftover_snapshots_go_with_it():
    a = attrs.evolve(
        _backup(0, 5, BackupState.FAILED, False), orphaned_snapshots=("leftover-1", "gone")
    )
    b = _backup(1, 20, BackupState.DONE, False)
    snaps = _snapshots([a, b], set())
    snaps += (attrs.evolve(snaps[0], id="leftover-1", group_id=None),)
    plan = plan_expiry(_facts([a, b], snaps), RetentionPolicy(redundancy=1))
    leftovers = [s for s in plan.steps if s.action == "storage.delete_snapshots"]
    assert [s.params["snapshot_ids"] for s in leftovers] == [["leftover-1"]]
    assert plan.step(f"delete-record-{a.id}").reason == "failed; a newer backup is DONE"


def test_a_failed_backup_stays_while_no_newer_backup_is_done():
    a = _backup(0, 5, BackupState.DONE, False)
    b = _backup(1, 20, BackupState.FAILED, False)
    plan = plan_expiry(_facts([a, b]), RetentionPolicy(redundancy=1))
    assert not [s for s in plan.steps if s.action == "catalog.delete_backup"]
    assert any(line.startswith(f"backup {b.id}: failed, and no newer DONE") for line in plan.kept)


def test_wal_archived_while_the_plan_waits_does_not_make_it_stale():
    """The archiver keeps appending between planning and execution: the plan deletes
    the same things, so its fingerprint stays; a WAL gap filled or a new backup does
    change what it may delete, and the fingerprint with it."""
    backups = [_backup(i, seg, BackupState.DONE, False) for i, seg in enumerate((5, 20, 40))]
    policy = RetentionPolicy(redundancy=1)
    before = plan_expiry(_facts(backups), policy)
    grown = attrs.evolve(
        _facts(backups), archive=ArchiveIndex.build(_names([(1, 0, END1 + 7)]), MB)
    )
    after = plan_expiry(grown, policy)
    assert after.steps == before.steps and after.fingerprint == before.fingerprint
    trimmed = attrs.evolve(_facts(backups), archive=ArchiveIndex.build(_names([(1, 3, END1)]), MB))
    assert plan_expiry(trimmed, policy).fingerprint != before.fingerprint
    newer = _backup(3, 50, BackupState.DONE, False)
    assert plan_expiry(_facts([*backups, newer]), policy).fingerprint != before.fingerprint


def test_a_pin_is_a_plan_undone_by_the_pin_it_found(tmp_path):
    """Issue 20: pins and unpins are plans the executor runs (journalled, under the
    cluster lock), not catalog writes beside it; a plan made before the pin changed
    is stale."""
    import pytest

    import pgsnap
    from pgsnap.errors import ClusterLockedError, StalePlanError
    from pgsnap.locks import LockHolder
    from pgsnap.model import Pin
    from pgsnap.planner.expiry import plan_pin
    from tests.unit.test_cli_unit import write_config

    (record,) = (_backup(0, 5, BackupState.DONE, False),)
    keep = Pin("audit 2026", T0 + dt.timedelta(days=30))
    plan = plan_pin(record, keep)
    assert (plan.kind, [s.action for s in plan.steps]) == ("pin", ["catalog.set_pin"])
    assert plan.steps[0].compensation_params == {"backup_id": record.id, "pin": None}
    assert "no pin -> pinned until" in plan.steps[0].description
    assert plan_pin(attrs.evolve(record, pin=keep), None).kind == "unpin"

    cluster = pgsnap.Cluster.from_config(write_config(tmp_path))
    cluster.catalog.put(record)
    stale = cluster.plan_pin(record.id, "first")
    assert cluster.pin(record.id, "audit 2026").pin == Pin("audit 2026")
    assert [p.name for p in (tmp_path / "catalog" / "journal").glob("pin-*.journal")]
    with pytest.raises(StalePlanError, match=f"the pin of backup {record.id} changed"):
        cluster.execute(stale)
    assert isinstance(cluster.catalog, ClusterLockProvider)
    lock = cluster.catalog.cluster_lock()
    with (
        lock.acquire(LockHolder("recovery", "e" * 64, 4242, "db9", T0)),
        pytest.raises(ClusterLockedError),
    ):
        cluster.unpin(record.id)
    assert cluster.unpin(record.id).pin is None
