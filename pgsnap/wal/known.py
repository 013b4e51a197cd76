"""What pgsnap knows of a directory archive between runs, so a plan need not list it.

Listing an archive of a million segments costs about half a second, and it grew
with the archive on every recovery plan. PostgreSQL itself never lists its
archive: it asks for the next file by name. :class:`KnownArchive` does the same
for planning:

1. the segment ranges and ``.history`` names of the last listing (or of the last
   probe) are kept in a small file beside the WAL index
   (``<wal-index>/archive/<digest>.json``);
2. a plan starts from them and *probes forward*: from the end of each timeline's
   last range, name after name until one is missing (a stat each), and the
   ``.history`` files after the newest one known, as PostgreSQL finds its newest
   timeline;
3. what the plan rests on is then *confirmed*, by
   :meth:`KnownArchive.confirm`: every segment from the chosen backup's start on
   is stat'ed, and the ranges there must run without a gap. A segment deleted
   since (an operator, another tool's expiry) or a gap filled since is a doubt,
   and a doubt means a full listing and a new plan, as before. So ``latest``
   still stops at the first missing segment, and the cost of a plan follows the
   WAL it replays, not the size of the archive.

Only :class:`~pgsnap.wal.archive.DirectoryWalArchive` is probed (a stat is
cheap there); other archives are listed as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

import attrs

from pgsnap.wal.continuity import ArchiveIndex, SegmentRange
from pgsnap.wal.names import segment_name, validate_segment_size

if TYPE_CHECKING:
    from pgsnap.wal.archive import DirectoryWalArchive

__all__ = ["KnownArchive"]

log = logging.getLogger(__name__)

_FORMAT: Final = 1
_MAX_CONFIRM_SHARE: Final = 8
"""A confirmation that would stat more than 1/8 of the known segments costs more
than a listing (a stat is about eight times a listed name): list instead."""
_LOOKAHEAD: Final = 64
"""Names probed past the first missing segment of a timeline: a segment there means a
gap (segments deleted by hand or by another tool), and the archive is listed."""


class KnownArchive:
    """The last known state of one directory ``archive``, kept in ``directory`` (a
    folder of the WAL index); :meth:`probed` extends it by name."""

    def __init__(
        self, directory: str | os.PathLike[str], archive: DirectoryWalArchive, segment_size: int
    ) -> None:
        self._archive = archive
        self._location = archive.location
        self._segment_size = validate_segment_size(segment_size)
        digest = hashlib.sha256(f"{self._location}\0{segment_size}".encode()).hexdigest()[:24]
        self._file = os.path.join(os.fspath(directory), "archive", f"{digest}.json")

    def __repr__(self) -> str:
        return f"KnownArchive({self._location!r}, {self._segment_size})"

    @property
    def path(self) -> str:
        """The file the known state is kept in."""
        return self._file

    # -- the file ----------------------------------------------------------------------

    def load(self) -> ArchiveIndex | None:
        """The index last saved (segments and ``.history`` names only), or None when
        there is none or it cannot be read (then the archive is listed)."""
        try:
            with open(self._file, "rb") as fh:
                doc = json.loads(fh.read())
            if (
                doc.get("format") != _FORMAT
                or doc.get("location") != self._location
                or doc.get("segment_size") != self._segment_size
            ):
                return None
            ranges = [SegmentRange(int(t), int(a), int(b)) for t, a, b in doc["ranges"]]
            histories = [str(n) for n in doc["histories"]]
            return ArchiveIndex(
                self._segment_size, segment_ranges=sorted(ranges), history_names=histories
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.debug("known archive state %s not read (%s): listing", self._file, exc)
            return None

    def save(self, index: ArchiveIndex) -> None:
        """Keep ``index``'s segments and ``.history`` names (atomically; a failure to
        write only costs the next plan a listing)."""
        doc = {
            "format": _FORMAT,
            "location": self._location,
            "segment_size": self._segment_size,
            "ranges": [[r.timeline, r.first, r.last] for r in index.segment_ranges],
            "histories": list(index.history_names),
        }
        directory = os.path.dirname(self._file)
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".known.", suffix=".tmp", dir=directory)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(doc, fh, separators=(",", ":"))
                os.replace(tmp, self._file)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            log.debug("known archive state %s not written: %s", self._file, exc)

    def forget(self) -> None:
        """Remove the saved state (the next plan lists the archive)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._file)

    # -- probing -----------------------------------------------------------------------

    def probed(self) -> ArchiveIndex | None:
        """The saved index extended by name: new ``.history`` files after the newest
        known, and new segments after the end of each timeline (and from the start of
        each new timeline). None when nothing is saved, when the newest timeline had
        no segment when it was saved, or when a segment is present within
        :data:`_LOOKAHEAD` names past a missing one (list the archive instead).
        The start of a new timeline is its switch point, in its ``.history`` file.
        """
        known = self.load()
        if known is None:
            return None
        present = _Present(self._archive)
        histories = list(known.history_names)
        timelines = {t for t in map(_timeline_of, histories) if t is not None}
        newest = max(timelines, default=1)
        probe, misses = newest + 1, 0
        while misses < 2:  # as the backup planner finds timelines: two misses in a row
            name = f"{probe:08X}.history"
            if present(name):
                histories.append(name)
                timelines.add(probe)
                misses = 0
            else:
                misses += 1
            probe += 1
        seg = self._segment_size
        ends: dict[int, int] = {}
        for r in known.segment_ranges:
            ends[r.timeline] = r.last
        if newest not in ends:
            # The timeline the archiver appended to when the state was kept had no
            # segment then (never archived, or all expired): where its next ones
            # are, even if a newer timeline has begun since, only a listing says.
            log.debug("archive %s: no segment of timeline %d known", self._location, newest)
            return None
        # Timelines without a segment yet (new, or known by their history alone):
        # their first segment is at their switch point.
        bare = sorted(timelines - ends.keys())
        starts: dict[int, int] = {}
        if bare:
            graph = self._archive.histories(tuple(histories))
            for tli in bare:
                switch = graph.switchpoint_of(tli) if tli in graph else None
                starts[tli] = -1 if switch is None else switch.value // seg
        added: list[SegmentRange] = []
        try:
            for tli, last in sorted(ends.items()):
                found = _run(present, tli, last + 1, seg)
                if found is not None:
                    added.append(SegmentRange(tli, last + 1, found))
            for tli, first in sorted(starts.items()):
                if first < 0:
                    continue
                found = _run(present, tli, first, seg)
                if found is not None:
                    added.append(SegmentRange(tli, first, found))
        except _GapAhead as gap:
            log.debug("archive %s: %s is missing and later segments are not", self._location, gap)
            return None
        if added:
            log.debug("archive %s: %d new segment runs found by name", self._location, len(added))
        return ArchiveIndex(
            seg,
            segment_ranges=_merge([*known.segment_ranges, *added]),
            history_names=histories,
        )

    def confirm(self, index: ArchiveIndex, timeline: int, from_segno: int) -> str | None:
        """Check what a plan rests on: segment ``from_segno`` of ``timeline`` (the
        chosen backup's first) and every segment of ``index`` after it are in the
        archive, and no timeline has a gap there. None when confirmed; else why not
        (then list the archive and plan again)."""
        if not index.has_segment(timeline, from_segno):
            return f"segment {from_segno:X} of timeline {timeline} is not known"
        tail = [r for r in index.segment_ranges if r.last >= from_segno]
        per_timeline: dict[int, int] = {}
        for r in tail:
            per_timeline[r.timeline] = per_timeline.get(r.timeline, 0) + 1
            if per_timeline[r.timeline] > 1:
                return f"a gap on timeline {r.timeline} after segment {from_segno:X}"
        count = sum(r.last - max(r.first, from_segno) + 1 for r in tail)
        if count * _MAX_CONFIRM_SHARE > max(index.segment_count, 1) and count > 1000:
            return f"{count} segments to confirm: a listing is cheaper"
        present = _Present(self._archive)
        seg = self._segment_size
        for r in tail:
            for segno in range(max(r.first, from_segno), r.last + 1):
                name = segment_name(r.timeline, segno, seg)
                if not present(name):
                    return f"{name} is no longer in the archive"
        return None

    def trimmed(self, index: ArchiveIndex) -> ArchiveIndex | None:
        """``index`` with each run starting where the archive's segments now start.

        An expiry (this one's, another host's, another tool's) deletes the oldest
        segments of a run, so where a run's first segment is gone, its new first
        is found by bisection, as if a prefix went: about 24 stats for a run of
        ten million. None when a whole run went (list the archive: what was
        archived on its timeline since is not probed). A segment deleted by hand
        further in is not looked for: it can only make the index know less than
        the archive holds (an expiry then deletes less, and a recovery plan's
        :meth:`confirm` lists the archive)."""
        present = _Present(self._archive)
        seg = self._segment_size
        kept: list[SegmentRange] = []
        for r in index.segment_ranges:
            if present(segment_name(r.timeline, r.first, seg)):
                kept.append(r)
                continue
            low, high = r.first + 1, r.last + 1  # the first present is in [low, high]
            while low < high:
                mid = (low + high) // 2
                if present(segment_name(r.timeline, mid, seg)):
                    high = mid
                else:
                    low = mid + 1
            if low > r.last:
                log.debug("archive %s: a run of timeline %d went", self._location, r.timeline)
                return None
            kept.append(SegmentRange(r.timeline, low, r.last))
        if kept != list(index.segment_ranges):
            log.debug("archive %s: its oldest segments went since it was known", self._location)
        return attrs.evolve(index, segment_ranges=kept)

    def present(self, names: Iterable[str]) -> tuple[str, ...]:
        """Which of ``names`` are in the archive (a stat each)."""
        present = _Present(self._archive)
        return tuple(n for n in names if present(n))


