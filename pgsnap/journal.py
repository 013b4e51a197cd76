"""Deprecated: moved to :mod:`pgsnap._journal` (internal: not API).

This alias warns when imported and is removed after the next release.
"""

from __future__ import annotations

from pgsnap._journal import *  # noqa: F403 - the moved module's names, as they were
from pgsnap._journal import __all__  # noqa: F401
from pgsnap._moved import warn_moved

warn_moved(__name__, "pgsnap._journal", " (internal; see docs/reference for the API)")
