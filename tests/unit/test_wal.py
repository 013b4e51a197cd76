"""Unit tests of pgsnap.wal: names, timelines, backup files, the index and the check."""

from __future__ import annotations

import datetime as dt
import pickle
import re
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from pgsnap.errors import (
    BackupFileError,
    HistoryFileError,
    InputError,
    LSNError,
    TimelineError,
    WalGapError,
    WalNameError,
)
from pgsnap.model import LSN, ArchiverStatus, from_json, to_json
from pgsnap.wal import (
    VALID_SEGMENT_SIZES,
    ArchiveEntry,
    ArchiveIndex,
    HistoryEntry,
    SegmentRange,
    TimelineGraph,
    TimelineHistory,
    TimelineSpan,
    WalFileKind,
    archiver_health,
    backup_file_name,
    check,
    history_file_name,
    parse_archive_name,
    parse_backup_file,
    parse_backup_label,
    parse_history,
    parse_segment_name,
    recoverable_window,
    segment_name,
    segment_number,
    segment_start,
    segments_per_xlogid,
    validate_segment_size,
    walfile_name,
    walfile_name_offset,
)

MB = 1024 * 1024
SEG16 = 16 * MB

REAL_HISTORY_3 = (
    '1\t0/5000EC0\tbefore 2026-11-30 00:17:56.52352+00\n\n\n2\t0/5000F50\tat restore point "rp1"\n'
)

BACKUP_FILE = """START WAL LOCATION: 0/4000028 (file 000000010000000000000004)
STOP WAL LOCATION: 0/4000100 (file 000000010000000000000004)
CHECKPOINT LOCATION: 0/4000060
BACKUP METHOD: streamed
BACKUP FROM: primary
START TIME: 2026-11-30 00:17:51 UTC
LABEL: snap-2
START TIMELINE: 1
STOP TIME: 2026-11-30 00:17:52 UTC
STOP TIMELINE: 1
"""

BACKUP_LABEL = """START WAL LOCATION: 0/4000028 (file 000000010000000000000004)
CHECKPOINT LOCATION: 0/4000060
BACKUP METHOD: streamed
BACKUP FROM: primary
START TIME: 2026-11-30 00:17:51 UTC
LABEL: snap: with colons
START TIMELINE: 1
"""


def L(text: str) -> LSN:
    return LSN.parse(text)


# ----------------------------------------------------------------------------- segments


def test_valid_segment_sizes_are_powers_of_two_1mib_to_1gib():
    assert VALID_SEGMENT_SIZES[0] == MB
    assert VALID_SEGMENT_SIZES[-1] == 1024 * MB
    assert len(VALID_SEGMENT_SIZES) == 11
    assert all(validate_segment_size(s) == s for s in VALID_SEGMENT_SIZES)


@pytest.mark.parametrize("bad", [0, -SEG16, SEG16 + 1, 512 * 1024, 2048 * MB, True, "16MB", 16.0])
def test_invalid_segment_size(bad):
    with pytest.raises(WalNameError, match="segment size") as exc:
        validate_segment_size(bad)
    assert exc.value.hint
    assert isinstance(exc.value, ValueError)


def test_segments_per_xlogid():
    assert segments_per_xlogid(SEG16) == 256
    assert segments_per_xlogid(MB) == 4096
    assert segments_per_xlogid(1024 * MB) == 4


@pytest.mark.parametrize(
    ("segsz", "name"),
    [
        (SEG16, "0000000100000016000000B3"),
        (64 * MB, "00000001000000160000002C"),
        (1024 * MB, "000000010000001600000002"),
    ],
)
def test_reference_names(segsz, name):
    assert walfile_name(L("16/B374D848"), 1, segsz) == name
    tli, segno = parse_segment_name(name, segsz)
    assert tli == 1
    assert segno == segment_number(L("16/B374D848"), segsz)
    assert segment_name(1, segno, segsz) == name


def test_segment_number_and_start():
    assert segment_number(L("0/3000000"), SEG16) == 3
    assert segment_number("0/2FFFFFF", SEG16) == 2
    assert segment_start(3, SEG16) == L("0/3000000")
    assert segment_start(0x16B3, SEG16) == L("16/B3000000")


def test_walfile_name_boundaries():
    assert walfile_name("0/3000000", 1, SEG16) == "000000010000000000000003"
    assert walfile_name("0/3000000", 1, SEG16, previous_at_boundary=True) == (
        "000000010000000000000002"
    )
    assert walfile_name("0/3000001", 1, SEG16, previous_at_boundary=True) == (
        "000000010000000000000003"
    )
    assert walfile_name("0/0", 1, SEG16) == "000000010000000000000000"
    assert walfile_name("0/0", 1, SEG16, previous_at_boundary=True) == "00000001FFFFFFFF000000FF"
    assert walfile_name("1/0", 2, SEG16, previous_at_boundary=True) == ("0000000200000000000000FF")
    assert walfile_name("FFFFFFFF/FFFFFFFF", 0xFFFFFFFF, SEG16) == "FFFFFFFFFFFFFFFF000000FF"


