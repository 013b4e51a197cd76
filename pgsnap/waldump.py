"""Deprecated: moved to :mod:`pgsnap.wal.dump` (and the face :mod:`pgsnap.wal`).

This alias warns when imported and is removed after the next release.
"""

from __future__ import annotations

from pgsnap._moved import warn_moved
from pgsnap.wal.dump import *  # noqa: F403 - the moved module's names, as they were
from pgsnap.wal.dump import __all__  # noqa: F401

warn_moved(__name__, "pgsnap.wal.dump", " (most names are in pgsnap.wal)")
