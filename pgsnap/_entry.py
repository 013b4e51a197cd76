"""The ``pgsnap`` command's entry point: ``wal-push``, ``wal-get`` and ``wal-prefetch``
(run by PostgreSQL, per file) go straight to :mod:`pgsnap.archives.commands`;
every other command to :mod:`pgsnap.cli`."""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence

__all__ = ["main", "script"]

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


_FIRST_THRESHOLD = 20_000
"""The collector's first threshold in the ``pgsnap`` process (Python's default: 700):
importing pgsnap and psycopg makes some 200 classes and tens of thousands of objects
that live as long as the process, and a pass over them every 700 allocations is
30-50 ms of a command that takes half a second. A long command still collects."""


def script() -> int:
    """The ``pgsnap`` console script and ``python -m pgsnap``: :func:`main` in a process of
    its own, with the cyclic garbage collector set for one.

    The collector runs less often (:data:`_FIRST_THRESHOLD`), and what is alive when
    the command ends is frozen (``gc.freeze``): the interpreter's last collection at
    exit skips it, and the process's memory goes with the process. Files, logs and
    connections are closed by then as in any run (the collector only ever finds
    cycles of objects nothing refers to). :func:`main` itself, which tests and
    programs call in their own process, leaves the collector alone.
    """
    first, *older = gc.get_threshold()
    gc.set_threshold(max(first, _FIRST_THRESHOLD), *older)
    code = main()
    gc.freeze()
    return code
