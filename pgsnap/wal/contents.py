"""An index of what archived WAL segments hold, so each one is read once.

Archived segments never change. What planning needs from each (its commits'
range of times and transaction ids, its first and last commit, its restore
points) is small, so :class:`WalIndex` keeps it, one
:class:`SegmentSummary` per segment file, keyed by the file's name, size
and modification time, in a directory of its own (by default beside the
catalog, never in the archive). :func:`read_events` answers a planner's
questions about a stretch of WAL from the index where it can and reads only
the segments it has not seen (and the few a question needs in full), with
:func:`pgsnap.wal.reader.read_wal`.

The answers are the same as a full read's: a :class:`WalQuery` says what the
planner will ask (a transaction id, a time, the LSNs before which it wants the
last commit), and the :class:`~pgsnap.planner.facts.WalEvents` returned hold,
besides every restore point, each scanned segment's first and last commit and
every commit those questions need - enough for ``commit_of``,
``first_commit_after``, ``last_commit(before=)`` and ``restore_point`` to give
what they would give with every commit, in memory bounded by one segment
whatever the size of the archive.

Only segments read from the archive (the first source given) are indexed (a
surviving ``pg_wal`` changes under a running server), and only once the read went a
whole segment past them with no end of valid WAL near: a record that begins in
a segment is then complete. A damaged index file (not JSON, not this
format, or a checksum that does not match) is reported and ignored; it is
rewritten by the next read. An index entry whose file changed is not used.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import ArchiveError, InputError
from pgsnap.model import LSN, RecoveryTarget, TargetKind
from pgsnap.wal.events import WalEvents
from pgsnap.wal.files import ArchivedFile, WalFiles
from pgsnap.wal.names import WalFileKind, parse_archive_name, segment_name, validate_segment_size
from pgsnap.wal.reader import (
    _LONG_PHD,
    EndOfWal,
    RestorePointRecord,
    ScanEnd,
    SegmentRead,
    StopReason,
    WalSource,
    XactRecord,
    _Files,
    read_wal,
)
from pgsnap.wal.timelines import TimelineSpan

__all__ = [
    "IndexedRead",
    "SegmentSummary",
    "WalIndex",
    "WalQuery",
    "read_events",
]

log = logging.getLogger(__name__)

_FORMAT: Final = "pgsnap-wal-index"
_VERSION: Final = 1
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US: Final = dt.timedelta(microseconds=1)


def _tail_redo(segsz: int) -> int:
    """How far before an end of valid WAL the reader may check records again (its
    tail window, with room): segments there are read again rather than taken from
    the index, so the answer is the one a full read gives."""
    return 2 * min(16 * 1024 * 1024, 2 * segsz) + segsz


Commit = tuple[int, int, int, int]
"""A commit as the index keeps it: (start LSN, end LSN, time in microseconds
since 1970 UTC, transaction id)."""


def _us(when: dt.datetime) -> int:
    return (when - _EPOCH) // _US


def _time(us: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=us)


# =========================================================================== the question


@frozen
class WalQuery:
    """What the planner will ask of the WAL, besides its restore points and the last commit.

    ``xid``: the commit of this transaction; ``time``: the first commit after
    this time; ``lsns``: the last commit before each of these LSNs (where
    timelines fork, a target LSN).
    """

    xid: int | None = None
    time: dt.datetime | None = None
    lsns: tuple[LSN, ...] = ()

    @classmethod
    def for_target(cls, target: RecoveryTarget, lsns: Iterable[LSN] = ()) -> WalQuery:
        """The questions a plan to ``target`` asks (and the last commit before ``lsns``)."""
        extra = tuple(lsns)
        if target.kind is TargetKind.XID and isinstance(target.value, int):
            return cls(xid=target.value, lsns=extra)
        if target.kind is TargetKind.TIME and isinstance(target.value, dt.datetime):
            return cls(time=target.value, lsns=extra)
        if target.kind is TargetKind.LSN and isinstance(target.value, LSN):
            return cls(lsns=(*extra, target.value))
        return cls(lsns=extra)


# =========================================================================== what a segment holds


@frozen
class SegmentSummary:
    """What one segment file holds that planning asks about.

    ``name`` is the segment's name; ``file``, ``size`` and ``mtime_ns`` the file
    that was read (it may be compressed: ``<name>.gz``). ``commits`` counts
    the commits that begin in the segment; ``first`` and ``last`` are the
    first and last of them (:data:`Commit`); ``min_time``/``max_time`` their
    times and ``min_xid``/``max_xid`` their transaction ids; ``restore_points``
    are ``(lsn, end, name)``.
    """

    name: str
    file: str
    size: int
    mtime_ns: int
    commits: int = 0
    first: Commit | None = None
    last: Commit | None = None
    min_time: int | None = None
    max_time: int | None = None
    min_xid: int | None = None
    max_xid: int | None = None
    restore_points: tuple[tuple[int, int, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The entry as stored (without its name, the key)."""
        return {
            "file": self.file,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "commits": self.commits,
            "first": list(self.first) if self.first else None,
            "last": list(self.last) if self.last else None,
            "time": [self.min_time, self.max_time],
            "xid": [self.min_xid, self.max_xid],
            "restore_points": [list(p) for p in self.restore_points],
        }

    @classmethod
    def from_json(cls, name: str, data: Any) -> SegmentSummary:
        """An entry as stored; ``ValueError`` (or ``KeyError``/``TypeError``) if malformed."""

        def commit(v: Any) -> Commit | None:
            if v is None:
                return None
            a, b, c, d = (int(x) for x in v)
            return (a, b, c, d)

        def opt(v: Any) -> int | None:
            return None if v is None else int(v)

        lo_t, hi_t = data["time"]
        lo_x, hi_x = data["xid"]
        return cls(
            name=str(name),
            file=str(data["file"]),
            size=int(data["size"]),
            mtime_ns=int(data["mtime_ns"]),
            commits=int(data["commits"]),
            first=commit(data["first"]),
            last=commit(data["last"]),
            min_time=opt(lo_t),
            max_time=opt(hi_t),
            min_xid=opt(lo_x),
            max_xid=opt(hi_x),
            restore_points=tuple((int(a), int(b), str(n)) for a, b, n in data["restore_points"]),
        )


