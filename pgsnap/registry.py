"""Deprecated: moved to :mod:`pgsnap._registry` (internal: not API).

This alias warns when imported and is removed after the next release.
"""

from __future__ import annotations

from pgsnap._moved import warn_moved
from pgsnap._registry import *  # noqa: F403 - the moved module's names, as they were
from pgsnap._registry import __all__  # noqa: F401

warn_moved(__name__, "pgsnap._registry", " (internal; see docs/reference for the API)")
