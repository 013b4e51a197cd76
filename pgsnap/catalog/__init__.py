"""Backup catalogs: where :class:`~pgsnap.model.BackupRecord` s are kept.

:class:`DirectoryCatalog` keeps one JSON file per backup in a directory.
Every write goes to a temporary file that is fsynced and renamed over the
old one (readers see the old record or the new one, never half of each), the
files are mode 0600 (labels name paths and hosts), and writers take an
exclusive ``fcntl`` lock on ``.lock`` so concurrent writers cannot interleave.
:class:`MemoryCatalog` is the same contract in memory, for tests and notebooks.

Beside the records, ``.index`` holds a copy of each one with the identity of
its file (inode, size, modification time), appended under the same lock by
every write. It is a cache, checked against the files on every read: a record
whose file changed behind pgsnap's back (or that the index does not know) is
read from its file, and an index that is missing, damaged or long is
rewritten by the next listing. Listing ten thousand records reads one file
instead of ten thousand; :meth:`DirectoryCatalog.newest` answers from it
without decoding every record. A record listed from the index decodes its
larger fields (the layout, the backup label, the snapshots: most of each entry)
when they are first read: a plan that reads them of its chosen backup only
parses them once, not ten thousand times.

A file that cannot be read back as a record (truncated, hand-edited, a field
such as an LSN that does not parse) never aborts a listing: ``list()`` skips
it with a warning naming the file, and ``scan()`` returns it as an
:class:`UnreadableEntry` (its path and the error) beside the readable
records, for callers that report it themselves (``pgsnap check``, ``list``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum
import errno
import fcntl
import functools
import gc
import json
import logging
import operator
import os
import re
import tempfile
import threading
import time
import typing
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import BackupNotFound, CatalogError, CatalogLockedError, PgsnapError
from pgsnap.locks import FileClusterLock, MemoryClusterLock
from pgsnap.model import _LSN_RE as _LSN_RE  # the one spelling of an LSN
from pgsnap.model import (
    FORMAT_VERSION,
    LSN,
    BackupRecord,
    BackupState,
    CloneRecord,
    DrillRecord,
    Layout,
    SafetySnapshot,
    decode_value,
    encode_value,
    from_dict,
    from_json,
    to_dict,
    utc_time,
)

if TYPE_CHECKING:
    from pgsnap.protocols import Catalog

__all__ = [
    "CatalogScan",
    "DirectoryCatalog",
    "MemoryCatalog",
    "UnreadableEntry",
    "catalog_system_identifiers",
    "copy_records",
    "is_valid_backup_id",
    "scan_catalog",
]

log = logging.getLogger(__name__)

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

_INDEX = ".index"
_FIELDS: tuple[str, ...] = tuple(f.name for f in attrs.fields(BackupRecord))
_START_TIME: Final = _FIELDS.index("start_time")
_INDEX_HEADER_V1: Final = {"format": "pgsnap-catalog-index", "version": 1, "fields": list(_FIELDS)}
"""The header of pgsnap 0.1's index (a line per record: ``["put", id, identity, [the
values of every field]]``), read as the current one and rewritten by a listing."""
_LAZY_FIELDS: Final = (
    "layout",
    "labelfile",
    "spcmapfile",
    "snapshots",
    "orphaned_snapshots",
    "failure_reason",
)
"""The fields a record listed from the index decodes when first read: most of an
entry's bytes, and read of few records (a plan reads its chosen backup's)."""
_EAGER_FIELDS: Final = tuple(f for f in _FIELDS if f not in _LAZY_FIELDS)
_EAGER_AT: Final = tuple(_FIELDS.index(f) for f in _EAGER_FIELDS)
_LAZY_AT: Final = tuple(_FIELDS.index(f) for f in _LAZY_FIELDS)
_DOCUMENTS = ".documents"
_DOCUMENTS_HEADER = {
    "format": "pgsnap-catalog-documents",
    "version": 1,
    "record_format": FORMAT_VERSION,
    "fields": list(_FIELDS),
}
_Documents = list[dict[str, Any]]
_INDEX_HEADER = {
    "format": "pgsnap-catalog-index",
    "version": 2,
    "record_format": FORMAT_VERSION,
    "fields": list(_EAGER_FIELDS),
    "lazy": list(_LAZY_FIELDS),
}
"""The first line of ``.index``. Each further line is ``["delete", id]`` or ``["put",
id, identity, crc, [the values of "fields"]]``, a tab, and the JSON list of the values
of "lazy" (whose CRC-32 ``crc`` is): values by position, so that reading ten thousand
records parses no repeated keys, and the lazy values apart, so that they are parsed only
when read (JSON never holds a raw tab). An index with another header (another pgsnap
version) is ignored and rewritten."""
_NEWEST = ".newest"
_NEWEST_FORMAT = "pgsnap-catalog-newest/2"
_UNKNOWN: Any = object()
_Table = dict[str, list[Any]]
"""``.newest``'s table: ``"*"`` or a timeline → [start time, backup id, file identity]."""
_Systems = list[str] | None
"""``.newest``'s system identifiers of every record (sorted), or None: not known (after a
deletion, until the index is read again)."""
_Identity = tuple[int, int, int]
"""A record file's inode, size and modification time (ns): a rewrite changes it."""
_Source = list[Any] | bytes
"""A record's values for the index: its ``put`` line as the index holds it (kept as
bytes, which the garbage collector never visits), or the values of a record read
from its file."""
_Entry = tuple[_Identity, list[Any], bytes, bytes]
"""An index entry: the file's identity, the record's eager values (``fields``), its lazy
values (their JSON) and the entry's line."""


def is_valid_backup_id(value: object) -> bool:
    """True for a backup id a catalog accepts: 1-128 letters, digits, '.', '_' or '-'.

    It starts with a letter or digit and never holds ``..`` (ids are file names).
    """
    return isinstance(value, str) and bool(_ID_RE.match(value)) and ".." not in value


def _check_id(backup_id: str) -> str:
    if not is_valid_backup_id(backup_id):
        raise CatalogError(
            f"invalid backup id {backup_id!r}",
            hint="backup ids are 1-128 letters, digits, '.', '_' or '-'",
            backup_id=backup_id,
        )
    return backup_id


_sort_key: Callable[[BackupRecord], tuple[dt.datetime, str]] = operator.attrgetter(
    "start_time", "id"
)
"""A record's place in a listing: by instant, never by text ("03:30+02:00" is before
"02:45+00:00"), then by id."""


@frozen
class UnreadableEntry:
    """A catalog entry that cannot be read back as a record.

    ``path`` is where it is (a file name for a directory catalog), ``backup_id``
    the id its name gives, ``error`` why it cannot be read.
    """

    path: str
    backup_id: str
    error: str

    def __str__(self) -> str:
        return f"{self.path}: {self.error}"


@frozen
class CatalogScan:
    """What a catalog holds: the readable records (oldest first) and the unreadable entries."""

    records: tuple[BackupRecord, ...]
    unreadable: tuple[UnreadableEntry, ...] = ()


def scan_catalog(catalog: Catalog) -> CatalogScan:
    """``catalog.scan()`` when the catalog has one, else its ``list()`` with nothing unreadable.

    The :class:`~pgsnap.protocols.Catalog` protocol only promises ``list()``;
    this gives every catalog the shape of :meth:`DirectoryCatalog.scan`.
    """
    scan = getattr(catalog, "scan", None)
    if callable(scan):
        result = scan()
        if isinstance(result, CatalogScan):
            return result
    return CatalogScan(tuple(catalog.list()))


