"""The ``pgsnap`` command's entry point: ``wal-push``, ``wal-get`` and ``wal-prefetch``
(run by PostgreSQL, per file) go straight to :mod:`pgsnap.archives.commands`;
every other command to :mod:`pgsnap.cli`."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Sequence

from pgsnap._argv import WAL_COMMANDS, set_collector, subcommand

__all__ = ["main", "script"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``pgsnap`` command; its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if subcommand(args) in WAL_COMMANDS:
        from pgsnap.archives.commands import main as wal_main  # noqa: PLC0415 - lean

        return wal_main(args)
    from pgsnap.cli import main as cli_main  # noqa: PLC0415

    return cli_main(args)


def script() -> int:
    """The ``pgsnap`` console script and ``python -m pgsnap``: :func:`main` in a process of
    its own, with the cyclic garbage collector set for one.

    With ``PGSNAP_AGENT`` set (and the command not ``agent`` itself), the agent at that
    socket runs the command (:mod:`pgsnap.agent`); when it does not, this process does.

    The collector runs less often, or not at all for a command whose memory is bounded
    by what it reads (:func:`pgsnap._argv.set_collector`), and what is alive when
    the command ends is frozen (``gc.freeze``): the interpreter's last collection at
    exit skips it, and the process's memory goes with the process. Files, logs and
    connections are closed by then as in any run (the collector only ever finds
    cycles of objects nothing refers to). :func:`main` itself, which tests and
    programs call in their own process, leaves the collector alone.
    """
    args = sys.argv[1:]
    agent = os.environ.get("PGSNAP_AGENT")
    if agent and subcommand(args) != "agent":
        from pgsnap.agent import request  # noqa: PLC0415 - the standard library only

        served = request(agent, args)
        if served is not None:
            return served
    set_collector(args)
    code = main(args)
    gc.freeze()
    return code