class _Segment:
    """Gathers one segment's records as a read passes: its summary, and the
    commits a :class:`WalQuery` needs (in memory bounded whatever its size)."""

    __slots__ = (
        "after",
        "before",
        "commits",
        "first",
        "last",
        "max_time",
        "max_xid",
        "min_time",
        "min_xid",
        "points",
        "query",
        "xid_hits",
    )

    def __init__(self, query: WalQuery, segno: int, segsz: int) -> None:
        self.query = query
        self.commits = 0
        self.first: Commit | None = None
        self.last: Commit | None = None
        self.min_time: int | None = None
        self.max_time: int | None = None
        self.min_xid: int | None = None
        self.max_xid: int | None = None
        self.points: list[tuple[int, int, str]] = []
        self.after: Commit | None = None  # the first commit after query.time
        self.xid_hits: list[Commit] = []
        lo, hi = segno * segsz, (segno + 1) * segsz
        # the last commit before each query LSN inside the segment
        self.before: dict[int, Commit | None] = {
            v: None for v in (x.value for x in query.lsns) if lo < v < hi
        }

    def commit(self, rec: XactRecord) -> None:
        us = _us(rec.time)
        c: Commit = (rec.lsn.value, rec.end_lsn.value, us, rec.xid)
        self.commits += 1
        if self.first is None:
            self.first = c
        self.last = c
        self.min_time = us if self.min_time is None else min(self.min_time, us)
        self.max_time = us if self.max_time is None else max(self.max_time, us)
        self.min_xid = rec.xid if self.min_xid is None else min(self.min_xid, rec.xid)
        self.max_xid = rec.xid if self.max_xid is None else max(self.max_xid, rec.xid)
        q = self.query
        if self.after is None and q.time is not None and rec.time > q.time:
            self.after = c
        if q.xid is not None and rec.xid == q.xid:
            self.xid_hits.append(c)
        for at in self.before:
            if c[0] < at:
                self.before[at] = c

    def kept(self) -> Iterator[Commit]:
        """The commits a planner's questions need from this segment."""
        for c in (self.first, self.last, self.after, *self.xid_hits, *self.before.values()):
            if c is not None:
                yield c

    def summary(self, name: str, file: str, size: int, mtime_ns: int) -> SegmentSummary:
        return SegmentSummary(
            name=name,
            file=file,
            size=size,
            mtime_ns=mtime_ns,
            commits=self.commits,
            first=self.first,
            last=self.last,
            min_time=self.min_time,
            max_time=self.max_time,
            min_xid=self.min_xid,
            max_xid=self.max_xid,
            restore_points=tuple(self.points),
        )