def catalog_system_identifiers(catalog: Catalog) -> frozenset[str]:
    """The system identifiers of the clusters ``catalog`` holds backups of.

    A :class:`DirectoryCatalog` answers from its index without decoding the
    records; another catalog from ``list()``.
    """
    fast = getattr(catalog, "system_identifiers", None)
    if callable(fast):
        found = fast()
        if isinstance(found, frozenset):
            return found
    return frozenset(r.system_identifier for r in catalog.list())


class DirectoryCatalog:
    """A catalog kept as one ``<backup id>.json`` file per backup in ``path``.

    The directory is created (mode 0700) when missing. ``lock_timeout`` bounds
    how long a writer waits for another writer before
    :class:`~pgsnap.errors.CatalogLockedError`. Records decoded once are kept
    by this object (by file identity), so listing again in one process reads
    only what changed.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        lock_timeout: float = 10.0,
        on_unreadable: Callable[[UnreadableEntry], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self.lock_timeout = lock_timeout
        self.on_unreadable = on_unreadable
        """What :meth:`list` does with an unreadable entry it skips, once per file and
        version: None (the default) logs a warning; the ``pgsnap`` command prints it
        as its own warning, so that a command reads the catalog once."""
        self._reported: set[tuple[str, int, int]] = set()
        self._decoded: dict[str, tuple[_Identity, BackupRecord, _Source]] = {}
        """The records this object read, by id: the file's identity, the record and its
        index values (a second listing reads neither the files nor the index)."""
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise CatalogError(
                f"cannot create the catalog directory {self.path}: {exc.strerror}",
                hint="choose a writable directory for the catalog",
                path=str(self.path),
            ) from exc

    def __repr__(self) -> str:
        return f"DirectoryCatalog({str(self.path)!r})"

    def cluster_lock(self) -> FileClusterLock:
        """The cluster lock of the clusters this catalog serves, in ``.cluster-lock``
        beside the records: every process (and host) that shares the catalog shares
        it (:mod:`pgsnap.locks`)."""
        return FileClusterLock(self.path / ".cluster-lock")

    def check_writable(self) -> None:
        """Raise :class:`~pgsnap.errors.CatalogError` when a record could not be written
        now (a read-only directory or file system): a file is created and removed."""
        probe = self.path / f".write-check-{os.getpid()}"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.close(fd)
            probe.unlink()
        except OSError as exc:
            raise CatalogError(
                f"the catalog directory {self.path} is not writable: {exc.strerror or exc}",
                hint="a backup records itself there: fix the directory's permissions or "
                "mount its file system read-write",
                path=str(self.path),
            ) from exc

    def _file(self, backup_id: str) -> Path:
        return self.path / f"{_check_id(backup_id)}.json"

    @contextlib.contextmanager
    def _locked(self, *, wait: bool = True) -> Iterator[None]:
        lock_path = self.path / ".lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + (self.lock_timeout if wait else 0.0)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    if time.monotonic() >= deadline:
                        raise CatalogLockedError(
                            f"the catalog {self.path} is locked by another writer",
                            hint="wait for the other pgsnap process to finish, then retry",
                            path=str(self.path),
                        ) from None
                    time.sleep(0.02)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def put(self, record: BackupRecord) -> None:
        """Write ``record`` atomically (temp file, fsync, rename), mode 0600."""
        target = self._file(record.id)
        document = to_dict(record)
        data = json.dumps(document, indent=2).encode()
        with self._locked():
            before = _dir_mtime(self.path)
            _write_atomic(target, data)
            values = [document.get(name) for name in _FIELDS]
            ident = _identity(os.stat(target))
            self._append_index(_index_line(record.id, ident, values))
            self._note_newest(before, record.id, ident, record)
        log.debug("catalog %s: wrote %s (%s)", self.path, record.id, record.state.value)

    def get(self, backup_id: str) -> BackupRecord:
        """The record with ``backup_id``; ``BackupNotFound`` if there is none.

        A file that cannot be read or decoded (bad JSON, a bad field, an unknown
        format) is a :class:`~pgsnap.errors.CatalogError` whose message and
        ``path`` name the file; its ``reason`` says what is wrong with it.
        """
        path = self._file(backup_id)
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            raise BackupNotFound(
                f"no backup {backup_id!r} in the catalog {self.path}",
                hint="list the backups with `pgsnap list`",
                backup_id=backup_id,
            ) from None
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise CatalogError(
                f"catalog file {path} is unreadable: {reason}",
                hint="check the file's permissions, or move it out of the catalog",
                backup_id=backup_id,
                path=str(path),
                reason=reason,
            ) from exc
        return self._decode(backup_id, path, text)

    @staticmethod
    def _decode(backup_id: str, path: Path | str, text: bytes | list[Any]) -> BackupRecord:
        try:
            if isinstance(text, list):  # the index's values, by position
                document = dict(zip(_FIELDS, text, strict=True))
                document["format_version"] = FORMAT_VERSION
                return from_dict(BackupRecord, document)
            return from_json(BackupRecord, text)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            # FormatError, LSNError, TargetError, TimeError (all ValueErrors), bad UTF-8
            # and whatever a hand-edited shape trips over: the file is unreadable.
            reason = exc.message if isinstance(exc, PgsnapError) else str(exc)
            raise CatalogError(
                f"catalog file {path} is unreadable: {reason}",
                hint="restore the file from a copy, or move it out of the catalog "
                "(the backup it records is not used until then)",
                backup_id=backup_id,
                path=str(path),
                reason=reason,
            ) from exc

    # -- the index -------------------------------------------------------------------

    def _append_index(self, entry: bytes) -> None:
        """Append one line to ``.index`` (the caller holds the lock). Best effort:
        the index is a cache checked against the files, so a failure only costs speed."""
        line = entry + b"\n"
        path = self.path / _INDEX
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size == 0:
                    line = json.dumps(_INDEX_HEADER).encode() + b"\n" + line
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError as exc:
            log.debug("catalog %s: index not updated: %s", self.path, exc)

    def _read_index(self) -> tuple[dict[str, _Entry], int]:
        """The index's entries by backup id (the last entry of an id wins; a deletion
        removes it), and how many lines it has. Damaged lines are skipped. An index
        of the previous version is read, and counts as long (a listing rewrites it)."""
        try:
            raw = (self.path / _INDEX).read_bytes()
        except OSError:
            return {}, 0
        lines = raw.split(b"\n")
        header = _json_or_none(lines[0])
        if header == _INDEX_HEADER_V1:
            return _read_index_v1([line for line in lines[1:] if line]), 2 * len(lines) + 16
        if header != _INDEX_HEADER:
            log.debug("catalog %s: index of another format or version ignored", self.path)
            return {}, len(lines)
        body = [line for line in lines[1:] if line]
        heads: list[bytes] = []
        tails: list[bytes] = []
        for line in body:  # the lazy values stay unparsed: their CRC is checked
            head, _tab, tail = line.partition(b"\t")
            heads.append(head)
            tails.append(tail)
        try:  # one parse for the whole log; line by line only if a line is damaged
            parsed: list[Any] = json.loads(b"[" + b",".join(heads) + b"]")
        except ValueError:
            parsed = [_json_or_none(head) for head in heads]
        entries: dict[str, _Entry] = {}
        width = len(_EAGER_FIELDS)
        crc32 = zlib.crc32
        for item, tail, line in zip(parsed, tails, body, strict=True):
            # Types checked by ``__class__ is`` (JSON makes exactly these), the
            # identity unpacked: a listing checks ten thousand entries here.
            if item.__class__ is not list:
                continue
            if len(item) == 5 and item[0] == "put":
                _put, backup_id, ident, crc, values = item
                if (
                    backup_id.__class__ is str
                    and ident.__class__ is list
                    and len(ident) == 3
                    and values.__class__ is list
                    and len(values) == width
                    and crc == crc32(tail)
                ):
                    ino, size, mtime = ident
                    if ino.__class__ is int and size.__class__ is int and mtime.__class__ is int:
                        entries[backup_id] = ((ino, size, mtime), values, tail, line)
            elif len(item) >= 2 and item[0] == "delete":
                entries.pop(str(item[1]), None)
        return entries, len(body)

    def _rewrite_index(self, records: dict[str, tuple[_Identity, BackupRecord, _Source]]) -> None:
        """Replace ``.index`` by one entry per record (atomic rename; skipped while
        another process writes the catalog, or when the directory is read-only). An
        entry read from the index is written back as it was."""
        try:
            with self._locked(wait=False):
                entries = (
                    (
                        values
                        if isinstance(values, bytes)
                        else _index_line(backup_id, ident, values)
                    ).decode()
                    for backup_id, (ident, _record, values) in records.items()
                )
                self._replace(_INDEX, [json.dumps(_INDEX_HEADER), *entries])
        except (OSError, CatalogLockedError) as exc:
            log.debug("catalog %s: index not rewritten: %s", self.path, exc)
            return
        log.debug("catalog %s: index rewritten (%d records)", self.path, len(records))

    # -- reading everything ------------------------------------------------------------

    def _load(self) -> tuple[list[BackupRecord], list[tuple[os.DirEntry[str], str, CatalogError]]]:
        """Every readable record (unsorted) and every unreadable entry with its error.

        A record comes from this object's memory or the index when its file's
        identity matches, else from its file; the index is rewritten when it
        missed records or holds more than twice as many entries as records.
        """
        with _gc_paused():
            return self._load_all()

    def _load_all(
        self,
    ) -> tuple[list[BackupRecord], list[tuple[os.DirEntry[str], str, CatalogError]]]:
        index: dict[str, _Entry] | None = None
        lines = 0
        records: list[BackupRecord] = []
        unreadable: list[tuple[os.DirEntry[str], str, CatalogError]] = []
        missed = 0
        decoded: dict[str, tuple[_Identity, BackupRecord, _Source]] = {}
        memory = self._decoded
        with os.scandir(self.path) as entries:
            for entry in entries:
                name = entry.name
                if not name.endswith(".json") or name.startswith("."):
                    continue
                backup_id = name[: -len(".json")]
                try:
                    ident = _identity(entry.stat())
                except FileNotFoundError:
                    continue  # deleted while listing
                except OSError:
                    ident = (0, 0, 0)
                known = memory.get(backup_id)
                if known is not None and known[0] == ident:  # read by this object: unchanged
                    decoded[backup_id] = known
                    records.append(known[1])
                    continue
                if index is None:  # read only when a record is not in memory
                    index, lines = self._read_index()
                cached = index.get(backup_id)
                in_index = cached is not None and cached[0] == ident
                try:
                    from_index = _from_entry(cached[1], cached[2]) if in_index and cached else None
                    if from_index is not None:
                        record = from_index
                    elif is_valid_backup_id(backup_id):  # not in the index, or damaged there
                        record = self.get(backup_id)
                        in_index = False
                    else:
                        record = _bad_name(self.path / name, backup_id)
                except BackupNotFound:
                    continue  # deleted while listing
                except CatalogError as exc:
                    unreadable.append((entry, backup_id, exc))
                    continue
                records.append(record)
                source: _Source
                if in_index and cached is not None:
                    source = cached[3]  # its line: the parsed values are let go
                else:  # the index will learn it
                    missed += 1
                    document = to_dict(record)
                    source = [document.get(field) for field in _FIELDS]
                decoded[backup_id] = (ident, record, source)
        self._decoded = decoded
        if index is not None:
            gone = len(index.keys() - decoded.keys())  # files removed (or spoilt) behind our back
            if missed or gone or lines > 2 * len(decoded) + 16:
                self._rewrite_index(decoded)
        elif len(decoded) < len(memory) or not (self.path / _INDEX).exists():
            self._rewrite_index(decoded)  # records removed, or the index, since the last read
        return records, unreadable

    def scan(self) -> CatalogScan:
        """Every readable record (oldest start time first) and every unreadable entry.

        Nothing is logged: the caller reports the unreadable entries (with
        their paths); a later :meth:`list` does not warn again about them.
        """
        records, bad = self._load()
        unreadable = []
        for entry, backup_id, exc in sorted(bad, key=lambda b: b[1]):
            self._reported.add(self._identity(entry))
            unreadable.append(_unreadable(str(self.path / entry.name), backup_id, exc))
        return CatalogScan(tuple(sorted(records, key=_sort_key)), tuple(unreadable))

    @staticmethod
    def _identity(entry: os.DirEntry[str]) -> tuple[str, int, int]:
        """The entry's name and version (mtime, size): a rewritten file is reported again."""
        try:
            st = entry.stat()
        except OSError:
            return (entry.name, 0, 0)
        return (entry.name, st.st_mtime_ns, st.st_size)

    def list(self) -> tuple[BackupRecord, ...]:
        """Every record, oldest start time first.

        Unreadable files are skipped, with a warning naming the file (once per
        file and version for this catalog object; :attr:`on_unreadable`);
        :meth:`scan` returns them.
        """
        records, bad = self._load()
        for entry, _backup_id, exc in sorted(bad, key=lambda b: b[1]):
            identity = self._identity(entry)
            if identity not in self._reported:
                self._reported.add(identity)
                if self.on_unreadable is not None:
                    self.on_unreadable(_unreadable(str(self.path / entry.name), _backup_id, exc))
                else:
                    log.warning("skipping catalog entry %s: %s", entry.name, exc)
        return tuple(sorted(records, key=_sort_key))

    def documents(self) -> tuple[_Documents, tuple[UnreadableEntry, ...]]:
        """Every readable record as :func:`~pgsnap.model.to_dict` gives it (oldest start
        time first), and every unreadable entry, as :meth:`scan` finds them.

        Where the index holds a record whose file is unchanged, its document comes
        from the index's values without building the record (ten thousand in a tenth
        of the time); any other file is read and checked as :meth:`get` checks it.
        """
        docs, bad, _seen = self._documents()
        return docs, bad

    def documents_text(self) -> tuple[str, tuple[UnreadableEntry, ...]]:
        """:meth:`documents` as one line of JSON (``json.dumps`` of the list), and the
        unreadable entries: what ``pgsnap list --json`` prints.

        The text is kept in ``.documents`` beside the records with the identity (inode,
        size, modification time) of every file it was made from. While no file was
        added, removed or changed since, it is read back instead of made again: at
        ten thousand backups, a listing of the directory and one file read. Best
        effort: a catalog that cannot keep it makes the text each time.
        """
        seen = self._entries()
        cached = self._read_documents(seen)
        if cached is not None:
            return cached
        docs, bad, seen = self._documents()
        text = json.dumps(docs, check_circular=False)
        self._write_documents(seen, bad, text)
        return text, bad

    def _entries(self) -> dict[str, _Identity]:
        """The identity of every record file (and every other ``*.json``), by name."""
        seen: dict[str, _Identity] = {}
        with os.scandir(self.path) as entries:
            for entry in entries:
                name = entry.name
                if not name.endswith(".json") or name.startswith("."):
                    continue
                try:
                    seen[name] = _identity(entry.stat())
                except FileNotFoundError:
                    continue
                except OSError:
                    seen[name] = (0, 0, 0)
        return seen

    def _documents(
        self,
    ) -> tuple[_Documents, tuple[UnreadableEntry, ...], dict[str, _Identity]]:
        with _gc_paused():
            seen = self._entries()
            index, _lines = self._read_index()
            found: list[tuple[dt.datetime, str, list[Any]]] = []
            bad: list[UnreadableEntry] = []
            for name, ident in seen.items():
                backup_id = name[: -len(".json")]
                cached = index.get(backup_id)
                values = (
                    _full_values(cached[1], cached[2])
                    if cached is not None and cached[0] == ident
                    else None
                )
                start = _start_of(values)
                if values is None or start is None:
                    try:
                        if not is_valid_backup_id(backup_id):
                            _bad_name(self.path / name, backup_id)
                        record = self.get(backup_id)
                    except BackupNotFound:
                        continue
                    except CatalogError as exc:
                        bad.append(_unreadable(str(self.path / name), backup_id, exc))
                        continue
                    document = to_dict(record)
                    values = [document.get(field) for field in _FIELDS]
                    start = record.start_time
                found.append((start, backup_id, values))
        found.sort(key=lambda f: (f[0], f[1]))
        docs = []
        for _start, _id, values in found:
            doc: dict[str, Any] = {"format_version": FORMAT_VERSION, "type": "BackupRecord"}
            doc.update(zip(_FIELDS, values, strict=True))
            docs.append(doc)
        return docs, tuple(sorted(bad, key=lambda b: b.backup_id)), seen

    def _read_documents(
        self, seen: dict[str, _Identity]
    ) -> tuple[str, tuple[UnreadableEntry, ...]] | None:
        """The kept text when it was made from exactly the files ``seen``, else None."""
        try:
            with open(self.path / _DOCUMENTS, "rb") as fh:
                header = _json_or_none(fh.readline())
                sources = _json_or_none(fh.readline())
                text = fh.readline()
        except OSError:
            return None
        if header != _DOCUMENTS_HEADER or not isinstance(sources, dict):
            return None
        files, bad = sources.get("files"), sources.get("unreadable")
        if not isinstance(files, dict) or not isinstance(bad, list):
            return None
        if len(files) != len(seen) or any(
            files.get(name) != list(ident) for name, ident in seen.items()
        ):
            return None
        if not text.endswith(b"\n"):
            return None  # cut short
        try:
            unreadable = tuple(UnreadableEntry(*map(str, entry)) for entry in bad)
            return text[:-1].decode(), unreadable
        except (TypeError, ValueError):
            return None

    def _replace(self, name: str, lines: Sequence[str]) -> None:
        """Write ``lines`` to a temporary file (mode 0600) and rename it to ``name`` in
        the catalog directory: a reader sees the old file or the new one, whole."""
        fd, tmp = tempfile.mkstemp(prefix=f"{name}.", suffix=".tmp", dir=self.path)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                os.fchmod(fh.fileno(), 0o600)
                for line in lines:
                    fh.write(line + "\n")
            os.replace(tmp, self.path / name)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def _write_documents(
        self, seen: dict[str, _Identity], bad: Sequence[UnreadableEntry], text: str
    ) -> None:
        sources = {
            "files": {name: list(ident) for name, ident in seen.items()},
            "unreadable": [[u.path, u.backup_id, u.error] for u in bad],
        }
        lines = [
            json.dumps(_DOCUMENTS_HEADER),
            json.dumps(sources, separators=(",", ":")),
            text,
        ]
        try:
            self._replace(_DOCUMENTS, lines)
        except OSError as exc:
            log.debug("catalog %s: documents not kept: %s", self.path, exc)

    def document(self, record: BackupRecord) -> dict[str, Any]:
        """``to_dict(record)``, from the values this object read for it when ``record``
        is the record it listed (ten thousand records encode ten times faster)."""
        known = self._decoded.get(record.id)
        if known is None or known[1] is not record:
            return to_dict(record)
        values = known[2]
        if isinstance(values, bytes):  # the index's line, as read
            head, _tab, tail = values.partition(b"\t")
            values = _full_values(json.loads(head)[4], tail)
        document: dict[str, Any] = {"format_version": FORMAT_VERSION, "type": "BackupRecord"}
        document.update(zip(_FIELDS, values, strict=True))
        return document

    def newest(self, timeline: int | None = None) -> BackupRecord | None:
        """The newest DONE backup (on ``timeline``: stopped on it), or None.

        In O(1): ``.newest`` names the newest backup overall and per timeline,
        kept by every write under the writers' lock with the directory's
        modification time after it. While the directory is unchanged since
        (no record added, replaced or removed behind pgsnap's back) and the
        named record's file is the one written, that record is read, alone.
        Otherwise the answer comes from the index (every entry parsed, one
        record decoded), or from :meth:`list` when the index does not cover
        the directory either, and ``.newest`` is written again.
        """
        quick = self._newest_quick(timeline)
        if quick is None or isinstance(quick, BackupRecord):
            return quick
        found = self._newest_from_index(timeline)
        self._rewrite_newest()
        return found

    def _newest_quick(self, timeline: int | None) -> Any:
        """:meth:`newest` from ``.newest`` alone, or _UNKNOWN when it cannot say."""
        table = self._read_newest()
        if table is None:
            return _UNKNOWN
        entry = table.get("*" if timeline is None else str(timeline))
        if entry is None:
            return None  # no DONE backup (on that timeline): .newest covers them all
        backup_id, ident = str(entry[1]), entry[2]
        try:
            path = self._file(backup_id)
            if _identity(os.stat(path)) != tuple(ident):
                return _UNKNOWN
            record = self.get(backup_id)
        except (OSError, PgsnapError):
            return _UNKNOWN
        return record if record.is_usable else _UNKNOWN

    def _newest_from_index(self, timeline: int | None) -> BackupRecord | None:
        """:meth:`newest` from the index (or from :meth:`list`)."""
        with _gc_paused():
            index, _lines = self._read_index()
        with os.scandir(self.path) as entries:
            names = {
                e.name[: -len(".json")]
                for e in entries
                if e.name.endswith(".json") and not e.name.startswith(".")
            }
        if names != index.keys():
            return _newest_of(self.list(), timeline)
        state, start, stop_tli, start_tli = (
            _EAGER_FIELDS.index(n)
            for n in ("state", "start_time", "stop_timeline", "start_timeline")
        )
        ranked = sorted(
            (
                (str(values[start]), backup_id)
                for backup_id, (_ident, values, _lazy, _line) in index.items()
                if values[state] == BackupState.DONE.value
                and (timeline is None or (values[stop_tli] or values[start_tli]) == timeline)
            ),
            reverse=True,
        )
        for _start, backup_id in ranked:
            ident, values, lazy, _line = index[backup_id]
            path = self._file(backup_id)
            try:
                current: _Identity | None = _identity(os.stat(path))
            except OSError:
                current = None
            if current != ident:
                return _newest_of(self.list(), timeline)
            try:
                record = self._decode(backup_id, path, _full_values(values, lazy))
            except CatalogError:  # damaged in the index: the files decide
                return _newest_of(self.list(), timeline)
            if record.is_usable:
                return record
        return None

    # -- .newest: the newest DONE backup overall and per timeline, in O(1) ---------------

    def _read_newest(self) -> _Table | None:
        """``.newest``'s table when it is current (the directory unchanged since it was
        written), else None."""
        data = self._read_newest_data()
        return None if data is None else self._read_newest_table(data)

    def _read_newest_data(self) -> dict[str, Any] | None:
        """``.newest``'s document when it is current, else None."""
        try:
            raw = (self.path / _NEWEST).read_bytes()
            mtime = _dir_mtime(self.path)
        except OSError:
            return None
        data = _json_or_none(raw)
        if not isinstance(data, dict) or data.get("dir") != mtime:
            return None
        return data

    def _note_newest(
        self,
        before: int | None,
        backup_id: str,
        ident: _Identity | None,
        record: BackupRecord | None,
    ) -> None:
        """Bring ``.newest`` up to date after writing (or, with ``record`` None,
        deleting) ``backup_id`` (the caller holds the lock; ``before`` is the
        directory's mtime before the change). Best effort, like the index."""
        table = None
        systems: _Systems = None
        try:
            raw = (self.path / _NEWEST).read_bytes()
            data = _json_or_none(raw)
            if isinstance(data, dict) and data.get("dir") == before and before is not None:
                table = self._read_newest_table(data)
                systems = _systems_of(data)
        except OSError:
            pass
        named = table is not None and any(e[1] == backup_id for e in table.values())
        if table is None or (named and (record is None or not record.is_usable)):
            self._rewrite_newest(locked=True)  # from the index: O(n), but rare
            return
        if record is None:
            systems = None  # it may have been the last of its cluster: not known now
        elif systems is not None and record.system_identifier not in systems:
            systems = sorted([*systems, record.system_identifier])
        if record is not None and record.is_usable and ident is not None:
            start = encode_value(record.start_time)
            keys = ["*", str(record.stop_timeline or record.start_timeline)]
            stale = [k for k, e in table.items() if e[1] == backup_id and k not in keys]
            if stale:  # it moved timeline: recompute
                self._rewrite_newest(locked=True)
                return
            for key in keys:
                entry = table.get(key)
                if (
                    entry is None
                    or entry[1] == backup_id
                    or (start, backup_id)
                    > (
                        entry[0],
                        entry[1],
                    )
                ):
                    table[key] = [start, backup_id, list(ident)]
        self._write_newest(table, systems)

    @staticmethod
    def _read_newest_table(data: dict[str, Any]) -> _Table | None:
        table = data.get("newest")
        if data.get("format") != _NEWEST_FORMAT or not isinstance(table, dict):
            return None
        for entry in table.values():
            if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[2], list)):
                return None
        return table

    def _rewrite_newest(self, *, locked: bool = False) -> None:
        """``.newest`` computed from the index (or the records); skipped while another
        process writes, or when the index does not cover the directory."""
        if not locked:
            try:
                with self._locked(wait=False):
                    self._rewrite_newest(locked=True)
            except (OSError, CatalogLockedError) as exc:
                log.debug("catalog %s: .newest not rewritten: %s", self.path, exc)
            return
        with _gc_paused():
            index, _lines = self._read_index()
        files = {name[: -len(".json")]: ident for name, ident in self._entries().items()}
        if files.keys() != index.keys():
            return  # the next listing rewrites the index; .newest follows
        state, start, stop_tli, start_tli = (
            _EAGER_FIELDS.index(n)
            for n in ("state", "start_time", "stop_timeline", "start_timeline")
        )
        table: _Table = {}
        at = _EAGER_FIELDS.index("system_identifier")
        systems: _Systems = None  # known only when every file is the one the index read
        if all(files[backup_id] == entry[0] for backup_id, entry in index.items()):
            systems = sorted({str(entry[1][at]) for entry in index.values()})
        for backup_id, (ident, values, _lazy, _line) in index.items():
            if values[state] != BackupState.DONE.value:
                continue
            for key in ("*", str(values[stop_tli] or values[start_tli])):
                entry = table.get(key)
                if entry is None or (values[start], backup_id) > (entry[0], entry[1]):
                    table[key] = [values[start], backup_id, list(ident)]
        self._write_newest(table, systems)

    def _write_newest(self, table: _Table, systems: _Systems) -> None:
        """Write ``.newest`` in place (a rename would change the directory's mtime it
        records); a torn write is refused by the next reader, which recomputes."""
        path = self.path / _NEWEST
        try:
            if not path.exists():
                path.touch(mode=0o600)  # creating it changes the directory: first
            document = {
                "format": _NEWEST_FORMAT,
                "dir": _dir_mtime(self.path),
                "newest": table,
                "systems": systems,
            }
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, json.dumps(document, separators=(",", ":")).encode())
            finally:
                os.close(fd)
        except OSError as exc:
            log.debug("catalog %s: .newest not written: %s", self.path, exc)

    # ------------------------------------------------------------------ named records

    def _named_file(self, kind: str, name: str) -> Path:
        return self.path / kind / f"{_check_id(name)}.json"

    def _put_named(self, kind: str, name: str, record: object) -> None:
        target = self._named_file(kind, name)
        with self._locked():
            target.parent.mkdir(mode=0o700, exist_ok=True)
            _write_atomic(target, json.dumps(to_dict(record), indent=2).encode())

    def _list_named(self, kind: str, cls: type[_R]) -> typing.List[_R]:  # noqa: UP006 - list is a method here
        directory = self.path / kind
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            if not name.endswith(".json") or name.startswith("."):
                continue
            path = directory / name
            try:
                out.append(from_json(cls, path.read_bytes()))
            except FileNotFoundError:
                continue
            except (OSError, PgsnapError) as exc:
                log.warning("unreadable %s record %s: %s", _KINDS[kind], path, exc)
        return out

    def _delete_named(self, kind: str, name: str, hint: str) -> None:
        target = self._named_file(kind, name)
        with self._locked():
            try:
                target.unlink()
            except FileNotFoundError:
                raise CatalogError(
                    f"no {_KINDS[kind]} {name!r} in the catalog {self.path}", hint=hint, name=name
                ) from None

    # ------------------------------------------------------------------ safety snapshots

    def put_safety(self, record: SafetySnapshot) -> None:
        """Record a recovery's safety snapshot (atomically, in ``safety/<name>.json``)."""
        self._put_named(_SAFETY_DIR, record.name, record)

    def list_safety(self) -> tuple[SafetySnapshot, ...]:
        """Every recorded safety snapshot, oldest first; an unreadable record is logged
        and left out (its file is named)."""
        out = self._list_named(_SAFETY_DIR, SafetySnapshot)
        return tuple(sorted(out, key=lambda r: (r.created_at, r.name)))

    def delete_safety(self, name: str) -> None:
        """Remove a safety snapshot's record; :class:`~pgsnap.errors.CatalogError`
        naming it when there is none."""
        self._delete_named(_SAFETY_DIR, name, "list them with `pgsnap safety list`")

    # ------------------------------------------------------------------ clones and drills

    def put_clone(self, record: CloneRecord) -> None:
        """Record (or replace) a clone (atomically, in ``clones/<name>.json``)."""
        self._put_named(_CLONES_DIR, record.name, record)

    def get_clone(self, name: str) -> CloneRecord:
        """One clone's record; :class:`~pgsnap.errors.CatalogError` when there is none."""
        try:
            data = self._named_file(_CLONES_DIR, name).read_bytes()
        except FileNotFoundError:
            raise CatalogError(
                f"no clone {name!r} in the catalog {self.path}",
                hint="list them with `pgsnap clone list`",
                name=name,
            ) from None
        return from_json(CloneRecord, data)

    def list_clones(self) -> tuple[CloneRecord, ...]:
        """Every recorded clone, oldest first (an unreadable record is logged and left out)."""
        out = self._list_named(_CLONES_DIR, CloneRecord)
        return tuple(sorted(out, key=lambda r: (r.created_at, r.name)))

    def delete_clone(self, name: str) -> None:
        """Remove a clone's record; :class:`~pgsnap.errors.CatalogError` when there is none."""
        self._delete_named(_CLONES_DIR, name, "list them with `pgsnap clone list`")

    def put_drill(self, record: DrillRecord) -> None:
        """Record a drill's result (atomically, in ``drills/<id>.json``)."""
        self._put_named(_DRILLS_DIR, record.id, record)

    def list_drills(self, backup_id: str | None = None) -> tuple[DrillRecord, ...]:
        """The drills (of one backup, or all), oldest first."""
        out = self._list_named(_DRILLS_DIR, DrillRecord)
        wanted = [r for r in out if backup_id is None or r.backup_id == backup_id]
        return tuple(sorted(wanted, key=lambda r: (r.started_at, r.id)))

    def system_identifiers(self) -> frozenset[str]:
        """The system identifiers of the backups' clusters: from ``.newest`` while the
        directory is unchanged since a pgsnap write (O(1), as :meth:`newest`), else from
        the index when it covers every record file unchanged (and ``.newest`` is
        written again), else from :meth:`list`."""
        data = self._read_newest_data()
        if data is not None and self._read_newest_table(data) is not None:
            known = _systems_of(data)
            if known is not None:
                return frozenset(known)
        found = self._system_identifiers()
        self._rewrite_newest()
        return found

    def _system_identifiers(self) -> frozenset[str]:
        with _gc_paused():
            index, _lines = self._read_index()
        at = _EAGER_FIELDS.index("system_identifier")
        matched = 0
        with os.scandir(self.path) as entries:
            for e in entries:
                name = e.name
                if not name.endswith(".json") or name.startswith("."):
                    continue
                cached = index.get(name[: -len(".json")])
                try:
                    if cached is None or cached[0] != _identity(e.stat()):
                        break
                except OSError:
                    break
                matched += 1
            else:
                if matched == len(index):  # no entry whose file is gone
                    return frozenset(str(entry[1][at]) for entry in index.values())
        return frozenset(r.system_identifier for r in self.list())

    def delete(self, backup_id: str) -> None:
        """Remove the record; ``BackupNotFound`` if there is none."""
        path = self._file(backup_id)
        with self._locked():
            before = _dir_mtime(self.path)
            try:
                path.unlink()
            except FileNotFoundError:
                raise BackupNotFound(
                    f"no backup {backup_id!r} in the catalog {self.path}", backup_id=backup_id
                ) from None
            self._append_index(json.dumps(["delete", backup_id]).encode())
            self._note_newest(before, backup_id, None, None)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while thousands of records are built (they hold
    no cycles; the collector's passes over them cost a third of a listing)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_Convert = Callable[[Any], Any]


@functools.cache
def _index_plan() -> tuple[tuple[str, _Convert | None, _Convert | None], ...]:
    """Per field of BackupRecord: its name, what makes its JSON value a Python value
    (None: it is one already), and the field's attrs converter (None where the first
    already gives what the converter would). Built once."""
    hints = typing.get_type_hints(BackupRecord)
    plan: list[tuple[str, _Convert | None, _Convert | None]] = []
    for f in attrs.fields(BackupRecord):
        tp = hints[f.name]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        core = args[0] if len(args) == 1 and type(None) in typing.get_args(tp) else tp
        leaf: _Convert | None
        convert = f.converter if callable(f.converter) else None
        if core in (str, int, float, bool):
            leaf = None
        elif core == Mapping[str, str]:
            leaf = dict  # of strings, as pgsnap wrote it (the converter sorts it)
        elif core is LSN:
            leaf, convert = _lsn_leaf(), None  # what LSN.parse and the converter give
        elif core is dt.datetime:
            leaf, convert = _utc_leaf(), None  # what fromisoformat and utc_time give
        elif isinstance(core, type) and issubclass(core, enum.Enum):
            leaf = {m.value: m for m in core}.__getitem__  # a KeyError for another value
        elif core is Layout:
            leaf = _layout_leaf(functools.partial(decode_value, tp, where=f.name))
        elif typing.get_origin(core) is tuple:
            leaf = _empty_or(functools.partial(decode_value, tp, where=f.name), convert)
            convert = None
        else:
            leaf = functools.partial(decode_value, tp, where=f.name)
        plan.append((f.name, leaf, convert))
    return tuple(plan)


def _lsn_leaf() -> _Convert:
    """``LSN.parse`` of index text, without the attrs ``__init__`` and its validator:
    1 to 8 hex digits a half cannot leave an LSN's range."""
    match = _LSN_RE.match
    new = object.__new__
    set_value = LSN.__dict__["value"].__set__

    def lsn(text: str) -> LSN:
        m = match(text)  # (a TypeError for anything but text)
        if m is None:
            raise ValueError(f"malformed LSN {text!r}")
        record = new(LSN)
        set_value(record, (int(m[1], 16) << 32) | int(m[2], 16))
        return record

    return lsn


def _utc_leaf() -> _Convert:
    """``utc_time(datetime.fromisoformat(text))``, with the times pgsnap writes (UTC
    already) returned as parsed."""
    parse = dt.datetime.fromisoformat
    utc = dt.UTC

    def when(text: str) -> dt.datetime:
        value = parse(text)
        return value if value.tzinfo is utc else utc_time(value)

    return when


def _layout_leaf(decode: _Convert) -> _Convert:
    """``decode`` of a layout, once per distinct layout: a cluster's records mostly
    share one, and a Layout is immutable, so they share the object too (one object
    instead of ten thousand, for the garbage collector to visit)."""
    seen: list[tuple[Any, Any]] = []  # (the JSON value, its Layout), the newest last

    def layout(value: Any) -> Any:
        for known_value, known in reversed(seen):
            if known_value == value:
                return known
        decoded = decode(value)  # (not kept when it fails)
        if len(seen) >= 8:  # many layouts: keep the newest few
            del seen[0]
        seen.append((value, decoded))
        return decoded

    return layout


def _empty_or(decode: _Convert, convert: _Convert | None) -> _Convert:
    """``decode`` (then the field's converter), with the empty list most records hold
    for a sequence field (no copies, no orphans) made an empty tuple at once."""

    def value(data: Any) -> Any:
        if data.__class__ is list and not data:
            return ()
        decoded = decode(data)
        return decoded if convert is None else convert(decoded)

    return value


def _from_index(values: list[Any]) -> BackupRecord | None:
    """A whole record from the index's values of every field (in ``_FIELDS``' order),
    its lazy fields decoded at once: :func:`_from_entry` and a first read of each lazy
    field, or None when a value does not convert. What a test holds against the
    checked decoder, for every shape of record."""
    if len(values) != len(_FIELDS):
        return None
    eager = [values[i] for i in _EAGER_AT]
    record = _from_entry(eager, json.dumps([values[i] for i in _LAZY_AT]).encode())
    if record is None:
        return None
    try:
        _decode_lazy(record)
    except CatalogError:
        return None
    return record


def _from_entry(eager: list[Any], lazy: bytes) -> BackupRecord | None:
    """A record from an index entry, built without running its validators, or None
    when a value does not convert (the caller then decodes it the checked way).

    Only for entries whose file is unchanged since pgsnap wrote both from one
    validated record: the values are converted as the record's own decoder and
    converters do (a test checks the two agree), but not validated again, which
    makes listing ten thousand records about twice as fast. The lazy fields
    (``lazy``, their JSON, whose CRC the index checked) are decoded when first read
    (:class:`_IndexedRecord`).
    """
    try:
        return _index_builder()(eager, lazy)  # type: ignore[no-any-return]
    except (TypeError, ValueError, KeyError, AttributeError, PgsnapError):
        return None


def _read_index_v1(body: list[bytes]) -> dict[str, _Entry]:
    """The entries of an index of version 1 (every value in one list), as the current
    version's: a catalog listed by a new pgsnap reads its records from the index once
    more instead of from ten thousand files."""
    try:
        parsed: list[Any] = json.loads(b"[" + b",".join(body) + b"]")
    except ValueError:
        parsed = [_json_or_none(line) for line in body]
    entries: dict[str, _Entry] = {}
    for item in parsed:
        if not isinstance(item, list) or len(item) < 2:
            continue
        if item[0] == "delete":
            entries.pop(str(item[1]), None)
        elif item[0] == "put" and len(item) == 4:
            ident, values = item[2], item[3]
            if _is_identity(ident) and isinstance(values, list) and len(values) == len(_FIELDS):
                line = _index_line(str(item[1]), ident, values)
                lazy = line.partition(b"\t")[2]
                eager = [values[i] for i in _EAGER_AT]
                entries[str(item[1])] = ((ident[0], ident[1], ident[2]), eager, lazy, line)
    return entries


def _is_identity(value: Any) -> bool:
    """Whether an index entry's identity is one (three integers)."""
    return isinstance(value, list) and len(value) == 3 and all(isinstance(v, int) for v in value)


def _index_line(backup_id: str, ident: Sequence[int], values: Sequence[Any]) -> bytes:
    """The index's ``put`` line of a record: its values of every field (``_FIELDS``'
    order) as the head's eager values, a tab, and the lazy values' JSON."""
    lazy = json.dumps([values[i] for i in _LAZY_AT], separators=(",", ":")).encode()
    head = ["put", backup_id, list(ident), zlib.crc32(lazy), [values[i] for i in _EAGER_AT]]
    return json.dumps(head, separators=(",", ":")).encode() + b"\t" + lazy


def _full_values(eager: list[Any], lazy: bytes) -> list[Any]:
    """The values of every field (``_FIELDS``' order) of an index entry."""
    values: list[Any] = [None] * len(_FIELDS)
    for at, value in zip(_EAGER_AT, eager, strict=True):
        values[at] = value
    for at, value in zip(_LAZY_AT, json.loads(lazy), strict=True):
        values[at] = value
    return values


class _IndexedRecord(BackupRecord):
    """A :class:`~pgsnap.model.BackupRecord` listed from the index: its lazy fields
    (``_LAZY_FIELDS``) are decoded from the entry's JSON when one is first read (an
    unset slot's attribute lookup falls through to ``__getattr__``), then are plain
    slots. To everything else it is the record: equal to (and hashed as) the one the
    checked decoder makes, shown and encoded under its name, and copied or pickled as
    a plain BackupRecord."""

    __slots__ = ("_lazy",)

    def __getattr__(self, name: str) -> Any:
        if name not in _LAZY_SET:
            raise AttributeError(name)
        _decode_lazy(self)
        return object.__getattribute__(self, name)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BackupRecord):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in _EQ_FIELDS)

    __hash__ = BackupRecord.__hash__

    def __reduce_ex__(self, protocol: typing.SupportsIndex) -> Any:
        return _plain_record, (tuple(getattr(self, name) for name in _FIELDS),)


