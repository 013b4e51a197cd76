"""pgsnap.wal.contents: answers from the index equal a full read's, and each segment is read once.

WAL is synthetic (:class:`tests.unit.test_walreader.WalWriter` lays it out as
PostgreSQL does); the reader itself is tested there and against real servers.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from pathlib import Path

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgsnap.errors import InputError
from pgsnap.model import LSN, RecoveryTarget
from pgsnap.planner.facts import WalEvents
from pgsnap.wal import TimelineSpan, segment_name
from pgsnap.wal.contents import SegmentSummary, WalIndex, WalQuery, read_events
from pgsnap.wal.reader import scan_events

from .test_walreader import MB, SYSID, T0, WalWriter

ONE = [TimelineSpan(1, None, None)]
SID = str(SYSID)


def workload(
    directory: Path, n: int = 80, filler: int = 200_000
) -> tuple[WalWriter, list[tuple[int, dt.datetime, tuple[int, int]]]]:
    """Commits one every ~200 kB (so over several 1 MB segments), a restore point
    every tenth; returns the writer and [(xid, time, (start, end))]."""
    w = WalWriter()
    done = []
    for i in range(n):
        when = T0 + dt.timedelta(seconds=i)
        done.append((100 + i, when, w.commit(100 + i, when)))
        if i % 10 == 5:
            w.restore_point(f"rp{i}")
        w.filler(filler)
    w.write(directory)
    return w, done


def read(
    archive: Path,
    hi: int,
    *,
    index: WalIndex | None,
    query: WalQuery | None = None,
    lo: int = MB,
    **kw,
):
    return read_events(
        [str(archive)],
        ONE,
        LSN(lo),
        LSN(hi),
        segment_size=MB,
        system_identifier=SID,
        query=query,
        index=index,
        **kw,
    )


def full(archive: Path, hi: int, lo: int = MB) -> WalEvents:
    return scan_events([str(archive)], ONE, LSN(lo), LSN(hi), segment_size=MB)


def answers(ev: WalEvents, query: WalQuery, names: list[str], boundaries: list[LSN]):
    """What the planner asks of the events."""
    return {
        "xid": None if query.xid is None else ev.commit_of(query.xid),
        "after": None if query.time is None else ev.first_commit_after(query.time),
        "before": [ev.last_commit(before=x) for x in (*query.lsns, *boundaries)],
        "last": ev.last_commit(),
        "points": [ev.restore_point(n) for n in names],
        "complete": ev.complete,
        "to": ev.scanned_to,
        "eow": ev.end_of_wal,
    }


def test_a_second_read_takes_the_index_and_answers_the_same(tmp_path: Path) -> None:
    w, done = workload(tmp_path / "a")
    hi = (w.pos // MB + 1) * MB
    segments = hi // MB - 1
    idx = WalIndex(tmp_path / "idx")
    q = WalQuery.for_target(RecoveryTarget.xid(120))
    cold = read(tmp_path / "a", hi, index=idx, query=q)
    assert cold.read >= segments and cold.indexed == 0
    # not the last few: the WAL ends there, and the reader checks its tail again
    assert 0 < cold.added < segments
    warm = read(tmp_path / "a", hi, index=idx, query=q)
    assert warm.indexed == cold.added
    # the rest, and the one holding xid 120's commit (read in full for it)
    assert warm.read <= segments - cold.added + 2, warm
    ref = full(tmp_path / "a", hi)
    names = [f"rp{i}" for i in range(5, 80, 10)]
    bounds = [LSN(s * MB) for s in range(1, hi // MB + 1)]
    assert answers(warm.events, q, names, bounds) == answers(ref, q, names, bounds)
    assert warm.events.commit_of(120) == LSN(done[20][2][0])
    # only the commits the questions need are kept, not every commit
    assert len(warm.events.commits) < len(ref.commits)


def test_time_and_lsn_questions(tmp_path: Path) -> None:
    w, done = workload(tmp_path / "a")
    hi = (w.pos // MB + 1) * MB
    idx = WalIndex(tmp_path / "idx")
    read(tmp_path / "a", hi, index=idx)
    ref = full(tmp_path / "a", hi)
    bounds = [LSN(s * MB) for s in range(1, hi // MB + 1)]
    for i in (0, 7, 23, 38, 78, 79):
        when = done[i][1] + dt.timedelta(milliseconds=500)
        inside = LSN(done[i][2][0] + 8)
        q = WalQuery(time=when, lsns=(inside,))
        got = read(tmp_path / "a", hi, index=idx, query=q)
        assert answers(got.events, q, [], bounds) == answers(ref, q, [], bounds), i


def test_a_mid_segment_start_and_end_are_read(tmp_path: Path) -> None:
    w, done = workload(tmp_path / "a")
    hi = (w.pos // MB + 1) * MB
    idx = WalIndex(tmp_path / "idx")
    read(tmp_path / "a", hi, index=idx)
    lo, end = done[3][2][0] + 1, done[30][2][1] - 1  # cut both commits
    got = read(tmp_path / "a", end, index=idx, lo=lo)
    ref = full(tmp_path / "a", end, lo=lo)
    assert got.events.commits[0] == ref.commits[0]
    assert got.events.last_commit() == ref.last_commit()
    assert got.events.scanned_to == ref.scanned_to == LSN(end)


def test_a_start_just_past_a_segments_header_cuts_nothing(tmp_path: Path) -> None:
    """A backup's start LSN is just past its segment's first page header
    (X/XX000028: pg_backup_start switches WAL first). No record begins before it in
    that segment, so the segment is taken from the index as a whole one, and a read
    from there indexes it: a plan from that backup reads it once, not every time."""
    w, _done = workload(tmp_path / "a")
    hi = (w.pos // MB + 1) * MB
    idx = WalIndex(tmp_path / "idx")
    start = 3 * MB + 0x28  # SizeOfXLogLongPHD
    cold = read(tmp_path / "a", hi, index=idx, lo=start)
    warm = read(tmp_path / "a", hi, index=idx, lo=start)
    at_boundary = read(tmp_path / "a", hi, index=idx, lo=3 * MB)
    assert cold.read > warm.read
    assert warm.read == at_boundary.read  # segment 3 and the next not read again
    assert warm.indexed == at_boundary.indexed
    for got in (cold, warm):
        ref = full(tmp_path / "a", hi, lo=start)
        bounds = [LSN(s * MB) for s in range(4, hi // MB + 1)]
        assert answers(got.events, WalQuery(), [], bounds) == answers(ref, WalQuery(), [], bounds)
        assert got.events.scanned_from == ref.scanned_from == LSN(start)
    # one byte further is a cut: the segment is read, as any mid-segment start
    later = read(tmp_path / "a", hi, index=idx, lo=start + 1)
    assert later.read > warm.read


def test_a_changed_file_is_read_again(tmp_path: Path) -> None:
    w, _done = workload(tmp_path / "a")
    hi = (w.pos // MB + 1) * MB
    idx = WalIndex(tmp_path / "idx")
    known = read(tmp_path / "a", hi, index=idx).added
    f = tmp_path / "a" / segment_name(1, 2, MB)
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    again = read(tmp_path / "a", hi, index=idx)
    assert again.indexed == known - 1  # every one but the changed one
    assert again.added == 1  # which is indexed anew
    assert read(tmp_path / "a", hi, index=idx).indexed == known


def test_a_damaged_index_is_reported_ignored_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w, _done = workload(tmp_path / "a")
    hi = (w.pos // MB + 1) * MB
    idx = WalIndex(tmp_path / "idx")
    ref = read(tmp_path / "a", hi, index=idx).events
    (shard,) = (tmp_path / "idx").glob("*/*.json")
    doc = json.loads(shard.read_text())
    name = sorted(doc["entries"])[1]
    doc["entries"][name]["commits"] += 1  # the checksum no longer matches
    shard.write_text(json.dumps(doc))
    caplog.set_level(logging.WARNING, logger="pgsnap.wal.contents")
    fresh = WalIndex(tmp_path / "idx")
    got = read(tmp_path / "a", hi, index=fresh)
    assert got.indexed == 0 and got.events == ref
    assert "checksum does not match" in caplog.text and str(shard) in caplog.text
    assert WalIndex(tmp_path / "idx").get(SID, MB, name) is not None  # rewritten whole
    for garbage in (b"", b"{not json", b'{"format": "other"}', b"[1, 2]"):
        shard.write_bytes(garbage)
        assert read(tmp_path / "a", hi, index=WalIndex(tmp_path / "idx")).events == ref


def test_another_cluster_or_segment_size_is_not_used(tmp_path: Path) -> None:
    idx = WalIndex(tmp_path / "idx")
    summary = SegmentSummary(segment_name(1, 2, MB), segment_name(1, 2, MB), MB, 1, commits=0)
    idx.put(SID, MB, [summary])
    assert WalIndex(tmp_path / "idx").get(SID, MB, summary.name) == summary
    assert WalIndex(tmp_path / "idx").get("42", MB, summary.name) is None
    assert WalIndex(tmp_path / "idx").get(SID, 2 * MB, summary.name) is None
    (shard,) = (tmp_path / "idx").glob("*/*.json")
    assert shard.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "idx" / f"{SID}-{MB}").stat().st_mode & 0o777 == 0o700


def test_a_budget_reads_the_newest_first(tmp_path: Path) -> None:
    w, _done = workload(tmp_path / "a")
    hi = (w.pos // MB + 1) * MB
    got = read(tmp_path / "a", hi, index=None, max_read=2)
    assert not got.events.complete
    assert got.events.spans[0][0] >= LSN(hi - 2 * MB)
    assert got.read <= 3
    with pytest.raises(InputError):
        read(tmp_path / "a", hi, index=None, max_read=-1)


def test_a_torn_tail_in_pg_wal_ends_where_a_full_read_ends(tmp_path: Path) -> None:
    """The archive holds segments 1..n-1; pg_wal holds the last, torn half-way."""
    w, done = workload(tmp_path / "all", n=60, filler=250_000)
    last = w.pos // MB
    (tmp_path / "arch").mkdir()
    (tmp_path / "pgwal").mkdir()
    for f in (tmp_path / "all").iterdir():
        segno = int(f.name[16:], 16)
        target = tmp_path / ("pgwal" if segno == last else "arch") / f.name
        data = bytearray(f.read_bytes())
        if segno == last:
            cut = done[-3][2][0] % MB + 100  # inside the third-last commit
            data[cut:] = bytes(len(data) - cut)
        target.write_bytes(bytes(data))
    dirs = [str(tmp_path / "arch"), str(tmp_path / "pgwal")]
    hi = (last + 1) * MB
    ref = scan_events(dirs, ONE, LSN(MB), LSN(hi), segment_size=MB)
    assert ref.end_of_wal is not None
    idx = WalIndex(tmp_path / "idx")
    for _ in range(2):
        got = read_events(
            dirs, ONE, LSN(MB), LSN(hi), segment_size=MB, system_identifier=SID, index=idx
        )
        assert got.events.end_of_wal == ref.end_of_wal
        assert got.events.last_commit() == ref.last_commit()
        assert got.events.complete
    assert got.indexed > 0
    # nothing from pg_wal is indexed
    assert all(
        not s.name.endswith(f"{last:08X}")
        for s in [idx.get(SID, MB, segment_name(1, last, MB))]
        if s
    )


def test_a_timeline_path_uses_the_child_file(tmp_path: Path) -> None:
    w1 = WalWriter()
    for i in range(8):
        w1.commit(i + 1, T0 + dt.timedelta(seconds=i))
        w1.filler(800_000)
    switch = w1.pos
    w2 = w1.fork(2)
    w2.end_of_recovery(2, 1)
    for i in range(8):
        w2.commit(50 + i, T0 + dt.timedelta(minutes=1, seconds=i))
        w2.filler(800_000)
    for i in range(8):
        w1.commit(90 + i, T0 + dt.timedelta(minutes=2, seconds=i))  # timeline 1 after the fork
        w1.filler(300_000)
    w1.write(tmp_path / "a")
    path = [TimelineSpan(1, None, LSN(switch)), TimelineSpan(2, LSN(switch), None)]
    hi = (w2.pos // MB + 1) * MB
    idx = WalIndex(tmp_path / "idx")
    q = WalQuery(xid=53, lsns=(LSN(switch),))
    for _ in range(2):
        got = read_events(
            [str(tmp_path / "a")],
            path,
            LSN(MB),
            LSN(hi),
            segment_size=MB,
            system_identifier=SID,
            index=idx,
            query=q,
        )
        ref = scan_events([str(tmp_path / "a")], path, LSN(MB), LSN(hi), segment_size=MB)
        assert got.events.commit_of(53) == ref.commit_of(53) is not None
        assert got.events.commit_of(93) is None  # timeline 1's, after the fork
        assert got.events.last_commit(before=LSN(switch)) == ref.last_commit(before=LSN(switch))
        assert got.events.last_commit() == ref.last_commit()
    assert got.indexed > 0
    # timeline 1 alone: its own files, its own answers
    one = read_events(
        [str(tmp_path / "a")],
        ONE,
        LSN(MB),
        LSN((w1.pos // MB + 1) * MB),
        segment_size=MB,
        system_identifier=SID,
        index=idx,
        query=WalQuery(xid=93),
    )
    assert one.events.commit_of(93) is not None and one.events.commit_of(53) is None


# --------------------------------------------------------------------------- property


@st.composite
def scenarios(draw: st.DrawFn):
    n = draw(st.integers(1, 30))
    return draw(
        st.lists(
            st.tuples(
                st.sampled_from(["commit", "abort", "rp", "filler", "big"]),
                st.integers(0, 10**6),
            ),
            min_size=n,
            max_size=n,
        )
    )


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=scenarios(), data=st.data())
def test_indexed_answers_equal_a_full_read(tmp_path_factory, ops, data) -> None:
    """Any workload, any earlier reads filling the index, any question: the planner's
    answers from read_events equal those from a full read."""
    root = tmp_path_factory.mktemp("wal")
    w = WalWriter()
    xids, times, names = [], [], []
    for i, (op, r) in enumerate(ops):
        when = T0 + dt.timedelta(seconds=r % 5000)  # times not in LSN order
        if op in ("commit", "abort"):
            w.commit(1000 + i, when, kind=op)
            xids.append(1000 + i)
            times.append(when)
        elif op == "rp":
            w.restore_point(f"p{r % 7}")
            names.append(f"p{r % 7}")
        elif op == "filler":
            w.filler(1000 + r % 400_000)
        else:
            w.filler(MB + r % MB)  # a record over more than a segment
    w.write(root / "a")
    hi = (w.pos // MB + 1) * MB
    idx = WalIndex(root / "idx")
    boundary = st.integers(1, hi // MB).map(lambda n: n * MB)
    for _ in range(data.draw(st.integers(0, 3))):  # earlier reads of random stretches
        if data.draw(st.booleans()):  # windows on segment boundaries, as the observer reads
            a = data.draw(st.integers(1, hi // MB - 1)) * MB
            b = data.draw(st.integers(a // MB + 1, hi // MB)) * MB
        else:  # anywhere, or just past a segment's first page header (a backup's start)
            seg_start = data.draw(st.integers(1, hi // MB - 1)) * MB
            a = data.draw(
                st.sampled_from(
                    [
                        data.draw(st.integers(MB, hi - 1)),
                        seg_start + data.draw(st.integers(0, 0x29)),
                    ]
                )
            )
            b = data.draw(st.integers(a + 1, hi))
        read(root / "a", b, index=idx, lo=a)
    past_header = data.draw(st.integers(1, hi // MB - 1)) * MB + data.draw(st.integers(0, 0x29))
    lo = data.draw(st.sampled_from([MB, data.draw(st.integers(MB, hi - 1)), past_header]))
    end = data.draw(
        st.sampled_from(
            [
                hi,
                data.draw(st.integers(lo + 1, hi)),
                max(lo + 1, data.draw(boundary)),
            ]
        )
    )
    q = WalQuery(
        xid=data.draw(st.sampled_from([None, *xids, 7])),
        time=data.draw(st.sampled_from([None, *times, T0 - dt.timedelta(1), T0 + dt.timedelta(1)])),
        lsns=tuple(LSN(x) for x in data.draw(st.lists(st.integers(lo, end), max_size=3))),
    )
    got = read(root / "a", end, index=idx, query=q, lo=lo).events
    ref = full(root / "a", end, lo=lo)
    bounds = [LSN(s * MB) for s in range(lo // MB + 1, end // MB + 1)]
    assert answers(got, q, sorted(set(names)), bounds) == answers(
        ref, q, sorted(set(names)), bounds
    )
    assert got.restore_points == ref.restore_points
    assert attrs.evolve(got, commits=()) == attrs.evolve(ref, commits=())


def test_segments_verified_whole_are_remembered_by_size_and_time(tmp_path):
    """Issue 19: planning verifies every archived segment a recovery may fetch; what it
    found whole is kept (name -> size, mtime), so a warm plan only stats each file."""
    from pgsnap.wal.contents import WalIndex

    index = WalIndex(tmp_path / "idx")
    assert index.verified("42", 1 << 20) == {}
    index.note_verified("42", 1 << 20, {"000000010000000000000003": (1 << 20, 123)})
    again = WalIndex(tmp_path / "idx")  # another process
    assert again.verified("42", 1 << 20) == {"000000010000000000000003": (1 << 20, 123)}
    assert again.verified("43", 1 << 20) == {}  # another cluster's are kept apart
    again.note_verified("42", 1 << 20, {"000000010000000000000004": (1 << 20, 124)})
    assert sorted(WalIndex(tmp_path / "idx").verified("42", 1 << 20)) == [
        "000000010000000000000003",
        "000000010000000000000004",
    ]
    # A damaged file is an empty one, rebuilt by the next write.
    path = tmp_path / "idx" / f"42-{1 << 20}" / "verified.json"
    path.write_text("{not json")
    assert WalIndex(tmp_path / "idx").verified("42", 1 << 20) == {}
