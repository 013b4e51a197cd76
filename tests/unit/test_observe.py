"""Pure parts of observation."""

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgsnap.model import LSN
from pgsnap.observe import Observer, is_live_segment
from pgsnap.planner.facts import WalEvents
from pgsnap.wal.contents import WalQuery

MB = 1 << 20


def _head(tli: int, pageaddr: int) -> bytes:
    return b"\x10\xd1\x06\x00" + tli.to_bytes(4, "little") + pageaddr.to_bytes(8, "little")


def test_a_segment_holds_wal_of_its_name_only_when_its_header_says_so():
    name = "000000020000000000000005"
    assert is_live_segment(name, _head(2, 5 * MB), MB)
    assert is_live_segment(name, _head(1, 5 * MB), MB)  # written on an ancestor timeline
    assert not is_live_segment(name, _head(2, 3 * MB), MB)  # recycled from segment 3
    assert not is_live_segment(name, _head(3, 5 * MB), MB)  # a later timeline's address
    assert not is_live_segment(name, bytes(16), MB)  # zero-filled, never written
    assert not is_live_segment(name, b"short", MB)


def test_other_files_count_as_they_are():
    assert is_live_segment("00000002.history", b"", MB)
    assert is_live_segment("000000010000000000000003.partial", b"", MB)


# --------------------------------------------------------------------------- forward reads

SEG = 16 * 1024 * 1024
T = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


@settings(max_examples=200)
@given(
    start=st.integers(1, 50),
    length=st.integers(1, 400),
    found_at=st.one_of(st.none(), st.integers(0, 400)),
    budget=st.integers(1, 300),
)
def test_a_time_target_is_read_forward_within_the_budget(start, length, found_at, budget):
    """Issue 9: a time target's WAL is read oldest first, in windows that never ask for
    more segments than the budget has left, each starting two segments before the last
    ended (so those are read whole once and indexed), until a commit after the time."""
    lo, hi = LSN(start * SEG + 0x28), LSN((start + length) * SEG)
    commit = None if found_at is None or found_at >= length else LSN((start + found_at) * SEG + 64)
    calls: list[tuple[int, int, int]] = []

    def scan(dirs, path, a, b, query, left):
        calls.append((a.value, b.value, left))
        got = [(commit, T + dt.timedelta(seconds=1), 7)] if commit and a <= commit < b else []
        return WalEvents(commits=tuple(got), scanned_from=a, scanned_to=b, complete=True), (
            (b.value - 1) // SEG - a.value // SEG + 1
        )

    events, left, complete = Observer._scan_forward(
        scan, [], (), [(lo, hi)], WalQuery(time=T), budget, T, None, SEG
    )
    assert calls and calls[0][0] == lo.value
    for (a, b, left_then), nxt in zip(calls, [*calls[1:], None], strict=True):
        assert (b - 1) // SEG - a // SEG + 1 <= left_then  # never more than the budget
        if nxt is not None:
            assert nxt[0] == max(b - 2 * SEG, a + SEG)  # two segments of overlap
    assert events is not None
    if commit is not None and events.covers(commit):
        assert events.first_commit_after(T) == commit
        assert not events.uncovered(lo, commit)  # read from the backup to the commit
        assert calls[-1][0] <= commit.value < calls[-1][1]  # and stopped there
    elif left > 0:
        assert not events.uncovered(lo, hi)  # nothing found: read to the end
    else:
        assert not complete or not events.uncovered(lo, hi)


# --------------------------------------------------------------------------- backup facts


class _Adapter:
    """What backup observation asks of a database adapter, and nothing else."""

    def __init__(self, server, archiver):
        from pgsnap.host import Host, LocalRunner

        self.server, self.archiver = server, archiver
        self.host = Host(LocalRunner())

    def describe(self):
        return self.server

    def archiver_status(self):
        return self.archiver


def _segment(path, name, sysid):
    """A segment file whose long page header carries ``sysid``."""
    path.joinpath(name).write_bytes(bytes(24) + int(sysid).to_bytes(8, "little") + bytes(32))


def _backup_observer(tmp_path, archiver, server_tli=1):
    from typing import cast

    import attrs

    from pgsnap.backends.mock import MockBackend
    from pgsnap.catalog import DirectoryCatalog
    from pgsnap.protocols import DatabaseAdapter
    from pgsnap.wal.archive import DirectoryWalArchive
    from tests.unit.test_planner_backup import ARCHIVER, LAYOUT, SERVER

    archive = tmp_path / "archive"
    archive.mkdir(exist_ok=True)
    adapter = _Adapter(
        attrs.evolve(SERVER, timeline=server_tli), attrs.evolve(ARCHIVER, **archiver)
    )
    return Observer(
        adapter=cast(DatabaseAdapter, adapter),  # only what backup observation asks
        backend=MockBackend(),
        archive=DirectoryWalArchive(archive),
        catalog=DirectoryCatalog(tmp_path / "catalog"),
        layout=LAYOUT,
        clock=lambda: T,
    ), archive


