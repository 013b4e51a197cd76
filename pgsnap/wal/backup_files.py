"""``.backup`` history files and ``backup_label`` (pure).

:func:`parse_backup_file` and :func:`parse_backup_label` read what
``pg_backup_stop`` writes to the archive and returns as the label.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Final

from pgsnap._attrs import frozen
from pgsnap.errors import (
    BackupFileError,
    LSNError,
)
from pgsnap.model import LSN

__all__ = [
    "BackupHistoryFile",
    "parse_backup_file",
    "parse_backup_label",
]


_U32: Final = 0xFFFFFFFF


@frozen
class BackupHistoryFile:
    """A parsed ``.backup`` history file or ``backup_label``.

    A ``backup_label`` has no STOP lines, so the ``stop_*`` fields are None.
    Times are aware datetimes when the zone printed by PostgreSQL (``%Z`` of
    ``log_timezone``) could be resolved: ``UTC``/``GMT``, numeric offsets such
    as ``+03`` or ``-03:30``, or an abbreviation that matches the
    ``log_timezone`` passed to the parser. Otherwise the time is None and the
    text is kept in ``start_time_text``/``stop_time_text`` (always set when the
    line was present).
    """

    start_lsn: LSN
    start_wal_file: str
    checkpoint_lsn: LSN
    start_timeline: int
    stop_lsn: LSN | None = None
    stop_wal_file: str | None = None
    stop_timeline: int | None = None
    backup_method: str | None = None
    backup_from: str | None = None
    start_time: dt.datetime | None = None
    stop_time: dt.datetime | None = None
    label: str | None = None
    start_time_text: str | None = None
    stop_time_text: str | None = None
    incremental_from_lsn: LSN | None = None
    incremental_from_tli: int | None = None

    @property
    def is_incremental(self) -> bool:
        """True for a PostgreSQL 17+ incremental backup (``INCREMENTAL FROM`` lines)."""
        return self.incremental_from_lsn is not None


_LOC_RE: Final = re.compile(r"([0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}) \(file ([0-9A-Fa-f]{24})\)")
_TIME_RE: Final = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{1,6})?)(?: (\S+))?")
_OFFSET_RE: Final = re.compile(r"([+-])(\d{1,2})(?::?(\d{2}))?(?::?(\d{2}))?")


def _parse_pg_time(text: str, zone: dt.tzinfo | None) -> dt.datetime | None:
    """Parse ``%Y-%m-%d %H:%M:%S %Z``; None when the zone cannot be resolved."""
    m = _TIME_RE.fullmatch(text.strip())
    if m is None:
        return None
    try:
        naive = dt.datetime.fromisoformat(m.group(1))
    except ValueError:
        return None
    abbrev = m.group(2)
    if abbrev is None:
        return None
    if abbrev.upper() in ("UTC", "GMT", "UCT", "Z", "ZULU", "UNIVERSAL"):
        return naive.replace(tzinfo=dt.UTC)
    om = _OFFSET_RE.fullmatch(abbrev)
    if om is not None:
        sign = -1 if om.group(1) == "-" else 1
        h, mi, s = int(om.group(2)), int(om.group(3) or 0), int(om.group(4) or 0)
        if h > 15 or mi > 59 or s > 59:
            return None
        offset = dt.timedelta(hours=h, minutes=mi, seconds=s) * sign
        return naive.replace(tzinfo=dt.timezone(offset))
    if zone is not None:
        for fold in (0, 1):
            cand = naive.replace(tzinfo=zone, fold=fold)
            if cand.tzname() == abbrev:
                return cand
    return None


def _bad_backup(msg: str, what: str, **details: object) -> BackupFileError:
    return BackupFileError(
        f"{what}: {msg}",
        hint=f"pass the exact text of the {what} as PostgreSQL wrote it",
        **details,
    )


def _parse_backup_text(
    text: str, what: str, *, need_stop: bool, log_timezone: dt.tzinfo | None
) -> BackupHistoryFile:
    if not isinstance(text, str):
        raise _bad_backup(f"expected text, not {type(text).__name__}", what)
    fields: dict[str, tuple[int, str]] = {}
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw.rstrip("\r")
        key, sep, value = line.partition(": ")
        if not sep:
            if line.endswith(":"):  # e.g. "LABEL:" with an empty value
                key, value = line[:-1], ""
            else:
                continue  # unknown or blank lines are ignored
        key = key.strip().upper()
        fields.setdefault(key, (lineno, value))

    def loc(key: str) -> tuple[LSN, str] | None:
        got = fields.get(key)
        if got is None:
            return None
        lineno, value = got
        m = _LOC_RE.fullmatch(value.strip())
        if m is None:
            raise _bad_backup(
                f"line {lineno}: {key} must look like '0/4000028 (file "
                f"000000010000000000000004)', got {value!r}",
                what,
                line=lineno,
            )
        return LSN.parse(m.group(1)), m.group(2).upper()

    def lsn(key: str) -> LSN | None:
        got = fields.get(key)
        if got is None:
            return None
        lineno, value = got
        try:
            return LSN.parse(value.strip())
        except LSNError:
            raise _bad_backup(
                f"line {lineno}: {key} is not an LSN: {value!r}", what, line=lineno
            ) from None

    def tli(key: str) -> int | None:
        got = fields.get(key)
        if got is None:
            return None
        lineno, value = got
        v = value.strip()
        if not (v.isascii() and v.isdigit()) or not 1 <= int(v) <= _U32:
            raise _bad_backup(
                f"line {lineno}: {key} is not a timeline id: {value!r}", what, line=lineno
            )
        return int(v)

    def text_of(key: str) -> str | None:
        got = fields.get(key)
        return None if got is None else got[1].strip()

    start = loc("START WAL LOCATION")
    if start is None:
        raise _bad_backup("no 'START WAL LOCATION' line", what)
    checkpoint = lsn("CHECKPOINT LOCATION")
    if checkpoint is None:
        raise _bad_backup("no 'CHECKPOINT LOCATION' line", what)
    stop = loc("STOP WAL LOCATION")
    if need_stop and stop is None:
        raise _bad_backup(
            "no 'STOP WAL LOCATION' line (is this a backup_label? use parse_backup_label)", what
        )
    start_file_tli = int(start[1][:8], 16)
    start_tli = tli("START TIMELINE")
    if start_tli is None:
        start_tli = start_file_tli
    elif start_tli != start_file_tli:
        raise _bad_backup(
            f"START TIMELINE {start_tli} does not match the start file {start[1]}", what
        )
    stop_tli = tli("STOP TIMELINE") if need_stop else None
    if stop is not None and need_stop:
        stop_file_tli = int(stop[1][:8], 16)
        if stop_tli is None:
            stop_tli = stop_file_tli
        elif stop_tli != stop_file_tli:
            raise _bad_backup(
                f"STOP TIMELINE {stop_tli} does not match the stop file {stop[1]}", what
            )
        if stop[0] < start[0]:
            raise _bad_backup(
                f"STOP WAL LOCATION {stop[0]} is before START WAL LOCATION {start[0]}", what
            )
    start_time_text = text_of("START TIME")
    stop_time_text = text_of("STOP TIME") if need_stop else None
    label_got = fields.get("LABEL")
    return BackupHistoryFile(
        start_lsn=start[0],
        start_wal_file=start[1],
        checkpoint_lsn=checkpoint,
        start_timeline=start_tli,
        stop_lsn=stop[0] if need_stop and stop is not None else None,
        stop_wal_file=stop[1] if need_stop and stop is not None else None,
        stop_timeline=stop_tli,
        backup_method=text_of("BACKUP METHOD"),
        backup_from=text_of("BACKUP FROM"),
        start_time=None
        if start_time_text is None
        else _parse_pg_time(start_time_text, log_timezone),
        stop_time=None if stop_time_text is None else _parse_pg_time(stop_time_text, log_timezone),
        label=None if label_got is None else label_got[1],
        start_time_text=start_time_text,
        stop_time_text=stop_time_text,
        incremental_from_lsn=lsn("INCREMENTAL FROM LSN"),
        incremental_from_tli=tli("INCREMENTAL FROM TLI"),
    )


def parse_backup_file(text: str, *, log_timezone: dt.tzinfo | None = None) -> BackupHistoryFile:
    """Parse a ``.backup`` history file (``<segment>.<offset>.backup`` in the archive).

    Requires the START WAL LOCATION, STOP WAL LOCATION and CHECKPOINT LOCATION
    lines; other known lines are optional and unknown lines are ignored. The
    label is everything after ``LABEL: `` (it may contain ``:``). Pass
    ``log_timezone`` (e.g. ``zoneinfo.ZoneInfo("Europe/Berlin")``, the server's
    ``log_timezone``) to resolve zone abbreviations like ``CET``.
    """
    return _parse_backup_text(
        text, "backup history file", need_stop=True, log_timezone=log_timezone
    )


def parse_backup_label(text: str, *, log_timezone: dt.tzinfo | None = None) -> BackupHistoryFile:
    """Parse a ``backup_label`` (the ``labelfile`` of ``pg_backup_stop``): no stop fields."""
    return _parse_backup_text(text, "backup_label", need_stop=False, log_timezone=log_timezone)


# =========================================================================== archive index
