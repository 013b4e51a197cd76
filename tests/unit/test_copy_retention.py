"""Copy retention (issue 21 §2): the pure planner, and snapshot expiry that never
orphans a copy."""

from __future__ import annotations

import datetime as dt

import attrs
import pytest

from pgsnap.errors import ConfigurationError, PlanningError
from pgsnap.model import BackupRecord, BackupState, CopyRecord, Pin
from pgsnap.planner.copy_expiry import (
    CopyExpiryFacts,
    CopyRetentionPolicy,
    kept_copies,
    plan_copy_expiry,
)
from pgsnap.planner.expiry import ExpiryFacts, RetentionPolicy, plan_delete, plan_expiry
from pgsnap.protocols import Capability
from pgsnap.wal import ArchiveIndex, TimelineGraph
from tests.property.test_expiry_properties import END1, MB, T0, _backup, _names, _snapshots

TARGET = "/copies"
DAY = dt.timedelta(days=1)


def copied(b: BackupRecord, *targets: str) -> BackupRecord:
    """``b`` with one copy in each target (``<id>.<n>``), made just after it."""
    return attrs.evolve(
        b,
        copies=tuple(
            CopyRecord(f"{b.id}.{n}", t, "d" * 64, (b.stop_time or b.start_time) + DAY)
            for n, t in enumerate(targets or (TARGET,), 1)
        ),
    )


def _expiry_facts(backups, snapshots=None):
    return ExpiryFacts(
        backups=tuple(backups),
        snapshots=_snapshots(backups, set()) if snapshots is None else snapshots,
        archive=ArchiveIndex.build(_names([(1, 0, END1)]), MB),
        timelines=TimelineGraph.from_histories([]),
        now=T0 + dt.timedelta(days=10),
        capabilities=frozenset(Capability),
    )


# --------------------------------------------------------------------------- snapshot expiry


def test_snapshot_expiry_deletes_the_snapshots_of_a_copied_backup_but_keeps_its_record():
    a = copied(_backup(0, 5, BackupState.DONE, False))
    b, c = (_backup(i, seg, BackupState.DONE, False) for i, seg in ((1, 20), (2, 40)))
    plan = plan_expiry(_expiry_facts([a, b, c]), RetentionPolicy(redundancy=1))
    actions = {(s.action, s.id) for s in plan.steps}
    assert ("storage.delete_snapshot_group", f"delete-snapshots-{a.id}") in actions
    assert ("catalog.delete_backup", f"delete-record-{a.id}") not in actions
    assert ("catalog.delete_backup", f"delete-record-{b.id}") in actions  # no copy: goes
    (line,) = [k for k in plan.kept if k.startswith(f"backup {a.id}:")]
    assert "its record stays for its copies (b000.1 in /copies)" in line
    assert any(x.startswith(f"snapshots of backup {a.id}") for x in plan.lost)
    # The WAL a restore from the copy replays stays: nothing from a's start is deleted.
    for s in plan.steps:
        if s.action == "archive.delete_wal":
            assert s.params["last"] < 5, s


def test_a_copied_backup_whose_snapshots_are_gone_stays_done_and_kept():
    a = copied(_backup(0, 5, BackupState.DONE, False))
    b = _backup(1, 20, BackupState.DONE, False)
    snaps = tuple(s for s in _snapshots([a, b], set()) if not s.id.startswith(a.id))
    plan = plan_expiry(_expiry_facts([a, b], snaps), RetentionPolicy(redundancy=1))
    assert not [s for s in plan.steps if s.params.get("backup_id") == a.id]
    assert not any(w.startswith(f"backup {a.id} cannot be restored") for w in plan.warnings)
    (line,) = [k for k in plan.kept if k.startswith(f"backup {a.id}:")]
    assert "its snapshots are gone, its copies (b000.1 in /copies) restore it" in line
    # Its last copy removed, the same backup is marked unusable as before.
    bare = attrs.evolve(a, copies=())
    again = plan_expiry(_expiry_facts([bare, b], snaps), RetentionPolicy(redundancy=1))
    assert f"mark-unusable-{a.id}" in {s.id for s in again.steps}


