"""Reconciliation (issue 13 §3): orphan snapshots and the catalog rebuild, pure parts."""

from __future__ import annotations

import datetime as dt

import attrs
import pytest

from pgsnap import errors
from pgsnap.model import LSN, BackupState, Layout, Snapshot, Volume, VolumeRole
from pgsnap.planner.checks import CheckFacts, check_findings
from pgsnap.planner.expiry import ExpiryFacts, RetentionPolicy, plan_expiry
from pgsnap.planner.reconcile import (
    RebuildFacts,
    RebuildSource,
    SnapshotHold,
    find_orphans,
    hold_of_journal,
    labelfile_from_history,
    plan_rebuild,
)
from pgsnap.protocols import Capability
from pgsnap.wal import ArchiveIndex, TimelineGraph, parse_backup_file
from tests.property.test_expiry_properties import (
    END1,
    LAYOUT,
    MB,
    T0,
    _backup,
    _names,
    _snapshots,
)

NOW = T0 + dt.timedelta(days=10)
VOLS = frozenset(v.id for v in LAYOUT.volumes)


def _group(name: str, gid: str, at: dt.datetime, **kw: object) -> tuple[Snapshot, ...]:
    return tuple(
        Snapshot(f"{gid}-{v}", v, name, at, group_id=gid, **kw)  # type: ignore[arg-type]
        for v in ("vol-data", "vol-wal")
    )


def _facts(backups, snapshots, **kw) -> ExpiryFacts:
    return ExpiryFacts(
        backups=tuple(backups),
        snapshots=tuple(snapshots),
        archive=ArchiveIndex.build(_names([(1, 0, END1)]), MB),
        timelines=TimelineGraph.from_histories([]),
        now=NOW,
        capabilities=frozenset(Capability),
        volume_ids=VOLS,
        **kw,
    )


# --------------------------------------------------------------------------- orphans


def _orphan_steps(plan):
    return [s for s in plan.steps if s.id.startswith("delete-orphan-")]


def test_only_snapshots_pgsnap_can_prove_it_made_are_orphans():
    b = _backup(0, 5, BackupState.DONE, False)
    started = _backup(1, 10, BackupState.STARTED, False)
    day_ago = NOW - dt.timedelta(days=1)
    snaps = (
        *_snapshots([b], set()),  # named by b: not an orphan
        *_group("20260105T101010123Z", "cg-killed", day_ago),  # pgsnap's id form
        *_group("s-20260106T101010123Z", "cg-safety", day_ago),  # a safety snapshot
        *_group(started.id, "cg-started", day_ago),  # its record is STARTED, no snapshots yet
        *_group("nightly-by-admin", "cg-admin", day_ago),  # someone else's
        *_group("20260105T101010124Z", "cg-policy", day_ago, extra={"policy_id": "p1"}),
        Snapshot("loose", "vol-data", "20260105T101010125Z", day_ago),  # no group
        Snapshot("other", "vol-elsewhere", "20260105T101010126Z", day_ago, group_id="cg-x"),
    )
    orphans = find_orphans([b, started], snaps, volume_ids=VOLS)
    by_group = {o.group_id: o for o in orphans}
    assert set(by_group) == {"cg-killed", "cg-safety", "cg-started"}
    assert by_group["cg-safety"].kind == "safety"
    assert by_group["cg-killed"].whole_group
    assert by_group["cg-started"].held == f"backup {started.id} is not finished (started)"
    assert by_group["cg-killed"].held is None
    assert "age 1d" in by_group["cg-killed"].describe(NOW)


def test_a_partly_recorded_group_loses_only_its_orphaned_snapshots():
    b = _backup(0, 5, BackupState.DONE, False)
    (snap,) = [s for s in _snapshots([b], set()) if s.volume_id == "vol-data"]
    stray = attrs.evolve(snap, id="stray", volume_id="vol-wal", name=b.id)
    b = attrs.evolve(b, snapshots={"vol-data": snap.id})
    (orphan,) = find_orphans([b], (snap, stray), volume_ids=VOLS)
    assert orphan.snapshot_ids == ("stray",)
    assert not orphan.whole_group


