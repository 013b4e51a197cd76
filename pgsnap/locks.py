"""The cluster lock: one mutating plan at a time per cluster, across processes.

The executor takes the lock before the first step of a run and holds it to
the last (:class:`~pgsnap.executor.Executor`). Which runs may overlap is
:data:`LOCK_MODES`: backups share the lock (PostgreSQL allows concurrent
non-exclusive backups, and each has its own snapshot group), and so do pins,
unpins (one catalog record each) and copies (they read snapshots, which only
an expiry, a delete or a recovery, each exclusive, could take away); every
other plan kind (a recovery, an expiry, a delete, a kind pgsnap does not
know) holds it alone:

====================  ===================  ==========  =================
running               backup / pin / copy  recovery    expiry / delete
====================  ===================  ==========  =================
backup / pin / copy   allowed              refused     refused
recovery              refused              refused     refused
expiry                refused              refused     refused
====================  ===================  ==========  =================

A run that cannot take the lock fails at once with
:class:`~pgsnap.errors.ClusterLockedError` naming the holders (plan kind
and id, pid, host, since): nothing waits, so a scheduler never piles up runs.

:class:`FileClusterLock` keeps the lock in a directory (beside a
:class:`~pgsnap.catalog.DirectoryCatalog`, so every process that shares the
catalog shares the lock; on a network file system, as far as its byte-range
locks reach). The lock is an open-file-description lock (``F_OFD_SETLK``) on
one file: shared for backups, exclusive otherwise. The kernel releases it
when its process dies, so a dead holder never blocks anyone. Each holder
also writes a small record of who it is, and keeps a lock on that record
while it lives: a record whose lock is gone belongs to a dead process. The
next run that takes the lock reports such a record (with the journal of the
run it belonged to) and removes it: :attr:`Lease.broken`.

:class:`MemoryClusterLock` is the same within one process (a
:class:`~pgsnap.catalog.MemoryCatalog`'s).
"""

from __future__ import annotations

import datetime as dt
import enum
import errno
import fcntl
import json
import logging
import os
import socket
import struct
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, Final, Protocol, runtime_checkable

from pgsnap._attrs import frozen
from pgsnap.errors import ClusterLockedError, ExecutionError

__all__ = [
    "LOCK_MODES",
    "ClusterLock",
    "FileClusterLock",
    "Lease",
    "LockHolder",
    "LockMode",
    "MemoryClusterLock",
    "lock_mode",
]

log = logging.getLogger(__name__)


class LockMode(enum.Enum):
    """How a run holds the cluster lock."""

    SHARED = "shared"
    """With other shared holders (backups)."""
    EXCLUSIVE = "exclusive"
    """Alone."""


LOCK_MODES: Final[Mapping[str, LockMode]] = MappingProxyType(
    {
        "backup": LockMode.SHARED,
        "pin": LockMode.SHARED,
        "unpin": LockMode.SHARED,
        "copy": LockMode.SHARED,
    }
)
"""The plan kinds that share the lock; every other kind holds it exclusively."""


