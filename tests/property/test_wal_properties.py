"""Property tests of pgsnap.wal (hypothesis): names, index gaps, timeline trees, check."""

from __future__ import annotations

import itertools
import random

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pgsnap.model import LSN
from pgsnap.wal import (
    VALID_SEGMENT_SIZES,
    ArchiveIndex,
    TimelineGraph,
    WalFileKind,
    check,
    parse_archive_name,
    parse_history,
    parse_segment_name,
    segment_name,
    segment_number,
    segment_start,
    walfile_name,
)

U64 = (1 << 64) - 1
MB = 1024 * 1024

seg_sizes = st.sampled_from(VALID_SEGMENT_SIZES)
timelines = st.integers(1, 0xFFFFFFFF)


@st.composite
def size_and_segno(draw):
    segsz = draw(seg_sizes)
    segno = draw(st.integers(0, U64 // segsz))
    return segsz, segno


# ----------------------------------------------------------------------------- names


@given(size_and_segno(), timelines, st.booleans())
def test_name_round_trip(ss, tli, lower):
    segsz, segno = ss
    name = segment_name(tli, segno, segsz)
    assert len(name) == 24
    assert parse_segment_name(name.lower() if lower else name, segsz) == (tli, segno)
    entry = parse_archive_name(name)
    assert entry.kind is WalFileKind.SEGMENT
    assert entry.timeline == tli
    assert entry.segment_number(segsz) == segno
    assert walfile_name(segment_start(segno, segsz), tli, segsz) == name


@given(seg_sizes, st.integers(0, U64), timelines)
def test_lsn_lies_in_its_segment(segsz, value, tli):
    lsn = LSN(value)
    segno = segment_number(lsn, segsz)
    assert segment_start(segno, segsz) <= lsn
    assert lsn.value < (segno + 1) * segsz
    prev = walfile_name(lsn, tli, segsz, previous_at_boundary=True)
    if value % segsz:
        assert prev == walfile_name(lsn, tli, segsz)
    else:
        wrapped = ((value - 1) & U64) // segsz
        assert parse_segment_name(prev, segsz) == (tli, wrapped)


@given(st.text(max_size=40))
def test_parse_archive_name_never_raises(name):
    entry = parse_archive_name(name)
    assert entry.name == name
    if entry.kind is not WalFileKind.UNKNOWN:
        assert entry.timeline is not None
        assert entry.timeline >= 1


@given(
    st.text(alphabet="0123456789abcdefABCDEF.xyhistorybackupartialgzb2", min_size=0, max_size=48)
)
def test_parse_archive_name_near_misses(name):
    entry = parse_archive_name(name)
    if entry.kind is WalFileKind.UNKNOWN:
        return
    # base_name is the canonical PostgreSQL name of the same file
    again = parse_archive_name(entry.base_name)
    assert again.compression is None
    assert (again.kind, again.timeline, again.log, again.seg, again.backup_offset) == (
        entry.kind,
        entry.timeline,
        entry.log,
        entry.seg,
        entry.backup_offset,
    )
    assert again.base_name == entry.base_name


# ----------------------------------------------------------------------------- index gaps


_NAMES = st.lists(
    st.one_of(
        st.builds(
            lambda t, s: segment_name(t, s, 16 * 1024 * 1024),
            st.integers(1, 3),
            st.integers(0, 300),
        ),
        st.sampled_from(
            [
                "00000002.history",
                "00000003.history",
                "junk",
                "000000010000000000000010.partial",
                "000000010000000000000010.00000028.backup",
            ]
        ),
    ),
    max_size=120,
    unique=True,  # a directory listing names a file once
)


@settings(max_examples=80)
@given(_NAMES, _NAMES)
def test_merged_indexes_hold_what_one_index_of_both_holds(a, b):
    """The observer merges the archive's index with a surviving pg_wal's instead of
    listing the archive twice: the same index as one built from both listings."""
    seg = 16 * 1024 * 1024
    merged = ArchiveIndex.build(a, seg).merged(ArchiveIndex.build(b, seg))
    assert merged == ArchiveIndex.build({*a, *b}, seg)


@settings(max_examples=60)
@given(
    seg_sizes,
    st.dictionaries(
        st.integers(1, 5),
        st.sets(st.integers(0, 600), min_size=1, max_size=200),
        min_size=1,
        max_size=3,
    ),
    st.randoms(use_true_random=False),
)
def test_index_ranges_and_gaps_are_exact(segsz, present, rnd):
    names = [segment_name(t, s, segsz) for t, segs in present.items() for s in segs]
    # duplicates in compressed form, noise, and a random listing order
    names += [n + ".gz" for n in rnd.sample(names, min(5, len(names)))]
    names += ["00000002.history", "junk", segment_name(1, 700, segsz) + ".partial"]
    rnd.shuffle(names)
    idx = ArchiveIndex.build(names, segsz)
    assert idx.timelines() == tuple(sorted(present))
    for t, segs in present.items():
        ranges = idx.ranges(t)
        covered = {s for r in ranges for s in range(r.first, r.last + 1)}
        assert covered == segs
        for a, b in itertools.pairwise(ranges):
            assert b.first > a.last + 1  # maximal runs
        gap_set = {s for g in idx.gaps(t) for s in range(g.first, g.last + 1)}
        assert gap_set == set(range(min(segs), max(segs) + 1)) - segs
        assert all(idx.has_segment(t, s) == (s in segs) for s in range(610))
    assert not idx.has_segment(1, 700) or 700 in present.get(1, set())


@settings(max_examples=60)
@given(
    st.integers(0, 300),
    st.integers(1, 300),
    st.sets(st.integers(0, 400)),
    st.integers(0, MB - 1),
)
def test_check_missing_is_exactly_the_removed_segments(first, length, removed, offset):
    segsz = MB
    last = first + length
    present = set(range(first, last + 1)) - removed
    idx = ArchiveIndex.build([segment_name(1, s, segsz) for s in present], segsz)
    start = LSN(first * segsz + offset)
    end = LSN(last * segsz + 1)
    c = check(idx, (1, start), end, 1, TimelineGraph(), max_missing=10_000)
    expected = sorted(set(range(first, last + 1)) & removed)
    assert c.missing == tuple(segment_name(1, s, segsz) for s in expected)
    assert c.missing_count == len(expected)
    assert c.complete == (not expected)
    assert c.segments_needed == last - first + 1
    if expected:
        assert c.reachable_lsn == max(start, LSN(expected[0] * segsz))
    else:
        assert c.reachable_lsn == LSN((last + 1) * segsz)


# ----------------------------------------------------------------------------- timeline trees


@st.composite
def timeline_trees(draw):
    """Timelines 1..n; each t >= 2 forks from a parent p < t at or after p's begin."""
    n = draw(st.integers(1, 8))
    begin = {1: 0}
    parent: dict[int, int] = {}
    text = {1: ""}
    for t in range(2, n + 1):
        p = draw(st.integers(1, t - 1))
        sp = begin[p] + draw(st.one_of(st.just(0), st.integers(0, 12 * MB)))
        if draw(st.booleans()):
            sp -= sp % MB  # a switch exactly at a segment boundary
        sp = max(sp, begin[p])
        reason = draw(
            st.text(
                alphabet=st.characters(exclude_characters="\n\r", exclude_categories=["Cs"]),
                max_size=20,
            )
        )
        extra = draw(st.sampled_from(["", "\n", "\n\n", "# comment\n"]))
        begin[t], parent[t] = sp, p
        text[t] = text[p] + extra + f"{p}\t{LSN(sp)}\t{reason}\n"
    return n, begin, parent, text


def ancestry(t: int, parent: dict[int, int]) -> list[int]:
    out = [t]
    while out[-1] in parent:
        out.append(parent[out[-1]])
    return out[::-1]


def oracle_timeline_at(lsn: int, target: int, begin, parent) -> int:
    # The newest ancestor whose begin is <= lsn (switchpoints never decrease).
    return [a for a in ancestry(target, parent) if begin[a] <= lsn][-1]


@settings(max_examples=80)
@given(timeline_trees(), st.data())
def test_history_paths_on_generated_trees(tree, data):
    n, begin, parent, text = tree
    given_tls = data.draw(st.sets(st.integers(2, max(n, 2)), max_size=n)) if n > 1 else set()
    given_tls = {t for t in given_tls if t <= n}
    histories = [parse_history(text[t], t) for t in sorted(given_tls)]
    for h in histories:
        assert [e.parent for e in h.entries] == ancestry(h.timeline, parent)[:-1]
        assert [e.switchpoint.value for e in h.entries] == [
            begin[a] for a in ancestry(h.timeline, parent)[1:]
        ]
    graph = TimelineGraph.from_histories(histories)
    known = {1} | {a for t in given_tls for a in ancestry(t, parent)}
    assert set(graph.timelines()) == known
    assert graph.latest() == max(known)
    for target in known:
        anc = ancestry(target, parent)
        spans = graph.path(target)
        assert [s.timeline for s in spans] == anc
        for s, nxt in itertools.pairwise(spans):
            assert s.end == nxt.start
            assert s.end is not None
            assert s.end.value == begin[nxt.timeline]
        assert spans[-1].end is None
        for _ in range(5):
            lsn = data.draw(st.integers(0, 14 * n * MB))
            expect = oracle_timeline_at(lsn, target, begin, parent)
            assert graph.timeline_at(LSN(lsn), target) == expect
            for t in known:
                assert graph.contains(t, LSN(lsn), target) == (t == expect)
        # exactly at a switchpoint: the child holds it
        for a in anc[1:]:
            assert graph.timeline_at(LSN(begin[a]), target) == oracle_timeline_at(
                begin[a], target, begin, parent
            )


@settings(max_examples=80)
@given(timeline_trees(), st.data())
def test_check_on_generated_trees(tree, data):
    n, begin, parent, text = tree
    segsz = MB
    target = data.draw(st.integers(1, n))
    anc = ancestry(target, parent)
    histories = [parse_history(text[t], t) for t in range(2, n + 1)]
    graph = TimelineGraph.from_histories(histories)
    # a start on the path: an LSN and the timeline that holds it there
    start = data.draw(st.integers(0, begin[target] + 4 * MB))
    start_tli = oracle_timeline_at(start, target, begin, parent)
    end_seg = start // segsz + data.draw(st.integers(0, 20))

    def tli_for_segment(segno: int) -> int:
        # xlogrecovery.c XLogFileReadAnyTLI: newest timeline whose begin segment <= segno
        return [a for a in anc if begin[a] // segsz <= segno][-1]

    needed = [(tli_for_segment(s), s) for s in range(start // segsz, end_seg + 1)]
    names = [segment_name(t, s, segsz) for t, s in needed]
    names += [f"{t:08X}.history" for t in range(2, n + 1)]
    # WAL of other timelines at the same positions must not matter
    names += [segment_name(t, s, segsz) for t in range(1, n + 1) for s in range(3)]
    end = LSN(max(start, end_seg * segsz + 1))
    c = check(ArchiveIndex.build(names, segsz), (start_tli, LSN(start)), end, target, graph)
    assert c.complete, c.summary()
    assert c.segments_needed == len(needed)
    assert [s.timeline for s in c.path] == anc[anc.index(start_tli) :]
    # remove one needed segment: exactly that one is reported
    victim_i = data.draw(st.integers(0, len(needed) - 1))
    victim_tli, victim_seg = needed[victim_i]
    victim = segment_name(victim_tli, victim_seg, segsz)
    assume(victim in names)
    rnd = random.Random(victim_i)
    kept = [x for x in names if x != victim]
    rnd.shuffle(kept)
    c = check(ArchiveIndex.build(kept, segsz), (start_tli, LSN(start)), end, target, graph)
    # A timeline's first segment missing: recovery reads the previous timeline's file
    # of that segment (XLogFileReadAnyTLI), valid up to the switchpoint.
    pos = anc.index(victim_tli)
    prev = anc[pos - 1] if pos > anc.index(start_tli) else None
    switch = begin[victim_tli]
    if (
        prev is not None
        and victim_seg == switch // segsz
        and segment_name(prev, victim_seg, segsz) in kept
    ):
        if end <= LSN(switch):
            assert c.complete, c.summary()
            return
        assert c.missing == (victim,)
        assert c.reachable_lsn == max(LSN(start), LSN(switch))
        assert c.reachable_timeline == prev
        return
    assert c.missing == (victim,)
    assert c.reachable_lsn == max(LSN(start), LSN(needed[victim_i][1] * segsz))
    assert c.reachable_timeline == needed[victim_i][0]


def _reference_index(names, segsz):
    """ArchiveIndex.build the slow way: every name parsed on its own."""
    per_id = 0x100000000 // segsz
    present: dict[int, set[int]] = {}
    unknown = []
    for n in names:
        e = parse_archive_name(n)
        if e.kind is WalFileKind.SEGMENT and e.seg is not None and e.seg < per_id:
            segno = e.segment_number(segsz)
            assert e.timeline is not None and segno is not None
            present.setdefault(e.timeline, set()).add(segno)
        elif e.kind is WalFileKind.SEGMENT or e.kind is WalFileKind.UNKNOWN:
            unknown.append(n)
    return present, sorted(unknown)


@settings(max_examples=150)
@given(
    st.sampled_from([1 << 30, 256 << 20, 16 << 20, 8 << 20, 1 << 20]),
    st.lists(
        st.tuples(st.integers(1, 4), st.integers(0, 3000), st.integers(1, 600)),
        min_size=1,
        max_size=4,
    ),
    st.sets(st.integers(0, 3600), max_size=30),
    st.lists(
        st.sampled_from(
            [
                "00000000000000000000000A",  # timeline 0
                "0000000100000000000000ff",  # lower case: PostgreSQL never writes it
                "000000010000000 00000001",  # a space
                "0000000100000000FFFFFFFF",  # past the last segment of a log
                "0000000100000000000001FF",  # past it below 4 KiB segments per log
                "000000010000000000000FFF",  # the last one at 1 MiB segments
                "ZZZZZZZZ0000000000000001",
                "000000010000000000000001.gz",
                "00000002.history",
            ]
        ),
        max_size=2,
        unique=True,
    ),
    st.randoms(use_true_random=False),
)
def test_index_of_long_runs_and_odd_names_matches_a_name_by_name_reading(
    segsz, runs, holes, odd, rnd
):
    """Issue 9: the index counts whole logs of segment names at once (no step per
    name) and reads only the incomplete logs name by name; it must say exactly what
    parsing every name on its own says, whole logs, holes and odd names included."""
    names = {
        segment_name(t, s, segsz)
        for t, first, length in runs
        for s in range(first, first + length)
        if s not in holes
    }
    listing = [*names, *odd]
    rnd.shuffle(listing)
    idx = ArchiveIndex.build(listing, segsz)
    present, unknown = _reference_index(listing, segsz)
    assert idx.timelines() == tuple(sorted(present))
    for t, segs in present.items():
        ranges = idx.ranges(t)
        assert {s for r in ranges for s in range(r.first, r.last + 1)} == segs
        assert all(b.first > a.last + 1 for a, b in itertools.pairwise(ranges))
    assert sorted(idx.unknown_names) == unknown


def test_the_listing_is_decoded_in_chunks_with_the_same_answer(monkeypatch):
    """Names are decoded as hex a chunk at a time (bounded memory): an odd name in
    any chunk, not only the first, sends the listing to the name-by-name path."""
    import pgsnap.wal.continuity as wal

    segsz = 1 << 30  # 4 segments per log: whole logs and partial ones
    names = [segment_name(t, s, segsz) for t in (1, 2) for s in range(90) if s % 17]
    rnd = random.Random(7)
    rnd.shuffle(names)
    whole = ArchiveIndex.build(names, segsz)
    monkeypatch.setattr(wal, "_CHUNK", 5)
    assert ArchiveIndex.build(names, segsz) == whole
    odd = [*names[:40], "0000000100000000000001FF", *names[40:]]  # in the 9th chunk
    monkeypatch.setattr(wal, "_CHUNK", 5)
    chunked = ArchiveIndex.build(odd, segsz)
    assert chunked.unknown_names == ("0000000100000000000001FF",)
    assert chunked.segment_ranges == whole.segment_ranges


@settings(max_examples=200)
@given(
    st.sampled_from([1 << 30, 16 << 20, 1 << 20]),
    st.integers(0, 3),
    st.integers(0, 0x1100),
    st.integers(0, 1 << 31),
    st.sampled_from(["", ".gz"]),
)
def test_backup_file_names_are_classified_as_parse_archive_name_says(segsz, tli, seg, offset, comp):
    """.backup names take a fast path (one per backup: thousands): the same verdict
    as parsing them, and the offset must lie inside a segment of this size."""
    name = f"{tli:08X}{0:08X}{seg:08X}.{offset:08X}.backup{comp}"
    idx = ArchiveIndex.build([name], segsz)
    entry = parse_archive_name(name)
    ok = entry.kind is WalFileKind.BACKUP and seg < 0x100000000 // segsz and offset < segsz
    assert (idx.backup_names == (name,)) == ok
    assert (idx.unknown_names == (name,)) == (not ok)


def test_a_segment_named_in_both_cases_is_one_segment_not_a_whole_log():
    """Found by the property test: 255 segments of a log and the 256th name being the
    lower-case twin of one of them must not count as a whole log (segment 0 absent)."""
    names = [segment_name(1, s, 16 << 20) for s in range(1, 256)] + ["0000000100000000000000ff"]
    idx = ArchiveIndex.build(names, 16 << 20)
    assert [(r.first, r.last) for r in idx.ranges(1)] == [(1, 255)]
