"""The WAL archive of a pgBackRest repository, read only.

pgBackRest's ``archive-push`` (an ``archive_command``) keeps WAL in its repository
(a directory, ``repo1-type=posix``, or an S3 bucket whose key prefix is
``repo1-path`` without its leading ``/``: ``storageS3*``, ``src/storage/s3/storage.c``).
:class:`PgBackRestArchive` is the
:class:`~pgsnap.protocols.WalArchive` over that repository, so ``check``,
``pgsnap wal``, the recovery planner, the WAL reader and its index read it as
they read a directory; recoveries fetch with pgBackRest's own ``archive-get``.
pgsnap never writes into the repository: it is not a
:class:`~pgsnap.protocols.WalArchiveDeletion` (pgBackRest's ``expire`` keeps it).

What is read (pgBackRest 2.45, ``release/2.45`` of its source; each fact says
where it was checked)::

    archive/<stanza>/archive.info             (and archive.info.copy)
    archive/<stanza>/<version>-<db id>/<NNNNNNNN>.history
    archive/<stanza>/<version>-<db id>/<first 16 hex of the name>/
        <segment>-<sha1 of the content>[.gz|.bz2|.lz4|.zst]
        <segment>.partial-<sha1 of the content>[.gz|.bz2|.lz4|.zst]
        <segment>.<offset>.backup

- Segments (``^[0-F]{24}(\\.partial)?$``, ``WAL_SEGMENT_PARTIAL_REGEXP``,
  ``src/command/archive/common.h``) are stored with ``-<sha1>`` appended, the
  SHA-1 of the uncompressed file, and compressed by ``compress-type`` (default
  ``gz``; ``none``, ``bz2``, ``lz4``, ``zst``: ``src/build/config/config.yaml``)
  with its extension; ``.history`` and ``.backup`` files are stored as they are,
  never compressed (``archivePushFile``, ``src/command/archive/push/file.c``).
  A name that starts with 24 hex digits goes into the directory of its first 16,
  any other into the archive id's directory (``storageRepoPathExpression``,
  ``src/storage/helper.c``). The extensions a name may end in are
  ``COMPRESS_TYPE_REGEXP`` (``src/common/compress/helper.h``; ``xz`` is in it
  but pgBackRest cannot write or read it). gzip is a gzip stream
  (``deflateInit2`` with the gzip header, ``src/common/compress/gz/compress.c``:
  its ISIZE trailer gives the content's size); lz4 is an lz4 frame without a
  content size (``LZ4F_compressBegin`` with the compression level and a content
  checksum only, ``lz4/compress.c``); zstd a stream without one
  (``ZSTD_initCStream``/``ZSTD_compressStream``, ``zst/compress.c``).
- Files are written to ``<name>.pgbackrest.tmp`` and renamed
  (``STORAGE_FILE_TEMP_EXT``, ``src/storage/write.intern.h``): such names, like
  every name not above, are not listed.
- ``archive.info`` is pgBackRest's INI (each value JSON, ``src/common/ini.c``)
  with a SHA-1 of its content in ``[backrest] backrest-checksum``
  (``infoNewLoad``, ``src/info/info.c``), format 5 (``REPOSITORY_FORMAT``,
  ``src/version.h``); ``archive.info.copy`` is read when ``archive.info``
  cannot be (``infoArchiveLoadFileCallback``, ``src/info/infoArchive.c``).
  ``[db] db-id`` is the current history id; each ``[db:history]`` line is
  ``<id>={"db-id":<system identifier>,"db-version":"<version>"}`` (in
  archive.info the system identifier is under ``db-id``: ``infoPgLoadCallback``,
  ``src/info/infoPg.c``), and the archive id is ``<version>-<id>``
  (``infoPgArchiveId``).
- An encrypted repository (``repo1-cipher-type=aes-256-cbc``) has every file,
  archive.info included, encrypted in OpenSSL's format, beginning with
  ``Salted__`` (``CIPHER_BLOCK_MAGIC``, ``src/common/crypto/cipherBlock.c``):
  pgsnap does not hold the passphrase and refuses it, saying so.

Which archive ids are read: ``archive-get`` reads, newest first, every archive id
whose version and system identifier are those of the cluster it restores into
(its ``pg_control``; ``archiveGetCheck``, ``src/command/archive/get/get.c``).
pgsnap backs up and recovers the cluster the repository archives now, so it reads
the archive ids of the current history entry's version and system identifier
(after a ``stanza-upgrade``, ``15-2`` and not ``12-1``), newest first: what
``archive-get`` reads for that cluster. The WAL of another cluster (before a
``pg_upgrade``) holds segments of the same names that are not this cluster's:
never merged. ``archive_id=`` names another archive id, whose cluster's ids are
then read.

A segment stored twice with two different SHA-1s (two clusters archiving into one
stanza) is refused by ``archive-get`` ("duplicates found", ``archiveGetFind``):
so here it is listed, but is not WAL a recovery can use (``list_names`` with a
segment size leaves it out, ``index`` puts it among the unknown names), and
``stat`` and ``open`` raise :class:`~pgsnap.errors.ArchiveError` naming both
copies. Copies with the same SHA-1 (in two archive ids) are one file: the newest
archive id's is read.

The content's size (``stat``): a plain object's size; a gzip object's ISIZE
trailer (one ranged read); for lz4, zstd and bzip2, which do not record it, the
segment size its first page's long header states (the beginning of the object is
read and decompressed): pgBackRest stores what PostgreSQL hands its
``archive_command``, whole segments (a ``.partial`` one is named so). That size
is ``size`` and ``content_size`` is None (not known); a truncated copy is found
when it is read whole: the WAL reader sees it end early, and the SHA-1 in its
name does not match.
"""

