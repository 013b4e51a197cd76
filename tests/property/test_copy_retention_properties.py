"""Copy retention keeps its promises (issue 21 §2), on random catalogs and policies.

(a) no copy the policy's rules keep (redundancy, window, levels, computed here
    independently) is deleted, unless ``max_age`` removes it; no copy of a
    pinned backup is; a record whose manifest is missing, or of a backup that
    is not DONE, is left alone unless ``max_age`` removes it;
(b) never the only remaining copy of a backup whose snapshots are gone,
    unless every copy of it is older than ``max_age``;
(c) planning again on the result deletes nothing;
(d) snapshot expiry never orphans a copy: every copied DONE backup keeps its
    record, and still plans a recovery from its copy, to its consistency
    point and to the end of the WAL.
"""

from __future__ import annotations

import datetime as dt

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from pgsnap.model import BackupState, CopyRecord, Pin, RecoveryTarget
from pgsnap.planner.copy_expiry import CopyExpiryFacts, CopyRetentionPolicy, plan_copy_expiry
from pgsnap.planner.expiry import PERIODS, ExpiryFacts, RetentionPolicy, plan_expiry
from pgsnap.planner.recovery import RecoveryRequest, plan_recovery
from pgsnap.protocols import Capability
from pgsnap.wal import ArchiveIndex, TimelineGraph
from tests.property.test_expiry_properties import (
    END1,
    END2,
    FORK,
    HISTORY,
    MB,
    T0,
    _apply,
    _backup,
    _names,
    _recovery_facts,
    _snapshots,
)

HERE, ELSEWHERE = "/copies", "s3://elsewhere/pgsnap"
NOW = T0 + dt.timedelta(days=800)

catalogs = st.lists(
    st.tuples(
        st.integers(1, 790 * 24),  # hours after T0 the backup was taken
        st.sampled_from([BackupState.DONE] * 5 + [BackupState.FAILED]),
        st.booleans(),  # pinned
        st.booleans(),  # its snapshots are still on the storage
        st.lists(  # its copies: (here or elsewhere, its manifest present)
            st.tuples(st.booleans(), st.booleans() | st.just(True)), min_size=1, max_size=3
        ),
    ),
    min_size=1,
    max_size=14,
    unique_by=lambda t: t[0],
)


@st.composite
def copy_policies(draw):
    kwargs = {
        "redundancy": draw(st.none() | st.integers(1, 4)),
        "window": draw(st.none() | st.integers(1, 60).map(lambda d: dt.timedelta(days=d))),
        **{
            name: draw(st.integers(0, 3))
            for name in ("hourly", "daily", "weekly", "monthly", "yearly")
        },
    }
    age = draw(st.none() | st.integers(61, 900).map(lambda d: dt.timedelta(days=d)))
    return CopyRetentionPolicy(**kwargs, max_age=age)


def _catalog(drawn):
    backups, present = [], set()
    for i, (hours, state, pinned, has_snaps, copies) in enumerate(drawn):
        when = T0 + dt.timedelta(hours=hours)
        b = _backup(i, 5, state, False)
        b = attrs.evolve(
            b,
            start_time=when,
            stop_time=when + dt.timedelta(seconds=1),
            pin=Pin("audit") if pinned else None,
            copies=tuple(
                CopyRecord(f"{b.id}.{n}", HERE if here else ELSEWHERE, f"{n:064d}", when)
                for n, (here, _m) in enumerate(copies, 1)
            ),
        )
        backups.append(b)
        if has_snaps:
            present |= set(b.snapshots.values())
    manifests = {
        f"b{i:03d}.{n}"
        for i, (*_x, copies) in enumerate(drawn)
        for n, (here, found) in enumerate(copies, 1)
        if here and found
    }
    return backups, frozenset(present), frozenset(manifests)


def _rule_kept(entries, policy, now):
    """An independent reading of the rules: the copy ids they keep."""
    order = sorted(entries, key=lambda e: (e[1], e[2].created_at, e[2].copy_id), reverse=True)
    kept = set()
    if policy.redundancy is not None:
        kept |= {c.copy_id for _b, _w, c in order[: policy.redundancy]}
    if policy.window is not None:
        old = [e for e in order if e[1] <= now - policy.window]
        if not old:
            kept |= {c.copy_id for _b, _w, c in order}
        else:
            kept |= {c.copy_id for _b, w, c in order if w >= old[0][1]}
    for name, unit in (("hourly", "hour"), ("daily", "day"), ("weekly", "week")):
        _levels(order, getattr(policy, name), PERIODS[unit], kept)
    _levels(order, policy.monthly, PERIODS["month"], kept)
    _levels(order, policy.yearly, PERIODS["year"], kept)
    return kept


def _levels(order, count, key, kept):
    newest: dict[tuple[int, ...], str] = {}
    for _b, w, c in order:
        newest.setdefault(key(w), c.copy_id)
    for period in sorted(newest, reverse=True)[:count]:
        kept.add(newest[period])


