"""Property tests of the recovery planner (hypothesis) over generated facts.

A scenario is 1 MB segments, a timeline tree (timeline 1 plus 0-3 forks at
increasing switchpoints, each history given as text and parsed), an archive
with runs of segments and random holes on each timeline (history files present
or not), maybe a surviving pg_wal with more segments, 1-5 backups (DONE or
FAILED, on some timeline, times increasing with LSN, snapshots present or
not) and a request with a target of every kind.

The oracle below restates the rules of docs/concepts.md independently of
``pgsnap.planner.recovery``; the tests compare the planner with it.
"""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pgsnap import errors
from pgsnap.model import (
    LSN,
    BackupRecord,
    BackupState,
    Layout,
    Location,
    Mount,
    RecoveryAction,
    RecoveryTarget,
    RestorePreparation,
    RestoreProfile,
    Snapshot,
    SnapshotPolicy,
    TargetKind,
    Volume,
    VolumeRole,
)
from pgsnap.plan import Plan
from pgsnap.planner.facts import RecoveryFacts, VolumeFacts, WalEvents
from pgsnap.planner.recovery import RecoveryRequest, choose_backup, plan_recovery
from pgsnap.protocols import Capability
from pgsnap.wal import (
    ArchiveIndex,
    TimelineGraph,
    check,
    history_file_name,
    parse_history,
    parse_segment_name,
    segment_name,
)

MB = 1 << 20
MAX_SEG = 40
T0 = dt.datetime(2026, 11, 30, 0, 0, tzinfo=dt.UTC)
RP_NAMES = ("rp0", "rp1", "rp2")

DATA = Volume("vol-data", "data", VolumeRole.DATA, "/pg/data")
WAL = Volume("vol-wal", "wal", VolumeRole.WAL, "/pg/wal")
TS = Volume("vol-ts", "ts", VolumeRole.TABLESPACE, "/pg/ts", tablespace_oid=16390)
ARCH = Volume("vol-arch", "archive", VolumeRole.ARCHIVE, "/archive")

PROPS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def time_of(lsn: LSN | int) -> dt.datetime:
    """Wall-clock time at which WAL position ``lsn`` was written (1 byte = 1 us)."""
    value = lsn.value if isinstance(lsn, LSN) else lsn
    return T0 + dt.timedelta(microseconds=value)


# ------------------------------------------------------------------------------- strategies


class Scenario:
    """Facts and a request; a plain class so failure reports print the short repr below."""

    def __init__(self, facts: RecoveryFacts, request: RecoveryRequest) -> None:
        self.facts, self.request = facts, request

    def __repr__(self) -> str:
        f = self.facts

        def ranges(idx: ArchiveIndex | None) -> object:
            return idx and [(r.timeline, r.first, r.last) for r in idx.segment_ranges]

        bs = "".join(
            f"\n    {x.id} {x.state.value} tl{x.start_timeline} {x.start_lsn}..{x.stop_lsn}"
            for x in f.backups
        )
        return (
            f"Scenario(\n  graph={f.timelines!r}\n  archive (tli, first, last)="
            f"{ranges(f.archive)} histories={list(f.archive.history_names)}\n"
            f"  archive+local={ranges(f.archive_with_local_wal)}\n"
            f"  layout={[v.id for v in f.layout.volumes]}\n  backups:{bs}\n"
            f"  snapshots={sorted(s.id for s in f.snapshots)}\n  events={f.events!r}\n"
            f"  now={f.now.isoformat()}\n  request={self.request!r}\n)"
        )


