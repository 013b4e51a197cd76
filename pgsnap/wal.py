"""WAL arithmetic, archive file names, timelines and the WAL archive index (pure).

Everything here is pure: no files, no clock, no network. The I/O that feeds it
(listing and reading an archive directory) lives in :mod:`pgsnap.archive`.

Sections:

* **segments** - segment sizes, LSN → segment number → file name and back
  (:func:`segment_name`, :func:`walfile_name`, :func:`parse_segment_name`);
* **archive names** - classify any file name found in an archive
  (:func:`parse_archive_name` → :class:`ArchiveEntry`);
* **timelines** - ``.history`` files (:func:`parse_history`) and the graph of
  timelines (:class:`TimelineGraph`): which timeline holds an LSN on the way to a
  target timeline, and where each timeline hands over to the next;
* **backup files** - ``.backup`` history files and ``backup_label``
  (:func:`parse_backup_file`, :func:`parse_backup_label`);
* **archive index** - contiguous segment ranges per timeline
  (:class:`ArchiveIndex`) and the WAL continuity check (:func:`check`);
* **archiver health** - :func:`archiver_health` from a ``pg_stat_archiver`` row.

Conventions: an end position is *exclusive* (WAL bytes ``[start, end)``), as
PostgreSQL's ``XLByteToPrevSeg`` does for a backup's stop location; segment
names are produced in upper case (PostgreSQL's form) and accepted in either case.
"""

from __future__ import annotations

import bisect
import collections
import datetime as dt
import enum
import itertools
import operator
import re
from collections.abc import Iterable, Iterator
from typing import Final

import attrs

from pgsnap.errors import (
    BackupFileError,
    HistoryFileError,
    LSNError,
    TimelineError,
    WalGapError,
    WalNameError,
)
from pgsnap.model import LSN, MAX_TIMELINE, ArchiverStatus

__all__ = [
    "COMPRESSION_SUFFIXES",
    "DEFAULT_SEGMENT_SIZE",
    "VALID_SEGMENT_SIZES",
    "ArchiveEntry",
    "ArchiveIndex",
    "ArchiverHealth",
    "BackupHistoryFile",
    "HistoryEntry",
    "SegmentRange",
    "SwitchGap",
    "TimelineGraph",
    "TimelineHistory",
    "TimelineSpan",
    "WalCheck",
    "WalFileKind",
    "archiver_health",
    "backup_file_name",
    "check",
    "history_file_name",
    "parse_archive_name",
    "parse_backup_file",
    "parse_backup_label",
    "parse_history",
    "parse_segment_name",
    "recoverable_window",
    "segment_name",
    "segment_number",
    "segment_start",
    "segments_per_xlogid",
    "segments_to_replay",
    "switch_gaps",
    "validate_segment_size",
    "walfile_name",
    "walfile_name_offset",
]

_U32: Final = 0xFFFFFFFF
_U64: Final = 0xFFFFFFFFFFFFFFFF

VALID_SEGMENT_SIZES: Final[tuple[int, ...]] = tuple(1 << n for n in range(20, 31))
"""Legal ``wal_segment_size`` values: the powers of two from 1 MiB to 1 GiB."""

DEFAULT_SEGMENT_SIZE: Final = 16 * 1024 * 1024
"""PostgreSQL's default segment size (16 MiB)."""

COMPRESSION_SUFFIXES: Final[tuple[str, ...]] = ("gz", "bz2", "xz", "lz4", "zst")
"""File-name suffixes recognised as a compressed copy of an archive file."""

_SEGSIZE_SET: Final = frozenset(VALID_SEGMENT_SIZES)


# =========================================================================== segments


def validate_segment_size(n: int) -> int:
    """Return ``n`` if it is a legal WAL segment size, else raise :class:`WalNameError`."""
    if isinstance(n, bool) or not isinstance(n, int) or n not in _SEGSIZE_SET:
        raise WalNameError(
            f"invalid WAL segment size {n!r}",
            hint="a WAL segment size is a power of two from 1 MiB to 1 GiB (bytes, e.g. "
            "16777216); read it with SHOW wal_segment_size",
            segment_size=n,
        )
    return n


def segments_per_xlogid(segment_size: int) -> int:
    """Segments per 4 GiB "log id" (the middle 8 hex digits of a name): 256 at 16 MiB."""
    return 0x100000000 // validate_segment_size(segment_size)


def _max_segno(segment_size: int) -> int:
    return _U64 // segment_size


def _check_timeline(timeline: int, what: str = "timeline") -> int:
    if isinstance(timeline, bool) or not isinstance(timeline, int) or not 1 <= timeline <= _U32:
        raise WalNameError(
            f"invalid {what} {timeline!r}",
            hint=f"a timeline id is an integer from 1 to {MAX_TIMELINE}",
            timeline=timeline,
        )
    return timeline


def _check_segno(segno: int, segment_size: int) -> int:
    if (
        isinstance(segno, bool)
        or not isinstance(segno, int)
        or not 0 <= segno <= _max_segno(segment_size)
    ):
        raise WalNameError(
            f"segment number {segno!r} is out of range for {segment_size}-byte segments",
            hint=f"a segment number is from 0 to {_max_segno(segment_size)} at this size",
            segno=segno,
        )
    return segno


def segment_number(lsn: LSN | str, segment_size: int) -> int:
    """The number of the segment that holds the byte at ``lsn`` (``lsn // segment_size``)."""
    return LSN.parse(lsn).value // validate_segment_size(segment_size)


