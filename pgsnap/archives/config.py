"""The ``[archive]`` section of a configuration: which WAL archive, and how to reach it.

::

    [archive]
    path = "/srv/wal-archive"        # a directory PostgreSQL's archive_command fills
                                     # (format = "directory", the default for a path)

    [archive]
    path = "s3://wal/cluster1"       # pgsnap's own archive (format = "pgsnap", the
    endpoint_url = "https://s3.example.com"   # default for s3://): wal-push, wal-get
    credentials_file = "/etc/pgsnap/s3.credentials"
    key_file = "/etc/pgsnap/wal.key" # optional: encrypt what is pushed
    ahead = 8                        # segments fetched (and pushed) ahead
    parallel = 4                     # transfers at a time

``format = "pgsnap"`` with a directory ``path`` keeps pgsnap's archive in that
directory (an NFS mount). ``format = "pgbackrest"`` (with ``stanza``), ``"walg"``
and ``"barman"`` (with ``server``) read, never write, the archive those tools keep
at ``path`` (a directory or ``s3://``), through ``pgsnap.archives.<format>``;
``tool_config`` names the tool's own configuration for its restore command. The
S3 keys are those of ``[copies]`` (``endpoint_url``, ``region``,
``access_key_env``, ``secret_key_env``, ``credentials_file``, ``ca_bundle``); no
key is a secret. ``restore_command`` overrides the one pgsnap writes into
recoveries (``pgsnap -c <this file> wal-get %f %p`` for pgsnap's archive).
``spool`` is where ``wal-get`` keeps what it fetched ahead (default:
``pgsnap-spool`` beside ``%p``, in ``pg_wal``).

This module builds archives and stores from a section alone (``wal-push`` and
``wal-get`` start with it, without the rest of pgsnap).
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs

from pgsnap._attrs import frozen
from pgsnap.errors import (
    ArchiveError,
    ArchiveRefused,
    ArchiveUnavailable,
    ConfigurationError,
    check_keys,
)
from pgsnap.stores import DirectoryStore, ObjectStore, StoreErrors

if TYPE_CHECKING:
    from pgsnap.protocols import WalArchive

__all__ = [
    "ARCHIVE_FORMATS",
    "ARCHIVE_KEYS",
    "S3_OPTIONS",
    "ArchiveSettings",
    "archive_identity",
    "archive_settings",
    "fatal_unless_missing",
    "open_archive",
    "open_store",
]

ARCHIVE_FORMATS: Final = ("directory", "pgsnap", "pgbackrest", "walg", "barman")
"""What ``[archive] format`` may say: a directory, pgsnap's own archive, or (read only)
the archive of a pgBackRest repository, of WAL-G, of barman-cloud."""
_OTHER_TOOLS: Final = ("pgbackrest", "walg", "barman")
S3_OPTIONS: Final = (
    "endpoint_url",
    "region",
    "access_key_env",
    "secret_key_env",
    "credentials_file",
    "ca_bundle",
)
"""The options of an archive in S3 (none is a secret)."""
ARCHIVE_KEYS: Final = (
    "path",
    "format",
    "gzip",
    *S3_OPTIONS,
    "key_file",
    "spool",
    "ahead",
    "parallel",
    "restore_command",
    "stanza",
    "server",
    "tool_config",
)
"""The keys of ``[archive]``."""
ERRORS: Final = StoreErrors(failed=ArchiveUnavailable, missing=ArchiveError, refused=ArchiveRefused)
"""A WAL archive's store raises archive errors."""


@frozen
class ArchiveSettings:
    """``[archive]``, checked: ``location`` a path (absolute) or ``s3://bucket/prefix``;
    ``options`` the S3 options (paths made absolute); ``config`` the configuration
    file it came from ("" for a mapping)."""

    location: str
    format: str = "directory"
    gzip: bool = False
    options: Mapping[str, str] = attrs.field(factory=dict)
    key_file: str = ""
    spool: str = ""
    ahead: int = 8
    parallel: int = 4
    restore_command: str = ""
    config: str = ""
    stanza: str = ""
    """pgBackRest: the stanza whose archive is read."""
    server: str = ""
    """barman-cloud: the server name (the folder below the destination)."""
    tool_config: str = ""
    """The other tool's configuration file (pgBackRest's), for its restore command."""


