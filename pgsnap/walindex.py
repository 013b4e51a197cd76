"""Deprecated: moved to :mod:`pgsnap.wal.contents` (and the face :mod:`pgsnap.wal`).

This alias warns when imported and is removed after the next release.
"""

from __future__ import annotations

from pgsnap._moved import warn_moved
from pgsnap.wal.contents import *  # noqa: F403 - the moved module's names, as they were
from pgsnap.wal.contents import __all__  # noqa: F401

warn_moved(__name__, "pgsnap.wal.contents", " (most names are in pgsnap.wal)")