def segment_start(segno: int, segment_size: int) -> LSN:
    """The LSN of the first byte of segment ``segno``."""
    validate_segment_size(segment_size)
    return LSN(_check_segno(segno, segment_size) * segment_size)


def segment_name(timeline: int, segno: int, segment_size: int) -> str:
    """The 24-hex-digit file name of segment ``segno`` on ``timeline``.

    >>> segment_name(1, 0x16B3, 16 * 1024 * 1024)
    '0000000100000016000000B3'
    """
    per_id = segments_per_xlogid(segment_size)
    _check_timeline(timeline)
    _check_segno(segno, segment_size)
    return f"{timeline:08X}{segno // per_id:08X}{segno % per_id:08X}"


def _walfile_segno(lsn: LSN, segment_size: int, previous_at_boundary: bool) -> int:
    if previous_at_boundary:
        # XLByteToPrevSeg: (lsn - 1) / segsz on an unsigned 64-bit value, so 0/0 wraps.
        return ((lsn.value - 1) & _U64) // segment_size
    return lsn.value // segment_size


def walfile_name(
    lsn: LSN | str,
    timeline: int,
    segment_size: int,
    *,
    previous_at_boundary: bool = False,
) -> str:
    """The name of the WAL file that holds ``lsn`` on ``timeline``.

    By default the LSN is taken at face value, as ``pg_walfile_name`` does on
    PostgreSQL 17+. With ``previous_at_boundary=True`` it follows PostgreSQL
    12-16, which map an LSN exactly at a segment start to the *previous* file
    (``XLByteToPrevSeg``; ``0/0`` wraps to ``FFFFFFFF000000FF`` at 16 MiB).
    """
    value = LSN.parse(lsn)
    validate_segment_size(segment_size)
    return segment_name(
        timeline, _walfile_segno(value, segment_size, previous_at_boundary), segment_size
    )


def walfile_name_offset(
    lsn: LSN | str,
    timeline: int,
    segment_size: int,
    *,
    previous_at_boundary: bool = False,
) -> tuple[str, int]:
    """``(name, offset)`` like ``pg_walfile_name_offset``.

    The offset is always ``lsn % segment_size``, also with
    ``previous_at_boundary=True`` (PostgreSQL 12-16 then report offset 0 in the
    previous file, and so does this function).
    """
    value = LSN.parse(lsn)
    name = walfile_name(value, timeline, segment_size, previous_at_boundary=previous_at_boundary)
    return name, value.value % segment_size


def parse_segment_name(name: str, segment_size: int) -> tuple[int, int]:
    """``(timeline, segno)`` of a 24-hex-digit segment name (either case).

    Raises :class:`WalNameError` for anything else, for timeline 0, and when the
    last 8 digits are not below :func:`segments_per_xlogid` for ``segment_size``
    (e.g. ``...00000100`` does not exist at 16 MiB).
    """
    per_id = segments_per_xlogid(segment_size)
    if not isinstance(name, str) or len(name) != 24 or _HEX24.fullmatch(name) is None:
        raise WalNameError(
            f"{name!r} is not a WAL segment name",
            hint="a segment name is 24 hex digits: timeline, log id and segment, "
            "e.g. 000000010000000000000003",
            name=name,
        )
    tli, log, seg = int(name[:8], 16), int(name[8:16], 16), int(name[16:], 16)
    if tli == 0:
        raise WalNameError(
            f"{name!r} names timeline 0, which does not exist",
            hint="timelines start at 1",
            name=name,
        )
    if seg >= per_id:
        raise WalNameError(
            f"{name!r} cannot exist with {segment_size}-byte segments: its segment part "
            f"{seg:#x} must be below {per_id:#x}",
            hint="check the cluster's wal_segment_size (SHOW wal_segment_size)",
            name=name,
            segment_size=segment_size,
        )
    return tli, log * per_id + seg


def history_file_name(timeline: int) -> str:
    """The name of a timeline's history file, e.g. ``00000002.history``."""
    return f"{_check_timeline(timeline):08X}.history"


def backup_file_name(start_lsn: LSN | str, timeline: int, segment_size: int) -> str:
    """The name of the ``.backup`` history file of a backup that started at ``start_lsn``.

    >>> backup_file_name(LSN.parse("0/4000028"), 1, 16 * 1024 * 1024)
    '000000010000000000000004.00000028.backup'
    """
    value = LSN.parse(start_lsn)
    name = walfile_name(value, timeline, segment_size)
    return f"{name}.{value.value % segment_size:08X}.backup"


# =========================================================================== archive names

_HEX24: Final = re.compile(r"[0-9A-Fa-f]{24}")
_ARCHIVE_NAME_RE: Final = re.compile(
    r"""
    (?:
        (?P<seg>[0-9A-Fa-f]{24})
        (?:
            \.(?P<off>[0-9A-Fa-f]{8})\.backup
          | (?:\.(?P<pcomp>gz|bz2|xz|lz4|zst))?(?P<partial>\.partial)
        )?
      | (?P<hist>[0-9A-Fa-f]{8})\.history
    )
    (?:\.(?P<comp>gz|bz2|xz|lz4|zst))?
    """,
    re.VERBOSE,
)