_IndexedRecord.__name__ = _IndexedRecord.__qualname__ = "BackupRecord"  # reprs, to_dict


def _plain_record(values: tuple[Any, ...]) -> BackupRecord:
    """A plain BackupRecord with the values of every field (a copy or an unpickling of
    an :class:`_IndexedRecord`: they were a valid record's)."""
    record = object.__new__(BackupRecord)
    for name, value in zip(_FIELDS, values, strict=True):
        BackupRecord.__dict__[name].__set__(record, value)
    return record


_LAZY_SET: Final = frozenset(_LAZY_FIELDS)
_EQ_FIELDS: Final = tuple(f.name for f in attrs.fields(BackupRecord) if f.eq)


def _decode_lazy(record: BackupRecord) -> None:
    """Set the lazy fields of a record listed from the index (once; a no-op after)."""
    try:
        lazy = object.__getattribute__(record, "_lazy")
    except AttributeError:
        return  # decoded already, or made whole (attrs.evolve)
    try:
        _lazy_builder()(record, json.loads(lazy))
    except (TypeError, ValueError, KeyError, AttributeError, PgsnapError) as exc:
        # The entry's CRC matched what pgsnap wrote: only another pgsnap's index
        # with the same header gets here.
        backup_id = object.__getattribute__(record, "id")
        raise CatalogError(
            f"the catalog index's entry of backup {backup_id} does not decode: {exc}",
            hint="remove the catalog's .index file (it is a cache: the next listing "
            "writes it again from the records) and retry",
            backup_id=backup_id,
        ) from exc
    _LAZY_SLOT.__delete__(record)  # the JSON is let go


