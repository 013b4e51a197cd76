"""Copy trees to a copy target, restore them from it, and verify a copy.

:func:`copy_trees` walks each tree (a read-only snapshot made readable: a
btrfs snapshot, a mounted LVM or PowerFlex snapshot, the mock's copy),
cuts every file into fixed-size chunks, and sends each chunk the target
does not hold yet; the manifest is written last, once every chunk it names
is confirmed in the target, so a copy is complete exactly when its manifest
exists. An interrupted copy leaves chunks and no manifest: running it again
sends only what is still missing.

While it runs, a copy keeps the marker ``pending.<copy id>`` in the target
(refreshed every minute), and it does not start while a garbage collection
holds the ``gc`` marker: see :mod:`pgsnap.copies.gc` for the protocol and why
a collection never removes a chunk a copy needs.

:func:`restore_trees` writes a manifest's trees into empty directories,
checking every chunk's hash and every file's SHA-256, and gives entries
their modes, owners (where this process may) and times.

:func:`verify_copy` checks that every chunk a manifest names is in the
target and hashes to its name (all of them, or a sample), and names the
files a missing or damaged chunk breaks.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import datetime as dt
import errno
import functools
import hashlib
import itertools
import logging
import mmap
import os
import random
import stat
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.copies.bandwidth import TokenBucket
from pgsnap.copies.chunks import (
    chunk_id,
    decode_chunk,
    decode_chunk_into,
    default_codec,
    encode_chunk,
)
from pgsnap.copies.manifest import (
    EntryKind,
    FileEntry,
    Manifest,
    decode_manifest,
    encode_manifest,
)
from pgsnap.copies.markers import (
    DEFAULT_STALE_AFTER,
    GC_MARKER,
    REFRESH_INTERVAL,
    TRUSTED_GAP,
    Marker,
    pending_marker,
    read_marker,
    utc_now,
)
from pgsnap.copies.sources import StreamedTree
from pgsnap.copies.target import CopyTarget
from pgsnap.errors import (
    ConfigurationError,
    CopyBusy,
    CopyError,
    CopyKeyError,
    CopyNotFound,
    DamagedChunkError,
    FormatError,
)

if TYPE_CHECKING:
    from pgsnap.copies.keys import CopyKey

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_PARALLEL",
    "CopyProgress",
    "CopyStats",
    "RestoreProgress",
    "VerifyReport",
    "copy_trees",
    "restore_trees",
    "verify_copy",
]

log = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE: Final = 4 * 1024 * 1024
"""4 MiB: large enough for few objects, small enough that a change re-sends little."""

DEFAULT_PARALLEL: Final = 4
"""Upload threads of a copy: enough to keep an object store's round trips overlapped."""

_GC_FINISH_POLLS: Final = 30
_GC_FINISH_POLL_SECONDS: Final = 1.0
_sleep: Callable[[float], None] = time.sleep
"""How a finishing copy waits for a garbage collection to end (tests replace it)."""


@frozen
class CopyStats:
    """What a copy did: files and bytes read, chunks and bytes sent or found there.

    ``chunks_new`` counts chunks written; ``chunks_reused`` counts chunk
    references the target already held (one repeated within the copy, such as
    a run of zero pages, counts each time).
    """

    files: int
    bytes_read: int
    bytes_sent: int
    chunks_new: int
    chunks_reused: int
    seconds: float


def _rate(done: int, seconds: float) -> float:
    return done / seconds if seconds > 0 else 0.0


def _left(done: int, total: int, seconds: float) -> float | None:
    rate = _rate(done, seconds)
    return max(total - done, 0) / rate if rate > 0 else None


@frozen
class CopyProgress:
    """A progress report of :func:`copy_trees`: after each file, and about every
    second within a large one. ``seconds`` since the copy started; :attr:`rate`
    and :attr:`seconds_left` follow from them."""

    files_done: int
    files_total: int
    bytes_read: int
    bytes_total: int
    bytes_sent: int
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        """Bytes read a second so far (0 before any time passed)."""
        return _rate(self.bytes_read, self.seconds)

    @property
    def seconds_left(self) -> float | None:
        """The time left at :attr:`rate` (None while nothing was read)."""
        return _left(self.bytes_read, self.bytes_total, self.seconds)


@frozen
class VerifyReport:
    """What :func:`verify_copy` found: chunks checked, and those missing or damaged
    with the files (``tree/path``) each breaks."""

    copy_id: str
    chunks_total: int
    chunks_checked: int
    missing: Mapping[str, tuple[str, ...]]
    damaged: Mapping[str, tuple[str, ...]]
    backup_id: str = ""
    breaks: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    """Each missing or damaged chunk → the other copies in the target that name it
    too (``<copy id> (backup <id>)``): what else it breaks."""

    @property
    def ok(self) -> bool:
        """True when nothing checked is missing or damaged."""
        return not self.missing and not self.damaged

    def explain(self) -> str:
        """A few lines for a person."""
        head = f"copy {self.copy_id}: {self.chunks_checked} of {self.chunks_total} chunks checked"
        if self.ok:
            return head + ", all present and whole"
        lines = [head]
        for what, found in (("missing", self.missing), ("damaged", self.damaged)):
            for chunk, files in sorted(found.items()):
                lines.append(f"  {what} chunk {chunk[:16]}... breaks {', '.join(files)}")
                if self.breaks.get(chunk):
                    lines.append(f"    and copies {', '.join(self.breaks[chunk])}")
        return "\n".join(lines)


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """``(relative path, lstat)`` of a tree, parents before children, names sorted;
    symbolic links are not followed."""
    yield "", os.lstat(root)
    stack = [""]
    while stack:
        rel = stack.pop()
        base = root / rel if rel else root
        with os.scandir(base) as it:
            names = sorted(e.name for e in it)
        subdirs = []
        for name in names:
            child = f"{rel}/{name}" if rel else name
            st = os.lstat(root / child)
            yield child, st
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(child)
        stack.extend(reversed(subdirs))


