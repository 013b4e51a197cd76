"""``wal-push`` and ``wal-get``: PostgreSQL's archive and restore commands over
pgsnap's WAL archive (:class:`~pgsnap.archives.store.StoreWalArchive`).

**Pushing** (``archive_command = 'pgsnap -c CONFIG wal-push %p'``): the file
``%p`` is read and pushed (:meth:`~pgsnap.archives.store.StoreWalArchive.push`);
exit 0 once it is in the archive (or was, with the same content), non-zero
otherwise, and PostgreSQL tries again. With ``ahead`` > 0 the next files
PostgreSQL has marked ready (``archive_status/*.ready``) are pushed too, in
parallel, and each one pushed is noted in the spool (``pushed/<name>``, with
the file's size and modification time): when PostgreSQL asks for it, the note
answers without a request, so a busy server's archiver is not held back by one
round trip per segment.

**Getting** (``restore_command = 'pgsnap -c CONFIG wal-get %f %p'``): the file
is written to ``%p`` whole or not at all (a temporary file renamed), exit 0; a
file the archive does not hold exits 1 with nothing written, as PostgreSQL
expects at the end of the archive. For a segment, the next ``ahead`` segments
of its timeline are fetched in the background (``parallel`` at a time) into
the spool by a prefetcher process (one at a time: a lock in the spool), so
that the next calls are served from disk; the spool holds at most ``ahead``
segments, drops those behind the one asked for and those of other timelines,
and the prefetcher empties it and exits after ``idle`` seconds without a call.
``.history``, ``.backup`` and ``.partial`` files are fetched directly.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from pgsnap.archives.store import StoreWalArchive
from pgsnap.errors import ArchiveError, ArchiveUnavailable, PgsnapError
from pgsnap.wal.names import WalFileKind, parse_archive_name

__all__ = [
    "DEFAULT_AHEAD",
    "DEFAULT_GET_TIMEOUT",
    "DEFAULT_IDLE",
    "DEFAULT_PARALLEL",
    "get_wal",
    "next_segments",
    "prefetch",
    "push_wal",
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
_POLL: Final = 0.05


# --------------------------------------------------------------------------- files


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


def _segment(name: str) -> tuple[int, int, int] | None:
    """``(timeline, log, segment)`` of a segment name (None for any other file)."""
    entry = parse_archive_name(name)
    if entry.kind is not WalFileKind.SEGMENT or entry.compression is not None:
        return None
    assert entry.timeline is not None and entry.log is not None and entry.seg is not None
    return entry.timeline, entry.log, entry.seg


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


# --------------------------------------------------------------------------- push


def _note(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns}"


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
) -> bool:
    """Archive the WAL file at ``path`` (PostgreSQL's ``%p``); True when it was written
    now, False when it was in the archive already (then or ahead). ``ArchiveError``
    (and ``OSError``) when it could not be: PostgreSQL tries again."""
    source = Path(path)
    name = source.name
    notes = Path(spool) / "pushed" if spool is not None else None
    if notes is not None:
        note = notes / name
        with contextlib.suppress(OSError):
            if note.read_text() == _note(source):
                note.unlink()
                log.debug("%s was pushed ahead", name)
                return False
    written = archive.push(name, source.read_bytes())
    if notes is not None and ahead > 0:
        _push_ahead(archive, source.parent, name, notes, ahead, parallel)
    return written


def _push_ahead(
    archive: StoreWalArchive, wal: Path, name: str, notes: Path, ahead: int, parallel: int
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
        before = _note(path)
        archive.push(other, path.read_bytes())
        _write_atomic(notes / other, before.encode())

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        for other, future in [(o, pool.submit(one, o)) for o in todo]:
            try:
                future.result()
            except (PgsnapError, OSError) as exc:  # PostgreSQL asks for it in turn
                log.info("%s not pushed ahead: %s", other, exc)


# --------------------------------------------------------------------------- get


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


def _prefetching(spool: Path) -> bool:
    with _lock(spool, wait=False) as held:
        return not held


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
    From the spool when the prefetcher has it (or is fetching it: waited for up to
    ``wait_for_prefetch`` seconds); else from the archive. For a segment, the
    spool's wish is set to it and ``start_prefetcher`` is called when no
    prefetcher runs (``ahead`` > 0 and a spool).

    False only when the archive said it does not hold the file: an archive that
    cannot be reached (:class:`~pgsnap.errors.ArchiveUnavailable`) is waited for,
    up to ``timeout`` seconds, and then the error is raised (PostgreSQL must not
    take an outage for the end of the archive and end its recovery early)."""
    dest = Path(destination)
    spool_dir = Path(spool) if spool is not None else None
    segment = _segment(name)
    if spool_dir is not None and segment is not None and ahead > 0:
        spool_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(spool_dir / _WANT, name.encode())
        if not _prefetching(spool_dir) and start_prefetcher is not None:
            start_prefetcher()
        spooled = spool_dir / name
        deadline = time.monotonic() + wait_for_prefetch
        while not spooled.exists() and (spool_dir / f".{name}.pgsnap-tmp").exists():
            if time.monotonic() > deadline or not _prefetching(spool_dir):
                break
            time.sleep(_POLL)
        with contextlib.suppress(FileNotFoundError):
            data = spooled.read_bytes()
            _write_atomic(dest, data)
            spooled.unlink()
            log.debug("%s served from the spool", name)
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


def prefetch(
    archive: StoreWalArchive,
    spool: str | os.PathLike[str],
    *,
    segment_size: int | None = None,
    ahead: int = DEFAULT_AHEAD,
    parallel: int = DEFAULT_PARALLEL,
    idle: float = DEFAULT_IDLE,
) -> None:
    """The prefetcher: while ``wal-get`` calls keep coming, keep the ``ahead``
    segments after the last one asked for in the spool, ``parallel`` at a time; then
    empty the spool and return. Returns at once when another prefetcher runs. The
    segment size is that of the segment asked for, when not given."""
    where = Path(spool)
    with _lock(where, wait=False) as held:
        if not held:
            return
        _prefetch(archive, where, segment_size, ahead, parallel, idle)


def _read_want(spool: Path) -> str:
    with contextlib.suppress(OSError):
        return (spool / _WANT).read_text().strip()
    return ""


def _prefetch(
    archive: StoreWalArchive,
    spool: Path,
    segment_size: int | None,
    ahead: int,
    parallel: int,
    idle: float,
) -> None:
    missing: set[str] = set()
    last_change = time.monotonic()
    want = ""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        while True:
            now_want = _read_want(spool)
            if now_want != want:
                want, last_change = now_want, time.monotonic()
                missing.clear()
                if segment_size is None and want:
                    found = archive.stat(want)
                    segment_size = found.size if found is not None else None
            targets = next_segments(want, ahead, segment_size) if want and segment_size else []
            _clean(spool, want, set(targets))
            todo = [t for t in targets if t not in missing and not (spool / t).exists()]
            if todo:
                futures = {pool.submit(_fetch_into, archive, spool, t): t for t in todo}
                for future in concurrent.futures.as_completed(futures):
                    target = futures[future]
                    try:
                        if not future.result():
                            missing.add(target)  # the end of the archive, for now
                    except (PgsnapError, OSError) as exc:
                        log.info("prefetch of %s failed: %s", target, exc)
                        missing.add(target)
                continue
            if time.monotonic() - last_change > idle:
                break
            time.sleep(_POLL)
    _clean(spool, "", set())


def _fetch_into(archive: StoreWalArchive, spool: Path, name: str) -> bool:
    try:
        data = archive.fetch(name)
    except ArchiveError:
        if not archive.exists(name):
            return False
        raise
    _write_atomic(spool / name, data)
    return True


def _clean(spool: Path, want: str, keep: set[str]) -> None:
    """Remove spooled segments not in ``keep`` (behind ``want``, other timelines)."""
    with contextlib.suppress(OSError):
        for path in spool.iterdir():
            if _segment(path.name) is not None and path.name not in keep:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