def test_expiry_deletes_old_orphans_keeps_young_held_and_secure_ones():
    b = _backup(0, 5, BackupState.DONE, False)
    old = NOW - dt.timedelta(days=3)
    young = NOW - dt.timedelta(hours=2)
    snaps = (
        *_snapshots([b], set()),
        *_group("20260101T000000001Z", "cg-old", old, extra={"size_bytes": "1048576"}),
        *_group("20260101T000000002Z", "cg-young", young),
        *_group("s-20260101T000000003Z", "cg-held", old),
        *_group("20260101T000000004Z", "cg-secure", old, secure=True),
    )
    hold = SnapshotHold("recovery plan abc", group_names=frozenset({"s-20260101T000000003Z"}))
    facts = _facts([b], snaps, holds=(hold,))
    plan = plan_expiry(facts, RetentionPolicy(redundancy=1, orphans_after=dt.timedelta(days=1)))
    deleted = [s for s in plan.steps if s.id.startswith("delete-orphan-")]
    assert [(s.action, s.params["group_id"]) for s in deleted] == [
        ("storage.delete_snapshot_group", "cg-old")
    ]
    assert "older than orphans_after 1d" in deleted[0].reason
    assert any("cg-old" in line and "2.0 MiB" in line for line in plan.lost), plan.lost
    kept = "\n".join(plan.kept)
    assert "younger than orphans_after 1d" in kept
    assert "the recovery plan abc has not ended" in kept
    assert "secure snapshot" in kept
    assert sum(w.startswith("orphan: ") for w in plan.warnings) == 4
    # Without orphans_after they are all listed and kept.
    plain = plan_expiry(facts, RetentionPolicy(redundancy=1))
    assert not [s for s in plain.steps if s.id.startswith("delete-orphan-")]
    assert sum("no orphans_after" in k for k in plain.kept) == 2


def test_orphans_of_another_cluster_or_with_an_unreadable_record_are_not_deleted():
    old = NOW - dt.timedelta(days=3)
    b = _backup(0, 5, BackupState.DONE, False)
    snaps = (*_snapshots([b], set()), *_group("20260101T000000001Z", "cg-old", old))
    policy = RetentionPolicy(redundancy=1, orphans_after=dt.timedelta(days=1))
    elsewhere = attrs.evolve(_facts([b], snaps), volume_ids=frozenset({"vol-other"}))
    assert not _orphan_steps(plan_expiry(elsewhere, policy))
    assert _orphan_steps(plan_expiry(_facts([b], snaps), policy))  # the control
    broken = _facts([b], snaps, unreadable=("20260101T000000001Z",))
    plan = plan_expiry(broken, policy)
    assert not _orphan_steps(plan)
    assert any("unreadable" in k for k in plan.kept)


def test_a_hold_keeps_the_backup_an_unfinished_recovery_restores_from():
    a, b = (_backup(i, seg, BackupState.DONE, False) for i, seg in enumerate((5, 20)))
    hold = SnapshotHold("recovery plan x", snapshot_ids=frozenset({a.snapshots["vol-data"]}))
    facts = _facts([a, b], _snapshots([a, b], set()), holds=(hold,))
    plan = plan_expiry(facts, RetentionPolicy(redundancy=1))
    assert not [s for s in plan.steps if s.action == "catalog.delete_backup"]
    assert any("recovery plan x has not ended" in k for k in plan.kept)
    # The fingerprint covers the holds: the plan goes stale when a run ends.
    assert (
        plan.fingerprint
        != plan_expiry(attrs.evolve(facts, holds=()), RetentionPolicy(redundancy=1)).fingerprint
    )


def test_hold_of_journal_reads_group_names_outputs_and_restore_sources():
    plan = {
        "kind": "recovery",
        "id": "0123456789abcdef",
        "steps": [
            {
                "id": "safety-snapshot",
                "action": "storage.snapshot_group",
                "params": {"volume_ids": ["vol-data"], "group_name": "s-20260101T000000000Z"},
            },
            {
                "id": "restore-vol-data",
                "action": "storage.restore_volume",
                "params": {"volume_id": "vol-data", "snapshot_id": "b1-d"},
                "compensation": "storage.restore_volume",
                "compensation_params": {
                    "volume_id": "vol-data",
                    "snapshot_id": {"$ref": ["safety-snapshot", "snapshots", "vol-data"]},
                },
            },
            {
                "id": "delete",
                "action": "storage.delete_snapshot_group",
                "params": {"group_id": "cg-9"},
            },
        ],
    }
    hold = hold_of_journal(
        plan, {"safety-snapshot": {"group_id": "cg-7", "snapshot_ids": ["snap-7"]}}
    )
    assert hold == SnapshotHold(
        "recovery plan 0123456789ab",
        snapshot_ids=frozenset({"snap-7", "b1-d"}),
        group_ids=frozenset({"cg-7"}),
        group_names=frozenset({"s-20260101T000000000Z"}),
    )
    assert hold_of_journal({"kind": "expiry", "steps": plan["steps"][2:]}, {}) is None