def test_walfile_name_offset():
    assert walfile_name_offset("16/B374D848", 1, SEG16) == ("0000000100000016000000B3", 0x74D848)
    # PostgreSQL 12-16: previous file, offset 0 at a boundary.
    assert walfile_name_offset("0/3000000", 1, SEG16, previous_at_boundary=True) == (
        "000000010000000000000002",
        0,
    )


def test_backup_and_history_file_names():
    assert backup_file_name("0/4000028", 1, SEG16) == "000000010000000000000004.00000028.backup"
    assert history_file_name(3) == "00000003.history"
    assert history_file_name(0x1A) == "0000001A.history"
    with pytest.raises(WalNameError):
        history_file_name(0)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 3, SEG16), "timeline"),
        ((0x100000000, 3, SEG16), "timeline"),
        ((1, -1, SEG16), "out of range"),
        ((1, 0x10000000000, SEG16), "out of range"),
        ((1, 3, 12345), "segment size"),
    ],
)
def test_segment_name_errors(args, match):
    with pytest.raises(WalNameError, match=match):
        segment_name(*args)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "00000001000000000000000",  # 23
        "0000000100000000000000030",  # 25
        "00000001000000000000000G",
        "0x000001000000000000000003",
        "+00000010000000000000003",
        " 00000010000000000000003",
        "0000_001000000000000000003",
        "000000010000000000000003.partial",
        "00000002.history",
        "٠٠٠٠٠٠٠١٠٠٠٠٠٠٠٠٠٠٠٠٠٠٠٣",  # Arabic-Indic digits: int() accepts them
    ],
)
def test_parse_segment_name_rejects(name):
    with pytest.raises(WalNameError) as exc:
        parse_segment_name(name, SEG16)
    assert exc.value.hint


def test_parse_segment_name_rejects_timeline_zero_and_big_seg():
    with pytest.raises(WalNameError, match="timeline 0"):
        parse_segment_name("000000000000000000000003", SEG16)
    with pytest.raises(WalNameError, match="cannot exist"):
        parse_segment_name("000000010000000000000100", SEG16)
    # ...but that name is fine with 1 MiB segments (4096 per log id).
    assert parse_segment_name("000000010000000000000100", MB) == (1, 0x100)


def test_parse_segment_name_lower_case():
    assert parse_segment_name("0000000a00000016000000b3", SEG16) == (10, 0x16B3)


def test_lsn_errors_are_typed():
    with pytest.raises(LSNError):
        segment_number("nope", SEG16)
    with pytest.raises(LSNError):
        LSN(-1)
    with pytest.raises(LSNError):
        LSN(1 << 64)


# ----------------------------------------------------------------------------- archive names


@pytest.mark.parametrize(
    ("name", "kind", "tli", "log", "seg", "off", "comp"),
    [
        ("000000010000000000000003", WalFileKind.SEGMENT, 1, 0, 3, None, None),
        ("0000000a00000016000000b3", WalFileKind.SEGMENT, 10, 0x16, 0xB3, None, None),
        ("000000010000000000000003.gz", WalFileKind.SEGMENT, 1, 0, 3, None, "gz"),
        ("000000010000000000000003.zst", WalFileKind.SEGMENT, 1, 0, 3, None, "zst"),
        ("000000010000000000000003.partial", WalFileKind.PARTIAL, 1, 0, 3, None, None),
        ("000000010000000000000003.gz.partial", WalFileKind.PARTIAL, 1, 0, 3, None, "gz"),
        ("000000010000000000000003.partial.lz4", WalFileKind.PARTIAL, 1, 0, 3, None, "lz4"),
        ("00000002.history", WalFileKind.HISTORY, 2, None, None, None, None),
        ("0000001A.history.gz", WalFileKind.HISTORY, 26, None, None, None, "gz"),
        (
            "000000010000000000000004.00000028.backup",
            WalFileKind.BACKUP,
            1,
            0,
            4,
            0x28,
            None,
        ),
        (
            "000000010000000000000004.00000028.backup.bz2",
            WalFileKind.BACKUP,
            1,
            0,
            4,
            0x28,
            "bz2",
        ),
    ],
)
def test_parse_archive_name(name, kind, tli, log, seg, off, comp):
    e = parse_archive_name(name)
    assert e == ArchiveEntry(name, kind, tli, log, seg, off, comp)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "x",
        "000000000000000000000003",  # timeline 0
        "00000000.history",
        "000000010000000000000003.tmp",
        "000000010000000000000003.gz.partial.gz",  # compressed twice
        "000000010000000000000003.GZ",
        "000000010000000000000003.backup",
        "00000001.History",
        "000000010000000000000003\n",
        "archive_status",
        ".000000010000000000000003",
        "0000000100000000000000030",
    ],
)
def test_parse_archive_name_unknown(name):
    assert parse_archive_name(name).kind is WalFileKind.UNKNOWN


