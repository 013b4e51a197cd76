"""Retention never breaks a recovery (issue 13), judged by the recovery planner itself.

Random histories: backups on timeline 1 and on a timeline 2 forked from it,
some FAILED, some pinned, some with a secure snapshot; random policies. The
expiry plan is applied to the facts (what its steps delete is removed), and:

(a) every kept DONE backup still plans a recovery to its consistency point
    and to the end of the WAL, and under a window policy the window's anchor
    is kept and plans a recovery to the end;
(b) nothing pinned (while the pin holds), secure or unfinished is deleted;
(c) planning again on the result deletes nothing.

Orphan snapshots (pgsnap's, named by no record) among them: (d) none that an
unfinished run's journal holds, secure, younger than ``orphans_after`` or
not provably pgsnap's (another tool's name, a storage policy's) is deleted;
every other one is.
"""

from __future__ import annotations

import datetime as dt

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from pgsnap import errors
from pgsnap.model import (
    LSN,
    BackupRecord,
    BackupState,
    Layout,
    Location,
    Pin,
    RecoveryTarget,
    RestoreProfile,
    Snapshot,
    Volume,
    VolumeRole,
)
from pgsnap.planner.expiry import ExpiryFacts, RetentionPolicy, plan_expiry
from pgsnap.planner.facts import RecoveryFacts, VolumeFacts
from pgsnap.planner.reconcile import SnapshotHold
from pgsnap.planner.recovery import RecoveryRequest, plan_recovery
from pgsnap.protocols import Capability
from pgsnap.wal import ArchiveIndex, TimelineGraph, parse_history, segment_name

MB = 1 << 20
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
LAYOUT = Layout(
    [
        Volume("vol-data", "data", VolumeRole.DATA, "/pg/data"),
        Volume("vol-wal", "wal", VolumeRole.WAL, "/pg/wal"),
    ]
)
FORK = 60  # timeline 2 begins in segment 60 of timeline 1
END1, END2 = 80, 140  # the last segment of timeline 1 and of timeline 2


def _backup(i: int, seg: int, state: BackupState, pinned: bool) -> BackupRecord:
    tli = 1 if seg <= FORK else 2  # timeline 2 begins inside segment FORK
    bid = f"b{i:03d}"
    when = T0 + dt.timedelta(hours=seg)
    return BackupRecord(
        id=bid,
        label=bid,
        state=state,
        system_identifier="1",
        server_version=150018,
        wal_segment_size=MB,
        layout=LAYOUT,
        start_lsn=LSN(seg * MB + 0x28),
        start_timeline=tli,
        start_time=when,
        stop_lsn=LSN(seg * MB + 0x100),
        stop_timeline=tli,
        stop_time=when + dt.timedelta(seconds=1),
        labelfile=f"LABEL: {bid}\n",
        spcmapfile="",
        snapshot_group_id=f"cg-{bid}",
        snapshots={"vol-data": f"{bid}-d", "vol-wal": f"{bid}-w"},
        failure_reason="x" if state is BackupState.FAILED else None,
        pin=Pin("kept for the auditors") if pinned else None,
    )


def _snapshots(backups, secure):
    return tuple(
        Snapshot(s, v, s, T0, group_id=b.snapshot_group_id, secure=b.id in secure)
        for b in backups
        for v, s in b.snapshots.items()
    )


HISTORY = parse_history(f"1\t0/{FORK * MB + 0x1000:X}\tno recovery target specified\n", 2)


def _names(ranges):
    return [segment_name(t, s, MB) for t, a, b in ranges for s in range(a, b + 1)]


histories = st.lists(
    st.tuples(
        st.integers(1, END2 - 2),  # segment the backup starts in
        st.sampled_from([BackupState.DONE] * 4 + [BackupState.FAILED, BackupState.STARTED]),
        st.booleans(),  # pinned
        st.booleans(),  # secure
    ),
    min_size=1,
    max_size=12,
    unique_by=lambda t: t[0],
)


