"""The ``pgsnap`` command's entry point: ``wal-push``, ``wal-get`` and ``wal-prefetch``
(run by PostgreSQL, per file) go straight to :mod:`pgsnap.archives.commands`;
every other command to :mod:`pgsnap.cli`."""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]

_WAL: tuple[str, ...] = ("wal-push", "wal-get", "wal-prefetch")


def _command(argv: Sequence[str]) -> str | None:
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``pgsnap`` command; its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if _command(args) in _WAL:
        from pgsnap.archives.commands import main as wal_main  # noqa: PLC0415 - lean

        return wal_main(args)
    from pgsnap.cli import main as cli_main  # noqa: PLC0415

    return cli_main(args)