def test_archive_entry_helpers():
    e = parse_archive_name("0000000100000016000000b3.gz")
    assert e.segment_number(SEG16) == 0x16B3
    assert e.base_name == "0000000100000016000000B3"
    assert parse_archive_name("000000010000000000000100").segment_number(SEG16) is None
    assert parse_archive_name("00000002.history.gz").base_name == "00000002.history"
    assert parse_archive_name("xx").base_name == "xx"
    assert parse_archive_name("00000002.history").segment_number(SEG16) is None
    b = parse_archive_name("000000010000000000000004.00000028.backup.gz")
    assert b.base_name == "000000010000000000000004.00000028.backup"
    assert parse_archive_name("000000010000000000000004.gz.partial").base_name == (
        "000000010000000000000004.partial"
    )


# ----------------------------------------------------------------------------- history


def test_parse_real_history():
    h = parse_history(REAL_HISTORY_3, 3)
    assert h.timeline == 3
    assert h.entries == (
        HistoryEntry(1, L("0/5000EC0"), "before 2026-11-30 00:17:56.52352+00"),
        HistoryEntry(2, L("0/5000F50"), 'at restore point "rp1"'),
    )
    assert h.parents == (1, 2)
    assert h.parent == 2
    assert h.begin == L("0/5000F50")
    assert h.ancestry == (1, 2, 3)


def test_parse_history_comments_tabs_crlf_and_missing_reason():
    text = (
        "# comment\r\n  # indented comment\n1\t0/3000000\treason\twith\ttabs  \r\n\n2\t0/4000000\n"
    )
    h = parse_history(text, 5)
    assert h.entries[0].reason == "reason\twith\ttabs"
    assert h.entries[1] == HistoryEntry(2, L("0/4000000"), "")


def test_parse_history_empty_is_root():
    h = parse_history("", 1)
    assert h.entries == ()
    assert h.parent is None
    assert h.begin is None


def test_history_to_text_round_trip():
    h = parse_history(REAL_HISTORY_3, 3)
    assert parse_history(h.to_text(), 3) == h


@pytest.mark.parametrize(
    ("text", "timeline", "match"),
    [
        ("1\t0/3000000\tr\n1\t0/4000000\tr\n", 3, r"line 2: parent timeline 1 does not follow 1"),
        ("2\t0/3000000\tr\n1\t0/4000000\tr\n", 3, r"line 2: .*must increase"),
        ("1\t0/3000000\tr\n", 1, "between 1 and 0"),
        ("3\t0/3000000\tr\n", 3, "between 1 and 2"),
        ("0\t0/3000000\tr\n", 3, "parent timeline 0"),
        ("1\t0/5000000\tr\n\n2\t0/4000000\tr\n", 3, r"line 3: switchpoint 0/4000000 is before"),
        ("1 0/3000000 r\n", 3, r"line 1: expected"),
        ("x\t0/3000000\tr\n", 3, r"line 1: expected"),
        ("-1\t0/3000000\tr\n", 3, r"line 1: expected"),
        ("1\n", 3, r"line 1: expected"),
        ("1\tnot-an-lsn\tr\n", 3, r"line 1: malformed switchpoint"),
        ("1\t1FFFFFFFF/0\tr\n", 3, r"malformed switchpoint"),
    ],
)
def test_parse_history_errors(text, timeline, match):
    with pytest.raises(HistoryFileError, match=match) as exc:
        parse_history(text, timeline)
    assert exc.value.hint


@pytest.mark.parametrize("tli", [0, -1, 1 << 32, True, "3"])
def test_parse_history_bad_timeline(tli):
    with pytest.raises(HistoryFileError, match="timeline"):
        parse_history("", tli)


def test_timeline_history_validates_on_construction():
    with pytest.raises(HistoryFileError):
        TimelineHistory(2, (HistoryEntry(2, L("0/1")),))
    with pytest.raises(HistoryFileError):
        TimelineHistory(0)


# ----------------------------------------------------------------------------- graph


@pytest.fixture
def graph3() -> TimelineGraph:
    return TimelineGraph.from_histories([parse_history(REAL_HISTORY_3, 3)])


def test_graph_derives_ancestors(graph3):
    assert graph3.timelines() == (1, 2, 3)
    assert graph3.latest() == 3
    assert graph3.parent_of(3) == 2
    assert graph3.parent_of(2) == 1
    assert graph3.parent_of(1) is None
    assert graph3.switchpoint_of(2) == L("0/5000EC0")
    assert graph3.switchpoint_of(1) is None
    assert graph3.children_of(1) == (2,)
    assert 2 in graph3
    assert 7 not in graph3


def test_graph_path(graph3):
    assert graph3.path(3) == (
        TimelineSpan(1, None, L("0/5000EC0")),
        TimelineSpan(2, L("0/5000EC0"), L("0/5000F50")),
        TimelineSpan(3, L("0/5000F50"), None),
    )
    assert graph3.path(3, from_timeline=2) == graph3.path(3)[1:]
    assert graph3.path(1) == (TimelineSpan(1, None, None),)
    with pytest.raises(TimelineError, match="not in the history"):
        graph3.path(2, from_timeline=3)


