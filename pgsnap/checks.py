"""Deprecated: ``check``'s findings moved to :mod:`pgsnap.planner.checks` (pure) and
the gathering of their facts to :mod:`pgsnap.observe` (``Observer.check_facts``).

This alias warns when imported and is removed after the next release.
"""

from __future__ import annotations

from pgsnap._moved import warn_moved
from pgsnap.observe import EmptyArchive, gather_check_facts, gather_storage_problems
from pgsnap.planner.checks import (
    DEFAULT_SEGMENT_SIZE,
    SAFETY_REMINDER,
    CheckFacts,
    check_findings,
)

__all__ = [
    "DEFAULT_SEGMENT_SIZE",
    "SAFETY_REMINDER",
    "CheckFacts",
    "EmptyArchive",
    "check_findings",
    "gather_check_facts",
    "gather_storage_problems",
]

warn_moved(
    __name__,
    "pgsnap.planner.checks (findings, CheckFacts) and pgsnap.observe (the gathering)",
)
