"""A WAL archive held in memory: the second :class:`~pgsnap.protocols.WalArchive`.

:class:`MemoryWalArchive` keeps its files in a dictionary (name -> the bytes as
stored) and has no path: its ``location`` is ``memory://<name>``. It proves
that the observer, the planners, the WAL reader and its index use an archive
only through the protocol's methods (the conformance suite
:mod:`pgsnap.testing.wal_conformance` runs against it as against
:class:`~pgsnap.wal.archive.DirectoryWalArchive`), and it serves tests that
want an archive without a directory, or one that cannot be read
(``unreadable=``).

Example::

    archive = MemoryWalArchive.from_directory(server.archive_dir)
    archive.put("00000002.history", b"1\\t0/3000000\\tno recovery target specified\\n")
    facts = Observer(..., archive=archive, ...).recovery_facts(request)
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import ArchiveError
from pgsnap.wal.archive import (
    DECOMPRESSORS,
    DirectoryWalArchive,
    decompress_content,
    read_histories,
)
from pgsnap.wal.continuity import ArchiveIndex
from pgsnap.wal.files import ArchivedFile, ReadStream, check_file_name
from pgsnap.wal.names import COMPRESSION_SUFFIXES, WalFileKind, parse_archive_name
from pgsnap.wal.timelines import TimelineGraph

__all__ = ["MemoryWalArchive"]

log = logging.getLogger(__name__)

MAX_TEXT_FILE_SIZE: Final = 1024 * 1024
"""Largest ``.history``/``.backup`` file :meth:`MemoryWalArchive.read_text` reads (1 MiB)."""


@frozen
class _Stored:
    data: bytes
    mtime_ns: int


class MemoryWalArchive:
    """A WAL archive in a dictionary, read and written in this process.

    Files are put with :meth:`put` as they would be stored (a name ending in
    ``.gz``, ``.bz2`` or ``.xz`` holds compressed bytes, which :meth:`open`
    decompresses; ``.lz4`` and ``.zst`` files are kept but cannot be read).
    Listing leaves out names that start with ``.`` or end in ``.tmp``, as a
    directory archive does. Compressed segments of the three standard-library
    codecs count as WAL a recovery can use: :meth:`restore_command` fetches
    them decompressed.

    ``restore_command`` writes a copy of the archive (each file decompressed
    under its plain name) into a private directory made on the first call, and
    copies from there: a server restores what the archive held when the
    command was asked for. :meth:`close` (or leaving a ``with`` block) removes
    that directory.

    ``unreadable``: the archive cannot be reached (why, e.g. ``"connection
    refused"``): every call that reads it raises
    :class:`~pgsnap.errors.ArchiveError`, as an archive whose store is down.
    """

    def __init__(
        self,
        files: Mapping[str, bytes] | None = None,
        *,
        name: str = "wal",
        unreadable: str | None = None,
    ) -> None:
        """An archive holding ``files`` (name -> stored bytes), called ``name`` in its
        ``location``."""
        self._name = name
        self._files: dict[str, _Stored] = {}
        self._last_ns = 0
        self._unreadable = unreadable
        self._spool: str | None = None
        for file_name, data in (files or {}).items():
            self.put(file_name, data)

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str], *, name: str = "wal") -> MemoryWalArchive:
        """An archive holding a copy of the regular files in the directory ``path``
        (names starting with ``.`` or ending in ``.tmp`` are left out)."""
        archive = cls(name=name)
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            if entry.name.startswith(".") or entry.name.endswith(".tmp") or not entry.is_file():
                continue
            with open(entry.path, "rb") as f:
                archive.put(entry.name, f.read())
        return archive

    @property
    def location(self) -> str:
        """``memory://<name>``: where the archive is, for messages."""
        return f"memory://{self._name}"

    def __repr__(self) -> str:
        return f"MemoryWalArchive({self.location!r}, {len(self._files)} files)"

    # -- writing (the test's side) ------------------------------------------------------

    def put(self, name: str, data: bytes, *, mtime_ns: int | None = None) -> None:
        """Store ``data`` as the file ``name`` (replacing one of that name), as an
        ``archive_command`` would; its modification time is now (later than any
        before, so a rewrite is always seen), or ``mtime_ns``."""
        check_file_name(name)
        if mtime_ns is None:
            mtime_ns = max(time.time_ns(), self._last_ns + 1)
        self._last_ns = max(self._last_ns, mtime_ns)
        self._files[name] = _Stored(bytes(data), mtime_ns)

    def stored(self, name: str) -> bytes:
        """The bytes stored as ``name`` (``KeyError`` if none)."""
        return self._files[name].data

    # -- reading ------------------------------------------------------------------------

    def _check(self) -> None:
        if self._unreadable is not None:
            raise ArchiveError(
                f"the WAL archive {self.location} cannot be read: {self._unreadable}",
                hint="check that the archive's store is reachable",
                path=self.location,
            )

    def _usable(self, name: str, segment_size: int, check_sizes: bool) -> bool:
        entry = parse_archive_name(name)
        if entry.kind is not WalFileKind.SEGMENT:
            return True
        if entry.compression is not None:
            return entry.compression in DECOMPRESSORS
        return not check_sizes or len(self._files[name].data) == segment_size

    def list_names(
        self, segment_size: int | None = None, *, check_sizes: bool = True
    ) -> tuple[str, ...]:
        """The names, sorted, without ``.*`` and ``*.tmp``; with ``segment_size``
        only those a recovery can use (no ``.lz4``/``.zst`` segment; with
        ``check_sizes`` no plain segment of another size)."""
        self._check()
        names = sorted(n for n in self._files if not n.startswith(".") and not n.endswith(".tmp"))
        if segment_size is not None:
            names = [n for n in names if self._usable(n, segment_size, check_sizes)]
        return tuple(names)

    def exists(self, name: str) -> bool:
        """Whether ``name`` or a compressed copy of it (``name.gz``...) is stored."""
        check_file_name(name)
        self._check()
        return any(
            n in self._files for n in (name, *(f"{name}.{ext}" for ext in COMPRESSION_SUFFIXES))
        )

    def stat(self, name: str) -> ArchivedFile | None:
        """The file stored as exactly ``name`` (``content_size``: its size, or a gzip
        file's ISIZE trailer), None when there is none."""
        check_file_name(name)
        self._check()
        stored = self._files.get(name)
        if stored is None:
            return None
        compression = parse_archive_name(name).compression
        content: int | None = None
        if compression is None:
            content = len(stored.data)
        elif compression == "gz" and len(stored.data) >= 4:
            content = int.from_bytes(stored.data[-4:], "little")
        return ArchivedFile(
            name, len(stored.data), stored.mtime_ns, f"{self.location}/{name}", content
        )

    def _content(self, name: str) -> bytes:
        check_file_name(name)
        self._check()
        stored = self._files.get(name)
        if stored is None:
            raise ArchiveError(
                f"{name} is not in the WAL archive {self.location}",
                hint="list the archive to see which files it holds",
                path=self.location,
                name=name,
            )
        return decompress_content(
            name,
            stored.data,
            self.location,
            hint="store it uncompressed or gzip-, bzip2- or xz-compressed",
        )

    def open(self, name: str) -> ReadStream:
        """The decompressed content of ``name``, as an in-memory stream.
        ``ArchiveError`` when it is missing, damaged, or ``.lz4``/``.zst``."""
        return io.BytesIO(self._content(name))

    def read_text(self, name: str) -> str:
        """The text of a ``.history`` or ``.backup`` file (decompressed; bytes that are
        not UTF-8 replaced by U+FFFD); ``ArchiveError`` when missing or over 1 MiB."""
        data = self._content(name)
        if len(data) > MAX_TEXT_FILE_SIZE:
            raise ArchiveError(
                f"{name} in {self.location} is larger than {MAX_TEXT_FILE_SIZE} bytes",
                hint="read_text is for .history and .backup files, not WAL segments",
                path=self.location,
                name=name,
            )
        return data.decode("utf-8", errors="replace")

    def index(self, segment_size: int, *, check_sizes: bool = True) -> ArchiveIndex:
        """The :class:`~pgsnap.wal.ArchiveIndex` of the files; those a recovery cannot
        use are among its ``unknown_names``."""
        every = self.list_names()
        usable = set(self.list_names(segment_size, check_sizes=check_sizes))
        index = ArchiveIndex.build([n for n in every if n in usable], segment_size)
        rejected = [n for n in every if n not in usable]
        if rejected:
            index = attrs.evolve(index, unknown_names=(*index.unknown_names, *rejected))
        return index

    def histories(self, names: Sequence[str] | None = None) -> TimelineGraph:
        """The timeline graph of the ``.history`` files among ``names`` (None: every one)."""
        return TimelineGraph.from_histories(read_histories(self, names))

    def restore_command(self) -> str:
        """A ``restore_command`` copying from a copy of the archive as it is now (see
        the class docstring)."""
        self._check()
        if self._spool is None:
            self._spool = tempfile.mkdtemp(prefix="pgsnap-memory-wal-")
        for entry in os.scandir(self._spool):
            os.unlink(entry.path)
        written: set[str] = set()
        # Plain files first: a plain copy wins over a compressed one.
        for name in sorted(self._files, key=lambda n: (_compressed(n), n)):
            compression = parse_archive_name(name).compression
            plain = name
            if compression is not None:
                if compression not in DECOMPRESSORS or not name.endswith(f".{compression}"):
                    continue
                plain = name[: -len(compression) - 1]
            if plain in written:
                continue
            try:
                data = self._content(name)
            except ArchiveError as exc:
                log.warning("%s left out of the restore copy: %s", name, exc)
                continue
            with open(os.path.join(self._spool, plain), "wb") as f:
                f.write(data)
            written.add(plain)
        return DirectoryWalArchive(self._spool).restore_command()

    # -- deleting -----------------------------------------------------------------------

    def delete(self, names: Sequence[str]) -> int:
        """Remove these files and their compressed copies; returns how many were removed."""
        self._check()
        removed = 0
        for name in names:
            check_file_name(name)
            for candidate in (name, *(f"{name}.{ext}" for ext in COMPRESSION_SUFFIXES)):
                if self._files.pop(candidate, None) is not None:
                    removed += 1
        return removed

    # -- life ---------------------------------------------------------------------------

    def close(self) -> None:
        """Remove the directory :meth:`restore_command` copies from (idempotent)."""
        if self._spool is not None:
            shutil.rmtree(self._spool, ignore_errors=True)
            self._spool = None

    def __enter__(self) -> MemoryWalArchive:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _compressed(name: str) -> bool:
    return parse_archive_name(name).compression is not None
