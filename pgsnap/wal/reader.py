"""Read PostgreSQL 12-18 WAL segments in pure Python: what recovery targets need.

This is observation (I/O): it reads segment files (plain, or compressed with
gzip, bzip2 or xz from the standard library, or zstd and lz4 through a
``zstandard``/``lz4`` module or a ``zstd``/``lz4`` program) from one or more
sources - directories (:class:`WalDirectory`) or WAL archives, read only
through their ``stat`` and ``open`` (:class:`~pgsnap.wal.files.WalFiles`) -
and walks the records along a timeline path, the way PostgreSQL's replay
reads them (``xlogreader.c``), without ``pg_waldump``.

It extracts only what recovery targets need and skips every other record by
its length without decoding it:

* transaction ends (:class:`XactRecord`): ``COMMIT``, ``ABORT``,
  ``COMMIT_PREPARED`` and ``ABORT_PREPARED`` with the transaction id (for the
  prepared variants the prepared transaction's, from the record's two-phase
  part, as ``recovery_target_xid`` matches it), the time and the record's
  start and end;
* restore points (:class:`RestorePointRecord`), checkpoints
  (:class:`CheckpointRecord`), end-of-recovery records
  (:class:`EndOfRecoveryRecord`), WAL switches (:class:`SwitchRecord`), ends of
  online backups (:class:`BackupEndRecord`) and the records that replace a lost
  continuation (:class:`OverwriteContrecordRecord`);
* where the path moves to the next timeline (:class:`TimelineSwitch`), each
  segment file read (:class:`SegmentRead`), and where the valid WAL ends
  (:class:`EndOfWal`): a torn or zero-filled tail, a record whose ``xl_prev``
  does not link to the previous record, a bad checksum, a page whose magic,
  address or timeline is wrong - the place where PostgreSQL's replay stops;
* last, how the scan ended (:class:`ScanEnd`).

:func:`read_wal` is the streaming API (an iterator of those records; memory is
bounded by one read chunk - the segment, at most 16 MiB - plus the records
decoded in the last 16 MiB of WAL, whatever the archive's size);
:func:`scan_events` wraps it into a
:class:`~pgsnap.planner.facts.WalEvents` and takes the same inputs as
:func:`pgsnap.wal.dump.scan_wal` (minus the ``pg_waldump`` path).

Validation (see ``docs/reference/walreader.md``): every page header is checked
(magic of the version, flags, address, timeline order and membership in the
path, the long header's system identifier, segment and block size), every
record header is checked (length, resource manager, ``xl_prev`` chain) and
continuations are checked against ``xlp_rem_len``. The CRC-32C of every record
that is decoded is checked; with :attr:`Verify.TAIL` (the default) so is every
record of the last 16 MiB before an end of valid WAL, so a torn tail is
found where replay finds it; :attr:`Verify.ALL` checks every record.

Errors are :class:`~pgsnap.errors.ArchiveError` naming the file (and offset):
a file that cannot be read or decompressed, that has the wrong size, or that
belongs to another cluster (system identifier), and a first page that is not
WAL of a supported version. Anything replay would treat as the end of the WAL
is an :class:`EndOfWal` result, never an exception.
"""

from __future__ import annotations

import bz2
import collections
import datetime as dt
import enum
import gzip
import importlib
import logging
import lzma
import os
import shutil
import stat
import struct
import subprocess
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import IO, Any, Final, NoReturn, Protocol

import attrs

from pgsnap._attrs import define, frozen
from pgsnap.errors import ArchiveError, InputError
from pgsnap.model import LSN
from pgsnap.wal._crc32c import crc32c
from pgsnap.wal.events import WalEvents
from pgsnap.wal.files import ArchivedFile, ReadStream, WalFiles, check_file_name
from pgsnap.wal.names import (
    COMPRESSION_SUFFIXES,
    WalFileKind,
    parse_archive_name,
    segment_name,
    validate_segment_size,
)
from pgsnap.wal.timelines import TimelineSpan

__all__ = [
    "PAGE_MAGIC",
    "BackupEndRecord",
    "CheckpointRecord",
    "EndOfRecoveryRecord",
    "EndOfWal",
    "OverwriteContrecordRecord",
    "PageHeader",
    "RestorePointRecord",
    "ScanEnd",
    "SegmentHeader",
    "SegmentRead",
    "StopReason",
    "SwitchRecord",
    "TimelineSwitch",
    "Verify",
    "WalDirectory",
    "WalItem",
    "WalSource",
    "XactKind",
    "XactRecord",
    "archived_segment_problem",
    "find_segment",
    "find_segment_file",
    "parse_page_header",
    "read_archived_segment_header",
    "read_segment_header",
    "read_wal",
    "scan_events",
    "segment_problem",
    "stat_segment_file",
]

log = logging.getLogger(__name__)

# =========================================================================== formats

PAGE_MAGIC: Final[Mapping[int, int]] = MappingProxyType(
    {
        12: 0xD101,
        13: 0xD106,
        14: 0xD10D,
        15: 0xD110,
        16: 0xD113,
        17: 0xD116,
        18: 0xD118,
    }
)
"""``XLOG_PAGE_MAGIC`` (``src/include/access/xlog_internal.h``) of each major version."""

_MAJOR_OF_MAGIC: Final = {magic: major for major, magic in PAGE_MAGIC.items()}

# xlp_info flags (xlog_internal.h, PostgreSQL 12-18).
_XLP_FIRST_IS_CONTRECORD: Final = 0x0001
_XLP_LONG_HEADER: Final = 0x0002
_XLP_BKP_REMOVABLE: Final = 0x0004  # set on most pages; means nothing to a reader
_XLP_FIRST_IS_OVERWRITE_CONTRECORD: Final = 0x0008
_XLP_ALL_FLAGS: Final = 0x000F

_SHORT_PHD: Final = 24  # MAXALIGN(sizeof(XLogPageHeaderData))
_LONG_PHD: Final = 40  # MAXALIGN(sizeof(XLogLongPageHeaderData))
_REC_HDR: Final = 24  # SizeOfXLogRecord

_PAGE_HEADER: Final = struct.Struct("<HHIQI")  # magic, info, tli, pageaddr, rem_len
_PAGE_ADDRESS: Final = struct.Struct("<HHIQ")  # its first 16 bytes
_LONG_TAIL: Final = struct.Struct("<QII")  # sysid, seg_size, xlog_blcksz (at offset 24)
_RECORD: Final = struct.Struct("<IIQBB")  # tot_len, xid, prev, info, rmid (crc at 20)
_U16: Final = struct.Struct("<H")
_U32: Final = struct.Struct("<I")
_I32: Final = struct.Struct("<i")
_U64: Final = struct.Struct("<Q")
_I64: Final = struct.Struct("<q")

# Resource managers and record types (rmgrlist.h, pg_control.h, xact.h).
_RM_XLOG: Final = 0
_RM_XACT: Final = 1
_RM_MAX_BUILTIN: Final = 21  # RM_LOGICALMSG_ID, the last built-in one in 12-18
_XLOG_CHECKPOINT_SHUTDOWN: Final = 0x00
_XLOG_CHECKPOINT_ONLINE: Final = 0x10
_XLOG_SWITCH: Final = 0x40
_XLOG_BACKUP_END: Final = 0x50
_XLOG_RESTORE_POINT: Final = 0x70
_XLOG_END_OF_RECOVERY: Final = 0x90
_XLOG_OVERWRITE_CONTRECORD: Final = 0xD0
_XACT_COMMIT: Final = 0x00
_XACT_ABORT: Final = 0x20
_XACT_COMMIT_PREPARED: Final = 0x30
_XACT_ABORT_PREPARED: Final = 0x40
_XACT_OPMASK: Final = 0x70
_XACT_HAS_INFO: Final = 0x80
_XINFO_DBINFO: Final = 1 << 0
_XINFO_SUBXACTS: Final = 1 << 1
_XINFO_RELFILENODES: Final = 1 << 2
_XINFO_INVALS: Final = 1 << 3
_XINFO_TWOPHASE: Final = 1 << 4
_XINFO_DROPPED_STATS: Final = 1 << 8

_XLOG_INTERESTING: Final = frozenset(
    {
        _XLOG_CHECKPOINT_SHUTDOWN,
        _XLOG_CHECKPOINT_ONLINE,
        _XLOG_SWITCH,
        _XLOG_BACKUP_END,
        _XLOG_RESTORE_POINT,
        _XLOG_END_OF_RECOVERY,
        _XLOG_OVERWRITE_CONTRECORD,
    }
)
_XACT_INTERESTING: Final = frozenset(
    {_XACT_COMMIT, _XACT_ABORT, _XACT_COMMIT_PREPARED, _XACT_ABORT_PREPARED}
)


def _interesting_table() -> bytes:
    """``table[rmid << 8 | xl_info]`` is 1 for the records this module decodes."""
    table = bytearray(65536)
    for info in range(256):
        if info & 0xF0 in _XLOG_INTERESTING:
            table[(_RM_XLOG << 8) | info] = 1
        if info & _XACT_OPMASK in _XACT_INTERESTING:
            table[(_RM_XACT << 8) | info] = 1
    return bytes(table)


_INTERESTING: Final = _interesting_table()

_PG_EPOCH: Final = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
_UNIX_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_INF: Final = 1 << 64


@frozen
class _Format:
    """What differs between the major versions for this reader."""

    major: int
    magic: int
    custom_rmgrs: bool
    """Resource manager ids 128-255 are valid (custom resource managers, 15+)."""
    toplevel_xid: bool
    """Block id 252 (``XLR_BLOCK_ID_TOPLEVEL_XID``) exists (14+)."""
    compressed_mask: int
    """``bimg_info`` bits meaning "compressed image": 0x02 up to 14, 0x04|0x08|0x10 from 15."""
    stats_item_size: int
    """``sizeof(xl_xact_stats_item)``: 12 in 15-17, 16 in 18; 0 before 15 (no dropped stats)."""

    @classmethod
    def of(cls, major: int) -> _Format:
        return cls(
            major=major,
            magic=PAGE_MAGIC[major],
            custom_rmgrs=major >= 15,
            toplevel_xid=major >= 14,
            compressed_mask=0x02 if major <= 14 else 0x1C,
            stats_item_size=0 if major <= 14 else (12 if major <= 17 else 16),
        )

    def valid_rmids(self) -> bytes:
        ok = bytearray(256)
        for rmid in range(256):
            ok[rmid] = rmid <= _RM_MAX_BUILTIN or (self.custom_rmgrs and rmid >= 128)
        return bytes(ok)


# =========================================================================== records