def test_deleting_a_copied_backup_deletes_its_snapshots_only():
    a = copied(_backup(0, 5, BackupState.DONE, False))
    plan = plan_delete(_expiry_facts([a]), a.id)
    assert [s.action for s in plan.steps] == ["storage.delete_snapshot_group"]
    assert "only its snapshots are deleted" in plan.warnings[0]
    gone = tuple(s for s in _snapshots([a], set()) if not s.id.startswith(a.id))
    with pytest.raises(PlanningError, match="nothing to delete") as info:
        plan_delete(_expiry_facts([a], gone), a.id)
    assert "expire-copies" in str(info.value.hint)


# --------------------------------------------------------------------------- copy retention

NOW = T0 + dt.timedelta(days=400)


def daily(n: int, *, snapshots_for: int = 0) -> tuple[list[BackupRecord], frozenset[str]]:
    """``n`` DONE backups one a day (the newest a day before NOW), each copied once;
    the newest ``snapshots_for`` still have their snapshots."""
    backups = []
    for i in range(n):
        when = NOW - dt.timedelta(days=n - i)
        b = _backup(i, 5, BackupState.DONE, False)
        b = attrs.evolve(b, start_time=when, stop_time=when + dt.timedelta(seconds=1))
        backups.append(copied(b))
    keep = backups[n - snapshots_for :] if snapshots_for else []
    return backups, frozenset(s for b in keep for s in b.snapshots.values())


def facts(backups, snapshots=frozenset(), manifests=None) -> CopyExpiryFacts:
    ids = {c.copy_id for b in backups for c in b.copies if c.target == TARGET}
    return CopyExpiryFacts(
        backups=tuple(backups),
        target=TARGET,
        manifests=frozenset(ids if manifests is None else manifests),
        now=NOW,
        snapshots=snapshots,
    )


def test_no_policy_keeps_every_copy():
    backups, snaps = daily(5, snapshots_for=5)
    plan = plan_copy_expiry(facts(backups, snaps), CopyRetentionPolicy())
    assert plan.steps == () and len(plan.kept) == 5
    assert all("no copy retention configured" in k for k in plan.kept)


def test_levels_thin_the_copies_of_backups_that_still_have_snapshots():
    backups, snaps = daily(10, snapshots_for=10)
    plan = plan_copy_expiry(facts(backups, snaps), CopyRetentionPolicy(daily=3))
    gone = [s.params["copy_id"] for s in plan.steps if s.action == "catalog.forget_copy"]
    assert gone == [f"b{i:03d}.1" for i in range(7)]  # oldest first
    order = [s.action for s in plan.steps]
    # each copy: its manifest, then its record; one garbage collection at the end
    assert order == ["copy.expire_manifest", "catalog.forget_copy"] * 7 + ["copy.collect_garbage"]
    assert plan.steps[-1].params["busy_ok"] is True
    assert all("newest of its day (3 days kept)" in k for k in plan.kept)
    assert plan.step("forget-copy-b000.1").reason.startswith(
        "not the newest of a period the levels keep"
    )


def test_the_last_copy_of_a_backup_without_snapshots_is_kept_until_max_age():
    backups, snaps = daily(10, snapshots_for=2)
    plan = plan_copy_expiry(facts(backups, snaps), CopyRetentionPolicy(daily=3))
    assert plan.steps == ()  # every old one is the last way back to its backup
    assert sum("the last copy of backup" in k for k in plan.kept) == 7
    assert any("no max_age" in w for w in plan.warnings)
    aged = CopyRetentionPolicy(daily=3, max_age=dt.timedelta(days=5, hours=12))
    plan = plan_copy_expiry(facts(backups, snaps), aged)
    gone = [s.params["copy_id"] for s in plan.steps if s.action == "catalog.forget_copy"]
    assert gone == [f"b{i:03d}.1" for i in range(5)]  # older than 5.5 days
    assert plan.step("forget-copy-b000.1").reason.startswith("older than max_age 132h")
    assert sum("can no longer be restored" in w for w in plan.warnings) == 5
    # Kept by the conservative rule (not by the levels): days 6 and 7 before NOW.
    assert sum("the last copy of backup" in k for k in plan.kept) == 2


