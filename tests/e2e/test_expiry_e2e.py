"""Retention on a real PostgreSQL cluster (issue 13): expire, then recover what the
policy promises and check the rows.

Backups A, B, C (batches 1, 2, 3 before each), on timeline 1; then a
point-in-time recovery makes timeline 2, and backup D is taken on it. Each
policy is applied with ``Cluster.expire`` and the recovery the policy still
promises (the oldest kept backup's consistency point, and the end of the
WAL) is run for real.
"""

from __future__ import annotations

import datetime as dt
import shutil
import time
from typing import Any

import attrs
import pytest

from pgsnap import errors
from pgsnap.model import RecoveryTarget, VolumeRole
from pgsnap.planner.expiry import RetentionPolicy
from pgsnap.wal import segment_name
from tests.e2e.conftest import Env, count_listings

DATA = VolumeRole.DATA


def _three_backups(env: Env) -> list[Any]:
    env.create_table()
    records = []
    for batch in (1, 2, 3):
        env.write(batch)
        records.append(env.cluster.backup(f"b{batch}"))
        env.switch_wal()
    env.write(4)
    env.switch_wal()
    return records


def _segments(env: Env) -> list[str]:
    return sorted(p.name for p in env.archive_dir.iterdir() if len(p.name) == 24)


def test_redundancy_deletes_the_oldest_backup_and_its_wal_then_the_rest_recovers(
    e2e_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    env: Env = e2e_env()
    a, b, c = _three_backups(env)
    before = _segments(env)
    dry = env.cluster.expire(RetentionPolicy(redundancy=2), dry_run=True)
    assert [r.id for r in env.cluster.backups()] == [a.id, b.id, c.id]  # dry run: nothing gone
    assert _segments(env) == before
    assert any(a.id in line for line in dry.lost)

    # Issue 27: the archive is known now (the dry run listed it): the expiry and the
    # plans after it probe it by name, also once the expiry cut its runs short.
    listings = count_listings(monkeypatch)
    plan = env.cluster.expire(RetentionPolicy(redundancy=2))
    assert plan.steps == dry.steps
    assert [r.id for r in env.cluster.backups()] == [b.id, c.id]
    assert not (set(a.snapshots.values()) & env.snapshot_ids())  # its snapshots went
    assert set(b.snapshots.values()) | set(c.snapshots.values()) <= env.snapshot_ids()
    after = _segments(env)
    seg = b.wal_segment_size
    b_start = segment_name(b.start_timeline, b.start_lsn.value // seg, seg)
    assert min(after) == b_start, plan.explain()  # what B's recovery starts from stays
    assert after == [n for n in before if n >= b_start]  # and all after it
    assert any(line.startswith(f"backup {a.id}") for line in plan.lost)
    # Planning again deletes nothing.
    assert env.cluster.plan_expiry(RetentionPolicy(redundancy=2)).steps == ()
    assert listings == [], "an expiry listed an archive it knew"

    # The kept backups still recover: to the end of the WAL, and the oldest one
    # to its consistency point (on timeline 1, where it was taken).
    env.crash()
    env.lose_data()
    env.cluster.execute(env.cluster.plan_recovery(RecoveryTarget.latest(), lost=[DATA]))
    assert env.batches() == env.expect(1, 2, 3, 4)
    env.crash()
    env.lose_data()
    env.cluster.execute(
        env.cluster.plan_recovery(
            RecoveryTarget.immediate(), lost=[DATA], backup_id=b.id, timeline=1
        )
    )
    assert env.batches() == env.expect(1, 2)


def test_a_window_keeps_its_anchor_and_a_pin_outlives_the_policy(e2e_env: Any) -> None:
    env: Env = e2e_env()
    a, b, c = _three_backups(env)
    env.cluster.pin(a.id, "kept for the auditors")
    # A window that starts between B's and C's consistency points, an hour ago:
    # B is its anchor; A goes, but for its pin.
    now = c.stop_time + dt.timedelta(hours=1)
    env.cluster.clock = lambda: now
    window = now - (b.stop_time + (c.stop_time - b.stop_time) / 2)
    plan = env.cluster.expire(RetentionPolicy(window=window))
    kept = [r.id for r in env.cluster.backups()]
    assert kept == [a.id, b.id, c.id], plan.explain()
    assert any("pinned" in line for line in plan.kept)
    with pytest.raises(errors.PlanningError, match="pinned"):
        env.cluster.plan_delete(a.id)

    env.cluster.unpin(a.id)
    env.cluster.expire(RetentionPolicy(window=window))
    assert [r.id for r in env.cluster.backups()] == [b.id, c.id]

    # The window's anchor recovers to its consistency point.
    env.crash()
    env.lose_data()
    env.cluster.execute(
        env.cluster.plan_recovery(RecoveryTarget.immediate(), lost=[DATA], backup_id=b.id)
    )
    assert env.batches() == env.expect(1, 2)


def test_delete_one_backup_and_timelines_after_a_fork(e2e_env: Any) -> None:
    env: Env = e2e_env()
    a, b, c = _three_backups(env)
    # A point-in-time recovery to C's consistency point makes timeline 2; D on it.
    env.crash()
    env.lose_data()
    env.cluster.execute(
        env.cluster.plan_recovery(RecoveryTarget.immediate(), lost=[DATA], backup_id=c.id)
    )
    assert env.batches() == env.expect(1, 2, 3)
    assert env.timeline() == 2
    env.write(5)
    d = env.cluster.backup("d")
    env.switch_wal()
    env.write(6)
    env.switch_wal()

    plan = env.cluster.plan_delete(b.id)
    env.cluster.execute(plan)
    assert [r.id for r in env.cluster.backups()] == [a.id, c.id, d.id]

    env.cluster.expire(RetentionPolicy(redundancy=1))
    assert [r.id for r in env.cluster.backups()] == [d.id]
    # No kept backup's recovery touches timeline 1 any more: its WAL is gone; the
    # history file stays.
    assert not [n for n in _segments(env) if n.startswith("00000001")]
    assert (env.archive_dir / "00000002.history").exists()
    env.crash()
    env.lose_data()
    env.cluster.execute(env.cluster.plan_recovery(RecoveryTarget.latest(), lost=[DATA]))
    assert env.batches() == env.expect(1, 2, 3, 5, 6)


# --------------------------------------------------------------------------- reconciliation


def test_a_lost_catalog_is_rebuilt_from_the_snapshots_and_the_archive_and_recovers(
    e2e_env: Any,
) -> None:
    from pgsnap.catalog import DirectoryCatalog
    from pgsnap.wal.contents import WalIndex

    env: Env = e2e_env()
    env.create_table()
    records = []
    # Default labels ("pgsnap <id>") are matched by label; the last one's custom
    # label is not, so it is matched by time, a few seconds after the others.
    for batch, label in ((1, None), (2, None), (3, "nightly")):
        if label is not None:
            time.sleep(3)
        env.write(batch)
        records.append(env.cluster.backup(label))
        env.switch_wal()
    env.write(4)
    env.switch_wal()
    a, b, c = records
    catalog = env.cluster.catalog
    assert isinstance(catalog, DirectoryCatalog)
    shutil.rmtree(catalog.path)
    env.cluster.catalog = DirectoryCatalog(catalog.path)
    env.cluster.wal_index = WalIndex(catalog.path / "wal-index")
    assert list(env.cluster.backups()) == []

    dry = env.cluster.rebuild_catalog(dry_run=True)
    assert [r.id for r in dry.rebuilt] == [a.id, b.id, c.id], dry.explain()
    assert list(env.cluster.backups()) == []  # a dry run writes nothing

    report = env.cluster.rebuild_catalog()
    assert report.skipped == (), report.explain()
    rebuilt = {r.id: r for r in env.cluster.backups()}
    for original in (a, b, c):
        r = rebuilt[original.id]
        assert r.labelfile == original.labelfile  # byte for byte, as PostgreSQL wrote it
        assert (r.label, r.state, r.snapshots, r.snapshot_group_id) == (
            original.label,
            original.state,
            original.snapshots,
            original.snapshot_group_id,
        )
        assert (r.start_lsn, r.stop_lsn, r.start_timeline, r.stop_timeline) == (
            original.start_lsn,
            original.stop_lsn,
            original.start_timeline,
            original.stop_timeline,
        )
        assert (r.system_identifier, r.wal_segment_size) == (
            original.system_identifier,
            original.wal_segment_size,
        )
        assert r.server_version // 10000 == original.server_version // 10000
        assert original.stop_time is not None and r.stop_time is not None
        # PostgreSQL's STOP TIME has whole seconds; the rebuilt record says the end of that
        # second, never before the backup's end. pgsnap's own record has its clock just
        # after pg_backup_stop returned, up to a few ms later than PostgreSQL's: past a
        # second's turn it is after the rebuilt time (a CI run met that), never by more.
        assert r.stop_time.microsecond == 0
        late = dt.timedelta(milliseconds=500)
        assert (
            original.stop_time - late < r.stop_time <= original.stop_time + dt.timedelta(seconds=1)
        )
    # Rebuilding again changes nothing: existing records are never overwritten.
    again = env.cluster.rebuild_catalog()
    assert again.rebuilt == () and set(again.existing) == {a.id, b.id, c.id}

    # The rebuilt records recover: the middle one to its consistency point, then the end.
    env.crash()
    env.lose_data()
    env.cluster.execute(
        env.cluster.plan_recovery(RecoveryTarget.immediate(), lost=[DATA], backup_id=b.id)
    )
    assert env.batches() == env.expect(1, 2)
    env.crash()
    env.lose_data()
    env.cluster.execute(
        env.cluster.plan_recovery(RecoveryTarget.latest(), lost=[DATA], backup_id=c.id, timeline=1)
    )
    assert env.batches() == env.expect(1, 2, 3, 4)


def test_orphans_are_listed_then_expired_by_age_and_the_kept_backup_still_recovers(
    e2e_env: Any,
) -> None:
    env: Env = e2e_env()
    env.create_table()
    env.write(1)
    a = env.cluster.backup("a")
    env.write(2)
    env.switch_wal()
    # A killed backup run's snapshots (no record names them), and a recovery's
    # safety snapshot (the recovery below), and a snapshot someone else took.
    killed = env.backend.create_snapshot_group([env.data_vol, env.wal_vol], "20260101T000000000Z")
    foreign = env.backend.create_snapshot_group([env.data_vol], "before-upgrade")
    env.crash()
    env.lose_data()
    env.cluster.execute(env.cluster.plan_recovery(RecoveryTarget.latest(), lost=[DATA]))
    assert env.batches() == env.expect(1, 2)

    orphans = env.cluster.orphans()
    # Issue 19: the recovery recorded its safety snapshot: listed, kept, no orphan.
    assert [o.kind for o in orphans] == ["backup"]
    assert orphans[0].group_id == killed.id
    (safety,) = env.cluster.safety_snapshots()
    assert set(safety.snapshots.values()) <= env.snapshot_ids()
    report = env.cluster.check()
    (finding,) = [f for f in report.findings if f.code == "orphan_snapshots"]
    assert killed.id in str(finding) and "age" in str(finding)

    policy = RetentionPolicy(redundancy=1, orphans_after=dt.timedelta(days=1))
    young = env.cluster.expire(policy)  # too young: kept, listed
    assert not [s for s in young.steps if s.id.startswith("delete-orphan-")]
    assert any("younger than orphans_after 1d" in k for k in young.kept), young.explain()
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=2)
    env.cluster.clock = lambda: later
    plan = env.cluster.expire(policy)
    deleted = [s for s in plan.steps if s.id.startswith("delete-orphan-")]
    assert len(deleted) == 1, plan.explain()
    left = env.snapshot_ids()
    assert not {sid for o in orphans for sid in o.snapshot_ids} & left
    assert {s.id for s in foreign.snapshots} <= left  # not pgsnap's: never touched
    assert set(a.snapshots.values()) <= left
    assert env.cluster.orphans() == ()
    # The safety snapshot is kept until deleted by name, or by safety_after.
    assert set(safety.snapshots.values()) <= left
    assert any(f"pgsnap safety delete {safety.name}" in k for k in plan.kept), plan.explain()
    plan = env.cluster.expire(attrs.evolve(policy, safety_after=dt.timedelta(days=1)))
    assert [s.id for s in plan.steps] == [
        f"delete-safety-{safety.name}",
        f"delete-safety-record-{safety.name}",
    ]
    assert env.cluster.safety_snapshots() == ()
    assert not set(safety.snapshots.values()) & env.snapshot_ids()

    env.crash()
    env.lose_data()
    env.cluster.execute(env.cluster.plan_recovery(RecoveryTarget.latest(), lost=[DATA]))
    assert env.batches() == env.expect(1, 2)