class Verify(enum.Enum):
    """Which records' CRC-32C the reader checks (every header is always checked)."""

    RECORDS = "records"
    """The records it decodes (commits, restore points...), nothing else."""
    TAIL = "tail"
    """As RECORDS, plus every record of the last 16 MiB (two segments when that
    is less) before an end of valid WAL, so a torn tail ends the WAL where replay
    ends it (the default). The records read in that last stretch are held back
    until they are known to be good."""
    ALL = "all"
    """Every record: what replay checks, several times slower."""


class XactKind(enum.Enum):
    """The kind of a transaction's end record."""

    COMMIT = "commit"
    ABORT = "abort"
    COMMIT_PREPARED = "commit_prepared"
    ABORT_PREPARED = "abort_prepared"

    @property
    def committed(self) -> bool:
        """True for the commits (plain and prepared)."""
        return self in (XactKind.COMMIT, XactKind.COMMIT_PREPARED)

    @property
    def prepared(self) -> bool:
        """True for the ends of prepared transactions."""
        return self in (XactKind.COMMIT_PREPARED, XactKind.ABORT_PREPARED)


_PLAIN_XACT: Final = {_XACT_COMMIT: XactKind.COMMIT, _XACT_ABORT: XactKind.ABORT}
_XACT_KIND: Final = {
    _XACT_COMMIT: XactKind.COMMIT,
    _XACT_ABORT: XactKind.ABORT,
    _XACT_COMMIT_PREPARED: XactKind.COMMIT_PREPARED,
    _XACT_ABORT_PREPARED: XactKind.ABORT_PREPARED,
}


@frozen
class XactRecord:
    """A transaction's commit or abort.

    ``lsn`` is where the record starts (``pg_waldump``'s ``lsn:``), ``end_lsn``
    where the next one may start (PostgreSQL's ``EndRecPtr``: the end, aligned
    to 8 bytes). ``xid`` is the transaction that ended: the record's
    ``xl_xid``, or for the prepared variants the prepared transaction's id from
    the record (``recovery_target_xid`` matches it the same way). ``time`` is
    ``xact_time`` (what ``pg_xact_commit_timestamp`` reports and
    ``recovery_target_time`` compares), UTC. ``timeline`` is the timeline of the
    path that holds the record.
    """

    kind: XactKind
    lsn: LSN
    end_lsn: LSN
    xid: int
    time: dt.datetime
    timeline: int


@frozen
class RestorePointRecord:
    """A restore point (``pg_create_restore_point``): its name and time."""

    lsn: LSN
    end_lsn: LSN
    name: str
    time: dt.datetime
    timeline: int


@frozen
class CheckpointRecord:
    """A checkpoint record (online, or shutdown: also the end of a crash recovery
    on 12-14 and a timeline switch when ``this_timeline != prev_timeline``).

    ``redo`` is where its replay starts; ``time`` its time (whole seconds).
    """

    lsn: LSN
    end_lsn: LSN
    shutdown: bool
    redo: LSN
    this_timeline: int
    prev_timeline: int
    time: dt.datetime
    timeline: int


@frozen
class EndOfRecoveryRecord:
    """An end-of-recovery record: a promotion started ``this_timeline`` from ``prev_timeline``."""

    lsn: LSN
    end_lsn: LSN
    time: dt.datetime
    this_timeline: int
    prev_timeline: int
    timeline: int


@frozen
class SwitchRecord:
    """A WAL switch (``pg_switch_wal``); the rest of the segment is unused (``end_lsn``
    is the next segment's start)."""

    lsn: LSN
    end_lsn: LSN
    timeline: int


@frozen
class BackupEndRecord:
    """The end of an online backup that started at ``backup_start``."""

    lsn: LSN
    end_lsn: LSN
    backup_start: LSN
    timeline: int


@frozen
class OverwriteContrecordRecord:
    """The record written where a record's lost continuation was (crash recovery
    found the WAL ending in the middle of the record at ``overwritten_lsn``)."""

    lsn: LSN
    end_lsn: LSN
    overwritten_lsn: LSN
    time: dt.datetime
    timeline: int


@frozen
class TimelineSwitch:
    """The path moves from ``from_timeline`` to ``to_timeline`` at ``lsn`` (the switchpoint)."""

    lsn: LSN
    from_timeline: int
    to_timeline: int


@frozen
class SegmentRead:
    """A segment file was opened and its first page (long header) checked.

    ``lsn`` is the segment's start; ``timeline`` the timeline in the file name;
    ``path`` where the file is (its :attr:`ArchivedFile.location`: a path for a
    directory). ``file`` is the file as it was when it was opened (name, size,
    modification time) and ``source`` the index, among the sources the reader
    was given, of the one it came from.
    """

    lsn: LSN
    name: str
    path: str
    timeline: int
    segno: int
    system_identifier: int
    major: int
    file: ArchivedFile | None = None
    source: int = 0


@frozen
class EndOfWal:
    """Where the valid WAL ends: replay stops here.

    ``lsn`` is the end of the last valid record (PostgreSQL's ``EndRecPtr``,
    where the next record was expected, and where a promotion at the end of
    the WAL starts the new timeline); ``last_lsn`` is that record's start
    (what replay logs as "redo done at"; None if no record was read).
    ``found_at`` is where the invalid data was found (a record header, or a
    page header); ``reason`` says what is wrong, in PostgreSQL's words where it
    has them; ``path`` and ``offset`` locate ``found_at`` in a file when it was
    read. ``aborted_lsn`` is set when a record that spans pages lost its
    continuation: ``found_at`` is then the page where the continuation was
    missing (where crash recovery writes an overwrite-contrecord record).
    """

    lsn: LSN
    found_at: LSN
    reason: str
    last_lsn: LSN | None = None
    path: str | None = None
    offset: int | None = None
    aborted_lsn: LSN | None = None


class StopReason(enum.Enum):
    """Why a scan ended."""

    END = "end"
    """It reached the end of the stretch asked for."""
    END_OF_WAL = "end_of_wal"
    """The valid WAL ends before that (see :class:`EndOfWal`)."""
    MISSING_SEGMENT = "missing_segment"
    """The next segment is in none of the directories."""


@frozen
class ScanEnd:
    """The last item of every scan.

    ``scanned_to``: how far the WAL is known (the end asked for, the end of
    valid WAL, or the start of the missing segment); ``complete`` when the
    whole stretch was read or the end of the valid WAL found in it;
    ``missing`` names the missing segment; ``records`` counts the records read
    from ``scanned_from`` on (``pg_waldump`` prints as many), ``bytes`` the
    segment bytes read (for throughput figures).
    """

    reason: StopReason
    scanned_from: LSN
    scanned_to: LSN
    end_of_wal: EndOfWal | None = None
    missing: str | None = None
    records: int = 0
    bytes: int = 0

    @property
    def complete(self) -> bool:
        """True when nothing of the stretch asked for is left unknown."""
        return self.reason is not StopReason.MISSING_SEGMENT


WalItem = (
    XactRecord
    | RestorePointRecord
    | CheckpointRecord
    | EndOfRecoveryRecord
    | SwitchRecord
    | BackupEndRecord
    | OverwriteContrecordRecord
    | TimelineSwitch
    | SegmentRead
    | EndOfWal
    | ScanEnd
)
"""Everything :func:`read_wal` yields."""


@frozen
class PageHeader:
    """The header every WAL page starts with (:func:`parse_page_header`).

    ``xlp_magic`` (the format of a major version: :data:`PAGE_MAGIC`),
    ``xlp_info`` (flags), ``xlp_tli``, ``xlp_pageaddr`` (the page's own LSN)
    and ``xlp_rem_len`` (what is left of a record continued from the page
    before).
    """

    magic: int
    info: int
    timeline: int
    pageaddr: LSN
    remaining: int | None
    """None when only the first 16 bytes were given (the page's address)."""

    @property
    def major(self) -> int | None:
        """The major version whose format :attr:`magic` is (None: none supported)."""
        return _MAJOR_OF_MAGIC.get(self.magic)


def parse_page_header(head: bytes) -> PageHeader | None:
    """The page header at the start of ``head`` (None when shorter than 16 bytes).

    The one parser of page headers outside the reader's own loops (which
    unpack the same :mod:`struct` layout in place, for speed).
    """
    if len(head) < _PAGE_ADDRESS.size:
        return None
    magic, info, tli, pageaddr = _PAGE_ADDRESS.unpack_from(head, 0)
    rem = _PAGE_HEADER.unpack_from(head, 0)[4] if len(head) >= _PAGE_HEADER.size else None
    return PageHeader(magic=magic, info=info, timeline=tli, pageaddr=LSN(pageaddr), remaining=rem)


@frozen
class SegmentHeader:
    """The long page header of a segment's first page (:func:`read_segment_header`)."""

    magic: int
    major: int | None
    info: int
    timeline: int
    pageaddr: LSN
    system_identifier: int
    segment_size: int
    block_size: int


# =========================================================================== files

_COMPRESSION_RANK: Final = {None: 0, "gz": 1, "zst": 2, "lz4": 3, "bz2": 4, "xz": 5}
_which = shutil.which
"""How decompression programs are found (tests replace it)."""