_LAZY_SLOT: Final = _IndexedRecord.__dict__["_lazy"]


def _generated(
    name: str, fields: Sequence[str], head: str, setup: Sequence[str], tail: Sequence[str]
) -> Callable[..., Any]:
    """Straight-line code that sets ``fields``' slots of ``r`` from ``v0``... (their
    index values), each converted as :func:`_index_plan` says: no loop, no per-field
    lookups, generated once as attrs generates ``__init__``."""
    plan = {n: (leaf, convert) for n, leaf, convert in _index_plan()}
    scope: dict[str, Any] = {
        "new": object.__new__,
        "cls": _IndexedRecord,
        "set_lazy": _LAZY_SLOT.__set__,
    }
    lines = [head, *setup]
    for i, field in enumerate(fields):
        leaf, convert = plan[field]
        scope[f"set{i}"] = BackupRecord.__dict__[field].__set__
        expr = f"v{i}"
        if leaf is not None:
            scope[f"leaf{i}"] = leaf
            expr = f"leaf{i}({expr})"
        if convert is not None:
            scope[f"convert{i}"] = convert
            expr = f"convert{i}({expr})"
        if expr != f"v{i}":
            expr = f"None if v{i} is None else {expr}"
        lines.append(f"    set{i}(r, {expr})  # {field}")
    lines += tail
    exec("\n".join(lines), scope)  # noqa: S102 - code built from the field list above
    return typing.cast(Callable[..., Any], scope[name])


