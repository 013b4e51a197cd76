"""Which segments the archive holds, and whether they join up (pure).

:class:`ArchiveIndex` holds the contiguous segment ranges per timeline of an
archive listing; :func:`check` is the WAL continuity check (the segments a
stretch of WAL needs, on the right timelines, all present);
:func:`switch_gaps` finds segments missing just before a timeline switch and
:func:`recoverable_window` the stretch a backup can reach. The listing itself
is read by :mod:`pgsnap.wal.archive`; what each segment *holds* is
:mod:`pgsnap.wal.contents`.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import operator
import re
from collections.abc import Iterable, Iterator
from typing import Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import (
    LSNError,
    TimelineError,
    WalGapError,
    WalNameError,
)
from pgsnap.model import LSN
from pgsnap.wal.names import (
    WalFileKind,
    history_file_name,
    parse_archive_name,
    segment_name,
    validate_segment_size,
)
from pgsnap.wal.timelines import TimelineGraph, TimelineSpan

__all__ = [
    "ArchiveIndex",
    "ArchiveReport",
    "SegmentRange",
    "SwitchGap",
    "TimelineReport",
    "WalCheck",
    "archive_report",
    "check",
    "recoverable_window",
    "segments_to_replay",
    "switch_gaps",
]


_U64: Final = 0xFFFFFFFFFFFFFFFF


@frozen(order=True)
class SegmentRange:
    """Segments ``first..last`` (inclusive segment numbers) on ``timeline``."""

    timeline: int
    first: int
    last: int

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.first <= self.last:
            raise WalNameError(
                f"invalid segment range {self.first}..{self.last}",
                hint="first and last are segment numbers with 0 <= first <= last",
            )

    @property
    def count(self) -> int:
        """How many segments the range holds."""
        return self.last - self.first + 1

    def names(self, segment_size: int) -> tuple[str, str]:
        """The names of the first and last segment."""
        return (
            segment_name(self.timeline, self.first, segment_size),
            segment_name(self.timeline, self.last, segment_size),
        )

    def lsn_range(self, segment_size: int) -> tuple[LSN, LSN]:
        """``(start, end)`` of the WAL the range holds; ``end`` is exclusive."""
        return LSN(self.first * segment_size), LSN(min((self.last + 1) * segment_size, _U64))


def _range_key(r: SegmentRange) -> tuple[int, int]:
    return (r.timeline, r.first)


def _validate_ranges(_inst: object, _attr: object, value: tuple[SegmentRange, ...]) -> None:
    for a, b in itertools.pairwise(value):
        if (a.timeline, a.first) >= (b.timeline, b.first) or (
            a.timeline == b.timeline and b.first <= a.last + 1
        ):
            raise WalNameError(
                f"segment ranges must be sorted, disjoint and not adjacent: {a} then {b}",
                hint="build an index with ArchiveIndex.build(names, segment_size)",
            )


def _sorted_str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(value))


def _ranges_converter(value: Iterable[SegmentRange]) -> tuple[SegmentRange, ...]:
    return tuple(value)


@frozen
class ArchiveIndex:
    """What a WAL archive holds: contiguous segment ranges per timeline, plus other files.

    Build it with :meth:`build` from the archive's file names. Segments are
    stored as ranges (a million segments with a few gaps is a handful of
    objects). A compressed segment counts as present; a ``.partial`` does not
    (it is listed in ``partial_names``). Names that cannot be a file of a
    cluster with this segment size (e.g. ``...00000100`` at 16 MiB, timeline
    0) are in ``unknown_names``.
    """

    segment_size: int = attrs.field(validator=lambda _i, _a, v: validate_segment_size(v))
    segment_ranges: tuple[SegmentRange, ...] = attrs.field(
        default=(), converter=_ranges_converter, validator=_validate_ranges
    )
    history_names: tuple[str, ...] = attrs.field(default=(), converter=_sorted_str_tuple)
    backup_names: tuple[str, ...] = attrs.field(default=(), converter=_sorted_str_tuple)
    partial_names: tuple[str, ...] = attrs.field(default=(), converter=_sorted_str_tuple)
    unknown_names: tuple[str, ...] = attrs.field(default=(), converter=_sorted_str_tuple)

    @classmethod
    def build(cls, names: Iterable[str], segment_size: int) -> ArchiveIndex:
        """Classify every name (see :func:`parse_archive_name`) and index the segments."""
        names = names if isinstance(names, list) else list(names)
        is_plain = list(map((24).__eq__, map(len, names)))
        return cls.from_split(
            list(itertools.compress(names, is_plain)),
            list(itertools.compress(names, map(operator.not_, is_plain))),
            segment_size,
        )

    @classmethod
    def from_split(cls, plain: list[str], other: list[str], segment_size: int) -> ArchiveIndex:
        """:meth:`build` from names already split: ``plain`` the names of 24
        characters, ``other`` the rest (a listing that split them saves a pass)."""
        segsz = validate_segment_size(segment_size)
        per_id = 0x100000000 // segsz
        by_tli: dict[int, list[int]] = {}
        history: list[str] = []
        backup: list[str] = []
        partial: list[str] = []
        unknown: list[str] = []
        ranges: list[SegmentRange] = []
        whole = _whole_runs(plain, per_id)
        if whole is not None:  # every 24-character name is a segment name: done at C speed
            ranges, names = whole, other
        else:
            names = [*plain, *other]
        cur_tli = -1
        placeholder: list[int] = []
        cur_append = placeholder.append  # replaced before first use
        fromhex, from_bytes = bytes.fromhex, int.from_bytes
        for name in names:
            # Fast path for a plain 24-hex-digit name. bytes.fromhex accepts only
            # ASCII hex digits (and whitespace *between* byte pairs, impossible when
            # 24 characters give 12 bytes), so it is a strict and fast validator.
            if len(name) == 24:
                try:
                    raw = fromhex(name)
                except ValueError:
                    unknown.append(name)
                    continue
                if len(raw) != 12:
                    unknown.append(name)
                    continue
                v = from_bytes(raw, "big")
                tli = v >> 64
                seg = v & 0xFFFFFFFF
                if tli == 0 or seg >= per_id:
                    unknown.append(name)
                    continue
                if tli != cur_tli:
                    lst = by_tli.get(tli)
                    if lst is None:
                        lst = by_tli[tli] = []
                    cur_tli, cur_append = tli, lst.append
                cur_append(((v >> 32) & 0xFFFFFFFF) * per_id + seg)
                continue
            plain_backup = _PLAIN_BACKUP_RE.fullmatch(name) if name[-7:] == ".backup" else None
            if plain_backup is not None:  # one per backup: thousands, so no ArchiveEntry
                tli_hex, seg_hex, off_hex = plain_backup.groups()
                if int(tli_hex, 16) and int(seg_hex, 16) < per_id and int(off_hex, 16) < segsz:
                    backup.append(name)
                else:
                    unknown.append(name)
                continue
            entry = parse_archive_name(name)
            kind = entry.kind
            if kind is WalFileKind.HISTORY:
                history.append(name)
            elif entry.seg is not None and entry.seg >= per_id:
                unknown.append(name)
            elif kind is WalFileKind.SEGMENT:
                segno = entry.segment_number(segsz)
                assert entry.timeline is not None
                assert segno is not None
                by_tli.setdefault(entry.timeline, []).append(segno)
            elif kind is WalFileKind.BACKUP:
                if entry.backup_offset is not None and entry.backup_offset >= segsz:
                    unknown.append(name)
                else:
                    backup.append(name)
            elif kind is WalFileKind.PARTIAL:
                partial.append(name)
            else:
                unknown.append(name)
        for tli in sorted(by_tli):
            ranges.extend(_runs(tli, by_tli[tli]))
        if whole is not None and by_tli:  # a few long names spelled segments: merge
            ranges = _merge_ranges(ranges)
        return cls(segsz, tuple(ranges), history, backup, partial, unknown)

    def merged(self, other: ArchiveIndex) -> ArchiveIndex:
        """What this index and ``other`` (of the same segment size) hold together:
        e.g. the archive and a surviving ``pg_wal``, without listing the archive again."""
        if other.segment_size != self.segment_size:
            raise WalNameError(
                f"cannot merge indexes of {self.segment_size}- and "
                f"{other.segment_size}-byte segments",
                hint="build both with the cluster's segment size",
            )
        by_tli: dict[int, list[SegmentRange]] = {}
        for r in (*self.segment_ranges, *other.segment_ranges):
            by_tli.setdefault(r.timeline, []).append(r)
        ranges: list[SegmentRange] = []
        for tli in sorted(by_tli):
            runs = sorted(by_tli[tli], key=lambda r: r.first)
            first, last = runs[0].first, runs[0].last
            for r in runs[1:]:
                if r.first <= last + 1:
                    last = max(last, r.last)
                else:
                    ranges.append(SegmentRange(tli, first, last))
                    first, last = r.first, r.last
            ranges.append(SegmentRange(tli, first, last))
        return ArchiveIndex(
            self.segment_size,
            tuple(ranges),
            {*self.history_names, *other.history_names},
            {*self.backup_names, *other.backup_names},
            {*self.partial_names, *other.partial_names},
            {*self.unknown_names, *other.unknown_names},
        )

    # -- queries ------------------------------------------------------------------

    def timelines(self) -> tuple[int, ...]:
        """Timelines with at least one segment, ascending."""
        return tuple(sorted({r.timeline for r in self.segment_ranges}))

    def ranges(self, timeline: int) -> tuple[SegmentRange, ...]:
        """The contiguous runs of segments on ``timeline``, ascending."""
        lo = bisect.bisect_left(self.segment_ranges, (timeline, -1), key=_range_key)
        hi = bisect.bisect_left(self.segment_ranges, (timeline + 1, -1), key=_range_key)
        return self.segment_ranges[lo:hi]

    def gaps(self, timeline: int) -> tuple[SegmentRange, ...]:
        """The missing runs between the first and last segment present on ``timeline``."""
        rs = self.ranges(timeline)
        return tuple(
            SegmentRange(timeline, a.last + 1, b.first - 1) for a, b in itertools.pairwise(rs)
        )

    def has_segment(self, timeline: int, segno: int) -> bool:
        """Whether segment ``segno`` of ``timeline`` is present (compressed counts)."""
        return self._range_containing(timeline, segno) is not None

    def _range_containing(self, timeline: int, segno: int) -> SegmentRange | None:
        i = bisect.bisect_right(self.segment_ranges, (timeline, segno), key=_range_key)
        if i == 0:
            return None
        r = self.segment_ranges[i - 1]
        if r.timeline == timeline and r.first <= segno <= r.last:
            return r
        return None

    def has_history(self, timeline: int) -> bool:
        """Whether ``<timeline>.history`` (possibly compressed) is in the archive."""
        return any(parse_archive_name(n).timeline == timeline for n in self.history_names)

    @property
    def segment_count(self) -> int:
        """How many distinct segments are present."""
        return sum(r.count for r in self.segment_ranges)

    def _present_in(self, timeline: int, first: int, last: int) -> list[tuple[int, int]]:
        """Present runs intersected with ``first..last``."""
        out: list[tuple[int, int]] = []
        for r in self.ranges(timeline):
            if r.last < first:
                continue
            if r.first > last:
                break
            out.append((max(r.first, first), min(r.last, last)))
        return out

    def __repr__(self) -> str:
        return (
            f"ArchiveIndex(segment_size={self.segment_size}, segments={self.segment_count}, "
            f"ranges={len(self.segment_ranges)}, timelines={list(self.timelines())}, "
            f"histories={len(self.history_names)}, backups={len(self.backup_names)}, "
            f"partials={len(self.partial_names)}, unknown={len(self.unknown_names)})"
        )


_PLAIN_BACKUP_RE: Final = re.compile(
    r"([0-9A-Fa-f]{8})[0-9A-Fa-f]{8}([0-9A-Fa-f]{8})\.([0-9A-Fa-f]{8})\.backup"
)
"""An uncompressed ``.backup`` file's name: timeline, segment part, offset."""

