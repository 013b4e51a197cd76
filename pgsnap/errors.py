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
    │   ├── TargetError                     bad recovery target (naive time, two targets)
    │   └── FormatError                     JSON of an unknown major format version, bad shape
    ├── ConfigurationError (ValueError)     settings that cannot work together
    │   └── BackendNotFound (LookupError)   no backend registered under that name
    ├── PlanningError                       the request cannot succeed; says why and the alternative
    │   ├── UnsupportedCapability           the backend lacks what the plan needs
    │   ├── NoBackupForTarget               no DONE backup can reach the target
    │   ├── TargetOutOfRange                target before consistency or past the archive's end
    │   ├── WalGapError                     segments missing between backup and target
    │   ├── TimelineError                   target timeline does not contain the backup
    │   └── PreflightError                  a backup preflight check failed
    ├── StalePlanError                      the facts changed since the plan was made
    ├── ExecutionError                      a step of a plan failed (step_id)
    ├── BackendError                        the storage refused or failed (backend)
    │   ├── VolumeNotFound (LookupError)
    │   ├── SnapshotNotFound (LookupError)
    │   ├── BackendUnavailable              retryable: network, timeouts, 5xx
    │   └── AuthenticationError
    ├── DatabaseError                       PostgreSQL refused or failed (sqlstate)
    │   └── BackupModeError                 backup start/stop failed or session lost
    ├── ArchiveError                        the WAL archive cannot be read
    └── CatalogError                        the catalog cannot be read or written
        ├── BackupNotFound (LookupError)
        └── CatalogLockedError              another writer holds the lock
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "ArchiveError",
    "AuthenticationError",
    "BackendError",
    "BackendNotFound",
    "BackendUnavailable",
    "BackupFileError",
    "BackupModeError",
    "BackupNotFound",
    "CatalogError",
    "CatalogLockedError",
    "ConfigurationError",
    "DatabaseError",
    "ExecutionError",
    "FormatError",
    "HistoryFileError",
    "InputError",
    "LSNError",
    "NoBackupForTarget",
    "PgsnapError",
    "PlanningError",
    "PreflightError",
    "SnapshotNotFound",
    "StalePlanError",
    "TargetError",
    "TargetOutOfRange",
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


class TargetError(InputError):
    """A recovery target is invalid (naive time, several targets, bad value)."""


class FormatError(InputError):
    """Serialized data (JSON) has the wrong shape or an unsupported format version."""


class ConfigurationError(PgsnapError, ValueError):
    """Settings that cannot work (missing volume for a role, conflicting options)."""


class BackendNotFound(ConfigurationError, LookupError):
    """No storage backend is registered under the requested name."""


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

    Attributes: ``missing`` (the missing segment names, in order) and
    ``reachable_lsn`` (the last LSN that can be reached without a gap).
    """

    missing: tuple[str, ...]
    reachable_lsn: object


class TimelineError(PlanningError):
    """The target timeline's history does not contain the backup."""


class PreflightError(PlanningError):
    """A blocking preflight finding prevents the backup."""


class StalePlanError(PgsnapError):
    """The facts a plan was made from have changed; plan again."""


class ExecutionError(PgsnapError):
    """A step of a plan failed while executing (``step_id``)."""

    step_id: str


class BackendError(PgsnapError):
    """The storage backend refused or failed an operation."""


class VolumeNotFound(BackendError, LookupError):
    """No volume with that id exists on the backend (``volume_id``)."""

    volume_id: str


class SnapshotNotFound(BackendError, LookupError):
    """No snapshot (or snapshot group) with that id exists (``snapshot_id``)."""

    snapshot_id: str


class BackendUnavailable(BackendError):
    """The backend cannot be reached or timed out; retrying may succeed."""

    retryable: ClassVar[bool] = True


class AuthenticationError(BackendError):
    """The backend refused the credentials."""


class DatabaseError(PgsnapError):
    """PostgreSQL refused or failed an operation (``sqlstate`` when known)."""

    sqlstate: str | None


class BackupModeError(DatabaseError):
    """Entering or leaving backup mode failed, or its session was lost."""


class ArchiveError(PgsnapError):
    """The WAL archive cannot be listed or read."""


class CatalogError(PgsnapError):
    """The backup catalog cannot be read or written."""


class BackupNotFound(CatalogError, LookupError):
    """No backup with that id is in the catalog."""


class CatalogLockedError(CatalogError):
    """Another process holds the catalog lock."""

    retryable: ClassVar[bool] = True
