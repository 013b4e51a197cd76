"""Backup catalogs: where :class:`~pgsnap.model.BackupRecord` s are kept.

:class:`DirectoryCatalog` keeps one JSON file per backup in a directory.
Every write goes to a temporary file that is fsynced and renamed over the
old one (readers see the old record or the new one, never half of each), the
files are mode 0600 (labels name paths and hosts), and writers take an
exclusive ``fcntl`` lock on ``.lock`` so concurrent writers cannot interleave.
:class:`MemoryCatalog` is the same contract in memory, for tests and notebooks.

A file that cannot be read back as a record (truncated, hand-edited, a field
such as an LSN that does not parse) never aborts a listing: ``list()`` skips
it with a warning naming the file, and ``scan()`` returns it as an
:class:`UnreadableEntry` (its path and the error) beside the readable
records, for callers that report it themselves (``pgsnap check``, ``list``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from pgsnap.errors import BackupNotFound, CatalogError, CatalogLockedError, PgsnapError
from pgsnap.model import BackupRecord, from_json, to_json

if TYPE_CHECKING:
    from pgsnap.protocols import Catalog

__all__ = [
    "CatalogScan",
    "DirectoryCatalog",
    "MemoryCatalog",
    "UnreadableEntry",
    "is_valid_backup_id",
    "scan_catalog",
]

log = logging.getLogger(__name__)

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


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


def _sort_key(record: BackupRecord) -> tuple[dt.datetime, str]:
    # By instant, never by text: "03:30+02:00" is before "02:45+00:00".
    return (record.start_time, record.id)


@attrs.frozen
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


@attrs.frozen
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


class DirectoryCatalog:
    """A catalog kept as one ``<backup id>.json`` file per backup in ``path``.

    The directory is created (mode 0700) when missing. ``lock_timeout`` bounds
    how long a writer waits for another writer before
    :class:`~pgsnap.errors.CatalogLockedError`.
    """

    def __init__(self, path: str | os.PathLike[str], *, lock_timeout: float = 10.0) -> None:
        self.path = Path(path)
        self.lock_timeout = lock_timeout
        self._reported: set[tuple[str, int, int]] = set()
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

    def _file(self, backup_id: str) -> Path:
        return self.path / f"{_check_id(backup_id)}.json"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        lock_path = self.path / ".lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + self.lock_timeout
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
        data = to_json(record).encode()
        with self._locked():
            fd, tmp = tempfile.mkstemp(prefix=f".{record.id}.", suffix=".tmp", dir=self.path)
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
            dir_fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
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
        try:
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

    def scan(self) -> CatalogScan:
        """Every readable record (oldest start time first) and every unreadable entry.

        Nothing is logged: the caller reports the unreadable entries (with
        their paths); a later :meth:`list` does not warn again about them.
        """
        records: list[BackupRecord] = []
        unreadable: list[UnreadableEntry] = []
        for entry in sorted(os.scandir(self.path), key=lambda e: e.name):
            if not entry.name.endswith(".json") or entry.name.startswith("."):
                continue
            backup_id = entry.name[: -len(".json")]
            try:
                records.append(self.get(backup_id))
            except BackupNotFound:
                continue  # deleted while listing
            except CatalogError as exc:
                self._reported.add(self._identity(entry))
                unreadable.append(
                    UnreadableEntry(
                        path=str(self.path / entry.name),
                        backup_id=backup_id,
                        error=str(getattr(exc, "reason", exc.message)),
                    )
                )
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
        file and version for this catalog object); :meth:`scan` returns them.
        """
        records: list[BackupRecord] = []
        for entry in sorted(os.scandir(self.path), key=lambda e: e.name):
            if not entry.name.endswith(".json") or entry.name.startswith("."):
                continue
            try:
                records.append(self.get(entry.name[: -len(".json")]))
            except BackupNotFound:
                continue  # deleted while listing
            except CatalogError as exc:
                identity = self._identity(entry)
                if identity not in self._reported:
                    self._reported.add(identity)
                    log.warning("skipping catalog entry %s: %s", entry.name, exc)
        return tuple(sorted(records, key=_sort_key))

    def delete(self, backup_id: str) -> None:
        """Remove the record; ``BackupNotFound`` if there is none."""
        path = self._file(backup_id)
        with self._locked():
            try:
                path.unlink()
            except FileNotFoundError:
                raise BackupNotFound(
                    f"no backup {backup_id!r} in the catalog {self.path}", backup_id=backup_id
                ) from None


class MemoryCatalog:
    """The :class:`~pgsnap.protocols.Catalog` contract in memory (tests, notebooks)."""

    def __init__(self) -> None:
        self._records: dict[str, BackupRecord] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MemoryCatalog({len(self._records)} backups)"

    def put(self, record: BackupRecord) -> None:
        """Insert or replace the record."""
        _check_id(record.id)
        with self._lock:
            self._records[record.id] = record

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
