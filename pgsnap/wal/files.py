"""The files of a WAL archive as its readers see them: named, stat'ed, opened.

An archive is asked for its files through :class:`WalFiles`, the part of the
:class:`~pgsnap.protocols.WalArchive` protocol the WAL reader
(:mod:`pgsnap.wal.reader`), the contents index (:mod:`pgsnap.wal.contents`)
and the observer use: :meth:`~WalFiles.list_names`, :meth:`~WalFiles.stat`
(an :class:`ArchivedFile`) and :meth:`~WalFiles.open` (a :class:`ReadStream`
of the decompressed content). Nothing here knows where the files are: a
directory (:class:`~pgsnap.wal.archive.DirectoryWalArchive`, a surviving
``pg_wal`` as :class:`~pgsnap.wal.reader.WalDirectory`), a dictionary
(:class:`pgsnap.testing.memory_wal.MemoryWalArchive`) or an object store are
read the same way. ``location`` is for messages only: no caller builds a path
from it.
"""

from __future__ import annotations

import os
from typing import Protocol

from pgsnap._attrs import frozen
from pgsnap.errors import WalNameError
from pgsnap.wal.names import parse_archive_name

__all__ = ["ArchivedFile", "ReadStream", "WalFiles", "check_file_name"]


@frozen
class ArchivedFile:
    """One file as an archive stores it (what :meth:`WalFiles.stat` returns).

    ``name`` is the name it is stored under, compression suffix included
    (``000000010000000000000003.gz``); ``size`` its stored (compressed) size in
    bytes; ``mtime_ns`` when it was last written, in nanoseconds since the
    epoch: with ``size`` it tells a changed file from the one seen before
    (caches of verified and indexed segments are keyed by them). ``location``
    says where it is, for messages (a path or a URL, never a secret).
    ``content_size`` is the size of its decompressed content when the
    archive knows it without decompressing: ``size`` for a plain file, the
    ISIZE trailer of a gzip file (modulo 2**32); None when not known.
    """

    name: str
    size: int
    mtime_ns: int
    location: str
    content_size: int | None = None

    @property
    def compression(self) -> str | None:
        """The compression its name says (``"gz"``, ``"zst"``...), None for a plain file."""
        return parse_archive_name(self.name).compression

    @property
    def identity(self) -> tuple[int, int]:
        """``(size, mtime_ns)``: what tells this version of the file from another."""
        return (self.size, self.mtime_ns)


class ReadStream(Protocol):
    """The decompressed content of an archived file, read front to back.

    ``read(n)`` returns up to ``n`` bytes (fewer only at the end; ``-1``: all
    that is left) and raises :class:`~pgsnap.errors.ArchiveError` when the
    content turns out damaged or cannot be fetched; ``close()`` releases it
    (idempotent). Any binary file object fits.
    """

    def read(self, size: int = -1, /) -> bytes:
        """Up to ``size`` bytes of the content (all that is left for ``-1``)."""
        ...

    def close(self) -> None:
        """Release the stream."""
        ...


class WalFiles(Protocol):
    """Where WAL files can be listed, stat'ed and read: what the WAL reader reads.

    Every :class:`~pgsnap.protocols.WalArchive` is one; so is a plain
    directory of segment files (:class:`~pgsnap.wal.reader.WalDirectory`).
    """

    @property
    def location(self) -> str:
        """Where the files are, for messages (a path or URL, never a secret)."""
        ...

    def list_names(self) -> tuple[str, ...]:
        """The names of the files, sorted; ``ArchiveError`` if they cannot be listed."""
        ...

    def stat(self, name: str) -> ArchivedFile | None:
        """The file stored under exactly ``name``; None when there is none."""
        ...

    def open(self, name: str) -> ReadStream:
        """The decompressed content of the file stored under exactly ``name``."""
        ...


def check_file_name(name: str) -> str:
    """``name`` if it is a plain file name (no directory part, not ``.``/``..``),
    else :class:`~pgsnap.errors.WalNameError`: what every archive checks before it
    looks a name up, so that no name reaches outside the archive."""
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or "/" in name
        or "\0" in name
        or (os.sep != "/" and os.sep in name)
    ):
        raise WalNameError(
            f"{name!r} is not a plain file name",
            hint="pass a file name found in the archive, e.g. 00000002.history",
            name=name,
        )
    return name