_CHUNK: Final = 65536
"""Names decoded as hex at a time (a bounded buffer, not the whole listing's)."""


def _whole_runs(plain: list[str], per_id: int) -> list[SegmentRange] | None:
    """The runs of segments named by ``plain`` (names of 24 characters), or None when
    one of them is not a segment name of this segment size (the caller then
    classifies them one by one).

    A million names are checked and counted without a Python step per name:
    joined by newlines, a chunk at a time, they decode as hex at once
    (``bytes.fromhex`` skips whitespace between bytes, so a name with a space
    or newline in it shows as a short result), 12 bytes a name; the segment
    numbers are checked on byte columns; the names are counted per timeline
    and log (their first 16 characters). A log with all ``per_id`` segments is
    one run; only the names of incomplete logs (the ends of runs, gaps) are
    read one by one.
    """
    if not plain:
        return []
    low = bytes(range(per_id)) if per_id <= 256 else bytes(range(per_id // 256))
    for at in range(0, len(plain), _CHUNK):
        chunk = plain[at : at + _CHUNK]
        text = "\n".join(chunk)
        if text != text.upper():
            # Lower-case hex: ``...FF`` and ``...ff`` are two files of one segment,
            # so counting names would count it twice. Name by name instead.
            return None
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            return None
        if len(raw) != 12 * len(chunk):
            return None
        # Each name is 12 bytes: timeline, log, segment (big-endian). A segment
        # number is below per_id (a power of two, 4 to 4096) when its top two bytes
        # are zero and its low 16 bits are below per_id: checked on byte columns,
        # not per name (translate(None, allowed) deletes the allowed bytes at C
        # speed: anything left is out of range).
        if raw[8::12].translate(None, b"\0") or raw[9::12].translate(None, b"\0"):
            return None
        if per_id <= 256:
            if raw[10::12].translate(None, b"\0") or raw[11::12].translate(None, low):
                return None
        elif raw[10::12].translate(None, low):
            return None
    counts = collections.Counter(map(operator.itemgetter(slice(0, 16)), plain))
    spans: list[tuple[int, int, int]] = []  # (timeline, first, last)
    partial: dict[str, list[int]] = {}
    for prefix, count in counts.items():
        if prefix.startswith("00000000"):
            return None  # timeline 0
        if count == per_id:
            tli, log = int(prefix[:8], 16), int(prefix[8:], 16)
            spans.append((tli, log * per_id, log * per_id + per_id - 1))
        else:
            partial[prefix] = []
    if partial:
        key = operator.itemgetter(slice(0, 16))
        for name in itertools.compress(plain, map(partial.__contains__, map(key, plain))):
            partial[name[:16]].append(int(name[16:], 16))
    for prefix, segs in partial.items():
        tli, base = int(prefix[:8], 16), int(prefix[8:], 16) * per_id
        spans.extend((r.timeline, r.first, r.last) for r in _runs(tli, [base + s for s in segs]))
    spans.sort()
    merged: list[list[int]] = []
    for tli, first, last in spans:
        if merged and merged[-1][0] == tli and first <= merged[-1][2] + 1:
            merged[-1][2] = max(merged[-1][2], last)
        else:
            merged.append([tli, first, last])
    return [SegmentRange(tli, first, last) for tli, first, last in merged]


def _merge_ranges(ranges: list[SegmentRange]) -> list[SegmentRange]:
    """``ranges`` sorted, with overlapping and touching runs of a timeline joined."""
    out: list[SegmentRange] = []
    for r in sorted(ranges, key=lambda r: (r.timeline, r.first)):
        if out and out[-1].timeline == r.timeline and r.first <= out[-1].last + 1:
            if r.last > out[-1].last:
                out[-1] = SegmentRange(r.timeline, out[-1].first, r.last)
            continue
        out.append(r)
    return out


def _runs(tli: int, segnos: list[int]) -> list[SegmentRange]:
    """Contiguous runs of the (unsorted, possibly repeated) segment numbers."""
    if not segnos:
        return []
    lo, hi = min(segnos), max(segnos)
    width = hi - lo + 1
    out: list[SegmentRange] = []
    if width <= max(8 * len(segnos), 1 << 20):
        # A byte per segment number, then runs found with C-speed find(): faster
        # than sorting a million numbers, and bounded by the width check above.
        bitmap = bytearray(width)
        for s in segnos:
            bitmap[s - lo] = 1
        pos = 0
        while pos >= 0:
            end = bitmap.find(0, pos)
            if end < 0:
                end = width
            out.append(SegmentRange(tli, lo + pos, lo + end - 1))
            pos = bitmap.find(1, end)
        return out
    segnos.sort()  # sparse: sort instead
    first = prev = segnos[0]
    for s in segnos:
        if s > prev + 1:
            out.append(SegmentRange(tli, first, prev))
            first = s
        prev = s
    out.append(SegmentRange(tli, first, prev))
    return out


# =========================================================================== continuity check


@frozen
class WalCheck:
    """The result of :func:`check`: is the WAL from a start to an end all there?

    * ``complete`` - every needed segment (and the target timeline's history
      file) is in the archive;
    * ``missing`` - names of the missing segments in replay order, at most
      ``max_missing`` of them; ``missing_count`` is the full count;
    * ``missing_histories`` - the target timeline's ``.history`` if absent
      (recovery needs it to follow the timeline);
    * ``reachable_lsn`` - WAL is available without a gap from the start up
      to, not including, this LSN (the start of the first missing segment, or
      the end of the last needed/present segment); never before the start;
    * ``reachable_timeline`` - the timeline on which ``reachable_lsn`` lies;
    * ``end_lsn`` - the end that was checked (``end``, or where the archive's
      WAL on the path ends when ``end`` was None);
    * ``segments_needed`` - how many segments replay from start to end reads;
    * ``path`` - the timeline spans followed, oldest first.
    """

    complete: bool
    missing: tuple[str, ...]
    missing_count: int
    reachable_lsn: LSN
    reachable_timeline: int
    path: tuple[TimelineSpan, ...]
    segments_needed: int
    start_timeline: int
    start_lsn: LSN
    end_lsn: LSN
    target_timeline: int
    missing_histories: tuple[str, ...] = ()

    def raise_for_gap(self) -> None:
        """Raise :class:`~pgsnap.errors.WalGapError` unless the check is complete."""
        if self.complete:
            return
        if self.missing_count:
            first = self.missing[0]
            more = f" and {self.missing_count - 1} more" if self.missing_count > 1 else ""
            msg = (
                f"WAL is missing from the archive: {first}{more}; replay from "
                f"{self.start_lsn} on timeline {self.start_timeline} can only reach "
                f"{self.reachable_lsn}"
            )
            hint = (
                "copy the missing segments into the archive (from pg_wal of the server, if "
                "still there), or choose a target before the reachable LSN"
            )
        else:
            msg = (
                f"the archive lacks {', '.join(self.missing_histories)}, which recovery needs "
                f"to follow timeline {self.target_timeline}"
            )
            hint = "copy the history file into the archive from pg_wal of the server"
        raise WalGapError(
            msg,
            hint=hint,
            missing=self.missing,
            missing_count=self.missing_count,
            missing_histories=self.missing_histories,
            reachable_lsn=self.reachable_lsn,
        )

    def summary(self) -> str:
        """One human sentence describing the result."""
        route = " → ".join(str(s.timeline) for s in self.path)
        if self.complete:
            return (
                f"WAL complete from {self.start_lsn} to {self.end_lsn} on timelines {route} "
                f"({self.segments_needed} segments)"
            )
        return (
            f"WAL incomplete from {self.start_lsn} to {self.end_lsn} on timelines {route}: "
            f"{self.missing_count} of {self.segments_needed} segments missing"
            + (f", no {', '.join(self.missing_histories)}" if self.missing_histories else "")
            + f"; reachable up to {self.reachable_lsn}"
        )


def _plan_segments(
    path: tuple[TimelineSpan, ...], start_seg: int, segsz: int
) -> list[tuple[int, int, int | None]]:
    """Which timeline's file recovery reads for each segment, as (tli, first, last|None).

    PostgreSQL (xlogrecovery.c, ``XLogFileReadAnyTLI``) walks ``expectedTLEs``
    newest first and, for segment ``segno``, skips every timeline whose begin
    segment (the segment that holds its switchpoint) is after ``segno``; it
    opens the first file it finds. So the segment that holds a switchpoint is
    read from the *child* timeline: the child's copy of that segment contains
    the parent's WAL up to the switchpoint (copied at promotion) followed by
    the child's own WAL, and the parent's file of that segment (often only
    archived as ``.partial``) is not needed. The segment numbers thus
    partition cleanly: a span needs ``seg(begin) .. seg(switchpoint) - 1``,
    the last span is open-ended, and a span can need nothing when a timeline
    begins and ends in one segment (e.g. two promotions in quick succession).
    """
    out: list[tuple[int, int, int | None]] = []
    for i, span in enumerate(path):
        first = start_seg if i == 0 or span.start is None else span.start.value // segsz
        first = max(first, start_seg)
        last = None if span.end is None else span.end.value // segsz - 1
        if last is not None and last < first:
            continue
        out.append((span.timeline, first, last))
    return out


def check(
    index: ArchiveIndex,
    start: tuple[int, LSN],
    end: LSN | None,
    target_timeline: int,
    graph: TimelineGraph,
    *,
    max_missing: int = 100,
) -> WalCheck:
    """Check that the archive holds the WAL to replay from ``start`` to ``end``.

    ``start`` is ``(timeline, lsn)``, e.g. a backup's start timeline and start
    (redo) LSN; it must lie on ``target_timeline``'s history (else
    :class:`TimelineError`). ``end`` is exclusive (WAL ``[start, end)`` is
    needed; a backup's stop LSN fits as is); its segment is read from the
    timeline that holds it on the path. ``end=None`` means "as far as the
    archive goes" (recovery to ``latest``): the end is the last segment present
    on the path, and missing segments *before* it are gaps (WAL after them
    would be silently lost by a recovery to latest), while the WAL simply
    ending is not. A missing start segment is always a gap.
    """
    if isinstance(max_missing, bool) or not isinstance(max_missing, int) or max_missing < 0:
        raise ValueError(f"max_missing must be a non-negative integer, not {max_missing!r}")
    start_tli, start_lsn = start[0], LSN.parse(start[1])
    end_lsn = None if end is None else LSN.parse(end)
    segsz = index.segment_size
    history = graph.history(target_timeline)
    if history.timeline_at(start_lsn) != start_tli:
        path_all = history.spans()
        where = history.timeline_at(start_lsn)
        leave = next((s.end for s in path_all if s.timeline == start_tli), None)
        detail = (
            f"the history of timeline {target_timeline} leaves timeline {start_tli} at {leave}"
            if leave is not None
            else f"timeline {start_tli} is not an ancestor of timeline {target_timeline}"
        )
        raise TimelineError(
            f"{start_lsn} on timeline {start_tli} is not in the history of timeline "
            f"{target_timeline}: {detail} (that LSN is on timeline {where} there)",
            hint="recover to a timeline that descends from the backup after its start "
            "(recovery_target_timeline='current' or the backup's timeline), or use a "
            "backup taken on the target timeline",
            timeline=start_tli,
            target_timeline=target_timeline,
            lsn=str(start_lsn),
        )
    path = graph.path(target_timeline, from_timeline=start_tli)
    start_seg = start_lsn.value // segsz
    if end_lsn is not None and end_lsn < start_lsn:
        raise LSNError(
            f"end {end_lsn} is before start {start_lsn}",
            hint="pass the start (backup start) first and the end (stop or target) second",
            start=str(start_lsn),
            end=str(end_lsn),
        )
    plan = _plan_segments(path, start_seg, segsz)

    if end_lsn is not None:
        end_seg = max(start_seg, (end_lsn.value - 1) // segsz) if end_lsn.value else start_seg
    else:
        # The last segment present on the path, or the start segment if none is.
        end_seg = start_seg
        for tli, first, last in plan:
            present = index._present_in(tli, first, last if last is not None else _U64)
            if present:
                end_seg = max(end_seg, present[-1][1])

    # A timeline's first segment (the one holding its switchpoint) is read from the
    # child's file; when that file is missing, PostgreSQL opens the parent's file of
    # the same segment (XLogFileReadAnyTLI tries the history newest first), which
    # holds the same WAL up to the switchpoint. So that WAL stays reachable.
    parent_copy: dict[tuple[int, int], tuple[LSN, int]] = {}  # (child, segno) -> (S, parent)
    for prev, span in itertools.pairwise(path):
        if prev.end is not None:
            segno = prev.end.value // segsz
            if index._present_in(prev.timeline, segno, segno):
                parent_copy[(span.timeline, segno)] = (prev.end, prev.timeline)

    missing: list[str] = []
    missing_count = 0
    needed = 0
    first_missing: tuple[int, int] | None = None  # (tli, segno)
    partial_reach: tuple[LSN, int] | None = None  # the first gap begins at a switchpoint
    last_tli = start_tli
    for tli, first, last in plan:
        hi = end_seg if last is None else min(last, end_seg)
        if first > hi:
            continue
        last_tli = tli
        needed += hi - first + 1
        cursor = first
        for a, b in [*index._present_in(tli, first, hi), (hi + 1, hi + 1)]:
            if a > cursor:
                gap_first, gap_last = cursor, a - 1
                copy = parent_copy.get((tli, gap_first))
                if copy is not None and end_lsn is not None and end_lsn <= copy[0]:
                    gap_first += 1  # the parent's file serves everything needed
                if gap_first <= gap_last:
                    if first_missing is None:
                        first_missing = (tli, gap_first)
                        if copy is not None and gap_first == cursor:
                            partial_reach = copy
                    missing_count += gap_last - gap_first + 1
                    room = max_missing - len(missing)
                    for s in range(gap_first, min(gap_last, gap_first + room - 1) + 1):
                        missing.append(segment_name(tli, s, segsz))
            cursor = b + 1
        if hi >= end_seg:
            break

    if first_missing is not None:
        reach_tli, reach_seg = first_missing
        reachable = max(start_lsn, LSN(reach_seg * segsz))
        if partial_reach is not None:
            reachable, reach_tli = max(start_lsn, partial_reach[0]), partial_reach[1]
    else:
        reach_tli = last_tli
        reachable = LSN(min((end_seg + 1) * segsz, _U64))
        if end_lsn is None:
            # The WAL ends where the next timeline's first segment is missing: its
            # parent's copy still carries it up to the switchpoint.
            for (child, segno), (switch, parent) in parent_copy.items():
                if (
                    segno == end_seg + 1
                    and not index._present_in(child, segno, segno)
                    and switch > reachable
                ):
                    reachable, reach_tli = switch, parent
    effective_end = end_lsn if end_lsn is not None else LSN(min((end_seg + 1) * segsz, _U64))
    missing_histories: tuple[str, ...] = ()
    if target_timeline != 1 and history.entries and not index.has_history(target_timeline):
        missing_histories = (history_file_name(target_timeline),)
    return WalCheck(
        complete=missing_count == 0 and not missing_histories,
        missing=tuple(missing),
        missing_count=missing_count,
        reachable_lsn=reachable,
        reachable_timeline=reach_tli,
        path=path,
        segments_needed=needed,
        start_timeline=start_tli,
        start_lsn=start_lsn,
        end_lsn=effective_end,
        target_timeline=target_timeline,
        missing_histories=missing_histories,
    )


def segments_to_replay(
    index: ArchiveIndex, result: WalCheck, *, through: LSN | None = None
) -> Iterator[str]:
    """The archive's segments a replay along ``result.path`` fetches, oldest first.

    From ``result``'s start segment up to the segment before ``through``
    (exclusive; default: the end :func:`check` reached, for ``end=None`` the
    last segment present), the names present in ``index`` (plain names, as
    PostgreSQL asks for them). A timeline's first segment is fetched from the
    child when it has it, else from the parent (as ``check`` counts it).
    """
    segsz = index.segment_size
    start_seg = result.start_lsn.value // segsz
    end = result.end_lsn if through is None else LSN.parse(through)
    end_seg = max(start_seg, (end.value - 1) // segsz) if end.value else start_seg
    spans = result.path
    for i, (tli, first, last) in enumerate(_plan_segments(spans, start_seg, segsz)):
        hi = end_seg if last is None else min(last, end_seg)
        if first > hi:
            continue
        if i > 0 and not index._present_in(tli, first, first):
            parent = next((p for p, c in itertools.pairwise(spans) if c.timeline == tli), None)
            if parent is not None and index._present_in(parent.timeline, first, first):
                yield segment_name(parent.timeline, first, segsz)
        for a, b in index._present_in(tli, first, hi):
            for segno in range(a, b + 1):
                yield segment_name(tli, segno, segsz)
        if hi >= end_seg:
            return


@frozen
class SwitchGap:
    """Segments a timeline lacks before the point where a child forked from it.

    Replay along the child's history reads the parent up to the switchpoint
    (the switchpoint's own segment comes from the child's copy, else from the
    parent's): ``first``..``last`` (names) of the parent are missing there,
    after the last segment the parent has. A per-timeline listing of gaps does
    not show them (the parent's WAL simply ends early).
    """

    parent: int
    child: int
    switchpoint: LSN
    first: str
    last: str
    count: int


def switch_gaps(index: ArchiveIndex, graph: TimelineGraph) -> tuple[SwitchGap, ...]:
    """Every :class:`SwitchGap` of the archive: for each timeline with a parent that
    has WAL in the archive, the parent's segments missing before the switchpoint."""
    segsz = index.segment_size
    out: list[SwitchGap] = []
    for child in graph.timelines():
        parent = graph.parent_of(child) if child in graph else None
        switch = graph.switchpoint_of(child) if parent is not None else None
        if parent is None or switch is None:
            continue
        ranges = index.ranges(parent)
        if not ranges:
            continue
        switch_seg = switch.value // segsz
        needed = switch_seg - 1 if index._present_in(child, switch_seg, switch_seg) else switch_seg
        if switch.value % segsz == 0:
            needed = switch_seg - 1  # the switch is at a segment boundary
        last_present = max((r.last for r in ranges if r.first <= needed), default=None)
        if last_present is None or last_present >= needed:
            continue
        first = last_present + 1
        out.append(
            SwitchGap(
                parent=parent,
                child=child,
                switchpoint=switch,
                first=segment_name(parent, first, segsz),
                last=segment_name(parent, needed, segsz),
                count=needed - first + 1,
            )
        )
    return tuple(out)


def recoverable_window(
    index: ArchiveIndex, timeline: int, start_lsn: LSN
) -> tuple[LSN, LSN] | None:
    """``(start_lsn, end)``: WAL on one ``timeline`` is available without a gap on
    ``[start_lsn, end)``; None when the segment holding ``start_lsn`` is missing.

    This looks at one timeline only; use :func:`check` to follow timeline switches.
    """
    start = LSN.parse(start_lsn)
    segsz = index.segment_size
    r = index._range_containing(timeline, start.value // segsz)
    if r is None:
        return None
    return start, LSN(min((r.last + 1) * segsz, _U64))


# =========================================================================== archiver health


@frozen
class TimelineReport:
    """One timeline of an :class:`ArchiveReport`: where it forks from its parent, the
    runs of segments the archive holds (``ranges``, first and last names), the
    runs it lacks between them (``gaps``) and the segments it lacks before a
    child forks off (``missing_before_switch``)."""

    timeline: int
    parent: int | None
    switchpoint: LSN | None
    ranges: tuple[tuple[str, str], ...]
    gaps: tuple[tuple[str, str], ...]
    missing_before_switch: tuple[SwitchGap, ...]


@frozen
class ArchiveReport:
    """The WAL archive per timeline (``pgsnap wal``): :func:`archive_report`."""

    location: str
    segment_size: int
    timelines: tuple[TimelineReport, ...]

    @property
    def complete(self) -> bool:
        """True when no timeline has a gap or lacks segments before a switch."""
        return not any(t.gaps or t.missing_before_switch for t in self.timelines)

    def to_dict(self) -> dict[str, object]:
        """The report as JSON values (what ``pgsnap wal --json`` prints)."""
        return {
            "archive": self.location,
            "segment_size": self.segment_size,
            "timelines": [
                {
                    "missing_before_switch": [
                        {
                            "child": g.child,
                            "switchpoint": str(g.switchpoint),
                            "first": g.first,
                            "last": g.last,
                            "count": g.count,
                        }
                        for g in t.missing_before_switch
                    ],
                    "timeline": t.timeline,
                    "parent": t.parent,
                    "switchpoint": None if t.switchpoint is None else str(t.switchpoint),
                    "ranges": [list(r) for r in t.ranges],
                    "gaps": [list(g) for g in t.gaps],
                }
                for t in self.timelines
            ],
        }

    def explain(self) -> str:
        """The report as text, a line per run of segments (what ``pgsnap wal`` prints)."""
        lines = [f"WAL archive {self.location} ({self.segment_size // (1024 * 1024)} MB segments)"]
        for t in self.timelines:
            parent = f" (from {t.parent} at {t.switchpoint})" if t.parent else ""
            lines.append(f"timeline {t.timeline}{parent}")
            lines += [f"  present  {first} .. {last}" for first, last in t.ranges]
            lines += [f"  MISSING  {first} .. {last}" for first, last in t.gaps]
            lines += [
                f"  MISSING  {g.first} .. {g.last}  (before timeline {g.child} forks at "
                f"{g.switchpoint}: replay along timeline {g.child} needs them)"
                for g in t.missing_before_switch
            ]
        return "\n".join(lines)


def archive_report(
    location: str, index: ArchiveIndex, graph: TimelineGraph, segment_size: int
) -> ArchiveReport:
    """The archive per timeline, from its index and timeline graph: every timeline that
    has segments or a history file, oldest first."""
    before_switch = switch_gaps(index, graph)
    timelines = []
    for tli in sorted(set(index.timelines()) | set(graph.timelines())):
        known = tli in graph
        timelines.append(
            TimelineReport(
                timeline=tli,
                parent=graph.parent_of(tli) if known else None,
                switchpoint=(graph.switchpoint_of(tli) or None) if known else None,
                ranges=tuple(r.names(segment_size) for r in index.ranges(tli)),
                gaps=tuple(g.names(segment_size) for g in index.gaps(tli)),
                missing_before_switch=tuple(g for g in before_switch if g.parent == tli),
            )
        )
    return ArchiveReport(location, segment_size, tuple(timelines))
