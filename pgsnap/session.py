"""Deprecated: moved to :mod:`pgsnap.cluster` (``pgsnap.Cluster`` is the usual way in).

This alias warns when imported and is removed after the next release.
"""

from __future__ import annotations

import warnings

from pgsnap.cluster import *  # noqa: F403 - the moved module's names, as they were
from pgsnap.cluster import __all__  # noqa: F401

warnings.warn(
    "pgsnap.session moved to pgsnap.cluster (use pgsnap.Cluster); "
    "the old name is removed after the next release",
    DeprecationWarning,
    stacklevel=2,
)
