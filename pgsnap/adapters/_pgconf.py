"""Pure text helpers of the PostgreSQL adapter (no I/O, no psycopg).

- configuration files: recovery settings in ``postgresql.auto.conf`` and
  stale targets in ``postgresql.conf``;
- secrets: redacting passwords out of connection strings and messages;
- the SQL that differs between PostgreSQL versions;
- setting values with units (``wal_segment_size``).

Everything here is unit-tested without a server.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

__all__ = [
    "BLOCK_BEGIN",
    "BLOCK_END",
    "DISABLED_PREFIX",
    "REDACTED",
    "archiver_settings",
    "backup_start_sql",
    "backup_stop_sql",
    "bytes_from_setting",
    "clear_auto_conf",
    "disable_recovery_targets",
    "is_recovery_parameter",
    "is_recovery_target",
    "redact",
    "replay_pause_sql",
    "rewrite_auto_conf",
    "server_settings",
    "set_instance_parameters",
    "strip_recovery_block",
]

BLOCK_BEGIN: Final = "# BEGIN pgsnap recovery settings"
"""First line of the block pgsnap appends to ``postgresql.auto.conf``."""
BLOCK_END: Final = "# END pgsnap recovery settings"
"""Last line of that block."""
DISABLED_PREFIX: Final = "#pgsnap-disabled# "
"""Prefix pgsnap puts before a stale ``recovery_target*`` line to disable it."""
REDACTED: Final = "********"
"""What a password is replaced with in messages."""

# name [=] value: PostgreSQL accepts "name = value" and "name value".
_PARAM_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.$]*)\s*(?:=|\s|$)")


# --------------------------------------------------------------------------- config files


def _param_name(line: str) -> str | None:
    """The parameter an active (uncommented) config line sets, lower case."""
    m = _PARAM_RE.match(line)
    if m is None:
        return None
    name = m.group(1).lower()
    if name in ("include", "include_if_exists", "include_dir"):
        return None
    return name


def is_recovery_target(name: str) -> bool:
    """True for ``recovery_target`` and every ``recovery_target_*`` parameter."""
    return name.lower().startswith("recovery_target")


def is_recovery_parameter(name: str) -> bool:
    """True for the parameters pgsnap owns at recovery: targets and ``restore_command``."""
    return is_recovery_target(name) or name.lower() == "restore_command"


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _newline_of(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def strip_recovery_block(text: str) -> str:
    """Remove pgsnap's marked block(s) from a config file's text.

    A block runs from a ``# BEGIN pgsnap recovery settings`` line to the
    next ``# END pgsnap recovery settings`` line. A BEGIN without END (a
    truncated edit) removes the BEGIN line and the recovery-parameter lines
    right after it, nothing else.
    """
    out: list[str] = []
    lines = _lines(text)
    i = 0
    while i < len(lines):
        if lines[i].strip().startswith(BLOCK_BEGIN):
            end = next(
                (j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(BLOCK_END)),
                None,
            )
            if end is not None:
                i = end + 1
                continue
            i += 1
            while i < len(lines):
                name = _param_name(lines[i])
                if name is None or not is_recovery_parameter(name):
                    break
                i += 1
            continue
        if lines[i].strip().startswith(BLOCK_END):  # a stray END line
            i += 1
            continue
        out.append(lines[i])
        i += 1
    return "".join(out)


def _without(text: str, *, targets_only: bool) -> str:
    keep = []
    for line in _lines(text):
        name = _param_name(line)
        drop = name is not None and (
            is_recovery_target(name) if targets_only else is_recovery_parameter(name)
        )
        if not drop:
            keep.append(line)
    return "".join(keep)


INSTANCE_BEGIN: Final = "# BEGIN pgsnap instance settings"
"""First line of the block of a clone's own settings in ``postgresql.auto.conf``."""
INSTANCE_END: Final = "# END pgsnap instance settings"


def set_instance_parameters(text: str, parameters: Mapping[str, str]) -> str:
    """``postgresql.auto.conf`` text with ``parameters`` set last (so they win).

    Removes an earlier instance block and every active line of those names, then
    appends a marked block. Applying it twice gives the same text.
    """
    lines = [f"{k} = {quote_value(v)}" for k, v in parameters.items()]
    for line in lines:
        if "\n" in line or "\r" in line:
            raise ValueError(f"a configuration line cannot contain a line break: {line!r}")
    names = {k.lower() for k in parameters}
    nl = _newline_of(text)
    out: list[str] = []
    inside = False
    for line in _lines(text):
        stripped = line.strip()
        if stripped.startswith(INSTANCE_BEGIN):
            inside = True
            continue
        if stripped.startswith(INSTANCE_END):
            inside = False
            continue
        if inside or _param_name(line) in names:
            continue
        out.append(line)
    body = "".join(out)
    if body and not body.endswith(("\n", "\r")):
        body += nl
    return body + nl.join([INSTANCE_BEGIN + " (a clone's own)", *lines, INSTANCE_END]) + nl