from __future__ import annotations

import bz2
import concurrent.futures
import contextlib
import gzip
import hashlib
import importlib
import io
import json
import logging
import lzma
import re
import shlex
import shutil
import struct
import subprocess
import threading
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any, Final, cast

import attrs

from pgsnap._attrs import frozen
from pgsnap.archives.config import fatal_unless_missing
from pgsnap.archives.store import etag_version
from pgsnap.errors import (
    ArchiveError,
    ArchiveRefused,
    ArchiveUnavailable,
    ConfigurationError,
    DamagedSegmentError,
)
from pgsnap.stores import DirectoryStore, ObjectStore, StoredObject
from pgsnap.wal.archive import read_histories
from pgsnap.wal.continuity import ArchiveIndex
from pgsnap.wal.files import ArchivedFile, ReadStream, check_file_name
from pgsnap.wal.names import VALID_SEGMENT_SIZES
from pgsnap.wal.timelines import TimelineGraph

if TYPE_CHECKING:
    from pgsnap.archives.config import ArchiveSettings

__all__ = [
    "ARCHIVE_INFO",
    "COMPRESSIONS",
    "PG1_PATH_HERE",
    "REPOSITORY_FORMAT",
    "ArchiveInfo",
    "ArchiveInfoEntry",
    "PgBackRestArchive",
    "StoredName",
    "archive_get_command",
    "info_checksum",
    "open_archive",
    "parse_archive_info",
    "parse_stored_name",
]

log = logging.getLogger(__name__)

ARCHIVE_INFO: Final = "archive.info"
"""The archive's info file, in ``archive/<stanza>/`` (``INFO_ARCHIVE_FILE``)."""
REPOSITORY_FORMAT: Final = 5
"""The repository format pgBackRest 2.x writes (``REPOSITORY_FORMAT``, ``src/version.h``)."""
COMPRESSIONS: Final = ("gz", "bz2", "lz4", "zst", "xz")
"""The extensions a stored segment may have (``COMPRESS_TYPE_REGEXP``); pgBackRest
2.45 writes and reads all but ``xz``."""
_RESTORABLE: Final = frozenset({None, "gz", "bz2", "lz4", "zst"})
"""What ``archive-get`` decompresses (``compressHelperLocal``: xz is a placeholder)."""
_ENCRYPTED_MAGIC: Final = b"Salted__"
_MAX_TEXT: Final = 1024 * 1024
_FIRST_CHUNK: Final = 256 * 1024
"""The first ranged read of an object: its header's worth (and a small object whole)."""
_CHUNK: Final = 8 * 1024 * 1024
"""Later ranged reads: the rest of a compressed segment, most often in one."""
_SIZE_READS: Final = 16
"""Segments whose size a listing reads at a time (a ranged read each) when it checks
sizes."""
_PREFERENCE: Final = {None: 0, "gz": 1, "zst": 2, "lz4": 3, "bz2": 4, "xz": 5}
_LONG_HEADER: Final = 40
_XLP_LONG_HEADER: Final = 0x0002

_STORED_SEGMENT: Final = re.compile(
    r"(?P<name>[0-9A-F]{24}(?:\.partial)?)-(?P<sha1>[0-9a-f]{40})"
    r"(?:\.(?P<ext>gz|lz4|zst|xz|bz2))?"
)
"""``WAL_SEGMENT_FILE_REGEXP`` with ``.partial`` (``archiveGetFind``); pgBackRest's
``[0-F]`` is read as the hex digits it means."""
_SEGMENT: Final = re.compile(r"[0-9A-F]{24}(?:\.partial)?")
"""``WAL_SEGMENT_PARTIAL_REGEXP``: what ``archive-push`` stores with its SHA-1."""
_HISTORY: Final = re.compile(r"[0-9A-F]{8}\.history")
_BACKUP: Final = re.compile(r"[0-9A-F]{24}\.[0-9A-F]{8}\.backup")
_DIRECTORY: Final = re.compile(r"[0-9A-F]{16}")
_ARCHIVE_ID: Final = re.compile(r"[0-9]+(?:\.[0-9]+)*-[0-9]+")
"""``REGEX_ARCHIVE_DIR_DB_VERSION`` (``src/info/infoArchive.h``)."""
_STANZA: Final = re.compile(r"[A-Za-z0-9_.-]+")


# =========================================================================== names


@frozen
class StoredName:
    """What the name of a file in an archive id's directory says: PostgreSQL's
    ``name`` for it, the SHA-1 of its content (segments only) and its compression
    (None: stored as it is)."""

    name: str
    sha1: str | None = None
    compression: str | None = None