class WalFileKind(enum.Enum):
    """What a file in a WAL archive is."""

    SEGMENT = "segment"
    """A complete WAL segment (24 hex digits), possibly compressed."""
    PARTIAL = "partial"
    """A ``.partial`` segment: incomplete; never counts as the segment itself."""
    HISTORY = "history"
    """A timeline history file ``NNNNNNNN.history``."""
    BACKUP = "backup"
    """A backup history file ``<segment>.<offset>.backup``."""
    UNKNOWN = "unknown"
    """Anything else (temporary files, other tools' files, impossible names)."""


@attrs.frozen
class ArchiveEntry:
    """One file name of a WAL archive, classified (see :func:`parse_archive_name`).

    ``log`` and ``seg`` are the raw middle and last 8 hex digits of a segment
    name; the segment number needs the segment size (:meth:`segment_number`).
    ``backup_offset`` is the start LSN's offset in its segment for a ``.backup``
    file. ``compression`` is the compression suffix (``gz``, ``bz2``, ``xz``,
    ``lz4``, ``zst``) or None.
    """

    name: str
    kind: WalFileKind
    timeline: int | None = None
    log: int | None = None
    seg: int | None = None
    backup_offset: int | None = None
    compression: str | None = None

    @property
    def is_segment(self) -> bool:
        """True for a complete (possibly compressed) segment."""
        return self.kind is WalFileKind.SEGMENT

    def segment_number(self, segment_size: int) -> int | None:
        """The segment number for ``segment_size``, or None if not a segment-based name
        or impossible at that size."""
        if self.log is None or self.seg is None:
            return None
        per_id = segments_per_xlogid(segment_size)
        if self.seg >= per_id:
            return None
        return self.log * per_id + self.seg

    @property
    def base_name(self) -> str:
        """The PostgreSQL file name this entry stands for (upper case, no compression
        suffix), e.g. ``000000010000000000000003`` for ``000000010000000000000003.gz``;
        the name itself for UNKNOWN."""
        if self.kind is WalFileKind.UNKNOWN or self.timeline is None:
            return self.name
        if self.kind is WalFileKind.HISTORY:
            return f"{self.timeline:08X}.history"
        base = f"{self.timeline:08X}{self.log:08X}{self.seg:08X}"
        if self.kind is WalFileKind.PARTIAL:
            return base + ".partial"
        if self.kind is WalFileKind.BACKUP:
            return f"{base}.{self.backup_offset:08X}.backup"
        return base


def parse_archive_name(name: str) -> ArchiveEntry:
    """Classify a file name found in a WAL archive. Never raises for a ``str``.

    Recognised (hex in either case), each optionally followed by a compression
    suffix ``.gz``, ``.bz2``, ``.xz``, ``.lz4`` or ``.zst``:

    * ``<24 hex>`` → SEGMENT;
    * ``<24 hex>.partial`` → PARTIAL (also ``<24 hex>.gz.partial``, the name
      ``pg_receivewal --compress`` uses while a segment is being streamed);
    * ``<8 hex>.history`` → HISTORY;
    * ``<24 hex>.<8 hex>.backup`` → BACKUP.

    Timeline 0 and everything else → UNKNOWN. Whether the segment part fits the
    segment size is checked by :class:`ArchiveIndex` (it knows the size).
    """
    m = _ARCHIVE_NAME_RE.fullmatch(name) if isinstance(name, str) else None
    if m is None:
        return ArchiveEntry(name, WalFileKind.UNKNOWN)
    comp = m.group("comp")
    hist = m.group("hist")
    if hist is not None:
        tli = int(hist, 16)
        if tli == 0:
            return ArchiveEntry(name, WalFileKind.UNKNOWN)
        return ArchiveEntry(name, WalFileKind.HISTORY, timeline=tli, compression=comp)
    seg = m.group("seg")
    tli = int(seg[:8], 16)
    if tli == 0:
        return ArchiveEntry(name, WalFileKind.UNKNOWN)
    log, segpart = int(seg[8:16], 16), int(seg[16:], 16)
    if m.group("partial") is not None:
        pcomp = m.group("pcomp")
        if pcomp is not None and comp is not None:
            return ArchiveEntry(name, WalFileKind.UNKNOWN)  # compressed twice
        return ArchiveEntry(name, WalFileKind.PARTIAL, tli, log, segpart, compression=pcomp or comp)
    off = m.group("off")
    if off is not None:
        return ArchiveEntry(
            name, WalFileKind.BACKUP, tli, log, segpart, int(off, 16), compression=comp
        )
    return ArchiveEntry(name, WalFileKind.SEGMENT, tli, log, segpart, compression=comp)


# =========================================================================== timelines


@attrs.frozen
class HistoryEntry:
    """One line of a history file: ``parent`` ran until ``switchpoint``.

    The switchpoint is the first LSN *not* on ``parent`` for the descendants of
    this line: WAL on ``parent`` is part of their history up to, not including,
    ``switchpoint``.
    """

    parent: int
    switchpoint: LSN
    reason: str = ""


@attrs.frozen
class TimelineSpan:
    """A stretch of one timeline on the way to a target timeline.

    ``start`` is where the timeline begins (None: from the very beginning, a
    root timeline); ``end`` is the switchpoint where the next timeline on the
    path starts (None: open end, the target timeline). The span covers LSNs
    ``start <= lsn < end``; it may be empty when a timeline was left at the LSN
    where it began.
    """

    timeline: int
    start: LSN | None
    end: LSN | None

    def contains(self, lsn: LSN) -> bool:
        """True when ``start <= lsn < end`` (open bounds when None)."""
        return (self.start is None or self.start <= lsn) and (self.end is None or lsn < self.end)