def _text(section: Mapping[str, Any], key: str) -> str | None:
    value = section.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigurationError(
            f"[archive] {key} must be text, not {value!r}", hint=f'write {key} = "..."'
        )
    return value


def _count(section: Mapping[str, Any], key: str, default: int) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 256:
        raise ConfigurationError(
            f"[archive] {key} must be a number from 0 to 256, not {value!r}",
            hint=f"e.g. {key} = {default}",
        )
    return value


def archive_settings(
    section: Mapping[str, Any], rel: Callable[[str], str], *, config: str = ""
) -> ArchiveSettings:
    """The ``[archive]`` section checked (``rel`` makes a relative path absolute);
    :class:`~pgsnap.errors.ConfigurationError` saying what is wrong and what to
    write."""
    check_keys(section, ARCHIVE_KEYS, "[archive]")
    path = _text(section, "path")
    if not path:
        raise ConfigurationError(
            "[archive] lacks 'path'", hint='e.g. path = "/srv/wal-archive" or "s3://bucket/wal"'
        )
    s3 = path.startswith("s3://")
    fmt = _text(section, "format") or ("pgsnap" if s3 else "directory")
    if fmt not in ARCHIVE_FORMATS:
        raise ConfigurationError(
            f"[archive] format {fmt!r} is not one pgsnap reads",
            hint=f"use one of: {', '.join(ARCHIVE_FORMATS)}",
        )
    if s3 and fmt == "directory":
        raise ConfigurationError(
            "[archive] format 'directory' is a local directory, not s3://",
            hint='use format = "pgsnap" (pgsnap wal-push) for an archive in S3',
        )
    gzip = section.get("gzip", False)
    if not isinstance(gzip, bool):
        raise ConfigurationError(f"[archive] gzip must be true or false, not {gzip!r}")
    options = {}
    for key in S3_OPTIONS:
        value = _text(section, key)
        if value is not None:
            if not s3:
                raise ConfigurationError(
                    f"[archive] {key} is an S3 option, and the archive is a directory",
                    hint="remove it, or give an s3:// path",
                )
            options[key] = rel(value) if key in ("ca_bundle", "credentials_file") else value
    if fmt != "pgsnap":
        for key in ("key_file", "spool", "ahead", "parallel"):
            if key in section:
                raise ConfigurationError(
                    f"[archive] {key} is for pgsnap's own archive (format = 'pgsnap')",
                    hint="remove it: this archive is filled by your archive_command",
                )
    for key, only in (("stanza", "pgbackrest"), ("server", "barman")):
        if key in section and fmt != only:
            raise ConfigurationError(f"[archive] {key} is for format = {only!r}", hint="remove it")
        if fmt == only and not _text(section, key):
            raise ConfigurationError(
                f"[archive] format = {only!r} needs {key}",
                hint=f'e.g. {key} = "main"',
            )
    if "tool_config" in section and fmt not in _OTHER_TOOLS:
        raise ConfigurationError(
            "[archive] tool_config is the configuration of the tool that wrote the archive",
            hint="remove it",
        )
    key_file = _text(section, "key_file") or ""
    spool = _text(section, "spool") or ""
    return ArchiveSettings(
        location=path if s3 else rel(path),
        format=fmt,
        gzip=gzip,
        options=options,
        key_file=rel(key_file) if key_file else "",
        spool=rel(spool) if spool else "",
        ahead=_count(section, "ahead", 8),
        parallel=max(1, _count(section, "parallel", 4)),
        restore_command=_text(section, "restore_command") or "",
        config=config,
        stanza=_text(section, "stanza") or "",
        server=_text(section, "server") or "",
        tool_config=rel(_text(section, "tool_config") or "") if section.get("tool_config") else "",
    )


def open_store(
    location: str,
    options: Mapping[str, str],
    *,
    errors: StoreErrors = ERRORS,
    name: str = "the WAL archive",
    settings: str = "[archive]",
    connections: int = 8,
    attempts: int = 2,
) -> ObjectStore:
    """The object store at ``location``: ``s3://bucket/prefix`` with ``options``, or a
    directory. A request is tried ``attempts`` times (PostgreSQL tries a failed
    ``wal-push`` again itself, and ``wal-get`` waits for the archive)."""
    if location.startswith("s3://"):
        from pgsnap.stores.s3 import S3Store  # noqa: PLC0415 - botocore only when used

        bucket, _, prefix = location[len("s3://") :].partition("/")
        return S3Store(
            bucket,
            prefix,
            errors=errors,
            name=name,
            settings=settings,
            max_connections=connections,
            attempts=attempts,
            endpoint_url=options.get("endpoint_url"),
            region=options.get("region"),
            access_key_env=options.get("access_key_env"),
            secret_key_env=options.get("secret_key_env"),
            credentials_file=options.get("credentials_file"),
            ca_bundle=options.get("ca_bundle"),
        )
    return DirectoryStore(location, errors)


