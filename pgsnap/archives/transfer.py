"""``wal-push`` and ``wal-get``: PostgreSQL's archive and restore commands over
pgsnap's WAL archive (:class:`~pgsnap.archives.store.StoreWalArchive`).

**Pushing** (``archive_command = 'pgsnap -c CONFIG wal-push %p'``): the file
``%p`` is read and pushed (:meth:`~pgsnap.archives.store.StoreWalArchive.push`);
exit 0 once it is in the archive (or was, with the same content), non-zero
otherwise, and PostgreSQL tries again. With ``ahead`` > 0 the next files
PostgreSQL has marked ready (``archive_status/*.ready``) are pushed too, in
parallel, and each one pushed is noted in the spool (``pushed/<name>``: the
file's size, modification time and the archive's location): when PostgreSQL
asks for it, the note answers without opening the archive
(:func:`pushed_ahead`), so a busy server's archiver is not held back by a
round trip (and a client's start) per segment.

**Getting** (``restore_command``, see :func:`pgsnap.archives.config.wal_get_command`):
the file is written to ``%p`` whole or not at all (a temporary file renamed),
exit 0; a file the archive does not hold exits 1 with nothing written, as
PostgreSQL expects at the end of the archive. For a segment, a prefetcher
process (one at a time: a lock in the spool) keeps the next ``ahead`` segments
of its timeline in the spool, ``parallel`` at a time, so that the next calls
are served from disk: by the restore command's own shell (a ``mv``, no Python
started) or by :func:`take_from_spool`, which waits for a fetch under way
rather than fetch the file twice. The prefetcher follows PostgreSQL: from the
segment a ``wal-get`` asked for (``want``), and from the files taken from the
spool; it drops those behind and those of other timelines, and empties the
spool and exits after ``idle`` seconds without a call. ``.history``,
``.backup`` and ``.partial`` files are fetched directly.

This module imports no more than it needs: a call served from the spool or from
a note opens no archive (``wal-get`` and ``wal-push`` start once per file).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Final

from pgsnap.errors import ArchiveError, ArchiveUnavailable, PgsnapError

if TYPE_CHECKING:
    from pgsnap.archives.store import StoreWalArchive

__all__ = [
    "DEFAULT_AHEAD",
    "DEFAULT_GET_TIMEOUT",
    "DEFAULT_IDLE",
    "DEFAULT_PARALLEL",
    "get_wal",
    "is_segment",
    "next_segments",
    "note_wanted",
    "prefetch",
    "prefetching",
    "push_wal",
    "pushed_ahead",
    "take_from_spool",
]

log = logging.getLogger(__name__)

DEFAULT_AHEAD: Final = 8
"""Segments fetched ahead (and pushed ahead)."""
DEFAULT_PARALLEL: Final = 4
"""Transfers at a time."""
DEFAULT_IDLE: Final = 30.0
"""Seconds the prefetcher waits for the next call before it empties the spool and exits."""
DEFAULT_GET_TIMEOUT: Final = 300.0
"""Seconds ``wal-get`` waits for an archive it cannot reach before it gives up."""
_LOCK: Final = "prefetch.lock"
_WANT: Final = "want"
_POLL: Final = 0.02
_SEGMENT_RE: Final = re.compile(r"^([0-9A-F]{8})([0-9A-F]{8})([0-9A-F]{8})$")


# --------------------------------------------------------------------------- names, files


def _segment(name: str) -> tuple[int, int, int] | None:
    """``(timeline, log, segment)`` of a segment's name (None for any other file)."""
    m = _SEGMENT_RE.match(name)
    if m is None or int(m.group(1), 16) == 0:
        return None
    return int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)


def is_segment(name: str) -> bool:
    """True for a WAL segment's name (24 upper-case hex digits, timeline above 0)."""
    return _segment(name) is not None


def next_segments(name: str, count: int, segment_size: int) -> list[str]:
    """The ``count`` segments after segment ``name`` on its timeline (a name that is not
    a segment's: none)."""
    found = _segment(name)
    if found is None or count <= 0:
        return []
    tli, log_id, seg = found
    per_id = 0x100000000 // segment_size
    first = log_id * per_id + seg
    return [
        f"{tli:08X}{n // per_id:08X}{n % per_id:08X}" for n in range(first + 1, first + 1 + count)
    ]


def _write_atomic(path: Path, data: bytes) -> None:
    """``data`` at ``path``, whole or not at all (a temporary file fsynced, renamed)."""
    tmp = path.with_name(f".{path.name}.pgsnap-tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


# --------------------------------------------------------------------------- push


def _note(path: Path, location: str) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns} {location}"


def pushed_ahead(
    spool: str | os.PathLike[str], path: str | os.PathLike[str], location: str
) -> bool:
    """True (and the note gone) when the file at ``path`` was pushed ahead to the archive
    at ``location``, as it is now (its size and time): nothing to do."""
    source = Path(path)
    note = Path(spool) / "pushed" / source.name
    with contextlib.suppress(OSError):
        if note.read_text() == _note(source, location):
            note.unlink()
            log.debug("%s was pushed ahead", source.name)
            return True
    return False