def _validate_history(timeline: int, entries: tuple[HistoryEntry, ...]) -> None:
    if isinstance(timeline, bool) or not isinstance(timeline, int) or not 1 <= timeline <= _U32:
        raise HistoryFileError(
            f"invalid timeline {timeline!r} for a history",
            hint=f"a timeline id is an integer from 1 to {MAX_TIMELINE}",
            timeline=timeline,
        )
    prev: HistoryEntry | None = None
    for i, e in enumerate(entries, 1):
        _check_history_entry(timeline, e, prev, f"entry {i}")
        prev = e


def _check_history_entry(
    timeline: int, e: HistoryEntry, prev: HistoryEntry | None, where: str
) -> None:
    if not 1 <= e.parent < timeline:
        raise HistoryFileError(
            f"history of timeline {timeline}, {where}: parent timeline {e.parent} must be "
            f"between 1 and {timeline - 1}",
            hint="a timeline's ancestors have smaller ids; the file may be damaged or belong "
            "to another cluster",
            timeline=timeline,
            parent=e.parent,
        )
    if prev is not None and e.parent <= prev.parent:
        raise HistoryFileError(
            f"history of timeline {timeline}, {where}: parent timeline {e.parent} does not "
            f"follow {prev.parent} (timeline ids must increase)",
            hint="the file may be damaged or edited; restore it from the archive",
            timeline=timeline,
            parent=e.parent,
        )
    if prev is not None and e.switchpoint < prev.switchpoint:
        raise HistoryFileError(
            f"history of timeline {timeline}, {where}: switchpoint {e.switchpoint} is before "
            f"the previous switchpoint {prev.switchpoint}",
            hint="switchpoints never go back; the file may be damaged",
            timeline=timeline,
            switchpoint=str(e.switchpoint),
        )


def _entries_converter(value: Iterable[HistoryEntry]) -> tuple[HistoryEntry, ...]:
    return tuple(value)


@attrs.frozen
class TimelineHistory:
    """The content of ``<timeline>.history``: the ancestry of ``timeline``.

    ``entries`` lists the ancestors oldest first, each with the switchpoint at
    which the line towards ``timeline`` left it. Timeline 1 (and any timeline
    without a history file) has no entries.
    """

    timeline: int
    entries: tuple[HistoryEntry, ...] = attrs.field(default=(), converter=_entries_converter)

    def __attrs_post_init__(self) -> None:
        _validate_history(self.timeline, self.entries)

    @property
    def parents(self) -> tuple[int, ...]:
        """The ancestor timelines, oldest first."""
        return tuple(e.parent for e in self.entries)

    @property
    def ancestry(self) -> tuple[int, ...]:
        """The ancestors and the timeline itself, oldest first."""
        return (*self.parents, self.timeline)

    @property
    def parent(self) -> int | None:
        """The timeline this one branched from (None for a root timeline)."""
        return self.entries[-1].parent if self.entries else None

    @property
    def begin(self) -> LSN | None:
        """The LSN where this timeline begins (None for a root timeline)."""
        return self.entries[-1].switchpoint if self.entries else None

    def spans(self) -> tuple[TimelineSpan, ...]:
        """The spans of the ancestry, oldest first; the last one is this timeline."""
        out: list[TimelineSpan] = []
        start: LSN | None = None
        for e in self.entries:
            out.append(TimelineSpan(e.parent, start, e.switchpoint))
            start = e.switchpoint
        out.append(TimelineSpan(self.timeline, start, None))
        return tuple(out)

    def timeline_at(self, lsn: LSN) -> int:
        """The timeline that holds ``lsn`` on this history (PostgreSQL's
        ``tliOfPointInHistory``): a switchpoint belongs to the child."""
        for e in self.entries:
            if lsn < e.switchpoint:
                return e.parent
        return self.timeline

    def to_text(self) -> str:
        """The history file text PostgreSQL would write (``parent<TAB>X/Y<TAB>reason``)."""
        return "".join(f"{e.parent}\t{e.switchpoint}\t{e.reason}\n" for e in self.entries)


def parse_history(text: str, timeline: int) -> TimelineHistory:
    """Parse the text of ``<timeline>.history``.

    Lines are ``parentTLI<TAB>switchpoint<TAB>reason``; blank lines and ``#``
    lines are ignored (expect blank lines: reasons of time targets end in a
    newline). The reason may contain anything, tabs included; trailing
    whitespace is stripped and a missing reason is allowed (PostgreSQL does not
    require it). Parents must increase and be below ``timeline``, switchpoints
    must not decrease. Anything else raises :class:`HistoryFileError` naming the
    line.
    """
    if not isinstance(text, str):
        raise HistoryFileError(
            f"a history file must be text, not {type(text).__name__}",
            hint="decode the file (it is ASCII) before parsing",
        )
    _check_history_timeline(timeline)
    entries: list[HistoryEntry] = []
    prev: HistoryEntry | None = None
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip()
        stripped = line.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        parts = stripped.split("\t", 2)
        where = f"line {lineno}"
        if len(parts) < 2 or not parts[0].isascii() or not parts[0].isdigit():
            raise HistoryFileError(
                f"history of timeline {timeline}, {where}: expected "
                f"'parentTLI<TAB>switchpoint<TAB>reason', got {raw!r}",
                hint="the file may be damaged or not a timeline history file",
                timeline=timeline,
                line=lineno,
            )
        try:
            switchpoint = LSN.parse(parts[1])
        except LSNError:
            raise HistoryFileError(
                f"history of timeline {timeline}, {where}: malformed switchpoint {parts[1]!r}",
                hint="a switchpoint is an LSN like 0/5000EC0",
                timeline=timeline,
                line=lineno,
            ) from None
        entry = HistoryEntry(int(parts[0]), switchpoint, parts[2] if len(parts) > 2 else "")
        _check_history_entry(timeline, entry, prev, where)
        entries.append(entry)
        prev = entry
    return TimelineHistory(timeline, tuple(entries))


