"""What a plan probes of a directory archive by name is what a listing would say
(:mod:`pgsnap.wal.known`), however the archive changed between two plans: segments
archived, deleted by hand (alone, in runs, at the end) or put back, a new timeline, files
compressed, the saved state damaged.

The property: whenever :meth:`KnownArchive.probed` answers and
:meth:`KnownArchive.confirm` confirms from a segment on, the probed index and a
listing agree on every segment from there on (every timeline) and on the
``.history`` files; a plan resting on that part of the index is the plan a listing
gives. When they would not agree, the probe or the confirmation says so (and the
caller lists the archive).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgsnap.wal import ArchiveIndex, DirectoryWalArchive, segment_name
from pgsnap.wal.continuity import SegmentRange
from pgsnap.wal.known import KnownArchive

SEG = 16 * 1024 * 1024
SWITCH = 40  # timeline 2 begins at segment 40 (0/28000000)

ops = st.one_of(
    st.tuples(st.just("archive"), st.integers(1, 30)),
    st.tuples(st.just("delete"), st.integers(0, 200), st.integers(1, 5)),
    st.tuples(st.just("delete_tail"), st.integers(1, 4)),
    st.tuples(st.just("promote")),
    st.tuples(st.just("compress"), st.integers(0, 200)),
    st.tuples(st.just("refill"), st.integers(0, 200)),
    st.tuples(st.just("damage_state")),
    st.tuples(st.just("plan"), st.integers(0, 1000)),
)


class _Archive:
    """An archive directory of empty files named like WAL (probing only stats names)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.timeline = 1
        self.next = {1: 0}

    def segments(self) -> list[str]:
        return sorted(n[:24] for n in os.listdir(self.path) if len(n) >= 24 and n[8] != ".")

    def archive(self, count: int) -> None:
        tli = self.timeline
        for _ in range(count):
            (self.path / segment_name(tli, self.next[tli], SEG)).touch()
            self.next[tli] += 1

    def promote(self) -> None:
        if self.timeline != 1 or self.next[1] <= SWITCH:
            return
        (self.path / "00000002.history").write_text(
            f"1\t0/{SWITCH * SEG:X}\tno recovery target specified\n"
        )
        self.timeline = 2
        self.next[2] = SWITCH

    def compress(self, name: str) -> None:
        """Replace a plain segment by its ``.gz`` (as a compressing archive_command)."""
        plain = self.path / name
        if plain.exists():
            plain.unlink()
            (self.path / f"{name}.gz").write_bytes(gzip.compress(b""))

    def refill(self, pick: int) -> None:
        """Put back a segment that went missing (a copy restored by hand)."""
        have = set(self.segments())
        missing = [
            segment_name(tli, segno, SEG)
            for tli, end in sorted(self.next.items())
            for segno in range(SWITCH if tli == 2 else 0, end)
            if segment_name(tli, segno, SEG) not in have
        ]
        if missing:
            (self.path / missing[pick % len(missing)]).touch()


