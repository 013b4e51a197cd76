"""What a read of the WAL found: commits and restore points, and the stretches read.

:class:`WalEvents` is what the readers return (:mod:`pgsnap.wal.reader`,
:mod:`pgsnap.wal.contents`, :mod:`pgsnap.wal.dump`) and what the recovery
planner places its targets with.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

import attrs

from pgsnap._attrs import frozen
from pgsnap.model import LSN

__all__ = ["WalEvents"]


def _spans(values: Iterable[tuple[LSN, LSN]]) -> tuple[tuple[LSN, LSN], ...]:
    """Sorted, with overlapping or touching spans joined."""
    out: list[tuple[LSN, LSN]] = []
    for lo, hi in sorted(values):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


@frozen
class WalEvents:
    """What a read of the WAL found, for placing targets and stating them as times.

    ``commits`` are ``(lsn, commit time, xid)`` of transaction commits in LSN
    order: every commit (:func:`pgsnap.wal.reader.scan_events`, ``pg_waldump``),
    or those a plan's questions need (:func:`pgsnap.wal.contents.read_events`:
    each segment's first and last, and those answering its
    :class:`~pgsnap.wal.contents.WalQuery`); ``restore_points`` are ``(lsn, name)``.
    ``spans`` are the stretches of WAL that were scanned (``[from, to)``,
    sorted, disjoint): the WAL each candidate backup can reach, not more.
    ``complete`` when they cover all the WAL every candidate backup can reach,
    up to ``end_of_wal`` when set.
    """

    commits: tuple[tuple[LSN, dt.datetime, int], ...] = ()
    restore_points: tuple[tuple[LSN, str], ...] = ()
    scanned_from: LSN | None = None
    scanned_to: LSN | None = None
    complete: bool = False
    end_of_wal: LSN | None = None
    """Where the valid WAL ends, when the scan stopped at an invalid record before
    the end of the segments (a surviving pg_wal: recycled or zeroed space follows
    the last record). Replay ends there too; None when the scan did not see it."""
    spans: tuple[tuple[LSN, LSN], ...] = attrs.field(default=(), converter=_spans)

    def __attrs_post_init__(self) -> None:
        if not self.spans and self.scanned_from is not None and self.scanned_to is not None:
            object.__setattr__(self, "spans", ((self.scanned_from, self.scanned_to),))

    def covers(self, lsn: LSN) -> bool:
        """True when ``lsn`` lies in a scanned stretch."""
        return any(lo <= lsn < hi for lo, hi in self.spans)

    def uncovered(self, lo: LSN, hi: LSN) -> tuple[tuple[LSN, LSN], ...]:
        """The parts of ``[lo, hi)`` not scanned yet."""
        out: list[tuple[LSN, LSN]] = []
        at = lo
        for a, b in self.spans:
            if b <= at:
                continue
            if a >= hi:
                break
            if a > at:
                out.append((at, a))
            at = max(at, b)
        if at < hi:
            out.append((at, hi))
        return tuple(out)

    def merge(self, other: WalEvents) -> WalEvents:
        """Both scans' findings (of stretches of one timeline path)."""
        commits = {c[0]: c for c in (*self.commits, *other.commits)}
        points = {(p[0], p[1]) for p in (*self.restore_points, *other.restore_points)}
        spans = _spans((*self.spans, *other.spans))
        ends = [e for e in (self.end_of_wal, other.end_of_wal) if e is not None]
        return WalEvents(
            commits=tuple(commits[k] for k in sorted(commits)),
            restore_points=tuple(sorted(points)),
            scanned_from=spans[0][0] if spans else None,
            scanned_to=spans[-1][1] if spans else None,
            complete=self.complete and other.complete,
            end_of_wal=max(ends) if ends else None,
            spans=spans,
        )

    def last_commit(self, before: LSN | None = None) -> tuple[LSN, dt.datetime, int] | None:
        """The last commit (before ``before``, when given)."""
        for c in reversed(self.commits):
            if before is None or c[0] < before:
                return c
        return None

    def known_last_commit(self, before: LSN) -> tuple[LSN, dt.datetime, int] | None:
        """The last commit before ``before``, when the WAL read proves it is the last:
        it lies in a scanned stretch that runs on, without a hole, to ``before``."""
        last = self.last_commit(before=before)
        if last is None:
            return None
        for lo, hi in self.spans:
            if lo <= last[0] < hi:
                return last if hi >= before else None
        return None

    def restore_point(self, name: str) -> LSN | None:
        """The LSN of the first restore point called ``name`` (None if not seen)."""
        for lsn, n in self.restore_points:
            if n == name:
                return lsn
        return None

    def commit_of(self, xid: int) -> LSN | None:
        """The LSN of the commit of ``xid`` (None if not seen)."""
        for lsn, _when, x in self.commits:
            if x == xid:
                return lsn
        return None

    def first_commit_after(self, when: dt.datetime) -> LSN | None:
        """The LSN of the first commit later than ``when`` (None if none)."""
        for lsn, t, _x in self.commits:
            if t > when:
                return lsn
        return None