def test_graph_contains_switchpoint_belongs_to_child(graph3):
    sp = L("0/5000EC0")
    assert graph3.contains(1, sp - 1, 3)
    assert not graph3.contains(1, sp, 3)
    assert graph3.contains(2, sp, 3)
    assert graph3.timeline_at(sp, 3) == 2
    assert graph3.timeline_at(L("0/5000F50"), 3) == 3
    assert graph3.timeline_at(L("0/1000000"), 3) == 1
    assert graph3.timeline_at(L("0/9000000"), 2) == 2
    assert not graph3.contains(3, L("0/1000000"), 3)  # before timeline 3 began
    assert not graph3.contains(7, L("0/1000000"), 3)


def test_graph_unknown_timeline(graph3):
    with pytest.raises(TimelineError, match=r"00000007\.history") as exc:
        graph3.path(7)
    assert exc.value.details["missing_history"] == "00000007.history"
    assert exc.value.hint


def test_graph_conflicting_histories():
    h3 = parse_history("1\t0/3000000\tx\n2\t0/4000000\ty\n", 3)
    h2 = parse_history("1\t0/3500000\tz\n", 2)
    with pytest.raises(HistoryFileError, match="conflicting histories for timeline 2"):
        TimelineGraph.from_histories([h3, h2])
    same2 = parse_history("1\t0/3000000\tother reason\n", 2)
    g = TimelineGraph.from_histories([h3, same2])
    assert g.timelines() == (1, 2, 3)
    with pytest.raises(HistoryFileError, match="conflicting"):
        TimelineGraph.from_histories([h2, parse_history("1\t0/3600000\tz\n", 2)])


def test_graph_branches_and_root_other_than_one():
    h2 = parse_history("1\t0/3000000\ta\n", 2)
    h3 = parse_history("1\t0/3800000\tb\n", 3)  # another branch of 1
    h6 = parse_history("4\t0/9000000\tc\n", 6)  # history of 4 unknown: 4 is a root
    g = TimelineGraph.from_histories([h6, h3, h2])
    assert g.children_of(1) == (2, 3)
    assert g.latest() == 6
    assert g.path(6) == (
        TimelineSpan(4, None, L("0/9000000")),
        TimelineSpan(6, L("0/9000000"), None),
    )
    assert g.contains(1, L("0/3400000"), 3)
    assert not g.contains(1, L("0/3400000"), 2)
    assert g == TimelineGraph([h2, h3, h6])
    assert hash(g) == hash(TimelineGraph([h2, h3, h6]))
    assert "2<-1@0/3000000" in repr(g)


def test_empty_graph():
    g = TimelineGraph.from_histories([])
    assert g.latest() == 1
    assert g.timelines() == (1,)


# ----------------------------------------------------------------------------- backup files


def test_parse_backup_file_reference_example():
    b = parse_backup_file(BACKUP_FILE)
    assert b.start_lsn == L("0/4000028")
    assert b.start_wal_file == "000000010000000000000004"
    assert b.stop_lsn == L("0/4000100")
    assert b.stop_wal_file == "000000010000000000000004"
    assert b.checkpoint_lsn == L("0/4000060")
    assert b.backup_method == "streamed"
    assert b.backup_from == "primary"
    assert b.start_time == dt.datetime(2026, 11, 30, 0, 17, 51, tzinfo=dt.UTC)
    assert b.stop_time == dt.datetime(2026, 11, 30, 0, 17, 52, tzinfo=dt.UTC)
    assert b.label == "snap-2"
    assert b.start_timeline == 1
    assert b.stop_timeline == 1
    assert not b.is_incremental
    # the archive name of that file
    assert backup_file_name(b.start_lsn, b.start_timeline, SEG16) == (
        "000000010000000000000004.00000028.backup"
    )


def test_parse_backup_label_has_no_stop_and_label_with_colons():
    b = parse_backup_label(BACKUP_LABEL)
    assert b.stop_lsn is None
    assert b.stop_wal_file is None
    assert b.stop_time is None
    assert b.stop_timeline is None
    assert b.label == "snap: with colons"


def test_parse_backup_label_incremental_and_unknown_lines():
    text = BACKUP_LABEL + "INCREMENTAL FROM LSN: 0/2000028\nINCREMENTAL FROM TLI: 1\nFUTURE: x\n"
    b = parse_backup_label(text)
    assert b.incremental_from_lsn == L("0/2000028")
    assert b.incremental_from_tli == 1
    assert b.is_incremental


@pytest.mark.parametrize(
    ("zone", "expected"),
    [
        ("UTC", dt.timedelta(0)),
        ("GMT", dt.timedelta(0)),
        ("+03", dt.timedelta(hours=3)),
        ("-03", dt.timedelta(hours=-3)),
        ("+0530", dt.timedelta(hours=5, minutes=30)),
        ("-03:30", dt.timedelta(hours=-3, minutes=-30)),
    ],
)
def test_backup_times_with_zones(zone, expected):
    b = parse_backup_label(BACKUP_LABEL.replace(" UTC", f" {zone}"))
    assert b.start_time is not None
    assert b.start_time.utcoffset() == expected
    assert b.start_time_text == f"2026-11-30 00:17:51 {zone}"