def _check_history_timeline(timeline: int) -> None:
    if isinstance(timeline, bool) or not isinstance(timeline, int) or not 1 <= timeline <= _U32:
        raise HistoryFileError(
            f"invalid timeline {timeline!r} for a history file",
            hint="pass the timeline from the file name (00000003.history → 3)",
            timeline=timeline,
        )


def _same_line(a: tuple[HistoryEntry, ...], b: tuple[HistoryEntry, ...]) -> bool:
    return len(a) == len(b) and all(
        x.parent == y.parent and x.switchpoint == y.switchpoint for x, y in zip(a, b, strict=True)
    )


class TimelineGraph:
    """All known timelines and how they branch, built from history files.

    Timeline 1 is always known. A history file holds the whole ancestry of its
    timeline, so ancestors whose own ``.history`` is missing are derived from
    their descendants. Histories that disagree about a shared ancestry raise
    :class:`HistoryFileError`; asking about a timeline that is not known (its
    history file is missing) raises :class:`TimelineError`.
    """

    __slots__ = ("_histories",)

    def __init__(self, histories: Iterable[TimelineHistory] = ()) -> None:
        """Build from histories (any order); see :meth:`from_histories`."""
        known: dict[int, TimelineHistory] = {1: TimelineHistory(1)}
        given = sorted(histories, key=lambda h: (h.timeline, len(h.entries)))
        for h in given:
            old = known.get(h.timeline)
            if old is not None and not _same_line(old.entries, h.entries):
                raise _conflict(h.timeline, old, h)
            known[h.timeline] = h
        # Derive missing ancestors and cross-check shared ancestry.
        for h in sorted(known.values(), key=lambda h: -h.timeline):
            for i, e in enumerate(h.entries):
                prefix = h.entries[:i]
                anc = known.get(e.parent)
                if anc is None:
                    known[e.parent] = TimelineHistory(e.parent, prefix)
                elif not _same_line(anc.entries, prefix):
                    raise _conflict(e.parent, anc, TimelineHistory(e.parent, prefix), h.timeline)
        self._histories: dict[int, TimelineHistory] = dict(sorted(known.items()))

    @classmethod
    def from_histories(cls, histories: Iterable[TimelineHistory]) -> TimelineGraph:
        """Build the graph from parsed history files (timeline 1 is implicit)."""
        return cls(histories)

    @property
    def histories(self) -> tuple[TimelineHistory, ...]:
        """Every known timeline's history (given or derived), by timeline."""
        return tuple(self._histories.values())

    def timelines(self) -> tuple[int, ...]:
        """Every known timeline id, ascending."""
        return tuple(self._histories)

    def latest(self) -> int:
        """The highest known timeline id (what ``recovery_target_timeline='latest'`` picks)."""
        return max(self._histories)

    def __contains__(self, timeline: object) -> bool:
        return timeline in self._histories

    def history(self, timeline: int) -> TimelineHistory:
        """The history of ``timeline``; :class:`TimelineError` if it is not known."""
        h = self._histories.get(timeline)
        if h is None:
            name = f"{timeline:08X}.history" if isinstance(timeline, int) and timeline > 0 else "?"
            raise TimelineError(
                f"timeline {timeline} is not known: no history file {name} was found",
                hint=f"copy {name} into the archive, or pick one of the known timelines "
                f"{', '.join(map(str, self._histories))}",
                timeline=timeline,
                missing_history=name,
            )
        return h

    def parent_of(self, timeline: int) -> int | None:
        """The timeline ``timeline`` branched from (None for timeline 1 / a root)."""
        return self.history(timeline).parent

    def switchpoint_of(self, timeline: int) -> LSN | None:
        """The LSN where ``timeline`` begins, i.e. its parent's switchpoint (None for a root)."""
        return self.history(timeline).begin

    def children_of(self, timeline: int) -> tuple[int, ...]:
        """Timelines that branched directly from ``timeline``, ascending."""
        return tuple(t for t, h in self._histories.items() if h.parent == timeline)

    def ancestry(self, timeline: int) -> tuple[int, ...]:
        """``timeline``'s ancestors and itself, oldest first."""
        return self.history(timeline).ancestry

    def path(
        self, target_timeline: int, from_timeline: int | None = None
    ) -> tuple[TimelineSpan, ...]:
        """The spans from ``from_timeline`` (default: the root) to ``target_timeline``.

        Raises :class:`TimelineError` when ``from_timeline`` is not an ancestor
        of (or equal to) the target.
        """
        spans = self.history(target_timeline).spans()
        if from_timeline is None:
            return spans
        for i, s in enumerate(spans):
            if s.timeline == from_timeline:
                return spans[i:]
        raise TimelineError(
            f"timeline {from_timeline} is not in the history of timeline {target_timeline} "
            f"(its ancestry is {' → '.join(str(s.timeline) for s in spans)})",
            hint="PostgreSQL would refuse with 'requested timeline is not a child of this "
            "server's history'; choose a target timeline that descends from the backup's "
            "timeline (recovery_target_timeline='current' stays on it)",
            timeline=from_timeline,
            target_timeline=target_timeline,
        )

    def timeline_at(self, lsn: LSN, target_timeline: int) -> int:
        """The timeline that holds ``lsn`` in the history of ``target_timeline``.

        Like PostgreSQL's ``tliOfPointInHistory``: a timeline holds
        ``begin <= lsn < switchpoint``; the switchpoint itself is the first byte
        of the child.
        """
        return self.history(target_timeline).timeline_at(LSN.parse(lsn))

    def contains(self, timeline: int, lsn: LSN, target_timeline: int) -> bool:
        """Whether WAL position ``lsn`` on ``timeline`` is part of ``target_timeline``'s history.

        True when ``timeline`` is on the target's ancestry and ``lsn`` lies in
        its span (``begin <= lsn < switchpoint``). This is PostgreSQL's check
        of the backup's checkpoint against the requested timeline.
        """
        return self.timeline_at(lsn, target_timeline) == timeline

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TimelineGraph):
            return NotImplemented
        return self._histories == other._histories

    def __hash__(self) -> int:
        return hash(tuple(self._histories.values()))

    def __repr__(self) -> str:
        parts = [
            f"{t}<-{h.parent}@{h.begin}" if h.parent is not None else str(t)
            for t, h in self._histories.items()
        ]
        return f"TimelineGraph({', '.join(parts)})"