@st.composite
def policies(draw):
    kwargs = {
        "redundancy": draw(st.none() | st.integers(1, 4)),
        "window": draw(st.none() | st.integers(1, 80).map(lambda h: dt.timedelta(hours=h))),
        "hourly": draw(st.integers(0, 3)),
        "daily": draw(st.integers(0, 3)),
    }
    if (
        kwargs["redundancy"] is None
        and kwargs["window"] is None
        and not (kwargs["hourly"] or kwargs["daily"])
    ):
        kwargs["redundancy"] = 1  # a policy that keeps nothing is refused (tested below)
    return RetentionPolicy(**kwargs)


def _apply(facts: ExpiryFacts, plan) -> ExpiryFacts:
    gone_groups, gone_ids = set(), set()
    ranges = [(r.timeline, r.first, r.last) for r in facts.archive.segment_ranges]
    names = set(_names(ranges)) | set(facts.archive.history_names)
    for step in plan.steps:
        if step.action == "storage.delete_snapshot_group":
            gone_groups.add(step.params["group_id"])
        elif step.action == "catalog.delete_backup":
            gone_ids.add(step.params["backup_id"])
        elif step.action == "archive.delete_wal":
            p = step.params
            names -= set(_names([(p["timeline"], p["first"], p["last"])]))
    return ExpiryFacts(
        backups=tuple(b for b in facts.backups if b.id not in gone_ids),
        snapshots=tuple(s for s in facts.snapshots if s.group_id not in gone_groups),
        archive=ArchiveIndex.build(sorted(names), MB),
        timelines=facts.timelines,
        now=facts.now,
        capabilities=facts.capabilities,
    )


def _recovery_facts(f: ExpiryFacts) -> RecoveryFacts:
    return RecoveryFacts(
        layout=LAYOUT,
        backups=f.backups,
        snapshots=f.snapshots,
        policies=(),
        capabilities=frozenset(Capability),
        archive=f.archive,
        timelines=f.timelines,
        archive_location="/archive",
        now=f.now,
        volume_facts=tuple(
            VolumeFacts(v.id, Location.directory(v.mount_point), RestoreProfile(), v.mount_point)
            for v in LAYOUT.snapshotted
        ),
    )


@settings(max_examples=120, deadline=None)
@given(history=histories, policy=policies(), now_hours=st.integers(END2, END2 + 100))
def test_expiry_keeps_every_promise(history, policy, now_hours):
    backups = tuple(
        _backup(i, seg, state, pinned) for i, (seg, state, pinned, _s) in enumerate(history)
    )
    secure = {b.id for b, (_seg, _st, _p, sec) in zip(backups, history, strict=True) if sec}
    names = [*_names([(1, 0, END1), (2, FORK, END2)]), "00000002.history"]
    facts = ExpiryFacts(
        backups=backups,
        snapshots=_snapshots(backups, secure),
        archive=ArchiveIndex.build(names, MB),
        timelines=TimelineGraph.from_histories([HISTORY]),
        now=T0 + dt.timedelta(hours=now_hours),
        capabilities=frozenset(Capability),
    )
    plan = plan_expiry(facts, policy)
    after = _apply(facts, plan)
    kept = {b.id for b in after.backups}

    # (b) nothing pinned, secure or unfinished goes
    for b in backups:
        if b.pin is not None or b.id in secure or b.state is BackupState.STARTED:
            assert b.id in kept, (b.id, plan.explain())
    # (a) every kept DONE backup still recovers, to its consistency point and to the end
    rf = _recovery_facts(after)
    for b in after.backups:
        if b.state is not BackupState.DONE:
            continue
        for target in (RecoveryTarget.immediate(), RecoveryTarget.latest()):
            try:
                plan_recovery(rf, RecoveryRequest(target, backup_id=b.id, timeline="current"))
            except errors.PlanningError as exc:
                raise AssertionError(f"{b.id} {target}: {exc}\n{plan.explain()}") from exc
    if policy.window is not None:
        start = facts.now - policy.window
        done = [b for b in backups if b.state is BackupState.DONE]
        anchors = [b for b in done if b.stop_time <= start]
        if anchors:
            anchor = max(anchors, key=lambda b: (b.stop_time, b.id))
            assert anchor.id in kept
    if policy.redundancy is not None:
        done = sorted(
            (b for b in backups if b.state is BackupState.DONE),
            key=lambda b: (b.stop_time, b.id),
        )
        assert {b.id for b in done[-policy.redundancy :]} <= kept
    # (c) idempotent
    again = plan_expiry(after, policy)
    assert again.steps == (), again.explain()


