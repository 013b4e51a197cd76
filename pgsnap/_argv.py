"""The ``pgsnap`` command line's first word, found without importing anything: the
entry point (:mod:`pgsnap._entry`) routes on it before loading the command's modules,
and the agent's forks (:mod:`pgsnap.cli`, ``pgsnap agent``) route the same way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

__all__ = ["WAL_COMMANDS", "subcommand"]

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
