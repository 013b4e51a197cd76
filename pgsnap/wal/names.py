"""Segment arithmetic and the names of WAL archive files (pure).

Segment sizes, LSN → segment number → file name and back
(:func:`segment_name`, :func:`walfile_name`, :func:`parse_segment_name`), and
what any file name found in an archive is (:func:`parse_archive_name` →
:class:`ArchiveEntry`). Segment names are produced in upper case (PostgreSQL's
form) and accepted in either case; an end position is *exclusive* (WAL bytes
``[start, end)``), as PostgreSQL's ``XLByteToPrevSeg`` does for a backup's stop
location.
"""

from __future__ import annotations

import enum
import re
from typing import Final

from pgsnap._attrs import frozen
from pgsnap.errors import (
    WalNameError,
)
from pgsnap.model import LSN, MAX_TIMELINE

__all__ = [
    "COMPRESSION_SUFFIXES",
    "DEFAULT_SEGMENT_SIZE",
    "VALID_SEGMENT_SIZES",
    "ArchiveEntry",
    "WalFileKind",
    "backup_file_name",
    "history_file_name",
    "parse_archive_name",
    "parse_segment_name",
    "segment_name",
    "segment_number",
    "segment_start",
    "segments_per_xlogid",
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


@frozen
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