def _optional_module(name: str) -> Any:
    """An optional module (``zstandard``, ``lz4.frame``), or None when not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


class _Stream(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


class _FileStream:
    """A plain file or a stdlib/third-party decompressing file object."""

    def __init__(self, fh: IO[bytes] | Any) -> None:
        self._fh = fh

    def read(self, n: int = -1, /) -> bytes:
        return bytes(self._fh.read(n))

    def close(self) -> None:
        self._fh.close()


class _ProcessStream:
    """The output of ``zstd -dc`` / ``lz4 -dc``."""

    def __init__(self, argv: list[str]) -> None:
        self._argv = argv
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )

    def read(self, n: int = -1, /) -> bytes:
        assert self._proc.stdout is not None
        data = self._proc.stdout.read(n)
        if n < 0 or len(data) < n:  # end of output: the program must have succeeded
            assert self._proc.stderr is not None
            err = self._proc.stderr.read().decode(errors="replace").strip()
            rc = self._proc.wait()
            if rc != 0:
                raise OSError(f"{self._argv[0]} exited with code {rc}: {err[-300:]}")
        return data

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        for pipe in (self._proc.stdout, self._proc.stderr):
            if pipe is not None:
                pipe.close()
        self._proc.wait()


_READ_ERRORS: Final = (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError)


def _open_stream(path: str, compression: str | None) -> _Stream:
    """Open a segment file for reading its (decompressed) bytes; ArchiveError if impossible."""
    try:
        if compression is None:
            return _FileStream(open(path, "rb"))
        if compression == "gz":
            return _FileStream(gzip.open(path, "rb"))
        if compression == "bz2":
            return _FileStream(bz2.open(path, "rb"))
        if compression == "xz":
            return _FileStream(lzma.open(path, "rb"))
        if compression == "zst":
            zstandard = _optional_module("zstandard")
            if zstandard is not None:
                raw = open(path, "rb")  # noqa: SIM115 - closed with the reader
                return _FileStream(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
            program = _which("zstd")
            if program is not None:
                return _ProcessStream([program, "-d", "-c", "-q", os.path.abspath(path)])
        elif compression == "lz4":
            lz4frame = _optional_module("lz4.frame")
            if lz4frame is not None:
                return _FileStream(lz4frame.open(path, "rb"))
            program = _which("lz4")
            if program is not None:
                return _ProcessStream([program, "-d", "-c", "-q", os.path.abspath(path)])
    except _READ_ERRORS as exc:
        raise ArchiveError(
            f"cannot open WAL segment file {path}: {exc}",
            hint="check the file's permissions and that it is a complete copy",
            path=path,
        ) from exc
    module = {"zst": "zstandard", "lz4": "lz4"}.get(compression or "", compression)
    raise ArchiveError(
        f"cannot read WAL segment file {path}: it is {compression}-compressed and neither "
        f"the {module} Python module nor the {compression if compression != 'zst' else 'zstd'}"
        " program is available",
        hint=f"install the {compression if compression != 'zst' else 'zstd'} program "
        f"(apt-get install {'zstd' if compression == 'zst' else 'lz4'}) or the {module} "
        "Python module, or keep an uncompressed copy",
        path=path,
        compression=compression,
    )


def _reason(exc: BaseException) -> str:
    """What went wrong, in a read error's own words (an archive's ArchiveError keeps
    the underlying error as ``reason``)."""
    if isinstance(exc, ArchiveError):
        return str(exc.details.get("reason", exc.message))
    return str(exc)


def _read_exact(stream: ReadStream, n: int, path: str, offset: int, segsz: int) -> bytes:
    try:
        data = stream.read(n)
    except (*_READ_ERRORS, ArchiveError) as exc:
        raise ArchiveError(
            f"cannot read WAL segment file {path} at offset {offset}: {_reason(exc)}",
            hint="the file is damaged or not what its name says; restore a good copy",
            path=path,
            offset=offset,
        ) from exc
    if len(data) != n:
        raise ArchiveError(
            f"WAL segment file {path} ends at offset {offset + len(data)}: a segment of this "
            f"cluster is {segsz} bytes (the file is truncated)",
            hint="PostgreSQL refuses a restored segment of the wrong size; restore a "
            "complete copy of the segment",
            path=path,
            offset=offset + len(data),
            segment_size=segsz,
        )
    return data


def _header_of(stream: ReadStream, where: str) -> SegmentHeader:
    """The long header at the start of ``stream`` (closed afterwards)."""
    try:
        head = _read_exact(stream, _LONG_PHD, where, 0, _LONG_PHD)
    except ArchiveError as exc:
        raise ArchiveError(
            f"{where} is too short for a WAL segment ({exc.message})", path=where, offset=0
        ) from exc
    finally:
        stream.close()
    page = parse_page_header(head)
    assert page is not None  # _LONG_PHD bytes were read
    sysid, segsz, blcksz = _LONG_TAIL.unpack_from(head, 24)
    return SegmentHeader(
        magic=page.magic,
        major=page.major,
        info=page.info,
        timeline=page.timeline,
        pageaddr=page.pageaddr,
        system_identifier=sysid,
        segment_size=segsz,
        block_size=blcksz,
    )


def read_segment_header(path: str | os.PathLike[str]) -> SegmentHeader:
    """The long header of the first page of a segment file (plain or compressed).

    Raises :class:`~pgsnap.errors.ArchiveError` when the file cannot be read or
    is too short; the header's values are returned as found (``major`` is None
    for a magic number of no supported version).
    """
    p = os.fspath(path)
    entry = parse_archive_name(os.path.basename(p))
    return _header_of(_open_stream(p, entry.compression), p)


def read_archived_segment_header(files: WalFiles, name: str) -> SegmentHeader:
    """:func:`read_segment_header` of the file stored as ``name`` in an archive (or
    any :class:`~pgsnap.wal.files.WalFiles`), through its ``stat`` and ``open``.

    ``ArchiveError`` when it is not there, cannot be read or is too short.
    """
    found = files.stat(name)
    if found is None:
        raise ArchiveError(
            f"{name} is not in the WAL archive {files.location}",
            hint="list the archive to see which files it holds",
            path=files.location,
            name=name,
        )
    return _archived_header(files, found)


def _archived_header(files: WalFiles, found: ArchivedFile) -> SegmentHeader:
    return _header_of(files.open(found.name), found.location)


def find_segment_file(directory: str | os.PathLike[str], name: str) -> str | None:
    """The file that holds segment ``name`` in ``directory``: plain, else compressed
    (``.gz``, ``.zst``...); None when there is none. Probes names, lists nothing."""
    found = stat_segment_file(directory, name)
    return None if found is None else found[0]


def stat_segment_file(
    directory: str | os.PathLike[str], name: str
) -> tuple[str, os.stat_result] | None:
    """:func:`find_segment_file` with the file's ``stat`` (one call per name probed)."""
    base = os.path.join(os.fspath(directory), name)
    for candidate in (base, *(f"{base}.{ext}" for ext in COMPRESSION_SUFFIXES)):
        try:
            st = os.stat(candidate)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            return candidate, st
    return None


def find_segment(files: WalFiles, name: str) -> ArchivedFile | None:
    """The file holding ``name`` in an archive: stored as ``name``, else as a
    compressed copy (``.gz``, ``.bz2``, ``.xz``, ``.lz4``, ``.zst``, in that order);
    None when there is none. :func:`find_segment_file` through the archive's
    ``stat`` (one call per name probed; a name the archive cannot answer for is
    passed over, as a missing one)."""
    for candidate in (name, *(f"{name}.{ext}" for ext in COMPRESSION_SUFFIXES)):
        try:
            found = files.stat(candidate)
        except ArchiveError as exc:
            log.debug("%s not probed in %s: %s", candidate, files.location, exc)
            continue
        if found is not None:
            return found
    return None


