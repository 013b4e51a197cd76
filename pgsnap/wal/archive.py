"""A WAL archive that is a directory (the I/O side of :mod:`pgsnap.wal`).

:class:`DirectoryWalArchive` lists and reads the files that ``archive_command``
(e.g. ``cp %p /archive/%f``) puts in a directory, builds the
:class:`~pgsnap.wal.ArchiveIndex` and :class:`~pgsnap.wal.TimelineGraph` from
them, and writes the matching ``restore_command``. It reads, and deletes only
what retention tells it to.

The functions below work on any archive through its protocol methods alone:
:func:`read_histories` and :func:`archived_segment_size`.
"""

from __future__ import annotations

import bisect
import bz2
import gzip
import logging
import lzma
import os
import shlex
import zlib
from collections.abc import Sequence
from typing import Final, Protocol

import attrs

from pgsnap.errors import ArchiveError, HistoryFileError
from pgsnap.wal.continuity import ArchiveIndex
from pgsnap.wal.files import ArchivedFile, ReadStream, WalFiles, check_file_name
from pgsnap.wal.names import (
    COMPRESSION_SUFFIXES,
    VALID_SEGMENT_SIZES,
    WalFileKind,
    parse_archive_name,
)
from pgsnap.wal.timelines import TimelineGraph, TimelineHistory, parse_history

__all__ = [
    "DECOMPRESSORS",
    "DirectoryWalArchive",
    "archived_segment_size",
    "decompress_content",
    "read_histories",
]

logger = logging.getLogger(__name__)

_SEGMENT_NAME_LEN: Final = 24

MAX_TEXT_FILE_SIZE: Final = 1024 * 1024
"""Largest ``.history``/``.backup`` file :meth:`DirectoryWalArchive.read_text` reads (1 MiB)."""

DECOMPRESSORS: Final = {
    "gz": gzip.decompress,
    "bz2": bz2.decompress,
    "xz": lzma.decompress,
}
"""The compressions an archive's small files and stored segments are read in with the
standard library alone (lz4 and zstd need a module or a program)."""


def decompress_content(name: str, data: bytes, where: str, *, hint: str) -> bytes:
    """``data``, the stored content of ``name`` in the archive ``where``, decompressed
    as its name says (as it is without a compression suffix). ``ArchiveError`` for a
    codec the standard library lacks (``hint`` says what to do) or damaged data."""
    comp = parse_archive_name(name).compression
    if comp is None:
        return data
    decompress = DECOMPRESSORS.get(comp)
    if decompress is None:
        raise ArchiveError(
            f"cannot decompress {name}: {comp} needs a library pgsnap does not use",
            hint=hint,
            path=where,
            name=name,
            compression=comp,
        )
    try:
        return decompress(data)
    except (OSError, EOFError, ValueError, lzma.LZMAError, zlib.error) as exc:
        raise ArchiveError(
            f"{name} in {where} is not valid {comp} data: {exc}",
            hint="the file is damaged; restore it from another copy",
            path=where,
            name=name,
            reason=str(exc),
        ) from exc


def _is_hex(name: str) -> bool:
    try:
        bytes.fromhex(name)
    except ValueError:
        return False
    return True


