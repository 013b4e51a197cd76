"""Deprecated: moved to :mod:`pgsnap.wal.dump` (and the face :mod:`pgsnap.wal`).

This alias warns when imported and is removed after the next release.
"""

from __future__ import annotations

import warnings

from pgsnap.wal.dump import *  # noqa: F403 - the moved module's names, as they were
from pgsnap.wal.dump import __all__  # noqa: F401

warnings.warn(
    "pgsnap.waldump moved to pgsnap.wal.dump (most names are in pgsnap.wal); "
    "the old name is removed after the next release",
    DeprecationWarning,
    stacklevel=2,
)