def _conflict(
    timeline: int, a: TimelineHistory, b: TimelineHistory, via: int | None = None
) -> HistoryFileError:
    src = f" (as recorded in {via:08X}.history)" if via is not None else ""
    return HistoryFileError(
        f"conflicting histories for timeline {timeline}: {_describe(a)} vs {_describe(b)}{src}",
        hint="the archive holds history files of different clusters or damaged files; "
        "keep one cluster per archive and restore the files from a good copy",
        timeline=timeline,
    )


def _describe(h: TimelineHistory) -> str:
    return " → ".join(f"{e.parent}@{e.switchpoint}" for e in h.entries) or "(root)"


# =========================================================================== backup files


@attrs.frozen
class BackupHistoryFile:
    """A parsed ``.backup`` history file or ``backup_label``.

    A ``backup_label`` has no STOP lines, so the ``stop_*`` fields are None.
    Times are aware datetimes when the zone printed by PostgreSQL (``%Z`` of
    ``log_timezone``) could be resolved: ``UTC``/``GMT``, numeric offsets such
    as ``+03`` or ``-03:30``, or an abbreviation that matches the
    ``log_timezone`` passed to the parser. Otherwise the time is None and the
    text is kept in ``start_time_text``/``stop_time_text`` (always set when the
    line was present).
    """

    start_lsn: LSN
    start_wal_file: str
    checkpoint_lsn: LSN
    start_timeline: int
    stop_lsn: LSN | None = None
    stop_wal_file: str | None = None
    stop_timeline: int | None = None
    backup_method: str | None = None
    backup_from: str | None = None
    start_time: dt.datetime | None = None
    stop_time: dt.datetime | None = None
    label: str | None = None
    start_time_text: str | None = None
    stop_time_text: str | None = None
    incremental_from_lsn: LSN | None = None
    incremental_from_tli: int | None = None

    @property
    def is_incremental(self) -> bool:
        """True for a PostgreSQL 17+ incremental backup (``INCREMENTAL FROM`` lines)."""
        return self.incremental_from_lsn is not None


_LOC_RE: Final = re.compile(r"([0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}) \(file ([0-9A-Fa-f]{24})\)")
_TIME_RE: Final = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{1,6})?)(?: (\S+))?")
_OFFSET_RE: Final = re.compile(r"([+-])(\d{1,2})(?::?(\d{2}))?(?::?(\d{2}))?")


def _parse_pg_time(text: str, zone: dt.tzinfo | None) -> dt.datetime | None:
    """Parse ``%Y-%m-%d %H:%M:%S %Z``; None when the zone cannot be resolved."""
    m = _TIME_RE.fullmatch(text.strip())
    if m is None:
        return None
    try:
        naive = dt.datetime.fromisoformat(m.group(1))
    except ValueError:
        return None
    abbrev = m.group(2)
    if abbrev is None:
        return None
    if abbrev.upper() in ("UTC", "GMT", "UCT", "Z", "ZULU", "UNIVERSAL"):
        return naive.replace(tzinfo=dt.UTC)
    om = _OFFSET_RE.fullmatch(abbrev)
    if om is not None:
        sign = -1 if om.group(1) == "-" else 1
        h, mi, s = int(om.group(2)), int(om.group(3) or 0), int(om.group(4) or 0)
        if h > 15 or mi > 59 or s > 59:
            return None
        offset = dt.timedelta(hours=h, minutes=mi, seconds=s) * sign
        return naive.replace(tzinfo=dt.timezone(offset))
    if zone is not None:
        for fold in (0, 1):
            cand = naive.replace(tzinfo=zone, fold=fold)
            if cand.tzname() == abbrev:
                return cand
    return None


def _bad_backup(msg: str, what: str, **details: object) -> BackupFileError:
    return BackupFileError(
        f"{what}: {msg}",
        hint=f"pass the exact text of the {what} as PostgreSQL wrote it",
        **details,
    )