# =========================================================================== the index on disk


class WalIndex:
    """Segment summaries in a directory: one JSON file per cluster, segment size,
    timeline and 4 GiB of WAL (``<system id>-<segment size>/<tli><log>.json``),
    written atomically under a lock, each with a SHA-256 of its entries.

    The directory is made (mode 0700) on the first write. Reading never
    fails: a missing, damaged or foreign file is an empty one (damage is
    logged as a warning, once per file) and is replaced on the next write.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Keep the index in the directory ``path`` (made absolute)."""
        self._path = os.path.abspath(os.fspath(path))
        self._shards: dict[tuple[str, int, str], dict[str, SegmentSummary]] = {}
        self._verified: dict[tuple[str, int, str], dict[str, tuple[int, int]]] = {}
        self._damaged: set[str] = set()

    @property
    def path(self) -> str:
        """The index directory."""
        return self._path

    def __repr__(self) -> str:
        return f"WalIndex({self._path!r})"

    def _dir(self, sysid: str, segsz: int) -> str:
        return os.path.join(self._path, f"{sysid}-{segsz}")

    def _file(self, sysid: str, segsz: int, shard: str) -> str:
        return os.path.join(self._dir(sysid, segsz), f"{shard}.json")

    def get(self, system_identifier: str, segment_size: int, name: str) -> SegmentSummary | None:
        """The summary of segment ``name`` (None: not indexed)."""
        key = (system_identifier, segment_size, name[:16])
        shard = self._shards.get(key)
        if shard is None:
            shard = self._shards[key] = self._load(system_identifier, segment_size, name[:16])
        return shard.get(name)

    def put(
        self, system_identifier: str, segment_size: int, found: Iterable[SegmentSummary]
    ) -> None:
        """Store summaries (replacing older ones of the same segments)."""
        by_shard: dict[str, list[SegmentSummary]] = {}
        for s in found:
            by_shard.setdefault(s.name[:16], []).append(s)
        if not by_shard:
            return
        directory = self._dir(system_identifier, segment_size)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        with _locked(os.path.join(directory, ".lock")):
            for shard, new in sorted(by_shard.items()):
                entries = self._load(system_identifier, segment_size, shard)
                entries.update((s.name, s) for s in new)
                self._write(system_identifier, segment_size, shard, entries)
                self._shards[(system_identifier, segment_size, shard)] = entries

    def restore_points(
        self, system_identifier: str, segment_size: int
    ) -> tuple[tuple[int, int, str], ...]:
        """Every restore point the index has seen: ``(lsn, timeline, name)``, by position
        (one read of each of the cluster's index files; what was never read by a plan
        is not there)."""
        directory = self._dir(system_identifier, segment_size)
        try:
            shards = sorted(n[:-5] for n in os.listdir(directory) if n.endswith(".json"))
        except OSError:
            return ()
        found: list[tuple[int, int, str]] = []
        for shard in shards:
            if len(shard) != 16 or not all(c in "0123456789ABCDEF" for c in shard):
                continue  # not a shard (the verified-segments file, a stranger's)
            entries = self._load(system_identifier, segment_size, shard)
            tli = int(shard[:8], 16)
            for summary in entries.values():
                found.extend((lsn, tli, name) for lsn, _end, name in summary.restore_points)
        return tuple(sorted(found))

    def _load(self, sysid: str, segsz: int, shard: str) -> dict[str, SegmentSummary]:
        path = self._file(sysid, segsz, shard)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            self._warn(path, f"cannot be read ({exc.strerror or exc})")
            return {}
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
                raise ValueError("not a pgsnap WAL index file")
            if doc.get("version") != _VERSION:
                raise ValueError(f"version {doc.get('version')!r}, not {_VERSION}")
            if doc.get("system_identifier") != sysid or doc.get("segment_size") != segsz:
                raise ValueError("it belongs to another cluster or segment size")
            entries = doc["entries"]
            if doc.get("sha256") != _digest(entries):
                raise ValueError("its checksum does not match its entries")
            return {str(n): SegmentSummary.from_json(n, e) for n, e in entries.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self._warn(path, f"is damaged ({exc}): it is ignored and will be rebuilt")
            return {}

    def _warn(self, path: str, what: str) -> None:
        if path not in self._damaged:
            self._damaged.add(path)
            log.warning("WAL index file %s %s", path, what)

    def _write(
        self, sysid: str, segsz: int, shard: str, entries: dict[str, SegmentSummary]
    ) -> None:
        body = {n: entries[n].to_json() for n in sorted(entries)}
        self._write_doc(self._file(sysid, segsz, shard), sysid, segsz, body)

    # -- segments verified whole (pgsnap.wal.reader.segment_problem) ------------------

    def _verified_file(self, sysid: str, segsz: int) -> str:
        return os.path.join(self._dir(sysid, segsz), "verified.json")

    def verified(self, system_identifier: str, segment_size: int) -> dict[str, tuple[int, int]]:
        """The segments found whole and of this cluster before: name → (size, mtime in
        ns) of the file then. A file whose size or time changed since is not in it
        for the caller's purposes (it compares them). Never fails: a missing or
        damaged file is an empty one."""
        key = (system_identifier, segment_size, "verified")
        cached = self._verified.get(key)
        if cached is not None:
            return cached
        path = self._verified_file(system_identifier, segment_size)
        found: dict[str, tuple[int, int]] = {}
        try:
            with open(path, "rb") as f:
                doc = json.loads(f.read())
            if (
                isinstance(doc, dict)
                and doc.get("format") == _FORMAT
                and doc.get("version") == _VERSION
                and doc.get("system_identifier") == system_identifier
                and doc.get("segment_size") == segment_size
                and doc.get("sha256") == _digest(doc.get("entries"))
            ):
                found = {str(n): (int(v[0]), int(v[1])) for n, v in doc["entries"].items()}
            else:
                self._warn(path, "is damaged or foreign: it is ignored and will be rebuilt")
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, KeyError, IndexError) as exc:
            self._warn(path, f"cannot be read ({exc}): it is ignored and will be rebuilt")
        self._verified[key] = found
        return found

    def note_verified(
        self, system_identifier: str, segment_size: int, found: dict[str, tuple[int, int]]
    ) -> None:
        """Remember segments found whole (name → (size, mtime in ns))."""
        if not found:
            return
        directory = self._dir(system_identifier, segment_size)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        with _locked(os.path.join(directory, ".lock")):
            self._verified.pop((system_identifier, segment_size, "verified"), None)
            entries = dict(self.verified(system_identifier, segment_size))
            entries.update(found)
            body = {n: list(entries[n]) for n in sorted(entries)}
            self._write_doc(
                self._verified_file(system_identifier, segment_size),
                system_identifier,
                segment_size,
                body,
            )
            self._verified[(system_identifier, segment_size, "verified")] = entries

    def _write_doc(self, path: str, sysid: str, segsz: int, body: dict[str, Any]) -> None:
        doc = {
            "format": _FORMAT,
            "version": _VERSION,
            "system_identifier": sysid,
            "segment_size": segsz,
            "sha256": _digest(body),
            "entries": body,
        }
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, separators=(",", ":"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._damaged.discard(path)


def _digest(entries: Any) -> str:
    return hashlib.sha256(
        json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# =========================================================================== reading with the index


@frozen
class IndexedRead:
    """What :func:`read_events` found, and how.

    ``events`` answers the planner (see the module docstring); ``read`` counts
    the segments read from disk, ``indexed`` those answered by the index,
    ``added`` the summaries it stored.
    """

    events: WalEvents
    read: int = 0
    indexed: int = 0
    added: int = 0


@frozen
class _Piece:
    """One part of the walk: a stretch read from disk, or one indexed segment."""

    lo: int
    hi: int
    summary: SegmentSummary | None = None


def read_events(
    wal_dirs: Sequence[WalSource],
    spans: Sequence[TimelineSpan],
    start: LSN,
    end: LSN,
    *,
    segment_size: int,
    system_identifier: str,
    major: int | None = None,
    query: WalQuery | None = None,
    index: WalIndex | None = None,
    max_read: int | None = None,
) -> IndexedRead:
    """Read the WAL from ``start`` to ``end`` along ``spans``, answering ``query``.

    ``wal_dirs``: the archive first (only its segments are indexed), then a
    surviving ``pg_wal``: directories, or archives read through their ``stat``
    and ``open`` (as :func:`~pgsnap.wal.reader.read_wal` takes them). Segments
    the ``index`` knows (same file, size and modification time) are not read,
    unless a question needs every commit of one (its time range holds the first
    commit after ``query.time``, its xid range ``query.xid``, or a
    ``query.lsns`` falls inside it), or ``start`` or ``end`` cut it.
    ``max_read`` bounds the segments read (the newest are read first): what is
    left unread makes the result incomplete. Raises what :func:`pgsnap.wal.reader.read_wal` raises.
    """
    segsz = validate_segment_size(segment_size)
    if max_read is not None and max_read < 0:
        raise InputError(f"max_read must be at least 0, not {max_read}")
    path = tuple(spans)
    lo, hi = LSN.parse(start).value, LSN.parse(end).value
    if path and path[0].start is not None:
        lo = max(lo, path[0].start.value)
    if path and path[-1].end is not None:
        hi = min(hi, path[-1].end.value)
    if not path or hi <= lo:
        return IndexedRead(WalEvents(scanned_from=LSN(lo), scanned_to=LSN(lo), complete=True))
    reader = _Reader(
        list(wal_dirs),
        path,
        segsz,
        system_identifier,
        major,
        query or WalQuery(),
        index,
    )
    return reader.run(lo, hi, max_read)


class _Reader:
    """One :func:`read_events`: plans the walk, reads, assembles, stores."""

    def __init__(
        self,
        dirs: list[WalSource],
        path: tuple[TimelineSpan, ...],
        segsz: int,
        sysid: str,
        major: int | None,
        query: WalQuery,
        index: WalIndex | None,
    ) -> None:
        self.dirs = dirs
        self.path = path
        self.segsz = segsz
        self.sysid = sysid
        self.major = major
        self.query = query
        self.index = index
        self.segments: dict[int, _Segment] = {}
        self.summaries: dict[int, SegmentSummary] = {}
        self.read = 0
        self.added: list[SegmentSummary] = []
        self.files = _Files(dirs)  # found by name: no listing of the archive
        # Only the archive's segments are indexed: the first source.
        self.archive: WalFiles | None = self.files.sources[0] if dirs else None

    # -- which file replay would read --------------------------------------------

    def _choice(self, tli: int, segno: int) -> tuple[bool, str] | None:
        """The copy of segment ``segno`` of ``tli`` the reader prefers (the first
        source holding it, a plain file first): (in the archive?, file name)."""
        copies = self.files.get(tli, segno, self.segsz)
        if not copies:
            return None
        return copies[0].source == 0, copies[0].name

    def _begun(self, segno: int) -> int | None:
        """The newest timeline of the path that has begun by segment ``segno``."""
        begun = [
            s.timeline for s in self.path if s.start is None or s.start.value // self.segsz <= segno
        ]
        return begun[-1] if begun else None

    def _present(self, segno: int) -> bool:
        """Whether a file replay would read for ``segno`` is in one of the directories."""
        tli = self._begun(segno)
        return tli is not None and self._choice(tli, segno) is not None

    def _indexed(self, segno: int) -> SegmentSummary | None:
        """The index's summary of the file replay would read for ``segno``, if current.

        That file is the newest timeline's of the path that has begun by then;
        when it is not in the archive (in a surviving pg_wal, or missing: the
        reader then decides, perhaps on an older timeline's copy), None.
        """
        if self.index is None or self.archive is None:
            return None
        tli = self._begun(segno)
        if tli is None:
            return None
        choice = self._choice(tli, segno)
        if choice is None or not choice[0]:
            return None
        name = choice[1]
        summary = self.index.get(self.sysid, self.segsz, segment_name(tli, segno, self.segsz))
        if summary is None or summary.file != name:
            return None
        st = _stat(self.archive, name)
        if st is None or st.identity != (summary.size, summary.mtime_ns):
            return None
        return summary

    # -- the walk ----------------------------------------------------------------

    def run(self, lo: int, hi: int, max_read: int | None) -> IndexedRead:
        pieces = self._within_budget(self._plan(lo, hi), max_read)
        spans, stop, indexed = self._walk(pieces, lo, hi)
        kept, points = self._gather(lo, hi)
        self._store()
        commits = {c[0]: c for c in kept if lo <= c[0]}
        rps = {(p[0], p[2]) for p in points if lo <= p[0]}
        covered = _merge(spans)
        # Complete: one stretch from the start, to the end or to the end of valid WAL
        # (a budget leaves the oldest WAL unread; a missing segment leaves a gap).
        begun = pieces[0].lo if pieces else lo
        whole = len(covered) == 1 and covered[0][0] == lo if covered else begun == lo
        if stop is not None:
            complete = whole and stop.reason is StopReason.END_OF_WAL
        else:
            complete = whole and covered[0][1] == hi
        events = WalEvents(
            commits=tuple(
                (LSN(c[0]), _time(c[2]), c[3]) for c in (commits[k] for k in sorted(commits))
            ),
            restore_points=tuple((LSN(a), n) for a, n in sorted(rps)),
            scanned_from=LSN(lo),
            scanned_to=(LSN(covered[-1][1]) if covered else stop.scanned_to if stop else LSN(lo)),
            complete=complete,
            end_of_wal=(
                stop.end_of_wal.lsn if stop is not None and stop.end_of_wal is not None else None
            ),
            spans=tuple((LSN(a), LSN(b)) for a, b in covered),
        )
        return IndexedRead(events, read=self.read, indexed=indexed, added=len(self.added))

    def _plan(self, lo: int, hi: int) -> list[_Piece]:
        """Indexed segments, and the stretches between them to read."""
        segsz = self.segsz
        pieces: list[_Piece] = []
        run_start: int | None = None
        for segno in range(lo // segsz, (hi - 1) // segsz + 1):
            s_lo, s_hi = max(lo, segno * segsz), min(hi, (segno + 1) * segsz)
            # The segment holding the end is read (a record beginning in it may end
            # after the end, and a full read leaves it out when the WAL stops there),
            # unless the end is its end and the next segment is there to finish it.
            # A start within the segment's first page header (_LONG_PHD) cuts nothing:
            # no record begins there (a backup's start LSN is usually just past it).
            whole = s_lo - segno * segsz <= _LONG_PHD and (
                (segno + 1) * segsz < hi or ((segno + 1) * segsz == hi and self._present(segno + 1))
            )
            summary = self._indexed(segno) if whole else None
            if summary is not None:
                if run_start is not None:
                    pieces.append(_Piece(run_start, s_lo))
                    run_start = None
                pieces.append(_Piece(s_lo, s_hi, summary))
            elif run_start is None:
                run_start = s_lo
        if run_start is not None:
            pieces.append(_Piece(run_start, hi))
        return pieces

    def _within_budget(self, pieces: list[_Piece], max_read: int | None) -> list[_Piece]:
        """Drop the oldest reads beyond ``max_read`` segments (the newest WAL first)."""
        if max_read is None:
            return pieces
        segsz = self.segsz
        left = max_read
        out: list[_Piece] = []
        for piece in reversed(pieces):
            if piece.summary is not None:
                out.append(piece)
                continue
            last = (piece.hi - 1) // segsz
            n = last - piece.lo // segsz + 1
            if n <= left:
                out.append(piece)
                left -= n
            elif left > 0:
                out.append(_Piece((last - left + 1) * segsz, piece.hi))
                left = 0
        return out[::-1]

    def _walk(
        self, pieces: list[_Piece], lo: int, hi: int
    ) -> tuple[list[tuple[int, int]], ScanEnd | None, int]:
        """Take the indexed segments and read the rest, in LSN order, up to where a
        full read would stop (the end of the valid WAL, a missing segment)."""
        segsz = self.segsz
        spans: list[tuple[int, int]] = []
        indexed = 0
        first = pieces[0].lo if pieces else lo  # a budget may start the walk after lo
        for piece in pieces:
            if piece.summary is not None:
                self.summaries[piece.lo // segsz] = piece.summary
                spans.append((piece.lo, piece.hi))
                indexed += 1
                continue
            read_lo = piece.lo
            end = self._read(read_lo, piece.hi, hi)
            if end.reason is StopReason.END_OF_WAL and end.end_of_wal is not None:
                redo = self._redo_from(end.end_of_wal, first)
                if redo < read_lo:
                    # The reader checks the records of a tail window before an end of
                    # WAL again; read that window as a full read does, not from the index.
                    spans = [(a, min(b, redo)) for a, b in spans if a < redo]
                    for segno in [n for n in self.summaries if n * segsz >= redo]:
                        del self.summaries[segno]
                    for segno in [n for n in self.segments if n * segsz >= redo]:
                        del self.segments[segno]
                    read_lo = redo
                    end = self._read(read_lo, piece.hi, hi)
            if end.scanned_to.value > read_lo:
                spans.append((read_lo, end.scanned_to.value))
            if end.reason is not StopReason.END:
                return spans, end, indexed  # a full read stops here too
        return spans, None, indexed

    def _redo_from(self, eow: EndOfWal, lo: int) -> int:
        back = max(lo, eow.lsn.value - _tail_redo(self.segsz))
        return max(lo, back - back % self.segsz)

    def _gather(self, lo: int, hi: int) -> tuple[list[Commit], list[tuple[int, int, str]]]:
        """The commits and restore points the questions need, in LSN order of segments,
        reading in full the indexed segments whose summary cannot answer."""
        kept: list[Commit] = []
        points: list[tuple[int, int, str]] = []
        time_found = False
        q_time = None if self.query.time is None else _us(self.query.time)
        for segno in sorted(set(self.segments) | set(self.summaries)):
            seg = self.segments.get(segno)
            if seg is None:
                summary = self.summaries[segno]
                points.extend(summary.restore_points)
                if self._needs_detail(summary, segno, time_found):
                    seg = self._detail(segno, lo, hi)
                else:
                    kept.extend(c for c in (summary.first, summary.last) if c is not None)
                    if (
                        q_time is not None
                        and summary.max_time is not None
                        and summary.max_time > q_time
                    ):
                        time_found = True
                    continue
            else:
                points.extend(seg.points)
            kept.extend(seg.kept())
            time_found = time_found or seg.after is not None
        return kept, points

    def _needs_detail(self, summary: SegmentSummary, segno: int, time_found: bool) -> bool:
        q = self.query
        if summary.commits == 0:
            return False
        if (
            q.xid is not None
            and summary.min_xid is not None
            and summary.max_xid is not None
            and summary.min_xid <= q.xid <= summary.max_xid
        ):
            return True
        if (
            q.time is not None
            and not time_found
            and summary.max_time is not None
            and summary.max_time > _us(q.time)
        ):
            return True
        s_lo, s_hi = segno * self.segsz, (segno + 1) * self.segsz
        return any(s_lo < x.value < s_hi for x in q.lsns)

    def _read(self, read_lo: int, read_hi: int, hi: int) -> ScanEnd:
        """Read ``[read_lo, read_hi)``, and on to the end of the next segment so that
        records beginning before ``read_hi`` are whole, into per-segment gatherers."""
        segsz = self.segsz
        upto = min(hi, (read_hi + segsz - 1) // segsz * segsz + segsz)
        opened: dict[int, tuple[int, ArchivedFile | None]] = {}
        end: ScanEnd | None = None
        for item in read_wal(
            self.dirs,
            self.path,
            LSN(read_lo),
            LSN(upto),
            segment_size=segsz,
            system_identifier=self.sysid,
            major=self.major,
        ):
            if isinstance(item, XactRecord):
                if item.kind.committed and item.lsn.value < read_hi:
                    self._segment(item.lsn.value // segsz).commit(item)
            elif isinstance(item, RestorePointRecord):
                if item.lsn.value < read_hi:
                    self._segment(item.lsn.value // segsz).points.append(
                        (item.lsn.value, item.end_lsn.value, item.name)
                    )
            elif isinstance(item, SegmentRead):
                self.read += 1
                if item.segno * segsz < read_hi:
                    opened[item.segno] = (item.source, item.file)
            elif isinstance(item, ScanEnd):
                end = item
        assert end is not None
        self._seal(opened, read_lo, end)
        if end.reason is StopReason.END and end.scanned_to.value > read_hi:
            # The next segment was read only to finish records begun before read_hi.
            end = attrs.evolve(end, scanned_to=LSN(read_hi))
        return end

    def _segment(self, segno: int) -> _Segment:
        seg = self.segments.get(segno)
        if seg is None:
            seg = self.segments[segno] = _Segment(self.query, segno, self.segsz)
        return seg

    def _seal(
        self, opened: dict[int, tuple[int, ArchivedFile | None]], read_lo: int, end: ScanEnd
    ) -> None:
        """Summaries of the archive's segments read whole, with the read a whole segment
        past them and no end of valid WAL near."""
        if self.index is None or self.archive is None:
            return
        segsz = self.segsz
        reach = end.scanned_to.value
        if end.end_of_wal is not None:
            reach = min(reach, end.end_of_wal.found_at.value - _tail_redo(segsz))
        for segno, (source, st) in opened.items():
            cut = segno * segsz + _LONG_PHD < read_lo  # records before read_lo unread
            if cut or (segno + 2) * segsz > reach or st is None:
                continue
            if source != 0:
                continue
            now = _stat(self.archive, st.name)
            if now is None or now.identity != st.identity:
                continue  # it changed while it was read
            entry = parse_archive_name(st.name)
            if entry.kind is not WalFileKind.SEGMENT or entry.timeline is None:
                continue
            seg = self.segments.get(segno) or _Segment(WalQuery(), segno, segsz)
            self.added.append(
                seg.summary(
                    segment_name(entry.timeline, segno, segsz),
                    st.name,
                    st.size,
                    st.mtime_ns,
                )
            )

    def _detail(self, segno: int, lo: int, hi: int) -> _Segment:
        """Every commit of an indexed segment, for a question its summary cannot answer."""
        segsz = self.segsz
        seg = _Segment(self.query, segno, segsz)
        s_lo, s_hi = max(lo, segno * segsz), min(hi, (segno + 1) * segsz)
        for item in read_wal(
            self.dirs,
            self.path,
            LSN(s_lo),
            LSN(min(hi, s_hi + segsz)),
            segment_size=segsz,
            system_identifier=self.sysid,
            major=self.major,
        ):
            if isinstance(item, XactRecord) and item.kind.committed and item.lsn.value < s_hi:
                seg.commit(item)
            elif isinstance(item, RestorePointRecord) and item.lsn.value < s_hi:
                seg.points.append((item.lsn.value, item.end_lsn.value, item.name))
            elif isinstance(item, SegmentRead):
                self.read += 1
        return seg

    def _store(self) -> None:
        if self.index is not None and self.added:
            try:
                self.index.put(self.sysid, self.segsz, self.added)
            except OSError as exc:
                log.warning("cannot write the WAL index in %s: %s", self.index.path, exc)


def _stat(files: WalFiles, name: str) -> ArchivedFile | None:
    try:
        return files.stat(name)
    except ArchiveError:
        return None


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