def parse_stored_name(file_name: str, *, in_segment_directory: bool) -> StoredName | None:
    """PostgreSQL's name of the file pgBackRest stores as ``file_name`` (see the module
    docstring): ``<segment>-<sha1>[.ext]`` and ``<segment>.partial-<sha1>[.ext]`` and
    ``<segment>.<offset>.backup`` in a segment directory
    (``in_segment_directory``), ``<NNNNNNNN>.history`` beside them; None for
    anything else (a ``.pgbackrest.tmp`` file being written, a stray file)."""
    if in_segment_directory:
        m = _STORED_SEGMENT.fullmatch(file_name)
        if m is not None:
            return StoredName(m.group("name"), m.group("sha1"), m.group("ext"))
        if _BACKUP.fullmatch(file_name):
            return StoredName(file_name)
        return None
    if _HISTORY.fullmatch(file_name):
        return StoredName(file_name)
    return None


def _is_segment(name: str) -> bool:
    """A segment or ``.partial`` name, as pgBackRest stores them (``walIsSegment``)."""
    return _SEGMENT.fullmatch(name) is not None


def _key_of(archive_id: str, name: str) -> str:
    """The key below ``archive/<stanza>/`` of a file that is not a segment."""
    if len(name) > 24 and _DIRECTORY.fullmatch(name[:16]):
        return f"{archive_id}/{name[:16]}/{name}"
    return f"{archive_id}/{name}"


# =========================================================================== archive.info


@frozen
class ArchiveInfoEntry:
    """One ``[db:history]`` line: the cluster (``version``, ``system_identifier``)
    whose WAL archive id ``<version>-<db_id>`` holds."""

    db_id: int
    version: str
    system_identifier: int

    @property
    def archive_id(self) -> str:
        """``<version>-<db_id>``, the directory of its WAL (``infoPgArchiveId``)."""
        return f"{self.version}-{self.db_id}"


@frozen
class ArchiveInfo:
    """``archive.info``, parsed and its checksum checked (:func:`parse_archive_info`).
    ``history`` in the file's order, oldest first; ``current_id`` the ``[db]
    db-id``."""

    current_id: int
    history: tuple[ArchiveInfoEntry, ...]
    backrest_version: str = ""

    @property
    def current(self) -> ArchiveInfoEntry:
        """The current history entry (the cluster archiving now)."""
        for entry in self.history:
            if entry.db_id == self.current_id:
                return entry
        raise AssertionError("parse_archive_info checks the current id is in the history")

    def entry(self, archive_id: str) -> ArchiveInfoEntry | None:
        """The history entry of ``archive_id`` (``15-1``), or None."""
        return next((e for e in self.history if e.archive_id == archive_id), None)

    def archive_ids(self, of: ArchiveInfoEntry | None = None) -> tuple[str, ...]:
        """The archive ids of ``of``'s cluster (default: the current one), newest
        first: those whose version and system identifier are its, as
        ``archive-get`` reads them for that cluster."""
        which = of or self.current
        return tuple(
            e.archive_id
            for e in reversed(self.history)
            if e.version == which.version and e.system_identifier == which.system_identifier
        )


def info_checksum(values: Sequence[tuple[str, str, str]]) -> str:
    """The SHA-1 pgBackRest keeps in ``[backrest] backrest-checksum``, of ``values``
    (section, key, value as written, in the file's order, the checksum left out): the
    hash of ``{"section":{"key":value,...},...}`` as ``infoNewLoad`` builds it
    (``src/info/info.c``): the section name in quotes as it is, the key as a JSON
    string, the value as written (it is JSON)."""
    digest = hashlib.sha1(b"{", usedforsecurity=False)
    last: str | None = None
    for section, key, value in values:
        if section != last:
            if last is not None:
                digest.update(b"},")
            digest.update(f'"{section}":{{'.encode())
            last = section
        else:
            digest.update(b",")
        digest.update(json.dumps(key).encode() + b":" + value.encode())
    digest.update(b"}}")
    return digest.hexdigest()


def _ini_values(text: str, where: str) -> list[tuple[str, str, str]]:
    """The (section, key, value) of pgBackRest's strict INI (``iniValueNext`` with
    ``strict``: no trimming, each value JSON; a key holding ``=`` is found by trying
    the next ``=`` until the value parses)."""
    values: list[tuple[str, str, str]] = []
    section = ""
    for number, line in enumerate(text.split("\n"), start=1):
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        if not section or "=" not in line:
            raise _damaged_info(where, f"line {number} is neither a section nor key=value")
        at = line.index("=")
        while True:
            key, value = line[:at], line[at + 1 :]
            try:
                json.loads(value)
                break
            except ValueError:
                at = line.find("=", at + 1)
                if at < 0:
                    raise _damaged_info(where, f"line {number}'s value is not JSON") from None
        values.append((section, key, value))
    return values


def _damaged_info(where: str, why: str) -> ArchiveError:
    return ArchiveError(
        f"{where} is not a pgBackRest archive.info pgsnap can read: {why}",
        hint="run 'pgbackrest --stanza=<stanza> info' to see whether pgBackRest reads it; "
        "archive.info.copy is read when archive.info cannot be",
        path=where,
        reason=why,
    )