def _forbid_listing(monkeypatch, observer):
    def no_listing(*_a, **_k):
        raise AssertionError("the archive was listed")

    monkeypatch.setattr(type(observer.archive), "index", no_listing)
    monkeypatch.setattr(type(observer.archive), "list_names", no_listing)


def test_backup_facts_read_the_last_archived_segment_and_probe_histories(tmp_path, monkeypatch):
    """Issue 9: backup planning does not list the archive when the server has archived."""
    observer, archive = _backup_observer(
        tmp_path, {"last_archived_wal": "000000020000000000000007"}, server_tli=2
    )
    _segment(archive, "000000020000000000000007", "7300000000000000001")
    _segment(archive, "000000010000000000000009", "7399999999999999999")  # not read
    for tli in (2, 3, 5, 8):
        archive.joinpath(f"{tli:08X}.history").write_text("1\t0/5000000\tno recovery target\n")

    _forbid_listing(monkeypatch, observer)
    facts = observer.backup_facts()
    assert facts.archive_system_identifier == "7300000000000000001"
    # 4 is missing, 5 is there; 6 and 7 missing in a row end the probe before 8.
    assert facts.archive_timelines == (2, 3, 5)
    assert facts.catalog_system_identifiers == frozenset()


@pytest.mark.parametrize(
    "last",
    ["000000020000000000000007.00000028.backup", "000000020000000000000007"],
)
def test_after_a_backup_its_history_file_names_the_segment_to_read(tmp_path, monkeypatch, last):
    """Issue 27: what a backup archives last is its ``.backup`` file; the next backup of
    a quiet server read that name, found it no segment and listed the archive (0.75 s
    at 1,000,000 segments). The segment the file is named after is read instead."""
    observer, archive = _backup_observer(tmp_path, {"last_archived_wal": last}, server_tli=2)
    _segment(archive, "000000020000000000000007", "7300000000000000001")
    archive.joinpath("000000020000000000000007.00000028.backup").write_text("START WAL ...\n")

    _forbid_listing(monkeypatch, observer)
    facts = observer.backup_facts()
    assert facts.archive_system_identifier == "7300000000000000001"
    assert facts.archive_timelines == (2,)


@pytest.mark.parametrize(
    "last",
    [
        "00000003.history",
        "000000030000000000000002.partial",
        "000000030000000000000002.0000002.backup",
        "000000030000000000000002.00000028.backupx",
        "00000003000000000000000G",
    ],
)
def test_what_names_no_segment_is_a_listing(tmp_path, last):
    """A last archived file that names no segment to read (a timeline's history, a
    partial segment, anything else) is not guessed from: the archive is listed."""
    observer, archive = _backup_observer(tmp_path, {"last_archived_wal": last})
    _segment(archive, "000000030000000000000002", "7377777777777777777")
    archive.joinpath("00000003.history").write_text("1\t0/1000000\tno recovery target\n")
    facts = observer.backup_facts()
    assert facts.archive_system_identifier == "7377777777777777777"
    assert facts.archive_timelines == (1, 3)


def test_backup_facts_list_the_archive_when_nothing_was_archived_yet(tmp_path):
    observer, archive = _backup_observer(tmp_path, {"last_archived_wal": None})
    _segment(archive, "000000010000000000000009", "7399999999999999999")
    _segment(archive, "000000030000000000000002", "7377777777777777777")
    archive.joinpath("00000003.history").write_text("1\t0/1000000\tno recovery target\n")
    facts = observer.backup_facts()
    assert facts.archive_system_identifier == "7377777777777777777"  # newest timeline's
    assert facts.archive_timelines == (1, 3)


def test_a_backend_whose_snapshots_cannot_be_read_at_all_cannot_copy() -> None:
    """Issue 21: a backend whose snapshots can be neither read in place nor exposed on
    a host (LVM, PowerFlex expose them) is refused with the reason, before anything
    is planned."""
    import pytest

    from pgsnap.errors import UnsupportedCapability
    from pgsnap.observe import Observer

    class NotReadable:
        name = "opaque"

    observer = Observer.__new__(Observer)
    object.__setattr__(observer, "backend", NotReadable())
    with pytest.raises(UnsupportedCapability, match="neither read in place nor exposed"):
        observer.snapshot_access(None)  # type: ignore[arg-type]