def test_backup_time_abbreviation_needs_log_timezone():
    text = BACKUP_LABEL.replace("2026-11-30 00:17:51 UTC", "2026-07-01 10:00:00 CEST")
    b = parse_backup_label(text)
    assert b.start_time is None
    assert b.start_time_text == "2026-07-01 10:00:00 CEST"
    b2 = parse_backup_label(text, log_timezone=ZoneInfo("Europe/Berlin"))
    assert b2.start_time == dt.datetime(2026, 7, 1, 8, 0, tzinfo=dt.UTC)
    # an abbreviation that does not match the zone stays unresolved
    b3 = parse_backup_label(text, log_timezone=ZoneInfo("America/New_York"))
    assert b3.start_time is None


def test_backup_time_ambiguous_hour_uses_abbreviation():
    # 2026-10-25 02:30 happens twice in Berlin: CEST (fold 0) then CET (fold 1)
    zone = ZoneInfo("Europe/Berlin")
    for abbrev, hour_utc in (("CEST", 0), ("CET", 1)):
        text = BACKUP_LABEL.replace("2026-11-30 00:17:51 UTC", f"2026-10-25 02:30:00 {abbrev}")
        b = parse_backup_label(text, log_timezone=zone)
        assert b.start_time is not None
        assert b.start_time.astimezone(dt.UTC).hour == hour_utc


def test_backup_time_garbage_kept_as_text():
    b = parse_backup_label(BACKUP_LABEL.replace("2026-11-30 00:17:51 UTC", "yesterday"))
    assert b.start_time is None
    assert b.start_time_text == "yesterday"


@pytest.mark.parametrize(
    ("mutate", "parser", "match"),
    [
        (lambda t: t.replace("START WAL LOCATION", "X"), parse_backup_file, "START WAL LOCATION"),
        (lambda t: t.replace("STOP WAL LOCATION", "X"), parse_backup_file, "STOP WAL LOCATION"),
        (lambda t: t.replace("CHECKPOINT LOCATION", "X"), parse_backup_file, "CHECKPOINT"),
        (lambda t: t.replace("(file 0000", "(fil 0000", 1), parse_backup_file, "line 1"),
        (lambda t: t.replace("0/4000060", "0/zz"), parse_backup_file, "line 3.*not an LSN"),
        (lambda t: t.replace("START TIMELINE: 1", "START TIMELINE: 2"), parse_backup_file, "match"),
        (lambda t: t.replace("STOP TIMELINE: 1", "STOP TIMELINE: x"), parse_backup_file, "line 10"),
        (lambda t: t.replace("STOP TIMELINE: 1", "STOP TIMELINE: 0"), parse_backup_file, "line 10"),
        (lambda t: t.replace("0/4000100", "0/4000000"), parse_backup_file, "before START"),
        (lambda t: t.replace("START WAL", "X"), parse_backup_label, "START WAL LOCATION"),
    ],
)
def test_backup_file_errors(mutate, parser, match):
    text = BACKUP_FILE if parser is parse_backup_file else BACKUP_LABEL
    with pytest.raises(BackupFileError, match=match) as exc:
        parser(mutate(text))
    assert exc.value.hint


def test_backup_label_is_not_a_backup_file():
    with pytest.raises(BackupFileError, match="parse_backup_label"):
        parse_backup_file(BACKUP_LABEL)
    with pytest.raises(BackupFileError):
        parse_backup_file(b"bytes")  # type: ignore[arg-type]


def test_backup_file_without_optional_lines():
    text = (
        "START WAL LOCATION: 0/4000028 (file 000000020000000000000004)\n"
        "CHECKPOINT LOCATION: 0/4000060\nLABEL:\n"
    )
    b = parse_backup_label(text)
    assert b.start_timeline == 2  # from the file name
    assert b.label == ""
    assert b.start_time is None
    assert b.backup_method is None


# ----------------------------------------------------------------------------- index


def names_for(tli: int, segnos, segsz: int = SEG16):
    return [segment_name(tli, s, segsz) for s in segnos]


def test_index_build_classifies():
    names = [
        *names_for(1, range(1, 10)),
        "000000010000000000000005.gz",  # duplicate of a present one, compressed
        "00000001000000000000000C.gz",
        "000000010000000000000100",  # impossible at 16 MiB
        "000000000000000000000003",
        "000000010000000000000010.partial",
        "00000002.history",
        "000000010000000000000004.00000028.backup",
        "000000010000000000000004.01000028.backup",  # offset >= segment size
        "README",
        *names_for(2, [9, 10, 11]),
    ]
    idx = ArchiveIndex.build(names, SEG16)
    assert idx.ranges(1) == (SegmentRange(1, 1, 9), SegmentRange(1, 0xC, 0xC))
    assert idx.gaps(1) == (SegmentRange(1, 10, 11),)
    assert idx.ranges(2) == (SegmentRange(2, 9, 11),)
    assert idx.gaps(2) == ()
    assert idx.ranges(3) == ()
    assert idx.timelines() == (1, 2)
    assert idx.history_names == ("00000002.history",)
    assert idx.backup_names == ("000000010000000000000004.00000028.backup",)
    assert idx.partial_names == ("000000010000000000000010.partial",)
    assert idx.unknown_names == (
        "000000000000000000000003",
        "000000010000000000000004.01000028.backup",
        "000000010000000000000100",
        "README",
    )
    assert idx.has_segment(1, 5)
    assert idx.has_segment(1, 0xC)
    assert not idx.has_segment(1, 0x10)  # only a .partial
    assert not idx.has_segment(1, 0)
    assert not idx.has_segment(3, 1)
    assert idx.has_history(2)
    assert not idx.has_history(3)
    assert idx.segment_count == 13
    assert "segments=13" in repr(idx)