def _encrypted(where: str) -> ArchiveRefused:
    return ArchiveRefused(
        f"the pgBackRest repository of {where} is encrypted (repo1-cipher-type): pgsnap "
        "does not hold its passphrase and cannot read its WAL",
        hint="pgsnap reads unencrypted pgBackRest repositories only; archive a second "
        "copy for pgsnap (archive_command 'pgbackrest ... archive-push %p && pgsnap -c "
        "CONFIG wal-push %p', pgsnap's archive encrypted with key_file), or use a "
        "repository without repo1-cipher-type",
        path=where,
    )


def parse_archive_info(data: bytes, *, where: str = ARCHIVE_INFO) -> ArchiveInfo:
    """``archive.info`` from its bytes (see the module docstring), its checksum and
    format checked. :class:`~pgsnap.errors.ArchiveRefused` for an encrypted one,
    :class:`~pgsnap.errors.ArchiveError` for anything else it cannot be."""
    if data.startswith(_ENCRYPTED_MAGIC):
        raise _encrypted(where)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _damaged_info(where, "it is not text") from None
    values = _ini_values(text, where)
    expected = None
    kept = []
    for section, key, value in values:
        if section == "backrest" and key == "backrest-checksum":
            expected = json.loads(value)
        else:
            kept.append((section, key, value))
    actual = info_checksum(kept)
    if expected != actual:
        raise _damaged_info(
            where,
            "no backrest-checksum"
            if expected is None
            else f"its checksum is {actual}, and it says {expected}",
        )
    found: dict[tuple[str, str], Any] = {(s, k): json.loads(v) for s, k, v in kept}
    fmt = found.get(("backrest", "backrest-format"))
    if fmt != REPOSITORY_FORMAT:
        raise _damaged_info(where, f"repository format {fmt!r}, not {REPOSITORY_FORMAT}")
    history: list[ArchiveInfoEntry] = []
    try:
        current = int(found[("db", "db-id")])
        for (section, key), value in found.items():
            if section != "db:history":
                continue
            history.append(
                ArchiveInfoEntry(int(key), str(value["db-version"]), int(value["db-id"]))
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise _damaged_info(where, f"[db] or [db:history] lacks {exc}") from None
    if not any(e.db_id == current for e in history):
        raise _damaged_info(where, f"the current db-id {current} is not in [db:history]")
    return ArchiveInfo(
        current, tuple(history), str(found.get(("backrest", "backrest-version"), ""))
    )


# =========================================================================== streams


class _ObjectReader(io.RawIOBase):
    """An object's bytes, read by ranged reads: a first small one (a header check
    needs no more), then large ones."""

    def __init__(self, store: ObjectStore, key: str, size: int, where: str) -> None:
        self._store = store
        self._key = key
        self._size = size
        self._where = where
        self._offset = 0
        self._chunk = b""
        self._pos = 0

    def readable(self) -> bool:
        return True

    def _fill(self) -> bool:
        if self._offset >= self._size:
            return False
        length = _FIRST_CHUNK if self._offset == 0 else _CHUNK
        data = self._store.get_range(self._key, self._offset, length)
        if not data:
            raise ArchiveError(
                f"{self._where} ended at {self._offset} bytes, before the {self._size} it "
                "was listed with",
                hint="was it rewritten while it was read? read it again",
                path=self._where,
            )
        if self._offset == 0 and data.startswith(_ENCRYPTED_MAGIC):
            raise _encrypted(self._where)
        self._offset += len(data)
        self._chunk, self._pos = data, 0
        return True

    def read(self, size: int | None = -1, /) -> bytes:
        want = -1 if size is None else size
        parts: list[bytes] = []
        have = 0
        while want < 0 or have < want:
            if self._pos >= len(self._chunk) and not self._fill():
                break
            end = len(self._chunk) if want < 0 else self._pos + want - have
            piece = self._chunk[self._pos : end]
            self._pos += len(piece)
            have += len(piece)
            parts.append(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


class _PipeStream:
    """The output of a decompression program (``lz4 -dc``, ``zstd -dc``) fed the
    object by a thread."""

    def __init__(self, argv: list[str], source: _ObjectReader) -> None:
        self._argv = argv
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self._failure: BaseException | None = None
        self._feeder = threading.Thread(target=self._feed, args=(source,), daemon=True)
        self._feeder.start()

    def _feed(self, source: _ObjectReader) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            while chunk := source.read(1024 * 1024):
                stdin.write(chunk)
        except (BrokenPipeError, ValueError):
            pass  # the reader closed the stream early
        except Exception as exc:  # handed to the reader, raised there
            self._failure = exc
        finally:
            with contextlib.suppress(OSError):
                stdin.close()

    def read(self, n: int = -1, /) -> bytes:
        out = self._proc.stdout
        assert out is not None
        data = out.read(n)
        if n < 0 or len(data) < n:  # the end: the program and its feeder must be done
            self._feeder.join()
            if self._failure is not None:
                raise self._failure
            assert self._proc.stderr is not None
            err = self._proc.stderr.read().decode(errors="replace").strip()
            rc = self._proc.wait()
            if rc != 0:
                raise OSError(f"{self._argv[0]} exited with code {rc}: {err[-300:]}")
        return bytes(data)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        for pipe in (self._proc.stdout, self._proc.stderr):
            if pipe is not None:
                pipe.close()
        self._proc.wait()
        self._feeder.join(timeout=10)


def _optional_module(name: str) -> Any:
    """An optional module (``zstandard``, ``lz4.frame``), or None when not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


_which = shutil.which
"""How decompression programs are found (tests replace it)."""
_modules = _optional_module
"""How optional codec modules are found (tests replace it)."""


def _decompressing(raw: _ObjectReader, compression: str | None, where: str) -> Any:
    """A file object of the content of ``raw``, compressed with ``compression``."""
    if compression is None:
        return raw
    if compression == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "bz2":
        return bz2.BZ2File(raw, mode="rb")
    if compression == "xz":
        return lzma.LZMAFile(cast("IO[bytes]", raw), mode="rb")
    program = {"zst": "zstd", "lz4": "lz4"}[compression]
    if compression == "zst":
        zstandard = _modules("zstandard")
        if zstandard is not None:
            return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    else:
        lz4frame = _modules("lz4.frame")
        if lz4frame is not None:
            return lz4frame.LZ4FrameFile(raw, mode="rb")
    found = _which(program)
    if found is not None:
        return _PipeStream([found, "-d", "-c", "-q"], raw)
    module = "zstandard" if compression == "zst" else "lz4"
    raise ArchiveError(
        f"cannot read {where}: it is {compression}-compressed, and neither the {module} "
        f"Python module nor the {program} program is here",
        hint=f"pip install {module}, or apt-get install {program}",
        path=where,
        compression=compression,
    )


class _ContentStream:
    """The content of one stored file: decompressed, read exactly as asked (fewer
    bytes only at its end), every failure an :class:`~pgsnap.errors.ArchiveError`,
    and, when read to its end, its SHA-1 compared with the one in its name."""

    def __init__(self, inner: Any, name: str, where: str, sha1: str | None) -> None:
        self._inner = inner
        self._name = name
        self._where = where
        self._sha1 = sha1
        self._digest = hashlib.sha1(usedforsecurity=False) if sha1 else None
        self._size = 0
        self._done = False

    def _damaged(self, reason: str) -> DamagedSegmentError:
        return DamagedSegmentError(
            f"{self._name} in {self._where} is damaged: {reason}",
            hint="pgBackRest's archive-get would fail on it too; find a good copy of the "
            "file (another repository, the server's pg_wal) before recovering past it",
            name=self._name,
            path=self._where,
            reason=reason,
        )

    def _chunk(self, n: int) -> bytes:
        try:
            return bytes(self._inner.read(n))
        except ArchiveError:
            raise
        except Exception as exc:  # a codec's own errors, of every kind
            raise self._damaged(f"it does not decompress ({type(exc).__name__}: {exc})") from exc

    def read(self, size: int = -1, /) -> bytes:
        """Up to ``size`` bytes (all that is left for ``-1``)."""
        parts: list[bytes] = []
        have = 0
        while not self._done and (size < 0 or have < size):
            chunk = self._chunk(1024 * 1024 if size < 0 else size - have)
            if not chunk:
                self._finish()
                break
            parts.append(chunk)
            have += len(chunk)
            self._size += len(chunk)
            if self._digest is not None:
                self._digest.update(chunk)
        return b"".join(parts)

    def _finish(self) -> None:
        self._done = True
        if self._digest is None:
            return
        actual = self._digest.hexdigest()
        if actual != self._sha1:
            raise self._damaged(
                f"its {self._size} bytes have the SHA-1 {actual}, and its name says {self._sha1}"
            )

    def close(self) -> None:
        """Release the stream (and a decompression program)."""
        try:
            self._inner.close()
        except Exception as exc:  # closing a half-read codec stream
            log.debug("closing %s: %s", self._name, exc)


# =========================================================================== the archive


@frozen
class _Stored:
    """A file as the repository stores it: its key below the store's root."""

    name: str
    key: str
    archive_id: str
    found: StoredObject
    sha1: str | None
    compression: str | None


class PgBackRestArchive:
    """The WAL archive of pgBackRest stanza ``stanza`` in the repository ``store``
    (see the module docstring), read only.

    ``tool_config``: pgBackRest's configuration file, named in the
    ``restore_command`` (``--config``); ``restore_command`` replaces the one
    written (:meth:`restore_command`). ``archive_id``: read that archive id's
    cluster instead of the current one.

    A listing (:meth:`list_names`, :meth:`index`) reads ``archive.info`` again (a
    ``stanza-upgrade`` may have come); one file (:meth:`stat`, :meth:`open`...) is
    looked for in the archive ids of the last listing: a listing of its directory
    (a segment's stored name holds its SHA-1) or a HEAD for each.
    """

    def __init__(
        self,
        store: ObjectStore,
        stanza: str,
        *,
        tool_config: str = "",
        restore_command: str | None = None,
        archive_id: str | None = None,
    ) -> None:
        if not _STANZA.fullmatch(stanza or ""):
            raise ConfigurationError(
                f"{stanza!r} is not a pgBackRest stanza name",
                hint='give the stanza of the repository, e.g. stanza = "main"',
            )
        if archive_id is not None and not _ARCHIVE_ID.fullmatch(archive_id):
            raise ConfigurationError(
                f"{archive_id!r} is not a pgBackRest archive id",
                hint="an archive id is <version>-<db id>, e.g. 15-1 (see archive.info)",
            )
        self._store = store
        self._stanza = stanza
        self._tool_config = tool_config
        self._restore_command = restore_command
        self._archive_id = archive_id
        self._base = f"archive/{stanza}/"
        self._ids: tuple[str, ...] | None = None

    def __repr__(self) -> str:
        return f"PgBackRestArchive({self._store.location!r}, stanza={self._stanza!r})"

    @property
    def location(self) -> str:
        """The stanza's archive: ``<repo1-path>/archive/<stanza>`` for a directory,
        ``s3://bucket/<prefix> (archive/<stanza>)`` for S3."""
        if isinstance(self._store, DirectoryStore):
            return str(self._store.root / "archive" / self._stanza)
        return f"{self._store.location} ({self._base.rstrip('/')})"

    def _where_key(self, key: str) -> str:
        """Where the object ``key`` is, for messages."""
        if isinstance(self._store, DirectoryStore):
            return str(self._store.root / key)
        return f"{self._store.location} ({key})"

    @property
    def store(self) -> ObjectStore:
        """The repository's object store."""
        return self._store

    @property
    def stanza(self) -> str:
        """The stanza whose archive is read."""
        return self._stanza

    # ------------------------------------------------------------------ archive.info

    def archive_info(self) -> ArchiveInfo:
        """``archive.info`` as pgBackRest reads it: the file, else its ``.copy``
        (``ArchiveError`` when neither is there or can be read)."""
        failure: ArchiveError | None = None
        for name in (ARCHIVE_INFO, f"{ARCHIVE_INFO}.copy"):
            key = self._base + name
            where = self._where_key(key)
            if self._store.head(key) is None:
                continue
            try:
                return parse_archive_info(self._store.get(key), where=where)
            except (ArchiveRefused, ArchiveUnavailable):
                raise
            except ArchiveError as exc:
                log.warning("%s", exc)
                failure = failure or exc
        if failure is not None:
            raise failure
        raise ArchiveError(
            f"{self.location} has no {ARCHIVE_INFO}: it is not the archive of a "
            f"pgBackRest stanza {self._stanza!r}",
            hint="check [archive] path (pgBackRest's repo1-path; for S3 s3://"
            "<repo1-s3-bucket>/<repo1-path>) and stanza; has 'pgbackrest "
            "stanza-create' run?",
            path=self.location,
        )

    def archive_ids(self) -> tuple[str, ...]:
        """The archive ids read, newest first (archive.info read again)."""
        info = self.archive_info()
        which = None
        if self._archive_id is not None:
            which = info.entry(self._archive_id)
            if which is None:
                raise ArchiveError(
                    f"archive id {self._archive_id} is not in the {ARCHIVE_INFO} of "
                    f"{self.location}",
                    hint="its archive ids are " + ", ".join(e.archive_id for e in info.history),
                    path=self.location,
                )
        self._ids = info.archive_ids(which)
        return self._ids

    def _current_ids(self) -> tuple[str, ...]:
        """The archive ids of the last listing (read once when there was none)."""
        return self._ids if self._ids is not None else self.archive_ids()

    # ------------------------------------------------------------------ listing

    def _scan(self) -> dict[str, list[_Stored]]:
        """Every file of the archive ids read, by PostgreSQL's name (one listing an
        archive id), newest archive id first."""
        files: dict[str, list[_Stored]] = {}
        for archive_id in self.archive_ids():
            prefix = f"{self._base}{archive_id}/"
            for found in self._store.list(prefix):
                stored = self._parse(archive_id, found.key[len(prefix) :], found)
                if stored is not None:
                    files.setdefault(stored.name, []).append(stored)
        return files

    def _parse(self, archive_id: str, rest: str, found: StoredObject) -> _Stored | None:
        directory, _, file_name = rest.rpartition("/")
        if directory and not _DIRECTORY.fullmatch(directory):
            return None
        parsed = parse_stored_name(file_name, in_segment_directory=bool(directory))
        if parsed is None or (directory and parsed.name[:16] != directory):
            return None
        return _Stored(parsed.name, found.key, archive_id, found, parsed.sha1, parsed.compression)

    @staticmethod
    def _chosen(copies: list[_Stored]) -> _Stored | None:
        """The copy read among ``copies`` of one name (newest archive id first), or
        None when their SHA-1s differ (``archive-get`` refuses them)."""
        if len({c.sha1 for c in copies}) > 1:
            return None
        first = copies[0].archive_id
        same = [c for c in copies if c.archive_id == first]
        return min(same, key=lambda c: _PREFERENCE.get(c.compression, 9))

    def _names(self, segment_size: int | None, check_sizes: bool) -> tuple[list[str], list[str]]:
        """(usable names, every name), sorted; the sizes a check needs read
        :data:`_SIZE_READS` at a time."""
        every = sorted(self._scan().items())
        candidates: list[tuple[str, _Stored]] = []
        for name, copies in every:
            chosen = self._chosen(copies)
            if chosen is None:
                log.warning(
                    "%s is stored twice in %s with different content (%s): pgBackRest's "
                    "archive-get refuses it, so a recovery cannot use it",
                    name,
                    self.location,
                    ", ".join(c.key for c in copies),
                )
                continue
            candidates.append((name, chosen))
        if segment_size is None:
            return [n for n, _ in candidates], [n for n, _ in every]
        restorable = [(n, c) for n, c in candidates if c.compression in _RESTORABLE]
        unread = [c for _, c in restorable if check_sizes and self._needs_read(c)]
        sizes: dict[_Stored, tuple[int, bool]] = {}
        if unread:
            with concurrent.futures.ThreadPoolExecutor(max_workers=_SIZE_READS) as pool:
                sizes = dict(zip(unread, pool.map(self._content_size, unread), strict=True))
        usable = [
            n
            for n, c in restorable
            if not check_sizes
            or not self._is_sized(c)
            or (sizes[c][0] if c in sizes else c.found.size) == segment_size
        ]
        return usable, [n for n, _ in every]

    @staticmethod
    def _is_sized(stored: _Stored) -> bool:
        """A segment (not ``.partial``), whose size a listing checks."""
        return stored.sha1 is not None and not stored.name.endswith(".partial")

    def _needs_read(self, stored: _Stored) -> bool:
        """Whether the size of ``stored`` takes a read (a compressed segment)."""
        return self._is_sized(stored) and stored.compression is not None

    def list_names(
        self, segment_size: int | None = None, *, check_sizes: bool = True
    ) -> tuple[str, ...]:
        """PostgreSQL's names of the archive's files, sorted (one listing an archive
        id, archive.info read again). With ``segment_size``, those a recovery can
        use: not a segment stored twice with different content, nor one ``xz``
        compressed, nor (``check_sizes``) one whose content is not of that size
        (see the module docstring: a read for each compressed segment)."""
        if segment_size is None:
            return tuple(self._names(None, check_sizes)[1])
        return tuple(self._names(segment_size, check_sizes)[0])

    def index(self, segment_size: int, *, check_sizes: bool = True) -> ArchiveIndex:
        """An index of the archive's files (one listing an archive id); those a
        recovery cannot use (:meth:`list_names`) among its ``unknown_names``."""
        usable, every = self._names(segment_size, check_sizes)
        index = ArchiveIndex.build(usable, segment_size)
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

    # ------------------------------------------------------------------ one file

    def _copies(self, name: str) -> list[_Stored]:
        """The stored copies of ``name`` in the archive ids read (newest first): a
        listing (a segment: its SHA-1 is in its stored name) or a HEAD an archive id."""
        found: list[_Stored] = []
        for archive_id in self._current_ids():
            if _is_segment(name):
                prefix = f"{self._base}{archive_id}/{name[:16]}/{name}-"
                for obj in self._store.list(prefix):
                    rest = obj.key[len(self._base) + len(archive_id) + 1 :]
                    stored = self._parse(archive_id, rest, obj)
                    if stored is not None and stored.name == name:
                        found.append(stored)
            elif _HISTORY.fullmatch(name) or _BACKUP.fullmatch(name):
                key = self._base + _key_of(archive_id, name)
                head = self._store.head(key)
                if head is not None:
                    found.append(_Stored(name, key, archive_id, head, None, None))
        return found

    def _locate(self, name: str) -> _Stored | None:
        """The copy of ``name`` that is read; None when there is none;
        ``ArchiveError`` when two copies differ."""
        copies = self._copies(check_file_name(name))
        if not copies:
            return None
        chosen = self._chosen(copies)
        if chosen is None:
            raise ArchiveError(
                f"{name} is stored twice in {self.location} with different content: "
                + ", ".join(c.key for c in copies),
                hint="pgBackRest's archive-get refuses it too ('duplicates found'): are two "
                "clusters archiving into this stanza? Find out which copy is this "
                "cluster's before you move the other away",
                name=name,
                path=self.location,
                duplicates=tuple(c.key for c in copies),
            )
        return chosen

    def locate(self, name: str) -> str | None:
        """The key (below the repository's root) of the object ``name`` is read from,
        or None when the archive does not hold it."""
        stored = self._locate(name)
        return None if stored is None else stored.key

    def exists(self, name: str) -> bool:
        """Whether the archive holds ``name`` (twice with different content counts)."""
        check_file_name(name)
        return bool(self._copies(name))

    def _where(self, stored: _Stored) -> str:
        return self._where_key(stored.key)

    def _content_size(self, stored: _Stored) -> tuple[int, bool]:
        """(the content's size, whether it is known rather than presumed): see the
        module docstring."""
        size = stored.found.size
        if stored.compression is None:
            return size, True
        if stored.compression == "gz" and size >= 18:
            tail = self._store.get_range(stored.key, size - 4, 4)
            if len(tail) == 4:
                return struct.unpack("<I", tail)[0], True
            return size, False
        stream = self._stream(stored)
        try:
            head = stream.read(_LONG_HEADER)
        except ArchiveError as exc:
            log.debug("%s: no header read: %s", stored.key, exc)
            return size, False
        finally:
            stream.close()
        if len(head) == _LONG_HEADER:
            info = struct.unpack_from("<H", head, 2)[0]
            segment_size = struct.unpack_from("<I", head, 32)[0]
            if info & _XLP_LONG_HEADER and segment_size in VALID_SEGMENT_SIZES:
                return segment_size, False
        return size, False

    def stat(self, name: str) -> ArchivedFile | None:
        """The file stored as ``name``: ``size`` its content's size (presumed for lz4,
        zstd and bzip2, ``content_size`` then None: see the module docstring),
        ``mtime_ns`` the object's version (:func:`~pgsnap.archives.store.etag_version`
        of its ETag); None when it is not there. ``ArchiveError`` for a segment
        stored twice with different content."""
        stored = self._locate(name)
        if stored is None:
            return None
        size, known = self._content_size(stored)
        return ArchivedFile(
            name,
            size,
            etag_version(stored.found.etag),
            self._where(stored),
            size if known else None,
        )

    def _stream(self, stored: _Stored) -> _ContentStream:
        where = self._where(stored)
        raw = _ObjectReader(self._store, stored.key, stored.found.size, where)
        return _ContentStream(
            _decompressing(raw, stored.compression, where), stored.name, where, stored.sha1
        )

    def _missing(self, name: str) -> ArchiveError:
        return ArchiveError(
            f"{name} is not in the pgBackRest archive {self.location}",
            hint="list the archive to see which files it holds (pgsnap wal), or "
            "'pgbackrest --stanza=<stanza> info' for the range pgBackRest holds",
            name=name,
            path=self.location,
        )

    def open(self, name: str) -> ReadStream:
        """The file's content, decompressed and streamed by ranged reads; a segment
        read to its end has its SHA-1 checked against its stored name
        (:class:`~pgsnap.errors.DamagedSegmentError` when it differs)."""
        stored = self._locate(name)
        if stored is None:
            raise self._missing(name)
        return self._stream(stored)

    def read_text(self, name: str) -> str:
        """The text of a ``.history`` or ``.backup`` file."""
        stored = self._locate(name)
        if stored is None:
            raise self._missing(name)
        if stored.found.size > _MAX_TEXT:
            raise ArchiveError(
                f"{name} in {self.location} is larger than {_MAX_TEXT} bytes",
                hint="read_text is for .history and .backup files, not WAL segments",
                name=name,
                path=self.location,
            )
        stream = self._stream(stored)
        try:
            data = stream.read(_MAX_TEXT + 1)
        finally:
            stream.close()
        return data.decode("utf-8", errors="replace")

    # ------------------------------------------------------------------ recovery

    def restore_command(self) -> str:
        """``[archive] restore_command`` if given, else pgBackRest's own:
        ``pgbackrest --stanza=<stanza> [--config=<tool_config>] --pg1-path="$PWD"
        archive-get %f "%p"`` (:func:`archive_get_command`)."""
        if self._restore_command:
            return self._restore_command
        # archive-get exits 1 for a file it cannot find ("Set the result assuming the
        # archive file will not be found", src/command/archive/get/get.c), other codes
        # for its errors.
        return fatal_unless_missing(archive_get_command(self._stanza, self._tool_config), 1)


PG1_PATH_HERE: Final = '--pg1-path="$PWD"'
"""What makes ``archive-get`` work in any data directory (see :func:`archive_get_command`)."""


def archive_get_command(stanza: str, tool_config: str = "") -> str:
    """``pgbackrest --stanza=STANZA [--config=CONFIG] --pg1-path="$PWD" archive-get %f
    "%p"``: pgBackRest's documented ``restore_command`` (``archive-get %f "%p"``),
    each value shell-quoted and ``%`` in them doubled (PostgreSQL substitutes
    ``%f``, ``%p`` and ``%%``), with ``pg1-path`` the directory PostgreSQL runs it
    in, its data directory.

    Why ``--pg1-path``: ``archive-get`` reads ``pg_control`` in ``pg1-path`` to
    choose the archive ids of the cluster it restores into, and refuses to run
    when PostgreSQL's working directory is not ``pg1-path`` (``%p`` is relative
    to it: ``walPath``, ``src/command/archive/common.c``). pgsnap writes this
    command into clones and drills in directories of their own, where the
    configuration's ``pg1-path`` (the source cluster's) would make it fail; in
    place, ``$PWD`` is that ``pg1-path``. (``/bin/sh`` sets ``$PWD`` to its working
    directory when it starts.)"""
    for value in (stanza, tool_config):
        if "\n" in value or "\r" in value:
            raise ConfigurationError(
                f"{value!r} has a line break, which cannot be in a restore_command",
                hint="name pgBackRest's configuration by a path without line breaks",
            )
    parts = ["pgbackrest", f"--stanza={shlex.quote(stanza)}"]
    if tool_config:
        parts.append(f"--config={shlex.quote(tool_config)}")
    return " ".join(parts).replace("%", "%%") + f' {PG1_PATH_HERE} archive-get %f "%p"'


def open_archive(store: ObjectStore, settings: ArchiveSettings) -> PgBackRestArchive:
    """The archive ``[archive]`` describes (``format = "pgbackrest"``, ``stanza``,
    ``tool_config``, ``restore_command``) in ``store`` (the repository's root:
    ``repo1-path``, or the bucket and ``repo1-path`` for S3). Nothing is read yet."""
    return PgBackRestArchive(
        store,
        settings.stanza,
        tool_config=settings.tool_config,
        restore_command=settings.restore_command or None,
    )
