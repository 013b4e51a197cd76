"""``pgsnap wal-push``, ``wal-get`` and ``wal-prefetch``: run by PostgreSQL, per file.

They read the ``[archive]`` section of the configuration alone and import only
what moving a file needs (the ``pgsnap`` command dispatches them before the rest
of pgsnap is imported: an ``archive_command`` starts once per segment).

Exit codes: 0 done. ``wal-push``: 1 the file could not be pushed (PostgreSQL
tries again), 2 bad usage or configuration. ``wal-get``: 1 the archive does not
hold the file (PostgreSQL's end of the archive); any other failure (an archive
that stays unreachable, a damaged file, a bad configuration) is 255, which
PostgreSQL takes as fatal: its recovery stops instead of ending early and
promoting at the wrong point.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

from pgsnap.archives.config import (
    ArchiveSettings,
    archive_identity,
    archive_settings,
    default_spool,
    open_archive,
)
from pgsnap.archives.transfer import (
    get_wal,
    is_segment,
    note_wanted,
    prefetch,
    prefetching,
    push_wal,
    pushed_ahead,
    take_from_spool,
)
from pgsnap.errors import ConfigurationError, PgsnapError

if TYPE_CHECKING:
    from pgsnap.archives.store import StoreWalArchive

__all__ = ["FATAL", "WAL_COMMANDS", "main"]

log = logging.getLogger(__name__)

WAL_COMMANDS: Final = ("wal-push", "wal-get", "wal-prefetch")
"""The commands this module runs."""
FATAL: Final = 255
"""``wal-get``'s exit status for a failure that is not "not in the archive": above
125, which PostgreSQL's startup process treats as fatal."""


def _settings(config: str) -> ArchiveSettings:
    path = Path(config)
    try:
        conf = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigurationError(f"cannot read configuration {config}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"configuration {config} is not valid TOML: {exc}") from None
    section = conf.get("archive")
    if not isinstance(section, dict):
        raise ConfigurationError(
            f"configuration {config} has no [archive] section",
            hint="wal-push and wal-get need the archive they write and read",
        )
    base = path.resolve().parent
    return archive_settings(section, lambda v: str(base / v), config=str(path.resolve()))


def _store_archive(settings: ArchiveSettings, command: str) -> StoreWalArchive:
    from pgsnap.archives.store import StoreWalArchive  # noqa: PLC0415 - only when needed

    archive = open_archive(settings)
    if not isinstance(archive, StoreWalArchive):
        raise ConfigurationError(
            f"pgsnap {command} works on pgsnap's own archive, and [archive] format is "
            f"{settings.format!r}",
            hint="set [archive] format = 'pgsnap' (and a path: a directory or s3://...)",
        )
    return archive


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pgsnap", add_help=True)
    parser.add_argument("-c", "--config", required=True, help="the configuration file")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    sub = parser.add_subparsers(dest="command", required=True)
    push = sub.add_parser("wal-push", help="archive a WAL file (archive_command ... %%p)")
    push.add_argument("path", help="the file, as PostgreSQL gives it (%%p)")
    push.add_argument("--ahead", type=int, help="files marked ready pushed with it")
    get = sub.add_parser("wal-get", help="fetch a WAL file (restore_command ... %%f %%p)")
    get.add_argument("name", help="the file's name (%%f)")
    get.add_argument("destination", help="where PostgreSQL wants it (%%p)")
    get.add_argument("--ahead", type=int, help="segments fetched ahead (0: none)")
    pre = sub.add_parser("wal-prefetch", help="(started by wal-get) fetch segments ahead")
    pre.add_argument("spool", help="the spool directory")
    return parser


def _start_prefetcher(config: str, spool: str) -> None:
    """Start ``wal-prefetch`` in the background, detached from PostgreSQL's call, with
    this pgsnap (its directory first on the path)."""
    argv = [sys.executable, "-m", "pgsnap", "-c", config, "wal-prefetch", spool]
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        env=env,
    )


def main(argv: Sequence[str]) -> int:
    """Run one of :data:`WAL_COMMANDS`; its exit code."""
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
        # A restore_command that does not parse must stop a recovery, not end it.
        return FATAL if code and "wal-get" in argv else code
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="pgsnap %(levelname)s: %(message)s",
    )
    try:
        settings = _settings(args.config)
        if args.command == "wal-push":
            ahead = settings.ahead if args.ahead is None else args.ahead
            spool = default_spool(settings, args.path)
            identity = archive_identity(settings)
            if pushed_ahead(spool, args.path, identity):  # no archive opened
                return 0
            archive = _store_archive(settings, args.command)
            push_wal(
                archive,
                args.path,
                spool=spool,
                ahead=ahead,
                parallel=settings.parallel,
                identity=identity,
            )
            return 0
        if args.command == "wal-get":
            ahead = settings.ahead if args.ahead is None else args.ahead
            spool = default_spool(settings, args.destination)
            if ahead > 0 and is_segment(args.name):  # the spool first: no archive opened
                note_wanted(spool, args.name)
                if not prefetching(spool):
                    _start_prefetcher(settings.config, spool)
                if take_from_spool(spool, args.name, args.destination):
                    return 0
            archive = _store_archive(settings, args.command)
            found = get_wal(archive, args.name, args.destination)
            if not found:
                log.info("%s is not in the archive", args.name)
            return 0 if found else 1
        archive = _store_archive(settings, args.command)
        prefetch(archive, args.spool, ahead=settings.ahead, parallel=settings.parallel)
        return 0
    except (PgsnapError, OSError) as exc:
        log.error("%s: %s", args.command, exc)
        if args.command == "wal-get":
            return FATAL
        return 2 if isinstance(exc, ConfigurationError) else 1