@frozen
class _Item:
    """One entry of a tree being copied, from a directory here or a tar stream."""

    kind: EntryKind
    rel: str
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    link: str | None = None
    path: Path | None = None
    content: IO[bytes] | None = attrs.field(default=None, eq=False, repr=False)

    def open(self) -> contextlib.AbstractContextManager[IO[bytes]]:
        """The file's content: opened here, or the stream's (read it before the next)."""
        if self.path is not None:
            return open(self.path, "rb")
        assert self.content is not None
        return contextlib.nullcontext(self.content)

    def entry(
        self, tree: str, *, size: int = 0, sha256: str | None = None, chunks: tuple[str, ...] = ()
    ) -> FileEntry:
        return FileEntry(
            tree=tree,
            path=self.rel,
            kind=self.kind,
            mode=stat.S_IMODE(self.mode),
            uid=self.uid,
            gid=self.gid,
            mtime_ns=self.mtime_ns,
            size=size,
            sha256=sha256,
            chunks=chunks,
            link=self.link,
        )


def _local_item(name: str, root: Path, rel: str, st: os.stat_result) -> _Item:
    path = root / rel if rel else root
    common = (rel, st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns)
    if stat.S_ISDIR(st.st_mode):
        return _Item(EntryKind.DIRECTORY, *common)
    if stat.S_ISLNK(st.st_mode):
        return _Item(EntryKind.SYMLINK, *common, link=os.readlink(path))
    if stat.S_ISREG(st.st_mode):
        return _Item(EntryKind.FILE, *common, path=path)
    raise CopyError(
        f"{path} is neither a file, a directory nor a symbolic link",
        hint="a PostgreSQL data directory holds none: is this the right tree?",
        tree=name,
        path=str(path),
    )


@contextlib.contextmanager
def _items(
    name: str,
    top: str | os.PathLike[str] | StreamedTree,
    listing: list[tuple[Path, str, os.stat_result]],
) -> Iterator[Iterator[_Item]]:
    """The entries of tree ``name``: ``listing`` for a directory here, the tar stream
    of a :class:`~pgsnap.copies.sources.StreamedTree`."""
    if not isinstance(top, StreamedTree):
        yield (_local_item(name, root, rel, st) for root, rel, st in listing)
        return
    with top.entries() as stream:
        yield (
            _Item(e.kind, e.rel, e.mode, e.uid, e.gid, e.mtime_ns, e.link, content=e.content)
            for e in stream
        )


def _gc_busy(target: CopyTarget, copy_id: str, gc: Marker | None, what: str) -> CopyBusy:
    holder = gc.describe() if gc is not None else "a gc marker pgsnap cannot read"
    stale = gc.stale_after if gc is not None and gc.stale_after else DEFAULT_STALE_AFTER
    return CopyBusy(
        f"garbage collection is running on {target.location}: {holder}; copy {copy_id} {what}",
        hint="wait for the collection to end and run the copy again (it sends only what is "
        "missing); if that collection died, its marker is taken for stale "
        f"{stale} after its last refresh, or remove the marker 'gc' yourself "
        "(markers/gc in the target) once no collection runs",
        target=target.location,
        holders=(gc.summary(),) if gc is not None else (),
    )