@functools.cache
def _index_builder() -> Callable[[list[Any], bytes], Any]:
    """The function :func:`_from_entry` runs: a new :class:`_IndexedRecord` with its
    eager fields set and its lazy fields' JSON kept."""
    unpack = ", ".join(f"v{i}" for i in range(len(_EAGER_FIELDS)))
    return _generated(
        "build",
        _EAGER_FIELDS,
        "def build(values, lazy):",
        [f"    ({unpack},) = values", "    r = new(cls)", "    set_lazy(r, lazy)"],
        ["    return r"],
    )


@functools.cache
def _lazy_builder() -> Callable[[BackupRecord, list[Any]], None]:
    """What :func:`_decode_lazy` runs: the lazy fields' slots set from their values."""
    unpack = ", ".join(f"v{i}" for i in range(len(_LAZY_FIELDS)))
    return _generated(
        "decode", _LAZY_FIELDS, "def decode(r, values):", [f"    ({unpack},) = values"], []
    )


_SAFETY_DIR = "safety"
"""The catalog directory's subdirectory of safety snapshot records."""
_CLONES_DIR = "clones"
"""The catalog directory's subdirectory of clone records."""
_DRILLS_DIR = "drills"
"""The catalog directory's subdirectory of drill records."""
_KINDS: Final = {_SAFETY_DIR: "safety snapshot", _CLONES_DIR: "clone", _DRILLS_DIR: "drill"}
_R = typing.TypeVar("_R")