def quote_value(value: str) -> str:
    """Quote a value for postgresql.conf (backslashes escaped, single quotes doubled)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def rewrite_auto_conf(text: str, lines: Sequence[str]) -> str:
    """``postgresql.auto.conf`` text with ``lines`` as the only recovery settings.

    Removes an earlier pgsnap block and every active ``restore_command`` and
    ``recovery_target*`` line (two different targets are FATAL at start),
    then appends a new marked block. Applying it twice gives the same text.
    """
    for line in lines:
        if "\n" in line or "\r" in line:
            raise ValueError(f"a configuration line cannot contain a line break: {line!r}")
    nl = _newline_of(text)
    body = _without(strip_recovery_block(text), targets_only=False)
    if body and not body.endswith(("\n", "\r")):
        body += nl
    block = [BLOCK_BEGIN + " (written by pgsnap; removed by clear_recovery_settings)", *lines]
    block.append(BLOCK_END)
    return body + nl.join(block) + nl


def clear_auto_conf(text: str) -> str:
    """``postgresql.auto.conf`` text without pgsnap's block and without any target.

    Also drops unmarked ``recovery_target*`` lines (``ALTER SYSTEM`` rewrites
    the file and loses pgsnap's markers); an unmarked ``restore_command``
    stays, as it is harmless without ``recovery.signal``. Idempotent.
    """
    return _without(strip_recovery_block(text), targets_only=True)


def disable_recovery_targets(text: str) -> str:
    """``postgresql.conf`` text with active ``recovery_target*`` lines commented out.

    Each such line gets the prefix :data:`DISABLED_PREFIX`, so it is easy to
    find (and to re-enable by hand). Lines already commented are untouched;
    applying it twice gives the same text.
    """
    out = []
    for line in _lines(text):
        name = _param_name(line)
        if name is not None and is_recovery_target(name):
            out.append(DISABLED_PREFIX + line)
        else:
            out.append(line)
    return "".join(out)


# --------------------------------------------------------------------------- secrets

_CONNINFO_PW_RE = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s'][^\s]*)", re.IGNORECASE)
_URI_PW_RE = re.compile(r"(://[^:/@\s]*:)([^@\s]*)(@)")


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with passwords replaced by :data:`REDACTED`.

    Replaces every occurrence of each non-empty secret, ``password=...``
    keyword values and the password part of ``postgresql://user:pw@host``.
    """
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    text = _CONNINFO_PW_RE.sub(lambda m: m.group(1) + REDACTED, text)
    return _URI_PW_RE.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)


# --------------------------------------------------------------------------- SQL per version


def backup_start_sql(version_num: int) -> str:
    """SQL entering non-exclusive backup mode; parameters: label, fast."""
    if version_num >= 150000:
        return "SELECT pg_backup_start(%s, %s)::text"
    return "SELECT pg_start_backup(%s, %s, false)::text"


_STOP_TAIL: Final = " s, pg_control_checkpoint() c, pg_control_recovery() r"
_STOP_HEAD: Final = (
    "SELECT s.lsn::text, s.labelfile, s.spcmapfile, now(), "
    "CASE WHEN pg_is_in_recovery() THEN r.min_recovery_end_timeline ELSE c.timeline_id END "
    "FROM "
)


def backup_stop_sql(version_num: int) -> str:
    """SQL leaving backup mode without waiting for the archive.

    One statement returning (lsn, labelfile, spcmapfile, now, timeline), so
    the label cannot be lost to a failing follow-up query. The timeline is
    the stop point's: the current one on a primary, the minimum recovery
    point's on a standby.
    """
    if version_num >= 150000:
        return _STOP_HEAD + "pg_backup_stop(false)" + _STOP_TAIL
    return _STOP_HEAD + "pg_stop_backup(false, false)" + _STOP_TAIL


def replay_pause_sql(version_num: int) -> str:
    """SQL returning True when WAL replay is paused (not merely requested)."""
    if version_num >= 140000:
        return "SELECT pg_get_wal_replay_pause_state() = 'paused'"
    return "SELECT pg_is_wal_replay_paused()"


_SERVER_SETTINGS: Final = (
    "wal_level",
    "archive_mode",
    "archive_command",
    "archive_timeout",
    "full_page_writes",
    "data_checksums",
    "hot_standby",
)


def server_settings(version_num: int) -> tuple[str, ...]:
    """The settings :class:`~pgsnap.model.ServerFacts` reports for this version."""
    if version_num >= 150000:
        return (*_SERVER_SETTINGS, "archive_library")
    return _SERVER_SETTINGS


def archiver_settings(version_num: int) -> tuple[str, ...]:
    """The settings :class:`~pgsnap.model.ArchiverStatus` reports for this version."""
    base = ("wal_level", "archive_mode", "archive_command")
    return (*base, "archive_library") if version_num >= 150000 else base


_UNIT_BYTES: Final = {"B": 1, "kB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}
_UNIT_RE = re.compile(r"^(\d*)\s*(B|kB|MB|GB|TB)$")


def bytes_from_setting(setting: str, unit: str | None) -> int:
    """Bytes from a ``pg_settings`` (setting, unit) pair: ('16777216', 'B'), ('2048', '8kB')."""
    value = int(setting)
    if not unit:
        return value
    m = _UNIT_RE.match(unit.strip())
    if m is None:
        raise ValueError(f"unknown memory unit {unit!r}")
    return value * int(m.group(1) or 1) * _UNIT_BYTES[m.group(2)]
