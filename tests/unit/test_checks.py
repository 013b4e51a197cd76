"""pgsnap.checks: the check-only findings, from gathered facts (pure), and the gathering."""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
import pytest

from pgsnap.catalog import MemoryCatalog, UnreadableEntry
from pgsnap.errors import ArchiveError
from pgsnap.model import ArchiverStatus, BackupState
from pgsnap.observe import EmptyArchive, gather_check_facts
from pgsnap.planner.backup import Severity
from pgsnap.planner.checks import CheckFacts, check_findings
from pgsnap.wal import ArchiveIndex, TimelineGraph
from tests.unit.test_model import _record

SEG = 16 << 20
UTC = dt.UTC


def seg(n: int, tli: int = 1) -> str:
    return f"{tli:08X}{0:08X}{n:08X}"


def facts(names: tuple[str, ...] = (), **changes: Any) -> CheckFacts:
    base = CheckFacts(
        archive_location="/archive",
        segment_size=SEG,
        index=ArchiveIndex.build(names, SEG),
        timelines=TimelineGraph(),
        archive_names=names,
    )
    return attrs.evolve(base, **changes)


def codes(found: Any) -> dict[str, str]:
    return {f.code: f.severity.value for f in found}


def archiver(last: str | None) -> ArchiverStatus:
    return ArchiverStatus(
        archived_count=7,
        last_archived_wal=last,
        last_archived_time=dt.datetime(2026, 11, 30, 1, 0, tzinfo=UTC),
        failed_count=0,
        last_failed_wal=None,
        last_failed_time=None,
        wal_level="replica",
        archive_mode="on",
        archive_command="cp %p /elsewhere/%f",
    )


BACKUP = _record(id="b-new", wal_segment_size=SEG)  # WAL 0/4000028 .. 0/4000100: segment 4


def test_nothing_to_say() -> None:
    assert check_findings(facts()) == ()
    names = tuple(seg(n) for n in range(4, 9))
    assert check_findings(facts(names, backups=(BACKUP,), archiver=archiver(seg(8)))) == ()


def test_a_segment_missing_after_the_only_backup_is_an_error() -> None:
    names = (seg(4), seg(5), seg(7), seg(8))
    (finding,) = check_findings(facts(names, backups=(BACKUP,)))
    assert (finding.code, finding.severity) == ("wal_gap", Severity.ERROR)
    assert seg(6) in finding.message
    assert "stops at 0/6000000" in finding.message
    assert "b-new" in finding.message


def test_a_backup_whose_own_wal_is_missing_cannot_be_restored() -> None:
    (finding,) = check_findings(facts((seg(5), seg(6)), backups=(BACKUP,)))
    assert (finding.code, finding.severity) == ("backup_wal", Severity.ERROR)
    assert f"missing {seg(4)}" in finding.message
    assert "(the newest)" in finding.message


def test_a_gap_between_older_backups_is_a_warning() -> None:
    old = _record(
        id="b-old",
        wal_segment_size=SEG,
        start_lsn="0/2000028",
        stop_lsn="0/2000100",
        start_time=dt.datetime(2026, 11, 29, tzinfo=UTC),
    )
    names: tuple[str, ...] = (seg(2), seg(4), seg(5))
    (finding,) = check_findings(facts(names, backups=(old, BACKUP)))
    assert (finding.code, finding.severity) == ("wal_gap", Severity.WARNING)
    assert seg(3) in finding.message and "b-old" in finding.message
    # The same gap after the newest backup is reported once, as an error.
    names = (seg(2), seg(3), seg(4), seg(6))
    assert codes(check_findings(facts(names, backups=(old, BACKUP)))) == {"wal_gap": "error"}


def test_only_done_backups_count() -> None:
    failed = attrs.evolve(BACKUP, state=BackupState.FAILED, failure_reason="x")
    assert check_findings(facts((seg(5),), backups=(failed,))) == ()