class _InProgress:
    """The ``pending.<copy id>`` marker of a running copy: written before the first
    chunk, refreshed at most every :data:`REFRESH_INTERVAL`, removed at the end.

    It also remembers the longest time its marker went unrefreshed (``widest``):
    a copy that paused longer than :data:`TRUSTED_GAP` may have looked dead to a
    collection, which then swept without it. :meth:`tick` may be called from
    several threads (a copy's upload threads each call it before a request).
    """

    def __init__(self, target: CopyTarget, copy_id: str, clock: Callable[[], dt.datetime]) -> None:
        self._target = target
        self._copy_id = copy_id
        self._clock = clock
        self._lock = threading.Lock()
        self.marker = Marker.new(pending_marker(copy_id), clock(), copy_id=copy_id)
        self.widest = dt.timedelta(0)

    def _gc(self) -> tuple[bool, Marker | None]:
        """``(present, marker)`` of the collection's marker (present, None: unreadable)."""
        try:
            gc = read_marker(self._target, GC_MARKER)
        except FormatError:
            return True, None
        return gc is not None, gc

    def _fresh(self, gc: Marker) -> bool:
        return not gc.is_stale(self._clock(), gc.stale_after or DEFAULT_STALE_AFTER)

    def start(self) -> None:
        """Write the marker, then look for a collection (in that order: see
        :mod:`pgsnap.copies.gc`); refuse to start while a fresh one runs."""
        self._target.put_marker(self.marker.name, self.marker.to_json())
        present, gc = self._gc()
        if present and (gc is None or self._fresh(gc)):
            self._target.delete_marker(self.marker.name)
            raise _gc_busy(self._target, self._copy_id, gc, "did not start")
        if gc is not None:
            log.warning(
                "copy %s: the gc marker on %s is stale (%s): taken for a dead collection's",
                self._copy_id,
                self._target.location,
                gc.describe(),
            )

    def tick(self) -> None:
        """Before each request to the target: refresh the marker when it is due."""
        with self._lock:
            now = self._clock()
            unrefreshed = now - self.marker.refreshed_at
            self.widest = max(self.widest, unrefreshed)
            if unrefreshed >= REFRESH_INTERVAL:
                self.marker = self.marker.refreshed(now)
                self._target.put_marker(self.marker.name, self.marker.to_json())

    def finish(self, manifest: Manifest, absent: Callable[[Iterable[str]], list[str]]) -> None:
        """After the manifest is written: make sure no collection swept without this
        copy, check every chunk the manifest names once more (``absent``: those of
        the ids given that the target lacks), remove the marker.

        A copy that never went :data:`TRUSTED_GAP` without refreshing its marker
        looked alive to every collection (which then refused to sweep). One that
        did first waits for a running collection to end (and gives up, removing
        its manifest, after a while); either way the chunks are checked after the
        manifest was written, so a collection that swept without this copy is
        seen, and the manifest removed.
        """
        self.tick()
        if self.widest > TRUSTED_GAP:
            log.warning(
                "copy %s went %s without refreshing its marker: a garbage collection may "
                "have taken it for dead; checking before calling it complete",
                self._copy_id,
                self.widest,
            )
            self._wait_for_gc()
        gone = absent(sorted(manifest.chunk_ids()))
        if gone:
            self._target.delete_manifest(self._copy_id)
            raise CopyError(
                f"copy {self._copy_id}: {len(gone)} chunks left the target while the "
                f"manifest was written (first {gone[0]}); the manifest was removed",
                hint="a garbage collection or someone else removed them; run the copy "
                "again (it sends what is missing), with no garbage collection at the same time",
                copy_id=self._copy_id,
            )
        self._target.delete_marker(self.marker.name)

    def _wait_for_gc(self) -> None:
        for attempt in range(_GC_FINISH_POLLS):
            self.tick()
            present, gc = self._gc()
            if not present or (gc is not None and not self._fresh(gc)):
                return
            if attempt + 1 < _GC_FINISH_POLLS:
                _sleep(_GC_FINISH_POLL_SECONDS)
        self._target.delete_manifest(self._copy_id)
        self._target.delete_marker(self.marker.name)
        raise _gc_busy(self._target, self._copy_id, gc, "is not complete: its manifest was removed")


_LISTING_KEYS_PER_REQUEST: Final = 1000
"""What one request of a listing returns (S3's ``ListObjectsV2`` page)."""


def _list_chunks(target: CopyTarget, pending: _InProgress, budget: int) -> tuple[set[str], bool]:
    """The target's chunk ids, read up to ``budget`` of them: ``(ids, complete)``.

    A listing that would cost more requests than the existence checks it saves
    is cut short: then the ids read are still known to be there, and the others
    are asked about one by one.
    """
    seen: set[str] = set()
    pending.tick()
    for n, cid in enumerate(target.chunk_ids(), 1):
        if n > budget:
            return seen, False
        seen.add(cid)
        if n % _LISTING_KEYS_PER_REQUEST == 0:
            pending.tick()
    return seen, True