@contextlib.contextmanager
def _five_segments_known(
    gzipped: bool,
) -> Iterator[tuple[_Archive, DirectoryWalArchive, KnownArchive]]:
    """A new archive of five segments on timeline 1, its state saved as known."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "archive").mkdir()
        archive = _Archive(root / "archive")
        directory = DirectoryWalArchive(archive.path, gzip=gzipped)
        known = KnownArchive(root / "index", directory, SEG)
        archive.archive(5)
        known.save(directory.index(SEG, check_sizes=False))
        yield archive, directory, known


def _tail(index: ArchiveIndex, from_segno: int) -> list[SegmentRange]:
    return [
        SegmentRange(r.timeline, max(r.first, from_segno), r.last)
        for r in index.segment_ranges
        if r.last >= from_segno
    ]


@settings(max_examples=300)
@given(st.lists(ops, min_size=1, max_size=25), st.booleans())
def test_a_probed_and_confirmed_archive_is_what_a_listing_says(
    steps: list[tuple[object, ...]], gzipped: bool
) -> None:
    with _five_segments_known(gzipped) as (archive, directory, known):
        confirmed = 0
        for step in steps:
            kind = step[0]
            names = archive.segments()
            if kind == "archive":
                archive.archive(int(step[1]))  # type: ignore[call-overload]
            elif kind == "delete" and names:
                first = int(step[1]) % len(names)  # type: ignore[call-overload]
                for name in names[first : first + int(step[2])]:  # type: ignore[call-overload]
                    for path in archive.path.glob(name + "*"):
                        path.unlink()
            elif kind == "delete_tail" and names:
                for name in names[-int(step[1]) :]:  # type: ignore[call-overload]
                    for path in archive.path.glob(name + "*"):
                        path.unlink()
            elif kind == "promote":
                archive.promote()
            elif kind == "compress" and names:
                archive.compress(names[int(step[1]) % len(names)])  # type: ignore[call-overload]
            elif kind == "refill":
                archive.refill(int(step[1]))  # type: ignore[call-overload]
            elif kind == "damage_state":
                Path(known.path).write_text("{not json")
            elif kind == "plan":
                listed = directory.index(SEG, check_sizes=False)
                probed = known.probed()
                if probed is None:  # the caller lists the archive, and keeps it
                    known.save(listed)
                    continue
                if not listed.segment_ranges:
                    continue
                # A plan from some present segment on (the chosen backup's first).
                present = [
                    (r.timeline, s)
                    for r in listed.segment_ranges
                    for s in range(r.first, r.last + 1)
                ]
                tli, from_segno = present[int(step[1]) % len(present)]  # type: ignore[call-overload]
                why = known.confirm(probed, tli, from_segno)
                if why is None:
                    confirmed += 1
                    assert _tail(probed, from_segno) == _tail(listed, from_segno), why
                    assert probed.history_names == listed.history_names
                    known.save(probed)
                else:
                    known.save(listed)


def test_probing_finds_new_segments_and_timelines_and_sees_a_gap_past_a_missing_one(
    tmp_path: Path,
) -> None:
    archive = _Archive(tmp_path / "archive")
    archive.path.mkdir()
    directory = DirectoryWalArchive(archive.path)
    known = KnownArchive(tmp_path / "index", directory, SEG)
    assert known.probed() is None  # nothing known yet
    archive.archive(50)
    known.save(directory.index(SEG, check_sizes=False))
    archive.promote()
    archive.archive(7)  # timeline 2: segments 40..46
    probed = known.probed()
    assert probed is not None
    assert probed.segment_ranges == (SegmentRange(1, 0, 49), SegmentRange(2, SWITCH, 46))
    assert probed.history_names == ("00000002.history",)
    assert known.confirm(probed, 2, SWITCH) is None

    # A segment deleted past the known end, newer ones present: only a listing says
    # where the gap is, and the probe says so.
    known.save(probed)
    archive.archive(3)  # 47, 48, 49
    (archive.path / segment_name(2, 47, SEG)).unlink()
    assert known.probed() is None

    # A segment deleted inside what is known: the confirmation fails from before it,
    # holds from after it.
    (archive.path / segment_name(2, 47, SEG)).touch()
    probed = known.probed()
    assert probed is not None and probed.ranges(2) == (SegmentRange(2, SWITCH, 49),)
    (archive.path / segment_name(2, 44, SEG)).unlink()
    assert "000000020000000000000002C" not in (known.confirm(probed, 2, 45) or "")
    assert known.confirm(probed, 2, 45) is None
    why = known.confirm(probed, 2, 42)
    assert why is not None and segment_name(2, 44, SEG) in why


def test_a_gap_known_from_a_listing_and_filled_since_is_listed_again(tmp_path: Path) -> None:
    """A segment put back into a gap the last listing saw: the probe keeps the gap (it
    probes only past the ends), so the confirmation must not hold across it."""
    archive = _Archive(tmp_path / "archive")
    archive.path.mkdir()
    directory = DirectoryWalArchive(archive.path)
    known = KnownArchive(tmp_path / "index", directory, SEG)
    archive.archive(20)
    (archive.path / segment_name(1, 10, SEG)).unlink()
    known.save(directory.index(SEG, check_sizes=False))
    (archive.path / segment_name(1, 10, SEG)).touch()
    probed = known.probed()
    assert probed is not None and len(probed.ranges(1)) == 2
    why = known.confirm(probed, 1, 5)
    assert why is not None and "gap" in why
    assert known.confirm(probed, 1, 11) is None


expiry_ops = st.one_of(
    st.tuples(st.just("archive"), st.integers(1, 30)),
    st.tuples(st.just("expire"), st.integers(0, 3), st.integers(1, 60)),
    st.tuples(st.just("promote")),
    st.tuples(st.just("compress"), st.integers(0, 200)),
    st.tuples(st.just("plan")),
)


@settings(max_examples=200)
@given(st.lists(expiry_ops, min_size=1, max_size=25), st.booleans())
def test_after_expiries_a_trimmed_probe_is_what_a_listing_says(
    steps: list[tuple[object, ...]], gzipped: bool
) -> None:
    """Expiries (this host's or another's) delete the oldest segments of a timeline's
    run while the archiver appends: an expiry planned by name (:meth:`KnownArchive.probed`
    then :meth:`KnownArchive.trimmed`) sees every run as a listing does, or is told to
    list (a whole run gone)."""
    with _five_segments_known(gzipped) as (archive, directory, known):
        for step in steps:
            kind = step[0]
            names = archive.segments()
            if kind == "archive":
                archive.archive(int(step[1]))  # type: ignore[call-overload]
            elif kind == "expire":
                timelines = sorted({int(n[:8], 16) for n in names})
                if timelines:
                    tli = timelines[int(step[1]) % len(timelines)]  # type: ignore[call-overload]
                    oldest = [n for n in names if int(n[:8], 16) == tli]
                    for name in oldest[: int(step[2])]:  # type: ignore[call-overload]
                        for path in archive.path.glob(name + "*"):
                            path.unlink()
            elif kind == "promote":
                archive.promote()
            elif kind == "compress" and names and gzipped:  # (else it is a hole)
                archive.compress(names[int(step[1]) % len(names)])  # type: ignore[call-overload]
            elif kind == "plan":
                listed = directory.index(SEG, check_sizes=False)
                probed = known.probed()
                trimmed = None if probed is None else known.trimmed(probed)
                if trimmed is None:  # the caller lists the archive, and keeps it
                    known.save(listed)
                    continue
                assert trimmed.segment_ranges == listed.segment_ranges
                assert trimmed.history_names == listed.history_names
                known.save(trimmed)


def test_a_run_cut_short_is_bisected_and_a_run_gone_is_listed(tmp_path: Path) -> None:
    archive = _Archive(tmp_path / "archive")
    archive.path.mkdir()
    directory = DirectoryWalArchive(archive.path)
    known = KnownArchive(tmp_path / "index", directory, SEG)
    archive.archive(50)
    archive.promote()
    archive.archive(5)  # timeline 2: 40..44
    index = directory.index(SEG, check_sizes=False)
    known.save(index)
    for segno in range(17):  # an expiry kept timeline 1 from segment 17 on
        (archive.path / segment_name(1, segno, SEG)).unlink()
    stats: list[str] = []
    real_isfile = os.path.isfile

    def counted(path: str) -> bool:
        stats.append(path)
        return real_isfile(path)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("pgsnap.wal.known.os.path.isfile", counted)
        trimmed = known.trimmed(index)
    assert trimmed is not None
    assert trimmed.segment_ranges == (SegmentRange(1, 17, 49), SegmentRange(2, SWITCH, 44))
    assert len(stats) <= 2 + 6  # each run's first, then a bisection of 49 names
    assert known.present(["00000002.history", "00000003.history"]) == ("00000002.history",)

    # A segment deleted by hand inside a run is not looked for: the index knows more
    # than the archive holds there, which an expiry deletes again (nothing) and a
    # recovery plan's confirmation does not let by.
    (archive.path / segment_name(1, 30, SEG)).unlink()
    again = known.trimmed(trimmed)
    assert again is not None and again.segment_ranges == trimmed.segment_ranges
    assert known.confirm(again, 1, 20) is not None

    for segno in range(17, 50):  # timeline 1 expired whole
        (archive.path / segment_name(1, segno, SEG)).unlink(missing_ok=True)
    assert known.trimmed(trimmed) is None