def _lsns(lo: int, hi: int) -> st.SearchStrategy[int]:
    """Byte positions in ``[lo, hi]``, often on or next to a segment boundary."""
    near_boundary = st.tuples(st.integers(lo // MB, hi // MB), st.sampled_from([0, 0x28, -1]))
    return st.one_of(
        st.integers(lo, hi),
        near_boundary.map(lambda t: min(hi, max(lo, t[0] * MB + t[1]))),
    )


@st.composite
def timeline_trees(draw):
    """(graph, begin LSN of each timeline): 1 plus 0-3 forks at increasing switchpoints."""
    n = draw(st.integers(0, 3))
    sps = sorted(draw(st.lists(_lsns(2 * MB, 30 * MB), min_size=n, max_size=n, unique=True)))
    entries: dict[int, list[tuple[int, LSN]]] = {1: []}
    begins = {1: LSN(0)}
    histories = []
    for i, sp in enumerate(sps):
        child = i + 2
        parent = draw(st.integers(1, child - 1))
        entries[child] = [*entries[parent], (parent, LSN(sp))]
        begins[child] = LSN(sp)
        text = "".join(f"{p}\t{s}\tbefore {time_of(s).isoformat()}\n\n" for p, s in entries[child])
        histories.append(parse_history(text, child))
    return TimelineGraph.from_histories(draw(st.permutations(histories))), begins


@st.composite
def segment_sets(draw, tli: int, lo: int, forks: tuple[int, ...]):
    """A run of segments from ``lo`` with a few holes (runs of 1-6 segments), maybe empty.

    ``forks`` are the segments where children branch off: the run may end a
    little before one (the archiver was behind when the standby was promoted).
    """
    hi = MAX_SEG + 5 - draw(st.integers(0, MAX_SEG + 6 - lo))  # small draws: long runs
    if forks and draw(st.integers(0, 2)) == 2:
        hi = max(lo - 1, draw(st.sampled_from(forks)) - draw(st.integers(0, 3)))
    holes: set[int] = set()
    if draw(st.integers(0, 2)) == 2:
        for _ in range(draw(st.integers(1, 2))):
            first = draw(st.integers(lo, max(lo, hi)))
            holes.update(range(first, first + draw(st.integers(1, 6))))
    return [segment_name(tli, s, MB) for s in range(lo, hi + 1) if s not in holes]


@st.composite
def backups(draw, bid: str, graph: TimelineGraph, begins: dict[int, LSN], layout: Layout):
    if draw(st.booleans()):  # anywhere on some timeline (maybe one that forked off)
        tli = draw(st.sampled_from(graph.timelines()))
        start = draw(_lsns(max(begins[tli].value, MB), 38 * MB))
    else:  # on the history of the latest timeline
        start = draw(_lsns(MB, 38 * MB))
        tli = graph.timeline_at(LSN(start), graph.latest())
    stop = start + draw(st.integers(1, 3 * MB))
    state = draw(st.sampled_from([BackupState.DONE, BackupState.DONE, BackupState.FAILED]))
    return BackupRecord(
        id=bid, label=bid, state=state, system_identifier="1", server_version=150018,
        wal_segment_size=MB, layout=layout, start_lsn=LSN(start), start_timeline=tli,
        start_time=time_of(start), stop_lsn=LSN(stop), stop_timeline=tli,
        stop_time=time_of(stop), labelfile=f"LABEL: {bid}\n", spcmapfile="",
        snapshots={v.id: f"{bid}-{v.id}" for v in layout.snapshotted},
    )  # fmt: skip


@st.composite
def wal_events(draw):
    commits = sorted(draw(st.lists(_lsns(MB, 45 * MB), max_size=6, unique=True)))
    rps = sorted(
        draw(st.lists(st.tuples(_lsns(MB, 45 * MB), st.sampled_from(RP_NAMES)), max_size=3))
    )
    return WalEvents(
        commits=tuple((LSN(c), time_of(c), 700 + i) for i, c in enumerate(commits)),
        restore_points=tuple((LSN(v), n) for v, n in rps),
        scanned_from=draw(st.none() | st.just(LSN(MB))),
        scanned_to=draw(st.none() | _lsns(MB, 48 * MB).map(LSN)),
        complete=draw(st.booleans()),
        end_of_wal=draw(st.none() | st.none() | _lsns(MB, 48 * MB).map(LSN)),
    )


@st.composite
def targets(draw, recs: list[BackupRecord], events: WalEvents | None):
    kind = draw(st.sampled_from([TargetKind.LSN, TargetKind.TIME, *TargetKind]))
    stops = [b.stop_lsn.value for b in recs if b.stop_lsn is not None]
    near_stop = st.tuples(
        st.sampled_from(stops), st.integers(2, 8 * MB) | st.sampled_from([1, 0, -1])
    ).map(sum)
    if kind is TargetKind.LATEST:
        return RecoveryTarget.latest()
    if kind is TargetKind.IMMEDIATE:
        return RecoveryTarget.immediate()
    if kind is TargetKind.TIME:
        v = draw(st.one_of(near_stop, near_stop, _lsns(0, 50 * MB)))
        return RecoveryTarget.time(time_of(v), inclusive=draw(st.booleans()))
    if kind is TargetKind.LSN:
        v = draw(st.one_of(near_stop, near_stop, _lsns(0, 50 * MB)))
        return RecoveryTarget.lsn(LSN(v), inclusive=draw(st.booleans()))
    if kind is TargetKind.NAME:
        return RecoveryTarget.name(draw(st.sampled_from([*RP_NAMES, "nope"])))
    xids = [c[2] for c in events.commits] if events is not None else []
    return RecoveryTarget.xid(draw(st.sampled_from([*xids, 999_999])))


@st.composite
def volume_facts(draw, layout: Layout):
    """How each volume is reached and restored: a directory, or a block device whose
    restore needs nothing, an unmount or a detach, may consume the snapshot or complete
    later, and may or may not be mounted now."""
    out = []
    for v in layout.snapshotted:
        if draw(st.booleans()):
            out.append(
                VolumeFacts(
                    v.id, Location.directory(v.mount_point), RestoreProfile(), v.mount_point
                )
            )
            continue
        profile = RestoreProfile(
            before=draw(st.sampled_from(list(RestorePreparation))),
            consumes_snapshot=draw(st.booleans()),
            completes_later=draw(st.booleans()),
        )
        device = f"/dev/disk/by-id/{v.id}"
        mount = Mount(device, v.mount_point, "xfs", ("rw",)) if draw(st.booleans()) else None
        out.append(VolumeFacts(v.id, Location.device(device), profile, device, mount))
    return tuple(out)


@st.composite
def scenarios(draw):
    graph, begins = draw(timeline_trees())
    layout = Layout(
        [DATA]
        + ([WAL] if draw(st.booleans()) else [])
        + ([TS] if draw(st.booleans()) else [])
        + [ARCH]
    )
    names: list[str] = []
    for tli in graph.timelines():
        forks = tuple(begins[c].value // MB for c in graph.children_of(tli))
        names += draw(segment_sets(tli, 1 if tli == 1 else begins[tli].value // MB, forks))
        if tli != 1 and draw(st.integers(0, 9)) < 9:  # small draws: present
            names.append(history_file_name(tli))
    names = draw(st.permutations(names))
    archive = ArchiveIndex.build(names, MB)
    local = None
    if layout.wal is not None and draw(st.booleans()):
        tli = draw(st.sampled_from(graph.timelines()))
        lo = draw(st.integers(max(1, begins[tli].value // MB), MAX_SEG + 5))
        extra = [segment_name(tli, s, MB) for s in range(lo, draw(st.integers(lo, 50)) + 1)]
        local = ArchiveIndex.build([*names, *extra], MB)

    n = draw(st.integers(1, 5))
    recs = [draw(backups(f"b{i}", graph, begins, layout)) for i in range(n)]
    gone = draw(
        st.just(())
        | st.lists(st.sampled_from([s for b in recs for s in b.snapshots.values()]), max_size=3)
    )
    existing = [
        Snapshot(s, v, s, T0) for b in recs for v, s in b.snapshots.items() if s not in gone
    ]
    events = draw(st.none() | wal_events())
    target = draw(targets(recs, events))
    if draw(st.integers(0, 9)) == 9:
        now = time_of(draw(_lsns(MB, 45 * MB)))
    else:
        now = T0 + dt.timedelta(days=1)
    policies: tuple[SnapshotPolicy, ...] = ()
    if draw(st.booleans()):
        policies = (SnapshotPolicy("pol-1", "hourly", ("vol-data",), paused=draw(st.booleans())),)
    facts = RecoveryFacts(
        layout=layout, backups=tuple(recs), snapshots=tuple(existing), policies=policies,
        capabilities=frozenset(Capability), archive=archive, timelines=graph,
        archive_location="/archive", now=now, archive_with_local_wal=local,
        events=events, host="db1", volume_facts=draw(volume_facts(layout)),
    )  # fmt: skip
    timeline = draw(
        st.sampled_from(
            ["latest"] * 4 + ["current"] * 2 + [str(t) for t in graph.timelines()] + ["9"]
        )
    )
    lost = draw(st.sampled_from([{VolumeRole.DATA}, {VolumeRole.DATA, VolumeRole.WAL}]))
    backup_id = draw(st.none() | st.none() | st.none() | st.sampled_from([b.id for b in recs]))
    request = RecoveryRequest(
        target=target, timeline=timeline, lost=lost, backup_id=backup_id,
        action=draw(st.sampled_from(list(RecoveryAction))),
        safety_snapshot=draw(st.booleans()),
    )  # fmt: skip
    return Scenario(facts, request)


def fork_gap(target: RecoveryTarget) -> Scenario:
    """Found by the properties: timeline 2 forks from 1 at segment 10; the archive holds
    1..7 on timeline 1 (8 and 9 never arrived) and 10..20 on timeline 2; backup b0 is at
    segments 2-3 on timeline 1. Replay stops at the hole 8-9: a gap, not the end of the WAL."""
    layout = Layout([DATA, ARCH])
    h2 = parse_history(f"1\t{LSN(10 * MB)}\tno recovery target specified\n", 2)
    names = [segment_name(1, s, MB) for s in range(1, 8)]
    names += [segment_name(2, s, MB) for s in range(10, 21)] + [history_file_name(2)]
    b0 = BackupRecord(
        id="b0", label="b0", state=BackupState.DONE, system_identifier="1",
        server_version=150018, wal_segment_size=MB, layout=layout, start_lsn=LSN(2 * MB + 0x28),
        start_timeline=1, start_time=time_of(2 * MB + 0x28), stop_lsn=LSN(3 * MB + 0x100),
        stop_timeline=1, stop_time=time_of(3 * MB + 0x100), labelfile="LABEL: b0\n",
        snapshots={"vol-data": "b0-d"},
    )  # fmt: skip
    facts = RecoveryFacts(
        layout=layout, backups=(b0,), snapshots=(Snapshot("b0-d", "vol-data", "b0-d", T0),),
        policies=(), capabilities=frozenset(Capability), archive=ArchiveIndex.build(names, MB),
        timelines=TimelineGraph.from_histories([h2]), archive_location="/archive",
        now=T0 + dt.timedelta(days=1), host="db1",
        volume_facts=(VolumeFacts("vol-data", Location.directory("/pg/data"), RestoreProfile(),
                                  "/pg/data"),),
    )  # fmt: skip
    return Scenario(facts, RecoveryRequest(target))


# ------------------------------------------------------------------------------- oracle


def run(sc: Scenario) -> Plan | errors.PlanningError:
    """The plan, or the PlanningError (anything else is a bug and propagates)."""
    try:
        return plan_recovery(sc.facts, sc.request)
    except errors.PlanningError as exc:
        return exc


def keep_wal(sc: Scenario) -> bool:
    return VolumeRole.WAL not in sc.request.lost and sc.facts.layout.wal is not None


def used_index(sc: Scenario) -> ArchiveIndex:
    """The archive, plus the surviving pg_wal when the WAL volume is kept."""
    if keep_wal(sc) and sc.facts.archive_with_local_wal is not None:
        return sc.facts.archive_with_local_wal
    return sc.facts.archive


def restore_volumes(sc: Scenario) -> set[str]:
    layout = sc.facts.layout
    ids = {layout.data.id} | {v.id for v in layout.by_role(VolumeRole.TABLESPACE)}
    if VolumeRole.WAL in sc.request.lost and layout.wal is not None:
        ids.add(layout.wal.id)
    return ids


def target_timeline(sc: Scenario, b: BackupRecord) -> int:
    t = sc.request.timeline
    if t == "latest":
        return sc.facts.timelines.latest()
    if t == "current":
        return b.start_timeline
    return int(t)


def on_history(sc: Scenario, b: BackupRecord) -> bool:
    """The backup's WAL, start to the last byte before its stop LSN, is on the target
    timeline's history: a timeline that forks exactly at the stop LSN holds all of it
    (PostgreSQL allows a switchpoint not before minRecoveryPoint)."""
    g, tli = sc.facts.timelines, target_timeline(sc, b)
    assert b.stop_lsn is not None
    last_byte = LSN(max(b.stop_lsn.value - 1, b.start_lsn.value))
    return (
        tli in g
        and g.contains(b.start_timeline, b.start_lsn, tli)
        and g.contains(b.stop_timeline or b.start_timeline, last_byte, tli)
    )


def snapshots_exist(sc: Scenario, b: BackupRecord) -> bool:
    present = {s.id for s in sc.facts.snapshots}
    return all(b.snapshots.get(v) in present for v in restore_volumes(sc))


def located_lsn(sc: Scenario) -> LSN | None:
    """Where a name/xid target is, from the WAL scan (None: not located)."""
    t, ev = sc.request.target, sc.facts.events
    if ev is None:
        return None
    if t.kind is TargetKind.NAME:
        return next((lsn for lsn, n in ev.restore_points if n == t.value), None)
    if t.kind is TargetKind.XID:
        return next((lsn for lsn, _w, x in ev.commits if x == t.value), None)
    return None


def before_target(sc: Scenario, b: BackupRecord) -> bool:
    t = sc.request.target
    assert b.stop_lsn is not None and b.stop_time is not None
    if t.kind is TargetKind.TIME:
        assert isinstance(t.value, dt.datetime)
        return b.stop_time < t.value
    if t.kind is TargetKind.LSN:
        assert isinstance(t.value, LSN)
        return b.stop_lsn < t.value
    if t.kind in (TargetKind.NAME, TargetKind.XID):
        where = located_lsn(sc)
        return where is None or b.stop_lsn < where
    return True


def eligible(sc: Scenario, b: BackupRecord) -> bool:
    return (
        b.state is BackupState.DONE
        and (sc.request.backup_id is None or b.id == sc.request.backup_id)
        and on_history(sc, b)
        and snapshots_exist(sc, b)
        and before_target(sc, b)
    )


def chosen(sc: Scenario, plan: Plan) -> BackupRecord:
    bid = plan.step("write-label").params["backup_id"]
    [b] = [x for x in sc.facts.backups if x.id == bid]
    return b


def segno(name: str) -> tuple[int, int]:
    return parse_segment_name(name, MB)


def present_after_on_path(
    index: ArchiveIndex, graph: TimelineGraph, b: BackupRecord, tli: int, after: int
) -> list[str]:
    """Segments present after segment number ``after`` in replay order from ``b`` to ``tli``.

    Replay reads segment ``s`` from the timeline whose span on the path holds it
    (the child's copy for a switchpoint's segment), so the path partitions the
    segment numbers.
    """
    start_seg = b.start_lsn.value // MB
    out = []
    for span in graph.path(tli, from_timeline=b.start_timeline):
        lo = start_seg if span.start is None else max(start_seg, span.start.value // MB)
        hi = MAX_SEG + 60 if span.end is None else span.end.value // MB - 1
        for s in range(max(lo, after + 1), hi + 1):
            if index.has_segment(span.timeline, s):
                out.append(segment_name(span.timeline, s, MB))
    return out


# ------------------------------------------------------------------------------- properties


@PROPS
@given(scenarios())
def test_plans_are_deterministic_and_round_trip(sc: Scenario) -> None:
    a, b = run(sc), run(sc)
    if isinstance(a, Plan):
        assert a == b
        assert Plan.from_json(a.to_json()) == a
        assert Plan.from_json(a.to_json(indent=None)).fingerprint == a.fingerprint
    else:
        assert type(a) is type(b)
        assert str(a) == str(b)
        assert a.details == b.details


@PROPS
@given(scenarios())
def test_the_chosen_backup_is_sound(sc: Scenario) -> None:
    plan = run(sc)
    if not isinstance(plan, Plan):
        return
    b = chosen(sc, plan)
    tli = target_timeline(sc, b)
    assert b.state is BackupState.DONE
    if sc.request.backup_id is not None:
        assert b.id == sc.request.backup_id
    assert snapshots_exist(sc, b), "a snapshot of the chosen backup is gone"
    g = sc.facts.timelines
    assert g.contains(b.start_timeline, b.start_lsn, tli), "backup start is off the history"
    assert b.stop_lsn is not None
    # The backup's WAL ends just before its stop LSN: a timeline forking exactly there
    # holds all of it (PostgreSQL checks switchpoint >= minRecoveryPoint; issue 19).
    last_byte = LSN(max(b.stop_lsn.value - 1, b.start_lsn.value))
    assert g.contains(b.stop_timeline or b.start_timeline, last_byte, tli)
    assert before_target(sc, b), "backup is not consistent before the target"
    assert plan.summary["target timeline"].split()[0] == str(tli)
    # each restore step uses this backup's snapshot of that volume, and it exists
    present = {s.id for s in sc.facts.snapshots}
    for step in plan.steps:
        if step.id.startswith("restore-"):
            assert step.params["snapshot_id"] == b.snapshots[step.params["volume_id"]]
            assert step.params["snapshot_id"] in present


@PROPS
@given(scenarios())
def test_the_chosen_backup_is_the_newest_that_qualifies(sc: Scenario) -> None:
    plan = run(sc)
    if not isinstance(plan, Plan):
        return
    b = chosen(sc, plan)
    assert b.stop_time is not None
    newer = [
        o.id for o in sc.facts.backups
        if eligible(sc, o) and o.stop_time is not None and o.stop_time > b.stop_time
    ]  # fmt: skip
    assert not newer, f"chose {b.id}, but {newer} qualify and are newer"


@PROPS
@given(scenarios())
@example(fork_gap(RecoveryTarget.lsn(LSN(5 * MB))))
def test_wal_of_a_plan_is_complete_and_gaps_are_real(sc: Scenario) -> None:
    result = run(sc)
    index, graph, target = used_index(sc), sc.facts.timelines, sc.request.target
    if isinstance(result, Plan):
        b = chosen(sc, result)
        tli = target_timeline(sc, b)
        start = (b.start_timeline, b.start_lsn)
        assert b.stop_lsn is not None
        # the backup's own WAL is there, whatever the target
        assert check(index, start, b.stop_lsn, tli, graph).complete
        if target.kind is TargetKind.LSN:
            assert isinstance(target.value, LSN)
            assert check(index, start, target.value + 1, tli, graph).complete
        located = located_lsn(sc)
        if located is not None:  # a name/xid the WAL scan found
            assert check(index, start, located + 1, tli, graph).complete
        if target.kind is TargetKind.LATEST:
            assert check(index, start, None, tli, graph).complete
    elif isinstance(result, errors.WalGapError):
        b, tli, _ = choose_backup(sc.facts, sc.request)
        assert eligible(sc, b)
        assert tli == target_timeline(sc, b)
        for name in result.missing:
            t, s = segno(name)
            assert not index.has_segment(t, s), f"{name} is reported missing but is present"
        if result.missing:
            t, s = segno(result.missing[0])
            floor = b.start_lsn.value // MB
            if target.kind in (TargetKind.XID, TargetKind.NAME) and located_lsn(sc) is None:
                # Found nowhere in the WAL read: the hole may be in the stretch of any
                # backup that could serve the target, the oldest included.
                floor = min(c.start_lsn.value // MB for c in sc.facts.backups if eligible(sc, c))
            assert s >= floor, "a gap before every usable backup's start refused it"
            if target.kind is TargetKind.LSN:
                assert isinstance(target.value, LSN)
                assert s <= target.value.value // MB, "a gap after the target refused it"


@PROPS
@given(scenarios())
@example(fork_gap(RecoveryTarget.latest()))
@example(fork_gap(RecoveryTarget.lsn(LSN(15 * MB))))
def test_out_of_range_means_the_wal_really_ends(sc: Scenario) -> None:
    """'past the end of the archived WAL' only when nothing follows the first missing one."""
    result = run(sc)
    if not isinstance(result, errors.TargetOutOfRange) or "missing" not in result.details:
        return
    b, tli, _ = choose_backup(sc.facts, sc.request)
    [first, *_] = result.details["missing"]
    later = present_after_on_path(used_index(sc), sc.facts.timelines, b, tli, segno(first)[1])
    assert not later, (
        f"refused as out of range (archive ends) at {first}, but {later} follow: it is a gap"
    )


@PROPS
@given(scenarios())
def test_refusal_means_no_backup_qualifies(sc: Scenario) -> None:
    result = run(sc)
    if not isinstance(result, errors.NoBackupForTarget):
        return
    ok = [b.id for b in sc.facts.backups if eligible(sc, b)]
    assert not ok, f"refused, but {ok} qualify"


@PROPS
@given(scenarios())
def test_steps_restore_exactly_the_lost_volumes_in_order(sc: Scenario) -> None:
    plan = run(sc)
    if not isinstance(plan, Plan):
        return
    ids = [s.id for s in plan.steps]
    assert len(ids) == len(set(ids))
    restores = [s for s in plan.steps if s.id.startswith("restore-")]
    assert {s.params["volume_id"] for s in restores} == restore_volumes(sc)
    assert all(s.action == "storage.restore_volume" for s in restores)
    assert len(restores) == len(restore_volumes(sc))
    assert (f"restore-{WAL.id}" in ids) == (
        VolumeRole.WAL in sc.request.lost and sc.facts.layout.wal is not None
    )
    stop = ids.index("stop-server")
    assert all(stop < ids.index(s.id) for s in restores)
    assert ids.index("write-label") < ids.index("start-server")
    assert all(ids.index(s.id) < ids.index("start-server") for s in restores)
    assert plan.step("prepare-datadir").params["clear_wal"] is (not keep_wal(sc))


@PROPS
@given(scenarios())
def test_each_restore_follows_its_volume_profile(sc: Scenario) -> None:
    plan = run(sc)
    if not isinstance(plan, Plan):
        return
    ids = [s.id for s in plan.steps]
    start = ids.index("start-server")
    assert plan.point_of_no_return == "start-server"
    for vid in restore_volumes(sc):
        vf = sc.facts.volume(vid)
        prof = vf.profile
        expected = (
            (["unmount"] if prof.unmounts and vf.mount is not None else [])
            + (["detach"] if prof.detaches else [])
            + ["restore"]
            + (["wait-restore"] if prof.completes_later else [])
            + (["attach"] if prof.detaches else [])
            + (
                ["wait-device"]
                if prof.unmounts and vf.location.kind.value == "block_device"
                else []
            )
            + (["mount"] if prof.unmounts else [])
        )
        mine = [i for i in ids if i.endswith(f"-{vid}")]
        assert mine == [f"{e}-{vid}" for e in expected]
        assert all(ids.index(i) < start for i in mine)
        consumed = any(f"backup {chosen(sc, plan).id} itself" in x and vid in x for x in plan.lost)
        assert consumed is prof.consumes_snapshot


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__, "-q", "--hypothesis-show-statistics"])