class DirectoryWalArchive:
    """A WAL archive in a local (or mounted) directory.

    ``list_names`` returns the regular files (symlinks to files count), sorted,
    leaving out names that start with ``.`` and names that end in ``.tmp``:
    both are how copy tools and archive scripts write a file before renaming it
    into place, so they are not (yet) archive content. Files that vanish while
    the directory is read are skipped.
    """

    __slots__ = ("_files", "_gzip", "_path")

    def __init__(self, path: str | os.PathLike[str], *, gzip: bool = False) -> None:
        """Use the directory at ``path`` (made absolute; it is checked when used).

        ``gzip``: the archive may hold gzip-compressed segments (``%f.gz``), and
        the ``restore_command`` pgsnap writes decompresses them; without it,
        compressed segments are not counted as WAL a recovery can fetch.
        """
        self._path = os.path.abspath(os.fspath(path))
        self._gzip = gzip
        self._files: WalFiles | None = None  # the WAL reader's, made on first use

    def _directory(self) -> WalFiles:
        if self._files is None:
            from pgsnap.wal.reader import WalDirectory  # noqa: PLC0415 - the reader on use

            self._files = WalDirectory(self._path)
        return self._files

    @property
    def path(self) -> str:
        """The absolute path of the archive directory."""
        return self._path

    @property
    def location(self) -> str:
        """Where the archive is, for messages (the absolute path)."""
        return self._path

    @property
    def gzip(self) -> bool:
        """Whether gzip-compressed segments (``%f.gz``) count as WAL a recovery fetches."""
        return self._gzip

    def __repr__(self) -> str:
        return f"DirectoryWalArchive({self._path!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DirectoryWalArchive):
            return NotImplemented
        return self._path == other._path

    def __hash__(self) -> int:
        return hash(self._path)

    # -- listing ----------------------------------------------------------------------

    def list_names(
        self, segment_size: int | None = None, *, check_sizes: bool = True
    ) -> tuple[str, ...]:
        """The names of the archive's files, sorted (see the class docstring).

        With ``segment_size``, only files a recovery can use as WAL: a
        compressed segment the ``restore_command`` cannot fetch is left out,
        and (``check_sizes``) so is a segment file of another size (a truncated
        copy, a stray file named like a segment; see :meth:`unusable`). Without
        ``check_sizes`` no file is stat'ed: a listing of a million segments
        costs the directory read alone.
        """
        return tuple(n for n, _why in self._scan(segment_size, check_sizes) if _why is None)

    def unusable(self, segment_size: int) -> tuple[tuple[str, str], ...]:
        """``(name, why)`` of the files named like WAL that a recovery cannot use."""
        return tuple((n, why) for n, why in self._scan(segment_size) if why is not None)

    def _scan(
        self, segment_size: int | None, check_sizes: bool = True, *, ordered: bool = True
    ) -> list[tuple[str, str | None]]:
        """Every file name (sorted when ``ordered``), with why it cannot be used as WAL
        (None: it can)."""
        if segment_size is not None and not check_sizes:
            return self._scan_names(segment_size, ordered)
        found: list[tuple[str, str | None]] = []
        try:
            with os.scandir(self._path) as it:
                for entry in it:
                    name = entry.name
                    if name.startswith(".") or name.endswith(".tmp"):
                        continue
                    try:
                        if not entry.is_file():
                            continue
                        why = None
                        if segment_size is not None:
                            why = self._unusable_because(name, entry, segment_size, check_sizes)
                    except OSError:  # vanished (or unreadable) while listing
                        logger.debug("skipping %s: it vanished while listing", name)
                        continue
                    found.append((name, why))
        except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
            raise self._listing_error(exc) from None
        except OSError as exc:
            raise self._listing_error(exc) from exc
        if ordered:
            found.sort()
        return found

    def _scan_names(self, segment_size: int, ordered: bool) -> list[tuple[str, str | None]]:
        """:meth:`_scan` by names alone (see :meth:`_names_only`)."""
        usable, rejected = self._names_only(segment_size)
        found: list[tuple[str, str | None]] = [(n, None) for n in usable]
        found += rejected
        if ordered:
            found.sort()
        return found

    def _names_only(self, segment_size: int) -> tuple[list[str], list[tuple[str, str]]]:
        """The usable names and the rejected ones (with why), unsorted, by names alone:
        the directory is read, and nothing is stat'ed but the few names that are not
        segment names (are they files?)."""
        plain, other, rejected = self._split_names(segment_size)
        plain += other
        return plain, rejected

    def _split_names(self, segment_size: int) -> tuple[list[str], list[str], list[tuple[str, str]]]:
        """:meth:`_names_only` with the usable names split: those of 24 characters,
        and the others."""
        try:
            names = os.listdir(self._path)
        except (FileNotFoundError, NotADirectoryError, PermissionError) as exc:
            raise self._listing_error(exc) from None
        except OSError as exc:
            raise self._listing_error(exc) from exc
        # A million names are split without a Python step per name: segment names
        # (24 characters; not hex: the index classifies them) go as they are.
        names.sort(key=len)  # C speed, stable: the segment names end up in one slice
        first = bisect.bisect_left(names, _SEGMENT_NAME_LEN, key=len)
        end = bisect.bisect_right(names, _SEGMENT_NAME_LEN, key=len)
        usable = names[first:end]
        others = names[:first] + names[end:]
        del names  # a million-entry list: not kept through the classification
        if usable and min(usable) < "0":  # "." sorts before every hex digit
            usable = [n for n in usable if not n.startswith(".")]
        rejected: list[tuple[str, str]] = []
        other: list[str] = []
        keep = other.append
        for name in others:
            if name.startswith(".") or name.endswith(".tmp"):
                continue
            # One .backup file per backup: thousands, never read here, so not
            # stat'ed; the other few names are (is it a file?).
            if not name.endswith(".backup") and not os.path.isfile(os.path.join(self._path, name)):
                continue
            why = self._unusable_because(name, None, segment_size, False)
            if why is None:
                keep(name)
            else:
                rejected.append((name, why))
        return usable, other, rejected

    def _listing_error(self, exc: OSError) -> ArchiveError:
        if isinstance(exc, FileNotFoundError):
            return ArchiveError(
                f"the WAL archive directory {self._path} does not exist",
                hint="check the archive path (the directory archive_command copies into) and "
                "that its file system is mounted",
                path=self._path,
            )
        if isinstance(exc, NotADirectoryError):
            return ArchiveError(
                f"the WAL archive path {self._path} is not a directory",
                hint="give the directory that archive_command copies WAL files into",
                path=self._path,
            )
        if isinstance(exc, PermissionError):
            return ArchiveError(
                f"permission denied reading the WAL archive directory {self._path}",
                hint="run as a user that can read the archive (e.g. postgres) or fix its "
                "permissions",
                path=self._path,
            )
        return ArchiveError(
            f"cannot list the WAL archive directory {self._path}: {exc.strerror or exc}",
            hint="check that the archive's file system is mounted and healthy",
            path=self._path,
        )

    def _unusable_because(
        self,
        name: str,
        entry: os.DirEntry[str] | None,
        segment_size: int,
        check_sizes: bool,
    ) -> str | None:
        if len(name) == _SEGMENT_NAME_LEN:
            if not check_sizes or entry is None or not _is_hex(name):
                return None  # (not a segment name: the index classifies it)
            size = entry.stat().st_size
            if size != segment_size:
                return f"{size} bytes, not a {segment_size}-byte WAL segment"
            return None
        if "." not in name or name.endswith(".backup"):
            return None  # not a compressed segment (one .backup per backup: thousands)
        comp = parse_archive_name(name).compression
        if comp is None or parse_archive_name(name).kind is not WalFileKind.SEGMENT:
            return None
        if comp == "gz" and self._gzip:
            return None
        return f"{comp}-compressed, and the restore_command pgsnap writes " + (
            "does not decompress it"
            if comp != "gz"
            else "decompresses only with gzip=True ([archive] gzip = true)"
        )

    def _file(self, name: str) -> str:
        return os.path.join(self._path, check_file_name(name))

    def exists(self, name: str) -> bool:
        """Whether the archive holds ``name`` as a regular file, or a compressed copy
        of it (``name.gz``, ``.bz2``, ``.xz``, ``.lz4``, ``.zst``)."""
        path = self._file(name)
        return os.path.isfile(path) or any(
            os.path.isfile(f"{path}.{ext}") for ext in COMPRESSION_SUFFIXES
        )

    def stat(self, name: str) -> ArchivedFile | None:
        """The regular file stored as exactly ``name`` (``location``: its path;
        ``content_size``: its size, or a gzip file's ISIZE trailer); None when there
        is none, or no archive directory. ``ArchiveError`` when that cannot be told
        (permission denied, I/O error); ``WalNameError`` for a name with ``/``."""
        return self._directory().stat(name)

    # -- reading ----------------------------------------------------------------------

    def open(self, name: str) -> ReadStream:
        """The decompressed content of the file stored as exactly ``name``, streamed
        (``.gz``, ``.bz2``, ``.xz`` with the standard library; ``.lz4``, ``.zst``
        with the ``lz4``/``zstandard`` module or the ``lz4``/``zstd`` program).
        ``ArchiveError`` when it is missing (with a hint), cannot be opened or has
        no decompressor here; reading it raises ``ArchiveError`` for damaged data."""
        return self._directory().open(name)

    def read_bytes(self, name: str, *, max_size: int = MAX_TEXT_FILE_SIZE) -> bytes:
        """The content of a small file, decompressed if its name ends in ``.gz``,
        ``.bz2`` or ``.xz``. ``ArchiveError`` if it is missing, unreadable, larger
        than ``max_size`` or compressed with lz4/zstd (no standard-library codec)."""
        path = self._file(name)
        try:
            with open(path, "rb") as f:
                data = f.read(max_size + 1)
        except FileNotFoundError:
            raise ArchiveError(
                f"{name} is not in the WAL archive {self._path}",
                hint="list the archive to see which files it holds",
                path=self._path,
                name=name,
            ) from None
        except IsADirectoryError:
            raise ArchiveError(
                f"{name} in the WAL archive {self._path} is a directory, not a file",
                hint="pass the name of a .history or .backup file",
                path=self._path,
                name=name,
            ) from None
        except OSError as exc:
            raise ArchiveError(
                f"cannot read {name} from the WAL archive {self._path}: {exc.strerror or exc}",
                hint="check the file's permissions and the archive's file system",
                path=self._path,
                name=name,
            ) from exc
        if len(data) > max_size:
            raise ArchiveError(
                f"{name} in {self._path} is larger than {max_size} bytes",
                hint="read_text is for .history and .backup files, not WAL segments",
                path=self._path,
                name=name,
            )
        out = decompress_content(
            name,
            data,
            self._path,
            hint="store .history and .backup files uncompressed or gzip-compressed",
        )
        if len(out) > max_size:
            raise ArchiveError(
                f"{name} in {self._path} decompresses to more than {max_size} bytes",
                hint="read_text is for .history and .backup files, not WAL segments",
                path=self._path,
                name=name,
            )
        return out

    def delete(self, names: Sequence[str]) -> int:
        """Remove these files (and their compressed copies) from the archive; names
        not there are skipped. Returns how many files were removed. Used by
        retention (``archive.delete_wal``), which plans what may go."""
        removed = 0
        for name in names:
            path = self._file(name)
            for candidate in (path, *(f"{path}.{ext}" for ext in COMPRESSION_SUFFIXES)):
                try:
                    os.unlink(candidate)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise ArchiveError(
                        f"cannot remove {candidate} from the WAL archive: {exc.strerror}",
                        hint="check the archive directory's permissions",
                        path=candidate,
                    ) from exc
                removed += 1
        return removed

    def read_text(self, name: str) -> str:
        """The text of a ``.history`` or ``.backup`` file (decompressed as in
        :meth:`read_bytes`). Bytes that are not UTF-8 (a label or restore point
        name in another server encoding) are replaced by U+FFFD."""
        return self.read_bytes(name).decode("utf-8", errors="replace")

    # -- derived facts ----------------------------------------------------------------

    def index(self, segment_size: int, *, check_sizes: bool = True) -> ArchiveIndex:
        """Classify the archive's files (see :meth:`ArchiveIndex.build`).

        Files a recovery cannot use as WAL (:meth:`unusable`) are not segments
        of the index: they are among its ``unknown_names``.
        """
        if check_sizes:
            scanned = self._scan(segment_size, check_sizes, ordered=False)
            usable = [n for n, why in scanned if why is None]
            rejected = tuple(n for n, why in scanned if why is not None)
            index = ArchiveIndex.build(usable, segment_size)
        else:
            plain, other, bad = self._split_names(segment_size)
            rejected = tuple(n for n, _why in bad)
            index = ArchiveIndex.from_split(plain, other, segment_size)
        if rejected:
            index = attrs.evolve(index, unknown_names=(*index.unknown_names, *rejected))
        return index

    def read_histories(self, names: tuple[str, ...] | None = None) -> tuple[TimelineHistory, ...]:
        """Parse every ``.history`` file (or those in ``names``), one per timeline
        (:func:`read_histories`)."""
        return read_histories(self, names)

    def histories(self, names: Sequence[str] | None = None) -> TimelineGraph:
        """The timeline graph of the ``.history`` files among ``names`` (None: every
        one in the archive, which is then listed)."""
        return TimelineGraph.from_histories(
            self.read_histories(None if names is None else tuple(names))
        )

    # -- recovery ---------------------------------------------------------------------

    def restore_command(self, *, gzip: bool | None = None) -> str:
        """A ``restore_command`` that copies files from this directory.

        ``test -f '<dir>/%f' && cp '<dir>/%f' '%p'``: it exits non-zero when a
        file is missing, as PostgreSQL requires. The directory is shell-quoted
        and ``%`` in it doubled (PostgreSQL substitutes ``%f``, ``%p``, ``%r``
        and ``%%``). With ``gzip=True`` a missing file is also looked for as
        ``%f.gz`` and decompressed with ``gzip -dc``.
        """
        if "\n" in self._path or "\r" in self._path:
            raise ArchiveError(
                f"the archive path {self._path!r} contains a line break, which cannot be "
                "written into restore_command",
                hint="move or link the archive to a path without line breaks",
                path=self._path,
            )
        d = shlex.quote(self._path).replace("%", "%%")
        plain = f"test -f {d}/'%f' && cp {d}/'%f' '%p'"
        if not (self._gzip if gzip is None else gzip):
            return plain
        return (
            f"if test -f {d}/'%f'; then cp {d}/'%f' '%p'; "
            f"elif test -f {d}/'%f.gz'; then gzip -dc {d}/'%f.gz' > '%p'; "
            "else exit 1; fi"
        )