def _applied(facts, plan):
    gone = {s.params["copy_id"] for s in plan.steps if s.action == "catalog.forget_copy"}
    unmanifested = {s.params["copy_id"] for s in plan.steps if s.action == "copy.expire_manifest"}
    backups = tuple(
        attrs.evolve(b, copies=tuple(c for c in b.copies if c.copy_id not in gone))
        for b in facts.backups
    )
    return gone, attrs.evolve(facts, backups=backups, manifests=facts.manifests - unmanifested)


@settings(max_examples=150, deadline=None)
@given(drawn=catalogs, policy=copy_policies())
def test_copy_retention_keeps_every_promise(drawn, policy):
    backups, present, manifests = _catalog(drawn)
    facts = CopyExpiryFacts(
        backups=tuple(backups), target=HERE, manifests=manifests, now=NOW, snapshots=present
    )
    plan = plan_copy_expiry(facts, policy)
    gone, after = _applied(facts, plan)

    def aged(when):
        return policy.max_age is not None and NOW - when > policy.max_age

    counted = [
        (b, b.stop_time, c)
        for b in backups
        for c in b.copies
        if c.target == HERE and c.copy_id in manifests and b.state is BackupState.DONE
    ]
    rules = (
        _rule_kept(counted, policy, NOW) if policy.has_rules else {e[2].copy_id for e in counted}
    )
    for b in backups:
        for c in b.copies:
            why = plan.explain()
            if c.target != HERE:
                assert c.copy_id not in gone, why
            elif b.pin is not None:
                assert c.copy_id not in gone, why  # (a) pinned
            elif c.copy_id in rules and not aged(b.stop_time):
                assert c.copy_id not in gone, (c.copy_id, why)  # (a) the rules keep it
            elif c.copy_id not in manifests or b.state is not BackupState.DONE:
                assert (c.copy_id in gone) == aged(b.stop_time), why  # (a) left alone
    # (b) the last way back to a backup whose snapshots are gone
    for b in backups:
        if b.state is not BackupState.DONE or all(s in present for s in b.snapshots.values()):
            continue
        alive = [c for c in b.copies if c.target != HERE or c.copy_id in manifests]
        if not alive:
            continue
        left = [c for c in alive if c.copy_id not in gone]
        if not left:
            assert aged(b.stop_time), (b.id, plan.explain())
    # (c) idempotent
    assert plan_copy_expiry(after, policy).steps == (), plan_copy_expiry(after, policy).explain()


histories = st.lists(
    st.tuples(
        st.integers(1, END2 - 2),  # segment the backup starts in
        st.sampled_from([BackupState.DONE] * 4 + [BackupState.FAILED]),
        st.booleans(),  # copied
        st.booleans(),  # its snapshots vanished already
    ),
    min_size=1,
    max_size=10,
    unique_by=lambda t: t[0],
)


@settings(max_examples=100, deadline=None)
@given(
    history=histories,
    redundancy=st.integers(1, 3),
    daily=st.integers(0, 2),
    now_hours=st.integers(END2, END2 + 60),
)
def test_snapshot_expiry_never_orphans_a_copy(history, redundancy, daily, now_hours):
    backups, vanished = [], set()
    for i, (seg, state, copied, gone) in enumerate(history):
        b = _backup(i, seg, state, False)
        if copied:
            made = b.stop_time or b.start_time
            b = attrs.evolve(b, copies=(CopyRecord(f"{b.id}.1", HERE, "0" * 64, made),))
        if gone:
            vanished.add(b.id)
        backups.append(b)
    facts = ExpiryFacts(
        backups=tuple(backups),
        snapshots=tuple(s for s in _snapshots(backups, set()) if s.id[:4] not in vanished),
        archive=ArchiveIndex.build(
            [*_names([(1, 0, END1), (2, FORK, END2)]), "00000002.history"], MB
        ),
        timelines=TimelineGraph.from_histories([HISTORY]),
        now=T0 + dt.timedelta(hours=now_hours),
        capabilities=frozenset(Capability),
    )
    plan = plan_expiry(facts, RetentionPolicy(redundancy=redundancy, daily=daily))
    after = _apply(facts, plan)
    records = {b.id: b for b in after.backups}
    rf = attrs.evolve(
        _recovery_facts(after),
        copies=frozenset((c.target, c.copy_id) for b in after.backups for c in b.copies),
    )
    for b in backups:
        if not b.copies:
            continue
        assert b.id in records, (b.id, plan.explain())  # (d) the record stays
        assert records[b.id].state is b.state, plan.explain()
        if b.state is not BackupState.DONE:
            continue
        for target in (RecoveryTarget.immediate(), RecoveryTarget.latest()):
            request = RecoveryRequest(target, backup_id=b.id, timeline="current", from_copy=True)
            plan_recovery(rf, request)  # raises if the WAL or the copy is not there
    # Planning again touches no copied backup (others whose snapshots vanished are
    # marked unusable then, as before).
    again = plan_expiry(after, RetentionPolicy(redundancy=redundancy, daily=daily))
    copied = {b.id for b in backups if b.copies}
    assert not [s for s in again.steps if s.params.get("backup_id") in copied], again.explain()