def test_the_archive_mismatch_is_the_preflights_finding_now() -> None:
    """The check runs the backup preflight, which says it (issue 19: so that `pgsnap
    backup` refuses too); the check's own findings do not say it twice."""
    assert check_findings(facts((), archiver=archiver(seg(9)))) == ()


def test_an_unreadable_archive_says_only_that() -> None:
    found = check_findings(
        facts(archive_error="no such directory", backups=(BACKUP,), archiver=archiver(seg(9)))
    )
    assert codes(found) == {"archive": "error"}
    assert "no such directory" in found[0].message


def test_unreadable_catalog_records_are_named() -> None:
    entry = UnreadableEntry("/cat/b-1.json", "b-1", "malformed LSN 'garbage'")
    (finding,) = check_findings(facts(unreadable=(entry,)))
    assert (finding.code, finding.severity) == ("catalog", Severity.ERROR)
    assert "/cat/b-1.json" in finding.message and "malformed LSN 'garbage'" in finding.message


@pytest.mark.parametrize(
    ("running", "text"), [(False, "the server is not running"), (None, "cannot ask the server")]
)
def test_a_server_that_cannot_be_asked(running: bool | None, text: str) -> None:
    (finding,) = check_findings(facts(server_error="refused", server_running=running))
    assert (finding.code, finding.severity) == ("server", Severity.ERROR)
    assert text in finding.message


@pytest.mark.parametrize(
    ("changes", "text"),
    [
        (
            {"os_user": "nosuchuser", "os_user_exists": False, "data_directory_owner": "postgres"},
            "'nosuchuser' does not exist",
        ),
        (
            {
                "os_user": "alice",
                "os_user_exists": True,
                "data_directory_owner": "postgres",
                "data_directory_uid": 999,
            },
            "belongs to 'postgres', not to os_user 'alice'",
        ),
        ({"data_directory_owner": "root", "data_directory_uid": 0}, "belongs to root"),
    ],
)
def test_an_os_user_that_cannot_run_the_server(changes: dict[str, Any], text: str) -> None:
    (finding,) = check_findings(facts(data_directory="/pg/data", **changes))
    assert (finding.code, finding.severity) == ("os_user", Severity.ERROR)
    assert text in finding.message


def test_the_right_os_user_is_fine() -> None:
    assert (
        check_findings(
            facts(os_user="postgres", data_directory_owner="postgres", data_directory_uid=999)
        )
        == ()
    )


def test_empty_archive_stands_in_for_an_unreadable_one() -> None:
    archive = EmptyArchive("/gone")
    assert archive.location == "/gone"
    assert archive.list_names() == () and not archive.exists(seg(1))
    assert archive.index(SEG).timelines() == ()
    assert archive.histories().timelines() == (1,)
    with pytest.raises(ArchiveError):
        archive.read_text("00000002.history")
    with pytest.raises(ArchiveError):
        archive.restore_command()


def test_gathering_without_a_server(tmp_path: Any) -> None:
    """The archive and the catalog are read even when the server cannot be asked."""
    from pgsnap.host import Host
    from pgsnap.wal.archive import DirectoryWalArchive

    class Adapter:
        host = Host()
        data_directory = str(tmp_path)

        def is_running(self) -> bool:
            return False

    (tmp_path / "archive").mkdir()
    (tmp_path / "archive" / seg(4)).write_bytes(b"\0" * SEG)
    catalog = MemoryCatalog()
    catalog.put(BACKUP)
    data = gather_check_facts(
        adapter=Adapter(),  # type: ignore[arg-type]
        archive=DirectoryWalArchive(tmp_path / "archive"),
        catalog=catalog,
        server_error="refused",
    )
    assert (data.server_running, data.segment_size) == (False, SEG)
    assert data.archive_names == (seg(4),)
    assert data.backups == (BACKUP,)
    assert data.data_directory_owner is not None
    gone = gather_check_facts(
        adapter=Adapter(),  # type: ignore[arg-type]
        archive=DirectoryWalArchive(tmp_path / "gone"),
        catalog=catalog,
    )
    assert gone.archive_error is not None and "does not exist" in gone.archive_error


