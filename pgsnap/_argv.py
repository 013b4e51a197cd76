"""The ``pgsnap`` command line's first word, found without importing anything: the
entry point (:mod:`pgsnap._entry`) routes on it before loading the command's modules,
and the agent's forks (:mod:`pgsnap.cli`, ``pgsnap agent``) route the same way, and set
the garbage collector for it (:func:`set_collector`)."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Final

__all__ = ["FIRST_THRESHOLD", "UNCOLLECTED", "WAL_COMMANDS", "set_collector", "subcommand"]

WAL_COMMANDS: Final[tuple[str, ...]] = ("wal-push", "wal-get", "wal-prefetch")
"""The commands PostgreSQL runs once per WAL file: :mod:`pgsnap.archives.commands`
runs them without the rest of pgsnap."""


def subcommand(argv: Sequence[str]) -> str | None:
    """The subcommand of ``argv`` (the first word that is not an option or its value)."""
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word in ("-c", "--config"):
            skip = True
            continue
        if word.startswith("-"):
            continue
        return word
    return None


FIRST_THRESHOLD: Final = 20_000
"""The collector's first threshold in the ``pgsnap`` process (Python's default: 700):
importing pgsnap and psycopg makes some 200 classes and tens of thousands of objects
that live as long as the process, and a pass over them every 700 allocations is
30-50 ms of a command that takes half a second. A long command still collects."""

UNCOLLECTED: Final = frozenset({"backup", "list", "plan-recovery", "timeline"})
"""Commands whose memory is bounded by what they read (a backup's plan, its few steps
and the polls of its WAL wait; the others read and report): the collector is off
while one runs in a process of its own. Over a catalog of 10,000 backups its passes
(one of them over every record, once the catalog is read) cost 30-60 ms of a
half-second ``plan-recovery``, and found only the cycles importing leaves behind (some
9,000 objects, all made before the command's work); in a backup, about 15 ms of
passes over what importing psycopg and pgsnap made."""


def set_collector(argv: Sequence[str]) -> None:
    """Set the cyclic garbage collector for the command ``argv`` in a process of its own
    (the ``pgsnap`` process, or a fork of the agent): off for :data:`UNCOLLECTED`,
    else collecting less often (:data:`FIRST_THRESHOLD`)."""
    if subcommand(argv) in UNCOLLECTED:
        gc.disable()
        return
    first, *older = gc.get_threshold()
    gc.set_threshold(max(first, FIRST_THRESHOLD), *older)
