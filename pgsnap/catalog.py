"""Backup catalogs: where :class:`~pgsnap.model.BackupRecord` s are kept.

:class:`DirectoryCatalog` keeps one JSON file per backup in a directory.
Every write goes to a temporary file that is fsynced and renamed over the
old one (readers see the old record or the new one, never half of each), the
files are mode 0600 (labels name paths and hosts), and writers take an
exclusive ``fcntl`` lock on ``.lock`` so concurrent writers cannot interleave.
:class:`MemoryCatalog` is the same contract in memory, for tests and notebooks.
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

from pgsnap.errors import BackupNotFound, CatalogError, CatalogLockedError, FormatError
from pgsnap.model import BackupRecord, from_json, to_json

__all__ = ["DirectoryCatalog", "MemoryCatalog"]

log = logging.getLogger(__name__)

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _check_id(backup_id: str) -> str:
    if not isinstance(backup_id, str) or not _ID_RE.match(backup_id) or ".." in backup_id:
        raise CatalogError(
            f"invalid backup id {backup_id!r}",
            hint="backup ids are 1-128 letters, digits, '.', '_' or '-'",
            backup_id=backup_id,
        )
    return backup_id


def _sort_key(record: BackupRecord) -> tuple[dt.datetime, str]:
    # By instant, never by text: "03:30+02:00" is before "02:45+00:00".
    return (record.start_time, record.id)


class DirectoryCatalog:
    """A catalog kept as one ``<backup id>.json`` file per backup in ``path``.

    The directory is created (mode 0700) when missing. ``lock_timeout`` bounds
    how long a writer waits for another writer before
    :class:`~pgsnap.errors.CatalogLockedError`.
    """

    def __init__(self, path: str | os.PathLike[str], *, lock_timeout: float = 10.0) -> None:
        self.path = Path(path)
        self.lock_timeout = lock_timeout
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
        """The record with ``backup_id``; ``BackupNotFound`` if there is none."""
        path = self._file(backup_id)
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            raise BackupNotFound(
                f"no backup {backup_id!r} in the catalog {self.path}",
                hint="list the backups with `pgsnap list`",
                backup_id=backup_id,
            ) from None
        try:
            return from_json(BackupRecord, text)
        except FormatError as exc:
            raise CatalogError(
                f"catalog file {path} is unreadable: {exc}",
                hint="restore the file from a copy or remove it",
                backup_id=backup_id,
            ) from exc

    def list(self) -> tuple[BackupRecord, ...]:
        """Every record, oldest start time first; unreadable files are skipped with a warning."""
        records = []
        for entry in sorted(os.scandir(self.path), key=lambda e: e.name):
            if not entry.name.endswith(".json") or entry.name.startswith("."):
                continue
            try:
                records.append(self.get(entry.name[: -len(".json")]))
            except BackupNotFound:
                continue  # deleted while listing
            except CatalogError as exc:
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

    def delete(self, backup_id: str) -> None:
        """Remove the record; ``BackupNotFound`` if absent."""
        with self._lock:
            if self._records.pop(backup_id, None) is None:
                raise BackupNotFound(f"no backup {backup_id!r} in the catalog", backup_id=backup_id)