def test_segments_missing_just_before_a_timeline_switch_are_named() -> None:
    """Issue 19: `pgsnap wal` and `check` listed gaps per timeline only, so a segment
    missing at the end of timeline 1, before timeline 2 forks, showed nowhere."""
    from pgsnap.wal import parse_history, switch_gaps

    history = parse_history("1\t0/7000100\tno recovery target specified\n", 2)
    graph = TimelineGraph.from_histories([history])
    names: tuple[str, ...] = (seg(4), seg(5), seg(7, 2), seg(8, 2), "00000002.history")
    (gap,) = switch_gaps(ArchiveIndex.build(names, SEG), graph)
    assert (gap.parent, gap.child, gap.first, gap.last, gap.count) == (1, 2, seg(6), seg(6), 1)
    # The child's copy of the switch segment missing: the parent's is needed too.
    names = (seg(4), seg(5), seg(8, 2), "00000002.history")
    (gap,) = switch_gaps(ArchiveIndex.build(names, SEG), graph)
    assert (gap.first, gap.last) == (seg(6), seg(7))
    complete = (seg(4), seg(5), seg(6), seg(7, 2), "00000002.history")
    assert switch_gaps(ArchiveIndex.build(complete, SEG), graph) == ()
    # A backup on timeline 1 before the gap: check names the segment.
    found = check_findings(facts(names, backups=(BACKUP,), timelines=graph))
    assert any(seg(6) in f.message and f.severity is Severity.ERROR for f in found)


def test_the_archive_report_is_what_pgsnap_wal_prints() -> None:
    """Issue 20: `pgsnap wal` is Cluster.wal_report(), built by the pure archive_report:
    runs present, gaps, and segments missing before a switch, as text and as JSON."""
    from pgsnap.wal import archive_report, parse_history

    graph = TimelineGraph.from_histories(
        [parse_history("1\t0/7000100\tno recovery target specified\n", 2)]
    )
    names = (seg(4), seg(5), seg(7, 2), seg(9, 2), "00000002.history")
    report = archive_report("/srv/wal", ArchiveIndex.build(names, SEG), graph, SEG)
    assert not report.complete
    one, two = report.timelines
    assert (one.parent, one.switchpoint, one.ranges, one.gaps) == (
        None,
        None,
        ((seg(4), seg(5)),),
        (),
    )
    assert [(g.first, g.last) for g in one.missing_before_switch] == [(seg(6), seg(6))]
    assert (two.parent, str(two.switchpoint)) == (1, "0/7000100")
    assert two.gaps == ((seg(8, 2), seg(8, 2)),)
    text = report.explain().splitlines()
    assert text[0] == f"WAL archive /srv/wal ({SEG // (1024 * 1024)} MB segments)"
    assert f"  MISSING  {seg(6)} .. {seg(6)}  (before timeline 2 forks at 0/7000100: " in text[3]
    assert text[4:] == [
        "timeline 2 (from 1 at 0/7000100)",
        f"  present  {seg(7, 2)} .. {seg(7, 2)}",
        f"  present  {seg(9, 2)} .. {seg(9, 2)}",
        f"  MISSING  {seg(8, 2)} .. {seg(8, 2)}",
    ]
    doc: dict[str, Any] = report.to_dict()
    assert doc["timelines"][1] == {
        "missing_before_switch": [],
        "timeline": 2,
        "parent": 1,
        "switchpoint": "0/7000100",
        "ranges": [[seg(7, 2), seg(7, 2)], [seg(9, 2), seg(9, 2)]],
        "gaps": [[seg(8, 2), seg(8, 2)]],
    }
