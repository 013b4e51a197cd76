"""The one exception tree of pgsnap.

Every error pgsnap raises on purpose is a :class:`PgsnapError`. Errors carry
data (the missing segment, the volume id...) as attributes, say what to do in
their ``hint``, and survive pickling (products run pgsnap in worker
processes). Errors caused by bad input also subclass the matching built-in, so
``except ValueError`` keeps working for callers who do not know pgsnap::

    PgsnapError
    ├── InputError (ValueError)             bad input: a value that cannot be right
    │   ├── LSNError                        malformed / out-of-range LSN
    │   ├── WalNameError                    malformed WAL file name, bad segment size
    │   ├── HistoryFileError                malformed or inconsistent .history file
    │   ├── BackupFileError                 malformed .backup file / backup_label
    │   ├── TimeError                       a time without a time zone, or out of range
    │   ├── TargetError                     bad recovery target (naive time, two targets)
    │   ├── FormatError                     JSON of an unknown major format version, bad shape
    │   └── InvalidPlanError                a step names an unknown operation or bad parameters
    ├── ConfigurationError (ValueError)     settings that cannot work together
    │   ├── BackendNotFound (LookupError)   no backend registered under that name
    │   └── OperationNotFound (LookupError) no plan operation registered under that name
    ├── PlanningError                       the request cannot succeed; says why and the alternative
    │   ├── UnsupportedCapability           the backend lacks what the plan needs
    │   ├── NoBackupForTarget               no DONE backup can reach the target
    │   ├── TargetOutOfRange                target before consistency or past the archive's end
    │   ├── WalGapError                     segments missing between backup and target
    │   ├── TimelineError                   target timeline does not contain the backup
    │   └── PreflightError                  a backup preflight check failed
    ├── StalePlanError                      the facts changed since the plan was made
    │   ├── PlanAlreadyRunError             this plan has run already: plan again
    │   └── BackupNotDue                    a backup started within the interval asked for
    ├── ExecutionError                      a step of a plan failed (step_id, what was undone)
    │   ├── PlanLockedError                 another process is executing the plan
    │   ├── ClusterLockedError              another run holds the cluster (holders named)
    │   ├── LockLostError                   the cluster lock was lost mid-run: stopped, resumable
    │   └── InvariantError                  what a step would act on is not what the plan says
    ├── BackendError                        the storage refused or failed (backend)
    │   ├── VolumeNotFound (LookupError)
    │   ├── SnapshotNotFound (LookupError)
    │   ├── BackendUnavailable              retryable: network, timeouts, 5xx
    │   ├── SnapshotLimitError              a volume has as many snapshots as the storage allows
    │   └── AuthenticationError
    ├── DatabaseError                       PostgreSQL refused or failed (sqlstate)
    │   ├── BackupModeError                 backup start/stop failed or session lost
    │   └── ServerRefusedError              the server is up but refuses pgsnap (auth, slots)
    ├── HostError                           the database host refused or failed (host)
    │   ├── HostUnreachable                 retryable: the host cannot be reached (ssh)
    │   ├── CommandError                    a command exited non-zero (argv, returncode, stderr)
    │   │   └── CommandTimeout              a command did not finish in time
    │   ├── HostFileNotFound (LookupError)  no such file on the host (path)
    │   ├── MountError                      mounting or unmounting failed (target)
    │   │   └── MountBusyError              unmount refused: processes hold the file system
    │   └── DeviceNotFound (LookupError)    a device did not appear on the host (device)
    ├── ArchiveError                        the WAL archive cannot be read
    │   ├── ArchiveUnavailable              retryable: the archive cannot be reached now
    │   ├── ArchiveRefused                  the archive refuses (access, no such bucket)
    │   └── DamagedSegmentError             an archived segment is truncated or foreign
    ├── CatalogError                        the catalog cannot be read or written
    │   ├── BackupNotFound (LookupError)
    │   └── CatalogLockedError              another writer holds the lock
    └── CopyError                           a copy off the array cannot be written or read
        ├── CopyNotFound (LookupError)      no manifest, chunk or marker of that name in the target
        ├── CopyTargetRefused               denied, no bucket, untrusted TLS: never retried
        ├── DamagedChunkError               a stored chunk does not hash to its name (chunk)
        ├── CopyKeyError                    an encrypted copy, and no key or not its key given
        └── CopyBusy                        retryable: a copy or garbage collection holds the target
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from pgsnap.model import LSN

__all__ = [
    "ArchiveError",
    "ArchiveRefused",
    "ArchiveUnavailable",
    "AuthenticationError",
    "BackendError",
    "BackendNotFound",
    "BackendUnavailable",
    "BackupFileError",
    "BackupModeError",
    "BackupNotDue",
    "BackupNotFound",
    "CatalogError",
    "CatalogLockedError",
    "ClusterLockedError",
    "CommandError",
    "CommandTimeout",
    "ConfigurationError",
    "CopyBusy",
    "CopyError",
    "CopyKeyError",
    "CopyNotFound",
    "CopyTargetRefused",
    "DamagedChunkError",
    "DamagedSegmentError",
    "DatabaseError",
    "DeviceNotFound",
    "ExecutionError",
    "FormatError",
    "HistoryFileError",
    "HostError",
    "HostFileNotFound",
    "HostUnreachable",
    "InputError",
    "InvalidPlanError",
    "InvariantError",
    "LSNError",
    "LockLostError",
    "MountBusyError",
    "MountError",
    "NoBackupForTarget",
    "OperationNotFound",
    "PgsnapError",
    "PlanAlreadyRunError",
    "PlanLockedError",
    "PlanningError",
    "PreflightError",
    "ServerRefusedError",
    "SnapshotLimitError",
    "SnapshotNotFound",
    "StalePlanError",
    "TargetError",
    "TargetOutOfRange",
    "TimeError",
    "TimelineError",
    "UnsupportedCapability",
    "VolumeNotFound",
    "WalGapError",
    "WalNameError",
]


def _rebuild(cls: type[PgsnapError], message: str, details: dict[str, Any]) -> PgsnapError:
    """Recreate an error when unpickling (module level so pickle can find it)."""
    return cls(message, **details)


class PgsnapError(Exception):
    """Base class of every error pgsnap raises on purpose.

    ``message`` says what is wrong; ``hint`` (optional) says what to do.
    Extra keyword arguments are data about the failure and become attributes
    (``err.segment``, ``err.volume_id``...); they are kept through pickling.
    """

    retryable: ClassVar[bool] = False
    """Whether retrying the same call may succeed (feeds retry predicates)."""

    def __init__(self, message: str, *, hint: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details: dict[str, Any] = details
        for key, value in details.items():
            setattr(self, key, value)

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message} (hint: {self.hint})"
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, {"hint": self.hint, **self.details}))


class InputError(PgsnapError, ValueError):
    """A value given to pgsnap cannot be right (bad syntax, out of range)."""


class LSNError(InputError):
    """A WAL location (LSN) is malformed or out of range."""


class WalNameError(InputError):
    """A WAL file name or a WAL segment size is invalid."""


class HistoryFileError(InputError):
    """A timeline history file is malformed or inconsistent."""


class BackupFileError(InputError):
    """A backup history file (``.backup``) or ``backup_label`` is malformed."""


class TimeError(InputError):
    """A time has no time zone (pgsnap never guesses one) or is out of range."""


class TargetError(InputError):
    """A recovery target is invalid (naive time, several targets, bad value)."""


class FormatError(InputError):
    """Serialized data (JSON) has the wrong shape or an unsupported format version."""


class InvalidPlanError(InputError):
    """A plan step names an operation nobody registered, or gives it bad parameters.

    Raised when the plan is built or loaded, never half-way through a run.
    ``step_id`` and ``action`` name the offending step and operation.
    """

    step_id: str
    action: str

    def __init__(
        self, message: str, *, step_id: str, action: str, hint: str | None = None, **details: Any
    ) -> None:
        super().__init__(message, hint=hint, step_id=step_id, action=action, **details)


class ConfigurationError(PgsnapError, ValueError):
    """Settings that cannot work (missing volume for a role, conflicting options)."""


class BackendNotFound(ConfigurationError, LookupError):
    """No storage backend is registered under the requested name."""


class OperationNotFound(ConfigurationError, LookupError):
    """No plan operation is registered under the requested name."""


class PlanningError(PgsnapError):
    """The request cannot succeed; the message says why and what would work."""


class UnsupportedCapability(PlanningError):
    """The storage backend lacks a capability the plan needs."""


class NoBackupForTarget(PlanningError):
    """No DONE backup can reach the recovery target."""


class TargetOutOfRange(PlanningError):
    """The target lies before the earliest or after the latest reachable point."""


class WalGapError(PlanningError):
    """WAL segments are missing between the backup and the target.

    ``missing``: the missing segment (or ``.history``) names, in order;
    ``reachable_lsn``: the last LSN that can be reached without a gap.
    """

    missing: tuple[str, ...]
    reachable_lsn: LSN | None

    def __init__(
        self,
        message: str,
        *,
        missing: Sequence[str] = (),
        reachable_lsn: LSN | None = None,
        hint: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(
            message, hint=hint, missing=tuple(missing), reachable_lsn=reachable_lsn, **details
        )


class TimelineError(PlanningError):
    """The target timeline's history does not contain the backup."""


