"""pgsnap's own WAL archive, in an object store (S3-compatible, or a directory).

``pgsnap wal-push %p`` (an ``archive_command``) writes each WAL file as one
object (:mod:`pgsnap.archives.format`: compressed, optionally encrypted, with
its digest), and ``pgsnap wal-get %f %p`` (a ``restore_command``) reads it
back. :class:`StoreWalArchive` is the :class:`~pgsnap.protocols.WalArchive` over
it, so ``check``, ``pgsnap wal``, planning, the WAL reader and the WAL index
read it as they read a directory. Keys::

    <prefix>wal/<timeline and log: 16 hex digits>/<segment, .partial or .backup name>
    <prefix>wal/history/<NNNNNNNN.history>

Names are the files' own (``000000010000000000000003``): the compression and
encryption are the object's, not the name's. A push is atomic (one PUT, or a
link in a directory) and written only where no object is (``if_absent``); a
file pushed again with the same content succeeds, with different content is
refused (:class:`~pgsnap.errors.ArchiveError`), as PostgreSQL requires of an
``archive_command``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import io
import logging
import shlex
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Final

import attrs

from pgsnap.archives.format import DEFAULT_FRAME, Header, encode, frames, parse_header
from pgsnap.errors import ArchiveError, PgsnapError
from pgsnap.stores import ObjectStore
from pgsnap.wal.archive import read_histories
from pgsnap.wal.continuity import ArchiveIndex
from pgsnap.wal.files import ArchivedFile, ReadStream, check_file_name
from pgsnap.wal.names import WalFileKind, parse_archive_name
from pgsnap.wal.timelines import TimelineGraph

if TYPE_CHECKING:
    from pgsnap.copies.keys import CopyKey

__all__ = ["StoreWalArchive", "etag_version", "quoted_command", "wal_key"]

log = logging.getLogger(__name__)

_PREFIX: Final = "wal/"
_HEADER_READS: Final = 16
"""Headers read at a time when a listing checks the segments' sizes."""
_TABLE_READ: Final = 4096
"""Bytes read to get an object's header and frame table (1,009 frames fit)."""


def wal_key(name: str) -> str:
    """The key of WAL file ``name`` (see the module docstring); ``WalNameError`` for a
    name that is not one of a WAL file (a compressed name included: the archive
    compresses itself)."""
    entry = parse_archive_name(check_file_name(name))
    if entry.kind is WalFileKind.UNKNOWN or entry.compression is not None:
        from pgsnap.errors import WalNameError  # noqa: PLC0415

        raise WalNameError(
            f"{name!r} is not the name of a WAL file pgsnap's archive keeps",
            hint="a segment, .partial, .backup or .history name as PostgreSQL gives it (%f)",
            name=name,
        )
    if entry.kind is WalFileKind.HISTORY:
        return f"{_PREFIX}history/{name}"
    return f"{_PREFIX}{name[:16].upper()}/{name}"


def etag_version(etag: str) -> int:
    """A number for an object's version tag (its ETag): what
    :attr:`~pgsnap.wal.files.ArchivedFile.mtime_ns` holds for an object, so that with
    its size it tells one version of the object from another (caches key on both)."""
    return int(hashlib.sha256(etag.encode()).hexdigest()[:15], 16)


class _FrameStream(io.RawIOBase):
    """The content of one object, read frame by frame (memory: one frame)."""

    def __init__(self, frames_: Iterator[bytes]) -> None:
        self._frames = frames_
        self._buffer = b""
        self._done = False

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1, /) -> bytes:
        want = -1 if size is None else size
        out: list[bytes] = []
        have = 0
        while want < 0 or have < want:
            if not self._buffer:
                if self._done:
                    break
                try:
                    self._buffer = next(self._frames)
                except StopIteration:
                    self._done = True
                    break
            take = self._buffer if want < 0 else self._buffer[: want - have]
            self._buffer = self._buffer[len(take) :]
            out.append(take)
            have += len(take)
        return b"".join(out)

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._frames = iter(())
        super().close()


