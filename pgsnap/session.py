"""Deprecated: moved to :mod:`pgsnap.cluster` (``pgsnap.Cluster`` is the usual way in).

This alias warns when imported and is removed after the next release.
"""

from __future__ import annotations

from pgsnap._moved import warn_moved
from pgsnap.cluster import *  # noqa: F403 - the moved module's names, as they were
from pgsnap.cluster import __all__  # noqa: F401

warn_moved(__name__, "pgsnap.cluster", " (use pgsnap.Cluster)")