class _Sender:
    """The chunks of a copy on their way to the target: each one the copy has not
    met yet is checked for (unless a listing said it is absent), compressed and
    sent by ``parallel`` threads, at most ``2 * parallel`` chunks in memory at
    once. With ``parallel`` 1 everything runs in the caller's thread.

    The first failure stops it: chunks not begun are dropped, the calling thread
    gets the error at its next :meth:`send` or at :meth:`drain`.
    """

    def __init__(
        self,
        target: CopyTarget,
        codec: str,
        pending: _InProgress,
        parallel: int,
        limiter: TokenBucket | None,
        present: set[str],
        listing_complete: bool,
        key: CopyKey | None = None,
    ) -> None:
        self._target = target
        self._codec = codec
        self._key = key
        self._pending = pending
        self._limiter = limiter
        self._present = present
        self._complete = listing_complete
        self._met: set[str] = set()
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._stopped = False
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(
                max_workers=parallel, thread_name_prefix="pgsnap-copy"
            )
            if parallel > 1
            else None
        )
        self._parallel = parallel
        self._slots = threading.Semaphore(2 * parallel)
        self.sent = self.new = self.reused = 0

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def send(self, block: bytes) -> str | concurrent.futures.Future[str]:
        """See that chunk ``block`` ends up in the target; its id, or a future of it
        (hashing the chunk is part of the work the threads share)."""
        self._raise()
        check = not self._complete
        if self._pool is None:
            cid = self._work(block, check)
            self._raise()
            return cid
        self._slots.acquire()
        try:
            self._raise()
            future = self._pool.submit(self._work, block, check)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _f: self._slots.release())
        return future

    def _work(self, block: bytes, check: bool) -> str:
        cid = chunk_id(block, self._key)
        if self._error is not None or self._stopped:
            return cid
        with self._lock:
            if cid in self._met or cid in self._present:
                self.reused += 1  # sent or found by this copy already, or listed
                return cid
            self._met.add(cid)
        try:
            if check:
                self._pending.tick()
                if self._target.has_chunk(cid):
                    with self._lock:
                        self.reused += 1
                    return cid
            stored = encode_chunk(block, self._codec, key=self._key, chunk=cid)
            if self._limiter is not None:
                self._limiter.take(len(stored))
            self._pending.tick()
            written = self._target.put_chunk(cid, stored)
            with self._lock:
                if written:
                    self.new += 1
                    self.sent += len(stored)
                else:
                    self.reused += 1
        except BaseException as exc:
            with self._lock:
                if self._error is None:
                    self._error = exc
        return cid

    def drain(self) -> None:
        """Wait for every chunk sent; raise the first failure."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._raise()

    def close(self) -> None:
        """Stop: drop the chunks not begun, wait for those under way."""
        self._stopped = True
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def absent(self, ids: Iterable[str]) -> list[str]:
        """Those of ``ids`` the target lacks now (one listing when the copy's first
        listing was complete, else an existence check of each, in parallel)."""
        wanted = list(ids)
        if self._complete:
            there, _ = _list_chunks(self._target, self._pending, sys.maxsize)
            return [c for c in wanted if c not in there]

        def lacks(cid: str) -> bool:
            self._pending.tick()
            return not self._target.has_chunk(cid)

        if self._pool is None:
            return [c for c in wanted if lacks(c)]
        with concurrent.futures.ThreadPoolExecutor(
            max_workers=self._parallel, thread_name_prefix="pgsnap-check"
        ) as checks:
            return [c for c, gone in zip(wanted, checks.map(lacks, wanted), strict=True) if gone]


def _read_full(f: IO[bytes], size: int) -> bytes:
    """The next ``size`` bytes of ``f``, fewer only at its end: every chunk but a
    file's last is exactly the chunk size, so a restore knows each one's offset."""
    block = f.read(size)
    while block and len(block) < size:
        more = f.read(size - len(block))
        if not more:
            break
        block += more
    return block


def _drop_cache(fd: int, offset: int, length: int) -> None:
    """Tell the kernel the pages just read will not be read again
    (``POSIX_FADV_DONTNEED``): a copy reads every byte of a snapshot once, and
    without this it fills the host's page cache with them, evicting what the
    database (or anything else on that host) keeps there, and pays for a new page
    of cache for every page it reads. Best effort: where the call is missing or
    refused, nothing changes."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        with contextlib.suppress(OSError):
            advise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def _named_entry(
    item: _Item,
    tree: str,
    size: int,
    sha256: str,
    chunks: list[str | concurrent.futures.Future[str]],
) -> FileEntry:
    ids = tuple(c if isinstance(c, str) else c.result() for c in chunks)
    return item.entry(tree, size=size, sha256=sha256, chunks=ids)


_PROGRESS_EVERY: Final = 1.0
"""Seconds between two progress reports within one large file."""


