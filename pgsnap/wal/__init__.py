"""WAL: names, timelines, the archive, and what the segments hold.

A leaf package below the planner: it imports only :mod:`pgsnap.errors` and
:mod:`pgsnap.model` (and :mod:`pgsnap.protocols` for the archive's protocol).
Its modules, from pure to I/O:

* :mod:`pgsnap.wal.names` - segment sizes, LSN → segment → file name and back,
  what a file name in an archive is (:func:`segment_name`,
  :func:`parse_archive_name`);
* :mod:`pgsnap.wal.timelines` - ``.history`` files and the
  :class:`TimelineGraph`;
* :mod:`pgsnap.wal.backup_files` - ``.backup`` files and ``backup_label``;
* :mod:`pgsnap.wal.continuity` - *which segments exist*: the
  :class:`ArchiveIndex` of an archive listing and the continuity check
  (:func:`check`, :func:`switch_gaps`);
* :mod:`pgsnap.wal.health` - archiver health from ``pg_stat_archiver``;
* :mod:`pgsnap.wal.events` - :class:`WalEvents`, what a read of the WAL found;
* :mod:`pgsnap.wal.files` - how an archive's files are seen: :class:`ArchivedFile`
  (what ``stat`` says), :class:`ReadStream` (what ``open`` gives) and
  :class:`WalFiles`, the part of the archive protocol the reader uses;
* :mod:`pgsnap.wal.reader` - pgsnap's own WAL reader (page headers, records,
  CRCs, damaged segments: :func:`read_wal`, :func:`segment_problem`,
  :func:`archived_segment_problem`), reading directories (:class:`WalDirectory`)
  and archives alike;
* :mod:`pgsnap.wal.contents` - *what each segment holds*: the
  :class:`WalIndex` kept beside the archive, so each segment is read once;
* :mod:`pgsnap.wal.dump` - the same questions answered by ``pg_waldump``;
* :mod:`pgsnap.wal.archive` - :class:`DirectoryWalArchive`, the
  :class:`~pgsnap.protocols.WalArchive` that is a directory.

The names below are the package's face; the record types of the reader
(:class:`~pgsnap.wal.reader.XactRecord` and its kin) are in their module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

# Each name is imported from its module when first asked for (PEP 562): a command that
# needs the names of segments does not load the reader, the index and pg_waldump's
# wrapper (issue 27: start-up).
_WHERE: Final[dict[str, str]] = {
    "COMPRESSION_SUFFIXES": "pgsnap.wal.names",
    "DEFAULT_SEGMENT_SIZE": "pgsnap.wal.names",
    "PAGE_MAGIC": "pgsnap.wal.reader",
    "VALID_SEGMENT_SIZES": "pgsnap.wal.names",
    "ArchiveEntry": "pgsnap.wal.names",
    "ArchiveIndex": "pgsnap.wal.continuity",
    "ArchiveReport": "pgsnap.wal.continuity",
    "ArchivedFile": "pgsnap.wal.files",
    "ArchiverHealth": "pgsnap.wal.health",
    "BackupHistoryFile": "pgsnap.wal.backup_files",
    "DirectoryWalArchive": "pgsnap.wal.archive",
    "HistoryEntry": "pgsnap.wal.timelines",
    "PageHeader": "pgsnap.wal.reader",
    "ReadStream": "pgsnap.wal.files",
    "SegmentHeader": "pgsnap.wal.reader",
    "SegmentRange": "pgsnap.wal.continuity",
    "SwitchGap": "pgsnap.wal.continuity",
    "TimelineGraph": "pgsnap.wal.timelines",
    "TimelineHistory": "pgsnap.wal.timelines",
    "TimelineReport": "pgsnap.wal.continuity",
    "TimelineSpan": "pgsnap.wal.timelines",
    "WalCheck": "pgsnap.wal.continuity",
    "WalDirectory": "pgsnap.wal.reader",
    "WalEvents": "pgsnap.wal.events",
    "WalFileKind": "pgsnap.wal.names",
    "WalFiles": "pgsnap.wal.files",
    "WalIndex": "pgsnap.wal.contents",
    "WalQuery": "pgsnap.wal.contents",
    "archive_report": "pgsnap.wal.continuity",
    "archived_segment_problem": "pgsnap.wal.reader",
    "archived_segment_size": "pgsnap.wal.archive",
    "archiver_health": "pgsnap.wal.health",
    "backup_file_name": "pgsnap.wal.names",
    "check": "pgsnap.wal.continuity",
    "find_segment": "pgsnap.wal.reader",
    "find_waldump": "pgsnap.wal.dump",
    "history_file_name": "pgsnap.wal.names",
    "parse_archive_name": "pgsnap.wal.names",
    "parse_backup_file": "pgsnap.wal.backup_files",
    "parse_backup_label": "pgsnap.wal.backup_files",
    "parse_history": "pgsnap.wal.timelines",
    "parse_page_header": "pgsnap.wal.reader",
    "parse_segment_name": "pgsnap.wal.names",
    "read_archived_segment_header": "pgsnap.wal.reader",
    "read_events": "pgsnap.wal.contents",
    "read_segment_header": "pgsnap.wal.reader",
    "read_wal": "pgsnap.wal.reader",
    "recoverable_window": "pgsnap.wal.continuity",
    "scan_events": "pgsnap.wal.reader",
    "scan_wal": "pgsnap.wal.dump",
    "segment_name": "pgsnap.wal.names",
    "segment_number": "pgsnap.wal.names",
    "segment_problem": "pgsnap.wal.reader",
    "segment_start": "pgsnap.wal.names",
    "segments_per_xlogid": "pgsnap.wal.names",
    "segments_to_replay": "pgsnap.wal.continuity",
    "switch_gaps": "pgsnap.wal.continuity",
    "validate_segment_size": "pgsnap.wal.names",
    "walfile_name": "pgsnap.wal.names",
    "walfile_name_offset": "pgsnap.wal.names",
}

if TYPE_CHECKING:
    from pgsnap.wal.archive import DirectoryWalArchive, archived_segment_size
    from pgsnap.wal.backup_files import BackupHistoryFile, parse_backup_file, parse_backup_label
    from pgsnap.wal.contents import WalIndex, WalQuery, read_events
    from pgsnap.wal.continuity import (
        ArchiveIndex,
        ArchiveReport,
        SegmentRange,
        SwitchGap,
        TimelineReport,
        WalCheck,
        archive_report,
        check,
        recoverable_window,
        segments_to_replay,
        switch_gaps,
    )
    from pgsnap.wal.dump import find_waldump, scan_wal
    from pgsnap.wal.events import WalEvents
    from pgsnap.wal.files import ArchivedFile, ReadStream, WalFiles
    from pgsnap.wal.health import ArchiverHealth, archiver_health
    from pgsnap.wal.names import (
        COMPRESSION_SUFFIXES,
        DEFAULT_SEGMENT_SIZE,
        VALID_SEGMENT_SIZES,
        ArchiveEntry,
        WalFileKind,
        backup_file_name,
        history_file_name,
        parse_archive_name,
        parse_segment_name,
        segment_name,
        segment_number,
        segment_start,
        segments_per_xlogid,
        validate_segment_size,
        walfile_name,
        walfile_name_offset,
    )
    from pgsnap.wal.reader import (
        PAGE_MAGIC,
        PageHeader,
        SegmentHeader,
        WalDirectory,
        archived_segment_problem,
        find_segment,
        parse_page_header,
        read_archived_segment_header,
        read_segment_header,
        read_wal,
        scan_events,
        segment_problem,
    )
    from pgsnap.wal.timelines import (
        HistoryEntry,
        TimelineGraph,
        TimelineHistory,
        TimelineSpan,
        parse_history,
    )


__all__ = [
    "COMPRESSION_SUFFIXES",
    "DEFAULT_SEGMENT_SIZE",
    "PAGE_MAGIC",
    "VALID_SEGMENT_SIZES",
    "ArchiveEntry",
    "ArchiveIndex",
    "ArchiveReport",
    "ArchivedFile",
    "ArchiverHealth",
    "BackupHistoryFile",
    "DirectoryWalArchive",
    "HistoryEntry",
    "PageHeader",
    "ReadStream",
    "SegmentHeader",
    "SegmentRange",
    "SwitchGap",
    "TimelineGraph",
    "TimelineHistory",
    "TimelineReport",
    "TimelineSpan",
    "WalCheck",
    "WalDirectory",
    "WalEvents",
    "WalFileKind",
    "WalFiles",
    "WalIndex",
    "WalQuery",
    "archive_report",
    "archived_segment_problem",
    "archived_segment_size",
    "archiver_health",
    "backup_file_name",
    "check",
    "find_segment",
    "find_waldump",
    "history_file_name",
    "parse_archive_name",
    "parse_backup_file",
    "parse_backup_label",
    "parse_history",
    "parse_page_header",
    "parse_segment_name",
    "read_archived_segment_header",
    "read_events",
    "read_segment_header",
    "read_wal",
    "recoverable_window",
    "scan_events",
    "scan_wal",
    "segment_name",
    "segment_number",
    "segment_problem",
    "segment_start",
    "segments_per_xlogid",
    "segments_to_replay",
    "switch_gaps",
    "validate_segment_size",
    "walfile_name",
    "walfile_name_offset",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'pgsnap.wal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain one
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