def test_a_second_copy_elsewhere_lets_the_one_here_go():
    backups, snaps = daily(4)
    backups[0] = copied(backups[0], TARGET, "s3://other/pgsnap")
    kept, gone, _w = kept_copies(facts(backups, snaps), CopyRetentionPolicy(redundancy=2))
    assert set(gone) == {"b000.1"} and "b001.1" in kept  # b001's only copy stays


def test_pins_win_over_everything_and_max_age_over_the_rules():
    backups, snaps = daily(6, snapshots_for=6)
    backups[0] = attrs.evolve(backups[0], pin=Pin("audit"))
    policy = CopyRetentionPolicy(redundancy=10, max_age=dt.timedelta(days=3, hours=12))
    kept, gone, _w = kept_copies(facts(backups, snaps), policy)
    assert kept["b000.1"] == ["backup pinned forever: audit"]
    assert set(gone) == {"b001.1", "b002.1"}
    assert "the rules alone would keep it: within redundancy 10" in gone["b001.1"]


def test_a_copy_whose_manifest_is_missing_keeps_its_record_and_is_reported():
    backups, snaps = daily(3, snapshots_for=3)
    plan = plan_copy_expiry(
        facts(backups, snaps, manifests={"b002.1"}), CopyRetentionPolicy(redundancy=1)
    )
    assert plan.steps == ()
    assert sum("is not in /copies" in w for w in plan.warnings) == 2
    aged = CopyRetentionPolicy(redundancy=1, max_age=dt.timedelta(days=2, hours=12))
    plan = plan_copy_expiry(facts(backups, snaps, manifests={"b002.1"}), aged)
    assert [s.id for s in plan.steps] == ["forget-copy-b000.1"]  # no manifest to remove: no GC


def test_the_storage_unknown_counts_every_backup_as_snapshotless():
    backups, _snaps = daily(4)
    f = attrs.evolve(facts(backups), snapshots=None)
    assert plan_copy_expiry(f, CopyRetentionPolicy(redundancy=1)).steps == ()


def test_a_copy_expiry_plan_round_trips_and_its_fingerprint_follows_the_copies():
    from pgsnap.plan import Plan

    backups, snaps = daily(5, snapshots_for=5)
    policy = CopyRetentionPolicy(redundancy=2, yearly=3, window=dt.timedelta(days=2))
    plan = plan_copy_expiry(facts(backups, snaps), policy)
    assert Plan.from_json(plan.to_json()) == plan
    assert CopyRetentionPolicy.from_request(plan.request) == policy
    newer = daily(6, snapshots_for=6)
    assert plan_copy_expiry(facts(*newer), policy).fingerprint != plan.fingerprint
    assert plan_copy_expiry(facts(backups, snaps), policy).fingerprint == plan.fingerprint


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"redundancy": 0}, "redundancy 0"),
        ({"daily": -1}, "cannot be negative"),
        ({"monthly": "12"}, "whole number"),
        ({"window": dt.timedelta(0)}, "positive duration"),
        ({"window": dt.timedelta(days=9), "max_age": dt.timedelta(days=9)}, "longer than"),
    ],
)
def test_a_policy_that_makes_no_sense_is_refused(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        CopyRetentionPolicy(**kwargs)


def test_two_copies_of_the_window_anchor_are_both_kept():
    """Found by the property test: the anchor of the window is a backup time, and
    every copy of that backup is as old as the anchor (the window kept one)."""
    b = copied(_backup(0, 5, BackupState.DONE, False), TARGET, TARGET)
    found = facts([b])
    kept, gone, _warnings = kept_copies(found, CopyRetentionPolicy(window=DAY))
    assert set(kept) == {f"{b.id}.1", f"{b.id}.2"} and not gone