def _parse_backup_text(
    text: str, what: str, *, need_stop: bool, log_timezone: dt.tzinfo | None
) -> BackupHistoryFile:
    if not isinstance(text, str):
        raise _bad_backup(f"expected text, not {type(text).__name__}", what)
    fields: dict[str, tuple[int, str]] = {}
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip("\r")
        key, sep, value = line.partition(": ")
        if not sep:
            if line.endswith(":"):  # e.g. "LABEL:" with an empty value
                key, value = line[:-1], ""
            else:
                continue  # unknown or blank lines are ignored
        key = key.strip().upper()
        fields.setdefault(key, (lineno, value))

    def loc(key: str) -> tuple[LSN, str] | None:
        got = fields.get(key)
        if got is None:
            return None
        lineno, value = got
        m = _LOC_RE.fullmatch(value.strip())
        if m is None:
            raise _bad_backup(
                f"line {lineno}: {key} must look like '0/4000028 (file "
                f"000000010000000000000004)', got {value!r}",
                what,
                line=lineno,
            )
        return LSN.parse(m.group(1)), m.group(2).upper()

    def lsn(key: str) -> LSN | None:
        got = fields.get(key)
        if got is None:
            return None
        lineno, value = got
        try:
            return LSN.parse(value.strip())
        except LSNError:
            raise _bad_backup(
                f"line {lineno}: {key} is not an LSN: {value!r}", what, line=lineno
            ) from None

    def tli(key: str) -> int | None:
        got = fields.get(key)
        if got is None:
            return None
        lineno, value = got
        v = value.strip()
        if not (v.isascii() and v.isdigit()) or not 1 <= int(v) <= _U32:
            raise _bad_backup(
                f"line {lineno}: {key} is not a timeline id: {value!r}", what, line=lineno
            )
        return int(v)

    def text_of(key: str) -> str | None:
        got = fields.get(key)
        return None if got is None else got[1].strip()

    start = loc("START WAL LOCATION")
    if start is None:
        raise _bad_backup("no 'START WAL LOCATION' line", what)
    checkpoint = lsn("CHECKPOINT LOCATION")
    if checkpoint is None:
        raise _bad_backup("no 'CHECKPOINT LOCATION' line", what)
    stop = loc("STOP WAL LOCATION")
    if need_stop and stop is None:
        raise _bad_backup(
            "no 'STOP WAL LOCATION' line (is this a backup_label? use parse_backup_label)", what
        )
    start_file_tli = int(start[1][:8], 16)
    start_tli = tli("START TIMELINE")
    if start_tli is None:
        start_tli = start_file_tli
    elif start_tli != start_file_tli:
        raise _bad_backup(
            f"START TIMELINE {start_tli} does not match the start file {start[1]}", what
        )
    stop_tli = tli("STOP TIMELINE") if need_stop else None
    if stop is not None and need_stop:
        stop_file_tli = int(stop[1][:8], 16)
        if stop_tli is None:
            stop_tli = stop_file_tli
        elif stop_tli != stop_file_tli:
            raise _bad_backup(
                f"STOP TIMELINE {stop_tli} does not match the stop file {stop[1]}", what
            )
        if stop[0] < start[0]:
            raise _bad_backup(
                f"STOP WAL LOCATION {stop[0]} is before START WAL LOCATION {start[0]}", what
            )
    start_time_text = text_of("START TIME")
    stop_time_text = text_of("STOP TIME") if need_stop else None
    label_got = fields.get("LABEL")
    return BackupHistoryFile(
        start_lsn=start[0],
        start_wal_file=start[1],
        checkpoint_lsn=checkpoint,
        start_timeline=start_tli,
        stop_lsn=stop[0] if need_stop and stop is not None else None,
        stop_wal_file=stop[1] if need_stop and stop is not None else None,
        stop_timeline=stop_tli,
        backup_method=text_of("BACKUP METHOD"),
        backup_from=text_of("BACKUP FROM"),
        start_time=None
        if start_time_text is None
        else _parse_pg_time(start_time_text, log_timezone),
        stop_time=None if stop_time_text is None else _parse_pg_time(stop_time_text, log_timezone),
        label=None if label_got is None else label_got[1],
        start_time_text=start_time_text,
        stop_time_text=stop_time_text,
        incremental_from_lsn=lsn("INCREMENTAL FROM LSN"),
        incremental_from_tli=tli("INCREMENTAL FROM TLI"),
    )


def parse_backup_file(text: str, *, log_timezone: dt.tzinfo | None = None) -> BackupHistoryFile:
    """Parse a ``.backup`` history file (``<segment>.<offset>.backup`` in the archive).

    Requires the START WAL LOCATION, STOP WAL LOCATION and CHECKPOINT LOCATION
    lines; other known lines are optional and unknown lines are ignored. The
    label is everything after ``LABEL: `` (it may contain ``:``). Pass
    ``log_timezone`` (e.g. ``zoneinfo.ZoneInfo("Europe/Berlin")``, the server's
    ``log_timezone``) to resolve zone abbreviations like ``CET``.
    """
    return _parse_backup_text(
        text, "backup history file", need_stop=True, log_timezone=log_timezone
    )