def test_an_empty_or_zero_policy_is_refused():
    import pytest

    with pytest.raises(errors.ConfigurationError, match="keeps nothing"):
        RetentionPolicy()
    with pytest.raises(errors.ConfigurationError, match="redundancy 0"):
        RetentionPolicy(redundancy=0)
    with pytest.raises(errors.ConfigurationError, match="window must be positive"):
        RetentionPolicy(window=dt.timedelta(0))


# --------------------------------------------------------------------------- orphans

orphan_groups = st.lists(
    st.tuples(
        st.integers(0, 200),  # hours old
        st.sampled_from(["backup", "safety", "foreign", "policy"]),
        st.sampled_from([None, "name", "group", "snapshot"]),  # what a journal holds of it
        st.booleans(),  # secure
    ),
    max_size=8,
)


@settings(max_examples=120, deadline=None)
@given(
    history=histories,
    groups=orphan_groups,
    after_hours=st.integers(1, 96),
    policy=policies(),
)
def test_orphans_a_journal_needs_are_never_deleted(history, groups, after_hours, policy):
    backups = tuple(
        _backup(i, seg, state, pinned) for i, (seg, state, pinned, _s) in enumerate(history)
    )
    now = T0 + dt.timedelta(hours=END2 + 300)
    snapshots = list(_snapshots(backups, set()))
    holds, protected, deletable = [], set(), set()
    for i, (hours, kind, held, secure) in enumerate(groups):
        stamp = f"20270101T00{i:02d}00000Z"
        name = {"backup": stamp, "safety": f"s-{stamp}"}.get(kind, f"admin-{i}")
        gid = f"cg-orphan-{i}"
        extra = {"policy_id": "p"} if kind == "policy" else {}
        members = [
            Snapshot(
                f"o{i}-{v}",
                v,
                name,
                now - dt.timedelta(hours=hours),
                group_id=gid,
                secure=secure,
                extra=extra,
            )
            for v in ("vol-data", "vol-wal")
        ]
        snapshots += members
        if held == "name":
            holds.append(SnapshotHold(f"plan {i}", group_names=frozenset({name})))
        elif held == "group":
            holds.append(SnapshotHold(f"plan {i}", group_ids=frozenset({gid})))
        elif held == "snapshot":
            holds.append(SnapshotHold(f"plan {i}", snapshot_ids=frozenset({members[1].id})))
        ids = {s.id for s in members}
        if kind in ("foreign", "policy") or held or secure or hours < after_hours:
            protected |= ids
        else:
            deletable |= ids
    facts = ExpiryFacts(
        backups=backups,
        snapshots=tuple(snapshots),
        archive=ArchiveIndex.build(_names([(1, 0, END1), (2, FORK, END2)]), MB),
        timelines=TimelineGraph.from_histories([HISTORY]),
        now=now,
        capabilities=frozenset(Capability),
        volume_ids=frozenset(v.id for v in LAYOUT.volumes),
        holds=tuple(holds),
    )
    policy = attrs.evolve(policy, orphans_after=dt.timedelta(hours=max(after_hours, 1)))
    plan = plan_expiry(facts, policy)
    after = _apply(facts, plan)
    gone = {s.id for s in facts.snapshots} - {s.id for s in after.snapshots}
    for step in plan.steps:  # orphan steps that delete snapshots one by one
        if step.action == "storage.delete_snapshots":
            gone |= set(step.params["snapshot_ids"])
    assert not gone & protected, plan.explain()
    assert deletable <= gone, plan.explain()
    named = {s for b in after.backups for s in b.snapshots.values()}
    assert named <= {s.id for s in after.snapshots}  # no kept backup lost a snapshot
    assert not [s for s in plan_expiry(after, policy).steps if s.id.startswith("delete-orphan")]