def _write_atomic(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` atomically (temp file, fsync, rename), mode 0600."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o600)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _dir_mtime(path: Path) -> int:
    return os.stat(path).st_mtime_ns


def _identity(st: os.stat_result) -> _Identity:
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _systems_of(data: dict[str, Any]) -> _Systems:
    """``.newest``'s system identifiers, or None when it does not know them."""
    systems = data.get("systems")
    if isinstance(systems, list) and all(isinstance(s, str) for s in systems):
        return systems
    return None


def _start_of(values: list[Any] | None) -> dt.datetime | None:
    """The start time (aware) of the index's values of a record, or None."""
    if values is None:
        return None
    try:
        start = dt.datetime.fromisoformat(values[_START_TIME])
    except (TypeError, ValueError):
        return None
    return start if start.tzinfo is not None else None


def _unreadable(path: str, backup_id: str, exc: CatalogError) -> UnreadableEntry:
    return UnreadableEntry(
        path=path, backup_id=backup_id, error=str(getattr(exc, "reason", exc.message))
    )


def _json_or_none(line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


def _bad_name(path: Path, backup_id: str) -> BackupRecord:
    raise CatalogError(
        f"catalog file {path} is unreadable: its name is not a backup id",
        hint="move the file out of the catalog",
        backup_id=backup_id,
        path=str(path),
        reason="its name is not a backup id",
    )


def _newest_of(records: tuple[BackupRecord, ...], timeline: int | None) -> BackupRecord | None:
    done = [
        r
        for r in records
        if r.is_usable and (timeline is None or (r.stop_timeline or r.start_timeline) == timeline)
    ]
    return done[-1] if done else None


class MemoryCatalog:
    """The :class:`~pgsnap.protocols.Catalog` contract in memory (tests, notebooks)."""

    def __init__(self) -> None:
        self._records: dict[str, BackupRecord] = {}
        self._safety: dict[str, SafetySnapshot] = {}
        self._clones: dict[str, CloneRecord] = {}
        self._drills: dict[str, DrillRecord] = {}
        self._lock = threading.Lock()
        self._cluster_lock = MemoryClusterLock()

    def cluster_lock(self) -> MemoryClusterLock:
        """The cluster lock of this catalog's clusters, within this process."""
        return self._cluster_lock

    def __repr__(self) -> str:
        return f"MemoryCatalog({len(self._records)} backups)"

    def put(self, record: BackupRecord) -> None:
        """Insert or replace the record."""
        _check_id(record.id)
        with self._lock:
            self._records[record.id] = record

    def put_safety(self, record: SafetySnapshot) -> None:
        """Record a recovery's safety snapshot."""
        _check_id(record.name)
        with self._lock:
            self._safety[record.name] = record

    def list_safety(self) -> tuple[SafetySnapshot, ...]:
        """Every recorded safety snapshot, oldest first."""
        with self._lock:
            return tuple(sorted(self._safety.values(), key=lambda r: (r.created_at, r.name)))

    def delete_safety(self, name: str) -> None:
        """Remove a safety snapshot's record (CatalogError when there is none)."""
        with self._lock:
            if self._safety.pop(name, None) is None:
                raise CatalogError(f"no safety snapshot {name!r} in the catalog", name=name)

    def put_clone(self, record: CloneRecord) -> None:
        """Record (or replace) a clone."""
        _check_id(record.name)
        with self._lock:
            self._clones[record.name] = record

    def get_clone(self, name: str) -> CloneRecord:
        """One clone's record (CatalogError when there is none)."""
        with self._lock:
            found = self._clones.get(name)
        if found is None:
            raise CatalogError(f"no clone {name!r} in the catalog", name=name)
        return found

    def list_clones(self) -> tuple[CloneRecord, ...]:
        """Every recorded clone, oldest first."""
        with self._lock:
            return tuple(sorted(self._clones.values(), key=lambda r: (r.created_at, r.name)))

    def delete_clone(self, name: str) -> None:
        """Remove a clone's record (CatalogError when there is none)."""
        with self._lock:
            if self._clones.pop(name, None) is None:
                raise CatalogError(f"no clone {name!r} in the catalog", name=name)

    def put_drill(self, record: DrillRecord) -> None:
        """Record a drill's result."""
        _check_id(record.id)
        with self._lock:
            self._drills[record.id] = record

    def list_drills(self, backup_id: str | None = None) -> tuple[DrillRecord, ...]:
        """The drills (of one backup, or all), oldest first."""
        with self._lock:
            found = [r for r in self._drills.values() if backup_id in (None, r.backup_id)]
        return tuple(sorted(found, key=lambda r: (r.started_at, r.id)))

    def get(self, backup_id: str) -> BackupRecord:
        """The record; ``BackupNotFound`` if absent."""
        with self._lock:
            try:
                return self._records[backup_id]
            except KeyError:
                raise BackupNotFound(
                    f"no backup {backup_id!r} in the catalog", backup_id=backup_id
                ) from None

    def list(self) -> tuple[BackupRecord, ...]:
        """Every record, oldest start time first."""
        with self._lock:
            return tuple(sorted(self._records.values(), key=_sort_key))

    def scan(self) -> CatalogScan:
        """Every record (nothing in memory is unreadable)."""
        return CatalogScan(self.list())

    def delete(self, backup_id: str) -> None:
        """Remove the record; ``BackupNotFound`` if absent."""
        with self._lock:
            if self._records.pop(backup_id, None) is None:
                raise BackupNotFound(f"no backup {backup_id!r} in the catalog", backup_id=backup_id)


def copy_records(
    source: Catalog, target: Catalog, *, on_record: Callable[[str, str], None] | None = None
) -> dict[str, int]:
    """Copy every record of the catalog ``source`` into ``target`` (another catalog):
    backups (with their pins), safety snapshots, clones and drills. Records already in
    ``target`` are replaced by ``source``'s. Returns the counts by kind, and
    ``unreadable`` (rows or files of ``source`` that could not be read: they are
    named in the log and not copied). ``on_record(kind, name)`` is called for each."""
    counts = dict.fromkeys(("backups", "safety", "clones", "drills", "unreadable"), 0)
    scan = scan_catalog(source)
    for bad in scan.unreadable:
        log.warning("not imported, unreadable: %s", bad)
        counts["unreadable"] += 1
    step = on_record or (lambda _k, _n: None)
    for record in scan.records:
        target.put(record)
        counts["backups"] += 1
        step("backup", record.id)
    for safety in source.list_safety():
        target.put_safety(safety)
        counts["safety"] += 1
        step("safety", safety.name)
    for clone in source.list_clones():
        target.put_clone(clone)
        counts["clones"] += 1
        step("clone", clone.name)
    for drill in source.list_drills():
        target.put_drill(drill)
        counts["drills"] += 1
        step("drill", drill.id)
    return counts