def test_index_lower_case_and_unsorted_input():
    names = ["0000000100000000000000ff", "000000010000000100000000", "0000000100000000000000FE"]
    idx = ArchiveIndex.build(names, SEG16)
    assert idx.ranges(1) == (SegmentRange(1, 0xFE, 0x100),)


def test_index_sparse_segment_numbers():
    idx = ArchiveIndex.build(names_for(1, [0, 1, 5, 1 << 38, (1 << 38) + 1]), SEG16)
    assert idx.ranges(1) == (
        SegmentRange(1, 0, 1),
        SegmentRange(1, 5, 5),
        SegmentRange(1, 1 << 38, (1 << 38) + 1),
    )


def test_index_validates_ranges_and_round_trips_json():
    idx = ArchiveIndex.build([*names_for(1, [1, 2, 4]), "00000002.history"], SEG16)
    assert from_json(ArchiveIndex, to_json(idx)) == idx
    with pytest.raises(WalNameError, match="sorted"):
        ArchiveIndex(SEG16, (SegmentRange(1, 3, 4), SegmentRange(1, 1, 2)))
    with pytest.raises(WalNameError, match="adjacent"):
        ArchiveIndex(SEG16, (SegmentRange(1, 1, 2), SegmentRange(1, 3, 4)))
    with pytest.raises(WalNameError):
        SegmentRange(1, 5, 4)
    with pytest.raises(WalNameError):
        ArchiveIndex(123)


def test_segment_range_helpers():
    r = SegmentRange(1, 3, 4)
    assert r.count == 2
    assert r.names(SEG16) == ("000000010000000000000003", "000000010000000000000004")
    assert r.lsn_range(SEG16) == (L("0/3000000"), L("0/5000000"))


def test_recoverable_window():
    idx = ArchiveIndex.build(names_for(1, [3, 4, 5, 7]), SEG16)
    assert recoverable_window(idx, 1, L("0/3000028")) == (L("0/3000028"), L("0/6000000"))
    assert recoverable_window(idx, 1, L("0/7000000")) == (L("0/7000000"), L("0/8000000"))
    assert recoverable_window(idx, 1, L("0/6000000")) is None
    assert recoverable_window(idx, 2, L("0/3000000")) is None


# ----------------------------------------------------------------------------- check


def test_check_single_timeline_complete():
    idx = ArchiveIndex.build(names_for(1, range(3, 8)), SEG16)
    g = TimelineGraph()
    c = check(idx, (1, L("0/4000028")), L("0/4000100"), 1, g)
    assert c.complete
    assert c.missing == ()
    assert c.segments_needed == 1
    assert c.reachable_lsn == L("0/5000000")
    assert c.end_lsn == L("0/4000100")
    c.raise_for_gap()  # no error
    assert "complete" in c.summary()


def test_check_end_is_exclusive_at_segment_boundary():
    idx = ArchiveIndex.build(names_for(1, [4]), SEG16)
    c = check(idx, (1, L("0/4000028")), L("0/5000000"), 1, TimelineGraph())
    assert c.complete  # segment 5 is not needed for WAL before 0/5000000
    c = check(idx, (1, L("0/4000028")), L("0/5000001"), 1, TimelineGraph())
    assert not c.complete
    assert c.missing == ("000000010000000000000005",)
    c = check(idx, (1, L("0/4000028")), L("0/4000028"), 1, TimelineGraph())
    assert c.complete
    assert c.segments_needed == 1


def test_check_gap_reports_missing_and_reachable():
    idx = ArchiveIndex.build(names_for(1, [3, 4, 7, 8]), SEG16)
    c = check(idx, (1, L("0/3000028")), L("0/8000100"), 1, TimelineGraph())
    assert not c.complete
    assert c.missing == ("000000010000000000000005", "000000010000000000000006")
    assert c.missing_count == 2
    assert c.reachable_lsn == L("0/5000000")
    assert c.reachable_timeline == 1
    assert c.segments_needed == 6
    with pytest.raises(WalGapError, match="000000010000000000000005 and 1 more") as exc:
        c.raise_for_gap()
    assert exc.value.missing == c.missing
    assert exc.value.reachable_lsn == L("0/5000000")
    assert pickle.loads(pickle.dumps(exc.value)).missing == c.missing