class PreflightError(PlanningError):
    """A blocking preflight finding prevents the backup."""


class StalePlanError(PgsnapError):
    """The facts a plan was made from have changed; plan again."""


class PlanAlreadyRunError(StalePlanError):
    """This plan has already been executed (``plan_id``, its run's ``state``).

    A plan runs once. An interrupted run is resumed by running the plan
    again; a finished, failed or compensated one is not: make a new plan.
    """

    plan_id: str
    state: str

    def __init__(
        self, message: str, *, plan_id: str, state: str, hint: str | None = None, **details: Any
    ) -> None:
        super().__init__(message, hint=hint, plan_id=plan_id, state=state, **details)


class BackupNotDue(StalePlanError):
    """No backup is taken: a DONE backup started within the interval the caller asked
    for (``due_after``, ``pgsnap backup --if-older-than``). Not a failure: a scheduled
    run that comes twice takes one backup. ``backup_id`` names the recent backup."""


class ExecutionError(PgsnapError):
    """A step of a plan failed while executing, and what was done about it.

    - ``step_id``: the step that failed (``""``: before the first step);
    - ``completed``: the steps that had finished, in order;
    - ``compensated``: the steps whose compensation ran, in the order it ran;
    - ``compensation_failures``: ``"step: error"`` for each compensation that failed;
    - ``past_point_of_no_return``: a barrier step had started, so nothing was
      undone (the message says what state things were left in);
    - ``leftovers``: resources the run created and could not remove (snapshot ids);
    - ``cause``: the pgsnap error the step raised, when it was one (else None;
      the message names the exception).
    """

    step_id: str
    completed: tuple[str, ...]
    compensated: tuple[str, ...]
    compensation_failures: tuple[str, ...]
    past_point_of_no_return: bool
    leftovers: tuple[str, ...]
    cause: PgsnapError | None

    def __init__(
        self,
        message: str,
        *,
        step_id: str,
        completed: Sequence[str] = (),
        compensated: Sequence[str] = (),
        compensation_failures: Sequence[str] = (),
        past_point_of_no_return: bool = False,
        leftovers: Sequence[str] = (),
        cause: PgsnapError | None = None,
        hint: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(
            message,
            hint=hint,
            step_id=step_id,
            completed=tuple(completed),
            compensated=tuple(compensated),
            compensation_failures=tuple(compensation_failures),
            past_point_of_no_return=past_point_of_no_return,
            leftovers=tuple(leftovers),
            cause=cause,
            **details,
        )


class PlanLockedError(ExecutionError):
    """Another process is executing this plan (its journal is locked); nothing ran."""

    retryable: ClassVar[bool] = True

    def __init__(self, message: str, *, hint: str | None = None, **details: Any) -> None:
        details.setdefault("step_id", "")
        super().__init__(message, hint=hint, **details)


class ClusterLockedError(ExecutionError):
    """Another pgsnap run holds the cluster, or an interrupted run must be finished
    first; nothing ran.

    ``holders``: who holds the cluster lock (text: plan kind and id, pid, host,
    since); ``interrupted``: the journals of interrupted runs that block this one.
    """

    retryable: ClassVar[bool] = True
    holders: tuple[str, ...]
    interrupted: tuple[str, ...]

    def __init__(self, message: str, *, hint: str | None = None, **details: Any) -> None:
        details.setdefault("step_id", "")
        details.setdefault("holders", ())
        details.setdefault("interrupted", ())
        super().__init__(message, hint=hint, **details)


class LockLostError(ExecutionError):
    """The cluster lock was lost while a run held it (the catalog database that keeps
    it went away): the run stopped at a step boundary, undid nothing (another backup
    server may hold the cluster now), and its journal is kept for ``pgsnap resume``."""

    retryable: ClassVar[bool] = True


class InvariantError(ExecutionError):
    """What a step would act on is not what the plan says it is (a snapshot that is
    not the backup's, a label that is not the catalog's, a data directory of another
    cluster...). Raised before the step changes anything."""


class BackendError(PgsnapError):
    """The storage backend refused or failed an operation (``backend``: its name)."""

    backend: str | None

    def __init__(
        self, message: str, *, backend: str | None = None, hint: str | None = None, **details: Any
    ) -> None:
        super().__init__(message, hint=hint, backend=backend, **details)


class VolumeNotFound(BackendError, LookupError):
    """No volume with that id exists on the backend (``volume_id``)."""

    volume_id: str

    def __init__(
        self,
        message: str,
        *,
        volume_id: str,
        backend: str | None = None,
        hint: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message, backend=backend, hint=hint, volume_id=volume_id, **details)


class SnapshotNotFound(BackendError, LookupError):
    """No snapshot (or snapshot group) with that id exists (``snapshot_id``)."""

    snapshot_id: str

    def __init__(
        self,
        message: str,
        *,
        snapshot_id: str,
        backend: str | None = None,
        hint: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message, backend=backend, hint=hint, snapshot_id=snapshot_id, **details)


class BackendUnavailable(BackendError):
    """The backend cannot be reached or timed out; retrying may succeed."""

    retryable: ClassVar[bool] = True


class SnapshotLimitError(BackendError):
    """The storage holds as many snapshots of a volume as it allows (a PowerFlex
    V-Tree, a mock with ``snapshot_limit``): no new snapshot of it can be taken
    until old ones are deleted (``volume_id`` and ``limit`` when known).

    ``pgsnap check`` warns before the limit is reached, when the backend
    reports its problems (:class:`~pgsnap.protocols.StorageHealth`).
    """


class AuthenticationError(BackendError):
    """The backend refused the credentials."""


class DatabaseError(PgsnapError):
    """PostgreSQL refused or failed an operation (``sqlstate`` when known)."""

    sqlstate: str | None

    def __init__(
        self, message: str, *, sqlstate: str | None = None, hint: str | None = None, **details: Any
    ) -> None:
        super().__init__(message, hint=hint, sqlstate=sqlstate, **details)


class BackupModeError(DatabaseError):
    """Entering or leaving backup mode failed, or its session was lost."""


class ServerRefusedError(DatabaseError):
    """The server is up (it answered) but refuses pgsnap's connection: a password
    that is wrong or missing, no ``pg_hba.conf`` line, no free connection slot."""


class HostError(PgsnapError):
    """The database host refused or failed an operation (``host``: how it was reached)."""

    host: str | None

    def __init__(
        self, message: str, *, host: str | None = None, hint: str | None = None, **details: Any
    ) -> None:
        super().__init__(message, hint=hint, host=host, **details)


class HostUnreachable(HostError):
    """The host cannot be reached (ssh could not connect); retrying may succeed."""

    retryable: ClassVar[bool] = True


class CommandError(HostError):
    """A command on the host exited non-zero (``argv``, ``returncode``, ``stderr``).

    ``stderr`` is the end of the command's error output, as text.
    """

    argv: tuple[str, ...]
    returncode: int
    stderr: str

    def __init__(
        self,
        message: str,
        *,
        argv: Sequence[str],
        returncode: int,
        stderr: str = "",
        host: str | None = None,
        hint: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(
            message,
            host=host,
            hint=hint,
            argv=tuple(argv),
            returncode=returncode,
            stderr=stderr,
            **details,
        )


class CommandTimeout(CommandError):
    """A command on the host did not finish within its timeout (``timeout`` seconds)."""


class HostFileNotFound(HostError, LookupError):
    """No file or directory at ``path`` on the host."""

    path: str

    def __init__(
        self,
        message: str,
        *,
        path: str,
        host: str | None = None,
        hint: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message, host=host, hint=hint, path=path, **details)


class MountError(HostError):
    """Mounting or unmounting ``target`` failed."""

    target: str

    def __init__(
        self,
        message: str,
        *,
        target: str,
        host: str | None = None,
        hint: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message, host=host, hint=hint, target=target, **details)


class MountBusyError(MountError):
    """Unmounting ``target`` was refused because processes use it.

    ``holders``: one line per process, ``"pid 4242 postgres (user postgres)"``.
    """

    holders: tuple[str, ...]

    def __init__(
        self,
        message: str,
        *,
        target: str,
        holders: Sequence[str] = (),
        host: str | None = None,
        hint: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(
            message, target=target, host=host, hint=hint, holders=tuple(holders), **details
        )


class DeviceNotFound(HostError, LookupError):
    """A block device did not appear on the host in time (``device``)."""

    device: str

    def __init__(
        self,
        message: str,
        *,
        device: str,
        host: str | None = None,
        hint: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message, host=host, hint=hint, device=device, **details)


class ArchiveError(PgsnapError):
    """The WAL archive cannot be listed or read."""


class ArchiveUnavailable(ArchiveError):
    """The WAL archive could not be reached (a network or storage failure, tried again
    and still there): it may pass. ``wal-get`` waits for it rather than say a file is
    missing."""


class ArchiveRefused(ArchiveError):
    """The WAL archive refuses (access denied, no such bucket or directory, a
    certificate that cannot be verified): asking again will not change it."""


class DamagedSegmentError(ArchiveError):
    """An archived WAL segment cannot be replayed: truncated, not WAL, another
    cluster's, or not the segment its name says (``name``, ``reason``)."""


class CatalogError(PgsnapError):
    """The backup catalog cannot be read or written."""


class BackupNotFound(CatalogError, LookupError):
    """No backup with that id is in the catalog."""


class CatalogLockedError(CatalogError):
    """Another process holds the catalog lock."""

    retryable: ClassVar[bool] = True


class CopyError(PgsnapError):
    """A copy of a backup off the array (a copy target: a directory or object
    storage) cannot be written or read."""


class CopyNotFound(CopyError, LookupError):
    """The copy target holds no copy (manifest) or chunk of that id."""


class CopyTargetRefused(CopyError):
    """The copy target refuses the request and asking again will not help: access
    denied, a bucket that does not exist, a TLS certificate that cannot be verified.
    Raised at the first answer, without retries."""


class DamagedChunkError(CopyError):
    """A stored chunk does not decode, or does not hash to its name (``chunk``)."""


class CopyKeyError(CopyError):
    """A copy is encrypted, and no key was given to read it, or not the key it was
    made with. ``copy_id`` names the copy, ``fingerprint`` its key's fingerprint
    (never the key); ``given`` the fingerprint of the key given ("" for none)."""

    copy_id: str
    fingerprint: str
    given: str

    def __init__(
        self,
        message: str,
        *,
        copy_id: str = "",
        fingerprint: str = "",
        given: str = "",
        hint: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(
            message, hint=hint, copy_id=copy_id, fingerprint=fingerprint, given=given, **details
        )


class CopyBusy(CopyError):
    """The copy target is busy: a garbage collection runs, so a copy may not start, or
    copies are in progress, so a garbage collection may not sweep.

    ``target``: the copy target's location. ``holders``: the markers in the way,
    each as ``{"marker", "host", "pid", "started_at", "refreshed_at"}``.
    """

    retryable: ClassVar[bool] = True
    target: str
    holders: tuple[Mapping[str, str | int], ...]

    def __init__(
        self,
        message: str,
        *,
        target: str,
        holders: Sequence[Mapping[str, str | int]] = (),
        hint: str | None = None,
        **details: Any,
    ) -> None:
        super().__init__(message, hint=hint, target=target, holders=tuple(holders), **details)


def check_keys(section: Iterable[Any], allowed: Sequence[str], where: str) -> None:
    """Refuse (:class:`ConfigurationError`) a key of a configuration section that is not
    in ``allowed``, naming the nearest valid one."""
    for key in section:
        if key in allowed:
            continue
        near = difflib.get_close_matches(str(key), allowed, n=1)
        takes = f"{where} takes: {', '.join(allowed)}"
        raise ConfigurationError(
            f"{where} has an unknown key {key!r}",
            hint=f"did you mean {near[0]!r}? {takes}" if near else takes,
            key=key,
        )