class _TextArchive(Protocol):
    """What :func:`read_histories` needs of an archive."""

    @property
    def location(self) -> str: ...

    def list_names(self) -> tuple[str, ...]: ...

    def read_text(self, name: str) -> str: ...


def read_histories(
    archive: _TextArchive, names: Sequence[str] | None = None
) -> tuple[TimelineHistory, ...]:
    """Parse every ``.history`` file of ``archive`` (or those among ``names``), one per
    timeline, through its ``list_names`` and ``read_text``.

    When a timeline's history is stored both plain and compressed, the plain
    file is read. A malformed file raises :class:`HistoryFileError` naming it
    (and the archive's ``location``); what ``read_text`` raises passes through.
    """
    chosen: dict[int, str] = {}
    for name in archive.list_names() if names is None else names:
        if ".history" not in name:
            continue  # most names are segments: no parsing for them
        entry = parse_archive_name(name)
        if entry.kind is not WalFileKind.HISTORY or entry.timeline is None:
            continue
        current = chosen.get(entry.timeline)
        if current is None or (
            parse_archive_name(current).compression is not None and entry.compression is None
        ):
            chosen[entry.timeline] = name
    out: list[TimelineHistory] = []
    for tli, name in sorted(chosen.items()):
        text = archive.read_text(name)
        try:
            out.append(parse_history(text, tli))
        except HistoryFileError as exc:
            raise HistoryFileError(
                f"{name} in {archive.location}: {exc.message}",
                hint=exc.hint,
                **{**exc.details, "name": name, "path": archive.location},
            ) from exc
    return tuple(out)


def archived_segment_size(files: WalFiles) -> int | None:
    """The segment size of the archive's WAL as its files tell it: the size of the
    first plain segment file (by name) that has a valid segment size; None when
    there is none. One listing, and a ``stat`` per plain segment until one fits;
    ``ArchiveError`` when the archive cannot be listed (a file that cannot be
    stat'ed is passed over)."""
    for name in files.list_names():
        entry = parse_archive_name(name)
        if entry.kind is not WalFileKind.SEGMENT or entry.compression is not None:
            continue
        try:
            found = files.stat(name)
        except ArchiveError as exc:
            logger.debug("segment size: %s not stat'ed: %s", name, exc)
            continue
        if found is not None and found.size in VALID_SEGMENT_SIZES:
            return found.size
    return None