def test_check_missing_is_bounded():
    idx = ArchiveIndex.build(names_for(1, [1, 100_000]), SEG16)
    c = check(idx, (1, L("0/1000000")), None, 1, TimelineGraph(), max_missing=5)
    assert c.missing_count == 99_998
    assert len(c.missing) == 5
    assert c.missing[0] == segment_name(1, 2, SEG16)
    with pytest.raises(ValueError, match="max_missing"):
        check(idx, (1, L("0/1000000")), None, 1, TimelineGraph(), max_missing=-1)


def test_check_missing_start_segment_is_a_gap():
    idx = ArchiveIndex.build(names_for(1, [4, 5]), SEG16)
    c = check(idx, (1, L("0/3000028")), None, 1, TimelineGraph())
    assert not c.complete
    assert c.missing == ("000000010000000000000003",)
    assert c.reachable_lsn == L("0/3000028")  # never before the start
    c = check(idx, (1, L("0/6000028")), None, 1, TimelineGraph())
    assert not c.complete
    assert c.missing == ("000000010000000000000006",)


def test_check_latest_end_is_not_a_gap_but_holes_before_later_wal_are():
    idx = ArchiveIndex.build(names_for(1, [3, 4, 5]), SEG16)
    c = check(idx, (1, L("0/3000028")), None, 1, TimelineGraph())
    assert c.complete
    assert c.reachable_lsn == L("0/6000000")
    assert c.end_lsn == L("0/6000000")
    idx = ArchiveIndex.build(names_for(1, [3, 4, 6]), SEG16)
    c = check(idx, (1, L("0/3000028")), None, 1, TimelineGraph())
    assert not c.complete  # WAL after the hole would be lost silently
    assert c.missing == ("000000010000000000000005",)
    assert c.reachable_lsn == L("0/5000000")
    assert c.end_lsn == L("0/7000000")


def test_check_follows_timeline_switch_reading_switch_segment_from_child():
    # 1 -> 2 at 0/5000EC0 -> 3 at 0/5000F50 (the real example): segment 5 comes from 3.
    g = TimelineGraph.from_histories([parse_history(REAL_HISTORY_3, 3)])
    names = [*names_for(1, [3, 4]), *names_for(3, [5, 6]), "00000002.history", "00000003.history"]
    idx = ArchiveIndex.build(names, SEG16)
    c = check(idx, (1, L("0/3000028")), None, 3, g)
    assert c.complete, c.summary()
    assert c.segments_needed == 4
    assert c.reachable_lsn == L("0/7000000")
    assert c.reachable_timeline == 3
    assert [s.timeline for s in c.path] == [1, 2, 3]
    # timeline 1's copy of segment 5 is not enough
    idx = ArchiveIndex.build([*names_for(1, [3, 4, 5]), *names_for(3, [6])], SEG16)
    c = check(idx, (1, L("0/3000028")), L("0/6000100"), 3, g)
    assert c.missing == ("000000030000000000000005",)
    assert c.reachable_lsn == L("0/5000000")
    assert c.reachable_timeline == 3
    assert c.missing_histories == ("00000003.history",)


def test_check_switch_at_segment_boundary():
    g = TimelineGraph.from_histories([parse_history("1\t0/5000000\tx\n", 2)])
    idx = ArchiveIndex.build(
        [*names_for(1, [3, 4]), *names_for(2, [5, 6]), "00000002.history"], SEG16
    )
    c = check(idx, (1, L("0/3000028")), L("0/6000010"), 2, g)
    assert c.complete
    assert c.segments_needed == 4


def test_check_start_inside_switch_segment():
    # The backup starts on timeline 1 in the segment where timeline 2 begins:
    # recovery reads that segment from timeline 2.
    g = TimelineGraph.from_histories([parse_history("1\t0/5800000\tx\n", 2)])
    idx = ArchiveIndex.build([*names_for(2, [5, 6]), "00000002.history"], SEG16)
    c = check(idx, (1, L("0/5000028")), None, 2, g)
    assert c.complete
    assert c.segments_needed == 2
    assert [s.timeline for s in c.path] == [1, 2]


def test_check_start_not_on_target_history():
    g = TimelineGraph.from_histories([parse_history("1\t0/3000000\tx\n", 3)])
    idx = ArchiveIndex.build(names_for(1, [3, 4]), SEG16)
    with pytest.raises(TimelineError, match=r"leaves timeline 1 at 0/3000000") as exc:
        check(idx, (1, L("0/4000060")), None, 3, g)
    assert exc.value.hint
    with pytest.raises(TimelineError, match="not an ancestor"):
        check(idx, (2, L("0/4000060")), None, 3, g)
    with pytest.raises(TimelineError, match="not known"):
        check(idx, (1, L("0/4000060")), None, 9, g)


def test_check_end_before_start():
    idx = ArchiveIndex.build(names_for(1, [3, 4]), SEG16)
    with pytest.raises(LSNError, match="before start"):
        check(idx, (1, L("0/4000000")), L("0/3000000"), 1, TimelineGraph())