def _ready_after(status: Path, name: str, ahead: int) -> list[str]:
    """The files after ``name`` PostgreSQL has marked ready, oldest first."""
    try:
        ready = sorted(p.name[: -len(".ready")] for p in status.glob("*.ready"))
    except OSError:
        return []
    return [r for r in ready if r > name][:ahead]


def push_wal(
    archive: StoreWalArchive,
    path: str | os.PathLike[str],
    *,
    spool: str | os.PathLike[str] | None = None,
    ahead: int = 0,
    parallel: int = DEFAULT_PARALLEL,
    identity: str | None = None,
) -> bool:
    """Archive the WAL file at ``path`` (PostgreSQL's ``%p``); True when it was written
    now, False when it was in the archive already (then or ahead). ``ArchiveError``
    (and ``OSError``) when it could not be: PostgreSQL tries again. ``identity`` names
    the archive in the notes of what was pushed ahead (default: its location)."""
    source = Path(path)
    who = identity or archive.location
    if spool is not None and pushed_ahead(spool, source, who):
        return False
    written = archive.push(source.name, source.read_bytes())
    if spool is not None and ahead > 0:
        notes = Path(spool) / "pushed"
        _push_ahead(archive, source.parent, source.name, notes, ahead, parallel, who)
    return written


def _push_ahead(
    archive: StoreWalArchive,
    wal: Path,
    name: str,
    notes: Path,
    ahead: int,
    parallel: int,
    identity: str,
) -> None:
    status = wal / "archive_status"
    todo = [n for n in _ready_after(status, name, ahead) if not (notes / n).exists()]
    with contextlib.suppress(OSError):
        notes.mkdir(parents=True, exist_ok=True)
        ready = {p.name[: -len(".ready")] for p in status.glob("*.ready")}
        for old in notes.iterdir():  # PostgreSQL marked it done, or it went
            if old.name not in ready and not old.name.startswith("."):
                old.unlink()
    if not todo:
        return

    def one(other: str) -> None:
        path = wal / other
        before = _note(path, identity)
        archive.push(other, path.read_bytes())
        _write_atomic(notes / other, before.encode())

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for other, future in [(o, pool.submit(one, o)) for o in todo]:
            try:
                future.result()
            except (PgsnapError, OSError) as exc:  # PostgreSQL asks for it in turn
                log.info("%s not pushed ahead: %s", other, exc)


# --------------------------------------------------------------------------- the spool