def fatal_unless_missing(command: str, missing: int) -> str:
    """``command`` (another tool's ``restore_command``) so that PostgreSQL ends a recovery
    only when the file is missing: the tool's exit status ``missing`` (its "not in
    the archive") becomes 1, any other failure 255, which PostgreSQL's startup
    process takes as fatal. Tools exit with small numbers for their errors too (an
    archive they cannot reach), which PostgreSQL would take for the end of the
    archive, ending the recovery early at a point the plan did not choose."""
    return f"{command}; rc=$?; [ $rc -eq 0 ] && exit 0; [ $rc -eq {missing} ] && exit 1; exit 255"


def archive_identity(settings: ArchiveSettings) -> str:
    """The archive ``settings`` describe, as a string (its format, location and
    endpoint): what notes of files pushed ahead are kept for."""
    endpoint = settings.options.get("endpoint_url", "")
    return f"{settings.format} {settings.location} {endpoint}".strip()


def wal_get_command(settings: ArchiveSettings, *, pgsnap: str | None = None) -> str:
    """The ``restore_command`` of pgsnap's archive, or ``[archive] restore_command``.

    ``<pgsnap> wal-get '%f' '%p'``, where ``pgsnap`` is the command's start (default:
    this Python, ``-m pgsnap -c CONFIG``, so that the command finds this pgsnap).
    With prefetch (``ahead`` > 0), the command first takes a segment the prefetcher
    put in the spool with a shell ``mv``, starting no Python::

        s=pg_wal/pgsnap-spool/'%f'; if [ -f "$s" ]; then mv -f "$s" '%p'; else ...; fi

    (the spool is relative to the data directory, where PostgreSQL runs the command,
    unless ``[archive] spool`` names one)."""
    if settings.restore_command:
        return settings.restore_command
    if pgsnap is None:
        if not settings.config:
            return ""
        pgsnap = f"{shlex.quote(sys.executable)} -m pgsnap -c {shlex.quote(settings.config)}"
        pgsnap = pgsnap.replace("%", "%%")
    get = f"{pgsnap} wal-get '%f' '%p'"
    if settings.ahead <= 0:
        return get
    spool = shlex.quote(settings.spool or "pg_wal/pgsnap-spool").replace("%", "%%")
    return f"""s={spool}/'%f'; if [ -f "$s" ]; then mv -f "$s" '%p'; else {get}; fi"""


def open_archive(settings: ArchiveSettings) -> WalArchive:
    """The archive ``settings`` describe."""
    if settings.format == "directory":
        from pgsnap.wal.archive import DirectoryWalArchive  # noqa: PLC0415

        return DirectoryWalArchive(settings.location, gzip=settings.gzip)
    if settings.format in _OTHER_TOOLS:
        # pgsnap.archives.<format>.open_archive(store, settings): a read-only view.
        module = importlib.import_module(f"pgsnap.archives.{settings.format}")
        store = open_store(
            settings.location,
            settings.options,
            name=f"the {settings.format} archive",
            connections=8,
        )
        archive: WalArchive = module.open_archive(store, settings)
        return archive
    from pgsnap.archives.store import StoreWalArchive  # noqa: PLC0415

    key = None
    if settings.key_file:
        from pgsnap.copies.keys import CopyKey  # noqa: PLC0415 - cryptography on use

        key = CopyKey.from_file(settings.key_file)
    store = open_store(
        settings.location, settings.options, connections=max(4, settings.parallel * 2)
    )
    return StoreWalArchive(store, key=key, restore_command=wal_get_command(settings) or None)


def default_spool(settings: ArchiveSettings, destination: str) -> str:
    """Where ``wal-get`` and ``wal-push`` keep their files: ``[archive] spool``, else
    ``pgsnap-spool`` in the directory of ``destination`` (``pg_wal``)."""
    if settings.spool:
        return settings.spool
    return os.path.join(os.path.dirname(os.path.abspath(destination)), "pgsnap-spool")