def test_orphans_after_is_validated_and_round_trips():
    with pytest.raises(errors.ConfigurationError, match="at least 1h"):
        RetentionPolicy(redundancy=1, orphans_after=dt.timedelta(minutes=5))
    policy = RetentionPolicy(redundancy=2, orphans_after=dt.timedelta(days=7))
    assert RetentionPolicy.from_request(policy.to_request()) == policy
    assert "orphans after 7d" in policy.describe()


def test_check_reports_orphans_with_their_age():
    snaps = _group("20260101T000000001Z", "cg-old", NOW - dt.timedelta(hours=30))
    orphans = find_orphans([], snaps, volume_ids=VOLS)
    facts = CheckFacts(
        archive_location="/a",
        segment_size=MB,
        index=ArchiveIndex.build([], MB),
        timelines=TimelineGraph.from_histories([]),
        orphans=orphans,
        now=NOW,
    )
    (finding,) = [f for f in check_findings(facts) if f.code == "orphan_snapshots"]
    assert "cg-old" in finding.message and "age 1d 6h" in finding.message
    assert "--orphans-after" in finding.message


# --------------------------------------------------------------------------- rebuild

HISTORY_FILE = (
    "START WAL LOCATION: 0/5000028 (file 000000010000000000000050)\n"
    "STOP WAL LOCATION: 0/5000100 (file 000000010000000000000050)\n"
    "CHECKPOINT LOCATION: 0/5000060\n"
    "BACKUP METHOD: streamed\n"
    "BACKUP FROM: primary\n"
    "START TIME: 2026-01-01 05:00:00 UTC\n"
    "LABEL: {label}\n"
    "START TIMELINE: 1\n"
    "STOP TIME: 2026-01-01 05:00:01 UTC\n"
    "STOP TIMELINE: 1\n"
)


def test_the_backup_label_comes_back_from_the_history_file():
    assert labelfile_from_history(HISTORY_FILE.format(label="x")) == (
        "START WAL LOCATION: 0/5000028 (file 000000010000000000000050)\n"
        "CHECKPOINT LOCATION: 0/5000060\n"
        "BACKUP METHOD: streamed\n"
        "BACKUP FROM: primary\n"
        "START TIME: 2026-01-01 05:00:00 UTC\n"
        "LABEL: x\n"
        "START TIMELINE: 1\n"
    )


def _rebuild_facts(snapshots, label, *, layout=LAYOUT, backups=(), names=None, **kw):
    text = HISTORY_FILE.format(label=label)
    return RebuildFacts(
        backups=tuple(backups),
        snapshots=tuple(snapshots),
        volume_ids=frozenset(v.id for v in layout.volumes),
        layout=layout,
        sources=(
            RebuildSource(
                "000000010000000000000050.00000028.backup", text, parse_backup_file(text)
            ),
        ),
        archive=ArchiveIndex.build(names or _names([(1, 0, 90)]), MB),
        timelines=TimelineGraph.from_histories([]),
        system_identifier="42",
        server_version=170000,
        **kw,
    )


AT = dt.datetime(2026, 1, 1, 5, 0, 0, 500000, tzinfo=dt.UTC)


@pytest.mark.parametrize("label", ["pgsnap 20260101T050000000Z", "nightly"])
def test_a_group_and_its_backup_file_make_a_record(label):
    snaps = _group("20260101T050000000Z", "cg-1", AT)
    report = plan_rebuild(_rebuild_facts(snaps, label))
    (r,) = report.rebuilt
    assert (r.id, r.label, r.state) == ("20260101T050000000Z", label, BackupState.DONE)
    assert (r.start_lsn, r.stop_lsn, r.start_timeline) == (LSN(0x5000028), LSN(0x5000100), 1)
    assert r.stop_time == dt.datetime(2026, 1, 1, 5, 0, 2, tzinfo=dt.UTC)  # rounded up
    assert r.snapshots == {"vol-data": "cg-1-vol-data", "vol-wal": "cg-1-vol-wal"}
    assert r.snapshot_group_id == "cg-1"
    assert r.labelfile == labelfile_from_history(HISTORY_FILE.format(label=label))
    assert (r.system_identifier, r.server_version, r.wal_segment_size) == ("42", 170000, MB)
    assert report.skipped == ()