@contextlib.contextmanager
def _lock(spool: Path, *, wait: bool) -> Iterator[bool]:
    """The spool's prefetch lock: yields True when held (False: another holds it)."""
    spool.mkdir(parents=True, exist_ok=True)
    fd = os.open(spool / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def prefetching(spool: str | os.PathLike[str]) -> bool:
    """True when a prefetcher runs on ``spool``."""
    with _lock(Path(spool), wait=False) as held:
        return not held


def _fetching(spool: Path, name: str) -> Path:
    """The marker of a fetch of ``name`` under way."""
    return spool / f".{name}.fetching"


def note_wanted(spool: str | os.PathLike[str], name: str) -> None:
    """Tell the prefetcher that PostgreSQL asks for segment ``name`` now."""
    where = Path(spool)
    where.mkdir(parents=True, exist_ok=True)
    _write_atomic(where / _WANT, name.encode())


def take_from_spool(
    spool: str | os.PathLike[str],
    name: str,
    destination: str | os.PathLike[str],
    *,
    wait: float = 30.0,
) -> bool:
    """Move segment ``name`` from the spool to ``destination`` (True), waiting up to
    ``wait`` seconds while the prefetcher is fetching it; False when the spool does
    not have it (nor is about to)."""
    where = Path(spool)
    spooled = where / name
    deadline = time.monotonic() + wait
    while not spooled.exists() and _fetching(where, name).exists():
        if time.monotonic() > deadline or not prefetching(where):
            break
        time.sleep(_POLL)
    dest = Path(destination)
    try:
        os.replace(spooled, dest)
    except FileNotFoundError:
        return False
    except OSError:  # another file system: copied whole, then taken away
        try:
            data = spooled.read_bytes()
        except FileNotFoundError:
            return False
        _write_atomic(dest, data)
        with contextlib.suppress(FileNotFoundError):
            spooled.unlink()
    log.debug("%s served from the spool", name)
    return True


# --------------------------------------------------------------------------- get


def get_wal(
    archive: StoreWalArchive,
    name: str,
    destination: str | os.PathLike[str],
    *,
    spool: str | os.PathLike[str] | None = None,
    ahead: int = DEFAULT_AHEAD,
    start_prefetcher: Callable[[], None] | None = None,
    wait_for_prefetch: float = 30.0,
    timeout: float = DEFAULT_GET_TIMEOUT,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Write WAL file ``name`` to ``destination`` (PostgreSQL's ``%f`` and ``%p``):
    True when written, False when the archive does not hold it (nothing written).

    For a segment (``ahead`` > 0 and a spool): the prefetcher is told
    (:func:`note_wanted`) and started when none runs (``start_prefetcher``), and the
    file taken from the spool when it is there or being fetched
    (:func:`take_from_spool`). Else from the archive.

    False only when the archive said it does not hold the file: an archive that
    cannot be reached (:class:`~pgsnap.errors.ArchiveUnavailable`) is waited for,
    up to ``timeout`` seconds, and then the error is raised (PostgreSQL must not
    take an outage for the end of the archive and end its recovery early)."""
    dest = Path(destination)
    if spool is not None and ahead > 0 and is_segment(name):
        note_wanted(spool, name)
        if start_prefetcher is not None and not prefetching(spool):
            start_prefetcher()
        if take_from_spool(spool, name, dest, wait=wait_for_prefetch):
            return True
    deadline = time.monotonic() + timeout
    pause = 0.5
    while True:
        try:
            if not archive.exists(name):
                return False
            _write_atomic(dest, archive.fetch(name))
            return True
        except ArchiveUnavailable as exc:
            if time.monotonic() + pause > deadline:
                raise
            log.warning("%s: the archive cannot be reached (%s); again in %.0f s", name, exc, pause)
            sleep(pause)
            pause = min(pause * 2, 15.0)


# --------------------------------------------------------------------------- prefetch


def prefetch(
    archive: StoreWalArchive,
    spool: str | os.PathLike[str],
    *,
    segment_size: int | None = None,
    ahead: int = DEFAULT_AHEAD,
    parallel: int = DEFAULT_PARALLEL,
    idle: float = DEFAULT_IDLE,
) -> None:
    """The prefetcher: while PostgreSQL keeps asking, keep the ``ahead`` segments after
    the last one it asked for (or took from the spool) in the spool, ``parallel`` at
    a time; then empty the spool and return. Returns at once when another prefetcher
    runs. The segment size is that of the segment asked for, when not given."""
    where = Path(spool)
    with _lock(where, wait=False) as held:
        if not held:
            return
        _Prefetcher(archive, where, segment_size, ahead, parallel, idle).run()


class _Prefetcher:
    """One prefetcher's state: where PostgreSQL is, what it placed in the spool."""

    def __init__(
        self,
        archive: StoreWalArchive,
        spool: Path,
        segment_size: int | None,
        ahead: int,
        parallel: int,
        idle: float,
    ) -> None:
        self.archive = archive
        self.spool = spool
        self.segment_size = segment_size
        self.ahead = ahead
        self.parallel = parallel
        self.idle = idle
        self.position = ""
        self.want = ""
        self.placed: set[str] = set()
        self.missing: set[str] = set()
        self.active = time.monotonic()

    def _follow(self) -> None:
        """Move :attr:`position` to what PostgreSQL asked for or took."""
        want = _read_want(self.spool)
        if want != self.want:
            self.want, self.position = want, want
            self.missing.clear()
            self.active = time.monotonic()
        taken = {n for n in self.placed if not (self.spool / n).exists()}
        if taken:
            self.placed -= taken
            newest = max(taken)
            if newest[:8] != self.position[:8] or newest > self.position:
                self.position = newest
            self.active = time.monotonic()
        if self.segment_size is None and self.position:
            found = self.archive.stat(self.position)
            self.segment_size = found.size if found is not None else None

    def run(self) -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, self.parallel)) as pool:
            while True:
                self._follow()
                targets = (
                    next_segments(self.position, self.ahead, self.segment_size)
                    if self.position and self.segment_size
                    else []
                )
                _clean(self.spool, {*targets, self.position})
                self.placed &= set(targets)
                todo = [
                    t for t in targets if t not in self.missing and not (self.spool / t).exists()
                ]
                if todo:
                    futures = {
                        pool.submit(_fetch_into, self.archive, self.spool, t): t for t in todo
                    }
                    for future in concurrent.futures.as_completed(futures):
                        target = futures[future]
                        try:
                            if future.result():
                                self.placed.add(target)
                            else:
                                self.missing.add(target)  # the end of the archive, for now
                        except (PgsnapError, OSError) as exc:
                            log.info("prefetch of %s failed: %s", target, exc)
                            self.missing.add(target)
                    continue
                if time.monotonic() - self.active > self.idle:
                    break
                time.sleep(_POLL)
        _clean(self.spool, set())


def _read_want(spool: Path) -> str:
    with contextlib.suppress(OSError):
        return (spool / _WANT).read_text().strip()
    return ""


def _fetch_into(archive: StoreWalArchive, spool: Path, name: str) -> bool:
    """Fetch ``name`` into the spool (its marker there meanwhile); False when the
    archive does not hold it."""
    marker = _fetching(spool, name)
    marker.touch()
    try:
        try:
            data = archive.fetch(name)
        except ArchiveError:
            if not archive.exists(name):
                return False
            raise
        _write_atomic(spool / name, data)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()


def _clean(spool: Path, keep: set[str]) -> None:
    """Remove spooled segments not in ``keep`` (behind PostgreSQL, other timelines)."""
    with contextlib.suppress(OSError):
        for path in spool.iterdir():
            if is_segment(path.name) and path.name not in keep:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