class StoreWalArchive:
    """pgsnap's WAL archive in ``store`` (see the module docstring).

    ``key``: the key that encrypts what is pushed and decrypts what is read (a
    :class:`~pgsnap.copies.keys.CopyKey`; None: not encrypted, and an encrypted
    object is refused with the reason). ``restore_command``: the
    ``restore_command`` recoveries are given (``pgsnap -c CONFIG wal-get %f %p``;
    :meth:`restore_command` refuses when it is unknown). ``frame``: the bytes of
    content per frame.
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        key: CopyKey | None = None,
        restore_command: str | None = None,
        frame: int = DEFAULT_FRAME,
        compress: bool = True,
    ) -> None:
        self._store = store
        self._key = key
        self._restore_command = restore_command
        self._frame = frame
        self._compress = compress

    def __repr__(self) -> str:
        return f"StoreWalArchive({self._store.location!r})"

    @property
    def location(self) -> str:
        """The store's location."""
        return self._store.location

    @property
    def store(self) -> ObjectStore:
        """The object store."""
        return self._store

    # ------------------------------------------------------------------ writing

    def push(self, name: str, data: bytes) -> bool:
        """Archive WAL file ``name`` with content ``data``: True when it was written,
        False when the archive held it already with the same content. ``ArchiveError``
        when it holds it with other content (it is never overwritten)."""
        key = wal_key(name)
        stored = encode(name, data, key=self._key, frame=self._frame, compress=self._compress)
        if self._store.put(key, stored, if_absent=True):
            log.debug("archived %s (%d bytes, %d stored)", name, len(data), len(stored))
            return True
        existing = self._header(name, key)
        if existing is None:  # went between the two requests: try once more
            if self._store.put(key, stored, if_absent=True):
                return True
            existing = self._header(name, key)
        mine = parse_header(stored, name=name, where=self.location)
        if existing is not None and existing.digest == mine.digest and existing.size == mine.size:
            log.info("%s is archived already, with the same content", name)
            return False
        raise ArchiveError(
            f"{name} is archived already in {self.location} with other content: it is "
            "never overwritten",
            hint="is a second cluster archiving into this archive (compare system "
            "identifiers), or was the server restored without a new timeline? Find out "
            "before you move the archived file away",
            name=name,
            path=self.location,
        )

    def delete(self, names: Sequence[str]) -> int:
        """Remove these files (retention's ``archive.delete_wal``); names not there are
        skipped. How many were removed."""
        removed = 0
        for name in names:
            with contextlib.suppress(ArchiveError):
                key = wal_key(name)
                if self._store.head(key) is None:
                    continue
                self._store.delete(key)
                removed += 1
        return removed

    # ------------------------------------------------------------------ reading

    def _header(self, name: str, key: str) -> Header | None:
        try:
            prefix = self._store.get_range(key, 0, _TABLE_READ)
        except ArchiveError:
            if self._store.head(key) is None:
                return None
            raise
        return parse_header(prefix, name=name, where=self.location)

    def list_names(
        self, segment_size: int | None = None, *, check_sizes: bool = True
    ) -> tuple[str, ...]:
        """Every WAL file's name, sorted (one listing). With ``segment_size`` and
        ``check_sizes``, a segment whose content is not of that size is left out:
        that reads each segment's header (a ranged read each; planning passes
        ``check_sizes=False``)."""
        names = []
        for found in self._store.list(_PREFIX):
            name = found.key.rpartition("/")[2]
            if parse_archive_name(name).kind is not WalFileKind.UNKNOWN:
                names.append(name)
        names.sort()
        if segment_size is not None and check_sizes:
            names = self._fitting(names, segment_size)
        return tuple(names)

    def _fitting(self, names: list[str], segment_size: int) -> list[str]:
        """The names of ``names`` that are not segments of another size (the segments'
        headers read :data:`_HEADER_READS` at a time)."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=_HEADER_READS) as pool:
            fits = list(pool.map(lambda n: self._fits(n, segment_size), names))
        return [n for n, ok in zip(names, fits, strict=True) if ok]

    def _fits(self, name: str, segment_size: int) -> bool:
        if parse_archive_name(name).kind is not WalFileKind.SEGMENT:
            return True
        header = self._header(name, wal_key(name))
        return header is not None and header.size == segment_size

    def exists(self, name: str) -> bool:
        """Whether the archive holds ``name``."""
        check_file_name(name)
        try:
            key = wal_key(name)
        except PgsnapError:
            return False
        return self._store.head(key) is not None

    def stat(self, name: str) -> ArchivedFile | None:
        """The file as the archive holds it: ``size`` and ``content_size`` its
        content's length (from the object's header), ``mtime_ns`` its version
        (:func:`etag_version`); None when it is not there."""
        check_file_name(name)
        try:
            key = wal_key(name)
        except PgsnapError:
            return None
        found = self._store.head(key)
        if found is None:
            return None
        header = self._header(name, key)
        if header is None:
            return None
        where = f"{self.location} ({key})"
        return ArchivedFile(name, header.size, etag_version(found.etag), where, header.size)

    def open(self, name: str) -> ReadStream:
        """The file's content, read frame by frame from the store (one ranged read a
        frame), its digest checked at the end."""
        key = wal_key(name)
        header = self._header(name, key)
        if header is None:
            raise ArchiveError(
                f"{name} is not in the WAL archive {self.location}",
                hint="list the archive to see which files it holds",
                name=name,
                path=self.location,
            )
        return _FrameStream(
            frames(
                header,
                lambda offset, length: self._store.get_range(key, offset, length),
                name=name,
                where=self.location,
                key=self._key,
            )
        )

    def fetch(self, name: str) -> bytes:
        """The file's whole content (one read of the object), checked; ``ArchiveError``
        when it is not there (:meth:`exists` tells)."""
        key = wal_key(name)
        try:
            stored = self._store.get(key)
        except ArchiveError:
            if self._store.head(key) is None:
                raise ArchiveError(
                    f"{name} is not in the WAL archive {self.location}",
                    hint="list the archive to see which files it holds",
                    name=name,
                    path=self.location,
                ) from None
            raise
        where = self.location
        header = parse_header(stored, name=name, where=where)
        pieces = frames(
            header,
            lambda offset, length: stored[offset : offset + length],
            name=name,
            where=where,
            key=self._key,
        )
        return b"".join(list(pieces))

    def read_text(self, name: str) -> str:
        """The text of a ``.history`` or ``.backup`` file."""
        return self.fetch(name).decode("utf-8", errors="replace")

    def index(self, segment_size: int, *, check_sizes: bool = True) -> ArchiveIndex:
        """An index of the archive's files (one listing; with ``check_sizes``, a
        segment of another size is among its ``unknown_names``)."""
        every = self.list_names()
        usable = self._fitting(list(every), segment_size) if check_sizes else every
        index = ArchiveIndex.build(list(usable), segment_size)
        kept = set(usable)
        rejected = tuple(n for n in every if n not in kept)
        if rejected:
            index = attrs.evolve(index, unknown_names=(*index.unknown_names, *rejected))
        return index

    def histories(self, names: Sequence[str] | None = None) -> TimelineGraph:
        """The timeline graph of the ``.history`` files among ``names`` (None: all)."""
        return TimelineGraph.from_histories(
            read_histories(self, None if names is None else tuple(names))
        )

    def restore_command(self) -> str:
        """The ``restore_command`` that fetches from this archive (``pgsnap wal-get``)."""
        if not self._restore_command:
            raise ArchiveError(
                f"no restore_command is known for the WAL archive {self.location}",
                hint="build the archive from a configuration file (pgsnap -c CONFIG), or "
                "give restore_command='pgsnap -c CONFIG wal-get %f %p'",
                path=self.location,
            )
        return self._restore_command


def quoted_command(executable: str, config: str) -> str:
    """``<executable> -c <config> wal-get %f %p``, shell-quoted, ``%`` doubled."""
    return (
        f"{shlex.quote(executable)} -c {shlex.quote(config)}".replace("%", "%%")
        + " wal-get '%f' '%p'"
    )