class _Present:
    """Whether a name is in the archive directory as a listing counts it: a regular
    file, or its ``.gz`` when the archive's ``restore_command`` decompresses gzip."""

    def __init__(self, archive: DirectoryWalArchive) -> None:
        self._path = archive.path
        self._gzip = archive.gzip

    def __call__(self, name: str) -> bool:
        base = os.path.join(self._path, name)
        return os.path.isfile(base) or (self._gzip and os.path.isfile(base + ".gz"))


class _GapAhead(Exception):
    """A segment is present past a missing one: the archive has a gap to list."""


def _run(present: _Present, timeline: int, first: int, segment_size: int) -> int | None:
    """The last segment of the run of present segments from ``first`` (None: none).

    Past the first missing segment, :data:`_LOOKAHEAD` more names are probed: one
    present there is a gap (:class:`_GapAhead`), which only a listing describes.
    """
    segno, last = first, None
    while present(segment_name(timeline, segno, segment_size)):
        last = segno
        segno += 1
    for ahead in range(segno + 1, segno + 1 + _LOOKAHEAD):
        if present(segment_name(timeline, ahead, segment_size)):
            raise _GapAhead(segment_name(timeline, segno, segment_size))
    return last


def _merge(ranges: Iterable[SegmentRange]) -> list[SegmentRange]:
    out: list[SegmentRange] = []
    for r in sorted(ranges):
        if out and out[-1].timeline == r.timeline and r.first <= out[-1].last + 1:
            prev = out[-1]
            out[-1] = SegmentRange(r.timeline, prev.first, max(prev.last, r.last))
        else:
            out.append(r)
    return out


def _timeline_of(history_name: str) -> int | None:
    """The timeline of a ``.history`` file's name (None: not one)."""
    head = history_name[:8]
    if len(head) == 8 and all(c in "0123456789ABCDEFabcdef" for c in head):
        return int(head, 16)
    return None