def _gzip_size(path: str) -> int | None:
    """The uncompressed size a gzip file says it has (its ISIZE trailer, mod 2**32)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(-4, os.SEEK_END)
            return int.from_bytes(fh.read(4), "little")
    except OSError:
        return None


def segment_problem(
    path: str | os.PathLike[str],
    *,
    segment_size: int,
    system_identifier: str | int | None = None,
    major: int | None = None,
) -> str | None:
    """Why the segment file at ``path`` cannot be replayed, or None when it can.

    What PostgreSQL itself checks before it replays a segment a
    ``restore_command`` brought back: its size (a truncated copy is a FATAL
    ``archive file has wrong size``, after the point of no return), and its
    first page's long header: the page magic (WAL of the expected major
    version), the long-header flag, the segment's own address (a file renamed
    to another segment's name), its timeline (not after the name's), the
    cluster's system identifier and the segment size. Compressed files are
    judged by what they decompress to (gzip's size from its trailer).
    """
    p = os.fspath(path)
    name = os.path.basename(p)
    entry = parse_archive_name(name)
    if entry.kind is not WalFileKind.SEGMENT or entry.timeline is None:
        return "not a WAL segment's name"
    try:
        if entry.compression is None:
            size: int | None = os.stat(p).st_size
        elif entry.compression == "gz":
            size = _gzip_size(p)
        else:
            size = None  # judged by its header alone
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    return _segment_problem(
        name,
        size,
        lambda: read_segment_header(p),
        segment_size=segment_size,
        system_identifier=system_identifier,
        major=major,
    )


def archived_segment_problem(
    files: WalFiles,
    found: ArchivedFile,
    *,
    segment_size: int,
    system_identifier: str | int | None = None,
    major: int | None = None,
) -> str | None:
    """:func:`segment_problem` of a file of an archive (as :func:`find_segment` or
    the archive's ``stat`` gave it), read through the archive: its size is the
    file's ``content_size`` (not judged when the archive does not know it), its
    header comes from ``open``."""
    return _segment_problem(
        found.name,
        found.content_size,
        lambda: _archived_header(files, found),
        segment_size=segment_size,
        system_identifier=system_identifier,
        major=major,
    )


def _segment_problem(
    name: str,
    size: int | None,
    header_of: Callable[[], SegmentHeader],
    *,
    segment_size: int,
    system_identifier: str | int | None,
    major: int | None,
) -> str | None:
    """:func:`segment_problem` once the file's (decompressed) size is known."""
    entry = parse_archive_name(name)
    if entry.kind is not WalFileKind.SEGMENT or entry.timeline is None:
        return "not a WAL segment's name"
    if size is not None and size != segment_size % (1 << 32 if entry.compression else 1 << 64):
        return f"{size} bytes, not a {segment_size}-byte segment (a truncated or partial copy)"
    try:
        header = header_of()
    except ArchiveError as exc:
        return exc.message
    if header.major is None:
        return f"not WAL: its first page's magic is {header.magic:#06x}"
    if major is not None and header.major != major:
        return f"WAL of PostgreSQL {header.major}, not {major}"
    if not header.info & _XLP_LONG_HEADER:
        return "its first page has no long header: not the start of a segment"
    segno = _segno_of(name, segment_size)
    if segno is not None and header.pageaddr.value != segno * segment_size:
        return (
            f"it holds the WAL at {header.pageaddr}, not that of its name "
            f"(a file copied under another segment's name)"
        )
    if header.timeline > entry.timeline:
        return f"its first page is of timeline {header.timeline}, after its name's"
    if header.segment_size != segment_size:
        return f"its header says {header.segment_size}-byte segments, not {segment_size}"
    if system_identifier is not None and str(header.system_identifier) != str(system_identifier):
        return (
            f"WAL of another cluster (system identifier {header.system_identifier}, "
            f"not {system_identifier})"
        )
    return None


def _segno_of(name: str, segment_size: int) -> int | None:
    base = name[:24]
    try:
        high, low = int(base[8:16], 16), int(base[16:24], 16)
    except ValueError:
        return None
    return high * (0x100000000 // segment_size) + low


# =========================================================================== sources


class _GuardedStream:
    """A stream whose read errors are :class:`~pgsnap.errors.ArchiveError` naming the
    file (the :class:`~pgsnap.wal.files.ReadStream` contract), with the underlying
    error's text as ``reason``."""

    def __init__(self, stream: _Stream, where: str) -> None:
        self._stream = stream
        self._where = where

    def read(self, size: int = -1, /) -> bytes:
        try:
            return self._stream.read(size)
        except _READ_ERRORS as exc:
            raise ArchiveError(
                f"cannot read {self._where}: {exc}",
                hint="the file is damaged or not what its name says; restore a good copy",
                path=self._where,
                reason=str(exc),
            ) from exc

    def close(self) -> None:
        self._stream.close()


class WalDirectory:
    """A local directory of WAL files (a surviving ``pg_wal``, or an archive
    directory) as :class:`~pgsnap.wal.files.WalFiles`: what the WAL reader makes of
    a directory it is given, and what
    :class:`~pgsnap.wal.archive.DirectoryWalArchive` reads its files with.

    The path is kept as given. ``list_names`` returns the regular files (symlinks
    to files count), sorted, leaving out names that start with ``.`` or end in
    ``.tmp`` (copies being written); ``stat`` and ``open`` take a plain file name
    (:class:`~pgsnap.errors.WalNameError` otherwise).
    """

    __slots__ = ("_path",)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Read the directory at ``path`` (it is checked when used)."""
        self._path = os.fspath(path)

    @property
    def location(self) -> str:
        """The directory's path, as given."""
        return self._path

    def __repr__(self) -> str:
        return f"WalDirectory({self._path!r})"

    def _join(self, name: str) -> str:
        return os.path.join(self._path, check_file_name(name))

    def list_names(self) -> tuple[str, ...]:
        """The regular files' names, sorted; ``ArchiveError`` if the directory cannot
        be listed (files that vanish while it is read are skipped)."""
        found: list[str] = []
        try:
            with os.scandir(self._path) as it:
                for entry in it:
                    name = entry.name
                    if name.startswith(".") or name.endswith(".tmp"):
                        continue
                    try:
                        if entry.is_file():
                            found.append(name)
                    except OSError:
                        continue
        except OSError as exc:
            raise ArchiveError(
                f"cannot list the WAL directory {self._path}: {exc.strerror or exc}",
                hint="check the path, its permissions and that its file system is mounted",
                path=self._path,
            ) from exc
        return tuple(sorted(found))

    def stat(self, name: str) -> ArchivedFile | None:
        """The regular file ``name``; None when there is none (nor the directory).
        ``ArchiveError`` when it cannot be told (permission denied, I/O error)."""
        path = self._join(name)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise ArchiveError(
                f"cannot stat {path}: {exc.strerror or exc}",
                hint="check the file's and the directory's permissions",
                path=path,
                name=name,
            ) from exc
        if not stat.S_ISREG(st.st_mode):
            return None
        compression = parse_archive_name(name).compression
        content = st.st_size if compression is None else None
        if compression == "gz":
            content = _gzip_size(path)
        return ArchivedFile(name, st.st_size, st.st_mtime_ns, path, content)

    def open(self, name: str) -> ReadStream:
        """The decompressed content of ``name`` (by its suffix: ``.gz``, ``.bz2``,
        ``.xz`` with the standard library, ``.zst``/``.lz4`` with a module or a
        program). ``ArchiveError`` when it is missing, cannot be opened, or no
        decompressor is available."""
        path = self._join(name)
        try:
            stream = _open_stream(path, parse_archive_name(name).compression)
        except ArchiveError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                raise ArchiveError(
                    f"{name} is not in {self._path}",
                    hint="list the directory to see which files it holds",
                    path=path,
                    name=name,
                ) from None
            raise
        return _GuardedStream(stream, path)


WalSource = str | os.PathLike[str] | WalFiles
"""What the WAL reader reads from: a directory's path, or an archive (anything with
the :class:`~pgsnap.wal.files.WalFiles` methods, every
:class:`~pgsnap.protocols.WalArchive` among them)."""


def _as_files(source: WalSource) -> WalFiles:
    if isinstance(source, str | os.PathLike):
        return WalDirectory(source)
    return source


@frozen
class _File:
    source: int
    name: str
    compression: str | None
    path: str  # where it is, for messages


class _Files:
    """The segment files in the sources, found by name: ``get`` probes the names
    a segment can have (plain, then each compression; ``.partial`` forms) in each
    source (its ``stat``), so reading a few segments of an archive of a million
    costs a few ``stat`` calls, not a listing. Only telling the segment size from
    the files (:meth:`first`, :meth:`detect_segment_size`) lists the sources.

    Copies are in order of preference: the first source holding a segment
    wins (as ``scan_wal``: the archive, then a surviving pg_wal), and within
    one source a plain file wins over a compressed one. A plain copy whose
    size is not the segment size is passed over for the next copy (as the
    archive index does not count it); when no copy is usable, reading it is
    an ArchiveError naming it.
    """

    def __init__(self, sources: Sequence[WalSource]) -> None:
        self.sources = [_as_files(s) for s in sources]
        self._cache: dict[tuple[int, int, int, bool], list[_File]] = {}
        self._listed: dict[tuple[int, int, int, bool], list[tuple[int, str, str | None]]] | None = (
            None
        )

    @property
    def locations(self) -> list[str]:
        """Where the sources are, for messages."""
        return [s.location for s in self.sources]

    def get(self, tli: int, segno: int, segsz: int, *, partial: bool = False) -> list[_File]:
        """The copies of a segment, best first (empty: none)."""
        per_id = 0x100000000 // segsz
        key = (tli, segno // per_id, segno % per_id, partial)
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = self._probe(key)
        return found

    def _probe(self, key: tuple[int, int, int, bool]) -> list[_File]:
        tli, log_id, seg, partial = key
        base = f"{tli:08X}{log_id:08X}{seg:08X}"
        names: list[tuple[str, str | None]] = []
        for comp in sorted(_COMPRESSION_RANK, key=lambda c: _COMPRESSION_RANK[c]):
            suffix = "" if comp is None else f".{comp}"
            if partial:
                names.append((f"{base}.partial{suffix}", comp))
                names.append((f"{base}{suffix}.partial", comp))
            else:
                names.append((f"{base}{suffix}", comp))
        out: list[_File] = []
        for si, src in enumerate(self.sources):
            for name, comp in names:
                try:
                    found = src.stat(name)
                except ArchiveError as exc:
                    log.debug("%s passed over in %s: %s", name, src.location, exc)
                    continue
                if found is not None:
                    out.append(_File(si, name, comp, found.location))
        return out

    def _listing(self) -> dict[tuple[int, int, int, bool], list[tuple[int, str, str | None]]]:
        """Every segment file of the sources, as (source, name, compression), for
        telling the segment size."""
        if self._listed is not None:
            return self._listed
        found: dict[tuple[int, int, int, bool], list[tuple[int, int, str, str | None]]] = {}
        for si, src in enumerate(self.sources):
            try:
                names = src.list_names()
            except ArchiveError as exc:
                log.debug("cannot list %s: %s", src.location, exc)
                continue
            for name in names:
                entry = parse_archive_name(name)
                if entry.kind not in (WalFileKind.SEGMENT, WalFileKind.PARTIAL):
                    continue
                assert entry.timeline is not None and entry.log is not None
                assert entry.seg is not None
                key = (entry.timeline, entry.log, entry.seg, entry.kind is WalFileKind.PARTIAL)
                rank = _COMPRESSION_RANK.get(entry.compression, 9)
                found.setdefault(key, []).append((si, rank, name, entry.compression))
        self._listed = {
            k: [(s, n, c) for s, _r, n, c in sorted(v, key=lambda c: c[:2])]
            for k, v in found.items()
        }
        return self._listed

    def _stat(self, source: int, name: str) -> ArchivedFile | None:
        try:
            return self.sources[source].stat(name)
        except ArchiveError:
            return None

    def first(self) -> tuple[str, str] | None:
        """Some segment file (the first by name) as (name, where), None when there is none."""
        listed = self._listing()
        if not listed:
            return None
        si, name, _comp = listed[min(listed)][0]
        found = self._stat(si, name)
        return name, found.location if found is not None else self.sources[si].location

    def detect_segment_size(self) -> int | None:
        """The segment size from the first segment file whose first page is a long
        header of a supported version (plain files first)."""
        copies = sorted(
            (comp is not None, k[3], k, name, si)
            for k, fs in self._listing().items()
            for si, name, comp in fs
        )
        for compressed, _partial, _key, name, si in copies[:16]:
            found = self._stat(si, name)
            if found is None:
                continue
            size = None if compressed else found.size
            if size is not None and size not in _SEGMENT_SIZES:
                continue
            try:
                h = _archived_header(self.sources[si], found)
            except ArchiveError:
                continue
            if (
                h.major is not None
                and h.info & _XLP_LONG_HEADER
                and h.segment_size in _SEGMENT_SIZES
                and size in (None, h.segment_size)
            ):
                return h.segment_size
        return None


_SEGMENT_SIZES: Final = frozenset(1 << n for n in range(20, 31))
_BLOCK_SIZES: Final = frozenset(1 << n for n in range(10, 17))  # XLOG_BLCKSZ: 1 kB to 64 kB


# =========================================================================== decoding


def _main_data(rec: bytes, fmt: _Format) -> bytes | None:
    """The main data of a whole record (DecodeXLogRecord's header walk); None if malformed."""
    tot = len(rec)
    p = _REC_HDR
    datatotal = 0
    main_len = 0
    max_block = -1
    have_rel = False
    while tot - p > datatotal:
        bid = rec[p]
        p += 1
        if bid == 255:  # XLR_BLOCK_ID_DATA_SHORT
            if p + 1 > tot:
                return None
            main_len = rec[p]
            p += 1
            datatotal += main_len
            break
        if bid == 254:  # XLR_BLOCK_ID_DATA_LONG
            if p + 4 > tot:
                return None
            main_len = _U32.unpack_from(rec, p)[0]
            p += 4
            datatotal += main_len
            break
        if bid == 253:  # XLR_BLOCK_ID_ORIGIN
            p += 2
        elif bid == 252 and fmt.toplevel_xid:  # XLR_BLOCK_ID_TOPLEVEL_XID
            p += 4
        elif bid <= 32:  # XLR_MAX_BLOCK_ID
            if bid <= max_block or p + 3 > tot:
                return None
            max_block = bid
            fork_flags = rec[p]
            data_len = _U16.unpack_from(rec, p + 1)[0]
            p += 3
            if bool(fork_flags & 0x20) != (data_len > 0):  # BKPBLOCK_HAS_DATA
                return None
            datatotal += data_len
            if fork_flags & 0x10:  # BKPBLOCK_HAS_IMAGE
                if p + 5 > tot:
                    return None
                bimg_len = _U16.unpack_from(rec, p)[0]
                bimg_info = rec[p + 4]
                p += 5
                if bimg_info & fmt.compressed_mask and bimg_info & 0x01:  # hole + compressed
                    p += 2
                datatotal += bimg_len
            if not fork_flags & 0x80:  # not BKPBLOCK_SAME_REL: a RelFileNode follows
                p += 12
                have_rel = True
            elif not have_rel:
                return None
            p += 4  # BlockNumber
        else:
            return None
        if p > tot:
            return None
    if tot - p != datatotal or main_len > tot - p:
        return None
    return rec[tot - main_len :]


def _pg_time(us: int) -> dt.datetime | None:
    """A TimestampTz (microseconds since 2000-01-01 UTC) as a datetime; None out of range."""
    try:
        return _PG_EPOCH + dt.timedelta(microseconds=us)
    except OverflowError:
        return None


def _unix_time(seconds: int) -> dt.datetime | None:
    try:
        return _UNIX_EPOCH + dt.timedelta(seconds=seconds)
    except OverflowError:
        return None


def _twophase_xid(op: int, info: int, main: bytes, fmt: _Format) -> int | None:
    """The prepared transaction's xid in a COMMIT_PREPARED/ABORT_PREPARED record
    (ParseCommitRecord/ParseAbortRecord); 0 when the record has none, None if malformed."""
    n = len(main)
    p = 8
    xinfo = 0
    if info & _XACT_HAS_INFO:
        if p + 4 > n:
            return None
        xinfo = _U32.unpack_from(main, p)[0]
        p += 4
    if xinfo & _XINFO_DBINFO:
        p += 8
    counted: list[tuple[int, int]] = []
    if xinfo & _XINFO_SUBXACTS:
        counted.append((_XINFO_SUBXACTS, 4))
    if xinfo & _XINFO_RELFILENODES:
        counted.append((_XINFO_RELFILENODES, 12))
    if fmt.stats_item_size and xinfo & _XINFO_DROPPED_STATS:
        counted.append((_XINFO_DROPPED_STATS, fmt.stats_item_size))
    if op == _XACT_COMMIT_PREPARED and xinfo & _XINFO_INVALS:
        counted.append((_XINFO_INVALS, 16))  # SharedInvalidationMessage
    for _flag, size in counted:
        if p + 4 > n:
            return None
        count = _I32.unpack_from(main, p)[0]
        if count < 0:
            return None
        p += 4 + count * size
    if not xinfo & _XINFO_TWOPHASE:
        return 0  # InvalidTransactionId, as PostgreSQL's parser leaves it
    if p + 4 > n:
        return None
    return int(_U32.unpack_from(main, p)[0])


# =========================================================================== scanning

_OTHER_SYSTEM: Final = "WAL file is from different database system"
_DEFAULT_CHUNK: Final = 16 * 1024 * 1024
_TAIL_WINDOW: Final = 16 * 1024 * 1024
"""Verify.TAIL checks the last 16 MiB before an end of WAL (two segments when smaller):
the most WAL a server has in flight (wal_buffers is at most 16 MB unless set higher)."""


class _Stop(Exception):
    """The walk ended (reason in the scan's state)."""


class _Restart(Exception):
    """An overwrite-contrecord page: read again from its start."""


@define
class _Context:
    """What a scan knows before walking: files, sizes, format, cluster and path."""

    files: _Files
    segsz: int
    spans: list[TimelineSpan]
    chunk: int
    fmt: _Format | None = None
    sysid: int | None = None
    blcksz: int | None = None


class _Scan:
    """One walk over ``[start, end)`` along a timeline path (see :func:`read_wal`)."""

    def __init__(
        self,
        ctx: _Context,
        start: int,
        end: int,
        verify: Verify,
        *,
        pos: int | None = None,
        prev: int = -1,
    ) -> None:
        self.ctx = ctx
        self.start = start
        self.end = end
        self.verify_all = verify is Verify.ALL
        self.pos = start if pos is None else pos  # PostgreSQL's NextRecPtr
        self.prev = prev  # the previous record's start; -1: not known (random access)
        self.random_access = pos is None
        self.out: list[WalItem] = []
        self.records = 0
        self.bytes = 0
        # the current segment file and buffer
        self.stream: ReadStream | None = None
        self.segno = -1
        self.seg_file: _File | None = None
        self.seg_tli = 0
        self.cur_file_tli = 0
        self.limit = _INF
        self.stream_off = 0
        self.buf = b""
        self.buf_lsn = 0
        self.buf_end = 0
        self.page_checked = -1
        # page header state (XLogReaderValidatePageHeader)
        self.latest_page = -1
        self.latest_tli = 0
        # the path
        self.path_tlis = {s.timeline for s in ctx.spans}
        self.min_tli = ctx.spans[0].timeline
        self.span_end = {s.timeline: (_INF if s.end is None else s.end.value) for s in ctx.spans}
        self.span_i = 0
        while (
            self.span_i + 1 < len(ctx.spans)
            and ctx.spans[self.span_i].end is not None
            and self.pos >= ctx.spans[self.span_i].end.value  # type: ignore[union-attr]
        ):
            self.span_i += 1
        self.overwritten = -1
        # (next record pointer, previous record) now and then, to check the tail again from
        self.window = min(_TAIL_WINDOW, 2 * ctx.segsz)
        self.mark_every = self.window // 8
        self.marks: collections.deque[tuple[int, int]] = collections.deque([(self.pos, prev)])
        # the result
        self.reason: StopReason | None = None
        self.scanned_to = start
        self.missing: str | None = None
        self.end_of_wal: EndOfWal | None = None
        self.valid_rmid = ctx.fmt.valid_rmids() if ctx.fmt is not None else b""

    # ------------------------------------------------------------------ results

    def _finish(self, reason: StopReason, scanned_to: int) -> NoReturn:
        self.reason = reason
        self.scanned_to = min(max(scanned_to, self.start), self.end)
        raise _Stop

    def _eow(self, found_at: int, reason: str, aborted: int | None = None) -> NoReturn:
        path = offset = None
        f = self.seg_file
        if f is not None and self.segno == found_at // self.ctx.segsz:
            path, offset = f.path, found_at - self.segno * self.ctx.segsz
        self.end_of_wal = EndOfWal(
            lsn=LSN(self.pos),
            found_at=LSN(found_at),
            reason=reason,
            last_lsn=LSN(self.prev) if self.prev >= 0 else None,
            path=path,
            offset=offset,
            aborted_lsn=None if aborted is None else LSN(aborted),
        )
        self.reason = StopReason.END_OF_WAL
        self.scanned_to = self.pos
        raise _Stop

    def _missing(self, segno: int) -> NoReturn:
        tli = self._candidates(segno)
        name = segment_name(tli[0] if tli else self.ctx.spans[-1].timeline, segno, self.ctx.segsz)
        self.missing = name
        self._finish(StopReason.MISSING_SEGMENT, max(self.pos, segno * self.ctx.segsz))

    # ------------------------------------------------------------------ files and pages

    def _candidates(self, segno: int) -> list[int]:
        """Timelines whose file of ``segno`` replay would open, in its order
        (XLogFileReadAnyTLI: newest first, begun by then, not older than the last file)."""
        segsz = self.ctx.segsz
        return [
            s.timeline
            for s in reversed(self.ctx.spans)
            if s.timeline >= self.cur_file_tli
            and (s.start is None or s.start.value // segsz <= segno)
        ]

    def _open(self, segno: int) -> None:
        """Open the file of ``segno`` and check its first page; _Stop when missing or invalid."""
        ctx = self.ctx
        segsz = ctx.segsz
        self._close()
        copies: list[tuple[int, _File]] = []
        for tli in self._candidates(segno):
            copies += [(tli, f) for f in ctx.files.get(tli, segno, segsz)]
        # The parent's .partial of a switch segment (as scan_wal): its bytes before
        # the switchpoint are the child's too.
        for s in self.ctx.spans:
            if (
                s.end is not None
                and s.end.value // segsz == segno
                and s.timeline >= self.cur_file_tli
            ):
                copies += [
                    (s.timeline, f) for f in ctx.files.get(s.timeline, segno, segsz, partial=True)
                ]
        if not copies:
            self._missing(segno)
        wrong: list[tuple[_File, int]] = []
        chosen: tuple[int, _File, ArchivedFile] | None = None
        for tli, f in copies:
            src = ctx.files.sources[f.source]
            try:
                now = src.stat(f.name)
            except ArchiveError as exc:
                raise ArchiveError(
                    f"cannot read WAL segment file {f.path}: {exc.message}", path=f.path
                ) from exc
            if now is None:
                raise ArchiveError(
                    f"cannot read WAL segment file {f.path}: it is gone", path=f.path
                )
            if f.compression is None and now.size != segsz:
                wrong.append((f, now.size))
                continue
            chosen = (tli, f, now)
            break
        if chosen is None:
            bad, size = wrong[0]
            raise ArchiveError(
                f"WAL segment file {bad.path} is {size} bytes: a segment of this cluster is "
                f"{segsz} bytes",
                hint="PostgreSQL refuses a segment of the wrong size; restore a complete "
                "copy of the segment",
                path=bad.path,
                size=size,
                segment_size=segsz,
            )
        tli, f, stored = chosen
        for bad, size in wrong:
            log.warning(
                "passing over %s (%d bytes, not a %d-byte segment) for %s",
                bad.path,
                size,
                segsz,
                f.path,
            )
        self.stream = ctx.files.sources[f.source].open(f.name)
        self.seg_file, self.segno, self.seg_tli = f, segno, tli
        self.cur_file_tli = tli
        self.limit = self.span_end.get(tli, _INF)
        self.stream_off = 0
        self._read_chunk()
        seg_lsn = segno * segsz
        self._first_page(seg_lsn, f)
        assert ctx.sysid is not None and ctx.fmt is not None
        self.out.append(
            SegmentRead(
                lsn=LSN(seg_lsn),
                name=segment_name(tli, segno, segsz),
                path=f.path,
                timeline=tli,
                segno=segno,
                system_identifier=ctx.sysid,
                major=ctx.fmt.major,
                file=stored,
                source=f.source,
            )
        )

    def _read_chunk(self) -> None:
        assert self.stream is not None and self.seg_file is not None
        ctx = self.ctx
        n = min(ctx.chunk, ctx.segsz - self.stream_off)
        self.buf = b""  # the previous chunk goes before the next one comes
        self.buf = _read_exact(self.stream, n, self.seg_file.path, self.stream_off, ctx.segsz)
        self.buf_lsn = self.segno * ctx.segsz + self.stream_off
        self.buf_end = self.buf_lsn + n
        self.stream_off += n
        self.bytes += n
        if self.stream_off == ctx.segsz and self.seg_file.compression is not None:
            try:
                more = self.stream.read(1)
            except (*_READ_ERRORS, ArchiveError) as exc:
                raise ArchiveError(
                    f"cannot read WAL segment file {self.seg_file.path}: {_reason(exc)}",
                    path=self.seg_file.path,
                ) from exc
            if more:
                raise ArchiveError(
                    f"WAL segment file {self.seg_file.path} decompresses to more than a "
                    f"segment of this cluster ({ctx.segsz} bytes)",
                    hint="the file is not a WAL segment of this cluster",
                    path=self.seg_file.path,
                    segment_size=ctx.segsz,
                )

    def _first_page(self, seg_lsn: int, f: _File) -> None:
        """Check a segment's first page (its long header); establish the format on the first.

        The first page of the first segment must be WAL of a supported version
        (of ``major`` when given) with a long header, else ArchiveError; a page
        of another cluster is always an ArchiveError; anything else wrong is the
        end of the WAL, as for any page.
        """
        ctx = self.ctx
        buf = self.buf
        magic, info, _tli, _addr, _rem = _PAGE_HEADER.unpack_from(buf, 0)
        sysid, _segsz, blcksz = _LONG_TAIL.unpack_from(buf, 24)
        if ctx.blcksz is None:  # the first segment of the scan
            major = _MAJOR_OF_MAGIC.get(magic)
            if major is None or (ctx.fmt is not None and ctx.fmt.magic != magic):
                want = "12-18" if ctx.fmt is None else str(ctx.fmt.major)
                raise ArchiveError(
                    f"{f.path} is not a WAL segment of PostgreSQL {want}: page magic "
                    f"{magic:04X} at offset 0"
                    + (f" (PostgreSQL {major}'s)" if major is not None else ""),
                    hint="check that the directories hold this cluster's WAL",
                    path=f.path,
                    offset=0,
                    magic=magic,
                )
            if not info & _XLP_LONG_HEADER or blcksz not in _BLOCK_SIZES:
                raise ArchiveError(
                    f"{f.path} does not begin with a WAL long page header (info {info:04X}, "
                    f"block size {blcksz}) at offset 0",
                    hint="check that the directories hold this cluster's WAL",
                    path=f.path,
                    offset=0,
                )
            if ctx.fmt is None:
                ctx.fmt = _Format.of(major)
            self.valid_rmid = ctx.fmt.valid_rmids()
            ctx.blcksz = blcksz
            if ctx.sysid is None:
                ctx.sysid = sysid
        assert ctx.fmt is not None
        if info & _XLP_LONG_HEADER and magic == ctx.fmt.magic and sysid != ctx.sysid:
            raise ArchiveError(
                f"{f.path} belongs to another cluster: its system identifier is {sysid}, "
                f"expected {ctx.sysid}",
                hint="the WAL directories mix clusters; keep each cluster's WAL apart",
                path=f.path,
                offset=0,
                system_identifier=sysid,
                expected=ctx.sysid,
            )
        reason = self._check_page(seg_lsn, 0)
        if reason is not None:
            self._eow(seg_lsn, reason)
        self.page_checked = seg_lsn

    def _check_page(self, page: int, i: int) -> str | None:
        """XLogReaderValidatePageHeader (and replay's timeline check) for the page at ``page``."""
        ctx = self.ctx
        assert ctx.fmt is not None and ctx.blcksz is not None
        buf = self.buf
        magic, info, tli, addr, _rem = _PAGE_HEADER.unpack_from(buf, i)
        seg_off = page % ctx.segsz
        if magic != ctx.fmt.magic:
            other = _MAJOR_OF_MAGIC.get(magic)
            note = f" (PostgreSQL {other}'s)" if other is not None else ""
            return f"invalid magic number {magic:04X}{note} {self._where(page)}"
        if info & ~_XLP_ALL_FLAGS:
            return f"invalid info bits {info:04X} {self._where(page)}"
        if info & _XLP_LONG_HEADER:
            sysid, segsz, blcksz = _LONG_TAIL.unpack_from(buf, i + 24)
            if sysid != ctx.sysid:
                return (
                    f"{_OTHER_SYSTEM}: WAL file database system identifier is {sysid}, "
                    f"expected {ctx.sysid}"
                )
            if segsz != ctx.segsz:
                return f"{_OTHER_SYSTEM}: incorrect segment size in page header"
            if blcksz != ctx.blcksz:
                return f"{_OTHER_SYSTEM}: incorrect XLOG_BLCKSZ in page header"
        elif seg_off == 0:
            return f"invalid info bits {info:04X} {self._where(page)}"
        if addr != page:
            return f"unexpected pageaddr {LSN(addr)} {self._where(page)}"
        if page > self.latest_page:
            if tli < self.latest_tli:
                return (
                    f"out-of-sequence timeline ID {tli} (after {self.latest_tli}) "
                    f"{self._where(page)}"
                )
            self.latest_page, self.latest_tli = page, tli
        if tli not in self.path_tlis and tli >= self.min_tli:
            return f"unexpected timeline ID {tli} {self._where(page)}"
        return None

    def _where(self, page: int) -> str:
        return f"in WAL segment {self._name()}, LSN {LSN(page)}, offset {page % self.ctx.segsz}"

    def _name(self) -> str:
        return segment_name(max(self.seg_tli, 1), max(self.segno, 0), self.ctx.segsz)

    def _page(self, page: int) -> tuple[int, int, int]:
        """Load and check the page at ``page``; (info, header size, rem_len).

        _Stop when its segment is missing or it is invalid (end of WAL).
        """
        if not self.buf_lsn <= page < self.buf_end:
            segno = page // self.ctx.segsz
            if segno != self.segno:
                self._open(segno)
            off = page - segno * self.ctx.segsz
            while self.stream_off <= off:
                self._read_chunk()
        i = page - self.buf_lsn
        info = _U16.unpack_from(self.buf, i + 2)[0]
        if page != self.page_checked:
            reason = self._check_page(page, i)
            if reason is not None:
                self._eow(page, reason)
            self.page_checked = page
        rem = _U32.unpack_from(self.buf, i + 16)[0]
        return info, _LONG_PHD if info & _XLP_LONG_HEADER else _SHORT_PHD, rem

    def _close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None

    # ------------------------------------------------------------------ records

    def _check_header(self, rec: int, tot_len: int, xprev: int, rmid: int) -> str | None:
        """ValidXLogRecordHeader."""
        if tot_len < _REC_HDR:
            return f"invalid record length at {LSN(rec)}: expected at least 24, got {tot_len}"
        if not self.valid_rmid[rmid]:
            return f"invalid resource manager ID {rmid} at {LSN(rec)}"
        if self.prev < 0:
            if not xprev < rec:
                return f"record with incorrect prev-link {LSN(xprev)} at {LSN(rec)}"
        elif xprev != self.prev:
            return f"record with incorrect prev-link {LSN(xprev)} at {LSN(rec)}"
        return None

    def walk(self) -> Iterator[list[WalItem]]:
        """Batches of records and events until the walk stops (no ScanEnd; see ``reason``)."""
        try:
            if self.end <= self.start:
                self._finish(StopReason.END, self.start)
            if self.random_access:
                self._find_first()
            while True:
                self._fast()
                self._step()
                if len(self.out) >= 64:
                    yield self.out
                    self.out = []
        except _Stop:
            pass
        finally:
            self._close()
        if self.out:
            yield self.out
            self.out = []

    def _find_first(self) -> None:
        """XLogFindNextRecord: from the page holding ``start``, skip a continuation."""
        ctx = self.ctx
        start = self.start
        self.pos = start  # where the valid WAL ends if the first pages are bad
        if ctx.blcksz is None:
            # The first page of the first segment tells the block size.
            self._open(start // ctx.segsz)
        b = ctx.blcksz
        assert b is not None
        page = start - start % b
        while True:
            info, hsize, rem = self._page(page)
            if info & _XLP_FIRST_IS_CONTRECORD:
                skip = (rem + 7) & ~7
                if skip >= b - hsize:
                    page += b
                    continue
                self.pos = page + hsize + skip
            else:
                self.pos = page + hsize
            break
        self.marks = collections.deque([(self.pos, -1)])

    def _fast(self) -> None:
        """Walk the records that need no more than a look, from the current page on.

        That is every record with a valid header that is not decoded - within
        a page, or over plain continuation pages of the same segment chunk
        (whose headers are checked as :meth:`_check_page` and the contrecord
        checks of :meth:`_assemble` would) - plus plain commits and aborts
        within a page (the bulk of the decoded records), whose CRC is checked
        and whose main data is read in place. Anything else (a page boundary, a
        segment start, another decoded record, anything unusual or invalid) is
        left to :meth:`_step`, which reads it (or reports it) the long way.
        Under Verify.ALL every record's CRC is checked here too.
        """
        pos = self.pos
        ctx = self.ctx
        b = ctx.blcksz
        assert b is not None and ctx.fmt is not None
        mask = b - 1
        poff = pos & mask
        if poff == 0 or not self.buf_lsn <= pos < self.buf_end:
            return
        prev = self.prev
        if prev < 0 or pos < self.start:
            return
        stop = min(self.end, self.limit)
        if self.span_i + 1 < len(ctx.spans):
            switch = ctx.spans[self.span_i].end
            if switch is not None:
                stop = min(stop, switch.value)
        page_end = pos - poff + b
        if page_end > stop:
            return
        buf = self.buf
        base = self.buf_lsn
        latest_tli = self.latest_tli
        last_page = -1
        hdr_limit = b - _REC_HDR
        unpack = _RECORD.unpack_from
        u32 = _U32.unpack_from
        i64 = _I64.unpack_from
        valid = self.valid_rmid
        interesting = _INTERESTING
        check_all = self.verify_all
        tli = ctx.spans[self.span_i].timeline
        out = self.out
        n = 0
        while 0 < poff <= hdr_limit:
            off = pos - base
            tot_len, xid, xprev, info, rmid = unpack(buf, off)
            if xprev != prev or tot_len < _REC_HDR or not valid[rmid]:
                break
            if poff + tot_len <= b:
                nxt = pos + ((tot_len + 7) & ~7)
                if interesting[(rmid << 8) | info]:
                    kind = _PLAIN_XACT.get(info & _XACT_OPMASK) if rmid == _RM_XACT else None
                    if kind is None or tot_len < 34:
                        break
                    rec = buf[off : off + tot_len]
                    # A plain commit or abort: the main data (xact_time first) right
                    # after a short data header, no block references.
                    if rec[24] != 255 or rec[25] != tot_len - 26:
                        break
                    if crc32c(rec[24:] + rec[:20]) != u32(rec, 20)[0]:
                        break
                    when = _pg_time(i64(rec, 26)[0])
                    if when is None:
                        break
                    out.append(XactRecord(kind, LSN(pos), LSN(nxt), xid, when, tli))
                elif check_all:
                    rec = buf[off : off + tot_len]
                    if crc32c(rec[24:] + rec[:20]) != u32(rec, 20)[0]:
                        break
            else:
                # Over the next page(s): skipped by its length, each continuation
                # page checked; anything unusual is left to _step.
                if check_all or interesting[(rmid << 8) | info]:
                    break
                over = self._skip_over(page_end, b - poff, tot_len, stop, latest_tli)
                if over is None:
                    break
                nxt, last_page, latest_tli = over
                page_end = last_page + b
                if nxt // self.mark_every != self.marks[-1][0] // self.mark_every:
                    self._mark_at(nxt, pos)
            prev = pos
            pos = nxt
            poff = pos & mask
            n += 1
        self.pos, self.prev = pos, prev
        self.records += n
        self._mark()
        if last_page >= 0:
            self.latest_page = self.page_checked = last_page
            self.latest_tli = latest_tli

    def _mark(self) -> None:
        """Remember (next record pointer, previous record) now and then: where a
        check of the tail can start reading (a record boundary with its prev-link)."""
        if self.pos // self.mark_every != self.marks[-1][0] // self.mark_every:
            self._mark_at(self.pos, self.prev)

    def _mark_at(self, pos: int, prev: int) -> None:
        self.marks.append((pos, prev))
        while len(self.marks) > 2 and self.marks[1][0] <= pos - 2 * self.window:
            self.marks.popleft()

    def held_from(self) -> tuple[int, int]:
        """The last mark at least a tail window before the position (the first mark
        if none is): the records from there on are held back and checked again."""
        edge = self.pos - self.window
        best = self.marks[0]
        for mark in self.marks:
            if mark[0] > edge:
                break
            best = mark
        return best

    def _skip_over(
        self, page: int, got: int, tot_len: int, stop: int, latest_tli: int
    ) -> tuple[int, int, int] | None:
        """Follow a skipped record over its continuation pages from ``page``.

        ``got`` bytes of its ``tot_len`` are before ``page``. Returns (the next
        record pointer, the last page, that page's timeline), or None when a
        page is not a plain continuation in the buffer before ``stop`` and the
        next segment (left to :meth:`_step`, which says what is wrong).
        """
        ctx = self.ctx
        b = ctx.blcksz
        assert b is not None and ctx.fmt is not None
        buf, base, buf_end = self.buf, self.buf_lsn, self.buf_end
        while page + b <= stop and page + b <= buf_end and page % ctx.segsz:
            magic, info, tli, addr, rem = _PAGE_HEADER.unpack_from(buf, page - base)
            if (
                magic != ctx.fmt.magic
                or info & ~_XLP_BKP_REMOVABLE != _XLP_FIRST_IS_CONTRECORD
                or addr != page
                or rem != tot_len - got
                or tli < latest_tli
                or (tli not in self.path_tlis and tli >= self.min_tli)
            ):
                return None
            latest_tli = tli
            if rem <= b - _SHORT_PHD:
                return page + _SHORT_PHD + ((rem + 7) & ~7), page, tli
            got += b - _SHORT_PHD
            page += b
        return None

    def _step(self) -> None:
        """Read one record at ``pos`` (after a page header if there) and advance past it."""
        ctx = self.ctx
        b = ctx.blcksz
        assert b is not None and ctx.fmt is not None
        pos = self.pos
        if pos >= self.end:
            self._finish(StopReason.END, self.end)
        if pos % b == 0:
            info, hsize, _rem = self._page(pos)
            rec = pos + hsize
            if info & _XLP_FIRST_IS_CONTRECORD:
                self._eow(rec, f"contrecord is requested by {LSN(rec)}")
        else:
            rec = pos
            if not self.buf_lsn <= rec < self.buf_end:
                self._page(pos - pos % b)
        if rec >= self.end or rec + _REC_HDR > self.end:
            self._finish(StopReason.END, self.end)
        if rec >= self.limit:
            self._missing(rec // ctx.segsz)
        spans = ctx.spans
        while self.span_i + 1 < len(spans):
            cur = spans[self.span_i]
            if cur.end is None or rec < cur.end.value:
                break
            self.span_i += 1
            if cur.end.value >= self.start:
                self.out.append(TimelineSwitch(cur.end, cur.timeline, spans[self.span_i].timeline))
        poff = rec % b
        i = rec - self.buf_lsn
        buf = self.buf
        data: bytes | None = None
        crc_ok = True
        if poff <= b - _REC_HDR:
            tot_len, xid, xprev, info, rmid = _RECORD.unpack_from(buf, i)
            reason = self._check_header(rec, tot_len, xprev, rmid)
            if reason is not None:
                self._eow(rec, reason)
            wanted = self.verify_all or _INTERESTING[(rmid << 8) | info]
            if poff + tot_len <= b:
                if rec + tot_len > self.end:
                    self._finish(StopReason.END, self.end)
                nxt = rec + ((tot_len + 7) & ~7)
                if wanted:
                    data = buf[i : i + tot_len]
            else:
                del buf  # the next pages may be in the next chunk: one chunk in memory
                try:
                    nxt, data, crc_ok, _hdr = self._assemble(rec, tot_len, (xid, xprev, info, rmid))
                except _Restart:
                    return
        else:
            tot_len = _U32.unpack_from(buf, i)[0]
            if tot_len < _REC_HDR:
                self._eow(
                    rec, f"invalid record length at {LSN(rec)}: expected at least 24, got {tot_len}"
                )
            del buf
            try:
                nxt, data, crc_ok, (xid, xprev, info, rmid) = self._assemble(rec, tot_len, None)
            except _Restart:
                return
            wanted = self.verify_all or _INTERESTING[(rmid << 8) | info]
        if data is not None:
            crc_ok = _record_crc(data) == _U32.unpack_from(data, 20)[0]
        if not crc_ok:
            self._eow(rec, f"incorrect resource manager data checksum in record at {LSN(rec)}")
        if rmid == _RM_XLOG and info & 0xF0 == _XLOG_SWITCH:
            # Pretend it extends to the end of the segment.
            segsz = ctx.segsz
            nxt = (nxt + segsz - 1) // segsz * segsz
        item: WalItem | None = None
        if wanted and _INTERESTING[(rmid << 8) | info]:
            assert data is not None
            item = self._decode(rec, nxt, xid, info, rmid, data)
        if isinstance(item, OverwriteContrecordRecord) and self.overwritten >= 0:
            if item.overwritten_lsn.value != self.overwritten:
                self._eow(
                    rec,
                    f"mismatching overwritten LSN {item.overwritten_lsn} -> "
                    f"{LSN(self.overwritten)}",
                )
            self.overwritten = -1
        if rec >= self.start:
            self.records += 1
        self.prev = rec
        self.pos = nxt
        self._mark()
        if item is not None and rec >= self.start:
            self.out.append(item)

    def _assemble(
        self, rec: int, tot_len: int, header: tuple[int, int, int, int] | None
    ) -> tuple[int, bytes | None, bool, tuple[int, int, int, int]]:
        """Read a record that continues on the next page(s) (XLogDecodeNextRecord).

        ``header`` is ``(xid, prev, info, rmid)`` when the whole record header is
        on the first page (None: it is split, and checked once assembled).
        Returns the next record pointer, the record's bytes when it is decoded,
        whether its CRC is right (checked on the way for a record that is not
        kept, under Verify.ALL; else True), and the header fields. Raises
        _Restart at an overwrite-contrecord page and _Stop at the end.
        """
        ctx = self.ctx
        b = ctx.blcksz
        assert b is not None
        page = rec - rec % b
        i = rec - self.buf_lsn
        got = page + b - rec
        pieces: list[bytes] | None = None
        crc = -1  # running CRC of the body (after the record header), when streamed
        head24 = b""
        if header is None or _INTERESTING[(header[3] << 8) | header[2]]:
            pieces = [self.buf[i : i + got]]
        elif self.verify_all:
            first = self.buf[i : i + got]
            head24, crc = first[:_REC_HDR], crc32c(first[_REC_HDR:])
        rem = 0
        hsize = _SHORT_PHD
        while got < tot_len:
            page += b
            if page + _SHORT_PHD > self.end:
                self._finish(StopReason.END, self.end)
            try:
                info, hsize, rem = self._page(page)
            except _Stop:
                if self.reason is StopReason.END_OF_WAL and self.end_of_wal is not None:
                    self.end_of_wal = attrs.evolve(self.end_of_wal, aborted_lsn=LSN(rec))
                raise
            if info & _XLP_FIRST_IS_OVERWRITE_CONTRECORD:
                # The continuation was lost and overwritten: read again from this page.
                self.overwritten = rec
                self.pos = page
                raise _Restart
            if not info & _XLP_FIRST_IS_CONTRECORD:
                self._eow(page, f"there is no contrecord flag at {LSN(rec)}", aborted=rec)
            if rem == 0 or tot_len != rem + got:
                self._eow(
                    page,
                    f"invalid contrecord length {rem} (expected {tot_len - got}) at {LSN(rec)}",
                    aborted=rec,
                )
            take = min(rem, b - hsize)
            if page + hsize + take > self.end:
                self._finish(StopReason.END, self.end)
            j = page - self.buf_lsn + hsize
            if header is None:
                assert pieces is not None
                head = b"".join((*pieces, self.buf[j : j + take]))
                tl, xid, xprev, xinfo, rmid = _RECORD.unpack_from(head, 0)
                header = (xid, xprev, xinfo, rmid)
                reason = self._check_header(rec, tl, xprev, rmid)
                if reason is not None:
                    self._eow(rec, reason)
                if _INTERESTING[(rmid << 8) | xinfo]:
                    pieces = [head]
                else:
                    pieces = None
                    if self.verify_all:
                        head24, crc = head[:_REC_HDR], crc32c(head[_REC_HDR:])
            elif pieces is not None:
                pieces.append(self.buf[j : j + take])
            elif crc >= 0:
                crc = crc32c(memoryview(self.buf)[j : j + take], crc)
            got += take
        nxt = page + hsize + ((rem + 7) & ~7)
        assert header is not None
        if pieces is not None:
            return nxt, b"".join(pieces), True, header
        if crc >= 0:
            ok = crc32c(head24[:20], crc) == _U32.unpack_from(head24, 20)[0]
            return nxt, None, ok, header
        return nxt, None, True, header

    def _decode(
        self, rec: int, nxt: int, xid: int, info: int, rmid: int, data: bytes
    ) -> WalItem | None:
        """The record's typed item; end of WAL for a malformed one."""
        ctx = self.ctx
        assert ctx.fmt is not None
        tli = ctx.spans[self.span_i].timeline
        main = _main_data(data, ctx.fmt)
        if main is None:
            self._eow(rec, f"invalid record headers at {LSN(rec)}")
            return None
        lsn, end_lsn = LSN(rec), LSN(nxt)
        n = len(main)
        if rmid == _RM_XACT:
            op = info & _XACT_OPMASK
            if n >= 8:
                when = _pg_time(_I64.unpack_from(main, 0)[0])
                if op in (_XACT_COMMIT, _XACT_ABORT):
                    ident: int | None = xid
                else:
                    ident = _twophase_xid(op, info, main, ctx.fmt)
                if when is not None and ident is not None:
                    return XactRecord(_XACT_KIND[op], lsn, end_lsn, ident, when, tli)
            self._eow(rec, f"malformed transaction record at {LSN(rec)}")
        op = info & 0xF0
        if op in (_XLOG_CHECKPOINT_SHUTDOWN, _XLOG_CHECKPOINT_ONLINE):
            if n >= 72:
                redo, this, prevtli = struct.unpack_from("<QII", main, 0)
                when = _unix_time(_I64.unpack_from(main, 64)[0])
                if when is not None:
                    return CheckpointRecord(
                        lsn,
                        end_lsn,
                        op == _XLOG_CHECKPOINT_SHUTDOWN,
                        LSN(redo),
                        this,
                        prevtli,
                        when,
                        tli,
                    )
        elif op == _XLOG_RESTORE_POINT:
            if n >= 72:
                when = _pg_time(_I64.unpack_from(main, 0)[0])
                name = main[8:72].split(b"\0", 1)[0].decode("utf-8", errors="replace")
                if when is not None:
                    return RestorePointRecord(lsn, end_lsn, name, when, tli)
        elif op == _XLOG_END_OF_RECOVERY:
            if n >= 16:
                us, this, prevtli = struct.unpack_from("<qII", main, 0)
                when = _pg_time(us)
                if when is not None:
                    return EndOfRecoveryRecord(lsn, end_lsn, when, this, prevtli, tli)
        elif op == _XLOG_SWITCH:
            return SwitchRecord(lsn, end_lsn, tli)
        elif op == _XLOG_BACKUP_END:
            if n >= 8:
                return BackupEndRecord(lsn, end_lsn, LSN(_U64.unpack_from(main, 0)[0]), tli)
        elif op == _XLOG_OVERWRITE_CONTRECORD and n >= 16:
            overwritten, us = struct.unpack_from("<Qq", main, 0)
            when = _pg_time(us)
            if when is not None:
                return OverwriteContrecordRecord(lsn, end_lsn, LSN(overwritten), when, tli)
        self._eow(rec, f"malformed WAL record (rmgr XLOG, info {info:02X}) at {LSN(rec)}")
        return None


def _record_crc(data: bytes) -> int:
    """A whole record's CRC as PostgreSQL computes it: the data after the header, then
    the header up to ``xl_crc``."""
    return crc32c(data[:20], crc32c(memoryview(data)[_REC_HDR:]))


def _item_lsn(item: WalItem) -> int:
    if isinstance(item, ScanEnd):
        return item.scanned_to.value
    return item.lsn.value


def _sysid(value: int | str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value.strip()) if isinstance(value, str) else int(value)
    except ValueError as exc:
        raise InputError(f"invalid system identifier {value!r}", value=value) from exc
    if not 0 <= number < 1 << 64:
        raise InputError(f"system identifier {number} is out of range", value=value)
    return number


def read_wal(
    wal_dirs: Sequence[WalSource],
    spans: Sequence[TimelineSpan],
    start: LSN,
    end: LSN,
    *,
    segment_size: int | None = None,
    system_identifier: int | str | None = None,
    major: int | None = None,
    verify: Verify = Verify.TAIL,
    chunk_size: int = _DEFAULT_CHUNK,
) -> Iterator[WalItem]:
    """Walk the WAL from ``start`` to ``end`` along ``spans`` (a timeline path).

    Yields the records of interest with a start in ``[start, end)`` and an end
    not after ``end``, :class:`SegmentRead` for each file opened,
    :class:`TimelineSwitch` where the path moves on, an :class:`EndOfWal` when
    the valid WAL ends before ``end``, and a :class:`ScanEnd` last.

    ``wal_dirs`` are where the segment files are (plain or compressed, e.g.
    ``000000010000000000000003.gz``): directories (paths), or archives read
    through their ``stat`` and ``open`` (any :class:`~pgsnap.wal.files.WalFiles`,
    every :class:`~pgsnap.protocols.WalArchive` among them); the first one
    holding a segment wins. Each segment is read from the file replay would open: the newest
    timeline of the path that has begun by then (so a switch segment comes
    from the child timeline, whose copy holds the parent's WAL up to the
    switchpoint), falling back to older timelines, and at last to the parent's
    ``.partial`` copy. ``start`` need not be a record's start (the first record
    at or after it is found as ``pg_waldump --start`` does).

    ``segment_size`` (default: from the first segment file's long header),
    ``system_identifier`` and ``major`` (default: from the first segment read)
    are checked against every segment. ``verify`` says which records' CRC-32C
    is checked (:class:`Verify`). At most ``chunk_size`` bytes of a segment
    are held in memory at a time.

    Raises :class:`~pgsnap.errors.ArchiveError` (with ``path``, and ``offset``
    where it applies) for a file that cannot be read or decompressed, has the
    wrong size, belongs to another cluster, or whose first page is not WAL of
    a supported version (or of ``major``).
    """
    start_v = LSN.parse(start).value
    end_v = LSN.parse(end).value
    path = list(spans)
    if not path:
        yield ScanEnd(StopReason.END, LSN(start_v), LSN(start_v))
        return
    if path[0].start is not None:
        start_v = max(start_v, path[0].start.value)
    if path[-1].end is not None:
        end_v = min(end_v, path[-1].end.value)
    if end_v <= start_v:
        yield ScanEnd(StopReason.END, LSN(start_v), LSN(start_v))
        return
    if major is not None and major not in PAGE_MAGIC:
        raise InputError(
            f"PostgreSQL {major} is not supported by the WAL reader",
            hint=f"supported major versions: {', '.join(map(str, PAGE_MAGIC))}",
            major=major,
        )
    if chunk_size < 65536 or chunk_size & (chunk_size - 1):
        raise InputError(f"chunk_size must be a power of two of at least 64 KiB, not {chunk_size}")
    files = _Files(wal_dirs)
    segsz = validate_segment_size(segment_size) if segment_size is not None else None
    if segsz is None:
        segsz = files.detect_segment_size()
        if segsz is None:
            some = files.first()
            if some is not None:
                raise ArchiveError(
                    f"cannot tell the WAL segment size: no segment file in "
                    f"{', '.join(files.locations)} begins with a long page header of "
                    f"PostgreSQL 12-18 and has a segment's size (e.g. {some[1]})",
                    hint="pass segment_size, and check that the directories hold this "
                    "cluster's WAL",
                    path=some[1],
                )
            yield ScanEnd(StopReason.MISSING_SEGMENT, LSN(start_v), LSN(start_v))
            return
    ctx = _Context(
        files=files,
        segsz=segsz,
        spans=path,
        chunk=min(chunk_size, segsz),
        fmt=_Format.of(major) if major is not None else None,
        sysid=_sysid(system_identifier),
    )
    scan = _Scan(ctx, start_v, end_v, verify)
    hold = verify is Verify.TAIL
    pending: collections.deque[WalItem] = collections.deque()
    held: tuple[int, int] | None = None  # records from here on are held back (Verify.TAIL)
    for batch in scan.walk():
        if not hold:
            yield from batch
            continue
        pending.extend(batch)
        held = scan.held_from() if held is None else max(held, scan.held_from())
        while pending and _item_lsn(pending[0]) < held[0]:
            yield pending.popleft()
    eow = scan.end_of_wal
    if hold and eow is not None:
        earlier = _reverify(ctx, held or scan.held_from(), eow)
        if earlier is not None:
            eow = earlier
            while pending and _item_lsn(pending[-1]) >= earlier.found_at.value:
                pending.pop()
            scan.end_of_wal = eow
            scan.scanned_to = eow.lsn.value
    yield from pending
    if eow is not None:
        yield eow
    assert scan.reason is not None
    yield ScanEnd(
        scan.reason,
        LSN(start_v),
        LSN(scan.scanned_to),
        end_of_wal=eow,
        missing=scan.missing,
        records=scan.records,
        bytes=scan.bytes,
    )


def _reverify(ctx: _Context, held: tuple[int, int], eow: EndOfWal) -> EndOfWal | None:
    """CRC-check every record from ``held`` (a record boundary and its prev-link,
    where the held-back records begin) to ``eow``; the end of the valid WAL if it
    is earlier, else None."""
    pos, prev = held
    if pos >= eow.lsn.value:
        return None
    check = _Scan(ctx, pos, eow.lsn.value, Verify.ALL, pos=pos, prev=prev)
    for _batch in check.walk():
        pass
    if check.reason is StopReason.END_OF_WAL and check.end_of_wal is not None:
        return check.end_of_wal
    return None


def scan_events(
    wal_dirs: Sequence[WalSource],
    spans: Sequence[TimelineSpan],
    start: LSN,
    end: LSN,
    *,
    segment_size: int | None = None,
    system_identifier: int | str | None = None,
    major: int | None = None,
    verify: Verify = Verify.TAIL,
) -> WalEvents:
    """Scan the WAL from ``start`` to ``end`` along ``spans`` into a :class:`WalEvents`.

    The inputs and the result are those of :func:`pgsnap.wal.dump.scan_wal`
    (without ``pg_waldump``): ``commits`` are the commits, plain and of
    prepared transactions (the prepared transaction's xid), as ``(lsn, time,
    xid)`` in LSN order; ``restore_points`` are ``(lsn, name)``;
    ``scanned_to`` is how far the scan got; ``complete`` when it read the whole
    stretch or found the end of the valid WAL in it (``end_of_wal``, the end of
    the last valid record: where replay ends). Raises what :func:`read_wal`
    raises.
    """
    commits: list[tuple[LSN, dt.datetime, int]] = []
    points: list[tuple[LSN, str]] = []
    first = LSN.parse(start)
    last: ScanEnd | None = None
    for item in read_wal(
        wal_dirs,
        spans,
        start,
        end,
        segment_size=segment_size,
        system_identifier=system_identifier,
        major=major,
        verify=verify,
    ):
        if isinstance(item, XactRecord):
            if item.kind.committed:
                commits.append((item.lsn, item.time, item.xid))
        elif isinstance(item, RestorePointRecord):
            points.append((item.lsn, item.name))
        elif isinstance(item, ScanEnd):
            last = item
    assert last is not None
    commits.sort(key=lambda c: c[0])
    points.sort(key=lambda p: p[0])
    return WalEvents(
        commits=tuple(dict.fromkeys(commits)),
        restore_points=tuple(dict.fromkeys(points)),
        scanned_from=first,
        scanned_to=last.scanned_to,
        complete=last.complete,
        end_of_wal=last.end_of_wal.lsn if last.end_of_wal is not None else None,
    )