def lock_mode(kind: str) -> LockMode:
    """How a plan of ``kind`` holds the cluster lock (see :data:`LOCK_MODES`)."""
    return LOCK_MODES.get(kind, LockMode.EXCLUSIVE)


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@frozen
class LockHolder:
    """Who holds (or held) the cluster lock: a plan's run in one process."""

    kind: str
    plan_id: str
    pid: int
    host: str
    since: dt.datetime
    journal: str | None = None
    """The run's journal file (None: journals are kept in memory)."""
    alone: bool = False
    """Held exclusively whatever the kind (a scheduled run: ``backup --alone``, ``--all``),
    so that no run of any kind overlaps it."""

    @property
    def mode(self) -> LockMode:
        """How this holder holds the lock."""
        return LockMode.EXCLUSIVE if self.alone else lock_mode(self.kind)

    def __str__(self) -> str:
        return (
            f"{self.kind} plan {self.plan_id[:12]}{' (alone)' if self.alone else ''} (pid "
            f"{self.pid} on {self.host}, since "
            f"{self.since.astimezone(dt.UTC).isoformat(timespec='seconds')})"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the holder record."""
        return {
            "kind": self.kind,
            "plan_id": self.plan_id,
            "pid": self.pid,
            "host": self.host,
            "since": self.since.isoformat(),
            "journal": self.journal,
            "alone": self.alone,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LockHolder:
        """Rebuild from :meth:`to_dict` (ValueError/KeyError/TypeError when malformed)."""
        return cls(
            kind=str(data["kind"]),
            plan_id=str(data["plan_id"]),
            pid=int(data["pid"]),
            host=str(data["host"]),
            since=dt.datetime.fromisoformat(str(data["since"])),
            journal=None if data.get("journal") is None else str(data["journal"]),
            alone=bool(data.get("alone", False)),
        )

    @classmethod
    def for_run(
        cls,
        kind: str,
        plan_id: str,
        *,
        journal: str | None = None,
        clock: Callable[[], dt.datetime] = _utcnow,
        alone: bool = False,
    ) -> LockHolder:
        """This process, about to run the plan ``plan_id`` of ``kind`` (``alone``:
        exclusively, whatever the kind)."""
        return cls(kind, plan_id, os.getpid(), socket.gethostname(), clock(), journal, alone)


class Lease:
    """The lock as one run holds it; :meth:`release` (or leaving the ``with``) ends it.

    ``broken``: the records of holders that died holding the lock, found and
    removed when it was taken (their runs may need resuming: each names its
    journal). ``check``: what :meth:`check` asks of a lock that can be lost while
    held (a lock held by a database session); None for locks that cannot.
    """

    def __init__(
        self,
        holder: LockHolder,
        release: Callable[[], None],
        broken: tuple[LockHolder, ...] = (),
        *,
        check: Callable[[str], None] | None = None,
    ) -> None:
        self.holder = holder
        self.broken = broken
        self._release: Callable[[], None] | None = release
        self._check = check

    def __repr__(self) -> str:
        return f"<Lease {self.holder}{' released' if self._release is None else ''}>"

    @property
    def held(self) -> bool:
        """True until released."""
        return self._release is not None

    def check(self, step: str) -> None:
        """Raise :class:`~pgsnap.errors.ExecutionError` when the lock is no longer held
        (the executor asks before every step, naming it: a lock kept in a catalog
        database also records there which step the run is at)."""
        if self._release is None:
            raise ExecutionError(
                "the cluster lock was released while the run went on",
                step_id=step,
                hint="this is a bug in the caller: a run holds its lease to the end",
            )
        if self._check is not None:
            self._check(step)

    def release(self) -> None:
        """Give the lock back (idempotent)."""
        release, self._release = self._release, None
        if release is not None:
            release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


@runtime_checkable
class ClusterLock(Protocol):
    """What the executor takes before a run (see the module docstring)."""

    def acquire(self, holder: LockHolder) -> Lease:
        """Take the lock for ``holder`` (shared or exclusive, by its kind), or raise
        :class:`~pgsnap.errors.ClusterLockedError` at once, naming the holders."""
        ...

    def holders(self) -> tuple[LockHolder, ...]:
        """Who holds the lock now (empty: nobody). Takes nothing."""
        ...


def _refused(holder: LockHolder, holders: tuple[LockHolder, ...], where: str) -> ClusterLockedError:
    who = "; ".join(str(h) for h in holders) or (
        "a process whose record cannot be read (it may be starting or stopping)"
    )
    return ClusterLockedError(
        f"cannot run this {holder.kind} plan: another pgsnap run holds the cluster ({who})",
        hint="wait for it to finish and run again; only backups may run side by side "
        f"(the lock: {where})",
        holders=tuple(str(h) for h in holders),
    )


# --------------------------------------------------------------------------- in memory


class MemoryClusterLock:
    """The cluster lock within one process (threads), for in-memory catalogs."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._held: dict[int, LockHolder] = {}
        self._next = 0

    def __repr__(self) -> str:
        return f"<MemoryClusterLock holders={len(self._held)}>"

    def acquire(self, holder: LockHolder) -> Lease:
        """See :meth:`ClusterLock.acquire`."""
        with self._mutex:
            current = tuple(self._held.values())
            shared = holder.mode is LockMode.SHARED
            if current and not (shared and all(h.mode is LockMode.SHARED for h in current)):
                raise _refused(holder, current, "in this process")
            key = self._next
            self._next += 1
            self._held[key] = holder

        def release() -> None:
            with self._mutex:
                self._held.pop(key, None)

        return Lease(holder, release)

    def holders(self) -> tuple[LockHolder, ...]:
        """See :meth:`ClusterLock.holders`."""
        with self._mutex:
            return tuple(self._held.values())


# --------------------------------------------------------------------------- in a directory

# struct flock on Linux (x86-64 and arm64): short l_type, short l_whence,
# off_t l_start, off_t l_len, pid_t l_pid, padded to 32 bytes.
_FLOCK: Final = struct.Struct("hhqqi4x")
_LOCK_FILE: Final = "cluster.lock"
_HOLDER_PREFIX: Final = "holder-"
_HOLDER_SUFFIX: Final = ".json"


def _request(kind: int) -> bytes:
    return _FLOCK.pack(kind, os.SEEK_SET, 0, 0, 0)


def _try(fd: int, kind: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _request(kind))
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _locked_by_someone(path: Path) -> bool:
    """True when a process holds a lock on ``path`` (asks the kernel, takes nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        answer = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _request(fcntl.F_WRLCK))
    finally:
        os.close(fd)
    return bool(_FLOCK.unpack(answer)[0] != fcntl.F_UNLCK)


class FileClusterLock:
    """The cluster lock in ``directory`` (created, mode 0700); see the module docstring."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def __repr__(self) -> str:
        return f"FileClusterLock({str(self.directory)!r})"

    def _error(self, exc: OSError, what: str) -> ExecutionError:
        return ExecutionError(
            f"cannot {what} the cluster lock in {self.directory}: {exc.strerror or exc}",
            step_id="",
            hint="the lock lives beside the catalog: check that its directory exists, is "
            "writable by this user and its file system is mounted read-write",
            path=str(self.directory),
        )

    def _records(self) -> list[tuple[Path, LockHolder | None, bool]]:
        """Each holder record: (path, holder or None when unreadable, alive)."""
        out: list[tuple[Path, LockHolder | None, bool]] = []
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return out
        for name in names:
            if not (name.startswith(_HOLDER_PREFIX) and name.endswith(_HOLDER_SUFFIX)):
                continue
            path = self.directory / name
            alive = _locked_by_someone(path)
            try:
                holder: LockHolder | None = LockHolder.from_dict(json.loads(path.read_bytes()))
            except FileNotFoundError:
                continue  # released meanwhile
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.debug("unreadable lock holder record %s: %s", path, exc)
                holder = None
            out.append((path, holder, alive))
        return out

    def holders(self) -> tuple[LockHolder, ...]:
        """See :meth:`ClusterLock.holders` (living holders only)."""
        return tuple(h for _p, h, alive in self._records() if alive and h is not None)

    def acquire(self, holder: LockHolder) -> Lease:
        """See :meth:`ClusterLock.acquire`."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.directory / _LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise self._error(exc, "take") from exc
        kind = fcntl.F_RDLCK if holder.mode is LockMode.SHARED else fcntl.F_WRLCK
        try:
            taken = _try(fd, kind)
        except OSError as exc:
            os.close(fd)
            raise self._error(exc, "take") from exc
        if not taken:
            os.close(fd)
            raise _refused(holder, self.holders(), str(self.directory))
        try:
            broken = self._sweep()
            record_fd, record = self._write_record(holder)
        except OSError as exc:
            os.close(fd)
            raise self._error(exc, "record a holder of") from exc
        except BaseException:
            os.close(fd)
            raise

        def release() -> None:
            try:
                record.unlink(missing_ok=True)
            except OSError as exc:  # the next holder reports and removes it
                log.warning("cannot remove the lock holder record %s: %s", record, exc)
            finally:
                os.close(record_fd)
                os.close(fd)

        for dead in broken:
            log.warning(
                "the cluster lock's holder %s died without releasing it%s",
                dead,
                f"; its journal: {dead.journal}" if dead.journal else "",
            )
        return Lease(holder, release, broken)

    def _sweep(self) -> tuple[LockHolder, ...]:
        """Remove the records of dead holders (the caller holds the lock); return them."""
        broken: list[LockHolder] = []
        for path, found, alive in self._records():
            if alive:
                continue  # another shared holder
            if found is not None:
                broken.append(found)
            path.unlink(missing_ok=True)
        return tuple(broken)

    def _write_record(self, holder: LockHolder) -> tuple[int, Path]:
        """Write the holder's record, locked before it becomes visible."""
        token = uuid.uuid4().hex[:12]
        final = self.directory / f"{_HOLDER_PREFIX}{holder.pid}-{token}{_HOLDER_SUFFIX}"
        temp = self.directory / f".{final.name}.tmp"
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            if not _try(fd, fcntl.F_WRLCK):
                raise OSError(errno.EAGAIN, "the new holder record is locked by another process")
            os.write(fd, json.dumps(holder.to_dict()).encode())
            os.fsync(fd)
            os.rename(temp, final)  # the lock goes with the file: visible only when locked
        except BaseException:
            os.close(fd)
            temp.unlink(missing_ok=True)
            raise
        return fd, final