def parse_backup_label(text: str, *, log_timezone: dt.tzinfo | None = None) -> BackupHistoryFile:
    """Parse a ``backup_label`` (the ``labelfile`` of ``pg_backup_stop``): no stop fields."""
    return _parse_backup_text(text, "backup_label", need_stop=False, log_timezone=log_timezone)


# =========================================================================== archive index


@attrs.frozen(order=True)
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


@attrs.frozen
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


@attrs.frozen
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


@attrs.frozen
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


@attrs.frozen
class ArchiverHealth:
    """Whether WAL archiving works: ``reasons`` (blocking) and ``warnings`` (not blocking).

    Each reason and warning is a sentence that says what is wrong and what to do.
    """

    healthy: bool
    reasons: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


_NEG_INF: Final = dt.datetime.min.replace(tzinfo=dt.UTC)


def _history_tli(name: str | None) -> int | None:
    if name is None:
        return None
    e = parse_archive_name(name.strip())
    return e.timeline if e.kind is WalFileKind.HISTORY else None


def _wal_tli(name: str | None) -> int | None:
    if name is None:
        return None
    e = parse_archive_name(name.strip())
    return e.timeline if e.kind is not WalFileKind.UNKNOWN else None


def archiver_health(
    status: ArchiverStatus,
    *,
    max_ready_age_seconds: float = 300,
    server_version: int | None = None,
) -> ArchiverHealth:
    """Judge WAL archiving from a ``pg_stat_archiver`` row and the archiving settings.

    Rules (blocking unless noted):

    * ``wal_level`` must be ``replica`` or ``logical``;
    * ``archive_mode`` must be ``on`` or ``always``;
    * ``archive_command`` or ``archive_library`` must be set; both set is an
      error from PostgreSQL 16 (``server_version`` >= 160000, or unknown) and a
      warning on 15, where ``archive_library`` wins;
    * CloudNativePG's rule: the last success must be newer than the last failure
      (a missing time counts as minus infinity) - except Barman's case of a
      failed ``.history`` file whose timeline is not above the last archived
      file's timeline (usually the file already exists in the archive), which
      is only a warning;
    * the oldest ``.ready`` file must not be older than ``max_ready_age_seconds``.
    """
    reasons: list[str] = []
    warnings: list[str] = []
    wal_level = (status.wal_level or "").strip().lower()
    if wal_level not in ("replica", "logical"):
        reasons.append(
            f"wal_level is {status.wal_level!r}; set wal_level = replica (or logical) and "
            "restart PostgreSQL so that WAL can be archived and backups restored"
        )
    mode = (status.archive_mode or "").strip().lower()
    if mode not in ("on", "always"):
        reasons.append(
            f"archive_mode is {status.archive_mode!r}; set archive_mode = on (always for "
            "backups taken from a standby) and restart PostgreSQL"
        )
    command = (status.archive_command or "").strip()
    library = (status.archive_library or "").strip()
    if command == "(disabled)":
        command = ""
    if not command and not library:
        reasons.append(
            "neither archive_command nor archive_library is set, so WAL piles up in pg_wal "
            "and nothing reaches the archive; set archive_command (e.g. a copy into the "
            "archive directory) and reload"
        )
    elif command and library:
        msg = (
            "both archive_command and archive_library are set; PostgreSQL 16 and later "
            "refuse to archive with both - clear one of them and reload"
        )
        if server_version is not None and server_version < 160000:
            warnings.append(
                "both archive_command and archive_library are set; archive_library is used "
                "and archive_command ignored - clear archive_command to avoid confusion"
            )
        else:
            reasons.append(msg)
    failed_at = status.last_failed_time
    archived_at = status.last_archived_time
    if failed_at is not None and (archived_at or _NEG_INF) <= failed_at:
        failed_hist = _history_tli(status.last_failed_wal)
        archived_tli = _wal_tli(status.last_archived_wal)
        if failed_hist is not None and archived_tli is not None and failed_hist <= archived_tli:
            warnings.append(
                f"archiving of {status.last_failed_wal} failed at {failed_at.isoformat()}, but "
                f"it is a history file of a timeline not newer than the last archived file "
                f"{status.last_archived_wal}; it usually already exists in the archive - check "
                "that the copy there is identical"
            )
        else:
            when = (
                "never succeeded"
                if archived_at is None
                else (f"last succeeded at {archived_at.isoformat()}")
            )
            reasons.append(
                f"WAL archiving is failing: {status.last_failed_wal or 'a file'} failed at "
                f"{failed_at.isoformat()} and archiving {when} ({status.failed_count} failures "
                "since the statistics reset); check the PostgreSQL log for the archive_command "
                "error and fix the archive (space, permissions, mount)"
            )
    elif status.failed_count and failed_at is not None:
        warnings.append(
            f"{status.failed_count} archive failures since the statistics reset (last at "
            f"{failed_at.isoformat()}); archiving has recovered since"
        )
    if status.archived_count == 0 and archived_at is None and failed_at is None:
        warnings.append(
            "nothing has been archived yet; run SELECT pg_switch_wal() and check that the "
            "segment arrives in the archive"
        )
    age = status.oldest_ready_age_seconds
    if age is not None and age > max_ready_age_seconds:
        reasons.append(
            f"the oldest WAL file waiting to be archived (.ready) is {age:.0f} s old (limit "
            f"{max_ready_age_seconds:.0f} s); the archiver is failing or too slow - check the "
            "PostgreSQL log and the archive's speed and free space"
        )
    return ArchiverHealth(not reasons, tuple(reasons), tuple(warnings))