def test_what_cannot_be_rebuilt_is_said_and_why():
    # a custom label and a snapshot taken outside the backup: no match
    late = _group("20260101T050000000Z", "cg-1", AT + dt.timedelta(hours=1))
    report = plan_rebuild(_rebuild_facts(late, "nightly"))
    assert report.rebuilt == ()
    assert any("no .backup file" in why for _w, why in report.skipped), report.explain()
    # the WAL is not archived
    snaps = _group("20260101T050000000Z", "cg-1", AT)
    report = plan_rebuild(_rebuild_facts(snaps, "nightly", names=_names([(1, 0, 60)])))
    assert any("WAL is not all archived" in why for _w, why in report.skipped)
    # tablespace volumes: the map is not in the archive
    ts = Layout([*LAYOUT.volumes, Volume("vol-ts", "ts", VolumeRole.TABLESPACE, "/ts", 16400)])
    snaps_ts = (*snaps, Snapshot("cg-1-ts", "vol-ts", "20260101T050000000Z", AT, group_id="cg-1"))
    report = plan_rebuild(_rebuild_facts(snaps_ts, "nightly", layout=ts))
    assert any("tablespace map" in why for _w, why in report.skipped)
    # an existing record (or an unreadable one) is never overwritten
    existing = attrs.evolve(_backup(0, 20, BackupState.DONE, False), id="20260101T050000000Z")
    report = plan_rebuild(_rebuild_facts(snaps, "nightly", backups=[existing]))
    assert report.rebuilt == ()
    report = plan_rebuild(_rebuild_facts(snaps, "nightly", unreadable=("20260101T050000000Z",)))
    assert report.rebuilt == () and "cannot be read" in report.explain()
    # safety snapshots are never backups
    safety = _group("s-20260101T050000000Z", "cg-2", AT)
    assert plan_rebuild(_rebuild_facts(safety, "nightly")).rebuilt == ()


def test_a_file_labelled_for_another_backup_is_never_matched_by_time():
    other = (
        HISTORY_FILE.format(label="pgsnap 20260101T050000999Z")
        .replace("0/5000028", "0/5100028")
        .replace("0/5000100", "0/5100100")
    )
    facts = _rebuild_facts(
        (*_group("20260101T050000000Z", "cg-1", AT), *_group("20260101T050000999Z", "cg-2", AT)),
        "nightly",
    )
    second = RebuildSource(
        "000000010000000000000051.00000028.backup", other, parse_backup_file(other)
    )
    report = plan_rebuild(attrs.evolve(facts, sources=(*facts.sources, second)))
    got = {r.id: (r.label, r.start_lsn) for r in report.rebuilt}
    assert got == {
        "20260101T050000000Z": ("nightly", LSN(0x5000028)),  # by time: the only one left
        "20260101T050000999Z": ("pgsnap 20260101T050000999Z", LSN(0x5100028)),  # by label
    }, report.explain()


def test_a_rebuild_is_a_plan_that_never_overwrites_a_record(tmp_path):
    """Issue 20: the rebuild's records are written by the executor (one step each,
    journalled, under the lock), and a record the catalog has by then stays as it is."""
    import attrs

    import pgsnap
    from pgsnap.model import BackupState
    from pgsnap.planner.reconcile import RebuildReport, rebuild_plan
    from tests.property.test_expiry_properties import _backup
    from tests.unit.test_cli_unit import write_config

    a, b = (_backup(i, seg, BackupState.DONE, False) for i, seg in enumerate((5, 20)))
    plan = rebuild_plan(RebuildReport(rebuilt=(a, b)))
    assert plan.kind == "rebuild"
    assert [(s.action, s.id) for s in plan.steps] == [
        ("catalog.put_rebuilt_record", f"record-{a.id}"),
        ("catalog.put_rebuilt_record", f"record-{b.id}"),
    ]
    cluster = pgsnap.Cluster.from_config(write_config(tmp_path))
    mine = attrs.evolve(b, label="written meanwhile")
    cluster.catalog.put(mine)
    result = cluster.execute(pgsnap.Plan.from_json(plan.to_json()))
    assert result.outputs[f"record-{a.id}"] == {"written": True}
    assert result.outputs[f"record-{b.id}"]["written"] is False
    assert "recorded meanwhile" in result.outputs[f"record-{b.id}"]["why"]
    assert cluster.catalog.get(a.id) == a
    assert cluster.catalog.get(b.id).label == "written meanwhile"
