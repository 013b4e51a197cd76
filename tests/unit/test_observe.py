"""Pure parts of observation."""

import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st

from pgsnap.model import LSN
from pgsnap.observe import Observer, is_live_segment
from pgsnap.planner.facts import WalEvents
from pgsnap.walindex import WalQuery

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
