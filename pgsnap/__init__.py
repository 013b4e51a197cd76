"""pgsnap: storage-snapshot backups and point-in-time recovery for PostgreSQL.

Observe → plan (pure) → plan as data → execute. See the docs/ folder.
Importing pgsnap is cheap: it imports neither requests nor psycopg; a backend
or adapter loads its own dependencies when it is used.
"""

from __future__ import annotations

import logging

from pgsnap.errors import PgsnapError
from pgsnap.model import (
    LSN,
    BackupRecord,
    BackupState,
    Layout,
    RecoveryTarget,
    Snapshot,
    SnapshotGroup,
    TargetKind,
    Volume,
    VolumeRole,
)

__version__ = "0.1.0"

__all__ = [
    "LSN",
    "BackupRecord",
    "BackupState",
    "Layout",
    "PgsnapError",
    "RecoveryTarget",
    "Snapshot",
    "SnapshotGroup",
    "TargetKind",
    "Volume",
    "VolumeRole",
    "__version__",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())
