"""pgsnap: storage-snapshot backups and point-in-time recovery for PostgreSQL.

Observe → plan (pure) → plan as data → execute. See the docs/ folder.

The working set is offered here, imported lazily on first use (``import
pgsnap`` itself imports only this module, :mod:`pgsnap.errors` and the version;
``pgsnap.Cluster`` imports the facade when first asked for)::

    import pgsnap

    cluster = pgsnap.Cluster.from_config("pgsnap.toml")   # or a dict of that shape
    plan = cluster.plan_recovery(pgsnap.RecoveryTarget.time("2026-11-30 12:00+00:00"))

Neither psycopg nor requests is imported until a backend or adapter that
needs it is used.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any, Final

from pgsnap import errors as _errors  # small and dependency-free: its names are listed here
from pgsnap._version import __version__

_WHERE: Final[dict[str, str]] = {
    **dict.fromkeys(_errors.__all__, "pgsnap.errors"),  # every error
    **dict.fromkeys(
        (
            "LSN",
            "BackupRecord",
            "BackupState",
            "Layout",
            "Location",
            "Mount",
            "RecoveryAction",
            "RecoveryTarget",
            "RestorePreparation",
            "RestoreProfile",
            "Snapshot",
            "SnapshotGroup",
            "StorageProblem",
            "TargetKind",
            "Volume",
            "VolumeRole",
        ),
        "pgsnap.model",
    ),
    **dict.fromkeys(
        (
            "Capability",
            "Catalog",
            "DatabaseAdapter",
            "Runner",
            "StorageBackend",
            "StorageHealth",
            "WalArchive",
        ),
        "pgsnap.protocols",
    ),
    "Plan": "pgsnap.plan",
    "Step": "pgsnap.plan",
    "BackupRequest": "pgsnap.planner.backup",
    "RecoveryRequest": "pgsnap.planner.recovery",
    "Cluster": "pgsnap.cluster",
    "Executor": "pgsnap.executor",
    "Host": "pgsnap.host",
    "LocalRunner": "pgsnap.host",
    "SshRunner": "pgsnap.host",
    "Operation": "pgsnap.operations",
    "register_operation": "pgsnap.operations",
    "create_backend": "pgsnap.backends",
    "register_backend": "pgsnap.backends",
}

__all__ = [
    "LSN",
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
    "BackupRecord",
    "BackupRequest",
    "BackupState",
    "Capability",
    "Catalog",
    "CatalogError",
    "CatalogLockedError",
    "Cluster",
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
    "DatabaseAdapter",
    "DatabaseError",
    "DeviceNotFound",
    "ExecutionError",
    "Executor",
    "FormatError",
    "HistoryFileError",
    "Host",
    "HostError",
    "HostFileNotFound",
    "HostUnreachable",
    "InputError",
    "InvalidPlanError",
    "InvariantError",
    "LSNError",
    "Layout",
    "LocalRunner",
    "Location",
    "LockLostError",
    "Mount",
    "MountBusyError",
    "MountError",
    "NoBackupForTarget",
    "Operation",
    "OperationNotFound",
    "PgsnapError",
    "Plan",
    "PlanAlreadyRunError",
    "PlanLockedError",
    "PlanningError",
    "PreflightError",
    "RecoveryAction",
    "RecoveryRequest",
    "RecoveryTarget",
    "RestorePreparation",
    "RestoreProfile",
    "Runner",
    "ServerRefusedError",
    "Snapshot",
    "SnapshotGroup",
    "SnapshotLimitError",
    "SnapshotNotFound",
    "SshRunner",
    "StalePlanError",
    "Step",
    "StorageBackend",
    "StorageHealth",
    "StorageProblem",
    "TargetError",
    "TargetKind",
    "TargetOutOfRange",
    "TimeError",
    "TimelineError",
    "UnsupportedCapability",
    "Volume",
    "VolumeNotFound",
    "VolumeRole",
    "WalArchive",
    "WalGapError",
    "WalNameError",
    "__version__",
    "create_backend",
    "register_backend",
    "register_operation",
]

if TYPE_CHECKING:
    from pgsnap.backends import create_backend, register_backend
    from pgsnap.cluster import Cluster
    from pgsnap.errors import (
        ArchiveError,
        ArchiveRefused,
        ArchiveUnavailable,
        AuthenticationError,
        BackendError,
        BackendNotFound,
        BackendUnavailable,
        BackupFileError,
        BackupModeError,
        BackupNotFound,
        CatalogError,
        CatalogLockedError,
        CommandError,
        CommandTimeout,
        ConfigurationError,
        CopyBusy,
        CopyError,
        CopyKeyError,
        CopyNotFound,
        CopyTargetRefused,
        DamagedChunkError,
        DatabaseError,
        DeviceNotFound,
        ExecutionError,
        FormatError,
        HistoryFileError,
        HostError,
        HostFileNotFound,
        HostUnreachable,
        InputError,
        InvalidPlanError,
        LSNError,
        MountBusyError,
        MountError,
        NoBackupForTarget,
        OperationNotFound,
        PgsnapError,
        PlanAlreadyRunError,
        PlanLockedError,
        PlanningError,
        PreflightError,
        SnapshotLimitError,
        SnapshotNotFound,
        StalePlanError,
        TargetError,
        TargetOutOfRange,
        TimeError,
        TimelineError,
        UnsupportedCapability,
        VolumeNotFound,
        WalGapError,
        WalNameError,
    )
    from pgsnap.executor import Executor
    from pgsnap.host import Host, LocalRunner, SshRunner
    from pgsnap.model import (
        LSN,
        BackupRecord,
        BackupState,
        Layout,
        Location,
        Mount,
        RecoveryAction,
        RecoveryTarget,
        RestorePreparation,
        RestoreProfile,
        Snapshot,
        SnapshotGroup,
        StorageProblem,
        TargetKind,
        Volume,
        VolumeRole,
    )
    from pgsnap.operations import Operation, register_operation
    from pgsnap.plan import Plan, Step
    from pgsnap.planner.backup import BackupRequest
    from pgsnap.planner.recovery import RecoveryRequest
    from pgsnap.protocols import (
        Capability,
        Catalog,
        DatabaseAdapter,
        Runner,
        StorageBackend,
        StorageHealth,
        WalArchive,
    )


def __getattr__(name: str) -> Any:
    """Import a name of the working set on first use (PEP 562)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'pgsnap' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)


logging.getLogger(__name__).addHandler(logging.NullHandler())