def test_check_history_missing_only():
    g = TimelineGraph.from_histories([parse_history("1\t0/5000000\tx\n", 2)])
    idx = ArchiveIndex.build(names_for(2, [5]), SEG16)
    c = check(idx, (2, L("0/5000028")), None, 2, g)
    assert not c.complete
    assert c.missing == ()
    with pytest.raises(WalGapError, match=r"00000002\.history"):
        c.raise_for_gap()
    assert "00000002.history" in c.summary()


# ----------------------------------------------------------------------------- archiver


NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)


def status(**kw: Any) -> ArchiverStatus:
    base: dict[str, Any] = {
        "archived_count": 10,
        "last_archived_wal": "000000010000000000000009",
        "last_archived_time": NOW,
        "failed_count": 0,
        "last_failed_wal": None,
        "last_failed_time": None,
        "wal_level": "replica",
        "archive_mode": "on",
        "archive_command": "cp %p /archive/%f",
    }
    base.update(kw)
    return ArchiverStatus(**base)


def test_archiver_healthy():
    h = archiver_health(status())
    assert h.healthy
    assert h.reasons == ()
    assert h.warnings == ()


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"wal_level": "minimal"}, "wal_level"),
        ({"archive_mode": "off"}, "archive_mode"),
        ({"archive_command": ""}, "neither archive_command nor archive_library"),
        ({"archive_command": "(disabled)"}, "neither"),
        ({"archive_library": "basic_archive"}, "both"),
        (
            {"last_failed_time": NOW, "last_failed_wal": "00000001000000000000000A"},
            "failing",
        ),
        (
            {
                "last_failed_time": NOW,
                "last_failed_wal": "00000001000000000000000A",
                "last_archived_time": None,
            },
            "never succeeded",
        ),
        ({"oldest_ready_age_seconds": 301.0}, r"\.ready"),
        (
            {
                "last_failed_time": NOW,
                "last_failed_wal": "00000003.history",
                "last_archived_wal": "000000020000000000000009",
            },
            "failing",
        ),
    ],
)
def test_archiver_unhealthy(kw, match):
    h = archiver_health(status(**kw))
    assert not h.healthy
    assert any(re.search(match, r) for r in h.reasons), h.reasons


def test_archiver_warnings():
    h = archiver_health(
        status(
            last_failed_time=NOW - dt.timedelta(minutes=1),
            last_failed_wal="000000010000000000000005",
            failed_count=3,
        )
    )
    assert h.healthy
    assert "recovered" in h.warnings[0]
    # Barman's exception: a failed .history not newer than the last archived file's timeline
    h = archiver_health(
        status(
            last_failed_time=NOW,
            last_failed_wal="00000002.history",
            last_archived_wal="000000020000000000000009",
            last_archived_time=NOW - dt.timedelta(seconds=1),
        )
    )
    assert h.healthy
    assert "history" in h.warnings[0]
    h = archiver_health(status(archive_library="basic_archive"), server_version=150004)
    assert h.healthy
    assert "archive_library is used" in h.warnings[0]
    h = archiver_health(status(archived_count=0, last_archived_time=None, last_archived_wal=None))
    assert h.healthy
    assert "nothing has been archived" in h.warnings[0]
    h = archiver_health(status(oldest_ready_age_seconds=10.0), max_ready_age_seconds=5)
    assert not h.healthy


def test_equal_times_are_unhealthy():
    # CloudNativePG: last_archived_time must be strictly newer than last_failed_time.
    h = archiver_health(status(last_failed_time=NOW, last_failed_wal="00000001000000000000000A"))
    assert not h.healthy


def test_errors_are_input_errors():
    for exc in (WalNameError, HistoryFileError, BackupFileError, LSNError):
        assert issubclass(exc, InputError)


def test_a_missing_first_segment_of_a_timeline_is_read_from_its_parent_up_to_the_fork():
    """Issue 7 #5: a recovery made timeline 2 at 0/8005A0 and the server died before
    000000020000000000000008 was archived. PostgreSQL reads timeline 1's copy of segment
    8 then, valid up to the switchpoint: targets before it are reachable."""
    seg = 1 << 20
    names = [segment_name(1, s, seg) for s in (6, 7, 8)] + ["00000002.history"]
    idx = ArchiveIndex.build(names, seg)
    graph = TimelineGraph.from_histories([parse_history("1\t0/8005A0\tx\n", 2)])
    start = (1, L("0/700028"))
    before_fork = check(idx, start, L("0/800200"), 2, graph)
    assert before_fork.complete and before_fork.missing == ()
    after_fork = check(idx, start, L("0/800600"), 2, graph)
    assert after_fork.missing == (segment_name(2, 8, seg),)
    assert after_fork.reachable_lsn == L("0/8005A0")  # not the segment's start
    latest = check(idx, start, None, 2, graph)
    assert latest.reachable_lsn == L("0/8005A0")
    # Without timeline 1's copy of segment 8 nothing of it is reachable.
    idx7 = ArchiveIndex.build([*names[:2], "00000002.history"], seg)
    assert check(idx7, start, L("0/800200"), 2, graph).missing == (segment_name(2, 8, seg),)
    assert check(idx7, start, None, 2, graph).reachable_lsn == L("0/800000")