def copy_trees(
    trees: Mapping[str, str | os.PathLike[str] | StreamedTree],
    target: CopyTarget,
    *,
    copy_id: str,
    backup_id: str,
    files: Mapping[str, str] | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    codec: str | None = None,
    clock: Callable[[], dt.datetime] | None = None,
    on_progress: Callable[[CopyProgress], None] | None = None,
    parallel: int = DEFAULT_PARALLEL,
    bandwidth_limit: int | None = None,
    limiter: TokenBucket | None = None,
    key: CopyKey | None = None,
) -> tuple[Manifest, CopyStats]:
    """Copy ``trees`` (name → a directory here, or a
    :class:`~pgsnap.copies.sources.StreamedTree`: a tree on a host read through the Host seam) to
    ``target`` as copy ``copy_id`` of ``backup_id``; ``files`` are small texts kept
    in the manifest (the backup label). Returns the manifest (already stored) and
    what was sent.

    Only regular files, directories and symbolic links are copied; anything
    else (a socket, a device) is a :class:`~pgsnap.errors.CopyError`, since a
    data directory holds none.

    Files are read, cut and hashed in order in the calling thread; the chunks
    are checked for, compressed and sent by ``parallel`` threads (1: all in the
    calling thread), at most ``2 * parallel`` chunks held at once. A target
    whose chunk listing costs fewer requests than a quarter of the copy's chunks
    is listed once at the start, and no chunk is asked about: those listed are
    reused, the others sent. ``bandwidth_limit`` (bytes a second, of stored
    chunks sent) is one :class:`~pgsnap.copies.bandwidth.TokenBucket` shared by
    the threads; ``limiter`` gives one of your own (shared between copies, or
    on a fake clock) instead.

    ``clock`` gives the manifest's time and the times in the copy's
    ``pending.<copy id>`` marker. While a garbage collection holds the target
    the copy does not start (:class:`~pgsnap.errors.CopyBusy`). A copy that
    fails otherwise (the first failure of any thread stops it, and no manifest
    is written) leaves its marker, so that no collection removes the chunks it
    sent until the marker is stale: run it again to finish it.

    ``key``: encrypt the copy (keyed chunk ids, sealed chunks and manifest:
    :mod:`pgsnap.copies.keys`).
    """
    if chunk_size < 4096:
        raise ConfigurationError(f"chunk_size must be at least 4096 bytes, not {chunk_size}")
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ConfigurationError(
            f"parallel must be a whole number of at least 1, not {parallel!r}",
            hint="the number of upload threads, e.g. 4",
        )
    if limiter is None and bandwidth_limit is not None:
        limiter = TokenBucket(bandwidth_limit)
    codec = codec or default_codec()
    encode_chunk(b"", codec)  # an unknown or unavailable codec fails before anything is sent
    started = time.monotonic()
    clock = clock or utc_now
    now = clock()
    listings: dict[str, list[tuple[Path, str, os.stat_result]]] = {}
    sizes: list[int] = []
    for name, top in trees.items():
        if isinstance(top, StreamedTree):
            sizes += top.file_sizes()
            continue
        root = Path(os.fspath(top))
        if not root.is_dir():
            raise CopyError(f"tree {name!r} ({root}) is not a directory", tree=name)
        listings[name] = [(root, rel, st) for rel, st in _walk(root)]
        sizes += [st.st_size for _r, _p, st in listings[name] if stat.S_ISREG(st.st_mode)]
    total = sum(sizes)
    n_files = len(sizes)
    n_chunks = sum(-(-size // chunk_size) for size in sizes)
    entries: list[FileEntry | Callable[[], FileEntry]] = []  # a call: its chunk ids are coming
    read = done = 0
    pending = _InProgress(target, copy_id, clock)
    pending.start()
    present, complete = _list_chunks(
        target, pending, max(_LISTING_KEYS_PER_REQUEST, n_chunks * _LISTING_KEYS_PER_REQUEST // 4)
    )
    log.debug(
        "copy %s: %d chunks listed in %s (%s)",
        copy_id,
        len(present),
        target.location,
        "all of them" if complete else "a part: the others are asked about",
    )
    sender = _Sender(target, codec, pending, parallel, limiter, present, complete, key)
    reported = time.monotonic()

    def report() -> None:
        if on_progress is not None:
            elapsed = time.monotonic() - started
            on_progress(CopyProgress(done, n_files, read, total, sender.sent, elapsed))

    try:
        for name, top in trees.items():
            with _items(name, top, listings.get(name, [])) as items:
                for item in items:
                    if item.kind is not EntryKind.FILE:
                        entries.append(item.entry(name))
                        continue
                    whole = hashlib.sha256()
                    chunks: list[str | concurrent.futures.Future[str]] = []
                    size = 0
                    with item.open() as f:
                        fd = f.fileno() if item.path is not None else None
                        while block := _read_full(f, chunk_size):
                            if fd is not None:
                                _drop_cache(fd, size, len(block))
                            whole.update(block)
                            size += len(block)
                            read += len(block)
                            chunks.append(sender.send(block))
                            if time.monotonic() - reported > _PROGRESS_EVERY:
                                report()
                                reported = time.monotonic()
                    done += 1
                    entries.append(
                        functools.partial(_named_entry, item, name, size, whole.hexdigest(), chunks)
                    )
                    report()
                    reported = time.monotonic()
        sender.drain()
        complete_entries = tuple(e if isinstance(e, FileEntry) else e() for e in entries)
        manifest = Manifest(
            copy_id=copy_id,
            backup_id=backup_id,
            created_at=now,
            chunk_size=chunk_size,
            codec=codec,
            trees=tuple(trees),
            entries=complete_entries,
            files=dict(files or {}),
            key_fingerprint=key.fingerprint if key is not None else "",
        )
        pending.tick()
        if pending.widest > TRUSTED_GAP:
            # A collection may have taken this copy for dead and swept the chunks it
            # found or sent: look before a manifest names them (the check after the
            # manifest, in finish, is made by every copy).
            absent = sender.absent(sorted(manifest.chunk_ids()))
            if absent:
                raise CopyError(
                    f"copy {copy_id}: {len(absent)} chunks are not in the target after "
                    f"sending (first {absent[0]}); no manifest written",
                    hint="check the target; running the copy again sends what is missing",
                    copy_id=copy_id,
                )
        pending.tick()
        target.put_manifest(copy_id, encode_manifest(manifest, key))
        pending.finish(manifest, sender.absent)
    finally:
        sender.close()
    stats = CopyStats(
        n_files, read, sender.sent, sender.new, sender.reused, time.monotonic() - started
    )
    log.info(
        "copy %s of backup %s: %d files, %d bytes read, %d bytes sent (%d chunks new, %d reused)",
        copy_id,
        backup_id,
        n_files,
        read,
        stats.bytes_sent,
        stats.chunks_new,
        stats.chunks_reused,
    )
    return manifest, stats


@frozen
class RestoreProgress:
    """A progress report of :func:`restore_trees` (after each file). ``seconds``
    since the restore started; :attr:`rate` and :attr:`seconds_left` follow."""

    files_done: int
    files_total: int
    bytes_written: int
    bytes_total: int
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        """Bytes written a second so far (0 before any time passed)."""
        return _rate(self.bytes_written, self.seconds)

    @property
    def seconds_left(self) -> float | None:
        """The time left at :attr:`rate` (None while nothing was written)."""
        return _left(self.bytes_written, self.bytes_total, self.seconds)


_IGNORED_AT_TOP: Final = frozenset({"lost+found"})
"""What a fresh file system holds at its root and a restore may find there."""


def _is_empty(dest: Path) -> bool:
    return all(p.name in _IGNORED_AT_TOP for p in dest.iterdir())


def restore_trees(
    manifest: Manifest,
    target: CopyTarget,
    destinations: Mapping[str, str | os.PathLike[str]],
    *,
    parallel: int = 4,
    on_progress: Callable[[RestoreProgress], None] | None = None,
    key: CopyKey | None = None,
) -> int:
    """Write trees of ``manifest`` into ``destinations`` (tree name → an empty or
    missing directory: a fresh file system's ``lost+found`` is allowed); return the
    bytes written. Only the trees named are restored. A destination that holds
    anything is refused before a byte is written: a copy is never restored over
    data. Each distinct chunk is fetched once, ``parallel`` at a time, checked
    against its name and length, and written at its offsets in every file that
    names it; so each file is its chunks in order, each checked.
    An encrypted copy needs its ``key`` (:class:`~pgsnap.errors.CopyKeyError`
    before anything is written otherwise); a copy that is not encrypted ignores it.
    """
    chunk_key = _chunk_key(manifest, key)
    unknown = sorted(set(destinations) - set(manifest.trees))
    if unknown or not destinations:
        raise ConfigurationError(
            f"copy {manifest.copy_id} has no tree(s) {', '.join(unknown) or '(none named)'}"
            f" (its trees: {', '.join(manifest.trees)})",
            hint="name a destination directory for trees the manifest lists",
        )
    if parallel < 1:
        raise ConfigurationError(f"parallel must be at least 1, not {parallel}")
    for name in destinations:
        dest = Path(os.fspath(destinations[name]))
        if dest.exists() and (not dest.is_dir() or not _is_empty(dest)):
            raise CopyError(
                f"cannot restore tree {name!r} of copy {manifest.copy_id} into {dest}: "
                "it is not an empty directory",
                hint="restore into empty storage; pgsnap never writes a copy over data",
                tree=name,
                path=str(dest),
            )
    plan = _RestorePlan(manifest, destinations)
    with (
        concurrent.futures.ThreadPoolExecutor(
            max_workers=parallel, thread_name_prefix="pgsnap-restore"
        ) as pool,
        concurrent.futures.ThreadPoolExecutor(
            max_workers=parallel, thread_name_prefix="pgsnap-fsync"
        ) as syncs,
    ):
        plan.create(syncs)
        plan.report(on_progress)
        running: collections.deque[concurrent.futures.Future[list[tuple[int, int]]]] = (
            collections.deque()
        )

        def settle(future: concurrent.futures.Future[list[tuple[int, int]]]) -> None:
            plan.written(future.result(), syncs)
            plan.report(on_progress)

        try:
            for cid in plan.order:
                if len(running) >= 2 * parallel:
                    settle(running.popleft())
                running.append(pool.submit(plan.put, target, cid, chunk_key))
            while running:
                settle(running.popleft())
            for synced in plan.synced:
                synced.result()
        finally:
            for f in running:  # a failure: the chunks not begun are dropped
                f.cancel()
        plan.finish()
    return plan.bytes_total


class _RestorePlan:
    """Where each chunk of a restore goes, and how far the restore is.

    Every directory, link and (empty) file is made first; then each distinct chunk
    is fetched once, checked against its name and its length, and written at its
    offsets in every file that names it (:meth:`put`, in the threads); a file is
    fsynced as soon as its last chunk is in. Every chunk but a file's last is the
    manifest's chunk size long (:func:`copy_trees` cuts them so), so a chunk's
    offset is its index times that size; the file's content is its chunks in order,
    each checked, so its checksum holds by construction. Counting and reporting
    happen in the calling thread only.
    """

    def __init__(
        self, manifest: Manifest, destinations: Mapping[str, str | os.PathLike[str]]
    ) -> None:
        self.manifest = manifest
        self.roots = {
            name: Path(os.fspath(destinations[name]))
            for name in manifest.trees
            if name in destinations
        }
        self.entries = [e for name in self.roots for e in manifest.entries_of(name)]
        self.files: list[tuple[FileEntry, Path]] = [
            (e, self.path(e)) for e in self.entries if e.kind is EntryKind.FILE
        ]
        self.bytes_total = sum(e.size for e, _ in self.files)
        self.bytes_done = self.files_done = 0
        self.started = time.monotonic()
        self.left = [len(e.chunks) for e, _ in self.files]
        self.synced: list[concurrent.futures.Future[None]] = []
        self.places: dict[str, list[tuple[int, int, int]]] = {}
        """chunk id -> (file index, offset, length) of each place it is written to."""
        size = manifest.chunk_size
        for i, (e, _path) in enumerate(self.files):
            if not (len(e.chunks) - 1) * size < e.size <= len(e.chunks) * size:
                raise DamagedChunkError(
                    f"{e.tree}/{e.path} of copy {manifest.copy_id}: {len(e.chunks)} chunks "
                    f"of {size} bytes cannot hold its {e.size} bytes",
                    hint="the manifest is damaged; restore from another copy",
                    path=e.path,
                )
            for k, cid in enumerate(e.chunks):
                self.places.setdefault(cid, []).append((i, k * size, min(size, e.size - k * size)))
        self.order = list(self.places)  # first use first: the files fill in order
        self._local = threading.local()  # a chunk buffer per thread, used again and again
        self._direct = bool(_O_DIRECT)

    def path(self, e: FileEntry) -> Path:
        """Where entry ``e`` is restored."""
        root = self.roots[e.tree]
        return root / e.path if e.path else root

    def create(self, syncs: concurrent.futures.Executor) -> None:
        """Make every directory, symbolic link and file (empty; those with no chunk
        are complete and fsynced)."""
        for root in self.roots.values():
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
        index = 0
        for e in self.entries:
            path = self.path(e)
            if e.kind is EntryKind.DIRECTORY:
                path.mkdir(exist_ok=True, mode=0o700)
            elif e.kind is EntryKind.SYMLINK:
                assert e.link is not None
                os.symlink(e.link, path)
            else:
                with open(path, "xb"):
                    pass
                if not self.left[index]:
                    self.written([], syncs, done=index)
                index += 1

    def put(self, target: CopyTarget, cid: str, key: CopyKey | None) -> list[tuple[int, int]]:
        """Fetch chunk ``cid``, check it, write it to its places: ``(file index,
        bytes)`` of each (in a thread)."""
        buffer = getattr(self._local, "buffer", None)
        if buffer is None:  # page-aligned, as O_DIRECT wants; one per thread, reused
            buffer = self._local.buffer = mmap.mmap(-1, self.manifest.chunk_size)
        view = memoryview(buffer)
        size = decode_chunk_into(target.get_chunk(cid), cid, view, key)
        out = []
        for i, offset, length in self.places[cid]:
            entry, path = self.files[i]
            if size != length:
                raise DamagedChunkError(
                    f"chunk {cid} of {entry.tree}/{entry.path} (copy "
                    f"{self.manifest.copy_id}) holds {size} bytes, not {length}",
                    hint="the copy is damaged; restore from another copy",
                    path=str(path),
                    chunk=cid,
                )
            self._write(path, view[:size], offset)
            out.append((i, length))
        return out

    def _write(self, path: Path, data: memoryview, offset: int) -> None:
        """Write ``data`` at ``offset``: with ``O_DIRECT`` where the range is aligned
        and the file system takes it (the restore does not fill the page cache, and
        allocating page cache is most of a buffered write's cost), else buffered."""
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
        direct = self._direct and not offset % _DIRECT_ALIGN and not len(data) % _DIRECT_ALIGN
        try:
            fd = os.open(path, flags | _O_DIRECT if direct else flags)
        except OSError as exc:
            if not direct or exc.errno != errno.EINVAL:
                raise
            self._no_direct(path, exc)
            direct, fd = False, os.open(path, flags)
        try:
            while data:
                try:
                    n = os.pwrite(fd, data, offset)
                except OSError as exc:
                    if not direct or exc.errno != errno.EINVAL:
                        raise
                    self._no_direct(path, exc)
                    os.close(fd)
                    direct, fd = False, os.open(path, flags)
                    continue
                data, offset = data[n:], offset + n
        finally:
            os.close(fd)

    def _no_direct(self, path: Path, exc: OSError) -> None:
        if self._direct:
            self._direct = False
            log.debug("restore: %s refuses O_DIRECT (%s): buffered writes from now on", path, exc)

    def written(
        self,
        pieces: list[tuple[int, int]],
        syncs: concurrent.futures.Executor,
        *,
        done: int | None = None,
    ) -> None:
        """Count ``pieces`` written; fsync each file whose last chunk is in."""
        complete = [done] if done is not None else []
        for i, length in pieces:
            self.bytes_done += length
            self.left[i] -= 1
            if not self.left[i]:
                complete.append(i)
        for i in complete:
            self.files_done += 1
            self.synced.append(syncs.submit(_fsync, self.files[i][1]))

    def report(self, on_progress: Callable[[RestoreProgress], None] | None) -> None:
        """Tell ``on_progress`` how far the restore is."""
        if on_progress is not None:
            on_progress(
                RestoreProgress(
                    self.files_done,
                    len(self.files),
                    self.bytes_done,
                    self.bytes_total,
                    time.monotonic() - self.started,
                )
            )

    def finish(self) -> None:
        """Give every entry its owner, mode and times: children first, so that a
        directory's time is set after its last child is made."""
        for e in reversed(self.entries):
            _apply_meta(e, self.path(e))


_O_DIRECT: Final = getattr(os, "O_DIRECT", 0)
_DIRECT_ALIGN: Final = 4096
"""Offsets and lengths a restore writes with ``O_DIRECT`` are multiples of this
(the logical block size of every disk pgsnap restores to, or a multiple of it)."""

_REPEATS_KEPT: Final = 8
"""Chunks a restore keeps for their next use (at most 4 MiB each by default)."""


def _chunk_key(manifest: Manifest, key: CopyKey | None) -> CopyKey | None:
    """The key that reads ``manifest``'s chunks: ``key`` for an encrypted copy (which
    must be the copy's: :class:`~pgsnap.errors.CopyKeyError`), None for a plain one."""
    wanted = manifest.key_fingerprint
    if not wanted:
        return None
    if key is None or key.fingerprint != wanted:
        raise CopyKeyError(
            f"copy {manifest.copy_id} is encrypted with key {wanted}"
            + (": give [copies] key_file" if key is None else f", not {key.fingerprint}"),
            hint=f"set [copies] key_file to the key file of fingerprint {wanted}",
            copy_id=manifest.copy_id,
            fingerprint=wanted,
            given=key.fingerprint if key is not None else "",
        )
    return key


def _fetched(
    target: CopyTarget,
    chunks: list[str],
    pool: concurrent.futures.Executor,
    window: int,
    key: CopyKey | None = None,
) -> Generator[bytes, None, None]:
    """The decoded chunks in order, at most ``window`` fetched ahead of the consumer.

    A chunk named more than once (a run of zero pages, a file twice) is fetched
    once and kept until its last use, for at most :data:`_REPEATS_KEPT` such
    chunks at a time (beyond them, a repeat is fetched again).
    """
    pending: collections.deque[concurrent.futures.Future[bytes]] = collections.deque()
    uses = collections.Counter(chunks)
    kept: dict[str, concurrent.futures.Future[bytes]] = {}
    todo = iter(chunks)

    def fetch(cid: str) -> bytes:
        return decode_chunk(target.get_chunk(cid), cid, key)

    def ahead(cid: str) -> None:
        uses[cid] -= 1
        future = kept.get(cid)
        if future is None:
            future = pool.submit(fetch, cid)
            if uses[cid] > 0 and len(kept) < _REPEATS_KEPT:
                kept[cid] = future
        if uses[cid] <= 0:
            kept.pop(cid, None)
        pending.append(future)

    try:
        for cid in itertools.islice(todo, window):
            ahead(cid)
        while pending:
            data = pending.popleft().result()
            nxt = next(todo, None)
            if nxt is not None:
                ahead(nxt)
            yield data
    finally:
        for f in pending:
            f.cancel()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _apply_meta(entry: FileEntry, path: Path) -> None:
    if os.geteuid() == 0:
        os.lchown(path, entry.uid, entry.gid)
    if entry.kind is not EntryKind.SYMLINK:
        os.chmod(path, entry.mode)
    os.utime(path, ns=(entry.mtime_ns, entry.mtime_ns), follow_symlinks=False)


def verify_copy(
    target: CopyTarget,
    copy_id: str,
    *,
    sample: float | None = None,
    rng: random.Random | None = None,
    key: CopyKey | None = None,
    parallel: int = DEFAULT_PARALLEL,
) -> VerifyReport:
    """Check copy ``copy_id``'s chunks in ``target``: every one (``sample`` None) or
    a random share of them (``0 < sample <= 1``, at least one), ``parallel`` at a
    time. An encrypted copy needs its ``key`` (:class:`~pgsnap.errors.CopyKeyError`
    otherwise): each chunk's tag and keyed id are checked. A missing or damaged
    chunk is reported with the files it breaks, and the other copies of the
    target that name it (:attr:`VerifyReport.breaks`)."""
    if parallel < 1:
        raise ConfigurationError(f"parallel must be at least 1, not {parallel}")
    manifest = decode_manifest(target.get_manifest(copy_id), copy_id, key)
    chunk_key = _chunk_key(manifest, key)
    users: dict[str, list[str]] = {}
    for e in manifest.entries:
        for c in e.chunks:
            users.setdefault(c, []).append(f"{e.tree}/{e.path}")
    chunks = sorted(users)
    if sample is not None:
        if not 0 < sample <= 1:
            raise ConfigurationError(f"sample must be above 0 and at most 1, not {sample}")
        k = max(1, round(len(chunks) * sample)) if chunks else 0
        chunks = sorted((rng or random.Random()).sample(chunks, k))  # noqa: S311 - a sample, not a secret
    missing: dict[str, tuple[str, ...]] = {}
    damaged: dict[str, tuple[str, ...]] = {}

    def check(c: str) -> str:
        try:
            decode_chunk(target.get_chunk(c), c, chunk_key)
        except CopyNotFound:
            return "missing"
        except DamagedChunkError:
            return "damaged"
        return ""

    with concurrent.futures.ThreadPoolExecutor(
        max_workers=parallel, thread_name_prefix="pgsnap-verify"
    ) as pool:
        for c, found in zip(chunks, pool.map(check, chunks), strict=True):
            if found:
                (missing if found == "missing" else damaged)[c] = tuple(dict.fromkeys(users[c]))
    for c in (*missing, *damaged):
        log.warning("copy %s: chunk %s is %s", copy_id, c, "missing" if c in missing else "damaged")
    breaks = _also_broken(target, copy_id, {*missing, *damaged}, key) if missing or damaged else {}
    return VerifyReport(
        copy_id, len(users), len(chunks), missing, damaged, manifest.backup_id, breaks
    )


def _also_broken(
    target: CopyTarget, copy_id: str, bad: set[str], key: CopyKey | None
) -> dict[str, tuple[str, ...]]:
    """The other copies in ``target`` whose manifests name each of the ``bad`` chunks
    (a manifest that cannot be read, another key's, is passed over with a log line)."""
    out: dict[str, list[str]] = {}
    for other in target.manifest_ids():
        if other == copy_id:
            continue
        try:
            manifest = decode_manifest(target.get_manifest(other), other, key)
        except (CopyError, FormatError) as exc:
            log.info("copy %s not searched for the damaged chunks: %s", other, exc)
            continue
        for c in bad & manifest.chunk_ids():
            out.setdefault(c, []).append(f"{other} (backup {manifest.backup_id})")
    return {c: tuple(v) for c, v in out.items()}
